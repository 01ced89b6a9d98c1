"""The script's reference of a run stopped early: the first steps of the script's own schedule, so
`make run SCRIPT=` compares a stopped run's weights with the steps its node committed."""
import pathlib

import numpy as np
import pytest

pytest.importorskip("torch")

from mindp.torch import scriptref  # noqa: E402

CNN = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_cnn.py"


def same(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(np.array_equal(a[n].view(np.uint32), b[n].view(np.uint32)) for n in a)


def test_a_reference_of_fewer_steps_keeps_the_scripts_schedule():
    argv = ["--steps", "10"]
    whole = scriptref.script_reference(CNN, 2, argv)
    assert same(scriptref.script_reference(CNN, 2, argv, steps=10).master, whole.master)
    assert same(scriptref.script_reference(CNN, 2, argv, steps=12).master, whole.master)  # never beyond its steps
    first = scriptref.script_reference(CNN, 2, argv, steps=3)
    assert not same(first.master, whole.master)
    # three steps of the 10-step schedule (a 2-step warm-up) are not a 3-step run's (a 1-step one)
    assert not same(first.master, scriptref.script_reference(CNN, 2, ["--steps", "3"]).master)

"""The script's reference of a run stopped early: the first steps of the script's own schedule, so
`make run SCRIPT=` compares a stopped run's weights with the steps its node committed; each rank's
random draws as its own process makes them."""
import pathlib
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

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


def draws(n: int = 3):
    return torch.rand(n).tolist(), np.random.rand(n).tolist(), [random.random() for _ in range(n)]


def test_each_rank_draws_from_its_own_generators_which_start_again_where_its_process_did():
    """As separate processes that built the model alike: rank 1's draws are rank 0's, not the ones
    after them; a rank whose process started again at step 2 draws as at step 0 there."""
    torch.manual_seed(7)
    streams = scriptref.RankStreams(2, starts={1: [0, 2]})
    got = {}
    for step in range(3):
        for rank in (0, 1):
            with streams.of(rank, step):
                got[rank, step] = draws()
    assert got[1, 0] == got[0, 0] and got[1, 1] == got[0, 1]
    assert got[0, 1] != got[0, 0] and got[0, 2] != got[0, 0]  # rank 0 goes on drawing
    assert got[1, 2] == got[0, 0]  # rank 1 started again at step 2


SHIFTED = '''
import argparse, sys
sys.path.insert(0, {examples!r})
import train_cnn


def mindp_reference(argv):  # train_cnn's, and --shift: other batches
    p = argparse.ArgumentParser()
    p.add_argument("--shift", type=int, default=0)
    args, rest = p.parse_known_args(argv)
    return dict(train_cnn.mindp_reference(rest), batch=lambda rank, step: train_cnn.batch(rank, step + args.shift))
'''


def test_a_run_whose_args_changed_on_resume_replays_each_step_with_its_own(tmp_path):
    """make run RESUME= ARGS=...: steps before the resume take the earlier run's batches, the rest
    the new arguments'."""
    script = tmp_path / "shifted.py"
    script.write_text(SHIFTED.format(examples=str(CNN.parent)))
    a, b = ["--steps", "4"], ["--steps", "4", "--shift", "100"]
    resumed = scriptref.script_reference(script, 2, {0: a, 2: b})
    assert not same(resumed.master, scriptref.script_reference(script, 2, a).master)
    assert not same(resumed.master, scriptref.script_reference(script, 2, b).master)
    assert same(scriptref.script_reference(script, 2, {0: a, 2: b}, steps=2).master,
                scriptref.script_reference(script, 2, a, steps=2).master)
    assert same(scriptref.script_reference(script, 2, {0: a, 2: a}).master,
                scriptref.script_reference(script, 2, a).master)
    with pytest.raises(ValueError, match="arguments of step 0 are missing"):
        scriptref.script_reference(script, 2, {1: a})

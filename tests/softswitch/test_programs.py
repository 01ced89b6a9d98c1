"""The committed test programs are current: source hashes match, and where p4c
is installed a fresh compile gives the committed JSON and P4Info."""
import json

import pytest

from mindp.targets import find_tool

from . import compiled


@pytest.mark.parametrize("name", compiled.NAMES)
def test_committed_artifacts_match_their_source(name):
    recorded = (compiled.DIR / f"{name}.sha256").read_text().strip()
    assert recorded == compiled.source_hash(name), f"{name}.p4 changed: run python -m tests.softswitch.compiled"
    assert compiled.json_path(name).exists() and compiled.p4info_path(name).exists()


@pytest.mark.skipif(find_tool("p4c-bm2-ss") is None, reason="p4c not installed: hash check only")
@pytest.mark.parametrize("name", compiled.NAMES)
def test_recompiling_gives_the_committed_artifacts(name, tmp_path):
    compiled.compile_program(name, tmp_path, find_tool("p4c-bm2-ss"))
    assert json.loads((tmp_path / f"{name}.json").read_text()) == json.loads(compiled.json_path(name).read_text())
    assert (tmp_path / f"{name}.p4info.txtpb").read_text() == compiled.p4info_path(name).read_text()

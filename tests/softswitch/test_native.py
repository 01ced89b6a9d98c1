"""The compiled pipeline (softswitch.native) equals the Python pipeline: the same random, hostile and
valid frames through both paths of one program, with the same tables and groups installed, give the
same output frames, ports and order, registers, counters, direct counters and drop statistics.
In process (no sockets): mindp's program is programmed over real P4Runtime, one server per path."""
from __future__ import annotations

import logging
import struct
import sys
import threading

import numpy as np
import pytest

from controller.p4runtime import SwitchConnection
from mindp import codec, progress, targets
from mindp.protocol import Kind
from mindp.topology import Host, star
from p4src import artifacts
from softswitch import compiler
from softswitch.engine import Engine
from softswitch.native import build
from softswitch.p4runtime_server import Server, SwitchService
from tests.dataplane.fabric import SwitchFabric, random_fp16
from tests.dataplane.fuzzer import STEP, Fuzzer

from . import compiled
from . import engines as te
from .both_paths import assert_same, generic_seeds, mutations, run

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler")


# --- the test programs ----------------------------------------------------------------------------
def twins(name: str):
    if name == "features":
        return te.feat_engine("compiled"), te.feat_engine("python")
    return te.engine(name, "compiled"), te.engine(name, "python")


@pytest.mark.parametrize("name", compiled.NAMES)
@pytest.mark.parametrize("batch", [1, 7, 64])
def test_test_programs_equal_on_both_paths(name, batch):
    rng = np.random.default_rng([compiled.NAMES.index(name), batch])
    native, python = twins(name)
    frames = mutations(rng, generic_seeds(rng), 1500)
    out = assert_same(native, python, frames, batch)
    assert out, "some frames are forwarded"


def test_expression_vectors_equal_on_both_paths():
    native, python = twins("exprs")
    frames = [(te.MAC_A + te.MAC_B + b"\x88\xb5" + struct.pack("!HHhhBB", a, b, sv, t, n, 0) + b"tail", 3)
              for a, b, sv, t, n in te.expr_vectors()]
    assert len(assert_same(native, python, frames)) == len(frames)


def test_multicast_and_table_writes_between_batches_equal_on_both_paths():
    native, python = twins("features")
    rng = np.random.default_rng(5)
    frames = mutations(rng, generic_seeds(rng), 400)
    assert_same(native, python, frames)
    for eng in (native, python):  # the control plane changes: groups, an entry, a default action
        eng.pre[7] = [(3, 1), (1, 2)]
        routes = eng.program.tables["I.routes"]
        te.entry(routes, [(0x0C000000, 8)], "I.route", [9])
        routes.delete(((0x0A010000, 16),), 0)
    assert_same(native, python, frames)
    for eng in (native, python):
        del eng.pre[7]
    assert_same(native, python, frames)


def test_a_batch_never_sees_half_a_write():
    """While a writer holds the engine's lock, batches keep the tables as they were; the whole write
    is seen by the first batch after it."""
    eng = te.feat_engine("compiled")
    frame = te.feat_frame(src=0x0B000001, dst=0x0C000001)  # no route: the default drops it
    assert run(eng, [(frame, 1)]) == []
    held, release = threading.Event(), threading.Event()

    def writer():
        with eng.lock:
            te.entry(eng.program.tables["I.routes"], [(0x0C000000, 8)], "I.route", [4])
            held.set()
            release.wait(10)

    t = threading.Thread(target=writer)
    t.start()
    held.wait(10)
    assert run(eng, [(frame, 1)]) == [], "the entry of an unfinished write is not used"
    release.set()
    t.join()
    assert [p for p, _ in run(eng, [(frame, 1)])] == [4]


# --- mindp's program, programmed over P4Runtime ---------------------------------------------------
class TwinSwitch:
    """Every write to both switches, so both hold the same entries and groups."""

    def __init__(self, *conns):
        self.conns = conns

    def __getattr__(self, name):
        return lambda *a, **kw: [getattr(c, name)(*a, **kw) for c in self.conns][0]


class OfflineFabric(SwitchFabric):
    """The dataplane tests' fabric without hosts on veths: frames are built, not sent."""

    def __init__(self, hosts, sw):
        self.hosts = hosts
        self.sw = sw


@pytest.fixture(scope="module")
def mindp_twins():
    engines = {mode: Engine(pipeline=mode) for mode in ("compiled", "python")}
    servers = [Server(SwitchService(e), f"127.0.0.1:{targets.free_port()}") for e in engines.values()]
    for s in servers:
        s.start()
    conns = [SwitchConnection(s.addr) for s in servers]
    try:
        for c in conns:
            c.__enter__()
            c.push_pipeline(artifacts.P4INFO, artifacts.BMV2_JSON)
        topo = star([3, 2])
        hosts = dict(topo.hosts)
        hosts["x"] = Host("x", "02:00:00:00:00:63", "10.0.0.99", 9)
        fabric = OfflineFabric(hosts, TwinSwitch(*conns))
        fabric.install_forwarding()
        job1 = fabric.install_job(1, ["w1_0", "w1_1", "w1_2"], "opt1", slot_base=300, slots=4, epoch=0xF001,
                                  chunks=64)
        job2 = fabric.install_job(2, ["w2_0", "w2_1"], "opt2", slot_base=400, slots=4, epoch=0xF002)
        yield engines["compiled"], engines["python"], fabric, job1, job2
    finally:
        for c in conns:
            c.__exit__(None, None, None)
        for s in servers:
            s.stop()


def mindp_frames(fabric, job1, job2, rng, n: int) -> list[tuple[bytes, int]]:
    """Complete rounds, parameters multicast back, and the fuzz suite's hostile frames, mixed."""
    fz = Fuzzer(fabric, job1, job2, tags_restored=True)
    port = {name: h.port for name, h in fabric.hosts.items()}
    opt = fabric.hosts["opt1"]
    frames = []
    step = STEP
    while len(frames) < n:
        step += 1
        for chunk in range(4):
            for w, name in enumerate(job1.workers):
                frames.append((fabric.grad(job1, w, random_fp16(rng), step=step, chunk=chunk), port[name]))
        params = codec.encode_tensor(Kind.PARAM, random_fp16(rng), codec.Addresses(
            opt.mac, "ff:ff:ff:ff:ff:ff", opt.ip, "255.255.255.255"), job=1, step=step)[0].tobytes()
        frames.append((params, port["opt1"]))
        for _ in range(40):
            src, frame, _, _ = fz.frame()
            frames.append((frame, port[src]))
    return frames


@pytest.mark.parametrize("batch", [1, 64])
def test_mindp_equal_on_both_paths(mindp_twins, batch):
    native, python, fabric, job1, job2 = mindp_twins
    rng = np.random.default_rng(11 + batch)
    out = assert_same(native, python, mindp_frames(fabric, job1, job2, rng, 3000), batch)
    kinds = {f[42 + 1] for _, f in out if len(f) > 43}
    assert {int(Kind.SUM), int(Kind.PARAM)} <= kinds, "sums and multicast parameters came out"


# --- fallback and cache ---------------------------------------------------------------------------
def test_unsupported_construct_runs_on_python_with_one_log_line(caplog):
    j = compiled.json_path("exprs").read_text().replace('["a", 16, false]', '["a", 128, false]', 1)
    assert '["a", 128, false]' in j
    with caplog.at_level(logging.WARNING, "softswitch"):
        eng = Engine(compiler.load(j), "compiled")
    assert eng.native is None
    lines = [r.getMessage() for r in caplog.records if "compiled pipeline unavailable" in r.getMessage()]
    assert len(lines) == 1 and "128 bits" in lines[0]


def test_no_compiler_runs_on_python(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with caplog.at_level(logging.WARNING, "softswitch"):
        eng = te.engine("stacks", "compiled")
    assert eng.native is None and "compiled pipeline unavailable" in caplog.text


def test_compiled_program_is_cached_by_its_source(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert te.engine("parser", "compiled").native is not None
    assert len(list((tmp_path / "mindp" / "softswitch").glob("*.so"))) == 1
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))  # a second start needs no compiler
    assert te.engine("parser", "compiled").native is not None


def test_environment_forces_the_python_path(monkeypatch):
    monkeypatch.setenv("MINDP_SOFTSWITCH_PIPELINE", "python")
    assert te.engine("parser").native is None


def test_an_unknown_pipeline_in_the_environment_is_refused_in_one_line(monkeypatch):
    """MINDP_SOFTSWITCH_PIPELINE=Python ran the compiled pipeline without a word."""
    from softswitch.engine import default_pipeline
    monkeypatch.setenv("MINDP_SOFTSWITCH_PIPELINE", "Python")
    r = progress.run([sys.executable, "-m", "softswitch", "--no-p4"], capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (2, "mindp-softswitch: MINDP_SOFTSWITCH_PIPELINE='Python': one of compiled, python\n")
    monkeypatch.setenv("MINDP_SOFTSWITCH_PIPELINE", "")  # empty: as unset
    assert default_pipeline() == "compiled"


def test_trace_runs_batches_on_the_python_path(caplog):
    """-L debug: every packet through the traced Python pipeline, same outputs."""
    native, python = twins("features")
    frames = [(te.feat_frame(src=0x0B000001, dst=0x0A010203), 1)]
    with caplog.at_level(logging.DEBUG, "softswitch.trace"):
        traced = run(native, frames)
    assert any("pkt 1:" in r.getMessage() for r in caplog.records)
    assert traced == run(python, frames)


def test_command_line_chooses_the_pipeline():
    from softswitch.cli import SwitchUsageError, parse_args
    assert parse_args(["--pipeline", "python", "--no-p4"]).pipeline == "python"
    assert parse_args(["--no-p4"]).pipeline is None  # the engine's default: compiled, or the environment's
    with pytest.raises(SwitchUsageError):
        parse_args(["--pipeline", "jit", "--no-p4"])
    assert targets.command("embedded-python", targets.SwitchConfig(ports={}))[3:5] == ["--pipeline", "python"]
    assert "--pipeline" not in targets.command("embedded", targets.SwitchConfig(ports={}))


def test_command_line_sets_receive_coalescing_and_rejects_a_negative_value_in_one_line():
    from softswitch.cli import RX_FRAMES, RX_USECS, parse_args
    args = parse_args(["--no-p4"])
    assert (args.rx_usecs, args.rx_frames) == (RX_USECS, RX_FRAMES)
    coalesce = parse_args(["--rx-usecs", "100", "--rx-frames", "8", "--no-p4"])
    assert (coalesce.rx_usecs, coalesce.rx_frames) == (100, 8)
    for args, why in ((["--rx-usecs", "-1"], "--rx-usecs -1: must be 0 (off) or more"),
                      (["--rx-usecs", "5", "--rx-frames", "0"], "--rx-frames 0: must be 1 or more"),
                      (["--rx-frames", "8"], "--rx-frames needs --rx-usecs (receive coalescing is off without it)")):
        r = progress.run([sys.executable, "-m", "softswitch", *args, "--no-p4"], capture_output=True, text=True)
        assert (r.returncode, r.stderr) == (2, f"mindp-softswitch: {why}\n")

"""The console entry points: bad input is one clear line and a non-zero exit, never a traceback;
a state directory is never overwritten or reinterpreted."""
import json

import numpy as np
import pytest

from host_agent import optim, state
from host_agent.optim import OptimizerConfig
from mindp.protocol import K

from .entry_points import EXPLICIT, one_line_error, run
from .helpers import small_model


@pytest.fixture
def files(tmp_path):
    init = tmp_path / "init.npz"
    np.savez(init, **small_model())
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps([["a", [10, 3]], ["b", [7]]]))
    return tmp_path, init, layout


WORKER_EXPLICIT = ["--slots", "4", "--mac", "02:00:00:00:00:01", "--ip", "10.0.0.1", "--opt-mac",
                   "02:00:00:00:00:02", "--opt-ip", "10.0.0.2"]
NOWHERE = ["--iface", "ha-nosuch0"]  # a refusal that did not come would end at the socket, never on a network


def other_layouts(tmp) -> dict[str, str]:
    """Layouts of small_model's init.npz naming a tensor it lacks (M) and giving b another shape (W)."""
    model = {n: list(a.shape) for n, a in small_model().items()}
    (tmp / "missing.json").write_text(json.dumps([["b", model["b"]], ["c", [3]]]))
    (tmp / "wrong.json").write_text(json.dumps([["b", [7]], ["w", model["w"]]]))
    return {"M": str(tmp / "missing.json"), "W": str(tmp / "wrong.json")}


@pytest.mark.parametrize("args,needle", [
    (["--state-dir", "S"], "without --topology, give --workers --slots --mac --ip"),
    (["--state-dir", "S", *EXPLICIT, "--init", "seed:x", "--layout", "L"], "bad --init"),
    (["--state-dir", "S", *EXPLICIT, "--init", "seed:1"], "needs --layout"),
    (["--state-dir", "S", *EXPLICIT, "--init", "missing.npz"], "cannot read parameters"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--ram-budget", "4k"], "need >= 4"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--ram-budget", "lots"], "bad size"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--lr", "-1"], "learning rate"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--iface", "ha-nosuch0"], "ha-nosuch0"),
    (["--state-dir", "S", "--topology", "nosuch.json"], "cannot read topology"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--weight-decay", "nan"], "finite number"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--eps", "nan"], "finite number"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--lr", "inf"], "finite number"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--ram-budget", "infG"], "bad size"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--ram-budget", "nan"], "bad size"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--linger", "-1"], "--linger must be >= 0"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--rx-usecs", "-1"], "--rx-usecs must be >= 0"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--stall-resend", "inf"], "finite number"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--max-workers", "33"], "--max-workers must be in 1..32"),
    # Each of these got to the state and the socket before (--iface: no network however it goes).
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--workers", "0", *NOWHERE], "--workers must be in 1..32"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--workers", "33", *NOWHERE], "--workers must be in 1..32"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--steps", "-4", *NOWHERE], "--steps must be >= 0"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--job", "70000", *NOWHERE], "--job must be in 0..63"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--export", "/no/such/dir/f.npz", *NOWHERE],
     "--export /no/such/dir/f.npz: no directory /no/such/dir"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--stats", "/no/such/x.json", *NOWHERE],
     "--stats /no/such/x.json: no directory /no/such"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--export", "S", *NOWHERE], "is a directory"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--layout", "M", *NOWHERE], "names tensor(s) ['c'] that"),
    (["--state-dir", "S", *EXPLICIT, "--init", "I", "--layout", "W", *NOWHERE], "(7,) in --layout"),
])
def test_optimizer_cli_bad_input(files, args, needle):
    tmp, init, layout = files
    if "--export" in args:  # a directory, not a file to write
        (tmp / "state").mkdir()
    subst = {"S": str(tmp / "state"), "I": str(init), "L": str(layout), **other_layouts(tmp)}
    code, _, err = run("host_agent.node", *[subst.get(a, a) for a in args])
    one_line_error(code, err, "mindp-optimizer", needle)
    if NOWHERE[-1] in args and needle != NOWHERE[-1]:  # refused before anything was made
        assert not (tmp / "state").exists() or not any((tmp / "state").iterdir())


@pytest.mark.parametrize("asked,difference", [
    ([], "kind 'sgd' -> 'adamw'"),
    # a script's spec (make run SCRIPT= RESUME=, a restored checkpoint) was taken silently before
    (["--optimizer-spec", "SPEC"], "lr 0.001 -> 0.01"),
])
def test_optimizer_refuses_a_state_dir_made_for_another_optimizer(files, asked, difference):
    tmp, init, _ = files
    arrays = small_model()
    lay = optim.layout_of(arrays)
    created = OptimizerConfig(kind="sgd") if not asked else OptimizerConfig()
    state.create(tmp / "state", lay, state.init_pieces(lay, arrays), created)
    spec = tmp / "spec.json"
    spec.write_text(json.dumps(OptimizerConfig(lr=0.01).to_dict()))
    before = (tmp / "state" / "state0.bin").read_bytes()
    code, _, err = run("host_agent.node", "--state-dir", str(tmp / "state"), *EXPLICIT, "--init", str(init),
                       *[str(spec) if a == "SPEC" else a for a in asked])
    one_line_error(code, err, "mindp-optimizer", "was created with another optimizer: ")
    assert difference in err
    assert (tmp / "state" / "state0.bin").read_bytes() == before
    spec.write_text(json.dumps(created.to_dict()))  # the same optimizer: the state opens
    from host_agent import node
    args = node.build_parser().parse_args(["--state-dir", str(tmp / "state"), *EXPLICIT, "--init", str(init),
                                           *(["--optimizer-spec", str(spec)] if asked else ["--optimizer", "sgd"])])
    node.open_state(args).close()


@pytest.mark.parametrize("extra", [[], ["--plan"]])
def test_optimizer_refuses_a_state_dir_of_another_k(files, extra):
    """A record holds K elements: a state opened at another K would read every chunk from the wrong
    place (make run RESUME= once ran a K = 1,024 run's state at K = 32 and ended off the reference)."""
    tmp, init, _ = files
    arrays = small_model()
    lay = optim.layout_of(arrays)
    state.create(tmp / "state", lay, state.init_pieces(lay, arrays), OptimizerConfig())
    other = 32 if K != 32 else 64
    code, _, err = run("host_agent.node", "--state-dir", str(tmp / "state"), *EXPLICIT, "--init", str(init), *extra,
                       env={"MINDP_K": str(other)})
    one_line_error(code, err, "mindp-optimizer", f"holds chunks of K = {K} elements and this process runs K = {other}")
    state.read_state(tmp / "state")  # at its own K it opens


@pytest.mark.parametrize("args,needle", [
    ([], "without --topology, give --slots --mac --ip --opt-mac --opt-ip"),
    (["--layout", "nosuch.json"], "cannot read layout"),
    (["--init", "I", "--slots", "0", "--mac", "02:00:00:00:00:01", "--ip", "10.0.0.1", "--opt-mac",
      "02:00:00:00:00:02", "--opt-ip", "10.0.0.2"], "slots must be >= 1"),
    (["--init", "I", "--slots", "0", "--mac", "02:00:00:00:00:01", "--ip", "10.0.0.1", "--opt-mac",
      "02:00:00:00:00:02", "--opt-ip", "10.0.0.2", "--iface", "ha-nosuch0"], "slots must be >= 1"),  # before any I/O
    (["--init", "I", "--slots", "4", "--mac", "02:00:00:00:00:01", "--ip", "10.0.0.1", "--opt-mac",
      "02:00:00:00:00:02", "--opt-ip", "10.0.0.2", "--iface", "ha-nosuch0"], "ha-nosuch0"),
    (["--init", "I", "--slots", "4", "--mac", "02:00:00:00:00:01", "--ip", "10.0.0.1", "--opt-mac",
      "02:00:00:00:00:02", "--opt-ip", "10.0.0.2", "--drop-send", "1.5"], "probability"),
    (["--init", "I", "--slots", "4", "--mac", "02:00:00:00:00:01", "--ip", "10.0.0.1", "--opt-mac",
      "02:00:00:00:00:02", "--opt-ip", "10.0.0.2", "--first-step", "-1"], "--first-step must be >= 0"),
    (["--init", "I", "--slots", "4", "--mac", "02:00:00:00:00:01", "--ip", "10.0.0.1", "--opt-mac",
      "02:00:00:00:00:02", "--opt-ip", "10.0.0.2", "--deadline", "nan"], "must be finite and > 0"),
    (["--init", "I", "--slots", "4", "--mac", "02:00:00:00:00:01", "--ip", "10.0.0.1", "--opt-mac",
      "02:00:00:00:00:02", "--opt-ip", "10.0.0.2", "--deadline", "0"], "must be finite and > 0"),
    (["--init", "I", "--slots", "4", "--mac", "02:00:00:00:00:01", "--ip", "10.0.0.1", "--opt-mac",
      "02:00:00:00:00:02", "--opt-ip", "10.0.0.2", "--resume", "J"], "not one of this model"),
    # Each of these got to the socket before (a traceback or exit 0 beyond it; --iface: no network).
    (["--init", "I", *WORKER_EXPLICIT, "--job", "70000", *NOWHERE], "job id 70000 outside 0..63"),
    (["--init", "I", *WORKER_EXPLICIT, "--worker", "40", *NOWHERE], "worker id 40 outside 0..31"),
    (["--init", "I", *WORKER_EXPLICIT, "--steps", "3", "--first-step", "5", *NOWHERE], "below --first-step 5"),
    (["--init", "I", *WORKER_EXPLICIT, "--steps", "-1", *NOWHERE], "no step to run"),
    (["--init", "I", *WORKER_EXPLICIT, "--out", "/no/such/dir/f.npz", *NOWHERE],
     "--out /no/such/dir/f.npz: no directory /no/such/dir"),
    (["--init", "I", *WORKER_EXPLICIT, "--stats", "/no/such/x.json", *NOWHERE], "--stats /no/such/x.json: no directory"),
    (["--init", "I", *WORKER_EXPLICIT, "--out", "T", *NOWHERE], "is a directory"),
    (["--init", "I", *WORKER_EXPLICIT, "--layout", "M", *NOWHERE], "names tensor(s) ['c'] that"),
    (["--init", "I", *WORKER_EXPLICIT, "--layout", "W", *NOWHERE], "(7,) in --layout"),
])
def test_worker_cli_bad_input(files, args, needle):
    tmp, init, layout = files
    (tmp / "junk.resume").write_bytes(b"not a resume file")
    subst = {"I": str(init), "J": str(tmp / "junk.resume"), "T": str(tmp), **other_layouts(tmp)}
    # the fixture's layout is not init.npz's: given with seed:N (the default) only
    code, _, err = run("host_agent.worker", "--worker", "0", *([] if "--init" in args else ["--layout", str(layout)]),
                       *[subst.get(a, a) for a in args])
    one_line_error(code, err, "mindp-worker", needle)


def test_worker_and_node_read_an_npz_in_the_order_of_layout(files):
    """--layout listing an .npz's arrays in another order than the file's: the worker took the
    file's order and the node --layout's, and each put the other's tensors in its chunks."""
    from host_agent import agent_args, node

    tmp, _, _ = files
    np.savez(tmp / "x.npz", a=np.arange(3, dtype=np.float32), b=np.full((2, 2), 7, np.float32))
    (tmp / "l.json").write_text(json.dumps([["b", [2, 2]], ["a", [3]]]))
    layout, arrays = agent_args.load_model(str(tmp / "l.json"), str(tmp / "x.npz"))
    assert [s.name for s in layout.specs] == list(arrays) == ["b", "a"]
    args = node.build_parser().parse_args(["--state-dir", str(tmp / "state"), *EXPLICIT, "--init", str(tmp / "x.npz"),
                                           "--layout", str(tmp / "l.json")])
    store = node.open_state(args)
    try:
        assert optim.layout_to_json(store.layout) == optim.layout_to_json(layout)
        for name, want in arrays.items():
            assert np.array_equal(store.tensor(name), want)
    finally:
        store.close()
    without = agent_args.load_model(None, str(tmp / "x.npz"))[0]  # no --layout: the file's order, both
    assert [s.name for s in without.specs] == ["a", "b"] == [s.name for s in optim.npz_layout(tmp / "x.npz").specs]


def test_node_closes_its_state_when_the_export_fails(files, monkeypatch):
    """The close is the state's final write-back (with --sync exit its only fsync): an export that
    raises (its directory removed since the start) must not skip it."""
    from host_agent import node

    tmp, _, _ = files
    arrays = small_model()
    lay = optim.layout_of(arrays)
    state.create(tmp / "state", lay, state.init_pieces(lay, arrays), OptimizerConfig())
    store = state.Store(tmp / "state", 1 << 20, sync="exit")
    closed = []
    close = store.close
    monkeypatch.setattr(store, "close", lambda: closed.append(close()))

    def export(path):
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(store, "export", export)
    with pytest.raises(FileNotFoundError):
        node.finish(store, str(tmp / "gone" / "f.npz"))
    assert closed == [None]


def test_worker_config_refuses_ids_the_switch_cannot_hold():
    """In the config, so every entry point (the CLI, the torch script, the harnesses) is told."""
    from host_agent.worker import WorkerConfig

    addrs = ("02:00:00:00:00:01", "10.0.0.1", "02:00:00:00:00:02", "10.0.0.2")
    for job, wid, needle in [(70000, 0, "job id 70000"), (-1, 0, "job id -1"), (1, 32, "worker id 32"),
                             (1, -1, "worker id -1")]:
        with pytest.raises(optim.ConfigError, match=needle):
            WorkerConfig(job, wid, 4, *addrs)
    WorkerConfig(63, 31, 4, *addrs)


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e39])  # 1e39: finite in the file, infinite as float32
def test_optimizer_refuses_non_finite_initial_parameters_and_creates_no_state(files, bad):
    tmp, _, _ = files
    arrays = small_model()
    arrays["b"] = arrays["b"].astype(np.float64)
    arrays["b"][3] = bad
    np.savez(tmp / "bad.npz", **arrays)
    code, _, err = run("host_agent.node", "--state-dir", str(tmp / "state"), *EXPLICIT, "--init", str(tmp / "bad.npz"))
    one_line_error(code, err, "mindp-optimizer", "b: 1 initial value(s) are NaN or infinite")
    assert not state.exists(tmp / "state")


def test_optimizer_refuses_a_state_dir_of_another_model(files):
    tmp, init, layout = files
    arrays = small_model()
    lay = optim.layout_of(arrays)
    state.create(tmp / "state", lay, state.init_pieces(lay, arrays), OptimizerConfig())
    code, _, err = run("host_agent.node", "--state-dir", str(tmp / "state"), *EXPLICIT, "--init", "seed:0",
                       "--layout", str(layout))
    one_line_error(code, err, "mindp-optimizer", "another model")


def test_node_lingers_past_the_workers_largest_rto():
    """A worker whose last parameters were lost retransmits after at most its largest RTO: the
    node must still be there (default linger), with room for one more backed-off attempt."""
    from host_agent.node import LINGER, build_parser
    from host_agent.window import RtoConfig

    assert build_parser().parse_args(["--state-dir", "S"]).linger == LINGER >= 2 * RtoConfig.max


def test_npz_layout_reads_shapes_without_data(files):
    _, init, _ = files
    assert optim.layout_to_json(optim.npz_layout(init)) == optim.layout_to_json(optim.layout_of(small_model()))


@pytest.mark.parametrize("field,value", [
    ("lr", float("nan")), ("lr", float("inf")), ("eps", float("nan")), ("eps", float("inf")),
    ("weight_decay", float("nan")), ("weight_decay", float("inf")), ("momentum", float("nan")),
    ("betas", (float("nan"), 0.999)), ("betas", (0.9, float("inf"))), ("lr", "0.1"), ("betas", 0.9),
])
def test_optimizer_config_built_from_python_refuses_non_finite_hyper_parameters(field, value):
    """Not only the CLI: a config built in Python (or read back from a state directory) with a NaN
    or infinite hyper-parameter is one ConfigError line naming it, never a NaN master later."""
    with pytest.raises(optim.ConfigError) as err:
        OptimizerConfig(**{field: value})
    assert field.split("[")[0] in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(optim.ConfigError):
        OptimizerConfig.from_dict({**OptimizerConfig().to_dict(), field: value})


def test_a_topology_naming_a_worker_id_twice_is_one_line(files, tmp_path):
    """`"workers": {"0": "a", "0": "b"}` in a topology file would keep one worker silently."""
    from mindp.topology import star

    star([2], slots=8).dump(tmp_path / "topo.json")
    text = (tmp_path / "topo.json").read_text()
    assert '"1": "w1_1"' in text
    (tmp_path / "topo.json").write_text(text.replace('"1": "w1_1"', '"0": "w1_1"'))
    _, init, _ = files
    code, _, err = run("host_agent.worker", "--worker", "0", "--topology", str(tmp_path / "topo.json"), "--init",
                       str(init))
    one_line_error(code, err, "mindp-worker", "key '0' given twice")

"""make run's variables: defaults accepted, every bad value refused with a line naming it."""
import os
import pathlib
import shlex
import subprocess
import sys
from dataclasses import replace

import pytest

from mindp import INSTALL_TORCH
from mininet_topos import config

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_defaults_and_make_style_values():
    cfg = config.parse()
    assert (cfg.target, cfg.workers, cfg.steps, cfg.loss, cfg.jobs, cfg.pcap) == ("auto", 4, 60, 0.0, 1, False)
    cfg = config.parse(target="embedded", workers=" 2 ", steps="5", loss="0.05", jobs="2", seed="7", pcap="1")
    assert (cfg.target, cfg.workers, cfg.steps, cfg.loss, cfg.jobs, cfg.seed, cfg.pcap) == \
        ("embedded", 2, 5, 0.05, 2, 7, True)
    assert (cfg.cli, cfg.log, cfg.model) == ("auto", "off", "mlp")
    assert (config.parse(cli="1", log="DEBUG").cli, config.parse(log="DEBUG").log) == ("1", "debug")


def test_eval_every_is_a_count_of_steps():
    assert (config.parse().eval_every, config.parse(eval_every=" 0").eval_every) == (1, 0)
    assert config.parse(eval_every="7").eval_every == 7
    for bad in ("often", "-1", "1.5"):
        with pytest.raises(config.RunConfigError, match=rf"^EVAL must be auto or an integer in 0\.\.\d+, got '{bad}'$"):
            config.parse(eval_every=bad)


def test_eval_auto_spares_the_gpt_an_evaluation_a_step():
    """auto: the mlp every step; the gpt, whose evaluation costs a third of a step, every 10th;
    a number given is taken as it is for any model."""
    pytest.importorskip("torch")
    assert config.parse(eval_every="auto").eval_every == 1
    assert config.parse(model="gpt", eval_every="AUTO").eval_every == config.DEFAULT_EVAL["gpt"] > 1
    assert config.parse(model="gpt", eval_every="1").eval_every == 1


def test_node_ram_and_sync_reach_every_node_s_command_line(tmp_path):
    """NODE_RAM=2G: each optimizer node's --ram-budget, built-in and SCRIPT= runs alike; 256M unset;
    a bad size is one line naming it; make passes it only when set. SYNC=exit: its --sync (step
    unset; another word refused in one line)."""
    from mininet_topos.agents import Agents, JobFiles

    assert (config.parse().node_ram, config.parse(node_ram="2G").node_ram) == (256 << 20, 2 << 30)
    with pytest.raises(config.RunConfigError, match=r"^NODE_RAM: bad size 'lots' \(e\.g\. 64M, 1G\)$"):
        config.parse(node_ram="lots")
    assert (config.parse().sync, config.parse(sync=" exit ").sync) == ("step", "exit")
    with pytest.raises(config.RunConfigError, match=r"^SYNC must be one of step\|exit, got 'never'$"):
        config.parse(sync="never")
    started = []

    class Rec(Agents):
        def __init__(self, cfg):
            self.cfg, self.topo_path = cfg, tmp_path / "t.json"
            self.opt = type("Opt", (), {"kind": "adamw", "lr": 0.1, "weight_decay": 0.0})()
            self.workers, self.placement = [], None

        def _popen(self, host, name, args, cpu=None):
            started.append(args)
            return None

        def wait_started(self, optimizers):
            pass

        def _faults(self, host):
            return []

    job = type("Job", (), {"job_id": 1, "optimizers": ["opt1"], "workers": {}, "sharded": False})()
    Rec(config.parse(node_ram="2G", sync="exit")).start([JobFiles(job, tmp_path, wl=None, init={})])
    (node,) = started
    assert node[node.index("--ram-budget") + 1] == str(2 << 30)
    assert node[node.index("--sync") + 1] == "exit"
    assert node[node.index("--state-dir") + 1] == str(tmp_path / "optimizer-state")
    assert "--node-ram" not in make_n("run").stdout
    out = make_n("run", "NODE_RAM=2G").stdout
    assert '--node-ram "2G"' in out and "--given 'NODE_RAM'" in out
    out = make_n("run", "SYNC=exit").stdout
    assert '--sync "exit"' in out and "--given 'SYNC'" in out


def test_eval_and_gpt_are_refused_with_a_script():
    pytest.importorskip("torch")  # SCRIPT= needs it (without it, that is the refusal)
    script = str(REPO / "examples" / "train_cnn.py")
    with pytest.raises(config.RunConfigError, match=r"^EVAL is not used with SCRIPT="):
        config.parse(script=script, given="SCRIPT EVAL")
    with pytest.raises(config.RunConfigError, match=r"^GPT is not used with SCRIPT="):
        config.parse(script=script, gpt='{"d": 64}', given="SCRIPT GPT")


def test_slots_auto_follow_the_target_and_the_jobs_must_fit_the_pool():
    from mindp.switch_constants import POOL_SLOTS

    auto = config.parse()
    assert auto.on("embedded").slots == config.parse(jobs="2").on("embedded").slots == POOL_SLOTS // 2
    assert auto.on("bmv2").slots == 64
    assert config.parse(slots="100").on("embedded").slots == config.parse(slots="100").on("bmv2").slots == 100
    assert config.parse(slots=str(POOL_SLOTS)).slots == POOL_SLOTS
    with pytest.raises(config.RunConfigError, match=rf"^--slots must be an integer in 1..{POOL_SLOTS // 2}, got"):
        config.parse(slots=str(POOL_SLOTS // 2 + 1), jobs="2")


def test_torch_models_are_named_in_any_case_with_their_own_learning_rates():
    pytest.importorskip("torch")  # without it MODEL=cnn|gpt is a one-line refusal (tested below)
    assert [config.parse(model=m).model for m in (" cnn", "GPT", "mlp")] == ["cnn", "gpt", "mlp"]
    assert [config.parse(model=m).lr for m in ("mlp", "cnn", "gpt")] == [0.01, 0.01, 0.003]
    assert config.parse(model="gpt", lr="0.02").lr == 0.02


@pytest.mark.parametrize("kw, name", [
    ({"target": "tofino"}, "TARGET"),
    ({"workers": "0"}, "WORKERS"),
    ({"workers": "33"}, "WORKERS"),
    ({"workers": "four"}, "WORKERS"),
    ({"steps": "-1"}, "STEPS"),
    ({"steps": "1.5"}, "STEPS"),
    ({"loss": "0.9"}, "LOSS"),
    ({"loss": "nan"}, "LOSS"),
    ({"loss": "-0.1"}, "LOSS"),
    ({"jobs": "3"}, "JOBS"),
    ({"seed": "x"}, "SEED"),
    ({"pcap": "yes"}, "PCAP"),
    ({"grpc_port": "9090"}, "--grpc-port"),
    ({"slots": "0"}, "--slots"),
    ({"cli": "yes"}, "CLI"),
    ({"log": "verbose"}, "LOG"),
    ({"model": "resnet"}, "MODEL"),
    ({"lr": "fast"}, "--lr"),
    ({"check": "yes"}, "CHECK"),
])
def test_bad_values_name_the_variable(kw, name):
    with pytest.raises(config.RunConfigError) as err:
        config.parse(**kw)
    msg = str(err.value)
    assert msg.startswith(name) and "\n" not in msg


def test_log_level_reaches_both_targets_command_lines():
    from mindp import protocol, targets

    cfg = targets.SwitchConfig(ports={1: "mnr-p1"}, log_file="runs/x/logs/switch.log", log_level="debug")
    cmd = targets.command("embedded", cfg)
    assert cmd[cmd.index("--log-level") + 1] == "debug"
    assert cmd[cmd.index("--log-file") + 1] == "runs/x/logs/switch.log"
    quiet = targets.SwitchConfig(ports={1: "mnr-p1"}, log_file="switch.log")
    assert "--log-level" not in targets.command("embedded", quiet)  # its own default (info): unchanged
    if targets.find_bmv2() and protocol.bmv2_fits(protocol.K):
        bmv2 = targets.command("bmv2", cfg)
        assert bmv2.count("--log-level") == 1 and bmv2[bmv2.index("--log-level") + 1] == "debug"
        assert targets.command("bmv2", quiet)[1:3] == ["--log-level", "off"]
    elif targets.find_bmv2():  # make test's second pass: BMv2 is refused at a K it cannot run
        with pytest.raises(targets.TargetError, match="BMv2 runs K up to"):
            targets.command("bmv2", cfg)


def test_a_torch_model_without_torch_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # seam: torch not installed
    with pytest.raises(config.RunConfigError) as err:
        config.parse(model="gpt")
    assert str(err.value) == f"MODEL=gpt needs PyTorch, which is not installed: {INSTALL_TORCH}"
    assert config.parse(model="mlp").model == "mlp"  # the numpy model needs no torch


@pytest.mark.parametrize("text, message", [
    ("64", "GPT must be a JSON object"),
    ('{"d": 64', "GPT must be a JSON object"),
    ('{"width": 64}', "GPT must be a JSON object"),
    ('{"d": 0}', "GPT must be a JSON object"),
    ('{"layers": 1.5}', "GPT must be a JSON object"),
    ('{"d": true}', "GPT must be a JSON object"),
    ('{"d": 30, "heads": 4}', "GPT: d (30) must be a multiple of heads (4)"),
])
def test_gpt_sizes_are_checked_in_one_line(text, message):
    pytest.importorskip("torch")
    with pytest.raises(config.RunConfigError) as err:
        config.parse(model="gpt", gpt=text)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_gpt_sizes_reach_the_model():
    torch = pytest.importorskip("torch")  # noqa: F841
    from mindp import workload

    cfg = config.parse(model="gpt", gpt=' {"d": 32, "layers": 1} ')
    assert cfg.model_args == {"d": 32, "layers": 1} and config.parse(model="gpt").model_args == {}
    small = workload.WorkloadConfig(n_workers=2, model="gpt", model_args=cfg.model_args)
    full = workload.WorkloadConfig(n_workers=2, model="gpt")
    n = [sum(a.size for a in workload.init_params(w).values()) for w in (small, full)]
    assert n[0] < n[1] // 10
    with pytest.raises(config.RunConfigError, match="GPT sizes MODEL=gpt, not MODEL=cnn"):
        config.parse(model="cnn", gpt='{"d": 32}')


def test_a_variable_the_run_would_ignore_is_refused_in_one_line():
    pytest.importorskip("torch")  # SCRIPT= needs it
    script = str(REPO / "examples" / "train_cnn.py")
    for given, names in (("STEPS", "STEPS is"), ("MODEL STEPS GPT SEED", "MODEL, STEPS, GPT are")):
        with pytest.raises(config.RunConfigError, match=rf"^{names} not used with SCRIPT= .*ARGS='--steps 20'$"):
            config.parse(script=script, given=given)
    assert config.parse(script=script, script_args="--steps=3", given="SCRIPT ARGS WORKERS LOSS TARGET").script
    with pytest.raises(config.RunConfigError, match="^LEAVES needs TOPO=leafspine$"):
        config.parse(given="LEAVES")
    with pytest.raises(config.RunConfigError, match="^LEAVES and OPTIMIZERS need TOPO=leafspine$"):
        config.parse(given="LEAVES OPTIMIZERS")
    assert config.parse(topo="leafspine", leaves="2", given="TOPO LEAVES").leaves == 2
    assert config.parse(model="mlp", steps="5", given="MODEL STEPS").steps == 5


def test_make_passes_args_that_look_like_options_and_names_the_variables_given():
    """ARGS='--steps=3' reached argparse as an option of its own; the Makefile's GIVEN lists what was set."""
    from mininet_topos.run import build_parser

    assert build_parser().parse_args(["--args=--steps=3"]).args == "--steps=3"
    out = make_n("run", "SCRIPT=x.py", "ARGS=--steps=3", "STEPS=4", "CHECK=0").stdout
    assert '--args="$ARGS"' in out and "--given 'STEPS CHECK SCRIPT ARGS'" in out and '--check "0"' in out


def config_module_vars() -> tuple[str, ...]:
    """make run's and make clean's variables, which this test's environment must not set."""
    return ("TARGET", "K", "MODEL", "WORKERS", "STEPS", "GPT", "EVAL", "NODE_RAM", "SYNC", "CHECK", "PIN", "LOSS",
            "JOBS", "SEED", "PCAP", "CLI", "LOG", "TOPO", "LEAVES", "OPTIMIZERS", "SCRIPT", "ARGS", "RESUME", "UP",
            "ALL")


def make_n(*argv: str) -> subprocess.CompletedProcess:
    """`make -n ARGV` (prints the recipes, runs none), without the variables of this test's environment."""
    env = {k: v for k, v in os.environ.items() if k not in config_module_vars()}
    return subprocess.run(["make", "-n", "-s", "--no-print-directory", *argv], capture_output=True, text=True,
                          cwd=REPO, env=env, check=False)


def make_run_args(*variables: str):
    """The flags `make run VARIABLES` passes to mininet_topos.run, parsed as it parses them."""
    from mininet_topos.run import build_parser

    line = next(ln for ln in make_n("run", *variables).stdout.replace("\\\n", " ").splitlines()
                if "-m mininet_topos.run" in ln)
    argv = shlex.split(line.split(";")[0])
    return build_parser().parse_args(argv[argv.index("mininet_topos.run") + 1:])


def direct(*argv: str, old=None) -> config.RunConfig:
    """The settings of `python -m mininet_topos.run ARGV` (no --given: run directly, not by make)."""
    from mininet_topos import run

    parser = run.build_parser()
    args = parser.parse_args(argv)
    return run.settings(args, run.given_names(args, parser), old)


def test_the_models_defaults_follow_model_in_any_case():
    """make run MODEL=GPT took the mlp's 4 workers and 60 steps: the Makefile chose the gpt's by a
    case-sensitive ifeq, while MODEL is read in any case. Both now come from config.py, after MODEL."""
    pytest.importorskip("torch")
    for variables, want in ((["MODEL=GPT"], ("gpt", 2, 6)), (["MODEL=Gpt", "STEPS=3"], ("gpt", 2, 3)),
                            (["MODEL=CNN"], ("cnn", 4, 60)), ([], ("mlp", 4, 60)), (["WORKERS=3"], ("mlp", 3, 60))):
        args = make_run_args(*variables)
        cfg = config.parse(model=args.model, workers=args.workers, steps=args.steps)
        assert (cfg.model, cfg.workers, cfg.steps) == want, variables
    assert (direct("--model", "GPT").workers, direct("--model", "gpt").steps) == (2, 6)  # run directly too
    with pytest.raises(config.RunConfigError, match=r"^STEPS must be an integer in 1\.\.\d+, got 'many'$"):
        config.parse(steps="many")


def test_up_and_all_are_0_or_1_and_anything_else_is_one_line():
    """UP=yes started no --up (SCRIPT=: a whole run instead of your torchrun's network; alone: an mlp
    run, where UP=1 is refused), and make clean ALL=yes kept the newest run: both were ignored."""
    from mininet_topos import run

    assert (make_run_args().up, make_run_args("UP=1").up, make_run_args("UP=yes").up) == ("0", "1", "yes")
    assert not run.up(run.build_parser().parse_args([])) and run.up(run.build_parser().parse_args(["--up"]))
    for bad in ("yes", "", "2"):
        with pytest.raises(config.RunConfigError, match=rf"^UP must be 0 or 1, got '{bad}'$"):
            direct("--up", bad)
    with pytest.raises(config.RunConfigError, match="^UP=1 brings up a SCRIPT= run's network"):
        direct("--up")
    for bad in ("yes", "", "0 1"):  # make stops before any recipe (make stop's included) runs
        out = make_n("clean", f"ALL={bad}")
        assert out.returncode == 2 and not out.stdout, bad
        assert out.stderr.strip().endswith(f"*** make clean: ALL must be 0 or 1, got '{bad}'.  Stop.") and \
            len(out.stderr.strip().splitlines()) == 1
    assert "mininet_topos.clean --all" in make_n("clean", "ALL=1").stdout
    assert "mininet_topos.clean --all" not in make_n("clean", "ALL=0").stdout
    assert "mininet_topos.clean --all" not in make_n("clean").stdout


def test_soak_stress_and_bench_refuse_make_runs_variables_they_would_ignore():
    """make stress SEED=5 ran unseeded (it takes STRESS_SEED), make soak K=64 LOSS=0.2 at the default
    K and SOAK_LOSS, make bench TARGET=bmv2 every bench as ever: make now stops in one line first."""
    for argv, names in ((["stress", "SEED=5"], "SEED"), (["soak", "K=64", "LOSS=0.2"], "K LOSS"),
                        (["bench", "TARGET=bmv2"], "TARGET"), (["soak", "WORKERS=4", "TARGET=bmv2"], "WORKERS")):
        out = make_n(*argv)
        assert out.returncode == 2 and not out.stdout, argv
        err = out.stderr.strip()
        assert f"*** make {argv[0]}: {names}: not used by make {argv[0]} (it takes " in err and \
            len(err.splitlines()) == 1, err
    assert "-m tools.soak --steps 2000 --window 500 --loss 0.05 --target bmv2 --seed 3" in \
        make_n("soak", "TARGET=bmv2", "SEED=3").stdout
    assert "-m tools.stress --minutes 3 --load 2 --seed 7" in make_n("stress", "MINUTES=3", "STRESS_SEED=7").stdout
    assert make_n("bench").returncode == 0 and make_n("run", "K=64").returncode == 0


def test_a_resumed_run_keeps_each_setting_that_may_change_unless_it_is_given(tmp_path):
    """LOSS, CHECK, PIN, PCAP, LOG and CLI took this command's value (make's defaults) even when not
    given: a LOSS=0.02 CHECK=0 run resumed with RESUME=<run> alone ran without loss and checked."""
    from mininet_topos import resume

    before = config.parse(target="embedded", steps="3", loss="0.02", check="0", pin="1", pcap="1", log="debug",
                          cli="0", node_ram="1G", sync="exit").on("embedded")
    old = resume.Resumed(tmp_path, before.to_dict())
    now = config.parse(target="auto", steps="9", grpc_port="9600", thrift_port="9700")  # the rest make's defaults
    kept = resume.settings(old, now, ["RESUME"])
    assert (kept.loss, kept.check, kept.slots) == (0.02, False, before.slots)
    assert (kept.grpc_port, kept.thrift_port) == (9600, 9700)  # free now, not then
    tree = resume.Resumed(tmp_path, config.parse(target="embedded", topo="leafspine", leaves="2").on("embedded")
                          .to_dict())
    close = config.parse(target="auto", grpc_port="9600", thrift_port="9602")  # fine for one switch
    with pytest.raises(config.RunConfigError, match="need 3 free ports each, apart"):
        resume.settings(tree, close, ["RESUME"])  # its spine's gRPC port would be leaf 2's Thrift port
    fields = [f for f in resume.MAY_CHANGE.values() if f]
    assert all(getattr(before, f) != getattr(now, f) for f in fields)  # each would show a change
    assert [getattr(kept, f) for f in fields] == [getattr(before, f) for f in fields]
    for var, field in resume.MAY_CHANGE.items():
        if field:
            got = resume.settings(old, now, ["RESUME", var])
            assert [getattr(got, f) for f in fields] == [getattr(now if f == field else before, f) for f in fields]
    script = config.RunConfig(script="train.py", script_args="--steps 4", loss=0.02).recorded()
    assert resume.settings(resume.Resumed(tmp_path, script), replace(now, script_args="--steps 8"),
                           ["RESUME"]).script_args == "--steps 4"
    assert resume.settings(resume.Resumed(tmp_path, script), replace(now, script_args="--steps 8"),
                           ["RESUME", "ARGS", "LOSS"]).loss == 0.0


def test_run_directly_every_flag_that_differs_from_its_default_is_given():
    """make passes --given; `python -m mininet_topos.run` did not, so flags the run would not use were
    accepted silently there: --steps and --model with --script, --hidden with another model, and with
    --resume, --lr, --hidden, --batch and --slots replaced by the earlier run's."""
    pytest.importorskip("torch")  # SCRIPT= and the gpt need it
    from mininet_topos import resume, run

    script = str(REPO / "examples" / "train_cnn.py")
    with pytest.raises(config.RunConfigError, match=r"^MODEL, STEPS are not used with SCRIPT= "):
        direct("--script", script, "--steps", "20", "--model", "gpt")
    with pytest.raises(config.RunConfigError, match=r"^--batch, --lr are not used with SCRIPT= "):
        direct("--script", script, "--lr", "0.1", "--batch", "8")
    with pytest.raises(config.RunConfigError, match=r"^--hidden sizes MODEL=mlp, not MODEL=gpt$"):
        direct("--model", "gpt", "--hidden", "128")
    assert direct("--hidden", "128").hidden == 128 and direct("--script", script, "--workers", "4").script
    assert direct("--script", script, "--loss", "0", "--steps", "auto").script  # the defaults: nothing given
    old = resume.Resumed(pathlib.Path("earlier"), config.parse(steps="3").on("embedded").to_dict())
    with pytest.raises(config.RunConfigError, match=r": --hidden, --batch, --lr, --slots cannot change \(only "):
        direct("--resume", "earlier", "--lr", "0.1", "--hidden", "128", "--batch", "8", "--slots", "16", old=old)
    got = direct("--resume", "earlier", "--steps", "6", "--loss", "0.02", "--cli", "0", old=old)
    assert (got.steps, got.loss, got.cli) == (6, 0.02, "0")
    parser = run.build_parser()  # make: its --given names the variables, and every flag has a value
    args = parser.parse_args(["--workers", "4", "--steps", "60", "--hidden", "32", "--given", "STEPS"])
    assert run.given_names(args, parser) == ["STEPS", "--hidden"]
    args = parser.parse_args(["--workers", "4", "--up", "--k", "32", "--seed", "0"])
    assert sorted(run.given_names(args, parser)) == ["K", "UP", "WORKERS"]


def test_seed_is_refused_where_it_seeds_nothing():
    """With SCRIPT= SEED only seeds the loss injection (the script seeds its own model and data):
    without LOSS it was accepted, printed and did nothing."""
    pytest.importorskip("torch")  # SCRIPT= needs it
    script = str(REPO / "examples" / "train_cnn.py")
    with pytest.raises(config.RunConfigError, match=r"^SEED is not used with SCRIPT= and LOSS=0: it seeds only "):
        config.parse(script=script, seed="3", given="SCRIPT SEED")
    with pytest.raises(config.RunConfigError, match=r"^SEED is not used with SCRIPT= and LOSS=0"):
        direct("--script", script, "--seed", "3")
    assert config.parse(script=script, seed="3", loss="0.02", given="SCRIPT SEED LOSS").seed == 3
    assert config.parse(seed="3", given="SEED").seed == 3  # the built-in models' data, batches and start


def test_target_auto_says_which_switch_it_chose_and_why():
    from mindp import targets
    from mininet_topos.preflight import target_reason

    assert target_reason("embedded", "embedded") == ""
    picked = targets.resolve("auto")
    why = target_reason("auto", picked)
    if picked == "bmv2":
        assert why.startswith(" (TARGET=auto: BMv2 is installed, ") and targets.find_bmv2() in why
    else:
        assert why == " (TARGET=auto: BMv2 is not installed)"


def test_a_k_that_is_no_multiple_of_8_is_one_line_from_protocols_rule():
    from mindp import protocol
    from mininet_topos import run as orchestrator

    for bad in ("100", "0", f"{protocol.MAX_K + 8}", "1e3", "-8"):
        assert protocol.k_error(bad) == f"elements per frame must be a multiple of 8 in 8..{protocol.MAX_K}", bad
        with pytest.raises(config.RunConfigError, match=rf"^K={bad}: elements per frame must be a multiple of 8 "):
            orchestrator.run_k(bad, "embedded")
    assert protocol.k_error("104") is None and orchestrator.run_k(" 104 ", "embedded") == 104


def test_k_beyond_bmv2s_packet_headroom_is_refused_on_bmv2_and_auto_takes_the_embedded_switch():
    from mindp import protocol, targets
    from mininet_topos import run as orchestrator

    big = protocol.BMV2_MAX_K + 8
    assert protocol.bmv2_fits(protocol.BMV2_MAX_K) and not protocol.bmv2_fits(big)
    assert protocol.bmv2_fits(protocol.HARDWARE_K) and not protocol.bmv2_fits(protocol.DEFAULT_K)
    assert orchestrator.run_k(str(protocol.BMV2_MAX_K), "bmv2") == protocol.BMV2_MAX_K
    assert orchestrator.run_k(str(big), "embedded") == big
    with pytest.raises(config.RunConfigError, match=rf"^K={big}: BMv2 runs K up to {protocol.BMV2_MAX_K} "):
        orchestrator.run_k(str(big), "bmv2")
    assert targets.resolve("auto", big) == "embedded"
    if targets.find_bmv2():
        assert targets.resolve("auto", protocol.HARDWARE_K) == "bmv2"
        with pytest.raises(targets.TargetError, match=rf"^BMv2 runs K up to {protocol.BMV2_MAX_K}, not {big}"):
            targets.resolve("bmv2", big)


def test_a_switch_process_runs_its_process_k_so_auto_never_starts_bmv2_beyond_its_headroom(monkeypatch):
    """The controller pushes this process's K: `auto` with a K BMv2 cannot grow packets for starts
    the embedded switch (it was BMv2, which aborted on the first GRAD), and `bmv2` is refused."""
    from mindp import protocol, targets

    monkeypatch.setattr(protocol, "K", protocol.BMV2_MAX_K + 8)
    cfg = targets.SwitchConfig(ports={})
    assert targets.command("auto", cfg)[1:3] == ["-m", "softswitch"]
    assert targets.SwitchProcess("auto", cfg).target == "embedded"
    if targets.find_bmv2():
        with pytest.raises(targets.TargetError, match=r"^BMv2 runs K up to "):
            targets.SwitchProcess("bmv2", cfg)
        monkeypatch.setattr(protocol, "K", protocol.HARDWARE_K)
        assert targets.SwitchProcess("auto", cfg).target == "bmv2"


def test_a_script_runs_config_json_records_no_built_in_model_or_steps_and_still_resumes(tmp_path):
    """config.json of a SCRIPT= run held the built-in trainer's defaults ("model": "mlp", "steps": 60)
    though the script brings its own; RESUME still reads it back into the run's settings."""
    from mininet_topos import resume

    script = config.RunConfig(script="examples/train_cnn.py", script_args="--steps 3", workers=2)
    got = script.recorded()
    assert not set(config.BUILTIN_ONLY) & set(got) and got["script"] == "examples/train_cnn.py"
    assert got["workers"] == 2 and got["script_args"] == "--steps 3"
    assert set(config.RunConfig(model="cnn").recorded()) >= set(config.BUILTIN_ONLY)  # a built-in run keeps them
    back = resume.settings(resume.Resumed(tmp_path, got), config.RunConfig(), [])
    assert (back.script, back.script_args, back.workers) == (script.script, script.script_args, 2)


def test_a_switch_process_for_another_k_than_its_process_says_so(monkeypatch):
    """bench/dataplane.py starts BMv2 for its K = 32 program from a process of K = 512."""
    from mindp import protocol, targets

    monkeypatch.setattr(protocol, "K", protocol.DEFAULT_K)
    if targets.find_bmv2():
        sw = targets.SwitchProcess("bmv2", targets.SwitchConfig(ports={}), k=protocol.HARDWARE_K)
        assert sw.target == "bmv2" and sw.cmd[0] == targets.find_bmv2()
    assert targets.SwitchProcess("auto", targets.SwitchConfig(ports={}), k=protocol.DEFAULT_K).target == "embedded"

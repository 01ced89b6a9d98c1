"""The bench scripts refuse bad sizes with argparse's one line and exit 2, before doing anything
(no traceback, no testbed): every numeric option goes through host_agent.agent_args.integer."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest

from host_agent.agent_args import integer
from mindp.harness import run_processes as processes
from mindp.protocol import K
from tests.heap_steps import FRESH, faults_a_step

REPO = pathlib.Path(__file__).resolve().parent.parent

BAD = [
    ("agents.py", ["--chunks", "0"]),
    ("agents.py", ["--elements", "31"]),
    ("agents.py", ["--page-chunks", "x"]),
    ("checks.py", ["--rounds", "0"]),
    ("checks.py", ["--elements", "x"]),
    ("dataplane.py", ["--k", "8008"]),
    ("digest.py", ["--rounds", "0"]),
    ("dataplane.py", ["--window", "1"]),
    ("ooc.py", ["--elements", "-5"]),
    ("scale.py", ["--chunks", "1"]),
    ("scale.py", ["--elements", "64"]),
    ("softswitch.py", ["--windows", "16", "0"]),
    ("softswitch.py", ["--packets", "1.5"]),
    ("softswitch.py", ["--rounds", "0"]),
    ("torch_gpt.py", ["--workers", "0"]),
    ("torch_gpt.py", ["--rounds", "0"]),
    ("torch_gpt.py", ["--k", "4"]),
    ("wire.py", ["--scapy-packets", "0"]),
]


@pytest.mark.parametrize("script,args", BAD, ids=[f"{s} {' '.join(a)}" for s, a in BAD])
def test_a_bad_size_is_one_line_and_exit_2(script, args):
    done = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], capture_output=True, text=True,
                          cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert f"error: argument {args[0]}: want an integer" in done.stderr.splitlines()[-1]


def test_torch_gpt_refuses_a_k_that_is_no_multiple_of_8_in_one_line():
    done = subprocess.run([sys.executable, str(REPO / "bench" / "torch_gpt.py"), "--k", "100"], capture_output=True,
                          text=True, cwd=REPO)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stdout.splitlines() == ["torch_gpt: --k 100: elements per frame must be a multiple of 8 in 8..8000"]


@pytest.mark.parametrize("gpt", ['{"foo": 1}', '{"d": -4}', '{"d": 30, "heads": 4}', "x"])
def test_torch_gpt_checks_its_gpt_sizes_as_make_run_does(gpt):
    """--gpt '{"foo": 1}' and '{"d": -4}' ended in tracebacks from the model's constructor."""
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, str(REPO / "bench" / "torch_gpt.py"), "--gpt", gpt], capture_output=True,
                          text=True, cwd=REPO)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stdout.splitlines()) == 1 and done.stdout.startswith("torch_gpt: --gpt: GPT")


def test_integer_bounds():
    assert integer(2)("2") == 2 and integer(1, 255)("255") == 255
    for parse, text in ((integer(2), "1"), (integer(1, 255), "256"), (integer(1), "1e3"), (integer(1), "")):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def load(script: str, monkeypatch):
    spec = importlib.util.spec_from_file_location(f"bench_{script}", REPO / "bench" / f"{script}.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # (dataclasses look their module up)
    spec.loader.exec_module(bench)
    return bench


def test_torch_gpt_quotes_the_median_of_ratios_taken_within_each_round(monkeypatch):
    bench = load("torch_gpt", monkeypatch)
    side = "make run MODEL=gpt TARGET=embedded K=512"
    # The host slows down 3x in the second round: the ratios within rounds stay, medians of rates would not.
    rounds = [bench.Round(r) for r in ({"one process": 4.0, "DDP": 4.0, side: 3.0},
                                       {"one process": 1.0, "DDP": 1.25, side: 1.0},
                                       {"one process": 4.0, "DDP": 4.0, side: 4.0})]
    (line,) = bench.summary_lines(rounds)
    assert line.startswith(f"{side}: median mindp / DDP 0.800, of one process 1.000 ")
    assert "(rounds: 0.750/0.750, 0.800/1.000, 1.000/1.000)" in line and "CPU" not in line
    # With each side's CPU a step in every round, its median ratio too (DDP's over mindp's).
    for r, (ddp, mindp) in zip(rounds, ((500.0, 600.0), (450.0, 500.0), (480.0, 480.0))):
        r.cpu_ms.update({"DDP": ddp, side: mindp})
    (line,) = bench.summary_lines(rounds)
    assert line.endswith("; CPU a step, DDP / mindp 0.900")


def test_softswitch_takes_each_ratio_within_its_round(monkeypatch):
    bench = load("softswitch", monkeypatch)
    emb, cpu = bench.EMBEDDED, bench.SWITCH_CPU
    # Packets/s: the second round's host is twice as slow at K = 32 only in the first round's terms.
    rounds = [{32: {emb: 1000.0, cpu: 2000.0}, 512: {emb: 700.0, cpu: 1250.0}},
              {32: {emb: 500.0, cpu: 1000.0}, 512: {emb: 400.0, cpu: 700.0}}]
    got = bench.per_round_ratios(rounds)
    assert got == {("embedded elements/s", 512): [11.2, 12.8],
                   ("embedded elements a switch CPU-second", 512): [10.0, 11.2]}


def test_torch_gpt_samples_each_worker_by_its_id_while_its_threads_come_and_go():
    """A worker whose threads end between listing and reading them is still sampled, under its own
    worker id."""
    churn = ("import threading, time\nprint('up', flush=True)\n"
             "while True:\n    threading.Thread(target=time.sleep, args=(0.0005,)).start()\n")
    p = subprocess.Popen([sys.executable, "-c", churn, "mininet_topos.trainer", "--worker", "3"], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"up\n"
        seen = [processes.proc_usage(p.pid) for _ in range(300)]
    finally:
        p.kill()
        p.wait()
    assert all(u is not None and u[0] == "worker 3" for u in seen), [u for u in seen if u is None or u[0] != "worker 3"][:1]


def test_torch_gpt_takes_each_process_s_figures_up_to_the_last_step_all_were_running(monkeypatch, tmp_path):
    """The other workers end while worker 0 still evaluates its last model (seconds at 25.5M
    parameters): the figures run to the last snapshot holding every process, so that each worker
    is listed, and a step's CPU is that snapshot's."""
    bench = load("torch_gpt", monkeypatch)
    sampler = bench.Sampler(0, tmp_path, steps=6)
    both = lambda cpu0, cpu1, node, faults: {10: ("worker 0", cpu0, 5, {"mindp-pump": cpu0 / 10}, faults),
                                             11: ("worker 1", cpu1, 7, {}, 0), 12: ("node", node, 9, {}, faults)}
    sampler.snaps = [(1, both(1.0, 2.0, 0.5, 100)), (3, both(1.6, 2.4, 0.7, 160)),
                     (4, {10: ("worker 0", 9.0, 5, {"mindp-pump": 0.9}, 999), 12: ("node", 0.8, 9, {}, 999)})]
    usages = sampler.usages()
    assert {u.role: round(u.cpu_ms) for u in usages} == {"worker 0": 300, "worker 1": 200, "node": 100}
    lines = bench.usage_lines(usages)
    assert lines[0] == "CPU ms a step: worker 0 300 (pump thread 30), worker 1 200, node 100; all 600"
    assert lines[2] == "minor page faults a step: worker 0 30, worker 1 0, node 30"


def test_torch_gpt_samples_neither_the_first_step_nor_the_last(monkeypatch, tmp_path):
    """The first step warms up; worker 0 logs the last only after evaluating the last model, while
    the other workers end: neither is sampled, and each step in between once."""
    bench = load("torch_gpt", monkeypatch)
    sampler = bench.Sampler(0, tmp_path, steps=5)
    assert [s for s in range(6) if sampler.sampled(s)] == [1, 2, 3]
    sampler.snaps = [(2, {})]
    assert [s for s in range(6) if sampler.sampled(s)] == [3]


def test_torch_gpt_splits_the_cpu_into_forward_backward_and_the_rest(monkeypatch, tmp_path):
    """Each worker's forward+backward CPU (its step lines' compute_cpu over the steps sampled) is
    listed, and all the CPU but theirs is the rest of the step: optimizer and communication."""
    bench = load("torch_gpt", monkeypatch)
    logs = tmp_path / "20261130-170000" / "logs"
    logs.mkdir(parents=True)
    for w, cpus in ((0, (0.5, 0.25, 0.21, 0.23)), (1, (0.5, 0.1, 0.12, 0.14))):
        (logs / f"worker-job1-{w}.log").write_text("".join(
            json.dumps({"ev": "step", "step": s, "compute": 1.0, "wait": 0.0, "compute_cpu": c,
                        **({"hooks_cpu": 0.01 * (1 + s % 2)} if w == 0 else {})}) + "\n"  # worker 1's: none
            for s, c in enumerate(cpus)))
    sampler = bench.Sampler(0, tmp_path, steps=5)
    at = lambda cpu0, cpu1, node: {10: ("worker 0", cpu0, 5, {}, 0), 11: ("worker 1", cpu1, 7, {}, 0),
                                   12: ("node", node, 9, {}, 0)}
    sampler.snaps = [(1, at(1.0, 2.0, 0.5)), (3, at(1.6, 2.4, 0.7))]
    lines = bench.usage_lines(sampler.usages())
    assert "forward+backward CPU ms (training thread, gradient hooks in): worker 0 220 (hooks 15), worker 1 130; " \
           "all the rest 250 (optimizer, communication: every other thread and process)" in lines


def test_torch_gpt_idle_time_is_the_cores_wall_time_less_every_process_s_cpu(monkeypatch):
    """250 ms a step on 2 cores is 500 core-ms: 400 ms of CPU leaves 100 idle; CPU read a moment
    after the wall's end (above it) is no idle time, not a negative one."""
    bench = load("torch_gpt", monkeypatch)
    assert bench.idle_ms(250.0, 400.0, 2) == 100.0
    assert bench.idle_ms(250.0, 400.0, 1) == 0.0
    assert bench.idle_ms(500.0, 250.0, 4) == 1750.0


def test_torch_gpt_takes_a_switch_run_s_idle_time_over_the_steps_its_cpu_was_read(monkeypatch, tmp_path):
    """A switch run's steps/s counts its first timed step, its CPU is read from the second on: the
    wall a step for its idle time is worker 0's over the steps the CPU was read, not 1 / steps/s
    (a first timed step 1 s slower than the rest at 25M made 300 ms a step of idle that was not)."""
    bench = load("torch_gpt", monkeypatch)
    logs = tmp_path / "20261206-210000" / "logs"
    logs.mkdir(parents=True)
    ends = (100.0, 106.7, 112.5, 118.3, 124.1, 130.5)  # step 1 slow; 2-4 at 5.8 s; 5 (not read) slow again
    (logs / "worker-job1-0.log").write_text("".join(
        json.dumps({"ev": "step", "step": s, "t": t, "compute": 1.0, "wait": 0.0}) + "\n" for s, t in enumerate(ends)))
    sampler = bench.Sampler(0, tmp_path, steps=7)
    assert sampler.step_ms() is None  # nothing read yet
    at = lambda cpu: {10: ("worker 0", cpu, 5, {}, 0)}
    sampler.snaps = [(1, at(1.0)), (4, at(12.0))]
    sampler.usages()
    assert round(sampler.step_ms(), 6) == round((ends[4] - ends[1]) / 3 * 1e3, 6) == 5800.0


def test_torch_gpt_tells_the_wait_for_a_slower_worker_from_the_network_s_round_trip(monkeypatch, tmp_path):
    """Parameters reach the workers at once: per step, the least wait is the network's round trip
    after the last backward, and each worker's wait beyond it is time spent behind a slower worker.
    A worker ahead in one step and behind in the next gets its lead counted only where it led."""
    bench = load("torch_gpt", monkeypatch)
    logs = tmp_path / "20261204-070000" / "logs"
    logs.mkdir(parents=True)
    waits = {0: (0.5, 0.040, 0.004, 0.030, 0.5), 1: (0.5, 0.005, 0.024, 0.006, 0.5)}
    for w, ws in waits.items():
        (logs / f"worker-job1-{w}.log").write_text("".join(
            json.dumps({"ev": "step", "step": s, "compute": 0.2, "wait": x, "compute_cpu": 0.2}) + "\n"
            for s, x in enumerate(ws)))
    sampler = bench.Sampler(0, tmp_path, steps=5)
    at = lambda cpu: {10: ("worker 0", cpu, 5, {}, 0), 11: ("worker 1", cpu, 7, {}, 0), 12: ("node", cpu, 9, {}, 0)}
    sampler.snaps = [(0, at(1.0)), (3, at(1.6))]
    usages = {u.role: u for u in sampler.usages()}
    assert round(usages["worker 0"].behind_ms, 6) == round((35 + 0 + 24) / 3, 6)
    assert round(usages["worker 1"].behind_ms, 6) == round((0 + 20 + 0) / 3, 6)
    assert usages["node"].behind_ms is None
    assert "of which waiting for a worker still in backward: worker 0 20, worker 1 7 (the rest: the round trip of " \
           "the step's last gradients, after the last worker's backward)" in bench.usage_lines(list(usages.values()))
    assert bench.behind_ms({0: {1: 0.01}}) == {}
    assert bench.behind_ms({0: {1: 0.01}, 1: {2: 0.01}}) == {}


def test_torch_gpt_gives_the_cpu_of_a_thread_mindp_names_apart():
    """A worker's pump thread (named by mindp.threadname) is sampled apart, by its name; the
    process's other threads are not listed."""
    # The named thread spins until the kernel has counted CPU to it: then the parent samples.
    spin = ("import threading\nfrom mindp import threadname\n"
            "def spin():\n    stat = f'/proc/self/task/{threading.get_native_id()}/stat'\n"
            "    while sum(map(int, open(stat).read().rsplit(')', 1)[1].split()[11:13])) == 0:\n        pass\n"
            "    print('up', flush=True)\n    threading.Event().wait()\n"
            "threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
            "threadname.Thread(target=spin, name='mindp-pump', daemon=True).start()\nthreading.Event().wait()\n")
    p = subprocess.Popen([sys.executable, "-c", spin, "mininet_topos.trainer", "--worker", "2"], cwd=REPO,
                         stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"up\n"
        role, cpu, _, named, faults = processes.proc_usage(p.pid)
    finally:
        p.kill()
        p.wait()
    assert role == "worker 2" and list(named) == ["mindp-pump"] and faults > 0  # (an interpreter's start faults)
    assert 0 < named["mindp-pump"] <= cpu


def test_torch_gpt_gives_the_node_a_budget_that_maps_its_whole_state_and_no_more(monkeypatch):
    """Like DDP's ranks, which hold their AdamW state in RAM: the node's budget maps the whole state,
    and a byte less would stream it (the budget is the least that maps it)."""
    pytest.importorskip("torch")  # the gpt's parameters come from torch
    bench = load("torch_gpt", monkeypatch)
    from host_agent import optim, residency, state
    from mindp import workload

    wl = workload.WorkloadConfig(n_workers=2, model="gpt", model_args={"d": 64, "layers": 2})
    w = residency.Workload(optim.layout_of(workload.init_params(wl)).n_chunks, state.DEFAULT_PAGE_CHUNKS,
                           record_bytes=state.record(3).itemsize)
    budget = bench.state_in_ram(wl)
    assert residency.decide(budget, w).mode == "mapped"
    assert residency.decide(budget - 1, w).mode == "stream"


def exec_done(p: subprocess.Popen) -> None:
    """Wait until the kernel has set p's new command line: Popen returns once exec has closed the
    close-on-exec pipe, which is before the new argv is in place (/proc/PID/cmdline reads empty)."""
    cmdline = pathlib.Path(f"/proc/{p.pid}/cmdline")
    while not cmdline.read_bytes():
        assert p.poll() is None, "the process ended before its exec completed"
        os.sched_yield()


def test_torch_gpt_samples_bmv2_as_the_switch_and_no_wrapper():
    """BMv2's simple_switch_grpc is the switch of a TARGET=bmv2 run; a wrapper whose command line
    names a role (flock ... softswitch) is not sampled as that role."""
    sleep = shutil.which("sleep")
    # argv[0] as given: the names, not the program, matter.
    bmv2 = subprocess.Popen(["/opt/p4tools/bin/simple_switch_grpc", "60"], executable=sleep)
    wrapper = subprocess.Popen(["flock", "-c", "sleep 60; :", "softswitch"], executable=shutil.which("bash"))
    try:
        for p in (bmv2, wrapper):
            exec_done(p)
        assert processes.proc_usage(bmv2.pid)[0] == "switch"
        assert processes.proc_usage(wrapper.pid) is None
    finally:
        for p in (bmv2, wrapper):
            p.kill()
            p.wait()


def test_torch_gpt_ctrl_c_is_one_line_and_exit_130(tmp_path):
    """Ctrl-C ends the bench with one line, not a traceback (what it started is ended on the way),
    and leaves nothing in the temp directory (a Ctrl-C just after its first line once left tempfile's
    empty probe file or its own directory there)."""
    pytest.importorskip("torch")
    # As from a terminal: SIGINT at its default (an xdist worker ignores it, and so would its
    # children, Python installing no handler for an ignored signal).
    p = subprocess.Popen([sys.executable, str(REPO / "bench" / "torch_gpt.py"), "--local-steps", "100000",
                          "--targets", "embedded"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    assert p.stdout.readline().startswith("gpt (")  # its first line: the model; then one process trains
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=600)  # a hang guard: it ends within a second of the signal
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("torch_gpt.py went on after Ctrl-C")
    assert p.returncode == 130 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == "torch_gpt: interrupted"
    assert not list(tmp_path.iterdir())


def test_torch_gpt_runs_its_sides_in_reverse_every_other_round(monkeypatch):
    bench = load("torch_gpt", monkeypatch)
    sides = ["one process", "DDP", "embedded", "bmv2"]
    orders = [bench.side_order(i, sides) for i in range(4)]
    assert orders[0] == orders[2] == sides
    assert orders[1] == orders[3] == sides[::-1]


@pytest.mark.parametrize("cpus", ["x", "", "99999", ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))])
def test_torch_gpt_refuses_network_cores_that_leave_no_core_to_train_in_one_line(cpus):
    done = subprocess.run([sys.executable, str(REPO / "bench" / "torch_gpt.py"), "--network-cores", cpus],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stdout.startswith(f"torch_gpt: --network-cores {cpus!r}: give some, not all, of the cores")
    assert len(done.stdout.splitlines()) == 1


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_torch_gpt_pins_make_run_s_processes_by_role_every_thread_of_them(monkeypatch):
    """--network-cores: the workers' threads on the training cores; the node's, the switch's and the
    orchestrator's on the network's, threads they start later included."""
    bench = load("torch_gpt", monkeypatch)
    assert bench.parse_cpus("0,2-3") == {0, 2, 3} and bench.parse_cpus("1") == {1}
    mine = sorted(os.sched_getaffinity(0))
    cores = bench.Cores(training={mine[0]}, network=set(mine[1:]))
    placed_as(bench, cores, lambda role: cores.training if role.startswith("worker") else cores.network)


def test_torch_gpt_pin_runs_make_run_pinned_and_without_it_unpinned(monkeypatch, tmp_path):
    """--pin: make run PIN=1 (DDP's rank N on worker N's core, mininet_topos.placement); otherwise
    PIN=0, also under --network-cores, which pins make run's processes itself."""
    bench = load("torch_gpt", monkeypatch)
    cmds = []

    class Started(Exception):
        pass

    def popen(cmd, **kw):
        cmds.append(cmd)
        raise Started

    mine = sorted(os.sched_getaffinity(0))
    done = subprocess.run([sys.executable, str(REPO / "bench" / "torch_gpt.py"), "--pin", "--network-cores", str(mine[-1])],
                          capture_output=True, text=True, cwd=REPO)
    assert (done.returncode, done.stdout) == (2, "torch_gpt: --pin and --network-cores: choose one placement\n")
    monkeypatch.setattr(bench.subprocess, "Popen", popen)
    for cores, pin in ((bench.placement.plan("1", mine, 2, 1, 1), "1"), (None, "0"),
                       (bench.Cores({mine[0]}, {mine[-1]}), "0")):
        with pytest.raises(Started):
            bench.switch_run("embedded", 2, 3, tmp_path, "{}", 2**30, "exit", cores)
        assert cmds[-1][cmds[-1].index("--pin") + 1] == pin


def placed_as(bench, placement, want) -> None:
    """Stand-ins for make run's processes, each with a thread: after placement.place, every thread
    of each is on want(its role), and so is a thread it starts later."""
    child = ("import sys, threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
             "print('up', flush=True)\nsys.stdin.readline()\n"
             "threading.Thread(target=lambda: print(sorted(__import__('os').sched_getaffinity(0)), flush=True)).start()\n"
             "time.sleep(600)\n")
    procs = [subprocess.Popen([sys.executable, "-c", child, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
             for argv in (["mininet_topos.run"], ["mininet_topos.trainer", "--worker", "1"], ["host_agent.node"],
                          ["softswitch"])]
    try:
        for p in procs:
            assert p.stdout.readline() == "up\n"
        for p in procs:
            placement.place(p.pid)
        roles = [processes.role(p.pid) for p in procs]
        assert roles == ["orchestrator", "worker 1", "node", "switch"]
        for p, role in zip(procs, roles):
            assert {os.sched_getaffinity(int(t)) == want(role) for t in os.listdir(f"/proc/{p.pid}/task")} == {True}
            p.stdin.write("\n")
            p.stdin.flush()
            assert p.stdout.readline() == f"{sorted(want(role))}\n"  # a thread started after the pinning
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_torch_gpt_scans_proc_for_the_run_s_processes_once(monkeypatch, tmp_path):
    """A scan of all of /proc costs a core about a per cent at 1.3M parameters: the processes of the
    first snapshot are sampled from then on."""
    bench = load("torch_gpt", monkeypatch)
    scans = []
    monkeypatch.setattr(bench.procstat, "tree", lambda root: scans.append(root) or [11, 12])
    monkeypatch.setattr(bench, "proc_usage", lambda pid: (f"worker {pid - 11}", 1.0, 1, {}, 0))
    logs = tmp_path / "20261204-030000" / "logs"
    logs.mkdir(parents=True)
    sampler = bench.Sampler(7, tmp_path, steps=6)
    sampler.start()
    try:
        with open(logs / "worker-job1-0.log", "w") as f:
            for step in range(5):
                f.write(json.dumps({"ev": "step", "step": step}) + "\n")
                f.flush()
                for _ in range(12000):  # each step sampled before the next is logged (a hang guard of minutes)
                    if step < 1 or len(sampler.snaps) >= step or not sampler.is_alive():
                        break
                    sampler.done.wait(0.01)
    finally:
        sampler.done.set()
        sampler.join()
    assert [s for s, _ in sampler.snaps] == [1, 2, 3, 4] and scans == [7]
    assert all(set(snap) == {11, 12} for _, snap in sampler.snaps)


class WorkStarted(Exception):
    """A bench went past its checks to its measurements."""


def started(*_, **__):
    raise WorkStarted


def bench_main(bench, monkeypatch, *args: str):
    """bench.main() with these arguments, its measurements replaced by a raise of WorkStarted."""
    for name in ("budgets", "send_rates", "memory_bandwidth", "node_rate", "disk_bandwidth", "program_for",
                 "measure"):
        if hasattr(bench, name):
            monkeypatch.setattr(bench, name, started)
    if hasattr(bench, "synthetic"):
        monkeypatch.setattr(bench.synthetic, "bench", started)
    monkeypatch.setattr(sys, "argv", [f"{bench.__name__.removeprefix('bench_')}.py", *args])
    return bench.main()


@pytest.mark.parametrize("value", ["false", "no", "2", "yes"])
def test_ooc_takes_0_or_1_for_mindp_bench_scale(value, monkeypatch, capsys):
    """'false' and 'no' ran the 1-billion-parameter scale run: only '0' left it out."""
    bench = load("ooc", monkeypatch)
    monkeypatch.setenv("MINDP_BENCH_SCALE", value)
    assert bench_main(bench, monkeypatch, "--no-scale") == 2
    assert capsys.readouterr().err == f"bench/ooc.py: MINDP_BENCH_SCALE must be 0 or 1, not {value!r}\n"
    for good, scale in (("0", False), ("1", True), ("", True)):
        monkeypatch.setenv("MINDP_BENCH_SCALE", good)
        assert bench.scale_from_env() is scale
    monkeypatch.delenv("MINDP_BENCH_SCALE")
    assert bench.scale_from_env() is True


@pytest.mark.parametrize("env,args,why", [
    (None, ["--no-scale", "--params", "PARAMS", "--budget", "1M"], "--params and --budget: for the scale run, "
     "which --no-scale leaves out"),
    ("0", ["--budget", "1M"], "--budget: for the scale run, which MINDP_BENCH_SCALE=0 leaves out"),
])
def test_ooc_refuses_sizes_of_a_scale_run_it_leaves_out(env, args, why, monkeypatch, capsys):
    bench = load("ooc", monkeypatch)
    monkeypatch.delenv("MINDP_BENCH_SCALE", raising=False)
    if env is not None:
        monkeypatch.setenv("MINDP_BENCH_SCALE", env)
    assert bench_main(bench, monkeypatch, *[str(2 * bench.K) if a == "PARAMS" else a for a in args]) == 2
    assert capsys.readouterr().err == f"bench/ooc.py: {why}\n"
    monkeypatch.setenv("MINDP_BENCH_SCALE", "0")
    with pytest.raises(WorkStarted):  # --scale takes them, the environment's 0 notwithstanding
        bench_main(bench, monkeypatch, "--scale", "--budget", "1M")


@pytest.mark.parametrize("script", ["ooc", "agents"])
def test_a_dir_the_bench_cannot_write_in_is_refused_in_one_line(script, monkeypatch, tmp_path, capsys):
    """tempfile.mkdtemp's FileNotFoundError was a traceback."""
    bench = load(script, monkeypatch)
    monkeypatch.setenv("MINDP_BENCH_SCALE", "0")
    (tmp_path / "a-file").write_text("")
    for path, why in ((tmp_path / "missing", "no such directory"), (tmp_path / "a-file", "not a directory")):
        assert bench_main(bench, monkeypatch, "--dir", str(path)) == 2
        assert capsys.readouterr().err == f"bench/{script}.py: --dir {path}: {why}\n"


def test_agents_refuses_sizes_of_figures_only_leaves_out(monkeypatch, capsys):
    """--only send ran the send figure alone and said nothing of --elements, --batch, ..."""
    bench = load("agents", monkeypatch)
    elements = str(4 * bench.K)
    for args, why in ((["--only", "send", "--elements", elements], "--elements (ram): for figures --only leaves out "
                       "(it runs send)"),
                      (["--only", "send", "--ooc-elements", elements, "--page-chunks", "2", "--batch", "3"],
                       "--batch (ram), --ooc-elements (ooc), --page-chunks (ooc): for figures --only leaves out "
                       "(it runs send)"),
                      (["--only", "ooc", "--only", "ram", "--chunks", "5", "--dir", "/"], "--chunks (send): for "
                       "figures --only leaves out (it runs ooc, ram)")):
        assert bench_main(bench, monkeypatch, *args) == 2
        assert capsys.readouterr().err == f"bench/agents.py: {why}\n"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(WorkStarted):
        bench_main(bench, monkeypatch, "--only", "ram", "--elements", elements, "--batch", "3")


def test_dataplane_row_refuses_a_k_other_than_its_own(monkeypatch, capsys):
    """--row --k 128 measured the process's own K (MINDP_K) and printed it as the row."""
    bench = load("dataplane", monkeypatch)
    other = 16 if bench.K != 16 else 32
    assert bench_main(bench, monkeypatch, "--row", "--k", str(other)) == 2
    assert capsys.readouterr().err == (f"bench/dataplane.py: --row measures this process's K, {bench.K} (MINDP_K), "
                                       f"not --k {other} (without --row, each --k runs at its own K)\n")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    for args in (["--row"], ["--row", "--k", str(bench.K)]):
        with pytest.raises(WorkStarted):
            bench_main(bench, monkeypatch, *args)


def test_checks_times_each_check_beside_what_it_is_compared_with():
    """bench/checks.py over a small model: holds against put, the parameter check against finish()'s
    copy and the torch path (or its one-line skips without numba or torch)."""
    done = subprocess.run([sys.executable, str(REPO / "bench" / "checks.py"), "--elements", "70000", "--rounds", "1"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    if lines[0].startswith("bench/checks.py: skipped"):
        pytest.skip(lines[0])
    assert lines[0].startswith(f"K = {K}, 70,000 elements in 2 tensors")
    assert "holds / put" in lines[1]
    assert "through torch / compiled" in lines[2] or lines[2] == "  parameters: skipped (no torch)"


# A step of the one-process side, before tests/heap_steps.py's steps
ONE_PROCESS_STEP = """
import sys
sys.path.insert(0, "bench")
import torch_gpt
from mindp import workload
torch_gpt.single_process(workload.WorkloadConfig(n_workers=1, model="gpt", model_args={"d": 32, "layers": 1}), 1)
"""


def test_torch_gpt_s_one_process_keeps_the_memory_a_step_frees_as_make_run_s_workers():
    """Like with like: the one-process side's heap keeps what a step frees, as a mindp worker's."""
    pytest.importorskip("torch")
    default, trained = faults_a_step(), faults_a_step(ONE_PROCESS_STEP)
    assert default > FRESH and trained * 20 < default


def test_torch_gpt_s_ddp_rank_keeps_the_memory_a_step_frees_before_gloo_starts(monkeypatch):
    """A DDP rank's heap is set as a worker's before gloo starts (its threads' arenas too)."""
    pytest.importorskip("torch")
    import torch.distributed as dist
    bench = load("torch_gpt", monkeypatch)
    calls = []
    monkeypatch.setattr(bench, "trains_as_a_worker", lambda: calls.append("heap"))

    def init_process_group(*args, **kwargs):
        calls.append("gloo")
        raise RuntimeError("no gloo here")
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # restored after the test: the rank sets its own
    with pytest.raises(RuntimeError, match="no gloo here"):
        bench.ddp_worker(0, 1, "127.0.0.1:1", 1, {})
    assert calls == ["heap", "gloo"]

"""The job survives what operators and failures do to it mid-run, through the real switch (the
embedded switch always, BMv2 where installed) configured by the real controller: workers added
and removed between steps, a switch restarted mid-step, a worker killed mid-step and restarted;
training ends bit-identical to the reference run that does the same."""
import dataclasses
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from host_agent import optim, reference
from host_agent.optim import OptimizerConfig
from host_agent.resume import ResumeFile
from host_agent.window import RtoConfig
from mindp import INSTALL_TORCH

from tests.target_params import TARGET_PARAMS

from mindp import progress

from .harness import STALL, AgentFabric, NodeProcess, Workers, check_against, job_bed, load_npz, run_files
from .helpers import same_bits, small_model

pytestmark = pytest.mark.net


@pytest.fixture(scope="module")
def bed():
    yield from job_bed("hrc-", 4)


TRAINER = ("mininet_topos.trainer",)


class WorkerProcess:
    """One worker process in its namespace with a resume file (mindp-worker with synthetic gradients,
    or the training worker with `workload`): killed (SIGKILL) at any moment and started again with
    the same command line, it goes on where it was."""

    def __init__(self, bed, topo, w: int, tmp_path, init: dict, grad_seed: int = 0, workload=None,
                 trainer: tuple[str, ...] = TRAINER):
        """trainer: the training worker's module and any arguments of its own before the trainer's."""
        self.host = bed.hosts[topo.jobs[0].workers[w]]
        self.w = w
        self.layout = optim.layout_of(init)
        self.path = tmp_path / f"w{w}.resume"
        self.out = tmp_path / f"w{w}.npz"
        self.log = tmp_path / f"w{w}.log"
        # The others wait out a killed worker's restart, which on a busy machine (a torch import) takes
        # longer than STALL: their own deadline is only the hang guard; a test wanting a give-up sets one.
        common = ["--topology", str(tmp_path / "topo.json"), "--job", "1", "--worker", str(w), "--init",
                  str(tmp_path / "init.npz"), "--resume", str(self.path), "--out", str(self.out),
                  "--deadline", str(progress.CAP)]
        if workload is None:
            self.argv = [sys.executable, "-m", "host_agent.worker", *common, "--grad-seed", str(grad_seed)]
        else:
            self.argv = [sys.executable, "-m", *trainer, *common, "--workload", str(workload),
                         "--rto-min", "0.01", "--rto-max", "0.5"]
        self.proc = None
        self.file: ResumeFile | None = None
        self.banners: list[str] = []

    def start(self, steps: int) -> "WorkerProcess":
        self.started_at = self.progress() if self.file is not None else None
        with open(self.log, "a") as log:
            self.proc = self.host.popen(*self.argv, "--steps", str(steps), stdout=subprocess.PIPE, stderr=log,
                                        text=True)
        return self

    def progress(self) -> tuple[int, int]:
        """(the step it is at, chunks of it answered), from its resume file."""
        if self.file is None:
            while not self.path.exists():
                assert self.proc.poll() is None, self.log.read_text()
                time.sleep(0.005)
            self.file = ResumeFile(self.path, 1, self.w, self.layout)
        step = self.file.step
        return step, int(np.count_nonzero(self.file.answered_in(step)[0]))

    def kill_mid_step(self, at_least: int) -> tuple[int, int]:
        """SIGKILL once it is at step >= at_least with part of the step answered; returns (step,
        answered) as the killed process left them in its file."""
        def mid_step() -> bool:
            step, done = self.progress()
            assert self.proc.poll() is None, self.log.read_text()
            # mid-step, and this process got somewhere (not the state the last one left)
            return step >= at_least and 0 < done < self.layout.n_chunks and (step, done) != self.started_at

        progress.wait(mid_step, progress.both(self.progress, progress.activity(self.proc.pid)), stall=STALL,
                      what=f"worker {self.w} reaching step {at_least}", poll=0.001)
        os.kill(self.proc.pid, signal.SIGKILL)  # `ip netns exec` execs the worker: the same PID
        self._collect()
        return self.progress()

    def _collect(self) -> None:
        out, _ = progress.communicate(self.proc, stall=STALL, progress=progress.file_sizes(self.log, self.path))
        self.banners += [line for line in out.splitlines() if "resuming at step" in line]
        self.output = out

    def wait(self) -> None:
        self._collect()
        assert self.proc.returncode == 0, self.log.read_text()


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_worker_link_down_and_up_mid_step(bed, tmp_path, target):
    """Worker 2's link goes down mid-step for longer than its step deadline (`ip link set down` in
    its namespace, then up): it says so in one line, retries with backoff instead of failing the
    step, says when the link is back, and every worker and the node end at reference bits."""
    b, topo = bed
    init = small_model()
    gf = reference.synthetic_grads(35)
    steps = 6
    ref = reference.train(init, gf, 4, steps, OptimizerConfig())
    args = run_files(tmp_path, topo, init, steps) + ["--stall-resend", "0.5"]
    w2 = WorkerProcess(b, topo, 2, tmp_path, init, 35)
    w2.argv[w2.argv.index("--deadline") + 1] = "1.5"
    with AgentFabric(target, bed, tmp_path):
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        try:
            # Worker 0 holds the last step open until released: however fast the job, worker 2 is
            # still training when its link goes down (it once ended all 6 steps before).
            workers = Workers(b, topo, init, gf, steps, ids=[0, 1, 3], pause={0: steps - 1}).start()
            w2.start(steps)
            while not 0 < w2.progress()[1] or w2.progress()[0] < 2:
                time.sleep(0.001)
            w2.host.exec("ip", "link", "set", "dev", "eth0", "down", check=True)
            time.sleep(2.5)  # past its step deadline; and until it noticed, however slowly
            progress.wait(lambda: "link down" in w2.log.read_text(), progress.activity(w2.proc.pid), stall=STALL,
                          what="worker 2 noticing its link is down")
            workers.release()
            w2.host.exec("ip", "link", "set", "dev", "eth0", "up", check=True)
            workers.join()
            w2.wait()
            assert node.finish() == 0
        finally:
            node.stop()
            if w2.proc and w2.proc.poll() is None:
                w2.proc.kill()
            w2.host.exec("ip", "link", "set", "dev", "eth0", "up")
    log = w2.log.read_text()
    assert "Traceback" not in log
    down = [line for line in log.splitlines() if "link down" in line]
    assert down == ["mindp-worker 1/2: link down (Network is down); retrying every 0.05-2.0 s"], log
    assert len([line for line in log.splitlines() if "link back after" in line]) == 1, log
    assert same_bits(load_npz(w2.out), ref.params)
    check_against(ref, workers, tmp_path)


@pytest.mark.parametrize("target", TARGET_PARAMS)
@pytest.mark.parametrize("model", ["mlp", "cnn-loss-scaling"])
def test_training_worker_killed_mid_step_rejoins_from_its_resume_file(bed, tmp_path, target, model):
    """The training worker of `make run` (mininet_topos.trainer) with --resume: worker 1 is killed
    (SIGKILL) mid-step twice and started again with the same command line; with a torch model and
    dynamic loss scaling its scale comes back from the file too. All end at the workload
    reference's bits."""
    from mindp import workload

    b, topo = bed
    steps = 5
    if model == "mlp":
        cfg = workload.WorkloadConfig(n_workers=4, seed=3, batch=8, hidden=16)
    else:
        pytest.importorskip("torch", reason=f"torch is not installed: {INSTALL_TORCH}")
        cfg = workload.WorkloadConfig(n_workers=4, seed=3, batch=8, model="cnn", loss_scale=2.0**12,
                                      scale_growth_interval=2)
    init = workload.init_params(cfg)
    ref = workload.reference_train(cfg, init, steps, OptimizerConfig())
    cfg.dump(tmp_path / "workload.json")
    args = run_files(tmp_path, topo, init, steps) + ["--stall-resend", "0.5"]
    # Worker 0 holds steps 1 and 3 open (all but its last gradient sent) until released: worker 1
    # is then mid-step for as long as the kill takes, however fast the job (polling alone once
    # missed the middle of every step of a 4-chunk model).
    hold = tmp_path / "hold"
    hold.mkdir()
    held = ("tests.host_agent.held_trainer", str(hold), "1,3", "--")
    procs = [WorkerProcess(b, topo, w, tmp_path, init, workload=tmp_path / "workload.json",
                           trainer=held if w == 0 else TRAINER) for w in range(4)]
    with AgentFabric(target, bed, tmp_path):
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        try:
            for p in procs:
                p.start(steps)
            kills = []
            for at in (1, 3):
                kills.append(procs[1].kill_mid_step(at))
                procs[1].start(steps)
                (hold / f"release-{at}").touch()
            for p in procs:
                p.wait()
            assert node.finish() == 0
        finally:
            node.stop()
            for p in procs:
                if p.proc and p.proc.poll() is None:
                    p.proc.kill()
    assert all(0 < done < procs[1].layout.n_chunks for _, done in kills), kills
    assert (hold / "held-1").exists() and (hold / "held-3").exists()
    log = procs[1].log.read_text()
    assert all(f"worker 1/1: resuming at step {s} ({d} chunk(s) of it answered)" in log for s, d in kills), log
    for p in procs:
        assert same_bits(load_npz(p.out), ref.params), f"worker {p.w} differs from the reference"
    assert same_bits(load_npz(tmp_path / "final.npz"), ref.master)
    # The loss scale (2^12, doubled every 2 finite steps) the killed worker holds: as the others'.
    scales = [p.file.aux(steps).tolist() if p.file else ResumeFile(p.path, 1, p.w, p.layout).aux(steps).tolist()
              for p in procs]
    assert scales == [scales[0]] * 4
    if cfg.loss_scale:
        assert scales[0][:3] == [2.0**14, 1.0, 1.0]


def test_training_worker_writes_no_out_after_a_failed_step(bed, tmp_path):
    """No switch, no node: the training worker's step times out; it exits 1 with the StepTimeout
    line, and its --out is not written (the parameters are not the run's result)."""
    from mindp import workload

    b, topo = bed
    cfg = workload.WorkloadConfig(n_workers=4, seed=3, batch=8, hidden=16)
    init = workload.init_params(cfg)
    cfg.dump(tmp_path / "workload.json")
    run_files(tmp_path, topo, init, 2)
    p = WorkerProcess(b, topo, 0, tmp_path, init, workload=tmp_path / "workload.json")
    p.argv[p.argv.index("--deadline") + 1] = "0.5"
    p.start(2)
    out, _ = progress.communicate(p.proc, stall=STALL)
    err = p.log.read_text()
    assert p.proc.returncode == 1 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("worker 1/0: job 1 worker 0 step 0: no parameters for"), err
    assert not p.out.exists()
    assert '"ev": "done"' in out


def first_three(topo):
    """The topology's job with workers 0..2 only (worker 3's host stays free to be added)."""
    job = topo.jobs[0]
    return dataclasses.replace(job, workers={w: h for w, h in job.workers.items() if w < 3})


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_workers_added_and_removed_between_steps(bed, tmp_path, target):
    """Steps 0-1 with workers 0-2, `workers add 3`, step 2 with 0-3, `workers remove 0`, steps 3-4
    with 1-3: the node follows the count the switch's sums carry, each mean divided by it."""
    b, topo = bed
    init = small_model()
    gf = reference.synthetic_grads(31)
    phases = [([0, 1, 2], 0, 2), ([0, 1, 2, 3], 2, 3), ([1, 2, 3], 3, 5)]
    members = {s: ids for ids, lo, hi in phases for s in range(lo, hi)}
    ref = reference.train(init, gf, 3, 5, OptimizerConfig(), members=members.__getitem__)
    args = run_files(tmp_path, topo, init, 5)
    with AgentFabric(target, bed, tmp_path, job=first_three(topo)) as fab:
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        try:
            params = None
            for ids, lo, hi in phases:
                if lo == 2:
                    assert sorted(fab.ctl.add_worker(1, 3, topo.jobs[0].workers[3]).workers) == [0, 1, 2, 3]
                if lo == 3:
                    assert sorted(fab.ctl.remove_worker(1, 0).workers) == [1, 2, 3]
                workers = Workers(b, topo, init, gf, hi, ids=ids, first_step=lo, params=params).start()
                workers.join()
                assert sorted(workers.results) == ids
                params = workers.results[ids[-1]]
            assert node.finish() == 0
        finally:
            node.stop()
    stats = check_against(ref, workers, tmp_path)
    assert stats.get("rejected_nworkers", 0) == 0 and stats["committed"] == 4


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_switch_killed_and_restarted_mid_step(bed, tmp_path, target):
    """The switch is killed (SIGKILL) twice inside a step and the controller restores it: every
    partial sum is gone. Worker 0 loses 30 % of what it receives, so at the kill it usually lacks
    parameters the others have (they will not send those gradients again): the node's stall
    resend of its recent parameters completes the step, and training ends at reference bits."""
    b, topo = bed
    init = small_model()
    gf = reference.synthetic_grads(32)
    steps = 6
    ref = reference.train(init, gf, 4, steps, OptimizerConfig())
    args = run_files(tmp_path, topo, init, steps) + ["--stall-resend", "0.5"]
    rto = RtoConfig(initial=0.05, min=0.01, max=0.5, deadline=STALL)
    with AgentFabric(target, bed, tmp_path) as fab:
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        try:
            workers = Workers(b, topo, init, gf, steps, rto=rto, recv_drop={0: 0.3}).start()
            for step in (1, 3):
                workers.wait_step(step)
                time.sleep(0.03)
                assert "rewrote" in " ".join(fab.restart())
            workers.join()
            assert node.finish() == 0
        finally:
            node.stop()
    stats = check_against(ref, workers, tmp_path)
    assert stats["stall_resends"] > 0


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_worker_killed_mid_step_rejoins_from_its_resume_file(bed, tmp_path, target):
    """Worker 2 is a mindp-worker process killed (SIGKILL) twice in the middle of a step, each time
    with part of the step's parameters received, and started again with the same command line: it
    finds the step, the parameters before it and the chunks already answered in its resume file,
    sends only the rest (the switch still holds those cells), and every worker and the node end at
    reference bits."""
    b, topo = bed
    init = small_model()
    gf = reference.synthetic_grads(34)
    steps = 6
    ref = reference.train(init, gf, 4, steps, OptimizerConfig())
    args = run_files(tmp_path, topo, init, steps) + ["--stall-resend", "0.5"]
    with AgentFabric(target, bed, tmp_path):
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        w2 = WorkerProcess(b, topo, 2, tmp_path, init, 34)
        try:
            # Worker 0 holds steps 1 and 3 open until released: worker 2 is then mid-step for as
            # long as the kill takes, however fast the job.
            workers = Workers(b, topo, init, gf, steps, ids=[0, 1, 3], pause={0: (1, 3)}).start()
            w2.start(steps)
            kills = []
            for at in (1, 3):
                kills.append(w2.kill_mid_step(at))
                w2.start(steps)
                workers.release(at)
            workers.join()
            w2.wait()
            assert node.finish() == 0
        finally:
            node.stop()
            if w2.proc and w2.proc.poll() is None:
                w2.proc.kill()
    assert all(0 < done < w2.layout.n_chunks for _, done in kills), kills
    assert w2.banners == [f"mindp-worker 2: resuming at step {s} ({d} chunk(s) of it answered)" for s, d in kills]
    assert same_bits(load_npz(w2.out), ref.params)
    check_against(ref, workers, tmp_path)


@pytest.mark.parametrize("target", TARGET_PARAMS)
def test_chaos_switch_node_worker_controller_killed_in_turn(bed, tmp_path, target):
    """One training run; in turn the switch is killed (SIGKILL) and restored by the controller,
    the optimizer node is killed (SIGKILL) and restarted on its state, worker 2 (a mindp-worker
    process) is killed (SIGKILL) in the middle of a step and started again with the same command
    line (its resume file), worker 1 is stopped between steps and restarted at its step
    (`first_step`), and the controller is replaced by a new one that learns the job from the switch
    (and then changes it: worker 3 leaves; worker 2 goes on from its resume file). Every survivor,
    the restarted workers and the node's master end bit-identical to the reference."""
    b, topo = bed
    init = small_model()
    gf = reference.synthetic_grads(33)
    steps = 10
    members = lambda s: [0, 1, 2, 3] if s < 8 else [0, 1, 2]  # noqa: E731
    ref = reference.train(init, gf, 4, steps, OptimizerConfig(), members=members)
    args = run_files(tmp_path, topo, init, steps) + ["--stall-resend", "0.5"]
    rto = RtoConfig(initial=0.05, min=0.01, max=0.5, deadline=STALL)
    w2 = WorkerProcess(b, topo, 2, tmp_path, init, 33)
    with AgentFabric(target, bed, tmp_path) as fab:
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        try:
            # worker 1 stops before step 7; worker 2 is killed in step 4, where worker 0 holds all
            # but the chunks of its first tensor until released (polling for the middle of a step
            # missed it under load, and then waited on a worker that could not leave step 7)
            workers = Workers(b, topo, init, gf, 8, rto=rto, ids=[0, 1, 3], stop_before={1: 7},
                              pause={0: 4}).start()
            w2.start(8)
            workers.wait_step(1)
            time.sleep(0.03)
            assert "pushed the pipeline" in fab.restart()  # 1. the switch
            workers.wait_step(3)
            time.sleep(0.03)
            node.kill()  # 2. the optimizer node
            time.sleep(0.3)
            node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
            kill_at, answered = w2.kill_mid_step(4)  # 3. a worker, mid-step
            w2.start(8)
            workers.release()
            at, params = workers.stopped(1)  # 3b. another, between steps
            assert at == 7
            time.sleep(0.3)
            again = Workers(b, topo, init, gf, 8, rto=rto, ids=[1], first_step=at, params=params).start()
            ctl = fab.restart_controller()  # 4. the controller
            assert sorted(ctl.job(1).workers) == [0, 1, 2, 3]
            workers.join()
            again.join()
            w2.wait()
            ctl.remove_worker(1, 3)  # the new controller can still manage the job
            last = Workers(b, topo, init, gf, steps, rto=rto, ids=[0, 1], first_step=8,
                           params=workers.results[0]).start()
            w2.start(steps)  # the same command line with the job's new step count
            last.join()
            w2.wait()
            assert node.finish() == 0
        finally:
            node.stop()
            if w2.proc and w2.proc.poll() is None:
                w2.proc.kill()
    assert kill_at == 4 and 0 < answered < w2.layout.n_chunks
    assert w2.banners == [f"mindp-worker 2: resuming at step {kill_at} ({answered} chunk(s) of it answered)",
                          "mindp-worker 2: resuming at step 8 (0 chunk(s) of it answered)"]
    assert sorted(workers.results) == [0, 3] and sorted(again.results) == [1]
    at8 = reference.train(init, gf, 4, 8, OptimizerConfig())
    check_against(at8, workers, tmp_path, master=False)
    check_against(at8, again, tmp_path, master=False)
    check_against(ref, last, tmp_path)
    assert same_bits(load_npz(w2.out), ref.params)

"""One training worker of `make run`, run inside its Mininet host.

Computes the model's gradients on its own shard (mindp.workload), pushes them
through the worker agent (host_agent.worker) and trains on the fp16 parameters
that come back. A torch model (cnn, gpt) goes through mindp.torch.DataParallel:
its gradients leave from backward hooks while the backward pass still runs. It
writes one JSON line per step to stdout (its loss on its own batch among them),
which the orchestrator reads for the progress bar and metrics.csv; worker 0 also
evaluates the model (loss on the training set, accuracy on the test set) every
EVAL-th step, on a thread of its own while the next step trains (class Evaluations).

    python -m mininet_topos.trainer --topology T.json --job 1 --worker 0 \
        --workload W.json --init init.npz --steps N --out final.npz
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from host_agent import agent_args, digest, optim, rawsock
from host_agent.optim import ConfigError
from host_agent.resume import ResumeFile
from host_agent.window import RtoConfig, StepTimeout
from host_agent.worker import WorkerAgent, WorkerConfig
from mindp import heap, workload
from mindp.topology import Topology, TopologyError


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


class Evaluations:
    """Each step's line, with worker 0's evaluation of that step's parameters. The evaluation runs
    on a thread while the next step trains (the other workers would wait for this worker's
    gradients meanwhile), on a copy of the parameters and a model of its own; at most one runs,
    and lines come out in step order, each with the time its step ended."""

    def __init__(self, evaluate, every: int = 1, last: int = -1):
        self.evaluate = evaluate
        self.every, self.last = every, last  # evaluated: the model before the first step, every
        # `every`-th step (0: none) and step `last`
        self.pool = ThreadPoolExecutor(max_workers=1) if evaluate is not None else None
        self.pending: Future | None = None

    def wanted(self, step: int) -> bool:
        return self.pool is not None and (step < 0 or step == self.last or (self.every > 0 and (step + 1) % self.every == 0))

    def line(self, params: dict, **fields) -> None:
        if not self.wanted(fields["step"]):
            emit(**fields)
            return
        self.wait()
        snapshot = {name: np.array(a, copy=True) for name, a in params.items()}
        self.pending = self.pool.submit(self._evaluated, snapshot, fields)

    def _evaluated(self, params: dict, fields: dict) -> None:
        loss, acc = self.evaluate(params)
        emit(**fields, loss=loss, acc=acc)

    def wait(self) -> None:
        """Until the last line is out (an evaluation's error is raised here)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mininet_topos.trainer", description="mindp training worker (mlp, cnn or gpt)")
    p.add_argument("--iface", default="eth0")
    p.add_argument("--topology", required=True)
    p.add_argument("--job", type=int, required=True)
    p.add_argument("--worker", type=int, required=True)
    p.add_argument("--workload", required=True, help="workload JSON (mindp.workload.WorkloadConfig)")
    p.add_argument("--init", required=True, help=".npz of initial float32 parameters")
    p.add_argument("--steps", type=int, required=True, help="the job's step count: run until this step is done")
    p.add_argument("--first-step", type=int, default=0,
                   help="rejoin a live job at this step, --init being the parameters held before it")
    p.add_argument("--resume", metavar="FILE",
                   help="resume file, kept current at every received chunk: if it exists the worker goes on "
                        "where it was (step, parameters, chunks answered, loss scale), whatever --first-step says")
    p.add_argument("--eval-every", type=int, metavar="N",
                   help="evaluate the model before the first step, after every N-th (0: none) and after the last")
    p.add_argument("--deadline", type=float, default=RtoConfig.deadline)
    # A slot completes only when every worker's chunk is in, so one worker's round trip includes the
    # others' queueing and recovery: a 20 ms floor retransmits spuriously behind a software switch,
    # and an uncapped RTO grows with the slowest worker's back-off under loss (docs/RUN.md).
    p.add_argument("--rto-min", type=float, default=0.1, help="retransmission timeout floor (s)")
    p.add_argument("--rto-max", type=float, default=0.25, help="retransmission timeout cap (s)")
    p.add_argument("--out", required=True, help="final fp16 parameters (.npz)")
    agent_args.add_fault_args(p)
    return p


def _numpy_step(wl: workload.WorkloadConfig, agent: WorkerAgent, timing: dict):
    """timing as _torch_step's: "compute", the gradient's seconds; "wait", then sending it and
    waiting for the step's parameters (nothing overlaps them here); "batch_loss"."""
    loss_grad = workload.loss_grad_fn(wl)

    def step_fn(worker: int, step: int, params: dict) -> dict:
        t = time.perf_counter()
        loss, g = loss_grad(worker, step, params)
        t1 = time.perf_counter()
        params = agent.push(g)
        timing["compute"], timing["wait"] = round(t1 - t, 6), round(time.perf_counter() - t1, 6)
        timing["batch_loss"] = loss
        return params

    return step_fn


def _scaler_state(scaler) -> list[float]:
    """The loss scaler as kept in the resume file (aux): scale, growth tracker, 1 = set."""
    return [scaler.scale, float(scaler.growth_tracker), 1.0, 0.0]


def _torch_step(wl: workload.WorkloadConfig, agent: WorkerAgent, start: dict, resumed: bool, timing: dict):
    """timing["compute"]: the last step's forward and backward seconds (its step line's), "compute_cpu"
    their CPU seconds in the training thread (the gradient hooks' included; "hooks_cpu" theirs alone:
    the gradients rounded into frames, the pump thread nudged); timing["wait"]: the
    seconds it then waited for the step's parameters (the round trip not hidden by backward);
    timing["batch_loss"]: the loss on this worker's batch (unscaled)."""
    from mindp.lossscale import LossScaler
    from mindp.torch import DataParallel, models, tasks

    net = tasks.model(wl)
    models.load_params(net, start)
    scaler = LossScaler(wl.loss_scale, growth_interval=wl.scale_growth_interval) if wl.loss_scale else None
    if scaler and agent.resume is not None:
        aux = agent.resume.aux(agent.step)
        if resumed and aux[2] == 1.0:  # the scale every worker holds at this step
            scaler.scale, scaler.growth_tracker = float(aux[0]), int(aux[1])

        def after(step: int, skipped: bool) -> list[float]:  # kept with the next step, before it begins
            nxt = dataclasses.replace(scaler)
            nxt.update(skipped)
            return _scaler_state(nxt)

        agent.resume_aux = after
    dp = DataParallel(net, agent, scaler)

    def step_fn(worker: int, step: int, params: dict) -> dict:
        x, y = tasks.batch(wl, worker, step)
        t, cpu = time.perf_counter(), time.thread_time()
        loss = models.loss_of(wl.model, net, x, y)
        forward, forward_cpu = time.perf_counter() - t, time.thread_time() - cpu
        params = dp.step(loss)
        timing["compute"] = round(forward + dp.backward_seconds, 6)
        timing["compute_cpu"] = round(forward_cpu + dp.backward_cpu, 6)
        timing["hooks_cpu"] = round(dp.hooks_cpu, 6)
        timing["wait"] = round(dp.wait_seconds, 6)
        timing["batch_loss"] = loss.item()
        return params

    return step_fn


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    heap.keep_freed()  # each step's activations and gradients reused, not faulted in again (mindp/heap.py)
    try:
        wl = workload.WorkloadConfig.load(args.workload)
        init = optim.load_npz(args.init)
        layout = optim.layout_of(init)
        if args.first_step < 0:
            raise ConfigError("--first-step must be >= 0")
        cfg = WorkerConfig.from_topology(Topology.load(args.topology), args.job, args.worker,
                                         rto=RtoConfig(min=args.rto_min, max=args.rto_max, deadline=args.deadline),
                                         first_step=args.first_step)
        faults = agent_args.faults_from_args(args)
        resume, resumed = None, False
        if args.resume:
            scale = [wl.loss_scale, 0.0, 1.0, 0.0] if wl.loss_scale else None
            resume, resumed = ResumeFile.open(args.resume, cfg.job_id, cfg.worker_id, layout,
                                              layout.flatten(init, dtype=np.float32).astype(np.float16),
                                              cfg.first_step, scale)
        agent = WorkerAgent(cfg, layout, rawsock.open_raw(args.iface), faults,
                            initial={n: a.astype(np.float16) for n, a in init.items()}, resume=resume)
        agent.check_digests()
        start = layout.unflatten(agent.current[: layout.total])  # fp16: --init's, or the resume file's
        timing: dict = {}
        step_fn = _torch_step(wl, agent, start, resumed, timing) if wl.model != "mlp" else _numpy_step(wl, agent, timing)
        evaluate = workload.model_eval(wl) if args.eval_every is not None else None
    except (ConfigError, TopologyError, workload.WorkloadError, rawsock.SocketError, ValueError, ImportError) as exc:
        print(f"worker {args.job}/{args.worker}: {exc}", file=sys.stderr, flush=True)
        return 2
    params = start
    if resumed:
        print(f"worker {args.job}/{args.worker}: resuming at step {agent.step} "
              f"({int(np.count_nonzero(resume.answered_in(agent.step)[0]))} chunk(s) of it answered)",
              file=sys.stderr, flush=True)

    lines = Evaluations(evaluate, args.eval_every or 0, args.steps - 1)

    def status(step: int, **extra) -> None:
        lines.line(params, ev="step", job=args.job, worker=args.worker, step=step, t=time.time(),
                   sent=agent.stats["sent"], retx=agent.stats["retransmitted"], rej=agent.rejected,
                   cpu=round(time.process_time(), 4), **extra)

    status(agent.step - 1)  # the model before the first step this process runs
    code = 0
    try:
        while agent.step < args.steps:
            step = agent.step
            params = step_fn(args.worker, step, params)
            status(step, **timing)
    except (StepTimeout, digest.DigestError) as exc:
        print(f"worker {args.job}/{args.worker}: {exc}", file=sys.stderr, flush=True)
        code = 1
    trained = time.time()  # the run's training time ends here: evaluating the last step is not training
    lines.wait()
    if code == 0:  # after a failed step the parameters are not the run's result
        np.savez(args.out, **params)
    stats = {k: int(v) for k, v in agent.stats.items()}
    if faults:
        stats.update(dropped_send=faults.dropped_send, dropped_recv=faults.dropped_recv)
    emit(ev="done", job=args.job, worker=args.worker, t=trained, stats=stats, rto=agent.rtt.rto)
    return code


if __name__ == "__main__":
    sys.exit(main())

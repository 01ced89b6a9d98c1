"""Where metrics.csv's per-step figures come from: the optimizer node's commit line (elements updated
and the seconds spent on them, once per step) and rank 0's JSON loss lines of an UP=1 run (rank 0's
torchrun output file, which torchrun writes anew on a restart)."""
import json
import random


from host_agent import optim, reference
from host_agent.optim import OptimizerConfig
from mindp.protocol import K
from mininet_topos.own_torchrun import commands
from mininet_topos.progress import LogTail, Progress
from tests.host_agent.helpers import initial_fp16, small_model
from tests.host_agent.node_steps import open_core, run_step


def test_the_node_reports_each_commit_once_with_every_chunk_it_updated(tmp_path):
    init = small_model()
    lay = optim.layout_of(init)
    core = open_core(tmp_path, init, OptimizerConfig())
    commits = []
    core.on_commit = lambda step, elements, seconds, durable: commits.append((step, elements, seconds, durable))
    params, rng = initial_fp16(init), random.Random(0)
    for step in range(2):
        run_step(core, lay, reference.synthetic_grads(1), step, params, rng)  # with duplicates: applied once
    assert [(s, e) for s, e, _, _ in commits] == [(0, lay.n_chunks * K), (1, lay.n_chunks * K)]
    assert all(t > 0 and durable > 0 for _, _, t, durable in commits)  # (a commit's fsync takes time on any disk)


def test_rank0s_json_lines_are_loss_samples_and_other_lines_are_not():
    p = Progress({1: 2}, 0)
    p.feed(json.dumps({"ev": "step", "job": 1, "worker": 0, "step": 4, "t": 1.0}))
    assert p.feed_output('{"step": 3, "loss": 1.25, "acc": 0.5}')
    assert p.feed_output('{"loss": 0.75}')  # no step: the one rank 0 finished last
    for other in ("loss 0.7", '{"step": 5}', '{"loss": "high"}', "[1, 2]", ""):
        assert not p.feed_output(other)
    c = p.curves[1]
    assert (c.steps, c.loss, c.acc[0]) == ([3, 4], [1.25, 0.75], 0.5)
    assert "loss 0.7500" in p.bar()


def test_a_file_written_anew_is_read_from_its_start(tmp_path):
    f = tmp_path / "stdout.log"
    f.write_text('{"loss": 1.0}\n{"loss": 2.0}\n')
    tail = LogTail(f)
    assert len(tail.lines()) == 2
    f.write_text('{"loss": 3.0}\n')  # torchrun's next attempt: the directory removed and made again
    assert tail.lines() == ['{"loss": 3.0}']


def test_up_commands_keep_each_ranks_output_where_the_run_reads_rank0s(tmp_path):
    lines = commands("t.py", [], {0: "w1_0", 1: "w1_1"}, {"w1_0": 1, "w1_1": 2}, "10.0.0.1", {}, "/v/bin/python",
                     tmp_path)
    assert f"--log-dir {tmp_path / 'node0'} --tee 3 t.py" in lines[0]
    # what UpRun.train globs: <log-dir>/<run id>/attempt_<n>/<local rank>/stdout.log
    out = tmp_path / "node0" / "none" / "attempt_0" / "0" / "stdout.log"
    out.parent.mkdir(parents=True)
    out.write_text("x\n")
    assert list((tmp_path / "node0").glob("*/attempt_*/0/stdout.log")) == [out]

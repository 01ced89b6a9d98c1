"""The residency model's decisions (pure): mapped or streamed, which pages stay resident, how far
ahead to read, and the step time it predicts from the machine's figures."""
import pytest

from host_agent.optim import ConfigError
from host_agent.residency import Machine, PlanError, Workload, decide, least_budget, predict
from host_agent.state import page_chunks_for
from mindp.protocol import K

W = Workload(n_chunks=100 * 2048, page_chunks=2048, window=64)  # 100 pages per copy (of 768 KiB at K = 32)
PAGE = W.page_bytes
DISK = Machine(disk_read=500e6, disk_write=300e6, update=1e9)  # the disk is the bottleneck
CPU = Machine(disk_read=5e9, disk_write=5e9, update=10e6)  # the update is


def test_a_budget_holding_both_copies_maps_them_unless_told_to_stream():
    r = decide(2 * W.copy_bytes, W)
    assert r.mode == "mapped" and r.resident == frozenset(range(100))
    s = decide(2 * W.copy_bytes, W, map_whole=False)
    assert s.mode == "stream" and s.resident == frozenset(range(100))


def test_smallest_budget_streams_everything_one_page_ahead_and_less_is_refused():
    r = decide(4 * PAGE, W)
    assert (r.mode, r.ahead, r.behind, r.resident) == ("stream", 1, 0, frozenset())
    with pytest.raises(PlanError, match="need >= 4") as err:
        decide(4 * PAGE - 1, W)
    assert isinstance(err.value, ConfigError)  # the node's one-line configuration error


def test_more_budget_keeps_more_pages_spread_along_the_arrival_order():
    """The first page to arrive is kept (it hides the step's first read), the others evenly spaced
    after it, so that the streamed pages' reads run beside the writes all through the step."""
    small, big = decide(20 * PAGE, W), decide(60 * PAGE, W)
    assert len(big.resident) - len(small.resident) == 40  # every extra page is kept
    for r in (small, big):
        kept = sorted(r.resident)
        gaps = {b - a for a, b in zip(kept, kept[1:])}
        assert kept[0] == 0 and max(gaps) - min(gaps) <= 1 and max(gaps) == -(-100 // len(kept))
    rev = Workload(W.n_chunks, W.page_chunks, order=list(range(99, -1, -1)))
    assert decide(20 * PAGE, rev).resident == frozenset(99 - p for p in small.resident)


def test_sums_arriving_far_out_of_order_read_further_ahead():
    assert decide(40 * PAGE, W).ahead == 2  # a window of 64 chunks stays within a page or two
    wide = Workload(W.n_chunks, W.page_chunks, window=5 * 2048)
    assert decide(40 * PAGE, wide).ahead == 6
    assert len(decide(40 * PAGE, wide).resident) == len(decide(40 * PAGE, W).resident) - 4


def test_predicted_step_follows_the_bottleneck():
    r = decide(20 * PAGE, W)
    assert len(r.resident) == 7  # 20 - 3 (update, spare) - 2 ahead - 8 behind
    p = predict(r, W, DISK)
    streamed = 100 - len(r.resident)
    assert p.bound == "disk" and p.read_bytes == streamed * PAGE and p.write_bytes == W.copy_bytes
    assert p.disk_time == pytest.approx(streamed * PAGE / 500e6 + W.copy_bytes / 300e6)
    # The first page's update (resident) hides part of the first read (fast CPU: only a little of it).
    per_page = p.compute_time / 100
    assert p.step_time == pytest.approx(p.disk_time + PAGE / 500e6 - per_page + PAGE / 300e6)
    # Behind a write cache the commit's fsync persists the step's writes, after everything else.
    cached = Machine(DISK.disk_read, DISK.disk_write, update=DISK.update, flush=2e-9)
    assert predict(r, W, cached).step_time == pytest.approx(p.step_time + W.copy_bytes * 2e-9)
    assert cached.durable_write == pytest.approx(1 / (1 / 300e6 + 2e-9))
    slow = Machine(DISK.disk_read, DISK.disk_write, update=50e6)
    ps = predict(r, W, slow)  # a slower update hides more of the first read
    assert ps.step_time == pytest.approx(ps.disk_time + PAGE / 500e6 - ps.compute_time / 100 + PAGE / 300e6)
    assert ps.step_time - ps.disk_time < p.step_time - p.disk_time
    c = predict(r, W, CPU)
    assert c.bound == "compute" and c.compute_time == pytest.approx(W.n_chunks * K / 10e6)
    slow_net = Workload(W.n_chunks, W.page_chunks, arrival=W.n_chunks / 60.0)
    assert predict(decide(10 * PAGE, slow_net), slow_net, DISK).bound == "arrival"


def test_commits_without_fsync_leave_the_commit_s_disk_work_out():
    """--sync exit: a mapped state is not written back a step; a streamed one still writes every
    page back (the budget needs its page cache freed) but waits for no fsync."""
    synced = Machine(DISK.disk_read, DISK.disk_write, update=DISK.update, sync=0.01, flush=2e-9)
    mapped = decide(1 << 40, W)
    assert mapped.mode == "mapped"
    p, q = predict(mapped, W, synced), predict(mapped, W, synced, durable=False)
    assert p.write_bytes == W.copy_bytes and p.step_time > p.compute_time
    assert (q.write_bytes, q.disk_time, q.step_time, q.bound) == (0, 0.0, q.compute_time, "compute")
    r = decide(20 * PAGE, W)
    p, q = predict(r, W, synced), predict(r, W, synced, durable=False)
    assert q.write_bytes == p.write_bytes == W.copy_bytes
    assert q.step_time == pytest.approx(p.step_time - 0.01 - W.copy_bytes * 2e-9)


def test_budget_buys_time_only_while_the_disk_is_the_bottleneck():
    times = [predict(decide(b * PAGE, W), W, DISK).step_time for b in (4, 10, 50, 150)]
    assert times == sorted(times, reverse=True) and times[0] > times[-1]
    cpu = [predict(decide(b * PAGE, W), W, CPU).step_time for b in (10, 50, 150)]
    assert max(cpu) - min(cpu) < 0.01 * min(cpu)


def test_without_resident_pages_the_first_read_is_not_hidden():
    r0 = decide(4 * PAGE, W)  # nothing resident
    p = predict(r0, W, DISK)
    assert p.step_time == pytest.approx(p.disk_time + PAGE / 500e6 + PAGE / 300e6)


def test_plan_cli_prints_the_residency_and_predicted_step_time(tmp_path, capsys):
    from host_agent import node

    layout = tmp_path / "layout.json"
    layout.write_text('[["w", [8000000]]]')
    page_chunks = page_chunks_for(1 << 16)  # pages of 768 KiB at any K
    args = ["--state-dir", str(tmp_path / "s"), "--layout", str(layout), "--page-chunks", str(page_chunks), "--plan"]
    assert node.main(args + ["--ram-budget", "20M"]) == 0
    out = capsys.readouterr().out
    assert "plan: stream, 13 of 123 pages resident across steps, 2 read ahead, 8 written behind" in out
    assert "predicted step time: " in out and not (tmp_path / "s").exists()  # nothing created
    assert "184.5 MiB in two copies, pages of 768 KiB" in out
    assert node.main(args + ["--ram-budget", "20M", "--sync", "exit"]) == 0
    assert "8 written behind; commits durable at exit (--sync exit)" in capsys.readouterr().out
    assert node.main(args + ["--ram-budget", "20M", "--optimizer", "sgd"]) == 0
    assert "123.0 MiB in two copies, pages of 512 KiB" in capsys.readouterr().out  # SGD's records have no v
    assert node.main(args + ["--ram-budget", "1M"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "need >= 4" in err


def test_a_shared_machine_stretches_the_cpu_part():
    """With half a core free the update takes twice as long; the I/O threads' CPU counts on top
    once the cores are the limit."""
    r = decide(20 * PAGE, W)
    alone = predict(r, W, CPU)
    half = predict(r, W, Machine(CPU.disk_read, CPU.disk_write, update=CPU.update, cores=0.5))
    assert half.compute_time == pytest.approx(2 * alone.compute_time)
    io = Machine(CPU.disk_read, CPU.disk_write, update=CPU.update, cores=1.0, io_cpu=1e-9)
    moved = predict(r, W, io)
    assert moved.compute_time == pytest.approx(alone.compute_time + 1e-9 * (moved.read_bytes + moved.write_bytes))
    two = Machine(CPU.disk_read, CPU.disk_write, update=CPU.update, cores=2.0, io_cpu=1e-9)
    assert predict(r, W, two).compute_time == pytest.approx(alone.compute_time)  # I/O on the other core


@pytest.mark.parametrize("n_chunks", [1, 3, 64])
def test_least_budget_is_the_least_decide_accepts(n_chunks):
    """Small states are mapped whole below MIN_PAGES pages; large ones need MIN_PAGES to stream."""
    w = Workload(n_chunks, 8, record_bytes=3 * 4 * K)
    least = least_budget(w)
    decide(least, w)
    with pytest.raises(PlanError):
        decide(least - 1, w)

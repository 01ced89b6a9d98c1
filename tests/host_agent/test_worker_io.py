"""WorkerAgent's I/O on a datagram socket pair (the test plays switch and node): frames as the
protocol says, parameters reassembled, numpy and torch gradients alike."""
import socket
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from host_agent import optim, rawsock
from host_agent.optim import ConfigError
from host_agent.resume import ResumeFile
from host_agent.window import RtoConfig
from host_agent.worker import WorkerAgent, WorkerConfig, slot_and_version
from mindp import INSTALL_TORCH, codec, progress
from mindp.protocol import K, Flag, Kind, frame_len

from .helpers import numbered_high, small_model

CFG = WorkerConfig(3, 1, 4, "02:00:00:00:00:01", "10.0.0.1", "02:00:00:00:00:09", "10.0.0.9",
                   rto=RtoConfig(initial=0.05, min=0.01, deadline=60.0))  # hung, not just busy


class Echo(threading.Thread):
    """Answers each GRAD chunk with PARAM = 2 * gradient, dropping the first copy of every 5th chunk."""

    def __init__(self, sock):
        super().__init__(daemon=True)
        self.sock = sock
        self.seen: dict[tuple[int, int], int] = {}
        self.headers = []
        self.stop = False

    def run(self):
        addrs = codec.Addresses("02:00:00:00:00:09", "02:00:00:00:00:01", "10.0.0.9", "10.0.0.1")
        self.sock.settimeout(0.05)
        while not self.stop:
            try:
                frame = self.sock.recv(frame_len(Kind.GRAD))
            except socket.timeout:
                continue
            h, g = codec.decode_one(frame, Kind.GRAD)
            self.headers.append(h)
            key = (int(h["step"]), int(h["chunk"]))
            self.seen[key] = self.seen.get(key, 0) + 1
            if key[1] % 5 == 0 and self.seen[key] == 1:
                continue  # lost: the worker must retransmit
            out = codec.encode(Kind.PARAM, np.array([h]), (g.astype(np.float32) * 2).astype(np.float16)[None, :],
                               addrs)[0].tobytes()
            self.sock.send(out)
            if key[1] % 7 == 0:
                self.sock.send(out)  # a duplicate


def run_steps(grads_per_step, layout):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.setblocking(False)
    echo = Echo(b)
    echo.start()
    agent = WorkerAgent(CFG, layout, a)
    try:
        out = [agent.push(g) for g in grads_per_step]
    finally:
        echo.stop = True
        echo.join()
    return agent, echo, out


def test_push_sends_protocol_frames_and_reassembles_parameters():
    init = small_model()
    lay = optim.layout_of(init)
    rng = np.random.default_rng(0)
    steps = [{k: rng.standard_normal(v.shape).astype(np.float32) for k, v in init.items()} for _ in range(2)]
    steps[1]["b"][3] = np.nan
    agent, echo, out = run_steps(steps, lay)
    for k in init:
        expect = (steps[0][k].astype(np.float16).astype(np.float32) * 2).astype(np.float16)
        assert out[0][k].dtype == np.float16
        assert np.array_equal(out[0][k], expect)
        # Step 1 had a NaN (its answers echo the NONFINITE flag): the whole step changes nothing.
        assert np.array_equal(out[1][k], out[0][k])
    assert agent.stats["nonfinite_steps"] == 1
    n = lay.n_chunks
    # Each chunk of both steps left once unflagged, or flagged when it followed a resend in its slot
    # (Window.after_own_resend: late by this worker's recovery, not a round trip to time).
    firsts: dict = {}
    for h in echo.headers:
        firsts.setdefault((int(h["step"]), int(h["chunk"])), int(h["flags"]) & Flag.RETRANSMIT)
    assert len(firsts) == 2 * n
    assert all(c >= CFG.slots for (_, c), flagged in firsts.items() if flagged)
    for h in echo.headers:
        slot, ver = slot_and_version(int(h["step"]), [int(h["chunk"])], n, CFG.slots)
        assert (h["job"], h["worker"], h["slot"], h["ver"]) == (3, 1, slot[0], ver[0])
        assert h["count"] == lay.chunk_count(int(h["chunk"]))
    nan_chunk = (lay.offsets["b"] + 3) // K
    assert all(bool(h["flags"] & Flag.NONFINITE) == (h["step"] == 1 and h["chunk"] == nan_chunk)
               for h in echo.headers)
    lost = len([c for c in range(n) if c % 5 == 0])
    assert agent.stats["retransmitted"] >= 2 * lost
    assert agent.stats["duplicates"] >= 2 * len([c for c in range(n) if c % 7 == 0 and c % 5])
    assert agent.stats["params_received"] == 2 * n and len(agent.step_times) == 2


def test_frames_the_kernel_dropped_on_a_full_ring_are_counted_at_each_steps_end(monkeypatch):
    """The kernel's count of frames it dropped on the worker's full receive ring (tp_drops, which
    reading resets) is read once a step into stats' ring_drops (the ring itself: the node's test)."""
    class Ring:
        reads = 0

        def dropped(self):
            Ring.reads += 1
            return 3

    monkeypatch.setattr(rawsock, "ring_of", lambda sock: Ring())
    init = small_model()
    steps = [{k: np.ones(v.shape, np.float32) for k, v in init.items()} for _ in range(2)]
    agent, _, _ = run_steps(steps, optim.layout_of(init))
    assert Ring.reads == 2 and agent.stats["ring_drops"] == 6


def test_torch_gradients_equal_numpy_gradients():
    torch = pytest.importorskip("torch", reason=f"torch is not installed: {INSTALL_TORCH}")
    init = small_model()
    lay = optim.layout_of(init)
    rng = np.random.default_rng(1)
    grads = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in init.items()}
    _, _, (from_numpy,) = run_steps([grads], lay)
    _, _, (from_torch,) = run_steps([{k: torch.from_numpy(v).requires_grad_(False) for k, v in grads.items()}], lay)
    for k in init:
        assert np.array_equal(from_numpy[k], from_torch[k])


def test_put_rejects_unknown_wrong_shape_and_repeated_tensors():
    init = small_model()
    lay = optim.layout_of(init)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent = WorkerAgent(CFG, lay, a)
    h = agent.start_step()
    with pytest.raises(KeyError, match="nosuch"):
        h.put("nosuch", np.zeros(3))
    with pytest.raises(ValueError, match="shape"):
        h.put("b", np.zeros(4))
    h.put("b", np.zeros(init["b"].shape))
    with pytest.raises(ValueError, match="twice"):
        h.put("b", np.zeros(init["b"].shape))
    with pytest.raises(ValueError, match="no gradient given"):
        h.wait()
    a.close()
    b.close()


NODE = codec.Addresses("02:00:00:00:00:09", "ff:ff:ff:ff:ff:ff", "10.0.0.9", "255.255.255.255")


def param_frame(step, chunk, n, value, lay, addrs=NODE, flags=0):
    slot, ver = slot_and_version(step, [chunk], n, CFG.slots)
    hdr = codec.header_array(1, job=CFG.job_id, step=step, chunk=chunk, slot=slot, ver=ver,
                             count=lay.chunk_count(chunk), flags=flags)
    return codec.encode(Kind.PARAM, hdr, np.full((1, K), value, np.float16), addrs)[0].tobytes()


def test_parameters_for_unsent_chunks_and_from_a_foreign_source_are_ignored():
    lay = optim.layout_of({"a": np.zeros(2 * K + 6, np.float32), "b": np.zeros(K + 8, np.float32)})  # chunks 0-2 | 2-3
    n = lay.n_chunks
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent = WorkerAgent(replace(CFG, bucket=1, stream=False), lay, a)  # each put sends at once
    h = agent.start_step()
    b.send(param_frame(0, 0, n, 7.0, lay))  # before chunk 0 was sent: taking it would deadlock the job
    h.pump(0.05)
    assert agent.stats["unsent"] == 1 and not h.window.done[0]
    h.put("a", np.ones(2 * K + 6, np.float32))  # chunks 0, 1 go; chunk 2 also holds b's first elements
    sent = set()
    b.setblocking(False)
    while True:
        try:
            sent.add(int(codec.decode_one(b.recv(frame_len(Kind.GRAD)), Kind.GRAD)[0]["chunk"]))
        except BlockingIOError:
            break
    assert sent == {0, 1}
    b.send(param_frame(0, 2, n, 7.0, lay))  # chunk 2 not sent yet
    spoof = codec.Addresses("02:00:00:00:00:66", "ff:ff:ff:ff:ff:ff", "10.0.0.9", "255.255.255.255")
    b.send(param_frame(0, 0, n, 9.0, lay, spoof))  # a worker port forging the node's answer
    b.send(param_frame(0, 1, n, 9.0, lay, codec.Addresses("02:00:00:00:00:09", "ff:ff:ff:ff:ff:ff", "10.0.0.66",
                                                          "255.255.255.255")))  # the node's MAC, not its IP
    h.pump(0.05)
    assert agent.stats["unsent"] == 2 and agent.stats["rejected_source"] == 2
    assert not h.window.done[:3].any()
    h.put("b", np.ones(K + 8, np.float32))
    for c in range(n):
        b.send(param_frame(0, c, n, 3.0, lay))
    params = h.wait()
    assert (params["a"] == 3).all() and (params["b"] == 3).all()
    assert agent.stats["params_received"] == n
    a.close()
    b.close()


def test_steps_reuse_a_receive_buffer_but_return_parameters_of_their_own():
    """The agent receives a step into the buffer of the step before the last (no fresh pages a
    step); what wait() returned for earlier steps stays as it was."""
    lay = optim.layout_of({"a": np.zeros(2 * K + 6, np.float32)})
    n = lay.n_chunks
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent = WorkerAgent(CFG, lay, a)
    got, buffers = [], []
    for step in range(4):
        h = agent.start_step()
        buffers.append(h.params)
        h.put("a", np.ones(2 * K + 6, np.float32))
        drain(b)
        for c in range(n):
            b.send(param_frame(step, c, n, float(step + 1), lay))
        got.append(h.wait())
    assert buffers[2] is buffers[0] and buffers[3] is buffers[1] and buffers[1] is not buffers[0]
    assert [float(g["a"][0]) for g in got] == [1.0, 2.0, 3.0, 4.0]
    assert all((g["a"] == i + 1).all() for i, g in enumerate(got))
    a.close()
    b.close()


def test_puts_send_in_buckets_and_wait_sends_the_rest():
    """put() sends once `bucket` chunks became ready since the last send (as DDP's buckets), or a
    quarter of the step's chunks if fewer; a put that completes fewer leaves them for a later
    put or for wait()."""
    sizes = {"a": 3, "b": 2, "c": 58, "d": 1}  # chunks 0-2 | 3-4 | 5-62 | 63
    lay = optim.layout_of({t: np.zeros(m * K, np.float32) for t, m in sizes.items()})
    n = lay.n_chunks
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    for s in (a, b):  # c's 58 gradients, then 63 answers, queued at once at any K
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    agent = WorkerAgent(replace(CFG, slots=n, bucket=4, stream=False), lay, a)
    assert agent.bucket == 4 and WorkerAgent(replace(CFG, slots=n, bucket=17), lay, a).bucket == n // 4
    h = agent.start_step()

    def sent_now() -> list[int]:
        out = []
        while True:
            try:
                out.append(int(codec.decode_one(b.recv(frame_len(Kind.GRAD)), Kind.GRAD)[0]["chunk"]))
            except BlockingIOError:
                return sorted(out)

    b.setblocking(False)
    h.put("a", np.ones(3 * K, np.float32))
    assert sent_now() == []  # 3 ready < 4
    h.put("b", np.ones(2 * K, np.float32))
    assert sent_now() == [0, 1, 2, 3, 4]
    h.put("c", np.ones(58 * K, np.float32))
    assert sent_now() == list(range(5, 63))
    h.put("d", np.ones(K, np.float32))
    assert sent_now() == []
    for c in range(n - 1):
        b.send(param_frame(0, c, n, 2.0, lay))
    last = []

    def node() -> None:  # answers chunk 63 once wait() has sent it
        b.setblocking(True)
        last.append(int(codec.decode_one(b.recv(frame_len(Kind.GRAD)), Kind.GRAD)[0]["chunk"]))
        b.send(param_frame(0, n - 1, n, 2.0, lay))

    done = threading.Thread(target=node)
    done.start()
    params = h.wait()
    done.join()
    assert last == [n - 1] and (params["d"] == 2).all()
    with pytest.raises(ConfigError, match="bucket"):
        replace(CFG, bucket=0)
    a.close()
    b.close()


def drain(sock) -> None:
    sock.setblocking(False)
    while True:
        try:
            sock.recv(frame_len(Kind.GRAD))
        except BlockingIOError:
            return


def test_a_worker_killed_mid_step_goes_on_from_its_resume_file(tmp_path):
    """The agent is abandoned halfway through step 1 (as if killed; frames in flight are lost) and a
    new one maps the same resume file: it is at step 1, holds step 0's parameters, sends none of the
    chunks already answered, and ends every step with the bits of an uninterrupted run, including a
    non-finite step 2 answered with the parameters from before it."""
    init = small_model()
    lay = optim.layout_of(init)
    n = lay.n_chunks
    rng = np.random.default_rng(2)
    steps = [{k: rng.standard_normal(v.shape).astype(np.float32) for k, v in init.items()} for _ in range(3)]
    steps[2]["w"][1, 1] = np.inf
    _, _, expect = run_steps(steps, lay)
    path = tmp_path / "w1.resume"
    before = lay.flatten(init, dtype=np.float32).astype(np.float16)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    echo = Echo(b)
    echo.start()
    try:
        resume, existed = ResumeFile.open(path, CFG.job_id, CFG.worker_id, lay, before)
        assert not existed and resume.step == 0
        agent = WorkerAgent(CFG, lay, a, resume=resume)
        agent.push(steps[0])
        learnt = agent.rtt.state()  # as of the last completed step
        h = agent.start_step()
        for k, g in steps[1].items():
            h.put(k, g)
        while h.window.n_done < n // 2:
            h.pump(0.01)
        answered = h.window.done.copy()
        assert 0 < answered.sum() < n
        agent.close()  # killed mid-step: its pumping thread ends with it
        del agent, h, resume
        drain(a)
        sent_before = len(echo.headers)
        resume, existed = ResumeFile.open(path, CFG.job_id, CFG.worker_id, lay, before, first_step=7)
        assert existed and resume.step == 1
        assert np.array_equal(resume.answered_in(1)[0], answered)
        again = WorkerAgent(CFG, lay, a, resume=resume)
        assert again.rtt.state() == learnt and again.rtt.srtt is not None
        assert all(np.array_equal(v, expect[0][k]) for k, v in lay.unflatten(again.current[: lay.total]).items())
        out = [again.push(steps[1]), again.push(steps[2])]
        assert again.stats["resumed_chunks"] == answered.sum()
    finally:
        echo.stop = True
        echo.join()
    resent = {int(h["chunk"]) for h in echo.headers[sent_before:] if h["step"] == 1}
    assert resent == set(range(n)) - set(np.flatnonzero(answered).tolist())
    for got, want in zip(out, expect[1:]):
        assert all(np.array_equal(got[k].view(np.uint16), want[k].view(np.uint16)) for k in init)
    done = ResumeFile(path, CFG.job_id, CFG.worker_id, lay)
    assert done.step == 3 and np.array_equal(done.before(3)[: lay.total], lay.flatten(out[1], dtype=np.float16))
    a.close()
    b.close()


def test_a_resume_file_of_another_worker_or_model_is_refused(tmp_path):
    init = small_model()
    lay = optim.layout_of(init)
    before = lay.flatten(init, dtype=np.float32).astype(np.float16)
    ResumeFile.open(tmp_path / "r", 3, 1, lay, before)
    with pytest.raises(ConfigError, match="belongs to job 3 worker 1"):
        ResumeFile.open(tmp_path / "r", 3, 2, lay, before)
    other = optim.layout_of({"x": np.zeros(len(before), np.float32)})
    with pytest.raises(ConfigError, match="another model"):
        ResumeFile.open(tmp_path / "r", 3, 1, other, before)
    (tmp_path / "junk").write_bytes(b"x" * 10)
    with pytest.raises(ConfigError, match="size differs"):
        ResumeFile.open(tmp_path / "junk", 3, 1, lay, before)
    (tmp_path / "old").write_bytes(b"MINDPRS1" + bytes(100))
    with pytest.raises(ConfigError, match="earlier mindp's format: remove it"):
        ResumeFile.open(tmp_path / "old", 3, 1, lay, before)


def test_link_watch_says_down_once_backs_off_and_says_back():
    import errno
    import io

    from host_agent.rawsock import LINK_BACKOFF, LinkWatch

    now = [0.0]
    slept = []
    log = io.StringIO()

    def sleep(s):
        slept.append(s)
        now[0] += s

    link = LinkWatch("mindp-worker 1/2", log, clock=lambda: now[0], sleep=sleep)
    for err in (errno.ENETDOWN, errno.ENXIO, errno.ENODEV, errno.ENETDOWN, errno.ENETDOWN, errno.ENETDOWN,
                errno.ENETDOWN, errno.ENETDOWN):
        link.failed(OSError(err, "down"))
    assert link.down and link.downs == 1
    assert slept == [min(LINK_BACKOFF[0] * 2 ** i, LINK_BACKOFF[1]) for i in range(8)]
    link.alive()
    link.alive()
    assert not link.down
    assert log.getvalue().splitlines() == ["mindp-worker 1/2: link down (down); retrying every 0.05-2.0 s",
                                           f"mindp-worker 1/2: link back after {sum(slept):.1f} s"]
    with pytest.raises(OSError, match="other"):
        link.failed(OSError(errno.EPERM, "other"))
    link.failed(OSError(errno.ENETDOWN, "down"))
    assert link.downs == 2 and slept[-1] == LINK_BACKOFF[0]


@pytest.mark.parametrize("coalesce, coalesce_min, waits", [(0.001, 16, True), (0.001, 10**6, False), (0.0, 16, False)])
def test_a_worker_waits_to_read_a_batch_only_with_many_chunks_unanswered(monkeypatch, coalesce, coalesce_min, waits):
    """Receive coalescing: after a wake-up with >= coalesce_min chunks unanswered the agent sleeps
    `coalesce` before reading; with fewer, or coalesce 0, it reads at once. Parameters are right either way."""
    slept = []
    real_sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: (slept.append(s), real_sleep(s)))
    # 300 chunks, 256 sent at once. Echo loses the first copy of every 5th one, so ~50 of those 256
    # stay unanswered until resent (16 at most a timeout): the wait for them starts with >= 16
    # unanswered, however fast Echo is.
    init = {"w": np.zeros(300 * K, np.float32)}
    lay = optim.layout_of(init)
    grad = {"w": np.random.default_rng(1).standard_normal(300 * K).astype(np.float32)}
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    echo = Echo(b)
    echo.start()
    agent = WorkerAgent(replace(CFG, slots=256, coalesce=coalesce, coalesce_min=coalesce_min), lay, a)
    try:
        out = agent.push(grad)
    finally:
        echo.stop = True
        echo.join()
    assert np.array_equal(out["w"], (grad["w"].astype(np.float16).astype(np.float32) * 2).astype(np.float16))
    assert (len(slept) > 0) == waits
    assert all(s == coalesce for s in slept)


@pytest.mark.parametrize("high", [False, True])
def test_a_streaming_agent_pumps_its_step_while_the_caller_computes(high):
    """By default a thread of the agent's takes the answers as they come and sends each slot's next
    chunk (and resends what was lost): the whole step is sent and answered before wait() is called,
    where put()'s own pump sends only the first window (`slots` chunks). `high`: the agent's socket
    numbered past select()'s 1,024, as in a process holding many files (it stopped with "filedescriptor
    out of range in select()")."""
    init = {"a": np.zeros(12 * K, np.float32)}  # 12 chunks, 4 slots
    lay = optim.layout_of(init)
    n = lay.n_chunks
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    if high:
        a = numbered_high(a)
    echo = Echo(b)  # (loses the first copy of chunks 0, 5 and 10)
    echo.start()
    agent = WorkerAgent(CFG, lay, a)
    try:
        h = agent.start_step()
        h.put("a", np.full(12 * K, 0.5, np.float32))
        progress.wait(lambda: h.window.complete, lambda: h.window.n_done, stall=30, what="the step")
        sends = len(echo.headers)
        params = h.wait()
    finally:
        echo.stop = True
        echo.join()
        agent.close()
    assert (params["a"] == 1.0).all() and sends == len(echo.headers) >= n + 3
    assert agent.stats["retransmitted"] >= 3
    a.close()
    b.close()


@pytest.mark.parametrize("chunks,stream,thread", [(4, True, False), (5, True, True), (12, False, False)])
def test_the_streaming_thread_runs_only_where_a_step_outnumbers_its_window(chunks, stream, thread):
    """A step of at most `slots` (4) chunks leaves whole from put()'s pumps: no thread, whose two
    hand-offs a step cost a small model a sixth of its steps/s; one more chunk, and it streams."""
    lay = optim.layout_of({"a": np.zeros(chunks * K, np.float32)})
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    before = {t for t in threading.enumerate() if t.name == "mindp-pump"}
    agent = WorkerAgent(replace(CFG, stream=stream), lay, a)
    try:
        assert (agent.pumper is not None) == thread
        assert bool({t for t in threading.enumerate() if t.name == "mindp-pump"} - before) == thread
    finally:
        agent.close()
        a.close()
        b.close()


def test_frames_held_back_by_the_reordering_fault_go_with_the_next_pump():
    """--reorder-send (and the tests' reorder) holds a frame until the next send: a step's last
    chunks waited for their resend, which peers timed as a round trip (RTOs of seconds). The next
    pump sends them even when it has nothing else to send."""
    lay = optim.layout_of({"a": np.zeros(4 * K, np.float32)})
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    b.setblocking(False)
    faults = rawsock.Faults(reorder=0.999, seed=1)
    agent = WorkerAgent(replace(CFG, stream=False, rto=RtoConfig(initial=30.0, min=10.0, max=20.0, deadline=60.0)),
                        lay, a, faults)
    try:
        h = agent.start_step()
        h.put("a", np.ones(4 * K, np.float32))  # the window's 4 chunks sent, and held back
        assert len(faults.held) == faults.reordered == 4 and _recv_or_none(b) is None
        h.pump(0.01)  # nothing due: the held frames go
        assert not faults.held and sum(1 for _ in iter(lambda: _recv_or_none(b), None)) == 4
    finally:
        agent.close()
        a.close()
        b.close()


def _recv_or_none(sock):
    try:
        return sock.recv(1 << 16)
    except BlockingIOError:
        return None

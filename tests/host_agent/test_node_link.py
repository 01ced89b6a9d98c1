"""The optimizer node when its link goes away between polls: its stall resend meets ENXIO (the
interface was deleted and made again, as a soak's or a test's namespace teardown does)."""
import collections
import errno
import socket
from types import SimpleNamespace

import pytest

from host_agent import node_socket, optim, state
from host_agent.node_core import NodeCore
from host_agent.optim import OptimizerConfig

from .helpers import BUDGET, small_model


@pytest.fixture
def node(tmp_path, monkeypatch):
    init = small_model()
    lay = optim.layout_of(init)
    state.create(tmp_path, lay, state.init_pieces(lay, init), OptimizerConfig(), page_chunks=32)
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x88B5))
    sock.bind(("lo", 0))
    addr = node_socket.NodeAddress("02:00:00:00:00:09", "10.0.0.9")
    monkeypatch.setattr(node_socket.time, "sleep", lambda s: None)
    monkeypatch.setattr(node_socket.rawsock, "enable_auxdata", lambda s: False)  # no receive here: no ring
    yield node_socket.OptimizerNode(NodeCore(state.Store(tmp_path, BUDGET), 1, 2, 8), sock, addr, stall_resend=0.01)
    sock.close()


def test_a_link_gone_at_a_stall_resend_is_one_line_and_a_wait_not_a_traceback(node, monkeypatch, capsys):
    def gone(*_a, **_k):
        raise OSError(errno.ENXIO, "No such device or address")

    monkeypatch.setattr(node, "_send", gone)
    node.check_stall(node._last_sum + 100)
    assert node.stats["link_down"] == 1
    assert capsys.readouterr().err.splitlines() == [
        "mindp-optimizer: link down (No such device or address); retrying every 0.05-2.0 s"]

    def refused(*_a, **_k):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(node, "_send", refused)
    with pytest.raises(OSError, match="not permitted"):  # not a link's: not hidden
        node.check_stall(node._last_sum + 1000)


def state_and_sockets(tmp_path, proto: int) -> tuple[socket.socket, socket.socket]:
    """A small model's node state in tmp_path, and on lo a non-blocking socket receiving only
    ethertype `proto` (a test's: only its frames reach it; non-blocking as rawsock.prepare leaves
    the node's) and one to send with."""
    init = small_model()
    lay = optim.layout_of(init)
    state.create(tmp_path, lay, state.init_pieces(lay, init), OptimizerConfig(), page_chunks=32)
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(proto))
    sock.bind(("lo", 0))
    sock.setblocking(False)
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    tx.bind(("lo", 0))
    return sock, tx


def test_frames_the_kernel_dropped_on_a_full_ring_are_counted_at_exit(tmp_path):
    """The node's receive ring overflows while it does not read (it fell behind): the kernel's count
    of the frames it dropped (tp_drops) is in the node's stats when it stops serving."""
    proto = 0x88B6
    sock, tx = state_and_sockets(tmp_path, proto)
    addr = node_socket.NodeAddress("02:00:00:00:00:09", "10.0.0.9")
    try:
        node = node_socket.OptimizerNode(NodeCore(state.Store(tmp_path, BUDGET), 1, 2, 8), sock, addr, stall_resend=0)
        ring = node_socket.rawsock.ring_of(sock)
        assert ring is not None
        frame = b"\xff" * 6 + b"\x02" * 6 + proto.to_bytes(2, "big") + bytes(46)
        for _ in range(2 * ring.frames):
            tx.send(frame)
        node.serve(idle_timeout=0)
        assert 0 < node.stats["ring_drops"] <= ring.frames  # (lo's backlog may drop some before the ring)
    finally:
        tx.close()
        sock.close()


def test_received_rows_are_checked_as_the_numpy_path_checks_them(tmp_path, monkeypatch):
    """The node's compiled pass over received rows keeps and counts exactly what _rows_from_switch
    and codec.decode do: a row for every reason to drop one, with and without known sources."""
    import numpy as np

    from mindp import codec
    from mindp.protocol import K, Kind

    init = small_model()
    lay = optim.layout_of(init)
    state.create(tmp_path, lay, state.init_pieces(lay, init), OptimizerConfig(), page_chunks=32)
    monkeypatch.setattr(node_socket.rawsock, "enable_auxdata", lambda s: False)
    me, w, other = ("02:00:00:00:00:09", "10.0.0.9"), ("02:00:00:00:00:01", "10.0.0.1"), ("02:00:00:00:00:02", "10.0.0.2")
    n = 14
    hdr = codec.header_array(n, kind=Kind.SUM, job=1, step=0, chunk=np.arange(n), nworkers=2)
    sums = np.random.default_rng(5).integers(-(1 << 40), 1 << 40, size=(n, K))
    rows = codec.encode(Kind.SUM, hdr, sums, codec.Addresses(w[0], me[0], w[1], me[1]))
    rows[1] = codec.encode(Kind.SUM, hdr[1:2], sums[1:2], codec.Addresses(other[0], me[0], other[1], me[1]))[0]
    rows[2, 6] ^= 1  # another source MAC
    rows[3, 29] ^= 1  # another source IP
    rows[4, 0] ^= 1  # not our MAC
    rows[5, 33] ^= 1  # not our IP
    for i, (at, flip) in enumerate([(12, 1), (14, 1), (23, 1), (37, 1), (42, 1), (43, 1)]):  # ethertype .. kind
        rows[6 + i, at] ^= flip
    store = state.Store(tmp_path, BUDGET)
    for sources in (None, [w], [w, other]):
        node = node_socket.OptimizerNode(NodeCore(store, 1, 2, 8), None, node_socket.NodeAddress(*me), stall_resend=0,
                                         sources=sources)
        got = node._decode_rows(rows.copy())
        compiled = dict(node.stats)
        node.stats.clear()
        mine = node._rows_from_switch(rows.copy())
        want = codec.decode(rows[mine], Kind.SUM)
        assert dict(node.stats) == compiled and got.rejects == want.rejects
        assert got.headers.tobytes() == want.headers.tobytes() and np.array_equal(got.elements, want.elements)
        assert len(want.headers) == {None: 6, 1: 3, 2: 4}[sources and len(sources)]  # rows 0-3 from any source, 12, 13
    store.close()


def test_the_node_sends_consecutive_full_chunks_several_to_a_frame(tmp_path, monkeypatch):
    """Answers for consecutive full chunks leave in PARAM frames of up to PARAM_CHUNKS_MAX chunks, and
    split back they are the answers NodeCore gives chunk by chunk, bit for bit; a tensor's last chunk
    (count < K) goes alone."""
    import numpy as np

    from host_agent import reference
    from mindp import codec
    from mindp.protocol import PARAM_CHUNKS_MAX, K, Kind, param_frame_len

    from .helpers import initial_fp16, step_sums, sum_headers
    from .node_steps import JOB, N, S, open_core

    init = small_model()
    lay = optim.layout_of(init)
    gf = reference.synthetic_grads(0)
    sums, _ = step_sums(lay, gf, N, 0, initial_fp16(init))
    chunks = np.arange(lay.n_chunks)
    hdr = sum_headers(JOB, 0, chunks, lay, S, N).astype(codec.HEADER_DTYPE)
    want_hdr, want_vals = open_core(tmp_path / "a", init, OptimizerConfig()).handle(hdr, sums)

    sent = []
    monkeypatch.setattr(node_socket.rawsock, "send_rows", lambda sock, frames, rows, faults, lens: (
        sent.extend(frames[r, : lens[r]].tobytes() for r in rows), (len(rows), 0))[1])
    monkeypatch.setattr(node_socket.rawsock, "enable_auxdata", lambda s: False)
    node = node_socket.OptimizerNode(open_core(tmp_path / "b", init, OptimizerConfig()), None,
                                     node_socket.NodeAddress("02:00:00:00:00:09", "10.0.0.9"), stall_resend=0)
    node._handle_decoded(codec.Decoded(hdr, sums))
    full = [int(c) for c in chunks if lay.chunk_count(int(c)) == K]
    assert len(sent) < len(chunks) and max(len(f) for f in sent) == param_frame_len(PARAM_CHUNKS_MAX)
    assert sum(len(f) == codec.frame_len(Kind.PARAM) for f in sent) >= len(chunks) - len(full)
    assert node.stats["params_sent"] == len(chunks)
    got = codec.decode(sent, Kind.PARAM)
    assert not got.rejects
    assert list(got.headers["chunk"]) == sorted(got.headers["chunk"])  # sent in chunk order
    order = np.argsort(got.headers["chunk"])
    assert list(got.headers["chunk"][order]) == list(want_hdr["chunk"])
    assert list(got.headers["count"][order]) == list(want_hdr["count"])
    assert got.elements[order].view(np.uint16).tobytes() == np.asarray(want_vals, np.float16).view(np.uint16).tobytes()


@pytest.mark.skipif(node_socket.fused.NUMPY_ONLY, reason="the compiled packer needs numba")
def test_the_node_s_compiled_param_frames_are_codec_param_frames_byte_for_byte(monkeypatch):
    """Answers of every shape (runs longer than a frame, gaps, a short chunk, steps, jobs and flags
    changing mid-run, a chunk number wrapping) leave in exactly the frames codec.param_frames builds,
    a smaller batch after a larger one too (the frames' buffer is reused)."""
    import numpy as np

    from mindp import codec
    from mindp.protocol import K, Kind

    rng = np.random.default_rng(11)
    sent = []
    monkeypatch.setattr(node_socket.rawsock, "send_rows", lambda sock, frames, rows, faults, lens: (
        sent.append([frames[r, : lens[r]].tobytes() for r in rows]), (len(rows), 0))[1])
    monkeypatch.setattr(node_socket.rawsock, "enable_auxdata", lambda s: False)
    core = SimpleNamespace(stats=collections.Counter())  # _send needs no state
    node = node_socket.OptimizerNode(core, None, node_socket.NodeAddress("02:00:00:00:00:09", "10.0.0.9"),
                                     stall_resend=0)
    kept = None
    for n in (1, 2, 5, 9, 40, 300, 3, 17):  # batches growing the frames' buffer, then smaller ones in it
        if n == 3:
            kept = node._tx
        chunk = np.cumsum(rng.choice([1, 1, 1, 1, 2], n)).astype(np.int64) + 0xFFFFFFF0 - n // 2
        hdr = codec.header_array(n, kind=Kind.PARAM, job=np.where(rng.random(n) < 0.05, 2, 1),
                                 step=np.where(rng.random(n) < 0.05, 8, 7), chunk=chunk % (1 << 32),
                                 flags=np.where(rng.random(n) < 0.1, 2, 0),
                                 count=np.where(rng.random(n) < 0.05, K - 3, K), slot=rng.integers(0, 64, n))
        vals = rng.integers(0, 1 << 16, (n, K), dtype=np.uint64).astype(np.uint16).view(np.float16)
        want = codec.param_frames(hdr, vals, node.addrs)
        node._send(hdr, vals)
        assert sent.pop() == [want.frames[i, : want.lens[i]].tobytes() for i in range(len(want.lens))]
    assert node.stats["params_sent"] == 377 and node._tx is kept  # reused, not made again


@pytest.mark.parametrize("rx_usecs", [500, 0])
def test_a_wake_up_mid_step_waits_rx_usecs_before_reading_and_the_step_s_last_chunks_do_not(
        tmp_path, monkeypatch, rx_usecs):
    """Receive coalescing: woken while COALESCE_MIN or more chunks of the step are to come, the node
    sleeps --rx-usecs before it reads (one read then takes the burst); near the step's end, or with
    0, it reads at once. Each read is counted in `receives`."""
    proto = 0x88B7
    sock, tx = state_and_sockets(tmp_path, proto)
    slept = []
    monkeypatch.setattr(node_socket.time, "sleep", slept.append)
    monkeypatch.setattr(node_socket, "COALESCE_MIN", 3)
    try:
        store = state.Store(tmp_path, BUDGET)
        assert store.n_chunks >= 4
        node = node_socket.OptimizerNode(NodeCore(store, 1, 2, 8), sock,
                                         node_socket.NodeAddress("02:00:00:00:00:09", "10.0.0.9"),
                                         stall_resend=0, rx_usecs=rx_usecs)
        frame = b"\xff" * 6 + b"\x02" * 6 + proto.to_bytes(2, "big") + bytes(46)
        tx.send(frame)
        node.poll(5.0)
        assert slept == ([rx_usecs * 1e-6] if rx_usecs else [])
        store.n_applied = store.n_chunks - 2  # the step's last two chunks are still to come
        tx.send(frame)
        node.poll(5.0)
        assert len(slept) == (1 if rx_usecs else 0)
        assert node.stats["receives"] == 2
    finally:
        tx.close()
        sock.close()


@pytest.mark.net
def test_a_link_down_whose_error_a_send_took_is_told_by_the_node_s_next_poll(monkeypatch, capsys):
    """The node's parameters go out as its link goes down, and a send takes the socket's pending
    ENETDOWN (no receive will report it): the poll after the failed sends looks at the interface
    and says so in one line; once the link is up again it sends and polls without a word."""
    import numpy as np

    from host_agent import rawsock
    from mindp import codec
    from mindp.harness import testbed
    from mindp.protocol import K, Kind

    monkeypatch.setattr(node_socket.time, "sleep", lambda s: None)
    a, b = testbed.tagged("mdp-nl0"), testbed.tagged("mdp-nl1")
    with testbed.veth_pair(a, b):
        sock = rawsock.open_raw(b)
        try:
            core = SimpleNamespace(stats=collections.Counter())  # _send needs no state
            node = node_socket.OptimizerNode(core, sock, node_socket.NodeAddress("02:00:00:00:00:09", "10.0.0.9"),
                                             stall_resend=0)
            hdr = codec.header_array(3, kind=Kind.PARAM, job=1, step=0, chunk=np.arange(3), count=K)
            vals = np.zeros((3, K), np.float16)
            testbed.sh("ip", "link", "set", b, "down")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ENETDOWN  # as the racing send took it
            node._send(hdr, vals)
            assert node.stats["send_errors"] > 0 and node.poll(0) == 0
            assert node.stats["link_down"] == 1
            assert capsys.readouterr().err.splitlines() == [
                "mindp-optimizer: link down (Network is down); retrying every 0.05-2.0 s"]
            testbed.sh("ip", "link", "set", b, "up")
            errors = node.stats["send_errors"]
            node._send(hdr, vals)
            assert node.stats["send_errors"] == errors and node.poll(0) == 0
            assert node.stats["link_down"] == 1 and capsys.readouterr().err == ""
        finally:
            sock.close()

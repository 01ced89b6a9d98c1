"""Batched send (sendmmsg) and receive (recvmmsg into buffer rows) against the per-frame loops, on a
datagram socket pair: the same frames, in order, with wrong-sized frames counted and left out; and
the node's raw socket on a veth holding a whole receive batch."""
import socket

import numpy as np
import pytest

from host_agent import rawsock

needs_mmsg = pytest.mark.skipif(not rawsock.MMSG, reason="no sendmmsg/recvmmsg on this platform")
WIDTH = 96


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    for s in (a, b):
        s.setblocking(False)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    yield a, b
    a.close()
    b.close()


def frames(n):
    return np.random.default_rng(n).integers(0, 256, size=(n, WIDTH), dtype=np.uint8)


def drain(s):
    out = []
    while True:
        try:
            out.append(s.recv(4096))
        except BlockingIOError:
            return out


@needs_mmsg
def test_sendmmsg_sends_exactly_the_rows_asked_in_their_order(pair):
    a, b = pair
    f = frames(2500)  # more than one sendmmsg call (1024 messages each)
    rows = [7, 3, 3, 2499] + list(range(100, 2300))
    assert rawsock.send_rows(a, f, rows) == (len(rows), 0)
    assert drain(b) == [f[r].tobytes() for r in rows]
    assert rawsock.send_rows(a, f, []) == (0, 0)


@needs_mmsg
def test_recvmmsg_fills_rows_in_order_and_drops_other_lengths(pair):
    a, b = pair
    f = frames(1500)
    sent = []
    for i, row in enumerate(f):
        a.send(row.tobytes())
        sent.append(row.tobytes())
        if i % 300 == 5:
            a.send(row.tobytes()[:40])  # short
            a.send(row.tobytes() + b"xx")  # long: truncated into its row, must not count
    buf = np.zeros((1024, WIDTH), np.uint8)
    recv = rawsock.RowReceiver(buf, auxdata=False)
    got = []
    other = 0
    while True:
        n, tagged, bad = rawsock.recv_rows_untagged(b, buf, recv)
        assert tagged == 0
        other += bad
        if not n and not bad:
            break
        got += [bytes(r) for r in buf[:n]]
    assert got == sent and other == 10


@needs_mmsg
def test_batched_and_plain_paths_agree(pair, monkeypatch):
    a, b = pair
    f = frames(600)
    for mmsg in (rawsock._MMSG, None):
        monkeypatch.setattr(rawsock, "_MMSG", mmsg)
        assert rawsock.send_rows(a, f, range(0, 600, 2)) == (300, 0)
        buf = np.zeros((1024, WIDTH), np.uint8)
        n, tagged, other = rawsock.recv_rows_untagged(b, buf, rawsock.RowReceiver(buf, auxdata=False))
        assert (n, tagged, other) == (300, 0, 0)
        assert np.array_equal(buf[:n], f[::2])


@needs_mmsg
def test_with_lens_frames_up_to_the_width_are_taken_with_their_lengths(pair, monkeypatch):
    """recvmmsg and the per-frame loop alike: frames of any length up to the rows' width in order,
    their lengths recorded; a longer one (cut to its row) counted and left out."""
    a, b = pair
    f = frames(300)
    sizes = [WIDTH - (i % 5) * 10 for i in range(300)]
    for mmsg in (rawsock._MMSG, None):
        monkeypatch.setattr(rawsock, "_MMSG", mmsg)
        for row, size in zip(f, sizes):
            a.send(row.tobytes()[:size])
            if size == WIDTH - 40:
                a.send(row.tobytes() + b"xx")
        buf = np.zeros((1024, WIDTH), np.uint8)
        lens = np.zeros(1024, np.int64)
        n, tagged, other = rawsock.recv_rows_untagged(b, buf, rawsock.RowReceiver(buf, auxdata=False), lens)
        assert (n, tagged, other) == (300, 0, 60)
        assert lens[:n].tolist() == sizes
        assert [bytes(buf[i, : lens[i]]) for i in range(n)] == [r.tobytes()[:s] for r, s in zip(f, sizes)]

@needs_mmsg
@pytest.mark.net
def test_the_node_socket_holds_a_whole_receive_batch_of_sums():
    """A burst of node_socket.RECV_ROWS SUM frames sent before the node reads any is all held by its
    socket (its receive ring, or its buffer without one: none dropped for space) and taken in one
    receive into the node's buffer."""
    from host_agent import node_socket
    from mindp import codec
    from mindp.harness import testbed
    from mindp.protocol import Kind

    a, b = "mdp-rcv0", "mdp-rcv1"
    with testbed.veth_pair(a, b):
        socks = []
        try:
            tx, rx = socks = [rawsock.open_raw(a), rawsock.open_raw(b)]
            auxdata = rawsock.enable_auxdata(rx)  # as the node does, before traffic: its ring, if any
            width = codec.frame_len(Kind.SUM)
            f = np.random.default_rng(1).integers(0, 256, size=(node_socket.RECV_ROWS, width), dtype=np.uint8)
            f[:, 12:14] = (0x88, 0xB5)
            for row in f:  # one at a time: a veth's peer takes each on the sender's return (no backlog drop)
                tx.send(row.tobytes())
            buf = np.zeros((node_socket.RECV_ROWS, width), np.uint8)
            rows, tagged, other = rawsock.recv_rows_untagged(rx, buf, rawsock.RowReceiver(buf, auxdata))
            assert (rows, tagged, other) == (node_socket.RECV_ROWS, 0, 0)
            assert np.array_equal(buf, f)
        finally:
            for s in socks:
                s.close()


@needs_mmsg
def test_rows_sent_with_lens_go_as_their_first_lens_bytes_on_every_send_path(pair, monkeypatch):
    """The node's PARAM frames of 1-4 chunks share one array: each row goes as its own length, in
    order, by sendmmsg, by send and through fault injection alike."""
    a, b = pair
    f = frames(40)
    lens = np.random.default_rng(1).integers(20, WIDTH + 1, size=40)
    rows = [5, 0, 39, 12]
    want = [f[r, : lens[r]].tobytes() for r in rows]
    assert rawsock.send_rows(a, f, rows, None, lens) == (4, 0)
    assert drain(b) == want
    monkeypatch.setattr(rawsock, "_MMSG", None)
    assert rawsock.send_rows(a, f, rows, None, lens) == (4, 0)
    assert drain(b) == want
    assert rawsock.send_rows(a, f, rows, rawsock.Faults(), lens) == (4, 0)
    assert drain(b) == want


@needs_mmsg
def test_sendmmsg_with_the_reused_vector_sends_each_call_s_own_rows_and_lengths(pair):
    """The message vector is kept from call to call: ranges (the node's rows) and lists (the
    workers'), from 0 or not, with lengths then without (every row its full width again), more rows
    than the vector held, another buffer's width: each call sends exactly its own rows."""
    a, b = pair
    f = frames(3000)
    lens = np.random.default_rng(2).integers(20, WIDTH + 1, size=3000)
    calls = [(range(5), None), (range(10, 20), lens), (range(0, 10), None), (range(2, 3000, 3), lens),
             ([9, 1, 1], None), (range(0, 2900), None), (np.array([4, 2]), lens), (range(7, 7), lens)]
    for rows, ls in calls:
        assert rawsock.send_rows(a, f, rows, None, ls) == (len(rows), 0)
        assert drain(b) == [f[r, : (WIDTH if ls is None else ls[r])].tobytes() for r in rows], rows
    g = np.arange(2 * 40, dtype=np.uint8).reshape(2, 40)
    assert rawsock.send_rows(a, g, range(2)) == (2, 0)
    assert drain(b) == [g[0].tobytes(), g[1].tobytes()]
    with pytest.raises(IndexError):  # a row past the buffer is never sent from beyond it
        rawsock.send_rows(a, f, range(2999, 3001))
    with pytest.raises(IndexError):
        rawsock.send_rows(a, f, [3000])


@needs_mmsg
def test_a_new_buffer_at_a_freed_one_s_place_is_sent_from_its_own_memory(pair):
    """Row addresses are kept per buffer: buffers of one shape made and freed in turn (the allocator
    hands out the same memory and ids again) and a view of a live one each send their own bytes."""
    a, b = pair
    for i in range(20):
        f = np.full((8, WIDTH), i, np.uint8)
        assert rawsock.send_rows(a, f, range(8)) == (8, 0)
        assert drain(b) == [bytes([i]) * WIDTH] * 8
        del f
    f = frames(8)
    assert rawsock.send_rows(a, f[3:], range(2)) == (2, 0)
    assert drain(b) == [f[3].tobytes(), f[4].tobytes()]


@needs_mmsg
def test_sendmmsg_skips_and_counts_refused_frames_retries_eintr_and_raises_other_errors(pair, monkeypatch):
    """The kernel's answers scripted: EINTR is retried (nothing lost), a refused frame (ENOBUFS) is
    counted and skipped, the rest of the batch still goes, in order; another errno raises."""
    import ctypes
    import errno

    from mindp import mmsg

    f = frames(10)
    answers = [-errno.EINTR, 3, -errno.ENOBUFS, 2, -errno.EAGAIN, 100]
    sent = []

    def sendmmsg(fd, base, n, flags):
        r = answers.pop(0)
        if r < 0:
            ctypes.set_errno(-r)
            return -1
        r = min(r, n)
        for m in np.frombuffer(ctypes.string_at(base, r * mmsg.MMSGHDR.itemsize), mmsg.MMSGHDR):
            iov = np.frombuffer(ctypes.string_at(int(m["iov"]), mmsg.IOVEC.itemsize), mmsg.IOVEC)[0]
            sent.append(ctypes.string_at(int(iov["base"]), int(iov["len"])))
        return r

    monkeypatch.setattr(mmsg, "CALLS", (sendmmsg, mmsg.CALLS[1]))
    rows = [9, 8, 7, 6, 5, 4, 3, 2, 1]
    assert rawsock.send_rows(pair[0], f, rows) == (9, 2)
    assert sent == [f[r].tobytes() for r in (9, 8, 7, 5, 4, 2, 1)]  # 6 and 3 refused
    answers[:] = [-errno.EBADF]
    with pytest.raises(OSError) as err:
        rawsock.send_rows(pair[0], f, range(3))
    assert err.value.errno == errno.EBADF

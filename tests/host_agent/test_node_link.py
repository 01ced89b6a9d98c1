"""The optimizer node when its link goes away between polls: its stall resend meets ENXIO (the
interface was deleted and made again, as a soak's or a test's namespace teardown does)."""
import errno
import socket

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


def test_frames_the_kernel_dropped_on_a_full_ring_are_counted_at_exit(tmp_path):
    """The node's receive ring overflows while it does not read (it fell behind): the kernel's count
    of the frames it dropped (tp_drops) is in the node's stats when it stops serving."""
    init = small_model()
    lay = optim.layout_of(init)
    state.create(tmp_path, lay, state.init_pieces(lay, init), OptimizerConfig(), page_chunks=32)
    proto = 0x88B6  # a test ethertype: only our frames reach this socket
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(proto))
    sock.bind(("lo", 0))
    sock.setblocking(False)  # as rawsock.prepare leaves the node's
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    tx.bind(("lo", 0))
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

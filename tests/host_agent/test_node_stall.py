"""The optimizer node's stall resend when the switch comes back late, as a scripted scenario (no
network, the clock given): the only way out for a worker that missed a chunk's parameters while
its peer got them."""
import socket

import numpy as np
import pytest

from host_agent import node_socket, optim, rawsock, reference, state
from host_agent.node_core import NodeCore
from host_agent.optim import OptimizerConfig

from .helpers import BUDGET, initial_fp16, numbered_high, small_model, step_sums, sum_headers

N, S, JOB = 2, 64, 1  # 64 slots, as make soak gives a job: each of the 44 chunks its own
PERIOD = 0.5  # --stall-resend, as make soak gives it


@pytest.fixture
def node(tmp_path, monkeypatch):
    init = small_model()
    lay = optim.layout_of(init)
    state.create(tmp_path, lay, state.init_pieces(lay, init), OptimizerConfig(), page_chunks=32)
    monkeypatch.setattr(node_socket.rawsock, "enable_auxdata", lambda s: False)  # no receive here: no ring
    addr = node_socket.NodeAddress("02:00:00:00:00:09", "10.0.0.9")
    node = node_socket.OptimizerNode(NodeCore(state.Store(tmp_path, BUDGET), JOB, N, S), sock=None, addr=addr,
                                     stall_resend=PERIOD)
    sums, nf = step_sums(lay, reference.synthetic_grads(3), N, 0, initial_fp16(init))
    chunks = np.arange(lay.n_chunks)
    node.core.handle(sum_headers(JOB, 0, chunks, lay, S, N, nf), sums)  # step 0 applied, its answers sent
    node.core.commit_if_complete()
    node._last_sum = 0.0  # the step's last sum came at t = 0
    yield node, lay
    node.core.store.close()


def resends(node, monkeypatch, until: float, tick: float = PERIOD / 4) -> list[tuple[float, set]]:
    """check_stall as the node's loop calls it, from t = 0 to `until`: (time, {(step, chunk)}) per
    resend."""
    out = []

    def record(hdr, vals, held=True):
        out.append((now, {(int(h["step"]), int(h["chunk"])) for h in hdr}))
        return len(hdr)

    monkeypatch.setattr(node, "_send", record)
    for now in np.arange(0.0, until, tick):
        node.check_stall(float(now))
    return out


def test_a_switch_back_after_the_backoff_still_gets_the_missed_parameters(node, monkeypatch):
    """Worker 0 got every parameter chunk of step 0 and went on (its step 1 gradients leave);
    worker 1's PARAM of chunk 3 was lost, and then the switch was killed at t = 0 (its cells gone).
    The controller restores it at t = 100 periods (a restart and a 10.7 MB pipeline push on a busy
    machine): every resend before that is lost in the dead switch. From then on worker 1's
    retransmissions of chunk 3 make a new use of its cell that never completes (worker 0 will
    not send chunk 3 of step 0 again), and worker 0's step 1 gradients wait for worker 1's: no sum
    reaches the node again. The node must still resend chunk 3 after the switch is back, soon
    enough for worker 1's step deadline; a series that stopped after 63 periods left it waiting
    until it failed."""
    node, lay = node
    back = 100 * PERIOD
    sent = resends(node, monkeypatch, back + 2 * node.STALL_GAP_MAX * PERIOD)
    after = [(t, what) for t, what in sent if t >= back]
    assert after, f"no resend after the switch came back at {back} s (resends at {[t for t, _ in sent]})"
    first, what = after[0]
    assert (0, 3) in what and what == {(0, c) for c in range(lay.n_chunks)}  # every slot's last chunk: step 0's
    assert first - back <= node.STALL_GAP_MAX * PERIOD
    # backed off, not a flood: gaps of 1, 2, 4, then 8 periods
    gaps = np.diff([0.0] + [t for t, _ in sent]) / PERIOD
    assert list(np.round(gaps[:4])) == [1, 2, 4, 8] and gaps.min() >= 1 - 1e-9 and gaps[3:].max() <= 8.25


def test_a_sum_restarts_the_backoff(node, monkeypatch):
    node, _ = node
    assert [t for t, _ in resends(node, monkeypatch, 4 * PERIOD)] == [PERIOD, 3 * PERIOD]
    node._last_sum, node._stall_resends = 10 * PERIOD, 0  # what a received sum does (OptimizerNode._handle)
    assert [t for t, _ in resends(node, monkeypatch, 12 * PERIOD) if t > 10 * PERIOD] == [11 * PERIOD]


@pytest.mark.parametrize("high", [False, True])
def test_answers_held_back_by_the_reordering_fault_go_once_the_node_is_idle(tmp_path, monkeypatch, high):
    """--reorder-send holds a frame until the next send: with nothing more to answer (a step's last
    chunks, a window of few slots) that was the stall resend's second or more, which the workers
    timed as a round trip (RTOs of seconds in make stress). The node's idle loop sends them.
    `high`: the node's socket numbered past select()'s 1,024 (a process holding many files)."""
    init = small_model()
    lay = optim.layout_of(init)
    state.create(tmp_path, lay, state.init_pieces(lay, init), OptimizerConfig(), page_chunks=32)
    monkeypatch.setattr(node_socket.rawsock, "enable_auxdata", lambda s: False)
    ours, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    if high:
        ours = numbered_high(ours)
    peer.setblocking(False)
    faults = rawsock.Faults(reorder=0.999, seed=1)
    node = node_socket.OptimizerNode(NodeCore(state.Store(tmp_path, BUDGET), JOB, N, S), ours,
                                     node_socket.NodeAddress("02:00:00:00:00:09", "10.0.0.9"), faults,
                                     stall_resend=1e6)
    try:
        sums, nf = step_sums(lay, reference.synthetic_grads(3), N, 0, initial_fp16(init))
        hdr, vals = node.core.handle(sum_headers(JOB, 0, np.arange(2), lay, S, N, nf), sums[:2])
        node._send(hdr, vals)
        assert faults.reordered and faults.held
        with pytest.raises(BlockingIOError):
            peer.recv(1 << 16)  # held: nothing left yet
        node.serve(idle_timeout=0.2)
        assert not faults.held
        assert len(peer.recv(1 << 16)) > 0  # what the fault held went out while the node was idle
    finally:
        node.core.store.close()
        ours.close()
        peer.close()

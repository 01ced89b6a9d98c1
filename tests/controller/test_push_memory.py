"""A pipeline push gives the heap's freed pages back (mindp.heap.release_free): after
a first large buffer, glibc keeps later ones' memory resident (make soak's controller grew 18.6 %
with a switch restore's push)."""
import ctypes
import pathlib
import subprocess
import sys
import types
from concurrent import futures

import grpc
import pytest
from p4runtime_sh.context import Context

from controller import p4runtime
from controller.p4runtime import SwitchConnection, SwitchError
from mindp import heap
from p4src import artifacts

libc = ctypes.CDLL(None)
REPO = pathlib.Path(__file__).resolve().parents[2]
glibc = pytest.mark.skipif(not hasattr(libc, "mallinfo2"), reason="glibc's allocator only")


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def free_at_top() -> int:
    """Bytes free at the top of the main heap, which a trim would give back (mallinfo2's keepcost)."""
    libc.mallinfo2.restype = MallInfo2
    return libc.mallinfo2().keepcost


def churn(mb: int, count: int) -> None:
    """Blocks of `mb` MB allocated, written and freed, as a push's buffers are."""
    libc.malloc.restype = ctypes.c_void_p
    blocks = [libc.malloc(mb << 20) for _ in range(count)]
    for b in blocks:
        ctypes.memset(b, 1, mb << 20)
    for b in reversed(blocks):
        libc.free(ctypes.c_void_p(b))


def given_back() -> tuple[int, int]:
    """(bytes free at the heap's top after the churn, after release_free)."""
    churn(12, 1)  # mmapped and unmapped: the mmap threshold rises to 12 MB, the trim threshold to 24
    churn(10, 2)  # now from the heap: 20 MB free at its top, below the trim threshold, stay resident
    before = free_at_top()
    heap.release_free()
    return before, free_at_top()


@glibc
def test_freed_buffers_above_a_raised_mmap_threshold_are_given_back():
    # In a fresh process: a test worker's heap, its thresholds raised by earlier tests, may already
    # hold the churn's blocks elsewhere (the suite once saw 3 KB free at the top here).
    code = "from tests.controller.test_push_memory import given_back; print(*given_back())"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    before, after = map(int, out.split())
    assert before >= 16 << 20
    assert after < 1 << 20


class Stub:
    """The push's call as push_pipeline makes it: SetForwardingPipelineConfig.future(...)."""

    def __init__(self, refuse: bool):
        self.refuse = refuse
        self.pushed = []
        self.SetForwardingPipelineConfig = types.SimpleNamespace(future=self.push)

    def push(self, req, timeout) -> futures.Future:
        self.pushed.append(req.ByteSize())
        answer = futures.Future()
        if self.refuse:
            answer.set_exception(FakeRpcError())
        else:
            answer.set_result(None)
        return answer


class FakeRpcError(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.INVALID_ARGUMENT

    def details(self):
        return "refused"


@pytest.mark.parametrize("refuse", [False, True])
def test_a_push_gives_back_the_heap_also_when_refused(monkeypatch, refuse):
    conn = object.__new__(SwitchConnection)  # no switch: the stub stands for gRPC
    conn.grpc_addr, conn.device_id, conn.election_id, conn.ctx = "127.0.0.1:1", 0, (0, 1), Context()
    conn.client = type("Client", (), {"stub": Stub(refuse)})()
    released = []
    monkeypatch.setattr(heap, "release_free", lambda: released.append(len(conn.client.stub.pushed)))
    if refuse:
        with pytest.raises(SwitchError, match="pipeline push: INVALID_ARGUMENT refused"):
            conn.push_pipeline(artifacts.P4INFO, artifacts.BMV2_JSON)
    else:
        assert conn.push_pipeline(artifacts.P4INFO, artifacts.BMV2_JSON) == \
            p4runtime.pipeline_cookie(artifacts.P4INFO, artifacts.BMV2_JSON)
    assert released == [1]  # once, after the request went

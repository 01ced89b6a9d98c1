"""The parameters a worker's step returns are the caller's (issue 44: one worker of the in-process
loopback test ended with other parameters than its peers, and a returned array aliasing a buffer
the agent writes later would do exactly that). Scripted through a datagram socket pair, no thread:
late and early PARAM frames of other steps and second answers of a different content come in
while the worker runs later steps, a non-finite step hands back the parameters held before it,
and with a resume file the agent receives into two buffers it reuses every other step. Every dict
a step returned keeps its bits to the end and shares no memory with the agent."""
import socket

import numpy as np
import pytest

from host_agent import optim
from host_agent.resume import ResumeFile
from host_agent.window import RtoConfig
from host_agent.worker import WorkerAgent, WorkerConfig, slot_and_version
from mindp import codec
from mindp.protocol import K, Flag, Kind, frame_len

NODE = codec.Addresses("02:00:00:00:00:09", "ff:ff:ff:ff:ff:ff", "10.0.0.9", "255.255.255.255")
# stream=False: no thread, so each step's wait() reads every frame the script sent for it and the
# counts below are exact (a streaming thread may finish a step before its last second answer is
# read, which the next step then counts as stale).
CFG = WorkerConfig(3, 1, 8, "02:00:00:00:00:01", "10.0.0.1", NODE.src_mac, NODE.src_ip,
                   rto=RtoConfig(initial=5.0, min=5.0, max=10.0, deadline=30.0),  # nothing resent: the script answers
                   stream=False)
STEPS = 6
NONFINITE_STEP = 3


def param(step: int, chunk: int, value: float, lay, flags: int = 0) -> bytes:
    slot, ver = slot_and_version(step, [chunk], lay.n_chunks, CFG.slots)
    hdr = codec.header_array(1, job=CFG.job_id, step=step, chunk=chunk, slot=slot, ver=ver,
                             count=lay.chunk_count(chunk), flags=flags)
    return codec.encode(Kind.PARAM, hdr, np.full((1, K), value, np.float16), NODE)[0].tobytes()


def value(step: int, chunk: int) -> float:
    return float(10 * step + chunk + 1)  # exact in fp16


def sent_chunks(sock) -> set[int]:
    out = set()
    while True:
        try:
            out.add(int(codec.decode_one(sock.recv(frame_len(Kind.GRAD)), Kind.GRAD)[0]["chunk"]))
        except BlockingIOError:
            return out


@pytest.mark.parametrize("resume", [False, True], ids=["in-memory", "resume-file"])
def test_returned_parameters_never_change_and_alias_nothing_of_the_agent(tmp_path, resume):
    init = {"a": np.zeros(2 * K + 6, np.float32), "b": np.zeros(K + 8, np.float32)}  # chunks 0-2 | 2-3
    lay = optim.layout_of(init)
    n = lay.n_chunks
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    b.setblocking(False)
    initial = {k: v.astype(np.float16) for k, v in init.items()}
    rf = None
    if resume:
        rf, _ = ResumeFile.open(tmp_path / "w.resume", CFG.job_id, CFG.worker_id, lay,
                                lay.flatten(initial, dtype=np.float16))
    agent = WorkerAgent(CFG, lay, a, initial=initial, resume=rf)
    rng = np.random.default_rng(0)
    kept: list[tuple[dict, dict]] = []
    for step in range(STEPS):
        h = agent.start_step()
        for k, v in init.items():
            h.put(k, rng.standard_normal(v.shape).astype(np.float32))
        h.pump(0.0)
        assert sent_chunks(b) == set(range(n))
        flags = int(Flag.NONFINITE) if step == NONFINITE_STEP else 0
        b.send(param(step + 1, 0, -1.0, lay))  # a step early: counted, never taken
        for c in range(n):
            b.send(param(step, c, value(step, c), lay, flags))
            b.send(param(step, c, -2.0, lay, flags | Flag.RETRANSMIT))  # a second answer: the first stands
        got = h.wait()
        kept.append((got, {k: v.copy() for k, v in got.items()}))
        for c in range(n):  # late resends of this step, read while the next one runs
            b.send(param(step, c, -3.0, lay, int(Flag.RETRANSMIT)))
    b.close()
    a.close()
    held = [agent.rx, agent.frames, agent.current] + ([rf.buffers] if rf else [])
    for step, (got, snapshot) in enumerate(kept):
        answered = NONFINITE_STEP - 1 if step == NONFINITE_STEP else step  # a skipped step keeps the one before
        for name, arr in got.items():
            assert arr.tobytes() == snapshot[name].tobytes(), f"step {step}'s {name} changed after it returned"
            assert not any(np.shares_memory(arr, buf) for buf in held), f"step {step}'s {name} is the agent's memory"
            assert not any(np.shares_memory(arr, other) for s, (o, _) in enumerate(kept) if s != step
                           for other in o.values())
        flat = lay.flatten(got, dtype=np.float16)
        want = np.repeat([value(answered, c) for c in range(n)], K)[: lay.total].astype(np.float16)
        assert flat.tobytes() == want.tobytes(), f"step {step} returned other parameters than its first answers"
    st = agent.stats
    assert st["steps"] == STEPS and st["nonfinite_steps"] == 1 and st["params_received"] == STEPS * n
    assert st["duplicates"] == STEPS * n and st["future"] == STEPS and st["stale"] == (STEPS - 1) * n

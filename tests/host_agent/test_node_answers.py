"""Every answer the optimizer node gives for one (step, chunk) carries the same bits: the fresh one,
a duplicate sum's resend (of this step or, after the commit, of the last), a stall resend
(recent_params) and a digest repair's fetch (committed_params). A worker takes the first answer of a
chunk it gets and ignores the others, so if two ever differed, the one worker that missed the first
(a frame lost under load) would end with other parameters than its peers: issue 44's divergence.
Scripted at the NodeCore (no network): seeded interleavings of the current step's sums, duplicates
of both steps in mixed batches, stall resends and fetches between batches, commits deferred to
after each batch's answers as the node's socket does."""
import random

import numpy as np
import pytest

from host_agent import optim, reference
from host_agent.optim import OptimizerConfig
from mindp import codec

from .helpers import initial_fp16, same_bits, small_model, step_sums, sum_headers
from .node_steps import JOB, N, S, assemble, open_core

STEPS = 4


@pytest.mark.parametrize("seed", range(6))
def test_every_answer_of_a_step_and_chunk_carries_the_same_bits(tmp_path, seed):
    rng = random.Random(seed)
    init = small_model()
    lay = optim.layout_of(init)
    n = lay.n_chunks
    gf = reference.synthetic_grads(seed)
    core = open_core(tmp_path, init, OptimizerConfig())
    core.defer_commit = True  # as node_socket: answers first, then commit_if_complete
    answers: dict[tuple[int, int], set[bytes]] = {}
    how: dict[str, int] = {"fresh": 0, "duplicate": 0, "last step": 0, "stall": 0, "fetch": 0}

    def record(hdr, vals, kind: str) -> None:
        for h, v in zip(hdr, vals):
            answers.setdefault((int(h["step"]), int(h["chunk"])), set()).add(v.tobytes())
        how[kind] += len(hdr)

    params = initial_fp16(init)
    sums_of: dict[int, tuple] = {}
    for step in range(STEPS):
        sums_of[step] = step_sums(lay, gf, N, step, params)
        pool = [(step, c) for c in range(n) for _ in range(rng.choice([1, 1, 2, 3]))]
        if step:
            pool += [(step - 1, c) for c in rng.sample(range(n), n // 3)]  # late duplicates of the last step
        rng.shuffle(pool)
        while pool:
            size = rng.randint(1, 8)
            batch, pool = pool[:size], pool[size:]
            hdr = np.concatenate([sum_headers(JOB, s, [c], lay, S, N, sums_of[s][1]) for s, c in batch]).astype(
                codec.HEADER_DTYPE)  # big-endian, as codec.decode gives them (concatenate makes them native)
            vals = np.stack([sums_of[s][0][c] for s, c in batch])
            before = dict.fromkeys(answers, 0)
            out_hdr, out_vals = core.handle(hdr, vals)
            kinds = ["fresh" if (int(h["step"]), int(h["chunk"])) not in before else
                     "duplicate" if h["step"] == step else "last step" for h in out_hdr]
            for kind in set(kinds):
                sel = [i for i, k in enumerate(kinds) if k == kind]
                record(out_hdr[sel], out_vals[sel], kind)
            core.commit_if_complete()
            if rng.random() < 0.3:
                record(*core.recent_params(), "stall")
            if rng.random() < 0.2 and core.committed >= 0:
                c0 = rng.randrange(n)
                chunks = range(c0, min(n, c0 + 4))
                record([{"step": core.committed, "chunk": c} for c in chunks],
                       core.committed_params(core.committed, chunks), "fetch")
        assert core.committed == step
        params = assemble(lay, {c: [(0, np.frombuffer(next(iter(answers[(step, c)])), np.float16))]
                                for c in range(n)}, params)
    differ = sorted(k for k, v in answers.items() if len(v) > 1)
    assert not differ, f"(step, chunk)s answered with different bits: {differ}"
    assert all(how.values()), how  # every kind of answer was given
    assert same_bits(params, reference.train(init, gf, N, STEPS, OptimizerConfig()).params)

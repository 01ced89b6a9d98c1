"""One optimizer node's NodeCore without a network, and its steps: the job's shape (N workers, S slots,
job JOB), a core opened on a fresh or existing state, one step's sums fed to it as the switch sends
them, and the parameters its answers make."""
import numpy as np

from host_agent import node_core, optim, state
from mindp.protocol import K

from .helpers import BUDGET, step_sums, sum_headers

N, S, JOB = 3, 8, 1


def open_core(tmp_path, init, cfg, budget=BUDGET, create=True, sync="step", **kw):
    lay = optim.layout_of(init)
    if create:
        state.create(tmp_path, lay, state.init_pieces(lay, init), cfg, page_chunks=32)
    return node_core.NodeCore(state.Store(tmp_path, budget, sync=sync), JOB, N, S, **kw)


def run_step(core, lay, gf, step, params, rng, dup=0.3, batch=5, only=None, window=None):
    """Feed one step's sums (shuffled, or within `window` of their place; some twice) in batches;
    returns {chunk: [(flags, params) for each answer]}."""
    sums, nf = step_sums(lay, gf, N, step, params)
    chunks = list(range(lay.n_chunks)) if only is None else list(only)
    chunks += [c for c in chunks if rng.random() < dup]
    if window:
        chunks.sort(key=lambda c: c + rng.random() * window)  # the order of a window of slots
    else:
        rng.shuffle(chunks)
    sent = {}
    for i in range(0, len(chunks), batch):
        part = np.array(chunks[i : i + batch])
        hdr, vals = core.handle(sum_headers(JOB, step, part, lay, S, N, nf), sums[part])
        for h, v in zip(hdr, vals):
            assert h["step"] == step
            sent.setdefault(int(h["chunk"]), []).append((int(h["flags"]), v.copy()))
    return sent


def assemble(lay, sent, previous):
    flat = lay.flatten(previous, dtype=np.float16)
    flat = np.concatenate([flat, np.zeros(lay.n_chunks * K - lay.total, np.float16)])
    for c, answers in sent.items():
        flat[c * K : (c + 1) * K] = answers[0][1]
    return lay.unflatten(flat[: lay.total])

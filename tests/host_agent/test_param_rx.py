"""The worker's PARAM receive (host_agent.param_rx): the compiled path gives the numpy path's
parameters, counters, window state and resume records on random batches of valid frames of 1 to
PARAM_CHUNKS_MAX chunks mixed with every kind of corruption, sharded and not; either path takes
valid frames bit for bit and counts the rejects of a known batch."""
import collections

import numpy as np
import pytest

from host_agent import fused, param_rx, shards
from host_agent.window import RtoConfig, RttEstimator, Window
from mindp import codec
from mindp.protocol import PARAM_CHUNKS_MAX, K, Flag, Kind, param_frame_len

N = 23  # chunks, the last one short
COUNTS = np.array([K] * (N - 1) + [K - 3], dtype=np.uint16)
JOB = 3
OPT = ("02:00:00:00:00:fe", "10.0.0.254")
SHARDS = [(0, 7, "02:00:00:00:01:01", "10.0.1.1"), (8, 15, "02:00:00:00:01:02", "10.0.1.2"),
          (16, N - 1, "02:00:00:00:01:03", "10.0.1.3")]
WIDEST = param_frame_len(PARAM_CHUNKS_MAX)
PATHS = [pytest.param(True, id="compiled", marks=pytest.mark.skipif(fused.NUMPY_ONLY, reason="numba off")),
         pytest.param(False, id="numpy")]


class Recorder:
    """A resume file's record(), kept as a list."""

    def __init__(self):
        self.records = []

    def record(self, step, chunks, nonfinite):
        self.records.append((step, np.asarray(chunks).tolist(), np.asarray(nonfinite).tolist()))


def receiver(sharded: bool, compiled: bool, rows: int = 8) -> param_rx.ParamReceiver:  # batches grow it
    rx = param_rx.ParamReceiver(JOB, COUNTS, *OPT, shards.ParamSources(SHARDS) if sharded else None, rows)
    rx.compiled = compiled
    return rx


def window(step: int, attempts: np.ndarray, lossy: bool) -> Window:
    rtt = RttEstimator(RtoConfig())
    if lossy:
        rtt.hold = rtt.cfg.initial / 2
    w = Window(step, N, 4, rtt, 0.0, np.array([hi for _, hi, _, _ in SHARDS]))
    w.attempts[:] = attempts
    w.first_sent[:] = np.arange(N) * 1e-3
    return w


def source(sharded: bool, chunk: int) -> tuple[str, str]:
    if not sharded:
        return OPT
    own = min(int(np.searchsorted([hi for _, hi, _, _ in SHARDS], chunk)), len(SHARDS) - 1)
    return SHARDS[own][2:]


def frame(chunk: int, chunks: int, step: int, src=OPT, job: int = JOB, flags: int = 0, count: int | None = None,
          more: int | None = None) -> np.ndarray:
    """A PARAM frame of `chunks` chunks from `chunk` on (elements random but finite)."""
    if count is None:
        count = K if chunks > 1 or chunk >= N else int(COUNTS[chunk])
    hdr = codec.header_array(1, job=job, step=step, chunk=chunk % 2**32, flags=flags,
                             more=chunks - 1 if more is None else more, count=count)
    vals = np.random.default_rng(chunk + 7 * step).standard_normal((1, chunks * K)).astype(np.float16)
    return codec.encode(Kind.PARAM, hdr, vals, codec.Addresses(src[0], "ff:ff:ff:ff:ff:ff", src[1], "255.255.255.255"),
                        k=chunks * K)[0]


def corrupt(rng, f: np.ndarray, length: int) -> int:
    """One random corruption of frame f (in place); returns its length as received."""
    what = rng.integers(0, 9)
    if what == 0:  # a failed row check (ethertype, ipv4, udp, port, version, kind)
        _, at, size, _ = codec.row_checks(Kind.PARAM)[rng.integers(0, len(codec.row_checks(Kind.PARAM)))]
        f[at + size - 1] ^= 1 + rng.integers(0, 255)
    elif what == 1:  # a length one off, or another PARAM length, or anything
        length = int(rng.choice([length - 1, length + 1, param_frame_len(int(rng.integers(1, PARAM_CHUNKS_MAX + 1))),
                                 rng.integers(0, WIDEST + 1), 37, 38]))
    elif what == 2:  # `more` other than the length says
        f[codec._MORE : codec._MORE + 2] = [0, rng.integers(0, 2 * PARAM_CHUNKS_MAX)]
    elif what == 3:  # count not K
        f[codec._COUNT : codec._COUNT + 2] = [(K - 1) >> 8, (K - 1) & 0xFF]
    elif what == 4:  # another source: a byte of its MAC or IP
        f[int(rng.choice([6, 9, 11, 26, 29]))] ^= 0x40
    elif what == 5:  # not mindp at all (ARP), of any length
        f[12:14] = [0x08, 0x06]
        length = int(rng.choice([length, rng.integers(0, WIDEST + 1)]))
    elif what == 6:  # another UDP port
        f[36] ^= 0x10
        length = int(rng.choice([length, rng.integers(38, WIDEST + 1)]))
    elif what == 7:  # a chunk field beyond the layout, or wrapping past 2**32
        f[codec.PREFIX_LEN + 12 : codec.PREFIX_LEN + 16] = np.array(
            [int(rng.choice([N - 1, N, N + 2, 2**32 - 2, 2**32 - 1]))], ">u4").view(np.uint8)
    else:  # count of a short last chunk
        f[codec._COUNT : codec._COUNT + 2] = [0, 5]
    return min(max(length, 0), WIDEST)


def batches(rng, sharded: bool, step: int, n: int):
    """n random batches (rows, lens) for a window at `step`."""
    sent = []  # frames already given, for duplicates across batches
    for _ in range(n):
        rows = rng.integers(0, 256, size=(int(rng.integers(1, 41)), WIDEST), dtype=np.uint8)  # stale bytes
        lens = np.zeros(len(rows), dtype=np.int64)
        for r in range(len(rows)):
            if sent and rng.random() < 0.15:
                f, length = sent[rng.integers(0, len(sent))]
            else:
                chunks = int(rng.integers(1, PARAM_CHUNKS_MAX + 1))
                chunk = int(rng.integers(0, N)) if rng.random() < 0.9 else int(rng.choice([N - 2, N, 2**32 - 2]))
                src = source(sharded, chunk) if rng.random() < 0.95 else source(sharded, (chunk + 8) % N)
                f = frame(chunk, chunks, int(rng.choice([step, step, step, step - 1, step + 1])), src,
                          job=JOB if rng.random() < 0.95 else JOB + 1,
                          flags=int(rng.choice([0, 0, 0, Flag.RETRANSMIT, Flag.NONFINITE, 3])))
                length = len(f)
                f = np.concatenate([f, np.zeros(WIDEST - len(f), np.uint8)])
                for _ in range(int(rng.choice([0, 0, 0, 1, 2]))):
                    length = corrupt(rng, f, length)
                sent.append((f, length))
            rows[r, :length] = f[:length]
            lens[r] = length
        yield rows, lens


def state(w: Window) -> tuple:
    return (w.done.tolist(), w.n_done, w.behind, w.heard, w.expiry.tolist(), sorted(w.fast_due), w.rtt.srtt,
            w.rtt.peaks, w.rtt.hold)


@pytest.mark.skipif(fused.NUMPY_ONLY, reason="numba off: only the numpy path")
@pytest.mark.parametrize("sharded", [False, True], ids=["one-node", "sharded"])
def test_the_compiled_receive_is_the_numpy_receive(monkeypatch, sharded):
    monkeypatch.setattr(param_rx, "monotonic", lambda: 5.0)  # the same clock for both paths' round trips
    rng = np.random.default_rng(43 + sharded)
    paths = {c: receiver(sharded, c) for c in (True, False)}
    seen = collections.Counter()
    for rnd in range(6):
        step = 5 + rnd
        attempts = rng.choice([0, 1, 1, 1, 2], size=N).astype(np.int32)
        held = {c: (window(step, attempts, lossy=rnd % 2 == 1), np.zeros(N * K, np.float16), collections.Counter(),
                    Recorder() if rnd % 3 else None, []) for c in paths}
        for rows, lens in batches(rng, sharded, step, 60):
            for c, (w, params, stats, rec, nonfinite) in held.items():
                nonfinite.append(paths[c].receive(rows.copy(), lens.copy(), w, params, stats, rec))
            (w1, p1, s1, r1, n1), (w0, p0, s0, r0, n0) = held[True], held[False]
            assert s1 == s0
            assert p1.tobytes() == p0.tobytes()
            assert state(w1) == state(w0)
            assert n1 == n0 and (r1 is None or r1.records == r0.records)
        seen.update(s1)
    # Every check was met (else a check dropped from one path could pass unseen).
    assert {k for k, v in seen.items() if v} >= {*param_rx.STAT_KEYS, "params_received", "duplicates"}


@pytest.mark.parametrize("compiled", PATHS)
@pytest.mark.parametrize("sharded", [False, True], ids=["one-node", "sharded"])
def test_either_path_takes_valid_frames_and_counts_the_rest(sharded, compiled):
    step = 2
    rx, w = receiver(sharded, compiled), window(step, np.ones(N, np.int32), lossy=False)
    w.attempts[20] = 0
    params, stats, rec = np.zeros(N * K, np.float16), collections.Counter(), Recorder()
    good = [frame(0, 4, step, source(sharded, 0)), frame(4, 1, step, source(sharded, 4), flags=Flag.NONFINITE),
            frame(N - 1, 1, step, source(sharded, N - 1))]
    bad = [frame(5, 2, step, source(sharded, 5), more=3),  # length: more says 4 chunks, carries 2
           frame(6, 1, step, source(sharded, 6), more=1),  # length: one chunk's, yet more 1
           frame(8, 1, step, source(sharded, 0)) if sharded else frame(8, 1, step, SHARDS[0][2:]),  # source
           frame(9, 1, step + 1, source(sharded, 9)),  # future
           frame(10, 1, step - 1, source(sharded, 10)),  # stale
           frame(11, 1, step, source(sharded, 11), job=JOB + 1),  # job
           frame(12, 1, step, source(sharded, 12), count=K - 1),  # chunk (its count)
           frame(20, 1, step, source(sharded, 20))]  # unsent
    frames = good + bad + [good[0]]  # and a duplicate
    rows = np.zeros((len(frames) + 1, WIDEST), np.uint8)
    lens = np.array([len(f) for f in frames] + [60], np.int64)
    for r, f in enumerate(frames):
        rows[r, : len(f)] = f
    rows[-1, 12:14] = [0x08, 0x06]  # ARP: no error
    nonfinite = rx.receive(rows, lens, w, params, stats, rec)
    want = np.zeros((N, K), np.float16)
    for f in good:  # as the bytes path decodes them (codec.split_params, codec.decode)
        dec = codec.decode([f.tobytes()], Kind.PARAM)
        want[dec.headers["chunk"]] = dec.elements
    assert params.tobytes() == want.tobytes()
    assert dict(stats) == {"rejected_length": 2, "rejected_source": 1, "future": 1, "stale": 1, "rejected_job": 1,
                           "rejected_chunk": 1, "unsent": 1, "params_received": 6, "duplicates": 4}
    assert nonfinite == [4]
    assert rec.records == [(step, [0, 1, 2, 3, 4, N - 1], [False] * 4 + [True, False])]
    assert w.n_done == 6


def test_numba_off_selects_the_numpy_path():
    assert param_rx.ParamReceiver(JOB, COUNTS, *OPT, None, 8).compiled == (not fused.NUMPY_ONLY)

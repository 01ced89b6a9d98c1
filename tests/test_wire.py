"""The numpy codec against Scapy's build, field for field, and its rejects."""
import numpy as np
import pytest
from scapy.layers.l2 import Ether

from mindp import codec, layers
from mindp.protocol import HEADER_FIELDS, INT64_KINDS, PARAM_CHUNKS_MAX, K, Flag, Header, Kind, frame_len, param_frame_len

ADDRS = codec.Addresses("02:00:00:00:00:01", "02:00:00:00:00:09", "10.0.0.1", "10.0.0.9", ip_id=0x1234)


def random_headers(rng, n):
    fields = {}
    for name, width in HEADER_FIELDS:
        if name in ("version", "kind", "more"):  # more: a PARAM of several chunks (tested below)
            continue
        fields[name] = rng.integers(0, 2**width, size=n, dtype=np.uint64)
    return codec.header_array(n, **fields)


def scapy_frame(kind, hdr, elements):
    h = Header(**{name: int(hdr[name]) for name, _ in HEADER_FIELDS if name != "kind"}, kind=kind)
    return bytes(
        layers.build_frame(
            h, elements, src_mac=ADDRS.src_mac, dst_mac=ADDRS.dst_mac, src_ip=ADDRS.src_ip, dst_ip=ADDRS.dst_ip, ip_id=ADDRS.ip_id
        )
    )


@pytest.mark.parametrize("kind", list(Kind))
def test_codec_bytes_equal_scapy_over_random_headers(kind):
    rng = np.random.default_rng(int(kind))
    n = 25
    hdr = random_headers(rng, n)
    if kind in INT64_KINDS:
        elements = rng.integers(-(2**62), 2**62, size=(n, K), dtype=np.int64)
    else:
        elements = rng.integers(0, 2**16, size=(n, K), dtype=np.uint64).astype(np.uint16).view(np.float16)
    frames = codec.encode(kind, hdr, elements, ADDRS)
    assert frames.shape == (n, frame_len(kind))
    for i in range(n):
        assert frames[i].tobytes() == scapy_frame(kind, hdr[i], elements[i])


def test_encode_tensor_pads_last_chunk_and_records_count():
    x = np.arange(2 * K + 5, dtype=np.float16)
    frames = codec.encode_tensor(Kind.GRAD, x, ADDRS, job=7, worker=3, step=11, first_chunk=4)
    assert len(frames) == 3
    dec = codec.decode(frames, Kind.GRAD)
    assert list(dec.headers["chunk"]) == [4, 5, 6]
    assert list(dec.headers["count"]) == [K, K, 5]
    assert np.array_equal(dec.elements.reshape(-1)[: x.size], x)
    assert not dec.elements.reshape(-1)[x.size :].any()
    assert set(dec.headers["job"]) == {7} and set(dec.headers["step"]) == {11}


def test_empty_tensor_gives_no_frames():
    assert codec.encode_tensor(Kind.GRAD, np.zeros(0, np.float16), ADDRS).shape == (0, frame_len(Kind.GRAD))


def test_scapy_dissects_a_captured_frame():
    x = np.linspace(-3, 3, K).astype(np.float16)
    raw = codec.encode_tensor(Kind.PARAM, x, ADDRS, job=2, step=9)[0].tobytes()
    pkt = Ether(raw)
    assert pkt[layers.Mindp].kind == Kind.PARAM and pkt[layers.Mindp].job == 2 and pkt[layers.Mindp].step == 9
    got = np.array(pkt[layers.Fp16Chunk].elements, dtype=np.uint16).view(np.float16)
    assert np.array_equal(got, x)


def test_sum_frames_round_trip_int64_extremes():
    vals = np.array([-(2**63), 2**63 - 1, 0, -1, 1 << 40] + [0] * (K - 5), dtype=np.int64)
    frames = codec.encode_tensor(Kind.SUM, vals, ADDRS, nworkers=4)
    hdr, elems = codec.decode_one(frames[0].tobytes(), Kind.SUM)
    assert np.array_equal(elems, vals) and hdr["nworkers"] == 4
    assert Ether(frames[0].tobytes())[layers.Int64Chunk].elements[:5] == list(vals[:5])


def test_nonfinite_values_are_encoded_bit_for_bit():
    x = np.array([np.inf, -np.inf, np.nan, 1.0], dtype=np.float16)
    x = np.concatenate([x, np.array([0x7C01, 0xFE00], dtype=np.uint16).view(np.float16)])
    frames = codec.encode_tensor(Kind.GRAD, x, ADDRS, flags=int(Flag.NONFINITE))
    dec = codec.decode(frames, Kind.GRAD)
    assert np.array_equal(dec.elements[0, : x.size].view(np.uint16), x.view(np.uint16))
    assert dec.headers["flags"][0] & Flag.NONFINITE


def good_frame(kind=Kind.GRAD):
    return codec.encode_tensor(kind, np.ones(K, np.float16), ADDRS)[0].tobytes()


def mutate(frame, offset, value):
    b = bytearray(frame)
    b[offset] = value
    return bytes(b)


@pytest.mark.parametrize(
    "frame,reason",
    [
        (good_frame()[:-1], "length"),
        (good_frame() + b"\0", "length"),
        (b"", "length"),
        (mutate(good_frame(), 12, 0x86), "ethertype"),
        (mutate(good_frame(), 14, 0x46), "ipv4"),
        (mutate(good_frame(), 23, 6), "udp"),
        (mutate(good_frame(), 37, 0), "port"),
        (mutate(good_frame(), 42, 2), "version"),
        (good_frame(Kind.PARAM), "kind"),
    ],
)
def test_bad_frames_raise_one_specific_error(frame, reason):
    with pytest.raises(codec.WireError) as info:
        codec.decode_one(frame, Kind.GRAD)
    assert info.value.reason == reason


def test_batch_decode_counts_rejects_and_keeps_good_frames():
    frames = [good_frame(), good_frame()[:50], mutate(good_frame(), 42, 9), good_frame(Kind.SUM), good_frame()]
    dec = codec.decode(frames, Kind.GRAD)
    assert len(dec.headers) == 2
    assert dec.rejects == {"length": 2, "version": 1}


def test_encode_rejects_wrong_element_shape():
    with pytest.raises(ValueError):
        codec.encode(Kind.GRAD, codec.header_array(2), np.zeros((2, K + 1)), ADDRS)


def param_answers(chunks, counts=None, steps=None, flags=None):
    n = len(chunks)
    hdr = codec.header_array(n, job=5, step=steps if steps is not None else 3, chunk=np.asarray(chunks, np.uint32),
                             count=counts if counts is not None else K, flags=flags if flags is not None else 0)
    vals = np.random.default_rng(n).standard_normal((n, K)).astype(np.float16)
    return hdr, vals


def test_param_frames_pack_consecutive_full_chunks_and_decode_splits_them_back():
    chunks = [0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13]
    counts = np.full(len(chunks), K, np.uint16)
    counts[6] = 7  # chunk 6, a tensor's last: alone
    steps = np.full(len(chunks), 3)
    steps[-1] = 4  # chunk 13, another step's: never shares a frame
    flags = np.zeros(len(chunks), np.uint8)
    flags[-2] = Flag.RETRANSMIT  # chunk 12: resent, alone
    hdr, vals = param_answers(chunks, counts, steps, flags)
    out = codec.param_frames(hdr, vals, ADDRS)
    # 0-3 | 4-5 | 6 | 9-11 | 12 | 13, in chunk order (a later chunk first would look like a loss)
    assert list(out.chunks) == [4, 2, 1, 3, 1, 1]
    assert list(out.lens) == [param_frame_len(c) for c in out.chunks]
    frames = [f[:n].tobytes() for f, n in zip(out.frames, out.lens)]
    dec = codec.decode(frames, Kind.PARAM)
    order = np.argsort(dec.headers["chunk"], kind="stable")
    assert (order == np.arange(len(order))).all() and not dec.rejects
    assert list(dec.headers["chunk"][order]) == chunks
    assert list(dec.headers["count"][order]) == list(counts)
    assert list(dec.headers["step"][order]) == list(steps)
    assert list(dec.headers["flags"][order]) == list(flags)
    assert not dec.headers["more"].any()
    assert np.array_equal(dec.elements[order].view(np.uint16), vals.view(np.uint16))


def test_a_param_of_several_chunks_equals_scapys_build_and_scapy_dissects_it():
    hdr, vals = param_answers(range(10, 10 + PARAM_CHUNKS_MAX))
    frames = codec.param_frames(hdr, vals, ADDRS).frames
    first = hdr[0].copy()
    first["more"] = PARAM_CHUNKS_MAX - 1
    assert frames[0].tobytes() == scapy_frame(Kind.PARAM, first, vals.reshape(-1))
    pkt = Ether(frames[0].tobytes())
    assert pkt[layers.Mindp].more == PARAM_CHUNKS_MAX - 1
    got = np.array(pkt[layers.Fp16Chunk].elements, dtype=np.uint16)
    assert np.array_equal(got, vals.reshape(-1).view(np.uint16))


def _with(frame: bytes, offset: int, value: int) -> bytes:
    b = bytearray(frame)
    b[offset : offset + 2] = value.to_bytes(2, "big")
    return bytes(b)


def test_params_whose_length_or_count_contradicts_more_are_counted_not_split():
    more_at = codec.PREFIX_LEN + 22
    count_at = codec.PREFIX_LEN + 10
    hdr, vals = param_answers(range(4))
    four = codec.param_frames(hdr, vals, ADDRS).frames[0].tobytes()
    hdr1, vals1 = param_answers([7])
    one = codec.param_frames(hdr1, vals1, ADDRS).frames[0].tobytes()
    bad = [
        four[: param_frame_len(3)],  # says 4 chunks, carries 3
        _with(four, more_at, PARAM_CHUNKS_MAX),  # more than a PARAM may carry
        _with(four, count_at, K - 1),  # several chunks, yet not full
        _with(one, more_at, 1),  # one chunk's length, says two
        four + b"\0",  # longer than any PARAM
    ]
    dec = codec.decode(bad + [four, one], Kind.PARAM)
    assert dec.rejects == {"length": len(bad)}
    assert sorted(dec.headers["chunk"]) == [0, 1, 2, 3, 7]
    rows = np.zeros((len(bad), param_frame_len(PARAM_CHUNKS_MAX) + 1), np.uint8)
    for r, f in zip(rows, bad):
        r[: len(f)] = np.frombuffer(f, np.uint8)
    rejects = codec.collections.Counter()
    split = codec.split_params(rows, np.array([len(f) for f in bad]), rejects)
    assert rejects["length"] == len(bad) - 1 and len(split) == 1  # the one-chunk frame: decode's to refuse

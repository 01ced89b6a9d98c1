"""The small compiled P4 programs as engines (the features program with its routes, classify entries
and multicast group installed), the frames and expression vectors they take, and P4's wrap-around
of unsigned and signed bit widths."""
import random
import struct

from mindp import codec
from softswitch import compiler
from softswitch.engine import Engine
from softswitch.tables import InstalledEntry

from . import compiled

MAC_A = bytes.fromhex("020000000001")
MAC_B = bytes.fromhex("020000000002")


def engine(name: str, pipeline: str | None = None) -> Engine:
    return Engine(compiler.load(compiled.json_path(name).read_bytes()), pipeline)


def u(x, w):
    return x & ((1 << w) - 1)


def s(x, w):
    x = u(x, w)
    return x - (1 << w) if x >> (w - 1) else x


def expr_vectors():
    edge16 = [0, 1, 0x7FFF, 0x8000, 0xFFFF, 0x1234]
    shifts = [0, 1, 7, 15, 16, 17, 63, 64, 200, 255]
    rng = random.Random(7)
    vecs = [(a, b, s(c, 16), s(d, 16), n) for a in edge16 for b in edge16[:3] for c, d in ((a, b), (b, a))
            for n in shifts[::3]]
    vecs += [(rng.getrandbits(16), rng.getrandbits(16), s(rng.getrandbits(16), 16), s(rng.getrandbits(16), 16),
              rng.choice(shifts + [rng.getrandbits(8)])) for _ in range(300)]
    return vecs


def ipv4(src, dst, ttl=64, tos=0, proto=17, csum=None, extra=b""):
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, tos, 20 + len(extra), 0, 0, ttl, proto, 0,
                      src.to_bytes(4, "big"), dst.to_bytes(4, "big"))
    c = codec.ipv4_checksum(hdr) if csum is None else csum
    return hdr[:10] + struct.pack("!H", c) + hdr[12:] + extra


def feat_frame(src=0x0A000001, dst=0x0A010203, **kw):
    return MAC_A + MAC_B + b"\x08\x00" + ipv4(src, dst, **kw)


def entry(table, match, action, args=(), priority=0):
    aid = next(a for a, spec in table.actions.items() if spec.name == action)
    table.insert(InstalledEntry(tuple(match), priority, aid, tuple(args), ()))


def feat_engine(pipeline: str | None = None) -> Engine:
    """The features program with routes, classify entries and multicast group 7 installed."""
    eng = engine("features", pipeline)
    t = eng.program.tables
    entry(t["I.routes"], [(0x0A010000, 16)], "I.route", [5])
    entry(t["I.routes"], [(0x0A010200, 24)], "I.route", [6])
    entry(t["I.routes"], [(0x0A020000, 16)], "I.drop")
    entry(t["I.classify"], [(0x0A000001, 0xFFFFFFFF), (10, 20)], "I.set_tos", [3], priority=10)
    entry(t["I.classify"], [(0x0A000000, 0xFF000000), (0, 255)], "I.flood", [7], priority=5)
    eng.pre[7] = [(1, 11), (2, 12), (4, 99)]
    return eng

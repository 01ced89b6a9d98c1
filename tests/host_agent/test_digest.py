"""The step digest (host_agent.digest): the node's, summed chunk by chunk as sums are applied in any
order, equals the digest of the parameters the workers hold, also for a skipped (non-finite) step and
after a restart mid-step; a worker whose parameters diverged is caught in that step, names the
chunk, takes the node's, and the run ends bit-identical to the reference."""
import random
import struct

import numpy as np
import pytest

from host_agent import digest, optim, reference
from host_agent.optim import OptimizerConfig, Schedule
from mindp.protocol import K

from .aggregator import Aggregator
from .harness import NodeProcess, Workers, check_against, job_bed, load_stats, run_files
from .helpers import initial_fp16, small_model, step_sums, sum_headers, with_nonfinite
from .node_steps import JOB, S, open_core, run_step

N = 3


def flat_of(lay, params: dict) -> np.ndarray:
    flat = np.zeros(lay.n_chunks * K, np.float16)
    flat[: lay.total] = lay.flatten(params, dtype=np.float16)
    return flat


def held(lay, sent: dict, before: np.ndarray, skipped: bool) -> np.ndarray:
    """A worker's parameters after a step: each chunk's first answer, or those before a skipped step."""
    if skipped:
        return before.copy()
    flat = before.copy()
    for c, answers in sent.items():
        flat[c * K : (c + 1) * K] = answers[0][1]
    return flat


def test_chunk_hash_sees_any_change_and_the_place():
    rng = np.random.default_rng(3)
    p = rng.standard_normal((5, K)).astype(np.float16)
    h = digest.chunk_hashes(np.arange(5), p)
    for i in range(K):
        q = p.copy()
        q.view(np.uint16)[2, i] ^= 1  # one bit of one element
        assert (digest.chunk_hashes(np.arange(5), q) != h).tolist() == [False, False, True, False, False]
    same = np.repeat(p[:1], 2, axis=0)  # equal chunks at two places hash differently
    assert len(set(digest.chunk_hashes(np.array([0, 1]), same).tolist())) == 2


def test_book_adds_what_chunk_hashes_and_blocks_add():
    """The node's Book.add (one compiled pass) sums the same block digests as a worker's numpy
    chunk_hashes and Blocks.add, over runs within and across blocks, of one chunk and of many."""
    rng = np.random.default_rng(4)
    book = digest.Book(100, 2639, None)
    want = np.zeros(book.blocks.count, np.uint64)
    for lo, n in ((100, 40), (140, 1), (141, 300), (900, 64), (2600, 40)):
        chunks, p = np.arange(lo, lo + n), rng.standard_normal((n, K)).astype(np.float16)
        book.add(range(lo, lo + n), p)
        book.blocks.add(want, chunks, digest.chunk_hashes(chunks, p))
        assert book.acc.tolist() == want.tolist()
    assert book.hashed == 445 and want.any()


def test_blocks_cover_the_range_once():
    for lo, hi in [(0, 0), (0, 63), (0, 64), (5, 1000), (100, 10_000)]:
        b = digest.Blocks(lo, hi)
        covered = [c for i in range(b.count) for c in b.chunks_of(i)]
        assert covered == list(range(lo, hi + 1)) and b.count <= digest.BLOCKS


def test_node_digest_equals_the_workers_in_any_order_skipped_and_resumed(tmp_path):
    """Sums shuffled and duplicated; step 1 non-finite (skipped: its digest is step 0's); step 2
    applied half, the node restarted (its digest then read back from the state)."""
    init = small_model()
    lay = optim.layout_of(init)
    gf = with_nonfinite(reference.synthetic_grads(4), 1, 1, "w", 3)
    rng = random.Random(5)
    core = open_core(tmp_path, init, OptimizerConfig())
    blocks = digest.Blocks(0, lay.n_chunks - 1)
    flat = flat_of(lay, initial_fp16(init))
    for step in range(4):
        params = lay.unflatten(flat[: lay.total])
        if step == 2:
            half = range(lay.n_chunks // 2)
            sent = run_step(core, lay, gf, step, params, rng, only=half)
            core.store.close()
            core = open_core(tmp_path, init, OptimizerConfig(), create=False)
            sent.update(run_step(core, lay, gf, step, params, rng, only=range(len(half), lay.n_chunks)))
        else:
            sent = run_step(core, lay, gf, step, params, rng)
        flat = held(lay, sent, flat, skipped=step == 1)
        assert core.committed == step
        assert (core.digests.get(step, core.committed) == blocks.of(flat)).all(), step
    assert core.stats["digests_read_back"] == 1  # step 2 only; step 1 took step 0's
    last = lay.n_chunks - 1
    flat.view(np.uint16)[last * K] ^= 0x8000
    diff = np.flatnonzero(core.digests.get(3, core.committed) != blocks.of(flat))
    assert diff.tolist() == [last // blocks.size]


class Killed(Exception):
    """The node's process ending at its commit (before the write-back)."""


class DigestNode:
    """An OptimizerNode fed SUM frames by hand (no raw socket), its digest server on 127.0.0.1 and a
    worker's digest socket: what the worker holds when the node commits is recorded, scripted, no
    timing (a datagram sent on loopback is queued on its receiver before sendto returns)."""

    def __init__(self, core, monkeypatch, kill_at_commit: bool = False):
        import socket

        from host_agent import node_socket

        monkeypatch.setattr(node_socket.rawsock, "enable_auxdata", lambda s: False)  # no receive ring here
        self.core = core
        self.server = digest.Server(JOB, core.digests, core.committed_params, bind="127.0.0.1", port=0)
        addr = node_socket.NodeAddress("02:00:00:00:00:09", "10.0.0.9")
        self.node = node_socket.OptimizerNode(core, None, addr, stall_resend=0, digests=self.server)
        self.node._send = self._sent
        self.params: dict[int, np.ndarray] = {}  # chunk -> its first answer of the step
        self.worker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.worker.bind(("127.0.0.1", 0))
        self.worker.setblocking(False)
        self.at_commit: list[tuple[int, int, np.ndarray | None]] = []  # (committing step, step, blocks)
        commit = core.store.commit

        def recording_commit():
            self.at_commit += [(core.store.current, *answer) for answer in self.answers()]
            if kill_at_commit:
                raise Killed
            commit()

        core.store.commit = recording_commit

    def _sent(self, hdr, vals, held=True):
        for h, v in zip(hdr, vals):
            self.params.setdefault(int(h["chunk"]), v.copy())
        return len(hdr)

    def ask(self, step: int) -> None:
        self.worker.sendto(digest._QUERY.pack(digest.QUERY, JOB, step), self.server.sock.getsockname())
        self.server.poll(self.core.committed)

    def answers(self) -> list[tuple[int, np.ndarray | None]]:
        out = []
        while True:
            try:
                data = self.worker.recv(65536)
            except BlockingIOError:
                return out
            _, _, step, status, _, _, n = digest._DIGEST.unpack_from(data)
            out.append((step, np.frombuffer(data, ">u8", n, digest._DIGEST.size).astype(np.uint64)
                        if status == digest.OK else None))

    def feed(self, lay, sums, nf, step: int, batches: int = 3) -> None:
        from mindp import codec
        from mindp.protocol import Kind

        from .node_steps import N as SUMMED

        self.params = {}
        addrs = codec.Addresses("02:00:00:00:00:01", "02:00:00:00:00:09", "10.0.0.1", "10.0.0.9")
        for part in np.array_split(np.arange(lay.n_chunks), batches):
            hdr = sum_headers(JOB, step, part, lay, S, SUMMED, nf)
            self.node._handle(codec.encode(Kind.SUM, hdr, sums[part], addrs))

    def close(self) -> None:
        self.worker.close()
        self.server.close()


def test_a_held_query_is_answered_once_the_step_is_applied_before_its_commit(tmp_path, monkeypatch):
    """The worker's query, held since its step started, is answered right when the step's last chunk is
    applied, before the commit's write-back and fsyncs: with the digest of the parameters the workers
    took, for an applied step and for a skipped (non-finite) one (the step before's)."""
    init = small_model()
    lay = optim.layout_of(init)
    gf = with_nonfinite(reference.synthetic_grads(4), 1, 1, "w", 3)
    core = open_core(tmp_path, init, OptimizerConfig())
    d = DigestNode(core, monkeypatch)
    blocks = digest.Blocks(0, lay.n_chunks - 1)
    flat = flat_of(lay, initial_fp16(init))
    try:
        for step in range(3):
            d.ask(step)
            assert d.answers() == [] and d.server.held[step]
            sums, nf = step_sums(lay, gf, 3, step, lay.unflatten(flat[: lay.total]))
            d.feed(lay, sums, nf, step)
            flat = held(lay, {c: [(0, v)] for c, v in d.params.items()}, flat, skipped=step == 1)
            assert [(c, s) for c, s, _ in d.at_commit] == [(step, step)], step
            assert (d.at_commit[0][2] == blocks.of(flat)).all(), step
            assert core.committed == step and not d.server.held
            d.at_commit.clear()
    finally:
        d.close()
        core.store.close()


def test_a_query_tells_a_node_following_the_scripts_lr_the_lr_of_its_step(tmp_path, monkeypatch):
    """The "script" schedule (mindp.torch.init(follow_lr=True)): a worker's query carries its step's
    lr, and so does every resend of it; the node applies no sum of the step before it knows the lr
    (counted: the workers' retransmissions bring them again), then the step at that lr."""
    init = small_model()
    lay = optim.layout_of(init)
    core = open_core(tmp_path, init, OptimizerConfig(schedule=Schedule("script")))
    d = DigestNode(core, monkeypatch)
    d.server.on_lr = core.learn_lr  # as host_agent.node wires it
    client = digest.Client(digest.open_socket(), JOB, "mindp-worker 1/0",
                           [digest.Source(0, lay.n_chunks - 1, "127.0.0.1")], port=d.server.sock.getsockname()[1])
    try:
        sums, nf = step_sums(lay, reference.synthetic_grads(6), 3, 0, initial_fp16(init))
        d.feed(lay, sums, nf, 0)
        assert d.params == {} and core.stats["sums_before_lr"] == lay.n_chunks and core.committed == -1
        client.ask(0)  # a query without an lr (a worker not following the script's) tells nothing
        d.server.poll(core.committed)
        assert core.groups.told == {}
        d.server.lr_from = frozenset({"10.0.0.1"})  # the job's workers: this client is another host
        client.ask(0, (0.0042,))
        d.server.poll(core.committed)
        assert core.groups.told == {} and core.stats["lr_foreign"] == 1
        d.server.lr_from = frozenset({"127.0.0.1"})
        client.ask(0, (0.0042,))
        d.server.poll(core.committed)
        assert core.groups.told == {0: (0.0042,)}
        d.feed(lay, sums, nf, 0)
        assert len(d.params) == lay.n_chunks and core.committed == 0
        client.ask(1, (0.25,))
        core.groups.told.clear()  # as a node restarted meanwhile: the resend tells it again
        client.ask(1)
        d.server.poll(core.committed)
        assert core.groups.told == {1: (0.25,)}
        client.lrs[1] = (0.25, 0.5)  # a script of two groups' lrs for a node training one: refused, counted
        client.ask(1)
        d.server.poll(core.committed)
        assert core.groups.told == {1: (0.25,)} and core.stats["lr_rejected"] == 1
    finally:
        client.sock.close()
        d.close()
        core.store.close()


def test_a_node_killed_after_answering_before_its_commit_resumes_to_the_same_digest(tmp_path, monkeypatch):
    """The digest answered before the commit is the one the node gives after a restart: killed at the
    commit, the node resumes the complete step from its state, commits it and reads back the same."""
    init = small_model()
    lay = optim.layout_of(init)
    core = open_core(tmp_path, init, OptimizerConfig())
    d = DigestNode(core, monkeypatch, kill_at_commit=True)
    flat = flat_of(lay, initial_fp16(init))
    d.ask(0)
    sums, nf = step_sums(lay, reference.synthetic_grads(4), 3, 0, lay.unflatten(flat[: lay.total]))
    with pytest.raises(Killed):
        d.feed(lay, sums, nf, 0)
    d.close()
    core.store.close()
    (_, step, early), = d.at_commit
    flat = held(lay, {c: [(0, v)] for c, v in d.params.items()}, flat, skipped=False)
    assert step == 0 and (early == digest.Blocks(0, lay.n_chunks - 1).of(flat)).all()
    again = open_core(tmp_path, init, OptimizerConfig(), create=False)
    try:
        assert again.committed == 0
        assert (again.digests.get(0, again.committed) == early).all()
        assert again.stats["digests_read_back"] == 1
    finally:
        again.store.close()


@pytest.fixture(scope="module")
def bed():
    yield from job_bed("hdg-", N)


@pytest.mark.net
def test_diverged_worker_is_caught_in_its_step_and_repaired(bed, tmp_path, capfd):
    """Worker 2's parameters of step 2 are corrupted (one bit of the last chunk) after they all came
    in: its digest check fails in step 2, names that chunk, takes the node's; the run ends
    bit-identical."""
    b, topo = bed
    init = small_model()
    gf = reference.synthetic_grads(16)
    steps = 4
    ref = reference.train(init, gf, N, steps, OptimizerConfig())
    args = run_files(tmp_path, topo, init, steps)
    job = topo.jobs[0]
    with Aggregator(job.job_id, {w: topo.host(n) for w, n in job.workers.items()}, topo.host(job.optimizer),
                    b.ports()):
        node = NodeProcess(b.hosts["opt1"], args, tmp_path / "node.log").start()
        try:
            workers = Workers(b, topo, init, gf, steps)
            last = workers.layout.n_chunks - 1
            client = workers.agents[2].digest
            check = client.check

            def corrupt_then_check(step, flat, *rest):
                if step == 2:
                    flat.view(np.uint16)[last * K + 3] ^= 1
                return check(step, flat, *rest)

            client.check = corrupt_then_check
            workers.start().join()
            assert node.finish() == 0
        finally:
            node.stop()
    stats = check_against(ref, workers, tmp_path, mismatches={2: 1})
    for w, a in workers.agents.items():
        assert a.stats["digest_checks"] == steps
        assert a.stats["digest_mismatches"] == (w == 2) and a.stats["digest_repaired_chunks"] == (w == 2)
    assert stats["digests_sent"] >= N * steps and stats["digest_chunks_sent"] >= 1
    err = capfd.readouterr().err
    assert f"mindp-worker 1/2: step 2: parameters differ from the optimizer node's digest in 1 chunk(s): {last};" in err
    assert load_stats(tmp_path / "stats.json")["committed"] == steps - 1


class ScriptedNode:
    """A node's digest socket on 127.0.0.1 answering a Client from scripted block digests, served
    from the client's idle hook: each query takes the next digest of `answers` (the last repeats);
    fetches get `params`' chunks. No thread, no timing: the order is the script's."""

    def __init__(self, lay, answers: list[np.ndarray], params: np.ndarray):
        import socket

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.blocks = digest.Blocks(0, lay.n_chunks - 1)
        self.answers, self.params = list(answers), params.reshape(-1, K)
        self.queries = self.fetched = 0

    def serve(self, timeout: float) -> bool:
        while True:
            try:
                data, addr = self.sock.recvfrom(64)
            except BlockingIOError:
                return False
            magic = data[:8]
            if magic == digest.QUERY:
                _, job, step = digest._QUERY.unpack(data)
                blocks = self.answers[min(self.queries, len(self.answers) - 1)]
                self.queries += 1
                self.sock.sendto(digest._DIGEST.pack(digest.DIGEST, job, step, digest.OK, self.blocks.lo,
                                                     self.blocks.hi, self.blocks.count)
                                 + blocks.astype(">u8").tobytes(), addr)
            elif magic == digest.FETCH:
                _, job, step, first, n = digest._FETCH.unpack(data)
                for c in range(first, first + n):
                    self.fetched += 1
                    self.sock.sendto(digest._CHUNK.pack(digest.CHUNK, job, step, c, digest.OK)
                                     + self.params[c].astype("<f2").tobytes(), addr)


def scripted_client(lay, node: ScriptedNode) -> digest.Client:
    client = digest.Client(digest.open_socket(), 1, "mindp-worker 1/0", [digest.Source(0, lay.n_chunks - 1, "127.0.0.1")],
                           port=node.port)
    client.idle = node.serve
    return client


def test_an_outdated_digest_is_asked_again_before_any_repair():
    """A shard may answer a step's digest, then learn that the step is non-finite and commit it again
    as skipped: the worker, whose parameters are the skipped step's, asks again and finds them equal
    (no mismatch counted, nothing fetched)."""
    import collections

    lay = optim.layout_of(small_model())
    flat = flat_of(lay, initial_fp16(small_model()))
    blocks = digest.Blocks(0, lay.n_chunks - 1)
    outdated = blocks.of(flat) + np.uint64(1)
    node = ScriptedNode(lay, [outdated, blocks.of(flat)], flat)
    stats = collections.Counter()
    scripted_client(lay, node).check(3, flat.copy(), stats, 0.05, 60.0)
    assert stats == {"digest_checks": 1} and node.queries == 2 and node.fetched == 0


def test_a_differing_chunk_is_named_fetched_and_taken(capfd):
    import collections

    lay = optim.layout_of(small_model())
    right = flat_of(lay, initial_fp16(small_model()))
    node = ScriptedNode(lay, [digest.Blocks(0, lay.n_chunks - 1).of(right)], right)
    mine = right.copy()
    last = lay.n_chunks - 1
    mine.view(np.uint16)[[0, last * K + 5]] ^= 0x0400
    stats = collections.Counter()
    scripted_client(lay, node).check(2, mine, stats, 0.05, 60.0)
    assert mine.tobytes() == right.tobytes()
    assert stats == {"digest_checks": 1, "digest_mismatches": 1, "digest_repaired_chunks": 2}
    assert capfd.readouterr().err == ("mindp-worker 1/0: step 2: parameters differ from the optimizer node's digest "
                                      f"in 2 chunk(s): 0, {last}; taken again from the node\n")


def test_parameters_to_repair_are_taken_from_the_node_owning_them_only():
    """A host other than the chunk's node (any on the network can reach a worker's digest socket)
    sends its own values for the chunks a worker is about to repair: they are ignored, and the
    node's are taken."""
    import collections
    import socket

    lay = optim.layout_of(small_model())
    right = flat_of(lay, initial_fp16(small_model()))
    node = ScriptedNode(lay, [digest.Blocks(0, lay.n_chunks - 1).of(right)], right)
    mine = right.copy()
    mine.view(np.uint16)[3] ^= 0x0400
    client = scripted_client(lay, node)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
        other.bind(("127.0.0.2", 0))
        forged = np.full(K, 7.0, dtype="<f2").tobytes()
        other.sendto(digest._CHUNK.pack(digest.CHUNK, 1, 2, 0, digest.OK) + forged, client.sock.getsockname())
        stats = collections.Counter()
        client.check(2, mine, stats, 0.05, 60.0)
    assert mine.tobytes() == right.tobytes() and node.fetched == 1
    assert stats["digest_repaired_chunks"] == 1


def test_a_query_carries_one_lr_a_parameter_group_and_a_malformed_one_tells_none():
    """A query's lrs: a count, then as many float64; a count of 0, above MAX_TOLD_LRS or unlike the
    query's length tells nothing (the query is then no query: counted by the node as rejected)."""
    head = digest._QUERY_LRS.pack(digest.QUERY, JOB, 7, 3)
    lrs = struct.pack("!3d", 0.1, 0.2, 0.3)
    assert digest._told_lrs(head + lrs) == (0.1, 0.2, 0.3)
    assert digest._told_lrs(head + lrs[:-1]) is None and digest._told_lrs(head + lrs + b"x") is None
    assert digest._told_lrs(digest._QUERY_LRS.pack(digest.QUERY, JOB, 7, 0) + lrs) is None
    many = digest.MAX_TOLD_LRS + 1
    assert digest._told_lrs(digest._QUERY_LRS.pack(digest.QUERY, JOB, 7, many) + bytes(8 * many)) is None
    client = digest.Client(digest.open_socket(), JOB, "w", [digest.Source(0, 0, "127.0.0.1")], port=1)
    try:
        with pytest.raises(digest.DigestError, match="a step's query tells 1 to"):
            client.ask(0, (0.1,) * many)
    finally:
        client.sock.close()


def test_the_node_takes_lrs_from_its_jobs_workers_only(tmp_path):
    """host_agent.node's lr_from: job 2's workers' addresses, not job 1's nor the node's own."""
    import argparse

    from host_agent import node
    from mindp import topology

    topo = topology.star([2, 3])
    topo.dump(tmp_path / "topo.json")
    ips = node._workers_ips(argparse.Namespace(topology=str(tmp_path / "topo.json"), job=2))
    assert ips == {topo.host(h).ip for h in topo.job(2).workers.values()} and len(ips) == 3
    assert not ips & {topo.host(h).ip for h in topo.job(1).workers.values()}
    assert topo.host(topo.job(2).optimizer).ip not in ips
    assert node._workers_ips(argparse.Namespace(topology=None, job=2)) is None

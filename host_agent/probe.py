"""Measure what the residency model needs (`residency.Machine`): the disk's sequential read and
write bandwidth as the pipeline uses it (O_DIRECT page reads; buffered writes written back with
sync_file_range; reads and writes at once), the CPU they cost, the node's update rate per CPU
second (NodeCore.handle, batches of sums in chunk order) and the CPU cores the process gets."""
from __future__ import annotations

import mmap
import os
import pathlib
import shutil
import statistics
import tempfile
import threading
import time

import numpy as np

from mindp.layout import Layout, TensorSpec
from mindp.protocol import K

from . import node_core, node_socket, residency, state, synthetic
from .optim import OptimizerConfig
from .pager import SYNC_FILE_RANGE_WAIT_AFTER, SYNC_FILE_RANGE_WAIT_BEFORE, SYNC_FILE_RANGE_WRITE, _libc

BLOCK = 1 << 20
#: The update probe's state pages: 65,536 elements (768 KiB of AdamW records) at any K, so that its
#: budget (1/40 of the state) holds the pages a plan needs (at K = 1,024 pages of 2,048 chunks were
#: 24 MiB, over the whole budget).
PAGE_ELEMENTS = 1 << 16
STEPS = 6  # of the update probe, the best taken: one disturbed step on a shared machine does not count


def _write(fd: int, buf: np.ndarray, n: int, block: int) -> float:
    """n blocks written as the pipeline writes: pwrite, write-back started, the previous waited for;
    then fsync, as a commit does. Returns the seconds of that fsync."""
    for i in range(n):
        os.pwrite(fd, buf, i * block)
        _libc.sync_file_range(fd, i * block, block, SYNC_FILE_RANGE_WRITE)
        if i:
            _libc.sync_file_range(fd, (i - 1) * block, block, SYNC_FILE_RANGE_WAIT_BEFORE
                                  | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER)
    t = time.perf_counter()
    os.fsync(fd)
    return time.perf_counter() - t


def _read(path: str, buf: np.ndarray, n: int, block: int) -> None:
    try:
        rfd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        rfd = os.open(path, os.O_RDONLY)
    try:
        for i in range(n):
            os.preadv(rfd, [buf], i * block)
    finally:
        os.close(rfd)


def disk(directory: str | pathlib.Path, nbytes: int = 128 << 20,
         block: int = BLOCK) -> tuple[float, float, float, float, float]:
    """(read, write, mixed, io_cpu, flush) of scratch files in `directory`, as the pipeline moves a
    state that it overwrites every other step: each file written once first (untimed), then
    overwritten block by block (each block written back as the pipeline does: `write` is that
    stream's rate, bytes/s) and fsynced (`flush`: the seconds per byte written that the fsync still
    took: a disk behind a write cache, as a VM's, acknowledges the write-back at once and persists
    at the fsync); read back with O_DIRECT (buffered where refused); then read again while the
    other file is overwritten, as the pipeline's reader and writer threads do (`mixed`: bytes read +
    written per second, before the fsync); `io_cpu`: the CPU seconds per byte moved."""
    n = max(1, nbytes // block)
    bufs_mm = [mmap.mmap(-1, block) for _ in range(2)]
    bufs = [np.frombuffer(mm, np.uint8) for mm in bufs_mm]
    bufs[1][:] = np.random.default_rng(0).integers(0, 255, block, dtype=np.uint8)
    paths, fds = [], []
    try:
        for _ in range(2):
            fd, path = tempfile.mkstemp(prefix=".mindp-probe-", dir=directory)
            paths.append(path)
            fds.append(fd)
            os.posix_fallocate(fd, 0, n * block)
            _write(fd, bufs[1], n, block)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        cpu = time.process_time()
        t = time.perf_counter()
        synced = _write(fds[0], bufs[1], n, block)
        write = n * block / (time.perf_counter() - t - synced)
        flushes = [synced]
        os.posix_fadvise(fds[0], 0, 0, os.POSIX_FADV_DONTNEED)
        t = time.perf_counter()
        _read(paths[0], bufs[0], n, block)
        read = n * block / (time.perf_counter() - t)
        os.posix_fadvise(fds[0], 0, 0, os.POSIX_FADV_DONTNEED)
        reader = threading.Thread(target=_read, args=(paths[0], bufs[0], n, block))
        t = time.perf_counter()
        reader.start()
        synced = _write(fds[1], bufs[1], n, block)
        reader.join()
        mixed = 2 * n * block / (time.perf_counter() - t - synced)
        flushes.append(synced)
        io_cpu = (time.process_time() - cpu) / (4 * n * block)
    finally:
        for fd, path in zip(fds, paths):
            os.close(fd)
            os.unlink(path)
        del bufs
        for mm in bufs_mm:
            mm.close()
    return read, write, mixed, io_cpu, min(flushes) / (n * block)


def cores(seconds: float = 0.3) -> float:
    """CPU cores this process gets now: one busy thread per core (numpy, GIL released) for
    `seconds`; their CPU time over the wall time."""
    n = os.cpu_count() or 1
    used = [0.0] * n

    def burn(i: int) -> None:
        a = np.random.default_rng(i).standard_normal(1 << 16)
        c = time.thread_time()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            np.sqrt(np.abs(a), out=a)
        used[i] = time.thread_time() - c

    threads = [threading.Thread(target=burn, args=(i,)) for i in range(n)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sum(used) / (time.perf_counter() - t)


def node_update(cfg: OptimizerConfig | None = None, elements: int = 4_000_000, batch: int | None = None) -> float:
    """Elements per second of NodeCore.handle (whole steps, sums in chunk order in batches of the
    node's receive batch unless `batch` is given; the best of STEPS), the state on /dev/shm
    streamed through the pipeline with a budget of 1/40: the node's work with a disk that costs
    nothing (kernel, per-batch bookkeeping, the pipeline's copies and threads). In wall time: the
    kernel runs on every core, and the updating thread's CPU time leaves out the others'."""
    cfg = cfg or OptimizerConfig()
    batch = batch or node_socket.RECV_ROWS
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="mindp-probe-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        layout = Layout([TensorSpec("p", (elements,))])
        state.create(tmp, layout, state.init_pieces(layout, seed=0), cfg,
                     page_chunks=state.page_chunks_for(PAGE_ELEMENTS))
        whole = 4 * elements * state.record(cfg.lanes).itemsize // K + (64 << 20)
        store = state.Store(tmp, whole // 40, drop_cache=False)
        n = layout.n_chunks
        core = node_core.NodeCore(store, 1, 2, 64)
        sums = synthetic.sums(0, 0, n)
        best = float("inf")
        for step in range(STEPS):
            chunks = np.arange(n)
            hdr = synthetic.headers(step, chunks, layout.chunk_count(n - 1), n)
            t = time.perf_counter()
            for lo in range(0, n, batch):
                core.handle(hdr[lo : lo + batch], sums[lo : lo + batch])
            best = min(best, time.perf_counter() - t)
        store.close()
        return elements / best
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def commit_sync(directory: str | pathlib.Path, tries: int = 5) -> float:
    """Seconds of a commit's fixed work: fsync of two clean files, then a small file written,
    fsynced, renamed and the directory fsynced (state._write_atomic)."""
    d = pathlib.Path(tempfile.mkdtemp(prefix=".mindp-probe-", dir=directory))
    try:
        files = [os.open(d / f"f{i}", os.O_RDWR | os.O_CREAT) for i in (0, 1)]
        best = float("inf")
        for _ in range(tries):
            t = time.perf_counter()
            for fd in files:
                os.fsync(fd)
            with open(d / "c.tmp", "wb") as f:
                f.write(b'{"step": 0}\n')
                f.flush()
                os.fsync(f.fileno())
            os.replace(d / "c.tmp", d / "c.json")
            dfd = os.open(d, os.O_RDONLY)
            os.fsync(dfd)
            os.close(dfd)
            best = min(best, time.perf_counter() - t)
        for fd in files:
            os.close(fd)
        return best
    finally:
        shutil.rmtree(d, ignore_errors=True)


def disk_median(directory: str | pathlib.Path, nbytes: int = 128 << 20, block: int = BLOCK,
                passes: int = 3) -> tuple[float, float, float, float, float]:
    """disk()'s figures, each the median of `passes` probes: now and then (after a large delete,
    for one) this VM's disk reads 2.5x faster for a pass than the state's steps ever see it read."""
    runs = [disk(directory, nbytes, block) for _ in range(passes)]
    return tuple(statistics.median(figure) for figure in zip(*runs))


def machine(directory: str | pathlib.Path, cfg: OptimizerConfig | None = None, disk_bytes: int = 128 << 20,
            block: int = BLOCK) -> residency.Machine:
    read, write, mixed, io_cpu, flush = disk_median(directory, disk_bytes, block)
    return residency.Machine(disk_read=read, disk_write=write, update=node_update(cfg),
                             sync=commit_sync(directory), disk_mixed=mixed, io_cpu=io_cpu, cores=cores(),
                             flush=flush)


def report(state_dir: str | pathlib.Path, budget: int, n_chunks: int, page_chunks: int, window: int,
           cfg: OptimizerConfig | None = None, lanes: int = 3, sync: str = "step") -> str:
    """`mindp-optimizer --plan`: this machine's figures (measured on the state's disk), the
    residency the budget gets, and the predicted step time (`lanes`: the state's records'; `sync`:
    when commits are made durable, state.SYNC_MODES)."""
    from . import state
    where = pathlib.Path(state_dir).resolve()
    while not where.is_dir():
        where = where.parent
    w = residency.Workload(n_chunks, page_chunks, window=window, record_bytes=state.record(lanes).itemsize)
    r = residency.decide(budget, w)
    m = machine(where, cfg)
    p = residency.predict(r, w, m, durable=sync == "step")
    elements = n_chunks * K
    return "\n".join([
        f"state: {n_chunks:,} chunks ({elements:,} elements), {2 * w.copy_bytes / 2**20:,.1f} MiB in two copies, "
        f"pages of {w.page_bytes // 1024} KiB; RAM budget {budget / 2**20:,.1f} MiB = {r.budget_pages} pages",
        f"machine ({where}): disk read {m.disk_read / 2**20:,.0f} MiB/s, write {m.durable_write / 2**20:,.0f} MiB/s "
        f"fsynced ({m.disk_write / 2**20:,.0f} MiB/s written back, then {m.flush * 2**30:.2f} s/GiB of fsync); node update {m.update / 1e6:,.1f} M elem/s; "
        f"I/O {m.io_cpu * 2**30:.2f} CPU s/GiB; "
        f"{m.cores:.1f} cores free",
        f"plan: {r.mode}" + ("" if r.mode == "mapped" else
                             f", {len(r.resident)} of {w.n_pages} pages resident across steps, {r.ahead} read ahead, "
                             f"{r.behind} written behind") + ("; commits durable at exit (--sync exit)" if sync == "exit" else ""),
        f"per step: read {p.read_bytes / 2**20:,.0f} MiB, write {p.write_bytes / 2**20:,.0f} MiB; disk "
        f"{p.disk_time:.3f} s, compute {p.compute_time:.3f} s",
        f"predicted step time: {p.step_time:.3f} s ({elements / p.step_time / 1e6:,.1f} M elem/s, {p.bound}-bound)",
    ])

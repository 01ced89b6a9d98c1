"""controller.cells: raw register values -> decoded aggregation cells (pure; the switch
integration is in tests/dataplane/test_cells.py)."""
import numpy as np

from controller import cells
from controller import p4info_names as n
from controller.jobs import AttachedHost, JobState
from controller.slots import SlotRange
from mindp.fixedpoint import exact_sum
from mindp.protocol import K


def job():
    ep = AttachedHost(9, "02:00:00:00:00:09", "10.0.0.9")
    return JobState(1, SlotRange(100, 4), 77, {0: ep, 3: ep, 5: ep}, ep)


def raw_for(j, held):
    """Register contents with `held` = {(slot, ver): (epoch, step, chunk, workers, nonfinite, grads)}."""
    raw = {name: {} for name in (*cells.CELL_REGISTERS, *cells.ACC_REGISTERS)}
    for slot in range(j.slot_count):
        for ver in (0, 1):
            i = cells.cell_index(j.slot_base, slot, ver)
            epoch, step, chunk, workers, nf, grads = held.get((slot, ver), (0, 0, 0, [], 0, []))
            raw[n.CELL_TAG_EPOCH][i] = epoch
            use = step << 32 | chunk
            raw[n.CELL_TAG_STEP_CHUNK][i] = use - (1 << 64) if use >> 63 else use  # as BMv2's Thrift returns it
            raw[n.CELL_BITMAP][i] = sum(1 << w for w in workers)
            raw[n.CELL_COUNT][i] = len(workers)
            raw[n.CELL_CONTRIBUTIONS][i] = 3 * len(workers)  # as on a parent whose children sum 3 each
            raw[n.CELL_NONFINITE][i] = nf
            total = exact_sum(grads)[0] if grads else np.zeros(K, np.int64)
            for e, name in enumerate(cells.ACC_REGISTERS):
                raw[name][i] = int(total[e]) & ((1 << 64) - 1)  # registers hold unsigned bits
    return raw


def test_cells_decode_use_workers_count_and_signed_sums():
    j = job()
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(K).astype(np.float16) for _ in range(2)]
    full = [np.full(K, -0.5, np.float16)] * 3
    raw = raw_for(j, {(1, 0): (77, 12, 5, [0, 5], 0, grads), (2, 1): (77, 11, 6, [0, 3, 5], 1, full),
                      (3, 0): (76, 400, 7, [0], 0, full[:1]), (0, 1): (77, 0xFFFFFFFF, 9, [3], 0, full[:1])})
    got = {(c.slot, c.ver): c for c in cells.decode(j, list(range(4)), raw)}
    partial = got[(1, 0)]
    assert (partial.epoch, partial.step, partial.chunk, partial.workers, partial.count) == (77, 12, 5, [0, 5], 2)
    assert partial.contributions == 6
    assert partial.state == "partial" and partial.index == (100 + 1) * 2
    assert partial.sums == list(exact_sum(grads)[0])
    assert partial.values == [float(v) for v in exact_sum(grads)[0] / 2**24]
    done = got[(2, 1)]
    assert done.state == "complete" and done.nonfinite and done.values == [-1.5] * K
    old = got[(3, 0)]  # left by an earlier incarnation of the job
    assert not old.mine and old.state == "other epoch" and old.step == 400
    assert got[(0, 0)].state == "unused" and got[(0, 0)].workers == []
    assert (got[(0, 1)].step, got[(0, 1)].chunk, got[(0, 1)].workers) == (0xFFFFFFFF, 9, [3])


def test_progress_and_text():
    j = job()
    raw = raw_for(j, {(1, 0): (77, 12, 5, [0, 5], 0, [np.full(K, 0.25, np.float16)] * 2)})
    decoded = cells.decode(j, [0, 1], raw)
    assert cells.progress(j, 77, 12).newest_step == 12
    assert cells.progress(j, 76, 12).newest_step is None  # another epoch: not known
    out = cells.text(j, decoded, cells.progress(j, 77, 11), show_all=False)
    lines = out.splitlines()
    assert "1 of 4 cells hold a use of this epoch; newest completed step 11" in lines[0]
    assert lines[3].split()[:11] == ["1", "0", "202", "77", "12", "5", "0,5", "2", "6", "no", "partial"]
    assert "0.5, 0.5, 0.5, 0.5, ..." in lines[3] and len(lines) == 4
    assert len(cells.text(j, decoded, cells.progress(j, 0, 0), show_all=True).splitlines()) == 3 + 4
    assert decoded[2].to_dict()["values"][:2] == [0.5, 0.5]


def test_reading_one_slot_asks_only_for_its_two_cells():
    j = job()
    raw = raw_for(j, {(2, 0): (77, 3, 2, [3], 0, [np.ones(K, np.float16)])})

    class Reader:  # the ThriftClient calls read_job_cells makes
        asked = set()

        def register_read(self, name, index):
            self.asked.add(index)
            if name in (n.JOB_PROGRESS_EPOCH, n.JOB_NEWEST_STEP):
                return {n.JOB_PROGRESS_EPOCH: 77, n.JOB_NEWEST_STEP: 2}[name]
            return raw[name][index]

    got, prog = cells.read_job_cells(Reader(), j, slot=2)
    assert Reader.asked == {204, 205, 1} and prog.newest_step == 2
    assert [(c.slot, c.ver, c.state, c.values[0]) for c in got] == [(2, 0, "partial", 1.0), (2, 1, "unused", 0.0)]

/* Exact in-network aggregation in self-cleaning slots (docs/DESIGN.md invariants
 * 1, 3 and 4).
 *
 * A cell is one version of one slot: cell = (slot_base + slot) * 2 + ver. A
 * use of a cell is named by (epoch, step, chunk). The first contribution of a
 * use newer than the one the cell holds overwrites it; later ones of the same
 * use add; contributions of an older use are stale and dropped. A contribution
 * is a worker's gradient (fp16, converted exactly) or, at a parent switch, a
 * child switch's partial sum (int64, added as it is). When the last member's
 * contribution arrives the packet becomes the sum and goes to the optimizer
 * node (at a leaf: the partial sum, up the uplink); a contribution for a
 * complete cell is a retransmission and gets the sum (partial) again. The
 * per-element actions (to_fixed, store, accumulate, agg_read) and the acc_i
 * registers are generated for the build's K (gen_p4.py, docs/P4.md). */
#ifndef MINDP_AGGREGATION_P4
#define MINDP_AGGREGATION_P4

#include "headers.p4"

control Aggregation(inout headers_t hdr, inout metadata_t meta,
                    inout standard_metadata_t standard_metadata) {
    /* tag_epoch[cell] ++ tag_step_chunk[cell]: the use the cell holds now.
     * Grows with every new use in a job's life (step, then chunk). */
    register<bit<16>>(POOL_CELLS) tag_epoch;
    register<bit<64>>(POOL_CELLS) tag_step_chunk;
    /* bitmap[cell]: bit w set iff worker w's gradient is in acc_*[cell] for
     * this use; count[cell] is its population count. */
    register<bit<32>>(POOL_CELLS) bitmap;
    register<bit<16>>(POOL_CELLS) count;
    /* nonfinite[cell] = 1 iff some contribution to this use had an Inf/NaN. */
    register<bit<1>>(POOL_CELLS) nonfinite;
    /* contributions[cell] = the gradients in acc_*[cell]: the sum over the members
     * in bitmap[cell] of 1 (a worker) or the partial sum's nworkers (a child
     * switch); the sum's (partial's) nworkers. Equals count[cell] without a tree. */
    register<bit<16>>(POOL_CELLS) contributions;

#include <generated/agg_registers.p4>

    /* Per job: the newest step it completed on this switch, or whose
     * parameters passed through it, valid while progress_epoch holds the job's
     * epoch (a new job, or a restarted switch, starts unknown until its first
     * completion or its first PARAM: the node's stall resend re-arms it within
     * a second of a restart). A gradient more than STEP_WINDOW steps beyond it
     * is dropped, so no admitted gradient can claim a cell for a far-future use
     * that would make every honest contribution after it stale. */
    register<bit<16>>(MAX_JOBS) progress_epoch;
    register<bit<32>>(MAX_JOBS) newest_step;

    counter(MAX_JOBS, CounterType.packets_and_bytes) grad_packets;
    counter(MAX_JOBS, CounterType.packets) completions;
    counter(MAX_JOBS, CounterType.packets) duplicates;
    counter(MAX_JOBS, CounterType.packets) resent_sums;

#include <generated/agg_actions.p4>

    apply {
        bit<32> job = (bit<32>) hdr.mindp.job;
        bit<16> known_epoch;
        bit<32> newest;
        progress_epoch.read(known_epoch, job);
        newest_step.read(newest, job);
        bool known = known_epoch == meta.epoch;
        if (hdr.mindp.kind == KIND_PARAM) {
            /* Admitted only from the node owning its chunk: the job has reached this step. */
            if (!known || hdr.mindp.step > newest) {
                progress_epoch.write(job, meta.epoch);
                newest_step.write(job, hdr.mindp.step);
            }
        } else if (known && (bit<33>) hdr.mindp.step > (bit<33>) newest + STEP_WINDOW) {
            meta.dropped = 1;
            meta.drop_reason = DROP_FUTURE_STEP;
        } else {
            grad_packets.count(job);
            meta.cell = (meta.slot_base + (bit<32>) hdr.mindp.slot) * 2 + (bit<32>) hdr.mindp.ver;
            meta.worker_bit = (bit<32>) 1 << (bit<8>) hdr.mindp.worker;
            bit<16> epoch;
            bit<64> held;
            bit<32> bits = 0;
            bit<16> n = 0;
            bit<16> c = 0;
            bit<1> nf = 0;
            bool partial = hdr.mindp.kind == KIND_PARTIAL;
            meta.contribution = partial ? hdr.mindp.nworkers : 16w1;
            tag_epoch.read(epoch, meta.cell);
            tag_step_chunk.read(held, meta.cell);
            bit<64> use = hdr.mindp.step ++ hdr.mindp.chunk;
            hdr.sums.setValid();
            meta.pkt_nonfinite = (partial && (hdr.mindp.flags & FLAG_NONFINITE) != 0) ? 1w1 : 1w0;
            if (epoch != meta.epoch || use > held) {
                if (!partial) {
                    to_fixed();
                }
                store();
                tag_epoch.write(meta.cell, meta.epoch);
                tag_step_chunk.write(meta.cell, use);
                bits = meta.worker_bit;
                n = 1;
                c = meta.contribution;
                nf = meta.pkt_nonfinite;
                meta.complete = (n == meta.workers) ? 1w1 : 1w0;
            } else if (use < held) {
                meta.dropped = 1;
                meta.drop_reason = DROP_STALE;
            } else {
                bitmap.read(bits, meta.cell);
                count.read(n, meta.cell);
                contributions.read(c, meta.cell);
                nonfinite.read(nf, meta.cell);
                if (bits & meta.worker_bit != 0) {
                    duplicates.count(job);
                    if (n == meta.workers) {
                        agg_read();
                        meta.resend = 1;
                        resent_sums.count(job);
                    } else {
                        meta.dropped = 1;
                        meta.drop_reason = DROP_DUPLICATE;
                    }
                } else {
                    if (!partial) {
                        to_fixed();
                    }
                    accumulate();
                    bits = bits | meta.worker_bit;
                    n = n + 1;
                    c = c + meta.contribution;
                    nf = nf | meta.pkt_nonfinite;
                    meta.complete = (n == meta.workers) ? 1w1 : 1w0;
                }
            }
            if (meta.dropped == 0 && meta.resend == 0) {
                bitmap.write(meta.cell, bits);
                count.write(meta.cell, n);
                contributions.write(meta.cell, c);
                nonfinite.write(meta.cell, nf);
            }
            if (meta.complete == 1 || meta.resend == 1) {
                if (meta.complete == 1) {
                    completions.count(job);
                }
                /* The packet becomes the sum for the job's optimizer node (shards.p4 chose
                 * it), or at a leaf the partial sum for its parent, out of the uplink.
                 * RETRANSMIT marks a resent sum and a sum completed by a retransmission:
                 * either way the round trip it ends is not one workers may sample (Karn's
                 * rule, docs/AGENTS.md). */
                hdr.fp16.setInvalid();
                if (meta.uplink == 1) {
                    hdr.mindp.kind = KIND_PARTIAL;
                    hdr.mindp.worker = meta.child_id;
                } else {
                    hdr.mindp.kind = KIND_SUM;
                }
                hdr.mindp.nworkers = c;
                hdr.mindp.flags = (nf == 1 ? FLAG_NONFINITE : 8w0)
                                  | (meta.resend == 1 ? FLAG_RETRANSMIT : 8w0)
                                  | (hdr.mindp.flags & FLAG_RETRANSMIT);
                hdr.ethernet.dstAddr = meta.optimizer_mac;
                hdr.ipv4.dstAddr = meta.optimizer_ip;
                hdr.ipv4.totalLen = IPV4_LEN_SUM;
                hdr.udp.length = UDP_LEN_SUM;
                hdr.udp.checksum = 0;
                standard_metadata.egress_spec = meta.optimizer_port;
            } else if (meta.dropped == 0) {
                meta.absorbed = 1;  /* counted in; the sum leaves with the last worker's packet */
            }
            if (meta.complete == 1 && (!known || hdr.mindp.step > newest)) {
                progress_epoch.write(job, meta.epoch);
                newest_step.write(job, hdr.mindp.step);
            }
        }
    }
}

#endif

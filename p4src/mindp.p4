/* mindp: in-network aggregation with an attached optimizer node (v1model).
 *
 * Ingress: ordinary frames (untagged ARP and IPv4) from a host known behind
 * their ingress port are forwarded by destination MAC, tagged frames and other
 * EtherTypes dropped; mindp gradients (and child switches' partial sums) are
 * admitted (job, membership and role), aggregated,
 * and the completed sum sent to the job's optimizer node (its shard's node), or
 * at a leaf the partial sum up to the parent; mindp parameter chunks from the
 * node owning the chunk are multicast to the job's workers (child switches). Egress addresses each parameter replica to
 * its worker and keeps flooded frames off their ingress port. */
#include <core.p4>
#include <v1model.p4>

#include "constants.p4"
#include "headers.p4"
#include "parser.p4"
#include "forwarding.p4"
#include "admission.p4"
#include "shards.p4"
#include "aggregation.p4"
#include "multicast.p4"
#include "deparser.p4"

control MindpIngress(inout headers_t hdr, inout metadata_t meta,
                     inout standard_metadata_t standard_metadata) {
    Forwarding() forwarding;
    Admission() admission;
    ShardRouting() shards;
    Aggregation() aggregation;
    ParamMulticast() multicast;

    /* drops[row * DROP_REASONS + reason]: mindp packets dropped, by job row and
     * reason (row MAX_JOBS: no valid job id, and every frame that is not mindp). */
    counter(DROP_CELLS, CounterType.packets) drops;

    /* epoch_generation[0]: the last job epoch the controller handed out. The data plane
     * never counts it (so p4c would warn it unused); the controller reads it and writes
     * the next epoch before a job is installed, so epochs are not reused while the cells
     * that hold them live (a switch restart clears both). */
    @noWarn("unused") counter(1, CounterType.packets) epoch_generation;

    apply {
        if (standard_metadata.parser_error != error.NoError) {
            /* Cut short (e.g. a truncated mindp header or elements): never forwarded. */
            meta.dropped = 1;
            meta.drop_reason = DROP_MALFORMED;
        } else if (hdr.outer_tag.isValid()) {
            /* Hosts are untagged: a tagged frame would reach a host whose kernel strips the
             * tag, past admission (a forged sum or parameters). Never forwarded. */
            meta.dropped = 1;
            meta.drop_reason = DROP_TAGGED;
        } else if (hdr.mindp.isValid()) {
            admission.apply(hdr, meta, standard_metadata);
            if (meta.dropped == 0) {
                shards.apply(hdr, meta, standard_metadata);
            }
            if (meta.dropped == 0) {
                /* A PARAM only advances the job's step window there. */
                aggregation.apply(hdr, meta, standard_metadata);
                if (hdr.mindp.kind == KIND_PARAM) {
                    multicast.apply(hdr, meta, standard_metadata);
                }
            }
        } else if (hdr.ipv4.isValid() || hdr.arp.isValid()) {
            forwarding.apply(hdr, meta, standard_metadata);
        } else {
            meta.dropped = 1;
            meta.drop_reason = DROP_UNKNOWN_ETHERTYPE;
        }
        if (meta.dropped == 1) {
            bit<32> row = (hdr.mindp.isValid() && hdr.mindp.job < MAX_JOBS)
                          ? (bit<32>) hdr.mindp.job : (bit<32>) MAX_JOBS;
            drops.count(row * DROP_REASONS + (bit<32>) meta.drop_reason);
            mark_to_drop(standard_metadata);
        } else if (meta.absorbed == 1) {
            mark_to_drop(standard_metadata);
        }
    }
}

control MindpEgress(inout headers_t hdr, inout metadata_t meta,
                    inout standard_metadata_t standard_metadata) {
    ParamRewrite() rewrite;

    apply {
        if (hdr.mindp.isValid() && hdr.mindp.kind == KIND_PARAM) {
            rewrite.apply(hdr, meta, standard_metadata);
        } else if (standard_metadata.egress_port == standard_metadata.ingress_port) {
            /* A flooded frame does not go back where it came from. */
            mark_to_drop(standard_metadata);
        }
    }
}

V1Switch(MindpParser(), MindpVerifyChecksum(), MindpIngress(), MindpEgress(),
         MindpComputeChecksum(), MindpDeparser()) main;

/* The packet loop's fast path (softswitch/native/serve.py): the switch's ports polled in turn, a
 * ready port's waiting frames taken from its receive ring (mindp/rxring.py), run through the
 * program (mindp_run_batch), and sent with one sendmmsg per egress port in batch order, until a
 * round over the ports finds no frame or `budget` batches were taken. It returns to Python then,
 * which waits in epoll and applies control-plane writes: like mindp_run_batch it runs holding the
 * GIL, so writes land between calls. Ports, counters and drops behave as softswitch/ports.py and
 * dataplane.py do. */
#include <errno.h>
#include <sys/socket.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>

#define SERVE_MAX 1024 /* UIO_MAXIOV: messages per call, and the most slots a batch may have */
#define SERVE_TAG 4    /* bytes of a VLAN tag put back: a slot keeps room for them */

/* Word for word the serve_t array of serve.py. */
typedef struct {
    int64_t nports, budget;
    const int32_t *fds, *numbers;   /* per port: socket, port number */
    uint64_t *counts;               /* per port: rx, tx, tx_errors, rx_truncated */
    uint8_t *const *rings;          /* per port: its receive ring's slots */
    int64_t *const *heads;          /* per port: the next slot to read (RxRing.head) */
    int64_t frames, frame;          /* slots per ring, bytes per slot */
    uint8_t *rbuf; int32_t *rlens, *rports; int64_t rslot, rcap;
    uint8_t *tbuf; int32_t *tlens, *tports; int64_t tslot, tcap;
    uint64_t *stats;                /* mindp_run_batch's */
    uint64_t *io;                   /* rx, tx, frames for a port the switch lacks */
    const int32_t *paged_fds;       /* per port: its send socket for paged frames (PACKET_VNET_HDR), or -1 */
} serve_t;

/* A frame of about a page or more leaves by the port's second socket, with a virtio_net_hdr whose
 * hdr_len is the whole frame: the kernel then builds it as one linear buffer. Sent as plain, it
 * is built in pages, and a link without scatter-gather (mindp's veths) copies it into one buffer
 * again before it goes: 2.1 against 1.45 us of CPU a 4,170-byte frame (a K = 512 SUM) here. */
#define SERVE_PAGED 3840

static struct mmsghdr serve_msgs[SERVE_MAX];
static struct iovec serve_iov[SERVE_MAX][2];
static struct virtio_net_hdr serve_vnet[SERVE_MAX];

/* One slot's frame into `row` (RxRing._take): its length, -1 when longer than `limit`, -2 when a
 * frame that waited whole in the socket's queue is gone (the link went down). */
static int64_t serve_take(const struct tpacket2_hdr *h, uint32_t status, int fd, uint8_t *row, int64_t limit) {
    if (status & TP_STATUS_COPY) {
        ssize_t n = recv(fd, row, (size_t)limit, MSG_TRUNC | MSG_DONTWAIT);
        return n < 0 ? -2 : n > limit ? -1 : n;
    }
    if (h->tp_len > limit || h->tp_snaplen != h->tp_len) return -1;
    memcpy(row, (const uint8_t *)h + h->tp_mac, h->tp_len);
    return h->tp_len;
}

/* Up to rcap waiting frames of port p's ring into slots 0..; the ring slots read (*kept: frames
 * kept). A frame too long for a slot (less a tag's room) is a counted drop; a VLAN tag the kernel
 * took off goes back. */
static int64_t serve_recv(serve_t *s, int64_t p, int64_t *kept_out) {
    uint8_t *ring = s->rings[p];
    int64_t *head = s->heads[p], kept = 0, taken = 0;
    for (; taken < s->rcap; taken++) {
        struct tpacket2_hdr *h = (struct tpacket2_hdr *)(ring + (*head % s->frames) * s->frame);
        uint32_t status = __atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE);
        if (!(status & TP_STATUS_USER)) break;
        uint8_t *row = s->rbuf + kept * s->rslot;
        /* The next slot's frame, guessed as long as this one, is fetched while this one is copied:
         * another core's softirq wrote it, and a copy that waits for each of a large frame's lines
         * in turn stalls. A prefetch never faults; a wrong guess costs only the lines. */
        const uint8_t *next = ring + ((*head + 1) % s->frames) * s->frame;
        int64_t span = h->tp_mac + h->tp_len < s->frame ? h->tp_mac + h->tp_len : s->frame;
        for (int64_t l = 0; l < span; l += 64) __builtin_prefetch(next + l);
        int64_t len = serve_take(h, status, s->fds[p], row, s->rslot - SERVE_TAG);
        unsigned tci = h->tp_vlan_tci, tpid = h->tp_vlan_tpid;
        __atomic_store_n(&h->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
        (*head)++;
        if (len < 0) {
            s->counts[4 * p + 3] += len == -1;
            continue;
        }
        if ((status & TP_STATUS_VLAN_VALID) && len >= 12) {
            if (!(status & TP_STATUS_VLAN_TPID_VALID)) tpid = 0x8100;
            memmove(row + 16, row + 12, (size_t)(len - 12));
            row[12] = (uint8_t)(tpid >> 8); row[13] = (uint8_t)tpid;
            row[14] = (uint8_t)(tci >> 8); row[15] = (uint8_t)tci;
            len += SERVE_TAG;
        }
        s->rlens[kept] = (int32_t)len;
        s->rports[kept] = s->numbers[p];
        kept++;
    }
    s->counts[4 * p] += (uint64_t)kept;
    s->io[0] += (uint64_t)kept;
    *kept_out = kept;
    return taken;
}

/* Messages from..to-1 of serve_msgs out of fd; the ones the kernel refused. */
static int64_t serve_flush(int fd, int64_t from, int64_t to) {
    int64_t failed = 0;
    for (int64_t i = from; i < to;) {
        int r = sendmmsg(fd, serve_msgs + i, (unsigned)(to - i), 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            failed++;
            r = 1;
        }
        i += r;
    }
    return failed;
}

/* Output frames 0..n-1 out, one sendmmsg per egress port and socket, in batch order within each
 * port (a run of paged frames, then of others: each call hands its frames to the link before it
 * returns). A frame the kernel refuses is skipped and counted (tx_errors); one for a port the
 * switch lacks too. */
static void serve_send(serve_t *s, int64_t n) {
    int64_t matched = 0;
    for (int64_t p = 0; p < s->nports && matched < n; p++) {
        int64_t m = 0, run = 0, failed = 0;
        int run_paged = 0;
        for (int64_t i = 0; i < n; i++) {
            if (s->tports[i] != s->numbers[p]) continue;
            int paged = s->paged_fds[p] >= 0 && s->tlens[i] >= SERVE_PAGED;
            if (m > run && paged != run_paged) {
                failed += serve_flush(run_paged ? s->paged_fds[p] : s->fds[p], run, m);
                run = m;
            }
            run_paged = paged;
            struct iovec *v = serve_iov[m];
            if (paged) {
                memset(&serve_vnet[m], 0, sizeof serve_vnet[m]);
                serve_vnet[m].hdr_len = (uint16_t)s->tlens[i];
                v->iov_base = &serve_vnet[m];
                v->iov_len = sizeof serve_vnet[m];
                v++;
            }
            v->iov_base = s->tbuf + i * s->tslot;
            v->iov_len = (size_t)s->tlens[i];
            memset(&serve_msgs[m].msg_hdr, 0, sizeof serve_msgs[m].msg_hdr);
            serve_msgs[m].msg_hdr.msg_iov = serve_iov[m];
            serve_msgs[m].msg_hdr.msg_iovlen = paged ? 2 : 1;
            m++;
        }
        if (m > run) failed += serve_flush(run_paged ? s->paged_fds[p] : s->fds[p], run, m);
        matched += m;
        s->counts[4 * p + 1] += (uint64_t)(m - failed);
        s->counts[4 * p + 2] += (uint64_t)failed;
        s->io[1] += (uint64_t)(m - failed);
    }
    s->io[2] += (uint64_t)(n - matched);
}

/* Batches taken (>= 0), or -EINVAL when s is out of bounds. */
int64_t mindp_serve(const ctx_t *ctx, serve_t *s) {
    if (s->rcap > SERVE_MAX || s->tcap > SERVE_MAX || s->rslot != s->tslot) return -EINVAL;
    int64_t receives = 0;
    for (;;) {
        int any = 0;
        for (int64_t p = 0; p < s->nports; p++) {
            int64_t n;
            if (!serve_recv(s, p, &n)) continue;
            any = 1;
            for (int64_t start = 0; start < n;) {
                int64_t tn = 0;
                start = mindp_run_batch(ctx, s->rbuf, s->rlens, s->rports, s->rslot, start, n, s->tbuf,
                                        s->tlens, s->tports, s->tcap, &tn, s->stats);
                serve_send(s, tn);
            }
            if (++receives >= s->budget) return receives;
        }
        if (!any) return receives;
    }
}

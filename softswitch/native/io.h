/* The packet loop's fast path (softswitch/native/serve.py): the switch's ports polled in turn, a
 * ready port's waiting frames taken with one recvmmsg, run through the program (mindp_run_batch),
 * and sent with one sendmmsg per egress port in batch order, until a round over the ports finds
 * no frame or `budget` receives were made. It returns to Python then, which waits in epoll and
 * applies control-plane writes: like mindp_run_batch it runs holding the GIL, so writes land
 * between calls. Ports, counters and drops behave as softswitch/ports.py and dataplane.py do. */
#include <errno.h>
#include <sys/socket.h>
#include <linux/if_packet.h>

#define SERVE_MAX 1024 /* UIO_MAXIOV: messages per call, and the most slots a batch may have */
#define SERVE_TAG 4    /* bytes of a VLAN tag put back: a slot keeps room for them */

/* Word for word the serve_t array of serve.py. */
typedef struct {
    int64_t nports, budget;
    const int32_t *fds, *numbers;   /* per port: socket, port number */
    uint64_t *counts;               /* per port: rx, tx, tx_errors, rx_truncated */
    uint8_t *rbuf; int32_t *rlens, *rports; int64_t rslot, rcap;
    uint8_t *tbuf; int32_t *tlens, *tports; int64_t tslot, tcap;
    uint64_t *stats;                /* mindp_run_batch's */
    uint64_t *io;                   /* rx, tx, frames for a port the switch lacks */
} serve_t;

typedef struct { struct cmsghdr h; struct tpacket_auxdata a; uint64_t pad; } serve_aux_t;
#define SERVE_AUX CMSG_SPACE(sizeof(struct tpacket_auxdata))
static struct mmsghdr serve_msgs[SERVE_MAX], serve_rmsgs[SERVE_MAX]; /* send; receive */
static struct iovec serve_iov[SERVE_MAX], serve_riov[SERVE_MAX];
static serve_aux_t serve_aux[SERVE_MAX];
static const uint8_t *serve_rbuf; /* the receive buffer serve_rmsgs point into */
static int64_t serve_rslot, serve_rcap;

/* The receive vector over the slots of s's receive buffer: built when that buffer changes (a
 * receive rewrites only each used message's length, flags and control length). */
static void serve_rx_vector(const serve_t *s) {
    if (serve_rbuf == s->rbuf && serve_rslot == s->rslot && serve_rcap == s->rcap) return;
    for (int64_t i = 0; i < s->rcap; i++) {
        serve_riov[i].iov_base = s->rbuf + i * s->rslot;
        serve_riov[i].iov_len = (size_t)(s->rslot - SERVE_TAG);
        memset(&serve_rmsgs[i].msg_hdr, 0, sizeof serve_rmsgs[i].msg_hdr);
        serve_rmsgs[i].msg_hdr.msg_iov = &serve_riov[i];
        serve_rmsgs[i].msg_hdr.msg_iovlen = 1;
        serve_rmsgs[i].msg_hdr.msg_control = &serve_aux[i];
        serve_rmsgs[i].msg_hdr.msg_controllen = SERVE_AUX;
    }
    serve_rbuf = s->rbuf, serve_rslot = s->rslot, serve_rcap = s->rcap;
}

/* Up to rcap waiting frames of port p into slots 0..; how many were kept, or -errno. A frame too
 * long for a slot (less a tag's room) is a counted drop; a VLAN tag the kernel took off goes back. */
static int64_t serve_recv(serve_t *s, int64_t p) {
    serve_rx_vector(s);
    int got = recvmmsg(s->fds[p], serve_rmsgs, (unsigned)s->rcap, MSG_DONTWAIT, NULL);
    if (got < 0) {
        int e = errno;
        return (e == EAGAIN || e == EINTR || e == ENETDOWN || e == ENXIO) ? 0 : -e;
    }
    int64_t kept = 0;
    for (int64_t i = 0; i < got; i++) {
        struct msghdr *h = &serve_rmsgs[i].msg_hdr;
        if (h->msg_flags & MSG_TRUNC) { s->counts[4 * p + 3]++; continue; }
        int64_t len = serve_rmsgs[i].msg_len;
        uint8_t *row = s->rbuf + kept * s->rslot;
        if (kept != i) memmove(row, s->rbuf + i * s->rslot, (size_t)len);
        struct cmsghdr *c = CMSG_FIRSTHDR(h);
        if (c && c->cmsg_level == SOL_PACKET && c->cmsg_type == PACKET_AUXDATA &&
            c->cmsg_len >= CMSG_LEN(sizeof(struct tpacket_auxdata)) && len >= 12) {
            struct tpacket_auxdata a;
            memcpy(&a, CMSG_DATA(c), sizeof a);
            if (a.tp_status & TP_STATUS_VLAN_VALID) {
                unsigned tpid = (a.tp_status & TP_STATUS_VLAN_TPID_VALID) ? a.tp_vlan_tpid : 0x8100;
                memmove(row + 16, row + 12, (size_t)(len - 12));
                row[12] = (uint8_t)(tpid >> 8); row[13] = (uint8_t)tpid;
                row[14] = (uint8_t)(a.tp_vlan_tci >> 8); row[15] = (uint8_t)a.tp_vlan_tci;
                len += SERVE_TAG;
            }
        }
        s->rlens[kept] = (int32_t)len;
        s->rports[kept] = s->numbers[p];
        kept++;
    }
    for (int64_t i = 0; i < got; i++) serve_rmsgs[i].msg_hdr.msg_controllen = SERVE_AUX;
    s->counts[4 * p] += (uint64_t)kept;
    s->io[0] += (uint64_t)kept;
    return kept;
}

/* Output frames 0..n-1 out, one sendmmsg per egress port, in batch order within each port. A frame
 * the kernel refuses is skipped and counted (tx_errors); one for a port the switch lacks too. */
static void serve_send(serve_t *s, int64_t n) {
    int64_t matched = 0;
    for (int64_t p = 0; p < s->nports && matched < n; p++) {
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++) {
            if (s->tports[i] != s->numbers[p]) continue;
            serve_iov[m].iov_base = s->tbuf + i * s->tslot;
            serve_iov[m].iov_len = (size_t)s->tlens[i];
            memset(&serve_msgs[m].msg_hdr, 0, sizeof serve_msgs[m].msg_hdr);
            serve_msgs[m].msg_hdr.msg_iov = &serve_iov[m];
            serve_msgs[m].msg_hdr.msg_iovlen = 1;
            m++;
        }
        matched += m;
        int64_t failed = 0;
        for (int64_t i = 0; i < m;) {
            int r = sendmmsg(s->fds[p], serve_msgs + i, (unsigned)(m - i), 0);
            if (r < 0) {
                if (errno == EINTR) continue;
                failed++;
                r = 1;
            }
            i += r;
        }
        s->counts[4 * p + 1] += (uint64_t)(m - failed);
        s->counts[4 * p + 2] += (uint64_t)failed;
        s->io[1] += (uint64_t)(m - failed);
    }
    s->io[2] += (uint64_t)(n - matched);
}

/* Receives made (>= 0), or -errno of a receive that failed otherwise than "nothing there". */
int64_t mindp_serve(const ctx_t *ctx, serve_t *s) {
    if (s->rcap > SERVE_MAX || s->tcap > SERVE_MAX || s->rslot != s->tslot) return -EINVAL;
    int64_t receives = 0;
    for (;;) {
        int any = 0;
        for (int64_t p = 0; p < s->nports; p++) {
            int64_t n = serve_recv(s, p);
            if (n < 0) return n;
            if (!n) continue;
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

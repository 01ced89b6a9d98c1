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

#ifndef VIRTIO_NET_HDR_GSO_UDP_L4
#define VIRTIO_NET_HDR_GSO_UDP_L4 5 /* headers before Linux 4.18's lack it */
#endif
#define SERVE_MAX 1024 /* UIO_MAXIOV: messages per call, and the most slots a batch may have */
#define SERVE_COUNTS 5 /* counters a port */
#define SERVE_TAG 4    /* bytes of a VLAN tag put back: a slot keeps room for them */

/* Word for word the serve_t array of serve.py. */
typedef struct {
    int64_t nports, budget;
    const int32_t *fds, *numbers;   /* per port: its receiving socket, port number */
    uint64_t *counts;               /* per port (SERVE_COUNTS): rx, tx, tx_errors, rx_truncated, rx_cut */
    uint8_t *const *rings;          /* per port: its receive ring's slots */
    int64_t *const *heads;          /* per port: the next slot to read (RxRing.head) */
    int64_t frames, frame;          /* slots per ring, bytes per slot */
    uint8_t *rbuf; int32_t *rlens, *rports; int64_t rslot, rcap;
    uint8_t *tbuf; int32_t *tlens, *tports; int64_t tslot, tcap;
    uint64_t *stats;                /* mindp_run_batch's */
    uint64_t *io;                   /* rx, tx, frames for a port the switch lacks */
    const int32_t *paged_fds;       /* per port: its send socket for paged frames (PACKET_VNET_HDR), or -1 */
    int64_t vnet;                   /* the rings carry a virtio_net_hdr before each frame (mindp/vnet.py) */
    const int32_t *send_fds;        /* per port: its send socket for other frames (fds[p] without vnet) */
} serve_t;

/* A frame of about a page or more leaves by the port's second socket, with a virtio_net_hdr whose
 * hdr_len is the whole frame: the kernel then builds it as one linear buffer. Sent as plain, it
 * is built in pages, and a link without scatter-gather (mindp's veths) copies it into one buffer
 * again before it goes: 2.1 against 1.45 us of CPU a 4,170-byte frame (a K = 512 SUM) here. */
#define SERVE_PAGED 3840

static struct mmsghdr serve_msgs[SERVE_MAX];
static struct iovec serve_iov[SERVE_MAX][2];
static struct virtio_net_hdr serve_vnet[SERVE_MAX];

/* A frame that waited whole in the socket's queue into buf (up to limit bytes), after its
 * virtio_net_hdr when the socket has them: its length (beyond limit when cut), or -2 when it is gone
 * (the link went down). */
static int64_t serve_queued(int fd, int vnet, uint8_t *buf, int64_t limit) {
    struct virtio_net_hdr skip;
    struct iovec v[2] = {{&skip, sizeof skip}, {buf, (size_t)limit}};
    struct msghdr m = {.msg_iov = vnet ? v : v + 1, .msg_iovlen = vnet ? 2 : 1};
    ssize_t n = recvmsg(fd, &m, MSG_TRUNC | MSG_DONTWAIT);
    return n < 0 ? -2 : n - (vnet ? (ssize_t)sizeof skip : 0);
}

/* One slot's frame into `row` (RxRing._take): its length, -1 when longer than `limit`, -2 when a
 * frame that waited whole in the socket's queue is gone (the link went down). */
static int64_t serve_take(const struct tpacket2_hdr *h, uint32_t status, int fd, int vnet, uint8_t *row, int64_t limit) {
    if (status & TP_STATUS_COPY) {
        int64_t n = serve_queued(fd, vnet, row, limit);
        return n > limit ? -1 : n;
    }
    if (h->tp_len > limit || h->tp_snaplen != h->tp_len) return -1;
    memcpy(row, (const uint8_t *)h + h->tp_mac, h->tp_len);
    return h->tp_len;
}

/* The one's complement sum of p[0..n)'s big-endian 16-bit words (an odd last byte padded with
 * zero), folded, not complemented: summed as little-endian 32-bit words eight bytes at a time, which
 * gives the same sum byte-swapped (RFC 1071's byte-order independence). */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "serve_sum assumes a little-endian host"
#endif
static uint32_t serve_sum(const uint8_t *p, int64_t n) {
    uint64_t s = 0;
    for (; n >= 8; p += 8, n -= 8) { uint64_t w; memcpy(&w, p, 8); s += (w & 0xffffffffu) + (w >> 32); }
    for (; n >= 2; p += 2, n -= 2) s += (uint32_t)(p[0] | p[1] << 8);
    if (n) s += p[0];
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return (uint32_t)(((s & 0xff) << 8) | (s >> 8));
}

static void serve_put16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }

/* ~(a + b) folded, 0 sent as 0xFFFF (CSUM_MANGLED_0): a UDP or TCP checksum as Linux writes it. */
static uint32_t serve_csum(uint32_t a, uint32_t b) {
    uint32_t s = a + b;
    s = (s & 0xffff) + (s >> 16);
    s = ~s & 0xffff;
    return s ? s : 0xffff;
}

/* row[0..n)'s partial checksum completed (vnet.complete): the field at start + offset holds the
 * pseudo-header's sum. */
static void serve_complete(uint8_t *row, int64_t n, const struct virtio_net_hdr *v) {
    int64_t at = (int64_t)v->csum_start + v->csum_offset;
    if (at + 2 <= n) serve_put16(row + at, serve_csum(serve_sum(row + v->csum_start, n - v->csum_start), 0));
}

/* The headers' length (Ethernet, IPv4, UDP) of the untagged Ethernet/IPv4/UDP super-frame that v
 * describes, n bytes long, its first `have` bytes at src; 0 when it is not one (vnet.udp_layout).
 * Read from the frame: the kernel's hdr_len is the skb's linear part, which may be the whole frame. */
static int64_t serve_udp_layout(const uint8_t *src, int64_t have, int64_t n, const struct virtio_net_hdr *v) {
    if (v->gso_type != VIRTIO_NET_HDR_GSO_UDP_L4 || !v->gso_size || have < 34 || n < 34) return 0;
    if (src[12] != 8 || src[13] != 0 || src[14] >> 4 != 4 || src[23] != 17) return 0;
    int64_t ihl = (src[14] & 15) * 4;
    if (ihl < 20 || n <= 14 + ihl + 8) return 0;
    if ((v->flags & VIRTIO_NET_HDR_F_NEEDS_CSUM) && v->csum_start != 14 + ihl) return 0;
    return 14 + ihl + 8;
}

/* Super-frame src[0..n) cut into rows kept.. as the sending kernel's UDP segmentation cuts it
 * (vnet.segments): each row the headers and up to gso_size payload bytes, with IP total length,
 * id (counted up), IP checksum, UDP length and UDP checksum of its own. */
static void serve_split(serve_t *s, const uint8_t *src, int64_t n, const struct virtio_net_hdr *v, int64_t hdr,
                        int64_t kept, int32_t port) {
    int64_t udp = hdr - 8, ihl = udp - 14;
    uint32_t id = (uint32_t)(src[18] << 8 | src[19]);
    for (int64_t at = hdr, i = 0; at < n; at += v->gso_size, i++) {
        int64_t pay = n - at < v->gso_size ? n - at : v->gso_size, len = hdr + pay;
        uint8_t *r = s->rbuf + (kept + i) * s->rslot;
        memcpy(r, src, (size_t)hdr);
        memcpy(r + hdr, src + at, (size_t)pay);
        serve_put16(r + 16, (uint32_t)(len - 14));
        serve_put16(r + 18, (id + (uint32_t)i) & 0xffff);
        serve_put16(r + 24, 0);
        serve_put16(r + 24, ~serve_sum(r + 14, ihl) & 0xffff);
        uint32_t ulen = (uint32_t)(len - udp);
        serve_put16(r + udp + 4, ulen);
        serve_put16(r + udp + 6, 0);
        uint8_t pseudo[12];
        memcpy(pseudo, r + 26, 8);
        pseudo[8] = 0; pseudo[9] = 17; serve_put16(pseudo + 10, ulen);
        serve_put16(r + udp + 6, serve_csum(serve_sum(pseudo, 12), serve_sum(r + udp, (int64_t)ulen)));
        s->rlens[kept + i] = (int32_t)len;
        s->rports[kept + i] = port;
    }
}

/* A VLAN tag the kernel took off put back in row[0..len): the new length. */
static int64_t serve_tag(uint8_t *row, int64_t len, uint32_t status, unsigned tci, unsigned tpid) {
    if (!(status & TP_STATUS_VLAN_VALID) || len < 12) return len;
    if (!(status & TP_STATUS_VLAN_TPID_VALID)) tpid = 0x8100;
    memmove(row + 16, row + 12, (size_t)(len - 12));
    row[12] = (uint8_t)(tpid >> 8); row[13] = (uint8_t)tpid;
    row[14] = (uint8_t)(tci >> 8); row[15] = (uint8_t)tci;
    return len + SERVE_TAG;
}

/* Slot h's super-frame (port p, its header v) into rows kept.. (room for `count` made sure):
 * rows made, or -1 when it is dropped (gone, cut short, no UDP super-frame, a segment longer than a
 * row). One that waited in the socket's queue is read either way, so the queue stays in step with
 * the ring. */
static int64_t serve_super(serve_t *s, int64_t p, const struct tpacket2_hdr *h, uint32_t status,
                           const struct virtio_net_hdr *v, int64_t kept, int fits) {
    static uint8_t big[1 << 17]; /* an IPv4 datagram of 64 KB and its Ethernet header */
    const uint8_t *src = (const uint8_t *)h + h->tp_mac;
    int64_t n = h->tp_len;
    if (status & TP_STATUS_COPY) {
        n = serve_queued(s->fds[p], 1, big, sizeof big);
        if (n < 0 || n > (int64_t)sizeof big) return -1;
        src = big;
    } else if (h->tp_snaplen != h->tp_len) {
        return -1;
    }
    int64_t hdr = serve_udp_layout(src, n, n, v), limit = s->rslot - SERVE_TAG;
    if (!fits || !hdr || hdr + (n - hdr < v->gso_size ? n - hdr : v->gso_size) > limit) return -1;
    serve_split(s, src, n, v, hdr, kept, s->numbers[p]);
    int64_t made = (n - hdr + v->gso_size - 1) / v->gso_size;
    for (int64_t i = 0; i < made; i++) {
        uint8_t *r = s->rbuf + (kept + i) * s->rslot;
        s->rlens[kept + i] = (int32_t)serve_tag(r, s->rlens[kept + i], status, h->tp_vlan_tci, h->tp_vlan_tpid);
    }
    return made;
}

/* Up to rcap waiting frames of port p's ring into slots 0..; the ring slots read (*kept: frames
 * kept). A frame too long for a slot (less a tag's room) is a counted drop; a VLAN tag the kernel
 * took off goes back. With virtio_net_hdrs, a super-frame becomes its segments (taken only while
 * slots are left for all of them) and a partial checksum is completed (mindp/vnet.py). */
static int64_t serve_recv(serve_t *s, int64_t p, int64_t *kept_out) {
    uint8_t *ring = s->rings[p];
    int64_t *head = s->heads[p], kept = 0, taken = 0;
    for (; taken < s->rcap && kept < s->rcap; taken++) {
        struct tpacket2_hdr *h = (struct tpacket2_hdr *)(ring + (*head % s->frames) * s->frame);
        uint32_t status = __atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE);
        if (!(status & TP_STATUS_USER)) break;
        struct virtio_net_hdr v = {0};
        if (s->vnet) memcpy(&v, (const uint8_t *)h + h->tp_mac - sizeof v, sizeof v);
        if (v.gso_type != VIRTIO_NET_HDR_GSO_NONE) {
            int64_t n = h->tp_len, hdr = serve_udp_layout((const uint8_t *)h + h->tp_mac, h->tp_snaplen, n, &v);
            int64_t count = hdr ? (n - hdr + v.gso_size - 1) / v.gso_size : 0; /* its headers are in the slot */
            if (kept && count > s->rcap - kept) break; /* the next call takes it with room for all its frames */
            int64_t made = serve_super(s, p, h, status, &v, kept, count > 0 && count <= s->rcap - kept);
            __atomic_store_n(&h->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
            (*head)++;
            if (made < 0) {
                s->counts[SERVE_COUNTS * p + 3]++;
            } else {
                s->counts[SERVE_COUNTS * p + 4]++;
                kept += made;
            }
            continue;
        }
        uint8_t *row = s->rbuf + kept * s->rslot;
        /* The next slot's frame, guessed as long as this one, is fetched while this one is copied:
         * another core's softirq wrote it, and a copy that waits for each of a large frame's lines
         * in turn stalls. A prefetch never faults; a wrong guess costs only the lines. */
        const uint8_t *next = ring + ((*head + 1) % s->frames) * s->frame;
        int64_t span = h->tp_mac + h->tp_len < s->frame ? h->tp_mac + h->tp_len : s->frame;
        for (int64_t l = 0; l < span; l += 64) __builtin_prefetch(next + l);
        int64_t len = serve_take(h, status, s->fds[p], (int)s->vnet, row, s->rslot - SERVE_TAG);
        unsigned tci = h->tp_vlan_tci, tpid = h->tp_vlan_tpid;
        __atomic_store_n(&h->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
        (*head)++;
        if (len < 0) {
            s->counts[SERVE_COUNTS * p + 3] += len == -1;
            continue;
        }
        if (v.flags & VIRTIO_NET_HDR_F_NEEDS_CSUM) serve_complete(row, len, &v);
        s->rlens[kept] = (int32_t)serve_tag(row, len, status, tci, tpid);
        s->rports[kept] = s->numbers[p];
        kept++;
    }
    s->counts[SERVE_COUNTS * p] += (uint64_t)kept;
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
                failed += serve_flush(run_paged ? s->paged_fds[p] : s->send_fds[p], run, m);
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
        if (m > run) failed += serve_flush(run_paged ? s->paged_fds[p] : s->send_fds[p], run, m);
        matched += m;
        s->counts[SERVE_COUNTS * p + 1] += (uint64_t)(m - failed);
        s->counts[SERVE_COUNTS * p + 2] += (uint64_t)failed;
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

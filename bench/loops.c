/* bench/softswitch.py's loops in C, so that no interpreter sets the pace it measures.
 *   forward:      the I/O ceiling: every frame from one packet socket to another, up to a batch per
 *                 recvmmsg and one sendmmsg for them, and nothing else (runs until killed);
 *   closed_loop:  the load generator: frames sent in bursts with at most `window` in flight,
 *                 outputs counted as they come back, both through PACKET_MMAP rings (the
 *                 cheapest packet-socket I/O: the generator shares the two cores with the
 *                 switch it measures, and with recvmmsg/sendmmsg it set the pace itself). */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <linux/if_packet.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>

#define WIDTH 16384 /* a frame of the largest K that fits a 9000-byte MTU, and then some */
#define MOST 1024

static unsigned char buf[MOST][WIDTH];
static struct mmsghdr msgs[MOST];
static struct iovec iov[MOST];

/* message i of the vector: one buffer of `len` bytes at `base` */
static void message(int i, void *base, size_t len) {
    iov[i].iov_base = base;
    iov[i].iov_len = len;
    memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
}

void forward(int in, int out, int batch) {
    struct pollfd p = {in, POLLIN, 0};
    if (batch > MOST) batch = MOST;
    for (;;) {
        poll(&p, 1, -1);
        for (int i = 0; i < batch; i++) message(i, buf[i], WIDTH);
        int n = recvmmsg(in, msgs, (unsigned)batch, MSG_DONTWAIT, NULL);
        for (int i = 0; i < n; i++) iov[i].iov_len = msgs[i].msg_len;
        for (int i = 0; i < n;) {
            int r = sendmmsg(out, msgs + i, (unsigned)(n - i), 0);
            i += r < 0 ? 1 : r;
        }
    }
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define RING 1024      /* slots of each ring */
#define SLOT 16384     /* bytes of a slot, its header included: a K = 1024 sum frame fits */
#define TX_DATA (TPACKET2_HDRLEN - sizeof(struct sockaddr_ll)) /* where a sent frame's bytes go */
/* A TX slot may be written again once the kernel marks it available; the frames leave by veths
 * with scatter-gather off (mindp.testbed), so the kernel copies each out of the ring first. */

/* A TPACKET_V2 ring of `kind` (PACKET_TX_RING, PACKET_RX_RING) on packet socket fd, mapped; NULL
 * (errno set) where the kernel refuses it. */
static unsigned char *ring(int fd, int kind) {
    int version = TPACKET_V2;
    struct tpacket_req req = {1 << 20, RING * SLOT / (1 << 20), SLOT, RING};
    if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &version, sizeof version) ||
        setsockopt(fd, SOL_PACKET, kind, &req, sizeof req))
        return NULL;
    void *m = mmap(NULL, (size_t)RING * SLOT, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return m == MAP_FAILED ? NULL : m;
}

static struct tpacket2_hdr *slot(unsigned char *ring, long i) {
    return (struct tpacket2_hdr *)(ring + (i % RING) * SLOT);
}

/* Sends the n frames (rows of `width` bytes, each `len` long) from tx, at most `window` inputs
 * in flight, one output expected per `per_output` inputs; stops when all outputs came or none
 * came for 1 s. Returns the seconds from the start to the last output, or -errno where a ring
 * could not be set up; *received: outputs. A frame the kernel refuses is skipped (its output
 * never comes: the rate counts what came). tx and rx are fresh sockets: the rings stay theirs. */
double closed_loop(int tx, int rx, const unsigned char *rows, long n, long width, long len, long per_output,
                   long window, long *received) {
    long sent = 0, got = 0, expected = n / per_output, tx_head = 0, rx_head = 0;
    *received = 0;
    if (len > SLOT - (long)TX_DATA) return -EINVAL;
    unsigned char *out = ring(tx, PACKET_TX_RING), *in = out ? ring(rx, PACKET_RX_RING) : NULL;
    if (!in) {
        double e = -errno;
        if (out) munmap(out, (size_t)RING * SLOT);
        return e;
    }
    double t0 = now(), last = t0;
    struct pollfd p = {rx, POLLIN, 0};
    while (got < expected) {
        long room = window - (sent - got * per_output), queued = 0;
        if (room > n - sent) room = n - sent;
        for (; queued < room; queued++) {
            struct tpacket2_hdr *h = slot(out, tx_head);
            if (__atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) != TP_STATUS_AVAILABLE) break;
            memcpy((unsigned char *)h + TX_DATA, rows + (sent + queued) * width, (size_t)len);
            h->tp_len = (unsigned)len;
            __atomic_store_n(&h->tp_status, TP_STATUS_SEND_REQUEST, __ATOMIC_RELEASE);
            tx_head++;
        }
        if (queued) send(tx, NULL, 0, MSG_DONTWAIT);
        sent += queued;
        if (poll(&p, 1, 1000) <= 0) break;
        for (;;) {
            struct tpacket2_hdr *h = slot(in, rx_head);
            if (!(__atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER)) break;
            __atomic_store_n(&h->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
            rx_head++;
            got++;
            last = now();
        }
    }
    munmap(out, (size_t)RING * SLOT);
    munmap(in, (size_t)RING * SLOT);
    *received = got;
    return last - t0;
}

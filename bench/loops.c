/* bench/softswitch.py's loops in C, so that no interpreter sets the pace it measures.
 *   forward:      the I/O ceiling: every frame from one packet socket to another, up to a batch per
 *                 recvmmsg and one sendmmsg for them, and nothing else (runs until killed);
 *   closed_loop:  the load generator: frames sent in bursts with at most `window` in flight,
 *                 outputs counted as they come back. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define WIDTH 2048
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

/* Sends the n frames (rows of `width` bytes, each `len` long) from tx, at most `window` inputs
 * in flight, one output expected per `per_output` inputs; stops when all outputs came or none
 * came for 1 s. Returns the seconds from the start to the last output; *received: outputs. A
 * frame the kernel refuses is skipped (its output never comes: the rate counts what came). */
double closed_loop(int tx, int rx, const unsigned char *rows, long n, long width, long len, long per_output,
                   long window, long *received) {
    long sent = 0, got = 0, expected = n / per_output;
    double t0 = now(), last = t0;
    struct pollfd p = {rx, POLLIN, 0};
    while (got < expected) {
        long room = window - (sent - got * per_output);
        if (room > n - sent) room = n - sent;
        while (room > 0) {
            long k = room < MOST ? room : MOST;
            for (long i = 0; i < k; i++) message((int)i, (void *)(rows + (sent + i) * width), (size_t)len);
            int r = sendmmsg(tx, msgs, (unsigned)k, 0);
            r = r < 0 ? 1 : r;
            sent += r;
            room -= r;
        }
        if (poll(&p, 1, 1000) <= 0) break;
        for (;;) {
            for (int i = 0; i < MOST; i++) message(i, buf[i], WIDTH);
            int k = recvmmsg(rx, msgs, MOST, MSG_DONTWAIT, NULL);
            if (k <= 0) break;
            got += k;
            last = now();
        }
    }
    *received = got;
    return last - t0;
}

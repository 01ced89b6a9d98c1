/* The I/O ceiling of bench/softswitch.py: every frame from one packet socket to another, up to a
 * batch per recvmmsg and one sendmmsg for them, and nothing else: what any switch on these ports
 * does at the least, with no interpreter in the loop. Runs until its process is killed. */
#define _GNU_SOURCE
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#define WIDTH 2048
#define MOST 1024

static unsigned char buf[MOST][WIDTH];
static struct mmsghdr msgs[MOST];
static struct iovec iov[MOST];

void forward(int in, int out, int batch) {
    struct pollfd p = {in, POLLIN, 0};
    if (batch > MOST) batch = MOST;
    for (;;) {
        poll(&p, 1, -1);
        for (int i = 0; i < batch; i++) {
            iov[i].iov_base = buf[i];
            iov[i].iov_len = WIDTH;
            memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        int n = recvmmsg(in, msgs, (unsigned)batch, MSG_DONTWAIT, NULL);
        for (int i = 0; i < n; i++) iov[i].iov_len = msgs[i].msg_len;
        for (int i = 0; i < n;) {
            int r = sendmmsg(out, msgs + i, (unsigned)(n - i), 0);
            i += r < 0 ? 1 : r;
        }
    }
}

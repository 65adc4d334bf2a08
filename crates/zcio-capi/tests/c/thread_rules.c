/* thread_rules.c: the thread and ownership rules zcio.h documents, exercised.
 *
 * - zcio_rx_chunk_free from any thread: 8 MiB received on the main thread, every chunk handed
 *   to a second thread that checks and frees it (also while the main thread sits inside
 *   zcio_receiver_next_event), and chunks freed after zcio_receiver_free; every byte checked.
 * - zcio_pool_get gives an empty, zeroed buffer: a buffer filled and freed comes back with
 *   length 0 and no old byte (on any thread).
 * - zcio_event_poster_post from another thread while the owner waits.
 * - handles bound to their creating thread (event ring, sender, receiver) answer -EPERM on
 *   another thread and take nothing (the fd or buffer passed in stays the caller's). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zcio.h>

#define TOTAL (8 << 20)
#define FAIL(...)                                   \
    do {                                            \
        fprintf(stderr, __VA_ARGS__);               \
        fprintf(stderr, " (line %d)\n", __LINE__); \
        exit(1);                                    \
    } while (0)

static struct sockaddr_in addr;

static void *client(void *arg) {
    (void)arg;
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&addr, sizeof addr)) return NULL;
    static unsigned char b[1 << 16];
    size_t off = 0;
    while (off < TOTAL) {
        size_t n = TOTAL - off < sizeof b ? TOTAL - off : sizeof b;
        for (size_t i = 0; i < n; i++) b[i] = (unsigned char)((off + i) * 7);
        ssize_t w = write(c, b, n);
        if (w <= 0) break;
        off += (size_t)w;
    }
    close(c);
    return NULL;
}

struct item {
    zcio_rx_chunk *chunk;
    const unsigned char *data;
    size_t len, off;
};
static int q[2]; /* pipe of items to the freeing thread */
static int bad;

static void *freer(void *arg) {
    (void)arg;
    struct item it;
    while (read(q[0], &it, sizeof it) == sizeof it) {
        if (!it.chunk) break;
        for (size_t i = 0; i < it.len; i++)
            if (it.data[i] != (unsigned char)((it.off + i) * 7)) bad = 1;
        zcio_rx_chunk_free(it.chunk);
    }
    return NULL;
}

static void chunks_freed_on_another_thread(void) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t al = sizeof addr;
    if (bind(l, (struct sockaddr *)&addr, sizeof addr) || listen(l, 4) ||
        getsockname(l, (struct sockaddr *)&addr, &al))
        FAIL("listen");
    zcio_receiver *rx;
    int rc = zcio_receiver_listen(&rx, l, ZCIO_RX_AUTO);
    if (rc < 0) FAIL("receiver: %s", strerror(-rc));
    if (pipe(q)) FAIL("pipe");
    pthread_t tc, tf;
    pthread_create(&tf, NULL, freer, NULL);
    pthread_create(&tc, NULL, client, NULL);
    size_t got = 0;
    int closed = 0, kept = 0;
    struct item keep[4];
    while (!closed) {
        zcio_rx_event ev;
        rc = zcio_receiver_next_event(rx, &ev, 5000);
        if (rc <= 0) FAIL("next_event: %s", rc ? strerror(-rc) : "timed out");
        if (ev.kind == ZCIO_RX_DATA) {
            struct item it = {ev.chunk, ev.data, ev.len, got};
            got += ev.len;
            if (kept < 4 && got > TOTAL / 2) {
                keep[kept++] = it; /* freed after the receiver */
            } else if (write(q[1], &it, sizeof it) != sizeof it) {
                FAIL("queue");
            }
        }
        if (ev.kind == ZCIO_RX_CLOSED) closed = 1;
    }
    pthread_join(tc, NULL);
    struct item end = {0};
    if (write(q[1], &end, sizeof end) != sizeof end) FAIL("queue");
    pthread_join(tf, NULL);
    zcio_receiver_free(rx);
    for (int i = 0; i < kept; i++) {
        for (size_t k = 0; k < keep[i].len; k++)
            if (keep[i].data[k] != (unsigned char)((keep[i].off + k) * 7)) bad = 1;
        zcio_rx_chunk_free(keep[i].chunk);
    }
    if (got != TOTAL || bad) FAIL("received %zu of %d, corrupt %d", got, TOTAL, bad);
    printf("chunks freed on another thread: %zu bytes checked, %d freed after the receiver\n",
           got, kept);
    close(q[0]);
    close(q[1]);
}

static void *get_on_thread(void *arg) {
    zcio_pool *pool = arg;
    zcio_buf *b;
    if (zcio_pool_get(pool, &b) < 0) return (void *)1;
    const unsigned char *d = zcio_buf_data(b);
    int dirty = zcio_buf_len(b) != 0;
    for (size_t i = 0; i < zcio_buf_capacity(b); i++) dirty |= d[i] != 0;
    zcio_buf_free(b);
    return (void *)(intptr_t)dirty;
}

static void pool_buffers_come_back_empty(void) {
    zcio_pool *pool;
    if (zcio_pool_new(&pool, 4096, 1) < 0) FAIL("pool");
    zcio_buf *b;
    if (zcio_pool_get(pool, &b) < 0) FAIL("get");
    memset(zcio_buf_data(b), 0xAB, zcio_buf_capacity(b));
    if (zcio_buf_set_len(b, zcio_buf_capacity(b)) < 0) FAIL("set_len");
    zcio_buf_free(b);
    pthread_t t;
    void *dirty;
    pthread_create(&t, NULL, get_on_thread, pool);
    pthread_join(t, &dirty);
    if (dirty) FAIL("a buffer came back with a length or old bytes");
    zcio_pool_free(pool);
    printf("pool buffers come back empty and zeroed\n");
}

static void *post_later(void *arg) {
    usleep(20000);
    zcio_event_poster_post(arg, 7, 1);
    return NULL;
}

static void poster_from_another_thread(void) {
    zcio_event_ring *r;
    if (zcio_event_ring_new(&r, 0) < 0) FAIL("ring");
    zcio_event_poster *p;
    if (zcio_event_ring_poster(r, &p) < 0) FAIL("poster");
    pthread_t t;
    pthread_create(&t, NULL, post_later, p);
    zcio_event ev[4];
    int n = zcio_event_ring_wait(r, ev, 4, 5000);
    pthread_join(t, NULL);
    if (n != 1 || ev[0].token != 7) FAIL("wait: %d", n);
    zcio_event_poster_free(p);
    zcio_event_ring_free(r);
    printf("poster from another thread wakes the owner\n");
}

struct foreign {
    zcio_event_ring *ring;
    zcio_sender *sender;
    zcio_receiver *rx;
    zcio_pool *pool;
    int fd;
    int rc[8];
};

static void *use_from_other_thread(void *arg) {
    struct foreign *f = arg;
    zcio_event ev[2];
    zcio_event_stats st;
    f->rc[0] = zcio_event_ring_add(f->ring, f->fd, 1, 1);
    f->rc[1] = zcio_event_ring_wait(f->ring, ev, 2, 0);
    f->rc[2] = zcio_event_ring_stats(f->ring, &st);
    f->rc[3] = zcio_event_ring_close(f->ring, f->fd); /* must not take the fd */
    zcio_buf *b;
    if (zcio_pool_get(f->pool, &b) < 0) FAIL("get");
    zcio_buf_set_len(b, 10);
    f->rc[4] = zcio_sender_send(f->sender, b, NULL);
    zcio_buf_free(b); /* still ours after -EPERM */
    f->rc[5] = zcio_sender_poll(f->sender);
    zcio_rx_event rev;
    f->rc[6] = zcio_receiver_next_event(f->rx, &rev, 0);
    f->rc[7] = zcio_receiver_close(f->rx, 1);
    return NULL;
}

static void handles_refuse_other_threads(void) {
    struct foreign f = {0};
    if (zcio_event_ring_new(&f.ring, 0) < 0) FAIL("ring");
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) FAIL("socketpair");
    f.fd = sv[0];
    if (zcio_pool_new(&f.pool, 4096, 4) < 0) FAIL("pool");
    int tx[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, tx)) FAIL("socketpair");
    if (zcio_sender_new(&f.sender, tx[0], f.pool, ZCIO_TX_COPY) < 0) FAIL("sender");
    if (zcio_receiver_new(&f.rx, ZCIO_RX_PLAIN) < 0) FAIL("receiver");
    pthread_t t;
    pthread_create(&t, NULL, use_from_other_thread, &f);
    pthread_join(t, NULL);
    for (int i = 0; i < 8; i++)
        if (f.rc[i] != -EPERM) FAIL("call %d from another thread returned %d", i, f.rc[i]);
    /* The owner still can, and the fd was not taken. */
    if (zcio_event_ring_add(f.ring, sv[0], 4 /* EPOLLOUT */, 5) != 0) FAIL("owner add");
    zcio_event ev[2];
    if (zcio_event_ring_wait(f.ring, ev, 2, 1000) != 1 || ev[0].token != 5) FAIL("owner wait");
    if (zcio_event_ring_close(f.ring, sv[0]) != 0) FAIL("owner close");
    zcio_receiver_free(f.rx);
    zcio_sender_free(f.sender);
    zcio_pool_free(f.pool);
    zcio_event_ring_free(f.ring);
    close(sv[1]);
    close(tx[1]);
    printf("handles refuse other threads with -EPERM and take nothing\n");
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    chunks_freed_on_another_thread();
    pool_buffers_come_back_empty();
    poster_from_another_thread();
    handles_refuse_other_threads();
    printf("ok\n");
    return 0;
}

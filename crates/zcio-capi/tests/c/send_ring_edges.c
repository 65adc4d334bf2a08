/* send_ring_edges.c: the send ring's API edges from C, and its counters after a close.
 *
 * - adding a listening socket fails with -EINVAL, an unconnected one with -ENOTCONN;
 * - closing an id the ring never gave, or a socket closed already, fails with -ENOENT;
 * - zcio_send_ring_sock_path says "closed" once a socket is closed (while its last sends
 *   complete and after), NULL for an id the ring never gave;
 * - SOCKS loopback connections whose reader is paused get zero-copy sends until they are
 *   full; half are closed with their sends in flight (the ring resets them), then the reader
 *   reads every connection to its end. No completion claims a byte its reader did not get
 *   (the bytes the reset purged are not counted), the other sockets' completions add up to
 *   exactly what their readers received, and the ring's byte counter never exceeds what all
 *   readers received;
 * - no close sleeps (no voluntary context switch of this thread during the closes).
 * Prints "ok" at the end. Build: cc send_ring_edges.c $(pkg-config --cflags --libs zcio)
 * -lpthread */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zcio.h>

#define SOCKS 16
#define SIZE (64 * 1024)
#define CLOSED (SOCKS / 2)

static int srv[SOCKS];
static long long got[SOCKS];
static atomic_int paused = 1;

#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n");                                                           \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static void *reader(void *arg) {
    (void)arg;
    static unsigned char b[1 << 16];
    struct pollfd p[SOCKS];
    int open = SOCKS;
    while (atomic_load(&paused)) usleep(1000);
    for (int i = 0; i < SOCKS; i++) p[i] = (struct pollfd){.fd = srv[i], .events = POLLIN};
    while (open > 0) {
        if (poll(p, SOCKS, 20000) <= 0) break;
        for (int i = 0; i < SOCKS; i++) {
            if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t n = read(p[i].fd, b, sizeof b);
            if (n <= 0) { /* end of stream, or the reset */
                p[i].fd = -1;
                open--;
                continue;
            }
            got[i] += n;
        }
    }
    return NULL;
}

static long nvcsw(void) {
    struct rusage u;
    getrusage(RUSAGE_THREAD, &u);
    return u.ru_nvcsw;
}

int main(void) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    int small = 64 * 1024;
    setsockopt(l, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    CHECK(!bind(l, (struct sockaddr *)&a, sizeof a) && !listen(l, SOCKS) &&
              !getsockname(l, (struct sockaddr *)&a, &al),
          "listen: %s", strerror(errno));

    zcio_pool *pool;
    zcio_send_ring *ring;
    int rc = zcio_pool_new(&pool, SIZE, 256);
    CHECK(rc == 0, "pool: %s", strerror(-rc));
    rc = zcio_send_ring_new(&ring, 0, 0, 0);
    CHECK(rc == 0, "ring: %s", strerror(-rc));
    rc = zcio_send_ring_register_pool(ring, pool);
    CHECK(rc == 0, "register: %s", strerror(-rc));

    /* Sockets that cannot send are refused when added (the ring closes them). */
    uint64_t id;
    int lfd = dup(l);
    rc = zcio_send_ring_add(ring, lfd, ZCIO_TX_AUTO, 4, &id);
    CHECK(rc == -EINVAL, "adding a listening socket: %d", rc);
    rc = zcio_send_ring_add(ring, socket(AF_INET, SOCK_STREAM, 0), ZCIO_TX_AUTO, 4, &id);
    CHECK(rc == -ENOTCONN, "adding an unconnected socket: %d", rc);
    printf("listening socket refused (-EINVAL), unconnected socket refused (-ENOTCONN)\n");

    /* An id the ring never gave. */
    uint64_t never = ((uint64_t)77 << 32) | 4242;
    rc = zcio_send_ring_close(ring, never);
    CHECK(rc == -ENOENT, "closing an unknown id: %d", rc);
    CHECK(zcio_send_ring_sock_path(ring, never) == NULL, "a path for an unknown id");

    uint64_t sock[SOCKS];
    for (int i = 0; i < SOCKS; i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(c, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
        CHECK(!connect(c, (struct sockaddr *)&a, sizeof a), "connect: %s", strerror(errno));
        srv[i] = accept(l, NULL, NULL);
        CHECK(srv[i] >= 0, "accept");
        rc = zcio_send_ring_add(ring, c, ZCIO_TX_URING_ZC_FIXED, 8, &sock[i]);
        CHECK(rc == 0, "add: %s", strerror(-rc));
    }
    pthread_t t;
    pthread_create(&t, NULL, reader, NULL);

    /* Zero-copy sends until every socket is full (the reader does not read yet). */
    long long said[SOCKS] = {0};
    int outstanding = 0;
    for (int round = 0; round < 8; round++) {
        for (int i = 0; i < SOCKS; i++) {
            zcio_buf *b;
            if (zcio_pool_get(pool, &b) < 0) break;
            memset(zcio_buf_data(b), 'a' + i, SIZE);
            zcio_buf_set_len(b, SIZE);
            rc = zcio_send_ring_send(ring, sock[i], b, (uint64_t)i, NULL);
            if (rc == -EAGAIN) {
                zcio_buf_free(b);
                continue;
            }
            CHECK(rc == 0, "send: %s", strerror(-rc));
            outstanding++;
        }
        zcio_send_ring_submit(ring);
    }
    usleep(50 * 1000);
    zcio_send_ring_poll(ring);

    /* Close half with their sends in flight: never sleeping, a second close is an error,
       and the path says closed. */
    int in_flight = 0;
    for (int i = 0; i < CLOSED; i++) in_flight += zcio_send_ring_sock_in_flight(ring, sock[i]);
    CHECK(in_flight > 0, "nothing in flight to close over");
    long sw = nvcsw();
    for (int i = 0; i < CLOSED; i++) {
        rc = zcio_send_ring_close(ring, sock[i]);
        CHECK(rc == 0, "close: %s", strerror(-rc));
    }
    long slept = nvcsw() - sw;
    CHECK(slept == 0, "%ld closes slept", slept);
    for (int i = 0; i < CLOSED; i++) {
        rc = zcio_send_ring_close(ring, sock[i]);
        CHECK(rc == -ENOENT, "closing a closed socket again: %d", rc);
        const char *p = zcio_send_ring_sock_path(ring, sock[i]);
        CHECK(p && strcmp(p, "closed") == 0, "path of a closed socket: %s", p ? p : "NULL");
    }
    printf("%d sends in flight on %d sockets closed without sleeping; a second close is "
           "-ENOENT; their path is \"closed\"\n",
           in_flight, CLOSED);

    /* The reader reads from here on; every completion comes back. */
    atomic_store(&paused, 0);

    while (outstanding > 0) {
        CHECK(zcio_send_ring_wait(ring, 1000) >= 0, "wait");
        zcio_send_completion done;
        zcio_buf *back;
        zcio_rx_chunk *chunk;
        while (zcio_send_ring_next_completion(ring, &done, &back, &chunk) == 1) {
            int i = (int)done.token;
            said[i] += (long long)done.bytes;
            if (i >= CLOSED)
                CHECK(done.error == 0 && done.bytes == SIZE, "socket %d: %d", i, done.error);
            else
                CHECK(done.error == 0 || done.error == -ECANCELED, "socket %d: %d", i,
                      done.error);
            zcio_buf_free(back);
            outstanding--;
        }
    }
    for (int i = CLOSED; i < SOCKS; i++) {
        rc = zcio_send_ring_close(ring, sock[i]);
        CHECK(rc == 0, "close: %s", strerror(-rc));
    }
    CHECK(zcio_send_ring_flush(ring, 10000) == 0, "flush");
    zcio_report *rep;
    zcio_send_ring_report(ring, &rep);
    zcio_counters c;
    zcio_report_counters(rep, &c);
    zcio_report_free(rep);
    zcio_send_ring_free(ring);
    pthread_join(t, NULL);
    long long received = 0;
    long long closed_said = 0, closed_got = 0;
    for (int i = 0; i < SOCKS; i++) {
        if (i < CLOSED) {
            CHECK(said[i] <= got[i], "socket %d: completions say %lld bytes went, the peer got %lld",
                  i, said[i], got[i]);
            closed_said += said[i];
            closed_got += got[i];
        } else {
            CHECK(said[i] == got[i], "socket %d: completions say %lld bytes, the peer got %lld", i,
                  said[i], got[i]);
        }
        received += got[i];
    }
    CHECK((long long)c.bytes <= received, "the ring counted %llu bytes, the peers got %lld",
          (unsigned long long)c.bytes, received);
    CHECK((long long)(c.zerocopy_bytes + c.copied_bytes) <= received,
          "%llu zero-copy + %llu copied bytes counted, %lld received",
          (unsigned long long)c.zerocopy_bytes, (unsigned long long)c.copied_bytes, received);
    printf("counters after close: %llu bytes counted, %lld received (closed sockets: %lld "
           "counted, %lld received)\n",
           (unsigned long long)c.bytes, received, closed_said, closed_got);
    zcio_pool_free(pool);
    close(l);
    printf("ok\n");
    return 0;
}

/* send_ring.c: many sockets on one send ring from C.
 *
 * Opens SOCKS loopback TCP connections, adds them all to one zcio_send_ring (one io_uring,
 * one pool registration, one registered-file table), and sends ROUNDS buffers on each,
 * round-robin. A send the ring cannot queue now comes back with -EAGAIN and the buffer
 * stays ours: it is retried when zcio_send_ring_next_writable names the socket. A reader
 * thread checks every byte of every connection. Prints the ring's report (path, counters,
 * fallbacks) and each socket's path.
 *
 * With a memlock limit below the pool (run it as an unprivileged user under
 * `prlimit --memlock=...`) the pool registration fails: the program then prints the
 * recorded fallback, and every send still completes (zero-copy without fixed buffers).
 * Build: cc send_ring.c $(pkg-config --cflags --libs zcio) -lpthread */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zcio.h>

#define SOCKS 64
#define ROUNDS 32
#define SIZE (16 * 1024)

static int srv[SOCKS];
static long long got[SOCKS];
static int corrupt;

/* Byte k of connection c's stream. */
static unsigned char pat(int c, long long k) { return (unsigned char)(k * 7 + c * 13); }

static void *reader(void *arg) {
    (void)arg;
    static unsigned char b[1 << 16];
    struct pollfd p[SOCKS];
    int open = SOCKS;
    for (int i = 0; i < SOCKS; i++) p[i] = (struct pollfd){.fd = srv[i], .events = POLLIN};
    while (open > 0) {
        if (poll(p, SOCKS, 10000) <= 0) break;
        for (int i = 0; i < SOCKS; i++) {
            if (!(p[i].revents & (POLLIN | POLLHUP))) continue;
            ssize_t n = read(p[i].fd, b, sizeof b);
            if (n <= 0) {
                p[i].fd = -1;
                open--;
                continue;
            }
            for (ssize_t k = 0; k < n; k++)
                if (b[k] != pat(i, got[i] + k)) corrupt = 1;
            got[i] += n;
        }
    }
    return NULL;
}

static void print_report(zcio_report *rep, const char *what) {
    zcio_counters c;
    zcio_report_counters(rep, &c);
    printf("%s: path %s, %llu bytes, %llu ops, %llu syscalls\n", what, zcio_report_path(rep),
           (unsigned long long)c.bytes, (unsigned long long)c.ops,
           (unsigned long long)c.syscalls);
    for (size_t i = 0; i < zcio_report_fallback_count(rep); i++) {
        zcio_fallback f;
        zcio_report_fallback(rep, i, &f);
        printf("  fallback %s -> %s: %s\n", f.from, f.to, f.reason);
    }
}

int main(void) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, SOCKS) ||
        getsockname(l, (struct sockaddr *)&a, &al))
        return 1;
    int cli[SOCKS];
    for (int i = 0; i < SOCKS; i++) {
        cli[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(cli[i], (struct sockaddr *)&a, sizeof a)) return 1;
        srv[i] = accept(l, NULL, NULL);
        if (srv[i] < 0) return 1;
    }
    pthread_t t;
    pthread_create(&t, NULL, reader, NULL);

    zcio_pool *pool;
    zcio_send_ring *ring;
    int rc = zcio_pool_new(&pool, SIZE, 256);
    if (rc < 0 || (rc = zcio_send_ring_new(&ring, 0, 0, 0)) < 0) {
        fprintf(stderr, "set-up failed: %s\n", strerror(-rc));
        return 1;
    }
    rc = zcio_send_ring_register_pool(ring, pool);
    if (rc < 0) printf("pool not registered: %s (recorded as a fallback)\n", strerror(-rc));
    uint64_t sock[SOCKS];
    for (int i = 0; i < SOCKS; i++) {
        /* The ring owns the descriptor from here on. */
        if ((rc = zcio_send_ring_add(ring, cli[i], ZCIO_TX_AUTO, 4, &sock[i])) < 0) {
            fprintf(stderr, "add: %s\n", strerror(-rc));
            return 1;
        }
    }
    printf("socket 0 path %s\n", zcio_send_ring_sock_path(ring, sock[0]));

    long long off[SOCKS] = {0};
    int sent[SOCKS] = {0};
    zcio_buf *held[SOCKS] = {0}; /* a buffer the ring refused, to send again */
    int completions = 0, refusals = 0, total = SOCKS * ROUNDS;
    while (completions < total) {
        for (int i = 0; i < SOCKS; i++) {
            if (sent[i] == ROUNDS) continue;
            zcio_buf *b = held[i];
            if (!b) {
                if (zcio_pool_get(pool, &b) < 0) break; /* every buffer out: collect first */
                unsigned char *d = zcio_buf_data(b);
                for (long long k = 0; k < SIZE; k++) d[k] = pat(i, off[i] + k);
                zcio_buf_set_len(b, SIZE);
            }
            rc = zcio_send_ring_send(ring, sock[i], b, (uint64_t)i, NULL);
            if (rc == -EAGAIN) {
                held[i] = b; /* still ours */
                refusals++;
                continue;
            }
            if (rc < 0) {
                fprintf(stderr, "send: %s\n", strerror(-rc));
                return 1;
            }
            held[i] = NULL;
            off[i] += SIZE;
            sent[i]++;
        }
        zcio_send_ring_submit(ring); /* one io_uring_enter for all sockets */
        if (zcio_send_ring_wait(ring, 1000) < 0) return 1;
        zcio_send_completion done;
        zcio_buf *back;
        zcio_rx_chunk *chunk;
        while (zcio_send_ring_next_completion(ring, &done, &back, &chunk) == 1) {
            if (done.error || done.bytes != SIZE) {
                fprintf(stderr, "send on socket %llu failed: %s\n",
                        (unsigned long long)done.token, strerror(-done.error));
                return 1;
            }
            zcio_buf_free(back);
            completions++;
        }
        uint64_t w;
        while (zcio_send_ring_next_writable(ring, &w) == 1) {
        }
    }
    if ((rc = zcio_send_ring_flush(ring, 10000)) < 0) return 1;
    zcio_report *rep;
    zcio_send_ring_report(ring, &rep);
    print_report(rep, "ring");
    zcio_report_free(rep);
    zcio_send_ring_sock_report(ring, sock[0], &rep);
    print_report(rep, "socket 0");
    zcio_report_free(rep);
    for (int i = 0; i < SOCKS; i++) zcio_send_ring_close(ring, sock[i]);
    zcio_send_ring_free(ring); /* closes the sockets: the reader sees end of stream */
    pthread_join(t, NULL);
    long long bytes = 0;
    for (int i = 0; i < SOCKS; i++) {
        if (got[i] != (long long)ROUNDS * SIZE) corrupt = 1;
        bytes += got[i];
    }
    zcio_pool_free(pool);
    printf("sockets %d completions %d refusals %d bytes %lld\n", SOCKS, completions, refusals,
           bytes);
    if (corrupt) {
        printf("corrupt\n");
        return 1;
    }
    printf("ok\n");
    return 0;
}

/* send_hdr.c: a header and a body as one send, from C.
 *
 * Sends ROUNDS messages on a loopback TCP connection, each a HDR-byte header (built on the
 * stack, copied by the call) followed by a pool buffer of SIZE bytes, with
 * zcio_send_ring_send_hdr: one request per message (SEND_ZC with IORING_SEND_VECTORIZED, or
 * SENDMSG_ZC with an iovec), instead of two sends or a copy of the body behind the header.
 * The body buffer comes back with the completion. A reader thread checks every byte.
 * Build: cc send_hdr.c $(pkg-config --cflags --libs zcio) -lpthread */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zcio.h>

#define ROUNDS 64
#define HDR 256
#define SIZE (16 * 1024)

static int srv;
static long long got;
static int corrupt;

static unsigned char pat(long long k) { return (unsigned char)(k * 7 + (k >> 9)); }

static void *reader(void *arg) {
    (void)arg;
    static unsigned char b[1 << 16];
    ssize_t n;
    while ((n = read(srv, b, sizeof b)) > 0) {
        for (ssize_t k = 0; k < n; k++)
            if (b[k] != pat(got + k)) corrupt = 1;
        got += n;
    }
    return NULL;
}

int main(void) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1) ||
        getsockname(l, (struct sockaddr *)&a, &al))
        return 1;
    int cli = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(cli, (struct sockaddr *)&a, sizeof a)) return 1;
    srv = accept(l, NULL, NULL);
    pthread_t t;
    pthread_create(&t, NULL, reader, NULL);

    zcio_pool *pool;
    zcio_send_ring *ring;
    int rc = zcio_pool_new(&pool, SIZE, ROUNDS);
    if (rc < 0 || (rc = zcio_send_ring_new(&ring, 0, 0, 0)) < 0) return 1;
    zcio_send_ring_register_pool(ring, pool);
    uint64_t sock;
    if ((rc = zcio_send_ring_add(ring, cli, ZCIO_TX_URING_ZC, ROUNDS, &sock)) < 0) {
        fprintf(stderr, "add: %s\n", strerror(-rc));
        return 1;
    }
    long long off = 0;
    for (int i = 0; i < ROUNDS; i++) {
        unsigned char hdr[HDR];
        for (int k = 0; k < HDR; k++) hdr[k] = pat(off + k);
        zcio_buf *b;
        if (zcio_pool_get(pool, &b) < 0) return 1;
        unsigned char *d = zcio_buf_data(b);
        for (long long k = 0; k < SIZE; k++) d[k] = pat(off + HDR + k);
        zcio_buf_set_len(b, SIZE);
        if ((rc = zcio_send_ring_send_hdr(ring, sock, hdr, HDR, b, (uint64_t)i, NULL)) < 0) {
            fprintf(stderr, "send_hdr: %s\n", strerror(-rc));
            return 1;
        }
        off += HDR + SIZE;
    }
    if (zcio_send_ring_flush(ring, 10000) < 0) return 1;
    int completions = 0, bodies = 0;
    zcio_send_completion done;
    zcio_buf *back;
    zcio_rx_chunk *chunk;
    while (zcio_send_ring_next_completion(ring, &done, &back, &chunk) == 1) {
        if (done.error || done.bytes != HDR + SIZE) {
            fprintf(stderr, "send %llu failed: %s\n", (unsigned long long)done.token,
                    strerror(-done.error));
            return 1;
        }
        if (back) {
            bodies++;
            zcio_buf_free(back);
        }
        completions++;
    }
    printf("socket path %s\n", zcio_send_ring_sock_path(ring, sock));
    zcio_send_ring_free(ring); /* closes the socket: the reader sees end of stream */
    pthread_join(t, NULL);
    zcio_pool_free(pool);
    printf("completions %d bodies back %d bytes %lld\n", completions, bodies, got);
    if (corrupt || got != off || bodies != ROUNDS) {
        printf("mismatch\n");
        return 1;
    }
    printf("ok\n");
    return 0;
}

/* send_to.c: one unconnected UDP socket, many peers, GSO trains, from C.
 *
 * Binds PEERS loopback receivers and one unconnected sender socket on a zcio_send_ring, and
 * sends TRAINS trains to every peer with zcio_send_ring_send_to: each train is one buffer cut
 * by the kernel into datagrams of that peer's segment size (UDP_SEGMENT), sent to the peer
 * named in the message (SENDMSG_ZC on the ring). One train goes to the broadcast address,
 * which the socket may not send to (no SO_BROADCAST): it alone fails (EACCES in its
 * completion), every other train arrives. Each receiver
 * checks that every datagram is its own and has its segment size.
 * Build: cc send_to.c $(pkg-config --cflags --libs zcio) */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zcio.h>

#define PEERS 16
#define TRAINS 4
#define SEGS 5

static int seg_of(int p) { return 1000 + 16 * p; }

int main(void) {
    int rx[PEERS];
    struct sockaddr_in to[PEERS];
    for (int p = 0; p < PEERS; p++) {
        rx[p] = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
        to[p] = (struct sockaddr_in){.sin_family = AF_INET,
                                     .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t l = sizeof to[p];
        if (bind(rx[p], (struct sockaddr *)&to[p], sizeof to[p]) ||
            getsockname(rx[p], (struct sockaddr *)&to[p], &l))
            return 1;
    }
    int tx = socket(AF_INET, SOCK_DGRAM, 0);
    zcio_pool *pool;
    zcio_send_ring *ring;
    int rc = zcio_pool_new(&pool, 64 * 1024, PEERS * TRAINS + 1);
    if (rc < 0 || (rc = zcio_send_ring_new(&ring, 0, 0, 0)) < 0) {
        fprintf(stderr, "set-up failed: %s\n", strerror(-rc));
        return 1;
    }
    zcio_send_ring_register_pool(ring, pool); /* a failure is a recorded fallback */
    uint64_t sock;
    if ((rc = zcio_send_ring_add(ring, tx, ZCIO_TX_AUTO, 1024, &sock)) < 0) {
        fprintf(stderr, "add: %s\n", strerror(-rc));
        return 1;
    }
    int trains = 0;
    for (int t = 0; t < TRAINS; t++)
        for (int p = 0; p < PEERS; p++) {
            zcio_buf *b;
            if (zcio_pool_get(pool, &b) < 0) return 1;
            unsigned char *d = zcio_buf_data(b);
            size_t len = (size_t)seg_of(p) * SEGS;
            memset(d, p, len);
            zcio_buf_set_len(b, len);
            /* ECN ECT(0) on every datagram. */
            rc = zcio_send_ring_send_to(ring, sock, b, &to[p], sizeof to[p],
                                        (uint16_t)seg_of(p), 2, (uint64_t)p, NULL);
            if (rc < 0) {
                fprintf(stderr, "send_to: %s\n", strerror(-rc));
                return 1;
            }
            trains++;
        }
    /* A destination the kernel refuses for this socket (broadcast without SO_BROADCAST). */
    struct sockaddr_in nowhere = {.sin_family = AF_INET, .sin_port = htons(9),
                                  .sin_addr.s_addr = htonl(INADDR_BROADCAST)};
    zcio_buf *b;
    if (zcio_pool_get(pool, &b) < 0) return 1;
    zcio_buf_set_len(b, 3000);
    if (zcio_send_ring_send_to(ring, sock, b, &nowhere, sizeof nowhere, 1000,
                               -1, 999, NULL) < 0)
        return 1;
    if ((rc = zcio_send_ring_flush(ring, 10000)) < 0) return 1;
    int ok = 0, unreachable = 0;
    zcio_send_completion done;
    zcio_buf *back;
    zcio_rx_chunk *chunk;
    while (zcio_send_ring_next_completion(ring, &done, &back, &chunk) == 1) {
        if (done.token == 999 && done.error == -EACCES)
            unreachable++;
        else if (done.error == 0 && done.bytes == done.len)
            ok++;
        else
            fprintf(stderr, "train to peer %llu failed: %s\n", (unsigned long long)done.token,
                    strerror(-done.error));
        zcio_buf_free(back);
    }
    int datagrams = 0, bad = 0;
    static unsigned char r[65536];
    for (int p = 0; p < PEERS; p++) {
        ssize_t n;
        while ((n = recv(rx[p], r, sizeof r, 0)) > 0) {
            if (n != seg_of(p) || r[0] != p || r[n - 1] != p) bad++;
            datagrams++;
        }
    }
    printf("socket path %s\n", zcio_send_ring_sock_path(ring, sock));
    zcio_send_ring_free(ring);
    zcio_pool_free(pool);
    printf("trains %d completed %d unreachable %d datagrams %d\n", trains, ok, unreachable,
           datagrams);
    if (ok != trains || unreachable != 1 || bad || datagrams != PEERS * TRAINS * SEGS) {
        printf("mismatch\n");
        return 1;
    }
    printf("ok\n");
    return 0;
}

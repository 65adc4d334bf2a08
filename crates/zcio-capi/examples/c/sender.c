/* sender.c: zero-copy send from C with zcio's sender.
 *
 * Connects a TCP socket over loopback, sends 16 buffers of 64 KiB from a pool (path chosen by
 * ZCIO_TX_AUTO; on loopback the kernel copies, and the completions say so), reads them on the
 * other end in a thread, checks every byte, and prints each completion.
 * Build: cc sender.c $(pkg-config --cflags --libs zcio) -lpthread */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zcio.h>

#define BUFS 16
#define SIZE (64 * 1024)

static long long received;
static int corrupt;

static void *reader(void *arg) {
    int fd = *(int *)arg;
    static unsigned char b[1 << 16];
    long long off = 0;
    ssize_t n;
    while ((n = read(fd, b, sizeof b)) > 0) {
        for (ssize_t i = 0; i < n; i++)
            if (b[i] != (unsigned char)((off + i) * 7)) corrupt = 1;
        off += n;
    }
    received = off;
    return NULL;
}

int main(void) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1) ||
        getsockname(l, (struct sockaddr *)&a, &al))
        return 1;
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a)) return 1;
    int srv = accept(l, NULL, NULL);
    pthread_t t;
    pthread_create(&t, NULL, reader, &srv);

    zcio_pool *pool;
    zcio_sender *tx;
    int rc = zcio_pool_new(&pool, SIZE, BUFS);
    if (rc < 0 || (rc = zcio_sender_new(&tx, c, pool, ZCIO_TX_AUTO)) < 0) {
        fprintf(stderr, "set-up failed: %s\n", strerror(-rc));
        return 1;
    }
    printf("path %s\n", zcio_sender_path(tx));
    long long off = 0;
    for (int i = 0; i < BUFS; i++) {
        zcio_buf *b;
        if ((rc = zcio_pool_get(pool, &b)) < 0) return 1;
        unsigned char *d = zcio_buf_data(b);
        for (size_t k = 0; k < SIZE; k++) d[k] = (unsigned char)((off + k) * 7);
        zcio_buf_set_len(b, SIZE);
        off += SIZE;
        uint64_t ticket;
        if ((rc = zcio_sender_send(tx, b, &ticket)) < 0) return 1;
    }
    if ((rc = zcio_sender_flush(tx, 10000)) < 0) {
        fprintf(stderr, "flush: %s\n", strerror(-rc));
        return 1;
    }
    zcio_tx_completion done;
    zcio_buf *back;
    int completions = 0;
    long long bytes = 0;
    while (zcio_sender_next_completion(tx, &done, &back) == 1) {
        if (done.error) {
            fprintf(stderr, "send %llu failed: %s\n", (unsigned long long)done.ticket,
                    strerror(-done.error));
            return 1;
        }
        printf("ticket %llu: %zu bytes, path %u, zerocopy %u\n", (unsigned long long)done.ticket,
               done.bytes, done.path, done.zerocopy);
        bytes += done.bytes;
        completions++;
        zcio_buf_free(back);
    }
    zcio_sender_free(tx); /* closes the socket: the reader sees EOF */
    pthread_join(t, NULL);
    zcio_pool_free(pool);
    printf("completions %d, sent %lld, received %lld, corrupt %d\n", completions, bytes, received,
           corrupt);
    if (completions != BUFS || bytes != off || received != off || corrupt) return 1;
    printf("ok\n");
    return 0;
}

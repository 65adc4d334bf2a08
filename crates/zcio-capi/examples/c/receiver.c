/* receiver.c: receiving from C with zcio's receiver.
 *
 * Listens on loopback, lets the receiver accept (multishot accept on the ring paths), sends
 * 1 MiB from a client thread, and checks every byte of the chunks it receives; chunks are
 * borrowed from the receiver's buffers and handed back with zcio_rx_chunk_free.
 * Usage: receiver [auto|zcrx|bufring|plain]   (the receive path to ask for; default auto)
 * Build: cc receiver.c $(pkg-config --cflags --libs zcio) -lpthread */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zcio.h>

#define TOTAL (1 << 20)

static struct sockaddr_in addr;

static void *client(void *arg) {
    (void)arg;
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&addr, sizeof addr)) return NULL;
    static unsigned char b[TOTAL];
    for (size_t i = 0; i < TOTAL; i++) b[i] = (unsigned char)(i * 13);
    size_t off = 0;
    while (off < TOTAL) {
        ssize_t n = write(c, b + off, TOTAL - off);
        if (n <= 0) break;
        off += (size_t)n;
    }
    close(c);
    return NULL;
}

int main(int argc, char **argv) {
    static const struct { const char *name; uint32_t mode; } modes[] = {
        {"auto", ZCIO_RX_AUTO}, {"zcrx", ZCIO_RX_ZCRX},
        {"bufring", ZCIO_RX_BUFRING}, {"plain", ZCIO_RX_PLAIN},
    };
    uint32_t mode = ZCIO_RX_AUTO;
    if (argc > 1) {
        size_t k = 0;
        while (k < sizeof modes / sizeof modes[0] && strcmp(argv[1], modes[k].name)) k++;
        if (k == sizeof modes / sizeof modes[0]) {
            fprintf(stderr, "usage: %s [auto|zcrx|bufring|plain]\n", argv[0]);
            return 2;
        }
        mode = modes[k].mode;
    }
    int l = socket(AF_INET, SOCK_STREAM, 0);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof addr;
    if (bind(l, (struct sockaddr *)&addr, sizeof addr) || listen(l, 4) ||
        getsockname(l, (struct sockaddr *)&addr, &al))
        return 1;
    zcio_receiver *rx;
    int rc = zcio_receiver_listen(&rx, l, mode);
    if (rc < 0) {
        fprintf(stderr, "receiver: %s\n", strerror(-rc));
        return 1;
    }
    printf("path %s\n", zcio_receiver_path(rx));
    pthread_t t;
    pthread_create(&t, NULL, client, NULL);
    size_t got = 0;
    int chunks = 0, bad = 0, closed = 0, accepted = 0;
    while (!closed) {
        zcio_rx_event ev;
        rc = zcio_receiver_next_event(rx, &ev, 5000);
        if (rc <= 0) {
            fprintf(stderr, "next_event: %s\n", rc ? strerror(-rc) : "timed out");
            return 1;
        }
        if (ev.kind == ZCIO_RX_ACCEPTED) accepted++;
        if (ev.kind == ZCIO_RX_DATA) {
            const unsigned char *d = ev.data;
            for (size_t i = 0; i < ev.len; i++)
                if (d[i] != (unsigned char)((got + i) * 13)) bad = 1;
            got += ev.len;
            chunks++;
            zcio_rx_chunk_free(ev.chunk);
        }
        if (ev.kind == ZCIO_RX_CLOSED) closed = ev.error == 0 ? 1 : -1;
    }
    pthread_join(t, NULL);
    zcio_receiver_free(rx);
    printf("accepted %d, chunks %d, bytes %zu, corrupt %d, clean close %d\n", accepted, chunks,
           got, bad, closed == 1);
    if (accepted != 1 || got != TOTAL || bad || closed != 1) return 1;
    printf("ok\n");
    return 0;
}

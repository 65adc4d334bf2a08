/* nfqueue.c: an NFQUEUE consumer in C with zcio's frame ring and batch verdicts.
 *
 * Usage: nfqueue QUEUE — with a rule such as
 *   iptables -A OUTPUT -o lo -p udp --dport 9999 -j NFQUEUE --queue-num QUEUE
 * it sends 20 UDP datagrams to 127.0.0.1:9999, decides each queued packet (odd payload byte:
 * drop, even: accept with mark 7), and checks that exactly the accepted ones arrive.
 * Needs CAP_NET_ADMIN (run it in a network namespace).
 * Build: cc nfqueue.c $(pkg-config --cflags --libs zcio) */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <zcio.h>

#define N 20

struct tally {
    int seen, accepted, dropped;
};

static int decide(const zcio_nfq_packet *p, zcio_nfq_verdict *v, void *user) {
    struct tally *t = user;
    const unsigned char *d = p->payload;
    t->seen++;
    /* IPv4 + UDP headers (20 + 8 bytes), then our one payload byte. */
    if (!d || p->payload_len < 29) return -1;
    if (d[28] % 2) {
        v->verdict = ZCIO_NF_DROP;
        t->dropped++;
    } else {
        v->verdict = ZCIO_NF_ACCEPT;
        v->set_mark = 1;
        v->mark = 7;
        t->accepted++;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: nfqueue QUEUE\n");
        return 2;
    }
    unsigned q = (unsigned)atoi(argv[1]);
    zcio_nfqueue *nfq;
    int rc = zcio_nfqueue_open(&nfq, (uint16_t)q, (uint16_t)q);
    if (rc < 0) {
        fprintf(stderr, "zcio_nfqueue_open: %s\n", strerror(-rc));
        return 1;
    }
    printf("queue %u via %s\n", q, zcio_nfqueue_path(nfq));

    int rx = socket(AF_INET, SOCK_DGRAM, 0), tx = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(9999),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(rx, (struct sockaddr *)&a, sizeof a)) return 1;
    struct timeval tv = {0, 200 * 1000};
    setsockopt(rx, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (unsigned char i = 0; i < N; i++)
        if (sendto(tx, &i, 1, 0, (struct sockaddr *)&a, sizeof a) != 1) return 1;

    struct tally t = {0, 0, 0};
    for (int round = 0; round < 50 && t.seen < N; round++) {
        rc = zcio_nfqueue_process(nfq, 100, decide, &t);
        if (rc < 0) {
            fprintf(stderr, "process: %s\n", strerror(-rc));
            return 1;
        }
    }
    int arrived = 0, wrong = 0;
    unsigned char b;
    while (recv(rx, &b, 1, 0) == 1) {
        arrived++;
        if (b % 2) wrong++;
    }
    zcio_nfqueue_free(nfq);
    printf("seen %d, accepted %d, dropped %d, arrived %d, wrong %d\n", t.seen, t.accepted,
           t.dropped, arrived, wrong);
    if (t.seen != N || arrived != t.accepted || wrong || t.accepted != N / 2) return 1;
    printf("ok\n");
    return 0;
}

/* nfqueue_held.c: NFQUEUE packets received held, in batches, and decided afterwards — the
 * shape language bindings use (the Go module): zcio_nfqueue_receive hands over up to 64
 * packets whose payloads stay readable until their verdicts, zcio_nfqueue_decide gives a
 * whole batch its verdicts in one call, zcio_nfqueue_verdict one packet a new payload.
 *
 * Usage: nfqueue_held QUEUE — with a rule such as
 *   iptables -A OUTPUT -o lo -p udp --dport 9999 -j NFQUEUE --queue-num QUEUE
 * it sends 20 one-byte UDP datagrams to 127.0.0.1:9999, holds them all, reads every payload
 * after the last receive, drops the odd ones, accepts the even ones with mark 7 except
 * byte 0, which is rewritten to 100 (checksums fixed by zcio_fix_checksums), and checks
 * what arrives.
 * Needs CAP_NET_ADMIN (run it in a network namespace).
 * Build: cc nfqueue_held.c $(pkg-config --cflags --libs zcio) */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <zcio.h>

#define N 20

/* Another thread's calls are refused with -EPERM and a reason, touching nothing. */
static void *other_thread(void *q) {
    zcio_nfq_held h;
    zcio_nfq_decision d = {0};
    int rc = zcio_nfqueue_receive(q, 0, &h, 1);
    const char *why = zcio_last_error();
    int ok = rc == -EPERM && why && strstr(why, "thread") &&
             zcio_nfqueue_decide(q, &d, 1) == -EPERM && zcio_nfqueue_flush(q) == -EPERM;
    return ok ? q : NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: nfqueue_held QUEUE\n");
        return 2;
    }
    unsigned q = (unsigned)atoi(argv[1]);

    /* A bad flag is refused with a reason. */
    zcio_nfqueue *nfq;
    zcio_nfqueue_config cfg = {.first = (uint16_t)q, .last = (uint16_t)q, .flags = 1u << 20};
    int rc = zcio_nfqueue_open_config(&nfq, &cfg);
    const char *why = zcio_last_error();
    if (rc != -EINVAL || !why || !strstr(why, "unsupported queue flags")) {
        fprintf(stderr, "bad flags: rc %d, reason %s\n", rc, why ? why : "(none)");
        return 1;
    }
    printf("bad flags refused: %s\n", why);

    cfg.flags = 0;
    cfg.copy_mode = ZCIO_NFQ_COPY_PACKET;
    cfg.copy_range = 512;
    cfg.max_len = 256;
    rc = zcio_nfqueue_open_config(&nfq, &cfg);
    if (rc < 0) {
        fprintf(stderr, "zcio_nfqueue_open_config: %s: %s\n", strerror(-rc),
                zcio_last_error() ? zcio_last_error() : "");
        return 1;
    }

    pthread_t th;
    void *res = NULL;
    if (pthread_create(&th, NULL, other_thread, nfq) || pthread_join(th, &res) || res != nfq) {
        fprintf(stderr, "another thread's calls were not refused with -EPERM\n");
        return 1;
    }
    printf("another thread: refused\n");

    int rx = socket(AF_INET, SOCK_DGRAM, 0), tx = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(9999),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(rx, (struct sockaddr *)&a, sizeof a)) return 1;
    struct timeval tv = {0, 200 * 1000};
    setsockopt(rx, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (unsigned char i = 0; i < N; i++)
        if (sendto(tx, &i, 1, 0, (struct sockaddr *)&a, sizeof a) != 1) return 1;

    /* Hold all of them (several receives), then read every payload: still there. */
    zcio_nfq_held held[N];
    int got = 0;
    for (int round = 0; round < 50 && got < N; round++) {
        rc = zcio_nfqueue_receive(nfq, 100, held + got, (size_t)(N - got));
        if (rc < 0) {
            fprintf(stderr, "receive: %s\n", strerror(-rc));
            return 1;
        }
        got += rc;
    }
    zcio_nfq_decision d[N];
    int n = 0, rewritten = -1;
    for (int i = 0; i < got; i++) {
        const unsigned char *p = held[i].payload;
        if (!p || held[i].payload_len != 29) return 1;
        if (p[28] == 0) {
            unsigned char pkt[29];
            memcpy(pkt, p, sizeof pkt);
            pkt[28] = 100;
            /* The kernel checks the sums of a rewritten packet: make them valid. */
            if (zcio_fix_checksums(pkt, sizeof pkt) < 0) return 1;
            rc = zcio_nfqueue_verdict(nfq, held[i].queue, held[i].id, ZCIO_NF_ACCEPT, 0, 0, pkt,
                                      sizeof pkt);
            if (rc < 0) return 1;
            rewritten = (int)held[i].id;
            continue;
        }
        d[n] = (zcio_nfq_decision){.queue = held[i].queue, .id = held[i].id,
                                   .verdict = p[28] % 2 ? ZCIO_NF_DROP : ZCIO_NF_ACCEPT,
                                   .set_mark = !(p[28] % 2), .mark = 7};
        n++;
    }
    rc = zcio_nfqueue_decide(nfq, d, (size_t)n);
    /* Deciding again is refused per entry: the packets are no longer held. */
    int again = zcio_nfqueue_decide(nfq, d, 1);
    if (rc != n || again != 0 || d[0].result != -ENOENT || rewritten < 0) {
        fprintf(stderr, "decide: %d of %d, again %d (%d)\n", rc, n, again, d[0].result);
        return 1;
    }
    if (zcio_nfqueue_flush(nfq) < 0) return 1;
    zcio_nfq_stats st;
    if (zcio_nfqueue_get_stats(nfq, &st) < 0) return 1;

    int arrived = 0, wrong = 0, hundred = 0;
    unsigned char b;
    while (recv(rx, &b, 1, 0) == 1) {
        arrived++;
        if (b == 100) hundred++;
        else if (b % 2) wrong++;
    }
    zcio_nfqueue_free(nfq);
    printf("held %d, decided %d, arrived %d (rewritten %d), wrong %d, received %llu\n", got,
           n + 1, arrived, hundred, wrong, (unsigned long long)st.received);
    if (got != N || arrived != N / 2 || hundred != 1 || wrong || st.received != N) return 1;
    printf("ok\n");
    return 0;
}

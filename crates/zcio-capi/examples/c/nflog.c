/* nflog.c: an NFLOG consumer in C on zcio's frame ring.
 *
 * Usage: nflog GROUP — with a rule such as
 *   iptables -A OUTPUT -o lo -p udp --dport 9998 -j NFLOG --nflog-group GROUP --nflog-prefix c-example
 * it sends 10 UDP datagrams to 127.0.0.1:9998 and checks that each is logged once, in order,
 * with its bytes and the rule's prefix, and that nothing was lost.
 * Needs CAP_NET_ADMIN (run it in a network namespace).
 * Build: cc nflog.c $(pkg-config --cflags --libs zcio) */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zcio.h>

#define N 10

struct tally {
    int seen, bad;
};

static int on_packet(const zcio_nflog_packet *p, void *user) {
    struct tally *t = user;
    const unsigned char *d = p->payload;
    /* IPv4 + UDP headers (20 + 8 bytes), then our payload: the sequence number, 4 bytes. */
    if (!d || p->payload_len != 20 + 8 + 4 || !p->prefix || p->prefix_len != 9 ||
        memcmp(p->prefix, "c-example", 9) != 0 || !p->has_seq || p->seq != (uint32_t)t->seen) {
        t->bad++;
    } else {
        uint32_t seq;
        memcpy(&seq, d + 28, 4);
        if (ntohl(seq) != (uint32_t)t->seen) t->bad++;
    }
    t->seen++;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: nflog GROUP\n");
        return 2;
    }
    uint16_t group = (uint16_t)atoi(argv[1]);
    zcio_nflog *log;
    int rc = zcio_nflog_open(&log, &group, 1, 128);
    if (rc < 0) {
        fprintf(stderr, "zcio_nflog_open: %s\n", strerror(-rc));
        return 1;
    }
    printf("group %u via %s\n", group, zcio_nflog_path(log));
    int tx = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(9998),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (uint32_t i = 0; i < N; i++) {
        uint32_t seq = htonl(i);
        if (sendto(tx, &seq, 4, 0, (struct sockaddr *)&a, sizeof a) != 4) return 1;
    }
    struct tally t = {0, 0};
    for (int round = 0; round < 100 && t.seen < N; round++) {
        rc = zcio_nflog_process(log, 50, on_packet, &t);
        if (rc < 0) {
            fprintf(stderr, "process: %s\n", strerror(-rc));
            return 1;
        }
    }
    zcio_nflog_stats st;
    if (zcio_nflog_get_stats(log, &st) < 0) return 1;
    /* The report: the same path and counters, every fallback with its reason, stats as JSON. */
    zcio_report *rep;
    if (zcio_nflog_report(log, &rep) < 0) return 1;
    zcio_counters c;
    zcio_report_counters(rep, &c);
    printf("report: path %s, ops %llu, fallbacks %zu\n", zcio_report_path(rep),
           (unsigned long long)c.ops, (size_t)zcio_report_fallback_count(rep));
    int report_ok = strcmp(zcio_report_path(rep), zcio_nflog_path(log)) == 0 &&
                    c.ops == st.packets && strstr(zcio_report_json(rep), "\"packets\":") != NULL &&
                    /* What is known of the loss: nothing lost, exactly. */
                    strstr(zcio_report_json(rep), "\"loss\":{\"at_least\":0,\"at_most\":0,\"exact\":true}") != NULL;
    zcio_report_free(rep);
    zcio_nflog_free(log);
    if (!report_ok) return 1;
    printf("logged %d, bad %d, packets %llu, lost %llu, overruns %llu\n", t.seen, t.bad,
           (unsigned long long)st.packets, (unsigned long long)st.lost,
           (unsigned long long)st.overruns);
    if (t.seen != N || t.bad || st.packets != N || st.lost || st.overruns) return 1;
    printf("ok\n");
    return 0;
}

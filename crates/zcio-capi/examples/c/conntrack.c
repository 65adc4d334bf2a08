/* conntrack.c: conntrack events in C, each with its `conntrack -E` line.
 *
 * Usage: conntrack — with conntrack active (e.g. iptables -A INPUT -m conntrack --ctstate NEW
 * -j ACCEPT) it makes 5 UDP flows to 127.0.0.1:9997 and checks that each one's NEW event
 * arrives, with its tuple and its line, and that nothing was lost.
 * Needs CAP_NET_ADMIN (run it in a network namespace).
 * Build: cc conntrack.c $(pkg-config --cflags --libs zcio) */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zcio.h>

#define N 5

struct tally {
    int flows, bad;
};

static int on_event(const zcio_ct_event *e, void *user) {
    struct tally *t = user;
    if (e->kind != ZCIO_CT_NEW || e->orig.proto != 17 || e->orig.dport != 9997) return 0;
    const unsigned char lo[4] = {127, 0, 0, 1};
    if (e->family != 2 || memcmp(e->orig.dst, lo, 4) != 0 || !e->line ||
        !strstr(e->line, "[NEW] udp") || !strstr(e->line, "dport=9997 [UNREPLIED]"))
        t->bad++;
    else
        printf("%s\n", e->line);
    t->flows++;
    return 0;
}

int main(void) {
    zcio_ctevents *ev;
    int rc = zcio_ctevents_open(&ev, ZCIO_CT_NEW | ZCIO_CT_DESTROY | ZCIO_CT_LINES, 0);
    if (rc < 0) {
        fprintf(stderr, "zcio_ctevents_open: %s\n", strerror(-rc));
        return 1;
    }
    printf("conntrack events via %s\n", zcio_ctevents_path(ev));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(9997),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int i = 0; i < N; i++) {
        int s = socket(AF_INET, SOCK_DGRAM, 0);
        if (s < 0 || sendto(s, "x", 1, 0, (struct sockaddr *)&a, sizeof a) != 1) return 1;
        close(s);
    }
    struct tally t = {0, 0};
    for (int round = 0; round < 100 && t.flows < N; round++) {
        rc = zcio_ctevents_process(ev, 50, on_event, &t);
        if (rc < 0) {
            fprintf(stderr, "process: %s\n", strerror(-rc));
            return 1;
        }
    }
    zcio_ctevents_stats st;
    if (zcio_ctevents_get_stats(ev, &st) < 0) return 1;
    /* The report: the same path, every fallback with its reason, stats as JSON. */
    zcio_report *rep;
    if (zcio_ctevents_report(ev, &rep) < 0) return 1;
    printf("report: path %s, fallbacks %zu\n", zcio_report_path(rep),
           (size_t)zcio_report_fallback_count(rep));
    int report_ok = strcmp(zcio_report_path(rep), zcio_ctevents_path(ev)) == 0 &&
                    strstr(zcio_report_json(rep), "\"new\":") != NULL &&
                    strstr(zcio_report_json(rep), "\"loss\":{\"at_least\":0,\"at_most\":0,\"exact\":true}") != NULL;
    zcio_report_free(rep);
    zcio_ctevents_free(ev);
    if (!report_ok) return 1;
    printf("flows %d, bad %d, new %llu, lost %llu\n", t.flows, t.bad,
           (unsigned long long)st.new_events, (unsigned long long)st.lost);
    if (t.flows != N || t.bad || st.lost) return 1;
    printf("ok\n");
    return 0;
}

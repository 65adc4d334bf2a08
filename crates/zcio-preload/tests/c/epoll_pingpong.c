// The pattern that makes the epoll shim hand an instance to the real epoll: a server thread
// waits on an epoll instance the main thread created (as libevent's workers do) and each wait
// returns about one event (a request/response client with one request in flight). Then the
// contract after the hand-over, on the same instance: a level-triggered fd is reported at every
// wait until drained, an edge-triggered one once per edge. A second instance whose waits only
// time out stays where it is. Prints a deterministic trace (compared natively and under the
// shim by tests/pingpong.rs).
//
// usage: epoll_pingpong [rounds]
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define PAIRS 4

static int sv[PAIRS][2];
static int epfd;
static long rounds = 2000;

static void die(const char *what) {
    fprintf(stderr, "%s: %s\n", what, strerror(errno));
    exit(1);
}

static int wait_events(int ep, struct epoll_event *ev, int max, int timeout) {
    int n;
    do {
        n = epoll_wait(ep, ev, max, timeout);
    } while (n < 0 && errno == EINTR);
    if (n < 0) die("epoll_wait");
    return n;
}

static void contract(void);

// Echoes one byte per ready fd until `rounds` requests were answered.
static void *server(void *arg) {
    (void)arg;
    struct epoll_event ev[PAIRS];
    long answered = 0, waits = 0, bad = 0;
    while (answered < rounds) {
        int n = wait_events(epfd, ev, PAIRS, -1);
        waits++;
        for (int i = 0; i < n; i++) {
            int fd = ev[i].data.fd;
            char b[64];
            // Edge-triggered fds are drained; level-triggered ones read once (one request).
            for (;;) {
                ssize_t r = read(fd, b, sizeof b);
                if (r < 0 && errno == EAGAIN) break;
                if (r <= 0) die("read");
                for (ssize_t k = 0; k < r; k++) {
                    if (b[k] != (char)(answered % 251)) bad++;
                    char c = b[k];
                    if (write(fd, &c, 1) != 1) die("write");
                    answered++;
                }
                if (!(ev[i].events & EPOLLET)) break;
            }
        }
    }
    printf("pingpong: answered %ld requests, %ld out of order, %s\n", answered, bad,
           waits >= rounds / 2 ? "about one event per wait" : "batched");
    contract();
    return NULL;
}

static void report(const char *what, int n, struct epoll_event *ev) {
    printf("%s: %d event(s)", what, n);
    for (int i = 0; i < n; i++) {
        int pair = -1;
        for (int p = 0; p < PAIRS; p++)
            if (sv[p][1] == ev[i].data.fd) pair = p;
        printf(" pair%d:%s%s", pair, ev[i].events & EPOLLIN ? "IN" : "",
               ev[i].events & EPOLLOUT ? "OUT" : "");
    }
    printf("\n");
}

// After the ping-pong (the shim has handed the instance over by then): level and edge
// reports on the same instance, from the same thread.
static void contract(void) {
    struct epoll_event ev[PAIRS];
    char b[4];
    // pair 0 is level-triggered, pair 2 edge-triggered.
    if (write(sv[0][0], "ab", 2) != 2) die("write");
    report("level, 2 bytes pending", wait_events(epfd, ev, PAIRS, 1000), ev);
    if (read(sv[0][1], b, 1) != 1) die("read");
    report("level, 1 byte still pending", wait_events(epfd, ev, PAIRS, 1000), ev);
    if (read(sv[0][1], b, 1) != 1) die("read");
    report("level, drained", wait_events(epfd, ev, PAIRS, 0), ev);
    if (write(sv[2][0], "c", 1) != 1) die("write");
    report("edge, new byte", wait_events(epfd, ev, PAIRS, 1000), ev);
    report("edge, same byte unread", wait_events(epfd, ev, PAIRS, 0), ev);
    if (write(sv[2][0], "d", 1) != 1) die("write");
    report("edge, second byte", wait_events(epfd, ev, PAIRS, 1000), ev);
}

int main(int argc, char **argv) {
    if (argc > 1) rounds = atol(argv[1]);
    setvbuf(stdout, NULL, _IOLBF, 0);
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) die("epoll_create1");
    for (int p = 0; p < PAIRS; p++) {
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv[p]) != 0) die("socketpair");
        // The server's ends never block; the client's do.
        if (fcntl(sv[p][1], F_SETFL, O_NONBLOCK) != 0) die("fcntl");
        struct epoll_event e = {.events = EPOLLIN | (p >= 2 ? EPOLLET : 0), .data.fd = sv[p][1]};
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, sv[p][1], &e) != 0) die("epoll_ctl");
    }
    pthread_t t;
    if (pthread_create(&t, NULL, server, NULL) != 0) die("pthread_create");
    // One request in flight, on each pair in turn.
    for (long r = 0; r < rounds; r++) {
        int fd = sv[r % PAIRS][0];
        char c = (char)(r % 251), got;
        if (write(fd, &c, 1) != 1) die("write");
        if (read(fd, &got, 1) != 1) die("client read");
        if (got != c) {
            fprintf(stderr, "round %ld: echo %d, sent %d\n", r, got, c);
            return 1;
        }
    }
    pthread_join(t, NULL);
    // An instance whose waits only time out (nothing registered): 300 waits of 1 ms.
    int idle = epoll_create1(EPOLL_CLOEXEC);
    if (idle < 0) die("epoll_create1");
    struct epoll_event ev;
    int got = 0;
    for (int i = 0; i < 300; i++) got += wait_events(idle, &ev, 1, 1);
    printf("idle instance: %d events in 300 waits\n", got);
    close(idle);
    close(epfd);
    return 0;
}

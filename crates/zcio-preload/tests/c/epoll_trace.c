/* epoll_trace: runs epoll scenarios and prints a deterministic event trace.
 *
 * The trace must be identical with and without LD_PRELOAD=libzcio_epoll.so: every line is
 * derived from epoll results (counts, event bits, data, errno), never from timing or fd
 * numbers that could differ between runs. Each scenario opens and closes its own fds. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/io_uring.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(x)                                                                     \
    do {                                                                             \
        if (!(x)) {                                                                  \
            printf("CHECK FAILED line %d: %s (errno %s)\n", __LINE__, #x,             \
                   strerrorname_np(errno) ? strerrorname_np(errno) : "?");           \
            fflush(stdout);                                                          \
            exit(2);                                                                 \
        }                                                                            \
    } while (0)

static const char *cur = "";

static void bits(char *buf, uint32_t ev) {
    static const struct { uint32_t b; const char *n; } names[] = {
        {EPOLLIN, "IN"},     {EPOLLOUT, "OUT"}, {EPOLLPRI, "PRI"},       {EPOLLERR, "ERR"},
        {EPOLLHUP, "HUP"},   {EPOLLRDHUP, "RDHUP"}, {EPOLLRDNORM, "RDNORM"},
        {EPOLLWRNORM, "WRNORM"},
    };
    buf[0] = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (ev & names[i].b) {
            if (buf[0]) strcat(buf, "|");
            strcat(buf, names[i].n);
            ev &= ~names[i].b;
        }
    if (ev) sprintf(buf + strlen(buf), "%s0x%x", buf[0] ? "|" : "", ev);
    if (!buf[0]) strcpy(buf, "0");
}

static int cmp_ev(const void *a, const void *b) {
    const struct epoll_event *x = a, *y = b;
    return x->data.u64 < y->data.u64 ? -1 : x->data.u64 > y->data.u64;
}

/* Waits and prints "<label>: n=<n> [data:bits ...]" with events sorted by data. */
static int show(const char *label, int ep, int max, int timeout) {
    struct epoll_event ev[256];
    int n = epoll_wait(ep, ev, max, timeout);
    if (n < 0) {
        printf("%s/%s: -1 %s\n", cur, label, strerrorname_np(errno));
        return n;
    }
    qsort(ev, n, sizeof ev[0], cmp_ev);
    printf("%s/%s: n=%d", cur, label, n);
    for (int i = 0; i < n; i++) {
        char b[128];
        bits(b, ev[i].events);
        printf(" %llu:%s", (unsigned long long)ev[i].data.u64, b);
    }
    printf("\n");
    return n;
}

static void ctl(const char *label, int ep, int op, int fd, uint32_t events, uint64_t data) {
    struct epoll_event e = {.events = events, .data.u64 = data};
    int r = epoll_ctl(ep, op, fd, &e);
    printf("%s/%s: %s\n", cur, label, r == 0 ? "ok" : strerrorname_np(errno));
}

static void add(int ep, int fd, uint32_t events, uint64_t data) {
    struct epoll_event e = {.events = events, .data.u64 = data};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) == 0);
}

static void wr(int fd, const char *s) { CHECK(write(fd, s, strlen(s)) == (ssize_t)strlen(s)); }
static void drain(int fd) {
    char b[4096];
    while (read(fd, b, sizeof b) > 0) {
    }
}

static void s_level(void) {
    cur = "level";
    int p[2], ep = epoll_create1(0);
    CHECK(ep >= 0 && pipe2(p, O_NONBLOCK) == 0);
    add(ep, p[0], EPOLLIN, 1);
    show("empty", ep, 8, 0);
    wr(p[1], "x");
    show("first", ep, 8, 1000);
    show("again", ep, 8, 1000);
    drain(p[0]);
    show("drained", ep, 8, 0);
    close(p[1]);
    show("writer-closed", ep, 8, 1000);
    close(p[0]);
    close(ep);
}

static void s_edge(void) {
    cur = "edge";
    int p[2], ep = epoll_create1(EPOLL_CLOEXEC);
    CHECK(ep >= 0 && pipe2(p, O_NONBLOCK) == 0);
    add(ep, p[0], EPOLLIN | EPOLLET, 2);
    wr(p[1], "x");
    show("first", ep, 8, 1000);
    show("no-new-edge", ep, 8, 0);
    wr(p[1], "y");
    show("second-edge", ep, 8, 1000);
    drain(p[0]);
    show("drained", ep, 8, 0);
    close(p[0]);
    close(p[1]);
    close(ep);
}

static void s_sockets(void) {
    cur = "socketpair";
    int s[2], ep = epoll_create(16);
    CHECK(ep >= 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, s) == 0);
    add(ep, s[0], EPOLLIN | EPOLLOUT | EPOLLRDHUP, 10);
    show("writable", ep, 8, 1000);
    wr(s[1], "hello");
    show("readable", ep, 8, 1000);
    drain(s[0]);
    ctl("mod-in-only", ep, EPOLL_CTL_MOD, s[0], EPOLLIN | EPOLLRDHUP, 11);
    show("quiet", ep, 8, 0);
    CHECK(shutdown(s[1], SHUT_WR) == 0);
    show("half-close", ep, 8, 1000);
    ctl("mod-out", ep, EPOLL_CTL_MOD, s[0], EPOLLOUT, 12);
    show("out-after-mod", ep, 8, 1000);
    close(s[1]);
    ctl("mod-in", ep, EPOLL_CTL_MOD, s[0], EPOLLIN | EPOLLRDHUP, 13);
    show("peer-closed", ep, 8, 1000);
    close(s[0]);
    close(ep);
}

static void s_delete_pending(void) {
    cur = "delete-pending";
    int p[2], ep = epoll_create1(0);
    CHECK(ep >= 0 && pipe2(p, O_NONBLOCK) == 0);
    add(ep, p[0], EPOLLIN | EPOLLET, 3);
    wr(p[1], "x");
    show("ready", ep, 8, 1000);
    wr(p[1], "y");
    ctl("del", ep, EPOLL_CTL_DEL, p[0], 0, 0);
    show("after-del", ep, 8, 0);
    ctl("del-again", ep, EPOLL_CTL_DEL, p[0], 0, 0);
    ctl("mod-missing", ep, EPOLL_CTL_MOD, p[0], EPOLLIN, 0);
    ctl("re-add", ep, EPOLL_CTL_ADD, p[0], EPOLLIN, 4);
    show("re-added", ep, 8, 1000);
    close(p[0]);
    close(p[1]);
    close(ep);
}

static void s_close_registered(void) {
    cur = "close-registered";
    int s[2], ep = epoll_create1(0);
    CHECK(ep >= 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, s) == 0);
    add(ep, s[0], EPOLLIN, 20);
    wr(s[1], "x");
    int old = s[0];
    close(s[0]);
    show("after-close", ep, 8, 0);
    /* The peer must see the socket closed: no poll may keep the file open. */
    struct pollfd pf = {.fd = s[1], .events = POLLIN};
    int r = poll(&pf, 1, 2000);
    char buf[8];
    ssize_t n = read(s[1], buf, sizeof buf);
    printf("%s/peer-sees-close: poll=%d revents_hup=%d read=%zd %s\n", cur, r,
           !!(pf.revents & POLLHUP), n, n < 0 ? strerrorname_np(errno) : "-");
    /* fd reuse: the next socket gets the same number and can be added again. */
    int t[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, t) == 0);
    printf("%s/reused-number: %d\n", cur, t[0] == old);
    ctl("add-reused", ep, EPOLL_CTL_ADD, t[0], EPOLLIN, 21);
    show("reused-quiet", ep, 8, 0);
    wr(t[1], "y");
    show("reused-ready", ep, 8, 1000);
    close(t[0]);
    close(t[1]);
    close(s[1]);
    close(ep);
}

static void s_oneshot(void) {
    cur = "oneshot";
    int p[2], ep = epoll_create1(0);
    CHECK(ep >= 0 && pipe2(p, O_NONBLOCK) == 0);
    add(ep, p[0], EPOLLIN | EPOLLONESHOT, 5);
    wr(p[1], "x");
    show("fires", ep, 8, 1000);
    show("disabled", ep, 8, 0);
    wr(p[1], "y");
    show("still-disabled", ep, 8, 0);
    ctl("rearm", ep, EPOLL_CTL_MOD, p[0], EPOLLIN | EPOLLONESHOT, 6);
    show("rearmed", ep, 8, 1000);
    show("disabled-again", ep, 8, 0);
    ctl("rearm-et", ep, EPOLL_CTL_MOD, p[0], EPOLLIN | EPOLLET | EPOLLONESHOT, 7);
    show("rearmed-et", ep, 8, 1000);
    close(p[0]);
    close(p[1]);
    close(ep);
}

#define MANY 300
static void s_many(int et) {
    cur = et ? "many-et" : "many-level";
    int ep = epoll_create1(0), s[MANY][2];
    CHECK(ep >= 0);
    for (int i = 0; i < MANY; i++) {
        CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, s[i]) == 0);
        add(ep, s[i][0], EPOLLIN | (et ? EPOLLET : 0), 1000 + i);
    }
    int want = 0;
    for (int i = 0; i < MANY; i += 3) {
        wr(s[i][1], "z");
        want++;
    }
    /* Collect in batches of 64 until every ready fd was seen (level: each may repeat). */
    char seen[MANY] = {0};
    int distinct = 0, calls = 0, dup = 0;
    struct epoll_event ev[64];
    while (distinct < want && calls < 50) {
        int n = epoll_wait(ep, ev, 64, 1000);
        calls++;
        CHECK(n > 0);
        for (int k = 0; k < n; k++) {
            int i = (int)(ev[k].data.u64 - 1000);
            CHECK(i >= 0 && i < MANY && i % 3 == 0 && ev[k].events == EPOLLIN);
            if (seen[i]) dup++;
            else distinct++;
            seen[i] = 1;
        }
    }
    printf("%s/collected: want=%d distinct=%d dup-before-all=%s\n", cur, want, distinct,
           et ? (dup ? "yes" : "no") : "n/a");
    if (et) {
        show("nothing-more", ep, 64, 0);
    } else {
        for (int i = 0; i < MANY; i += 3) drain(s[i][0]);
        show("drained", ep, 64, 0);
    }
    for (int i = 0; i < MANY; i++) {
        close(s[i][0]);
        close(s[i][1]);
    }
    close(ep);
}

static void s_eventfd(void) {
    cur = "eventfd";
    int e = eventfd(0, EFD_NONBLOCK), ep = epoll_create1(0);
    CHECK(e >= 0 && ep >= 0);
    add(ep, e, EPOLLIN | EPOLLOUT, 30);
    show("out-only", ep, 8, 1000);
    uint64_t one = 1;
    CHECK(write(e, &one, 8) == 8);
    show("in-out", ep, 8, 1000);
    CHECK(read(e, &one, 8) == 8);
    ctl("mod-in", ep, EPOLL_CTL_MOD, e, EPOLLIN, 31);
    show("quiet", ep, 8, 0);
    close(e);
    close(ep);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void s_timeouts(void) {
    cur = "timeouts";
    int p[2], ep = epoll_create1(0);
    CHECK(ep >= 0 && pipe2(p, O_NONBLOCK) == 0);
    add(ep, p[0], EPOLLIN, 40);
    struct epoll_event ev[4];
    double t0 = now();
    int n = epoll_wait(ep, ev, 4, 60);
    double el = now() - t0;
    printf("%s/wait-60ms: n=%d waited-enough=%d\n", cur, n, el >= 0.055);
    t0 = now();
    struct timespec ts = {0, 30 * 1000 * 1000};
    n = epoll_pwait2(ep, ev, 4, &ts, NULL);
    el = now() - t0;
    printf("%s/pwait2-30ms: n=%d waited-enough=%d\n", cur, n, el >= 0.027);
    ts.tv_nsec = 0;
    n = epoll_pwait2(ep, ev, 4, &ts, NULL);
    printf("%s/pwait2-zero: n=%d\n", cur, n);
    wr(p[1], "x");
    n = epoll_pwait2(ep, ev, 4, NULL, NULL);
    printf("%s/pwait2-null-ready: n=%d data=%llu\n", cur, n, (unsigned long long)ev[0].data.u64);
    close(p[0]);
    close(p[1]);
    close(ep);
}

static volatile sig_atomic_t got;
static void on_sig(int s) {
    (void)s;
    got++;
}
static void *kill_later(void *arg) {
    usleep(50 * 1000);
    pthread_kill(*(pthread_t *)arg, SIGUSR1);
    return NULL;
}

static void s_signals(void) {
    cur = "signals";
    struct sigaction sa = {.sa_handler = on_sig};
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    int p[2], ep = epoll_create1(0);
    CHECK(ep >= 0 && pipe2(p, O_NONBLOCK) == 0);
    add(ep, p[0], EPOLLIN, 50);
    struct epoll_event ev[4];
    pthread_t self = pthread_self(), t;

    /* epoll_wait interrupted by a handled signal: EINTR, never restarted. */
    got = 0;
    CHECK(pthread_create(&t, NULL, kill_later, &self) == 0);
    int n = epoll_wait(ep, ev, 4, 5000);
    printf("%s/wait-interrupted: n=%d errno=%s handler=%d\n", cur, n,
           n < 0 ? strerrorname_np(errno) : "-", (int)got);
    pthread_join(t, NULL);

    /* A pending blocked signal is delivered by pwait's mask atomically: immediate EINTR. */
    sigset_t block, empty, old;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    sigemptyset(&empty);
    CHECK(pthread_sigmask(SIG_BLOCK, &block, &old) == 0);
    got = 0;
    raise(SIGUSR1);
    printf("%s/pending-while-blocked: handler=%d\n", cur, (int)got);
    n = epoll_pwait(ep, ev, 4, 5000, &empty);
    printf("%s/pwait-unblocks: n=%d errno=%s handler=%d\n", cur, n,
           n < 0 ? strerrorname_np(errno) : "-", (int)got);

    /* pwait with SIGUSR1 blocked: the signal does not interrupt; the wait times out. */
    CHECK(pthread_sigmask(SIG_SETMASK, &old, NULL) == 0);
    got = 0;
    CHECK(pthread_create(&t, NULL, kill_later, &self) == 0);
    n = epoll_pwait(ep, ev, 4, 200, &block);
    printf("%s/pwait-blocked: n=%d errno=%s handler-during=%d\n", cur, n,
           n < 0 ? strerrorname_np(errno) : "-", (int)got);
    pthread_join(t, NULL);
    printf("%s/after-restore: handler=%d\n", cur, (int)got);

    /* pwait with the current mask and events ready returns them. */
    wr(p[1], "x");
    CHECK(pthread_sigmask(SIG_SETMASK, NULL, &old) == 0);
    n = epoll_pwait(ep, ev, 4, 1000, &old);
    printf("%s/pwait-same-mask: n=%d data=%llu\n", cur, n, (unsigned long long)ev[0].data.u64);
    signal(SIGUSR1, SIG_DFL);
    close(p[0]);
    close(p[1]);
    close(ep);
}

static void s_errors(void) {
    cur = "errors";
    int p[2], ep = epoll_create1(0);
    CHECK(ep >= 0 && pipe2(p, O_NONBLOCK) == 0);
    ctl("add", ep, EPOLL_CTL_ADD, p[0], EPOLLIN, 1);
    ctl("add-twice", ep, EPOLL_CTL_ADD, p[0], EPOLLIN, 1);
    ctl("add-self", ep, EPOLL_CTL_ADD, ep, EPOLLIN, 1);
    ctl("add-badfd", ep, EPOLL_CTL_ADD, 987654, EPOLLIN, 1);
    ctl("bad-op", ep, 99, p[0], EPOLLIN, 1);
    char path[] = "/tmp/zcio-trace-XXXXXX";
    int f = mkstemp(path);
    CHECK(f >= 0);
    unlink(path);
    ctl("add-regular-file", ep, EPOLL_CTL_ADD, f, EPOLLIN, 1);
    close(f);
    ctl("on-non-epoll", p[1], EPOLL_CTL_ADD, p[0], EPOLLIN, 1);
    ctl("exclusive-add", ep, EPOLL_CTL_ADD, p[1], EPOLLOUT | EPOLLEXCLUSIVE, 2);
    ctl("exclusive-mod", ep, EPOLL_CTL_MOD, p[1], EPOLLOUT | EPOLLEXCLUSIVE, 2);
    ctl("del-exclusive", ep, EPOLL_CTL_DEL, p[1], 0, 0);
    ctl("exclusive-oneshot", ep, EPOLL_CTL_ADD, p[1], EPOLLOUT | EPOLLEXCLUSIVE | EPOLLONESHOT, 2);
    ctl("exclusive-ok", ep, EPOLL_CTL_ADD, p[1], EPOLLOUT | EPOLLEXCLUSIVE, 3);
    show("exclusive-reports", ep, 8, 1000);
    struct epoll_event ev[1];
    errno = 0;
    int n = epoll_wait(ep, ev, 0, 0);
    printf("%s/maxevents-0: %d %s\n", cur, n, strerrorname_np(errno));
    n = epoll_wait(p[0], ev, 1, 0);
    printf("%s/wait-non-epoll: %d %s\n", cur, n, strerrorname_np(errno));
    n = epoll_wait(987654, ev, 1, 0);
    printf("%s/wait-badfd: %d %s\n", cur, n, strerrorname_np(errno));
    n = epoll_create(0);
    printf("%s/create-0: %d %s\n", cur, n, strerrorname_np(errno));
    n = epoll_create1(12345);
    printf("%s/create1-badflag: %d %s\n", cur, n, strerrorname_np(errno));
    close(p[0]);
    close(p[1]);
    close(ep);
}

static void s_fork_dup_nest(void) {
    cur = "fork-dup-nest";
    int p[2], ep = epoll_create1(EPOLL_CLOEXEC);
    CHECK(ep >= 0 && pipe2(p, O_NONBLOCK) == 0);
    printf("%s/cloexec: %d\n", cur, !!(fcntl(ep, F_GETFD) & FD_CLOEXEC));
    add(ep, p[0], EPOLLIN, 60);
    wr(p[1], "x");
    fflush(stdout);
    pid_t c = fork();
    CHECK(c >= 0);
    if (c == 0) {
        cur = "fork-dup-nest/child";
        show("inherited", ep, 8, 1000);
        show("inherited-level", ep, 8, 1000);
        fflush(stdout);
        _exit(0);
    }
    int st;
    CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    show("parent-after-child", ep, 8, 1000);
    ctl("parent-mod", ep, EPOLL_CTL_MOD, p[0], EPOLLIN, 61);
    int d = dup(ep);
    CHECK(d >= 0);
    show("via-dup", d, 8, 1000);
    close(ep);
    show("dup-after-close-original", d, 8, 1000);
    int d2 = fcntl(d, F_DUPFD_CLOEXEC, 100);
    CHECK(d2 >= 100);
    printf("%s/dupfd-cloexec: %d\n", cur, !!(fcntl(d2, F_GETFD) & FD_CLOEXEC));
    show("via-fcntl-dup", d2, 8, 1000);
    close(d2);

    /* Nested: the instance inside another epoll set, and polled with poll(2). */
    int outer = epoll_create1(0);
    CHECK(outer >= 0);
    ctl("nest", outer, EPOLL_CTL_ADD, d, EPOLLIN, 70);
    show("outer-sees-inner", outer, 8, 1000);
    struct pollfd pf = {.fd = d, .events = POLLIN};
    int pr = poll(&pf, 1, 1000);
    printf("%s/poll-on-epoll: %d revents=%d\n", cur, pr, pf.revents);
    drain(p[0]);
    show("outer-quiet", outer, 8, 0);
    printf("%s/poll-quiet: %d\n", cur, poll(&pf, 1, 0));
    close(outer);
    close(d);
    close(p[0]);
    close(p[1]);
}

static void *other_thread_ctl(void *arg) {
    int *a = arg;
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = 81};
    usleep(50 * 1000);
    a[2] = epoll_ctl(a[0], EPOLL_CTL_ADD, a[1], &e);
    uint64_t one = 1;
    if (write(a[1], &one, 8) != 8) a[2] = -2;
    return NULL;
}

static void s_threads(void) {
    cur = "threads";
    int ep = epoll_create1(0), e = eventfd(0, EFD_NONBLOCK);
    CHECK(ep >= 0 && e >= 0);
    int a[3] = {ep, e, -1};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, other_thread_ctl, a) == 0);
    /* Blocked in a wait while another thread registers an fd and makes it ready. */
    show("added-by-other-thread", ep, 8, 5000);
    pthread_join(t, NULL);
    printf("%s/other-thread-ctl: %d\n", cur, a[2]);
    close(e);
    close(ep);
}

/* A listening TCP socket on 127.0.0.1 (any port); its address in *a. */
static int listener(struct sockaddr_in *a) {
    int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    socklen_t len = sizeof *a;
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(l >= 0 && bind(l, (struct sockaddr *)a, sizeof *a) == 0 && listen(l, 8) == 0);
    CHECK(getsockname(l, (struct sockaddr *)a, &len) == 0);
    return l;
}

static void try_connect(const char *label, const struct sockaddr_in *a) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(c >= 0);
    int r = connect(c, (const struct sockaddr *)a, sizeof *a);
    printf("%s/%s: %s\n", cur, label,
           r == 0 ? "accepted" : errno == ECONNREFUSED ? "refused" : strerrorname_np(errno));
    close(c);
}

/* epoll's contract on what a report carries and when resources go (the CPython
   test_epoll / test_asyncio findings and their class). */
static void s_contract(void) {
    cur = "contract";
    int s[2], ep = epoll_create1(0);
    CHECK(ep >= 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, s) == 0);
    /* An edge-triggered report carries every ready bit, polled at report time. */
    add(ep, s[0], EPOLLIN | EPOLLOUT | EPOLLET, 1);
    add(ep, s[1], EPOLLIN | EPOLLOUT | EPOLLET, 2);
    show("et-writable", ep, 8, 1000);
    wr(s[0], "a");
    wr(s[1], "b");
    show("et-both-sent", ep, 8, 1000);
    show("et-no-new-edge", ep, 8, 0);
    /* HUP and ERR are reported without being asked for. */
    int p[2];
    CHECK(pipe2(p, O_NONBLOCK) == 0);
    add(ep, p[1], 0, 3);
    ctl("mod-rdhup-only", ep, EPOLL_CTL_MOD, s[0], EPOLLRDHUP, 4);
    close(p[0]);
    close(s[1]);
    show("err-hup-unasked", ep, 8, 1000);
    close(p[1]);
    close(s[0]);
    /* DEL then close: the listener is gone at once (asyncio test_server_close). */
    struct sockaddr_in a;
    int l = listener(&a);
    add(ep, l, EPOLLIN, 5);
    show("listener-idle", ep, 8, 0);
    ctl("del-listener", ep, EPOLL_CTL_DEL, l, 0, 0);
    close(l);
    try_connect("connect-after-del-close", &a);
    /* close without DEL: epoll drops the registration with the file. */
    l = listener(&a);
    add(ep, l, EPOLLIN | EPOLLET, 6);
    try_connect("connect-registered", &a);
    show("listener-ready", ep, 8, 1000);
    close(l);
    try_connect("connect-after-close", &a);
    /* dup2 over a registered fd releases its file. */
    l = listener(&a);
    add(ep, l, EPOLLIN, 7);
    int e = eventfd(1, EFD_NONBLOCK);
    CHECK(e >= 0 && dup2(e, l) == l);
    try_connect("connect-after-dup2-over", &a);
    show("after-dup2-over", ep, 8, 0);
    close(l);
    close(e);
    close(ep);
}

/* Closes the shim cannot see: a raw close system call, as libuv makes. */
static void s_behind(void) {
    cur = "behind";
    int ep = epoll_create1(0);
    struct sockaddr_in a;
    int l = listener(&a);
    add(ep, l, EPOLLIN, 1);
    try_connect("connect-registered", &a);
    show("listener-ready", ep, 8, 1000);
    CHECK(syscall(SYS_close, l) == 0);
    try_connect("connect-after-raw-close", &a);
    show("after-raw-close", ep, 8, 0);
    int s[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, s) == 0);
    add(ep, s[0], EPOLLIN, 2);
    wr(s[1], "x");
    show("number-reused", ep, 8, 1000);
    close(s[0]);
    close(s[1]);
    close(ep);
}

/* From here on io_uring_setup fails with ENOMEM in this process, as it does when many loops
   are created at once (libuv's signal_multiple_loops): the shim's next instances get no ring. */
static void deny_io_uring(void) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOMEM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0);
    CHECK(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0);
}

/* libuv closes its epoll fd with a raw close system call: the number comes back for another
   file, or for the next loop's epoll fd. Neither may inherit the old instance's registrations.
   Ends with io_uring denied: run last. */
static void s_raw_epoll_close(void) {
    cur = "raw-epoll-close";
    int s[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, s) == 0);
    int outer = epoll_create1(0);
    /* The number reused by an eventfd, which goes into another epoll set. */
    int ep = epoll_create1(0);
    add(ep, s[0], EPOLLIN, 1);
    CHECK(syscall(SYS_close, ep) == 0);
    int e = eventfd(1, EFD_NONBLOCK);
    printf("%s/eventfd-got-the-number: %s\n", cur, e == ep ? "yes" : "no");
    ctl("add-eventfd-to-outer", outer, EPOLL_CTL_ADD, e, EPOLLIN, 2);
    wr(s[1], "x");
    show("outer-sees-eventfd", outer, 8, 1000);
    close(e);
    /* The number reused by the next epoll fd, which gets no ring. */
    ep = epoll_create1(0);
    add(ep, s[0], EPOLLIN, 3);
    CHECK(syscall(SYS_close, ep) == 0);
    deny_io_uring();
    int ep2 = epoll_create1(0);
    printf("%s/new-epoll-got-the-number: %s\n", cur, ep2 == ep ? "yes" : "no");
    show("new-epoll-empty", ep2, 8, 0);
    ctl("add-to-new-epoll", ep2, EPOLL_CTL_ADD, s[0], EPOLLIN, 4);
    show("new-epoll-registered", ep2, 8, 1000);
    close(ep2);
    close(outer);
    close(s[0]);
    close(s[1]);
}

/* An io_uring of the program's own, used only for IORING_OP_EPOLL_CTL: libuv (>= 1.45) sends
   every epoll_ctl this way, past any interposer. Raw system calls, one request at a time. */
struct uring {
    int fd;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
};

static void uring_init(struct uring *u, unsigned entries) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    u->fd = (int)syscall(SYS_io_uring_setup, entries, &p);
    CHECK(u->fd >= 0 && (p.features & IORING_FEAT_SINGLE_MMAP));
    size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    size_t len = sq_len > cq_len ? sq_len : cq_len;
    char *r = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->fd,
                   IORING_OFF_SQ_RING);
    CHECK(r != MAP_FAILED);
    u->sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_POPULATE, u->fd, IORING_OFF_SQES);
    CHECK(u->sqes != MAP_FAILED);
    u->sq_tail = (unsigned *)(r + p.sq_off.tail);
    u->sq_mask = (unsigned *)(r + p.sq_off.ring_mask);
    u->sq_array = (unsigned *)(r + p.sq_off.array);
    u->cq_head = (unsigned *)(r + p.cq_off.head);
    u->cq_tail = (unsigned *)(r + p.cq_off.tail);
    u->cq_mask = (unsigned *)(r + p.cq_off.ring_mask);
    u->cqes = (struct io_uring_cqe *)(r + p.cq_off.cqes);
}

/* epoll_ctl through the ring; returns 0 or -errno. */
static int uring_epoll_ctl(struct uring *u, int ep, int op, int fd, uint32_t events,
                           uint64_t data) {
    struct epoll_event e = {.events = events, .data.u64 = data};
    unsigned tail = *u->sq_tail, i = tail & *u->sq_mask;
    struct io_uring_sqe *q = &u->sqes[i];
    memset(q, 0, sizeof *q);
    q->opcode = IORING_OP_EPOLL_CTL;
    q->fd = ep;
    q->off = (uint64_t)fd;
    q->addr = (uint64_t)(uintptr_t)&e;
    q->len = (uint32_t)op;
    u->sq_array[i] = i;
    __atomic_store_n(u->sq_tail, tail + 1, __ATOMIC_RELEASE);
    CHECK(syscall(SYS_io_uring_enter, u->fd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) == 1);
    unsigned head = *u->cq_head;
    CHECK(__atomic_load_n(u->cq_tail, __ATOMIC_ACQUIRE) != head);
    int res = u->cqes[head & *u->cq_mask].res;
    __atomic_store_n(u->cq_head, head + 1, __ATOMIC_RELEASE);
    return res;
}

static void uring_ctl(const char *label, struct uring *u, int ep, int op, int fd,
                      uint32_t events, uint64_t data) {
    int r = uring_epoll_ctl(u, ep, op, fd, events, data);
    printf("%s/%s: %s\n", cur, label, r == 0 ? "ok" : strerrorname_np(-r));
}

/* Registrations made behind the shim's back with IORING_OP_EPOLL_CTL, next to ones made through
   libc, as a libuv loop makes them: every one reported, deleted ones no longer. */
static void s_uring_ctl(void) {
    cur = "uring-ctl";
    struct uring u;
    uring_init(&u, 64);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    int p[2], q[2];
    CHECK(ep >= 0 && pipe2(p, O_NONBLOCK) == 0 && pipe2(q, O_NONBLOCK) == 0);
    add(ep, q[0], EPOLLIN, 2);
    uring_ctl("add-through-io_uring", &u, ep, EPOLL_CTL_ADD, p[0], EPOLLIN, 1);
    show("nothing-ready", ep, 8, 0);
    wr(p[1], "x");
    show("io_uring-registered-ready", ep, 8, 1000);
    wr(q[1], "y");
    show("both-ready", ep, 8, 1000);
    drain(p[0]);
    drain(q[0]);
    show("drained", ep, 8, 0);
    uring_ctl("del-through-io_uring", &u, ep, EPOLL_CTL_DEL, p[0], 0, 0);
    wr(p[1], "z");
    wr(q[1], "w");
    show("after-del", ep, 8, 1000);
    close(p[0]);
    close(p[1]);
    close(q[0]);
    close(q[1]);
    close(ep);
    close(u.fd);
}

/* io_uring_setup fails with ENOMEM for rings of fewer than 64 entries, as it does when ring
   memory is short: the shim's EPOLL_WAIT ring (8 entries) cannot be made, a 1024-entry poll
   ring could. Registrations made behind the shim's back must still be reported. */
static void deny_small_io_urings(void) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_io_uring_setup, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOMEM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0);
    CHECK(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0);
}

/* Many loops at once, each with a registration and an event (run unprivileged: ring memory
   then counts against RLIMIT_MEMLOCK, set here to the usual 8 MiB). */
static void s_many_loops(int n) {
    cur = "many-loops";
    struct rlimit rl = {.rlim_cur = 8 << 20, .rlim_max = 8 << 20};
    CHECK(setrlimit(RLIMIT_MEMLOCK, &rl) == 0);
    int *ep = calloc((size_t)n, sizeof *ep);
    int p[2];
    CHECK(ep && pipe2(p, O_NONBLOCK) == 0);
    wr(p[1], "x");
    int served = 0;
    for (int i = 0; i < n; i++) {
        ep[i] = epoll_create1(EPOLL_CLOEXEC);
        CHECK(ep[i] >= 0);
        add(ep[i], p[0], EPOLLIN, (uint64_t)i);
        struct epoll_event ev;
        served += epoll_wait(ep[i], &ev, 1, 1000) == 1 && ev.data.u64 == (uint64_t)i;
    }
    printf("%s/%d-loops-each-saw-its-event: %d\n", cur, n, served);
    for (int i = 0; i < n; i++)
        close(ep[i]);
    close(p[0]);
    close(p[1]);
    free(ep);
}

/* exec with close-on-exec: the registered listener goes with the old image. Runs in a child
   (the listener exists only there); the new image gets the epoll fd (no CLOEXEC) and the port. */
static void s_exec(const char *self) {
    cur = "exec";
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int ep = epoll_create(1); /* inherited across exec */
        struct sockaddr_in a;
        int l = listener(&a);
        CHECK(fcntl(l, F_SETFD, FD_CLOEXEC) == 0);
        add(ep, l, EPOLLIN, 1);
        try_connect("connect-before-exec", &a);
        show("listener-ready", ep, 8, 1000);
        char epfd[16], port[16];
        snprintf(epfd, sizeof epfd, "%d", ep);
        snprintf(port, sizeof port, "%d", ntohs(a.sin_port));
        execl(self, self, "after-exec", epfd, port, (char *)NULL);
        _exit(3);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void after_exec(int ep, int port) {
    cur = "exec";
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    try_connect("connect-after-exec", &a);
    show("inherited-epoll-after-exec", ep, 8, 0);
    close(ep);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 3 && strcmp(argv[1], "after-exec") == 0) {
        after_exec(atoi(argv[2]), atoi(argv[3]));
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "behind") == 0) {
        s_behind();
        s_exec(argv[0]);
        printf("done\n");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "uring-ctl") == 0) {
        s_uring_ctl();
        printf("done\n");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "uring-ctl-short-memory") == 0) {
        deny_small_io_urings();
        s_uring_ctl();
        printf("done\n");
        return 0;
    }
    if (argc > 2 && strcmp(argv[1], "many-loops") == 0) {
        s_many_loops(atoi(argv[2]));
        printf("done\n");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "raw-epoll-close") == 0) {
        s_raw_epoll_close();
        printf("done\n");
        return 0;
    }
    s_level();
    s_edge();
    s_sockets();
    s_delete_pending();
    s_close_registered();
    s_oneshot();
    s_many(0);
    s_many(1);
    s_eventfd();
    s_timeouts();
    s_signals();
    s_errors();
    s_fork_dup_nest();
    s_threads();
    s_contract();
    printf("done\n");
    return 0;
}

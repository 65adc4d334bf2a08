// Programs that manage their own descriptors, fork while another thread waits, and close from
// signal handlers: prints one deterministic line per check, identical natively and under
// LD_PRELOAD=libzcio_epoll.so (tests/fds.rs compares them).
//
// `epoll_fds probe` instead lists the descriptors the program did not open (the shim's own,
// when preloaded) and what close/dup/dup2/fcntl on them return.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(c)                                                                         \
    do {                                                                                 \
        if (!(c)) {                                                                      \
            fprintf(stderr, "%s:%d: check failed: %s (errno %d)\n", __FILE__, __LINE__, \
                    #c, errno);                                                          \
            exit(2);                                                                     \
        }                                                                                \
    } while (0)

static void pair(int sv[2]) { CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0); }

static void add(int ep, int fd, uint32_t events, uint64_t data) {
    struct epoll_event e = {.events = events, .data.u64 = data};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) == 0);
}

// Whether the peer of a closed socket sees the close (POLLHUP/POLLRDHUP) within `ms`.
static const char *peer_sees_close(int peer, int ms) {
    struct pollfd p = {.fd = peer, .events = POLLIN | POLLRDHUP};
    int n = poll(&p, 1, ms);
    return (n == 1 && (p.revents & (POLLHUP | POLLRDHUP))) ? "yes" : "no";
}

// One epoll_wait; prints the count and the data of each event (sorted, small sets).
static void show(const char *label, int ep, int timeout) {
    struct epoll_event ev[16];
    int n = epoll_wait(ep, ev, 16, timeout);
    printf("%s: n=%d", label, n);
    for (int i = 0; i < n; i++) printf(" %llu", (unsigned long long)ev[i].data.u64);
    printf("\n");
}

// --- fork while another thread is blocked in epoll_wait --------------------------------

struct waiter {
    int sv[2];
    int ep;
    int ready[2];
    int got;
};

static void *wait_thread(void *arg) {
    struct waiter *w = arg;
    w->ep = epoll_create1(EPOLL_CLOEXEC);
    CHECK(w->ep >= 0);
    add(w->ep, w->sv[0], EPOLLIN, 42);
    CHECK(write(w->ready[1], "r", 1) == 1);
    struct epoll_event ev[4];
    int n;
    do n = epoll_wait(w->ep, ev, 4, 10000);
    while (n < 0 && errno == EINTR);
    w->got = n == 1 ? (int)ev[0].data.u64 : -n - 1000;
    return NULL;
}

static void s_fork_while_waiting(void) {
    struct waiter w = {0};
    pair(w.sv);
    CHECK(pipe(w.ready) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, wait_thread, &w) == 0);
    char c;
    CHECK(read(w.ready[0], &c, 1) == 1);
    usleep(50 * 1000); // the thread is inside epoll_wait
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(5); // a hang fails the check instead of the test
        // The child shares the interest list: a byte on the registered socket is its event.
        CHECK(write(w.sv[1], "c", 1) == 1);
        struct epoll_event ev[4];
        int n = epoll_wait(w.ep, ev, 4, 2000);
        if (n != 1 || ev[0].data.u64 != 42) _exit(4);
        int d = dup(w.ep);
        struct pollfd p = {.fd = w.ep, .events = POLLIN};
        int pr = poll(&p, 1, 0);
        int c1 = close(d), c2 = close(w.ep);
        _exit(d >= 0 && pr == 1 && c1 == 0 && c2 == 0 ? 0 : 3);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    printf("fork-while-waiting/child: %s\n",
           WIFEXITED(st) && WEXITSTATUS(st) == 0   ? "wait, dup, poll, close ok"
           : WIFEXITED(st) && WEXITSTATUS(st) == 4 ? "no event (registrations lost)"
           : WIFSIGNALED(st)                      ? "killed (hung)"
                                                  : "failed");
    CHECK(write(w.sv[1], "x", 1) == 1);
    CHECK(pthread_join(t, NULL) == 0);
    printf("fork-while-waiting/parent: event %d\n", w.got);
    close(w.ep);
    close(w.sv[0]);
    close(w.sv[1]);
    close(w.ready[0]);
    close(w.ready[1]);
}

// --- a program that closes every descriptor it does not know -----------------------------

static int known[64];
static int nknown;

static int is_known(int fd) {
    for (int i = 0; i < nknown; i++)
        if (known[i] == fd) return 1;
    return 0;
}

static void s_close_unknown(void) {
    int ep = epoll_create1(0), sv[2];
    pair(sv);
    add(ep, sv[0], EPOLLIN, 7);
    nknown = 0;
    known[nknown++] = ep;
    known[nknown++] = sv[0];
    known[nknown++] = sv[1];
    // Loop style (getdtablesize), then /proc/self/fd style.
    int closed = 0;
    for (int fd = 3; fd < getdtablesize(); fd++)
        if (!is_known(fd) && close(fd) == 0) closed++;
    printf("close-unknown/loop: closed %d\n", closed);
    closed = 0;
    DIR *d = opendir("/proc/self/fd");
    CHECK(d);
    int dfd = dirfd(d);
    struct dirent *e;
    int list[4096], n = 0;
    while ((e = readdir(d)) && n < 4096) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] != '.' && fd > 2 && fd != dfd && !is_known(fd)) list[n++] = fd;
    }
    closedir(d);
    for (int i = 0; i < n; i++)
        if (close(list[i]) == 0) closed++;
    printf("close-unknown/proc: closed %d\n", closed);
    // The program's new descriptors take the lowest numbers; nothing may write into them.
    int p[2];
    CHECK(pipe2(p, O_NONBLOCK) == 0);
    CHECK(write(sv[1], "x", 1) == 1);
    show("close-unknown/wait", ep, 1000);
    char b[16];
    printf("close-unknown/new-pipe-untouched: %s\n",
           read(p[0], b, sizeof b) < 0 && errno == EAGAIN ? "yes" : "no");
    close(p[0]);
    close(p[1]);
    close(sv[0]);
    close(sv[1]);
    close(ep);
}

// --- dup2 onto small fixed numbers (a daemon setting up its descriptors) ------------------

static void s_dup2_fixed(void) {
    int ep = epoll_create1(0), sv[2];
    pair(sv);
    add(ep, sv[0], EPOLLIN, 9);
    int null = open("/dev/null", O_RDWR);
    CHECK(null >= 0);
    int ok = 0, tried = 0;
    int base = 40; // above everything the program holds
    for (int fd = 3; fd < base; fd++) {
        if (fd == ep || fd == sv[0] || fd == sv[1] || fd == null) continue;
        tried++;
        if (dup2(null, fd) == fd) ok++;
    }
    printf("dup2-fixed: %d of %d\n", ok, tried);
    CHECK(write(sv[1], "x", 1) == 1);
    show("dup2-fixed/wait", ep, 1000);
    for (int fd = 3; fd < base; fd++)
        if (fd != ep && fd != sv[0] && fd != sv[1] && fd != null) close(fd);
    close(null);
    close(sv[0]);
    close(sv[1]);
    close(ep);
}

// --- every libc way to close a registered socket: the peer sees it at once -----------------

static void s_close_paths(void) {
    int ep = epoll_create1(0);
    const char *names[] = {"close", "close_range", "close_range-unshare", "closefrom", "fclose",
                           "dup2-over", "dup3-over"};
    for (int k = 0; k < 7; k++) {
        int sv[2];
        pair(sv);
        // High numbers so close_range/closefrom touch nothing else.
        int hi = fcntl(sv[0], F_DUPFD, 500 + k * 10);
        CHECK(hi >= 0);
        close(sv[0]);
        add(ep, hi, EPOLLIN | EPOLLRDHUP, (uint64_t)hi);
        int r = 0;
        switch (k) {
        case 0: r = close(hi); break;
        case 1: r = close_range(hi, hi, 0); break;
        case 2: r = close_range(hi, hi, CLOSE_RANGE_UNSHARE); break;
        case 3: closefrom(hi); break;
        case 4: {
            FILE *f = fdopen(hi, "r+");
            CHECK(f);
            r = fclose(f);
            break;
        }
        case 5: {
            int n = open("/dev/null", O_RDONLY);
            r = dup2(n, hi) == hi ? 0 : -1;
            close(n);
            close(hi);
            break;
        }
        case 6: {
            int n = open("/dev/null", O_RDONLY);
            r = dup3(n, hi, O_CLOEXEC) == hi ? 0 : -1;
            close(n);
            close(hi);
            break;
        }
        }
        printf("close-path/%s: r=%d peer sees close: %s\n", names[k], r, peer_sees_close(sv[1], 1000));
        close(sv[1]);
    }
    // pclose of a popen pipe registered for events: the child (reading until end of file)
    // must see the close, or pclose waits for it forever.
    {
        FILE *f = popen("cat > /dev/null", "w");
        CHECK(f);
        add(ep, fileno(f), EPOLLOUT, 88);
        alarm(10);
        int st = pclose(f);
        alarm(0);
        printf("close-path/pclose: child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    // The instance still serves a new registration at a reused number.
    int sv[2];
    pair(sv);
    add(ep, sv[0], EPOLLIN, 77);
    CHECK(write(sv[1], "x", 1) == 1);
    show("close-path/after", ep, 1000);
    close(sv[0]);
    close(sv[1]);
    close(ep);
}

// --- calls that fail in libc leave registrations as the kernel does -------------------------

static void s_failing_calls(void) {
    int ep = epoll_create1(0), sv[2];
    pair(sv);
    add(ep, sv[0], EPOLLIN, 5);
    errno = 0;
    int r = dup2(987, sv[0]);
    printf("failing/dup2-bad-old: r=%d errno=%d\n", r, errno);
    errno = 0;
    r = dup3(sv[0], sv[0], 0);
    printf("failing/dup3-same: r=%d errno=%d\n", r, errno);
    errno = 0;
    r = dup3(sv[1], sv[0], 12345);
    printf("failing/dup3-bad-flags: r=%d errno=%d\n", r, errno);
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    errno = 0;
    r = dup2(sv[0], (int)rl.rlim_cur + 5);
    printf("failing/dup2-beyond-limit: r=%d errno=%d\n", r, errno);
    errno = 0;
    r = close_range(10, 5, 0);
    printf("failing/close_range-reversed: r=%d errno=%d\n", r, errno);
    errno = 0;
    r = close_range(sv[0], sv[0], 0x80);
    printf("failing/close_range-bad-flags: r=%d errno=%d\n", r, errno);
    errno = 0;
    r = close(-1);
    printf("failing/close-negative: r=%d errno=%d\n", r, errno);
    // sv[0] is still registered: its event arrives.
    CHECK(write(sv[1], "x", 1) == 1);
    show("failing/still-registered", ep, 1000);
    // close_range with CLOEXEC closes nothing.
    r = close_range(sv[0], sv[0], CLOSE_RANGE_CLOEXEC);
    CHECK(write(sv[1], "y", 1) == 1);
    printf("failing/cloexec-range: r=%d\n", r);
    show("failing/cloexec-range-still-registered", ep, 1000);
    close(sv[0]);
    close(sv[1]);
    close(ep);
}

// --- a vfork child closes its copy of a registered fd ---------------------------------------

static void s_vfork(void) {
    int ep = epoll_create1(0), sv[2];
    pair(sv);
    add(ep, sv[0], EPOLLIN, 11);
    pid_t pid = vfork();
    if (pid == 0) {
        close(sv[0]);
        _exit(0);
    }
    CHECK(pid > 0);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(write(sv[1], "x", 1) == 1);
    show("vfork/parent-still-registered", ep, 1000);
    close(sv[0]);
    close(sv[1]);
    close(ep);
}

// --- a vfork child waits on the parent's instance ----------------------------------------
// (Outside POSIX — a vfork child may only exec or _exit — but it must not break the parent:
// the child shares the parent's memory, so the shim's state is the parent's, while its ring
// only takes the parent's submissions.)

static void s_vfork_wait(void) {
    int ep = epoll_create1(0), sv[2];
    pair(sv);
    add(ep, sv[0], EPOLLIN, 12);
    CHECK(write(sv[1], "x", 1) == 1);
    show("vfork-wait/parent-before", ep, 1000);
    pid_t pid = vfork();
    if (pid == 0) {
        struct epoll_event ev[4];
        int n = epoll_wait(ep, ev, 4, 0);
        _exit(n == 1 && ev[0].data.u64 == 12 ? 0 : n < 0 ? 99 : 10 + n);
    }
    CHECK(pid > 0);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    printf("vfork-wait/child: exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    show("vfork-wait/parent-after", ep, 1000);
    char c;
    CHECK(read(sv[0], &c, 1) == 1);
    CHECK(write(sv[1], "y", 1) == 1);
    show("vfork-wait/parent-new-event", ep, 1000);
    close(sv[0]);
    close(sv[1]);
    close(ep);
}

// --- another thread closes a registered socket while the owner waits ------------------------

struct closer {
    int fd;
};
static void *close_later(void *arg) {
    struct closer *c = arg;
    usleep(50 * 1000);
    close(c->fd);
    return NULL;
}

static void s_thread_close(void) {
    int ep = epoll_create1(0), a[2], b[2];
    pair(a);
    pair(b);
    add(ep, a[0], EPOLLIN, 1);
    add(ep, b[0], EPOLLIN, 2);
    struct closer c = {.fd = a[0]};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, close_later, &c) == 0);
    show("thread-close/wait", ep, 300);
    CHECK(pthread_join(t, NULL) == 0);
    printf("thread-close/peer sees close: %s\n", peer_sees_close(a[1], 1000));
    CHECK(write(b[1], "x", 1) == 1);
    show("thread-close/other-still-served", ep, 1000);
    close(a[1]);
    close(b[0]);
    close(b[1]);
    close(ep);
}

// --- a signal handler closes registered sockets while the loop waits ---------------------

#define NSIG_SOCKS 24
static int sig_fds[NSIG_SOCKS];
static volatile sig_atomic_t sig_next;

static void on_alarm(int s) {
    (void)s;
    int saved = errno;
    if (sig_next < NSIG_SOCKS) {
        close(sig_fds[sig_next]);
        sig_next++;
    }
    errno = saved;
}

static void s_signal_close(void) {
    int ep = epoll_create1(0);
    int peers[NSIG_SOCKS];
    int busy[2];
    pair(busy);
    add(ep, busy[0], EPOLLIN, 999);
    for (int i = 0; i < NSIG_SOCKS; i++) {
        int sv[2];
        pair(sv);
        sig_fds[i] = sv[0];
        peers[i] = sv[1];
        add(ep, sv[0], EPOLLIN | EPOLLRDHUP, (uint64_t)i);
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
    struct itimerval it = {.it_interval = {0, 2000}, .it_value = {0, 2000}};
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
    // The storm: waits that block (most signals land inside them) and waits that return events.
    int intr = 0, rounds = 0;
    while (sig_next < NSIG_SOCKS && rounds < 100000) {
        struct epoll_event ev[8];
        if (rounds % 3 == 0) CHECK(write(busy[1], "b", 1) == 1);
        int n = epoll_wait(ep, ev, 8, 20);
        if (n < 0) {
            CHECK(errno == EINTR);
            intr++;
        }
        for (int i = 0; i < n; i++) {
            if (ev[i].data.u64 == 999) {
                char b[64];
                while (read(busy[0], b, sizeof b) > 0) {
                }
            }
        }
        rounds++;
    }
    struct itimerval off = {0};
    CHECK(setitimer(ITIMER_REAL, &off, NULL) == 0);
    signal(SIGALRM, SIG_DFL);
    // The loop goes on (a later wait of the loop is where deferred deletes happen).
    show("signal-close/after", ep, 0);
    int seen = 0;
    for (int i = 0; i < NSIG_SOCKS; i++)
        if (strcmp(peer_sees_close(peers[i], 1000), "yes") == 0) seen++;
    printf("signal-close: %d closed by the handler, %d peers saw the close\n", (int)sig_next, seen);
    // New sockets at the reused numbers are served (no stale registration).
    int sv[2];
    pair(sv);
    add(ep, sv[0], EPOLLIN, 555);
    CHECK(write(sv[1], "x", 1) == 1);
    show("signal-close/reused-number", ep, 1000);
    for (int i = 0; i < NSIG_SOCKS; i++) close(peers[i]);
    close(sv[0]);
    close(sv[1]);
    close(busy[0]);
    close(busy[1]);
    close(ep);
}

// --- probe: the descriptors this program did not open -----------------------------------

static void probe(void) {
    int ep = epoll_create1(0), sv[2];
    pair(sv);
    add(ep, sv[0], EPOLLIN, 1);
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    DIR *d = opendir("/proc/self/fd");
    CHECK(d);
    int dfd = dirfd(d), list[64], n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] != '.' && fd > 2 && fd != dfd && fd != ep && fd != sv[0] && fd != sv[1])
            list[n++] = fd;
    }
    closedir(d);
    printf("probe: limit %llu, %d foreign\n", (unsigned long long)rl.rlim_cur, n);
    int null = open("/dev/null", O_RDONLY);
    for (int i = 0; i < n; i++) {
        int fd = list[i];
        char path[64], line[256];
        snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
        FILE *f = fopen(path, "r");
        unsigned long flags = 0;
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "flags: %lo", &flags) == 1) break;
        if (f) fclose(f);
        errno = 0;
        int rd = dup(fd);
        int ed = errno;
        errno = 0;
        int rf = fcntl(fd, F_GETFD);
        int ef = errno;
        errno = 0;
        int r2 = dup2(null, fd);
        int e2 = errno;
        errno = 0;
        int rc = close(fd);
        int ec = errno;
        printf("probe: fd %d cloexec=%d dup=%d/%d fcntl=%d/%d dup2-onto=%d/%d close=%d/%d\n", fd,
               (flags & O_CLOEXEC) != 0, rd, ed, rf, ef, r2, e2, rc, ec);
    }
    // The ring still serves.
    CHECK(write(sv[1], "x", 1) == 1);
    show("probe/wait", ep, 1000);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strcmp(argv[1], "probe") == 0) {
        probe();
        printf("done\n");
        return 0;
    }
    // With arguments: only the named scenarios (to see each one alone).
    struct {
        const char *name;
        void (*run)(void);
    } all[] = {{"fork", s_fork_while_waiting}, {"close-unknown", s_close_unknown},
               {"dup2-fixed", s_dup2_fixed},    {"close-paths", s_close_paths},
               {"failing", s_failing_calls},    {"vfork", s_vfork},
               {"vfork-wait", s_vfork_wait},
               {"thread-close", s_thread_close}, {"signal-close", s_signal_close}};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        int want = argc < 2;
        for (int a = 1; a < argc; a++) want |= strcmp(argv[a], all[i].name) == 0;
        if (want) all[i].run();
    }
    printf("done\n");
    return 0;
}

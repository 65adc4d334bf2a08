/* event_ring.c: zcio's event ring from C.
 *
 * Registers a pipe and an eventfd with epoll interest bits, waits for their events, and
 * receives a user event posted from another thread; prints the backend and counters.
 * Build: cc event_ring.c $(pkg-config --cflags --libs zcio) -lpthread */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <errno.h>
#include <zcio.h>

#define FAIL(what, rc)                                                          \
    do {                                                                        \
        fprintf(stderr, "%s failed: %s\n", what, strerror(-(rc)));              \
        return 1;                                                               \
    } while (0)

static void *poster_thread(void *arg) {
    zcio_event_poster *p = arg;
    usleep(20 * 1000);
    zcio_event_poster_post(p, 99, EPOLLIN);
    return NULL;
}

int main(void) {
    zcio_event_ring *ring;
    int rc = zcio_event_ring_new(&ring, ZCIO_EVENT_PREFER_AUTO);
    if (rc < 0) FAIL("zcio_event_ring_new", rc);
    printf("zcio %s, backend %s\n", zcio_version(), zcio_event_ring_backend(ring));

    int p[2];
    if (pipe(p) != 0) return 1;
    int efd = eventfd(0, EFD_NONBLOCK);
    if ((rc = zcio_event_ring_add(ring, p[0], EPOLLIN, 7)) < 0) FAIL("add pipe", rc);
    if ((rc = zcio_event_ring_add(ring, efd, EPOLLIN | EPOLLET, 8)) < 0) FAIL("add eventfd", rc);
    if ((rc = zcio_event_ring_add(ring, p[0], EPOLLIN, 7)) != -EEXIST) FAIL("double add", rc);

    if (write(p[1], "x", 1) != 1) return 1;
    uint64_t one = 1;
    if (write(efd, &one, 8) != 8) return 1;

    zcio_event ev[8];
    int seen = 0;
    while (seen != 3) {
        int n = zcio_event_ring_wait(ring, ev, 8, 1000);
        if (n < 0) FAIL("wait", n);
        if (n == 0) {
            fprintf(stderr, "timed out, seen=%d\n", seen);
            return 1;
        }
        for (int i = 0; i < n; i++) {
            printf("event token=%llu events=0x%x\n", (unsigned long long)ev[i].token, ev[i].events);
            if (ev[i].token == 7) seen |= 1;
            if (ev[i].token == 8) seen |= 2;
        }
    }
    char c;
    if (read(p[0], &c, 1) != 1) return 1;

    zcio_event_poster *poster;
    if ((rc = zcio_event_ring_poster(ring, &poster)) < 0) FAIL("poster", rc);
    pthread_t t;
    pthread_create(&t, NULL, poster_thread, poster);
    int n = zcio_event_ring_wait(ring, ev, 8, 2000);
    pthread_join(t, NULL);
    if (n != 1 || ev[0].token != 99) {
        fprintf(stderr, "expected the posted event, got n=%d\n", n);
        return 1;
    }
    printf("user event token=%llu\n", (unsigned long long)ev[0].token);

    if ((rc = zcio_event_ring_delete(ring, efd)) < 0) FAIL("delete", rc);
    if ((rc = zcio_event_ring_close(ring, p[0])) < 0) FAIL("close", rc);
    zcio_event_stats st;
    zcio_event_ring_stats(ring, &st);
    printf("events=%llu user_events=%llu syscalls=%llu wait_entries=%llu\n",
           (unsigned long long)st.events, (unsigned long long)st.user_events,
           (unsigned long long)st.syscalls, (unsigned long long)st.wait_entries);
    zcio_event_poster_free(poster);
    zcio_event_ring_free(ring);
    close(p[1]);
    close(efd);
    printf("ok\n");
    return 0;
}

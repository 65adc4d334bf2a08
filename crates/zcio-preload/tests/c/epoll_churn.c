/* Creates and closes epoll instances in a loop for argv[1] seconds, as event-loop libraries
 * do when a program makes a loop per task (libuv's signal_multiple_loops): each instance
 * watches a pipe and waits once with a zero timeout. Prints how many instances it made and
 * whether every wait saw the pipe ready. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 1.0;
  int p[2];
  if (pipe(p) != 0 || write(p[1], "x", 1) != 1) {
    perror("pipe");
    return 1;
  }
  long made = 0, ready = 0;
  double end = now() + secs;
  while (now() < end) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) {
      perror("epoll_create1");
      return 1;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 7};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &ev) != 0) {
      perror("epoll_ctl");
      return 1;
    }
    struct epoll_event out;
    int n = epoll_wait(ep, &out, 1, 0);
    if (n == 1 && out.data.u64 == 7)
      ready++;
    close(ep);
    made++;
  }
  printf("instances %ld ready %ld\n", made, ready);
  return made > 0 && ready == made ? 0 : 1;
}

// C++ program linked against the installed libzcio: the header is usable from C++ (extern "C",
// no C-only constructs) and the library's event ring works through RAII wrappers.
#include <zcio.h>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <vector>

struct RingFree {
    void operator()(zcio_event_ring *r) const { zcio_event_ring_free(r); }
};
using Ring = std::unique_ptr<zcio_event_ring, RingFree>;

int main() {
    zcio_event_ring *raw = nullptr;
    if (zcio_event_ring_new(&raw, ZCIO_EVENT_PREFER_AUTO) < 0) return 1;
    Ring ring(raw);
    int efd = eventfd(0, EFD_NONBLOCK);
    if (zcio_event_ring_add(ring.get(), efd, EPOLLIN, 42) != 0) return 2;
    uint64_t one = 1;
    if (write(efd, &one, sizeof one) != sizeof one) return 3;
    std::vector<zcio_event> ev(4);
    int n = zcio_event_ring_wait(ring.get(), ev.data(), static_cast<uint32_t>(ev.size()), 1000);
    if (n != 1 || ev[0].token != 42 || !(ev[0].events & EPOLLIN)) return 4;
    if (zcio_event_ring_close(ring.get(), efd) != 0) return 5;
    if (zcio_event_ring_wait(ring.get(), nullptr, 0, 0) != -22) return 6;  // -EINVAL
    std::printf("c++ ok: backend %s, version %s\n", zcio_event_ring_backend(ring.get()),
                zcio_version());
    return 0;
}

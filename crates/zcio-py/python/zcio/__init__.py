"""zcio for Python: NFQUEUE at batch speed.

Two ways in:

* ``zcio.NfQueue`` — batches of packets held in zcio's frame ring, payloads as zero-copy
  read-only ``memoryview`` s valid until the verdict, verdicts sent as batch verdicts::

      q = zcio.NfQueue(1)
      for batch in q.batches(max=64):
          for p in batch:
              if p.payload[9] == 17:  # UDP
                  p.drop()
          batch.accept()              # the rest

  ``async for batch in q`` under asyncio; ``zcio.FanOut`` runs one queue per thread.

* ``zcio.NetfilterQueue`` — a drop-in for the ``netfilterqueue`` package (1.1.0): replace
  ``from netfilterqueue import NetfilterQueue`` with ``from zcio import NetfilterQueue``.

The frame ring's other netlink consumers: ``zcio.NfLog`` (NFLOG groups), ``zcio.CtEvents``
(conntrack events) and ``zcio.Audit`` (the kernel's audit events).

The wait for packets releases the GIL; Ctrl+C stops ``run()`` within 20 ms of a wait slice.
"""

from __future__ import annotations

import errno as _errno
import os as _os
import socket as _socket
import threading as _threading
import warnings as _warnings
from typing import Callable, Iterator, List, Optional

from . import _native
from ._native import (
    ACCEPT,
    DROP,
    REPEAT,
    Batch,
    CtEvent,
    FramesExhausted,
    LogEntry,
    Packet,
    QueueBusy,
    QueueUnbound,
    checksums_ok,
    fix_checksums,
)
from ._protocols import PROTOCOLS

#: zcio's version (of the package and its native module).
__version__: str = _native.__version__
#: The same as a tuple of ints, as netfilterqueue's ``VERSION``.
VERSION = tuple(int(x) for x in __version__.split(".")[:3])

__all__ = [
    "Audit",
    "VERSION",
    "__version__",
    "ACCEPT",
    "DROP",
    "REPEAT",
    "COPY_NONE",
    "COPY_META",
    "COPY_PACKET",
    "PROTOCOLS",
    "Batch",
    "CtEvent",
    "CtEvents",
    "FanOut",
    "LogEntry",
    "NfLog",
    "FramesExhausted",
    "NetfilterQueue",
    "NfQueue",
    "Packet",
    "QueueBusy",
    "QueueUnbound",
    "checksums_ok",
    "fix_checksums",
    "queue_verdict",
]

#: netfilterqueue's copy modes.
COPY_NONE = 0
COPY_META = 1
COPY_PACKET = 2


def queue_verdict(queue: int) -> int:
    """The verdict that sends a packet on to NFQUEUE queue ``queue`` (``NF_QUEUE``)."""
    if not 0 <= queue <= 0xFFFF:
        raise ValueError(f"queue number {queue} is not in 0..65535")
    return 3 | (queue << 16)


class NfQueue(_native.NfQueue):
    """An NFQUEUE consumer bound to queue ``queue`` (or ``queue..last``, one socket each).

    Keyword options: ``copy_range`` (bytes of each packet copied, default 65535), ``meta``
    (metadata only), ``max_len`` (kernel queue length), ``fail_open`` (accept instead of
    drop when the kernel queue is full), ``sock_len`` (receive buffer), ``gso`` (whole GSO
    bursts), ``uid_gid``, ``conntrack``, ``default_verdict`` (for packets a batch or a
    raising callback leaves undecided; DROP by default), ``frames`` (per queue: packets held
    past their batch keep one each), ``frame_size``, ``uring`` (fill frames with io_uring
    where a datagram always fits a frame: ``copy_range + 512 <= frame_size``; the fallback is
    listed in ``fallbacks``), ``sockfd`` (bind on a ``NETLINK_NETFILTER`` socket opened
    elsewhere, duplicated: the queue of the namespace it was made in; one queue).
    """

    def batches(self, max: int = 64, timeout: Optional[float] = None) -> Iterator[Batch]:
        """Yields batches of up to ``max`` packets as they arrive (an empty batch when
        ``timeout`` seconds pass without one). A batch ends when the next is fetched (or the
        loop is left): its packets neither decided nor held get the default verdict."""
        try:
            while True:
                yield self.next_batch(max, timeout)
        finally:
            if self.bound:
                self.end_batch()

    def __aiter__(self):
        return self.abatches()

    async def abatches(self, max: int = 64):
        """``async for batch in q``: batches as they arrive, waiting in the running asyncio
        loop (``loop.add_reader`` on ``fileno()``) instead of a thread."""
        import asyncio

        loop = asyncio.get_running_loop()
        fd = self.fileno()
        try:
            while True:
                batch = self.ready_batch(max)
                if batch:
                    yield batch
                    continue
                ready = loop.create_future()

                def wake(fut=ready):
                    if not fut.done():
                        fut.set_result(None)

                loop.add_reader(fd, wake)
                try:
                    await ready
                finally:
                    loop.remove_reader(fd)
        finally:
            if self.bound:
                self.end_batch()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _Stream:
    """Iteration shared by NfLog and CtEvents: ``for entry in log`` (forever), ``batches()``,
    ``async for entry in log``."""

    def batches(self, timeout: Optional[float] = None):
        """Yields lists of entries as they arrive (empty after ``timeout`` seconds without)."""
        while True:
            yield self.next_batch(timeout)

    def __iter__(self):
        while True:
            yield from self.next_batch(None)

    async def __aiter__(self):
        import asyncio

        loop = asyncio.get_running_loop()
        fd = self.fileno()
        while True:
            got = self.ready_batch()
            if got:
                for e in got:
                    yield e
                continue
            ready = loop.create_future()

            def wake(fut=ready):
                if not fut.done():
                    fut.set_result(None)

            loop.add_reader(fd, wake)
            try:
                # Audit: an open event whose end-of-event record may never come closes after
                # its wait, which no readiness signals: wait at most that long.
                close = self._next_close()
                if close is None:
                    await ready
                else:
                    await asyncio.wait([ready], timeout=close)
            finally:
                loop.remove_reader(fd)

    def _next_close(self) -> Optional[float]:
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class NfLog(_Stream, _native.NfLog):
    """An NFLOG consumer: ``NfLog(5)`` reads what ``-j NFLOG --nflog-group 5`` rules log.

    Entries (``LogEntry``) carry group, hook, prefix, mark, devices, timestamp, uid/gid, the
    per-group sequence number and the payload (bytes). ``stats["lost"]`` counts the messages
    missing in sequence gaps, exactly; a loss after the last message that arrived shows in no
    gap, so ``stats["lost_at_least"]`` (with ``tail_batches``, the batches dropped at the
    socket after it), ``lost_at_most``, ``lost_exact`` and ``loss_summary`` say what is
    known. Options: ``copy_range``, ``meta``, ``nlbufsiz``, ``timeout`` (kernel flush
    timeout, seconds), ``qthresh``, ``seq``, ``conntrack``, ``sock_len``, ``frames``,
    ``uring``.
    """


class CtEvents(_Stream, _native.CtEvents):
    """Conntrack events (``conntrack -E``): ``CtEvents(new=True, update=True, destroy=True)``.

    Each ``CtEvent`` has kind ("new", "update", "destroy"), orig/reply tuples (dicts), status,
    timeout, mark, zone, id, and ``line``: the event as ``conntrack -E`` prints it.
    ``stats["lost"]`` counts events the kernel dropped at the socket (exactly);
    ``lost_at_least``/``lost_exact``/``loss_summary`` add what overruns say beyond it.
    """


class Audit(_Stream, _native.Audit):
    """The kernel's audit events: ``Audit()`` registers as the audit daemon (root:
    CAP_AUDIT_CONTROL; auditing is turned on, and set back at ``close()``), ``Audit(observer=True)``
    reads beside the registered one (CAP_AUDIT_READ). Audit exists only in the initial network
    namespace.

    Batches are lists of events, each a dict as ``zcio audit`` writes it in JSON: ``serial``,
    ``time``, ``end`` ("eoe", "single", "wait"), ``incomplete``, and ``records`` in arrival
    order, each with ``type``, ``name``, ``fields`` (hex-encoded values decoded) and ``text``
    (the fields as the kernel wrote them). An event without its end-of-event record closes
    ``event_wait`` seconds after its last record, at a later ``next_batch`` (or ``flush()``);
    ``async for`` waits on ``fileno()`` at most until ``next_close()`` for it.
    ``stats`` has the records, events, the kernel's ``lost`` counter at open and now, the
    socket's drops and incomplete events, and ``lost_at_least``/``lost_exact``/
    ``loss_summary``. Options: ``observer``, ``fallback``, ``enable``, ``backlog_limit``,
    ``backlog_wait_time``, ``rate_limit``, ``event_wait``, ``sock_len``, ``frames``, ``uring``.
    """

    def _next_close(self) -> Optional[float]:
        return self.next_close()


def _split(first: int, last: int, threads: int) -> List[range]:
    n = last - first + 1
    threads = max(1, min(threads, n))
    out, q = [], first
    for t in range(threads):
        k = n // threads + (1 if t < n % threads else 0)
        out.append(range(q, q + k))
        q += k
    return out


class FanOut:
    """One consumer thread per part of a queue range, as ``zcio nfq --threads N``: queues
    ``first..last`` are split into ``threads`` contiguous parts, each bound and served by its
    own thread (pinned to CPU ``t % ncpu`` with ``pin=True``), which calls ``handler(batch)``
    for every batch. With ``--queue-balance first:last --queue-cpu-fanout`` on the rule a
    packet is received, decided and reinjected on the CPU it arrived on. The GIL is released
    while each thread waits and while the kernel reinjects its verdicts.

    ``start()`` binds every queue (raising the first error); ``stop()`` ends the threads and
    returns the summed counters.
    """

    def __init__(
        self,
        first: int,
        last: int,
        handler: Callable[[Batch], None],
        *,
        threads: Optional[int] = None,
        max: int = 64,
        pin: bool = True,
        **queue_options,
    ):
        self._parts = _split(first, last, threads or (last - first + 1))
        self._handler = handler
        self._max = max
        self._pin = pin
        self._opts = queue_options
        self._stop = _threading.Event()
        self._threads: List[_threading.Thread] = []
        self._errors: List[BaseException] = []
        self._stats: List[dict] = []
        self._lock = _threading.Lock()

    def _worker(self, t: int, part: range, bound: _threading.Event):
        try:
            if self._pin:
                cpus = sorted(_os.sched_getaffinity(0))
                _os.sched_setaffinity(0, {cpus[t % len(cpus)]})
            q = NfQueue(part.start, part.stop - 1, **self._opts)
        except BaseException as e:  # reported by start()
            with self._lock:
                self._errors.append(e)
            bound.set()
            return
        bound.set()
        try:
            while not self._stop.is_set():
                batch = q.next_batch(self._max, 0.05)
                if batch:
                    self._handler(batch)
        except BaseException as e:
            with self._lock:
                self._errors.append(e)
        finally:
            q.close()
            with self._lock:
                self._stats.append(dict(q.stats))

    def start(self) -> "FanOut":
        for t, part in enumerate(self._parts):
            bound = _threading.Event()
            th = _threading.Thread(
                target=self._worker, args=(t, part, bound), name=f"zcio-nfq-{part.start}", daemon=True
            )
            th.start()
            bound.wait()
            self._threads.append(th)
        if self._errors:
            self.stop()
        return self

    def stop(self, timeout: Optional[float] = None) -> dict:
        self._stop.set()
        for th in self._threads:
            th.join(timeout)
        if self._errors:
            raise self._errors[0]
        total: dict = {}
        for s in self._stats:
            for k, v in s.items():
                if isinstance(v, bool):
                    continue
                total[k] = total.get(k, 0) + v
        return total

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


_NETLINK_NETFILTER = 12

# netfilterqueue's defaults: 1024 packets of up to 4016 + 780 bytes, half of them.
_DEFAULT_MAX_QUEUELEN = 1024
_SOCK_RCV_SIZE = _DEFAULT_MAX_QUEUELEN * (4096 - 80 + 760 + 20) // 2


def _named_as_cython(cls):
    """Names the frames of ``cls``'s methods as Cython names netfilterqueue's
    (``netfilterqueue._impl.NetfilterQueue.run``): module, class and method, so a traceback
    through ``run`` shows a ``NetfilterQueue.run`` frame, as netfilterqueue's own tests check
    for. Only the code objects' names change."""
    for name in ("run", "run_socket"):
        f = cls.__dict__[name]
        f.__code__ = f.__code__.replace(co_name=f"zcio.{cls.__name__}.{name}")
    return cls


@_named_as_cython
class NetfilterQueue:
    """A drop-in for ``netfilterqueue.NetfilterQueue`` (1.1.0) on zcio's frame ring.

    As netfilterqueue: a callback that raises leaves its packet undecided (decide it after
    ``run`` re-raised; zcio's batch API gives it the default verdict instead); ``sockfd``
    (a ``NETLINK_NETFILTER`` socket opened elsewhere, e.g. by a privileged parent or in another
    network namespace) is used, duplicated, frame ring included. Differences, each
    deliberate: ``unbind`` gives every packet still undecided the default verdict (DROP
    unless ``bind(default_verdict=...)``; netfilterqueue leaves them to the kernel, which
    drops them); packets are received and their verdicts sent in batches; ``range`` is not
    capped at 4016 bytes; ``bind`` takes ``fail_open`` (and ``default_verdict``); ENOBUFS is
    counted in ``stats`` and never ends ``run``.
    """

    def __init__(self, *, af: int = _socket.AF_INET, sockfd: int = -1):
        self._af = af
        self._q: Optional[_native.NfQueue] = None
        self._cb = None
        self._sockfd = -1
        if sockfd >= 0:
            # As netfilterqueue (which dup2()s it over libnfnetlink's socket): our own
            # descriptor for the caller's socket, checked now.
            try:
                fd = _os.dup(sockfd)
            except OSError as e:
                raise OSError(e.errno, "dup2 failed") from None
            try:
                with _socket.socket(fileno=_os.dup(fd)) as s:
                    kind = (s.family, s.proto)
                if kind != (_socket.AF_NETLINK, _NETLINK_NETFILTER):
                    raise OSError(
                        _errno.EPROTOTYPE,
                        f"socket {sockfd} is {kind}, not (AF_NETLINK, NETLINK_NETFILTER)",
                    )
            except OSError as e:
                _os.close(fd)
                raise OSError(e.errno, f"Failed to open NFQueue. ({e.strerror or e})") from None
            self._sockfd = fd

    def bind(
        self,
        queue_num: int,
        user_callback: Callable[[Packet], None],
        max_len: int = _DEFAULT_MAX_QUEUELEN,
        mode: int = COPY_PACKET,
        range: int = 0xFFFF,
        sock_len: int = _SOCK_RCV_SIZE,
        fail_open: bool = False,
        default_verdict: int = DROP,
        uid_gid: bool = False,
    ) -> None:
        """Create and bind to queue ``queue_num`` (netfilterqueue's arguments, plus
        ``fail_open``, ``default_verdict`` and ``uid_gid``: fill ``Packet.uid``/``gid`` of
        locally generated packets)."""
        if self._q is not None:
            raise RuntimeError("A queue is already bound; use unbind() first")
        q = _native.NfQueue(
            queue_num,
            copy_range=range,
            meta=(mode != COPY_PACKET),
            max_len=max_len,
            fail_open=fail_open,
            sock_len=sock_len,
            default_verdict=default_verdict,
            uid_gid=uid_gid,
            uring=False,
            compat=True,
            sockfd=self._sockfd if self._sockfd >= 0 else None,
        )
        self._q, self._cb = q, user_callback
        with _socket.fromfd(q.socket_fd(), _socket.AF_NETLINK, _socket.SOCK_RAW) as s:
            got = s.getsockopt(_socket.SOL_SOCKET, _socket.SO_RCVBUF)
        if got != sock_len * 2:
            try:
                _warnings.warn(
                    "Socket rcvbuf limit is now %d, requested %d." % (got, sock_len),
                    category=RuntimeWarning,
                    stacklevel=2,
                )
            except BaseException:  # warnings turned into errors
                self.unbind()
                raise

    def unbind(self) -> None:
        """Unbind the queue; packets still undecided get the default verdict."""
        q, self._q, self._cb = self._q, None, None
        if q is not None:
            q.close()

    def get_fd(self) -> int:
        """The netlink socket: poll it for readability, then call ``run(block=False)``."""
        return self._bound().socket_fd()

    def run(self, block: bool = True) -> None:
        """Send packets to the callback; with ``block`` until an exception (Ctrl+C)."""
        self._bound().run(self._cb, block)

    def run_socket(self, s) -> None:
        """Like ``run``, reading datagrams with ``s.recv`` (a socket made from ``get_fd()``, so
        that e.g. gevent can monkeypatch it)."""
        q = self._bound()
        while True:
            try:
                buf = s.recv(1 << 17)
            except OSError as e:
                if e.errno == _errno.ENOBUFS:
                    continue
                if e.errno in (_errno.EAGAIN, _errno.EWOULDBLOCK):
                    break
                raise
            q.feed(buf)
            q.run(self._cb, False)

    @property
    def stats(self) -> dict:
        """zcio's counters for the bound queue (received, accepted, dropped, overruns, ...)."""
        return dict(self._bound().stats)

    def _bound(self) -> _native.NfQueue:
        if self._q is None:
            raise RuntimeError("No queue is bound; call bind() first")
        return self._q

    def __del__(self):
        try:
            self.unbind()
        except Exception:
            pass
        if getattr(self, "_sockfd", -1) >= 0:
            _os.close(self._sockfd)
            self._sockfd = -1

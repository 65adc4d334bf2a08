//! `MSG_ZEROCOPY` backend (Linux 4.14; UDP 5.0): `send(MSG_ZEROCOPY)` lends the pages, the
//! batched error-queue reaper ([`crate::sys::errqueue::reap`]) returns them.
//!
//! Calls are made without blocking (`MSG_DONTWAIT`; ordering on stream sockets is the call
//! order); completions are reaped without blocking every `notify_limit` accepted calls, and
//! by `poll(POLLERR)` when the caller waits. A full socket buffer (`EAGAIN`) or no room for
//! notification state (`ENOBUFS`: the socket's `optmem_max` budget is used up) *stalls* the
//! backend: the request goes back in order, nothing more is called until the socket is
//! writable or completions came back ([`MsgZc::stall`]), and the owner refuses new sends
//! meanwhile (backpressure, never an error).

use super::copy;
use super::core::{Finished, Request, SendTracker};
use crate::buf::lent::Lent;
use crate::sys::errqueue::{self, QueuedError, ZcRange};
use crate::sys::msg::{self, MsgOpts};
use crate::sys::{net, MSG_ZEROCOPY};
use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A finished `MSG_ZEROCOPY` send.
#[derive(Debug)]
pub(crate) struct MsgDone {
    pub tag: u64,
    pub buf: Lent,
    /// Bytes accepted by zero-copy calls.
    pub zc_bytes: usize,
    /// Bytes sent by copy because even an empty queue had no room (ENOBUFS), or because
    /// the socket stopped taking zero-copy calls (EOPNOTSUPP).
    pub copy_bytes: usize,
    pub error: Option<i32>,
    pub ranges_zc: u32,
    pub ranges_copied: u32,
}

/// Counters of the backend.
#[derive(Debug, Default, Clone)]
pub(crate) struct MsgStats {
    pub send_calls: u64,
    pub notify_calls: u64,
    pub ranges: u64,
    pub enobufs_waits: u64,
    pub enobufs_copies: u64,
    pub unknown_ids: u64,
    pub queued_errors: u64,
    pub last_queued_error: Option<QueuedError>,
}

/// Why a [`MsgZc`] makes no calls for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stall {
    /// The socket buffer is full: wait for `POLLOUT`.
    Full,
    /// No room for notification state (`ENOBUFS`): wait for completions (`POLLERR`).
    NoRoom,
}

/// The `MSG_ZEROCOPY` backend: the syscalls around a [`SendTracker`], which maps every
/// errqueue sequence number to the request (and buffer) that took it.
#[derive(Debug)]
pub(crate) struct MsgZc {
    fd: Arc<OwnedFd>,
    stream: bool,
    chunk: usize,
    notify_limit: usize,
    since_reap: usize,
    tracker: SendTracker<Lent>,
    stall: Option<Stall>,
    /// Bytes of live sends that went by copy, by ticket (rare: only ENOBUFS/EOPNOTSUPP).
    copied_by_copy: HashMap<u64, usize>,
    reqs: Vec<Request>,
    /// Destination and control messages of sends to a [`super::Dest`], by tag (and whether
    /// the socket is IPv6).
    dests: HashMap<u64, (MsgOpts, bool)>,
    ranges: Vec<ZcRange>,
    errors: Vec<QueuedError>,
    pub stats: MsgStats,
}

impl MsgZc {
    /// Enables `SO_ZEROCOPY`; the error says why the socket cannot be used (in words).
    ///
    /// A socket that already has `SO_ZEROCOPY` on is refused: it (or another descriptor of
    /// the same socket, e.g. a dup) may have sent with `MSG_ZEROCOPY` before, and the
    /// kernel's completion numbers count from the socket's first such send, not from ours;
    /// there is no call that reads the counter, so every range would be matched to the
    /// wrong buffer.
    pub(crate) fn new(
        fd: Arc<OwnedFd>,
        stream: bool,
        chunk: usize,
        notify_limit: usize,
    ) -> Result<Self, String> {
        if matches!(
            crate::sys::getsockopt_int(&*fd, libc::SOL_SOCKET, crate::sys::SO_ZEROCOPY),
            Ok(v) if v != 0
        ) {
            return Err(
                "the socket already has SO_ZEROCOPY on: it (or a dup of it) may have \
                        sent with MSG_ZEROCOPY before, and its completion numbers cannot be \
                        matched to this sender's buffers; pass a socket that never enabled \
                        SO_ZEROCOPY to use msg-zc"
                    .to_string(),
            );
        }
        net::enable_zerocopy(&*fd).map_err(|e| {
            format!(
                "setsockopt(SO_ZEROCOPY) refused: {e}; MSG_ZEROCOPY needs a TCP or UDP socket \
                 (AF_INET/AF_INET6) on Linux 4.14+ (UDP 5.0+)"
            )
        })?;
        Ok(Self {
            fd,
            stream,
            chunk: chunk.max(1),
            notify_limit: notify_limit.max(1),
            since_reap: 0,
            tracker: SendTracker::new(stream, chunk.max(1)),
            stall: None,
            copied_by_copy: HashMap::new(),
            reqs: Vec::with_capacity(1),
            dests: HashMap::new(),
            ranges: Vec::with_capacity(64),
            errors: Vec::new(),
            stats: MsgStats::default(),
        })
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.tracker.live()
    }

    /// The socket is being closed (or failed): sends not yet called fail with `errno`;
    /// those the kernel holds complete as their notifications come.
    pub(crate) fn fail(&mut self, errno: i32) {
        self.tracker.fail(errno);
        self.stall = None;
    }

    /// Why no call is made now, if none is.
    pub(crate) fn stall(&self) -> Option<Stall> {
        self.stall
    }

    /// The socket polled writable: calls may go on.
    pub(crate) fn on_writable(&mut self) {
        if self.stall == Some(Stall::Full) {
            self.stall = None;
        }
        self.pump();
    }

    pub(crate) fn next_done(&mut self) -> Option<MsgDone> {
        let f: Finished<Lent> = self.tracker.next_done()?;
        if !self.dests.is_empty() {
            self.dests.remove(&f.tag);
        }
        let copy_bytes = self.copied_by_copy.remove(&f.tag).unwrap_or(0);
        Some(MsgDone {
            tag: f.tag,
            zc_bytes: f.bytes.saturating_sub(copy_bytes),
            copy_bytes,
            error: f.error,
            ranges_zc: f.zc + f.unknown,
            ranges_copied: f.copied,
            buf: f.buf,
        })
    }

    /// Sends `buf` with `MSG_ZEROCOPY`, in `chunk`-byte calls, as far as the socket takes
    /// them now (the rest goes when it is writable again); the buffer comes back through
    /// [`MsgZc::next_done`] once the errqueue has completed every call.
    /// A send with `dest` (a [`super::Dest`]'s options and the socket's family) is one
    /// `sendmsg(MSG_ZEROCOPY)` with the destination and the same control messages as on the
    /// ring.
    pub(crate) fn send(&mut self, tag: u64, buf: Lent, dest: Option<(MsgOpts, bool)>) {
        if let Some(d) = dest {
            self.dests.insert(tag, d);
        }
        let len = buf.len();
        self.tracker.stage(tag, buf, len);
        self.pump();
    }

    /// Makes the calls of every request the tracker lets go now, one at a time (a call's
    /// result is known before the next: on a stream, a short send is continued first).
    fn pump(&mut self) {
        while self.stall.is_none() {
            self.tracker.pop_requests(1, &mut self.reqs);
            let Some(r) = self.reqs.pop() else { break };
            self.call(r);
        }
        if self.tracker.gave_up().is_some()
            && self.tracker.in_kernel() == 0
            && self.tracker.staged() == 0
        {
            // The socket stopped taking zero-copy calls: what is left goes by copy, in
            // ticket order (nothing is in the middle of a call, so nothing overtakes it).
            let (fd, chunk, stats, extra, dests) = (
                &self.fd,
                self.chunk,
                &mut self.stats,
                &mut self.copied_by_copy,
                &self.dests,
            );
            self.tracker.send_unsent(|tag, buf, off, len| {
                let out = match dests.get(&tag) {
                    Some((o, v6)) => copy::send_msg(&**fd, &buf[off..off + len], o, *v6, true),
                    None => copy::send_all(&**fd, &buf[off..off + len], chunk),
                };
                stats.send_calls += out.syscalls;
                *extra.entry(tag).or_default() += out.bytes;
                (out.bytes, out.error)
            });
        }
    }

    /// One request: its `send(MSG_ZEROCOPY)` call and the result fed to the tracker. A full
    /// socket buffer or no room for notification state gives the request back (in order)
    /// and stalls the backend.
    fn call(&mut self, r: Request) {
        self.stats.send_calls += 1;
        let piece = &self.tracker.buf(r.key.slot)[r.off..r.off + r.len];
        let flags = MSG_ZEROCOPY | libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
        let dest = if self.dests.is_empty() {
            None
        } else {
            self.dests.get(&self.tracker.tag(r.key.slot)).copied()
        };
        let res = match &dest {
            Some((o, v6)) => msg::sendmsg(&*self.fd, &[piece], o, *v6, flags),
            None => net::send(&*self.fd, piece, flags),
        };
        match res {
            Ok(n) => {
                // A call that moved bytes took a sequence number; one that moved none gave it
                // back (the kernel aborts the notification).
                self.tracker.on_sent(r.key, res_of(n), n > 0);
                self.since_reap += 1;
                if self.since_reap >= self.notify_limit {
                    self.reap();
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                if self.tracker.errq_outstanding() > 0 {
                    // optmem_max reached: completions free the notification state.
                    self.stats.enobufs_waits += 1;
                    self.tracker.withdraw(r.key);
                    self.stall = Some(Stall::NoRoom);
                    return;
                }
                // No room even with nothing in flight: send this piece by copy.
                self.stats.enobufs_copies += 1;
                let out = match &dest {
                    Some((o, v6)) => copy::send_msg(&*self.fd, piece, o, *v6, false),
                    None => copy::send_nb(&*self.fd, piece, self.chunk, 0),
                };
                self.stats.send_calls += out.syscalls;
                if let Some(errno) = out.error.filter(|_| out.bytes == 0) {
                    self.tracker.on_sent(r.key, -errno, false);
                } else if out.bytes == 0 {
                    self.tracker.withdraw(r.key);
                    self.stall = Some(Stall::Full);
                } else {
                    // What was copied counts; a short copy on a stream is continued next.
                    let tag = self.tracker.tag(r.key.slot);
                    *self.copied_by_copy.entry(tag).or_default() += out.bytes;
                    self.tracker.on_sent(r.key, res_of(out.bytes), false);
                    if out.would_block {
                        self.stall = Some(Stall::Full);
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.tracker.withdraw(r.key);
                self.stall = Some(Stall::Full);
            }
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                if self.stream {
                    self.tracker.on_sent(r.key, -errno, false);
                    // What completed normally is reaped now; the rest carries the error.
                    self.reap();
                } else {
                    // A datagram can fail after the kernel built it (and took a sequence
                    // number); its completion is then already queued. Look for it.
                    let id = self.tracker.errq_next();
                    self.reap_raw(true);
                    let took = self.ranges.iter().any(|r| r.contains(id));
                    self.tracker.on_sent(r.key, -errno, took);
                    self.apply_ranges();
                }
            }
        }
    }

    /// Non-blocking batched reap; calls stalled for room go on when completions came.
    pub(crate) fn reap(&mut self) {
        self.since_reap = 0;
        if self.tracker.errq_outstanding() == 0 {
            if self.stall == Some(Stall::NoRoom) {
                self.stall = None;
                self.pump();
            }
            return;
        }
        let before = self.tracker.errq_outstanding();
        self.reap_raw(false);
        self.apply_ranges();
        if self.stall == Some(Stall::NoRoom) && self.tracker.errq_outstanding() < before {
            self.stall = None;
            self.pump();
        }
    }

    /// Reads the error queue one message at a time and stops at `EAGAIN`, or (unless `full`)
    /// after a message that starts at the oldest outstanding send: the kernel merges
    /// in-order completions into the queued tail message, so such a message holds every
    /// completion available, and the read that would only return `EAGAIN` is skipped. A
    /// message starting later means completions came out of order and more are queued.
    fn reap_raw(&mut self, full: bool) {
        let oldest = self.tracker.errq_oldest();
        loop {
            let r = errqueue::reap(&*self.fd, &mut self.ranges, &mut self.errors, 1);
            let (calls, msgs) = match r {
                Ok(r) => (r.syscalls, r.messages),
                Err(_) => (1, 0),
            };
            self.stats.notify_calls += calls;
            if msgs == 0 {
                break;
            }
            let covered: u64 = self.ranges.iter().map(|r| r.len()).sum();
            let in_order = self.ranges.iter().any(|r| r.contains(oldest));
            if !full && (in_order || covered >= self.tracker.errq_outstanding() as u64) {
                break;
            }
        }
        for e in self.errors.drain(..) {
            self.stats.queued_errors += 1;
            self.stats.last_queued_error = Some(e);
        }
    }

    fn apply_ranges(&mut self) {
        for r in self.ranges.drain(..) {
            self.stats.ranges += 1;
            self.stats.unknown_ids += self.tracker.on_range(r.lo, r.hi, r.copied);
        }
    }

    /// Waits up to `timeout` for completions (`poll(POLLERR)`) or, when stalled on a full
    /// socket buffer, for room (`POLLOUT`); reaps, and makes the calls that may go now.
    pub(crate) fn wait(&mut self, timeout: Duration) {
        self.wait_completions(timeout);
        self.pump();
    }

    fn wait_completions(&mut self, timeout: Duration) {
        let out = self.stall == Some(Stall::Full);
        if self.tracker.errq_outstanding() == 0 && !out {
            return;
        }
        self.stats.notify_calls += 1;
        let ms = timeout.as_millis().clamp(0, i32::MAX as u128) as i32;
        let events = libc::POLLERR | if out { libc::POLLOUT } else { 0 };
        let rev = net::poll_one(&*self.fd, events, ms).unwrap_or(0);
        if rev & libc::POLLOUT != 0 && out {
            self.stall = None;
        }
        let before = self.tracker.errq_outstanding();
        self.reap();
        if rev & (libc::POLLERR | libc::POLLHUP) != 0
            && before == self.tracker.errq_outstanding()
            && before > 0
        {
            // POLLERR without a completion: a socket error (reset). Read and clear it.
            self.stats.notify_calls += 1;
            if let Ok(e) = crate::sys::getsockopt_int(&*self.fd, libc::SOL_SOCKET, libc::SO_ERROR) {
                if e != 0 && self.stream {
                    self.tracker.fail(e);
                    self.stall = None;
                }
            }
            if rev & libc::POLLHUP != 0 {
                // Nothing will wake us for the rest: avoid spinning.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Waits until nothing is in flight or `timeout` passes.
    pub(crate) fn drain(&mut self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while self.tracker.live() > 0 {
            let now = Instant::now();
            if now >= end {
                return false;
            }
            self.wait((end - now).min(Duration::from_millis(100)));
        }
        true
    }
}

fn res_of(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

impl Drop for MsgZc {
    fn drop(&mut self) {
        if self.tracker.live() > 0 {
            self.drain(Duration::from_secs(2));
        }
        let mut leaked = 0;
        for b in self.tracker.take_live() {
            // The kernel may still read these pages: never let the pool reuse them.
            std::mem::forget(b);
            leaked += 1;
        }
        if leaked > 0 {
            tracing::warn!(
                leaked,
                "MSG_ZEROCOPY sender dropped with sends in flight: buffers leaked, not reused"
            );
        }
    }
}

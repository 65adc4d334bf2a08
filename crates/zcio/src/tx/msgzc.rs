//! `MSG_ZEROCOPY` backend (Linux 4.14; UDP 5.0): `send(MSG_ZEROCOPY)` lends the pages, the
//! batched error-queue reaper ([`crate::sys::errqueue::reap`]) returns them.
//!
//! Sends are synchronous (ordering on stream sockets is the call order); completions are
//! reaped without blocking every `notify_limit` accepted calls, and by `poll(POLLERR)` when the
//! caller waits. `ENOBUFS` (the socket's `optmem_max` budget for notification state is used
//! up) is backpressure: reap, wait for completions, retry; never an error to the caller.

use super::copy;
use super::track::IdTracker;
use crate::buf::pool::PoolBuf;
use crate::sys::errqueue::{self, QueuedError, ZcRange};
use crate::sys::{net, MSG_ZEROCOPY};
use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Slot {
    buf: Option<PoolBuf>,
    tag: u64,
    done: usize,
    ids: u32,
    zc: u32,
    copied: u32,
    copy_bytes: usize,
    error: Option<i32>,
}

/// A finished `MSG_ZEROCOPY` send.
#[derive(Debug)]
pub(crate) struct MsgDone {
    pub tag: u64,
    pub buf: PoolBuf,
    /// Bytes accepted by zero-copy calls.
    pub zc_bytes: usize,
    /// Bytes sent by copy because even an empty queue had no room (ENOBUFS).
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

#[derive(Debug)]
pub(crate) struct MsgZc {
    fd: Arc<OwnedFd>,
    stream: bool,
    chunk: usize,
    notify_limit: usize,
    since_reap: usize,
    tracker: IdTracker,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    live: usize,
    ranges: Vec<ZcRange>,
    errors: Vec<QueuedError>,
    done: VecDeque<MsgDone>,
    fatal: Option<i32>,
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
            tracker: IdTracker::new(0),
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            ranges: Vec::with_capacity(64),
            errors: Vec::new(),
            done: VecDeque::new(),
            fatal: None,
            stats: MsgStats::default(),
        })
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.live
    }

    pub(crate) fn next_done(&mut self) -> Option<MsgDone> {
        self.done.pop_front()
    }

    /// Sends `buf` (non-empty) with `MSG_ZEROCOPY`, in `chunk`-byte calls.
    pub(crate) fn send(&mut self, tag: u64, buf: PoolBuf) {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
        };
        let mut slot = Slot {
            buf: None,
            tag,
            done: 0,
            ids: 0,
            zc: 0,
            copied: 0,
            copy_bytes: 0,
            error: self.fatal,
        };
        if self.fatal.is_some() {
            slot.buf = Some(buf);
            self.slots[idx as usize] = Some(slot);
            self.live += 1;
            self.finish(idx);
            return;
        }
        // The slot is registered before the calls (completions may arrive for its first
        // chunks while later ones are sent) but holds no buffer until they are done, so it
        // cannot finish early.
        self.slots[idx as usize] = Some(slot);
        self.live += 1;
        let len = buf.len();
        let mut off = 0;
        let mut error = None;
        while off < len {
            let end = off.saturating_add(self.chunk).min(len);
            self.stats.send_calls += 1;
            match net::send(&*self.fd, &buf[off..end], MSG_ZEROCOPY | libc::MSG_NOSIGNAL) {
                Ok(n) => {
                    self.tracker.push(idx);
                    let s = self.slot(idx);
                    s.ids += 1;
                    s.done += n;
                    off += n;
                    self.since_reap += 1;
                    if self.since_reap >= self.notify_limit {
                        self.reap();
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    if self.tracker.outstanding() > 0 {
                        // optmem_max reached: completions free the notification state.
                        self.stats.enobufs_waits += 1;
                        self.wait(Duration::from_millis(50));
                    } else {
                        // No room even with nothing in flight: send this piece by copy.
                        self.stats.enobufs_copies += 1;
                        let out = copy::send_all(&*self.fd, &buf[off..end], self.chunk);
                        self.stats.send_calls += out.syscalls;
                        off += out.bytes;
                        self.slot(idx).copy_bytes += out.bytes;
                        if out.error.is_some() {
                            error = out.error;
                            break;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.stats.notify_calls += 1;
                    let _ = net::poll_one(&*self.fd, libc::POLLOUT, 100);
                    self.reap();
                }
                Err(e) => {
                    let errno = e.raw_os_error().unwrap_or(libc::EIO);
                    if !self.stream {
                        // A datagram can fail after the kernel built it (and took a sequence
                        // number); its completion is then already queued. Look for it.
                        let id = self.tracker.next_id();
                        self.reap_raw(true);
                        if self.ranges.iter().any(|r| r.contains(id)) {
                            self.tracker.push(idx);
                            self.slot(idx).ids += 1;
                        }
                        self.apply_ranges();
                    }
                    error = Some(errno);
                    break;
                }
            }
        }
        let s = self.slot(idx);
        s.buf = Some(buf);
        if let Some(e) = error {
            s.error.get_or_insert(e);
            if self.stream {
                self.fail_all(e);
            }
        }
        self.finish(idx);
    }

    /// A stream failed: reap what completed normally, then mark every send still in flight
    /// with the error (its data was accepted but may never arrive).
    fn fail_all(&mut self, e: i32) {
        self.fatal = Some(e);
        self.reap();
        for s in self.slots.iter_mut().flatten() {
            s.error.get_or_insert(e);
        }
    }

    /// Non-blocking batched reap.
    pub(crate) fn reap(&mut self) {
        self.since_reap = 0;
        if self.tracker.outstanding() == 0 {
            return;
        }
        self.reap_raw(false);
        self.apply_ranges();
    }

    /// Reads the error queue one message at a time and stops at `EAGAIN`, or (unless `full`)
    /// after a message that starts at the oldest outstanding send: the kernel merges
    /// in-order completions into the queued tail message, so such a message holds every
    /// completion available, and the read that would only return `EAGAIN` is skipped. A
    /// message starting later means completions came out of order and more are queued.
    fn reap_raw(&mut self, full: bool) {
        let oldest = self.tracker.oldest();
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
            if !full && (in_order || covered >= self.tracker.outstanding() as u64) {
                break;
            }
        }
        for e in self.errors.drain(..) {
            self.stats.queued_errors += 1;
            self.stats.last_queued_error = Some(e);
        }
    }

    fn apply_ranges(&mut self) {
        let mut hit: Vec<(u32, bool)> = Vec::new();
        for r in self.ranges.drain(..) {
            self.stats.ranges += 1;
            let copied = r.copied;
            self.stats.unknown_ids += self.tracker.complete(r, |slot| hit.push((slot, copied)));
        }
        for (idx, copied) in hit {
            let s = self.slot(idx);
            s.ids -= 1;
            if copied {
                s.copied += 1;
            } else {
                s.zc += 1;
            }
            self.finish(idx);
        }
    }

    /// Waits up to `timeout` for completions (`poll(POLLERR)`), then reaps.
    pub(crate) fn wait(&mut self, timeout: Duration) {
        if self.tracker.outstanding() == 0 {
            return;
        }
        self.stats.notify_calls += 1;
        let ms = timeout.as_millis().clamp(0, i32::MAX as u128) as i32;
        let rev = net::poll_one(&*self.fd, libc::POLLERR, ms).unwrap_or(0);
        let before = self.tracker.outstanding();
        self.reap();
        if rev & (libc::POLLERR | libc::POLLHUP) != 0 && before == self.tracker.outstanding() {
            // POLLERR without a completion: a socket error (reset). Read and clear it.
            self.stats.notify_calls += 1;
            if let Ok(e) = crate::sys::getsockopt_int(&*self.fd, libc::SOL_SOCKET, libc::SO_ERROR) {
                if e != 0 && self.stream {
                    self.fail_all(e);
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
        while self.live > 0 {
            let now = Instant::now();
            if now >= end {
                return false;
            }
            self.wait((end - now).min(Duration::from_millis(100)));
        }
        true
    }

    fn slot(&mut self, idx: u32) -> &mut Slot {
        self.slots[idx as usize].as_mut().expect("live slot")
    }

    fn finish(&mut self, idx: u32) {
        let ready = matches!(&self.slots[idx as usize], Some(s) if s.ids == 0 && s.buf.is_some());
        if !ready {
            return;
        }
        let s = self.slots[idx as usize].take().expect("checked");
        self.free.push(idx);
        self.live -= 1;
        self.done.push_back(MsgDone {
            tag: s.tag,
            buf: s.buf.expect("checked"),
            zc_bytes: s.done,
            copy_bytes: s.copy_bytes,
            error: s.error,
            ranges_zc: s.zc,
            ranges_copied: s.copied,
        });
    }
}

impl Drop for MsgZc {
    fn drop(&mut self) {
        if self.live > 0 {
            self.drain(Duration::from_secs(2));
        }
        let mut leaked = 0;
        for s in self.slots.iter_mut().filter_map(Option::take) {
            // The kernel may still read these pages: never let the pool reuse them.
            if let Some(b) = s.buf {
                std::mem::forget(b);
                leaked += 1;
            }
        }
        if leaked > 0 {
            tracing::warn!(
                leaked,
                "MSG_ZEROCOPY sender dropped with sends in flight: buffers leaked, not reused"
            );
        }
    }
}

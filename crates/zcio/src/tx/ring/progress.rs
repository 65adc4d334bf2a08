//! Progress of a [`SendRing`]: submit, poll, harvest, the waits, and the completions and
//! writable sockets they produce.

use super::SendRing;
use crate::sys;
use crate::tx::{Completion, SockId, TxBuf, TxError};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

impl SendRing {
    /// Submits the queued requests of every socket with one `io_uring_enter` (no syscall when
    /// nothing is queued) and collects what has completed. With nothing queued it only reads
    /// what the kernel has posted: zero-copy notifications waiting as deferred task work need
    /// [`SendRing::poll`], [`SendRing::wait`] or [`SendRing::on_ready`].
    pub fn submit(&mut self) -> Result<(), TxError> {
        self.quiet(false);
        if let Err(e) = self.ring_submit() {
            self.ring_failed(e);
        }
        self.unquiet();
        Ok(())
    }

    /// Makes progress without blocking: submits queued io_uring requests, reaps ready
    /// completions and error queues, continues stalled sends. Returns the number of
    /// completions ready. On io_uring paths it enters the kernel only when requests are
    /// queued or the kernel flagged deferred task work while buffers are out (under
    /// `DEFER_TASKRUN` a zero-copy notification is posted only by an enter of the ring's
    /// thread): a loop that only polls sees every completion.
    pub fn poll(&mut self) -> Result<usize, TxError> {
        self.quiet(false);
        let res = self.ring_progress(true);
        if let Err(e) = res {
            self.ring_failed(e);
        }
        self.reap_syscall_paths();
        self.unquiet();
        Ok(self.ready.len())
    }

    /// Like [`SendRing::poll`], but leaves queued io_uring requests queued until
    /// `submit_batch` of them are there: on io_uring paths it only reads completions and
    /// notifications the kernel has already posted (no syscall). Requests those let go (a
    /// stream chain ended) wait for the next submit, poll, wait or `on_ready`, and the
    /// readiness descriptor, if made, is left readable for them. Returns the number of
    /// completions ready.
    pub fn harvest(&mut self) -> Result<usize, TxError> {
        self.quiet(false);
        if let Err(e) = self.ring_harvest_only(false) {
            self.ring_failed(e);
        }
        self.reap_syscall_paths();
        self.unquiet();
        Ok(self.ready.len())
    }

    /// Blocks until at least one completion is ready, nothing is in flight, a socket that was
    /// refused can take sends again ([`SendRing::next_writable`] names it), or `timeout`
    /// passes. Returns the number of completions ready.
    pub fn wait(&mut self, timeout: Duration) -> Result<usize, TxError> {
        let end = Instant::now() + timeout;
        let writable_before = self.writable_events;
        self.poll()?;
        // Buffers of abandoned sockets come back only while the ring is entered: a wait
        // with nothing else in flight drives them too.
        while self.ready.is_empty() && (self.in_flight() > 0 || self.ignored_in_kernel() > 0) {
            // A refused socket that can send again is what a caller waiting for room waits
            // for, even when sends stuck in a failed ring stay in flight for good (they are
            // reported by `flush` and `check_stuck`; the socket goes on by copy).
            if self.writable_events > writable_before {
                break;
            }
            let now = Instant::now();
            if now >= end {
                break;
            }
            self.wait_inner(end - now)?;
        }
        Ok(self.ready.len())
    }

    /// Waits until every send has completed (their completions are then ready).
    pub fn flush(&mut self, timeout: Duration) -> Result<(), TxError> {
        let t0 = Instant::now();
        let end = t0 + timeout;
        self.poll()?;
        while self.in_flight() > 0 {
            let now = Instant::now();
            if now >= end {
                return Err(TxError::Timeout {
                    in_flight: self.in_flight(),
                    waited: t0.elapsed(),
                });
            }
            self.wait_inner((end - now).min(Duration::from_millis(100)))?;
        }
        Ok(())
    }

    /// One bounded wait for progress: on the ring when only ring sends are out, on the one
    /// syscall-path socket when only it has sends out, else on the readiness set.
    pub(super) fn wait_inner(&mut self, timeout: Duration) -> Result<(), TxError> {
        let timeout = timeout.min(Duration::from_millis(100));
        let ring_out = self.ring_in_flight() + self.ignored_in_kernel();
        let dead = self.uring.as_ref().is_some_and(|u| u.lr.is_dead());
        // Only the listed syscall-path sockets can have sends of their own out.
        let sys_socks: Vec<u32> = self
            .sys_busy
            .iter()
            .copied()
            .filter(|&i| {
                self.socks[i as usize]
                    .as_ref()
                    .is_some_and(|s| s.sys_in_flight() > 0)
            })
            .collect();
        if ring_out > 0 && dead && sys_socks.is_empty() {
            // Nothing can come back from an abandoned ring: say so instead of spinning.
            return Err(self.dead_ring_error());
        }
        if sys_socks.is_empty() {
            if ring_out > 0 && !dead {
                self.quiet(false);
                if let Err(e) = self.ring_wait(timeout) {
                    self.ring_failed(e);
                }
                self.unquiet();
            }
            return Ok(());
        }
        if ring_out == 0 || dead {
            if let [idx] = sys_socks[..] {
                let s = self.sock_at(idx).expect("live");
                if let Some(m) = s.msg.as_mut() {
                    if s.pending.is_none() {
                        m.wait(timeout);
                        self.collect_msg(idx);
                        self.settle_sock(idx);
                        return Ok(());
                    }
                }
                if s.pending.is_some() {
                    s.counters.syscalls += 1;
                    s.stats.notify_syscalls += 1;
                    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
                    let _ = sys::net::poll_one(&*s.fd, libc::POLLOUT, ms);
                    self.continue_copy(idx);
                    self.settle_sock(idx);
                    return Ok(());
                }
            }
        }
        // Several sources: the readiness set (the ring's eventfd and the sockets).
        self.sync_readiness()?;
        let rd = self.readiness.as_ref().expect("created");
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        let _ = sys::net::poll_one(&rd.set.as_fd().as_raw_fd(), libc::POLLIN, ms);
        self.own.0.syscalls += 1;
        self.own.1.notify_syscalls += 1;
        self.on_ready()?;
        Ok(())
    }

    /// Buffers of abandoned sockets the kernel still holds.
    pub(super) fn ignored_in_kernel(&self) -> usize {
        self.uring
            .as_ref()
            .filter(|u| !u.lr.is_dead())
            .map_or(0, |u| u.lr.ignored_live())
    }

    /// The error of waiting on an abandoned ring.
    pub(in crate::tx) fn dead_ring_error(&self) -> TxError {
        TxError::Ring(io::Error::new(
            io::ErrorKind::BrokenPipe,
            format!(
                "{} sends are stuck in an io_uring that failed and was abandoned; their \
                 buffers will not come back",
                self.ring_in_flight()
            ),
        ))
    }

    /// Sends that are in flight but can never complete (they sit in an io_uring that failed
    /// and was abandoned): waiting for them would never end. `Ok` when every send in flight
    /// can still complete (or nothing is in flight).
    pub fn check_stuck(&self) -> Result<(), TxError> {
        let dead = self.uring.as_ref().is_some_and(|u| u.lr.is_dead());
        if dead && self.ring_in_flight() > 0 && self.in_flight() == self.ring_in_flight() {
            return Err(self.dead_ring_error());
        }
        Ok(())
    }

    // ---- completions and backpressure ----

    /// Takes the next completion and its buffer.
    pub fn next_completion(&mut self) -> Option<(Completion, TxBuf)> {
        self.ready.pop_front()
    }

    /// Takes every ready completion.
    pub fn completions(&mut self) -> impl Iterator<Item = (Completion, TxBuf)> + '_ {
        self.ready.drain(..)
    }

    /// Completions ready to be taken.
    pub fn ready(&self) -> usize {
        self.ready.len()
    }

    /// A socket that refused a send and can take one again (once per refusal).
    pub fn next_writable(&mut self) -> Option<SockId> {
        while let Some(id) = self.writable.pop_front() {
            // A socket closed (and its slot perhaps reused) since it was queued is skipped.
            if let Some(s) = self.sock_mut(id) {
                s.queued_writable = false;
                return Some(id);
            }
        }
        None
    }

    /// Whether `sock` would take a send now.
    pub fn can_send(&self, sock: SockId) -> bool {
        self.sock_ref(sock).is_some_and(|s| s.refusal().is_none())
    }
}

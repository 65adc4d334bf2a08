//! Safe, ownership-taking zero-copy sends over io_uring `IORING_OP_SEND_ZC` (Linux 6.0).
//!
//! [`SendRing::send`] takes a [`PoolBuf`] by value and keeps it until the kernel is done with
//! it: every request posts a result CQE (bytes or `-errno`; `IORING_CQE_F_MORE` when a
//! notification follows) and, if `F_MORE` was set, a notification CQE (`IORING_CQE_F_NOTIF`,
//! whose `res` carries `IORING_NOTIF_USAGE_ZC_COPIED` with `IORING_SEND_ZC_REPORT_USAGE`, 6.2)
//! once the kernel no longer references the pages. Only then does the buffer come back, in a
//! [`SendDone`]. Requests that fail still notify when the kernel set `F_MORE` on them, and
//! the slot waits for that notification too.
//!
//! Ordering on stream sockets: io_uring may reorder two sends to one socket (a send that
//! meets a full socket buffer is retried later from poll, and a later send can pass it). So on
//! stream sockets requests are submitted as one `IOSQE_IO_LINK` chain with `MSG_WAITALL`
//! (the kernel then retries short sends itself, and a short or failed send cancels the rest of
//! the chain with `ECANCELED`); the next chain is submitted only once every result of the
//! previous one is in. A send that stopped short is continued from where it stopped, before
//! anything queued after it. Datagram sockets need no ordering and get no links.
#![allow(unsafe_code)]

use super::key::{self, Op};
use super::{Ring, RingConfig, RingError};
use crate::buf::pool::{Pool, PoolBuf, PoolPin};
use crate::sys::{
    IORING_CQE_F_MORE, IORING_CQE_F_NOTIF, IORING_NOTIF_USAGE_ZC_COPIED,
    IORING_SEND_ZC_REPORT_USAGE,
};
use crate::tx::core::{Key, Request, SendTracker, Usage};
use io_uring::{opcode, squeue, types};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest single request (the SQE length field is 32 bits).
const MAX_REQ: usize = 1 << 30;

/// A send whose buffer the kernel no longer references.
#[derive(Debug)]
pub struct SendDone {
    /// The tag given to [`SendRing::send`].
    pub tag: u64,
    /// The buffer, back in the caller's hands.
    pub buf: PoolBuf,
    /// Bytes the kernel accepted for sending.
    pub bytes: usize,
    /// The first error a request of this send returned (errno), if any.
    pub error: Option<i32>,
    /// Notifications that said the data went out without a copy.
    pub notifs_zerocopy: u32,
    /// Notifications that said the kernel copied the data after all.
    pub notifs_copied: u32,
    /// Notifications of requests that moved bytes but carried no usage report (the ring
    /// does not set `IORING_SEND_ZC_REPORT_USAGE`: kernels before 6.2): copied or not is
    /// unknown.
    pub notifs_unknown: u32,
    /// Byte ranges `(offset, len)` never handed to the kernel because the ring gave up (see
    /// [`SendRing::gave_up`]); the caller sends them another way, in tag order.
    pub unsent: Vec<(usize, usize)>,
}

/// Counters of a [`SendRing`].
pub type SendRingStats = crate::tx::core::TrackStats;

/// A failure injected into a [`SendRing`] for tests (feature `fault-injection`).
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// Fail `io_uring_enter` once this many requests have been pushed.
    pub after_requests: u64,
    /// The errno the failing enters return.
    pub errno: i32,
    /// How many enters fail (then the ring works again); `u32::MAX` = for ever.
    pub times: u32,
}

/// A send-only io_uring bound to one socket, owning every buffer in flight. The decisions
/// (when a buffer is finished, what goes next, what is resubmitted) are made by
/// `tx::core::SendTracker`; this type turns its requests into SQEs and CQEs into its events.
pub struct SendRing {
    // Field order matters: the ring is dropped (and its registration released) before the
    // registered pool's pin.
    ring: Ring,
    fd: RawFd,
    tracker: SendTracker<PoolBuf>,
    report_usage: bool,
    reqs: Vec<Request>,
    cqes: Vec<(u64, i32, u32)>,
    own_enters: u64,
    fixed_file: bool,
    fixed: Option<(u64, PoolPin)>,
    #[cfg(feature = "fault-injection")]
    fault: Option<Fault>,
    /// Requests pushed to the SQ since the last successful enter, in order.
    unentered: Vec<Key>,
    /// Set when the ring was abandoned after failing: it is never entered again.
    dead: Option<i32>,
    _sock: Arc<OwnedFd>,
}

/// How [`SendRing::recover`] left the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Every request handed to the kernel has its result: the bytes it took are in the
    /// socket, and the unsent ranges can follow them (in ticket order) by another path.
    Settled,
    /// The kernel still holds requests whose results cannot be collected: whether their
    /// bytes went out is unknown, so on a stream nothing may be sent after them.
    Unknown,
}

impl std::fmt::Debug for SendRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendRing")
            .field("fd", &self.fd)
            .field("live", &self.tracker.live())
            .field("stats", self.tracker.stats())
            .finish()
    }
}

/// The request's user_data (`ring::key`): the 32-bit field carries the request's number
/// within the slot's use (the tracker remembers its offset).
fn encode(k: Key) -> u64 {
    key::Key::send_zc(k.gen, k.slot as u16, k.req).raw()
}

/// The tracker's key of a CQE's user_data, or `None` if no SEND_ZC of ours made it.
fn decode(ud: u64) -> Option<Key> {
    let key = key::Key::from_raw(ud);
    if key.op() != Some(Op::SendZc) {
        return None;
    }
    let (gen, slot, req) = key.send_zc_parts();
    Some(Key {
        slot: u32::from(slot),
        gen,
        req,
    })
}

impl SendRing {
    /// A ring for sends on `sock`. `stream` selects linked, ordered submission (TCP);
    /// `chunk` is the most bytes one request carries (datagram sockets: one GSO write).
    /// Requests ask for usage reports (`IORING_SEND_ZC_REPORT_USAGE`, Linux 6.2); see
    /// [`SendRing::set_report_usage`].
    pub fn new(
        sock: Arc<OwnedFd>,
        stream: bool,
        chunk: usize,
        cfg: &RingConfig,
    ) -> Result<Self, RingError> {
        let ring = Ring::new(cfg)?;
        let chunk = if stream {
            MAX_REQ
        } else {
            chunk.clamp(1, MAX_REQ)
        };
        // The socket as registered file 0: requests then skip the per-request file table
        // lookup and reference count (fget/fput). The fd stays open for the ring's lifetime
        // (`_sock`). Without registration (ENOMEM/EINVAL) requests name the fd.
        let fixed_file = ring
            .raw()
            .submitter()
            .register_files(&[sock.as_raw_fd()])
            .is_ok();
        Ok(Self {
            ring,
            fd: sock.as_raw_fd(),
            tracker: SendTracker::new(stream, chunk),
            // Probed once per process by a real request (`ring::features`): a kernel without
            // the flag refuses every SEND_ZC that carries it.
            report_usage: super::features::Features::get()
                .has(super::features::Features::SEND_ZC_REPORT_USAGE),
            reqs: Vec::new(),
            cqes: Vec::new(),
            own_enters: 0,
            fixed_file,
            fixed: None,
            #[cfg(feature = "fault-injection")]
            fault: None,
            unentered: Vec::new(),
            dead: None,
            _sock: sock,
        })
    }

    /// Whether requests ask for `IORING_SEND_ZC_REPORT_USAGE` (Linux 6.2; the kernel
    /// rejects SEND_ZC with it before). Without it notifications say nothing about copying
    /// and are counted as unknown ([`SendDone::notifs_unknown`]).
    pub fn set_report_usage(&mut self, on: bool) {
        self.report_usage = on;
    }

    /// Whether notifications report copies (`IORING_SEND_ZC_REPORT_USAGE`, 6.2, probed by a
    /// real request at set-up). Without it a notification only says the pages are free.
    pub fn reports_usage(&self) -> bool {
        self.report_usage
    }

    /// Makes `io_uring_enter` fail as `fault` says (tests of the failure paths).
    #[cfg(feature = "fault-injection")]
    pub fn inject(&mut self, fault: Fault) {
        self.fault = Some(fault);
    }

    /// Whether the kernel knows `IORING_OP_SEND_ZC`.
    pub fn supports_send_zc(&self) -> io::Result<bool> {
        Ok(self
            .ring
            .probe_opcodes()?
            .is_supported(opcode::SendZc::CODE))
    }

    /// Registers the whole of `pool` as fixed buffer 0; sends of its buffers then use
    /// `IORING_RECVSEND_FIXED_BUF`. Fails with `ENOMEM` when `RLIMIT_MEMLOCK` is exhausted
    /// (for callers without `CAP_IPC_LOCK`).
    pub fn register_pool(&mut self, pool: &Pool) -> io::Result<()> {
        let (iov, pin) = pool.iovec();
        // SAFETY: `iov` describes the pool's live mapping; `pin` keeps it mapped and is stored
        // in `self.fixed`, which is dropped after `self.ring` (field order), i.e. after the
        // registration is gone.
        unsafe { self.ring.raw().submitter().register_buffers(&[iov]) }?;
        self.fixed = Some((pool.id(), pin));
        Ok(())
    }

    /// Whether a pool is registered.
    pub fn has_fixed(&self) -> bool {
        self.fixed.is_some()
    }

    /// Queues `buf[..buf.len()]` for sending; `tag` comes back in its [`SendDone`]. An empty
    /// buffer completes at once without a request. After a fatal error on a stream socket,
    /// or after the ring gave up, the buffer completes at once with that error (or unsent).
    pub fn send(&mut self, tag: u64, buf: PoolBuf) {
        let len = buf.len();
        self.tracker.stage(tag, buf, len);
    }

    /// Sends still owned by the ring (queued, in the kernel, or awaiting a notification).
    pub fn in_flight(&self) -> usize {
        self.tracker.live()
    }

    /// Requests queued here but not yet handed to the kernel.
    pub fn staged(&self) -> usize {
        self.tracker.staged()
    }

    /// Whether requests are in the kernel without their result CQE yet.
    pub fn results_pending(&self) -> bool {
        self.tracker.in_kernel() > 0
    }

    /// The errno that made the ring stop submitting (`EOPNOTSUPP`: the socket does not do
    /// SEND_ZC; `ENOBUFS`/`ENOMEM`: no room even with nothing in flight; or the error of a
    /// failed `io_uring_enter` passed to [`SendRing::give_up`]). Sends returned after that
    /// carry their unsent ranges.
    pub fn gave_up(&self) -> Option<i32> {
        self.tracker.gave_up()
    }

    /// Stops submitting: requests not yet handed to the kernel (and any that come back
    /// cancelled or short) become unsent ranges of their sends; requests in the kernel finish
    /// as usual.
    pub fn give_up(&mut self, errno: i32) {
        self.tracker.give_up(errno);
    }

    /// `io_uring_enter` calls made.
    pub fn enters(&self) -> u64 {
        self.ring.enters() + self.own_enters
    }

    /// Counters.
    pub fn stats(&self) -> &SendRingStats {
        self.tracker.stats()
    }

    /// Pushes what may be pushed and enters the kernel if there is anything to submit.
    pub fn submit(&mut self) -> io::Result<()> {
        self.pump()?;
        self.enter_submit()?;
        self.harvest()?;
        if self.tracker.chain_out() && self.task_work_pending() {
            // A chain member met a full socket buffer and was retried from poll: under
            // DEFER_TASKRUN that retry is task work that runs only when we enter with
            // GETEVENTS. Run it now rather than when the caller next waits.
            self.enter_getevents()?;
            self.harvest()?;
        }
        if self.tracker.staged() > 0 && !self.tracker.chain_out() {
            // The previous chain ended during this enter: start the next one.
            self.pump()?;
            self.enter_submit()?;
            self.harvest()?;
        }
        Ok(())
    }

    /// Collects what the kernel has posted and, if it flagged deferred task work while
    /// requests or notifications are outstanding (under `DEFER_TASKRUN` notifications of
    /// sends that left the socket are task work), runs it with one `io_uring_enter` and
    /// collects again. No syscall when the kernel has nothing pending for us.
    pub fn reap_notifications(&mut self) -> io::Result<()> {
        self.harvest()?;
        if (self.tracker.notifs_pending() > 0 || self.tracker.in_kernel() > 0)
            && self.task_work_pending()
        {
            self.enter_getevents()?;
            self.harvest()?;
        }
        Ok(())
    }

    /// Collects what is already in the completion queue; never makes a syscall (unless the
    /// kernel's CQ overflowed and must be flushed).
    pub fn harvest_ready(&mut self) -> io::Result<()> {
        self.harvest()
    }

    /// Submits queued entries with `IORING_ENTER_GETEVENTS`: under `DEFER_TASKRUN`
    /// notifications of earlier sends are task work that only runs when the owner enters with
    /// GETEVENTS, so every submitting enter also posts them, and collecting them needs no
    /// syscall of its own. No syscall when nothing is queued.
    fn enter_submit(&mut self) -> io::Result<()> {
        if self.ring.pending() == 0 {
            return Ok(());
        }
        self.enter_getevents()
    }

    /// Whether the kernel flagged deferred task work (`IORING_SQ_TASKRUN`).
    fn task_work_pending(&self) -> bool {
        // SAFETY: only the shared flags word is read; this thread is the ring's only user.
        unsafe { self.ring.raw().submission_shared() }.taskrun()
    }

    /// The injected failure, if one is due now (it stands for the enter that failed: the
    /// kernel took none of the queued entries).
    fn fault_due(&mut self) -> io::Result<()> {
        if let Some(e) = self.dead {
            return Err(io::Error::from_raw_os_error(e));
        }
        #[cfg(feature = "fault-injection")]
        if let Some(f) = self.fault.as_mut() {
            if self.tracker.stats().requests > f.after_requests && f.times > 0 {
                if f.times != u32::MAX {
                    f.times -= 1;
                }
                self.own_enters += 1;
                return Err(io::Error::from_raw_os_error(f.errno));
            }
        }
        Ok(())
    }

    /// One `io_uring_enter(pending, 0, GETEVENTS)`; a signal (`EINTR`) is retried.
    fn enter_getevents(&mut self) -> io::Result<()> {
        loop {
            let res = self.fault_due().and_then(|()| {
                let pending = self.ring.pending();
                self.own_enters += 1;
                // SAFETY: no argument pointer is passed; the entries submitted are the ones
                // `push` queued, whose buffer contract `push` upholds.
                unsafe {
                    self.ring.raw().submitter().enter::<libc::sigset_t>(
                        pending as u32,
                        0,
                        io_uring::EnterFlags::GETEVENTS.bits(),
                        None,
                    )
                }
            });
            match res {
                Ok(_) => {
                    self.entered_ok();
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    self.entered_ok();
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// An enter went through: task work ran, and the kernel took what was queued.
    fn entered_ok(&mut self) {
        self.tracker.entered(self.enters());
        let pending = self.ring.pending();
        let taken = self.unentered.len().saturating_sub(pending);
        self.unentered.drain(..taken);
    }

    /// After an `io_uring_enter` failed with `err`: stops submitting (requests not yet
    /// handed to the kernel become unsent ranges) and tries, for up to `timeout`, to collect
    /// the results of the requests the kernel holds. If the ring cannot be entered any more,
    /// it is abandoned: entries the kernel never took become unsent too, and it is never
    /// entered again (so they can never go out after their bytes were sent another way).
    pub fn recover(&mut self, err: &io::Error, timeout: Duration) -> Recovery {
        let errno = err.raw_os_error().unwrap_or(libc::EIO);
        self.tracker.give_up(errno);
        let ok = matches!(self.settle_results(timeout), Ok(true));
        if !ok {
            let _ = self.harvest();
            self.dead.get_or_insert(errno);
            let pending = self.ring.pending().min(self.unentered.len());
            let never = self.unentered.split_off(self.unentered.len() - pending);
            for k in never.into_iter().rev() {
                self.tracker.withdraw(k);
            }
        }
        if self.tracker.in_kernel() == 0 && self.tracker.staged() == 0 {
            Recovery::Settled
        } else {
            Recovery::Unknown
        }
    }

    /// Whether the ring was abandoned after failing (see [`SendRing::recover`]).
    pub fn is_dead(&self) -> bool {
        self.dead.is_some()
    }

    /// Hands every unsent range decided so far to `f` in tag and offset order (see
    /// [`SendRing::recover`]); `f(tag, bytes)` sends them another way and returns how many
    /// bytes it sent and its errno.
    pub fn send_unsent(&mut self, mut f: impl FnMut(u64, &[u8]) -> (usize, Option<i32>)) {
        self.tracker
            .send_unsent(|tag, buf, off, len| f(tag, &buf[off..off + len]));
    }

    /// Submits, then waits until at least one CQE arrives or `timeout` passes (no wait when
    /// nothing is in the kernel), and harvests. A signal ends the wait early (`Ok`).
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.pump()?;
        let before = self.tracker.done_len();
        self.harvest()?;
        if self.tracker.done_len() > before && self.ring.pending() == 0 {
            // Something came back already: no need to enter.
            return Ok(());
        }
        if self.tracker.in_kernel() == 0 && self.tracker.notifs_pending() == 0 {
            self.enter_submit()?;
        } else {
            let res = self
                .fault_due()
                .and_then(|()| self.ring.submit_and_wait(1, timeout));
            match res {
                Ok(_) => self.entered_ok(),
                // A signal cut the wait short: harvest what is there, the caller waits again.
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
        self.harvest()?;
        // Results may have unblocked staged requests (next chain, retries): push them now.
        if self.tracker.staged() > 0 {
            self.pump()?;
            self.enter_submit()?;
            self.harvest()?;
        }
        Ok(())
    }

    /// Waits until nothing is in flight or `timeout` passes; returns whether all came back.
    pub fn drain(&mut self, timeout: Duration) -> io::Result<bool> {
        let end = Instant::now() + timeout;
        while self.tracker.live() > 0 {
            let now = Instant::now();
            if now >= end {
                return Ok(false);
            }
            self.wait(Some((end - now).min(Duration::from_millis(100))))?;
        }
        Ok(true)
    }

    /// Waits until no request is in the kernel without its result (the bytes of every
    /// request handed over are then in the socket or failed) and no notification is owed, or
    /// `timeout` passes; returns whether every result came in. Notifications owed are waited
    /// for too, so a ring that cannot be entered to collect them fails here (the caller then
    /// abandons it) instead of being retried forever; when the ring can be entered and only
    /// notifications are still owed at the deadline (a slow peer), the results are settled
    /// and the notifications come with later waits.
    pub fn settle_results(&mut self, timeout: Duration) -> io::Result<bool> {
        let end = Instant::now() + timeout;
        loop {
            let results_out = self.tracker.in_kernel() > 0 || self.ring.pending() > 0;
            if !results_out && self.tracker.notifs_pending() == 0 {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= end {
                return Ok(!results_out);
            }
            self.wait(Some((end - now).min(Duration::from_millis(100))))?;
        }
    }

    /// Takes the next finished send.
    pub fn next_done(&mut self) -> Option<SendDone> {
        self.tracker.next_done().map(|f| SendDone {
            tag: f.tag,
            buf: f.buf,
            bytes: f.bytes,
            error: f.error,
            notifs_zerocopy: f.zc,
            notifs_copied: f.copied,
            notifs_unknown: f.unknown,
            unsent: f.unsent,
        })
    }

    /// Finished sends waiting to be taken.
    pub fn done_len(&self) -> usize {
        self.tracker.done_len()
    }

    fn pump(&mut self) -> io::Result<()> {
        if self.tracker.staged() == 0 {
            return Ok(());
        }
        // Only as many as the SQ has room for: a linked chain must not be cut by a
        // submission (the kernel ends a chain at the end of each submit batch).
        let room = self.ring.sq_room();
        let mut reqs = std::mem::take(&mut self.reqs);
        self.tracker.pop_requests(room, &mut reqs);
        for r in reqs.drain(..) {
            self.push(r)?;
            self.unentered.push(r.key);
        }
        self.reqs = reqs;
        Ok(())
    }

    fn push(&mut self, req: Request) -> io::Result<()> {
        let buf = self.tracker.buf(req.key.slot);
        let off = req.off;
        assert!(off + req.len <= buf.len(), "request inside its buffer");
        // SAFETY (pointer arithmetic): `off + len <= buf.len()`, checked above.
        let ptr = unsafe { buf.as_ptr().add(off) };
        let fixed = matches!(&self.fixed, Some((id, _)) if *id == buf.pool_id());
        let mut op = if self.fixed_file {
            opcode::SendZc::new(types::Fixed(0), ptr, req.len as u32)
        } else {
            opcode::SendZc::new(types::Fd(self.fd), ptr, req.len as u32)
        }
        .flags(libc::MSG_NOSIGNAL | if self.stream() { libc::MSG_WAITALL } else { 0 });
        if self.report_usage {
            op = op.zc_flags(IORING_SEND_ZC_REPORT_USAGE);
        }
        if fixed {
            op = op.buf_index(Some(0));
        }
        let mut sqe = op.build().user_data(encode(req.key));
        if req.link {
            sqe = sqe.flags(squeue::Flags::IO_LINK);
        }
        // SAFETY: the SQE points at `len` bytes of the slot's buffer (and, when fixed, inside
        // the registered pool kept mapped by `self.fixed`). The tracker keeps the PoolBuf
        // until this request's result CQE and, when that CQE has F_MORE, its notification
        // CQE have been harvested (`SendTracker::finish`). A failed result without F_MORE
        // sent nothing, so the kernel does not read the buffer for it; its possible late
        // notification is matched by generation, never to a new use. On drop with requests
        // outstanding the buffers are leaked, never reused. The socket fd stays open as
        // `self._sock` is held for the ring's lifetime. `pump` only pops as many requests as
        // the SQ has room for, so this push never has to submit.
        unsafe { self.ring.push(&sqe) }
    }

    fn stream(&self) -> bool {
        self.tracker.is_stream()
    }

    fn harvest(&mut self) -> io::Result<()> {
        let mut cqes = std::mem::take(&mut self.cqes);
        let res = self
            .ring
            .harvest(|c| cqes.push((c.user_data(), c.result(), c.flags())));
        self.tracker.entered(self.enters());
        for &(ud, res, flags) in &cqes {
            let Some(key) = decode(ud) else {
                self.tracker.stray();
                continue;
            };
            if flags & IORING_CQE_F_NOTIF != 0 {
                let usage = if !self.report_usage {
                    Usage::Unknown
                } else if (res as u32) & IORING_NOTIF_USAGE_ZC_COPIED != 0 {
                    Usage::Copied
                } else {
                    Usage::ZeroCopy
                };
                self.tracker.on_notif(key, usage);
            } else {
                self.tracker
                    .on_result(key, res, flags & IORING_CQE_F_MORE != 0);
            }
        }
        cqes.clear();
        self.cqes = cqes;
        self.tracker.settle();
        res.map(|_| ())
    }
}

impl Drop for SendRing {
    fn drop(&mut self) {
        if self.tracker.live() > 0 && self.dead.is_none() {
            // Give the kernel a moment to hand the buffers back.
            let _ = self.drain(Duration::from_secs(2));
        }
        let mut leaked = 0;
        for buf in self.tracker.take_live() {
            // The kernel may still read these pages: never let the pool reuse them.
            std::mem::forget(buf);
            leaked += 1;
        }
        if leaked > 0 {
            tracing::warn!(
                leaked,
                "SendRing dropped with sends in flight: their buffers are leaked, not reused"
            );
            if let Some(pin) = self.fixed.take() {
                std::mem::forget(pin);
            }
        }
    }
}

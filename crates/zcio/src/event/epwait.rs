//! The `EPOLL_WAIT` backend: the interest list lives in a real kernel epoll instance; the ring
//! collects its ready events with `IORING_OP_EPOLL_WAIT` (Linux 6.15), one request at a time.
//!
//! Why: epoll's wake-up callback only links the item on its ready list, level-triggered
//! re-checks are one `vfs_poll` inside the collection, a report carries the file's whole
//! readiness polled at report time, and an epoll item holds no file reference (a `DEL`, or the
//! last `close`, releases the socket at once). A poll request per fd has none of these.
//!
//! Exactness: the request is submitted by `wait` itself and completes inside one of `wait`'s
//! kernel entries, so every report is as fresh as `epoll_wait`'s. A `wait` that returns while
//! its request is still armed (timeout, user-posted event, signal) keeps it armed only with
//! `DEFER_TASKRUN` (its completion can only run inside the next `wait`'s entry); otherwise the
//! request is cancelled and reaped before returning, so a completion never lands while the
//! loop runs its own code (COOP_TASKRUN would run it on any syscall return) and a report is
//! never stale. user_data ([`Key`]): an internal key for the request and one for the user
//! ring's eventfd poll (not in the epoll set: epoll `data` is the caller's token, unchanged),
//! [`Key::cancel`] for cancels.

use super::choice::{Chooser, Costs, Decision, WaitMode, WaitObs};
use super::NewError;
use super::{CtlError, Event, WaitChoice};
use crate::buf::mpsc::MpscRing;
use crate::ring::epwait::EpollWaitBuf;
use crate::ring::key::{Key, Op};
use crate::ring::{Ring, RingConfig, SetupFlag};
use crate::sys::epoll as ep;
use crate::sys::IORING_CQE_F_MORE;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// The one `EPOLL_WAIT` request.
const EPWAIT_KEY: Key = Key::internal(1);
/// The user ring's eventfd poll.
const WAKE_KEY: Key = Key::internal(2);
/// Initial events per `EPOLL_WAIT`; the buffer grows to the caller's `out` length (as
/// `epoll_wait` returns up to `maxevents`; CPython's test_selectors asks for ~10 000) up to
/// [`MAX_BATCH`].
const BATCH: usize = 1024;
/// Largest `EPOLL_WAIT` buffer (128 Ki events); larger `out`s get at most this many per wait.
const MAX_BATCH: usize = 1 << 17;
/// A blocking ring entry that lasted this long is taken to have slept (for the choice).
const SLEPT: Duration = Duration::from_micros(50);
/// Ring size: this ring only ever holds the one `EPOLL_WAIT`, the wake-up poll and their
/// cancels (a burst of wake-up completions beyond the CQ waits on the overflow list, which
/// `harvest` flushes). Ring memory counts against `RLIMIT_MEMLOCK` for unprivileged users
/// (8 MiB by default) and is released asynchronously when a ring goes: a ring sized for the
/// poll backend (1024 SQEs, 16 Ki CQEs: 81 pages) allowed 24 live rings per user, and a program
/// that makes and drops loops quickly (libuv's tests) ran out; this size takes 2 pages.
const SQ_ENTRIES: u32 = 8;
const CQ_ENTRIES: u32 = 64;

/// The epoll instance: created here, or the caller's (the epoll shim's program fd).
enum Epfd {
    Owned(OwnedFd),
    Borrowed(RawFd),
}

impl Epfd {
    fn raw(&self) -> RawFd {
        match self {
            Epfd::Owned(f) => f.as_raw_fd(),
            Epfd::Borrowed(f) => *f,
        }
    }
}

pub(super) struct EpwaitEvents {
    // Declared before `buf`: nothing can write into `buf` once the ring is gone.
    pub(super) ring: Ring,
    epfd: Epfd,
    buf: EpollWaitBuf,
    defer: bool,
    wake_fd: RawFd,
    /// Events of a completion that did not fit the caller's `out` (only with DEFER_TASKRUN,
    /// when `maxevents` shrank between waits with a request armed): handed out first.
    spill: Vec<Event>,
    /// Completions taken from the CQ by `drain` (kept for its capacity).
    batch: Vec<(u64, i32, u32)>,
    ctl_syscalls: u64,
    cqes: u64,
    cancels: u64,
    poll_errors: u64,
    /// How waits collect the epoll instance now, and who decides it.
    mode: WaitMode,
    choice: WaitChoice,
    chooser: Chooser,
    /// What the current (or last) wait showed.
    obs: WaitObs,
    plain_waits: u64,
    switches: u64,
    /// The creating process: a forked child (sharing the ring's memory, not its ownership)
    /// must never enter it.
    pid: u32,
}

impl EpwaitEvents {
    pub(super) fn new(
        cfg: &RingConfig,
        wake_fd: RawFd,
        epfd: Option<RawFd>,
        choice: WaitChoice,
    ) -> Result<Self, NewError> {
        let cfg = RingConfig {
            entries: cfg.entries.min(SQ_ENTRIES),
            cq_entries: Some(CQ_ENTRIES),
            ..cfg.clone()
        };
        let ring = Ring::new(&cfg)?;
        let probe = ring.probe_opcodes().map_err(NewError::Io)?;
        if !probe.is_supported(io_uring::opcode::EpollWait::CODE) {
            return Err(NewError::Unavailable(
                "kernel io_uring lacks EPOLL_WAIT (Linux 6.15)".into(),
            ));
        }
        if !probe.is_supported(io_uring::opcode::PollAdd::CODE) {
            return Err(NewError::Unavailable(
                "kernel io_uring lacks POLL_ADD".into(),
            ));
        }
        let defer = ring.has_flag("DEFER_TASKRUN");
        let epfd = match epfd {
            Some(fd) => Epfd::Borrowed(fd),
            None => Epfd::Owned(ep::create().map_err(NewError::Io)?),
        };
        let mode = if choice == WaitChoice::Plain {
            WaitMode::Plain
        } else {
            WaitMode::Ring
        };
        let mut me = Self {
            ring,
            epfd,
            buf: EpollWaitBuf::new(BATCH),
            defer,
            wake_fd,
            spill: Vec::new(),
            batch: Vec::new(),
            ctl_syscalls: 0,
            cqes: 0,
            cancels: 0,
            poll_errors: 0,
            mode,
            choice,
            chooser: Chooser::new(mode, Costs::measured(defer)),
            obs: WaitObs::default(),
            plain_waits: 0,
            switches: 0,
            pid: std::process::id(),
        };
        me.arm_wake().map_err(NewError::Io)?;
        me.ring.submit().map_err(NewError::Io)?;
        Ok(me)
    }

    pub(super) fn setup_flags(&self) -> &[SetupFlag] {
        self.ring.setup_flags()
    }

    pub(super) fn epoll_fd(&self) -> RawFd {
        self.epfd.raw()
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        self.ring
            .poll_add(self.wake_fd, libc::EPOLLIN as u32, true, WAKE_KEY)
    }

    fn ctl(
        &mut self,
        op: i32,
        fd: RawFd,
        events: u32,
        token: u64,
        what: &'static str,
    ) -> Result<(), CtlError> {
        if fd >= 0 && (fd == self.wake_fd || fd == self.ring.raw().as_raw_fd()) {
            return Err(CtlError::Invalid("fd is the event ring's own descriptor"));
        }
        self.ctl_syscalls += 1;
        ep::ctl(self.epfd.raw(), op, fd, events, token)
            .map_err(|e| CtlError::from_errno(e, fd, what))
    }

    pub(super) fn add(&mut self, fd: RawFd, events: u32, token: u64) -> Result<(), CtlError> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events, token, "epoll_ctl ADD")
    }

    pub(super) fn modify(&mut self, fd: RawFd, events: u32, token: u64) -> Result<(), CtlError> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, events, token, "epoll_ctl MOD")
    }

    pub(super) fn delete(&mut self, fd: RawFd) -> Result<(), CtlError> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0, "epoll_ctl DEL")
    }

    /// Moves completions out of the CQ; events of the `EPOLL_WAIT` go to `out[n..]` (and
    /// `spill` when they do not fit). Returns the new `n`.
    fn drain(&mut self, out: &mut [Event], mut n: usize) -> io::Result<usize> {
        // Reused: no allocation per wait.
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        self.ring
            .harvest(|c| batch.push((c.user_data(), c.result(), c.flags())))?;
        for &(ud, res, flags) in &batch {
            self.cqes += 1;
            let key = Key::from_raw(ud);
            match key {
                WAKE_KEY => {
                    if flags & IORING_CQE_F_MORE == 0 {
                        self.arm_wake()?;
                    }
                }
                EPWAIT_KEY => {
                    if res < 0 && res != -libc::ECANCELED && res != -libc::EINTR {
                        self.poll_errors += 1;
                    }
                    for e in self.buf.complete(res) {
                        let ev = Event {
                            events: e.events,
                            token: e.u64,
                        };
                        if n < out.len() {
                            out[n] = ev;
                            n += 1;
                        } else {
                            self.spill.push(ev);
                        }
                    }
                }
                _ => {
                    // Cancels: -ENOENT/-EALREADY when the request had just completed.
                    debug_assert_eq!(key.op(), Some(Op::Cancel));
                    if res < 0 && res != -libc::ENOENT && res != -libc::EALREADY {
                        self.poll_errors += 1;
                    }
                }
            }
        }
        self.batch = batch;
        Ok(n)
    }

    /// Cancels the armed request and reaps it; events it delivered meanwhile go to `out`.
    fn cancel(&mut self, out: &mut [Event], mut n: usize) -> io::Result<usize> {
        self.cancels += 1;
        self.ring.cancel(EPWAIT_KEY, Key::cancel())?;
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.buf.in_flight() {
            self.ring.get_events()?;
            n = self.drain(out, n)?;
            if self.buf.in_flight() {
                if Instant::now() > deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "EPOLL_WAIT cancellation did not complete",
                    ));
                }
                std::thread::yield_now();
            }
        }
        Ok(n)
    }

    /// Queues the `EPOLL_WAIT` for up to `max` events (the buffer grows to it first).
    fn arm(&mut self, epfd: RawFd, max: usize) -> io::Result<()> {
        self.buf.reserve(max.min(MAX_BATCH));
        self.buf.submit(&mut self.ring, epfd, max, EPWAIT_KEY)
    }

    pub(super) fn harvest(&mut self, out: &mut [Event]) -> io::Result<usize> {
        let mut n = self.take_spill(out);
        n = self.drain(out, n)?;
        Ok(n)
    }

    fn take_spill(&mut self, out: &mut [Event]) -> usize {
        let n = self.spill.len().min(out.len());
        out[..n].copy_from_slice(&self.spill[..n]);
        self.spill.drain(..n);
        n
    }

    /// `poster`: a [`super::Poster`] exists (it cannot come into being during this call: it
    /// is made from the ring, which the caller holds mutably), so a sleep must also watch the
    /// posters' eventfd.
    pub(super) fn wait(
        &mut self,
        out: &mut [Event],
        timeout: Option<Duration>,
        user: &MpscRing,
        poster: bool,
    ) -> io::Result<usize> {
        // The clock is read only where a deadline can expire while waiting: a plain wait that
        // finds events never reads it, `None` blocks and a zero timeout never sleeps (each read
        // is a vDSO call, ~80 ns on this VM, and the shim waits once per event-loop turn).
        let deadline = || timeout.filter(|t| !t.is_zero()).map(|t| Instant::now() + t);
        self.obs = WaitObs {
            poster,
            ..WaitObs::default()
        };
        let n = self.take_spill(out);
        if n > 0 {
            self.obs.fd_events = n as u32;
            return Ok(n);
        }
        if self.choice == WaitChoice::Alternate {
            self.mode = match self.mode {
                WaitMode::Ring => WaitMode::Plain,
                WaitMode::Plain => WaitMode::Ring,
            };
            self.switches += 1;
        }
        let zero = timeout == Some(Duration::ZERO);
        let n = match self.mode {
            WaitMode::Ring => {
                let n = self.wait_ring(out, timeout, user)?;
                self.obs.empty_poll = zero && n == 0 && !user.has_entries();
                n
            }
            WaitMode::Plain => {
                let mut n = 0;
                if self.buf.in_flight() {
                    // Left armed by a ring wait (DEFER_TASKRUN, or a switch): reap it first;
                    // what it collected is this wait's, as fresh as a new request's would be.
                    n = self.cancel(out, 0)?;
                }
                if n == 0 {
                    n = self.collect_plain(out, 0)?;
                }
                if n > 0 || zero || user.has_entries() {
                    self.obs.empty_poll = zero && n == 0 && !user.has_entries();
                    n
                } else if !poster {
                    // Nothing ready, the caller blocks and nobody can post: sleep in
                    // epoll_wait itself.
                    self.obs.slept = true;
                    self.sleep_plain(out, deadline())?
                } else {
                    // Nothing ready and the caller blocks: sleep in the ring, which also
                    // watches the user-posted events' eventfd (kept out of the caller's
                    // epoll instance).
                    self.obs.slept = true;
                    self.wait_ring(out, timeout, user)?
                }
            }
        };
        self.obs.fd_events = n as u32;
        Ok(n)
    }

    /// A blocking `epoll_wait` until `deadline` (milliseconds rounded up, as the caller's
    /// timeout must not end early); 0 when it passed, `EINTR` as `epoll_wait` reports it.
    fn sleep_plain(&mut self, out: &mut [Event], deadline: Option<Instant>) -> io::Result<usize> {
        loop {
            let ms = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(0);
                    }
                    let ms = left.as_nanos().div_ceil(1_000_000);
                    ms.min(i32::MAX as u128) as i32
                }
            };
            let n = self.collect_plain(out, ms)?;
            if n > 0 || deadline.map_or(true, |d| Instant::now() >= d) {
                return Ok(n);
            }
        }
    }

    /// `epoll_wait(epfd, out, timeout_ms)`: the plain mode's collection.
    fn collect_plain(&mut self, out: &mut [Event], timeout_ms: i32) -> io::Result<usize> {
        self.plain_waits += 1;
        let epfd = self.epfd.raw();
        let got = self
            .buf
            .collect_now(epfd, out.len().min(MAX_BATCH), timeout_ms)?;
        for (o, e) in out.iter_mut().zip(got) {
            *o = Event {
                events: e.events,
                token: e.u64,
            };
        }
        Ok(got.len())
    }

    /// The ring wait: one `EPOLL_WAIT` request, entered until it (or a user-posted event, a
    /// timeout or a signal) completes.
    fn wait_ring(
        &mut self,
        out: &mut [Event],
        timeout: Option<Duration>,
        user: &MpscRing,
    ) -> io::Result<usize> {
        // The deadline only for a timeout that can expire while waiting (see `wait`).
        let deadline = timeout.filter(|t| !t.is_zero()).map(|t| Instant::now() + t);
        let mut n = 0;
        let epfd = self.epfd.raw();
        if self.buf.in_flight() && self.defer {
            // Armed by an earlier wait that returned without it (DEFER_TASKRUN only): its
            // completion can only run in an entry of ours, so it is as fresh as a new one.
            n = self.drain(out, n)?;
        }
        if !self.buf.in_flight() && n == 0 {
            self.arm(epfd, out.len())?;
        }
        let mut entered = false;
        while n == 0 && !user.has_entries() {
            let remaining = match (entered, deadline) {
                // The first entry: the caller's timeout as given (its deadline was just set).
                (false, _) | (_, None) => timeout,
                (true, Some(d)) => Some(d.saturating_duration_since(Instant::now())),
            };
            if entered && remaining == Some(Duration::ZERO) {
                break;
            }
            entered = true;
            if remaining == Some(Duration::ZERO) {
                // Submit, and run deferred work, without a timer.
                self.ring.get_events()?;
            } else if user.prepare_sleep() {
                let before = self.cqes;
                let t0 = Instant::now();
                let r = self.ring.submit_and_wait(1, remaining);
                user.end_sleep();
                // A ring wait cannot tell an inline completion from one after a sleep: one
                // that took this long slept (the inline path takes a few microseconds).
                if t0.elapsed() >= SLEPT {
                    self.obs.slept = true;
                }
                let interrupted = match r {
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => true,
                    Err(e) => return Err(e),
                    // io_uring_enter that submitted returns the submitted count even when a
                    // signal cut its wait short: a blocking wait that comes back with no
                    // completion at all before its deadline was interrupted.
                    Ok(_) => {
                        n = self.drain(out, n)?;
                        self.cqes == before && deadline.map_or(true, |d| Instant::now() < d)
                    }
                };
                if interrupted {
                    n = self.drain(out, n)?;
                    if n == 0 && !user.has_entries() {
                        self.settle(out, 0)?;
                        return Err(io::Error::from_raw_os_error(libc::EINTR));
                    }
                    break;
                }
            }
            n = self.drain(out, n)?;
            if !self.buf.in_flight() && n == 0 {
                // Completed empty (cancelled by the kernel, or an error): ask again.
                self.arm(epfd, out.len())?;
            }
        }
        self.settle(out, n)
    }

    /// After `wait` (and the caller's harvest of `user_events` user-posted events): feeds the
    /// per-workload choice; returns its decision when the mode changes.
    pub(super) fn finish_wait(&mut self, user_events: usize) -> Option<Decision> {
        if self.choice != WaitChoice::Auto {
            return None;
        }
        let mut o = self.obs;
        o.user_events = user_events.min(u32::MAX as usize) as u32;
        let d = self.chooser.observe(o)?;
        self.mode = d.to;
        self.switches += 1;
        Some(d)
    }

    /// Sets how waits collect the epoll instance; takes effect at the next `wait` (an armed
    /// request is reaped there, its events reported by that wait).
    pub(super) fn set_choice(&mut self, choice: WaitChoice) {
        self.choice = choice;
        let mode = match choice {
            WaitChoice::Ring => WaitMode::Ring,
            WaitChoice::Plain => WaitMode::Plain,
            WaitChoice::Auto | WaitChoice::Alternate => self.mode,
        };
        if mode != self.mode {
            self.switches += 1;
        }
        self.mode = mode;
        self.chooser.reset(mode);
    }

    pub(super) fn mode(&self) -> WaitMode {
        self.mode
    }

    /// Whether the next wait has something of this ring's to hand out first: a request armed
    /// by a wait that returned without it, or events of a completion that did not fit.
    pub(super) fn pending(&self) -> bool {
        self.buf.in_flight() || !self.spill.is_empty()
    }

    /// Before `wait` returns: without DEFER_TASKRUN an armed request could complete while the
    /// loop runs (its report then stale by the time it is read): cancel and reap it.
    fn settle(&mut self, out: &mut [Event], n: usize) -> io::Result<usize> {
        if self.buf.in_flight() && !self.defer {
            return self.cancel(out, n);
        }
        Ok(n)
    }

    pub(super) fn stats(&self) -> super::EventStats {
        super::EventStats {
            syscalls: self.ring.enters() + self.plain_waits + self.ctl_syscalls,
            wait_entries: self.ring.enters() + self.plain_waits,
            plain_waits: self.plain_waits,
            mode_switches: self.switches,
            cqes: self.cqes,
            rearms: self.cancels,
            poll_errors: self.poll_errors,
            ..Default::default()
        }
    }
}

impl Drop for EpwaitEvents {
    fn drop(&mut self) {
        if self.buf.in_flight() && std::process::id() == self.pid {
            let mut sink: [Event; 0] = [];
            // Best effort: on failure the buffer is leaked, never freed under the kernel.
            let _ = self.cancel(&mut sink, 0);
        }
    }
}

//! The io_uring backend: one poll request per registered fd, readiness harvested from the CQ.
//!
//! Poll kinds:
//! - edge-triggered (`ET` without `ONESHOT`/`EXCLUSIVE`): multishot `POLL_ADD`; each wake-up
//!   posts a CQE; re-armed at once when a CQE arrives without `F_MORE`.
//! - level-triggered, `ONESHOT`, `EXCLUSIVE`: one-shot `POLL_ADD`. Level and exclusive polls
//!   are re-armed after their event is handed out; the re-arm is submitted by the next `wait`,
//!   and an fd still ready completes at once (the kernel polls it when arming), so it is
//!   reported again — epoll's level contract. `ONESHOT` stays disarmed until `modify`.
//!   (The kernel refuses `EPOLLEXCLUSIVE` on multishot polls.)
//!
//! user_data: a [`Key::poll`] of `(fd, gen)` for polls (gen counts (re)registrations of the
//! fd, so late CQEs of an old registration are recognised and dropped); updates, cancels and
//! the wake-up poll have keys of their own kinds.

use super::NewError;
use super::{CtlError, Event, Interest};
use crate::buf::mpsc::MpscRing;
use crate::ring::key::{Key, Op, POLL_GEN_MASK};
use crate::ring::poll::PollUpdate;
use crate::ring::{Ring, RingConfig, SetupFlag};
use crate::sys::epoll::{identity, FdIdentity};
use crate::sys::IORING_CQE_F_MORE;
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// The poll on the wake-up eventfd.
const WAKE_KEY: Key = Key::internal(0);
const GEN_MASK: u32 = POLL_GEN_MASK;
/// Spin iterations between two clock reads while busy-harvesting.
const SPIN_CHECK: u32 = 64;
/// Spin iterations on the user ring before sleeping once user-posted events have been seen.
const USER_SPIN: u32 = 256;

#[derive(Debug)]
struct Reg {
    token: u64,
    events: u32,
    gen: u32,
    ident: FdIdentity,
    /// A poll with this gen is queued or live in the kernel.
    armed: bool,
    /// Mask waiting in the ready queue (0: not queued).
    queued: u32,
    /// `UringEvents::epoch` when `queued` was last set (capi branch: stale level events).
    queued_epoch: u64,
    /// ONESHOT fired; nothing is reported until modify.
    disabled: bool,
}

impl Reg {
    /// Multishot kernel poll: edge-triggered interest, and any interest with PRI (see
    /// `kernel_mask`), never EXCLUSIVE (the kernel refuses it).
    fn multishot(&self) -> bool {
        if self.events & libc::EPOLLEXCLUSIVE as u32 != 0 {
            return false;
        }
        let et =
            self.events & libc::EPOLLET as u32 != 0 && self.events & libc::EPOLLONESHOT as u32 == 0;
        et || self.has_pri()
    }
    fn has_pri(&self) -> bool {
        self.events & libc::EPOLLPRI as u32 != 0
    }
    fn level(&self) -> bool {
        self.events & (libc::EPOLLET | libc::EPOLLONESHOT) as u32 == 0
    }
    fn report_mask(&self) -> u32 {
        (self.events & Interest::READINESS) | (libc::EPOLLERR | libc::EPOLLHUP) as u32
    }
    /// The mask given to the kernel. io_uring's poll wake-up filter ignores EPOLLPRI
    /// (`IO_ASYNC_POLL_COMMON` is masked out of the events it matches), so a PRI-only poll
    /// would never wake: PRI interest also asks for IN as a wake-up source, and results are
    /// masked back to the caller's interest. A one-shot poll would then complete at once,
    /// again and again, on plain data; PRI registrations are therefore multishot, with
    /// level-triggered re-checks by POLL_UPDATE.
    fn kernel_mask(&self) -> u32 {
        let pri_wake = if self.has_pri() {
            libc::EPOLLIN as u32
        } else {
            0
        };
        self.report_mask() | pri_wake | (self.events & libc::EPOLLEXCLUSIVE as u32)
    }
}

pub(super) struct UringEvents {
    pub(super) ring: Ring,
    regs: Vec<Option<Reg>>,
    /// Last generation used per fd number, kept across `delete`, so completions of a deleted
    /// registration still in flight never match a later one on the same number.
    gens: Vec<u32>,
    /// The last wait returned events: busy-harvest for up to `spin` before sleeping.
    busy: bool,
    /// User-posted events were seen: spin briefly on the user ring before sleeping.
    user_seen: bool,
    spin: Duration,
    ready: VecDeque<(RawFd, u32)>,
    wake_fd: RawFd,
    wake_armed: bool,
    ctl_syscalls: u64,
    cqes: u64,
    rearms: u64,
    poll_errors: u64,
    /// Counts `wait` calls (capi branch): a level-triggered event queued in an earlier call
    /// and not yet handed out may be stale, and is re-polled instead of reported.
    epoch: u64,
    spins_won: u64,
    spins_lost: u64,
    /// Reports of the current `emit` lacking interest bits: (index in out, fd, report mask).
    incomplete: Vec<(usize, RawFd, u32)>,
    /// `poll(2)` calls that completed reports.
    report_polls: u64,
}

fn validate_exclusive(op_mod: bool, events: u32) -> Result<(), CtlError> {
    if events & libc::EPOLLEXCLUSIVE as u32 != 0 {
        if op_mod {
            return Err(CtlError::Invalid("EPOLLEXCLUSIVE cannot be set by modify"));
        }
        if events & !Interest::EXCLUSIVE_OK != 0 {
            return Err(CtlError::Invalid(
                "EPOLLEXCLUSIVE allows only IN, OUT, ERR, HUP, ET (and RD/WR NORM/BAND, WAKEUP)",
            ));
        }
    }
    Ok(())
}

impl UringEvents {
    pub(super) fn new(cfg: &RingConfig, spin: Duration, wake_fd: RawFd) -> Result<Self, NewError> {
        let ring = Ring::new(cfg)?;
        let probe = ring.probe_opcodes().map_err(NewError::Io)?;
        if !probe.is_supported(io_uring::opcode::PollAdd::CODE)
            || !probe.is_supported(io_uring::opcode::PollRemove::CODE)
        {
            return Err(NewError::Unavailable(
                "kernel io_uring lacks POLL_ADD/POLL_REMOVE".into(),
            ));
        }
        let mut me = Self {
            ring,
            regs: Vec::new(),
            gens: Vec::new(),
            busy: false,
            user_seen: false,
            spin,
            ready: VecDeque::new(),
            wake_fd,
            wake_armed: false,
            ctl_syscalls: 0,
            cqes: 0,
            rearms: 0,
            epoch: 0,
            poll_errors: 0,
            spins_won: 0,
            spins_lost: 0,
            incomplete: Vec::new(),
            report_polls: 0,
        };
        me.arm_wake().map_err(NewError::Io)?;
        me.ring.submit().map_err(NewError::Io)?;
        Ok(me)
    }

    pub(super) fn setup_flags(&self) -> &[SetupFlag] {
        self.ring.setup_flags()
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        self.wake_armed = true;
        self.ring
            .poll_add(self.wake_fd, libc::EPOLLIN as u32, true, WAKE_KEY)
    }

    fn next_gen(&mut self, fd: RawFd) -> u32 {
        let g = &mut self.gens[fd as usize];
        *g = (*g + 1) & GEN_MASK;
        *g
    }

    fn reg_mut(&mut self, fd: RawFd) -> Option<&mut Reg> {
        if fd < 0 {
            return None;
        }
        self.regs.get_mut(fd as usize).and_then(|r| r.as_mut())
    }

    /// The EBADF / EPERM / EINVAL checks epoll makes before looking the fd up.
    fn check_fd(&mut self, fd: RawFd) -> Result<FdIdentity, CtlError> {
        if fd < 0 {
            return Err(CtlError::BadFd(fd));
        }
        self.ctl_syscalls += 1;
        let id = identity(fd).map_err(|_| CtlError::BadFd(fd))?;
        if id.is_unpollable() {
            return Err(CtlError::NotPollable(fd));
        }
        if fd == self.ring.raw().as_raw_fd_compat() || fd == self.wake_fd {
            return Err(CtlError::Invalid("fd is the event ring's own descriptor"));
        }
        Ok(id)
    }

    fn arm(&mut self, fd: RawFd) -> io::Result<()> {
        let Some(r) = self.reg_mut(fd) else {
            return Ok(());
        };
        r.armed = true;
        let (mask, multi, ud) = (r.kernel_mask(), r.multishot(), Key::poll(fd, r.gen));
        self.ring.poll_add(fd, mask, multi, ud)
    }

    /// Drops a stale registration (its fd was closed and the number reused).
    fn forget(&mut self, fd: RawFd) -> io::Result<()> {
        if let Some(r) = self.regs.get_mut(fd as usize).and_then(|r| r.take()) {
            if r.armed {
                // ASYNC_CANCEL rather than POLL_REMOVE: see `modify`.
                self.ring.cancel(Key::poll(fd, r.gen), Key::cancel())?;
            }
        }
        Ok(())
    }

    pub(super) fn add(&mut self, fd: RawFd, events: u32, token: u64) -> Result<(), CtlError> {
        let id = self.check_fd(fd)?;
        validate_exclusive(false, events)?;
        if let Some(r) = self.reg_mut(fd) {
            if r.ident == id {
                return Err(CtlError::Exists(fd));
            }
            self.forget(fd)?;
        }
        let i = fd as usize;
        if self.regs.len() <= i {
            self.regs.resize_with(i + 1, || None);
            self.gens.resize(i + 1, 0);
        }
        let gen = self.next_gen(fd);
        self.regs[i] = Some(Reg {
            token,
            events,
            gen,
            ident: id,
            armed: false,
            queued: 0,
            queued_epoch: 0,
            disabled: false,
        });
        self.arm(fd)?;
        // Submit now: the kernel resolves the fd number at submission, as epoll_ctl does.
        self.submit()?;
        Ok(())
    }

    fn not_registered(&mut self, fd: RawFd, events: Option<u32>) -> CtlError {
        match self.check_fd(fd) {
            Err(e) => e,
            Ok(_) => match events.map(|e| validate_exclusive(true, e)) {
                Some(Err(e)) => e,
                _ => CtlError::NotFound(fd),
            },
        }
    }

    pub(super) fn modify(&mut self, fd: RawFd, events: u32, token: u64) -> Result<(), CtlError> {
        if self.reg_mut(fd).is_none() {
            return Err(self.not_registered(fd, Some(events)));
        }
        validate_exclusive(true, events)?;
        let r = self.reg_mut(fd).expect("checked");
        if r.events & libc::EPOLLEXCLUSIVE as u32 != 0 {
            return Err(CtlError::Invalid(
                "a registration with EPOLLEXCLUSIVE cannot be modified",
            ));
        }
        let old_ud = Key::poll(fd, r.gen);
        let was_armed = r.armed;
        let gen = self.next_gen(fd);
        let r = self.reg_mut(fd).expect("checked");
        r.gen = gen;
        r.events = events;
        r.token = token;
        r.queued = 0;
        r.disabled = false;
        // ASYNC_CANCEL + a fresh POLL_ADD (which polls the fd at once, as EPOLL_CTL_MOD
        // does). Not POLL_UPDATE: it fails with -EALREADY while a wake-up of the old poll is
        // pending (the kernel's poll ownership is taken), leaving the old poll armed under
        // its old user_data; a cancel marks the poll cancelled even then.
        if was_armed {
            self.ring.cancel(old_ud, Key::cancel())?;
        }
        self.arm(fd)?;
        self.submit()?;
        Ok(())
    }

    pub(super) fn delete(&mut self, fd: RawFd) -> Result<(), CtlError> {
        if self.reg_mut(fd).is_none() {
            return Err(self.not_registered(fd, None));
        }
        self.forget(fd)?;
        // Cancel and reap now, as EPOLL_CTL_DEL is synchronous: the armed poll holds a
        // reference to the file, and a close right after DEL must release it (CPython
        // test_asyncio test_server_close: a connect to the closed listener must be refused).
        self.flush()?;
        Ok(())
    }

    /// Submits queued requests now (one `io_uring_enter` if anything is queued) and runs
    /// pending completion work, so cancelled polls drop their file references.
    pub(super) fn flush(&mut self) -> io::Result<()> {
        // Completions stay in the CQ for the next wait: draining them here would date their
        // level-triggered events to before that wait, which then re-polls them instead of
        // reporting them (the shim trace's contract/err-hup-unasked: a pipe's ERR, drained
        // by the close of another registered fd, was reported one wait late).
        self.ring.get_events()
    }

    fn submit(&mut self) -> io::Result<()> {
        self.ring.submit()?;
        Ok(())
    }

    fn on_cqe(&mut self, ud: u64, res: i32, flags: u32) -> io::Result<()> {
        self.cqes += 1;
        let more = flags & IORING_CQE_F_MORE != 0;
        let key = Key::from_raw(ud);
        if key == WAKE_KEY {
            if !more {
                self.arm_wake()?;
            }
            return Ok(());
        }
        if key.op() != Some(Op::Poll) {
            if key.op() == Some(Op::PollUpdate) && res == -libc::ENOENT {
                // The poll we updated had already finished: arm a new one.
                let (fd, gen) = key.poll_parts();
                if let Some(r) = self.reg_mut(fd) {
                    if r.gen == gen && !r.disabled {
                        self.arm(fd)?;
                    }
                }
            } else if res < 0 && res != -libc::ENOENT && res != -libc::EALREADY {
                self.poll_errors += 1;
            }
            return Ok(());
        }
        let (fd, gen) = key.poll_parts();
        let epoch = self.epoch;
        let ready = &mut self.ready;
        let Some(r) = self.regs.get_mut(fd as usize).and_then(|r| r.as_mut()) else {
            return Ok(());
        };
        if r.gen != gen {
            return Ok(());
        }
        if !more {
            r.armed = false;
        }
        if res < 0 {
            if res == -libc::ECANCELED && !r.disabled {
                self.rearms += 1;
                return self.arm(fd);
            }
            self.poll_errors += 1;
            return Ok(());
        }
        let mask = res as u32 & r.report_mask();
        if mask != 0 && !r.disabled {
            if r.queued == 0 {
                ready.push_back((fd, gen));
            }
            // Latest state, with hang-ups and errors kept until reported.
            let sticky = (libc::EPOLLERR | libc::EPOLLHUP | libc::EPOLLRDHUP) as u32;
            r.queued = mask | (r.queued & sticky & r.report_mask());
            r.queued_epoch = epoch;
        }
        let rearm_now = !r.armed && !r.disabled && (r.multishot() || mask == 0);
        if rearm_now {
            self.rearms += 1;
            self.arm(fd)?;
        }
        Ok(())
    }

    fn drain_cq(&mut self) -> io::Result<()> {
        let mut batch: Vec<(u64, i32, u32)> = Vec::new();
        self.ring
            .harvest(|c| batch.push((c.user_data(), c.result(), c.flags())))?;
        for (ud, res, flags) in batch {
            self.on_cqe(ud, res, flags)?;
        }
        Ok(())
    }

    fn emit(&mut self, out: &mut [Event]) -> io::Result<usize> {
        let mut n = 0;
        self.incomplete.clear();
        while n < out.len() {
            let Some((fd, gen)) = self.ready.pop_front() else {
                break;
            };
            let Some(r) = self.regs.get_mut(fd as usize).and_then(|r| r.as_mut()) else {
                continue;
            };
            if r.gen != gen || r.queued == 0 {
                continue;
            }
            if r.level() && r.queued_epoch < self.epoch {
                // Queued during an earlier wait and not taken then (more were ready than
                // that caller's maxevents): the fd may have been drained since. epoll
                // re-polls level-triggered items when reporting them; so do we.
                r.queued = 0;
                self.repoll(fd)?;
                continue;
            }
            out[n] = Event {
                events: r.queued,
                token: r.token,
            };
            let want = r.report_mask() & !(libc::EPOLLERR | libc::EPOLLHUP) as u32;
            if r.queued & want != want {
                // A poll completion carries the bits of the wake-up that fired it (the
                // waker's key), epoll's report the file's whole readiness polled at report
                // time (CPython test_epoll: IN|OUT registered ET, both ready, IN woke it).
                self.incomplete.push((n, fd, r.report_mask()));
            }
            n += 1;
            r.queued = 0;
            if r.events & libc::EPOLLONESHOT as u32 != 0 {
                r.disabled = true;
            } else {
                self.repoll(fd)?;
            }
        }
        self.complete_reports(out)?;
        Ok(n)
    }

    /// Adds the bits a report lacks but the file has now: one `poll(2)` for the batch, only
    /// when some report of it lacks a bit of its interest.
    fn complete_reports(&mut self, out: &mut [Event]) -> io::Result<()> {
        if self.incomplete.is_empty() {
            return Ok(());
        }
        let mut fds: Vec<libc::pollfd> = self
            .incomplete
            .iter()
            .map(|&(_, fd, mask)| libc::pollfd {
                fd,
                events: mask as i16,
                revents: 0,
            })
            .collect();
        self.ctl_syscalls += 1;
        self.report_polls += 1;
        crate::sys::epoll::poll_now(&mut fds)?;
        for (p, &(i, _, mask)) in fds.iter().zip(&self.incomplete) {
            out[i].events |= (p.revents as u16 as u32) & mask;
        }
        Ok(())
    }

    /// Level-triggered re-check of `fd` (after its event was handed out, or when a queued
    /// event went stale): the kernel polls it again and reports it if still ready.
    fn repoll(&mut self, fd: RawFd) -> io::Result<()> {
        let Some(r) = self.regs.get_mut(fd as usize).and_then(|r| r.as_mut()) else {
            return Ok(());
        };
        {
            if r.level() && r.multishot() && r.armed {
                // Level-triggered on a multishot poll: POLL_UPDATE re-polls the fd in place;
                // still ready means a new CQE.
                self.rearms += 1;
                let ud = Key::poll(fd, r.gen);
                let mask = r.kernel_mask();
                self.ring.poll_update(
                    PollUpdate {
                        target: ud,
                        events: Some(mask),
                        new_user_data: None,
                        multishot: true,
                    },
                    Key::poll_update(ud),
                )?;
            } else if !r.armed && !r.multishot() {
                // Level-triggered / exclusive: re-arm; the next wait submits it and an fd
                // still ready completes at once.
                self.rearms += 1;
                self.arm(fd)?;
            }
        }
        Ok(())
    }

    pub(super) fn harvest(&mut self, out: &mut [Event]) -> io::Result<usize> {
        self.drain_cq()?;
        self.emit(out)
    }

    pub(super) fn wait(
        &mut self,
        out: &mut [Event],
        timeout: Option<Duration>,
        user: &MpscRing,
    ) -> io::Result<usize> {
        let deadline = timeout.map(|t| Instant::now() + t);
        self.epoch += 1;
        let mut presubmitted = false;
        loop {
            self.drain_cq()?;
            let user_has = user.has_entries();
            self.user_seen |= user_has;
            let have = !self.ready.is_empty() || user_has;
            // Enter when nothing is ready, when re-arms/cancels are queued, or when the
            // kernel flags wake-ups whose completions wait for our next kernel entry
            // (TASKRUN_FLAG): epoll would report those fds in this wait.
            let work = self.ring.work_pending();
            if !have || work || self.ring.pending() > 0 {
                let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                // Block only when nothing is ready or pending.
                let block = !have && !work && remaining != Some(Duration::ZERO);
                let spin = block && self.busy && !self.spin.is_zero();
                if spin && self.ring.pending() > 0 && !presubmitted {
                    presubmitted = true;
                    // Submit the queued re-arms without sleeping first: fds still ready
                    // complete during the submission.
                    self.ring.get_events()?;
                    continue;
                }
                if spin {
                    // The loop was busy a moment ago: busy-harvest for a few microseconds
                    // (CQ, TASKRUN flag, user ring) before paying a sleep here and a wake-up
                    // on the waker's side. Once per idle period: a spin that finds nothing
                    // clears `busy` until a wait returns events again.
                    if self.spin_for_work(user, remaining) {
                        continue;
                    }
                    self.busy = false;
                }
                if block && self.user_seen {
                    // Posters are active: spin ≈1 µs on the user ring (only) before paying a
                    // sleep and an eventfd wake-up on each side.
                    let mut found = false;
                    for _ in 0..USER_SPIN {
                        if user.has_entries() {
                            found = true;
                            break;
                        }
                        std::hint::spin_loop();
                    }
                    if found {
                        continue;
                    }
                }
                if block && user.prepare_sleep() {
                    let r = self.ring.submit_and_wait(1, remaining);
                    user.end_sleep();
                    r?;
                    self.drain_cq()?;
                } else {
                    // Non-blocking: GETEVENTS without a timer (a zero EXT_ARG timeout with
                    // want > ready would arm an hrtimer and sleep until it fires).
                    self.ring.get_events()?;
                    self.drain_cq()?;
                }
                // One entry runs a bounded number of deferred wake-ups (at most 20 for a
                // non-blocking one; a blocking wait for one completion returns after the
                // first): collect the rest while there is room in `out` (epoll would report
                // them all in this wait — the shim trace's contract/err-hup-unasked caught a
                // pipe's ERR left for the next wait). Bounded, and only while entries make
                // progress: the flag can be set again at once by wake-ups that keep arriving.
                let mut rounds = 0;
                let max_rounds = out.len() / 16 + 2;
                while self.ready.len() < out.len()
                    && rounds < max_rounds
                    && self.ring.work_pending()
                {
                    let before = self.cqes;
                    self.ring.get_events()?;
                    self.drain_cq()?;
                    rounds += 1;
                    if self.cqes == before {
                        break;
                    }
                }
            }
            let n = self.emit(out)?;
            if n > 0 || user.has_entries() {
                self.busy = true;
                return Ok(n);
            }
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    return Ok(0);
                }
            }
        }
    }

    /// Spins up to `self.spin` (and `remaining`) until a completion, deferred kernel work or
    /// a user-posted event shows up; `true` if one did.
    fn spin_for_work(&mut self, user: &MpscRing, remaining: Option<Duration>) -> bool {
        let budget = remaining.map_or(self.spin, |r| r.min(self.spin));
        if budget.is_zero() {
            return false;
        }
        let start = Instant::now();
        loop {
            for _ in 0..SPIN_CHECK {
                if self.ring.ready() > 0 || self.ring.work_pending() || user.has_entries() {
                    self.spins_won += 1;
                    return true;
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= budget {
                self.spins_lost += 1;
                return false;
            }
        }
    }

    pub(super) fn stats(&self) -> super::EventStats {
        super::EventStats {
            syscalls: self.ring.enters() + self.ctl_syscalls,
            wait_entries: self.ring.enters(),
            cqes: self.cqes,
            rearms: self.rearms,
            poll_errors: self.poll_errors,
            spins_won: self.spins_won,
            spins_lost: self.spins_lost,
            ..Default::default()
        }
    }
}

/// The ring's own descriptor.
trait RawFdCompat {
    fn as_raw_fd_compat(&self) -> RawFd;
}
impl<S: io_uring::squeue::EntryMarker, C: io_uring::cqueue::EntryMarker> RawFdCompat
    for io_uring::IoUring<S, C>
{
    fn as_raw_fd_compat(&self) -> RawFd {
        std::os::fd::AsRawFd::as_raw_fd(self)
    }
}

//! io_uring set-up with the best flags the kernel accepts, batched submit and harvest, and
//! an exact count of the `io_uring_enter` calls made.
//!
//! A [`Ring`] asks for `SINGLE_ISSUER | DEFER_TASKRUN | COOP_TASKRUN` (or `SQPOLL`) and drops
//! what the kernel refuses, recording each refusal in [`Ring::setup_flags`]. When io_uring
//! itself is unavailable (sysctl `kernel.io_uring_disabled`, seccomp, an old kernel) the typed
//! [`RingError::Unavailable`] tells callers to fall back, with the reason.
//!
//! Completions are never lost: rings are only created with `IORING_FEAT_NODROP` (Linux 5.5), and
//! [`Ring::harvest`] flushes the kernel's overflow list whenever the ring says it has one.
//!
//! Not under Miri: everything here makes io_uring syscalls, which Miri cannot. It is tested on
//! real kernels (`scripts/test`, and `scripts/vmtest` on 6.1, 6.12 and 7.x). The one piece that
//! decodes what the kernel writes back without I/O, the zcrx registration, runs under Miri with
//! the call passed in (`zcrx::tests`).
#![allow(unsafe_code)]
// Public under the `unstable-raw` feature, crate-private without it: the `pub` items here are
// the feature's surface (used by the C ABI, the preload shim and the CLI), not dead code.
#![cfg_attr(not(feature = "unstable-raw"), allow(unreachable_pub, dead_code))]

pub mod epwait;
pub mod features;
pub mod key;
pub mod lend;
pub mod pace;
pub mod poll;
pub mod recv;
pub mod zcrx;

use io_uring::{cqueue, squeue, IoUring};
use std::cell::{OnceCell, RefCell, RefMut};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

/// Why a ring could not be had.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// io_uring cannot be used on this host or in this process; fall back to a syscall path.
    #[error("io_uring unavailable: {reason}")]
    Unavailable {
        /// What the kernel said and what it means.
        reason: String,
        /// The errno from `io_uring_setup`.
        #[source]
        source: io::Error,
    },
    /// io_uring exists but rejected every set-up we tried.
    #[error("io_uring_setup failed with every flag set tried: {0}")]
    Setup(#[source] io::Error),
    /// Not asked of the kernel: it refused a ring for lack of resources moments ago, and the
    /// back-off ([`pace`]) has not passed. Fall back as for the refusal itself.
    #[error("io_uring_setup not tried: {reason}")]
    Throttled {
        /// Which refusal, how long ago, and why set-up is not retried yet.
        reason: String,
        /// The errno of that refusal.
        #[source]
        source: io::Error,
    },
}

/// Set-up options. [`RingConfig::default`] asks for the fastest single-thread configuration.
#[derive(Debug, Clone)]
pub struct RingConfig {
    /// Submission queue entries (rounded up to a power of two by the kernel).
    pub entries: u32,
    /// Completion queue entries; default `4 × entries`.
    pub cq_entries: Option<u32>,
    /// `IORING_SETUP_SINGLE_ISSUER` (6.0): only the creating thread submits.
    pub single_issuer: bool,
    /// `IORING_SETUP_DEFER_TASKRUN` (6.1): completions run only when the owner enters.
    pub defer_taskrun: bool,
    /// `IORING_SETUP_COOP_TASKRUN` (5.19): no IPI to interrupt the task for completions.
    pub coop_taskrun: bool,
    /// `IORING_SETUP_SQPOLL` with this idle time in ms (5.1; unprivileged since 5.11).
    pub sqpoll_idle_ms: Option<u32>,
}

impl Default for RingConfig {
    fn default() -> Self {
        Self {
            entries: 256,
            cq_entries: None,
            single_issuer: true,
            defer_taskrun: true,
            coop_taskrun: true,
            sqpoll_idle_ms: None,
        }
    }
}

/// One set-up flag: asked for, granted, and why not.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SetupFlag {
    /// Flag name without the `IORING_SETUP_` prefix.
    pub name: &'static str,
    /// The caller asked for it.
    pub requested: bool,
    /// The ring has it.
    pub granted: bool,
    /// Why it is missing, when requested and not granted.
    pub reason: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Flag {
    SqPoll,
    DeferTaskrun,
    SingleIssuer,
    CoopTaskrun,
}

impl Flag {
    fn name(self) -> &'static str {
        match self {
            Flag::SqPoll => "SQPOLL",
            Flag::DeferTaskrun => "DEFER_TASKRUN",
            Flag::SingleIssuer => "SINGLE_ISSUER",
            Flag::CoopTaskrun => "COOP_TASKRUN",
        }
    }
    fn since(self) -> &'static str {
        match self {
            Flag::SqPoll => "5.1, unprivileged since 5.11",
            Flag::DeferTaskrun => "6.1",
            Flag::SingleIssuer => "6.0",
            Flag::CoopTaskrun => "5.19",
        }
    }
}

/// An io_uring instance owned by one thread. `C` is `cqueue::Entry` or `cqueue::Entry32`.
pub struct Ring<C: cqueue::EntryMarker = cqueue::Entry> {
    ring: IoUring<squeue::Entry, C>,
    flags: Vec<SetupFlag>,
    enters: u64,
    overflow_flushes: u64,
    /// Entries pushed so far (`pushed - pending()` of them were taken by the kernel).
    pushed: u64,
    sqpoll: bool,
    /// The eventfd registered with `IORING_REGISTER_EVENTFD`, once [`Ring::notify_fd`] asked.
    evfd: Option<std::os::fd::OwnedFd>,
}

impl<C: cqueue::EntryMarker> std::fmt::Debug for Ring<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("flags", &self.flags)
            .field("enters", &self.enters)
            .finish()
    }
}

impl<C: cqueue::EntryMarker> Drop for Ring<C> {
    fn drop(&mut self) {
        // The kernel frees a DEFER_TASKRUN ring behind an RCU grace period: count it so that
        // a loop of rings is paced (pace.rs).
        if self.has_flag("DEFER_TASKRUN") {
            pace::released();
        }
    }
}

/// Explains an errno from `io_uring_setup` that means "no io_uring here".
fn unavailable_reason(err: &io::Error) -> Option<String> {
    let sysctl = crate::sys::read_sysctl("/proc/sys/kernel/io_uring_disabled").ok();
    match err.raw_os_error() {
        Some(libc::ENOSYS) => Some(
            "io_uring_setup returned ENOSYS: kernel without CONFIG_IO_URING, or a seccomp \
             filter blocks it (containers often do)"
                .into(),
        ),
        Some(libc::EPERM) => Some(match sysctl {
            Some(2) => "disabled by sysctl kernel.io_uring_disabled=2".into(),
            Some(1) => "restricted by sysctl kernel.io_uring_disabled=1 to CAP_SYS_ADMIN and \
                        kernel.io_uring_group"
                .into(),
            _ => "io_uring_setup returned EPERM: denied by seccomp or an LSM".into(),
        }),
        Some(libc::EACCES) => Some("io_uring_setup returned EACCES: denied by an LSM".into()),
        _ => None,
    }
}

impl<C: cqueue::EntryMarker> Ring<C> {
    /// Creates a ring with the best flags the kernel accepts. CQE32 is selected by the type
    /// parameter (`Ring<cqueue::Entry32>`).
    pub fn new(cfg: &RingConfig) -> Result<Self, RingError>
    where
        C: 'static,
    {
        let mut wanted: Vec<Flag> = Vec::new();
        let mut flags: Vec<SetupFlag> = Vec::new();
        let mut note = |flag: Flag, requested: bool, reason: Option<String>| {
            flags.push(SetupFlag {
                name: flag.name(),
                requested,
                granted: false,
                reason,
            });
        };
        if cfg.sqpoll_idle_ms.is_some() {
            wanted.push(Flag::SqPoll);
            note(Flag::SqPoll, true, None);
        } else {
            note(Flag::SqPoll, false, None);
        }
        if cfg.defer_taskrun && cfg.sqpoll_idle_ms.is_some() {
            note(
                Flag::DeferTaskrun,
                true,
                Some("not combinable with SQPOLL".into()),
            );
        } else if cfg.defer_taskrun && !cfg.single_issuer {
            note(
                Flag::DeferTaskrun,
                true,
                Some("requires SINGLE_ISSUER".into()),
            );
        } else {
            if cfg.defer_taskrun {
                wanted.push(Flag::DeferTaskrun);
            }
            note(Flag::DeferTaskrun, cfg.defer_taskrun, None);
        }
        if cfg.single_issuer {
            wanted.push(Flag::SingleIssuer);
        }
        note(Flag::SingleIssuer, cfg.single_issuer, None);
        if cfg.coop_taskrun {
            wanted.push(Flag::CoopTaskrun);
        }
        note(Flag::CoopTaskrun, cfg.coop_taskrun, None);

        // Drop flags one at a time, most recent kernel requirement first, until set-up works.
        let drop_order = [
            Flag::DeferTaskrun,
            Flag::SingleIssuer,
            Flag::CoopTaskrun,
            Flag::SqPoll,
        ];
        let mut drop_iter = drop_order.iter();
        if let Err(closed) = pace::admit(wanted.contains(&Flag::DeferTaskrun)) {
            return Err(RingError::Throttled {
                reason: closed.reason,
                source: io::Error::from_raw_os_error(closed.errno),
            });
        }
        loop {
            match Self::build(cfg, &wanted) {
                Ok(ring) => {
                    if !ring.params().is_feature_nodrop() {
                        return Err(RingError::Unavailable {
                            reason: "kernel lacks IORING_FEAT_NODROP (5.5): completions could be \
                                     lost on overflow"
                                .into(),
                            source: io::Error::from_raw_os_error(libc::ENOTSUP),
                        });
                    }
                    for f in &mut flags {
                        f.granted = wanted.iter().any(|w| w.name() == f.name);
                    }
                    return Ok(Self {
                        sqpoll: ring.params().is_setup_sqpoll(),
                        ring,
                        flags,
                        enters: 0,
                        overflow_flushes: 0,
                        pushed: 0,
                        evfd: None,
                    });
                }
                Err(e) => {
                    if let Some(reason) = unavailable_reason(&e) {
                        return Err(RingError::Unavailable { reason, source: e });
                    }
                    if e.raw_os_error() != Some(libc::EINVAL) {
                        return Err(RingError::Setup(e));
                    }
                    // EINVAL: the kernel does not know one of the flags. Drop the next one.
                    let next = drop_iter.by_ref().find(|f| wanted.contains(f));
                    let Some(&flag) = next else {
                        return Err(RingError::Setup(e));
                    };
                    wanted.retain(|w| *w != flag);
                    if flag == Flag::SingleIssuer && wanted.contains(&Flag::DeferTaskrun) {
                        wanted.retain(|w| *w != Flag::DeferTaskrun);
                    }
                    if let Some(f) = flags.iter_mut().find(|f| f.name == flag.name()) {
                        f.reason = Some(format!(
                            "kernel rejected it with EINVAL (needs Linux {})",
                            flag.since()
                        ));
                    }
                }
            }
        }
    }

    fn build(cfg: &RingConfig, wanted: &[Flag]) -> io::Result<IoUring<squeue::Entry, C>>
    where
        C: 'static,
    {
        let mut b = IoUring::<squeue::Entry, C>::builder();
        b.setup_cqsize(
            cfg.cq_entries
                .unwrap_or(cfg.entries.saturating_mul(4))
                .max(cfg.entries),
        );
        for f in wanted {
            match f {
                Flag::SqPoll => {
                    b.setup_sqpoll(cfg.sqpoll_idle_ms.unwrap_or(1000));
                }
                Flag::DeferTaskrun => {
                    b.setup_defer_taskrun();
                }
                Flag::SingleIssuer => {
                    b.setup_single_issuer();
                }
                Flag::CoopTaskrun => {
                    b.setup_coop_taskrun();
                    b.setup_taskrun_flag();
                }
            }
        }
        let ring = b.build(cfg.entries);
        pace::record(match &ring {
            Ok(_) => Ok(()),
            Err(e) => Err(e.raw_os_error().unwrap_or(0)),
        });
        Self::move_private(ring?)
    }

    /// Moves the ring's descriptor above [`crate::sys::private_fd_floor`] (when set): the
    /// descriptor is duplicated high with close-on-exec and the rings are mapped again from
    /// it; the low number is closed. (io-uring's `from_fd` exists for 16-byte CQEs only; a
    /// CQE32 ring stays where it is.)
    fn move_private(ring: IoUring<squeue::Entry, C>) -> io::Result<IoUring<squeue::Entry, C>>
    where
        C: 'static,
    {
        use std::any::Any;
        use std::os::fd::AsRawFd;
        type Plain = IoUring<squeue::Entry, cqueue::Entry>;
        let floor = crate::sys::private_fd_floor();
        if floor == 0 || ring.as_raw_fd() >= floor {
            return Ok(ring);
        }
        let mut slot = Some(ring);
        let Some(plain) = (&mut slot as &mut dyn Any).downcast_mut::<Option<Plain>>() else {
            return Ok(slot.expect("ring"));
        };
        let r = plain.take().expect("ring");
        let Some(high) = crate::sys::dup_private(r.as_raw_fd()) else {
            *plain = Some(r);
            return Ok(slot.expect("ring"));
        };
        let params = r.params().clone();
        drop(r);
        // SAFETY: `high` refers to the io_uring instance `params` describes (a duplicate of
        // its descriptor) and is owned by nobody else; ownership passes to the new IoUring.
        *plain = Some(unsafe { Plain::from_fd(high, params) }?);
        Ok(slot.expect("ring"))
    }

    /// Which set-up flags were asked for and granted, with reasons for the others.
    pub fn setup_flags(&self) -> &[SetupFlag] {
        &self.flags
    }

    /// Whether a set-up flag (name without `IORING_SETUP_`) was granted.
    pub fn has_flag(&self, name: &str) -> bool {
        self.flags.iter().any(|f| f.name == name && f.granted)
    }

    /// Number of `io_uring_enter` calls this ring made.
    pub fn enters(&self) -> u64 {
        self.enters
    }

    /// Number of times harvesting had to flush the kernel's CQ overflow list.
    pub fn overflow_flushes(&self) -> u64 {
        self.overflow_flushes
    }

    /// The underlying ring, for registration calls (buffers, buffer rings, zcrx).
    pub fn raw(&self) -> &IoUring<squeue::Entry, C> {
        &self.ring
    }

    /// Queues one entry, submitting first when the submission queue is full.
    ///
    /// # Safety
    ///
    /// Every buffer, iovec, msghdr and descriptor the entry points to must stay valid, and
    /// must not be touched by the caller where the kernel writes, until the entry's final
    /// completion (the CQE without `IORING_CQE_F_MORE`, and for zero-copy sends the
    /// notification CQE) has been harvested.
    pub unsafe fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: forwarded from this function's contract.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                self.pushed += 1;
                return Ok(());
            }
            self.submit()?;
        }
    }

    /// Free entries in the submission queue.
    pub fn sq_room(&mut self) -> usize {
        let sq = self.ring.submission();
        sq.capacity() - sq.len()
    }

    /// Entries queued but not yet handed to the kernel.
    pub fn pending(&mut self) -> usize {
        self.ring.submission().len()
    }

    /// Entries pushed so far, and how many of them the kernel has taken (the submission queue
    /// is first in, first out: entry number `n` was taken when `n < taken`).
    pub fn pushed_taken(&mut self) -> (u64, u64) {
        let pending = self.pending() as u64;
        (self.pushed, self.pushed - pending)
    }

    /// Hands queued entries to the kernel. Makes no syscall when nothing is queued and the
    /// kernel has nothing to flush, or when an awake SQPOLL thread will pick them up.
    pub fn submit(&mut self) -> io::Result<usize> {
        self.enter(0, None)
    }

    /// Submits and waits until at least `want` completions are ready (or `timeout` passes;
    /// then returns `Ok` with whatever is ready).
    pub fn submit_and_wait(&mut self, want: usize, timeout: Option<Duration>) -> io::Result<usize> {
        self.enter(want, timeout)
    }

    /// Submits and waits for `want` completions, but once `min_wait` has passed returns as soon
    /// as at least one is ready (`min_wait_usec`, `IORING_FEAT_MIN_TIMEOUT`, Linux 6.12): this
    /// lets completions accumulate into batches without holding back a lone one for long.
    /// `timeout` bounds the whole wait. On kernels without the feature, behaves like
    /// [`Ring::submit_and_wait`] with `want` = 1, and so does a `timeout` no longer than
    /// `min_wait`: the kernel (6.18) arms its first timer at `min_wait` whatever the timeout,
    /// so a zero-timeout poll would sleep the whole `min_wait` when nothing is ready.
    pub fn submit_and_wait_batch(
        &mut self,
        want: usize,
        min_wait: Duration,
        timeout: Duration,
    ) -> io::Result<usize> {
        if !self.ring.params().is_feature_min_timeout()
            || want <= 1
            || min_wait.is_zero()
            || timeout <= min_wait
        {
            // As below: a signal that cut the wait short leaves what is there to harvest.
            return match self.enter(1, Some(timeout)) {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => Ok(0),
                other => other,
            };
        }
        self.enters += 1;
        let ts = io_uring::types::Timespec::from(timeout);
        let args = io_uring::types::SubmitArgs::new()
            .timespec(&ts)
            .min_wait_usec(min_wait.as_micros().min(u32::MAX as u128) as u32);
        match self.ring.submitter().submit_with_args(want, &args) {
            // Timed out, or a signal cut the wait short: the caller harvests what is there.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME) | Some(libc::EINTR)) => Ok(0),
            other => other,
        }
    }

    /// Whether [`Ring::submit_and_wait_batch`] can hold completions back for a minimum wait
    /// (`IORING_FEAT_MIN_TIMEOUT`, Linux 6.12).
    pub fn has_min_wait(&self) -> bool {
        self.ring.params().is_feature_min_timeout()
    }

    fn enter(&mut self, want: usize, timeout: Option<Duration>) -> io::Result<usize> {
        let (pending, overflow, taskrun, wakeup) = {
            let mut sq = self.ring.submission();
            sq.sync();
            (
                sq.len(),
                sq.cq_overflow(),
                sq.taskrun(),
                self.sqpoll && sq.need_wakeup(),
            )
        };
        let needed = want > 0 || overflow || taskrun || (pending > 0 && (!self.sqpoll || wakeup));
        if !needed {
            return Ok(pending);
        }
        self.enters += 1;
        let res = match timeout {
            Some(t) if want > 0 => {
                let ts = io_uring::types::Timespec::from(t);
                let args = io_uring::types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(want, &args)
            }
            _ => self.ring.submitter().submit_and_wait(want),
        };
        match res {
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => Ok(0),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && want == 0 => Ok(0),
            other => other,
        }
    }

    /// Moves every ready completion to `f`, with no syscall unless the kernel holds overflowed
    /// completions (then it enters once per overflow batch to flush them). Returns the count.
    pub fn harvest(&mut self, mut f: impl FnMut(C)) -> io::Result<usize> {
        let mut n = 0;
        loop {
            let mut cq = self.ring.completion();
            cq.sync();
            for cqe in &mut cq {
                f(cqe);
                n += 1;
            }
            drop(cq);
            let overflow = {
                let sq = self.ring.submission();
                sq.cq_overflow()
            };
            if !overflow {
                return Ok(n);
            }
            self.overflow_flushes += 1;
            self.enters += 1;
            // GETEVENTS with no wait flushes the overflow list into the now-empty CQ.
            // SAFETY: no submission is passed; only the flag is used.
            unsafe {
                self.ring.submitter().enter::<libc::sigset_t>(
                    0,
                    0,
                    io_uring::EnterFlags::GETEVENTS.bits(),
                    None,
                )
            }?;
        }
    }

    /// Completions ready in the CQ right now, without a syscall.
    pub fn ready(&mut self) -> usize {
        let mut cq = self.ring.completion();
        cq.sync();
        cq.len()
    }

    /// The ring's readiness descriptor: an eventfd registered with `IORING_REGISTER_EVENTFD`
    /// (5.2), created on first call. The kernel signals it when it posts completions and,
    /// under `DEFER_TASKRUN`, when deferred task work is queued for the owner (the completions
    /// themselves are posted only when the owner enters with GETEVENTS). See
    /// `docs/design/async.md` for the rule per task-run mode.
    pub fn notify_fd(&mut self) -> io::Result<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::{AsFd, AsRawFd};
        if self.evfd.is_none() {
            let fd = crate::sys::eventfd(0)?;
            self.ring.submitter().register_eventfd(fd.as_raw_fd())?;
            self.evfd = Some(fd);
        }
        Ok(self.evfd.as_ref().expect("eventfd").as_fd())
    }

    /// Resets the registered eventfd's counter (no syscall when none is registered). Call it
    /// before checking [`Ring::has_work`], never after: a signal that comes later stays.
    pub fn clear_notify(&self) {
        use std::os::fd::AsRawFd;
        if let Some(fd) = &self.evfd {
            // EAGAIN (counter already zero) is the normal case after a spurious wake.
            let _ = crate::sys::epoll::eventfd_read(fd.as_raw_fd());
        }
    }

    /// Makes the registered eventfd readable: a harvest stopped with work left, which the
    /// kernel (it signals when it posts, not while work waits) would not announce again.
    pub fn keep_notify(&self) {
        use std::os::fd::AsRawFd;
        if let Some(fd) = &self.evfd {
            let _ = crate::sys::epoll::eventfd_write(fd.as_raw_fd(), 1);
        }
    }

    /// Turns the registered eventfd's notifications off (`quiet`) or on again: the
    /// `IORING_CQ_EVENTFD_DISABLED` flag of the CQ ring (Linux 5.8), a shared word the kernel
    /// reads before each signal (atomic access). No syscall.
    pub fn eventfd_quiet(&mut self, quiet: bool) {
        let cq = self.ring.completion();
        if quiet {
            cq.disable_eventfd();
        } else {
            cq.enable_eventfd();
            // The caller looks at the CQ tail and the task-work flag next: a store (the flag
            // cleared) then loads, against the kernel's store of the tail then load of the
            // flag. Either side must see the other's store, which takes a full fence between
            // them on every architecture (the crate's `Release` RMW is one only on x86).
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Whether anything waits to be harvested: completions in the CQ, an overflow list to
    /// flush, or deferred task work flagged with `IORING_SQ_TASKRUN`. No syscall.
    pub fn has_work(&mut self) -> bool {
        let (overflow, taskrun) = {
            let mut sq = self.ring.submission();
            sq.sync();
            (sq.cq_overflow(), sq.taskrun())
        };
        overflow || taskrun || self.ready() > 0
    }

    /// Kernel opcode support, from `IORING_REGISTER_PROBE`.
    pub fn probe_opcodes(&self) -> io::Result<io_uring::Probe> {
        let mut probe = io_uring::Probe::new();
        self.ring.submitter().register_probe(&mut probe)?;
        Ok(probe)
    }
}

/// One ring shared by a thread's receive side (`ring::recv::RecvRing`) and send side
/// (`ring::lend::LendRing`): one submission queue, one completion queue, and so one
/// `io_uring_enter` that submits and collects for both. Whichever side harvests reads the whole
/// CQ and keeps the other side's completions (told apart by the op in their user_data,
/// `ring::key`) in that side's inbox; the other side reads its inbox first. When a harvest
/// moves completions into the other side's inbox, the ring's readiness eventfd is signalled,
/// so a waiter on the other side's readiness descriptor wakes for them.
///
/// Single-threaded (`Rc`, `RefCell`): the ring is `SINGLE_ISSUER`, and no method holds the
/// ring borrowed while it calls back into the caller.
pub struct SharedRing<C: cqueue::EntryMarker = cqueue::Entry> {
    // Field order is drop order: the ring closes before what was kept for it is freed.
    ring: RefCell<Ring<C>>,
    sends: RefCell<VecDeque<(u64, i32, u32)>>,
    others: RefCell<VecDeque<C>>,
    scratch: RefCell<Vec<C>>,
    evfd: OnceCell<OwnedFd>,
    /// Nesting of the send side's calls that keep the eventfd quiet, and whether work was
    /// flagged when the outermost began (the eventfd may have been signalled for it).
    quiet: std::cell::Cell<(u32, bool)>,
    /// The eventfd was written for work only the send side knows of (`end_quiet`'s `left`):
    /// the next quiet call takes that back unless work is left then.
    told: std::cell::Cell<bool>,
    /// The send side's readiness descriptor is watched edge-triggered (tokio's `AsyncFd`):
    /// [`SharedRing::end_quiet`] does not read a signal back (see
    /// [`SharedRing::set_edge_readiness`]).
    edge: std::cell::Cell<bool>,
    /// System calls [`SharedRing::end_quiet`] made on the eventfd (reads and writes), for
    /// the send side's counters.
    eventfd_calls: std::cell::Cell<u64>,
    /// Memory a side registered with the ring and left when it went while the other side
    /// keeps the ring: freed only after the ring is closed.
    kept: RefCell<Vec<Box<dyn std::any::Any>>>,
}

impl<C: cqueue::EntryMarker> std::fmt::Debug for SharedRing<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRing")
            .field("sends_inbox", &self.sends.borrow().len())
            .field("others_inbox", &self.others.borrow().len())
            .finish()
    }
}

fn is_send(ud: u64) -> bool {
    key::Key::from_raw(ud).op() == Some(key::Op::SendZc)
}

impl<C: cqueue::EntryMarker> SharedRing<C> {
    /// Shares `ring`.
    pub fn new(ring: Ring<C>) -> std::rc::Rc<Self> {
        std::rc::Rc::new(Self {
            ring: RefCell::new(ring),
            sends: RefCell::new(VecDeque::new()),
            others: RefCell::new(VecDeque::new()),
            scratch: RefCell::new(Vec::new()),
            evfd: OnceCell::new(),
            quiet: std::cell::Cell::new((0, false)),
            told: std::cell::Cell::new(false),
            edge: std::cell::Cell::new(false),
            eventfd_calls: std::cell::Cell::new(0),
            kept: RefCell::new(Vec::new()),
        })
    }

    /// Keeps `x` alive until the ring is closed (memory the kernel may still reach through a
    /// registration of a side that went while the other keeps the ring).
    pub fn keep(&self, x: Box<dyn std::any::Any>) {
        self.kept.borrow_mut().push(x);
    }

    /// The ring, for one call (registrations, pushes, enters). Panics if a borrow is held:
    /// never nested by construction.
    pub fn get(&self) -> RefMut<'_, Ring<C>> {
        self.ring.borrow_mut()
    }

    /// Reads the CQ: completions of sends (`keep_sends`) or of everything else go to `f`
    /// (after what the inbox holds), the rest into the other side's inbox. Returns how many
    /// went to `f`.
    fn harvest_side(&self, keep_sends: bool, f: &mut dyn FnMut(C)) -> io::Result<usize> {
        let mut n = 0;
        if !keep_sends {
            loop {
                let c = self.others.borrow_mut().pop_front();
                let Some(c) = c else { break };
                f(c);
                n += 1;
            }
        }
        let mut scratch = std::mem::take(&mut *self.scratch.borrow_mut());
        let res = self.ring.borrow_mut().harvest(|c| scratch.push(c));
        let mut routed = false;
        for c in scratch.drain(..) {
            let send = is_send(c.user_data());
            if send == keep_sends {
                f(c);
                n += 1;
            } else if send {
                let e: cqueue::Entry = c.into();
                self.sends
                    .borrow_mut()
                    .push_back((e.user_data(), e.result(), e.flags()));
                routed = true;
            } else {
                self.others.borrow_mut().push_back(c);
                routed = true;
            }
        }
        *self.scratch.borrow_mut() = scratch;
        if routed {
            self.signal();
        }
        res.map(|_| n)
    }

    /// The receive side's harvest: every completion that is not a send's.
    pub fn harvest_others(&self, mut f: impl FnMut(C)) -> io::Result<usize> {
        self.harvest_side(false, &mut f)
    }

    /// The send side's harvest: `(user_data, res, flags)` of every send completion.
    pub fn harvest_sends(&self, f: &mut dyn FnMut(u64, i32, u32)) -> io::Result<usize> {
        let mut n = 0;
        loop {
            let c = self.sends.borrow_mut().pop_front();
            let Some((ud, res, flags)) = c else { break };
            f(ud, res, flags);
            n += 1;
        }
        let m = self.harvest_side(true, &mut |c: C| {
            let e: cqueue::Entry = c.into();
            f(e.user_data(), e.result(), e.flags())
        })?;
        Ok(n + m)
    }

    /// Completions ready for the receive side (its inbox and the CQ), without a syscall.
    pub fn ready(&self) -> usize {
        self.others.borrow().len() + self.ring.borrow_mut().ready()
    }

    /// The ring's readiness eventfd (`IORING_REGISTER_EVENTFD`), created on first call: both
    /// sides' readiness descriptors are built on it.
    pub fn notify_fd(&self) -> io::Result<BorrowedFd<'_>> {
        if self.evfd.get().is_none() {
            let fd = crate::sys::eventfd(0)?;
            self.ring
                .borrow()
                .raw()
                .submitter()
                .register_eventfd(fd.as_raw_fd())?;
            let _ = self.evfd.set(fd);
        }
        Ok(self.evfd.get().expect("set").as_fd())
    }

    /// Resets the eventfd (before checking [`SharedRing::has_work`], never after).
    pub fn clear_notify(&self) {
        if let Some(fd) = self.evfd.get() {
            let _ = crate::sys::epoll::eventfd_read(fd.as_raw_fd());
        }
    }

    /// Makes the eventfd readable: completions were moved into an inbox, or a harvest left
    /// work that the kernel will not signal again.
    pub(crate) fn signal(&self) {
        if let Some(fd) = self.evfd.get() {
            let _ = crate::sys::epoll::eventfd_write(fd.as_raw_fd(), 1);
        }
    }

    /// A call of the send side that may enter the ring begins: the eventfd stays quiet until
    /// the outermost such call ends ([`SharedRing::end_quiet`]), so the completions its own
    /// enters post (and harvest) do not make the readiness descriptor readable for nothing.
    /// Nothing happens before a readiness descriptor was asked for. `signalled`: the caller
    /// knows the eventfd may be readable (it was woken by it), so the end takes that back
    /// unless work is left.
    pub fn begin_quiet(&self, signalled: bool) {
        if self.evfd.get().is_none() {
            return;
        }
        let (depth, flagged) = self.quiet.get();
        if depth == 0 {
            // Work flagged now may have signalled the eventfd before this call, and so may
            // the end of an earlier call that left work of its own.
            let flagged = signalled || self.told.replace(false) || self.has_work();
            self.ring.borrow_mut().eventfd_quiet(true);
            self.quiet.set((1, flagged));
        } else {
            self.quiet.set((depth + 1, flagged || signalled));
        }
    }

    /// The outermost quiet call ends: the eventfd speaks again, and is left readable exactly
    /// when something waits (work that came while it was quiet signals it now; a signal for
    /// work this call has done is taken back). `left`: the caller left work that only it
    /// knows of (requests a harvest let go and no enter submitted), which the kernel will
    /// never announce. Returns whether work waits.
    pub fn end_quiet(&self, left: bool) -> bool {
        let (depth, flagged) = self.quiet.get();
        match depth {
            0 => return false,
            1 => {}
            _ => {
                self.quiet.set((depth - 1, flagged));
                return false;
            }
        }
        self.quiet.set((0, false));
        self.ring.borrow_mut().eventfd_quiet(false);
        // After the flag is cleared: work posted from here on signals by itself. A signal to
        // take back is read *before* the look, never after: work that comes between a look
        // that found nothing and the read signals the eventfd (its task-work list went from
        // empty to non-empty), and a read after the look would swallow that signal while the
        // list stays non-empty, so the kernel would never signal it again (a stream whose
        // last sends completed in that window waited for ever).
        // Watched edge-triggered, a signal left in the counter wakes nobody again: only a
        // new signal does, and the kernel signals whatever the counter holds.
        if flagged && !self.edge.get() {
            self.clear_notify();
            self.eventfd_calls.set(self.eventfd_calls.get() + 1);
        }
        let work = left || self.has_work();
        if work {
            self.signal();
            self.eventfd_calls.set(self.eventfd_calls.get() + 1);
            self.told.set(left);
        }
        work
    }

    /// The send side's readiness descriptor is watched edge-triggered (epoll's `EPOLLET`, as
    /// tokio's `AsyncFd` watches every descriptor): [`SharedRing::end_quiet`] then leaves the
    /// eventfd's counter as it is instead of reading a signal back, one system call per
    /// harvest saved. Work left when a call ends is still signalled (a write, which makes a
    /// new edge). Correct only for edge-triggered watchers: a level-triggered one would find
    /// the descriptor readable for ever.
    pub fn set_edge_readiness(&self, edge: bool) {
        self.edge.set(edge);
    }

    /// System calls [`SharedRing::end_quiet`] made on the eventfd so far.
    pub fn eventfd_calls(&self) -> u64 {
        self.eventfd_calls.get()
    }

    /// Whether either side has something to harvest: an inbox, the CQ, flagged task work.
    pub fn has_work(&self) -> bool {
        !self.sends.borrow().is_empty()
            || !self.others.borrow().is_empty()
            || self.ring.borrow_mut().has_work()
    }

    /// Whether send completions wait in the send side's inbox.
    pub fn sends_waiting(&self) -> bool {
        !self.sends.borrow().is_empty()
    }
}

/// What the send side needs of a ring, whatever its completion entry size (a receiver with
/// zcrx uses 32-byte CQEs): implemented by [`SharedRing`], so one `LendRing` serves a ring of
/// its own or a receiver's.
pub trait SendCore {
    /// Queues one entry (see [`Ring::push`]).
    ///
    /// # Safety
    ///
    /// As [`Ring::push`]: everything the entry points to stays valid until its final
    /// completion.
    unsafe fn push(&self, e: &squeue::Entry) -> io::Result<()>;
    /// Free submission queue entries.
    fn sq_room(&self) -> usize;
    /// Entries queued and not handed to the kernel.
    fn pending(&self) -> usize;
    /// `io_uring_enter(pending, 0, GETEVENTS)`; returns the kernel's result. Counted as the
    /// ring's enter.
    fn enter_getevents(&self) -> io::Result<usize>;
    /// Submits and waits for `want` completions or `timeout` (see [`Ring::submit_and_wait`]).
    fn submit_and_wait(&self, want: usize, timeout: Option<Duration>) -> io::Result<usize>;
    /// The ring's `io_uring_enter` calls so far (both sides').
    fn enters(&self) -> u64;
    /// Entries pushed so far (both sides') and how many of them the kernel has taken, by
    /// whichever side's enter (see [`Ring::pushed_taken`]).
    fn pushed_taken(&self) -> (u64, u64);
    /// `(user_data, res, flags)` of every send completion (see
    /// [`SharedRing::harvest_sends`]).
    fn harvest_sends(&self, f: &mut dyn FnMut(u64, i32, u32)) -> io::Result<usize>;
    /// Whether the kernel flagged deferred task work (`IORING_SQ_TASKRUN`).
    fn task_work_pending(&self) -> bool;
    /// Calls `f` with the ring's submitter (registrations).
    fn with_submitter(&self, f: &mut dyn FnMut(&io_uring::Submitter<'_>));
    /// The opcode probe (`IORING_REGISTER_PROBE`).
    fn probe_opcodes(&self) -> io::Result<io_uring::Probe>;
    /// The set-up flags asked for and granted.
    fn setup_flags(&self) -> Vec<SetupFlag>;
    /// The readiness eventfd (registered on first call).
    fn notify_raw(&self) -> io::Result<RawFd>;
    /// Resets the readiness eventfd.
    fn clear_notify(&self);
    /// Whether anything waits to be harvested (inboxes, CQ, task work).
    fn has_work(&self) -> bool;
    /// Whether another side (a receiver) uses the ring too.
    fn is_shared(&self) -> bool;
    /// See [`SharedRing::begin_quiet`].
    fn begin_quiet(&self, signalled: bool);
    /// See [`SharedRing::end_quiet`].
    fn end_quiet(&self, left: bool) -> bool;
    /// See [`SharedRing::set_edge_readiness`].
    fn set_edge_readiness(&self, edge: bool);
    /// See [`SharedRing::eventfd_calls`].
    fn eventfd_calls(&self) -> u64;
}

impl<C: cqueue::EntryMarker + 'static> SendCore for std::rc::Rc<SharedRing<C>> {
    unsafe fn push(&self, e: &squeue::Entry) -> io::Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.get().push(e) }
    }
    fn sq_room(&self) -> usize {
        self.get().sq_room()
    }
    fn pending(&self) -> usize {
        self.get().pending()
    }
    fn pushed_taken(&self) -> (u64, u64) {
        self.get().pushed_taken()
    }
    fn enter_getevents(&self) -> io::Result<usize> {
        let mut r = self.get();
        let pending = r.pending();
        r.enters += 1;
        // SAFETY: no argument pointer is passed; the entries submitted were queued by `push`,
        // whose callers uphold its contract.
        unsafe {
            r.ring.submitter().enter::<libc::sigset_t>(
                pending as u32,
                0,
                io_uring::EnterFlags::GETEVENTS.bits(),
                None,
            )
        }
    }
    fn submit_and_wait(&self, want: usize, timeout: Option<Duration>) -> io::Result<usize> {
        self.get().submit_and_wait(want, timeout)
    }
    fn enters(&self) -> u64 {
        self.ring.borrow().enters()
    }
    fn harvest_sends(&self, f: &mut dyn FnMut(u64, i32, u32)) -> io::Result<usize> {
        SharedRing::harvest_sends(self, f)
    }
    fn task_work_pending(&self) -> bool {
        let r = self.ring.borrow();
        // SAFETY: only the shared flags word is read; this thread is the ring's only user.
        let pending = unsafe { r.raw().submission_shared() }.taskrun();
        pending
    }
    fn with_submitter(&self, f: &mut dyn FnMut(&io_uring::Submitter<'_>)) {
        let r = self.ring.borrow();
        f(&r.raw().submitter());
    }
    fn probe_opcodes(&self) -> io::Result<io_uring::Probe> {
        self.ring.borrow().probe_opcodes()
    }
    fn setup_flags(&self) -> Vec<SetupFlag> {
        self.ring.borrow().setup_flags().to_vec()
    }
    fn notify_raw(&self) -> io::Result<RawFd> {
        SharedRing::notify_fd(self).map(|fd| fd.as_raw_fd())
    }
    fn clear_notify(&self) {
        SharedRing::clear_notify(self)
    }
    fn has_work(&self) -> bool {
        SharedRing::has_work(self)
    }
    fn is_shared(&self) -> bool {
        std::rc::Rc::strong_count(self) > 1
    }
    fn begin_quiet(&self, signalled: bool) {
        SharedRing::begin_quiet(self, signalled)
    }
    fn end_quiet(&self, left: bool) -> bool {
        SharedRing::end_quiet(self, left)
    }
    fn set_edge_readiness(&self, edge: bool) {
        SharedRing::set_edge_readiness(self, edge)
    }
    fn eventfd_calls(&self) -> u64 {
        SharedRing::eventfd_calls(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use io_uring::opcode;

    #[test]
    fn sqpoll_and_defer_taskrun_are_not_both_requested() {
        let cfg = RingConfig {
            sqpoll_idle_ms: Some(10),
            ..RingConfig::default()
        };
        let ring: Ring = match Ring::new(&cfg) {
            Ok(r) => r,
            Err(RingError::Unavailable { reason, .. }) => {
                eprintln!("skip: {reason}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let dt = ring
            .setup_flags()
            .iter()
            .find(|f| f.name == "DEFER_TASKRUN")
            .unwrap();
        assert!(!dt.granted);
        assert_eq!(dt.reason.as_deref(), Some("not combinable with SQPOLL"));
    }

    #[test]
    fn a_ring_moves_above_the_private_fd_floor_and_still_works() {
        use std::os::fd::AsRawFd;
        static SEEN: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
        crate::sys::set_private_fd_hook(|fd| SEEN.store(fd, std::sync::atomic::Ordering::Relaxed));
        crate::sys::set_private_fd_floor(700);
        let made = Ring::<cqueue::Entry>::new(&RingConfig::default());
        let ev = crate::sys::eventfd(0);
        crate::sys::set_private_fd_floor(0);
        let mut ring = match made {
            Ok(r) => r,
            Err(RingError::Unavailable { reason, .. }) => {
                println!("SKIP: io_uring unavailable: {reason}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let fd = ring.raw().as_raw_fd();
        assert!(fd >= 700, "ring fd {fd}");
        // SAFETY: F_GETFD on our own descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        assert!(ev.expect("eventfd").as_raw_fd() >= 700);
        assert!(SEEN.load(std::sync::atomic::Ordering::Relaxed) >= 700);
        // The rings were mapped again from the new descriptor: a NOP goes round.
        // SAFETY: a NOP references no memory.
        unsafe { ring.push(&opcode::Nop::new().build().user_data(9)) }.unwrap();
        ring.submit_and_wait(1, None).unwrap();
        let mut got = vec![];
        ring.harvest(|c| got.push(c.user_data())).unwrap();
        assert_eq!(got, vec![9]);
    }

    #[test]
    fn submit_without_work_makes_no_syscall() {
        let mut ring: Ring = Ring::new(&RingConfig::default()).expect("ring");
        ring.submit().unwrap();
        assert_eq!(ring.enters(), 0);
        // SAFETY: a NOP references no memory.
        unsafe { ring.push(&opcode::Nop::new().build().user_data(1)) }.unwrap();
        ring.submit_and_wait(1, None).unwrap();
        assert_eq!(ring.enters(), 1);
        let mut got = vec![];
        ring.harvest(|c| got.push(c.user_data())).unwrap();
        assert_eq!(got, vec![1]);
    }
}

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
pub mod poll;
pub mod recv;
pub mod send;
pub mod zcrx;

use io_uring::{cqueue, squeue, IoUring};
use std::io;
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
        let ring = b.build(cfg.entries)?;
        Self::move_private(ring)
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
    /// [`Ring::submit_and_wait`] with `want` = 1.
    pub fn submit_and_wait_batch(
        &mut self,
        want: usize,
        min_wait: Duration,
        timeout: Duration,
    ) -> io::Result<usize> {
        if !self.ring.params().is_feature_min_timeout() || want <= 1 || min_wait.is_zero() {
            return self.enter(1, Some(timeout));
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

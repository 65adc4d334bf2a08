//! Readiness events harvested from a ring without syscalls: the uepoll design (2019) with
//! every epoll semantic, realised on io_uring.
//!
//! [`EventRing`] has epoll's interface — `add`/`modify`/`delete` an fd with an interest mask
//! and a `u64` token, then collect [`Event`]s — with three backends, chosen per instance
//! ([`Prefer::Auto`]: the first the kernel offers; each step down is recorded as a
//! [`Fallback`] with its reason):
//!
//! - **EPOLL_WAIT** (Linux 6.15): the interest list is a kernel epoll instance (`epoll_ctl`);
//!   `wait` collects it with one `IORING_OP_EPOLL_WAIT` request, completed inside `wait`'s own
//!   kernel entry, so reports are exactly epoll's (whole readiness polled at report time, no
//!   file references: a `close` or `DEL` releases the file at once). One kernel entry per
//!   batch, as `epoll_wait`. Per workload ([`WaitChoice`], [`choice`]) a wait may instead be a
//!   plain `epoll_wait` on the same instance, which costs less CPU when events are ready or a
//!   zero-timeout poll finds nothing; each switch is recorded ([`EventRing::decisions`]).
//! - **poll ring**: each fd gets a `POLL_ADD` (multishot for edge-triggered interest, one-shot
//!   re-armed after each report for level-triggered, `ONESHOT` and `EXCLUSIVE` interest);
//!   readiness arrives as CQEs in shared memory. [`EventRing::harvest`] copies what is
//!   ready without a syscall; [`EventRing::wait`] enters the kernel only when nothing is
//!   ready (or level-triggered fds need their re-check). Modify and delete cancel (delete
//!   synchronously, as `EPOLL_CTL_DEL`), timeouts use `EXT_ARG`. The ring uses `COOP_TASKRUN +
//!   TASKRUN_FLAG + SINGLE_ISSUER` by default (wake-ups are posted to the CQ whenever the loop
//!   thread enters the kernel for any syscall, so a busy loop finds them in memory),
//!   `DEFER_TASKRUN` on request (one `io_uring_enter` per batch of events), or `SQPOLL`.
//!   Optionally a loop that was busy spins a few microseconds on the CQ before it sleeps
//!   ([`EventConfig::spin`]).
//! - **epoll**: the real thing, used when io_uring is unavailable.
//!
//! Every backend carries a multi-producer ring of **user-posted events** ([`Poster`]): any
//! thread posts `(token, events)` without a syscall; the loop harvests them with fd events
//! and is woken through an eventfd only when it sleeps.
//!
//! Contract differences with epoll (poll ring only, see `docs/design/event.md`): an armed
//! io_uring poll holds a reference to the file, so closing a registered fd does not end its
//! registration (nor the socket): call [`EventRing::delete`] (or [`EventRing::close`]) first.
//! `harvest` never re-checks level-triggered fds (that needs the kernel); `wait` does.
//!
//! The API is C-friendly: raw fds, epoll bit values, `u64` tokens, `#[repr(C)]` events.

pub mod choice;
mod epoll;
mod epwait;
mod uring;

use crate::buf::mpsc::{MpscRing, Pushed};
use crate::ring::{RingConfig, RingError};
use crate::stats::{Counters, Fallback, Path, Report};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Why a ring backend could not be set up: unavailable here (the kernel or the process lacks
/// it: fall back, with the reason), out of resources for now (the ring's memory is charged to
/// `RLIMIT_MEMLOCK` for unprivileged users and freed asynchronously when a ring goes; file
/// descriptors), or an I/O error to report.
pub(super) enum NewError {
    Unavailable(String),
    Exhausted(io::Error),
    /// Not tried: a refusal for lack of resources moments ago ([`crate::ring::pace`]); the
    /// reason, and that refusal's errno.
    Throttled(String, io::Error),
    Io(io::Error),
}

impl From<RingError> for NewError {
    fn from(e: RingError) -> Self {
        match e {
            RingError::Unavailable { reason, .. } => NewError::Unavailable(reason),
            RingError::Setup(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOMEM | libc::EMFILE | libc::ENFILE | libc::EAGAIN)
                ) =>
            {
                NewError::Exhausted(e)
            }
            RingError::Setup(e) => {
                NewError::Unavailable(format!("io_uring_setup failed with every flag set: {e}"))
            }
            RingError::Throttled { reason, source } => NewError::Throttled(reason, source),
        }
    }
}

impl NewError {
    /// The reason a fallback records.
    fn reason(self) -> Result<String, io::Error> {
        match self {
            NewError::Unavailable(r) => Ok(r),
            NewError::Exhausted(e) => Ok(format!(
                "io_uring_setup failed for lack of resources: {e} (ring memory counts against \
                 RLIMIT_MEMLOCK for unprivileged users)"
            )),
            NewError::Throttled(r, _) => Ok(r),
            NewError::Io(e) => Err(e),
        }
    }

    /// The error of a backend asked for by name: `Unsupported` when the kernel or the
    /// process lacks it; a lack of resources keeps its errno (it may pass).
    fn into_io(self) -> io::Error {
        match self {
            NewError::Unavailable(r) => io::Error::new(io::ErrorKind::Unsupported, r),
            NewError::Exhausted(e) | NewError::Io(e) => e,
            // The refusal's errno, so that a caller tells "not now" from "not here".
            NewError::Throttled(_, e) => e,
        }
    }
}

pub use crate::buf::mpsc::Full;

/// Interest and result bits, with epoll's values (so a C shim passes `epoll_event.events`
/// through unchanged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct Interest(pub u32);

impl Interest {
    /// Readable (`EPOLLIN`).
    pub const IN: Interest = Interest(libc::EPOLLIN as u32);
    /// Writable (`EPOLLOUT`).
    pub const OUT: Interest = Interest(libc::EPOLLOUT as u32);
    /// Urgent data (`EPOLLPRI`).
    pub const PRI: Interest = Interest(libc::EPOLLPRI as u32);
    /// Peer closed its writing half (`EPOLLRDHUP`).
    pub const RDHUP: Interest = Interest(libc::EPOLLRDHUP as u32);
    /// Error (`EPOLLERR`, always reported).
    pub const ERR: Interest = Interest(libc::EPOLLERR as u32);
    /// Hang-up (`EPOLLHUP`, always reported).
    pub const HUP: Interest = Interest(libc::EPOLLHUP as u32);
    /// Edge-triggered (`EPOLLET`); without it, level-triggered.
    pub const ET: Interest = Interest(libc::EPOLLET as u32);
    /// Disable after one report until [`EventRing::modify`] (`EPOLLONESHOT`).
    pub const ONESHOT: Interest = Interest(libc::EPOLLONESHOT as u32);
    /// Exclusive wake-up among several waiters on one fd (`EPOLLEXCLUSIVE`, ADD only).
    pub const EXCLUSIVE: Interest = Interest(libc::EPOLLEXCLUSIVE as u32);

    /// Readiness bits a poll can report (everything but the mode bits).
    pub const READINESS: u32 = !(libc::EPOLLET as u32
        | libc::EPOLLONESHOT as u32
        | libc::EPOLLEXCLUSIVE as u32
        | libc::EPOLLWAKEUP as u32);
    /// Bits epoll accepts together with `EPOLLEXCLUSIVE` (`EPOLLEXCLUSIVE_OK_BITS`).
    pub const EXCLUSIVE_OK: u32 = (libc::EPOLLIN
        | libc::EPOLLOUT
        | libc::EPOLLRDNORM
        | libc::EPOLLRDBAND
        | libc::EPOLLWRNORM
        | libc::EPOLLWRBAND
        | libc::EPOLLERR
        | libc::EPOLLHUP
        | libc::EPOLLWAKEUP
        | libc::EPOLLET
        | libc::EPOLLEXCLUSIVE) as u32;

    /// The raw bits.
    pub fn bits(self) -> u32 {
        self.0
    }
    /// Whether all bits of `other` are set.
    pub fn contains(self, other: Interest) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Interest {
    type Output = Interest;
    fn bitor(self, rhs: Interest) -> Interest {
        Interest(self.0 | rhs.0)
    }
}

/// One ready event: the epoll bits that are ready and the token given at registration (or
/// posted by a [`Poster`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(C)]
pub struct Event {
    /// Ready bits (`EPOLLIN`, …).
    pub events: u32,
    /// The registration's (or poster's) token.
    pub token: u64,
}

/// Why `add`, `modify` or `delete` failed; each variant is the errno epoll returns for it.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// `EBADF`: the fd is not open.
    #[error("fd {0} is not an open descriptor (EBADF)")]
    BadFd(RawFd),
    /// `EEXIST`: `add` of an fd already registered.
    #[error("fd {0} is already registered; use modify (EEXIST)")]
    Exists(RawFd),
    /// `ENOENT`: `modify`/`delete` of an fd not registered.
    #[error("fd {0} is not registered (ENOENT)")]
    NotFound(RawFd),
    /// `EPERM`: regular files and directories cannot be polled.
    #[error("fd {0} cannot be polled: regular files and directories are always ready (EPERM)")]
    NotPollable(RawFd),
    /// `EINVAL`: an invalid combination (see the message).
    #[error("invalid request: {0} (EINVAL)")]
    Invalid(&'static str),
    /// The kernel refused the submission or the epoll call.
    #[error("submitting the registration failed: {0}")]
    Io(#[from] io::Error),
}

impl CtlError {
    /// The errno epoll would have set.
    pub fn errno(&self) -> i32 {
        match self {
            CtlError::BadFd(_) => libc::EBADF,
            CtlError::Exists(_) => libc::EEXIST,
            CtlError::NotFound(_) => libc::ENOENT,
            CtlError::NotPollable(_) => libc::EPERM,
            CtlError::Invalid(_) => libc::EINVAL,
            CtlError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    fn from_errno(e: io::Error, fd: RawFd, what: &'static str) -> Self {
        match e.raw_os_error() {
            Some(libc::EBADF) => CtlError::BadFd(fd),
            Some(libc::EEXIST) => CtlError::Exists(fd),
            Some(libc::ENOENT) => CtlError::NotFound(fd),
            Some(libc::EPERM) => CtlError::NotPollable(fd),
            Some(libc::EINVAL) => CtlError::Invalid(what),
            _ => CtlError::Io(e),
        }
    }
}

/// The backend an [`EventRing`] chose (once, at construction).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum EventPath {
    /// The io_uring poll ring (`IORING_OP_POLL_ADD` multishot per descriptor): `io_uring`.
    Uring,
    /// io_uring `EPOLL_WAIT` on a kernel epoll holding the interest list:
    /// `io_uring_epoll_wait`.
    UringEpollWait,
    /// Plain `epoll_wait`: `epoll`.
    Epoll,
}

impl EventPath {
    /// `io_uring`, `io_uring_epoll_wait` or `epoll` (the names the C ABI, the preload
    /// shim's stats and `results.json` carry).
    pub fn as_str(self) -> &'static str {
        match self {
            EventPath::Uring => "io_uring",
            EventPath::UringEpollWait => "io_uring_epoll_wait",
            EventPath::Epoll => "epoll",
        }
    }
}

impl std::fmt::Display for EventPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Prefer {
    /// The best backend the kernel offers: `EPOLL_WAIT` on io_uring, else the poll ring,
    /// else epoll; the choice and its reason are recorded as [`Fallback`]s.
    #[default]
    Auto,
    /// The io_uring poll ring (one `POLL_ADD` per fd) only: fail when unavailable.
    Uring,
    /// `IORING_OP_EPOLL_WAIT` over a kernel epoll instance (Linux 6.15) only: fail when
    /// unavailable.
    EpollWait,
    /// epoll (the baseline).
    Epoll,
}

/// How the `EPOLL_WAIT` backend collects its epoll instance: chosen per workload, or fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitChoice {
    /// Per workload ([`choice::Chooser`]): starts with the ring's `EPOLL_WAIT`, switches to a
    /// plain `epoll_wait` on the same instance (and back) when the waits it observes show that
    /// one costs fewer kernel entries; each switch is recorded with its reason
    /// ([`EventRing::decisions`]).
    #[default]
    Auto,
    /// Always the ring's `EPOLL_WAIT`.
    Ring,
    /// Always `epoll_wait(2)` with a zero timeout first; the ring only to sleep.
    Plain,
    /// Switches mode at every wait (tests: the equivalence scenarios across switches).
    #[doc(hidden)]
    Alternate,
}

/// Construction options.
#[derive(Debug, Clone)]
pub struct EventConfig {
    /// Backend choice.
    pub prefer: Prefer,
    /// Ring set-up (default: COOP_TASKRUN + SINGLE_ISSUER, no DEFER_TASKRUN; set
    /// `defer_taskrun` for DEFER_TASKRUN, `sqpoll_idle_ms` for SQPOLL).
    pub ring: RingConfig,
    /// Capacity of the user-posted event ring.
    pub user_capacity: usize,
    /// Busy-harvest: when a wait finds nothing but the previous one returned events, the
    /// io_uring backend spins this long on the CQ, the kernel's TASKRUN flag and the user
    /// ring before sleeping (once per idle period). Zero (the default) disables it: measured
    /// neutral for HTTP and slower for user-posted events here (`docs/design/event.md`).
    pub spin: Duration,
    /// `EPOLL_WAIT` backend only: use this existing epoll instance (not closed by the ring)
    /// instead of creating one — the epoll shim passes the program's own epoll fd, so
    /// registrations made behind its back land in the same interest list.
    pub epoll_fd: Option<RawFd>,
    /// `EPOLL_WAIT` backend only: ring wait or plain `epoll_wait`, per workload by default.
    pub wait_choice: WaitChoice,
}

impl Default for EventConfig {
    fn default() -> Self {
        Self {
            prefer: Prefer::Auto,
            ring: RingConfig {
                entries: 1024,
                cq_entries: Some(16384),
                // COOP_TASKRUN without DEFER_TASKRUN: wake-ups are posted to the CQ whenever
                // the loop thread enters the kernel for any syscall (its own reads and
                // writes), so a busy loop finds its events in memory; with DEFER_TASKRUN
                // every batch of events costs an io_uring_enter (docs/design/event.md).
                defer_taskrun: false,
                ..RingConfig::default()
            },
            user_capacity: 4096,
            spin: Duration::ZERO,
            epoll_fd: None,
            wait_choice: WaitChoice::Auto,
        }
    }
}

/// The backend behind an [`EventRing`]. Not boxed: one per loop, and the hot path should
/// not chase a pointer.
#[allow(clippy::large_enum_variant)]
enum Backend {
    Uring(uring::UringEvents),
    Epwait(epwait::EpwaitEvents),
    Epoll(epoll::EpollEvents),
}

/// What both backends share: the user-posted ring and its wake-up eventfd.
#[derive(Debug)]
struct UserShared {
    ring: MpscRing,
    wake_fd: OwnedFd,
    wakes: AtomicU64,
}

/// An epoll-equivalent event set whose events are harvested from shared memory.
///
/// Owned by one thread (with `SINGLE_ISSUER` the kernel holds the ring to its creator): create
/// it on the thread that runs the loop. Where several threads must wait on one set (an epoll
/// fd shared by threads, as a C shim may see), use `RingConfig { single_issuer: false,
/// defer_taskrun: false, .. }` and serialise calls.
pub struct EventRing {
    /// The readiness set, once asked for (declared first: closed before the backend).
    readiness: Option<crate::sys::ready::ReadySet>,
    backend: Backend,
    user: Arc<UserShared>,
    fallbacks: Vec<Fallback>,
    /// The per-workload choice's switches, newest last (at most [`MAX_DECISIONS`]).
    decisions: Vec<Fallback>,
    harvested: u64,
    user_harvested: u64,
}

/// Decisions kept per instance (the oldest are dropped; [`EventStats::mode_switches`] counts
/// them all).
const MAX_DECISIONS: usize = 16;

impl std::fmt::Debug for EventRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRing")
            .field("backend", &self.path())
            .field("fallbacks", &self.fallbacks)
            .finish()
    }
}

/// Posts user events to an [`EventRing`] from any thread, without a syscall unless the loop
/// sleeps. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Poster {
    user: Arc<UserShared>,
}

impl Poster {
    /// Posts `(token, events)`; the loop sees it in its next `harvest`/`wait`.
    pub fn post(&self, token: u64, events: u32) -> Result<(), Full> {
        if self.user.ring.push(token, events)? == Pushed::WakeConsumer {
            self.user.wakes.fetch_add(1, Ordering::Relaxed);
            // An eventfd write cannot fail on a valid fd short of counter overflow (2^64-2
            // writes); a failure here would only delay the loop until its timeout.
            let _ = crate::sys::epoll::eventfd_write(self.user.wake_fd.as_raw_fd(), 1);
        }
        Ok(())
    }

    /// Wake-ups (eventfd writes) posters made so far, over all clones.
    pub fn wakes(&self) -> u64 {
        self.user.wakes.load(Ordering::Relaxed)
    }
}

/// Per-object counters of an [`EventRing`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct EventStats {
    /// Events handed to the caller (fd and user-posted).
    pub events: u64,
    /// Of which user-posted.
    pub user_events: u64,
    /// All syscalls this object made (`io_uring_enter`, `epoll_wait`, `epoll_ctl`, `fstat`).
    pub syscalls: u64,
    /// Kernel entries made to wait for or collect events (`io_uring_enter` / `epoll_wait`).
    pub wait_entries: u64,
    /// Completions processed (io_uring backend).
    pub cqes: u64,
    /// Polls re-armed (level-triggered re-checks, ended multishots).
    pub rearms: u64,
    /// Poll completions with an error (e.g. `EBADF`: fd closed before submission).
    pub poll_errors: u64,
    /// Eventfd wake-ups by posters.
    pub poster_wakes: u64,
    /// Busy-harvest spins (io_uring backend) that found work before the loop slept.
    pub spins_won: u64,
    /// Busy-harvest spins that found nothing (the loop then slept).
    pub spins_lost: u64,
    /// `EPOLL_WAIT` backend: waits collected with a plain `epoll_wait` (counted in
    /// `wait_entries`).
    pub plain_waits: u64,
    /// `EPOLL_WAIT` backend: switches between the ring wait and plain `epoll_wait`.
    pub mode_switches: u64,
}

impl EventRing {
    /// An event ring with the default configuration (io_uring, epoll fallback).
    pub fn new() -> io::Result<Self> {
        Self::with_config(&EventConfig::default())
    }

    /// An event ring with `cfg`.
    pub fn with_config(cfg: &EventConfig) -> io::Result<Self> {
        let user = Arc::new(UserShared {
            ring: MpscRing::new(cfg.user_capacity),
            wake_fd: crate::sys::eventfd(0)?,
            wakes: AtomicU64::new(0),
        });
        let wake = user.wake_fd.as_raw_fd();
        let mut fallbacks = Vec::new();
        let backend = match cfg.prefer {
            Prefer::Epoll => Backend::Epoll(epoll::EpollEvents::new(wake)?),
            Prefer::EpollWait => Backend::Epwait(
                epwait::EpwaitEvents::new(&cfg.ring, wake, cfg.epoll_fd, cfg.wait_choice)
                    .map_err(NewError::into_io)?,
            ),
            Prefer::Uring => Backend::Uring(
                uring::UringEvents::new(&cfg.ring, cfg.spin, wake).map_err(NewError::into_io)?,
            ),
            Prefer::Auto => Self::choose(cfg, wake, &mut fallbacks)?,
        };
        Ok(Self {
            readiness: None,
            backend,
            user,
            fallbacks,
            decisions: Vec::new(),
            harvested: 0,
            user_harvested: 0,
        })
    }

    /// The choice of [`Prefer::Auto`]: `EPOLL_WAIT` where the kernel has it (the interest
    /// list in a real epoll: epoll's cheap wake-ups and level re-checks, reports polled at
    /// report time, no file references), else the poll ring, else epoll. Every step down is
    /// recorded with its reason. (`docs/design/event.md`, "Choice".)
    fn choose(
        cfg: &EventConfig,
        wake: RawFd,
        fallbacks: &mut Vec<Fallback>,
    ) -> io::Result<Backend> {
        match epwait::EpwaitEvents::new(&cfg.ring, wake, cfg.epoll_fd, cfg.wait_choice) {
            Ok(e) => return Ok(Backend::Epwait(e)),
            Err(e) => fallbacks.push(Fallback::new(
                EventPath::UringEpollWait,
                EventPath::Uring,
                e.reason()?,
            )),
        }
        if cfg.epoll_fd.is_some() {
            // Only a kernel epoll reading that instance could serve it: the caller decides.
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "an existing epoll instance needs the EPOLL_WAIT backend",
            ));
        }
        match uring::UringEvents::new(&cfg.ring, cfg.spin, wake) {
            Ok(u) => Ok(Backend::Uring(u)),
            Err(e) => {
                fallbacks.push(Fallback::new(
                    EventPath::Uring,
                    EventPath::Epoll,
                    e.reason()?,
                ));
                Ok(Backend::Epoll(epoll::EpollEvents::new(wake)?))
            }
        }
    }

    /// The backend in use (was `backend_name()`; its names are [`EventPath::as_str`]).
    pub fn path(&self) -> EventPath {
        match self.backend {
            Backend::Uring(_) => EventPath::Uring,
            Backend::Epwait(_) => EventPath::UringEpollWait,
            Backend::Epoll(_) => EventPath::Epoll,
        }
    }

    /// The kernel epoll instance holding the interest list (`EPOLL_WAIT` backend).
    pub fn epoll_fd(&self) -> Option<RawFd> {
        match &self.backend {
            Backend::Epwait(e) => Some(e.epoll_fd()),
            _ => None,
        }
    }

    /// Fallbacks taken at construction, with reasons.
    pub fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }

    /// The per-workload choice's switches (`EPOLL_WAIT` backend, [`WaitChoice::Auto`]), each
    /// as `from -> to: reason`, newest last; the last 16 are kept.
    pub fn decisions(&self) -> &[Fallback] {
        &self.decisions
    }

    /// How the `EPOLL_WAIT` backend collects events now (`None` on the other backends).
    pub fn wait_mode(&self) -> Option<choice::WaitMode> {
        match &self.backend {
            Backend::Epwait(e) => Some(e.mode()),
            _ => None,
        }
    }

    /// Whether the `EPOLL_WAIT` backend holds something for its next `wait`: a request armed
    /// on the epoll instance (a wait returned before it completed: timeout, user-posted event,
    /// signal; only with DEFER_TASKRUN), which consumes the events it collects at that wait, or
    /// events of a completion that did not fit the caller's array. A caller that stops waiting
    /// through the ring (the epoll shim handing an instance to `epoll_wait`) does so only while
    /// this is false, or those events would be lost. Always false on the other backends.
    pub fn wait_pending(&self) -> bool {
        match &self.backend {
            Backend::Epwait(e) => e.pending(),
            _ => false,
        }
    }

    /// Sets the `EPOLL_WAIT` backend's [`WaitChoice`] (no-op elsewhere); a switch takes effect
    /// at the next `wait`, which reaps an armed request first and reports what it collected.
    pub fn set_wait_choice(&mut self, choice: WaitChoice) {
        if let Backend::Epwait(e) = &mut self.backend {
            e.set_choice(choice);
        }
    }

    /// The ring's set-up flags (io_uring backend), e.g. to see whether DEFER_TASKRUN was had.
    pub fn setup_flags(&self) -> Vec<crate::ring::SetupFlag> {
        match &self.backend {
            Backend::Uring(u) => u.setup_flags().to_vec(),
            Backend::Epwait(e) => e.setup_flags().to_vec(),
            Backend::Epoll(_) => Vec::new(),
        }
    }

    /// Registers `fd` for `interest` (readiness bits plus ET/ONESHOT/EXCLUSIVE); events carry
    /// `token`. Errors as `EPOLL_CTL_ADD`.
    pub fn add(&mut self, fd: RawFd, interest: Interest, token: u64) -> Result<(), CtlError> {
        match &mut self.backend {
            Backend::Uring(u) => u.add(fd, interest.0, token),
            Backend::Epwait(e) => e.add(fd, interest.0, token),
            Backend::Epoll(e) => e.add(fd, interest.0, token),
        }
    }

    /// Changes the interest and token of a registered fd; re-enables a fired ONESHOT and
    /// reports the fd again if it is ready. Errors as `EPOLL_CTL_MOD`.
    pub fn modify(&mut self, fd: RawFd, interest: Interest, token: u64) -> Result<(), CtlError> {
        match &mut self.backend {
            Backend::Uring(u) => u.modify(fd, interest.0, token),
            Backend::Epwait(e) => e.modify(fd, interest.0, token),
            Backend::Epoll(e) => e.modify(fd, interest.0, token),
        }
    }

    /// Unregisters `fd`; events of it not yet harvested are dropped. Errors as
    /// `EPOLL_CTL_DEL`, and as synchronous: when it returns the kernel holds no reference to
    /// the fd's file (the poll ring cancels the poll and runs the cancellation in one
    /// `io_uring_enter`), so a `close` right after releases the socket.
    pub fn delete(&mut self, fd: RawFd) -> Result<(), CtlError> {
        match &mut self.backend {
            Backend::Uring(u) => u.delete(fd),
            Backend::Epwait(e) => e.delete(fd),
            Backend::Epoll(e) => e.delete(fd),
        }
    }

    /// Deletes `fd` if registered, makes the kernel drop its reference now, and closes it:
    /// what `close(fd)` does to an epoll registration.
    pub fn close(&mut self, fd: OwnedFd) -> io::Result<()> {
        let raw = fd.as_raw_fd();
        match &mut self.backend {
            Backend::Uring(u) => {
                let _ = u.delete(raw);
                u.flush()?;
            }
            Backend::Epwait(e) => {
                let _ = e.delete(raw);
            }
            Backend::Epoll(e) => {
                let _ = e.delete(raw);
            }
        }
        drop(fd);
        Ok(())
    }

    /// Submits queued re-arms and cancellations now and runs pending completion work (one
    /// `io_uring_enter`; nothing on the epoll backend). After `delete(fd)` + `flush()` the
    /// kernel holds no reference to the fd's file, so a following `close(fd)` closes it at
    /// once (what a C shim intercepting `close` needs).
    pub fn flush(&mut self) -> io::Result<()> {
        match &mut self.backend {
            Backend::Uring(u) => u.flush(),
            Backend::Epwait(_) | Backend::Epoll(_) => Ok(()),
        }
    }

    /// A handle other threads use to post events to this ring.
    ///
    /// While no poster exists, a blocking wait of the `EPOLL_WAIT` backend in plain mode
    /// sleeps in `epoll_wait` itself (a post could not wake it; none can be made during a
    /// `wait`, which holds the ring mutably). A wrapper that lets other threads make posters
    /// while the owner waits (the C API) keeps one poster alive from the start.
    pub fn poster(&self) -> Poster {
        Poster {
            user: self.user.clone(),
        }
    }

    /// Copies events that are already known to be ready into `out`, with no syscall (io_uring
    /// backend; the epoll backend has to call `epoll_wait` with a zero timeout). Returns how
    /// many were written.
    pub fn harvest(&mut self, out: &mut [Event]) -> io::Result<usize> {
        let n = match &mut self.backend {
            Backend::Uring(u) => u.harvest(out)?,
            Backend::Epwait(e) => e.harvest(out)?,
            Backend::Epoll(e) => e.wait(out, Some(Duration::ZERO), &self.user.ring, false)?,
        };
        let m = self.harvest_user(&mut out[n..]);
        self.harvested += (n + m) as u64;
        Ok(n + m)
    }

    /// Like `epoll_wait`: fills `out` with ready events, entering the kernel only when nothing
    /// is ready (or level-triggered fds reported last time need their re-check). `timeout`
    /// `None` blocks; returns 0 only when the timeout passed. `out` empty is `EINVAL`.
    pub fn wait(&mut self, out: &mut [Event], timeout: Option<Duration>) -> io::Result<usize> {
        if out.is_empty() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let n = match &mut self.backend {
            Backend::Uring(u) => u.wait(out, timeout, &self.user.ring)?,
            Backend::Epwait(e) => {
                // Posters are made from `&self`, so none can appear during this call.
                let poster = Arc::strong_count(&self.user) > 1;
                e.wait(out, timeout, &self.user.ring, poster)?
            }
            Backend::Epoll(e) => e.wait(out, timeout, &self.user.ring, true)?,
        };
        let m = self.harvest_user(&mut out[n..]);
        if let Backend::Epwait(e) = &mut self.backend {
            if let Some(d) = e.finish_wait(m) {
                if self.decisions.len() == MAX_DECISIONS {
                    self.decisions.remove(0);
                }
                self.decisions.push(Fallback::new(
                    Path::setting(d.from.name()),
                    Path::setting(d.to.name()),
                    d.reason,
                ));
            }
        }
        self.harvested += (n + m) as u64;
        Ok(n + m)
    }

    fn harvest_user(&mut self, out: &mut [Event]) -> usize {
        if out.is_empty() {
            return 0;
        }
        let mut i = 0;
        let n = self.user.ring.pop_batch(out.len(), |token, events| {
            out[i] = Event { events, token };
            i += 1;
        });
        self.user_harvested += n as u64;
        n
    }

    /// The readiness descriptor, created on first call: it polls readable when
    /// [`EventRing::on_ready`] would find events — the ring's registered eventfd (poll ring
    /// and `EPOLL_WAIT` backends: signalled when a poll completion is posted, or under
    /// `DEFER_TASKRUN` when its task work is queued), the kernel epoll set of the interest
    /// list (`EPOLL_WAIT` and epoll backends, level-triggered), and the user-post eventfd
    /// (written by a [`Poster`] once `on_ready` has returned, the loop counting as asleep).
    /// Rules per backend and task-run mode: `docs/design/async.md`.
    pub fn readiness_fd(&mut self) -> io::Result<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        if self.readiness.is_none() {
            let set = crate::sys::ready::ReadySet::new()?;
            let level = libc::EPOLLIN as u32;
            match &mut self.backend {
                Backend::Uring(u) => set.add_level(u.ring.notify_fd()?.as_raw_fd(), level)?,
                Backend::Epwait(e) => {
                    set.add_level(e.epoll_fd(), level)?;
                    set.add_level(e.ring.notify_fd()?.as_raw_fd(), level)?;
                }
                Backend::Epoll(e) => set.add_level(e.epfd.as_raw_fd(), level)?,
            }
            if !matches!(self.backend, Backend::Epoll(_)) {
                // The epoll backend has the wake eventfd in its own set already.
                set.add_level(self.user.wake_fd.as_raw_fd(), level)?;
            }
            self.readiness = Some(set);
        }
        Ok(self.readiness.as_ref().expect("readiness").as_fd())
    }

    /// Collects ready events into `out` without sleeping (after the readiness descriptor
    /// fired, or at any time): as `wait` with a zero timeout (level-triggered fds are
    /// re-checked, re-arms submitted), then clears the descriptor, looking again if events
    /// came in meanwhile, and counts the loop as asleep so posters write the wake eventfd.
    /// When `out` fills up with events left over, the descriptor is left readable. Returns
    /// how many events were written.
    pub fn on_ready(&mut self, out: &mut [Event]) -> io::Result<usize> {
        self.readiness_fd()?;
        let mut n = 0;
        for _ in 0..4 {
            if n == out.len() {
                break;
            }
            n += self.wait(&mut out[n..], Some(Duration::ZERO))?;
            let _ = crate::sys::epoll::eventfd_read(self.user.wake_fd.as_raw_fd());
            let more = match &mut self.backend {
                Backend::Uring(u) => {
                    u.ring.clear_notify();
                    u.ring.has_work()
                }
                Backend::Epwait(e) => {
                    e.ring.clear_notify();
                    e.ring.has_work()
                }
                Backend::Epoll(_) => false,
            };
            if !more && self.user.ring.prepare_sleep() {
                return Ok(n);
            }
        }
        // Out of room with work left (or still busy after four rounds): stay readable.
        self.user.ring.end_sleep();
        crate::sys::epoll::eventfd_write(self.user.wake_fd.as_raw_fd(), 1)?;
        Ok(n)
    }

    /// User-posted events handed out so far (a caller that needs to tell them from fd events
    /// in one `wait`'s output: fd events come first, then this many new user-posted ones).
    pub fn user_events(&self) -> u64 {
        self.user_harvested
    }

    /// Counters: events, syscalls, wait entries, CQEs, re-arms.
    pub fn stats(&self) -> EventStats {
        let mut s = match &self.backend {
            Backend::Uring(u) => u.stats(),
            Backend::Epwait(e) => e.stats(),
            Backend::Epoll(e) => e.stats(),
        };
        s.events = self.harvested;
        s.user_events = self.user_harvested;
        s.poster_wakes = self.user.wakes.load(Ordering::Relaxed);
        s
    }

    /// The common [`Counters`]: `ops` = events, `syscalls`, `notifications` = CQEs.
    pub fn counters(&self) -> Counters {
        let s = self.stats();
        Counters {
            ops: s.events,
            syscalls: s.syscalls,
            notifications: s.cqes,
            ..Counters::default()
        }
    }
}

impl Report for EventRing {
    type Path = EventPath;
    fn path(&self) -> EventPath {
        EventRing::path(self)
    }
    fn counters(&self) -> Counters {
        EventRing::counters(self)
    }
    fn fallbacks(&self) -> &[Fallback] {
        EventRing::fallbacks(self)
    }
}

//! Epoll instances served by an event ring, the fd tables, and the fallback to the real epoll.
//!
//! Every instance keeps the real epoll fd the program was given (so the number is real, `fcntl`
//! works on it, and a fallback has somewhere to go). While in ring mode its interest list lives
//! in a [`zcio::event::EventRing`]; [`to_real`] replays it into the real epoll fd and drops the
//! ring, after which every call goes to libc.
//!
//! Ring mode serves only the thread that created the instance, in the process that created it
//! (the ring is created with `SINGLE_ISSUER`): a call from another thread or a forked child
//! converts the instance first. A thread blocked in a ring wait holds the instance lock; a
//! second thread that needs the lock posts a user event to the ring to wake it.
//!
//! A registered fd closed where its poll cannot be cancelled at once (a signal handler that
//! interrupted the shim, another thread, a busy lock, a forked child) is closed anyway and
//! marked in a lock-free pending bitmap; the owner deletes the registration at its next call.
//! The shim's own descriptors (ring fd, eventfd) sit above a high floor, close-on-exec, and are
//! flagged so the program's calls on them fail with `EBADF`.

use crate::real;
use crate::report::{bump, log, STATS};
use std::cell::{Cell, UnsafeCell};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};
use zcio::event::choice::{Chooser, Costs, WaitMode, WaitObs};
use zcio::event::{CtlError, Event, EventConfig, EventRing, Interest, Poster, Prefer, WaitChoice};

/// Fds tracked in [`FDS`]; an instance or registration beyond it uses the real epoll.
pub const MAXFD: usize = 1 << 18;
/// [`FDS`] bit: the fd is a shim epoll instance.
const F_EPOLL: u32 = 1 << 31;
/// [`FDS`] bit: the fd is one of the shim's own (an event ring's io_uring fd or eventfd):
/// the program's `close`/`dup2`/`dup`/`fcntl` on it fail with `EBADF`.
const F_PRIVATE: u32 = 1 << 30;
/// [`FDS`] bit: the fd is a kernel-mode instance handed to the real epoll by the per-instance
/// choice (its waits cost more on the ring than in `epoll_wait`): every wait on it goes to libc
/// at once, without the instance table, the lock or the fork check.
const F_HANDED: u32 = 1 << 29;
/// [`FDS`] mask: in how many ring-mode instances the fd is registered.
const F_REGS: u32 = 0xffff;

/// Per-fd flags, read without locks by `close`, `dup2`, `poll`.
static FDS: [AtomicU32; MAXFD] = [const { AtomicU32::new(0) }; MAXFD];
/// Incremented in the child after `fork`.
pub static FORK_GEN: AtomicU64 = AtomicU64::new(0);
/// The process id, refreshed in the child after `fork`: a `vfork` child (which shares the
/// parent's memory but not its fd table, and runs no atfork handler) sees a different
/// `getpid()` and must leave the parent's bookkeeping alone.
pub static PID: AtomicU64 = AtomicU64::new(0);
/// Registered fds closed where the shim could not cancel their polls at once (a signal
/// handler that interrupted the shim, another thread, a forked child, a busy lock): the
/// number is closed, the owner thread deletes the registration at its next call.
static PENDING: [AtomicU64; MAXFD / 64] = [const { AtomicU64::new(0) }; MAXFD / 64];
/// Bits set in [`PENDING`] (lets every call skip the scan when zero).
static PENDING_N: AtomicU64 = AtomicU64::new(0);
/// Waits passed straight to the real epoll on handed instances, one counter per epoll fd number
/// (the last one shared by every number above), each on its own cache line: the instances of
/// different threads (memcached's workers) never write the same line.
static HANDED_WAITS: [Padded; HANDED_SLOTS] = [const { Padded(AtomicU64::new(0)) }; HANDED_SLOTS];
const HANDED_SLOTS: usize = 4096;
#[repr(align(64))]
struct Padded(AtomicU64);
/// The handed instances, as `fd<N>:<events per wait>ev/wait` (for the stats line).
static HANDED_LIST: Mutex<String> = Mutex::new(String::new());
/// Ring-mode instances alive (lets `poll`/`select` skip their scan when zero).
pub static RING_LIVE: AtomicU64 = AtomicU64::new(0);
/// The process that last logged "served by the event ring" (once per process).
static LOGGED_PID: AtomicU64 = AtomicU64::new(0);
static NEXT_TID: AtomicU64 = AtomicU64::new(1);
/// Token of the user event that wakes a ring wait so another thread can take the lock.
const WAKE: u64 = u64::MAX;
/// Poll ring: token of the ring's poll on the program's own epoll fd. In ring mode that epoll
/// holds no registration of the shim's, so it becomes readable only through registrations
/// made behind the shim's back (libuv's `IORING_OP_EPOLL_CTL` on an io_uring of its own, a
/// raw `epoll_ctl` system call): the instance then converts to the real epoll, which reports
/// them. (Fd tokens are fd numbers, below `MAXFD`.)
const BEHIND: u64 = u64::MAX - 1;

thread_local! {
    static TID: Cell<u64> = const { Cell::new(0) };
}

fn tid() -> u64 {
    TID.with(|t| {
        if t.get() == 0 {
            t.set(NEXT_TID.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
    })
}

fn fd_slot(fd: libc::c_int) -> Option<&'static AtomicU32> {
    usize::try_from(fd).ok().and_then(|i| FDS.get(i))
}

/// Whether `fd` is a shim epoll instance.
pub fn is_instance(fd: libc::c_int) -> bool {
    fd_slot(fd).is_some_and(|s| s.load(Ordering::Relaxed) & F_EPOLL != 0)
}

/// Whether `fd` is registered in a ring-mode instance.
pub fn is_registered(fd: libc::c_int) -> bool {
    fd_slot(fd).is_some_and(|s| s.load(Ordering::Relaxed) & F_REGS != 0)
}

/// Whether `fd` is an instance handed to the real epoll (its waits go straight to libc).
pub fn is_handed(fd: libc::c_int) -> bool {
    fd_slot(fd).is_some_and(|s| s.load(Ordering::Relaxed) & F_HANDED != 0)
}

/// Counts a wait on handed instance `epfd` (one relaxed add on the instance's own line).
pub fn count_handed_wait(epfd: libc::c_int) {
    let i = (epfd.max(0) as usize).min(HANDED_SLOTS - 1);
    HANDED_WAITS[i].0.fetch_add(1, Ordering::Relaxed);
}

/// Waits passed straight to the real epoll on handed instances (for the stats line).
pub fn handed_waits() -> u64 {
    HANDED_WAITS
        .iter()
        .map(|c| c.0.load(Ordering::Relaxed))
        .sum()
}

/// The handed instances with their events per wait on the ring, `-` when none.
pub fn handed_list() -> String {
    let l = HANDED_LIST
        .try_lock()
        .map(|l| l.clone())
        .unwrap_or_default();
    if l.is_empty() {
        "-".into()
    } else {
        l
    }
}

/// Whether `fd` is one of the shim's own descriptors.
pub fn is_private(fd: libc::c_int) -> bool {
    fd_slot(fd).is_some_and(|s| s.load(Ordering::Relaxed) & F_PRIVATE != 0)
}

/// All of `fd`'s flags (0: the shim has nothing to do with it).
pub fn flags(fd: libc::c_int) -> u32 {
    fd_slot(fd).map_or(0, |s| s.load(Ordering::Relaxed))
}

/// Marks a descriptor the event ring created for itself (called by zcio when it moves one
/// above the private floor).
pub fn mark_private(fd: libc::c_int) {
    if let Some(s) = fd_slot(fd) {
        s.fetch_or(F_PRIVATE, Ordering::Relaxed);
    }
}

/// Clears the private mark (the shim closes its own descriptor).
pub fn clear_private(fd: libc::c_int) {
    if let Some(s) = fd_slot(fd) {
        s.fetch_and(!F_PRIVATE, Ordering::Relaxed);
    }
}

/// Whether this is the process the shim's state belongs to (false in a `vfork` child).
pub fn same_process() -> bool {
    // SAFETY: getpid has no preconditions.
    PID.load(Ordering::Relaxed) == unsafe { libc::getpid() } as u64
}

/// Records that registered `fd` was closed (or replaced) without its polls cancelled.
/// Async-signal-safe: atomics only.
pub fn mark_pending(fd: libc::c_int) {
    let Ok(i) = usize::try_from(fd) else { return };
    if i >= MAXFD {
        return;
    }
    let bit = 1u64 << (i % 64);
    if PENDING[i / 64].fetch_or(bit, Ordering::AcqRel) & bit == 0 {
        PENDING_N.fetch_add(1, Ordering::AcqRel);
    }
}

fn is_pending(i: usize) -> bool {
    PENDING[i / 64].load(Ordering::Acquire) & (1u64 << (i % 64)) != 0
}

/// One registration of `fd` ended: the fd's count goes down, and its pending mark goes with
/// the last one.
fn unreg(i: usize) {
    let left = FDS[i].fetch_sub(1, Ordering::AcqRel).wrapping_sub(1) & F_REGS;
    if left == 0 {
        let bit = 1u64 << (i % 64);
        if PENDING[i / 64].fetch_and(!bit, Ordering::AcqRel) & bit != 0 {
            PENDING_N.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Deletes this instance's registrations of fds closed behind its back (see [`PENDING`]);
/// `ring`: cancel their polls (false in a forked child, whose ring is the parent's).
fn drain_pending(st: &mut State, ring: bool) {
    if PENDING_N.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut cancelled = false;
    for i in 0..st.regs.len() {
        if st.regs[i].is_none() || !is_pending(i) {
            continue;
        }
        st.regs[i] = None;
        if ring {
            if let Some(r) = st.ring.as_mut() {
                let _ = r.delete(i as libc::c_int);
                cancelled = true;
            }
        }
        bump(&STATS.deferred_closes, 1);
        unreg(i);
    }
    if cancelled {
        if let Some(r) = st.ring.as_mut() {
            let _ = r.flush();
        }
    }
}

/// The instance table: a spin lock (held for a few instructions; taken around `fork` so the
/// child never inherits it locked) over `epfd → instance`.
struct Table {
    lock: AtomicBool,
    slots: UnsafeCell<Vec<Option<Arc<Instance>>>>,
}

// SAFETY: `slots` is only touched with `lock` held (see `with`).
unsafe impl Sync for Table {}

static TABLE: Table = Table {
    lock: AtomicBool::new(false),
    slots: UnsafeCell::new(Vec::new()),
};

/// Takes the table lock (atfork prepare).
pub fn table_lock() {
    while TABLE
        .lock
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::thread::yield_now();
    }
}

/// Takes the table lock unless it stays busy (a signal handler must not spin on a lock the
/// code it interrupted holds).
fn table_try_lock() -> bool {
    for _ in 0..10_000 {
        if TABLE
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return true;
        }
        std::hint::spin_loop();
    }
    false
}

/// Releases the table lock (atfork parent and child).
pub fn table_unlock() {
    TABLE.lock.store(false, Ordering::Release);
}

fn with_table<R>(f: impl FnOnce(&mut Vec<Option<Arc<Instance>>>) -> R) -> R {
    table_lock();
    // SAFETY: the lock is held, so this is the only reference to the slots.
    let r = f(unsafe { &mut *TABLE.slots.get() });
    table_unlock();
    r
}

/// The instance behind `epfd`, if the shim created it.
pub fn lookup(epfd: libc::c_int) -> Option<Arc<Instance>> {
    if !is_instance(epfd) {
        return None;
    }
    with_table(|t| t.get(epfd as usize).cloned().flatten())
}

fn all_instances() -> Vec<Arc<Instance>> {
    with_table(|t| t.iter().flatten().cloned().collect())
}

#[derive(Debug, Clone, Copy)]
struct Reg {
    events: u32,
    data: u64,
    /// ONESHOT fired and not re-armed.
    disabled: bool,
}

/// What the lock protects.
pub struct State {
    ring: Option<EventRing>,
    /// A ring whose instance fell back, kept (with no polls) until the epoll fd is closed:
    /// dropping a ring makes the kernel queue exit work on this thread as a signal-like
    /// notification, which would turn the program's next `epoll_wait` into a spurious EINTR.
    dormant: Option<EventRing>,
    regs: Vec<Option<Reg>>,
    buf: Vec<Event>,
    /// Kernel mode (`ZCIO_EPOLL_WAIT_MODE=auto`): whether the owner's ring waits cost more than
    /// `epoll_wait` would for this instance's pattern; a switch hands the instance to the real
    /// epoll (`hand_over`). `None`: the wait mode is pinned, or the poll ring.
    choice: Option<Chooser>,
    /// A hand-over decided while a request was armed (a wait that returned without its
    /// completion): carried out by the next wait that finds the ring idle.
    handover: Option<String>,
    /// The owner's ring waits and the fd events they returned (events per wait in the log).
    waits: u64,
    events: u64,
}

/// The per-instance choice for a kernel-mode instance: the ring's `EPOLL_WAIT` against the
/// real `epoll_wait`, priced with the costs measured for a ring with DEFER_TASKRUN. The real
/// epoll's sleep needs no poster (a handed instance sleeps in `epoll_wait` itself, outside the
/// lock), so the observations never credit the ring for one.
fn kernel_choice(kernel: bool) -> Option<Chooser> {
    (kernel && crate::report::WAIT_MODE.load(Ordering::Relaxed) == 0)
        .then(|| Chooser::new(WaitMode::Ring, Costs::measured(true)))
}

/// One epoll instance.
pub struct Instance {
    epfd: libc::c_int,
    /// Kernel mode: the ring collects the program's own epoll fd with `EPOLL_WAIT`; the
    /// interest list is the kernel's (epoll_ctl passes through, so registrations made behind
    /// the shim's back — libuv's `IORING_OP_EPOLL_CTL` — and closes it never sees are
    /// the kernel's business, exactly as without the shim). Only the owner thread's waits go
    /// through the ring; nothing ever converts.
    kernel: bool,
    /// The thread whose waits go through the ring. Poll ring: the creator. Kernel mode: the
    /// first thread that waits (0 until then) — libevent programs (memcached) create each
    /// worker's epoll instance on the main thread and wait on it only from the worker.
    owner: AtomicU64,
    /// The thread that created the instance (and its first ring: SINGLE_ISSUER binds a ring
    /// to the task that created it).
    creator: u64,
    fork_gen: u64,
    ring_mode: AtomicBool,
    contenders: AtomicU32,
    /// The state, while the owner sleeps in a ring wait with the lock held (null otherwise).
    /// A child forked meanwhile has no thread that would ever release the lock; it reads the
    /// interest list through this pointer instead (the wait never touches `regs`).
    waiting: AtomicPtr<State>,
    /// Wakes the owner's ring wait; set once the ring that waits is known (kernel mode: when
    /// the owner claims the instance).
    poster: OnceLock<Poster>,
    state: Mutex<State>,
}

// SAFETY: the ring inside `state` is only used with the mutex held, and only by the owner
// thread while in ring mode (other threads convert the instance first, which drops the ring
// under the lock); an io_uring instance may be dropped (closed and unmapped) from any thread.
unsafe impl Send for State {}

/// Creates the instance for a new real epoll fd; `None` when the fd is out of range or the
/// ring cannot be set up (then the program simply uses its real epoll fd; logged).
pub fn create(epfd: libc::c_int) -> Option<()> {
    let slot = fd_slot(epfd)?;
    // An entry already at this number is stale: the kernel reuses a number only after a close,
    // and the shim sees every close but a raw one (libuv closes its epoll fd with
    // `syscall(SYS_close)`). It goes now, whatever happens to the new instance: a new epoll fd
    // that gets no ring must not be taken for the old instance (its ring, owner and interest
    // list), which would serve the new loop the old loop's registrations.
    if is_instance(epfd) {
        log(format_args!(
            "epoll fd {epfd}: the instance that had this number was closed behind the shim's \
             back (a raw close system call); its ring is retired"
        ));
        remove(epfd);
    }
    let mut ring = match new_ring(epfd) {
        Ok(r) => r,
        Err(e) => {
            bump(&STATS.fallbacks, 1);
            log(format_args!(
                "epoll fd {epfd}: event ring unavailable ({e}); using the real epoll"
            ));
            return None;
        }
    };
    let kernel = ring.epoll_fd() == Some(epfd);
    if !kernel {
        if let Err(e) = ring.add(epfd, Interest::IN, BEHIND) {
            // Without the watch a registration made behind the shim's back would never be
            // reported: the real epoll serves this instance instead.
            bump(&STATS.fallbacks, 1);
            log(format_args!(
                "epoll fd {epfd}: cannot watch the epoll fd for registrations made behind the \
                 shim's back ({e}); using the real epoll"
            ));
            return None;
        }
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u64;
    if LOGGED_PID.swap(pid, Ordering::Relaxed) != pid {
        log(format_args!(
            "epoll fd {epfd} served by the event ring ({})",
            ring.path()
        ));
    }
    let poster = OnceLock::new();
    if !kernel {
        let _ = poster.set(ring.poster());
    }
    let inst = Arc::new(Instance {
        epfd,
        kernel,
        owner: AtomicU64::new(if kernel { 0 } else { tid() }),
        creator: tid(),
        fork_gen: FORK_GEN.load(Ordering::Relaxed),
        ring_mode: AtomicBool::new(true),
        contenders: AtomicU32::new(0),
        waiting: AtomicPtr::new(std::ptr::null_mut()),
        poster,
        state: Mutex::new(State {
            ring: Some(ring),
            dormant: None,
            regs: Vec::new(),
            buf: Vec::new(),
            choice: kernel_choice(kernel),
            handover: None,
            waits: 0,
            events: 0,
        }),
    });
    bump(&STATS.ring_instances, 1);
    RING_LIVE.fetch_add(1, Ordering::Relaxed);
    let old = with_table(|t| {
        if t.len() <= epfd as usize {
            t.resize(epfd as usize + 1, None);
        }
        slot.fetch_or(F_EPOLL, Ordering::Relaxed);
        t[epfd as usize].replace(inst)
    });
    // A stale entry that appeared meanwhile (another thread's raw close and create) goes too.
    if let Some(old) = old {
        retire(&old);
    }
    Some(())
}

/// The ring for a new instance: `EPOLL_WAIT` over the program's epoll fd where the kernel has
/// it (unless `ZCIO_EPOLL_BACKEND=poll`), else the poll ring (the reason is logged).
fn new_ring(epfd: libc::c_int) -> std::io::Result<EventRing> {
    let defer = crate::report::DEFER_TASKRUN.load(Ordering::Relaxed);
    if !crate::report::POLL_RING.load(Ordering::Relaxed) {
        let mut cfg = EventConfig {
            prefer: Prefer::EpollWait,
            epoll_fd: Some(epfd),
            ..EventConfig::default()
        };
        // Always DEFER_TASKRUN here: the armed EPOLL_WAIT then only ever runs inside this
        // thread's own ring waits, never on a syscall return of code that uses the real epoll.
        cfg.ring.defer_taskrun = true;
        // `auto`: the shim chooses per instance between this ring's EPOLL_WAIT and the real
        // epoll (`kernel_choice`), so the ring itself stays on its ring wait.
        cfg.wait_choice = match crate::report::WAIT_MODE.load(Ordering::Relaxed) {
            2 => WaitChoice::Plain,
            3 => WaitChoice::Alternate,
            _ => WaitChoice::Ring,
        };
        match EventRing::with_config(&cfg) {
            Ok(r) => return Ok(r),
            // The kernel (before 6.15) or the process lacks it: the poll ring is the next
            // best.
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => log(format_args!(
                "epoll fd {epfd}: no EPOLL_WAIT ring ({e}); trying the poll ring"
            )),
            // Out of ring memory or descriptors (rings of dropped loops are freed
            // asynchronously): the real epoll. The poll ring would keep the interest list
            // to itself, and registrations made behind the shim's back (libuv's
            // IORING_OP_EPOLL_CTL) would never be reported: its loop hung in libuv's
            // tty_pty_partial under load.
            Err(e) => return Err(e),
        }
    }
    let mut cfg = EventConfig {
        prefer: Prefer::Uring,
        ..EventConfig::default()
    };
    cfg.ring.defer_taskrun = defer;
    EventRing::with_config(&cfg)
}

/// Forgets that `epfd` is an instance without touching the instance (lock-free, for a signal
/// handler that closes it): its entry stays in the table, unreachable, until the number is
/// reused by a new instance (which retires it) or the process ends.
pub fn forget_instance_fd(epfd: libc::c_int) {
    if let Some(slot) = fd_slot(epfd) {
        slot.fetch_and(!(F_EPOLL | F_HANDED), Ordering::Relaxed);
    }
}

/// Removes `epfd`'s instance (on close or when dup2 replaces it); the real fd is the caller's.
pub fn remove(epfd: libc::c_int) {
    let Some(slot) = fd_slot(epfd) else { return };
    let inst = with_table(|t| {
        slot.fetch_and(!(F_EPOLL | F_HANDED), Ordering::Relaxed);
        t.get_mut(epfd as usize).and_then(Option::take)
    });
    if let Some(inst) = inst {
        retire(&inst);
    }
}

/// Whether `inst` was created before a `fork` this process came out of.
fn forked(inst: &Instance) -> bool {
    inst.fork_gen != FORK_GEN.load(Ordering::Relaxed)
}

/// Locks `inst` from any thread; in a forked child only if it is free (a thread of the parent
/// that held it does not exist here and would never release it): `None` then.
fn lock_checked(inst: &Instance) -> Option<MutexGuard<'_, State>> {
    if forked(inst) {
        return match inst.state.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => {
                let p = inst.waiting.load(Ordering::Acquire);
                if inst.ring_mode.load(Ordering::Relaxed) && !p.is_null() {
                    // SAFETY: the parent's owner thread was inside the ring wait (between the
                    // two stores in `wait`), which leaves `regs` alone; that thread does not
                    // exist in this child and nothing else here reaches the state while the
                    // lock stays held, so this is the only reference.
                    let st = unsafe { &mut *p };
                    to_real_in(
                        inst,
                        st,
                        "used in a forked child (forked during a wait)",
                        true,
                    );
                } else if inst.ring_mode.swap(false, Ordering::Relaxed) {
                    log(format_args!(
                        "epoll fd {}: forked while another thread used it; registrations lost",
                        inst.epfd
                    ));
                }
                None
            }
        };
    }
    lock_any(inst)
}

/// Drops an instance's ring and its registrations' fd counts, without replaying them.
fn retire(inst: &Instance) {
    if let Some(mut st) = lock_checked(inst) {
        if let Some(ring) = st.ring.take() {
            forget_regs(&mut st);
            finish_ring(inst, ring);
        }
        drop(st.dormant.take());
    } else {
        inst.ring_mode.store(false, Ordering::Relaxed);
    }
}

fn forget_regs(st: &mut State) {
    for (fd, r) in st.regs.iter_mut().enumerate() {
        if r.take().is_some() {
            unreg(fd);
        }
    }
}

fn finish_ring(inst: &Instance, ring: EventRing) {
    inst.ring_mode.store(false, Ordering::Relaxed);
    RING_LIVE.fetch_sub(1, Ordering::Relaxed);
    bump(&STATS.ring_enters, ring.stats().wait_entries);
    drop(ring);
}

/// Like [`finish_ring`], but cancels the polls now and keeps the ring until the instance goes.
fn park_ring(inst: &Instance, st: &mut State, mut ring: EventRing) {
    for (fd, r) in st.regs.iter().enumerate() {
        if r.is_some() && !is_pending(fd) {
            let _ = ring.delete(fd as libc::c_int);
        }
    }
    if !inst.kernel {
        // The watch on the program's epoll fd (it holds a reference to that file).
        let _ = ring.delete(inst.epfd);
    }
    // A zero-timeout wait submits the cancellations and runs their completions, so the
    // kernel drops its file references now.
    if !inst.kernel {
        // (Kernel mode: a wait would collect the program's events and lose them.)
        let mut scratch = [Event::default(); 16];
        let _ = ring.wait(&mut scratch, Some(Duration::ZERO));
    }
    inst.ring_mode.store(false, Ordering::Relaxed);
    RING_LIVE.fetch_sub(1, Ordering::Relaxed);
    bump(&STATS.ring_enters, ring.stats().wait_entries);
    st.dormant = Some(ring);
}

/// Enter counts of the rings still alive (for the exit stats).
pub fn live_enters() -> u64 {
    all_instances()
        .iter()
        .filter_map(|i| i.state.try_lock().ok())
        .filter_map(|s| s.ring.as_ref().map(|r| r.stats().wait_entries))
        .sum()
}

/// Locks from any thread: wakes a ring wait that holds the lock.
fn lock_any(inst: &Instance) -> Option<MutexGuard<'_, State>> {
    inst.contenders.fetch_add(1, Ordering::AcqRel);
    let g = match inst.state.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => {
            // The holder may be asleep in the ring: wake it (a full ring wakes it anyway).
            if let Some(p) = inst.poster.get() {
                let _ = p.post(WAKE, 0);
            }
            Some(inst.state.lock().unwrap_or_else(|p| p.into_inner()))
        }
    };
    inst.contenders.fetch_sub(1, Ordering::AcqRel);
    g
}

/// Replays the interest list into the real epoll fd and retires the ring (logged once).
/// `forked`: this is a child process; the ring is the parent's and must not be touched.
fn to_real(inst: &Instance, st: &mut State, why: &str) {
    to_real_in(inst, st, why, false)
}

fn to_real_in(inst: &Instance, st: &mut State, why: &str, forked: bool) {
    if !forked {
        // Closed numbers must not be replayed (the number may be another file now).
        drain_pending(st, true);
    }
    let Some(ring) = st.ring.take() else { return };
    let mut replayed = 0;
    for (fd, r) in st.regs.iter().enumerate() {
        let Some(r) = r else { continue };
        if is_pending(fd) {
            continue;
        }
        // A fired ONESHOT stays disabled: no readiness bits (epoll adds ERR|HUP itself).
        let events = if r.disabled {
            libc::EPOLLONESHOT as u32
        } else {
            r.events
        };
        let mut ev = libc::epoll_event {
            events,
            u64: r.data,
        };
        let fd = fd as libc::c_int;
        if real::epoll_ctl(inst.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) != 0
            && real::errno() == libc::EEXIST
        {
            // A forked child replaying into the epoll it shares with its parent.
            real::epoll_ctl(inst.epfd, libc::EPOLL_CTL_MOD, fd, &mut ev);
        }
        replayed += 1;
    }
    if forked {
        // The ring is the parent's: nothing is submitted, and it is not even dropped (a
        // parent thread may have been inside it when the process forked); the child's copy of
        // its memory and fds go at exit or exec (the fds are close-on-exec).
        inst.ring_mode.store(false, Ordering::Relaxed);
        RING_LIVE.fetch_sub(1, Ordering::Relaxed);
        std::mem::forget(ring);
    } else {
        park_ring(inst, st, ring);
    }
    forget_regs(st);
    if inst.kernel {
        // Kernel mode: the interest list already is the real epoll; only the ring goes.
        log(format_args!(
            "epoll fd {}: ring retired ({why}); the real epoll keeps serving",
            inst.epfd
        ));
        return;
    }
    bump(&STATS.fallbacks, 1);
    log(format_args!(
        "epoll fd {}: falling back to the real epoll ({why}); {replayed} registrations replayed",
        inst.epfd
    ));
}

/// Converts `epfd`'s instance to the real epoll (nesting, poll/select on it, dup).
pub fn convert(epfd: libc::c_int, why: &str) {
    if let Some(inst) = lookup(epfd) {
        // Kernel mode: the epoll fd already is the instance (nesting, poll, dup, other
        // threads and forked children see exactly what the ring sees).
        if inst.ring_mode.load(Ordering::Relaxed) && !inst.kernel {
            if !still_epoll(epfd) {
                // The number now names another file: the instance's epoll fd was closed behind
                // the shim's back (libuv's raw close) and the number reused (libuv's signal
                // pipe, an eventfd): nothing to convert, the stale instance goes.
                log(format_args!(
                    "epoll fd {epfd}: closed behind the shim's back (a raw close system call; \
                     the number is now another file); its ring is retired"
                ));
                remove(epfd);
                return;
            }
            let f = forked(&inst);
            if let Some(mut st) = lock_checked(&inst) {
                let why = if f { "used in a forked child" } else { why };
                to_real_in(&inst, &mut st, why, f);
            }
        }
    }
}

/// Whether `fd` still names an epoll instance (`/proc/self/fd` shows `anon_inode:[eventpoll]`);
/// true when that cannot be told (no `/proc`). Used only on the rare conversion paths.
fn still_epoll(fd: libc::c_int) -> bool {
    match std::fs::read_link(format!("/proc/self/fd/{fd}")) {
        Ok(target) => target.as_os_str() == "anon_inode:[eventpoll]",
        Err(e) => e.raw_os_error() != Some(libc::ENOENT),
    }
}

/// Access to an instance for one call: the ring (owner thread, ring mode) or the real epoll.
enum Access<'a> {
    Ring(MutexGuard<'a, State>),
    Real,
}

fn access(inst: &Instance) -> Access<'_> {
    if !inst.ring_mode.load(Ordering::Relaxed) {
        return Access::Real;
    }
    if inst.kernel {
        if forked(inst) || !same_process() {
            // The interest list is the kernel's: other processes use it directly. (A vfork
            // child shares the caller's thread-local storage, so only the process id tells it
            // apart: one `getpid` per wait, ~450 ns on this VM. The ring refuses the child
            // (EEXIST: SINGLE_ISSUER), but by then the child has touched the parent's ring
            // state; `vfork-wait` in tests/c/epoll_fds.c.)
            return Access::Real;
        }
        let me = tid();
        let owner = inst.owner.load(Ordering::Acquire);
        if owner != me && (owner != 0 || !claim(inst, me)) {
            // Another thread's: it uses the kernel's interest list directly.
            return Access::Real;
        }
    }
    if forked(inst) {
        // A forked child: the ring belongs to the parent. Replay into the (shared) real epoll.
        if let Some(mut st) = lock_checked(inst) {
            to_real_in(inst, &mut st, "used in a forked child", true);
        }
        return Access::Real;
    }
    if tid() != inst.owner.load(Ordering::Relaxed) {
        if let Some(mut st) = lock_any(inst) {
            to_real(inst, &mut st, "used from a second thread");
        }
        return Access::Real;
    }
    while inst.contenders.load(Ordering::Acquire) > 0 {
        std::thread::yield_now();
    }
    let mut st = inst.state.lock().unwrap_or_else(|p| p.into_inner());
    if st.ring.is_some() {
        drain_pending(&mut st, true);
        Access::Ring(st)
    } else {
        Access::Real
    }
}

fn ctl_errno(e: &CtlError) -> Option<libc::c_int> {
    match e {
        CtlError::Io(_) => None,
        e => Some(e.errno()),
    }
}

/// `epoll_ctl` on a shim instance.
pub fn ctl(
    inst: &Instance,
    op: libc::c_int,
    fd: libc::c_int,
    ev: *mut libc::epoll_event,
) -> libc::c_int {
    let known = matches!(
        op,
        libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD | libc::EPOLL_CTL_DEL
    );
    if !known || (op != libc::EPOLL_CTL_DEL && ev.is_null()) || fd < 0 || fd == inst.epfd {
        // The kernel's answer (EINVAL, EFAULT, EBADF) does not depend on the interest list.
        return real::epoll_ctl(inst.epfd, op, fd, ev);
    }
    if fd as usize >= MAXFD {
        convert(inst.epfd, "fd beyond the shim's table");
        return real::epoll_ctl(inst.epfd, op, fd, ev);
    }
    if is_instance(fd) && op != libc::EPOLL_CTL_DEL {
        // The inner instance must be a real epoll for its readiness to be seen.
        convert(fd, "nested in another epoll set");
    }
    if inst.kernel {
        // The interest list is the program's epoll itself: the kernel answers.
        if !is_handed(inst.epfd) {
            bump(&STATS.ring_ctls, 1);
        }
        return real::epoll_ctl(inst.epfd, op, fd, ev);
    }
    let mut st = match access(inst) {
        Access::Real => return real::epoll_ctl(inst.epfd, op, fd, ev),
        Access::Ring(st) => st,
    };
    let (events, data) = if ev.is_null() {
        (0, 0)
    } else {
        // SAFETY: `ev` is non-null and points to the caller's epoll_event (packed: read
        // unaligned copies of its fields).
        let e = unsafe { std::ptr::read_unaligned(ev) };
        (e.events & !(libc::EPOLLWAKEUP as u32), e.u64)
    };
    let st = &mut *st;
    let ring = st.ring.as_mut().expect("ring mode");
    let r = match op {
        libc::EPOLL_CTL_ADD => ring.add(fd, Interest(events), fd as u64),
        libc::EPOLL_CTL_MOD => ring.modify(fd, Interest(events), fd as u64),
        _ => ring.delete(fd),
    };
    match r {
        Ok(()) => {
            bump(&STATS.ring_ctls, 1);
            let i = fd as usize;
            if st.regs.len() <= i {
                st.regs.resize(i + 1, None);
            }
            let reg = Reg {
                events,
                data,
                disabled: false,
            };
            match op {
                libc::EPOLL_CTL_ADD => {
                    if st.regs[i].replace(reg).is_none() {
                        FDS[i].fetch_add(1, Ordering::AcqRel);
                    }
                }
                libc::EPOLL_CTL_MOD => st.regs[i] = Some(reg),
                _ => {
                    if st.regs[i].take().is_some() {
                        unreg(i);
                    }
                }
            }
            0
        }
        Err(e) => match ctl_errno(&e) {
            Some(errno) => {
                real::set_errno(errno);
                -1
            }
            None => {
                to_real(inst, st, &format!("epoll_ctl failed in the ring: {e}"));
                real::epoll_ctl(inst.epfd, op, fd, ev)
            }
        },
    }
}

/// The milliseconds left until `deadline` for a real epoll_wait (rounded up).
fn remaining_ms(deadline: Option<Instant>) -> libc::c_int {
    match deadline {
        None => -1,
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            let ms = left.as_nanos().div_ceil(1_000_000);
            ms.min(i32::MAX as u128) as libc::c_int
        }
    }
}

/// The timeout for a real `epoll_wait` standing in for a ring wait.
fn real_ms(timeout: Option<Duration>, deadline: Option<Instant>) -> libc::c_int {
    if timeout == Some(Duration::ZERO) {
        0
    } else {
        remaining_ms(deadline)
    }
}

/// The epoll_wait family on a shim instance (`sigmask` already dealt with by the caller).
pub fn wait(
    inst: &Instance,
    out: *mut libc::epoll_event,
    max: libc::c_int,
    timeout: Option<Duration>,
) -> libc::c_int {
    // The clock is read only when a timeout can expire (a vDSO call each, ~80 ns on this VM);
    // the first ring wait gets the caller's timeout as given.
    let deadline = timeout.filter(|t| !t.is_zero()).map(|t| Instant::now() + t);
    let mut first = true;
    loop {
        let mut guard = match access(inst) {
            Access::Real => {
                bump(&STATS.real_waits, 1);
                return real::epoll_wait(inst.epfd, out, max, real_ms(timeout, deadline));
            }
            Access::Ring(st) => st,
        };
        let st = &mut *guard;
        // epoll_wait returns up to `maxevents` (CPython's test_selectors asks ~10 000 at
        // once); the buffer grows to what the program asks, up to 128 Ki events.
        let want = (max as usize).min(1 << 17);
        if st.buf.len() < want {
            st.buf.resize(want, Event::default());
        }
        let left = match deadline {
            Some(d) if !first => Some(d.saturating_duration_since(Instant::now())),
            _ => timeout,
        };
        first = false;
        let ring_state: *mut State = st;
        let ring = st.ring.as_mut().expect("ring mode");
        let posted = ring.user_events();
        let mode = ring.wait_mode();
        inst.waiting.store(ring_state, Ordering::Release);
        let r = ring.wait(&mut st.buf[..want], left);
        inst.waiting.store(std::ptr::null_mut(), Ordering::Release);
        if ring.wait_mode() != mode {
            // The per-workload choice switched (ring wait <-> epoll_wait on this instance).
            bump(&STATS.mode_switches, 1);
            if let Some(d) = ring.decisions().last() {
                log(format_args!("epoll fd {}: {d}", inst.epfd));
            }
        }
        // Fd events come first, then user-posted ones (wake-ups from contending threads).
        let fd_events = |ring: &EventRing, n: usize| n - (ring.user_events() - posted) as usize;
        let n = match r {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                real::set_errno(libc::EINTR);
                return -1;
            }
            Err(e) => {
                to_real(inst, st, &format!("waiting on the ring failed: {e}"));
                continue;
            }
        };
        let mut k = 0usize;
        let mut woken = false;
        if inst.kernel {
            let m = fd_events(st.ring.as_ref().expect("ring mode"), n);
            woken = m < n;
            for ev in &st.buf[..m] {
                // Kernel mode: the epoll data is the program's own, passed through.
                let e = libc::epoll_event {
                    events: ev.events,
                    u64: ev.token,
                };
                // SAFETY: k < m ≤ max: the caller's array holds `max` entries.
                unsafe { out.add(k).write_unaligned(e) };
                k += 1;
            }
        }
        let mut behind = false;
        for ev in st.buf[..n].iter().filter(|_| !inst.kernel) {
            if ev.token == WAKE {
                woken = true;
                continue;
            }
            if ev.token == BEHIND {
                behind = true;
                continue;
            }
            let fd = ev.token as usize;
            let Some(Some(reg)) = st.regs.get_mut(fd) else {
                continue;
            };
            if reg.disabled {
                continue;
            }
            if reg.events & libc::EPOLLONESHOT as u32 != 0 {
                reg.disabled = true;
            }
            let e = libc::epoll_event {
                events: ev.events,
                u64: reg.data,
            };
            // SAFETY: k < n ≤ max: the caller's array holds `max` entries.
            unsafe { out.add(k).write_unaligned(e) };
            k += 1;
        }
        bump(&STATS.ring_waits, 1);
        bump(&STATS.ring_events, k as u64);
        if inst.kernel && !woken {
            choose(inst, st, timeout == Some(Duration::ZERO), k);
        }
        if behind {
            // The program's epoll became readable: something registered there behind the
            // shim's back is ready. From now on the real epoll serves the instance (the ring's
            // registrations replayed into it); its events come with the next collection.
            to_real(
                inst,
                st,
                "a registration made behind the shim's back became ready (an io_uring \
                 IORING_OP_EPOLL_CTL or a raw epoll_ctl system call, as libuv makes)",
            );
            if k > 0 {
                return k as libc::c_int;
            }
            drop(guard);
            continue;
        }
        if k > 0 || (n == 0 && !woken) {
            return k as libc::c_int;
        }
        // Only a wake-up (or stale events): give the lock away and wait for the rest.
        drop(guard);
        if timeout == Some(Duration::ZERO) || deadline.is_some_and(|d| Instant::now() >= d) {
            return 0;
        }
    }
}

/// Kernel mode, after one of the owner's ring waits (`k` fd events; `zero`: a zero timeout):
/// feeds the per-instance choice, and hands the instance to the real epoll once it decides
/// and the ring holds nothing for its next wait (no request armed, no events left over).
fn choose(inst: &Instance, st: &mut State, zero: bool, k: usize) {
    st.waits += 1;
    st.events += k as u64;
    let Some(choice) = st.choice.as_mut() else {
        return;
    };
    if st.handover.is_none() {
        let obs = WaitObs {
            fd_events: k as u32,
            empty_poll: zero && k == 0,
            slept: !zero && k == 0,
            ..WaitObs::default()
        };
        if let Some(d) = choice.observe(obs) {
            st.handover = Some(d.reason);
        }
    }
    if st.handover.is_some() && st.ring.as_ref().is_some_and(|r| !r.wait_pending()) {
        let why = st.handover.take().unwrap_or_default();
        hand_over(inst, st, &why);
    }
}

/// Hands a kernel-mode instance to the real epoll: its epoll fd already is the interest list,
/// so nothing is replayed; the ring (holding nothing for a next wait) is parked until the epoll fd is
/// closed, and every later wait on the instance goes straight to libc ([`is_handed`]). One
/// way: on the kernels measured no pattern makes the ring wait cheaper than `epoll_wait`
/// (docs/design/capi-preload.md, "memcached under memcaslap").
fn hand_over(inst: &Instance, st: &mut State, why: &str) {
    let Some(ring) = st.ring.take() else { return };
    park_ring(inst, st, ring);
    st.choice = None;
    if let Some(slot) = fd_slot(inst.epfd) {
        slot.fetch_or(F_HANDED, Ordering::Release);
    }
    bump(&STATS.handed, 1);
    let per_wait = st.events as f64 / st.waits.max(1) as f64;
    if let Ok(mut l) = HANDED_LIST.lock() {
        if !l.is_empty() {
            l.push(',');
        }
        let _ = write!(l, "fd{}:{per_wait:.1}ev/wait", inst.epfd);
    }
    log(format_args!(
        "epoll fd {}: handed to the real epoll (fallback: a ring wait costs more than \
         epoll_wait for this instance's waits: {why}); {per_wait:.1} events per ring wait \
         over {} waits",
        inst.epfd, st.waits
    ));
}

/// Kernel mode: makes `me` the instance's owner when no thread has waited on it yet. A ring
/// made by another thread only takes its creator's submissions (SINGLE_ISSUER), so `me` gets
/// its own over the same epoll fd (nothing is armed in the creator's yet: a ring arms its
/// `EPOLL_WAIT` in its first wait). False when another thread won, or no ring could be made
/// (the instance then stays on the real epoll; logged).
fn claim(inst: &Instance, me: u64) -> bool {
    if inst
        .owner
        .compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return false;
    }
    let mut st = inst.state.lock().unwrap_or_else(|p| p.into_inner());
    if st.ring.is_none() {
        return false;
    }
    if me != inst.creator {
        match new_ring(inst.epfd) {
            Ok(r) if r.epoll_fd() == Some(inst.epfd) => {
                if let Some(old) = st.ring.replace(r) {
                    bump(&STATS.ring_enters, old.stats().wait_entries);
                }
            }
            Ok(_) | Err(_) => {
                if let Some(old) = st.ring.take() {
                    finish_ring(inst, old);
                }
                bump(&STATS.fallbacks, 1);
                log(format_args!(
                    "epoll fd {}: no event ring for the waiting thread; using the real epoll",
                    inst.epfd
                ));
                return false;
            }
        }
    }
    if let Some(r) = st.ring.as_ref() {
        let _ = inst.poster.set(r.poster());
    }
    true
}

/// Bookkeeping for `close(fd)` (or an fd replaced by `dup2`) of a registered fd, before the
/// number goes: an armed io_uring poll holds a reference to the file, so each ring-mode
/// instance must cancel its poll (and have the kernel run the cancellation) first, or the
/// socket stays open. Returns the result of the real close (`do_close`) or 0.
///
/// Takes no lock that can block and allocates nothing of its own (a signal handler may call
/// `close`): the instance table and each instance are only *tried*; where the poll cannot be
/// cancelled here (another thread owns the ring, the lock is busy, a forked child), the fd is
/// marked pending and the owner deletes the registration at its next call (woken with a
/// user event, so a blocked wait notices at once).
pub fn close_registered(fd: libc::c_int, do_close: bool) -> libc::c_int {
    let i = fd as usize;
    if !table_try_lock() {
        mark_pending(fd);
        return if do_close { real::close(fd) } else { 0 };
    }
    let me = tid();
    // SAFETY: the table lock is held; only shared references are taken, and only while held.
    let slots = unsafe { &*TABLE.slots.get() };
    for inst in slots.iter().flatten() {
        if !inst.ring_mode.load(Ordering::Relaxed) {
            continue;
        }
        if forked(inst) || inst.owner.load(Ordering::Relaxed) != me {
            // Not this thread's ring to submit to. Marked before the owner is woken (the
            // owner's next call drains the mark), while the fd's count is still above zero
            // (the last registration's end clears it; an instance handled above may already
            // have ended it).
            if is_registered(fd) {
                mark_pending(fd);
            }
            if let Some(p) = inst.poster.get().filter(|_| !forked(inst)) {
                let _ = p.post(WAKE, 0);
            }
            continue;
        }
        let mut st = match inst.state.try_lock() {
            Ok(st) => st,
            Err(_) => {
                if is_registered(fd) {
                    mark_pending(fd);
                }
                if let Some(p) = inst.poster.get() {
                    let _ = p.post(WAKE, 0);
                }
                continue;
            }
        };
        let st = &mut *st;
        if st.regs.get(i).map_or(true, Option::is_none) {
            continue;
        }
        st.regs[i] = None;
        bump(&STATS.ring_closes, 1);
        if let Some(ring) = st.ring.as_mut() {
            let _ = ring.delete(fd);
            // Submit the cancellation and run it now, so the kernel drops its reference.
            let _ = ring.flush();
        }
        unreg(i);
    }
    table_unlock();
    if do_close {
        real::close(fd)
    } else {
        0
    }
}

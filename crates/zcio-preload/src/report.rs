//! Settings (read once, in the constructor: nginx workers clear their environment), the
//! `ZCIO_EPOLL_LOG=1` log on stderr, and the `ZCIO_EPOLL_STATS=path` file written at exit.

use std::ffi::CString;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

/// `ZCIO_EPOLL_LOG=1`.
pub static LOG: AtomicBool = AtomicBool::new(false);
/// `ZCIO_EPOLL=off` (or `0`): pass everything to libc.
pub static DISABLED: AtomicBool = AtomicBool::new(false);
/// `ZCIO_EPOLL_TASKRUN=coop` clears this: completions then run on any kernel exit of the
/// thread (so a wait can find them in shared memory) instead of only when it enters the ring.
/// DEFER_TASKRUN stays the default for the shim: under COOP_TASKRUN a completion sets
/// TIF_NOTIFY_SIGNAL on the thread, which makes a *real* `epoll_wait` in the same thread (an
/// instance that fell back) return a spurious EINTR — the trace test catches it.
pub static DEFER_TASKRUN: AtomicBool = AtomicBool::new(true);
/// `ZCIO_EPOLL_BACKEND=poll` sets this: serve instances from the poll ring (one `POLL_ADD`
/// per fd, the interest list kept by the shim) instead of `EPOLL_WAIT` over the program's own
/// epoll fd (the default where the kernel has it, Linux 6.15).
pub static POLL_RING: AtomicBool = AtomicBool::new(false);
/// `ZCIO_EPOLL_WAIT_MODE=auto|ring|plain|alternate` (`EPOLL_WAIT` rings): how a wait collects
/// the program's epoll — chosen per workload (default), always the ring's `EPOLL_WAIT`,
/// always `epoll_wait`, or switching at every wait (tests). 0 auto, 1 ring, 2 plain, 3
/// alternate.
pub static WAIT_MODE: AtomicU8 = AtomicU8::new(0);
/// `ZCIO_EPOLL_STATS=path`.
pub static STATS_PATH: OnceLock<CString> = OnceLock::new();

/// Process-wide counters (per process: a forked child starts from the parent's values and
/// writes its own line).
#[derive(Debug)]
pub struct Stats {
    /// Epoll instances served by an event ring.
    pub ring_instances: AtomicU64,
    /// Instances that fell back to the real epoll (at creation or later).
    pub fallbacks: AtomicU64,
    /// `epoll_wait`-family calls answered from an event ring.
    pub ring_waits: AtomicU64,
    /// Events those calls returned.
    pub ring_events: AtomicU64,
    /// Kernel entries the event rings made (`io_uring_enter`), over finished rings.
    pub ring_enters: AtomicU64,
    /// `epoll_ctl` calls served by an event ring.
    pub ring_ctls: AtomicU64,
    /// Registered fds whose close the shim handled (poll cancelled before the close).
    pub ring_closes: AtomicU64,
    /// Wait calls on shim instances passed to the real epoll (fallen-back instances).
    pub real_waits: AtomicU64,
    /// Registrations of fds closed where their polls could not be cancelled at once (signal
    /// handler, other thread, forked child), deleted by the owner's next call.
    pub deferred_closes: AtomicU64,
    /// Program calls refused with `EBADF` because they named one of the shim's own fds.
    pub refused: AtomicU64,
    /// Switches of the `EPOLL_WAIT` rings between the ring wait and plain `epoll_wait` (the
    /// per-workload choice; each logged with its reason under `ZCIO_EPOLL_LOG=1`).
    pub mode_switches: AtomicU64,
    /// Kernel-mode instances handed to the real epoll by the per-instance choice (a fallback
    /// with its reason, logged under `ZCIO_EPOLL_LOG=1`; listed in `handed_instances`).
    pub handed: AtomicU64,
}

/// The counters.
pub static STATS: Stats = Stats {
    ring_instances: AtomicU64::new(0),
    fallbacks: AtomicU64::new(0),
    ring_waits: AtomicU64::new(0),
    ring_events: AtomicU64::new(0),
    ring_enters: AtomicU64::new(0),
    ring_ctls: AtomicU64::new(0),
    ring_closes: AtomicU64::new(0),
    real_waits: AtomicU64::new(0),
    deferred_closes: AtomicU64::new(0),
    refused: AtomicU64::new(0),
    mode_switches: AtomicU64::new(0),
    handed: AtomicU64::new(0),
};

pub fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

pub fn logging() -> bool {
    LOG.load(Ordering::Relaxed)
}

/// Writes one log line to stderr (only with `ZCIO_EPOLL_LOG=1`).
pub fn log(args: std::fmt::Arguments<'_>) {
    if !logging() {
        return;
    }
    let mut s = String::with_capacity(128);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let _ = writeln!(s, "zcio-epoll[{pid}]: {args}");
    write_all(2, s.as_bytes());
}

fn write_all(fd: libc::c_int, mut b: &[u8]) {
    while !b.is_empty() {
        // SAFETY: `b` is a valid readable slice for the call.
        let n = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
        if n <= 0 {
            if n < 0 && crate::real::errno() == libc::EINTR {
                continue;
            }
            return;
        }
        b = &b[n as usize..];
    }
}

extern "C" {
    // glibc ≥ 2.17; not in the libc crate.
    fn secure_getenv(name: *const libc::c_char) -> *mut libc::c_char;
}

/// One setting, through `secure_getenv`: a set-user-ID or set-group-ID program (the shim
/// preloaded system-wide from /etc/ld.so.preload) sees none, so its caller's environment
/// cannot make it write a file or log.
fn setting(name: &'static [u8]) -> Option<Vec<u8>> {
    // SAFETY: `name` is NUL-terminated; secure_getenv returns NULL or a NUL-terminated string
    // owned by the environment, copied at once (the constructor runs before other threads).
    unsafe {
        let p = secure_getenv(name.as_ptr().cast());
        (!p.is_null()).then(|| std::ffi::CStr::from_ptr(p).to_bytes().to_vec())
    }
}

/// Reads the settings from the environment.
pub fn read_env() {
    let on = |k| setting(k).map(|v| v == b"1" || v == b"on" || v == b"yes");
    LOG.store(on(b"ZCIO_EPOLL_LOG\0").unwrap_or(false), Ordering::Relaxed);
    if let Some(v) = setting(b"ZCIO_EPOLL\0") {
        DISABLED.store(v == b"off" || v == b"0", Ordering::Relaxed);
    }
    if let Some(v) = setting(b"ZCIO_EPOLL_TASKRUN\0") {
        DEFER_TASKRUN.store(v != b"coop", Ordering::Relaxed);
    }
    if let Some(v) = setting(b"ZCIO_EPOLL_BACKEND\0") {
        POLL_RING.store(v == b"poll", Ordering::Relaxed);
    }
    if let Some(v) = setting(b"ZCIO_EPOLL_WAIT_MODE\0") {
        let m = match v.as_slice() {
            b"ring" => 1,
            b"plain" => 2,
            b"alternate" => 3,
            _ => 0,
        };
        WAIT_MODE.store(m, Ordering::Relaxed);
    }
    if let Some(p) = setting(b"ZCIO_EPOLL_STATS\0") {
        if let Ok(c) = CString::new(p) {
            let _ = STATS_PATH.set(c);
        }
    }
}

/// What the instances report at exit: the live rings' kernel entries, the waits passed straight
/// to the real epoll on handed instances, and the handed instances (`fd<N>:<events per
/// wait>ev/wait`, `-` for none).
pub struct Live {
    pub enters: u64,
    pub handed_waits: u64,
    pub handed_list: String,
}

/// The stats line: `pid=.. ring_instances=.. ...`.
pub fn line(live: &Live) -> String {
    let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    // io_uring_setup calls made, refused, not made (back-off) and paced (ring::pace).
    let pace = zcio::ring::pace::counts();
    format!(
        "pid={pid} ring_instances={} fallbacks={} ring_waits={} ring_events={} ring_enters={} \
         ring_ctls={} ring_closes={} real_waits={} deferred_closes={} refused={} \
         mode_switches={} ring_setups={} setups_refused={} setups_throttled={} \
         setups_delayed={} handed={} handed_waits={} handed_instances={}\n",
        g(&STATS.ring_instances),
        g(&STATS.fallbacks),
        g(&STATS.ring_waits),
        g(&STATS.ring_events),
        g(&STATS.ring_enters) + live.enters,
        g(&STATS.ring_ctls),
        g(&STATS.ring_closes),
        g(&STATS.real_waits),
        g(&STATS.deferred_closes),
        g(&STATS.refused),
        g(&STATS.mode_switches),
        pace.kernel_calls,
        pace.refused,
        pace.throttled,
        pace.delayed,
        g(&STATS.handed),
        live.handed_waits,
        live.handed_list,
    )
}

/// Appends the stats line to `ZCIO_EPOLL_STATS` (called at exit). The file is opened with
/// `O_NOFOLLOW` (a symlink planted at the path is refused, not followed) and created `0600`
/// when missing; only a regular file is written.
pub fn write_stats(live: &Live) {
    let Some(path) = STATS_PATH.get() else { return };
    let l = line(live);
    // SAFETY: `path` is NUL-terminated; flags and mode are plain integers.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_WRONLY
                | libc::O_CREAT
                | libc::O_APPEND
                | libc::O_CLOEXEC
                | libc::O_NOFOLLOW
                | libc::O_NONBLOCK
                | libc::O_NOCTTY,
            0o600 as libc::c_uint,
        )
    };
    if fd >= 0 && !is_regular(fd) {
        crate::real::close(fd);
        return;
    }
    if fd >= 0 {
        write_all(fd, l.as_bytes());
        crate::real::close(fd);
    }
}

fn is_regular(fd: libc::c_int) -> bool {
    // SAFETY: zeroed stat is a valid out-buffer; fstat fills it.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG
    }
}

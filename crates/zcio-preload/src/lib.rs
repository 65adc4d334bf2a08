//! `libzcio_epoll.so`: an `LD_PRELOAD` shim that serves an unmodified program's epoll calls
//! from zcio's event ring ([`zcio::event::EventRing`], io_uring multishot poll), with epoll's
//! semantics.
//!
//! Interposed: `epoll_create`, `epoll_create1`, `epoll_ctl`, `epoll_wait`, `epoll_pwait`,
//! `epoll_pwait2`, and what touches epoll fds or registered fds: `close`, `close_range`,
//! `closefrom`, `fclose`, `pclose`, `dup`, `dup2`, `dup3`, `fcntl`/`fcntl64`, `poll`, `ppoll`,
//! `select`, `pselect`; `fork` through `pthread_atfork`. The shim's own fds (high,
//! close-on-exec) are refused to the program with `EBADF`. What the ring cannot serve faithfully makes that instance fall back to its
//! real epoll fd (interest list replayed; logged once with `ZCIO_EPOLL_LOG=1`). See
//! `docs/design/capi-preload.md`.
//!
//! Rules kept at every entry point: a re-entrant call (the shim's own use of libc) goes
//! straight to libc; a panic is caught and the call is passed to libc; settings are read once
//! in the constructor.
#![allow(unsafe_code)]
// The exported functions are C ABI entry points with libc's contracts (the caller passes valid
// pointers, as it would to libc); Rust code never calls them.
#![allow(clippy::not_unsafe_ptr_arg_deref)]
#![warn(missing_docs)]

mod inst;
mod real;
mod report;

use libc::{c_int, c_void, epoll_event, fd_set, nfds_t, pollfd, sigset_t, timespec, timeval};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::Duration;

thread_local! {
    static IN_SHIM: Cell<bool> = const { Cell::new(false) };
}

/// Runs `shim` unless this thread is already inside the shim (or the shim is disabled), in
/// which case — or if `shim` panics — `pass` (the libc call) runs instead.
fn guarded<R>(shim: impl FnOnce() -> R, pass: impl FnOnce() -> R) -> R {
    if report::DISABLED.load(Ordering::Relaxed) || IN_SHIM.with(|g| g.replace(true)) {
        return pass();
    }
    let r = catch_unwind(AssertUnwindSafe(shim));
    IN_SHIM.with(|g| g.set(false));
    match r {
        Ok(r) => r,
        Err(_) => {
            report::log(format_args!(
                "internal panic caught; passing the call to libc"
            ));
            pass()
        }
    }
}

extern "C" fn on_exit() {
    guarded(
        || {
            report::write_stats(&report::Live {
                enters: inst::live_enters(),
                handed_waits: inst::handed_waits(),
                handed_list: inst::handed_list(),
            })
        },
        || (),
    );
}

extern "C" fn atfork_prepare() {
    inst::table_lock();
}
extern "C" fn atfork_parent() {
    inst::table_unlock();
}
extern "C" fn atfork_child() {
    inst::FORK_GEN.fetch_add(1, Ordering::Relaxed);
    // SAFETY: getpid has no preconditions.
    inst::PID.store(unsafe { libc::getpid() } as u64, Ordering::Relaxed);
    inst::table_unlock();
    // The child's TID cache stays valid; instances compare the fork generation.
}

extern "C" fn init() {
    IN_SHIM.with(|g| g.set(true));
    report::read_env();
    // SAFETY: getpid has no preconditions.
    inst::PID.store(unsafe { libc::getpid() } as u64, Ordering::Relaxed);
    zcio::sys::set_private_fd_hook(inst::mark_private);
    zcio::sys::set_private_fd_floor(private_floor());
    // SAFETY: registering plain extern "C" functions with no arguments.
    unsafe {
        libc::pthread_atfork(
            Some(atfork_prepare),
            Some(atfork_parent),
            Some(atfork_child),
        );
        libc::atexit(on_exit);
    }
    IN_SHIM.with(|g| g.set(false));
}

/// Where the shim's own descriptors go: high in the program's allowed range (a program that
/// closes "every fd above 2" or `dup2`s onto small fixed numbers does not meet them), but not
/// beyond 64 Ki (the kernel sizes the fd table to the highest number in use).
fn private_floor() -> i32 {
    // SAFETY: zeroed rlimit is a valid out-buffer.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit fills `rl`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return 0;
    }
    let cur = rl.rlim_cur.min(1 << 16) as i64;
    let floor = cur - 256;
    if floor < 64 {
        0
    } else {
        floor as i32
    }
}

/// Whether this thread is inside the shim (a call made by the shim itself, or a signal
/// handler that interrupted it).
fn in_shim() -> bool {
    IN_SHIM.with(|g| g.get())
}

/// Fails the call with `EBADF` (the program named one of the shim's own descriptors).
fn refuse() -> c_int {
    report::bump(&report::STATS.refused, 1);
    real::set_errno(libc::EBADF);
    -1
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

fn new_instance(fd: c_int) -> c_int {
    if fd >= 0 {
        let _ = inst::create(fd);
    }
    fd
}

/// Interposed `epoll_create`.
#[no_mangle]
pub extern "C" fn epoll_create(size: c_int) -> c_int {
    guarded(
        || {
            let fd = real::epoll_create(size);
            new_instance(fd)
        },
        || real::epoll_create(size),
    )
}

/// Interposed `epoll_create1`.
#[no_mangle]
pub extern "C" fn epoll_create1(flags: c_int) -> c_int {
    guarded(
        || new_instance(real::epoll_create1(flags)),
        || real::epoll_create1(flags),
    )
}

/// Interposed `epoll_ctl`.
#[no_mangle]
pub extern "C" fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    if (inst::is_private(fd) || inst::is_private(epfd)) && !in_shim() {
        // (The shim's own event ring may drive a private epoll fd through libc.)
        return refuse();
    }
    guarded(
        || match inst::lookup(epfd) {
            Some(i) => inst::ctl(&i, op, fd, ev),
            None => {
                if inst::is_instance(fd) && op != libc::EPOLL_CTL_DEL {
                    inst::convert(fd, "nested in another epoll set");
                }
                real::epoll_ctl(epfd, op, fd, ev)
            }
        },
        || real::epoll_ctl(epfd, op, fd, ev),
    )
}

fn ms(timeout: c_int) -> Option<Duration> {
    (timeout >= 0).then(|| Duration::from_millis(timeout as u64))
}

/// Whether `mask` equals this thread's signal mask (then pwait needs no mask change).
fn same_mask(mask: *const sigset_t) -> bool {
    // SAFETY: zeroed sigset_t is a valid (empty) set; pthread_sigmask only reads the current
    // mask into `cur`; `mask` is the caller's non-null sigset.
    unsafe {
        let mut cur: sigset_t = std::mem::zeroed();
        if libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur) != 0 {
            return false;
        }
        (1..65).all(|s| libc::sigismember(&cur, s) == libc::sigismember(mask, s))
    }
}

/// The wait family: `timeout` decoded, `sigmask` possibly null; `pass` is the libc call.
fn wait_common(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: Option<Duration>,
    sigmask: *const sigset_t,
    pass: impl Fn() -> c_int,
) -> c_int {
    if inst::is_handed(epfd) {
        // Handed to the real epoll: libc at once (the instance's epoll fd is the interest list).
        inst::count_handed_wait(epfd);
        return pass();
    }
    guarded(
        || {
            let Some(i) = inst::lookup(epfd) else {
                return pass();
            };
            if max <= 0 || ev.is_null() {
                return pass();
            }
            if !sigmask.is_null() && !same_mask(sigmask) {
                // Changing the mask around a ring wait would race with signal delivery.
                inst::convert(epfd, "epoll_pwait with a signal mask that differs");
                return pass();
            }
            inst::wait(&i, ev, max, timeout)
        },
        &pass,
    )
}

/// Interposed `epoll_wait`.
#[no_mangle]
pub extern "C" fn epoll_wait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    wait_common(epfd, ev, max, ms(timeout), std::ptr::null(), || {
        real::epoll_wait(epfd, ev, max, timeout)
    })
}

/// Interposed `epoll_pwait`.
#[no_mangle]
pub extern "C" fn epoll_pwait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    sigmask: *const sigset_t,
) -> c_int {
    wait_common(epfd, ev, max, ms(timeout), sigmask, || {
        real::epoll_pwait(epfd, ev, max, timeout, sigmask)
    })
}

/// Interposed `epoll_pwait2`.
#[no_mangle]
pub extern "C" fn epoll_pwait2(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    ts: *const timespec,
    sigmask: *const sigset_t,
) -> c_int {
    let timeout = if ts.is_null() {
        None
    } else {
        // SAFETY: non-null timespec from the caller.
        let t = unsafe { *ts };
        if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
            // EINVAL from the kernel.
            return real::epoll_pwait2(epfd, ev, max, ts, sigmask);
        }
        Some(Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
    };
    wait_common(epfd, ev, max, timeout, sigmask, || {
        real::epoll_pwait2(epfd, ev, max, ts, sigmask)
    })
}

/// Interposed `close`: an epoll instance is retired; a registered fd has its polls cancelled
/// before it is closed (an armed io_uring poll holds a reference to the file); one of the
/// shim's own fds is refused (`EBADF`).
#[no_mangle]
pub extern "C" fn close(fd: c_int) -> c_int {
    // Fast path without locks: the shim has nothing to do with `fd`.
    if inst::flags(fd) == 0 {
        return real::close(fd);
    }
    before_close(fd, true)
}

/// What replacing or closing `fd` means to the shim, then (`do_close`) the real close.
/// Async-signal-safe where it matters: a signal handler that interrupted the shim itself
/// only marks the registration pending (atomics) and closes.
fn before_close(fd: c_int, do_close: bool) -> c_int {
    let pass = || if do_close { real::close(fd) } else { 0 };
    if inst::is_private(fd) {
        if in_shim() {
            // The shim closing its own descriptor (a ring being dropped).
            inst::clear_private(fd);
            return pass();
        }
        return refuse();
    }
    if !inst::same_process() {
        // A vfork child: its fd table is its own, the memory is the parent's.
        return pass();
    }
    if in_shim() {
        // A signal handler that interrupted the shim on this thread (which may hold the
        // instance lock): no locks, no allocation.
        if inst::is_instance(fd) {
            inst::forget_instance_fd(fd);
        }
        if inst::is_registered(fd) {
            inst::mark_pending(fd);
        }
        return pass();
    }
    guarded(
        || {
            if inst::is_instance(fd) {
                inst::remove(fd);
            }
            if inst::is_registered(fd) {
                inst::close_registered(fd, do_close)
            } else {
                pass()
            }
        },
        pass,
    )
}

/// Before `oldfd` gets a second number: a ring instance becomes a real epoll (two numbers
/// share one interest list).
fn before_dup(oldfd: c_int) {
    if inst::is_instance(oldfd) && inst::same_process() {
        guarded(|| inst::convert(oldfd, "duplicated with dup/fcntl"), || ());
    }
}

/// Whether `dup2`/`dup3(old, new, flags)` will fail without touching `new` (the kernel's
/// checks, in its order): then the shim must leave `new`'s registrations alone.
fn dup_will_fail(old: c_int, new: c_int, flags: Option<c_int>) -> bool {
    if let Some(f) = flags {
        if f & !libc::O_CLOEXEC != 0 || old == new {
            return true;
        }
    }
    if real::fcntl(old, libc::F_GETFD, 0) < 0 {
        return true;
    }
    // SAFETY: zeroed rlimit is a valid out-buffer.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit fills `rl`.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0;
    new < 0 || (ok && new as u64 >= rl.rlim_cur)
}

/// `dup2`/`dup3` (`flags` for dup3): refuses the shim's own fds on either side; converts an
/// epoll instance being duplicated; cancels `new`'s registrations when it will be replaced.
fn dup_onto(old: c_int, new: c_int, flags: Option<c_int>, call: impl Fn() -> c_int) -> c_int {
    if inst::flags(old) == 0 && inst::flags(new) == 0 {
        return call();
    }
    if (inst::is_private(old) || inst::is_private(new)) && !in_shim() {
        return refuse();
    }
    if old == new || dup_will_fail(old, new, flags) {
        return call();
    }
    before_dup(old);
    if inst::flags(new) != 0 {
        before_close(new, false);
    }
    call()
}
/// Interposed `dup`.
#[no_mangle]
pub extern "C" fn dup(fd: c_int) -> c_int {
    if inst::flags(fd) == 0 {
        return real::dup(fd);
    }
    if inst::is_private(fd) && !in_shim() {
        return refuse();
    }
    before_dup(fd);
    real::dup(fd)
}

/// Interposed `dup2`.
#[no_mangle]
pub extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    dup_onto(old, new, None, || real::dup2(old, new))
}

/// Interposed `dup3`.
#[no_mangle]
pub extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    dup_onto(old, new, Some(flags), || real::dup3(old, new, flags))
}

fn fcntl_common(fd: c_int, cmd: c_int, pass: impl Fn() -> c_int) -> c_int {
    if inst::flags(fd) == 0 {
        return pass();
    }
    if inst::is_private(fd) && !in_shim() {
        return refuse();
    }
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        before_dup(fd);
    }
    pass()
}

/// Interposed `fcntl` (variadic in C; the one optional argument is read as a register-sized
/// integer, which is how the x86-64 and aarch64 calling conventions pass it).
#[no_mangle]
pub extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    fcntl_common(fd, cmd, || real::fcntl(fd, cmd, arg))
}

/// Interposed `fcntl64` (glibc's name under `_FILE_OFFSET_BITS=64`).
#[no_mangle]
pub extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    fcntl_common(fd, cmd, || real::fcntl64(fd, cmd, arg))
}

fn check_polled(fds: *const pollfd, n: nfds_t) {
    if inst::RING_LIVE.load(Ordering::Relaxed) == 0 || fds.is_null() {
        return;
    }
    for k in 0..n as usize {
        // SAFETY: the caller passes `n` pollfds.
        let fd = unsafe { (*fds.add(k)).fd };
        if inst::is_instance(fd) {
            guarded(|| inst::convert(fd, "polled by poll/ppoll"), || ());
        }
    }
}

/// Interposed `poll`: an epoll instance polled by poll becomes a real epoll first.
#[no_mangle]
pub extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    check_polled(fds, n);
    real::poll(fds, n, timeout)
}

/// Interposed `ppoll`.
#[no_mangle]
pub extern "C" fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    sigmask: *const sigset_t,
) -> c_int {
    check_polled(fds, n);
    real::ppoll(fds, n, ts, sigmask)
}

fn check_selected(nfds: c_int, sets: [*mut fd_set; 3]) {
    if inst::RING_LIVE.load(Ordering::Relaxed) == 0 {
        return;
    }
    for fd in 0..nfds.min(libc::FD_SETSIZE as c_int) {
        if !inst::is_instance(fd) {
            continue;
        }
        // SAFETY: non-null sets hold FD_SETSIZE bits; fd < FD_SETSIZE.
        let hit = sets
            .iter()
            .any(|s| !s.is_null() && unsafe { libc::FD_ISSET(fd, *s) });
        if hit {
            guarded(|| inst::convert(fd, "polled by select/pselect"), || ());
        }
    }
}

type SelectFn =
    unsafe extern "C" fn(c_int, *mut fd_set, *mut fd_set, *mut fd_set, *mut timeval) -> c_int;
type PselectFn = unsafe extern "C" fn(
    c_int,
    *mut fd_set,
    *mut fd_set,
    *mut fd_set,
    *const timespec,
    *const sigset_t,
) -> c_int;

fn next_sym(name: &'static [u8]) -> *mut c_void {
    // SAFETY: NUL-terminated name; RTLD_NEXT skips this library.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) }
}

/// Interposed `select`.
#[no_mangle]
pub extern "C" fn select(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    t: *mut timeval,
) -> c_int {
    check_selected(nfds, [r, w, e]);
    let p = next_sym(b"select\0");
    if p.is_null() {
        // SAFETY: the raw system call takes the same arguments.
        return unsafe { libc::syscall(libc::SYS_select, nfds, r, w, e, t) } as c_int;
    }
    // SAFETY: libc's select, with this signature; arguments passed through.
    unsafe { std::mem::transmute::<*mut c_void, SelectFn>(p)(nfds, r, w, e, t) }
}

/// Interposed `pselect`.
#[no_mangle]
pub extern "C" fn pselect(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    t: *const timespec,
    m: *const sigset_t,
) -> c_int {
    check_selected(nfds, [r, w, e]);
    let p = next_sym(b"pselect\0");
    if p.is_null() {
        real::set_errno(libc::ENOSYS);
        return -1;
    }
    // SAFETY: libc's pselect, with this signature; arguments passed through.
    unsafe { std::mem::transmute::<*mut c_void, PselectFn>(p)(nfds, r, w, e, t, m) }
}

/// Closes `[lo, hi]` around the shim's own descriptors (the kernel would close them too), with
/// `close` bookkeeping for instances and registered fds in the range. `flags` as
/// `close_range`: `CLOSE_RANGE_CLOEXEC` only marks (nothing to do for the shim; its own fds are
/// close-on-exec already); `CLOSE_RANGE_UNSHARE` closes in a private copy of the table, which
/// is this process's table from then on (bookkeeping as for close).
fn close_range_common(lo: u32, hi: u32, flags: c_int, raw: impl Fn(u32, u32) -> c_int) -> c_int {
    let hi_tracked = hi.min(inst::MAXFD as u32 - 1);
    if lo > hi || flags & libc::CLOSE_RANGE_CLOEXEC as c_int != 0 || !inst::same_process() {
        return raw(lo, hi);
    }
    // Validate flags and range once with an empty effect: the kernel's answer to bad flags.
    if flags & !(libc::CLOSE_RANGE_UNSHARE as c_int) != 0 {
        return raw(lo, hi);
    }
    let mut start = lo;
    let mut fd = lo;
    while fd <= hi_tracked {
        let f = inst::flags(fd as c_int);
        if f != 0 {
            if inst::is_private(fd as c_int) {
                if fd > start {
                    let r = raw(start, fd - 1);
                    if r != 0 {
                        return r;
                    }
                }
                start = fd + 1;
            } else {
                before_close(fd as c_int, false);
            }
        }
        fd += 1;
    }
    if start <= hi {
        raw(start, hi)
    } else {
        0
    }
}

type CloseRangeFn = unsafe extern "C" fn(u32, u32, c_int) -> c_int;

/// Interposed `close_range` (glibc ≥ 2.34).
#[no_mangle]
pub extern "C" fn close_range(lo: u32, hi: u32, flags: c_int) -> c_int {
    close_range_common(lo, hi, flags, |a, b| {
        let p = next_sym(b"close_range\0");
        if p.is_null() {
            // SAFETY: the raw system call takes the same arguments.
            return unsafe { libc::syscall(libc::SYS_close_range, a, b, flags) } as c_int;
        }
        // SAFETY: libc's close_range, with this signature.
        unsafe { std::mem::transmute::<*mut c_void, CloseRangeFn>(p)(a, b, flags) }
    })
}

/// Interposed `closefrom` (glibc ≥ 2.34; it calls the close_range system call internally,
/// which the shim would not see).
#[no_mangle]
pub extern "C" fn closefrom(lo: c_int) {
    let lo = lo.max(0) as u32;
    close_range_common(lo, u32::MAX, 0, |a, b| {
        // SAFETY: close_range takes plain integers.
        let r = unsafe { libc::syscall(libc::SYS_close_range, a, b, 0) } as c_int;
        if r != 0 {
            // closefrom cannot fail: close one by one (what glibc does without close_range).
            // SAFETY: sysconf takes a plain integer.
            let open_max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) }.clamp(0, 1 << 20) as u32;
            let top = b.min(open_max);
            for fd in a..=top {
                if !inst::is_private(fd as c_int) {
                    real::close(fd as c_int);
                }
            }
        }
        0
    });
}

type FcloseFn = unsafe extern "C" fn(*mut libc::FILE) -> c_int;

/// Close bookkeeping for the fd under a stream that libc is about to close internally.
fn before_stream_close(f: *mut libc::FILE) {
    if !f.is_null() && inst::RING_LIVE.load(Ordering::Relaxed) > 0 {
        // SAFETY: the caller passes an open stream, as to libc's fclose/pclose.
        let fd = unsafe { libc::fileno(f) };
        if fd >= 0 && inst::flags(fd) != 0 && !inst::is_private(fd) {
            before_close(fd, false);
        }
    }
}

/// Interposed `fclose`: a stream on a registered socket (`fdopen`) closes its fd inside libc,
/// where the interposed `close` does not see it.
#[no_mangle]
pub extern "C" fn fclose(f: *mut libc::FILE) -> c_int {
    before_stream_close(f);
    let p = next_sym(b"fclose\0");
    // SAFETY: libc's fclose, with this signature; the stream passed through.
    unsafe { std::mem::transmute::<*mut c_void, FcloseFn>(p)(f) }
}

/// Interposed `pclose`: a `popen` pipe registered for events must really close before
/// `pclose` waits for the child (a child reading until end of file would wait forever on a
/// pipe the armed poll keeps open).
#[no_mangle]
pub extern "C" fn pclose(f: *mut libc::FILE) -> c_int {
    before_stream_close(f);
    let p = next_sym(b"pclose\0");
    // SAFETY: libc's pclose, with this signature; the stream passed through.
    unsafe { std::mem::transmute::<*mut c_void, FcloseFn>(p)(f) }
}

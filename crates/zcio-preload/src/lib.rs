//! `libzcio_epoll.so`: an `LD_PRELOAD` shim that serves an unmodified program's epoll calls
//! from zcio's event ring ([`zcio::event::EventRing`], io_uring multishot poll), with epoll's
//! semantics.
//!
//! Interposed: `epoll_create`, `epoll_create1`, `epoll_ctl`, `epoll_wait`, `epoll_pwait`,
//! `epoll_pwait2`, and what touches epoll fds or registered fds: `close`, `dup`, `dup2`,
//! `dup3`, `fcntl`/`fcntl64` (`F_DUPFD*`), `poll`, `ppoll`, `select`, `pselect`; `fork` through
//! `pthread_atfork`. What the ring cannot serve faithfully makes that instance fall back to its
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
    guarded(|| report::write_stats(inst::live_enters()), || ());
}

extern "C" fn atfork_prepare() {
    inst::table_lock();
}
extern "C" fn atfork_parent() {
    inst::table_unlock();
}
extern "C" fn atfork_child() {
    inst::FORK_GEN.fetch_add(1, Ordering::Relaxed);
    inst::table_unlock();
    // The child's TID cache stays valid; instances compare the fork generation.
}

extern "C" fn init() {
    IN_SHIM.with(|g| g.set(true));
    report::read_env();
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
/// before it is closed (an armed io_uring poll holds a reference to the file).
#[no_mangle]
pub extern "C" fn close(fd: c_int) -> c_int {
    // Fast path without locks: neither an instance nor registered.
    if !inst::is_instance(fd) && !inst::is_registered(fd) {
        return real::close(fd);
    }
    guarded(
        || {
            if inst::is_instance(fd) {
                inst::remove(fd);
            }
            if inst::is_registered(fd) {
                inst::close_registered(fd, true)
            } else {
                real::close(fd)
            }
        },
        || real::close(fd),
    )
}

/// Before `oldfd` gets a second number: a ring instance becomes a real epoll (two numbers
/// share one interest list); before `newfd` is replaced: `close` bookkeeping.
fn before_dup(oldfd: c_int, newfd: Option<c_int>) {
    if inst::is_instance(oldfd) {
        inst::convert(oldfd, "duplicated with dup/fcntl");
    }
    if let Some(n) = newfd {
        if n != oldfd {
            if inst::is_instance(n) {
                inst::remove(n);
            }
            if inst::is_registered(n) {
                inst::close_registered(n, false);
            }
        }
    }
}

/// Interposed `dup`.
#[no_mangle]
pub extern "C" fn dup(fd: c_int) -> c_int {
    if !inst::is_instance(fd) {
        return real::dup(fd);
    }
    guarded(
        || {
            before_dup(fd, None);
            real::dup(fd)
        },
        || real::dup(fd),
    )
}

/// Interposed `dup2`.
#[no_mangle]
pub extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    guarded(
        || {
            before_dup(old, Some(new));
            real::dup2(old, new)
        },
        || real::dup2(old, new),
    )
}

/// Interposed `dup3`.
#[no_mangle]
pub extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    guarded(
        || {
            before_dup(old, Some(new));
            real::dup3(old, new, flags)
        },
        || real::dup3(old, new, flags),
    )
}

fn fcntl_common(fd: c_int, cmd: c_int, pass: impl Fn() -> c_int) -> c_int {
    if !(cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) || !inst::is_instance(fd) {
        return pass();
    }
    guarded(
        || {
            before_dup(fd, None);
            pass()
        },
        &pass,
    )
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

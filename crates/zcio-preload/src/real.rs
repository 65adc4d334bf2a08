//! The real libc functions behind the interposed ones, found with `dlsym(RTLD_NEXT, ..)`.
//!
//! Each pointer is resolved on first use (a constructor of another library may call `close`
//! before ours ran) and cached in an atomic. A symbol libc lacks (`epoll_pwait2` before glibc
//! 2.35) falls back to the raw system call.

use libc::{c_int, c_void, epoll_event, nfds_t, pollfd, sigset_t, timespec};
use std::sync::atomic::{AtomicPtr, Ordering};

fn resolve(cache: &AtomicPtr<c_void>, name: &'static [u8]) -> *mut c_void {
    let p = cache.load(Ordering::Relaxed);
    if !p.is_null() {
        return p;
    }
    // SAFETY: `name` is a NUL-terminated symbol name; RTLD_NEXT looks the symbol up in the
    // objects loaded after this one (libc), never in this library.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
    cache.store(p, Ordering::Relaxed);
    p
}

macro_rules! real_fn {
    ($(#[$m:meta])* $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty, $sys:expr) => {
        $(#[$m])*
        pub fn $name($($arg: $ty),*) -> $ret {
            static CACHE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
            let p = resolve(&CACHE, concat!(stringify!($name), "\0").as_bytes());
            if p.is_null() {
                // SAFETY: the raw system call takes the same arguments as the libc wrapper.
                return unsafe { libc::syscall($sys, $($arg),*) } as $ret;
            }
            // SAFETY: `p` is libc's definition of this very function, with this signature.
            let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(p) };
            // SAFETY: the caller's arguments are passed through unchanged, as the program
            // would have passed them to libc.
            unsafe { f($($arg),*) }
        }
    };
}

real_fn!(epoll_create(size: c_int) -> c_int, libc::SYS_epoll_create);
real_fn!(epoll_create1(flags: c_int) -> c_int, libc::SYS_epoll_create1);
real_fn!(epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int, libc::SYS_epoll_ctl);
real_fn!(epoll_wait(epfd: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int) -> c_int, libc::SYS_epoll_wait);
real_fn!(epoll_pwait(epfd: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int, sigmask: *const sigset_t) -> c_int, libc::SYS_epoll_pwait);
real_fn!(close(fd: c_int) -> c_int, libc::SYS_close);
real_fn!(dup(fd: c_int) -> c_int, libc::SYS_dup);
real_fn!(dup2(old: c_int, new: c_int) -> c_int, libc::SYS_dup2);
real_fn!(dup3(old: c_int, new: c_int, flags: c_int) -> c_int, libc::SYS_dup3);
real_fn!(fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int, libc::SYS_fcntl);
real_fn!(fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int, libc::SYS_fcntl);
real_fn!(poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int, libc::SYS_poll);
real_fn!(ppoll(fds: *mut pollfd, n: nfds_t, ts: *const timespec, sigmask: *const sigset_t) -> c_int, libc::SYS_ppoll);

/// `epoll_pwait2` (glibc ≥ 2.35; the raw system call otherwise, which needs the mask size).
pub fn epoll_pwait2(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    ts: *const timespec,
    sigmask: *const sigset_t,
) -> c_int {
    static CACHE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let p = resolve(&CACHE, b"epoll_pwait2\0");
    if p.is_null() {
        // SAFETY: the kernel takes (epfd, events, maxevents, timeout, sigmask, sigsetsize).
        return unsafe { libc::syscall(libc::SYS_epoll_pwait2, epfd, ev, max, ts, sigmask, 8) }
            as c_int;
    }
    type F = unsafe extern "C" fn(
        c_int,
        *mut epoll_event,
        c_int,
        *const timespec,
        *const sigset_t,
    ) -> c_int;
    // SAFETY: `p` is libc's epoll_pwait2, with this signature.
    let f: F = unsafe { std::mem::transmute::<*mut c_void, F>(p) };
    // SAFETY: arguments passed through unchanged.
    unsafe { f(epfd, ev, max, ts, sigmask) }
}

/// Sets `errno`.
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e }
}

/// Reads `errno`.
pub fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

//! libzcio: the C ABI of zcio. The header `include/zcio.h` is generated from this file with
//! cbindgen (the test `header_is_current` fails when the committed header is out of date).
//!
//! Conventions, as liburing's: `int` results are a count or 0 on success and `-errno` on
//! failure; handles are opaque pointers owned by the caller until their `_free`; a Rust panic
//! never unwinds into C (it is caught and reported as `-ENOTRECOVERABLE`).
//!
//! Threads: every function's comment ends with its thread rule. Event rings, senders,
//! receivers, NFQUEUE, NFLOG, conntrack event and audit handles belong to the thread that created them (their io_uring
//! instances are `SINGLE_ISSUER`); their calls from another thread return `-EPERM` without
//! touching anything. Posters, pools and buffers may be used from any thread (a buffer by one
//! thread at a time), and a received chunk may be freed from any thread.
#![allow(unsafe_code)]
// C entry points take C's contracts (valid pointers or NULL, checked); Rust never calls them.
#![allow(clippy::not_unsafe_ptr_arg_deref)]
#![allow(non_camel_case_types)]
#![warn(missing_docs)]

mod audit;
mod ctevents;
mod nflog;
mod nfq;
mod report;
mod ring;
mod rx;
mod tx;

pub use audit::*;
pub use ctevents::*;
pub use nflog::*;
pub use nfq::*;
pub use report::*;
pub use ring::*;
pub use rx::*;
pub use tx::*;

use libc::{c_char, c_int};
use std::os::fd::{FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;
use zcio_core::event::{Event, EventConfig, EventPath, EventRing, Interest, Poster, Prefer};

/// Use io_uring when the kernel allows it, else epoll (the fallback is recorded).
pub const ZCIO_EVENT_PREFER_AUTO: u32 = 0;
/// io_uring only: `zcio_event_ring_new` fails with `-EOPNOTSUPP` when unavailable.
pub const ZCIO_EVENT_PREFER_URING: u32 = 1;
/// epoll (the baseline).
pub const ZCIO_EVENT_PREFER_EPOLL: u32 = 2;

/// An event ring: epoll's interface (add/modify/delete an fd with epoll interest bits and a
/// 64-bit token), with ready events harvested from shared memory. Opaque.
pub struct zcio_event_ring {
    ring: EventRing,
    owner: Owner,
    /// Made with the ring and cloned by `zcio_event_ring_poster`, which any thread may call
    /// while the owner waits: the ring then always knows a poster may post, so its waits never
    /// sleep where a post cannot wake them (a plain `epoll_wait` sleep is only taken when no
    /// poster exists; see event.md "Choice per workload").
    poster: Poster,
}

/// A handle that posts user events to one event ring from any thread. Opaque.
pub struct zcio_event_poster {
    poster: Poster,
}

/// One ready event: epoll bits (`EPOLLIN`, ...) and the registration's or poster's token.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcio_event {
    /// Ready bits, with epoll's values.
    pub events: u32,
    /// The token given to `zcio_event_ring_add` / `zcio_event_poster_post`.
    pub token: u64,
}

/// Counters of an event ring.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcio_event_stats {
    /// Events handed to the caller (fd and user-posted).
    pub events: u64,
    /// Of which user-posted.
    pub user_events: u64,
    /// All system calls the ring made.
    pub syscalls: u64,
    /// Kernel entries made to wait for or collect events.
    pub wait_entries: u64,
    /// Completions processed (io_uring backend).
    pub cqes: u64,
    /// Polls re-armed (level-triggered re-checks).
    pub rearms: u64,
    /// Poll completions with an error.
    pub poll_errors: u64,
    /// Eventfd wake-ups made by posters.
    pub poster_wakes: u64,
}

/// The thread a handle belongs to. The event ring, sender, receiver and NFQUEUE handles run
/// io_uring instances set up `SINGLE_ISSUER` (the kernel serves only the thread that created
/// them), and keep single-threaded state: their calls check the calling thread and answer
/// `-EPERM` from any other, before touching anything (a buffer passed in stays the caller's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner(u64);

impl Owner {
    /// The calling thread.
    pub(crate) fn here() -> Self {
        use std::cell::Cell;
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        thread_local! {
            static ID: Cell<u64> = const { Cell::new(0) };
        }
        Owner(ID.with(|id| {
            if id.get() == 0 {
                id.set(NEXT.fetch_add(1, Ordering::Relaxed));
            }
            id.get()
        }))
    }

    /// Whether the calling thread is this owner.
    pub(crate) fn is_here(self) -> bool {
        Self::here() == self
    }
}

thread_local! {
    /// The reason for the last failure of a call on this thread (`zcio_last_error`).
    static LAST_ERROR: std::cell::RefCell<Option<std::ffi::CString>> =
        const { std::cell::RefCell::new(None) };
}

/// Records `msg` as this thread's last error and returns `errno` (negative), for the calls
/// whose failures have a reason beyond the errno (`zcio_last_error`).
pub(crate) fn fail(errno: c_int, msg: impl std::fmt::Display) -> c_int {
    let text = msg.to_string().replace('\0', " ");
    LAST_ERROR.with(|l| *l.borrow_mut() = std::ffi::CString::new(text).ok());
    errno
}

/// Why the last call on this thread that returned a negative value failed, in words a user can
/// act on (e.g. `"queue 3: kernel refused BIND: Operation not permitted (another process
/// has bound this queue, or CAP_NET_ADMIN is missing)"`), or NULL when that call recorded no
/// reason (the errno alone says it) or none failed. Set by the NFQUEUE, NFLOG and conntrack
/// event calls; valid until the next zcio call on this thread.
///
/// Thread: any (each thread has its own).
#[no_mangle]
pub extern "C" fn zcio_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
}

pub(crate) fn guard(f: impl FnOnce() -> c_int) -> c_int {
    LAST_ERROR.with(|l| {
        if l.borrow().is_some() {
            *l.borrow_mut() = None;
        }
    });
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(-libc::ENOTRECOVERABLE)
}

pub(crate) fn neg(e: &std::io::Error) -> c_int {
    -e.raw_os_error().unwrap_or(libc::EIO)
}

/// The library version, e.g. `"0.1.0"` (static string).
///
/// Thread: any.
#[no_mangle]
pub extern "C" fn zcio_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// Creates an event ring (`prefer`: `ZCIO_EVENT_PREFER_*`) into `*out`. Use it from the
/// thread that created it. Returns 0 or `-errno` (`-EINVAL` for a bad argument,
/// `-EOPNOTSUPP` when io_uring was required but is unavailable).
///
/// Thread: any; the calling thread becomes the ring's owner. Ownership: `*out` is the caller's until `zcio_event_ring_free`.
#[no_mangle]
pub extern "C" fn zcio_event_ring_new(out: *mut *mut zcio_event_ring, prefer: u32) -> c_int {
    guard(|| {
        if out.is_null() {
            return -libc::EINVAL;
        }
        let prefer = match prefer {
            ZCIO_EVENT_PREFER_AUTO => Prefer::Auto,
            ZCIO_EVENT_PREFER_URING => Prefer::Uring,
            ZCIO_EVENT_PREFER_EPOLL => Prefer::Epoll,
            _ => return -libc::EINVAL,
        };
        let cfg = EventConfig {
            prefer,
            ..EventConfig::default()
        };
        match EventRing::with_config(&cfg) {
            Ok(ring) => {
                let b = Box::new(zcio_event_ring {
                    poster: ring.poster(),
                    ring,
                    owner: Owner::here(),
                });
                // SAFETY: `out` is non-null and points to the caller's pointer slot.
                unsafe { *out = Box::into_raw(b) };
                0
            }
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => -libc::EOPNOTSUPP,
            Err(e) => neg(&e),
        }
    })
}

/// Frees an event ring (NULL is ignored). Registered fds stay open; their polls end.
///
/// Thread: any (the ring is closed and unmapped; posters stay valid). Ownership: the handle is invalid afterwards.
#[no_mangle]
pub extern "C" fn zcio_event_ring_free(r: *mut zcio_event_ring) {
    if r.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `r` came from zcio_event_ring_new and is freed once, by contract.
        drop(unsafe { Box::from_raw(r) });
    }));
}

fn with_ring(r: *mut zcio_event_ring, f: impl FnOnce(&mut EventRing) -> c_int) -> c_int {
    if r.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `r` is a live handle from zcio_event_ring_new; only its (immutable) owner is
    // read before the thread check.
    if !unsafe { (*r).owner }.is_here() {
        return -libc::EPERM;
    }
    // SAFETY: the owner thread's exclusive use of its live handle.
    let ring = unsafe { &mut (*r).ring };
    guard(|| f(ring))
}

/// `"io_uring_epoll_wait"` (the default where the kernel has `IORING_OP_EPOLL_WAIT`),
/// `"io_uring"` (the poll ring) or `"epoll"` (static string; NULL for a NULL handle).
///
/// Thread: any (reads an immutable choice).
#[no_mangle]
pub extern "C" fn zcio_event_ring_backend(r: *const zcio_event_ring) -> *const c_char {
    if r.is_null() {
        return std::ptr::null();
    }
    // SAFETY: `r` is a live handle.
    backend_cstr(unsafe { (*r).ring.path() }).as_ptr()
}

/// `EventPath::as_str`'s names as NUL-terminated statics.
fn backend_cstr(p: EventPath) -> &'static std::ffi::CStr {
    match p {
        EventPath::Uring => c"io_uring",
        EventPath::UringEpollWait => c"io_uring_epoll_wait",
        EventPath::Epoll => c"epoll",
    }
}

fn ctl(r: *mut zcio_event_ring, op: u8, fd: c_int, events: u32, token: u64) -> c_int {
    with_ring(r, |ring| {
        let res = match op {
            0 => ring.add(fd, Interest(events), token),
            1 => ring.modify(fd, Interest(events), token),
            _ => ring.delete(fd),
        };
        match res {
            Ok(()) => 0,
            Err(e) => -e.errno(),
        }
    })
}

/// Registers `fd` for `events` (epoll bits, with `EPOLLET`, `EPOLLONESHOT`,
/// `EPOLLEXCLUSIVE`); its events carry `token`. Errors as `EPOLL_CTL_ADD`.
///
/// Thread: the owner only (`-EPERM` from any other). Ownership: `fd` stays the caller's.
#[no_mangle]
pub extern "C" fn zcio_event_ring_add(
    r: *mut zcio_event_ring,
    fd: c_int,
    events: u32,
    token: u64,
) -> c_int {
    ctl(r, 0, fd, events, token)
}

/// Changes a registration (re-enables a fired `EPOLLONESHOT`). Errors as `EPOLL_CTL_MOD`.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_event_ring_modify(
    r: *mut zcio_event_ring,
    fd: c_int,
    events: u32,
    token: u64,
) -> c_int {
    ctl(r, 1, fd, events, token)
}

/// Unregisters `fd`; its unharvested events are dropped. Errors as `EPOLL_CTL_DEL`.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_event_ring_delete(r: *mut zcio_event_ring, fd: c_int) -> c_int {
    ctl(r, 2, fd, 0, 0)
}

/// Unregisters `fd` if registered, makes the kernel drop its reference, and closes `fd`
/// (what `close` does to an epoll registration; a plain `close` would leave the poll holding
/// the file open). Takes ownership of `fd`.
///
/// Thread: the owner only (`-EPERM` from any other; `fd` is then not taken).
#[no_mangle]
pub extern "C" fn zcio_event_ring_close(r: *mut zcio_event_ring, fd: c_int) -> c_int {
    if fd < 0 {
        return -libc::EBADF;
    }
    with_ring(r, |ring| {
        // SAFETY: the caller hands over ownership of the open descriptor `fd`.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        match ring.close(owned) {
            Ok(()) => 0,
            Err(e) => neg(&e),
        }
    })
}

fn out_slice<'a>(out: *mut zcio_event, max: u32) -> Option<&'a mut [Event]> {
    if out.is_null() || max == 0 {
        return None;
    }
    // SAFETY: `out` points to `max` writable zcio_event, which has Event's layout (checked
    // below at compile time).
    Some(unsafe { std::slice::from_raw_parts_mut(out.cast::<Event>(), max as usize) })
}

const _: () = {
    assert!(std::mem::size_of::<zcio_event>() == std::mem::size_of::<Event>());
    assert!(std::mem::align_of::<zcio_event>() == std::mem::align_of::<Event>());
    assert!(std::mem::offset_of!(zcio_event, events) == std::mem::offset_of!(Event, events));
    assert!(std::mem::offset_of!(zcio_event, token) == std::mem::offset_of!(Event, token));
};

/// Like `epoll_wait`: fills up to `max` events, blocking up to `timeout_ms` (-1: forever,
/// 0: no wait). Returns the count (0: timed out) or `-errno` (`-EINTR` on a signal).
///
/// Thread: the owner only (`-EPERM` from any other). Ownership: `out` is the caller's array of `max` entries.
#[no_mangle]
pub extern "C" fn zcio_event_ring_wait(
    r: *mut zcio_event_ring,
    out: *mut zcio_event,
    max: u32,
    timeout_ms: c_int,
) -> c_int {
    let Some(out) = out_slice(out, max) else {
        return -libc::EINVAL;
    };
    let timeout = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
    with_ring(r, |ring| match ring.wait(out, timeout) {
        Ok(n) => n as c_int,
        Err(e) => neg(&e),
    })
}

/// Copies events already known to be ready, without a system call on the io_uring backend.
/// Returns the count or `-errno`.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_event_ring_harvest(
    r: *mut zcio_event_ring,
    out: *mut zcio_event,
    max: u32,
) -> c_int {
    let Some(out) = out_slice(out, max) else {
        return -libc::EINVAL;
    };
    with_ring(r, |ring| match ring.harvest(out) {
        Ok(n) => n as c_int,
        Err(e) => neg(&e),
    })
}

/// Fills `*out` with the ring's counters.
///
/// Thread: the owner only (`-EPERM` from any other: the counters are not atomic).
#[no_mangle]
pub extern "C" fn zcio_event_ring_stats(
    r: *const zcio_event_ring,
    out: *mut zcio_event_stats,
) -> c_int {
    if r.is_null() || out.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `r` is a live handle; only its (immutable) owner is read first.
    if !unsafe { (*r).owner }.is_here() {
        return -libc::EPERM;
    }
    guard(|| {
        // SAFETY: `r` is a live handle; `out` points to a writable zcio_event_stats.
        let s = unsafe { (*r).ring.stats() };
        let c = zcio_event_stats {
            events: s.events,
            user_events: s.user_events,
            syscalls: s.syscalls,
            wait_entries: s.wait_entries,
            cqes: s.cqes,
            rearms: s.rearms,
            poll_errors: s.poll_errors,
            poster_wakes: s.poster_wakes,
        };
        // SAFETY: see above.
        unsafe { *out = c };
        0
    })
}

/// A snapshot of what the event ring reports into `*out`: its backend, counters, every
/// fallback with its reason (and the per-workload wait decisions), and its event counters
/// (`stats` in the JSON). Free it with `zcio_report_free`. Returns 0, `-EINVAL` or `-EPERM`.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_event_ring_report(
    r: *mut zcio_event_ring,
    out: *mut *mut report::zcio_report,
) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    with_ring(r, |ring| {
        let mut fallbacks = ring.fallbacks().to_vec();
        fallbacks.extend(ring.decisions().iter().cloned());
        let rep = report::snapshot(
            &zcio_core::stats::Report::path(ring).to_string(),
            &zcio_core::stats::Report::counters(ring),
            &fallbacks,
            serde_json::to_value(ring.stats()).unwrap_or_default(),
        );
        report::put(out, rep)
    })
}

/// Creates a poster for the ring into `*out`: any thread may post with it, also after the
/// ring is freed (posts then go nowhere). Free it with `zcio_event_poster_free`.
///
/// Thread: any. Ownership: `*out` is the caller's until `zcio_event_poster_free`.
#[no_mangle]
pub extern "C" fn zcio_event_ring_poster(
    r: *const zcio_event_ring,
    out: *mut *mut zcio_event_poster,
) -> c_int {
    if r.is_null() || out.is_null() {
        return -libc::EINVAL;
    }
    guard(|| {
        // SAFETY: `r` is a live handle; its poster is never mutated after creation.
        let poster = unsafe { (*r).poster.clone() };
        // SAFETY: `out` is non-null.
        unsafe { *out = Box::into_raw(Box::new(zcio_event_poster { poster })) };
        0
    })
}

/// Posts a user event `(token, events)`; the ring's loop sees it in its next harvest/wait.
/// Returns 0, or `-EAGAIN` when the ring's user-event queue is full. Thread-safe.
///
/// Thread: any, concurrently.
#[no_mangle]
pub extern "C" fn zcio_event_poster_post(
    p: *const zcio_event_poster,
    token: u64,
    events: u32,
) -> c_int {
    if p.is_null() {
        return -libc::EINVAL;
    }
    guard(|| {
        // SAFETY: `p` is a live poster handle (shared use is fine: Poster is Sync).
        match unsafe { (*p).poster.post(token, events) } {
            Ok(()) => 0,
            Err(_) => -libc::EAGAIN,
        }
    })
}

/// Frees a poster (NULL is ignored).
///
/// Thread: any; each poster is freed once.
#[no_mangle]
pub extern "C" fn zcio_event_poster_free(p: *mut zcio_event_poster) {
    if p.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `p` came from zcio_event_ring_poster and is freed once.
        drop(unsafe { Box::from_raw(p) });
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_in_c_are_the_event_path_names() {
        for p in [
            EventPath::Uring,
            EventPath::UringEpollWait,
            EventPath::Epoll,
        ] {
            assert_eq!(backend_cstr(p).to_str().unwrap(), p.as_str());
        }
    }
}

//! What every handle reports, for C: the path it took, its common counters, every fallback
//! with its reason (as `zcio probe` shows them), and its own statistics as JSON. One snapshot
//! type for all capabilities.

use crate::guard;
use libc::{c_char, c_int};
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use zcio_core::stats::{Counters, Fallback, Report};

/// The common counters of a handle (`zcio::stats::Counters`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcio_counters {
    /// Payload bytes moved.
    pub bytes: u64,
    /// Operations the caller asked for (sends, receives, harvested events).
    pub ops: u64,
    /// System calls made on the caller's behalf (`io_uring_enter` included).
    pub syscalls: u64,
    /// Completion notifications processed.
    pub notifications: u64,
    /// Bytes the kernel sent or received without copying.
    pub zerocopy_bytes: u64,
    /// Bytes a zero-copy path reported as copied after all (COPIED).
    pub copied_bytes: u64,
}

/// One fallback: the path (or setting) wanted, the one taken, and why. The strings belong to
/// the report and are valid until `zcio_report_free`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct zcio_fallback {
    /// What was wanted (e.g. `"uring-zc-fixed"`).
    pub from: *const c_char,
    /// What was taken instead (e.g. `"uring-zc"`).
    pub to: *const c_char,
    /// Why, in words a user can act on.
    pub reason: *const c_char,
}

/// A snapshot of what a handle reports. Opaque; made by `zcio_*_report`, freed with
/// `zcio_report_free`.
pub struct zcio_report {
    path: CString,
    counters: zcio_counters,
    fallbacks: Vec<(CString, CString, CString)>,
    json: CString,
}

fn cstring(s: impl Into<Vec<u8>>) -> CString {
    let mut v: Vec<u8> = s.into();
    v.retain(|&b| b != 0);
    CString::new(v).expect("NUL bytes removed")
}

fn counters(c: &Counters) -> zcio_counters {
    zcio_counters {
        bytes: c.bytes,
        ops: c.ops,
        syscalls: c.syscalls,
        notifications: c.notifications,
        zerocopy_bytes: c.zerocopy_bytes,
        copied_bytes: c.copied_bytes,
    }
}

/// A snapshot of `path`, `counters`, `fallbacks` and the capability's own `stats`.
pub(crate) fn snapshot(
    path: &str,
    c: &Counters,
    fallbacks: &[Fallback],
    stats: serde_json::Value,
) -> Box<zcio_report> {
    let json = serde_json::json!({
        "path": path,
        "counters": c,
        "fallbacks": fallbacks,
        "stats": stats,
    });
    Box::new(zcio_report {
        path: cstring(path),
        counters: counters(c),
        fallbacks: fallbacks
            .iter()
            .map(|f| {
                (
                    cstring(f.from.to_string()),
                    cstring(f.to.to_string()),
                    cstring(f.reason.clone()),
                )
            })
            .collect(),
        json: cstring(json.to_string()),
    })
}

/// A snapshot of anything that implements `Report`, with its own statistics.
pub(crate) fn of<R: Report>(r: &R, stats: impl serde::Serialize) -> Box<zcio_report> {
    snapshot(
        &r.path().to_string(),
        &r.counters(),
        r.fallbacks(),
        serde_json::to_value(stats).unwrap_or(serde_json::Value::Null),
    )
}

/// Writes `report` to `*out`.
pub(crate) fn put(out: *mut *mut zcio_report, report: Box<zcio_report>) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `out` is non-null; the caller owns the report until zcio_report_free.
    unsafe { *out = Box::into_raw(report) };
    0
}

/// The path the handle takes now (e.g. `"uring-zc-fixed"`, `"bufring"`, `"io_uring_epoll_wait"`);
/// valid until `zcio_report_free`. NULL for a NULL report.
///
/// Thread: any (the report is a snapshot).
#[no_mangle]
pub extern "C" fn zcio_report_path(r: *const zcio_report) -> *const c_char {
    if r.is_null() {
        return std::ptr::null();
    }
    // SAFETY: `r` is a live report.
    unsafe { (*r).path.as_ptr() }
}

/// Fills `*out` with the counters. Returns 0 or `-EINVAL`.
///
/// Thread: any.
#[no_mangle]
pub extern "C" fn zcio_report_counters(r: *const zcio_report, out: *mut zcio_counters) -> c_int {
    if r.is_null() || out.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `r` is a live report, `out` a writable zcio_counters.
    unsafe { *out = (*r).counters };
    0
}

/// How many fallbacks the handle took.
///
/// Thread: any.
#[no_mangle]
pub extern "C" fn zcio_report_fallback_count(r: *const zcio_report) -> usize {
    if r.is_null() {
        return 0;
    }
    // SAFETY: `r` is a live report.
    unsafe { (*r).fallbacks.len() }
}

/// Fills `*out` with fallback `i` (in the order taken). Returns 0, `-ERANGE` past the last,
/// `-EINVAL` for NULL arguments.
///
/// Thread: any. Ownership: the strings belong to the report.
#[no_mangle]
pub extern "C" fn zcio_report_fallback(
    r: *const zcio_report,
    i: usize,
    out: *mut zcio_fallback,
) -> c_int {
    if r.is_null() || out.is_null() {
        return -libc::EINVAL;
    }
    guard(|| {
        // SAFETY: `r` is a live report.
        let Some((from, to, reason)) = (unsafe { &(*r).fallbacks }).get(i) else {
            return -libc::ERANGE;
        };
        // SAFETY: `out` is a writable zcio_fallback.
        unsafe {
            *out = zcio_fallback {
                from: from.as_ptr(),
                to: to.as_ptr(),
                reason: reason.as_ptr(),
            }
        };
        0
    })
}

/// The whole report as one JSON object: `{"path", "counters", "fallbacks": [{"from", "to",
/// "reason"}], "stats": {...the capability's own counters...}}`; valid until
/// `zcio_report_free`.
///
/// Thread: any.
#[no_mangle]
pub extern "C" fn zcio_report_json(r: *const zcio_report) -> *const c_char {
    if r.is_null() {
        return std::ptr::null();
    }
    // SAFETY: `r` is a live report.
    unsafe { (*r).json.as_ptr() }
}

/// Frees a report (NULL is ignored).
///
/// Thread: any; freed once.
#[no_mangle]
pub extern "C" fn zcio_report_free(r: *mut zcio_report) {
    if !r.is_null() {
        // SAFETY: `r` came from a zcio_*_report call and is freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(r) })));
    }
}

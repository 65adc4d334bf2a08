//! Audit events (`zcio::netlink::Audit`) for C: each process call hands the events that
//! completed to a callback, one call per event in the order they completed, each with its
//! records in arrival order (type and text, valid during the callback).

use crate::guard;
use libc::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;
use zcio_core::netlink::{Audit, AuditConfig, AuditError, AuditEvent, AuditMode, EventEnd};

/// `zcio_audit_open` mode: register as the audit daemon (`AUDIT_SET` pid; CAP_AUDIT_CONTROL).
pub const ZCIO_AUDIT_PRIMARY: u32 = 0;
/// `zcio_audit_open` mode: read the multicast group beside whatever daemon runs
/// (`AUDIT_NLGRP_READLOG`; CAP_AUDIT_READ).
pub const ZCIO_AUDIT_OBSERVER: u32 = 1;
/// `zcio_audit_open` flag: fail (`-EEXIST`, `-EPERM`) instead of falling back from primary to
/// observer when another daemon is registered or registering is refused.
pub const ZCIO_AUDIT_NO_FALLBACK: u32 = 1 << 8;
/// `zcio_audit_open` flag: leave the enabled flag as it is (by default a primary turns
/// auditing on, and sets it back at free).
pub const ZCIO_AUDIT_KEEP_ENABLED: u32 = 1 << 9;

/// `zcio_audit_event.end`: the kernel's end-of-event record arrived.
pub const ZCIO_AUDIT_END_EOE: u8 = 0;
/// `zcio_audit_event.end`: a single-record event (a type the kernel sends no end-of-event
/// record after).
pub const ZCIO_AUDIT_END_SINGLE: u8 = 1;
/// `zcio_audit_event.end`: closed after waiting for its end-of-event record (or at flush).
pub const ZCIO_AUDIT_END_WAIT: u8 = 2;

/// An audit consumer. Opaque; one thread at a time.
pub struct zcio_audit {
    audit: Audit,
    owner: crate::Owner,
    /// The records of the event being handed over (reused).
    recs: Vec<zcio_audit_record>,
    /// The last loss summary, NUL-terminated.
    summary: Vec<u8>,
}

/// One record of an event, valid during the callback only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct zcio_audit_record {
    /// Record type (`AUDIT_SYSCALL` = 1300, `AUDIT_PATH` = 1302, ...).
    pub record_type: u16,
    /// The whole text, `audit(sec.msec:serial): ` header included (what auditd writes after
    /// `msg=`); not NUL-terminated.
    pub text: *const c_char,
    /// Its length.
    pub text_len: usize,
    /// The fields after the header (`key=value ...`, as the kernel wrote them, hex-encoded
    /// values not decoded): a suffix of `text`.
    pub body: *const c_char,
    /// Its length.
    pub body_len: usize,
}

/// One event, valid during the callback only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct zcio_audit_event {
    /// The serial number every record of the event has.
    pub serial: u64,
    /// Time stamp: seconds (Unix time).
    pub sec: u64,
    /// Time stamp: milliseconds.
    pub msec: u16,
    /// How it was closed: `ZCIO_AUDIT_END_EOE`, `_SINGLE` or `_WAIT`.
    pub end: u8,
    /// Whether records of the event are known to be missing (a syscall event without its
    /// `SYSCALL` or end-of-event record: the kernel dropped them).
    pub incomplete: u8,
    /// The records, in arrival order (the end-of-event record not among them).
    pub records: *const zcio_audit_record,
    /// How many.
    pub nrecords: usize,
}

/// Counters of an audit consumer.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcio_audit_stats {
    /// `ZCIO_AUDIT_PRIMARY` or `ZCIO_AUDIT_OBSERVER` (after any fallback).
    pub mode: u32,
    /// Whether `kernel_lost_at_open` and `kernel_lost_now` were read (`AUDIT_GET` needs
    /// CAP_AUDIT_CONTROL).
    pub has_kernel_lost: u32,
    /// The kernel's `lost` counter (host-wide, records) when the consumer opened.
    pub kernel_lost_at_open: u32,
    /// The kernel's `lost` counter now.
    pub kernel_lost_now: u32,
    /// Records lost, at least: the kernel's `lost` growth since open (primary) or the
    /// socket's drops (observer); `AuditStats::loss` in the Rust docs says why.
    pub lost_at_least: u64,
    /// Whether `lost_at_least` is exact (0: a lower bound; the report's JSON says why, in
    /// `stats.loss` and the fallbacks).
    pub lost_exact: u32,
    /// Records taken.
    pub records: u64,
    /// Events handed over.
    pub events: u64,
    /// Of which closed by their end-of-event record.
    pub eoe: u64,
    /// Of which single-record events.
    pub single: u64,
    /// Of which closed after the wait for their end-of-event record.
    pub waited: u64,
    /// Events known to miss records.
    pub incomplete: u64,
    /// Events closed early because too many were open.
    pub evicted: u64,
    /// Events still open.
    pub open_events: u64,
    /// The socket's drops: observer, records its full receive buffer dropped (exact);
    /// primary, sends the kernel failed after 1/10 s and retries (not records lost).
    pub kernel_drops: u64,
    /// Datagrams received.
    pub datagrams: u64,
    /// Receive syscalls.
    pub syscalls: u64,
    /// Records that did not parse.
    pub parse_errors: u64,
}

/// Handles one event; its return value is ignored (return 0).
pub type zcio_audit_callback =
    Option<extern "C" fn(ev: *const zcio_audit_event, user: *mut c_void) -> c_int>;

fn audit_errno(e: &AuditError) -> c_int {
    let errno = match e {
        AuditError::Socket { source, .. } | AuditError::Refused { source, .. } => {
            -source.raw_os_error().unwrap_or(libc::EIO)
        }
        AuditError::Parse(_) => -libc::EPROTO,
        AuditError::Frames(_) => -libc::EIO,
    };
    crate::fail(errno, e)
}

/// Opens an audit consumer into `*out`: `ZCIO_AUDIT_PRIMARY` or `ZCIO_AUDIT_OBSERVER`, with
/// the flags `ZCIO_AUDIT_NO_FALLBACK` and `ZCIO_AUDIT_KEEP_ENABLED`; a primary sets the
/// kernel's `backlog_limit` to `backlog_limit` when it is not 0. What a primary changed (the
/// registered pid, the enabled flag, the backlog limit) is set back at `zcio_audit_free`.
/// Audit exists only in the initial network namespace. Returns 0 or `-errno` (`-EEXIST`:
/// another daemon is registered, with `ZCIO_AUDIT_NO_FALLBACK`; `-EPERM`: a capability is
/// missing; `-EPROTONOSUPPORT`: audit compiled out; `zcio_last_error` says which).
///
/// Thread: any; the calling thread becomes the owner. Ownership: `*out` until `zcio_audit_free`.
#[no_mangle]
pub extern "C" fn zcio_audit_open(
    out: *mut *mut zcio_audit,
    flags: u32,
    backlog_limit: u32,
) -> c_int {
    if out.is_null() || flags & !(1 | ZCIO_AUDIT_NO_FALLBACK | ZCIO_AUDIT_KEEP_ENABLED) != 0 {
        return -libc::EINVAL;
    }
    guard(|| {
        let cfg = AuditConfig {
            mode: if flags & ZCIO_AUDIT_OBSERVER != 0 {
                AuditMode::Observer
            } else {
                AuditMode::Primary
            },
            fallback: flags & ZCIO_AUDIT_NO_FALLBACK == 0,
            enable: flags & ZCIO_AUDIT_KEEP_ENABLED == 0,
            backlog_limit: (backlog_limit != 0).then_some(backlog_limit),
            ..AuditConfig::default()
        };
        match Audit::open(cfg) {
            Ok(audit) => {
                // SAFETY: `out` is non-null.
                unsafe {
                    *out = Box::into_raw(Box::new(zcio_audit {
                        audit,
                        owner: crate::Owner::here(),
                        recs: Vec::new(),
                        summary: Vec::new(),
                    }))
                };
                0
            }
            Err(e) => audit_errno(&e),
        }
    })
}

/// Unregisters (primary), sets back what open changed, and frees (NULL is ignored). Events
/// still open are not handed over: call `zcio_audit_flush` first.
///
/// Thread: the owner (its ring is bound to it); freed once.
#[no_mangle]
pub extern "C" fn zcio_audit_free(a: *mut zcio_audit) {
    if !a.is_null() {
        // SAFETY: `a` came from zcio_audit_open and is freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(a) })));
    }
}

/// Calls `cb` with `ev` as C sees it, its records in `recs`.
fn hand_over(
    ev: &AuditEvent,
    recs: &mut Vec<zcio_audit_record>,
    cb: extern "C" fn(*const zcio_audit_event, *mut c_void) -> c_int,
    user: *mut c_void,
) {
    recs.clear();
    recs.extend(ev.records().map(|r| zcio_audit_record {
        record_type: r.ty,
        text: r.text.as_ptr().cast(),
        text_len: r.text.len(),
        body: r.body.as_ptr().cast(),
        body_len: r.body.len(),
    }));
    let c = zcio_audit_event {
        serial: ev.serial,
        sec: ev.sec,
        msec: ev.msec,
        end: match ev.end {
            EventEnd::Eoe => ZCIO_AUDIT_END_EOE,
            EventEnd::Single => ZCIO_AUDIT_END_SINGLE,
            EventEnd::Wait => ZCIO_AUDIT_END_WAIT,
        },
        incomplete: u8::from(ev.incomplete()),
        records: recs.as_ptr(),
        nrecords: recs.len(),
    };
    cb(&c, user);
}

/// The handle of a call that checked its arguments and its thread.
fn owned<'a>(a: *mut zcio_audit) -> Result<&'a mut zcio_audit, c_int> {
    if a.is_null() {
        return Err(-libc::EINVAL);
    }
    // SAFETY: `a` is a live handle; only its (immutable) owner is read first.
    if !unsafe { (*a).owner }.is_here() {
        return Err(-libc::EPERM);
    }
    // SAFETY: the owner thread's exclusive use of its live handle.
    Ok(unsafe { &mut *a })
}

/// Receives what is ready (waiting up to `timeout_ms`, -1: until an event completes), groups
/// the records into events and calls `cb` for each event that completed, in the order they
/// completed. Returns the number of events handled or `-errno`.
///
/// Thread: the owner only (`-EPERM` from any other). `cb` runs on that thread, inside this call; the event and its records are valid during the callback only.
#[no_mangle]
pub extern "C" fn zcio_audit_process(
    a: *mut zcio_audit,
    timeout_ms: c_int,
    cb: zcio_audit_callback,
    user: *mut c_void,
) -> c_int {
    let Some(cb) = cb else {
        return -libc::EINVAL;
    };
    let s = match owned(a) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let timeout = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
    guard(|| {
        let (audit, recs) = (&mut s.audit, &mut s.recs);
        match audit.process(timeout, |ev| hand_over(ev, recs, cb, user)) {
            Ok(n) => n.min(i32::MAX as usize) as c_int,
            Err(e) => audit_errno(&e),
        }
    })
}

/// Closes every event still open (their end-of-event records may still come: call at exit)
/// and calls `cb` for each. Returns the number handled or `-errno`.
///
/// Thread: the owner only (`-EPERM` from any other). `cb` runs on that thread, inside this call; the event and its records are valid during the callback only.
#[no_mangle]
pub extern "C" fn zcio_audit_flush(
    a: *mut zcio_audit,
    cb: zcio_audit_callback,
    user: *mut c_void,
) -> c_int {
    let Some(cb) = cb else {
        return -libc::EINVAL;
    };
    let s = match owned(a) {
        Ok(s) => s,
        Err(e) => return e,
    };
    guard(|| {
        let (audit, recs) = (&mut s.audit, &mut s.recs);
        audit
            .flush(|ev| hand_over(ev, recs, cb, user))
            .min(i32::MAX as usize) as c_int
    })
}

/// Fills `*out` with the counters (reads the socket's drop counter and the kernel's `lost`:
/// a `getsockopt` and an `AUDIT_GET` request).
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_audit_get_stats(a: *mut zcio_audit, out: *mut zcio_audit_stats) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    let s = match owned(a) {
        Ok(s) => s,
        Err(e) => return e,
    };
    guard(|| {
        let st = s.audit.stats();
        let lost = st.kernel_lost_at_open.zip(st.kernel_lost_now);
        let c = zcio_audit_stats {
            mode: match s.audit.mode() {
                AuditMode::Primary => ZCIO_AUDIT_PRIMARY,
                AuditMode::Observer => ZCIO_AUDIT_OBSERVER,
            },
            has_kernel_lost: u32::from(lost.is_some()),
            kernel_lost_at_open: lost.map_or(0, |l| l.0),
            kernel_lost_now: lost.map_or(0, |l| l.1),
            lost_at_least: st.loss.at_least,
            lost_exact: u32::from(st.loss.exact),
            records: st.events.records,
            events: st.events.events,
            eoe: st.events.eoe,
            single: st.events.single,
            waited: st.events.waited,
            incomplete: st.events.incomplete,
            evicted: st.events.evicted,
            open_events: st.open_events,
            kernel_drops: st.stream.kernel_drops,
            datagrams: st.stream.datagrams,
            syscalls: st.stream.syscalls,
            parse_errors: st.stream.parse_errors,
        };
        // SAFETY: `out` points to a writable zcio_audit_stats.
        unsafe { *out = c };
        0
    })
}

/// The loss in one sentence, NUL-terminated (what `zcio audit` prints at exit: what is exact,
/// what is a bound): valid until the next call on the handle or its free. Reads the counters
/// as `zcio_audit_get_stats` does. NULL on a bad handle or from another thread.
///
/// Thread: the owner only (NULL from any other).
#[no_mangle]
pub extern "C" fn zcio_audit_loss_summary(a: *mut zcio_audit) -> *const c_char {
    let Ok(s) = owned(a) else {
        return std::ptr::null();
    };
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut line = s.audit.stats().loss_summary().into_bytes();
        line.retain(|&b| b != 0);
        line.push(0);
        line
    }));
    match r {
        Ok(line) => {
            s.summary = line;
            s.summary.as_ptr().cast()
        }
        Err(_) => std::ptr::null(),
    }
}

/// How the consumer receives: `"frame-ring+io_uring"` or `"frame-ring+recvmmsg"` (static).
///
/// Thread: any (static string).
#[no_mangle]
pub extern "C" fn zcio_audit_path(a: *const zcio_audit) -> *const c_char {
    if a.is_null() {
        return std::ptr::null();
    }
    // SAFETY: `a` is a live handle.
    crate::nfq::path_cstr(unsafe { (*a).audit.path() }).as_ptr()
}

/// A snapshot of what the handle reports into `*out`: its path, counters (`ops` = events),
/// every fallback with its reason (primary to observer, the kernel's lost counter unreadable,
/// receive buffer sizing, ring set-up), and its audit counters (mode, records, events by how
/// they closed, incomplete events, the kernel's `lost` at open and now, `loss`: `at_least`,
/// `at_most`, `exact`) as `stats` in the JSON. Free it with `zcio_report_free`. Returns 0,
/// `-EINVAL` or `-EPERM`.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_audit_report(
    a: *mut zcio_audit,
    out: *mut *mut crate::report::zcio_report,
) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    let s = match owned(a) {
        Ok(s) => s,
        Err(e) => return e,
    };
    guard(|| {
        let st = s.audit.stats();
        crate::report::put(out, crate::report::of(&s.audit, st))
    })
}

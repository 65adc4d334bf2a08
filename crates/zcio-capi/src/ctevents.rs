//! Conntrack events (`zcio::netlink::CtEvents`) for C: every NEW/UPDATE/DESTROY event is
//! handed to a callback in arrival order as a flat struct, optionally with its `conntrack -E`
//! line.

use crate::guard;
use libc::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;
use zcio_core::netlink::{CtError, CtEvent, CtEventKind, CtEvents, CtEventsConfig, Tuple};

/// Event kind: a new entry.
pub const ZCIO_CT_NEW: u32 = 1;
/// Event kind: an entry changed.
pub const ZCIO_CT_UPDATE: u32 = 2;
/// Event kind: an entry was destroyed.
pub const ZCIO_CT_DESTROY: u32 = 4;
/// `zcio_ctevents_open` flag: give each event its `conntrack -E` line (`zcio_ct_event.line`).
pub const ZCIO_CT_LINES: u32 = 1 << 8;

/// A conntrack event subscriber. Opaque; one thread at a time.
pub struct zcio_ctevents {
    ev: CtEvents,
    owner: crate::Owner,
    lines: bool,
    line: String,
}

/// One direction of a connection. Addresses are in network byte order: 4 bytes for IPv4, 16
/// for IPv6.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcio_ct_tuple {
    /// Source address.
    pub src: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
    /// Layer-4 protocol number.
    pub proto: u8,
    /// ICMP type (ICMP/ICMPv6).
    pub icmp_type: u8,
    /// ICMP code.
    pub icmp_code: u8,
    /// Whether the ports are set.
    pub has_ports: u8,
    /// Source port (host order).
    pub sport: u16,
    /// Destination port (host order).
    pub dport: u16,
    /// ICMP id (host order).
    pub icmp_id: u16,
    /// Packets counted in this direction (with `nf_conntrack_acct`; see `has_counters`).
    pub packets: u64,
    /// Bytes counted in this direction.
    pub bytes: u64,
}

/// One event, valid during the callback only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct zcio_ct_event {
    /// `ZCIO_CT_NEW`, `ZCIO_CT_UPDATE` or `ZCIO_CT_DESTROY`.
    pub kind: u32,
    /// Address family (2 IPv4, 10 IPv6).
    pub family: u8,
    /// TCP state (`TCP_CONNTRACK_*`; 0 when not TCP).
    pub tcp_state: u8,
    /// Whether the tuples carry counters.
    pub has_counters: u8,
    /// Whether `timeout` is set.
    pub has_timeout: u8,
    /// Original direction.
    pub orig: zcio_ct_tuple,
    /// Reply direction.
    pub reply: zcio_ct_tuple,
    /// `IPS_*` status bits.
    pub status: u32,
    /// Seconds until it expires.
    pub timeout: u32,
    /// Connection mark (0 when none).
    pub mark: u32,
    /// Entry id.
    pub id: u32,
    /// Zone (0: the default).
    pub zone: u16,
    /// Port id of the process whose request caused the event (0: traffic or a timeout).
    pub portid: u32,
    /// Start time, ns since the epoch (0 without `nf_conntrack_timestamp`).
    pub start_ns: u64,
    /// Stop time, ns (destroyed entries).
    pub stop_ns: u64,
    /// The `conntrack -E` line, NUL-terminated (with `ZCIO_CT_LINES`; NULL otherwise).
    pub line: *const c_char,
}

/// Counters of a subscriber.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcio_ctevents_stats {
    /// Events received.
    pub events: u64,
    /// NEW events.
    pub new_events: u64,
    /// UPDATE events.
    pub update_events: u64,
    /// DESTROY events.
    pub destroy_events: u64,
    /// Events the kernel dropped at the socket (exact). The report's JSON adds what overruns
    /// say beyond it (`stats.loss`: `at_least`, `at_most`, `exact`).
    pub lost: u64,
    /// Overruns reported by the socket (ENOBUFS).
    pub overruns: u64,
    /// Receive syscalls.
    pub syscalls: u64,
}

/// Handles one event; its return value is ignored (return 0).
pub type zcio_ct_callback =
    Option<extern "C" fn(ev: *const zcio_ct_event, user: *mut c_void) -> c_int>;

fn ct_errno(e: &CtError) -> c_int {
    let errno = match e {
        CtError::Socket { source, .. } => -source.raw_os_error().unwrap_or(libc::EIO),
        CtError::NothingSelected => -libc::EINVAL,
        CtError::Frames(_) => -libc::EIO,
    };
    crate::fail(errno, e)
}

/// Subscribes into `*out` to the event kinds in `flags` (`ZCIO_CT_NEW | ZCIO_CT_UPDATE |
/// ZCIO_CT_DESTROY`, plus `ZCIO_CT_LINES`), with a receive buffer of `rcvbuf` bytes (0: 8 MiB).
/// Needs CAP_NET_ADMIN. Returns 0 or `-errno`.
///
/// Thread: any; the calling thread becomes the owner. Ownership: `*out` until `zcio_ctevents_free`.
#[no_mangle]
pub extern "C" fn zcio_ctevents_open(
    out: *mut *mut zcio_ctevents,
    flags: u32,
    rcvbuf: usize,
) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    guard(|| {
        let cfg = CtEventsConfig {
            new: flags & ZCIO_CT_NEW != 0,
            update: flags & ZCIO_CT_UPDATE != 0,
            destroy: flags & ZCIO_CT_DESTROY != 0,
            rcvbuf: Some((if rcvbuf == 0 { 8 << 20 } else { rcvbuf }, true)),
            ..CtEventsConfig::default()
        };
        match CtEvents::open(cfg) {
            Ok(ev) => {
                // SAFETY: `out` is non-null.
                unsafe {
                    *out = Box::into_raw(Box::new(zcio_ctevents {
                        ev,
                        owner: crate::Owner::here(),
                        lines: flags & ZCIO_CT_LINES != 0,
                        line: String::with_capacity(512),
                    }))
                };
                0
            }
            Err(e) => ct_errno(&e),
        }
    })
}

/// Unsubscribes and frees (NULL is ignored).
///
/// Thread: the owner (its ring is bound to it); freed once.
#[no_mangle]
pub extern "C" fn zcio_ctevents_free(c: *mut zcio_ctevents) {
    if !c.is_null() {
        // SAFETY: `c` came from zcio_ctevents_open and is freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(c) })));
    }
}

fn tuple(t: Option<&Tuple>, counters: Option<zcio_core::netlink::CtCounters>) -> zcio_ct_tuple {
    let Some(t) = t else {
        return zcio_ct_tuple::default();
    };
    let addr = |a: std::net::IpAddr| {
        let mut b = [0u8; 16];
        match a {
            std::net::IpAddr::V4(x) => b[..4].copy_from_slice(&x.octets()),
            std::net::IpAddr::V6(x) => b.copy_from_slice(&x.octets()),
        }
        b
    };
    let c = counters.unwrap_or_default();
    zcio_ct_tuple {
        src: addr(t.src),
        dst: addr(t.dst),
        proto: t.proto,
        icmp_type: t.icmp_type.unwrap_or(0),
        icmp_code: t.icmp_code.unwrap_or(0),
        has_ports: u8::from(t.src_port.is_some()),
        sport: t.src_port.unwrap_or(0),
        dport: t.dst_port.unwrap_or(0),
        icmp_id: t.icmp_id.unwrap_or(0),
        packets: c.packets,
        bytes: c.bytes,
    }
}

fn to_c(e: &CtEvent<'_>, line: *const c_char) -> zcio_ct_event {
    let c = &e.ct;
    zcio_ct_event {
        kind: match e.kind {
            CtEventKind::New => ZCIO_CT_NEW,
            CtEventKind::Update => ZCIO_CT_UPDATE,
            CtEventKind::Destroy => ZCIO_CT_DESTROY,
        },
        family: e.family,
        tcp_state: c.tcp.map_or(0, |t| t.state),
        has_counters: u8::from(c.counters_orig.is_some()),
        has_timeout: u8::from(c.timeout.is_some()),
        orig: tuple(c.orig.as_ref(), c.counters_orig),
        reply: tuple(c.reply.as_ref(), c.counters_reply),
        status: c.status.unwrap_or(0),
        timeout: c.timeout.unwrap_or(0),
        mark: c.mark.unwrap_or(0),
        id: c.id.unwrap_or(0),
        zone: c.zone.unwrap_or(0),
        portid: e.portid,
        start_ns: c.timestamp.map_or(0, |t| t.start),
        stop_ns: c.timestamp.and_then(|t| t.stop).unwrap_or(0),
        line,
    }
}

/// Receives what is ready (waiting up to `timeout_ms`, -1: forever) and calls `cb` for each
/// event in arrival order. Returns the number of events handled or `-errno`.
///
/// Thread: the owner only (`-EPERM` from any other). `cb` runs on that thread, inside this call; the event it sees is valid during the callback only.
#[no_mangle]
pub extern "C" fn zcio_ctevents_process(
    c: *mut zcio_ctevents,
    timeout_ms: c_int,
    cb: zcio_ct_callback,
    user: *mut c_void,
) -> c_int {
    let Some(cb) = cb else {
        return -libc::EINVAL;
    };
    if c.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `c` is a live handle; only its (immutable) owner is read first.
    if !unsafe { (*c).owner }.is_here() {
        return -libc::EPERM;
    }
    // SAFETY: the owner thread's exclusive use of its live handle.
    let s = unsafe { &mut *c };
    let timeout = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
    guard(|| {
        let (ev, lines, line) = (&mut s.ev, s.lines, &mut s.line);
        let r = ev.process(timeout, |e| {
            let ptr = if lines {
                line.clear();
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                let _ = e.write_conntrack(line, false, now);
                line.push('\0');
                line.as_ptr().cast()
            } else {
                std::ptr::null()
            };
            cb(&to_c(e, ptr), user);
        });
        match r {
            Ok(n) => n.min(i32::MAX as usize) as c_int,
            Err(e) => ct_errno(&e),
        }
    })
}

/// Fills `*out` with the counters (reads the socket's drop counter: one `getsockopt`).
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_ctevents_get_stats(
    c: *const zcio_ctevents,
    out: *mut zcio_ctevents_stats,
) -> c_int {
    if c.is_null() || out.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `c` is a live handle; only its (immutable) owner is read first.
    if !unsafe { (*c).owner }.is_here() {
        return -libc::EPERM;
    }
    guard(|| {
        // SAFETY: the owner's live handle.
        let st = unsafe { (*c).ev.stats() };
        let v = zcio_ctevents_stats {
            events: st.events,
            new_events: st.new,
            update_events: st.update,
            destroy_events: st.destroy,
            lost: st.lost(),
            overruns: st.stream.overruns,
            syscalls: st.stream.syscalls,
        };
        // SAFETY: `out` points to a writable zcio_ctevents_stats.
        unsafe { *out = v };
        0
    })
}

/// How the subscriber receives: `"frame-ring+io_uring"` or `"frame-ring+recvmmsg"` (static).
///
/// Thread: any (static string).
#[no_mangle]
pub extern "C" fn zcio_ctevents_path(c: *const zcio_ctevents) -> *const c_char {
    if c.is_null() {
        return std::ptr::null();
    }
    // SAFETY: `c` is a live handle.
    crate::nfq::path_cstr(unsafe { (*c).ev.path() }).as_ptr()
}

/// A snapshot of what the handle reports into `*out`: its path, counters, every fallback with
/// its reason (receive buffer sizing, ring set-up), and its conntrack counters (new, update, destroy events) as `stats` in the JSON. Free it
/// with `zcio_report_free`. Returns 0, `-EINVAL` or `-EPERM`.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_ctevents_report(
    c: *mut zcio_ctevents,
    out: *mut *mut crate::report::zcio_report,
) -> c_int {
    if c.is_null() || out.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `c` is a live handle; only its (immutable) owner is read first.
    if !unsafe { (*c).owner }.is_here() {
        return -libc::EPERM;
    }
    // SAFETY: the owner thread's use of its live handle.
    let h = unsafe { &(*c).ev };
    guard(|| crate::report::put(out, crate::report::of(h, h.stats())))
}

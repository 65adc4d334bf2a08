//! The NFLOG consumer (`zcio::netlink::NfLog`) for C: logged packets are handed to a callback
//! in arrival order, their bytes pointing into the frame ring (valid during the callback).

use crate::guard;
use libc::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;
use zcio_core::netlink::{CopyMode, LogPacket, NfLog, NfLogConfig, NfLogError};

/// An NFLOG consumer bound to one or more groups. Opaque; one thread at a time.
pub struct zcio_nflog {
    log: NfLog,
    owner: crate::Owner,
}

/// One logged packet, valid during the callback only. A `has_*` field says whether the
/// value beside it was sent by the kernel.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct zcio_nflog_packet {
    /// The group it was logged to.
    pub group: u16,
    /// Link-layer protocol (`ETH_P_IP`, ...), host order.
    pub hw_protocol: u16,
    /// Address family of the hook (2 IPv4, 10 IPv6, 7 bridge).
    pub family: u8,
    /// Netfilter hook (0 PREROUTING, 1 INPUT, 2 FORWARD, 3 OUTPUT, 4 POSTROUTING).
    pub hook: u8,
    /// Whether `mark` is set.
    pub has_mark: u8,
    /// Whether `seq` is set.
    pub has_seq: u8,
    /// Whether `ts_sec`/`ts_usec` are set (PREROUTING, INPUT, FORWARD only).
    pub has_timestamp: u8,
    /// Whether `uid`/`gid` are set.
    pub has_uid: u8,
    /// Packet mark.
    pub mark: u32,
    /// Per-group sequence number.
    pub seq: u32,
    /// Input interface index (0: none).
    pub indev: u32,
    /// Output interface index (0: none).
    pub outdev: u32,
    /// Owner of the local socket.
    pub uid: u32,
    /// Group of that owner.
    pub gid: u32,
    /// Receive time, seconds since the epoch.
    pub ts_sec: u64,
    /// Receive time, microseconds.
    pub ts_usec: u32,
    /// The rule's prefix (not NUL-terminated), or NULL.
    pub prefix: *const c_char,
    /// Its length.
    pub prefix_len: usize,
    /// The packet (network header onwards, cut to the copy range), or NULL.
    pub payload: *const c_void,
    /// Its length.
    pub payload_len: usize,
}

/// Counters of an NFLOG consumer.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcio_nflog_stats {
    /// Packets received.
    pub packets: u64,
    /// Messages missing in the groups' sequence numbers (exact). A loss after the last message
    /// that arrived shows in no gap: the report's JSON gives what is known (`stats.loss`:
    /// `at_least`, `at_most`, `exact`; `stats.tail_batches`).
    pub lost: u64,
    /// Sequence gaps.
    pub seq_gaps: u64,
    /// Overruns reported by the socket (ENOBUFS).
    pub overruns: u64,
    /// Batches the kernel dropped at the socket (receive buffer full).
    pub kernel_drops: u64,
    /// Datagrams received.
    pub datagrams: u64,
    /// Receive syscalls.
    pub syscalls: u64,
    /// Messages that did not parse.
    pub parse_errors: u64,
}

/// Handles one packet; its return value is ignored (return 0).
pub type zcio_nflog_callback =
    Option<extern "C" fn(pkt: *const zcio_nflog_packet, user: *mut c_void) -> c_int>;

fn nflog_errno(e: &NfLogError) -> c_int {
    let errno = match e {
        NfLogError::Socket { source, .. } | NfLogError::Config { source, .. } => {
            -source.raw_os_error().unwrap_or(libc::EIO)
        }
        NfLogError::Invalid(_) => -libc::EINVAL,
        _ => -libc::EIO,
    };
    crate::fail(errno, e)
}

/// Binds the `ngroups` groups of `groups` into `*out`, copying `copy_range` bytes of each
/// packet (0: metadata only; at most 65531). Needs CAP_NET_ADMIN. Returns 0 or `-errno`
/// (`-EPERM`: a group is bound by another socket — the kernel answers EPERM for that too, on
/// 6.18 — or CAP_NET_ADMIN is missing; `-EINVAL`: a bad argument; `zcio_last_error` says
/// which).
///
/// Thread: any; the calling thread becomes the owner. Ownership: `*out` until `zcio_nflog_free`.
#[no_mangle]
pub extern "C" fn zcio_nflog_open(
    out: *mut *mut zcio_nflog,
    groups: *const u16,
    ngroups: usize,
    copy_range: u32,
) -> c_int {
    if out.is_null() || groups.is_null() || ngroups == 0 || ngroups > 65536 {
        return -libc::EINVAL;
    }
    // SAFETY: `groups` points to `ngroups` readable u16 (the caller's contract; non-null).
    let groups = unsafe { std::slice::from_raw_parts(groups, ngroups) }.to_vec();
    guard(|| {
        let cfg = NfLogConfig {
            groups,
            copy: if copy_range == 0 {
                CopyMode::Meta
            } else {
                CopyMode::Packet(copy_range)
            },
            ..NfLogConfig::default()
        };
        match NfLog::open(cfg) {
            Ok(log) => {
                // SAFETY: `out` is non-null.
                unsafe {
                    *out = Box::into_raw(Box::new(zcio_nflog {
                        log,
                        owner: crate::Owner::here(),
                    }))
                };
                0
            }
            Err(e) => nflog_errno(&e),
        }
    })
}

/// Unbinds and frees (NULL is ignored).
///
/// Thread: the owner (its ring is bound to it); freed once.
#[no_mangle]
pub extern "C" fn zcio_nflog_free(l: *mut zcio_nflog) {
    if !l.is_null() {
        // SAFETY: `l` came from zcio_nflog_open and is freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(l) })));
    }
}

fn to_c(p: &LogPacket<'_>) -> zcio_nflog_packet {
    let payload = p.payload.unwrap_or(&[]);
    let prefix = p.prefix.unwrap_or(&[]);
    let (ts_sec, ts_usec) = p.timestamp.unwrap_or((0, 0));
    zcio_nflog_packet {
        group: p.group,
        hw_protocol: p.hw_protocol,
        family: p.family,
        hook: p.hook,
        has_mark: u8::from(p.mark.is_some()),
        has_seq: u8::from(p.seq.is_some()),
        has_timestamp: u8::from(p.timestamp.is_some()),
        has_uid: u8::from(p.uid.is_some()),
        mark: p.mark.unwrap_or(0),
        seq: p.seq.unwrap_or(0),
        indev: p.indev.unwrap_or(0),
        outdev: p.outdev.unwrap_or(0),
        uid: p.uid.unwrap_or(0),
        gid: p.gid.unwrap_or(0),
        ts_sec,
        ts_usec: ts_usec.min(u64::from(u32::MAX)) as u32,
        prefix: if p.prefix.is_some() {
            prefix.as_ptr().cast()
        } else {
            std::ptr::null()
        },
        prefix_len: prefix.len(),
        payload: if payload.is_empty() {
            std::ptr::null()
        } else {
            payload.as_ptr().cast()
        },
        payload_len: payload.len(),
    }
}

/// Receives what is ready (waiting up to `timeout_ms`, -1: forever) and calls `cb` for each
/// logged packet in arrival order. Returns the number of packets handled or `-errno`.
///
/// Thread: the owner only (`-EPERM` from any other). `cb` runs on that thread, inside this call; the packet it sees is valid during the callback only.
#[no_mangle]
pub extern "C" fn zcio_nflog_process(
    l: *mut zcio_nflog,
    timeout_ms: c_int,
    cb: zcio_nflog_callback,
    user: *mut c_void,
) -> c_int {
    let Some(cb) = cb else {
        return -libc::EINVAL;
    };
    if l.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `l` is a live handle; only its (immutable) owner is read first.
    if !unsafe { (*l).owner }.is_here() {
        return -libc::EPERM;
    }
    // SAFETY: the owner thread's exclusive use of its live handle.
    let log = unsafe { &mut (*l).log };
    let timeout = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
    guard(|| {
        match log.process(timeout, |p| {
            let c = to_c(p);
            cb(&c, user);
        }) {
            Ok(n) => n.min(i32::MAX as usize) as c_int,
            Err(e) => nflog_errno(&e),
        }
    })
}

/// Fills `*out` with the counters (reads the socket's drop counter: one `getsockopt`).
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_nflog_get_stats(l: *const zcio_nflog, out: *mut zcio_nflog_stats) -> c_int {
    if l.is_null() || out.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `l` is a live handle; only its (immutable) owner is read first.
    if !unsafe { (*l).owner }.is_here() {
        return -libc::EPERM;
    }
    guard(|| {
        // SAFETY: the owner's live handle.
        let st = unsafe { (*l).log.stats() };
        let c = zcio_nflog_stats {
            packets: st.packets,
            lost: st.lost,
            seq_gaps: st.seq_gaps,
            overruns: st.stream.overruns,
            kernel_drops: st.stream.kernel_drops,
            datagrams: st.stream.datagrams,
            syscalls: st.stream.syscalls,
            parse_errors: st.stream.parse_errors,
        };
        // SAFETY: `out` points to a writable zcio_nflog_stats.
        unsafe { *out = c };
        0
    })
}

/// How the consumer receives: `"frame-ring+io_uring"` or `"frame-ring+recvmmsg"` (static).
///
/// Thread: any (static string).
#[no_mangle]
pub extern "C" fn zcio_nflog_path(l: *const zcio_nflog) -> *const c_char {
    if l.is_null() {
        return std::ptr::null();
    }
    // SAFETY: `l` is a live handle.
    crate::nfq::path_cstr(unsafe { (*l).log.path() }).as_ptr()
}

/// A snapshot of what the handle reports into `*out`: its path, counters, every fallback with
/// its reason (receive buffer sizing, ring set-up), and its NFLOG counters (packets, sequence gaps, losses per group) as `stats` in the JSON. Free it
/// with `zcio_report_free`. Returns 0, `-EINVAL` or `-EPERM`.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_nflog_report(
    l: *mut zcio_nflog,
    out: *mut *mut crate::report::zcio_report,
) -> c_int {
    if l.is_null() || out.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `l` is a live handle; only its (immutable) owner is read first.
    if !unsafe { (*l).owner }.is_here() {
        return -libc::EPERM;
    }
    // SAFETY: the owner thread's use of its live handle.
    let h = unsafe { &(*l).log };
    guard(|| crate::report::put(out, crate::report::of(h, h.stats())))
}

//! The NFQUEUE consumer (`zcio::netlink::NfQueue`) for C: packets are handed to a callback in
//! id order, decided by its return value, and the verdicts go out in batches.

use crate::guard;
use libc::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;
use zcio_core::netlink::{Decision, NfQueue, NfQueueConfig, NfqError, Packet, Verdict};

/// Verdict: drop the packet (`NF_DROP`).
pub const ZCIO_NF_DROP: u32 = 0;
/// Verdict: let it continue (`NF_ACCEPT`).
pub const ZCIO_NF_ACCEPT: u32 = 1;
/// Verdict: send it to queue `n` (`NF_QUEUE | n << 16`).
pub const ZCIO_NF_QUEUE: u32 = 3;
/// Verdict: re-run the hook (`NF_REPEAT`).
pub const ZCIO_NF_REPEAT: u32 = 4;

/// An NFQUEUE consumer bound to a range of queues. Opaque; one thread at a time.
pub struct zcio_nfqueue {
    q: NfQueue,
    owner: crate::Owner,
}

/// One queued packet, valid during the callback only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct zcio_nfq_packet {
    /// Packet id (per queue).
    pub id: u32,
    /// The queue it came from.
    pub queue: u16,
    /// Link-layer protocol (`ETH_P_IP`, ...), host order.
    pub hw_protocol: u16,
    /// Netfilter hook.
    pub hook: u8,
    /// Address family.
    pub family: u8,
    /// Whether `mark` is set.
    pub has_mark: u8,
    /// The packet's mark.
    pub mark: u32,
    /// The packet (network header onwards), or NULL.
    pub payload: *const c_void,
    /// Its length.
    pub payload_len: usize,
}

/// The callback's decision.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcio_nfq_verdict {
    /// `ZCIO_NF_*` (for `ZCIO_NF_QUEUE`, the target queue in bits 16..31).
    pub verdict: u32,
    /// Non-zero: also set the packet's mark to `mark`.
    pub set_mark: u32,
    /// The new mark.
    pub mark: u32,
}

/// Decides one packet: fill `*verdict` (pre-set to accept) and return 0.
pub type zcio_nfq_callback = Option<
    extern "C" fn(
        pkt: *const zcio_nfq_packet,
        verdict: *mut zcio_nfq_verdict,
        user: *mut c_void,
    ) -> c_int,
>;

fn nfq_errno(e: &NfqError) -> c_int {
    let io = match e {
        NfqError::Socket { source, .. }
        | NfqError::Config { source, .. }
        | NfqError::Send { source, .. }
        | NfqError::SendFailing { source, .. } => Some(source),
        _ => None,
    };
    -io.and_then(|e| e.raw_os_error()).unwrap_or(libc::EIO)
}

/// Binds queues `first..=last` (copy mode: whole packets) into `*out`. Needs CAP_NET_ADMIN.
/// Returns 0 or `-errno`.
///
/// Thread: any; the calling thread becomes the owner. Ownership: `*out` until `zcio_nfqueue_free`.
#[no_mangle]
pub extern "C" fn zcio_nfqueue_open(out: *mut *mut zcio_nfqueue, first: u16, last: u16) -> c_int {
    if out.is_null() || last < first {
        return -libc::EINVAL;
    }
    guard(|| {
        let cfg = NfQueueConfig {
            first,
            last,
            ..NfQueueConfig::default()
        };
        match NfQueue::open(cfg) {
            Ok(q) => {
                // SAFETY: `out` is non-null.
                unsafe {
                    *out = Box::into_raw(Box::new(zcio_nfqueue {
                        q,
                        owner: crate::Owner::here(),
                    }))
                };
                0
            }
            Err(e) => nfq_errno(&e),
        }
    })
}

/// Unbinds and frees (NULL is ignored).
///
/// Thread: the owner (the queue's rings are bound to it); freed once.
#[no_mangle]
pub extern "C" fn zcio_nfqueue_free(q: *mut zcio_nfqueue) {
    if !q.is_null() {
        // SAFETY: `q` came from zcio_nfqueue_open and is freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(q) })));
    }
}

fn decide(
    p: &Packet<'_>,
    cb: extern "C" fn(*const zcio_nfq_packet, *mut zcio_nfq_verdict, *mut c_void) -> c_int,
    user: *mut c_void,
) -> Decision {
    let payload = p.payload.unwrap_or(&[]);
    let pkt = zcio_nfq_packet {
        id: p.id,
        queue: p.queue,
        hw_protocol: p.hw_protocol,
        hook: p.hook,
        family: p.family,
        has_mark: u8::from(p.mark.is_some()),
        mark: p.mark.unwrap_or(0),
        payload: if payload.is_empty() {
            std::ptr::null()
        } else {
            payload.as_ptr().cast()
        },
        payload_len: payload.len(),
    };
    let mut v = zcio_nfq_verdict {
        verdict: ZCIO_NF_ACCEPT,
        set_mark: 0,
        mark: 0,
    };
    // A callback error or an unknown verdict accepts the packet (never leave it queued).
    if cb(&pkt, &mut v, user) != 0 {
        return Decision::Verdict(Verdict::Accept);
    }
    let verdict = Verdict::from_wire(v.verdict).unwrap_or(Verdict::Accept);
    if v.set_mark != 0 {
        Decision::Mark(verdict, v.mark)
    } else {
        Decision::Verdict(verdict)
    }
}

/// Receives what is ready on every queue (waiting up to `timeout_ms`, -1: forever), calls
/// `cb` for each packet in id order, and sends the verdicts in batches. Returns the number of
/// packets handled or `-errno`.
///
/// Thread: the owner only (`-EPERM` from any other). `cb` runs on that thread, inside this call; the packet it sees is valid during the callback only.
#[no_mangle]
pub extern "C" fn zcio_nfqueue_process(
    q: *mut zcio_nfqueue,
    timeout_ms: c_int,
    cb: zcio_nfq_callback,
    user: *mut c_void,
) -> c_int {
    let Some(cb) = cb else {
        return -libc::EINVAL;
    };
    if q.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `q` is a live handle; only its (immutable) owner is read first.
    if !unsafe { (*q).owner }.is_here() {
        return -libc::EPERM;
    }
    // SAFETY: the owner thread's exclusive use of its live handle.
    let queue = unsafe { &mut (*q).q };
    let timeout = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
    guard(|| match queue.process(timeout, |p| decide(p, cb, user)) {
        Ok(n) => n.min(i32::MAX as usize) as c_int,
        Err(e) => nfq_errno(&e),
    })
}

/// A snapshot of what the queue reports into `*out`: its path, counters, every fallback with
/// its reason (receive buffer sizing, ring set-up), and its NFQUEUE counters (`stats` in the
/// JSON). Free it with `zcio_report_free`. Returns 0, `-EINVAL` or `-EPERM`.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_nfqueue_report(
    q: *mut zcio_nfqueue,
    out: *mut *mut crate::report::zcio_report,
) -> c_int {
    if q.is_null() || out.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `q` is a live handle; only its (immutable) owner is read first.
    if !unsafe { (*q).owner }.is_here() {
        return -libc::EPERM;
    }
    // SAFETY: the owner thread's use of its live handle.
    let queue = unsafe { &(*q).q };
    guard(|| crate::report::put(out, crate::report::of(queue, queue.stats())))
}

/// How the queue receives: `"frame-ring+io_uring"` or `"frame-ring+recvmmsg"` (static).
///
/// Thread: any (static string).
#[no_mangle]
pub extern "C" fn zcio_nfqueue_path(q: *const zcio_nfqueue) -> *const libc::c_char {
    if q.is_null() {
        return std::ptr::null();
    }
    // SAFETY: `q` is a live handle.
    path_cstr(unsafe { (*q).q.path() }).as_ptr()
}

/// `NetlinkPath::as_str`'s names as NUL-terminated statics.
pub(crate) fn path_cstr(p: zcio_core::netlink::NetlinkPath) -> &'static std::ffi::CStr {
    use zcio_core::netlink::NetlinkPath;
    match p {
        NetlinkPath::FrameRingUring => c"frame-ring+io_uring",
        NetlinkPath::FrameRingRecvmmsg => c"frame-ring+recvmmsg",
    }
}

#[cfg(test)]
mod tests {
    use zcio_core::netlink::NetlinkPath;

    #[test]
    fn nfqueue_path_names_in_c_are_the_netlink_path_names() {
        for p in [NetlinkPath::FrameRingUring, NetlinkPath::FrameRingRecvmmsg] {
            assert_eq!(super::path_cstr(p).to_str().unwrap(), p.as_str());
        }
    }
}

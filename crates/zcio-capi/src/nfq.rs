//! The NFQUEUE consumer (`zcio::netlink::NfQueue`) for C: packets are handed to a callback in
//! id order, decided by its return value, and the verdicts go out in batches.

use crate::guard;
use libc::{c_int, c_void};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;
use zcio_core::netlink::{
    CopyMode, Decision, FrameError, FramePin, NfQueue, NfQueueConfig, NfqError, Packet, PacketRef,
    Received, Verdict,
};

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
    /// Payloads handed out by `zcio_nfqueue_receive`, pinned until their packet's verdict.
    pins: HashMap<PacketRef, FramePin>,
    /// Reused receive vector.
    scratch: Vec<Received>,
    /// Received past the caller's `max` (an io_uring fill hands over a whole window): handed
    /// out first by the next `zcio_nfqueue_receive`.
    pending: std::collections::VecDeque<Received>,
    /// `zcio_nfqueue_readiness_fd` was called: a zero-timeout receive clears the descriptor.
    readiness: bool,
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

/// The errno of an error (its reason is recorded for `zcio_last_error`).
fn nfq_errno(e: &NfqError) -> c_int {
    let io = match e {
        NfqError::Socket { source, .. }
        | NfqError::Config { source, .. }
        | NfqError::Send { source, .. }
        | NfqError::SendFailing { source, .. } => Some(source),
        _ => None,
    };
    let errno = match e {
        NfqError::NotHeld { .. } => libc::ENOENT,
        NfqError::Emit { .. } => libc::EMSGSIZE,
        NfqError::MangleGso { .. } => libc::EOPNOTSUPP,
        NfqError::Unbound => libc::ENOTCONN,
        NfqError::Parse { .. } => libc::EBADMSG,
        NfqError::Frames(FrameError::AllHeld(_)) => libc::ENOSPC,
        _ => io.and_then(|e| e.raw_os_error()).unwrap_or(libc::EIO),
    };
    crate::fail(-errno, e)
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
                unsafe { *out = Box::into_raw(Box::new(zcio_nfqueue::new(q))) };
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

impl zcio_nfqueue {
    fn new(q: NfQueue) -> Self {
        Self {
            q,
            owner: crate::Owner::here(),
            pins: HashMap::new(),
            scratch: Vec::new(),
            pending: std::collections::VecDeque::new(),
            readiness: false,
        }
    }
}

/// `zcio_nfqueue_config.copy_mode`: metadata only.
pub const ZCIO_NFQ_COPY_META: u8 = 1;
/// `zcio_nfqueue_config.copy_mode`: metadata and up to `copy_range` bytes of the packet.
pub const ZCIO_NFQ_COPY_PACKET: u8 = 2;
/// `zcio_nfqueue_config.flags`: accept instead of drop when the kernel queue is full
/// (`NFQA_CFG_F_FAIL_OPEN`).
pub const ZCIO_NFQ_F_FAIL_OPEN: u32 = 1;
/// `zcio_nfqueue_config.flags`: attach the connection's conntrack entry (`NFQA_CFG_F_CONNTRACK`).
pub const ZCIO_NFQ_F_CONNTRACK: u32 = 2;
/// `zcio_nfqueue_config.flags`: queue GSO packets whole (`NFQA_CFG_F_GSO`).
pub const ZCIO_NFQ_F_GSO: u32 = 4;
/// `zcio_nfqueue_config.flags`: attach the socket owner's uid and gid (`NFQA_CFG_F_UID_GID`).
pub const ZCIO_NFQ_F_UID_GID: u32 = 8;

/// How `zcio_nfqueue_open_config` binds. Zero fields take zcio's defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcio_nfqueue_config {
    /// First queue number.
    pub first: u16,
    /// Last queue number (inclusive; one socket and frame ring per queue).
    pub last: u16,
    /// `ZCIO_NFQ_COPY_META` or `ZCIO_NFQ_COPY_PACKET` (0: packet).
    pub copy_mode: u8,
    /// Bytes of each packet copied with `ZCIO_NFQ_COPY_PACKET` (0: 65535).
    pub copy_range: u32,
    /// The kernel queue's length (`NFQA_CFG_QUEUE_MAXLEN`; 0: the kernel's 1024).
    pub max_len: u32,
    /// `ZCIO_NFQ_F_*` (other bits: `-EINVAL`).
    pub flags: u32,
    /// Frames per queue (0: 256, or `max_len + 64` when that is more, so packets held up to
    /// the kernel's limit never use up the ring).
    pub frames: u32,
    /// Receive buffer bytes (0: 4 MiB, with `SO_RCVBUFFORCE` where allowed).
    pub rcvbuf: u32,
    /// Verdict for a packet whose message cannot be parsed (`ZCIO_NF_*`; 0: drop).
    pub on_error: u32,
}

/// A packet handed over by `zcio_nfqueue_receive`: held until its verdict
/// (`zcio_nfqueue_decide` / `zcio_nfqueue_verdict`), its payload readable until then.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct zcio_nfq_held {
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
    /// Bit set of the optional fields present: `1 << 0` mark, `1` indev, `2` outdev, `3`
    /// physindev, `4` physoutdev, `5` timestamp, `6` cap_len, `7` skb_info, `8` uid, `9` gid,
    /// `10` ct_info, `11` hwaddr.
    pub present: u16,
    /// The packet's mark.
    pub mark: u32,
    /// Input interface index.
    pub indev: u32,
    /// Output interface index.
    pub outdev: u32,
    /// Physical input interface index (bridges).
    pub physindev: u32,
    /// Physical output interface index (bridges).
    pub physoutdev: u32,
    /// Full length of a packet cut to the copy range (`NFQA_CAP_LEN`).
    pub cap_len: u32,
    /// `NFQA_SKB_INFO` flags.
    pub skb_info: u32,
    /// Owner of the local socket.
    pub uid: u32,
    /// Group of that owner.
    pub gid: u32,
    /// `enum ip_conntrack_info`.
    pub ct_info: u32,
    /// Timestamp, seconds.
    pub ts_sec: u64,
    /// Timestamp, microseconds.
    pub ts_usec: u64,
    /// Hardware address (`hwaddr_len` bytes).
    pub hwaddr: [u8; 8],
    /// Its length.
    pub hwaddr_len: u8,
    /// The packet (network header onwards, up to the copy range), or NULL; readable until
    /// the packet's verdict, then gone (the frame is reused).
    pub payload: *const c_void,
    /// Its length.
    pub payload_len: usize,
}

/// One verdict for `zcio_nfqueue_decide`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcio_nfq_decision {
    /// The packet's queue.
    pub queue: u16,
    /// Non-zero: also set the packet's mark to `mark`.
    pub set_mark: u16,
    /// The packet's id.
    pub id: u32,
    /// `ZCIO_NF_*` (for `ZCIO_NF_QUEUE`, the target queue in bits 16..31).
    pub verdict: u32,
    /// The new mark.
    pub mark: u32,
    /// Out: 0, or `-errno` for this entry (`-ENOENT`: not held here, e.g. decided already;
    /// `-EINVAL`: an unknown verdict).
    pub result: i32,
}

/// Counters of an NFQUEUE consumer (`zcio::netlink::NfqStats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcio_nfq_stats {
    /// Packets received.
    pub received: u64,
    /// Verdicts: accept.
    pub accepted: u64,
    /// Verdicts: drop.
    pub dropped: u64,
    /// Verdicts: repeat.
    pub repeated: u64,
    /// Verdicts: to another queue.
    pub requeued: u64,
    /// `VERDICT_BATCH` messages sent.
    pub batches: u64,
    /// Packets those covered.
    pub batched: u64,
    /// Single `VERDICT` messages sent.
    pub singles: u64,
    /// Packets held now.
    pub held: u64,
    /// Overruns (ENOBUFS) seen on receive.
    pub overruns: u64,
    /// Verdict sends (`sendto` calls, or ring `SEND`s submitted with a receive).
    pub send_syscalls: u64,
    /// Receive syscalls (`recvmmsg`, `poll`, `io_uring_enter`).
    pub recv_syscalls: u64,
    /// Messages that did not parse.
    pub parse_errors: u64,
}

/// Binds the queues of `cfg` into `*out` (`zcio_nfqueue_open` with the copy mode, kernel queue
/// length, flags and frame ring chosen). Needs CAP_NET_ADMIN. Returns 0 or `-errno`
/// (`-EINVAL`: a bad field; `-EPERM`: no CAP_NET_ADMIN or the queue is bound by another
/// socket); `zcio_last_error` says which.
///
/// Thread: any; the calling thread becomes the owner. Ownership: `*out` until `zcio_nfqueue_free`.
#[no_mangle]
pub extern "C" fn zcio_nfqueue_open_config(
    out: *mut *mut zcio_nfqueue,
    cfg: *const zcio_nfqueue_config,
) -> c_int {
    if out.is_null() || cfg.is_null() {
        return crate::fail(-libc::EINVAL, "out and cfg must not be NULL");
    }
    // SAFETY: `cfg` points to a readable config (the caller's contract; non-null).
    let c = unsafe { *cfg };
    if c.last < c.first {
        return crate::fail(
            -libc::EINVAL,
            format!("last queue {} is below first {}", c.last, c.first),
        );
    }
    let known = ZCIO_NFQ_F_FAIL_OPEN | ZCIO_NFQ_F_CONNTRACK | ZCIO_NFQ_F_GSO | ZCIO_NFQ_F_UID_GID;
    if c.flags & !known != 0 {
        return crate::fail(
            -libc::EINVAL,
            format!(
                "unsupported queue flags {:#x} (zcio takes FAIL_OPEN, CONNTRACK, GSO, UID_GID)",
                c.flags & !known
            ),
        );
    }
    let copy = match c.copy_mode {
        ZCIO_NFQ_COPY_META => CopyMode::Meta,
        0 | ZCIO_NFQ_COPY_PACKET => CopyMode::Packet(if c.copy_range == 0 {
            0xffff
        } else {
            c.copy_range
        }),
        m => {
            return crate::fail(
                -libc::EINVAL,
                format!("copy mode {m}: use ZCIO_NFQ_COPY_META or ZCIO_NFQ_COPY_PACKET"),
            )
        }
    };
    let Some(on_error) = Verdict::from_wire(c.on_error) else {
        return crate::fail(
            -libc::EINVAL,
            format!("unknown on_error verdict {}", c.on_error),
        );
    };
    let mut qc = NfQueueConfig {
        first: c.first,
        last: c.last,
        copy,
        max_len: (c.max_len != 0).then_some(c.max_len),
        fail_open: c.flags & ZCIO_NFQ_F_FAIL_OPEN != 0,
        conntrack: c.flags & ZCIO_NFQ_F_CONNTRACK != 0,
        gso: c.flags & ZCIO_NFQ_F_GSO != 0,
        uid_gid: c.flags & ZCIO_NFQ_F_UID_GID != 0,
        on_error,
        ..NfQueueConfig::default()
    };
    qc.frames = if c.frames != 0 {
        c.frames
    } else {
        qc.frames.max(c.max_len.saturating_add(64).min(1 << 16))
    };
    if c.rcvbuf != 0 {
        qc.rcvbuf = Some((c.rcvbuf as usize, true));
    }
    guard(|| match NfQueue::open(qc) {
        Ok(q) => {
            // SAFETY: `out` is non-null.
            unsafe { *out = Box::into_raw(Box::new(zcio_nfqueue::new(q))) };
            0
        }
        Err(e) => nfq_errno(&e),
    })
}

/// The owner thread's handle, or the errno to return.
fn owned<'a>(q: *mut zcio_nfqueue) -> Result<&'a mut zcio_nfqueue, c_int> {
    if q.is_null() {
        return Err(crate::fail(-libc::EINVAL, "the queue handle is NULL"));
    }
    // SAFETY: `q` is a live handle; only its (immutable) owner is read first.
    if !unsafe { (*q).owner }.is_here() {
        return Err(crate::fail(
            -libc::EPERM,
            "called from a thread other than the one that opened the queue",
        ));
    }
    // SAFETY: the owner thread's exclusive use of its live handle.
    Ok(unsafe { &mut *q })
}

fn held_of(r: &Received, pin: Option<&FramePin>) -> zcio_nfq_held {
    let i = &r.info;
    let mut present = 0u16;
    let mut opt = |bit: u16, v: Option<u32>| {
        if v.is_some() {
            present |= 1 << bit;
        }
        v.unwrap_or(0)
    };
    let mark = opt(0, i.mark);
    let indev = opt(1, i.indev);
    let outdev = opt(2, i.outdev);
    let physindev = opt(3, i.physindev);
    let physoutdev = opt(4, i.physoutdev);
    let cap_len = opt(6, i.cap_len);
    let skb_info = opt(7, i.skb_info);
    let uid = opt(8, i.uid);
    let gid = opt(9, i.gid);
    let ct_info = opt(10, i.ct_info);
    let (ts_sec, ts_usec) = i.timestamp.unwrap_or((0, 0));
    if i.timestamp.is_some() {
        present |= 1 << 5;
    }
    let (hwaddr, hwaddr_len) = i.hwaddr.unwrap_or(([0; 8], 0));
    if i.hwaddr.is_some() {
        present |= 1 << 11;
    }
    let (payload, payload_len) = match pin {
        Some(p) if !p.is_empty() => (p.as_ptr().cast::<c_void>(), p.len()),
        _ => (std::ptr::null(), 0),
    };
    zcio_nfq_held {
        id: r.packet.id,
        queue: r.packet.queue,
        hw_protocol: i.hw_protocol,
        hook: i.hook,
        family: i.family,
        present,
        mark,
        indev,
        outdev,
        physindev,
        physoutdev,
        cap_len,
        skb_info,
        uid,
        gid,
        ct_info,
        ts_sec,
        ts_usec,
        hwaddr,
        hwaddr_len,
        payload,
        payload_len,
    }
}

/// Receives up to `max` packets into `out` (waiting up to `timeout_ms` when none is ready,
/// -1: forever), each **held**: its verdict is the caller's, given with `zcio_nfqueue_decide`
/// or `zcio_nfqueue_verdict`, and its `payload` points into the frame ring, readable until
/// that verdict. Verdicts given since the last call go out first (on the io_uring path, in
/// the same kernel entry as the receive). With `timeout_ms` 0 after
/// `zcio_nfqueue_readiness_fd`, it also clears the descriptor (it stays readable only for
/// packets that arrived after). Returns the number of packets written or `-errno`
/// (`-ENOSPC`: every frame holds an undecided packet; decide some).
///
/// Thread: the owner only (`-EPERM` from any other). Ownership: `out` is the caller's array of `max` entries.
#[no_mangle]
pub extern "C" fn zcio_nfqueue_receive(
    q: *mut zcio_nfqueue,
    timeout_ms: c_int,
    out: *mut zcio_nfq_held,
    max: usize,
) -> c_int {
    let h = match owned(q) {
        Ok(h) => h,
        Err(e) => return e,
    };
    if out.is_null() || max == 0 {
        return -libc::EINVAL;
    }
    let max = max.min(i32::MAX as usize);
    guard(|| {
        let mut got = std::mem::take(&mut h.scratch);
        got.clear();
        let r = if !h.pending.is_empty() {
            let k = h.pending.len().min(max);
            got.extend(h.pending.drain(..k));
            Ok(k)
        } else if timeout_ms == 0 && h.readiness {
            h.q.receive_ready(max, &mut got)
        } else {
            let timeout = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
            h.q.receive(timeout, max, &mut got)
        };
        // An io_uring fill may pass `max`; the rest stays held and is handed out next time.
        let mut n = 0usize;
        for r in got.drain(..) {
            if n == max {
                h.pending.push_back(r);
                continue;
            }
            let pin = r.payload.as_ref();
            // SAFETY: `out` has room for `max` entries (the caller's contract); n < max.
            unsafe { out.add(n).write(held_of(&r, pin)) };
            if let Some(p) = r.payload {
                h.pins.insert(r.packet, p);
            }
            n += 1;
        }
        h.scratch = got;
        match r {
            Ok(_) => n as c_int,
            Err(_) if n > 0 => n as c_int,
            Err(e) => nfq_errno(&e),
        }
    })
}

/// Decides `n` held packets (`zcio_nfqueue_receive`): each entry's verdict (and mark) is
/// recorded, its payload is gone, and the verdicts go out with the next receive or
/// `zcio_nfqueue_flush` — as one `VERDICT_BATCH` for a run of equal verdicts. Each entry's
/// `result` says whether it was taken. Returns how many were taken, or `-errno` for the whole
/// call.
///
/// Thread: the owner only (`-EPERM` from any other). Ownership: `d` stays the caller's.
#[no_mangle]
pub extern "C" fn zcio_nfqueue_decide(
    q: *mut zcio_nfqueue,
    d: *mut zcio_nfq_decision,
    n: usize,
) -> c_int {
    let h = match owned(q) {
        Ok(h) => h,
        Err(e) => return e,
    };
    if d.is_null() && n > 0 {
        return -libc::EINVAL;
    }
    guard(|| {
        let mut taken = 0;
        for i in 0..n {
            // SAFETY: `d` has `n` entries (the caller's contract), owned by this call.
            let e = unsafe { &mut *d.add(i) };
            e.result = match Verdict::from_wire(e.verdict) {
                None => crate::fail(-libc::EINVAL, format!("unknown verdict {}", e.verdict)),
                Some(v) => {
                    let dec = if e.set_mark != 0 {
                        Decision::Mark(v, e.mark)
                    } else {
                        Decision::Verdict(v)
                    };
                    decide_one(h, e.queue, e.id, dec)
                }
            };
            if e.result == 0 {
                taken += 1;
            }
        }
        taken
    })
}

fn decide_one(h: &mut zcio_nfqueue, queue: u16, id: u32, d: Decision) -> c_int {
    let r = PacketRef { queue, id };
    match h.q.verdict(r, d) {
        Ok(()) => {
            h.pins.remove(&r);
            0
        }
        Err(e) => nfq_errno(&e),
    }
}

/// Decides every packet of queue `queue` handed out by `zcio_nfqueue_receive` and not decided
/// yet whose id is `id` or before it (in the
/// kernel's wrapping id order) with `verdict`, as go-nfqueue's `SetVerdictBatch`. Returns how
/// many were decided or `-errno`.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_nfqueue_decide_through(
    q: *mut zcio_nfqueue,
    queue: u16,
    id: u32,
    verdict: u32,
) -> c_int {
    let h = match owned(q) {
        Ok(h) => h,
        Err(e) => return e,
    };
    let Some(v) = Verdict::from_wire(verdict) else {
        return crate::fail(-libc::EINVAL, format!("unknown verdict {verdict}"));
    };
    guard(|| {
        let mut n = 0;
        for r in h.q.held() {
            // `id.wrapping_sub(r.id) as i32 >= 0`: r.id is id or before it (RFC 1982 style,
            // as the kernel's nfq_id_after).
            // Packets not handed out yet (`pending`) are not the caller's to decide.
            let handed_out = !h.pending.iter().any(|p| p.packet == r);
            if r.queue == queue && (id.wrapping_sub(r.id) as i32) >= 0 && handed_out {
                match decide_one(h, r.queue, r.id, Decision::Verdict(v)) {
                    0 => n += 1,
                    e => return e,
                }
            }
        }
        n
    })
}

/// Decides one held packet with a verdict, optionally a new mark (`set_mark` non-zero) and
/// optionally a replacement packet (`payload`/`len`, copied; NULL: keep the packet). The
/// verdict goes out with the next receive or `zcio_nfqueue_flush`. Returns 0 or `-errno`
/// (`-ENOENT`: not held; `-EMSGSIZE`: a replacement over 65 531 bytes; `-EOPNOTSUPP`: a
/// replacement for a non-TCP GSO packet, which the kernel would drop — the packet stays held).
///
/// Thread: the owner only (`-EPERM` from any other). Ownership: `payload` stays the caller's (copied).
#[no_mangle]
pub extern "C" fn zcio_nfqueue_verdict(
    q: *mut zcio_nfqueue,
    queue: u16,
    id: u32,
    verdict: u32,
    set_mark: c_int,
    mark: u32,
    payload: *const c_void,
    len: usize,
) -> c_int {
    let h = match owned(q) {
        Ok(h) => h,
        Err(e) => return e,
    };
    let Some(v) = Verdict::from_wire(verdict) else {
        return crate::fail(-libc::EINVAL, format!("unknown verdict {verdict}"));
    };
    guard(|| {
        let d = if payload.is_null() {
            if set_mark != 0 {
                Decision::Mark(v, mark)
            } else {
                Decision::Verdict(v)
            }
        } else {
            // SAFETY: `payload` points to `len` readable bytes (the caller's contract).
            let bytes = unsafe { std::slice::from_raw_parts(payload.cast::<u8>(), len) };
            Decision::Mangle(v, bytes.to_vec(), (set_mark != 0).then_some(mark))
        };
        decide_one(h, queue, id, d)
    })
}

/// Sends every verdict given so far now (on the io_uring path: submits them). Returns 0 or
/// `-errno`.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_nfqueue_flush(q: *mut zcio_nfqueue) -> c_int {
    let h = match owned(q) {
        Ok(h) => h,
        Err(e) => return e,
    };
    guard(|| match h.q.flush() {
        Ok(()) => 0,
        Err(e) => nfq_errno(&e),
    })
}

/// The queue's readiness descriptor (created on first call, owned by the queue): it polls
/// readable when `zcio_nfqueue_receive` with a zero timeout would find packets, and that
/// receive clears it (rules in `docs/design/async.md`). For a caller that waits on several
/// descriptors itself. Returns the descriptor or `-errno`.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_nfqueue_readiness_fd(q: *mut zcio_nfqueue) -> c_int {
    use std::os::fd::AsRawFd;
    let h = match owned(q) {
        Ok(h) => h,
        Err(e) => return e,
    };
    guard(|| match h.q.readiness_fd() {
        Ok(fd) => {
            h.readiness = true;
            fd.as_raw_fd()
        }
        Err(e) => nfq_errno(&e),
    })
}

/// Makes a rewritten IPv4/IPv6 packet valid: sets the IP and UDP length fields to `len` and
/// recomputes the IPv4 header checksum and the TCP/UDP/UDP-Lite/ICMP/ICMPv6 checksum with the
/// pseudo-header (the kernel checks them after a rewrite: `docs/design/netlink.md`). Returns 0,
/// or `-EINVAL` with the packet untouched for what cannot be summed here (fragments, ESP, a
/// packet cut by the copy range, …; `zcio_last_error` says which).
///
/// Thread: any. Ownership: `pkt` stays the caller's.
#[no_mangle]
pub extern "C" fn zcio_fix_checksums(pkt: *mut c_void, len: usize) -> c_int {
    if pkt.is_null() {
        return crate::fail(-libc::EINVAL, "the packet is NULL");
    }
    // SAFETY: `pkt` points to `len` writable bytes the caller owns (its contract).
    let p = unsafe { std::slice::from_raw_parts_mut(pkt.cast::<u8>(), len) };
    guard(|| match zcio_core::netlink::packet::fix_checksums(p) {
        Ok(_) => 0,
        Err(e) => crate::fail(-libc::EINVAL, e),
    })
}

/// Fills `*out` with the queue's counters. Returns 0 or `-errno`.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_nfqueue_get_stats(q: *mut zcio_nfqueue, out: *mut zcio_nfq_stats) -> c_int {
    let h = match owned(q) {
        Ok(h) => h,
        Err(e) => return e,
    };
    if out.is_null() {
        return -libc::EINVAL;
    }
    let s = h.q.stats();
    let c = zcio_nfq_stats {
        received: s.received,
        accepted: s.accepted,
        dropped: s.dropped,
        repeated: s.repeated,
        requeued: s.requeued,
        batches: s.batches,
        batched: s.batched,
        singles: s.singles,
        held: s.held,
        overruns: s.overruns,
        send_syscalls: s.send_syscalls,
        recv_syscalls: s.recv_syscalls,
        parse_errors: s.parse_errors,
    };
    // SAFETY: `out` is non-null and writable (the caller's contract).
    unsafe { out.write(c) };
    0
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

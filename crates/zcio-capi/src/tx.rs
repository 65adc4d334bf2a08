//! Zero-copy send (`zcio::tx::Sender`) and its buffer pool, for C.

use crate::{guard, neg};
use libc::{c_char, c_int, c_void};
use std::os::fd::{FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;
use zcio_core::buf::pool::{Pool, PoolBuf};
use zcio_core::tx::{Path, Sender, SenderConfig, TxError, TxMode, ZcStatus};

/// Plain `send`.
pub const ZCIO_TX_COPY: u32 = 0;
/// `MSG_ZEROCOPY` with the batched error-queue reaper.
pub const ZCIO_TX_MSG_ZC: u32 = 1;
/// io_uring `SEND_ZC`.
pub const ZCIO_TX_URING_ZC: u32 = 2;
/// io_uring `SEND_ZC` from the registered (fixed) pool.
pub const ZCIO_TX_URING_ZC_FIXED: u32 = 3;
/// Probe, start zero-copy, switch to copy where the kernel copies anyway.
pub const ZCIO_TX_AUTO: u32 = 4;
/// io_uring `SEND`: the kernel copies; batched with the ring's other requests.
pub const ZCIO_TX_URING_COPY: u32 = 5;

/// Completion `zerocopy` value: sent by copy.
pub const ZCIO_ZC_NOT_ATTEMPTED: u32 = 0;
/// Completion `zerocopy` value: every part went zero-copy.
pub const ZCIO_ZC_ZEROCOPY: u32 = 1;
/// Completion `zerocopy` value: the kernel copied after all.
pub const ZCIO_ZC_COPIED: u32 = 2;
/// Completion `zerocopy` value: some parts zero-copy, some copied.
pub const ZCIO_ZC_MIXED: u32 = 3;
/// Completion `zerocopy` value: sent zero-copy, but the kernel did not report whether it
/// copied (Linux before 6.2).
pub const ZCIO_ZC_UNKNOWN: u32 = 4;

/// A pool of page-aligned send buffers. Opaque.
pub struct zcio_pool {
    pub(crate) pool: Pool,
}

/// One buffer from a pool, owned by the caller until a send takes it (`zcio_sender_send`,
/// `zcio_send_ring_send`) or `zcio_buf_free` returns it to its pool. Opaque.
pub struct zcio_buf {
    /// Empty only inside a send call, between taking the buffer and knowing whether it was
    /// queued (a refused buffer goes back into the same handle).
    pub(crate) buf: Option<PoolBuf>,
}

impl zcio_buf {
    pub(crate) fn new(buf: PoolBuf) -> Self {
        Self { buf: Some(buf) }
    }
}

/// Hands the pool buffer of `b` to `send`; on refusal (`Err`) it goes back into the same
/// handle, which stays the caller's; on success the handle is freed.
///
/// # Safety
///
/// `b` is a live buffer handle owned by the caller.
pub(crate) unsafe fn send_buf<T, E>(
    b: *mut zcio_buf,
    send: impl FnOnce(PoolBuf) -> Result<T, (E, PoolBuf)>,
) -> Result<T, Result<E, c_int>> {
    // SAFETY: forwarded from the caller.
    let Some(pb) = (unsafe { (*b).buf.take() }) else {
        return Err(Err(-libc::EINVAL));
    };
    match send(pb) {
        Ok(t) => {
            // SAFETY: the handle came from Box::into_raw and is freed once, here.
            drop(unsafe { Box::from_raw(b) });
            Ok(t)
        }
        Err((e, back)) => {
            // SAFETY: as above; the handle stays the caller's.
            unsafe { (*b).buf = Some(back) };
            Err(Ok(e))
        }
    }
}

fn pb(b: &zcio_buf) -> Option<&PoolBuf> {
    b.buf.as_ref()
}

fn pb_mut(b: &mut zcio_buf) -> Option<&mut PoolBuf> {
    b.buf.as_mut()
}

/// A sender owning one connected TCP or UDP socket. Opaque; one thread at a time.
pub struct zcio_sender {
    owner: crate::Owner,
    sender: Sender,
}

/// The result of one `zcio_sender_send`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcio_tx_completion {
    /// The ticket `zcio_sender_send` returned.
    pub ticket: u64,
    /// Bytes the buffer held.
    pub len: usize,
    /// Bytes the kernel accepted.
    pub bytes: usize,
    /// `ZCIO_TX_*` path the send took.
    pub path: u32,
    /// `ZCIO_ZC_*`.
    pub zerocopy: u32,
    /// 0, or `-errno` when the send failed (the data may not have arrived).
    pub error: c_int,
}

pub(crate) fn tx_errno(e: &TxError) -> c_int {
    match e {
        TxError::Socket { source, .. } => neg(source),
        TxError::Timeout { .. } => -libc::ETIMEDOUT,
        TxError::Ring(e) => neg(e),
        TxError::Register { source, .. } => neg(source),
    }
}

pub(crate) fn ms(timeout_ms: c_int) -> Duration {
    Duration::from_millis(timeout_ms.max(0) as u64)
}

/// Creates a pool of `count` buffers of `slot_size` bytes into `*out`. Returns 0 or `-errno`.
///
/// Thread: any. Ownership: `*out` until `zcio_pool_free`; the pool is shared by the buffers and senders that use it.
#[no_mangle]
pub extern "C" fn zcio_pool_new(out: *mut *mut zcio_pool, slot_size: usize, count: usize) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    guard(|| match Pool::new(slot_size, count, false) {
        Ok(pool) => {
            // SAFETY: `out` is non-null.
            unsafe { *out = Box::into_raw(Box::new(zcio_pool { pool })) };
            0
        }
        Err(e) => neg(&e),
    })
}

/// Frees a pool handle (NULL is ignored). Buffers still out keep the memory alive until
/// they come back.
///
/// Thread: any; freed once.
#[no_mangle]
pub extern "C" fn zcio_pool_free(p: *mut zcio_pool) {
    if !p.is_null() {
        // SAFETY: `p` came from zcio_pool_new and is freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(p) })));
    }
}

/// Takes a free buffer into `*out`: length 0, its memory zeroed (a buffer's earlier contents,
/// possibly another connection's bytes, never reach a send); `-EAGAIN` when every buffer is
/// out.
///
/// Thread: any. Ownership: the buffer is the caller's until `zcio_sender_send` takes it or
/// `zcio_buf_free`.
#[no_mangle]
pub extern "C" fn zcio_pool_get(p: *const zcio_pool, out: *mut *mut zcio_buf) -> c_int {
    if p.is_null() || out.is_null() {
        return -libc::EINVAL;
    }
    guard(|| {
        // SAFETY: `p` is a live pool handle.
        match unsafe { (*p).pool.try_get() } {
            Some(mut buf) => {
                let cap = buf.capacity();
                buf.set_len(cap);
                buf.fill(0);
                buf.set_len(0);
                // SAFETY: `out` is non-null.
                unsafe { *out = Box::into_raw(Box::new(zcio_buf::new(buf))) };
                0
            }
            None => -libc::EAGAIN,
        }
    })
}

/// The buffer's memory (`zcio_buf_capacity` bytes, writable while the caller owns it).
///
/// Thread: whichever thread owns the buffer (one at a time; buffers may move between threads).
#[no_mangle]
pub extern "C" fn zcio_buf_data(b: *mut zcio_buf) -> *mut c_void {
    if b.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `b` is a live buffer handle owned by the caller.
    let Some(buf) = pb_mut(unsafe { &mut *b }) else {
        return std::ptr::null_mut();
    };
    // The pointer is taken from a slice over the whole slot (so it is valid for the
    // capacity), then the length is restored.
    let len = buf.len();
    buf.set_len(buf.capacity());
    let p = buf.as_mut_ptr();
    buf.set_len(len);
    p.cast()
}

/// The buffer's capacity in bytes.
///
/// Thread: the buffer's owner.
#[no_mangle]
pub extern "C" fn zcio_buf_capacity(b: *const zcio_buf) -> usize {
    if b.is_null() {
        return 0;
    }
    // SAFETY: `b` is a live buffer handle.
    pb(unsafe { &*b }).map_or(0, |b| b.capacity())
}

/// Sets how many bytes of the buffer are to be sent. `-EINVAL` beyond the capacity.
///
/// Thread: the buffer's owner.
#[no_mangle]
pub extern "C" fn zcio_buf_set_len(b: *mut zcio_buf, len: usize) -> c_int {
    if b.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `b` is a live buffer handle.
    let Some(buf) = pb_mut(unsafe { &mut *b }) else {
        return -libc::EINVAL;
    };
    if len > buf.capacity() {
        return -libc::EINVAL;
    }
    guard(|| {
        buf.set_len(len);
        0
    })
}

/// The buffer's length (bytes to send, or bytes sent for a returned buffer).
///
/// Thread: the buffer's owner.
#[no_mangle]
pub extern "C" fn zcio_buf_len(b: *const zcio_buf) -> usize {
    if b.is_null() {
        return 0;
    }
    // SAFETY: `b` is a live buffer handle.
    pb(unsafe { &*b }).map_or(0, |b| b.len())
}

/// Returns a buffer to its pool (NULL is ignored).
///
/// Thread: any; the buffer goes back to its pool; freed once (not after `zcio_sender_send` took it).
#[no_mangle]
pub extern "C" fn zcio_buf_free(b: *mut zcio_buf) {
    if !b.is_null() {
        // SAFETY: `b` came from zcio_pool_get / zcio_sender_next_completion, freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(b) })));
    }
}

/// Creates a sender for the connected TCP/UDP socket `fd` (ownership passes to the sender,
/// which closes it) sending from `pool`, in `mode` (`ZCIO_TX_*`). Returns 0 or `-errno`
/// (`fd` is closed on failure too).
///
/// Thread: any; the calling thread becomes the owner. Ownership: `*out` until `zcio_sender_free`.
#[no_mangle]
pub extern "C" fn zcio_sender_new(
    out: *mut *mut zcio_sender,
    fd: c_int,
    pool: *const zcio_pool,
    mode: u32,
) -> c_int {
    if out.is_null() || pool.is_null() || fd < 0 {
        return -libc::EINVAL;
    }
    let mode = match mode {
        ZCIO_TX_COPY => TxMode::Copy,
        ZCIO_TX_MSG_ZC => TxMode::MsgZc,
        ZCIO_TX_URING_ZC => TxMode::UringZc,
        ZCIO_TX_URING_ZC_FIXED => TxMode::UringZcFixed,
        ZCIO_TX_AUTO => TxMode::Auto,
        ZCIO_TX_URING_COPY => TxMode::UringCopy,
        _ => return -libc::EINVAL,
    };
    guard(|| {
        // SAFETY: the caller hands over ownership of the open socket `fd`.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: `pool` is a live pool handle.
        let pool = unsafe { &(*pool).pool };
        match Sender::new(sock, pool, SenderConfig::new(mode)) {
            Ok(sender) => {
                // SAFETY: `out` is non-null.
                unsafe {
                    *out = Box::into_raw(Box::new(zcio_sender {
                        owner: crate::Owner::here(),
                        sender,
                    }))
                };
                0
            }
            Err(e) => tx_errno(&e),
        }
    })
}

/// Frees a sender and closes its socket (NULL is ignored). Sends in flight are waited for
/// by the library so no buffer is released while the kernel reads it.
///
/// Thread: the owner (waiting for sends in flight uses its ring); freed once.
#[no_mangle]
pub extern "C" fn zcio_sender_free(s: *mut zcio_sender) {
    if !s.is_null() {
        // SAFETY: `s` came from zcio_sender_new and is freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(s) })));
    }
}

fn with_sender(s: *mut zcio_sender, f: impl FnOnce(&mut Sender) -> c_int) -> c_int {
    if s.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `s` is a live sender handle; only its (immutable) owner is read first.
    if !unsafe { (*s).owner }.is_here() {
        return -libc::EPERM;
    }
    // SAFETY: the owner thread's exclusive use of its live handle.
    let sender = unsafe { &mut (*s).sender };
    guard(|| f(sender))
}

/// Sends `buf`. On success (0) the buffer is taken (the handle is invalid afterwards; the
/// buffer comes back with its completion) and the ticket is written to `*ticket` if non-NULL.
/// Never waits: `-EAGAIN` when the send cannot be queued now (`depth` sends in flight, or a
/// full socket buffer on the copy and MSG_ZEROCOPY paths) — the buffer is still the caller's;
/// `zcio_sender_wait` waits for room. `-EINVAL` for a bad argument.
///
/// Thread: the owner only (`-EPERM` from any other; the buffer then stays the caller's).
#[no_mangle]
pub extern "C" fn zcio_sender_send(
    s: *mut zcio_sender,
    buf: *mut zcio_buf,
    ticket: *mut u64,
) -> c_int {
    if buf.is_null() {
        return -libc::EINVAL;
    }
    with_sender(s, |sender| {
        // SAFETY: `buf` is a live buffer handle whose ownership the caller offers.
        let r = unsafe {
            send_buf(buf, |b| {
                sender.send(b).map_err(|r| (r.reason.errno(), r.buf))
            })
        };
        crate::ring::sent(r.map(|t| t.0), ticket)
    })
}

/// Collects finished sends without blocking; returns how many completions are ready.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_sender_poll(s: *mut zcio_sender) -> c_int {
    with_sender(s, |sender| match sender.poll() {
        Ok(n) => n as c_int,
        Err(e) => tx_errno(&e),
    })
}

/// Waits up to `timeout_ms` for at least one completion; returns how many are ready.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_sender_wait(s: *mut zcio_sender, timeout_ms: c_int) -> c_int {
    with_sender(s, |sender| match sender.wait(ms(timeout_ms)) {
        Ok(n) => n as c_int,
        Err(e) => tx_errno(&e),
    })
}

/// Waits until every send has completed (`-ETIMEDOUT` after `timeout_ms`).
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_sender_flush(s: *mut zcio_sender, timeout_ms: c_int) -> c_int {
    with_sender(s, |sender| match sender.flush(ms(timeout_ms)) {
        Ok(()) => 0,
        Err(e) => tx_errno(&e),
    })
}

/// Takes the oldest ready completion into `*out` and its buffer into `*buf` (the caller owns
/// it again: reuse it or `zcio_buf_free` it). Returns 1, or 0 when none is ready.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_sender_next_completion(
    s: *mut zcio_sender,
    out: *mut zcio_tx_completion,
    buf: *mut *mut zcio_buf,
) -> c_int {
    if out.is_null() || buf.is_null() {
        return -libc::EINVAL;
    }
    with_sender(s, |sender| {
        let Some((c, b)) = sender.next_completion() else {
            return 0;
        };
        let error = c.error.as_ref().map_or(0, |e| -e.errno());
        let done = zcio_tx_completion {
            ticket: c.ticket.0,
            len: c.len,
            bytes: c.bytes,
            path: path_code(c.path),
            zerocopy: zc_code(c.zerocopy),
            error,
        };
        // SAFETY: both output pointers are non-null.
        unsafe {
            *out = done;
            *buf = Box::into_raw(Box::new(zcio_buf::new(b)));
        }
        1
    })
}

pub(crate) fn zc_code(z: ZcStatus) -> u32 {
    match z {
        ZcStatus::NotAttempted => ZCIO_ZC_NOT_ATTEMPTED,
        ZcStatus::ZeroCopy => ZCIO_ZC_ZEROCOPY,
        ZcStatus::Copied => ZCIO_ZC_COPIED,
        ZcStatus::Mixed => ZCIO_ZC_MIXED,
        ZcStatus::Unknown => ZCIO_ZC_UNKNOWN,
    }
}

pub(crate) fn path_code(p: Path) -> u32 {
    match p {
        Path::Copy => ZCIO_TX_COPY,
        Path::MsgZc => ZCIO_TX_MSG_ZC,
        Path::UringZc => ZCIO_TX_URING_ZC,
        Path::UringZcFixed => ZCIO_TX_URING_ZC_FIXED,
        Path::UringCopy => ZCIO_TX_URING_COPY,
    }
}

pub(crate) fn mode_of(mode: u32) -> Option<TxMode> {
    Some(match mode {
        ZCIO_TX_COPY => TxMode::Copy,
        ZCIO_TX_MSG_ZC => TxMode::MsgZc,
        ZCIO_TX_URING_ZC => TxMode::UringZc,
        ZCIO_TX_URING_ZC_FIXED => TxMode::UringZcFixed,
        ZCIO_TX_AUTO => TxMode::Auto,
        ZCIO_TX_URING_COPY => TxMode::UringCopy,
        _ => return None,
    })
}

pub(crate) fn path_cstr(p: Path) -> *const c_char {
    match p {
        Path::Copy => c"copy".as_ptr(),
        Path::MsgZc => c"msg-zc".as_ptr(),
        Path::UringZc => c"uring-zc".as_ptr(),
        Path::UringZcFixed => c"uring-zc-fixed".as_ptr(),
        Path::UringCopy => c"uring-copy".as_ptr(),
    }
}

/// The path the sender currently takes, as a static string (`"copy"`, `"msg-zc"`,
/// `"uring-zc"`, `"uring-zc-fixed"`, `"uring-copy"`); NULL for a NULL handle.
///
/// Thread: any.
#[no_mangle]
pub extern "C" fn zcio_sender_path(s: *const zcio_sender) -> *const c_char {
    if s.is_null() {
        return std::ptr::null();
    }
    // SAFETY: `s` is a live sender handle.
    path_cstr(unsafe { (*s).sender.path() })
}

/// A snapshot of what the sender reports into `*out`: its path, counters, every fallback
/// with its reason, and its path counters (`stats` in the JSON). Free it with
/// `zcio_report_free`. Returns 0 or `-EINVAL`.
///
/// Thread: the owner only (`-EPERM` from any other: the counters are not atomic).
#[no_mangle]
pub extern "C" fn zcio_sender_report(
    s: *mut zcio_sender,
    out: *mut *mut crate::report::zcio_report,
) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    with_sender(s, |sender| {
        crate::report::put(out, crate::report::of(sender, sender.stats()))
    })
}

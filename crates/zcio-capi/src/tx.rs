//! Zero-copy send (`zcio::tx::Sender`) and its buffer pool, for C.

use crate::{guard, neg};
use libc::{c_char, c_int, c_void};
use std::os::fd::{FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;
use zcio_core::buf::pool::{Pool, PoolBuf};
use zcio_core::tx::{Path, SendError, Sender, SenderConfig, TxError, TxMode, ZcStatus};

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

/// Completion `zerocopy` value: sent by copy.
pub const ZCIO_ZC_NOT_ATTEMPTED: u32 = 0;
/// Completion `zerocopy` value: every part went zero-copy.
pub const ZCIO_ZC_ZEROCOPY: u32 = 1;
/// Completion `zerocopy` value: the kernel copied after all.
pub const ZCIO_ZC_COPIED: u32 = 2;
/// Completion `zerocopy` value: some parts zero-copy, some copied.
pub const ZCIO_ZC_MIXED: u32 = 3;
/// Completion `zerocopy` value: io_uring zero-copy send on a kernel without
/// `IORING_SEND_ZC_REPORT_USAGE` (before 6.2): whether the kernel copied is unknown.
pub const ZCIO_ZC_UNREPORTED: u32 = 4;

/// A pool of page-aligned send buffers. Opaque.
pub struct zcio_pool {
    pool: Pool,
}

/// One buffer from a pool, owned by the caller until handed to `zcio_sender_send` (which
/// takes it) or `zcio_buf_free` (which returns it to its pool). Opaque.
pub struct zcio_buf {
    buf: PoolBuf,
}

/// A sender owning one connected TCP or UDP socket. Opaque; one thread at a time.
pub struct zcio_sender {
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

fn tx_errno(e: &TxError) -> c_int {
    match e {
        TxError::Socket { source, .. } => neg(source),
        TxError::Timeout { .. } => -libc::ETIMEDOUT,
        TxError::Ring(e) => neg(e),
    }
}

fn ms(timeout_ms: c_int) -> Duration {
    Duration::from_millis(timeout_ms.max(0) as u64)
}

/// Creates a pool of `count` buffers of `slot_size` bytes into `*out`. Returns 0 or `-errno`.
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
#[no_mangle]
pub extern "C" fn zcio_pool_free(p: *mut zcio_pool) {
    if !p.is_null() {
        // SAFETY: `p` came from zcio_pool_new and is freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(p) })));
    }
}

/// Takes a free buffer (length 0) into `*out`; `-EAGAIN` when every buffer is out.
#[no_mangle]
pub extern "C" fn zcio_pool_get(p: *const zcio_pool, out: *mut *mut zcio_buf) -> c_int {
    if p.is_null() || out.is_null() {
        return -libc::EINVAL;
    }
    guard(|| {
        // SAFETY: `p` is a live pool handle.
        match unsafe { (*p).pool.try_get() } {
            Some(buf) => {
                // SAFETY: `out` is non-null.
                unsafe { *out = Box::into_raw(Box::new(zcio_buf { buf })) };
                0
            }
            None => -libc::EAGAIN,
        }
    })
}

/// The buffer's memory (`zcio_buf_capacity` bytes, writable while the caller owns it).
#[no_mangle]
pub extern "C" fn zcio_buf_data(b: *mut zcio_buf) -> *mut c_void {
    if b.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `b` is a live buffer handle owned by the caller.
    let buf = unsafe { &mut (*b).buf };
    // The pointer is taken from a slice over the whole slot (so it is valid for the
    // capacity), then the length is restored.
    let len = buf.len();
    buf.set_len(buf.capacity());
    let p = buf.as_mut_ptr();
    buf.set_len(len);
    p.cast()
}

/// The buffer's capacity in bytes.
#[no_mangle]
pub extern "C" fn zcio_buf_capacity(b: *const zcio_buf) -> usize {
    if b.is_null() {
        return 0;
    }
    // SAFETY: `b` is a live buffer handle.
    unsafe { (*b).buf.capacity() }
}

/// Sets how many bytes of the buffer are to be sent. `-EINVAL` beyond the capacity.
#[no_mangle]
pub extern "C" fn zcio_buf_set_len(b: *mut zcio_buf, len: usize) -> c_int {
    if b.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `b` is a live buffer handle.
    let buf = unsafe { &mut (*b).buf };
    if len > buf.capacity() {
        return -libc::EINVAL;
    }
    guard(|| {
        buf.set_len(len);
        0
    })
}

/// The buffer's length (bytes to send, or bytes sent for a returned buffer).
#[no_mangle]
pub extern "C" fn zcio_buf_len(b: *const zcio_buf) -> usize {
    if b.is_null() {
        return 0;
    }
    // SAFETY: `b` is a live buffer handle.
    unsafe { (*b).buf.len() }
}

/// Returns a buffer to its pool (NULL is ignored).
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
                unsafe { *out = Box::into_raw(Box::new(zcio_sender { sender })) };
                0
            }
            Err(e) => tx_errno(&e),
        }
    })
}

/// Frees a sender and closes its socket (NULL is ignored). Sends in flight are waited for
/// by the library so no buffer is released while the kernel reads it.
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
    // SAFETY: `s` is a live sender handle used by one thread at a time.
    let sender = unsafe { &mut (*s).sender };
    guard(|| f(sender))
}

/// Sends `buf` (taken: the handle is invalid afterwards; the buffer comes back with its
/// completion). Writes the ticket to `*ticket` if non-NULL. Returns 0 or `-EINVAL`.
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
        // SAFETY: `buf` is a live buffer handle whose ownership the caller hands over.
        let b = unsafe { Box::from_raw(buf) };
        let t = sender.send(b.buf);
        if !ticket.is_null() {
            // SAFETY: non-null output pointer.
            unsafe { *ticket = t.0 };
        }
        0
    })
}

/// Collects finished sends without blocking; returns how many completions are ready.
#[no_mangle]
pub extern "C" fn zcio_sender_poll(s: *mut zcio_sender) -> c_int {
    with_sender(s, |sender| match sender.poll() {
        Ok(n) => n as c_int,
        Err(e) => tx_errno(&e),
    })
}

/// Waits up to `timeout_ms` for at least one completion; returns how many are ready.
#[no_mangle]
pub extern "C" fn zcio_sender_wait(s: *mut zcio_sender, timeout_ms: c_int) -> c_int {
    with_sender(s, |sender| match sender.wait(ms(timeout_ms)) {
        Ok(n) => n as c_int,
        Err(e) => tx_errno(&e),
    })
}

/// Waits until every send has completed (`-ETIMEDOUT` after `timeout_ms`).
#[no_mangle]
pub extern "C" fn zcio_sender_flush(s: *mut zcio_sender, timeout_ms: c_int) -> c_int {
    with_sender(s, |sender| match sender.flush(ms(timeout_ms)) {
        Ok(()) => 0,
        Err(e) => tx_errno(&e),
    })
}

/// Takes the oldest ready completion into `*out` and its buffer into `*buf` (the caller owns
/// it again: reuse it or `zcio_buf_free` it). Returns 1, or 0 when none is ready.
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
        let error = match &c.error {
            None => 0,
            Some(SendError::MessageTooBig { .. }) => -libc::EMSGSIZE,
            Some(SendError::Connection { errno }) | Some(SendError::Os { errno }) => -errno,
        };
        let done = zcio_tx_completion {
            ticket: c.ticket.0,
            len: c.len,
            bytes: c.bytes,
            path: path_code(c.path),
            zerocopy: match c.zerocopy {
                ZcStatus::NotAttempted => ZCIO_ZC_NOT_ATTEMPTED,
                ZcStatus::ZeroCopy => ZCIO_ZC_ZEROCOPY,
                ZcStatus::Copied => ZCIO_ZC_COPIED,
                ZcStatus::Mixed => ZCIO_ZC_MIXED,
                ZcStatus::Unreported => ZCIO_ZC_UNREPORTED,
            },
            error,
        };
        // SAFETY: both output pointers are non-null.
        unsafe {
            *out = done;
            *buf = Box::into_raw(Box::new(zcio_buf { buf: b }));
        }
        1
    })
}

fn path_code(p: Path) -> u32 {
    match p {
        Path::Copy => ZCIO_TX_COPY,
        Path::MsgZc => ZCIO_TX_MSG_ZC,
        Path::UringZc => ZCIO_TX_URING_ZC,
        Path::UringZcFixed => ZCIO_TX_URING_ZC_FIXED,
    }
}

/// The path the sender currently takes, as a static string (`"copy"`, `"msg-zc"`,
/// `"uring-zc"`, `"uring-zc-fixed"`); NULL for a NULL handle.
#[no_mangle]
pub extern "C" fn zcio_sender_path(s: *const zcio_sender) -> *const c_char {
    if s.is_null() {
        return std::ptr::null();
    }
    // SAFETY: `s` is a live sender handle.
    match unsafe { (*s).sender.path() } {
        Path::Copy => c"copy".as_ptr(),
        Path::MsgZc => c"msg-zc".as_ptr(),
        Path::UringZc => c"uring-zc".as_ptr(),
        Path::UringZcFixed => c"uring-zc-fixed".as_ptr(),
    }
}

//! The shared send ring (`zcio::tx::SendRing`) for C: sends of many sockets on one io_uring
//! per thread, never waiting inside a send (`-EAGAIN` with the buffer still the caller's).

use crate::report::zcio_report;
use crate::rx::{zcio_rx_chunk, Shared};
use crate::tx::{
    mode_of, ms, path_code, path_cstr, send_buf, tx_errno, zc_code, zcio_buf, zcio_pool,
};
use crate::{guard, Owner};
use libc::{c_char, c_int};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;
use zcio_core::ring::RingConfig;
use zcio_core::tx::{Dest, SendRing, SendRingConfig, SenderConfig, SockId, TxBuf};

/// One io_uring per thread carrying the sends of many sockets. Opaque; one thread.
pub struct zcio_send_ring {
    owner: Owner,
    ring: SendRing,
    /// The receivers of chunks in flight, by ticket: a chunk comes back as a
    /// `zcio_rx_chunk` of its own receiver.
    chunks: HashMap<u64, Arc<Shared>>,
}

/// The result of one send on a send ring.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcio_send_completion {
    /// The ticket the send returned.
    pub ticket: u64,
    /// The socket.
    pub sock: u64,
    /// The caller's token given with the send.
    pub token: u64,
    /// Bytes the buffer held.
    pub len: usize,
    /// Bytes the kernel accepted.
    pub bytes: usize,
    /// `ZCIO_TX_*` path the send took.
    pub path: u32,
    /// `ZCIO_ZC_*`.
    pub zerocopy: u32,
    /// 0, or `-errno` when the send failed (`-ECANCELED`: its socket was closed first).
    pub error: c_int,
}

fn with_ring(r: *mut zcio_send_ring, f: impl FnOnce(&mut zcio_send_ring) -> c_int) -> c_int {
    if r.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `r` is a live handle; only its (immutable) owner is read first.
    if !unsafe { (*r).owner }.is_here() {
        return -libc::EPERM;
    }
    // SAFETY: the owner thread's exclusive use of its live handle.
    guard(|| f(unsafe { &mut *r }))
}

/// Creates a send ring into `*out`: `entries` submission queue entries (0: 256), a registered
/// file table of `files` slots (0: 65536, capped by `RLIMIT_NOFILE`), entering the kernel
/// once `submit_batch` requests are queued (0: 32). Without io_uring it still works, by
/// `MSG_ZEROCOPY` and copy (see `zcio_send_ring_report`). Returns 0 or `-errno`.
///
/// Thread: any; the calling thread becomes the owner. Ownership: `*out` until
/// `zcio_send_ring_free`.
#[no_mangle]
pub extern "C" fn zcio_send_ring_new(
    out: *mut *mut zcio_send_ring,
    entries: u32,
    files: u32,
    submit_batch: u32,
) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    guard(|| {
        let d = SendRingConfig::default();
        let cfg = SendRingConfig {
            ring: RingConfig {
                entries: if entries == 0 {
                    d.ring.entries
                } else {
                    entries
                },
                ..d.ring
            },
            files: if files == 0 { d.files } else { files },
            submit_batch: if submit_batch == 0 {
                d.submit_batch
            } else {
                submit_batch as usize
            },
        };
        match SendRing::new(&cfg) {
            Ok(ring) => {
                let r = zcio_send_ring {
                    owner: Owner::here(),
                    ring,
                    chunks: HashMap::new(),
                };
                // SAFETY: `out` is non-null.
                unsafe { *out = Box::into_raw(Box::new(r)) };
                0
            }
            Err(e) => tx_errno(&e),
        }
    })
}

/// Frees a send ring (NULL is ignored): waits up to 2 s for sends in flight, gives back the
/// buffers and chunks that came back (chunks through `zcio_rx_chunk_free`), and closes every
/// socket. Buffers the kernel still holds then are leaked, never reused. Flush first
/// (`zcio_send_ring_flush`) to get every completion.
///
/// Thread: the owner (its ring is used to wait); freed once.
#[no_mangle]
pub extern "C" fn zcio_send_ring_free(r: *mut zcio_send_ring) {
    if r.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `r` came from zcio_send_ring_new and is freed once.
        let mut r = unsafe { Box::from_raw(r) };
        let _ = r.ring.flush(Duration::from_secs(2));
        while let Some((c, b)) = r.ring.next_completion() {
            if let TxBuf::Chunk(chunk) = b {
                if let Some(shared) = r.chunks.remove(&c.ticket.0) {
                    let p = Box::into_raw(Box::new(zcio_rx_chunk { chunk, shared }));
                    crate::rx::zcio_rx_chunk_free(p);
                }
            }
        }
        drop(r);
    }));
}

/// Registers `pool` with the ring, once for every socket (up to 16 pools): sends of its
/// buffers on the zero-copy paths then use fixed buffers. Returns 0 or `-errno`; a failure
/// (`-ENOMEM`: `RLIMIT_MEMLOCK` exhausted) is also recorded as a fallback (see
/// `zcio_send_ring_report`) and sends pin pages per send instead.
///
/// Sizing the pool: a copy's buffer comes back when the socket has taken its bytes, a
/// zero-copy buffer when the kernel drops its pages, which over TCP is when the peer ACKs
/// them: a round trip, plus the peer's delayed ACK (up to 40 ms). A zero-copy pool needs about
/// connections x round trip x rate per connection bytes (or connections x sends kept in
/// flight each). `ZCIO_TX_AUTO` sends by copy while a pool runs dry with its buffers in the
/// ring's zero-copy sends (fewer than 1/8 free; back at 1/4), recorded as a fallback; the
/// explicit zero-copy modes wait for the buffers.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_register_pool(
    r: *mut zcio_send_ring,
    pool: *const zcio_pool,
) -> c_int {
    if pool.is_null() {
        return -libc::EINVAL;
    }
    with_ring(r, |r| {
        // SAFETY: `pool` is a live pool handle.
        match r.ring.register_pool(unsafe { &(*pool).pool }) {
            Ok(()) => 0,
            Err(e) => tx_errno(&e),
        }
    })
}

/// Adds the connected TCP/UDP socket `fd` (ownership passes to the ring, which closes it) in
/// `mode` (`ZCIO_TX_*`) with at most `depth` sends in flight (0: 64); its id goes to
/// `*sock`. Returns 0 or `-errno` (`fd` is closed on failure too): `-EINVAL` for a listening
/// socket, `-ENOTCONN` for a stream socket that is not connected (or the error its failed
/// connect left, e.g. `-ECONNREFUSED`); a connecting one is taken (its sends wait for the
/// connection).
///
/// Thread: the owner only (`-EPERM` from any other; `fd` then stays the caller's).
#[no_mangle]
pub extern "C" fn zcio_send_ring_add(
    r: *mut zcio_send_ring,
    fd: c_int,
    mode: u32,
    depth: u32,
    sock: *mut u64,
) -> c_int {
    if sock.is_null() || fd < 0 {
        return -libc::EINVAL;
    }
    let Some(mode) = mode_of(mode) else {
        return -libc::EINVAL;
    };
    with_ring(r, |r| {
        // SAFETY: the caller hands over ownership of the open socket `fd`.
        let s = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut cfg = SenderConfig::new(mode);
        if depth > 0 {
            cfg.depth = depth as usize;
        }
        match r.ring.add(s, &cfg) {
            Ok(id) => {
                // SAFETY: non-null output pointer.
                unsafe { *sock = id.raw() };
                0
            }
            Err(e) => tx_errno(&e),
        }
    })
}

fn put_ticket(ticket: *mut u64, t: u64) {
    if !ticket.is_null() {
        // SAFETY: non-null output pointer.
        unsafe { *ticket = t };
    }
}

/// The C result of a send made through `send_buf`: 0 with the ticket in `*ticket` (if
/// non-NULL), `-errno` of a refusal (the buffer is still the caller's), or the handle's error.
pub(crate) fn sent(res: Result<u64, Result<c_int, c_int>>, ticket: *mut u64) -> c_int {
    match res {
        Ok(t) => {
            put_ticket(ticket, t);
            0
        }
        Err(Ok(errno)) => -errno,
        Err(Err(rc)) => rc,
    }
}

/// Sends `buf` on `sock` with the caller's `token` (returned in the completion). On success
/// (0) the buffer is taken (the handle is invalid afterwards; it comes back with its
/// completion) and the ticket goes to `*ticket` if non-NULL. Never waits: `-EAGAIN` when the
/// send cannot be queued now (the socket's `depth` in flight, a full socket buffer or no room
/// on the syscall paths) — the buffer is still the caller's; retry once
/// `zcio_send_ring_next_writable` names the socket. `-EBADF`: the socket is closed (the
/// buffer is still the caller's).
///
/// Never waits, but may work: the send that fills the batch (`submit_batch` requests staged,
/// across sockets) enters the kernel, and that `io_uring_enter` issues the whole batch: the
/// TCP work of each request (on loopback also the receiver's) runs in this call (measured: 2.7
/// ms of CPU for a batch of 32 sends of 64 KiB). To keep sends short, create the ring with a
/// `submit_batch` larger than what one turn of the loop sends and call
/// `zcio_send_ring_submit` at the end of the turn.
///
/// Thread: the owner only (`-EPERM` from any other; the buffer then stays the caller's).
#[no_mangle]
pub extern "C" fn zcio_send_ring_send(
    r: *mut zcio_send_ring,
    sock: u64,
    buf: *mut zcio_buf,
    token: u64,
    ticket: *mut u64,
) -> c_int {
    if buf.is_null() {
        return -libc::EINVAL;
    }
    with_ring(r, |r| {
        let id = SockId::from_raw(sock);
        // SAFETY: `buf` is a live buffer handle whose ownership the caller offers.
        let res = unsafe {
            send_buf(buf, |b| {
                r.ring.send_with(id, b, token).map_err(|e| {
                    let back = e.buf.into_pool().expect("a pool buffer comes back as one");
                    (e.reason.errno(), back)
                })
            })
        };
        sent(res.map(|t| t.0), ticket)
    })
}

/// Sends `hdr_len` bytes at `hdr` (a header of at most 4096 bytes, copied now) followed by
/// pool buffer `buf` on `sock` as one request (a vectored send: `SEND_ZC` with
/// `IORING_SEND_VECTORIZED`, or `SENDMSG_ZC` with an iovec before Linux 6.17, recorded in the
/// socket's report): no second send, no copy of the body into a buffer with room for the
/// header. On success (0) `buf` is taken and comes back with the completion
/// (`zcio_send_ring_next_completion`'s `*buf`), whose `len` and `bytes` count header and
/// body. `-EAGAIN` / `-EBADF` as for `zcio_send_ring_send` (the buffer is still the caller's);
/// `-EINVAL` for a NULL or oversized header.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_send_hdr(
    r: *mut zcio_send_ring,
    sock: u64,
    hdr: *const u8,
    hdr_len: usize,
    buf: *mut zcio_buf,
    token: u64,
    ticket: *mut u64,
) -> c_int {
    if buf.is_null() || (hdr.is_null() && hdr_len > 0) || hdr_len > 4096 {
        return -libc::EINVAL;
    }
    let head = if hdr_len == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller passes `hdr_len` readable bytes at `hdr`; they are copied now.
        unsafe { std::slice::from_raw_parts(hdr, hdr_len) }.to_vec()
    };
    with_ring(r, |r| {
        let id = SockId::from_raw(sock);
        // SAFETY: `buf` is a live buffer handle whose ownership the caller offers.
        let res = unsafe {
            send_buf(buf, |b| {
                let slices = vec![TxBuf::Vec(head), TxBuf::Pool(b)];
                r.ring.send_vectored(id, slices, token).map_err(|e| {
                    let back = e
                        .buf
                        .into_slices()
                        .and_then(|v| v.into_iter().filter_map(TxBuf::into_pool).last())
                        .expect("the body comes back");
                    (e.reason.errno(), back)
                })
            })
        };
        sent(res.map(|t| t.0), ticket)
    })
}

/// Sends pool buffer `buf` on the unconnected UDP socket `sock` to `addr` (a `struct
/// sockaddr_in` or `struct sockaddr_in6` of `addrlen` bytes) as one datagram train: cut into datagrams of `segment`
/// bytes by GSO when `segment` > 0 (at most 64 of them), with the TOS / traffic class byte
/// `tos` when `tos` >= 0 (DSCP << 2 | ECN). On the ring it is one `IORING_OP_SENDMSG_ZC`
/// with the destination and `UDP_SEGMENT` in the message; many trains to many peers go to
/// the kernel in one `io_uring_enter`. Returns 0 (the buffer is taken; it comes back with its
/// completion, whose `error` is e.g. `-ENETUNREACH` for an unreachable peer, `-EINVAL` for a
/// train of more than 64 segments, while the socket goes on), `-EAGAIN` (backpressure: the
/// buffer is still the caller's), `-EBADF` (closed socket) or `-EINVAL` (a bad address).
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_send_to(
    r: *mut zcio_send_ring,
    sock: u64,
    buf: *mut zcio_buf,
    addr: *const std::ffi::c_void,
    addrlen: u32,
    segment: u16,
    tos: c_int,
    token: u64,
    ticket: *mut u64,
) -> c_int {
    if buf.is_null() || addr.is_null() || tos > 255 {
        return -libc::EINVAL;
    }
    // SAFETY: the caller passes `addrlen` readable bytes at `addr`.
    let Some(to) = (unsafe { socket_addr(addr.cast(), addrlen) }) else {
        return -libc::EINVAL;
    };
    let dest = Dest {
        addr: to,
        segment: (segment > 0).then_some(segment),
        tos: (tos >= 0).then_some(tos as u8),
    };
    with_ring(r, |r| {
        let id = SockId::from_raw(sock);
        // SAFETY: `buf` is a live buffer handle whose ownership the caller offers.
        let res = unsafe {
            send_buf(buf, |b| {
                r.ring.send_to_with(id, b, &dest, token).map_err(|e| {
                    let back = e.buf.into_pool().expect("a pool buffer comes back as one");
                    (e.reason.errno(), back)
                })
            })
        };
        sent(res.map(|t| t.0), ticket)
    })
}

/// The address at `addr` (`AF_INET` or `AF_INET6`, `len` bytes), if it is one.
///
/// # Safety
///
/// `addr` points at `len` readable bytes.
unsafe fn socket_addr(addr: *const libc::sockaddr, len: u32) -> Option<SocketAddr> {
    let len = len as usize;
    if len < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: at least the family is readable (checked above).
    let family = i32::from(unsafe { std::ptr::read_unaligned(addr).sa_family });
    match family {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: `len` covers a sockaddr_in.
            let a = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in>()) };
            Some(SocketAddr::from((
                u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: `len` covers a sockaddr_in6.
            let a = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in6>()) };
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                a.sin6_addr.s6_addr.into(),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Sends a received chunk on `sock` as it lies in the receiver's memory (what a proxy
/// forwards), with the caller's `token`. On success (0) the chunk is taken: it comes back
/// with its completion (`zcio_send_ring_next_completion`'s `*chunk`) after the kernel's last
/// reference to it is gone, to be freed with `zcio_rx_chunk_free` as usual. `-EAGAIN` /
/// `-EBADF` as for `zcio_send_ring_send`: the chunk is still the caller's.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_send_chunk(
    r: *mut zcio_send_ring,
    sock: u64,
    chunk: *mut zcio_rx_chunk,
    token: u64,
    ticket: *mut u64,
) -> c_int {
    if chunk.is_null() {
        return -libc::EINVAL;
    }
    with_ring(r, |r| {
        let id = SockId::from_raw(sock);
        // SAFETY: `chunk` is a live chunk handle whose ownership the caller offers. Its fields
        // are moved out without running its Drop (the chunk stays counted as lent by its
        // receiver while the ring holds it); on refusal they are moved back into the same
        // handle, on success the handle's memory is freed without dropping them again.
        unsafe {
            let c = std::ptr::read(&(*chunk).chunk);
            match r.ring.send_with(id, c, token) {
                Ok(t) => {
                    let shared = std::ptr::read(&(*chunk).shared);
                    r.chunks.insert(t.0, shared);
                    drop(Box::from_raw(
                        chunk.cast::<std::mem::ManuallyDrop<zcio_rx_chunk>>(),
                    ));
                    put_ticket(ticket, t.0);
                    0
                }
                Err(e) => {
                    let errno = e.reason.errno();
                    let back = e.buf.into_chunk().expect("a chunk comes back as one");
                    std::ptr::write(&mut (*chunk).chunk, back);
                    -errno
                }
            }
        }
    })
}

/// Submits the queued requests of every socket with one `io_uring_enter` (none when nothing
/// is queued) and collects completions. Returns how many completions are ready.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_submit(r: *mut zcio_send_ring) -> c_int {
    with_ring(r, |r| match r.ring.submit() {
        Ok(()) => r.ring.ready() as c_int,
        Err(e) => tx_errno(&e),
    })
}

/// Makes progress without blocking (submits, collects; enters the kernel only when
/// something is queued or it flagged deferred task work, so a loop that only polls sees every
/// completion); returns how many completions are ready.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_poll(r: *mut zcio_send_ring) -> c_int {
    with_ring(r, |r| match r.ring.poll() {
        Ok(n) => n as c_int,
        Err(e) => tx_errno(&e),
    })
}

/// Waits up to `timeout_ms` for at least one completion; returns how many are ready.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_wait(r: *mut zcio_send_ring, timeout_ms: c_int) -> c_int {
    with_ring(r, |r| match r.ring.wait(ms(timeout_ms)) {
        Ok(n) => n as c_int,
        Err(e) => tx_errno(&e),
    })
}

/// Waits until every send of every socket has completed (`-ETIMEDOUT` after `timeout_ms`).
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_flush(r: *mut zcio_send_ring, timeout_ms: c_int) -> c_int {
    with_ring(r, |r| match r.ring.flush(ms(timeout_ms)) {
        Ok(()) => 0,
        Err(e) => tx_errno(&e),
    })
}

/// Takes the oldest ready completion into `*out` and what was sent: a pool buffer into `*buf`
/// or a received chunk into `*chunk` (the other is set to NULL; the caller owns it again).
/// Returns 1, or 0 when none is ready.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_next_completion(
    r: *mut zcio_send_ring,
    out: *mut zcio_send_completion,
    buf: *mut *mut zcio_buf,
    chunk: *mut *mut zcio_rx_chunk,
) -> c_int {
    if out.is_null() || buf.is_null() || chunk.is_null() {
        return -libc::EINVAL;
    }
    with_ring(r, |r| {
        let Some((c, b)) = r.ring.next_completion() else {
            return 0;
        };
        let done = zcio_send_completion {
            ticket: c.ticket.0,
            sock: c.sock.raw(),
            token: c.token,
            len: c.len,
            bytes: c.bytes,
            path: path_code(c.path),
            zerocopy: zc_code(c.zerocopy),
            error: c.error.as_ref().map_or(0, |e| -e.errno()),
        };
        let (pb, ch): (*mut zcio_buf, *mut zcio_rx_chunk) = match b {
            TxBuf::Pool(p) => (
                Box::into_raw(Box::new(zcio_buf::new(p))),
                std::ptr::null_mut(),
            ),
            TxBuf::Chunk(k) => match r.chunks.remove(&c.ticket.0) {
                Some(shared) => (
                    std::ptr::null_mut(),
                    Box::into_raw(Box::new(zcio_rx_chunk { chunk: k, shared })),
                ),
                // Not sent from C: nothing to hand back.
                None => (std::ptr::null_mut(), std::ptr::null_mut()),
            },
            TxBuf::Vec(_) | TxBuf::Bytes(_) => (std::ptr::null_mut(), std::ptr::null_mut()),
            // A header + body send from C (`zcio_send_ring_send_hdr`): the body comes back;
            // the header was the library's copy.
            TxBuf::Slices(parts) => match parts.into_iter().filter_map(TxBuf::into_pool).last() {
                Some(p) => (
                    Box::into_raw(Box::new(zcio_buf::new(p))),
                    std::ptr::null_mut(),
                ),
                None => (std::ptr::null_mut(), std::ptr::null_mut()),
            },
        };
        // SAFETY: the output pointers are non-null.
        unsafe {
            *out = done;
            *buf = pb;
            *chunk = ch;
        }
        1
    })
}

/// A socket that refused a send (`-EAGAIN`) and can take one again, into `*sock`. Returns 1,
/// or 0 when none is.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_next_writable(r: *mut zcio_send_ring, sock: *mut u64) -> c_int {
    if sock.is_null() {
        return -libc::EINVAL;
    }
    with_ring(r, |r| match r.ring.next_writable() {
        Some(id) => {
            // SAFETY: non-null output pointer.
            unsafe { *sock = id.raw() };
            1
        }
        None => 0,
    })
}

/// Closes a socket: later sends get `-EBADF`; its sends not yet in the kernel complete with
/// `-ECANCELED`, those in the kernel are cancelled (a started one may complete partly); every
/// buffer still comes back with its completion. A TCP connection with zero-copy sends in the
/// kernel is reset; the bytes the reset purged are counted as not sent. Never waits. For a
/// graceful end, wait until `zcio_send_ring_sock_in_flight` is 0 first. `-ENOENT` for a
/// socket that is not open (unknown, or closed already).
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_close(r: *mut zcio_send_ring, sock: u64) -> c_int {
    with_ring(r, |r| match r.ring.close(SockId::from_raw(sock)) {
        Ok(()) => 0,
        Err(e) => tx_errno(&e),
    })
}

/// Sends of `sock` not yet completed (0 for a socket that is gone).
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_sock_in_flight(r: *mut zcio_send_ring, sock: u64) -> c_int {
    with_ring(r, |r| {
        r.ring
            .sock_in_flight(SockId::from_raw(sock))
            .min(i32::MAX as usize) as c_int
    })
}

/// The readiness descriptor: polls readable when `zcio_send_ring_on_ready` has work to do:
/// completions or deferred task work on the ring, a socket of a syscall path that became
/// writable or has notifications. The ring's own calls never leave it readable for work they
/// did themselves. It may wake for no completion in two cases: a zero-copy send's result
/// came without its notification (on_ready lets the socket's next sends go; the completion
/// follows with the notification), and a ring shared with a receiver is woken by the
/// receiver's completions too. A third depends on the kernel: it may flag task work while
/// one of the ring's calls runs and that call then runs it itself; a wake-up that lands
/// before the ring's look at the flag finds nothing (measured: 0.05–0.5 % of wake-ups on
/// 6.18, under 5 % on 6.1, up to 3 of 20 in a 6.12 guest and 28 of 49 in a 7.2 guest under
/// emulation). An empty wake-up costs one on_ready that finds nothing. Sends that complete
/// inside a call (copies taken at once) do
/// not make it readable: check `zcio_send_ring_next_completion` before sleeping. Returns the
/// descriptor (owned by the ring) or `-errno`.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_readiness_fd(r: *mut zcio_send_ring) -> c_int {
    with_ring(r, |r| match r.ring.readiness_fd() {
        Ok(fd) => fd.as_raw_fd(),
        Err(e) => tx_errno(&e),
    })
}

/// Harvests after the readiness descriptor fired; returns how many completions are ready.
/// Its work is O(completions + sockets with work), whatever the number of sockets, and
/// bounded per call (at most four rounds of submit-or-reap): work left keeps the descriptor
/// readable.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_on_ready(r: *mut zcio_send_ring) -> c_int {
    with_ring(r, |r| match r.ring.on_ready() {
        Ok(n) => n as c_int,
        Err(e) => tx_errno(&e),
    })
}

/// The path `sock`'s new sends take now, as a static string; `"closed"` for a socket closed
/// (while its last sends complete and after), NULL for an id the ring never gave.
///
/// Thread: the owner only (NULL from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_sock_path(r: *const zcio_send_ring, sock: u64) -> *const c_char {
    if r.is_null() {
        return std::ptr::null();
    }
    // SAFETY: `r` is a live handle; only its (immutable) owner is read first.
    if !unsafe { (*r).owner }.is_here() {
        return std::ptr::null();
    }
    // SAFETY: the owner thread's use of its live handle.
    let ring = unsafe { &(*r).ring };
    let id = SockId::from_raw(sock);
    match ring.sock_path(id) {
        Some(p) => path_cstr(p),
        None if ring.sock_closed(id) => c"closed".as_ptr(),
        None => std::ptr::null(),
    }
}

/// A snapshot of what the ring reports into `*out`: the best path it offers, the counters of
/// all its sockets with its own kernel entries, its fallbacks (set-up, registered files,
/// pool registration) and its counters (`stats` in the JSON: path counters and the ring's
/// lent buffers). Free it with `zcio_report_free`.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_report(
    r: *mut zcio_send_ring,
    out: *mut *mut zcio_report,
) -> c_int {
    with_ring(r, |r| {
        let stats = serde_json::json!({
            "tx": r.ring.stats(),
            "ring": r.ring.ring_stats(),
            "enters": r.ring.enters(),
            "sockets": r.ring.sockets(),
        });
        crate::report::put(out, crate::report::of(&r.ring, stats))
    })
}

/// A snapshot of what one socket reports into `*out`: its path, its counters (without the
/// ring's shared kernel entries), every fallback it took with its reason (registered file,
/// fixed buffers, zero-copy refused, COPIED, memlock) and its path counters; path `closed`
/// for a socket closed whose last sends are still completing. `-EBADF` for an unknown socket
/// or one that is gone.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_send_ring_sock_report(
    r: *mut zcio_send_ring,
    sock: u64,
    out: *mut *mut zcio_report,
) -> c_int {
    with_ring(r, |r| {
        let id = SockId::from_raw(sock);
        if r.ring.sock_mode(id).is_none() {
            return -libc::EBADF;
        }
        let path = r.ring.sock_path(id).map_or("closed", |p| p.name());
        let rep = crate::report::snapshot(
            path,
            &r.ring.sock_counters(id),
            r.ring.sock_fallbacks(id),
            serde_json::to_value(r.ring.sock_stats(id)).unwrap_or_default(),
        );
        crate::report::put(out, rep)
    })
}

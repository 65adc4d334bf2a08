//! Plain copy send: the kernel copies the bytes into socket buffers during the call.

use crate::sys::net;
use std::os::fd::AsRawFd;

/// What one copy send did.
#[derive(Debug, Default)]
pub(crate) struct CopyOutcome {
    /// Bytes accepted.
    pub bytes: usize,
    /// errno that stopped it.
    pub error: Option<i32>,
    /// `send` and `poll` calls made.
    pub syscalls: u64,
    /// Stopped because the socket buffer is full (`EAGAIN`); the rest is still to send.
    pub would_block: bool,
}

/// Sends `data[from..]` without blocking (`MSG_DONTWAIT`), in pieces of at most `chunk`
/// bytes (one datagram or GSO batch each on datagram sockets), until it is all sent, the
/// socket buffer is full ([`CopyOutcome::would_block`]) or an error stops it. `bytes` counts
/// what this call sent. An empty `data` makes one call (an empty datagram).
pub(crate) fn send_nb(fd: &impl AsRawFd, data: &[u8], chunk: usize, from: usize) -> CopyOutcome {
    let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
    let mut out = CopyOutcome::default();
    if data.is_empty() {
        out.syscalls += 1;
        match net::send(fd, data, flags) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => out.would_block = true,
            Err(e) => out.error = e.raw_os_error().or(Some(libc::EIO)),
        }
        return out;
    }
    let mut at = from;
    while at < data.len() {
        let end = at.saturating_add(chunk.max(1)).min(data.len());
        out.syscalls += 1;
        match net::send(fd, &data[at..end], flags) {
            Ok(0) => {
                out.error = Some(libc::EPIPE);
                break;
            }
            Ok(n) => {
                at += n;
                out.bytes += n;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                out.would_block = true;
                break;
            }
            Err(e) => {
                out.error = e.raw_os_error().or(Some(libc::EIO));
                break;
            }
        }
    }
    out
}

/// Sends all of `data`, waiting (`poll(POLLOUT)`) while the socket buffer is full. Only for
/// recovery from a failed ring, where the bytes the ring did not send must follow the ones
/// it did before anything else may go (see `docs/design/tx.md`, "Failure semantics").
pub(crate) fn send_all(fd: &impl AsRawFd, data: &[u8], chunk: usize) -> CopyOutcome {
    let mut out = CopyOutcome::default();
    loop {
        let o = send_nb(fd, data, chunk, out.bytes);
        out.bytes += o.bytes;
        out.syscalls += o.syscalls;
        if o.error.is_some() || !o.would_block {
            out.error = o.error;
            return out;
        }
        out.syscalls += 1;
        let _ = net::poll_one(fd, libc::POLLOUT, 100);
    }
}

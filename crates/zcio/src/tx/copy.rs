//! Plain copy send: the kernel copies the bytes into socket buffers during the call.

use crate::sys::msg::{self, MsgOpts};
use crate::sys::net;
use std::borrow::Cow;
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

/// One datagram (train) with its destination and control messages by copy (`sendmsg`,
/// `MSG_DONTWAIT`): all of `data` or nothing. `wait`: poll while the socket buffer is full
/// (only for recovery, as [`send_all`]).
pub(crate) fn send_msg(
    fd: &impl AsRawFd,
    data: &[u8],
    opts: &MsgOpts,
    v6: bool,
    wait: bool,
) -> CopyOutcome {
    let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
    let mut out = CopyOutcome::default();
    loop {
        out.syscalls += 1;
        match msg::sendmsg(fd, &[data], opts, v6, flags) {
            Ok(n) => out.bytes = n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if wait {
                    out.syscalls += 1;
                    let _ = net::poll_one(fd, libc::POLLOUT, 100);
                    continue;
                }
                out.would_block = true;
            }
            Err(e) => out.error = e.raw_os_error().or(Some(libc::EINVAL)),
        }
        return out;
    }
}

/// Bytes `off..off + len` of the concatenation of `parts` (borrowed when they lie in one
/// part, gathered when they span several).
pub(crate) fn range_of<'a>(parts: &[&'a [u8]], off: usize, len: usize) -> Cow<'a, [u8]> {
    let mut skip = off;
    let mut out: Option<Vec<u8>> = None;
    let mut want = len;
    for &p in parts {
        if want == 0 {
            break;
        }
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        let take = (p.len() - skip).min(want);
        let piece = &p[skip..skip + take];
        skip = 0;
        if out.is_none() && take == want {
            return Cow::Borrowed(piece);
        }
        out.get_or_insert_with(|| Vec::with_capacity(len))
            .extend_from_slice(piece);
        want -= take;
    }
    Cow::Owned(out.unwrap_or_default())
}

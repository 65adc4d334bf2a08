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
}

/// Sends all of `data` in pieces of at most `chunk` bytes (one datagram or GSO batch each on
/// datagram sockets). `EAGAIN` on a non-blocking socket waits for `POLLOUT`.
pub(crate) fn send_all(fd: &impl AsRawFd, data: &[u8], chunk: usize) -> CopyOutcome {
    let mut out = CopyOutcome::default();
    if data.is_empty() {
        out.syscalls += 1;
        if let Err(e) = net::send(fd, data, libc::MSG_NOSIGNAL) {
            out.error = e.raw_os_error().or(Some(libc::EIO));
        }
        return out;
    }
    while out.bytes < data.len() {
        let end = out.bytes.saturating_add(chunk).min(data.len());
        out.syscalls += 1;
        match net::send(fd, &data[out.bytes..end], libc::MSG_NOSIGNAL) {
            Ok(0) => {
                out.error = Some(libc::EPIPE);
                break;
            }
            Ok(n) => out.bytes += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                out.syscalls += 1;
                let _ = net::poll_one(fd, libc::POLLOUT, 100);
            }
            Err(e) => {
                out.error = e.raw_os_error().or(Some(libc::EIO));
                break;
            }
        }
    }
    out
}

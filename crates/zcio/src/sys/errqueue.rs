//! `MSG_ZEROCOPY` completions from the socket error queue (Linux 4.14).
//!
//! Each completion is a `sock_extended_err` with `ee_origin == SO_EE_ORIGIN_ZEROCOPY`, covering
//! the inclusive range of send call sequence numbers `[ee_info, ee_data]` (a u32 counter that
//! wraps). `ee_code & SO_EE_CODE_ZEROCOPY_COPIED` says the kernel copied the data after all.
//! The reaper here reads as many messages as one call to [`reap`] can get with `MSG_DONTWAIT`,
//! so a caller pays one `recvmsg` per *batch* of completions, not per send.

use super::{assert_layout, syscall, SO_EE_CODE_ZEROCOPY_COPIED, SO_EE_ORIGIN_ZEROCOPY};
use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// `struct sock_extended_err` from `linux/errqueue.h` (Linux 2.6).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SockExtendedErr {
    /// errno of the error, 0 for zero-copy completions.
    pub ee_errno: u32,
    /// `SO_EE_ORIGIN_*`.
    pub ee_origin: u8,
    /// ICMP type, or 0.
    pub ee_type: u8,
    /// ICMP code, or `SO_EE_CODE_ZEROCOPY_COPIED`.
    pub ee_code: u8,
    /// Padding.
    pub ee_pad: u8,
    /// For zero-copy: first sequence number of the range.
    pub ee_info: u32,
    /// For zero-copy: last sequence number of the range (inclusive).
    pub ee_data: u32,
}
assert_layout!(
    SockExtendedErr,
    size = 16,
    align = 4,
    ee_errno = 0,
    ee_origin = 4,
    ee_type = 5,
    ee_code = 6,
    ee_pad = 7,
    ee_info = 8,
    ee_data = 12
);
const _: () = assert!(std::mem::size_of::<libc::sock_extended_err>() == 16);

/// One zero-copy completion: send calls `lo..=hi` (u32 sequence numbers, may wrap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZcRange {
    /// First completed send sequence number.
    pub lo: u32,
    /// Last completed send sequence number (inclusive; `hi < lo` means the counter wrapped).
    pub hi: u32,
    /// The kernel copied the data (e.g. loopback delivery) instead of sending from user pages.
    pub copied: bool,
}

impl ZcRange {
    /// Number of send calls the range covers, wrap-aware.
    pub fn len(&self) -> u64 {
        u64::from(self.hi.wrapping_sub(self.lo)) + 1
    }
    /// Never true: a range covers at least one send.
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Whether sequence number `seq` lies in the range, wrap-aware.
    pub fn contains(&self, seq: u32) -> bool {
        seq.wrapping_sub(self.lo) <= self.hi.wrapping_sub(self.lo)
    }
}

/// Something other than a zero-copy completion came off the error queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedError {
    /// The `sock_extended_err` as the kernel wrote it.
    pub ee: SockExtendedErr,
}

/// What one [`reap`] call found.
#[derive(Debug, Default)]
pub struct ReapStats {
    /// `recvmsg` calls made, including the final one that returned `EAGAIN`.
    pub syscalls: u64,
    /// Error-queue messages read.
    pub messages: u64,
}

const CMSG_SPACE: usize = 64;

/// Reads every message currently on `fd`'s error queue, without blocking.
///
/// Zero-copy completions are appended to `out`; other extended errors (ICMP, local errors) go
/// to `errors`. At most `max_msgs` messages are read (0 = no limit). Returns the counts of
/// syscalls and messages; an empty queue is not an error.
pub fn reap(
    fd: &impl AsRawFd,
    out: &mut Vec<ZcRange>,
    errors: &mut Vec<QueuedError>,
    max_msgs: usize,
) -> io::Result<ReapStats> {
    let mut stats = ReapStats::default();
    loop {
        if max_msgs != 0 && stats.messages as usize >= max_msgs {
            return Ok(stats);
        }
        stats.syscalls += 1;
        match recv_one(fd.as_raw_fd())? {
            None => return Ok(stats),
            Some(ee) => {
                stats.messages += 1;
                if ee.ee_origin == SO_EE_ORIGIN_ZEROCOPY && ee.ee_errno == 0 {
                    out.push(ZcRange {
                        lo: ee.ee_info,
                        hi: ee.ee_data,
                        copied: ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED != 0,
                    });
                } else {
                    errors.push(QueuedError { ee });
                }
            }
        }
    }
}

/// One `recvmsg(MSG_ERRQUEUE | MSG_DONTWAIT)`; `Ok(None)` when the queue is empty.
fn recv_one(fd: RawFd) -> io::Result<Option<SockExtendedErr>> {
    let mut control = [0u64; CMSG_SPACE / 8];
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = CMSG_SPACE;
    // SAFETY: `msg` describes only `control`, which lives for the call.
    let res = syscall!(recvmsg(
        fd,
        &mut msg,
        libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT
    ));
    match res {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    // SAFETY: `msg` was filled by the kernel; the CMSG_* macros walk inside `control`.
    let mut cm = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cm.is_null() {
        // SAFETY: `cm` is non-null and points inside `control`.
        let hdr = unsafe { &*cm };
        let ok_level = (hdr.cmsg_level == libc::SOL_IP && hdr.cmsg_type == super::CMSG_IP_RECVERR)
            || (hdr.cmsg_level == libc::SOL_IPV6 && hdr.cmsg_type == super::CMSG_IPV6_RECVERR);
        if ok_level && hdr.cmsg_len as usize >= std::mem::size_of::<libc::cmsghdr>() + 16 {
            // SAFETY: the payload has at least 16 bytes, the size of SockExtendedErr; it may
            // be unaligned, hence read_unaligned.
            let ee =
                unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cm) as *const SockExtendedErr) };
            return Ok(Some(ee));
        }
        // SAFETY: as above.
        cm = unsafe { libc::CMSG_NXTHDR(&msg, cm) };
    }
    // A message without a recognised cmsg (truncated control buffer): report it as an error
    // record so it is not silently lost.
    Ok(Some(SockExtendedErr {
        ee_errno: libc::EBADMSG as u32,
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_len_and_contains_wrap_around() {
        let r = ZcRange {
            lo: u32::MAX - 1,
            hi: 1,
            copied: false,
        };
        assert_eq!(r.len(), 4);
        assert!(r.contains(u32::MAX));
        assert!(r.contains(0));
        assert!(r.contains(1));
        assert!(!r.contains(2));
        assert!(!r.contains(u32::MAX - 2));
        let single = ZcRange {
            lo: 7,
            hi: 7,
            copied: true,
        };
        assert_eq!(single.len(), 1);
        assert!(single.contains(7) && !single.contains(8));
    }
}

//! Owned `sendmsg` message headers: a destination, up to [`MAX_IOV`] slices and the control
//! messages of a UDP datagram train (`UDP_SEGMENT`, Linux 4.18; `IP_TOS` / `IPV6_TCLASS`).
//!
//! A [`MsgHdr`] is self-contained: its `msghdr` points at its own address, iovec array and
//! control buffer, so boxed it stays valid wherever its owner moves the box. io_uring's
//! `SENDMSG`/`SENDMSG_ZC` read the header when the request is prepared and again when it is
//! (re-)issued (after `-EAGAIN` the kernel retries from poll), so the send ring keeps the box
//! with the lent buffer until the request's last CQE (`ring::lend`). The syscall paths build
//! one on the stack for the call ([`sendmsg`], [`sendmmsg`]).
//!
//! The kernel only reads these headers (`sendmsg` copies `msghdr`, the iovecs, the address
//! and the control bytes in); it writes none of it.

use super::{syscall, SOL_UDP, UDP_SEGMENT};
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

/// Most slices one message carries (a vectored send: header + body parts).
pub const MAX_IOV: usize = 8;

/// Most segments of one GSO train: `UDP_MAX_SEGMENTS` is 64 up to Linux 6.9 (128 after); zcio
/// keeps to 64 so a train that works here works on every supported kernel.
pub const MAX_SEGMENTS: usize = 64;

/// Where and how one datagram (train) goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgOpts {
    /// Destination (`msg_name`); `None` on a connected socket.
    pub dest: Option<SocketAddr>,
    /// GSO segment size (`UDP_SEGMENT` cmsg, Linux 4.18): the payload is cut into datagrams
    /// of this size by the kernel (or the NIC).
    pub segment: Option<u16>,
    /// `IP_TOS` / `IPV6_TCLASS` for this message (DSCP << 2 | ECN).
    pub tos: Option<u8>,
}

/// Room for one `UDP_SEGMENT` (u16) and one `IP_TOS`/`IPV6_TCLASS` (int) control message:
/// `CMSG_SPACE(2) + CMSG_SPACE(4)` = 24 + 24 on 64-bit Linux.
const CONTROL_ROOM: usize = 64;

#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct Control([u8; CONTROL_ROOM]);

/// One `sendmsg` header with its own address, iovecs and control bytes; see the module docs.
#[repr(C)]
pub struct MsgHdr {
    hdr: libc::msghdr,
    name: libc::sockaddr_in6,
    name_len: libc::socklen_t,
    iov: [libc::iovec; MAX_IOV],
    iov_len: usize,
    control: Control,
    control_len: usize,
    opts: MsgOpts,
}

// SAFETY: the raw pointers in `hdr` and `iov` point into this value itself (set by
// `MsgHdr::point` just before a use) or at bytes whose owner travels with it (a send ring's lent
// buffer); nothing is shared with another thread.
unsafe impl Send for MsgHdr {}

impl std::fmt::Debug for MsgHdr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MsgHdr")
            .field("opts", &self.opts)
            .field("iov_len", &self.iov_len)
            .finish()
    }
}

fn invalid(errno: i32, what: String) -> io::Error {
    io::Error::new(
        io::Error::from_raw_os_error(errno).kind(),
        format!("{what} ({})", io::Error::from_raw_os_error(errno)),
    )
}

impl MsgHdr {
    /// A header for `opts` on a socket of family `v6` (IPv4 destinations on an IPv6 socket
    /// are written as v4-mapped addresses; an IPv6 destination on an IPv4 socket is an
    /// error, `EAFNOSUPPORT`).
    pub fn new(opts: &MsgOpts, v6: bool) -> io::Result<MsgHdr> {
        // SAFETY: all-zero msghdr, sockaddr_in6 and iovec are valid plain C values.
        let mut m: MsgHdr = MsgHdr {
            hdr: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            name: unsafe { std::mem::zeroed() },
            name_len: 0,
            // SAFETY: as above.
            iov: unsafe { std::mem::zeroed() },
            iov_len: 0,
            control: Control([0; CONTROL_ROOM]),
            control_len: 0,
            opts: *opts,
        };
        if let Some(dest) = opts.dest {
            m.name_len = write_name(&mut m.name, dest, v6)?;
        }
        let mut at = 0;
        if let Some(seg) = opts.segment {
            if seg == 0 {
                return Err(invalid(libc::EINVAL, "a GSO segment size of 0".into()));
            }
            at += put_cmsg(
                &mut m.control.0[at..],
                SOL_UDP,
                UDP_SEGMENT,
                &seg.to_ne_bytes(),
            );
        }
        if let Some(tos) = opts.tos {
            let (level, ty) = if v6 {
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS)
            } else {
                (libc::IPPROTO_IP, libc::IP_TOS)
            };
            at += put_cmsg(
                &mut m.control.0[at..],
                level,
                ty,
                &i32::from(tos).to_ne_bytes(),
            );
        }
        m.control_len = at;
        Ok(m)
    }

    /// What the header was built for.
    pub fn opts(&self) -> &MsgOpts {
        &self.opts
    }

    /// Points the header at `slices` (at most [`MAX_IOV`]) and at its own address and
    /// control bytes; returns the header for the kernel. Call again after the value moved.
    /// The returned pointer is derived from `&mut self` and valid while `self` is not moved
    /// or touched; the slices' bytes must stay valid for as long as the kernel may read them.
    pub fn point(&mut self, slices: &[(*const u8, usize)]) -> io::Result<*const libc::msghdr> {
        if slices.len() > MAX_IOV {
            return Err(invalid(
                libc::EINVAL,
                format!("{} slices in one message (at most {MAX_IOV})", slices.len()),
            ));
        }
        for (i, &(ptr, len)) in slices.iter().enumerate() {
            self.iov[i] = libc::iovec {
                iov_base: ptr as *mut libc::c_void,
                iov_len: len,
            };
        }
        self.iov_len = slices.len();
        self.hdr.msg_name = if self.name_len > 0 {
            (&mut self.name as *mut libc::sockaddr_in6).cast()
        } else {
            std::ptr::null_mut()
        };
        self.hdr.msg_namelen = self.name_len;
        self.hdr.msg_iov = self.iov.as_mut_ptr();
        self.hdr.msg_iovlen = self.iov_len;
        self.hdr.msg_control = if self.control_len > 0 {
            self.control.0.as_mut_ptr().cast()
        } else {
            std::ptr::null_mut()
        };
        self.hdr.msg_controllen = self.control_len;
        self.hdr.msg_flags = 0;
        Ok(&mut self.hdr as *mut libc::msghdr as *const libc::msghdr)
    }
}

impl MsgHdr {
    /// The iovec array as last [pointed](MsgHdr::point), for a request that takes an iovec
    /// array without a message (`SEND_ZC` with `IORING_SEND_VECTORIZED`): valid while `self`
    /// is not moved; derived from `&mut self`.
    pub fn iovecs(&mut self) -> (*const libc::iovec, usize) {
        (self.iov.as_mut_ptr() as *const libc::iovec, self.iov_len)
    }
}

/// Writes `dest` as the socket family's address; returns its length.
fn write_name(out: &mut libc::sockaddr_in6, dest: SocketAddr, v6: bool) -> io::Result<u32> {
    match (dest, v6) {
        (SocketAddr::V4(a), false) => {
            // SAFETY: sockaddr_in fits in (and is less aligned than) sockaddr_in6, which `out`
            // is; the pointer is derived from `&mut`.
            let sin = unsafe { &mut *(out as *mut libc::sockaddr_in6).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            Ok(std::mem::size_of::<libc::sockaddr_in>() as u32)
        }
        (dest, true) => {
            let (ip, scope, flow) = match dest {
                SocketAddr::V6(a) => (*a.ip(), a.scope_id(), a.flowinfo()),
                SocketAddr::V4(a) => (a.ip().to_ipv6_mapped(), 0, 0),
            };
            out.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            out.sin6_port = dest.port().to_be();
            out.sin6_addr.s6_addr = ip.octets();
            out.sin6_scope_id = scope;
            out.sin6_flowinfo = flow;
            Ok(std::mem::size_of::<libc::sockaddr_in6>() as u32)
        }
        (SocketAddr::V6(a), false) => Err(invalid(
            libc::EAFNOSUPPORT,
            format!("IPv6 destination {a} on an IPv4 socket"),
        )),
    }
}

/// Writes one control message at the start of `buf`; returns the space it takes.
fn put_cmsg(buf: &mut [u8], level: i32, ty: i32, data: &[u8]) -> usize {
    // SAFETY: pure arithmetic on lengths.
    let space = unsafe { libc::CMSG_SPACE(data.len() as u32) } as usize;
    // SAFETY: as above.
    let len = unsafe { libc::CMSG_LEN(data.len() as u32) } as usize;
    assert!(space <= buf.len(), "control buffer too small");
    let hdr = libc::cmsghdr {
        cmsg_len: len as _,
        cmsg_level: level,
        cmsg_type: ty,
    };
    let hsize = std::mem::size_of::<libc::cmsghdr>();
    // SAFETY: `buf` has room for the header (checked above); write_unaligned needs no
    // alignment, and the caller's buffer is 8-aligned at every CMSG_SPACE step anyway.
    unsafe { std::ptr::write_unaligned(buf.as_mut_ptr().cast::<libc::cmsghdr>(), hdr) };
    let data_at = len - data.len();
    debug_assert!(data_at >= hsize);
    buf[data_at..len].copy_from_slice(data);
    buf[len..space].fill(0);
    space
}

/// One `sendmsg(2)` of `slices` with `opts`, without blocking unless `flags` says so; `EINTR`
/// is retried.
pub fn sendmsg(
    fd: &impl AsRawFd,
    slices: &[&[u8]],
    opts: &MsgOpts,
    v6: bool,
    flags: i32,
) -> io::Result<usize> {
    let mut m = MsgHdr::new(opts, v6)?;
    let parts: Vec<(*const u8, usize)> = slices.iter().map(|s| (s.as_ptr(), s.len())).collect();
    let hdr = m.point(&parts)?;
    // SAFETY: `hdr` points into `m` (alive for the call) and at `slices`, borrowed for the
    // call; the kernel only reads them.
    syscall!(sendmsg(fd.as_raw_fd(), hdr, flags)).map(|n| n as usize)
}

/// Most messages one [`sendmmsg`] sends.
pub const MMSG_MAX: usize = 64;

/// One `sendmmsg(2)` of `msgs` (at most [`MMSG_MAX`]; each a header already
/// [pointed](MsgHdr::point) at its bytes). Returns how many went; an error only when the first
/// failed (the kernel drops the error of a later one: the caller retries from there and meets
/// it then).
pub fn sendmmsg(fd: &impl AsRawFd, msgs: &mut [MsgHdr], flags: i32) -> io::Result<usize> {
    let n = msgs.len().min(MMSG_MAX);
    // SAFETY: an all-zero mmsghdr is valid.
    let mut mm: [libc::mmsghdr; MMSG_MAX] = unsafe { std::mem::zeroed() };
    for (i, m) in msgs[..n].iter_mut().enumerate() {
        let parts: Vec<(*const u8, usize)> = m.iov[..m.iov_len]
            .iter()
            .map(|v| (v.iov_base as *const u8, v.iov_len))
            .collect();
        let hdr = m.point(&parts)?;
        // SAFETY: `hdr` points at `m`'s header, alive and unmoved for this call.
        mm[i].msg_hdr = unsafe { *hdr };
    }
    // SAFETY: `mm[..n]` copy headers that point into `msgs` (borrowed mutably, so unmoved, for
    // the call) and at the bytes their slices name, which the caller keeps alive; the kernel
    // reads them and writes only `msg_len`.
    let k = syscall!(sendmmsg(fd.as_raw_fd(), mm.as_mut_ptr(), n as u32, flags))?;
    Ok(k as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_messages_carry_segment_and_tos_at_cmsg_offsets() {
        let opts = MsgOpts {
            dest: Some("198.18.0.2:9".parse().unwrap()),
            segment: Some(1472),
            tos: Some(0x2e << 2 | 1),
        };
        let mut m = MsgHdr::new(&opts, false).unwrap();
        let b = [0u8; 4];
        let hdr = m.point(&[(b.as_ptr(), b.len())]).unwrap();
        // SAFETY: `hdr` points into `m`, alive here.
        let h = unsafe { &*hdr };
        assert_eq!(h.msg_controllen, 48);
        assert_eq!(
            h.msg_namelen as usize,
            std::mem::size_of::<libc::sockaddr_in>()
        );
        let c = &m.control.0;
        assert_eq!(usize::from_ne_bytes(c[0..8].try_into().unwrap()), 18);
        assert_eq!(i32::from_ne_bytes(c[8..12].try_into().unwrap()), SOL_UDP);
        assert_eq!(
            i32::from_ne_bytes(c[12..16].try_into().unwrap()),
            UDP_SEGMENT
        );
        assert_eq!(u16::from_ne_bytes(c[16..18].try_into().unwrap()), 1472);
        assert_eq!(usize::from_ne_bytes(c[24..32].try_into().unwrap()), 20);
        assert_eq!(
            i32::from_ne_bytes(c[32..36].try_into().unwrap()),
            libc::IPPROTO_IP
        );
        assert_eq!(
            i32::from_ne_bytes(c[36..40].try_into().unwrap()),
            libc::IP_TOS
        );
        assert_eq!(
            i32::from_ne_bytes(c[40..44].try_into().unwrap()),
            0x2e << 2 | 1
        );
    }

    #[test]
    fn v4_destinations_are_mapped_on_v6_sockets_and_v6_ones_refused_on_v4() {
        let v4 = MsgOpts {
            dest: Some("198.18.0.2:9".parse().unwrap()),
            segment: None,
            tos: None,
        };
        let m = MsgHdr::new(&v4, true).unwrap();
        assert_eq!(m.name.sin6_family as i32, libc::AF_INET6);
        assert_eq!(
            std::net::Ipv6Addr::from(m.name.sin6_addr.s6_addr),
            "::ffff:198.18.0.2".parse::<std::net::Ipv6Addr>().unwrap()
        );
        let v6 = MsgOpts {
            dest: Some("[2001:db8::2]:9".parse().unwrap()),
            ..v4
        };
        let e = MsgHdr::new(&v6, false).unwrap_err();
        assert!(e.to_string().contains("IPv6 destination"), "{e}");
        let zero = MsgOpts {
            segment: Some(0),
            ..v4
        };
        assert!(MsgHdr::new(&zero, false).is_err());
    }
}

//! AF_NETLINK sockets: creation, binding, options and the constants of `linux/netlink.h` and
//! `linux/rtnetlink.h` that zcio uses, and the batched receive ([`recv_split`]) that the
//! frame ring's `recvmmsg` producer (`netlink::source`) fills frames with.

use super::{getsockopt_int, owned, setsockopt_int, syscall};
use std::io;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, OwnedFd};

/// Netlink protocol: routing (2.2).
pub const NETLINK_ROUTE: i32 = 0;
/// Netlink protocol: netfilter (2.6.14); see also `sys::nfqueue::NETLINK_NETFILTER`.
pub const NETLINK_NETFILTER: i32 = super::nfqueue::NETLINK_NETFILTER;
/// `SOL_NETLINK` socket level (2.6.14).
pub const SOL_NETLINK: i32 = 270;
/// Socket option: do not report receive-buffer overruns with ENOBUFS (2.6.30).
pub const NETLINK_NO_ENOBUFS: i32 = 5;
/// Socket option: only `NLMSG_ERROR` header on ACKs (4.3).
pub const NETLINK_CAP_ACK: i32 = 10;
/// Socket option: extended ACK with error messages (4.12).
pub const NETLINK_EXT_ACK: i32 = 11;
/// `SO_RCVBUFFORCE`: set the receive buffer past `rmem_max` (2.6.14, needs CAP_NET_ADMIN).
pub const SO_RCVBUFFORCE: i32 = 33;
/// Socket option: join a multicast group by number (2.6.14; groups past 32 need it).
pub const NETLINK_ADD_MEMBERSHIP: i32 = 1;
/// Socket option: a multicast sender learns that delivery to this socket failed (2.6.26);
/// ctnetlink then keeps a destroyed entry and delivers its DESTROY event again later.
pub const NETLINK_BROADCAST_ERROR: i32 = 4;
/// `SOL_SOCKET` option: the socket's memory counters, `u32[SK_MEMINFO_VARS]` (4.12).
pub const SO_MEMINFO: i32 = 55;
/// Entries of the `SO_MEMINFO` array (`SK_MEMINFO_VARS`, `linux/sock_diag.h`; 4.12).
pub const SK_MEMINFO_VARS: usize = 9;
/// Index of `sk_drops` in the `SO_MEMINFO` array: datagrams the kernel dropped because the
/// receive buffer was full (`SK_MEMINFO_DROPS`, 4.12).
pub const SK_MEMINFO_DROPS: usize = 8;

/// Length of `struct nlmsghdr`.
pub const NLMSG_HDRLEN: usize = 16;
/// Length of `struct nlattr`.
pub const NLA_HDRLEN: usize = 4;
/// Netlink alignment.
pub const NLMSG_ALIGNTO: usize = 4;
/// Message type: no-op.
pub const NLMSG_NOOP: u16 = 1;
/// Message type: error or ACK (`struct nlmsgerr`).
pub const NLMSG_ERROR: u16 = 2;
/// Message type: end of a multipart dump.
pub const NLMSG_DONE: u16 = 3;
/// Message type: data lost (overrun).
pub const NLMSG_OVERRUN: u16 = 4;
/// Flag: request.
pub const NLM_F_REQUEST: u16 = 0x1;
/// Flag: part of a multipart message.
pub const NLM_F_MULTI: u16 = 0x2;
/// Flag: ACK wanted.
pub const NLM_F_ACK: u16 = 0x4;
/// Flag: dump (`NLM_F_ROOT | NLM_F_MATCH`).
pub const NLM_F_DUMP: u16 = 0x300;
/// Flag: the dump was interrupted and is inconsistent (3.1).
pub const NLM_F_DUMP_INTR: u16 = 0x10;
/// Attribute type flag: nested.
pub const NLA_F_NESTED: u16 = 1 << 15;
/// Attribute type flag: payload in network byte order.
pub const NLA_F_NET_BYTEORDER: u16 = 1 << 14;
/// Mask of the attribute type proper.
pub const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);

/// rtnetlink: new link / dump links.
pub const RTM_GETLINK: u16 = 18;
/// rtnetlink: link message.
pub const RTM_NEWLINK: u16 = 16;
/// rtnetlink: dump addresses.
pub const RTM_GETADDR: u16 = 22;
/// rtnetlink: address message.
pub const RTM_NEWADDR: u16 = 20;
/// rtnetlink: dump routes.
pub const RTM_GETROUTE: u16 = 26;
/// rtnetlink: route message.
pub const RTM_NEWROUTE: u16 = 24;
/// rtnetlink: dump neighbours.
pub const RTM_GETNEIGH: u16 = 30;
/// rtnetlink: neighbour message.
pub const RTM_NEWNEIGH: u16 = 28;

/// Opens a netlink socket of `protocol` (close-on-exec, blocking).
pub fn socket(protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain integer arguments.
    let fd = syscall!(socket(
        libc::AF_NETLINK,
        libc::SOCK_RAW | libc::SOCK_CLOEXEC,
        protocol
    ))?;
    Ok(owned(fd))
}

fn sockaddr(pid: u32, groups: u32) -> libc::sockaddr_nl {
    // SAFETY: an all-zero sockaddr_nl is valid.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as u16;
    sa.nl_pid = pid;
    sa.nl_groups = groups;
    sa
}

/// Binds to port id `pid` (0: the kernel picks one) and multicast `groups`.
pub fn bind(fd: &impl AsRawFd, pid: u32, groups: u32) -> io::Result<()> {
    let sa = sockaddr(pid, groups);
    let len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
    let ptr = &sa as *const libc::sockaddr_nl as *const libc::sockaddr;
    // SAFETY: `ptr`/`len` describe `sa`, which lives for the call.
    syscall!(bind(fd.as_raw_fd(), ptr, len)).map(drop)
}

/// Checks that `fd` is an `AF_NETLINK` socket of `protocol` (`SO_DOMAIN`, `SO_PROTOCOL`):
/// `ENOTSOCK` for a descriptor that is no socket, `InvalidInput` (saying what it is) for
/// another kind of socket.
pub fn check_protocol(fd: &impl AsRawFd, protocol: i32) -> io::Result<()> {
    let domain = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN)?;
    let proto = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL)?;
    if domain != libc::AF_NETLINK || proto != protocol {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket of family {domain} protocol {proto}, not AF_NETLINK ({}) protocol \
                 {protocol}",
                libc::AF_NETLINK
            ),
        ));
    }
    Ok(())
}

/// The port id a netlink socket is bound to (`getsockname`; 0 before it is bound).
pub fn port_id(fd: &impl AsRawFd) -> io::Result<u32> {
    let mut sa = sockaddr(0, 0);
    let mut len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
    let ptr = &mut sa as *mut libc::sockaddr_nl as *mut libc::sockaddr;
    // SAFETY: `ptr`/`len` describe `sa`, mutably borrowed for the call; the kernel writes at
    // most `len` bytes and stores the length.
    syscall!(getsockname(fd.as_raw_fd(), ptr, &mut len))?;
    Ok(sa.nl_pid)
}

/// Sends one datagram (one or more netlink messages back to back) to the kernel.
pub fn send_to_kernel(fd: &impl AsRawFd, buf: &[u8]) -> io::Result<usize> {
    let sa = sockaddr(0, 0);
    let len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
    let ptr = &sa as *const libc::sockaddr_nl as *const libc::sockaddr;
    // SAFETY: `buf` and `sa` are borrowed for the call; the lengths match.
    syscall!(sendto(
        fd.as_raw_fd(),
        buf.as_ptr().cast(),
        buf.len(),
        0,
        ptr,
        len
    ))
    .map(|n| n as usize)
}

/// `NETLINK_NO_ENOBUFS`: the kernel stops reporting overruns (it still drops).
pub fn set_no_enobufs(fd: &impl AsRawFd, on: bool) -> io::Result<()> {
    setsockopt_int(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, on as i32)
}

/// Joins multicast group `group` (`NETLINK_ADD_MEMBERSHIP`).
pub fn add_membership(fd: &impl AsRawFd, group: u32) -> io::Result<()> {
    setsockopt_int(fd, SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group as i32)
}

/// `NETLINK_BROADCAST_ERROR`: multicast senders are told when delivery to this socket failed.
pub fn set_broadcast_error(fd: &impl AsRawFd, on: bool) -> io::Result<()> {
    setsockopt_int(fd, SOL_NETLINK, NETLINK_BROADCAST_ERROR, on as i32)
}

/// The socket's drop counter (`sk_drops`, from `SO_MEMINFO`): every message or batch the
/// kernel could not queue because the receive buffer was full, counted whether or not the
/// socket reports overruns (`NETLINK_NO_ENOBUFS`). A 32-bit counter that wraps.
pub fn socket_drops(fd: &impl AsRawFd) -> io::Result<u32> {
    let mut mem = [0u32; SK_MEMINFO_VARS];
    let mut len = std::mem::size_of_val(&mem) as libc::socklen_t;
    // The kernel writes the array: reached through a pointer derived from `&mut`.
    let ptr = mem.as_mut_ptr().cast::<libc::c_void>();
    // SAFETY: `ptr`/`len` describe the writable array `mem`, alive for the call; the kernel
    // writes at most `len` bytes and stores the length it wrote.
    syscall!(getsockopt(
        fd.as_raw_fd(),
        libc::SOL_SOCKET,
        SO_MEMINFO,
        ptr,
        &mut len
    ))?;
    let got = len as usize / 4;
    if got <= SK_MEMINFO_DROPS {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("SO_MEMINFO returned {got} counters, no sk_drops (needs Linux 4.12)"),
        ));
    }
    Ok(mem[SK_MEMINFO_DROPS])
}

/// `NETLINK_EXT_ACK` and `NETLINK_CAP_ACK`: short ACKs with error strings.
pub fn set_ext_ack(fd: &impl AsRawFd) -> io::Result<()> {
    setsockopt_int(fd, SOL_NETLINK, NETLINK_CAP_ACK, 1)?;
    setsockopt_int(fd, SOL_NETLINK, NETLINK_EXT_ACK, 1)
}

/// Sets the receive buffer; with `force`, `SO_RCVBUFFORCE` (past `rmem_max`, needs
/// CAP_NET_ADMIN). Returns the size the kernel reports afterwards (it doubles the request).
pub fn set_rcvbuf(fd: &impl AsRawFd, bytes: usize, force: bool) -> io::Result<usize> {
    let v = bytes.min(i32::MAX as usize / 2) as i32;
    let name = if force {
        SO_RCVBUFFORCE
    } else {
        libc::SO_RCVBUF
    };
    setsockopt_int(fd, libc::SOL_SOCKET, name, v)?;
    Ok(getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)? as usize)
}

/// Most datagrams one [`recv_split`] receives.
pub const RECV_SPLIT_MAX: usize = 64;

/// What one datagram of a [`recv_split`] was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Received {
    /// Bytes of the datagram (`msg_len`), across both buffers.
    pub len: usize,
    /// `msg_flags` of the receive (`MSG_TRUNC` when it was longer than both buffers).
    pub flags: u32,
}

/// One `recvmmsg(2)` of up to `bufs.len()` datagrams (at most [`RECV_SPLIT_MAX`]), datagram
/// `i` scattered over `bufs[i][0]` then `bufs[i][1]`; `got[i]` says what it was. `flags` is
/// `MSG_DONTWAIT` or `MSG_WAITFORONE` (the first datagram blocks, the rest do not). Returns
/// how many datagrams arrived; `EAGAIN` and `ENOBUFS` (a netlink overrun) are errors for the
/// caller to interpret. The message headers live on the stack: no allocation.
pub fn recv_split(
    fd: &impl AsRawFd,
    bufs: &mut [[IoSliceMut<'_>; 2]],
    got: &mut [Received],
    flags: i32,
) -> io::Result<usize> {
    let n = bufs.len().min(got.len()).min(RECV_SPLIT_MAX);
    // SAFETY: an all-zero mmsghdr array is a valid plain C value.
    let mut msgs: [libc::mmsghdr; RECV_SPLIT_MAX] = unsafe { std::mem::zeroed() };
    for (m, b) in msgs.iter_mut().zip(bufs[..n].iter_mut()) {
        // `IoSliceMut` is ABI compatible with `struct iovec` on Unix (std's guarantee).
        m.msg_hdr.msg_iov = b.as_mut_ptr().cast::<libc::iovec>();
        m.msg_hdr.msg_iovlen = 2;
    }
    // SAFETY: `msgs[..n]` point at the iovecs of `bufs[..n]`, which describe live, exclusively
    // borrowed byte slices (`IoSliceMut<'_>`) for the duration of the call; no name or control
    // buffer is given.
    let k = syscall!(recvmmsg(
        fd.as_raw_fd(),
        msgs.as_mut_ptr(),
        n as u32,
        flags,
        std::ptr::null_mut()
    ))? as usize;
    for (g, m) in got.iter_mut().zip(&msgs[..k.min(n)]) {
        *g = Received {
            len: m.msg_len as usize,
            flags: m.msg_hdr.msg_flags as u32,
        };
    }
    Ok(k.min(n))
}

/// Preallocated buffers for `recvmmsg(2)`, one datagram per buffer, set up once so that each
/// receive is one syscall and no allocation (what a careful libmnl/libnetfilter_queue user
/// writes). Used by baselines and simple consumers; the frame ring uses [`recv_split`].
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    // Boxed so the addresses `msgs` point at stay put when the struct moves.
    iov: Box<[libc::iovec]>,
    msgs: Box<[libc::mmsghdr]>,
    got: usize,
}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch")
            .field("n", &self.bufs.len())
            .field("got", &self.got)
            .finish()
    }
}

// SAFETY: the raw pointers point only into buffers this value owns.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    /// `n` buffers of `size` bytes.
    pub fn new(n: usize, size: usize) -> Self {
        let mut bufs: Vec<Vec<u8>> = (0..n.max(1)).map(|_| vec![0u8; size]).collect();
        let mut iov: Box<[libc::iovec]> = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: an all-zero mmsghdr is a valid plain C value.
        let mut msgs: Box<[libc::mmsghdr]> = (0..bufs.len())
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
        }
        Self {
            bufs,
            iov,
            msgs,
            got: 0,
        }
    }

    /// One `recvmmsg` with `flags` (`MSG_DONTWAIT`, `MSG_WAITFORONE`); returns how many
    /// datagrams arrived (`EAGAIN` is an error).
    pub fn recv(&mut self, fd: &impl AsRawFd, flags: i32) -> io::Result<usize> {
        self.got = 0;
        let _ = &self.iov;
        // SAFETY: `msgs` point at `iov`, which point at `bufs`; all owned by `self`, borrowed
        // mutably for the call, and at fixed heap addresses.
        let got = syscall!(recvmmsg(
            fd.as_raw_fd(),
            self.msgs.as_mut_ptr(),
            self.msgs.len() as u32,
            flags,
            std::ptr::null_mut()
        ))? as usize;
        self.got = got;
        Ok(got)
    }

    /// Datagram `i` of the last receive.
    pub fn get(&self, i: usize) -> &[u8] {
        if i >= self.got {
            return &[];
        }
        let len = (self.msgs[i].msg_len as usize).min(self.bufs[i].len());
        &self.bufs[i][..len]
    }
}

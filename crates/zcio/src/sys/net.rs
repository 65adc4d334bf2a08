//! Socket helpers for options and flags that `std::net` does not expose.

use super::{setsockopt_int, syscall, IPV6_RECVERR, IP_RECVERR, SO_ZEROCOPY};
use std::io;
use std::os::fd::AsRawFd;

/// Address family of a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Family {
    /// AF_INET
    V4,
    /// AF_INET6
    V6,
}

/// Family of a bound or connected socket, from `getsockname`.
pub fn socket_family(fd: &impl AsRawFd) -> io::Result<Family> {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let ptr = &mut ss as *mut libc::sockaddr_storage as *mut libc::sockaddr;
    // SAFETY: `ptr`/`len` describe `ss`, which lives for the call.
    syscall!(getsockname(fd.as_raw_fd(), ptr, &mut len))?;
    match ss.ss_family as i32 {
        libc::AF_INET => Ok(Family::V4),
        libc::AF_INET6 => Ok(Family::V6),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket family {other} is neither AF_INET nor AF_INET6"),
        )),
    }
}

/// The peer's IP address (`getpeername`): `None` without a peer (`ENOTCONN`) or for a
/// family other than AF_INET/AF_INET6. An IPv4-mapped IPv6 peer is given as IPv4 (the same
/// route either way).
pub fn peer_ip(fd: &impl AsRawFd) -> io::Result<Option<std::net::IpAddr>> {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let ptr = (&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr>();
    // SAFETY: `ptr`/`len` describe `ss` (derived from `&mut`), writable and alive for the
    // call; the kernel writes at most `len` bytes.
    match syscall!(getpeername(fd.as_raw_fd(), ptr, &mut len)) {
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => return Ok(None),
        Err(e) => return Err(e),
    }
    let ip = match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in (AF_INET), which fits in and is no more
            // aligned than sockaddr_storage.
            let sa =
                unsafe { &*(&ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            std::net::IpAddr::V4(std::net::Ipv4Addr::from(sa.sin_addr.s_addr.to_ne_bytes()))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 (AF_INET6), which fits in and is no more
            // aligned than sockaddr_storage.
            let sa =
                unsafe { &*(&ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            std::net::IpAddr::V6(std::net::Ipv6Addr::from(sa.sin6_addr.s6_addr)).to_canonical()
        }
        _ => return Ok(None),
    };
    Ok(Some(ip))
}

/// `TCP_CLOSE` and `TCP_LISTEN` of `include/net/tcp_states.h`: the states of a TCP socket
/// that cannot send.
pub const TCP_CLOSE: u8 = 7;
/// See [`TCP_CLOSE`].
pub const TCP_LISTEN: u8 = 10;

/// A TCP socket's state (`tcpi_state`, the first byte of `TCP_INFO`).
pub fn tcp_state(fd: &impl AsRawFd) -> io::Result<u8> {
    // Only the first byte is wanted: the kernel copies min(optlen, sizeof(tcp_info)) bytes.
    let mut b = [0u8; 8];
    let mut len = b.len() as libc::socklen_t;
    // SAFETY: `b`/`len` describe a live local buffer the kernel writes at most `len` bytes to.
    syscall!(getsockopt(
        fd.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_INFO,
        b.as_mut_ptr().cast(),
        &mut len
    ))?;
    Ok(b[0])
}

/// Whether the socket has a peer (`getpeername`; `ENOTCONN`: no).
pub fn is_connected(fd: &impl AsRawFd) -> io::Result<bool> {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let ptr = &mut ss as *mut libc::sockaddr_storage as *mut libc::sockaddr;
    // SAFETY: `ptr`/`len` describe `ss` (derived from `&mut`), which lives for the call.
    match syscall!(getpeername(fd.as_raw_fd(), ptr, &mut len)) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Sets `SO_ZEROCOPY` (Linux 4.14). Fails with `EOPNOTSUPP`/`ENOPROTOOPT` on socket types that
/// do not support it.
pub fn enable_zerocopy(fd: &impl AsRawFd) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, SO_ZEROCOPY, 1)
}

/// Enables the error queue for the socket's family (`IP_RECVERR` / `IPV6_RECVERR`). Zero-copy
/// completions arrive on the error queue either way; this also reports ICMP errors there.
pub fn enable_recverr(fd: &impl AsRawFd, family: Family) -> io::Result<()> {
    match family {
        Family::V4 => setsockopt_int(fd, libc::SOL_IP, IP_RECVERR, 1),
        Family::V6 => setsockopt_int(fd, libc::SOL_IPV6, IPV6_RECVERR, 1),
    }
}

/// `SO_LINGER {on, 0}`: closing the socket resets the connection and frees what is queued
/// at once (zero-copy pages included) instead of retrying to deliver it.
pub fn set_linger_zero(fd: &impl AsRawFd) -> io::Result<()> {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `l` lives for the call; its size is passed.
    syscall!(setsockopt(
        fd.as_raw_fd(),
        libc::SOL_SOCKET,
        libc::SO_LINGER,
        (&l as *const libc::linger).cast(),
        std::mem::size_of::<libc::linger>() as libc::socklen_t
    ))
    .map(drop)
}

/// Disconnects a TCP socket at once (`connect(AF_UNSPEC)`: the kernel's `tcp_disconnect`
/// purges the write queue, freeing its pages and posting their zero-copy notifications, and
/// resets the connection). For closing a socket whose `MSG_ZEROCOPY` sends must come back
/// while its descriptor is still open.
pub fn disconnect(fd: &impl AsRawFd) -> io::Result<()> {
    let sa = libc::sockaddr {
        sa_family: libc::AF_UNSPEC as libc::sa_family_t,
        sa_data: [0; 14],
    };
    // SAFETY: `sa` lives for the call; its size is passed.
    syscall!(connect(
        fd.as_raw_fd(),
        &sa,
        std::mem::size_of::<libc::sockaddr>() as libc::socklen_t
    ))
    .map(drop)
}

/// `send(2)` with flags; `EINTR` is retried, everything else is returned.
pub fn send(fd: &impl AsRawFd, buf: &[u8], flags: i32) -> io::Result<usize> {
    let ptr = buf.as_ptr().cast();
    // SAFETY: `ptr`/`len` describe `buf`, borrowed for the call.
    syscall!(send(fd.as_raw_fd(), ptr, buf.len(), flags)).map(|n| n as usize)
}

/// One `sendmsg(2)` of `slices` on a connected socket with flags, the iovec being the slices
/// themselves (`IoSlice` is ABI-compatible with `struct iovec`): no allocation. `EINTR` is
/// retried, everything else is returned.
pub fn send_slices(fd: &impl AsRawFd, slices: &[io::IoSlice<'_>], flags: i32) -> io::Result<usize> {
    // SAFETY: all-zero is a valid msghdr (no name, no control).
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = slices.as_ptr().cast_mut().cast();
    m.msg_iovlen = slices.len().min(libc::UIO_MAXIOV as usize);
    // SAFETY: `m` points at `slices` (IoSlice is guaranteed ABI-compatible with iovec on
    // Unix), borrowed for the call; the kernel only reads them.
    syscall!(sendmsg(fd.as_raw_fd(), &m, flags)).map(|n| n as usize)
}

/// Most datagrams one [`send_batch`] sends.
pub const SEND_BATCH_MAX: usize = 64;

/// One `sendmmsg(2)` of up to [`SEND_BATCH_MAX`] datagrams from an IPv4 UDP socket: datagram
/// `i` is `payloads[i]`, sent to `to[i]` (or, with `to` empty, to the connected peer). Returns
/// how many went out; `EINTR` is retried. The message headers live on the stack.
pub fn send_batch(
    fd: &impl AsRawFd,
    payloads: &[&[u8]],
    to: &[std::net::SocketAddrV4],
) -> io::Result<usize> {
    let n = payloads.len().min(SEND_BATCH_MAX);
    if !to.is_empty() && to.len() < n {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "send_batch: fewer destinations than payloads",
        ));
    }
    // SAFETY: all-zero iovec, sockaddr_in and mmsghdr arrays are valid plain C values.
    let mut iov: [libc::iovec; SEND_BATCH_MAX] = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut sa: [libc::sockaddr_in; SEND_BATCH_MAX] = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut msgs: [libc::mmsghdr; SEND_BATCH_MAX] = unsafe { std::mem::zeroed() };
    for i in 0..n {
        iov[i] = libc::iovec {
            iov_base: payloads[i].as_ptr() as *mut libc::c_void,
            iov_len: payloads[i].len(),
        };
        msgs[i].msg_hdr.msg_iov = &mut iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        if let Some(&a) = to.get(i) {
            sa[i] = sockaddr_v4(a);
            msgs[i].msg_hdr.msg_name = (&mut sa[i] as *mut libc::sockaddr_in).cast();
            msgs[i].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
        }
    }
    // SAFETY: `msgs[..n]` point at `iov[..n]` (the payloads, only read by the kernel) and at
    // `sa[..n]`; all live on this stack frame or in `payloads` for the call.
    let k = syscall!(sendmmsg(fd.as_raw_fd(), msgs.as_mut_ptr(), n as u32, 0))?;
    Ok(k as usize)
}

fn sockaddr_v4(a: std::net::SocketAddrV4) -> libc::sockaddr_in {
    // SAFETY: an all-zero sockaddr_in is valid.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_port = a.port().to_be();
    sa.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
    sa
}

/// `bind(2)` to an IPv4 address (for sockets `std::net` cannot bind before connecting).
pub fn bind_v4(fd: &impl AsRawFd, a: std::net::SocketAddrV4) -> io::Result<()> {
    let sa = sockaddr_v4(a);
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let ptr = (&sa as *const libc::sockaddr_in).cast::<libc::sockaddr>();
    // SAFETY: `ptr`/`len` describe `sa`, which lives for the call.
    syscall!(bind(fd.as_raw_fd(), ptr, len)).map(drop)
}

/// `connect(2)` to an IPv4 address (blocking); `EINTR` is retried.
pub fn connect_v4(fd: &impl AsRawFd, a: std::net::SocketAddrV4) -> io::Result<()> {
    let sa = sockaddr_v4(a);
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let ptr = (&sa as *const libc::sockaddr_in).cast::<libc::sockaddr>();
    // SAFETY: `ptr`/`len` describe `sa`, which lives for the call.
    match syscall!(connect(fd.as_raw_fd(), ptr, len)) {
        Ok(_) => Ok(()),
        // A connect interrupted and retried reports that it is under way or done.
        Err(e) if e.raw_os_error() == Some(libc::EISCONN) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `recv(2)` with flags; `EINTR` is retried.
pub fn recv(fd: &impl AsRawFd, buf: &mut [u8], flags: i32) -> io::Result<usize> {
    let ptr = buf.as_mut_ptr().cast();
    // SAFETY: `ptr`/`len` describe `buf`, mutably borrowed for the call.
    syscall!(recv(fd.as_raw_fd(), ptr, buf.len(), flags)).map(|n| n as usize)
}

/// `poll(2)` on one descriptor; returns the revents (0 on timeout).
pub fn poll_one(fd: &impl AsRawFd, events: i16, timeout_ms: i32) -> io::Result<i16> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the call.
    syscall!(poll(&mut p, 1, timeout_ms))?;
    Ok(p.revents)
}

/// Interface index by name, `None` if there is no such interface.
pub fn if_index(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: `c` is a NUL-terminated string that lives for the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (idx != 0).then_some(idx)
}

/// `struct ethtool_drvinfo` from `linux/ethtool.h` (2.6).
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}
super::assert_layout!(
    EthtoolDrvinfo,
    size = 196,
    align = 4,
    cmd = 0,
    driver = 4,
    bus_info = 100,
    reserved2 = 164,
    n_priv_flags = 176,
    regdump_len = 192
);

/// `ETHTOOL_GDRVINFO` command number (2.6).
const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;
/// `SIOCETHTOOL` ioctl number.
const SIOCETHTOOL: libc::c_ulong = 0x8946;

/// Driver name and bus info of an interface via the `ETHTOOL_GDRVINFO` ioctl.
pub fn ethtool_driver(iface: &str) -> io::Result<(String, String)> {
    if iface.len() >= libc::IFNAMSIZ {
        return Err(io::Error::from_raw_os_error(libc::ENODEV));
    }
    let sock = super::socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    // SAFETY: all-zero is a valid value for both plain C structs.
    let mut info: EthtoolDrvinfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    // SAFETY: as above.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(iface.bytes()) {
        *d = s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = (&mut info as *mut EthtoolDrvinfo).cast();
    // SAFETY: `ifr` names the interface and points at `info`, both alive for the call; the
    // kernel writes at most size_of::<EthtoolDrvinfo>() bytes into `info`.
    syscall!(ioctl(
        sock.as_raw_fd(),
        SIOCETHTOOL,
        &mut ifr as *mut libc::ifreq
    ))?;
    let s = |b: &[u8]| {
        String::from_utf8_lossy(&b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())])
            .into_owned()
    };
    Ok((s(&info.driver), s(&info.bus_info)))
}

/// `SIOCOUTQNSD` (`linux/sockios.h`, Linux 2.6.38): bytes in a TCP socket's write queue not
/// yet sent.
const SIOCOUTQNSD: libc::Ioctl = 0x894B;

/// A TCP socket's send queue: `(unacknowledged, unsent)` bytes, the first including the second
/// (`SIOCOUTQ` = `write_seq - snd_una`, `SIOCOUTQNSD` = `write_seq - snd_nxt`).
pub fn tcp_send_queue(fd: &impl AsRawFd) -> io::Result<(u32, u32)> {
    let mut outq: libc::c_int = 0;
    let mut unsent: libc::c_int = 0;
    // SAFETY: each call writes one int through a pointer to a live local.
    syscall!(ioctl(
        fd.as_raw_fd(),
        libc::TIOCOUTQ,
        &mut outq as *mut libc::c_int
    ))?;
    // SAFETY: as above.
    syscall!(ioctl(
        fd.as_raw_fd(),
        SIOCOUTQNSD,
        &mut unsent as *mut libc::c_int
    ))?;
    Ok((outq.max(0) as u32, unsent.max(0) as u32))
}

/// `poll(2)` on several descriptors for the same events; true if any is ready.
pub fn poll_many(fds: &[&impl AsRawFd], events: i16, timeout_ms: i32) -> io::Result<bool> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events,
            revents: 0,
        })
        .collect();
    // SAFETY: `p` is a valid array of `p.len()` pollfds for the call.
    let n = syscall!(poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms))?;
    Ok(n > 0)
}

/// The `struct tcp_info` fields zcio reports (`getsockopt(TCP_INFO)`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpInfo {
    /// `tcpi_total_retrans`: segments retransmitted over the connection's life.
    pub total_retrans: u32,
    /// `tcpi_rtt`: smoothed round-trip time, microseconds.
    pub rtt_us: u32,
    /// `tcpi_segs_out`: segments sent (Linux 4.2; 0 before).
    pub segs_out: u32,
    /// `tcpi_bytes_retrans`: bytes retransmitted (Linux 4.19; 0 before).
    pub bytes_retrans: u64,
}

/// Offsets in `struct tcp_info` (include/uapi/linux/tcp.h), checked against the C header.
const TCPI_RTT: usize = 68;
const TCPI_TOTAL_RETRANS: usize = 100;
const TCPI_SEGS_OUT: usize = 136;
const TCPI_BYTES_RETRANS: usize = 208;
/// `sizeof(struct tcp_info)` on 6.x kernels; older kernels fill less (fields then read 0).
const TCPI_LEN: usize = 232;
// The offsets against the kernel's `struct tcp_info` (linux-raw-sys); newer headers may
// make it longer than what zcio reads.
const _: () = {
    use linux_raw_sys::net::tcp_info;
    use std::mem::offset_of;
    assert!(TCPI_RTT == offset_of!(tcp_info, tcpi_rtt));
    assert!(TCPI_TOTAL_RETRANS == offset_of!(tcp_info, tcpi_total_retrans));
    assert!(TCPI_SEGS_OUT == offset_of!(tcp_info, tcpi_segs_out));
    assert!(TCPI_BYTES_RETRANS == offset_of!(tcp_info, tcpi_bytes_retrans));
    assert!(TCPI_LEN <= std::mem::size_of::<tcp_info>());
};

/// `getsockopt(IPPROTO_TCP, TCP_INFO)`: retransmits and RTT of a TCP socket.
pub fn tcp_info(fd: &impl AsRawFd) -> io::Result<TcpInfo> {
    let mut buf = [0u8; TCPI_LEN];
    let mut len = TCPI_LEN as libc::socklen_t;
    // SAFETY: `buf`/`len` describe a writable byte buffer alive for the call; the kernel
    // writes at most `len` bytes and stores the length it wrote.
    syscall!(getsockopt(
        fd.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_INFO,
        buf.as_mut_ptr().cast(),
        &mut len
    ))?;
    let got = (len as usize).min(TCPI_LEN);
    let u32_at = |o: usize| {
        buf.get(o..o + 4)
            .filter(|_| o + 4 <= got)
            .map_or(0, |b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
    };
    let u64_at = |o: usize| {
        buf.get(o..o + 8)
            .filter(|_| o + 8 <= got)
            .map_or(0, |b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
    };
    Ok(TcpInfo {
        total_retrans: u32_at(TCPI_TOTAL_RETRANS),
        rtt_us: u32_at(TCPI_RTT),
        segs_out: u32_at(TCPI_SEGS_OUT),
        bytes_retrans: u64_at(TCPI_BYTES_RETRANS),
    })
}

/// A TCP socket for `addr`'s family, non-blocking and close-on-exec, with `connect(2)`
/// started: `Ok` while the handshake is under way (`EINPROGRESS`) or done; errors the kernel
/// knows at once (`ENETUNREACH`, `EADDRNOTAVAIL`, …) are returned. The outcome of a started
/// connect shows as the socket's error (`SO_ERROR`, `EPOLLERR`, a receive's result).
pub fn connect_start(addr: std::net::SocketAddr) -> io::Result<std::os::fd::OwnedFd> {
    let fd = stream_socket(&addr)?;
    let (sa, len) = sockaddr_any(&addr);
    let ptr = (&sa as *const libc::sockaddr_storage).cast::<libc::sockaddr>();
    // SAFETY: `ptr`/`len` describe `sa`, which lives for the call.
    match syscall!(connect(fd.as_raw_fd(), ptr, len)) {
        Ok(_) => Ok(fd),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(fd),
        Err(e) => Err(e),
    }
}

/// A non-blocking, close-on-exec TCP socket of `addr`'s family.
fn stream_socket(addr: &std::net::SocketAddr) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let family = match addr {
        std::net::SocketAddr::V4(_) => libc::AF_INET,
        std::net::SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: no pointers; the result is checked.
    let raw = syscall!(socket(
        family,
        libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        0
    ))?;
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) })
}

/// `addr` as a `sockaddr_storage` and its length.
fn sockaddr_any(addr: &std::net::SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        std::net::SocketAddr::V4(a) => {
            let sa = sockaddr_v4(*a);
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe {
                std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sa);
            }
            std::mem::size_of::<libc::sockaddr_in>()
        }
        std::net::SocketAddr::V6(a) => {
            // SAFETY: an all-zero sockaddr_in6 is valid.
            let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
            sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sa.sin6_port = a.port().to_be();
            sa.sin6_addr.s6_addr = a.ip().octets();
            sa.sin6_flowinfo = a.flowinfo();
            sa.sin6_scope_id = a.scope_id();
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe {
                std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sa);
            }
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// A TCP listener on `addr` with a listen backlog of `backlog` (the kernel caps it at
/// `net.core.somaxconn`; `std::net::TcpListener::bind` asks for 128, which a burst of new
/// connections overflows: the SYNs beyond it are dropped and retried a second later).
/// `SO_REUSEADDR` is set, as `std` sets it. Blocking, as `std` returns it.
pub fn listen_tcp(addr: std::net::SocketAddr, backlog: u32) -> io::Result<std::net::TcpListener> {
    let fd = stream_socket(&addr)?;
    setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    let (sa, len) = sockaddr_any(&addr);
    let ptr = (&sa as *const libc::sockaddr_storage).cast::<libc::sockaddr>();
    // SAFETY: `ptr`/`len` describe `sa`, which lives for the call.
    syscall!(bind(fd.as_raw_fd(), ptr, len))?;
    let backlog = backlog.min(i32::MAX as u32) as i32;
    // SAFETY: plain integers.
    syscall!(listen(fd.as_raw_fd(), backlog))?;
    let l = std::net::TcpListener::from(fd);
    l.set_nonblocking(false)?;
    Ok(l)
}

/// Whether a socket whose connect was started is connected now: `Ok(true)` once the
/// handshake completed, `Ok(false)` while it is under way, the socket's error
/// (`SO_ERROR`) if it failed.
pub fn connect_done(fd: &impl AsRawFd) -> io::Result<bool> {
    let err = super::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR)?;
    if err != 0 {
        return Err(io::Error::from_raw_os_error(err));
    }
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let ptr = (&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr>();
    // SAFETY: `ptr`/`len` describe `ss`, writable and alive for the call; the kernel writes
    // at most `len` bytes.
    match syscall!(getpeername(fd.as_raw_fd(), ptr, &mut len)) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `shutdown(2)` of the sending direction (`SHUT_WR`): the peer reads end of stream after
/// the bytes already queued.
pub fn shutdown_write(fd: &impl AsRawFd) -> io::Result<()> {
    shutdown(fd, std::net::Shutdown::Write)
}

/// `shutdown(2)` of one direction or both.
pub fn shutdown(fd: &impl AsRawFd, how: std::net::Shutdown) -> io::Result<()> {
    let how = match how {
        std::net::Shutdown::Read => libc::SHUT_RD,
        std::net::Shutdown::Write => libc::SHUT_WR,
        std::net::Shutdown::Both => libc::SHUT_RDWR,
    };
    // SAFETY: no pointers.
    syscall!(shutdown(fd.as_raw_fd(), how)).map(drop)
}

//! rtnetlink dumps (routes, links, neighbours, addresses) received through the frame ring.
//!
//! A dump answer is a stream of multipart datagrams of up to 32 KiB each; with frames of
//! 32 KiB + header one `recvmmsg` moves many of them, so a 100k-route table costs a few dozen
//! syscalls rather than thousands.

use super::core::{Fate, NlSocket, SockSpec, UringNeed};
use super::msg::{attrs, emit_header, finish, messages, NlMsg, ParseError};
use super::source::{FrameError, FrameStats};
use crate::netlink::NetlinkPath;
use crate::stats::{Counters, Fallback, Report};
use crate::sys::netlink as nl;
use std::io;

/// What to dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpKind {
    /// `RTM_GETROUTE`.
    Routes,
    /// `RTM_GETLINK`.
    Links,
    /// `RTM_GETNEIGH`.
    Neigh,
    /// `RTM_GETADDR`.
    Addrs,
}

impl DumpKind {
    /// Request type and the fixed header length of the answers.
    fn request(self) -> (u16, usize) {
        match self {
            DumpKind::Routes => (nl::RTM_GETROUTE, 12),
            DumpKind::Links => (nl::RTM_GETLINK, 16),
            DumpKind::Neigh => (nl::RTM_GETNEIGH, 12),
            DumpKind::Addrs => (nl::RTM_GETADDR, 8),
        }
    }
    /// Fixed header length (`rtmsg`, `ifinfomsg`, `ndmsg`, `ifaddrmsg`) before attributes.
    pub fn header_len(self) -> usize {
        self.request().1
    }
}

/// Errors of a dump.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// Socket set-up or send failed.
    #[error("{what}: {source}")]
    Io {
        /// What was attempted.
        what: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The frame ring failed.
    #[error(transparent)]
    Frames(#[from] FrameError),
    /// The kernel answered with an error.
    #[error("kernel refused the dump: {0}")]
    Kernel(io::Error),
    /// A malformed message.
    #[error("malformed dump message: {0}")]
    Parse(#[from] ParseError),
    /// The kernel overran the receive buffer: the dump is incomplete.
    #[error("receive buffer overrun (ENOBUFS): the dump is incomplete; raise the receive buffer")]
    Overrun,
}

/// What a dump cost.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct DumpStats {
    /// Messages (objects) received.
    pub messages: u64,
    /// Datagrams received.
    pub datagrams: u64,
    /// Bytes received.
    pub bytes: u64,
    /// The kernel flagged the dump as interrupted (`NLM_F_DUMP_INTR`): the table changed.
    pub interrupted: bool,
    /// Frame ring counters (receive syscalls, COPY frames).
    pub frames: FrameStats,
}

/// A rtnetlink socket with a frame ring for dumps.
#[derive(Debug)]
pub struct RouteSocket {
    sock: NlSocket,
    fallbacks: Vec<Fallback>,
    counters: Counters,
}

/// The largest dump datagram the kernel builds.
const DUMP_DATAGRAM: usize = 32 << 10;

impl RouteSocket {
    /// Opens a `NETLINK_ROUTE` socket with `frames` frames of 32 KiB and a receive buffer of
    /// `rcvbuf` bytes (`SO_RCVBUFFORCE`; without CAP_NET_ADMIN, `SO_RCVBUF` capped by
    /// `net.core.rmem_max`, recorded in [`Report::fallbacks`] with the size granted).
    pub fn new(frames: u32, rcvbuf: usize) -> Result<Self, DumpError> {
        let mut fallbacks = Vec::new();
        let spec = SockSpec {
            protocol: nl::NETLINK_ROUTE,
            groups: &[],
            rcvbuf: Some((rcvbuf, true)),
            no_enobufs: false,
            ext_ack: false,
            frame_size: DUMP_DATAGRAM + 16,
            frames,
            spill: 64 << 10,
            uring: None,
            batch_wait: None,
        };
        let sock = NlSocket::open(&spec, &mut fallbacks).map_err(|e| DumpError::Io {
            what: e.what,
            source: e.source,
        })?;
        Ok(Self {
            sock,
            fallbacks,
            counters: Counters::default(),
        })
    }

    /// Fills frames with an io_uring multishot recv instead of `recvmmsg` (dump datagrams are
    /// at most 32 KiB, so they always fit a frame). On failure the socket keeps `recvmmsg` and
    /// [`Report::fallbacks`] says why.
    pub fn use_uring(&mut self) -> bool {
        let need = UringNeed {
            datagram: DUMP_DATAGRAM,
            what: "a dump datagram",
        };
        self.sock.enable_uring(&need, &mut self.fallbacks)
    }

    /// `frame-ring+io_uring` or `frame-ring+recvmmsg`.
    pub fn path(&self) -> NetlinkPath {
        self.sock.path()
    }

    /// Dumps `kind` for `family` (`AF_UNSPEC` = 0 for all), calling `f` with each object
    /// message in arrival order.
    pub fn dump(
        &mut self,
        kind: DumpKind,
        family: u8,
        mut f: impl FnMut(&NlMsg<'_>),
    ) -> Result<DumpStats, DumpError> {
        let (ty, hdr) = kind.request();
        let seq = self.sock.next_seq();
        let mut req = Vec::with_capacity(64);
        emit_header(&mut req, ty, nl::NLM_F_REQUEST | nl::NLM_F_DUMP, seq, 0);
        let start = 0;
        req.resize(req.len() + hdr, 0);
        req[16] = family; // the first byte of every rtnetlink header is the family
        finish(&mut req, start).expect("a dump request header is a few bytes");
        nl::send_to_kernel(&self.sock.fd, &req).map_err(|e| DumpError::Io {
            what: "sending the dump request",
            source: e,
        })?;
        let before = self.sock.frame_stats();
        let mut st = DumpStats::default();
        loop {
            let fill = self.sock.fill(64, std::time::Duration::MAX)?;
            if fill.overrun {
                return Err(DumpError::Overrun);
            }
            let mut done = false;
            let mut err = None;
            self.sock.for_each_ready(|_, data| {
                if err.is_some() {
                    return Fate::Release;
                }
                st.datagrams += 1;
                st.bytes += data.len() as u64;
                for m in messages(data) {
                    let m = match m {
                        Ok(m) => m,
                        Err(e) => {
                            err = Some(DumpError::Parse(e));
                            break;
                        }
                    };
                    if m.seq != seq {
                        continue;
                    }
                    if m.flags & nl::NLM_F_DUMP_INTR != 0 {
                        st.interrupted = true;
                    }
                    match m.ty {
                        nl::NLMSG_DONE => done = true,
                        nl::NLMSG_ERROR => match m.error_code() {
                            Ok(0) => {}
                            Ok(c) => {
                                err = Some(DumpError::Kernel(io::Error::from_raw_os_error(-c)))
                            }
                            Err(e) => err = Some(DumpError::Parse(e)),
                        },
                        nl::NLMSG_NOOP | nl::NLMSG_OVERRUN => {}
                        _ => {
                            st.messages += 1;
                            f(&m);
                        }
                    }
                }
                Fate::Release
            });
            if let Some(e) = err {
                return Err(e);
            }
            if done {
                break;
            }
        }
        let after = self.sock.frame_stats();
        self.counters.bytes += st.bytes;
        self.counters.ops += st.messages;
        // The request's send, and the receives.
        self.counters.syscalls += 1 + (after.syscalls - before.syscalls);
        st.frames = after.since(&before);
        Ok(st)
    }
}

/// Interface names by index, from a link dump (for printing routes like `ip` does).
pub fn link_names(
    sock: &mut RouteSocket,
) -> Result<std::collections::HashMap<u32, String>, DumpError> {
    let mut names = std::collections::HashMap::new();
    sock.dump(DumpKind::Links, 0, |m| {
        if m.payload.len() < 16 {
            return;
        }
        let p = m.payload;
        let idx = u32::from_ne_bytes([p[4], p[5], p[6], p[7]]);
        for a in attrs(&p[16..]).flatten() {
            if a.ty == 3 {
                // IFLA_IFNAME
                let n = a.value.split(|&b| b == 0).next().unwrap_or(&[]);
                names.insert(idx, String::from_utf8_lossy(n).into_owned());
            }
        }
    })?;
    Ok(names)
}

/// The fields of a route message that `ip route` prints first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Route<'a> {
    /// Address family.
    pub family: u8,
    /// Destination prefix length.
    pub dst_len: u8,
    /// Routing table (`RTA_TABLE` when present).
    pub table: u32,
    /// Route type (`RTN_*`).
    pub kind: u8,
    /// `RTA_DST`.
    pub dst: Option<&'a [u8]>,
    /// `RTA_GATEWAY`.
    pub gateway: Option<&'a [u8]>,
    /// `RTA_OIF`.
    pub oif: Option<u32>,
    /// `RTA_PRIORITY`.
    pub metric: Option<u32>,
}

impl<'a> Route<'a> {
    /// Parses a `RTM_NEWROUTE` message.
    pub fn parse(m: &NlMsg<'a>) -> Result<Self, ParseError> {
        if m.ty != nl::RTM_NEWROUTE {
            return Err(ParseError::Type(m.ty));
        }
        let p = m.payload;
        if p.len() < 12 {
            return Err(ParseError::Truncated {
                what: "rtmsg",
                need: 12,
                have: p.len(),
            });
        }
        let mut r = Route {
            family: p[0],
            dst_len: p[1],
            table: u32::from(p[4]),
            kind: p[7],
            ..Default::default()
        };
        for a in attrs(&p[12..]) {
            let a = a?;
            match a.ty {
                1 => r.dst = Some(a.value),
                5 => r.gateway = Some(a.value),
                4 => r.oif = Some(a.ne32("RTA_OIF")?),
                6 => r.metric = Some(a.ne32("RTA_PRIORITY")?),
                15 => r.table = a.ne32("RTA_TABLE")?,
                _ => {}
            }
        }
        Ok(r)
    }

    /// Formats like `ip route show`: `198.18.0.0/24 via 198.18.0.2 dev veth0`, with interface
    /// names from `names` (the index when unknown).
    pub fn format_named(&self, out: &mut String, names: &std::collections::HashMap<u32, String>) {
        self.format_inner(out, Some(names))
    }

    /// Formats like `ip route show`, interfaces by index.
    pub fn format(&self, out: &mut String) {
        self.format_inner(out, None)
    }

    fn format_inner(
        &self,
        out: &mut String,
        names: Option<&std::collections::HashMap<u32, String>>,
    ) {
        use std::fmt::Write;
        match self.dst {
            Some(d) => {
                fmt_addr(out, d);
                if (self.family == 2 && self.dst_len != 32)
                    || (self.family == 10 && self.dst_len != 128)
                {
                    let _ = write!(out, "/{}", self.dst_len);
                }
            }
            None => out.push_str("default"),
        }
        if let Some(g) = self.gateway {
            out.push_str(" via ");
            fmt_addr(out, g);
        }
        if let Some(o) = self.oif {
            match names.and_then(|n| n.get(&o)) {
                Some(n) => {
                    out.push_str(" dev ");
                    out.push_str(n);
                }
                None => {
                    let _ = write!(out, " dev {o}");
                }
            }
        }
        if let Some(m) = self.metric {
            let _ = write!(out, " metric {m}");
        }
        out.push('\n');
    }
}

fn fmt_addr(out: &mut String, a: &[u8]) {
    use std::fmt::Write;
    match a.len() {
        4 => {
            let _ = write!(out, "{}", std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3]));
        }
        16 => {
            let mut b = [0u8; 16];
            b.copy_from_slice(a);
            let _ = write!(out, "{}", std::net::Ipv6Addr::from(b));
        }
        _ => out.push('?'),
    }
}

impl Report for RouteSocket {
    type Path = NetlinkPath;
    fn path(&self) -> NetlinkPath {
        RouteSocket::path(self)
    }
    /// Over every dump so far: `bytes` received, `ops` = object messages, `syscalls` = the
    /// requests' sends and the receives.
    fn counters(&self) -> Counters {
        self.counters.clone()
    }
    fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }
}

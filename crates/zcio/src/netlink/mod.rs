//! Netlink: a frame ring for batched receive, message framing, NFQUEUE with batch verdicts,
//! NFLOG, conntrack events and rtnetlink dumps.
//!
//! - [`msg`]: netlink messages and attributes (parse in place, emit into a buffer);
//! - [`nfqmsg`]: nfqueue CONFIG / PACKET / VERDICT / VERDICT_BATCH;
//! - [`NfQueue`]: the NFQUEUE consumer (bind one queue or a range, hold packets, batch
//!   verdicts);
//! - [`NfLog`]: the NFLOG consumer (groups, copy mode, kernel-side batching, sequence-checked
//!   loss accounting), packets as [`LogPacket`]s;
//! - [`CtEvents`]: conntrack NEW/UPDATE/DESTROY events as [`CtEvent`]s ([`Conntrack`] entries);
//! - [`route`]: rtnetlink dumps through the frame ring;
//! - [`packet`]: the queued packet itself: where its transport header is, and making a
//!   rewritten packet consistent again (lengths and checksums) before a mangle verdict.
//!
//! Every consumer is one socket and one frame ring from the crate-private core
//! (`netlink::core`): the ring's memory and frame states are `buf::frames::FrameRing` (public
//! under the `unstable-raw` feature), its producers (`recvmmsg`, io_uring) are
//! `netlink::source`; their counters are [`FrameStats`], their errors [`FrameError`]. NFLOG and
//! conntrack events are a parser and a thin type on the core's read-only stream.

mod conntrack;
mod core;
mod ctevents;
pub mod msg;
mod nflog;
pub mod nfqmsg;
pub mod packet;
pub mod queue;
mod refusal;
pub mod route;
mod source;
pub mod tracker;

pub use crate::buf::frames::FramePin;
pub use conntrack::{
    tcp_state_name, Conntrack, CtCounters, CtEvent, CtEventKind, CtTimestamp, TcpInfo, Tuple,
};
pub use core::{Loss, StreamStats};
pub use ctevents::{CtError, CtEvents, CtEventsConfig, CtStats};
pub use nflog::{
    GroupStats, LogPacket, NfLog, NfLogConfig, NfLogError, NfLogStats, DEFAULT_NLBUFSIZ,
    MIN_NLBUFSIZ,
};

pub use nfqmsg::{CopyMode, Packet, Verdict};
pub use queue::{
    kernel_queue_stats, Decision, KernelQueueStats, NfQueue, NfQueueConfig, NfqError, NfqStats,
    PacketInfo, PacketRef, Received,
};
pub use refusal::BindRefusal;
pub use source::{FrameError, FrameStats};

/// How a netlink consumer ([`NfQueue`], [`NfLog`], [`CtEvents`], [`RouteSocket`]) fills its
/// frame ring: chosen once, when the socket is opened ([`NfQueueConfig::uring`],
/// [`NfLogConfig::uring`], [`CtEventsConfig::uring`], [`RouteSocket::use_uring`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum NetlinkPath {
    /// An io_uring multishot receive into a provided-buffer ring of frames:
    /// `frame-ring+io_uring`.
    FrameRingUring,
    /// Batched `recvmmsg` into the frames: `frame-ring+recvmmsg`.
    FrameRingRecvmmsg,
}

impl NetlinkPath {
    /// `frame-ring+io_uring` or `frame-ring+recvmmsg`.
    pub fn as_str(self) -> &'static str {
        match self {
            NetlinkPath::FrameRingUring => "frame-ring+io_uring",
            NetlinkPath::FrameRingRecvmmsg => "frame-ring+recvmmsg",
        }
    }
}

impl std::fmt::Display for NetlinkPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
pub use route::{link_names, DumpKind, DumpStats, Route, RouteSocket};

/// Sets a netlink socket's receive buffer to `bytes`. With `force`, `SO_RCVBUFFORCE` (past
/// `net.core.rmem_max`; needs CAP_NET_ADMIN in the initial user namespace, which a rootless
/// container lacks even where it may bind a queue); when that is refused, plain `SO_RCVBUF`.
/// A refused `SO_RCVBUFFORCE`, or a buffer the kernel capped below the request, is recorded
/// in `fallbacks` with the size asked for and the size granted: never silently smaller.
/// Fails only when `SO_RCVBUF` itself fails. Returns the size the kernel reports.
fn size_rcvbuf(
    fd: &impl std::os::fd::AsRawFd,
    bytes: usize,
    force: bool,
    fallbacks: &mut Vec<crate::stats::Fallback>,
) -> std::io::Result<usize> {
    use crate::stats::{Fallback, Path};
    use crate::sys::netlink as nl;
    let want = bytes.min(i32::MAX as usize / 2);
    // The kernel stores (and `getsockopt` reports) twice the size granted, for its overhead.
    let granted = |reported: usize| reported / 2;
    if force {
        match nl::set_rcvbuf(fd, want, true) {
            Ok(got) => return Ok(got),
            Err(e) => {
                let got = nl::set_rcvbuf(fd, want, false)?;
                fallbacks.push(Fallback::new(
                    Path::setting("SO_RCVBUFFORCE"),
                    Path::setting("SO_RCVBUF"),
                    format!(
                        "SO_RCVBUFFORCE refused: {e} (needs CAP_NET_ADMIN); asked for {want} \
                         bytes, SO_RCVBUF granted {} (capped by net.core.rmem_max)",
                        granted(got)
                    ),
                ));
                return Ok(got);
            }
        }
    }
    let got = nl::set_rcvbuf(fd, want, false)?;
    if granted(got) < want {
        fallbacks.push(Fallback::new(
            Path::setting("SO_RCVBUF"),
            Path::setting("SO_RCVBUF capped"),
            format!(
                "asked for {want} bytes, the kernel granted {} (capped by net.core.rmem_max); \
                 raise net.core.rmem_max or use SO_RCVBUFFORCE (CAP_NET_ADMIN)",
                granted(got)
            ),
        ));
    }
    Ok(got)
}

/// Runs every parser over `data` as the fuzz target does: netlink framing, attributes (with
/// nfqueue and rtnetlink fixed headers), the nfqueue messages, routes, and for each message
/// that parses, emit → parse again → compare. Returns the first parse error; never panics.
pub fn fuzz_parse(data: &[u8]) -> Result<(), msg::ParseError> {
    let mut first = None;
    let mut note = |r: Result<(), msg::ParseError>| {
        if let Err(e) = r {
            first.get_or_insert(e);
        }
    };
    note(msg::reemit(data, nfqmsg::NFGENMSG_LEN).map(drop));
    note(msg::reemit(data, 12).map(drop));
    for m in msg::messages(data) {
        let m = match m {
            Ok(m) => m,
            Err(e) => {
                note(Err(e));
                break;
            }
        };
        for a in msg::attrs(m.payload.get(4..).unwrap_or(&[])) {
            if let Err(e) = a {
                note(Err(e));
                break;
            }
        }
        match nfqmsg::parse_one(&m) {
            Ok(nfqmsg::AnyMsg::Packet(p)) => {
                let mut out = Vec::new();
                p.emit(&mut out, m.seq, m.pid)
                    .expect("a parsed packet re-emits");
                let (m2, _) = msg::NlMsg::parse(&out).expect("emitted packet parses");
                let p2 = nfqmsg::Packet::parse(&m2).expect("emitted packet parses");
                assert_eq!(p2.id, p.id);
                assert_eq!(p2.payload, p.payload);
            }
            Ok(nfqmsg::AnyMsg::Verdict(v)) => {
                let mut out = Vec::new();
                v.emit(&mut out, m.seq).expect("a parsed verdict re-emits");
                let (m2, _) = msg::NlMsg::parse(&out).expect("emitted verdict parses");
                assert_eq!(nfqmsg::VerdictMsg::parse(&m2).as_ref(), Ok(&v));
            }
            Ok(nfqmsg::AnyMsg::Config(c)) => {
                let mut out = Vec::new();
                c.emit(&mut out, m.seq).expect("a parsed config re-emits");
                let (m2, _) = msg::NlMsg::parse(&out).expect("emitted config parses");
                assert_eq!(nfqmsg::ConfigMsg::parse(&m2).as_ref(), Ok(&c));
            }
            Ok(_) => {}
            Err(e) => note(Err(e)),
        }
        if m.ty == crate::sys::netlink::RTM_NEWROUTE {
            if let Ok(r) = route::Route::parse(&m) {
                let mut s = String::new();
                r.format(&mut s);
            }
        }
    }
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The NFLOG parser over arbitrary bytes, as the `parse_nflog` fuzz target runs it: every
/// message of the datagram that parses as a [`LogPacket`] is emitted, parsed again and
/// compared (and its `NFULA_CT` parsed as a [`Conntrack`]). Returns the first parse error;
/// never panics.
pub fn fuzz_parse_nflog(data: &[u8]) -> Result<(), msg::ParseError> {
    let mut first = None;
    for m in msg::messages(data) {
        let m = match m {
            Ok(m) => m,
            Err(e) => {
                first.get_or_insert(e);
                break;
            }
        };
        if m.ty < 16 {
            // NLMSG_DONE ends a batch.
            continue;
        }
        match LogPacket::parse(&m) {
            Ok(p) => {
                let mut out = Vec::new();
                p.emit(&mut out, m.seq, m.pid)
                    .expect("a parsed packet re-emits");
                let back = LogPacket::parse_bytes(&out).expect("an emitted packet parses");
                // Attributes zcio does not know are not re-emitted.
                let want = LogPacket {
                    unknown: 0,
                    ..p.clone()
                };
                assert_eq!(back, want, "parse -> emit -> parse changed the packet");
                if let Some(Err(e)) = p.conntrack() {
                    first.get_or_insert(e);
                }
            }
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// The conntrack event parser over arbitrary bytes, as the `parse_ctevents` fuzz target runs
/// it: every message that parses as a [`CtEvent`] is emitted, parsed again, compared and
/// formatted as `conntrack -E` would. Returns the first parse error; never panics.
pub fn fuzz_parse_ctevents(data: &[u8]) -> Result<(), msg::ParseError> {
    let mut first = None;
    for m in msg::messages(data) {
        let m = match m {
            Ok(m) => m,
            Err(e) => {
                first.get_or_insert(e);
                break;
            }
        };
        match CtEvent::parse(&m) {
            Ok(e) => {
                let mut out = Vec::new();
                e.emit(&mut out).expect("a parsed event re-emits");
                let back = CtEvent::parse_bytes(&out).expect("an emitted event parses");
                // Attributes zcio does not know are not re-emitted.
                let mut want = e.clone();
                want.ct.unknown = 0;
                assert_eq!(back, want, "parse -> emit -> parse changed the event");
                let mut s = String::new();
                e.write_conntrack(&mut s, true, 0)
                    .expect("formatting into a String");
            }
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    first.map_or(Ok(()), Err)
}

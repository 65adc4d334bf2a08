//! Netlink: a frame ring for batched receive, message framing, NFQUEUE with batch verdicts and
//! rtnetlink dumps.
//!
//! - [`msg`]: netlink messages and attributes (parse in place, emit into a buffer);
//! - [`nfqmsg`]: nfqueue CONFIG / PACKET / VERDICT / VERDICT_BATCH;
//! - [`NfQueue`]: the consumer (bind one queue or a range, hold packets, batch verdicts);
//! - [`route`]: rtnetlink dumps through the frame ring.
//!
//! The frame ring is crate-private: its memory and frame states are `buf::frames::FrameRing`
//! (public under the `unstable-raw` feature), its producers (`recvmmsg`, io_uring) are
//! `netlink::source`; their counters are [`FrameStats`], their errors [`FrameError`].

pub mod msg;
pub mod nfqmsg;
pub mod queue;
pub mod route;
mod source;
pub mod tracker;

pub use nfqmsg::{CopyMode, Packet, Verdict};
pub use queue::{
    kernel_queue_stats, Decision, KernelQueueStats, NfQueue, NfQueueConfig, NfqError, NfqStats,
    PacketRef,
};
pub use source::{FrameError, FrameStats};

/// How a netlink consumer ([`NfQueue`], [`RouteSocket`]) fills its frame ring: chosen once,
/// when the socket is opened ([`NfQueueConfig::uring`], [`RouteSocket::use_uring`]).
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

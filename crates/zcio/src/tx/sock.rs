//! One socket of a [`SendRing`](super::SendRing): what it is (stream or datagram, payload per
//! datagram, GSO), the path its sends take, its own order and accounting, and its fallbacks.

use super::core::{Finished, SendTracker};
use super::msgzc::MsgZc;
use super::policy::CopiedWatch;
use super::{sock_err, Path, SenderConfig, TxError, TxMode, TxStats};
use crate::buf::lent::Lent;
use crate::ring::lend::{FileId, LendId};
use crate::rx::{ConnId, RxPath};
use crate::stats::{self, Counters, Fallback};
use crate::sys::msg::MsgOpts;
use crate::sys::{self, net};
use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// What is known of a socket before it is added.
#[derive(Debug)]
pub(super) struct Shape {
    pub(super) stream: bool,
    /// AF_INET or AF_INET6 (zero-copy needs one).
    pub(super) ip: bool,
    /// AF_INET6.
    pub(super) v6: bool,
    /// A datagram socket without a peer: sends need a destination ([`super::Dest`]).
    pub(super) unconnected: bool,
    /// Most bytes per kernel send: one datagram or GSO batch (UDP), unbounded (TCP).
    pub(super) chunk: usize,
    /// UDP payload per datagram on the wire.
    pub(super) segment: usize,
    /// Largest UDP payload.
    pub(super) max_datagram: usize,
    pub(super) fallbacks: Vec<Fallback>,
}

/// Reads the socket's type, family and (UDP) path MTU, and turns on `UDP_SEGMENT` when
/// `cfg.udp_gso` asks for it.
pub(super) fn inspect(sock: &OwnedFd, cfg: &SenderConfig) -> Result<Shape, TxError> {
    let ty = sys::getsockopt_int(sock, libc::SOL_SOCKET, libc::SO_TYPE)
        .map_err(|e| sock_err("getsockopt(SO_TYPE)", e))?;
    let stream = match ty {
        libc::SOCK_STREAM => true,
        libc::SOCK_DGRAM => false,
        other => {
            return Err(sock_err(
                format!("socket type {other}"),
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a send ring needs SOCK_STREAM or SOCK_DGRAM sockets",
                ),
            ))
        }
    };
    let family = net::socket_family(sock).ok();
    if stream {
        check_can_send(sock, family.is_some())?;
    }
    let mut fallbacks = Vec::new();
    // UDP: datagram size from the route MTU, GSO for larger writes.
    let max_datagram = match family {
        Some(net::Family::V6) => 65527,
        _ => 65507,
    };
    let mut chunk = usize::MAX;
    let mut segment = usize::MAX;
    let unconnected =
        !stream && !net::is_connected(sock).map_err(|e| sock_err("getpeername", e))?;
    if unconnected {
        // Each send names its peer (and its segment size) in its own message: no path MTU to
        // read, no socket-wide UDP_SEGMENT.
        chunk = max_datagram;
    } else if !stream {
        let payload = match family {
            Some(net::Family::V4) => sys::getsockopt_int(sock, libc::SOL_IP, libc::IP_MTU)
                .map(|m| (m as usize).saturating_sub(28)),
            Some(net::Family::V6) => sys::getsockopt_int(sock, libc::SOL_IPV6, libc::IPV6_MTU)
                .map(|m| (m as usize).saturating_sub(48)),
            None => Ok(max_datagram),
        }
        .map_err(|e| sock_err("reading the path MTU (is the UDP socket connected?)", e))?
        .clamp(1, max_datagram);
        chunk = max_datagram;
        segment = max_datagram;
        if cfg.udp_gso && payload < max_datagram && family.is_some() {
            match sys::setsockopt_int(sock, sys::SOL_UDP, sys::UDP_SEGMENT, payload as i32) {
                // At most 64 segments per call (UDP_MAX_SEGMENTS on older kernels), and the
                // whole write must fit one IP packet's length field.
                Ok(()) => {
                    chunk = (max_datagram / payload).min(64) * payload;
                    segment = payload;
                }
                Err(e) => {
                    chunk = payload;
                    segment = payload;
                    fallbacks.push(Fallback::new(
                        stats::Path::setting("udp-gso"),
                        stats::Path::setting("one datagram per send call"),
                        format!("setsockopt(UDP_SEGMENT) failed: {e} (needs Linux 4.18)"),
                    ));
                }
            }
        } else if !cfg.udp_gso {
            chunk = usize::MAX;
            segment = usize::MAX;
        }
    }
    Ok(Shape {
        stream,
        ip: family.is_some(),
        v6: family == Some(net::Family::V6),
        unconnected,
        chunk,
        segment,
        max_datagram,
        fallbacks,
    })
}

/// A stream socket a send ring can send on: not listening, and connected or connecting
/// (its sends wait for the connection). Else every send would fail (`EPIPE`).
fn check_can_send(sock: &OwnedFd, ip: bool) -> Result<(), TxError> {
    let refuse = |errno, why: &str| {
        Err(sock_err(
            format!("adding a socket that cannot send: {why}"),
            io::Error::from_raw_os_error(errno),
        ))
    };
    let listening = sys::getsockopt_int(sock, libc::SOL_SOCKET, libc::SO_ACCEPTCONN)
        .map_err(|e| sock_err("getsockopt(SO_ACCEPTCONN)", e))?;
    if listening != 0 {
        return refuse(
            libc::EINVAL,
            "it is listening (add the sockets accept returns)",
        );
    }
    let unconnected = if ip {
        // A connect in progress (SYN_SENT) is fine: its sends go once it is connected.
        net::tcp_state(sock).map_err(|e| sock_err("getsockopt(TCP_INFO)", e))? == net::TCP_CLOSE
    } else {
        !net::is_connected(sock).map_err(|e| sock_err("getpeername", e))?
    };
    if unconnected {
        // A connect that failed left its error on the socket: that is the reason.
        let err = sys::getsockopt_int(sock, libc::SOL_SOCKET, libc::SO_ERROR).unwrap_or(0);
        if err != 0 {
            return Err(sock_err(
                "adding a socket whose connect failed",
                io::Error::from_raw_os_error(err),
            ));
        }
        return refuse(
            libc::ENOTCONN,
            "it is not connected (connect it first, or add a connecting one)",
        );
    }
    Ok(())
}

/// What a finished send needs to become a [`Completion`](super::Completion).
#[derive(Debug)]
pub(super) struct Meta {
    pub(super) ticket: u64,
    pub(super) len: usize,
    pub(super) path: Path,
    pub(super) token: u64,
    pub(super) chunk: Option<(ConnId, RxPath)>,
    /// Destination and control messages of a [`super::Dest`] send.
    pub(super) dest: Option<MsgOpts>,
    /// A vectored send: what makes each slice a [`super::TxBuf`] again (received chunks'
    /// metadata), and, when the slices were gathered into one buffer (paths without
    /// io_uring), the slices themselves.
    pub(super) parts: Option<Box<Parts>>,
}

/// The slices of a vectored send (see [`Meta::parts`]).
#[derive(Debug, Default)]
pub(super) struct Parts {
    pub(super) chunks: Vec<Option<(ConnId, RxPath)>>,
    pub(super) gathered_from: Vec<Lent>,
}

/// Per-send data of a socket's sends in flight, indexed by the socket's own send number
/// (which only grows, so a deque from the oldest live one replaces a map: no hashing).
#[derive(Debug, Default)]
pub(super) struct Metas {
    base: u64,
    q: VecDeque<Option<Meta>>,
}

impl Metas {
    pub(super) fn insert(&mut self, seq: u64, m: Meta) {
        if self.q.is_empty() {
            self.base = seq;
        }
        let i = (seq - self.base) as usize;
        if self.q.len() <= i {
            self.q.resize_with(i + 1, || None);
        }
        self.q[i] = Some(m);
    }

    pub(super) fn get(&self, seq: u64) -> Option<&Meta> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        self.q.get(i)?.as_ref()
    }

    pub(super) fn get_mut(&mut self, seq: u64) -> Option<&mut Meta> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        self.q.get_mut(i)?.as_mut()
    }

    pub(super) fn remove(&mut self, seq: u64) -> Option<Meta> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        let m = self.q.get_mut(i)?.take();
        while matches!(self.q.front(), Some(None)) {
            self.q.pop_front();
            self.base += 1;
        }
        m
    }
}

/// A closing TCP socket whose reset purged bytes the kernel had accepted but not sent: its
/// remaining completions wait here until its last one, then the purged bytes come off the
/// end of the stream (its last sends), so each send reports what reached the peer.
#[derive(Debug, Default)]
pub(super) struct Purge {
    /// Purged bytes not yet taken off a send.
    pub(super) left: u64,
    /// Completions held, in the order they finished (no buffer: an abandoned socket's).
    pub(super) held: Vec<(super::Completion, Option<super::TxBuf>)>,
}

/// A copy send the socket buffer could not take in full: the rest goes when it is writable.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) seq: u64,
    pub(super) buf: Lent,
    pub(super) sent: usize,
    pub(super) dest: Option<MsgOpts>,
}

/// `auto`'s state for one socket.
#[derive(Debug)]
pub(super) struct Auto {
    /// The zero-copy path (none: copy only).
    pub(super) zc: Option<Path>,
    /// The route (peer address) whose COPIED verdict the socket follows, an index of the
    /// ring's [`super::ring::Routes`], shared by every socket to that peer. `None` (no peer: an
    /// unconnected UDP socket): the socket's own `watch` decides.
    pub(super) route: Option<u32>,
    /// The COPIED watch of a socket without a route.
    pub(super) watch: Option<CopiedWatch>,
    /// The COPIED re-probe in flight (the socket's send number).
    pub(super) probe: Option<u64>,
    /// Whether the socket's path shows the copy verdict (it followed the last switch).
    pub(super) in_copy: bool,
    /// Whether the socket recorded the COPIED fallback (once).
    pub(super) noted: bool,
    /// Whether the socket recorded the dry-pool fallback (once).
    pub(super) pool_noted: bool,
}

/// One socket.
#[derive(Debug)]
pub(super) struct Sock {
    pub(super) fd: Arc<OwnedFd>,
    pub(super) gen: u32,
    pub(super) stream: bool,
    pub(super) v6: bool,
    pub(super) unconnected: bool,
    /// A `SENDMSG_ZC` from a registered pool was found unsupported (recorded once).
    pub(super) msg_fixed_noted: bool,
    /// Vectored sends went without `SEND_VECTORIZED`, or were gathered (recorded once).
    pub(super) vec_noted: bool,
    /// A zero-copy train needed more page fragments than one skb holds (recorded once).
    pub(super) frags_noted: bool,
    pub(super) chunk: usize,
    pub(super) segment: usize,
    pub(super) max_datagram: usize,
    pub(super) cfg: SenderConfig,
    /// The path new sends take now (`auto`: the arm it is on).
    pub(super) path: Path,
    pub(super) auto: Option<Box<Auto>>,
    /// On the ring: its registered file and its send core.
    pub(super) file: Option<FileId>,
    pub(super) tracker: Option<SendTracker<LendId>>,
    /// Per tracker slot: the path of the send using it now.
    pub(super) slot_paths: Vec<Path>,
    /// Finished sends whose buffer the ring still held (returned later; see
    /// `LendRing::take`).
    pub(super) held: Vec<Finished<LendId>>,
    /// Without the ring: `MSG_ZEROCOPY`, or a copy send in progress.
    pub(super) msg: Option<Box<MsgZc>>,
    pub(super) pending: Option<Pending>,
    /// The socket's own send numbers (tracker tags).
    pub(super) seq: u64,
    pub(super) meta: Metas,
    pub(super) counters: Counters,
    pub(super) stats: TxStats,
    pub(super) fallbacks: Vec<Fallback>,
    /// A send was refused: report the socket writable when it can take one again.
    pub(super) refused: bool,
    /// In the ring's `writable` queue now (a socket is queued at most once).
    pub(super) queued_writable: bool,
    /// Closing: no new sends; freed once nothing is in flight.
    pub(super) closing: bool,
    /// The ring failed for this socket: it sends by copy (syscalls) from now on.
    pub(super) retired: bool,
    /// A stream whose ring was abandoned with requests of unknown outcome: every later send
    /// fails with this errno.
    pub(super) broken: Option<i32>,
    /// Listed for the next pump (staged requests that may go).
    pub(super) dirty: bool,
    /// In the ring's epoll set (syscall paths: `EPOLLOUT` and the error queue).
    pub(super) in_epoll: bool,
    /// In the ring's `stalled` list.
    pub(super) stalled: bool,
    /// In the ring's `sys_busy` list (syscall-path sends in flight).
    pub(super) sys_listed: bool,
    /// In the io_uring side's `busy` list (ring sends in flight).
    pub(super) ring_listed: bool,
    /// In the current harvest's / submission's list of sockets (each once).
    pub(super) touched: bool,
    pub(super) pumped: bool,
    /// The ring was abandoned with sends of this socket in it: they never come back.
    pub(super) stuck: bool,
    /// Abandoned: completions are dropped (with their buffers) instead of delivered.
    pub(super) discard: bool,
    /// The `MSG_ZEROCOPY` backend's totals at the last look.
    pub(super) msg_seen: super::msgzc::MsgStats,
    /// Closing after a reset that purged unsent bytes.
    pub(super) purge: Option<Box<Purge>>,
}

impl Sock {
    pub(super) fn new(fd: Arc<OwnedFd>, gen: u32, shape: &Shape, cfg: &SenderConfig) -> Self {
        Self {
            fd,
            gen,
            stream: shape.stream,
            v6: shape.v6,
            unconnected: shape.unconnected,
            msg_fixed_noted: false,
            vec_noted: false,
            frags_noted: false,
            chunk: shape.chunk,
            segment: shape.segment,
            max_datagram: shape.max_datagram,
            cfg: cfg.clone(),
            path: Path::Copy,
            auto: None,
            file: None,
            tracker: None,
            slot_paths: Vec::new(),
            held: Vec::new(),
            msg: None,
            pending: None,
            seq: 0,
            meta: Metas::default(),
            counters: Counters::default(),
            stats: TxStats::default(),
            fallbacks: shape.fallbacks.clone(),
            refused: false,
            queued_writable: false,
            closing: false,
            retired: false,
            broken: None,
            dirty: false,
            in_epoll: false,
            stalled: false,
            sys_listed: false,
            ring_listed: false,
            touched: false,
            pumped: false,
            discard: false,
            stuck: false,
            msg_seen: Default::default(),
            purge: None,
        }
    }

    /// Sends that can still come back: those stuck in an abandoned ring cannot, and do not
    /// count against `depth`.
    pub(super) fn in_flight_active(&self) -> usize {
        if self.stuck {
            self.msg.as_ref().map_or(0, |m| m.in_flight()) + usize::from(self.pending.is_some())
        } else {
            self.in_flight()
        }
    }

    /// Sends of the syscall paths in flight (`MSG_ZEROCOPY`, a copy being continued).
    pub(super) fn sys_in_flight(&self) -> usize {
        self.msg.as_ref().map_or(0, |m| m.in_flight()) + usize::from(self.pending.is_some())
    }

    /// Sends owned by the socket's backends (queued, in the kernel, owed a notification).
    pub(super) fn in_flight(&self) -> usize {
        self.tracker.as_ref().map_or(0, |t| t.live())
            + self.held.len()
            + self.msg.as_ref().map_or(0, |m| m.in_flight())
            + usize::from(self.pending.is_some())
    }

    /// Why a send now would be refused, if it would.
    pub(super) fn refusal(&self) -> Option<super::Refusal> {
        use super::Refusal;
        if self.closing {
            return Some(Refusal::Closed);
        }
        if self.pending.is_some() {
            return Some(Refusal::SocketFull);
        }
        if let Some(s) = self.msg.as_ref().and_then(|m| m.stall()) {
            return Some(match s {
                super::msgzc::Stall::Full => Refusal::SocketFull,
                super::msgzc::Stall::NoRoom => Refusal::NoRoom,
            });
        }
        if self.in_flight_active() >= self.cfg.depth.max(1) {
            return Some(Refusal::Depth);
        }
        None
    }

    /// The copy arm of this socket: on the ring `uring-copy`, else plain `send`.
    pub(super) fn copy_path(&self) -> Path {
        if self.tracker.is_some() && !self.retired {
            Path::UringCopy
        } else {
            Path::Copy
        }
    }

    /// Records that sends now go by `to` instead of the current path, and why.
    pub(super) fn fall_back(&mut self, to: Path, reason: impl Into<String>) {
        self.fallbacks
            .push(Fallback::new(self.path, to, reason.into()));
        self.path = to;
    }

    /// Records a fallback from a requested mode (set-up).
    pub(super) fn fall_back_from(
        &mut self,
        from: impl Into<stats::Path>,
        to: Path,
        reason: impl Into<String>,
    ) {
        self.fallbacks.push(Fallback::new(from, to, reason.into()));
        self.path = to;
    }

    /// Whether `auto` is on.
    pub(super) fn is_auto(&self) -> bool {
        self.cfg.mode == TxMode::Auto
    }
}

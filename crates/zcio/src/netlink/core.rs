//! The netlink consumer core: one socket and its frame ring, shared by every netlink user of
//! zcio ([`super::NfQueue`], [`super::NfLog`], [`super::CtEvents`], [`super::RouteSocket`]).
//!
//! - [`NlSocket`] opens the socket (protocol, multicast groups, receive buffer with recorded
//!   fallbacks, `NETLINK_NO_ENOBUFS`, extended ACKs), maps the frame ring and picks its producer
//!   once (io_uring when the largest datagram fits a frame, `recvmmsg` with spill otherwise, each
//!   refusal a recorded [`Fallback`]); it sends configuration requests and waits for their ACK
//!   (datagrams that arrive meanwhile go into the frame ring, never dropped); it fills the ring,
//!   hands out ready frames in arrival order and takes them back; and it reads the kernel's drop
//!   counter for the socket (`SO_MEMINFO`), which counts losses even where `ENOBUFS` is off.
//! - [`Stream`] is a read-only subscriber over an [`NlSocket`] for families whose messages need
//!   no answer (NFLOG, conntrack events): a [`Family`] is a parser plus a tally of per-family
//!   counters, everything else — bounded batches, parse errors, overruns, the readiness
//!   descriptor — is here. A new family is a parser and a thin public type.
//!
//! No `unsafe` here: sockets go through `sys`, frames through `buf::frames` and `netlink::source`.

use super::msg::{messages, NlMsg, ParseError};
use super::source::{Fill, FrameError, FrameSource, FrameStats, MAX_BATCH};
use super::NetlinkPath;
use crate::buf::frames::FrameId;
use crate::stats::{Fallback, Path};
use crate::sys::netlink as nl;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

/// Bytes of the netlink, nfgenmsg and attribute headers around a packet in an nfnetlink message
/// (conntrack and security-context attributes included): what a frame needs beyond the copy
/// range.
pub(crate) const MSG_OVERHEAD: usize = 512;

/// How to open an [`NlSocket`].
#[derive(Debug, Clone)]
pub(crate) struct SockSpec<'a> {
    /// Netlink protocol (`NETLINK_NETFILTER`, `NETLINK_ROUTE`).
    pub(crate) protocol: i32,
    /// Multicast groups to join (by number, `NETLINK_ADD_MEMBERSHIP`).
    pub(crate) groups: &'a [u32],
    /// Receive buffer size; with `.1`, `SO_RCVBUFFORCE`.
    pub(crate) rcvbuf: Option<(usize, bool)>,
    /// `NETLINK_NO_ENOBUFS`.
    pub(crate) no_enobufs: bool,
    /// `NETLINK_CAP_ACK` + `NETLINK_EXT_ACK` (a refusal is a recorded fallback).
    pub(crate) ext_ack: bool,
    /// Frame size, header included.
    pub(crate) frame_size: usize,
    /// Frames.
    pub(crate) frames: u32,
    /// `recvmmsg` spill per batch slot: a datagram up to frame payload + spill arrives whole.
    pub(crate) spill: usize,
    /// Fill with io_uring, if the largest datagram fits a frame.
    pub(crate) uring: Option<UringNeed>,
    /// io_uring mode: gather up to this many datagrams per wait, holding the first back at
    /// most this long (`IORING_FEAT_MIN_TIMEOUT`, 6.12; a refusal is a recorded fallback).
    pub(crate) batch_wait: Option<(usize, Duration)>,
}

/// What the io_uring producer needs: frames holding the largest datagram the kernel may send
/// (a provided buffer cannot spill).
#[derive(Debug, Clone)]
pub(crate) struct UringNeed {
    /// The largest datagram, bytes.
    pub(crate) datagram: usize,
    /// What sets it, for the fallback's reason (e.g. "the copy range").
    pub(crate) what: &'static str,
}

/// A step of opening a socket failed.
#[derive(Debug)]
pub(crate) struct OpenError {
    /// What was attempted.
    pub(crate) what: &'static str,
    /// Why it failed.
    pub(crate) source: io::Error,
}

/// A configuration request failed before the kernel answered it.
#[derive(Debug)]
pub(crate) enum RequestError {
    /// Sending it.
    Send(io::Error),
    /// Receiving the answer.
    Recv(io::Error),
    /// A malformed answer.
    Parse(ParseError),
    /// A datagram arrived before the answer and no frame was free to keep it.
    Full(u32),
}

/// What happens to a frame after the consumer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Back to the producer.
    Release,
    /// Held (SKIP) until released.
    Hold,
}

/// A netlink socket and its frame ring. See the module docs.
#[derive(Debug)]
pub(crate) struct NlSocket {
    pub(crate) fd: OwnedFd,
    pub(crate) ring: FrameSource,
    seq: u32,
    /// `sk_drops` when the socket was opened (`None`: the kernel has no `SO_MEMINFO`).
    drops_at_open: Option<u32>,
    /// The readiness descriptor is watched edge-triggered: `clear_notify` does not read the
    /// ring's eventfd ([`NlSocket::set_edge_readiness`]).
    edge: bool,
    /// System calls made on the ring's eventfd (reads, and writes for work left), and of
    /// them the reads.
    eventfd_calls: u64,
    eventfd_reads: u64,
}

fn step(what: &'static str) -> impl FnOnce(io::Error) -> OpenError {
    move |source| OpenError { what, source }
}

impl NlSocket {
    /// Opens and configures the socket, maps the ring and picks the producer; fallbacks taken
    /// on the way are appended to `fallbacks`.
    pub(crate) fn open(
        spec: &SockSpec<'_>,
        fallbacks: &mut Vec<Fallback>,
    ) -> Result<Self, OpenError> {
        Self::open_on(spec, None, fallbacks)
    }

    /// As [`NlSocket::open`], on `given` when there is one: a netlink socket of
    /// `spec.protocol` opened elsewhere (by a privileged parent, or in another network
    /// namespace, whose objects it then reaches). It is bound to a port id here unless it
    /// already has one.
    pub(crate) fn open_on(
        spec: &SockSpec<'_>,
        given: Option<OwnedFd>,
        fallbacks: &mut Vec<Fallback>,
    ) -> Result<Self, OpenError> {
        let fd = match given {
            None => {
                let fd = nl::socket(spec.protocol).map_err(step("socket(AF_NETLINK)"))?;
                nl::bind(&fd, 0, 0).map_err(step("bind netlink socket"))?;
                fd
            }
            Some(fd) => {
                nl::check_protocol(&fd, spec.protocol).map_err(step(
                    "checking the given socket (it must be an AF_NETLINK socket of this \
                     protocol)",
                ))?;
                if nl::port_id(&fd).map_err(step("getsockname on the given socket"))? == 0 {
                    nl::bind(&fd, 0, 0).map_err(step("bind the given netlink socket"))?;
                }
                fd
            }
        };
        if let Some((bytes, force)) = spec.rcvbuf {
            super::size_rcvbuf(&fd, bytes, force, fallbacks).map_err(step("SO_RCVBUF"))?;
        }
        if spec.no_enobufs {
            nl::set_no_enobufs(&fd, true).map_err(step("NETLINK_NO_ENOBUFS"))?;
        }
        if spec.ext_ack {
            if let Err(e) = nl::set_ext_ack(&fd) {
                // Error ACKs then carry no message text; the errno still arrives.
                fallbacks.push(Fallback::new(
                    Path::setting("NETLINK_EXT_ACK"),
                    Path::setting("plain ACKs"),
                    format!("NETLINK_CAP_ACK/NETLINK_EXT_ACK refused: {e} (Linux 4.12)"),
                ));
            }
        }
        for &g in spec.groups {
            nl::add_membership(&fd, g).map_err(step(
                "joining a netlink multicast group (NETLINK_ADD_MEMBERSHIP; nfnetlink groups \
                 need CAP_NET_ADMIN)",
            ))?;
        }
        let ring = FrameSource::new(spec.frame_size, spec.frames, spec.spill)
            .map_err(step("mapping the frame ring"))?;
        let drops_at_open = nl::socket_drops(&fd).ok();
        let mut s = Self {
            fd,
            ring,
            seq: 0,
            drops_at_open,
            edge: false,
            eventfd_calls: 0,
            eventfd_reads: 0,
        };
        if let Some(need) = &spec.uring {
            if s.enable_uring(need, fallbacks) {
                if let Some((n, min_wait)) = spec.batch_wait.filter(|b| b.0 > 1 && !b.1.is_zero()) {
                    if let Err(reason) = s.ring.set_batch_wait(n, min_wait) {
                        fallbacks.push(Fallback::new(
                            Path::setting("batched waits (min-wait)"),
                            Path::setting("return on the first completion"),
                            reason,
                        ));
                    }
                }
            }
        }
        Ok(s)
    }

    /// Switches the producer to io_uring when `need.datagram` fits a frame; otherwise, or when
    /// io_uring is unavailable, stays on `recvmmsg` and records why. Returns whether io_uring
    /// fills the ring now.
    pub(crate) fn enable_uring(&mut self, need: &UringNeed, fallbacks: &mut Vec<Fallback>) -> bool {
        let payload = self.ring.frames().frame_payload();
        let reason = if need.datagram > payload {
            format!(
                "{} needs {}-byte frames but frames hold {payload}: a provided buffer cannot \
                 spill, so datagrams could be cut; lower it or raise the frame size",
                need.what, need.datagram
            )
        } else {
            match self.ring.enable_uring() {
                Ok(()) => return true,
                Err(reason) => reason,
            }
        };
        fallbacks.push(Fallback::new(
            NetlinkPath::FrameRingUring,
            NetlinkPath::FrameRingRecvmmsg,
            reason,
        ));
        false
    }

    /// `frame-ring+io_uring` or `frame-ring+recvmmsg`.
    pub(crate) fn path(&self) -> NetlinkPath {
        if self.ring.is_uring() {
            NetlinkPath::FrameRingUring
        } else {
            NetlinkPath::FrameRingRecvmmsg
        }
    }

    /// The next request sequence number.
    pub(crate) fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// The sequence number counter (verdict datagrams number themselves from it).
    pub(crate) fn seq_mut(&mut self) -> &mut u32 {
        &mut self.seq
    }

    /// Sends `msg` (one request with `NLM_F_ACK` and sequence number `seq`) and waits for its
    /// answer: the `NLMSG_ERROR` code, 0 for an ACK. Any other datagram that arrives first (a
    /// packet queued or logged between a bind and this answer) is put into the frame ring for
    /// the next fill to hand out, never dropped.
    pub(crate) fn request(&mut self, msg: &[u8], seq: u32) -> Result<i32, RequestError> {
        nl::send_to_kernel(&self.fd, msg).map_err(RequestError::Send)?;
        let mut buf = vec![0u8; 140 << 10];
        loop {
            let n = match crate::sys::net::recv(&self.fd, &mut buf, 0) {
                Ok(n) => n,
                // A socket handed over in non-blocking mode: wait for the answer.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    crate::sys::net::poll_one(&self.fd, libc::POLLIN, -1)
                        .map_err(RequestError::Recv)?;
                    continue;
                }
                Err(e) => return Err(RequestError::Recv(e)),
            };
            let mut ack = None;
            let mut other = false;
            for m in messages(&buf[..n]) {
                let Ok(m) = m else {
                    // Not this request's answer (audit records carry a length that leaves
                    // their own header out): the stream's parser counts what it is.
                    other = true;
                    break;
                };
                if m.ty == nl::NLMSG_ERROR && m.seq == seq {
                    ack = Some(m.error_code().map_err(RequestError::Parse)?);
                } else {
                    other = true;
                }
            }
            if other && !self.ring.inject(&buf[..n]) {
                return Err(RequestError::Full(self.ring.frames().count()));
            }
            if let Some(code) = ack {
                return Ok(code);
            }
        }
    }

    /// Receives up to `max` datagrams into free frames, waiting up to `wait` when nothing is
    /// ready (see [`FrameSource::fill`]).
    pub(crate) fn fill(&mut self, max: usize, wait: Duration) -> Result<Fill, FrameError> {
        self.ring.fill(&self.fd, max, wait)
    }

    /// The frame life cycle, consumer side: the next ready frame in arrival order. The
    /// consumer reads it ([`NlSocket::data`]) and then [`finish`](NlSocket::finish)es it.
    pub(crate) fn pop_ready(&mut self) -> Option<FrameId> {
        self.ring.frames_mut().pop_ready()
    }

    /// The bytes of a ready or held frame.
    pub(crate) fn data(&self, id: FrameId) -> &[u8] {
        self.ring.frames().data(id)
    }

    /// Gives a frame back to the producer (`Release`: UNUSED, and in io_uring mode straight
    /// back into the buffer ring at the next top-up) or keeps its bytes (`Hold`: SKIP, until
    /// a later `finish(id, Release)`).
    pub(crate) fn finish(&mut self, id: FrameId, fate: Fate) {
        match fate {
            Fate::Release => self.ring.frames_mut().release(id),
            Fate::Hold => self.ring.frames_mut().hold(id),
        }
    }

    /// Hands every ready frame, in arrival order, to `f` with its bytes, then finishes it as
    /// `f` says. Returns the frames handed out.
    pub(crate) fn for_each_ready(&mut self, mut f: impl FnMut(FrameId, &[u8]) -> Fate) -> usize {
        let mut n = 0;
        while let Some(id) = self.pop_ready() {
            n += 1;
            let fate = f(id, self.data(id));
            self.finish(id, fate);
        }
        n
    }

    /// Producer counters.
    pub(crate) fn frame_stats(&self) -> FrameStats {
        let mut f = self.ring.stats();
        f.syscalls += self.eventfd_calls;
        f
    }

    /// Datagrams (or, for multicast, messages) the kernel dropped at this socket since it was
    /// opened because its receive buffer was full (`sk_drops` via `SO_MEMINFO`; counted with
    /// and without `NETLINK_NO_ENOBUFS`). `None` when the kernel cannot say (before 4.12).
    pub(crate) fn kernel_drops(&self) -> Option<u64> {
        let base = self.drops_at_open?;
        let now = nl::socket_drops(&self.fd).ok()?;
        Some(u64::from(now.wrapping_sub(base)))
    }

    /// Adds this socket (level) and, in io_uring mode, the ring's registered eventfd (level)
    /// to a readiness set.
    pub(crate) fn add_to_readiness(
        &mut self,
        set: &crate::sys::ready::ReadySet,
    ) -> Result<(), OpenError> {
        set.add_level(self.fd.as_raw_fd(), libc::EPOLLIN as u32)
            .map_err(step("readiness set: add socket"))?;
        if let Some(u) = self.ring.uring_mut() {
            let fd = u
                .ring
                .notify_fd()
                .map_err(step("IORING_REGISTER_EVENTFD"))?
                .as_raw_fd();
            set.add_level(fd, libc::EPOLLIN as u32)
                .map_err(step("readiness set: add eventfd"))?;
        }
        Ok(())
    }

    /// Clears the ring's eventfd (io_uring mode) and says whether completions came in
    /// meanwhile (the caller then looks again). No syscall in `recvmmsg` mode.
    /// Watched edge-triggered, the eventfd is not read: the caller only looks.
    pub(crate) fn clear_notify(&mut self) -> bool {
        match self.ring.uring_mut() {
            Some(u) => {
                if !self.edge {
                    u.ring.clear_notify();
                    self.eventfd_calls += 1;
                    self.eventfd_reads += 1;
                }
                u.ring.has_work()
            }
            None => false,
        }
    }

    /// Leaves the ring's eventfd readable (io_uring mode): the caller stopped with work left.
    pub(crate) fn keep_notify(&mut self) {
        if let Some(u) = self.ring.uring_mut() {
            u.ring.keep_notify();
            self.eventfd_calls += 1;
        }
    }

    /// The readiness descriptor is watched edge-triggered (epoll's `EPOLLET`, as tokio's
    /// `AsyncFd` watches every descriptor): `clear_notify` then leaves the ring's eventfd
    /// counter as it is instead of reading it back to zero, one system call per harvest
    /// saved; the kernel's every signal of the eventfd makes a new edge whatever the counter
    /// holds. Off again (`false`) for a level-triggered watcher, which would find a counter
    /// left non-zero readable for ever: the counter is read back to zero once then.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn set_edge_readiness(&mut self, edge: bool) {
        if self.edge && !edge {
            if let Some(u) = self.ring.uring_mut() {
                u.ring.clear_notify();
                self.eventfd_calls += 1;
                self.eventfd_reads += 1;
            }
        }
        self.edge = edge;
    }

    /// Reads of the ring's eventfd back to zero (in [`FrameStats::syscalls`] too).
    pub(crate) fn eventfd_reads(&self) -> u64 {
        self.eventfd_reads
    }
}

/// A netlink family read by a [`Stream`]: how one message becomes an item, and the counters it
/// keeps about the items (sequence gaps, event kinds).
pub(crate) trait Family {
    /// What one message becomes, borrowed from its frame.
    type Item<'a>;
    /// Per-family counters.
    type Tally: Default + std::fmt::Debug;
    /// Parses one message; `Ok(None)` for a message that carries no item (`NLMSG_DONE` after
    /// a batch, `NLMSG_NOOP`).
    fn parse<'a>(m: &NlMsg<'a>) -> Result<Option<Self::Item<'a>>, ParseError>;
    /// Counts an item before the caller sees it.
    fn tally(t: &mut Self::Tally, item: &Self::Item<'_>);
    /// Losses the items have shown so far (NFLOG: sequence gaps); when it grows, the stream
    /// reads the socket's drop counter (see [`Stream::drops_at_last_gap`]).
    fn gaps(_t: &Self::Tally) -> u64 {
        0
    }
    /// Every datagram is one message whose `nlmsg_len` may not count its own header (audit:
    /// `audit_log_end` sets it to the payload's length on unicast, the multicast copy to the
    /// whole): the payload is then the rest of the datagram.
    const ONE_PER_DATAGRAM: bool = false;
}

/// The one message of a datagram of a [`Family::ONE_PER_DATAGRAM`] family: its header, and
/// the rest of the datagram as its payload, whatever `nlmsg_len` says. Well-formed messages
/// (`NLMSG_ERROR` ACKs) keep their own length.
pub(crate) fn whole_datagram(d: &[u8]) -> Result<NlMsg<'_>, ParseError> {
    if let Ok((m, _)) = NlMsg::parse(d) {
        if m.ty == nl::NLMSG_ERROR || m.payload.len() + nl::NLMSG_HDRLEN == d.len() {
            return Ok(m);
        }
    }
    let hdr: &[u8; nl::NLMSG_HDRLEN] = d
        .get(..nl::NLMSG_HDRLEN)
        .and_then(|h| h.try_into().ok())
        .ok_or(ParseError::Truncated {
            what: "nlmsghdr",
            need: nl::NLMSG_HDRLEN,
            have: d.len(),
        })?;
    let u32_at = |i: usize| u32::from_ne_bytes([hdr[i], hdr[i + 1], hdr[i + 2], hdr[i + 3]]);
    Ok(NlMsg {
        ty: u16::from_ne_bytes([hdr[4], hdr[5]]),
        flags: u16::from_ne_bytes([hdr[6], hdr[7]]),
        seq: u32_at(8),
        pid: u32_at(12),
        payload: &d[nl::NLMSG_HDRLEN..],
    })
}

/// Counters of a read-only netlink stream (`NfLogStats::stream`, `CtStats::stream`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StreamStats {
    /// Items handed to the caller (logged packets, conntrack events).
    pub items: u64,
    /// Datagrams received (one carries one or more messages).
    pub datagrams: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Receive syscalls (`recvmmsg`, `poll`, `io_uring_enter`, and in io_uring mode the
    /// readiness eventfd's reads and writes).
    pub syscalls: u64,
    /// Of those, reads of the readiness eventfd back to zero after a harvest (none while the
    /// descriptor is watched edge-triggered, as the tokio adapters watch it).
    pub eventfd_reads: u64,
    /// Kernel overruns seen (`ENOBUFS` on a receive): messages were lost before it. Off with
    /// `NETLINK_NO_ENOBUFS`; [`StreamStats::kernel_drops`] counts either way.
    pub overruns: u64,
    /// Datagrams (NFLOG: batches of messages; conntrack: single events) the kernel dropped at
    /// this socket because its receive buffer was full (`SO_MEMINFO` `sk_drops`, read when the
    /// counters are asked for; 0 where the kernel cannot say).
    pub kernel_drops: u64,
    /// Datagrams longer than a frame, kept whole out of line (`COPY` frames).
    pub copies: u64,
    /// Datagrams cut short (longer than frame and spill): their tail is lost.
    pub truncated: u64,
    /// Messages that did not parse (counted, never fatal; the rest of the datagram is read
    /// unless its framing broke).
    pub parse_errors: u64,
    /// Error messages from the kernel on the socket.
    pub kernel_errors: u64,
}

/// What is known of the messages a read-only stream lost: how many at least, at most when
/// a bound is known, and whether the count is exact. What each family can count, and what no
/// counter sees, is in `docs/design/netlink.md` ("Losses").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Loss {
    /// At least this many messages were lost (a true lower bound).
    pub at_least: u64,
    /// At most this many, when a bound is known.
    pub at_most: Option<u64>,
    /// `at_least` is the exact count: nothing is known to have been lost beyond it.
    pub exact: bool,
}

/// A read-only subscriber: an [`NlSocket`] whose messages a [`Family`] parses. See the module
/// docs.
#[derive(Debug)]
pub(crate) struct Stream<F: Family> {
    /// The readiness set, once asked for (closed before the socket).
    readiness: Option<crate::sys::ready::ReadySet>,
    pub(crate) sock: NlSocket,
    tally: F::Tally,
    stats: StreamStats,
    budget: usize,
    /// The frames of the batch being handed over (kept to reuse its allocation).
    batch_ids: Vec<FrameId>,
    /// [`Family::gaps`] when last looked at, and the socket's drop counter read right after
    /// the batch in which it last grew.
    gaps: u64,
    drops_at_gap: u64,
}

/// The items of one receive batch, parsed as they are taken; counters and the family's tally
/// are updated on the way.
struct Items<'d, 's, F: Family> {
    datas: std::slice::Iter<'s, &'d [u8]>,
    msgs: Option<super::msg::Messages<'d>>,
    stats: &'s mut StreamStats,
    tally: &'s mut F::Tally,
    count: usize,
}

impl<'d, F: Family> Iterator for Items<'d, '_, F> {
    type Item = F::Item<'d>;

    fn next(&mut self) -> Option<F::Item<'d>> {
        loop {
            if F::ONE_PER_DATAGRAM {
                let d = self.datas.next()?;
                match whole_datagram(d) {
                    Ok(m) => {
                        if let Some(item) = self.item(&m) {
                            return Some(item);
                        }
                    }
                    Err(e) => {
                        self.stats.parse_errors += 1;
                        tracing::warn!(error = %e, "malformed netlink datagram");
                    }
                }
                continue;
            }
            let Some(msgs) = &mut self.msgs else {
                self.msgs = Some(messages(self.datas.next()?));
                continue;
            };
            let m = match msgs.next() {
                Some(Ok(m)) => m,
                Some(Err(e)) => {
                    // The framing broke: nothing after this point can be found.
                    self.stats.parse_errors += 1;
                    tracing::warn!(error = %e, "malformed netlink datagram");
                    self.msgs = None;
                    continue;
                }
                None => {
                    self.msgs = None;
                    continue;
                }
            };
            if let Some(item) = self.item(&m) {
                return Some(item);
            }
        }
    }
}

impl<'d, F: Family> Items<'d, '_, F> {
    /// The item of one message, counted; `None` for an error message, one that carries no
    /// item, or one that does not parse (counted).
    fn item(&mut self, m: &NlMsg<'d>) -> Option<F::Item<'d>> {
        if m.ty == nl::NLMSG_ERROR {
            if m.error_code().is_ok_and(|c| c != 0) {
                self.stats.kernel_errors += 1;
            }
            return None;
        }
        match F::parse(m) {
            Ok(Some(item)) => {
                F::tally(self.tally, &item);
                self.stats.items += 1;
                self.count += 1;
                Some(item)
            }
            Ok(None) => None,
            Err(e) => {
                self.stats.parse_errors += 1;
                tracing::warn!(error = %e, ty = m.ty, "malformed netlink message");
                None
            }
        }
    }
}

impl<F: Family> Stream<F> {
    /// A stream over `sock` handling at most `budget` items per [`Stream::process`].
    pub(crate) fn new(sock: NlSocket, budget: usize) -> Self {
        Self {
            readiness: None,
            sock,
            tally: F::Tally::default(),
            stats: StreamStats::default(),
            budget: budget.max(1),
            batch_ids: Vec::with_capacity(MAX_BATCH),
            gaps: 0,
            drops_at_gap: 0,
        }
    }

    /// The socket's drop counter (since open) read right after the receive batch that showed
    /// the last of the family's gaps (0 before any): every datagram whose loss a gap shows
    /// was dropped before the message closing that gap was sent, hence before this read. A
    /// drop counted after it fell after the last gap, and so after every message that
    /// arrived when none arrived since. One `getsockopt` per batch that shows a new gap.
    pub(crate) fn drops_at_last_gap(&self) -> u64 {
        self.drops_at_gap
    }

    /// The family's counters.
    pub(crate) fn tally(&self) -> &F::Tally {
        &self.tally
    }

    /// Counters (reads the kernel's drop counter: one `getsockopt`).
    pub(crate) fn stats(&self) -> StreamStats {
        let f = self.sock.frame_stats();
        StreamStats {
            syscalls: f.syscalls,
            eventfd_reads: self.sock.eventfd_reads(),
            overruns: f.overruns,
            copies: f.copies,
            truncated: f.truncated,
            kernel_drops: self.sock.kernel_drops().unwrap_or(0),
            ..self.stats
        }
    }

    /// Receives what is ready (waiting up to `wait` when nothing is), parses every message and
    /// hands each item to `f` in arrival order; frames go back to the producer as soon as their
    /// items were seen. Stops after about `budget` items (an io_uring fill can hand over up to
    /// one window more) or when nothing more is ready. Returns the items handled.
    pub(crate) fn process<G>(&mut self, wait: Duration, f: &mut G) -> Result<usize, FrameError>
    where
        G: for<'a> FnMut(&F::Item<'a>),
    {
        self.process_batches(wait, &mut |items: &mut dyn Iterator<Item = F::Item<'_>>| {
            for item in items {
                f(&item);
            }
        })
    }

    /// As [`Stream::process`], but hands over one receive batch at a time: `g` gets an
    /// iterator over the items of every datagram one fill received, and all of them stay valid
    /// (their frames are not released) until `g` returns — so a writer can gather payloads from
    /// many frames into one `writev` without copying them. Items `g` leaves untaken are parsed
    /// and counted all the same (sequence accounting stays exact).
    pub(crate) fn process_batches<G>(
        &mut self,
        wait: Duration,
        g: &mut G,
    ) -> Result<usize, FrameError>
    where
        G: for<'d> FnMut(&mut dyn Iterator<Item = F::Item<'d>>),
    {
        let mut wait = wait;
        let mut total = 0usize;
        // An overrun takes one receive (the error), the data behind it is still queued: look
        // again, a few times at most, so a flood cannot keep one call from returning.
        let mut overruns = 0;
        loop {
            let left = self.budget.saturating_sub(total);
            if left == 0 {
                return Ok(total);
            }
            let asked = left.min(MAX_BATCH);
            let fill = self.sock.fill(asked, std::mem::take(&mut wait))?;
            let mut ids = std::mem::take(&mut self.batch_ids);
            while let Some(id) = self.sock.pop_ready() {
                ids.push(id);
            }
            let frames = ids.len();
            if frames > 0 {
                let datas: Vec<&[u8]> = ids.iter().map(|&id| self.sock.data(id)).collect();
                for d in &datas {
                    self.stats.datagrams += 1;
                    self.stats.bytes += d.len() as u64;
                }
                let mut items = Items::<F> {
                    datas: datas.iter(),
                    msgs: None,
                    stats: &mut self.stats,
                    tally: &mut self.tally,
                    count: 0,
                };
                g(&mut items);
                for _ in items.by_ref() {}
                total += items.count;
                let gaps = F::gaps(&self.tally);
                if gaps != self.gaps {
                    self.gaps = gaps;
                    if let Some(d) = self.sock.kernel_drops() {
                        self.drops_at_gap = d;
                    }
                }
            }
            for id in ids.drain(..) {
                self.sock.finish(id, Fate::Release);
            }
            self.batch_ids = ids;
            if fill.overrun && overruns < 4 {
                overruns += 1;
                continue;
            }
            // A full batch: more is likely queued. A short one (or every frame was taken, now
            // released): the socket was drained, and another receive would find nothing.
            if frames == 0 || (fill.frames < asked && !fill.full) {
                return Ok(total);
            }
        }
    }

    /// The readiness descriptor, created on first call: readable when [`Stream::on_ready`]
    /// would find messages (the socket has datagrams, or, in io_uring mode, the ring's
    /// registered eventfd was signalled).
    pub(crate) fn readiness_fd(&mut self) -> Result<std::os::fd::BorrowedFd<'_>, OpenError> {
        use std::os::fd::AsFd;
        if self.readiness.is_none() {
            let set = crate::sys::ready::ReadySet::new().map_err(step("readiness set"))?;
            self.sock.add_to_readiness(&set)?;
            self.readiness = Some(set);
        }
        Ok(self.readiness.as_ref().expect("readiness").as_fd())
    }

    /// Handles what is ready without waiting, then clears the ring's eventfd and looks again
    /// if completions came in meanwhile. Returns the items handled.
    pub(crate) fn on_ready<G>(&mut self, f: &mut G) -> Result<usize, FrameError>
    where
        G: for<'a> FnMut(&F::Item<'a>),
    {
        let mut n = 0;
        for _ in 0..4 {
            n += self.process(Duration::ZERO, f)?;
            if !self.sock.clear_notify() {
                return Ok(n);
            }
        }
        // Work is still coming in after four rounds: the descriptor stays readable for it
        // (cleared, it would not fire again for work already flagged).
        self.sock.keep_notify();
        Ok(n)
    }
}

//! [`SendRing`]: the sends of any number of sockets on one io_uring per thread. The public
//! calls, the socket table, completions, backpressure and readiness live here; what is
//! io_uring-specific is in `tx/uring.rs`, the syscall paths in `tx/copy.rs` and
//! `tx/msgzc.rs`, one socket's state in `tx/sock.rs`.

use super::copy;
use super::msgzc::{MsgZc, Stall};
use super::policy::{AutoPolicy, Choice, CopiedWatch, Event};
use super::sock::{self, Auto, Meta, Parts, Pending, Sock};
use super::uring::Uring;
use super::{
    explain_register, status_of, Completion, Dest, Path, Refusal, Refused, SendError, SenderConfig,
    SockId, Ticket, TxBuf, TxError, TxMode, TxStats, ZcStatus, MAX_SEGMENTS, MAX_SLICES,
};
use crate::buf::lent::Lent;
use crate::buf::pool::Pool;
use crate::ring::RingConfig;
use crate::stats::{self, Counters, Fallback, Report};
use crate::sys;
use crate::sys::msg::MsgOpts;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Settings of a [`SendRing`].
#[derive(Debug, Clone)]
pub struct SendRingConfig {
    /// The io_uring (submission queue size, task-run flags). The completion queue holds 4×
    /// the entries; overflows are flushed, never lost.
    pub ring: RingConfig,
    /// Slots of the sparse registered-file table (one per socket; capped by `RLIMIT_NOFILE`,
    /// which the kernel enforces). Sockets beyond it are named by descriptor.
    pub files: u32,
    /// Enter the kernel once this many requests are queued (across all sockets); calls to
    /// [`SendRing::submit`], [`SendRing::poll`] and the waits submit what is queued.
    pub submit_batch: usize,
}

impl Default for SendRingConfig {
    fn default() -> Self {
        Self {
            ring: RingConfig {
                entries: 256,
                ..RingConfig::default()
            },
            files: 1 << 16,
            submit_batch: 32,
        }
    }
}

/// The readiness set and which sources are in it.
#[derive(Debug)]
pub(super) struct Readiness {
    pub(super) set: sys::ready::ReadySet,
    pub(super) ring: bool,
}

/// Token of the ring's eventfd in the readiness set (sockets use their index).
pub(super) const RING_TOKEN: u64 = u64::MAX;

/// Sends of many sockets on one io_uring per thread. See the [module docs](super).
///
/// Not for sharing between threads: the ring belongs to the thread that created it
/// (`SINGLE_ISSUER`: `io_uring_enter` from another thread fails with `EEXIST`), so a
/// `SendRing` is not `Send`:
///
/// ```compile_fail
/// fn needs_send<T: Send>() {}
/// needs_send::<zcio::tx::SendRing>();
/// ```
pub struct SendRing {
    // The ring first: it is dropped (draining what is in flight) before the sockets.
    pub(super) uring: Option<Uring>,
    /// Why there is no ring (each socket that wanted one records it).
    pub(super) no_uring: Option<String>,
    pub(super) socks: Vec<Option<Sock>>,
    pub(super) gens: Vec<u32>,
    pub(super) free: Vec<u32>,
    pub(super) next_ticket: u64,
    pub(super) ready: VecDeque<(Completion, TxBuf)>,
    pub(super) writable: VecDeque<SockId>,
    /// Refused sockets that became able to send, ever (a wait for room ends on a change).
    writable_events: u64,
    /// `auto`'s cost by size, for every socket of the ring.
    pub(super) policy: AutoPolicy,
    /// `auto`'s COPIED verdict per route (peer address), for every socket to that peer.
    pub(super) routes: Routes,
    pub(super) cfg: SendRingConfig,
    pub(super) fallbacks: Vec<Fallback>,
    /// Why the last pool registration failed.
    pub(super) pool_error: Option<String>,
    /// Counts of sockets already freed, and of the ring itself (its enters).
    pub(super) gone: (Counters, TxStats),
    pub(super) own: (Counters, TxStats),
    pub(super) readiness: Option<Readiness>,
    /// Syscall-path sockets waiting for their socket (writable, error queue).
    pub(super) stalled: Vec<u32>,
    pub(super) _one_thread: std::marker::PhantomData<*const ()>,
}

impl std::fmt::Debug for SendRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendRing")
            .field("sockets", &self.sockets())
            .field("in_flight", &self.in_flight())
            .field("ring", &self.uring.as_ref().map(|u| u.lr.stats()))
            .finish()
    }
}

/// The COPIED verdict of one route (a peer address) and how many of the ring's `auto`
/// sockets send to it (the entry goes with the last). Whether the kernel copies a zero-copy
/// send depends on where it goes (local delivery, a device without scatter-gather or
/// checksum offload), not on the socket: the first sockets' completions decide for every
/// socket to that peer, and one re-probe per route (not per socket) checks it again.
#[derive(Debug)]
pub(super) struct Route {
    pub(super) ip: IpAddr,
    pub(super) watch: CopiedWatch,
    pub(super) socks: u32,
}

/// The ring's routes: found by address when a socket is added, by index (kept in the
/// socket's `Auto`) on every send and completion, so the per-send path hashes nothing.
#[derive(Debug, Default)]
pub(super) struct Routes {
    by_ip: HashMap<IpAddr, u32>,
    slots: Vec<Option<Route>>,
    free: Vec<u32>,
}

impl Routes {
    /// One more socket to `ip`: its route's index (a new route watches with `cfg`'s rules).
    fn join(&mut self, ip: IpAddr, cfg: &SenderConfig) -> u32 {
        let id = match self.by_ip.get(&ip) {
            Some(&id) => id,
            None => {
                let r = Route {
                    ip,
                    watch: CopiedWatch::new(cfg.copied_streak, cfg.reprobe_every),
                    socks: 0,
                };
                let id = match self.free.pop() {
                    Some(id) => {
                        self.slots[id as usize] = Some(r);
                        id
                    }
                    None => {
                        self.slots.push(Some(r));
                        (self.slots.len() - 1) as u32
                    }
                };
                self.by_ip.insert(ip, id);
                id
            }
        };
        self.get_mut(id).socks += 1;
        id
    }

    /// A socket of route `id` has gone (`probe_out`: with the route's re-probe in flight);
    /// the route goes with its last socket.
    fn leave(&mut self, id: u32, probe_out: bool) {
        let r = self.get_mut(id);
        if probe_out {
            r.watch.probe_lost();
        }
        r.socks -= 1;
        if r.socks == 0 {
            let ip = r.ip;
            self.slots[id as usize] = None;
            self.by_ip.remove(&ip);
            self.free.push(id);
        }
    }

    fn get_mut(&mut self, id: u32) -> &mut Route {
        self.slots[id as usize]
            .as_mut()
            .expect("a route lives while its sockets do")
    }
}

fn route_path(p: Path) -> stats::Path {
    stats::Path::Tx(p)
}

impl SendRing {
    /// A send ring. Without io_uring (an old kernel, a seccomp filter, the
    /// `kernel.io_uring_disabled` sysctl, no memory for the ring) it still works, by
    /// `MSG_ZEROCOPY` and copy, and every socket added records why.
    pub fn new(cfg: &SendRingConfig) -> Result<Self, TxError> {
        let mut fallbacks = Vec::new();
        let (uring, no_uring) = match Uring::new(cfg) {
            Ok((u, notes)) => {
                fallbacks.extend(notes);
                (Some(u), None)
            }
            Err(why) => {
                fallbacks.push(Fallback::new(
                    stats::Path::setting("io_uring send ring"),
                    stats::Path::setting("syscall sends"),
                    why.clone(),
                ));
                (None, Some(why))
            }
        };
        Ok(Self::build(uring, no_uring, fallbacks, cfg))
    }

    /// A send ring on `rx`'s io_uring: receive and send of a thread on one ring, so one
    /// `io_uring_enter` submits the receiver's re-arms and the sends of every socket and
    /// collects both sides' completions (whichever side harvests keeps the other side's
    /// completions for it). [`SendRing::prepare`] queues sends for the receiver's next wait
    /// to submit; [`SendRing::harvest`] reads them back without a syscall. A receiver without
    /// io_uring (the plain backend) has no ring to share: the send ring then has its own, and
    /// records why.
    pub fn on_receiver(rx: &crate::rx::Receiver, cfg: &SendRingConfig) -> Result<Self, TxError> {
        match rx.send_core() {
            Some(core) => {
                let (u, notes) = Uring::on(core, cfg);
                Ok(Self::build(Some(u), None, notes, cfg))
            }
            None => {
                let mut r = Self::new(cfg)?;
                r.fallbacks.push(Fallback::new(
                    stats::Path::setting("one ring with the receiver"),
                    stats::Path::setting("a ring of its own"),
                    format!(
                        "the receiver has no io_uring to share (its path is {}: epoll and \
                         recv(2))",
                        rx.path()
                    ),
                ));
                Ok(r)
            }
        }
    }

    fn build(
        uring: Option<Uring>,
        no_uring: Option<String>,
        fallbacks: Vec<Fallback>,
        cfg: &SendRingConfig,
    ) -> Self {
        Self {
            uring,
            no_uring,
            socks: Vec::new(),
            gens: Vec::new(),
            free: Vec::new(),
            next_ticket: 0,
            ready: VecDeque::new(),
            writable: VecDeque::new(),
            writable_events: 0,
            policy: AutoPolicy::new(4, 4096, true),
            routes: Routes::default(),
            cfg: cfg.clone(),
            fallbacks,
            pool_error: None,
            gone: Default::default(),
            own: Default::default(),
            readiness: None,
            stalled: Vec::new(),
            _one_thread: std::marker::PhantomData,
        }
    }

    /// A send ring without io_uring: every socket sends by syscalls (`MSG_ZEROCOPY`, copy).
    /// For a [`Sender`](super::Sender) whose mode needs no ring.
    pub(crate) fn without_uring(cfg: &SendRingConfig) -> Self {
        Self::build(
            None,
            Some("no io_uring was asked for".into()),
            Vec::new(),
            cfg,
        )
    }

    /// Whether the ring is shared with a receiver ([`SendRing::on_receiver`]).
    pub fn shares_receiver_ring(&self) -> bool {
        self.uring.as_ref().is_some_and(|u| u.lr.is_shared())
    }

    /// Queues the requests of every socket that may go in the submission queue without
    /// entering the kernel: on a ring shared with a receiver, the receiver's next wait
    /// submits them (one `io_uring_enter` for both sides). On a ring of its own, the next
    /// [`SendRing::submit`], poll or wait does.
    pub fn prepare(&mut self) {
        self.ring_prepare();
    }

    /// Registers `pool` with the ring, once for every socket: sends of its buffers on the
    /// zero-copy paths then use fixed buffers (no page pinning per send). Up to 16 pools.
    /// A failure (`ENOMEM`: `RLIMIT_MEMLOCK` is exhausted) is recorded as a fallback; the
    /// sockets added later record it too, and their sends pin pages per send instead.
    pub fn register_pool(&mut self, pool: &Pool) -> Result<(), TxError> {
        let Some(u) = self.uring.as_mut() else {
            let why = self.no_uring.clone().unwrap_or_default();
            return Err(TxError::Ring(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("no io_uring to register the pool with: {why}"),
            )));
        };
        match u.lr.register_pool(pool) {
            Ok(()) => {
                self.pool_error = None;
                Ok(())
            }
            Err(e) => {
                let why = explain_register(&e, pool.region_len());
                self.fallbacks.push(Fallback::new(
                    Path::UringZcFixed,
                    Path::UringZc,
                    why.clone(),
                ));
                self.pool_error = Some(why.clone());
                Err(TxError::Register {
                    reason: why,
                    source: e,
                })
            }
        }
    }

    /// Whether a pool is registered (fixed buffers).
    pub fn has_registered_pool(&self) -> bool {
        self.uring.as_ref().is_some_and(|u| u.lr.has_any_pool())
    }

    /// Adds a connected TCP or UDP socket (IPv4 or IPv6; other stream or datagram sockets go
    /// by copy with a recorded reason) with `cfg` (its `submit_batch` is the ring's). The
    /// socket is closed when it is closed here ([`SendRing::close`]) or the ring is dropped.
    pub fn add(&mut self, sock: impl Into<OwnedFd>, cfg: &SenderConfig) -> Result<SockId, TxError> {
        let fd: OwnedFd = sock.into();
        let shape = sock::inspect(&fd, cfg)?;
        let fd = Arc::new(fd);
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.socks.push(None);
                self.gens.push(0);
                (self.socks.len() - 1) as u32
            }
        };
        self.gens[idx as usize] = self.gens[idx as usize].wrapping_add(1);
        let gen = self.gens[idx as usize];
        let mut s = Sock::new(fd, gen, &shape, cfg);
        s.path = if cfg.mode == TxMode::Auto && !shape.ip {
            let to = self.ring_copy_path();
            s.fall_back_from(
                TxMode::Auto,
                to,
                "not an AF_INET/AF_INET6 socket: zero-copy send needs TCP or UDP (SEND_ZC \
                 answers EOPNOTSUPP, SO_ZEROCOPY is refused)",
            );
            to
        } else {
            self.choose(&mut s)
        };
        if cfg.mode == TxMode::Auto {
            let zc = s.path.is_zero_copy().then_some(s.path);
            // The peer's address names the route; a socket without one (unconnected UDP) or
            // whose peer cannot be read watches its own completions.
            let route = if zc.is_some() {
                sys::net::peer_ip(&*s.fd).ok().flatten()
            } else {
                None
            };
            let route = route.map(|ip| self.routes.join(ip, cfg));
            let watch = match route {
                Some(_) => None,
                None => Some(CopiedWatch::new(cfg.copied_streak, cfg.reprobe_every)),
            };
            s.auto = Some(Box::new(Auto {
                zc,
                route,
                watch,
                probe: None,
                in_copy: false,
                noted: false,
            }));
        }
        if s.path.is_uring() {
            self.attach(idx, &mut s);
        }
        if s.msg.is_some() {
            // The error queue's wake-ups, for the readiness descriptor and the waits.
            self.watch_socket(idx, &mut s, false);
        }
        self.socks[idx as usize] = Some(s);
        Ok(SockId { idx, gen })
    }

    /// The copy path of a socket added to this ring without zero-copy.
    fn ring_copy_path(&self) -> Path {
        if self.uring.is_some() {
            Path::UringCopy
        } else {
            Path::Copy
        }
    }

    /// The path a new socket starts on, every step down recorded.
    fn choose(&mut self, s: &mut Sock) -> Path {
        let want = s.cfg.mode;
        match want {
            TxMode::Copy => return Path::Copy,
            TxMode::UringCopy => {
                if self.uring.is_some() {
                    return Path::UringCopy;
                }
                let why = self.no_uring.clone().unwrap_or_default();
                s.fall_back_from(want, Path::Copy, why);
                return Path::Copy;
            }
            TxMode::MsgZc => return self.msg_or_copy(s, want.into()),
            TxMode::UringZc | TxMode::UringZcFixed | TxMode::Auto => {}
        }
        let from: stats::Path = want.into();
        let Some(u) = self.uring.as_ref() else {
            let why = self.no_uring.clone().unwrap_or_default();
            s.fallbacks.push(Fallback::new(from, Path::MsgZc, why));
            return self.msg_or_copy(s, Path::MsgZc.into());
        };
        match &u.send_zc {
            Ok(true) => {}
            Ok(false) => {
                s.fallbacks.push(Fallback::new(
                    from,
                    Path::MsgZc,
                    "kernel lacks IORING_OP_SEND_ZC (needs Linux 6.0)",
                ));
                return self.msg_or_copy(s, Path::MsgZc.into());
            }
            Err(e) => {
                s.fallbacks.push(Fallback::new(
                    from,
                    Path::MsgZc,
                    format!("IORING_REGISTER_PROBE failed: {e}"),
                ));
                return self.msg_or_copy(s, Path::MsgZc.into());
            }
        }
        if want == TxMode::Auto && !u.report_usage {
            // Auto's copy detection needs the usage report; MSG_ZEROCOPY has it.
            s.fallbacks.push(Fallback::new(
                from,
                Path::MsgZc,
                format!(
                    "{}; Auto needs to know when zero-copy was copied, which MSG_ZEROCOPY \
                     completions say",
                    crate::ring::features::Features::get()
                        .why_not(crate::ring::features::Features::SEND_ZC_REPORT_USAGE)
                        .unwrap_or_default()
                ),
            ));
            return self.msg_or_copy(s, Path::MsgZc.into());
        }
        if matches!(want, TxMode::UringZcFixed | TxMode::Auto) {
            if u.lr.has_any_pool() {
                return Path::UringZcFixed;
            }
            let why = match &self.pool_error {
                Some(e) => e.clone(),
                None => "no pool is registered with the ring (SendRing::register_pool): \
                         buffers are pinned per send"
                    .to_string(),
            };
            // Auto without a pool is a choice of the caller, not a fallback.
            if want == TxMode::UringZcFixed || self.pool_error.is_some() {
                s.fallbacks
                    .push(Fallback::new(Path::UringZcFixed, Path::UringZc, why));
            }
        }
        Path::UringZc
    }

    /// `MSG_ZEROCOPY`, else copy (recorded).
    fn msg_or_copy(&mut self, s: &mut Sock, from: stats::Path) -> Path {
        match MsgZc::new(s.fd.clone(), s.stream, s.chunk, s.cfg.notify_limit) {
            Ok(m) => {
                s.msg = Some(Box::new(m));
                Path::MsgZc
            }
            Err(reason) => {
                s.fallbacks.push(Fallback::new(from, Path::Copy, reason));
                Path::Copy
            }
        }
    }

    fn sock_ref(&self, id: SockId) -> Option<&Sock> {
        self.socks
            .get(id.idx as usize)
            .and_then(Option::as_ref)
            .filter(|s| s.gen == id.gen)
    }

    fn sock_mut(&mut self, id: SockId) -> Option<&mut Sock> {
        self.socks
            .get_mut(id.idx as usize)
            .and_then(Option::as_mut)
            .filter(|s| s.gen == id.gen)
    }

    pub(super) fn sock_at(&mut self, idx: u32) -> Option<&mut Sock> {
        self.socks.get_mut(idx as usize).and_then(Option::as_mut)
    }

    // ---- sending ----

    /// Sends `buf` on `sock`. The buffer comes back with its [`Completion`] from
    /// [`SendRing::next_completion`]; errors of the send are in the completion. Never waits:
    /// a send that cannot be queued now comes back as [`Refused`] with the buffer (see
    /// [`Refusal`]), and the socket is reported by [`SendRing::next_writable`] when it can
    /// take one again.
    pub fn send(&mut self, sock: SockId, buf: impl Into<TxBuf>) -> Result<Ticket, Refused<TxBuf>> {
        self.send_with(sock, buf, 0)
    }

    /// [`SendRing::send`] with a token of the caller's, returned in the completion (e.g.
    /// the connection a forwarded chunk came from).
    pub fn send_with(
        &mut self,
        id: SockId,
        buf: impl Into<TxBuf>,
        token: u64,
    ) -> Result<Ticket, Refused<TxBuf>> {
        self.send_inner(id, buf.into(), token, None)
    }

    /// Sends the slices as one request (a vectored send): a small header (a
    /// [`TxBuf::Vec`] carried with the request, or a pool buffer) and one or more pool
    /// buffers or received chunks, at most [`MAX_SLICES`]. On the ring a zero-copy send goes
    /// as `SEND_ZC` with `IORING_SEND_VECTORIZED` (Linux 6.17; from a registered pool when
    /// every slice is in it) or, before 6.17, `SENDMSG_ZC` with an iovec (each step down
    /// recorded in [`SendRing::sock_fallbacks`]); a copy as `SENDMSG`. Without io_uring the
    /// slices are gathered into one buffer first (recorded). The completion hands back
    /// [`TxBuf::Slices`], every slice once, in order, after the kernel's last reference to
    /// any of them. On a UDP socket the slices are one datagram (or GSO train); with
    /// [`SendRing::send_to_with`] and a [`TxBuf::Slices`] they go to a destination.
    pub fn send_vectored(
        &mut self,
        sock: SockId,
        slices: Vec<TxBuf>,
        token: u64,
    ) -> Result<Ticket, Refused<TxBuf>> {
        self.send_inner(sock, TxBuf::Slices(slices), token, None)
    }

    /// Sends `buf` on an unconnected UDP socket to `dest`, cut into datagrams of `segment`
    /// bytes when given (GSO): one `IORING_OP_SENDMSG_ZC` with the destination in the message
    /// header and `UDP_SEGMENT` as a control message. See [`SendRing::send_to_with`].
    pub fn send_to(
        &mut self,
        sock: SockId,
        buf: impl Into<TxBuf>,
        dest: std::net::SocketAddr,
        segment: Option<u16>,
    ) -> Result<Ticket, Refused<TxBuf>> {
        let d = Dest {
            addr: dest,
            segment,
            tos: None,
        };
        self.send_to_with(sock, buf, &d, 0)
    }

    /// Sends `buf` as one datagram train to `dest` (its peer, GSO segment size and TOS/ECN)
    /// on a UDP socket, with a token returned in the completion. Many peers, one socket: each
    /// send is its own message, and many of them go to the kernel in one `io_uring_enter`.
    ///
    /// Paths, best first (each step down recorded in [`SendRing::sock_fallbacks`]):
    /// `SENDMSG_ZC` on the ring (from a registered pool where the kernel takes registered
    /// buffers for it, Linux 6.15), `sendmsg(MSG_ZEROCOPY)` with the same control messages,
    /// `sendmsg` by copy (`SENDMSG` on the ring for `uring-copy`). The completion says how
    /// many bytes went, whether the kernel copied, and the error: a send the kernel refuses
    /// (an unreachable destination, `ENETUNREACH`; a segment larger than the path MTU,
    /// `EINVAL`) fails alone, and the socket goes on. A buffer longer than one UDP datagram
    /// (65,507 bytes over IPv4) fails with [`SendError::MessageTooBig`], one cut into more
    /// than [`MAX_SEGMENTS`] segments, a segment size of 0 or an IPv6 destination on an IPv4
    /// socket with [`SendError::Invalid`], without a syscall.
    pub fn send_to_with(
        &mut self,
        sock: SockId,
        buf: impl Into<TxBuf>,
        dest: &Dest,
        token: u64,
    ) -> Result<Ticket, Refused<TxBuf>> {
        self.send_inner(sock, buf.into(), token, Some(*dest))
    }

    /// Why a send to `dest` cannot be made on socket `s` (before any syscall).
    fn check_dest(s: &Sock, dest: &Dest, len: usize) -> Option<SendError> {
        let invalid = |errno, reason: String| Some(SendError::Invalid { errno, reason });
        if s.stream {
            return invalid(
                libc::EISCONN,
                "a destination on a stream socket: send_to is for UDP sockets (use send)".into(),
            );
        }
        if dest.addr.is_ipv6() && !s.v6 {
            return invalid(
                libc::EAFNOSUPPORT,
                format!(
                    "IPv6 destination {} on an IPv4 socket: bind an AF_INET6 socket to reach \
                     IPv6 peers",
                    dest.addr
                ),
            );
        }
        // One request: at most one datagram, and (on a connected socket with socket-wide GSO)
        // at most the train its core would otherwise cut the buffer into.
        let max = s.max_datagram.min(s.chunk);
        if len > max {
            return Some(SendError::MessageTooBig { len, max });
        }
        match dest.segment {
            Some(0) => invalid(libc::EINVAL, "a GSO segment size of 0".into()),
            Some(seg) if len.div_ceil(usize::from(seg)) > MAX_SEGMENTS => invalid(
                libc::EINVAL,
                format!(
                    "{len} bytes in segments of {seg} are {} datagrams, more than the {} one \
                     GSO send may carry: send smaller trains or larger segments",
                    len.div_ceil(usize::from(seg)),
                    MAX_SEGMENTS
                ),
            ),
            _ => None,
        }
    }

    fn send_inner(
        &mut self,
        id: SockId,
        buf: TxBuf,
        token: u64,
        dest: Option<Dest>,
    ) -> Result<Ticket, Refused<TxBuf>> {
        let idx = id.idx;
        let Some(s) = self.sock_mut(id) else {
            return Err(Refused {
                buf,
                reason: Refusal::Closed,
            });
        };
        if let Some(reason) = s.refusal() {
            match reason {
                Refusal::Depth => s.stats.depth_refusals += 1,
                Refusal::SocketFull | Refusal::NoRoom => s.stats.full_refusals += 1,
                Refusal::Closed => {}
            }
            if reason.is_backpressure() {
                s.refused = true;
            }
            return Err(Refused { buf, reason });
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let s = self.sock_at(idx).expect("checked");
        let seq = s.seq;
        s.seq += 1;
        s.counters.ops += 1;
        let len = buf.len();
        let (mut lent, mut more, chunk, mut parts, bad_slices) = split_slices(buf);
        let opts = dest.map(|d| d.opts());
        let meta = |path, parts| Meta {
            ticket,
            len,
            path,
            token,
            chunk,
            dest: opts,
            parts,
        };
        let bad = match &dest {
            _ if bad_slices.is_some() => bad_slices,
            Some(d) => Self::check_dest(s, d, len),
            None if s.unconnected => Some(SendError::Invalid {
                errno: libc::EDESTADDRREQ,
                reason: "the UDP socket has no peer: name one per send with send_to, or \
                         connect the socket"
                    .into(),
            }),
            None => None,
        };
        let vectored = !more.is_empty();
        let bad = bad.or_else(|| {
            // A vectored datagram is one request: one datagram or GSO train.
            (vectored && !s.stream && dest.is_none() && len > s.chunk.min(s.max_datagram))
                .then_some(SendError::MessageTooBig {
                    len,
                    max: s.chunk.min(s.max_datagram),
                })
        });
        if let Some(e) = bad {
            s.meta.insert(seq, meta(Path::Copy, parts));
            self.finish_parts(idx, seq, lent, more, 0, Some(e), ZcStatus::NotAttempted);
            return Ok(Ticket(ticket));
        }
        if let Some(errno) = s.broken {
            // The ring failed with requests of unknown outcome ahead of this one.
            s.meta.insert(seq, meta(Path::Copy, parts));
            self.finish_parts(
                idx,
                seq,
                lent,
                more,
                0,
                Some(SendError::Os { errno }),
                ZcStatus::NotAttempted,
            );
            return Ok(Ticket(ticket));
        }
        if len == 0 {
            // Nothing to lend: TCP needs no call, UDP sends an empty datagram.
            s.meta.insert(seq, meta(Path::Copy, parts));
            let mut error = None;
            if !s.stream {
                let out = match &opts {
                    Some(o) => copy::send_msg(&*s.fd, &[], o, s.v6, false),
                    None => copy::send_nb(&*s.fd, &[], 1, 0),
                };
                s.counters.syscalls += out.syscalls;
                s.stats.send_syscalls += out.syscalls;
                error = out
                    .error
                    .or(out.would_block.then_some(libc::EAGAIN))
                    .map(SendError::from_errno);
            }
            self.finish_parts(idx, seq, lent, more, 0, error, ZcStatus::NotAttempted);
            return Ok(Ticket(ticket));
        }
        if !s.stream && s.chunk == usize::MAX && len > s.max_datagram {
            let e = SendError::MessageTooBig {
                len,
                max: s.max_datagram,
            };
            s.meta.insert(seq, meta(Path::Copy, parts));
            self.finish_parts(idx, seq, lent, more, 0, Some(e), ZcStatus::NotAttempted);
            return Ok(Ticket(ticket));
        }
        let path = self.route(idx, seq, len);
        let no_uring = self.no_uring.clone();
        let s = self.sock_at(idx).expect("checked");
        if vectored && !path.is_uring() {
            // Without io_uring the slices are gathered into one buffer (a copy) and that goes
            // by the socket's path; the slices come back with the completion.
            if !s.vec_noted {
                s.vec_noted = true;
                s.fallbacks.push(Fallback::new(
                    stats::Path::setting("vectored send as one request"),
                    stats::Path::setting("slices gathered into one buffer"),
                    format!(
                        "the socket sends by {path} ({}); a vectored send's slices are copied \
                         into one buffer first",
                        no_uring.as_deref().unwrap_or("not on the io_uring")
                    ),
                ));
            }
            let mut v = Vec::with_capacity(len);
            v.extend_from_slice(&lent);
            for b in &more {
                v.extend_from_slice(b);
            }
            let first = std::mem::replace(&mut lent, Lent::Vec(v));
            let p = parts.get_or_insert_with(Default::default);
            p.gathered_from.push(first);
            p.gathered_from.append(&mut more);
        }
        s.meta.insert(seq, meta(path, parts));
        match path {
            Path::Copy => self.copy_send(idx, seq, lent, opts),
            Path::MsgZc => {
                let s = self.sock_at(idx).expect("checked");
                let v6 = s.v6;
                let m = s.msg.as_mut().expect("msg-zc backend");
                m.send(seq, lent, opts.map(|o| (o, v6)));
                let stalled = m.stall().is_some();
                if stalled {
                    self.stall(idx);
                }
                self.collect_msg(idx);
            }
            Path::UringZc | Path::UringZcFixed | Path::UringCopy => {
                self.ring_stage(idx, seq, lent, more, len, path, opts);
                if self.uring.as_ref().is_some_and(|u| u.due(&self.cfg)) {
                    let res = self.ring_submit();
                    if let Err(e) = res {
                        self.ring_failed(e);
                    }
                }
            }
        }
        Ok(Ticket(ticket))
    }

    /// The path of one send (`auto` decides per send).
    fn route(&mut self, idx: u32, seq: u64, len: usize) -> Path {
        let Self {
            policy,
            socks,
            routes,
            ..
        } = self;
        let s = socks[idx as usize].as_mut().expect("live");
        if !s.is_auto() {
            return s.path;
        }
        let copy = s.copy_path();
        let Some(a) = s.auto.as_mut() else {
            return copy;
        };
        let Some(zc) = a.zc else {
            return copy;
        };
        let (watch, peer) = watch_of(routes, a.route, &mut a.watch);
        let d = match watch.decide() {
            Some(d) => d,
            None => {
                let d = policy.decide_size(len);
                if d.clock {
                    policy.clock(sys::thread_cpu_time().as_nanos() as u64);
                }
                d
            }
        };
        let in_copy = watch.in_copy();
        let interval = watch.interval();
        if d.probe {
            a.probe = Some(seq);
            s.stats.auto_reprobes += 1;
        }
        if in_copy != a.in_copy {
            // The route's verdict changed since this socket last sent (other sockets'
            // completions found it): the socket follows without probing.
            if in_copy {
                s.stats.auto_route_verdicts += 1;
            }
            follow_verdict(s, in_copy, copy, interval, None, peer);
        }
        match d.choice {
            Choice::Copy => {
                if !in_copy {
                    s.stats.auto_size_copies += 1;
                }
                copy
            }
            Choice::ZeroCopy => zc,
        }
    }

    /// A copy send by syscall: as much as the socket takes now; the rest when it is
    /// writable.
    fn copy_send(&mut self, idx: u32, seq: u64, lent: Lent, dest: Option<MsgOpts>) {
        let s = self.socks[idx as usize].as_mut().expect("live");
        let out = match &dest {
            Some(o) => copy::send_msg(&*s.fd, &lent, o, s.v6, false),
            None => copy::send_nb(&*s.fd, &lent, s.chunk, 0),
        };
        s.counters.syscalls += out.syscalls;
        s.stats.send_syscalls += out.syscalls;
        if out.would_block && out.error.is_none() {
            s.pending = Some(Pending {
                seq,
                buf: lent,
                sent: out.bytes,
                dest,
            });
            self.stall(idx);
            return;
        }
        let error = out.error.map(SendError::from_errno);
        self.finish(idx, seq, lent, out.bytes, error, ZcStatus::NotAttempted);
    }

    /// Continues a copy send the socket buffer could not take in full.
    fn continue_copy(&mut self, idx: u32) {
        let Some(s) = self.sock_at(idx) else { return };
        let Some(mut p) = s.pending.take() else {
            return;
        };
        let out = match &p.dest {
            Some(o) => copy::send_msg(&*s.fd, &p.buf, o, s.v6, false),
            None => copy::send_nb(&*s.fd, &p.buf, s.chunk, p.sent),
        };
        s.counters.syscalls += out.syscalls;
        s.stats.send_syscalls += out.syscalls;
        p.sent += out.bytes;
        if out.would_block && out.error.is_none() {
            s.pending = Some(p);
            return;
        }
        let error = out.error.map(SendError::from_errno);
        let Pending { seq, buf, sent, .. } = p;
        self.finish(idx, seq, buf, sent, error, ZcStatus::NotAttempted);
    }

    /// A syscall-path socket waits for its socket: into the readiness set (writable).
    fn stall(&mut self, idx: u32) {
        if !self.stalled.contains(&idx) {
            self.stalled.push(idx);
        }
        let Some(mut s) = self.socks[idx as usize].take() else {
            return;
        };
        self.watch_socket(idx, &mut s, true);
        self.socks[idx as usize] = Some(s);
    }

    /// Puts a syscall-path socket into the readiness set (creating it): its error queue
    /// always, `EPOLLOUT` while `out`.
    fn watch_socket(&mut self, idx: u32, s: &mut Sock, out: bool) {
        if self.readiness.is_none() && !out {
            // Created on first use of the descriptor or first stall; `sync_readiness` adds
            // the sockets then.
            return;
        }
        if self.sync_readiness_set().is_err() {
            return;
        }
        let rd = self.readiness.as_ref().expect("created");
        let ev = if out { libc::EPOLLOUT as u32 } else { 0 };
        let res = if s.in_epoll {
            rd.set.modify_edge(s.fd.as_raw_fd(), ev, u64::from(idx))
        } else {
            rd.set.add_edge_token(s.fd.as_raw_fd(), ev, u64::from(idx))
        };
        if res.is_ok() {
            s.in_epoll = true;
            s.counters.syscalls += 1;
            s.stats.notify_syscalls += 1;
        }
    }

    /// Makes progress on the syscall-path sockets that wait for their socket: continues
    /// copy sends, reaps error queues, makes the calls that may go.
    fn pump_stalled(&mut self) {
        let list = std::mem::take(&mut self.stalled);
        for idx in list {
            let Some(s) = self.sock_at(idx) else { continue };
            if s.pending.is_some() {
                self.continue_copy(idx);
            }
            let s = self.sock_at(idx).expect("live");
            if let Some(m) = s.msg.as_mut() {
                m.reap();
                if m.stall() == Some(Stall::Full) {
                    m.on_writable();
                }
            }
            self.collect_msg(idx);
            let Some(s) = self.sock_at(idx) else { continue };
            let still = s.pending.is_some() || s.msg.as_ref().is_some_and(|m| m.stall().is_some());
            if still {
                self.stalled.push(idx);
            } else if s.in_epoll && s.msg.is_none() {
                // Writable again: stop asking for EPOLLOUT edges.
                let fd = s.fd.as_raw_fd();
                if let Some(rd) = &self.readiness {
                    let _ = rd.set.modify_edge(fd, 0, u64::from(idx));
                }
            }
        }
    }

    /// Moves finished `MSG_ZEROCOPY` sends of a socket to the ready list.
    pub(super) fn collect_msg(&mut self, idx: u32) {
        loop {
            let Some(s) = self.sock_at(idx) else { return };
            let Some(m) = s.msg.as_mut() else { return };
            let Some(d) = m.next_done() else { break };
            s.counters.notifications += u64::from(d.ranges_zc + d.ranges_copied);
            let status = status_of(d.ranges_zc, d.ranges_copied, 0);
            let error = d.error.map(SendError::from_errno);
            let bytes = d.zc_bytes + d.copy_bytes;
            let zc_bytes = d.zc_bytes;
            count_zc(&mut s.counters, status, zc_bytes);
            self.finish(idx, d.tag, d.buf, bytes, error, status);
        }
        let Some(s) = self.sock_at(idx) else { return };
        if let Some(st) = s.msg.as_ref().map(|m| m.stats.clone()) {
            // The backend keeps totals: count what is new since the last look.
            let seen = &s.msg_seen;
            let ds = st.send_calls - seen.send_calls;
            let dn = st.notify_calls - seen.notify_calls;
            s.counters.syscalls += ds + dn;
            s.stats.send_syscalls += ds;
            s.stats.notify_syscalls += dn;
            s.stats.room_waits += st.enobufs_waits - seen.enobufs_waits;
            s.stats.room_copies += st.enobufs_copies - seen.enobufs_copies;
            s.stats.unmatched_notifications = st.unknown_ids;
            s.stats.queued_errors = st.queued_errors;
            s.msg_seen = st;
        }
        self.settle_sock(idx);
    }

    /// A send is done: its completion (and buffer) goes to the ready list.
    pub(super) fn finish(
        &mut self,
        idx: u32,
        seq: u64,
        lent: Lent,
        bytes: usize,
        error: Option<SendError>,
        status: ZcStatus,
    ) {
        self.finish_parts(idx, seq, lent, Vec::new(), bytes, error, status);
    }

    /// [`SendRing::finish`] of a send whose slices after the first are `more`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_parts(
        &mut self,
        idx: u32,
        seq: u64,
        lent: Lent,
        more: Vec<Lent>,
        bytes: usize,
        error: Option<SendError>,
        status: ZcStatus,
    ) {
        let s = self.socks[idx as usize].as_mut().expect("live");
        let meta = s.meta.remove(seq).unwrap_or(Meta {
            ticket: u64::MAX,
            len: lent.len(),
            path: s.path,
            token: 0,
            chunk: None,
            dest: None,
            parts: None,
        });
        s.counters.bytes += bytes as u64;
        s.stats.sends_by_path[meta.path.index()] += 1;
        let error = match error {
            // EMSGSIZE from the kernel (no sizes): say what was sent and the limit.
            Some(SendError::MessageTooBig { len: 0, max: 0 }) => Some(SendError::MessageTooBig {
                len: meta.len,
                max: s.max_datagram,
            }),
            e => e,
        };
        let sock = SockId { idx, gen: s.gen };
        let done = Completion {
            ticket: Ticket(meta.ticket),
            sock,
            token: meta.token,
            len: meta.len,
            bytes,
            path: meta.path,
            zerocopy: status,
            error,
        };
        if meta.path.is_zero_copy() {
            self.observe(idx, seq, status);
        }
        let discard = self.socks[idx as usize].as_ref().is_some_and(|s| s.discard);
        if discard {
            // Its owner has gone: the buffer goes back to its pool or receiver now.
            drop(lent);
            drop(more);
            drop(meta.parts);
            return;
        }
        let buf = match meta.parts {
            None => TxBuf::from_lent(lent, meta.chunk),
            Some(p) => {
                let Parts {
                    chunks,
                    gathered_from,
                } = *p;
                let lents: Vec<Lent> = if gathered_from.is_empty() {
                    std::iter::once(lent).chain(more).collect()
                } else {
                    // The gathered copy goes; the slices come back.
                    drop(lent);
                    gathered_from
                };
                TxBuf::Slices(
                    lents
                        .into_iter()
                        .zip(chunks)
                        .map(|(l, c)| TxBuf::from_lent(l, c))
                        .collect(),
                )
            }
        };
        self.ready.push_back((done, buf));
    }

    /// `auto` learns from a zero-copy completion of one of its sockets (for the socket's
    /// route: every socket to the same peer follows at its next send).
    fn observe(&mut self, idx: u32, seq: u64, status: ZcStatus) {
        let Self { socks, routes, .. } = self;
        let s = socks[idx as usize].as_mut().expect("live");
        let copy = s.copy_path();
        let Some(a) = s.auto.as_mut() else { return };
        let probe = a.probe == Some(seq);
        if probe {
            a.probe = None;
        }
        let (watch, peer) = watch_of(routes, a.route, &mut a.watch);
        match watch.observe(status, probe) {
            Some(Event::SwitchedToCopy { streak, interval }) => {
                s.stats.auto_switches_to_copy += 1;
                follow_verdict(s, true, copy, interval, Some(streak), peer);
            }
            Some(Event::SwitchedBack) => {
                s.stats.auto_switches_back += 1;
                follow_verdict(s, false, copy, 0, None, peer);
            }
            None => {}
        }
    }

    /// After progress on a socket: a refused one that can take sends again is reported
    /// writable; a closing one with nothing left is freed.
    pub(super) fn settle_sock(&mut self, idx: u32) {
        let Some(s) = self.sock_at(idx) else { return };
        if s.closing {
            if s.in_flight() == 0 {
                self.free_sock(idx);
            }
            return;
        }
        if s.refused && s.refusal().is_none() {
            s.refused = false;
            // Queued once until taken: a caller that never asks (a `Sender`) does not grow
            // the queue past one entry per socket.
            let queue = !std::mem::replace(&mut s.queued_writable, true);
            let id = SockId { idx, gen: s.gen };
            self.writable_events += 1;
            if queue {
                self.writable.push_back(id);
            }
        }
    }

    fn free_sock(&mut self, idx: u32) {
        let Some(s) = self.socks[idx as usize].take() else {
            return;
        };
        if let Some((id, probe)) = s.auto.as_ref().and_then(|a| a.route.map(|r| (r, a.probe))) {
            self.routes.leave(id, probe.is_some());
        }
        add_counters(&mut self.gone.0, &s.counters);
        self.gone.1.add(&s.stats);
        if s.in_epoll {
            if let Some(rd) = &self.readiness {
                let _ = rd.set.remove(s.fd.as_raw_fd());
            }
        }
        if let (Some(u), Some(f)) = (self.uring.as_mut(), s.file) {
            u.lr.remove_file(f);
        }
        self.stalled.retain(|&i| i != idx);
        if s.queued_writable {
            self.writable.retain(|w| w.idx != idx);
        }
        self.free.push(idx);
    }

    /// Closes a socket: new sends are refused ([`Refusal::Closed`]); sends not yet handed to
    /// the kernel complete with [`SendError::Closed`], those in the kernel are cancelled (a
    /// send the kernel already started may complete partly). Every buffer still comes back
    /// with its completion. The descriptor is closed once no request names it. For a graceful
    /// end, wait until [`SendRing::sock_in_flight`] is 0 first.
    pub fn close(&mut self, id: SockId) {
        let idx = id.idx;
        let Some(s) = self.sock_mut(id) else { return };
        if s.closing {
            return;
        }
        s.closing = true;
        s.refused = false;
        if let Some(m) = s.msg.as_mut() {
            if m.in_flight() > 0 && s.stream {
                // The kernel holds our pages in the socket's write queue: reset the
                // connection now so it frees them (and notifies) while the descriptor is ours.
                let _ = sys::net::set_linger_zero(&*s.fd);
                let _ = sys::net::disconnect(&*s.fd);
            }
            m.fail(libc::ECANCELED);
        }
        if s.tracker.is_some() {
            self.ring_close(idx);
        }
        if let Some(p) = self.sock_at(idx).and_then(|s| s.pending.take()) {
            let err = Some(SendError::Closed);
            self.finish(idx, p.seq, p.buf, p.sent, err, ZcStatus::NotAttempted);
        }
        self.collect_msg(idx);
        self.settle_sock(idx);
    }

    /// Shuts `sock`'s connection down (`shutdown(2)`): with `Write` or `Both` the peer reads
    /// its end of stream after the bytes already in the socket. Sends of `sock` still in
    /// flight may not be in the socket yet (and fail with `EPIPE` once it is shut): wait
    /// until [`SendRing::sock_in_flight`] is 0 first, as [`Sender::shutdown`](super::Sender::shutdown)
    /// and the tokio adapters do. The socket stays on the ring until [`SendRing::close`].
    pub fn shutdown(&mut self, sock: SockId, how: std::net::Shutdown) -> Result<(), TxError> {
        let s = self.sock_ref(sock).ok_or_else(|| {
            super::sock_err(
                format!("shutdown of {sock}"),
                io::Error::from_raw_os_error(libc::EBADF),
            )
        })?;
        sys::net::shutdown(&*s.fd, how)
            .map_err(|e| super::sock_err(format!("shutdown of {sock}"), e))
    }

    /// Closes a socket whose completions the caller no longer wants (its owner has gone):
    /// as [`SendRing::close`], but the buffers of its sends are dropped (returned to their
    /// pools or receivers) once the kernel is done with them, without completions. Ready
    /// completions of the socket not yet taken are dropped too.
    pub fn abandon(&mut self, id: SockId) {
        let idx = id.idx;
        if self.sock_ref(id).is_none() {
            return;
        }
        self.ready.retain(|(c, _)| c.sock != id);
        if self
            .sock_ref(id)
            .is_some_and(|s| s.tracker.is_some() && !s.closing)
        {
            self.ring_abandon(idx);
        }
        if let Some(s) = self.sock_mut(id) {
            // Whatever is left (MSG_ZEROCOPY waits for its error queue) is dropped on arrival.
            s.discard = true;
        }
        self.close(id);
        self.ready.retain(|(c, _)| c.sock != id);
    }

    /// Submits the queued requests of every socket with one `io_uring_enter` (no syscall when
    /// nothing is queued) and collects what has completed. With nothing queued it only reads
    /// what the kernel has posted: zero-copy notifications waiting as deferred task work need
    /// [`SendRing::poll`], [`SendRing::wait`] or [`SendRing::on_ready`].
    pub fn submit(&mut self) -> Result<(), TxError> {
        if let Err(e) = self.ring_submit() {
            self.ring_failed(e);
        }
        Ok(())
    }

    /// Makes progress without blocking: submits queued io_uring requests, reaps ready
    /// completions and error queues, continues stalled sends. Returns the number of
    /// completions ready. On io_uring paths it enters the kernel only when requests are
    /// queued or the kernel flagged deferred task work while buffers are out (under
    /// `DEFER_TASKRUN` a zero-copy notification is posted only by an enter of the ring's
    /// thread): a loop that only polls sees every completion.
    pub fn poll(&mut self) -> Result<usize, TxError> {
        let res = self.ring_progress(true);
        if let Err(e) = res {
            self.ring_failed(e);
        }
        self.reap_syscall_paths();
        if self.readiness.is_some() {
            self.settle_readiness();
        }
        Ok(self.ready.len())
    }

    /// Like [`SendRing::poll`], but leaves queued io_uring requests queued until
    /// `submit_batch` of them are there: on io_uring paths it only reads completions and
    /// notifications the kernel has already posted (no syscall). Returns the number of
    /// completions ready.
    pub fn harvest(&mut self) -> Result<usize, TxError> {
        if let Err(e) = self.ring_harvest_only(false) {
            self.ring_failed(e);
        }
        self.reap_syscall_paths();
        Ok(self.ready.len())
    }

    /// Error-queue reaps and stalled copy sends of the syscall paths.
    fn reap_syscall_paths(&mut self) {
        let n = self.socks.len() as u32;
        if !self.stalled.is_empty() {
            self.pump_stalled();
        }
        for idx in 0..n {
            let Some(s) = self.sock_at(idx) else { continue };
            if let Some(m) = s.msg.as_mut() {
                if m.in_flight() > 0 {
                    m.reap();
                }
                self.collect_msg(idx);
            }
        }
    }

    /// Blocks until at least one completion is ready, nothing is in flight, a socket that was
    /// refused can take sends again ([`SendRing::next_writable`] names it), or `timeout`
    /// passes. Returns the number of completions ready.
    pub fn wait(&mut self, timeout: Duration) -> Result<usize, TxError> {
        let end = Instant::now() + timeout;
        let writable_before = self.writable_events;
        self.poll()?;
        // Buffers of abandoned sockets come back only while the ring is entered: a wait
        // with nothing else in flight drives them too.
        while self.ready.is_empty() && (self.in_flight() > 0 || self.ignored_in_kernel() > 0) {
            // A refused socket that can send again is what a caller waiting for room waits
            // for, even when sends stuck in a failed ring stay in flight for good (they are
            // reported by `flush` and `check_stuck`; the socket goes on by copy).
            if self.writable_events > writable_before {
                break;
            }
            let now = Instant::now();
            if now >= end {
                break;
            }
            self.wait_inner(end - now)?;
        }
        if self.readiness.is_some() {
            self.settle_readiness();
        }
        Ok(self.ready.len())
    }

    /// Waits until every send has completed (their completions are then ready).
    pub fn flush(&mut self, timeout: Duration) -> Result<(), TxError> {
        let t0 = Instant::now();
        let end = t0 + timeout;
        self.poll()?;
        while self.in_flight() > 0 {
            let now = Instant::now();
            if now >= end {
                return Err(TxError::Timeout {
                    in_flight: self.in_flight(),
                    waited: t0.elapsed(),
                });
            }
            self.wait_inner((end - now).min(Duration::from_millis(100)))?;
        }
        if self.readiness.is_some() {
            self.settle_readiness();
        }
        Ok(())
    }

    /// One bounded wait for progress: on the ring when only ring sends are out, on the one
    /// syscall-path socket when only it has sends out, else on the readiness set.
    fn wait_inner(&mut self, timeout: Duration) -> Result<(), TxError> {
        let timeout = timeout.min(Duration::from_millis(100));
        let ring_out = self.ring_in_flight() + self.ignored_in_kernel();
        let dead = self.uring.as_ref().is_some_and(|u| u.lr.is_dead());
        let mut sys_socks = Vec::new();
        for (i, s) in self.socks.iter().enumerate() {
            if let Some(s) = s {
                let n =
                    s.msg.as_ref().map_or(0, |m| m.in_flight()) + usize::from(s.pending.is_some());
                if n > 0 {
                    sys_socks.push(i as u32);
                }
            }
        }
        if ring_out > 0 && dead && sys_socks.is_empty() {
            // Nothing can come back from an abandoned ring: say so instead of spinning.
            return Err(self.dead_ring_error());
        }
        if sys_socks.is_empty() {
            if ring_out > 0 && !dead {
                if let Err(e) = self.ring_wait(timeout) {
                    self.ring_failed(e);
                }
            }
            return Ok(());
        }
        if ring_out == 0 || dead {
            if let [idx] = sys_socks[..] {
                let s = self.sock_at(idx).expect("live");
                if let Some(m) = s.msg.as_mut() {
                    if s.pending.is_none() {
                        m.wait(timeout);
                        self.collect_msg(idx);
                        self.settle_sock(idx);
                        return Ok(());
                    }
                }
                if s.pending.is_some() {
                    s.counters.syscalls += 1;
                    s.stats.notify_syscalls += 1;
                    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
                    let _ = sys::net::poll_one(&*s.fd, libc::POLLOUT, ms);
                    self.continue_copy(idx);
                    self.settle_sock(idx);
                    return Ok(());
                }
            }
        }
        // Several sources: the readiness set (the ring's eventfd and the sockets).
        self.sync_readiness()?;
        let rd = self.readiness.as_ref().expect("created");
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        let _ = sys::net::poll_one(&rd.set.as_fd().as_raw_fd(), libc::POLLIN, ms);
        self.own.0.syscalls += 1;
        self.own.1.notify_syscalls += 1;
        self.on_ready()?;
        Ok(())
    }

    /// Buffers of abandoned sockets the kernel still holds.
    fn ignored_in_kernel(&self) -> usize {
        self.uring
            .as_ref()
            .filter(|u| !u.lr.is_dead())
            .map_or(0, |u| u.lr.ignored_live())
    }

    /// The error of waiting on an abandoned ring.
    pub(super) fn dead_ring_error(&self) -> TxError {
        TxError::Ring(io::Error::new(
            io::ErrorKind::BrokenPipe,
            format!(
                "{} sends are stuck in an io_uring that failed and was abandoned; their \
                 buffers will not come back",
                self.ring_in_flight()
            ),
        ))
    }

    /// Sends that are in flight but can never complete (they sit in an io_uring that failed
    /// and was abandoned): waiting for them would never end. `Ok` when every send in flight
    /// can still complete (or nothing is in flight).
    pub fn check_stuck(&self) -> Result<(), TxError> {
        let dead = self.uring.as_ref().is_some_and(|u| u.lr.is_dead());
        if dead && self.ring_in_flight() > 0 && self.in_flight() == self.ring_in_flight() {
            return Err(self.dead_ring_error());
        }
        Ok(())
    }

    // ---- completions and backpressure ----

    /// Takes the next completion and its buffer.
    pub fn next_completion(&mut self) -> Option<(Completion, TxBuf)> {
        self.ready.pop_front()
    }

    /// Takes every ready completion.
    pub fn completions(&mut self) -> impl Iterator<Item = (Completion, TxBuf)> + '_ {
        self.ready.drain(..)
    }

    /// Completions ready to be taken.
    pub fn ready(&self) -> usize {
        self.ready.len()
    }

    /// A socket that refused a send and can take one again (once per refusal).
    pub fn next_writable(&mut self) -> Option<SockId> {
        while let Some(id) = self.writable.pop_front() {
            // A socket closed (and its slot perhaps reused) since it was queued is skipped.
            if let Some(s) = self.sock_mut(id) {
                s.queued_writable = false;
                return Some(id);
            }
        }
        None
    }

    /// Whether `sock` would take a send now.
    pub fn can_send(&self, sock: SockId) -> bool {
        self.sock_ref(sock).is_some_and(|s| s.refusal().is_none())
    }

    // ---- readiness ----

    fn sync_readiness_set(&mut self) -> Result<(), TxError> {
        if self.readiness.is_none() {
            let set = sys::ready::ReadySet::new()
                .map_err(|e| super::sock_err("readiness descriptor", e))?;
            self.readiness = Some(Readiness { set, ring: false });
            // Sockets that wait on their error queue join now.
            let n = self.socks.len() as u32;
            for idx in 0..n {
                let Some(mut s) = self.socks[idx as usize].take() else {
                    continue;
                };
                if s.msg.is_some() && !s.in_epoll {
                    self.watch_socket(idx, &mut s, false);
                }
                self.socks[idx as usize] = Some(s);
            }
        }
        Ok(())
    }

    /// Creates the readiness set (on first call) and puts the ring's eventfd in it.
    fn sync_readiness(&mut self) -> Result<(), TxError> {
        self.sync_readiness_set()?;
        let has_ring = self.readiness.as_ref().is_some_and(|r| r.ring);
        if !has_ring {
            if let Some(u) = self.uring.as_mut().filter(|u| !u.lr.is_dead()) {
                let err = |e| super::sock_err("readiness descriptor", e);
                let fd = u.lr.notify_fd().map_err(err)?;
                let rd = self.readiness.as_mut().expect("created");
                rd.set
                    .add_level_token(fd, libc::EPOLLIN as u32, RING_TOKEN)
                    .map_err(err)?;
                rd.ring = true;
            }
        }
        Ok(())
    }

    /// The readiness descriptor, created on first call: it polls readable when
    /// [`SendRing::on_ready`] would find something to do — a completion or notification on
    /// the ring (its registered eventfd; under `DEFER_TASKRUN` the kernel signals it when it
    /// queues the task work that posts them), a `MSG_ZEROCOPY` notification on a socket's
    /// error queue, or a socket that a stalled copy or zero-copy send waits for becoming
    /// writable. Sends that complete inside [`SendRing::send`] (copy) do not signal it:
    /// check [`SendRing::ready`] before waiting. Rules per task-run mode:
    /// `docs/design/async.md`.
    pub fn readiness_fd(&mut self) -> Result<BorrowedFd<'_>, TxError> {
        self.sync_readiness()?;
        Ok(self.readiness.as_ref().expect("readiness").set.as_fd())
    }

    /// Whether the readiness descriptor polls readable now.
    pub fn readiness_is_set(&self) -> bool {
        self.readiness.as_ref().is_some_and(|r| r.set.is_ready())
    }

    /// Harvests after the readiness descriptor fired (or at any time): takes the socket
    /// events off the descriptor, runs deferred task work if the kernel flagged some, reaps
    /// error queues, continues stalled sends, submits queued requests, and collects
    /// completions. Leaves the descriptor set only if something arrived after the harvest.
    /// Returns the number of completions ready.
    pub fn on_ready(&mut self) -> Result<usize, TxError> {
        self.sync_readiness()?;
        // Edges first: an event that lands after this makes a new one.
        let mut socks = Vec::new();
        if let Some(rd) = &self.readiness {
            rd.set.drain(|token, _ev| {
                if token != RING_TOKEN {
                    socks.push(token as u32);
                }
            });
        }
        self.own.0.syscalls += 1;
        self.own.1.notify_syscalls += 1;
        for idx in socks {
            if !self.stalled.contains(&idx) {
                self.stalled.push(idx);
            }
        }
        for _ in 0..4 {
            if let Err(e) = self.ring_progress(true) {
                self.ring_failed(e);
            }
            self.reap_syscall_paths();
            if !self.clear_readiness() {
                break;
            }
        }
        Ok(self.ready.len())
    }

    /// Clears the ring's eventfd after an enter of ours (which may have signalled it), then
    /// looks again: work queued in between is seen here (true: harvest again), work queued
    /// later signals anew.
    fn clear_readiness(&mut self) -> bool {
        if !self.readiness.as_ref().is_some_and(|r| r.ring) {
            return false;
        }
        let Some(u) = self.uring.as_mut().filter(|u| !u.lr.is_dead()) else {
            return false;
        };
        u.lr.clear_notify();
        u.lr.has_work()
    }

    /// After a call that may have entered the ring outside [`SendRing::on_ready`]: leaves
    /// the descriptor set only for work that is really there.
    fn settle_readiness(&mut self) {
        for _ in 0..4 {
            if !self.clear_readiness() {
                return;
            }
            if let Err(e) = self.ring_progress(true) {
                self.ring_failed(e);
            }
        }
    }

    /// Submits what is queued (that enter also runs deferred task work), else collects what
    /// the kernel posted (`reap`: entering when it flagged deferred task work while buffers
    /// are out; else reading the CQ only); then submits what that let go: a chain's results
    /// let the socket's next requests go, which nothing else would submit.
    fn ring_progress(&mut self, reap: bool) -> std::io::Result<()> {
        if self.uring.as_mut().is_some_and(|u| u.has_staged()) {
            self.ring_submit()?;
        } else if reap {
            self.ring_reap()?;
        } else {
            self.ring_harvest_only(true)?;
        }
        if self.uring.as_mut().is_some_and(|u| u.has_staged()) {
            self.ring_submit()?;
        }
        Ok(())
    }

    // ---- what it reports ----

    /// Sockets open (closing ones included).
    pub fn sockets(&self) -> usize {
        self.socks.iter().filter(|s| s.is_some()).count()
    }

    /// Sends handed over whose completion has not been produced yet (all sockets).
    pub fn in_flight(&self) -> usize {
        self.socks.iter().flatten().map(Sock::in_flight).sum()
    }

    /// Sends of `sock` in flight (0 for a socket that is gone).
    pub fn sock_in_flight(&self, sock: SockId) -> usize {
        self.sock_ref(sock).map_or(0, Sock::in_flight)
    }

    /// The path `sock`'s new sends take now.
    pub fn sock_path(&self, sock: SockId) -> Option<Path> {
        self.sock_ref(sock).map(|s| s.path)
    }

    /// The mode `sock` was added with.
    pub fn sock_mode(&self, sock: SockId) -> Option<TxMode> {
        self.sock_ref(sock).map(|s| s.cfg.mode)
    }

    /// Every fallback `sock` took, with its reason (empty for a socket that is gone).
    pub fn sock_fallbacks(&self, sock: SockId) -> &[Fallback] {
        self.sock_ref(sock).map_or(&[], |s| &s.fallbacks)
    }

    /// `sock`'s counters (its syscalls without the ring's shared enters).
    pub fn sock_counters(&self, sock: SockId) -> Counters {
        self.sock_ref(sock)
            .map_or_else(Counters::default, |s| s.counters.clone())
    }

    /// `sock`'s path counters (`auto`'s cost-by-size figures are the ring's).
    pub fn sock_stats(&self, sock: SockId) -> TxStats {
        self.sock_ref(sock).map_or_else(TxStats::default, |s| {
            let mut st = s.stats.clone();
            self.merge_policy(&mut st);
            st
        })
    }

    fn merge_policy(&self, st: &mut TxStats) {
        let p = self.policy.stats();
        st.auto_windows = p.windows;
        st.auto_explores = p.explores;
        st.auto_drift_explores = p.drift_explores;
        st.auto_copy_below = self.policy.copy_below().map(|b| b as u64);
    }

    /// Whether `sock` is a stream (TCP).
    pub fn sock_is_stream(&self, sock: SockId) -> Option<bool> {
        self.sock_ref(sock).map(|s| s.stream)
    }

    /// UDP: bytes per datagram write of `sock` (a GSO batch when GSO is on); `usize::MAX`
    /// for TCP.
    pub fn sock_chunk(&self, sock: SockId) -> Option<usize> {
        self.sock_ref(sock).map(|s| s.chunk)
    }

    /// UDP: payload bytes per datagram on the wire of `sock`; `usize::MAX` for TCP.
    pub fn sock_segment(&self, sock: SockId) -> Option<usize> {
        self.sock_ref(sock).map(|s| s.segment)
    }

    /// The socket.
    pub fn socket(&self, sock: SockId) -> Option<BorrowedFd<'_>> {
        self.sock_ref(sock).map(|s| s.fd.as_fd())
    }

    /// Sets `TCP_CORK` (TCP) or `UDP_CORK` (UDP) on `sock`. Uncorking submits what is
    /// queued first.
    pub fn set_cork(&mut self, sock: SockId, on: bool) -> Result<(), TxError> {
        if !on {
            self.submit()?;
        }
        let s = self.sock_ref(sock).ok_or_else(|| {
            super::sock_err("set_cork", io::Error::from_raw_os_error(libc::EBADF))
        })?;
        let (level, name) = if s.stream {
            (libc::IPPROTO_TCP, libc::TCP_CORK)
        } else {
            (libc::IPPROTO_UDP, libc::UDP_CORK)
        };
        sys::setsockopt_int(&*s.fd, level, name, i32::from(on))
            .map_err(|e| super::sock_err("setsockopt(CORK)", e))
    }

    /// Counters of all sockets, with the ring's own kernel entries.
    pub fn counters_total(&self) -> Counters {
        let mut c = self.gone.0.clone();
        add_counters(&mut c, &self.own.0);
        for s in self.socks.iter().flatten() {
            add_counters(&mut c, &s.counters);
        }
        c
    }

    /// Path counters of all sockets, with the ring's own kernel entries.
    pub fn stats(&self) -> TxStats {
        let mut st = self.gone.1.clone();
        st.add(&self.own.1);
        for s in self.socks.iter().flatten() {
            st.add(&s.stats);
        }
        self.merge_policy(&mut st);
        st
    }

    /// One line: the ring (io_uring or syscalls), its sockets, and the paths its sends took
    /// with how many of each (what the bytes took, not what was offered).
    pub fn describe(&self) -> String {
        let st = self.stats();
        let names = ["copy", "msg-zc", "uring-zc", "uring-zc-fixed", "uring-copy"];
        let mix: Vec<String> = names
            .iter()
            .zip(st.sends_by_path)
            .filter(|(_, n)| *n > 0)
            .map(|(p, n)| format!("{p} {n}"))
            .collect();
        let mix = if mix.is_empty() {
            "no sends yet".to_string()
        } else {
            format!("sends by path: {}", mix.join(", "))
        };
        let ring = match &self.uring {
            Some(_) if self.has_registered_pool() => "io_uring send ring, registered pool",
            Some(_) => "io_uring send ring",
            None => "send ring without io_uring",
        };
        format!("{ring}, {} sockets; {mix}", self.sockets())
    }

    /// `io_uring_enter` calls made (0 without a ring).
    pub fn enters(&self) -> u64 {
        self.uring.as_ref().map_or(0, |u| u.lr.enters())
    }

    /// The ring's own counters (buffers lent and returned, requests, sockets without a
    /// registered-file slot); `None` without a ring.
    pub fn ring_stats(&self) -> Option<crate::ring::lend::LendStats> {
        self.uring.as_ref().map(|u| u.lr.stats().clone())
    }

    /// Whether io_uring carries this ring's sends (else every socket uses syscalls).
    pub fn has_uring(&self) -> bool {
        self.uring.is_some()
    }

    /// Makes the io_uring's `io_uring_enter` calls fail as `fault` says (tests of the
    /// failure paths); returns whether there is a ring.
    #[cfg(feature = "fault-injection")]
    pub fn inject_ring_fault(&mut self, fault: crate::ring::lend::Fault) -> bool {
        self.uring.as_mut().map(|u| u.lr.inject(fault)).is_some()
    }
}

pub(super) fn count_zc(c: &mut Counters, status: ZcStatus, bytes: usize) {
    match status {
        ZcStatus::ZeroCopy => c.zerocopy_bytes += bytes as u64,
        ZcStatus::Copied | ZcStatus::Mixed => c.copied_bytes += bytes as u64,
        ZcStatus::NotAttempted | ZcStatus::Unknown => {}
    }
}

pub(super) fn add_counters(a: &mut Counters, b: &Counters) {
    a.bytes += b.bytes;
    a.ops += b.ops;
    a.syscalls += b.syscalls;
    a.notifications += b.notifications;
    a.zerocopy_bytes += b.zerocopy_bytes;
    a.copied_bytes += b.copied_bytes;
}

impl SendRing {
    /// The best path the ring offers a new `auto` socket (what [`Report::path`] says before
    /// any send).
    pub fn offered_path(&self) -> Path {
        match &self.uring {
            Some(u) if u.lr.has_any_pool() => Path::UringZcFixed,
            Some(u) if matches!(u.send_zc, Ok(true)) => Path::UringZc,
            Some(_) => Path::UringCopy,
            None => Path::MsgZc,
        }
    }
}

impl Report for SendRing {
    type Path = Path;
    /// The path most of the ring's sends took (what its bytes took: loopback sends of an
    /// `auto` ring go by `uring-copy` although the ring offers `uring-zc-fixed`); the offered
    /// path before any send. [`SendRing::describe`] lists the mix, [`SendRing::sock_path`]
    /// says it per socket.
    fn path(&self) -> Path {
        let by = self.stats().sends_by_path;
        let all = [
            Path::Copy,
            Path::MsgZc,
            Path::UringZc,
            Path::UringZcFixed,
            Path::UringCopy,
        ];
        match all.into_iter().max_by_key(|p| by[p.index()]) {
            Some(p) if by[p.index()] > 0 => p,
            _ => self.offered_path(),
        }
    }
    fn counters(&self) -> Counters {
        self.counters_total()
    }
    fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }
}

impl Drop for SendRing {
    fn drop(&mut self) {
        if self.in_flight() > 0 {
            let _ = self.flush(Duration::from_secs(2));
        }
    }
}

/// Takes a buffer apart for sending: its first slice, the slices after it, the first's chunk
/// metadata (single buffers), the slices' metadata (vectored sends), and why a vectored send
/// cannot go (no slice, or more than one request carries).
#[allow(clippy::type_complexity)]
fn split_slices(
    buf: TxBuf,
) -> (
    Lent,
    Vec<Lent>,
    Option<(crate::rx::ConnId, crate::rx::RxPath)>,
    Option<Box<Parts>>,
    Option<SendError>,
) {
    let TxBuf::Slices(v) = buf else {
        let (l, c) = buf.into_lent();
        return (l, Vec::new(), c, None, None);
    };
    // Nested slices are flattened (and come back flat).
    let mut flat = Vec::with_capacity(v.len());
    let mut stack: Vec<TxBuf> = v.into_iter().rev().collect();
    while let Some(b) = stack.pop() {
        match b {
            TxBuf::Slices(inner) => stack.extend(inner.into_iter().rev()),
            b => flat.push(b),
        }
    }
    let n = flat.len();
    let mut parts = Box::<Parts>::default();
    let mut lents = Vec::with_capacity(n);
    for b in flat {
        let (l, c) = b.into_lent();
        lents.push(l);
        parts.chunks.push(c);
    }
    let bad = match n {
        0 => Some(SendError::Invalid {
            errno: libc::EINVAL,
            reason: "a vectored send without slices".into(),
        }),
        n if n > MAX_SLICES => Some(SendError::Invalid {
            errno: libc::EINVAL,
            reason: format!(
                "a vectored send of {n} slices: at most {MAX_SLICES} go in one request \
                 (send the rest separately, or gather small ones)"
            ),
        }),
        _ => None,
    };
    let mut it = lents.into_iter();
    let first = it.next().unwrap_or(Lent::Vec(Vec::new()));
    (first, it.collect(), None, Some(parts), bad)
}

/// The COPIED watch an `auto` socket follows (its route's, or its own without a route),
/// and the route's peer address.
fn watch_of<'a>(
    routes: &'a mut Routes,
    route: Option<u32>,
    own: &'a mut Option<CopiedWatch>,
) -> (&'a mut CopiedWatch, Option<IpAddr>) {
    match route {
        Some(id) => {
            let r = routes.get_mut(id);
            (&mut r.watch, Some(r.ip))
        }
        None => (
            own.as_mut()
                .expect("a socket without a route has its own watch"),
            None,
        ),
    }
}

/// An `auto` socket's path follows its route's COPIED verdict (`in_copy`); the first switch
/// to copy is recorded as a fallback, saying whether this socket's completions found it
/// (`streak`) or others' to the same peer did.
fn follow_verdict(
    s: &mut Sock,
    in_copy: bool,
    copy: Path,
    interval: u64,
    streak: Option<u32>,
    peer: Option<IpAddr>,
) {
    let Some(a) = s.auto.as_mut() else { return };
    a.in_copy = in_copy;
    if !in_copy {
        s.path = a.zc.unwrap_or(copy);
        return;
    }
    s.path = copy;
    if a.noted {
        return;
    }
    a.noted = true;
    let from = a.zc.map_or(stats::Path::TxMode(TxMode::Auto), route_path);
    let whose = match (streak, peer) {
        (Some(n), _) => format!("{n} zero-copy completions in a row came back COPIED"),
        (None, Some(ip)) => format!(
            "zero-copy completions of this ring's sockets to {ip} came back COPIED (the \
             route's verdict: this socket made no probe of its own)"
        ),
        (None, None) => "zero-copy completions came back COPIED".to_string(),
    };
    let per = if peer.is_some() {
        "the route re-probed once"
    } else {
        "re-probing"
    };
    let reason = format!(
        "{whose}: this path copies anyway (loopback or local delivery), so zero-copy only \
         adds notification cost; sending by copy ({copy}), {per} every {interval} sends"
    );
    s.fallbacks.push(Fallback::new(from, copy, reason));
}

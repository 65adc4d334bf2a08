//! Zero-copy send with completions: [`Sender`].
//!
//! A `Sender` owns a connected TCP socket or a connected UDP socket (IPv4 or IPv6) and sends
//! [`PoolBuf`]s by one of four paths ([`Path`]):
//!
//! - `uring-zc`: io_uring `SEND_ZC` with `IORING_SEND_ZC_REPORT_USAGE` (Linux 6.0 / 6.2);
//!   completions and notifications are CQEs, read without a syscall;
//! - `uring-zc-fixed`: the same from a registered (fixed) pool, no page pinning per send;
//! - `msg-zc`: `send(MSG_ZEROCOPY)` with `SO_ZEROCOPY` and the batched error-queue reaper;
//! - `copy`: plain `send`.
//!
//! [`TxMode::Auto`] probes at construction (io_uring and `SEND_ZC`, then `SO_ZEROCOPY`) and,
//! while sending, watches the completions: when they report that the kernel copied anyway
//! (loopback, local delivery over veth), it switches the socket to copy send and re-probes
//! now and then. Every path not taken is recorded as a [`Fallback`] with its reason.
//!
//! Ownership: [`Sender::send`] takes the buffer by value and returns a [`Ticket`]; the buffer
//! comes back exactly once, with its [`Completion`], from [`Sender::next_completion`]. A buffer
//! cannot be touched while the kernel may read it:
//!
//! ```compile_fail,E0382
//! use zcio::buf::pool::PoolBuf;
//! use zcio::tx::Sender;
//! fn reuse(sender: &mut Sender, mut buf: PoolBuf) {
//!     let _ticket = sender.send(buf);
//!     buf[0] = 1; // error[E0382]: borrow of moved value: `buf`
//! }
//! ```
//!
//! ```no_run
//! use std::net::TcpStream;
//! use std::time::Duration;
//! use zcio::buf::pool::Pool;
//! use zcio::tx::{Sender, SenderConfig, TxMode};
//! let pool = Pool::new(64 << 10, 32, false)?;
//! let sock = TcpStream::connect("127.0.0.1:5001")?;
//! let mut tx = Sender::new(sock, &pool, SenderConfig::new(TxMode::Auto))?;
//! let mut buf = pool.try_get().unwrap();
//! buf.fill(7);
//! let ticket = tx.send(buf);
//! tx.flush(Duration::from_secs(5))?;
//! let (done, buf) = tx.next_completion().unwrap();
//! assert_eq!(done.ticket, ticket);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod copy;
pub(crate) mod core;
mod msgzc;
mod policy;

pub use crate::buf::pool::{Pool, PoolBuf};
use crate::ring::send::{Recovery, SendDone, SendRing};
use crate::ring::{RingConfig, RingError};
use crate::stats::{self, Counters, Fallback, Report};
use crate::sys::{self, net};
use msgzc::{MsgDone, MsgZc};
use policy::{AutoPolicy, Choice, Event};
use serde::Serialize;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which send path to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TxMode {
    /// Plain `send`.
    Copy,
    /// `MSG_ZEROCOPY` with the batched error-queue reaper.
    MsgZc,
    /// io_uring `SEND_ZC`.
    UringZc,
    /// io_uring `SEND_ZC` from a registered (fixed) pool.
    UringZcFixed,
    /// Probe, start zero-copy, switch to copy where completions say the kernel copies anyway.
    Auto,
}

impl std::str::FromStr for TxMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "copy" => TxMode::Copy,
            "msg-zc" => TxMode::MsgZc,
            "uring-zc" => TxMode::UringZc,
            "uring-zc-fixed" => TxMode::UringZcFixed,
            "auto" => TxMode::Auto,
            other => {
                return Err(format!(
                    "unknown tx mode '{other}' (use copy, msg-zc, uring-zc, uring-zc-fixed or auto)"
                ))
            }
        })
    }
}

impl std::fmt::Display for TxMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TxMode::Copy => "copy",
            TxMode::MsgZc => "msg-zc",
            TxMode::UringZc => "uring-zc",
            TxMode::UringZcFixed => "uring-zc-fixed",
            TxMode::Auto => "auto",
        })
    }
}

/// The path a send actually took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Path {
    /// Plain `send`.
    Copy,
    /// `MSG_ZEROCOPY`.
    MsgZc,
    /// io_uring `SEND_ZC`.
    UringZc,
    /// io_uring `SEND_ZC` with a fixed buffer.
    UringZcFixed,
}

impl Path {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Path::Copy => "copy",
            Path::MsgZc => "msg-zc",
            Path::UringZc => "uring-zc",
            Path::UringZcFixed => "uring-zc-fixed",
        }
    }
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Settings of a [`Sender`].
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// Path to use.
    pub mode: TxMode,
    /// Most sends owned by the kernel at once; [`Sender::send`] waits for completions
    /// beyond this (backpressure).
    pub depth: usize,
    /// `msg-zc`: reap the error queue (without blocking) after this many accepted calls.
    pub notify_limit: usize,
    /// io_uring: enter the kernel once this many requests are queued (1 = every send).
    pub submit_batch: usize,
    /// UDP: split writes larger than one datagram with `UDP_SEGMENT` (GSO). Without it a
    /// buffer is one datagram (`MessageTooBig` above 64K; IP-fragmented, hence copied, above
    /// the MTU).
    pub udp_gso: bool,
    /// `auto`: switch to copy after this many consecutive COPIED completions.
    pub copied_streak: u32,
    /// `auto`: after switching, try zero-copy again after this many copy sends (doubling
    /// each time the probe is copied again, up to 64×).
    pub reprobe_every: u64,
    /// `auto`: choose copy or zero-copy per size from the sender CPU time each costs,
    /// measured on this socket (see `docs/design/tx.md`). Off: every size goes zero-copy
    /// unless COPIED completions say the path copies anyway.
    pub auto_by_size: bool,
}

impl SenderConfig {
    /// Defaults for `mode`.
    pub fn new(mode: TxMode) -> Self {
        Self {
            mode,
            depth: 64,
            notify_limit: 32,
            submit_batch: 1,
            udp_gso: true,
            copied_streak: 4,
            reprobe_every: 4096,
            auto_by_size: true,
        }
    }
}

impl Default for SenderConfig {
    fn default() -> Self {
        Self::new(TxMode::Auto)
    }
}

/// Identifies one send; its [`Completion`] carries the same ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Ticket(pub u64);

/// Whether the kernel sent a buffer without copying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ZcStatus {
    /// Sent by copy (or nothing to send).
    NotAttempted,
    /// Every completion said zero-copy (`ee_code` 0 / notification without `ZC_COPIED`).
    ZeroCopy,
    /// Every completion said the kernel copied after all.
    Copied,
    /// Some parts zero-copy, some copied (or not reported).
    Mixed,
    /// Sent zero-copy, but the kernel did not say whether it copied
    /// (`IORING_SEND_ZC_REPORT_USAGE` needs Linux 6.2).
    Unknown,
}

/// Why a send failed (all or part of its bytes were not accepted, or the connection failed
/// while they were in flight).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The buffer is larger than one datagram and GSO is off.
    #[error("message of {len} bytes is larger than the largest UDP datagram ({max} bytes): enable udp_gso or send smaller buffers (EMSGSIZE)")]
    MessageTooBig {
        /// Buffer length.
        len: usize,
        /// Largest payload.
        max: usize,
    },
    /// The connection failed (reset, closed): data sent before may not have arrived.
    #[error("connection failed while sending: {} (buffer returned; its data may not have arrived)", io::Error::from_raw_os_error(*errno))]
    Connection {
        /// errno (`ECONNRESET`, `EPIPE`, `ENOTCONN`, ...).
        errno: i32,
    },
    /// Another error from the kernel.
    #[error("send failed: {}", io::Error::from_raw_os_error(*errno))]
    Os {
        /// errno.
        errno: i32,
    },
}

impl SendError {
    fn from_errno(errno: i32) -> Self {
        match errno {
            libc::ECONNRESET
            | libc::EPIPE
            | libc::ENOTCONN
            | libc::ECONNABORTED
            | libc::ETIMEDOUT
            | libc::ECONNREFUSED => SendError::Connection { errno },
            libc::EMSGSIZE => SendError::MessageTooBig { len: 0, max: 0 },
            _ => SendError::Os { errno },
        }
    }
}

/// How one send ended. Each [`Sender::send`] produces exactly one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Completion {
    /// The send's ticket.
    pub ticket: Ticket,
    /// Bytes the caller asked to send.
    pub len: usize,
    /// Bytes the kernel accepted.
    pub bytes: usize,
    /// Path taken.
    pub path: Path,
    /// Whether the kernel copied.
    pub zerocopy: ZcStatus,
    /// The error, if the send failed or its connection did while it was in flight.
    #[serde(skip)]
    pub error: Option<SendError>,
}

impl Completion {
    /// `Ok(bytes)` or the error.
    pub fn result(&self) -> Result<usize, &SendError> {
        match &self.error {
            None => Ok(self.bytes),
            Some(e) => Err(e),
        }
    }
}

/// Errors creating or driving a [`Sender`].
#[derive(Debug, thiserror::Error)]
pub enum TxError {
    /// The socket cannot be used (not connected, not TCP/UDP, ...).
    #[error("{what}: {source}")]
    Socket {
        /// What was checked.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Sends were still in flight when the wait ended.
    #[error("{in_flight} sends still in flight after {waited:?}: the peer is not reading or the path is stalled")]
    Timeout {
        /// Sends not yet complete.
        in_flight: usize,
        /// How long was waited.
        waited: Duration,
    },
    /// The io_uring failed.
    #[error("io_uring: {0}")]
    Ring(#[source] io::Error),
}

/// Per-path counters beyond [`Counters`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TxStats {
    /// Syscalls made to send (send calls, io_uring_enter calls that submitted).
    pub send_syscalls: u64,
    /// Syscalls made only to collect completions (recvmsg on the error queue, poll,
    /// io_uring_enter calls that only waited).
    pub notify_syscalls: u64,
    /// Sends completed by path: copy, msg-zc, uring-zc, uring-zc-fixed.
    pub sends_by_path: [u64; 4],
    /// Times a send waited because `depth` sends were in flight.
    pub depth_waits: u64,
    /// Times sending paused for completions to free kernel room: `ENOBUFS` from
    /// `MSG_ZEROCOPY` (optmem_max) or `ENOBUFS`/`ENOMEM` results from `SEND_ZC`.
    pub room_waits: u64,
    /// Pieces sent by copy because zero-copy had no room even with nothing in flight.
    pub room_copies: u64,
    /// `auto`: switches from zero-copy to copy.
    pub auto_switches_to_copy: u64,
    /// `auto`: re-probes made, and how many found zero-copy working again.
    pub auto_reprobes: u64,
    /// `auto`: re-probes that switched back to zero-copy.
    pub auto_switches_back: u64,
    /// `auto`: sends that went by copy because copy costs less at their size.
    pub auto_size_copies: u64,
    /// `auto`: measurement windows counted (runs of sends of one size class on one path).
    pub auto_windows: u64,
    /// `auto`: windows spent re-measuring the path not chosen.
    pub auto_explores: u64,
    /// `auto`: re-measurements started because the chosen path's own cost drifted (a change
    /// of conditions), not because the re-measuring gap ran out.
    pub auto_drift_explores: u64,
    /// `auto`: the learned size below which copy is cheaper (`None` before a size class was
    /// measured on both paths; 0 when zero-copy won everywhere measured).
    pub auto_copy_below: Option<u64>,
    /// Completion sequence numbers that matched no send (should be 0).
    pub unmatched_notifications: u64,
    /// Non-zero-copy records read from the error queue (ICMP, local errors).
    pub queued_errors: u64,
}

#[derive(Debug)]
struct Meta {
    len: usize,
    path: Path,
}

/// Per-ticket data of sends in flight, indexed by ticket (tickets only grow, so a deque
/// from the oldest live ticket replaces a hash map: no hashing per send).
#[derive(Debug, Default)]
struct Metas {
    base: u64,
    q: VecDeque<Option<Meta>>,
}

impl Metas {
    fn insert(&mut self, ticket: u64, m: Meta) {
        if self.q.is_empty() {
            self.base = ticket;
        }
        let i = (ticket - self.base) as usize;
        if self.q.len() <= i {
            self.q.resize_with(i + 1, || None);
        }
        self.q[i] = Some(m);
    }

    fn remove(&mut self, ticket: u64) -> Option<Meta> {
        let i = usize::try_from(ticket.checked_sub(self.base)?).ok()?;
        let m = self.q.get_mut(i)?.take();
        while matches!(self.q.front(), Some(None)) {
            self.q.pop_front();
            self.base += 1;
        }
        m
    }
}

/// A sender's readiness set: the ring's eventfd (level) and the socket's error queue (edge).
#[derive(Debug)]
struct Readiness {
    set: crate::sys::ready::ReadySet,
    ring: bool,
    msg: bool,
}

#[derive(Debug)]
struct Auto {
    /// The zero-copy path `auto` uses (none: copy only).
    zc: Option<Path>,
    /// The COPIED re-probe in flight.
    probe: Option<u64>,
    /// Copy sends since the probe went out (msg-zc reaps every 8).
    copies: u64,
    policy: AutoPolicy,
}

/// A zero-copy sender on one connected TCP or UDP socket. See the [module docs](self).
///
/// Not for sharing between threads: with io_uring paths the ring belongs to the thread that
/// created the sender (`SINGLE_ISSUER`: `io_uring_enter` from another thread fails with
/// `EEXIST`), so create it on the thread that sends. A `Sender` is therefore not `Send`:
///
/// ```compile_fail
/// fn needs_send<T: Send>() {}
/// needs_send::<zcio::tx::Sender>();
/// ```
pub struct Sender {
    // Backends first: they are dropped (draining what is in flight) before the socket.
    ring: Option<SendRing>,
    msg: Option<MsgZc>,
    sock: Arc<OwnedFd>,
    stream: bool,
    chunk: usize,
    segment: usize,
    max_datagram: usize,
    cfg: SenderConfig,
    path: Path,
    auto: Auto,
    next_ticket: u64,
    meta: Metas,
    ready: VecDeque<(Completion, PoolBuf)>,
    counters: Counters,
    stats: TxStats,
    fallbacks: Vec<Fallback>,
    ring_enters_seen: u64,
    ring_room_seen: u64,
    msg_seen: msgzc::MsgStats,
    /// The ring stopped being used for new sends (it gave up or failed).
    retired: bool,
    /// A stream whose ring was abandoned with requests of unknown outcome: every later send
    /// fails with this errno.
    broken: Option<i32>,
    /// The readiness descriptor and which backends are in it, once asked for.
    readiness: Option<Readiness>,
    /// `SINGLE_ISSUER`: the ring belongs to the creating thread, so a `Sender` is not `Send`.
    _one_thread: std::marker::PhantomData<*const ()>,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("path", &self.path)
            .field("mode", &self.cfg.mode)
            .field("in_flight", &self.in_flight())
            .field("counters", &self.counters)
            .finish()
    }
}

fn sock_err(what: impl Into<String>, source: io::Error) -> TxError {
    TxError::Socket {
        what: what.into(),
        source,
    }
}

impl Sender {
    /// Takes a connected socket (TCP stream or UDP; AF_INET or AF_INET6; other stream or
    /// datagram sockets fall back to copy with a recorded reason) and sets up `cfg.mode`.
    /// With [`TxMode::UringZcFixed`], `pool` is registered with the ring.
    pub fn new(sock: impl Into<OwnedFd>, pool: &Pool, cfg: SenderConfig) -> Result<Self, TxError> {
        let sock: OwnedFd = sock.into();
        let ty = sys::getsockopt_int(&sock, libc::SOL_SOCKET, libc::SO_TYPE)
            .map_err(|e| sock_err("getsockopt(SO_TYPE)", e))?;
        let stream = match ty {
            libc::SOCK_STREAM => true,
            libc::SOCK_DGRAM => false,
            other => {
                return Err(sock_err(
                    format!("socket type {other}"),
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "Sender needs a SOCK_STREAM or SOCK_DGRAM socket",
                    ),
                ))
            }
        };
        let family = net::socket_family(&sock).ok();
        let mut fallbacks = Vec::new();
        // UDP: datagram size from the route MTU, GSO for larger writes.
        let max_datagram = match family {
            Some(net::Family::V6) => 65527,
            _ => 65507,
        };
        let mut chunk = usize::MAX;
        let mut segment = usize::MAX;
        if !stream {
            let payload = match family {
                Some(net::Family::V4) => sys::getsockopt_int(&sock, libc::SOL_IP, libc::IP_MTU)
                    .map(|m| (m as usize).saturating_sub(28)),
                Some(net::Family::V6) => sys::getsockopt_int(&sock, libc::SOL_IPV6, libc::IPV6_MTU)
                    .map(|m| (m as usize).saturating_sub(48)),
                None => Ok(max_datagram),
            }
            .map_err(|e| sock_err("reading the path MTU (is the UDP socket connected?)", e))?
            .clamp(1, max_datagram);
            chunk = max_datagram;
            segment = max_datagram;
            if cfg.udp_gso && payload < max_datagram && family.is_some() {
                match sys::setsockopt_int(&sock, sys::SOL_UDP, sys::UDP_SEGMENT, payload as i32) {
                    // At most 64 segments per call (UDP_MAX_SEGMENTS on older kernels), and
                    // the whole write must fit one IP packet's length field.
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
        let sock = Arc::new(sock);
        let mut s = Self {
            ring: None,
            msg: None,
            sock,
            stream,
            chunk,
            segment,
            max_datagram,
            cfg: cfg.clone(),
            path: Path::Copy,
            auto: Auto {
                zc: None,
                probe: None,
                copies: 0,
                policy: AutoPolicy::new(cfg.copied_streak, cfg.reprobe_every, cfg.auto_by_size),
            },
            next_ticket: 0,
            meta: Metas::default(),
            ready: VecDeque::new(),
            counters: Counters::default(),
            stats: TxStats::default(),
            fallbacks,
            ring_enters_seen: 0,
            ring_room_seen: 0,
            msg_seen: msgzc::MsgStats::default(),
            readiness: None,
            retired: false,
            broken: None,
            _one_thread: std::marker::PhantomData,
        };
        s.path = if cfg.mode == TxMode::Auto && family.is_none() {
            s.fallbacks.push(Fallback::new(
                TxMode::Auto,
                Path::Copy,
                "not an AF_INET/AF_INET6 socket: zero-copy send needs TCP or UDP (SEND_ZC \
                 answers EOPNOTSUPP, SO_ZEROCOPY is refused)",
            ));
            Path::Copy
        } else {
            s.setup(pool)?
        };
        if cfg.mode == TxMode::Auto {
            s.auto.zc = (s.path != Path::Copy).then_some(s.path);
        }
        Ok(s)
    }

    fn setup(&mut self, pool: &Pool) -> Result<Path, TxError> {
        let want = self.cfg.mode;
        if want == TxMode::Copy {
            return Ok(Path::Copy);
        }
        let mut from = stats::Path::from(want);
        if matches!(want, TxMode::UringZc | TxMode::UringZcFixed | TxMode::Auto) {
            let ring_cfg = RingConfig {
                entries: (self.cfg.depth.clamp(8, 4096) as u32).next_power_of_two(),
                ..RingConfig::default()
            };
            match SendRing::new(self.sock.clone(), self.stream, self.chunk, &ring_cfg) {
                Ok(mut ring) => match ring.supports_send_zc() {
                    // Auto's copy detection needs the usage report; MSG_ZEROCOPY has it.
                    Ok(true) if want == TxMode::Auto && !ring.reports_usage() => {
                        self.fallbacks.push(Fallback::new(
                            from.clone(),
                            Path::MsgZc,
                            format!(
                                "{}; Auto needs to know when zero-copy was copied, which \
                                 MSG_ZEROCOPY completions say",
                                crate::ring::features::Features::get()
                                    .why_not(crate::ring::features::Features::SEND_ZC_REPORT_USAGE)
                                    .unwrap_or_default()
                            ),
                        ))
                    }
                    Ok(true) => {
                        let mut path = Path::UringZc;
                        if matches!(want, TxMode::UringZcFixed | TxMode::Auto) {
                            match ring.register_pool(pool) {
                                Ok(()) => path = Path::UringZcFixed,
                                Err(e) => self.fallbacks.push(Fallback::new(
                                    Path::UringZcFixed,
                                    Path::UringZc,
                                    explain_register(&e, pool.region_len()),
                                )),
                            }
                        }
                        self.ring = Some(ring);
                        return Ok(path);
                    }
                    Ok(false) => self.fallbacks.push(Fallback::new(
                        from.clone(),
                        Path::MsgZc,
                        "kernel lacks IORING_OP_SEND_ZC (needs Linux 6.0)",
                    )),
                    Err(e) => self.fallbacks.push(Fallback::new(
                        from.clone(),
                        Path::MsgZc,
                        format!("IORING_REGISTER_PROBE failed: {e}"),
                    )),
                },
                Err(RingError::Unavailable { reason, .. }) => {
                    self.fallbacks
                        .push(Fallback::new(from.clone(), Path::MsgZc, reason));
                }
                Err(e) => {
                    self.fallbacks
                        .push(Fallback::new(from.clone(), Path::MsgZc, e.to_string()))
                }
            }
            from = Path::MsgZc.into();
        }
        match MsgZc::new(
            self.sock.clone(),
            self.stream,
            self.chunk,
            self.cfg.notify_limit,
        ) {
            Ok(m) => {
                self.msg = Some(m);
                Ok(Path::MsgZc)
            }
            Err(reason) => {
                self.fallbacks.push(Fallback::new(from, Path::Copy, reason));
                Ok(Path::Copy)
            }
        }
    }

    /// Makes the io_uring's `io_uring_enter` calls fail as `fault` says (tests of the
    /// failure paths); returns whether this sender has a ring.
    #[cfg(feature = "fault-injection")]
    pub fn inject_ring_fault(&mut self, fault: crate::ring::send::Fault) -> bool {
        self.ring.as_mut().map(|r| r.inject(fault)).is_some()
    }

    /// The path new sends take now.
    pub fn path(&self) -> Path {
        self.path
    }

    /// The configured mode.
    pub fn mode(&self) -> TxMode {
        self.cfg.mode
    }

    /// Whether the socket is a stream (TCP).
    pub fn is_stream(&self) -> bool {
        self.stream
    }

    /// UDP: bytes per datagram write (a GSO batch when GSO is on); `usize::MAX` for TCP.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// UDP: payload bytes per datagram on the wire (the GSO segment size, or the whole write
    /// without GSO: `usize::MAX`); `usize::MAX` for TCP.
    pub fn segment(&self) -> usize {
        self.segment
    }

    /// Every fallback taken, with its reason.
    pub fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }

    /// Counters: bytes completed, sends, syscalls, notifications, zero-copy vs copied bytes.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Path-specific counters.
    pub fn stats(&self) -> &TxStats {
        &self.stats
    }

    /// The socket.
    pub fn socket(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Sends handed to the kernel whose completion has not been produced yet.
    pub fn in_flight(&self) -> usize {
        self.ring.as_ref().map_or(0, |r| r.in_flight())
            + self.msg.as_ref().map_or(0, |m| m.in_flight())
    }

    /// Sends in flight that can still come back (those of an abandoned ring cannot).
    fn in_flight_active(&self) -> usize {
        self.ring
            .as_ref()
            .filter(|r| !r.is_dead())
            .map_or(0, |r| r.in_flight())
            + self.msg.as_ref().map_or(0, |m| m.in_flight())
    }

    /// Whether [`Sender::send`] can hand a buffer over without waiting for completions
    /// (fewer than `depth` sends in flight).
    pub fn has_room(&self) -> bool {
        self.in_flight_active() < self.cfg.depth.max(1)
    }

    /// Sends that are in flight but can never complete (they sit in an io_uring that failed
    /// and was abandoned): waiting for them, on the descriptor or otherwise, would never end.
    /// The error says so; `Ok` when every send in flight can still complete.
    pub fn check_stuck(&self) -> Result<(), TxError> {
        if self.in_flight() > self.in_flight_active() && self.in_flight_active() == 0 {
            return Err(self.dead_ring_error());
        }
        Ok(())
    }

    /// Completions ready to be taken.
    pub fn ready(&self) -> usize {
        self.ready.len()
    }

    /// Sets `TCP_CORK` (TCP) or `UDP_CORK` (UDP): the kernel holds partial frames until
    /// uncorked.
    pub fn set_cork(&mut self, on: bool) -> Result<(), TxError> {
        let (level, name) = if self.stream {
            (libc::IPPROTO_TCP, libc::TCP_CORK)
        } else {
            (libc::IPPROTO_UDP, libc::UDP_CORK)
        };
        if !on {
            // Uncorking flushes; queued io_uring requests must be in the socket first.
            self.submit_all()?;
        }
        sys::setsockopt_int(&*self.sock, level, name, i32::from(on))
            .map_err(|e| sock_err("setsockopt(CORK)", e))
    }

    /// Sends `buf[..buf.len()]`. The buffer comes back with its [`Completion`] from
    /// [`Sender::next_completion`]. Never fails: errors are in the completion. Blocks for
    /// completions when `depth` sends are in flight.
    pub fn send(&mut self, buf: PoolBuf) -> Ticket {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.counters.ops += 1;
        let len = buf.len();
        if len == 0 {
            // Nothing to lend: TCP needs no call, UDP sends an empty datagram.
            let mut error = None;
            if !self.stream {
                self.ordered_for_copy();
                let out = copy::send_all(&*self.sock, &[], 1);
                self.syscalls_send(out.syscalls);
                error = out.error.map(SendError::from_errno);
            }
            self.push_ready(
                done(ticket, 0, 0, Path::Copy, ZcStatus::NotAttempted, error),
                buf,
            );
            return Ticket(ticket);
        }
        if !self.stream && self.chunk == usize::MAX && len > self.max_datagram {
            let e = SendError::MessageTooBig {
                len,
                max: self.max_datagram,
            };
            self.push_ready(
                done(ticket, len, 0, Path::Copy, ZcStatus::NotAttempted, Some(e)),
                buf,
            );
            return Ticket(ticket);
        }
        if let Some(errno) = self.broken {
            // The ring failed with requests of unknown outcome ahead of this one.
            self.push_ready(
                done(
                    ticket,
                    len,
                    0,
                    Path::Copy,
                    ZcStatus::NotAttempted,
                    Some(SendError::Os { errno }),
                ),
                buf,
            );
            return Ticket(ticket);
        }
        while self.in_flight_active() >= self.cfg.depth.max(1) {
            self.stats.depth_waits += 1;
            if self.wait_inner(Duration::from_millis(100)).is_err() {
                break;
            }
        }
        let path = self.route(ticket, len);
        match path {
            Path::Copy => {
                self.ordered_for_copy();
                let out = copy::send_all(&*self.sock, &buf, self.chunk);
                self.syscalls_send(out.syscalls);
                let error = out.error.map(SendError::from_errno);
                self.push_ready(
                    done(
                        ticket,
                        len,
                        out.bytes,
                        Path::Copy,
                        ZcStatus::NotAttempted,
                        error,
                    ),
                    buf,
                );
                if self.auto.probe.is_some() {
                    self.collect_probe();
                }
            }
            Path::MsgZc => {
                self.ordered_for_copy();
                self.meta.insert(ticket, Meta { len, path });
                let m = self.msg.as_mut().expect("msg-zc backend");
                m.send(ticket, buf);
                self.collect();
            }
            Path::UringZc | Path::UringZcFixed => {
                self.meta.insert(ticket, Meta { len, path });
                let r = self.ring.as_mut().expect("ring backend");
                r.send(ticket, buf);
                if r.staged() >= self.cfg.submit_batch.max(1) {
                    let res = r.submit();
                    self.account_ring(true);
                    if let Err(e) = res {
                        self.ring_failed(e);
                    }
                }
                self.collect();
            }
        }
        if self.readiness.is_some() {
            self.settle_readiness();
        }
        Ticket(ticket)
    }

    /// Makes progress without blocking: submits queued io_uring requests, reaps ready
    /// completions. Returns the number of completions ready.
    pub fn poll(&mut self) -> Result<usize, TxError> {
        if let Some(r) = self.ring.as_mut() {
            // Submit only what is queued; completions already posted are read without a
            // syscall (notifications of earlier sends ride on the next submitting enter).
            let res = if r.is_dead() {
                Ok(())
            } else if r.staged() > 0 {
                r.submit()
            } else {
                r.harvest_ready()
            };
            self.account_ring(true);
            if let Err(e) = res {
                self.ring_failed(e);
            }
        }
        let n = self.reap_and_collect();
        if self.readiness.is_some() {
            self.settle_readiness();
            return Ok(self.ready.len());
        }
        Ok(n)
    }

    /// Like [`Sender::poll`], but leaves queued io_uring requests queued until
    /// `submit_batch` of them are there: on io_uring paths it only reads completions and
    /// notifications the kernel has already posted (no syscall); on `msg-zc` it reaps the
    /// error queue as `poll` does. For callers that look for completions after every send
    /// without giving up submission batching. Returns the number of completions ready.
    pub fn harvest(&mut self) -> Result<usize, TxError> {
        if let Some(r) = self.ring.as_mut().filter(|r| !r.is_dead()) {
            let res = r.harvest_ready();
            self.account_ring(false);
            if let Err(e) = res {
                self.ring_failed(e);
            }
        }
        Ok(self.reap_and_collect())
    }

    /// Reaps the MSG_ZEROCOPY error queue if sends are in flight, moves finished sends to the
    /// ready list and returns its length (the shared tail of `poll` and `harvest`).
    fn reap_and_collect(&mut self) -> usize {
        if let Some(m) = self.msg.as_mut() {
            if m.in_flight() > 0 {
                m.reap();
            }
        }
        self.collect();
        self.ready.len()
    }

    /// Blocks until at least one completion is ready, nothing is in flight, or `timeout`
    /// passes. Returns the number of completions ready.
    pub fn wait(&mut self, timeout: Duration) -> Result<usize, TxError> {
        let end = Instant::now() + timeout;
        self.poll()?;
        while self.ready.is_empty() && self.in_flight() > 0 {
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

    /// The readiness descriptor, created on first call: it polls readable when
    /// [`Sender::on_ready`] would find something to harvest — a completion or zero-copy
    /// notification of an io_uring send (the ring's registered eventfd; under `DEFER_TASKRUN`
    /// the kernel signals it when it queues the task work that posts them), or a
    /// `MSG_ZEROCOPY` notification (the socket's error queue, edge-triggered so a hung-up
    /// socket is not ready forever). Copy sends complete inside [`Sender::send`]: check
    /// [`Sender::ready`] before waiting. The rules per task-run mode are in
    /// `docs/design/async.md`.
    pub fn readiness_fd(&mut self) -> Result<BorrowedFd<'_>, TxError> {
        self.sync_readiness()?;
        Ok(self.readiness.as_ref().expect("readiness").set.as_fd())
    }

    /// Adds the backends that exist now to the readiness set (creating it).
    fn sync_readiness(&mut self) -> Result<(), TxError> {
        let err = |e| sock_err("readiness descriptor", e);
        if self.readiness.is_none() {
            self.readiness = Some(Readiness {
                set: crate::sys::ready::ReadySet::new().map_err(err)?,
                ring: false,
                msg: false,
            });
        }
        let rd = self.readiness.as_mut().expect("readiness");
        if !rd.ring {
            if let Some(r) = self.ring.as_mut().filter(|r| !r.is_dead()) {
                let fd = r.notify_fd().map_err(err)?;
                rd.set.add_level(fd, libc::EPOLLIN as u32).map_err(err)?;
                rd.ring = true;
            }
        }
        if !rd.msg && self.msg.is_some() {
            // Only the error queue: EPOLLERR (always reported) on the socket's own wake-ups.
            rd.set.add_edge(self.sock.as_raw_fd(), 0).map_err(err)?;
            rd.msg = true;
        }
        Ok(())
    }

    /// Whether the readiness descriptor polls readable now (for tests and loops that poll
    /// it themselves).
    pub fn readiness_is_set(&self) -> bool {
        self.readiness.as_ref().is_some_and(|r| r.set.is_ready())
    }

    /// Harvests after the readiness descriptor fired (or at any time): clears the
    /// descriptor, runs deferred task work if the kernel flagged some, reaps the error queue,
    /// submits queued sends, and collects completions. Leaves the descriptor set only if
    /// something arrived after the harvest. Returns the number of completions ready.
    pub fn on_ready(&mut self) -> Result<usize, TxError> {
        self.sync_readiness()?;
        // Edges first: an error-queue message that lands after this makes a new one.
        if let Some(rd) = &self.readiness {
            rd.set.consume();
        }
        for _ in 0..4 {
            if let Some(r) = self.ring.as_mut().filter(|r| !r.is_dead()) {
                let sub = r.staged() > 0;
                let res = if sub {
                    r.submit()
                } else {
                    r.reap_notifications()
                };
                self.account_ring(sub);
                if let Err(e) = res {
                    self.ring_failed(e);
                }
            }
            self.reap_and_collect();
            if !self.clear_readiness() {
                break;
            }
        }
        Ok(self.ready.len())
    }

    /// Clears the ring's eventfd after an enter of ours (which may have signalled it), then
    /// looks again: work queued in between is seen here (true: harvest again), work queued
    /// later signals anew. Nothing to do (false) when no descriptor was asked for.
    fn clear_readiness(&mut self) -> bool {
        if !self.readiness.as_ref().is_some_and(|r| r.ring) {
            return false;
        }
        let Some(r) = self.ring.as_mut().filter(|r| !r.is_dead()) else {
            return false;
        };
        r.clear_notify();
        r.has_work()
    }

    /// After a call that may have entered the ring outside [`Sender::on_ready`]: leaves the
    /// descriptor set only for work that is really there.
    fn settle_readiness(&mut self) {
        for _ in 0..4 {
            if !self.clear_readiness() {
                return;
            }
            if let Some(r) = self.ring.as_mut() {
                let res = r.reap_notifications();
                self.account_ring(false);
                if let Err(e) = res {
                    self.ring_failed(e);
                }
            }
            self.reap_and_collect();
        }
    }

    /// Takes the next completion and its buffer.
    pub fn next_completion(&mut self) -> Option<(Completion, PoolBuf)> {
        self.ready.pop_front()
    }

    /// Takes every ready completion.
    pub fn completions(&mut self) -> impl Iterator<Item = (Completion, PoolBuf)> + '_ {
        self.ready.drain(..)
    }

    fn wait_inner(&mut self, timeout: Duration) -> Result<(), TxError> {
        if let Some(r) = self.ring.as_mut() {
            if r.in_flight() > 0
                && r.is_dead()
                && self.msg.as_ref().map_or(true, |m| m.in_flight() == 0)
            {
                // Nothing can come back from an abandoned ring: say so instead of spinning.
                return Err(self.dead_ring_error());
            }
            if r.in_flight() > 0 && !r.is_dead() {
                let sub = r.staged() > 0;
                let res = r.wait(Some(timeout.min(Duration::from_millis(100))));
                self.account_ring(sub);
                if let Err(e) = res {
                    self.ring_failed(e);
                }
            }
        }
        if let Some(m) = self.msg.as_mut() {
            if m.in_flight() > 0 {
                m.wait(timeout.min(Duration::from_millis(100)));
            }
        }
        self.collect();
        Ok(())
    }

    fn submit_all(&mut self) -> Result<(), TxError> {
        while let Some(r) = self.ring.as_mut() {
            if r.staged() == 0 || r.is_dead() {
                break;
            }
            let res = if r.results_pending() {
                r.wait(Some(Duration::from_millis(100)))
            } else {
                r.submit()
            };
            self.account_ring(true);
            if let Err(e) = res {
                self.ring_failed(e);
            }
            self.collect();
        }
        Ok(())
    }

    /// Before a copy or MSG_ZEROCOPY send on a stream, everything queued on the ring must be
    /// in the socket (results in), or the bytes would go out of order.
    fn ordered_for_copy(&mut self) {
        if !self.stream {
            return;
        }
        loop {
            let Some(r) = self.ring.as_mut() else { return };
            if r.is_dead() || (r.staged() == 0 && !r.results_pending()) {
                return;
            }
            let res = r.wait(Some(Duration::from_millis(100)));
            self.account_ring(true);
            if let Err(e) = res {
                // Settles or abandons the ring: either way the loop ends next round.
                self.ring_failed(e);
            }
            self.collect();
        }
    }

    fn route(&mut self, ticket: u64, len: usize) -> Path {
        if self.cfg.mode != TxMode::Auto {
            return self.path;
        }
        let Some(zc) = self.auto.zc else {
            return Path::Copy;
        };
        let d = self.auto.policy.decide(len);
        if d.clock {
            self.auto
                .policy
                .clock(sys::thread_cpu_time().as_nanos() as u64);
        }
        if d.probe {
            self.auto.probe = Some(ticket);
            self.auto.copies = 0;
        }
        self.sync_policy_stats();
        match d.choice {
            Choice::Copy => {
                self.auto.copies += 1;
                Path::Copy
            }
            Choice::ZeroCopy => zc,
        }
    }

    fn sync_policy_stats(&mut self) {
        let p = self.auto.policy.stats();
        self.stats.auto_switches_to_copy = p.switches_to_copy;
        self.stats.auto_reprobes = p.reprobes;
        self.stats.auto_switches_back = p.switches_back;
        self.stats.auto_size_copies = p.size_copies;
        self.stats.auto_windows = p.windows;
        self.stats.auto_explores = p.explores;
        self.stats.auto_drift_explores = p.drift_explores;
        self.stats.auto_copy_below = self.auto.policy.copy_below().map(|b| b as u64);
    }

    /// `auto` sending by copy with a zero-copy probe out: nothing else would collect the
    /// probe's completion (no ring submissions, no error-queue reads on the copy path), so
    /// look for it here. io_uring: no syscall unless the kernel flagged pending task work
    /// (the probe's notification); msg-zc: one error-queue read every 8 copy sends.
    fn collect_probe(&mut self) {
        if let Some(r) = self.ring.as_mut().filter(|r| !r.is_dead()) {
            if r.in_flight() > 0 {
                let res = r.reap_notifications();
                self.account_ring(false);
                if let Err(e) = res {
                    self.ring_failed(e);
                }
            }
        }
        if let Some(m) = self.msg.as_mut() {
            if m.in_flight() > 0 && self.auto.copies % 8 == 0 {
                m.reap();
            }
        }
        self.collect();
    }

    fn observe(&mut self, ticket: u64, status: ZcStatus) {
        if self.cfg.mode != TxMode::Auto {
            return;
        }
        let probe = self.auto.probe == Some(ticket);
        if probe {
            self.auto.probe = None;
        }
        match self.auto.policy.observe(status, probe) {
            Some(Event::SwitchedToCopy { streak, interval }) => {
                if self.auto.policy.stats().switches_to_copy == 1 {
                    let from = self
                        .auto
                        .zc
                        .map_or(stats::Path::TxMode(TxMode::Auto), stats::Path::Tx);
                    let reason = format!(
                        "{streak} zero-copy completions in a row came back COPIED: this path \
                         copies anyway (loopback or local delivery), so zero-copy only adds \
                         notification cost; sending by copy, re-probing every {interval} sends"
                    );
                    self.fallbacks.push(Fallback::new(from, Path::Copy, reason));
                }
                self.path = Path::Copy;
            }
            Some(Event::SwitchedBack) => self.path = self.auto.zc.unwrap_or(Path::Copy),
            None => {}
        }
        self.sync_policy_stats();
    }

    fn syscalls_send(&mut self, n: u64) {
        self.counters.syscalls += n;
        self.stats.send_syscalls += n;
    }

    /// Counts the ring's new `io_uring_enter` calls; `submitting` says whether requests were
    /// queued (the enter submitted sends) or not (it only collected completions).
    fn account_ring(&mut self, submitting: bool) {
        if let Some(r) = &self.ring {
            let w = r.stats().room_waits;
            self.stats.room_waits += w - self.ring_room_seen;
            self.ring_room_seen = w;
            let e = r.enters();
            let d = e - self.ring_enters_seen;
            self.ring_enters_seen = e;
            self.counters.syscalls += d;
            if submitting {
                self.stats.send_syscalls += d;
            } else {
                self.stats.notify_syscalls += d;
            }
        }
    }

    /// `io_uring_enter` failed (`e`): the ring is not used for new sends any more. Requests
    /// it had not handed to the kernel become unsent ranges; once the kernel's requests have
    /// their results, those ranges go out by copy in ticket order, so a stream keeps every
    /// byte once and in order. If the results cannot be collected (the ring cannot be
    /// entered any more), the ring is abandoned and, on a stream, every later send fails with
    /// the error: what the kernel did with its requests is unknown, and sending after them
    /// could reorder or duplicate bytes.
    fn ring_failed(&mut self, e: io::Error) {
        let Some(r) = self.ring.as_mut() else { return };
        if r.is_dead() {
            return;
        }
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        let rec = r.recover(&e, Duration::from_secs(5));
        self.account_ring(true);
        self.fallbacks.push(Fallback::new(
            self.path,
            Path::Copy,
            match rec {
                Recovery::Settled => format!(
                    "io_uring_enter failed: {e}; requests not yet submitted were sent by copy,                      in order"
                ),
                Recovery::Unknown => format!(
                    "io_uring_enter failed: {e}, and the results of requests in the kernel                      cannot be collected; the ring is abandoned (its buffers are not reused)"
                ),
            },
        ));
        self.path = Path::Copy;
        self.auto.zc = None;
        self.retired = true;
        if rec == Recovery::Unknown && self.stream {
            self.broken = Some(errno);
        }
        self.send_unsent();
        self.collect();
    }

    /// The error of waiting on an abandoned ring.
    fn dead_ring_error(&self) -> TxError {
        TxError::Ring(io::Error::new(
            io::ErrorKind::BrokenPipe,
            format!(
                "{} sends are stuck in an io_uring that failed and was abandoned; their \
                 buffers will not come back",
                self.ring.as_ref().map_or(0, |r| r.in_flight())
            ),
        ))
    }

    /// Sends every unsent range of the ring by copy, in ticket order (or, on a broken stream,
    /// fails them).
    fn send_unsent(&mut self) {
        let Some(r) = self.ring.as_mut() else { return };
        let sock = self.sock.clone();
        let chunk = self.chunk;
        let broken = self.broken;
        let (mut calls, mut copies) = (0, 0);
        r.send_unsent(|_, data| {
            if let Some(e) = broken {
                return (0, Some(e));
            }
            let out = copy::send_all(&*sock, data, chunk);
            calls += out.syscalls;
            copies += 1;
            (out.bytes, out.error)
        });
        self.syscalls_send(calls);
        self.stats.room_copies += copies;
    }

    fn push_ready(&mut self, c: Completion, buf: PoolBuf) {
        let Completion {
            ticket,
            len,
            bytes,
            path,
            zerocopy,
            error,
        } = c;
        self.counters.bytes += bytes as u64;
        let i = match path {
            Path::Copy => 0,
            Path::MsgZc => 1,
            Path::UringZc => 2,
            Path::UringZcFixed => 3,
        };
        self.stats.sends_by_path[i] += 1;
        let error = match error {
            Some(SendError::MessageTooBig { .. }) => Some(SendError::MessageTooBig {
                len,
                max: self.max_datagram,
            }),
            e => e,
        };
        self.ready.push_back((
            Completion {
                ticket,
                len,
                bytes,
                path,
                zerocopy,
                error,
            },
            buf,
        ));
    }

    fn collect(&mut self) {
        if let Some(errno) = self.ring.as_ref().and_then(|r| r.gave_up()) {
            if !self.retired {
                self.retire_ring(errno);
            }
        }
        while let Some(d) = self.ring.as_mut().and_then(|r| r.next_done()) {
            self.finish_ring(d);
        }
        let mut dones = Vec::new();
        if let Some(m) = self.msg.as_mut() {
            while let Some(d) = m.next_done() {
                dones.push(d);
            }
        }
        for d in dones {
            self.finish_msg(d);
        }
        if let Some(m) = &self.msg {
            let s = &m.stats;
            let ds = s.send_calls - self.msg_seen.send_calls;
            let dn = s.notify_calls - self.msg_seen.notify_calls;
            self.counters.syscalls += ds + dn;
            self.stats.send_syscalls += ds;
            self.stats.notify_syscalls += dn;
            self.stats.room_waits += s.enobufs_waits - self.msg_seen.enobufs_waits;
            self.stats.room_copies += s.enobufs_copies - self.msg_seen.enobufs_copies;
            self.stats.unmatched_notifications = s.unknown_ids;
            self.stats.queued_errors = s.queued_errors;
            self.msg_seen = s.clone();
        }
    }

    /// The ring stopped submitting by itself (`EOPNOTSUPP`: the socket does no SEND_ZC;
    /// `ENOBUFS`: no room with nothing in flight): once the kernel's requests have their
    /// results, the unsent ranges go by copy in ticket order, and new sends take the copy
    /// path. The ring stays until its buffers are back.
    fn retire_ring(&mut self, errno: i32) {
        let Some(r) = self.ring.as_mut() else { return };
        self.retired = true;
        let reason = match errno {
            libc::EOPNOTSUPP => "SEND_ZC refused by this socket (EOPNOTSUPP): zero-copy needs a \
                                 TCP or UDP socket"
                .to_string(),
            e => format!(
                "SEND_ZC found no room ({}) with nothing in flight: RLIMIT_MEMLOCK or \
                 optmem_max is below one send; sending by copy",
                io::Error::from_raw_os_error(e)
            ),
        };
        self.fallbacks
            .push(Fallback::new(self.path, Path::Copy, reason));
        self.path = Path::Copy;
        self.auto.zc = None;
        let res = r.settle_results(Duration::from_secs(5));
        self.account_ring(true);
        match res {
            Ok(true) => self.send_unsent(),
            Ok(false) => self.ring_failed(io::Error::from_raw_os_error(libc::ETIMEDOUT)),
            Err(e) => self.ring_failed(e),
        }
    }

    fn finish_ring(&mut self, d: SendDone) {
        let meta = self.meta.remove(d.tag).unwrap_or(Meta {
            len: d.buf.len(),
            path: Path::UringZc,
        });
        let mut bytes = d.bytes;
        let mut error = d.error.map(SendError::from_errno);
        for &(off, len) in &d.unsent {
            let out = copy::send_all(&*self.sock, &d.buf[off..off + len], self.chunk);
            self.syscalls_send(out.syscalls);
            self.stats.room_copies += 1;
            bytes += out.bytes;
            if let Some(e) = out.error {
                error.get_or_insert(SendError::from_errno(e));
            }
        }
        self.counters.notifications +=
            u64::from(d.notifs_zerocopy + d.notifs_copied + d.notifs_unknown);
        let status = status_of(d.notifs_zerocopy, d.notifs_copied, d.notifs_unknown);
        self.count_zc(status, d.bytes);
        self.observe(d.tag, status);
        self.push_ready(
            done(d.tag, meta.len, bytes, meta.path, status, error),
            d.buf,
        );
    }

    fn finish_msg(&mut self, d: MsgDone) {
        let meta = self.meta.remove(d.tag).unwrap_or(Meta {
            len: d.buf.len(),
            path: Path::MsgZc,
        });
        self.counters.notifications += u64::from(d.ranges_zc + d.ranges_copied);
        let status = status_of(d.ranges_zc, d.ranges_copied, 0);
        self.count_zc(status, d.zc_bytes);
        self.observe(d.tag, status);
        let error = d.error.map(SendError::from_errno);
        self.push_ready(
            done(
                d.tag,
                meta.len,
                d.zc_bytes + d.copy_bytes,
                meta.path,
                status,
                error,
            ),
            d.buf,
        );
    }

    fn count_zc(&mut self, status: ZcStatus, bytes: usize) {
        match status {
            ZcStatus::ZeroCopy => self.counters.zerocopy_bytes += bytes as u64,
            ZcStatus::Copied | ZcStatus::Mixed => self.counters.copied_bytes += bytes as u64,
            ZcStatus::NotAttempted | ZcStatus::Unknown => {}
        }
    }
}

fn done(
    ticket: u64,
    len: usize,
    bytes: usize,
    path: Path,
    zerocopy: ZcStatus,
    error: Option<SendError>,
) -> Completion {
    Completion {
        ticket: Ticket(ticket),
        len,
        bytes,
        path,
        zerocopy,
        error,
    }
}

fn status_of(zc: u32, copied: u32, unknown: u32) -> ZcStatus {
    match (zc, copied, unknown) {
        (0, 0, 0) => ZcStatus::NotAttempted,
        (_, 0, 0) => ZcStatus::ZeroCopy,
        (0, _, 0) => ZcStatus::Copied,
        (0, 0, _) => ZcStatus::Unknown,
        _ => ZcStatus::Mixed,
    }
}

fn explain_register(e: &io::Error, len: usize) -> String {
    match e.raw_os_error() {
        Some(libc::ENOMEM) => {
            let lim = sys::getrlimit(libc::RLIMIT_MEMLOCK)
                .ok()
                .and_then(|(soft, _)| soft)
                .map_or("unlimited".to_string(), |v| format!("{v} bytes"));
            format!(
                "registering {len} bytes of fixed buffers failed with ENOMEM: RLIMIT_MEMLOCK \
                 ({lim}) is exhausted; raise it (ulimit -l) or grant CAP_IPC_LOCK"
            )
        }
        _ => format!("IORING_REGISTER_BUFFERS failed: {e}"),
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        if self.in_flight() > 0 {
            let _ = self.flush(Duration::from_secs(2));
        }
    }
}

impl AsRawFd for Sender {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }
}

impl Report for Sender {
    type Path = Path;
    fn path(&self) -> Path {
        self.path
    }
    fn counters(&self) -> Counters {
        self.counters.clone()
    }
    fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }
}

#[cfg(test)]
mod tests {
    use super::{Meta, Metas, Path};

    fn m(len: usize) -> Meta {
        Meta {
            len,
            path: Path::UringZc,
        }
    }

    #[test]
    fn ticket_metas_come_back_once_in_any_order_across_gaps() {
        let mut q = Metas::default();
        q.insert(10, m(1));
        q.insert(11, m(2));
        // Tickets 12..14 went by copy: no entry.
        q.insert(15, m(3));
        assert_eq!(q.remove(11).map(|x| x.len), Some(2));
        assert!(q.remove(11).is_none());
        assert!(q.remove(13).is_none());
        assert_eq!(q.remove(10).map(|x| x.len), Some(1));
        assert_eq!(
            q.base, 15,
            "the front advances past taken and empty tickets"
        );
        assert_eq!(q.remove(15).map(|x| x.len), Some(3));
        assert!(q.q.is_empty());
        assert!(q.remove(9).is_none());
        q.insert(100, m(4));
        assert_eq!(q.remove(100).map(|x| x.len), Some(4));
    }
}

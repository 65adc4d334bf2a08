//! Zero-copy send with completions: [`SendRing`] for any number of sockets on one io_uring
//! per thread, and [`Sender`], the same for one socket.
//!
//! A [`SendRing`] carries the sends of every socket added to it ([`SendRing::add`], TCP or
//! UDP, IPv4 or IPv6) on one io_uring: one registration of the send pool (fixed buffers), one
//! sparse registered-file table, one `io_uring_enter` that submits for every socket with
//! queued work and posts the completions of all of them. Each socket keeps its own order
//! (the TCP chain rules in `docs/design/tx.md`) and its own accounting (a
//! `tx::core::SendTracker`). Paths ([`Path`]), per socket:
//!
//! - `uring-zc`: io_uring `SEND_ZC` with `IORING_SEND_ZC_REPORT_USAGE` (Linux 6.0 / 6.2);
//!   completions and notifications are CQEs, read without a syscall;
//! - `uring-zc-fixed`: the same from a registered (fixed) pool, no page pinning per send;
//! - `uring-copy`: io_uring `SEND`: the kernel copies, batched with everything else;
//! - `msg-zc`: `send(MSG_ZEROCOPY)` with `SO_ZEROCOPY` and the batched error-queue reaper
//!   (without io_uring);
//! - `copy`: plain `send` (without io_uring, or when asked for).
//!
//! [`TxMode::Auto`] probes when the socket is added (io_uring and `SEND_ZC`, else
//! `SO_ZEROCOPY`) and, while sending, watches the completions: when they report that the
//! kernel copied anyway (loopback, local delivery over veth), it sends that socket's data by
//! copy — on the ring, `uring-copy` — and re-probes now and then. Every path not taken is
//! recorded as a [`Fallback`](crate::stats::Fallback) with its reason.
//!
//! Nothing blocks inside a call but the explicit waits ([`SendRing::wait`],
//! [`SendRing::flush`]): a send that cannot be queued (the socket's `depth` of sends in
//! flight, a full socket buffer or no room for zero-copy on the syscall paths) comes back at
//! once as [`Refused`], with the buffer, and the socket is reported by
//! [`SendRing::next_writable`] when it can take sends again.
//!
//! Ownership: a send takes its buffer ([`TxBuf`]: a pool buffer or a received chunk) by value
//! and returns a [`Ticket`]; the buffer comes back exactly once, with its [`Completion`], after
//! the kernel's last reference to it is gone. A buffer cannot be touched while the kernel may
//! read it:
//!
//! ```compile_fail,E0382
//! use zcio::PoolBuf;
//! use zcio::tx::Sender;
//! fn reuse(sender: &mut Sender, mut buf: PoolBuf) {
//!     let _ticket = sender.send(buf);
//!     buf[0] = 1; // error[E0382]: borrow of moved value: `buf`
//! }
//! ```
//!
//! Many sockets on one ring:
//!
//! ```no_run
//! use std::net::TcpStream;
//! use std::time::Duration;
//! use zcio::tx::{Pool, SendRing, SendRingConfig, SenderConfig, TxMode};
//! let pool = Pool::new(16 << 10, 1024, false)?;
//! let mut ring = SendRing::new(&SendRingConfig::default())?;
//! ring.register_pool(&pool); // once, for every socket; a failure is a recorded fallback
//! let mut socks = Vec::new();
//! for _ in 0..100 {
//!     let s = TcpStream::connect("127.0.0.1:5001")?;
//!     socks.push(ring.add(s, &SenderConfig::new(TxMode::Auto))?);
//! }
//! for &sock in &socks {
//!     let mut buf = pool.try_get().unwrap();
//!     buf.fill(7);
//!     if let Err(refused) = ring.send(sock, buf) {
//!         // Backpressure: the buffer is ours again; retry once `next_writable` names `sock`.
//!         drop(refused.buf);
//!     }
//! }
//! ring.submit()?; // one io_uring_enter for all of them
//! ring.flush(Duration::from_secs(5))?;
//! while let Some((done, buf)) = ring.next_completion() {
//!     assert!(done.result().is_ok());
//!     drop(buf); // back to the pool
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Many UDP peers from one unconnected socket (one GSO train per send, many trains per kernel
//! entry), and a header plus a body as one request:
//!
//! ```no_run
//! use std::net::{SocketAddr, TcpStream, UdpSocket};
//! use zcio::tx::{Dest, Pool, SendRing, SendRingConfig, SenderConfig, TxBuf, TxMode};
//! let pool = Pool::new(64 << 10, 1024, false)?;
//! let mut ring = SendRing::new(&SendRingConfig::default())?;
//! ring.register_pool(&pool)?;
//! let udp = ring.add(UdpSocket::bind("0.0.0.0:4433")?, &SenderConfig::new(TxMode::Auto))?;
//! let peers: Vec<SocketAddr> = vec!["198.18.0.2:4433".parse()?, "198.18.0.3:4433".parse()?];
//! for peer in &peers {
//!     let mut train = pool.try_get().unwrap();
//!     train.set_len(44 * 1472); // 44 datagrams of 1,472 bytes
//!     ring.send_to_with(udp, train, &Dest::new(*peer).segment(1472).ecn(2), 0)?;
//! }
//! let tcp = ring.add(TcpStream::connect("198.18.0.2:80")?, &SenderConfig::new(TxMode::Auto))?;
//! let head = b"HTTP/1.1 200 OK\r\ncontent-length: 65536\r\n\r\n".to_vec();
//! let body = pool.try_get().unwrap();
//! ring.send_vectored(tcp, vec![TxBuf::Vec(head), TxBuf::Pool(body)], 7)?;
//! ring.flush(std::time::Duration::from_secs(5))?;
//! while let Some((done, buf)) = ring.next_completion() {
//!     // An unreachable peer fails its own train (done.result()); the others went.
//!     if let Some(parts) = buf.into_slices() {
//!         assert_eq!(parts.len(), 2); // the header and the body, in order
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! One socket:
//!
//! ```no_run
//! use std::net::TcpStream;
//! use std::time::Duration;
//! use zcio::Pool;
//! use zcio::tx::{Sender, SenderConfig, TxMode};
//! let pool = Pool::new(64 << 10, 32, false)?;
//! let sock = TcpStream::connect("127.0.0.1:5001")?;
//! let mut tx = Sender::new(sock, &pool, SenderConfig::new(TxMode::Auto))?;
//! let mut buf = pool.try_get().unwrap();
//! buf.fill(7);
//! let ticket = tx.send(buf).expect("room for a first send");
//! tx.flush(Duration::from_secs(5))?;
//! let (done, buf) = tx.next_completion().unwrap();
//! assert_eq!(done.ticket, ticket);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod copy;
pub(crate) mod core;
mod msgzc;
mod policy;
mod ring;
mod sender;
mod sock;
mod uring;

pub use crate::buf::pool::{Pool, PoolBuf};
pub use ring::{SendRing, SendRingConfig};
pub use sender::Sender;

use crate::buf::lent::Lent;
use crate::rx::{ConnId, RxChunk, RxPath};
use serde::Serialize;
use std::io;
use std::time::Duration;

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
    /// io_uring `SEND` (the kernel copies; batched on the ring).
    UringCopy,
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
            "uring-copy" => TxMode::UringCopy,
            "auto" => TxMode::Auto,
            other => {
                return Err(format!(
                    "unknown tx mode '{other}' (use copy, msg-zc, uring-zc, uring-zc-fixed, \
                     uring-copy or auto)"
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
            TxMode::UringCopy => "uring-copy",
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
    /// io_uring `SEND` (copied by the kernel).
    UringCopy,
}

impl Path {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Path::Copy => "copy",
            Path::MsgZc => "msg-zc",
            Path::UringZc => "uring-zc",
            Path::UringZcFixed => "uring-zc-fixed",
            Path::UringCopy => "uring-copy",
        }
    }

    /// Whether the path lends the pages to the kernel (zero-copy attempted).
    pub fn is_zero_copy(self) -> bool {
        matches!(self, Path::MsgZc | Path::UringZc | Path::UringZcFixed)
    }

    /// Whether the path goes through io_uring.
    pub fn is_uring(self) -> bool {
        matches!(self, Path::UringZc | Path::UringZcFixed | Path::UringCopy)
    }

    /// Index in [`TxStats::sends_by_path`].
    pub fn index(self) -> usize {
        match self {
            Path::Copy => 0,
            Path::MsgZc => 1,
            Path::UringZc => 2,
            Path::UringZcFixed => 3,
            Path::UringCopy => 4,
        }
    }
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Settings of one socket (of a [`Sender`], or added to a [`SendRing`]).
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// Path to use.
    pub mode: TxMode,
    /// Most sends of this socket owned by the kernel at once; beyond, a send is
    /// [`Refused`] with [`Refusal::Depth`] (backpressure).
    pub depth: usize,
    /// `msg-zc`: reap the error queue (without blocking) after this many accepted calls.
    pub notify_limit: usize,
    /// [`Sender`]: enter the kernel once this many requests are queued (1 = every send).
    /// A [`SendRing`] takes its own ([`SendRingConfig::submit_batch`]).
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
    /// measured on this thread's sends (see `docs/design/tx.md`). Off: every size goes
    /// zero-copy unless COPIED completions say the path copies anyway.
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

/// Identifies one send; its [`Completion`] carries the same ticket. Unique per
/// [`SendRing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Ticket(pub u64);

/// A socket of a [`SendRing`]. Not reused while it or its sends are alive: a stale id is
/// refused ([`Refusal::Closed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SockId {
    idx: u32,
    gen: u32,
}

impl SockId {
    /// Slot index (small, reused after the socket and its sends are gone).
    pub fn index(self) -> usize {
        self.idx as usize
    }

    /// The id as one integer (for C and for maps): generation in the high 32 bits.
    pub fn raw(self) -> u64 {
        (u64::from(self.gen) << 32) | u64::from(self.idx)
    }

    /// The id of [`SockId::raw`].
    pub fn from_raw(v: u64) -> Self {
        Self {
            idx: v as u32,
            gen: (v >> 32) as u32,
        }
    }
}

impl std::fmt::Display for SockId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sock#{}.{}", self.idx, self.gen)
    }
}

/// A buffer to send, owned until its completion hands it back.
#[derive(Debug)]
pub enum TxBuf {
    /// A pool buffer: sent as a fixed buffer when its pool is registered with the ring.
    Pool(PoolBuf),
    /// Bytes received by a [`Receiver`](crate::rx::Receiver) (a provided buffer, a zcrx area
    /// range or a heap buffer): sent in place, and recycled (by dropping the chunk) only
    /// after the kernel is done with them. What a proxy forwards.
    Chunk(RxChunk),
    /// An owned vector (convenient, not zero-copy friendly: the pages are pinned per send).
    /// A small header sent before pool buffers in one vectored send is one of these.
    Vec(Vec<u8>),
    /// The slices of one vectored send ([`SendRing::send_vectored`]), in order: they went as
    /// one request and come back together, each as it was given.
    Slices(Vec<TxBuf>),
    /// Owned, immutable bytes (`bytes::Bytes`, e.g. a response body): lent to the kernel
    /// as they are (zero-copy without a pool; the pages are pinned per send) and dropped
    /// after the kernel's last reference, when the completion hands them back.
    Bytes(bytes::Bytes),
}

impl TxBuf {
    /// Bytes to send.
    pub fn len(&self) -> usize {
        match self {
            TxBuf::Pool(b) => b.len(),
            TxBuf::Chunk(c) => c.len(),
            TxBuf::Vec(v) => v.len(),
            TxBuf::Bytes(b) => b.len(),
            TxBuf::Slices(v) => v.iter().map(TxBuf::len).sum(),
        }
    }

    /// The bytes of a single buffer (`None` for [`TxBuf::Slices`]: see [`TxBuf::slices`]).
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            TxBuf::Pool(b) => Some(b),
            TxBuf::Chunk(c) => Some(c),
            TxBuf::Vec(v) => Some(v),
            TxBuf::Bytes(b) => Some(b),
            TxBuf::Slices(_) => None,
        }
    }

    /// Every slice, in order (one for a single buffer).
    pub fn slices(&self) -> Vec<&[u8]> {
        match self {
            TxBuf::Slices(v) => v.iter().flat_map(TxBuf::slices).collect(),
            b => vec![b.as_bytes().expect("a single buffer")],
        }
    }

    /// The slices of a vectored send, if it is one.
    pub fn into_slices(self) -> Option<Vec<TxBuf>> {
        match self {
            TxBuf::Slices(v) => Some(v),
            _ => None,
        }
    }

    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pool buffer, if it is one.
    pub fn into_pool(self) -> Option<PoolBuf> {
        match self {
            TxBuf::Pool(b) => Some(b),
            _ => None,
        }
    }

    /// The received chunk, if it is one.
    pub fn into_chunk(self) -> Option<RxChunk> {
        match self {
            TxBuf::Chunk(c) => Some(c),
            _ => None,
        }
    }

    /// Takes the buffer apart for a backend: the bytes' owner, and what makes a chunk again.
    pub(crate) fn into_lent(self) -> (Lent, Option<(ConnId, RxPath)>) {
        match self {
            TxBuf::Pool(b) => (Lent::Pool(b), None),
            TxBuf::Vec(v) => (Lent::Vec(v), None),
            TxBuf::Bytes(b) => (Lent::Bytes(b), None),
            // Never lent whole (send_vectored takes slices apart with into_lent each).
            TxBuf::Slices(v) => (
                Lent::Vec(
                    v.iter()
                        .flat_map(TxBuf::slices)
                        .flatten()
                        .copied()
                        .collect(),
                ),
                None,
            ),
            TxBuf::Chunk(c) => {
                let (conn, path, data) = c.into_parts();
                (data, Some((conn, path)))
            }
        }
    }

    /// Puts a buffer taken apart with [`TxBuf::into_lent`] back together.
    pub(crate) fn from_lent(lent: Lent, chunk: Option<(ConnId, RxPath)>) -> TxBuf {
        match (lent, chunk) {
            (data, Some((conn, path))) => TxBuf::Chunk(RxChunk::from_parts(conn, path, data)),
            (Lent::Pool(b), None) => TxBuf::Pool(b),
            (Lent::Vec(v), None) => TxBuf::Vec(v),
            (Lent::Bytes(b), None) => TxBuf::Bytes(b),
            // A received buffer without its chunk's metadata cannot be told apart; never made.
            (other, None) => TxBuf::Vec(other.to_vec()),
        }
    }
}

impl From<PoolBuf> for TxBuf {
    fn from(b: PoolBuf) -> Self {
        TxBuf::Pool(b)
    }
}

impl From<RxChunk> for TxBuf {
    fn from(c: RxChunk) -> Self {
        TxBuf::Chunk(c)
    }
}

impl From<Vec<u8>> for TxBuf {
    fn from(v: Vec<u8>) -> Self {
        TxBuf::Vec(v)
    }
}

impl From<bytes::Bytes> for TxBuf {
    fn from(b: bytes::Bytes) -> Self {
        TxBuf::Bytes(b)
    }
}

/// Where one datagram (or GSO train of datagrams) of an unconnected UDP socket goes, and how:
/// [`SendRing::send_to_with`]. On the ring it is one `IORING_OP_SENDMSG_ZC` with the
/// destination in the `msghdr` and the segment size as a `UDP_SEGMENT` control message (the
/// way quinn-udp sends a QUIC train), without the ring `sendmsg(MSG_ZEROCOPY)` with the same
/// control messages, or a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Dest {
    /// The peer.
    pub addr: std::net::SocketAddr,
    /// GSO segment size: a buffer longer than this is cut into datagrams of `segment` bytes
    /// (the last one shorter) by the kernel or the NIC; at most
    /// [`MAX_SEGMENTS`] datagrams per send. `None`: the buffer is one datagram.
    pub segment: Option<u16>,
    /// `IP_TOS` / `IPV6_TCLASS` of these datagrams (DSCP << 2 | ECN); `None`: the socket's.
    pub tos: Option<u8>,
}

/// Most slices of one vectored send ([`SendRing::send_vectored`]).
pub const MAX_SLICES: usize = crate::sys::msg::MAX_IOV;

/// Most datagrams one [`Dest`] send may be cut into (`UDP_MAX_SEGMENTS` of Linux ≤ 6.9).
pub const MAX_SEGMENTS: usize = crate::sys::msg::MAX_SEGMENTS;

impl Dest {
    /// One datagram to `addr`.
    pub fn new(addr: std::net::SocketAddr) -> Self {
        Self {
            addr,
            segment: None,
            tos: None,
        }
    }

    /// Datagrams of `segment` bytes (GSO).
    pub fn segment(mut self, segment: u16) -> Self {
        self.segment = Some(segment);
        self
    }

    /// The whole TOS / traffic class byte.
    pub fn tos(mut self, tos: u8) -> Self {
        self.tos = Some(tos);
        self
    }

    /// The ECN codepoint (0–3: Not-ECT, ECT(1), ECT(0), CE) in the low two bits of the TOS
    /// byte, keeping the DSCP set with [`Dest::tos`].
    pub fn ecn(mut self, ecn: u8) -> Self {
        self.tos = Some((self.tos.unwrap_or(0) & !3) | (ecn & 3));
        self
    }

    pub(crate) fn opts(&self) -> crate::sys::msg::MsgOpts {
        crate::sys::msg::MsgOpts {
            dest: Some(self.addr),
            segment: self.segment,
            tos: self.tos,
        }
    }
}

/// Why a send was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Refusal {
    /// The socket has `depth` sends in flight: retry after one of its completions (the socket
    /// is then reported by [`SendRing::next_writable`]).
    Depth,
    /// The socket buffer is full (copy and `MSG_ZEROCOPY` paths, which have no kernel queue
    /// of their own): retry when the socket is writable again ([`SendRing::next_writable`]).
    SocketFull,
    /// Zero-copy has no room (`ENOBUFS`: the socket's `optmem_max` budget for notifications,
    /// or `RLIMIT_MEMLOCK` for pinned pages) until notifications come back.
    NoRoom,
    /// The socket was closed (or the id is stale): not a backpressure, do not retry.
    Closed,
}

impl Refusal {
    /// Whether retrying later may succeed (everything but [`Refusal::Closed`]).
    pub fn is_backpressure(self) -> bool {
        self != Refusal::Closed
    }

    /// The errno the C ABI returns: `EAGAIN` for backpressure, `EBADF` for a closed socket.
    pub fn errno(self) -> i32 {
        if self.is_backpressure() {
            libc::EAGAIN
        } else {
            libc::EBADF
        }
    }
}

/// A send that was not queued: the buffer, still the caller's, and why.
#[derive(Debug)]
pub struct Refused<B> {
    /// The buffer, untouched.
    pub buf: B,
    /// Why.
    pub reason: Refusal,
}

impl<B> std::fmt::Display for Refused<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.reason {
            Refusal::Depth => f.write_str("send refused: the socket's depth of sends is in flight (retry when it is writable)"),
            Refusal::SocketFull => f.write_str("send refused: the socket buffer is full (retry when it is writable)"),
            Refusal::NoRoom => f.write_str("send refused: no room for zero-copy until notifications come back (retry when it is writable)"),
            Refusal::Closed => f.write_str("send refused: the socket is closed"),
        }
    }
}

impl<B: std::fmt::Debug> std::error::Error for Refused<B> {}

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
    /// The send cannot be made as asked (a destination of the wrong family, a GSO train of
    /// more than [`MAX_SEGMENTS`] segments, a segment size of 0, a destination on a stream
    /// socket); nothing was sent.
    #[error("{reason} ({})", io::Error::from_raw_os_error(*errno))]
    Invalid {
        /// errno (`EINVAL`, `EAFNOSUPPORT`, `EISCONN`).
        errno: i32,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// The socket was closed ([`SendRing::close`]) before this send went out in full.
    #[error("the socket was closed before the send went out in full (ECANCELED)")]
    Closed,
    /// Another error from the kernel.
    #[error("send failed: {}", io::Error::from_raw_os_error(*errno))]
    Os {
        /// errno.
        errno: i32,
    },
}

impl SendError {
    pub(crate) fn from_errno(errno: i32) -> Self {
        match errno {
            libc::ECONNRESET
            | libc::EPIPE
            | libc::ENOTCONN
            | libc::ECONNABORTED
            | libc::ETIMEDOUT
            | libc::ECONNREFUSED => SendError::Connection { errno },
            libc::EMSGSIZE => SendError::MessageTooBig { len: 0, max: 0 },
            libc::ECANCELED => SendError::Closed,
            _ => SendError::Os { errno },
        }
    }

    /// The errno (positive).
    pub fn errno(&self) -> i32 {
        match self {
            SendError::MessageTooBig { .. } => libc::EMSGSIZE,
            SendError::Connection { errno }
            | SendError::Os { errno }
            | SendError::Invalid { errno, .. } => *errno,
            SendError::Closed => libc::ECANCELED,
        }
    }
}

/// How one send ended. Each accepted send produces exactly one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Completion {
    /// The send's ticket.
    pub ticket: Ticket,
    /// The socket it went to.
    pub sock: SockId,
    /// The caller's token ([`SendRing::send_with`]; 0 otherwise).
    pub token: u64,
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

/// Errors creating or driving a [`SendRing`] or [`Sender`].
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
    /// Registering a pool with the ring failed (recorded as a fallback too).
    #[error("{reason}")]
    Register {
        /// What failed and what to do.
        reason: String,
        /// The error (`ENOMEM`: `RLIMIT_MEMLOCK` exhausted).
        #[source]
        source: io::Error,
    },
}

impl TxError {
    /// The errno the C ABI returns for this error (positive).
    pub fn errno(&self) -> i32 {
        match self {
            TxError::Socket { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            TxError::Timeout { .. } => libc::ETIMEDOUT,
            TxError::Ring(e) => e.raw_os_error().unwrap_or(libc::EIO),
            TxError::Register { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

impl TxError {
    /// The [`io::ErrorKind`] this error is of: the kernel error's kind where there is one,
    /// [`io::ErrorKind::TimedOut`] for a timeout.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            TxError::Socket { source, .. } | TxError::Register { source, .. } => source.kind(),
            TxError::Timeout { .. } => io::ErrorKind::TimedOut,
            TxError::Ring(e) => e.kind(),
        }
    }
}

/// For `?` in functions returning `io::Result`: the kind is kept ([`TxError::kind`]), the
/// message and the error itself are inside (`get_ref`, `source`).
impl From<TxError> for io::Error {
    fn from(e: TxError) -> Self {
        io::Error::new(e.kind(), e)
    }
}

/// A failed send as an `io::Error` of the errno's kind (`ECONNRESET`: `ConnectionReset`,
/// `EPIPE`: `BrokenPipe`, ...), with the message of the send error.
impl From<SendError> for io::Error {
    fn from(e: SendError) -> Self {
        io::Error::new(io::Error::from_raw_os_error(e.errno()).kind(), e)
    }
}

pub(crate) fn sock_err(what: impl Into<String>, source: io::Error) -> TxError {
    TxError::Socket {
        what: what.into(),
        source,
    }
}

/// Per-path counters beyond [`Counters`](crate::stats::Counters).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TxStats {
    /// Syscalls made to send (send calls, io_uring_enter calls that submitted).
    pub send_syscalls: u64,
    /// Syscalls made only to collect completions (recvmsg on the error queue, poll,
    /// io_uring_enter calls that only waited).
    pub notify_syscalls: u64,
    /// Sends completed by path: copy, msg-zc, uring-zc, uring-zc-fixed, uring-copy
    /// ([`Path::index`]).
    pub sends_by_path: [u64; 5],
    /// Sends refused because `depth` sends were in flight.
    pub depth_refusals: u64,
    /// Sends refused because the socket buffer was full (copy and msg-zc paths).
    pub full_refusals: u64,
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
    /// `auto`: switches to copy that followed the route's COPIED verdict, found by the
    /// completions of other sockets to the same peer (no probe of this socket's own).
    pub auto_route_verdicts: u64,
    /// `auto`: sends that went by copy because their pool was running dry while the ring's
    /// zero-copy sends held its buffers (their notifications wait for the peer's ACKs).
    pub auto_pool_copies: u64,
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
    /// Bytes the peer had not acknowledged when a close reset the TCP connection (`SIOCOUTQ`,
    /// read just before the reset): the kernel accepted them, the reset purged them, and they
    /// are not in `bytes` (nor `zerocopy_bytes`/`copied_bytes`) of the sends they were in.
    pub reset_purged_bytes: u64,
    /// Of those, bytes of sends that had completed before the close (copy sends complete when
    /// the socket took the bytes): their completions had counted them.
    pub reset_purged_reported: u64,
    /// Of the purged bytes, those already sent (`SIOCOUTQ - SIOCOUTQNSD`): the peer may have
    /// received them (on loopback it usually has; a peer whose receive buffer was full, or a
    /// network, may have dropped them). What a peer received lies between the completions'
    /// bytes and that much more.
    pub reset_unacked_bytes: u64,
}

impl TxStats {
    /// Adds `o`'s counts to these (the learned threshold is taken from `o` when it has one).
    pub fn add(&mut self, o: &TxStats) {
        self.send_syscalls += o.send_syscalls;
        self.notify_syscalls += o.notify_syscalls;
        for (a, b) in self.sends_by_path.iter_mut().zip(o.sends_by_path) {
            *a += b;
        }
        self.depth_refusals += o.depth_refusals;
        self.full_refusals += o.full_refusals;
        self.room_waits += o.room_waits;
        self.room_copies += o.room_copies;
        self.auto_switches_to_copy += o.auto_switches_to_copy;
        self.auto_reprobes += o.auto_reprobes;
        self.auto_switches_back += o.auto_switches_back;
        self.auto_size_copies += o.auto_size_copies;
        self.auto_route_verdicts += o.auto_route_verdicts;
        self.auto_pool_copies += o.auto_pool_copies;
        self.auto_windows += o.auto_windows;
        self.auto_explores += o.auto_explores;
        self.auto_drift_explores += o.auto_drift_explores;
        if o.auto_copy_below.is_some() {
            self.auto_copy_below = o.auto_copy_below;
        }
        self.unmatched_notifications += o.unmatched_notifications;
        self.queued_errors += o.queued_errors;
        self.reset_purged_bytes += o.reset_purged_bytes;
        self.reset_purged_reported += o.reset_purged_reported;
        self.reset_unacked_bytes += o.reset_unacked_bytes;
    }
}

pub(crate) fn status_of(zc: u32, copied: u32, unknown: u32) -> ZcStatus {
    match (zc, copied, unknown) {
        (0, 0, 0) => ZcStatus::NotAttempted,
        (_, 0, 0) => ZcStatus::ZeroCopy,
        (0, _, 0) => ZcStatus::Copied,
        (0, 0, _) => ZcStatus::Unknown,
        _ => ZcStatus::Mixed,
    }
}

pub(crate) fn explain_register(e: &io::Error, len: usize) -> String {
    match e.raw_os_error() {
        Some(libc::ENOMEM) => {
            let lim = crate::sys::getrlimit(libc::RLIMIT_MEMLOCK)
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

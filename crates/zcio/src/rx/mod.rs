//! Receive with as few copies and syscalls as the host allows: one [`Receiver`] over three
//! backends, best first:
//!
//! - **zcrx** (Linux 6.15): an rx queue of the NIC is bound to user memory; `RECV_ZC`
//!   completions (CQE32) name ranges of that memory; ranges go back through the refill ring
//!   when the application drops its [`RxChunk`]. Needs a NIC with header split and flow
//!   steering (see [`zcrx::check_interface`]).
//! - **bufring** (5.19+): multishot `RECV` selecting from a provided-buffer ring, with bundles
//!   (6.10) or incremental consumption (6.12); one `io_uring_enter` harvests many receives.
//! - **plain**: level-triggered epoll and `recv(2)`.
//!
//! Chunks come in stream order per connection; many connections share one ring; a server
//! hands its listener over and gets [`RxEvent::Accepted`] from a multishot accept. A consumer
//! that holds chunks gets backpressure: when every buffer is lent, receives stay disarmed
//! (the kernel's socket buffer fills and TCP slows the sender) until chunks come back.
//! Nothing is dropped.
//!
//! ```
//! use std::io::Write;
//! use std::time::Duration;
//! use zcio::rx::{Receiver, RxConfig, RxEvent, RxMode};
//!
//! let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr()?;
//! let mut rx = Receiver::listen(listener, &RxConfig::with_mode(RxMode::Auto))?;
//! std::thread::spawn(move || std::net::TcpStream::connect(addr)?.write_all(b"hello"));
//! let (mut got, mut done) = (Vec::new(), false);
//! while !done {
//!     rx.poll(Duration::from_secs(1), &mut |ev| match ev {
//!         RxEvent::Accepted(_) => {}
//!         RxEvent::Data(chunk) => got.extend_from_slice(&chunk), // chunk dropped: returned
//!         RxEvent::Closed(_, _) => done = true,
//!     })?;
//! }
//! assert_eq!(got, b"hello");
//! println!("{} ({:?})", rx.describe(), rx.fallbacks());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod plain;
mod uring;
pub mod zcrx;

use crate::buf::lent::Lent;
use crate::ring::recv::Lease;
use crate::ring::zcrx::IfqError;
use crate::ring::RingError;
use crate::stats::{Counters, Fallback, Report};
use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::time::Duration;

/// Which backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum RxMode {
    /// epoll + `recv(2)`.
    Plain,
    /// Multishot receive into a provided-buffer ring.
    BufRing,
    /// io_uring zero-copy receive.
    Zcrx,
    /// The best that works here: zcrx, else bufring, else plain; each step down recorded as
    /// a [`Fallback`].
    Auto,
}

impl std::str::FromStr for RxMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "plain" => Ok(Self::Plain),
            "bufring" => Ok(Self::BufRing),
            "zcrx" => Ok(Self::Zcrx),
            "auto" => Ok(Self::Auto),
            _ => Err(format!("unknown rx mode {s:?} (plain|bufring|zcrx|auto)")),
        }
    }
}

/// The path that delivered a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum RxPath {
    /// Copied by `recv(2)` into a user buffer.
    Plain,
    /// Copied by the kernel into a provided buffer, delivered by a multishot receive.
    BufRing,
    /// Written by the NIC into the zcrx area; no copy.
    Zcrx,
    /// Device-less zcrx (`ZCRX_REG_NODEV`, Linux 7.1): `RECV_ZC` completions over the zcrx
    /// area and refill ring, but the kernel copied the bytes into the area (no NIC DMA).
    ZcrxNodev,
}

impl RxPath {
    /// Short name: `plain`, `bufring`, `zcrx`, `zcrx-nodev`.
    pub fn name(self) -> &'static str {
        match self {
            RxPath::Plain => "plain",
            RxPath::BufRing => "bufring",
            RxPath::Zcrx => "zcrx",
            RxPath::ZcrxNodev => "zcrx-nodev",
        }
    }

    /// Whether the kernel copied the bytes this path delivers (all but NIC zcrx).
    pub fn copies(self) -> bool {
        self != RxPath::Zcrx
    }
}

impl std::fmt::Display for RxPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where zcrx binds: an interface rx queue, or no device at all.
#[derive(Debug, Clone)]
pub struct ZcrxTarget {
    /// Interface name (ignored when `deviceless`).
    pub iface: String,
    /// Rx queue index (flows must be steered to it; ignored when `deviceless`).
    pub queue: u32,
    /// Register without a device (`ZCRX_REG_NODEV`, Linux 7.1): `RECV_ZC` works on any TCP
    /// socket, and the kernel copies every byte into the area (COPIED fraction 1).
    pub deviceless: bool,
    /// Area size in bytes.
    pub area_len: usize,
    /// Refill ring entries.
    pub rq_entries: u32,
    /// Put the area on huge pages if possible.
    pub huge_pages: bool,
}

impl ZcrxTarget {
    /// A target with default sizes (16 MiB area on huge pages, 4096 refill entries).
    pub fn new(iface: &str, queue: u32) -> Self {
        Self {
            iface: iface.to_string(),
            queue,
            area_len: 16 << 20,
            rq_entries: 4096,
            huge_pages: true,
            deviceless: false,
        }
    }

    /// A device-less target (`ZCRX_REG_NODEV`): 8 MiB area of 4 KiB pages, 4096 refill
    /// entries (more than the area has pages, so returns never wait for room).
    pub fn deviceless() -> Self {
        Self {
            iface: String::new(),
            queue: 0,
            area_len: 8 << 20,
            rq_entries: 4096,
            huge_pages: false,
            deviceless: true,
        }
    }

    pub(crate) fn bind(&self) -> crate::ring::zcrx::ZcrxBind<'_> {
        if self.deviceless {
            crate::ring::zcrx::ZcrxBind::NoDev
        } else {
            crate::ring::zcrx::ZcrxBind::Queue {
                iface: &self.iface,
                queue: self.queue,
            }
        }
    }
}

/// Receiver settings. [`RxConfig::default`] is the measured best for bulk TCP here (see
/// `docs/design/rx.md`).
#[derive(Debug, Clone)]
pub struct RxConfig {
    /// Backend choice.
    pub mode: RxMode,
    /// Bytes per buffer (bufring and plain).
    pub buf_size: u32,
    /// Buffers in the ring (a power of two); also the plain backend's limit of buffers lent.
    pub buffers: u16,
    /// Bytes of buffers kept in the ring at once (at least 2 buffers); the other buffers wait
    /// in a stack and the most recently returned is reused first, so the kernel copies into
    /// cache-warm memory. The rest serve as slack for chunks the application holds and for
    /// sustained demand (the rotation doubles when the ring runs dry in two waits in a row and
    /// shrinks back after 64 quiet waits). 0 = all buffers in the ring (FIFO rotation).
    pub hot_bytes: usize,
    /// Use receive bundles where the kernel has them (`None`: yes if available).
    pub bundle: Option<bool>,
    /// Incremental buffer consumption (`IOU_PBUF_RING_INC`); not combined with bundles.
    pub incremental: bool,
    /// Completions to gather per wait (with `min_wait`); 1 = return on the first.
    pub batch: usize,
    /// How long a wait may hold a first completion back while gathering `batch`.
    pub min_wait: Duration,
    /// zcrx interface queue (or [`ZcrxTarget::deviceless`]); with [`RxMode::Auto`] and
    /// `None`, loopback listeners try `lo`; with [`RxMode::Zcrx`] and `None`, device-less.
    pub zcrx: Option<ZcrxTarget>,
    /// Buffers on huge pages if possible.
    pub huge_pages: bool,
    /// Ask for `IORING_SETUP_DEFER_TASKRUN` (receives run only when the receiver enters the
    /// kernel, in its own context); off = `COOP_TASKRUN` only.
    pub defer_taskrun: bool,
}

impl Default for RxConfig {
    fn default() -> Self {
        Self {
            mode: RxMode::Auto,
            buf_size: 64 << 10,
            buffers: 256,
            hot_bytes: 1 << 20,
            bundle: None,
            incremental: false,
            batch: 32,
            min_wait: Duration::from_micros(200),
            zcrx: None,
            huge_pages: false,
            defer_taskrun: true,
        }
    }
}

impl RxConfig {
    /// Default settings with `mode`.
    pub fn with_mode(mode: RxMode) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    /// Return from a wait on the first completion (no batching): lowest latency, more
    /// `io_uring_enter` calls when data trickles in.
    pub fn low_latency(mut self) -> Self {
        self.batch = 1;
        self.min_wait = Duration::ZERO;
        self
    }
}

/// A connection handled by a [`Receiver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId {
    idx: u32,
    gen: u32,
}

impl ConnId {
    /// Slot index (small, reused after close).
    pub fn index(self) -> usize {
        self.idx as usize
    }
    fn tag(self) -> u64 {
        (u64::from(self.gen) << 32) | u64::from(self.idx)
    }
    fn from_tag(tag: u64) -> Self {
        Self {
            idx: tag as u32,
            gen: (tag >> 32) as u32,
        }
    }
}

impl std::fmt::Display for ConnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "conn#{}.{}", self.idx, self.gen)
    }
}

impl From<Lease> for Lent {
    fn from(l: Lease) -> Lent {
        match l {
            Lease::Buf(b) => Lent::Ring(b),
            Lease::Zcrx(z) => Lent::Zcrx(z),
        }
    }
}

/// Received bytes, borrowed from the receiver's memory; the memory goes back (to the buffer
/// ring, the refill ring or the buffer pool) when the chunk is dropped.
pub struct RxChunk {
    conn: ConnId,
    path: RxPath,
    data: Lent,
}

impl RxChunk {
    /// The connection the bytes came from.
    pub fn conn(&self) -> ConnId {
        self.conn
    }
    /// The path that delivered them.
    pub fn path(&self) -> RxPath {
        self.path
    }

    /// The chunk taken apart, for a send ring that lends its bytes to the kernel (the memory
    /// still goes back when the [`Lent`] drops).
    pub(crate) fn into_parts(self) -> (ConnId, RxPath, Lent) {
        (self.conn, self.path, self.data)
    }

    /// A chunk put back together from [`RxChunk::into_parts`].
    pub(crate) fn from_parts(conn: ConnId, path: RxPath, data: Lent) -> Self {
        Self { conn, path, data }
    }
}

impl std::ops::Deref for RxChunk {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data
    }
}

impl std::fmt::Debug for RxChunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxChunk")
            .field("conn", &self.conn)
            .field("path", &self.path)
            .field("len", &self.len())
            .finish()
    }
}

/// What a [`Receiver`] reports.
#[derive(Debug)]
pub enum RxEvent {
    /// A connection accepted from the listener.
    Accepted(ConnId),
    /// Bytes, in stream order for their connection.
    Data(RxChunk),
    /// The connection ended: `None` at end of stream, else the error (e.g. a reset). The
    /// receiver has closed its socket; the id may be reused.
    Closed(ConnId, Option<io::Error>),
}

/// Receiver counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RxCounters {
    /// Payload bytes delivered.
    pub bytes: u64,
    /// Chunks delivered.
    pub chunks: u64,
    /// System calls made: ring enters + recv calls + epoll calls + reads of the ring's
    /// readiness eventfd (one per [`Receiver::on_ready`] round that resets it).
    pub syscalls: u64,
    /// `io_uring_enter` calls.
    pub ring_enters: u64,
    /// `recv(2)` calls (plain).
    pub recv_calls: u64,
    /// `epoll_wait`/`epoll_ctl` calls (plain).
    pub epoll_calls: u64,
    /// Multishot requests re-armed after they ended (ENOBUFS, termination, accept end).
    pub rearms: u64,
    /// Of those, after the buffer ring ran dry (ENOBUFS).
    pub enobufs: u64,
    /// Waits after which the ring had run dry (bufring; a bundle or receive ended for lack of
    /// buffers in rotation).
    pub ring_dry: u64,
    /// Times the receiver held a connection back because every buffer was lent.
    pub backpressure_waits: u64,
    /// Bytes delivered without a copy (NIC zcrx).
    pub zerocopy_bytes: u64,
    /// Bytes zcrx delivered by a kernel copy: every byte of a device-less zcrx (its COPIED
    /// fraction is 1). A NIC queue's own copy fallback (packets that arrived on another queue)
    /// is not flagged per completion (as of 7.2), so it is not counted here.
    pub copy_fallback_bytes: u64,
    /// `IORING_REGISTER_ZCRX_CTRL` refill flushes made (device-less zcrx; also in `syscalls`).
    pub refill_flushes: u64,
    /// Connections accepted.
    pub accepted: u64,
    /// Times accepting paused because the process or system ran out of descriptors or memory
    /// (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`): the listener is retried after a back-off
    /// (10 ms, doubling to 1 s) instead of spinning on the same error.
    pub accept_backoffs: u64,
}

/// Pauses accepting after a resource error, so a listener whose next `accept` must fail (too
/// many open descriptors) is not retried in a busy loop; connections already open keep being
/// served meanwhile, and the queued ones are accepted once descriptors are free again.
#[derive(Debug, Default)]
pub(crate) struct AcceptBackoff {
    until: Option<std::time::Instant>,
    delay: Duration,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(1);

    /// Whether `errno` (positive) from accept means "no resources now": then accepting pauses
    /// and this returns true; any other error returns false.
    pub(crate) fn on_error(&mut self, errno: i32, c: &mut RxCounters) -> bool {
        if !matches!(
            errno,
            libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM
        ) {
            return false;
        }
        self.delay = (self.delay * 2).clamp(Self::FIRST, Self::MAX);
        self.until = Some(std::time::Instant::now() + self.delay);
        c.accept_backoffs += 1;
        tracing::debug!(errno, delay = ?self.delay, "accept paused");
        true
    }

    /// An accept succeeded: the next pause starts short again.
    pub(crate) fn reset(&mut self) {
        self.delay = Duration::ZERO;
    }

    /// If the pause is over, ends it and returns true (the caller resumes accepting).
    pub(crate) fn due(&mut self) -> bool {
        match self.until {
            Some(t) if std::time::Instant::now() >= t => {
                self.until = None;
                true
            }
            _ => false,
        }
    }

    /// `timeout` shortened so a wait ends when the pause does.
    pub(crate) fn cap(&self, timeout: Duration) -> Duration {
        match self.until {
            Some(t) => timeout.min(t.saturating_duration_since(std::time::Instant::now())),
            None => timeout,
        }
    }
}

/// Why a receiver could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RxError {
    /// io_uring is unavailable or refused set-up.
    #[error("receiver ring: {0}")]
    Ring(#[from] RingError),
    /// zcrx registration failed.
    #[error(transparent)]
    Zcrx(#[from] IfqError),
    /// zcrx was asked for without an interface queue (never returned: without a queue,
    /// [`RxMode::Zcrx`] registers device-less or falls back).
    #[error("zcrx needs an interface rx queue: set RxConfig::zcrx")]
    NoZcrxTarget,
    /// Registering the provided-buffer ring failed.
    #[error("registering the provided-buffer ring failed: {0}")]
    BufRing(#[source] io::Error),
    /// Other set-up I/O.
    #[error("receiver set-up: {0}")]
    Io(#[from] io::Error),
}

impl RxError {
    /// The [`io::ErrorKind`] this error is of: the kernel error's kind where there is one.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            RxError::Ring(RingError::Unavailable { source, .. })
            | RxError::Ring(RingError::Throttled { source, .. })
            | RxError::Ring(RingError::Setup(source))
            | RxError::BufRing(source)
            | RxError::Io(source) => source.kind(),
            RxError::Zcrx(e) => e.source.kind(),
            RxError::NoZcrxTarget => io::ErrorKind::InvalidInput,
        }
    }
}

/// For `?` in functions returning `io::Result`: an [`RxError::Io`] is its own error; the
/// others keep their kind ([`RxError::kind`]) with the error inside.
impl From<RxError> for io::Error {
    fn from(e: RxError) -> Self {
        match e {
            RxError::Io(e) => e,
            e => io::Error::new(e.kind(), e),
        }
    }
}

pub(crate) trait Backend {
    fn path(&self) -> RxPath;
    fn describe(&self) -> String;
    fn add(&mut self, stream: TcpStream, c: &mut RxCounters) -> io::Result<ConnId>;
    fn listen(&mut self, l: TcpListener) -> io::Result<()>;
    fn close(&mut self, conn: ConnId, c: &mut RxCounters);
    fn open(&self) -> usize;
    /// The socket of an open connection.
    fn socket(&self, conn: ConnId) -> Option<std::os::fd::BorrowedFd<'_>>;
    /// Stops receiving on `conn` until `resume` (the data waits in the socket).
    fn pause(&mut self, conn: ConnId, c: &mut RxCounters);
    /// Receives on a paused `conn` again.
    fn resume(&mut self, conn: ConnId, c: &mut RxCounters) -> io::Result<()>;
    /// Changes how waits gather completions; false when `batch > 1` cannot be honoured.
    fn set_wait(&mut self, batch: usize, min_wait: Duration) -> bool;
    /// The next wait submits `n` requests of the caller's that complete inside its enter
    /// (see [`Receiver::count_in_next_wait`]).
    fn count_in_next_wait(&mut self, _n: usize) {}
    /// Connections whose receive waits for buffers to come back (re-armed by a harvest
    /// once a chunk was dropped).
    fn starved(&self) -> usize {
        0
    }
    /// Receive buffers (or zcrx ranges) lent to the application now, and how many there
    /// are (`(0, 0)` where receives do not take them from a shared ring).
    fn lent(&self) -> (u64, u64) {
        (0, 0)
    }
    /// The backend's readiness descriptor (created on first call).
    fn notify_fd(&mut self) -> io::Result<std::os::fd::BorrowedFd<'_>>;
    /// Clears the readiness descriptor after a harvest; true when work came in meanwhile.
    fn clear_notify(&mut self) -> bool;
    /// Whether work came in that a harvest would find, without clearing the descriptor.
    fn has_work(&self) -> bool {
        false
    }
    /// Whether clearing the readiness descriptor takes a system call (an eventfd read).
    fn clear_is_syscall(&self) -> bool {
        false
    }
    /// Makes the readiness descriptor readable: work is left that a cleared descriptor would
    /// not announce again.
    fn keep_notify(&mut self) {}
    fn poll(
        &mut self,
        timeout: Duration,
        c: &mut RxCounters,
        f: &mut dyn FnMut(RxEvent),
    ) -> io::Result<usize>;
}

/// The backend a [`Receiver`] chose, once, in `Receiver::build` (each step down recorded there
/// as a [`Fallback`]).
enum RxBackend {
    Plain(plain::PlainRx),
    BufRing(uring::RingRx<io_uring::cqueue::Entry>),
    Zcrx(uring::RingRx<io_uring::cqueue::Entry32>),
}

/// Calls `$call` on whichever backend is in use.
macro_rules! each_backend {
    ($self:expr, $b:ident => $call:expr) => {
        match $self {
            RxBackend::Plain($b) => $call,
            RxBackend::BufRing($b) => $call,
            RxBackend::Zcrx($b) => $call,
        }
    };
}

impl Backend for RxBackend {
    fn path(&self) -> RxPath {
        each_backend!(self, b => b.path())
    }
    fn describe(&self) -> String {
        each_backend!(self, b => b.describe())
    }
    fn add(&mut self, stream: TcpStream, c: &mut RxCounters) -> io::Result<ConnId> {
        each_backend!(self, b => b.add(stream, c))
    }
    fn listen(&mut self, l: TcpListener) -> io::Result<()> {
        each_backend!(self, b => b.listen(l))
    }
    fn close(&mut self, conn: ConnId, c: &mut RxCounters) {
        each_backend!(self, b => b.close(conn, c))
    }
    fn open(&self) -> usize {
        each_backend!(self, b => b.open())
    }
    fn socket(&self, conn: ConnId) -> Option<std::os::fd::BorrowedFd<'_>> {
        each_backend!(self, b => b.socket(conn))
    }
    fn pause(&mut self, conn: ConnId, c: &mut RxCounters) {
        each_backend!(self, b => b.pause(conn, c))
    }
    fn resume(&mut self, conn: ConnId, c: &mut RxCounters) -> io::Result<()> {
        each_backend!(self, b => b.resume(conn, c))
    }
    fn set_wait(&mut self, batch: usize, min_wait: Duration) -> bool {
        each_backend!(self, b => b.set_wait(batch, min_wait))
    }
    fn count_in_next_wait(&mut self, n: usize) {
        each_backend!(self, b => b.count_in_next_wait(n))
    }
    fn starved(&self) -> usize {
        each_backend!(self, b => b.starved())
    }
    fn lent(&self) -> (u64, u64) {
        each_backend!(self, b => b.lent())
    }
    fn notify_fd(&mut self) -> io::Result<std::os::fd::BorrowedFd<'_>> {
        each_backend!(self, b => b.notify_fd())
    }
    fn clear_notify(&mut self) -> bool {
        each_backend!(self, b => b.clear_notify())
    }
    fn has_work(&self) -> bool {
        each_backend!(self, b => b.has_work())
    }
    fn clear_is_syscall(&self) -> bool {
        each_backend!(self, b => b.clear_is_syscall())
    }
    fn keep_notify(&mut self) {
        each_backend!(self, b => b.keep_notify())
    }
    fn poll(
        &mut self,
        timeout: Duration,
        c: &mut RxCounters,
        f: &mut dyn FnMut(RxEvent),
    ) -> io::Result<usize> {
        each_backend!(self, b => b.poll(timeout, c, f))
    }
}

/// Receives from many TCP connections through one backend; see the module docs.
pub struct Receiver {
    backend: RxBackend,
    counters: RxCounters,
    fallbacks: Vec<Fallback>,
    queue: VecDeque<RxEvent>,
    /// A listener was given (one per receiver).
    listening: bool,
    /// The readiness descriptor is watched edge-triggered (tokio's `AsyncFd`): `on_ready`
    /// does not reset it (see [`Receiver::set_edge_readiness`]).
    edge: bool,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("backend", &self.backend.describe())
            .field("counters", &self.counters)
            .field("fallbacks", &self.fallbacks)
            .finish()
    }
}

impl Receiver {
    /// Builds a receiver (connections are added with [`Receiver::add`]).
    pub fn new(cfg: &RxConfig) -> Result<Self, RxError> {
        Self::build(cfg, None)
    }

    /// Builds a receiver that accepts connections from `listener` (multishot accept on the
    /// ring backends) and receives from them.
    pub fn listen(listener: TcpListener, cfg: &RxConfig) -> Result<Self, RxError> {
        let local = listener.local_addr()?.ip();
        let mut r = Self::build(cfg, Some(local))?;
        r.backend.listen(listener)?;
        r.listening = true;
        Ok(r)
    }

    /// A receiver that will accept from a listener on `local` ([`Receiver::accept_from`]),
    /// built before that listener exists: its backend is chosen as [`Receiver::listen`] would
    /// choose it for that address.
    pub(crate) fn for_listener_at(local: IpAddr, cfg: &RxConfig) -> Result<Self, RxError> {
        Self::build(cfg, Some(local))
    }

    /// Accepts connections from `listener` from now on (a receiver accepts from one
    /// listener).
    pub(crate) fn accept_from(&mut self, listener: TcpListener) -> io::Result<()> {
        if self.listening {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the receiver already accepts from a listener",
            ));
        }
        self.backend.listen(listener)?;
        self.listening = true;
        Ok(())
    }

    fn build(cfg: &RxConfig, local: Option<IpAddr>) -> Result<Self, RxError> {
        let mut fallbacks = Vec::new();
        let backend = match cfg.mode {
            RxMode::Plain => RxBackend::Plain(plain::PlainRx::new(cfg)?),
            RxMode::BufRing => RxBackend::BufRing(uring::RingRx::bufring(cfg, &mut fallbacks)?),
            RxMode::Zcrx => match cfg.zcrx.clone() {
                // A NIC queue the caller named: its registration error is the answer.
                Some(t) if !t.deviceless => RxBackend::Zcrx(uring::RingRx::zcrx(cfg, &t)?),
                // No queue: device-less (Linux 7.1); older kernels fall back, recorded.
                t => {
                    let t = t.unwrap_or_else(ZcrxTarget::deviceless);
                    match uring::RingRx::zcrx(cfg, &t) {
                        Ok(b) => RxBackend::Zcrx(b),
                        Err(e) => {
                            fallbacks.push(Fallback::new(
                                RxPath::ZcrxNodev,
                                RxPath::BufRing,
                                e.to_string(),
                            ));
                            Self::bufring_or_plain(cfg, &mut fallbacks)?
                        }
                    }
                }
            },
            RxMode::Auto => {
                let target = cfg.zcrx.clone().or_else(|| match local {
                    Some(ip) if ip.is_loopback() => Some(ZcrxTarget::new("lo", 0)),
                    _ => None,
                });
                let zc = match &target {
                    Some(t) => uring::RingRx::zcrx(cfg, t).map_err(|e| e.to_string()),
                    None => Err(
                        "no zcrx interface queue configured (RxConfig::zcrx), and the \
                                 listener is not on loopback"
                            .to_string(),
                    ),
                };
                match zc {
                    Ok(b) => RxBackend::Zcrx(b),
                    Err(reason) => {
                        fallbacks.push(Fallback::new(
                            RxPath::Zcrx,
                            RxPath::BufRing,
                            format!(
                                "{reason}; device-less zcrx is not chosen by Auto: the kernel \
                                 copies every byte into its area (COPIED 1.0), as bufring does \
                                 into provided buffers, with one more syscall per refill \
                                 (RxMode::Zcrx selects it)"
                            ),
                        ));
                        Self::bufring_or_plain(cfg, &mut fallbacks)?
                    }
                }
            }
        };
        Ok(Self {
            backend,
            counters: RxCounters::default(),
            fallbacks,
            queue: VecDeque::new(),
            listening: false,
            edge: false,
        })
    }

    fn bufring_or_plain(
        cfg: &RxConfig,
        fallbacks: &mut Vec<Fallback>,
    ) -> Result<RxBackend, RxError> {
        Ok(match uring::RingRx::bufring(cfg, fallbacks) {
            Ok(b) => RxBackend::BufRing(b),
            Err(e) => {
                fallbacks.push(Fallback::new(RxPath::BufRing, RxPath::Plain, e.to_string()));
                RxBackend::Plain(plain::PlainRx::new(cfg)?)
            }
        })
    }

    /// Hands a connected stream to the receiver.
    pub fn add(&mut self, stream: TcpStream) -> io::Result<ConnId> {
        self.backend.add(stream, &mut self.counters)
    }

    /// Stops receiving on `conn` and closes it. Chunks already delivered stay valid.
    pub fn close(&mut self, conn: ConnId) {
        self.backend.close(conn, &mut self.counters)
    }

    /// Stops receiving on `conn` (per-connection backpressure, e.g. a proxy whose other side
    /// cannot take more): the data waits in the socket and TCP's window closes. Bytes the
    /// kernel had already received into buffers when the pause reached it may still be
    /// delivered (at most the ring's buffers), and an end of stream or error the receive had
    /// already met is still reported. Unknown or closed ids are ignored.
    pub fn pause(&mut self, conn: ConnId) {
        self.backend.pause(conn, &mut self.counters)
    }

    /// The socket of an open connection (e.g. one accepted by [`Receiver::listen`]), for its
    /// address, options, or a duplicate to send on (a proxy adds one to a
    /// [`SendRing`](crate::tx::SendRing)). `None` once the connection is closed.
    pub fn socket(&self, conn: ConnId) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.backend.socket(conn)
    }

    /// Receives on a paused `conn` again (no effect on a connection that is not paused).
    pub fn resume(&mut self, conn: ConnId) -> io::Result<()> {
        self.backend.resume(conn, &mut self.counters)
    }

    /// Changes how later waits gather completions ([`RxConfig::batch`] and
    /// [`RxConfig::min_wait`]): e.g. a proxy batches while its connections stream and returns
    /// on the first completion while they exchange small messages. Returns false (and keeps
    /// returning on the first completion) when `batch > 1` cannot be honoured: the plain
    /// backend, or a kernel without `IORING_FEAT_MIN_TIMEOUT` (Linux 6.12).
    pub fn set_wait(&mut self, batch: usize, min_wait: Duration) -> bool {
        self.backend.set_wait(batch, min_wait)
    }

    /// The next wait submits `n` requests of the caller's that complete inside its own enter
    /// when nothing holds them (`n` is all of them queued now: a later call replaces an
    /// earlier one, whose requests are among those still queued): sends on a send ring that
    /// shares this receiver's ring ([`crate::tx::SendRing::on_receiver`],
    /// [`crate::tx::SendRing::queued_sends`]) to sockets with room, which a local peer takes
    /// at once. A wait for the first completion counts
    /// them (it waits for `n` + 1) and so returns on the first completion beyond theirs, e.g.
    /// the answer to what they sent, instead of on their own: one wait and one enter per
    /// forwarded message rather than two. Counted only in a wait of this poll or the next
    /// ones that submits them (at most the requests still queued); batched waits
    /// ([`Receiver::set_wait`] with a min-wait) are not changed. A request that does not
    /// complete there (a full socket) makes the wait need one completion more than arrived:
    /// it returns on the next one, or at its timeout, so a caller that counts sends bounds
    /// the wait's timeout. No effect on the plain backend.
    pub fn count_in_next_wait(&mut self, n: usize) {
        self.backend.count_in_next_wait(n)
    }

    /// Connections whose receive stopped because every buffer was lent (ring backends):
    /// dropping chunks gives buffers back, and the next harvest ([`Receiver::on_ready`],
    /// [`Receiver::poll`]) arms them again. The readiness descriptor does not fire for that:
    /// an event loop that dropped chunks while this is non-zero harvests once more.
    pub fn starved(&self) -> usize {
        self.backend.starved()
    }

    /// Receive buffers (or zcrx area ranges) lent to the application now (chunks alive), and
    /// the ring's total; `(0, 0)` on the plain backend, whose buffers are not shared by a
    /// ring the kernel takes from.
    pub fn lent(&self) -> (u64, u64) {
        self.backend.lent()
    }

    /// Waits up to `timeout` for events and passes each to `f`. Returns the number of events.
    /// A receive that ended in this harvest with the data it had taken (a bundle that took the
    /// ring's last buffers) is armed again by the next call, once the caller could
    /// [`Receiver::pause`] its connection for that data: armed now, its first receive would go
    /// in ahead of the pause and take the buffers the caller gave back meanwhile. With a zero
    /// timeout it arms them and submits what it re-armed before returning (the caller may wait
    /// on the readiness descriptor next); with a wait, under `DEFER_TASKRUN`, they go in with
    /// the next call's enter (a blocking loop saves the syscall).
    pub fn poll(&mut self, timeout: Duration, f: &mut dyn FnMut(RxEvent)) -> io::Result<usize> {
        let mut n = 0;
        while let Some(ev) = self.queue.pop_front() {
            f(ev);
            n += 1;
        }
        if n > 0 {
            return Ok(n);
        }
        self.backend.poll(timeout, &mut self.counters, f)
    }

    /// The next event, waiting up to `timeout`; `None` when nothing happened in time.
    pub fn next_event(&mut self, timeout: Duration) -> io::Result<Option<RxEvent>> {
        if self.queue.is_empty() {
            let q = &mut self.queue;
            self.backend
                .poll(timeout, &mut self.counters, &mut |ev| q.push_back(ev))?;
        }
        Ok(self.queue.pop_front())
    }

    /// The readiness descriptor, created on first call: it polls readable when
    /// [`Receiver::on_ready`] would find an event. On the ring backends it is the ring's
    /// registered eventfd (under `DEFER_TASKRUN` signalled when the kernel queues the task
    /// work that posts receives; they are posted by the harvest's own enter); on `plain` it
    /// is the epoll set of the sockets. While every buffer is lent (backpressure) it may be
    /// readable with nothing to harvest until chunks are dropped. Rules per task-run mode:
    /// `docs/design/async.md`.
    pub fn readiness_fd(&mut self) -> io::Result<std::os::fd::BorrowedFd<'_>> {
        self.backend.notify_fd()
    }

    /// Harvests without blocking (after the readiness descriptor fired, or at any time):
    /// passes each event to `f`, then clears the descriptor, looking again when work came in
    /// meanwhile, so it is left readable only by events that come later (or, after four
    /// rounds with work still coming in, by that work). The receives the harvest re-armed are
    /// handed to the kernel before it returns: none waits in the submission queue for a
    /// descriptor that would never fire for it. Returns the number of events.
    pub fn on_ready(&mut self, f: &mut dyn FnMut(RxEvent)) -> io::Result<usize> {
        self.backend.notify_fd()?;
        let mut n = 0;
        for _ in 0..4 {
            n += self.poll(Duration::ZERO, f)?;
            let more = if self.edge {
                self.backend.has_work()
            } else {
                if self.backend.clear_is_syscall() {
                    self.counters.syscalls += 1;
                }
                self.backend.clear_notify()
            };
            if !more {
                return Ok(n);
            }
        }
        // Work is left after four rounds (each enter runs a bounded batch of deferred task
        // work): the descriptor stays readable for it. Cleared, it would not fire again for
        // work already flagged, and a caller that waits on it next would wait for ever.
        self.backend.keep_notify();
        Ok(n)
    }

    /// The readiness descriptor is watched edge-triggered (epoll's `EPOLLET`, as tokio's
    /// `AsyncFd` watches every descriptor): [`Receiver::on_ready`] then leaves its counter as
    /// it is instead of reading it back to zero, one system call per harvest saved. Correct
    /// only for edge-triggered watchers: the kernel's every signal of the eventfd (a wake-up
    /// of its waiters) makes a new edge whatever the counter holds, while a level-triggered
    /// watcher would find it readable for ever.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn set_edge_readiness(&mut self) {
        self.edge = true;
    }

    /// The backend's path.
    pub fn path(&self) -> RxPath {
        self.backend.path()
    }
    /// A one-line description of the backend and its settings.
    pub fn describe(&self) -> String {
        self.backend.describe()
    }
    /// Path-specific counters so far (the common ones are [`Report::counters`]).
    pub fn stats(&self) -> &RxCounters {
        &self.counters
    }
    /// Fallbacks taken while choosing and running the backend.
    pub fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }
    /// Connections open.
    pub fn open_connections(&self) -> usize {
        self.backend.open()
    }
}

/// Connection slots with generation counters, so a stale id never names a new connection.
pub(crate) struct Slab<T> {
    slots: Vec<(u32, Option<T>)>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Slab<T> {
    pub(crate) fn new() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
    pub(crate) fn insert(&mut self, v: T) -> ConnId {
        self.len += 1;
        if let Some(idx) = self.free.pop() {
            let s = &mut self.slots[idx as usize];
            s.0 = s.0.wrapping_add(1) & 0x0fff_ffff;
            s.1 = Some(v);
            ConnId { idx, gen: s.0 }
        } else {
            self.slots.push((0, Some(v)));
            ConnId {
                idx: self.slots.len() as u32 - 1,
                gen: 0,
            }
        }
    }
    pub(crate) fn get(&self, id: ConnId) -> Option<&T> {
        match self.slots.get(id.idx as usize) {
            Some((g, Some(v))) if *g == id.gen => Some(v),
            _ => None,
        }
    }
    pub(crate) fn get_mut(&mut self, id: ConnId) -> Option<&mut T> {
        match self.slots.get_mut(id.idx as usize) {
            Some((g, Some(v))) if *g == id.gen => Some(v),
            _ => None,
        }
    }
    pub(crate) fn remove(&mut self, id: ConnId) -> Option<T> {
        match self.slots.get_mut(id.idx as usize) {
            Some((g, slot)) if *g == id.gen && slot.is_some() => {
                self.free.push(id.idx);
                self.len -= 1;
                slot.take()
            }
            _ => None,
        }
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Receiver {
    /// The receiver's io_uring, for a send ring to share ([`crate::tx::SendRing::on_receiver`]);
    /// `None` for the plain backend, which has none.
    pub(crate) fn send_core(&self) -> Option<Box<dyn crate::ring::SendCore>> {
        match &self.backend {
            RxBackend::Plain(_) => None,
            RxBackend::BufRing(b) => Some(Box::new(b.shared_ring())),
            RxBackend::Zcrx(b) => Some(Box::new(b.shared_ring())),
        }
    }
}

impl Report for Receiver {
    type Path = RxPath;
    fn path(&self) -> RxPath {
        self.backend.path()
    }
    /// `bytes`, `ops` = chunks delivered, `syscalls` (ring enters, `recv`, epoll calls).
    fn counters(&self) -> Counters {
        Counters {
            bytes: self.counters.bytes,
            ops: self.counters.chunks,
            syscalls: self.counters.syscalls,
            zerocopy_bytes: self.counters.zerocopy_bytes,
            copied_bytes: self.counters.copy_fallback_bytes,
            ..Counters::default()
        }
    }
    fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }
}

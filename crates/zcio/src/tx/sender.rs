//! [`Sender`]: one socket on a [`SendRing`] of its own. Every call is the ring's, for that
//! socket; nothing here sends by itself.

use super::{
    Completion, Path, PoolBuf, Refused, SendRing, SendRingConfig, SenderConfig, SockId, Ticket,
    TxBuf, TxError, TxMode, TxStats,
};
use crate::buf::pool::Pool;
use crate::ring::RingConfig;
use crate::stats::{Counters, Fallback, Report};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

/// A zero-copy sender on one connected TCP or UDP socket: a [`SendRing`] with one socket.
/// See the [module docs](super).
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
    ring: SendRing,
    sock: SockId,
    fd: RawFd,
    stream: bool,
    chunk: usize,
    segment: usize,
    /// The ring's set-up steps down, then the socket's fallbacks, as one list.
    fallbacks: Vec<Fallback>,
    /// Socket fallbacks already in `fallbacks`.
    sock_seen: usize,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("path", &self.path())
            .field("mode", &self.mode())
            .field("in_flight", &self.in_flight())
            .field("counters", &self.counters())
            .finish()
    }
}

impl Sender {
    /// Takes a connected socket (TCP stream or UDP; AF_INET or AF_INET6; other stream or
    /// datagram sockets fall back to copy with a recorded reason) and sets up `cfg.mode`.
    /// With [`TxMode::UringZcFixed`] and [`TxMode::Auto`], `pool` is registered with the
    /// ring (a failure is a recorded fallback).
    pub fn new(sock: impl Into<OwnedFd>, pool: &Pool, cfg: SenderConfig) -> Result<Self, TxError> {
        let sock: OwnedFd = sock.into();
        let fd = sock.as_raw_fd();
        let wants_ring = matches!(
            cfg.mode,
            TxMode::UringZc | TxMode::UringZcFixed | TxMode::UringCopy | TxMode::Auto
        );
        let rcfg = SendRingConfig {
            ring: RingConfig {
                entries: (cfg.depth.clamp(8, 4096) as u32).next_power_of_two(),
                ..RingConfig::default()
            },
            files: 1,
            submit_batch: cfg.submit_batch.max(1),
        };
        let mut ring = if wants_ring {
            SendRing::new(&rcfg)?
        } else {
            SendRing::without_uring(&rcfg)
        };
        if matches!(cfg.mode, TxMode::UringZcFixed | TxMode::Auto) && ring.has_uring() {
            // Recorded by the ring, and by the socket as its own fallback when it chose.
            let _ = ring.register_pool(pool);
        }
        let id = ring.add(sock, &cfg)?;
        let mut fallbacks: Vec<Fallback> = ring
            .fallbacks()
            .iter()
            .filter(|f| !matches!(f.from, crate::stats::Path::Tx(Path::UringZcFixed)))
            .cloned()
            .collect();
        // The ring's own set-up notes (no ring at all) are said by the socket in its words.
        if !ring.has_uring() {
            fallbacks.clear();
        }
        let sock_seen = ring.sock_fallbacks(id).len();
        fallbacks.extend(ring.sock_fallbacks(id).iter().cloned());
        Ok(Self {
            sock_seen,
            stream: ring.sock_is_stream(id).unwrap_or(true),
            chunk: ring.sock_chunk(id).unwrap_or(usize::MAX),
            segment: ring.sock_segment(id).unwrap_or(usize::MAX),
            ring,
            sock: id,
            fd,
            fallbacks,
        })
    }

    /// Makes the io_uring's `io_uring_enter` calls fail as `fault` says (tests of the
    /// failure paths); returns whether this sender has a ring.
    #[cfg(feature = "fault-injection")]
    pub fn inject_ring_fault(&mut self, fault: crate::ring::lend::Fault) -> bool {
        self.ring.inject_ring_fault(fault)
    }

    /// The ring under this sender.
    pub fn ring(&self) -> &SendRing {
        &self.ring
    }

    /// The path new sends take now.
    pub fn path(&self) -> Path {
        self.ring.sock_path(self.sock).unwrap_or(Path::Copy)
    }

    /// The configured mode.
    pub fn mode(&self) -> TxMode {
        self.ring.sock_mode(self.sock).unwrap_or(TxMode::Copy)
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

    /// One line: the path new sends take, and the paths the sends took so far with how many
    /// of each.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.path(), self.ring.describe())
    }

    /// Every fallback taken, with its reason.
    pub fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }

    fn sync_fallbacks(&mut self) {
        let mine = self.ring.sock_fallbacks(self.sock);
        if mine.len() > self.sock_seen {
            self.fallbacks
                .extend(mine[self.sock_seen..].iter().cloned());
            self.sock_seen = mine.len();
        }
    }

    /// Counters: bytes completed, sends, syscalls (the ring's enters included),
    /// notifications, zero-copy vs copied bytes.
    pub fn counters(&self) -> Counters {
        self.ring.counters_total()
    }

    /// Path-specific counters.
    pub fn stats(&self) -> TxStats {
        self.ring.stats()
    }

    /// The socket.
    pub fn socket(&self) -> BorrowedFd<'_> {
        self.ring.socket(self.sock).expect("the sender's socket")
    }

    /// Sends handed to the kernel whose completion has not been produced yet.
    pub fn in_flight(&self) -> usize {
        self.ring.in_flight()
    }

    /// Whether [`Sender::send`] would take a buffer now.
    pub fn has_room(&self) -> bool {
        self.ring.can_send(self.sock)
    }

    /// Sends that are in flight but can never complete (they sit in an io_uring that failed
    /// and was abandoned): waiting for them, on the descriptor or otherwise, would never end.
    /// The error says so; `Ok` when every send in flight can still complete.
    pub fn check_stuck(&self) -> Result<(), TxError> {
        self.ring.check_stuck()
    }

    /// Completions ready to be taken.
    pub fn ready(&self) -> usize {
        self.ring.ready()
    }

    /// Sets `TCP_CORK` (TCP) or `UDP_CORK` (UDP): the kernel holds partial frames until
    /// uncorked.
    pub fn set_cork(&mut self, on: bool) -> Result<(), TxError> {
        self.ring.set_cork(self.sock, on)
    }

    /// Sends `buf[..buf.len()]`. The buffer comes back with its [`Completion`] from
    /// [`Sender::next_completion`]; errors of the send are in the completion. Never waits:
    /// when `depth` sends are in flight (or, on the syscall paths, the socket buffer is full)
    /// the buffer comes back at once as [`Refused`]; [`Sender::wait`] waits for room.
    pub fn send(&mut self, buf: PoolBuf) -> Result<Ticket, Refused<PoolBuf>> {
        let r = self.ring.send(self.sock, buf);
        self.sync_fallbacks();
        r.map_err(|r| Refused {
            buf: r.buf.into_pool().expect("a pool buffer comes back as one"),
            reason: r.reason,
        })
    }

    /// Makes progress without blocking: submits queued io_uring requests, reaps ready
    /// completions (entering the kernel only when something is queued or it flagged
    /// deferred task work: see [`SendRing::poll`]). Returns the number of completions ready.
    pub fn poll(&mut self) -> Result<usize, TxError> {
        let r = self.ring.poll();
        self.sync_fallbacks();
        r
    }

    /// Like [`Sender::poll`], but leaves queued io_uring requests queued until
    /// `submit_batch` of them are there: on io_uring paths it only reads completions and
    /// notifications the kernel has already posted (no syscall); on `msg-zc` it reaps the
    /// error queue as `poll` does. Returns the number of completions ready.
    pub fn harvest(&mut self) -> Result<usize, TxError> {
        let r = self.ring.harvest();
        self.sync_fallbacks();
        r
    }

    /// Blocks until at least one completion is ready, nothing is in flight, a refused send
    /// would now be taken, or `timeout` passes. Returns the number of completions ready.
    pub fn wait(&mut self, timeout: Duration) -> Result<usize, TxError> {
        let r = self.ring.wait(timeout);
        self.sync_fallbacks();
        r
    }

    /// Waits until every send has completed (their completions are then ready).
    pub fn flush(&mut self, timeout: Duration) -> Result<(), TxError> {
        let r = self.ring.flush(timeout);
        self.sync_fallbacks();
        r
    }

    /// The readiness descriptor (see [`SendRing::readiness_fd`]).
    pub fn readiness_fd(&mut self) -> Result<BorrowedFd<'_>, TxError> {
        self.ring.readiness_fd()
    }

    /// The readiness descriptor is watched edge-triggered (see
    /// [`SendRing::set_edge_readiness`]).
    #[cfg(feature = "tokio")]
    pub(crate) fn set_edge_readiness(&mut self, edge: bool) -> Result<(), TxError> {
        self.ring.set_edge_readiness(edge)
    }

    /// Whether the readiness descriptor polls readable now (for tests and loops that poll
    /// it themselves).
    pub fn readiness_is_set(&self) -> bool {
        self.ring.readiness_is_set()
    }

    /// Harvests after the readiness descriptor fired (see [`SendRing::on_ready`]). Returns
    /// the number of completions ready.
    pub fn on_ready(&mut self) -> Result<usize, TxError> {
        let r = self.ring.on_ready();
        self.sync_fallbacks();
        r
    }

    /// Ends the connection in direction `how` once the sends in flight are done: with
    /// `Write` or `Both` it waits (as [`Sender::flush`], at most [`Sender::CLOSE_WAIT`]; call
    /// `flush` first to choose another bound) until every send has completed, then calls
    /// `shutdown(2)`, so the peer reads its end of stream right after the last byte. Their
    /// completions stay to be taken. A flush that times out returns its error and shuts
    /// nothing down.
    pub fn shutdown(&mut self, how: std::net::Shutdown) -> Result<(), TxError> {
        if how != std::net::Shutdown::Read {
            self.flush(Self::CLOSE_WAIT)?;
        }
        self.ring.shutdown(self.sock, how)
    }

    /// `shutdown(2)` of the socket now, without waiting (the async adapter waits first).
    #[cfg(feature = "tokio")]
    pub(crate) fn shutdown_now(&mut self, how: std::net::Shutdown) -> Result<(), TxError> {
        self.ring.shutdown(self.sock, how)
    }

    /// How long [`Sender::shutdown`], [`Sender::close`] and drop wait for sends in flight.
    pub const CLOSE_WAIT: Duration = Duration::from_secs(2);

    /// Waits for the sends in flight (at most [`Sender::CLOSE_WAIT`]) and closes the socket:
    /// the peer reads its end of stream after the last byte, at once. Dropping the sender does
    /// the same but cannot report a send that did not finish; `close` returns the flush's
    /// error (the socket is closed either way).
    pub fn close(mut self) -> Result<(), TxError> {
        let r = self.flush(Self::CLOSE_WAIT);
        drop(self);
        r
    }

    /// Takes the next completion and its buffer.
    pub fn next_completion(&mut self) -> Option<(Completion, PoolBuf)> {
        loop {
            let (c, b) = self.ring.next_completion()?;
            // Only pool buffers go in; anything else cannot come back.
            if let TxBuf::Pool(b) = b {
                return Some((c, b));
            }
        }
    }

    /// Takes every ready completion.
    pub fn completions(&mut self) -> impl Iterator<Item = (Completion, PoolBuf)> + '_ {
        std::iter::from_fn(move || self.next_completion())
    }
}

impl AsRawFd for Sender {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl Report for Sender {
    type Path = Path;
    fn path(&self) -> Path {
        Sender::path(self)
    }
    fn counters(&self) -> Counters {
        Sender::counters(self)
    }
    fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }
}

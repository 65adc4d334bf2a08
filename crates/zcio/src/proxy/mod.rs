//! A TCP proxy on one ring per thread: bytes received into provided buffers or zcrx area pages
//! are sent on with `SEND_ZC` from that same memory, and the memory goes back to the receiver
//! only when the send's notification says the kernel is done with it.
//!
//! [`Pair`] forwards one client connection and its upstream connection on a caller's
//! [`Receiver`] and [`SendRing`]: the buffer ownership (receive → send → back) and the
//! backpressure rules, for applications that embed forwarding in their own loop. [`Proxy`] is
//! the per-thread engine around it (accepts, connects upstream round-robin, limits, timeouts,
//! statistics); `zcio proxy` runs one per thread. Design: `docs/design/proxy.md`.
//!
//! ```no_run
//! use zcio::proxy::{Proxy, ProxyConfig};
//! let listener = std::net::TcpListener::bind("127.0.0.1:8080")?;
//! let up = "127.0.0.1:9090".parse().unwrap();
//! let mut proxy = Proxy::new(listener, vec![up], ProxyConfig::default())?;
//! loop {
//!     proxy.turn(std::time::Duration::from_millis(100))?;
//!     for end in proxy.take_ended() {
//!         eprintln!("{end}");
//!     }
//! }
//! # #[allow(unreachable_code)] Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod pair;

pub use pair::{Pair, PairStats};

use crate::rx::{ConnId, Receiver, RxConfig, RxError, RxEvent, RxMode};
use crate::stats::Report;
use crate::sys::net;
use crate::sys::poller::Poller;
use crate::tx::{SendRing, SendRingConfig, SenderConfig, SockId, TxError, TxMode};
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// One socket of a forwarded pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Side {
    /// The accepted connection.
    Client,
    /// The connection to the target.
    Upstream,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Client => "client",
            Side::Upstream => "upstream",
        })
    }
}

/// How a pair ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum EndKind {
    /// Both directions ended (end of stream each way) and every byte was delivered.
    Done,
    /// One side reset its connection; the other side was reset.
    Reset,
    /// The upstream connection could not be made (refused, unreachable, …); the client was
    /// reset.
    ConnectFailed,
    /// The upstream connection was not established within [`Limits::connect_timeout`].
    ConnectTimeout,
    /// No byte moved for [`Limits::idle_timeout`]; both sides were closed.
    IdleTimeout,
    /// Receiving failed with an error other than a reset.
    RecvFailed,
    /// Sending failed (the peer went away while bytes were in flight).
    SendFailed,
    /// The proxy stopped (its drain bound passed) with the pair still open; both reset.
    Shutdown,
}

/// The end of a pair: what happened, on which side, and the error or reason.
#[derive(Debug, Clone, serde::Serialize)]
pub struct End {
    /// What happened.
    pub kind: EndKind,
    /// The side where it happened, when it is one side's.
    pub side: Option<Side>,
    /// The error or reason, for the log.
    pub detail: String,
}

impl End {
    fn new(kind: EndKind, side: Option<Side>, detail: String) -> Self {
        Self { kind, side, detail }
    }
}

/// Per-pair limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes held per direction (received, not yet completed on the other side) before the
    /// source is paused; resumed at half.
    pub buffer_bytes: usize,
    /// Chunks held per direction before the source is paused (each pins one receive buffer or
    /// area range whatever its length); resumed at half.
    pub buffer_chunks: usize,
    /// Time for the upstream connection to be established.
    pub connect_timeout: Duration,
    /// Time without any byte moved after which the pair is closed (`None`: never).
    pub idle_timeout: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            buffer_bytes: 512 << 10,
            buffer_chunks: 32,
            connect_timeout: Duration::from_secs(5),
            idle_timeout: None,
        }
    }
}

/// [`Proxy`] settings.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The receiver (backend, buffers). Waits return on the first completion by default:
    /// forwarding is latency-bound, a batch would hold a request back; every buffer is in
    /// the ring (`hot_bytes` 0).
    pub rx: RxConfig,
    /// The send side of every socket (path, depth).
    pub tx: SenderConfig,
    /// Per-pair limits.
    pub limits: Limits,
    /// Pairs open at once; further clients are closed at accept (counted as rejected).
    pub max_connections: usize,
    /// `TCP_NODELAY` on both sockets of every pair (default on, as HAProxy and nginx do): a
    /// proxy forwards whatever arrived at once, and Nagle's algorithm would hold a small
    /// segment back until the previous one is acknowledged (a delayed ACK: up to 40 ms).
    pub nodelay: bool,
    /// Waits while the connections stream (the last harvest's chunks averaged at least
    /// [`BULK_CHUNK`]): return once this many completions are there, or after
    /// `bulk_min_wait` with at least one (fewer kernel entries per MB). While they exchange
    /// small messages waits are [`ProxyConfig::rx`]'s (`low_latency` by default: the first
    /// completion). 1: never batch.
    pub bulk_batch: usize,
    /// The most a batched wait holds a first completion back (see `bulk_batch`).
    pub bulk_min_wait: Duration,
}

/// Descriptors one pair holds: each of its two sockets on the receiver and, duplicated, on the
/// send ring.
pub const FDS_PER_PAIR: u64 = 4;

/// A harvest whose received chunks average at least this many bytes is bulk transfer (see
/// [`ProxyConfig::bulk_batch`]); request/response messages are far below it.
pub const BULK_CHUNK: usize = 16 << 10;

/// Times in microseconds as a log2 histogram with their sum: bucket `i` counts
/// `[2^i, 2^(i+1))` µs, bucket 0 also below 1 µs, the last (`2^23` µs, 8.4 s) also above.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UsLog2 {
    /// Observations per bucket.
    pub buckets: [u64; US_LOG2_BUCKETS],
    /// Sum of the observations, µs.
    pub sum_us: u64,
}

/// Buckets of a [`UsLog2`].
pub const US_LOG2_BUCKETS: usize = 24;

impl UsLog2 {
    /// Records `n` observations of `us` microseconds.
    pub fn record(&mut self, us: u64, n: u64) {
        let b = (64 - us.leading_zeros() as usize).saturating_sub(1);
        self.buckets[b.min(US_LOG2_BUCKETS - 1)] += n;
        self.sum_us = self.sum_us.saturating_add(us.saturating_mul(n));
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Adds `o` into `self`.
    pub fn add(&mut self, o: &UsLog2) {
        for (a, b) in self.buckets.iter_mut().zip(o.buckets) {
            *a += b;
        }
        self.sum_us = self.sum_us.saturating_add(o.sum_us);
    }

    /// What `self` has beyond `earlier` (an earlier snapshot of the same histogram).
    pub fn since(&self, earlier: &UsLog2) -> UsLog2 {
        let mut d = *self;
        for (a, b) in d.buckets.iter_mut().zip(earlier.buckets) {
            *a = a.saturating_sub(b);
        }
        d.sum_us = d.sum_us.saturating_sub(earlier.sum_us);
        d
    }

    /// The `q` quantile (0..=1) as its bucket's upper bound in µs (`None` when empty).
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let want = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= want {
                return Some(1u64 << (i + 1));
            }
        }
        Some(1u64 << US_LOG2_BUCKETS)
    }
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            rx: RxConfig {
                // Every buffer in the ring: with a small rotation, many connections carrying
                // small messages (each takes a whole buffer until its send completes) found
                // the ring empty thousands of times per second and waited (measured: p99 of
                // 1 KiB request/response 1.5–3x lower with all buffers in the ring).
                hot_bytes: 0,
                ..RxConfig::with_mode(RxMode::Auto).low_latency()
            },
            tx: SenderConfig::new(TxMode::Auto),
            limits: Limits::default(),
            max_connections: 10_000,
            nodelay: true,
            bulk_batch: 32,
            bulk_min_wait: Duration::from_micros(200),
        }
    }
}

/// Errors building a [`Proxy`].
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The receiver could not be built.
    #[error("proxy receiver: {0}")]
    Rx(#[from] RxError),
    /// The send ring could not be built.
    #[error("proxy send ring: {0}")]
    Tx(#[from] TxError),
    /// Other set-up I/O.
    #[error("proxy set-up: {0}")]
    Io(#[from] io::Error),
    /// No target to forward to.
    #[error("proxy: no upstream target given")]
    NoTarget,
}

/// A pair's end, with its addresses and what it moved (see [`Proxy::take_ended`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Ended {
    /// The client's address (if the socket still knew it).
    pub client: Option<SocketAddr>,
    /// The target it was forwarded to.
    pub upstream: SocketAddr,
    /// How it ended.
    pub end: End,
    /// What it moved.
    pub stats: PairStats,
    /// How long it lived.
    pub secs: f64,
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let client = self
            .client
            .map_or_else(|| "?".to_string(), |a| a.to_string());
        write!(
            f,
            "{client} -> {}: {:?} after {:.3}s, {} B up, {} B down",
            self.upstream, self.end.kind, self.secs, self.stats.bytes_up, self.stats.bytes_down
        )?;
        if !self.end.detail.is_empty() {
            write!(f, " ({})", self.end.detail)?;
        }
        Ok(())
    }
}

/// What a [`Proxy`] has done so far.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ProxyStats {
    /// Clients accepted.
    pub accepted: u64,
    /// Clients closed at accept (the connection limit, or draining).
    pub rejected: u64,
    /// Pairs open now.
    pub active: u64,
    /// Pairs ended, by kind (in [`EndKind`] order).
    pub ended: [u64; 8],
    /// Bytes forwarded client → upstream.
    pub bytes_up: u64,
    /// Bytes forwarded upstream → client.
    pub bytes_down: u64,
    /// Times a source was paused (backpressure).
    pub pauses: u64,
    /// Most bytes one pair held in one direction.
    pub peak_held: usize,
    /// Bytes held now by all pairs.
    pub held: usize,
    /// Receive path.
    pub rx_path: String,
    /// Send path the ring offers new sockets.
    pub tx_path: String,
    /// Whether the send side rides on the receiver's ring (one ring per thread).
    pub one_ring: bool,
    /// Bytes sent with zero-copy that the kernel did not copy.
    pub tx_zerocopy_bytes: u64,
    /// Bytes sent with zero-copy that the kernel copied anyway (loopback, veth to a local
    /// socket: the loopback rule).
    pub tx_copied_bytes: u64,
    /// Bytes received into zcrx area pages without a copy.
    pub rx_zerocopy_bytes: u64,
    /// Kernel entries made by the proxy thread (receiver's and send ring's, all syscalls the
    /// library counts).
    pub syscalls: u64,
    /// `io_uring_enter` calls among them.
    pub ring_enters: u64,
    /// Receives that ended because the receive ring had no free buffer (re-armed when one
    /// came back; `docs/design/rx.md`).
    pub rx_out_of_buffers: u64,
    /// Connections waiting now for a receive buffer to come back (gauge).
    pub rx_waiting: u64,
    /// Sends in the kernel now (gauge).
    pub tx_in_flight: u64,
    /// Bytes copied to the heap to give their receive buffers back at once, while three
    /// quarters of the receive ring were lent (sends waiting on peers that do not read).
    pub spilled_bytes: u64,
    /// Turns of the loop (waits).
    pub turns: u64,
    /// Received chunks routed (each one receive completion handed to a pair).
    pub chunks: u64,
    /// Most received chunks routed in one turn (the largest harvest).
    pub turn_chunks_max: u64,
    /// Per routed chunk, the time from the wait that harvested it returning to the enter
    /// that issues its send (the turn's processing: every chunk of a harvest waits for the
    /// whole harvest), as a log2 histogram: bucket `i` counts `[2^i, 2^(i+1))` µs, bucket 0
    /// also below 1 µs, the last also above.
    pub hold_us_log2: [u64; 16],
    /// Waits that did not count their sends and returned with nothing received, with sends
    /// in flight (the 5 ms cap reached: the notifications the sends owed had not come).
    /// Waits that counted their sends are [`ProxyStats::counted_timeouts`].
    pub capped_waits: u64,
    /// First-completion waits that counted the sends of their enter
    /// ([`crate::rx::Receiver::count_in_next_wait`]) and lasted their whole timeout (at most
    /// the 5 ms cap): a counted send did not complete inside the enter, or nothing came at
    /// all. Timed by the clock, so a thread that waited for a CPU counts too.
    #[serde(default)]
    pub counted_timeouts: u64,
    /// Waits made in bulk mode (batched: [`ProxyConfig::bulk_batch`]).
    pub bulk_waits: u64,
    /// Switches between bulk and request/response waits.
    pub wait_switches: u64,
    /// Per forwarded chunk, the time from the wait that harvested it returning to the
    /// harvest that saw its send complete (for a copy send: the kernel took the bytes; for a
    /// zero-copy send: its notification, the kernel released the buffer). What the proxy
    /// adds to a message, as far as the proxy can see it: time in the receive queue before
    /// the wait returned is not in it.
    pub forward_us: UsLog2,
    /// [`ProxyStats::forward_us`] of each pair's first chunks (two per direction): a new
    /// connection's first request and response.
    pub forward_new_us: UsLog2,
    /// Per pair, from the accept to the first send to the upstream completing (the first
    /// byte forwarded; includes the upstream connect and the client's first write).
    pub first_forward_us: UsLog2,
}

impl ProxyStats {
    /// Pairs ended with `kind`.
    pub fn ended(&self, kind: EndKind) -> u64 {
        self.ended[kind as usize]
    }

    /// Adds `o` (another thread's) into `self`.
    pub fn add(&mut self, o: &ProxyStats) {
        self.accepted += o.accepted;
        self.rejected += o.rejected;
        self.active += o.active;
        for (a, b) in self.ended.iter_mut().zip(o.ended) {
            *a += b;
        }
        self.bytes_up += o.bytes_up;
        self.bytes_down += o.bytes_down;
        self.pauses += o.pauses;
        self.peak_held = self.peak_held.max(o.peak_held);
        self.held += o.held;
        if self.rx_path.is_empty() {
            self.rx_path.clone_from(&o.rx_path);
            self.tx_path.clone_from(&o.tx_path);
            self.one_ring = o.one_ring;
        }
        self.tx_zerocopy_bytes += o.tx_zerocopy_bytes;
        self.tx_copied_bytes += o.tx_copied_bytes;
        self.rx_zerocopy_bytes += o.rx_zerocopy_bytes;
        self.syscalls += o.syscalls;
        self.ring_enters += o.ring_enters;
        self.rx_out_of_buffers += o.rx_out_of_buffers;
        self.rx_waiting += o.rx_waiting;
        self.tx_in_flight += o.tx_in_flight;
        self.spilled_bytes += o.spilled_bytes;
        self.turns += o.turns;
        self.chunks += o.chunks;
        self.turn_chunks_max = self.turn_chunks_max.max(o.turn_chunks_max);
        for (a, b) in self.hold_us_log2.iter_mut().zip(o.hold_us_log2) {
            *a += b;
        }
        self.capped_waits += o.capped_waits;
        self.counted_timeouts += o.counted_timeouts;
        self.bulk_waits += o.bulk_waits;
        self.wait_switches += o.wait_switches;
        self.forward_us.add(&o.forward_us);
        self.forward_new_us.add(&o.forward_new_us);
        self.first_forward_us.add(&o.first_forward_us);
    }

    /// The `q` quantile (0..=1) of [`ProxyStats::hold_us_log2`], as its bucket's upper
    /// bound in µs (`None` before any chunk).
    pub fn hold_us_quantile(&self, q: f64) -> Option<u64> {
        let total: u64 = self.hold_us_log2.iter().sum();
        if total == 0 {
            return None;
        }
        let want = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.hold_us_log2.iter().enumerate() {
            seen += n;
            if seen >= want {
                return Some(1u64 << (i + 1));
            }
        }
        Some(1u64 << self.hold_us_log2.len())
    }

    /// Fraction of zero-copy sent bytes the kernel copied.
    pub fn copied_fraction(&self) -> Option<f64> {
        let t = self.tx_zerocopy_bytes + self.tx_copied_bytes;
        (t > 0).then(|| self.tx_copied_bytes as f64 / t as f64)
    }
}

struct Slot {
    gen: u32,
    pair: Option<Pair>,
    client: Option<SocketAddr>,
    upstream: SocketAddr,
}

/// Forwards the connections of one listener to one or more targets on one thread: one
/// [`Receiver`] accepting and receiving, one [`SendRing`] on the receiver's ring, a [`Pair`]
/// per connection. Not `Send` (the ring is `SINGLE_ISSUER`): build it on the thread that runs
/// it; several threads each run their own on clones of the listener.
pub struct Proxy {
    // Field order is drop order: the send ring (on the receiver's ring) goes first.
    tx: SendRing,
    rx: Receiver,
    /// Waits on both readiness descriptors when the send ring has its own ring or none
    /// (the plain receiver).
    poller: Option<Poller>,
    rx_starved: bool,
    targets: Vec<SocketAddr>,
    next_target: usize,
    cfg: ProxyConfig,
    slots: Vec<Slot>,
    free: Vec<u32>,
    active: usize,
    by_conn: HashMap<ConnId, u32>,
    by_sock: HashMap<SockId, u32>,
    events: Vec<RxEvent>,
    ended: Vec<Ended>,
    stats: ProxyStats,
    draining: bool,
    next_timers: Instant,
    /// Waits batch completions (the connections stream; `ProxyConfig::bulk_batch`).
    bulk: bool,
    /// Why batched waits are not available, once known.
    bulk_refused: Option<String>,
    /// What set-up could not prepare, and fallbacks taken while running, with why.
    setup_notes: Vec<String>,
    /// The copy fallback is in `setup_notes`.
    spilled_noted: bool,
    /// Pairs hold at most their share of the receive ring (it is low; `mind_the_ring`).
    copying: bool,
    /// What this turn's chunks may take in place beyond the pairs' shares (`mind_the_ring`).
    ring_budget: std::rc::Rc<pair::RingBudget>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("rx", &self.rx.describe())
            .field("targets", &self.targets)
            .field("active", &self.active)
            .finish()
    }
}

/// While the receive ring is low, the pairs within their share hold at most this fraction
/// (1/N) of it together (`Proxy::mind_the_ring`).
const RING_SHARE_PARTS: usize = 8;

/// The most sends of one turn a first-completion wait counts (`Proxy::turn`).
const COUNTED_SENDS_MAX: usize = 16;

const POLLER_RX: u64 = 1;
const POLLER_TX: u64 = 2;

impl Proxy {
    /// A proxy accepting on `listener` and forwarding round-robin to `targets` (starting at
    /// the first; [`Proxy::set_first_target`] spreads threads). The receiver's backend and
    /// the send path are chosen as their configs say, every step down recorded
    /// ([`Proxy::fallbacks`]).
    pub fn new(
        listener: TcpListener,
        targets: Vec<SocketAddr>,
        cfg: ProxyConfig,
    ) -> Result<Self, ProxyError> {
        let mut p = Self::prepare(listener.local_addr()?.ip(), targets, cfg)?;
        p.accept_from(listener)?;
        Ok(p)
    }

    /// Everything [`Proxy::new`] does but the accept, for a listener on `local` that the
    /// caller creates afterwards ([`Proxy::accept_from`]): the rings, the receive buffers and
    /// the descriptor table are ready before any client can connect, so no client waits in
    /// the listen backlog while they are made (`zcio proxy` listens once every thread is
    /// ready).
    pub fn prepare(
        local: std::net::IpAddr,
        targets: Vec<SocketAddr>,
        cfg: ProxyConfig,
    ) -> Result<Self, ProxyError> {
        if targets.is_empty() {
            return Err(ProxyError::NoTarget);
        }
        let mut rx = Receiver::for_listener_at(local, &cfg.rx)?;
        // Four descriptors per pair (each socket on the receiver and, duplicated, on the send
        // ring): the table grows now, not while a burst of clients waits (see
        // `sys::reserve_descriptors`).
        let want = (cfg.max_connections as u64)
            .saturating_mul(FDS_PER_PAIR)
            .saturating_add(64);
        let mut setup_notes = Vec::new();
        if let Err(e) = crate::sys::reserve_descriptors(want) {
            setup_notes.push(format!(
                "descriptor table reserved for {want} -> grown on demand (each growth in a \
                 threaded process waits for an RCU grace period): {e}"
            ));
        }
        // The sends of a turn go to the kernel together, with the next wait's enter (or, on a
        // ring of its own, the next turn's poll): no enter every `submit_batch` sends while a
        // harvest is routed. A full submission queue still submits on its own (256 entries: a
        // harvest of the whole 1,024-buffer ring enters 4 times, not 32).
        let tx_cfg = SendRingConfig {
            submit_batch: usize::MAX,
            ..SendRingConfig::default()
        };
        let mut tx = SendRing::on_receiver(&rx, &tx_cfg)?;
        let poller = if tx.shares_receiver_ring() {
            None
        } else {
            let p = Poller::new(4)?;
            p.add(
                &rx.readiness_fd()?.as_raw_fd(),
                POLLER_RX,
                libc::EPOLLIN as u32,
            )?;
            p.add(
                &tx.readiness_fd()?.as_raw_fd(),
                POLLER_TX,
                libc::EPOLLIN as u32,
            )?;
            Some(p)
        };
        let cap = cfg.max_connections.min(1 << 20);
        Ok(Self {
            tx,
            rx,
            poller,
            rx_starved: false,
            targets,
            next_target: 0,
            cfg,
            // Sized for the connection limit now rather than grown while clients arrive.
            slots: Vec::with_capacity(cap),
            free: Vec::with_capacity(cap),
            active: 0,
            by_conn: HashMap::with_capacity(2 * cap),
            by_sock: HashMap::with_capacity(2 * cap),
            events: Vec::new(),
            ended: Vec::new(),
            stats: ProxyStats::default(),
            draining: false,
            next_timers: Instant::now(),
            bulk: false,
            bulk_refused: None,
            setup_notes,
            spilled_noted: false,
            copying: false,
            ring_budget: Default::default(),
        })
    }

    /// Accepts clients from `listener` from now on (a proxy accepts from one listener; see
    /// [`Proxy::prepare`]).
    pub fn accept_from(&mut self, listener: TcpListener) -> Result<(), ProxyError> {
        Ok(self.rx.accept_from(listener)?)
    }

    /// Forwards new clients to `targets` from now on (round-robin, continuing at the same
    /// position modulo their number); pairs already open keep their upstream.
    pub fn set_targets(&mut self, targets: Vec<SocketAddr>) -> Result<(), ProxyError> {
        if targets.is_empty() {
            return Err(ProxyError::NoTarget);
        }
        self.next_target %= targets.len();
        self.targets = targets;
        Ok(())
    }

    /// The targets new clients are forwarded to.
    pub fn targets(&self) -> &[SocketAddr] {
        &self.targets
    }

    /// Starts the round-robin at target `i` (modulo their number).
    pub fn set_first_target(&mut self, i: usize) {
        self.next_target = i % self.targets.len();
    }

    /// The receiver (its path, counters and fallbacks).
    pub fn receiver(&self) -> &Receiver {
        &self.rx
    }

    /// The send ring (its paths, counters and fallbacks).
    pub fn send_ring(&self) -> &SendRing {
        &self.tx
    }

    /// Every fallback taken: the receiver's, then the send ring's.
    pub fn fallbacks(&self) -> Vec<String> {
        let mut v: Vec<String> = self.rx.fallbacks().iter().map(|f| f.to_string()).collect();
        v.extend(Report::fallbacks(&self.tx).iter().map(|f| f.to_string()));
        v.extend(self.setup_notes.iter().cloned());
        v.extend(self.bulk_refused.iter().cloned());
        v
    }

    /// Pairs open now.
    pub fn active(&self) -> usize {
        self.active
    }

    /// Counters so far.
    pub fn stats(&self) -> ProxyStats {
        let mut s = self.stats.clone();
        s.active = self.active as u64;
        let mut held = 0;
        for p in self.slots.iter().filter_map(|s| s.pair.as_ref()) {
            let ps = p.stats();
            s.bytes_up += ps.bytes_up;
            s.bytes_down += ps.bytes_down;
            s.pauses += ps.pauses;
            s.peak_held = s.peak_held.max(ps.peak_held_up).max(ps.peak_held_down);
            held += p.held();
        }
        s.held = held;
        s.rx_path = self.rx.path().name().to_string();
        s.tx_path = Report::path(&self.tx).to_string();
        s.one_ring = self.tx.shares_receiver_ring();
        let c = Report::counters(&self.tx);
        s.tx_zerocopy_bytes = c.zerocopy_bytes;
        s.tx_copied_bytes = c.copied_bytes;
        let r = self.rx.stats();
        s.rx_zerocopy_bytes = r.zerocopy_bytes;
        s.ring_enters = r.ring_enters + self.tx.enters();
        s.syscalls = r.syscalls + c.syscalls;
        s.rx_out_of_buffers = r.enobufs;
        s.rx_waiting = self.rx.starved() as u64;
        s.tx_in_flight = self.tx.in_flight() as u64;
        s
    }

    /// Pairs that ended since the last call, with how (for the log).
    pub fn take_ended(&mut self) -> Vec<Ended> {
        std::mem::take(&mut self.ended)
    }

    /// Stops taking new clients (each is closed at accept); open pairs go on. See
    /// [`Proxy::drain`].
    pub fn stop_accepting(&mut self) {
        self.draining = true;
    }

    /// Drains: stops accepting and runs until every pair has ended or `bound` has passed;
    /// pairs still open then are reset ([`EndKind::Shutdown`]). Returns how many were reset.
    pub fn drain(&mut self, bound: Duration) -> io::Result<usize> {
        self.stop_accepting();
        let end = Instant::now() + bound;
        while self.active > 0 && Instant::now() < end {
            self.turn(Duration::from_millis(50).min(end - Instant::now()))?;
        }
        let open: Vec<u32> = (0..self.slots.len() as u32)
            .filter(|&i| self.slots[i as usize].pair.is_some())
            .collect();
        let n = open.len();
        for i in open {
            if let Some(p) = self.slots[i as usize].pair.as_mut() {
                let detail = format!("still open after the drain bound ({bound:?})");
                p.abort(
                    End::new(EndKind::Shutdown, None, detail),
                    &mut self.rx,
                    &mut self.tx,
                );
            }
            self.settle(i);
        }
        // What the kernel still holds of the reset sockets comes back now.
        let _ = self.tx.flush(Duration::from_secs(1));
        Ok(n)
    }

    /// One turn of the loop: waits up to `timeout` for the ring (or the sockets, on the
    /// plain path), forwards what was received, recycles what completed, applies
    /// backpressure and timeouts.
    pub fn turn(&mut self, timeout: Duration) -> io::Result<()> {
        let mut events = std::mem::take(&mut self.events);
        // Sends in the submission queue, for the receiver's wait to submit (`prepare`).
        let queued = self.tx.queued_sends();
        let timeout = if self.tx.ready() > 0 {
            Duration::ZERO
        } else {
            timeout.min(self.next_timers.saturating_duration_since(Instant::now()))
        };
        if self.poller.is_some() {
            self.tx.poll().map_err(io::Error::other)?;
            if self.tx.ready() == 0 {
                let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
                if self.rx_starved {
                    // Every receive buffer is held by sends waiting on slow peers: wait
                    // for the send side only (the sockets would poll readable at once).
                    let fd = self.tx.readiness_fd().map_err(io::Error::other)?;
                    net::poll_one(&fd.as_raw_fd(), libc::POLLIN, ms.min(10))?;
                } else if let Some(p) = self.poller.as_mut() {
                    p.wait(ms, |_, _| {})?;
                }
            }
            let before = self.rx.stats().backpressure_waits;
            let n = self.rx.poll(Duration::ZERO, &mut |ev| events.push(ev))?;
            self.rx_starved = n == 0 && self.rx.stats().backpressure_waits > before;
            self.tx.on_ready().map_err(io::Error::other)?;
        } else {
            // With sends out, a wait is capped: their notifications are deferred task work,
            // posted by an enter of this thread; a long wait with nothing else arriving would
            // hold the buffers (and the receives waiting for them) back. (A cap of 1 ms for
            // waits that count their sends, below, made 10 connections' p99 2.5x HAProxy's
            // against 0.85x with 5 ms, 7 rounds each: 40-272 such waits per run reached it
            // against 11-28.)
            let counted = !self.bulk && queued > 0 && queued <= COUNTED_SENDS_MAX;
            let cap = Duration::from_millis(5);
            let capped = self.tx.in_flight() > 0 && timeout > cap;
            let timeout = if capped { cap } else { timeout };
            let t0 = Instant::now();
            // The sends prepared last turn go in with this wait, and a send to a socket with
            // room completes inside its enter (a local peer takes it at once): a
            // first-completion wait counts them and returns on the first completion beyond
            // theirs (the answer), not on theirs alone, which took a second turn and enter
            // per forwarded message. One that does not complete there (a full socket) makes
            // the wait need one completion more: the cap above bounds that.
            // Not after a turn that sent many: then more completions are on their way anyway,
            // and one send among hundreds that did not complete inside the enter held every
            // wait (1,000 connections: 3.5k turns in 7 s against 16k, 0.82x the req/s).
            if self.bulk {
                self.stats.bulk_waits += 1;
            } else if counted {
                self.rx.count_in_next_wait(queued);
            }
            let n = self.rx.poll(timeout, &mut |ev| events.push(ev))?;
            let waited = t0.elapsed();
            if counted {
                if !timeout.is_zero() && waited >= timeout {
                    self.stats.counted_timeouts += 1;
                }
            } else if capped && n == 0 && waited >= cap {
                self.stats.capped_waits += 1;
            }
        }
        let woke = Instant::now();
        self.stats.turns += 1;
        let (chunks, bytes) = events.iter().fold((0u64, 0usize), |(n, b), e| match e {
            RxEvent::Data(c) => (n + 1, b + c.len()),
            _ => (n, b),
        });
        if chunks > 0 {
            self.choose_wait(bytes / chunks as usize >= BULK_CHUNK);
        }
        self.ring_budget.turn.set(Some(woke));
        // Sends that completed in this wait give their buffers back before the ring is
        // judged: what the pairs hold then is what their peers have not taken.
        self.tx.harvest().map_err(io::Error::other)?;
        self.take_completions();
        self.mind_the_ring();
        for ev in events.drain(..) {
            self.on_event(ev, woke);
        }
        self.events = events;
        self.tx.harvest().map_err(io::Error::other)?;
        for _ in 0..8 {
            let mut progress = self.take_completions();
            while let Some(sock) = self.tx.next_writable() {
                progress = true;
                if let Some(&idx) = self.by_sock.get(&sock) {
                    if let Some(p) = self.slots[idx as usize].pair.as_mut() {
                        p.on_writable(sock, &mut self.rx, &mut self.tx);
                    }
                    self.settle(idx);
                }
            }
            if !progress {
                break;
            }
        }
        self.mind_the_ring();
        if self.poller.is_none() {
            // Queued for the receiver's next wait: one enter serves both sides.
            self.tx.prepare();
        }
        let now = Instant::now();
        if chunks > 0 {
            let us = now.duration_since(woke).as_micros() as u64;
            let b = (64 - us.leading_zeros() as usize).saturating_sub(1);
            self.stats.hold_us_log2[b.min(15)] += chunks;
            self.stats.chunks += chunks;
            self.stats.turn_chunks_max = self.stats.turn_chunks_max.max(chunks);
        }
        if now >= self.next_timers {
            self.next_timers = now + self.timer_tick();
            for i in 0..self.slots.len() as u32 {
                if let Some(p) = self.slots[i as usize].pair.as_mut() {
                    if p.check_timers(now, &mut self.rx, &mut self.tx) {
                        self.settle(i);
                    }
                }
            }
        }
        Ok(())
    }

    /// Routes the send completions harvested to their pairs; whether there were any.
    fn take_completions(&mut self) -> bool {
        let mut any = false;
        while let Some((done, buf)) = self.tx.next_completion() {
            any = true;
            let idx = done.token as u32;
            let gen = (done.token >> 32) as u32;
            match self.slots.get_mut(idx as usize) {
                Some(s) if s.gen == gen && s.pair.is_some() => {
                    let p = s.pair.as_mut().expect("checked");
                    p.on_completion(&done, buf, &mut self.rx, &mut self.tx);
                    let t = p.take_timing();
                    self.stats.forward_us.add(&t.forward);
                    self.stats.forward_new_us.add(&t.forward_new);
                    if let Some(us) = t.first_forward {
                        self.stats.first_forward_us.record(us, 1);
                    }
                    self.settle(idx);
                }
                _ => drop(buf),
            }
        }
        any
    }

    /// Batched waits while streaming, first-completion waits otherwise (from the last
    /// harvest with data; `ProxyConfig::bulk_batch`).
    fn choose_wait(&mut self, bulk: bool) {
        let bulk = bulk && self.cfg.bulk_batch > 1 && self.bulk_refused.is_none();
        if bulk == self.bulk || self.poller.is_some() {
            return;
        }
        // Back from bulk: the receiver's configured wait (first completion by default).
        let (batch, min_wait) = (self.cfg.rx.batch, self.cfg.rx.min_wait);
        let ok = if bulk {
            self.rx
                .set_wait(self.cfg.bulk_batch, self.cfg.bulk_min_wait)
        } else {
            self.rx.set_wait(batch, min_wait)
        };
        if !ok {
            self.rx.set_wait(batch, min_wait);
            self.bulk_refused = Some(
                "proxy bulk waits (batched) -> first completion: kernel lacks \
                 IORING_FEAT_MIN_TIMEOUT (Linux 6.12)"
                    .to_string(),
            );
            return;
        }
        self.bulk = bulk;
        self.stats.wait_switches += 1;
    }

    /// How often timers are checked: a tenth of the shortest timeout, within 10 ms..1 s.
    fn timer_tick(&self) -> Duration {
        let l = &self.cfg.limits;
        let t = l
            .idle_timeout
            .map_or(l.connect_timeout, |i| i.min(l.connect_timeout));
        (t / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// While three quarters of the receive ring are lent (or a connection waits for a
    /// buffer), each pair may hold at most its share of the ring, an eighth of it divided by
    /// the pairs open ([`Pair::set_ring_share`]); beyond it a pair sends heap copies of its
    /// chunks and copies what it has queued, so those buffers go back at once. Sends to peers
    /// that do not read hold their buffers until those peers read, and a few such pairs could
    /// otherwise hold the whole ring and stop every connection of the thread (a client that
    /// reads its connections in turn then waits forever). The pairs within their share add at
    /// most an eighth of the ring together. Beyond the shares, this turn's chunks of a
    /// direction that holds nothing from an earlier turn (its peer took every earlier send)
    /// still go in place while the pairs hold less than three quarters of the ring
    /// ([`pair::RingBudget`]): a harvest that lends most of the ring for one turn, its sends
    /// completing at the next enter, is not copied. So at least an eighth keeps turning. The
    /// copies are counted in [`ProxyStats::spilled_bytes`] and recorded once as a fallback.
    /// Costs one pass over the pairs per turn while the ring is low.
    fn mind_the_ring(&mut self) {
        let (lent, total) = self.rx.lent();
        let low = (total > 0 && lent * 4 >= total * 3) || self.rx.starved() > 0;
        if !low && !self.copying {
            return;
        }
        let share = low.then(|| total as usize / (RING_SHARE_PARTS * self.active.max(1)));
        let mut n = 0;
        let mut pinned = 0;
        for s in &mut self.slots {
            if let Some(p) = s.pair.as_mut() {
                n += p.set_ring_share(share);
                pinned += p.in_ring();
            }
        }
        // This turn's chunks of directions whose peers keep reading go in place beyond the
        // shares until the pairs hold three quarters of the ring.
        let left = if low {
            (total as usize * 3 / 4).saturating_sub(pinned)
        } else {
            0
        };
        self.ring_budget.left.set(left);
        self.copying = low;
        if n > 0 {
            self.stats.spilled_bytes += n as u64;
            if !self.spilled_noted {
                self.spilled_noted = true;
                self.setup_notes.push(
                    "receive ring 3/4 lent (sends waiting on peers that do not read) -> chunks \
                     of the pairs beyond their share of it copied to the heap while it is \
                     (ProxyStats::spilled_bytes)"
                        .to_string(),
                );
            }
        }
    }

    fn on_event(&mut self, ev: RxEvent, woke: Instant) {
        match ev {
            RxEvent::Accepted(c) => self.open_pair(c),
            RxEvent::Data(chunk) => {
                if let Some(&idx) = self.by_conn.get(&chunk.conn()) {
                    if let Some(p) = self.slots[idx as usize].pair.as_mut() {
                        p.on_data_at(chunk, woke, &mut self.rx, &mut self.tx);
                    }
                    self.settle(idx);
                }
            }
            RxEvent::Closed(c, err) => {
                if let Some(idx) = self.by_conn.remove(&c) {
                    if let Some(p) = self.slots[idx as usize].pair.as_mut() {
                        p.on_closed(c, err, &mut self.rx, &mut self.tx);
                    }
                    self.settle(idx);
                }
            }
        }
    }

    /// Removes the pair at `idx` if it has ended, logging its end.
    fn settle(&mut self, idx: u32) {
        let s = &mut self.slots[idx as usize];
        if !s.pair.as_ref().is_some_and(|p| p.end().is_some()) {
            return;
        }
        let p = s.pair.take().expect("checked");
        let end = p.end().expect("checked").clone();
        let ps = p.stats();
        for side in [Side::Client, Side::Upstream] {
            self.by_sock.remove(&p.sock(side));
        }
        self.by_conn.retain(|_, v| *v != idx);
        self.stats.ended[end.kind as usize] += 1;
        self.stats.bytes_up += ps.bytes_up;
        self.stats.bytes_down += ps.bytes_down;
        self.stats.pauses += ps.pauses;
        self.stats.peak_held = self
            .stats
            .peak_held
            .max(ps.peak_held_up)
            .max(ps.peak_held_down);
        match end.kind {
            EndKind::Done | EndKind::IdleTimeout => {
                tracing::debug!(client = ?s.client, upstream = %s.upstream, ?end, "pair ended")
            }
            _ => tracing::warn!(client = ?s.client, upstream = %s.upstream, ?end, "pair ended"),
        }
        self.ended.push(Ended {
            client: s.client,
            upstream: s.upstream,
            end,
            stats: ps,
            secs: p.started().elapsed().as_secs_f64(),
        });
        self.free.push(idx);
        self.active -= 1;
    }

    fn reject(&mut self, c: ConnId, why: &str) {
        self.stats.rejected += 1;
        tracing::info!(%c, why, "proxy: client closed at accept");
        self.rx.close(c);
    }

    fn open_pair(&mut self, c: ConnId) {
        self.stats.accepted += 1;
        if self.draining {
            return self.reject(c, "draining");
        }
        if self.active >= self.cfg.max_connections {
            return self.reject(c, "connection limit");
        }
        let client_fd = match self.rx.socket(c).map(|fd| fd.try_clone_to_owned()) {
            Some(Ok(fd)) => fd,
            Some(Err(e)) => return self.reject(c, &format!("dup: {e}")),
            None => return,
        };
        let client = TcpStream::from(client_fd);
        let client_addr = client.peer_addr().ok();
        let target = self.targets[self.next_target % self.targets.len()];
        self.next_target = (self.next_target + 1) % self.targets.len();
        let idx = self.free.pop().unwrap_or_else(|| {
            self.slots.push(Slot {
                gen: 0,
                pair: None,
                client: None,
                upstream: target,
            });
            self.slots.len() as u32 - 1
        });
        let slot = &mut self.slots[idx as usize];
        slot.gen = slot.gen.wrapping_add(1);
        slot.client = client_addr;
        slot.upstream = target;
        let token = (u64::from(slot.gen) << 32) | u64::from(idx);
        self.active += 1;
        match self.connect_pair(c, client, target, token) {
            Ok(mut pair) => {
                pair.set_ring_budget(std::rc::Rc::clone(&self.ring_budget));
                self.by_conn.insert(c, idx);
                self.by_conn
                    .insert(pair.side_conn(Side::Upstream).expect("new"), idx);
                self.by_sock.insert(pair.sock(Side::Client), idx);
                self.by_sock.insert(pair.sock(Side::Upstream), idx);
                self.slots[idx as usize].pair = Some(pair);
            }
            Err((kind, detail)) => {
                // The client is reset: nothing was forwarded.
                if let Some(fd) = self.rx.socket(c) {
                    let _ = net::set_linger_zero(&fd);
                    let _ = net::disconnect(&fd);
                }
                self.rx.close(c);
                let end = End::new(kind, Some(Side::Upstream), detail);
                tracing::warn!(client = ?client_addr, upstream = %target, ?end, "pair ended");
                self.stats.ended[kind as usize] += 1;
                self.ended.push(Ended {
                    client: client_addr,
                    upstream: target,
                    end,
                    stats: PairStats::default(),
                    secs: 0.0,
                });
                self.free.push(idx);
                self.active -= 1;
            }
        }
    }

    /// Starts the upstream connection and registers both sockets on both sides.
    fn connect_pair(
        &mut self,
        c: ConnId,
        client: TcpStream,
        target: SocketAddr,
        token: u64,
    ) -> Result<Pair, (EndKind, String)> {
        let up: OwnedFd = net::connect_start(target)
            .map_err(|e| (EndKind::ConnectFailed, format!("upstream {target}: {e}")))?;
        let setup = |what: &str, e: &dyn std::fmt::Display| {
            (EndKind::ConnectFailed, format!("set-up ({what}): {e}"))
        };
        if self.cfg.nodelay {
            client
                .set_nodelay(true)
                .map_err(|e| setup("TCP_NODELAY", &e))?;
            crate::sys::setsockopt_int(&up, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)
                .map_err(|e| setup("TCP_NODELAY", &e))?;
        }
        let up_rx = up.try_clone().map_err(|e| setup("dup", &e))?;
        let c_tx = self
            .tx
            .add(client, &self.cfg.tx)
            .map_err(|e| setup("client on the send ring", &e))?;
        let u_tx = match self.tx.add(up, &self.cfg.tx) {
            Ok(s) => s,
            Err(e) => {
                self.tx.abandon(c_tx);
                return Err(setup("upstream on the send ring", &e));
            }
        };
        let u_rx = match self.rx.add(TcpStream::from(up_rx)) {
            Ok(u) => u,
            Err(e) => {
                self.tx.abandon(c_tx);
                self.tx.abandon(u_tx);
                return Err(setup("upstream on the receiver", &e));
            }
        };
        Ok(Pair::new(token, (c, c_tx), (u_rx, u_tx), self.cfg.limits))
    }
}

//! Byte streams for tokio on one send ring and one receiver per thread: [`LocalIo`] (the
//! thread's rings, shared by its tasks through a cheap `Clone` handle) and [`TcpStream`]
//! (tokio's `AsyncRead` + `AsyncWrite`, so hyper, tonic, axum and tokio-util codecs run on
//! it).
//!
//! What a stream does with its bytes:
//!
//! - **Writes** (`poll_write`, `write_all`) on a route where the kernel copies anyway
//!   (loopback, local delivery: `auto`'s COPIED verdict, path `uring-copy`) go straight to
//!   the socket with one non-blocking `sendmsg` from the caller's slices, waiting for room on
//!   tokio's reactor as tokio's stream does: one copy, by the kernel
//!   ([`LocalIoConfig::direct_min`]). Elsewhere they are copied into buffers of the thread's
//!   send pool and handed to the send ring; the sends of every stream of the thread go to the
//!   kernel in one `io_uring_enter` per scheduler tick (the driver task runs after the tasks
//!   that wrote). That is fewer syscalls, **not zero-copy**: the bytes are copied once into
//!   the pool. [`LocalIo::describe`] counts the writes of each kind.
//! - [`TcpStream::send_bytes`] lends an owned `bytes::Bytes` to the kernel as it is (io_uring
//!   `SEND_ZC` where it pays, no pool, no copy in user space) and drops it when the kernel's
//!   notification says it is done: for response bodies that already are `Bytes`.
//! - **Reads** take the receiver's chunks (a provided-buffer ring with multishot receive on
//!   the ring backends) and copy them into the caller's `ReadBuf`, as any `AsyncRead` must.
//!   A stream that holds more than [`LocalIoConfig::rx_queue`] bytes unread is paused (TCP's
//!   window closes) until it reads.
//!
//! `poll_flush` hands the partly filled buffer to the ring and returns; the bytes go at the
//! driver's next tick. `poll_shutdown` waits until every send of the stream has completed,
//! then shuts the sending direction down: the peer reads its end of stream right after the
//! last byte. A send the kernel failed (a reset) fails the next write, flush or shutdown.
//! Dropping a stream closes it once its sends are done.
//!
//! Threads: the rings are the thread's (`SINGLE_ISSUER`), so `LocalIo` and the streams are
//! not `Send`. Run them in a `LocalSet` (a task per connection with `spawn_local`), on one
//! current-thread runtime per core for a server that scales (see the crate docs).

use super::{in_runtime, register, Borrowed};
use crate::buf::pool::{Pool, PoolBuf};
use crate::rx::{ConnId, Receiver, RxConfig, RxEvent};
use crate::stats::{Counters, Fallback, Report};
use crate::tx::{SendError, SendRing, SendRingConfig, SenderConfig, SockId, TxBuf, TxMode};
use ::tokio::io::unix::AsyncFd;
use ::tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, Waker};

/// Settings of a thread's [`LocalIo`].
#[derive(Debug, Clone)]
pub struct LocalIoConfig {
    /// The send ring (256 submission entries, a 65,536-slot registered-file table).
    pub ring: SendRingConfig,
    /// Each stream's send settings: the path ([`TxMode::Auto`]) and `depth`, the sends of
    /// one stream in flight at once (64).
    pub tx: SenderConfig,
    /// The receiver: a provided-buffer ring of 256 × 64 KiB (16 MiB for every stream of the
    /// thread, 1 MiB of it in rotation), consumed incrementally where the kernel can
    /// (`IOU_PBUF_RING_INC`, Linux 6.12; else whole buffers in bundles, recorded): each
    /// receive takes the next bytes of the current buffer, so the small messages of many
    /// streams (requests) share a few cache-warm buffers instead of taking a 64 KiB buffer
    /// each.
    pub rx: RxConfig,
    /// Bytes per send-pool buffer (64 KiB).
    pub buf_size: usize,
    /// Send-pool buffers (256: 16 MiB for every stream of the thread); a write waits for a
    /// free one.
    pub buffers: usize,
    /// Unread bytes a stream may hold before its receive pauses (256 KiB).
    pub rx_queue: usize,
    /// Writes of at least this many bytes (0: every write) go straight to the socket, with
    /// one non-blocking `sendmsg` from the caller's slices, when the stream's sends are
    /// copied by the kernel anyway (its path is `uring-copy`: `auto` found the route copies,
    /// e.g. loopback) and nothing of it is queued on the ring; other writes are copied into
    /// the send pool and batched on the ring. `usize::MAX` turns direct writes off.
    pub direct_min: usize,
}

impl Default for LocalIoConfig {
    fn default() -> Self {
        Self {
            ring: SendRingConfig::default(),
            tx: SenderConfig::new(TxMode::Auto),
            rx: RxConfig {
                incremental: true,
                ..RxConfig::default()
            },
            buf_size: 64 << 10,
            buffers: 256,
            rx_queue: 256 << 10,
            direct_min: 0,
        }
    }
}

/// The send ring and the receiver of one thread, shared by the thread's tasks: a cheap
/// handle (`Clone`, not `Send`). Streams ([`TcpStream`]) are added to it and removed from it
/// without a ring each. Create it inside a `LocalSet` (or a `LocalRuntime`): it spawns its
/// driver task with `tokio::task::spawn_local`.
#[derive(Clone)]
pub struct LocalIo {
    core: Rc<RefCell<Core>>,
}

/// The paths, then (`{:#?}` for one line each) what every stream waits for and what the
/// driver and both rings hold: enough to tell a stalled stream's cause from a dump.
impl std::fmt::Debug for LocalIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Ok(c) = self.core.try_borrow() else {
            // Formatted from inside the driver's tick.
            return f.debug_struct("LocalIo").finish_non_exhaustive();
        };
        let streams: Vec<_> = c
            .conns
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.conn.as_ref().map(|cn| (i, cn)))
            .collect();
        f.debug_struct("LocalIo")
            .field(
                "describe",
                &format_args!("send: {}; receive: {}", c.tx.describe(), c.rx.describe()),
            )
            .field("streams", &streams)
            .field("dirty", &c.dirty)
            .field("pool_waiters", &c.pool_waiters)
            .field("pool_free", &c.pool.available())
            .field("kicked", &c.kicked)
            .field("rx_kicked", &c.rx_kicked)
            .field("driver_waker", &c.driver.is_some())
            .field("stopped", &c.stopped)
            .field("tx_in_flight", &c.tx.in_flight())
            .field("rx_open", &c.rx.open_connections())
            .field("rx_starved", &c.rx.starved())
            .field("tx", &c.tx.counters_total())
            .field("rx", c.rx.stats())
            .finish()
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("peer", &self.peer)
            .field("queued", &self.queued)
            .field("chunks", &self.chunks.len())
            .field("receiving", &self.rx.is_some())
            .field("paused", &self.paused)
            .field("eof", &self.eof)
            .field("rx_err", &self.rx_err)
            .field("reader_waiting", &self.read_waker.is_some())
            .field("filling", &self.cur.as_ref().map(|b| b.len()))
            .field("in_flight", &self.in_flight)
            .field("writer_waiting", &self.write_waker.is_some())
            .field("tx_err", &self.tx_err)
            .field("shut_wr", &self.shut_wr)
            .field("shut_when_done", &self.shut_when_done)
            .field("handles", &self.handles)
            .finish()
    }
}

struct Core {
    tx: SendRing,
    rx: Receiver,
    pool: Pool,
    cfg: LocalIoConfig,
    tx_fd: AsyncFd<Borrowed>,
    rx_fd: AsyncFd<Borrowed>,
    conns: Vec<Slot>,
    free: Vec<u32>,
    /// The stream of each receiver connection, by the connection's slot index: a lookup per
    /// chunk, without hashing (SipHash cost 1.3 % of a small-request server's samples).
    by_rx: RxIndex,
    /// The receiver's events of the harvest being dispatched.
    events: Vec<RxEvent>,
    /// Streams with a partly filled buffer to hand to the ring at the next tick.
    dirty: Vec<u32>,
    /// Streams waiting for a free pool buffer.
    pool_waiters: Vec<u32>,
    /// Sends are staged (submit at the next tick), or a connection was added (arm it).
    kicked: bool,
    rx_kicked: bool,
    /// The driver is running its tick (a kick then needs no wake).
    in_tick: bool,
    driver: Option<Waker>,
    stopped: bool,
    /// Writes that went straight to their socket, and their bytes.
    direct: (u64, u64),
    /// Writes copied into the send pool, and their bytes.
    pooled: (u64, u64),
}

struct Slot {
    gen: u32,
    conn: Option<Conn>,
}

struct Conn {
    sock: Option<SockId>,
    rx: Option<ConnId>,
    chunks: VecDeque<crate::rx::RxChunk>,
    /// Bytes of the front chunk already read.
    off: usize,
    queued: usize,
    eof: bool,
    rx_err: Option<io::Error>,
    paused: bool,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
    /// The buffer being filled by writes.
    cur: Option<PoolBuf>,
    in_flight: usize,
    /// The first send the kernel failed (fails later writes).
    tx_err: Option<SendError>,
    shut_wr: bool,
    /// The socket registered with tokio's reactor for `WRITABLE`: made when a direct write
    /// first finds the socket buffer full, to wait for room as tokio's stream does.
    wfd: Option<AsyncFd<std::os::fd::OwnedFd>>,
    /// Shut the sending direction down once the sends are done (the write half dropped).
    shut_when_done: bool,
    /// Handles alive (a stream, or its two halves).
    handles: u8,
    peer: Option<SocketAddr>,
    local: Option<SocketAddr>,
}

/// Receiver connection → stream index, a slot per receiver connection index (the receiver
/// reuses small indices), each holding the id it was made for, so a stale id finds nothing.
#[derive(Default)]
struct RxIndex(Vec<Option<(ConnId, u32)>>);

impl RxIndex {
    fn insert(&mut self, id: ConnId, idx: u32) {
        let i = id.index();
        if self.0.len() <= i {
            self.0.resize(i + 1, None);
        }
        self.0[i] = Some((id, idx));
    }
    fn get(&self, id: ConnId) -> Option<u32> {
        match self.0.get(id.index()) {
            Some(Some((c, idx))) if *c == id => Some(*idx),
            _ => None,
        }
    }
    fn remove(&mut self, id: ConnId) -> Option<u32> {
        let idx = self.get(id)?;
        self.0[id.index()] = None;
        Some(idx)
    }
}

/// Which stream of a [`LocalIo`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    idx: u32,
    gen: u32,
}

impl Key {
    fn token(self) -> u64 {
        (u64::from(self.gen) << 32) | u64::from(self.idx)
    }
    fn from_token(t: u64) -> Self {
        Key {
            idx: t as u32,
            gen: (t >> 32) as u32,
        }
    }
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the stream is closed")
}

impl LocalIo {
    /// The thread's rings with the default settings ([`LocalIoConfig::default`]).
    pub fn new() -> io::Result<Self> {
        Self::with_config(LocalIoConfig::default())
    }

    /// The thread's rings: a send ring with the send pool registered (fixed buffers), and a
    /// receiver. An error outside a tokio runtime. Each path not taken (no io_uring, no
    /// memory to register the pool) is a recorded fallback ([`LocalIo::fallbacks`]).
    pub fn with_config(cfg: LocalIoConfig) -> io::Result<Self> {
        in_runtime()?;
        let mut rx = Receiver::new(&cfg.rx)?;
        // The driver watches the receiver's descriptor through tokio (edge-triggered): no
        // eventfd read per harvest.
        rx.set_edge_readiness();
        let mut tx = SendRing::new(&cfg.ring)?;
        let pool = Pool::new(cfg.buf_size, cfg.buffers, false)?;
        if tx.has_uring() {
            // A failure is recorded by the ring; sends then pin pages per send.
            let _ = tx.register_pool(&pool);
        }
        let tx_fd = register(tx.readiness_fd()?)?;
        // The same for the send ring's descriptor.
        tx.set_edge_readiness(true)?;
        let rx_fd = register(rx.readiness_fd()?)?;
        let core = Rc::new(RefCell::new(Core {
            tx,
            rx,
            pool,
            cfg,
            tx_fd,
            rx_fd,
            conns: Vec::new(),
            free: Vec::new(),
            by_rx: RxIndex::default(),
            events: Vec::new(),
            dirty: Vec::new(),
            pool_waiters: Vec::new(),
            kicked: false,
            rx_kicked: false,
            in_tick: false,
            driver: None,
            stopped: false,
            direct: (0, 0),
            pooled: (0, 0),
        }));
        ::tokio::task::spawn_local(drive(Rc::downgrade(&core)));
        Ok(Self { core })
    }

    /// Adds a connected `std` stream: its receives go to the thread's receiver, its sends to
    /// the thread's send ring (on a duplicate of the descriptor). No ring is made.
    pub fn from_std(&self, s: std::net::TcpStream) -> io::Result<TcpStream> {
        s.set_nonblocking(true)?;
        let peer = s.peer_addr().ok();
        let local = s.local_addr().ok();
        let dup = s.try_clone()?;
        let mut c = self.core.borrow_mut();
        let tx_cfg = c.cfg.tx.clone();
        let sock = c.tx.add(dup, &tx_cfg)?;
        let rx = match c.rx.add(s) {
            Ok(id) => id,
            Err(e) => {
                let _ = c.tx.close(sock);
                return Err(e);
            }
        };
        let conn = Conn {
            sock: Some(sock),
            rx: Some(rx),
            chunks: VecDeque::new(),
            off: 0,
            queued: 0,
            eof: false,
            rx_err: None,
            paused: false,
            read_waker: None,
            write_waker: None,
            cur: None,
            in_flight: 0,
            tx_err: None,
            shut_wr: false,
            wfd: None,
            shut_when_done: false,
            handles: 1,
            peer,
            local,
        };
        let idx = match c.free.pop() {
            Some(i) => i,
            None => {
                c.conns.push(Slot { gen: 0, conn: None });
                (c.conns.len() - 1) as u32
            }
        };
        let slot = &mut c.conns[idx as usize];
        slot.gen = slot.gen.wrapping_add(1);
        slot.conn = Some(conn);
        let key = Key { idx, gen: slot.gen };
        c.by_rx.insert(rx, idx);
        // The receiver arms the new connection's receive at its next harvest.
        c.rx_kicked = true;
        c.kick();
        drop(c);
        Ok(TcpStream {
            io: self.clone(),
            key,
        })
    }

    /// Adds a connected tokio stream (taken off tokio's reactor with `into_std`).
    pub fn from_tokio(&self, s: ::tokio::net::TcpStream) -> io::Result<TcpStream> {
        self.from_std(s.into_std()?)
    }

    /// Connects to `addr` (with tokio) and adds the stream.
    pub async fn connect(&self, addr: impl ::tokio::net::ToSocketAddrs) -> io::Result<TcpStream> {
        let s = ::tokio::net::TcpStream::connect(addr).await?;
        self.from_tokio(s)
    }

    /// Streams open (closing ones included).
    pub fn streams(&self) -> usize {
        self.core
            .borrow()
            .conns
            .iter()
            .filter(|s| s.conn.is_some())
            .count()
    }

    /// One line: the send ring's path and the mix of paths its sends took (direct writes
    /// count as `copy`), how many writes went straight to their socket and how many through
    /// the send pool, and the receiver's backend.
    pub fn describe(&self) -> String {
        let c = self.core.borrow();
        format!(
            "send: {}; writes: {} direct ({} B), {} through the pool ({} B); receive: {}",
            c.tx.describe(),
            c.direct.0,
            c.direct.1,
            c.pooled.0,
            c.pooled.1,
            c.rx.describe()
        )
    }

    /// The send ring's counters (bytes, sends, syscalls, zero-copy and copied bytes).
    pub fn tx_counters(&self) -> Counters {
        self.core.borrow().tx.counters_total()
    }

    /// The send ring's and the receiver's fallbacks, with their reasons.
    pub fn fallbacks(&self) -> Vec<Fallback> {
        let c = self.core.borrow();
        let mut v = c.tx.fallbacks().to_vec();
        v.extend(c.rx.fallbacks().iter().cloned());
        v
    }

    /// The receiver's counters.
    pub fn rx_counters(&self) -> Counters {
        self.core.borrow().rx.counters()
    }

    /// The receiver's own counters: receives re-armed, the times its buffers ran out, waits
    /// held back because every buffer was lent.
    pub fn rx_stats(&self) -> crate::rx::RxCounters {
        self.core.borrow().rx.stats().clone()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Core) -> R) -> R {
        let mut c = self.core.borrow_mut();
        let r = f(&mut c);
        drop(c);
        r
    }
}

impl Core {
    fn conn(&mut self, k: Key) -> Option<&mut Conn> {
        self.conns
            .get_mut(k.idx as usize)
            .filter(|s| s.gen == k.gen)
            .and_then(|s| s.conn.as_mut())
    }

    fn key_of(&self, idx: u32) -> Key {
        Key {
            idx,
            gen: self.conns[idx as usize].gen,
        }
    }

    /// A write straight to the socket from the caller's slices ([`LocalIoConfig::direct_min`]);
    /// `None` when it does not apply (a zero-copy path, or a write smaller than a pool buffer
    /// while bytes of the stream are queued on the ring), and the write goes through the pool.
    /// A larger write behind queued bytes waits for their completions (the bytes keep their
    /// order) instead of copying into the pool, which would keep the ring busy and every
    /// later write copied twice; a small one (a response head after a `send_bytes` body) is
    /// copied and queued behind them, which costs less than waiting.
    fn write_direct(
        &mut self,
        k: Key,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Option<Poll<io::Result<usize>>> {
        let sock = self.conn(k)?.sock?;
        if self.tx.sock_path(sock)?.is_zero_copy() {
            return None;
        }
        let small = bufs.iter().map(|b| b.len()).sum::<usize>() < self.cfg.buf_size;
        let conn = self.conn(k)?;
        if conn.cur.as_ref().is_some_and(|b| !b.is_empty()) || conn.in_flight > 0 {
            if small {
                return None;
            }
            self.seal(k);
            let conn = self.conn(k)?;
            conn.write_waker = Some(cx.waker().clone());
            return Some(Poll::Pending);
        }
        let mut wfd = conn.wfd.take();
        let r = loop {
            match self.tx.send_direct(sock, bufs) {
                Ok(None) => break None,
                Ok(Some(n)) => {
                    self.direct.0 += 1;
                    self.direct.1 += n as u64;
                    break Some(Poll::Ready(Ok(n)));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if wfd.is_none() {
                        let fd = self.tx.socket(sock)?;
                        match crate::sys::ready::tokio_register_for(
                            fd,
                            ::tokio::io::Interest::WRITABLE,
                        ) {
                            Ok(f) => wfd = Some(f),
                            Err(e) => break Some(Poll::Ready(Err(e))),
                        }
                    }
                    match wfd.as_ref().expect("registered").poll_write_ready(cx) {
                        // Room since the send: try again (the readiness is cleared first, so
                        // a later full buffer waits for the next edge).
                        Poll::Ready(Ok(mut g)) => g.clear_ready(),
                        Poll::Ready(Err(e)) => break Some(Poll::Ready(Err(e))),
                        Poll::Pending => break Some(Poll::Pending),
                    }
                }
                Err(e) => {
                    if let (Some(c), Some(errno)) = (self.conn(k), e.raw_os_error()) {
                        c.tx_err.get_or_insert(SendError::from_errno(errno));
                    }
                    break Some(Poll::Ready(Err(e)));
                }
            }
        };
        if let Some(c) = self.conn(k) {
            c.wfd = wfd;
        }
        r
    }

    /// Wakes the driver (once until it runs).
    fn kick(&mut self) {
        if !self.kicked {
            self.kicked = true;
            if !self.in_tick {
                if let Some(w) = &self.driver {
                    w.wake_by_ref();
                }
            }
        }
    }

    /// Hands a stream's partly filled buffer to the ring.
    fn seal(&mut self, k: Key) {
        let Some(c) = self.conn(k) else { return };
        let (Some(buf), Some(sock)) = (c.cur.take(), c.sock) else {
            return;
        };
        if buf.is_empty() {
            return;
        }
        match self.tx.send_with(sock, buf, k.token()) {
            Ok(_) => {
                let c = self.conn(k).expect("live");
                c.in_flight += 1;
                self.kick();
            }
            Err(r) => {
                // Backpressure (the stream's depth): the buffer waits for a completion.
                let c = self.conn(k).expect("live");
                c.cur = r.buf.into_pool();
                if !r.reason.is_backpressure() {
                    c.tx_err.get_or_insert(SendError::Closed);
                }
            }
        }
    }

    fn wake(w: &mut Option<Waker>, out: &mut Vec<Waker>) {
        if let Some(w) = w.take() {
            out.push(w);
        }
    }

    /// One tick of the driver: hands partly filled buffers to the ring, submits, harvests
    /// both rings, and collects the wakers of the streams that can go on.
    fn tick(&mut self, cx: &mut Context<'_>, wake: &mut Vec<Waker>) {
        self.in_tick = true;
        let done = self.rounds(cx, wake);
        self.in_tick = false;
        if !done {
            // Still busy after many rounds: let the other tasks run, then come back.
            cx.waker().wake_by_ref();
        }
    }

    /// The rounds of a tick; false when work was still coming in after the last one.
    fn rounds(&mut self, cx: &mut Context<'_>, wake: &mut Vec<Waker>) -> bool {
        let mut idle_polled = false;
        for _ in 0..64 {
            let mut progress = false;
            for idx in std::mem::take(&mut self.dirty) {
                let k = self.key_of(idx);
                self.seal(k);
            }
            let kicked = std::mem::take(&mut self.kicked);
            let tx_res = match self.tx_fd.poll_read_ready(cx) {
                Poll::Ready(Ok(mut g)) => {
                    progress = true;
                    let r = self.tx.on_ready().map(drop);
                    g.clear_ready();
                    r
                }
                Poll::Ready(Err(e)) => Err(e.into_tx()),
                Poll::Pending if kicked => self.tx.poll().map(drop),
                Poll::Pending => Ok(()),
            };
            if let Err(e) = tx_res {
                tracing::warn!(error = %e, "zcio::tokio::LocalIo: the send ring failed");
            }
            while let Some((done, buf)) = self.tx.next_completion() {
                drop(buf);
                progress = true;
                let k = Key::from_token(done.token);
                let Some(c) = self.conn(k) else { continue };
                c.in_flight -= 1;
                if let Some(e) = done.error {
                    c.tx_err.get_or_insert(e);
                }
                if c.cur.as_ref().is_some_and(|b| !b.is_empty()) && !self.dirty.contains(&k.idx) {
                    // A buffer the ring refused (the stream's depth) goes now, whether or not
                    // its task is waiting to write.
                    self.dirty.push(k.idx);
                }
                let c = self.conn(k).expect("live");
                Self::wake(&mut c.write_waker, wake);
                self.maybe_finish(k);
            }
            if !self.pool_waiters.is_empty() && self.pool.available() > 0 {
                for idx in std::mem::take(&mut self.pool_waiters) {
                    let k = self.key_of(idx);
                    if let Some(c) = self.conn(k) {
                        Self::wake(&mut c.write_waker, wake);
                    }
                }
            }
            // Reused: a tick takes the events of one harvest.
            let mut events = std::mem::take(&mut self.events);
            let armed = std::mem::take(&mut self.rx_kicked);
            let rx_res = match self.rx_fd.poll_read_ready(cx) {
                Poll::Ready(Ok(mut g)) => {
                    progress = true;
                    let r = self.rx.on_ready(&mut |ev| events.push(ev)).map(drop);
                    g.clear_ready();
                    r
                }
                Poll::Ready(Err(e)) => Err(e),
                // A connection was added: the receiver arms its receive when it harvests.
                Poll::Pending if armed => self.rx.on_ready(&mut |ev| events.push(ev)).map(drop),
                Poll::Pending => Ok(()),
            };
            if let Err(e) = rx_res {
                tracing::warn!(error = %e, "zcio::tokio::LocalIo: the receiver failed");
            }
            for ev in events.drain(..) {
                progress = true;
                self.dispatch(ev, wake);
            }
            self.events = events;
            if !progress && self.dirty.is_empty() && !self.kicked && !self.rx_kicked {
                if self.tx.in_flight() > 0 && !idle_polled {
                    // Before sleeping, as every waiter on the ring does: a failed zero-copy
                    // request's late notification is settled only by an enter, which no
                    // readiness event would start.
                    idle_polled = true;
                    if self.tx.poll().is_ok_and(|n| n > 0) {
                        continue;
                    }
                }
                return true;
            }
        }
        false
    }

    fn dispatch(&mut self, ev: RxEvent, wake: &mut Vec<Waker>) {
        match ev {
            RxEvent::Accepted(_) => {}
            RxEvent::Data(chunk) => {
                let Some(idx) = self.by_rx.get(chunk.conn()) else {
                    return;
                };
                let limit = self.cfg.rx_queue;
                let k = self.key_of(idx);
                let Some(c) = self.conn(k) else { return };
                c.queued += chunk.len();
                c.chunks.push_back(chunk);
                Self::wake(&mut c.read_waker, wake);
                if c.queued > limit && !c.paused {
                    c.paused = true;
                    let id = c.rx;
                    if let Some(id) = id {
                        self.rx.pause(id);
                        // The pause's cancel goes to the kernel at the receiver's next enter.
                        self.rx_kicked = true;
                    }
                }
            }
            RxEvent::Closed(id, err) => {
                let Some(idx) = self.by_rx.remove(id) else {
                    return;
                };
                let k = self.key_of(idx);
                let Some(c) = self.conn(k) else { return };
                c.rx = None;
                c.eof = true;
                c.rx_err = err;
                Self::wake(&mut c.read_waker, wake);
                self.maybe_finish(k);
            }
        }
    }

    /// A stream whose handles are gone is closed once its sends are done; a stream whose
    /// write half is gone is shut down then.
    fn maybe_finish(&mut self, k: Key) {
        let Some(c) = self.conn(k) else { return };
        if c.in_flight > 0 || c.cur.as_ref().is_some_and(|b| !b.is_empty()) {
            return;
        }
        if c.shut_when_done && !c.shut_wr {
            c.shut_wr = true;
            if let Some(sock) = c.sock {
                let _ = self.tx.shutdown(sock, std::net::Shutdown::Write);
            }
        }
        let Some(c) = self.conn(k) else { return };
        if c.handles > 0 {
            return;
        }
        let (sock, rx) = (c.sock.take(), c.rx.take());
        if let Some(sock) = sock {
            let _ = self.tx.close(sock);
        }
        if let Some(rx) = rx {
            self.by_rx.remove(rx);
            self.rx.close(rx);
        }
        self.conns[k.idx as usize].conn = None;
        self.free.push(k.idx);
    }
}

trait IntoTx {
    fn into_tx(self) -> crate::tx::TxError;
}

impl IntoTx for io::Error {
    fn into_tx(self) -> crate::tx::TxError {
        crate::tx::TxError::Socket {
            what: "waiting on the send ring's readiness descriptor".into(),
            source: self,
        }
    }
}

/// The driver task: waits on both rings' readiness descriptors and on kicks from the
/// streams, runs [`Core::tick`], wakes the streams that can go on. Ends when the last
/// handle is gone.
async fn drive(core: Weak<RefCell<Core>>) {
    let mut wake = Vec::new();
    std::future::poll_fn(|cx| {
        let Some(rc) = core.upgrade() else {
            return Poll::Ready(());
        };
        {
            let mut c = rc.borrow_mut();
            if c.stopped {
                return Poll::Ready(());
            }
            if !c.driver.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                c.driver = Some(cx.waker().clone());
            }
            c.tick(cx, &mut wake);
        }
        drop(rc);
        for w in wake.drain(..) {
            w.wake();
        }
        Poll::Pending
    })
    .await
}

impl Drop for Core {
    fn drop(&mut self) {
        self.stopped = true;
        if let Some(w) = self.driver.take() {
            w.wake();
        }
    }
}

/// A TCP connection on the thread's [`LocalIo`]: tokio's `AsyncRead` and `AsyncWrite`.
/// Writes go straight to the socket where the route copies anyway, else are copied into the
/// thread's send pool and batched on the ring (fewer syscalls, not zero-copy); [`TcpStream::send_bytes`] lends `Bytes` without a copy; reads copy the
/// receiver's chunks. See the [`zcio::tokio`](crate::tokio) docs.
pub struct TcpStream {
    io: LocalIo,
    key: Key,
}

impl std::fmt::Debug for TcpStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStream")
            .field("peer", &self.peer_addr().ok())
            .finish()
    }
}

/// The read half of a [`TcpStream`] ([`TcpStream::into_split`]).
#[derive(Debug)]
pub struct OwnedReadHalf {
    inner: Half,
}

/// The write half of a [`TcpStream`] ([`TcpStream::into_split`]); dropping it shuts the
/// sending direction down once its sends are done, as tokio's does.
#[derive(Debug)]
pub struct OwnedWriteHalf {
    inner: Half,
}

struct Half {
    io: LocalIo,
    key: Key,
}

impl std::fmt::Debug for Half {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Half").field("key", &self.key).finish()
    }
}

impl TcpStream {
    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        addr_of(&self.io, self.key, |c| c.peer)
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        addr_of(&self.io, self.key, |c| c.local)
    }

    /// Lends `bytes` to the kernel as they are: after what was written before, without a
    /// copy in user space (io_uring `SEND_ZC` where zero-copy pays; `auto` sends by copy on
    /// the ring where completions say the kernel copies anyway, e.g. loopback), and drops
    /// them when the kernel is done. Returns once the send is queued (waiting while the
    /// stream has `depth` sends in flight); its failure fails a later write.
    pub async fn send_bytes(&mut self, bytes: bytes::Bytes) -> io::Result<()> {
        send_bytes(&self.io, self.key, bytes).await
    }

    /// Splits the stream into a read half and a write half that can be moved to different
    /// tasks of the same thread.
    pub fn into_split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        let (io, key) = (self.io.clone(), self.key);
        std::mem::forget(self);
        io.with(|c| {
            if let Some(c) = c.conn(key) {
                c.handles = 2;
            }
        });
        (
            OwnedReadHalf {
                inner: Half {
                    io: io.clone(),
                    key,
                },
            },
            OwnedWriteHalf {
                inner: Half { io, key },
            },
        )
    }
}

fn addr_of(
    io: &LocalIo,
    k: Key,
    f: impl Fn(&Conn) -> Option<SocketAddr>,
) -> io::Result<SocketAddr> {
    io.with(|c| c.conn(k).and_then(|c| f(c))).ok_or_else(closed)
}

async fn send_bytes(io: &LocalIo, k: Key, bytes: bytes::Bytes) -> io::Result<()> {
    let mut buf = Some(TxBuf::Bytes(bytes));
    std::future::poll_fn(|cx| {
        io.with(|c| {
            c.seal(k);
            let conn = c.conn(k).ok_or_else(closed)?;
            if let Some(e) = conn.tx_err.clone() {
                return Poll::Ready(Err(e.into()));
            }
            if conn.shut_wr {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            }
            let sock = conn.sock.ok_or_else(closed)?;
            if conn.cur.is_some() {
                // The buffer written before did not fit in the ring yet: it goes first.
                conn.write_waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
            match c
                .tx
                .send_with(sock, buf.take().expect("sent once"), k.token())
            {
                Ok(_) => {
                    c.conn(k).expect("live").in_flight += 1;
                    c.kick();
                    Poll::Ready(Ok(()))
                }
                Err(r) if r.reason.is_backpressure() => {
                    buf = Some(r.buf);
                    c.conn(k).expect("live").write_waker = Some(cx.waker().clone());
                    Poll::Pending
                }
                Err(_) => Poll::Ready(Err(closed())),
            }
        })
    })
    .await
}

fn poll_read(
    io: &LocalIo,
    k: Key,
    cx: &mut Context<'_>,
    out: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    io.with(|c| {
        let limit = c.cfg.rx_queue;
        let Some(conn) = c.conn(k) else {
            return Poll::Ready(Err(closed()));
        };
        let mut got = false;
        while out.remaining() > 0 {
            let Some(front) = conn.chunks.front() else {
                break;
            };
            let n = (front.len() - conn.off).min(out.remaining());
            out.put_slice(&front[conn.off..conn.off + n]);
            conn.off += n;
            conn.queued -= n;
            got = true;
            if conn.off == front.len() {
                conn.chunks.pop_front();
                conn.off = 0;
            }
        }
        if got {
            if c.rx.starved() > 0 {
                // Buffers came back: the receives that ran out of them are armed again at
                // the receiver's next harvest, which no readiness event would start.
                c.rx_kicked = true;
                c.kick();
            }
            let conn = c.conn(k).expect("live");
            if conn.paused && conn.queued <= limit / 2 {
                conn.paused = false;
                let id = conn.rx;
                if let Some(id) = id {
                    if let Err(e) = c.rx.resume(id) {
                        return Poll::Ready(Err(e));
                    }
                    // The receive is armed again at the receiver's next enter.
                    c.rx_kicked = true;
                    c.kick();
                }
            }
            return Poll::Ready(Ok(()));
        }
        if let Some(e) = conn.rx_err.take() {
            return Poll::Ready(Err(e));
        }
        if conn.eof {
            return Poll::Ready(Ok(()));
        }
        if !conn
            .read_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            conn.read_waker = Some(cx.waker().clone());
        }
        Poll::Pending
    })
}

fn poll_write(
    io: &LocalIo,
    k: Key,
    cx: &mut Context<'_>,
    bufs: &[io::IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    io.with(|c| {
        let Some(conn) = c.conn(k) else {
            return Poll::Ready(Err(closed()));
        };
        if let Some(e) = conn.tx_err.clone() {
            return Poll::Ready(Err(e.into()));
        }
        if conn.shut_wr || conn.shut_when_done {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the stream's sending direction is shut down",
            )));
        }
        if bufs.iter().map(|b| b.len()).sum::<usize>() >= c.cfg.direct_min.max(1) {
            if let Some(r) = c.write_direct(k, cx, bufs) {
                return r;
            }
        }
        let mut n = 0;
        'outer: for b in bufs {
            let mut b: &[u8] = b;
            while !b.is_empty() {
                let conn = c.conn(k).expect("live");
                let full = conn
                    .cur
                    .as_ref()
                    .is_some_and(|cur| cur.len() == cur.capacity());
                if full {
                    c.seal(k);
                    if c.conn(k).expect("live").cur.is_some() {
                        break 'outer; // depth: wait for a completion
                    }
                }
                let conn = c.conn(k).expect("live");
                if conn.cur.is_none() {
                    match c.pool.try_get() {
                        Some(mut p) => {
                            p.set_len(0);
                            c.conn(k).expect("live").cur = Some(p);
                        }
                        None => {
                            if !c.pool_waiters.contains(&k.idx) {
                                c.pool_waiters.push(k.idx);
                            }
                            break 'outer;
                        }
                    }
                }
                let conn = c.conn(k).expect("live");
                let cur = conn.cur.as_mut().expect("a buffer");
                let at = cur.len();
                let take = (cur.capacity() - at).min(b.len());
                cur.set_len(at + take);
                cur[at..].copy_from_slice(&b[..take]);
                b = &b[take..];
                n += take;
            }
        }
        if n == 0 {
            let conn = c.conn(k).expect("live");
            conn.write_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        c.pooled.0 += 1;
        c.pooled.1 += n as u64;
        // The partly filled buffer goes at the driver's next tick (with what other tasks
        // write meanwhile); a full one now.
        let conn = c.conn(k).expect("live");
        if conn.cur.as_ref().is_some_and(|b| b.len() == b.capacity()) {
            c.seal(k);
        } else if !c.dirty.contains(&k.idx) {
            c.dirty.push(k.idx);
            c.kick();
        }
        Poll::Ready(Ok(n))
    })
}

fn poll_flush(io: &LocalIo, k: Key, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    io.with(|c| {
        c.seal(k);
        let Some(conn) = c.conn(k) else {
            return Poll::Ready(Err(closed()));
        };
        if let Some(e) = conn.tx_err.clone() {
            return Poll::Ready(Err(e.into()));
        }
        if conn.cur.is_some() {
            // At depth: the buffer goes after a completion.
            conn.write_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    })
}

fn poll_shutdown(io: &LocalIo, k: Key, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    io.with(|c| {
        c.seal(k);
        let Some(conn) = c.conn(k) else {
            return Poll::Ready(Err(closed()));
        };
        if let Some(e) = conn.tx_err.clone() {
            return Poll::Ready(Err(e.into()));
        }
        if conn.shut_wr {
            return Poll::Ready(Ok(()));
        }
        if conn.cur.is_some() || conn.in_flight > 0 {
            conn.write_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        conn.shut_wr = true;
        let sock = conn.sock.ok_or_else(closed)?;
        Poll::Ready(
            c.tx.shutdown(sock, std::net::Shutdown::Write)
                .map_err(Into::into),
        )
    })
}

/// A handle is gone: the stream closes when its last one is (once its sends are done).
fn release(io: &LocalIo, k: Key, write_half: bool) {
    let Ok(mut c) = io.core.try_borrow_mut() else {
        return;
    };
    c.seal(k);
    let Some(conn) = c.conn(k) else { return };
    conn.handles = conn.handles.saturating_sub(1);
    if write_half {
        conn.shut_when_done = true;
    }
    conn.read_waker = None;
    if conn.handles == 0 {
        // Nobody reads any more: drop what is queued (its buffers go back to the receiver,
        // which re-arms starved receives at its next harvest).
        conn.chunks.clear();
        conn.queued = 0;
        if c.rx.starved() > 0 {
            c.rx_kicked = true;
        }
    }
    c.maybe_finish(k);
    c.kick();
}

impl Drop for TcpStream {
    fn drop(&mut self) {
        release(&self.io, self.key, false);
    }
}

impl Drop for OwnedReadHalf {
    fn drop(&mut self) {
        release(&self.inner.io, self.inner.key, false);
    }
}

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        release(&self.inner.io, self.inner.key, true);
    }
}

impl AsyncRead for TcpStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        poll_read(&self.io, self.key, cx, buf)
    }
}

impl AsyncRead for OwnedReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        poll_read(&self.inner.io, self.inner.key, cx, buf)
    }
}

macro_rules! async_write {
    ($t:ty, $io:ident, $key:ident) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                let me = &*self;
                poll_write(&me.$io, me.$key, cx, &[io::IoSlice::new(buf)])
            }
            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                let me = &*self;
                poll_write(&me.$io, me.$key, cx, bufs)
            }
            fn is_write_vectored(&self) -> bool {
                // One sendmsg of every slice, or every slice copied into the pool buffer.
                true
            }
            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                let me = &*self;
                poll_flush(&me.$io, me.$key, cx)
            }
            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                let me = &*self;
                poll_shutdown(&me.$io, me.$key, cx)
            }
        }
    };
}

async_write!(TcpStream, io, key);

impl AsyncWrite for OwnedWriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        poll_write(&self.inner.io, self.inner.key, cx, &[io::IoSlice::new(buf)])
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        poll_write(&self.inner.io, self.inner.key, cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_flush(&self.inner.io, self.inner.key, cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_shutdown(&self.inner.io, self.inner.key, cx)
    }
}

impl OwnedWriteHalf {
    /// [`TcpStream::send_bytes`] on the write half.
    pub async fn send_bytes(&mut self, bytes: bytes::Bytes) -> io::Result<()> {
        send_bytes(&self.inner.io, self.inner.key, bytes).await
    }
}

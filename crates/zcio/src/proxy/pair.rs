//! One forwarded connection pair: received chunks queued per direction, sent in place on the
//! other socket, and dropped (returned to the receiver) only at their send's completion.

use super::{End, EndKind, Limits, Side, UsLog2};
use crate::rx::{ConnId, Receiver, RxChunk};
use crate::sys::net;
use crate::tx::{Completion, SendRing, SockId, TxBuf};
use std::cell::Cell;
use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::time::Instant;

/// One socket of a pair: its id on the receiver (until its end of stream or error) and on the
/// send ring.
#[derive(Debug, Clone, Copy)]
struct Ends {
    rx: Option<ConnId>,
    tx: SockId,
}

/// One direction: chunks received from the source and not yet completed on the destination.
#[derive(Debug, Default)]
struct Flow {
    /// Received, not yet accepted by the send ring (refused: backpressure).
    queue: VecDeque<TxBuf>,
    queued: usize,
    /// Accepted by the send ring, completion not seen yet (the kernel may read them).
    in_kernel: usize,
    /// Chunks held (queued + in the kernel).
    chunks: usize,
    /// Of those, the ones still in their receive buffer (not copied to the heap): each pins
    /// one buffer (or area range) of the shared receive ring.
    in_ring: usize,
    /// The source's end of stream was received.
    eof: bool,
    /// `shutdown(SHUT_WR)` was done on the destination (after every byte was sent).
    shut: bool,
    /// Receiving from the source is paused (backpressure).
    paused: bool,
    bytes: u64,
    peak: usize,
    pauses: u64,
    /// When each held chunk was received, oldest first (completions come back in send
    /// order per socket).
    received: VecDeque<Instant>,
    /// Chunks completed so far.
    done: u64,
}

impl Flow {
    fn held(&self) -> usize {
        self.queued + self.in_kernel
    }
}

/// What a [`Pair`] has moved so far.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct PairStats {
    /// Bytes forwarded client → upstream (completed sends).
    pub bytes_up: u64,
    /// Bytes forwarded upstream → client (completed sends).
    pub bytes_down: u64,
    /// Most bytes held at once for the client → upstream direction (received, not yet
    /// completed on the upstream socket).
    pub peak_held_up: usize,
    /// The same for upstream → client.
    pub peak_held_down: usize,
    /// Times receiving was paused because the other side could not take more.
    pub pauses: u64,
    /// Whether the upstream connection was seen established.
    pub connected: bool,
}

/// Forwards one client connection and its upstream connection on a caller's [`Receiver`] and
/// [`SendRing`] (one ring per thread: [`SendRing::on_receiver`]).
///
/// The caller routes events to it: received chunks ([`Pair::on_data`]), ends of stream and
/// errors ([`Pair::on_closed`]), send completions with the caller's token
/// ([`Pair::on_completion`]), sockets writable again ([`Pair::on_writable`]), and time
/// ([`Pair::check_timers`]). The pair owns every chunk it was given until its send completes
/// (after the zero-copy notification: the kernel no longer reads it), then drops it, which
/// returns the buffer to the receiver. Per direction at most [`Limits::buffer_bytes`] and
/// [`Limits::buffer_chunks`] are held: beyond that the source is paused
/// ([`Receiver::pause`]) and resumed below half. A half-close is forwarded after every byte
/// before it (`shutdown(SHUT_WR)`), a reset or error as a reset of the other side. Once
/// [`Pair::end`] is set the pair holds nothing and has released its sockets.
#[derive(Debug)]
pub struct Pair {
    token: u64,
    client: Ends,
    upstream: Ends,
    /// 0: client → upstream, 1: upstream → client.
    flows: [Flow; 2],
    connected: bool,
    /// The upstream ended before it was established, and a send to it is still to complete
    /// (with the connect's error).
    connect_lost: bool,
    /// A send to the upstream has completed (the first byte forwarded).
    first_done: bool,
    started: Instant,
    last_active: Instant,
    limits: Limits,
    end: Option<End>,
    timing: Timing,
    /// Receive buffers the pair may hold before it sends heap copies instead
    /// ([`Pair::set_ring_share`]); `None`: no bound.
    ring_share: Option<usize>,
    /// Bytes copied to the heap since the last [`Pair::set_ring_share`].
    copied: usize,
    /// The thread's allowance for this turn's chunks beyond the share (set by
    /// [`super::Proxy`]; `None`: every chunk beyond the share is copied).
    budget: Option<Rc<RingBudget>>,
    /// The turn of [`Pair::turn_in_place`] (the wait's return, [`RingBudget::turn`]).
    turn_mark: Option<Instant>,
    /// Chunks of that turn sent in place beyond the share (not counted as held).
    turn_in_place: usize,
}

/// Receive buffers a thread's pairs may still send in place this turn beyond their ring share
/// (see `docs/design/proxy.md`, "A dry ring and slow peers"): chunks received in this turn
/// (the wait that returned at `turn`) by a direction that holds nothing from an earlier turn.
/// Their sends usually complete at the next enter; the allowance bounds what they can pin if
/// their peer stops reading at just that moment.
#[derive(Debug, Default)]
pub(super) struct RingBudget {
    /// When this turn's wait returned (the `received` time of its chunks).
    pub(super) turn: Cell<Option<Instant>>,
    /// Buffers still allowed this turn.
    pub(super) left: Cell<usize>,
}

/// What a pair measured of its own latency, taken by the [`super::Proxy`] that runs it.
#[derive(Debug, Default, Clone)]
pub(super) struct Timing {
    /// Per chunk: received → its send completed.
    pub(super) forward: UsLog2,
    /// The same for the first [`NEW_CHUNKS`] chunks of each direction.
    pub(super) forward_new: UsLog2,
    /// The pair made → the first send to the upstream completed (once).
    pub(super) first_forward: Option<u64>,
}

/// Chunks per direction counted as a new pair's in [`Timing::forward_new`].
pub(super) const NEW_CHUNKS: u64 = 2;

impl Pair {
    /// A pair for a client and an upstream socket already added to `rx` (receiving) and to the
    /// send ring (sending). `token` is passed to every send ([`SendRing::send_with`]) and comes
    /// back in its completion, so the caller can route completions to the pair. The upstream
    /// socket may still be connecting (a non-blocking `connect` started): sends wait in
    /// the kernel for the handshake, and a failed connect arrives as the upstream's error.
    pub fn new(
        token: u64,
        client: (ConnId, SockId),
        upstream: (ConnId, SockId),
        limits: Limits,
    ) -> Self {
        let now = Instant::now();
        Self {
            token,
            client: Ends {
                rx: Some(client.0),
                tx: client.1,
            },
            upstream: Ends {
                rx: Some(upstream.0),
                tx: upstream.1,
            },
            flows: [Flow::default(), Flow::default()],
            connected: false,
            connect_lost: false,
            first_done: false,
            started: now,
            last_active: now,
            limits,
            end: None,
            timing: Timing::default(),
            ring_share: None,
            copied: 0,
            budget: None,
            turn_mark: None,
            turn_in_place: 0,
        }
    }

    /// Shares the thread's per-turn allowance (see [`RingBudget`]).
    pub(super) fn set_ring_budget(&mut self, budget: Rc<RingBudget>) {
        self.budget = Some(budget);
    }

    /// Bounds the receive buffers the pair holds to `share` (`None`: unbounded): beyond it,
    /// chunks are sent as heap copies and their buffers go back at once, and queued chunks
    /// (refused: the destination is full) are copied now, newest first, until the pair is
    /// within its share. Set by [`super::Proxy`] while most of the shared receive ring is lent
    /// (see `docs/design/proxy.md`, "A dry ring and slow peers"): sends to peers that do not
    /// read could otherwise hold every buffer, and no connection of the thread could receive.
    /// The bytes stay queued in order and still count against the pair's limits. Returns the
    /// bytes copied since the last call.
    pub fn set_ring_share(&mut self, share: Option<usize>) -> usize {
        self.ring_share = share;
        if let Some(share) = share {
            let mut over = self.in_ring().saturating_sub(share);
            for f in &mut self.flows {
                for b in f.queue.iter_mut().rev() {
                    if over == 0 {
                        break;
                    }
                    if let TxBuf::Chunk(c) = b {
                        let v = c.to_vec();
                        self.copied += v.len();
                        *b = TxBuf::Vec(v);
                        f.in_ring -= 1;
                        over -= 1;
                    }
                }
            }
        }
        std::mem::take(&mut self.copied)
    }

    /// Receive buffers the pair holds now (chunks queued or in the kernel, not copied).
    pub fn in_ring(&self) -> usize {
        self.flows[0].in_ring + self.flows[1].in_ring
    }

    /// Takes what the pair measured since the last call.
    pub(super) fn take_timing(&mut self) -> Timing {
        std::mem::take(&mut self.timing)
    }

    /// The token given to [`Pair::new`].
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Which side a receiver connection is, if it is one of this pair's.
    pub fn side_of_conn(&self, conn: ConnId) -> Option<Side> {
        if self.client.rx == Some(conn) {
            Some(Side::Client)
        } else if self.upstream.rx == Some(conn) {
            Some(Side::Upstream)
        } else {
            None
        }
    }

    /// Which side a send-ring socket is, if it is one of this pair's.
    pub fn side_of_sock(&self, sock: SockId) -> Option<Side> {
        if self.client.tx == sock {
            Some(Side::Client)
        } else if self.upstream.tx == sock {
            Some(Side::Upstream)
        } else {
            None
        }
    }

    /// The receiver connection of `side`, until its end of stream or error.
    pub fn side_conn(&self, side: Side) -> Option<ConnId> {
        match side {
            Side::Client => self.client.rx,
            Side::Upstream => self.upstream.rx,
        }
    }

    /// The send-ring socket of `side`.
    pub fn sock(&self, side: Side) -> SockId {
        match side {
            Side::Client => self.client.tx,
            Side::Upstream => self.upstream.tx,
        }
    }

    /// How the pair ended, once it has; it then holds no buffer and no socket.
    pub fn end(&self) -> Option<&End> {
        self.end.as_ref()
    }

    /// Bytes moved, peaks held, pauses.
    pub fn stats(&self) -> PairStats {
        PairStats {
            bytes_up: self.flows[0].bytes,
            bytes_down: self.flows[1].bytes,
            peak_held_up: self.flows[0].peak,
            peak_held_down: self.flows[1].peak,
            pauses: self.flows[0].pauses + self.flows[1].pauses,
            connected: self.connected,
        }
    }

    /// Bytes held now (received, not yet completed on the other side), both directions.
    pub fn held(&self) -> usize {
        self.flows[0].held() + self.flows[1].held()
    }

    /// When the pair was made.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Whether the upstream connection is known to be established.
    pub fn connected(&self) -> bool {
        self.connected
    }

    fn ends(&mut self, side: Side) -> &mut Ends {
        match side {
            Side::Client => &mut self.client,
            Side::Upstream => &mut self.upstream,
        }
    }

    /// Flow index whose source is `side`.
    fn flow_from(side: Side) -> usize {
        match side {
            Side::Client => 0,
            Side::Upstream => 1,
        }
    }

    fn src(dir: usize) -> Side {
        if dir == 0 {
            Side::Client
        } else {
            Side::Upstream
        }
    }

    /// Bytes received from one of the pair's connections: queued for the other side and sent
    /// in order, as far as the send ring takes them.
    pub fn on_data(&mut self, chunk: RxChunk, rx: &mut Receiver, tx: &mut SendRing) {
        self.on_data_at(chunk, Instant::now(), rx, tx)
    }

    /// [`Pair::on_data`] for a chunk received at `received` (the caller's wait returned
    /// then): the pair's latency figures count from there.
    pub fn on_data_at(
        &mut self,
        chunk: RxChunk,
        received: Instant,
        rx: &mut Receiver,
        tx: &mut SendRing,
    ) {
        let Some(side) = self.side_of_conn(chunk.conn()) else {
            return;
        };
        if self.end.is_some() {
            return;
        }
        if side == Side::Upstream {
            self.connected = true;
        }
        self.last_active = received;
        let dir = Self::flow_from(side);
        let f = &mut self.flows[dir];
        f.queued += chunk.len();
        f.chunks += 1;
        f.in_ring += 1;
        f.received.push_back(received);
        f.queue.push_back(TxBuf::Chunk(chunk));
        f.peak = f.peak.max(f.held());
        self.pump(dir, rx, tx);
    }

    /// One of the pair's connections ended on the receiver: `None` is an end of stream (the
    /// other side gets `shutdown(SHUT_WR)` once every byte before it was sent), an error
    /// ends the pair and resets the other side.
    pub fn on_closed(
        &mut self,
        conn: ConnId,
        err: Option<io::Error>,
        rx: &mut Receiver,
        tx: &mut SendRing,
    ) {
        let Some(side) = self.side_of_conn(conn) else {
            return;
        };
        // The receiver has closed its descriptor; the send ring keeps the socket open.
        self.ends(side).rx = None;
        if self.end.is_some() {
            return;
        }
        self.last_active = Instant::now();
        if side == Side::Upstream && !self.connected {
            let unreal = match &err {
                None => true,
                Some(e) => e.raw_os_error() == Some(libc::ENOTCONN),
            };
            if unreal {
                // An end of stream or ENOTCONN before the connection was seen established:
                // a failed connect whose error a send took first (the socket's error is read
                // once), or a target that accepted and closed at once.
                match tx.socket(self.upstream.tx).map(|fd| net::connect_done(&fd)) {
                    Some(Ok(true)) => self.connected = true,
                    Some(Err(e)) => {
                        let detail = format!("upstream: {e}");
                        self.abort(End::new(EndKind::ConnectFailed, Some(side), detail), rx, tx);
                        return;
                    }
                    _ if self.flows[0].in_kernel > 0 => {
                        // The send that took the error completes with it: ended there.
                        self.connect_lost = true;
                        return;
                    }
                    _ => {
                        let detail =
                            "upstream: closed before the connection was established".to_string();
                        self.abort(End::new(EndKind::ConnectFailed, Some(side), detail), rx, tx);
                        return;
                    }
                }
            }
        }
        match err {
            None => {
                let dir = Self::flow_from(side);
                self.flows[dir].eof = true;
                self.flows[dir].paused = false;
                self.pump(dir, rx, tx);
            }
            Some(e) => {
                let kind = if side == Side::Upstream && !self.connected {
                    EndKind::ConnectFailed
                } else if e.raw_os_error() == Some(libc::ECONNRESET) {
                    EndKind::Reset
                } else {
                    EndKind::RecvFailed
                };
                let detail = format!("{side}: {e}");
                self.abort(End::new(kind, Some(side), detail), rx, tx);
            }
        }
    }

    /// A completion of a send this pair made (its token): the chunk goes back to the
    /// receiver now (dropped), and the direction may go on (more sends, a resumed source, or
    /// the forwarded half-close).
    pub fn on_completion(
        &mut self,
        done: &Completion,
        buf: TxBuf,
        rx: &mut Receiver,
        tx: &mut SendRing,
    ) {
        let ring = matches!(buf, TxBuf::Chunk(_));
        drop(buf);
        let Some(dst) = self.side_of_sock(done.sock) else {
            return;
        };
        let dir = 1 - Self::flow_from(dst);
        let f = &mut self.flows[dir];
        f.in_kernel = f.in_kernel.saturating_sub(done.len);
        f.chunks = f.chunks.saturating_sub(1);
        if ring {
            f.in_ring = f.in_ring.saturating_sub(1);
        }
        if self.end.is_some() {
            return;
        }
        let now = Instant::now();
        if let Some(t) = f.received.pop_front() {
            let us = now.saturating_duration_since(t).as_micros() as u64;
            self.timing.forward.record(us, 1);
            if f.done < NEW_CHUNKS {
                self.timing.forward_new.record(us, 1);
            }
            f.done += 1;
        }
        if dst == Side::Upstream && !self.first_done && done.result().is_ok() {
            self.first_done = true;
            let us = now.saturating_duration_since(self.started).as_micros() as u64;
            self.timing.first_forward = Some(us);
        }
        if self.connect_lost && done.result().is_ok() {
            let detail = "upstream: closed before the connection was established".to_string();
            self.abort(
                End::new(EndKind::ConnectFailed, Some(Side::Upstream), detail),
                rx,
                tx,
            );
            return;
        }
        match done.result() {
            Ok(n) => {
                self.flows[dir].bytes += n as u64;
                if dst == Side::Upstream {
                    // The kernel sent on it: the handshake completed.
                    self.connected = true;
                }
                self.last_active = now;
                self.pump(dir, rx, tx);
            }
            Err(e) => {
                let kind = if dst == Side::Upstream && !self.connected {
                    EndKind::ConnectFailed
                } else {
                    EndKind::SendFailed
                };
                let detail = format!("sending to {dst}: {e}");
                self.abort(End::new(kind, Some(dst), detail), rx, tx);
            }
        }
    }

    /// The send ring named one of the pair's sockets writable again
    /// ([`SendRing::next_writable`]): sends what waited for it.
    pub fn on_writable(&mut self, sock: SockId, rx: &mut Receiver, tx: &mut SendRing) {
        if let Some(dst) = self.side_of_sock(sock) {
            self.pump(1 - Self::flow_from(dst), rx, tx);
        }
    }

    /// Connect and idle timeouts at `now`: a pair whose upstream is not established after
    /// [`Limits::connect_timeout`] is reset, and one with no byte moved for
    /// [`Limits::idle_timeout`] is closed. Returns whether the pair ended.
    pub fn check_timers(&mut self, now: Instant, rx: &mut Receiver, tx: &mut SendRing) -> bool {
        if self.end.is_some() {
            return true;
        }
        if !self.connected && now.duration_since(self.started) >= self.limits.connect_timeout {
            let state = tx.socket(self.upstream.tx).map(|fd| net::connect_done(&fd));
            match state {
                Some(Ok(true)) => self.connected = true,
                Some(Err(e)) => {
                    let detail = format!("upstream: {e}");
                    self.abort(
                        End::new(EndKind::ConnectFailed, Some(Side::Upstream), detail),
                        rx,
                        tx,
                    );
                    return true;
                }
                _ => {
                    let detail = format!(
                        "upstream: not established after {:?}",
                        self.limits.connect_timeout
                    );
                    self.abort(
                        End::new(EndKind::ConnectTimeout, Some(Side::Upstream), detail),
                        rx,
                        tx,
                    );
                    return true;
                }
            }
        }
        if let Some(idle) = self.limits.idle_timeout {
            if now.duration_since(self.last_active) >= idle {
                let detail = format!("no byte moved for {idle:?}");
                self.close_idle(End::new(EndKind::IdleTimeout, None, detail), rx, tx);
                return true;
            }
        }
        false
    }

    /// Sends what the direction has queued, forwards its half-close once everything before
    /// it completed, and applies backpressure to its source.
    fn pump(&mut self, dir: usize, rx: &mut Receiver, tx: &mut SendRing) {
        let dst = self.sock(Self::src(1 - dir));
        let token = self.token;
        let other_in_ring = self.flows[1 - dir].in_ring;
        let budget = self.budget.as_deref();
        let turn = budget.and_then(|b| b.turn.get());
        if turn != self.turn_mark {
            self.turn_mark = turn;
            self.turn_in_place = 0;
        }
        let f = &mut self.flows[dir];
        while let Some(mut buf) = f.queue.pop_front() {
            let len = buf.len();
            let mut exempt = false;
            if let (TxBuf::Chunk(c), Some(share)) = (&buf, self.ring_share) {
                let in_ring = f.in_ring + other_in_ring;
                if in_ring > share {
                    // The receive ring is low and the pair holds more than its share. What it
                    // holds is its sends from earlier turns and its chunks queued behind a
                    // refused socket: a chunk of this turn (its receive time is at the queue's
                    // head, just popped) goes in place while that is within the share and the
                    // thread's allowance lasts. Otherwise the kernel gets a heap copy, and the
                    // buffer goes back now instead of at a completion a stuck peer may never
                    // allow.
                    let at = f.received.len().checked_sub(f.queue.len() + 1);
                    let fresh = match (turn, at.and_then(|i| f.received.get(i))) {
                        (Some(t), Some(&r)) => r >= t,
                        _ => false,
                    };
                    let held = (in_ring - 1).saturating_sub(self.turn_in_place);
                    match budget {
                        Some(b) if fresh && held <= share && b.left.get() > 0 => {
                            b.left.set(b.left.get() - 1);
                            self.turn_in_place += 1;
                            exempt = true;
                        }
                        _ => {
                            self.copied += len;
                            buf = TxBuf::Vec(c.to_vec());
                            f.in_ring -= 1;
                        }
                    }
                }
            }
            match tx.send_with(dst, buf, token) {
                Ok(_) => {
                    f.queued -= len;
                    f.in_kernel += len;
                }
                Err(r) if r.reason.is_backpressure() => {
                    // Retried when the send ring names the socket writable. Queued behind a
                    // refused socket, it counts as held again.
                    if let (true, Some(b)) = (exempt, budget) {
                        b.left.set(b.left.get() + 1);
                        self.turn_in_place -= 1;
                    }
                    f.queue.push_front(r.buf);
                    break;
                }
                Err(r) => {
                    let why = format!("{:?}", r.reason);
                    drop(r.buf);
                    let side = Self::src(1 - dir);
                    let detail = format!("sending to {side}: refused ({why})");
                    self.abort(End::new(EndKind::SendFailed, Some(side), detail), rx, tx);
                    return;
                }
            }
        }
        let f = &mut self.flows[dir];
        if f.eof && !f.shut && f.queue.is_empty() && f.in_kernel == 0 {
            // Every byte before the end of stream completed: forward the half-close.
            f.shut = true;
            if dir == 0 && !self.connected {
                // A client that closes before any byte went either way: whether the upstream
                // was reached is known now or never (after the half-close the socket may
                // close before its end is seen), and the pair's end depends on it.
                if let Some(Ok(true)) = tx.socket(dst).map(|fd| net::connect_done(&fd)) {
                    self.connected = true;
                }
            }
            if let Some(fd) = tx.socket(dst) {
                if let Err(e) = net::shutdown_write(&fd) {
                    // The peer is gone (ENOTCONN after its reset): the pair ends there.
                    let side = Self::src(1 - dir);
                    let detail = format!("shutdown of {side}: {e}");
                    self.abort(End::new(EndKind::SendFailed, Some(side), detail), rx, tx);
                    return;
                }
            }
        }
        self.backpressure(dir, rx);
        self.settle(tx);
    }

    /// Pauses the direction's source above the limits, resumes it below half of them.
    fn backpressure(&mut self, dir: usize, rx: &mut Receiver) {
        let src = match Self::src(dir) {
            Side::Client => self.client.rx,
            Side::Upstream => self.upstream.rx,
        };
        let Some(src) = src else { return };
        let (bytes, chunks) = (self.limits.buffer_bytes, self.limits.buffer_chunks);
        let f = &mut self.flows[dir];
        if !f.paused && (f.held() >= bytes || f.chunks >= chunks) {
            f.paused = true;
            f.pauses += 1;
            rx.pause(src);
        } else if f.paused && f.held() <= bytes / 2 && f.chunks <= chunks / 2 {
            f.paused = false;
            if let Err(e) = rx.resume(src) {
                let side = Self::src(dir);
                let detail = format!("resuming {side}: {e}");
                tracing::warn!(%detail, "proxy: resume failed");
                // The ring is broken for this connection; keep it paused (idle timeout ends
                // the pair).
                self.flows[dir].paused = true;
            }
        }
    }

    /// Both directions ended and every byte completed: the pair is done.
    fn settle(&mut self, tx: &mut SendRing) {
        if self.end.is_none() && self.flows.iter().all(|f| f.shut && f.in_kernel == 0) {
            // Open until now (`end` was unset): closing cannot fail.
            let _ = tx.close(self.client.tx);
            let _ = tx.close(self.upstream.tx);
            self.end = Some(End::new(EndKind::Done, None, String::new()));
        }
    }

    /// Ends the pair now: both sockets reset (a reset or error of one is forwarded to the
    /// other as a reset), queued chunks dropped, sends in the kernel cancelled (their buffers
    /// come back after the kernel's last completion, without completions).
    pub fn abort(&mut self, end: End, rx: &mut Receiver, tx: &mut SendRing) {
        if self.end.is_some() {
            return;
        }
        for side in [Side::Client, Side::Upstream] {
            if let Some(fd) = tx.socket(self.sock(side)) {
                let _ = net::set_linger_zero(&fd);
                let _ = net::disconnect(&fd);
            }
        }
        self.release(rx, tx);
        self.end = Some(end);
    }

    /// Ends an idle pair: both sockets closed gracefully (a FIN each way; nothing was in
    /// flight for the idle time).
    fn close_idle(&mut self, end: End, rx: &mut Receiver, tx: &mut SendRing) {
        for side in [Side::Client, Side::Upstream] {
            if let Some(fd) = tx.socket(self.sock(side)) {
                let _ = net::shutdown_write(&fd);
            }
        }
        self.release(rx, tx);
        self.end = Some(end);
    }

    fn release(&mut self, rx: &mut Receiver, tx: &mut SendRing) {
        for side in [Side::Client, Side::Upstream] {
            if let Some(c) = self.ends(side).rx.take() {
                rx.close(c);
            }
            tx.abandon(self.sock(side));
        }
        for f in &mut self.flows {
            f.queue.clear();
            f.received.clear();
            f.queued = 0;
            f.in_kernel = 0;
            f.chunks = 0;
            f.in_ring = 0;
        }
    }
}

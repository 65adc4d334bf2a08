//! [`SendRing`]: the sends of any number of sockets on one io_uring per thread. The public
//! calls, the socket table, completions, backpressure and readiness live here; what is
//! io_uring-specific is in `tx/uring.rs`, the syscall paths in `tx/copy.rs` and
//! `tx/msgzc.rs`, one socket's state in `tx/sock.rs`.
//!
//! Files by role: this one has the type, its set-up, adding and closing sockets; `send.rs`
//! the per-send path and how a finished send becomes a completion; `routes.rs` `auto`'s
//! COPIED verdict per peer; `syscall.rs` the sockets on the syscall paths (`MSG_ZEROCOPY`,
//! copy) and what waits for them; `progress.rs` poll, harvest, the waits and the
//! completion queue; `readiness.rs` the readiness descriptor; `report.rs` what the ring
//! reports.

mod progress;
mod readiness;
mod report;
mod routes;
mod send;
mod syscall;

pub(super) use readiness::Readiness;
pub(super) use report::{add_counters, count_zc};
pub(super) use routes::Routes;

use super::msgzc::MsgZc;
use super::policy::{AutoPolicy, CopiedWatch};
use super::sock::{self, Auto, Purge, Sock};
use super::uring::Uring;
use super::{
    explain_register, Completion, Path, SendError, SenderConfig, SockId, TxBuf, TxError, TxMode,
    TxStats, ZcStatus,
};
use crate::buf::pool::Pool;
use crate::ring::RingConfig;
use crate::stats::{self, Counters, Fallback};
use crate::sys;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

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
    /// Syscall-path sockets waiting for their socket (writable, error queue); each once
    /// (`Sock::stalled`).
    pub(super) stalled: Vec<u32>,
    /// Syscall-path sockets with sends in flight (`MSG_ZEROCOPY` notifications owed, a copy
    /// being continued); each once (`Sock::sys_listed`). Poll, harvest and the waits look at
    /// these and no other socket for the syscall paths: their work per call does not grow
    /// with the number of sockets.
    pub(super) sys_busy: Vec<u32>,
    /// Sends handed over and not yet completed (or dropped by `abandon`), all sockets:
    /// [`SendRing::in_flight`] without a walk over the sockets.
    pub(super) in_flight_n: usize,
    /// Sockets open (closing ones included).
    pub(super) open_n: usize,
    /// `auto`: the pool of the last send was running dry with its buffers in the ring's
    /// sends (zero-copy buffers come back at the peer's ACK): sends go by copy until a
    /// quarter of it is free again.
    pub(super) pool_dry: bool,
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
            sys_busy: Vec::new(),
            in_flight_n: 0,
            open_n: 0,
            pool_dry: false,
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

    /// Send requests in the submission queue now: pushed ([`SendRing::prepare`] and the
    /// calls that stage sends push them) and not yet taken by an enter. On a ring shared with
    /// a receiver ([`SendRing::on_receiver`]) they go to the kernel with its next wait, and a
    /// send to a socket with room completes inside that enter: the receiver can count them in
    /// the wait ([`crate::rx::Receiver::count_in_next_wait`]) so that it does not return on
    /// their completions alone. Sends an enter already took (this ring's own submit, or a
    /// harvest that let a stream's next requests go) are not among them: they completed
    /// before the wait. 0 without a ring.
    pub fn queued_sends(&mut self) -> usize {
        self.uring.as_mut().map_or(0, |u| u.lr.untaken_sends())
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
                pool_noted: false,
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
        self.open_n += 1;
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

    /// After progress on a socket: a refused one that can take sends again is reported
    /// writable; a closing one with nothing left is freed.
    pub(super) fn settle_sock(&mut self, idx: u32) {
        let Some(s) = self.sock_at(idx) else { return };
        if s.closing {
            if s.in_flight() == 0 {
                self.release_purged(idx);
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

    /// A closing TCP socket is reset (`SO_LINGER` 0, then a disconnect: the kernel purges its
    /// send queue now, so zero-copy pages come back while the descriptor is ours). Its send
    /// queue is read just before: bytes the peer has not acknowledged come off the socket's
    /// last sends (see [`crate::tx::sock::Purge`]), so a completion never claims a byte the
    /// peer may not have; those of them already sent (the peer may have them) are counted in
    /// `reset_unacked_bytes`.
    pub(in crate::tx) fn reset_closing(&mut self, idx: u32) {
        let Some(s) = self.sock_at(idx) else { return };
        let _ = sys::net::set_linger_zero(&*s.fd);
        let queue = sys::net::tcp_send_queue(&*s.fd).ok();
        let _ = sys::net::disconnect(&*s.fd);
        let Some((outq, unsent)) = queue else { return };
        s.stats.reset_unacked_bytes += u64::from(outq.saturating_sub(unsent));
        if outq > 0 {
            let p = s.purge.get_or_insert_with(Default::default);
            p.left += u64::from(outq);
        }
    }

    /// The last completion of a socket whose reset purged bytes came: the purged bytes come
    /// off its last sends (and its counters), and the completions go to the ready list.
    fn release_purged(&mut self, idx: u32) {
        let Some(s) = self.sock_at(idx) else { return };
        let Some(p) = s.purge.take() else { return };
        let Purge { mut left, mut held } = *p;
        s.stats.reset_purged_bytes += left;
        for (c, _) in held.iter_mut().rev() {
            let d = left.min(c.bytes as u64);
            if d == 0 {
                continue;
            }
            left -= d;
            c.bytes -= d as usize;
            s.counters.bytes -= d;
            let c0 = &mut s.counters;
            match c.zerocopy {
                ZcStatus::ZeroCopy => c0.zerocopy_bytes = c0.zerocopy_bytes.saturating_sub(d),
                ZcStatus::Copied | ZcStatus::Mixed => {
                    c0.copied_bytes = c0.copied_bytes.saturating_sub(d)
                }
                ZcStatus::NotAttempted | ZcStatus::Unknown => {}
            }
            if c.bytes == 0 {
                // Nothing of it was sent: nothing was zero-copied or copied.
                c.zerocopy = ZcStatus::NotAttempted;
            }
        }
        // Bytes of sends completed before the close (copy sends): already reported.
        s.stats.reset_purged_reported += left;
        for (c, b) in held {
            let mut c = c;
            if c.bytes == c.len && c.error == Some(SendError::Closed) {
                // Every byte of it was sent before the reset: it was not cancelled.
                c.error = None;
            }
            if let Some(b) = b {
                self.ready.push_back((c, b));
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
            if let Some(rd) = self.readiness.as_mut() {
                let _ = rd.set.remove(s.fd.as_raw_fd());
                rd.socks -= 1;
            }
        }
        if let (Some(u), Some(f)) = (self.uring.as_mut(), s.file) {
            u.lr.remove_file(f);
        }
        if s.stalled {
            self.stalled.retain(|&i| i != idx);
        }
        if s.sys_listed {
            self.sys_busy.retain(|&i| i != idx);
        }
        // A `writable` entry of this socket stays: `next_writable` skips it (its generation
        // is gone), so a close costs nothing per queued socket.
        self.open_n -= 1;
        self.free.push(idx);
    }

    /// Closes a socket: new sends are refused ([`Refusal::Closed`](super::Refusal::Closed));
    /// sends not yet handed to the kernel complete with [`SendError::Closed`], those in the
    /// kernel are cancelled (a send the kernel already started may complete partly). Every
    /// buffer still comes back with its completion. The descriptor is closed once no request
    /// names it. For a graceful end, wait until [`SendRing::sock_in_flight`] is 0 first.
    ///
    /// A TCP socket with zero-copy sends in the kernel is reset (its queued pages come back
    /// now instead of when a peer that may have stopped reading acknowledges them): bytes the
    /// kernel had accepted and not sent are purged and counted as not sent (the completions
    /// of its last sends say what reached the peer; [`TxStats::reset_purged_bytes`]). A
    /// socket with only copies in flight is closed gracefully: what the socket took still
    /// goes out.
    ///
    /// Never waits: one `io_uring_enter` submits the cancellation (it runs the ring's
    /// deferred task work, as every enter does), the reset is two socket calls, and the
    /// descriptor is closed later, by the call that reaps the socket's last completion.
    ///
    /// Fails with `ENOENT` for an id that is not open here: unknown, or closed already.
    pub fn close(&mut self, id: SockId) -> Result<(), TxError> {
        let idx = id.idx;
        let Some(s) = self.sock_mut(id).filter(|s| !s.closing) else {
            return Err(super::sock_err(
                format!("close of {id}"),
                io::Error::from_raw_os_error(libc::ENOENT),
            ));
        };
        s.closing = true;
        s.refused = false;
        if s.msg.as_ref().is_some_and(|m| m.in_flight() > 0) && s.stream {
            // The kernel holds our pages in the socket's write queue: reset the connection
            // now so it frees them (and notifies) while the descriptor is ours.
            self.reset_closing(idx);
        }
        let s = self.sock_at(idx).expect("live");
        if let Some(m) = s.msg.as_mut() {
            m.fail(libc::ECANCELED);
        }
        if s.tracker.is_some() {
            self.quiet(false);
            self.ring_close(idx);
            self.unquiet();
        }
        if let Some(p) = self.sock_at(idx).and_then(|s| s.pending.take()) {
            let err = Some(SendError::Closed);
            self.finish(idx, p.seq, p.buf, p.sent, err, ZcStatus::NotAttempted);
        }
        self.collect_msg(idx);
        self.settle_sock(idx);
        Ok(())
    }

    /// Whether `sock` was closed here ([`SendRing::close`] or [`SendRing::abandon`]): its
    /// last sends may still be completing, or it is gone. False for an open socket and for
    /// an id this ring never gave.
    pub fn sock_closed(&self, sock: SockId) -> bool {
        match self.socks.get(sock.idx as usize) {
            Some(Some(s)) if s.gen == sock.gen => s.closing,
            // The slot has had a socket of this generation or a later one: this one is gone.
            Some(_) => sock.gen != 0 && sock.gen <= self.gens[sock.idx as usize],
            None => false,
        }
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
            self.quiet(false);
            self.ring_abandon(idx);
            self.unquiet();
        }
        if let Some(s) = self.sock_mut(id) {
            // Whatever is left (MSG_ZEROCOPY waits for its error queue) is dropped on arrival.
            s.discard = true;
        }
        // Closed already: the completions left are dropped all the same.
        let _ = self.close(id);
        self.ready.retain(|(c, _)| c.sock != id);
    }
}

impl Drop for SendRing {
    fn drop(&mut self) {
        if self.in_flight() > 0 {
            let _ = self.flush(Duration::from_secs(2));
        }
    }
}

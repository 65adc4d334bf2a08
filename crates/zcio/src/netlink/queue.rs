//! [`NfQueue`]: an NFQUEUE consumer on the frame ring, with batch verdicts.
//!
//! Packets are received in batches (one `recvmmsg` fills up to 64 frames), handed to the
//! caller's closure in id order, and decided with as few messages and syscalls as possible:
//! the contiguous prefix of decided ids becomes one `NFQNL_MSG_VERDICT_BATCH` per run of equal
//! verdicts (the kernel decides every pending id ≤ n with it), decided ids behind a held one get
//! individual `NFQNL_MSG_VERDICT`s, and all of these go out in one `sendto`. A held packet is
//! never covered by a batch: batches stop at the first held id.

use super::msg::{messages, ParseError};
use super::nfqmsg::{self, AnyMsg, ConfigMsg, CopyMode, Packet, Verdict, VerdictMsg};
use crate::buf::frames::{FrameError, FrameId, FrameRing, FrameStats};
use crate::stats::Fallback;
use crate::sys::netlink as nl;
use crate::sys::nfqueue::*;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// Errors of an [`NfQueue`].
#[derive(Debug, thiserror::Error)]
pub enum NfqError {
    /// Opening or configuring the netlink socket failed.
    #[error("{what}: {source}")]
    Socket {
        /// What was attempted.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The kernel refused a config command.
    #[error("queue {queue}: kernel refused {what}: {source}{hint}")]
    Config {
        /// The queue.
        queue: u16,
        /// What was asked.
        what: &'static str,
        /// The errno.
        #[source]
        source: io::Error,
        /// What to do about it.
        hint: &'static str,
    },
    /// The frame ring failed (every frame held, or the receive failed).
    #[error(transparent)]
    Frames(#[from] FrameError),
    /// A malformed message from the kernel.
    #[error("malformed message on queue {queue}: {source}")]
    Parse {
        /// The queue.
        queue: u16,
        /// What was wrong.
        #[source]
        source: ParseError,
    },
    /// Sending verdicts failed.
    #[error("sending verdicts on queue {queue}: {source}")]
    Send {
        /// The queue.
        queue: u16,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A verdict for a packet that is not held.
    #[error("packet {id} of queue {queue} is not held")]
    NotHeld {
        /// Queue.
        queue: u16,
        /// Id.
        id: u32,
    },
}

/// Configuration of an [`NfQueue`].
#[derive(Debug, Clone)]
pub struct NfQueueConfig {
    /// First queue number.
    pub first: u16,
    /// Last queue number (inclusive); one socket per queue (fan-out with
    /// `--queue-balance first:last`).
    pub last: u16,
    /// Copy mode.
    pub copy: CopyMode,
    /// `NFQA_CFG_QUEUE_MAXLEN` (kernel default 1024).
    pub max_len: Option<u32>,
    /// `NFQA_CFG_F_FAIL_OPEN`: accept instead of drop when the queue is full.
    pub fail_open: bool,
    /// `NFQA_CFG_F_GSO`: hand over GSO packets unsegmented.
    pub gso: bool,
    /// `NFQA_CFG_F_CONNTRACK`: attach conntrack info.
    pub conntrack: bool,
    /// `NFQA_CFG_F_UID_GID`: attach the socket owner.
    pub uid_gid: bool,
    /// Decided packets after which verdicts are flushed even mid-batch.
    pub batch: usize,
    /// Frame size in bytes (datagrams larger than a frame become COPY frames).
    pub frame_size: usize,
    /// Frames per queue.
    pub frames: u32,
    /// Receive buffer size; with `.1`, `SO_RCVBUFFORCE`.
    pub rcvbuf: Option<(usize, bool)>,
    /// `NETLINK_NO_ENOBUFS`: do not report overruns (the kernel still drops).
    pub no_enobufs: bool,
    /// Fill frames with an io_uring multishot recv (falls back to `recvmmsg`, recorded in
    /// [`NfQueue::fallbacks`], when io_uring is unavailable or a datagram could exceed a
    /// frame: copy range > frame size − 512).
    pub uring: bool,
}

/// Bytes reserved in a frame for the netlink, nfgenmsg and attribute headers around the
/// copied packet (conntrack and security-context attributes included).
pub const FRAME_OVERHEAD: usize = 512;

impl Default for NfQueueConfig {
    fn default() -> Self {
        Self {
            first: 0,
            last: 0,
            copy: CopyMode::Packet(0xffff),
            max_len: None,
            fail_open: false,
            gso: false,
            conntrack: false,
            uid_gid: false,
            batch: 32,
            frame_size: 4096,
            frames: 256,
            rcvbuf: Some((4 << 20, true)),
            no_enobufs: false,
            uring: true,
        }
    }
}

/// What the caller decides for a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A verdict.
    Verdict(Verdict),
    /// A verdict and a new mark.
    Mark(Verdict, u32),
    /// A verdict with a replacement payload (and optional mark).
    Mangle(Verdict, Vec<u8>, Option<u32>),
    /// Hold the packet: its frame stays (SKIP) and a later [`NfQueue::verdict`] decides it.
    Hold,
}

impl From<Verdict> for Decision {
    fn from(v: Verdict) -> Self {
        Decision::Verdict(v)
    }
}

/// A held packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketRef {
    /// Queue number.
    pub queue: u16,
    /// Packet id.
    pub id: u32,
}

/// Counters of an [`NfQueue`].
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct NfqStats {
    /// Packets received.
    pub received: u64,
    /// Verdicts: accept.
    pub accepted: u64,
    /// Verdicts: drop.
    pub dropped: u64,
    /// Verdicts: repeat.
    pub repeated: u64,
    /// Verdicts: queue to another queue.
    pub requeued: u64,
    /// `NFQNL_MSG_VERDICT_BATCH` messages sent.
    pub batches: u64,
    /// Packets decided by batch messages.
    pub batched: u64,
    /// Individual `NFQNL_MSG_VERDICT` messages sent.
    pub singles: u64,
    /// Packets held right now.
    pub held: u64,
    /// Packets ever held.
    pub held_total: u64,
    /// Kernel overruns (ENOBUFS): packets the kernel could not queue to us.
    pub overruns: u64,
    /// `sendto` calls for verdicts.
    pub send_syscalls: u64,
    /// Verdict datagrams sent through io_uring (submitted with the next receive wait).
    pub ring_sends: u64,
    /// Receive syscalls (`recvmmsg`, `poll`).
    pub recv_syscalls: u64,
    /// Error replies from the kernel (e.g. a verdict for an unknown id).
    pub kernel_errors: u64,
    /// Datagrams that did not fit a frame (COPY).
    pub copies: u64,
}

impl NfqStats {
    /// Verdicts of every kind.
    pub fn verdicts(&self) -> u64 {
        self.accepted + self.dropped + self.repeated + self.requeued
    }
}

/// One line of `/proc/net/netfilter/nfnetlink_queue`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct KernelQueueStats {
    /// Queue number.
    pub queue: u16,
    /// Port id of the listener.
    pub portid: u32,
    /// Packets waiting for a verdict.
    pub waiting: u64,
    /// Copy mode.
    pub copy_mode: u8,
    /// Copy range.
    pub copy_range: u32,
    /// Packets dropped because the queue was full.
    pub queue_dropped: u64,
    /// Packets dropped because the netlink socket was full (user-side overrun).
    pub user_dropped: u64,
    /// Last packet id.
    pub id_sequence: u32,
}

/// Reads the kernel's queue table of the calling thread's network namespace
/// (`/proc/thread-self/net/...`, so threads that entered another namespace see theirs).
pub fn kernel_queue_stats() -> io::Result<Vec<KernelQueueStats>> {
    let s = std::fs::read_to_string("/proc/thread-self/net/netfilter/nfnetlink_queue")
        .or_else(|_| std::fs::read_to_string("/proc/net/netfilter/nfnetlink_queue"))?;
    let mut v = Vec::new();
    for line in s.lines() {
        let f: Vec<u64> = line
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if f.len() < 8 {
            continue;
        }
        v.push(KernelQueueStats {
            queue: f[0] as u16,
            portid: f[1] as u32,
            waiting: f[2],
            copy_mode: f[3] as u8,
            copy_range: f[4] as u32,
            queue_dropped: f[5],
            user_dropped: f[6],
            id_sequence: f[7] as u32,
        });
    }
    Ok(v)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Decided(Verdict, Option<u32>, Option<Vec<u8>>),
    Held(FrameId),
}

#[derive(Debug)]
struct Pending {
    id: u32,
    st: State,
}

#[derive(Debug)]
struct QueueSock {
    fd: OwnedFd,
    queue: u16,
    ring: FrameRing,
    pending: VecDeque<Pending>,
    out: Vec<u8>,
    seq: u32,
    hold_refs: Vec<u16>,
    undecided_since_flush: usize,
}

/// An NFQUEUE consumer bound to one queue or a range of queues.
#[derive(Debug)]
pub struct NfQueue {
    socks: Vec<QueueSock>,
    cfg: NfQueueConfig,
    stats: NfqStats,
    fallbacks: Vec<Fallback>,
}

fn sock_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> NfqError {
    let what = what.into();
    move |source| NfqError::Socket { what, source }
}

impl QueueSock {
    fn open(
        cfg: &NfQueueConfig,
        queue: u16,
        fallbacks: &mut Vec<Fallback>,
    ) -> Result<Self, NfqError> {
        let fd = nl::socket(NETLINK_NETFILTER)
            .map_err(sock_err("socket(AF_NETLINK, NETLINK_NETFILTER)"))?;
        nl::bind(&fd, 0, 0).map_err(sock_err("bind netlink socket"))?;
        if let Some((bytes, force)) = cfg.rcvbuf {
            if let Err(e) = nl::set_rcvbuf(&fd, bytes, force) {
                if force {
                    fallbacks.push(Fallback::new(
                        "SO_RCVBUFFORCE",
                        "SO_RCVBUF",
                        format!(
                            "{e} (needs CAP_NET_ADMIN); receive buffer capped by net.core.rmem_max"
                        ),
                    ));
                    nl::set_rcvbuf(&fd, bytes, false).map_err(sock_err("SO_RCVBUF"))?;
                } else {
                    return Err(sock_err("SO_RCVBUF")(e));
                }
            }
        }
        if cfg.no_enobufs {
            nl::set_no_enobufs(&fd, true).map_err(sock_err("NETLINK_NO_ENOBUFS"))?;
        }
        let _ = nl::set_ext_ack(&fd);
        let mut ring = FrameRing::new(cfg.frame_size, cfg.frames, 70 << 10)
            .map_err(sock_err("mapping the frame ring"))?;
        if cfg.uring {
            let need = match cfg.copy {
                CopyMode::Meta => FRAME_OVERHEAD,
                CopyMode::Packet(r) => r as usize + FRAME_OVERHEAD,
            };
            if need > ring.frame_payload() {
                fallbacks.push(Fallback::new(
                    "io_uring multishot recv",
                    "recvmmsg",
                    format!(
                        "copy range needs {need}-byte frames but frames hold {}: a provided \
                         buffer cannot spill, so datagrams could be cut; lower the copy range \
                         or raise frame_size",
                        ring.frame_payload()
                    ),
                ));
            } else if let Err(reason) = ring.enable_uring() {
                fallbacks.push(Fallback::new("io_uring multishot recv", "recvmmsg", reason));
            }
        }
        let mut s = Self {
            fd,
            queue,
            hold_refs: vec![0; cfg.frames as usize],
            ring,
            pending: VecDeque::new(),
            out: Vec::with_capacity(4096),
            seq: 0,
            undecided_since_flush: 0,
        };
        s.config(
            ConfigMsg {
                queue,
                cmd: Some(NFQNL_CFG_CMD_BIND),
                ..Default::default()
            },
            "BIND",
            "; EBUSY: another process is bound to this queue; EPERM: needs CAP_NET_ADMIN",
        )?;
        let (range, mode) = match cfg.copy {
            CopyMode::Meta => (0, NFQNL_COPY_META),
            CopyMode::Packet(r) => (r, NFQNL_COPY_PACKET),
        };
        let mut flags = 0;
        if cfg.fail_open {
            flags |= NFQA_CFG_F_FAIL_OPEN;
        }
        if cfg.gso {
            flags |= NFQA_CFG_F_GSO;
        }
        if cfg.conntrack {
            flags |= NFQA_CFG_F_CONNTRACK;
        }
        if cfg.uid_gid {
            flags |= NFQA_CFG_F_UID_GID;
        }
        let mask =
            NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO | NFQA_CFG_F_CONNTRACK | NFQA_CFG_F_UID_GID;
        s.config(
            ConfigMsg {
                queue,
                cmd: None,
                params: Some((range, mode)),
                maxlen: cfg.max_len,
                flags: Some((mask, flags)),
            },
            "PARAMS/FLAGS",
            "; EOPNOTSUPP: a flag this kernel does not know (CONNTRACK needs nf_conntrack_netlink)",
        )?;
        Ok(s)
    }

    /// Sends one config message and waits for its ACK.
    fn config(
        &mut self,
        c: ConfigMsg,
        what: &'static str,
        hint: &'static str,
    ) -> Result<(), NfqError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut out = Vec::with_capacity(64);
        c.emit(&mut out, seq);
        nl::send_to_kernel(&self.fd, &out).map_err(|e| NfqError::Send {
            queue: self.queue,
            source: e,
        })?;
        let mut buf = vec![0u8; 70 << 10];
        loop {
            let n = crate::sys::net::recv(&self.fd, &mut buf, 0).map_err(|e| NfqError::Send {
                queue: self.queue,
                source: e,
            })?;
            let mut ack = None;
            let mut other = false;
            for m in messages(&buf[..n]) {
                let m = m.map_err(|e| NfqError::Parse {
                    queue: self.queue,
                    source: e,
                })?;
                if m.ty == nl::NLMSG_ERROR && m.seq == seq {
                    ack = Some(m.error_code().map_err(|e| NfqError::Parse {
                        queue: self.queue,
                        source: e,
                    })?);
                } else {
                    other = true;
                }
            }
            if other {
                // A packet queued between BIND and this ACK: keep it for `process`, so it
                // gets a verdict like any other (never dropped on the floor here).
                if !self.ring.inject(&buf[..n]) {
                    return Err(NfqError::Frames(FrameError::AllHeld(self.ring.count())));
                }
            }
            match ack {
                Some(0) => return Ok(()),
                Some(code) => {
                    return Err(NfqError::Config {
                        queue: self.queue,
                        what,
                        source: io::Error::from_raw_os_error(-code),
                        hint,
                    })
                }
                None => {}
            }
        }
    }

    /// Emits verdicts for everything decided; returns whether something was sent.
    fn flush(&mut self, stats: &mut NfqStats) -> Result<(), NfqError> {
        self.out.clear();
        // 1. The contiguous prefix of decided ids (up to the first held one). Its most common
        //    plain verdict V goes out as ONE batch for the prefix's highest id, preceded in the
        //    same datagram by individual verdicts for the prefix's other packets (other
        //    verdicts, marks, payloads): the kernel handles the messages in order, so when the
        //    batch arrives the only ids ≤ n still pending are V's, and held ids (all > n) stay.
        let prefix = self
            .pending
            .iter()
            .position(|p| matches!(p.st, State::Held(_)))
            .unwrap_or(self.pending.len());
        if prefix > 0 {
            let mut counts: [(Option<Verdict>, usize); 4] = [(None, 0); 4];
            for p in self.pending.iter().take(prefix) {
                if let State::Decided(v, None, None) = p.st {
                    if let Some(slot) = counts.iter_mut().find(|c| c.0 == Some(v) || c.0.is_none())
                    {
                        slot.0 = Some(v);
                        slot.1 += 1;
                    }
                }
            }
            let major = counts
                .iter()
                .filter(|c| c.0.is_some())
                .max_by_key(|c| c.1)
                .copied();
            let mut last_major = None;
            let mut n_major = 0u64;
            for p in self.pending.drain(..prefix) {
                match p.st {
                    State::Decided(v, None, None) if Some(v) == major.and_then(|m| m.0) => {
                        last_major = Some(p.id);
                        n_major += 1;
                    }
                    State::Decided(v, mark, payload) => {
                        stats.singles += 1;
                        let msg = VerdictMsg::single(self.queue, v, p.id, mark, payload.as_deref());
                        push_verdict(&mut self.out, &mut self.seq, &msg);
                    }
                    State::Held(_) => unreachable!("the prefix ends before the first held id"),
                }
            }
            if let (Some(id), Some((Some(v), _))) = (last_major, major) {
                if n_major == 1 {
                    stats.singles += 1;
                } else {
                    stats.batches += 1;
                    stats.batched += n_major;
                }
                let mut msg = VerdictMsg::single(self.queue, v, id, None, None);
                msg.batch = n_major > 1;
                push_verdict(&mut self.out, &mut self.seq, &msg);
            }
        }
        // 2. Everything else that is decided: individual verdicts; held ids stay.
        let mut i = 0;
        while i < self.pending.len() {
            if let State::Decided(..) = self.pending[i].st {
                let p = self.pending.remove(i).expect("index in range");
                let State::Decided(v, mark, payload) = p.st else {
                    unreachable!()
                };
                stats.singles += 1;
                let msg = VerdictMsg::single(self.queue, v, p.id, mark, payload.as_deref());
                push_verdict(&mut self.out, &mut self.seq, &msg);
            } else {
                i += 1;
            }
        }
        self.undecided_since_flush = 0;
        if self.out.is_empty() {
            return Ok(());
        }
        if self.ring.is_uring() && self.out.len() <= 200 << 10 {
            // Through the ring: goes out with the next ring entry (the next fill), so a
            // receive-process-verdict cycle costs one syscall.
            let buf = std::mem::replace(&mut self.out, self.ring.spare_send_buf());
            match self.ring.queue_send(&self.fd, buf) {
                Ok(()) => {
                    stats.ring_sends += 1;
                    return Ok(());
                }
                Err(buf) => self.out = buf,
            }
        }
        stats.send_syscalls += 1;
        let mut off = 0;
        // One datagram normally; split only past the socket's send buffer.
        while off < self.out.len() {
            let end = split_point(&self.out, off, 200 << 10);
            nl::send_to_kernel(&self.fd, &self.out[off..end]).map_err(|e| NfqError::Send {
                queue: self.queue,
                source: e,
            })?;
            off = end;
        }
        Ok(())
    }
}

impl QueueSock {
    /// Submits verdicts queued on the ring and reports a failed earlier one.
    fn submit_sends(&mut self) -> Result<(), NfqError> {
        let queue = self.queue;
        self.ring
            .submit_sends()
            .map_err(|e| NfqError::Send { queue, source: e })?;
        if let Some(e) = self.ring.take_send_error() {
            return Err(NfqError::Send { queue, source: e });
        }
        Ok(())
    }
}

/// End of the last whole message starting at `off` within `max` bytes.
fn split_point(buf: &[u8], off: usize, max: usize) -> usize {
    let mut end = off;
    for m in messages(&buf[off..]) {
        let Ok(m) = m else { break };
        let len = super::msg::align(super::msg::NLMSG_HDRLEN + m.payload.len());
        if end + len - off > max && end > off {
            break;
        }
        end += len;
    }
    end.min(buf.len()).max(off + 1)
}

/// Appends `msg` to the outgoing datagram under the next sequence number.
fn push_verdict(out: &mut Vec<u8>, seq: &mut u32, msg: &VerdictMsg<'_>) {
    *seq = seq.wrapping_add(1);
    msg.emit(out, *seq);
}

fn count(stats: &mut NfqStats, v: Verdict) {
    match v {
        Verdict::Accept => stats.accepted += 1,
        Verdict::Drop => stats.dropped += 1,
        Verdict::Repeat => stats.repeated += 1,
        Verdict::Queue(_) => stats.requeued += 1,
    }
}

impl NfQueue {
    /// Binds queues `cfg.first..=cfg.last`, one netlink socket and frame ring each.
    pub fn open(cfg: NfQueueConfig) -> Result<Self, NfqError> {
        let mut fallbacks = Vec::new();
        let mut socks = Vec::new();
        for q in cfg.first..=cfg.last.max(cfg.first) {
            socks.push(QueueSock::open(&cfg, q, &mut fallbacks)?);
        }
        Ok(Self {
            socks,
            cfg,
            stats: NfqStats::default(),
            fallbacks,
        })
    }

    /// The queue numbers bound.
    pub fn queues(&self) -> Vec<u16> {
        self.socks.iter().map(|s| s.queue).collect()
    }

    /// Counters.
    pub fn stats(&self) -> NfqStats {
        let mut s = self.stats.clone();
        for q in &self.socks {
            let f: FrameStats = q.ring.stats();
            s.copies += f.copies;
            s.overruns += f.overruns;
            s.recv_syscalls += f.syscalls;
        }
        s
    }

    /// Fallbacks taken while opening (e.g. `SO_RCVBUFFORCE` refused).
    pub fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }

    /// The receive path in use: `frame-ring+io_uring` (multishot recv into a provided-buffer
    /// ring of frames) or `frame-ring+recvmmsg`.
    pub fn path(&self) -> &'static str {
        if self.socks.iter().all(|s| s.ring.is_uring()) && !self.socks.is_empty() {
            "frame-ring+io_uring"
        } else {
            "frame-ring+recvmmsg"
        }
    }

    /// The kernel's counters for the bound queues (see [`kernel_queue_stats`]).
    pub fn kernel_stats(&self) -> io::Result<Vec<KernelQueueStats>> {
        let mine = self.queues();
        Ok(kernel_queue_stats()?
            .into_iter()
            .filter(|k| mine.contains(&k.queue))
            .collect())
    }

    /// Receives what is ready on every queue (waiting up to `timeout` when nothing is),
    /// calls `f` for each packet in id order, then sends the verdicts. Returns the number of
    /// packets handled.
    pub fn process<F>(&mut self, timeout: Option<Duration>, mut f: F) -> Result<usize, NfqError>
    where
        F: FnMut(&Packet<'_>) -> Decision,
    {
        let wait = timeout.unwrap_or(Duration::MAX);
        if self.socks.len() == 1 {
            // One socket: the frame ring waits itself (one io_uring_enter, or poll + recvmmsg).
            return self.process_ready(&mut f, wait);
        }
        let n = self.process_ready(&mut f, Duration::ZERO)?;
        if n > 0 || wait.is_zero() {
            return Ok(n);
        }
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        self.stats.recv_syscalls += 1;
        if self.poll(ms)? {
            return self.process_ready(&mut f, Duration::ZERO);
        }
        Ok(0)
    }

    fn poll(&self, ms: i32) -> Result<bool, NfqError> {
        if self.socks.len() == 1 {
            let r = crate::sys::net::poll_one(&self.socks[0].fd, libc::POLLIN, ms)
                .map_err(sock_err("poll"))?;
            return Ok(r != 0);
        }
        let fds: Vec<&OwnedFd> = self.socks.iter().map(|s| &s.fd).collect();
        crate::sys::net::poll_many(&fds, libc::POLLIN, ms).map_err(sock_err("poll"))
    }

    fn process_ready<F>(&mut self, f: &mut F, wait: Duration) -> Result<usize, NfqError>
    where
        F: FnMut(&Packet<'_>) -> Decision,
    {
        let mut wait = wait;
        let batch = self.cfg.batch.max(1);
        let mut total = 0;
        for s in &mut self.socks {
            // Drain what the socket holds, flushing verdicts after each receive batch.
            loop {
                let fill = match s.ring.fill(&s.fd, 64, std::mem::take(&mut wait)) {
                    Ok(f) => f,
                    // Report "all held" on the next call, after the caller saw these packets.
                    Err(FrameError::AllHeld(_)) if total > 0 => break,
                    Err(e) => return Err(e.into()),
                };
                if fill.frames == 0 && !fill.full {
                    break;
                }
                while let Some(id) = s.ring.pop_ready() {
                    let mut held = 0u16;
                    let data = s.ring.data(id);
                    for m in messages(data) {
                        let m = m.map_err(|e| NfqError::Parse {
                            queue: s.queue,
                            source: e,
                        })?;
                        match nfqmsg::parse_one(&m) {
                            Ok(AnyMsg::Packet(p)) => {
                                self.stats.received += 1;
                                total += 1;
                                let st = match f(&p) {
                                    Decision::Verdict(v) => State::Decided(v, None, None),
                                    Decision::Mark(v, m) => State::Decided(v, Some(m), None),
                                    Decision::Mangle(v, b, m) => State::Decided(v, m, Some(b)),
                                    Decision::Hold => {
                                        held += 1;
                                        self.stats.held += 1;
                                        self.stats.held_total += 1;
                                        State::Held(id)
                                    }
                                };
                                if let State::Decided(v, ..) = &st {
                                    count(&mut self.stats, *v);
                                }
                                s.pending.push_back(Pending { id: p.id, st });
                                s.undecided_since_flush += 1;
                            }
                            Ok(AnyMsg::Error(code)) if code != 0 => self.stats.kernel_errors += 1,
                            Ok(_) => {}
                            Err(e) => {
                                return Err(NfqError::Parse {
                                    queue: s.queue,
                                    source: e,
                                })
                            }
                        }
                    }
                    if held > 0 {
                        s.hold_refs[id.0 as usize] = held;
                        s.ring.hold(id);
                    } else {
                        s.ring.release(id);
                    }
                    if s.undecided_since_flush >= batch {
                        s.flush(&mut self.stats)?;
                    }
                }
                s.flush(&mut self.stats)?;
                if fill.full {
                    break;
                }
            }
            // Verdicts queued on the ring usually went out with the last fill's enter; make
            // sure none waits for the next call.
            s.submit_sends()?;
        }
        Ok(total)
    }

    /// Packets held right now.
    pub fn held(&self) -> Vec<PacketRef> {
        let mut v = Vec::new();
        for s in &self.socks {
            for p in &s.pending {
                if let State::Held(_) = p.st {
                    v.push(PacketRef {
                        queue: s.queue,
                        id: p.id,
                    });
                }
            }
        }
        v
    }

    /// Calls `f` with a held packet (its bytes are still in its SKIP frame).
    pub fn with_held<T>(&self, r: PacketRef, f: impl FnOnce(&Packet<'_>) -> T) -> Option<T> {
        let s = self.socks.iter().find(|s| s.queue == r.queue)?;
        let p = s.pending.iter().find(|p| p.id == r.id)?;
        let State::Held(fid) = p.st else { return None };
        for m in messages(s.ring.data(fid)).flatten() {
            if let Ok(pkt) = Packet::parse(&m) {
                if pkt.id == r.id {
                    return Some(f(&pkt));
                }
            }
        }
        None
    }

    /// Decides a held packet. The verdict goes out with the next flush ([`NfQueue::flush`]
    /// or the next [`NfQueue::process`]).
    pub fn verdict(&mut self, r: PacketRef, d: Decision) -> Result<(), NfqError> {
        let s = self
            .socks
            .iter_mut()
            .find(|s| s.queue == r.queue)
            .ok_or(NfqError::NotHeld {
                queue: r.queue,
                id: r.id,
            })?;
        let p = s
            .pending
            .iter_mut()
            .find(|p| p.id == r.id && matches!(p.st, State::Held(_)))
            .ok_or(NfqError::NotHeld {
                queue: r.queue,
                id: r.id,
            })?;
        let State::Held(fid) = p.st else {
            unreachable!()
        };
        p.st = match d {
            Decision::Verdict(v) => State::Decided(v, None, None),
            Decision::Mark(v, m) => State::Decided(v, Some(m), None),
            Decision::Mangle(v, b, m) => State::Decided(v, m, Some(b)),
            Decision::Hold => return Ok(()),
        };
        if let State::Decided(v, ..) = &p.st {
            count(&mut self.stats, *v);
        }
        self.stats.held -= 1;
        let refs = &mut s.hold_refs[fid.0 as usize];
        *refs = refs.saturating_sub(1);
        if *refs == 0 {
            s.ring.release(fid);
        }
        Ok(())
    }

    /// Sends every decided verdict now.
    pub fn flush(&mut self) -> Result<(), NfqError> {
        for s in &mut self.socks {
            s.flush(&mut self.stats)?;
            s.submit_sends()?;
        }
        Ok(())
    }

    /// Clean shutdown: decides every held packet with `verdict`, drains and decides what the
    /// kernel still has queued for us (until its queue is empty or `drain` passes), then
    /// unbinds. Returns the counters and the packets the kernel still held at unbind (it
    /// drops those).
    pub fn close(mut self, verdict: Verdict, drain: Duration) -> Result<(NfqStats, u64), NfqError> {
        for r in self.held() {
            self.verdict(r, Decision::Verdict(verdict))?;
        }
        self.flush()?;
        let deadline = Instant::now() + drain;
        loop {
            let n = self.process(Some(Duration::from_millis(2)), |_| {
                Decision::Verdict(verdict)
            })?;
            let waiting: u64 = self
                .kernel_stats()
                .map(|v| v.iter().map(|k| k.waiting).sum())
                .unwrap_or(0);
            if (n == 0 && waiting == 0) || Instant::now() >= deadline {
                break;
            }
        }
        let left: u64 = self
            .kernel_stats()
            .map(|v| v.iter().map(|k| k.waiting).sum())
            .unwrap_or(0);
        let stats = self.stats();
        self.unbind_all();
        Ok((stats, left))
    }

    fn unbind_all(&mut self) {
        for s in &mut self.socks {
            let q = s.queue;
            let _ = s.config(
                ConfigMsg {
                    queue: q,
                    cmd: Some(NFQNL_CFG_CMD_UNBIND),
                    ..Default::default()
                },
                "UNBIND",
                "",
            );
        }
        self.socks.clear();
    }

    /// Raw descriptors (for an external poller).
    pub fn fds(&self) -> Vec<i32> {
        self.socks.iter().map(|s| s.fd.as_raw_fd()).collect()
    }
}

impl Drop for NfQueue {
    /// Held packets and those already delivered to the socket are accepted, then the queues
    /// are unbound (the kernel drops what it still holds at that point).
    fn drop(&mut self) {
        for r in self.held() {
            let _ = self.verdict(r, Decision::Verdict(Verdict::Accept));
        }
        let _ = self.flush();
        let mut accept = |_: &Packet<'_>| Decision::Verdict(Verdict::Accept);
        while let Ok(n) = self.process_ready(&mut accept, Duration::ZERO) {
            if n == 0 {
                break;
            }
        }
        self.unbind_all();
    }
}

//! [`NfQueue`]: an NFQUEUE consumer on the frame ring, with batch verdicts.
//!
//! Packets are received in batches (one `recvmmsg` fills up to 64 frames), handed to the
//! caller's closure in id order, and decided with as few messages and syscalls as possible:
//! the contiguous prefix of decided ids becomes one `NFQNL_MSG_VERDICT_BATCH` per run of equal
//! verdicts (the kernel decides every pending id ≤ n with it), decided ids behind a held one get
//! individual `NFQNL_MSG_VERDICT`s, and all of these go out in one datagram. Which packets
//! still need their verdict to reach the kernel is the [`super::tracker`]'s business: a
//! packet leaves it only when the datagram carrying its verdict was sent whole, a failed send
//! is retried, and a batch never covers a held packet or one whose verdict is still in flight.
//!
//! Work per call is bounded ([`NfQueueConfig::budget`]) and shared round-robin across the
//! queues of a range, so one busy queue cannot starve the others and shutdown is prompt.

use super::core::{Fate, NlSocket, RequestError, SockSpec, UringNeed};
use super::msg::{messages, EmitError, ParseError};
use super::nfqmsg::{self, AnyMsg, ConfigMsg, CopyMode, Packet, Verdict};
use super::refusal::{BindRefusal, Table};
use super::source::{FrameError, FrameStats, MAX_BATCH};
use super::tracker::{Built, Decided, SendId, State, Tracker, NO_FRAME};
use crate::buf::frames::{FrameId, FramePin, FrameRing};
use crate::netlink::NetlinkPath;
use crate::stats::{Counters, Fallback, Report};
use crate::sys::netlink as nl;
use crate::sys::nfqueue::*;
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
        hint: String,
        /// For a refused bind: the cause, found by checking (the kernel's `EPERM` means
        /// either another socket holds the queue, or a missing capability).
        refusal: Option<BindRefusal>,
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
    /// A message could not be emitted (a replacement payload over 65 531 bytes). For a
    /// packet decided in `process`, the packet got [`NfQueueConfig::on_error`] instead and
    /// every other verdict went out before this was returned.
    #[error("queue {queue}{}: {source}", id.map(|i| format!(", packet {i}")).unwrap_or_default())]
    Emit {
        /// The queue.
        queue: u16,
        /// The packet, for a verdict.
        id: Option<u32>,
        /// What did not fit.
        #[source]
        source: EmitError,
    },
    /// Sending verdicts failed `attempts` times in a row: the queue was unbound, so the
    /// kernel's own policy decides the packets it still holds (it drops them; a rule with
    /// `--queue-bypass` accepts new ones while nobody listens). No verdict was widened.
    #[error(
        "queue {queue}: sending verdicts failed {attempts} times in a row ({source}); unbound the queue so the kernel decides what it still holds"
    )]
    SendFailing {
        /// The queue.
        queue: u16,
        /// Consecutive failed sends.
        attempts: u32,
        /// The last error.
        #[source]
        source: io::Error,
    },
    /// A replacement payload for a GSO packet other than TCP (queued whole with
    /// `NFQA_CFG_F_GSO`): the kernel drops such a packet after the mangle, whatever its
    /// checksums (UDP segmentation needs the `CHECKSUM_PARTIAL` state that `nfqnl_mangle`
    /// resets), so zcio refuses it and the packet got [`NfQueueConfig::on_error`] (or, for
    /// [`NfQueue::verdict`], stays held). TCP GSO packets can be mangled (TCP segmentation
    /// rebuilds the checksum state); see [`packet::fix_checksums`](super::packet::fix_checksums).
    #[error(
        "queue {queue}, packet {id}: cannot replace the payload of a non-TCP GSO packet (the \
         kernel drops it after the mangle); bind without gso to rewrite such packets"
    )]
    MangleGso {
        /// The queue.
        queue: u16,
        /// The packet.
        id: u32,
    },
    /// Every queue was given up (see [`NfqError::SendFailing`]) or closed.
    #[error("no queue is bound any more")]
    Unbound,
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
    /// Most packets one [`NfQueue::process`] call handles (across all queues of the range,
    /// shared round-robin), so a queue kept full cannot hold the caller past its deadlines.
    pub budget: usize,
    /// Consecutive failed verdict sends after which the queue is given up
    /// ([`NfqError::SendFailing`]).
    pub send_retries: u32,
    /// Verdict for a packet whose message cannot be parsed (its id can still be read) or
    /// whose decision cannot be sent (an oversize replacement payload). Drop by default:
    /// what the caller could not judge is not let through.
    pub on_error: Verdict,
}

/// Bytes reserved in a frame for the netlink, nfgenmsg and attribute headers around the
/// copied packet (conntrack and security-context attributes included).
pub const FRAME_OVERHEAD: usize = super::core::MSG_OVERHEAD;

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
            budget: 256,
            send_retries: 8,
            on_error: Verdict::Drop,
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

/// A packet handed over by [`NfQueue::receive`]: held until the caller's
/// [`NfQueue::verdict`], with its payload pinned in its frame.
#[derive(Debug)]
pub struct Received {
    /// The packet, for [`NfQueue::verdict`].
    pub packet: PacketRef,
    /// Its metadata.
    pub info: PacketInfo,
    /// Its payload (`NFQA_PAYLOAD`, from the network header on, up to the copy range), in
    /// the frame it arrived in; `None` in `CopyMode::Meta` or for a packet without one.
    pub payload: Option<FramePin>,
}

/// A queued packet's metadata, owned (the fields of [`Packet`] but the payload).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PacketInfo {
    /// Address family of the hook (`AF_INET` = 2, `AF_INET6` = 10).
    pub family: u8,
    /// Ethertype (host order).
    pub hw_protocol: u16,
    /// Netfilter hook number.
    pub hook: u8,
    /// `NFQA_MARK`.
    pub mark: Option<u32>,
    /// `NFQA_IFINDEX_INDEV`.
    pub indev: Option<u32>,
    /// `NFQA_IFINDEX_OUTDEV`.
    pub outdev: Option<u32>,
    /// `NFQA_IFINDEX_PHYSINDEV`.
    pub physindev: Option<u32>,
    /// `NFQA_IFINDEX_PHYSOUTDEV`.
    pub physoutdev: Option<u32>,
    /// `NFQA_HWADDR`: the address (up to 8 bytes, zero-padded) and its length.
    pub hwaddr: Option<([u8; 8], u8)>,
    /// `NFQA_TIMESTAMP` (sec, usec).
    pub timestamp: Option<(u64, u64)>,
    /// `NFQA_CAP_LEN`: the full length when the payload was cut to the copy range.
    pub cap_len: Option<u32>,
    /// `NFQA_SKB_INFO` flags.
    pub skb_info: Option<u32>,
    /// `NFQA_UID`.
    pub uid: Option<u32>,
    /// `NFQA_GID`.
    pub gid: Option<u32>,
    /// `NFQA_CT_INFO`.
    pub ct_info: Option<u32>,
}

impl From<&Packet<'_>> for PacketInfo {
    fn from(p: &Packet<'_>) -> Self {
        Self {
            family: p.family,
            hw_protocol: p.hw_protocol,
            hook: p.hook,
            mark: p.mark,
            indev: p.indev,
            outdev: p.outdev,
            physindev: p.physindev,
            physoutdev: p.physoutdev,
            hwaddr: p.hwaddr.map(|h| {
                let mut a = [0u8; 8];
                let n = h.len().min(8);
                a[..n].copy_from_slice(&h[..n]);
                (a, n as u8)
            }),
            timestamp: p.timestamp,
            cap_len: p.cap_len,
            skb_info: p.skb_info,
            uid: p.uid,
            gid: p.gid,
            ct_info: p.ct_info,
        }
    }
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
    /// `NFQNL_MSG_VERDICT_BATCH` messages sent (a datagram sent again after a failed send
    /// counts again).
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
    /// Verdict sends that failed (their packets were sent again).
    pub send_failures: u64,
    /// Malformed messages from the kernel (counted, never fatal; see
    /// [`NfQueueConfig::on_error`]).
    pub parse_errors: u64,
    /// Decisions refused because they could not be sent (oversize payload).
    pub refused: u64,
    /// Packets left to the kernel when a queue was given up after failed sends.
    pub abandoned: u64,
}

impl NfqStats {
    /// Adds another consumer's counters (e.g. one per thread).
    pub fn add(&mut self, o: &NfqStats) {
        let NfqStats {
            received,
            accepted,
            dropped,
            repeated,
            requeued,
            batches,
            batched,
            singles,
            held,
            held_total,
            overruns,
            send_syscalls,
            ring_sends,
            recv_syscalls,
            kernel_errors,
            copies,
            send_failures,
            parse_errors,
            refused,
            abandoned,
        } = o;
        self.received += received;
        self.accepted += accepted;
        self.dropped += dropped;
        self.repeated += repeated;
        self.requeued += requeued;
        self.batches += batches;
        self.batched += batched;
        self.singles += singles;
        self.held += held;
        self.held_total += held_total;
        self.overruns += overruns;
        self.send_syscalls += send_syscalls;
        self.ring_sends += ring_sends;
        self.recv_syscalls += recv_syscalls;
        self.kernel_errors += kernel_errors;
        self.copies += copies;
        self.send_failures += send_failures;
        self.parse_errors += parse_errors;
        self.refused += refused;
        self.abandoned += abandoned;
    }

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

/// The bytes the kernel copies for a copy range of `r`: 0 and anything past
/// [`NFQNL_MAX_COPY_RANGE`] mean the whole packet up to that (`nfqnl_set_mode`).
fn effective_copy_range(r: u32) -> u32 {
    if r == 0 || r > NFQNL_MAX_COPY_RANGE {
        NFQNL_MAX_COPY_RANGE
    } else {
        r
    }
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

#[derive(Debug)]
struct QueueSock {
    sock: NlSocket,
    queue: u16,
    track: Tracker,
    out: Vec<u8>,
    /// Per frame: packets held in it (the frame is released when the last one is decided).
    hold_refs: Vec<u16>,
    undecided_since_flush: usize,
    /// Largest verdict datagram (below the socket's send buffer).
    max_send: usize,
    results: Vec<(u64, io::Result<()>)>,
}

/// An NFQUEUE consumer bound to one queue or a range of queues.
#[derive(Debug)]
pub struct NfQueue {
    /// The readiness set, once asked for: every socket (level) and every io_uring frame
    /// ring's eventfd (level). Declared before the sockets, so it is closed first.
    readiness: Option<crate::sys::ready::ReadySet>,
    socks: Vec<QueueSock>,
    cfg: NfQueueConfig,
    stats: NfqStats,
    fallbacks: Vec<Fallback>,
    /// The socket the next round starts with (round-robin across the range).
    next: usize,
    /// An error to report at the end of the current call, after every verdict went out.
    deferred: Option<NfqError>,
}

fn sock_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> NfqError {
    let what = what.into();
    move |source| NfqError::Socket { what, source }
}

impl QueueSock {
    fn open(
        cfg: &NfQueueConfig,
        queue: u16,
        given: Option<OwnedFd>,
        fallbacks: &mut Vec<Fallback>,
    ) -> Result<Self, NfqError> {
        let datagram = match cfg.copy {
            CopyMode::Meta => FRAME_OVERHEAD,
            // The kernel copies the whole packet for a range of 0 and caps larger ones
            // (`nfqnl_set_mode`): frames are sized for what it will send.
            CopyMode::Packet(r) => effective_copy_range(r) as usize + FRAME_OVERHEAD,
        };
        let spec = SockSpec {
            protocol: NETLINK_NETFILTER,
            groups: &[],
            rcvbuf: cfg.rcvbuf,
            no_enobufs: cfg.no_enobufs,
            ext_ack: true,
            frame_size: cfg.frame_size,
            frames: cfg.frames,
            spill: 70 << 10,
            uring: cfg.uring.then_some(UringNeed {
                datagram,
                what: "the copy range",
            }),
            // A verdict is owed per packet: no wait may hold one back.
            batch_wait: None,
        };
        let sock = NlSocket::open_on(&spec, given, fallbacks).map_err(|e| NfqError::Socket {
            what: e.what.to_string(),
            source: e.source,
        })?;
        let mut s = Self {
            sock,
            queue,
            hold_refs: vec![0; cfg.frames as usize],
            track: Tracker::new(queue),
            out: Vec::with_capacity(4096),
            undecided_since_flush: 0,
            max_send: 0,
            results: Vec::new(),
        };
        // Datagrams stay below the send buffer (the kernel refuses larger ones, EMSGSIZE).
        let sndbuf = crate::sys::getsockopt_int(&s.sock.fd, libc::SOL_SOCKET, libc::SO_SNDBUF)
            .map_or(64 << 10, |b| b.max(0) as usize);
        s.max_send = (sndbuf.saturating_sub(64)).clamp(1024, MAX_SEND);
        s.config(
            ConfigMsg {
                queue,
                cmd: Some(NFQNL_CFG_CMD_BIND),
                ..Default::default()
            },
            "BIND",
            "",
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

    /// Sends one config message and waits for its ACK (packets queued meanwhile go into the
    /// frame ring and get a verdict from the next `process`, like any other).
    fn config(
        &mut self,
        c: ConfigMsg,
        what: &'static str,
        hint: &'static str,
    ) -> Result<(), NfqError> {
        let queue = self.queue;
        let seq = self.sock.next_seq();
        let mut out = Vec::with_capacity(64);
        c.emit(&mut out, seq).map_err(|e| NfqError::Emit {
            queue,
            id: None,
            source: e,
        })?;
        let bind = c.cmd == Some(NFQNL_CFG_CMD_BIND);
        match self.sock.request(&out, seq) {
            Ok(0) => Ok(()),
            Ok(code) => {
                // EPERM is both "another socket holds the queue" and "no CAP_NET_ADMIN":
                // told apart by checking (`refusal`).
                let refusal = bind
                    .then(|| {
                        let ours = nl::port_id(&self.sock.fd).ok();
                        BindRefusal::check(Table::Queue, queue, -code, ours)
                    })
                    .flatten();
                Err(NfqError::Config {
                    queue,
                    what,
                    source: io::Error::from_raw_os_error(-code),
                    hint: refusal
                        .as_ref()
                        .map_or_else(|| hint.to_string(), |r| r.hint(Table::Queue, queue)),
                    refusal,
                })
            }
            Err(RequestError::Send(e) | RequestError::Recv(e)) => {
                Err(NfqError::Send { queue, source: e })
            }
            Err(RequestError::Parse(e)) => Err(NfqError::Parse { queue, source: e }),
            Err(RequestError::Full(n)) => Err(NfqError::Frames(FrameError::AllHeld(n))),
        }
    }

    /// Moves completed ring sends into the tracker: confirmed packets leave it, failed ones
    /// are decided again. Returns the first failure.
    fn reap_sends(&mut self, stats: &mut NfqStats) -> Option<io::Error> {
        self.sock.ring.take_send_results(&mut self.results);
        let mut first = None;
        for (token, r) in self.results.drain(..) {
            let send = SendId(token);
            match r {
                Ok(()) => {
                    self.track.confirmed(send);
                }
                Err(e) => {
                    self.track.failed(send);
                    stats.send_failures += 1;
                    first.get_or_insert(e);
                }
            }
        }
        first
    }

    /// Sends verdicts for everything decided (held and in-flight packets stay tracked).
    /// Fails with [`NfqError::SendFailing`] once `retries` sends in a row failed.
    fn flush(&mut self, stats: &mut NfqStats, retries: u32) -> Result<(), NfqError> {
        let mut failure = self.reap_sends(stats);
        self.undecided_since_flush = 0;
        while failure.is_none() {
            self.out.clear();
            let Some((send, built)) =
                self.track
                    .build(&mut self.out, self.sock.seq_mut(), self.max_send)
            else {
                break;
            };
            add_built(stats, &built);
            if self.sock.ring.is_uring() {
                // Through the ring: goes out with the next ring entry (the next fill), so a
                // receive-process-verdict cycle costs one syscall. The tracker keeps the
                // packets in flight until the completion says the datagram went whole.
                let buf = std::mem::replace(&mut self.out, self.sock.ring.spare_send_buf());
                match self.sock.ring.queue_send(&self.sock.fd, buf, send.0) {
                    Ok(()) => {
                        stats.ring_sends += 1;
                        continue;
                    }
                    Err(buf) => self.out = buf,
                }
            }
            stats.send_syscalls += 1;
            match nl::send_to_kernel(&self.sock.fd, &self.out) {
                Ok(_) => {
                    self.track.confirmed(send);
                }
                Err(e) => {
                    self.track.failed(send);
                    stats.send_failures += 1;
                    failure = Some(e);
                }
            }
        }
        match failure {
            Some(e) if self.track.failures() >= retries.max(1) => Err(NfqError::SendFailing {
                queue: self.queue,
                attempts: self.track.failures(),
                source: e,
            }),
            // Retried by the next flush: the packets are decided again, nothing was lost.
            _ => Ok(()),
        }
    }

    /// Submits verdicts queued on the ring.
    fn submit_sends(&mut self) -> Result<(), NfqError> {
        let queue = self.queue;
        self.sock
            .ring
            .submit_sends()
            .map_err(|e| NfqError::Send { queue, source: e })
    }

    /// One held packet of frame `fid` was decided or let go of its frame: the frame goes
    /// back when none is left (and its pins, if any, are gone).
    fn unref_frame(&mut self, fid: u32) {
        if fid == NO_FRAME {
            return;
        }
        let refs = &mut self.hold_refs[fid as usize];
        *refs = refs.saturating_sub(1);
        if *refs == 0 {
            self.sock.finish(FrameId(fid), Fate::Release);
        }
    }

    /// Decodes the next ready frame (see [`decode_frame`]) and releases or holds it; `false`
    /// when no frame is ready.
    fn decode_next<F>(&mut self, ctx: &mut Ctx<'_, F>) -> bool
    where
        F: FnMut(&Packet<'_>, &PinSite<'_>) -> Decision,
    {
        let Some(id) = self.sock.pop_ready() else {
            return false;
        };
        let (fate, n) = decode_frame(
            self.sock.ring.frames(),
            &mut self.track,
            &mut self.hold_refs,
            self.queue,
            id,
            ctx,
        );
        self.sock.finish(id, fate);
        self.undecided_since_flush += n;
        true
    }
}

/// Decodes one received frame (`data`, frame `id`): every packet in it is handed to `ctx.f`
/// (or decided with `on_error` when it cannot be parsed but its id can be read). Says whether
/// the frame is then released or, when a packet in it is held, held (`hold_refs` counts the
/// packets held in it). Never fails: a malformed message is counted and the rest of the
/// datagram still gets its verdicts. Returns the fate and the packets tracked.
fn decode_frame<F>(
    ring: &FrameRing,
    track: &mut Tracker,
    hold_refs: &mut [u16],
    queue: u16,
    id: FrameId,
    ctx: &mut Ctx<'_, F>,
) -> (Fate, usize)
where
    F: FnMut(&Packet<'_>, &PinSite<'_>) -> Decision,
{
    let mut held = 0u16;
    let mut tracked = 0;
    let site = PinSite { ring, frame: id };
    let data = ring.data(id);
    for m in messages(data) {
        let m = match m {
            Ok(m) => m,
            Err(e) => {
                // The framing is broken: nothing after this point can be found. Ids the
                // kernel sent in the lost part stay pending, so no batch may cover them.
                ctx.parse_error(queue, e);
                track.forbid_batches();
                break;
            }
        };
        match nfqmsg::parse_one(&m) {
            Ok(AnyMsg::Packet(p)) => {
                ctx.stats.received += 1;
                *ctx.total += 1;
                let d = match (ctx.f)(&p, &site) {
                    Decision::Hold => None,
                    Decision::Mangle(..) if mangle_dropped_by_kernel(&p) => {
                        ctx.stats.refused += 1;
                        ctx.deferred
                            .get_or_insert(NfqError::MangleGso { queue, id: p.id });
                        Some(Decided::new(ctx.on_error, None, None).expect("a plain verdict fits"))
                    }
                    d => Some(ctx.decided(queue, p.id, d)),
                };
                match &d {
                    Some(d) => count(ctx.stats, d.verdict),
                    None => {
                        held += 1;
                        ctx.stats.held += 1;
                        ctx.stats.held_total += 1;
                    }
                }
                track.receive(p.id, d, id.0);
                tracked += 1;
            }
            Ok(AnyMsg::Error(code)) if code != 0 => ctx.stats.kernel_errors += 1,
            Ok(_) => {}
            Err(e) => {
                ctx.parse_error(queue, e);
                if m.ty == nfqmsg::nfq_type(NFQNL_MSG_PACKET) {
                    match nfqmsg::packet_id(&m) {
                        Some(pid) => {
                            ctx.stats.received += 1;
                            *ctx.total += 1;
                            let d = Decided::new(ctx.on_error, None, None)
                                .expect("a plain verdict fits");
                            count(ctx.stats, d.verdict);
                            track.receive(pid, Some(d), id.0);
                            tracked += 1;
                        }
                        None => track.forbid_batches(),
                    }
                }
            }
        }
    }
    if held > 0 {
        hold_refs[id.0 as usize] = held;
        (Fate::Hold, tracked)
    } else {
        (Fate::Release, tracked)
    }
}

/// Where a packet handed to the decoding closure lives: its frame, whose bytes a
/// [`FramePin`] can keep past the packet's verdict.
pub(crate) struct PinSite<'a> {
    ring: &'a FrameRing,
    frame: FrameId,
}

impl PinSite<'_> {
    /// Pins `bytes` (part of the packet being decided, e.g. its payload).
    pub(crate) fn pin(&self, bytes: &[u8]) -> Option<FramePin> {
        self.ring.pin(self.frame, bytes)
    }
}

/// What decoding needs besides the socket: the caller's closure and the counters.
struct Ctx<'a, F> {
    f: &'a mut F,
    stats: &'a mut NfqStats,
    total: &'a mut usize,
    on_error: Verdict,
    deferred: &'a mut Option<NfqError>,
}

impl<F> Ctx<'_, F> {
    fn parse_error(&mut self, queue: u16, e: ParseError) {
        self.stats.parse_errors += 1;
        tracing::warn!(queue, error = %e, "malformed nfqueue message");
    }

    /// Checks a caller's decision; one that cannot be sent (an oversize payload) becomes
    /// `on_error` and the error is reported at the end of the call.
    fn decided(&mut self, queue: u16, id: u32, d: Decision) -> Decided {
        match to_decided(d) {
            Ok(d) => d,
            Err(e) => {
                self.stats.refused += 1;
                self.deferred.get_or_insert(NfqError::Emit {
                    queue,
                    id: Some(id),
                    source: e,
                });
                Decided::new(self.on_error, None, None).expect("a plain verdict fits")
            }
        }
    }
}

/// Whether the kernel queued `p` as a GSO super-packet.
/// Whether the kernel would drop this packet after a mangle: a GSO packet (queued whole with
/// `NFQA_CFG_F_GSO`) that is not TCP. Measured on 6.18: `nfqnl_mangle` marks the packet
/// `CHECKSUM_NONE`; TCP segmentation rebuilds `CHECKSUM_PARTIAL` from the pseudo-header, and
/// local delivery of a whole TCP burst checks the sum over all of it, so a TCP burst with
/// recomputed checksums arrives intact. UDP segmentation on local delivery finds the checksum
/// state gone (the receive path reuses its fields) and drops the burst, checksums fixed or not.
fn mangle_dropped_by_kernel(p: &Packet<'_>) -> bool {
    p.skb_info.is_some_and(|i| i & NFQA_SKB_GSO != 0)
        && p.payload
            .and_then(super::packet::locate)
            .map_or(true, |l| l.proto != 6)
}

fn to_decided(d: Decision) -> Result<Decided, EmitError> {
    match d {
        Decision::Verdict(v) => Decided::new(v, None, None),
        Decision::Mark(v, m) => Decided::new(v, Some(m), None),
        Decision::Mangle(v, b, m) => Decided::new(v, m, Some(b)),
        Decision::Hold => unreachable!("a hold is not a verdict"),
    }
}

/// Largest verdict datagram (the socket's send buffer bounds it further).
const MAX_SEND: usize = 200 << 10;

fn add_built(stats: &mut NfqStats, b: &Built) {
    stats.singles += b.singles;
    stats.batches += b.batches;
    stats.batched += b.batched;
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
            socks.push(QueueSock::open(&cfg, q, None, &mut fallbacks)?);
        }
        Ok(Self::with(cfg, socks, fallbacks))
    }

    /// Binds queue `cfg.first` on `sock`, a `NETLINK_NETFILTER` socket opened elsewhere —
    /// by a privileged parent that hands it to a child, or in another network namespace:
    /// the queue is the one of the namespace the socket was made in, whichever namespace
    /// this process is in (libnetfilter_queue's `nfq_open_nfnl`, netfilterqueue's
    /// `sockfd=`). The frame ring and both producers work on it as on a socket of our own;
    /// an unbound socket is bound to a port id here.
    ///
    /// The kernel checks CAP_NET_ADMIN (in the user namespace owning the socket's network
    /// namespace) of the process that *sends* each configuration and verdict message, not
    /// of the one that opened the socket: a child that drops every capability gets EPERM
    /// for its bind and its verdicts, one that keeps only CAP_NET_ADMIN (as another user,
    /// in a namespace of its own) works. One queue per socket: `cfg.last` must equal
    /// `cfg.first`.
    pub fn from_socket(cfg: NfQueueConfig, sock: OwnedFd) -> Result<Self, NfqError> {
        if cfg.last != cfg.first {
            return Err(NfqError::Socket {
                what: format!(
                    "binding queues {}..={} on one given socket (a socket serves one queue)",
                    cfg.first, cfg.last
                ),
                source: io::Error::from(io::ErrorKind::InvalidInput),
            });
        }
        let mut fallbacks = Vec::new();
        let s = QueueSock::open(&cfg, cfg.first, Some(sock), &mut fallbacks)?;
        Ok(Self::with(cfg, vec![s], fallbacks))
    }

    fn with(cfg: NfQueueConfig, socks: Vec<QueueSock>, fallbacks: Vec<Fallback>) -> Self {
        Self {
            readiness: None,
            socks,
            cfg,
            stats: NfqStats::default(),
            fallbacks,
            next: 0,
            deferred: None,
        }
    }

    /// The queue numbers bound.
    pub fn queues(&self) -> Vec<u16> {
        self.socks.iter().map(|s| s.queue).collect()
    }

    /// Counters.
    pub fn stats(&self) -> NfqStats {
        let mut s = self.stats.clone();
        for q in &self.socks {
            let f: FrameStats = q.sock.frame_stats();
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
    /// ring of frames, on every bound queue) or `frame-ring+recvmmsg`.
    pub fn path(&self) -> NetlinkPath {
        if self.socks.iter().all(|s| s.sock.ring.is_uring()) && !self.socks.is_empty() {
            NetlinkPath::FrameRingUring
        } else {
            NetlinkPath::FrameRingRecvmmsg
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
        let budget = self.cfg.budget;
        self.process_with(timeout, budget, &mut |p: &Packet<'_>, _: &PinSite<'_>| f(p))
    }

    /// Receives up to about `max` packets (waiting up to `timeout` when none is ready) and
    /// appends them to `out`, each **held**: its verdict is the caller's, given later with
    /// [`NfQueue::verdict`] (and sent by [`NfQueue::flush`] or the next receive, in batches as
    /// ever), and its payload is pinned in its frame ([`FramePin`]) — no copy. A pin outlives
    /// the verdict if the caller keeps it: the frame returns to the ring only when the packet
    /// is decided *and* its pin dropped, so pinned bytes never change. Returns the number of
    /// packets appended. Packets whose message cannot be parsed get
    /// [`NfQueueConfig::on_error`] and are not appended. Held packets count against the frame
    /// ring: with every frame held the receive fails ([`FrameError::AllHeld`]).
    ///
    /// `max` bounds the work as [`NfQueueConfig::budget`] does for `process` (an io_uring
    /// fill may pass it by up to one receive window).
    pub fn receive(
        &mut self,
        timeout: Option<Duration>,
        max: usize,
        out: &mut Vec<Received>,
    ) -> Result<usize, NfqError> {
        let before = out.len();
        self.process_with(timeout, max, &mut |p: &Packet<'_>, site: &PinSite<'_>| {
            out.push(Received {
                packet: PacketRef {
                    queue: p.queue,
                    id: p.id,
                },
                info: PacketInfo::from(p),
                payload: p.payload.and_then(|b| site.pin(b)),
            });
            Decision::Hold
        })?;
        Ok(out.len() - before)
    }

    fn process_with<F>(
        &mut self,
        timeout: Option<Duration>,
        budget: usize,
        f: &mut F,
    ) -> Result<usize, NfqError>
    where
        F: FnMut(&Packet<'_>, &PinSite<'_>) -> Decision,
    {
        let wait = timeout.unwrap_or(Duration::MAX);
        if self.socks.len() == 1 {
            // One socket: the frame ring waits itself (one io_uring_enter, or poll + recvmmsg).
            return self.process_ready(f, wait, budget);
        }
        let n = self.process_ready(f, Duration::ZERO, budget)?;
        if n > 0 || wait.is_zero() {
            return Ok(n);
        }
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        self.stats.recv_syscalls += 1;
        if self.poll(ms)? {
            return self.process_ready(f, Duration::ZERO, budget);
        }
        Ok(0)
    }

    fn poll(&self, ms: i32) -> Result<bool, NfqError> {
        if self.socks.len() == 1 {
            let r = crate::sys::net::poll_one(&self.socks[0].sock.fd, libc::POLLIN, ms)
                .map_err(sock_err("poll"))?;
            return Ok(r != 0);
        }
        let fds: Vec<&OwnedFd> = self.socks.iter().map(|s| &s.sock.fd).collect();
        crate::sys::net::poll_many(&fds, libc::POLLIN, ms).map_err(sock_err("poll"))
    }

    fn process_ready<F>(
        &mut self,
        f: &mut F,
        wait: Duration,
        budget: usize,
    ) -> Result<usize, NfqError>
    where
        F: FnMut(&Packet<'_>, &PinSite<'_>) -> Decision,
    {
        if self.socks.is_empty() {
            return Err(NfqError::Unbound);
        }
        let r = self.rounds(f, wait, budget);
        // Verdicts queued on the ring usually went out with the last fill's enter; make sure
        // none waits for the next call.
        let mut submit = Ok(());
        for s in &mut self.socks {
            if let Err(e) = s.submit_sends() {
                submit = submit.and(Err(e));
            }
        }
        let total = match r {
            Ok(n) => n,
            Err((i, e)) => {
                if matches!(e, NfqError::SendFailing { .. }) {
                    self.give_up(i);
                }
                return Err(e);
            }
        };
        submit?;
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        Ok(total)
    }

    /// Round-robin over the bound queues, one receive batch per queue per round, until no
    /// queue has data or `cfg.budget` packets were handled; the next call starts one queue
    /// further. Errors name the queue's index.
    fn rounds<F>(
        &mut self,
        f: &mut F,
        wait: Duration,
        budget: usize,
    ) -> Result<usize, (usize, NfqError)>
    where
        F: FnMut(&Packet<'_>, &PinSite<'_>) -> Decision,
    {
        let mut wait = wait;
        let budget = budget.max(1);
        let batch = self.cfg.batch.max(1);
        let retries = self.cfg.send_retries;
        let n = self.socks.len();
        let start = self.next % n;
        self.next = (start + 1) % n;
        let mut total = 0usize;
        loop {
            let mut progress = false;
            for k in 0..n {
                let i = (start + k) % n;
                // An io_uring fill hands over what completed (up to its 64-frame window), so
                // `total` may pass the budget by less than one receive batch.
                let left = budget.saturating_sub(total);
                if left == 0 {
                    return Ok(total);
                }
                let s = &mut self.socks[i];
                // Verdicts given since the last call (`verdict` on held packets) go out now:
                // on the ring they ride this fill's enter.
                s.flush(&mut self.stats, retries).map_err(|e| (i, e))?;
                let fill = match s.sock.fill(left.min(MAX_BATCH), std::mem::take(&mut wait)) {
                    Ok(f) => f,
                    // Report "all held" on the next call, after the caller saw these packets.
                    Err(FrameError::AllHeld(_)) if total > 0 => continue,
                    Err(e) => return Err((i, e.into())),
                };
                let mut ctx = Ctx {
                    f: &mut *f,
                    stats: &mut self.stats,
                    total: &mut total,
                    on_error: self.cfg.on_error,
                    deferred: &mut self.deferred,
                };
                let uring = s.sock.ring.is_uring();
                while s.decode_next(&mut ctx) {
                    // With sendto, flush every `batch` decided packets; on the ring the
                    // verdicts go out with the next enter anyway, so one datagram per receive
                    // batch costs nothing in latency and keeps the batch whole.
                    if !uring && s.undecided_since_flush >= batch {
                        s.flush(ctx.stats, retries).map_err(|e| (i, e))?;
                    }
                }
                s.flush(&mut self.stats, retries).map_err(|e| (i, e))?;
                if fill.frames > 0 && !fill.full {
                    progress = true;
                }
            }
            if !progress {
                return Ok(total);
            }
        }
    }

    /// Sending verdicts on queue `i` keeps failing: stop using it. The UNBIND (and closing
    /// the socket, which the kernel treats the same) leaves every packet still queued to the
    /// kernel's own policy: dropped (or, with `--queue-bypass` on the rule, accepted by the
    /// rule's owner) — never covered by a verdict zcio did not mean.
    fn give_up(&mut self, i: usize) {
        let mut s = self.socks.remove(i);
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
        self.stats.abandoned += s.track.len() as u64;
        self.next = 0;
    }

    /// Packets held right now.
    pub fn held(&self) -> Vec<PacketRef> {
        let mut v = Vec::new();
        for s in &self.socks {
            for (id, _) in s.track.held() {
                v.push(PacketRef { queue: s.queue, id });
            }
        }
        v
    }

    /// Calls `f` with a held packet (its bytes are still in its SKIP frame).
    pub fn with_held<T>(&self, r: PacketRef, f: impl FnOnce(&Packet<'_>) -> T) -> Option<T> {
        let s = self.socks.iter().find(|s| s.queue == r.queue)?;
        let Some(State::Held(fid)) = s.track.state(r.id) else {
            return None;
        };
        if *fid == NO_FRAME {
            return None;
        }
        for m in messages(s.sock.ring.frames().data(FrameId(*fid))).flatten() {
            if let Ok(pkt) = Packet::parse(&m) {
                if pkt.id == r.id {
                    return Some(f(&pkt));
                }
            }
        }
        None
    }

    /// Decides a held packet. The verdict goes out with the next flush ([`NfQueue::flush`]
    /// or the next [`NfQueue::process`]). A verdict that cannot be sent (a replacement
    /// payload over 65 531 bytes) is refused and the packet stays held.
    pub fn verdict(&mut self, r: PacketRef, d: Decision) -> Result<(), NfqError> {
        let not_held = NfqError::NotHeld {
            queue: r.queue,
            id: r.id,
        };
        let Some(s) = self.socks.iter_mut().find(|s| s.queue == r.queue) else {
            return Err(not_held);
        };
        if !matches!(s.track.state(r.id), Some(State::Held(_))) {
            return Err(not_held);
        }
        if d == Decision::Hold {
            return Ok(());
        }
        if matches!(d, Decision::Mangle(..))
            && self.with_held(r, mangle_dropped_by_kernel) == Some(true)
        {
            return Err(NfqError::MangleGso {
                queue: r.queue,
                id: r.id,
            });
        }
        let Some(s) = self.socks.iter_mut().find(|s| s.queue == r.queue) else {
            return Err(not_held);
        };
        let d = to_decided(d).map_err(|e| NfqError::Emit {
            queue: r.queue,
            id: Some(r.id),
            source: e,
        })?;
        let v = d.verdict;
        let fid = s.track.decide(r.id, d).map_err(|_| NfqError::NotHeld {
            queue: r.queue,
            id: r.id,
        })?;
        count(&mut self.stats, v);
        self.stats.held -= 1;
        s.unref_frame(fid);
        Ok(())
    }

    /// Whether `r` is held (received, not decided).
    pub fn is_held(&self, r: PacketRef) -> bool {
        self.socks
            .iter()
            .find(|s| s.queue == r.queue)
            .is_some_and(|s| matches!(s.track.state(r.id), Some(State::Held(_))))
    }

    /// Keeps a held packet undecided but gives its frame back to the ring: its bytes are no
    /// longer readable here ([`NfQueue::with_held`] returns `None`; a [`FramePin`] keeps its
    /// own). For a caller that copied what it needs and may keep many packets undecided for
    /// a long time: held frames would otherwise run out, while the kernel queue
    /// ([`NfQueueConfig::max_len`]) is the only limit on undecided packets.
    pub fn release_frame(&mut self, r: PacketRef) -> Result<(), NfqError> {
        let not_held = NfqError::NotHeld {
            queue: r.queue,
            id: r.id,
        };
        let Some(s) = self.socks.iter_mut().find(|s| s.queue == r.queue) else {
            return Err(not_held);
        };
        let fid = s.track.detach(r.id).map_err(|_| not_held)?;
        s.unref_frame(fid);
        Ok(())
    }

    /// Sends every decided verdict now (in io_uring mode: submits them; their completions
    /// are harvested by the next receive).
    pub fn flush(&mut self) -> Result<(), NfqError> {
        let retries = self.cfg.send_retries;
        let mut i = 0;
        while i < self.socks.len() {
            let s = &mut self.socks[i];
            let r = s
                .flush(&mut self.stats, retries)
                .and_then(|()| s.submit_sends());
            if let Err(e) = r {
                if matches!(e, NfqError::SendFailing { .. }) {
                    self.give_up(i);
                }
                return Err(e);
            }
            i += 1;
        }
        Ok(())
    }

    /// Packets whose verdict has not reached the kernel yet (held, decided, in flight).
    pub fn unconfirmed(&self) -> usize {
        self.socks.iter().map(|s| s.track.len()).sum()
    }

    /// Decides every held packet with `verdict`, then receives and decides (with `verdict`)
    /// until every verdict is confirmed and the kernel queue is empty, or `deadline` passes.
    fn drain(&mut self, verdict: Verdict, deadline: Instant) -> Result<(), NfqError> {
        for r in self.held() {
            self.verdict(r, Decision::Verdict(verdict))?;
        }
        self.flush()?;
        loop {
            let now = Instant::now();
            let wait = deadline
                .saturating_duration_since(now)
                .min(Duration::from_millis(2));
            let n = self.process(Some(wait), |_| Decision::Verdict(verdict))?;
            if n == 0 && self.unconfirmed() == 0 {
                let waiting: u64 = self
                    .kernel_stats()
                    .map(|v| v.iter().map(|k| k.waiting).sum())
                    .unwrap_or(0);
                if waiting == 0 {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Ok(());
            }
        }
    }

    /// Clean shutdown within `drain`: decides every held packet with `verdict`, receives and
    /// decides what the kernel still has queued for us until its queue is empty or `drain`
    /// passes (each call handles at most `cfg.budget` packets, so a queue kept full by a
    /// sender cannot hold shutdown past the deadline), then unbinds. Returns the counters and
    /// the packets the kernel still held at unbind (it drops those).
    pub fn close(mut self, verdict: Verdict, drain: Duration) -> Result<(NfqStats, u64), NfqError> {
        self.drain(verdict, Instant::now() + drain)?;
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

    /// The readiness descriptor, created on first call: it polls readable when
    /// [`NfQueue::on_ready`] would find packets — a queue socket with datagrams waiting
    /// (level), or an io_uring frame ring's registered eventfd (under `DEFER_TASKRUN`
    /// signalled when the multishot receive's task work is queued; the frames are filled by
    /// the harvest's own enter). While every frame is held, packets wait in the socket and
    /// the descriptor stays readable until a verdict frees frames. Rules:
    /// `docs/design/async.md`.
    pub fn readiness_fd(&mut self) -> Result<std::os::fd::BorrowedFd<'_>, NfqError> {
        use std::os::fd::AsFd;
        if self.readiness.is_none() {
            let set = crate::sys::ready::ReadySet::new().map_err(sock_err("readiness set"))?;
            for s in &mut self.socks {
                s.sock
                    .add_to_readiness(&set)
                    .map_err(|e| NfqError::Socket {
                        what: e.what.to_string(),
                        source: e.source,
                    })?;
            }
            self.readiness = Some(set);
        }
        Ok(self.readiness.as_ref().expect("readiness").as_fd())
    }

    /// Handles what is ready without waiting (after the readiness descriptor fired, or at any
    /// time), as [`NfQueue::process`] with a zero timeout; then clears the frame rings'
    /// eventfds and looks again if work came in meanwhile. Returns the packets handled.
    pub fn on_ready<F>(&mut self, f: &mut F) -> Result<usize, NfqError>
    where
        F: FnMut(&Packet<'_>) -> Decision,
    {
        self.readiness_fd()?;
        let mut n = 0;
        for _ in 0..4 {
            n += self.process(Some(Duration::ZERO), &mut *f)?;
            if !self.clear_notify() {
                return Ok(n);
            }
        }
        // Work is still coming in after four rounds: the descriptor stays readable for it
        // (cleared, it would not fire again for work already flagged).
        self.keep_notify();
        Ok(n)
    }

    /// [`NfQueue::receive`] without waiting, for a caller woken by the readiness descriptor
    /// (as [`NfQueue::on_ready`] is for `process`): receives up to about `max` packets, then
    /// clears the frame rings' eventfds and looks again if work came in meanwhile.
    pub fn receive_ready(
        &mut self,
        max: usize,
        out: &mut Vec<Received>,
    ) -> Result<usize, NfqError> {
        self.readiness_fd()?;
        let mut n = 0;
        for _ in 0..4 {
            n += self.receive(Some(Duration::ZERO), max.saturating_sub(n).max(1), out)?;
            if !self.clear_notify() {
                return Ok(n);
            }
            if n >= max {
                break;
            }
        }
        // Stopped at `max` or after four rounds with work left: the descriptor stays readable
        // for it.
        self.keep_notify();
        Ok(n)
    }

    /// The readiness descriptor is watched edge-triggered (tokio's `AsyncFd`): `on_ready`
    /// does not read the frame ring's eventfd back to zero (see `NlSocket::set_edge_readiness`).
    #[cfg(feature = "tokio")]
    pub(crate) fn set_edge_readiness(&mut self, edge: bool) {
        for s in &mut self.socks {
            s.sock.set_edge_readiness(edge);
        }
    }

    /// Clears every frame ring's eventfd; true when work came in meanwhile on any.
    fn clear_notify(&mut self) -> bool {
        let mut more = false;
        for s in &mut self.socks {
            more |= s.sock.clear_notify();
        }
        more
    }

    /// Leaves every frame ring's eventfd readable (work is left).
    fn keep_notify(&mut self) {
        for s in &mut self.socks {
            s.sock.keep_notify();
        }
    }

    /// Puts a datagram that the caller read from queue `queue`'s socket itself (e.g. through
    /// a cooperative-scheduling library's socket object, on a descriptor from
    /// [`NfQueue::fds`]) into that queue's frame ring: the next `process`/`receive` decodes it
    /// like any other.
    pub fn feed(&mut self, queue: u16, datagram: &[u8]) -> Result<(), NfqError> {
        let Some(s) = self.socks.iter_mut().find(|s| s.queue == queue) else {
            return Err(NfqError::Unbound);
        };
        if s.sock.ring.inject(datagram) {
            Ok(())
        } else {
            Err(NfqError::Frames(FrameError::AllHeld(
                s.sock.ring.frames().count(),
            )))
        }
    }

    /// Raw descriptors (for an external poller).
    pub fn fds(&self) -> Vec<i32> {
        self.socks.iter().map(|s| s.sock.fd.as_raw_fd()).collect()
    }
}

impl Drop for NfQueue {
    /// Sends the verdicts the caller already gave (held packets and packets the caller never
    /// saw are *not* decided here), then unbinds: the kernel drops what it still holds. A
    /// `Drop` may run while a thread unwinds from a panic, so it never lets through a packet
    /// nobody judged; [`NfQueue::close`] decides the rest with a verdict of the caller's
    /// choosing, within a deadline.
    fn drop(&mut self) {
        if !self.socks.is_empty() {
            let _ = self.flush();
        }
        self.unbind_all();
    }
}

impl Report for NfQueue {
    type Path = NetlinkPath;
    fn path(&self) -> NetlinkPath {
        NfQueue::path(self)
    }
    /// `ops` = packets received, `syscalls` = receive and verdict syscalls (a verdict sent
    /// through io_uring rides on the next receive wait), `notifications` = verdict messages.
    fn counters(&self) -> Counters {
        let s = self.stats();
        Counters {
            ops: s.received,
            syscalls: s.recv_syscalls + s.send_syscalls,
            notifications: s.batches + s.singles,
            ..Counters::default()
        }
    }
    fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::netlink::msg::messages;
    use crate::netlink::nfqmsg::VerdictMsg;
    use crate::netlink::source::FrameSource;

    #[test]
    fn unbinding_error_reads_as_one_sentence() {
        let e = NfqError::SendFailing {
            queue: 3,
            attempts: 5,
            source: io::Error::from_raw_os_error(libc::ENOBUFS),
        };
        let msg = e.to_string();
        assert!(
            msg.starts_with("queue 3: sending verdicts failed 5 times in a row ("),
            "{msg}"
        );
        assert!(!msg.contains("  "), "runs of spaces in {msg:?}");
    }

    fn packet(id: u32, out: &mut Vec<u8>) {
        let p = Packet {
            queue: 0,
            family: 2,
            id,
            hw_protocol: 0x0800,
            hook: 1,
            payload: Some(&[0x45; 28]),
            ..Packet::default()
        };
        p.emit(out, id, 0).unwrap();
    }

    /// Round `r`'s three datagrams (ids 8r+1..=8r+8):
    /// - whole: packets 1, 2, 3;
    /// - corrupted: 4, then 5 whose NFQA_MARK is 3 bytes (its id is readable), then 6;
    /// - truncated: 7, then the first half of 8 (the framing breaks; 8's id is lost).
    fn datagrams(r: u32) -> [Vec<u8>; 3] {
        let b = 8 * r;
        let mut whole = Vec::new();
        for id in 1..=3 {
            packet(b + id, &mut whole);
        }
        let mut bad = Vec::new();
        packet(b + 4, &mut bad);
        let start = bad.len();
        packet(b + 5, &mut bad);
        // Append a 3-byte NFQA_MARK (must be 4) and fix the message length.
        bad.extend_from_slice(&7u16.to_ne_bytes());
        bad.extend_from_slice(&NFQA_MARK.to_ne_bytes());
        bad.extend_from_slice(&[1, 2, 3, 0]);
        let len = (bad.len() - start) as u32;
        bad[start..start + 4].copy_from_slice(&len.to_ne_bytes());
        packet(b + 6, &mut bad);
        let mut cut = Vec::new();
        packet(b + 7, &mut cut);
        let mut eight = Vec::new();
        packet(b + 8, &mut eight);
        cut.extend_from_slice(&eight[..eight.len() / 2]);
        [whole, bad, cut]
    }

    fn parse_errors_release_frames_and_decide_the_rest(uring: bool) {
        let (a, b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let mut ring = FrameSource::new(4096, 4, 4096).unwrap();
        if uring {
            ring.enable_uring()
                .expect("io_uring multishot recv on a unix socket");
        }
        let mut track = Tracker::new(0);
        let mut hold_refs = vec![0u16; 4];
        let mut stats = NfqStats::default();
        let mut seen = Vec::new();
        // 10 rounds of 3 datagrams through 4 frames: a frame lost on an error path would
        // leave the ring without frames long before the end.
        for r in 0..10 {
            for d in datagrams(r) {
                b.send(&d).unwrap();
            }
            let mut got = 0;
            let end = Instant::now() + Duration::from_secs(2);
            while got < 3 && Instant::now() < end {
                let fill = ring.fill(&a, 64, Duration::from_millis(20)).unwrap();
                assert!(!fill.full, "round {r}: no free frame: the ring shrank");
                while let Some(id) = ring.frames_mut().pop_ready() {
                    got += 1;
                    let mut total = 0;
                    let mut deferred = None;
                    let mut f = |p: &Packet<'_>, _: &PinSite<'_>| {
                        seen.push(p.id);
                        Decision::Verdict(Verdict::Accept)
                    };
                    let mut ctx = Ctx {
                        f: &mut f,
                        stats: &mut stats,
                        total: &mut total,
                        on_error: Verdict::Drop,
                        deferred: &mut deferred,
                    };
                    let (fate, _) =
                        decode_frame(ring.frames(), &mut track, &mut hold_refs, 0, id, &mut ctx);
                    assert_eq!(fate, Fate::Release, "nothing is held here");
                    ring.frames_mut().release(id);
                    assert!(deferred.is_none());
                }
            }
            assert_eq!(got, 3, "round {r}");
            assert_eq!(ring.frames().held(), 0);
            assert_eq!(ring.frames().ready(), 0);
        }
        let want: Vec<u32> = (0..10)
            .flat_map(|r| [1, 2, 3, 4, 6, 7].map(|i| 8 * r + i))
            .collect();
        assert_eq!(
            seen, want,
            "every parseable packet reached the caller, in order"
        );
        assert_eq!(stats.parse_errors, 20);
        assert_eq!(stats.received, 70);
        assert_eq!(
            stats.dropped, 10,
            "the unparseable packet 5 of each round: on_error"
        );
        // Packet 8's id was lost with the framing: no batch may be sent (it could cover 8).
        let mut out = Vec::new();
        let (_, built) = track.build(&mut out, &mut 0, 1 << 20).unwrap();
        assert_eq!(built.batches, 0);
        assert_eq!(built.packets, 70);
        let mut verdicts = Vec::new();
        for m in messages(&out) {
            let v = VerdictMsg::parse(&m.unwrap()).unwrap();
            assert!(!v.batch);
            verdicts.push((v.id, v.verdict));
        }
        for r in 0..10 {
            assert!(verdicts.contains(&(8 * r + 5, Verdict::Drop)));
            assert!(!verdicts.iter().any(|v| v.0 == 8 * r + 8));
        }
    }

    #[test]
    fn parse_errors_release_frames_and_decide_the_rest_on_recvmmsg() {
        parse_errors_release_frames_and_decide_the_rest(false);
    }

    #[test]
    fn parse_errors_release_frames_and_decide_the_rest_on_io_uring() {
        parse_errors_release_frames_and_decide_the_rest(true);
    }
}

//! [`Audit`]: the kernel's audit records on the frame ring, grouped into events.
//!
//! # Modes
//!
//! - **Primary** ([`AuditMode::Primary`]): registers as the audit daemon (`AUDIT_SET` with the
//!   process's pid; `CAP_AUDIT_CONTROL`, the initial pid namespace). The kernel then sends it
//!   every record, one datagram each: records wait in the kernel's backlog (`backlog_limit`),
//!   and beyond that the kernel drops them — or, with `backlog_wait_time` > 0, the task that
//!   makes the record waits up to that long first — and counts them in `lost`. A send to a
//!   full socket waits at most 1/10 s (the kernel socket's send timeout), then fails: the
//!   socket counts a drop and the record goes to the kernel's retry queue (see "Losses").
//!   `backlog_limit`, `backlog_wait_time` and `rate_limit` can be
//!   set at open ([`AuditConfig`]); like the enabled flag, they are set back at close
//!   (with [`AuditConfig::restore`]). When another daemon is registered the kernel refuses
//!   (`EEXIST`): with [`AuditConfig::fallback`] the consumer becomes an observer, recorded.
//! - **Observer** ([`AuditMode::Observer`]): joins the read-only multicast group
//!   (`AUDIT_NLGRP_READLOG`, Linux 3.16, `CAP_AUDIT_READ`) beside whatever daemon runs. The
//!   kernel multicasts each record before it hands it to the daemon; a record that does not
//!   fit the socket is dropped for this socket alone and counted in its `sk_drops`.
//!
//! Audit exists only in the initial network namespace.
//!
//! # Events
//!
//! Records are parsed in place in their frames ([`AuditRecord`]: type, the
//! `audit(sec.msec:serial)` header, fields; untrusted strings the kernel wrote as hex are
//! decoded by [`Field::value`](super::Field::value)) and grouped by serial: an event closes at
//! the kernel's end-of-event record (`AUDIT_EOE`, sent after every syscall event), at once for
//! a type the kernel sends none after (user-space and daemon messages), and otherwise when no
//! record of it came for [`AuditConfig::event_wait`]. Records of different events interleave
//! (one task's records are queued together, other CPUs' between them), so a later serial
//! closes nothing.
//!
//! # Losses
//!
//! - **the kernel's `lost` counter** (`AUDIT_GET`): records the kernel refused to start or
//!   dropped before the daemon got them (backlog full, rate limit, no memory, retry or hold
//!   queue full). It is host-wide and counts records, not events, and not all of them: when
//!   the first (`SYSCALL`) record of an audited syscall is refused, the kernel counts that one
//!   and never makes the event's other records (`PATH`, `PROCTITLE`, `EOE`, …), which no
//!   counter holds. On the host (Linux 6.18, 2026-11-28) a storm of 3,000 `openat` calls with
//!   the consumer stopped grew it by 2,968 while at least 11,687 of the storm's records never
//!   came. [`Audit::stats`] reads it (one request on a second socket) and reports the growth
//!   since open, unless someone reset it meanwhile (a smaller value) or the process may not
//!   read it (observer without `CAP_AUDIT_CONTROL`: unknown, recorded as a fallback).
//! - **the socket's drops** (`SO_MEMINFO` `sk_drops`) mean one thing per mode:
//!   - observer: records the multicast could not put into this socket. Exact, each one lost.
//!   - primary: sends that failed after the kernel's 1/10 s wait. The record is not lost yet:
//!     the kernel queues it for retry (with the records behind it) and delivers it when the
//!     socket has room; a record whose retries fail too is dropped, counted in `lost` only
//!     when the kernel was booted with `audit=1` (otherwise it is printed to the kernel log
//!     and counted nowhere). So with drops the primary's loss is a lower bound.
//! - **incomplete events** ([`AuditEvent::incomplete`]): events whose `SYSCALL` or
//!   end-of-event record is missing — the loss seen from the events' side, a lower bound of
//!   the events touched.
//!
//! What this makes of the two counters ([`AuditStats::loss`]):
//! - primary: no loss is exact when `lost` did not grow and the socket dropped nothing;
//!   otherwise the `lost` growth is a lower bound of the records lost.
//! - observer: the socket's drops, exact while `lost` did not grow; with growth, a lower
//!   bound (records the kernel refused before the multicast were missed here too, with the
//!   uncounted rest of their events).

use super::auditrec::{AuditEvent, AuditRecord, GroupStats, Grouper};
use super::core::{Family, NlSocket, OpenError, SockSpec, Stream, StreamStats, UringNeed};
use super::msg::{self, NlMsg, ParseError};
use super::source::FrameError;
use super::{Loss, NetlinkPath};
use crate::stats::{Counters, Fallback, Path, Report};
use crate::sys::audit::*;
use crate::sys::netlink as nl;
use std::io;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// Errors of an [`Audit`].
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// Opening or configuring the socket failed.
    #[error("{what}: {source}")]
    Socket {
        /// What was attempted.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The kernel refused a request.
    #[error("{what}: {source}")]
    Refused {
        /// The request.
        what: &'static str,
        /// The kernel's errno.
        #[source]
        source: io::Error,
    },
    /// A malformed answer from the kernel.
    #[error("audit reply: {0}")]
    Parse(#[from] ParseError),
    /// The frame ring failed.
    #[error(transparent)]
    Frames(#[from] FrameError),
}

/// How an [`Audit`] consumer gets the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditMode {
    /// Registered as the audit daemon (`AUDIT_SET` pid).
    Primary,
    /// The read-only multicast group (`AUDIT_NLGRP_READLOG`).
    Observer,
}

impl AuditMode {
    /// `primary` or `observer`.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditMode::Primary => "primary",
            AuditMode::Observer => "observer",
        }
    }
}

/// The fallback's ends for a mode.
fn mode_path(m: AuditMode) -> Path {
    Path::setting(match m {
        AuditMode::Primary => "audit primary (AUDIT_SET pid)",
        AuditMode::Observer => "audit observer (AUDIT_NLGRP_READLOG)",
    })
}

/// Configuration of an [`Audit`].
#[derive(Debug, Clone)]
pub struct AuditConfig {
    /// Primary or observer.
    pub mode: AuditMode,
    /// Primary refused because another daemon is registered (`EEXIST`) or not permitted
    /// (`EPERM`): become an observer instead (recorded as a fallback).
    pub fallback: bool,
    /// Primary: turn auditing on (`enabled` 1) when it is off.
    pub enable: bool,
    /// Primary: the kernel's backlog limit, records.
    pub backlog_limit: Option<u32>,
    /// Primary: how long a task waits for room in the backlog before its record is dropped,
    /// in the kernel's unit (jiffies; 0: drop at once).
    pub backlog_wait_time: Option<u32>,
    /// Primary: records per second (0: no limit).
    pub rate_limit: Option<u32>,
    /// Set what was changed (enabled flag, limits) back at close, and unregister.
    pub restore: bool,
    /// How long an event without an end-of-event record stays open after its last record.
    pub event_wait: Duration,
    /// Most events open at once; beyond, the oldest is closed (counted as evicted).
    pub max_open_events: usize,
    /// Receive buffer; with `.1`, `SO_RCVBUFFORCE` (a refusal is a recorded fallback).
    pub rcvbuf: Option<(usize, bool)>,
    /// Frame size in bytes (a record is at most 8,970 bytes of text).
    pub frame_size: usize,
    /// Frames in the ring.
    pub frames: u32,
    /// Fill frames with an io_uring multishot receive (falls back to `recvmmsg`, recorded).
    pub uring: bool,
    /// Most records one [`Audit::process`] call handles.
    pub budget: usize,
    /// io_uring mode: records (one datagram each) to gather per wait, holding the first back
    /// at most [`AuditConfig::min_wait`] (Linux 6.12; older kernels return on the first).
    pub batch: usize,
    /// See [`AuditConfig::batch`].
    pub min_wait: Duration,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            mode: AuditMode::Primary,
            fallback: true,
            enable: true,
            backlog_limit: None,
            backlog_wait_time: None,
            rate_limit: None,
            restore: true,
            event_wait: Duration::from_millis(500),
            max_open_events: 65536,
            rcvbuf: Some((8 << 20, true)),
            frame_size: 12 << 10,
            frames: 512,
            uring: true,
            budget: 4096,
            batch: 64,
            min_wait: Duration::from_millis(1),
        }
    }
}

/// The kernel's audit status (`AUDIT_GET`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuditStatus {
    /// 0 off, 1 on, 2 on and locked.
    pub enabled: u32,
    /// Failure action: 0 silent, 1 printk, 2 panic.
    pub failure: u32,
    /// The registered daemon's pid (0: none).
    pub pid: u32,
    /// Records per second (0: no limit).
    pub rate_limit: u32,
    /// Backlog limit, records.
    pub backlog_limit: u32,
    /// Records the kernel dropped since boot (or the last reset).
    pub lost: u32,
    /// Records queued now.
    pub backlog: u32,
    /// How long a task waits for room in the backlog (jiffies).
    pub backlog_wait_time: u32,
}

impl std::fmt::Display for AuditStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "enabled {} failure {} pid {} rate_limit {} backlog_limit {} lost {} backlog {} \
             backlog_wait_time {}",
            self.enabled,
            self.failure,
            self.pid,
            self.rate_limit,
            self.backlog_limit,
            self.lost,
            self.backlog,
            self.backlog_wait_time
        )
    }
}

fn status_bytes(s: &crate::sys::audit::AuditStatus) -> [u8; 44] {
    let f = [
        s.mask,
        s.enabled,
        s.failure,
        s.pid,
        s.rate_limit,
        s.backlog_limit,
        s.lost,
        s.backlog,
        s.feature_bitmap,
        s.backlog_wait_time,
        s.backlog_wait_time_actual,
    ];
    let mut out = [0u8; 44];
    for (i, v) in f.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
    }
    out
}

const _: () = assert!(std::mem::size_of::<crate::sys::audit::AuditStatus>() == 44);

/// Parses an `AUDIT_GET` reply's `struct audit_status` (an older kernel's shorter struct
/// leaves the later fields 0).
pub(crate) fn parse_status(p: &[u8]) -> Result<AuditStatus, ParseError> {
    if p.len() < 32 {
        return Err(ParseError::Truncated {
            what: "audit_status",
            need: 32,
            have: p.len(),
        });
    }
    let at = |i: usize| {
        p.get(i * 4..i * 4 + 4)
            .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    Ok(AuditStatus {
        enabled: at(1),
        failure: at(2),
        pid: at(3),
        rate_limit: at(4),
        backlog_limit: at(5),
        lost: at(6),
        backlog: at(7),
        backlog_wait_time: at(9),
    })
}

/// A second audit socket for status requests: the records socket may be busy with records,
/// and `AUDIT_GET`'s reply comes from a kernel thread after the request's ACK.
#[derive(Debug)]
struct Control {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl Control {
    fn open() -> io::Result<Self> {
        let fd = nl::socket(NETLINK_AUDIT)?;
        nl::bind(&fd, 0, 0)?;
        Ok(Self {
            fd,
            seq: 0,
            buf: vec![0u8; 16 << 10],
        })
    }

    /// Sends one request and waits for the message answering it: `want` (a reply of that
    /// type, returned) or the ACK/error (with `ack`).
    fn ask(
        &mut self,
        ty: u16,
        ack: bool,
        payload: &[u8],
        want: Option<u16>,
    ) -> Result<Vec<u8>, AuditError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut req = Vec::with_capacity(64);
        let flags = nl::NLM_F_REQUEST | if ack { nl::NLM_F_ACK } else { 0 };
        msg::emit_whole(&mut req, |out| {
            msg::emit_header(out, ty, flags, seq, 0);
            out.extend_from_slice(payload);
            Ok(())
        })
        .expect("a small request");
        let what = if ty == AUDIT_GET {
            "AUDIT_GET"
        } else {
            "AUDIT_SET"
        };
        nl::send_to_kernel(&self.fd, &req).map_err(|source| AuditError::Socket {
            what: format!("sending {what}"),
            source,
        })?;
        loop {
            if crate::sys::net::poll_one(&self.fd, libc::POLLIN, 5000).map_err(|source| {
                AuditError::Socket {
                    what: format!("waiting for the answer to {what}"),
                    source,
                }
            })? == 0
            {
                return Err(AuditError::Socket {
                    what: format!("waiting for the answer to {what}"),
                    source: io::Error::from(io::ErrorKind::TimedOut),
                });
            }
            let n = crate::sys::net::recv(&self.fd, &mut self.buf, 0).map_err(|source| {
                AuditError::Socket {
                    what: format!("receiving the answer to {what}"),
                    source,
                }
            })?;
            for m in msg::messages(&self.buf[..n]) {
                let m = m?;
                if m.seq != seq {
                    continue;
                }
                if m.ty == nl::NLMSG_ERROR {
                    let code = m.error_code()?;
                    if code != 0 {
                        return Err(AuditError::Refused {
                            what,
                            source: io::Error::from_raw_os_error(-code),
                        });
                    }
                    if want.is_none() {
                        return Ok(Vec::new());
                    }
                } else if Some(m.ty) == want {
                    return Ok(m.payload.to_vec());
                }
            }
        }
    }

    fn get(&mut self) -> Result<AuditStatus, AuditError> {
        let p = self.ask(AUDIT_GET, false, &[], Some(AUDIT_GET))?;
        Ok(parse_status(&p)?)
    }

    fn set(&mut self, s: &crate::sys::audit::AuditStatus) -> Result<(), AuditError> {
        self.ask(AUDIT_SET, true, &status_bytes(s), None).map(drop)
    }
}

/// The kernel's audit status now (`AUDIT_GET` on a socket of its own; `CAP_AUDIT_CONTROL`).
pub fn audit_status() -> Result<AuditStatus, AuditError> {
    Control::open()
        .map_err(|source| AuditError::Socket {
            what: "socket(AF_NETLINK, NETLINK_AUDIT) (audit compiled out?)".into(),
            source,
        })?
        .get()
}

/// The audit record family for [`Stream`].
#[derive(Debug)]
pub(crate) struct AuditFamily;

impl Family for AuditFamily {
    type Item<'a> = AuditRecord<'a>;
    type Tally = ();
    const ONE_PER_DATAGRAM: bool = true;

    fn parse<'a>(m: &NlMsg<'a>) -> Result<Option<AuditRecord<'a>>, ParseError> {
        AuditRecord::parse(m)
    }

    fn tally(_t: &mut (), _r: &AuditRecord<'_>) {}
}

/// Counters of an [`Audit`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuditStats {
    /// Primary or observer.
    pub mode: Option<AuditMode>,
    /// Records and events: how events were closed, incomplete ones.
    #[serde(flatten)]
    pub events: GroupStats,
    /// Events still open (waiting for more records).
    pub open_events: u64,
    /// Receive side: datagrams, syscalls, the socket's drops, parse errors.
    pub stream: StreamStats,
    /// The kernel's `lost` counter when the consumer opened and now (`None`: not readable).
    pub kernel_lost_at_open: Option<u32>,
    /// See [`AuditStats::kernel_lost_at_open`].
    pub kernel_lost_now: Option<u32>,
    /// Everything known of the records lost, per mode (the module docs, "Losses").
    pub loss: Loss,
}

/// What the counters say of the records lost (module docs, "Losses"): the kernel's `lost`
/// growth since open (`None`: unknown; a smaller value than at open: reset by someone, so
/// unknown before the reset) and the socket's drops, which in primary mode are failed sends
/// the kernel retries (not records lost) and in observer mode records lost at this socket.
pub(crate) fn audit_loss(
    mode: AuditMode,
    at_open: Option<u32>,
    now: Option<u32>,
    socket: u64,
) -> Loss {
    // What the kernel counted since open, and whether that is all it counted.
    let kernel = match (at_open, now) {
        (Some(a), Some(n)) if n >= a => Some((u64::from(n - a), true)),
        // Reset since open: what counted after the reset is known, what came before it not.
        (Some(_), Some(n)) => Some((u64::from(n), false)),
        _ => None,
    };
    match (mode, kernel) {
        // Every record the kernel counted never reached the daemon, but it counts one per
        // record it refused to start, and an audited syscall whose first (SYSCALL) record is
        // refused ends there: its other records are never made, and never counted
        // (`audit_log_exit` returns). So a growth is a lower bound; nothing lost is exact
        // only with no growth and no failed send (a failed send is retried, and dropped
        // uncounted when its retries fail, unless booted with audit=1).
        (AuditMode::Primary, Some((k, whole))) => {
            let exact = whole && k == 0 && socket == 0;
            Loss {
                at_least: k,
                at_most: exact.then_some(0),
                exact,
            }
        }
        (AuditMode::Primary, None) => Loss {
            at_least: 0,
            at_most: None,
            exact: false,
        },
        // The socket's drops are records this socket missed. The kernel's count holds records
        // refused before the multicast (missed here too, with the uncounted rest of their
        // events) and records the daemon failed to take after it (received here): with any
        // growth, how many more this socket missed has no upper bound the kernel tells.
        (AuditMode::Observer, Some((k, whole))) => {
            let exact = whole && k == 0;
            Loss {
                at_least: socket,
                at_most: exact.then_some(socket),
                exact,
            }
        }
        (AuditMode::Observer, None) => Loss {
            at_least: socket,
            at_most: None,
            exact: false,
        },
    }
}

impl AuditStats {
    /// The loss in one sentence: what is exact, what is a bound.
    pub fn loss_summary(&self) -> String {
        let l = self.loss;
        let inc = self.events.incomplete;
        let kernel = match (self.kernel_lost_at_open, self.kernel_lost_now) {
            (Some(a), Some(n)) if n >= a => format!("{} record(s) refused by the kernel (its lost counter {a} -> {n}, host-wide; an audited syscall whose first record is refused loses its other records uncounted)", n - a),
            (Some(a), Some(n)) => format!("the kernel's lost counter was reset ({a} -> {n}): at least {n} record(s) dropped by the kernel, how many before the reset unknown"),
            _ => "the kernel's lost counter unreadable (AUDIT_GET needs CAP_AUDIT_CONTROL): its drops unknown".to_string(),
        };
        let n = self.stream.kernel_drops;
        let sock = if self.mode == Some(AuditMode::Primary) {
            format!(
                "{n} send(s) to the socket failed (the kernel retries them; one whose retries \
                 fail is dropped, counted in lost only under audit=1)"
            )
        } else {
            format!("{n} dropped at the socket")
        };
        if l.exact && l.at_least == 0 && inc == 0 {
            return format!("no loss: {kernel}; {sock}; 0 incomplete events");
        }
        if l.exact {
            format!(
                "LOSS: lost {} record(s), exactly: {kernel}; {sock}; {inc} event(s) incomplete",
                l.at_least
            )
        } else {
            let at_least = l.at_least.max(inc);
            let count = match l.at_most {
                Some(m) if m > at_least => format!("{at_least} to {m}"),
                _ => format!(">= {at_least}"),
            };
            format!(
                "LOSS: lost {count} record(s): {kernel}; {sock}; {inc} event(s) incomplete (each \
                 missing at least one record)"
            )
        }
    }
}

/// What to set back at close.
#[derive(Debug, Default)]
struct Restore {
    registered: bool,
    mask: u32,
    old: crate::sys::audit::AuditStatus,
}

/// An audit consumer. See the module docs.
#[derive(Debug)]
pub struct Audit {
    stream: Stream<AuditFamily>,
    control: Option<Control>,
    mode: AuditMode,
    grouper: Grouper,
    done: Vec<AuditEvent>,
    status_at_open: Option<AuditStatus>,
    restore: Option<Restore>,
    fallbacks: Vec<Fallback>,
}

fn sock_err(e: OpenError) -> AuditError {
    AuditError::Socket {
        what: e.what.to_string(),
        source: e.source,
    }
}

impl Audit {
    /// Opens the consumer in the mode `cfg` asks for (see the module docs).
    pub fn open(cfg: AuditConfig) -> Result<Self, AuditError> {
        let mut fallbacks = Vec::new();
        let mut control = match Control::open() {
            Ok(c) => Some(c),
            Err(source) => {
                return Err(AuditError::Socket {
                    what: "socket(AF_NETLINK, NETLINK_AUDIT) (audit compiled out?)".into(),
                    source,
                })
            }
        };
        let status = match control.as_mut().map(Control::get) {
            Some(Ok(s)) => Some(s),
            Some(Err(e)) => {
                fallbacks.push(Fallback::new(
                    Path::setting("kernel lost counter (AUDIT_GET)"),
                    Path::setting("socket drops and incomplete events only"),
                    format!("AUDIT_GET refused: {e} (needs CAP_AUDIT_CONTROL in the initial pid namespace); the kernel's drops are unknown, the loss a lower bound"),
                ));
                control = None;
                None
            }
            None => None,
        };
        let mut mode = cfg.mode;
        if mode == AuditMode::Primary {
            if let Some(s) = status.filter(|s| s.pid != 0 && s.pid != std::process::id()) {
                if !cfg.fallback {
                    return Err(AuditError::Refused {
                        what: "registering as the audit daemon (another is registered)",
                        source: io::Error::from_raw_os_error(libc::EEXIST),
                    });
                }
                fallbacks.push(Fallback::new(
                    mode_path(AuditMode::Primary),
                    mode_path(AuditMode::Observer),
                    format!(
                        "pid {} is registered as the audit daemon; reading beside it",
                        s.pid
                    ),
                ));
                mode = AuditMode::Observer;
            }
        }
        let open = |mode: AuditMode, fallbacks: &mut Vec<Fallback>| {
            let groups: &[u32] = match mode {
                AuditMode::Observer => &[AUDIT_NLGRP_READLOG],
                AuditMode::Primary => &[],
            };
            let frame_size = cfg.frame_size.max(10 << 10);
            let spec = SockSpec {
                protocol: NETLINK_AUDIT,
                groups,
                rcvbuf: cfg.rcvbuf,
                no_enobufs: true,
                ext_ack: false,
                frame_size,
                frames: cfg.frames,
                spill: 0,
                uring: cfg.uring.then_some(UringNeed {
                    // MAX_AUDIT_MESSAGE_LENGTH (8,970) and the netlink header.
                    datagram: 8970 + nl::NLMSG_HDRLEN,
                    what: "an audit record",
                }),
                batch_wait: Some((cfg.batch, cfg.min_wait)),
            };
            NlSocket::open(&spec, fallbacks).map_err(sock_err)
        };
        let mut sock = open(mode, &mut fallbacks)?;
        if mode == AuditMode::Primary {
            let mut set = crate::sys::audit::AuditStatus {
                mask: AUDIT_STATUS_PID,
                pid: std::process::id(),
                ..Default::default()
            };
            let seq = sock.next_seq();
            let mut req = Vec::with_capacity(64);
            msg::emit_whole(&mut req, |out| {
                msg::emit_header(out, AUDIT_SET, nl::NLM_F_REQUEST | nl::NLM_F_ACK, seq, 0);
                out.extend_from_slice(&status_bytes(&set));
                Ok(())
            })
            .expect("a small request");
            let code = sock.request(&req, seq).map_err(|e| AuditError::Socket {
                what: "AUDIT_SET pid".into(),
                source: match e {
                    super::core::RequestError::Send(e) | super::core::RequestError::Recv(e) => e,
                    other => io::Error::other(format!("{other:?}")),
                },
            })?;
            if code != 0 {
                let err = io::Error::from_raw_os_error(-code);
                if !cfg.fallback || !(code == -libc::EEXIST || code == -libc::EPERM) {
                    return Err(AuditError::Refused {
                        what: "AUDIT_SET pid (registering as the audit daemon; CAP_AUDIT_CONTROL, the initial pid namespace)",
                        source: err,
                    });
                }
                fallbacks.push(Fallback::new(
                    mode_path(AuditMode::Primary),
                    mode_path(AuditMode::Observer),
                    format!("AUDIT_SET pid refused: {err}; reading the multicast group instead"),
                ));
                mode = AuditMode::Observer;
                sock = open(mode, &mut fallbacks)?;
            } else {
                let old = status.map(|s| crate::sys::audit::AuditStatus {
                    enabled: s.enabled,
                    rate_limit: s.rate_limit,
                    backlog_limit: s.backlog_limit,
                    backlog_wait_time: s.backlog_wait_time,
                    ..Default::default()
                });
                set.mask = 0;
                set.pid = 0;
                if cfg.enable && status.is_some_and(|s| s.enabled == 0) {
                    set.mask |= AUDIT_STATUS_ENABLED;
                    set.enabled = 1;
                }
                if let Some(v) = cfg.backlog_limit {
                    set.mask |= AUDIT_STATUS_BACKLOG_LIMIT;
                    set.backlog_limit = v;
                }
                if let Some(v) = cfg.backlog_wait_time {
                    set.mask |= AUDIT_STATUS_BACKLOG_WAIT_TIME;
                    set.backlog_wait_time = v;
                }
                if let Some(v) = cfg.rate_limit {
                    set.mask |= AUDIT_STATUS_RATE_LIMIT;
                    set.rate_limit = v;
                }
                // Registered: from here on, dropping `me` unregisters (and sets back).
                let mut me = Self::assemble(
                    sock,
                    control,
                    mode,
                    &cfg,
                    status,
                    Some(Restore {
                        registered: true,
                        mask: set.mask,
                        old: old.unwrap_or_default(),
                    }),
                    fallbacks,
                );
                if set.mask != 0 {
                    match me.control.as_mut() {
                        Some(c) => c.set(&set)?,
                        None => {
                            return Err(AuditError::Refused {
                                what: "AUDIT_SET (the limits asked for)",
                                source: io::Error::from_raw_os_error(libc::EPERM),
                            })
                        }
                    }
                }
                if !cfg.restore {
                    me.restore = None;
                }
                return Ok(me);
            }
        }
        Ok(Self::assemble(
            sock, control, mode, &cfg, status, None, fallbacks,
        ))
    }

    fn assemble(
        sock: NlSocket,
        control: Option<Control>,
        mode: AuditMode,
        cfg: &AuditConfig,
        status: Option<AuditStatus>,
        restore: Option<Restore>,
        fallbacks: Vec<Fallback>,
    ) -> Self {
        Self {
            stream: Stream::new(sock, cfg.budget),
            control,
            mode,
            grouper: Grouper::new(cfg.event_wait, cfg.max_open_events),
            done: Vec::new(),
            status_at_open: status,
            restore,
            fallbacks,
        }
    }

    /// Primary or observer (after any fallback).
    pub fn mode(&self) -> AuditMode {
        self.mode
    }

    /// The kernel's audit status when the consumer opened (`None`: `AUDIT_GET` refused).
    pub fn status_at_open(&self) -> Option<AuditStatus> {
        self.status_at_open
    }

    /// The kernel's audit status now (one request on the control socket).
    pub fn kernel_status(&mut self) -> Result<AuditStatus, AuditError> {
        match &mut self.control {
            Some(c) => c.get(),
            None => Err(AuditError::Refused {
                what: "AUDIT_GET",
                source: io::Error::from_raw_os_error(libc::EPERM),
            }),
        }
    }

    /// Receives what is ready (waiting up to `timeout` when nothing is; `None`: until an
    /// event completes), groups the records and hands every completed event to `f`, in the
    /// order they completed. Returns the events handled.
    pub fn process<F>(&mut self, timeout: Option<Duration>, mut f: F) -> Result<usize, AuditError>
    where
        F: FnMut(&AuditEvent),
    {
        let now = Instant::now();
        let mut wait = timeout.unwrap_or(Duration::MAX);
        if let Some(d) = self.grouper.next_deadline(now) {
            wait = wait.min(d);
        }
        let grouper = &mut self.grouper;
        let done = &mut self.done;
        self.stream.process(wait, &mut |r: &AuditRecord<'_>| {
            grouper.push(r, Instant::now(), done);
        })?;
        self.grouper.expire(Instant::now(), false, &mut self.done);
        let n = self.done.len();
        for ev in self.done.drain(..) {
            f(&ev);
        }
        Ok(n)
    }

    /// How long until the earliest open event closes by the wait for its end-of-event record
    /// (`None`: no event is open). An async caller that waits on [`Audit::readiness_fd`]
    /// waits at most this long, then calls [`Audit::on_ready`] to close it.
    pub fn next_close(&self) -> Option<Duration> {
        self.grouper.next_deadline(Instant::now())
    }

    /// Closes every open event now (their end-of-event records may still come: call at
    /// exit) and hands them to `f`.
    pub fn flush<F>(&mut self, mut f: F) -> usize
    where
        F: FnMut(&AuditEvent),
    {
        self.grouper.expire(Instant::now(), true, &mut self.done);
        let n = self.done.len();
        for ev in self.done.drain(..) {
            f(&ev);
        }
        n
    }

    /// Counters. Reads the socket's drop counter and the kernel's `lost` (two requests).
    pub fn stats(&mut self) -> AuditStats {
        let stream = self.stream.stats();
        let now = self.kernel_status().ok();
        let at_open = self.status_at_open.map(|s| s.lost);
        let lost_now = now.map(|s| s.lost);
        AuditStats {
            mode: Some(self.mode),
            events: self.grouper.stats,
            open_events: self.grouper.open_events() as u64,
            stream,
            kernel_lost_at_open: at_open,
            kernel_lost_now: lost_now,
            loss: audit_loss(self.mode, at_open, lost_now, stream.kernel_drops),
        }
    }

    /// Fallbacks taken while opening.
    pub fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }

    /// `frame-ring+io_uring` or `frame-ring+recvmmsg`.
    pub fn path(&self) -> NetlinkPath {
        self.stream.sock.path()
    }

    /// The readiness descriptor (created on first call): readable when
    /// [`Audit::on_ready`] would find records.
    pub fn readiness_fd(&mut self) -> Result<std::os::fd::BorrowedFd<'_>, AuditError> {
        self.stream.readiness_fd().map_err(sock_err)
    }

    /// The readiness descriptor is watched edge-triggered (tokio's `AsyncFd`): `on_ready`
    /// does not read the frame ring's eventfd back to zero (see `NlSocket::set_edge_readiness`).
    #[cfg(feature = "tokio")]
    pub(crate) fn set_edge_readiness(&mut self, edge: bool) {
        self.stream.sock.set_edge_readiness(edge);
    }

    /// Handles what is ready without waiting (and closes events whose wait ended). Returns the
    /// events handled.
    pub fn on_ready<F>(&mut self, f: &mut F) -> Result<usize, AuditError>
    where
        F: FnMut(&AuditEvent),
    {
        self.readiness_fd()?;
        let grouper = &mut self.grouper;
        let done = &mut self.done;
        self.stream.on_ready(&mut |r: &AuditRecord<'_>| {
            grouper.push(r, Instant::now(), done);
        })?;
        self.grouper.expire(Instant::now(), false, &mut self.done);
        let n = self.done.len();
        for ev in self.done.drain(..) {
            f(&ev);
        }
        Ok(n)
    }

    /// Unregisters (primary) and sets back what open changed. Also done on drop; call it to
    /// stop being the daemon before draining what is queued.
    pub fn unregister(&mut self) -> Result<(), AuditError> {
        self.close_restore_checked()
    }

    fn close_restore(&mut self) {
        if let Err(e) = self.close_restore_checked() {
            tracing::warn!(error = %e, "audit: setting the kernel's audit state back failed");
        }
    }

    fn close_restore_checked(&mut self) -> Result<(), AuditError> {
        let Some(r) = self.restore.take() else {
            return Ok(());
        };
        let Some(c) = self.control.as_mut() else {
            return Ok(());
        };
        let mut first = None;
        if r.registered {
            let s = crate::sys::audit::AuditStatus {
                mask: AUDIT_STATUS_PID,
                pid: 0,
                ..Default::default()
            };
            if let Err(e) = c.set(&s) {
                first.get_or_insert(e);
            }
        }
        if r.mask != 0 {
            let s = crate::sys::audit::AuditStatus {
                mask: r.mask,
                ..r.old
            };
            if let Err(e) = c.set(&s) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for Audit {
    fn drop(&mut self) {
        self.close_restore();
    }
}

impl Report for Audit {
    type Path = NetlinkPath;
    fn path(&self) -> NetlinkPath {
        Audit::path(self)
    }
    /// `ops` = events, `bytes` = bytes received, `syscalls` = receive syscalls.
    fn counters(&self) -> Counters {
        let s = self.stream.stats();
        Counters {
            ops: self.grouper.stats.events,
            bytes: s.bytes,
            syscalls: s.syscalls,
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

    #[test]
    fn a_reset_or_unreadable_lost_counter_makes_the_loss_a_lower_bound() {
        use AuditMode::{Observer, Primary};
        let l = audit_loss(Primary, Some(50), Some(4), 0);
        assert_eq!((l.at_least, l.exact), (4, false));
        let l = audit_loss(Observer, None, None, 7);
        assert_eq!((l.at_least, l.at_most, l.exact), (7, None, false));
        let l = audit_loss(Observer, Some(50), Some(4), 7);
        assert_eq!((l.at_least, l.at_most, l.exact), (7, None, false));
    }

    /// The kernel counts one lost record where it refuses an event's first record, and the
    /// event's other records are never made: any growth of its counter is a lower bound (on
    /// the host a stopped consumer's storm grew it by 2,968 while 11,687 records never came).
    /// Only no growth and no failed send is an exact "nothing lost".
    #[test]
    fn the_kernels_lost_count_is_a_lower_bound_and_only_zero_is_exact() {
        use AuditMode::{Observer, Primary};
        assert_eq!(
            audit_loss(Primary, Some(5), Some(12), 0),
            Loss {
                at_least: 7,
                at_most: None,
                exact: false
            }
        );
        assert_eq!(
            audit_loss(Primary, Some(5), Some(5), 0),
            Loss {
                at_least: 0,
                at_most: Some(0),
                exact: true
            }
        );
        assert_eq!(
            audit_loss(Observer, Some(5), Some(12), 3),
            Loss {
                at_least: 3,
                at_most: None,
                exact: false
            }
        );
    }

    /// In primary mode a socket drop is a send the kernel retries (delivered later, or dropped
    /// uncounted): the kernel's count is then a lower bound, and the drops are not added.
    #[test]
    fn primary_socket_drops_are_retried_sends_so_the_loss_is_a_lower_bound() {
        assert_eq!(
            audit_loss(AuditMode::Primary, Some(5), Some(12), 3),
            Loss {
                at_least: 7,
                at_most: None,
                exact: false
            }
        );
    }

    /// In observer mode a socket drop is a record lost here: exact while the kernel's count
    /// did not grow.
    #[test]
    fn observer_loss_is_the_socket_drops_while_the_kernel_lost_nothing() {
        assert_eq!(
            audit_loss(AuditMode::Observer, Some(5), Some(5), 3),
            Loss {
                at_least: 3,
                at_most: Some(3),
                exact: true
            }
        );
    }

    #[test]
    fn status_round_trips_through_its_bytes() {
        let s = crate::sys::audit::AuditStatus {
            mask: 0,
            enabled: 1,
            failure: 1,
            pid: 42,
            rate_limit: 0,
            backlog_limit: 64,
            lost: 9,
            backlog: 3,
            feature_bitmap: 0x7f,
            backlog_wait_time: 15000,
            backlog_wait_time_actual: 0,
        };
        let p = parse_status(&status_bytes(&s)).unwrap();
        assert_eq!(
            (
                p.enabled,
                p.pid,
                p.backlog_limit,
                p.lost,
                p.backlog_wait_time
            ),
            (1, 42, 64, 9, 15000)
        );
        assert!(parse_status(&[0u8; 20]).is_err());
    }
}

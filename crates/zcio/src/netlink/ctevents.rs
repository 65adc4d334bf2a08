//! [`CtEvents`]: conntrack NEW / UPDATE / DESTROY events on the frame ring.
//!
//! A `NETLINK_NETFILTER` socket joins the ctnetlink multicast groups of the events asked for;
//! every event is one datagram, so one receive moves up to 64 events into frames and each is
//! handed to the caller as a [`CtEvent`] borrowed from its frame.
//!
//! # Losses
//!
//! ctnetlink multicasts each event; when the socket's receive buffer is full the kernel drops
//! the event for this socket and counts it in the socket's `sk_drops`, which zcio reads
//! (`SO_MEMINFO`, [`StreamStats::kernel_drops`]): the exact number of events lost at the
//! socket, read when the counters are asked for, so a burst lost after the last event that
//! arrived is counted too. Conntrack events carry no sequence number, so this counter is the
//! only exact account. An event ctnetlink fails to *build* (no memory for its skb) is never
//! counted: the kernel reports it only as `ENOBUFS` on the socket (`nfnetlink_set_err`), and
//! not at all with `NETLINK_NO_ENOBUFS`. So [`CtStats::loss`] is exact while the overruns are
//! no more than the drops, and a lower bound (`max(drops, overruns)`) otherwise.
//!
//! `NETLINK_NO_ENOBUFS` ([`CtEventsConfig::no_enobufs`]) decides what else happens:
//!
//! - **off (default)**: the first drop also marks the socket congested and the next receive
//!   fails with `ENOBUFS` (an overrun, [`StreamStats::overruns`]). While it is congested the
//!   kernel drops *every* event for it, until the receive queue has been read empty — a burst
//!   that overflows the buffer loses more than the overflow itself. The consumer learns of the
//!   loss at once, in band.
//! - **on**: no congestion state and no `ENOBUFS`: only the events that do not fit are
//!   dropped, and the kernel keeps delivering as soon as there is room. Fewer events lost for
//!   the same buffer, but the loss shows only in the drop counter (zcio still reports it; a
//!   plain `recv` loop would never know). `conntrackd` sets it for this reason.
//!
//! Sizing the receive buffer ([`CtEventsConfig::rcvbuf`], `SO_RCVBUFFORCE` by default) for
//! the largest burst is what avoids loss: each event costs its datagram's truesize (about
//! 1 KiB for a 300-byte event) against the buffer.

use super::conntrack::{ct_type, CtEvent, CtEventKind};
use super::core::{Family, Loss, NlSocket, SockSpec, Stream, StreamStats, UringNeed};
use super::msg::{NlMsg, ParseError};
use super::source::FrameError;
use super::NetlinkPath;
use crate::stats::{Counters, Fallback, Report};
use crate::sys::ctnetlink::*;
use crate::sys::nfqueue::NETLINK_NETFILTER;
use std::io;
use std::time::Duration;

/// Errors of a [`CtEvents`].
#[derive(Debug, thiserror::Error)]
pub enum CtError {
    /// Opening or configuring the socket failed.
    #[error("{what}: {source}")]
    Socket {
        /// What was attempted.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// No event kind was asked for.
    #[error("no conntrack event kind selected (new, update, destroy)")]
    NothingSelected,
    /// The frame ring failed.
    #[error(transparent)]
    Frames(#[from] FrameError),
}

/// Configuration of a [`CtEvents`].
#[derive(Debug, Clone)]
pub struct CtEventsConfig {
    /// Receive NEW events (`NFNLGRP_CONNTRACK_NEW`).
    pub new: bool,
    /// Receive UPDATE events (`NFNLGRP_CONNTRACK_UPDATE`).
    pub update: bool,
    /// Receive DESTROY events (`NFNLGRP_CONNTRACK_DESTROY`).
    pub destroy: bool,
    /// Receive buffer; with `.1`, `SO_RCVBUFFORCE` (a refusal is a recorded fallback).
    pub rcvbuf: Option<(usize, bool)>,
    /// `NETLINK_NO_ENOBUFS`; see the module docs for both choices.
    pub no_enobufs: bool,
    /// Frame size in bytes (an event is one datagram of a few hundred bytes).
    pub frame_size: usize,
    /// Frames in the ring.
    pub frames: u32,
    /// Fill frames with an io_uring multishot receive (falls back to `recvmmsg`, recorded).
    pub uring: bool,
    /// Most events one [`CtEvents::process`] call handles.
    pub budget: usize,
    /// io_uring mode: events (one datagram each) to gather per wait, holding the first back
    /// at most [`CtEventsConfig::min_wait`]; 1 returns on the first (Linux 6.12; older kernels
    /// return on the first, recorded as a fallback). The kernel sends every event on its own,
    /// so this is the batching that makes a receive move many.
    pub batch: usize,
    /// How long a wait may hold its first event back to gather [`CtEventsConfig::batch`].
    pub min_wait: Duration,
}

impl Default for CtEventsConfig {
    fn default() -> Self {
        Self {
            new: true,
            update: true,
            destroy: true,
            rcvbuf: Some((8 << 20, true)),
            no_enobufs: false,
            frame_size: 4096,
            frames: 256,
            uring: true,
            budget: 1024,
            batch: 64,
            min_wait: Duration::from_millis(1),
        }
    }
}

/// Counters of a [`CtEvents`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CtStats {
    /// Events received.
    pub events: u64,
    /// Of which NEW.
    pub new: u64,
    /// UPDATE.
    pub update: u64,
    /// DESTROY.
    pub destroy: u64,
    /// Receive side: datagrams, syscalls, overruns, the socket's drops (events lost), parse
    /// errors.
    #[serde(flatten)]
    pub stream: StreamStats,
    /// Everything known of the loss: the events dropped at the socket (exact), or more where
    /// the socket reported more overruns than its drop counter explains (see the module
    /// docs).
    pub loss: Loss,
}

impl CtStats {
    /// Events the kernel dropped at this socket (exact; see the module docs).
    pub fn lost(&self) -> u64 {
        self.stream.kernel_drops
    }

    /// The loss in one sentence: what is exact, what is a bound ("no loss ..." when none was
    /// seen).
    pub fn loss_summary(&self) -> String {
        let (drops, overruns) = (self.stream.kernel_drops, self.stream.overruns);
        if drops == 0 && overruns == 0 {
            return "no loss: no event dropped at the socket, no overrun".into();
        }
        if self.loss.exact {
            format!(
                "LOSS: lost {drops} event(s), exactly: dropped by the kernel at the socket \
                 (receive buffer full; its drop counter); {overruns} overrun(s) reported \
                 (ENOBUFS)"
            )
        } else {
            format!(
                "LOSS: lost >= {}: {drops} event(s) dropped at the socket (exact), and \
                 {overruns} overrun(s) (ENOBUFS) each standing for at least one lost event, \
                 more than the drop counter explains (an event the kernel failed to build is \
                 reported only this way, without a count)",
                self.loss.at_least
            )
        }
    }
}

/// What conntrack's counters say of the loss: `drops` events dropped at the socket (`None`:
/// the kernel cannot say) and `overruns` ENOBUFS reports. Each report stands for at least one
/// lost event (a drop at the socket, or an event ctnetlink failed to allocate, which
/// `nfnetlink_set_err` reports without counting), and is reported once: at least
/// `max(drops, overruns)` were lost, and exactly `drops` when the drops explain every report.
pub(crate) fn ct_loss(drops: Option<u64>, overruns: u64) -> Loss {
    match drops {
        Some(d) if overruns <= d => Loss {
            at_least: d,
            at_most: Some(d),
            exact: true,
        },
        d => Loss {
            at_least: d.unwrap_or(0).max(overruns),
            at_most: None,
            exact: false,
        },
    }
}

/// The ctnetlink event family for [`Stream`].
#[derive(Debug)]
pub(crate) struct CtFamily;

/// Event counts by kind.
#[derive(Debug, Default)]
pub(crate) struct CtTally {
    new: u64,
    update: u64,
    destroy: u64,
}

impl Family for CtFamily {
    type Item<'a> = CtEvent<'a>;
    type Tally = CtTally;

    fn parse<'a>(m: &NlMsg<'a>) -> Result<Option<CtEvent<'a>>, ParseError> {
        if m.ty < 16 {
            return Ok(None);
        }
        if m.ty != ct_type(IPCTNL_MSG_CT_NEW) && m.ty != ct_type(IPCTNL_MSG_CT_DELETE) {
            return Err(ParseError::Type(m.ty));
        }
        CtEvent::parse(m).map(Some)
    }

    fn tally(t: &mut CtTally, e: &CtEvent<'_>) {
        match e.kind {
            CtEventKind::New => t.new += 1,
            CtEventKind::Update => t.update += 1,
            CtEventKind::Destroy => t.destroy += 1,
        }
    }
}

/// A conntrack event subscriber. See the module docs.
#[derive(Debug)]
pub struct CtEvents {
    stream: Stream<CtFamily>,
    fallbacks: Vec<Fallback>,
}

fn sock_err(e: super::core::OpenError) -> CtError {
    CtError::Socket {
        what: e.what.to_string(),
        source: e.source,
    }
}

impl CtEvents {
    /// Opens the socket and joins the groups of the event kinds in `cfg`. Needs CAP_NET_ADMIN
    /// in the network namespace's user namespace; the kernel loads nf_conntrack_netlink on the
    /// first subscription. Events flow only for entries conntrack tracks: a rule or a feature
    /// that uses conntrack must be active in the namespace.
    pub fn open(cfg: CtEventsConfig) -> Result<Self, CtError> {
        let mut groups = Vec::new();
        if cfg.new {
            groups.push(NFNLGRP_CONNTRACK_NEW);
        }
        if cfg.update {
            groups.push(NFNLGRP_CONNTRACK_UPDATE);
        }
        if cfg.destroy {
            groups.push(NFNLGRP_CONNTRACK_DESTROY);
        }
        if groups.is_empty() {
            return Err(CtError::NothingSelected);
        }
        let frame_size = cfg.frame_size.max(512);
        let mut fallbacks = Vec::new();
        let spec = SockSpec {
            protocol: NETLINK_NETFILTER,
            groups: &groups,
            rcvbuf: cfg.rcvbuf,
            no_enobufs: cfg.no_enobufs,
            ext_ack: false,
            frame_size,
            frames: cfg.frames,
            spill: 64 << 10,
            uring: cfg.uring.then_some(UringNeed {
                // An event's skb is sized for its attributes (`ctnetlink_nlmsg_size`); with
                // labels and a security context it stays well under a page.
                datagram: frame_size - crate::buf::frames::FRAME_HDR_LEN,
                what: "a conntrack event",
            }),
            batch_wait: Some((cfg.batch, cfg.min_wait)),
        };
        let sock = NlSocket::open(&spec, &mut fallbacks).map_err(sock_err)?;
        Ok(Self {
            stream: Stream::new(sock, cfg.budget),
            fallbacks,
        })
    }

    /// Receives what is ready (waiting up to `timeout` when nothing is; `None`: until
    /// something arrives) and hands every event to `f` in arrival order. Returns the events
    /// handled (at most about [`CtEventsConfig::budget`]).
    pub fn process<F>(&mut self, timeout: Option<Duration>, mut f: F) -> Result<usize, CtError>
    where
        F: FnMut(&CtEvent<'_>),
    {
        let wait = timeout.unwrap_or(Duration::MAX);
        Ok(self.stream.process(wait, &mut f)?)
    }

    /// Counters. Reads the socket's drop counter (one `getsockopt`).
    pub fn stats(&self) -> CtStats {
        let t = self.stream.tally();
        let stream = self.stream.stats();
        let loss = ct_loss(self.stream.sock.kernel_drops(), stream.overruns);
        CtStats {
            events: t.new + t.update + t.destroy,
            new: t.new,
            update: t.update,
            destroy: t.destroy,
            stream,
            loss,
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
    /// [`CtEvents::on_ready`] would find events.
    pub fn readiness_fd(&mut self) -> Result<std::os::fd::BorrowedFd<'_>, CtError> {
        self.stream.readiness_fd().map_err(sock_err)
    }

    /// The readiness descriptor is watched edge-triggered (tokio's `AsyncFd`): `on_ready`
    /// does not read the frame ring's eventfd back to zero (see `NlSocket::set_edge_readiness`).
    #[cfg(feature = "tokio")]
    pub(crate) fn set_edge_readiness(&mut self, edge: bool) {
        self.stream.sock.set_edge_readiness(edge);
    }

    /// Handles what is ready without waiting. Returns the events handled.
    pub fn on_ready<F>(&mut self, f: &mut F) -> Result<usize, CtError>
    where
        F: FnMut(&CtEvent<'_>),
    {
        self.readiness_fd()?;
        Ok(self.stream.on_ready(f)?)
    }
}

impl Report for CtEvents {
    type Path = NetlinkPath;
    fn path(&self) -> NetlinkPath {
        CtEvents::path(self)
    }
    /// `ops` = events, `bytes` = bytes received, `syscalls` = receive syscalls.
    fn counters(&self) -> Counters {
        let s = self.stats();
        Counters {
            ops: s.events,
            bytes: s.stream.bytes,
            syscalls: s.stream.syscalls,
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
    fn overruns_the_drop_counter_does_not_explain_make_the_loss_a_lower_bound() {
        // Drops explain every overrun (one per congestion episode): exact.
        assert_eq!(
            ct_loss(Some(9500), 2),
            Loss {
                at_least: 9500,
                at_most: Some(9500),
                exact: true
            }
        );
        // Reports without drops: events the kernel failed to build, uncounted.
        assert_eq!(
            ct_loss(Some(0), 3),
            Loss {
                at_least: 3,
                at_most: None,
                exact: false
            }
        );
        // No drop counter: the overruns alone.
        assert_eq!(ct_loss(None, 1).at_least, 1);
        assert!(!ct_loss(None, 0).exact);
        assert!(ct_loss(Some(0), 0).exact);
    }
}

//! [`NfLog`]: an NFLOG (nfnetlink_log) consumer on the frame ring.
//!
//! One socket binds one or more groups (`--nflog-group`), sets their copy mode and range,
//! kernel-side batching (`NFULA_CFG_NLBUFSIZ`, `NFULA_CFG_TIMEOUT`, `NFULA_CFG_QTHRESH`) and
//! flags (`SEQ`, `SEQ_GLOBAL`, `CONNTRACK`), and hands every logged packet to the caller as a
//! [`LogPacket`] whose payload and metadata point into the frame (no copy). The kernel batches
//! up to `qthresh` messages into one datagram (ended by `NLMSG_DONE`); one receive moves up to
//! 64 datagrams.
//!
//! Losses are counted, never silent: `ENOBUFS` on a receive (an overrun, unless
//! `NETLINK_NO_ENOBUFS`), gaps in the per-group sequence numbers (`NFULA_SEQ`: the exact
//! number of messages lost, on by default), and the socket's drop counter (`SO_MEMINFO`).

use super::core::{Family, Loss, NlSocket, RequestError, SockSpec, Stream, StreamStats, UringNeed};
use super::msg::{attrs, emit_attr, emit_header, emit_whole, EmitError, NlMsg, ParseError};
use super::nfqmsg::{CopyMode, NfGen, NFGENMSG_LEN};
use super::refusal::{BindRefusal, Table};
use super::source::FrameError;
use super::{Conntrack, NetlinkPath};
use crate::stats::{Counters, Fallback, Report};
use crate::sys::netlink::{self as nl, NLA_F_NESTED, NLMSG_DONE, NLM_F_ACK, NLM_F_REQUEST};
use crate::sys::nflog::*;
use crate::sys::nfqueue::{NETLINK_NETFILTER, NFNETLINK_V0};
use std::io;
use std::time::Duration;

/// Message type of an NFLOG message on the wire.
pub(crate) const fn ulog_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_ULOG << 8) | msg
}

/// One logged packet (`NFULNL_MSG_PACKET`), borrowed from its frame.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogPacket<'a> {
    /// The group (`--nflog-group`) it was logged to.
    pub group: u16,
    /// Address family of the hook (2 IPv4, 10 IPv6, 7 bridge, 5 netdev, 3 ARP).
    pub family: u8,
    /// Ethertype (host order).
    pub hw_protocol: u16,
    /// Netfilter hook (0 PREROUTING, 1 INPUT, 2 FORWARD, 3 OUTPUT, 4 POSTROUTING).
    pub hook: u8,
    /// The rule's prefix (`--nflog-prefix`), without its terminating NUL.
    pub prefix: Option<&'a [u8]>,
    /// Packet mark (sent when non-zero).
    pub mark: Option<u32>,
    /// Input interface index.
    pub indev: Option<u32>,
    /// Output interface index.
    pub outdev: Option<u32>,
    /// Bridge port the packet came in on.
    pub physindev: Option<u32>,
    /// Bridge port it goes out on.
    pub physoutdev: Option<u32>,
    /// Link-layer source address (`NFULA_HWADDR`).
    pub hwaddr: Option<&'a [u8]>,
    /// `ARPHRD_*` type of the input device.
    pub hwtype: Option<u16>,
    /// Link-layer header length of the input device.
    pub hwlen: Option<u16>,
    /// Link-layer header (`NFULA_HWHEADER`).
    pub hwheader: Option<&'a [u8]>,
    /// When the packet was received, (seconds, microseconds) since the epoch; the kernel sends
    /// it on PREROUTING, INPUT and FORWARD only — always since Linux 6.6, before that only for
    /// packets something had asked to timestamp (a socket with `SO_TIMESTAMP`, a packet
    /// capture).
    pub timestamp: Option<(u64, u64)>,
    /// UID of the local socket that sent or receives it.
    pub uid: Option<u32>,
    /// GID of that socket.
    pub gid: Option<u32>,
    /// Instance-local sequence number (`NFULNL_CFG_F_SEQ`): consecutive per group, so a gap
    /// counts lost messages exactly.
    pub seq: Option<u32>,
    /// Sequence number across every group of the namespace with `SEQ_GLOBAL`.
    pub seq_global: Option<u32>,
    /// The conntrack entry (`NFULA_CT`, nested ctnetlink attributes; with the `conntrack`
    /// flag): [`LogPacket::conntrack`] parses it.
    pub ct: Option<&'a [u8]>,
    /// `enum ip_conntrack_info` (0 established, 1 related, 2 new, 3 established reply, …).
    pub ct_info: Option<u32>,
    /// VLAN (proto, TCI) of a bridge or netdev packet.
    pub vlan: Option<(u16, u16)>,
    /// The whole layer-2 header of a bridge or netdev packet.
    pub l2hdr: Option<&'a [u8]>,
    /// The packet from the network header on, up to the copy range (for the bridge and
    /// netdev families, from the layer-3 header too).
    pub payload: Option<&'a [u8]>,
    /// Attributes zcio does not interpret.
    pub unknown: u16,
}

fn be16(a: &super::msg::Attr<'_>, what: &'static str) -> Result<u16, ParseError> {
    let b = a.exact(what, 2)?;
    Ok(u16::from_be_bytes([b[0], b[1]]))
}

impl<'a> LogPacket<'a> {
    /// Parses one `NFULNL_MSG_PACKET` message.
    pub fn parse(m: &NlMsg<'a>) -> Result<Self, ParseError> {
        if m.ty != ulog_type(NFULNL_MSG_PACKET) {
            return Err(ParseError::Type(m.ty));
        }
        let g = NfGen::parse(m.payload)?;
        let mut p = LogPacket {
            group: g.res_id,
            family: g.family,
            ..Default::default()
        };
        let mut have_hdr = false;
        for a in attrs(&m.payload[NFGENMSG_LEN..]) {
            let a = a?;
            match a.ty {
                NFULA_PACKET_HDR => {
                    let b = a.exact("NFULA_PACKET_HDR", 4)?;
                    p.hw_protocol = u16::from_be_bytes([b[0], b[1]]);
                    p.hook = b[2];
                    have_hdr = true;
                }
                NFULA_PREFIX => {
                    p.prefix = Some(a.value.split(|&b| b == 0).next().unwrap_or(&[]));
                }
                NFULA_MARK => p.mark = Some(a.be32("NFULA_MARK")?),
                NFULA_IFINDEX_INDEV => p.indev = Some(a.be32("NFULA_IFINDEX_INDEV")?),
                NFULA_IFINDEX_OUTDEV => p.outdev = Some(a.be32("NFULA_IFINDEX_OUTDEV")?),
                NFULA_IFINDEX_PHYSINDEV => p.physindev = Some(a.be32("NFULA_IFINDEX_PHYSINDEV")?),
                NFULA_IFINDEX_PHYSOUTDEV => {
                    p.physoutdev = Some(a.be32("NFULA_IFINDEX_PHYSOUTDEV")?)
                }
                NFULA_HWADDR => {
                    let b = a.exact("NFULA_HWADDR", 12)?;
                    let n = (u16::from_be_bytes([b[0], b[1]]) as usize).min(8);
                    p.hwaddr = Some(&b[4..4 + n]);
                }
                NFULA_HWTYPE => p.hwtype = Some(be16(&a, "NFULA_HWTYPE")?),
                NFULA_HWLEN => p.hwlen = Some(be16(&a, "NFULA_HWLEN")?),
                NFULA_HWHEADER => p.hwheader = Some(a.value),
                NFULA_TIMESTAMP => {
                    let b = a.exact("NFULA_TIMESTAMP", 16)?;
                    let mut s = [0u8; 8];
                    let mut u = [0u8; 8];
                    s.copy_from_slice(&b[0..8]);
                    u.copy_from_slice(&b[8..16]);
                    p.timestamp = Some((u64::from_be_bytes(s), u64::from_be_bytes(u)));
                }
                NFULA_UID => p.uid = Some(a.be32("NFULA_UID")?),
                NFULA_GID => p.gid = Some(a.be32("NFULA_GID")?),
                NFULA_SEQ => p.seq = Some(a.be32("NFULA_SEQ")?),
                NFULA_SEQ_GLOBAL => p.seq_global = Some(a.be32("NFULA_SEQ_GLOBAL")?),
                NFULA_CT => p.ct = Some(a.value),
                NFULA_CT_INFO => p.ct_info = Some(a.be32("NFULA_CT_INFO")?),
                NFULA_VLAN => {
                    let (mut proto, mut tci) = (None, None);
                    for v in attrs(a.value) {
                        let v = v?;
                        match v.ty {
                            NFULA_VLAN_PROTO => proto = Some(be16(&v, "NFULA_VLAN_PROTO")?),
                            NFULA_VLAN_TCI => tci = Some(be16(&v, "NFULA_VLAN_TCI")?),
                            _ => {}
                        }
                    }
                    p.vlan = Some((
                        proto.ok_or(ParseError::Missing("NFULA_VLAN_PROTO"))?,
                        tci.ok_or(ParseError::Missing("NFULA_VLAN_TCI"))?,
                    ));
                }
                NFULA_L2HDR => p.l2hdr = Some(a.value),
                NFULA_PAYLOAD => p.payload = Some(a.value),
                _ => p.unknown = p.unknown.saturating_add(1),
            }
        }
        if !have_hdr {
            return Err(ParseError::Missing("NFULA_PACKET_HDR"));
        }
        Ok(p)
    }

    /// Parses one message from its bytes (a whole `nlmsghdr` and payload).
    pub fn parse_bytes(msg: &'a [u8]) -> Result<Self, ParseError> {
        let (m, _) = NlMsg::parse(msg)?;
        Self::parse(&m)
    }

    /// The conntrack entry of the packet (with the `conntrack` flag), parsed.
    pub fn conntrack(&self) -> Option<Result<Conntrack<'a>, ParseError>> {
        self.ct.map(Conntrack::parse)
    }

    /// Appends the message as the kernel builds it (`__build_packet_message`: its attribute
    /// order, the bridge family's physical-device-first order included). Attributes zcio does
    /// not interpret are not re-emitted.
    pub fn emit(&self, out: &mut Vec<u8>, seq: u32, pid: u32) -> Result<(), EmitError> {
        emit_whole(out, |out| {
            emit_header(out, ulog_type(NFULNL_MSG_PACKET), 0, seq, pid);
            NfGen {
                family: self.family,
                version: NFNETLINK_V0,
                res_id: self.group,
            }
            .emit(out);
            let be32 = |out: &mut Vec<u8>, ty: u16, v: Option<u32>| -> Result<(), EmitError> {
                match v {
                    Some(v) => emit_attr(out, ty, &v.to_be_bytes()),
                    None => Ok(()),
                }
            };
            let be16 = |out: &mut Vec<u8>, ty: u16, v: Option<u16>| -> Result<(), EmitError> {
                match v {
                    Some(v) => emit_attr(out, ty, &v.to_be_bytes()),
                    None => Ok(()),
                }
            };
            let hdr = [
                self.hw_protocol.to_be_bytes()[0],
                self.hw_protocol.to_be_bytes()[1],
                self.hook,
                0,
            ];
            emit_attr(out, NFULA_PACKET_HDR, &hdr)?;
            if let Some(p) = self.prefix {
                let mut v = Vec::with_capacity(p.len() + 1);
                v.extend_from_slice(p);
                v.push(0);
                emit_attr(out, NFULA_PREFIX, &v)?;
            }
            // The bridge family names the port first, then the bridge.
            const BRIDGE: u8 = 7;
            if self.family == BRIDGE {
                be32(out, NFULA_IFINDEX_PHYSINDEV, self.physindev)?;
                be32(out, NFULA_IFINDEX_INDEV, self.indev)?;
                be32(out, NFULA_IFINDEX_PHYSOUTDEV, self.physoutdev)?;
                be32(out, NFULA_IFINDEX_OUTDEV, self.outdev)?;
            } else {
                be32(out, NFULA_IFINDEX_INDEV, self.indev)?;
                be32(out, NFULA_IFINDEX_PHYSINDEV, self.physindev)?;
                be32(out, NFULA_IFINDEX_OUTDEV, self.outdev)?;
                be32(out, NFULA_IFINDEX_PHYSOUTDEV, self.physoutdev)?;
            }
            be32(out, NFULA_MARK, self.mark)?;
            if let Some(hw) = self.hwaddr {
                if hw.len() > 8 {
                    return Err(EmitError::AttrTooLong {
                        ty: NFULA_HWADDR,
                        len: hw.len(),
                        max: 8,
                    });
                }
                let mut b = [0u8; 12];
                b[0..2].copy_from_slice(&(hw.len() as u16).to_be_bytes());
                b[4..4 + hw.len()].copy_from_slice(hw);
                emit_attr(out, NFULA_HWADDR, &b)?;
            }
            be16(out, NFULA_HWTYPE, self.hwtype)?;
            be16(out, NFULA_HWLEN, self.hwlen)?;
            if let Some(h) = self.hwheader {
                emit_attr(out, NFULA_HWHEADER, h)?;
            }
            if let Some((s, u)) = self.timestamp {
                let mut b = [0u8; 16];
                b[0..8].copy_from_slice(&s.to_be_bytes());
                b[8..16].copy_from_slice(&u.to_be_bytes());
                emit_attr(out, NFULA_TIMESTAMP, &b)?;
            }
            be32(out, NFULA_UID, self.uid)?;
            be32(out, NFULA_GID, self.gid)?;
            be32(out, NFULA_SEQ, self.seq)?;
            be32(out, NFULA_SEQ_GLOBAL, self.seq_global)?;
            if let Some(ct) = self.ct {
                emit_attr(out, NFULA_CT | NLA_F_NESTED, ct)?;
            }
            be32(out, NFULA_CT_INFO, self.ct_info)?;
            if let Some((proto, tci)) = self.vlan {
                let mut v = Vec::with_capacity(16);
                emit_attr(&mut v, NFULA_VLAN_TCI, &tci.to_be_bytes())?;
                emit_attr(&mut v, NFULA_VLAN_PROTO, &proto.to_be_bytes())?;
                emit_attr(out, NFULA_VLAN | NLA_F_NESTED, &v)?;
            }
            if let Some(l2) = self.l2hdr {
                emit_attr(out, NFULA_L2HDR, l2)?;
            }
            if let Some(p) = self.payload {
                emit_attr(out, NFULA_PAYLOAD, p)?;
            }
            Ok(())
        })
    }
}

/// An `NFULNL_MSG_CONFIG` message (for a group, or a family with the `PF_*` commands).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LogConfigMsg {
    /// Group (`res_id`).
    pub(crate) group: u16,
    /// `nfgen_family` (the family of `PF_BIND`/`PF_UNBIND`; `AF_UNSPEC` otherwise).
    pub(crate) family: u8,
    /// `NFULNL_CFG_CMD_*`.
    pub(crate) cmd: Option<u8>,
    /// Copy mode and range.
    pub(crate) mode: Option<(u8, u32)>,
    /// `NFULA_CFG_NLBUFSIZ`.
    pub(crate) nlbufsiz: Option<u32>,
    /// `NFULA_CFG_TIMEOUT` (1/100 s).
    pub(crate) timeout: Option<u32>,
    /// `NFULA_CFG_QTHRESH`.
    pub(crate) qthresh: Option<u32>,
    /// `NFULA_CFG_FLAGS`.
    pub(crate) flags: Option<u16>,
}

impl LogConfigMsg {
    /// Appends the message (with `NLM_F_ACK`).
    pub(crate) fn emit(&self, out: &mut Vec<u8>, seq: u32) -> Result<(), EmitError> {
        emit_whole(out, |out| {
            emit_header(
                out,
                ulog_type(NFULNL_MSG_CONFIG),
                NLM_F_REQUEST | NLM_F_ACK,
                seq,
                0,
            );
            NfGen {
                family: self.family,
                version: NFNETLINK_V0,
                res_id: self.group,
            }
            .emit(out);
            if let Some(c) = self.cmd {
                emit_attr(out, NFULA_CFG_CMD, &[c])?;
            }
            if let Some((mode, range)) = self.mode {
                let mut b = [0u8; 6];
                b[0..4].copy_from_slice(&range.to_be_bytes());
                b[4] = mode;
                emit_attr(out, NFULA_CFG_MODE, &b)?;
            }
            for (ty, v) in [
                (NFULA_CFG_NLBUFSIZ, self.nlbufsiz),
                (NFULA_CFG_TIMEOUT, self.timeout),
                (NFULA_CFG_QTHRESH, self.qthresh),
            ] {
                if let Some(v) = v {
                    emit_attr(out, ty, &v.to_be_bytes())?;
                }
            }
            if let Some(f) = self.flags {
                emit_attr(out, NFULA_CFG_FLAGS, &f.to_be_bytes())?;
            }
            Ok(())
        })
    }
}

/// Errors of an [`NfLog`].
#[derive(Debug, thiserror::Error)]
pub enum NfLogError {
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
    #[error("{target}: kernel refused {what}: {source}{hint}")]
    Config {
        /// `group N` or `family N`.
        target: String,
        /// What was asked.
        what: &'static str,
        /// The errno.
        #[source]
        source: io::Error,
        /// What to do about it.
        hint: String,
        /// For a refused bind: the cause, found by checking (the kernel's `EPERM` means
        /// either another socket holds the group, or a missing capability).
        refusal: Option<BindRefusal>,
    },
    /// The configuration asks for something the kernel cannot do.
    #[error("invalid NFLOG configuration: {0}")]
    Invalid(String),
    /// The frame ring failed.
    #[error(transparent)]
    Frames(#[from] FrameError),
    /// A malformed answer to a config request.
    #[error("malformed answer from the kernel: {0}")]
    Parse(#[from] ParseError),
}

/// Configuration of an [`NfLog`]. The kernel defaults (no value set) are: the whole packet up
/// to 65 531 bytes, a ~3.7 KiB batch buffer, a 1 s flush timeout and 100 messages per batch.
#[derive(Debug, Clone)]
pub struct NfLogConfig {
    /// Groups to bind (`--nflog-group N` of the rules), one kernel instance each.
    pub groups: Vec<u16>,
    /// Address families (2 IPv4, 10 IPv6, 7 bridge, …) for which nfnetlink_log becomes the
    /// namespace's logger (`NFULNL_CFG_CMD_PF_BIND`): packets logged without an explicit
    /// group (e.g. conntrack's `nf_conntrack_log_invalid`) then go to group 0. A namespace-wide
    /// setting shared with other programs; zcio does not undo it on close. Empty by default
    /// (`NFLOG` rules need none of it).
    pub bind_families: Vec<u8>,
    /// Copy mode: metadata only, or the packet up to a range (at most 65 531 bytes).
    pub copy: CopyMode,
    /// Kernel buffer per batch (`NFULA_CFG_NLBUFSIZ`, 3 776 to 131 072 bytes; the kernel
    /// silently ignores other values, so zcio refuses them).
    pub nlbufsiz: Option<u32>,
    /// Flush timeout of a partial batch, in 1/100 s (`NFULA_CFG_TIMEOUT`).
    pub timeout: Option<u32>,
    /// Messages per batch (`NFULA_CFG_QTHRESH`; a rule's `--nflog-threshold` lowers it).
    pub qthresh: Option<u32>,
    /// `NFULNL_CFG_F_SEQ`: number messages per group, so gaps count lost messages.
    pub seq: bool,
    /// `NFULNL_CFG_F_SEQ_GLOBAL`: number messages across groups.
    pub seq_global: bool,
    /// `NFULNL_CFG_F_CONNTRACK`: attach the conntrack entry (needs nf_conntrack_netlink).
    pub conntrack: bool,
    /// Receive buffer; with `.1`, `SO_RCVBUFFORCE` (a refusal is a recorded fallback).
    pub rcvbuf: Option<(usize, bool)>,
    /// `NETLINK_NO_ENOBUFS`: overruns are not reported on the socket (the kernel still drops;
    /// the sequence gaps and the socket's drop counter still count them).
    pub no_enobufs: bool,
    /// Frames in the ring; each holds the largest datagram these settings let the kernel send.
    pub frames: u32,
    /// Fill frames with an io_uring multishot receive (falls back to `recvmmsg`, recorded,
    /// when io_uring is unavailable).
    pub uring: bool,
    /// Most packets one [`NfLog::process`] call handles.
    pub budget: usize,
    /// io_uring mode: datagrams (kernel batches) to gather per wait, holding the first back
    /// at most [`NfLogConfig::min_wait`]; 1 returns on the first (Linux 6.12; older kernels
    /// return on the first, recorded as a fallback).
    pub batch: usize,
    /// How long a wait may hold its first datagram back to gather [`NfLogConfig::batch`]:
    /// fewer wake-ups under load, at most this much added latency.
    pub min_wait: Duration,
}

impl Default for NfLogConfig {
    fn default() -> Self {
        Self {
            groups: vec![0],
            bind_families: Vec::new(),
            copy: CopyMode::Packet(NFULNL_COPY_RANGE_MAX),
            nlbufsiz: Some(DEFAULT_NLBUFSIZ),
            timeout: Some(1),
            qthresh: Some(256),
            seq: true,
            seq_global: false,
            conntrack: false,
            rcvbuf: Some((8 << 20, true)),
            no_enobufs: false,
            frames: 128,
            uring: true,
            budget: 1024,
            batch: 16,
            min_wait: Duration::from_millis(1),
        }
    }
}

/// The default batch buffer: the largest size whose skb still fits a 64 KiB allocation (the
/// kernel appends messages until the allocation's tail room runs out, so a buffer of exactly
/// 64 KiB would become a 128 KiB one).
pub const DEFAULT_NLBUFSIZ: u32 = 65_536 - SKB_SHINFO;

/// `SKB_DATA_ALIGN(sizeof(struct skb_shared_info))` on x86_64 (320 bytes).
const SKB_SHINFO: u32 = 320;

/// `NLMSG_GOODSIZE` with 4 KiB pages: the kernel's default and smallest batch buffer.
pub const MIN_NLBUFSIZ: u32 = 4096 - SKB_SHINFO;

/// The largest datagram nfnetlink_log can send with batch buffer `nlbufsiz` and messages of
/// at most `msg` bytes: it allocates `max(nlbufsiz, msg)` and appends messages while they fit
/// the allocation's tail room, which the allocator rounds up (a kmalloc size class up to
/// 8 KiB, a power-of-two number of pages beyond).
pub(crate) fn max_datagram(nlbufsiz: u32, msg: usize) -> usize {
    let n = (nlbufsiz as usize).max(msg);
    let obj = n.div_ceil(64) * 64 + SKB_SHINFO as usize;
    let alloc = if obj <= 8192 {
        // kmalloc size classes: 96 and 192 beside the powers of two.
        [96usize, 128, 192, 256, 512, 1024, 2048, 4096, 8192]
            .into_iter()
            .find(|&c| c >= obj)
            .unwrap_or(8192)
    } else {
        obj.div_ceil(4096).next_power_of_two() * 4096
    };
    alloc - SKB_SHINFO as usize
}

/// The kernel's messages per batch when none is set (`NFULNL_QTHRESH_DEFAULT`).
const KERNEL_QTHRESH: u32 = 100;

/// What NFLOG's counters say of the loss: `lost` messages in `gaps` sequence gaps (exact),
/// `drops` batches dropped at the socket since open (`None`: the kernel cannot say), of which
/// `drops_at_gap` had been counted right after the last gap showed, and at most `per_batch`
/// messages in a batch. Returns the batches dropped after the last message that arrived (a
/// lower bound) and the [`Loss`].
///
/// Every batch whose loss a gap shows was dropped before that gap closed, so at most
/// `min(lost, drops_at_gap)` of the drops lie in gaps (each holds at least one of the `lost`
/// messages); the others lie after the last message that arrived and add at least one
/// message each. The count is exact when the gaps can account for every drop: each gap holds
/// at least one dropped batch, so at most `drops - gaps` fall elsewhere.
pub(crate) fn nflog_loss(
    lost: u64,
    gaps: u64,
    drops: Option<u64>,
    drops_at_gap: u64,
    per_batch: u64,
) -> (u64, Loss) {
    let Some(drops) = drops else {
        return (
            0,
            Loss {
                at_least: lost,
                at_most: None,
                exact: false,
            },
        );
    };
    let tail = drops.saturating_sub(lost.min(drops_at_gap));
    let elsewhere = drops.saturating_sub(gaps);
    (
        tail,
        Loss {
            at_least: lost + tail,
            at_most: Some(lost + elsewhere.saturating_mul(per_batch)),
            exact: elsewhere == 0,
        },
    )
}

/// Counters of one group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct GroupStats {
    /// The group.
    pub group: u16,
    /// Packets received.
    pub packets: u64,
    /// Gaps in its sequence numbers.
    pub seq_gaps: u64,
    /// Messages missing in those gaps (lost in the kernel or at the socket).
    pub lost: u64,
    /// The next sequence number expected.
    #[serde(skip)]
    next_seq: u32,
}

/// Counters of an [`NfLog`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct NfLogStats {
    /// Packets received, every group.
    pub packets: u64,
    /// Gaps in the per-group sequence numbers (with [`NfLogConfig::seq`]).
    pub seq_gaps: u64,
    /// Messages missing in those gaps: exact, for every loss the kernel numbered. A loss after
    /// the last message that arrived shows as no gap: see [`NfLogStats::tail_batches`].
    pub lost: u64,
    /// Batches the socket dropped after the last message that arrived (so in no gap): a
    /// lower bound (drops are attributed to the gaps wherever they could belong there). Each
    /// held at least one message and at most `qthresh`; how many is unknown.
    pub tail_batches: u64,
    /// Everything known of the loss: at least `lost + tail_batches`; exact when every batch
    /// the socket dropped is accounted for by a gap.
    pub loss: Loss,
    /// Per group.
    pub groups: Vec<GroupStats>,
    /// Receive side: datagrams, syscalls, overruns, the socket's drops, parse errors.
    #[serde(flatten)]
    pub stream: StreamStats,
}

impl NfLogStats {
    /// Whether any loss was seen: a sequence gap, an overrun or a drop at the socket.
    pub fn any_loss(&self) -> bool {
        self.lost > 0 || self.stream.overruns > 0 || self.stream.kernel_drops > 0
    }

    /// The loss in one sentence: what is exact, what is a bound, and what the counters
    /// behind it are ("no loss ..." when none was seen).
    pub fn loss_summary(&self) -> String {
        if !self.any_loss() {
            return "no loss: every sequence number arrived, no overrun, no drop at the socket"
                .into();
        }
        let drops = self.stream.kernel_drops;
        let mut s = if self.loss.exact {
            format!(
                "LOSS: lost {} message(s), exactly ({} in {} sequence gap(s); every batch \
                 dropped at the socket fell in a gap)",
                self.loss.at_least, self.lost, self.seq_gaps
            )
        } else {
            let mut s = format!(
                "LOSS: lost >= {}: {} message(s) missing in {} sequence gap(s) (exact)",
                self.loss.at_least, self.lost, self.seq_gaps
            );
            if self.tail_batches > 0 {
                s.push_str(&format!(
                    ", and {} batch(es) dropped at the socket after the last message that \
                     arrived (at least one message each; their sequence numbers never came)",
                    self.tail_batches
                ));
            }
            if let Some(most) = self.loss.at_most {
                s.push_str(&format!("; at most {most}"));
            }
            s
        };
        s.push_str(&format!(
            "; {} overrun(s) (ENOBUFS), {drops} batch(es) dropped at the socket in all",
            self.stream.overruns
        ));
        s
    }
}

/// The NFLOG family for [`Stream`].
#[derive(Debug)]
pub(crate) struct NflogFamily;

/// Per-group sequence accounting.
#[derive(Debug, Default)]
pub(crate) struct NflogTally {
    groups: Vec<GroupStats>,
}

impl NflogTally {
    fn group(&mut self, g: u16) -> &mut GroupStats {
        match self.groups.iter().position(|s| s.group == g) {
            Some(i) => &mut self.groups[i],
            None => {
                self.groups.push(GroupStats {
                    group: g,
                    ..GroupStats::default()
                });
                self.groups.last_mut().expect("just pushed")
            }
        }
    }
}

impl Family for NflogFamily {
    type Item<'a> = LogPacket<'a>;
    type Tally = NflogTally;

    fn parse<'a>(m: &NlMsg<'a>) -> Result<Option<LogPacket<'a>>, ParseError> {
        if m.ty == NLMSG_DONE || m.ty < 16 {
            // A batch ends with NLMSG_DONE.
            return Ok(None);
        }
        LogPacket::parse(m).map(Some)
    }

    fn gaps(t: &NflogTally) -> u64 {
        t.groups.iter().map(|g| g.seq_gaps).sum()
    }

    fn tally(t: &mut NflogTally, p: &LogPacket<'_>) {
        let g = t.group(p.group);
        g.packets += 1;
        if let Some(s) = p.seq {
            // The kernel numbers an instance's messages from 0 when it is created (by our
            // BIND), consecutively: a jump forward is messages lost; anything else (a number
            // seen before) cannot happen on one socket and is not counted as loss.
            let gap = s.wrapping_sub(g.next_seq);
            if gap != 0 && gap < 1 << 31 {
                g.seq_gaps += 1;
                g.lost += u64::from(gap);
            }
            g.next_seq = s.wrapping_add(1);
        }
    }
}

/// An NFLOG consumer bound to one or more groups. See the module docs.
#[derive(Debug)]
pub struct NfLog {
    stream: Stream<NflogFamily>,
    cfg: NfLogConfig,
    fallbacks: Vec<Fallback>,
    frame_size: usize,
    bound: bool,
}

fn sock_err(e: super::core::OpenError) -> NfLogError {
    NfLogError::Socket {
        what: e.what.to_string(),
        source: e.source,
    }
}

impl NfLog {
    /// Opens a socket, binds every group of `cfg` and configures them.
    pub fn open(cfg: NfLogConfig) -> Result<Self, NfLogError> {
        if cfg.groups.is_empty() {
            return Err(NfLogError::Invalid("no group to bind".into()));
        }
        let mut groups = cfg.groups.clone();
        groups.sort_unstable();
        if groups.windows(2).any(|w| w[0] == w[1]) {
            return Err(NfLogError::Invalid(format!(
                "group listed twice: {:?}",
                cfg.groups
            )));
        }
        let nlbufsiz = cfg.nlbufsiz.unwrap_or(MIN_NLBUFSIZ);
        if !(MIN_NLBUFSIZ..=NFULNL_NLBUFSIZ_MAX).contains(&nlbufsiz) {
            return Err(NfLogError::Invalid(format!(
                "nlbufsiz {nlbufsiz} is outside {MIN_NLBUFSIZ}..={NFULNL_NLBUFSIZ_MAX} (the kernel \
                 would ignore it without an error)"
            )));
        }
        let range = match cfg.copy {
            CopyMode::Meta => 0,
            CopyMode::Packet(r) => {
                if r == 0 || r > NFULNL_COPY_RANGE_MAX {
                    return Err(NfLogError::Invalid(format!(
                        "copy range {r} is outside 1..={NFULNL_COPY_RANGE_MAX}"
                    )));
                }
                r as usize
            }
        };
        let datagram = max_datagram(nlbufsiz, range + super::core::MSG_OVERHEAD);
        let frame_size = datagram + crate::buf::frames::FRAME_HDR_LEN;
        let mut fallbacks = Vec::new();
        let spec = SockSpec {
            protocol: NETLINK_NETFILTER,
            groups: &[],
            rcvbuf: cfg.rcvbuf,
            no_enobufs: cfg.no_enobufs,
            ext_ack: true,
            frame_size,
            frames: cfg.frames,
            spill: 64 << 10,
            uring: cfg.uring.then_some(UringNeed {
                datagram,
                what: "the largest NFLOG batch",
            }),
            batch_wait: Some((cfg.batch, cfg.min_wait)),
        };
        let sock = NlSocket::open(&spec, &mut fallbacks).map_err(sock_err)?;
        let mut me = Self {
            stream: Stream::new(sock, cfg.budget),
            frame_size,
            fallbacks,
            bound: false,
            cfg,
        };
        for &f in &me.cfg.bind_families.clone() {
            me.request(
                LogConfigMsg {
                    family: f,
                    cmd: Some(NFULNL_CFG_CMD_PF_BIND),
                    ..Default::default()
                },
                format!("family {f}"),
                "PF_BIND",
                "; ENOENT: nfnetlink_log does not log this family",
            )?;
        }
        let mut flags = 0;
        if me.cfg.seq {
            flags |= NFULNL_CFG_F_SEQ;
        }
        if me.cfg.seq_global {
            flags |= NFULNL_CFG_F_SEQ_GLOBAL;
        }
        if me.cfg.conntrack {
            flags |= NFULNL_CFG_F_CONNTRACK;
        }
        let mode = match me.cfg.copy {
            CopyMode::Meta => (NFULNL_COPY_META, 0),
            CopyMode::Packet(r) => (NFULNL_COPY_PACKET, r),
        };
        // One message per group: BIND and the settings. nfulnl_recv_config checks the flags
        // first (EAGAIN / EOPNOTSUPP for CONNTRACK), then creates the instance and applies the
        // settings in the same call, so a failure leaves nothing bound, and packets logged
        // after the bind see the settings — not the kernel's defaults (the whole packet, a
        // 1 s timeout), as they could between two requests.
        for &g in &me.cfg.groups.clone() {
            me.request(
                LogConfigMsg {
                    group: g,
                    cmd: Some(NFULNL_CFG_CMD_BIND),
                    mode: Some(mode),
                    nlbufsiz: me.cfg.nlbufsiz,
                    timeout: me.cfg.timeout,
                    qthresh: me.cfg.qthresh,
                    flags: Some(flags),
                    ..Default::default()
                },
                format!("group {g}"),
                "BIND with MODE/NLBUFSIZ/TIMEOUT/QTHRESH/FLAGS",
                "; EOPNOTSUPP: the CONNTRACK flag needs nf_conntrack_netlink",
            )?;
            me.bound = true;
        }
        Ok(me)
    }

    /// Sends one config request and waits for its ACK. `EAGAIN` (the kernel loaded
    /// nf_conntrack_netlink for the CONNTRACK flag and asks for the request again) is retried.
    fn request(
        &mut self,
        c: LogConfigMsg,
        target: String,
        what: &'static str,
        hint: &'static str,
    ) -> Result<(), NfLogError> {
        for _ in 0..4 {
            let seq = self.stream.sock.next_seq();
            let mut out = Vec::with_capacity(64);
            c.emit(&mut out, seq)
                .map_err(|e| NfLogError::Invalid(e.to_string()))?;
            let code = match self.stream.sock.request(&out, seq) {
                Ok(code) => code,
                Err(RequestError::Send(e)) => {
                    return Err(NfLogError::Socket {
                        what: format!("sending {what} for {target}"),
                        source: e,
                    })
                }
                Err(RequestError::Recv(e)) => {
                    return Err(NfLogError::Socket {
                        what: format!("receiving the answer to {what} for {target}"),
                        source: e,
                    })
                }
                Err(RequestError::Parse(e)) => return Err(NfLogError::Parse(e)),
                Err(RequestError::Full(n)) => return Err(FrameError::AllHeld(n).into()),
            };
            match code {
                0 => return Ok(()),
                c if c == -libc::EAGAIN => continue,
                _ => {
                    // EPERM is both "another socket holds the group" and "no CAP_NET_ADMIN":
                    // told apart by checking (`refusal`).
                    let refusal = (c.cmd == Some(NFULNL_CFG_CMD_BIND))
                        .then(|| {
                            let ours = nl::port_id(&self.stream.sock.fd).ok();
                            BindRefusal::check(Table::Log, c.group, -code, ours)
                        })
                        .flatten();
                    return Err(NfLogError::Config {
                        target,
                        what,
                        source: io::Error::from_raw_os_error(-code),
                        hint: refusal
                            .as_ref()
                            .map_or_else(|| hint.to_string(), |r| r.hint(Table::Log, c.group)),
                        refusal,
                    });
                }
            }
        }
        Err(NfLogError::Config {
            target,
            what,
            source: io::Error::from_raw_os_error(libc::EAGAIN),
            hint: "; the kernel kept asking for the request again".into(),
            refusal: None,
        })
    }

    /// The groups bound.
    pub fn groups(&self) -> &[u16] {
        &self.cfg.groups
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &NfLogConfig {
        &self.cfg
    }

    /// Bytes per frame (header included): the largest datagram these settings let the kernel
    /// send, so nothing is ever cut.
    pub fn frame_size(&self) -> usize {
        self.frame_size
    }

    /// Receives what is ready (waiting up to `timeout` when nothing is; `None`: until
    /// something arrives), hands every logged packet to `f` in arrival order, and gives the
    /// frames back. Returns the packets handled (at most about [`NfLogConfig::budget`]).
    pub fn process<F>(&mut self, timeout: Option<Duration>, mut f: F) -> Result<usize, NfLogError>
    where
        F: FnMut(&LogPacket<'_>),
    {
        let wait = timeout.unwrap_or(Duration::MAX);
        Ok(self.stream.process(wait, &mut f)?)
    }

    /// As [`NfLog::process`], one receive batch at a time: `f` gets an iterator over the
    /// packets of every datagram one receive brought in (up to 64 kernel batches), and all of
    /// them stay valid until `f` returns — a writer can gather their payloads, still in their
    /// frames, into one `writev`, with no copy in user space. Packets `f` leaves untaken are
    /// counted (and sequence-checked) all the same. Returns the packets handled.
    pub fn process_batch<F>(
        &mut self,
        timeout: Option<Duration>,
        mut f: F,
    ) -> Result<usize, NfLogError>
    where
        F: for<'d> FnMut(&mut dyn Iterator<Item = LogPacket<'d>>),
    {
        let wait = timeout.unwrap_or(Duration::MAX);
        Ok(self.stream.process_batches(wait, &mut f)?)
    }

    /// Counters. Reads the socket's drop counter (one `getsockopt`).
    pub fn stats(&self) -> NfLogStats {
        let stream = self.stream.stats();
        let mut groups = self.stream.tally().groups.clone();
        groups.sort_by_key(|g| g.group);
        let seq_gaps = groups.iter().map(|g| g.seq_gaps).sum();
        let lost = groups.iter().map(|g| g.lost).sum();
        let drops = self.stream.sock.kernel_drops();
        // The most per batch: the kernel sends a batch when it holds qthresh messages.
        let per_batch = u64::from(self.cfg.qthresh.unwrap_or(KERNEL_QTHRESH).max(1));
        let (tail_batches, loss) = nflog_loss(
            lost,
            seq_gaps,
            drops,
            self.stream.drops_at_last_gap(),
            per_batch,
        );
        NfLogStats {
            packets: groups.iter().map(|g| g.packets).sum(),
            seq_gaps,
            lost,
            tail_batches,
            loss,
            groups,
            stream,
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
    /// [`NfLog::on_ready`] would find packets. See `docs/design/async.md`.
    pub fn readiness_fd(&mut self) -> Result<std::os::fd::BorrowedFd<'_>, NfLogError> {
        self.stream.readiness_fd().map_err(sock_err)
    }

    /// The readiness descriptor is watched edge-triggered (tokio's `AsyncFd`): `on_ready`
    /// does not read the frame ring's eventfd back to zero (see `NlSocket::set_edge_readiness`).
    #[cfg(feature = "tokio")]
    pub(crate) fn set_edge_readiness(&mut self, edge: bool) {
        self.stream.sock.set_edge_readiness(edge);
    }

    /// Handles what is ready without waiting (after the readiness descriptor fired, or at any
    /// time). Returns the packets handled.
    pub fn on_ready<F>(&mut self, f: &mut F) -> Result<usize, NfLogError>
    where
        F: FnMut(&LogPacket<'_>),
    {
        self.readiness_fd()?;
        Ok(self.stream.on_ready(f)?)
    }

    /// Unbinds every group after handing over what is still queued (within `drain`), and
    /// returns the final counters. Packets logged after the unbind are not delivered.
    pub fn close<F>(mut self, drain: Duration, mut f: F) -> Result<NfLogStats, NfLogError>
    where
        F: FnMut(&LogPacket<'_>),
    {
        let end = std::time::Instant::now() + drain;
        // The kernel sends a partial batch when the group is unbound: unbind first, then read
        // until nothing more comes or the deadline passes.
        self.unbind_all();
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            let n = self.process(Some(left.min(Duration::from_millis(5))), &mut f)?;
            if n == 0 || left.is_zero() {
                break;
            }
        }
        Ok(self.stats())
    }

    fn unbind_all(&mut self) {
        if !self.bound {
            return;
        }
        self.bound = false;
        for g in self.cfg.groups.clone() {
            let _ = self.request(
                LogConfigMsg {
                    group: g,
                    cmd: Some(NFULNL_CFG_CMD_UNBIND),
                    ..Default::default()
                },
                format!("group {g}"),
                "UNBIND",
                "",
            );
        }
    }
}

impl Drop for NfLog {
    /// Unbinds the groups (closing the socket would too; this makes it explicit and prompt).
    fn drop(&mut self) {
        self.unbind_all();
    }
}

impl Report for NfLog {
    type Path = NetlinkPath;
    fn path(&self) -> NetlinkPath {
        NfLog::path(self)
    }
    /// `ops` = packets, `bytes` = datagram bytes received, `syscalls` = receive syscalls.
    fn counters(&self) -> Counters {
        let s = self.stats();
        Counters {
            ops: s.packets,
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
    fn max_datagram_follows_the_allocators_rounding() {
        // NLMSG_GOODSIZE fills one page exactly.
        assert_eq!(max_datagram(MIN_NLBUFSIZ, 100), 3776);
        // The default buffer fits 64 KiB; one byte more and it is a 128 KiB allocation.
        assert_eq!(max_datagram(DEFAULT_NLBUFSIZ, 600), 65_216);
        assert_eq!(max_datagram(DEFAULT_NLBUFSIZ + 1, 600), 131_072 - 320);
        // A whole 64 KiB packet alone needs 128 KiB.
        assert_eq!(max_datagram(DEFAULT_NLBUFSIZ, 65_531 + 512), 131_072 - 320);
        // The largest buffer the kernel takes rounds up to 256 KiB.
        assert_eq!(max_datagram(NFULNL_NLBUFSIZ_MAX, 600), 262_144 - 320);
        // Small sizes stay in the kmalloc classes.
        assert_eq!(max_datagram(0, 1000), 2048 - 320);
    }

    fn packet() -> LogPacket<'static> {
        LogPacket {
            group: 7,
            family: 2,
            hw_protocol: 0x0800,
            hook: 1,
            prefix: Some(b"drop-in"),
            mark: Some(9),
            indev: Some(3),
            hwaddr: Some(&[1, 2, 3, 4, 5, 6]),
            hwtype: Some(1),
            hwlen: Some(14),
            hwheader: Some(&[0xaa; 14]),
            timestamp: Some((1_700_000_000, 123_456)),
            uid: Some(0),
            gid: Some(0),
            seq: Some(41),
            payload: Some(&[
                0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8,
            ]),
            ..LogPacket::default()
        }
    }

    #[test]
    fn a_packet_parses_back_from_what_it_emits() {
        let mut out = Vec::new();
        let p = packet();
        p.emit(&mut out, 0, 0).unwrap();
        let back = LogPacket::parse_bytes(&out).unwrap();
        assert_eq!(back, p);
        let mut again = Vec::new();
        back.emit(&mut again, 0, 0).unwrap();
        assert_eq!(again, out);
        // Bridge order and VLAN.
        let b = LogPacket {
            family: 7,
            physindev: Some(4),
            outdev: Some(5),
            physoutdev: Some(6),
            vlan: Some((0x8100, 12)),
            l2hdr: Some(&[0xbb; 18]),
            ..p
        };
        let mut out = Vec::new();
        b.emit(&mut out, 0, 0).unwrap();
        assert_eq!(LogPacket::parse_bytes(&out).unwrap(), b);
    }

    #[test]
    fn drops_after_the_last_message_that_arrived_make_the_loss_a_lower_bound() {
        // A capture stopped for a whole burst: the queue filled, then 4,397 batches were
        // dropped and no later message came; no gap shows, and `lost` alone would say 0.
        let (tail, loss) = nflog_loss(0, 0, Some(4397), 0, 256);
        assert_eq!(tail, 4397);
        assert_eq!(
            loss,
            Loss {
                at_least: 4397,
                at_most: Some(4397 * 256),
                exact: false
            }
        );
        // Drops that lie in gaps: one batch per gap accounts for all of them.
        let (tail, loss) = nflog_loss(700, 3, Some(3), 3, 256);
        assert_eq!((tail, loss.at_least, loss.exact), (0, 700, true));
        assert_eq!(loss.at_most, Some(700));
        // More drops than gaps, all counted before the last gap closed: the tail may be
        // empty (a bound, not exact), and cannot be shown.
        let (tail, loss) = nflog_loss(6970, 3, Some(60), 60, 256);
        assert_eq!((tail, loss.at_least, loss.exact), (0, 6970, false));
        assert_eq!(loss.at_most, Some(6970 + 57 * 256));
        // Drops counted after the last gap closed lie after every message that arrived.
        let (tail, loss) = nflog_loss(6970, 3, Some(70), 60, 256);
        assert_eq!((tail, loss.at_least), (10, 6980));
        // Fewer lost messages than drops counted by the last gap: only `lost` of them can be
        // in gaps (each holds at least one), the rest are past the last arrival.
        let (tail, _) = nflog_loss(5, 1, Some(60), 60, 256);
        assert_eq!(tail, 55);
        // No drop counter (before 4.12): the gaps, and no claim beyond them.
        let (tail, loss) = nflog_loss(12, 2, None, 0, 256);
        assert_eq!(
            (tail, loss.at_least, loss.at_most, loss.exact),
            (0, 12, None, false)
        );
        // Nothing lost.
        assert_eq!(
            nflog_loss(0, 0, Some(0), 0, 256).1,
            Loss {
                at_least: 0,
                at_most: Some(0),
                exact: true
            }
        );
    }

    #[test]
    fn sequence_gaps_count_the_messages_missing() {
        let mut t = NflogTally::default();
        let mut p = packet();
        for s in [0u32, 1, 2, 5, 6, 10] {
            p.seq = Some(s);
            NflogFamily::tally(&mut t, &p);
        }
        let g = t.groups[0];
        assert_eq!((g.packets, g.seq_gaps, g.lost), (6, 2, 5));
        // Another group numbers on its own; wrapping is not a gap.
        p.group = 8;
        for s in [0u32, 1] {
            p.seq = Some(s);
            NflogFamily::tally(&mut t, &p);
        }
        t.groups[1].next_seq = u32::MAX;
        p.seq = Some(u32::MAX);
        NflogFamily::tally(&mut t, &p);
        p.seq = Some(0);
        NflogFamily::tally(&mut t, &p);
        assert_eq!((t.groups[1].seq_gaps, t.groups[1].lost), (0, 0));
        // A number seen again (not possible from one kernel instance) is not loss.
        p.seq = Some(0);
        NflogFamily::tally(&mut t, &p);
        assert_eq!(t.groups[1].lost, 0);
    }

    #[test]
    fn config_messages_carry_the_kernels_layout() {
        let mut out = Vec::new();
        LogConfigMsg {
            group: 5,
            mode: Some((NFULNL_COPY_PACKET, 128)),
            nlbufsiz: Some(65_216),
            timeout: Some(1),
            qthresh: Some(64),
            flags: Some(NFULNL_CFG_F_SEQ),
            ..Default::default()
        }
        .emit(&mut out, 3)
        .unwrap();
        let (m, _) = NlMsg::parse(&out).unwrap();
        assert_eq!(m.ty, ulog_type(NFULNL_MSG_CONFIG));
        assert_eq!(m.flags, NLM_F_REQUEST | NLM_F_ACK);
        let g = NfGen::parse(m.payload).unwrap();
        assert_eq!(g.res_id, 5);
        let a: Vec<_> = attrs(&m.payload[4..]).map(|a| a.unwrap()).collect();
        assert_eq!(a[0].ty, NFULA_CFG_MODE);
        assert_eq!(a[0].value, &[0, 0, 0, 128, 2, 0]);
        assert_eq!(a.last().unwrap().value, &[0, 1]);
        // Header, nfgenmsg, mode (6 bytes, padded), three u32s, the u16 flags (padded).
        assert_eq!(out.len(), 16 + 4 + 12 + 3 * 8 + 8);
    }
}

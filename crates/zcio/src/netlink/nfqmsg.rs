//! nfnetlink_queue messages: CONFIG, PACKET, VERDICT and VERDICT_BATCH, parsed in place and
//! emitted back to back into one send buffer.

use super::msg::{attrs, emit_attr, emit_header, emit_whole, Attr, EmitError, NlMsg, ParseError};
use crate::sys::netlink::{NLA_F_NESTED, NLM_F_ACK, NLM_F_REQUEST};
use crate::sys::nfqueue::*;

/// nfqueue attributes past `NFQA_GID` (`linux/netfilter/nfnetlink_queue.h`).
pub mod extra_attrs {
    /// Security context (4.11).
    pub const NFQA_SECCTX: u16 = 18;
    /// VLAN, nested (4.7).
    pub const NFQA_VLAN: u16 = 19;
    /// Layer-2 header (4.7).
    pub const NFQA_L2HDR: u16 = 20;
    /// skb priority (6.1).
    pub const NFQA_PRIORITY: u16 = 21;
    /// cgroup class id (6.5).
    pub const NFQA_CGROUP_CLASSID: u16 = 22;
}

/// Length of `struct nfgenmsg`.
pub const NFGENMSG_LEN: usize = 4;

/// Message type of an nfqueue message on the wire (`subsys << 8 | msg`).
pub const fn nfq_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_QUEUE << 8) | msg
}

/// `struct nfgenmsg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NfGen {
    /// Address family (`AF_UNSPEC`, `AF_INET`, …).
    pub family: u8,
    /// `NFNETLINK_V0`.
    pub version: u8,
    /// Resource id: the queue number.
    pub res_id: u16,
}

impl NfGen {
    /// Parses the 4-byte header at the start of a message payload.
    pub fn parse(p: &[u8]) -> Result<Self, ParseError> {
        if p.len() < NFGENMSG_LEN {
            return Err(ParseError::Truncated {
                what: "nfgenmsg",
                need: NFGENMSG_LEN,
                have: p.len(),
            });
        }
        Ok(Self {
            family: p[0],
            version: p[1],
            res_id: u16::from_be_bytes([p[2], p[3]]),
        })
    }
    /// Appends the 4-byte header.
    pub(crate) fn emit(&self, out: &mut Vec<u8>) {
        out.push(self.family);
        out.push(self.version);
        out.extend_from_slice(&self.res_id.to_be_bytes());
    }
}

/// A verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Verdict {
    /// Let the packet continue.
    Accept,
    /// Drop it.
    Drop,
    /// Re-inject it at the same hook (re-run the rules).
    Repeat,
    /// Send it to another queue.
    Queue(u16),
}

impl Verdict {
    /// Wire value.
    pub fn to_wire(self) -> u32 {
        match self {
            Verdict::Accept => NF_ACCEPT,
            Verdict::Drop => NF_DROP,
            Verdict::Repeat => NF_REPEAT,
            Verdict::Queue(q) => NF_QUEUE | (u32::from(q) << 16),
        }
    }
    /// From the wire value.
    pub fn from_wire(v: u32) -> Option<Self> {
        match v & 0xff {
            NF_ACCEPT => Some(Verdict::Accept),
            NF_DROP => Some(Verdict::Drop),
            NF_REPEAT => Some(Verdict::Repeat),
            NF_QUEUE => Some(Verdict::Queue((v >> 16) as u16)),
            _ => None,
        }
    }
}

/// A queued packet (`NFQNL_MSG_PACKET`), borrowed from its frame.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Packet<'a> {
    /// Queue number.
    pub queue: u16,
    /// Address family of the hook (`AF_INET` = 2, `AF_INET6` = 10).
    pub family: u8,
    /// Packet id, unique and increasing per queue.
    pub id: u32,
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
    /// `NFQA_HWADDR` address bytes.
    pub hwaddr: Option<&'a [u8]>,
    /// `NFQA_TIMESTAMP` (sec, usec).
    pub timestamp: Option<(u64, u64)>,
    /// `NFQA_PAYLOAD`: the packet from the network header on (up to the copy range).
    pub payload: Option<&'a [u8]>,
    /// `NFQA_CAP_LEN`: the full length when the payload was cut to the copy range.
    pub cap_len: Option<u32>,
    /// `NFQA_SKB_INFO` flags.
    pub skb_info: Option<u32>,
    /// `NFQA_UID`.
    pub uid: Option<u32>,
    /// `NFQA_GID`.
    pub gid: Option<u32>,
    /// `NFQA_CT` nested attributes (raw).
    pub ct: Option<&'a [u8]>,
    /// `NFQA_CT_INFO`.
    pub ct_info: Option<u32>,
    /// Attributes zcio does not interpret.
    pub unknown: u16,
}

impl<'a> Packet<'a> {
    /// Parses a `NFQNL_MSG_PACKET` message.
    pub fn parse(m: &NlMsg<'a>) -> Result<Self, ParseError> {
        if m.ty != nfq_type(NFQNL_MSG_PACKET) {
            return Err(ParseError::Type(m.ty));
        }
        let g = NfGen::parse(m.payload)?;
        let mut p = Packet {
            queue: g.res_id,
            family: g.family,
            ..Default::default()
        };
        let mut have_hdr = false;
        for a in attrs(&m.payload[NFGENMSG_LEN..]) {
            let a = a?;
            match a.ty {
                NFQA_PACKET_HDR => {
                    let b = a.at_least("NFQA_PACKET_HDR", 7)?;
                    p.id = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                    p.hw_protocol = u16::from_be_bytes([b[4], b[5]]);
                    p.hook = b[6];
                    have_hdr = true;
                }
                NFQA_MARK => p.mark = Some(a.be32("NFQA_MARK")?),
                NFQA_IFINDEX_INDEV => p.indev = Some(a.be32("NFQA_IFINDEX_INDEV")?),
                NFQA_IFINDEX_OUTDEV => p.outdev = Some(a.be32("NFQA_IFINDEX_OUTDEV")?),
                NFQA_IFINDEX_PHYSINDEV => p.physindev = Some(a.be32("NFQA_IFINDEX_PHYSINDEV")?),
                NFQA_IFINDEX_PHYSOUTDEV => p.physoutdev = Some(a.be32("NFQA_IFINDEX_PHYSOUTDEV")?),
                NFQA_HWADDR => {
                    let b = a.at_least("NFQA_HWADDR", 12)?;
                    let n = (u16::from_be_bytes([b[0], b[1]]) as usize).min(8);
                    p.hwaddr = Some(&b[4..4 + n]);
                }
                NFQA_TIMESTAMP => {
                    let b = a.exact("NFQA_TIMESTAMP", 16)?;
                    let mut s = [0u8; 8];
                    let mut u = [0u8; 8];
                    s.copy_from_slice(&b[0..8]);
                    u.copy_from_slice(&b[8..16]);
                    p.timestamp = Some((u64::from_be_bytes(s), u64::from_be_bytes(u)));
                }
                NFQA_PAYLOAD => p.payload = Some(a.value),
                NFQA_CAP_LEN => p.cap_len = Some(a.be32("NFQA_CAP_LEN")?),
                NFQA_SKB_INFO => p.skb_info = Some(a.be32("NFQA_SKB_INFO")?),
                NFQA_UID => p.uid = Some(a.be32("NFQA_UID")?),
                NFQA_GID => p.gid = Some(a.be32("NFQA_GID")?),
                NFQA_CT => p.ct = Some(a.value),
                NFQA_CT_INFO => p.ct_info = Some(a.be32("NFQA_CT_INFO")?),
                _ => p.unknown = p.unknown.saturating_add(1),
            }
        }
        if !have_hdr {
            return Err(ParseError::Missing("NFQA_PACKET_HDR"));
        }
        Ok(p)
    }

    /// Emits this packet as the kernel would (attribute order of `nfqnl_build_packet_message`
    /// for the attributes modelled here; uninterpreted attributes are not re-emitted).
    pub fn emit(&self, out: &mut Vec<u8>, seq: u32, pid: u32) -> Result<(), EmitError> {
        emit_whole(out, |out| self.emit_body(out, seq, pid))
    }

    fn emit_body(&self, out: &mut Vec<u8>, seq: u32, pid: u32) -> Result<(), EmitError> {
        emit_header(out, nfq_type(NFQNL_MSG_PACKET), 0, seq, pid);
        NfGen {
            family: self.family,
            version: NFNETLINK_V0,
            res_id: self.queue,
        }
        .emit(out);
        let mut hdr = [0u8; 7];
        hdr[0..4].copy_from_slice(&self.id.to_be_bytes());
        hdr[4..6].copy_from_slice(&self.hw_protocol.to_be_bytes());
        hdr[6] = self.hook;
        emit_attr(out, NFQA_PACKET_HDR, &hdr)?;
        let be = |out: &mut Vec<u8>, ty: u16, v: Option<u32>| -> Result<(), EmitError> {
            if let Some(v) = v {
                emit_attr(out, ty, &v.to_be_bytes())?;
            }
            Ok(())
        };
        be(out, NFQA_IFINDEX_INDEV, self.indev)?;
        be(out, NFQA_IFINDEX_PHYSINDEV, self.physindev)?;
        be(out, NFQA_IFINDEX_OUTDEV, self.outdev)?;
        be(out, NFQA_IFINDEX_PHYSOUTDEV, self.physoutdev)?;
        be(out, NFQA_MARK, self.mark)?;
        if let Some(hw) = self.hwaddr {
            if hw.len() > 8 {
                return Err(EmitError::AttrTooLong {
                    ty: NFQA_HWADDR,
                    len: hw.len(),
                    max: 8,
                });
            }
            let mut b = [0u8; 12];
            b[0..2].copy_from_slice(&(hw.len() as u16).to_be_bytes());
            b[4..4 + hw.len()].copy_from_slice(hw);
            emit_attr(out, NFQA_HWADDR, &b)?;
        }
        if let Some((s, u)) = self.timestamp {
            let mut b = [0u8; 16];
            b[0..8].copy_from_slice(&s.to_be_bytes());
            b[8..16].copy_from_slice(&u.to_be_bytes());
            emit_attr(out, NFQA_TIMESTAMP, &b)?;
        }
        be(out, NFQA_UID, self.uid)?;
        be(out, NFQA_GID, self.gid)?;
        if let Some(ct) = self.ct {
            emit_attr(out, NFQA_CT | NLA_F_NESTED, ct)?;
        }
        be(out, NFQA_CT_INFO, self.ct_info)?;
        be(out, NFQA_CAP_LEN, self.cap_len)?;
        be(out, NFQA_SKB_INFO, self.skb_info)?;
        if let Some(p) = self.payload {
            emit_attr(out, NFQA_PAYLOAD, p)?;
        }
        Ok(())
    }
}

/// The id of a `NFQNL_MSG_PACKET` that does not parse as a whole (a bad attribute further
/// on): read from its `NFQA_PACKET_HDR` when the attributes up to it are well formed.
pub fn packet_id(m: &NlMsg<'_>) -> Option<u32> {
    if m.ty != nfq_type(NFQNL_MSG_PACKET) {
        return None;
    }
    for a in attrs(m.payload.get(NFGENMSG_LEN..)?) {
        let a = a.ok()?;
        if a.ty == NFQA_PACKET_HDR {
            let b = a.value.get(..4)?;
            return Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        }
    }
    None
}

/// A verdict message (`NFQNL_MSG_VERDICT` or `NFQNL_MSG_VERDICT_BATCH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerdictMsg<'a> {
    /// Queue number.
    pub queue: u16,
    /// Batch: decides every pending id ≤ `id`.
    pub batch: bool,
    /// The verdict.
    pub verdict: Verdict,
    /// Packet id (the highest one for a batch).
    pub id: u32,
    /// New mark.
    pub mark: Option<u32>,
    /// Replacement payload (single verdicts only).
    pub payload: Option<&'a [u8]>,
}

impl<'a> VerdictMsg<'a> {
    /// A verdict for the one packet `id` (not a batch).
    pub fn single(
        queue: u16,
        verdict: Verdict,
        id: u32,
        mark: Option<u32>,
        payload: Option<&'a [u8]>,
    ) -> Self {
        Self {
            queue,
            batch: false,
            verdict,
            id,
            mark,
            payload,
        }
    }

    /// Appends the message to `out`.
    pub fn emit(&self, out: &mut Vec<u8>, seq: u32) -> Result<(), EmitError> {
        emit_whole(out, |out| {
            let ty = if self.batch {
                NFQNL_MSG_VERDICT_BATCH
            } else {
                NFQNL_MSG_VERDICT
            };
            emit_header(out, nfq_type(ty), NLM_F_REQUEST, seq, 0);
            NfGen {
                family: libc::AF_UNSPEC as u8,
                version: NFNETLINK_V0,
                res_id: self.queue,
            }
            .emit(out);
            let mut hdr = [0u8; 8];
            hdr[0..4].copy_from_slice(&self.verdict.to_wire().to_be_bytes());
            hdr[4..8].copy_from_slice(&self.id.to_be_bytes());
            emit_attr(out, NFQA_VERDICT_HDR, &hdr)?;
            if let Some(m) = self.mark {
                emit_attr(out, NFQA_MARK, &m.to_be_bytes())?;
            }
            if let Some(p) = self.payload {
                emit_attr(out, NFQA_PAYLOAD, p)?;
            }
            Ok(())
        })
    }

    /// Parses a verdict message.
    pub fn parse(m: &NlMsg<'a>) -> Result<Self, ParseError> {
        let batch = if m.ty == nfq_type(NFQNL_MSG_VERDICT_BATCH) {
            true
        } else if m.ty == nfq_type(NFQNL_MSG_VERDICT) {
            false
        } else {
            return Err(ParseError::Type(m.ty));
        };
        let g = NfGen::parse(m.payload)?;
        let mut v = None;
        let mut mark = None;
        let mut payload = None;
        for a in attrs(&m.payload[NFGENMSG_LEN..]) {
            let a: Attr<'a> = a?;
            match a.ty {
                NFQA_VERDICT_HDR => {
                    let b = a.exact("NFQA_VERDICT_HDR", 8)?;
                    let verdict = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                    let id = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
                    v = Some((verdict, id));
                }
                NFQA_MARK => mark = Some(a.be32("NFQA_MARK")?),
                NFQA_PAYLOAD => payload = Some(a.value),
                _ => {}
            }
        }
        let (verdict, id) = v.ok_or(ParseError::Missing("NFQA_VERDICT_HDR"))?;
        Ok(Self {
            queue: g.res_id,
            batch,
            verdict: Verdict::from_wire(verdict).ok_or(ParseError::Missing("known verdict"))?,
            id,
            mark,
            payload,
        })
    }
}

/// Copy mode of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum CopyMode {
    /// Metadata only.
    Meta,
    /// Metadata and up to this many bytes of the packet.
    Packet(u32),
}

/// A `NFQNL_MSG_CONFIG` message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigMsg {
    /// Queue number.
    pub queue: u16,
    /// `NFQA_CFG_CMD` command (`NFQNL_CFG_CMD_*`).
    pub cmd: Option<u8>,
    /// `NFQA_CFG_PARAMS` (copy range, copy mode).
    pub params: Option<(u32, u8)>,
    /// `NFQA_CFG_QUEUE_MAXLEN`.
    pub maxlen: Option<u32>,
    /// `NFQA_CFG_MASK` and `NFQA_CFG_FLAGS`.
    pub flags: Option<(u32, u32)>,
}

impl ConfigMsg {
    /// Appends the message (with `NLM_F_ACK`) to `out`.
    pub fn emit(&self, out: &mut Vec<u8>, seq: u32) -> Result<(), EmitError> {
        emit_whole(out, |out| {
            emit_header(
                out,
                nfq_type(NFQNL_MSG_CONFIG),
                NLM_F_REQUEST | NLM_F_ACK,
                seq,
                0,
            );
            NfGen {
                family: libc::AF_UNSPEC as u8,
                version: NFNETLINK_V0,
                res_id: self.queue,
            }
            .emit(out);
            if let Some(c) = self.cmd {
                emit_attr(out, NFQA_CFG_CMD, &[c, 0, 0, 0])?;
            }
            if let Some((range, mode)) = self.params {
                let mut b = [0u8; 5];
                b[0..4].copy_from_slice(&range.to_be_bytes());
                b[4] = mode;
                emit_attr(out, NFQA_CFG_PARAMS, &b)?;
            }
            if let Some(m) = self.maxlen {
                emit_attr(out, NFQA_CFG_QUEUE_MAXLEN, &m.to_be_bytes())?;
            }
            if let Some((mask, flags)) = self.flags {
                emit_attr(out, NFQA_CFG_MASK, &mask.to_be_bytes())?;
                emit_attr(out, NFQA_CFG_FLAGS, &flags.to_be_bytes())?;
            }
            Ok(())
        })
    }

    /// Parses a config message.
    pub fn parse(m: &NlMsg<'_>) -> Result<Self, ParseError> {
        if m.ty != nfq_type(NFQNL_MSG_CONFIG) {
            return Err(ParseError::Type(m.ty));
        }
        let g = NfGen::parse(m.payload)?;
        let mut c = ConfigMsg {
            queue: g.res_id,
            ..Default::default()
        };
        let mut mask = None;
        let mut flags = None;
        for a in attrs(&m.payload[NFGENMSG_LEN..]) {
            let a = a?;
            match a.ty {
                NFQA_CFG_CMD => c.cmd = Some(a.exact("NFQA_CFG_CMD", 4)?[0]),
                NFQA_CFG_PARAMS => {
                    let b = a.exact("NFQA_CFG_PARAMS", 5)?;
                    c.params = Some((u32::from_be_bytes([b[0], b[1], b[2], b[3]]), b[4]));
                }
                NFQA_CFG_QUEUE_MAXLEN => c.maxlen = Some(a.be32("NFQA_CFG_QUEUE_MAXLEN")?),
                NFQA_CFG_MASK => mask = Some(a.be32("NFQA_CFG_MASK")?),
                NFQA_CFG_FLAGS => flags = Some(a.be32("NFQA_CFG_FLAGS")?),
                _ => {}
            }
        }
        if let (Some(m), Some(f)) = (mask, flags) {
            c.flags = Some((m, f));
        }
        Ok(c)
    }
}

/// Any message zcio knows on the nfqueue socket, for the fuzz target and the tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnyMsg<'a> {
    /// A queued packet.
    Packet(Packet<'a>),
    /// A verdict.
    Verdict(VerdictMsg<'a>),
    /// A config message.
    Config(ConfigMsg),
    /// `NLMSG_ERROR` with this code (0 = ACK).
    Error(i32),
    /// Another control message (NOOP, DONE, OVERRUN).
    Control(u16),
}

/// Parses every message of one datagram received on (or sent to) an nfqueue socket.
pub fn parse_datagram(buf: &[u8]) -> Result<Vec<AnyMsg<'_>>, ParseError> {
    let mut v = Vec::new();
    for m in super::msg::messages(buf) {
        let m = m?;
        v.push(parse_one(&m)?);
    }
    Ok(v)
}

/// Parses one message.
pub fn parse_one<'a>(m: &NlMsg<'a>) -> Result<AnyMsg<'a>, ParseError> {
    use crate::sys::netlink::NLMSG_ERROR;
    Ok(match m.ty {
        NLMSG_ERROR => AnyMsg::Error(m.error_code()?),
        t if t < 16 => AnyMsg::Control(t),
        t if t == nfq_type(NFQNL_MSG_PACKET) => AnyMsg::Packet(Packet::parse(m)?),
        t if t == nfq_type(NFQNL_MSG_CONFIG) => AnyMsg::Config(ConfigMsg::parse(m)?),
        t if t == nfq_type(NFQNL_MSG_VERDICT) || t == nfq_type(NFQNL_MSG_VERDICT_BATCH) => {
            AnyMsg::Verdict(VerdictMsg::parse(m)?)
        }
        t => return Err(ParseError::Type(t)),
    })
}

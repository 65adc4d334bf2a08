//! Conntrack entries as ctnetlink carries them: the parser (borrowing from the frame, never
//! allocating), the emitter in the kernel's attribute order for events (so parse → emit →
//! compare holds on captured bytes), and `conntrack -E`'s text format.
//!
//! Used by [`super::CtEvents`] (conntrack events) and by NFLOG's `NFULA_CT` attribute
//! ([`super::LogPacket::conntrack`]).

use super::msg::{attrs, emit_attr, emit_header, emit_whole, Attr, EmitError, NlMsg, ParseError};
use super::nfqmsg::{NfGen, NFGENMSG_LEN};
use crate::sys::ctnetlink::*;
use crate::sys::netlink::NLA_F_NESTED;
use crate::sys::nfqueue::NFNETLINK_V0;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One direction of a connection (`CTA_TUPLE_ORIG`, `CTA_TUPLE_REPLY`, `CTA_TUPLE_MASTER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Layer-4 protocol number (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6, …).
    pub proto: u8,
    /// Source port (TCP, UDP, UDP-Lite, SCTP, DCCP; the key for GRE).
    pub src_port: Option<u16>,
    /// Destination port.
    pub dst_port: Option<u16>,
    /// ICMP/ICMPv6 id.
    pub icmp_id: Option<u16>,
    /// ICMP/ICMPv6 type.
    pub icmp_type: Option<u8>,
    /// ICMP/ICMPv6 code.
    pub icmp_code: Option<u8>,
    /// Zone of this direction (`CTA_TUPLE_ZONE`, when it is not the default).
    pub zone: Option<u16>,
}

/// Packets and bytes of one direction (`CTA_COUNTERS_*`, with `nf_conntrack_acct=1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
pub struct CtCounters {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// Start and stop of a connection, ns since the epoch (`CTA_TIMESTAMP`, with
/// `nf_conntrack_timestamp=1`; stop only on destroyed entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
pub struct CtTimestamp {
    /// When the entry was confirmed.
    pub start: u64,
    /// When it was destroyed.
    pub stop: Option<u64>,
}

/// TCP tracking state (`CTA_PROTOINFO_TCP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TcpInfo {
    /// `TCP_CONNTRACK_*` (1 SYN_SENT … 3 ESTABLISHED … 7 TIME_WAIT, 8 CLOSE).
    pub state: u8,
    /// Window scale, original direction (absent on destroy events).
    pub wscale_orig: Option<u8>,
    /// Window scale, reply direction.
    pub wscale_reply: Option<u8>,
    /// `nf_ct_tcp_flags` (flags, mask), original direction.
    pub flags_orig: Option<[u8; 2]>,
    /// `nf_ct_tcp_flags`, reply direction.
    pub flags_reply: Option<[u8; 2]>,
}

/// A conntrack entry as ctnetlink describes it, borrowed from its frame. Attributes zcio only
/// passes through (helper, security context, labels, sequence adjustment, SYN proxy, other
/// protocols' state) are kept as their raw payloads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conntrack<'a> {
    /// Original direction.
    pub orig: Option<Tuple>,
    /// Reply direction.
    pub reply: Option<Tuple>,
    /// Zone (`CTA_ZONE`, when not the default).
    pub zone: Option<u16>,
    /// Entry id (`CTA_ID`).
    pub id: Option<u32>,
    /// `IPS_*` status bits (`CTA_STATUS`).
    pub status: Option<u32>,
    /// Seconds until it expires (`CTA_TIMEOUT`).
    pub timeout: Option<u32>,
    /// Connection mark (`CTA_MARK`; sent when non-zero or when it changed).
    pub mark: Option<u32>,
    /// Obsolete secmark (`CTA_SECMARK`).
    pub secmark: Option<u32>,
    /// Reference count (`CTA_USE`; dumps only).
    pub use_count: Option<u32>,
    /// Original-direction counters.
    pub counters_orig: Option<CtCounters>,
    /// Reply-direction counters.
    pub counters_reply: Option<CtCounters>,
    /// Start/stop time.
    pub timestamp: Option<CtTimestamp>,
    /// When the kernel generated this event, ns since the epoch (`CTA_TIMESTAMP_EVENT`, 6.13,
    /// with `nf_conntrack_timestamp=1`).
    pub event_time: Option<u64>,
    /// TCP state.
    pub tcp: Option<TcpInfo>,
    /// `CTA_PROTOINFO` payload for protocols other than TCP (SCTP, DCCP).
    pub protoinfo_other: Option<&'a [u8]>,
    /// `CTA_HELP` payload (nested; the helper's name is [`Conntrack::helper_name`]).
    pub help: Option<&'a [u8]>,
    /// `CTA_SECCTX` payload (nested; [`Conntrack::secctx_name`]).
    pub secctx: Option<&'a [u8]>,
    /// `CTA_LABELS`: the 128-bit label bitmap.
    pub labels: Option<&'a [u8]>,
    /// The master connection of an expected one.
    pub master: Option<Tuple>,
    /// `CTA_SEQ_ADJ_ORIG` payload (nested).
    pub seq_adj_orig: Option<&'a [u8]>,
    /// `CTA_SEQ_ADJ_REPLY` payload (nested).
    pub seq_adj_reply: Option<&'a [u8]>,
    /// `CTA_SYNPROXY` payload (nested).
    pub synproxy: Option<&'a [u8]>,
    /// Attributes zcio does not know.
    pub unknown: u16,
}

/// What a conntrack event says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CtEventKind {
    /// A new entry (`IPCTNL_MSG_CT_NEW` with `NLM_F_CREATE`).
    New,
    /// An entry changed (state, status, mark, …).
    Update,
    /// An entry was destroyed (`IPCTNL_MSG_CT_DELETE`).
    Destroy,
}

impl CtEventKind {
    /// `new`, `update`, `destroy`.
    pub fn as_str(self) -> &'static str {
        match self {
            CtEventKind::New => "new",
            CtEventKind::Update => "update",
            CtEventKind::Destroy => "destroy",
        }
    }
}

/// One conntrack event, borrowed from its frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtEvent<'a> {
    /// New, update or destroy.
    pub kind: CtEventKind,
    /// Address family of the entry (2 IPv4, 10 IPv6).
    pub family: u8,
    /// Port id of the process whose request caused the event (`nlmsg_pid`; 0 for events
    /// caused by traffic or timeouts).
    pub portid: u32,
    /// The entry.
    pub ct: Conntrack<'a>,
}

/// Message type of a ctnetlink message on the wire.
pub(crate) const fn ct_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_CTNETLINK << 8) | msg
}

fn be16(a: &Attr<'_>, what: &'static str) -> Result<u16, ParseError> {
    let b = a.exact(what, 2)?;
    Ok(u16::from_be_bytes([b[0], b[1]]))
}

fn be64(a: &Attr<'_>, what: &'static str) -> Result<u64, ParseError> {
    let b = a.exact(what, 8)?;
    let mut x = [0u8; 8];
    x.copy_from_slice(b);
    Ok(u64::from_be_bytes(x))
}

fn u8_of(a: &Attr<'_>, what: &'static str) -> Result<u8, ParseError> {
    Ok(a.exact(what, 1)?[0])
}

fn addr(a: &Attr<'_>, what: &'static str, v6: bool) -> Result<IpAddr, ParseError> {
    if v6 {
        let b = a.exact(what, 16)?;
        let mut x = [0u8; 16];
        x.copy_from_slice(b);
        Ok(IpAddr::V6(Ipv6Addr::from(x)))
    } else {
        let b = a.exact(what, 4)?;
        Ok(IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3])))
    }
}

impl Tuple {
    /// Parses a tuple's nested attributes (the payload of `CTA_TUPLE_*`).
    pub fn parse(nested: &[u8]) -> Result<Self, ParseError> {
        let mut src = None;
        let mut dst = None;
        let mut t = Tuple {
            src: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            dst: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            proto: 0,
            src_port: None,
            dst_port: None,
            icmp_id: None,
            icmp_type: None,
            icmp_code: None,
            zone: None,
        };
        let mut have_proto = false;
        for a in attrs(nested) {
            let a = a?;
            match a.ty {
                CTA_TUPLE_IP => {
                    for i in attrs(a.value) {
                        let i = i?;
                        match i.ty {
                            CTA_IP_V4_SRC => src = Some(addr(&i, "CTA_IP_V4_SRC", false)?),
                            CTA_IP_V4_DST => dst = Some(addr(&i, "CTA_IP_V4_DST", false)?),
                            CTA_IP_V6_SRC => src = Some(addr(&i, "CTA_IP_V6_SRC", true)?),
                            CTA_IP_V6_DST => dst = Some(addr(&i, "CTA_IP_V6_DST", true)?),
                            _ => {}
                        }
                    }
                }
                CTA_TUPLE_PROTO => {
                    for p in attrs(a.value) {
                        let p = p?;
                        match p.ty {
                            CTA_PROTO_NUM => {
                                t.proto = u8_of(&p, "CTA_PROTO_NUM")?;
                                have_proto = true;
                            }
                            CTA_PROTO_SRC_PORT => {
                                t.src_port = Some(be16(&p, "CTA_PROTO_SRC_PORT")?)
                            }
                            CTA_PROTO_DST_PORT => {
                                t.dst_port = Some(be16(&p, "CTA_PROTO_DST_PORT")?)
                            }
                            CTA_PROTO_ICMP_ID | CTA_PROTO_ICMPV6_ID => {
                                t.icmp_id = Some(be16(&p, "CTA_PROTO_ICMP_ID")?)
                            }
                            CTA_PROTO_ICMP_TYPE | CTA_PROTO_ICMPV6_TYPE => {
                                t.icmp_type = Some(u8_of(&p, "CTA_PROTO_ICMP_TYPE")?)
                            }
                            CTA_PROTO_ICMP_CODE | CTA_PROTO_ICMPV6_CODE => {
                                t.icmp_code = Some(u8_of(&p, "CTA_PROTO_ICMP_CODE")?)
                            }
                            _ => {}
                        }
                    }
                }
                CTA_TUPLE_ZONE => t.zone = Some(be16(&a, "CTA_TUPLE_ZONE")?),
                _ => {}
            }
        }
        t.src = src.ok_or(ParseError::Missing("tuple source address"))?;
        t.dst = dst.ok_or(ParseError::Missing("tuple destination address"))?;
        if !have_proto {
            return Err(ParseError::Missing("CTA_PROTO_NUM"));
        }
        Ok(t)
    }

    /// Appends the tuple as the kernel builds it (`ctnetlink_dump_tuples` + zone) under
    /// attribute `ty`.
    pub fn emit(&self, out: &mut Vec<u8>, ty: u16) -> Result<(), EmitError> {
        nest(out, ty, |out| {
            nest(out, CTA_TUPLE_IP, |out| {
                for (a, v4, v6) in [
                    (self.src, CTA_IP_V4_SRC, CTA_IP_V6_SRC),
                    (self.dst, CTA_IP_V4_DST, CTA_IP_V6_DST),
                ] {
                    match a {
                        IpAddr::V4(x) => emit_attr(out, v4, &x.octets())?,
                        IpAddr::V6(x) => emit_attr(out, v6, &x.octets())?,
                    }
                }
                Ok(())
            })?;
            nest(out, CTA_TUPLE_PROTO, |out| {
                emit_attr(out, CTA_PROTO_NUM, &[self.proto])?;
                if let Some(p) = self.src_port {
                    emit_attr(out, CTA_PROTO_SRC_PORT, &p.to_be_bytes())?;
                }
                if let Some(p) = self.dst_port {
                    emit_attr(out, CTA_PROTO_DST_PORT, &p.to_be_bytes())?;
                }
                let v6 = self.proto == 58;
                let (id, ty, code) = if v6 {
                    (
                        CTA_PROTO_ICMPV6_ID,
                        CTA_PROTO_ICMPV6_TYPE,
                        CTA_PROTO_ICMPV6_CODE,
                    )
                } else {
                    (CTA_PROTO_ICMP_ID, CTA_PROTO_ICMP_TYPE, CTA_PROTO_ICMP_CODE)
                };
                if let Some(x) = self.icmp_id {
                    emit_attr(out, id, &x.to_be_bytes())?;
                }
                if let Some(x) = self.icmp_type {
                    emit_attr(out, ty, &[x])?;
                }
                if let Some(x) = self.icmp_code {
                    emit_attr(out, code, &[x])?;
                }
                Ok(())
            })?;
            if let Some(z) = self.zone {
                emit_attr(out, CTA_TUPLE_ZONE, &z.to_be_bytes())?;
            }
            Ok(())
        })
    }
}

/// Emits a nested attribute (`NLA_F_NESTED`, as the kernel's `nla_nest_start`) whose payload
/// `body` appends; its length is patched afterwards. Nothing is appended on failure.
fn nest(
    out: &mut Vec<u8>,
    ty: u16,
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), EmitError>,
) -> Result<(), EmitError> {
    let start = out.len();
    out.extend_from_slice(&0u16.to_ne_bytes());
    out.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
    let r = body(out).and_then(|()| {
        let len = out.len() - start;
        if len > u16::MAX as usize {
            return Err(EmitError::AttrTooLong {
                ty,
                len: len - 4,
                max: super::msg::MAX_ATTR_PAYLOAD,
            });
        }
        out[start..start + 2].copy_from_slice(&(len as u16).to_ne_bytes());
        Ok(())
    });
    if r.is_err() {
        out.truncate(start);
    }
    r
}

fn counters(nested: &[u8]) -> Result<CtCounters, ParseError> {
    let mut c = CtCounters::default();
    for a in attrs(nested) {
        let a = a?;
        match a.ty {
            CTA_COUNTERS_PACKETS => c.packets = be64(&a, "CTA_COUNTERS_PACKETS")?,
            CTA_COUNTERS_BYTES => c.bytes = be64(&a, "CTA_COUNTERS_BYTES")?,
            CTA_COUNTERS32_PACKETS => c.packets = u64::from(a.be32("CTA_COUNTERS32_PACKETS")?),
            CTA_COUNTERS32_BYTES => c.bytes = u64::from(a.be32("CTA_COUNTERS32_BYTES")?),
            _ => {}
        }
    }
    Ok(c)
}

fn tcp_info(nested: &[u8]) -> Result<Option<TcpInfo>, ParseError> {
    for a in attrs(nested) {
        let a = a?;
        if a.ty != CTA_PROTOINFO_TCP {
            continue;
        }
        let mut t = TcpInfo::default();
        let mut have_state = false;
        for f in attrs(a.value) {
            let f = f?;
            let two = |what| -> Result<[u8; 2], ParseError> {
                let b = f.exact(what, 2)?;
                Ok([b[0], b[1]])
            };
            match f.ty {
                CTA_PROTOINFO_TCP_STATE => {
                    t.state = u8_of(&f, "CTA_PROTOINFO_TCP_STATE")?;
                    have_state = true;
                }
                CTA_PROTOINFO_TCP_WSCALE_ORIGINAL => {
                    t.wscale_orig = Some(u8_of(&f, "CTA_PROTOINFO_TCP_WSCALE_ORIGINAL")?)
                }
                CTA_PROTOINFO_TCP_WSCALE_REPLY => {
                    t.wscale_reply = Some(u8_of(&f, "CTA_PROTOINFO_TCP_WSCALE_REPLY")?)
                }
                CTA_PROTOINFO_TCP_FLAGS_ORIGINAL => {
                    t.flags_orig = Some(two("CTA_PROTOINFO_TCP_FLAGS_ORIGINAL")?)
                }
                CTA_PROTOINFO_TCP_FLAGS_REPLY => {
                    t.flags_reply = Some(two("CTA_PROTOINFO_TCP_FLAGS_REPLY")?)
                }
                _ => {}
            }
        }
        if !have_state {
            return Err(ParseError::Missing("CTA_PROTOINFO_TCP_STATE"));
        }
        return Ok(Some(t));
    }
    Ok(None)
}

impl<'a> Conntrack<'a> {
    /// Parses the attributes of a ctnetlink message after its `nfgenmsg` (or the payload of
    /// NFLOG's `NFULA_CT`).
    pub fn parse(attributes: &'a [u8]) -> Result<Self, ParseError> {
        let mut c = Conntrack::default();
        for a in attrs(attributes) {
            let a = a?;
            match a.ty {
                CTA_TUPLE_ORIG => c.orig = Some(Tuple::parse(a.value)?),
                CTA_TUPLE_REPLY => c.reply = Some(Tuple::parse(a.value)?),
                CTA_TUPLE_MASTER => c.master = Some(Tuple::parse(a.value)?),
                CTA_ZONE => c.zone = Some(be16(&a, "CTA_ZONE")?),
                CTA_ID => c.id = Some(a.be32("CTA_ID")?),
                CTA_STATUS => c.status = Some(a.be32("CTA_STATUS")?),
                CTA_TIMEOUT => c.timeout = Some(a.be32("CTA_TIMEOUT")?),
                CTA_MARK => c.mark = Some(a.be32("CTA_MARK")?),
                CTA_SECMARK => c.secmark = Some(a.be32("CTA_SECMARK")?),
                CTA_USE => c.use_count = Some(a.be32("CTA_USE")?),
                CTA_COUNTERS_ORIG => c.counters_orig = Some(counters(a.value)?),
                CTA_COUNTERS_REPLY => c.counters_reply = Some(counters(a.value)?),
                CTA_TIMESTAMP => {
                    let mut t = CtTimestamp::default();
                    let mut have_start = false;
                    for x in attrs(a.value) {
                        let x = x?;
                        match x.ty {
                            CTA_TIMESTAMP_START => {
                                t.start = be64(&x, "CTA_TIMESTAMP_START")?;
                                have_start = true;
                            }
                            CTA_TIMESTAMP_STOP => t.stop = Some(be64(&x, "CTA_TIMESTAMP_STOP")?),
                            _ => {}
                        }
                    }
                    if !have_start {
                        return Err(ParseError::Missing("CTA_TIMESTAMP_START"));
                    }
                    c.timestamp = Some(t);
                }
                CTA_TIMESTAMP_EVENT => c.event_time = Some(be64(&a, "CTA_TIMESTAMP_EVENT")?),
                CTA_PROTOINFO => match tcp_info(a.value)? {
                    Some(t) => c.tcp = Some(t),
                    None => c.protoinfo_other = Some(a.value),
                },
                CTA_HELP => c.help = Some(a.value),
                CTA_SECCTX => c.secctx = Some(a.value),
                CTA_LABELS => c.labels = Some(a.value),
                CTA_SEQ_ADJ_ORIG => c.seq_adj_orig = Some(a.value),
                CTA_SEQ_ADJ_REPLY => c.seq_adj_reply = Some(a.value),
                CTA_SYNPROXY => c.synproxy = Some(a.value),
                _ => c.unknown = c.unknown.saturating_add(1),
            }
        }
        Ok(c)
    }

    /// The helper's name (`CTA_HELP_NAME`), if a helper is attached.
    pub fn helper_name(&self) -> Option<&'a [u8]> {
        nested_string(self.help?, CTA_HELP_NAME)
    }

    /// The security context's name (`CTA_SECCTX_NAME`).
    pub fn secctx_name(&self) -> Option<&'a [u8]> {
        nested_string(self.secctx?, 1)
    }

    /// Whether `IPS_SEEN_REPLY` is set (packets were seen in both directions).
    pub fn seen_reply(&self) -> bool {
        self.status.is_some_and(|s| s & IPS_SEEN_REPLY != 0)
    }

    /// Whether `IPS_ASSURED` is set.
    pub fn assured(&self) -> bool {
        self.status.is_some_and(|s| s & IPS_ASSURED != 0)
    }

    /// Appends the attributes in the order `ctnetlink_conntrack_event` builds them for an
    /// event of `kind` (destroy events carry counters, timestamps and protocol state after
    /// the timeout; the others carry protocol state, helper, security context, labels, master,
    /// sequence adjustment and SYN proxy). What a kind never carries from the kernel still
    /// goes out (after what it does carry), so parse → emit → parse keeps every field.
    /// Attributes zcio does not know are not re-emitted.
    pub fn emit_event_attrs(&self, out: &mut Vec<u8>, kind: CtEventKind) -> Result<(), EmitError> {
        let be32 = |out: &mut Vec<u8>, ty: u16, v: Option<u32>| -> Result<(), EmitError> {
            match v {
                Some(v) => emit_attr(out, ty, &v.to_be_bytes()),
                None => Ok(()),
            }
        };
        if let Some(t) = &self.orig {
            t.emit(out, CTA_TUPLE_ORIG)?;
        }
        if let Some(t) = &self.reply {
            t.emit(out, CTA_TUPLE_REPLY)?;
        }
        if let Some(z) = self.zone {
            emit_attr(out, CTA_ZONE, &z.to_be_bytes())?;
        }
        be32(out, CTA_ID, self.id)?;
        be32(out, CTA_STATUS, self.status)?;
        be32(out, CTA_TIMEOUT, self.timeout)?;
        if kind == CtEventKind::Destroy {
            self.emit_counters(out)?;
            self.emit_timestamp(out)?;
            self.emit_protoinfo(out)?;
            self.emit_extras(out)?;
        } else {
            self.emit_protoinfo(out)?;
            self.emit_extras(out)?;
            // Older kernels sent counters on updates too (`IPCT_COUNTER_FILLING`).
            self.emit_counters(out)?;
            self.emit_timestamp(out)?;
        }
        be32(out, CTA_SECMARK, self.secmark)?;
        be32(out, CTA_USE, self.use_count)?;
        be32(out, CTA_MARK, self.mark)?;
        if let Some(t) = self.event_time {
            emit_attr(out, CTA_TIMESTAMP_EVENT, &t.to_be_bytes())?;
        }
        Ok(())
    }

    /// Helper, security context, labels, master, sequence adjustment and SYN proxy, in the
    /// order of a NEW/UPDATE event (a DESTROY event carries none of them).
    fn emit_extras(&self, out: &mut Vec<u8>) -> Result<(), EmitError> {
        let raw = |out: &mut Vec<u8>, ty: u16, v: Option<&[u8]>| -> Result<(), EmitError> {
            match v {
                Some(v) => emit_attr(out, ty | NLA_F_NESTED, v),
                None => Ok(()),
            }
        };
        raw(out, CTA_HELP, self.help)?;
        raw(out, CTA_SECCTX, self.secctx)?;
        if let Some(l) = self.labels {
            emit_attr(out, CTA_LABELS, l)?;
        }
        if let Some(m) = &self.master {
            m.emit(out, CTA_TUPLE_MASTER)?;
        }
        raw(out, CTA_SEQ_ADJ_ORIG, self.seq_adj_orig)?;
        raw(out, CTA_SEQ_ADJ_REPLY, self.seq_adj_reply)?;
        raw(out, CTA_SYNPROXY, self.synproxy)
    }

    fn emit_counters(&self, out: &mut Vec<u8>) -> Result<(), EmitError> {
        for (ty, c) in [
            (CTA_COUNTERS_ORIG, self.counters_orig),
            (CTA_COUNTERS_REPLY, self.counters_reply),
        ] {
            if let Some(c) = c {
                nest(out, ty, |out| {
                    emit_attr(out, CTA_COUNTERS_PACKETS, &c.packets.to_be_bytes())?;
                    emit_attr(out, CTA_COUNTERS_BYTES, &c.bytes.to_be_bytes())
                })?;
            }
        }
        Ok(())
    }

    fn emit_timestamp(&self, out: &mut Vec<u8>) -> Result<(), EmitError> {
        if let Some(t) = self.timestamp {
            nest(out, CTA_TIMESTAMP, |out| {
                emit_attr(out, CTA_TIMESTAMP_START, &t.start.to_be_bytes())?;
                if let Some(s) = t.stop {
                    emit_attr(out, CTA_TIMESTAMP_STOP, &s.to_be_bytes())?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    fn emit_protoinfo(&self, out: &mut Vec<u8>) -> Result<(), EmitError> {
        if let Some(t) = &self.tcp {
            nest(out, CTA_PROTOINFO, |out| {
                nest(out, CTA_PROTOINFO_TCP, |out| {
                    emit_attr(out, CTA_PROTOINFO_TCP_STATE, &[t.state])?;
                    if let Some(w) = t.wscale_orig {
                        emit_attr(out, CTA_PROTOINFO_TCP_WSCALE_ORIGINAL, &[w])?;
                    }
                    if let Some(w) = t.wscale_reply {
                        emit_attr(out, CTA_PROTOINFO_TCP_WSCALE_REPLY, &[w])?;
                    }
                    if let Some(f) = t.flags_orig {
                        emit_attr(out, CTA_PROTOINFO_TCP_FLAGS_ORIGINAL, &f)?;
                    }
                    if let Some(f) = t.flags_reply {
                        emit_attr(out, CTA_PROTOINFO_TCP_FLAGS_REPLY, &f)?;
                    }
                    Ok(())
                })
            })?;
        } else if let Some(p) = self.protoinfo_other {
            emit_attr(out, CTA_PROTOINFO | NLA_F_NESTED, p)?;
        }
        Ok(())
    }
}

fn nested_string(nested: &[u8], ty: u16) -> Option<&[u8]> {
    attrs(nested)
        .flatten()
        .find(|a| a.ty == ty)
        .map(|a| a.value.split(|&b| b == 0).next().unwrap_or(&[]))
}

impl<'a> CtEvent<'a> {
    /// Parses one conntrack event message (`IPCTNL_MSG_CT_NEW` or `IPCTNL_MSG_CT_DELETE` of
    /// the ctnetlink subsystem).
    pub fn parse(m: &NlMsg<'a>) -> Result<Self, ParseError> {
        let kind = if m.ty == ct_type(IPCTNL_MSG_CT_DELETE) {
            CtEventKind::Destroy
        } else if m.ty == ct_type(IPCTNL_MSG_CT_NEW) {
            if m.flags & (NLM_F_CREATE | NLM_F_EXCL) != 0 {
                CtEventKind::New
            } else {
                CtEventKind::Update
            }
        } else {
            return Err(ParseError::Type(m.ty));
        };
        let g = NfGen::parse(m.payload)?;
        Ok(Self {
            kind,
            family: g.family,
            portid: m.pid,
            ct: Conntrack::parse(&m.payload[NFGENMSG_LEN..])?,
        })
    }

    /// Parses one message from its bytes (a whole `nlmsghdr` and payload).
    pub fn parse_bytes(msg: &'a [u8]) -> Result<Self, ParseError> {
        let (m, _) = NlMsg::parse(msg)?;
        Self::parse(&m)
    }

    /// Appends the event as the kernel sends it (`ctnetlink_conntrack_event`): header, then
    /// the attributes in its order ([`Conntrack::emit_event_attrs`]).
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), EmitError> {
        emit_whole(out, |out| {
            let (ty, flags) = match self.kind {
                CtEventKind::New => (IPCTNL_MSG_CT_NEW, NLM_F_CREATE | NLM_F_EXCL),
                CtEventKind::Update => (IPCTNL_MSG_CT_NEW, 0),
                CtEventKind::Destroy => (IPCTNL_MSG_CT_DELETE, 0),
            };
            emit_header(out, ct_type(ty), flags, 0, self.portid);
            out.push(self.family);
            out.push(NFNETLINK_V0);
            out.extend_from_slice(&0u16.to_be_bytes());
            self.ct.emit_event_attrs(out, self.kind)
        })
    }

    /// Writes the event as `conntrack -E` prints it (libnetfilter_conntrack's default format,
    /// conntrack-tools 1.4.7), without a newline: `    [NEW] tcp      6 120 SYN_SENT src=…`.
    /// With `extended`, the layer-3 protocol too (`conntrack -E -o extended`). `now_ns` (ns
    /// since the epoch) dates `delta-time` for an entry that has a start but no stop time.
    pub fn write_conntrack(
        &self,
        out: &mut String,
        extended: bool,
        now_ns: u64,
    ) -> std::fmt::Result {
        use std::fmt::Write;
        let c = &self.ct;
        let tag = match self.kind {
            CtEventKind::New => "[NEW]",
            CtEventKind::Update => "[UPDATE]",
            CtEventKind::Destroy => "[DESTROY]",
        };
        write!(out, "{tag:>9} ")?;
        let orig = c.orig.as_ref();
        if extended {
            let fam = match self.family {
                2 => "ipv4",
                10 => "ipv6",
                _ => "unknown",
            };
            write!(out, "{fam:<8} {} ", self.family)?;
        }
        let proto = orig.map_or(0, |t| t.proto);
        write!(out, "{:<8} {proto} ", proto_name(proto))?;
        if let Some(t) = c.timeout {
            write!(out, "{t} ")?;
        }
        if let Some(t) = &c.tcp {
            write!(out, "{} ", tcp_state_name(t.state))?;
        }
        if let Some(t) = orig {
            write_tuple(out, t)?;
            if let Some(z) = t.zone {
                write!(out, "zone-orig={z} ")?;
            }
        }
        if let Some(k) = c.counters_orig {
            write!(out, "packets={} bytes={} ", k.packets, k.bytes)?;
        }
        if c.status.is_some() && !c.seen_reply() {
            out.push_str("[UNREPLIED] ");
        }
        if let Some(t) = &c.reply {
            write_tuple(out, t)?;
            if let Some(z) = t.zone {
                write!(out, "zone-reply={z} ")?;
            }
        }
        if let Some(k) = c.counters_reply {
            write!(out, "packets={} bytes={} ", k.packets, k.bytes)?;
        }
        if let Some(s) = c.status {
            if s & IPS_HW_OFFLOAD != 0 {
                out.push_str("[HW_OFFLOAD] ");
            } else if s & IPS_OFFLOAD != 0 {
                out.push_str("[OFFLOAD] ");
            } else if s & IPS_ASSURED != 0 {
                out.push_str("[ASSURED] ");
            }
        }
        if let Some(m) = c.mark {
            write!(out, "mark={m} ")?;
        }
        if let Some(m) = c.secmark {
            write!(out, "secmark={m} ")?;
        }
        if let Some(s) = c.secctx_name() {
            write!(out, "secctx={} ", String::from_utf8_lossy(s))?;
        }
        if let Some(z) = c.zone {
            write!(out, "zone={z} ")?;
        }
        if let Some(t) = c.timestamp {
            let stop = t.stop.unwrap_or(now_ns) / 1_000_000_000;
            let delta = stop.wrapping_sub(t.start / 1_000_000_000);
            write!(out, "delta-time={delta} ")?;
        }
        if let Some(h) = c.helper_name() {
            write!(out, "helper={} ", String::from_utf8_lossy(h))?;
        }
        if let Some(u) = c.use_count {
            write!(out, "use={u} ")?;
        }
        // libnetfilter_conntrack drops the last blank.
        if out.ends_with(' ') {
            out.pop();
        }
        if self.portid != 0 {
            write!(out, " [USERSPACE] portid={}", self.portid)?;
        }
        Ok(())
    }
}

fn write_tuple(out: &mut String, t: &Tuple) -> std::fmt::Result {
    use std::fmt::Write;
    write!(out, "src={} dst={} ", t.src, t.dst)?;
    match t.proto {
        6 | 17 | 136 | 132 | 33 => write!(
            out,
            "sport={} dport={} ",
            t.src_port.unwrap_or(0),
            t.dst_port.unwrap_or(0)
        ),
        47 => write!(
            out,
            "srckey=0x{:x} dstkey=0x{:x} ",
            t.src_port.unwrap_or(0),
            t.dst_port.unwrap_or(0)
        ),
        1 | 58 => write!(
            out,
            "type={} code={} id={} ",
            t.icmp_type.unwrap_or(0),
            t.icmp_code.unwrap_or(0),
            t.icmp_id.unwrap_or(0)
        ),
        _ => Ok(()),
    }
}

/// libnetfilter_conntrack's protocol names.
fn proto_name(p: u8) -> &'static str {
    match p {
        6 => "tcp",
        17 => "udp",
        136 => "udplite",
        1 => "icmp",
        58 => "icmpv6",
        132 => "sctp",
        47 => "gre",
        33 => "dccp",
        _ => "unknown",
    }
}

/// Names of `TCP_CONNTRACK_*` as conntrack prints them (9, the kernel's `SYN_SENT2`, is the
/// old `LISTEN` slot).
pub fn tcp_state_name(s: u8) -> &'static str {
    const NAMES: [&str; 10] = [
        "NONE",
        "SYN_SENT",
        "SYN_RECV",
        "ESTABLISHED",
        "FIN_WAIT",
        "CLOSE_WAIT",
        "LAST_ACK",
        "TIME_WAIT",
        "CLOSE",
        "LISTEN",
    ];
    NAMES.get(s as usize).copied().unwrap_or("NONE")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(src: &str, dst: &str, proto: u8, sp: u16, dp: u16) -> Tuple {
        Tuple {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            proto,
            src_port: Some(sp),
            dst_port: Some(dp),
            icmp_id: None,
            icmp_type: None,
            icmp_code: None,
            zone: None,
        }
    }

    fn event(kind: CtEventKind) -> CtEvent<'static> {
        CtEvent {
            kind,
            family: 2,
            portid: 0,
            ct: Conntrack {
                orig: Some(tuple("10.0.0.1", "10.0.0.2", 6, 40000, 80)),
                reply: Some(tuple("10.0.0.2", "10.0.0.1", 6, 80, 40000)),
                id: Some(7),
                status: Some(8),
                timeout: Some(120),
                tcp: Some(TcpInfo {
                    state: 1,
                    wscale_orig: Some(7),
                    wscale_reply: Some(0),
                    flags_orig: Some([3, 3]),
                    flags_reply: Some([0, 0]),
                }),
                ..Conntrack::default()
            },
        }
    }

    #[test]
    fn events_parse_back_from_what_they_emit() {
        for kind in [CtEventKind::New, CtEventKind::Update, CtEventKind::Destroy] {
            let mut e = event(kind);
            if kind == CtEventKind::Destroy {
                e.ct.counters_orig = Some(CtCounters {
                    packets: 3,
                    bytes: 180,
                });
                e.ct.counters_reply = Some(CtCounters {
                    packets: 2,
                    bytes: 120,
                });
                e.ct.timestamp = Some(CtTimestamp {
                    start: 5_000_000_000,
                    stop: Some(9_000_000_000),
                });
            }
            e.ct.mark = Some(0x42);
            e.ct.zone = Some(3);
            let mut out = Vec::new();
            e.emit(&mut out).unwrap();
            let back = CtEvent::parse_bytes(&out).unwrap();
            assert_eq!(back, e, "{kind:?}");
            let mut again = Vec::new();
            back.emit(&mut again).unwrap();
            assert_eq!(again, out);
        }
    }

    #[test]
    fn conntrack_format_matches_the_tools_layout() {
        let mut s = String::new();
        event(CtEventKind::New)
            .write_conntrack(&mut s, false, 0)
            .unwrap();
        assert_eq!(
            s,
            "    [NEW] tcp      6 120 SYN_SENT src=10.0.0.1 dst=10.0.0.2 sport=40000 dport=80 \
             [UNREPLIED] src=10.0.0.2 dst=10.0.0.1 sport=80 dport=40000"
        );
        let mut e = event(CtEventKind::Destroy);
        e.ct.status = Some(IPS_SEEN_REPLY | IPS_ASSURED | 8);
        e.ct.tcp = None;
        e.ct.timeout = None;
        e.ct.counters_orig = Some(CtCounters {
            packets: 1,
            bytes: 31,
        });
        e.ct.counters_reply = Some(CtCounters::default());
        e.ct.timestamp = Some(CtTimestamp {
            start: 10_000_000_000,
            stop: Some(12_500_000_000),
        });
        e.portid = 99;
        let mut s = String::new();
        e.write_conntrack(&mut s, true, 0).unwrap();
        assert_eq!(
            s,
            "[DESTROY] ipv4     2 tcp      6 src=10.0.0.1 dst=10.0.0.2 sport=40000 dport=80 \
             packets=1 bytes=31 src=10.0.0.2 dst=10.0.0.1 sport=80 dport=40000 packets=0 \
             bytes=0 [ASSURED] delta-time=2 [USERSPACE] portid=99"
        );
    }

    #[test]
    fn truncated_and_missing_attributes_are_errors_not_panics() {
        let mut out = Vec::new();
        event(CtEventKind::New).emit(&mut out).unwrap();
        for cut in 0..out.len() {
            let mut b = out[..cut].to_vec();
            if b.len() >= 4 {
                let len = b.len() as u32;
                b[..4].copy_from_slice(&len.to_ne_bytes());
            }
            let _ = CtEvent::parse_bytes(&b);
        }
        // A tuple without addresses.
        let mut t = Vec::new();
        nest(&mut t, CTA_TUPLE_PROTO, |o| {
            emit_attr(o, CTA_PROTO_NUM, &[6])
        })
        .unwrap();
        assert_eq!(
            Tuple::parse(&t),
            Err(ParseError::Missing("tuple source address"))
        );
    }
}

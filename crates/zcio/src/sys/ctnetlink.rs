//! ctnetlink (conntrack over netlink) ABI numbers (`linux/netfilter/nfnetlink_conntrack.h`,
//! `nf_conntrack_common.h`, `nf_conntrack_tcp.h`, `nfnetlink.h`'s multicast groups).
//!
//! Conntrack events arrived in 2.6.14. `CTA_ZONE` 2.6.34, `CTA_TIMESTAMP` 3.1,
//! `CTA_LABELS` 3.14, `CTA_SYNPROXY` 5.3, `CTA_TIMESTAMP_EVENT` 6.13.

/// nfnetlink subsystem id of conntrack (2.6.14).
pub const NFNL_SUBSYS_CTNETLINK: u16 = 1;

/// A new entry (`NLM_F_CREATE | NLM_F_EXCL` on the event) or a changed one (2.6.14).
pub const IPCTNL_MSG_CT_NEW: u16 = 0;
/// Get (dump) entries (2.6.14).
pub const IPCTNL_MSG_CT_GET: u16 = 1;
/// A destroyed entry (2.6.14).
pub const IPCTNL_MSG_CT_DELETE: u16 = 2;

/// Multicast group: new entries (2.6.14).
pub const NFNLGRP_CONNTRACK_NEW: u32 = 1;
/// Multicast group: updated entries (2.6.14).
pub const NFNLGRP_CONNTRACK_UPDATE: u32 = 2;
/// Multicast group: destroyed entries (2.6.14).
pub const NFNLGRP_CONNTRACK_DESTROY: u32 = 3;

/// `nlmsg_flags` of a NEW event: `NLM_F_CREATE`.
pub const NLM_F_CREATE: u16 = 0x400;
/// `nlmsg_flags` of a NEW event: `NLM_F_EXCL`.
pub const NLM_F_EXCL: u16 = 0x200;

/// Original-direction tuple (nested `CTA_TUPLE_*`).
pub const CTA_TUPLE_ORIG: u16 = 1;
/// Reply-direction tuple (nested).
pub const CTA_TUPLE_REPLY: u16 = 2;
/// `IPS_*` status bits (be32).
pub const CTA_STATUS: u16 = 3;
/// Protocol state (nested `CTA_PROTOINFO_*`).
pub const CTA_PROTOINFO: u16 = 4;
/// Helper (nested `CTA_HELP_*`).
pub const CTA_HELP: u16 = 5;
/// NAT (source) set-up, requests only (nested).
pub const CTA_NAT_SRC: u16 = 6;
/// Seconds until the entry expires (be32).
pub const CTA_TIMEOUT: u16 = 7;
/// Connection mark (be32).
pub const CTA_MARK: u16 = 8;
/// Original-direction counters (nested `CTA_COUNTERS_*`; with `nf_conntrack_acct`).
pub const CTA_COUNTERS_ORIG: u16 = 9;
/// Reply-direction counters (nested).
pub const CTA_COUNTERS_REPLY: u16 = 10;
/// Reference count (be32; dumps only).
pub const CTA_USE: u16 = 11;
/// Entry id (be32).
pub const CTA_ID: u16 = 12;
/// NAT (destination) set-up, requests only (nested).
pub const CTA_NAT_DST: u16 = 13;
/// The master connection's tuple of an expected one (nested).
pub const CTA_TUPLE_MASTER: u16 = 14;
/// TCP sequence adjustment, original direction (nested `CTA_SEQADJ_*`).
pub const CTA_SEQ_ADJ_ORIG: u16 = 15;
/// TCP sequence adjustment, reply direction (nested).
pub const CTA_SEQ_ADJ_REPLY: u16 = 16;
/// Obsolete secmark (be32).
pub const CTA_SECMARK: u16 = 17;
/// Conntrack zone (be16).
pub const CTA_ZONE: u16 = 18;
/// Security context (nested `CTA_SECCTX_NAME`).
pub const CTA_SECCTX: u16 = 19;
/// Start and stop time, ns (nested `CTA_TIMESTAMP_*`; with `nf_conntrack_timestamp`).
pub const CTA_TIMESTAMP: u16 = 20;
/// Mark mask (requests only).
pub const CTA_MARK_MASK: u16 = 21;
/// Connection labels (a 128-bit bitmap).
pub const CTA_LABELS: u16 = 22;
/// Labels mask (requests only).
pub const CTA_LABELS_MASK: u16 = 23;
/// SYN proxy state (nested).
pub const CTA_SYNPROXY: u16 = 24;
/// Dump filter (requests only).
pub const CTA_FILTER: u16 = 25;
/// Status mask (requests only).
pub const CTA_STATUS_MASK: u16 = 26;
/// When the event was generated, ns since the epoch (be64; 6.13).
pub const CTA_TIMESTAMP_EVENT: u16 = 27;

/// Tuple: addresses (nested `CTA_IP_*`).
pub const CTA_TUPLE_IP: u16 = 1;
/// Tuple: protocol and ports/ids (nested `CTA_PROTO_*`).
pub const CTA_TUPLE_PROTO: u16 = 2;
/// Tuple: zone of this direction (be16).
pub const CTA_TUPLE_ZONE: u16 = 3;

/// IPv4 source address (4 bytes, network order).
pub const CTA_IP_V4_SRC: u16 = 1;
/// IPv4 destination address.
pub const CTA_IP_V4_DST: u16 = 2;
/// IPv6 source address (16 bytes).
pub const CTA_IP_V6_SRC: u16 = 3;
/// IPv6 destination address.
pub const CTA_IP_V6_DST: u16 = 4;

/// Layer-4 protocol number (u8).
pub const CTA_PROTO_NUM: u16 = 1;
/// Source port (be16; the GRE key for GRE).
pub const CTA_PROTO_SRC_PORT: u16 = 2;
/// Destination port (be16).
pub const CTA_PROTO_DST_PORT: u16 = 3;
/// ICMP id (be16).
pub const CTA_PROTO_ICMP_ID: u16 = 4;
/// ICMP type (u8).
pub const CTA_PROTO_ICMP_TYPE: u16 = 5;
/// ICMP code (u8).
pub const CTA_PROTO_ICMP_CODE: u16 = 6;
/// ICMPv6 id (be16).
pub const CTA_PROTO_ICMPV6_ID: u16 = 7;
/// ICMPv6 type (u8).
pub const CTA_PROTO_ICMPV6_TYPE: u16 = 8;
/// ICMPv6 code (u8).
pub const CTA_PROTO_ICMPV6_CODE: u16 = 9;

/// Protocol info: TCP (nested `CTA_PROTOINFO_TCP_*`).
pub const CTA_PROTOINFO_TCP: u16 = 1;
/// TCP state (`TCP_CONNTRACK_*`, u8).
pub const CTA_PROTOINFO_TCP_STATE: u16 = 1;
/// Window scale, original direction (u8).
pub const CTA_PROTOINFO_TCP_WSCALE_ORIGINAL: u16 = 2;
/// Window scale, reply direction (u8).
pub const CTA_PROTOINFO_TCP_WSCALE_REPLY: u16 = 3;
/// `struct nf_ct_tcp_flags` (flags, mask), original direction.
pub const CTA_PROTOINFO_TCP_FLAGS_ORIGINAL: u16 = 4;
/// `struct nf_ct_tcp_flags`, reply direction.
pub const CTA_PROTOINFO_TCP_FLAGS_REPLY: u16 = 5;

/// Counters: packets (be64).
pub const CTA_COUNTERS_PACKETS: u16 = 1;
/// Counters: bytes (be64).
pub const CTA_COUNTERS_BYTES: u16 = 2;
/// Counters: 32-bit packets (old kernels).
pub const CTA_COUNTERS32_PACKETS: u16 = 3;
/// Counters: 32-bit bytes (old kernels).
pub const CTA_COUNTERS32_BYTES: u16 = 4;
/// Counters: alignment padding before a 64-bit attribute.
pub const CTA_COUNTERS_PAD: u16 = 5;

/// Timestamp: start, ns (be64).
pub const CTA_TIMESTAMP_START: u16 = 1;
/// Timestamp: stop, ns (be64; destroyed entries).
pub const CTA_TIMESTAMP_STOP: u16 = 2;
/// Timestamp: alignment padding.
pub const CTA_TIMESTAMP_PAD: u16 = 3;

/// Helper: its name (string).
pub const CTA_HELP_NAME: u16 = 1;

/// `IPS_SEEN_REPLY`: packets seen both ways.
pub const IPS_SEEN_REPLY: u32 = 1 << 1;
/// `IPS_ASSURED`: the entry is not evicted early.
pub const IPS_ASSURED: u32 = 1 << 2;
/// `IPS_OFFLOAD`: the flow is offloaded to the flow table (4.16).
pub const IPS_OFFLOAD: u32 = 1 << 14;
/// `IPS_HW_OFFLOAD`: the flow is offloaded to hardware (5.8).
pub const IPS_HW_OFFLOAD: u32 = 1 << 15;

//! nfnetlink_queue ABI numbers (`linux/netfilter/nfnetlink.h`, `nfnetlink_queue.h`).
//!
//! NFQUEUE arrived in Linux 2.6.14; `NFQNL_MSG_VERDICT_BATCH` in 3.1; `NFQA_CFG_FLAGS` in 2.6.36.

/// Netlink protocol number of nfnetlink (2.6.14).
pub const NETLINK_NETFILTER: i32 = 12;
/// nfnetlink subsystem id of the queue (2.6.14).
pub const NFNL_SUBSYS_QUEUE: u16 = 3;
/// nfnetlink version field value.
pub const NFNETLINK_V0: u8 = 0;

/// Kernel → user: a queued packet (2.6.14).
pub const NFQNL_MSG_PACKET: u16 = 0;
/// User → kernel: verdict for one packet (2.6.14).
pub const NFQNL_MSG_VERDICT: u16 = 1;
/// User → kernel: queue configuration (2.6.14).
pub const NFQNL_MSG_CONFIG: u16 = 2;
/// User → kernel: verdict for every pending id ≤ the given one (3.1).
pub const NFQNL_MSG_VERDICT_BATCH: u16 = 3;

/// `NFQNL_CFG_CMD_BIND` (2.6.14).
pub const NFQNL_CFG_CMD_BIND: u8 = 1;
/// `NFQNL_CFG_CMD_UNBIND` (2.6.14).
pub const NFQNL_CFG_CMD_UNBIND: u8 = 2;

/// Config attribute: command (`struct nfqnl_msg_config_cmd`).
pub const NFQA_CFG_CMD: u16 = 1;
/// Config attribute: copy mode and range (`struct nfqnl_msg_config_params`).
pub const NFQA_CFG_PARAMS: u16 = 2;
/// Config attribute: maximum queue length (u32, network order).
pub const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
/// Config attribute: flag mask (u32, network order; 2.6.36).
pub const NFQA_CFG_MASK: u16 = 4;
/// Config attribute: flags (u32, network order; 2.6.36).
pub const NFQA_CFG_FLAGS: u16 = 5;

/// Copy mode: nothing.
pub const NFQNL_COPY_NONE: u8 = 0;
/// Copy mode: metadata only.
pub const NFQNL_COPY_META: u8 = 1;
/// Copy mode: packet payload up to the range.
pub const NFQNL_COPY_PACKET: u8 = 2;
/// Largest copy range (`NFQNL_MAX_COPY_RANGE`, 2.6.14: an attribute length is a u16); the
/// kernel takes 0 and anything larger as this.
pub const NFQNL_MAX_COPY_RANGE: u32 = 0xffff - 4;

/// Queue flag: accept packets when the queue is full (3.6).
pub const NFQA_CFG_F_FAIL_OPEN: u32 = 1 << 0;
/// Queue flag: attach conntrack info (3.6).
pub const NFQA_CFG_F_CONNTRACK: u32 = 1 << 1;
/// Queue flag: accept GSO packets without segmenting (3.10).
pub const NFQA_CFG_F_GSO: u32 = 1 << 2;
/// Queue flag: attach UID/GID (3.16).
pub const NFQA_CFG_F_UID_GID: u32 = 1 << 3;
/// Queue flag: attach security context (4.11).
pub const NFQA_CFG_F_SECCTX: u32 = 1 << 4;

/// Packet attribute: `struct nfqnl_msg_packet_hdr`.
pub const NFQA_PACKET_HDR: u16 = 1;
/// Verdict attribute: `struct nfqnl_msg_verdict_hdr`.
pub const NFQA_VERDICT_HDR: u16 = 2;
/// Packet mark (u32 network order).
pub const NFQA_MARK: u16 = 3;
/// Timestamp.
pub const NFQA_TIMESTAMP: u16 = 4;
/// Input interface index.
pub const NFQA_IFINDEX_INDEV: u16 = 5;
/// Output interface index.
pub const NFQA_IFINDEX_OUTDEV: u16 = 6;
/// Physical input interface index.
pub const NFQA_IFINDEX_PHYSINDEV: u16 = 7;
/// Physical output interface index.
pub const NFQA_IFINDEX_PHYSOUTDEV: u16 = 8;
/// Hardware address.
pub const NFQA_HWADDR: u16 = 9;
/// Payload.
pub const NFQA_PAYLOAD: u16 = 10;
/// Conntrack.
pub const NFQA_CT: u16 = 11;
/// Conntrack info.
pub const NFQA_CT_INFO: u16 = 12;
/// Original packet length when truncated by the copy range (3.1).
pub const NFQA_CAP_LEN: u16 = 13;
/// `NFQA_SKB_*` flags (3.10).
pub const NFQA_SKB_INFO: u16 = 14;
/// Expectation (3.16).
pub const NFQA_EXP: u16 = 15;
/// `NFQA_SKB_INFO` flag: the checksum is not computed yet (3.10).
pub const NFQA_SKB_CSUMNOTREADY: u32 = 1 << 0;
/// `NFQA_SKB_INFO` flag: the packet is a GSO super-packet (3.10).
pub const NFQA_SKB_GSO: u32 = 1 << 1;
/// `NFQA_SKB_INFO` flag: the checksum was verified (3.11).
pub const NFQA_SKB_CSUM_NOTVERIFIED: u32 = 1 << 2;
/// UID (3.16).
pub const NFQA_UID: u16 = 16;
/// GID (3.16).
pub const NFQA_GID: u16 = 17;

/// Verdict: drop.
pub const NF_DROP: u32 = 0;
/// Verdict: accept.
pub const NF_ACCEPT: u32 = 1;
/// Verdict: queue to another queue (number in the upper 16 bits).
pub const NF_QUEUE: u32 = 3;
/// Verdict: re-inject at the same hook.
pub const NF_REPEAT: u32 = 4;

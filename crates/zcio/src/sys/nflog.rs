//! nfnetlink_log ABI numbers (`linux/netfilter/nfnetlink_log.h`).
//!
//! NFLOG arrived in Linux 2.6.14 (the `NFULA_*` attributes up to `NFULA_GID`); `NFULA_HWTYPE`,
//! `NFULA_HWHEADER`, `NFULA_HWLEN` in 2.6.27; `NFULA_CT`/`NFULA_CT_INFO` and the `CONNTRACK`
//! flag in 4.7; `NFULA_VLAN`/`NFULA_L2HDR` in 4.8. Kernel-side defaults
//! (`net/netfilter/nfnetlink_log.c`): copy range 65531, `NLBUFSIZ` `NLMSG_GOODSIZE`, flush
//! timeout 1 s, queue threshold 100 messages.

/// nfnetlink subsystem id of the packet logger (2.6.14).
pub const NFNL_SUBSYS_ULOG: u16 = 4;

/// Kernel → user: a logged packet (2.6.14).
pub const NFULNL_MSG_PACKET: u16 = 0;
/// User → kernel: configure an instance (group) (2.6.14).
pub const NFULNL_MSG_CONFIG: u16 = 1;

/// `struct nfulnl_msg_packet_hdr` (`hw_protocol` be16, `hook` u8, pad).
pub const NFULA_PACKET_HDR: u16 = 1;
/// Packet mark (be32).
pub const NFULA_MARK: u16 = 2;
/// `struct nfulnl_msg_packet_timestamp` (be64 sec, be64 usec).
pub const NFULA_TIMESTAMP: u16 = 3;
/// Input interface index (be32).
pub const NFULA_IFINDEX_INDEV: u16 = 4;
/// Output interface index (be32).
pub const NFULA_IFINDEX_OUTDEV: u16 = 5;
/// Physical input interface (bridge port) index (be32).
pub const NFULA_IFINDEX_PHYSINDEV: u16 = 6;
/// Physical output interface (bridge port) index (be32).
pub const NFULA_IFINDEX_PHYSOUTDEV: u16 = 7;
/// `struct nfulnl_msg_packet_hw` (be16 length, pad, 8 address bytes).
pub const NFULA_HWADDR: u16 = 8;
/// The packet from the network header on, up to the copy range.
pub const NFULA_PAYLOAD: u16 = 9;
/// The rule's `--nflog-prefix`, NUL-terminated.
pub const NFULA_PREFIX: u16 = 10;
/// UID of the socket owner (be32).
pub const NFULA_UID: u16 = 11;
/// Instance-local sequence number (be32; with `NFULNL_CFG_F_SEQ`).
pub const NFULA_SEQ: u16 = 12;
/// Sequence number across every instance of the namespace (be32; `NFULNL_CFG_F_SEQ_GLOBAL`).
pub const NFULA_SEQ_GLOBAL: u16 = 13;
/// GID of the socket owner (be32).
pub const NFULA_GID: u16 = 14;
/// Hardware type of the input device (`ARPHRD_*`, be16; 2.6.27).
pub const NFULA_HWTYPE: u16 = 15;
/// Hardware (link-layer) header (2.6.27).
pub const NFULA_HWHEADER: u16 = 16;
/// Hardware header length (be16; 2.6.27).
pub const NFULA_HWLEN: u16 = 17;
/// Conntrack entry, nested ctnetlink attributes (4.7, `NFULNL_CFG_F_CONNTRACK`).
pub const NFULA_CT: u16 = 18;
/// `enum ip_conntrack_info` (be32; 4.7).
pub const NFULA_CT_INFO: u16 = 19;
/// VLAN, nested `NFULA_VLAN_*` (4.8; bridge and netdev families).
pub const NFULA_VLAN: u16 = 20;
/// The whole layer-2 header (4.8; bridge and netdev families).
pub const NFULA_L2HDR: u16 = 21;

/// `NFULA_VLAN` nested: the VLAN protocol (be16).
pub const NFULA_VLAN_PROTO: u16 = 1;
/// `NFULA_VLAN` nested: the tag control information (be16).
pub const NFULA_VLAN_TCI: u16 = 2;

/// Config command: bind this socket to a group (2.6.14).
pub const NFULNL_CFG_CMD_BIND: u8 = 1;
/// Config command: unbind a group (2.6.14).
pub const NFULNL_CFG_CMD_UNBIND: u8 = 2;
/// Config command: make nfnetlink_log the logger of an address family (`nfgen_family`) in
/// this namespace, for packets logged through the generic `nf_log` calls (2.6.14).
pub const NFULNL_CFG_CMD_PF_BIND: u8 = 3;
/// Config command: stop being the logger of an address family (2.6.14).
pub const NFULNL_CFG_CMD_PF_UNBIND: u8 = 4;

/// Config attribute: `struct nfulnl_msg_config_cmd` (one byte).
pub const NFULA_CFG_CMD: u16 = 1;
/// Config attribute: `struct nfulnl_msg_config_mode` (be32 range, u8 mode, pad).
pub const NFULA_CFG_MODE: u16 = 2;
/// Config attribute: kernel buffer per batch, bytes (be32).
pub const NFULA_CFG_NLBUFSIZ: u16 = 3;
/// Config attribute: flush timeout, 1/100 s (be32).
pub const NFULA_CFG_TIMEOUT: u16 = 4;
/// Config attribute: messages per batch (be32).
pub const NFULA_CFG_QTHRESH: u16 = 5;
/// Config attribute: `NFULNL_CFG_F_*` flags (be16).
pub const NFULA_CFG_FLAGS: u16 = 6;

/// Copy mode: nothing.
pub const NFULNL_COPY_NONE: u8 = 0;
/// Copy mode: metadata only.
pub const NFULNL_COPY_META: u8 = 1;
/// Copy mode: metadata and the packet up to the copy range.
pub const NFULNL_COPY_PACKET: u8 = 2;

/// Flag: number messages per instance (`NFULA_SEQ`; 2.6.14).
pub const NFULNL_CFG_F_SEQ: u16 = 0x0001;
/// Flag: number messages across instances (`NFULA_SEQ_GLOBAL`; 2.6.14).
pub const NFULNL_CFG_F_SEQ_GLOBAL: u16 = 0x0002;
/// Flag: attach the conntrack entry (`NFULA_CT`; 4.7, needs nf_conntrack_netlink).
pub const NFULNL_CFG_F_CONNTRACK: u16 = 0x0004;

/// Largest copy range (`NFULNL_COPY_RANGE_MAX`: an attribute length is a u16).
pub const NFULNL_COPY_RANGE_MAX: u32 = 0xffff - 4;
/// Largest `NFULA_CFG_NLBUFSIZ` the kernel accepts (larger values are ignored silently).
pub const NFULNL_NLBUFSIZ_MAX: u32 = 131_072;

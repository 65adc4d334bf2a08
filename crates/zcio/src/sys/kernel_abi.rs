//! The kernel ABI zcio types by hand, checked at compile time against `linux-raw-sys` (the
//! kernel's UAPI headers run through bindgen, per architecture): every constant and struct
//! layout that crate carries must agree, so a typo or an ABI drift fails the build.
//!
//! What `linux-raw-sys` 0.12 has nothing for stays hand-typed, checked against numbers from
//! the headers (`assert_layout!` where it is defined): the nfqueue ABI
//! (`linux/netfilter/nfnetlink_queue.h`, `nfnetlink.h`: every `NFQ*`/`NFNL*` constant,
//! `nfgenmsg`), the nfnetlink_log ABI (`sys::nflog`, `nfnetlink_log.h`), the ctnetlink ABI
//! (`sys::ctnetlink`, `nfnetlink_conntrack.h`, `nf_conntrack_common.h`), `SK_MEMINFO_*`, the zcrx control and query ABI of 6.19/7.1 (`zcrx_ctrl`,
//! `io_uring_query_hdr`, `io_uring_query_zcrx`, `ZCRX_REG_NODEV`, `IORING_REGISTER_QUERY`,
//! `IORING_REGISTER_ZCRX_CTRL`, `ZCRX_CTRL_FLUSH_RQ`, `IO_URING_QUERY_ZCRX`), the
//! `MSG_ZEROCOPY` ABI (`MSG_ZEROCOPY`, `SO_EE_ORIGIN_ZEROCOPY`, `SO_EE_CODE_ZEROCOPY_COPIED`,
//! `sock_extended_err`, which `libc` checks), `UDP_SEGMENT`, `CMSG_IP(V6)_RECVERR`,
//! `IORING_ZCRX_AREA_MASK` (a C macro), `ethtool_drvinfo`, and zcio's own frame header
//! (`buf::frames::FrameHdr`, not a kernel struct). `NLMSG_HDRLEN`/`NLA_HDRLEN` (C macros) are
//! checked against the sizes of `nlmsghdr`/`nlattr`. The list is also in
//! `docs/design/surface.md`.

use linux_raw_sys as lrs;

/// Our constant equals the kernel's (compared as `i128`, so signedness and width of the two
/// declarations may differ, the value may not).
macro_rules! same_value {
    ($ours:path, $kernel:path) => {
        const _: () = assert!($ours as i128 == $kernel as i128);
    };
}

/// Our struct has the kernel's size, alignment and field offsets (`ours => kernel` names).
macro_rules! same_layout {
    ($ours:ty, $kernel:ty $(, $f:ident => $kf:ident)* $(,)?) => {
        const _: () = {
            assert!(std::mem::size_of::<$ours>() == std::mem::size_of::<$kernel>());
            assert!(std::mem::align_of::<$ours>() == std::mem::align_of::<$kernel>());
            $( assert!(std::mem::offset_of!($ours, $f) == std::mem::offset_of!($kernel, $kf)); )*
        };
    };
}
pub(crate) use same_layout;

// Constants.
same_value!(super::SO_ZEROCOPY, lrs::net::SO_ZEROCOPY);
same_value!(super::IP_RECVERR, lrs::net::IP_RECVERR);
same_value!(super::IPV6_RECVERR, lrs::net::IPV6_RECVERR);
same_value!(super::SOL_UDP, lrs::net::SOL_UDP);
same_value!(
    super::IORING_RECVSEND_POLL_FIRST,
    lrs::io_uring::IORING_RECVSEND_POLL_FIRST
);
same_value!(
    super::IORING_RECV_MULTISHOT,
    lrs::io_uring::IORING_RECV_MULTISHOT
);
same_value!(
    super::IORING_RECVSEND_FIXED_BUF,
    lrs::io_uring::IORING_RECVSEND_FIXED_BUF
);
same_value!(
    super::IORING_SEND_ZC_REPORT_USAGE,
    lrs::io_uring::IORING_SEND_ZC_REPORT_USAGE
);
same_value!(
    super::IORING_RECVSEND_BUNDLE,
    lrs::io_uring::IORING_RECVSEND_BUNDLE
);
same_value!(
    super::IORING_NOTIF_USAGE_ZC_COPIED,
    lrs::io_uring::IORING_NOTIF_USAGE_ZC_COPIED
);
same_value!(super::IORING_CQE_F_MORE, lrs::io_uring::IORING_CQE_F_MORE);
same_value!(super::IORING_CQE_F_NOTIF, lrs::io_uring::IORING_CQE_F_NOTIF);
same_value!(
    super::IORING_CQE_F_BUFFER,
    lrs::io_uring::IORING_CQE_F_BUFFER
);
same_value!(
    super::IORING_CQE_F_BUF_MORE,
    lrs::io_uring::IORING_CQE_F_BUF_MORE
);
same_value!(
    super::IORING_CQE_F_SOCK_NONEMPTY,
    lrs::io_uring::IORING_CQE_F_SOCK_NONEMPTY
);
same_value!(
    super::IORING_POLL_ADD_MULTI,
    lrs::io_uring::IORING_POLL_ADD_MULTI
);
same_value!(
    super::IORING_POLL_UPDATE_EVENTS,
    lrs::io_uring::IORING_POLL_UPDATE_EVENTS
);
same_value!(
    super::IORING_POLL_UPDATE_USER_DATA,
    lrs::io_uring::IORING_POLL_UPDATE_USER_DATA
);
same_value!(
    super::IORING_POLL_ADD_LEVEL,
    lrs::io_uring::IORING_POLL_ADD_LEVEL
);
same_value!(
    super::IORING_SQ_CQ_OVERFLOW,
    lrs::io_uring::IORING_SQ_CQ_OVERFLOW
);
same_value!(super::CAP_NET_ADMIN, lrs::general::CAP_NET_ADMIN);
same_value!(super::CAP_IPC_LOCK, lrs::general::CAP_IPC_LOCK);
same_value!(super::netlink::NETLINK_ROUTE, lrs::netlink::NETLINK_ROUTE);
same_value!(
    super::netlink::NETLINK_NETFILTER,
    lrs::netlink::NETLINK_NETFILTER
);
same_value!(super::netlink::SOL_NETLINK, lrs::net::SOL_NETLINK);
same_value!(
    super::netlink::NETLINK_NO_ENOBUFS,
    lrs::netlink::NETLINK_NO_ENOBUFS
);
same_value!(
    super::netlink::NETLINK_CAP_ACK,
    lrs::netlink::NETLINK_CAP_ACK
);
same_value!(
    super::netlink::NETLINK_EXT_ACK,
    lrs::netlink::NETLINK_EXT_ACK
);
same_value!(super::netlink::SO_RCVBUFFORCE, lrs::net::SO_RCVBUFFORCE);
same_value!(
    super::netlink::NETLINK_ADD_MEMBERSHIP,
    lrs::netlink::NETLINK_ADD_MEMBERSHIP
);
same_value!(
    super::netlink::NETLINK_BROADCAST_ERROR,
    lrs::netlink::NETLINK_BROADCAST_ERROR
);
same_value!(super::netlink::SO_MEMINFO, lrs::net::SO_MEMINFO);
same_value!(super::netlink::NLMSG_ALIGNTO, lrs::netlink::NLMSG_ALIGNTO);
same_value!(super::netlink::NLMSG_NOOP, lrs::netlink::NLMSG_NOOP);
same_value!(super::netlink::NLMSG_ERROR, lrs::netlink::NLMSG_ERROR);
same_value!(super::netlink::NLMSG_DONE, lrs::netlink::NLMSG_DONE);
same_value!(super::netlink::NLMSG_OVERRUN, lrs::netlink::NLMSG_OVERRUN);
same_value!(super::netlink::NLM_F_REQUEST, lrs::netlink::NLM_F_REQUEST);
same_value!(super::netlink::NLM_F_MULTI, lrs::netlink::NLM_F_MULTI);
same_value!(super::netlink::NLM_F_ACK, lrs::netlink::NLM_F_ACK);
same_value!(super::netlink::NLM_F_DUMP, lrs::netlink::NLM_F_DUMP);
same_value!(
    super::netlink::NLM_F_DUMP_INTR,
    lrs::netlink::NLM_F_DUMP_INTR
);
same_value!(super::netlink::NLA_F_NESTED, lrs::netlink::NLA_F_NESTED);
same_value!(
    super::netlink::NLA_F_NET_BYTEORDER,
    lrs::netlink::NLA_F_NET_BYTEORDER
);
// `~(NLA_F_NESTED | NLA_F_NET_BYTEORDER)`: an `int` (-49153) in C, our `u16` holds its low
// 16 bits (the width of `nla_type`).
const _: () = assert!(super::netlink::NLA_TYPE_MASK == lrs::netlink::NLA_TYPE_MASK as u16);
same_value!(super::netlink::RTM_GETLINK, lrs::netlink::RTM_GETLINK);
same_value!(super::netlink::RTM_NEWLINK, lrs::netlink::RTM_NEWLINK);
same_value!(super::netlink::RTM_GETADDR, lrs::netlink::RTM_GETADDR);
same_value!(super::netlink::RTM_NEWADDR, lrs::netlink::RTM_NEWADDR);
same_value!(super::netlink::RTM_GETROUTE, lrs::netlink::RTM_GETROUTE);
same_value!(super::netlink::RTM_NEWROUTE, lrs::netlink::RTM_NEWROUTE);
same_value!(super::netlink::RTM_GETNEIGH, lrs::netlink::RTM_GETNEIGH);
same_value!(super::netlink::RTM_NEWNEIGH, lrs::netlink::RTM_NEWNEIGH);
same_value!(
    super::nfqueue::NETLINK_NETFILTER,
    lrs::netlink::NETLINK_NETFILTER
);
same_value!(super::nfqueue::NF_DROP, lrs::net::NF_DROP);
same_value!(super::nfqueue::NF_ACCEPT, lrs::net::NF_ACCEPT);
same_value!(super::nfqueue::NF_QUEUE, lrs::net::NF_QUEUE);
same_value!(super::nfqueue::NF_REPEAT, lrs::net::NF_REPEAT);
same_value!(
    super::zcrx::IORING_ZCRX_AREA_SHIFT,
    lrs::io_uring::IORING_ZCRX_AREA_SHIFT
);
same_value!(
    super::zcrx::IORING_MEM_REGION_TYPE_USER,
    lrs::io_uring::IORING_MEM_REGION_TYPE_USER
);
same_value!(
    super::zcrx::IORING_ZCRX_AREA_DMABUF,
    lrs::io_uring::io_uring_zcrx_area_flags::IORING_ZCRX_AREA_DMABUF
);
same_value!(
    super::zcrx::IORING_REGISTER_ZCRX_IFQ,
    lrs::io_uring::io_uring_register_op::IORING_REGISTER_ZCRX_IFQ
);
same_value!(
    super::zcrx::IORING_OP_RECV_ZC,
    lrs::io_uring::io_uring_op::IORING_OP_RECV_ZC
);

// Structs zcio takes from the `io-uring` crate: the same as the kernel's.
same_layout!(
    super::zcrx::io_uring_zcrx_rqe,
    lrs::io_uring::io_uring_zcrx_rqe,
    off => off,
    len => len,
);
same_layout!(
    super::zcrx::io_uring_zcrx_cqe,
    lrs::io_uring::io_uring_zcrx_cqe,
    off => off,
);
same_layout!(
    super::zcrx::io_uring_zcrx_area_reg,
    lrs::io_uring::io_uring_zcrx_area_reg,
    addr => addr,
    len => len,
    rq_area_token => rq_area_token,
    flags => flags,
    dmabuf_fd => dmabuf_fd,
);
same_layout!(
    super::zcrx::io_uring_region_desc,
    lrs::io_uring::io_uring_region_desc,
    user_addr => user_addr,
    size => size,
    flags => flags,
    id => id,
    mmap_offset => mmap_offset,
);
same_layout!(
    super::zcrx::io_uring_zcrx_ifq_reg,
    lrs::io_uring::io_uring_zcrx_ifq_reg,
    if_idx => if_idx,
    if_rxq => if_rxq,
    rq_entries => rq_entries,
    flags => flags,
    area_ptr => area_ptr,
    region_ptr => region_ptr,
    offsets => offsets,
    zcrx_id => zcrx_id,
);
same_layout!(libc::epoll_event, lrs::general::epoll_event, events => events, u64 => data);
same_layout!(
    crate::buf::bufring::IoUringBuf,
    lrs::io_uring::io_uring_buf,
    addr => addr,
    len => len,
    bid => bid,
    resv => resv,
);
// `NLMSG_HDRLEN` and `NLA_HDRLEN` are C macros (aligned header sizes): the headers' sizes,
// already multiples of `NLMSG_ALIGNTO`.
const _: () =
    assert!(super::netlink::NLMSG_HDRLEN == size_of_val_aligned::<lrs::netlink::nlmsghdr>());
const _: () = assert!(super::netlink::NLA_HDRLEN == size_of_val_aligned::<lrs::netlink::nlattr>());

const fn size_of_val_aligned<T>() -> usize {
    let a = super::netlink::NLMSG_ALIGNTO;
    (std::mem::size_of::<T>() + a - 1) & !(a - 1)
}

// The audit netlink ABI (`sys::audit`, `linux/audit.h`; linux-raw-sys's `ptrace` module).
same_value!(super::audit::NETLINK_AUDIT, lrs::netlink::NETLINK_AUDIT);
same_value!(
    super::audit::AUDIT_NLGRP_READLOG,
    lrs::ptrace::audit_nlgrps::AUDIT_NLGRP_READLOG
);
same_value!(super::audit::AUDIT_GET, lrs::ptrace::AUDIT_GET);
same_value!(super::audit::AUDIT_SET, lrs::ptrace::AUDIT_SET);
same_value!(super::audit::AUDIT_SYSCALL, lrs::ptrace::AUDIT_SYSCALL);
same_value!(super::audit::AUDIT_EOE, lrs::ptrace::AUDIT_EOE);
same_value!(super::audit::AUDIT_REPLACE, lrs::ptrace::AUDIT_REPLACE);
same_value!(super::audit::AUDIT_KERNEL, lrs::ptrace::AUDIT_KERNEL);
same_value!(
    super::audit::AUDIT_FIRST_USER_MSG,
    lrs::ptrace::AUDIT_FIRST_USER_MSG
);
same_value!(
    super::audit::AUDIT_LAST_USER_MSG,
    lrs::ptrace::AUDIT_LAST_USER_MSG
);
same_value!(
    super::audit::AUDIT_FIRST_USER_MSG2,
    lrs::ptrace::AUDIT_FIRST_USER_MSG2
);
same_value!(
    super::audit::AUDIT_LAST_USER_MSG2,
    lrs::ptrace::AUDIT_LAST_USER_MSG2
);
same_value!(
    super::audit::AUDIT_STATUS_ENABLED,
    lrs::ptrace::AUDIT_STATUS_ENABLED
);
same_value!(
    super::audit::AUDIT_STATUS_FAILURE,
    lrs::ptrace::AUDIT_STATUS_FAILURE
);
same_value!(
    super::audit::AUDIT_STATUS_PID,
    lrs::ptrace::AUDIT_STATUS_PID
);
same_value!(
    super::audit::AUDIT_STATUS_RATE_LIMIT,
    lrs::ptrace::AUDIT_STATUS_RATE_LIMIT
);
same_value!(
    super::audit::AUDIT_STATUS_BACKLOG_LIMIT,
    lrs::ptrace::AUDIT_STATUS_BACKLOG_LIMIT
);
same_value!(
    super::audit::AUDIT_STATUS_BACKLOG_WAIT_TIME,
    lrs::ptrace::AUDIT_STATUS_BACKLOG_WAIT_TIME
);
same_value!(
    super::audit::AUDIT_STATUS_LOST,
    lrs::ptrace::AUDIT_STATUS_LOST
);
same_layout!(
    super::audit::AuditStatus,
    lrs::ptrace::audit_status,
    mask => mask,
    enabled => enabled,
    failure => failure,
    pid => pid,
    rate_limit => rate_limit,
    backlog_limit => backlog_limit,
    lost => lost,
    backlog => backlog,
    feature_bitmap => __bindgen_anon_1,
    backlog_wait_time => backlog_wait_time,
    backlog_wait_time_actual => backlog_wait_time_actual,
);

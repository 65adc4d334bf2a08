//! Linux audit netlink ABI (`include/uapi/linux/audit.h`, `include/uapi/linux/netlink.h`),
//! checked against `linux-raw-sys` in `sys::kernel_abi`.
//!
//! `NETLINK_AUDIT` and `AUDIT_GET`/`AUDIT_SET` with `struct audit_status` date from 2.6.6;
//! `backlog_wait_time` from 3.14, `AUDIT_NLGRP_READLOG` (the read-only multicast group,
//! `CAP_AUDIT_READ`) from 3.16, `backlog_wait_time_actual` from 5.9. The kernel reads and
//! writes only as many bytes of `audit_status` as the request carries, so the whole struct is
//! always sent.

/// Netlink protocol of the audit subsystem (2.6.6).
pub const NETLINK_AUDIT: i32 = 9;
/// The read-only multicast group of audit records (3.16; joining needs `CAP_AUDIT_READ`).
pub const AUDIT_NLGRP_READLOG: u32 = 1;

/// Request the kernel's audit status (`struct audit_status` back as an `AUDIT_GET` reply).
pub const AUDIT_GET: u16 = 1000;
/// Set what `audit_status.mask` names.
pub const AUDIT_SET: u16 = 1001;
/// First record type of a syscall event (the `SYSCALL` record).
pub const AUDIT_SYSCALL: u16 = 1300;
/// End-of-event record: the last record of a multi-record (syscall) event.
pub const AUDIT_EOE: u16 = 1320;
/// The kernel asks the registered daemon whether it is alive (a binary pid, not a record;
/// 4.10), e.g. when another process sets the pid.
pub const AUDIT_REPLACE: u16 = 1329;
/// User-space message range, first and last (single-record events).
pub const AUDIT_FIRST_USER_MSG: u16 = 1100;
/// See [`AUDIT_FIRST_USER_MSG`].
pub const AUDIT_LAST_USER_MSG: u16 = 1199;
/// Second user-space message range, first and last.
pub const AUDIT_FIRST_USER_MSG2: u16 = 2100;
/// See [`AUDIT_FIRST_USER_MSG2`].
pub const AUDIT_LAST_USER_MSG2: u16 = 2999;
/// The "audit initialized" kernel record.
pub const AUDIT_KERNEL: u16 = 2000;

/// `audit_status.mask` bits: which fields an `AUDIT_SET` sets.
pub const AUDIT_STATUS_ENABLED: u32 = 0x1;
/// See [`AUDIT_STATUS_ENABLED`].
pub const AUDIT_STATUS_FAILURE: u32 = 0x2;
/// See [`AUDIT_STATUS_ENABLED`].
pub const AUDIT_STATUS_PID: u32 = 0x4;
/// See [`AUDIT_STATUS_ENABLED`].
pub const AUDIT_STATUS_RATE_LIMIT: u32 = 0x8;
/// See [`AUDIT_STATUS_ENABLED`].
pub const AUDIT_STATUS_BACKLOG_LIMIT: u32 = 0x10;
/// See [`AUDIT_STATUS_ENABLED`] (3.14).
pub const AUDIT_STATUS_BACKLOG_WAIT_TIME: u32 = 0x20;
/// Reset the `lost` counter (the kernel answers with the value it reset).
pub const AUDIT_STATUS_LOST: u32 = 0x40;

/// `struct audit_status` (the `feature_bitmap`/`version` union is one `u32`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditStatus {
    /// Bit mask of the fields to set (`AUDIT_STATUS_*`).
    pub mask: u32,
    /// 0 off, 1 on, 2 on and locked.
    pub enabled: u32,
    /// Failure action: 0 silent, 1 printk, 2 panic.
    pub failure: u32,
    /// The registered audit daemon's pid (0: none).
    pub pid: u32,
    /// Records per second (0: no limit).
    pub rate_limit: u32,
    /// Records queued in the kernel before it drops (or waits).
    pub backlog_limit: u32,
    /// Records the kernel dropped (since boot or the last reset).
    pub lost: u32,
    /// Records queued now.
    pub backlog: u32,
    /// Feature bitmap (version).
    pub feature_bitmap: u32,
    /// How long a task waits for room in the backlog before its record is dropped (jiffies in
    /// the request; 0: drop at once).
    pub backlog_wait_time: u32,
    /// Time tasks spent waiting for room (5.9).
    pub backlog_wait_time_actual: u32,
}

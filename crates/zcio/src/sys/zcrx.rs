//! io_uring zero-copy receive (zcrx) ABI (Linux 6.15): interface queue registration, the user
//! memory area, the refill ring, and `RECV_ZC` completions (CQE32).
//!
//! The structs are those of the `io-uring` crate (`io_uring::types`); their layouts are checked
//! here against `include/uapi/linux/io_uring.h` so an ABI drift fails the build.

use super::assert_layout;
pub use io_uring::types::{
    io_uring_region_desc, io_uring_zcrx_area_reg, io_uring_zcrx_cqe, io_uring_zcrx_ifq_reg,
    io_uring_zcrx_rqe,
};

assert_layout!(io_uring_zcrx_rqe, size = 16, align = 8, off = 0, len = 8);
assert_layout!(io_uring_zcrx_cqe, size = 16, align = 8, off = 0);
assert_layout!(
    io_uring_zcrx_area_reg,
    size = 48,
    align = 8,
    addr = 0,
    len = 8,
    rq_area_token = 16,
    flags = 24,
    dmabuf_fd = 28
);
assert_layout!(
    io_uring_region_desc,
    size = 64,
    align = 8,
    user_addr = 0,
    size = 8,
    flags = 16,
    id = 20,
    mmap_offset = 24
);
assert_layout!(
    io_uring_zcrx_ifq_reg,
    size = 96,
    align = 8,
    if_idx = 0,
    if_rxq = 4,
    rq_entries = 8,
    flags = 12,
    area_ptr = 16,
    region_ptr = 24,
    offsets = 32,
    zcrx_id = 64
);

/// `IORING_ZCRX_AREA_SHIFT`: a CQE/RQE offset carries the area id above this bit (6.15).
pub const IORING_ZCRX_AREA_SHIFT: u32 = 48;
/// Mask of the in-area offset part of a zcrx offset.
pub const IORING_ZCRX_AREA_MASK: u64 = !((1u64 << IORING_ZCRX_AREA_SHIFT) - 1);
/// `IORING_MEM_REGION_TYPE_USER`: the region memory is supplied by user space (6.13).
pub const IORING_MEM_REGION_TYPE_USER: u32 = 1;
/// `IORING_ZCRX_AREA_DMABUF`: the area is a dma-buf rather than user memory (6.16).
pub const IORING_ZCRX_AREA_DMABUF: u32 = 1;
/// `IORING_OP_RECV_ZC` opcode number (6.15).
pub const IORING_OP_RECV_ZC: u8 = 58;

/// Splits a zcrx CQE/RQE offset into `(area id, byte offset in the area)`.
pub fn split_offset(off: u64) -> (u16, u64) {
    (
        (off >> IORING_ZCRX_AREA_SHIFT) as u16,
        off & !IORING_ZCRX_AREA_MASK,
    )
}

/// What an errno from `IORING_REGISTER_ZCRX_IFQ` means and what would fix it.
pub fn explain_register_errno(errno: i32) -> &'static str {
    match errno {
        libc::EOPNOTSUPP => {
            "the driver lacks the netdev queue management API (no page-pool memory provider \
             support for this device), so its rx queue cannot be bound to user memory"
        }
        libc::EINVAL => {
            "rejected as invalid: header/data split is off or hds-thresh is not 0 on the queue \
             (ethtool -G IF tcp-data-split on hds-thresh 0), the queue id is out of range, or \
             the ring lacks DEFER_TASKRUN|SINGLE_ISSUER|CQE32"
        }
        libc::EEXIST => "an XDP program is attached, or the rx queue is already bound",
        libc::EPERM => "needs CAP_NET_ADMIN",
        libc::ENODEV => "no such interface",
        libc::ERANGE => "the rx queue index is out of range",
        libc::ENOMEM => "not enough memory (or RLIMIT_MEMLOCK) for the area or refill ring",
        libc::EFAULT => "the kernel could not read the registration structures",
        libc::EBUSY => "the queue is busy (reconfiguration in progress)",
        libc::ENOENT => "the interface has no such rx queue",
        _ => "unexpected error from IORING_REGISTER_ZCRX_IFQ",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_split_into_area_and_byte_offset() {
        let off = (3u64 << IORING_ZCRX_AREA_SHIFT) | 0x1234;
        assert_eq!(split_offset(off), (3, 0x1234));
        assert_eq!(split_offset(0x10), (0, 0x10));
    }
}

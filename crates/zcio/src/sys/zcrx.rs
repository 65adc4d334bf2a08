//! io_uring zero-copy receive (zcrx) ABI (Linux 6.15): interface queue registration, the user
//! memory area, the refill ring, and `RECV_ZC` completions (CQE32); device-less registration
//! (`ZCRX_REG_NODEV`, 7.1), the control call that flushes the refill ring
//! (`IORING_REGISTER_ZCRX_CTRL`), and the capability query (`IORING_REGISTER_QUERY`).
//!
//! The registration structs are those of the `io-uring` crate (`io_uring::types`); the control
//! and query structs, which that crate lacks, are defined here from
//! `include/uapi/linux/io_uring/zcrx.h` and `.../query.h`. All layouts are checked at compile
//! time so an ABI drift fails the build.

use super::{assert_layout, syscall};
pub use io_uring::types::{
    io_uring_region_desc, io_uring_zcrx_area_reg, io_uring_zcrx_cqe, io_uring_zcrx_ifq_reg,
    io_uring_zcrx_rqe,
};
use std::io;
use std::os::fd::RawFd;

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

/// `ZCRX_REG_NODEV` (`io_uring_zcrx_ifq_reg.flags`, Linux 7.1): register without a network
/// device (`if_idx = if_rxq = 0`). Every byte `RECV_ZC` delivers is copied by the kernel into
/// the area, and nothing consumes the refill ring by itself: returns need
/// [`ZCRX_CTRL_FLUSH_RQ`]. Kernels without it answer `EINVAL`.
pub const ZCRX_REG_NODEV: u32 = 2;
/// `IORING_REGISTER_ZCRX_IFQ` (Linux 6.15): zcrx interface queue registration.
pub const IORING_REGISTER_ZCRX_IFQ: u32 = 32;
/// `IORING_REGISTER_QUERY` (Linux 6.18): capability queries, no ring needed (fd -1).
pub const IORING_REGISTER_QUERY: u32 = 35;
/// `IORING_REGISTER_ZCRX_CTRL` (Linux 6.19): control operations on a registered zcrx.
pub const IORING_REGISTER_ZCRX_CTRL: u32 = 36;
/// `zcrx_ctrl.op`: consume the refill ring now, returning its buffers to the area (6.19).
pub const ZCRX_CTRL_FLUSH_RQ: u32 = 0;
/// `io_uring_query_hdr.query_op`: zcrx capabilities (Linux 6.19).
pub const IO_URING_QUERY_ZCRX: u32 = 1;

/// `struct zcrx_ctrl` (argument of `IORING_REGISTER_ZCRX_CTRL`, `nr_args` 0). The 48-byte
/// union (`zc_export`, `zc_flush`, ...) is all reserved words for `ZCRX_CTRL_FLUSH_RQ`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcrx_ctrl {
    /// The id `IORING_REGISTER_ZCRX_IFQ` returned.
    pub zcrx_id: u32,
    /// `ZCRX_CTRL_*`.
    pub op: u32,
    /// Reserved, zero.
    pub resv: [u64; 2],
    /// The per-operation union; zero for `ZCRX_CTRL_FLUSH_RQ`.
    pub data: [u64; 6],
}
assert_layout!(
    zcrx_ctrl,
    size = 72,
    align = 8,
    zcrx_id = 0,
    op = 4,
    resv = 8,
    data = 24
);

/// `struct io_uring_query_hdr` (argument of `IORING_REGISTER_QUERY`, Linux 6.18).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct io_uring_query_hdr {
    /// Next header in a chain (0: none).
    pub next_entry: u64,
    /// Pointer to the query's result struct.
    pub query_data: u64,
    /// `IO_URING_QUERY_*`.
    pub query_op: u32,
    /// Size of the result struct.
    pub size: u32,
    /// 0 or `-errno`, set by the kernel.
    pub result: i32,
    /// Reserved.
    pub resv: [u32; 3],
}
assert_layout!(
    io_uring_query_hdr,
    size = 40,
    align = 8,
    next_entry = 0,
    query_data = 8,
    query_op = 16,
    size = 20,
    result = 24,
    resv = 28
);

/// `struct io_uring_query_zcrx` (result of `IO_URING_QUERY_ZCRX`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct io_uring_query_zcrx {
    /// Supported `ZCRX_REG_*` flags.
    pub register_flags: u64,
    /// Supported `IORING_ZCRX_AREA_*` flags.
    pub area_flags: u64,
    /// Number of `ZCRX_CTRL_*` operations.
    pub nr_ctrl_opcodes: u32,
    /// `ZCRX_FEATURE_*` bits (7.0; reserved before).
    pub features: u32,
    /// Refill ring header size.
    pub rq_hdr_size: u32,
    /// Refill ring header alignment.
    pub rq_hdr_alignment: u32,
    /// Reserved.
    pub resv2: u64,
}
assert_layout!(
    io_uring_query_zcrx,
    size = 40,
    align = 8,
    register_flags = 0,
    area_flags = 8,
    nr_ctrl_opcodes = 16,
    features = 20,
    rq_hdr_size = 24,
    rq_hdr_alignment = 28,
    resv2 = 32
);

/// Raw `io_uring_register(2)` for operations the `io-uring` crate does not wrap.
///
/// # Safety
///
/// `arg` must point to the struct (or array of `nr_args` structs) that `op` expects, valid for
/// reads and for the writes the kernel makes, for the duration of the call.
unsafe fn io_uring_register(
    fd: RawFd,
    op: u32,
    arg: *mut libc::c_void,
    nr_args: u32,
) -> io::Result<i64> {
    syscall!(syscall(libc::SYS_io_uring_register, fd, op, arg, nr_args))
}

/// `IORING_REGISTER_ZCRX_IFQ` (Linux 6.15): registers an interface rx queue (or, with
/// `ZCRX_REG_NODEV`, no device) with the io_uring `ring_fd`. The kernel reads `reg` and the
/// area and region descriptors it points at, and **writes back** into `reg` (`offsets`,
/// `zcrx_id`, the rounded `rq_entries`) and into the area descriptor (`rq_area_token`): hence
/// `&mut`, passed on as a `*mut` derived from it. io-uring 0.7's
/// `Submitter::register_ifq(&self, &io_uring_zcrx_ifq_reg)` takes a shared reference, through
/// which those writes are undefined behaviour (at opt-level 3 the caller reads back the zeroes
/// it stored); it must not be used (see [`super`]'s list, enforced by `clippy.toml`).
///
/// `reg.area_ptr` and `reg.region_ptr` must hold the addresses of live descriptors, taken
/// from `&mut` references (`std::ptr::from_mut(..) as u64`), that outlive the call.
pub fn register_ifq(ring_fd: RawFd, reg: &mut io_uring_zcrx_ifq_reg) -> io::Result<()> {
    // SAFETY: `reg` is exclusively borrowed for the call, so the kernel may write into it; the
    // descriptors it points at are the caller's contract above; nr_args is 1 as the kernel
    // requires.
    unsafe {
        io_uring_register(
            ring_fd,
            IORING_REGISTER_ZCRX_IFQ,
            std::ptr::from_mut(reg).cast(),
            1,
        )
    }
    .map(drop)
}

/// `IORING_REGISTER_ZCRX_CTRL` with `ZCRX_CTRL_FLUSH_RQ`: the kernel consumes every entry in
/// the refill ring of zcrx `zcrx_id` on the ring `ring_fd` now, returning the buffers to the
/// area. Needed in device-less mode, where no page pool consumes the ring.
pub fn zcrx_flush_rq(ring_fd: RawFd, zcrx_id: u32) -> io::Result<()> {
    let mut ctrl = zcrx_ctrl {
        zcrx_id,
        op: ZCRX_CTRL_FLUSH_RQ,
        ..Default::default()
    };
    // SAFETY: `ctrl` is a live zcrx_ctrl for the call; nr_args is 0 as the kernel requires.
    unsafe {
        io_uring_register(
            ring_fd,
            IORING_REGISTER_ZCRX_CTRL,
            (&mut ctrl as *mut zcrx_ctrl).cast(),
            0,
        )
    }
    .map(drop)
}

/// `IORING_REGISTER_QUERY` for `IO_URING_QUERY_ZCRX` (no ring needed). `Err` carries the
/// errno of the call (EINVAL before 6.18) or of the query (`hdr.result`, e.g. EOPNOTSUPP
/// when the kernel knows the call but not the zcrx query).
pub fn query_zcrx() -> io::Result<io_uring_query_zcrx> {
    let mut q = io_uring_query_zcrx::default();
    let mut hdr = io_uring_query_hdr {
        query_data: &mut q as *mut io_uring_query_zcrx as u64,
        query_op: IO_URING_QUERY_ZCRX,
        size: std::mem::size_of::<io_uring_query_zcrx>() as u32,
        ..Default::default()
    };
    // SAFETY: `hdr` and the `q` it points to live for the call; the kernel writes at most
    // `size` bytes into `q` and the result into `hdr`.
    unsafe {
        io_uring_register(
            -1,
            IORING_REGISTER_QUERY,
            (&mut hdr as *mut io_uring_query_hdr).cast(),
            0,
        )
    }?;
    if hdr.result < 0 {
        return Err(io::Error::from_raw_os_error(-hdr.result));
    }
    Ok(q)
}

/// Splits a zcrx CQE/RQE offset into `(area id, byte offset in the area)`.
pub fn split_offset(off: u64) -> (u16, u64) {
    (
        (off >> IORING_ZCRX_AREA_SHIFT) as u16,
        off & !IORING_ZCRX_AREA_MASK,
    )
}

/// What an errno from a device-less `IORING_REGISTER_ZCRX_IFQ` means.
pub fn explain_nodev_errno(errno: i32) -> &'static str {
    match errno {
        libc::EINVAL => "device-less zcrx needs Linux 7.1+ (EINVAL here)",
        libc::EPERM => "zcrx registration needs CAP_NET_ADMIN",
        libc::ENOMEM => "not enough memory (or RLIMIT_MEMLOCK) for the area or refill ring",
        libc::EOPNOTSUPP => "kernel built without CONFIG_IO_URING_ZCRX",
        _ => "unexpected error from device-less IORING_REGISTER_ZCRX_IFQ",
    }
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

//! Registration of an interface rx queue for zero-copy receive (`IORING_REGISTER_ZCRX_IFQ`),
//! or of a device-less zcrx (`ZCRX_REG_NODEV`, Linux 7.1), and the refill-ring flush the
//! device-less mode needs (`IORING_REGISTER_ZCRX_CTRL` / `ZCRX_CTRL_FLUSH_RQ`).

use super::Ring;
use crate::buf::{align_up, page_size, Region};
use crate::sys::zcrx::{
    explain_nodev_errno, explain_register_errno, io_uring_region_desc, io_uring_zcrx_area_reg,
    io_uring_zcrx_ifq_reg, IORING_MEM_REGION_TYPE_USER, ZCRX_REG_NODEV,
};
use io_uring::cqueue::Entry32;
use std::io;

/// A registered zcrx interface queue: the id, the area token and where the refill ring lives.
#[derive(Debug)]
pub struct IfqRegistration {
    /// `zcrx_id` the kernel assigned; goes into `RECV_ZC` SQEs.
    pub zcrx_id: u32,
    /// Token of the area (for the refill ring entries' area id).
    pub rq_area_token: u64,
    /// Offsets of head, tail and the RQE array within the refill region.
    pub head_off: u32,
    /// See `head_off`.
    pub tail_off: u32,
    /// See `head_off`.
    pub rqes_off: u32,
    /// Entries in the refill ring (the kernel may round up).
    pub rq_entries: u32,
}

/// What a zcrx instance is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZcrxBind<'a> {
    /// A NIC rx queue (flows must be steered to it).
    Queue {
        /// Interface name.
        iface: &'a str,
        /// Rx queue index.
        queue: u32,
    },
    /// No device (`ZCRX_REG_NODEV`, Linux 7.1): `RECV_ZC` on any TCP socket, the kernel copies
    /// into the area.
    NoDev,
}

impl ZcrxBind<'_> {
    /// Explains a registration errno for this kind of binding.
    pub fn explain(&self, errno: i32) -> &'static str {
        // A kernel without zcrx answers EINVAL (unknown register opcode) before looking at
        // the device: say that, not what a NIC would need (when the probe could not tell, the
        // errno is explained as usual).
        if errno == libc::EINVAL && super::features::kernel_has_recv_zc() == Some(false) {
            return "this kernel has no zcrx (IORING_REGISTER_ZCRX_IFQ and RECV_ZC need Linux \
                    6.15; device-less zcrx 7.1)";
        }
        match self {
            ZcrxBind::Queue { .. } => explain_register_errno(errno),
            ZcrxBind::NoDev => explain_nodev_errno(errno),
        }
    }
}

impl std::fmt::Display for ZcrxBind<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ZcrxBind::Queue { iface, queue } => write!(f, "{iface} rx queue {queue}"),
            ZcrxBind::NoDev => write!(f, "no device (ZCRX_REG_NODEV)"),
        }
    }
}

/// Why zcrx registration failed, with the errno explained.
#[derive(Debug, thiserror::Error)]
#[error("zcrx registration on {} failed: {explanation} ({source})", self.target())]
pub struct IfqError {
    /// Interface name (empty for a device-less registration).
    pub iface: String,
    /// Rx queue index.
    pub queue: u32,
    /// The registration was device-less (`ZCRX_REG_NODEV`).
    pub nodev: bool,
    /// What the errno means here.
    pub explanation: &'static str,
    /// The kernel's error.
    #[source]
    pub source: io::Error,
}

impl IfqError {
    pub(crate) fn new(bind: ZcrxBind<'_>, source: io::Error) -> Self {
        let (iface, queue, nodev) = match bind {
            ZcrxBind::Queue { iface, queue } => (iface.to_string(), queue, false),
            ZcrxBind::NoDev => (String::new(), 0, true),
        };
        Self {
            iface,
            queue,
            nodev,
            explanation: bind.explain(source.raw_os_error().unwrap_or(0)),
            source,
        }
    }

    /// What was being registered, in words.
    pub fn target(&self) -> String {
        if self.nodev {
            ZcrxBind::NoDev.to_string()
        } else {
            ZcrxBind::Queue {
                iface: &self.iface,
                queue: self.queue,
            }
            .to_string()
        }
    }
}

/// Size of the user-supplied refill-ring region for `rq_entries` entries.
pub fn refill_region_len(rq_entries: u32) -> usize {
    align_up(page_size() + rq_entries as usize * 16, page_size())
}

/// Registers `bind` (a NIC rx queue, or no device) with `area` as receive memory and `refill`
/// as the refill ring. Both regions must outlive the ring. Needs a ring with CQE32,
/// SINGLE_ISSUER and DEFER_TASKRUN, CAP_NET_ADMIN, and for a queue a NIC whose driver
/// supports the queue API with header split; device-less needs Linux 7.1.
pub fn register_ifq(
    ring: &Ring<Entry32>,
    bind: ZcrxBind<'_>,
    area: &Region,
    refill: &Region,
    rq_entries: u32,
) -> Result<IfqRegistration, IfqError> {
    use std::os::fd::AsRawFd;
    let fd = ring.raw().as_raw_fd();
    register_ifq_with(bind, area, refill, rq_entries, |reg| {
        crate::sys::zcrx::register_ifq(fd, reg)
    })
}

/// [`register_ifq`] with the `IORING_REGISTER_ZCRX_IFQ` call passed in as `kernel`: it gets
/// the registration struct as `&mut`, because the kernel writes the refill ring offsets, the
/// zcrx id and the rounded entry count back into it, and the area token into the area
/// descriptor `reg.area_ptr` points at. Everything the kernel writes is read back from those
/// two structs only after the call. (Separate so that Miri can check the pointer discipline
/// with a stand-in for the kernel's writes: `ifq_registration_reads_back_what_the_kernel_wrote`.)
fn register_ifq_with(
    bind: ZcrxBind<'_>,
    area: &Region,
    refill: &Region,
    rq_entries: u32,
    kernel: impl FnOnce(&mut io_uring_zcrx_ifq_reg) -> io::Result<()>,
) -> Result<IfqRegistration, IfqError> {
    let err = |source: io::Error| IfqError::new(bind, source);
    let (if_idx, queue, flags) = match bind {
        ZcrxBind::Queue { iface, queue } => (
            crate::sys::net::if_index(iface)
                .ok_or_else(|| err(io::Error::from_raw_os_error(libc::ENODEV)))?,
            queue,
            0,
        ),
        ZcrxBind::NoDev => (0, 0, ZCRX_REG_NODEV),
    };
    if refill.len() < refill_region_len(rq_entries) {
        return Err(err(io::Error::from_raw_os_error(libc::EINVAL)));
    }
    let mut area_reg: io_uring_zcrx_area_reg = zeroed_area();
    area_reg.addr = area.as_ptr() as u64;
    area_reg.len = area.len() as u64;
    let mut region: io_uring_region_desc = zeroed_region();
    region.user_addr = refill.as_ptr() as u64;
    region.size = refill.len() as u64;
    region.flags = IORING_MEM_REGION_TYPE_USER;
    let mut reg: io_uring_zcrx_ifq_reg = zeroed_ifq();
    reg.if_idx = if_idx;
    reg.if_rxq = queue;
    reg.rq_entries = rq_entries;
    reg.flags = flags;
    // Addresses taken from `&mut`: the kernel writes `rq_area_token` through the first.
    reg.area_ptr = std::ptr::from_mut(&mut area_reg) as u64;
    reg.region_ptr = std::ptr::from_mut(&mut region) as u64;
    kernel(&mut reg).map_err(err)?;
    Ok(IfqRegistration {
        zcrx_id: reg.zcrx_id,
        rq_area_token: area_reg.rq_area_token,
        head_off: reg.offsets.head,
        tail_off: reg.offsets.tail,
        rqes_off: reg.offsets.rqes,
        rq_entries: reg.rq_entries,
    })
}

/// Asks the kernel to consume the refill ring of zcrx `zcrx_id` now (`ZCRX_CTRL_FLUSH_RQ`).
pub fn flush_refill<C: io_uring::cqueue::EntryMarker>(
    ring: &Ring<C>,
    zcrx_id: u32,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    crate::sys::zcrx::zcrx_flush_rq(ring.raw().as_raw_fd(), zcrx_id)
}

fn zeroed_area() -> io_uring_zcrx_area_reg {
    // SAFETY: plain C struct of integers; all-zero is valid.
    unsafe { std::mem::zeroed() }
}
fn zeroed_region() -> io_uring_region_desc {
    // SAFETY: plain C struct of integers; all-zero is valid.
    unsafe { std::mem::zeroed() }
}
fn zeroed_ifq() -> io_uring_zcrx_ifq_reg {
    // SAFETY: plain C struct of integers; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registration reads back what the kernel writes into the registration struct and
    /// the area descriptor. No kernel takes part: `kernel` makes the writes the kernel's
    /// `io_register_zcrx_ifq` makes (`copy_to_user` of the struct with `offsets`, `zcrx_id`
    /// and the rounded `rq_entries`, and of the area descriptor with `rq_area_token`),
    /// through the pointers it was given. What it checks is the pointer discipline, under
    /// Miri (`scripts/miri`): had the struct been reached through a shared reference — as
    /// io-uring 0.7's `Submitter::register_ifq(&reg)` does — Miri reports the write as
    /// undefined behaviour, which at opt-level 3 makes the caller read back zeroes and refuse
    /// the refill ring. The kernel path itself runs in the 7.x guest
    /// (`tests/zcrx.rs`, the CLI and C receiver tests in `scripts/vmtest`).
    #[test]
    fn ifq_registration_reads_back_what_the_kernel_wrote() {
        let area = Region::new(64 << 10, false).unwrap();
        let refill = Region::new(refill_region_len(16), false).unwrap();
        let got = register_ifq_with(ZcrxBind::NoDev, &area, &refill, 10, |reg| {
            assert_eq!(reg.flags, ZCRX_REG_NODEV);
            assert_eq!(reg.rq_entries, 10);
            // The kernel reaches the area descriptor by the address in `area_ptr`, whose
            // provenance the `as u64` cast exposed.
            let area_reg = reg.area_ptr as usize as *mut io_uring_zcrx_area_reg;
            // SAFETY: `area_ptr` is the address of the live area descriptor (see above).
            unsafe { (*area_reg).rq_area_token = 7 << 48 };
            reg.offsets.head = 0;
            reg.offsets.tail = 4;
            reg.offsets.rqes = 64;
            reg.zcrx_id = 3;
            reg.rq_entries = 16;
            Ok(())
        })
        .unwrap();
        assert_eq!(got.zcrx_id, 3);
        assert_eq!(got.rq_area_token, 7 << 48);
        assert_eq!((got.head_off, got.tail_off, got.rqes_off), (0, 4, 64));
        assert_eq!(got.rq_entries, 16);
    }
}

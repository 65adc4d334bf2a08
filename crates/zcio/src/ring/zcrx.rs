//! Registration of an interface rx queue for zero-copy receive (`IORING_REGISTER_ZCRX_IFQ`).

use super::Ring;
use crate::buf::{align_up, page_size, Region};
use crate::sys::zcrx::{
    explain_register_errno, io_uring_region_desc, io_uring_zcrx_area_reg, io_uring_zcrx_ifq_reg,
    IORING_MEM_REGION_TYPE_USER,
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

/// Why zcrx registration failed, with the errno explained.
#[derive(Debug, thiserror::Error)]
#[error("zcrx registration on {iface} rx queue {queue} failed: {explanation} ({source})")]
pub struct IfqError {
    /// Interface name.
    pub iface: String,
    /// Rx queue index.
    pub queue: u32,
    /// What the errno means here.
    pub explanation: &'static str,
    /// The kernel's error.
    #[source]
    pub source: io::Error,
}

/// Size of the user-supplied refill-ring region for `rq_entries` entries.
pub fn refill_region_len(rq_entries: u32) -> usize {
    align_up(page_size() + rq_entries as usize * 16, page_size())
}

/// Registers `iface`'s rx queue `queue` with `area` as receive memory and `refill` as the
/// refill ring. Both regions must outlive the ring. Needs a ring with CQE32, SINGLE_ISSUER and
/// DEFER_TASKRUN, CAP_NET_ADMIN, and a NIC whose driver supports the queue API with header
/// split.
pub fn register_ifq(
    ring: &Ring<Entry32>,
    iface: &str,
    queue: u32,
    area: &Region,
    refill: &Region,
    rq_entries: u32,
) -> Result<IfqRegistration, IfqError> {
    let err = |source: io::Error| IfqError {
        iface: iface.to_string(),
        queue,
        explanation: explain_register_errno(source.raw_os_error().unwrap_or(0)),
        source,
    };
    let if_idx = crate::sys::net::if_index(iface)
        .ok_or_else(|| err(io::Error::from_raw_os_error(libc::ENODEV)))?;
    if refill.len() < refill_region_len(rq_entries) {
        return Err(err(io::Error::from_raw_os_error(libc::EINVAL)));
    }
    // SAFETY (zeroed): these are plain C structs for which all-zero is the "unset" value.
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
    reg.area_ptr = &mut area_reg as *mut _ as u64;
    reg.region_ptr = &mut region as *mut _ as u64;
    ring.raw().submitter().register_ifq(&reg).map_err(err)?;
    Ok(IfqRegistration {
        zcrx_id: reg.zcrx_id,
        rq_area_token: area_reg.rq_area_token,
        head_off: reg.offsets.head,
        tail_off: reg.offsets.tail,
        rqes_off: reg.offsets.rqes,
        rq_entries: reg.rq_entries,
    })
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

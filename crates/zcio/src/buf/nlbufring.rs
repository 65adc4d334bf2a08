//! A minimal io_uring provided-buffer ring (`IORING_REGISTER_PBUF_RING`, Linux 5.19) whose
//! buffers are netlink frames. Written for the netlink frame ring only; the general one for
//! `rx` lives in `buf::bufring` (to be unified later: both are the same `io_uring_buf` array).
#![allow(unsafe_code)]

use super::Region;
use crate::ring::Ring;
use crate::sys::assert_layout;
use std::io;
use std::sync::atomic::{AtomicU16, Ordering};

/// `struct io_uring_buf` (`linux/io_uring.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IoUringBuf {
    /// Buffer address.
    pub addr: u64,
    /// Buffer length.
    pub len: u32,
    /// Buffer id (the frame index).
    pub bid: u16,
    /// In entry 0: the ring tail, written by user space.
    pub resv: u16,
}
assert_layout!(
    IoUringBuf,
    size = 16,
    align = 8,
    addr = 0,
    len = 8,
    bid = 12,
    resv = 14
);

/// A provided-buffer ring registered with one io_uring under group id `bgid`.
#[derive(Debug)]
pub struct NlBufRing {
    mem: Region,
    entries: u16,
    tail: u16,
    bgid: u16,
    registered: bool,
}

impl NlBufRing {
    /// Maps a ring of `entries` (a power of two, ≤ 32768) and registers it with `ring`.
    pub fn register(ring: &Ring, entries: u16, bgid: u16) -> io::Result<Self> {
        if !entries.is_power_of_two() || entries > 32768 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "buffer ring entries must be a power of two ≤ 32768",
            ));
        }
        let mem = Region::new(entries as usize * std::mem::size_of::<IoUringBuf>(), false)?;
        // SAFETY: `mem` is a page-aligned mapping of `entries` io_uring_buf slots that this
        // value keeps alive until it unregisters the ring in `drop`.
        unsafe {
            ring.raw().submitter().register_buf_ring_with_flags(
                mem.as_ptr() as u64,
                entries,
                bgid,
                0,
            )?
        };
        Ok(Self {
            mem,
            entries,
            tail: 0,
            bgid,
            registered: true,
        })
    }

    /// Group id.
    pub fn bgid(&self) -> u16 {
        self.bgid
    }

    /// Writes one buffer into the next slot; it becomes visible at [`NlBufRing::publish`].
    ///
    /// # Safety
    ///
    /// `addr..addr+len` must stay valid for writes, and untouched by the caller, until the
    /// kernel hands the buffer back in a CQE carrying `bid` (or the ring is unregistered).
    pub unsafe fn push(&mut self, addr: *mut u8, len: u32, bid: u16) {
        let idx = (self.tail & (self.entries - 1)) as usize;
        let slot = self.mem.as_ptr().cast::<IoUringBuf>().wrapping_add(idx);
        // SAFETY: `idx < entries`, so `slot` is inside the mapping; the kernel only reads
        // slots between its head and our published tail, and this one is past the tail.
        unsafe {
            std::ptr::addr_of_mut!((*slot).addr).write(addr as u64);
            std::ptr::addr_of_mut!((*slot).len).write(len);
            std::ptr::addr_of_mut!((*slot).bid).write(bid);
        }
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes every pushed buffer visible to the kernel (release store of the tail).
    pub fn publish(&mut self) {
        // SAFETY: the tail lives at offset 14 of the first slot, 2-byte aligned, inside the
        // mapping; the kernel reads it with acquire semantics.
        let tail = unsafe { &*(self.mem.as_ptr().add(14) as *const AtomicU16) };
        tail.store(self.tail, Ordering::Release);
    }

    /// Unregisters from `ring` (required before the ring or the frames go away).
    pub fn unregister(&mut self, ring: &Ring) -> io::Result<()> {
        if self.registered {
            self.registered = false;
            ring.raw().submitter().unregister_buf_ring(self.bgid)?;
        }
        Ok(())
    }
}

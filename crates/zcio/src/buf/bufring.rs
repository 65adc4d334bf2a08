//! Provided-buffer rings (`IORING_REGISTER_PBUF_RING`, Linux 5.19): a ring of
//! `struct io_uring_buf {addr, len, bid, resv}` entries from which the kernel picks a buffer
//! for each receive, and which user space refills by writing entries at the tail and
//! publishing the tail (the `resv` field of entry 0) with release ordering.
//!
//! The ring memory is allocated by the kernel and mmap'd (`IOU_PBUF_RING_MMAP`, 6.4) where the
//! kernel has it, else it is a user [`Region`]; which one is recorded. With
//! `IOU_PBUF_RING_INC` (6.12) the kernel consumes a buffer incrementally: each completion
//! uses the next part of the buffer and `IORING_CQE_F_BUF_MORE` says the kernel still holds the
//! rest.
//!
//! Ownership: a buffer id is either in the ring (the kernel may write into it) or lent to the
//! application as a [`BufLease`] (read-only, returned to the ring when the last lease of it
//! drops). Leases are only created from completions by [`BufRing::lease_from_cqe`], which is
//! `unsafe` because its arguments must come from a real completion of this ring.

use super::Region;
use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicU16, Ordering};

/// `IOU_PBUF_RING_MMAP` (6.4): the kernel allocates the ring; user space mmaps it.
pub const IOU_PBUF_RING_MMAP: u16 = 1;
/// `IOU_PBUF_RING_INC` (6.12): buffers are consumed incrementally.
pub const IOU_PBUF_RING_INC: u16 = 2;
/// `IORING_OFF_PBUF_RING`: mmap offset of kernel-allocated buffer rings.
pub const IORING_OFF_PBUF_RING: u64 = 0x8000_0000;
/// `IORING_OFF_PBUF_SHIFT`: the buffer group id sits above this bit in the mmap offset.
pub const IORING_OFF_PBUF_SHIFT: u32 = 16;
/// `IORING_CQE_BUFFER_SHIFT`: a CQE's buffer id is in `flags >> 16`.
pub const IORING_CQE_BUFFER_SHIFT: u32 = 16;

/// `struct io_uring_buf`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IoUringBuf {
    /// Buffer address.
    pub addr: u64,
    /// Buffer length.
    pub len: u32,
    /// Buffer id, returned in the CQE.
    pub bid: u16,
    /// Unused in entries other than 0; entry 0's is the ring tail.
    pub resv: u16,
}
crate::sys::assert_layout!(
    IoUringBuf,
    size = 16,
    align = 8,
    addr = 0,
    len = 8,
    bid = 12,
    resv = 14
);

/// How to build a buffer ring.
#[derive(Debug, Clone)]
pub struct BufRingConfig {
    /// Buffer group id.
    pub bgid: u16,
    /// Number of buffers (and ring entries); a power of two ≤ 32768.
    pub entries: u16,
    /// Size of each buffer in bytes.
    pub buf_size: u32,
    /// Ask for incremental consumption (`IOU_PBUF_RING_INC`).
    pub incremental: bool,
    /// Put the buffers on huge pages if possible.
    pub huge_pages: bool,
    /// Buffers kept in the ring at once (the rest wait, most recently returned on top, in a
    /// user-space stack); [`BufRing::grow`] raises it. Keeping few buffers in rotation keeps
    /// them in the CPU cache. 0 = all.
    pub hot: u16,
}

enum RingMem {
    Kernel { ptr: *mut IoUringBuf, len: usize },
    User(Region),
}

impl RingMem {
    fn ptr(&self) -> *mut IoUringBuf {
        match self {
            RingMem::Kernel { ptr, .. } => *ptr,
            RingMem::User(r) => r.as_ptr().cast(),
        }
    }
}

impl Drop for RingMem {
    fn drop(&mut self) {
        if let RingMem::Kernel { ptr, len } = self {
            // SAFETY: the mapping was created in `register` with this address and length.
            unsafe { libc::munmap(ptr.cast(), *len) };
        }
    }
}

/// The ring of `io_uring_buf` entries itself, registered under one group id, shaped like
/// liburing's `io_uring_buf_ring_add` / `io_uring_buf_ring_advance`: [`PbufRing::add`] writes
/// an entry `offset` slots past the published tail (invisible to the kernel), and
/// [`PbufRing::advance`] publishes that many entries with one store-release of the tail.
///
/// It owns the ring memory only; the buffers are the owner's ([`BufRing`] keeps its own
/// region, the netlink frame ring lends its frames). Every io_uring provided-buffer ring in
/// zcio is one of these.
pub struct PbufRing {
    mem: RingMem,
    entries: u16,
    /// Published tail (free-running u16, as the kernel reads it).
    tail: Cell<u16>,
    bgid: u16,
    kernel_allocated: bool,
    fallback: Option<String>,
}

impl std::fmt::Debug for PbufRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PbufRing")
            .field("bgid", &self.bgid)
            .field("entries", &self.entries)
            .field("tail", &self.tail.get())
            .field("kernel_allocated", &self.kernel_allocated)
            .finish()
    }
}

impl PbufRing {
    /// Registers a ring of `entries` (a power of two ≤ 32768) under `bgid` with the io_uring
    /// whose descriptor is `ring_fd`, through `register(ring_addr, entries, bgid, flags)` (the
    /// `IORING_REGISTER_PBUF_RING` call). A kernel-allocated ring (`IOU_PBUF_RING_MMAP`, 6.4)
    /// is tried first, then user memory; which one is recorded in [`PbufRing::fallback`].
    ///
    /// The ring must be unregistered (or the io_uring closed) before the buffers it was
    /// given go away; the ring memory itself may be dropped at any time after that.
    pub fn register(
        ring_fd: i32,
        entries: u16,
        bgid: u16,
        incremental: bool,
        mut register: impl FnMut(u64, u16, u16, u16) -> io::Result<()>,
    ) -> io::Result<Self> {
        if !entries.is_power_of_two() || entries > 32768 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "buffer ring entries must be a power of two ≤ 32768",
            ));
        }
        let inc = if incremental { IOU_PBUF_RING_INC } else { 0 };
        let ring_len = entries as usize * std::mem::size_of::<IoUringBuf>();
        let mut fallback = None;
        let mem = match register(0, entries, bgid, IOU_PBUF_RING_MMAP | inc) {
            Ok(()) => {
                let off = IORING_OFF_PBUF_RING | (u64::from(bgid) << IORING_OFF_PBUF_SHIFT);
                // SAFETY: maps the kernel's ring for this group; the result is checked.
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        ring_len,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED | libc::MAP_POPULATE,
                        ring_fd,
                        off as libc::off_t,
                    )
                };
                if p == libc::MAP_FAILED {
                    return Err(io::Error::last_os_error());
                }
                RingMem::Kernel {
                    ptr: p.cast(),
                    len: ring_len,
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && inc == 0 => {
                fallback = Some(format!(
                    "kernel-allocated buffer ring (IOU_PBUF_RING_MMAP, 6.4) refused ({e}); ring \
                     in user memory"
                ));
                let r = Region::new(ring_len, false)?;
                register(r.as_ptr() as u64, entries, bgid, inc)?;
                RingMem::User(r)
            }
            Err(e) => return Err(e),
        };
        Ok(Self {
            kernel_allocated: matches!(mem, RingMem::Kernel { .. }),
            mem,
            entries,
            tail: Cell::new(0),
            bgid,
            fallback,
        })
    }

    /// Writes buffer `bid` (`addr`, `len` bytes) into the slot `offset` entries past the
    /// published tail (`io_uring_buf_ring_add`); the kernel sees it after
    /// [`PbufRing::advance`].
    ///
    /// # Safety
    ///
    /// `addr..addr+len` must stay valid for writes, and untouched by user space, from the
    /// `advance` that publishes it until the kernel hands buffer `bid` back in a completion
    /// (or the ring is unregistered). At most `entries` buffers may be in the ring at once,
    /// so the slot written is not one the kernel may still read.
    pub unsafe fn add(&self, addr: *mut u8, len: u32, bid: u16, offset: u16) {
        let slot = (self.tail.get().wrapping_add(offset) & (self.entries - 1)) as usize;
        // SAFETY: `slot` < entries, inside the ring mapping, which lives as long as `self`;
        // the caller guarantees the kernel is not reading it (it is past the published
        // tail). Field-wise writes keep entry 0's `resv` (the tail) untouched.
        unsafe {
            let e = self.mem.ptr().add(slot);
            std::ptr::addr_of_mut!((*e).addr).write_volatile(addr as u64);
            std::ptr::addr_of_mut!((*e).len).write_volatile(len);
            std::ptr::addr_of_mut!((*e).bid).write_volatile(bid);
        }
    }

    /// Publishes `count` entries written by [`PbufRing::add`] (`io_uring_buf_ring_advance`):
    /// one store-release of the tail.
    pub fn advance(&self, count: u16) {
        let t = self.tail.get().wrapping_add(count);
        self.tail.set(t);
        // SAFETY: entry 0's `resv` field is the ring tail, 2-byte aligned (offset 14 of an
        // 8-aligned struct); the ring mapping lives as long as `self`; the kernel only reads
        // it, and AtomicU16 has the layout of u16.
        let tail =
            unsafe { &*(std::ptr::addr_of_mut!((*self.mem.ptr()).resv) as *const AtomicU16) };
        tail.store(t, Ordering::Release);
    }

    /// The published tail (ring position of the next entry).
    pub fn tail(&self) -> u16 {
        self.tail.get()
    }

    /// The buffer id in the entry at ring position `pos` (for bundles: the kernel consumed
    /// consecutive entries from the first one its completion names).
    pub fn bid_at(&self, pos: u16) -> u16 {
        let slot = (pos & (self.entries - 1)) as usize;
        // SAFETY: `slot` < entries, inside the mapping; a plain read of a u16 the kernel
        // only reads.
        unsafe { std::ptr::addr_of!((*self.mem.ptr().add(slot)).bid).read_volatile() }
    }

    /// Entries.
    pub fn entries(&self) -> u16 {
        self.entries
    }
    /// Buffer group id.
    pub fn bgid(&self) -> u16 {
        self.bgid
    }
    /// Whether the ring memory was allocated by the kernel.
    pub fn kernel_allocated(&self) -> bool {
        self.kernel_allocated
    }
    /// Why the ring is in user memory, when a kernel-allocated one was refused.
    pub fn fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }
}

/// A registered provided-buffer ring with its buffers.
pub struct BufRing {
    ring: PbufRing,
    bufs: Region,
    entries: u16,
    buf_size: u32,
    incremental: bool,
    /// Per buffer id: ring position it was last published at (for bundles).
    pos: RefCell<Vec<u16>>,
    /// Per buffer id: bytes the kernel has consumed (incremental mode).
    consumed: RefCell<Vec<u32>>,
    /// Per buffer id: leases alive.
    refs: RefCell<Vec<u32>>,
    /// Per buffer id: the kernel is done with it (no `F_BUF_MORE` seen).
    done: RefCell<Vec<bool>>,
    lent: Cell<u32>,
    recycled: Cell<u64>,
    /// Free buffers not in the ring, most recently returned last (LIFO).
    stack: RefCell<Vec<u16>>,
    /// Ring slots written / seen consumed (from completions), free-running.
    written: Cell<u64>,
    seen: Cell<u64>,
    /// Wanted ring occupancy.
    hot: Cell<u16>,
    /// A completion consumed the last buffer in the ring.
    ran_dry: Cell<bool>,
}

impl std::fmt::Debug for BufRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufRing")
            .field("bgid", &self.ring.bgid)
            .field("entries", &self.entries)
            .field("buf_size", &self.buf_size)
            .field("incremental", &self.incremental)
            .field("kernel_allocated", &self.ring.kernel_allocated)
            .field("lent", &self.lent.get())
            .finish()
    }
}

impl BufRing {
    /// Registers a buffer ring with the io_uring whose descriptor is `ring_fd`, using
    /// `register(ring_addr, entries, bgid, flags)` for the `IORING_REGISTER_PBUF_RING` call.
    /// Tries a kernel-allocated ring first, then user memory. Every buffer starts in the ring.
    ///
    /// The returned ring must be dropped after the io_uring stops using it: unregister it, or
    /// drop it after the io_uring (whose teardown releases the group).
    pub fn register(
        ring_fd: i32,
        cfg: &BufRingConfig,
        register: impl FnMut(u64, u16, u16, u16) -> io::Result<()>,
    ) -> io::Result<Self> {
        if cfg.buf_size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "buffer ring buffers must be non-empty",
            ));
        }
        let ring = PbufRing::register(ring_fd, cfg.entries, cfg.bgid, cfg.incremental, register)?;
        let bufs = Region::new(cfg.entries as usize * cfg.buf_size as usize, cfg.huge_pages)?;
        let n = cfg.entries as usize;
        let me = Self {
            ring,
            bufs,
            entries: cfg.entries,
            buf_size: cfg.buf_size,
            incremental: cfg.incremental,
            pos: RefCell::new(vec![0; n]),
            consumed: RefCell::new(vec![0; n]),
            refs: RefCell::new(vec![0; n]),
            done: RefCell::new(vec![false; n]),
            lent: Cell::new(0),
            recycled: Cell::new(0),
            stack: RefCell::new((0..cfg.entries).rev().collect()),
            written: Cell::new(0),
            seen: Cell::new(0),
            ran_dry: Cell::new(false),
            hot: Cell::new(if cfg.hot == 0 {
                cfg.entries
            } else {
                cfg.hot.min(cfg.entries)
            }),
        };
        me.top_up();
        Ok(me)
    }

    /// Writes buffer `bid` into the ring `offset` entries past the published tail (not yet
    /// visible to the kernel).
    fn write_entry(&self, bid: u16, offset: u16) {
        let addr = self
            .bufs
            .as_ptr()
            .wrapping_add(bid as usize * self.buf_size as usize);
        // SAFETY: buffer `bid` lies inside `self.bufs`, which lives as long as the ring; it is
        // on the free stack (no lease reads it, the kernel does not have it), and at most
        // `entries` buffers exist, so the slot is not one the kernel may still read.
        unsafe { self.ring.add(addr, self.buf_size, bid, offset) };
        self.pos.borrow_mut()[bid as usize] = self.ring.tail().wrapping_add(offset);
        self.consumed.borrow_mut()[bid as usize] = 0;
        self.done.borrow_mut()[bid as usize] = false;
        self.written.set(self.written.get() + 1);
        self.recycled.set(self.recycled.get() + 1);
    }

    /// Buffers in the ring now (as far as completions tell: with `DEFER_TASKRUN` the kernel
    /// consumes only inside `io_uring_enter`, and every consumption is harvested after it).
    pub fn in_ring(&self) -> u64 {
        self.written.get() - self.seen.get()
    }

    /// Moves free buffers (most recently returned first) into the ring until it holds the
    /// wanted number, and publishes the tail once.
    pub fn top_up(&self) {
        let want = u64::from(self.hot.get());
        let mut n: u16 = 0;
        while self.in_ring() < want {
            let Some(bid) = self.stack.borrow_mut().pop() else {
                break;
            };
            self.write_entry(bid, n);
            n += 1;
        }
        if n > 0 {
            self.ring.advance(n);
        }
    }

    /// Whether a completion emptied the ring since the last call (and clears it).
    pub fn take_ran_dry(&self) -> bool {
        self.ran_dry.replace(false)
    }

    /// Doubles the ring occupancy (the ring ran dry) and tops up.
    pub fn grow(&self) {
        self.hot
            .set(self.hot.get().saturating_mul(2).min(self.entries));
        self.top_up();
    }

    /// Halves the ring occupancy, not below `min` (buffers already in the ring stay there
    /// until consumed).
    pub fn shrink(&self, min: u16) {
        let h = self.hot.get();
        self.hot.set((h / 2).max(min.min(h)));
    }

    /// Wanted ring occupancy now.
    pub fn hot(&self) -> u16 {
        self.hot.get()
    }

    /// Turns one buffer-select completion (`res` > 0 bytes, `flags`) into leases, calling `f`
    /// for each buffer it covers in order (several for a bundle).
    ///
    /// # Safety
    ///
    /// `res` and `flags` must be those of a completion harvested from the io_uring this ring
    /// is registered with, for a request that selected from this group, each completion
    /// passed exactly once: the kernel has then finished writing the bytes described, and the
    /// buffers are no longer in the ring.
    pub unsafe fn lease_from_cqe(
        self: &Rc<Self>,
        res: i32,
        flags: u32,
        mut f: impl FnMut(BufLease),
    ) -> io::Result<()> {
        if res <= 0 || flags & crate::sys::IORING_CQE_F_BUFFER == 0 {
            return Ok(());
        }
        let first = (flags >> IORING_CQE_BUFFER_SHIFT) as u16;
        if first >= self.entries {
            return Err(io::Error::other(format!(
                "completion names buffer {first} of a {}-buffer ring",
                self.entries
            )));
        }
        let mut left = res as u32;
        if self.incremental {
            let off = self.consumed.borrow()[first as usize];
            if off + left > self.buf_size {
                return Err(io::Error::other(
                    "incremental completion overruns its buffer",
                ));
            }
            self.consumed.borrow_mut()[first as usize] = off + left;
            let kernel_done = flags & crate::sys::IORING_CQE_F_BUF_MORE == 0;
            if kernel_done {
                self.seen.set(self.seen.get() + 1);
                if self.in_ring() == 0 {
                    self.ran_dry.set(true);
                }
            }
            f(self.lease(first, off, left, kernel_done));
            return Ok(());
        }
        // Whole buffers, consecutive in ring order from `first` (a bundle covers several).
        let start = self.pos.borrow()[first as usize];
        let mut k: u16 = 0;
        while left > 0 {
            // The kernel consumed these slots (they are part of the bundle) and user space
            // has not rewritten them: slots are reused in order and only after their
            // completion has been seen.
            let bid = if k == 0 {
                first
            } else {
                self.ring.bid_at(start.wrapping_add(k))
            };
            if bid >= self.entries {
                return Err(io::Error::other("bundle names an unknown buffer"));
            }
            let n = left.min(self.buf_size);
            self.seen.set(self.seen.get() + 1);
            if self.in_ring() == 0 {
                self.ran_dry.set(true);
            }
            f(self.lease(bid, 0, n, true));
            left -= n;
            k += 1;
        }
        Ok(())
    }

    fn lease(self: &Rc<Self>, bid: u16, off: u32, len: u32, kernel_done: bool) -> BufLease {
        let i = bid as usize;
        {
            let mut refs = self.refs.borrow_mut();
            if refs[i] == 0 {
                self.lent.set(self.lent.get() + 1);
            }
            refs[i] += 1;
        }
        if kernel_done {
            self.done.borrow_mut()[i] = true;
        }
        BufLease {
            ring: Rc::clone(self),
            bid,
            off,
            len,
        }
    }

    fn release(&self, bid: u16) {
        let i = bid as usize;
        let last = {
            let mut refs = self.refs.borrow_mut();
            refs[i] -= 1;
            refs[i] == 0
        };
        if last {
            self.lent.set(self.lent.get() - 1);
            if self.done.borrow()[i] {
                self.stack.borrow_mut().push(bid);
                self.top_up();
            }
        }
    }

    /// Buffer group id.
    pub fn bgid(&self) -> u16 {
        self.ring.bgid()
    }
    /// Number of buffers.
    pub fn entries(&self) -> u16 {
        self.entries
    }
    /// Size of each buffer.
    pub fn buf_size(&self) -> u32 {
        self.buf_size
    }
    /// Whether buffers are consumed incrementally.
    pub fn incremental(&self) -> bool {
        self.incremental
    }
    /// Whether the ring memory was allocated by the kernel.
    pub fn kernel_allocated(&self) -> bool {
        self.ring.kernel_allocated()
    }
    /// Why the ring is in user memory, when a kernel-allocated one was refused.
    pub fn fallback(&self) -> Option<&str> {
        self.ring.fallback()
    }
    /// Buffers currently lent to the application (at least one lease alive).
    pub fn lent(&self) -> u32 {
        self.lent.get()
    }
    /// Buffers put into the ring so far (initial fill included).
    pub fn recycled(&self) -> u64 {
        self.recycled.get()
    }
}

/// A received byte range in a provided buffer, lent to the application. Returns the buffer to
/// the ring when the last lease of it drops.
pub struct BufLease {
    ring: Rc<BufRing>,
    bid: u16,
    off: u32,
    len: u32,
}

impl BufLease {
    /// The buffer id.
    pub fn bid(&self) -> u16 {
        self.bid
    }
    /// Offset of the data within its buffer.
    pub fn offset(&self) -> u32 {
        self.off
    }
}

impl std::fmt::Debug for BufLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufLease")
            .field("bid", &self.bid)
            .field("off", &self.off)
            .field("len", &self.len)
            .finish()
    }
}

impl std::ops::Deref for BufLease {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let start = self.bid as usize * self.ring.buf_size as usize + self.off as usize;
        // SAFETY: the range lies inside buffer `bid` (checked in `lease_from_cqe`), which the
        // kernel finished writing before posting the completion and will not write again
        // while a lease of it lives (the buffer is out of the ring; in incremental mode the
        // kernel only writes beyond the consumed offset).
        unsafe { std::slice::from_raw_parts(self.ring.bufs.as_ptr().add(start), self.len as usize) }
    }
}

impl Drop for BufLease {
    fn drop(&mut self) {
        self.ring.release(self.bid);
    }
}

/// These tests run under Miri (`scripts/miri`) as well as natively: the ring lives in user
/// memory ([`PbufRing::register`] is given a registration call that refuses the
/// kernel-allocated ring with `EINVAL`, as a 6.1 kernel does, and accepts the user one), and
/// the test plays the kernel's side of the shared memory through the addresses it was handed,
/// as `io_uring/kbuf.c` does: it reads the published tail with acquire ordering, reads an
/// entry's `addr`/`len`/`bid` (`READ_ONCE`), writes the received bytes to `addr`, and posts
/// the completion `flags` (`F_BUFFER | bid << 16`). What they check is the index
/// arithmetic and the pointer discipline of user space; the kernel path itself is tested on
/// real rings (`tests/receiver.rs`).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::IORING_CQE_F_BUFFER;

    /// The kernel's view of a user-memory buffer ring: its address and its private head.
    struct ModelKernel {
        ring: u64,
        entries: u16,
        head: u16,
    }

    impl ModelKernel {
        fn entry(&self, pos: u16) -> *mut IoUringBuf {
            let slot = (pos & (self.entries - 1)) as usize;
            (self.ring as usize as *mut IoUringBuf).wrapping_add(slot)
        }
        fn tail(&self) -> u16 {
            // SAFETY: entry 0's `resv` is the tail word, live while the ring is registered.
            let t =
                unsafe { &*(std::ptr::addr_of_mut!((*self.entry(0)).resv) as *const AtomicU16) };
            t.load(Ordering::Acquire)
        }
        /// Receives `data` into the buffers at the head (one buffer, or a bundle of
        /// consecutive ones when `data` is longer), as a receive with buffer select does.
        /// Returns the completion's `(res, flags)`.
        fn receive(&mut self, data: &[u8]) -> (i32, u32) {
            let first = self.head;
            let mut flags = 0;
            let mut left = data;
            while !left.is_empty() {
                assert_ne!(self.head, self.tail(), "ran out of published buffers");
                let e = self.entry(self.head);
                // SAFETY: the entry is published (before the tail); the fields are read as
                // the kernel reads them.
                let (addr, len, bid) = unsafe {
                    (
                        std::ptr::addr_of!((*e).addr).read_volatile(),
                        std::ptr::addr_of!((*e).len).read_volatile(),
                        std::ptr::addr_of!((*e).bid).read_volatile(),
                    )
                };
                if self.head == first {
                    flags = IORING_CQE_F_BUFFER | (u32::from(bid) << IORING_CQE_BUFFER_SHIFT);
                }
                let n = left.len().min(len as usize);
                // SAFETY: `addr..addr+len` is a buffer user space published to the kernel.
                unsafe {
                    std::ptr::copy_nonoverlapping(left.as_ptr(), addr as usize as *mut u8, n)
                };
                left = &left[n..];
                self.head = self.head.wrapping_add(1);
            }
            (data.len() as i32, flags)
        }
    }

    fn ring(entries: u16, buf_size: u32, hot: u16) -> (Rc<BufRing>, ModelKernel) {
        let mut at = 0;
        let cfg = BufRingConfig {
            bgid: 1,
            entries,
            buf_size,
            incremental: false,
            huge_pages: false,
            hot,
        };
        let r = BufRing::register(-1, &cfg, |addr, n, bgid, flags| {
            assert_eq!((n, bgid), (entries, 1));
            if flags & IOU_PBUF_RING_MMAP != 0 {
                // A kernel without kernel-allocated rings (6.1): the ring goes to user memory.
                // (Incremental consumption needs 6.12, which has both, so zcio asks for it
                // only with a kernel-allocated ring, which a test cannot map without a kernel.)
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            at = addr;
            Ok(())
        });
        let r = match r {
            Ok(r) => r,
            Err(e) => panic!("register: {e}"),
        };
        assert!(!r.kernel_allocated());
        (
            Rc::new(r),
            ModelKernel {
                ring: at,
                entries,
                head: 0,
            },
        )
    }

    fn bytes(seed: u8, n: usize) -> Vec<u8> {
        (0..n).map(|i| seed.wrapping_add(i as u8)).collect()
    }

    #[test]
    fn buffers_come_back_as_leases_of_what_the_kernel_wrote_and_return_on_drop() {
        let (r, mut k) = ring(8, 64, 4);
        assert_eq!(r.in_ring(), 4);
        // Several laps of the 8-slot ring: slot indices wrap, buffers rotate through it.
        for round in 0..40u8 {
            let data = bytes(round, 10 + round as usize % 50);
            let (res, flags) = k.receive(&data);
            let mut leases = Vec::new();
            // SAFETY: a completion of this ring's group, passed once.
            unsafe { r.lease_from_cqe(res, flags, |l| leases.push(l)) }.unwrap();
            assert_eq!(leases.len(), 1);
            assert_eq!(&*leases[0], &data[..]);
            assert_eq!(r.lent(), 1);
            assert_eq!(r.in_ring(), 3);
            drop(leases);
            assert_eq!(r.lent(), 0);
            assert_eq!(r.in_ring(), 4, "a returned buffer goes back into the ring");
        }
        assert_eq!(r.recycled(), 4 + 40);
    }

    #[test]
    fn a_bundle_is_leased_buffer_by_buffer_in_ring_order() {
        let (r, mut k) = ring(8, 16, 0);
        // Move the ring's positions off zero first so the bundle crosses the wrap.
        for i in 0..6u8 {
            let (res, flags) = k.receive(&bytes(i, 5));
            // SAFETY: as above.
            unsafe { r.lease_from_cqe(res, flags, drop) }.unwrap();
        }
        let data = bytes(100, 16 * 3 + 7);
        let (res, flags) = k.receive(&data);
        let mut leases = Vec::new();
        // SAFETY: as above.
        unsafe { r.lease_from_cqe(res, flags, |l| leases.push(l)) }.unwrap();
        assert_eq!(leases.len(), 4);
        let joined: Vec<u8> = leases.iter().flat_map(|l| l.iter().copied()).collect();
        assert_eq!(joined, data);
        let mut bids: Vec<u16> = leases.iter().map(BufLease::bid).collect();
        bids.dedup();
        assert_eq!(bids.len(), 4, "four different buffers");
        assert_eq!(r.in_ring(), 4);
        drop(leases);
        assert_eq!(r.in_ring(), 8);
    }

    #[test]
    fn completions_naming_an_unknown_buffer_are_refused() {
        let (r, _k) = ring(4, 64, 0);
        let flags = IORING_CQE_F_BUFFER | (9 << IORING_CQE_BUFFER_SHIFT);
        // SAFETY: the completion is refused before anything is read.
        let e = unsafe { r.lease_from_cqe(10, flags, |_| panic!("leased")) };
        assert!(e.is_err());
    }
}

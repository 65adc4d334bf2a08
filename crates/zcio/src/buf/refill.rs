//! The zcrx receive area and its refill ring (Linux 6.15).
//!
//! The area is user memory registered with an interface rx queue; the NIC's page pool hands
//! its pages (`net_iov`s) to the queue, packets land in them, and each `RECV_ZC` completion
//! (CQE32) names a byte range `{area id << 48 | offset, len}`. The application gives a range
//! back by writing a refill queue entry (`struct io_uring_zcrx_rqe {off, len}`) at the tail of
//! the refill ring and publishing the tail with release ordering; the kernel consumes entries
//! from the head (reading the tail with acquire ordering, publishing its head with release).
//!
//! The ring lives in a user [`Region`] (`IORING_MEM_REGION_TYPE_USER`); the kernel reports
//! where head, tail and the RQE array are (`io_uring_zcrx_offsets`): today head at 0, tail at 4
//! and the array at one cache line.

use super::Region;
use crate::sys::zcrx::{io_uring_zcrx_rqe, split_offset, IORING_ZCRX_AREA_SHIFT};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};

/// A refill ring over user memory, written by the application and read by the kernel.
pub struct RefillRing {
    region: Region,
    head_off: usize,
    tail_off: usize,
    rqes_off: usize,
    entries: u32,
    tail: Cell<u32>,
    /// Returns that did not fit (ring full), in order; flushed as the kernel frees slots.
    pending: RefCell<VecDeque<(u64, u32)>>,
    full_events: Cell<u64>,
}

impl std::fmt::Debug for RefillRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefillRing")
            .field("entries", &self.entries)
            .field("tail", &self.tail.get())
            .field("pending", &self.pending.borrow().len())
            .finish()
    }
}

impl RefillRing {
    /// Lays a refill ring of `entries` (a power of two) RQEs over `region`, with head, tail
    /// and the RQE array at the kernel-reported offsets. Checks that they fit and are aligned.
    pub fn new(
        region: Region,
        head_off: u32,
        tail_off: u32,
        rqes_off: u32,
        entries: u32,
    ) -> io::Result<Self> {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
        if !entries.is_power_of_two() {
            return Err(bad("refill ring entries must be a power of two"));
        }
        let rqe = std::mem::size_of::<io_uring_zcrx_rqe>();
        let (h, t, r) = (head_off as usize, tail_off as usize, rqes_off as usize);
        if h % 4 != 0 || t % 4 != 0 || r % 8 != 0 {
            return Err(bad("refill ring offsets are misaligned"));
        }
        if h + 4 > region.len()
            || t + 4 > region.len()
            || r + entries as usize * rqe > region.len()
            || (h < t + 4 && t < h + 4)
            || (r < h + 4 && h < r + entries as usize * rqe)
            || (r < t + 4 && t < r + entries as usize * rqe)
        {
            return Err(bad(
                "refill ring offsets overlap or do not fit in the region",
            ));
        }
        let me = Self {
            region,
            head_off: h,
            tail_off: t,
            rqes_off: r,
            entries,
            tail: Cell::new(0),
            pending: RefCell::new(VecDeque::new()),
            full_events: Cell::new(0),
        };
        me.tail.set(me.tail_atomic().load(Ordering::Acquire));
        Ok(me)
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        // SAFETY: `off` was checked in `new` to be 4-aligned and inside the region, which
        // lives as long as `self`; the kernel accesses these words only atomically (READ_ONCE /
        // smp_load_acquire / smp_store_release), and AtomicU32 has the layout of u32.
        unsafe { &*(self.region.as_ptr().add(off) as *const AtomicU32) }
    }
    fn head_atomic(&self) -> &AtomicU32 {
        self.word(self.head_off)
    }
    fn tail_atomic(&self) -> &AtomicU32 {
        self.word(self.tail_off)
    }

    /// The consumer's (kernel's) head, read with acquire ordering.
    pub fn head(&self) -> u32 {
        self.head_atomic().load(Ordering::Acquire)
    }
    /// The published tail.
    pub fn tail(&self) -> u32 {
        self.tail.get()
    }
    /// Number of RQE slots.
    pub fn entries(&self) -> u32 {
        self.entries
    }
    /// Free slots right now.
    pub fn space(&self) -> u32 {
        self.entries - self.tail.get().wrapping_sub(self.head())
    }
    /// Returns waiting for space.
    pub fn pending(&self) -> usize {
        self.pending.borrow().len()
    }
    /// How many times a return found the ring full.
    pub fn full_events(&self) -> u64 {
        self.full_events.get()
    }

    /// Returns the range `{off, len}` (`off` = area token | offset) to the kernel, or queues
    /// it in order when the ring is full. Returns whether it (and everything before it) was
    /// published.
    pub fn push(&self, off: u64, len: u32) -> bool {
        self.pending.borrow_mut().push_back((off, len));
        self.flush() == 0
    }

    /// Writes as many queued returns as fit and publishes the tail once. Returns how many
    /// are still waiting.
    pub fn flush(&self) -> usize {
        let mut pending = self.pending.borrow_mut();
        if pending.is_empty() {
            return 0;
        }
        let mut space = self.space();
        if space == 0 {
            self.full_events.set(self.full_events.get() + 1);
            return pending.len();
        }
        let mut t = self.tail.get();
        while space > 0 {
            let Some((off, len)) = pending.pop_front() else {
                break;
            };
            let slot = (t & (self.entries - 1)) as usize;
            let at = self.rqes_off + slot * std::mem::size_of::<io_uring_zcrx_rqe>();
            // SAFETY: the slot is inside the RQE array (checked in `new`) and outside the
            // kernel's [head, tail) window (there was space), so the kernel does not read it
            // until the tail below is published.
            unsafe {
                let p = self.region.as_ptr().add(at) as *mut io_uring_zcrx_rqe;
                std::ptr::addr_of_mut!((*p).off).write_volatile(off);
                std::ptr::addr_of_mut!((*p).len).write_volatile(len);
            }
            t = t.wrapping_add(1);
            space -= 1;
        }
        self.tail.set(t);
        self.tail_atomic().store(t, Ordering::Release);
        if !pending.is_empty() {
            self.full_events.set(self.full_events.get() + 1);
        }
        pending.len()
    }

    /// Reads the RQE in `slot` (for inspection and tests).
    pub fn rqe(&self, slot: u32) -> (u64, u32) {
        let at = self.rqes_off
            + (slot & (self.entries - 1)) as usize * std::mem::size_of::<io_uring_zcrx_rqe>();
        // SAFETY: inside the RQE array; reads of plain integers.
        unsafe {
            let p = self.region.as_ptr().add(at) as *const io_uring_zcrx_rqe;
            (
                std::ptr::addr_of!((*p).off).read_volatile(),
                std::ptr::addr_of!((*p).len).read_volatile(),
            )
        }
    }
}

/// A registered zcrx area with its refill ring: completions become [`ZcrxLease`]s, and each
/// lease goes back through the refill ring when dropped.
pub struct ZcrxArea {
    area: Region,
    refill: RefillRing,
    token: u64,
    lent: Cell<u64>,
    returned: Cell<u64>,
}

impl std::fmt::Debug for ZcrxArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZcrxArea")
            .field("len", &self.area.len())
            .field("token", &self.token)
            .field("refill", &self.refill)
            .finish()
    }
}

impl ZcrxArea {
    /// Joins an area (registered with `rq_area_token` = `token`) and its refill ring.
    pub fn new(area: Region, refill: RefillRing, token: u64) -> Self {
        Self {
            area,
            refill,
            token,
            lent: Cell::new(0),
            returned: Cell::new(0),
        }
    }

    /// The refill ring.
    pub fn refill(&self) -> &RefillRing {
        &self.refill
    }
    /// Area id (the token's bits above `IORING_ZCRX_AREA_SHIFT`).
    pub fn area_id(&self) -> u16 {
        (self.token >> IORING_ZCRX_AREA_SHIFT) as u16
    }
    /// Ranges lent to the application now.
    pub fn lent(&self) -> u64 {
        self.lent.get()
    }
    /// Ranges given back (through the refill ring) so far.
    pub fn returned(&self) -> u64 {
        self.returned.get()
    }

    /// Decodes one `RECV_ZC` completion (`res` bytes; `zcrx_cqe_off` = the
    /// `io_uring_zcrx_cqe.off` in the big CQE) into a lease of the area.
    ///
    /// # Safety
    ///
    /// The values must come from a completion harvested from the io_uring this area is
    /// registered with, each completion passed once: the kernel then lends the range to user
    /// space until it is returned through the refill ring.
    pub unsafe fn lease_from_cqe(
        self: &Rc<Self>,
        res: i32,
        zcrx_cqe_off: u64,
    ) -> io::Result<ZcrxLease> {
        let (area, off) = split_offset(zcrx_cqe_off);
        if res <= 0 {
            return Err(io::Error::other("zcrx completion without data"));
        }
        if area != self.area_id() {
            return Err(io::Error::other(format!(
                "zcrx completion names area {area}, registered area is {}",
                self.area_id()
            )));
        }
        if off + res as u64 > self.area.len() as u64 {
            return Err(io::Error::other(format!(
                "zcrx completion range {off}+{res} outside the {}-byte area",
                self.area.len()
            )));
        }
        self.lent.set(self.lent.get() + 1);
        Ok(ZcrxLease {
            area: Rc::clone(self),
            off,
            len: res as u32,
        })
    }
}

/// A received byte range in the zcrx area, lent by the kernel. Dropping it writes a refill
/// queue entry so the page goes back to the NIC's queue.
pub struct ZcrxLease {
    area: Rc<ZcrxArea>,
    off: u64,
    len: u32,
}

impl ZcrxLease {
    /// Byte offset within the area.
    pub fn area_offset(&self) -> u64 {
        self.off
    }
}

impl std::fmt::Debug for ZcrxLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZcrxLease")
            .field("off", &self.off)
            .field("len", &self.len)
            .finish()
    }
}

impl std::ops::Deref for ZcrxLease {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the range was checked to lie inside the area; the kernel lent it to user
        // space with the completion and does not reuse it until it comes back via the refill
        // ring, which happens only in `drop`.
        unsafe {
            std::slice::from_raw_parts(
                self.area.area.as_ptr().add(self.off as usize),
                self.len as usize,
            )
        }
    }
}

impl Drop for ZcrxLease {
    fn drop(&mut self) {
        self.area.lent.set(self.area.lent.get() - 1);
        self.area.returned.set(self.area.returned.get() + 1);
        self.area.refill.push(self.area.token | self.off, self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::zcrx::IORING_ZCRX_AREA_SHIFT;

    /// The kernel's layout (io_uring/zcrx.c): `struct io_uring {u32 head, tail}` at the start,
    /// RQEs from the next cache line.
    const HEAD: u32 = 0;
    const TAIL: u32 = 4;
    const RQES: u32 = 64;

    fn ring(entries: u32) -> RefillRing {
        let len = crate::ring::zcrx::refill_region_len(entries);
        RefillRing::new(Region::new(len, false).unwrap(), HEAD, TAIL, RQES, entries).unwrap()
    }

    /// Consumes up to `max` RQEs the way the kernel does (acquire the tail, read entries,
    /// release the head).
    fn kernel_consume(r: &RefillRing, max: u32) -> Vec<(u64, u32)> {
        let tail = r.tail_atomic().load(Ordering::Acquire);
        let head = r.head_atomic().load(Ordering::Relaxed);
        let n = tail.wrapping_sub(head).min(max);
        let out = (0..n).map(|i| r.rqe(head.wrapping_add(i))).collect();
        r.head_atomic()
            .store(head.wrapping_add(n), Ordering::Release);
        out
    }

    #[test]
    fn returns_appear_in_order_and_wrap_around() {
        let r = ring(8);
        let mut expect = vec![];
        for round in 0..5u64 {
            for i in 0..6u64 {
                let off = (round * 6 + i) * 4096;
                assert!(r.push(off, 100 + i as u32));
                expect.push((off, 100 + i as u32));
            }
            let got = kernel_consume(&r, 64);
            assert_eq!(got, std::mem::take(&mut expect));
        }
        // 30 entries went through an 8-slot ring: the indices wrapped several times.
        assert_eq!(r.tail(), 30);
        assert_eq!(r.head(), 30);
    }

    #[test]
    fn full_ring_queues_returns_until_the_kernel_frees_slots() {
        let r = ring(4);
        for i in 0..4 {
            assert!(r.push(i * 4096, 1));
        }
        assert_eq!(r.space(), 0);
        assert!(!r.push(4 * 4096, 1), "fifth return must wait");
        assert!(!r.push(5 * 4096, 1));
        assert_eq!(r.pending(), 2);
        assert!(r.full_events() >= 1);
        // Nothing was overwritten: the kernel sees the first four.
        let first = kernel_consume(&r, 2);
        assert_eq!(first, vec![(0, 1), (4096, 1)]);
        assert_eq!(r.flush(), 0);
        let rest = kernel_consume(&r, 10);
        assert_eq!(
            rest,
            vec![(2 * 4096, 1), (3 * 4096, 1), (4 * 4096, 1), (5 * 4096, 1)]
        );
    }

    #[test]
    fn tail_is_counted_modulo_2_pow_32() {
        // Start near the u32 wrap, as a long-running ring would be.
        let start = u32::MAX - 2;
        let mut reg = Region::new(crate::ring::zcrx::refill_region_len(4), false).unwrap();
        reg.as_mut_slice()[HEAD as usize..HEAD as usize + 4].copy_from_slice(&start.to_ne_bytes());
        reg.as_mut_slice()[TAIL as usize..TAIL as usize + 4].copy_from_slice(&start.to_ne_bytes());
        let r = RefillRing::new(reg, HEAD, TAIL, RQES, 4).unwrap();
        assert_eq!(r.tail(), start);
        for i in 0..4 {
            assert!(r.push(i, 7));
        }
        assert_eq!(r.tail(), start.wrapping_add(4));
        assert_eq!(kernel_consume(&r, 9), vec![(0, 7), (1, 7), (2, 7), (3, 7)]);
    }

    #[test]
    fn out_of_order_returns_go_back_as_dropped() {
        let len = 16 * 4096;
        let area_id = 1u64;
        let token = area_id << IORING_ZCRX_AREA_SHIFT;
        let area = Rc::new(ZcrxArea::new(
            Region::new(len, false).unwrap(),
            ring(8),
            token,
        ));
        // Three completions as the kernel writes them: {area 1, page 2}, {page 5}, {page 0+100}.
        let cqes = [
            (token | (2 * 4096), 1500),
            (token | (5 * 4096), 4096),
            (token | 100, 60),
        ];
        // SAFETY (test): these stand for completions of a registered area; the memory is ours.
        let mut leases: Vec<_> = cqes
            .iter()
            .map(|&(off, res)| unsafe { area.lease_from_cqe(res, off) }.unwrap())
            .collect();
        assert_eq!(leases[0].area_offset(), 2 * 4096);
        assert_eq!(leases[0].len(), 1500);
        assert_eq!(leases[2].area_offset(), 100);
        assert_eq!(area.lent(), 3);
        // Drop the middle one first, then the last, then the first.
        drop(leases.remove(1));
        drop(leases.remove(1));
        drop(leases.remove(0));
        assert_eq!(area.lent(), 0);
        let got = kernel_consume(area.refill(), 8);
        assert_eq!(
            got,
            vec![
                (token | (5 * 4096), 4096),
                (token | 100, 60),
                (token | (2 * 4096), 1500)
            ]
        );
    }

    #[test]
    fn completions_outside_the_area_are_rejected() {
        let token = 3u64 << IORING_ZCRX_AREA_SHIFT;
        let area = Rc::new(ZcrxArea::new(
            Region::new(8192, false).unwrap(),
            ring(4),
            token,
        ));
        // SAFETY (test): decoding only; rejected completions create no lease.
        unsafe {
            assert!(area
                .lease_from_cqe(10, 2u64 << IORING_ZCRX_AREA_SHIFT)
                .is_err());
            assert!(area.lease_from_cqe(100, token | 8190).is_err());
            assert!(area.lease_from_cqe(0, token).is_err());
            let ok = area.lease_from_cqe(2, token | 8190).unwrap();
            assert_eq!(ok.len(), 2);
        }
        assert_eq!(area.lent(), 0, "the lease above was dropped and returned");
        assert_eq!(kernel_consume(area.refill(), 4), vec![(token | 8190, 2)]);
    }

    #[test]
    fn overlapping_offsets_are_refused() {
        let reg = || Region::new(4096, false).unwrap();
        assert!(RefillRing::new(reg(), 0, 0, 64, 4).is_err());
        assert!(RefillRing::new(reg(), 0, 4, 0, 4).is_err());
        assert!(RefillRing::new(reg(), 0, 4, 64, 1024).is_err());
        assert!(RefillRing::new(reg(), 0, 4, 64, 3).is_err());
    }
}

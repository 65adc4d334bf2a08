//! The netlink frame ring's memory and frame states: fixed-size frames in one [`Region`], each
//! starting with a [`FrameHdr`] whose status word is the protocol between producer and
//! consumer, as in the memory-mapped netlink design of Linux 3.10–4.5 (`nl_mmap_hdr`,
//! `NL_MMAP_STATUS_*`).
//!
//! - `UNUSED`: free, the producer may fill it;
//! - `RESERVED`: taken by the producer (lent to the kernel for a receive in progress);
//! - `VALID`: holds one datagram (one or more netlink messages) for the consumer;
//! - `COPY`: the datagram did not fit; it lives in an out-of-line buffer;
//! - `SKIP`: the consumer holds it; the producer skips it until it is released.
//!
//! This module owns memory and the state machine and makes no syscall. The producers (one
//! `recvmmsg(2)` per batch, or an io_uring multishot receive) live with the netlink code
//! (`netlink::source`) and drive the ring through a small producer-side API:
//! [`FrameRing::reserve`] / [`FrameRing::lend`] take frames off the top of the free stack
//! (most recently released first, so the frames in use stay in cache), [`FrameRing::complete`]
//! turns a reserved frame into a ready one, and [`FrameRing::unreserve`] gives back the ones a
//! receive did not fill, in their order. The consumer side is [`FrameRing::pop_ready`] (arrival
//! order), [`FrameRing::data`], [`FrameRing::hold`] and [`FrameRing::release`].
//!
//! A consumer that hands a frame's bytes to code it does not control (a Python `memoryview`)
//! takes a [`FramePin`] ([`FrameRing::pin`]): the pinned bytes stay mapped and unchanged until
//! the pin is dropped, on any thread. A frame released while pinned stays out of circulation
//! (counted as held) until [`FrameRing::reclaim`] finds its last pin gone; the producer calls
//! that before every fill.
#![allow(unsafe_code)]

use super::Region;
use crate::sys::assert_layout;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Header at the start of every frame (the layout of the old `struct nl_mmap_hdr` minus
/// credentials).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct FrameHdr {
    /// A [`FrameStatus`] value.
    pub status: u32,
    /// Bytes of the datagram.
    pub len: u32,
    /// `msg_flags` of the receive (`MSG_TRUNC` …).
    pub flags: u32,
    /// Receive sequence number (arrival order).
    pub seq: u32,
}
assert_layout!(
    FrameHdr,
    size = 16,
    align = 4,
    status = 0,
    len = 4,
    flags = 8,
    seq = 12
);

/// Frame rings larger than this are mapped without `MAP_POPULATE` (see [`FrameRing::new`]).
pub const LAZY_ABOVE: usize = 4 << 20;

/// Bytes of [`FrameHdr`] at the start of each frame.
pub const FRAME_HDR_LEN: usize = std::mem::size_of::<FrameHdr>();

/// Frame status word values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[repr(u32)]
pub enum FrameStatus {
    /// Free.
    Unused = 0,
    /// Taken by the producer (lent to the kernel).
    Reserved = 1,
    /// Holds a datagram in the frame.
    Valid = 2,
    /// Holds a datagram in an out-of-line buffer.
    Copy = 3,
    /// Held by the consumer.
    Skip = 4,
}

impl FrameStatus {
    fn from_u32(v: u32) -> Self {
        match v {
            1 => Self::Reserved,
            2 => Self::Valid,
            3 => Self::Copy,
            4 => Self::Skip,
            _ => Self::Unused,
        }
    }
}

/// Index of a frame in its ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameId(pub u32);

/// The memory of a [`FrameRing`], kept alive by a producer that lends frames to the kernel
/// ([`crate::ring::recv::FrameRecv`] holds one until its receive is cancelled and its buffer
/// ring unregistered), so the mapping outlives every kernel write into it whatever order the
/// owners are dropped in. It gives no access to the bytes.
#[derive(Debug, Clone)]
pub struct FrameMemory(Arc<Region>);

impl FrameMemory {
    /// Whether `addr..addr + len` lies inside this memory.
    pub fn contains(&self, addr: *const u8, len: usize) -> bool {
        let start = self.0.as_ptr() as usize;
        let a = addr as usize;
        a >= start
            && a.checked_add(len)
                .is_some_and(|end| end <= start + self.0.len())
    }
}

/// A frame taken off the free stack by [`FrameRing::lend`] to be handed to the kernel: its
/// payload address and length. Only [`FrameRing::lend`] makes one, for a frame it marked
/// RESERVED; the ring does not read or write that payload until [`FrameRing::complete`] or
/// [`FrameRing::unreserve`] takes the frame back.
#[derive(Debug)]
pub struct LentFrame {
    id: u32,
    addr: *mut u8,
    len: u32,
}

impl LentFrame {
    /// The frame.
    pub fn id(&self) -> FrameId {
        FrameId(self.id)
    }
    /// Start of the payload (just after the header).
    pub fn addr(&self) -> *mut u8 {
        self.addr
    }
    /// Payload bytes.
    pub fn len(&self) -> u32 {
        self.len
    }
    /// Never true: a frame has at least 64 payload bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Read access to bytes of one frame that outlives the consumer's hold on it: the bytes stay
/// mapped and unchanged until the pin is dropped (made by the frame ring's `pin`).
///
/// The frame is not given back to the producer while a pin on it exists (a release waits for
/// the ring's `reclaim` to find the pin count at zero), and the pin keeps the mapping (or a
/// COPY frame's out-of-line buffer) alive, so the bytes survive the ring itself. Dropping a
/// pin is an atomic decrement: it may happen on any thread.
pub struct FramePin {
    keep: PinKeep,
    ptr: *const u8,
    len: usize,
}

enum PinKeep {
    /// Bytes in the frame region: the region and the frame's pin count.
    Frame {
        _region: Arc<Region>,
        pins: Arc<[AtomicU32]>,
        id: u32,
    },
    /// Bytes in a COPY frame's out-of-line buffer, which the pin shares (held, never read:
    /// `ptr` points into it).
    Copy(#[allow(dead_code)] Arc<Vec<u8>>),
}

// SAFETY: a pin only reads its bytes, which nobody writes while it exists (the ring neither
// reserves nor lends a pinned frame, and a COPY buffer is immutable once built); what it holds
// (`Arc<Region>`, which is Send + Sync, the atomic counters, an `Arc<Vec<u8>>`) may move and be
// shared across threads, and its drop is an atomic decrement.
unsafe impl Send for FramePin {}
// SAFETY: as above: shared access is reads of bytes nobody writes.
unsafe impl Sync for FramePin {}

impl FramePin {
    /// The pinned bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` was checked to lie in a frame's data (or a COPY buffer) when
        // the pin was made; `keep` keeps that memory alive, and nothing writes it while the pin
        // exists (see the type docs).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    /// Start of the pinned bytes (stable for the pin's life).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
    /// Number of pinned bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether no byte is pinned.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for FramePin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let frame = match &self.keep {
            PinKeep::Frame { id, .. } => Some(*id),
            PinKeep::Copy(_) => None,
        };
        f.debug_struct("FramePin")
            .field("frame", &frame)
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for FramePin {
    fn drop(&mut self) {
        if let PinKeep::Frame { pins, id, .. } = &self.keep {
            // Release: the pin's reads happen before `reclaim` (Acquire) gives the frame back.
            pins[*id as usize].fetch_sub(1, Ordering::Release);
        }
    }
}

/// `count` fixed-size frames, their states, the free stack, the ready queue and the
/// out-of-line buffers of COPY frames. See the module docs.
///
/// Access model: the bytes are read and written only through this value (per frame, through
/// the region's base pointer); the other holders of the region are [`FrameMemory`] handles,
/// which give no access to them. So `&mut FrameRing` is exclusive access from user space, and
/// the kernel writes only payloads of frames this ring lent ([`FrameRing::lend`]) and does not
/// touch until they come back.
#[derive(Debug)]
pub struct FrameRing {
    region: Arc<Region>,
    frame_size: usize,
    /// Bytes from one frame's start to the next: `frame_size` rounded up to an odd number of
    /// cache lines (see [`frame_stride`]).
    stride: usize,
    count: u32,
    /// Free frames; the top (back) is the most recently released.
    free: Vec<u32>,
    /// Ready frames in arrival order.
    ready: VecDeque<u32>,
    held: u32,
    copies: Vec<Option<Arc<Vec<u8>>>>,
    seq: u32,
    /// Pins per frame ([`FramePin`]), shared with the pins.
    pins: Arc<[AtomicU32]>,
    /// Frames the consumer released while pinned: still SKIP (and counted as held) until
    /// [`FrameRing::reclaim`] sees their pin count at zero.
    pinned_released: Vec<u32>,
}

/// Distance between frame starts for frames of `frame_size` bytes: rounded up to a whole
/// number of 64-byte cache lines, and to an odd number of them. Frames a multiple of 4 KiB
/// apart start in the same L1 cache sets (a 32 KiB 8-way L1 repeats its sets every 4 KiB), so
/// the lines the kernel writes and the consumer then reads in the ~64 frames in rotation
/// compete for 8 ways; an odd number of lines walks every set before repeating. Measured with
/// bench `nfq` (1400 B packets, 4 KiB frames): consumer CPU 2.25 → 2.00 µs/packet with a
/// 4160-byte stride, the 13 % zcio had been behind the batch32 + `recvmmsg` baseline.
pub(crate) fn frame_stride(frame_size: usize) -> usize {
    (frame_size.div_ceil(64) | 1) * 64
}

impl FrameRing {
    /// `count` frames of `frame_size` bytes (header included; at least 80, rounded up to 16).
    pub fn new(frame_size: usize, count: u32) -> io::Result<Self> {
        let frame_size = super::align_up(frame_size.max(FRAME_HDR_LEN + 64), 16);
        if count == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero frames"));
        }
        if count > u32::MAX / 2 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "too many frames",
            ));
        }
        let stride = frame_stride(frame_size);
        let len = stride
            .checked_mul(count as usize)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame ring too large"))?;
        // A small ring is faulted in up front (no page fault on the hot path); a large one
        // (frames sized for a worst-case datagram, as NFLOG's with a 64 KiB copy range) gets
        // its pages as the kernel first writes into them: frames are reused most recently
        // released first, so the few in rotation are backed and the rest stay untouched.
        let region = Arc::new(if len <= LAZY_ABOVE {
            Region::new(len, false)?
        } else {
            Region::new_lazy(len)?
        });
        Ok(Self {
            region,
            frame_size,
            stride,
            count,
            free: (0..count).collect(),
            ready: VecDeque::with_capacity(count as usize),
            held: 0,
            copies: (0..count).map(|_| None).collect(),
            seq: 0,
            pins: (0..count).map(|_| AtomicU32::new(0)).collect(),
            pinned_released: Vec::new(),
        })
    }

    /// Frame size in bytes (header included).
    pub fn frame_size(&self) -> usize {
        self.frame_size
    }

    /// Payload bytes a frame holds.
    pub fn frame_payload(&self) -> usize {
        self.frame_size - FRAME_HDR_LEN
    }

    /// Number of frames.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Frames held (SKIP).
    pub fn held(&self) -> u32 {
        self.held
    }

    /// Whether every frame is held: nothing can be received until one is released.
    pub fn all_held(&self) -> bool {
        self.held == self.count
    }

    /// Frames ready for the consumer.
    pub fn ready(&self) -> usize {
        self.ready.len()
    }

    /// Frames free (UNUSED).
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// A handle that keeps this ring's memory mapped (for a producer lending frames to the
    /// kernel).
    pub fn memory(&self) -> FrameMemory {
        FrameMemory(Arc::clone(&self.region))
    }

    /// Start of frame `id` (its header). `id < count`.
    fn frame_ptr(&self, id: u32) -> *mut u8 {
        debug_assert!(id < self.count);
        self.region.as_ptr().wrapping_add(id as usize * self.stride)
    }

    fn hdr(&self, id: u32) -> FrameHdr {
        assert!(id < self.count, "frame {id} of {}", self.count);
        // SAFETY: frame `id` lies inside the mapping (`id < count`, `count * stride` bytes
        // mapped, `frame_size <= stride`), its start is 64-aligned (page-aligned region,
        // `stride` a multiple of 64), and its header is never lent to the kernel (only the payload after it is).
        unsafe { self.frame_ptr(id).cast::<FrameHdr>().read() }
    }

    fn set_hdr(&mut self, id: u32, h: FrameHdr) {
        assert!(id < self.count, "frame {id} of {}", self.count);
        // SAFETY: as in `hdr`; `&mut self` makes this the only access from user space.
        unsafe { self.frame_ptr(id).cast::<FrameHdr>().write(h) }
    }

    fn set_status(&mut self, id: u32, s: FrameStatus) {
        let mut h = self.hdr(id);
        h.status = s as u32;
        self.set_hdr(id, h);
    }

    /// Status word of a frame.
    pub fn status(&self, id: FrameId) -> FrameStatus {
        FrameStatus::from_u32(self.hdr(id.0).status)
    }

    /// Payload of frame `id`, which must not be lent to the kernel (any status but RESERVED
    /// after [`FrameRing::lend`]; `reserve` hands payloads out itself).
    fn payload(&self, id: u32) -> &[u8] {
        assert!(id < self.count, "frame {id} of {}", self.count);
        // SAFETY: the payload lies inside the mapping (see `hdr`); callers only read frames
        // the kernel does not hold (VALID, SKIP, or RESERVED by `reserve` after its receive
        // returned), and `&self` excludes writes through this ring meanwhile.
        unsafe {
            std::slice::from_raw_parts(
                self.frame_ptr(id).wrapping_add(FRAME_HDR_LEN),
                self.frame_payload(),
            )
        }
    }

    /// Takes up to `ids.len()` frames off the top of the free stack (most recently released
    /// first), marks them RESERVED, writes their ids to `ids` and gives `each(i, payload)` the
    /// payload of the `i`-th, borrowed from the ring for `'a` (e.g. for the iovecs of one
    /// receive). Returns how many were taken (0 when none is free). Each taken frame must
    /// then be [`complete`](Self::complete)d or [`unreserve`](Self::unreserve)d.
    pub fn reserve<'a>(
        &'a mut self,
        ids: &mut [u32],
        mut each: impl FnMut(usize, &'a mut [u8]),
    ) -> usize {
        let n = ids.len().min(self.free.len());
        for (i, slot) in ids[..n].iter_mut().enumerate() {
            let id = self.free[self.free.len() - 1 - i];
            *slot = id;
            self.set_status(id, FrameStatus::Reserved);
        }
        let top = self.free.len();
        self.free.truncate(top - n);
        let payload = self.frame_payload();
        for (i, &id) in ids[..n].iter().enumerate() {
            // SAFETY: the ids came off the free stack, where each frame is at most once, so
            // the payloads are disjoint; each lies inside the mapping (see `hdr`), which the
            // ring keeps for `'a`; the ring does not touch a RESERVED frame's payload while
            // `&'a mut self` is borrowed, and nothing else can reach it.
            let p = unsafe {
                std::slice::from_raw_parts_mut(
                    self.frame_ptr(id).wrapping_add(FRAME_HDR_LEN),
                    payload,
                )
            };
            each(i, p);
        }
        n
    }

    /// Takes the frame on top of the free stack to lend it to the kernel (status RESERVED);
    /// `None` when no frame is free. It comes back through [`complete`](Self::complete) when
    /// the kernel filled it, or [`unreserve`](Self::unreserve).
    pub fn lend(&mut self) -> Option<LentFrame> {
        let id = self.free.pop()?;
        self.set_status(id, FrameStatus::Reserved);
        Some(LentFrame {
            id,
            addr: self.frame_ptr(id).wrapping_add(FRAME_HDR_LEN),
            len: self.frame_payload() as u32,
        })
    }

    /// A RESERVED frame received a datagram of `len` bytes with receive flags `flags`: it
    /// becomes VALID and ready (in arrival order), or COPY when `len` exceeds the frame — the
    /// datagram is then the frame's payload followed by up to `len - payload` bytes of `spill`
    /// (where the receive put the rest), in an out-of-line buffer. Returns the new status, or
    /// `None` (nothing changed) when `id` is not a RESERVED frame of this ring.
    pub fn complete(
        &mut self,
        id: FrameId,
        len: usize,
        flags: u32,
        spill: &[u8],
    ) -> Option<FrameStatus> {
        if id.0 >= self.count || self.status(id) != FrameStatus::Reserved {
            return None;
        }
        let payload = self.frame_payload();
        let status = if len > payload {
            let extra = (len - payload).min(spill.len());
            let mut v = Vec::with_capacity(payload + extra);
            v.extend_from_slice(self.payload(id.0));
            v.extend_from_slice(&spill[..extra]);
            self.copies[id.0 as usize] = Some(Arc::new(v));
            FrameStatus::Copy
        } else {
            FrameStatus::Valid
        };
        self.seq = self.seq.wrapping_add(1);
        self.set_hdr(
            id.0,
            FrameHdr {
                status: status as u32,
                len: len.min(u32::MAX as usize) as u32,
                flags,
                seq: self.seq,
            },
        );
        self.ready.push_back(id.0);
        Some(status)
    }

    /// Gives RESERVED frames that received nothing back to the free stack, so the stack is as
    /// before they were taken: `ids` in the order [`reserve`](Self::reserve) gave them (the
    /// first ends on top). Frames that are not RESERVED are left alone.
    pub fn unreserve(&mut self, ids: &[u32]) {
        for &id in ids.iter().rev() {
            if id < self.count && self.status(FrameId(id)) == FrameStatus::Reserved {
                self.set_status(id, FrameStatus::Unused);
                self.free.push(id);
            }
        }
    }

    /// Puts a datagram that was received some other way (e.g. while waiting for a config ACK)
    /// into a free frame as if the producer had received it: VALID, or COPY when it does not
    /// fit. Returns the status, or `None` when no frame is free.
    pub fn inject(&mut self, data: &[u8]) -> Option<FrameStatus> {
        let head = data.len().min(self.frame_payload());
        let mut id = [0u32; 1];
        if self.reserve(&mut id, |_, p| p[..head].copy_from_slice(&data[..head])) == 0 {
            return None;
        }
        // A datagram longer than a frame: its head is in the frame, the rest plays the part
        // of the receive's spill, and `complete` joins them out of line (a rare path: it only
        // runs for datagrams that arrive outside a fill).
        self.complete(FrameId(id[0]), data.len(), 0, &data[head..])
    }

    /// The next ready frame (VALID or COPY), in arrival order. The consumer must
    /// [`release`](Self::release) or [`hold`](Self::hold) it.
    pub fn pop_ready(&mut self) -> Option<FrameId> {
        self.ready.pop_front().map(FrameId)
    }

    /// Bytes of a VALID, COPY or SKIP frame (empty for others).
    pub fn data(&self, id: FrameId) -> &[u8] {
        let h = self.hdr(id.0);
        if let Some(v) = &self.copies[id.0 as usize] {
            return v.as_slice();
        }
        match FrameStatus::from_u32(h.status) {
            FrameStatus::Valid | FrameStatus::Skip => {
                let len = (h.len as usize).min(self.frame_payload());
                &self.payload(id.0)[..len]
            }
            _ => &[],
        }
    }

    /// Whether the frame's datagram was cut short by the kernel (`MSG_TRUNC`).
    pub fn truncated(&self, id: FrameId) -> bool {
        self.hdr(id.0).flags & libc::MSG_TRUNC as u32 != 0
    }

    /// Gives a frame back to the producer (status UNUSED, on top of the free stack, so a small
    /// set of recently used — cached — frames cycles). UNUSED and RESERVED frames are left
    /// alone.
    ///
    /// A frame with pins ([`FrameRing::pin`]) is not given back yet: it stays SKIP (counted as
    /// held) until [`FrameRing::reclaim`] finds its last pin dropped.
    pub fn release(&mut self, id: FrameId) {
        let st = self.status(id);
        if st == FrameStatus::Unused || st == FrameStatus::Reserved {
            return;
        }
        if self.pins[id.0 as usize].load(Ordering::Acquire) > 0 {
            if st != FrameStatus::Skip {
                self.set_status(id.0, FrameStatus::Skip);
                self.held += 1;
            }
            if !self.pinned_released.contains(&id.0) {
                self.pinned_released.push(id.0);
            }
            return;
        }
        if st == FrameStatus::Skip {
            self.held -= 1;
        }
        self.copies[id.0 as usize] = None;
        self.set_status(id.0, FrameStatus::Unused);
        self.free.push(id.0);
    }

    /// Pins `bytes`, which must lie inside the data of frame `id` (VALID, COPY or SKIP; e.g. a
    /// packet's payload parsed out of it): they stay mapped and unchanged until the pin is
    /// dropped, and a [`release`](Self::release) of the frame meanwhile is deferred. `None`
    /// when `bytes` is not inside that frame's data.
    pub fn pin(&self, id: FrameId, bytes: &[u8]) -> Option<FramePin> {
        if id.0 >= self.count {
            return None;
        }
        let data = self.data(id);
        let (start, end) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
        let (a, b) = (
            bytes.as_ptr() as usize,
            bytes.as_ptr() as usize + bytes.len(),
        );
        if data.is_empty() || a < start || b > end {
            return None;
        }
        let keep = match &self.copies[id.0 as usize] {
            // The bytes live in the out-of-line buffer, which the pin shares: the frame
            // itself can be reused.
            Some(v) => PinKeep::Copy(Arc::clone(v)),
            None => {
                self.pins[id.0 as usize].fetch_add(1, Ordering::Relaxed);
                PinKeep::Frame {
                    _region: Arc::clone(&self.region),
                    pins: Arc::clone(&self.pins),
                    id: id.0,
                }
            }
        };
        Some(FramePin {
            keep,
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        })
    }

    /// Gives back the frames released while pinned whose pins have all been dropped. Returns
    /// how many came back.
    pub fn reclaim(&mut self) -> usize {
        if self.pinned_released.is_empty() {
            return 0;
        }
        let mut back = 0;
        let mut i = 0;
        while i < self.pinned_released.len() {
            let id = self.pinned_released[i];
            if self.pins[id as usize].load(Ordering::Acquire) == 0 {
                self.pinned_released.swap_remove(i);
                self.release(FrameId(id));
                back += 1;
            } else {
                i += 1;
            }
        }
        back
    }

    /// Frames released by the consumer but kept out of circulation by pins.
    pub fn pinned(&self) -> usize {
        self.pinned_released.len()
    }

    /// Holds a frame (status SKIP): its bytes stay valid and the producer skips it until
    /// [`release`](Self::release).
    pub fn hold(&mut self, id: FrameId) {
        // Only a frame the consumer has (VALID or COPY) can be held; a free or lent one is not
        // the consumer's, and a held one stays held once.
        if !matches!(self.status(id), FrameStatus::Valid | FrameStatus::Copy) {
            return;
        }
        // A COPY frame keeps its out-of-line buffer; its status word says SKIP.
        self.set_status(id.0, FrameStatus::Skip);
        self.held += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes up to `n` frames, writing `fill(i)` at the start of each payload.
    fn take(r: &mut FrameRing, n: usize) -> Vec<u32> {
        let mut ids = vec![0u32; n];
        let got = r.reserve(&mut ids, |i, p| {
            p[..4].copy_from_slice(&(i as u32).to_ne_bytes())
        });
        ids.truncate(got);
        ids
    }

    #[test]
    fn frames_are_an_odd_number_of_cache_lines_apart() {
        for (size, stride) in [
            (4096, 4160),
            (4160, 4160),
            (2048, 2112),
            (80, 192),
            (32784, 32832),
        ] {
            assert_eq!(frame_stride(size), stride, "{size}");
        }
        // 64 frames of 4 KiB start at 64 different offsets within a page.
        let r = FrameRing::new(4096, 64).unwrap();
        let offsets: std::collections::BTreeSet<usize> =
            (0..64).map(|i| r.frame_ptr(i) as usize % 4096).collect();
        assert_eq!(offsets.len(), 64);
        assert_eq!(
            r.frame_size(),
            4096,
            "the usable size is what was asked for"
        );
        assert_eq!(r.frame_payload(), 4096 - FRAME_HDR_LEN);
    }

    #[test]
    fn a_pinned_frame_comes_back_only_after_its_last_pin_is_dropped() {
        let mut r = FrameRing::new(4096, 2).unwrap();
        let ids = take(&mut r, 1);
        r.complete(FrameId(ids[0]), 16, 0, &[]).unwrap();
        let id = r.pop_ready().unwrap();
        r.hold(id);
        let data = r.data(id);
        let (a, b) = (
            r.pin(id, &data[4..12]).unwrap(),
            r.pin(id, &data[..4]).unwrap(),
        );
        assert_eq!(a.len(), 8);
        assert_eq!(b.as_slice(), &0u32.to_ne_bytes());
        r.release(id);
        assert_eq!(r.status(id), FrameStatus::Skip, "pinned: not reused");
        assert_eq!((r.held(), r.free(), r.pinned()), (1, 1, 1));
        assert_eq!(r.reclaim(), 0);
        drop(a);
        assert_eq!(r.reclaim(), 0, "one pin left");
        // A pin can be dropped on another thread.
        std::thread::spawn(move || drop(b)).join().unwrap();
        assert_eq!(r.reclaim(), 1);
        assert_eq!((r.held(), r.free(), r.pinned()), (0, 2, 0));
        assert_eq!(r.status(id), FrameStatus::Unused);
    }

    #[test]
    fn a_frame_released_unheld_while_pinned_counts_as_held_until_reclaimed() {
        let mut r = FrameRing::new(4096, 1).unwrap();
        let ids = take(&mut r, 1);
        r.complete(FrameId(ids[0]), 8, 0, &[]).unwrap();
        let id = r.pop_ready().unwrap();
        let pin = r.pin(id, r.data(id)).unwrap();
        r.release(id);
        assert!(r.all_held(), "the only frame is kept by its pin");
        assert_eq!(take(&mut r, 1).len(), 0);
        drop(pin);
        r.reclaim();
        assert!(!r.all_held());
        assert_eq!(take(&mut r, 1).len(), 1);
    }

    #[test]
    fn pins_keep_their_bytes_after_the_ring_is_gone() {
        let mut r = FrameRing::new(4096, 1).unwrap();
        let ids = take(&mut r, 1);
        r.complete(FrameId(ids[0]), 4, 0, &[]).unwrap();
        let id = r.pop_ready().unwrap();
        let pin = r.pin(id, r.data(id)).unwrap();
        drop(r);
        assert_eq!(pin.as_slice(), &0u32.to_ne_bytes());
    }

    #[test]
    fn a_pin_of_a_copy_frame_shares_its_buffer_and_lets_the_frame_go() {
        let mut r = FrameRing::new(128, 1).unwrap();
        let payload = r.frame_payload();
        let spill = vec![7u8; 100];
        let ids = take(&mut r, 1);
        assert_eq!(
            r.complete(FrameId(ids[0]), payload + 100, 0, &spill),
            Some(FrameStatus::Copy)
        );
        let id = r.pop_ready().unwrap();
        let pin = r.pin(id, &r.data(id)[payload..]).unwrap();
        r.release(id);
        assert_eq!((r.free(), r.pinned()), (1, 0), "the frame is free at once");
        assert_eq!(pin.as_slice(), &spill[..]);
    }

    #[test]
    fn pins_refuse_bytes_outside_the_frame_data() {
        let mut r = FrameRing::new(4096, 2).unwrap();
        let ids = take(&mut r, 2);
        r.complete(FrameId(ids[0]), 8, 0, &[]).unwrap();
        r.complete(FrameId(ids[1]), 8, 0, &[]).unwrap();
        let (x, y) = (r.pop_ready().unwrap(), r.pop_ready().unwrap());
        assert!(r.pin(x, r.data(y)).is_none());
        assert!(r.pin(x, &[1, 2, 3]).is_none());
        r.release(x);
        assert!(r.pin(x, &[]).is_none(), "a free frame has no data to pin");
    }

    #[test]
    fn frames_start_unused_and_hold_release_cycle() {
        let mut r = FrameRing::new(4096, 4).unwrap();
        for i in 0..4 {
            assert_eq!(r.status(FrameId(i)), FrameStatus::Unused);
        }
        let ids = take(&mut r, 1);
        r.complete(FrameId(ids[0]), 4, 0, &[]).unwrap();
        let id = r.pop_ready().unwrap();
        r.hold(id);
        assert_eq!(r.held(), 1);
        assert_eq!(r.status(id), FrameStatus::Skip);
        assert_eq!(
            r.data(id),
            &0u32.to_ne_bytes(),
            "a held frame's bytes stay readable"
        );
        r.hold(id);
        assert_eq!(r.held(), 1, "holding twice counts once");
        r.release(id);
        assert_eq!(r.held(), 0);
        assert_eq!(r.status(id), FrameStatus::Unused);
        assert_eq!(r.free(), 4);
    }

    #[test]
    fn reserve_takes_the_most_recently_released_frames_first() {
        let mut r = FrameRing::new(256, 8).unwrap();
        // Fresh ring: the stack is 0..8 with 7 on top.
        assert_eq!(take(&mut r, 3), vec![7, 6, 5]);
        for id in [7, 6, 5] {
            assert_eq!(r.status(FrameId(id)), FrameStatus::Reserved);
            r.complete(FrameId(id), 10, 0, &[]).unwrap();
        }
        assert_eq!(r.free(), 5);
        let popped: Vec<u32> = std::iter::from_fn(|| r.pop_ready()).map(|f| f.0).collect();
        assert_eq!(popped, vec![7, 6, 5]);
        // Released in the order 6, 5, 7: 7 is on top, then 5, then 6, then the untouched 4.
        for id in [6, 5, 7] {
            r.release(FrameId(id));
        }
        assert_eq!(take(&mut r, 4), vec![7, 5, 6, 4]);
    }

    #[test]
    fn ready_frames_come_out_in_completion_order_with_rising_seq() {
        let mut r = FrameRing::new(256, 4).unwrap();
        let ids = take(&mut r, 3);
        // Complete out of reservation order: arrival order is completion order.
        for &i in &[1usize, 0, 2] {
            assert_eq!(
                r.complete(FrameId(ids[i]), 4, 0, &[]),
                Some(FrameStatus::Valid)
            );
        }
        let mut seqs = Vec::new();
        let mut order = Vec::new();
        while let Some(id) = r.pop_ready() {
            seqs.push(r.hdr(id.0).seq);
            order.push(id.0);
            // The payload is what `take` wrote for this frame's slot.
            let slot = ids.iter().position(|&x| x == id.0).unwrap() as u32;
            assert_eq!(r.data(id), &slot.to_ne_bytes());
        }
        assert_eq!(order, vec![ids[1], ids[0], ids[2]]);
        assert!(
            seqs.windows(2).all(|w| w[1] == w[0].wrapping_add(1)),
            "{seqs:?}"
        );
    }

    #[test]
    fn unreserve_restores_the_free_stack_order() {
        let mut r = FrameRing::new(256, 6).unwrap();
        let ids = take(&mut r, 4);
        assert_eq!(ids, vec![5, 4, 3, 2]);
        // The receive filled the first one only: the rest go back, 4 on top.
        r.complete(FrameId(ids[0]), 8, 0, &[]).unwrap();
        r.unreserve(&ids[1..]);
        for &id in &ids[1..] {
            assert_eq!(r.status(FrameId(id)), FrameStatus::Unused);
        }
        assert_eq!(take(&mut r, 5), vec![4, 3, 2, 1, 0]);
        // A frame that is not RESERVED is left alone by unreserve and complete.
        let before = r.free();
        r.unreserve(&[5]);
        assert_eq!(r.free(), before);
        assert_eq!(r.complete(FrameId(5), 1, 0, &[]), None);
        assert_eq!(r.complete(FrameId(99), 1, 0, &[]), None);
    }

    #[test]
    fn a_datagram_longer_than_a_frame_becomes_a_copy_frame_with_its_spill() {
        let mut r = FrameRing::new(FRAME_HDR_LEN + 64, 2).unwrap();
        assert_eq!(r.frame_payload(), 64);
        let mut ids = [0u32; 1];
        r.reserve(&mut ids, |_, p| p.fill(0xaa));
        let spill = [0xbbu8; 100];
        // 64 bytes in the frame and 36 in the spill; the spill slot had room for 100.
        assert_eq!(
            r.complete(FrameId(ids[0]), 100, 0, &spill),
            Some(FrameStatus::Copy)
        );
        let id = r.pop_ready().unwrap();
        let d = r.data(id);
        assert_eq!(d.len(), 100);
        assert!(d[..64].iter().all(|&b| b == 0xaa) && d[64..].iter().all(|&b| b == 0xbb));
        // Held, a COPY frame keeps its bytes; released, the buffer goes.
        r.hold(id);
        assert_eq!(r.data(id).len(), 100);
        r.release(id);
        assert!(r.data(id).is_empty());
        // Longer than frame + spill: what arrived is kept, cut to frame + spill.
        let mut ids = [0u32; 1];
        r.reserve(&mut ids, |_, _| {});
        r.complete(FrameId(ids[0]), 500, libc::MSG_TRUNC as u32, &spill[..10])
            .unwrap();
        let id = r.pop_ready().unwrap();
        assert_eq!(r.data(id).len(), 74);
        assert!(r.truncated(id));
    }

    #[test]
    fn inject_fills_a_free_frame_valid_or_copy() {
        let mut r = FrameRing::new(FRAME_HDR_LEN + 64, 2).unwrap();
        assert_eq!(r.inject(&[1, 2, 3]), Some(FrameStatus::Valid));
        let big: Vec<u8> = (0..200u8).collect();
        assert_eq!(r.inject(&big), Some(FrameStatus::Copy));
        assert_eq!(r.inject(&[9]), None, "no frame free");
        let a = r.pop_ready().unwrap();
        assert_eq!(r.data(a), &[1, 2, 3]);
        let b = r.pop_ready().unwrap();
        assert_eq!(r.data(b), &big[..]);
    }

    #[test]
    fn with_every_frame_held_nothing_can_be_reserved_until_one_is_released() {
        let mut r = FrameRing::new(256, 3).unwrap();
        let ids = take(&mut r, 3);
        for &id in &ids {
            r.complete(FrameId(id), 4, 0, &[]).unwrap();
        }
        while let Some(id) = r.pop_ready() {
            assert!(!r.all_held());
            r.hold(id);
        }
        assert!(r.all_held());
        assert_eq!(r.held(), 3);
        assert!(take(&mut r, 2).is_empty());
        assert!(r.lend().is_none());
        // Holding a frame the consumer does not have (free or lent) changes nothing.
        let mut fresh = FrameRing::new(256, 2).unwrap();
        fresh.hold(FrameId(0));
        let lent = fresh.lend().unwrap();
        fresh.hold(lent.id());
        assert_eq!(fresh.held(), 0);
        assert_eq!(fresh.status(FrameId(0)), FrameStatus::Unused);
        assert_eq!(fresh.status(lent.id()), FrameStatus::Reserved);
        // Releasing a RESERVED or UNUSED frame changes nothing; a held one frees it.
        r.release(FrameId(ids[1]));
        assert!(!r.all_held());
        assert_eq!(take(&mut r, 2), vec![ids[1]]);
        r.release(FrameId(ids[1]));
        assert_eq!(r.status(FrameId(ids[1])), FrameStatus::Reserved);
    }

    #[test]
    fn lent_frames_point_into_the_ring_memory_and_come_back_by_completion() {
        let mut r = FrameRing::new(256, 2).unwrap();
        let mem = r.memory();
        let f = r.lend().unwrap();
        assert_eq!(f.id(), FrameId(1));
        assert_eq!(f.len() as usize, r.frame_payload());
        assert!(mem.contains(f.addr(), f.len() as usize));
        assert!(!mem.contains(f.addr(), 1 << 20));
        assert_eq!(r.status(f.id()), FrameStatus::Reserved);
        assert!(
            r.data(f.id()).is_empty(),
            "a lent frame's bytes are not the ring's to read"
        );
        assert_eq!(r.complete(f.id(), 32, 0, &[]), Some(FrameStatus::Valid));
        assert_eq!(r.pop_ready(), Some(f.id()));
        // The memory outlives the ring while a producer keeps it.
        drop(r);
        assert!(mem.contains(f.addr(), 1));
    }
}

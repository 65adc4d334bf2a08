//! A pool of equal-sized send buffers carved from one [`Region`], and the ownership token
//! [`PoolBuf`] that stands for one of them.
//!
//! A `PoolBuf` is the only way to reach a slot's bytes, and it is not `Clone`: whoever holds
//! it owns the slot. Handing it to a [`crate::tx::Sender`] moves it, so the caller cannot
//! touch the bytes while the kernel may still read them; the sender hands it back with the
//! send's completion. Dropping a `PoolBuf` returns the slot to its pool.
//!
//! The whole region can be registered with io_uring as one fixed buffer
//! (`Pool::iovec`): the pool keeps the mapping alive for as long as any `PoolBuf` or
//! registration holder keeps a clone of it.
#![allow(unsafe_code)]

use super::{align_up, Region};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

static POOL_IDS: AtomicU64 = AtomicU64::new(1);

#[derive(Debug)]
struct Inner {
    region: Region,
    slot_size: usize,
    count: usize,
    free: Mutex<Vec<u32>>,
    id: u64,
}

impl Inner {
    fn slot_ptr(&self, idx: u32) -> *mut u8 {
        // SAFETY: `idx < count` (only the pool hands out indices) and `count * slot_size`
        // fits in the region, so the offset stays inside the mapping.
        unsafe { self.region.as_ptr().add(idx as usize * self.slot_size) }
    }
}

/// A fixed set of `count` buffers of `slot_size` bytes each, in one page-aligned mapping.
///
/// Cloning a `Pool` clones a handle to the same buffers.
#[derive(Debug, Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

impl Pool {
    /// Maps `count` slots of `slot_size` bytes (rounded up to 64 bytes). With `huge`, tries
    /// huge pages first (see `Region::new`).
    pub fn new(slot_size: usize, count: usize, huge: bool) -> io::Result<Self> {
        if slot_size == 0 || count == 0 || count > u32::MAX as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("pool of {count} slots of {slot_size} bytes: both must be non-zero"),
            ));
        }
        let slot = align_up(slot_size, 64);
        let total = slot.checked_mul(count).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "pool size overflows usize")
        })?;
        let region = Region::new(total, huge)?;
        let free = (0..count as u32).rev().collect();
        Ok(Self {
            inner: Arc::new(Inner {
                region,
                slot_size: slot,
                count,
                free: Mutex::new(free),
                id: POOL_IDS.fetch_add(1, Ordering::Relaxed),
            }),
        })
    }

    /// Takes a free buffer (length set to its full capacity), or `None` when all are lent out.
    pub fn try_get(&self) -> Option<PoolBuf> {
        let idx = self
            .inner
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()?;
        Some(PoolBuf {
            inner: self.inner.clone(),
            idx,
            len: self.inner.slot_size,
        })
    }

    /// Number of buffers currently free.
    pub fn available(&self) -> usize {
        self.inner
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Total number of buffers.
    pub fn count(&self) -> usize {
        self.inner.count
    }

    /// Capacity of each buffer.
    pub fn slot_size(&self) -> usize {
        self.inner.slot_size
    }

    /// Bytes mapped for the whole pool.
    pub fn region_len(&self) -> usize {
        self.inner.region.len()
    }

    /// Whether `buf` belongs to this pool.
    pub fn owns(&self, buf: &PoolBuf) -> bool {
        buf.inner.id == self.inner.id
    }

    /// Identity of the pool (unique in the process).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The whole mapping as one `iovec`, for `IORING_REGISTER_BUFFERS`. The returned
    /// `PoolPin` keeps the mapping alive; hold it as long as the registration exists.
    pub(crate) fn iovec(&self) -> (libc::iovec, PoolPin) {
        (
            libc::iovec {
                iov_base: self.inner.region.as_ptr().cast(),
                iov_len: self.inner.region.len(),
            },
            PoolPin {
                _inner: self.inner.clone(),
            },
        )
    }
}

/// Keeps a pool's mapping alive (for a kernel registration that points into it).
#[derive(Debug)]
pub struct PoolPin {
    _inner: Arc<Inner>,
}

/// One buffer of a [`Pool`], owned: not `Clone`, returned to the pool on drop.
///
/// It dereferences to its first [`PoolBuf::len`] bytes; [`PoolBuf::set_len`] chooses how much
/// of the slot a send transmits.
#[derive(Debug)]
pub struct PoolBuf {
    inner: Arc<Inner>,
    idx: u32,
    len: usize,
}

// SAFETY: a PoolBuf is the unique owner of its slot (the free list hands each index to one
// PoolBuf at a time), so moving it to another thread moves exclusive access with it.
unsafe impl Send for PoolBuf {}
// SAFETY: shared references only give `&[u8]`.
unsafe impl Sync for PoolBuf {}

impl PoolBuf {
    /// Bytes a send will transmit.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether `len() == 0`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Capacity of the slot.
    pub fn capacity(&self) -> usize {
        self.inner.slot_size
    }

    /// Sets how many bytes a send transmits. Panics if `len > capacity()`.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity(),
            "PoolBuf::set_len({len}) beyond capacity {}",
            self.capacity()
        );
        self.len = len;
    }

    /// Free buffers of this buffer's pool now.
    pub(crate) fn pool_available(&self) -> usize {
        self.inner
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Buffers of this buffer's pool.
    pub(crate) fn pool_count(&self) -> usize {
        self.inner.count
    }

    /// The pool this buffer belongs to.
    pub fn pool_id(&self) -> u64 {
        self.inner.id
    }

    /// Slot index inside the pool.
    pub fn index(&self) -> u32 {
        self.idx
    }
}

impl std::ops::Deref for PoolBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the slot is `slot_size >= len` bytes inside the live mapping, and this
        // PoolBuf is its only owner.
        unsafe { std::slice::from_raw_parts(self.inner.slot_ptr(self.idx), self.len) }
    }
}

impl std::ops::DerefMut for PoolBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` gives exclusive access, and a PoolBuf lent to the
        // kernel is owned by the sender, so no caller can hold `&mut` to it meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.inner.slot_ptr(self.idx), self.len) }
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        self.inner
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.idx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_disjoint_and_return_on_drop() {
        let pool = Pool::new(1000, 3, false).unwrap();
        assert_eq!(pool.slot_size(), 1024);
        let mut a = pool.try_get().unwrap();
        let mut b = pool.try_get().unwrap();
        let c = pool.try_get().unwrap();
        assert!(pool.try_get().is_none());
        a.fill(1);
        b.fill(2);
        assert!(a.iter().all(|&x| x == 1) && b.iter().all(|&x| x == 2));
        assert!(pool.owns(&c));
        drop(c);
        assert_eq!(pool.available(), 1);
        b.set_len(10);
        assert_eq!(b.len(), 10);
        drop((a, b));
        assert_eq!(pool.available(), 3);
    }
}

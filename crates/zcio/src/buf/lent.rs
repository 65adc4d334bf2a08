//! Memory that may be lent to the kernel for reading while its owner moves around: the
//! [`Stable`] contract, and [`Lent`], the one owned type a send ring holds for every kind of
//! buffer it sends from (a pool slot, a received chunk of a buffer ring or zcrx area, or a
//! heap buffer of the plain receiver).
//!
//! A send request points the kernel at bytes and returns before the kernel has read them; the
//! send ring keeps the owner of those bytes until the request's last completion. That is only
//! sound if moving the owner does not move the bytes, and if the bytes stay mapped and
//! unwritten while the owner lives: that is what implementing [`Stable`] promises.
#![allow(unsafe_code)]

use super::bufring::BufLease;
use super::pool::PoolBuf;
use super::refill::ZcrxLease;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// Bytes at an address that does not change while the value lives, wherever it is moved.
///
/// # Safety
///
/// For as long as a value lives, the slice its `Deref` returns must stay at the same address
/// with the same length, readable, and unwritten by anyone (the value being owned by a send
/// ring, nothing else can reach it); moving the value must not move the bytes. A send ring
/// keeps the value until the kernel has finished reading, so an implementation that breaks
/// this lets the kernel read freed or changing memory.
pub unsafe trait Stable: std::ops::Deref<Target = [u8]> {
    /// The registered region the bytes lie in, as [`crate::buf::pool::Pool::id`]: a send ring
    /// that registered that pool sends them as a fixed buffer. `None`: not in a pool.
    fn region(&self) -> Option<u64> {
        None
    }
}

// SAFETY: a PoolBuf's bytes are a slot of its pool's mapping, which its `Arc` keeps mapped;
// the slot belongs to this PoolBuf alone until it drops, and moving the handle moves no bytes.
unsafe impl Stable for PoolBuf {
    fn region(&self) -> Option<u64> {
        Some(self.pool_id())
    }
}

// SAFETY: the lease's range lies in a provided buffer that stays out of the ring (the kernel
// does not write it) until the lease drops; the ring's memory is kept mapped by the lease's
// `Rc`. Moving the lease moves no bytes.
unsafe impl Stable for BufLease {}

// SAFETY: the range lies in the zcrx area, kept mapped by the lease's `Rc`; the kernel does
// not reuse it until the lease drops and returns it through the refill ring.
unsafe impl Stable for ZcrxLease {}

// SAFETY: a Vec's heap allocation does not move when the Vec does, and only `&mut` could
// change or reallocate it, which the send ring owning it never takes.
unsafe impl Stable for Vec<u8> {}

// SAFETY: as for Vec: a boxed slice's allocation stays put when the box moves.
unsafe impl Stable for Box<[u8]> {}

// SAFETY: `Bytes` is immutable: every handle to its storage (static, a shared heap buffer, an
// owner's) only reads it, the storage is freed when the last handle drops (the send ring
// holds one until the kernel is done), and moving a handle moves no bytes. `try_into_mut`
// succeeds only for the one handle left, which is the ring's.
unsafe impl Stable for bytes::Bytes {}

/// A pool of equal heap buffers for the plain receive backend: at most `max` out at once,
/// returned on drop of their [`HeapBuf`].
#[derive(Debug)]
pub struct HeapPool {
    free: RefCell<Vec<Box<[u8]>>>,
    out: Cell<usize>,
    max: usize,
    size: usize,
}

impl HeapPool {
    /// A pool of buffers of `size` bytes, at most `max` lent at once (allocated on demand).
    pub fn new(size: usize, max: usize) -> Rc<Self> {
        Rc::new(Self {
            free: RefCell::new(Vec::new()),
            out: Cell::new(0),
            max,
            size,
        })
    }

    /// Takes a buffer (full size), or `None` when `max` are out.
    pub fn take(self: &Rc<Self>) -> Option<Box<[u8]>> {
        if self.out.get() >= self.max {
            return None;
        }
        self.out.set(self.out.get() + 1);
        Some(
            self.free
                .borrow_mut()
                .pop()
                .unwrap_or_else(|| vec![0u8; self.size].into_boxed_slice()),
        )
    }

    /// Gives back a buffer taken with [`HeapPool::take`] that was not used.
    pub fn give(&self, b: Box<[u8]>) {
        self.out.set(self.out.get() - 1);
        self.free.borrow_mut().push(b);
    }

    /// Buffers out now.
    pub fn out(&self) -> usize {
        self.out.get()
    }

    /// Wraps a taken buffer holding `len` received bytes; dropping it gives the buffer back.
    pub fn lend(self: &Rc<Self>, buf: Box<[u8]>, len: usize) -> HeapBuf {
        HeapBuf {
            len: len.min(buf.len()),
            buf: Some(buf),
            pool: Rc::clone(self),
        }
    }
}

/// Received bytes in a [`HeapPool`] buffer.
#[derive(Debug)]
pub struct HeapBuf {
    buf: Option<Box<[u8]>>,
    len: usize,
    pool: Rc<HeapPool>,
}

impl std::ops::Deref for HeapBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.buf {
            Some(b) => &b[..self.len],
            None => &[],
        }
    }
}

impl Drop for HeapBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.give(b);
        }
    }
}

// SAFETY: the bytes are a boxed slice owned by this value until drop (moving the value moves
// only the box pointer); nothing else can reach them.
unsafe impl Stable for HeapBuf {}

/// Every kind of buffer a send ring can lend to the kernel, owned.
#[derive(Debug)]
pub enum Lent {
    /// A slot of a send pool.
    Pool(PoolBuf),
    /// Bytes received into a provided buffer ring.
    Ring(BufLease),
    /// Bytes received into a zcrx area.
    Zcrx(ZcrxLease),
    /// Bytes received into a heap buffer (plain receive).
    Heap(HeapBuf),
    /// An owned heap vector.
    Vec(Vec<u8>),
    /// Owned, immutable bytes (`bytes::Bytes`), released when the kernel is done.
    Bytes(bytes::Bytes),
}

impl Lent {
    /// A pool slot's pool: `(free buffers, buffers)`; `None` for other memory.
    pub(crate) fn pool_free(&self) -> Option<(usize, usize)> {
        match self {
            Lent::Pool(b) => Some((b.pool_available(), b.pool_count())),
            _ => None,
        }
    }
}

impl std::ops::Deref for Lent {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Lent::Pool(b) => b,
            Lent::Ring(b) => b,
            Lent::Zcrx(b) => b,
            Lent::Heap(b) => b,
            Lent::Vec(b) => b,
            Lent::Bytes(b) => b,
        }
    }
}

// SAFETY: every variant is `Stable` (above); the enum only forwards to it.
unsafe impl Stable for Lent {
    fn region(&self) -> Option<u64> {
        match self {
            Lent::Pool(b) => b.region(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_buffers_come_back_to_their_pool_and_keep_their_address_when_moved() {
        let pool = HeapPool::new(64, 2);
        let mut a = pool.take().unwrap();
        a[..3].copy_from_slice(b"abc");
        let b = pool.take().unwrap();
        assert!(pool.take().is_none());
        pool.give(b);
        let lent = Lent::Heap(pool.lend(a, 3));
        let at = lent.as_ptr();
        let moved = vec![lent];
        assert_eq!(moved[0].as_ptr(), at);
        assert_eq!(&*moved[0], b"abc");
        assert_eq!(pool.out(), 1);
        drop(moved);
        assert_eq!(pool.out(), 0);
    }
}

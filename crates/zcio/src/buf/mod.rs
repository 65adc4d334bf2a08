//! Memory areas handed to the kernel: page-aligned anonymous mappings, optionally on huge
//! pages, unmapped on drop.
//!
//! Everything in this module makes no syscall beyond `mmap`/`munmap`/`mlock`, and its tests run
//! under Miri (`scripts/miri`), the kernel's side of shared memory played by the tests through
//! the addresses user space publishes. Exception: the kernel-allocated buffer ring
//! (`IOU_PBUF_RING_MMAP`) is mapped from an io_uring descriptor, which Miri cannot make; its
//! user-memory twin is the same code past the mapping.
#![allow(unsafe_code)]
// Public under the `unstable-raw` feature, crate-private without it: the `pub` items here are
// the feature's surface (used by the C ABI, the preload shim and the CLI), not dead code.
#![cfg_attr(not(feature = "unstable-raw"), allow(unreachable_pub, dead_code))]

pub mod bufring;
pub mod frames;
pub mod lent;
#[cfg(not(loom))]
pub mod mpsc;
pub mod pool;
pub mod refill;

use crate::sys::syscall;
use std::io;
use std::ptr::NonNull;

/// Page size of this host.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v <= 0 {
        4096
    } else {
        v as usize
    }
}

/// Rounds `n` up to a multiple of `to` (a power of two).
pub fn align_up(n: usize, to: usize) -> usize {
    (n + to - 1) & !(to - 1)
}

/// A page-aligned, zero-filled anonymous mapping.
///
/// The kernel may hold pointers into it (registered buffers, zcrx areas, refill rings) while
/// the owning object lives; owners keep the `Region` alive at least as long as the
/// registration, so dropping it last is always safe.
#[derive(Debug)]
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    huge: bool,
}

// SAFETY: the mapping is plain memory owned by this value; moving it between threads is fine.
unsafe impl Send for Region {}
// SAFETY: shared access only hands out `&[u8]`; writes need `&mut self`.
unsafe impl Sync for Region {}

impl Region {
    /// Maps `len` bytes (rounded up to the page size), every page faulted in now
    /// (`MAP_POPULATE`). With `huge`, tries `MAP_HUGETLB` first and falls back to normal pages
    /// (see [`Region::is_huge`]).
    pub fn new(len: usize, huge: bool) -> io::Result<Self> {
        Self::map(len, huge, true)
    }

    /// Maps `len` bytes whose pages are backed only when first touched (no `MAP_POPULATE`),
    /// for memory sized for a worst case that most of it never sees (the netlink frame ring's
    /// frames hold the largest datagram, while the frames in rotation are a few and the
    /// datagrams mostly small).
    pub fn new_lazy(len: usize) -> io::Result<Self> {
        Self::map(len, false, false)
    }

    fn map(len: usize, huge: bool, populate: bool) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "zero-length region",
            ));
        }
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // Miri's mmap accepts exactly MAP_PRIVATE | MAP_ANONYMOUS: no pre-faulting and no huge
        // pages there (both only change when pages are faulted in, not what the code does).
        #[cfg(not(miri))]
        let base =
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if populate { libc::MAP_POPULATE } else { 0 };
        #[cfg(miri)]
        let base = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        #[cfg(miri)]
        let _ = populate;
        #[cfg(miri)]
        let huge = huge && false;
        if huge {
            let hlen = align_up(len, 2 << 20);
            // SAFETY: anonymous mapping with no address hint; the result is checked.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    hlen,
                    prot,
                    base | libc::MAP_HUGETLB,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                // SAFETY: mmap succeeded, so `p` is non-null.
                let ptr = unsafe { NonNull::new_unchecked(p.cast()) };
                return Ok(Self {
                    ptr,
                    len: hlen,
                    huge: true,
                });
            }
        }
        let plen = align_up(len, page_size());
        // SAFETY: anonymous mapping with no address hint; the result is checked.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), plen, prot, base, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: mmap succeeded, so `p` is non-null.
        let ptr = unsafe { NonNull::new_unchecked(p.cast()) };
        Ok(Self {
            ptr,
            len: plen,
            huge: false,
        })
    }

    /// Length in bytes (a multiple of the page size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true; a region has at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the mapping is on huge pages.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The whole region.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes, readable, and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole region, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` guarantees exclusive access from user space.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Locks the pages in memory (`mlock`); counts against `RLIMIT_MEMLOCK`.
    pub fn lock(&self) -> io::Result<()> {
        // SAFETY: the range is exactly this mapping.
        syscall!(mlock(self.ptr.as_ptr().cast(), self.len)).map(drop)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping was created by `new` with this address and length.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_is_page_aligned_and_zeroed() {
        let mut r = Region::new(5000, false).unwrap();
        assert_eq!(r.len() % page_size(), 0);
        assert!(r.len() >= 5000);
        assert_eq!(r.as_ptr() as usize % page_size(), 0);
        assert!(r.as_slice().iter().all(|&b| b == 0));
        r.as_mut_slice()[4999] = 7;
        assert_eq!(r.as_slice()[4999], 7);
    }
}

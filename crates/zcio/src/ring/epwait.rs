//! `IORING_OP_EPOLL_WAIT` (Linux 6.15): the equivalent of `epoll_wait(2)` on an epoll instance,
//! completed as one CQE whose result is the number of `epoll_event`s the kernel wrote into a
//! buffer. The buffer is owned here and is never handed out while a request is in flight.

use super::key::Key;
use super::Ring;
use io_uring::{cqueue, opcode, types};
use std::io;
use std::os::fd::RawFd;

/// An owned `epoll_event` buffer for one `EPOLL_WAIT` request at a time.
pub struct EpollWaitBuf {
    buf: Box<[libc::epoll_event]>,
    in_flight: bool,
}

impl std::fmt::Debug for EpollWaitBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpollWaitBuf")
            .field("capacity", &self.buf.len())
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

impl EpollWaitBuf {
    /// A buffer for up to `capacity` events (at least 1).
    pub fn new(capacity: usize) -> Self {
        let e = libc::epoll_event { events: 0, u64: 0 };
        Self {
            buf: vec![e; capacity.max(1)].into_boxed_slice(),
            in_flight: false,
        }
    }

    /// How many events one request can return.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Grows the buffer to hold `capacity` events (no-op while a request is in flight, or
    /// when it is already that large).
    pub fn reserve(&mut self, capacity: usize) {
        if !self.in_flight && capacity > self.buf.len() {
            let e = libc::epoll_event { events: 0, u64: 0 };
            self.buf = vec![e; capacity].into_boxed_slice();
        }
    }

    /// Whether a request is queued or live in the kernel (its completion not yet passed to
    /// [`EpollWaitBuf::complete`]).
    pub fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// Queues an `EPOLL_WAIT` on `epfd` for up to `max` events (clamped to the capacity).
    /// Fails with `EBUSY` while a request is already in flight.
    pub fn submit<C: cqueue::EntryMarker>(
        &mut self,
        ring: &mut Ring<C>,
        epfd: RawFd,
        max: usize,
        key: Key,
    ) -> io::Result<()> {
        if self.in_flight {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        let max = max.clamp(1, self.buf.len()) as u32;
        let e = opcode::EpollWait::new(
            types::Fd(epfd),
            self.buf.as_mut_ptr().cast::<types::epoll_event>(),
            max,
        )
        .build()
        .user_data(key.raw());
        // SAFETY: the kernel writes at most `max` ≤ len events into `buf`, which this object
        // owns; while `in_flight` is set nothing here reads or frees it (`events` needs the
        // completion first, and `Drop` leaks the buffer instead of freeing it).
        unsafe { ring.push(&e)? };
        self.in_flight = true;
        Ok(())
    }

    /// A plain `epoll_wait(epfd, .., max, timeout_ms)` into the buffer (grown to `max` first),
    /// for the backend's `epoll_wait` mode. Fails with `EBUSY` while a request is in flight
    /// (the kernel may be writing into the buffer). A blocking call returns `EINTR`.
    pub fn collect_now(
        &mut self,
        epfd: RawFd,
        max: usize,
        timeout_ms: i32,
    ) -> io::Result<&[libc::epoll_event]> {
        if self.in_flight {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        self.reserve(max);
        let max = max.clamp(1, self.buf.len());
        let n = if timeout_ms == 0 {
            crate::sys::epoll::wait(epfd, &mut self.buf[..max], 0)?
        } else {
            crate::sys::epoll::wait_once(epfd, &mut self.buf[..max], timeout_ms)?
        };
        Ok(&self.buf[..n])
    }

    /// Takes the request's completion (`res`: event count or `-errno`) and returns the events
    /// the kernel wrote.
    pub fn complete(&mut self, res: i32) -> &[libc::epoll_event] {
        self.in_flight = false;
        let n = if res > 0 {
            (res as usize).min(self.buf.len())
        } else {
            0
        };
        &self.buf[..n]
    }
}

impl Drop for EpollWaitBuf {
    fn drop(&mut self) {
        if self.in_flight {
            // The kernel may still write into it: leak rather than free (owners cancel and
            // reap before dropping, so this is a last resort).
            std::mem::forget(std::mem::take(&mut self.buf));
        }
    }
}

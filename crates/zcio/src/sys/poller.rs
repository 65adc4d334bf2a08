//! A minimal level-triggered epoll wrapper (for the plain receive backend and baselines).

use super::syscall;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// An epoll instance.
#[derive(Debug)]
pub struct Poller {
    fd: OwnedFd,
    buf: Vec<libc::epoll_event>,
}

impl std::os::fd::AsFd for Poller {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.fd)
    }
}

impl Poller {
    /// `epoll_create1(EPOLL_CLOEXEC)`, with room for `max_events` per wait.
    pub fn new(max_events: usize) -> io::Result<Self> {
        // SAFETY: no pointers; the result is checked.
        let fd = syscall!(epoll_create1(libc::EPOLL_CLOEXEC))?;
        Ok(Self {
            // SAFETY: a fresh descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            buf: vec![libc::epoll_event { events: 0, u64: 0 }; max_events.max(1)],
        })
    }

    fn ctl(&self, op: i32, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` lives for the call.
        syscall!(epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev)).map(drop)
    }

    /// Watches `fd` for `events` (`EPOLLIN`, …), reported with `token`.
    pub fn add(&self, fd: &impl AsRawFd, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd.as_raw_fd(), token, events)
    }

    /// Stops watching `fd`.
    pub fn delete(&self, fd: &impl AsRawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd.as_raw_fd(), 0, 0)
    }

    /// `epoll_wait`: calls `f(token, events)` for each ready descriptor; returns the count.
    pub fn wait(&mut self, timeout_ms: i32, mut f: impl FnMut(u64, u32)) -> io::Result<usize> {
        let n = syscall!(epoll_wait(
            self.fd.as_raw_fd(),
            self.buf.as_mut_ptr(),
            self.buf.len() as i32,
            timeout_ms
        ))? as usize;
        for ev in &self.buf[..n] {
            let (token, events) = (ev.u64, ev.events);
            f(token, events);
        }
        Ok(n)
    }
}

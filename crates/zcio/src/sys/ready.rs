//! A readiness set: one epoll descriptor that becomes readable when any member is ready, so an
//! object with several kernel event sources (a ring's eventfd, a socket's error queue) can be
//! handed to an outside event loop as one descriptor.
//!
//! Members are added level-triggered (the member is drained by reading it: an eventfd) or
//! edge-triggered (the member is drained by other means, and its level may stay up for reasons
//! that are not work: a socket's `EPOLLHUP`). [`ReadySet::consume`] takes pending edges off
//! the set; it must run *before* the members are drained, so an event that comes after the
//! drain makes a new edge.

use super::epoll;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// An epoll set used only as a readiness descriptor.
#[derive(Debug)]
pub struct ReadySet {
    ep: OwnedFd,
}

impl ReadySet {
    /// An empty set.
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            ep: super::move_private_fd(epoll::create()?),
        })
    }

    /// Adds `fd`, ready while `events` hold (level-triggered).
    pub fn add_level(&self, fd: RawFd, events: u32) -> io::Result<()> {
        epoll::ctl(
            self.ep.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            fd,
            events,
            fd as u64,
        )
    }

    /// Adds `fd`, ready once per wake-up that matches `events` (edge-triggered). `EPOLLERR`
    /// and `EPOLLHUP` are always included by the kernel.
    pub fn add_edge(&self, fd: RawFd, events: u32) -> io::Result<()> {
        epoll::ctl(
            self.ep.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            fd,
            events | libc::EPOLLET as u32,
            fd as u64,
        )
    }

    /// Adds `fd` level-triggered, reported to [`ReadySet::drain`] with `token`.
    pub fn add_level_token(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        epoll::ctl(self.ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, events, token)
    }

    /// Adds `fd` edge-triggered, reported to [`ReadySet::drain`] with `token`.
    pub fn add_edge_token(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        epoll::ctl(
            self.ep.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            fd,
            events | libc::EPOLLET as u32,
            token,
        )
    }

    /// Changes the events of an edge-triggered member (re-arming its edge).
    pub fn modify_edge(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        epoll::ctl(
            self.ep.as_raw_fd(),
            libc::EPOLL_CTL_MOD,
            fd,
            events | libc::EPOLLET as u32,
            token,
        )
    }

    /// Removes a member.
    pub fn remove(&self, fd: RawFd) -> io::Result<()> {
        epoll::ctl(self.ep.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, 0, 0)
    }

    /// Takes pending events off the set, handing each member's token and events to `f`.
    pub fn drain(&self, mut f: impl FnMut(u64, u32)) {
        let mut evs = [epoll::empty_event(); 32];
        while let Ok(n) = epoll::wait(self.ep.as_raw_fd(), &mut evs, 0) {
            for ev in &evs[..n] {
                let (token, events) = (ev.u64, ev.events);
                f(token, events);
            }
            if n < evs.len() {
                break;
            }
        }
    }

    /// Takes pending edges off the set (level-triggered members whose level holds come back).
    pub fn consume(&self) {
        let mut evs = [epoll::empty_event(); 8];
        while let Ok(n) = epoll::wait(self.ep.as_raw_fd(), &mut evs, 0) {
            if n < evs.len() {
                break;
            }
        }
    }

    /// Whether the set is readable now (`poll` with a zero timeout).
    pub fn is_ready(&self) -> bool {
        is_readable(self.ep.as_fd())
    }
}

impl AsFd for ReadySet {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ep.as_fd()
    }
}

/// Whether `fd` polls readable (`POLLIN`) right now.
pub fn is_readable(fd: BorrowedFd<'_>) -> bool {
    let mut p = [libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    epoll::poll_now(&mut p).is_ok() && p[0].revents & libc::POLLIN != 0
}

/// Registers a duplicate of `fd` with the current tokio runtime's reactor for readability.
/// The duplicate shares the open file (an eventfd, an epoll set, a socket), so readiness is
/// the same; the `AsyncFd` owns it, so it stays open exactly as long as it is registered.
#[cfg(feature = "tokio")]
pub fn tokio_register(fd: BorrowedFd<'_>) -> io::Result<::tokio::io::unix::AsyncFd<OwnedFd>> {
    tokio_register_for(fd, ::tokio::io::Interest::READABLE)
}

/// [`tokio_register`] for `interest` (a socket's `WRITABLE`, to wait for room).
#[cfg(feature = "tokio")]
pub fn tokio_register_for(
    fd: BorrowedFd<'_>,
    interest: ::tokio::io::Interest,
) -> io::Result<::tokio::io::unix::AsyncFd<OwnedFd>> {
    let own = super::move_private_fd(fd.try_clone_to_owned()?);
    // SAFETY: `own` is a descriptor nobody else holds; the AsyncFd owns it until it
    // deregisters, so it is neither closed nor replaced while registered.
    let r = unsafe { ::tokio::io::unix::AsyncFd::register_with_interest(own, interest) };
    r.map_err(io::Error::from)
}

//! epoll, eventfd and fd-identity wrappers used by the `event` module (its epoll backend, its
//! error checks, and its wake-up path).
//!
//! All functions take raw descriptors: the event API mirrors `epoll_ctl`, which names fds by
//! number, and a C wrapper must be able to pass any number (including bad ones, to get EBADF).

use super::{owned, syscall};
use std::io;
use std::os::fd::{OwnedFd, RawFd};

/// `struct epoll_event` as the kernel lays it out (packed on x86-64).
pub type EpollEvent = libc::epoll_event;

#[cfg(target_arch = "x86_64")]
super::assert_layout!(libc::epoll_event, size = 12, align = 1);
#[cfg(not(target_arch = "x86_64"))]
super::assert_layout!(libc::epoll_event, size = 16, align = 8);

/// `epoll_create1(EPOLL_CLOEXEC)` (2.6.27).
pub fn create() -> io::Result<OwnedFd> {
    // SAFETY: integer argument only.
    let fd = syscall!(epoll_create1(libc::EPOLL_CLOEXEC))?;
    Ok(owned(fd))
}

/// `epoll_ctl(epfd, op, fd, {events, data})`.
pub fn ctl(epfd: RawFd, op: i32, fd: RawFd, events: u32, data: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: data };
    // SAFETY: `ev` lives for the call; the kernel copies it (DEL ignores it).
    syscall!(epoll_ctl(epfd, op, fd, &mut ev)).map(drop)
}

/// `epoll_wait` into `out`; `timeout_ms` −1 blocks. Returns how many entries were filled.
pub fn wait(epfd: RawFd, out: &mut [EpollEvent], timeout_ms: i32) -> io::Result<usize> {
    let max = out.len().min(i32::MAX as usize) as i32;
    // SAFETY: `out` is writable for `max` entries for the duration of the call.
    let n = syscall!(epoll_wait(epfd, out.as_mut_ptr(), max, timeout_ms))?;
    Ok(n as usize)
}

/// `epoll_wait` once: `EINTR` is returned, not retried (for a blocking wait that must report
/// a signal, as `epoll_wait` does).
pub fn wait_once(epfd: RawFd, out: &mut [EpollEvent], timeout_ms: i32) -> io::Result<usize> {
    let max = out.len().min(i32::MAX as usize) as i32;
    // SAFETY: `out` is writable for `max` entries for the duration of the call.
    let n = syscall!(@once epoll_wait(epfd, out.as_mut_ptr(), max, timeout_ms))?;
    Ok(n as usize)
}

/// An empty event, for sizing buffers.
pub fn empty_event() -> EpollEvent {
    libc::epoll_event { events: 0, u64: 0 }
}

/// What `fstat` says about a descriptor: enough to tell a reused fd number from the file that
/// was registered, and to refuse files that cannot be polled (as epoll does with EPERM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdIdentity {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
    /// `st_mode & S_IFMT`.
    pub kind: u32,
}

impl FdIdentity {
    /// Regular files and directories: epoll refuses them with EPERM (they have no poll
    /// method); io_uring would report them always ready.
    pub fn is_unpollable(&self) -> bool {
        self.kind == libc::S_IFREG || self.kind == libc::S_IFDIR
    }
}

/// `fstat(fd)` reduced to [`FdIdentity`]. EBADF for a closed descriptor.
pub fn identity(fd: RawFd) -> io::Result<FdIdentity> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is a writable stat buffer for the call.
    syscall!(fstat(fd, st.as_mut_ptr()))?;
    // SAFETY: fstat succeeded and filled the struct (and it was zeroed before).
    let st = unsafe { st.assume_init() };
    Ok(FdIdentity {
        dev: st.st_dev,
        ino: st.st_ino,
        kind: st.st_mode & libc::S_IFMT,
    })
}

/// Adds `v` to an eventfd counter (`write(2)` of 8 bytes).
pub fn eventfd_write(fd: RawFd, v: u64) -> io::Result<()> {
    let b = v.to_ne_bytes();
    // SAFETY: `b` is 8 readable bytes alive for the call.
    syscall!(write(fd, b.as_ptr().cast(), 8)).map(drop)
}

/// Reads and resets an eventfd counter; `Ok(0)` when it was zero (non-blocking fd).
pub fn eventfd_read(fd: RawFd) -> io::Result<u64> {
    let mut b = [0u8; 8];
    // SAFETY: `b` is 8 writable bytes alive for the call.
    match syscall!(read(fd, b.as_mut_ptr().cast(), 8)) {
        Ok(_) => Ok(u64::from_ne_bytes(b)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        Err(e) => Err(e),
    }
}

/// `poll(2)` with a zero timeout: each entry's `revents` gets the descriptor's readiness now
/// (POLLIN/PRI/OUT/ERR/HUP/RDHUP have epoll's bit values).
pub fn poll_now(fds: &mut [libc::pollfd]) -> io::Result<()> {
    if fds.is_empty() {
        return Ok(());
    }
    // SAFETY: `fds` is a writable array of `len` pollfds for the call.
    syscall!(poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0)).map(drop)
}

//! Signals as a descriptor (`signalfd`, Linux 2.6.22), so daemons can shut down cleanly
//! without async signal handlers.

use super::{owned, syscall};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// Blocks `signals` in the calling thread (threads spawned later inherit the mask) and
/// returns a non-blocking signalfd that reports them.
pub fn block_to_fd(signals: &[i32]) -> io::Result<OwnedFd> {
    // SAFETY: an all-zero sigset_t is a valid value; sigemptyset initialises it properly.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t for the duration of these calls.
    unsafe { libc::sigemptyset(&mut set) };
    for &s in signals {
        // SAFETY: as above; an invalid signal number only makes sigaddset return -1.
        syscall!(sigaddset(&mut set, s))?;
    }
    // SAFETY: `set` is initialised; the old mask is not wanted.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    // SAFETY: `set` is initialised; -1 asks for a new descriptor.
    let fd = syscall!(signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC))?;
    Ok(owned(fd))
}

/// Reads one pending signal from a signalfd; `None` when none is pending.
pub fn read_signal(fd: &impl AsRawFd) -> io::Result<Option<i32>> {
    // SAFETY: an all-zero signalfd_siginfo is a valid value.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let len = std::mem::size_of::<libc::signalfd_siginfo>();
    let ptr = &mut info as *mut libc::signalfd_siginfo as *mut libc::c_void;
    // SAFETY: `ptr`/`len` describe `info`, which lives for the call.
    match syscall!(read(fd.as_raw_fd(), ptr, len)) {
        Ok(n) if n as usize == len => Ok(Some(info.ssi_signo as i32)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

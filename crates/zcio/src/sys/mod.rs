//! Kernel ABI that `libc` and `io-uring` do not cover, and the one syscall wrapper.
//!
//! Every constant names the kernel version that introduced it. Every `#[repr(C)]` struct has
//! its size, alignment and field offsets checked at compile time (the crate-private `assert_layout!` macro).
//! This module, `ring` and `buf` are the only places where `unsafe` is allowed; everything
//! else calls the safe wrappers here.
//!
//! # Memory the kernel writes
//!
//! A struct the kernel writes into (an in/out argument of `io_uring_register`, `getsockopt`,
//! `recvmsg`'s `msghdr` and control buffer, `getsockname`, an ioctl) is passed as a `*mut`
//! derived from a `&mut` borrow that lasts for the call, and read only after it. Memory the
//! kernel writes asynchronously (provided buffers, zcrx areas, frames lent to a receive, an
//! `EPOLL_WAIT` event buffer) is reached through raw pointers from the owning mapping or
//! `&mut`, never through a live `&`; mmap'ed ring words shared with the kernel (SQ/CQ and
//! refill heads and tails, the buffer ring tail) are atomics. A write through a shared
//! reference is undefined behaviour: the compiler may keep the values it knows were stored
//! before the call. This is not theoretical: through a shared reference, every release build
//! reads back zeroed zcrx offsets and refuses zero-copy receive.
//!
//! ## Dependency APIs that must not be used
//!
//! | API | why | use instead |
//! |---|---|---|
//! | `io_uring::Submitter::register_ifq(&self, &io_uring_zcrx_ifq_reg)` (io-uring 0.7.15) | the kernel writes `offsets`, `zcrx_id` and `rq_entries` back through the shared reference | [`zcrx::register_ifq`] (`&mut`) |
//!
//! `clippy.toml` makes a call to any of them a lint error (`disallowed-methods`), so the list
//! is enforced by `.ci/run`'s clippy gate. Every other io-uring call zcio makes hands the
//! kernel memory it only reads (`register_files`, `register_buffers`, `register_eventfd`,
//! `register_buf_ring_with_flags`, `unregister_buf_ring`, `submit_with_args`; the send ring's
//! `register_files_sparse`, `register_files_update` with explicit offsets (the kernel writes
//! back only for `IORING_FILE_INDEX_ALLOC`, never passed), `register_buffers_sparse`,
//! `register_buffers_update`), or takes
//! `&mut` for what the kernel writes (`register_probe`). The upstream fix is for
//! `register_ifq` to take `&mut io_uring_zcrx_ifq_reg` (docs/DESIGN-NOTES.md).
#![allow(unsafe_code)]
// Public under the `unstable-raw` feature, crate-private without it: the `pub` items here are
// the feature's surface (used by the C ABI, the preload shim and the CLI), not dead code.
#![cfg_attr(not(feature = "unstable-raw"), allow(unreachable_pub, dead_code))]

pub mod audit;
pub mod ctnetlink;
pub mod epoll;
pub mod errqueue;
pub mod msg;
pub mod net;
pub mod netlink;
pub mod nflog;
pub mod nfqueue;
pub mod poller;
pub mod ready;
pub mod signal;
pub mod zcrx;
// Compile-time checks against linux-raw-sys (and their macro, for private structs elsewhere).
pub(crate) mod kernel_abi;

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Calls a `libc` function, maps `-1` to [`io::Error`] from `errno` and retries `EINTR`.
///
/// Only usable inside modules that allow `unsafe_code`.
macro_rules! syscall {
    // `@once`: `EINTR` is returned, not retried (a blocking wait that a signal cuts short
    // reports it, as the libc call does).
    (@once $fn:ident ( $($arg:expr),* $(,)? )) => {{
        // SAFETY: as below.
        let res = unsafe { libc::$fn($($arg),*) };
        if res == -1 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(res)
        }
    }};
    ($fn:ident ( $($arg:expr),* $(,)? )) => {{
        loop {
            // SAFETY: the caller passes arguments that satisfy the syscall's contract; each
            // use site states why.
            let res = unsafe { libc::$fn($($arg),*) };
            if res == -1 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                break Err(err);
            }
            break Ok(res);
        }
    }};
}
pub(crate) use syscall;

/// Asserts at compile time the size, alignment and field offsets of a `#[repr(C)]` struct.
macro_rules! assert_layout {
    ($ty:ty, size = $size:expr, align = $align:expr $(, $field:ident = $off:expr)* $(,)?) => {
        const _: () = {
            assert!(std::mem::size_of::<$ty>() == $size);
            assert!(std::mem::align_of::<$ty>() == $align);
            $( assert!(std::mem::offset_of!($ty, $field) == $off); )*
        };
    };
}
pub(crate) use assert_layout;

/// `SOL_SOCKET` option enabling `MSG_ZEROCOPY` on a socket (Linux 4.14).
pub const SO_ZEROCOPY: libc::c_int = 60;
/// `send` flag requesting zero-copy transmission (Linux 4.14; UDP since 5.0).
pub const MSG_ZEROCOPY: libc::c_int = 0x0400_0000;
/// `sock_extended_err.ee_origin` of a zero-copy completion (Linux 4.14).
pub const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
/// `sock_extended_err.ee_code` bit: the kernel copied the data after all (Linux 4.14).
pub const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;
/// `SOL_IP` option delivering errors (and zero-copy completions) on the error queue (2.2).
pub const IP_RECVERR: libc::c_int = 11;
/// `SOL_IPV6` counterpart of [`IP_RECVERR`] (2.2).
pub const IPV6_RECVERR: libc::c_int = 25;
/// `SOL_UDP` option for UDP generic segmentation offload (Linux 4.18).
pub const UDP_SEGMENT: libc::c_int = 103;
/// `SOL_UDP` level number.
pub const SOL_UDP: libc::c_int = 17;
/// `SOL_SOCKET` option: the send buffer usage of `MSG_ZEROCOPY` is bounded by `optmem_max`;
/// this is the errqueue cmsg type for IPv4 (`IP_RECVERR`) completions.
pub const CMSG_IP_RECVERR: libc::c_int = IP_RECVERR;
/// errqueue cmsg type for IPv6 completions (`IPV6_RECVERR`).
pub const CMSG_IPV6_RECVERR: libc::c_int = IPV6_RECVERR;

/// `IORING_RECVSEND_POLL_FIRST` (Linux 5.19).
pub const IORING_RECVSEND_POLL_FIRST: u16 = 1 << 0;
/// `IORING_RECV_MULTISHOT` (Linux 6.0).
pub const IORING_RECV_MULTISHOT: u16 = 1 << 1;
/// `IORING_RECVSEND_FIXED_BUF` (Linux 6.0).
pub const IORING_RECVSEND_FIXED_BUF: u16 = 1 << 2;
/// `IORING_SEND_ZC_REPORT_USAGE`: the notification CQE says whether data was copied (6.2).
pub const IORING_SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_RECVSEND_BUNDLE` (Linux 6.10).
pub const IORING_RECVSEND_BUNDLE: u16 = 1 << 4;
/// `IORING_SEND_VECTORIZED`: a `SEND_ZC`'s `addr`/`len` are an iovec array and its length
/// (Linux 6.17).
pub const IORING_SEND_VECTORIZED: u16 = 1 << 5;
/// Notification CQE `res` bit with `REPORT_USAGE`: the data was copied (Linux 6.2).
pub const IORING_NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;
/// CQE flag: more completions follow for this request (Linux 5.19).
pub const IORING_CQE_F_MORE: u32 = 1 << 1;
/// CQE flag: this CQE is a zero-copy notification (Linux 6.0).
pub const IORING_CQE_F_NOTIF: u32 = 1 << 3;
/// CQE flag: a provided buffer was used; its id is in the upper 16 bits (Linux 5.7).
pub const IORING_CQE_F_BUFFER: u32 = 1 << 0;
/// CQE flag: the buffer of an incrementally consumed ring has more data coming (Linux 6.12).
pub const IORING_CQE_F_BUF_MORE: u32 = 1 << 4;
/// CQE flag: the socket had more data when the recv completed (Linux 5.19).
pub const IORING_CQE_F_SOCK_NONEMPTY: u32 = 1 << 2;
/// `POLL_ADD`/`POLL_REMOVE` `len` flag: multishot poll (Linux 5.13).
pub const IORING_POLL_ADD_MULTI: u32 = 1 << 0;
/// `POLL_REMOVE` `len` flag: replace the events of the matched poll (`POLL_UPDATE`, 5.13).
pub const IORING_POLL_UPDATE_EVENTS: u32 = 1 << 1;
/// `POLL_REMOVE` `len` flag: replace the user_data of the matched poll (5.13).
pub const IORING_POLL_UPDATE_USER_DATA: u32 = 1 << 2;
/// `POLL_ADD` `len` flag: level-triggered poll (Linux 5.18).
pub const IORING_POLL_ADD_LEVEL: u32 = 1 << 3;
/// `io_uring_sqring` flag: completions are waiting in the overflow list (Linux 5.5).
pub const IORING_SQ_CQ_OVERFLOW: u32 = 1 << 1;

/// Wraps a raw descriptor returned by a successful syscall into an [`OwnedFd`].
pub(crate) fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by the kernel, is valid, and nobody else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Lowest number for the descriptors zcio creates for its own objects (io_uring fds, wake-up
/// eventfds); 0 (the default) leaves them where the kernel puts them.
static PRIVATE_FD_FLOOR: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Makes the descriptors zcio creates for its own objects from now on live at `floor` or
/// above, close-on-exec (what an `LD_PRELOAD` shim needs: the program's own descriptors stay
/// at the numbers it expects, and a program that closes or `dup2`s onto "its" low numbers
/// does not hit zcio's). 0 turns it off.
pub fn set_private_fd_floor(floor: i32) {
    PRIVATE_FD_FLOOR.store(floor.max(0), std::sync::atomic::Ordering::Relaxed);
}

/// Called with every descriptor [`dup_private`] creates (an `LD_PRELOAD` shim marks them so
/// it can refuse the program's `close`/`dup2` on them). Set once.
static PRIVATE_FD_HOOK: std::sync::OnceLock<fn(RawFd)> = std::sync::OnceLock::new();

/// Sets the hook called with every private descriptor zcio creates (first call wins).
pub fn set_private_fd_hook(hook: fn(RawFd)) {
    let _ = PRIVATE_FD_HOOK.set(hook);
}

/// The floor set by [`set_private_fd_floor`].
pub fn private_fd_floor() -> i32 {
    PRIVATE_FD_FLOOR.load(std::sync::atomic::Ordering::Relaxed)
}

/// Moves a descriptor zcio just created for itself to [`private_fd_floor`] or above
/// (`F_DUPFD_CLOEXEC`); unchanged when no floor is set, it is already there, or the move
/// fails (e.g. `RLIMIT_NOFILE` below the floor).
pub fn move_private_fd(fd: OwnedFd) -> OwnedFd {
    let floor = private_fd_floor();
    if floor == 0 || fd.as_raw_fd() >= floor {
        return fd;
    }
    match dup_private(fd.as_raw_fd()) {
        Some(high) => owned(high),
        None => fd,
    }
}

/// A close-on-exec duplicate of `fd` at [`private_fd_floor`] or above (the caller owns it),
/// or `None` when no floor is set or the kernel refused.
pub fn dup_private(fd: RawFd) -> Option<RawFd> {
    let floor = private_fd_floor();
    if floor == 0 {
        return None;
    }
    // SAFETY: F_DUPFD_CLOEXEC takes plain integers; returns a new descriptor or -1.
    let high = syscall!(fcntl(fd, libc::F_DUPFD_CLOEXEC, floor)).ok()?;
    if let Some(hook) = PRIVATE_FD_HOOK.get() {
        hook(high);
    }
    Some(high)
}

/// Name of an errno value.
pub fn errno_name(e: i32) -> String {
    let n = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EBADF => "EBADF",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ERANGE => "ERANGE",
        libc::ENOSYS => "ENOSYS",
        libc::ENOPROTOOPT => "ENOPROTOOPT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::ENOBUFS => "ENOBUFS",
        libc::EMFILE => "EMFILE",
        libc::ENFILE => "ENFILE",
        libc::EAGAIN => "EAGAIN",
        _ => return format!("errno {e}"),
    };
    n.to_string()
}

/// `setsockopt` with an `int` value.
pub fn setsockopt_int(fd: &impl AsRawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    let ptr = &value as *const i32 as *const libc::c_void;
    // SAFETY: `ptr` points to an int that lives for the call; the length matches.
    syscall!(setsockopt(fd.as_raw_fd(), level, name, ptr, 4)).map(drop)
}

/// `getsockopt` with an `int` value.
pub fn getsockopt_int(fd: &impl AsRawFd, level: i32, name: i32) -> io::Result<i32> {
    let mut value: i32 = 0;
    let mut len: libc::socklen_t = 4;
    let ptr = &mut value as *mut i32 as *mut libc::c_void;
    // SAFETY: `ptr`/`len` describe a writable int that lives for the call.
    syscall!(getsockopt(fd.as_raw_fd(), level, name, ptr, &mut len))?;
    Ok(value)
}

/// Thread CPU time (user + system) of the calling thread, `CLOCK_THREAD_CPUTIME_ID`.
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; the clock id is a constant the kernel knows.
    let _ = syscall!(clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts));
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Resource limit `(soft, hard)`; `None` means unlimited.
pub fn getrlimit(resource: libc::__rlimit_resource_t) -> io::Result<(Option<u64>, Option<u64>)> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a valid out-pointer.
    syscall!(getrlimit(resource, &mut rl))?;
    let f = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
    Ok((f(rl.rlim_cur), f(rl.rlim_max)))
}

/// Raises the soft limit of `resource` to its hard limit; returns the new soft limit
/// (`None`: unlimited).
pub fn raise_rlimit(resource: libc::__rlimit_resource_t) -> io::Result<Option<u64>> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a valid out-pointer.
    syscall!(getrlimit(resource, &mut rl))?;
    if rl.rlim_cur != rl.rlim_max {
        rl.rlim_cur = rl.rlim_max;
        // SAFETY: `rl` is a valid in-pointer for the call.
        syscall!(setrlimit(resource, &rl))?;
    }
    Ok((rl.rlim_cur != libc::RLIM_INFINITY).then_some(rl.rlim_cur))
}

/// Grows the process's descriptor table to hold descriptor numbers below `n` (at most the
/// soft `RLIMIT_NOFILE`), by placing a descriptor at `n - 1` and closing it; returns the
/// size now reserved. The kernel never shrinks the table, and growing it in a process with
/// more than one thread waits for an RCU grace period (`expand_fdtable` calls
/// `synchronize_rcu` when the table is shared): done once before the descriptors are needed,
/// no later `accept`, `socket` or `dup` waits for it.
pub fn reserve_descriptors(n: u64) -> io::Result<u64> {
    let cap = getrlimit(libc::RLIMIT_NOFILE)?.0.unwrap_or(u64::MAX);
    let n = n.min(cap).min(i32::MAX as u64);
    if n == 0 {
        return Ok(0);
    }
    let fd = eventfd(0)?;
    // SAFETY: F_DUPFD_CLOEXEC takes plain integers; returns a new descriptor or -1.
    let high = syscall!(fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, (n - 1) as i32))?;
    drop(owned(high));
    Ok(n)
}

/// Effective user id is 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Kernel release string (`uname -r`).
pub fn kernel_release() -> String {
    // SAFETY: an all-zero utsname is a valid value of that plain C struct.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid out-pointer.
    if syscall!(uname(&mut u)).is_err() {
        return String::from("unknown");
    }
    let bytes: Vec<u8> = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Creates a non-blocking, close-on-exec eventfd.
pub fn eventfd(initial: u32) -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes plain integers.
    let fd = syscall!(eventfd(initial, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC))?;
    Ok(move_private_fd(owned(fd)))
}

/// Reads `/proc/sys/...` style integer files.
pub fn read_sysctl(path: &str) -> io::Result<i64> {
    let s = std::fs::read_to_string(path)?;
    s.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{path}: not an integer"),
        )
    })
}

/// `socket(2)` with `SOCK_CLOEXEC` added.
pub fn socket(domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: socket takes plain integers.
    let fd = syscall!(socket(domain, ty | libc::SOCK_CLOEXEC, protocol))?;
    Ok(owned(fd))
}

/// `socketpair(2)` with `SOCK_CLOEXEC` added.
pub fn socketpair(domain: i32, ty: i32) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: `fds` is a writable array of two ints for the call.
    syscall!(socketpair(
        domain,
        ty | libc::SOCK_CLOEXEC,
        0,
        fds.as_mut_ptr()
    ))?;
    Ok((owned(fds[0]), owned(fds[1])))
}

/// Effective capability set of the calling thread (`CapEff` from
/// `/proc/thread-self/status`; capabilities are per thread, and the kernel checks the
/// thread that makes the call).
pub fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/thread-self/status")
        .or_else(|_| std::fs::read_to_string("/proc/self/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("CapEff:"))
                .and_then(|l| u64::from_str_radix(l[7..].trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Capability number of CAP_NET_ADMIN.
pub const CAP_NET_ADMIN: u32 = 12;
/// Capability number of CAP_IPC_LOCK.
pub const CAP_IPC_LOCK: u32 = 14;

/// Whether the calling thread has CAP_NET_ADMIN in its effective set.
pub fn has_cap_net_admin() -> bool {
    effective_caps() & (1 << CAP_NET_ADMIN) != 0
}

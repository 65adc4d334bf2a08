//! Capabilities of the calling thread (Linux capabilities are per thread).

use std::io;

/// `CAP_NET_ADMIN`: network administration (`SO_RCVBUFFORCE`, netfilter configuration).
pub const CAP_NET_ADMIN: u32 = 12;
/// `CAP_IPC_LOCK`: exempt from `RLIMIT_MEMLOCK` accounting.
pub const CAP_IPC_LOCK: u32 = 14;

#[repr(C)]
struct Header {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const VERSION_3: u32 = 0x2008_0522;

/// Removes `cap` from the calling thread's effective set (the rest of the process keeps it).
/// Used to test limits that only apply without a capability (e.g. `RLIMIT_MEMLOCK`).
pub fn drop_effective_in_this_thread(cap: u32) -> io::Result<()> {
    let mut hdr = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget with a v3 header writes two Data structs, which `data` provides.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut Header, data.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    data[(cap / 32) as usize].effective &= !(1 << (cap % 32));
    // SAFETY: capset reads the header and two Data structs; pid 0 is the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut Header, data.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

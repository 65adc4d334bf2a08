//! Makes one syscall fail in the calling thread, to test fallbacks for real (io_uring blocked by
//! seccomp, as in many containers).

use std::io;

const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const AUDIT_ARCH_AARCH64: u32 = 0xc000_00b7;

/// From now on, `nr` fails with `errno` in the calling thread (and threads it creates). The
/// filter cannot be removed; call this on a thread made for the purpose.
pub fn deny_syscall_in_this_thread(nr: i64, errno: i32) -> io::Result<()> {
    let arch = if cfg!(target_arch = "x86_64") {
        AUDIT_ARCH_X86_64
    } else {
        AUDIT_ARCH_AARCH64
    };
    let f = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let prog = [
        f(BPF_LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        f(BPF_JEQ_K, 1, 0, arch), // wrong arch: allow
        f(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        f(BPF_LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        f(BPF_JEQ_K, 0, 1, nr as u32),
        f(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | (errno as u32 & 0xffff)),
        f(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut _,
    };
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fprog` points to `prog`, both alive for the call; the kernel copies the filter.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const _,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

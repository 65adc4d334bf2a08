//! CPU placement and accounting for test and bench threads: pinning, the usable CPU count and
//! a thread's CPU time. The zcio library needs none of these for itself (it reads its own
//! thread CPU time for tx pacing), so they live here with the other test-host helpers.

use std::io;
use std::time::Duration;

/// Pins the calling thread to `cpu`.
pub fn pin_thread(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    set_affinity(cpu..cpu + 1)
}

/// Lets the calling thread run on every CPU again (undoes [`pin_thread`]; a thread inherits
/// its creator's pinning).
pub fn unpin_thread() -> io::Result<()> {
    set_affinity(0..libc::CPU_SETSIZE as usize)
}

fn set_affinity(cpus: std::ops::Range<usize>) -> io::Result<()> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in cpus.take_while(|&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: CPU_SET writes inside `set`; `cpu` is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` lives for the call and `size` is its size.
    if unsafe { libc::sched_setaffinity(0, size, &set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Number of CPUs this process may run on (at least 1).
pub fn online_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// CPU time (user + system) of the calling thread, `CLOCK_THREAD_CPUTIME_ID`.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; the clock id is a constant the kernel knows.
    let _ = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_thread_stays_on_its_cpu_and_an_impossible_cpu_is_refused() {
        std::thread::spawn(|| {
            // The CPU it runs on now is one this process may use (cpusets may exclude CPU 0).
            // SAFETY: sched_getcpu has no preconditions.
            let here = unsafe { libc::sched_getcpu() };
            assert!(here >= 0, "sched_getcpu: {}", io::Error::last_os_error());
            pin_thread(here as usize).expect("pin to the current CPU");
            for _ in 0..1000 {
                std::thread::yield_now();
                // SAFETY: as above.
                assert_eq!(unsafe { libc::sched_getcpu() }, here);
            }
            let e = pin_thread(libc::CPU_SETSIZE as usize).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn thread_cpu_time_grows_with_work_on_the_thread() {
        let t0 = thread_cpu_time();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        assert!(thread_cpu_time() > t0, "no CPU time counted ({x})");
        assert!(online_cpus() >= 1);
    }
}

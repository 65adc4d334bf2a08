//! Ring set-up fallbacks and completion accounting on a real kernel.

mod common;

use io_uring::opcode;
use zcio::{Ring, RingConfig, RingError};

/// Runs `f` on a fresh thread where `io_uring_setup` fails with `errno` (seccomp filter).
fn with_io_uring_setup_failing<T: Send + 'static>(
    errno: i32,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        zcio_testnet::seccomp::deny_syscall_in_this_thread(libc::SYS_io_uring_setup, errno)
            .expect("install seccomp filter");
        f()
    })
    .join()
    .expect("thread")
}

#[test]
fn seccomp_enosys_gives_typed_unavailable_error() {
    let res = with_io_uring_setup_failing(libc::ENOSYS, || {
        Ring::<io_uring::cqueue::Entry>::new(&RingConfig::default()).map(drop)
    });
    match res {
        Err(RingError::Unavailable { reason, source }) => {
            assert_eq!(source.raw_os_error(), Some(libc::ENOSYS));
            assert!(reason.contains("seccomp"), "{reason}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
fn eperm_names_the_sysctl_or_seccomp() {
    let res = with_io_uring_setup_failing(libc::EPERM, || {
        Ring::<io_uring::cqueue::Entry>::new(&RingConfig::default()).map(drop)
    });
    match res {
        Err(RingError::Unavailable { reason, .. }) => {
            assert!(
                reason.contains("EPERM") || reason.contains("io_uring_disabled"),
                "{reason}"
            );
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
fn rejected_flags_are_dropped_with_a_reason() {
    // DEFER_TASKRUN without SINGLE_ISSUER is invalid: it must be refused up front, with a reason,
    // and the rest of the configuration must still work.
    let cfg = RingConfig {
        single_issuer: false,
        ..RingConfig::default()
    };
    let ring: Ring = Ring::new(&cfg).expect("ring");
    let dt = ring
        .setup_flags()
        .iter()
        .find(|f| f.name == "DEFER_TASKRUN")
        .unwrap();
    assert!(dt.requested && !dt.granted);
    assert_eq!(dt.reason.as_deref(), Some("requires SINGLE_ISSUER"));
    assert!(ring.has_flag("COOP_TASKRUN"));
    assert!(!ring.has_flag("SINGLE_ISSUER"));
}

#[test]
fn default_ring_gets_single_issuer_and_defer_taskrun_on_this_kernel() {
    let ring: Ring = Ring::new(&RingConfig::default()).expect("ring");
    // Linux >= 6.1: both granted. Older kernels must have recorded why not.
    for f in ring.setup_flags().iter().filter(|f| f.requested) {
        assert!(
            f.granted || f.reason.is_some(),
            "{f:?} neither granted nor explained"
        );
    }
}

#[test]
fn overflowed_completions_are_all_harvested() {
    for cfg in [
        RingConfig {
            entries: 8,
            cq_entries: Some(16),
            ..RingConfig::default()
        },
        RingConfig {
            entries: 8,
            cq_entries: Some(16),
            single_issuer: false,
            defer_taskrun: false,
            ..RingConfig::default()
        },
    ] {
        let mut ring: Ring = Ring::new(&cfg).expect("ring");
        let total = 200u64;
        for i in 0..total {
            // SAFETY: a NOP references no memory.
            unsafe { ring.push(&opcode::Nop::new().build().user_data(i)) }.unwrap();
            if i % 8 == 7 {
                // Wait for this batch without harvesting: the CQ (16) overflows.
                ring.submit_and_wait(1, None).unwrap();
            }
        }
        ring.submit_and_wait(1, None).unwrap();
        let mut seen = vec![false; total as usize];
        let mut n = 0;
        while n < total as usize {
            let got = ring
                .harvest(|c| {
                    assert_eq!(c.result(), 0);
                    let k = c.user_data() as usize;
                    assert!(!seen[k], "completion {k} delivered twice");
                    seen[k] = true;
                })
                .unwrap();
            if got == 0 {
                ring.submit_and_wait(1, Some(std::time::Duration::from_millis(100)))
                    .unwrap();
            }
            n += got;
        }
        assert!(seen.iter().all(|&s| s), "lost completions");
        assert!(
            ring.overflow_flushes() > 0,
            "CQ never overflowed; test did not test anything"
        );
    }
}

/// A batched wait (`want` 64, `min_wait` 1 ms, a 3 s bound) on a ring with the default
/// set-up (DEFER_TASKRUN where the kernel has it) ends soon after the first completion,
/// whether that completion comes before the minimum wait ends (it is held back, then
/// handed over with the wait's end) or after (the kernel then ends the wait on the first
/// completion): a multishot poll of a datagram socket, the completion pattern of every
/// consumer that waits this way (a multishot receive's readiness is a poll wake-up the
/// kernel may batch lazily). A wait that only the 3 s bound ends fails.
#[test]
fn a_batched_wait_ends_soon_after_its_first_completion() {
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixDatagram;
    use std::time::{Duration, Instant};
    let test = "a_batched_wait_ends_soon_after_its_first_completion";
    let mut ring: Ring = Ring::new(&RingConfig::default()).expect("ring");
    if !ring.has_min_wait() {
        eprintln!("SKIP {test}: no IORING_FEAT_MIN_TIMEOUT (Linux 6.12)");
        return;
    }
    let (tx, rx) = UnixDatagram::pair().unwrap();
    rx.set_nonblocking(true).unwrap();
    let poll = opcode::PollAdd::new(io_uring::types::Fd(rx.as_raw_fd()), libc::POLLIN as u32)
        .multi(true)
        .build()
        .user_data(7);
    // SAFETY: a poll references no memory; the socket outlives the ring's use of it (the
    // ring is dropped first, cancelling the poll).
    unsafe { ring.push(&poll) }.unwrap();
    ring.submit().unwrap();
    let bound = Duration::from_secs(3);
    let mut slow = Vec::new();
    let mut took = Vec::new();
    for round in 0..12 {
        // Even rounds: the datagram comes at once (before the 1 ms minimum ends); odd: after
        // 20 ms (the minimum has passed with nothing).
        let delay = Duration::from_millis(if round % 2 == 0 { 0 } else { 20 });
        let t = tx.try_clone().unwrap();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(delay);
            t.send(b"x").unwrap();
            Instant::now()
        });
        if round % 2 == 0 {
            // Let the datagram (and the poll's wake-up) land before the wait starts.
            std::thread::sleep(Duration::from_millis(5));
        }
        let t0 = Instant::now();
        let mut got = 0;
        while got == 0 && t0.elapsed() < bound {
            ring.submit_and_wait_batch(64, Duration::from_millis(1), bound)
                .unwrap();
            got += ring
                .harvest(|c| assert!(c.result() > 0, "poll result {}", c.result()))
                .unwrap();
        }
        let sent = sender.join().unwrap();
        let end = Instant::now();
        let after = end.saturating_duration_since(sent.max(t0));
        took.push(after);
        if got == 0 || after > bound / 3 {
            slow.push((round, delay, after, got));
        }
        let mut b = [0u8; 8];
        while rx.recv(&mut b).is_ok() {}
    }
    eprintln!("{test}: wait end after the datagram: {took:?}");
    assert!(
        slow.is_empty(),
        "waits that ended long after their first completion (round, delay, after, completions): {slow:?}"
    );
}

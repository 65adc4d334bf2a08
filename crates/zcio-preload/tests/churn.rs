//! A program that creates and closes epoll instances in a loop (`tests/c/epoll_churn.c`, the
//! shape of libuv's `signal_multiple_loops`) must not make the kernel's unreclaimable memory
//! grow. Each instance under the shim is a `DEFER_TASKRUN` ring, which the kernel frees only
//! after an RCU grace period, slower than a loop makes them; an unprivileged loop whose rings
//! the kernel refuses (`RLIMIT_MEMLOCK`) left one such context per refusal, about 1 GB a second
//! (a global OOM in CI, twice). `zcio::ring::pace` paces granted rings and stops asking after
//! a refusal; these tests hold it to that on the real kernel: the peak of `SUnreclaim` while
//! the loop runs, and the shim's own counts of the set-ups it made.
//!
//! Both tests live in this file alone: they measure a machine-wide number.

mod common;

use common::{shim_path, stats_sum, TempDir};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One test at a time: each measures the machine's slab.
static SERIAL: Mutex<()> = Mutex::new(());

/// Seconds each loop runs.
const SECS: f64 = 3.0;
/// The most `SUnreclaim` may rise while a loop runs (noise of other work is a few MB; the
/// unpaced loops rose by 180 MB to several GB in the same time).
const SLAB_LIMIT_KB: u64 = 64 * 1024;

fn build(dir: &TempDir) -> Option<PathBuf> {
    common::compile_c(dir, "epoll_churn")
}

fn sunreclaim_kb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .expect("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("SUnreclaim:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("SUnreclaim in /proc/meminfo")
}

/// Waits (up to 60 s) until the kernel has freed what earlier work left, so that a
/// measurement starts from a settled slab: two samples a second apart within 4 MB.
fn settled_slab() -> u64 {
    let mut last = sunreclaim_kb();
    for _ in 0..60 {
        std::thread::sleep(Duration::from_secs(1));
        let now = sunreclaim_kb();
        if now.abs_diff(last) < 4096 {
            return now.min(last);
        }
        last = now;
    }
    last
}

/// Runs the loop under the shim (`unprivileged`: `RLIMIT_MEMLOCK` 0 and no `CAP_IPC_LOCK`,
/// so that the kernel refuses every ring); returns its stdout, the stats file and the rise of
/// `SUnreclaim` over the settled value, sampled every 50 ms while it runs.
fn run_churn(exe: &Path, unprivileged: bool) -> (String, PathBuf, u64, TempDir) {
    let dir = TempDir::new("churn-stats");
    let stats = dir.path().join("stats");
    let base = settled_slab();
    let mut cmd = Command::new(exe);
    cmd.arg(SECS.to_string())
        .env("LD_PRELOAD", shim_path())
        .env("ZCIO_EPOLL_STATS", &stats);
    if unprivileged {
        // SAFETY: only async-signal-safe system calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                let zero = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::setrlimit(libc::RLIMIT_MEMLOCK, &zero) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Root keeps CAP_IPC_LOCK across exec unless the bounding set lacks it (and
                // io_uring charges no memlock to a holder). Without privileges the drop fails,
                // and there is nothing to drop.
                const CAP_IPC_LOCK: libc::c_ulong = 14;
                libc::prctl(libc::PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0);
                Ok(())
            });
        }
    }
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(base));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(sunreclaim_kb(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let out = cmd.output().expect("run epoll_churn");
    // What the loop handed the kernel to free is still waiting right after it ends.
    std::thread::sleep(Duration::from_millis(200));
    done.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "epoll_churn failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let rise = peak.load(Ordering::Relaxed).saturating_sub(base);
    (stdout, stats, rise, dir)
}

fn instances(stdout: &str) -> u64 {
    stdout
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("epoll_churn printed no count: {stdout}"))
}

#[test]
fn a_loop_of_refused_rings_asks_the_kernel_only_after_a_back_off() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = TempDir::new("churn");
    let Some(exe) = build(&dir) else { return };
    let (stdout, stats, rise, _keep) = run_churn(&exe, true);
    let made = instances(&stdout);
    let calls = stats_sum(&stats, "ring_setups");
    let throttled = stats_sum(&stats, "setups_throttled");
    println!(
        "refused rings: {made} instances in {SECS} s, {calls} io_uring_setup calls, \
         {throttled} not made (back-off), SUnreclaim rose {rise} kB"
    );
    // Every instance still works (on the real epoll, the fallback), and the kernel was asked
    // about once per back-off step (10 ms doubling to 1 s: a handful in 3 s), not per instance.
    assert!(made > 100, "the loop hardly ran: {stdout}");
    assert_eq!(
        stats_sum(&stats, "fallbacks"),
        made,
        "each instance falls back, recorded"
    );
    assert!(
        (1..=20).contains(&calls),
        "{calls} set-ups asked of the kernel"
    );
    assert_eq!(calls + throttled, made, "one set-up attempt per instance");
    assert!(
        rise < SLAB_LIMIT_KB,
        "unreclaimable kernel memory rose by {rise} kB"
    );
}

#[test]
fn a_loop_of_granted_rings_is_paced_below_what_the_kernel_frees() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = TempDir::new("churn");
    let Some(exe) = build(&dir) else { return };
    let (stdout, stats, rise, _keep) = run_churn(&exe, false);
    let made = instances(&stdout);
    let rings = stats_sum(&stats, "ring_instances");
    let calls = stats_sum(&stats, "ring_setups");
    let delayed = stats_sum(&stats, "setups_delayed");
    println!(
        "granted rings: {made} instances in {SECS} s, {rings} on a ring, {calls} \
         io_uring_setup calls, {delayed} waited for a token, SUnreclaim rose {rise} kB"
    );
    // Unprivileged runs are refused like the test above: nothing more to see here.
    if stats_sum(&stats, "setups_refused") > 0 {
        println!("SKIP the paced loop: the kernel refused rings (RLIMIT_MEMLOCK without root)");
        assert!(
            std::env::var("ZCIO_REQUIRE_PRIV").as_deref() != Ok("1"),
            "rings refused under ZCIO_REQUIRE_PRIV=1"
        );
        return;
    }
    // Every instance got a ring, and no more of them than the pace allows (a burst of 1,024
    // and 512 a second; the debug shim alone makes ~6,000 a second, the release one more).
    assert_eq!(rings, made, "every instance on a ring");
    let allowed = (1024.0 + 512.0 * (SECS + 0.5)) as u64;
    assert!(
        calls <= allowed,
        "{calls} rings set up in {SECS} s (pace allows {allowed})"
    );
    assert!(
        rise < SLAB_LIMIT_KB,
        "unreclaimable kernel memory rose by {rise} kB"
    );
}

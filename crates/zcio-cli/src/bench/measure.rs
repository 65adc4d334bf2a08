//! Measurement helpers shared by suites.

use std::time::{Duration, Instant};

/// Wall time and this thread's CPU time over a span.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    wall: Instant,
    cpu: Duration,
}

impl Span {
    /// Starts measuring on the calling thread.
    pub fn start() -> Self {
        Self {
            wall: Instant::now(),
            cpu: zcio_testnet::cpu::thread_cpu_time(),
        }
    }
    /// `(wall seconds, thread CPU seconds)` since start; call on the same thread.
    pub fn stop(&self) -> (f64, f64) {
        (
            self.wall.elapsed().as_secs_f64(),
            (zcio_testnet::cpu::thread_cpu_time() - self.cpu).as_secs_f64(),
        )
    }
}

/// This process's user + system CPU seconds, every thread (the kernel's io_uring workers
/// included), from `/proc/self/stat` (10 ms ticks).
pub fn process_cpu() -> anyhow::Result<f64> {
    let s = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    Ok(ticks / 100.0)
}

/// Gbit/s from bytes and seconds.
pub fn gbit_per_s(bytes: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        0.0
    } else {
        bytes as f64 * 8.0 / secs / 1e9
    }
}

/// CPU seconds per GB (10^9 bytes).
pub fn cpu_s_per_gb(cpu_secs: f64, bytes: u64) -> f64 {
    if bytes == 0 {
        f64::NAN
    } else {
        cpu_secs / (bytes as f64 / 1e9)
    }
}

/// Formats a byte count like `64K`, `1M`.
pub fn size_label(n: usize) -> String {
    if n >= 1 << 20 && n % (1 << 20) == 0 {
        format!("{}M", n >> 20)
    } else if n >= 1 << 10 && n % (1 << 10) == 0 {
        format!("{}K", n >> 10)
    } else {
        n.to_string()
    }
}

/// CPUs to pin to for "same core" and "split cores" cases: `(sender, receiver)`.
pub fn core_plan(split: bool) -> (usize, usize) {
    let n = zcio_testnet::cpu::online_cpus();
    if split && n > 1 {
        (0, 1)
    } else {
        (0, 0)
    }
}

//! The sending loop shared by the perf client, the perf server (`-R`) and the bench suites:
//! `size`-byte buffers through a [`Sender`] for a duration. The client's command is in
//! [`super::test`].

use super::pattern;
use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcio::buf::pool::{Pool, PoolBuf};
use zcio::stats::{Counters, Fallback};
use zcio::tx::{Sender, SenderConfig, TxMode, TxStats};

/// What to send.
#[derive(Debug, Clone)]
pub struct ClientOpts {
    /// Send path.
    pub mode: TxMode,
    /// Bytes per send.
    pub size: usize,
    /// How long to send.
    pub duration: Duration,
    /// Sends in flight.
    pub depth: usize,
    /// MSG_ZEROCOPY reap interval.
    pub notify_limit: usize,
    /// Fill buffers with the stream pattern.
    pub verify: bool,
    /// Pin to this CPU.
    pub cpu: Option<usize>,
    /// Send an empty datagram at the end (UDP end marker for `zcio perf server`).
    pub udp_end_marker: bool,
    /// io_uring: requests queued per submitting `io_uring_enter`.
    pub submit_batch: usize,
    /// Call [`Sender::poll`] after every this many sends (0 = never; completions are then
    /// collected only when the pool runs dry).
    pub poll_every: usize,
    /// Look for completions with [`Sender::harvest`] instead of [`Sender::poll`]: io_uring
    /// requests stay queued until `submit_batch` of them are there.
    pub harvest_only: bool,
    /// Bytes of buffers to cycle through, oldest-freed first (0: `depth` buffers). A
    /// working set larger than the last-level cache makes every send read memory that is
    /// not in cache, as a real sender's data is.
    pub working_set: usize,
    /// Send this long before measuring (a TCP connection's window opens, `auto` settles);
    /// the report covers only what follows.
    pub warmup: Duration,
    /// Pace sends to this many bit/s (0: as fast as completions allow).
    pub rate_bps: u64,
    /// Bytes completed so far, updated while sending (for interval lines).
    pub progress: Option<Arc<AtomicU64>>,
    /// Stop early when set (the test was aborted).
    pub stop: Option<Arc<AtomicBool>>,
    /// How long to wait at the end for the last completions (a receiver that stopped
    /// reading makes this run out: an error).
    pub flush_timeout: Duration,
    /// UDP: stamp each datagram's first 8 bytes with its stream offset even without
    /// `verify`, so the receiver can count gaps.
    pub udp_offsets: bool,
}

impl ClientOpts {
    /// Defaults for a mode and size.
    pub fn new(mode: TxMode, size: usize, duration: Duration) -> Self {
        Self {
            mode,
            size,
            duration,
            depth: 64,
            notify_limit: 32,
            verify: false,
            cpu: None,
            udp_end_marker: false,
            submit_batch: 1,
            poll_every: 0,
            harvest_only: false,
            working_set: 0,
            warmup: Duration::ZERO,
            rate_bps: 0,
            progress: None,
            stop: None,
            udp_offsets: false,
            flush_timeout: Duration::from_secs(30),
        }
    }
}

/// The client's report.
#[derive(Debug, Clone, Serialize)]
pub struct ClientReport {
    /// `tcp` or `udp`.
    pub proto: &'static str,
    /// Mode asked for.
    pub mode: String,
    /// Path in use at the end.
    pub path: String,
    /// Bytes per send.
    pub size: usize,
    /// Seconds spent sending (until every completion was in).
    pub seconds: f64,
    /// Bytes completed (after the warm-up).
    pub bytes: u64,
    /// Bytes completed including the warm-up (what the receiver got).
    pub total_bytes: u64,
    /// Sends completed.
    pub sends: u64,
    /// Sends that completed with an error.
    pub errors: u64,
    /// Gbit/s.
    pub gbit_s: f64,
    /// Sending thread CPU seconds.
    pub cpu_s: f64,
    /// Sending thread CPU seconds per GB (10^9 bytes).
    pub cpu_s_per_gb: f64,
    /// All syscalls per send.
    pub syscalls_per_send: f64,
    /// Syscalls made only to collect completions, per send.
    pub notify_syscalls_per_send: f64,
    /// Fraction of zero-copy-attempted bytes the kernel copied (None: nothing attempted).
    pub copied_fraction: Option<f64>,
    /// Counters.
    pub counters: Counters,
    /// Path counters.
    pub stats: TxStats,
    /// Fallbacks taken.
    pub fallbacks: Vec<Fallback>,
}

/// Sends on a connected socket for `opts.duration`; runs on the calling thread (create and
/// drive the sender on the same thread).
pub fn drive(sock: OwnedFd, opts: &ClientOpts) -> Result<ClientReport> {
    if let Some(cpu) = opts.cpu {
        zcio_testnet::cpu::pin_thread(cpu).with_context(|| format!("pinning to CPU {cpu}"))?;
    }
    let count = opts
        .depth
        .max(1)
        .max(opts.working_set.div_ceil(opts.size.max(1)));
    let pool = Pool::new(opts.size, count, false).context("allocating buffers")?;
    let mut cfg = SenderConfig::new(opts.mode);
    cfg.depth = opts.depth.max(1);
    cfg.notify_limit = opts.notify_limit.max(1);
    cfg.submit_batch = opts.submit_batch.max(1);
    let mut tx = Sender::new(sock, &pool, cfg).context("setting up the sender")?;
    let udp = !tx.is_stream();
    let segment = tx.segment();
    // Every buffer, taken in the order they came back: the sender cycles through the whole
    // pool (the pool's own free list would hand back the most recently returned, cache-hot
    // buffer).
    let mut free: VecDeque<PoolBuf> = std::iter::from_fn(|| pool.try_get()).collect();
    if !opts.verify {
        // Constant content: fill every buffer once.
        for b in &mut free {
            pattern::fill(b, 0);
        }
    }
    let mut errors = 0u64;
    let mut sends = 0u64;
    let mut off = 0u64;
    let mut cpu0 = zcio_testnet::cpu::thread_cpu_time();
    let mut t0 = Instant::now();
    let pace0 = t0;
    let mut end = t0 + opts.warmup + opts.duration;
    // What the warm-up did, taken off the report.
    let mut warm: Option<(Counters, TxStats, u64)> = None;
    let warm_end = t0 + opts.warmup;
    let mut since_poll = 0;
    let reap = |tx: &mut Sender, errors: &mut u64, free: &mut VecDeque<PoolBuf>| {
        for (c, buf) in tx.completions() {
            if c.error.is_some() {
                *errors += 1;
            }
            free.push_back(buf);
        }
    };
    loop {
        if sends % 64 == 0 {
            let now = Instant::now();
            if warm.is_none() && !opts.warmup.is_zero() && now >= warm_end {
                warm = Some((tx.counters().clone(), tx.stats().clone(), sends));
                cpu0 = zcio_testnet::cpu::thread_cpu_time();
                t0 = now;
                end = now + opts.duration;
            }
            if now >= end {
                break;
            }
            if let Some(p) = &opts.progress {
                p.store(tx.counters().bytes, Ordering::Relaxed);
            }
            if opts
                .stop
                .as_ref()
                .is_some_and(|s| s.load(Ordering::Relaxed))
            {
                break;
            }
        }
        if opts.rate_bps > 0 {
            // Pace: never more than rate * elapsed on the wire (bytes handed to the sender).
            let allowed = opts.rate_bps as f64 / 8.0 * pace0.elapsed().as_secs_f64();
            let ahead = off as f64 - allowed;
            if ahead > 0.0 {
                let wait = ahead * 8.0 / opts.rate_bps as f64;
                std::thread::sleep(Duration::from_secs_f64(wait.min(0.01)));
                if tx.ready() > 0 {
                    reap(&mut tx, &mut errors, &mut free);
                }
                continue;
            }
        }
        let Some(mut b) = free.pop_front() else {
            // Every buffer in flight: a receiver that stopped reading holds them. The clock
            // and the stop flag are checked here too, or a stalled peer would hold the loop.
            if Instant::now() >= end
                || opts
                    .stop
                    .as_ref()
                    .is_some_and(|s| s.load(Ordering::Relaxed))
            {
                break;
            }
            tx.wait(Duration::from_millis(100))?;
            reap(&mut tx, &mut errors, &mut free);
            continue;
        };
        b.set_len(opts.size);
        if opts.verify {
            fill_for(&mut b, off, udp, segment);
        } else if udp && opts.udp_offsets {
            stamp_offsets(&mut b, off, segment);
        }
        off += opts.size as u64;
        if let Err(r) = tx.send(b) {
            // Backpressure (depth sends in flight, or the socket buffer full on the syscall
            // paths): the buffer is ours again; wait for room and send it next.
            free.push_front(r.buf);
            off -= opts.size as u64;
            tx.wait(Duration::from_millis(100))?;
            reap(&mut tx, &mut errors, &mut free);
            continue;
        }
        sends += 1;
        since_poll += 1;
        if opts.poll_every > 0 && since_poll >= opts.poll_every {
            since_poll = 0;
            if opts.harvest_only {
                tx.harvest()?;
            } else {
                tx.poll()?;
            }
        }
        if tx.ready() > 0 {
            reap(&mut tx, &mut errors, &mut free);
        }
        if errors > 0 {
            break;
        }
    }
    tx.flush(opts.flush_timeout)?;
    reap(&mut tx, &mut errors, &mut free);
    let seconds = t0.elapsed().as_secs_f64();
    let cpu_s = (zcio_testnet::cpu::thread_cpu_time() - cpu0).as_secs_f64();
    if udp && opts.udp_end_marker {
        if let Some(mut b) = free.pop_front() {
            b.set_len(0);
            if let Err(r) = tx.send(b) {
                anyhow::bail!("the end marker was refused: {r}");
            }
            tx.flush(Duration::from_secs(5))?;
            reap(&mut tx, &mut errors, &mut free);
        }
    }
    let total_bytes = tx.counters().bytes;
    let mut c = tx.counters().clone();
    let mut st = tx.stats().clone();
    if let Some((c0, st0, sends0)) = warm {
        c.bytes -= c0.bytes;
        c.ops -= c0.ops;
        c.syscalls -= c0.syscalls;
        c.notifications -= c0.notifications;
        c.zerocopy_bytes -= c0.zerocopy_bytes;
        c.copied_bytes -= c0.copied_bytes;
        st.send_syscalls -= st0.send_syscalls;
        st.notify_syscalls -= st0.notify_syscalls;
        sends -= sends0;
    }
    let ops = sends.max(1) as f64;
    Ok(ClientReport {
        proto: if udp { "udp" } else { "tcp" },
        mode: opts.mode.to_string(),
        path: tx.path().to_string(),
        size: opts.size,
        seconds,
        bytes: c.bytes,
        total_bytes,
        sends,
        errors,
        gbit_s: c.bytes as f64 * 8.0 / seconds / 1e9,
        cpu_s,
        cpu_s_per_gb: if c.bytes == 0 {
            f64::NAN
        } else {
            cpu_s / (c.bytes as f64 / 1e9)
        },
        syscalls_per_send: c.syscalls as f64 / ops,
        notify_syscalls_per_send: st.notify_syscalls as f64 / ops,
        copied_fraction: c.copied_fraction(),
        counters: c,
        stats: st,
        fallbacks: tx.fallbacks().to_vec(),
    })
}

/// Pattern for stream offset `off`; on UDP each datagram's first 8 bytes carry its offset.
fn fill_for(b: &mut [u8], off: u64, udp: bool, segment: usize) {
    pattern::fill(b, off);
    if udp {
        stamp_offsets(b, off, segment);
    }
}

/// Writes each datagram's stream offset into its first 8 bytes (datagrams of `segment`).
fn stamp_offsets(b: &mut [u8], off: u64, segment: usize) {
    let seg = segment.min(b.len()).max(1);
    let mut k = 0;
    while k < b.len() {
        if b.len() - k >= 8 {
            b[k..k + 8].copy_from_slice(&(off + k as u64).to_le_bytes());
        }
        k += seg;
    }
}

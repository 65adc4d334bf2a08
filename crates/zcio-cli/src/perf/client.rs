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

/// Sends from one unconnected UDP socket to every address of `dests`, round-robin, for
/// `opts.duration`: each send is one `opts.size`-byte train to one peer with
/// [`zcio::tx::SendRing::send_to_with`] (cut into datagrams of the path MTU by `UDP_SEGMENT`), each
/// datagram stamped with its offset in that peer's stream. `progress[i]` follows peer `i`'s
/// completed bytes. Returns the totals and each peer's bytes.
pub fn drive_peers(
    sock: OwnedFd,
    dests: &[std::net::SocketAddr],
    opts: &ClientOpts,
    progress: &[Arc<AtomicU64>],
) -> Result<(ClientReport, Vec<u64>)> {
    use zcio::tx::{Dest, SendRing, SendRingConfig, TxBuf};
    anyhow::ensure!(!dests.is_empty(), "no destination");
    if let Some(cpu) = opts.cpu {
        zcio_testnet::cpu::pin_thread(cpu).with_context(|| format!("pinning to CPU {cpu}"))?;
    }
    let v6 = dests[0].is_ipv6();
    // The path MTU towards the peers (an unconnected socket has none): from a socket
    // connected to the first one.
    let segment = {
        let probe = std::net::UdpSocket::bind(if v6 { "[::]:0" } else { "0.0.0.0:0" })?;
        probe.connect(dests[0])?;
        let (level, opt, hdr) = if v6 {
            (libc::SOL_IPV6, libc::IPV6_MTU, 48)
        } else {
            (libc::SOL_IP, libc::IP_MTU, 28)
        };
        zcio::sys::getsockopt_int(&probe, level, opt)
            .map(|m| (m as usize).saturating_sub(hdr))
            .unwrap_or(1472)
            .clamp(1, 65507)
    };
    let max = if v6 { 65527 } else { 65507 };
    let limit = (segment * zcio::tx::MAX_SEGMENTS)
        .min(max / segment * segment)
        .max(segment);
    anyhow::ensure!(
        opts.size <= limit,
        "--len {} is more than one train to a peer: at most {limit} bytes ({} datagrams of {segment} \
         bytes, the path MTU)",
        opts.size,
        limit / segment
    );
    let count = opts
        .depth
        .max(1)
        .max(opts.working_set.div_ceil(opts.size.max(1)));
    let pool = Pool::new(opts.size, count, false).context("allocating buffers")?;
    let mut ring = SendRing::new(&SendRingConfig {
        submit_batch: opts.submit_batch.max(1),
        ..SendRingConfig::default()
    })?;
    // A failure is a recorded fallback (the report shows it).
    let _ = ring.register_pool(&pool);
    let mut cfg = SenderConfig::new(opts.mode);
    cfg.depth = opts.depth.max(1);
    cfg.notify_limit = opts.notify_limit.max(1);
    let id = ring.add(sock, &cfg).context("adding the socket")?;
    let mut free: VecDeque<PoolBuf> = std::iter::from_fn(|| pool.try_get()).collect();
    if !opts.verify {
        for b in &mut free {
            pattern::fill(b, 0);
        }
    }
    let n = dests.len();
    let mut off = vec![0u64; n];
    let mut per_peer = vec![0u64; n];
    let (mut errors, mut sends) = (0u64, 0u64);
    let cpu0 = zcio_testnet::cpu::thread_cpu_time();
    let t0 = Instant::now();
    let end = t0 + opts.duration;
    let mut peer = 0usize;
    let mut sent_bytes = 0u64;
    let reap = |ring: &mut SendRing,
                free: &mut VecDeque<PoolBuf>,
                per_peer: &mut [u64],
                errors: &mut u64| {
        for (c, buf) in ring.completions() {
            if c.error.is_some() {
                *errors += 1;
            } else if let Some(p) = per_peer.get_mut(c.token as usize) {
                *p += c.bytes as u64;
                if let Some(a) = progress.get(c.token as usize) {
                    a.store(*p, Ordering::Relaxed);
                }
            }
            if let TxBuf::Pool(b) = buf {
                free.push_back(b);
            }
        }
    };
    loop {
        if sends % 64 == 0
            && (Instant::now() >= end
                || opts
                    .stop
                    .as_ref()
                    .is_some_and(|s| s.load(Ordering::Relaxed)))
        {
            break;
        }
        if opts.rate_bps > 0 {
            let allowed = opts.rate_bps as f64 / 8.0 * t0.elapsed().as_secs_f64();
            let ahead = sent_bytes as f64 - allowed;
            if ahead > 0.0 {
                std::thread::sleep(Duration::from_secs_f64(
                    (ahead * 8.0 / opts.rate_bps as f64).min(0.01),
                ));
                ring.poll()?;
                reap(&mut ring, &mut free, &mut per_peer, &mut errors);
                if Instant::now() >= end {
                    break;
                }
                continue;
            }
        }
        let Some(mut b) = free.pop_front() else {
            if Instant::now() >= end {
                break;
            }
            ring.wait(Duration::from_millis(100))?;
            reap(&mut ring, &mut free, &mut per_peer, &mut errors);
            continue;
        };
        b.set_len(opts.size);
        if opts.verify {
            fill_for(&mut b, off[peer], true, segment);
        } else {
            stamp_offsets(&mut b, off[peer], segment);
        }
        let mut to = Dest::new(dests[peer]);
        if opts.size > segment {
            to = to.segment(segment as u16);
        }
        match ring.send_to_with(id, b, &to, peer as u64) {
            Ok(_) => {
                off[peer] += opts.size as u64;
                sent_bytes += opts.size as u64;
                sends += 1;
                peer = (peer + 1) % n;
            }
            Err(r) => {
                if let TxBuf::Pool(b) = r.buf {
                    free.push_front(b);
                }
                ring.wait(Duration::from_millis(100))?;
            }
        }
        if ring.ready() > 0 {
            reap(&mut ring, &mut free, &mut per_peer, &mut errors);
        }
        if errors > 0 {
            break;
        }
    }
    ring.flush(opts.flush_timeout)?;
    reap(&mut ring, &mut free, &mut per_peer, &mut errors);
    let seconds = t0.elapsed().as_secs_f64();
    let cpu_s = (zcio_testnet::cpu::thread_cpu_time() - cpu0).as_secs_f64();
    if opts.udp_end_marker {
        for &d in dests {
            if let Err(r) = ring.send_to_with(id, Vec::new(), &Dest::new(d), u64::MAX) {
                anyhow::bail!("the end marker was refused: {r}");
            }
        }
        ring.flush(Duration::from_secs(5))?;
        reap(&mut ring, &mut free, &mut per_peer, &mut errors);
    }
    use zcio::stats::Report;
    // The ring's own kernel entries are the socket's too (it is the ring's only socket).
    let c = ring.counters();
    let st = ring.stats();
    let bytes: u64 = per_peer.iter().sum();
    let ops = sends.max(1) as f64;
    let rep = ClientReport {
        proto: "udp",
        mode: opts.mode.to_string(),
        path: ring
            .sock_path(id)
            .map_or_else(|| ring.path().to_string(), |p| p.to_string()),
        size: opts.size,
        seconds,
        bytes,
        total_bytes: bytes,
        sends,
        errors,
        gbit_s: bytes as f64 * 8.0 / seconds / 1e9,
        cpu_s,
        cpu_s_per_gb: if bytes == 0 {
            f64::NAN
        } else {
            cpu_s / (bytes as f64 / 1e9)
        },
        syscalls_per_send: c.syscalls as f64 / ops,
        notify_syscalls_per_send: st.notify_syscalls as f64 / ops,
        copied_fraction: c.copied_fraction(),
        counters: c,
        stats: st,
        fallbacks: ring.sock_fallbacks(id).to_vec(),
    };
    Ok((rep, per_peer))
}

//! The `tx` suite's many-socket cases: `conns` loopback TCP connections, sends of one size
//! round-robin over them, from one thread, three ways:
//!
//! - **epoll + send** (the baseline an event loop uses): non-blocking sockets, one `send` per
//!   buffer, a socket that is full waits for `EPOLLOUT` (`epoll_ctl` + `epoll_wait`) while the
//!   others go on;
//! - **shared ring**: one `tx::SendRing` for all sockets (`auto`: on loopback every
//!   completion is COPIED, so after its first sends each socket sends by io_uring `SEND` on
//!   the ring), one `io_uring_enter` per `batch` requests across sockets;
//! - **ring per socket**: a `tx::Sender` per socket (its own io_uring, `auto`), which enters
//!   the kernel for each send of a round-robin.
//!
//! Every side sends from the same cold working set (buffers of the run's pool, oldest
//! returned first), warms up (connections open their windows, `auto` sees its first
//! COPIED completions), then measures the sending thread's CPU, the bytes completed and the
//! system calls it made.

use crate::bench::measure::core_plan;
use anyhow::{Context, Result};
use std::collections::VecDeque;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};
use zcio::stats::Report;
use zcio::tx::{Pool, PoolBuf, SendRing, SendRingConfig, Sender, SenderConfig, TxBuf, TxMode};

/// Which sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Way {
    EpollSend,
    SharedRing,
    RingPerSocket,
}

/// One run's settings.
#[derive(Debug, Clone)]
pub(super) struct ManyOpts {
    pub(super) conns: usize,
    pub(super) size: usize,
    pub(super) warmup: Duration,
    pub(super) dur: Duration,
    /// Bytes of send buffers cycled through.
    pub(super) ws: usize,
    /// Shared ring: requests per `io_uring_enter`.
    pub(super) batch: usize,
}

/// What one run measured (after the warm-up); `tx_peers` reports the same.
#[derive(Debug, Clone, Default)]
pub(super) struct ManyReport {
    pub(super) bytes: u64,
    pub(super) sends: u64,
    pub(super) secs: f64,
    pub(super) cpu_s: f64,
    /// System calls the sending thread made (kernel entries).
    pub(super) syscalls: u64,
    pub(super) copied_fraction: Option<f64>,
    pub(super) note: String,
}

impl ManyReport {
    pub(super) fn cpu_s_per_gb(&self) -> f64 {
        crate::bench::measure::cpu_s_per_gb(self.cpu_s, self.bytes)
    }
    pub(super) fn gbit_s(&self) -> f64 {
        crate::bench::measure::gbit_per_s(self.bytes, self.secs)
    }
    pub(super) fn entries_per_1k(&self) -> f64 {
        self.syscalls as f64 * 1000.0 / self.sends.max(1) as f64
    }
    pub(super) fn syscalls_per_send(&self) -> f64 {
        self.syscalls as f64 / self.sends.max(1) as f64
    }
}

/// Reads every connection to its end (one thread, epoll); returns the bytes received.
/// `delay_acks`: at accept and after each read, `TCP_QUICKACK` 0 (the kernel's delayed-ACK mode, which it
/// leaves after each delayed ACK), so every ACK comes from the delayed-ACK timer, as a
/// network peer's come: after the sender's call, never inside it (see `tx_scale`).
pub(super) fn serve(l: TcpListener, conns: usize, delay_acks: bool) -> std::io::Result<u64> {
    let mut socks = Vec::with_capacity(conns);
    let mut poller = zcio::sys::poller::Poller::new(256)?;
    while socks.len() < conns {
        let (s, _) = l.accept()?;
        s.set_nonblocking(true)?;
        if delay_acks {
            zcio::sys::setsockopt_int(&s, libc::IPPROTO_TCP, libc::TCP_QUICKACK, 0)?;
        }
        poller.add(&s, socks.len() as u64, libc::EPOLLIN as u32)?;
        socks.push(Some(s));
    }
    let mut open = conns;
    let mut total = 0u64;
    let mut buf = vec![0u8; 256 << 10];
    let mut ready = Vec::new();
    while open > 0 {
        ready.clear();
        poller.wait(1000, |t, _| ready.push(t as usize))?;
        for &i in &ready {
            let Some(s) = socks[i].as_mut() else { continue };
            loop {
                match s.read(&mut buf) {
                    Ok(0) => {
                        poller.delete(s)?;
                        socks[i] = None;
                        open -= 1;
                        break;
                    }
                    Ok(n) => total += n as u64,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if delay_acks {
                            zcio::sys::setsockopt_int(
                                &*s,
                                libc::IPPROTO_TCP,
                                libc::TCP_QUICKACK,
                                0,
                            )?;
                        }
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(total)
}

/// One measured run of `way`: the server on one core, the sender on the other.
pub(super) fn run(way: Way, o: &ManyOpts) -> Result<ManyReport> {
    let (score, rcore) = core_plan(true);
    let l = TcpListener::bind("127.0.0.1:0")?;
    l.set_nonblocking(false)?;
    let addr = l.local_addr()?;
    let conns = o.conns;
    let p = crate::bench::pair::pair(format!("tx many {way:?}")).cores((score, rcore));
    let server = p.server(move || serve(l, conns, false))?;
    let o2 = o.clone();
    let client = p.client(move || -> Result<(ManyReport, u64)> {
        name_thread(match way {
            Way::EpollSend => c"tx-epoll-send",
            Way::SharedRing => c"tx-shared-ring",
            Way::RingPerSocket => c"tx-ring-per-so",
        });
        let socks: Vec<TcpStream> = (0..o2.conns)
            .map(|_| TcpStream::connect(addr))
            .collect::<std::io::Result<_>>()
            .context("connecting")?;
        match way {
            Way::EpollSend => epoll_send(socks, &o2),
            Way::SharedRing => shared_ring(socks, &o2),
            Way::RingPerSocket => ring_per_socket(socks, &o2),
        }
    })?;
    let (rep, total) = client.result()?;
    let got = server.io_result()?;
    crate::bench::pair::ensure_bytes(got, total)?;
    Ok(rep)
}

/// Names the sending thread after its side, so a profile (`perf report --comm`) tells the
/// sides apart.
fn name_thread(name: &std::ffi::CStr) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes (these are).
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
}

/// The buffers of a run: `ws` bytes of `size`-byte buffers (at least `min`), filled once,
/// taken oldest-returned first. Shared with `tx_peers`.
pub(super) fn buffers(size: usize, ws: usize, min: usize) -> Result<(Pool, VecDeque<PoolBuf>)> {
    let count = (ws / size.max(1)).max(min).max(1);
    let pool = Pool::new(size, count, false).context("allocating buffers")?;
    let mut free: VecDeque<PoolBuf> = std::iter::from_fn(|| pool.try_get()).collect();
    for (k, b) in free.iter_mut().enumerate() {
        b.fill(k as u8 | 1);
    }
    Ok((pool, free))
}

/// Times a run with a warm-up: the clocks are read at the end of the warm-up (the caller
/// snapshots its counters then) and at the end. Shared with `tx_peers`.
pub(super) struct Clock {
    warm_end: Instant,
    end: Instant,
    /// Wall and thread CPU time at the start, then at the end of the warm-up.
    marked: (Instant, Duration),
    warmed: bool,
}

impl Clock {
    pub(super) fn new(warmup: Duration, dur: Duration) -> Self {
        let t0 = Instant::now();
        Self {
            warm_end: t0 + warmup,
            end: t0 + warmup + dur,
            marked: (t0, zcio_testnet::cpu::thread_cpu_time()),
            warmed: false,
        }
    }
    /// Whether the warm-up just ended (once).
    pub(super) fn warm_done(&mut self) -> bool {
        if !self.warmed && Instant::now() >= self.warm_end {
            self.warmed = true;
            self.marked = (Instant::now(), zcio_testnet::cpu::thread_cpu_time());
            return true;
        }
        false
    }
    pub(super) fn over(&self) -> bool {
        Instant::now() >= self.end
    }
    /// `(wall, cpu)` seconds since the warm-up ended (since the start if it never did).
    pub(super) fn stop(&self) -> (f64, f64) {
        let (w, c) = self.marked;
        (
            w.elapsed().as_secs_f64(),
            (zcio_testnet::cpu::thread_cpu_time() - c).as_secs_f64(),
        )
    }
}

fn epoll_send(socks: Vec<TcpStream>, o: &ManyOpts) -> Result<(ManyReport, u64)> {
    let (_pool, mut free) = buffers(o.size, o.ws, 1)?;
    let n = socks.len();
    for s in &socks {
        s.set_nonblocking(true)?;
    }
    let mut poller = zcio::sys::poller::Poller::new(n.max(1))?;
    // Per socket: the buffer being sent and how far (a short send finishes it before the next).
    let mut cur: Vec<Option<(PoolBuf, usize)>> = (0..n).map(|_| None).collect();
    let mut blocked = vec![false; n];
    let mut in_epoll = vec![false; n];
    let mut nblocked = 0;
    let (mut bytes, mut sends, mut calls) = (0u64, 0u64, 0u64);
    let (mut b0, mut s0, mut c0) = (0, 0, 0);
    let mut clock = Clock::new(o.warmup, o.dur);
    let mut i = 0;
    let mut ready = Vec::new();
    'outer: loop {
        if sends % 64 == 0 {
            if clock.warm_done() {
                (b0, s0, c0) = (bytes, sends, calls);
            }
            if clock.over() {
                break 'outer;
            }
        }
        if nblocked == n {
            ready.clear();
            calls += 1;
            poller.wait(10, |t, _| ready.push(t as usize))?;
            for &k in &ready {
                if blocked[k] {
                    blocked[k] = false;
                    nblocked -= 1;
                }
            }
            if clock.over() {
                break;
            }
            continue;
        }
        i = (i + 1) % n;
        if blocked[i] {
            continue;
        }
        let (buf, off) = match cur[i].take() {
            Some(c) => c,
            None => (free.pop_front().expect("buffers"), 0),
        };
        calls += 1;
        match zcio::sys::net::send(
            &socks[i],
            &buf[off..],
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        ) {
            Ok(k) if off + k == buf.len() => {
                bytes += buf.len() as u64;
                sends += 1;
                free.push_back(buf);
            }
            Ok(k) => {
                cur[i] = Some((buf, off + k));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                cur[i] = Some((buf, off));
                blocked[i] = true;
                nblocked += 1;
                if !in_epoll[i] {
                    // Edge-triggered EPOLLOUT: one registration per socket for the run.
                    calls += 1;
                    poller.add(&socks[i], i as u64, (libc::EPOLLOUT | libc::EPOLLET) as u32)?;
                    in_epoll[i] = true;
                }
            }
            Err(e) => return Err(e).context("send"),
        }
    }
    let (secs, cpu_s) = clock.stop();
    // Whatever is half-sent goes out in full, so the receiver's count is exact.
    let mut total = bytes;
    for (k, c) in cur.into_iter().enumerate() {
        if let Some((buf, off)) = c {
            socks[k].set_nonblocking(false)?;
            use std::io::Write;
            (&socks[k]).write_all(&buf[off..])?;
            total += (buf.len() - off) as u64;
        }
    }
    drop(socks);
    Ok((
        ManyReport {
            bytes: bytes - b0,
            sends: sends - s0,
            secs,
            cpu_s,
            syscalls: calls - c0,
            copied_fraction: None,
            note: "epoll + send: one send per buffer, EPOLLOUT (edge) when a socket is full".into(),
        },
        total,
    ))
}

fn shared_ring(socks: Vec<TcpStream>, o: &ManyOpts) -> Result<(ManyReport, u64)> {
    let depth = 16;
    let (pool, mut free) = buffers(o.size, o.ws, o.conns * depth + 64)?;
    let mut ring = SendRing::new(&SendRingConfig {
        ring: zcio::RingConfig {
            entries: 1024,
            ..zcio::RingConfig::default()
        },
        files: o.conns as u32 + 64,
        submit_batch: o.batch,
    })?;
    let registered = ring.register_pool(&pool).is_ok();
    let mut cfg = SenderConfig::new(TxMode::Auto);
    cfg.depth = depth;
    let ids = socks
        .into_iter()
        .map(|s| ring.add(OwnedFd::from(s), &cfg))
        .collect::<Result<Vec<_>, _>>()?;
    let n = ids.len();
    // Sockets that can take a send, round-robin; a refused one waits until the ring names
    // it writable (as an event loop keeps its sockets' writability).
    let mut readyq: VecDeque<usize> = (0..n).collect();
    let mut blocked = vec![false; n];
    let pos: std::collections::HashMap<zcio::tx::SockId, usize> =
        ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    let (mut bytes, mut sends, mut errors) = (0u64, 0u64, 0u64);
    let mut base = None;
    let mut clock = Clock::new(o.warmup, o.dur);
    let mut iter = 0u64;
    let reap = |ring: &mut SendRing,
                free: &mut VecDeque<PoolBuf>,
                readyq: &mut VecDeque<usize>,
                blocked: &mut Vec<bool>,
                bytes: &mut u64,
                sends: &mut u64,
                errors: &mut u64| {
        for (c, b) in ring.completions() {
            if c.error.is_some() {
                *errors += 1;
            }
            *bytes += c.bytes as u64;
            *sends += 1;
            if let TxBuf::Pool(b) = b {
                free.push_back(b);
            }
        }
        while let Some(id) = ring.next_writable() {
            if let Some(&i) = pos.get(&id) {
                if blocked[i] {
                    blocked[i] = false;
                    readyq.push_back(i);
                }
            }
        }
    };
    loop {
        iter += 1;
        if iter % 64 == 0 {
            if clock.warm_done() {
                base = Some((bytes, sends, ring.counters_total(), ring.enters()));
            }
            if clock.over() {
                break;
            }
        }
        if readyq.is_empty() || free.is_empty() {
            ring.wait(Duration::from_millis(10))?;
            reap(
                &mut ring,
                &mut free,
                &mut readyq,
                &mut blocked,
                &mut bytes,
                &mut sends,
                &mut errors,
            );
            if clock.over() {
                break;
            }
            continue;
        }
        let i = readyq.pop_front().expect("checked");
        let b = free.pop_front().expect("checked");
        match ring.send(ids[i], b) {
            Ok(_) => readyq.push_back(i),
            Err(r) => {
                blocked[i] = true;
                free.push_front(r.buf.into_pool().expect("pool buffer"));
            }
        }
        if ring.ready() > 0 {
            reap(
                &mut ring,
                &mut free,
                &mut readyq,
                &mut blocked,
                &mut bytes,
                &mut sends,
                &mut errors,
            );
        }
    }
    let (secs, cpu_s) = clock.stop();
    let (b0, s0, c0, e0) = base.unwrap_or((0, 0, Default::default(), 0));
    let c1 = ring.counters_total();
    let enters = ring.enters() - e0;
    let syscalls = c1.syscalls - c0.syscalls;
    let zc = c1.zerocopy_bytes - c0.zerocopy_bytes;
    let cp = c1.copied_bytes - c0.copied_bytes;
    let st = ring.stats();
    let note = format!(
        "shared ring ({}; fixed buffers {}): {enters} io_uring_enter for {} sends in the \
         measured part, sends by path {:?} (copy, msg-zc, uring-zc, uring-zc-fixed, \
         uring-copy), fallbacks {}",
        Report::path(&ring),
        if registered {
            "registered"
        } else {
            "not registered"
        },
        sends - s0,
        st.sends_by_path,
        ring.fallbacks().len()
    );
    ring.flush(Duration::from_secs(20))?;
    reap(
        &mut ring,
        &mut free,
        &mut readyq,
        &mut blocked,
        &mut bytes,
        &mut sends,
        &mut errors,
    );
    anyhow::ensure!(errors == 0, "{errors} sends failed");
    let total = ring.counters_total().bytes;
    for id in ids {
        ring.close(id)?;
    }
    drop(ring);
    Ok((
        ManyReport {
            bytes: bytes - b0,
            sends: sends - s0,
            secs,
            cpu_s,
            syscalls,
            // Bytes the kernel copied: all but those zero-copy completions said were not (on
            // loopback none: SEND copies, and the zero-copy probes come back COPIED).
            copied_fraction: Some({
                let _ = cp;
                1.0 - zc as f64 / (bytes - b0).max(1) as f64
            }),
            note,
        },
        total,
    ))
}

fn ring_per_socket(socks: Vec<TcpStream>, o: &ManyOpts) -> Result<(ManyReport, u64)> {
    let depth = 16;
    let (pool, mut free) = buffers(o.size, o.ws, o.conns * depth + 64)?;
    let mut cfg = SenderConfig::new(TxMode::Auto);
    cfg.depth = depth;
    cfg.submit_batch = 1;
    let mut txs = socks
        .into_iter()
        .map(|s| Sender::new(s, &pool, cfg.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let n = txs.len();
    let mut readyq: VecDeque<usize> = (0..n).collect();
    let mut blocked: Vec<usize> = Vec::new();
    let (mut bytes, mut sends, mut errors) = (0u64, 0u64, 0u64);
    let mut base = None;
    let mut clock = Clock::new(o.warmup, o.dur);
    let syscalls = |txs: &[Sender]| txs.iter().map(|t| t.counters().syscalls).sum::<u64>();
    let mut iter = 0u64;
    loop {
        iter += 1;
        if iter % 64 == 0 {
            if clock.warm_done() {
                base = Some((bytes, sends, syscalls(&txs)));
            }
            if clock.over() {
                break;
            }
        }
        if readyq.is_empty() || free.is_empty() {
            // Every socket is at its depth (or every buffer out): look at each ring for
            // completions (an enter only where the kernel flagged work), then wait briefly.
            let mut any = false;
            for tx in txs.iter_mut() {
                tx.poll()?;
                any |= tx.ready() > 0;
            }
            if !any {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let Some(i) = readyq.pop_front().or_else(|| {
            blocked.retain(|&k| {
                if txs[k].has_room() {
                    readyq.push_back(k);
                    false
                } else {
                    true
                }
            });
            readyq.pop_front()
        }) else {
            if clock.over() {
                break;
            }
            continue;
        };
        let tx = &mut txs[i];
        tx.harvest()?;
        for (c, b) in tx.completions() {
            if c.error.is_some() {
                errors += 1;
            }
            bytes += c.bytes as u64;
            sends += 1;
            free.push_back(b);
        }
        let Some(b) = free.pop_front() else {
            readyq.push_front(i);
            continue;
        };
        match tx.send(b) {
            Ok(_) => readyq.push_back(i),
            Err(r) => {
                blocked.push(i);
                free.push_front(r.buf);
            }
        }
    }
    let (secs, cpu_s) = clock.stop();
    let (b0, s0, c0) = base.unwrap_or((0, 0, 0));
    let calls = syscalls(&txs) - c0;
    let paths: std::collections::BTreeMap<String, usize> =
        txs.iter().fold(Default::default(), |mut m, t| {
            *m.entry(t.path().to_string()).or_default() += 1;
            m
        });
    let mut total = 0;
    for mut tx in txs {
        tx.flush(Duration::from_secs(20))?;
        for (c, _) in tx.completions() {
            if c.error.is_some() {
                errors += 1;
            }
        }
        total += tx.counters().bytes;
    }
    anyhow::ensure!(errors == 0, "{errors} sends failed");
    Ok((
        ManyReport {
            bytes: bytes - b0,
            sends: sends - s0,
            secs,
            cpu_s,
            syscalls: calls,
            copied_fraction: Some(1.0),
            note: format!("ring per socket: {n} io_urings, paths at the end {paths:?}"),
        },
        total,
    ))
}

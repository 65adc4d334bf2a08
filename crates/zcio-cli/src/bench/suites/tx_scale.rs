//! The `tx` suite's scale case: one `tx::SendRing` carrying `conns` loopback TCP connections,
//! 16 KiB sends paced at a fixed rate from a pool of the same size at every count, driven as
//! an event loop is: each turn sends what is due to the sockets that can take one, `submit`s,
//! and sleeps on the ring's readiness descriptor (`poll(2)`) until it is readable or the next
//! send is due, calling `on_ready` when it polls readable. What it measures is the ring's own
//! cost as the number of sockets grows: the sending thread's CPU per send, the time of each
//! `on_ready` call, and how many wake-ups of the readiness descriptor found nothing to do.
//!
//! Why paced, and why the receiver delays its ACKs: a loop that sends as fast as it can
//! always has a socket to send to and, unless its pool runs dry, a free buffer, so it never
//! sleeps on the descriptor, and the ring's own send and submit calls harvest every
//! completion: `on_ready` is never called. A zero-copy buffer comes back when the peer ACKs.
//! On loopback an immediate ACK is processed inside the sender's own `io_uring_enter` (the
//! peer's softirq runs on the sending CPU), so its notification is harvested by that enter and
//! never wakes the descriptor; only a delayed ACK (the peer's timer, up to 40 ms) comes after
//! the call, as every ACK over a network does. Linux ACKs at once a socket that was idle
//! longer than its retransmission timeout, so with 256 buffers and sends as fast as
//! possible the pool ran dry and `on_ready` ran at 1,000 sockets (87-251 calls in 2 s) and
//! never at 10,000 (0 calls in 6 of 7 runs, each socket sending once in 0.4 s); paced alone, 0
//! calls at 2,000. So the receiver sets `TCP_QUICKACK` 0 after each read (every ACK delayed,
//! at both counts), and the sender sends at a fixed rate below what it can do: it sleeps on
//! the descriptor between sends, and the notifications wake it. The pool, the same size at
//! both counts, holds what the delayed ACKs keep out at that rate, so it does not run dry and
//! the sends per turn are the same.
//!
//! The receiver is a process of its own (this binary, `ZCIO_BENCH_DRAIN` set): 10,000
//! connections are 20,000 descriptors on loopback, the hard `RLIMIT_NOFILE` of many hosts.

use super::tx_many::{buffers, Clock, ManyOpts};
use anyhow::{bail, Context, Result};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zcio::stats::Report;
use zcio::tx::{SendRing, SendRingConfig, SenderConfig, TxBuf, TxMode};

/// Environment variable that makes this binary the receiver of the scale case:
/// `<connections>,<cpu>`.
pub const DRAIN_ENV: &str = "ZCIO_BENCH_DRAIN";

/// What one run measured (after the warm-up).
#[derive(Debug, Clone, Default)]
pub(super) struct ScaleReport {
    pub(super) bytes: u64,
    pub(super) sends: u64,
    pub(super) secs: f64,
    pub(super) cpu_s: f64,
    /// `on_ready` calls, their total and largest wall time.
    pub(super) on_ready_calls: u64,
    pub(super) on_ready_ns: u64,
    pub(super) on_ready_max_ns: u64,
    /// The largest CPU time (this thread's) of one `on_ready` call.
    pub(super) on_ready_max_cpu_ns: u64,
    /// Wake-ups (the descriptor polled readable) and those after which `on_ready` found no
    /// completion and no writable socket.
    pub(super) wakes: u64,
    pub(super) empty_wakes: u64,
    /// Empty wake-ups whose `on_ready` entered the ring (it ran task work that posted no
    /// completion: a zero-copy send's result before its notification, or a stale flag).
    pub(super) empty_entered: u64,
    pub(super) copied_fraction: f64,
    pub(super) note: String,
}

impl ScaleReport {
    pub(super) fn cpu_us_per_send(&self) -> f64 {
        self.cpu_s * 1e6 / self.sends.max(1) as f64
    }
    pub(super) fn gbit_s(&self) -> f64 {
        crate::bench::measure::gbit_per_s(self.bytes, self.secs)
    }
    /// The mean `on_ready` time; `None` when the loop never called it (it always had a
    /// socket to send to and never slept on the descriptor), not a mean of 0.
    pub(super) fn on_ready_mean_us(&self) -> Option<f64> {
        (self.on_ready_calls > 0)
            .then(|| self.on_ready_ns as f64 / 1e3 / self.on_ready_calls as f64)
    }
    /// The fraction of wake-ups that found nothing; `None` without a wake-up.
    pub(super) fn empty_wake_fraction(&self) -> Option<f64> {
        (self.wakes > 0).then(|| self.empty_wakes as f64 / self.wakes as f64)
    }
}

/// This thread's user and system CPU time, in seconds (`getrusage(RUSAGE_THREAD)`).
fn user_sys() -> (f64, f64) {
    // SAFETY: all-zero is a valid rusage; getrusage writes it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid out-pointer for the call.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (s(u.ru_utime), s(u.ru_stime))
}

/// The receiver process: listens on loopback, prints its port, reads every connection to its
/// end, prints the bytes received. Returns the exit code.
pub fn drain_child(spec: &str) -> i32 {
    let run = || -> Result<u64> {
        let (conns, cpu) = spec
            .split_once(',')
            .context("ZCIO_BENCH_DRAIN=<connections>,<cpu>")?;
        let conns: usize = conns.parse()?;
        let _ = zcio_testnet::cpu::pin_thread(cpu.parse()?);
        let _ = zcio::sys::raise_rlimit(libc::RLIMIT_NOFILE);
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        println!("PORT {}", l.local_addr()?.port());
        Ok(super::tx_many::serve(l, conns, true)?)
    };
    match run() {
        Ok(total) => {
            println!("TOTAL {total}");
            0
        }
        Err(e) => {
            eprintln!("drain: {e:#}");
            1
        }
    }
}

/// Starts the receiver process; returns it and the address it listens on.
fn spawn_drain(
    conns: usize,
    cpu: usize,
) -> Result<(Child, BufReader<std::process::ChildStdout>, SocketAddr)> {
    let exe = std::env::current_exe().context("the zcio binary")?;
    let mut child = Command::new(exe)
        .env(DRAIN_ENV, format!("{conns},{cpu}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the receiver process")?;
    let mut out = BufReader::new(child.stdout.take().context("receiver stdout")?);
    let mut line = String::new();
    out.read_line(&mut line)?;
    let port: u16 = line
        .trim()
        .strip_prefix("PORT ")
        .with_context(|| format!("receiver said {line:?}"))?
        .parse()?;
    Ok((child, out, SocketAddr::from(([127, 0, 0, 1], port))))
}

/// One measured run: the receiver process on one core, this thread sending on the other.
pub(super) fn run(o: &ManyOpts, rate: u64) -> Result<ScaleReport> {
    let (score, rcore) = crate::bench::measure::core_plan(true);
    let (mut child, mut out, addr) = spawn_drain(o.conns, rcore)?;
    let o2 = o.clone();
    let sender = std::thread::spawn(move || -> Result<(ScaleReport, u64)> {
        let _ = zcio_testnet::cpu::pin_thread(score);
        // Named by its size, so a profile (`perf report --comm`) tells the sides apart.
        if let Ok(name) = std::ffi::CString::new(format!("tx-scale-{}", o2.conns)) {
            // SAFETY: PR_SET_NAME reads a NUL-terminated string (cut at 16 bytes).
            unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
        }
        send_all(addr, &o2, rate)
    });
    let res = sender
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"));
    let (rep, total) = match res.and_then(|r| r) {
        Ok(x) => x,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    let mut line = String::new();
    out.read_line(&mut line)?;
    let status = child.wait()?;
    if !status.success() {
        bail!("receiver failed: {status}");
    }
    let got: u64 = line
        .trim()
        .strip_prefix("TOTAL ")
        .with_context(|| format!("receiver said {line:?}"))?
        .parse()?;
    crate::bench::pair::ensure_bytes(got, total)?;
    Ok(rep)
}

fn send_all(addr: SocketAddr, o: &ManyOpts, rate: u64) -> Result<(ScaleReport, u64)> {
    let _ = zcio::sys::raise_rlimit(libc::RLIMIT_NOFILE);
    let socks: Vec<TcpStream> = (0..o.conns)
        .map(|_| TcpStream::connect(addr))
        .collect::<std::io::Result<_>>()
        .context("connecting")?;
    let depth = 4;
    // `o.ws` bytes of buffers at every connection count (see the module's doc).
    let (pool, mut free) = buffers(o.size, o.ws, 1)?;
    let pool_bufs = free.len();
    let mut ring = SendRing::new(&SendRingConfig {
        files: o.conns as u32 + 64,
        submit_batch: o.batch,
        ..SendRingConfig::default()
    })?;
    let registered = ring.register_pool(&pool).is_ok();
    // Zero-copy with fixed buffers, as a server sending to a NIC would: its buffers come back
    // with their notifications, which the loop collects through the readiness descriptor
    // (`auto` would copy on loopback, every send completing inside the call).
    // `ZCIO_BENCH_SCALE_MODE=auto` etc. to look at another path.
    let mode = std::env::var("ZCIO_BENCH_SCALE_MODE")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(TxMode::UringZcFixed);
    let mut cfg = SenderConfig::new(mode);
    cfg.depth = depth;
    let ids = socks
        .into_iter()
        .map(|s| ring.add(OwnedFd::from(s), &cfg))
        .collect::<Result<Vec<_>, _>>()?;
    let n = ids.len();
    let pos: std::collections::HashMap<zcio::tx::SockId, usize> =
        ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    let rfd = ring.readiness_fd()?.as_raw_fd();
    let mut readyq: VecDeque<usize> = (0..n).collect();
    let mut blocked = vec![false; n];
    // Completions (bytes, sends, errors) and writable events taken.
    let mut t = [0u64; 4];
    let mut r = ScaleReport::default();
    let mut base: Option<(u64, u64, zcio::stats::Counters, ScaleReport)> = None;
    let mut us0 = (0.0, 0.0);
    let mut clock = Clock::new(o.warmup, o.dur);
    // Sends owed by the pacing, and when they were last counted.
    let (mut credit, mut last) = (0.0f64, Instant::now());
    // Takes completions and writable sockets; returns how many of each there were.
    let reap = |ring: &mut SendRing,
                free: &mut VecDeque<zcio::tx::PoolBuf>,
                readyq: &mut VecDeque<usize>,
                blocked: &mut Vec<bool>,
                t: &mut [u64; 4]|
     -> u64 {
        let mut got = 0;
        for (c, b) in ring.completions() {
            if c.error.is_some() {
                t[2] += 1;
            }
            t[0] += c.bytes as u64;
            t[1] += 1;
            got += 1;
            if let TxBuf::Pool(b) = b {
                free.push_back(b);
            }
        }
        while let Some(id) = ring.next_writable() {
            got += 1;
            t[3] += 1;
            if let Some(&i) = pos.get(&id) {
                if blocked[i] {
                    blocked[i] = false;
                    readyq.push_back(i);
                }
            }
        }
        got
    };
    loop {
        if clock.warm_done() {
            base = Some((t[0], t[1], ring.counters_total(), r.clone()));
            us0 = user_sys();
            r.on_ready_max_ns = 0;
            r.on_ready_max_cpu_ns = 0;
        }
        if clock.over() {
            break;
        }
        // One turn of the paced loop: the sends due since the last turn (`rate` per second,
        // at most 4 ms' worth after a stall) to the sockets that can take one while a buffer
        // is free, submit, then sleep on the readiness descriptor until it is readable or the
        // next send is due (≥ 1 ms: poll's unit).
        let now = Instant::now();
        credit = (credit + rate as f64 * (now - last).as_secs_f64()).min(rate as f64 / 250.0);
        last = now;
        let mut sent = false;
        while credit >= 1.0 {
            let (Some(i), false) = (readyq.front().copied(), free.is_empty()) else {
                break;
            };
            readyq.pop_front();
            let b = free.pop_front().expect("checked");
            match ring.send(ids[i], b) {
                Ok(_) => {
                    readyq.push_back(i);
                    credit -= 1.0;
                    sent = true;
                }
                Err(rf) => {
                    blocked[i] = true;
                    free.push_front(rf.buf.into_pool().expect("pool buffer"));
                }
            }
        }
        if sent {
            ring.submit()?;
            reap(&mut ring, &mut free, &mut readyq, &mut blocked, &mut t);
        }
        let due = credit >= 1.0 && !readyq.is_empty() && !free.is_empty();
        let ev = zcio::sys::net::poll_one(&rfd, libc::POLLIN, if due { 0 } else { 1 })?;
        if ev & libc::POLLIN == 0 {
            continue;
        }
        r.wakes += 1;
        let t0 = Instant::now();
        let c0 = zcio_testnet::cpu::thread_cpu_time();
        let e0 = ring.enters();
        ring.on_ready()?;
        let entered = ring.enters() != e0;
        let cpu = (zcio_testnet::cpu::thread_cpu_time() - c0).as_nanos() as u64;
        let ns = t0.elapsed().as_nanos() as u64;
        r.on_ready_max_cpu_ns = r.on_ready_max_cpu_ns.max(cpu);
        r.on_ready_calls += 1;
        r.on_ready_ns += ns;
        r.on_ready_max_ns = r.on_ready_max_ns.max(ns);
        if reap(&mut ring, &mut free, &mut readyq, &mut blocked, &mut t) == 0 {
            r.empty_wakes += 1;
            r.empty_entered += u64::from(entered);
        }
    }
    let (secs, cpu_s) = clock.stop();
    let us1 = user_sys();
    let (b0, s0, c0, r0) = base.unwrap_or((0, 0, Default::default(), ScaleReport::default()));
    let c1 = ring.counters_total();
    let zc = c1.zerocopy_bytes - c0.zerocopy_bytes;
    let st = ring.stats();
    r.bytes = t[0] - b0;
    r.sends = t[1] - s0;
    r.secs = secs;
    r.cpu_s = cpu_s;
    r.on_ready_calls -= r0.on_ready_calls;
    r.on_ready_ns -= r0.on_ready_ns;
    r.wakes -= r0.wakes;
    r.empty_wakes -= r0.empty_wakes;
    r.empty_entered -= r0.empty_entered;
    r.copied_fraction = 1.0 - zc as f64 / r.bytes.max(1) as f64;
    let per = |a: f64, b: f64| (b - a) * 1e6 / r.sends.max(1) as f64;
    r.note = format!(
        "{n} connections, {pool_bufs} buffers (the same at every count), paced at {rate} sends/s \
         (the loop sleeps on the readiness descriptor between sends), {} ({}), \
         fixed buffers {}: {} sends measured ({:.2} us user + {:.2} us \
         system CPU per send), {} io_uring_enter, \
         on_ready {} calls (largest {:.2} ms, {:.2} ms of CPU), {} wake-ups of which {} found nothing ({} of \
         those entered the ring), {} writable events, sends by path {:?} (copy, msg-zc, uring-zc, uring-zc-fixed, \
         uring-copy)",
        Report::path(&ring),
        ring.describe(),
        if registered {
            "registered"
        } else {
            "not registered"
        },
        r.sends,
        per(us0.0, us1.0),
        per(us0.1, us1.1),
        ring.enters(),
        r.on_ready_calls,
        r.on_ready_max_ns as f64 / 1e6,
        r.on_ready_max_cpu_ns as f64 / 1e6,
        r.wakes,
        r.empty_wakes,
        r.empty_entered,
        t[3],
        st.sends_by_path,
    );
    ring.flush(Duration::from_secs(30))?;
    reap(&mut ring, &mut free, &mut readyq, &mut blocked, &mut t);
    anyhow::ensure!(t[2] == 0, "{} sends failed", t[2]);
    let total = ring.counters_total().bytes;
    for id in ids {
        let _ = ring.close(id);
    }
    drop(ring);
    Ok((r, total))
}

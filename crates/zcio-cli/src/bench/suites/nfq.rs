//! `nfq`: UDP through an iptables NFQUEUE rule inside a test namespace, consumed three ways,
//! counted at a UDP receiver behind the queue; plus `dump`: a 100k-route table dumped by zcio
//! through the frame ring vs `ip route show`.
//!
//! Consumers (same socket options, copy mode, queue length and filter for all):
//! - `libnfq per-packet`: `recv` one message, one `NFQNL_MSG_VERDICT` `sendto` per packet (the
//!   libnetfilter_queue example);
//! - `libnfq batch32+recvmmsg`: `recvmmsg` up to 32, one `NFQNL_MSG_VERDICT_BATCH` every 32
//!   packets and whenever the socket runs dry (the strong hand-written baseline);
//! - `zcio ring+batch`: `netlink::NfQueue` (frame ring filled by `recvmmsg`, batch verdicts).
//!
//! Layout on 2 cores: sender and receiver on CPU 0; consumer on CPU 1 sharing it with a fixed
//! busy loop, and the sender uses UDP GSO (64 segments per `send`), so the consumer is the
//! bottleneck; each run says which side limited it (kernel queue drops = consumer-bound).

use crate::bench::measure::Span;
use crate::bench::pair::{pair, Pair, Running};
use crate::bench::{Better, Ctx, MetricDef, Sample, Suite};
use anyhow::{Context, Result};
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use zcio::netlink::msg::messages;
use zcio::netlink::nfqmsg::{ConfigMsg, Packet, VerdictMsg};
use zcio::netlink::{kernel_queue_stats, CopyMode, Decision, NfQueue, NfQueueConfig, Verdict};
use zcio::sys::netlink as nl;
use zcio::sys::nfqueue::*;
use zcio_testnet::Netns;

/// The suite.
pub struct Nfq;

pub(super) const PORT: u16 = 9000;
const QUEUE: u16 = 7;
/// Receive buffer of every consumer's netlink socket: room for the whole pre-filled queue.
const RCVBUF: usize = 96 << 20;
/// A consumer stops after the queue stayed empty this long (not counted as work: it sleeps).
const IDLE: Duration = Duration::from_millis(20);

const METRICS: &[MetricDef] = &[
    MetricDef::new("consumer_cpu", "us/pkt", Better::Lower),
    MetricDef::new("delivered", "pkt/s", Better::Higher),
    MetricDef::new("syscalls_per_pkt", "calls", Better::Lower),
    MetricDef::new("copied_fraction", "fraction", Better::Lower),
];

const DUMP_METRICS: &[MetricDef] = &[
    MetricDef::new("dump_time", "ms", Better::Lower),
    MetricDef::new("routes", "routes", Better::Higher),
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    PerPacket,
    Batch32,
    Zcio,
    ZcioRecvmmsg,
}

impl Suite for Nfq {
    fn name(&self) -> &'static str {
        "nfq"
    }
    fn about(&self) -> &'static str {
        "UDP through an NFQUEUE rule: libnfq-style per-packet and batch32+recvmmsg consumers vs zcio frame ring + batch verdicts; 100k-route dump vs ip route show"
    }
    fn chart_metric(&self) -> &'static str {
        "consumer_cpu"
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        if let Err(e) = zcio_testnet::check_privileges() {
            return Err(ctx.skip(e.to_string()));
        }
        let ns = Netns::new("nfqb").context("namespace")?;
        let rule = ns
            .command("iptables")
            .args(["-A", "INPUT", "-p", "udp", "--dport", &PORT.to_string()])
            .args(["-j", "NFQUEUE", "--queue-num", &QUEUE.to_string()])
            .output();
        match rule {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                return Err(ctx.skip(format!(
                    "iptables NFQUEUE rule refused: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                )))
            }
            Err(e) => {
                return Err(ctx.skip(format!(
                    "iptables not runnable ({e}): apt-get install -y iptables"
                )))
            }
        }
        ctx.note(
            "netlink delivers every queued packet by copy (the kernel's netlink mmap ring was \
             removed in 4.6): copied_fraction is 1 on every side",
        );
        ctx.note(
            "method: the consumer binds the queue, the sender (UDP GSO, 64 segments/send, CPU 0) \
             queues N datagrams, then the consumer (CPU 1) drains them all: every run is \
             consumer-bound by construction, independent of the sender's speed on a loaded \
             host; consumer_cpu = consumer thread CPU (including the reinjection and UDP \
             delivery its verdicts trigger) / datagrams the receiver got; delivered = those \
             datagrams / drain time",
        );
        let count: u64 = ctx.pick(10_000, 60_000);
        for size in [64usize, 1400] {
            let count = if size > 1000 { count / 2 } else { count };
            for (base, label) in [
                (Kind::PerPacket, "libnfq per-packet"),
                (Kind::Batch32, "libnfq batch32+recvmmsg"),
            ] {
                let case = format!("udp {size}B vs {label}");
                ctx.compare(
                    &case,
                    (label, "zcio ring+batch"),
                    METRICS,
                    || run_once(&ns, base, size, count, false),
                    || run_once(&ns, Kind::Zcio, size, count, false),
                )?;
            }
        }
        // NFQA_CFG_F_GSO on both sides: the sender's 64-segment GSO packets are queued whole
        // (one message and one verdict per super-packet; libnetfilter_queue users set the same
        // flag). consumer_cpu stays per delivered datagram (segment).
        for size in [64usize, 1400] {
            let count = if size > 1000 { count / 2 } else { count };
            ctx.compare(
                &format!("udp {size}B GSO vs libnfq batch32+recvmmsg GSO"),
                ("libnfq batch32+recvmmsg GSO", "zcio ring+batch GSO"),
                METRICS,
                || run_once(&ns, Kind::Batch32, size, count, true),
                || run_once(&ns, Kind::Zcio, size, count, true),
            )?;
        }
        // The two frame-ring producers against each other.
        for size in [64usize, 1400] {
            let count: u64 = ctx.pick(10_000, 60_000) / if size > 1000 { 2 } else { 1 };
            ctx.compare(
                &format!("udp {size}B zcio producers"),
                ("zcio ring, recvmmsg fill", "zcio ring, io_uring fill"),
                METRICS,
                || run_once(&ns, Kind::ZcioRecvmmsg, size, count, false),
                || run_once(&ns, Kind::Zcio, size, count, false),
            )?;
        }
        drop(ns);
        pair_cases(ctx, count)?;
        dump_case(ctx)
    }
}

/// Two queues, two threads: `--queue-balance 7:8 --queue-cpu-fanout`, a sender pinned to each
/// CPU (so each fills the queue of its CPU), then one consumer per queue pinned to that CPU —
/// `zcio nfq --threads 2` against two libnetfilter_queue-style batch32+recvmmsg consumers.
fn pair_cases(ctx: &mut Ctx, count: u64) -> Result<()> {
    if zcio_testnet::cpu::online_cpus() < 2 {
        ctx.note("2-queue 2-thread case skipped: one CPU");
        return Ok(());
    }
    let ns = Netns::new("nfqb2").context("namespace")?;
    let o = ns
        .command("iptables")
        .args(["-A", "INPUT", "-p", "udp", "--dport", &PORT.to_string()])
        .args(["-j", "NFQUEUE", "--queue-balance"])
        .arg(format!("{}:{}", QUEUE, QUEUE + 1))
        .arg("--queue-cpu-fanout")
        .output()?;
    anyhow::ensure!(
        o.status.success(),
        "iptables --queue-cpu-fanout refused: {}",
        String::from_utf8_lossy(&o.stderr).trim()
    );
    for size in [64usize, 1400] {
        let count = if size > 1000 { count / 2 } else { count };
        ctx.compare(
            &format!("udp {size}B 2 queues 2 threads"),
            ("2x libnfq batch32+recvmmsg", "zcio 2 threads"),
            METRICS,
            || run_pair(&ns, false, size, count),
            || run_pair(&ns, true, size, count),
        )?;
    }
    Ok(())
}

fn run_pair(ns: &Netns, zcio: bool, size: usize, count: u64) -> Result<Sample> {
    let stop_recv = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(5));
    let filled = Arc::new(Barrier::new(4));
    let sink = pair("nfq 2 queues receiver").server_in(ns);
    let receiver = spawn_receiver(&sink, &stop_recv, &received, Gate::new(&ready))?;
    let per = count / 2;
    let qmax = per as u32 + 4096;
    let mut consumers = Vec::new();
    let mut senders = Vec::new();
    for i in 0..2u16 {
        let q = QUEUE + i;
        // The CPU that sends is the CPU that queues (loopback delivers on it).
        let cpu = usize::from(i);
        let sides = pair(format!("nfq queue {q}"))
            .cores((cpu, cpu))
            .server_in(ns)
            .client_in(ns);
        let (mut cd, mut cf) = (Gate::new(&ready), Gate::new(&filled));
        consumers.push(sides.server(move || -> Result<ConsumerResult> {
            if zcio {
                consume_zcio(q, qmax, true, false, &mut cd, &mut cf)
            } else {
                consume_batch32(q, qmax, false, &mut cd, &mut cf)
            }
        })?);
        let gates = (Gate::new(&ready), Gate::new(&filled));
        senders.push(spawn_gso_sender(&sides, size, per, gates)?);
    }
    let mut sent = 0;
    for h in senders {
        sent += h.io_result()?;
    }
    let mut cs = Vec::new();
    for h in consumers {
        cs.push(h.result()?);
    }
    let verdicts: u64 = cs.iter().map(|c| c.verdicts).sum();
    let end = Instant::now() + Duration::from_secs(2);
    while received.load(Ordering::Relaxed) < verdicts && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(2));
    }
    stop_recv.store(true, Ordering::Relaxed);
    receiver.io_result()?;
    let delivered = received.load(Ordering::Relaxed);
    anyhow::ensure!(delivered > 0, "no packet was delivered through the queues");
    let cpu: f64 = cs.iter().map(|c| c.cpu).sum();
    let wall = cs.iter().map(|c| c.wall).fold(0.0, f64::max);
    let syscalls: u64 = cs.iter().map(|c| c.syscalls).sum();
    let mut smp = Sample::default();
    smp.set("consumer_cpu", cpu / delivered as f64 * 1e6)
        .set("delivered", delivered as f64 / wall.max(1e-9))
        .set("syscalls_per_pkt", syscalls as f64 / delivered as f64)
        .set("copied_fraction", 1.0);
    smp.note(format!(
        "{} {size}B x2 [{}]: {sent} datagrams queued on 2 CPUs, per-queue verdicts {:?}; \
         delivered = received / the slower consumer's drain time",
        if zcio { "zcio" } else { "libnfq batch32" },
        cs[0].path,
        cs.iter().map(|c| c.verdicts).collect::<Vec<_>>()
    ));
    Ok(smp)
}

struct ConsumerResult {
    path: &'static str,
    cpu: f64,
    wall: f64,
    syscalls: u64,
    verdicts: u64,
    queue_dropped: u64,
    user_dropped: u64,
    busy: f64,
}

/// A start gate: every thread passes it once, also when its set-up failed (then on drop), so
/// one failing side cannot leave the others waiting forever.
/// The receiver behind the queue(s): counts the datagrams the verdicts let through until
/// `stop` is set (it opens `ready` once bound).
pub(super) fn spawn_receiver(
    sides: &Pair<'_>,
    stop: &Arc<AtomicBool>,
    received: &Arc<AtomicU64>,
    mut rd: Gate,
) -> Result<Running<std::io::Result<()>>> {
    let (sr, rc) = (stop.clone(), received.clone());
    sides.server(move || -> std::io::Result<()> {
        let s = UdpSocket::bind(("127.0.0.1", PORT))?;
        let _ = nl::set_rcvbuf(&s, 64 << 20, true);
        s.set_read_timeout(Some(Duration::from_millis(10)))?;
        let mut rb = nl::RecvBatch::new(64, 2048);
        rd.wait();
        loop {
            match rb.recv(&s, libc::MSG_WAITFORONE) {
                Ok(n) => {
                    rc.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if sr.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e),
            }
        }
    })
}

/// The client side of a queue: `count` datagrams of `size` bytes with UDP GSO (at most 64
/// segments per send), sent once `ready` opens; then it opens `filled` for the consumer.
pub(super) fn spawn_gso_sender(
    sides: &Pair<'_>,
    size: usize,
    count: u64,
    (mut sd, mut sf): (Gate, Gate),
) -> Result<Running<std::io::Result<u64>>> {
    sides.client(move || -> std::io::Result<u64> {
        let s = UdpSocket::bind("127.0.0.1:0")?;
        s.connect(("127.0.0.1", PORT))?;
        let segs = (65000 / (size + 8)).min(64);
        zcio::sys::setsockopt_int(&s, zcio::sys::SOL_UDP, zcio::sys::UDP_SEGMENT, size as i32)?;
        let buf = vec![0x5au8; size * segs];
        sd.wait();
        let mut sent = 0u64;
        while sent < count {
            let k = (count - sent).min(segs as u64) as usize;
            match s.send(&buf[..k * size]) {
                Ok(_) => sent += k as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                Err(e) => return Err(e),
            }
        }
        // Let the last segments reach the queue before the consumer starts.
        std::thread::sleep(Duration::from_millis(20));
        sf.wait();
        Ok(sent)
    })
}

pub(super) struct Gate {
    barrier: Arc<Barrier>,
    passed: bool,
}

impl Gate {
    pub(super) fn new(barrier: &Arc<Barrier>) -> Self {
        Self {
            barrier: barrier.clone(),
            passed: false,
        }
    }
    pub(super) fn wait(&mut self) {
        if !self.passed {
            self.passed = true;
            self.barrier.wait();
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.wait();
    }
}

/// Packets waiting in the kernel queue (a consumer is only done when this is 0).
/// The result of a baseline consumer run that ended after one idle period (`IDLE` is not
/// counted as running time); baselines read no kernel drop counters.
fn baseline_result(
    path: &'static str,
    cpu: f64,
    wall: f64,
    syscalls: u64,
    verdicts: u64,
) -> ConsumerResult {
    let wall = wall - IDLE.as_secs_f64();
    ConsumerResult {
        path,
        cpu,
        wall,
        syscalls,
        verdicts,
        queue_dropped: 0,
        user_dropped: 0,
        busy: cpu / wall.max(1e-9),
    }
}

pub(super) fn waiting(q: u16) -> u64 {
    kernel_queue_stats()
        .ok()
        .and_then(|v| v.into_iter().find(|k| k.queue == q))
        .map_or(0, |k| k.waiting)
}

fn kstats(q: u16) -> (u64, u64) {
    kernel_queue_stats()
        .ok()
        .and_then(|v| v.into_iter().find(|k| k.queue == q))
        .map_or((0, 0), |k| (k.queue_dropped, k.user_dropped))
}

fn run_once(ns: &Netns, kind: Kind, size: usize, count: u64, gso: bool) -> Result<Sample> {
    let cpus = zcio_testnet::cpu::online_cpus();
    let (c_send, c_cons) = if cpus > 1 { (0, 1) } else { (0, 0) };
    let stop_recv = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(3));
    let filled = Arc::new(Barrier::new(2));

    // Receiver behind the queue.
    let sink = pair("nfq receiver").server_core(c_send).server_in(ns);
    let receiver = spawn_receiver(&sink, &stop_recv, &received, Gate::new(&ready))?;

    // Consumer: binds, waits until the queue is filled, then drains it.
    let (mut cd, mut cf) = (Gate::new(&ready), Gate::new(&filled));
    let qmax = count as u32 + 4096;
    let sides = pair("nfq queue")
        .cores((c_send, c_cons))
        .server_in(ns)
        .client_in(ns);
    let consumer = sides.server(move || -> Result<ConsumerResult> {
        let k0 = kstats(QUEUE);
        let r = match kind {
            Kind::Zcio => consume_zcio(QUEUE, qmax, true, gso, &mut cd, &mut cf),
            Kind::ZcioRecvmmsg => consume_zcio(QUEUE, qmax, false, gso, &mut cd, &mut cf),
            Kind::PerPacket => consume_per_packet(QUEUE, qmax, gso, &mut cd, &mut cf),
            Kind::Batch32 => consume_batch32(QUEUE, qmax, gso, &mut cd, &mut cf),
        };
        let k1 = kstats(QUEUE);
        r.map(|mut c| {
            c.queue_dropped = k1.0.saturating_sub(k0.0);
            c.user_dropped = k1.1.saturating_sub(k0.1);
            c
        })
    })?;

    // Sender: `count` datagrams with UDP GSO (64 segments per send), then opens the gate.
    let sender = spawn_gso_sender(&sides, size, count, (Gate::new(&ready), Gate::new(&filled)))?;

    let sent = sender.io_result()?;
    let c = consumer.result()?;
    let end = Instant::now() + Duration::from_secs(2);
    while received.load(Ordering::Relaxed) < c.verdicts && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(2));
    }
    stop_recv.store(true, Ordering::Relaxed);
    receiver.io_result()?;
    let delivered = received.load(Ordering::Relaxed);
    anyhow::ensure!(delivered > 0, "no packet was delivered through the queue");
    let mut s = Sample::default();
    s.set("consumer_cpu", c.cpu / delivered as f64 * 1e6)
        .set("delivered", delivered as f64 / c.wall)
        .set("syscalls_per_pkt", c.syscalls as f64 / delivered as f64)
        .set("copied_fraction", 1.0);
    s.note(format!(
        "{kind:?} {size}B [{}]: consumer-bound by construction: {sent} datagrams queued \
         before the consumer starts, drained at {:.0}% CPU",
        c.path,
        c.busy * 100.0
    ));
    if c.queue_dropped > 0 || c.user_dropped > 0 {
        s.note(format!(
            "{kind:?} {size}B: the kernel dropped {} at the queue and {} at the socket while \
             filling",
            c.queue_dropped, c.user_dropped
        ));
    }
    if c.verdicts != delivered && !gso {
        s.note(format!(
            "{kind:?} {size}B: {} accept verdicts but {delivered} delivered",
            c.verdicts
        ));
    }
    Ok(s)
}

fn accept_filter(p: &Packet<'_>) -> Verdict {
    // The same trivial rule on every side: drop UDP to port 1, accept the rest.
    match p.payload {
        Some(b) if b.len() >= 24 && b[9] == 17 => {
            let ihl = usize::from(b[0] & 0xf) * 4;
            if b.get(ihl + 2..ihl + 4) == Some(&[0, 1]) {
                Verdict::Drop
            } else {
                Verdict::Accept
            }
        }
        _ => Verdict::Accept,
    }
}

/// CPU seconds of this process's io_uring worker threads (`iou-wrk-*`) and how many there
/// are: work io_uring punts to them would not show in the consumer thread's CPU time, so the
/// zcio consumer adds it (normally zero: netlink sends and receives complete inline).
fn io_worker_cpu() -> (usize, f64) {
    let tick = 100.0; // USER_HZ
    let mut n = 0;
    let mut secs = 0.0;
    if let Ok(rd) = std::fs::read_dir("/proc/self/task") {
        for t in rd.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if !comm.starts_with("iou-wrk") {
                continue;
            }
            n += 1;
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // Fields after the ")" of the comm: state is field 3; utime/stime are 14/15.
            if let Some(rest) = stat.rsplit(')').next() {
                let f: Vec<&str> = rest.split_whitespace().collect();
                let ut: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
                let st: f64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
                secs += (ut + st) / tick;
            }
        }
    }
    (n, secs)
}

fn consume_zcio(
    q: u16,
    qmax: u32,
    uring: bool,
    gso: bool,
    ready: &mut Gate,
    filled: &mut Gate,
) -> Result<ConsumerResult> {
    // Copy range: everything a 4 KiB frame holds (all test packets are copied whole, as with
    // 0xffff on the baselines), so frames are filled by io_uring.
    let mut nq = NfQueue::open(NfQueueConfig {
        first: q,
        last: q,
        copy: CopyMode::Packet((4096 - 16 - zcio::netlink::queue::FRAME_OVERHEAD) as u32),
        batch: 32,
        uring,
        rcvbuf: Some((RCVBUF, true)),
        max_len: Some(qmax),
        gso,
        ..NfQueueConfig::default()
    })?;
    ready.wait();
    filled.wait();
    let path = nq.path().as_str();
    let (_, wq0) = io_worker_cpu();
    let span = Span::start();
    loop {
        let n = nq.process(Some(IDLE), |p| Decision::Verdict(accept_filter(p)))?;
        if n == 0 && waiting(q) == 0 {
            break;
        }
    }
    let (wall, cpu) = span.stop();
    let (workers, wq1) = io_worker_cpu();
    let cpu = cpu + (wq1 - wq0).max(0.0);
    let path = if workers > 0 {
        "frame-ring+io_uring (io-wq workers present; their CPU is added)"
    } else {
        path
    };
    let st = nq.stats();
    Ok(ConsumerResult {
        path,
        cpu,
        wall: wall - IDLE.as_secs_f64(),
        syscalls: st.recv_syscalls + st.send_syscalls,
        // Verdicts through io_uring ride the receive's io_uring_enter: no extra syscall.
        verdicts: st.accepted,
        queue_dropped: 0,
        user_dropped: 0,
        busy: cpu / (wall - IDLE.as_secs_f64()).max(1e-9),
    })
}

/// Binds queue `q` on a plain netlink socket the way libnetfilter_queue does.
fn bind_plain(q: u16, qmax: u32, gso: bool) -> Result<std::os::fd::OwnedFd> {
    let fd = nl::socket(nl::NETLINK_NETFILTER)?;
    nl::bind(&fd, 0, 0)?;
    nl::set_rcvbuf(&fd, RCVBUF, true)?;
    let mut out = vec![];
    ConfigMsg {
        queue: q,
        cmd: Some(NFQNL_CFG_CMD_BIND),
        ..Default::default()
    }
    .emit(&mut out, 1)
    .expect("message fits");
    ConfigMsg {
        queue: q,
        params: Some((0xffff, NFQNL_COPY_PACKET)),
        maxlen: Some(qmax),
        flags: Some((0xf, if gso { NFQA_CFG_F_GSO } else { 0 })),
        ..Default::default()
    }
    .emit(&mut out, 2)
    .expect("message fits");
    nl::send_to_kernel(&fd, &out)?;
    let mut buf = vec![0u8; 8192];
    let mut acks = 0;
    while acks < 2 {
        let n = zcio::sys::net::recv(&fd, &mut buf, 0)?;
        for m in messages(&buf[..n]) {
            let m = m?;
            if m.ty == nl::NLMSG_ERROR {
                let c = m.error_code()?;
                anyhow::ensure!(c == 0, "bind queue {q}: errno {}", -c);
                acks += 1;
            }
        }
    }
    Ok(fd)
}

fn unbind_plain(fd: &std::os::fd::OwnedFd, q: u16) {
    let mut out = vec![];
    ConfigMsg {
        queue: q,
        cmd: Some(NFQNL_CFG_CMD_UNBIND),
        ..Default::default()
    }
    .emit(&mut out, 9)
    .expect("message fits");
    let _ = nl::send_to_kernel(fd, &out);
}

fn verdict(out: &mut Vec<u8>, q: u16, batch: bool, id: u32, v: Verdict, seq: u32) {
    VerdictMsg {
        queue: q,
        batch,
        verdict: v,
        id,
        mark: None,
        payload: None,
    }
    .emit(out, seq)
    .expect("message fits");
}

/// A plain consumer found its socket empty: waits up to [`IDLE`] (one `poll`, counted) and
/// says whether the queue is drained (nothing arrived and the kernel holds nothing for it).
fn drained(fd: &std::os::fd::OwnedFd, q: u16, syscalls: &mut u64) -> Result<bool> {
    *syscalls += 1;
    let r = zcio::sys::net::poll_one(fd, libc::POLLIN, IDLE.as_millis() as i32)?;
    Ok(r == 0 && waiting(q) == 0)
}

fn consume_per_packet(
    q: u16,
    qmax: u32,
    gso: bool,
    ready: &mut Gate,
    filled: &mut Gate,
) -> Result<ConsumerResult> {
    let fd = bind_plain(q, qmax, gso)?;
    let mut buf = vec![0u8; 0xffff + 4096];
    let mut out = Vec::with_capacity(64);
    let (mut syscalls, mut verdicts, mut seq) = (0u64, 0u64, 0u32);
    ready.wait();
    filled.wait();
    let span = Span::start();
    loop {
        syscalls += 1;
        match zcio::sys::net::recv(&fd, &mut buf, libc::MSG_DONTWAIT) {
            Ok(n) => {
                for m in messages(&buf[..n]) {
                    let Ok(p) = Packet::parse(&m?) else { continue };
                    let v = accept_filter(&p);
                    out.clear();
                    seq = seq.wrapping_add(1);
                    verdict(&mut out, q, false, p.id, v, seq);
                    syscalls += 1;
                    nl::send_to_kernel(&fd, &out)?;
                    if v == Verdict::Accept {
                        verdicts += 1;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if drained(&fd, q, &mut syscalls)? {
                    break;
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (wall, cpu) = span.stop();
    unbind_plain(&fd, q);
    Ok(baseline_result(
        "recv + sendto per packet",
        cpu,
        wall,
        syscalls,
        verdicts,
    ))
}

fn consume_batch32(
    q: u16,
    qmax: u32,
    gso: bool,
    ready: &mut Gate,
    filled: &mut Gate,
) -> Result<ConsumerResult> {
    let fd = bind_plain(q, qmax, gso)?;
    let mut rb = nl::RecvBatch::new(32, 0xffff + 4096);
    let mut out = Vec::with_capacity(4096);
    let (mut syscalls, mut verdicts, mut seq) = (0u64, 0u64, 0u32);
    let mut last: Option<u32> = None;
    let mut since = 0usize;
    ready.wait();
    filled.wait();
    let span = Span::start();
    let flush = |out: &mut Vec<u8>, last: &mut Option<u32>, seq: &mut u32, sys: &mut u64| {
        if let Some(id) = last.take() {
            out.clear();
            *seq = seq.wrapping_add(1);
            verdict(out, q, true, id, Verdict::Accept, *seq);
            *sys += 1;
            nl::send_to_kernel(&fd, out)
        } else {
            Ok(0)
        }
    };
    loop {
        syscalls += 1;
        match rb.recv(&fd, libc::MSG_DONTWAIT) {
            Ok(n) => {
                for i in 0..n {
                    for m in messages(rb.get(i)) {
                        let Ok(p) = Packet::parse(&m?) else { continue };
                        match accept_filter(&p) {
                            Verdict::Accept => {
                                last = Some(p.id);
                                verdicts += 1;
                                since += 1;
                            }
                            v => {
                                // A different verdict ends the batch: flush, then decide alone.
                                flush(&mut out, &mut last, &mut seq, &mut syscalls)?;
                                out.clear();
                                seq = seq.wrapping_add(1);
                                verdict(&mut out, q, false, p.id, v, seq);
                                syscalls += 1;
                                nl::send_to_kernel(&fd, &out)?;
                            }
                        }
                        if since >= 32 {
                            flush(&mut out, &mut last, &mut seq, &mut syscalls)?;
                            since = 0;
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Idle: decide what is pending, then wait.
                flush(&mut out, &mut last, &mut seq, &mut syscalls)?;
                since = 0;
                if drained(&fd, q, &mut syscalls)? {
                    break;
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (wall, cpu) = span.stop();
    unbind_plain(&fd, q);
    Ok(baseline_result(
        "recvmmsg(32) + batch verdict",
        cpu,
        wall,
        syscalls,
        verdicts,
    ))
}

fn dump_case(ctx: &mut Ctx) -> Result<()> {
    let n: u32 = ctx.pick(100_000, 100_000);
    let ns = Netns::new("nldump").context("namespace")?;
    let t = Instant::now();
    zcio_testnet::routes::add_routes(&ns, n).context("adding routes with ip -batch")?;
    ctx.note(format!(
        "dump: {n} host routes added with ip -batch in {:.1} s; both sides run as processes \
         inside the namespace (ip netns exec), output read through a pipe and its lines counted",
        t.elapsed().as_secs_f64()
    ));
    let exe = std::env::current_exe()?;
    let exe = exe.to_string_lossy().into_owned();
    let run = |prog: &str, args: &[&str]| -> Result<Sample> {
        let t = Instant::now();
        let out = ns
            .command(prog)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .output()?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        anyhow::ensure!(
            out.status.success(),
            "{prog} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines = out.stdout.iter().filter(|&&b| b == b'\n').count();
        let mut s = Sample::default();
        s.set("dump_time", ms).set("routes", lines as f64);
        Ok(s)
    };
    ctx.compare(
        &format!("dump {}k routes", n / 1000),
        ("ip route show", "zcio netlink dump routes"),
        DUMP_METRICS,
        || run("ip", &["route", "show"]),
        || run(&exe, &["netlink", "dump", "routes"]),
    )
}

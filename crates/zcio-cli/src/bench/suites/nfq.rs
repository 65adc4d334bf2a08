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
use crate::bench::{Better, Ctx, MetricDef, Sample, Suite};
use anyhow::{anyhow, Context, Result};
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

const PORT: u16 = 9000;
const QUEUE: u16 = 7;
const RCVBUF: usize = 4 << 20;

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
            "layout: sender (UDP GSO, 64 segments/send) + receiver on CPU 0; consumer on CPU 1 \
             sharing it with a fixed busy loop; consumer_cpu = consumer thread CPU (including \
             the reinjection and UDP delivery its verdicts trigger) / packets the receiver got",
        );
        let dur = ctx.pick(
            Duration::from_millis(400),
            Duration::from_millis(1200),
            Duration::from_secs(3),
        );
        for size in [64usize, 1400] {
            for (base, label) in [
                (Kind::PerPacket, "libnfq per-packet"),
                (Kind::Batch32, "libnfq batch32+recvmmsg"),
            ] {
                let case = format!("udp {size}B vs {label}");
                ctx.compare(
                    &case,
                    (label, "zcio ring+batch"),
                    METRICS,
                    || run_once(&ns, base, size, dur),
                    || run_once(&ns, Kind::Zcio, size, dur),
                )?;
            }
        }
        drop(ns);
        dump_case(ctx)
    }
}

struct ConsumerResult {
    cpu: f64,
    syscalls: u64,
    verdicts: u64,
    queue_dropped: u64,
    user_dropped: u64,
    busy: f64,
}

/// A start gate: every thread passes it once, also when its set-up failed (then on drop), so
/// one failing side cannot leave the others waiting forever.
struct Gate {
    barrier: Arc<Barrier>,
    passed: bool,
}

impl Gate {
    fn new(barrier: &Arc<Barrier>) -> Self {
        Self {
            barrier: barrier.clone(),
            passed: false,
        }
    }
    fn wait(&mut self) {
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

fn kstats() -> (u64, u64) {
    kernel_queue_stats()
        .ok()
        .and_then(|v| v.into_iter().find(|k| k.queue == QUEUE))
        .map_or((0, 0), |k| (k.queue_dropped, k.user_dropped))
}

fn run_once(ns: &Netns, kind: Kind, size: usize, dur: Duration) -> Result<Sample> {
    let cpus = zcio::sys::online_cpus();
    let (c_send, c_cons) = if cpus > 1 { (0, 1) } else { (0, 0) };
    let stop_send = Arc::new(AtomicBool::new(false));
    let stop_cons = Arc::new(AtomicBool::new(false));
    let stop_recv = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(3));

    // Receiver.
    let (sr, rc, mut rd) = (stop_recv.clone(), received.clone(), Gate::new(&ready));
    let receiver = ns.spawn(move || -> std::io::Result<()> {
        let _ = zcio::sys::pin_thread(c_send);
        let s = UdpSocket::bind(("127.0.0.1", PORT))?;
        let _ = nl::set_rcvbuf(&s, 16 << 20, true);
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
    })?;

    // Consumer.
    let (sc, mut cd) = (stop_cons.clone(), Gate::new(&ready));
    let consumer = ns.spawn(move || -> Result<ConsumerResult> {
        let _ = zcio::sys::pin_thread(c_cons);
        let k0 = kstats();
        let r = match kind {
            Kind::Zcio => consume_zcio(&sc, &mut cd),
            Kind::PerPacket => consume_per_packet(&sc, &mut cd),
            Kind::Batch32 => consume_batch32(&sc, &mut cd),
        };
        let k1 = kstats();
        r.map(|mut c| {
            c.queue_dropped = k1.0.saturating_sub(k0.0);
            c.user_dropped = k1.1.saturating_sub(k0.1);
            c
        })
    })?;

    // The busy loop sharing the consumer's CPU.
    let sh = stop_cons.clone();
    let hog = std::thread::spawn(move || {
        let _ = zcio::sys::pin_thread(c_cons);
        let mut x = 0u64;
        while !sh.load(Ordering::Relaxed) {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        x
    });

    // Sender.
    let (ss, mut sd) = (stop_send.clone(), Gate::new(&ready));
    let sender = ns.spawn(move || -> std::io::Result<u64> {
        let _ = zcio::sys::pin_thread(c_send);
        let s = UdpSocket::bind("127.0.0.1:0")?;
        s.connect(("127.0.0.1", PORT))?;
        let segs = (65000 / (size + 8)).min(64);
        zcio::sys::setsockopt_int(&s, zcio::sys::SOL_UDP, zcio::sys::UDP_SEGMENT, size as i32)?;
        let buf = vec![0x5au8; size * segs];
        sd.wait();
        let mut sent = 0u64;
        while !ss.load(Ordering::Relaxed) {
            match s.send(&buf) {
                Ok(_) => sent += segs as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    })?;

    let t0 = Instant::now();
    std::thread::sleep(dur);
    stop_send.store(true, Ordering::Relaxed);
    let sent = sender.join().map_err(|_| anyhow!("sender panicked"))??;
    // Let the consumer drain what is queued, then stop everyone.
    std::thread::sleep(Duration::from_millis(30));
    stop_cons.store(true, Ordering::Relaxed);
    let c = consumer
        .join()
        .map_err(|_| anyhow!("consumer panicked"))??;
    let wall = t0.elapsed().as_secs_f64();
    let _ = hog.join();
    std::thread::sleep(Duration::from_millis(20));
    stop_recv.store(true, Ordering::Relaxed);
    receiver
        .join()
        .map_err(|_| anyhow!("receiver panicked"))??;
    let delivered = received.load(Ordering::Relaxed);
    anyhow::ensure!(delivered > 0, "no packet was delivered through the queue");
    let mut s = Sample::default();
    s.set("consumer_cpu", c.cpu / delivered as f64 * 1e6)
        .set("delivered", delivered as f64 / wall)
        .set("syscalls_per_pkt", c.syscalls as f64 / delivered as f64)
        .set("copied_fraction", 1.0);
    let limit = if c.queue_dropped > 0 || c.user_dropped > 0 {
        format!(
            "consumer-bound (kernel queue full: {} dropped at the queue, {} at the socket, of {} sent)",
            c.queue_dropped, c.user_dropped, sent
        )
    } else {
        format!(
            "sender-bound (no queue drops; consumer busy {:.0}% of the run)",
            c.busy * 100.0
        )
    };
    s.note(format!("{kind:?} {size}B: {limit}"));
    if c.verdicts != delivered {
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

fn consume_zcio(stop: &AtomicBool, ready: &mut Gate) -> Result<ConsumerResult> {
    let mut q = NfQueue::open(NfQueueConfig {
        first: QUEUE,
        last: QUEUE,
        copy: CopyMode::Packet(0xffff),
        batch: 32,
        rcvbuf: Some((RCVBUF, true)),
        ..NfQueueConfig::default()
    })?;
    ready.wait();
    let span = Span::start();
    let mut idle = 0;
    loop {
        let n = q.process(Some(Duration::from_millis(5)), |p| {
            Decision::Verdict(accept_filter(p))
        })?;
        if n == 0 && stop.load(Ordering::Relaxed) {
            idle += 1;
            if idle > 2 {
                break;
            }
        }
    }
    let (wall, cpu) = span.stop();
    let st = q.stats();
    Ok(ConsumerResult {
        cpu,
        syscalls: st.recv_syscalls + st.send_syscalls,
        verdicts: st.accepted,
        queue_dropped: 0,
        user_dropped: 0,
        busy: cpu / wall,
    })
}

/// Binds `QUEUE` on a plain netlink socket the way libnetfilter_queue does.
fn bind_plain() -> Result<std::os::fd::OwnedFd> {
    let fd = nl::socket(nl::NETLINK_NETFILTER)?;
    nl::bind(&fd, 0, 0)?;
    nl::set_rcvbuf(&fd, RCVBUF, true)?;
    let mut out = vec![];
    ConfigMsg {
        queue: QUEUE,
        cmd: Some(NFQNL_CFG_CMD_BIND),
        ..Default::default()
    }
    .emit(&mut out, 1);
    ConfigMsg {
        queue: QUEUE,
        params: Some((0xffff, NFQNL_COPY_PACKET)),
        flags: Some((0xf, 0)),
        ..Default::default()
    }
    .emit(&mut out, 2);
    nl::send_to_kernel(&fd, &out)?;
    let mut buf = vec![0u8; 8192];
    let mut acks = 0;
    while acks < 2 {
        let n = zcio::sys::net::recv(&fd, &mut buf, 0)?;
        for m in messages(&buf[..n]) {
            let m = m?;
            if m.ty == nl::NLMSG_ERROR {
                let c = m.error_code()?;
                anyhow::ensure!(c == 0, "bind queue {QUEUE}: errno {}", -c);
                acks += 1;
            }
        }
    }
    Ok(fd)
}

fn unbind_plain(fd: &std::os::fd::OwnedFd) {
    let mut out = vec![];
    ConfigMsg {
        queue: QUEUE,
        cmd: Some(NFQNL_CFG_CMD_UNBIND),
        ..Default::default()
    }
    .emit(&mut out, 9);
    let _ = nl::send_to_kernel(fd, &out);
}

fn verdict(out: &mut Vec<u8>, batch: bool, id: u32, v: Verdict, seq: u32) {
    VerdictMsg {
        queue: QUEUE,
        batch,
        verdict: v,
        id,
        mark: None,
        payload: None,
    }
    .emit(out, seq);
}

fn consume_per_packet(stop: &AtomicBool, ready: &mut Gate) -> Result<ConsumerResult> {
    let fd = bind_plain()?;
    let mut buf = vec![0u8; 0xffff + 4096];
    let mut out = Vec::with_capacity(64);
    let (mut syscalls, mut verdicts, mut seq) = (0u64, 0u64, 0u32);
    ready.wait();
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
                    verdict(&mut out, false, p.id, v, seq);
                    syscalls += 1;
                    nl::send_to_kernel(&fd, &out)?;
                    if v == Verdict::Accept {
                        verdicts += 1;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                syscalls += 1;
                let r = zcio::sys::net::poll_one(&fd, libc::POLLIN, 5)?;
                if r == 0 && stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (wall, cpu) = span.stop();
    unbind_plain(&fd);
    Ok(ConsumerResult {
        cpu,
        syscalls,
        verdicts,
        queue_dropped: 0,
        user_dropped: 0,
        busy: cpu / wall,
    })
}

fn consume_batch32(stop: &AtomicBool, ready: &mut Gate) -> Result<ConsumerResult> {
    let fd = bind_plain()?;
    let mut rb = nl::RecvBatch::new(32, 0xffff + 4096);
    let mut out = Vec::with_capacity(4096);
    let (mut syscalls, mut verdicts, mut seq) = (0u64, 0u64, 0u32);
    let mut last: Option<u32> = None;
    let mut since = 0usize;
    ready.wait();
    let span = Span::start();
    let flush = |out: &mut Vec<u8>, last: &mut Option<u32>, seq: &mut u32, sys: &mut u64| {
        if let Some(id) = last.take() {
            out.clear();
            *seq = seq.wrapping_add(1);
            verdict(out, true, id, Verdict::Accept, *seq);
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
                                verdict(&mut out, false, p.id, v, seq);
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
                syscalls += 1;
                let r = zcio::sys::net::poll_one(&fd, libc::POLLIN, 5)?;
                if r == 0 && stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (wall, cpu) = span.stop();
    unbind_plain(&fd);
    Ok(ConsumerResult {
        cpu,
        syscalls,
        verdicts,
        queue_dropped: 0,
        user_dropped: 0,
        busy: cpu / wall,
    })
}

fn dump_case(ctx: &mut Ctx) -> Result<()> {
    let n: u32 = ctx.pick(100_000, 100_000, 100_000);
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

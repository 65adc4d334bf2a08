//! `notify`: the cost of zero-copy completions. MSG_ZEROCOPY with `poll` + `recvmsg` every
//! `limit` sends (the kernel selftest `msg_zerocopy.c` pattern, from one reused buffer) vs
//! zcio's batched errqueue reaper vs io_uring notification CQEs; TCP (over a test-host pair)
//! and UDP with GSO (to the sink host, where zero-copy is real), IPv4 and IPv6, limits 1 and 32.
//! MB/s and notification syscalls per send.

use crate::bench::measure::{core_plan, size_label, Span};
use crate::bench::{Better, Ctx, MetricDef, Sample, Suite};
use crate::perf::client::{drive, ClientOpts, ClientReport};
use crate::perf::server::serve_conn;
use anyhow::{Context, Result};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};
use zcio::sys::{errqueue, net, MSG_ZEROCOPY};
use zcio::tx::TxMode;
use zcio_testnet::{Pair, Sink};

/// The suite.
pub struct Notify;

const METRICS: &[MetricDef] = &[
    MetricDef::new("mb_per_s", "MB/s", Better::Higher),
    MetricDef::new("notify_syscalls_per_send", "calls", Better::Lower),
    MetricDef::new("syscalls_per_send", "calls", Better::Lower),
    MetricDef::new("copied_fraction", "fraction", Better::Lower),
    MetricDef::new("sender_cpu", "s/GB", Better::Lower),
    MetricDef::new("sender_busy", "fraction", Better::Higher),
    MetricDef::new("sender_runq", "fraction", Better::Lower),
    MetricDef::new("receiver_busy", "fraction", Better::Lower),
    MetricDef::new("receiver_runq", "fraction", Better::Lower),
];

/// Seconds this thread has spent runnable but waiting for a CPU (`/proc/thread-self/schedstat`
/// second field; needs schedstats, else `None`).
fn runq_wait_s() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(ns as f64 / 1e9)
}

const SIZE: usize = 16 << 10;

/// The selftest-style baseline: one buffer, `send(MSG_ZEROCOPY)`, and every `limit` sends
/// `poll(POLLERR)` + one `recvmsg(MSG_ERRQUEUE)` per queued notification.
fn baseline(sock: OwnedFd, stream: bool, limit: usize, dur: Duration) -> Result<Sample> {
    let (score, _) = core_plan(true);
    let _ = zcio_testnet::cpu::pin_thread(score);
    net::enable_zerocopy(&sock)?;
    if !stream {
        zcio::sys::setsockopt_int(&sock, zcio::sys::SOL_UDP, zcio::sys::UDP_SEGMENT, 1400)?;
    }
    let buf = vec![0x5au8; SIZE];
    let (mut sent, mut done, mut copied) = (0u64, 0u64, 0u64);
    let (mut bytes, mut sends, mut send_calls, mut notify_calls) = (0u64, 0u64, 0u64, 0u64);
    let mut since = 0;
    let mut ranges = Vec::new();
    let mut errors = Vec::new();
    let mut notify =
        |ranges: &mut Vec<errqueue::ZcRange>, notify_calls: &mut u64, wait_ms: i32| -> Result<()> {
            loop {
                *notify_calls += 1;
                let rev = net::poll_one(&sock, libc::POLLERR, wait_ms)?;
                if rev & libc::POLLERR == 0 {
                    return Ok(());
                }
                let r = errqueue::reap(&sock, ranges, &mut errors, 1)?;
                *notify_calls += r.syscalls;
                if r.messages == 0 {
                    return Ok(());
                }
            }
        };
    let span = Span::start();
    let end = Instant::now() + dur;
    while Instant::now() < end {
        let mut off = 0;
        while off < SIZE {
            send_calls += 1;
            match net::send(&sock, &buf[off..], MSG_ZEROCOPY | libc::MSG_NOSIGNAL) {
                Ok(n) => {
                    off += n;
                    sent += 1;
                    since += 1;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    notify(&mut ranges, &mut notify_calls, 10)?;
                }
                Err(e) => return Err(e.into()),
            }
            if since >= limit {
                since = 0;
                notify(&mut ranges, &mut notify_calls, 0)?;
            }
            for r in ranges.drain(..) {
                done += r.len();
                if r.copied {
                    copied += r.len();
                }
            }
        }
        bytes += SIZE as u64;
        sends += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while done < sent && Instant::now() < deadline {
        notify(&mut ranges, &mut notify_calls, 100)?;
        for r in ranges.drain(..) {
            done += r.len();
            if r.copied {
                copied += r.len();
            }
        }
    }
    anyhow::ensure!(done == sent, "baseline: {done} of {sent} completions");
    let (wall, cpu) = span.stop();
    drop(sock);
    let mut s = Sample::default();
    s.set("mb_per_s", bytes as f64 / wall / 1e6)
        .set("sender_cpu", cpu / (bytes.max(1) as f64 / 1e9))
        .set("sender_busy", cpu / wall)
        .set(
            "notify_syscalls_per_send",
            notify_calls as f64 / sends.max(1) as f64,
        )
        .set(
            "syscalls_per_send",
            (notify_calls + send_calls) as f64 / sends.max(1) as f64,
        )
        .set("copied_fraction", copied as f64 / done.max(1) as f64);
    Ok(s)
}

fn from_report(rep: &ClientReport) -> Result<Sample> {
    anyhow::ensure!(rep.errors == 0, "{} sends failed", rep.errors);
    let mut s = Sample::default();
    s.set("mb_per_s", rep.bytes as f64 / rep.seconds / 1e6)
        .set("sender_cpu", rep.cpu_s_per_gb)
        .set("sender_busy", rep.cpu_s / rep.seconds)
        .set("notify_syscalls_per_send", rep.notify_syscalls_per_send)
        .set("syscalls_per_send", rep.syscalls_per_send)
        .set("copied_fraction", rep.copied_fraction.unwrap_or(1.0));
    for f in &rep.fallbacks {
        s.note(format!("fallback: {f}"));
    }
    Ok(s)
}

#[derive(Clone, Copy)]
enum Side {
    Baseline,
    Zcio(TxMode),
}

/// One run: TCP to the pair's other host, or UDP to the sink.
fn run_once(
    pair: &Pair,
    sink: &Sink,
    udp: bool,
    v6: bool,
    limit: usize,
    dur: Duration,
    side: Side,
) -> Result<Sample> {
    let (score, rcore) = core_plan(true);
    let client = move |sock: OwnedFd| -> Result<Sample> {
        let (w0, t0) = (runq_wait_s(), Instant::now());
        let mut s = match side {
            Side::Baseline => baseline(sock, !udp, limit, dur),
            Side::Zcio(mode) => {
                let mut o = ClientOpts::new(mode, SIZE, dur);
                o.cpu = Some(score);
                o.notify_limit = limit;
                o.depth = if udp { 64 } else { 256 };
                o.poll_every = limit;
                // Collecting completions must not submit early: `harvest` reads the CQ
                // (io_uring) or reaps the error queue (msg-zc) and leaves queued requests
                // queued until 4 are there.
                o.harvest_only = true;
                o.submit_batch = 4;
                from_report(&drive(sock, &o)?)
            }
        }?;
        if let (Some(a), Some(b)) = (w0, runq_wait_s()) {
            s.set("sender_runq", (b - a) / t0.elapsed().as_secs_f64());
        }
        Ok(s)
    };
    if udp {
        let (src, dst) = if v6 {
            (
                SocketAddr::from((sink.src6, 0)),
                SocketAddr::from((sink.dst6, 9)),
            )
        } else {
            (
                SocketAddr::from((sink.src4, 0)),
                SocketAddr::from((sink.dst4, 9)),
            )
        };
        return sink.host.run(move || -> Result<Sample> {
            let s = UdpSocket::bind(src)?;
            s.connect(dst)?;
            client(s.into())
        })?;
    }
    let dst = if v6 {
        SocketAddr::from((pair.b6, 5202))
    } else {
        SocketAddr::from((pair.b4, 5202))
    };
    let l = pair.b.run(move || TcpListener::bind(dst))??;
    let sides = crate::bench::pair::pair("notify pair")
        .server_core(rcore)
        .server_in(&pair.b);
    let rx = sides.server(move || -> std::io::Result<_> {
        let (mut s, _) = l.accept()?;
        let w0 = runq_wait_s();
        let r = serve_conn(&mut s, false)?;
        let runq = w0.zip(runq_wait_s()).map(|(a, b)| b - a);
        Ok((r, runq))
    })?;
    let s = pair.a.run(move || -> Result<Sample> {
        let sock = TcpStream::connect(dst)?;
        client(sock.into())
    })?;
    let (r, runq) = rx.io_result()?;
    let mut s = s?;
    if r.seconds > 0.0 {
        s.set("receiver_busy", r.cpu_s / r.seconds);
        if let Some(w) = runq {
            s.set("receiver_runq", w / r.seconds);
        }
    }
    Ok(s)
}

impl Suite for Notify {
    fn name(&self) -> &'static str {
        "notify"
    }
    fn about(&self) -> &'static str {
        "zero-copy completions: poll+recvmsg per limit (selftest) vs zcio batched reaper vs io_uring notification CQEs; TCP/UDP, v4/v6, limit 1 and 32"
    }
    fn chart_metric(&self) -> &'static str {
        "mb_per_s"
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        if let Some(peer) = ctx.peer.clone() {
            return crate::bench::peer::notify(ctx, &peer);
        }
        if let Err(e) = zcio_testnet::check_privileges() {
            return Err(ctx.skip(format!("needs test hosts: {e}")));
        }
        let pair = Pair::new("bnt").context("creating the test pair")?;
        let sink = Sink::new("bnt").context("creating the sink host")?;
        let dur = ctx.pick(Duration::from_millis(60), Duration::from_secs(1));
        ctx.note(format!(
            "{} writes; UDP with GSO goes to the sink host (zero-copy, not copied); TCP goes over \
             veth to the pair's other host, where local delivery copies (completions COPIED)",
            size_label(SIZE)
        ));
        ctx.note(
            "zcio sides: sends in flight from a pool (64 on UDP, 256 on TCP, where completions \
             wait for ACKs); the reaper reaps every `limit` sends; \
             the io_uring side harvests its CQ every `limit` sends (no syscall) and queues 4 \
             sends per io_uring_enter",
        );
        ctx.note(
            "TCP runs last 4x as long as UDP runs; sender_cpu is the sending thread's CPU per \
             10^9 bytes (the notification mechanism's cost, independent of how the cores are \
             shared); sender_busy / receiver_busy are each thread's CPU time over the run's wall \
             time; *_runq is the share of the run each spent runnable but waiting for its core \
             (schedstat): busy + runq near 1 means CPU-bound on a shared core, busy + runq well \
             below 1 means blocked (waiting for ACKs / data)",
        );
        ctx.note(
            "baseline = kernel selftest msg_zerocopy.c pattern: one reused buffer, every `limit` \
             sends poll(POLLERR) then recvmsg(MSG_ERRQUEUE) per queued notification",
        );
        for udp in [true, false] {
            for v6 in [false, true] {
                for limit in [1usize, 32] {
                    for (label, mode) in [
                        ("batched-reaper", TxMode::MsgZc),
                        ("uring-notif", TxMode::UringZc),
                    ] {
                        let case = format!(
                            "{}{} limit {limit} {label}",
                            if udp { "udp" } else { "tcp" },
                            if v6 { "6" } else { "4" }
                        );
                        if !super::tx::wanted(&case) {
                            continue;
                        }
                        // TCP over veth is slower and noisier (every byte is copied at
                        // delivery, both ends share the cores): run it 4x longer.
                        let dur = if udp { dur } else { dur * 4 };
                        let (p, s) = (&pair, &sink);
                        ctx.compare(
                            &case,
                            ("poll+recvmsg", label),
                            METRICS,
                            || run_once(p, s, udp, v6, limit, dur, Side::Baseline),
                            || run_once(p, s, udp, v6, limit, dur, Side::Zcio(mode)),
                        )?;
                    }
                }
            }
        }
        Ok(())
    }
}

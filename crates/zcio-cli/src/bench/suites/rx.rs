//! `rx`: one bulk TCP flow into a receiver, over loopback and over a veth pair between two
//! test hosts, sender and receiver on the same core and on different cores: epoll + `recv(2)`
//! (baseline) against zcio's `Receiver` on a provided-buffer ring. zcrx is attempted for real
//! and reported as unavailable with the kernel's errno where the device cannot do it.
//!
//! The `variant` cases take the receiver apart (one buffer per completion with 64 x 64 KiB
//! buffers = the first naive receiver, bundles, incremental consumption of large buffers,
//! batched waits) to show where receive CPU goes; see `docs/design/rx.md`.

use crate::bench::measure::{core_plan, cpu_s_per_gb, gbit_per_s, Span};
use crate::bench::pair::{ensure_bytes, pair};
use crate::bench::{Better, Ctx, MetricDef, Sample, Suite};
use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};
use zcio::rx::{Receiver, RxConfig, RxEvent, RxMode};
use zcio::sys::{net, poller::Poller};
use zcio_testnet::Pair;

/// The suite.
pub struct Rx;

const METRICS: &[MetricDef] = &[
    MetricDef::new("throughput", "Gbit/s", Better::Higher),
    MetricDef::new("receiver_cpu", "s/GB", Better::Lower),
    MetricDef::new("total_cpu", "s/GB", Better::Lower),
    MetricDef::new("syscalls_per_gb", "calls/GB", Better::Lower),
    MetricDef::new("bytes_per_chunk", "KiB", Better::Higher),
];

/// Receive buffer of the baseline, equal to the ring's buffer size.
const RECV_BUF: usize = 64 << 10;
/// Sender write size.
const WRITE: usize = 256 << 10;

/// The receiver configuration the suite measures as "zcio".
/// `ZCIO_RX_MIN_WAIT_US` and `ZCIO_RX_HOT_KB` override the defaults (for exploring).
pub fn zcio_config() -> RxConfig {
    let mut c = RxConfig::with_mode(RxMode::BufRing);
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    if let Some(us) = env("ZCIO_RX_MIN_WAIT_US") {
        c.min_wait = Duration::from_micros(us);
    }
    if let Some(kb) = env("ZCIO_RX_HOT_KB") {
        c.hot_bytes = kb as usize * 1024;
    }
    c
}

fn variants() -> Vec<(&'static str, bool, RxConfig)> {
    let base = RxConfig::with_mode(RxMode::BufRing).low_latency();
    let fifo = |cfg: RxConfig| RxConfig {
        hot_bytes: 0,
        ..cfg
    };
    let batched = |us: u64, cfg: RxConfig| RxConfig {
        batch: 32,
        min_wait: Duration::from_micros(us),
        ..cfg
    };
    let bundles = RxConfig {
        bundle: Some(true),
        ..base.clone()
    };
    vec![
        (
            "naive 64x64K single FIFO",
            true,
            fifo(RxConfig {
                buffers: 64,
                bundle: Some(false),
                ..base.clone()
            }),
        ),
        ("256x64K bundles FIFO", true, fifo(bundles.clone())),
        (
            "256x64K bundles FIFO batched 50us",
            true,
            batched(50, fifo(bundles.clone())),
        ),
        (
            "256x64K bundles hot 512K batched 200us",
            true,
            batched(
                200,
                RxConfig {
                    hot_bytes: 512 << 10,
                    ..bundles.clone()
                },
            ),
        ),
        (
            "256x64K bundles hot 2M batched 200us",
            true,
            batched(
                200,
                RxConfig {
                    hot_bytes: 2 << 20,
                    ..bundles.clone()
                },
            ),
        ),
        (
            "256x64K bundles hot 1M batched 50us",
            true,
            batched(50, bundles.clone()),
        ),
        (
            "256x64K bundles hot 1M batched 200us no DEFER_TASKRUN",
            true,
            batched(
                200,
                RxConfig {
                    defer_taskrun: false,
                    ..bundles.clone()
                },
            ),
        ),
        (
            "16x1M incremental FIFO batched 50us",
            true,
            batched(
                50,
                fifo(RxConfig {
                    buffers: 16,
                    buf_size: 1 << 20,
                    incremental: true,
                    ..base.clone()
                }),
            ),
        ),
        (
            "256x64K bundles FIFO batched 50us",
            false,
            batched(50, fifo(bundles.clone())),
        ),
        ("256x64K bundles hot 1M unbatched", false, bundles),
    ]
}

#[derive(Clone, Copy)]
enum Net {
    Loopback,
    Pair,
}

impl Suite for Rx {
    fn name(&self) -> &'static str {
        "rx"
    }
    fn about(&self) -> &'static str {
        "one TCP flow into a receiver over loopback and a veth pair: epoll+recv vs zcio Receiver (provided-buffer ring, multishot recv); zcrx attempted"
    }
    fn chart_metric(&self) -> &'static str {
        "receiver_cpu"
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        if let Some(peer) = ctx.peer.clone() {
            return crate::bench::peer::rx(ctx, &peer);
        }
        let dur = ctx.run_time();
        let lo = zcio::rx::zcrx::check_interface("lo", 0);
        ctx.note(format!(
            "zcrx unavailable on lo: errno {:?}: {}",
            lo.errno, lo.explanation
        ));
        ctx.note(
            "both sides copy: loopback and veth deliver into socket buffers, and recv / the \
             buffer ring copy from there (COPIED fraction 1.0); zcrx, the only no-copy \
             receive, needs a NIC with header split",
        );
        let f = zcio::ring::features::Features::get();
        ctx.note(
            match f.why_not(zcio::ring::features::Features::ZCRX_NODEV) {
                None => "device-less zcrx (ZCRX_REG_NODEV) is available but not benchmarked as \
                         a zero-copy path: the kernel copies every byte into the zcrx area \
                         (COPIED fraction 1.0), like the buffer ring"
                    .to_string(),
                Some(why) => format!("device-less zcrx unavailable: {why}"),
            },
        );
        let pair = if zcio_testnet::is_root() {
            match Pair::new("rxb") {
                Ok(p) => Some(p),
                Err(e) => {
                    ctx.note(format!("veth pair cases skipped: {e}"));
                    None
                }
            }
        } else {
            ctx.note("veth pair cases skipped: need root to create test hosts");
            None
        };
        if let Some(p) = &pair {
            let iface = p.iface;
            let chk =
                p.b.run(move || zcio::rx::zcrx::check_interface(iface, 0))
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            ctx.note(format!(
                "zcrx unavailable on veth ({}): errno {:?}: {}",
                iface, chk.errno, chk.explanation
            ));
        }
        let zcfg = zcio_config();
        ctx.note(format!(
            "zcio receiver: {}",
            describe(&zcfg).unwrap_or_else(|e| e.to_string())
        ));
        // ZCIO_RX_CASES=substring runs only the matching cases (for profiling).
        let only = std::env::var("ZCIO_RX_CASES").ok();
        let wanted = |case: &str| only.as_deref().map_or(true, |o| case.contains(o));
        for (net, tag) in [(Net::Loopback, "loopback"), (Net::Pair, "veth")] {
            if matches!(net, Net::Pair) && pair.is_none() {
                continue;
            }
            for split in [true, false] {
                let case = format!(
                    "tcp {tag} {}",
                    if split { "split-cores" } else { "same-core" }
                );
                let p = pair.as_ref();
                if !wanted(&case) {
                    continue;
                }
                ctx.compare(
                    &case,
                    ("epoll+recv", "zcio bufring"),
                    METRICS,
                    || run_once(net, p, split, dur, None),
                    || run_once(net, p, split, dur, Some(&zcfg)),
                )?;
            }
        }
        for (name, split, cfg) in variants() {
            let case = format!(
                "variant loopback {}: {name}",
                if split { "split-cores" } else { "same-core" }
            );
            if !wanted(&case) {
                continue;
            }
            ctx.compare(
                &case,
                ("epoll+recv", name),
                METRICS,
                || run_once(Net::Loopback, None, split, dur, None),
                || run_once(Net::Loopback, None, split, dur, Some(&cfg)),
            )?;
        }
        Ok(())
    }
}

fn describe(cfg: &RxConfig) -> Result<String> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let r = Receiver::listen(l, cfg)?;
    Ok(r.describe())
}

struct RecvStats {
    bytes: u64,
    syscalls: u64,
    chunks: u64,
    cpu: f64,
    end: Instant,
    note: Option<String>,
}

fn run_once(
    net: Net,
    hosts: Option<&Pair>,
    split: bool,
    dur: Duration,
    cfg: Option<&RxConfig>,
) -> Result<Sample> {
    let case = match net {
        Net::Loopback => "rx loopback",
        Net::Pair => "rx pair",
    };
    let mut p = pair(case).cores(core_plan(split));
    let laddr: SocketAddr = match net {
        Net::Loopback => "127.0.0.1:0".parse()?,
        Net::Pair => {
            let hosts = hosts.context("pair")?;
            p = p.server_in(&hosts.b).client_in(&hosts.a);
            SocketAddr::from((hosts.b4, 0))
        }
    };
    let (atx, arx) = std::sync::mpsc::channel::<std::io::Result<SocketAddr>>();
    let cfg = cfg.cloned();
    let receiver = p.server(move || -> Result<RecvStats> {
        let l = match TcpListener::bind(laddr) {
            Ok(l) => l,
            Err(e) => {
                let _ = atx.send(Err(std::io::Error::new(e.kind(), e.to_string())));
                return Err(e.into());
            }
        };
        let addr = l.local_addr();
        match cfg {
            None => receive_epoll(l, || drop(atx.send(addr))),
            Some(c) => receive_zcio(l, &c, || drop(atx.send(addr))),
        }
    })?;
    let addr = arx.recv().context("receiver thread")??;
    let t0 = Instant::now();
    let sender = p.client(move || -> std::io::Result<(u64, f64)> {
        let span = Span::start();
        let mut s = TcpStream::connect(addr)?;
        let buf = vec![0x5au8; WRITE];
        let deadline = Instant::now() + dur;
        let mut sent = 0u64;
        while Instant::now() < deadline {
            s.write_all(&buf)?;
            sent += buf.len() as u64;
        }
        s.shutdown(std::net::Shutdown::Write)?;
        let mut b = [0u8; 1];
        let _ = s.read(&mut b);
        Ok((sent, span.stop().1))
    })?;
    let (sent, send_cpu) = sender.io_result()?;
    let st = receiver.result()?;
    ensure_bytes(st.bytes, sent)?;
    let wall = (st.end - t0).as_secs_f64();
    let gb = st.bytes as f64 / 1e9;
    let mut s = Sample::default();
    s.set("throughput", gbit_per_s(st.bytes, wall))
        .set("receiver_cpu", cpu_s_per_gb(st.cpu, st.bytes))
        .set("total_cpu", cpu_s_per_gb(st.cpu + send_cpu, st.bytes))
        .set("syscalls_per_gb", st.syscalls as f64 / gb)
        .set(
            "bytes_per_chunk",
            st.bytes as f64 / st.chunks.max(1) as f64 / 1024.0,
        );
    if let Some(n) = st.note {
        s.note(n);
    }
    Ok(s)
}

/// The baseline: accept, then level-triggered epoll and `recv` into one 64 KiB buffer until a
/// short read.
fn receive_epoll(l: TcpListener, ready: impl FnOnce()) -> Result<RecvStats> {
    ready();
    let (s, _) = l.accept()?;
    s.set_nonblocking(true)?;
    let mut ep = Poller::new(8)?;
    ep.add(&s, 1, libc::EPOLLIN as u32)?;
    let mut buf = vec![0u8; RECV_BUF];
    let span = Span::start();
    let (mut bytes, mut syscalls, mut chunks) = (0u64, 1u64, 0u64);
    'outer: loop {
        syscalls += 1;
        ep.wait(1000, |_, _| {})?;
        loop {
            syscalls += 1;
            match net::recv(&s, &mut buf, 0) {
                Ok(0) => break 'outer,
                Ok(n) => {
                    bytes += n as u64;
                    chunks += 1;
                    if n < buf.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            }
        }
    }
    let (_, cpu) = span.stop();
    Ok(RecvStats {
        bytes,
        syscalls,
        chunks,
        cpu,
        end: Instant::now(),
        note: None,
    })
}

fn receive_zcio(l: TcpListener, cfg: &RxConfig, ready: impl FnOnce()) -> Result<RecvStats> {
    // Set-up (ring, buffer registration) happens before the sender starts.
    let mut rx = Receiver::listen(l, cfg)?;
    ready();
    let span = Span::start();
    let mut bytes = 0u64;
    let mut done = false;
    while !done {
        rx.poll(Duration::from_secs(1), &mut |ev| match ev {
            RxEvent::Data(c) => bytes += c.len() as u64,
            RxEvent::Closed(_, _) => done = true,
            RxEvent::Accepted(_) => {}
        })?;
    }
    let (_, cpu) = span.stop();
    let c = rx.stats().clone();
    Ok(RecvStats {
        bytes,
        syscalls: c.syscalls,
        chunks: c.chunks,
        cpu,
        end: Instant::now(),
        note: Some(format!(
            "{}; re-arms {} (ENOBUFS {}), ring ran dry {} times, {} enters",
            rx.describe(),
            c.rearms,
            c.enobufs,
            c.ring_dry,
            c.ring_enters
        )),
    })
}

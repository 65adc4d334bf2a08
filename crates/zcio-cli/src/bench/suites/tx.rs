//! `tx`: copy vs MSG_ZEROCOPY vs io_uring SEND_ZC (and with fixed buffers), 4K–1M writes,
//! through `tx::Sender`; sender CPU per GB, throughput, syscalls per send, COPIED fraction.
//!
//! (a) TCP over loopback and over a test-host pair (veth): local delivery copies, so every
//! zero-copy completion says COPIED and zero-copy only adds cost; the output says so.
//! (b) UDP with GSO to the sink host: packets are dropped at the device, nothing copies, and
//! the CPU saving of zero-copy is real. Plus TCP loopback `auto` against plain send.

use crate::bench::measure::{core_plan, size_label};
use crate::bench::pair::ensure_bytes;
use crate::bench::{Better, Ctx, MetricDef, Sample, Suite};
use crate::perf::client::{drive, ClientOpts, ClientReport};
use crate::perf::server::serve_conn;
use anyhow::{Context, Result};
use std::cell::RefCell;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;
use zcio::tx::TxMode;
use zcio_testnet::{Pair, Sink};

/// The suite.
pub struct Tx;

const METRICS: &[MetricDef] = &[
    MetricDef::new("sender_cpu", "s/GB", Better::Lower),
    MetricDef::new("throughput", "Gbit/s", Better::Higher),
    MetricDef::new("syscalls_per_send", "calls", Better::Lower),
    MetricDef::new("copied_fraction", "fraction", Better::Lower),
];

const SIZES: &[usize] = &[4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20];
/// The default run's sizes (the smallest, the middle and the largest of [`SIZES`]).
const DEFAULT_SIZES: &[usize] = &[4 << 10, 64 << 10, 1 << 20];
/// The default run's cap on the working set (see [`cold_working_set`]).
const DEFAULT_WS: usize = 256 << 20;
const ZC: &[TxMode] = &[TxMode::MsgZc, TxMode::UringZc, TxMode::UringZcFixed];

/// Bytes of send buffers each run cycles through: 4× the last-level cache (at least 32 MiB,
/// at most 1 GiB), so every send reads data that is not in cache, as a real sender's data is
/// (the netperf figures in the MSG_ZEROCOPY cover letter also cycle through a ring of
/// buffers). Re-sending one cache-hot buffer makes the copy nearly free and hides what
/// zero-copy saves.
pub fn cold_working_set() -> (usize, Option<usize>) {
    let llc = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index3/size")
        .ok()
        .and_then(|s| crate::util::parse_size(s.trim()).ok());
    let ws = llc.map_or(32 << 20, |l| (4 * l).clamp(32 << 20, 1 << 30));
    (ws, llc)
}

pub use crate::bench::wanted;

/// The sender of one case: `size`-byte writes for `dur`, cycling through `ws` bytes of buffers.
fn client_opts(mode: TxMode, size: usize, dur: Duration, ws: usize) -> ClientOpts {
    let mut o = ClientOpts::new(mode, size, dur);
    // About 4 MB in flight: TCP completions wait for ACKs.
    o.depth = ((4 << 20) / size).clamp(16, 1024);
    o.submit_batch = 16;
    o.working_set = ws;
    o
}

/// Where the bytes go.
#[derive(Clone, Copy, Debug)]
enum Route {
    Loopback,
    Pair,
    Sink,
}

/// One measured run over `route`.
fn run_once(
    route: Route,
    pair: Option<&Pair>,
    sink: Option<&Sink>,
    opts: &ClientOpts,
) -> Result<ClientReport> {
    let (score, rcore) = core_plan(true);
    let mut opts = opts.clone();
    opts.cpu = Some(score);
    match route {
        Route::Loopback => {
            let p = crate::bench::pair::pair("tx loopback").server_core(rcore);
            let l = TcpListener::bind("127.0.0.1:0")?;
            let addr = l.local_addr()?;
            let rx = p.server(move || -> std::io::Result<u64> {
                let (mut s, _) = l.accept()?;
                Ok(serve_conn(&mut s, false)?.bytes)
            })?;
            let sock = TcpStream::connect(addr)?;
            // `drive` pins itself (opts.cpu).
            let rep = p.client(move || drive(sock.into(), &opts))?.result()?;
            ensure_bytes(rx.io_result()?, rep.total_bytes)?;
            Ok(rep)
        }
        Route::Pair => {
            let pair = pair.context("pair")?;
            let p = crate::bench::pair::pair("tx pair")
                .server_core(rcore)
                .server_in(&pair.b);
            let dst = SocketAddr::from((pair.b4, 5201));
            let l = pair.b.run(move || TcpListener::bind(dst))??;
            let rx = p.server(move || -> std::io::Result<u64> {
                let (mut s, _) = l.accept()?;
                Ok(serve_conn(&mut s, false)?.bytes)
            })?;
            let rep = pair.a.run(move || -> Result<ClientReport> {
                let sock = TcpStream::connect(dst)?;
                drive(sock.into(), &opts)
            })??;
            ensure_bytes(rx.io_result()?, rep.total_bytes)?;
            Ok(rep)
        }
        Route::Sink => {
            let sink = sink.context("sink")?;
            let (src, dst) = (
                SocketAddr::from((sink.src4, 0)),
                SocketAddr::from((sink.dst4, 9)),
            );
            sink.host.run(move || -> Result<ClientReport> {
                let s = UdpSocket::bind(src)?;
                s.connect(dst)?;
                drive(s.into(), &opts)
            })?
        }
    }
}

fn sample(rep: &ClientReport) -> Result<Sample> {
    anyhow::ensure!(rep.errors == 0, "{} sends failed", rep.errors);
    let mut s = Sample::default();
    s.set("sender_cpu", rep.cpu_s_per_gb)
        .set("throughput", rep.gbit_s)
        .set("syscalls_per_send", rep.syscalls_per_send)
        // A copy send copies every byte.
        .set("copied_fraction", rep.copied_fraction.unwrap_or(1.0));
    for f in &rep.fallbacks {
        s.note(format!("{} fallback: {f}", rep.mode));
    }
    if rep.mode != rep.path && rep.mode != "auto" {
        s.note(format!("{} ran as {}", rep.mode, rep.path));
    }
    Ok(s)
}

impl Suite for Tx {
    fn name(&self) -> &'static str {
        "tx"
    }
    fn about(&self) -> &'static str {
        "tx::Sender: copy vs MSG_ZEROCOPY vs SEND_ZC (+fixed), 4K-1M; TCP loopback/veth (copied) and UDP GSO to the sink (zero-copy)"
    }
    fn chart_metric(&self) -> &'static str {
        "sender_cpu"
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        if let Some(peer) = ctx.peer.clone() {
            return crate::bench::peer::tx(ctx, &peer);
        }
        let dur = ctx.pick(Duration::from_millis(80), Duration::from_secs(1));
        let hosts_ok = zcio_testnet::check_privileges();
        let (pair, sink) = match &hosts_ok {
            Ok(()) => (
                Some(Pair::new("btx").context("creating the test pair")?),
                Some(Sink::new("btx").context("creating the sink host")?),
            ),
            Err(e) => {
                ctx.note(format!(
                    "test hosts unavailable ({e}): veth and sink cases skipped"
                ));
                (None, None)
            }
        };
        ctx.note(
            "sender CPU is the sending thread's CPU time (CLOCK_THREAD_CPUTIME_ID) per 10^9 bytes \
             completed; io_uring paths queue 16 requests (UDP: GSO writes of up to 64K) per \
             io_uring_enter; about 4 MB in flight (4 MB / size sends, 16..1024)",
        );
        let (cold_ws, llc) = cold_working_set();
        // Each run maps, fills (and for fixed buffers pins) its whole working set: at 1 GiB that
        // is most of a run's time (a run of 80 ms of sending took about 1 s here). The default
        // run caps it at DEFAULT_WS, --full uses 4x the last-level cache.
        let ws = ctx.pick(cold_ws.min(DEFAULT_WS), cold_ws);
        ctx.note(format!(
            "both sides of every case cycle through the same {} of send buffers (oldest \
             returned first){}, so each send reads data that is not in cache, as a real \
             sender's does; nothing else touches them while sending. Cases marked `hot` re-use \
             about 4 MB of buffers (in cache): the copy is then cheap",
            size_label(ws),
            if ws == cold_ws {
                format!(
                    ", 4x the last-level cache ({})",
                    llc.map_or("unknown: 32 MiB assumed".to_string(), size_label)
                )
            } else {
                format!(
                    " (the default run's cap; `--full` uses {}, 4x the last-level cache of {}: \
                     with a cache this large part of the default run's data may still be cached, \
                     which makes the copy look cheaper than it is)",
                    size_label(cold_ws),
                    llc.map_or("unknown".to_string(), size_label)
                )
            }
        ));
        // The default run measures three sizes per route; --full all five.
        let sizes: Vec<usize> = ctx.pick(DEFAULT_SIZES.to_vec(), SIZES.to_vec());
        let copied: RefCell<Vec<(String, f64)>> = RefCell::new(Vec::new());
        let mut routes = vec![(Route::Loopback, "tcp-lo", sizes.clone(), ws)];
        if pair.is_some() {
            routes.push((Route::Pair, "tcp-veth", vec![64 << 10], ws));
            routes.push((Route::Sink, "udp-gso-sink", sizes.clone(), ws));
            routes.push((Route::Sink, "udp-gso-sink hot", vec![64 << 10], 0));
            // A buffer of exactly one GSO write (the most whole datagrams one UDP send may
            // carry): 64K is that plus a short tail datagram, i.e. two kernel sends.
            let sink = sink.as_ref().context("sink")?;
            let (src, dst) = (
                SocketAddr::from((sink.src4, 0)),
                SocketAddr::from((sink.dst4, 9)),
            );
            let (chunk, seg) = sink.host.run(move || -> Result<(usize, usize)> {
                let s = UdpSocket::bind(src)?;
                s.connect(dst)?;
                let pool = zcio::buf::pool::Pool::new(4096, 1, false)?;
                let tx =
                    zcio::tx::Sender::new(s, &pool, zcio::tx::SenderConfig::new(TxMode::Copy))?;
                Ok((tx.chunk(), tx.segment()))
            })??;
            if chunk < 1 << 20 && seg > 0 && ctx.mode == crate::bench::Mode::Full {
                ctx.note(format!(
                    "udp-gso-sink 1-write: buffers of {chunk} bytes, one GSO write ({} datagrams \
                     of {seg} bytes); a 64K buffer is one such write plus a {}-byte datagram in \
                     a second send",
                    chunk / seg,
                    (64 << 10) % chunk
                ));
                routes.push((Route::Sink, "udp-gso-sink 1-write", vec![chunk], ws));
            }
        }
        for (route, tag, sizes, ws) in routes {
            for &size in &sizes {
                for &mode in ZC {
                    let case = format!("{tag} {} {mode}", size_label(size));
                    if !wanted(&case) {
                        continue;
                    }
                    let mk = |m: TxMode| client_opts(m, size, dur, ws);
                    let (p, s) = (pair.as_ref(), sink.as_ref());
                    let copied = &copied;
                    ctx.compare(
                        &case,
                        ("copy", mode.to_string().as_str()),
                        METRICS,
                        || sample(&run_once(route, p, s, &mk(TxMode::Copy))?),
                        || {
                            let rep = run_once(route, p, s, &mk(mode))?;
                            if let Some(f) = rep.copied_fraction {
                                copied.borrow_mut().push((tag.to_string(), f));
                            }
                            sample(&rep)
                        },
                    )?;
                }
            }
        }
        for (tag, what) in [
            ("tcp-lo", "TCP over loopback"),
            ("tcp-veth", "TCP over veth between test hosts"),
            ("udp-gso-sink", "UDP with GSO to the sink host"),
            (
                "udp-gso-sink hot",
                "UDP with GSO to the sink host, hot buffers",
            ),
        ] {
            let v: Vec<f64> = copied
                .borrow()
                .iter()
                .filter(|(t, _)| t == tag)
                .map(|x| x.1)
                .collect();
            if v.is_empty() {
                continue;
            }
            let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = v.iter().cloned().fold(0.0, f64::max);
            let verdict = if lo > 0.99 {
                "every zero-copy completion came back COPIED: this path copies anyway, zero-copy \
                 here is a copy plus notification cost"
            } else if hi < 0.01 {
                "completions report zero-copy (no COPIED): the pages went to the device unread"
            } else {
                "completions were partly COPIED"
            };
            ctx.note(format!(
                "{what}: measured COPIED fraction {lo:.3}..{hi:.3}: {verdict}"
            ));
        }
        // auto vs plain send where the path copies. Both sides get the same warm-up (the
        // connection's window opens; auto sees its first COPIED completions and settles on
        // copy), then the steady state is measured.
        let warmup = ctx.pick(Duration::from_millis(30), Duration::from_millis(300));
        ctx.note(format!(
            "auto cases: both sides send for {warmup:?} before measuring (same warm-up), then \
             {:?}; auto's first zero-copy sends and its switch to copy fall in the warm-up",
            dur * 4
        ));
        for size in [16 << 10, 64 << 10] {
            let case = format!("tcp-lo {} auto", size_label(size));
            if !wanted(&case) {
                continue;
            }
            let mk = |m: TxMode| {
                let mut o = ClientOpts::new(m, size, dur * 4);
                o.warmup = warmup;
                o.working_set = ws;
                o
            };
            ctx.compare(
                &case,
                ("copy", "auto"),
                METRICS,
                || sample(&run_once(Route::Loopback, None, None, &mk(TxMode::Copy))?),
                || {
                    let rep = run_once(Route::Loopback, None, None, &mk(TxMode::Auto))?;
                    let mut s = sample(&rep)?;
                    s.note(format!(
                        "auto ended on path {} after {} switch(es) to copy, {} re-probe(s)",
                        rep.path, rep.stats.auto_switches_to_copy, rep.stats.auto_reprobes
                    ));
                    Ok(s)
                },
            )?;
        }
        many(ctx, dur, warmup, ws)?;
        scale(ctx, dur, warmup, ws)?;
        if let Some(sink) = sink.as_ref() {
            peers(ctx, sink, dur, warmup, ws)?;
        }
        sweep(ctx, pair.is_some(), sink.as_ref(), dur, warmup, ws)?;
        Ok(())
    }
}

const MANY_METRICS: &[MetricDef] = &[
    MetricDef::new("sender_cpu", "s/GB", Better::Lower),
    MetricDef::new("throughput", "Gbit/s", Better::Higher),
    MetricDef::new("kernel_entries_per_1k_sends", "calls", Better::Lower),
    MetricDef::new("copied_fraction", "fraction", Better::Lower),
];

fn many_sample(r: &super::tx_many::ManyReport) -> Sample {
    let mut s = Sample::default();
    s.set("sender_cpu", r.cpu_s_per_gb())
        .set("throughput", r.gbit_s())
        .set("kernel_entries_per_1k_sends", r.entries_per_1k())
        .set("copied_fraction", r.copied_fraction.unwrap_or(1.0));
    s.note(r.note.clone());
    s
}

/// Many sockets from one thread: 1,000 loopback connections (`--full`; 200 otherwise), sends of
/// 4 KiB and 64 KiB round-robin, on one shared ring and on a ring per socket, each against
/// epoll + send. Rows `many <n>x<size> <way> vs epoll+send`.
fn many(ctx: &mut Ctx, dur: Duration, warmup: Duration, ws: usize) -> Result<()> {
    use super::tx_many::{run, ManyOpts, Way};
    let conns = ctx.pick(200, 1000);
    let batch = 64;
    ctx.note(format!(
        "many: {conns} loopback TCP connections, sends round-robin from one thread; epoll + send (non-blocking send per buffer, EPOLLOUT when full) vs one shared SendRing (auto, {batch} requests per io_uring_enter across sockets, pool registered once, sockets in one registered-file table) vs a Sender (io_uring) per socket (auto, one enter per send; --full only); every side warms up {warmup:?}, then {:?} measured; kernel entries are every syscall the sending thread made. On loopback every byte is copied (COPIED 1.0): auto sends by io_uring SEND after each socket's first zero-copy completions",
        dur * 2
    ));
    for size in [4 << 10, 64 << 10] {
        // A ring per socket makes and closes `conns` rings per run, which the set-up pace
        // spreads out (200 rings x 6 runs took 160 s here): only with --full.
        let ways: &[(&str, Way)] = if ctx.mode == crate::bench::Mode::Full {
            &[
                ("shared ring", Way::SharedRing),
                ("ring per socket", Way::RingPerSocket),
            ]
        } else {
            &[("shared ring", Way::SharedRing)]
        };
        for &(label, way) in ways {
            let case = format!("many {conns}x{} {label} vs epoll+send", size_label(size));
            if !wanted(&case) {
                continue;
            }
            let o = ManyOpts {
                conns,
                size,
                warmup,
                dur: dur * 2,
                ws,
                batch,
            };
            ctx.compare(
                &case,
                ("epoll+send", label),
                MANY_METRICS,
                || Ok(many_sample(&run(Way::EpollSend, &o)?)),
                || Ok(many_sample(&run(way, &o)?)),
            )?;
        }
    }
    Ok(())
}

const SCALE_METRICS: &[MetricDef] = &[
    MetricDef::new("sender_cpu_per_send", "us", Better::Lower),
    MetricDef::new("on_ready_mean", "us", Better::Lower),
    MetricDef::new("empty_wakeups", "fraction", Better::Lower),
    MetricDef::new("throughput", "Gbit/s", Better::Higher),
    MetricDef::new("copied_fraction", "fraction", Better::Lower),
];

fn scale_sample(r: &super::tx_scale::ScaleReport) -> Sample {
    let mut s = Sample::default();
    s.set("sender_cpu_per_send", r.cpu_us_per_send())
        .set("throughput", r.gbit_s())
        .set("copied_fraction", r.copied_fraction);
    // Absent, not 0, when the loop never slept on the descriptor (the row then has no value
    // for them; the note says how many calls and wake-ups there were).
    if let Some(m) = r.on_ready_mean_us() {
        s.set("on_ready_mean", m);
    }
    if let Some(f) = r.empty_wake_fraction() {
        s.set("empty_wakeups", f);
    }
    s.note(r.note.clone());
    s
}

/// One send ring as the number of its sockets grows: `big` loopback connections against
/// `small` (10,000 vs 1,000 with `--full`, 2,000 vs 200 otherwise), 16 KiB sends, the same
/// event loop (send, submit, `poll` on the readiness descriptor, `on_ready`). Row `scale
/// <big>x16K vs <small>`: the ratio of CPU per send and of the mean `on_ready` time says
/// whether the ring's work per call grows with its socket count; `empty_wakeups` is the
/// fraction of wake-ups after which `on_ready` found no completion and no writable socket.
fn scale(ctx: &mut Ctx, dur: Duration, warmup: Duration, ws: usize) -> Result<()> {
    use super::tx_many::ManyOpts;
    use super::tx_scale::run;
    // `ZCIO_BENCH_SCALE=1000,10000`: other sizes (for profiling one mode's run).
    let (small, big) = std::env::var("ZCIO_BENCH_SCALE")
        .ok()
        .and_then(|v| {
            let (a, b) = v.split_once(',')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .unwrap_or(ctx.pick((200, 2000), (1000, 10_000)));
    let size = 16 << 10;
    let case = format!("scale {big}x{} vs {small}", size_label(size));
    if !wanted(&case) {
        return Ok(());
    }
    ctx.note(format!(
        "scale: one SendRing (uring-zc-fixed, depth 4, pool registered) over {small} and over {big} loopback TCP connections, 16 KiB sends, an event loop (send to every socket that takes one, submit, poll(2) on the readiness descriptor, on_ready); a buffer comes back with its notification, after the peer's ACK; the receiver is a separate process (a connection is two descriptors on loopback); warm-up {warmup:?}, then {:?} measured. Loopback copies every byte at delivery (COPIED 1.0)",
        dur * 2
    ));
    let mk = |conns| ManyOpts {
        conns,
        size,
        warmup,
        dur: dur * 2,
        ws,
        batch: 32,
    };
    ctx.compare(
        &case,
        (
            &format!("{small} connections"),
            &format!("{big} connections"),
        ),
        SCALE_METRICS,
        || Ok(scale_sample(&run(&mk(small))?)),
        || Ok(scale_sample(&run(&mk(big))?)),
    )
}

const PEERS_METRICS: &[MetricDef] = &[
    MetricDef::new("sender_cpu", "s/GB", Better::Lower),
    MetricDef::new("throughput", "Gbit/s", Better::Higher),
    MetricDef::new("syscalls_per_send", "calls", Better::Lower),
    MetricDef::new("copied_fraction", "fraction", Better::Lower),
];

fn peers_sample(r: &super::tx_peers::PeersReport) -> Sample {
    let mut s = Sample::default();
    s.set("sender_cpu", r.cpu_s_per_gb())
        .set("throughput", r.gbit_s())
        .set("syscalls_per_send", r.syscalls_per_send())
        // A copy path copies every byte.
        .set("copied_fraction", r.copied_fraction.unwrap_or(1.0));
    s.note(r.note.clone());
    s
}

/// One unconnected UDP socket to 256 peers on the sink host, 64 KiB-class GSO trains of
/// 1,472-byte segments (44 segments: the largest whole-segment train under the 65,507-byte
/// UDP limit): SENDMSG_ZC against sendmmsg + UDP_SEGMENT and against sendmsg(MSG_ZEROCOPY);
/// then a 256-byte header and a body as one vectored request against a copy into one buffer
/// and against two sends. Rows `peers …` and `vectored …`.
fn peers(ctx: &mut Ctx, sink: &Sink, dur: Duration, warmup: Duration, ws: usize) -> Result<()> {
    use super::tx_peers::{run, PeersOpts, Way};
    let o = PeersOpts {
        peers: 256,
        train: 44 * 1472,
        segment: 1472,
        header: 256,
        warmup,
        dur: dur * 2,
        ws,
        batch: 32,
    };
    ctx.note(format!(
        "peers / vectored: one unconnected UDP socket on the sink host sends trains of {} bytes \
         ({} datagrams of {} bytes, UDP_SEGMENT per message) round-robin to {} destinations; \
         {} trains per sendmmsg or per io_uring_enter; each side warms up {warmup:?}, then \
         {:?} measured; syscalls are every system call the sending thread made. Vectored: a \
         {}-byte header and a {}-byte body, each in a page-aligned 64 KiB slot of one registered \
         pool (17 pages: what one zero-copy skb holds; a train over more pages is refused with \
         EMSGSIZE and zcio sends it by copy, recorded), to the same peers",
        o.train,
        o.train / o.segment as usize,
        o.segment,
        o.peers,
        o.batch,
        o.dur,
        o.header,
        o.train - o.header
    ));
    let rows = [
        (
            "peers 256x64K sendmsg-zc vs sendmmsg+gso",
            ("sendmmsg+gso", "sendmsg-zc"),
            Way::Sendmmsg,
            Way::SendmsgZc,
        ),
        (
            "peers 256x64K sendmsg-zc vs msg-zerocopy",
            ("msg-zerocopy", "sendmsg-zc"),
            Way::MsgZerocopy,
            Way::SendmsgZc,
        ),
        (
            "vectored 256B+64K vs copy into one buffer",
            ("copy-into-one", "vectored"),
            Way::CopyIntoOne,
            Way::Vectored,
        ),
        (
            "vectored 256B+64K vs two sends",
            ("two-sends", "vectored"),
            Way::TwoSends,
            Way::Vectored,
        ),
    ];
    for (case, labels, base, zc) in rows {
        if !wanted(case) {
            continue;
        }
        ctx.compare(
            case,
            labels,
            PEERS_METRICS,
            || Ok(peers_sample(&run(base, &o, sink)?)),
            || Ok(peers_sample(&run(zc, &o, sink)?)),
        )?;
    }
    Ok(())
}

/// Sizes of the `auto` sweep.
const SWEEP: &[usize] = &[
    256,
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
];

/// The default run's sweep: one size below auto's usual crossover, one near it, one above.
const DEFAULT_SWEEP: &[usize] = &[1 << 10, 16 << 10, 256 << 10];

/// The better of two samples, metric by metric (`throughput` higher, `sender_cpu` lower),
/// with a note naming which side won each.
fn best_of(copy: &Sample, zc: &Sample) -> Sample {
    let mut s = Sample::default();
    for m in METRICS {
        let (Some(&a), Some(&b)) = (copy.values.get(m.name), zc.values.get(m.name)) else {
            continue;
        };
        let zc_wins = match m.better {
            Better::Higher => b > a,
            Better::Lower => b < a,
        };
        s.set(m.name, if zc_wins { b } else { a });
        if matches!(m.name, "throughput" | "sender_cpu") {
            s.note(format!(
                "{}: best was {} ({a:.4} copy vs {b:.4} zero-copy)",
                m.name,
                if zc_wins { "zero-copy" } else { "copy" }
            ));
        }
    }
    s
}

/// `auto` against the better of copy and zero-copy (`uring-zc-fixed`, the path `auto` takes
/// when it can register the pool), measured in the same round, at every size from 256 B to
/// 1 MiB, over TCP loopback (completions COPIED) and UDP with GSO to the sink (zero-copy).
/// Rows `sweep <path> <size> auto vs best`; every side gets the same warm-up, in which `auto`
/// learns.
fn sweep(
    ctx: &mut Ctx,
    hosts: bool,
    sink: Option<&Sink>,
    dur: Duration,
    warmup: Duration,
    ws: usize,
) -> Result<()> {
    let mut routes = vec![(Route::Loopback, "tcp-lo")];
    if hosts {
        routes.push((Route::Sink, "udp-gso-sink"));
    }
    ctx.note(format!(
        "sweep: each row's baseline is the better of copy and uring-zc-fixed in the same round (metric by metric), its zcio value auto; every side sends {warmup:?} before {dur:?} measured; auto learns the size below which copy is cheaper in that warm-up"
    ));
    let sizes = ctx.pick(DEFAULT_SWEEP, SWEEP);
    for (route, tag) in routes {
        for &size in sizes {
            let case = format!("sweep {tag} {} auto vs best", size_label(size));
            if !wanted(&case) {
                continue;
            }
            let mk = |m: TxMode| ClientOpts {
                warmup,
                ..client_opts(m, size, dur, ws)
            };
            ctx.compare(
                &case,
                ("best of copy, uring-zc-fixed", "auto"),
                &METRICS[..2],
                || {
                    let copy = sample(&run_once(route, None, sink, &mk(TxMode::Copy))?)?;
                    let zc = sample(&run_once(route, None, sink, &mk(TxMode::UringZcFixed))?)?;
                    Ok(best_of(&copy, &zc))
                },
                || {
                    let rep = run_once(route, None, sink, &mk(TxMode::Auto))?;
                    let mut s = sample(&rep)?;
                    s.note(format!(
                        "auto (path {}): {} of {} sends by copy for their size, copy below {}, {} \
                         windows measured ({} re-measuring, {} on drift), {} switch(es) to copy \
                         on COPIED",
                        rep.path,
                        rep.stats.auto_size_copies,
                        rep.sends,
                        rep.stats
                            .auto_copy_below
                            .map_or("(not learned)".to_string(), |b| size_label(b as usize)),
                        rep.stats.auto_windows,
                        rep.stats.auto_explores,
                        rep.stats.auto_drift_explores,
                        rep.stats.auto_switches_to_copy
                    ));
                    Ok(s)
                },
            )?;
        }
    }
    Ok(())
}

//! `proxy`: `zcio proxy` (one ring per thread, received buffers forwarded in place with
//! SEND_ZC) against HAProxy `mode tcp` with splice on and off and the nginx `stream` module,
//! each started by the suite with its own config, one thread/worker each.
//!
//! - Bulk: 4 client connections stream into a sink server through the proxy, on loopback and
//!   across test hosts (client and server in host A, the proxy in host B, over veth):
//!   throughput, the proxy process's CPU seconds per GB (`/proc/PID/stat`, all threads), and
//!   kernel entries per MB (`perf stat -e raw_syscalls:sys_enter -p PID`: every syscall of
//!   every thread of the proxy process, `io_uring_enter` included, counted the same way for
//!   every proxy).
//! - Request/response: wrk, 1 KiB responses from nginx through the proxy: req/s, p50, p99,
//!   p99.9 (wrk's own percentiles, from a `done` script), proxy CPU per request. Two states of
//!   the proxy, both for every proxy in the comparison: *cold*, the first second(s) after the
//!   proxy started, 100 connections arriving at once (what a restarted, scaled-out or reloaded
//!   proxy lives through); *warm*, the same run after a 2 s warm-up on the running proxy.
//!   `--full` adds a warm sweep at 1, 10 and 1,000 connections and a cold run with 1,000
//!   connections, against HAProxy without splice (100 connections are the default rows).
//! - Open loop: `h2load --h1 --rps` on a warm proxy, at 90% (`--full`: 50% and 90%) of
//!   h2load's own closed-loop maximum from the same connections, the slower proxy's median
//!   (the closed-loop row: alternating rounds like every case, with the CPU h2load itself
//!   spent per request and in all), against HAProxy without splice: p50/p99/p99.9 from
//!   h2load's per-request log, leaving out the first second after h2load's connections arrive. Closed-loop wrk slows its requests down when
//!   answers are late, which hides queueing; a fixed rate does not, as long as each connection
//!   is idle between its requests: HTTP/1 sends a connection's next request only after its
//!   answer, so the load has a connection per 200 req/s (a request due every 5 ms or more),
//!   and a proxy that answers fewer requests than offered is named in a note.
//!
//! `ZCIO_BENCH_ONLY=substring` runs only the cases whose name contains it (e.g. `req/resp`,
//! `veth`, `vs nginx`). `ZCIO_BENCH_PROXY_BIN=path` runs another build's `zcio` as the proxy
//! under test (the same cases and counters against that build: which commit moved a figure).

use crate::bench::{Better, Ctx, MetricDef, Sample, Suite};
use anyhow::{anyhow, bail, Context, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zcio_testnet::tempdir::TempDir;
use zcio_testnet::Netns;

/// The suite.
pub struct ProxySuite;

const BULK: &[MetricDef] = &[
    MetricDef::new("throughput", "Gbit/s", Better::Higher),
    MetricDef::new("proxy_cpu_per_gb", "s/GB", Better::Lower),
    MetricDef::new("syscalls_per_mb", "entries/MB", Better::Lower),
];

const RR: &[MetricDef] = &[
    MetricDef::new("req_per_s", "req/s", Better::Higher),
    MetricDef::new("p50_latency", "ms", Better::Lower),
    MetricDef::new("p99_latency", "ms", Better::Lower),
    MetricDef::new("p999_latency", "ms", Better::Lower),
    MetricDef::new("proxy_cpu_per_req", "us", Better::Lower),
];

/// h2load's rows (closed loop: its maximum; open loop), with what h2load itself spent: its
/// one thread is a load generator that can run out of CPU before the proxy does (`h2load_busy`
/// near 1 core), and then the proxy that costs it less per request answers more.
const OPEN: &[MetricDef] = &[
    MetricDef::new("req_per_s", "req/s", Better::Higher),
    MetricDef::new("p50_latency", "ms", Better::Lower),
    MetricDef::new("p99_latency", "ms", Better::Lower),
    MetricDef::new("p999_latency", "ms", Better::Lower),
    MetricDef::new("proxy_cpu_per_req", "us", Better::Lower),
    MetricDef::new("h2load_cpu_per_req", "us", Better::Lower),
    MetricDef::new("h2load_busy", "cores", Better::Lower),
];

const CONNS: usize = 4;

/// Open loop: at most this many requests per second per connection. HTTP/1 sends a
/// connection's next request only after its answer, so a connection whose answers take longer
/// than its period paces itself like wrk's closed loop; at 200 req/s a request is due every
/// 5 ms, above the p99 of these rows at 90 % of the maximum on the idle host.
const OPEN_CONN_RATE: u32 = 200;

/// Open loop: the seconds after h2load's connections arrive that are not measured (the
/// arrival itself is the cold rows' subject).
const OPEN_SETTLE_S: u64 = 1;

/// Connections for an open-loop run at `rate` req/s: one per [`OPEN_CONN_RATE`] req/s, at
/// least 100, at most 1,000 (what the nginx behind the proxies and wrk's 1,000-connection
/// rows are set up for).
fn open_conns(rate: f64) -> usize {
    ((rate / f64::from(OPEN_CONN_RATE)).ceil() as usize).clamp(100, 1000)
}

/// Parses h2load's per-request log (`--log-file`: start time in µs since the epoch, status,
/// duration in µs, tab-separated) into the durations of the requests started
/// [`OPEN_SETTLE_S`] or more after the first one, and the number of requests that failed
/// (any status but 200, at any time).
fn open_log(log: &str) -> Result<(Vec<f64>, u64)> {
    let mut rows = Vec::new();
    let mut failed = 0u64;
    for l in log.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = l.split('\t').collect();
        let start = f.first().and_then(|t| t.parse::<u64>().ok());
        let dur = f.get(2).and_then(|d| d.parse::<f64>().ok());
        match (start, f.get(1), dur) {
            (Some(t), Some(&"200"), Some(d)) => rows.push((t, d)),
            (Some(_), Some(_), Some(_)) => failed += 1,
            _ => bail!("h2load log line not understood: {l:?}"),
        }
    }
    let first = rows.iter().map(|r| r.0).min().unwrap_or(0);
    let from = first + OPEN_SETTLE_S * 1_000_000;
    Ok((
        rows.into_iter()
            .filter(|r| r.0 >= from)
            .map(|r| r.1)
            .collect(),
        failed,
    ))
}

/// A proxy under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    HaproxySplice,
    HaproxyCopy,
    NginxStream,
    Zcio,
}

impl Kind {
    fn short(self) -> &'static str {
        match self {
            Kind::HaproxySplice => "haproxy splice",
            Kind::HaproxyCopy => "haproxy no-splice",
            Kind::NginxStream => "nginx stream",
            Kind::Zcio => "zcio",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Kind::HaproxySplice => "HAProxy mode tcp, splice on",
            Kind::HaproxyCopy => "HAProxy mode tcp, splice off",
            Kind::NginxStream => "nginx stream",
            Kind::Zcio => "zcio proxy (auto)",
        }
    }
}

impl Suite for ProxySuite {
    fn name(&self) -> &'static str {
        "proxy"
    }
    fn about(&self) -> &'static str {
        "TCP proxy: zcio proxy (bufring receive + SEND_ZC from the same buffers, one ring) vs HAProxy mode tcp (splice on/off) and nginx stream; bulk on loopback and over veth, 1 KiB request/response with wrk"
    }
    fn chart_metric(&self) -> &'static str {
        "proxy_cpu_per_gb"
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        for (tool, pkg) in [
            ("haproxy", "haproxy"),
            ("nginx", "nginx"),
            ("wrk", "wrk"),
            ("perf", "linux-perf"),
        ] {
            if which(tool).is_none() {
                return Err(ctx.skip(format!("{tool} not installed ({pkg}; scripts/deps)")));
            }
        }
        if !Path::new(STREAM_MODULE).exists() {
            return Err(ctx.skip(format!(
                "{STREAM_MODULE} missing (libnginx-mod-stream; scripts/deps)"
            )));
        }
        let dir = TempDir::new("pxbench").context("temp dir")?;
        let secs = ctx.pick(1.0, 5.0);
        ctx.note(
            "copies on these paths: every local delivery copies (loopback rule). zcio: the \
             kernel copies each byte into a provided buffer on receive, then SEND_ZC pins that \
             buffer and the delivery to the local receiver copies it (skb_orphan_frags_rx: \
             COPIED 1.0 below); HAProxy without splice and nginx: recv copy + send copy; \
             HAProxy with splice moves page references socket -> pipe -> socket, and spliced \
             pages are not user zero-copy frags, so loopback delivery does not copy them: \
             splice makes no copy on this path",
        );
        ctx.note(
            "kernel entries: perf stat -e raw_syscalls:sys_enter -p PID (all threads of the \
             proxy process, io_uring_enter counted as one entry); CPU: utime+stime of \
             /proc/PID/stat (10 ms ticks); one thread/worker per proxy",
        );
        let baselines = [Kind::HaproxySplice, Kind::HaproxyCopy, Kind::NginxStream];
        // Loopback bulk.
        let lo = Net::loopback();
        for b in baselines {
            let case = format!("bulk loopback, {CONNS} conns, vs {}", b.short());
            compare_bulk(ctx, &case, b, &lo, &dir, secs)?;
        }
        // Across test hosts: client and server in A, the proxy in B.
        let veth_wanted = baselines
            .iter()
            .any(|b| super::tx::wanted(&veth_case(b.short())));
        match zcio_testnet::check_privileges() {
            Ok(()) if !veth_wanted => {}
            Ok(()) => {
                let pair = zcio_testnet::Pair::new("pxb").context("test hosts")?;
                let veth = Net {
                    client: Some(&pair.a),
                    proxy: Some(&pair.b),
                    proxy_ip: pair.b4.into(),
                    server_ip: pair.a4.into(),
                };
                for b in baselines {
                    compare_bulk(ctx, &veth_case(b.short()), b, &veth, &dir, secs)?;
                }
            }
            Err(e) => ctx.note(format!("veth case not run: {e}")),
        }
        // Request/response to nginx: cold (a fresh proxy's first run) and warm (after a
        // warm-up on the running proxy), then the warm sweep.
        let rr_case = |b: Kind, warm: bool, conns: usize| {
            format!(
                "1 KiB req/resp {}, wrk {conns} conns, vs {}",
                if warm {
                    "warm (after 2 s)"
                } else {
                    "cold (fresh proxy)"
                },
                b.short()
            )
        };
        let mut cases: Vec<(Kind, bool, usize)> = Vec::new();
        for warm in [false, true] {
            cases.extend(baselines.iter().map(|&b| (b, warm, 100)));
        }
        // --full: the warm sweep, and 1,000 connections arriving at a fresh proxy at once.
        let full: &[(Kind, bool, usize)] = &[
            (Kind::HaproxyCopy, true, 1),
            (Kind::HaproxyCopy, true, 10),
            (Kind::HaproxyCopy, true, 1000),
            (Kind::HaproxyCopy, false, 1000),
        ];
        cases.extend_from_slice(ctx.pick(&[][..], full));
        cases.retain(|&(b, w, n)| super::tx::wanted(&rr_case(b, w, n)));
        if cases.is_empty() {
            return Ok(());
        }
        let web = Web::start(&dir)?;
        std::fs::write(dir.join("pct.lua"), WRK_PCT)?;
        // The warm 100-connection rates of the case against HAProxy without splice: the
        // slowest proxy's maximum sets the open-loop rates below.
        let warm_rates = std::cell::RefCell::new((Vec::new(), Vec::new()));
        for (b, warm, conns) in cases {
            let run = Rr {
                web: &web,
                dir: &dir,
                secs,
                conns,
                warm,
            };
            let keep = warm && conns == 100 && b == Kind::HaproxyCopy;
            ctx.compare(
                &rr_case(b, warm, conns),
                (b.label(), Kind::Zcio.label()),
                RR,
                || {
                    let s = run.run(b)?;
                    if keep {
                        warm_rates
                            .borrow_mut()
                            .0
                            .extend(s.values.get("req_per_s").copied());
                    }
                    Ok(s)
                },
                || {
                    let s = run.run(Kind::Zcio)?;
                    if keep {
                        warm_rates
                            .borrow_mut()
                            .1
                            .extend(s.values.get("req_per_s").copied());
                    }
                    Ok(s)
                },
            )?;
        }
        // Open loop: requests at a fixed rate whatever the answers do (h2load --rps), so a
        // slow answer does not slow the load down as wrk's closed loop does.
        let (a, z) = warm_rates.into_inner();
        let open_case = |pct: u32| {
            format!("1 KiB req/resp open loop at {pct}% of the slowest max, h2load, a conn per {OPEN_CONN_RATE} req/s, vs haproxy no-splice")
        };
        let fracs: &[u32] = ctx.pick(&[90][..], &[50, 90][..]);
        if which("h2load").is_none() {
            ctx.note("open-loop rows not run: h2load not installed (nghttp2-client; scripts/deps)");
        } else if a.is_empty() || z.is_empty() {
            ctx.note(
                "open-loop rows not run: the warm case against HAProxy without splice was not",
            );
        } else {
            // The connections: one per OPEN_CONN_RATE req/s at 90 % of wrk's slowest
            // maximum. The rates: fractions of h2load's own closed-loop maximum from those
            // connections, the slower proxy's (h2load costs more per request than wrk, and
            // more connections batch less: wrk's maximum is out of reach for it).
            let wrk_slowest = super::super::stats(&a).0.min(super::super::stats(&z).0);
            let run = Rr {
                web: &web,
                dir: &dir,
                secs: secs.max(2.0),
                conns: open_conns(wrk_slowest * 0.9),
                warm: true,
            };
            let wanted: Vec<u32> = fracs
                .iter()
                .copied()
                .filter(|&p| super::tx::wanted(&open_case(p)))
                .collect();
            let closed_case = format!(
                "1 KiB req/resp closed loop (the open loop's maximum), h2load {} conns, vs \
                 haproxy no-splice",
                run.conns
            );
            if !wanted.is_empty() || super::tx::wanted(&closed_case) {
                // h2load's closed-loop maximum through each proxy: alternating rounds, as
                // every case (one run each was as noisy as one round), the medians set the
                // rates. A row of its own when wanted; measured without one for the open-loop
                // rows alone.
                let maxima = std::cell::RefCell::new((Vec::new(), Vec::new()));
                let closed = |kind: Kind| {
                    let s = run.h2load(kind, None)?;
                    let mut m = maxima.borrow_mut();
                    let side = if kind == Kind::Zcio {
                        &mut m.1
                    } else {
                        &mut m.0
                    };
                    side.extend(s.values.get("req_per_s").copied());
                    Ok::<_, anyhow::Error>(s)
                };
                ctx.compare(
                    &closed_case,
                    (Kind::HaproxyCopy.label(), Kind::Zcio.label()),
                    OPEN,
                    || closed(Kind::HaproxyCopy),
                    || closed(Kind::Zcio),
                )?;
                if maxima.borrow().0.is_empty() {
                    for round in 0..ctx.rounds() {
                        let order = if round % 2 == 0 {
                            [Kind::HaproxyCopy, Kind::Zcio]
                        } else {
                            [Kind::Zcio, Kind::HaproxyCopy]
                        };
                        for kind in order {
                            closed(kind)?;
                        }
                    }
                }
                let (ma, mz) = maxima.into_inner();
                let said = format!(
                    "{} {}, {} {}",
                    Kind::HaproxyCopy.label(),
                    median_range(&ma),
                    Kind::Zcio.label(),
                    median_range(&mz)
                );
                for pct in wanted {
                    let case = open_case(pct);
                    let Some(rate) = open_rate(&ma, &mz, pct) else {
                        continue;
                    };
                    let conns = run.conns;
                    ctx.compare(
                        &case,
                        (Kind::HaproxyCopy.label(), Kind::Zcio.label()),
                        OPEN,
                        || run.h2load(Kind::HaproxyCopy, Some(rate)),
                        || run.h2load(Kind::Zcio, Some(rate)),
                    )?;
                    ctx.note(format!(
                        "{case}: {rate:.0} req/s offered in all from {conns} connections ({:.0} \
                         each: a connection's next request is due {:.1} ms after its last), \
                         {pct} % of h2load's closed-loop maximum from those connections, the \
                         slower proxy's median of {} alternating runs (req/s, median and \
                         range: {}); after a 2 s wrk warm-up, leaving out the \
                         first {OPEN_SETTLE_S} s after h2load's connections arrive; latencies \
                         from h2load's per-request log, from each request's start",
                        rate / conns as f64,
                        1000.0 * conns as f64 / rate,
                        ma.len().min(mz.len()),
                        said
                    ));
                }
            }
        }
        ctx.note(
            "req/resp: cold = wrk's first run on a proxy started just before it (100 \
             connections arrive at once); warm = a 2 s wrk run on the same proxy first, not \
             measured. p50/p99/p99.9 are wrk's (closed loop: each connection sends its next \
             request after the answer)",
        );
        Ok(())
    }
}

/// The rate of an open-loop row: `pct` % of the slower proxy's closed-loop maximum, each
/// proxy's the median of its alternating runs (`None` without runs of both).
fn open_rate(baseline: &[f64], zcio: &[f64], pct: u32) -> Option<f64> {
    if baseline.is_empty() || zcio.is_empty() {
        return None;
    }
    let slower = super::super::stats(baseline)
        .0
        .min(super::super::stats(zcio).0);
    Some(slower * f64::from(pct) / 100.0)
}

/// `median (min-max)` of runs, for a note.
fn median_range(v: &[f64]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    let (m, lo, hi) = super::super::stats(v);
    format!("{m:.0} ({lo:.0}-{hi:.0})")
}

/// The name of a bulk case across test hosts.
/// One bulk case (when wanted): `baseline` against zcio proxy on `net`.
fn compare_bulk(
    ctx: &mut Ctx,
    case: &str,
    baseline: Kind,
    net: &Net,
    dir: &TempDir,
    secs: f64,
) -> Result<()> {
    if !super::tx::wanted(case) {
        return Ok(());
    }
    ctx.compare(
        case,
        (baseline.label(), Kind::Zcio.label()),
        BULK,
        || bulk(baseline, net, dir, secs),
        || bulk(Kind::Zcio, net, dir, secs),
    )
}

fn veth_case(baseline: &str) -> String {
    format!("bulk veth A->B->A, {CONNS} conns, vs {baseline}")
}

const STREAM_MODULE: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(cmd))
        .find(|p| p.is_file())
}

/// Where the client, proxy and server run.
struct Net<'a> {
    client: Option<&'a Netns>,
    proxy: Option<&'a Netns>,
    proxy_ip: std::net::IpAddr,
    server_ip: std::net::IpAddr,
}

impl Net<'static> {
    fn loopback() -> Self {
        let lo: std::net::IpAddr = std::net::Ipv4Addr::LOCALHOST.into();
        Self {
            client: None,
            proxy: None,
            proxy_ip: lo,
            server_ip: lo,
        }
    }
}

fn spawn_in<T: Send + 'static>(
    ns: Option<&Netns>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<std::thread::JoinHandle<T>> {
    Ok(match ns {
        Some(ns) => ns.spawn(f).context("thread in the test host")?,
        None => std::thread::spawn(f),
    })
}

/// A free port on `ip` (bound and released; the proxies bind it right after).
fn free_port(ns: Option<&Netns>, ip: std::net::IpAddr) -> Result<u16> {
    spawn_in(ns, move || {
        TcpListener::bind((ip, 0)).and_then(|l| l.local_addr().map(|a| a.port()))
    })?
    .join()
    .map_err(|_| anyhow!("port thread panicked"))?
    .context("finding a free port")
}

/// `zcio proxy`'s drain bound in the bench (`--drain-timeout`, seconds).
const DRAIN_SECS: u64 = 1;

/// How long a proxy may take to exit after SIGTERM before it is killed: zcio's drain bound,
/// the second its drain then gives the kernel to hand back what it holds
/// (`Proxy::drain`'s flush), and a margin for the log and the exit itself on a loaded machine.
const STOP_WAIT: Duration = Duration::from_secs(DRAIN_SECS + 1 + 3);

/// A child process whose stdout and stderr are read while it runs: a pipe nobody reads holds
/// 64 KiB, and a proxy that logs more (a line per reset pair: 1,000 connections cut at the
/// end of a wrk run) would block in its log write with the pipe full, stop forwarding and
/// never exit.
struct Piped {
    child: Child,
    /// The readers of stdout and stderr.
    out: Option<(Reader, Reader)>,
}

/// A thread reading one pipe to its end.
type Reader = std::thread::JoinHandle<Vec<u8>>;

/// How a [`Piped`] child stopped, and what it wrote.
struct Stopped {
    /// It exited within the wait (else it was killed).
    exited: bool,
    stdout: String,
    stderr: String,
}

impl Piped {
    /// Starts `c` with piped stdout and stderr, each read by a thread of its own.
    fn spawn(c: &mut Command) -> std::io::Result<Self> {
        let mut child = c
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        fn read_all(r: Option<impl Read + Send + 'static>) -> Reader {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut v);
                }
                v
            })
        }
        let out = Some((read_all(child.stdout.take()), read_all(child.stderr.take())));
        Ok(Self { child, out })
    }

    /// Everything it wrote (waits for its end of the pipes: call once it has exited).
    fn output(&mut self) -> (String, String) {
        let Some((o, e)) = self.out.take() else {
            return Default::default();
        };
        let text = |h: Reader| String::from_utf8_lossy(&h.join().unwrap_or_default()).into_owned();
        (text(o), text(e))
    }

    /// SIGTERM, then SIGKILL if it has not exited within `wait`.
    fn stop(&mut self, wait: Duration) -> Stopped {
        signal(self.child.id(), libc::SIGTERM);
        let t0 = Instant::now();
        let mut exited = false;
        while t0.elapsed() < wait {
            if let Ok(Some(_)) = self.child.try_wait() {
                exited = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if !exited {
            signal(self.child.id(), libc::SIGKILL);
        }
        let _ = self.child.wait();
        let (stdout, stderr) = self.output();
        Stopped {
            exited,
            stdout,
            stderr,
        }
    }
}

impl Drop for Piped {
    fn drop(&mut self) {
        // A run that failed half-way leaves no process behind.
        if let Ok(None) = self.child.try_wait() {
            signal(self.child.id(), libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// A running proxy process.
struct Proc {
    p: Piped,
    kind: Kind,
}

impl Proc {
    fn start(
        kind: Kind,
        ns: Option<&Netns>,
        listen: SocketAddr,
        to: SocketAddr,
        dir: &TempDir,
    ) -> Result<Self> {
        let cmd = |prog: &Path| match ns {
            Some(ns) => ns.command(&prog.to_string_lossy()),
            None => Command::new(prog),
        };
        let mut c = match kind {
            Kind::Zcio => {
                // ZCIO_BENCH_PROXY_BIN: another build's `zcio` as the proxy under test (this
                // suite's cases and counters against that build, e.g. to find which commit
                // moved a figure).
                let exe = match std::env::var_os("ZCIO_BENCH_PROXY_BIN") {
                    Some(p) if !p.is_empty() => PathBuf::from(p),
                    _ => std::env::current_exe().context("the zcio binary")?,
                };
                let mut c = cmd(&exe);
                c.args(["proxy", "--listen", &listen.to_string(), "--to"])
                    .arg(to.to_string())
                    .args(["--threads", "1", "--stats-interval", "0", "--json"])
                    .args(["--idle-timeout", "0", "--drain-timeout"])
                    .arg(DRAIN_SECS.to_string());
                c
            }
            Kind::HaproxySplice | Kind::HaproxyCopy => {
                let splice = if kind == Kind::HaproxySplice {
                    "  option splice-request\n  option splice-response\n"
                } else {
                    ""
                };
                let path = dir.join(format!("haproxy-{}.cfg", listen.port()));
                std::fs::write(
                    &path,
                    format!(
                        "global\n  nbthread 1\n  maxconn 4096\n\ndefaults\n  mode tcp\n  \
                         timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n\
                         {splice}\nfrontend f\n  bind {listen}\n  default_backend b\n\n\
                         backend b\n  server s1 {to}\n"
                    ),
                )?;
                let mut c = cmd(&which("haproxy").expect("checked"));
                c.arg("-db").arg("-f").arg(&path);
                c
            }
            Kind::NginxStream => {
                let prefix = dir.join(format!("nginx-stream-{}", listen.port()));
                std::fs::create_dir_all(prefix.join("logs"))?;
                let conf = prefix.join("nginx.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "load_module {STREAM_MODULE};\nmaster_process off;\ndaemon off;\n\
                         worker_processes 1;\nworker_rlimit_nofile 8192;\nerror_log {}/logs/error.log;\npid {}/nginx.pid;\n\
                         events {{ worker_connections 4096; }}\n\
                         stream {{ server {{ listen {listen}; proxy_pass {to}; }} }}\n",
                        prefix.display(),
                        prefix.display()
                    ),
                )?;
                let mut c = cmd(&which("nginx").expect("checked"));
                c.arg("-p").arg(&prefix).arg("-c").arg(&conf);
                c
            }
        };
        let mut p = Self {
            p: Piped::spawn(&mut c).with_context(|| format!("starting {}", kind.label()))?,
            kind,
        };
        // Ready when it accepts.
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            let ok = spawn_in(ns, move || {
                TcpStream::connect_timeout(&listen, Duration::from_millis(200)).is_ok()
            })?
            .join()
            .unwrap_or(false);
            if ok {
                break;
            }
            if let Ok(Some(st)) = p.p.child.try_wait() {
                let (_, err) = p.p.output();
                bail!("{} exited at start ({st}): {err}", kind.label());
            }
            if Instant::now() > end {
                bail!("{} did not accept on {listen} within 5 s", kind.label());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(p)
    }

    fn pid(&self) -> u32 {
        self.p.child.id()
    }

    /// utime + stime of the whole process (all threads), seconds.
    fn cpu(&self) -> f64 {
        cpu_of(self.pid())
    }

    /// Stops it (SIGTERM, then SIGKILL after [`STOP_WAIT`]); for zcio, returns its final
    /// stats line.
    fn stop(mut self) -> Result<Option<serde_json::Value>> {
        let st = self.p.stop(STOP_WAIT);
        if self.kind != Kind::Zcio {
            return Ok(None);
        }
        stats_of(&st).map(Some)
    }
}

/// utime + stime of process `pid` (all threads; an exited child not yet reaped too),
/// seconds; 0 when it cannot be read.
fn cpu_of(pid: u32) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some(i) = s.rfind(')') else { return 0.0 };
    let f: Vec<&str> = s[i + 2..].split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

/// zcio proxy's final stats line (`--json`: the last line that is an object).
fn stats_of(st: &Stopped) -> Result<serde_json::Value> {
    let last = st
        .stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| {
            let killed = if st.exited {
                String::new()
            } else {
                format!(" (killed: still running {STOP_WAIT:?} after SIGTERM)")
            };
            anyhow!(
                "zcio proxy printed no stats{killed}: {} {}",
                st.stdout,
                st.stderr
            )
        })?;
    Ok(serde_json::from_str(last)?)
}

/// Signals a process through kill(1) (the CLI has no unsafe code).
fn signal(pid: u32, sig: i32) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

/// `perf stat -e raw_syscalls:sys_enter -p PID` for the duration of a run.
struct SyscallCount {
    child: Child,
    out: PathBuf,
}

impl SyscallCount {
    fn start(pid: u32, dir: &TempDir) -> Result<Self> {
        let out = dir.join(format!("perf-{pid}.txt"));
        let child = Command::new(which("perf").expect("checked"))
            .args(["stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting perf stat")?;
        // perf attaches before it counts: give it a moment.
        std::thread::sleep(Duration::from_millis(150));
        Ok(Self { child, out })
    }

    fn stop(mut self) -> Result<f64> {
        signal(self.child.id(), libc::SIGINT);
        let _ = self.child.wait();
        let out = std::mem::take(&mut self.out);
        let text = std::fs::read_to_string(&out).context("perf stat output")?;
        text.lines()
            .find(|l| l.contains("raw_syscalls:sys_enter"))
            .and_then(|l| l.split(',').next())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .ok_or_else(|| anyhow!("perf stat counted nothing: {text}"))
    }
}

impl Drop for SyscallCount {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            signal(self.child.id(), libc::SIGINT);
            let _ = self.child.wait();
        }
    }
}

/// Bulk: CONNS clients stream into a sink server through the proxy for `secs`.
fn bulk(kind: Kind, net: &Net, dir: &TempDir, secs: f64) -> Result<Sample> {
    let server_ip = net.server_ip;
    let listener = spawn_in(net.client, move || TcpListener::bind((server_ip, 0)))?
        .join()
        .map_err(|_| anyhow!("bind thread panicked"))??;
    let server_addr = listener.local_addr()?;
    // The sink takes every connection the proxy makes (the readiness probe's too) until the
    // clients are done, and counts what arrives.
    let clients_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done2 = clients_done.clone();
    let sink = spawn_in(
        net.client,
        move || -> std::io::Result<(u64, Option<Instant>)> {
            use std::sync::atomic::Ordering;
            listener.set_nonblocking(true)?;
            let mut readers = Vec::new();
            let mut quiet_since: Option<Instant> = None;
            loop {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false)?;
                        readers.push(std::thread::spawn(move || {
                            let mut buf = vec![0u8; 256 << 10];
                            let mut n = 0u64;
                            loop {
                                match s.read(&mut buf) {
                                    Ok(0) | Err(_) => return (n, (n > 0).then(Instant::now)),
                                    Ok(k) => n += k as u64,
                                }
                            }
                        }));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if done2.load(Ordering::Relaxed) {
                            let t = *quiet_since.get_or_insert_with(Instant::now);
                            if t.elapsed() > Duration::from_millis(200) {
                                break;
                            }
                        }
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => return Err(e),
                }
            }
            let mut total = (0, None);
            for r in readers {
                let (n, end) = r.join().unwrap_or((0, None));
                total.0 += n;
                total.1 = total.1.max(end);
            }
            Ok(total)
        },
    )?;
    let listen = SocketAddr::new(net.proxy_ip, free_port(net.proxy, net.proxy_ip)?);
    let p = Proc::start(kind, net.proxy, listen, server_addr, dir)?;
    let count = SyscallCount::start(p.pid(), dir)?;
    let cpu0 = p.cpu();
    let t0 = Instant::now();
    let dur = Duration::from_secs_f64(secs);
    let clients: Vec<_> = (0..CONNS)
        .map(|_| {
            spawn_in(net.client, move || -> std::io::Result<()> {
                let mut s = TcpStream::connect(listen)?;
                let buf = vec![0x5au8; 256 << 10];
                let end = Instant::now() + dur;
                while Instant::now() < end {
                    s.write_all(&buf)?;
                }
                s.shutdown(std::net::Shutdown::Write)
            })
        })
        .collect::<Result<_>>()?;
    let mut failed = None;
    for c in clients {
        if let Err(e) = c.join().map_err(|_| anyhow!("client panicked"))? {
            failed.get_or_insert(e);
        }
    }
    clients_done.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(e) = failed {
        let _ = sink.join();
        let _ = count.stop();
        let _ = p.stop();
        bail!("bulk client through {}: {e}", kind.label());
    }
    let (bytes, last) = sink
        .join()
        .map_err(|_| anyhow!("sink panicked"))?
        .context("sink server")?;
    // Until the last byte arrived (the sink's linger for late connections is not counted).
    let wall = last.map_or_else(|| t0.elapsed(), |l| l - t0).as_secs_f64();
    let cpu = p.cpu() - cpu0;
    let calls = count.stop()?;
    let stats = p.stop()?;
    let mut s = Sample::default();
    s.set("throughput", crate::bench::measure::gbit_per_s(bytes, wall));
    s.set(
        "proxy_cpu_per_gb",
        crate::bench::measure::cpu_s_per_gb(cpu, bytes),
    );
    s.set("syscalls_per_mb", calls / (bytes as f64 / 1e6).max(1e-9));
    if let Some(v) = stats {
        s.note(zcio_note(&v));
    }
    Ok(s)
}

fn zcio_note(v: &serde_json::Value) -> String {
    // The loop's own profile: per received chunk, the time from the wait that harvested it
    // to the enter that issues its send (log2 buckets), the largest harvest, waits.
    let stats: Option<zcio::proxy::ProxyStats> = serde_json::from_value(v.clone()).ok();
    let profile = stats.map_or_else(String::new, |s| {
        let q = |x: f64| {
            s.hold_us_quantile(x)
                .map_or("-".into(), |u| format!("<{u}"))
        };
        let h = |x: &zcio::proxy::UsLog2| x.quantile(0.99).map_or("-".into(), |u| format!("<{u}"));
        format!(
            "; loop: {} turns, {} chunks, harvest max {}, chunk harvest->send issue p50 {} \
             p99 {} us, chunk received->send completed p99 {} us (first two per direction \
             of a pair: p99 {} us), accept->first byte forwarded p99 {} us, waits capped at \
             5 ms that timed out {}, waits counting their sends that lasted their timeout \
             {}, batched (bulk) waits {}, bytes copied to the heap while \
             the receive ring was low {}",
            s.turns,
            s.chunks,
            s.turn_chunks_max,
            q(0.5),
            q(0.99),
            h(&s.forward_us),
            h(&s.forward_new_us),
            h(&s.first_forward_us),
            s.capped_waits,
            s.counted_timeouts,
            s.bulk_waits,
            s.spilled_bytes
        )
    });
    // The library's own counts, read field by field so that an older build's stats line
    // (ZCIO_BENCH_PROXY_BIN) gives them too: its kernel entries beside perf's count of every
    // syscall, and how much each turn harvested.
    let n = |k: &str| v[k].as_f64().unwrap_or(0.0);
    let mb = ((n("bytes_up") + n("bytes_down")) / 1e6).max(1e-9);
    let counts = format!(
        "; library counts: io_uring_enter {:.2}/MB, syscalls {:.2}/MB, {:.1} chunks per \
         turn, receive ring dry {} times",
        n("ring_enters") / mb,
        n("syscalls") / mb,
        n("chunks") / n("turns").max(1.0),
        n("rx_out_of_buffers"),
    );
    format!(
        "zcio proxy: rx {}, tx {}, one ring per thread {}, COPIED {}{counts}{profile}",
        v["rx_path"].as_str().unwrap_or("?"),
        v["tx_path"].as_str().unwrap_or("?"),
        v["one_ring"],
        v["copied_fraction"]
            .as_f64()
            .map_or_else(|| "-".into(), |c| format!("{c:.2}")),
    )
}

/// nginx serving a 1 KiB file over HTTP (the upstream of the request/response case).
struct Web {
    child: Child,
    addr: SocketAddr,
}

impl Web {
    fn start(dir: &TempDir) -> Result<Self> {
        let port = free_port(None, std::net::Ipv4Addr::LOCALHOST.into())?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let prefix = dir.join("nginx-web");
        std::fs::create_dir_all(prefix.join("logs"))?;
        std::fs::create_dir_all(prefix.join("html"))?;
        std::fs::write(prefix.join("html/file"), vec![b'x'; 1024])?;
        let conf = prefix.join("nginx.conf");
        std::fs::write(
            &conf,
            format!(
                "master_process off;\ndaemon off;\nworker_processes 1;\n\
                 worker_rlimit_nofile 8192;\nerror_log {p}/logs/error.log;\npid {p}/nginx.pid;\n\
                 events {{ worker_connections 4096; }}\n\
                 http {{ access_log off; keepalive_requests 1000000; \
                 server {{ listen {addr}; root {p}/html; }} }}\n",
                p = prefix.display()
            ),
        )?;
        let child = Command::new(which("nginx").expect("checked"))
            .arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting nginx")?;
        let end = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(addr).is_err() {
            if Instant::now() > end {
                bail!("nginx did not start on {addr}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self { child, addr })
    }
}

impl Drop for Web {
    fn drop(&mut self) {
        signal(self.child.id(), libc::SIGTERM);
        let _ = self.child.wait();
    }
}

/// wrk's `done` hook: its own latency percentiles (µs) on one line.
const WRK_PCT: &str = "done = function(summary, latency, requests)\n  \
    io.write(string.format(\"PCT p50=%.0f p99=%.0f p999=%.0f\\n\", \
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))\nend\n";

/// One request/response run's set-up.
struct Rr<'a> {
    web: &'a Web,
    dir: &'a TempDir,
    secs: f64,
    conns: usize,
    /// Run wrk for 2 s first, unmeasured.
    warm: bool,
}

impl Rr<'_> {
    fn wrk(&self, listen: SocketAddr, secs: f64) -> Result<String> {
        let out = Command::new(which("wrk").expect("checked"))
            .arg(format!("-t{}", self.conns.min(2)))
            .arg(format!("-c{}", self.conns))
            .args(["--latency", "--timeout", "5s", "-s"])
            .arg(self.dir.join("pct.lua"))
            .arg(format!("-d{}s", secs.ceil() as u64))
            .arg(format!("http://{listen}/file"))
            .output()
            .context("running wrk")?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if !out.status.success() || text.contains("Non-2xx") || text.contains("Socket errors") {
            bail!("wrk reported errors: {text}");
        }
        Ok(text)
    }

    /// A warm proxy, then h2load from `self.conns` connections for `secs` after
    /// [`OPEN_SETTLE_S`]: with a `rate`, that many requests per second in all whatever the
    /// answers do (`--rps`, the open loop); without, each connection's next request as soon
    /// as its answer is in (the closed loop: h2load's maximum).
    fn h2load(&self, kind: Kind, rate: Option<f64>) -> Result<Sample> {
        let lo = std::net::Ipv4Addr::LOCALHOST.into();
        let listen = SocketAddr::new(lo, free_port(None, lo)?);
        let p = Proc::start(kind, None, listen, self.web.addr, self.dir)?;
        self.wrk(listen, 2.0)
            .with_context(|| format!("warm-up through {}", kind.label()))?;
        let log = self.dir.join(format!("h2load-{}.log", listen.port()));
        let mut cmd = Command::new(which("h2load").expect("checked"));
        cmd.args(["--h1", "-t", "1"])
            .arg(format!("-c{}", self.conns));
        if let Some(rate) = rate {
            cmd.arg(format!("--rps={:.1}", (rate / self.conns as f64).max(1.0)));
        }
        cmd.arg(format!("-D{}", self.secs.ceil() as u64 + OPEN_SETTLE_S))
            .arg(format!("--log-file={}", log.display()))
            .arg(format!("http://{listen}/file"));
        let cpu0 = p.cpu();
        let t0 = Instant::now();
        let mut h = Piped::spawn(&mut cmd).context("running h2load")?;
        // Its pipes end when it exits; its CPU time is read before it is reaped.
        let (text, err) = h.output();
        let (h2load_cpu, wall) = (cpu_of(h.child.id()), t0.elapsed().as_secs_f64());
        let status = h.child.wait().context("h2load")?;
        let cpu = p.cpu() - cpu0;
        let stats = p.stop()?;
        if !status.success() {
            bail!("h2load through {}: {text} {err}", kind.label());
        }
        let log = std::fs::read_to_string(&log)?;
        let (mut us, failed) = open_log(&log)?;
        if failed > 0 || us.is_empty() {
            bail!(
                "h2load through {}: {failed} failed requests of {}: {text}",
                kind.label(),
                us.len() as u64 + failed
            );
        }
        us.sort_by(|x, y| x.total_cmp(y));
        let q =
            |q: f64| us[((us.len() as f64 * q).ceil() as usize).clamp(1, us.len()) - 1] / 1000.0;
        let mut s = Sample::default();
        let achieved = us.len() as f64 / self.secs.ceil();
        if let Some(rate) = rate {
            // A request that took longer than its connection's period held the next one back
            // (HTTP/1): that one's latency, counted from its actual start, is a lower bound.
            let period_us = 1e6 * self.conns as f64 / rate;
            let late = us.iter().filter(|&&d| d > period_us).count();
            if late > 0 {
                s.note(format!(
                    "{}: {late} of {} requests ({:.2} %) took longer than their connection's \
                     period of {:.1} ms and held its next request back: latencies above the \
                     period are lower bounds",
                    kind.label(),
                    us.len(),
                    100.0 * late as f64 / us.len() as f64,
                    period_us / 1000.0
                ));
            }
            if achieved < rate * 0.97 {
                s.note(format!(
                    "{} fell behind the offered rate: {achieved:.0} of {rate:.0} req/s \
                     answered in the measured seconds",
                    kind.label()
                ));
            }
        }
        // Per request over the whole h2load run (its settling second included).
        let reqs = log.lines().filter(|l| !l.trim().is_empty()).count() as f64;
        s.set("req_per_s", achieved)
            .set("p50_latency", q(0.5))
            .set("p99_latency", q(0.99))
            .set("p999_latency", q(0.999))
            .set("proxy_cpu_per_req", cpu / reqs.max(1.0) * 1e6)
            .set("h2load_cpu_per_req", h2load_cpu / reqs.max(1.0) * 1e6)
            .set("h2load_busy", h2load_cpu / wall.max(1e-9));
        if let Some(v) = stats {
            s.note(zcio_note(&v));
        }
        Ok(s)
    }

    fn run(&self, kind: Kind) -> Result<Sample> {
        let lo = std::net::Ipv4Addr::LOCALHOST.into();
        let listen = SocketAddr::new(lo, free_port(None, lo)?);
        let p = Proc::start(kind, None, listen, self.web.addr, self.dir)?;
        if self.warm {
            self.wrk(listen, 2.0)
                .with_context(|| format!("warm-up through {}", kind.label()))?;
        }
        let cpu0 = p.cpu();
        let text = self
            .wrk(listen, self.secs)
            .with_context(|| format!("through {}", kind.label()))?;
        let cpu = p.cpu() - cpu0;
        let stats = p.stop()?;
        let super::wrk::WrkOut { rps, reqs, .. } = super::wrk::parse(&text, self.secs)?;
        let pct = |k: &str| -> Result<f64> {
            let line = text
                .lines()
                .find(|l| l.starts_with("PCT "))
                .ok_or_else(|| anyhow!("wrk's percentile line missing: {text}"))?;
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(k)?.strip_prefix('=')?.parse::<f64>().ok())
                .map(|us| us / 1000.0)
                .ok_or_else(|| anyhow!("{k} missing: {line}"))
        };
        let mut s = Sample::default();
        s.set("req_per_s", rps)
            .set("p50_latency", pct("p50")?)
            .set("p99_latency", pct("p99")?)
            .set("p999_latency", pct("p999")?)
            .set("proxy_cpu_per_req", cpu / reqs.max(1.0) * 1e6);
        if let Some(v) = stats {
            s.note(zcio_note(&v));
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_loop_leaves_out_its_first_second_and_counts_every_failure() {
        // h2load 1.52's --log-file lines: start (µs since the epoch), status, duration (µs).
        let t0 = 1_795_867_801_000_000u64;
        let log = format!(
            "{}\t200\t900\n{}\t200\t5000\n{}\t502\t10\n{}\t200\t1200\n{}\t200\t800\n\n",
            t0 + 10,
            t0,
            t0 + 5,
            t0 + 1_000_000,
            t0 + 1_500_000,
        );
        let (us, failed) = open_log(&log).unwrap();
        assert_eq!(us, vec![1200.0, 800.0]);
        assert_eq!(failed, 1, "a failure in the settling second still counts");
        assert!(open_log("garbage\n").is_err());
        assert_eq!(open_log("").unwrap(), (vec![], 0));
    }

    #[test]
    fn open_loop_rates_follow_the_slower_proxys_median_not_one_run() {
        // One slow run of the faster proxy (as one h2load run through HAProxy of 36k among
        // runs of 45k) does not set the rate; the slower proxy's median does.
        let haproxy = [45_000.0, 36_000.0, 46_000.0];
        let zcio = [44_000.0, 43_000.0, 47_000.0, 40_000.0];
        assert_eq!(open_rate(&haproxy, &zcio, 90), Some(43_500.0 * 0.9));
        assert_eq!(open_rate(&haproxy, &zcio, 50), Some(43_500.0 * 0.5));
        assert_eq!(open_rate(&[40_000.0], &zcio, 100), Some(40_000.0));
        assert_eq!(open_rate(&[], &zcio, 90), None);
        assert_eq!(open_rate(&haproxy, &[], 90), None);
        assert_eq!(median_range(&haproxy), "45000 (36000-46000)");
        assert_eq!(median_range(&[]), "-");
    }

    #[test]
    fn open_loop_connections_give_each_one_a_request_per_5_ms_within_bounds() {
        assert_eq!(open_conns(45_000.0), 225);
        assert_eq!(open_conns(1_000.0), 100);
        assert_eq!(open_conns(500_000.0), 1000);
        assert_eq!(open_conns(45_001.0), 226);
    }

    /// A child that writes more than a pipe holds to stderr while it runs (as `zcio proxy`
    /// logs a line per reset pair) stops on SIGTERM within the wait and its last stdout line
    /// is there: with its pipes read only after the stop, its write blocked, SIGTERM's trap
    /// never ran and the stop killed it ("printed no stats").
    #[test]
    fn a_child_that_logs_more_than_a_pipe_holds_stops_with_its_stats() {
        let mut c = Command::new("sh");
        c.arg("-c").arg(
            "trap 'echo \"{\\\"done\\\": 1}\"; exit 0' TERM; \
             head -c 300000 /dev/zero | tr '\\0' x >&2; \
             while :; do sleep 0.05; done",
        );
        let mut p = Piped::spawn(&mut c).expect("sh");
        std::thread::sleep(Duration::from_millis(500));
        let st = p.stop(Duration::from_secs(3));
        assert!(st.exited, "killed after the wait: {}", st.stdout);
        assert_eq!(st.stderr.len(), 300_000);
        let v = stats_of(&st).expect("the last stdout line");
        assert_eq!(v["done"], 1);
    }
}

//! `zcio proxy`: a TCP proxy on one ring per thread (`zcio::proxy::Proxy`), forwarding received
//! buffers with zero-copy send. A thin wrapper: arguments, threads, signals (SIGTERM/SIGINT
//! drain, SIGHUP re-reads `--targets-file`), stats lines, the log, `--metrics`.

use crate::logline::{Level, Log, LogFormat};
use anyhow::{bail, Context, Result};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use zcio::proxy::{EndKind, Limits, Proxy, ProxyConfig, ProxyStats};
use zcio::rx::{RxConfig, RxMode, ZcrxTarget};
use zcio::tx::{SenderConfig, TxMode};

/// Options of `zcio proxy`.
#[derive(Debug, clap::Args)]
// A later option overrides an earlier one (a unit's defaults, then ZCIO_ARGS).
#[command(args_override_self = true)]
pub struct ProxyArgs {
    /// Address to accept clients on (`ADDR:PORT`).
    #[arg(long)]
    pub listen: SocketAddr,
    /// Target (`HOST:PORT`; host names are resolved at start and at each reload, every
    /// address of a name is a target); repeatable: connections go round-robin.
    #[arg(long = "to", required_unless_present = "targets_file")]
    pub to: Vec<String>,
    /// A file of targets, one `HOST:PORT` a line (`#` starts a comment), after any `--to`;
    /// SIGHUP re-reads it (and resolves every name again): new clients go to the new
    /// targets, open pairs keep theirs. A file that cannot be read or names no target is
    /// refused with an error in the log, and the targets stay as they were.
    #[arg(long, value_name = "PATH")]
    pub targets_file: Option<PathBuf>,
    /// Threads, each with its own ring accepting on the same listener.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Receive path: auto, zcrx (device-less when no --zcrx-queue), bufring, plain.
    #[arg(long, default_value = "auto")]
    pub rx: RxMode,
    /// NIC queue for zcrx (`IFACE:QUEUE`; the queue's flows must be steered to it).
    #[arg(long)]
    pub zcrx_queue: Option<String>,
    /// Send path: auto, uring-zc, uring-zc-fixed, uring-copy, msg-zc, copy.
    #[arg(long, default_value = "auto")]
    pub tx: TxMode,
    /// Pairs open at once per thread; more clients are closed at accept.
    #[arg(long, default_value_t = 10_000)]
    pub max_connections: usize,
    /// Bytes held per connection and direction before reading that side pauses (`512K`).
    #[arg(long, default_value = "512K", value_parser = crate::util::parse_size)]
    pub conn_buffer: usize,
    /// Receive buffers held per connection and direction before reading pauses.
    #[arg(long, default_value_t = 32)]
    pub conn_chunks: usize,
    /// Receive buffer size (`64K`).
    #[arg(long, default_value = "64K", value_parser = crate::util::parse_size)]
    pub buf_size: usize,
    /// Receive buffers per thread (a power of two).
    #[arg(long, default_value_t = 1024)]
    pub buffers: u16,
    /// Bytes of receive buffers kept in the ring at once (the rest wait in a stack; the
    /// rotation grows under sustained demand); 0 (default): every buffer in the ring, so many
    /// connections with small messages never find it empty.
    #[arg(long, default_value = "0", value_parser = crate::util::parse_size)]
    pub rx_rotation: usize,
    /// Seconds for an upstream connection to be established.
    #[arg(long, default_value_t = 5.0)]
    pub connect_timeout: f64,
    /// Seconds without any byte moved before a pair is closed (0: never).
    #[arg(long, default_value_t = 300.0)]
    pub idle_timeout: f64,
    /// Seconds SIGTERM/SIGINT waits for open pairs to end before resetting them.
    #[arg(long, default_value_t = 5.0)]
    pub drain_timeout: f64,
    /// Seconds between stats lines (0: none).
    #[arg(long, default_value_t = 1.0)]
    pub stats_interval: f64,
    /// Stats lines (and the final summary) as JSON objects, one per line.
    #[arg(long)]
    pub json: bool,
    /// Log every pair's end (default: only failures: resets, refused or unreachable
    /// upstreams, timeouts).
    #[arg(long)]
    pub log_all: bool,
    /// The log on stderr, one line per event: `text` (`zcio proxy: ...`) or `json` (one
    /// object a line: ts, level, cmd, event, msg and the event's fields).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Exit (draining) after this many seconds (for scripts and tests).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Serve the counters as Prometheus text on `ADDR:PORT` (`GET /metrics`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
}

/// What one proxy thread publishes for `--metrics`.
#[derive(Clone)]
struct Snapshot {
    stats: ProxyStats,
    fallbacks: Vec<String>,
}

/// `--metrics`, per thread (label `thread`): the receive and send paths, the fallbacks, the
/// counters, pair ends by kind, and the harvest-to-send histogram.
fn metrics(snaps: &[Option<Snapshot>], e: &mut crate::metrics::Exposition) {
    for (i, s) in snaps.iter().enumerate() {
        let Some(s) = s else { continue };
        let t = i.to_string();
        let l = [("thread", t.as_str())];
        for (side, path) in [("rx", &s.stats.rx_path), ("tx", &s.stats.tx_path)] {
            e.gauge(
                "zcio_path_info",
                "The path in use (label path); always 1",
                &[("thread", &t), ("side", side), ("path", path)],
                1.0,
            );
        }
        e.fallback_lines(&l, &s.fallbacks);
        e.stats_without(
            "zcio_proxy",
            &l,
            &s.stats,
            &[
                "active",
                "held",
                "peak_held",
                "turn_chunks_max",
                "rx_waiting",
                "tx_in_flight",
            ],
            &["forward_us", "forward_new_us", "first_forward_us"],
        );
        for k in [
            EndKind::Done,
            EndKind::Reset,
            EndKind::ConnectFailed,
            EndKind::ConnectTimeout,
            EndKind::IdleTimeout,
            EndKind::RecvFailed,
            EndKind::SendFailed,
            EndKind::Shutdown,
        ] {
            let kind = format!("{k:?}");
            e.counter(
                "zcio_proxy_ended",
                "Pairs ended, by how (label kind)",
                &[("thread", &t), ("kind", &kind)],
                s.stats.ended(k),
            );
        }
        // Bucket i counts [2^i, 2^(i+1)) µs (the first also below, the last also above).
        let n = s.stats.hold_us_log2.len();
        let buckets: Vec<(f64, u64)> = s
            .stats
            .hold_us_log2
            .iter()
            .enumerate()
            .map(|(b, &c)| (log2_bound(b, n), c))
            .collect();
        e.histogram(
            "zcio_proxy_hold_seconds",
            "Per routed chunk, the time from the wait that harvested it to the enter that \
             issues its send",
            &l,
            &buckets,
            None,
        );
        for (name, help, h) in [
            (
                "zcio_proxy_forward_seconds",
                "Per forwarded chunk, the time the proxy holds it: from the wait that \
                 harvested it (the receive) to the harvest that saw its send complete (a copy \
                 send: the kernel took the bytes; zero-copy: its notification). Not in it: \
                 the time a segment waits in the socket before the wait returns",
                &s.stats.forward_us,
            ),
            (
                "zcio_proxy_forward_new_seconds",
                "zcio_proxy_forward_seconds of each pair's first two chunks per direction (a \
                 new connection's first request and response)",
                &s.stats.forward_new_us,
            ),
            (
                "zcio_proxy_first_forward_seconds",
                "Per pair, from the accept to the first send to the upstream completing (the \
                 upstream connect and the client's first write included)",
                &s.stats.first_forward_us,
            ),
        ] {
            let buckets: Vec<(f64, u64)> = h
                .buckets
                .iter()
                .enumerate()
                .map(|(b, &c)| (log2_bound(b, h.buckets.len()), c))
                .collect();
            e.histogram(name, help, &l, &buckets, Some(h.sum_us as f64 * 1e-6));
        }
    }
}

/// The upper bound, in seconds, of log2 µs bucket `b` of `n` (the last is unbounded).
fn log2_bound(b: usize, n: usize) -> f64 {
    if b + 1 == n {
        f64::INFINITY
    } else {
        (1u64 << (b + 1)) as f64 * 1e-6
    }
}

/// The capabilities `zcio proxy` uses with these arguments, and its rings' locked memory.
fn check_privileges(a: &ProxyArgs, threads: usize) -> Result<()> {
    use crate::privs::{Need, CAP_NET_ADMIN, CAP_NET_BIND_SERVICE};
    let mut needs = Vec::new();
    // Ports below net.ipv4.ip_unprivileged_port_start (1024 unless changed) need the
    // capability to bind.
    let first_free: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1024);
    if a.listen.port() != 0 && a.listen.port() < first_free {
        needs.push(Need {
            cap: CAP_NET_BIND_SERVICE,
            used_for: "listening on a port below ip_unprivileged_port_start",
            without: None,
        });
    }
    if matches!(a.rx, RxMode::Auto | RxMode::Zcrx) {
        needs.push(Need {
            cap: CAP_NET_ADMIN,
            used_for: "zero-copy receive: registering a zcrx area and refill ring",
            without: Some("receive falls back from zcrx to bufring (provided buffers)"),
        });
    }
    let rings = (a.rx != RxMode::Plain).then_some((
        crate::privs::RING_PROXY * threads as u64,
        "epoll + recv (receive) and syscall sends",
    ));
    crate::privs::check("proxy", &needs, rings).map(|_| ())
}

fn resolve(targets: &[String], what: &str) -> Result<Vec<SocketAddr>> {
    let mut out = Vec::new();
    for t in targets {
        let addrs: Vec<SocketAddr> = t
            .to_socket_addrs()
            .with_context(|| format!("resolving {what} {t}"))?
            .collect();
        if addrs.is_empty() {
            bail!("{what} {t}: the name has no address");
        }
        out.extend(addrs);
    }
    Ok(out)
}

/// The targets: `--to`, then those of `--targets-file` (read now), every name resolved.
fn load_targets(a: &ProxyArgs) -> Result<Vec<SocketAddr>> {
    let mut out = resolve(&a.to, "--to")?;
    if let Some(path) = &a.targets_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --targets-file {}", path.display()))?;
        let names: Vec<String> = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        out.extend(resolve(&names, &format!("{}:", path.display()))?);
    }
    if out.is_empty() {
        bail!("no target: --to and --targets-file name none");
    }
    Ok(out)
}

/// The targets every thread forwards new clients to; `gen` counts the changes.
struct Targets {
    gen: AtomicU64,
    list: Mutex<Vec<SocketAddr>>,
}

impl Targets {
    fn get(&self) -> Vec<SocketAddr> {
        self.list.lock().expect("targets lock").clone()
    }

    fn set(&self, t: Vec<SocketAddr>) {
        *self.list.lock().expect("targets lock") = t;
        self.gen.fetch_add(1, Ordering::Release);
    }
}

fn join(t: &[SocketAddr]) -> String {
    t.iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn config(a: &ProxyArgs) -> Result<ProxyConfig> {
    let mut rx = RxConfig::with_mode(a.rx).low_latency();
    rx.buf_size = u32::try_from(a.buf_size).context("--buf-size")?;
    rx.buffers = a.buffers;
    rx.hot_bytes = a.rx_rotation;
    if let Some(q) = &a.zcrx_queue {
        let (iface, queue) = q
            .rsplit_once(':')
            .context("--zcrx-queue wants IFACE:QUEUE")?;
        rx.zcrx = Some(ZcrxTarget::new(iface, queue.parse().context("zcrx queue")?));
    } else if a.rx == RxMode::Zcrx {
        rx.zcrx = Some(ZcrxTarget::deviceless());
    }
    Ok(ProxyConfig {
        rx,
        tx: SenderConfig::new(a.tx),
        limits: Limits {
            buffer_bytes: a.conn_buffer.max(1),
            buffer_chunks: a.conn_chunks.max(1),
            connect_timeout: Duration::from_secs_f64(a.connect_timeout.max(0.001)),
            idle_timeout: (a.idle_timeout > 0.0).then(|| Duration::from_secs_f64(a.idle_timeout)),
        },
        max_connections: a.max_connections,
        nodelay: true,
        ..ProxyConfig::default()
    })
}

/// What a proxy thread shares with the main thread.
struct Shared<'a> {
    stop: &'a AtomicBool,
    targets: &'a Targets,
    slot: &'a Mutex<ProxyStats>,
    board: Option<&'a crate::metrics::Board<Snapshot>>,
    log: Log,
}

/// One proxy thread: prepares its `Proxy` (rings, buffers, descriptor table), says so on
/// `ready`, then accepts on the listener it is handed (`None`: stop) until `stop`, and drains.
fn worker(
    a: &ProxyArgs,
    idx: usize,
    sh: &Shared<'_>,
    ready: std::sync::mpsc::Sender<Result<()>>,
    listener: std::sync::mpsc::Receiver<Option<TcpListener>>,
) -> Result<usize> {
    let cfg = config(a)?;
    let mut seen = sh.targets.gen.load(Ordering::Acquire);
    let mut p = match Proxy::prepare(a.listen.ip(), sh.targets.get(), cfg) {
        Ok(p) => p,
        Err(e) => {
            let _ = ready.send(Err(anyhow::anyhow!("thread {idx}: {e}")));
            return Ok(0);
        }
    };
    p.set_first_target(idx);
    let s = p.stats();
    sh.log.event(
        Level::Info,
        "thread_ready",
        &format!(
            "thread {idx}: rx {} ({}), tx {}, one ring per thread: {}",
            s.rx_path,
            p.receiver().describe(),
            s.tx_path,
            if s.one_ring { "yes" } else { "no" }
        ),
        serde_json::json!({
            "thread": idx,
            "rx_path": s.rx_path,
            "rx": p.receiver().describe(),
            "tx_path": s.tx_path,
            "one_ring": s.one_ring,
        }),
    );
    for f in p.fallbacks() {
        sh.log.event(
            Level::Info,
            "fallback",
            &format!("thread {idx}:   fallback: {f}"),
            serde_json::json!({"thread": idx, "fallback": f}),
        );
    }
    let _ = ready.send(Ok(()));
    let Ok(Some(l)) = listener.recv() else {
        return Ok(0);
    };
    p.accept_from(l)
        .with_context(|| format!("thread {idx}: accepting"))?;
    let log = |p: &mut Proxy| {
        for e in p.take_ended() {
            if a.log_all || e.end.kind != EndKind::Done {
                let level = if e.end.kind == EndKind::Done || e.end.kind == EndKind::IdleTimeout {
                    Level::Info
                } else {
                    Level::Warn
                };
                let mut fields = serde_json::to_value(&e).unwrap_or_default();
                fields["thread"] = serde_json::json!(idx);
                sh.log.event(level, "pair_ended", &e.to_string(), fields);
            }
        }
    };
    let mut publish = Instant::now();
    while !sh.stop.load(Ordering::Relaxed) {
        let g = sh.targets.gen.load(Ordering::Acquire);
        if g != seen {
            seen = g;
            // Checked non-empty by the reload; open pairs keep their upstream.
            let _ = p.set_targets(sh.targets.get());
        }
        p.turn(Duration::from_millis(50))
            .context("proxy loop (the ring failed)")?;
        log(&mut p);
        if let Some(b) = sh.board.filter(|b| b.wanted(idx)) {
            b.publish(
                idx,
                Snapshot {
                    stats: p.stats(),
                    fallbacks: p.fallbacks(),
                },
            );
        }
        if publish.elapsed() >= Duration::from_millis(100) {
            publish = Instant::now();
            *sh.slot.lock().expect("stats lock") = p.stats();
        }
    }
    let reset = p.drain(Duration::from_secs_f64(a.drain_timeout.max(0.0)))?;
    log(&mut p);
    *sh.slot.lock().expect("stats lock") = p.stats();
    Ok(reset)
}

fn total(slots: &[Mutex<ProxyStats>]) -> ProxyStats {
    let mut t = ProxyStats::default();
    for s in slots {
        t.add(&s.lock().expect("stats lock"));
    }
    t
}

fn stats_line(t: &ProxyStats, secs: f64, rate: f64, json: bool) -> String {
    let copied = t.copied_fraction();
    if json {
        let mut v = serde_json::to_value(t).unwrap_or_default();
        v["secs"] = serde_json::json!(secs);
        v["mb_per_s"] = serde_json::json!(rate / 1e6);
        v["copied_fraction"] = serde_json::json!(copied);
        return v.to_string();
    }
    let mb = (t.bytes_up + t.bytes_down) as f64 / 1e6;
    let per_mb = if mb > 0.0 {
        format!("{:.2}", t.syscalls as f64 / mb)
    } else {
        "-".into()
    };
    format!(
        "{secs:7.1}s active {} accepted {} rejected {} | up {:.1} MB down {:.1} MB, {:.1} MB/s | \
         ended: done {} reset {} connect-failed {} timeout {} idle {} | paused {} held {} KiB \
         (peak {} KiB) | syscalls/MB {per_mb} | COPIED {}",
        t.active,
        t.accepted,
        t.rejected,
        t.bytes_up as f64 / 1e6,
        t.bytes_down as f64 / 1e6,
        rate / 1e6,
        t.ended(EndKind::Done),
        t.ended(EndKind::Reset) + t.ended(EndKind::RecvFailed) + t.ended(EndKind::SendFailed),
        t.ended(EndKind::ConnectFailed),
        t.ended(EndKind::ConnectTimeout),
        t.ended(EndKind::IdleTimeout),
        t.pauses,
        t.held >> 10,
        t.peak_held >> 10,
        copied.map_or_else(|| "-".into(), |c| format!("{:.0}%", c * 100.0)),
    )
}

/// SIGHUP: the targets again from `--to` and `--targets-file`; on any error the old ones
/// stay.
fn reload(a: &ProxyArgs, targets: &Targets, log: Log) {
    if a.targets_file.is_none() {
        log.event(
            Level::Info,
            "reload",
            "SIGHUP: no --targets-file, nothing to re-read",
            serde_json::Value::Null,
        );
        return;
    }
    match load_targets(a) {
        Ok(t) => {
            log.event(
                Level::Info,
                "targets_reloaded",
                &format!("SIGHUP: targets now {} (open pairs keep theirs)", join(&t)),
                serde_json::json!({"targets": t}),
            );
            targets.set(t);
        }
        Err(e) => {
            let old = targets.get();
            log.event(
                Level::Error,
                "reload_failed",
                &format!("SIGHUP: {e:#}; the targets stay {}", join(&old)),
                serde_json::json!({"error": format!("{e:#}"), "targets": old}),
            );
        }
    }
}

/// Runs `zcio proxy` until SIGINT/SIGTERM (or `--duration`), then drains within the bound.
pub fn run(a: ProxyArgs) -> Result<()> {
    let log = Log::new("proxy", a.log_format);
    check_privileges(&a, a.threads.max(1))?;
    let targets = Targets {
        gen: AtomicU64::new(0),
        list: Mutex::new(load_targets(&a)?),
    };
    // Two descriptors per socket (the receiver's and the send ring's): raise the soft limit
    // before the rings size their registered-file tables by it.
    let nofile = zcio::sys::raise_rlimit(libc::RLIMIT_NOFILE).context("RLIMIT_NOFILE")?;
    let sigfd = zcio::sys::signal::block_to_fd(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP])
        .context("blocking SIGINT/SIGTERM/SIGHUP")?;
    let threads = a.threads.max(1);
    // The whole process's descriptors (four per pair, every thread) before any thread starts:
    // growing the table later, with threads running, waits for an RCU grace period each time.
    let _ = zcio::sys::reserve_descriptors(
        (a.max_connections as u64)
            .saturating_mul(zcio::proxy::FDS_PER_PAIR)
            .saturating_mul(threads as u64)
            .saturating_add(64),
    );
    let board = match crate::metrics::start_quiet(a.metrics, "proxy", threads, metrics)? {
        Some((board, at)) => {
            log.event(
                Level::Info,
                "metrics",
                &format!("metrics on http://{at}/metrics"),
                serde_json::json!({"metrics": format!("http://{at}/metrics")}),
            );
            Some(board)
        }
        None => None,
    };
    let stop = AtomicBool::new(false);
    let slots: Vec<Mutex<ProxyStats>> = (0..threads)
        .map(|_| Mutex::new(ProxyStats::default()))
        .collect();
    let start = Instant::now();
    let end = a.duration.map(|d| start + Duration::from_secs_f64(d));
    let (signal, resets) = std::thread::scope(|sc| -> Result<_> {
        let (rtx, rrx) = std::sync::mpsc::channel();
        let mut handles = Vec::new();
        let mut give = Vec::new();
        for (i, slot) in slots.iter().enumerate() {
            let (ltx, lrx) = std::sync::mpsc::channel();
            give.push(ltx);
            let sh = Shared {
                stop: &stop,
                targets: &targets,
                slot,
                board: board.as_deref(),
                log,
            };
            let (a, rtx) = (&a, rtx.clone());
            handles.push(sc.spawn(move || worker(a, i, &sh, rtx, lrx)));
        }
        drop(rtx);
        let mut failed = None;
        for r in rrx.iter().take(threads) {
            if let Err(e) = r {
                failed.get_or_insert(e);
            }
        }
        // Every thread is ready: only now can clients connect (none waits in the backlog
        // while rings and buffers are made). A backlog for the connection limit: a burst of
        // clients waits in it, not in SYN retransmits a second later (std's bind asks 128).
        let listener = match failed {
            Some(_) => None,
            None => {
                let backlog = a.max_connections.saturating_mul(threads);
                match zcio::sys::net::listen_tcp(a.listen, backlog.min(u32::MAX as usize) as u32) {
                    Ok(l) => Some(l),
                    Err(e) => {
                        failed = Some(
                            anyhow::Error::new(e).context(format!("binding --listen {}", a.listen)),
                        );
                        None
                    }
                }
            }
        };
        if let Some(l) = &listener {
            let at = l.local_addr()?;
            let t = targets.get();
            log.event(
                Level::Info,
                "listening",
                &format!(
                    "{at} -> {} ({threads} thread(s), RLIMIT_NOFILE {}); one local delivery \
                     copies (loopback rule): COPIED is 100% unless the peer is across a real NIC",
                    join(&t),
                    nofile.map_or_else(|| "unlimited".into(), |n| n.to_string()),
                ),
                serde_json::json!({"listen": at, "targets": t, "threads": threads}),
            );
        }
        for g in give {
            let l = match &listener {
                Some(l) => Some(l.try_clone().context("cloning the listener")?),
                None => None,
            };
            let _ = g.send(l);
        }
        drop(listener);
        let mut last = (Instant::now(), 0u64);
        let every = (a.stats_interval > 0.0).then(|| Duration::from_secs_f64(a.stats_interval));
        let signal = if failed.is_some() {
            None
        } else {
            loop {
                let ready = zcio::sys::net::poll_one(&sigfd, libc::POLLIN, 20)
                    .context("waiting for signals")?;
                if ready > 0 {
                    match zcio::sys::signal::read_signal(&sigfd)? {
                        Some(libc::SIGHUP) => reload(&a, &targets, log),
                        Some(s) => break Some(s),
                        None => {}
                    }
                }
                if end.is_some_and(|e| Instant::now() >= e)
                    || handles.iter().any(|h| h.is_finished())
                {
                    break None;
                }
                if let Some(every) = every {
                    if last.0.elapsed() >= every {
                        let t = total(&slots);
                        let bytes = t.bytes_up + t.bytes_down;
                        let rate =
                            (bytes - last.1.min(bytes)) as f64 / last.0.elapsed().as_secs_f64();
                        last = (Instant::now(), bytes);
                        println!(
                            "{}",
                            stats_line(&t, start.elapsed().as_secs_f64(), rate, a.json)
                        );
                    }
                }
            }
        };
        stop.store(true, Ordering::Relaxed);
        let mut resets = 0;
        let mut err = failed;
        for h in handles {
            match h.join() {
                Ok(Ok(n)) => resets += n,
                Ok(Err(e)) => {
                    err.get_or_insert(e);
                }
                Err(_) => {
                    err.get_or_insert(anyhow::anyhow!("proxy thread panicked"));
                }
            }
        }
        if let Some(e) = err {
            return Err(e);
        }
        Ok((signal, resets))
    })?;
    let t = total(&slots);
    let secs = start.elapsed().as_secs_f64();
    let rate = (t.bytes_up + t.bytes_down) as f64 / secs.max(1e-9);
    println!("{}", stats_line(&t, secs, rate, a.json));
    let why = match signal {
        Some(s) if s == libc::SIGTERM => "SIGTERM",
        Some(_) => "SIGINT",
        None => "duration",
    };
    log.event(
        Level::Info,
        "stopped",
        &format!("stopped ({why}); drained, {resets} pair(s) reset at the drain bound"),
        serde_json::json!({"why": why, "reset_at_drain_bound": resets}),
    );
    Ok(())
}

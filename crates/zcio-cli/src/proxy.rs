//! `zcio proxy`: a TCP proxy on one ring per thread (`zcio::proxy::Proxy`), forwarding received
//! buffers with zero-copy send. A thin wrapper: arguments, threads, signals, stats lines.

use anyhow::{bail, Context, Result};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
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
    /// Target (`HOST:PORT`; host names are resolved once at start, every address of a name
    /// is a target); repeatable: connections go round-robin.
    #[arg(long = "to", required = true)]
    pub to: Vec<String>,
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
        e.stats(
            "zcio_proxy",
            &l,
            &s.stats,
            &["active", "held", "peak_held", "turn_chunks_max"],
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
            .map(|(b, &c)| {
                let le = if b + 1 == n {
                    f64::INFINITY
                } else {
                    (1u64 << (b + 1)) as f64 * 1e-6
                };
                (le, c)
            })
            .collect();
        e.histogram(
            "zcio_proxy_hold_seconds",
            "Per routed chunk, the time from the wait that harvested it to the enter that \
             issues its send",
            &l,
            &buckets,
            None,
        );
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

fn resolve(targets: &[String]) -> Result<Vec<SocketAddr>> {
    let mut out = Vec::new();
    for t in targets {
        let addrs: Vec<SocketAddr> = t
            .to_socket_addrs()
            .with_context(|| format!("resolving --to {t}"))?
            .collect();
        if addrs.is_empty() {
            bail!("--to {t}: the name has no address");
        }
        out.extend(addrs);
    }
    Ok(out)
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

/// One proxy thread: builds its `Proxy` on a clone of the listener, runs until `stop`, drains.
fn worker(
    a: &ProxyArgs,
    idx: usize,
    listener: TcpListener,
    targets: Vec<SocketAddr>,
    stop: &AtomicBool,
    (slot, board): (&Mutex<ProxyStats>, Option<&crate::metrics::Board<Snapshot>>),
    ready: std::sync::mpsc::Sender<Result<String>>,
) -> Result<usize> {
    let cfg = config(a)?;
    let mut p = match Proxy::new(listener, targets, cfg) {
        Ok(p) => p,
        Err(e) => {
            let _ = ready.send(Err(anyhow::anyhow!("thread {idx}: {e}")));
            return Ok(0);
        }
    };
    p.set_first_target(idx);
    let s = p.stats();
    let mut line = format!(
        "thread {idx}: rx {} ({}), tx {}, one ring per thread: {}",
        s.rx_path,
        p.receiver().describe(),
        s.tx_path,
        if s.one_ring { "yes" } else { "no" }
    );
    for f in p.fallbacks() {
        line.push_str(&format!("\n  fallback: {f}"));
    }
    let _ = ready.send(Ok(line));
    let log = |p: &mut Proxy| {
        for e in p.take_ended() {
            if a.log_all || e.end.kind != EndKind::Done {
                eprintln!("zcio proxy: {e}");
            }
        }
    };
    let mut publish = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        p.turn(Duration::from_millis(50))
            .context("proxy loop (the ring failed)")?;
        log(&mut p);
        if let Some(b) = board.filter(|b| b.wanted(idx)) {
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
            *slot.lock().expect("stats lock") = p.stats();
        }
    }
    let reset = p.drain(Duration::from_secs_f64(a.drain_timeout.max(0.0)))?;
    log(&mut p);
    *slot.lock().expect("stats lock") = p.stats();
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

/// Runs `zcio proxy` until SIGINT/SIGTERM (or `--duration`), then drains within the bound.
pub fn run(a: ProxyArgs) -> Result<()> {
    check_privileges(&a, a.threads.max(1))?;
    let targets = resolve(&a.to)?;
    // Two descriptors per socket (the receiver's and the send ring's): raise the soft limit
    // before the rings size their registered-file tables by it.
    let nofile = zcio::sys::raise_rlimit(libc::RLIMIT_NOFILE).context("RLIMIT_NOFILE")?;
    let sigfd = zcio::sys::signal::block_to_fd(&[libc::SIGINT, libc::SIGTERM])
        .context("blocking SIGINT/SIGTERM")?;
    let listener =
        TcpListener::bind(a.listen).with_context(|| format!("binding --listen {}", a.listen))?;
    let threads = a.threads.max(1);
    let board = crate::metrics::start(a.metrics, "proxy", threads, metrics)?;
    let stop = AtomicBool::new(false);
    let slots: Arc<Vec<Mutex<ProxyStats>>> = Arc::new(
        (0..threads)
            .map(|_| Mutex::new(ProxyStats::default()))
            .collect(),
    );
    let start = Instant::now();
    let end = a.duration.map(|d| start + Duration::from_secs_f64(d));
    eprintln!(
        "zcio proxy: {} -> {} ({} thread(s), RLIMIT_NOFILE {}); one local delivery copies \
         (loopback rule): COPIED is 100% unless the peer is across a real NIC",
        listener.local_addr()?,
        targets
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        threads,
        nofile.map_or_else(|| "unlimited".into(), |n| n.to_string()),
    );
    let (signal, resets) = std::thread::scope(|sc| -> Result<_> {
        let (rtx, rrx) = std::sync::mpsc::channel();
        let mut handles = Vec::new();
        for i in 0..threads {
            let l = listener.try_clone().context("cloning the listener")?;
            let (a, stop, slots, targets, rtx) = (&a, &stop, &slots, targets.clone(), rtx.clone());
            let board = board.as_deref();
            handles.push(sc.spawn(move || worker(a, i, l, targets, stop, (&slots[i], board), rtx)));
        }
        drop(rtx);
        let mut failed = None;
        for r in rrx.iter().take(threads) {
            match r {
                Ok(line) => eprintln!("zcio proxy: {line}"),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        let mut last = (Instant::now(), 0u64);
        let every = (a.stats_interval > 0.0).then(|| Duration::from_secs_f64(a.stats_interval));
        let signal = if failed.is_some() {
            None
        } else {
            loop {
                let ready = zcio::sys::net::poll_one(&sigfd, libc::POLLIN, 20)
                    .context("waiting for signals")?;
                if ready > 0 {
                    if let Some(s) = zcio::sys::signal::read_signal(&sigfd)? {
                        break Some(s);
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
    eprintln!(
        "zcio proxy: stopped ({}); drained, {resets} pair(s) reset at the drain bound",
        match signal {
            Some(s) if s == libc::SIGTERM => "SIGTERM",
            Some(_) => "SIGINT",
            None => "duration",
        }
    );
    Ok(())
}

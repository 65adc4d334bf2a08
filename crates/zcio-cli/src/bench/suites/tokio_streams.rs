//! `tokio`: zcio's tokio streams (`zcio::tokio::LocalIo` + `TcpStream`: one send ring and one
//! receiver per thread, shared by its tasks) against tokio's own `TcpStream`, on loopback.
//! Every server runs on one thread: a current-thread runtime with a `LocalSet`.
//!
//! - `new connection set-up`: adding 200 accepted connections to the thread's `LocalIo`
//!   (no ring each) against the earlier way, a `Sender` (a ring each) wrapped in an
//!   `AsyncSender`; µs per connection.
//! - `end of stream`: the server writes 1 MiB to a connection and drops it or shuts it down;
//!   the peer's end of stream after the later of its last byte read and the server's last
//!   completion (`write_all`'s return on tokio), the median of 5 connections in a row. zcio's
//!   `TcpStream` and the one-ring-per-socket `AsyncSender`, each against tokio's stream.
//! - `16 x 64M write_all`: a server writes 64 MiB to each of 16 connections with
//!   `write_all` (zcio: copied into the thread's send pool and batched on the ring), client
//!   threads read and count every byte; throughput and the server's CPU per GB.
//! - `hyper 1K`: hyper's HTTP/1 server with 1 KiB responses, `wrk` with 100 keep-alive
//!   connections; requests per second and the server's CPU µs per request.
//! - `16M bodies`: an HTTP/1.1 server answers each request with a 16 MiB body that already is
//!   `Bytes` (zcio: `send_bytes`, lent to the kernel as it is; tokio: `write_all`), `wrk`
//!   with 4 keep-alive connections; throughput and the server's CPU per GB.
//!
//! The server's CPU is its thread's plus the process's io_uring workers' (`iou-*`, normally
//! none). Loopback copies every byte at delivery, so nothing here is zero-copy: each row shows
//! the COPIED fraction (bytes not sent zero-copy / bytes sent; 1 on loopback), and the rows
//! measure syscalls, batching and wake-ups.
//!
//! The zcio side's notes give its syscalls per op: the send ring's (`io_uring_enter` and direct
//! `send`s) and the receiver's.
//!
//! Run time: about a minute by default (medians of 3); `--full` runs 10 s wrk runs, 7 rounds.
//! `ZCIO_BENCH_ONLY=substring` runs only the cases whose name contains it.

use crate::bench::{Better, Ctx, MetricDef, Mode, Sample, Suite};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zcio::stats::Counters;

/// The suite.
pub struct TokioSuite;

const COPIED: MetricDef = MetricDef::new("copied_fraction", "fraction", Better::Lower);
const SETUP: &[MetricDef] = &[MetricDef::new("setup_us", "µs/conn", Better::Lower)];
const EOF: &[MetricDef] = &[MetricDef::new("eof_ms", "ms", Better::Lower), COPIED];
const BULK: &[MetricDef] = &[
    MetricDef::new("throughput", "Gbit/s", Better::Higher),
    MetricDef::new("server_cpu_per_gb", "s/GB", Better::Lower),
    COPIED,
];
const HTTP_SMALL: &[MetricDef] = &[
    MetricDef::new("req_per_s", "req/s", Better::Higher),
    MetricDef::new("server_cpu_per_req", "µs/req", Better::Lower),
    COPIED,
];

impl Suite for TokioSuite {
    fn name(&self) -> &'static str {
        "tokio"
    }
    fn about(&self) -> &'static str {
        "tokio streams on one ring per thread (LocalIo) vs tokio TcpStream / a ring per Sender, loopback"
    }
    fn chart_metric(&self) -> &'static str {
        "throughput"
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        ctx.note(
            "loopback: every byte is copied at delivery (COPIED 1.0: auto tries zero-copy on \
             a few sends, sees COPIED and sends by uring-copy), so these rows measure \
             syscalls, batching and wake-ups, not zero-copy",
        );
        ctx.note("servers: one thread, a current-thread runtime with a LocalSet; CPU = that thread + io_uring workers");
        ctx.compare(
            "new connection set-up, 200 conns",
            (
                "Sender + AsyncSender (a ring each)",
                "LocalIo::from_std (shared ring)",
            ),
            SETUP,
            || setup(false),
            || setup(true),
        )?;
        for (end, what) in [(End::Drop, "drop"), (End::Shutdown, "shutdown")] {
            ctx.compare(
                &format!("end of stream after the last byte, {what}"),
                ("tokio TcpStream", "zcio TcpStream (LocalIo)"),
                EOF,
                || eof(Side::Tokio, end),
                || eof(Side::Stream, end),
            )?;
            ctx.compare(
                &format!("end of stream after the last byte, {what}, AsyncSender"),
                ("tokio TcpStream", "zcio AsyncSender (a ring each)"),
                EOF,
                || eof(Side::Tokio, end),
                || eof(Side::Sender, end),
            )?;
        }
        let len = 64usize << 20;
        ctx.compare(
            &format!("16 x {} write_all", crate::bench::measure::size_label(len)),
            ("tokio TcpStream", "zcio TcpStream (LocalIo)"),
            BULK,
            || bulk(false, 16, len),
            || bulk(true, 16, len),
        )?;
        if Command::new("wrk").arg("--version").output().is_err() {
            ctx.note("hyper and body rows skipped: wrk not installed (scripts/deps)");
            return Ok(());
        }
        let secs = match ctx.mode {
            Mode::Quick => 1,
            Mode::Default => 2,
            Mode::Full => 10,
        };
        ctx.compare(
            "hyper http1 1K, wrk 100 conns",
            ("hyper on tokio TcpStream", "hyper on zcio TcpStream"),
            HTTP_SMALL,
            || http(Server::Hyper, false, 100, secs),
            || http(Server::Hyper, true, 100, secs),
        )?;
        ctx.compare(
            "16M bodies, wrk 4 conns",
            ("tokio write_all(Bytes)", "zcio send_bytes(Bytes)"),
            BULK,
            || http(Server::Bodies, false, 4, secs),
            || http(Server::Bodies, true, 4, secs),
        )?;
        Ok(())
    }
}

fn pairs(n: usize) -> Result<(Vec<TcpStream>, Vec<TcpStream>)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let mut clients = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..n {
        clients.push(TcpStream::connect(l.local_addr()?)?);
        servers.push(l.accept()?.0);
    }
    Ok((clients, servers))
}

fn local_block_on<F: std::future::Future>(f: F) -> Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    Ok(local.block_on(&rt, f))
}

/// The fraction of the bytes sent that did not go zero-copy.
fn copied(c: &Counters) -> f64 {
    if c.bytes == 0 {
        return f64::NAN;
    }
    c.bytes.saturating_sub(c.zerocopy_bytes) as f64 / c.bytes as f64
}

/// CPU seconds of this process's io_uring worker threads (`iou-wrk-*`, `iou-sqp-*`), by
/// thread id: the kernel's work for a ring that does not run in the submitting thread.
fn io_worker_cpu() -> std::collections::HashMap<u32, f64> {
    let mut m = std::collections::HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return m;
    };
    for e in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if !head.contains("(iou-") {
            continue;
        }
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
            + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        if let Some(tid) = e.file_name().to_str().and_then(|s| s.parse().ok()) {
            m.insert(tid, ticks / 100.0);
        }
    }
    m
}

/// The server thread's CPU: its own (`CLOCK_THREAD_CPUTIME_ID`) plus what io_uring workers
/// that ran meanwhile spent.
struct ServerCpu {
    thread: Duration,
    workers: std::collections::HashMap<u32, f64>,
}

impl ServerCpu {
    /// Starts on the server's thread.
    fn start() -> Self {
        Self {
            thread: zcio_testnet::cpu::thread_cpu_time(),
            workers: io_worker_cpu(),
        }
    }
    /// Seconds since start; call on the same thread.
    fn stop(&self) -> f64 {
        let own = (zcio_testnet::cpu::thread_cpu_time() - self.thread).as_secs_f64();
        let workers: f64 = io_worker_cpu()
            .iter()
            .map(|(t, c)| c - self.workers.get(t).copied().unwrap_or(0.0))
            .sum();
        own + workers.max(0.0)
    }
}

fn setup(shared: bool) -> Result<Sample> {
    const N: usize = 200;
    let (clients, servers) = pairs(N)?;
    let us = local_block_on(async move {
        let pool = zcio::Pool::new(64 << 10, 16, false)?;
        let io = zcio::tokio::LocalIo::new()?;
        let t0 = Instant::now();
        if shared {
            let mut v = Vec::new();
            for s in servers {
                v.push(io.from_std(s)?);
            }
            let us = t0.elapsed().as_secs_f64() * 1e6 / N as f64;
            drop(v);
            Ok::<f64, anyhow::Error>(us)
        } else {
            let mut v = Vec::new();
            for s in servers {
                let tx = zcio::Sender::new(s, &pool, zcio::SenderConfig::default())?;
                v.push(zcio::tokio::AsyncSender::new(tx)?);
            }
            let us = t0.elapsed().as_secs_f64() * 1e6 / N as f64;
            drop(v);
            Ok(us)
        }
    })??;
    drop(clients);
    let mut s = Sample::default();
    s.set("setup_us", us);
    Ok(s)
}

#[derive(Clone, Copy, Debug)]
enum End {
    Drop,
    Shutdown,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Side {
    Tokio,
    Stream,
    Sender,
}

/// What a reader saw: bytes, when it read the last of them, when it read the end of stream.
type ReadEnd = (usize, Instant, Instant);

fn read_to_eof(mut c: TcpStream) -> ReadEnd {
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0;
    let mut last = Instant::now();
    loop {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => return (n, last, Instant::now()),
            Ok(k) => {
                n += k;
                last = Instant::now();
            }
        }
    }
}

/// 5 connections in a row: 1 MiB each, then `end`; the median delay between the later of
/// the peer's last byte read and the server's last completion, and the peer's end of stream.
fn eof(side: Side, end: End) -> Result<Sample> {
    const CONNS: usize = 5;
    const LEN: usize = 1 << 20;
    let (clients, servers) = pairs(CONNS)?;
    let (delays, counters) = local_block_on(async move {
        let io = match side {
            Side::Stream => Some(zcio::tokio::LocalIo::new()?),
            _ => None,
        };
        let pool = zcio::Pool::new(64 << 10, 16, false)?;
        let mut counters = Counters::default();
        let mut delays = Vec::new();
        for (c, s) in clients.into_iter().zip(servers) {
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let _ = tx.send(read_to_eof(c));
            });
            let mut hold: Option<Box<dyn std::any::Any>> = None;
            let done = match side {
                Side::Tokio => {
                    s.set_nonblocking(true)?;
                    let t = tokio::net::TcpStream::from_std(s)?;
                    write_then_end(t, LEN, end, &mut hold).await?
                }
                Side::Stream => {
                    let io = io.as_ref().expect("a LocalIo");
                    write_then_end(io.from_std(s)?, LEN, end, &mut hold).await?
                }
                Side::Sender => {
                    let cfg = zcio::SenderConfig::default();
                    let mut tx = zcio::tokio::AsyncSender::new(zcio::Sender::new(s, &pool, cfg)?)?;
                    // 16 buffers of 64 KiB: every one in flight at once.
                    for _ in 0..LEN / pool.slot_size() {
                        let mut b = pool.try_get().context("a free buffer")?;
                        b.fill(7);
                        tx.start(b).await?;
                    }
                    tx.flush().await?;
                    while let Some((c, _)) = tx.next_completion().await? {
                        anyhow::ensure!(c.result().is_ok(), "a send failed: {c:?}");
                    }
                    let done = Instant::now();
                    let c = tx.get_ref().counters();
                    counters.bytes += c.bytes;
                    counters.zerocopy_bytes += c.zerocopy_bytes;
                    if let End::Shutdown = end {
                        tx.shutdown().await?;
                        hold = Some(Box::new(tx));
                    }
                    done
                }
            };
            let (n, last, eof) = rx.await.context("reader")?;
            anyhow::ensure!(n == LEN, "the peer read {n} of {LEN} bytes");
            delays.push(eof.saturating_duration_since(last.max(done)));
            drop(hold);
        }
        if let Some(io) = &io {
            counters = io.tx_counters();
        }
        Ok::<_, anyhow::Error>((delays, counters))
    })??;
    let ms: Vec<f64> = delays.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    let mut s = Sample::default();
    s.set("eof_ms", crate::bench::stats(&ms).0);
    s.set(
        "copied_fraction",
        if side == Side::Tokio {
            1.0
        } else {
            copied(&counters)
        },
    );
    Ok(s)
}

fn bulk(zcio: bool, conns: usize, len: usize) -> Result<Sample> {
    let (clients, servers) = pairs(conns)?;
    let readers: Vec<_> = clients
        .into_iter()
        .map(|c| std::thread::spawn(move || read_to_eof(c).0))
        .collect();
    let t0 = Instant::now();
    let (cpu, path, counters, rx) = local_block_on(async move {
        let cpu = ServerCpu::start();
        let data = vec![7u8; 1 << 20];
        let io = zcio::tokio::LocalIo::new()?;
        let mut tasks = Vec::new();
        for s in servers {
            let data = data.clone();
            let io = io.clone();
            tasks.push(tokio::task::spawn_local(async move {
                if zcio {
                    let mut s = io.from_std(s)?;
                    for _ in 0..len / data.len() {
                        s.write_all(&data).await?;
                    }
                    s.shutdown().await?;
                } else {
                    s.set_nonblocking(true)?;
                    let mut s = tokio::net::TcpStream::from_std(s)?;
                    for _ in 0..len / data.len() {
                        s.write_all(&data).await?;
                    }
                    s.shutdown().await?;
                }
                Ok::<(), std::io::Error>(())
            }));
        }
        for t in tasks {
            t.await.context("server task")??;
        }
        let rx = io.rx_counters();
        Ok::<_, anyhow::Error>((cpu.stop(), io.describe(), io.tx_counters(), rx))
    })??;
    let mut bytes = 0u64;
    for r in readers {
        let n = r.join().map_err(|_| anyhow::anyhow!("reader panicked"))?;
        anyhow::ensure!(n == len, "a reader got {n} of {len} bytes");
        bytes += n as u64;
    }
    let wall = t0.elapsed().as_secs_f64();
    let mut s = Sample::default();
    s.set("throughput", crate::bench::measure::gbit_per_s(bytes, wall));
    s.set(
        "server_cpu_per_gb",
        crate::bench::measure::cpu_s_per_gb(cpu, bytes),
    );
    if zcio {
        s.set("copied_fraction", copied(&counters));
        s.note(format!(
            "zcio: {path}; {}",
            syscalls(&counters, &rx, counters.ops as f64, "send")
        ));
    } else {
        s.set("copied_fraction", 1.0);
    }
    Ok(s)
}

/// The zcio side's syscalls per op (`per` ops called `what`): the send ring's (enters and
/// direct sends) and the receiver's.
fn syscalls(tx: &Counters, rx: &Counters, per: f64, what: &str) -> String {
    let per = per.max(1.0);
    format!(
        "per {what}: send ring {:.3} syscalls, receiver {:.3} syscalls; {} sends of {:.0} B mean",
        tx.syscalls as f64 / per,
        rx.syscalls as f64 / per,
        tx.ops,
        tx.bytes as f64 / (tx.ops.max(1)) as f64,
    )
}

/// The HTTP servers the wrk rows run.
#[derive(Clone, Copy, Debug)]
enum Server {
    /// hyper's HTTP/1 server, 1 KiB responses.
    Hyper,
    /// A keep-alive responder whose every answer is a 16 MiB `Bytes` body.
    Bodies,
}

const SMALL: usize = 1 << 10;
const BODY: usize = 16 << 20;

/// What a server thread reports when it stops: its CPU seconds, the zcio side's description,
/// send and receive counters.
type ServerEnd = (f64, String, Counters, Counters);

/// Runs `kind` on a thread of its own (zcio streams or tokio's), `wrk` against it for `secs`
/// seconds with `conns` connections, and reports the wrk figures with the server's CPU.
fn http(kind: Server, zcio: bool, conns: usize, secs: u32) -> Result<Sample> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // Named per side, so a profile of the run (`perf report --comm`) tells them apart.
    let server = std::thread::Builder::new()
        .name(if zcio { "srv-zcio" } else { "srv-tokio" }.into())
        .spawn(move || -> Result<ServerEnd> { local_block_on(serve(kind, zcio, l, stop_rx))? })?;
    let out = Command::new("wrk")
        .args([
            "-t",
            "1",
            "-c",
            &conns.to_string(),
            "-d",
            &format!("{secs}s"),
        ])
        .args(["--timeout", "10s", "--latency"])
        .arg(format!("http://{addr}/"))
        .output()
        .context("running wrk")?;
    let _ = stop_tx.send(());
    let (cpu, path, counters, rx) = server
        .join()
        .map_err(|_| anyhow::anyhow!("server panicked"))??;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() || text.contains("Socket errors") || text.contains("Non-2xx") {
        bail!("wrk against the {kind:?} server (zcio: {zcio}) reported errors: {text}");
    }
    let w = super::wrk::parse(&text, f64::from(secs))?;
    let mut s = Sample::default();
    match kind {
        Server::Hyper => {
            s.set("req_per_s", w.rps);
            s.set("server_cpu_per_req", cpu * 1e6 / w.reqs.max(1.0));
        }
        Server::Bodies => {
            let bytes = (w.reqs * BODY as f64) as u64;
            s.set(
                "throughput",
                crate::bench::measure::gbit_per_s(bytes, f64::from(secs)),
            );
            s.set(
                "server_cpu_per_gb",
                crate::bench::measure::cpu_s_per_gb(cpu, bytes),
            );
        }
    }
    if zcio {
        s.set("copied_fraction", copied(&counters));
        s.note(format!(
            "zcio: {path}; {}",
            syscalls(&counters, &rx, w.reqs, "request")
        ));
    } else {
        s.set("copied_fraction", 1.0);
    }
    Ok(s)
}

async fn serve(
    kind: Server,
    zcio: bool,
    l: TcpListener,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> Result<ServerEnd> {
    l.set_nonblocking(true)?;
    let l = tokio::net::TcpListener::from_std(l)?;
    let cpu = ServerCpu::start();
    let io = zcio::tokio::LocalIo::new()?;
    let small = Bytes::from(vec![b'x'; SMALL]);
    let body = Bytes::from(vec![b'y'; BODY]);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = l.accept() => {
                let (s, _) = accepted?;
                s.set_nodelay(true)?;
                let (small, body) = (small.clone(), body.clone());
                if zcio {
                    let s = io.from_tokio(s)?;
                    tokio::task::spawn_local(async move {
                        let _ = match kind {
                            Server::Hyper => hyper_conn(s, small).await,
                            Server::Bodies => bodies_conn(s, body).await,
                        };
                    });
                } else {
                    tokio::task::spawn_local(async move {
                        let _ = match kind {
                            Server::Hyper => hyper_conn(s, small).await,
                            Server::Bodies => bodies_conn(s, body).await,
                        };
                    });
                }
            }
        }
    }
    Ok((
        cpu.stop(),
        io.describe(),
        io.tx_counters(),
        io.rx_counters(),
    ))
}

async fn hyper_conn<S>(s: S, body: Bytes) -> Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    use http_body_util::Full;
    let svc = hyper::service::service_fn(move |_req: hyper::Request<hyper::body::Incoming>| {
        let body = body.clone();
        async move { Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(body))) }
    });
    hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
        .await?;
    Ok(())
}

/// Writes a 16 MiB body.
trait SendBody {
    async fn send_body(&mut self, body: Bytes) -> std::io::Result<()>;
}

impl SendBody for zcio::tokio::TcpStream {
    async fn send_body(&mut self, body: Bytes) -> std::io::Result<()> {
        self.send_bytes(body).await
    }
}

impl SendBody for tokio::net::TcpStream {
    async fn send_body(&mut self, body: Bytes) -> std::io::Result<()> {
        self.write_all(&body).await
    }
}

/// Answers every request (a GET without a body) with `body`: the head with `write_all`, the
/// body with [`SendBody`].
async fn bodies_conn<S>(mut s: S, body: Bytes) -> Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + SendBody + Unpin,
{
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: application/octet-stream\r\n\r\n",
        body.len()
    );
    let mut req = Vec::with_capacity(4096);
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        req.extend_from_slice(&buf[..n]);
        while let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") {
            req.drain(..end + 4);
            s.write_all(head.as_bytes()).await?;
            s.send_body(body.clone()).await?;
        }
    }
}

/// Writes `len` bytes with `write_all`; returns when that returned, after shutting the
/// stream down (kept in `hold`, so the peer's end of stream is the shutdown's) or dropping it.
async fn write_then_end<W: tokio::io::AsyncWrite + Unpin + 'static>(
    mut t: W,
    len: usize,
    end: End,
    hold: &mut Option<Box<dyn std::any::Any>>,
) -> Result<Instant> {
    t.write_all(&vec![7u8; len]).await?;
    let done = Instant::now();
    if let End::Shutdown = end {
        t.shutdown().await?;
        *hold = Some(Box::new(t));
    }
    Ok(done)
}

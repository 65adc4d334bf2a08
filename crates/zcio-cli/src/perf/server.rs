//! The perf server: one accept loop, a short-lived thread per connection for its hello, and a
//! thread per test that attaches the test's streams, runs them on their own pinned threads
//! and trades results with the client over the control connection.
//!
//! Limits: open connections (`--max-conns`; more are closed at accept), tests at once
//! (`--max-tests`), buffer memory per test (`--max-client-mem`), test length
//! (`--max-duration`), time to say hello and to attach streams (`--handshake-timeout`),
//! silence on a stream or the control connection (`--idle-timeout`). A connection that breaks
//! a rule is closed and its reason logged (at most [`LOG_PER_S`] lines a second); every other
//! test carries on. Accept errors (EMFILE, ENFILE, ENOBUFS, ENOMEM) back off from 10 ms to
//! 1 s instead of being retried at once.

use super::client::ClientOpts;
use super::hostinfo::{self, HostCpu};
use super::proto::{self, Answer, Hello, Msg, Params, SideReport};
use super::stream::{self, RecvOpts};
use super::{parse_duration, pattern, resolve, Family, ServerArgs, DEFAULT_PORT};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zcio::rx::{RxConfig, RxMode};
use zcio::tx::TxMode;

/// Most log lines a second; the rest are counted and summarised.
pub const LOG_PER_S: u32 = 50;

/// What one connection (or UDP stream) delivered; the plain sink of the tx and notify bench
/// suites.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecvReport {
    /// Peer address.
    pub peer: String,
    /// Bytes received.
    pub bytes: u64,
    /// Reads (or datagrams).
    pub reads: u64,
    /// Seconds from the first byte to the end.
    pub seconds: f64,
    /// Gbit/s.
    pub gbit_s: f64,
    /// Receiving thread CPU seconds.
    pub cpu_s: f64,
    /// Whether bytes were checked.
    pub verified: bool,
    /// First offset that did not match the pattern.
    pub corrupt_at: Option<u64>,
}

/// Receives one TCP connection to EOF with blocking reads; checks the pattern with `verify`.
/// The tx and notify bench suites use it as their local plain sink.
pub fn serve_conn(s: &mut TcpStream, verify: bool) -> io::Result<RecvReport> {
    let mut buf = vec![0u8; 1 << 20];
    let mut r = RecvReport {
        verified: verify,
        ..RecvReport::default()
    };
    let cpu0 = zcio_testnet::cpu::thread_cpu_time();
    let mut t0 = None;
    loop {
        let n = match s.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => 0,
            Err(e) => return Err(e),
        };
        if n == 0 {
            break;
        }
        t0.get_or_insert_with(Instant::now);
        if verify && r.corrupt_at.is_none() {
            if let Err(o) = pattern::check(&buf[..n], r.bytes) {
                r.corrupt_at = Some(o);
            }
        }
        r.bytes += n as u64;
        r.reads += 1;
    }
    r.seconds = t0.map_or(0.0, |t: Instant| t.elapsed().as_secs_f64());
    r.gbit_s = if r.seconds > 0.0 {
        r.bytes as f64 * 8.0 / r.seconds / 1e9
    } else {
        0.0
    };
    r.cpu_s = (zcio_testnet::cpu::thread_cpu_time() - cpu0).as_secs_f64();
    Ok(r)
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Require and check the pattern.
    pub verify: bool,
    /// First CPU for stream threads.
    pub cpu: usize,
    /// Exit after one test.
    pub once: bool,
    /// Forced receive path (`None`: the client's choice).
    pub rx: Option<RxMode>,
    /// zcrx queue.
    pub zcrx: Option<zcio::rx::ZcrxTarget>,
    /// JSON lines on stdout.
    pub json: bool,
    /// Open connections.
    pub max_conns: usize,
    /// Tests at once.
    pub max_tests: usize,
    /// Buffer bytes per test.
    pub max_mem: u64,
    /// Longest test.
    pub max_duration: Duration,
    /// Hello and stream attach time.
    pub handshake: Duration,
    /// Silence allowed.
    pub idle: Duration,
}

impl ServerConfig {
    fn from_args(a: &ServerArgs) -> Result<Self> {
        let rx = match a.rx.as_str() {
            "auto" => None,
            s => Some(
                s.parse::<RxMode>()
                    .map_err(|e| anyhow::anyhow!("--rx {s}: {e}"))?,
            ),
        };
        let zcrx = match &a.zcrx_queue {
            Some(q) => {
                let (iface, queue) = q
                    .split_once(':')
                    .and_then(|(i, n)| Some((i, n.parse::<u32>().ok()?)))
                    .ok_or_else(|| {
                        anyhow::anyhow!("--zcrx-queue {q}: expected IF:QUEUE, e.g. eth0:3")
                    })?;
                Some(zcio::rx::ZcrxTarget::new(iface, queue))
            }
            None => None,
        };
        if a.max_conns == 0 || a.max_tests == 0 {
            bail!("--max-conns and --max-tests must be at least 1");
        }
        Ok(Self {
            verify: a.verify,
            cpu: a.cpu.unwrap_or(0),
            once: a.once,
            rx,
            zcrx,
            json: a.json,
            max_conns: a.max_conns,
            max_tests: a.max_tests,
            max_mem: crate::util::parse_size(&a.max_client_mem).map_err(anyhow::Error::msg)? as u64,
            max_duration: parse_duration(&a.max_duration)?,
            handshake: parse_duration(&a.handshake_timeout)?,
            idle: parse_duration(&a.idle_timeout)?,
        })
    }
}

/// Rate-limited log lines on stderr.
struct Log {
    window: Mutex<(Instant, u32, u64)>,
}

impl Log {
    fn line(&self, msg: impl std::fmt::Display) {
        // Reasons can quote what a client sent (a serde error names the unknown field):
        // control characters are escaped so a client cannot forge log lines or drive the
        // terminal.
        let msg: String = msg
            .to_string()
            .chars()
            .flat_map(|c| {
                let esc: Vec<char> = if c.is_control() {
                    c.escape_default().collect()
                } else {
                    vec![c]
                };
                esc
            })
            .collect();
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if now.duration_since(w.0) >= Duration::from_secs(1) {
            if w.2 > 0 {
                eprintln!(
                    "zcio perf server: ({} more log lines suppressed in the last second)",
                    w.2
                );
            }
            *w = (now, 0, 0);
        }
        if w.1 < LOG_PER_S {
            w.1 += 1;
            eprintln!("zcio perf server: {msg}");
        } else {
            w.2 += 1;
        }
    }
}

/// A TCP data stream that said hello, on its way to its test.
struct DataConn {
    stream: u32,
    sock: TcpStream,
    peer: SocketAddr,
    _slot: Slot,
}

struct Shared {
    cfg: ServerConfig,
    conns: AtomicUsize,
    tests: AtomicUsize,
    pending: Mutex<HashMap<[u8; 16], mpsc::Sender<DataConn>>>,
    log: Log,
    quit: AtomicBool,
    served: AtomicU64,
}

/// One open connection counted against `--max-conns`; released on drop.
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.conns.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One running test counted against `--max-tests`.
struct TestSlot(Arc<Shared>);

impl Drop for TestSlot {
    fn drop(&mut self) {
        self.0.tests.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Parses the CLI, binds and serves until killed (or one test with `--once`).
pub fn run(a: ServerArgs) -> Result<()> {
    let cfg = ServerConfig::from_args(&a)?;
    let port = a.port.unwrap_or(DEFAULT_PORT);
    let listener = bind(a.bind.as_deref(), port)?;
    eprintln!(
        "zcio perf server: listening on {} (TCP; UDP tests get ports per test)",
        listener.local_addr()?
    );
    serve(listener, cfg)
}

/// Binds the listener: every address (dual-stack `[::]`, else `0.0.0.0`) or the resolved
/// `-B` host, `ADDR:PORT` accepted too.
pub fn bind(host: Option<&str>, port: u16) -> Result<TcpListener> {
    let addrs: Vec<SocketAddr> = match host {
        None => vec![
            SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)),
            SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port)),
        ],
        Some(h) => {
            let (h, p) = super::split_host_port(h)?;
            resolve(&h, p.unwrap_or(port), Family::Any)?
        }
    };
    let mut last = None;
    for a in &addrs {
        match TcpListener::bind(a) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(anyhow::anyhow!("listening on {a}: {e}")),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("nothing to listen on")))
}

/// Serves on `listener` until `--once` is done (or forever).
pub fn serve(listener: TcpListener, cfg: ServerConfig) -> Result<()> {
    listener
        .set_nonblocking(true)
        .context("making the listener non-blocking")?;
    let sh = Arc::new(Shared {
        cfg,
        conns: AtomicUsize::new(0),
        tests: AtomicUsize::new(0),
        pending: Mutex::new(HashMap::new()),
        log: Log {
            window: Mutex::new((Instant::now(), 0, 0)),
        },
        quit: AtomicBool::new(false),
        served: AtomicU64::new(0),
    });
    let mut backoff = Duration::ZERO;
    while !sh.quit.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((s, peer)) => {
                backoff = Duration::ZERO;
                if sh.conns.load(Ordering::Acquire) >= sh.cfg.max_conns {
                    sh.log.line(format_args!(
                        "{peer}: closed at accept: {} connections open (--max-conns)",
                        sh.cfg.max_conns
                    ));
                    drop(s);
                    continue;
                }
                sh.conns.fetch_add(1, Ordering::AcqRel);
                let slot = Slot(Arc::clone(&sh));
                let sh2 = Arc::clone(&sh);
                let spawned = std::thread::Builder::new()
                    .name("perf-conn".into())
                    .stack_size(256 << 10)
                    .spawn(move || handshake(s, peer, slot, sh2));
                if let Err(e) = spawned {
                    sh.log
                        .line(format_args!("{peer}: closed: no thread for it: {e}"));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let _ = zcio::sys::net::poll_one(&listener, libc::POLLIN, 200);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {}
            Err(e) => {
                // EMFILE, ENFILE, ENOBUFS, ENOMEM: the pending connection stays queued and
                // accept would fail again at once; wait for descriptors or memory to free.
                backoff = (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                sh.log.line(format_args!(
                    "accept failed: {e}; backing off {} ms",
                    backoff.as_millis()
                ));
                std::thread::sleep(backoff);
            }
        }
    }
    Ok(())
}

fn handshake(mut s: TcpStream, peer: SocketAddr, slot: Slot, sh: Arc<Shared>) {
    let hs = sh.cfg.handshake;
    let _ = s.set_nodelay(true);
    if s.set_read_timeout(Some(hs)).is_err() || s.set_write_timeout(Some(hs)).is_err() {
        return;
    }
    let hello: Hello = match proto::read_msg(&mut s) {
        Ok(h) => h,
        Err(e) => {
            sh.log
                .line(format_args!("{peer}: closed: bad hello: {e:#}"));
            return;
        }
    };
    match hello {
        Hello::Control { version, params } => {
            if version != proto::VERSION {
                let reason = format!(
                    "protocol version {version}; this server speaks {}",
                    proto::VERSION
                );
                let _ = proto::write_msg(
                    &mut s,
                    &Answer::Refuse {
                        reason: reason.clone(),
                    },
                );
                sh.log.line(format_args!("{peer}: refused: {reason}"));
                return;
            }
            match serde_json::from_value::<Params>(params) {
                Ok(p) => test(s, peer, p, slot, &sh),
                Err(e) => refuse(&mut s, peer, &sh, format!("bad test parameters: {e}")),
            }
        }
        Hello::Data { cookie, stream } => {
            let Some(c) = proto::parse_cookie(&cookie) else {
                sh.log
                    .line(format_args!("{peer}: closed: malformed test cookie"));
                return;
            };
            let tx = sh
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&c)
                .cloned();
            match tx {
                Some(tx) => {
                    let dc = DataConn {
                        stream,
                        sock: s,
                        peer,
                        _slot: slot,
                    };
                    if tx.send(dc).is_err() {
                        sh.log
                            .line(format_args!("{peer}: closed: its test is over"));
                    }
                }
                None => sh
                    .log
                    .line(format_args!("{peer}: closed: unknown test cookie")),
            }
        }
    }
}

/// Why a test cannot run with `p`, or `Ok`.
fn admit(p: &Params, cfg: &ServerConfig) -> Result<()> {
    p.check()?;
    if Duration::from_millis(p.duration_ms) > cfg.max_duration {
        bail!(
            "duration {} ms is longer than this server allows ({:?}, --max-duration)",
            p.duration_ms,
            cfg.max_duration
        );
    }
    if cfg.verify && !p.verify {
        bail!("this server checks every byte: run the client with --verify");
    }
    let per_stream = if p.reverse {
        p.send_memory()
    } else if p.udp {
        64 << 10
    } else {
        let rx = RxConfig::default();
        u64::from(rx.buf_size) * u64::from(rx.buffers)
    };
    let total = per_stream.saturating_mul(u64::from(p.streams));
    if total > cfg.max_mem {
        bail!(
            "the test needs {total} bytes of buffers, more than this server allows per client \
             ({} bytes, --max-client-mem)",
            cfg.max_mem
        );
    }
    Ok(())
}

/// The test's result line (JSON mode).
#[derive(Serialize)]
struct TestLine<'a> {
    peer: String,
    params: &'a Params,
    server: &'a SideReport,
    client: Option<&'a SideReport>,
    error: Option<String>,
}

fn refuse(s: &mut TcpStream, peer: SocketAddr, sh: &Shared, reason: String) {
    let _ = proto::write_msg(
        s,
        &Answer::Refuse {
            reason: reason.clone(),
        },
    );
    sh.log.line(format_args!("{peer}: refused: {reason}"));
}

fn test(mut ctl: TcpStream, peer: SocketAddr, p: Params, _slot: Slot, sh: &Arc<Shared>) {
    if let Err(e) = admit(&p, &sh.cfg) {
        return refuse(&mut ctl, peer, sh, format!("{e:#}"));
    }
    if sh.tests.fetch_add(1, Ordering::AcqRel) >= sh.cfg.max_tests {
        sh.tests.fetch_sub(1, Ordering::AcqRel);
        return refuse(
            &mut ctl,
            peer,
            sh,
            format!(
                "server busy: {} tests running (--max-tests)",
                sh.cfg.max_tests
            ),
        );
    }
    let _test = TestSlot(Arc::clone(sh));
    match run_test(&mut ctl, peer, &p, sh) {
        Ok(()) => {}
        Err(e) => {
            let reason = format!("{e:#}");
            let _ = proto::write_msg(
                &mut ctl,
                &Msg::Abort {
                    reason: reason.clone(),
                },
            );
            sh.log.line(format_args!("{peer}: test ended: {reason}"));
        }
    }
    if sh.cfg.once {
        sh.quit.store(true, Ordering::Release);
    }
    sh.served.fetch_add(1, Ordering::AcqRel);
}

/// Removes a test's cookie from the pending map when the test leaves its attach phase.
struct Pending<'a>(&'a Shared, [u8; 16]);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.1);
    }
}

enum Sock {
    Tcp(TcpStream),
    Udp(UdpSocket),
}

fn run_test(ctl: &mut TcpStream, peer: SocketAddr, p: &Params, sh: &Arc<Shared>) -> Result<()> {
    let cfg = &sh.cfg;
    let local = ctl.local_addr()?.ip();
    let cookie_hex = proto::new_cookie()?;
    let cookie = proto::parse_cookie(&cookie_hex).context("own cookie")?;
    let mut udp = Vec::new();
    if p.udp {
        for _ in 0..p.streams {
            udp.push(
                UdpSocket::bind((local, 0))
                    .with_context(|| format!("binding a UDP socket on {local}"))?,
            );
        }
    }
    let (tx, rx) = mpsc::channel();
    sh.pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(cookie, tx);
    let pending = Pending(sh, cookie);
    let ports = udp
        .iter()
        .map(|u| u.local_addr().map(|a| a.port()))
        .collect::<io::Result<Vec<u16>>>()?;
    proto::write_msg(
        ctl,
        &Answer::Accept {
            version: proto::VERSION,
            cookie: cookie_hex,
            udp_ports: ports,
            host: hostinfo::local(Some(local)),
        },
    )?;
    let socks = attach(p, peer, &rx, udp, cookie, cfg, sh)?;
    drop(pending);
    drop(rx);
    proto::write_msg(ctl, &Msg::Start)?;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let end = start + Duration::from_millis(p.duration_ms);
    let host_cpu = HostCpu::start();
    let mut threads = Vec::new();
    // Second handles on the TCP streams: shutting them down unblocks a stream thread stuck in
    // a blocking send or receive when the test must end (a client that stopped reading).
    let handles: Vec<TcpStream> = socks
        .iter()
        .filter_map(|(s, _)| match s {
            Sock::Tcp(t) => t.try_clone().ok(),
            Sock::Udp(_) => None,
        })
        .collect();
    let cut_all = || {
        for h in &handles {
            let _ = h.shutdown(std::net::Shutdown::Both);
        }
    };
    let mut cut = false;
    for (i, (sock, slot)) in socks.into_iter().enumerate() {
        let cpu = super::stream_cpu(cfg.cpu, i);
        let stop = Arc::clone(&stop);
        let progress = Arc::new(AtomicU64::new(0));
        let p = p.clone();
        let mut rxc = RxConfig::with_mode(
            cfg.rx
                .unwrap_or_else(|| p.rx.parse().unwrap_or(RxMode::Auto)),
        );
        rxc.zcrx = cfg.zcrx.clone();
        let idle = cfg.idle;
        let h = std::thread::Builder::new()
            .name(format!("perf-stream-{i}"))
            .spawn(move || {
                let _slot = slot;
                let i = i as u32;
                if p.reverse {
                    let mut o = sender_opts(&p, Some(cpu));
                    o.flush_timeout = idle;
                    o.stop = Some(stop);
                    o.progress = Some(progress);
                    match sock {
                        Sock::Tcp(s) => stream::send(s.into(), i, true, &o),
                        Sock::Udp(s) => stream::send(s.into(), i, false, &o),
                    }
                } else {
                    let o = RecvOpts {
                        stream: i,
                        verify: p.verify,
                        rx: rxc,
                        cpu: Some(cpu),
                        end,
                        idle,
                        progress,
                        stop,
                    };
                    match sock {
                        Sock::Tcp(s) => stream::recv_tcp(s, &o),
                        Sock::Udp(s) => stream::recv_udp(&s, &o),
                    }
                }
            })
            .context("starting a stream thread")?;
        threads.push(h);
    }
    // Watch the control connection while the streams run: the client's results may come
    // early (it finished sending); a closed or broken control connection stops the test.
    let mut client: Option<SideReport> = None;
    let mut ctl_error: Option<String> = None;
    while !threads.iter().all(|t| t.is_finished()) {
        // Past the end by more than the idle timeout (the sender's last completions had that
        // long), or the control connection is gone: stop, and cut streams that do not.
        let overdue = Instant::now() > end + cfg.idle + Duration::from_millis(500);
        if overdue || ctl_error.is_some() {
            stop.store(true, Ordering::Relaxed);
            if !cut {
                cut = true;
                cut_all();
            }
        }
        if ctl_error.is_some() || client.is_some() {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        match zcio::sys::net::poll_one(ctl, libc::POLLIN, 100) {
            Ok(0) => {}
            Ok(_) => {
                ctl.set_read_timeout(Some(cfg.idle))?;
                match proto::read_msg::<Msg>(ctl) {
                    Ok(Msg::Results(r)) => client = Some(*r),
                    Ok(m) => {
                        ctl_error = Some(format!("unexpected control message {m:?}"));
                        stop.store(true, Ordering::Relaxed);
                    }
                    Err(e) => {
                        ctl_error = Some(format!("control connection: {e:#}"));
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            }
            Err(e) => {
                ctl_error = Some(format!("control connection: {e}"));
                stop.store(true, Ordering::Relaxed);
            }
        }
    }
    let streams = super::stream::join_all(threads);
    let role = if p.reverse { "sender" } else { "receiver" };
    let rep = SideReport::total(role, hostinfo::local(Some(local)), streams, host_cpu.stop());
    let mut error = ctl_error.clone();
    if ctl_error.is_none() {
        ctl.set_write_timeout(Some(cfg.idle))?;
        if let Err(e) = proto::write_msg(ctl, &Msg::Results(Box::new(rep.clone()))) {
            error = Some(format!("sending results: {e:#}"));
        } else if client.is_none() {
            ctl.set_read_timeout(Some(cfg.idle))?;
            match proto::read_msg::<Msg>(ctl) {
                Ok(Msg::Results(r)) => client = Some(*r),
                Ok(m) => error = Some(format!("unexpected control message {m:?}")),
                Err(e) => error = Some(format!("waiting for the client's results: {e:#}")),
            }
        }
    }
    for s in &rep.streams {
        if let Some(e) = &s.error {
            let e = format!("stream {}: {e}", s.stream);
            sh.log.line(format_args!("{peer}: {e}"));
            error.get_or_insert(e);
        }
    }
    if cfg.json {
        let line = TestLine {
            peer: peer.to_string(),
            params: p,
            server: &rep,
            client: client.as_ref(),
            error: error.clone(),
        };
        println!("{}", serde_json::to_string(&line)?);
    } else {
        eprintln!(
            "zcio perf server: {peer}: {} {} stream(s) {} {:.2} s: {:.3} Gbit/s, {} bytes, \
             thread CPU {:.3} s/GB, host CPU {:.3} s/GB, {:.2} syscalls/op{}",
            if p.udp { "udp" } else { "tcp" },
            p.streams,
            if p.reverse { "sent" } else { "received" },
            rep.seconds,
            rep.gbit_s,
            rep.bytes,
            rep.cpu_s_per_gb,
            rep.host_cpu_s_per_gb,
            rep.syscalls_per_op,
            error.as_ref().map_or(String::new(), |e| format!("; {e}"))
        );
    }
    Ok(())
}

/// The sending side's options for a test.
pub fn sender_opts(p: &Params, cpu: Option<usize>) -> ClientOpts {
    let mode: TxMode = p.tx.parse().unwrap_or(TxMode::Auto);
    let mut o = ClientOpts::new(mode, p.len as usize, Duration::from_millis(p.duration_ms));
    o.depth = p.depth as usize;
    o.verify = p.verify;
    o.cpu = cpu;
    o.rate_bps = p.rate_bps;
    o.udp_end_marker = p.udp;
    o.udp_offsets = p.udp;
    o
}

/// Waits for the test's streams: TCP connections that presented the cookie, or UDP hellos.
/// Only the control connection's host may attach; duplicates and bad indexes are dropped.
#[allow(clippy::too_many_arguments)]
fn attach(
    p: &Params,
    peer: SocketAddr,
    rx: &mpsc::Receiver<DataConn>,
    udp: Vec<UdpSocket>,
    cookie: [u8; 16],
    cfg: &ServerConfig,
    sh: &Shared,
) -> Result<Vec<(Sock, Option<Slot>)>> {
    let deadline = Instant::now() + cfg.handshake;
    let n = p.streams as usize;
    let same_host = |ip: IpAddr| canonical(ip) == canonical(peer.ip());
    if !p.udp {
        let mut slots: Vec<Option<DataConn>> = (0..n).map(|_| None).collect();
        let mut have = 0;
        while have < n {
            let left = deadline.saturating_duration_since(Instant::now());
            let dc = match rx.recv_timeout(left) {
                Ok(dc) => dc,
                Err(_) => bail!(
                    "only {have} of {n} streams attached within {:?} (--handshake-timeout)",
                    cfg.handshake
                ),
            };
            let i = dc.stream as usize;
            if !same_host(dc.peer.ip()) {
                sh.log.line(format_args!(
                    "{}: closed: data stream for a test of {} from another host",
                    dc.peer,
                    peer.ip()
                ));
            } else if i >= n || slots[i].is_some() {
                sh.log.line(format_args!(
                    "{}: closed: stream index {} is out of range or taken (test has {n})",
                    dc.peer, dc.stream
                ));
            } else {
                slots[i] = Some(dc);
                have += 1;
            }
        }
        let mut out = Vec::new();
        for dc in slots.into_iter().flatten() {
            dc.sock.set_read_timeout(None)?;
            // A blocking send into a client that stopped reading gives up after the idle
            // timeout (the copy path sends with plain blocking send(2)).
            dc.sock.set_write_timeout(Some(cfg.idle))?;
            out.push((Sock::Tcp(dc.sock), Some(dc._slot)));
        }
        return Ok(out);
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 64];
    for (i, u) in udp.into_iter().enumerate() {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "UDP stream {i} sent no hello within {:?} (--handshake-timeout)",
                    cfg.handshake
                );
            }
            u.set_read_timeout(Some(left))?;
            let (len, from) = match u.recv_from(&mut buf) {
                Ok(x) => x,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(e.into()),
            };
            match proto::parse_udp_hello(&buf[..len]) {
                Some((c, s)) if c == cookie && s as usize == i && same_host(from.ip()) => {
                    u.connect(from)?;
                    break;
                }
                _ => {} // not this test's hello: ignored
            }
        }
        out.push((Sock::Udp(u), None));
    }
    Ok(out)
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ServerConfig {
        ServerConfig {
            verify: false,
            cpu: 0,
            once: false,
            rx: None,
            zcrx: None,
            json: false,
            max_conns: 4,
            max_tests: 1,
            max_mem: 64 << 20,
            max_duration: Duration::from_secs(60),
            handshake: Duration::from_secs(1),
            idle: Duration::from_secs(2),
        }
    }

    fn params() -> Params {
        Params {
            interval_ms: 0,
            ..proto::test_params()
        }
    }

    #[test]
    fn tests_over_the_servers_limits_are_refused_with_the_limit_named() {
        assert!(admit(&params(), &cfg()).is_ok());
        let long = Params {
            duration_ms: 3_600_000,
            ..params()
        };
        assert!(admit(&long, &cfg())
            .unwrap_err()
            .to_string()
            .contains("--max-duration"));
        let fat = Params {
            streams: 100,
            ..params()
        };
        assert!(admit(&fat, &cfg())
            .unwrap_err()
            .to_string()
            .contains("--max-client-mem"));
        let fat_sender = Params {
            reverse: true,
            len: 16 << 20,
            depth: 4096,
            ..params()
        };
        assert!(admit(&fat_sender, &cfg())
            .unwrap_err()
            .to_string()
            .contains("--max-client-mem"));
        let v = ServerConfig {
            verify: true,
            ..cfg()
        };
        assert!(admit(&params(), &v)
            .unwrap_err()
            .to_string()
            .contains("--verify"));
    }
}

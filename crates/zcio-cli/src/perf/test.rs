//! The client side of one test: control connection, streams, interval lines, both sides'
//! results. `zcio perf client` and `zcio bench --peer` both run tests through [`run_test`].

use super::hostinfo::{self, HostCpu};
use super::proto::{self, Answer, Hello, Msg, Params, SideReport, StreamReport};
use super::stream::{self, RecvOpts};
use super::{
    parse_duration, parse_rate, resolve, split_host_port, ClientArgs, Family, DEFAULT_PORT,
};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcio::rx::{RxConfig, RxMode};

/// What to run and where.
#[derive(Debug, Clone)]
pub struct TestSpec {
    /// Server host name or address.
    pub host: String,
    /// Server port.
    pub port: u16,
    /// Address family.
    pub family: Family,
    /// The test.
    pub params: Params,
    /// First CPU for this side's stream threads.
    pub cpu: usize,
    /// MSG_ZEROCOPY reap interval when this side sends.
    pub notify_limit: usize,
    /// io_uring sends per submit when this side sends.
    pub submit_batch: usize,
    /// Time to connect and to hear back from the server.
    pub timeout: Duration,
    /// UDP, this side sending: every stream is a peer (a server port) of one unconnected
    /// socket on one send ring (`--peers`), instead of a socket and a thread per stream.
    pub peers: bool,
}

impl TestSpec {
    /// A TCP test of `len`-byte writes for `duration` to `host:port`.
    pub fn new(host: &str, port: u16, params: Params) -> Self {
        Self {
            host: host.to_string(),
            port,
            family: Family::Any,
            params,
            cpu: 0,
            notify_limit: 32,
            submit_batch: 1,
            timeout: Duration::from_secs(10),
            peers: false,
        }
    }
}

/// One interval line.
#[derive(Debug, Clone, Serialize)]
pub struct Interval {
    /// Seconds since start.
    pub start: f64,
    /// Seconds since start.
    pub end: f64,
    /// Bytes per stream in this interval (this side's view: sent or received).
    pub bytes: Vec<u64>,
    /// Sum.
    pub sum_bytes: u64,
    /// Gbit/s over the interval.
    pub gbit_s: f64,
}

/// A finished test.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// [`proto::VERSION`].
    pub version: u32,
    /// Host name as given.
    pub host: String,
    /// The server address used.
    pub server_addr: SocketAddr,
    /// This side's local address.
    pub local_addr: SocketAddr,
    /// The test.
    pub params: Params,
    /// Interval lines.
    pub intervals: Vec<Interval>,
    /// This side.
    pub client: SideReport,
    /// The server's side.
    pub server: SideReport,
    /// UDP: bytes the sender completed that the receiver did not get.
    pub lost_bytes: Option<u64>,
    /// Errors of either side's streams, in words.
    pub errors: Vec<String>,
}

impl Outcome {
    /// The sending side's report.
    pub fn sender(&self) -> &SideReport {
        if self.params.reverse {
            &self.server
        } else {
            &self.client
        }
    }
    /// The receiving side's report.
    pub fn receiver(&self) -> &SideReport {
        if self.params.reverse {
            &self.client
        } else {
            &self.server
        }
    }
}

/// Connects the control connection to the first address of `host` that answers.
fn connect(spec: &TestSpec) -> Result<TcpStream> {
    let addrs = resolve(&spec.host, spec.port, spec.family)?;
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, spec.timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(anyhow::anyhow!("connecting to {a}: {e}")),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no address for {}", spec.host)))
}

/// Runs one test; `on_interval` sees each interval line as it happens.
pub fn run_test(spec: &TestSpec, on_interval: &mut dyn FnMut(&Interval)) -> Result<Outcome> {
    let p = &spec.params;
    p.check().context("test parameters")?;
    let mut ctl = connect(spec)?;
    ctl.set_nodelay(true)?;
    ctl.set_read_timeout(Some(spec.timeout))?;
    ctl.set_write_timeout(Some(spec.timeout))?;
    let server_addr = ctl.peer_addr()?;
    let local_addr = ctl.local_addr()?;
    proto::write_msg(&mut ctl, &Hello::control(p))?;
    let (cookie, ports, _server_host) = match proto::read_msg::<Answer>(&mut ctl)
        .with_context(|| format!("waiting for the server at {server_addr}"))?
    {
        Answer::Accept {
            version,
            cookie,
            udp_ports,
            host,
        } => {
            if version != proto::VERSION {
                bail!(
                    "server speaks protocol version {version}, this client {}",
                    proto::VERSION
                );
            }
            (cookie, udp_ports, host)
        }
        Answer::Refuse { reason } => bail!("server {server_addr} refused the test: {reason}"),
    };
    let cookie_b = proto::parse_cookie(&cookie).context("server sent a malformed cookie")?;
    let n = p.streams as usize;
    enum Sock {
        Tcp(TcpStream),
        Udp(UdpSocket),
        /// One unconnected socket for every stream's port (`--peers`).
        Peers(UdpSocket, Vec<SocketAddr>),
    }
    let mut socks = Vec::with_capacity(n);
    if spec.peers && (!p.udp || p.reverse) {
        bail!("--peers is for UDP tests where this side sends (-u, without -R)");
    }
    if spec.peers {
        if ports.len() != n {
            bail!("server offered {} UDP ports for {n} peers", ports.len());
        }
        let bind: SocketAddr = if server_addr.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let u = UdpSocket::bind(bind).context("binding a UDP socket")?;
        let dests = ports
            .iter()
            .map(|&port| SocketAddr::new(server_addr.ip(), port))
            .collect();
        socks.push(Sock::Peers(u, dests));
    } else if p.udp {
        if ports.len() != n {
            bail!("server offered {} UDP ports for {n} streams", ports.len());
        }
        for &port in &ports {
            let bind: SocketAddr = if server_addr.is_ipv4() {
                (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
            } else {
                (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let u = UdpSocket::bind(bind).context("binding a UDP socket")?;
            u.connect((server_addr.ip(), port))
                .with_context(|| format!("connecting UDP to {}:{port}", server_addr.ip()))?;
            socks.push(Sock::Udp(u));
        }
    } else {
        for i in 0..n {
            let mut s = TcpStream::connect_timeout(&server_addr, spec.timeout)
                .with_context(|| format!("opening stream {i} to {server_addr}"))?;
            s.set_write_timeout(Some(spec.timeout))?;
            proto::write_msg(
                &mut s,
                &Hello::Data {
                    cookie: cookie.clone(),
                    stream: i as u32,
                },
            )?;
            // Kept: a blocking send into a server that stopped reading gives up.
            socks.push(Sock::Tcp(s));
        }
    }
    // Wait for Start; UDP streams repeat their hello until it comes (datagrams get lost).
    let deadline = Instant::now() + spec.timeout;
    loop {
        if Instant::now() > deadline {
            bail!(
                "the server did not start the test within {:?}",
                spec.timeout
            );
        }
        for (i, s) in socks.iter().enumerate() {
            match s {
                Sock::Udp(u) => {
                    let _ = u.send(&proto::udp_hello(&cookie_b, i as u32));
                }
                Sock::Peers(u, dests) => {
                    for (k, d) in dests.iter().enumerate() {
                        let _ = u.send_to(&proto::udp_hello(&cookie_b, k as u32), d);
                    }
                }
                Sock::Tcp(_) => {}
            }
        }
        if zcio::sys::net::poll_one(&ctl, libc::POLLIN, 100)? == 0 {
            continue;
        }
        match proto::read_msg::<Msg>(&mut ctl)? {
            Msg::Start => break,
            Msg::Abort { reason } => bail!("server aborted the test: {reason}"),
            m => bail!("unexpected message from the server: {m:?}"),
        }
    }
    let start = Instant::now();
    let end = start + Duration::from_millis(p.duration_ms);
    let stop = Arc::new(AtomicBool::new(false));
    let progress: Vec<Arc<AtomicU64>> = (0..n).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let host_cpu = HostCpu::start();
    // Second handles on the TCP streams, to cut streams stuck on a server that stopped.
    let handles: Vec<TcpStream> = socks
        .iter()
        .filter_map(|s| match s {
            Sock::Tcp(t) => t.try_clone().ok(),
            Sock::Udp(_) | Sock::Peers(..) => None,
        })
        .collect();
    let mut cut = false;
    let mut threads = Vec::with_capacity(n);
    for (i, sock) in socks.into_iter().enumerate() {
        let cpu = super::stream_cpu(spec.cpu, i);
        let stop = Arc::clone(&stop);
        let prog = Arc::clone(&progress[i]);
        let all_progress = progress.clone();
        let p = p.clone();
        let (notify_limit, batch) = (spec.notify_limit, spec.submit_batch);
        let idle = spec.timeout;
        let h = std::thread::Builder::new()
            .name(format!("perf-stream-{i}"))
            .spawn(move || -> Vec<StreamReport> {
                let i = i as u32;
                if p.reverse {
                    let o = RecvOpts {
                        stream: i,
                        verify: p.verify,
                        rx: RxConfig::with_mode(p.rx.parse().unwrap_or(RxMode::Auto)),
                        cpu: Some(cpu),
                        end,
                        idle,
                        progress: prog,
                        stop,
                    };
                    vec![match sock {
                        Sock::Tcp(s) => stream::recv_tcp(s, &o),
                        Sock::Udp(u) => stream::recv_udp(&u, &o),
                        Sock::Peers(..) => unreachable!("refused above for -R"),
                    }]
                } else {
                    let mut o = super::server::sender_opts(&p, Some(cpu));
                    o.notify_limit = notify_limit.max(1);
                    o.submit_batch = batch.max(1);
                    o.progress = Some(prog);
                    o.stop = Some(stop);
                    match sock {
                        Sock::Tcp(s) => vec![stream::send(s.into(), i, true, &o)],
                        Sock::Udp(u) => vec![stream::send(u.into(), i, false, &o)],
                        Sock::Peers(u, dests) => {
                            o.progress = None;
                            // -b is per stream, i.e. per peer.
                            o.rate_bps = o.rate_bps.saturating_mul(dests.len() as u64);
                            // The ring batches across peers: at least 16 trains per enter.
                            o.submit_batch = o.submit_batch.max(16);
                            stream::send_peers(u.into(), &dests, &o, &all_progress)
                        }
                    }
                }
            })
            .context("starting a stream thread")?;
        threads.push(h);
    }
    // Interval lines from this side's counters.
    let mut intervals = Vec::new();
    let step = Duration::from_millis(p.interval_ms);
    let mut last_t = 0.0;
    let mut last: Vec<u64> = vec![0; n];
    let mut next = start + step;
    while !threads.iter().all(|t| t.is_finished()) {
        std::thread::sleep(Duration::from_millis(20));
        if !cut && Instant::now() > end + spec.timeout * 2 {
            cut = true;
            stop.store(true, Ordering::Relaxed);
            for h in &handles {
                let _ = h.shutdown(std::net::Shutdown::Both);
            }
        }
        if p.interval_ms > 0 && Instant::now() >= next {
            next += step;
            let now: Vec<u64> = progress.iter().map(|a| a.load(Ordering::Relaxed)).collect();
            let t = start.elapsed().as_secs_f64();
            let bytes: Vec<u64> = now
                .iter()
                .zip(&last)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect();
            let sum: u64 = bytes.iter().sum();
            let iv = Interval {
                start: last_t,
                end: t,
                bytes,
                sum_bytes: sum,
                gbit_s: sum as f64 * 8.0 / (t - last_t).max(1e-9) / 1e9,
            };
            on_interval(&iv);
            intervals.push(iv);
            last = now;
            last_t = t;
        }
    }
    let streams = super::stream::join_all_vec(threads);
    let role = if p.reverse { "receiver" } else { "sender" };
    let client = SideReport::total(
        role,
        hostinfo::local(Some(local_addr.ip())),
        streams,
        host_cpu.stop(),
    );
    ctl.set_write_timeout(Some(spec.timeout))?;
    proto::write_msg(&mut ctl, &Msg::Results(Box::new(client.clone())))?;
    // The server reports once its own streams are done (at most its idle timeout later).
    ctl.set_read_timeout(Some(spec.timeout * 3))?;
    let server =
        match proto::read_msg::<Msg>(&mut ctl).context("waiting for the server's results")? {
            Msg::Results(r) => *r,
            Msg::Abort { reason } => bail!("server aborted the test: {reason}"),
            m => bail!("unexpected message from the server: {m:?}"),
        };
    let mut errors = Vec::new();
    for (side, r) in [("client", &client), ("server", &server)] {
        for s in &r.streams {
            if let Some(e) = &s.error {
                errors.push(format!("{side} stream {}: {e}", s.stream));
            }
        }
    }
    let lost_bytes = p.udp.then(|| {
        let (tx, rx) = if p.reverse {
            (&server, &client)
        } else {
            (&client, &server)
        };
        tx.bytes.saturating_sub(rx.bytes)
    });
    Ok(Outcome {
        version: proto::VERSION,
        host: spec.host.clone(),
        server_addr,
        local_addr,
        params: p.clone(),
        intervals,
        client,
        server,
        lost_bytes,
        errors,
    })
}

/// `zcio perf client`: parses the CLI, runs the test, prints both sides.
pub fn run(a: ClientArgs) -> Result<()> {
    let given = a
        .host
        .clone()
        .or(a.connect.clone())
        .context("no server given: zcio perf client HOST [-p PORT]")?;
    let (host, port_in) = split_host_port(&given)?;
    let port = a.port.or(port_in).unwrap_or(DEFAULT_PORT);
    let tx: zcio::tx::TxMode = a.tx.parse().map_err(anyhow::Error::msg)?;
    let rx: RxMode =
        a.rx.parse()
            .map_err(|e: String| anyhow::anyhow!("--rx {}: {e}", a.rx))?;
    let len = match &a.len {
        Some(l) => crate::util::parse_size(l).map_err(anyhow::Error::msg)?,
        None if a.udp => 1400,
        None => 128 << 10,
    };
    let shown = a.len.as_deref().unwrap_or("");
    if len == 0 {
        bail!("bad size '{shown}': must be at least 1 byte");
    }
    if len as u64 > proto::MAX_LEN {
        bail!("bad size '{shown}': at most {} bytes", proto::MAX_LEN);
    }
    if a.depth == 0 {
        bail!("bad --depth 0: at least one send must be in flight");
    }
    let duration = parse_duration(&a.time)?;
    let interval = match a.interval.trim() {
        "0" | "0s" => Duration::ZERO,
        s => parse_duration(s)?,
    };
    let params = Params {
        udp: a.udp,
        streams: a.peers.unwrap_or(a.parallel),
        duration_ms: duration.as_millis().max(1) as u64,
        reverse: a.reverse,
        len: len as u64,
        rate_bps: match &a.bitrate {
            Some(b) => parse_rate(b)?,
            None if a.udp => 1_000_000,
            None => 0,
        },
        tx: tx.to_string(),
        rx: a.rx.clone(),
        verify: a.verify,
        depth: a.depth.min(4096) as u32,
        interval_ms: interval.as_millis() as u64,
    };
    let _ = rx;
    params.check()?;
    let mut spec = TestSpec::new(&host, port, params);
    spec.family = if a.ipv4 {
        Family::V4
    } else if a.ipv6 {
        Family::V6
    } else {
        Family::Any
    };
    spec.cpu = a.cpu.unwrap_or(0);
    spec.notify_limit = a.notify_limit;
    spec.submit_batch = a.batch;
    spec.peers = a.peers.is_some();
    let json = a.json;
    let streams = a.peers.unwrap_or(a.parallel);
    if !json {
        println!(
            "Connecting to host {host}, port {port}: {} {} {}, {:?}{}",
            if a.udp { "UDP" } else { "TCP" },
            streams,
            if a.peers.is_some() {
                "peer(s) from one socket"
            } else {
                "stream(s)"
            },
            duration,
            if a.reverse {
                " (reverse: the server sends)"
            } else {
                ""
            }
        );
        if !interval.is_zero() {
            println!("[ ID] Interval           Transfer      Bitrate");
        }
    }
    let out = run_test(&spec, &mut |iv| {
        if json {
            return;
        }
        if iv.bytes.len() > 1 {
            for (i, b) in iv.bytes.iter().enumerate() {
                println!(
                    "[{i:>3}] {:>6.2}-{:<6.2} sec {:>9} {:>8.3} Gbit/s",
                    iv.start,
                    iv.end,
                    bytes_label(*b),
                    *b as f64 * 8.0 / (iv.end - iv.start).max(1e-9) / 1e9
                );
            }
        }
        println!(
            "[SUM] {:>6.2}-{:<6.2} sec {:>9} {:>8.3} Gbit/s",
            iv.start,
            iv.end,
            bytes_label(iv.sum_bytes),
            iv.gbit_s
        );
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_outcome(&out);
    }
    if !out.errors.is_empty() {
        bail!("{}", out.errors.join("; "));
    }
    Ok(())
}

fn bytes_label(b: u64) -> String {
    let b = b as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else {
        format!("{:.1} KB", b / 1e3)
    }
}

fn print_outcome(o: &Outcome) {
    println!("- - - - - - - - - - - - - - - - - - - - - - - - -");
    println!(
        "{} {} -> {} ({}), {} stream(s), {} byte writes",
        if o.params.udp { "UDP" } else { "TCP" },
        o.local_addr,
        o.server_addr,
        o.host,
        o.params.streams,
        o.params.len
    );
    for (name, r) in [("sender", o.sender()), ("receiver", o.receiver())] {
        let side = if std::ptr::eq(r, &o.client) {
            "client"
        } else {
            "server"
        };
        let path = r.streams.first().map_or(String::new(), |s| s.path.clone());
        println!(
            "{name:<8} {side} {} (kernel {}, {}): {} in {:.2} s = {:.3} Gbit/s; CPU {:.3} s/GB \
             (stream threads), {:.3} s/GB (whole host); {:.2} syscalls/op; path {path}{}{}",
            r.host.hostname,
            r.host.kernel,
            r.host.nic,
            bytes_label(r.bytes),
            r.seconds,
            r.gbit_s,
            r.cpu_s_per_gb,
            r.host_cpu_s_per_gb,
            r.syscalls_per_op,
            r.retransmits
                .map_or(String::new(), |x| format!("; {x} retransmits")),
            if name == "sender" {
                r.copied_fraction
                    .map_or("; COPIED n/a (no zero-copy attempted)".to_string(), |f| {
                        format!("; COPIED {:.1}%", f * 100.0)
                    })
            } else {
                String::new()
            }
        );
        for s in &r.streams {
            for f in &s.fallbacks {
                println!("         stream {} fallback: {f}", s.stream);
            }
        }
    }
    if let Some(l) = o.lost_bytes {
        let sent = o.sender().bytes.max(1);
        println!(
            "UDP: {} of {} bytes lost ({:.2}%)",
            l,
            o.sender().bytes,
            l as f64 * 100.0 / sent as f64
        );
    }
    if o.sender().copied_fraction.is_some_and(|f| f > 0.99) {
        println!(
            "note: the kernel copied every zero-copy send on this path (local delivery or a \
             device without scatter-gather): zero-copy cannot pay here"
        );
    }
    for e in &o.errors {
        println!("error: {e}");
    }
}

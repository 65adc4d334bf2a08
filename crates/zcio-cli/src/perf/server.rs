//! The perf server: plain blocking reads, optional stream verification.

use super::{parse_test_addr, pattern, ServerArgs};
use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};
use zcio::rx::{ConnId, Receiver, RxConfig, RxEvent, RxMode};

/// What one connection (or UDP stream) delivered.
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
    /// UDP: bytes missing between datagrams (lost or reordered).
    pub gap_bytes: u64,
    /// TCP receive path that delivered the data.
    pub rx_path: String,
    /// Syscalls the receiver made so far (all connections).
    pub syscalls: u64,
    /// Fraction of the received bytes the kernel copied (TCP): 1.0 for plain, bufring and
    /// device-less zcrx (the kernel copies into the zcrx area), 0.0 for NIC zcrx (whose own
    /// copy fallback the kernel does not report).
    pub copied_fraction: Option<f64>,
}

/// Parses the CLI and serves.
pub fn run(a: ServerArgs) -> Result<()> {
    let addr = parse_test_addr(&a.bind)?;
    if let Some(cpu) = a.cpu {
        zcio::sys::pin_thread(cpu).with_context(|| format!("pinning to CPU {cpu}"))?;
    }
    let emit = |r: &RecvReport| -> Result<()> {
        if a.json {
            println!("{}", serde_json::to_string(r)?);
        } else {
            println!(
                "{}: {} bytes in {:.2} s = {:.2} Gbit/s, {} reads, receiver CPU {:.2} s{}{}{}",
                r.peer,
                r.bytes,
                r.seconds,
                r.gbit_s,
                r.reads,
                r.cpu_s,
                if r.verified { ", verified" } else { "" },
                r.corrupt_at
                    .map_or(String::new(), |o| format!(", CORRUPT at offset {o}")),
                match (r.rx_path.as_str(), r.copied_fraction) {
                    ("", _) => String::new(),
                    ("zcrx-nodev", _) => ", path zcrx-nodev (device-less: the kernel copied \
                                         every byte into the zcrx area, COPIED 1.0)"
                        .to_string(),
                    (p, Some(f)) => format!(", path {p}, COPIED {f:.2}"),
                    (p, None) => format!(", path {p}"),
                }
            );
        }
        Ok(())
    };
    if a.udp {
        let s = UdpSocket::bind(addr).with_context(|| format!("binding UDP {addr}"))?;
        eprintln!("zcio perf server: UDP on {}", s.local_addr()?);
        loop {
            let r = serve_udp(&s, a.verify)?;
            emit(&r)?;
            if r.corrupt_at.is_some() {
                anyhow::bail!("stream corrupt at offset {}", r.corrupt_at.unwrap_or(0));
            }
            if a.once {
                return Ok(());
            }
        }
    }
    let l = TcpListener::bind(addr).with_context(|| format!("listening on {addr}"))?;
    let mode: RxMode =
        a.rx.parse()
            .map_err(|e| anyhow::anyhow!("--rx {}: {e}", a.rx))?;
    let mut cfg = RxConfig::with_mode(mode);
    if let Some(q) = &a.zcrx_queue {
        let (iface, queue) = q
            .split_once(':')
            .and_then(|(i, n)| Some((i, n.parse::<u32>().ok()?)))
            .ok_or_else(|| anyhow::anyhow!("--zcrx-queue {q}: expected IF:QUEUE, e.g. eth0:3"))?;
        cfg.zcrx = Some(zcio::rx::ZcrxTarget::new(iface, queue));
    }
    eprintln!("zcio perf server: TCP on {}", l.local_addr()?);
    let mut rx = Receiver::listen(l, &cfg).context("setting up the receiver")?;
    eprintln!("zcio perf server: receive path {}", rx.path().name());
    for f in rx.fallbacks() {
        eprintln!("zcio perf server: fallback {f}");
    }
    let mut conns: HashMap<ConnId, Conn> = HashMap::new();
    let mut done: Vec<RecvReport> = Vec::new();
    loop {
        rx.poll(Duration::from_millis(200), &mut |ev| match ev {
            RxEvent::Accepted(id) => {
                conns.insert(id, Conn::new(a.verify));
            }
            RxEvent::Data(chunk) => {
                let c = conns
                    .entry(chunk.conn())
                    .or_insert_with(|| Conn::new(a.verify));
                c.take(&chunk);
            }
            RxEvent::Closed(id, err) => {
                if let Some(c) = conns.remove(&id) {
                    let mut r = c.finish();
                    r.peer = format!(
                        "connection {id:?}{}",
                        err.map(|e| format!(" ({e})")).unwrap_or_default()
                    );
                    done.push(r);
                }
            }
        })?;
        for mut r in done.drain(..) {
            r.rx_path = rx.path().name().to_string();
            r.syscalls = rx.counters().syscalls;
            let c = rx.counters();
            r.copied_fraction = if rx.path().copies() {
                Some(1.0)
            } else if c.bytes > 0 {
                Some(c.copy_fallback_bytes as f64 / c.bytes as f64)
            } else {
                None
            };
            emit(&r)?;
            if r.corrupt_at.is_some() {
                anyhow::bail!("stream corrupt at offset {}", r.corrupt_at.unwrap_or(0));
            }
            if a.once {
                return Ok(());
            }
        }
    }
}

/// One TCP connection's receive state.
struct Conn {
    r: RecvReport,
    t0: Option<Instant>,
    cpu0: Duration,
}

impl Conn {
    fn new(verify: bool) -> Self {
        Self {
            r: RecvReport {
                verified: verify,
                ..RecvReport::default()
            },
            t0: None,
            cpu0: zcio::sys::thread_cpu_time(),
        }
    }

    fn take(&mut self, data: &[u8]) {
        self.t0.get_or_insert_with(Instant::now);
        if self.r.verified && self.r.corrupt_at.is_none() {
            if let Err(o) = pattern::check(data, self.r.bytes) {
                self.r.corrupt_at = Some(o);
            }
        }
        self.r.bytes += data.len() as u64;
        self.r.reads += 1;
    }

    fn finish(mut self) -> RecvReport {
        finish(&mut self.r, self.t0, self.cpu0);
        self.r
    }
}

/// Receives one TCP connection to EOF with blocking reads; checks the pattern with `verify`.
/// The tx and notify bench suites use it as their plain sink.
pub fn serve_conn(s: &mut TcpStream, verify: bool) -> io::Result<RecvReport> {
    let mut buf = vec![0u8; 1 << 20];
    let mut r = RecvReport {
        verified: verify,
        ..RecvReport::default()
    };
    let cpu0 = zcio::sys::thread_cpu_time();
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
    finish(&mut r, t0, cpu0);
    Ok(r)
}

/// Receives datagrams until an empty one (the client's end marker) or 3 s of silence after
/// data. With `verify`, each datagram's first 8 bytes are its stream offset and the rest must
/// match the pattern there.
pub fn serve_udp(s: &UdpSocket, verify: bool) -> io::Result<RecvReport> {
    let mut buf = vec![0u8; 65536];
    let mut r = RecvReport {
        verified: verify,
        ..RecvReport::default()
    };
    s.set_read_timeout(None)?;
    let cpu0 = zcio::sys::thread_cpu_time();
    let mut t0 = None;
    let mut expect = 0u64;
    loop {
        let (n, peer) = match s.recv_from(&mut buf) {
            Ok(x) => x,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            Err(e) => return Err(e),
        };
        if n == 0 {
            if t0.is_some() {
                break;
            }
            continue;
        }
        if t0.is_none() {
            t0 = Some(Instant::now());
            r.peer = peer.to_string();
            s.set_read_timeout(Some(Duration::from_secs(3)))?;
        }
        if verify && n >= 8 {
            let off = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
            if off > expect {
                r.gap_bytes += off - expect;
            }
            expect = off + n as u64;
            if r.corrupt_at.is_none() {
                if let Err(o) = pattern::check(&buf[8..n], off + 8) {
                    r.corrupt_at = Some(o);
                }
            }
        }
        r.bytes += n as u64;
        r.reads += 1;
    }
    finish(&mut r, t0, cpu0);
    Ok(r)
}

fn finish(r: &mut RecvReport, t0: Option<Instant>, cpu0: Duration) {
    r.seconds = t0.map_or(0.0, |t| t.elapsed().as_secs_f64());
    r.gbit_s = if r.seconds > 0.0 {
        r.bytes as f64 * 8.0 / r.seconds / 1e9
    } else {
        0.0
    };
    r.cpu_s = (zcio::sys::thread_cpu_time() - cpu0).as_secs_f64();
}

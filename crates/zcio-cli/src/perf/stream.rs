//! One data stream on one thread: the sending side (a [`zcio::tx::Sender`] through
//! [`drive`]) and the receiving sides (a [`Receiver`] for TCP, plain `recv` for UDP). Used by
//! both the perf client and the perf server.

use super::client::{drive, ClientOpts};
use super::pattern;
use super::proto::StreamReport;
use std::io;
use std::net::{TcpStream, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcio::rx::{Receiver, RxConfig, RxEvent};

/// Largest stream offset a UDP datagram may carry (2^56 bytes: far beyond any test).
pub const MAX_UDP_OFFSET: u64 = 1 << 56;

/// How a receiving stream runs.
#[derive(Debug, Clone)]
pub struct RecvOpts {
    /// Stream index.
    pub stream: u32,
    /// Check the pattern.
    pub verify: bool,
    /// Receive path (TCP).
    pub rx: RxConfig,
    /// Pin to this CPU.
    pub cpu: Option<usize>,
    /// When the sender is due to stop.
    pub end: Instant,
    /// A stream silent this long is dropped; also the grace past `end`.
    pub idle: Duration,
    /// Bytes so far.
    pub progress: Arc<AtomicU64>,
    /// Stop now (test aborted).
    pub stop: Arc<AtomicBool>,
}

fn pin(cpu: Option<usize>, r: &mut StreamReport) {
    if let Some(c) = cpu {
        match zcio_testnet::cpu::pin_thread(c) {
            Ok(()) => r.cpu = Some(c),
            Err(e) => r.fallbacks.push(format!("not pinned to CPU {c}: {e}")),
        }
    }
}

fn finish(r: &mut StreamReport, t0: Option<Instant>, cpu0: Duration) {
    r.seconds = t0.map_or(0.0, |t| t.elapsed().as_secs_f64());
    r.gbit_s = if r.seconds > 0.0 {
        r.bytes as f64 * 8.0 / r.seconds / 1e9
    } else {
        0.0
    };
    r.cpu_s = (zcio_testnet::cpu::thread_cpu_time() - cpu0).as_secs_f64();
}

/// Sends on `sock` with `opts` (its `cpu`, `progress` and `stop` included).
pub fn send(sock: OwnedFd, stream: u32, tcp: bool, opts: &ClientOpts) -> StreamReport {
    let mut r = StreamReport {
        stream,
        verified: opts.verify,
        ..StreamReport::default()
    };
    // A second descriptor for the same socket: TCP_INFO after the sender is gone.
    let info_fd = if tcp { sock.try_clone().ok() } else { None };
    match drive(sock, opts) {
        Ok(rep) => {
            r.bytes = rep.bytes;
            r.seconds = rep.seconds;
            r.gbit_s = rep.gbit_s;
            r.cpu_s = rep.cpu_s;
            r.cpu = opts.cpu;
            r.ops = rep.sends;
            r.syscalls = rep.counters.syscalls;
            r.notify_syscalls = rep.stats.notify_syscalls;
            r.path = rep.path.clone();
            r.copied_fraction = rep.copied_fraction;
            r.fallbacks = rep.fallbacks.iter().map(|f| f.to_string()).collect();
            if rep.errors > 0 {
                r.error = Some(format!("{} sends failed", rep.errors));
            }
        }
        Err(e) => r.error = Some(format!("{e:#}")),
    }
    if let Some(fd) = info_fd {
        if let Ok(ti) = zcio::sys::net::tcp_info(&fd) {
            r.retransmits = Some(ti.total_retrans);
        }
        // The end of the stream, whatever other handles the caller keeps on the socket.
        let _ = TcpStream::from(fd).shutdown(std::net::Shutdown::Write);
    }
    if let Some(p) = &opts.progress {
        p.store(r.bytes, Ordering::Relaxed);
    }
    r
}

/// Sends to every peer in `dests` from one unconnected UDP socket (`zcio perf -u --peers`):
/// one report per peer (its bytes); the sending thread's CPU time and system calls are in
/// the first one (they are shared), the path and fallbacks in each.
pub fn send_peers(
    sock: OwnedFd,
    dests: &[std::net::SocketAddr],
    opts: &ClientOpts,
    progress: &[Arc<AtomicU64>],
) -> Vec<StreamReport> {
    let mut reports: Vec<StreamReport> = (0..dests.len())
        .map(|i| StreamReport {
            stream: i as u32,
            verified: opts.verify,
            ..StreamReport::default()
        })
        .collect();
    match super::client::drive_peers(sock, dests, opts, progress) {
        Ok((rep, per_peer)) => {
            for (i, r) in reports.iter_mut().enumerate() {
                r.bytes = per_peer[i];
                r.seconds = rep.seconds;
                r.gbit_s = per_peer[i] as f64 * 8.0 / rep.seconds.max(1e-9) / 1e9;
                r.cpu = opts.cpu;
                r.path = rep.path.clone();
                r.copied_fraction = rep.copied_fraction;
                if i == 0 {
                    r.fallbacks = rep.fallbacks.iter().map(|f| f.to_string()).collect();
                    r.cpu_s = rep.cpu_s;
                    r.ops = rep.sends;
                    r.syscalls = rep.counters.syscalls;
                    r.notify_syscalls = rep.stats.notify_syscalls;
                }
                if rep.errors > 0 {
                    r.error = Some(format!("{} sends failed", rep.errors));
                }
            }
        }
        Err(e) => {
            for r in &mut reports {
                r.error = Some(format!("{e:#}"));
            }
        }
    }
    reports
}

/// Receives one TCP stream to its end through a [`Receiver`].
pub fn recv_tcp(s: TcpStream, o: &RecvOpts) -> StreamReport {
    let mut r = StreamReport {
        stream: o.stream,
        verified: o.verify,
        ..StreamReport::default()
    };
    pin(o.cpu, &mut r);
    let cpu0 = zcio_testnet::cpu::thread_cpu_time();
    let mut t0 = None;
    let mut rx = match Receiver::new(&o.rx) {
        Ok(rx) => rx,
        Err(e) => {
            r.error = Some(format!("setting up the receiver: {e}"));
            return r;
        }
    };
    r.fallbacks = rx.fallbacks().iter().map(|f| f.to_string()).collect();
    let id = match rx.add(s) {
        Ok(id) => id,
        Err(e) => {
            r.error = Some(format!("adding the connection: {e}"));
            return r;
        }
    };
    let mut last = Instant::now();
    loop {
        let ev = match rx.next_event(Duration::from_millis(200)) {
            Ok(ev) => ev,
            Err(e) => {
                r.error = Some(format!("receiving: {e}"));
                break;
            }
        };
        match ev {
            Some(RxEvent::Data(chunk)) => {
                last = Instant::now();
                t0.get_or_insert(last);
                if o.verify {
                    if let Err(at) = pattern::check(&chunk, r.bytes) {
                        r.corrupt_at = Some(at);
                        r.error = Some(format!("stream corrupt at offset {at}"));
                        rx.close(id);
                        break;
                    }
                }
                r.bytes += chunk.len() as u64;
                r.ops += 1;
                o.progress.store(r.bytes, Ordering::Relaxed);
            }
            Some(RxEvent::Closed(_, err)) => {
                if let Some(e) = err {
                    r.error = Some(format!("connection ended by an error: {e}"));
                }
                break;
            }
            Some(RxEvent::Accepted(_)) => {}
            None => {
                let now = Instant::now();
                if o.stop.load(Ordering::Relaxed) {
                    r.error = Some("test stopped".into());
                    rx.close(id);
                    break;
                }
                if now.duration_since(last) > o.idle {
                    r.error = Some(format!("no data for {:?}", o.idle));
                    rx.close(id);
                    break;
                }
                if now > o.end + o.idle {
                    r.error = Some(format!("still open {:?} after the test's end", o.idle));
                    rx.close(id);
                    break;
                }
            }
        }
    }
    r.path = rx.path().name().to_string();
    let c = rx.stats();
    r.syscalls = c.syscalls;
    // Receive side: plain and buffer-ring receives copy every byte, and so does device-less
    // zcrx (the kernel copies into the zcrx area); only NIC zcrx delivers bytes uncopied.
    if r.bytes > 0 {
        r.copied_fraction = Some(1.0 - c.zerocopy_bytes.min(r.bytes) as f64 / r.bytes as f64);
    }
    finish(&mut r, t0, cpu0);
    r
}

/// Receives one UDP stream on a connected socket, until the sender's empty end datagram,
/// half a second of silence after the test's end, or a timeout. Each datagram's first 8
/// bytes are its stream offset (checked: a datagram whose offset and length leave the
/// possible range ends the stream with an error); gaps between offsets count as lost.
pub fn recv_udp(s: &UdpSocket, o: &RecvOpts) -> StreamReport {
    let mut r = StreamReport {
        stream: o.stream,
        verified: o.verify,
        path: "recv".into(),
        ..StreamReport::default()
    };
    pin(o.cpu, &mut r);
    let cpu0 = zcio_testnet::cpu::thread_cpu_time();
    let mut t0 = None;
    let mut buf = vec![0u8; 65536];
    let mut expect = 0u64;
    let mut last = Instant::now();
    if let Err(e) = s.set_read_timeout(Some(Duration::from_millis(100))) {
        r.error = Some(format!("setting a read timeout: {e}"));
        return r;
    }
    loop {
        r.syscalls += 1;
        match s.recv(&mut buf) {
            Ok(0) => {
                if t0.is_some() || Instant::now() > o.end {
                    break;
                }
            }
            Ok(n) => {
                last = Instant::now();
                t0.get_or_insert(last);
                if super::proto::parse_udp_hello(&buf[..n]).is_some() {
                    // A repeated hello that arrived after the start.
                    continue;
                }
                if let Err(e) = take_datagram(&buf[..n], o.verify, &mut expect, &mut r) {
                    r.error = Some(e);
                    break;
                }
                o.progress.store(r.bytes, Ordering::Relaxed);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                let now = Instant::now();
                if o.stop.load(Ordering::Relaxed) {
                    break;
                }
                if now > o.end && now.duration_since(last) > Duration::from_millis(500) {
                    break;
                }
                if now.duration_since(last) > o.idle {
                    r.error = Some(format!("no datagram for {:?}", o.idle));
                    break;
                }
            }
            // ICMP port unreachable from the peer: the sender is gone.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                if Instant::now() > o.end {
                    break;
                }
                r.error = Some(format!("peer gone: {e}"));
                break;
            }
            Err(e) => {
                r.error = Some(format!("receiving: {e}"));
                break;
            }
        }
    }
    finish(&mut r, t0, cpu0);
    r
}

/// Accounts one datagram: its offset header is checked before any arithmetic on it.
pub fn take_datagram(
    d: &[u8],
    verify: bool,
    expect: &mut u64,
    r: &mut StreamReport,
) -> Result<(), String> {
    let n = d.len() as u64;
    r.bytes += n;
    r.ops += 1;
    if d.len() < 8 {
        return Ok(());
    }
    let off = u64::from_le_bytes(d[..8].try_into().expect("8 bytes"));
    if off > MAX_UDP_OFFSET {
        return Err(format!(
            "datagram carries stream offset {off}, beyond {MAX_UDP_OFFSET}"
        ));
    }
    if off > *expect {
        r.gap_bytes += off - *expect;
    }
    *expect = (*expect).max(off + n);
    if verify && r.corrupt_at.is_none() {
        if let Err(at) = pattern::check(&d[8..], off + 8) {
            r.corrupt_at = Some(at);
            return Err(format!("stream corrupt at offset {at}"));
        }
    }
    Ok(())
}

/// Joins the stream threads of one side; a thread that panicked becomes a report with the
/// error. In stream order.
pub fn join_all(threads: Vec<std::thread::JoinHandle<StreamReport>>) -> Vec<StreamReport> {
    let mut streams: Vec<StreamReport> = threads
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            t.join().unwrap_or_else(|_| StreamReport {
                stream: i as u32,
                error: Some("stream thread panicked".into()),
                ..StreamReport::default()
            })
        })
        .collect();
    streams.sort_by_key(|s| s.stream);
    streams
}

/// [`join_all`] for threads that each report one stream or several (`--peers`).
pub fn join_all_vec(threads: Vec<std::thread::JoinHandle<Vec<StreamReport>>>) -> Vec<StreamReport> {
    let mut streams: Vec<StreamReport> = threads
        .into_iter()
        .enumerate()
        .flat_map(|(i, t)| {
            t.join().unwrap_or_else(|_| {
                vec![StreamReport {
                    stream: i as u32,
                    error: Some("stream thread panicked".into()),
                    ..StreamReport::default()
                }]
            })
        })
        .collect();
    streams.sort_by_key(|s| s.stream);
    streams
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagram_offsets_from_the_wire_are_range_checked() {
        let mut r = StreamReport::default();
        let mut expect = 0;
        let mut d = vec![0u8; 100];
        pattern::fill(&mut d, 0);
        d[..8].copy_from_slice(&0u64.to_le_bytes());
        take_datagram(&d, false, &mut expect, &mut r).unwrap();
        assert_eq!(expect, 100);
        // A hostile offset near u64::MAX: refused, no overflow.
        d[..8].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
        let e = take_datagram(&d, true, &mut expect, &mut r).unwrap_err();
        assert!(e.contains("beyond"), "{e}");
        // A gap is counted, a pattern mismatch is reported with its offset.
        let mut d2 = vec![0u8; 100];
        pattern::fill(&mut d2, 300);
        d2[..8].copy_from_slice(&300u64.to_le_bytes());
        take_datagram(&d2, true, &mut expect, &mut r).unwrap();
        assert_eq!(r.gap_bytes, 200);
        d2[50] ^= 0xff;
        d2[..8].copy_from_slice(&400u64.to_le_bytes());
        let e = take_datagram(&d2, true, &mut expect, &mut r).unwrap_err();
        assert!(e.contains("corrupt"), "{e}");
    }
}

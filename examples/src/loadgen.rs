//! A loopback HTTP/1.1 load generator: one thread, non-blocking sockets on epoll, `conns`
//! connections each with one request in flight. Keep-alive, or one new connection per
//! request (like libevent's `bench_http`). Bounded by a request count and a time limit.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};
use zcio::sys::epoll as ep;

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Server address (must be loopback).
    pub addr: SocketAddr,
    /// Concurrent connections.
    pub conns: usize,
    /// Stop after this many responses.
    pub max_requests: u64,
    /// Or after this long.
    pub max_time: Duration,
    /// Keep connections open between requests.
    pub keep_alive: bool,
}

/// What came back.
#[derive(Debug, Clone, Default)]
pub struct LoadResult {
    /// Complete responses.
    pub requests: u64,
    /// Wall seconds.
    pub seconds: f64,
    /// Latency per request in microseconds, sorted.
    pub latencies_us: Vec<u32>,
    /// Failed connections or requests.
    pub errors: u64,
}

impl LoadResult {
    /// Requests per second.
    pub fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.requests as f64 / self.seconds
        } else {
            0.0
        }
    }
    /// A latency percentile in microseconds (`p` in 0..=100).
    pub fn percentile(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return f64::NAN;
        }
        let i = ((p / 100.0) * (self.latencies_us.len() - 1) as f64).round() as usize;
        f64::from(self.latencies_us[i])
    }
}

struct Client {
    s: Option<TcpStream>,
    sent_at: Instant,
    got: Vec<u8>,
}

fn request(keep_alive: bool) -> &'static [u8] {
    if keep_alive {
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    } else {
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    }
}

/// Length of a complete response at the start of `b`, if there is one.
fn complete(b: &[u8]) -> Option<usize> {
    let end = b.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&b[..end]).ok()?.to_ascii_lowercase();
    let cl = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())?;
    (b.len() >= end + cl).then_some(end + cl)
}

/// Runs the load. The address must be loopback.
pub fn run(load: &Load) -> io::Result<LoadResult> {
    if !load.addr.ip().is_loopback() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the load generator only targets loopback",
        ));
    }
    let epfd = ep::create()?;
    let mut clients: Vec<Client> = Vec::with_capacity(load.conns);
    let mut res = LoadResult::default();
    let req = request(load.keep_alive);
    let connect = |epfd: RawFd, i: usize| -> io::Result<TcpStream> {
        let s = TcpStream::connect(load.addr)?;
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        ep::ctl(
            epfd,
            libc::EPOLL_CTL_ADD,
            s.as_raw_fd(),
            libc::EPOLLIN as u32,
            i as u64,
        )?;
        Ok(s)
    };
    let t0 = Instant::now();
    let mut started = 0u64;
    for i in 0..load.conns {
        if started >= load.max_requests {
            break;
        }
        let mut s = connect(epfd.as_raw_fd(), i)?;
        let sent_at = Instant::now();
        s.write_all(req)?;
        started += 1;
        clients.push(Client {
            s: Some(s),
            sent_at,
            got: Vec::with_capacity(256),
        });
    }
    let mut evs = vec![ep::empty_event(); 256];
    let mut buf = vec![0u8; 4096];
    let deadline = t0 + load.max_time;
    while res.requests + res.errors < started {
        if Instant::now() >= deadline {
            break;
        }
        let n = ep::wait(epfd.as_raw_fd(), &mut evs, 100)?;
        for e in &evs[..n] {
            let i = e.u64 as usize;
            let c = &mut clients[i];
            let Some(s) = c.s.as_mut() else { continue };
            let mut failed = false;
            loop {
                match s.read(&mut buf) {
                    Ok(0) => {
                        failed = complete(&c.got).is_none();
                        break;
                    }
                    Ok(k) => {
                        c.got.extend_from_slice(&buf[..k]);
                        if complete(&c.got).is_some() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            let done = complete(&c.got);
            if failed && done.is_none() {
                res.errors += 1;
                let _ = ep::ctl(epfd.as_raw_fd(), libc::EPOLL_CTL_DEL, s.as_raw_fd(), 0, 0);
                c.s = None;
                continue;
            }
            let Some(len) = done else { continue };
            c.got.drain(..len);
            res.requests += 1;
            let us = c.sent_at.elapsed().as_micros().min(u32::MAX as u128) as u32;
            res.latencies_us.push(us);
            let more = started < load.max_requests && Instant::now() < deadline;
            if !load.keep_alive {
                let _ = ep::ctl(epfd.as_raw_fd(), libc::EPOLL_CTL_DEL, s.as_raw_fd(), 0, 0);
                c.s = None;
                if more {
                    match connect(epfd.as_raw_fd(), i) {
                        Ok(ns) => c.s = Some(ns),
                        Err(_) => {
                            res.errors += 1;
                            continue;
                        }
                    }
                }
            }
            if more {
                if let Some(s) = c.s.as_mut() {
                    c.sent_at = Instant::now();
                    s.write_all(req)?;
                    started += 1;
                }
            }
        }
    }
    res.seconds = t0.elapsed().as_secs_f64();
    res.latencies_us.sort_unstable();
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_complete_responses_only() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP";
        assert_eq!(complete(r), Some(r.len() - 4));
        assert_eq!(complete(&r[..20]), None);
        assert_eq!(
            complete(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nab"),
            None
        );
    }
}

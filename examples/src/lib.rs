//! Servers that share all code but their event loop: an echo server and a minimal HTTP/1.1
//! keep-alive server, each running on zcio's [`EventRing`] or on plain epoll
//! (`--loop ring|epoll`), plus a loopback load generator used by `zcio bench event`.
//!
//! Addresses are loopback only.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod loadgen;

pub mod cli;
pub mod fileserver;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use zcio::event::{Event, EventConfig, EventRing, Interest, Prefer};
use zcio::sys::epoll as ep;

/// Which loop drives the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoopKind {
    /// `epoll_wait` + `epoll_ctl` directly (the baseline).
    Epoll,
    /// zcio's [`EventRing`] with its default choice (`Prefer::Auto`: `EPOLL_WAIT` over a
    /// kernel epoll where the kernel has it, else the poll ring, else epoll; each step down
    /// recorded; on `EPOLL_WAIT`, ring wait or plain `epoll_wait` per workload) and
    /// COOP_TASKRUN + SINGLE_ISSUER.
    Ring,
    /// [`EventRing`]'s `EPOLL_WAIT` backend with the ring wait fixed (no per-workload choice).
    RingFixed,
    /// [`EventRing`]'s default choice with DEFER_TASKRUN (completions posted only when the
    /// loop enters the ring with GETEVENTS).
    RingDefer,
    /// [`EventRing`]'s io_uring poll ring (one `POLL_ADD` per fd) with COOP_TASKRUN: wake-ups
    /// are posted to the CQ whenever the loop thread enters the kernel for any syscall, so
    /// under load `wait` finds events in memory without `io_uring_enter`.
    PollRing,
}

/// Edge- or level-triggered registrations (same for both loops).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Trigger {
    /// Edge-triggered: a short read means the socket is drained.
    Edge,
    /// Level-triggered.
    Level,
}

/// The only thing that differs between the two servers.
pub trait EventLoop {
    /// Registers `fd` with epoll bits and a token.
    fn add(&mut self, fd: RawFd, events: u32, token: u64) -> io::Result<()>;
    /// Changes a registration.
    fn modify(&mut self, fd: RawFd, events: u32, token: u64) -> io::Result<()>;
    /// Removes a registration (before the fd is closed).
    fn delete(&mut self, fd: RawFd) -> io::Result<()>;
    /// Waits for events.
    fn wait(&mut self, out: &mut [Event], timeout: Option<Duration>) -> io::Result<usize>;
    /// `(syscalls made by the loop, kernel entries to wait)` so far.
    fn entries(&self) -> (u64, u64);
    /// What runs underneath, for logs.
    fn describe(&self) -> String;
}

/// Plain epoll.
#[derive(Debug)]
pub struct EpollLoop {
    epfd: OwnedFd,
    buf: Vec<ep::EpollEvent>,
    syscalls: u64,
    waits: u64,
}

impl EpollLoop {
    /// A new epoll instance.
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            epfd: ep::create()?,
            buf: vec![ep::empty_event(); 512],
            syscalls: 1,
            waits: 0,
        })
    }
}

impl EventLoop for EpollLoop {
    fn add(&mut self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.syscalls += 1;
        ep::ctl(
            self.epfd.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            fd,
            events,
            token,
        )
    }
    fn modify(&mut self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.syscalls += 1;
        ep::ctl(
            self.epfd.as_raw_fd(),
            libc::EPOLL_CTL_MOD,
            fd,
            events,
            token,
        )
    }
    fn delete(&mut self, fd: RawFd) -> io::Result<()> {
        self.syscalls += 1;
        ep::ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, 0, 0)
    }
    fn wait(&mut self, out: &mut [Event], timeout: Option<Duration>) -> io::Result<usize> {
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        let max = out.len().min(self.buf.len());
        self.syscalls += 1;
        self.waits += 1;
        let n = ep::wait(self.epfd.as_raw_fd(), &mut self.buf[..max], ms)?;
        for (o, e) in out.iter_mut().zip(&self.buf[..n]) {
            *o = Event {
                events: e.events,
                token: e.u64,
            };
        }
        Ok(n)
    }
    fn entries(&self) -> (u64, u64) {
        (self.syscalls, self.waits)
    }
    fn describe(&self) -> String {
        "epoll".into()
    }
}

/// zcio's event ring.
#[derive(Debug)]
pub struct RingLoop {
    /// The ring.
    pub ring: EventRing,
}

impl RingLoop {
    /// A ring with the default configuration (io_uring with COOP_TASKRUN, epoll fallback),
    /// or with DEFER_TASKRUN (`defer`).
    pub fn new(defer: bool) -> io::Result<Self> {
        Self::with_spin(defer, None)
    }

    /// Like [`RingLoop::new`], with a busy-harvest time other than the default
    /// ([`EventConfig::spin`]).
    pub fn with_spin(defer: bool, spin: Option<Duration>) -> io::Result<Self> {
        Self::with_prefer(Prefer::Auto, defer, spin)
    }

    /// Like [`RingLoop::with_spin`], with a backend choice.
    pub fn with_prefer(prefer: Prefer, defer: bool, spin: Option<Duration>) -> io::Result<Self> {
        let mut cfg = EventConfig {
            prefer,
            ..EventConfig::default()
        };
        cfg.ring.defer_taskrun = defer;
        if let Some(s) = spin {
            cfg.spin = s;
        }
        let ring = EventRing::with_config(&cfg)?;
        for f in ring.fallbacks() {
            eprintln!("zcio fallback: {f}");
        }
        Ok(Self { ring })
    }
}

fn ctl(r: Result<(), zcio::event::CtlError>) -> io::Result<()> {
    r.map_err(|e| io::Error::from_raw_os_error(e.errno()))
}

impl EventLoop for RingLoop {
    fn add(&mut self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        ctl(self.ring.add(fd, Interest(events), token))
    }
    fn modify(&mut self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        ctl(self.ring.modify(fd, Interest(events), token))
    }
    fn delete(&mut self, fd: RawFd) -> io::Result<()> {
        ctl(self.ring.delete(fd))
    }
    fn wait(&mut self, out: &mut [Event], timeout: Option<Duration>) -> io::Result<usize> {
        self.ring.wait(out, timeout)
    }
    fn entries(&self) -> (u64, u64) {
        let s = self.ring.stats();
        (s.syscalls, s.wait_entries)
    }
    fn describe(&self) -> String {
        let flags: Vec<&str> = self
            .ring
            .setup_flags()
            .iter()
            .filter(|f| f.granted)
            .map(|f| f.name)
            .collect();
        let mode = match self.ring.wait_mode() {
            Some(m) => format!(
                ", ends in {}, {} switches, {} plain epoll_waits",
                m.name(),
                self.ring.stats().mode_switches,
                self.ring.stats().plain_waits
            ),
            None => String::new(),
        };
        format!("EventRing ({} {}{mode})", self.ring.path(), flags.join("+"))
    }
}

/// Makes the loop for a kind.
pub fn make_loop(kind: LoopKind) -> io::Result<Box<dyn EventLoop>> {
    make_loop_with(kind, None)
}

/// Makes the loop for a kind; ring loops busy-harvest for `spin` (default when `None`).
pub fn make_loop_with(kind: LoopKind, spin: Option<Duration>) -> io::Result<Box<dyn EventLoop>> {
    Ok(match kind {
        LoopKind::Epoll => Box::new(EpollLoop::new()?),
        LoopKind::Ring => Box::new(RingLoop::with_spin(false, spin)?),
        LoopKind::RingDefer => Box::new(RingLoop::with_spin(true, spin)?),
        LoopKind::RingFixed => {
            let mut l = RingLoop::with_prefer(Prefer::EpollWait, false, spin)?;
            l.ring.set_wait_choice(zcio::event::WaitChoice::Ring);
            Box::new(l)
        }
        LoopKind::PollRing => Box::new(RingLoop::with_prefer(Prefer::Uring, false, spin)?),
    })
}

/// What the server does with bytes from a connection.
pub trait Protocol {
    /// Consumes complete requests from `input` (removing them) and appends responses to
    /// `output`. Returns `true` to close the connection after `output` is written.
    fn on_input(&mut self, input: &mut Vec<u8>, output: &mut Vec<u8>) -> bool;
}

/// Echo: every byte back.
#[derive(Debug, Default)]
pub struct Echo;

impl Protocol for Echo {
    fn on_input(&mut self, input: &mut Vec<u8>, output: &mut Vec<u8>) -> bool {
        output.append(input);
        false
    }
}

/// Minimal HTTP/1.1: any request gets `200 OK` with a fixed body; keep-alive unless the
/// request says `Connection: close`; pipelined requests are answered in order.
#[derive(Debug, Default)]
pub struct Http;

/// The body the HTTP server answers with.
pub const HTTP_BODY: &[u8] = b"Hello from zcio\n";

fn find(h: &[u8], needle: &[u8]) -> Option<usize> {
    h.windows(needle.len()).position(|w| w == needle)
}

impl Protocol for Http {
    fn on_input(&mut self, input: &mut Vec<u8>, output: &mut Vec<u8>) -> bool {
        let mut close = false;
        while let Some(end) = find(input, b"\r\n\r\n") {
            let head = &input[..end];
            let lower: Vec<u8> = head.iter().map(|b| b.to_ascii_lowercase()).collect();
            close |= find(&lower, b"connection: close").is_some();
            output.extend_from_slice(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: ",
            );
            output.extend_from_slice(HTTP_BODY.len().to_string().as_bytes());
            output.extend_from_slice(if close {
                b"\r\nConnection: close\r\n\r\n".as_slice()
            } else {
                b"\r\n\r\n".as_slice()
            });
            output.extend_from_slice(HTTP_BODY);
            input.drain(..end + 4);
            if close {
                break;
            }
        }
        close
    }
}

struct Conn {
    s: TcpStream,
    input: Vec<u8>,
    output: Vec<u8>,
    closing: bool,
    want_out: bool,
}

/// Server totals.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerStats {
    /// Events handled.
    pub events: u64,
    /// Connections accepted.
    pub accepted: u64,
    /// Syscalls of the event loop (waits and registrations).
    pub loop_syscalls: u64,
    /// Kernel entries to wait for events.
    pub wait_entries: u64,
    /// Waits that returned events.
    pub waits: u64,
    /// CPU seconds of the server thread.
    pub cpu_s: f64,
}

const LISTENER: u64 = u64::MAX;

/// Runs a server on `listener` with `lp` until `stop` is set (checked every 50 ms at most).
pub fn serve(
    listener: TcpListener,
    lp: &mut dyn EventLoop,
    proto: &mut dyn Protocol,
    trigger: Trigger,
    stop: &AtomicBool,
) -> io::Result<ServerStats> {
    listener.set_nonblocking(true)?;
    let et = match trigger {
        Trigger::Edge => libc::EPOLLET as u32,
        Trigger::Level => 0,
    };
    let rd = libc::EPOLLIN as u32 | libc::EPOLLRDHUP as u32;
    lp.add(listener.as_raw_fd(), libc::EPOLLIN as u32, LISTENER)?;
    let mut conns: HashMap<u64, Conn> = HashMap::new();
    let mut events = vec![Event::default(); 512];
    let mut buf = vec![0u8; 16 << 10];
    let mut st = ServerStats::default();
    let cpu0 = zcio_testnet::cpu::thread_cpu_time();
    while !stop.load(Ordering::Relaxed) {
        let n = lp.wait(&mut events, Some(Duration::from_millis(50)))?;
        if n > 0 {
            st.waits += 1;
        }
        st.events += n as u64;
        for ev in &events[..n] {
            if ev.token == LISTENER {
                loop {
                    match listener.accept() {
                        Ok((s, _)) => {
                            s.set_nonblocking(true)?;
                            s.set_nodelay(true)?;
                            let tok = s.as_raw_fd() as u64;
                            lp.add(s.as_raw_fd(), rd | et, tok)?;
                            conns.insert(
                                tok,
                                Conn {
                                    s,
                                    input: Vec::new(),
                                    output: Vec::new(),
                                    closing: false,
                                    want_out: false,
                                },
                            );
                            st.accepted += 1;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    }
                }
                continue;
            }
            let Some(c) = conns.get_mut(&ev.token) else {
                continue;
            };
            let mut dead = false;
            if ev.events
                & (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32
                != 0
            {
                loop {
                    match (&c.s).read(&mut buf) {
                        Ok(0) => {
                            dead = true;
                            break;
                        }
                        Ok(k) => {
                            c.input.extend_from_slice(&buf[..k]);
                            // Edge-triggered: a short read means the socket is drained (data
                            // arriving later raises a new edge). Level: one read per event.
                            if k < buf.len() || trigger == Trigger::Level {
                                break;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(_) => {
                            dead = true;
                            break;
                        }
                    }
                }
                if !c.input.is_empty() {
                    c.closing |= proto.on_input(&mut c.input, &mut c.output);
                }
            }
            if !dead && !c.output.is_empty() {
                match (&c.s).write(&c.output) {
                    Ok(k) => {
                        c.output.drain(..k);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => dead = true,
                }
            }
            if !dead && c.output.is_empty() && c.closing {
                dead = true;
            }
            if !dead {
                let need_out = !c.output.is_empty();
                if need_out != c.want_out {
                    c.want_out = need_out;
                    let out = if need_out { libc::EPOLLOUT as u32 } else { 0 };
                    lp.modify(c.s.as_raw_fd(), rd | out | et, ev.token)?;
                }
            }
            if dead {
                let c = conns.remove(&ev.token).expect("present");
                lp.delete(c.s.as_raw_fd())?;
                drop(c);
            }
        }
    }
    let (sys, waits) = lp.entries();
    st.loop_syscalls = sys;
    st.wait_entries = waits;
    st.cpu_s = (zcio_testnet::cpu::thread_cpu_time() - cpu0).as_secs_f64();
    Ok(st)
}

/// A server running on its own thread (the loop is created there: io_uring's
/// SINGLE_ISSUER ties a ring to its creator).
#[derive(Debug)]
pub struct Running {
    /// Where it listens (loopback).
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<io::Result<(ServerStats, String)>>,
}

impl Running {
    /// Starts an HTTP (`http = true`) or echo server on 127.0.0.1, optionally pinned.
    pub fn start(
        kind: LoopKind,
        trigger: Trigger,
        http: bool,
        cpu: Option<usize>,
    ) -> io::Result<Self> {
        Self::start_with(kind, trigger, http, cpu, None)
    }

    /// Like [`Running::start`], with a ring busy-harvest time other than the default.
    pub fn start_with(
        kind: LoopKind,
        trigger: Trigger,
        http: bool,
        cpu: Option<usize>,
        spin: Option<Duration>,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            if let Some(c) = cpu {
                let _ = zcio_testnet::cpu::pin_thread(c);
            }
            let mut lp = match make_loop_with(kind, spin) {
                Ok(l) => l,
                Err(e) => {
                    let _ = tx.send(Err(io::Error::new(e.kind(), e.to_string())));
                    return Err(e);
                }
            };
            let _ = tx.send(Ok(()));
            let mut echo = Echo;
            let mut h = Http;
            let proto: &mut dyn Protocol = if http { &mut h } else { &mut echo };
            let st = serve(listener, lp.as_mut(), proto, trigger, &stop2)?;
            Ok((st, lp.describe()))
        });
        rx.recv()
            .map_err(|_| io::Error::other("server thread died"))??;
        Ok(Self { addr, stop, handle })
    }

    /// Stops the server and returns its totals and loop description.
    pub fn stop(self) -> io::Result<(ServerStats, String)> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .join()
            .map_err(|_| io::Error::other("server thread panicked"))?
    }
}

//! Equivalence scenarios: sequences of registrations, I/O and waits, as data, run against real
//! epoll and against zcio's [`EventRing`]; both must produce the same trace (the result of
//! every control call, and the set of `(token, events)` of every wait). They live in the
//! test-host crate, not in the library: only tests (zcio's `event_ring`) run them.
//!
//! Kept as plain data so other drivers (the C trace program of the epoll shim) can replay
//! them. Every wait is non-blocking (timeout 0); loopback TCP steps are preceded by a
//! [`Step::Settle`] that polls until the expected state is reached, so runs are
//! deterministic.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use zcio::event::EventRing;

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `UnixStream::pair`: the polled end and its peer.
    Unix,
    /// TCP over 127.0.0.1: the accepted end (polled) and the client end (peer).
    Tcp,
    /// A pipe: read end polled, write end as peer.
    Pipe,
    /// An eventfd: writes add 1 to the counter, reads reset it.
    EventFd,
    /// A regular file (epoll refuses it with EPERM).
    File,
    /// A listening TCP socket on 127.0.0.1 (no peer); [`Step::Connect`] tries it.
    Listener,
    /// A pipe's write end polled, its read end as peer (closing the peer: `EPOLLERR`).
    PipeWriter,
}

/// Interest bits used by the scenarios.
pub mod bits {
    /// EPOLLIN.
    pub const IN: u32 = libc::EPOLLIN as u32;
    /// EPOLLOUT.
    pub const OUT: u32 = libc::EPOLLOUT as u32;
    /// EPOLLPRI.
    pub const PRI: u32 = libc::EPOLLPRI as u32;
    /// EPOLLRDHUP.
    pub const RDHUP: u32 = libc::EPOLLRDHUP as u32;
    /// EPOLLHUP.
    pub const HUP: u32 = libc::EPOLLHUP as u32;
    /// EPOLLET.
    pub const ET: u32 = libc::EPOLLET as u32;
    /// EPOLLONESHOT.
    pub const ONESHOT: u32 = libc::EPOLLONESHOT as u32;
    /// EPOLLEXCLUSIVE.
    pub const EXCL: u32 = libc::EPOLLEXCLUSIVE as u32;
}
use bits::*;

/// One step. Slots are small integers naming objects opened by [`Step::Open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Opens an object into a slot.
    Open(u16, Kind),
    /// `add(fd, events, token)`.
    Add(u16, u32, u64),
    /// `modify(fd, events, token)`.
    Mod(u16, u32, u64),
    /// `delete(fd)`.
    Del(u16),
    /// `add` of descriptor −1 (EBADF).
    AddBadFd,
    /// Writes n bytes to the slot's peer (eventfd: adds 1 to the counter).
    PeerWrite(u16, usize),
    /// Reads up to n bytes from the polled end (eventfd: resets the counter).
    Read(u16, usize),
    /// Writes into the polled end until it would block (it stops being writable).
    FillOwn(u16),
    /// Reads everything the peer has (the polled end becomes writable again).
    DrainPeer(u16),
    /// `shutdown(peer, SHUT_WR)`: the polled end sees RDHUP.
    PeerShutWr(u16),
    /// Sends one byte of urgent data from the peer (TCP): the polled end sees PRI.
    PeerOob(u16),
    /// Closes the peer.
    PeerClose(u16),
    /// Closes the polled end (through the target: the event ring deletes it first).
    Close(u16),
    /// Closes the polled end behind the target's back (plain `close`): epoll drops the
    /// registration when the file goes.
    CloseRaw(u16),
    /// `dup2`s a fresh eventfd over the polled end's number (the old file is released; the
    /// number now names an unregistered eventfd).
    Dup2Over(u16),
    /// A blocking `connect` to the slot's listener address (kept after close); records 0 or
    /// the errno (`ECONNREFUSED` once the listener is gone).
    Connect(u16),
    /// Polls the polled end until all of `events` are ready (≤ 2 s), for loopback TCP.
    Settle(u16, u32),
    /// A non-blocking wait for up to n events; records the set.
    Wait(usize),
    /// A wait with room for zero events (EINVAL).
    WaitZero,
    /// Opens `count` objects of a kind into slots `first..` and adds each with `events`
    /// and token `token + i`.
    Many(u16, u16, Kind, u32, u64),
    /// Writes n bytes to the peer of every `every`-th slot of `first..first+count`.
    ManyPeerWrite(u16, u16, u16, usize),
}

/// A named scenario.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// Name (says the behaviour).
    pub name: &'static str,
    /// Steps.
    pub steps: &'static [Step],
}

use Kind::*;
use Step::*;

/// Every scenario.
pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "level_triggered_readable_reported_until_drained",
        steps: &[
            Open(0, Unix),
            Add(0, IN, 1),
            Wait(8),
            PeerWrite(0, 10),
            Wait(8),
            Wait(8),
            Read(0, 5),
            Wait(8),
            Read(0, 100),
            Wait(8),
        ],
    },
    Scenario {
        name: "edge_triggered_readable_once_per_write",
        steps: &[
            Open(0, Unix),
            Add(0, IN | ET, 1),
            Wait(8),
            PeerWrite(0, 10),
            Wait(8),
            Wait(8),
            PeerWrite(0, 10),
            Wait(8),
            Read(0, 100),
            Wait(8),
            Wait(8),
        ],
    },
    Scenario {
        name: "level_triggered_in_out_on_socket",
        steps: &[
            Open(0, Unix),
            Add(0, IN | OUT, 7),
            Wait(8),
            PeerWrite(0, 3),
            Wait(8),
            FillOwn(0),
            Wait(8),
            DrainPeer(0),
            Wait(8),
            Read(0, 10),
            Wait(8),
        ],
    },
    Scenario {
        name: "edge_triggered_writable_after_fill_and_drain",
        steps: &[
            Open(0, Unix),
            Add(0, OUT | ET, 3),
            Wait(8),
            Wait(8),
            FillOwn(0),
            Wait(8),
            DrainPeer(0),
            Wait(8),
            Wait(8),
        ],
    },
    Scenario {
        name: "half_close_reports_rdhup_unix",
        steps: &[
            Open(0, Unix),
            Add(0, IN | RDHUP, 1),
            Wait(8),
            PeerShutWr(0),
            Wait(8),
            Wait(8),
        ],
    },
    Scenario {
        name: "half_close_reports_rdhup_tcp",
        steps: &[
            Open(0, Tcp),
            Add(0, IN | RDHUP | ET, 1),
            Open(1, Tcp),
            Add(1, IN | RDHUP, 2),
            Wait(8),
            PeerWrite(0, 5),
            Settle(0, IN),
            Wait(8),
            PeerShutWr(0),
            PeerShutWr(1),
            Settle(0, IN | RDHUP),
            Settle(1, IN | RDHUP),
            Wait(8),
            Wait(8),
        ],
    },
    Scenario {
        name: "urgent_data_reports_pri_tcp",
        steps: &[
            Open(0, Tcp),
            Add(0, PRI, 1),
            Wait(8),
            PeerOob(0),
            Settle(0, PRI),
            Wait(8),
            Wait(8),
        ],
    },
    Scenario {
        name: "peer_close_reports_hup",
        steps: &[
            Open(0, Unix),
            Add(0, IN | OUT | RDHUP, 1),
            Wait(8),
            PeerClose(0),
            Wait(8),
            Read(0, 10),
            Wait(8),
        ],
    },
    Scenario {
        name: "pipe_reader_sees_in_then_hup",
        steps: &[
            Open(0, Pipe),
            Add(0, IN, 1),
            Wait(8),
            PeerWrite(0, 4),
            Wait(8),
            PeerClose(0),
            Wait(8),
            Read(0, 100),
            Wait(8),
        ],
    },
    Scenario {
        name: "eventfd_counter_level_and_edge",
        steps: &[
            Open(0, EventFd),
            Add(0, IN, 1),
            Open(1, EventFd),
            Add(1, IN | ET, 2),
            Wait(8),
            PeerWrite(0, 1),
            PeerWrite(1, 1),
            Wait(8),
            Wait(8),
            PeerWrite(1, 1),
            Wait(8),
            Read(0, 8),
            Read(1, 8),
            Wait(8),
        ],
    },
    Scenario {
        name: "modify_changes_interest_and_token",
        steps: &[
            Open(0, Unix),
            Add(0, IN, 1),
            PeerWrite(0, 1),
            Wait(8),
            Mod(0, OUT, 2),
            Wait(8),
            Mod(0, IN | OUT, 3),
            Wait(8),
            Mod(0, IN | ET, 4),
            Wait(8),
            Wait(8),
        ],
    },
    Scenario {
        name: "modify_with_event_pending_reports_new_token",
        steps: &[
            Open(0, Unix),
            Add(0, IN | ET, 1),
            PeerWrite(0, 1),
            Mod(0, IN | ET, 2),
            Wait(8),
            Wait(8),
        ],
    },
    Scenario {
        name: "delete_while_event_pending_drops_it",
        steps: &[
            Open(0, Unix),
            Add(0, IN, 1),
            Open(1, Unix),
            Add(1, IN, 2),
            PeerWrite(0, 1),
            PeerWrite(1, 1),
            Del(0),
            Wait(8),
            Del(0),
            Mod(0, IN, 3),
            Add(0, IN, 5),
            Wait(8),
        ],
    },
    Scenario {
        name: "delete_then_re_add_with_wake_up_in_flight",
        steps: &[
            Open(0, Unix),
            Add(0, IN | ET, 1),
            PeerWrite(0, 1),
            Del(0),
            Add(0, OUT | ET, 2),
            Wait(8),
            Wait(8),
            Del(0),
            Add(0, IN | ET, 3),
            Wait(8),
            PeerWrite(0, 1),
            Wait(8),
            Wait(8),
        ],
    },
    Scenario {
        name: "close_of_registered_fd_then_number_reuse",
        steps: &[
            Open(0, Unix),
            Add(0, IN, 1),
            PeerWrite(0, 1),
            Close(0),
            Wait(8),
            Open(1, Unix),
            Add(1, IN, 2),
            PeerWrite(1, 1),
            Wait(8),
            Close(1),
            Open(2, Pipe),
            Add(2, IN | ET, 3),
            PeerWrite(2, 1),
            Wait(8),
        ],
    },
    Scenario {
        name: "oneshot_fires_once_until_rearmed",
        steps: &[
            Open(0, Unix),
            Add(0, IN | ONESHOT, 1),
            PeerWrite(0, 1),
            Wait(8),
            Wait(8),
            PeerWrite(0, 1),
            Wait(8),
            Mod(0, IN | ONESHOT, 2),
            Wait(8),
            Wait(8),
            Read(0, 10),
            Mod(0, IN | ONESHOT | ET, 3),
            Wait(8),
            PeerWrite(0, 1),
            Wait(8),
            Wait(8),
        ],
    },
    Scenario {
        name: "exclusive_is_level_triggered_and_add_only",
        steps: &[
            Open(0, Unix),
            Add(0, IN | EXCL, 1),
            PeerWrite(0, 1),
            Wait(8),
            Wait(8),
            Mod(0, IN, 2),
            Open(1, Unix),
            Add(1, IN | RDHUP | EXCL, 3),
            Add(1, IN | ONESHOT | EXCL, 3),
            Add(1, IN | EXCL | ET, 4),
            PeerWrite(1, 1),
            Wait(8),
        ],
    },
    Scenario {
        name: "errors_match_epoll_ctl",
        steps: &[
            AddBadFd,
            Open(0, Unix),
            Add(0, IN, 1),
            Add(0, OUT, 2),
            Open(1, Unix),
            Del(1),
            Mod(1, IN, 3),
            Open(2, File),
            Add(2, IN, 4),
            Mod(2, IN, 4),
            Del(2),
            WaitZero,
            Open(3, Unix),
            Close(3),
            Add(3, IN, 5),
            Del(3),
        ],
    },
    Scenario {
        name: "many_fds_level_and_edge",
        steps: &[
            Many(0, 150, Unix, IN, 1000),
            Many(150, 150, Pipe, IN | ET, 2000),
            Wait(512),
            ManyPeerWrite(0, 150, 2, 1),
            ManyPeerWrite(150, 150, 3, 1),
            Wait(512),
            Wait(512),
            ManyPeerWrite(150, 150, 5, 1),
            Wait(512),
        ],
    },
    Scenario {
        name: "edge_report_carries_every_ready_bit",
        // CPython test_epoll.test_control_and_wait: an edge-triggered report carries the
        // file's whole readiness polled at report time, not only the bit that woke it.
        steps: &[
            Open(0, Unix),
            Add(0, IN | OUT | ET, 1),
            Open(1, Tcp),
            Add(1, IN | OUT | ET, 2),
            Wait(8),
            Wait(8),
            PeerWrite(0, 3),
            PeerWrite(1, 3),
            Settle(1, IN),
            Wait(8),
            Wait(8),
            Read(0, 100),
            Read(1, 100),
            PeerWrite(0, 1),
            Wait(8),
        ],
    },
    Scenario {
        name: "level_report_carries_every_ready_bit",
        steps: &[
            Open(0, Unix),
            Add(0, IN | OUT | RDHUP, 1),
            Wait(8),
            PeerWrite(0, 3),
            Wait(8),
            PeerShutWr(0),
            Wait(8),
        ],
    },
    Scenario {
        name: "hup_and_err_are_reported_without_being_asked",
        steps: &[
            Open(0, Unix),
            Add(0, RDHUP, 1),
            Open(1, PipeWriter),
            Add(1, 0, 2),
            Open(2, PipeWriter),
            Add(2, OUT | ET, 3),
            Wait(8),
            Wait(8),
            PeerClose(0),
            PeerClose(1),
            PeerClose(2),
            Wait(8),
            Wait(8),
        ],
    },
    Scenario {
        name: "err_unasked_after_modify_and_edge_traffic",
        // The shim's trace (contract/err-hup-unasked) in scenario form.
        steps: &[
            Open(0, Unix),
            Add(0, IN | OUT | ET, 1),
            Wait(8),
            PeerWrite(0, 1),
            Wait(8),
            Wait(8),
            Open(1, PipeWriter),
            Add(1, 0, 3),
            Mod(0, RDHUP, 4),
            PeerClose(1),
            PeerClose(0),
            Wait(8),
            Wait(8),
        ],
    },
    Scenario {
        name: "close_of_one_fd_keeps_another_fds_pending_level_event",
        // Closing a registered fd (through the target) between waits must not delay a
        // level-triggered event another fd already has (the poll ring's flush once drained
        // it early and re-polled it a wait late).
        steps: &[
            Open(0, PipeWriter),
            Add(0, 0, 3),
            Open(1, Unix),
            Add(1, IN, 5),
            Wait(8),
            PeerClose(0),
            Close(1),
            Wait(8),
            Wait(8),
        ],
    },
    Scenario {
        name: "delete_then_close_releases_the_listener_at_once",
        // CPython test_asyncio test_server_close: DEL + close, then a connect must be refused.
        steps: &[
            Open(0, Listener),
            Add(0, IN, 1),
            Wait(8),
            Del(0),
            CloseRaw(0),
            Connect(0),
            Open(1, Listener),
            Add(1, IN | ET, 2),
            Connect(1),
            Settle(1, IN),
            Wait(8),
            Del(1),
            CloseRaw(1),
            Connect(1),
            Wait(8),
        ],
    },
    Scenario {
        name: "close_through_the_target_releases_the_listener_at_once",
        steps: &[
            Open(0, Listener),
            Add(0, IN | ET, 1),
            Close(0),
            Connect(0),
            Wait(8),
        ],
    },
];

/// Scenarios that close a registered descriptor behind the target's back (plain `close`,
/// `dup2` over it): epoll drops the registration when the file goes. Only backends whose
/// interest list is a kernel epoll pass them; the poll ring's armed polls hold the file
/// (a documented contract difference: call `delete`/`close` on the ring).
pub const BEHIND_THE_BACK: &[Scenario] = &[
    Scenario {
        name: "close_without_delete_releases_the_listener_at_once",
        // libuv closes with a raw syscall(SYS_close) that no interposer sees.
        steps: &[
            Open(0, Listener),
            Add(0, IN, 1),
            Connect(0),
            CloseRaw(0),
            Connect(0),
            Wait(8),
            Open(1, Unix),
            Add(1, IN, 2),
            PeerWrite(1, 1),
            Wait(8),
        ],
    },
    Scenario {
        name: "dup2_over_a_registered_fd_releases_it",
        steps: &[
            Open(0, Listener),
            Add(0, IN | ET, 1),
            Connect(0),
            Dup2Over(0),
            Connect(0),
            Wait(8),
            Add(0, IN, 3),
            Wait(8),
        ],
    },
];

/// What a target must do for the runner.
pub trait Target {
    /// `add`; `Err(errno)` on failure.
    fn add(&mut self, fd: RawFd, events: u32, token: u64) -> Result<(), i32>;
    /// `modify`.
    fn modify(&mut self, fd: RawFd, events: u32, token: u64) -> Result<(), i32>;
    /// `delete`.
    fn delete(&mut self, fd: RawFd) -> Result<(), i32>;
    /// Closes a (possibly registered) fd.
    fn close(&mut self, fd: OwnedFd);
    /// A non-blocking wait for up to `max` events.
    fn wait(&mut self, max: usize) -> Result<Vec<(u64, u32)>, i32>;
}

/// One observation of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Obs {
    /// A control call's result (0 or errno), by step index.
    Ctl(usize, i32),
    /// A wait's events as a set of `(token, events)`, by step index (or an errno).
    Wait(usize, Result<BTreeSet<(u64, u32)>, i32>),
}

/// Real epoll, the reference.
#[derive(Debug)]
pub struct RawEpoll {
    epfd: OwnedFd,
}

impl RawEpoll {
    /// A new epoll instance.
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            epfd: ep::create()?,
        })
    }
}

fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

impl Target for RawEpoll {
    fn add(&mut self, fd: RawFd, events: u32, token: u64) -> Result<(), i32> {
        ep::ctl(
            self.epfd.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            fd,
            events,
            token,
        )
        .map_err(errno)
    }
    fn modify(&mut self, fd: RawFd, events: u32, token: u64) -> Result<(), i32> {
        ep::ctl(
            self.epfd.as_raw_fd(),
            libc::EPOLL_CTL_MOD,
            fd,
            events,
            token,
        )
        .map_err(errno)
    }
    fn delete(&mut self, fd: RawFd) -> Result<(), i32> {
        ep::ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, 0, 0).map_err(errno)
    }
    fn close(&mut self, fd: OwnedFd) {
        drop(fd);
    }
    fn wait(&mut self, max: usize) -> Result<Vec<(u64, u32)>, i32> {
        let mut buf = vec![ep::empty_event(); max.max(1)];
        // maxevents 0 is EINVAL: ask the kernel rather than predicting it.
        let n = ep::wait(self.epfd.as_raw_fd(), &mut buf[..max], 0).map_err(errno)?;
        Ok(buf[..n].iter().map(|e| (e.u64, e.events)).collect())
    }
}

impl Target for EventRing {
    fn add(&mut self, fd: RawFd, events: u32, token: u64) -> Result<(), i32> {
        EventRing::add(self, fd, zcio::event::Interest(events), token).map_err(|e| e.errno())
    }
    fn modify(&mut self, fd: RawFd, events: u32, token: u64) -> Result<(), i32> {
        EventRing::modify(self, fd, zcio::event::Interest(events), token).map_err(|e| e.errno())
    }
    fn delete(&mut self, fd: RawFd) -> Result<(), i32> {
        EventRing::delete(self, fd).map_err(|e| e.errno())
    }
    fn close(&mut self, fd: OwnedFd) {
        EventRing::close(self, fd).expect("event ring close");
    }
    fn wait(&mut self, max: usize) -> Result<Vec<(u64, u32)>, i32> {
        let mut buf = vec![zcio::event::Event::default(); max];
        let n = EventRing::wait(self, &mut buf, Some(std::time::Duration::ZERO)).map_err(errno)?;
        Ok(buf[..n].iter().map(|e| (e.token, e.events)).collect())
    }
}

struct Obj {
    own: Option<File>,
    peer: Option<File>,
    kind: Kind,
    addr: Option<std::net::SocketAddr>,
}

fn open(kind: Kind) -> std::io::Result<Obj> {
    let (own, peer): (OwnedFd, Option<OwnedFd>) = match kind {
        Unix => {
            let (a, b) = std::os::unix::net::UnixStream::pair()?;
            (a.into(), Some(b.into()))
        }
        Tcp => {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            let c = std::net::TcpStream::connect(l.local_addr()?)?;
            let (s, _) = l.accept()?;
            (s.into(), Some(c.into()))
        }
        Pipe => {
            let (r, w) = ep::pipe()?;
            (r, Some(w))
        }
        EventFd => (ep::eventfd()?, None),
        File => (std::fs::File::open("/proc/self/exe")?.into(), None),
        Listener => {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            let addr = l.local_addr()?;
            ep::set_nonblocking(l.as_raw_fd())?;
            return Ok(Obj {
                own: Some(OwnedFd::from(l).into()),
                peer: None,
                kind,
                addr: Some(addr),
            });
        }
        PipeWriter => {
            let (r, w) = ep::pipe()?;
            (w, Some(r))
        }
    };
    ep::set_nonblocking(own.as_raw_fd())?;
    if let Some(p) = &peer {
        ep::set_nonblocking(p.as_raw_fd())?;
    }
    Ok(Obj {
        own: Some(own.into()),
        peer: peer.map(File::from),
        kind,
        addr: None,
    })
}

fn fd_of(objs: &[Option<Obj>], slot: u16) -> RawFd {
    objs.get(slot as usize)
        .and_then(|o| o.as_ref())
        .and_then(|o| o.own.as_ref())
        .map(|f| f.as_raw_fd())
        .unwrap_or(-1)
}

fn obj(objs: &mut [Option<Obj>], slot: u16) -> &mut Obj {
    objs[slot as usize].as_mut().expect("slot opened")
}

fn write_peer(o: &mut Obj, n: usize) -> std::io::Result<()> {
    if o.kind == EventFd {
        return ep::eventfd_write(o.own.as_ref().expect("open").as_raw_fd(), 1);
    }
    let data = vec![0x5a; n];
    o.peer.as_mut().expect("peer").write_all(&data)
}

fn read_own(o: &mut Obj, n: usize) -> std::io::Result<()> {
    let f = o.own.as_mut().expect("open");
    if o.kind == EventFd {
        ep::eventfd_read(f.as_raw_fd())?;
        return Ok(());
    }
    let mut buf = vec![0; n];
    match f.read(&mut buf) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(()),
        Err(e) => Err(e),
    }
}

fn drain(f: &mut File) -> std::io::Result<()> {
    let mut buf = vec![0; 64 << 10];
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

fn fill(f: &mut File) -> std::io::Result<()> {
    let buf = vec![0; 64 << 10];
    loop {
        match f.write(&buf) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Runs a scenario against a target and returns its trace. I/O failures of the scenario's
/// own objects (not of the target) are returned as errors.
pub fn run(s: &Scenario, t: &mut dyn Target) -> std::io::Result<Vec<Obs>> {
    let mut objs: Vec<Option<Obj>> = Vec::new();
    let mut trace = Vec::new();
    let ensure = |objs: &mut Vec<Option<Obj>>, slot: usize| {
        if objs.len() <= slot {
            objs.resize_with(slot + 1, || None);
        }
    };
    let ctl = |r: Result<(), i32>| r.err().unwrap_or(0);
    for (i, step) in s.steps.iter().enumerate() {
        match *step {
            Open(slot, kind) => {
                ensure(&mut objs, slot as usize);
                objs[slot as usize] = Some(open(kind)?);
            }
            Add(slot, ev, tok) => {
                let fd = fd_of(&objs, slot);
                trace.push(Obs::Ctl(i, ctl(t.add(fd, ev, tok))));
            }
            Mod(slot, ev, tok) => {
                let fd = fd_of(&objs, slot);
                trace.push(Obs::Ctl(i, ctl(t.modify(fd, ev, tok))));
            }
            Del(slot) => {
                let fd = fd_of(&objs, slot);
                trace.push(Obs::Ctl(i, ctl(t.delete(fd))));
            }
            AddBadFd => trace.push(Obs::Ctl(i, ctl(t.add(-1, IN, 0)))),
            PeerWrite(slot, n) => write_peer(obj(&mut objs, slot), n)?,
            Read(slot, n) => read_own(obj(&mut objs, slot), n)?,
            FillOwn(slot) => fill(obj(&mut objs, slot).own.as_mut().expect("open"))?,
            DrainPeer(slot) => drain(obj(&mut objs, slot).peer.as_mut().expect("peer"))?,
            PeerShutWr(slot) => {
                let p = obj(&mut objs, slot).peer.as_ref().expect("peer");
                ep::shutdown(p.as_raw_fd(), libc::SHUT_WR)?;
            }
            PeerOob(slot) => {
                let p = obj(&mut objs, slot).peer.as_ref().expect("peer");
                ep::send_oob(p.as_raw_fd())?;
            }
            PeerClose(slot) => drop(obj(&mut objs, slot).peer.take()),
            Close(slot) => {
                // Later steps on the slot use fd -1 (EBADF), as with a closed number.
                let o = obj(&mut objs, slot);
                let f = o.own.take().expect("open");
                t.close(f.into());
            }
            CloseRaw(slot) => drop(obj(&mut objs, slot).own.take()),
            Dup2Over(slot) => {
                let o = obj(&mut objs, slot);
                let fd = o.own.as_ref().expect("open").as_raw_fd();
                let e = ep::eventfd()?;
                ep::dup2(e.as_raw_fd(), fd)?;
                // The number now names the eventfd; the slot keeps owning it.
                o.kind = EventFd;
                o.peer = None;
            }
            Connect(slot) => {
                let addr = obj(&mut objs, slot).addr.expect("a listener slot");
                let r = match std::net::TcpStream::connect_timeout(
                    &addr,
                    std::time::Duration::from_secs(2),
                ) {
                    Ok(_) => 0,
                    Err(e) => errno(e),
                };
                trace.push(Obs::Ctl(i, r));
            }
            Settle(slot, ev) => {
                let f = obj(&mut objs, slot).own.as_ref().expect("open");
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
                loop {
                    let got = ep::poll_one(f.as_raw_fd(), ev as i16, 100)? as u32;
                    if got & ev == ev || std::time::Instant::now() > deadline {
                        break;
                    }
                }
            }
            Wait(max) => trace.push(Obs::Wait(i, t.wait(max).map(|v| v.into_iter().collect()))),
            WaitZero => trace.push(Obs::Wait(i, t.wait(0).map(|v| v.into_iter().collect()))),
            Many(first, count, kind, ev, tok) => {
                for k in 0..count {
                    let slot = (first + k) as usize;
                    ensure(&mut objs, slot);
                    objs[slot] = Some(open(kind)?);
                    let fd = fd_of(&objs, slot as u16);
                    trace.push(Obs::Ctl(i, ctl(t.add(fd, ev, tok + u64::from(k)))));
                }
            }
            ManyPeerWrite(first, count, every, n) => {
                for k in (0..count).step_by(every.max(1) as usize) {
                    write_peer(obj(&mut objs, first + k), n)?;
                }
            }
        }
    }
    // Close everything through the target (the ring deletes registrations first).
    for o in objs.iter_mut().flatten() {
        if let Some(f) = o.own.take() {
            t.close(f.into());
        }
    }
    Ok(trace)
}

/// The raw calls the runner makes on its own objects and on the reference epoll.
mod ep {
    use std::io;
    use std::os::fd::{FromRawFd, OwnedFd, RawFd};

    fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
        if rc == -1 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc)
        }
    }

    fn owned(fd: RawFd) -> OwnedFd {
        // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    pub(super) fn create() -> io::Result<OwnedFd> {
        // SAFETY: integer argument only.
        cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) }).map(owned)
    }

    pub(super) fn ctl(epfd: RawFd, op: i32, fd: RawFd, events: u32, data: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: data };
        // SAFETY: `ev` lives for the call; the kernel copies it (DEL ignores it).
        cvt(unsafe { libc::epoll_ctl(epfd, op, fd, &mut ev) }).map(drop)
    }

    pub(super) fn empty_event() -> libc::epoll_event {
        libc::epoll_event { events: 0, u64: 0 }
    }

    pub(super) fn wait(epfd: RawFd, out: &mut [libc::epoll_event], ms: i32) -> io::Result<usize> {
        let max = out.len().min(i32::MAX as usize) as i32;
        // SAFETY: `out` is writable for `max` entries for the duration of the call.
        cvt(unsafe { libc::epoll_wait(epfd, out.as_mut_ptr(), max, ms) }).map(|n| n as usize)
    }

    pub(super) fn eventfd() -> io::Result<OwnedFd> {
        // SAFETY: integer arguments only.
        cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) }).map(owned)
    }

    pub(super) fn eventfd_write(fd: RawFd, v: u64) -> io::Result<()> {
        let b = v.to_ne_bytes();
        // SAFETY: `b` is 8 readable bytes alive for the call.
        let n = unsafe { libc::write(fd, b.as_ptr().cast(), 8) };
        cvt(n as libc::c_int).map(drop)
    }

    /// Reads and resets an eventfd counter; an empty counter (EAGAIN) is not an error.
    pub(super) fn eventfd_read(fd: RawFd) -> io::Result<()> {
        let mut b = [0u8; 8];
        // SAFETY: `b` is 8 writable bytes alive for the call.
        match cvt(unsafe { libc::read(fd, b.as_mut_ptr().cast(), 8) } as libc::c_int) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            _ => Ok(()),
        }
    }

    /// `pipe2(O_NONBLOCK | O_CLOEXEC)`: `(read end, write end)`.
    pub(super) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
        let mut fds = [0i32; 2];
        // SAFETY: `fds` is a writable array of two ints for the call.
        cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) })?;
        Ok((owned(fds[0]), owned(fds[1])))
    }

    pub(super) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
        // SAFETY: fcntl with integer arguments.
        let fl = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
        // SAFETY: as above.
        cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) }).map(drop)
    }

    pub(super) fn shutdown(fd: RawFd, how: i32) -> io::Result<()> {
        // SAFETY: integer arguments only.
        cvt(unsafe { libc::shutdown(fd, how) }).map(drop)
    }

    /// `dup3(old, new, O_CLOEXEC)`: `new` names `old`'s file (the caller keeps owning `new`).
    pub(super) fn dup2(old: RawFd, new: RawFd) -> io::Result<()> {
        // SAFETY: integer arguments only; `new`'s previous file is released by the kernel.
        cvt(unsafe { libc::dup3(old, new, libc::O_CLOEXEC) }).map(drop)
    }

    /// One byte of urgent data on a socket.
    pub(super) fn send_oob(fd: RawFd) -> io::Result<()> {
        // SAFETY: one readable byte for the call.
        let n = unsafe { libc::send(fd, b"!".as_ptr().cast(), 1, libc::MSG_OOB) };
        cvt(n as libc::c_int).map(drop)
    }

    /// `poll` of one descriptor: its `revents`.
    pub(super) fn poll_one(fd: RawFd, events: i16, ms: i32) -> io::Result<i16> {
        let mut p = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call.
        cvt(unsafe { libc::poll(&mut p, 1, ms) })?;
        Ok(p.revents)
    }
}

//! `event`: readiness events, epoll vs zcio's EventRing.
//!
//! (a) cross-thread eventfd storm: producer threads write eventfds, one harvester accounts
//!     for every write (events/s, harvester CPU per event); plus the same storm through
//!     EventRing's user-posted events (no syscall on either side while the loop is busy);
//! (b) HTTP/1.1 on loopback: the example server on epoll vs on EventRing, keep-alive and one
//!     new connection per request (like libevent's bench_http), req/s and p99 latency, with a
//!     built-in load generator (bounded count and time, loopback only);
//! (d) what one zero-timeout collection costs (16 level-triggered sockets, all ready or none):
//!     CPU and kernel entries per wait, raw `epoll_wait` vs the `EPOLL_WAIT` backend with the
//!     ring wait fixed and with the per-workload choice;
//! (c) kernel entries per 1000 events in every case (the loop's own `epoll_wait`/`epoll_ctl`
//!     or `io_uring_enter`/`fstat`, not the application's reads and writes, which are the
//!     same on both sides).
//!
//! No data is zero-copied here: the COPIED fraction does not apply (reported as n/a).

use crate::bench::measure::Span;
use crate::bench::pair::pair;
use crate::bench::{Better, Ctx, MetricDef, Sample, Suite};
use anyhow::{Context, Result};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcio::event::{Event, EventConfig, EventRing, Interest, Prefer, WaitChoice};
use zcio::sys::epoll as ep;
use zcio_examples::loadgen::{self, Load};
use zcio_examples::{LoopKind, Running, Trigger};

/// The suite.
pub struct EventSuite;

const STORM: &[MetricDef] = &[
    MetricDef::new("events_per_s", "Mev/s", Better::Higher),
    MetricDef::new("harvester_cpu_per_event", "ns", Better::Lower),
    MetricDef::new("kernel_entries_per_1000_events", "calls", Better::Lower),
];

const WAIT: &[MetricDef] = &[
    MetricDef::new("cpu_per_wait", "ns", Better::Lower),
    MetricDef::new("kernel_entries_per_wait", "calls", Better::Lower),
];

const HTTP: &[MetricDef] = &[
    MetricDef::new("req_per_s", "kreq/s", Better::Higher),
    MetricDef::new("p99_latency", "us", Better::Lower),
    MetricDef::new("server_cpu_per_req", "us", Better::Lower),
    MetricDef::new("kernel_entries_per_1000_events", "calls", Better::Lower),
    MetricDef::new("events_per_wait", "events", Better::Higher),
];

impl Suite for EventSuite {
    fn name(&self) -> &'static str {
        "event"
    }
    fn about(&self) -> &'static str {
        "readiness events: eventfd storm and user-posted events, HTTP keep-alive and per-connection on loopback; epoll vs EventRing"
    }
    fn chart_metric(&self) -> &'static str {
        "kernel_entries_per_1000_events"
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        let probe = EventRing::with_config(&EventConfig {
            prefer: Prefer::Uring,
            ..EventConfig::default()
        });
        match probe {
            Ok(r) => {
                let flags: Vec<String> = r
                    .setup_flags()
                    .iter()
                    .filter(|f| f.requested)
                    .map(|f| format!("{}={}", f.name, if f.granted { "yes" } else { "no" }))
                    .collect();
                ctx.note(format!("EventRing ring flags: {}", flags.join(" ")));
            }
            Err(e) => return Err(ctx.skip(format!("io_uring unavailable: {e}"))),
        }
        ctx.note("no zero-copy data path in this suite: COPIED fraction n/a");
        ctx.note(
            "kernel entries = the event loop's own syscalls (epoll_wait/epoll_ctl vs \
             io_uring_enter/fstat), not the reads/writes, which both sides make alike",
        );
        let dur = ctx.run_time();
        let cpus = zcio_testnet::cpu::online_cpus();
        if cpus < 2 {
            ctx.note("one CPU: producers/clients share the core with the harvester/server");
        }
        let fds = 16;
        let alone = producer_alone(dur, fds)?;
        ctx.note(format!(
            "eventfd storm ceiling: the producer alone (same writes, no watcher, no reader) \
             makes {alone:.2} Mev/s; neither loop can deliver more"
        ));
        ctx.compare(
            "eventfd storm 16 fds, 1 producer",
            ("epoll LT + read", "EventRing LT + read"),
            STORM,
            || storm(dur, fds, StormMode::Epoll),
            || storm(dur, fds, StormMode::RingFd),
        )?;
        ctx.compare(
            "eventfd storm 16 fds, 1 producer, EPOLL_WAIT (per-workload choice)",
            ("epoll LT + read", "EventRing EPOLL_WAIT LT + read"),
            STORM,
            || storm(dur, fds, StormMode::Epoll),
            || storm(dur, fds, StormMode::EpwaitFd),
        )?;
        ctx.compare(
            "eventfd storm 16 fds, 1 producer, EPOLL_WAIT ring wait fixed",
            (
                "epoll LT + read",
                "EventRing EPOLL_WAIT ring wait LT + read",
            ),
            STORM,
            || storm(dur, fds, StormMode::Epoll),
            || storm(dur, fds, StormMode::EpwaitFixed),
        )?;
        ctx.compare(
            "cross-thread events, 1 producer",
            ("eventfd + epoll", "EventRing user-posted"),
            STORM,
            || storm(dur, fds, StormMode::Epoll),
            || storm(dur, fds, StormMode::RingUser),
        )?;
        // What one collection costs, without any traffic: the per-workload choice's cost
        // model (docs/design/event.md, "Choice per workload").
        let waits = ctx.pick(50_000, 500_000);
        for (ready, what) in [
            (true, "16 LT fds ready"),
            (false, "zero-timeout poll, nothing ready"),
        ] {
            for (choice, label) in [
                (WaitChoice::Ring, "EPOLL_WAIT ring wait fixed"),
                (WaitChoice::Auto, "EPOLL_WAIT per-workload choice"),
            ] {
                ctx.compare(
                    &format!("wait cost, {what}, {label}"),
                    ("epoll_wait", "EventRing wait"),
                    WAIT,
                    || wait_cost(None, ready, waits),
                    || wait_cost(Some(choice), ready, waits),
                )?;
            }
        }
        let conns = ctx.pick(64, 128);
        let ka_time = dur * 2;
        ctx.compare(
            &format!("http keep-alive {conns} conns"),
            (
                "epoll server",
                "EventRing server (default: per-workload choice)",
            ),
            HTTP,
            || http(LoopKind::Epoll, true, conns, u64::MAX, ka_time),
            || http(LoopKind::Ring, true, conns, u64::MAX, ka_time),
        )?;
        ctx.compare(
            &format!("http keep-alive {conns} conns, EPOLL_WAIT ring wait fixed"),
            ("epoll server", "EventRing EPOLL_WAIT ring-wait server"),
            HTTP,
            || http(LoopKind::Epoll, true, conns, u64::MAX, ka_time),
            || http(LoopKind::RingFixed, true, conns, u64::MAX, ka_time),
        )?;
        ctx.compare(
            &format!("http keep-alive {conns} conns, poll ring"),
            ("epoll server", "EventRing poll-ring server"),
            HTTP,
            || http(LoopKind::Epoll, true, conns, u64::MAX, ka_time),
            || http(LoopKind::PollRing, true, conns, u64::MAX, ka_time),
        )?;
        // The busy-harvest spin (`EventConfig::spin`, off by default) on its own: the same
        // ring without and with it.
        let spin_on = Duration::from_micros(5);
        ctx.compare(
            &format!(
                "http keep-alive {conns} conns, EventRing busy-harvest {} us",
                spin_on.as_micros()
            ),
            ("poll ring no spin", "poll ring busy-harvest"),
            HTTP,
            || http_spin(LoopKind::PollRing, Some(Duration::ZERO), conns, ka_time),
            || http_spin(LoopKind::PollRing, Some(spin_on), conns, ka_time),
        )?;
        ctx.compare(
            &format!("http keep-alive {conns} conns, ring with DEFER_TASKRUN"),
            ("epoll server", "EventRing DEFER_TASKRUN server"),
            HTTP,
            || http(LoopKind::Epoll, true, conns, u64::MAX, ka_time),
            || http(LoopKind::RingDefer, true, conns, u64::MAX, ka_time),
        )?;
        let per_conn = ctx.pick(3000, 20000);
        ctx.compare(
            &format!("http new connection per request, {per_conn} requests"),
            ("epoll server", "EventRing server"),
            HTTP,
            || {
                http(
                    LoopKind::Epoll,
                    false,
                    32,
                    per_conn,
                    Duration::from_secs(30),
                )
            },
            || http(LoopKind::Ring, false, 32, per_conn, Duration::from_secs(30)),
        )?;
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum StormMode {
    Epoll,
    RingFd,
    EpwaitFd,
    EpwaitFixed,
    RingUser,
}

/// What the harvester thread measured.
struct Harvest {
    accounted: u64,
    cpu_s: f64,
    wall_s: f64,
    entries: u64,
    events: u64,
    note: Option<String>,
}

fn harvester_core() -> usize {
    0
}
fn producer_core() -> usize {
    if zcio_testnet::cpu::online_cpus() > 1 {
        1
    } else {
        0
    }
}

fn storm(dur: Duration, nfds: usize, mode: StormMode) -> Result<Sample> {
    let efds: Arc<Vec<OwnedFd>> = Arc::new(
        (0..nfds)
            .map(|_| zcio::sys::eventfd(0))
            .collect::<std::io::Result<_>>()
            .context("eventfd")?,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let produced = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let (ptx, prx) = std::sync::mpsc::channel::<Option<zcio::event::Poster>>();
    let (rtx, rrx) = std::sync::mpsc::channel::<()>();

    let sides = pair(format!("event storm {mode:?}")).cores((producer_core(), harvester_core()));
    // Harvester: owns the loop (created on its own thread for SINGLE_ISSUER).
    let h = {
        let efds = efds.clone();
        let produced = produced.clone();
        let done = done.clone();
        sides.server(move || -> Result<Harvest> {
            let mut ring = None;
            let mut epfd = None;
            match mode {
                StormMode::Epoll => {
                    let e = ep::create()?;
                    for (i, f) in efds.iter().enumerate() {
                        ep::ctl(
                            e.as_raw_fd(),
                            libc::EPOLL_CTL_ADD,
                            f.as_raw_fd(),
                            libc::EPOLLIN as u32,
                            i as u64,
                        )?;
                    }
                    epfd = Some(e);
                    ptx.send(None).ok();
                }
                StormMode::RingFd
                | StormMode::EpwaitFd
                | StormMode::EpwaitFixed
                | StormMode::RingUser => {
                    let mut r = EventRing::with_config(&EventConfig {
                        prefer: if matches!(mode, StormMode::EpwaitFd | StormMode::EpwaitFixed) {
                            Prefer::EpollWait
                        } else {
                            Prefer::Uring
                        },
                        user_capacity: 1 << 16,
                        wait_choice: if mode == StormMode::EpwaitFixed {
                            WaitChoice::Ring
                        } else {
                            WaitChoice::Auto
                        },
                        ..EventConfig::default()
                    })?;
                    if mode != StormMode::RingUser {
                        for (i, f) in efds.iter().enumerate() {
                            r.add(f.as_raw_fd(), Interest::IN, i as u64)?;
                        }
                        ptx.send(None).ok();
                    } else {
                        ptx.send(Some(r.poster())).ok();
                    }
                    ring = Some(r);
                }
            }
            rrx.recv().ok();
            let span = Span::start();
            let mut accounted = 0u64;
            let mut events = 0u64;
            let mut eb = vec![ep::empty_event(); 256];
            let mut rb = vec![Event::default(); 256];
            let mut epoll_waits = 0u64;
            let s0 = ring.as_ref().map(|r| r.stats());
            loop {
                if done.load(Ordering::Acquire) && accounted >= produced.load(Ordering::Acquire) {
                    break;
                }
                if let Some(e) = &epfd {
                    epoll_waits += 1;
                    let n = ep::wait(e.as_raw_fd(), &mut eb, 10)?;
                    events += n as u64;
                    for ev in &eb[..n] {
                        let fd = efds[ev.u64 as usize].as_raw_fd();
                        accounted += ep::eventfd_read(fd)?;
                    }
                } else if let Some(r) = ring.as_mut() {
                    let n = r.wait(&mut rb, Some(Duration::from_millis(10)))?;
                    events += n as u64;
                    if mode == StormMode::RingUser {
                        accounted += n as u64;
                    } else {
                        for ev in &rb[..n] {
                            let fd = efds[ev.token as usize].as_raw_fd();
                            accounted += ep::eventfd_read(fd)?;
                        }
                    }
                }
            }
            let (wall_s, cpu_s) = span.stop();
            let (entries, note) = match (&ring, s0) {
                (Some(r), Some(s0)) => {
                    let s = r.stats();
                    (
                        s.syscalls - s0.syscalls,
                        Some(format!(
                            "{}{}: {} CQEs, {} poster wake-ups, busy-harvest spins {} found work / {} slept",
                            r.path(),
                            wait_mode_note(r),
                            s.cqes - s0.cqes,
                            s.poster_wakes,
                            s.spins_won - s0.spins_won,
                            s.spins_lost - s0.spins_lost
                        )),
                    )
                }
                _ => (epoll_waits, None),
            };
            Ok(Harvest {
                accounted,
                cpu_s,
                wall_s,
                entries,
                events,
                note,
            })
        })?
    };
    let poster = prx.recv().context("harvester set-up failed")?;
    let p = {
        let efds = efds.clone();
        let stop = stop.clone();
        let produced = produced.clone();
        sides.client(move || -> std::io::Result<u64> {
            let mut n = 0u64;
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..64 {
                    match &poster {
                        Some(p) => {
                            while p.post((i % efds.len()) as u64, 1).is_err() {
                                std::hint::spin_loop();
                            }
                        }
                        None => ep::eventfd_write(efds[i % efds.len()].as_raw_fd(), 1)?,
                    }
                    i += 1;
                    n += 1;
                }
            }
            produced.store(n, Ordering::Release);
            Ok(n)
        })?
    };
    rtx.send(()).ok();
    std::thread::sleep(dur);
    stop.store(true, Ordering::Relaxed);
    let total = p.io_result()?;
    done.store(true, Ordering::Release);
    let hv = h.result()?;
    anyhow::ensure!(
        hv.accounted == total,
        "harvester accounted {} of {total} events",
        hv.accounted
    );
    let mut s = Sample::default();
    s.set("events_per_s", total as f64 / hv.wall_s / 1e6)
        .set("harvester_cpu_per_event", hv.cpu_s * 1e9 / total as f64)
        .set(
            "kernel_entries_per_1000_events",
            hv.entries as f64 * 1000.0 / total as f64,
        );
    s.note(format!(
        "{mode:?}: {total} events in {} deliveries ({:.1} per delivery)",
        hv.events,
        total as f64 / hv.events.max(1) as f64
    ));
    if let Some(n) = hv.note {
        s.note(n);
    }
    Ok(s)
}

/// The producer's write rate with nothing watching or reading the eventfds: the ceiling of
/// the storm's events/s (each event is one `write` syscall by the producer).
fn producer_alone(dur: Duration, nfds: usize) -> Result<f64> {
    let efds: Vec<OwnedFd> = (0..nfds)
        .map(|_| zcio::sys::eventfd(0))
        .collect::<std::io::Result<_>>()
        .context("eventfd")?;
    let sides = pair("event producer alone").cores((producer_core(), harvester_core()));
    let t = sides.client(move || -> std::io::Result<f64> {
        let start = Instant::now();
        let mut n = 0u64;
        let mut i = 0usize;
        while start.elapsed() < dur {
            for _ in 0..64 {
                ep::eventfd_write(efds[i % efds.len()].as_raw_fd(), 1)?;
                i += 1;
                n += 1;
            }
        }
        Ok(n as f64 / start.elapsed().as_secs_f64() / 1e6)
    })?;
    t.io_result()
}

fn http(
    kind: LoopKind,
    keep_alive: bool,
    conns: usize,
    max_req: u64,
    max_time: Duration,
) -> Result<Sample> {
    http_with(kind, None, keep_alive, conns, max_req, max_time)
}

fn http_spin(kind: LoopKind, spin: Option<Duration>, conns: usize, t: Duration) -> Result<Sample> {
    http_with(kind, spin, true, conns, u64::MAX, t)
}

fn http_with(
    kind: LoopKind,
    spin: Option<Duration>,
    keep_alive: bool,
    conns: usize,
    max_req: u64,
    max_time: Duration,
) -> Result<Sample> {
    let srv = Running::start_with(kind, Trigger::Edge, true, Some(harvester_core()), spin)
        .context("start server")?;
    let addr = srv.addr;
    let sides = pair("event http").cores((producer_core(), harvester_core()));
    let lg = sides.client(move || {
        loadgen::run(&Load {
            addr,
            conns,
            max_requests: max_req,
            max_time,
            keep_alive,
        })
    })?;
    let r = lg.io_result()?;
    let (st, desc) = srv.stop()?;
    anyhow::ensure!(r.errors == 0, "{desc}: {} failed requests", r.errors);
    anyhow::ensure!(r.requests > 0, "{desc}: no request completed");
    let mut s = Sample::default();
    s.set("req_per_s", r.rate() / 1e3)
        .set("p99_latency", r.percentile(99.0))
        .set("server_cpu_per_req", st.cpu_s * 1e6 / r.requests as f64)
        .set(
            "kernel_entries_per_1000_events",
            st.loop_syscalls as f64 * 1000.0 / st.events.max(1) as f64,
        )
        .set("events_per_wait", st.events as f64 / st.waits.max(1) as f64);
    s.note(format!("server loop: {desc}"));
    Ok(s)
}

/// For the notes: the `EPOLL_WAIT` backend's wait mode at the end and its switches.
fn wait_mode_note(r: &EventRing) -> String {
    match r.wait_mode() {
        Some(m) => {
            let last = r
                .decisions()
                .last()
                .map(|d| format!("; last: {d}"))
                .unwrap_or_default();
            format!(
                " (ends in {}, {} switches, {} plain epoll_waits{last})",
                m.name(),
                r.stats().mode_switches,
                r.stats().plain_waits
            )
        }
        None => String::new(),
    }
}

/// CPU and kernel entries per zero-timeout wait over 16 level-triggered unix sockets (all
/// readable, or none): raw `epoll_wait` (`choice` None) or the `EPOLL_WAIT` backend with
/// `choice`, measured after a warm-up long enough for the per-workload choice to settle.
fn wait_cost(choice: Option<WaitChoice>, ready: bool, waits: usize) -> Result<Sample> {
    use std::io::Write;
    let pairs = (0..16)
        .map(|_| std::os::unix::net::UnixStream::pair())
        .collect::<std::io::Result<Vec<_>>>()?;
    if ready {
        for (_, b) in &pairs {
            (&*b).write_all(b"x")?;
        }
    }
    let warm = 8 * 128;
    let mut s = Sample::default();
    let (cpu, entries) = match choice {
        None => {
            let e = ep::create()?;
            for (i, (a, _)) in pairs.iter().enumerate() {
                ep::ctl(
                    e.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    a.as_raw_fd(),
                    libc::EPOLLIN as u32,
                    i as u64,
                )?;
            }
            let mut buf = vec![ep::empty_event(); 64];
            for _ in 0..warm {
                ep::wait(e.as_raw_fd(), &mut buf, 0)?;
            }
            let span = Span::start();
            for _ in 0..waits {
                ep::wait(e.as_raw_fd(), &mut buf, 0)?;
            }
            (span.stop().1, waits as u64)
        }
        Some(choice) => {
            let mut r = EventRing::with_config(&EventConfig {
                prefer: Prefer::EpollWait,
                wait_choice: choice,
                ..EventConfig::default()
            })?;
            for (i, (a, _)) in pairs.iter().enumerate() {
                r.add(a.as_raw_fd(), Interest::IN, i as u64)?;
            }
            let mut out = vec![Event::default(); 64];
            for _ in 0..warm {
                r.wait(&mut out, Some(Duration::ZERO))?;
            }
            let before = r.stats().wait_entries;
            let span = Span::start();
            for _ in 0..waits {
                r.wait(&mut out, Some(Duration::ZERO))?;
            }
            let cpu = span.stop().1;
            s.note(format!(
                "{} 16 fds{}",
                if ready { "ready" } else { "idle" },
                wait_mode_note(&r)
            ));
            (cpu, r.stats().wait_entries - before)
        }
    };
    s.set("cpu_per_wait", cpu / waits as f64 * 1e9);
    s.set("kernel_entries_per_wait", entries as f64 / waits as f64);
    Ok(s)
}

//! The `EPOLL_WAIT` backend's per-workload choice between the ring wait and a plain
//! `epoll_wait` on the same epoll instance, on real fds: every equivalence scenario across
//! forced switches, no event lost or duplicated across a switch (level- and edge-triggered,
//! oneshot, an armed request reaped at the switch), and the automatic choice taken and
//! recorded with its reason. The decision logic itself is tested without a kernel in
//! `event::choice`.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;
use zcio::event::choice::WaitMode;
use zcio::event::{Event, EventConfig, EventRing, Interest, Prefer, WaitChoice};
use zcio_testnet::scenarios::{self, RawEpoll};

fn has_epoll_wait() -> bool {
    use zcio::ring::features::Features;
    Features::get().has(Features::EPOLL_WAIT)
}

fn epoll_wait_or_skip(test: &str) -> bool {
    has_epoll_wait()
        || zcio_testnet::skip_kernel_feature(
            test,
            "ZCIO_REQUIRE_EPOLL_WAIT",
            "kernel io_uring lacks EPOLL_WAIT (Linux 6.15)",
        )
}

fn ring(defer: bool, choice: WaitChoice) -> EventRing {
    let mut cfg = EventConfig {
        prefer: Prefer::EpollWait,
        wait_choice: choice,
        ..EventConfig::default()
    };
    cfg.ring.defer_taskrun = defer;
    let r = EventRing::with_config(&cfg).expect("EPOLL_WAIT event ring (Linux 6.15)");
    assert_eq!(r.path().as_str(), "io_uring_epoll_wait");
    r
}

const ZERO: Option<Duration> = Some(Duration::ZERO);

fn wait(r: &mut EventRing, timeout: Option<Duration>) -> Vec<(u64, u32)> {
    let mut out = vec![Event::default(); 64];
    let n = r.wait(&mut out, timeout).unwrap();
    let mut v: Vec<(u64, u32)> = out[..n].iter().map(|e| (e.token, e.events)).collect();
    v.sort();
    v
}

const IN: u32 = libc::EPOLLIN as u32;

#[test]
fn every_scenario_matches_epoll_across_a_switch_at_every_wait() {
    if !epoll_wait_or_skip("every_scenario_matches_epoll_across_a_switch_at_every_wait") {
        return;
    }
    for defer in [false, true] {
        for choice in [WaitChoice::Alternate, WaitChoice::Plain] {
            for s in scenarios::SCENARIOS
                .iter()
                .chain(scenarios::BEHIND_THE_BACK)
            {
                let want = scenarios::run(s, &mut RawEpoll::new().unwrap()).expect("epoll run");
                let mut r = ring(defer, choice);
                let got = scenarios::run(s, &mut r).expect("ring run");
                assert_eq!(
                    got, want,
                    "scenario {} differs (defer {defer}, {choice:?})",
                    s.name
                );
                if choice == WaitChoice::Alternate {
                    let st = r.stats();
                    assert!(
                        st.mode_switches > 0
                            || !want
                                .iter()
                                .any(|o| matches!(o, scenarios::Obs::Wait(_, Ok(_)))),
                        "{}: no switch",
                        s.name
                    );
                }
            }
        }
    }
}

/// Switches `r` to the other fixed mode and returns the one it left.
fn flip(r: &mut EventRing) -> WaitMode {
    let m = r.wait_mode().unwrap();
    r.set_wait_choice(match m {
        WaitMode::Ring => WaitChoice::Plain,
        WaitMode::Plain => WaitChoice::Ring,
    });
    m
}

#[test]
fn a_level_triggered_fd_is_reported_at_every_wait_across_switches_until_drained() {
    if !epoll_wait_or_skip(
        "a_level_triggered_fd_is_reported_at_every_wait_across_switches_until_drained",
    ) {
        return;
    }
    for defer in [false, true] {
        let mut r = ring(defer, WaitChoice::Ring);
        let (mut a, mut b) = UnixStream::pair().unwrap();
        r.add(a.as_raw_fd(), Interest::IN, 7).unwrap();
        assert!(wait(&mut r, ZERO).is_empty());
        b.write_all(b"abcdef").unwrap();
        for i in 0..6 {
            let left = flip(&mut r);
            assert_eq!(
                wait(&mut r, ZERO),
                vec![(7, IN)],
                "defer {defer}, wait {i} after {left:?}"
            );
        }
        let mut buf = [0u8; 16];
        assert_eq!(a.read(&mut buf).unwrap(), 6);
        flip(&mut r);
        assert!(wait(&mut r, ZERO).is_empty(), "defer {defer}: drained");
        flip(&mut r);
        assert!(wait(&mut r, ZERO).is_empty(), "defer {defer}: drained");
        assert_eq!(r.stats().mode_switches, 8);
    }
}

#[test]
fn an_edge_is_reported_once_across_a_switch_in_either_direction() {
    if !epoll_wait_or_skip("an_edge_is_reported_once_across_a_switch_in_either_direction") {
        return;
    }
    for defer in [false, true] {
        for first in [WaitChoice::Ring, WaitChoice::Plain] {
            let mut r = ring(defer, first);
            let (_a, mut b) = UnixStream::pair().unwrap();
            r.add(_a.as_raw_fd(), Interest::IN | Interest::ET, 3)
                .unwrap();
            // An empty poll first: with DEFER_TASKRUN the ring leaves its request armed.
            assert!(wait(&mut r, ZERO).is_empty());
            b.write_all(b"x").unwrap();
            flip(&mut r);
            assert_eq!(
                wait(&mut r, ZERO),
                vec![(3, IN)],
                "defer {defer}, {first:?}"
            );
            for _ in 0..3 {
                flip(&mut r);
                assert!(
                    wait(&mut r, ZERO).is_empty(),
                    "defer {defer}, {first:?}: duplicate"
                );
            }
            // A new edge, then a switch with nothing in between: reported once.
            b.write_all(b"y").unwrap();
            flip(&mut r);
            assert_eq!(wait(&mut r, ZERO), vec![(3, IN)]);
            flip(&mut r);
            assert!(wait(&mut r, ZERO).is_empty());
        }
    }
}

#[test]
fn an_armed_request_is_reaped_at_the_switch_and_its_events_reported_once() {
    if !epoll_wait_or_skip("an_armed_request_is_reaped_at_the_switch_and_its_events_reported_once")
    {
        return;
    }
    // DEFER_TASKRUN keeps the ring's request armed after a wait that found nothing; an edge
    // then completes it (at our next entry). The switch to epoll_wait must reap it and hand
    // out what it collected — epoll consumed that edge, a plain epoll_wait would not see it.
    let mut r = ring(true, WaitChoice::Ring);
    let (_a, mut b) = UnixStream::pair().unwrap();
    let (_c, mut d) = UnixStream::pair().unwrap();
    r.add(_a.as_raw_fd(), Interest::IN | Interest::ET, 1)
        .unwrap();
    r.add(_c.as_raw_fd(), Interest::IN | Interest::ET, 2)
        .unwrap();
    assert!(wait(&mut r, ZERO).is_empty());
    b.write_all(b"x").unwrap();
    d.write_all(b"x").unwrap();
    r.set_wait_choice(WaitChoice::Plain);
    assert_eq!(wait(&mut r, ZERO), vec![(1, IN), (2, IN)]);
    assert!(wait(&mut r, ZERO).is_empty());
    assert_eq!(r.wait_mode(), Some(WaitMode::Plain));
    assert!(r.stats().plain_waits >= 1);
}

#[test]
fn wait_pending_reports_an_armed_request_and_left_over_events_until_a_wait_hands_them_out() {
    if !epoll_wait_or_skip(
        "wait_pending_reports_an_armed_request_and_left_over_events_until_a_wait_hands_them_out",
    ) {
        return;
    }
    // What the epoll shim checks before it hands an instance to the real epoll: whatever the
    // ring still holds for its next wait would be lost to a plain epoll_wait.
    let mut r = ring(true, WaitChoice::Ring);
    let pairs: Vec<(UnixStream, UnixStream)> =
        (0..3).map(|_| UnixStream::pair().unwrap()).collect();
    for (i, (a, _)) in pairs.iter().enumerate() {
        r.add(a.as_raw_fd(), Interest::IN | Interest::ET, i as u64)
            .unwrap();
    }
    assert!(!r.wait_pending());
    // A zero-timeout wait that finds nothing leaves its request armed (DEFER_TASKRUN).
    assert!(wait(&mut r, ZERO).is_empty());
    assert!(r.wait_pending());
    for (_, b) in &pairs {
        (&*b).write_all(b"x").unwrap();
    }
    // The armed request (64 events) completes with 3; a wait with room for 1 hands out one
    // and keeps two.
    let mut one = [Event::default(); 1];
    assert_eq!(r.wait(&mut one, ZERO).unwrap(), 1);
    assert!(r.wait_pending(), "two events left over");
    let mut rest = vec![one[0].token];
    for _ in 0..2 {
        assert_eq!(r.wait(&mut one, ZERO).unwrap(), 1);
        rest.push(one[0].token);
    }
    rest.sort();
    assert_eq!(rest, vec![0, 1, 2]);
    assert!(!r.wait_pending());
    // A wait that returns events from its own request leaves nothing behind.
    (&pairs[0].1).write_all(b"y").unwrap();
    assert_eq!(wait(&mut r, ZERO), vec![(0, IN)]);
    assert!(!r.wait_pending());
}

#[test]
fn a_oneshot_fires_once_across_switches_and_again_after_modify() {
    if !epoll_wait_or_skip("a_oneshot_fires_once_across_switches_and_again_after_modify") {
        return;
    }
    for defer in [false, true] {
        let mut r = ring(defer, WaitChoice::Plain);
        let (_a, mut b) = UnixStream::pair().unwrap();
        let fd = _a.as_raw_fd();
        r.add(fd, Interest::IN | Interest::ONESHOT, 9).unwrap();
        b.write_all(b"x").unwrap();
        assert_eq!(wait(&mut r, ZERO), vec![(9, IN)]);
        for _ in 0..3 {
            flip(&mut r);
            assert!(
                wait(&mut r, ZERO).is_empty(),
                "defer {defer}: oneshot fired again"
            );
        }
        r.modify(fd, Interest::IN | Interest::ONESHOT, 10).unwrap();
        flip(&mut r);
        assert_eq!(wait(&mut r, ZERO), vec![(10, IN)], "defer {defer}");
        flip(&mut r);
        assert!(wait(&mut r, ZERO).is_empty());
    }
}

#[test]
fn a_plain_wait_that_blocks_is_woken_by_an_fd_and_by_a_post() {
    if !epoll_wait_or_skip("a_plain_wait_that_blocks_is_woken_by_an_fd_and_by_a_post") {
        return;
    }
    let mut r = ring(false, WaitChoice::Plain);
    let (_a, b) = UnixStream::pair().unwrap();
    r.add(_a.as_raw_fd(), Interest::IN, 5).unwrap();
    let p = r.poster();
    let h = std::thread::spawn(move || {
        let mut b = b;
        std::thread::sleep(Duration::from_millis(50));
        b.write_all(b"x").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        p.post(77, 1).unwrap();
        b
    });
    // Generous limits: only that it returns with the event, not when.
    assert_eq!(wait(&mut r, Some(Duration::from_secs(20))), vec![(5, IN)]);
    let mut rd = [0u8; 1];
    (&_a).read_exact(&mut rd).unwrap();
    assert_eq!(wait(&mut r, Some(Duration::from_secs(20))), vec![(77, 1)]);
    let _b = h.join().unwrap();
    assert_eq!(r.wait_mode(), Some(WaitMode::Plain));
}

#[test]
fn a_zero_timeout_polling_loop_is_switched_to_epoll_wait_and_back_with_reasons() {
    if !epoll_wait_or_skip(
        "a_zero_timeout_polling_loop_is_switched_to_epoll_wait_and_back_with_reasons",
    ) {
        return;
    }
    let mut r = ring(false, WaitChoice::Auto);
    let (_a, mut b) = UnixStream::pair().unwrap();
    r.add(_a.as_raw_fd(), Interest::IN | Interest::ET, 1)
        .unwrap();
    assert_eq!(r.wait_mode(), Some(WaitMode::Ring));
    // A game-loop-like poller: zero-timeout waits, an edge now and then. Every edge must be
    // reported exactly once, whatever the mode at the time.
    let mut edges = 0;
    let mut seen = 0;
    for i in 0..2000 {
        if i % 10 == 0 {
            b.write_all(b"x").unwrap();
            edges += 1;
        }
        seen += wait(&mut r, ZERO).len();
    }
    assert_eq!(seen, edges);
    assert_eq!(r.wait_mode(), Some(WaitMode::Plain), "{:?}", r.decisions());
    let d = r.decisions().to_vec();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].to.to_string(), WaitMode::Plain.name());
    assert!(
        d[0].reason.contains("empty zero-timeout polls"),
        "{}",
        d[0].reason
    );
    let before = r.stats();
    for _ in 0..100 {
        wait(&mut r, ZERO);
    }
    let after = r.stats();
    // Plain: one epoll_wait per empty poll, where the ring made two entries.
    assert_eq!(after.wait_entries - before.wait_entries, 100);
    // Now a loop that sleeps (short timeouts that expire) while a poster exists, so each
    // plain sleep costs a missed epoll_wait plus the ring's sleep: back to the ring.
    let _poster = r.poster();
    for _ in 0..1500 {
        if r.wait_mode() == Some(WaitMode::Ring) {
            break;
        }
        wait(&mut r, Some(Duration::from_micros(200)));
    }
    assert_eq!(r.wait_mode(), Some(WaitMode::Ring), "{:?}", r.decisions());
    let d = r.decisions();
    assert_eq!(d.len(), 2, "{d:?}");
    assert!(d[1].reason.contains("sleeps"), "{}", d[1].reason);
    assert_eq!(r.stats().mode_switches, 2);
}

#[test]
fn an_empty_zero_timeout_wait_costs_the_entries_the_choice_assumes() {
    if !epoll_wait_or_skip("an_empty_zero_timeout_wait_costs_the_entries_the_choice_assumes") {
        return;
    }
    // The cost model of `event::choice`: ring 2 entries with COOP_TASKRUN (arm, then cancel
    // and reap), 1 with DEFER_TASKRUN (the request stays armed), epoll_wait 1.
    for (defer, choice, per_wait) in [
        (false, WaitChoice::Ring, 2),
        (true, WaitChoice::Ring, 1),
        (false, WaitChoice::Plain, 1),
        (true, WaitChoice::Plain, 1),
    ] {
        let mut r = ring(defer, choice);
        let (_a, _b) = UnixStream::pair().unwrap();
        r.add(_a.as_raw_fd(), Interest::IN, 1).unwrap();
        assert!(wait(&mut r, ZERO).is_empty());
        let before = r.stats().wait_entries;
        for _ in 0..100 {
            assert!(wait(&mut r, ZERO).is_empty());
        }
        assert_eq!(
            r.stats().wait_entries - before,
            100 * per_wait,
            "defer {defer}, {choice:?}"
        );
    }
}

#[test]
fn without_a_poster_a_plain_wait_sleeps_in_epoll_wait_itself() {
    if !epoll_wait_or_skip("without_a_poster_a_plain_wait_sleeps_in_epoll_wait_itself") {
        return;
    }
    let mut r = ring(false, WaitChoice::Plain);
    let (a, b) = UnixStream::pair().unwrap();
    r.add(a.as_raw_fd(), Interest::IN, 5).unwrap();
    let ring_enters = |r: &EventRing| r.stats().wait_entries - r.stats().plain_waits;
    let before = (ring_enters(&r), r.stats().plain_waits);
    let h = std::thread::spawn(move || {
        let mut b = b;
        std::thread::sleep(Duration::from_millis(50));
        b.write_all(b"x").unwrap();
        b
    });
    assert_eq!(wait(&mut r, Some(Duration::from_secs(20))), vec![(5, IN)]);
    let _b = h.join().unwrap();
    // A timeout ends it too, not early.
    let mut rd = [0u8; 1];
    (&a).read_exact(&mut rd).unwrap();
    let t0 = std::time::Instant::now();
    assert!(wait(&mut r, Some(Duration::from_millis(30))).is_empty());
    assert!(t0.elapsed() >= Duration::from_millis(30));
    // Only epoll_wait calls (a zero-timeout one and a blocking one per wait), no ring entry.
    assert_eq!(ring_enters(&r), before.0);
    assert!(r.stats().plain_waits - before.1 >= 4, "{:?}", r.stats());
}

extern "C" fn on_sigusr2(_: libc::c_int) {}

#[test]
fn a_signal_interrupts_a_blocking_wait_with_eintr_in_either_mode() {
    if !epoll_wait_or_skip("a_signal_interrupts_a_blocking_wait_with_eintr_in_either_mode") {
        return;
    }
    // A handler without SA_RESTART: epoll_wait reports EINTR, so must the ring in both modes
    // (plain without a poster sleeps in epoll_wait itself; with one, in the ring).
    // SAFETY: installs a handler that does nothing (async-signal-safe) for SIGUSR2, which
    // nothing else in this test binary uses.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigusr2 as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
    }
    for (choice, with_poster) in [
        (WaitChoice::Plain, false),
        (WaitChoice::Plain, true),
        (WaitChoice::Ring, false),
    ] {
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            let mut r = ring(false, choice);
            let (a, _b) = UnixStream::pair().unwrap();
            r.add(a.as_raw_fd(), Interest::IN, 1).unwrap();
            let _p = with_poster.then(|| r.poster());
            // SAFETY: pthread_self has no preconditions.
            tx.send(unsafe { libc::pthread_self() }).unwrap();
            let mut out = [Event::default(); 4];
            let t0 = std::time::Instant::now();
            let e = r.wait(&mut out, Some(Duration::from_secs(10)));
            (e.map_err(|e| e.raw_os_error()), t0.elapsed())
        });
        let t = rx.recv().unwrap();
        // Keep signalling until the wait returns (the first may land before it sleeps), for
        // at most 3 s: a wait that restarts after a signal then ends at its timeout.
        let stop = std::time::Instant::now() + Duration::from_secs(3);
        while !h.is_finished() && std::time::Instant::now() < stop {
            std::thread::sleep(Duration::from_millis(20));
            // SAFETY: the thread is alive until joined below.
            unsafe { libc::pthread_kill(t, libc::SIGUSR2) };
        }
        let (res, took) = h.join().unwrap();
        assert_eq!(
            res,
            Err(Some(libc::EINTR)),
            "{choice:?}, poster {with_poster}"
        );
        assert!(took < Duration::from_secs(8), "{choice:?}: {took:?}");
    }
}

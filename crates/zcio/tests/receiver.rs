//! Receiver: streams arrive intact and in order through every backend; backpressure instead
//! of drops; resets; ENOBUFS re-arm; zcrx registration errors explained.

mod common;

use common::streams::{
    collect, hold_chunks, paced_pattern_sender, release_and_receive_rest, run_streams, send_stream,
    set_linger_zero, small_buffers,
};

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use zcio::rx::{Receiver, RxConfig, RxEvent, RxMode, RxPath};

/// Backends (and bufring variants) that this host can run, each with its config.
fn backends() -> Vec<(&'static str, RxConfig, RxPath)> {
    let mut v = vec![("plain", RxConfig::with_mode(RxMode::Plain), RxPath::Plain)];
    let bufring = RxConfig {
        buf_size: 16 << 10,
        buffers: 64,
        ..RxConfig::with_mode(RxMode::BufRing).low_latency()
    };
    v.push(("bufring+bundles", bufring.clone(), RxPath::BufRing));
    v.push((
        "bufring rotation of 4 hot buffers",
        RxConfig {
            hot_bytes: 64 << 10,
            ..bufring.clone()
        },
        RxPath::BufRing,
    ));
    v.push((
        "bufring single",
        RxConfig {
            bundle: Some(false),
            ..bufring.clone()
        },
        RxPath::BufRing,
    ));
    v.push((
        "bufring incremental",
        RxConfig {
            incremental: true,
            buf_size: 256 << 10,
            buffers: 16,
            ..bufring.clone()
        },
        RxPath::BufRing,
    ));
    v.push((
        "bufring batched (default)",
        RxConfig {
            buf_size: 16 << 10,
            buffers: 64,
            ..RxConfig::with_mode(RxMode::BufRing)
        },
        RxPath::BufRing,
    ));
    v
}

#[test]
fn pattern_streams_arrive_intact_and_in_order_one_connection() {
    for (name, cfg, path) in backends() {
        run_streams(name, &cfg, path, 1, 24 << 20);
    }
}

#[test]
fn pattern_streams_arrive_intact_and_in_order_64_connections() {
    for (name, cfg, path) in backends() {
        run_streams(name, &cfg, path, 64, 512 << 10);
    }
}

#[test]
fn consumer_holding_chunks_slows_the_sender_and_loses_nothing() {
    for (name, cfg) in [
        (
            "bufring",
            RxConfig {
                buf_size: 4096,
                buffers: 8,
                ..RxConfig::with_mode(RxMode::BufRing)
            },
        ),
        (
            "bufring, 2 of 8 buffers in rotation",
            RxConfig {
                buf_size: 4096,
                buffers: 8,
                hot_bytes: 8192,
                ..RxConfig::with_mode(RxMode::BufRing)
            },
        ),
        (
            "plain",
            RxConfig {
                buf_size: 4096,
                buffers: 8,
                ..RxConfig::with_mode(RxMode::Plain)
            },
        ),
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        small_buffers(&listener, libc::SO_RCVBUF);
        let addr = listener.local_addr().unwrap();
        let mut rx = Receiver::listen(listener, &cfg).unwrap();
        let total: u64 = 8 << 20;
        let (sender, sent) = paced_pattern_sender(addr, total);
        // Receive and hold every chunk: the ring (8 x 4 KiB) runs dry.
        let (held, got) = hold_chunks(&mut rx, Duration::from_millis(300));
        assert!(
            held.len() <= 8,
            "{name}: more chunks than buffers: {}",
            held.len()
        );
        let stalled_at = sent.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            stalled_at < total,
            "{name}: the sender finished although the receiver held every buffer"
        );
        // Check, release, and receive the rest.
        release_and_receive_rest(name, &mut rx, held, total, Duration::from_secs(20));
        sender.join().unwrap();
        assert!(got <= 8 * 4096);
        let c = rx.stats();
        assert!(c.backpressure_waits > 0 || c.enobufs > 0, "{name}: {c:?}");
        eprintln!("{name}: held {got} B while the sender stalled at {stalled_at}; {c:?}");
    }
}

#[test]
fn peer_reset_mid_stream_is_reported_after_the_bytes_before_it() {
    for (name, cfg, _) in backends() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut rx = Receiver::listen(listener, &cfg).unwrap();
        let (tx, ack) = std::sync::mpsc::channel::<()>();
        let sender = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let mut buf = vec![0u8; 100_000];
            common::fill_pattern(&mut buf, 0);
            s.write_all(&buf).unwrap();
            // Wait until the receiver has read it all, then reset.
            ack.recv().unwrap();
            set_linger_zero(&s);
            drop(s);
        });
        let mut off = 0u64;
        let mut closed = None;
        let mut acked = false;
        let deadline = Instant::now() + Duration::from_secs(10);
        while closed.is_none() {
            assert!(Instant::now() < deadline, "{name}: no close seen");
            rx.poll(Duration::from_millis(50), &mut |ev| match ev {
                RxEvent::Data(c) => {
                    common::check_pattern(&c, off).unwrap();
                    off += c.len() as u64;
                }
                RxEvent::Closed(_, e) => closed = Some(e),
                RxEvent::Accepted(_) => {}
            })
            .unwrap();
            if off == 100_000 && !acked {
                tx.send(()).unwrap();
                acked = true;
            }
        }
        sender.join().unwrap();
        assert_eq!(off, 100_000, "{name}");
        let err = closed
            .unwrap()
            .unwrap_or_else(|| panic!("{name}: reset reported as EOF"));
        assert_eq!(err.raw_os_error(), Some(libc::ECONNRESET), "{name}: {err}");
        assert_eq!(rx.open_connections(), 0);
    }
}

#[test]
fn tiny_buffer_ring_rearms_after_enobufs_without_loss() {
    for bundle in [false, true] {
        let cfg = RxConfig {
            buf_size: 4096,
            buffers: 2,
            bundle: Some(bundle),
            ..RxConfig::with_mode(RxMode::BufRing)
        };
        run_streams("tiny ring", &cfg, RxPath::BufRing, 1, 4 << 20);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut rx = Receiver::listen(listener, &cfg).unwrap();
        let t = std::thread::spawn(move || {
            let s = send_stream(addr, 0, 4 << 20, 64 << 10).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
        });
        let streams = collect(&mut rx, 1, RxPath::BufRing);
        t.join().unwrap();
        assert_eq!(streams[0].got, 4 << 20);
        let c = rx.stats();
        assert!(c.ring_dry > 0, "a 2-buffer ring never ran dry: {c:?}");
        // Without bundles a dry ring ends the multishot with ENOBUFS; with bundles the kernel
        // usually ends it with the data of the bundle that took the last buffers (counted as
        // a re-arm, not as ENOBUFS), so only the re-arm is certain there.
        if !bundle {
            assert!(c.enobufs > 0, "no ENOBUFS without bundles: {c:?}");
        }
        assert!(c.rearms >= c.enobufs.max(1), "{c:?}");
    }
}

#[test]
fn zcrx_on_loopback_is_refused_with_an_explanation() {
    let chk = zcio::rx::zcrx::check_interface("lo", 0);
    eprintln!("{chk:#?}");
    assert!(!chk.ok);
    let errno = chk.errno.expect("an errno");
    assert!(
        errno == libc::EOPNOTSUPP || errno == libc::EINVAL || errno == libc::EPERM,
        "unexpected errno {errno}: {}",
        chk.explanation
    );
    assert!(!chk.explanation.is_empty());
    assert!(chk.needed.iter().any(|n| n.contains("tcp-data-split")));
    assert!(chk.current.iter().any(|c| c.starts_with("driver")));
}

#[test]
fn zcrx_on_a_missing_interface_is_enodev() {
    let chk = zcio::rx::zcrx::check_interface("zcio-nope0", 0);
    assert!(!chk.ok);
    assert_eq!(chk.errno, Some(libc::ENODEV));
    assert!(
        chk.explanation.contains("no interface named"),
        "{}",
        chk.explanation
    );
    assert!(chk.current[0].contains("absent"));
}

#[test]
fn zcrx_on_a_queue_that_does_not_exist_is_refused() {
    let chk = zcio::rx::zcrx::check_interface("lo", 4096);
    eprintln!("{chk:#?}");
    assert!(!chk.ok);
    let errno = chk.errno.expect("an errno");
    assert!(
        [libc::EINVAL, libc::ERANGE, libc::ENOENT, libc::EOPNOTSUPP].contains(&errno),
        "{errno}: {}",
        chk.explanation
    );
}

#[test]
fn zcrx_on_a_veth_in_a_test_namespace_is_refused() {
    if !common::can_make_hosts("zcrx_on_a_veth_in_a_test_namespace_is_refused") {
        return;
    }
    let pair = zcio_testnet::Pair::new("zcrx").unwrap();
    let iface = pair.iface;
    let chk = pair
        .b
        .run(move || zcio::rx::zcrx::check_interface(iface, 0))
        .unwrap();
    eprintln!("{chk:#?}");
    assert!(!chk.ok);
    let f = zcio::ring::features::Features::get();
    if !f.has(zcio::ring::features::Features::RECV_ZC) {
        // Before 6.15 the kernel has no zcrx: EINVAL for the unknown registration.
        assert_eq!(chk.errno, Some(libc::EINVAL), "{}", chk.explanation);
        assert!(chk.explanation.contains("no zcrx"), "{}", chk.explanation);
        return;
    }
    assert_eq!(chk.errno, Some(libc::EOPNOTSUPP), "{}", chk.explanation);
    assert!(
        chk.explanation.contains("queue management"),
        "{}",
        chk.explanation
    );
}

#[test]
fn explicit_zcrx_mode_fails_with_the_registration_errno() {
    let cfg = RxConfig {
        zcrx: Some(zcio::rx::ZcrxTarget::new("lo", 0)),
        ..RxConfig::with_mode(RxMode::Zcrx)
    };
    match Receiver::new(&cfg) {
        Err(zcio::rx::RxError::Zcrx(e)) => {
            assert!(e.source.raw_os_error().is_some());
            assert!(!e.explanation.is_empty());
            assert!(!e.nodev);
        }
        other => panic!("zcrx on lo must fail registration: {other:?}"),
    }
}

#[test]
fn auto_mode_falls_back_to_bufring_and_records_why() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let rx = Receiver::listen(listener, &RxConfig::default()).unwrap();
    assert_eq!(rx.path(), RxPath::BufRing, "{}", rx.describe());
    let fb = rx
        .fallbacks()
        .iter()
        .find(|f| f.from == RxPath::Zcrx.into())
        .expect("zcrx fallback recorded");
    assert_eq!(fb.to, RxPath::BufRing.into());
    assert!(fb.reason.contains("lo rx queue 0"), "{}", fb.reason);
}

#[test]
fn chunks_outlive_the_receiver_and_close_cancels_a_busy_connection() {
    for (name, cfg, _) in backends() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut rx = Receiver::listen(listener, &cfg).unwrap();
        // An endless sender: the receiver closes it mid-stream.
        let sender = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let mut buf = vec![0u8; 64 << 10];
            let mut off = 0u64;
            loop {
                common::fill_pattern(&mut buf, off);
                if s.write_all(&buf).is_err() {
                    return off;
                }
                off += buf.len() as u64;
            }
        });
        let mut kept = Vec::new();
        let mut off = 0u64;
        let mut conn = None;
        let deadline = Instant::now() + Duration::from_secs(10);
        while off < (1 << 20) {
            assert!(
                Instant::now() < deadline,
                "{name}: no data after {off} B: {} {:?}",
                rx.describe(),
                rx.stats()
            );
            rx.poll(Duration::from_millis(50), &mut |ev| match ev {
                RxEvent::Accepted(id) => conn = Some(id),
                RxEvent::Data(c) => {
                    common::check_pattern(&c, off).unwrap();
                    off += c.len() as u64;
                    if kept.len() < 2 {
                        kept.push(c);
                    }
                }
                RxEvent::Closed(id, e) => panic!("{name}: {id} closed early: {e:?}"),
            })
            .unwrap();
        }
        rx.close(conn.unwrap());
        // The close takes effect: no more data for it, and the connection is gone.
        let settle = Instant::now() + Duration::from_millis(300);
        while Instant::now() < settle {
            rx.poll(Duration::from_millis(20), &mut |ev| {
                if let RxEvent::Data(c) = ev {
                    panic!("{name}: data after close: {c:?}");
                }
            })
            .unwrap();
        }
        assert_eq!(rx.open_connections(), 0, "{name}");
        // The sender sees the connection die.
        let sent = sender.join().unwrap();
        assert!(sent >= off, "{name}");
        // Dropping the receiver (which cancels and drains the ring) leaves held chunks intact.
        drop(rx);
        let mut o = 0u64;
        for c in &kept {
            common::check_pattern(c, o).unwrap();
            o += c.len() as u64;
        }
    }
}

#[test]
fn auto_mode_falls_back_to_plain_when_io_uring_is_denied() {
    let t = std::thread::spawn(|| {
        zcio_testnet::seccomp::deny_syscall_in_this_thread(libc::SYS_io_uring_setup, libc::ENOSYS)
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut rx = Receiver::listen(listener, &RxConfig::default()).unwrap();
        assert_eq!(rx.path(), RxPath::Plain, "{}", rx.describe());
        let from: Vec<_> = rx.fallbacks().iter().map(|f| f.from.clone()).collect();
        assert_eq!(
            from,
            [RxPath::Zcrx.into(), RxPath::BufRing.into()],
            "{:?}",
            rx.fallbacks()
        );
        assert!(
            rx.fallbacks()[1].reason.contains("ENOSYS"),
            "{:?}",
            rx.fallbacks()
        );
        // And it still receives.
        let s = std::thread::spawn(move || {
            let s = send_stream(addr, 7 << 36, 1 << 20, 64 << 10).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
        });
        let streams = collect(&mut rx, 1, RxPath::Plain);
        s.join().unwrap();
        assert_eq!((streams[0].base, streams[0].got), (7 << 36, 1 << 20));
    });
    t.join().unwrap();
}

/// The zcrx completion → chunk → refill entry path, over memory laid out as the kernel lays
/// it out (head at 0, tail at 4, RQEs at 64). The kernel side of the protocol (consuming RQEs
/// and advancing the head) is exercised in `buf::refill`'s unit tests.
#[test]
fn zcrx_completions_decode_into_area_ranges_and_return_through_the_refill_ring() {
    use std::rc::Rc;
    use zcio::buf::refill::{RefillRing, ZcrxArea};
    use zcio::buf::Region;
    use zcio::sys::zcrx::IORING_ZCRX_AREA_SHIFT;
    let entries = 4;
    let refill = RefillRing::new(
        Region::new(zcio::ring::zcrx::refill_region_len(entries), false).unwrap(),
        0,
        4,
        64,
        entries,
    )
    .unwrap();
    let token = 2u64 << IORING_ZCRX_AREA_SHIFT;
    let mut area_mem = Region::new(64 << 10, false).unwrap();
    area_mem.as_mut_slice()[8192..8192 + 5].copy_from_slice(b"hello");
    let area = Rc::new(ZcrxArea::new(area_mem, refill, token));
    assert_eq!(area.area_id(), 2);
    // SAFETY (test): the values stand for RECV_ZC completions of this area.
    let chunk = unsafe { area.lease_from_cqe(5, token | 8192) }.unwrap();
    assert_eq!(&*chunk, b"hello");
    assert_eq!(
        area.refill().tail(),
        0,
        "nothing returned while the chunk lives"
    );
    drop(chunk);
    assert_eq!(area.refill().tail(), 1);
    assert_eq!(area.refill().rqe(0), (token | 8192, 5));
    // Fill the ring: the kernel has consumed nothing, so the fifth return waits, in order.
    let leases: Vec<_> = (1..=4u64)
        // SAFETY (test): as above.
        .map(|i| unsafe { area.lease_from_cqe(100, token | (i * 4096)) }.unwrap())
        .collect();
    drop(leases);
    assert_eq!(area.refill().tail(), 4);
    assert_eq!(area.refill().pending(), 1);
    assert_eq!(area.refill().rqe(3), (token | (3 * 4096), 100));
    // A completion for another area, or past the end, is refused.
    // SAFETY (test): decoding only.
    unsafe {
        assert!(area
            .lease_from_cqe(5, (1u64 << IORING_ZCRX_AREA_SHIFT) | 8192)
            .is_err());
        assert!(area.lease_from_cqe(4096, token | (63 << 10)).is_err());
    }
}

const EMFILE_CHILD: &str = "ZCIO_TEST_EMFILE_CHILD";
const EMFILE_CLIENTS: usize = 24;

/// A receiver whose process runs out of descriptors pauses accepting instead of retrying the
/// failing accept in a busy loop (a level-triggered listener, or a multishot accept re-armed
/// at once, spins on EMFILE), keeps serving, and accepts the queued connections once
/// descriptors are free again. Runs in a child process (this test binary, this test only) whose
/// RLIMIT_NOFILE is lowered, so the other tests keep their descriptors.
#[test]
fn out_of_descriptors_pauses_accepting_instead_of_spinning() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    if let Ok(mode) = std::env::var(EMFILE_CHILD) {
        emfile_child(&mode);
        return;
    }
    for mode in ["plain", "bufring"] {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "out_of_descriptors_pauses_accepting_instead_of_spinning",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(EMFILE_CHILD, mode)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut port = None;
        let mut line = String::new();
        while port.is_none() {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "{mode}: child said no port"
            );
            // libtest may print "test <name> ... " before it on the same line.
            port = line
                .split("PORT ")
                .nth(1)
                .map(|p| p.trim().parse::<u16>().unwrap());
        }
        let clients: Vec<TcpStream> = (0..EMFILE_CLIENTS)
            .map(|_| TcpStream::connect(("127.0.0.1", port.unwrap())).unwrap())
            .collect();
        // The child accepts a few, runs out of descriptors, and must sit quietly.
        std::thread::sleep(Duration::from_millis(1500));
        drop(clients);
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut rest);
        let st = child.wait().unwrap();
        assert!(st.success(), "{mode}: child failed: {rest}");
        assert!(rest.contains("EMFILE-OK"), "{mode}: {rest}");
    }
}

fn emfile_child(mode: &str) {
    let cfg = RxConfig::with_mode(mode.parse().unwrap());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    // The limit goes down before the receiver exists: io_uring's accept takes the limit when
    // the request is prepared. Room for the receiver's own descriptors and a few connections.
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let lim = libc::rlimit {
        rlim_cur: open + 8,
        rlim_max: open + 8,
    };
    // SAFETY (test): plain setrlimit with a valid struct, in a child that runs only this test.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let mut rx = Receiver::listen(l, &cfg).unwrap();
    println!("\nPORT {port}");
    std::io::stdout().flush().unwrap();
    let (t0, cpu0) = (Instant::now(), cpu_seconds());
    let mut accepted = 0;
    while accepted < EMFILE_CLIENTS || rx.open_connections() > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{mode}: accepted {accepted} of {EMFILE_CLIENTS}, {} open: {:?}",
            rx.open_connections(),
            rx.stats()
        );
        rx.poll(Duration::from_millis(100), &mut |ev| {
            if let RxEvent::Accepted(_) = ev {
                accepted += 1;
            }
        })
        .unwrap_or_else(|e| panic!("{mode}: poll failed: {e}"));
    }
    let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    let c = rx.stats();
    assert!(c.accept_backoffs > 0, "{mode}: never ran out: {c:?}");
    assert!(
        cpu < 0.5 * wall,
        "{mode}: {cpu:.2} CPU s in {wall:.2} s: accepting spun ({c:?})"
    );
    println!("EMFILE-OK {mode}: {cpu:.3} CPU s in {wall:.2} s, {c:?}");
}

fn cpu_seconds() -> f64 {
    // SAFETY (test): getrusage fills the zeroed struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) }, 0);
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[test]
fn a_poll_returns_within_its_timeout_however_long_the_batch_min_wait() {
    // The kernel (6.18) arms a batched wait's first timer at `min_wait` whatever the wait's
    // own timeout: before, a zero-timeout poll (`on_ready`, every async harvest) slept the
    // whole min-wait when nothing was ready, 200 µs per harvest with the default settings.
    let cfg = RxConfig {
        batch: 32,
        min_wait: Duration::from_millis(100),
        ..RxConfig::with_mode(RxMode::BufRing)
    };
    let mut rx = Receiver::new(&cfg).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    rx.add(l.accept().unwrap().0).unwrap();
    // The first poll arms the receive; nothing ever arrives.
    rx.poll(Duration::ZERO, &mut |_| {}).unwrap();
    let t0 = Instant::now();
    for _ in 0..10 {
        assert_eq!(rx.poll(Duration::ZERO, &mut |_| {}).unwrap(), 0);
    }
    let zero = t0.elapsed();
    let t0 = Instant::now();
    rx.poll(Duration::from_millis(5), &mut |_| {}).unwrap();
    let short = t0.elapsed();
    eprintln!("10 zero-timeout polls: {zero:?}; a 5 ms poll: {short:?}");
    assert!(
        zero < common::scaled(Duration::from_millis(100)),
        "10 zero-timeout polls took {zero:?} (each waited the 100 ms min-wait)"
    );
    assert!(
        short < common::scaled(Duration::from_millis(60)),
        "a 5 ms poll took {short:?}"
    );
}

/// [`Receiver::pause`] right after a harvest, with the peer still sending: under
/// `DEFER_TASKRUN` the kernel receives only inside this thread's enters, so it had taken
/// nothing the application has not seen, and nothing more arrives for the paused connection,
/// however many buffers the application gives back before its next poll. A bundle that takes
/// the ring's last buffers ends its multishot with its data; re-armed in that same harvest, the
/// new receive went in with the next enter, ahead of the pause's cancel, and took every buffer
/// given back (all 8 here): a second burst after the pause, how a proxy pair held 92 chunks
/// against its 16-chunk limit and a 64-buffer ring.
#[test]
fn a_connection_paused_after_a_harvest_gets_nothing_more_while_its_peer_keeps_sending() {
    for bundle in [true, false] {
        let cfg = RxConfig {
            buf_size: 16 << 10,
            buffers: 8,
            bundle: Some(bundle),
            ..RxConfig::with_mode(RxMode::BufRing)
        };
        let mut rx = Receiver::new(&cfg).unwrap();
        let defer = rx.describe().contains(", DEFER_TASKRUN");
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        // The peer keeps the socket far fuller than the ring (8 x 16 KiB) until it is closed.
        peer.set_write_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let writer = std::thread::spawn(move || {
            let buf = vec![7u8; 64 << 10];
            while peer.write_all(&buf).is_ok() {}
        });
        let id = rx.add(s).unwrap();
        let mut after_pause = Vec::new();
        for round in 0..20 {
            let mut held = Vec::new();
            let end = Instant::now() + Duration::from_secs(10);
            while held.is_empty() {
                assert!(
                    Instant::now() < end,
                    "bundle {bundle}: round {round}: no data"
                );
                rx.poll(Duration::from_millis(100), &mut |ev| {
                    if let RxEvent::Data(c) = ev {
                        held.push(c);
                    }
                })
                .unwrap();
            }
            rx.pause(id);
            // Every buffer goes back to the ring before the next poll.
            drop(held);
            let mut n = 0;
            for _ in 0..5 {
                rx.poll(Duration::from_millis(20), &mut |ev| {
                    if let RxEvent::Data(_) = ev {
                        n += 1;
                    }
                })
                .unwrap();
            }
            after_pause.push(n);
            rx.resume(id).unwrap();
        }
        rx.close(id);
        drop(rx);
        writer.join().unwrap();
        if defer {
            assert!(
                after_pause.iter().all(|&n| n == 0),
                "bundle {bundle}: chunks after each pause: {after_pause:?}"
            );
        } else {
            // Without DEFER_TASKRUN the kernel may receive between the harvest and the
            // pause's cancel: at most the ring's buffers.
            eprintln!("no DEFER_TASKRUN on this kernel: only the ring bounds what follows a pause");
            assert!(
                after_pause.iter().all(|&n| n <= 8),
                "bundle {bundle}: chunks after each pause: {after_pause:?}"
            );
        }
    }
}

extern "C" fn on_sigusr1(_: libc::c_int) {}

/// A signal that cuts a receiver's wait short (a handler, job control's SIGSTOP/SIGCONT, a
/// debugger attaching) is a wake-up, not an error: the wait returns what is there and the
/// caller waits again. Before, the ring backend's first-completion wait passed `EINTR` up, and
/// `zcio proxy` exited when `strace` attached.
#[test]
fn a_signal_during_a_wait_is_a_wake_up_not_an_error() {
    // SAFETY: installs a handler that does nothing (async-signal-safe) for SIGUSR1, which
    // nothing else in this test binary uses; no SA_RESTART (waits are not restarted anyway).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigusr1 as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let mut cases = backends();
    cases.push((
        "bufring with the library's defaults",
        RxConfig::with_mode(RxMode::BufRing),
        RxPath::BufRing,
    ));
    for (name, cfg, _) in cases {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || -> Result<(usize, u32), String> {
            // SAFETY: pthread_self has no preconditions.
            tid_tx.send(unsafe { libc::pthread_self() }).unwrap();
            let mut rx = Receiver::listen(listener, &cfg).map_err(|e| e.to_string())?;
            let (mut polls, mut got) = (0usize, 0u32);
            let end = Instant::now() + Duration::from_secs(20);
            while got == 0 && Instant::now() < end {
                polls += 1;
                rx.poll(Duration::from_secs(5), &mut |ev| {
                    if let RxEvent::Data(c) = ev {
                        got += c.len() as u32;
                    }
                })
                .map_err(|e| format!("poll {polls}: {e}"))?;
            }
            Ok((polls, got))
        });
        let t = tid_rx.recv().unwrap();
        let mut client = TcpStream::connect(addr).unwrap();
        // Signals while the receiver waits with nothing to read, then the byte it waits for.
        let stop = Instant::now() + Duration::from_millis(400);
        while Instant::now() < stop && !h.is_finished() {
            std::thread::sleep(Duration::from_millis(15));
            // SAFETY: the thread is alive until joined below (checked just above).
            unsafe { libc::pthread_kill(t, libc::SIGUSR1) };
        }
        client.write_all(b"x").unwrap();
        let r = h.join().unwrap();
        let (polls, got) = r.unwrap_or_else(|e| panic!("{name}: a signal failed the wait: {e}"));
        assert_eq!(got, 1, "{name}: the byte after the signals");
        assert!(
            polls >= 2,
            "{name}: {polls} polls: the signals did not reach a wait"
        );
    }
}

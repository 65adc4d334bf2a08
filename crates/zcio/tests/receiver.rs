//! Receiver: streams arrive intact and in order through every backend; backpressure instead
//! of drops; resets; ENOBUFS re-arm; zcrx registration errors explained.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};
use zcio::ring::features::Features;
use zcio::rx::{ConnId, Receiver, RxConfig, RxEvent, RxMode, RxPath, ZcrxTarget};

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

/// Sends an 8-byte header with the stream's pattern base, then `len` pattern bytes.
fn send_stream(addr: SocketAddr, base: u64, len: u64, write: usize) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(addr)?;
    s.write_all(&base.to_le_bytes())?;
    let mut buf = vec![0u8; write];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(write as u64) as usize;
        common::fill_pattern(&mut buf[..n], base + off);
        s.write_all(&buf[..n])?;
        off += n as u64;
    }
    Ok(s)
}

/// Per-connection checker: header, then the pattern in order.
#[derive(Default)]
struct Stream {
    header: Vec<u8>,
    base: u64,
    got: u64,
}

impl Stream {
    fn eat(&mut self, mut data: &[u8]) {
        if self.header.len() < 8 {
            let n = (8 - self.header.len()).min(data.len());
            self.header.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.header.len() == 8 {
                self.base = u64::from_le_bytes(self.header[..].try_into().unwrap());
            }
        }
        if let Err(bad) = common::check_pattern(data, self.base + self.got) {
            panic!(
                "stream {:#x}: byte at offset {} is wrong (reordered or corrupt)",
                self.base,
                bad - self.base
            );
        }
        self.got += data.len() as u64;
    }
}

fn run_streams(name: &str, cfg: &RxConfig, path: RxPath, conns: usize, len: u64) {
    let t0 = Instant::now();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut rx = Receiver::listen(listener, cfg).unwrap();
    assert_eq!(rx.path(), path, "{name}: {}", rx.describe());
    let senders: Vec<_> = (0..conns)
        .map(|k| {
            std::thread::spawn(move || {
                let s = send_stream(addr, (k as u64) << 36, len, 48 << 10).unwrap();
                s.shutdown(std::net::Shutdown::Write).unwrap();
                // Keep the socket until the receiver has seen the end.
                let mut b = [0u8; 1];
                let _ = std::io::Read::read(&mut &s, &mut b);
            })
        })
        .collect();
    let streams = collect(&mut rx, conns, path);
    for t in senders {
        t.join().unwrap();
    }
    let mut bases: Vec<u64> = streams.iter().map(|s| s.base).collect();
    bases.sort_unstable();
    assert_eq!(
        bases,
        (0..conns as u64).map(|k| k << 36).collect::<Vec<_>>()
    );
    for s in &streams {
        assert_eq!(s.got, len, "{name}: stream {:#x} short", s.base);
    }
    let c = rx.counters();
    eprintln!(
        "{name} x{conns} in {:?}: {} {c:?} fallbacks {:?}",
        t0.elapsed(),
        rx.describe(),
        rx.fallbacks()
    );
    assert_eq!(c.bytes, conns as u64 * (len + 8), "{name}: {c:?}");
    assert_eq!(rx.open_connections(), 0);
}

/// Receives until `conns` streams have ended; returns them.
fn collect(rx: &mut Receiver, conns: usize, path: RxPath) -> Vec<Stream> {
    let mut streams: HashMap<ConnId, Stream> = HashMap::new();
    let mut done = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while done.len() < conns {
        assert!(
            Instant::now() < deadline,
            "timed out: {} of {conns} done",
            done.len()
        );
        rx.poll(Duration::from_millis(100), &mut |ev| match ev {
            RxEvent::Accepted(id) => {
                streams.insert(id, Stream::default());
            }
            RxEvent::Data(chunk) => {
                assert_eq!(chunk.path(), path);
                streams
                    .get_mut(&chunk.conn())
                    .expect("data for an accepted connection")
                    .eat(&chunk);
            }
            RxEvent::Closed(id, err) => {
                assert!(err.is_none(), "{id}: {err:?}");
                done.push(streams.remove(&id).expect("known connection"));
            }
        })
        .unwrap();
    }
    done
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

/// Sets `SO_RCVBUF`/`SO_SNDBUF` small so that a stalled receiver stalls the sender quickly.
fn small_buffers(fd: &impl std::os::fd::AsRawFd, opt: i32) {
    zcio::sys::setsockopt_int(fd, libc::SOL_SOCKET, opt, 32 << 10).unwrap();
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
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let sent2 = sent.clone();
        let sender = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            small_buffers(&s, libc::SO_SNDBUF);
            let mut buf = vec![0u8; 4096];
            let mut off = 0;
            while off < total {
                common::fill_pattern(&mut buf, off);
                s.write_all(&buf).unwrap();
                off += buf.len() as u64;
                sent2.store(off, std::sync::atomic::Ordering::Relaxed);
            }
        });
        // Receive and hold every chunk: the ring (8 x 4 KiB) runs dry.
        let mut held = Vec::new();
        let mut got = 0u64;
        let hold_until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < hold_until {
            rx.poll(Duration::from_millis(20), &mut |ev| {
                if let RxEvent::Data(c) = ev {
                    got += c.len() as u64;
                    held.push(c);
                }
            })
            .unwrap();
        }
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
        let mut off = 0u64;
        for c in held.drain(..) {
            common::check_pattern(&c, off).unwrap();
            off += c.len() as u64;
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while off < total {
            assert!(
                Instant::now() < deadline,
                "{name}: stuck at {off} of {total}"
            );
            rx.poll(Duration::from_millis(50), &mut |ev| {
                if let RxEvent::Data(c) = ev {
                    common::check_pattern(&c, off).unwrap();
                    off += c.len() as u64;
                }
            })
            .unwrap();
        }
        sender.join().unwrap();
        assert_eq!(off, total);
        assert!(got <= 8 * 4096);
        let c = rx.counters();
        assert!(c.backpressure_waits > 0 || c.enobufs > 0, "{name}: {c:?}");
        eprintln!("{name}: held {got} B while the sender stalled at {stalled_at}; {c:?}");
    }
}

/// `SO_LINGER {on, 0}`: closing sends a reset instead of a FIN.
fn set_linger_zero(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `l` lives for the call and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as u32,
        )
    };
    assert_eq!(r, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
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
        let c = rx.counters();
        assert!(c.enobufs > 0, "a 2-buffer ring never ran dry: {c:?}");
        assert!(c.rearms >= c.enobufs, "{c:?}");
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
fn zcrx_mode_without_a_queue_is_deviceless_or_falls_back_to_bufring_with_the_reason() {
    let f = Features::get();
    let rx = Receiver::new(&RxConfig::with_mode(RxMode::Zcrx)).unwrap();
    match f.why_not(Features::ZCRX_NODEV) {
        None if zcio_testnet::is_root() => {
            assert_eq!(rx.path(), RxPath::ZcrxNodev, "{}", rx.describe());
            assert!(rx.fallbacks().is_empty(), "{:?}", rx.fallbacks());
            assert!(rx.describe().contains("COPIED 1.0"), "{}", rx.describe());
        }
        _ => {
            assert_eq!(rx.path(), RxPath::BufRing, "{}", rx.describe());
            let fb = &rx.fallbacks()[0];
            assert_eq!(
                (fb.from.as_str(), fb.to.as_str()),
                ("zcrx (device-less)", "bufring")
            );
            assert!(
                fb.reason.contains("7.1") || fb.reason.contains("CAP_NET_ADMIN"),
                "{fb}"
            );
        }
    }
}

/// Device-less zcrx (`ZCRX_REG_NODEV`) is usable here, or the test skips: a kernel before
/// 7.1 is a kernel-feature skip (fails only with `ZCIO_REQUIRE_ZCRX=1`, which the 7.x guest of
/// `scripts/vmtest` sets), a missing CAP_NET_ADMIN a privilege skip.
fn zcrx_nodev_or_skip(test: &str) -> bool {
    if !zcio_testnet::is_root() {
        return common::skip(test, "zcrx registration needs CAP_NET_ADMIN (run as root)");
    }
    match Features::get().why_not(Features::ZCRX_NODEV) {
        None => true,
        Some(why) => zcio_testnet::skip_kernel_feature(test, "ZCIO_REQUIRE_ZCRX", &why),
    }
}

fn nodev_cfg(area_len: usize, rq_entries: u32) -> RxConfig {
    RxConfig {
        zcrx: Some(ZcrxTarget {
            area_len,
            rq_entries,
            ..ZcrxTarget::deviceless()
        }),
        ..RxConfig::with_mode(RxMode::Zcrx)
    }
}

#[test]
fn zcrx_deviceless_pattern_streams_arrive_intact_and_in_order_one_connection() {
    if !zcrx_nodev_or_skip(
        "zcrx_deviceless_pattern_streams_arrive_intact_and_in_order_one_connection",
    ) {
        return;
    }
    let cfg = RxConfig::with_mode(RxMode::Zcrx);
    run_streams("zcrx device-less", &cfg, RxPath::ZcrxNodev, 1, 8 << 20);
}

#[test]
fn zcrx_deviceless_pattern_streams_arrive_intact_and_in_order_64_connections() {
    if !zcrx_nodev_or_skip(
        "zcrx_deviceless_pattern_streams_arrive_intact_and_in_order_64_connections",
    ) {
        return;
    }
    let cfg = RxConfig::with_mode(RxMode::Zcrx);
    run_streams("zcrx device-less", &cfg, RxPath::ZcrxNodev, 64, 256 << 10);
}

#[test]
fn zcrx_deviceless_bytes_are_counted_as_copied_by_the_kernel() {
    if !zcrx_nodev_or_skip("zcrx_deviceless_bytes_are_counted_as_copied_by_the_kernel") {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut rx = Receiver::listen(listener, &RxConfig::with_mode(RxMode::Zcrx)).unwrap();
    let t = std::thread::spawn(move || {
        let s = send_stream(addr, 0, 1 << 20, 64 << 10).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let streams = collect(&mut rx, 1, RxPath::ZcrxNodev);
    t.join().unwrap();
    assert_eq!(streams[0].got, 1 << 20);
    let c = rx.counters();
    assert_eq!(c.bytes, (1 << 20) + 8);
    assert_eq!(
        c.copy_fallback_bytes, c.bytes,
        "every byte was copied: {c:?}"
    );
    assert_eq!(c.zerocopy_bytes, 0, "{c:?}");
    assert!(
        c.refill_flushes > 0,
        "returns reach the kernel by FLUSH_RQ: {c:?}"
    );
    assert!(RxPath::ZcrxNodev.copies());
}

#[test]
fn zcrx_deviceless_consumer_holding_chunks_slows_the_sender_and_loses_nothing() {
    if !zcrx_nodev_or_skip(
        "zcrx_deviceless_consumer_holding_chunks_slows_the_sender_and_loses_nothing",
    ) {
        return;
    }
    // A 16-page area: holding every chunk exhausts it.
    let cfg = nodev_cfg(64 << 10, 64);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    small_buffers(&listener, libc::SO_RCVBUF);
    let addr = listener.local_addr().unwrap();
    let mut rx = Receiver::listen(listener, &cfg).unwrap();
    assert_eq!(rx.path(), RxPath::ZcrxNodev, "{}", rx.describe());
    let total: u64 = 4 << 20;
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sent2 = sent.clone();
    let sender = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        small_buffers(&s, libc::SO_SNDBUF);
        let mut buf = vec![0u8; 4096];
        let mut off = 0;
        while off < total {
            common::fill_pattern(&mut buf, off);
            s.write_all(&buf).unwrap();
            off += buf.len() as u64;
            sent2.store(off, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let mut held = Vec::new();
    let mut got = 0u64;
    let hold_until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < hold_until {
        rx.poll(Duration::from_millis(20), &mut |ev| {
            if let RxEvent::Data(c) = ev {
                got += c.len() as u64;
                held.push(c);
            }
        })
        .unwrap();
    }
    assert!(got <= 64 << 10, "more bytes held than the area has: {got}");
    let stalled_at = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        stalled_at < total,
        "the sender finished although the receiver held the whole area"
    );
    let mut off = 0u64;
    for c in held.drain(..) {
        common::check_pattern(&c, off).unwrap();
        off += c.len() as u64;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while off < total {
        assert!(Instant::now() < deadline, "stuck at {off} of {total}");
        rx.poll(Duration::from_millis(50), &mut |ev| {
            if let RxEvent::Data(c) = ev {
                common::check_pattern(&c, off).unwrap();
                off += c.len() as u64;
            }
        })
        .unwrap();
    }
    sender.join().unwrap();
    assert_eq!(off, total);
    let c = rx.counters();
    assert!(c.enobufs > 0 && c.rearms >= c.enobufs, "{c:?}");
    eprintln!("held {got} B while the sender stalled at {stalled_at}; {c:?}");
}

#[test]
fn zcrx_deviceless_running_out_of_area_pages_recovers_without_loss() {
    if !zcrx_nodev_or_skip("zcrx_deviceless_running_out_of_area_pages_recovers_without_loss") {
        return;
    }
    // Four pages: a burst larger than that ends the receive with ENOMEM; chunks come back,
    // the refill ring is flushed, the receive is re-armed.
    let cfg = nodev_cfg(16 << 10, 16);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut rx = Receiver::listen(listener, &cfg).unwrap();
    let t = std::thread::spawn(move || {
        let s = send_stream(addr, 3 << 36, 4 << 20, 256 << 10).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let streams = collect(&mut rx, 1, RxPath::ZcrxNodev);
    t.join().unwrap();
    assert_eq!((streams[0].base, streams[0].got), (3 << 36, 4 << 20));
    let c = rx.counters();
    assert!(c.enobufs > 0, "a 4-page area never ran out: {c:?}");
    assert!(c.rearms >= c.enobufs, "{c:?}");
}

#[test]
fn zcrx_deviceless_refill_ring_wraps_around_under_real_traffic() {
    if !zcrx_nodev_or_skip("zcrx_deviceless_refill_ring_wraps_around_under_real_traffic") {
        return;
    }
    // An 8-entry refill ring for a 32-page area: returns fill it and wait in order.
    let entries = 8;
    let cfg = nodev_cfg(128 << 10, entries);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut rx = Receiver::listen(listener, &cfg).unwrap();
    let t = std::thread::spawn(move || {
        let s = send_stream(addr, 5 << 36, 4 << 20, 64 << 10).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let streams = collect(&mut rx, 1, RxPath::ZcrxNodev);
    t.join().unwrap();
    assert_eq!(streams[0].got, 4 << 20);
    let c = rx.counters();
    // One refill entry per chunk: the 8-slot ring went round many times.
    assert!(c.chunks > 64 * u64::from(entries), "{c:?}");
    assert!(c.refill_flushes > 0, "{c:?}");
}

#[test]
fn zcrx_deviceless_peer_reset_is_reported_after_the_bytes_before_it() {
    if !zcrx_nodev_or_skip("zcrx_deviceless_peer_reset_is_reported_after_the_bytes_before_it") {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut rx = Receiver::listen(listener, &RxConfig::with_mode(RxMode::Zcrx)).unwrap();
    let (tx, ack) = std::sync::mpsc::channel::<()>();
    let sender = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let mut buf = vec![0u8; 100_000];
        common::fill_pattern(&mut buf, 0);
        s.write_all(&buf).unwrap();
        ack.recv().unwrap();
        set_linger_zero(&s);
        drop(s);
    });
    let mut off = 0u64;
    let mut closed = None;
    let mut acked = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    while closed.is_none() {
        assert!(Instant::now() < deadline, "no close seen");
        rx.poll(Duration::from_millis(50), &mut |ev| match ev {
            RxEvent::Data(c) => {
                assert_eq!(c.path(), RxPath::ZcrxNodev);
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
    assert_eq!(off, 100_000);
    let err = closed.unwrap().expect("reset reported as EOF");
    assert_eq!(err.raw_os_error(), Some(libc::ECONNRESET), "{err}");
    assert_eq!(rx.open_connections(), 0);
}

#[test]
fn zcrx_deviceless_teardown_with_chunks_held_keeps_them_readable() {
    if !zcrx_nodev_or_skip("zcrx_deviceless_teardown_with_chunks_held_keeps_them_readable") {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut rx = Receiver::listen(listener, &RxConfig::with_mode(RxMode::Zcrx)).unwrap();
    // An endless sender: the receiver is dropped mid-stream with chunks held.
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
    let deadline = Instant::now() + Duration::from_secs(20);
    while off < (1 << 20) {
        assert!(Instant::now() < deadline, "no data");
        rx.poll(Duration::from_millis(50), &mut |ev| {
            if let RxEvent::Data(c) = ev {
                common::check_pattern(&c, off).unwrap();
                off += c.len() as u64;
                if kept.len() < 16 {
                    kept.push(c);
                }
            }
        })
        .unwrap();
    }
    // Dropping the receiver cancels the receives, waits for their final completions and
    // closes the ring and the socket; the held chunks keep the area mapped.
    drop(rx);
    let sent = sender.join().unwrap();
    assert!(sent >= off);
    let mut o = 0u64;
    for c in &kept {
        assert_eq!(c.path(), RxPath::ZcrxNodev);
        common::check_pattern(c, o).unwrap();
        o += c.len() as u64;
    }
    drop(kept);
}

#[test]
fn auto_mode_falls_back_to_bufring_and_records_why() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let rx = Receiver::listen(listener, &RxConfig::default()).unwrap();
    assert_eq!(rx.path(), RxPath::BufRing, "{}", rx.describe());
    let fb = rx
        .fallbacks()
        .iter()
        .find(|f| f.from == "zcrx")
        .expect("zcrx fallback recorded");
    assert_eq!(fb.to, "bufring");
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
            assert!(Instant::now() < deadline, "{name}: no data");
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
        let from: Vec<_> = rx.fallbacks().iter().map(|f| f.from.as_str()).collect();
        assert_eq!(from, ["zcrx", "bufring"], "{:?}", rx.fallbacks());
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

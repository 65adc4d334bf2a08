//! Device-less zcrx (`ZCRX_REG_NODEV`, Linux 7.1) carrying real bytes: `RECV_ZC` into a
//! registered area over loopback TCP, chunks back through the refill ring and
//! `ZCRX_CTRL_FLUSH_RQ`. On older kernels these tests skip with the kernel's reason (a failure
//! under `ZCIO_REQUIRE_ZCRX=1`, which `scripts/vmtest` sets in the 7.x guest).

mod common;

use common::streams::{
    collect, hold_chunks, paced_pattern_sender, release_and_receive_rest, run_streams, send_stream,
    set_linger_zero, small_buffers,
};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use zcio::ring::features::Features;
use zcio::rx::{Receiver, RxConfig, RxEvent, RxMode, RxPath, ZcrxTarget};

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
                (&fb.from, &fb.to),
                (&RxPath::ZcrxNodev.into(), &RxPath::BufRing.into())
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
    // The last chunks' returns wait in the refill ring: the kernel consumes it by itself only
    // when a receive refills from it, so whether the stream needed a flush depends on the
    // run (under emulation it did not). With no receive to come, the next poll flushes them.
    rx.poll(Duration::ZERO, &mut |_| {}).unwrap();
    let c = rx.stats();
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
    let (sender, sent) = paced_pattern_sender(addr, total);
    let (held, got) = hold_chunks(&mut rx, Duration::from_millis(500));
    assert!(got <= 64 << 10, "more bytes held than the area has: {got}");
    let stalled_at = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        stalled_at < total,
        "the sender finished although the receiver held the whole area"
    );
    let limit = common::scaled(Duration::from_secs(60));
    release_and_receive_rest("zcrx hold", &mut rx, held, total, limit);
    sender.join().unwrap();
    let c = rx.stats();
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
    let c = rx.stats();
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
    let c = rx.stats();
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
    let deadline = Instant::now() + common::scaled(Duration::from_secs(20));
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
    let deadline = Instant::now() + common::scaled(Duration::from_secs(20));
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

/// `zcio::proxy` on device-less zcrx: bytes received into area pages are sent on with SEND_ZC
/// from those pages (`--rx zcrx --tx uring-zc`), each page back to the refill ring only after
/// the send's notification; 8 connections, a verified stream each way.
#[test]
fn zcrx_deviceless_proxy_forwards_verified_streams_both_ways_with_uring_zc() {
    use std::io::Read;
    use zcio::proxy::{EndKind, Proxy, ProxyConfig};
    use zcio::tx::{SenderConfig, TxMode};
    if !zcrx_nodev_or_skip(
        "zcrx_deviceless_proxy_forwards_verified_streams_both_ways_with_uring_zc",
    ) {
        return;
    }
    let conns = 8;
    let (up_len, down_len) = (2u64 << 20, 1u64 << 20);
    let (ul, up) = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        (l, a)
    };
    let front = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = front.local_addr().unwrap();
    let proxy = std::thread::spawn(move || {
        let cfg = ProxyConfig {
            rx: nodev_cfg(8 << 20, 1024).low_latency(),
            tx: SenderConfig::new(TxMode::UringZc),
            ..ProxyConfig::default()
        };
        let mut p = Proxy::new(front, vec![up], cfg).unwrap();
        let s = p.stats();
        assert_eq!(s.rx_path, "zcrx-nodev", "{:?}", p.fallbacks());
        assert_eq!(s.tx_path, "uring-zc", "{:?}", p.fallbacks());
        assert!(s.one_ring);
        let mut done = 0;
        let end = Instant::now() + common::scaled(Duration::from_secs(30));
        while done < conns {
            assert!(
                Instant::now() < end,
                "{done} of {conns} pairs done: {:?}",
                p.stats()
            );
            p.turn(Duration::from_millis(10)).unwrap();
            for e in p.take_ended() {
                assert_eq!(e.end.kind, EndKind::Done, "{e}");
                done += 1;
            }
        }
        p.stats()
    });
    let upstream = std::thread::spawn(move || {
        let mut hs = Vec::new();
        for _ in 0..conns {
            let (mut s, _) = ul.accept().unwrap();
            hs.push(std::thread::spawn(move || {
                // The client's stream (header, then its pattern), to its end ...
                let mut got = common::streams::Stream::default();
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = s.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    got.eat(&buf[..n]);
                }
                assert_eq!(got.got, up_len, "stream {:#x} up", got.base);
                // ... then the answer on the half-closed connection.
                let mut off = 0;
                while off < down_len {
                    common::fill_pattern(&mut buf, got.base + (1 << 40) + off);
                    std::io::Write::write_all(&mut s, &buf).unwrap();
                    off += buf.len() as u64;
                }
            }));
        }
        for h in hs {
            h.join().unwrap();
        }
    });
    let clients: Vec<_> = (0..conns)
        .map(|i| {
            std::thread::spawn(move || {
                let base = (i as u64) << 36;
                let mut s = send_stream(addr, base, up_len, 64 << 10).unwrap();
                s.shutdown(std::net::Shutdown::Write).unwrap();
                let mut buf = vec![0u8; 64 << 10];
                let mut off = 0;
                loop {
                    let n = s.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    common::check_pattern(&buf[..n], base + (1 << 40) + off).unwrap();
                    off += n as u64;
                }
                assert_eq!(off, down_len, "stream {i} down");
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    upstream.join().unwrap();
    let s = proxy.join().unwrap();
    assert_eq!(s.bytes_up, conns as u64 * (up_len + 8));
    assert_eq!(s.bytes_down, conns as u64 * down_len);
    // Device-less zcrx: the kernel copied into the area; loopback delivery copies the sends.
    assert!(s.tx_zerocopy_bytes + s.tx_copied_bytes > 0, "{s:?}");
}

//! Test hosts: namespaces appear, carry traffic, drop at the sink, and vanish on panic.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};
use zcio::sys::{errqueue, net};
use zcio_testnet::{Netns, Pair, Sink};

/// Sends `n` zero-copy UDP datagrams from `sock` and collects the completion ranges.
fn send_zerocopy_udp(sock: &UdpSocket, dst: SocketAddr, n: u32) -> Vec<errqueue::ZcRange> {
    sock.connect(dst).unwrap();
    net::enable_zerocopy(sock).unwrap();
    // Without GSO a datagram over the MTU is fragmented, and fragmentation copies.
    zcio::sys::setsockopt_int(sock, zcio::sys::SOL_UDP, zcio::sys::UDP_SEGMENT, 1200).unwrap();
    let buf = vec![0x5au8; 16 * 1024];
    for _ in 0..n {
        net::send(sock, &buf, zcio::sys::MSG_ZEROCOPY).unwrap();
    }
    let mut ranges = vec![];
    let mut errors = vec![];
    let deadline = Instant::now() + Duration::from_secs(5);
    while ranges
        .iter()
        .map(|r: &errqueue::ZcRange| r.len())
        .sum::<u64>()
        < u64::from(n)
    {
        assert!(Instant::now() < deadline, "completions missing: {ranges:?}");
        net::poll_one(sock, libc::POLLERR, 100).unwrap();
        errqueue::reap(sock, &mut ranges, &mut errors, 0).unwrap();
    }
    assert!(errors.is_empty(), "{errors:?}");
    ranges
}

#[test]
fn namespace_is_removed_when_its_owner_panics() {
    if !common::can_make_hosts("namespace_is_removed_when_its_owner_panics") {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let res = std::thread::spawn(move || {
        let ns = Netns::new("panic").unwrap();
        tx.send(ns.name().to_string()).unwrap();
        assert!(Netns::exists(ns.name()));
        panic!("deliberate");
    })
    .join();
    assert!(res.is_err());
    let name = rx.recv().unwrap();
    assert!(!Netns::exists(&name), "{name} survived the panic");
}

#[test]
fn stale_namespaces_of_dead_processes_are_removed() {
    if !common::can_make_hosts("stale_namespaces_of_dead_processes_are_removed") {
        return;
    }
    // A pid that cannot be alive: above pid_max's hard ceiling.
    let name = format!("{}4194305-0-stale", zcio_testnet::PREFIX);
    zcio_testnet::ip(&["netns", "add", &name]).unwrap();
    assert!(Netns::exists(&name));
    assert!(zcio_testnet::cleanup_stale() >= 1);
    assert!(!Netns::exists(&name));
}

#[test]
fn pair_carries_udp_both_families() {
    if !common::can_make_hosts("pair_carries_udp_both_families") {
        return;
    }
    let pair = Pair::new("udp").unwrap();
    for (src, dst) in [
        (
            SocketAddr::from((pair.a4, 0)),
            SocketAddr::from((pair.b4, 9000)),
        ),
        (
            SocketAddr::from((pair.a6, 0)),
            SocketAddr::from((pair.b6, 9000)),
        ),
    ] {
        let rx = pair.b.run(move || UdpSocket::bind(dst).unwrap()).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        pair.a
            .run(move || {
                let s = UdpSocket::bind(src).unwrap();
                s.send_to(b"hello", dst).unwrap();
            })
            .unwrap();
        let mut buf = [0u8; 16];
        let (n, from) = rx.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(from.ip(), src.ip());
    }
}

#[test]
fn sink_completes_zerocopy_without_copy_and_loopback_copies() {
    if !common::can_make_hosts("sink_completes_zerocopy_without_copy_and_loopback_copies") {
        return;
    }
    let sink = Sink::new("zc").unwrap();
    let (before_pkts, before_drop) = sink.tx_counters().unwrap();
    let before_out = sink.host.run(common::ip_out_requests).unwrap();
    for dst in [
        SocketAddr::from((sink.dst4, 9)),
        SocketAddr::from((sink.dst6, 9)),
    ] {
        let src: SocketAddr = if dst.is_ipv4() {
            (sink.src4, 0).into()
        } else {
            (sink.src6, 0).into()
        };
        let ranges = sink
            .host
            .run(move || send_zerocopy_udp(&UdpSocket::bind(src).unwrap(), dst, 32))
            .unwrap();
        assert!(ranges.iter().all(|r| !r.copied), "sink copied: {ranges:?}");
    }
    let (after_pkts, after_drop) = sink.tx_counters().unwrap();
    let after_out = sink.host.run(common::ip_out_requests).unwrap();
    // The datagrams left the IP layer for the sink's device: its TX packets + dropped counters
    // show them where the veth counts a drop with its peer down (6.12+); 6.1 drops them at the
    // qdisc without touching the device's counters, so there the IP layer's own count of
    // datagrams handed down (`OutRequests` of this namespace) is the evidence.
    let device = after_drop + after_pkts >= before_pkts + before_drop + 64;
    let ip_layer = after_out >= before_out + 64;
    assert!(
        device || ip_layer,
        "device TX {before_pkts}+{before_drop} -> {after_pkts}+{after_drop}, IP out {before_out} -> {after_out}"
    );

    // Loopback delivers locally, and local delivery copies (skb_orphan_frags_rx).
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let dst = rx.local_addr().unwrap();
    let ranges = send_zerocopy_udp(&UdpSocket::bind("127.0.0.1:0").unwrap(), dst, 8);
    assert!(
        ranges.iter().all(|r| r.copied),
        "loopback not copied: {ranges:?}"
    );
}

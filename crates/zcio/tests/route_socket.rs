//! RouteSocket: rtnetlink dumps through the frame ring, on a namespace with many routes.

mod common;

use zcio::netlink::{DumpKind, NetlinkPath, Route, RouteSocket};
use zcio::stats::Report;
use zcio_testnet::{caps, routes, Netns};

fn dump_main_routes(sock: &mut RouteSocket) -> (usize, zcio::netlink::DumpStats) {
    let mut n = 0;
    let mut text = String::new();
    let st = sock
        .dump(DumpKind::Routes, libc::AF_INET as u8, |m| {
            let r = Route::parse(m).expect("route parses");
            if r.table == 254 {
                n += 1;
                if n == 1 {
                    r.format(&mut text);
                }
            }
        })
        .unwrap();
    assert!(text.starts_with("198.18.0.0 dev "), "{text}");
    (n, st)
}

#[test]
fn dump_sees_every_route_with_both_producers() {
    if !common::can_make_hosts("dump_sees_every_route_with_both_producers") {
        return;
    }
    let ns = Netns::new("rtdump").unwrap();
    routes::add_routes(&ns, 20_000).unwrap();
    ns.run(|| {
        let mut sock = RouteSocket::new(64, 8 << 20).unwrap();
        let (n, st) = dump_main_routes(&mut sock);
        assert_eq!(n, 20_000);
        assert!(!st.interrupted);
        // Many 32 KiB datagrams per receive syscall.
        assert!(st.frames.syscalls * 4 < st.datagrams, "{st:?}");
        assert_eq!(sock.path(), NetlinkPath::FrameRingRecvmmsg);
        let c = sock.counters();
        assert_eq!(c.ops, st.messages, "{c:?} {st:?}");
        assert_eq!(c.bytes, st.bytes, "{c:?} {st:?}");
        assert_eq!(c.syscalls, 1 + st.frames.syscalls, "{c:?} {st:?}");

        assert!(sock.use_uring(), "{:?}", sock.fallbacks());
        assert!(sock.fallbacks().is_empty(), "{:?}", sock.fallbacks());
        assert_eq!(sock.path(), NetlinkPath::FrameRingUring);
        let (n, _) = dump_main_routes(&mut sock);
        assert_eq!(n, 20_000);
        // The socket keeps working for other kinds.
        let mut links = 0;
        sock.dump(DumpKind::Links, 0, |_| links += 1).unwrap();
        assert!(links >= 3, "lo, rt0, rt1: {links}");
    })
    .unwrap();
}

/// A receive buffer size past `net.core.rmem_max`, which only `SO_RCVBUFFORCE` can grant.
fn past_rmem_max() -> usize {
    let max: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .expect("net.core.rmem_max")
        .trim()
        .parse()
        .expect("a number");
    (max * 2 + (1 << 20)).min(i32::MAX as usize / 2)
}

#[test]
fn rcvbuf_force_fallback_is_recorded_without_cap_net_admin_and_not_with_it() {
    let test = "rcvbuf_force_fallback_is_recorded_without_cap_net_admin_and_not_with_it";
    if !zcio_testnet::is_root() {
        common::skip(
            test,
            "needs root (CAP_NET_ADMIN) to compare with and without it",
        );
        return;
    }
    let want = past_rmem_max();
    let sock = RouteSocket::new(4, want).unwrap();
    assert!(sock.fallbacks().is_empty(), "{:?}", sock.fallbacks());
    // Capabilities are per thread: this one gives up CAP_NET_ADMIN, as an unprivileged
    // process (or a rootless container) would lack it.
    let (fallbacks, links) = std::thread::spawn(move || {
        caps::drop_effective_in_this_thread(caps::CAP_NET_ADMIN).expect("capset");
        let mut sock = RouteSocket::new(4, want).expect("an unprivileged socket still opens");
        let mut links = 0;
        sock.dump(DumpKind::Links, 0, |_| links += 1).unwrap();
        (sock.fallbacks().to_vec(), links)
    })
    .join()
    .unwrap();
    assert!(links >= 1, "the socket works after the fallback");
    assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
    let f = &fallbacks[0];
    assert_eq!(
        (f.from.to_string().as_str(), f.to.to_string().as_str()),
        ("SO_RCVBUFFORCE", "SO_RCVBUF")
    );
    assert!(
        f.reason.contains("CAP_NET_ADMIN") && f.reason.contains("net.core.rmem_max"),
        "{}",
        f.reason
    );
    assert!(
        f.reason.contains(&want.to_string()),
        "names the size asked: {}",
        f.reason
    );
}

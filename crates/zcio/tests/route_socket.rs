//! RouteSocket: rtnetlink dumps through the frame ring, on a namespace with many routes.

mod common;

use zcio::netlink::{DumpKind, NetlinkPath, Route, RouteSocket};
use zcio::stats::Report;
use zcio_testnet::{routes, Netns};

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

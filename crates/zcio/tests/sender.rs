//! `tx::Sender` on real sockets: every send completes exactly once on every path, buffers
//! come back, COPIED is reported where the kernel copies, backpressure loses nothing.

mod common;

use std::collections::HashMap;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;
use std::time::Duration;
use zcio::buf::pool::{Pool, PoolBuf};
use zcio::ring::features::Features;
use zcio::tx::{Completion, Path, SendError, Sender, SenderConfig, Ticket, TxMode, ZcStatus};
use zcio_testnet::{Pair, Sink};

const MODES: [TxMode; 6] = [
    TxMode::Copy,
    TxMode::MsgZc,
    TxMode::UringZc,
    TxMode::UringZcFixed,
    TxMode::UringCopy,
    TxMode::Auto,
];
/// 0, 1, below a TCP/IP header (40), 64K, 1M.
const SIZES: [usize; 5] = [0, 1, 40, 64 << 10, 1 << 20];

/// Collects completions, failing on any ticket seen twice.
#[derive(Default)]
struct Book {
    done: HashMap<Ticket, Completion>,
}

impl Book {
    fn take(&mut self, tx: &mut Sender) {
        for (c, buf) in tx.completions() {
            assert_eq!(
                c.len,
                buf.len(),
                "buffer of {c:?} came back with another length"
            );
            let t = c.ticket;
            assert!(
                self.done.insert(t, c).is_none(),
                "ticket {t:?} completed twice"
            );
        }
    }
    fn get(&mut self, pool: &Pool, tx: &mut Sender) -> PoolBuf {
        loop {
            if let Some(b) = pool.try_get() {
                return b;
            }
            tx.wait(Duration::from_secs(1)).unwrap();
            self.take(tx);
        }
    }
    fn finish(&mut self, tx: &mut Sender, tickets: &[Ticket]) {
        tx.flush(Duration::from_secs(20)).unwrap();
        self.take(tx);
        assert_eq!(
            self.done.len(),
            tickets.len(),
            "completions: {:?}",
            self.done.keys()
        );
        for t in tickets {
            assert!(self.done.contains_key(t), "{t:?} never completed");
        }
    }
}

/// Reads a TCP stream to EOF checking the offset pattern; returns the byte count.
fn pattern_reader(l: TcpListener) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; 256 << 10];
        let mut off = 0u64;
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                return off;
            }
            if let Err(bad) = common::check_pattern(&buf[..n], off) {
                panic!("stream corrupt at offset {bad}");
            }
            off += n as u64;
        }
    })
}

fn cfg(mode: TxMode) -> SenderConfig {
    let mut c = SenderConfig::new(mode);
    c.depth = 8;
    c
}

/// Sends `sizes` × `reps` on a TCP connection to `addr`'s listener; checks exactly-once,
/// full bytes, buffers back, and the stream intact at the receiver.
fn tcp_case(mode: TxMode, bind: &str, sizes: &[usize], reps: usize, cork: bool) {
    let l = TcpListener::bind(bind).unwrap();
    let rx = pattern_reader(l.try_clone().unwrap());
    let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let pool = Pool::new(1 << 20, 6, false).unwrap();
    let mut tx = Sender::new(sock, &pool, cfg(mode)).unwrap();
    if cork {
        tx.set_cork(true).unwrap();
    }
    let mut book = Book::default();
    let mut tickets = vec![];
    let mut off = 0u64;
    for _ in 0..reps {
        for &size in sizes {
            let mut b = book.get(&pool, &mut tx);
            b.set_len(size);
            common::fill_pattern(&mut b, off);
            off += size as u64;
            tickets.push(common::send(&mut tx, b));
            book.take(&mut tx);
        }
    }
    if cork {
        tx.set_cork(false).unwrap();
    }
    book.finish(&mut tx, &tickets);
    for c in book.done.values() {
        assert_eq!(c.result(), Ok(c.len), "{mode}: {c:?}");
    }
    assert_eq!(
        pool.available(),
        pool.count(),
        "{mode}: a buffer was not returned"
    );
    assert_eq!(tx.counters().bytes, off);
    // Closing the socket ends the stream; the receiver checks every byte.
    drop(tx);
    assert_eq!(rx.join().unwrap(), off, "{mode}: receiver byte count");
}

#[test]
fn every_tcp_send_completes_exactly_once_on_every_path_v4_and_v6() {
    for mode in MODES {
        for bind in ["127.0.0.1:0", "[::1]:0"] {
            tcp_case(mode, bind, &SIZES, 2, false);
        }
    }
}

#[test]
fn corked_tcp_sends_complete_exactly_once_after_uncork() {
    for mode in MODES {
        tcp_case(mode, "127.0.0.1:0", &[1, 40, 0, 1000, 64 << 10, 1], 4, true);
    }
}

/// Sends `sizes` on a connected UDP socket; returns the completions in ticket order.
fn udp_sends(
    sock: UdpSocket,
    mode: TxMode,
    sizes: &[usize],
    gso: bool,
) -> (Vec<Completion>, Vec<zcio::Fallback>) {
    let pool = Pool::new(1 << 20, 4, false).unwrap();
    let mut c = cfg(mode);
    c.udp_gso = gso;
    let mut tx = Sender::new(sock, &pool, c).unwrap();
    let mut book = Book::default();
    let mut tickets = vec![];
    for &size in sizes {
        let mut b = book.get(&pool, &mut tx);
        b.set_len(size);
        common::fill_pattern(&mut b, 0);
        tickets.push(common::send(&mut tx, b));
        book.take(&mut tx);
    }
    book.finish(&mut tx, &tickets);
    assert_eq!(
        pool.available(),
        pool.count(),
        "{mode}: a buffer was not returned"
    );
    let mut v: Vec<Completion> = book.done.into_values().collect();
    v.sort_by_key(|c| c.ticket);
    (v, tx.fallbacks().to_vec())
}

#[test]
fn every_udp_send_completes_exactly_once_on_every_path_v4_and_v6() {
    for mode in MODES {
        for bind in ["127.0.0.1:0", "[::1]:0"] {
            let rx = UdpSocket::bind(bind).unwrap();
            let s = UdpSocket::bind(bind).unwrap();
            s.connect(rx.local_addr().unwrap()).unwrap();
            let (done, _) = udp_sends(s, mode, &SIZES, true);
            assert_eq!(done.len(), SIZES.len());
            for (c, &size) in done.iter().zip(&SIZES) {
                assert_eq!(c.len, size);
                assert_eq!(c.result(), Ok(size), "{mode} {bind}: {c:?}");
            }
            // The receiver got at least the small datagrams (loopback, nothing else queued).
            rx.set_nonblocking(true).unwrap();
            let mut got = vec![];
            let mut buf = vec![0u8; 65536];
            while let Ok(n) = rx.recv(&mut buf) {
                got.push(n);
            }
            assert!(got.starts_with(&[0, 1, 40]), "{mode}: datagrams {got:?}");
        }
    }
}

/// Whether the running kernel is older than `major.minor`.
fn kernel_before(major: u32, minor: u32) -> bool {
    let rel = zcio::sys::kernel_release();
    let mut it = rel
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|x| x.parse::<u32>().ok());
    let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    (a, b) < (major, minor)
}

/// Whether this kernel's SEND_ZC notifications report copies (`IORING_SEND_ZC_REPORT_USAGE`).
fn reports_usage() -> bool {
    Features::get().has(Features::SEND_ZC_REPORT_USAGE)
}

/// Every SEND_ZC carries only flags the kernel accepted at set-up: before the probe, every
/// request set `IORING_SEND_ZC_REPORT_USAGE`, which a kernel without it (6.0, and 6.1 builds
/// without the backport) refuses with EINVAL — every zero-copy send failed, and on TCP the
/// first failure was fatal to the Sender.
#[test]
fn send_zc_carries_only_the_flags_this_kernel_accepts() {
    let f = Features::get();
    if !f.has(Features::SEND_ZC) {
        eprintln!(
            "SKIP send_zc_carries_only_the_flags_this_kernel_accepts: {}",
            f.why_not(Features::SEND_ZC).unwrap_or_default()
        );
        return;
    }
    eprintln!("{:?}", f.feature(Features::SEND_ZC_REPORT_USAGE));
    for mode in [TxMode::UringZc, TxMode::UringZcFixed, TxMode::Auto] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let rx = pattern_reader(l.try_clone().unwrap());
        let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let pool = Pool::new(64 << 10, 4, false).unwrap();
        let mut tx = Sender::new(sock, &pool, cfg(mode)).unwrap();
        if mode == TxMode::Auto {
            if reports_usage() {
                // Auto registers the pool as fixed buffers where it can.
                assert!(
                    matches!(tx.path(), Path::UringZc | Path::UringZcFixed),
                    "{:?} {:?}",
                    tx.path(),
                    tx.fallbacks()
                );
            } else {
                // Auto's copy detection needs the report: it takes MSG_ZEROCOPY and says why.
                assert_eq!(tx.path(), Path::MsgZc, "{:?}", tx.fallbacks());
                let fb = &tx.fallbacks()[0];
                assert_eq!(fb.to, Path::MsgZc.into());
                assert!(fb.reason.contains("REPORT_USAGE"), "{fb}");
            }
        }
        let mut book = Book::default();
        let mut tickets = vec![];
        for i in 0..32u64 {
            let mut b = book.get(&pool, &mut tx);
            common::fill_pattern(&mut b, i * (64 << 10));
            tickets.push(common::send(&mut tx, b));
            book.take(&mut tx);
        }
        book.finish(&mut tx, &tickets);
        for c in book.done.values() {
            assert_eq!(c.result(), Ok(c.len), "{mode}: {c:?}");
        }
        drop(tx);
        assert_eq!(rx.join().unwrap(), 32 << 16, "{mode}");
    }
}

#[test]
fn loopback_completions_are_reported_copied() {
    for mode in [TxMode::MsgZc, TxMode::UringZc, TxMode::UringZcFixed] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let rx = pattern_reader(l.try_clone().unwrap());
        let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let pool = Pool::new(64 << 10, 4, false).unwrap();
        let mut tx = Sender::new(sock, &pool, cfg(mode)).unwrap();
        let mut book = Book::default();
        let mut tickets = vec![];
        for i in 0..16u64 {
            let mut b = book.get(&pool, &mut tx);
            common::fill_pattern(&mut b, i * (64 << 10));
            tickets.push(common::send(&mut tx, b));
        }
        book.finish(&mut tx, &tickets);
        if mode != TxMode::MsgZc && !reports_usage() {
            // Before 6.2 SEND_ZC cannot say; the completions say that they do not know.
            assert!(
                book.done.values().all(|c| c.zerocopy == ZcStatus::Unknown),
                "{mode}: {:?}",
                book.done.values().map(|c| c.zerocopy).collect::<Vec<_>>()
            );
            assert_eq!(tx.counters().copied_fraction(), None);
            drop(tx);
            assert_eq!(rx.join().unwrap(), 16 << 16);
            continue;
        }
        assert!(
            book.done.values().all(|c| c.zerocopy == ZcStatus::Copied),
            "{mode}: {:?}",
            book.done.values().map(|c| c.zerocopy).collect::<Vec<_>>()
        );
        assert_eq!(tx.counters().copied_fraction(), Some(1.0));
        drop(tx);
        assert_eq!(rx.join().unwrap(), 16 << 16);
    }
}

#[test]
fn sink_completions_are_zero_copy_v4_and_v6() {
    if !common::can_make_hosts("sink_completions_are_zero_copy_v4_and_v6") {
        return;
    }
    let sink = Sink::new("txzc").unwrap();
    for mode in [
        TxMode::MsgZc,
        TxMode::UringZc,
        TxMode::UringZcFixed,
        TxMode::Auto,
    ] {
        for (src, dst) in [
            (
                SocketAddr::from((sink.src4, 0)),
                SocketAddr::from((sink.dst4, 9)),
            ),
            (
                SocketAddr::from((sink.src6, 0)),
                SocketAddr::from((sink.dst6, 9)),
            ),
        ] {
            let (done, fallbacks) = sink
                .host
                .run(move || {
                    let s = UdpSocket::bind(src).unwrap();
                    s.connect(dst).unwrap();
                    let mut sizes = SIZES.to_vec();
                    sizes.extend([64 << 10; 8]);
                    udp_sends(s, mode, &sizes, true)
                })
                .unwrap();
            assert!(fallbacks.is_empty(), "{mode}: {fallbacks:?}");
            for c in &done {
                assert_eq!(c.result(), Ok(c.len), "{mode} {dst}: {c:?}");
                if c.len >= 64 << 10 {
                    assert_eq!(c.zerocopy, ZcStatus::ZeroCopy, "{mode} {dst}: {c:?}");
                }
            }
        }
    }
}

#[test]
fn auto_switches_to_copy_where_completions_are_copied_and_says_why() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let rx = pattern_reader(l.try_clone().unwrap());
    let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let pool = Pool::new(64 << 10, 8, false).unwrap();
    let mut c = cfg(TxMode::Auto);
    c.reprobe_every = 50;
    let mut tx = Sender::new(sock, &pool, c).unwrap();
    let zc_path = tx.path();
    assert_ne!(
        zc_path,
        Path::Copy,
        "auto found no zero-copy path: {:?}",
        tx.fallbacks()
    );
    let mut book = Book::default();
    let mut tickets = vec![];
    for i in 0..300u64 {
        let mut b = book.get(&pool, &mut tx);
        common::fill_pattern(&mut b, i * (64 << 10));
        tickets.push(common::send(&mut tx, b));
        book.take(&mut tx);
    }
    book.finish(&mut tx, &tickets);
    // On the ring, auto's copy is io_uring SEND (batched with everything else).
    assert_eq!(tx.path(), Path::UringCopy);
    // (An 8-buffer pool may also run dry while zero-copy buffers wait for ACKs: that is
    // recorded too, with its own reason.)
    let f = tx
        .fallbacks()
        .iter()
        .find(|f| f.to == Path::UringCopy.into() && f.reason.contains("COPIED"))
        .unwrap_or_else(|| panic!("a fallback to copy for COPIED: {:?}", tx.fallbacks()));
    assert!(f.reason.contains("COPIED"), "{f}");
    assert!(tx.stats().auto_reprobes >= 1, "{:?}", tx.stats());
    assert!(
        tx.stats().sends_by_path[Path::UringCopy.index()] > 200,
        "{:?}",
        tx.stats()
    );
    drop(tx);
    assert_eq!(rx.join().unwrap(), 300 << 16);
}

#[test]
fn auto_reprobe_completes_while_sending_by_copy() {
    // Only send() and the completions it makes ready: no poll/wait unless the pool is dry.
    // The probe's completion must still come back, so re-probing goes on (20, 40, 80, ...
    // copy sends apart) instead of stopping at the first probe.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let rx = pattern_reader(l.try_clone().unwrap());
    let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let pool = Pool::new(16 << 10, 16, false).unwrap();
    let mut c = cfg(TxMode::Auto);
    c.reprobe_every = 20;
    let mut tx = Sender::new(sock, &pool, c).unwrap();
    let mut book = Book::default();
    let mut tickets = vec![];
    for i in 0..600u64 {
        let mut b = book.get(&pool, &mut tx);
        common::fill_pattern(&mut b, i * (16 << 10));
        tickets.push(common::send(&mut tx, b));
        book.take(&mut tx);
    }
    let reprobes = tx.stats().auto_reprobes;
    book.finish(&mut tx, &tickets);
    assert_eq!(tx.path(), Path::UringCopy);
    assert!(reprobes >= 3, "probes stopped completing: {:?}", tx.stats());
    drop(tx);
    assert_eq!(rx.join().unwrap(), 600 << 14);
}

#[test]
fn harvest_keeps_the_submit_batch_and_poll_submits() {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.connect(rx.local_addr().unwrap()).unwrap();
    let pool = Pool::new(1024, 8, false).unwrap();
    let mut c = cfg(TxMode::UringZc);
    c.submit_batch = 4;
    let mut tx = Sender::new(sock, &pool, c).unwrap();
    if tx.path() != Path::UringZc {
        zcio_testnet::skip(
            "harvest_keeps_the_submit_batch_and_poll_submits",
            &format!("no io_uring SEND_ZC: {:?}", tx.fallbacks()),
        );
        return;
    }
    let mut tickets = vec![];
    let mut b = pool.try_get().unwrap();
    b.set_len(100);
    tickets.push(common::send(&mut tx, b));
    tx.harvest().unwrap();
    assert_eq!(tx.counters().syscalls, 0, "harvest entered the kernel");
    assert_eq!(tx.in_flight(), 1);
    for _ in 0..3 {
        let mut b = pool.try_get().unwrap();
        b.set_len(100);
        tickets.push(common::send(&mut tx, b));
        tx.harvest().unwrap();
    }
    assert_eq!(tx.counters().syscalls, 1, "the 4th send submits the batch");
    let mut b = pool.try_get().unwrap();
    b.set_len(100);
    tickets.push(common::send(&mut tx, b));
    tx.poll().unwrap();
    assert_eq!(tx.counters().syscalls, 2, "poll submits what is queued");
    let mut book = Book::default();
    book.finish(&mut tx, &tickets);
    let mut got = 0;
    let mut buf = [0u8; 2048];
    rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    while got < 5 {
        assert_eq!(rx.recv(&mut buf).unwrap(), 100);
        got += 1;
    }
}

#[test]
fn enobufs_is_backpressure_and_loses_no_byte() {
    if !common::can_make_hosts("enobufs_is_backpressure_and_loses_no_byte") {
        return;
    }
    let pair = Pair::new("enobufs").unwrap();
    // optmem_max is per network namespace on recent kernels: starve only the sender's.
    let out = pair
        .a
        .command("sh")
        .args([
            "-c",
            "echo 1024 > /proc/sys/net/core/optmem_max && cat /proc/sys/net/core/optmem_max",
        ])
        .output()
        .unwrap();
    if String::from_utf8_lossy(&out.stdout).trim() != "1024" {
        // Older kernels (6.1) keep one host-wide optmem_max, not one per namespace; starving
        // it would starve every socket on the host.
        zcio_testnet::skip_kernel_feature(
            "enobufs_is_backpressure_and_loses_no_byte",
            "ZCIO_REQUIRE_NETNS_OPTMEM",
            &format!(
                "net.core.optmem_max is not per network namespace on this kernel (setting it in \
                 the test namespace failed: {})",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        );
        return;
    }
    let dst = SocketAddr::from((pair.b4, 7000));
    let l = pair.b.run(move || TcpListener::bind(dst).unwrap()).unwrap();
    let rx = pattern_reader(l);
    let (stats, total) = pair
        .a
        .run(move || {
            let sock = TcpStream::connect(dst).unwrap();
            let pool = Pool::new(16 << 10, 32, false).unwrap();
            let mut c = cfg(TxMode::MsgZc);
            c.depth = 32;
            c.notify_limit = 64;
            let mut tx = Sender::new(sock, &pool, c).unwrap();
            let mut book = Book::default();
            let mut tickets = vec![];
            let mut off = 0u64;
            for _ in 0..2000 {
                let mut b = book.get(&pool, &mut tx);
                common::fill_pattern(&mut b, off);
                off += b.len() as u64;
                tickets.push(common::send(&mut tx, b));
                book.take(&mut tx);
            }
            book.finish(&mut tx, &tickets);
            for c in book.done.values() {
                assert_eq!(c.result(), Ok(c.len), "{c:?}");
            }
            assert_eq!(pool.available(), pool.count());
            (tx.stats().clone(), off)
        })
        .unwrap();
    assert!(stats.room_waits > 0, "ENOBUFS never hit: {stats:?}");
    assert_eq!(rx.join().unwrap(), total);
}

#[test]
fn peer_reset_returns_every_buffer_with_an_error() {
    // uring-copy too: a failed io_uring SEND never notifies, so it must not wait for a
    // notification that might still come (a zero-copy failure's "maybe"): the file server
    // hung on it when wrk closed its connections.
    for mode in [
        TxMode::Copy,
        TxMode::MsgZc,
        TxMode::UringZc,
        TxMode::UringZcFixed,
        TxMode::UringCopy,
    ] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = vec![0u8; 64 << 10];
            let mut got = 0;
            while got < 1 << 20 {
                got += s.read(&mut buf).unwrap();
            }
            // Closing with unread data sends a reset.
            std::thread::sleep(Duration::from_millis(20));
            drop(s);
        });
        let sock = TcpStream::connect(addr).unwrap();
        let pool = Pool::new(64 << 10, 16, false).unwrap();
        let mut c = cfg(mode);
        c.depth = 16;
        let mut tx = Sender::new(sock, &pool, c).unwrap();
        let mut book = Book::default();
        let mut tickets = vec![];
        for _ in 0..4000 {
            let b = book.get(&pool, &mut tx);
            tickets.push(common::send(&mut tx, b));
            book.take(&mut tx);
            if book.done.values().any(|c| c.error.is_some()) {
                break;
            }
        }
        book.finish(&mut tx, &tickets);
        peer.join().unwrap();
        let errors: Vec<&SendError> = book
            .done
            .values()
            .filter_map(|c| c.error.as_ref())
            .collect();
        assert!(!errors.is_empty(), "{mode}: no send saw the reset");
        assert!(
            errors
                .iter()
                .all(|e| matches!(e, SendError::Connection { .. })),
            "{mode}: {errors:?}"
        );
        assert_eq!(pool.available(), pool.count(), "{mode}: buffers leaked");
        // Sends after the failure complete at once, with the error.
        let b = pool.try_get().unwrap();
        let t = common::send(&mut tx, b);
        tx.flush(Duration::from_secs(5)).unwrap();
        let (c, _) = tx.next_completion().unwrap();
        assert_eq!(c.ticket, t);
        assert!(c.error.is_some(), "{mode}: {c:?}");
    }
}

#[test]
fn oversized_datagram_without_gso_is_a_clear_error() {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    for mode in MODES {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.connect(rx.local_addr().unwrap()).unwrap();
        let (done, _) = udp_sends(s, mode, &[100 << 10, 1000], false);
        let e = done[0].error.clone().expect("EMSGSIZE");
        assert_eq!(
            e,
            SendError::MessageTooBig {
                len: 100 << 10,
                max: 65507
            }
        );
        assert!(e.to_string().contains("EMSGSIZE"), "{e}");
        assert_eq!(done[1].result(), Ok(1000));
    }
}

#[test]
fn unix_socket_refuses_zero_copy_and_falls_back_with_a_reason() {
    for mode in [TxMode::MsgZc, TxMode::UringZc, TxMode::Auto] {
        let (a, mut b) = UnixStream::pair().unwrap();
        let pool = Pool::new(4096, 4, false).unwrap();
        let mut tx = Sender::new(a, &pool, cfg(mode)).unwrap();
        let mut book = Book::default();
        let mut tickets = vec![];
        let reader = std::thread::spawn(move || {
            let mut v = vec![];
            b.read_to_end(&mut v).unwrap();
            v
        });
        let mut off = 0;
        for _ in 0..8 {
            let mut buf = book.get(&pool, &mut tx);
            common::fill_pattern(&mut buf, off);
            off += 4096;
            tickets.push(common::send(&mut tx, buf));
            book.take(&mut tx);
        }
        book.finish(&mut tx, &tickets);
        // Without io_uring the copy is send(2); on the ring it is io_uring SEND.
        let copy = if mode == TxMode::MsgZc {
            Path::Copy
        } else {
            Path::UringCopy
        };
        assert_eq!(tx.path(), copy, "{mode}");
        let reasons: Vec<String> = tx.fallbacks().iter().map(|f| f.reason.clone()).collect();
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("SO_ZEROCOPY") || r.contains("EOPNOTSUPP")),
            "{mode}: {reasons:?}"
        );
        assert!(book.done.values().all(|c| c.result() == Ok(4096)));
        drop(tx);
        let v = reader.join().unwrap();
        assert_eq!(v.len() as u64, off);
        common::check_pattern(&v, 0).unwrap();
    }
}

#[test]
fn memlock_exhausted_fixed_buffers_fall_back_with_a_reason() {
    let test = "memlock_exhausted_fixed_buffers_fall_back_with_a_reason";
    let Ok((Some(limit), _)) = zcio::sys::getrlimit(libc::RLIMIT_MEMLOCK) else {
        common::skip(test, "RLIMIT_MEMLOCK is unlimited here");
        return;
    };
    let res = std::thread::spawn(move || {
        // Without CAP_IPC_LOCK the ring accounts registered buffers against RLIMIT_MEMLOCK.
        zcio_testnet::caps::drop_effective_in_this_thread(zcio_testnet::caps::CAP_IPC_LOCK)
            .unwrap();
        let slot = 1 << 20;
        let count = (limit as usize / slot + 2).min(4096);
        let pool = Pool::new(slot, count, false).unwrap();
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.connect(rx.local_addr().unwrap()).unwrap();
        let mut tx = Sender::new(s, &pool, cfg(TxMode::UringZcFixed)).unwrap();
        let path = tx.path();
        let fallbacks = tx.fallbacks().to_vec();
        let mut b = pool.try_get().unwrap();
        b.set_len(1000);
        let t = common::send(&mut tx, b);
        tx.flush(Duration::from_secs(5)).unwrap();
        let (c, _) = tx.next_completion().unwrap();
        (path, fallbacks, t, c)
    })
    .join()
    .unwrap();
    let (path, fallbacks, t, c) = res;
    assert_eq!(path, Path::UringZc, "{fallbacks:?}");
    assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
    assert_eq!(fallbacks[0].from, Path::UringZcFixed.into());
    assert!(
        fallbacks[0].reason.contains("RLIMIT_MEMLOCK"),
        "{}",
        fallbacks[0]
    );
    assert_eq!(c.ticket, t);
    assert_eq!(c.result(), Ok(1000));
}

#[test]
fn tiny_send_buffer_and_slow_reader_keep_the_stream_in_order() {
    for mode in [TxMode::MsgZc, TxMode::UringZc, TxMode::UringZcFixed] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let rx = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = vec![0u8; 3000];
            let mut off = 0u64;
            loop {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    return off;
                }
                common::check_pattern(&buf[..n], off)
                    .unwrap_or_else(|bad| panic!("{mode}: stream corrupt at offset {bad}"));
                off += n as u64;
                if off % 7 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        });
        let sock = TcpStream::connect(addr).unwrap();
        zcio::sys::setsockopt_int(&sock, libc::SOL_SOCKET, libc::SO_SNDBUF, 4096).unwrap();
        let pool = Pool::new(48 << 10, 16, false).unwrap();
        let mut c = cfg(mode);
        c.depth = 16;
        c.submit_batch = 4;
        let mut tx = Sender::new(sock, &pool, c).unwrap();
        let mut book = Book::default();
        let mut tickets = vec![];
        let mut off = 0u64;
        for i in 0..120usize {
            let mut b = book.get(&pool, &mut tx);
            b.set_len(1 + (i * 7919) % (48 << 10));
            common::fill_pattern(&mut b, off);
            off += b.len() as u64;
            tickets.push(common::send(&mut tx, b));
            book.take(&mut tx);
        }
        book.finish(&mut tx, &tickets);
        assert!(book.done.values().all(|c| c.result() == Ok(c.len)));
        assert_eq!(pool.available(), pool.count());
        drop(tx);
        assert_eq!(rx.join().unwrap(), off, "{mode}");
    }
}

#[test]
fn memlock_limit_on_pinned_pages_is_backpressure_for_send_zc() {
    let test = "memlock_limit_on_pinned_pages_is_backpressure_for_send_zc";
    let Ok((Some(limit), _)) = zcio::sys::getrlimit(libc::RLIMIT_MEMLOCK) else {
        common::skip(test, "RLIMIT_MEMLOCK is unlimited here");
        return;
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let rx = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let mut off = 0u64;
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                return off;
            }
            common::check_pattern(&buf[..n], off)
                .unwrap_or_else(|bad| panic!("stream corrupt at offset {bad}"));
            off += n as u64;
        }
    });
    let (stats, total, fallbacks) = std::thread::spawn(move || {
        // Without CAP_IPC_LOCK, SEND_ZC accounts the pages it pins against RLIMIT_MEMLOCK.
        zcio_testnet::caps::drop_effective_in_this_thread(zcio_testnet::caps::CAP_IPC_LOCK)
            .unwrap();
        let slot = 1 << 20;
        let count = (2 * limit as usize / slot).clamp(4, 64);
        let pool = Pool::new(slot, count, false).unwrap();
        let sock = TcpStream::connect(addr).unwrap();
        let mut c = cfg(TxMode::UringZc);
        c.depth = count;
        c.submit_batch = count;
        let mut tx = Sender::new(sock, &pool, c).unwrap();
        let mut book = Book::default();
        let mut tickets = vec![];
        let mut off = 0u64;
        for _ in 0..3 * count {
            let mut b = book.get(&pool, &mut tx);
            common::fill_pattern(&mut b, off);
            off += b.len() as u64;
            tickets.push(common::send(&mut tx, b));
            book.take(&mut tx);
        }
        book.finish(&mut tx, &tickets);
        assert!(book.done.values().all(|c| c.result() == Ok(c.len)));
        assert_eq!(pool.available(), pool.count());
        (tx.stats().clone(), off, tx.fallbacks().to_vec())
    })
    .join()
    .unwrap();
    assert_eq!(rx.join().unwrap(), total);
    if stats.room_waits == 0 && fallbacks.is_empty() && kernel_before(6, 2) {
        // Seen on Debian's 6.1 (vmtest): its SEND_ZC did not charge the pinned user pages to
        // RLIMIT_MEMLOCK, so there is no limit to meet; everything else above was checked.
        zcio_testnet::skip_kernel_feature(
            "memlock_limit_on_pinned_pages_is_backpressure_for_send_zc",
            "ZCIO_REQUIRE_SEND_ZC_MEMLOCK",
            "this kernel's SEND_ZC does not charge pinned pages to RLIMIT_MEMLOCK (6.1)",
        );
        return;
    }
    assert!(
        stats.room_waits > 0 || !fallbacks.is_empty(),
        "the memlock limit was never reached: {stats:?}"
    );
    eprintln!("room waits {}, fallbacks {fallbacks:?}", stats.room_waits);
}

/// Sends `n` pattern buffers of `size` on a fresh loopback TCP connection with `mode`, calling
/// `hook` on the sender after `at` sends; returns the book, the tickets, bytes sent and the
/// receiver's byte count (the receiver checks every byte's position).
fn tcp_run_with(
    mode: TxMode,
    n: usize,
    size: usize,
    at: usize,
    hook: impl FnOnce(&mut Sender),
) -> (Sender, Book, Vec<Ticket>, u64, JoinHandle<u64>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let rx = pattern_reader(l.try_clone().unwrap());
    let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let pool = Box::leak(Box::new(Pool::new(size, 16, false).unwrap()));
    let mut tx = Sender::new(sock, pool, cfg(mode)).unwrap();
    assert_eq!(tx.path(), Path::UringZc, "needs io_uring SEND_ZC");
    let mut book = Book::default();
    let mut tickets = vec![];
    let mut off = 0u64;
    let mut hook = Some(hook);
    for i in 0..n {
        if i == at {
            (hook.take().unwrap())(&mut tx);
        }
        let mut b = book.get(pool, &mut tx);
        b.set_len(size);
        common::fill_pattern(&mut b, off);
        off += size as u64;
        tickets.push(common::send(&mut tx, b));
        book.take(&mut tx);
    }
    (tx, book, tickets, off, rx)
}

/// Whether io_uring SEND_ZC works here; otherwise skips `test` with the reason.
fn has_send_zc(test: &str) -> bool {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.connect(rx.local_addr().unwrap()).unwrap();
    let pool = Pool::new(4096, 1, false).unwrap();
    let tx = Sender::new(s, &pool, cfg(TxMode::UringZc)).unwrap();
    tx.path() == Path::UringZc || common::skip(test, &format!("{:?}", tx.fallbacks()))
}

fn ring_fails_mid_stream(times: u32) {
    use zcio::ring::lend::Fault;
    let (mut tx, mut book, tickets, off, rx) =
        tcp_run_with(TxMode::UringZc, 200, 16 << 10, 20, |tx| {
            assert!(tx.inject_ring_fault(Fault {
                after_requests: 0,
                errno: libc::EIO,
                times,
            }));
        });
    // A ring that fails for good cannot deliver the notifications of sends the kernel
    // took: those buffers stay with it (never reused) and flush says so.
    let r = tx.flush(Duration::from_secs(20));
    book.take(&mut tx);
    let stuck = tx.in_flight();
    match r {
        Ok(()) => assert_eq!(stuck, 0),
        Err(zcio::tx::TxError::Ring(e)) => {
            assert!(times == u32::MAX && stuck > 0, "{e}");
            assert!(e.to_string().contains("abandoned"), "{e}");
        }
        Err(e) => panic!("flush: {e}"),
    }
    assert_eq!(book.done.len() + stuck, tickets.len());
    for c in book.done.values() {
        assert_eq!(c.result(), Ok(c.len), "{c:?}");
    }
    assert_eq!(tx.path(), Path::Copy);
    let fb = tx
        .fallbacks()
        .iter()
        .map(|f| f.to_string())
        .collect::<Vec<_>>();
    assert!(
        fb.iter()
            .any(|f| f.contains("io_uring_enter failed") && f.contains("by copy")),
        "{fb:?}"
    );
    drop(tx);
    assert_eq!(
        rx.join().unwrap(),
        off,
        "receiver got every byte once, in order"
    );
}

#[test]
fn ring_failing_for_good_mid_stream_sends_queued_requests_by_copy_in_order() {
    if has_send_zc("ring_failing_for_good_mid_stream_sends_queued_requests_by_copy_in_order") {
        ring_fails_mid_stream(u32::MAX);
    }
}

#[test]
fn a_wait_for_room_ends_when_the_ring_fails_and_the_socket_goes_on_by_copy() {
    // Refused for depth, then the ring fails for good while the caller waits for room: the
    // sends in the kernel are stuck there (their notifications can never be read), but the
    // socket can send again by copy. The wait must end with that, not with the stuck sends'
    // error (it did, at random, under load: a wait for room could never succeed again).
    use zcio::ring::lend::Fault;
    let test = "a_wait_for_room_ends_when_the_ring_fails_and_the_socket_goes_on_by_copy";
    if !has_send_zc(test) {
        return;
    }
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    // The reader starts late: until it reads, every zero-copy send waits for its
    // notification, so the depth of 8 is reached.
    let rx = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        pattern_reader(l).join().unwrap()
    });
    let size = 16 << 10;
    let pool = Box::leak(Box::new(Pool::new(size, 32, false).unwrap()));
    let mut tx = Sender::new(sock, pool, cfg(TxMode::UringZc)).unwrap();
    let mut off = 0u64;
    let mut fill = |b: &mut PoolBuf| {
        b.set_len(size);
        common::fill_pattern(b, off);
        off += size as u64;
    };
    // Sends until one is refused for depth (8 in flight).
    let mut refused = loop {
        let mut b = pool.try_get().expect("pool buffer");
        fill(&mut b);
        match tx.send(b) {
            Ok(_) => continue,
            Err(r) => {
                assert!(matches!(r.reason, zcio::tx::Refusal::Depth), "{r}");
                break r.buf;
            }
        }
    };
    assert!(tx.inject_ring_fault(Fault {
        after_requests: 0,
        errno: libc::EIO,
        times: u32::MAX,
    }));
    let mut book = Book::default();
    let mut waits = 0;
    loop {
        book.take(&mut tx);
        match tx.send(refused) {
            Ok(_) => break,
            Err(r) => {
                assert!(r.reason.is_backpressure(), "{r}");
                let why = r.reason;
                refused = r.buf;
                tx.wait(Duration::from_millis(100))
                    .expect("a wait for room after the ring failed");
                waits += 1;
                assert!(
                    waits < 100,
                    "the socket never took a send again: {why:?} {:?} in flight {}",
                    tx.fallbacks(),
                    tx.in_flight()
                );
            }
        }
    }
    assert_eq!(tx.path(), Path::Copy, "{:?}", tx.fallbacks());
    book.take(&mut tx);
    let stuck = tx.in_flight();
    drop(tx);
    assert_eq!(
        rx.join().unwrap(),
        off,
        "every byte once, in order (stuck: {stuck})"
    );
}

#[test]
fn ring_failing_once_mid_stream_loses_and_repeats_no_byte() {
    if has_send_zc("ring_failing_once_mid_stream_loses_and_repeats_no_byte") {
        ring_fails_mid_stream(1);
    }
}

#[test]
fn interrupted_enter_is_retried_and_zero_copy_stays_on() {
    if !has_send_zc("interrupted_enter_is_retried_and_zero_copy_stays_on") {
        return;
    }
    use zcio::ring::lend::Fault;
    let (mut tx, mut book, tickets, off, rx) =
        tcp_run_with(TxMode::UringZc, 100, 16 << 10, 10, |tx| {
            assert!(tx.inject_ring_fault(Fault {
                after_requests: 0,
                errno: libc::EINTR,
                times: 5,
            }));
        });
    book.finish(&mut tx, &tickets);
    assert_eq!(
        tx.path(),
        Path::UringZc,
        "EINTR disabled zero-copy: {:?}",
        tx.fallbacks()
    );
    assert!(tx.fallbacks().is_empty(), "{:?}", tx.fallbacks());
    assert_eq!(tx.stats().sends_by_path[2], 100);
    drop(tx);
    assert_eq!(rx.join().unwrap(), off);
}

#[test]
fn wait_on_a_ring_that_failed_with_sends_in_the_kernel_errors_instead_of_spinning() {
    if !has_send_zc(
        "wait_on_a_ring_that_failed_with_sends_in_the_kernel_errors_instead_of_spinning",
    ) {
        return;
    }
    use zcio::ring::lend::Fault;
    use zcio::tx::TxError;
    // A peer that does not read and a small send buffer: requests stay in the kernel.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (_peer, _) = l.accept().unwrap();
    let one: libc::c_int = 4096;
    // SAFETY (test): plain setsockopt on a live socket with a valid int.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    assert_eq!(rc, 0);
    let pool = Pool::new(1 << 20, 8, false).unwrap();
    let mut tx = Sender::new(sock, &pool, cfg(TxMode::UringZc)).unwrap();
    assert_eq!(tx.path(), Path::UringZc);
    for _ in 0..4 {
        let mut b = pool.try_get().unwrap();
        b.set_len(1 << 20);
        b.fill(1);
        common::send(&mut tx, b);
    }
    tx.poll().unwrap();
    assert!(tx.in_flight() > 0);
    assert!(tx.inject_ring_fault(Fault {
        after_requests: 0,
        errno: libc::EIO,
        times: u32::MAX,
    }));
    let t0 = std::time::Instant::now();
    let r = tx.flush(Duration::from_secs(60));
    assert!(
        matches!(r, Err(TxError::Ring(_))),
        "flush on a failed ring: {r:?} after {:?}",
        t0.elapsed()
    );
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    // Later sends on the stream fail at once with the error instead of blocking.
    let b = pool.try_get().unwrap();
    let t = common::send(&mut tx, b);
    tx.poll().unwrap();
    let (c, _) = tx
        .completions()
        .find(|(c, _)| c.ticket == t)
        .expect("completes at once");
    assert!(c.error.is_some(), "{c:?}");
}

#[test]
fn socket_with_msg_zerocopy_history_is_refused_for_msg_zc_or_mapped_right() {
    use std::os::fd::AsRawFd;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let rx = pattern_reader(l.try_clone().unwrap());
    let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let fd = sock.as_raw_fd();
    // Someone else sent with MSG_ZEROCOPY on this socket first: 5 completion numbers taken.
    let on: libc::c_int = 1;
    // SAFETY (test): setsockopt/send on a live socket with valid pointers and lengths.
    unsafe {
        assert_eq!(
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                zcio::sys::SO_ZEROCOPY,
                (&on as *const libc::c_int).cast(),
                4
            ),
            0
        );
    }
    let mut off = 0u64;
    // One buffer per send, kept to the end: the kernel may read a MSG_ZEROCOPY buffer until
    // its completion (these are never reaped here), so refilling one buffer corrupted the
    // stream whenever delivery lagged (6.12 and 7.x under emulation: "corrupt at 2000").
    let mut first = vec![vec![0u8; 1000]; 5];
    for buf in &mut first {
        common::fill_pattern(buf, off);
        // SAFETY: as above; `buf` lives until the end of the test.
        let n = unsafe {
            libc::send(
                fd,
                buf.as_ptr().cast(),
                buf.len(),
                zcio::sys::MSG_ZEROCOPY | libc::MSG_NOSIGNAL,
            )
        };
        assert_eq!(n, 1000);
        off += 1000;
    }
    // The sender gets a dup of it.
    let dup = sock.try_clone().unwrap();
    drop(sock);
    let pool = Pool::new(64 << 10, 8, false).unwrap();
    let mut tx = Sender::new(dup, &pool, cfg(TxMode::MsgZc)).unwrap();
    let mut book = Book::default();
    let mut tickets = vec![];
    for _ in 0..40 {
        // Bounded: with notifications mapped to the wrong buffers, some never come back.
        let t0 = std::time::Instant::now();
        let mut b = loop {
            if let Some(b) = pool.try_get() {
                break b;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "buffers never came back: notifications mapped wrong ({:?})",
                tx.stats()
            );
            tx.wait(Duration::from_secs(1)).unwrap();
            book.take(&mut tx);
        };
        b.set_len(16 << 10);
        common::fill_pattern(&mut b, off);
        off += b.len() as u64;
        tickets.push(common::send(&mut tx, b));
        book.take(&mut tx);
    }
    book.finish(&mut tx, &tickets);
    match tx.path() {
        Path::MsgZc => assert_eq!(tx.stats().unmatched_notifications, 0),
        _ => {
            let fb = tx
                .fallbacks()
                .iter()
                .map(|f| f.to_string())
                .collect::<Vec<_>>();
            assert!(
                fb.iter()
                    .any(|f| f.contains("SO_ZEROCOPY") && f.contains("dup")),
                "refused without a clear reason: {fb:?}"
            );
        }
    }
    assert_eq!(pool.available(), pool.count());
    drop(tx);
    assert_eq!(rx.join().unwrap(), off);
}

#[test]
fn auto_measures_both_paths_per_size_on_the_sink_and_records_what_it_learned() {
    if !common::can_make_hosts(
        "auto_measures_both_paths_per_size_on_the_sink_and_records_what_it_learned",
    ) {
        return;
    }
    let sink = Sink::new("txauto").unwrap();
    let (src, dst) = (
        SocketAddr::from((sink.src4, 0)),
        SocketAddr::from((sink.dst4, 9)),
    );
    let (stats, done) = sink
        .host
        .run(move || {
            let s = UdpSocket::bind(src).unwrap();
            s.connect(dst).unwrap();
            let pool = Pool::new(256 << 10, 32, false).unwrap();
            let mut c = cfg(TxMode::Auto);
            c.depth = 16;
            let mut tx = Sender::new(s, &pool, c).unwrap();
            let mut book = Book::default();
            let mut tickets = vec![];
            for (size, n) in [(1usize << 10, 3000), (256 << 10, 400)] {
                for _ in 0..n {
                    let mut b = book.get(&pool, &mut tx);
                    b.set_len(size);
                    tickets.push(common::send(&mut tx, b));
                    book.take(&mut tx);
                }
            }
            book.finish(&mut tx, &tickets);
            (tx.stats().clone(), book.done.len())
        })
        .unwrap();
    assert_eq!(done, 3400);
    // Both sizes were measured on both paths (which one wins depends on the machine).
    assert!(stats.auto_windows >= 8, "{stats:?}");
    assert!(stats.auto_size_copies > 0, "{stats:?}");
    assert!(
        stats.sends_by_path[Path::UringCopy.index()] > 0
            && stats.sends_by_path[Path::UringZcFixed.index()] > 0,
        "{stats:?}"
    );
    assert!(stats.auto_copy_below.is_some(), "{stats:?}");
    assert_eq!(
        stats.auto_switches_to_copy, 0,
        "the sink does not copy: {stats:?}"
    );
}

#[test]
fn ring_failing_while_only_notifications_are_owed_is_abandoned_once_not_retried_forever() {
    let name =
        "ring_failing_while_only_notifications_are_owed_is_abandoned_once_not_retried_forever";
    if !has_send_zc(name) {
        return;
    }
    use zcio::ring::lend::Fault;
    // A peer that does not read yet, with a small receive window: the sends' bytes are
    // accepted into the socket (their results come in) but stay queued unsent, so their
    // notifications are owed until the peer reads.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let small: libc::c_int = 4096;
    // SAFETY (test): plain setsockopt on a live socket with a valid int.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&l),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&small as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    assert_eq!(rc, 0);
    let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (peer, _) = l.accept().unwrap();
    let pool = Pool::new(16 << 10, 16, false).unwrap();
    let mut tx = Sender::new(sock, &pool, cfg(TxMode::UringZc)).unwrap();
    assert_eq!(tx.path(), Path::UringZc);
    let mut off = 0u64;
    for _ in 0..8 {
        let mut b = pool.try_get().unwrap();
        b.set_len(16 << 10);
        common::fill_pattern(&mut b, off);
        off += 16 << 10;
        let _ = common::send(&mut tx, b);
    }
    // Let the results come in; the notifications cannot (nothing was transmitted past the
    // peer's window).
    for _ in 0..5 {
        let _ = tx.wait(Duration::from_millis(40));
    }
    assert!(
        tx.in_flight() > 0,
        "every notification came back: the peer read?"
    );
    assert!(tx.inject_ring_fault(Fault {
        after_requests: 0,
        errno: libc::EIO,
        times: u32::MAX,
    }));
    for _ in 0..3 {
        let t0 = std::time::Instant::now();
        let r = tx.wait(Duration::from_millis(300));
        assert!(
            r.is_err(),
            "wait on a ring that can never deliver the owed notifications returned {r:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(10), "wait spun");
    }
    assert_eq!(tx.path(), Path::Copy);
    assert_eq!(
        tx.fallbacks().len(),
        1,
        "one failure, one fallback: {:?}",
        &tx.fallbacks()[..tx.fallbacks().len().min(3)]
    );
    // The stream stays intact: the peer reads the zero-copy bytes queued before the failure
    // and then one more send, made by copy.
    let rx = std::thread::spawn(move || {
        let mut s = peer;
        let mut buf = vec![0u8; 64 << 10];
        let mut got = 0u64;
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                return got;
            }
            common::check_pattern(&buf[..n], got).expect("stream intact");
            got += n as u64;
        }
    });
    let mut b = pool
        .try_get()
        .expect("buffers not lent to the dead ring remain usable");
    b.set_len(16 << 10);
    common::fill_pattern(&mut b, off);
    off += 16 << 10;
    let _ = common::send(&mut tx, b);
    drop(tx);
    assert_eq!(rx.join().unwrap(), off);
}

/// How the sending side ends the stream in [`eof_delay`].
#[derive(Clone, Copy, Debug)]
enum End {
    Drop,
    Shutdown,
    Close,
}

/// Sends 1 MiB in 64 KiB buffers on `mode`, waits for every completion, then ends the stream
/// as `end` says; returns how long after the last completion (or the last byte read, when
/// later) the peer read its end of stream (the median of 5 connections).
fn eof_delay(mode: TxMode, end: End) -> Duration {
    let mut delays = Vec::new();
    for _ in 0..5 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            let mut n = 0u64;
            let mut last_data = std::time::Instant::now();
            loop {
                match s.read(&mut buf).unwrap() {
                    0 => return (n, std::time::Instant::now(), last_data),
                    k => {
                        n += k as u64;
                        last_data = std::time::Instant::now();
                    }
                }
            }
        });
        let pool = Pool::new(64 << 10, 16, false).unwrap();
        let mut tx = Sender::new(c, &pool, cfg(mode)).unwrap();
        for _ in 0..16 {
            let mut b = pool.try_get().unwrap();
            b.fill(7);
            common::send(&mut tx, b);
        }
        tx.flush(Duration::from_secs(10)).unwrap();
        while let Some((done, _)) = tx.next_completion() {
            assert_eq!(done.result(), Ok(64 << 10));
        }
        let last = std::time::Instant::now();
        match end {
            End::Drop => drop(tx),
            End::Shutdown => {
                tx.shutdown(std::net::Shutdown::Write).unwrap();
                // The sender lives on: the end of stream must not wait for its drop.
                std::thread::sleep(Duration::from_millis(200));
                drop(tx);
            }
            End::Close => tx.close().unwrap(),
        }
        let (n, eof, last_data) = reader.join().unwrap();
        assert_eq!(
            n,
            1 << 20,
            "{mode:?} {end:?}: every byte before the end of stream"
        );
        // On the copy paths a completion says the bytes are in the socket, not read: the
        // delay counts from the later of the last completion and the last byte read.
        delays.push(eof.saturating_duration_since(last.max(last_data)));
    }
    delays.sort();
    delays[2]
}

#[test]
fn the_peer_sees_end_of_stream_promptly_when_the_sender_is_dropped_shut_down_or_closed() {
    // Before: dropping a Sender on an io_uring path delayed the peer's end of stream by
    // 29-40 ms (the ring's registered-file table held the socket until the kernel's
    // deferred ring teardown), and there was no shutdown or close.
    for mode in [
        TxMode::Auto,
        TxMode::UringZc,
        TxMode::UringCopy,
        TxMode::MsgZc,
        TxMode::Copy,
    ] {
        for end in [End::Drop, End::Shutdown, End::Close] {
            let d = eof_delay(mode, end);
            eprintln!("{mode:?} {end:?}: end of stream {d:?} after the last completion");
            assert!(
                d <= common::scaled(Duration::from_millis(5)),
                "{mode:?} {end:?}: the peer saw the end of stream {d:?} after the last \
                 completion (target: 1 ms)"
            );
        }
    }
}

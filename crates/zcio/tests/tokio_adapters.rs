//! `zcio::tokio` adapters on a multi-thread tokio runtime: the reactor (on the worker
//! threads) waits on the objects' readiness descriptors and wakes the task that owns them
//! (the `block_on` future: the objects are not `Send`). Real loopback sockets; NFQUEUE in a
//! test namespace.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};
use zcio::buf::pool::Pool;
use zcio::netlink::{
    CtEventKind, CtEvents, CtEventsConfig, Decision, NfLog, NfLogConfig, NfQueue, NfQueueConfig,
    Verdict,
};
use zcio::rx::{Receiver, RxConfig, RxMode, RxPath};
use zcio::tokio::{AsyncCtEvents, AsyncNfLog, AsyncNfQueue, AsyncReceiver, AsyncSender};
use zcio::tx::{Path, Sender, SenderConfig, TxMode};

/// A hang fails the test within a minute (`common::Watchdog`) instead of holding CI.
fn watchdog() -> common::Watchdog {
    common::Watchdog::new(common::scaled(Duration::from_secs(60)))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (c, s)
}

fn path_or_skip(test: &str, got: String, want: &str, why: String) -> bool {
    got == want || common::skip(test, &format!("path {got} instead of {want}: {why}"))
}

/// Sends 400 × 60 000 bytes of the offset pattern: half with `send().await` (one at a time),
/// half pipelined with `start` + `next_completion`; a reader thread checks every byte.
fn async_send_with(test: &str, mode: TxMode, want: Path) {
    let (c, mut s) = pair();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0u64;
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                return off;
            }
            assert_eq!(common::check_pattern(&buf[..n], off), Ok(()), "at {off}");
            off += n as u64;
        }
    });
    let rt = runtime();
    let sent = rt.block_on(async move {
        let pool = Pool::new(64 << 10, 32, false).unwrap();
        let cfg = SenderConfig {
            depth: 16,
            ..SenderConfig::new(mode)
        };
        let tx = Sender::new(c, &pool, cfg).unwrap();
        let (p, fb) = (tx.path().to_string(), format!("{:?}", tx.fallbacks()));
        if !path_or_skip(test, p, want.name(), fb) {
            return None;
        }
        let mut tx = AsyncSender::new(tx).unwrap();
        let mut off = 0u64;
        let len = 60_000;
        for _ in 0..200 {
            let mut b = pool.try_get().expect("every buffer came back");
            b.set_len(len);
            common::fill_pattern(&mut b, off);
            let (done, back) = tx.send(b).await.unwrap();
            assert_eq!(done.result().unwrap(), len);
            assert_eq!(back.len(), len);
            off += len as u64;
        }
        let mut started = 0;
        let mut completed = 0;
        while completed < 200 {
            if started < 200 {
                if let Some(mut b) = pool.try_get() {
                    b.set_len(len);
                    common::fill_pattern(&mut b, off);
                    tx.start(b).await.unwrap();
                    off += len as u64;
                    started += 1;
                    continue;
                }
            }
            let (done, _buf) = tx.next_completion().await.unwrap().expect("in flight");
            assert_eq!(done.result().unwrap(), len);
            completed += 1;
        }
        tx.flush().await.unwrap();
        assert!(tx.next_completion().await.unwrap().is_none());
        assert_eq!(pool.available(), pool.count(), "a buffer was lost");
        Some(off)
    });
    let Some(sent) = sent else { return };
    assert_eq!(reader.join().unwrap(), sent);
}

#[test]
fn async_send_returns_every_buffer_with_its_completion_on_uring_zc() {
    let _dog = watchdog();
    async_send_with(
        "async_send_returns_every_buffer_with_its_completion_on_uring_zc",
        TxMode::UringZc,
        Path::UringZc,
    );
}

#[test]
fn async_send_returns_every_buffer_with_its_completion_on_msg_zc() {
    let _dog = watchdog();
    async_send_with(
        "async_send_returns_every_buffer_with_its_completion_on_msg_zc",
        TxMode::MsgZc,
        Path::MsgZc,
    );
}

#[test]
fn async_send_returns_every_buffer_with_its_completion_on_copy() {
    let _dog = watchdog();
    async_send_with(
        "async_send_returns_every_buffer_with_its_completion_on_copy",
        TxMode::Copy,
        Path::Copy,
    );
}

/// A thread writes 8 MiB of the pattern in uneven pieces with pauses; `recv().await` gets
/// every byte in order and then `None` at the close.
fn async_recv_with(test: &str, cfg: RxConfig, want: RxPath) {
    let (mut c, s) = pair();
    let total = 8u64 << 20;
    let writer = std::thread::spawn(move || {
        let mut off = 0u64;
        let mut step = 1usize;
        while off < total {
            let n = (step * 7919 % 300_000 + 1).min((total - off) as usize);
            let mut b = vec![0u8; n];
            common::fill_pattern(&mut b, off);
            c.write_all(&b).unwrap();
            off += n as u64;
            step += 1;
            if step % 16 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
    let rt = runtime();
    let got = rt.block_on(async move {
        let rx = Receiver::new(&cfg).unwrap();
        let why = format!("{:?}", rx.fallbacks());
        if !path_or_skip(test, rx.path().name().into(), want.name(), why) {
            return None;
        }
        let mut rx = AsyncReceiver::new(rx).unwrap();
        rx.get_mut().add(s).unwrap();
        let mut off = 0u64;
        while let Some(chunk) = rx.recv().await.unwrap() {
            assert_eq!(common::check_pattern(&chunk, off), Ok(()), "at {off}");
            off += chunk.len() as u64;
        }
        Some(off)
    });
    writer.join().unwrap();
    if let Some(got) = got {
        assert_eq!(got, total);
    }
}

#[test]
fn async_recv_yields_every_byte_in_order_on_bufring() {
    let _dog = watchdog();
    async_recv_with(
        "async_recv_yields_every_byte_in_order_on_bufring",
        RxConfig::with_mode(RxMode::BufRing),
        RxPath::BufRing,
    );
}

#[test]
fn async_recv_yields_every_byte_in_order_on_bufring_with_coop_taskrun() {
    let _dog = watchdog();
    async_recv_with(
        "async_recv_yields_every_byte_in_order_on_bufring_with_coop_taskrun",
        RxConfig {
            defer_taskrun: false,
            ..RxConfig::with_mode(RxMode::BufRing)
        },
        RxPath::BufRing,
    );
}

#[test]
fn async_recv_yields_every_byte_in_order_on_plain() {
    let _dog = watchdog();
    async_recv_with(
        "async_recv_yields_every_byte_in_order_on_plain",
        RxConfig::with_mode(RxMode::Plain),
        RxPath::Plain,
    );
}

const NFQ_PORT: u16 = 9999;

/// NFQUEUE in a namespace: datagrams sent from another thread, paced, are each decided once
/// by the async consumer (odd sequence numbers dropped), and the receiver gets the rest.
fn async_nfqueue_with(test: &str, queue: u16, uring: bool) {
    if !common::can_make_hosts(test) {
        return;
    }
    let ns = zcio_testnet::Netns::new("anfq").expect("namespace");
    let out = ns
        .command("iptables")
        .args(["-A", "INPUT", "-p", "udp", "--dport", &NFQ_PORT.to_string()])
        .args(["-j", "NFQUEUE", "--queue-num", &queue.to_string()])
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            let e = String::from_utf8_lossy(&o.stderr).to_string();
            common::skip(test, &format!("iptables NFQUEUE rule refused: {e}"));
            return;
        }
        Err(e) => {
            common::skip(test, &format!("iptables not runnable: {e}"));
            return;
        }
    }
    let test = test.to_string();
    ns.run(move || {
        let total = 600u32;
        let rx = UdpSocket::bind(("127.0.0.1", NFQ_PORT)).unwrap();
        rx.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        zcio::sys::setsockopt_int(&rx, libc::SOL_SOCKET, libc::SO_RCVBUF, 8 << 20).unwrap();
        let cfg = NfQueueConfig {
            first: queue,
            last: queue,
            uring,
            copy: zcio::netlink::CopyMode::Packet(2048),
            ..NfQueueConfig::default()
        };
        let rt = runtime();
        let decided = rt.block_on(async move {
            let q = NfQueue::open(cfg).unwrap();
            let want = if uring {
                "frame-ring+io_uring"
            } else {
                "frame-ring+recvmmsg"
            };
            let why = format!("{:?}", q.fallbacks());
            assert_eq!(q.path().as_str(), want, "{test}: {why}");
            let mut q = AsyncNfQueue::new(q).unwrap();
            // The sender starts only once the consumer waits, from a thread in this
            // namespace (threads inherit the creator's namespaces).
            let sender = std::thread::spawn(move || {
                let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
                tx.connect(("127.0.0.1", NFQ_PORT)).unwrap();
                for seq in 0..total {
                    tx.send(&seq.to_be_bytes()).unwrap();
                    if seq % 50 == 0 {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            });
            let mut seen = std::collections::BTreeSet::new();
            while seen.len() < total as usize {
                let n = tokio::time::timeout(
                    Duration::from_secs(10),
                    q.process(|p| {
                        let b = p.payload.expect("copy mode");
                        let ihl = usize::from(b[0] & 0xf) * 4;
                        let d = &b[ihl + 8..ihl + 12];
                        let seq = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
                        assert!(seen.insert(seq), "seq {seq} decided twice");
                        if seq % 2 == 1 {
                            Decision::Verdict(Verdict::Drop)
                        } else {
                            Decision::Verdict(Verdict::Accept)
                        }
                    }),
                )
                .await
                .expect("the consumer was never woken")
                .unwrap();
                assert!(n > 0);
            }
            sender.join().unwrap();
            let st = q.get_ref().stats();
            assert_eq!(st.verdicts(), u64::from(total), "{st:?}");
            seen.len()
        });
        assert_eq!(decided, total as usize);
        let mut got = Vec::new();
        let mut b = [0u8; 64];
        while let Ok(n) = rx.recv(&mut b) {
            assert_eq!(n, 4);
            got.push(u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        }
        got.sort_unstable();
        assert_eq!(got, (0..total).filter(|s| s % 2 == 0).collect::<Vec<_>>());
    })
    .unwrap();
}

#[test]
fn async_nfqueue_decides_every_packet_once_on_the_uring_frame_ring() {
    let _dog = watchdog();
    async_nfqueue_with(
        "async_nfqueue_decides_every_packet_once_on_the_uring_frame_ring",
        41,
        true,
    );
}

#[test]
fn async_nfqueue_decides_every_packet_once_on_recvmmsg() {
    let _dog = watchdog();
    async_nfqueue_with(
        "async_nfqueue_decides_every_packet_once_on_recvmmsg",
        42,
        false,
    );
}

#[test]
fn async_flush_fails_instead_of_hanging_when_the_ring_is_abandoned() {
    let _dog = watchdog();
    // The peer never reads and its receive buffer is small: sends are accepted into the
    // socket but their notifications stay owed; then the ring fails for good. Nothing can
    // ever signal the descriptor for those sends: the wait must say so, not hang.
    use zcio::ring::lend::Fault;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    zcio::sys::setsockopt_int(&l, libc::SOL_SOCKET, libc::SO_RCVBUF, 4096).unwrap();
    let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (_peer, _) = l.accept().unwrap();
    runtime().block_on(async move {
        let pool = Pool::new(16 << 10, 16, false).unwrap();
        let cfg = SenderConfig {
            depth: 8,
            ..SenderConfig::new(TxMode::UringZc)
        };
        let tx = Sender::new(sock, &pool, cfg).unwrap();
        assert_eq!(tx.path(), Path::UringZc, "{:?}", tx.fallbacks());
        let mut tx = AsyncSender::new(tx).unwrap();
        for _ in 0..8 {
            let mut b = pool.try_get().unwrap();
            b.set_len(16 << 10);
            tx.start(b).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.get_mut().poll().unwrap();
        assert!(tx.get_ref().in_flight() > 0, "the peer read?");
        assert!(tx.get_mut().inject_ring_fault(Fault {
            after_requests: 0,
            errno: libc::EIO,
            times: u32::MAX,
        }));
        // One enter fails, the ring is abandoned with notifications owed.
        let _ = tx.get_mut().wait(Duration::from_millis(300));
        let r = tokio::time::timeout(Duration::from_secs(10), tx.flush())
            .await
            .expect("flush hung on sends that can never complete");
        assert!(r.is_err(), "flush returned {r:?}");
    });
}

/// A namespace with `rule` (iptables arguments after `-A`), or a skip.
fn ns_with_rule(test: &str, tag: &str, rule: &[&str]) -> Option<zcio_testnet::Netns> {
    if !common::can_make_hosts(test) {
        return None;
    }
    let ns = zcio_testnet::Netns::new(tag).expect("namespace");
    match ns.command("iptables").arg("-A").args(rule).output() {
        Ok(o) if o.status.success() => Some(ns),
        other => {
            common::skip(test, &format!("iptables rule refused: {other:?}"));
            None
        }
    }
}

/// The sequence numbers (a UDP payload's first 4 bytes) of `total` logged packets, each wait
/// for the next bounded by 10 s.
async fn nflog_seqs(log: &mut AsyncNfLog, total: u32) -> Vec<u32> {
    let mut seen = Vec::new();
    while seen.len() < total as usize {
        let n = tokio::time::timeout(
            Duration::from_secs(10),
            log.process(|p| {
                let b = p.payload.expect("copy mode");
                let d = &b[28..32];
                seen.push(u32::from_be_bytes([d[0], d[1], d[2], d[3]]));
            }),
        )
        .await
        .unwrap_or_else(|_| panic!("the consumer was never woken after {}", seen.len()))
        .unwrap();
        assert!(n > 0);
    }
    seen
}

/// NFLOG in a namespace: packets sent from another thread, paced, once the async consumer
/// waits, each arrive once and in order.
#[test]
fn async_nflog_hands_over_every_logged_packet_in_order() {
    let _dog = watchdog();
    let test = "async_nflog_hands_over_every_logged_packet_in_order";
    let Some(ns) = ns_with_rule(
        test,
        "anfl",
        &[
            "INPUT",
            "-p",
            "udp",
            "--dport",
            "9301",
            "-j",
            "NFLOG",
            "--nflog-group",
            "43",
        ],
    ) else {
        return;
    };
    ns.run(|| {
        let total = 600u32;
        let rx = UdpSocket::bind("127.0.0.1:9301").unwrap();
        let rt = runtime();
        rt.block_on(async move {
            let log = NfLog::open(NfLogConfig {
                groups: vec![43],
                ..NfLogConfig::default()
            })
            .unwrap();
            assert_eq!(log.path().as_str(), "frame-ring+io_uring");
            let mut log = AsyncNfLog::new(log).unwrap();
            let sender = std::thread::spawn(move || {
                let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
                for seq in 0..total {
                    tx.send_to(&seq.to_be_bytes(), "127.0.0.1:9301").unwrap();
                    if seq % 50 == 0 {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            });
            let seen = nflog_seqs(&mut log, total).await;
            sender.join().unwrap();
            assert_eq!(seen, (0..total).collect::<Vec<_>>());
            let st = log.get_ref().stats();
            assert!(!st.any_loss(), "{st:?}");
        });
        drop(rx);
    })
    .unwrap();
}

/// NFLOG on the io_uring frame ring in a namespace, watched by tokio (edge-triggered): no
/// harvest reads the ring's eventfd back to zero (that read was one more system call per
/// harvest), and no wake-up is lost with a budget of 4 packets per call against bursts of
/// 50 (each call leaves work), then 100 single packets 2 ms apart (a harvest each): every
/// packet arrives once, in order.
#[test]
fn async_nflog_harvests_without_an_eventfd_read_and_loses_no_wake_up() {
    let _dog = watchdog();
    let test = "async_nflog_harvests_without_an_eventfd_read_and_loses_no_wake_up";
    let Some(ns) = ns_with_rule(
        test,
        "anfe",
        &[
            "INPUT",
            "-p",
            "udp",
            "--dport",
            "9302",
            "-j",
            "NFLOG",
            "--nflog-group",
            "44",
        ],
    ) else {
        return;
    };
    ns.run(|| {
        const BURSTS: u32 = 8;
        const BURST: u32 = 50;
        const SINGLES: u32 = 100;
        let total = BURSTS * BURST + SINGLES;
        let rx = UdpSocket::bind("127.0.0.1:9302").unwrap();
        let rt = runtime();
        rt.block_on(async move {
            let log = NfLog::open(NfLogConfig {
                groups: vec![44],
                budget: 4,
                ..NfLogConfig::default()
            })
            .unwrap();
            assert_eq!(log.path().as_str(), "frame-ring+io_uring");
            let mut log = AsyncNfLog::new(log).unwrap();
            let sender = std::thread::spawn(move || {
                let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
                for seq in 0..total {
                    tx.send_to(&seq.to_be_bytes(), "127.0.0.1:9302").unwrap();
                    let single = seq >= BURSTS * BURST;
                    if single || seq % BURST == BURST - 1 {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
            });
            let seen = nflog_seqs(&mut log, total).await;
            sender.join().unwrap();
            assert_eq!(seen, (0..total).collect::<Vec<_>>());
            let st = log.get_ref().stats();
            eprintln!("{st:?}");
            assert!(!st.any_loss(), "{st:?}");
            assert_eq!(st.stream.eventfd_reads, 0, "{st:?}");
            assert!(st.stream.syscalls > 0, "{st:?}");
        });
        drop(rx);
    })
    .unwrap();
}

/// Conntrack events in a namespace: one NEW event per UDP flow made after the async
/// subscriber waits.
#[test]
fn async_ctevents_hands_over_every_event() {
    let _dog = watchdog();
    let test = "async_ctevents_hands_over_every_event";
    let Some(ns) = ns_with_rule(
        test,
        "acte",
        &[
            "INPUT",
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-j",
            "ACCEPT",
        ],
    ) else {
        return;
    };
    ns.run(|| {
        let flows = 200u16;
        let rt = runtime();
        rt.block_on(async move {
            let ev = CtEvents::open(CtEventsConfig {
                update: false,
                destroy: false,
                ..CtEventsConfig::default()
            })
            .unwrap();
            let mut ev = AsyncCtEvents::new(ev).unwrap();
            let sender = std::thread::spawn(move || {
                let srv = UdpSocket::bind("127.0.0.1:9302").unwrap();
                for i in 0..flows {
                    let c = UdpSocket::bind(("127.0.0.1", 21_000 + i)).unwrap();
                    c.send_to(b"x", "127.0.0.1:9302").unwrap();
                    if i % 50 == 0 {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                drop(srv);
            });
            let mut ports = std::collections::BTreeSet::new();
            while ports.len() < flows as usize {
                tokio::time::timeout(
                    Duration::from_secs(10),
                    ev.process(|e| {
                        assert_eq!(e.kind, CtEventKind::New);
                        let o = e.ct.orig.unwrap();
                        if o.dst_port == Some(9302) {
                            assert!(ports.insert(o.src_port.unwrap()));
                        }
                    }),
                )
                .await
                .expect("the subscriber was never woken")
                .unwrap();
            }
            sender.join().unwrap();
            assert_eq!(ports, (21_000..21_000 + flows).collect());
            assert_eq!(ev.get_ref().stats().lost(), 0);
        });
    })
    .unwrap();
}

#[test]
fn async_send_ring_sends_gso_trains_to_many_peers_waiting_out_backpressure() {
    let _dog = watchdog();
    use zcio::tokio::AsyncSendRing;
    use zcio::tx::{Dest, Pool, SendRing, SendRingConfig};
    const PEERS: usize = 8;
    const ROUNDS: usize = 8;
    let peers: Vec<std::net::UdpSocket> = (0..PEERS)
        .map(|_| {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    let addrs: Vec<_> = peers.iter().map(|s| s.local_addr().unwrap()).collect();
    // The ring is the thread's (not Send): a current-thread runtime.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (completions, refusals) = rt.block_on(async move {
        let pool = Pool::new(16 << 10, PEERS * ROUNDS, false).unwrap();
        let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
        let _ = ring.register_pool(&pool);
        let mut c = SenderConfig::new(TxMode::Auto);
        c.depth = 4; // most sends meet backpressure and wait on the readiness descriptor
        let id = ring
            .add(std::net::UdpSocket::bind("127.0.0.1:0").unwrap(), &c)
            .unwrap();
        let mut tx = AsyncSendRing::new(ring).unwrap();
        for _ in 0..ROUNDS {
            for (p, &addr) in addrs.iter().enumerate() {
                let mut b = pool.try_get().unwrap();
                b.set_len(5 * 1000);
                b.fill(p as u8);
                tx.send_to(id, b, &Dest::new(addr).segment(1000))
                    .await
                    .unwrap();
            }
        }
        let mut n = 0;
        while let Some((c, buf)) = tx.next_completion().await.unwrap() {
            assert_eq!(c.result(), Ok(5000), "{c:?}");
            drop(buf);
            n += 1;
        }
        (n, tx.get_ref().sock_stats(id).depth_refusals)
    });
    assert_eq!(completions, PEERS * ROUNDS);
    assert!(refusals > 0, "no backpressure was met");
    let mut buf = [0u8; 4096];
    for (p, s) in peers.iter().enumerate() {
        let mut n = 0;
        while let Ok(len) = s.recv(&mut buf) {
            assert_eq!(len, 1000, "peer {p}");
            assert!(buf[..len].iter().all(|&b| b == p as u8), "peer {p}");
            n += 1;
        }
        assert_eq!(n, 5 * ROUNDS, "peer {p}");
    }
}

/// Audit on the host (audit is global: `AuditHost` serialises with the other audit tests and
/// sets everything back): a storm of `openat` calls of a file the test names, made while the
/// async consumer waits, arrives once and whole, counted by serial; the counters say no loss.
#[test]
fn async_audit_hands_over_every_event_of_a_storm_once_and_whole() {
    use std::collections::BTreeSet;
    use zcio::netlink::{audit_status, Audit, AuditConfig, AuditMode};
    use zcio::tokio::AsyncAudit;
    use zcio_testnet::audit::{key_of, storm, whole, AuditHost};
    let _dog = watchdog();
    let test = "async_audit_hands_over_every_event_of_a_storm_once_and_whole";
    let Some(mut host) = AuditHost::take(test, false) else {
        return;
    };
    let (file, key) = host.watch("tokio-storm");
    const N: usize = 1000;
    let rt = runtime();
    rt.block_on(async {
        let a = Audit::open(AuditConfig {
            mode: AuditMode::Primary,
            fallback: false,
            // Scaled under emulation (see tests/audit.rs, `event_wait`): a slow kauditd can
            // hold one event's records apart for longer than the default 500 ms.
            event_wait: common::scaled(AuditConfig::default().event_wait),
            ..AuditConfig::default()
        })
        .unwrap();
        let lost0 = audit_status().unwrap().lost;
        let mut a = AsyncAudit::new(a).unwrap();
        let mut child = storm(&file, N);
        let (mut seen, mut dup, mut broken) = (BTreeSet::new(), 0, 0);
        while seen.len() < N {
            tokio::time::timeout(
                Duration::from_secs(20),
                a.process(|ev| {
                    if key_of(ev).as_deref() == Some(key.as_str()) {
                        if !seen.insert(ev.serial) {
                            dup += 1;
                        }
                        if !whole(ev, &file) {
                            broken += 1;
                        }
                    }
                }),
            )
            .await
            .expect("the consumer was never woken")
            .unwrap();
        }
        assert!(child.wait().unwrap().success());
        let st = a.get_mut().stats();
        assert_eq!((seen.len(), dup, broken), (N, 0, 0), "{st:?}");
        assert_eq!(
            audit_status().unwrap().lost,
            lost0,
            "the kernel lost records"
        );
        assert!(
            st.loss.exact && st.loss.at_least == 0,
            "{}",
            st.loss_summary()
        );
        assert_eq!(st.stream.parse_errors, 0);
        drop(a);
        assert_eq!(audit_status().unwrap().pid, 0, "unregistered at close");
    });
}

/// The timer path of `AsyncAudit`: an event the kernel sends no end-of-event record for
/// (`ANOM_ABEND`, 1701, logged when a task outside any syscall dies of a core-dumping signal;
/// its own serial, not a single-record type) is closed by the consumer's `event_wait` alone.
/// Nothing else arrives to make the readiness descriptor readable, so only the timer that
/// `process` waits on beside it can hand the event over; without it `process` never returns.
#[test]
fn async_audit_closes_an_event_without_its_end_record_after_the_wait() {
    use zcio::netlink::{Audit, AuditConfig, AuditMode, EventEnd};
    use zcio::tokio::AsyncAudit;
    use zcio_testnet::audit::AuditHost;
    const AUDIT_ANOM_ABEND: u16 = 1701;
    let test = "async_audit_closes_an_event_without_its_end_record_after_the_wait";
    // The host's audit lock first: another audit user (a bench run) may hold it for minutes.
    let Some(_host) = AuditHost::take(test, false) else {
        return;
    };
    let _dog = watchdog();
    let event_wait = Duration::from_millis(300);
    let rt = runtime();
    rt.block_on(async {
        let a = Audit::open(AuditConfig {
            mode: AuditMode::Primary,
            fallback: false,
            event_wait,
            ..AuditConfig::default()
        })
        .unwrap();
        let mut a = AsyncAudit::new(a).unwrap();
        // A shell that sends itself SIGABRT: the signal is taken on the way back from kill(2),
        // after the syscall's audit exit, so the record is made outside any syscall.
        let t0 = Instant::now();
        let status = std::process::Command::new("sh")
            .args(["-c", "ulimit -c 0; kill -ABRT $$"])
            .status()
            .unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGABRT)
        );
        let mut found = None;
        let limit = common::scaled(Duration::from_secs(10));
        while found.is_none() {
            let left = limit.checked_sub(t0.elapsed()).unwrap_or_default();
            tokio::time::timeout(
                left,
                a.process(|ev| {
                    if ev.records().any(|r| r.ty == AUDIT_ANOM_ABEND) {
                        found = Some((ev.clone(), t0.elapsed()));
                    }
                }),
            )
            .await
            .expect("the event without an end record was never handed over (no timer wake-up)")
            .unwrap();
        }
        let (ev, took) = found.unwrap();
        let rec = ev.records().find(|r| r.ty == AUDIT_ANOM_ABEND).unwrap();
        eprintln!(
            "{test}: {} after {took:?}: {}",
            ev.end.as_str(),
            String::from_utf8_lossy(rec.text)
        );
        assert_eq!(ev.end, EventEnd::Wait, "closed by the wait");
        assert_eq!(rec.field("sig").as_deref(), Some(&b"6"[..]));
        assert!(
            took >= event_wait,
            "closed after {took:?}, before the wait of {event_wait:?} ended"
        );
        let st = a.get_mut().stats();
        assert!(st.events.waited >= 1, "{st:?}");
    });
}

/// A request-response exchange on an [`AsyncReceiver`] (bufring) where every request is its
/// own harvest (the client waits for each answer): the receiver's system calls are its ring
/// enters alone. tokio watches the ring's eventfd edge-triggered, so no harvest reads it back
/// to zero: that read was one more system call per harvest.
#[test]
fn async_receiver_harvests_without_an_eventfd_read_per_harvest() {
    let _dog = watchdog();
    let test = "async_receiver_harvests_without_an_eventfd_read_per_harvest";
    const ROUNDS: usize = 200;
    const MSG: usize = 64;
    let (mut c, s) = pair();
    let mut back = s.try_clone().unwrap();
    let client = std::thread::spawn(move || {
        for r in 0..ROUNDS {
            let mut m = [0u8; MSG];
            common::fill_pattern(&mut m, (r * MSG) as u64);
            c.write_all(&m).unwrap();
            let mut got = [0u8; MSG];
            c.read_exact(&mut got).unwrap();
            assert_eq!(got, m, "round {r}");
        }
    });
    let rt = runtime();
    rt.block_on(async move {
        let rx = Receiver::new(&RxConfig::with_mode(RxMode::BufRing)).unwrap();
        let why = format!("{:?}", rx.fallbacks());
        if !path_or_skip(test, rx.path().name().into(), "bufring", why) {
            drop(back);
            return;
        }
        let mut rx = AsyncReceiver::new(rx).unwrap();
        rx.get_mut().add(s).unwrap();
        let mut off = 0usize;
        while off < ROUNDS * MSG {
            let chunk = rx.recv().await.unwrap().expect("data before the close");
            assert_eq!(
                common::check_pattern(&chunk, off as u64),
                Ok(()),
                "at {off}"
            );
            back.write_all(&chunk).unwrap();
            off += chunk.len();
        }
        let st = rx.get_ref().stats();
        eprintln!("{}; {st:?}", rx.get_ref().describe());
        assert!(st.ring_enters > 0, "{st:?}");
        assert_eq!(st.syscalls, st.ring_enters, "{st:?}");
    });
    client.join().unwrap();
}

/// Many connections, each writing many small messages at once, on one [`AsyncReceiver`]
/// whose descriptor is not read back per harvest: a harvest that stops with work left (each
/// enter runs a bounded batch of deferred task work; `on_ready` makes at most four rounds)
/// leaves the descriptor a new edge, so every byte arrives, in order, within the bound.
#[test]
fn async_receiver_loses_no_wake_up_when_a_harvest_leaves_work() {
    let _dog = watchdog();
    let test = "async_receiver_loses_no_wake_up_when_a_harvest_leaves_work";
    const CONNS: usize = 64;
    const MSGS: usize = 200;
    const MSG: usize = 48;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let clients: Vec<TcpStream> = (0..CONNS)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let servers: Vec<TcpStream> = (0..CONNS).map(|_| l.accept().unwrap().0).collect();
    let go = std::sync::Arc::new(std::sync::Barrier::new(CONNS + 1));
    let writers: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            let go = go.clone();
            std::thread::spawn(move || {
                c.set_nodelay(true).unwrap();
                go.wait();
                for m in 0..MSGS {
                    let mut b = [0u8; MSG];
                    common::fill_pattern(&mut b, (i * MSGS * MSG + m * MSG) as u64);
                    // An error only where the receiver skipped and closed; it checks the bytes.
                    if c.write_all(&b).is_err() {
                        return;
                    }
                }
            })
        })
        .collect();
    let rt = runtime();
    rt.block_on(async move {
        let rx = Receiver::new(&RxConfig::with_mode(RxMode::BufRing)).unwrap();
        let why = format!("{:?}", rx.fallbacks());
        if !path_or_skip(test, rx.path().name().into(), "bufring", why) {
            go.wait();
            return;
        }
        let mut rx = AsyncReceiver::new(rx).unwrap();
        let mut conn_of = std::collections::HashMap::new();
        for (i, s) in servers.into_iter().enumerate() {
            conn_of.insert(rx.get_mut().add(s).unwrap(), i);
        }
        go.wait();
        let mut got = vec![0usize; CONNS];
        let mut closed = 0;
        let t0 = Instant::now();
        while closed < CONNS {
            match rx.next_event().await.unwrap() {
                zcio::rx::RxEvent::Data(chunk) => {
                    let i = conn_of[&chunk.conn()];
                    let off = (i * MSGS * MSG + got[i]) as u64;
                    assert_eq!(common::check_pattern(&chunk, off), Ok(()), "conn {i}");
                    got[i] += chunk.len();
                }
                zcio::rx::RxEvent::Closed(id, _) => {
                    let i = conn_of[&id];
                    assert_eq!(got[i], MSGS * MSG, "conn {i} closed early");
                    closed += 1;
                }
                zcio::rx::RxEvent::Accepted(_) => {}
            }
        }
        let st = rx.get_ref().stats();
        eprintln!("{:?} for {CONNS} x {MSGS} messages; {st:?}", t0.elapsed());
        assert_eq!(st.syscalls, st.ring_enters, "{st:?}");
    });
    for w in writers {
        w.join().unwrap();
    }
}

/// A reader that takes 64 KiB every millisecond: a send of 256 KiB into a 64 KiB socket
/// buffer completes well after the enter that submitted it, so its completion comes through
/// the readiness descriptor.
fn slow_reader(mut s: TcpStream, total: u64) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        let mut off = 0u64;
        while off < total {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "end of stream at {off} of {total}");
            assert_eq!(common::check_pattern(&buf[..n], off), Ok(()), "at {off}");
            off += n as u64;
            std::thread::sleep(Duration::from_millis(1));
        }
        off
    })
}

/// The ring's system calls are its enters, and the eventfd writes of calls that ended with
/// work left (completions that came while the call kept the eventfd quiet: a few, not one per
/// harvest). With a read per harvest (and the set's `epoll_wait` per `on_ready`) there were
/// 1.7 more per enter in these tests (834 against 312).
fn assert_not_more_than_enters(ring: &zcio::tx::SendRing) {
    let (st, enters) = (ring.stats(), ring.enters());
    eprintln!("{}; enters {enters}; {st:?}", ring.describe());
    let calls = st.send_syscalls + st.notify_syscalls;
    assert!(enters > 0, "{st:?}");
    assert!(
        calls >= enters && (calls - enters) * 20 <= enters,
        "{} system calls that are not enters, against {enters} enters: {st:?}",
        calls as i64 - enters as i64
    );
}

const SLOW_SENDS: usize = 40;
const SLOW_LEN: usize = 256 << 10;

/// A connected pair with small buffers whose peer is a [`slow_reader`] of every slow send.
fn slow_pair() -> (TcpStream, std::thread::JoinHandle<u64>) {
    let (c, s) = pair();
    common::streams::small_buffers(&c, libc::SO_SNDBUF);
    common::streams::small_buffers(&s, libc::SO_RCVBUF);
    (c, slow_reader(s, (SLOW_SENDS * SLOW_LEN) as u64))
}

/// The next slow send's buffer: the pattern at `*off`, which moves on.
fn slow_buf(pool: &Pool, off: &mut u64) -> zcio::buf::pool::PoolBuf {
    let mut b = pool.try_get().expect("every buffer came back");
    b.set_len(SLOW_LEN);
    common::fill_pattern(&mut b, *off);
    *off += SLOW_LEN as u64;
    b
}

/// The reader got every byte (unless the test skipped: `ran` false).
fn slow_reader_got_all(reader: std::thread::JoinHandle<u64>, ran: bool) {
    let got = reader.join().unwrap();
    if ran {
        assert_eq!(got, (SLOW_SENDS * SLOW_LEN) as u64);
    }
}

/// Each send of [`AsyncSendRing`] (a ring path) awaited while a slow reader drains the socket:
/// every completion comes through tokio's wait on the ring's readiness descriptor, and the
/// ring's system calls are its enters (and a few eventfd writes for work left). tokio watches the descriptor edge-triggered, so
/// a harvest neither reads the ring's eventfd back nor takes events off the set (which holds
/// no socket on the ring paths): those were two more system calls per harvest.
#[test]
fn async_send_ring_harvests_without_an_eventfd_read_per_harvest() {
    let _dog = watchdog();
    use zcio::stats::Report as _;
    use zcio::tokio::AsyncSendRing;
    use zcio::tx::{Pool, SendRing, SendRingConfig};
    let test = "async_send_ring_harvests_without_an_eventfd_read_per_harvest";
    let (c, reader) = slow_pair();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ok = rt.block_on(async move {
        let pool = Pool::new(SLOW_LEN, 4, false).unwrap();
        let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
        if !ring.has_uring() {
            return common::skip(test, &format!("no io_uring: {:?}", ring.fallbacks()));
        }
        let _ = ring.register_pool(&pool);
        let id = ring.add(c, &SenderConfig::new(TxMode::UringCopy)).unwrap();
        let mut tx = AsyncSendRing::new(ring).unwrap();
        let mut off = 0u64;
        for _ in 0..SLOW_SENDS {
            let b = slow_buf(&pool, &mut off);
            tx.send(id, b).await.map_err(|(e, _)| e).unwrap();
            let (done, _buf) = tx.next_completion().await.unwrap().expect("in flight");
            assert_eq!(done.result(), Ok(SLOW_LEN), "{done:?}");
        }
        assert_not_more_than_enters(tx.get_ref());
        true
    });
    slow_reader_got_all(reader, ok);
}

/// As above for an [`AsyncSender`] (a `Sender` has a send ring of its own).
#[test]
fn async_sender_harvests_without_an_eventfd_read_per_harvest() {
    let _dog = watchdog();
    let test = "async_sender_harvests_without_an_eventfd_read_per_harvest";
    let (c, reader) = slow_pair();
    let rt = runtime();
    let ok = rt.block_on(async move {
        let pool = Pool::new(SLOW_LEN, 4, false).unwrap();
        let tx = Sender::new(c, &pool, SenderConfig::new(TxMode::UringCopy)).unwrap();
        let (p, fb) = (tx.path().to_string(), format!("{:?}", tx.fallbacks()));
        if !path_or_skip(test, p, Path::UringCopy.name(), fb) {
            return false;
        }
        let mut tx = AsyncSender::new(tx).unwrap();
        let mut off = 0u64;
        for _ in 0..SLOW_SENDS {
            let (done, _buf) = tx.send(slow_buf(&pool, &mut off)).await.unwrap();
            assert_eq!(done.result(), Ok(SLOW_LEN), "{done:?}");
        }
        assert_not_more_than_enters(tx.get_ref().ring());
        true
    });
    slow_reader_got_all(reader, ok);
}

/// Many sockets on one [`AsyncSendRing`] whose descriptor is not read back per harvest, each
/// with more sends than its depth and a reader that drains in bursts: every send completes
/// and every byte arrives in order within the bound (no wake-up lost when a harvest or a
/// call's own enters leave work, which the ring signals itself).
#[test]
fn async_send_ring_loses_no_wake_up_with_many_sockets_under_backpressure() {
    let _dog = watchdog();
    use zcio::stats::Report as _;
    use zcio::tokio::AsyncSendRing;
    use zcio::tx::{Pool, SendRing, SendRingConfig};
    let test = "async_send_ring_loses_no_wake_up_with_many_sockets_under_backpressure";
    const SOCKS: usize = 16;
    const SENDS: usize = 64;
    const LEN: usize = 16 << 10;
    let mut readers = Vec::new();
    let mut conns = Vec::new();
    for i in 0..SOCKS {
        let (c, mut s) = pair();
        common::streams::small_buffers(&c, libc::SO_SNDBUF);
        conns.push(c);
        readers.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; 8 << 10];
            let mut off = 0u64;
            let base = (i * SENDS * LEN) as u64;
            loop {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    return off;
                }
                assert_eq!(common::check_pattern(&buf[..n], base + off), Ok(()), "{i}");
                off += n as u64;
                if off % (256 << 10) < n as u64 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ok = rt.block_on(async move {
        let pool = Pool::new(LEN, SOCKS * 4, false).unwrap();
        let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
        if !ring.has_uring() {
            return common::skip(test, &format!("no io_uring: {:?}", ring.fallbacks()));
        }
        let _ = ring.register_pool(&pool);
        let mut cfg = SenderConfig::new(TxMode::Auto);
        cfg.depth = 2;
        let ids: Vec<_> = conns
            .into_iter()
            .map(|c| ring.add(c, &cfg).unwrap())
            .collect();
        let mut tx = AsyncSendRing::new(ring).unwrap();
        let mut done = 0;
        let t0 = Instant::now();
        for k in 0..SENDS {
            for (i, &id) in ids.iter().enumerate() {
                let b = loop {
                    if let Some(b) = pool.try_get() {
                        break b;
                    }
                    let (c, _buf) = tx.next_completion().await.unwrap().expect("in flight");
                    assert_eq!(c.result(), Ok(LEN), "{c:?}");
                    done += 1;
                };
                let mut b = b;
                b.set_len(LEN);
                common::fill_pattern(&mut b, (i * SENDS * LEN + k * LEN) as u64);
                tx.send(id, b).await.map_err(|(e, _)| e).unwrap();
            }
        }
        while let Some((c, _buf)) = tx.next_completion().await.unwrap() {
            assert_eq!(c.result(), Ok(LEN), "{c:?}");
            done += 1;
        }
        assert_eq!(done, SOCKS * SENDS);
        for &id in &ids {
            tx.shutdown(id).await.unwrap();
        }
        let ring = tx.get_mut();
        eprintln!(
            "{:?}; {}; {:?}",
            t0.elapsed(),
            ring.describe(),
            ring.stats()
        );
        for id in ids {
            ring.close(id).unwrap();
        }
        true
    });
    for (i, r) in readers.into_iter().enumerate() {
        let got = r.join().unwrap();
        if ok {
            assert_eq!(got, (SENDS * LEN) as u64, "socket {i}");
        }
    }
}

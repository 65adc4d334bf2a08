//! `tx::SendRing` on real sockets: many sockets on one io_uring, each stream whole and in
//! order, sockets closed and added while sends are in flight, a peer that stops reading,
//! the memlock limit, and 10,000 connections in one unprivileged process.

mod common;

use common::streams::{connect_with_base, serve_checked};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcio::buf::pool::{Pool, PoolBuf};
use zcio::tx::{
    Completion, Path, Refusal, SendError, SendRing, SendRingConfig, SenderConfig, SockId, Ticket,
    TxBuf, TxError, TxMode,
};

fn base(i: usize) -> u64 {
    (i as u64) << 40
}

fn cfg(mode: TxMode, depth: usize) -> SenderConfig {
    let mut c = SenderConfig::new(mode);
    c.depth = depth;
    c
}

fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

/// A proxy's front: a receiver (buffer ring) listening on loopback, and a send ring on the same
/// io_uring; with the address it listens on.
fn proxy_front() -> (zcio::rx::Receiver, SendRing, SocketAddr) {
    use zcio::rx::{Receiver, RxConfig, RxMode};
    let front = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = front.local_addr().unwrap();
    let rx = Receiver::listen(front, &RxConfig::with_mode(RxMode::BufRing)).unwrap();
    let tx = SendRing::on_receiver(&rx, &SendRingConfig::default()).unwrap();
    assert!(
        tx.shares_receiver_ring(),
        "{:?}",
        zcio::stats::Report::fallbacks(&tx)
    );
    (rx, tx, addr)
}

/// Completions by ticket; a ticket seen twice fails the test.
#[derive(Default)]
struct Book {
    done: HashMap<Ticket, Completion>,
}

impl Book {
    fn take(&mut self, ring: &mut SendRing) {
        for (c, buf) in ring.completions() {
            assert_eq!(c.len, buf.len(), "{c:?} came back with another length");
            let t = c.ticket;
            assert!(self.done.insert(t, c).is_none(), "{t:?} completed twice");
        }
    }
}

/// A pool buffer, waiting on the ring while every buffer is out.
fn get(pool: &Pool, ring: &mut SendRing, book: &mut Book) -> PoolBuf {
    loop {
        if let Some(b) = pool.try_get() {
            return b;
        }
        ring.wait(Duration::from_millis(100)).unwrap();
        book.take(ring);
    }
}

#[test]
fn many_sockets_of_every_path_share_one_ring_and_every_stream_arrives_whole() {
    let conns = 160;
    let rounds = 24;
    let (l, addr) = listener();
    let server = serve_checked(l, conns, Arc::new(AtomicBool::new(false)));
    let pool = Pool::new(16 << 10, 256, false).unwrap();
    let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
    ring.register_pool(&pool).unwrap();
    let modes = [
        TxMode::UringZcFixed,
        TxMode::Auto,
        TxMode::UringCopy,
        TxMode::MsgZc,
    ];
    let socks: Vec<SockId> = (0..conns)
        .map(|i| {
            let s = connect_with_base(addr, base(i));
            ring.add(s, &cfg(modes[i % 4], 4)).unwrap()
        })
        .collect();
    for (i, &s) in socks.iter().enumerate() {
        assert!(
            ring.sock_fallbacks(s).is_empty(),
            "socket {i}: {:?}",
            ring.sock_fallbacks(s)
        );
        let want = match modes[i % 4] {
            TxMode::MsgZc => Path::MsgZc,
            TxMode::UringCopy => Path::UringCopy,
            _ => Path::UringZcFixed,
        };
        assert_eq!(ring.sock_path(s), Some(want), "socket {i}");
    }
    let mut book = Book::default();
    let mut sent: Vec<u64> = vec![0; conns];
    let mut tickets: HashMap<Ticket, usize> = HashMap::new();
    let mut held: Vec<Option<TxBuf>> = (0..conns).map(|_| None).collect();
    let mut left: Vec<usize> = vec![rounds; conns];
    let mut refusals = 0;
    let mut last_refusal: Vec<Option<Refusal>> = vec![None; conns];
    let mut progress = Instant::now();
    while left.iter().any(|&n| n > 0) {
        let stuck = progress.elapsed();
        if stuck > common::scaled(Duration::from_secs(10)) {
            let per: Vec<_> = (0..conns)
                .filter(|&i| left[i] > 0)
                .map(|i| {
                    let s = socks[i];
                    (
                        i,
                        last_refusal[i],
                        ring.sock_path(s),
                        ring.sock_in_flight(s),
                        ring.sock_stats(s),
                    )
                })
                .collect();
            panic!(
                "no send taken and none completed for {stuck:?}: ring {:?}, in flight {}, \
                 sockets with sends left {per:?}",
                ring.ring_stats(),
                ring.in_flight()
            );
        }
        for i in 0..conns {
            if left[i] == 0 {
                continue;
            }
            let buf = match held[i].take() {
                Some(b) => b,
                None => {
                    let mut b = get(&pool, &mut ring, &mut book);
                    let len = 1 + (i * 7919 + left[i] * 104_729) % (16 << 10);
                    b.set_len(len);
                    common::fill_pattern(&mut b, base(i) + sent[i]);
                    TxBuf::Pool(b)
                }
            };
            let len = buf.len() as u64;
            match ring.send(socks[i], buf) {
                Ok(t) => {
                    tickets.insert(t, i);
                    sent[i] += len;
                    left[i] -= 1;
                    progress = Instant::now();
                }
                Err(r) => {
                    assert!(r.reason.is_backpressure(), "{r}");
                    refusals += 1;
                    last_refusal[i] = Some(r.reason);
                    held[i] = Some(r.buf);
                }
            }
        }
        // Never waits: `poll` alone must see every completion (notifications of zero-copy
        // sends are deferred task work that only an enter of this thread posts).
        ring.poll().unwrap();
        let before = book.done.len();
        book.take(&mut ring);
        if book.done.len() > before {
            progress = Instant::now();
        }
        while ring.next_writable().is_some() {}
    }
    ring.flush(common::scaled(Duration::from_secs(30))).unwrap();
    book.take(&mut ring);
    assert_eq!(book.done.len(), tickets.len());
    for (t, c) in &book.done {
        let i = tickets[t];
        assert_eq!(c.sock, socks[i], "{c:?}");
        assert_eq!(c.result(), Ok(c.len), "socket {i}: {c:?}");
    }
    assert_eq!(pool.available(), pool.count(), "a buffer was not returned");
    let sends = tickets.len() as u64;
    let enters = ring.enters();
    eprintln!("{sends} sends, {refusals} refusals, {enters} io_uring_enter calls");
    // Requests of many sockets share each kernel entry.
    assert!(enters * 4 < sends, "{enters} enters for {sends} sends");
    let rs = ring.ring_stats().unwrap();
    assert_eq!(rs.unregistered_files, 0, "{rs:?}");
    assert_eq!(rs.returned_late, 0, "{rs:?}");
    for &s in &socks {
        ring.close(s).unwrap();
    }
    drop(ring);
    let got = server.join().unwrap();
    for (i, (b, n)) in got.iter().enumerate() {
        assert_eq!(*b, base(i));
        assert_eq!(*n, sent[i], "stream {i}");
    }
}

/// Sends `n` buffers of 64 KiB on `id` (each completed before the next goes, so every
/// completion is seen before the next decision), the pattern from `base` on.
fn send_completed(
    ring: &mut SendRing,
    pool: &Pool,
    book: &mut Book,
    id: SockId,
    n: usize,
    base: u64,
    sent: &mut u64,
) {
    for _ in 0..n {
        let mut b = get(pool, ring, book);
        common::fill_pattern(&mut b, base + *sent);
        let len = b.len() as u64;
        ring.send(id, b).unwrap();
        *sent += len;
        ring.flush(common::scaled(Duration::from_secs(10))).unwrap();
        book.take(ring);
    }
}

fn zero_copy_sends(st: &zcio::tx::TxStats) -> u64 {
    [Path::MsgZc, Path::UringZc, Path::UringZcFixed]
        .iter()
        .map(|p| st.sends_by_path[p.index()])
        .sum()
}

#[test]
fn auto_keeps_the_copied_verdict_per_route_so_later_sockets_to_that_peer_make_no_probe() {
    // Sizes zero-copy would take (64 KiB): only the COPIED verdict sends them by copy. On
    // loopback every zero-copy completion says COPIED.
    let (l1, a1) = listener();
    let l2 = match TcpListener::bind("127.0.0.2:0") {
        Ok(l) => l,
        Err(e) => panic!("127.0.0.2 (loopback, another route key) cannot be bound: {e}"),
    };
    let a2 = l2.local_addr().unwrap();
    let s1 = serve_checked(l1, 4, Arc::new(AtomicBool::new(false)));
    let s2 = serve_checked(l2, 1, Arc::new(AtomicBool::new(false)));
    let pool = Pool::new(64 << 10, 8, false).unwrap();
    let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
    ring.register_pool(&pool).unwrap();
    let mut c = cfg(TxMode::Auto, 4);
    c.reprobe_every = 1 << 20;
    let mut book = Book::default();
    let mut sent = [0u64; 5];
    // The server reads once all its connections are there: connect them now, add later.
    let mut conns: Vec<_> = (0..3).map(|i| connect_with_base(a1, base(i))).collect();
    let last = connect_with_base(a1, base(4));
    // The first socket to 127.0.0.1 probes zero-copy and finds it copied.
    let first = ring.add(conns.remove(0), &c).unwrap();
    assert!(ring.sock_path(first).unwrap().is_zero_copy());
    send_completed(&mut ring, &pool, &mut book, first, 8, base(0), &mut sent[0]);
    let st = ring.sock_stats(first);
    assert_eq!(st.auto_switches_to_copy, 1, "{st:?}");
    assert!(zero_copy_sends(&st) >= 4, "{st:?}");
    assert_eq!(ring.sock_path(first), Some(Path::UringCopy));
    // Later sockets to the same peer take the route's verdict: not one zero-copy send.
    let later: Vec<SockId> = conns
        .into_iter()
        .map(|s| ring.add(s, &c).unwrap())
        .collect();
    for (k, &id) in later.iter().enumerate() {
        let i = k + 1;
        send_completed(&mut ring, &pool, &mut book, id, 8, base(i), &mut sent[i]);
        let st = ring.sock_stats(id);
        assert_eq!(
            zero_copy_sends(&st),
            0,
            "socket {i} probed zero-copy: {st:?}"
        );
        assert_eq!(st.auto_reprobes, 0, "{st:?}");
        assert_eq!(st.auto_switches_to_copy, 0, "{st:?}");
        assert_eq!(st.auto_route_verdicts, 1, "{st:?}");
        assert_eq!(st.sends_by_path[Path::UringCopy.index()], 8, "{st:?}");
        assert_eq!(ring.sock_path(id), Some(Path::UringCopy));
        let f = ring.sock_fallbacks(id);
        assert!(
            f.iter()
                .any(|f| f.reason.contains("127.0.0.1") && f.reason.contains("no probe")),
            "{f:?}"
        );
    }
    // Another peer address is another route: it learns on its own.
    let other = ring.add(connect_with_base(a2, base(3)), &c).unwrap();
    send_completed(&mut ring, &pool, &mut book, other, 8, base(3), &mut sent[3]);
    let st = ring.sock_stats(other);
    assert!(zero_copy_sends(&st) >= 4, "{st:?}");
    assert_eq!(st.auto_switches_to_copy, 1, "{st:?}");
    assert_eq!(st.auto_route_verdicts, 0, "{st:?}");
    // The ring's totals: one switch per route.
    assert_eq!(ring.stats().auto_switches_to_copy, 2, "{:?}", ring.stats());
    // The verdict goes with the route's last socket: a socket to 127.0.0.1 after all others
    // closed learns again.
    for id in [first, later[0], later[1]] {
        ring.close(id).unwrap();
    }
    let again = ring.add(last, &c).unwrap();
    send_completed(&mut ring, &pool, &mut book, again, 8, base(4), &mut sent[4]);
    let st = ring.sock_stats(again);
    assert!(zero_copy_sends(&st) >= 4, "{st:?}");
    assert_eq!(st.auto_route_verdicts, 0, "{st:?}");
    for id in [again, other] {
        ring.close(id).unwrap();
    }
    drop(ring);
    assert_eq!(pool.available(), pool.count(), "a buffer was not returned");
    let got1 = s1.join().unwrap();
    let want: Vec<(u64, u64)> = [0, 1, 2, 4].iter().map(|&i| (base(i), sent[i])).collect();
    assert_eq!(got1, want);
    assert_eq!(s2.join().unwrap(), vec![(base(3), sent[3])]);
}

#[test]
fn auto_re_probes_a_route_once_per_interval_whichever_socket_sends() {
    // Ten sockets to one peer, round-robin: the route re-probes every `reprobe_every` of its
    // sends (doubling while it stays copied), not every `reprobe_every` sends of each socket.
    let conns = 10;
    let (l, a) = listener();
    let server = serve_checked(l, conns, Arc::new(AtomicBool::new(false)));
    let pool = Pool::new(64 << 10, 16, false).unwrap();
    let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
    ring.register_pool(&pool).unwrap();
    let mut c = cfg(TxMode::Auto, 4);
    c.reprobe_every = 20;
    let socks: Vec<SockId> = (0..conns)
        .map(|i| ring.add(connect_with_base(a, base(i)), &c).unwrap())
        .collect();
    let mut book = Book::default();
    let mut sent = vec![0u64; conns];
    let rounds = 30;
    for _ in 0..rounds {
        for (i, &id) in socks.iter().enumerate() {
            send_completed(&mut ring, &pool, &mut book, id, 1, base(i), &mut sent[i]);
        }
    }
    let st = ring.stats();
    // 300 sends: after the switch (about 4 sends), probes at 20, 40, 80, 160 copy sends apart:
    // 3 or 4 for the route. Per socket (30 sends each) it would have been one per socket.
    assert_eq!(st.auto_switches_to_copy, 1, "{st:?}");
    assert!(
        (2..=5).contains(&st.auto_reprobes),
        "re-probes {} for one route: {st:?}",
        st.auto_reprobes
    );
    let probing = socks
        .iter()
        .filter(|&&id| ring.sock_stats(id).auto_reprobes > 0)
        .count();
    assert!(probing < conns, "{probing} sockets probed");
    for &id in &socks {
        ring.close(id).unwrap();
    }
    drop(ring);
    assert_eq!(pool.available(), pool.count(), "a buffer was not returned");
    for (i, (b, n)) in server.join().unwrap().iter().enumerate() {
        assert_eq!((*b, *n), (base(i), sent[i]), "stream {i}");
    }
}

/// Small socket buffers on both ends, so sends stay in the kernel while the peer does not
/// read.
fn small_buffers_listener() -> (TcpListener, SocketAddr) {
    let (l, a) = listener();
    common::streams::small_buffers(&l, libc::SO_RCVBUF);
    (l, a)
}

fn stalled_socket(addr: SocketAddr, i: usize) -> std::net::TcpStream {
    let s = connect_with_base(addr, base(i));
    common::streams::small_buffers(&s, libc::SO_SNDBUF);
    s
}

#[test]
fn sockets_closed_with_sends_in_flight_return_every_buffer_once_and_leave_the_others_alone() {
    for mode in [TxMode::UringZcFixed, TxMode::UringCopy, TxMode::MsgZc] {
        let (l, addr) = small_buffers_listener();
        let pause = Arc::new(AtomicBool::new(true));
        let server = serve_checked(l, 12, pause.clone());
        let pool = Pool::new(64 << 10, 96, false).unwrap();
        let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
        ring.register_pool(&pool).unwrap();
        let mut socks: Vec<SockId> = (0..8)
            .map(|i| ring.add(stalled_socket(addr, i), &cfg(mode, 8)).unwrap())
            .collect();
        let mut book = Book::default();
        let mut sent = vec![0u64; 12];
        let mut owner: HashMap<Ticket, usize> = HashMap::new();
        let send_some = |ring: &mut SendRing,
                         book: &mut Book,
                         sent: &mut Vec<u64>,
                         owner: &mut HashMap<Ticket, usize>,
                         i: usize,
                         sock: SockId,
                         n: usize| {
            for _ in 0..n {
                let mut b = get(&pool, ring, book);
                common::fill_pattern(&mut b, base(i) + sent[i]);
                match ring.send(sock, b) {
                    Ok(t) => {
                        owner.insert(t, i);
                        sent[i] += 64 << 10;
                    }
                    // The peer does not read: the socket is full; that is all we wanted.
                    Err(r) => {
                        assert!(r.reason.is_backpressure(), "{mode}: {r}");
                        break;
                    }
                }
            }
            ring.submit().unwrap();
        };
        for (i, &s) in socks.clone().iter().enumerate() {
            send_some(&mut ring, &mut book, &mut sent, &mut owner, i, s, 8);
        }
        for _ in 0..5 {
            ring.wait(Duration::from_millis(20)).unwrap();
        }
        book.take(&mut ring);
        assert!(
            ring.in_flight() > 0,
            "{mode}: everything went out to a peer that reads nothing"
        );
        // Close half of them with their sends in flight.
        let closed: Vec<SockId> = socks.drain(..4).collect();
        for &s in &closed {
            ring.close(s).unwrap();
        }
        // Sockets added now may take the freed slots; the closed ids stay refused.
        for i in 8..12 {
            let s = ring.add(stalled_socket(addr, i), &cfg(mode, 8)).unwrap();
            assert!(!closed.contains(&s), "{mode}: a closed id was reused");
            socks.push(s);
        }
        let b = pool.try_get().expect("a free buffer");
        match ring.send(closed[0], b) {
            Err(r) => assert_eq!(r.reason, Refusal::Closed, "{mode}"),
            Ok(t) => panic!("{mode}: a closed socket took send {t:?}"),
        }
        for (k, &s) in socks.clone().iter().enumerate() {
            let i = k + 4; // streams 4..8, then the new 8..12
            send_some(&mut ring, &mut book, &mut sent, &mut owner, i, s, 4);
        }
        // The closed sockets' sends all come back, though the peer still reads nothing.
        let end = Instant::now() + common::scaled(Duration::from_secs(20));
        loop {
            ring.wait(Duration::from_millis(50)).unwrap();
            book.take(&mut ring);
            let closed_left = owner
                .iter()
                .filter(|(t, &i)| i < 4 && !book.done.contains_key(t))
                .count();
            if closed_left == 0 {
                break;
            }
            assert!(
                Instant::now() < end,
                "{mode}: {closed_left} sends of closed sockets never came back"
            );
        }
        for (t, c) in &book.done {
            if owner[t] < 4 && c.bytes < c.len {
                assert_eq!(c.error, Some(SendError::Closed), "{mode}: {c:?}");
            }
        }
        pause.store(false, Ordering::Relaxed);
        if let Err(e) = ring.flush(common::scaled(Duration::from_secs(30))) {
            let per: Vec<_> = socks
                .iter()
                .map(|&s| (ring.sock_in_flight(s), ring.sock_stats(s)))
                .collect();
            panic!(
                "{mode}: {e:?}; ring {:?}; per socket {per:?}",
                ring.ring_stats()
            );
        }
        book.take(&mut ring);
        assert_eq!(
            book.done.len(),
            owner.len(),
            "{mode}: every send completes once"
        );
        for (t, c) in &book.done {
            if owner[t] >= 4 {
                assert_eq!(c.result(), Ok(c.len), "{mode}: {c:?}");
            }
        }
        assert_eq!(
            pool.available(),
            pool.count(),
            "{mode}: a buffer was not returned"
        );
        // What each stream's completions say went, and the ring's counters.
        let mut said = [0u64; 12];
        for (t, c) in &book.done {
            said[owner[t]] += c.bytes as u64;
        }
        for &s in &socks {
            ring.close(s).unwrap();
        }
        let total = ring.counters_total();
        let st = ring.stats();
        drop(ring);
        let got = server.join().unwrap();
        for (k, (b, n)) in got.iter().enumerate() {
            assert_eq!(*b, base(k));
            if k < 4 {
                // A prefix of the stream (checked in order by the server), then a reset: the
                // completions claim no byte the peer did not get, and miss at most what was
                // sent unacknowledged when the reset came.
                assert!(*n <= sent[k], "{mode}: stream {k}");
                assert!(
                    said[k] <= *n && *n <= said[k] + st.reset_unacked_bytes,
                    "{mode}: stream {k} closed with sends in flight: the completions say \
                     {} bytes went, the peer received {n} ({st:?})",
                    said[k]
                );
            } else {
                assert_eq!(*n, sent[k], "{mode}: stream {k}");
            }
        }
        let received: u64 = got.iter().map(|(_, n)| n).sum();
        assert!(
            total.bytes <= received && received <= total.bytes + st.reset_unacked_bytes,
            "{mode}: the ring's bytes {}, received {received} ({st:?})",
            total.bytes
        );
        // No purged byte counts as sent, with or without a copy. Loopback copies every byte
        // it delivers, and 6.12+ reports it so; Debian's 6.1 reports some as zero-copy.
        assert!(
            total.zerocopy_bytes + total.copied_bytes <= received,
            "{mode}: zero-copy {} + copied {} bytes, {received} received",
            total.zerocopy_bytes,
            total.copied_bytes
        );
        let rel = zcio::sys::kernel_release();
        let mut v = rel
            .split(|c: char| !c.is_ascii_digit())
            .map(|x| x.parse::<u32>());
        if let (Some(Ok(major)), Some(Ok(minor))) = (v.next(), v.next()) {
            if (major, minor) >= (6, 12) {
                assert_eq!(
                    total.zerocopy_bytes, 0,
                    "{mode}: zero-copy bytes on loopback"
                );
            }
        }
    }
}

#[test]
fn a_peer_that_stops_reading_is_backpressure_never_a_wait_and_loses_nothing() {
    for mode in [TxMode::UringZcFixed, TxMode::Copy, TxMode::MsgZc] {
        let (slow_l, slow_addr) = small_buffers_listener();
        let (fast_l, fast_addr) = listener();
        let pause = Arc::new(AtomicBool::new(true));
        let slow_srv = serve_checked(slow_l, 1, pause.clone());
        let fast_srv = serve_checked(fast_l, 1, Arc::new(AtomicBool::new(false)));
        let pool = Pool::new(32 << 10, 64, false).unwrap();
        let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
        ring.register_pool(&pool).unwrap();
        let slow = ring
            .add(stalled_socket(slow_addr, 0), &cfg(mode, 8))
            .unwrap();
        let fast = ring
            .add(connect_with_base(fast_addr, base(0)), &cfg(mode, 8))
            .unwrap();
        let mut book = Book::default();
        let (mut slow_sent, mut fast_sent) = (0u64, 0u64);
        let mut held = None;
        let mut slowest = Duration::ZERO;
        // Until the slow socket refuses: every call returns at once.
        for _ in 0..10_000 {
            let mut b = get(&pool, &mut ring, &mut book);
            common::fill_pattern(&mut b, base(0) + slow_sent);
            let t0 = Instant::now();
            let r = ring.send(slow, b);
            slowest = slowest.max(t0.elapsed());
            ring.submit().unwrap();
            match r {
                Ok(_) => slow_sent += 32 << 10,
                Err(r) => {
                    assert!(
                        matches!(
                            r.reason,
                            Refusal::Depth | Refusal::SocketFull | Refusal::NoRoom
                        ),
                        "{mode}: {r}"
                    );
                    held = Some(r.buf);
                    break;
                }
            }
            book.take(&mut ring);
        }
        let held =
            held.unwrap_or_else(|| panic!("{mode}: a peer that reads nothing never pushed back"));
        assert!(
            slowest < common::scaled(Duration::from_millis(200)),
            "{mode}: a send waited {slowest:?}"
        );
        // The other socket of the ring goes on meanwhile.
        let mut fast_refusals = 0;
        for _ in 0..32 {
            let mut b = get(&pool, &mut ring, &mut book);
            common::fill_pattern(&mut b, base(0) + fast_sent);
            loop {
                match ring.send(fast, b) {
                    Ok(_) => break,
                    Err(r) => {
                        fast_refusals += 1;
                        b = r.buf.into_pool().unwrap();
                        ring.wait(Duration::from_millis(50)).unwrap();
                        book.take(&mut ring);
                    }
                }
            }
            fast_sent += 32 << 10;
        }
        // The kernel may have made room meanwhile (the peer's window opening on a timer, as
        // under emulation): then the slow socket is named writable already, and only once.
        let mut writable = false;
        let mut fast_named = 0;
        while let Some(s) = ring.next_writable() {
            if s == slow {
                assert!(ring.can_send(slow), "{mode}: named writable but refuses");
                writable = true;
            }
            fast_named += usize::from(s == fast);
        }
        // A socket is queued once until it is taken, however often it was refused and became
        // writable again (a caller that never asks must not grow the queue).
        assert!(
            fast_named <= 1,
            "{mode}: the fast socket, refused {fast_refusals} times, was named {fast_named} times"
        );
        // The peer reads again: the slow socket is reported writable, the kept buffer goes.
        pause.store(false, Ordering::Relaxed);
        let end = Instant::now() + common::scaled(Duration::from_secs(20));
        while !writable {
            ring.wait(Duration::from_millis(50)).unwrap();
            book.take(&mut ring);
            while let Some(s) = ring.next_writable() {
                writable |= s == slow;
            }
            if writable {
                break;
            }
            assert!(
                Instant::now() < end,
                "{mode}: the slow socket was never writable again"
            );
        }
        ring.send(slow, held)
            .expect("writable means a send is taken");
        slow_sent += 32 << 10;
        ring.flush(common::scaled(Duration::from_secs(30))).unwrap();
        book.take(&mut ring);
        assert!(
            book.done.values().all(|c| c.result() == Ok(c.len)),
            "{mode}"
        );
        assert_eq!(pool.available(), pool.count(), "{mode}");
        ring.close(slow).unwrap();
        ring.close(fast).unwrap();
        drop(ring);
        assert_eq!(
            slow_srv.join().unwrap()[0].1,
            slow_sent,
            "{mode}: slow stream"
        );
        assert_eq!(
            fast_srv.join().unwrap()[0].1,
            fast_sent,
            "{mode}: fast stream"
        );
    }
}

#[test]
fn abandoned_sockets_give_their_buffers_back_once_the_kernel_is_done_without_completions() {
    let (l, addr) = small_buffers_listener();
    let pause = Arc::new(AtomicBool::new(true));
    let server = serve_checked(l, 2, pause.clone());
    let pool = Pool::new(64 << 10, 16, false).unwrap();
    let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
    ring.register_pool(&pool).unwrap();
    let a = ring
        .add(stalled_socket(addr, 0), &cfg(TxMode::UringZcFixed, 8))
        .unwrap();
    let b = ring
        .add(stalled_socket(addr, 1), &cfg(TxMode::UringZcFixed, 8))
        .unwrap();
    let mut sent = 0u64;
    for _ in 0..8 {
        let mut buf = pool.try_get().unwrap();
        common::fill_pattern(&mut buf, base(0) + sent);
        if ring.send(a, buf).is_err() {
            break;
        }
        sent += 64 << 10;
    }
    ring.submit().unwrap();
    for _ in 0..4 {
        ring.wait(Duration::from_millis(20)).unwrap();
    }
    assert!(ring.sock_in_flight(a) > 0);
    ring.abandon(a);
    assert_eq!(ring.sock_in_flight(a), 0, "the socket is gone at once");
    let end = Instant::now() + common::scaled(Duration::from_secs(20));
    while pool.available() < pool.count() {
        ring.wait(Duration::from_millis(50)).unwrap();
        assert!(
            ring.next_completion().is_none(),
            "an abandoned socket's send completed"
        );
        assert!(
            Instant::now() < end,
            "the kernel never let go of the buffers"
        );
    }
    let rs = ring.ring_stats().unwrap();
    assert!(rs.ignored > 0, "{rs:?}");
    pause.store(false, Ordering::Relaxed);
    ring.close(b).unwrap();
    drop(ring);
    let got = server.join().unwrap();
    // What reached the peer before the reset is a prefix of the stream (checked in order).
    assert!(got[0].1 <= sent, "{got:?}");
    assert_eq!(got[1].1, 0);
}

#[test]
fn memlock_limit_reached_by_the_pool_is_a_recorded_fallback_and_sends_go_on() {
    let test = "memlock_limit_reached_by_the_pool_is_a_recorded_fallback_and_sends_go_on";
    let Ok((Some(limit), _)) = zcio::sys::getrlimit(libc::RLIMIT_MEMLOCK) else {
        common::skip(test, "RLIMIT_MEMLOCK is unlimited here");
        return;
    };
    let (l, addr) = listener();
    let server = serve_checked(l, 1, Arc::new(AtomicBool::new(false)));
    let res = std::thread::spawn(move || {
        // Without CAP_IPC_LOCK registered buffers are charged to RLIMIT_MEMLOCK.
        zcio_testnet::caps::drop_effective_in_this_thread(zcio_testnet::caps::CAP_IPC_LOCK)
            .unwrap();
        let slot = 1 << 20;
        let count = (limit as usize / slot + 2).min(4096);
        let pool = Pool::new(slot, count, false).unwrap();
        let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
        let err = ring
            .register_pool(&pool)
            .expect_err("a pool above the limit");
        let s = ring
            .add(
                connect_with_base(addr, base(0)),
                &cfg(TxMode::UringZcFixed, 8),
            )
            .unwrap();
        let path = ring.sock_path(s);
        let fb = ring.sock_fallbacks(s).to_vec();
        let ring_fb = zcio::stats::Report::fallbacks(&ring).to_vec();
        let mut sent = 0u64;
        for _ in 0..8 {
            let mut b = pool.try_get().unwrap();
            b.set_len(64 << 10);
            common::fill_pattern(&mut b, base(0) + sent);
            sent += 64 << 10;
            ring.send(s, b).unwrap();
        }
        ring.flush(common::scaled(Duration::from_secs(20))).unwrap();
        let ok = ring.completions().all(|(c, _)| c.result() == Ok(64 << 10));
        ring.close(s).unwrap();
        (err, path, fb, ring_fb, ok, sent)
    })
    .join()
    .unwrap();
    let (err, path, fb, ring_fb, ok, sent) = res;
    assert!(matches!(&err, TxError::Register { .. }), "{err}");
    assert_eq!(err.errno(), libc::ENOMEM, "{err}");
    assert_eq!(path, Some(Path::UringZc));
    assert_eq!(fb.len(), 1, "{fb:?}");
    assert_eq!(fb[0].from, Path::UringZcFixed.into());
    assert!(fb[0].reason.contains("RLIMIT_MEMLOCK"), "{}", fb[0]);
    assert!(
        ring_fb.iter().any(|f| f.reason.contains("RLIMIT_MEMLOCK")),
        "{ring_fb:?}"
    );
    assert!(ok);
    assert_eq!(server.join().unwrap()[0].1, sent);
}

/// On a socket whose path is `uring-zc-fixed`, a buffer outside the registered pools (a
/// `TxBuf::Vec`) goes zero-copy with its pages pinned per send: its completion says `uring-zc`
/// (it said `uring-zc-fixed` before), and a pool buffer's says `uring-zc-fixed`.
#[test]
fn a_buffer_outside_the_registered_pools_reports_the_path_it_took() {
    let test = "a_buffer_outside_the_registered_pools_reports_the_path_it_took";
    let (l, addr) = listener();
    let server = serve_checked(l, 1, Arc::new(AtomicBool::new(false)));
    let pool = Pool::new(64 << 10, 4, false).unwrap();
    let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
    ring.register_pool(&pool).unwrap();
    let s = ring
        .add(
            connect_with_base(addr, base(0)),
            &cfg(TxMode::UringZcFixed, 8),
        )
        .unwrap();
    if ring.sock_path(s) != Some(Path::UringZcFixed) {
        let why = format!("no fixed-buffer path: {:?}", ring.sock_fallbacks(s));
        common::skip(test, &why);
        ring.close(s).unwrap();
        return;
    }
    let mut b = pool.try_get().unwrap();
    b.set_len(16 << 10);
    common::fill_pattern(&mut b, base(0));
    let fixed = ring.send(s, b).unwrap();
    let mut v = vec![0u8; 16 << 10];
    common::fill_pattern(&mut v, base(0) + (16 << 10));
    let pinned = ring.send(s, TxBuf::Vec(v)).unwrap();
    ring.flush(common::scaled(Duration::from_secs(20))).unwrap();
    let mut paths = HashMap::new();
    for (c, _) in ring.completions() {
        assert_eq!(c.result(), Ok(16 << 10), "{c:?}");
        paths.insert(c.ticket, c.path);
    }
    let by = ring.sock_stats(s).sends_by_path;
    ring.close(s).unwrap();
    drop(ring);
    assert_eq!(paths.get(&fixed), Some(&Path::UringZcFixed), "{paths:?}");
    assert_eq!(paths.get(&pinned), Some(&Path::UringZc), "{paths:?}");
    assert_eq!(by[Path::UringZc.index()], 1, "{by:?}");
    assert_eq!(by[Path::UringZcFixed.index()], 1, "{by:?}");
    assert_eq!(server.join().unwrap()[0].1, 32 << 10);
}

// ---- 10,000 connections in one unprivileged process ----

const SCALE_CONNS: usize = 10_000;
const SCALE_ENV: &str = "ZCIO_SEND_RING_SCALE_CHILD";

/// 10,000 connections; fewer (2,000) in the software-emulated guests of `scripts/vmtest`
/// (`ZCIO_TIME_SCALE` > 1), where the point is the behaviour, not the size.
fn scale_conns() -> usize {
    let scaled = std::env::var("ZCIO_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .is_some_and(|k| k > 1);
    if scaled {
        2_000
    } else {
        SCALE_CONNS
    }
}

/// Raises this process's `RLIMIT_NOFILE` towards `want` (root may raise the hard limit too;
/// the child inherits it); returns the soft limit now.
fn raise_nofile(want: u64) -> u64 {
    let (soft, hard) = zcio::sys::getrlimit(libc::RLIMIT_NOFILE).unwrap();
    let (soft, hard) = (soft.unwrap_or(u64::MAX), hard.unwrap_or(u64::MAX));
    if soft >= want {
        return soft;
    }
    let hard = if hard < want && zcio_testnet::is_root() {
        want
    } else {
        hard
    };
    let l = libc::rlimit {
        rlim_cur: want.min(hard),
        rlim_max: hard,
    };
    // SAFETY: `l` lives for the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } == 0 {
        want.min(hard)
    } else {
        soft
    }
}

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// The child side (run by the test below in a process of its own, as an unprivileged user
/// under the default 8 MiB `RLIMIT_MEMLOCK`): connects, adds every socket to one ring with
/// fixed buffers, sends 4 KiB on each, prints what it measured.
#[test]
fn scale_child() {
    let Ok(addr) = std::env::var(SCALE_ENV) else {
        return; // only in the child
    };
    let addr: SocketAddr = addr.parse().unwrap();
    let conns: usize = std::env::var("ZCIO_SCALE_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SCALE_CONNS);
    let (soft, hard) = zcio::sys::getrlimit(libc::RLIMIT_NOFILE).unwrap();
    let want = (conns as u64 + 256).min(hard.unwrap_or(u64::MAX));
    if soft.is_some_and(|s| s < want) {
        let l = libc::rlimit {
            rlim_cur: want,
            rlim_max: hard.unwrap_or(libc::RLIM_INFINITY),
        };
        // SAFETY: `l` lives for the call.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) }, 0);
    }
    // SAFETY: no arguments.
    let uid = unsafe { libc::geteuid() };
    let memlock = zcio::sys::getrlimit(libc::RLIMIT_MEMLOCK).unwrap().0;
    let caps = zcio::sys::effective_caps();
    // The sockets first: their memory is the kernel's and the std wrappers'.
    let socks: Vec<std::net::TcpStream> = (0..conns)
        .map(|i| connect_with_base(addr, base(i)))
        .collect();
    let pool = Pool::new(4 << 10, 1024, false).unwrap();
    let mut ring = SendRing::new(&SendRingConfig {
        files: conns as u32 + 64,
        ..SendRingConfig::default()
    })
    .unwrap();
    let reg = ring.register_pool(&pool).err().map(|e| e.to_string());
    let rss0 = status_kib("VmRSS:");
    let fds0 = open_fds();
    let ids: Vec<SockId> = socks
        .into_iter()
        .map(|s| ring.add(s, &cfg(TxMode::UringZcFixed, 2)).unwrap())
        .collect();
    let rss_added = status_kib("VmRSS:");
    let fds_added = open_fds();
    let mut done = 0;
    let mut paths: HashMap<String, usize> = HashMap::new();
    let mut fallbacks = 0;
    for (i, &id) in ids.iter().enumerate() {
        fallbacks += ring.sock_fallbacks(id).len();
        let mut b = loop {
            if let Some(b) = pool.try_get() {
                break b;
            }
            ring.wait(Duration::from_millis(100)).unwrap();
            for (c, _) in ring.completions() {
                assert_eq!(c.result(), Ok(4 << 10), "{c:?}");
                *paths.entry(c.path.to_string()).or_default() += 1;
                done += 1;
            }
        };
        common::fill_pattern(&mut b, base(i));
        ring.send(id, b).unwrap();
    }
    ring.flush(common::scaled(Duration::from_secs(60))).unwrap();
    for (c, _) in ring.completions() {
        assert_eq!(c.result(), Ok(4 << 10), "{c:?}");
        *paths.entry(c.path.to_string()).or_default() += 1;
        done += 1;
    }
    let rss1 = status_kib("VmRSS:");
    let fds1 = open_fds();
    let enters = ring.enters();
    let rs = ring.ring_stats().unwrap();
    println!(
        "SCALE {}",
        serde_json::json!({
            "uid": uid,
            "memlock": memlock,
            "caps": caps,
            "register": reg,
            "conns": conns,
            "done": done,
            "paths": paths,
            "fallbacks": fallbacks,
            "unregistered_files": rs.unregistered_files,
            "rss_kib_per_conn": (rss1.saturating_sub(rss0)) as f64 / conns as f64,
            "rss_kib_per_conn_added": (rss_added.saturating_sub(rss0)) as f64 / conns as f64,
            "fds_before": fds0,
            "fds_after_add": fds_added,
            "fds_after": fds1,
            "enters": enters,
        })
    );
    for id in ids {
        ring.close(id).unwrap();
    }
}

#[test]
fn ten_thousand_connections_of_an_unprivileged_process_fit_one_ring_under_the_default_memlock() {
    let test =
        "ten_thousand_connections_of_an_unprivileged_process_fit_one_ring_under_the_default_memlock";
    let exe = std::env::current_exe().unwrap();
    let (l, addr) = listener();
    // The server side, in this process: reads every connection to its end and checks it.
    // Both processes hold one descriptor per connection (a guest's default limit is 1024).
    let want = scale_conns();
    let nofile = raise_nofile(want as u64 + 512);
    let conns = want.min(nofile.saturating_sub(512) as usize);
    if conns < want {
        println!("{test}: RLIMIT_NOFILE {nofile} allows only {conns} connections");
        assert!(
            !zcio_testnet::require_priv(),
            "{test}: {conns} < {want} connections"
        );
    }
    let server = serve_checked(l, conns, Arc::new(AtomicBool::new(false)));
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(["--exact", "scale_child", "--nocapture", "--test-threads=1"])
        .env(SCALE_ENV, addr.to_string())
        .env("ZCIO_SCALE_CONNS", conns.to_string());
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: only setrlimit (async-signal-safe) runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // The default memlock limit of an unprivileged user, whatever this process has.
                let l = libc::rlimit {
                    rlim_cur: 8 << 20,
                    rlim_max: 8 << 20,
                };
                if libc::setrlimit(libc::RLIMIT_MEMLOCK, &l) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
        if zcio_testnet::is_root() {
            // An unprivileged user: no capabilities, so memlock applies to everything.
            cmd.uid(65534).gid(65534);
        } else {
            println!("{test}: not root: the child runs as this (unprivileged) user");
        }
    }
    let out = cmd.output().expect("running the child");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{text}");
    let line = text
        .lines()
        .find_map(|l| l.split_once("SCALE ").map(|x| x.1))
        .unwrap_or_else(|| panic!("no result from the child:\n{text}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    eprintln!("{v}");
    assert_ne!(v["uid"], 0, "the child must be unprivileged: {v}");
    assert_eq!(v["memlock"], 8388608, "{v}");
    assert_eq!(v["caps"], 0, "the child has capabilities: {v}");
    assert!(v["register"].is_null(), "pool registration failed: {v}");
    assert_eq!(v["done"], conns, "{v}");
    assert_eq!(
        v["paths"]["uring-zc-fixed"], conns,
        "not all zero-copy with fixed buffers: {v}"
    );
    assert_eq!(v["fallbacks"], 0, "{v}");
    assert_eq!(v["unregistered_files"], 0, "{v}");
    assert_eq!(
        v["fds_after_add"], v["fds_before"],
        "adding sockets made descriptors: {v}"
    );
    assert!(
        v["fds_after"].as_u64().unwrap() <= v["fds_before"].as_u64().unwrap() + 2,
        "extra descriptors per connection: {v}"
    );
    assert!(
        v["rss_kib_per_conn"].as_f64().unwrap() <= 8.0,
        "more than 8 KiB per connection: {v}"
    );
    let got = server.join().unwrap();
    assert_eq!(got.len(), conns);
    for (i, (b, n)) in got.iter().enumerate() {
        assert_eq!((*b, *n), (base(i), 4 << 10), "connection {i}");
    }
}

#[test]
fn a_proxy_receives_and_forwards_chunks_in_place_on_one_ring_per_thread() {
    use zcio::rx::RxEvent;
    let conns = 16;
    let len: u64 = 256 << 10;
    // Upstream: checks every forwarded stream (header and pattern, in order).
    let (up_l, up_addr) = listener();
    let upstream = serve_checked(up_l, conns, Arc::new(AtomicBool::new(false)));
    // The proxy's front: a receiver with io_uring, and a send ring on the same ring.
    let (mut rx, mut tx, front_addr) = proxy_front();
    let clients: Vec<_> = (0..conns)
        .map(|i| {
            std::thread::spawn(move || {
                // Sent in full, then closed: the proxy sees the end of the stream.
                drop(common::streams::send_stream(front_addr, base(i), len, 32 << 10).unwrap())
            })
        })
        .collect();
    let mut up: HashMap<zcio::rx::ConnId, SockId> = HashMap::new();
    let mut held: HashMap<SockId, VecDeque<TxBuf>> = HashMap::new();
    let mut closed = 0;
    let mut forwarded = 0u64;
    let mut chunks = 0u64;
    let end = Instant::now() + common::scaled(Duration::from_secs(60));
    use std::collections::VecDeque;
    while closed < conns || tx.in_flight() > 0 || held.values().any(|q| !q.is_empty()) {
        assert!(Instant::now() < end, "the proxy stalled");
        let mut events = Vec::new();
        rx.poll(Duration::from_millis(20), &mut |ev| events.push(ev))
            .unwrap();
        for ev in events {
            match ev {
                RxEvent::Accepted(c) => {
                    let s = std::net::TcpStream::connect(up_addr).unwrap();
                    let id = tx.add(s, &cfg(TxMode::Auto, 64)).unwrap();
                    up.insert(c, id);
                }
                RxEvent::Data(chunk) => {
                    let id = up[&chunk.conn()];
                    chunks += 1;
                    forwarded += chunk.len() as u64;
                    held.entry(id).or_default().push_back(TxBuf::Chunk(chunk));
                }
                RxEvent::Closed(c, e) => {
                    assert!(e.is_none(), "{e:?}");
                    closed += 1;
                    let _ = c;
                }
            }
        }
        // Forward in order; what the ring refuses waits (backpressure) in `held`.
        for (id, q) in held.iter_mut() {
            while let Some(b) = q.pop_front() {
                if let Err(r) = tx.send(*id, b) {
                    assert!(r.reason.is_backpressure(), "{r}");
                    q.push_front(r.buf);
                    break;
                }
            }
        }
        // Queue the sends for the receiver's next wait: one enter serves both sides.
        tx.prepare();
        tx.harvest().unwrap();
        for (c, buf) in tx.completions() {
            assert_eq!(c.result(), Ok(c.len), "{c:?}");
            // The chunk goes back to the receiver's buffer ring now.
            assert!(buf.into_chunk().is_some());
        }
    }
    tx.flush(Duration::from_secs(10)).unwrap();
    for (c, _) in tx.completions() {
        assert_eq!(c.result(), Ok(c.len), "{c:?}");
    }
    for c in clients {
        c.join().unwrap();
    }
    let tx_enters = tx.enters();
    let rx_enters = rx.stats().ring_enters;
    eprintln!(
        "{chunks} chunks ({forwarded} bytes) forwarded; enters: receiver {rx_enters}, send ring \
         {tx_enters}"
    );
    // The send side rode on the receiver's enters: far fewer of its own than chunks.
    assert!(
        tx_enters * 4 < chunks,
        "send ring entered {tx_enters} times for {chunks} chunks"
    );
    for id in up.values() {
        tx.close(*id).unwrap();
    }
    drop(tx);
    drop(rx);
    let got = upstream.join().unwrap();
    for (i, (b, n)) in got.iter().enumerate() {
        assert_eq!((*b, *n), (base(i), len), "stream {i}");
    }
}

#[test]
fn sends_staged_behind_a_chain_go_when_only_the_readiness_descriptor_drives_the_ring() {
    let (l, addr) = small_buffers_listener();
    let pause = Arc::new(AtomicBool::new(true));
    let server = serve_checked(l, 1, pause.clone());
    let pool = Pool::new(64 << 10, 16, false).unwrap();
    let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
    let s = ring
        .add(stalled_socket(addr, 0), &cfg(TxMode::UringZc, 16))
        .unwrap();
    let mut sent = 0u64;
    let mut send = |ring: &mut SendRing| {
        let mut b = pool.try_get().unwrap();
        common::fill_pattern(&mut b, base(0) + sent);
        sent += 64 << 10;
        ring.send(s, b).unwrap();
    };
    // One request goes out and meets the full socket (its chain stays out); the rest wait
    // behind it in the socket's core.
    send(&mut ring);
    ring.submit().unwrap();
    for _ in 0..7 {
        send(&mut ring);
    }
    pause.store(false, Ordering::Relaxed);
    // Only the descriptor and on_ready from here: as an event loop drives the ring.
    let fd = ring.readiness_fd().unwrap().as_raw_fd();
    let mut done = 0;
    let end = Instant::now() + common::scaled(Duration::from_secs(20));
    while done < 8 {
        assert!(
            Instant::now() < end,
            "{done} of 8 completed: staged sends were never submitted"
        );
        let mut p = [libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(p.as_mut_ptr(), 1, 200) };
        ring.on_ready().unwrap();
        for (c, _) in ring.completions() {
            assert_eq!(c.result(), Ok(64 << 10), "{c:?}");
            done += 1;
        }
    }
    ring.close(s).unwrap();
    drop(ring);
    assert_eq!(server.join().unwrap()[0].1, sent);
}

#[test]
fn requests_a_harvest_lets_go_are_submitted_or_the_readiness_descriptor_fires_for_them() {
    // A one-entry submission queue: each chain of the stream socket is one request, which
    // completes inside the enter that submits it (the peer reads), so the harvest after that
    // enter lets the socket's next staged request go while nothing of the socket is left in
    // the kernel to announce it. The call that harvested must submit it, or leave the
    // descriptor readable: an event loop that sleeps on the descriptor sees every send
    // complete. Before, `submit` sent two and returned with the rest staged and the
    // descriptor silent for good (the loss that hung `LocalIo` streams on their last sends).
    let (l, addr) = listener();
    let server = serve_checked(l, 1, Arc::new(AtomicBool::new(false)));
    let n = 48;
    let pool = Pool::new(4 << 10, n, false).unwrap();
    let mut rc = SendRingConfig {
        submit_batch: usize::MAX,
        ..SendRingConfig::default()
    };
    rc.ring.entries = 1;
    let mut ring = SendRing::new(&rc).unwrap();
    let s = ring
        .add(connect_with_base(addr, base(0)), &cfg(TxMode::UringCopy, n))
        .unwrap();
    let fd = ring.readiness_fd().unwrap().as_raw_fd();
    for k in 0..n {
        let mut b = pool.try_get().unwrap();
        common::fill_pattern(&mut b, base(0) + (k as u64) * 4096);
        ring.send(s, b).unwrap();
    }
    let take = |ring: &mut SendRing| -> usize {
        let mut got = 0;
        for (c, _) in ring.completions() {
            assert_eq!(c.result(), Ok(4096), "{c:?}");
            got += 1;
        }
        got
    };
    ring.submit().unwrap();
    let mut done = take(&mut ring);
    let wait_ms = common::scaled(Duration::from_secs(2)).as_millis() as i32;
    let (mut wakes, end) = (0, Instant::now() + common::scaled(Duration::from_secs(20)));
    while done < n {
        assert!(Instant::now() < end, "{done} of {n} sends completed");
        let ev = zcio::sys::net::poll_one(&fd, libc::POLLIN, wait_ms).unwrap();
        assert!(
            ev & libc::POLLIN != 0,
            "{done} of {n} sends completed, {} in flight, and the readiness descriptor stays \
             silent after {wakes} wake-ups",
            ring.in_flight()
        );
        wakes += 1;
        ring.on_ready().unwrap();
        done += take(&mut ring);
    }
    eprintln!("{n} sends in {wakes} wake-ups");
    ring.close(s).unwrap();
    drop(ring);
    assert_eq!(server.join().unwrap()[0].1, (n as u64) * 4096);
}

#[test]
fn a_loop_that_only_polls_sees_every_zero_copy_completion() {
    // Under DEFER_TASKRUN a zero-copy notification is task work that only an enter of the
    // ring's thread posts: `poll` must enter for it when the kernel flagged it, or a loop
    // whose sockets are all at their depth (nothing new to submit) would spin forever.
    let (l, addr) = listener();
    let server = serve_checked(l, 1, Arc::new(AtomicBool::new(false)));
    let pool = Pool::new(16 << 10, 8, false).unwrap();
    let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
    ring.register_pool(&pool).unwrap();
    let s = ring
        .add(
            connect_with_base(addr, base(0)),
            &cfg(TxMode::UringZcFixed, 2),
        )
        .unwrap();
    let (mut sent, mut done, mut refused) = (0u64, 0usize, 0usize);
    let total = 64;
    let mut taken = 0;
    let end = Instant::now() + common::scaled(Duration::from_secs(20));
    let mut held: Option<PoolBuf> = None;
    while done < total {
        assert!(
            Instant::now() < end,
            "{done} of {total} completed with only poll driving the ring ({refused} refusals, \
             {} in flight)",
            ring.in_flight()
        );
        // Send until the depth refuses (or the pool is dry) before each poll: one send per
        // turn could see each completion before the next send, and never reach the depth
        // (a slow guest did).
        while taken < total {
            let b = held.take().or_else(|| pool.try_get()).map(|mut b| {
                common::fill_pattern(&mut b, base(0) + sent);
                b
            });
            let Some(b) = b else { break };
            match ring.send(s, b) {
                Ok(_) => {
                    sent += 16 << 10;
                    taken += 1;
                }
                Err(r) => {
                    assert_eq!(r.reason, Refusal::Depth, "{r}");
                    refused += 1;
                    held = Some(r.buf.into_pool().unwrap());
                    break;
                }
            }
        }
        ring.poll().unwrap();
        for (c, _) in ring.completions() {
            assert_eq!(c.result(), Ok(16 << 10), "{c:?}");
            done += 1;
        }
    }
    assert!(refused > 0, "the depth never refused a send");
    ring.close(s).unwrap();
    drop(ring);
    assert_eq!(server.join().unwrap()[0].1, sent);
}

#[test]
fn a_copy_socket_whose_send_finishes_while_another_waits_is_named_writable() {
    // Two copy sockets each hold a send their full socket buffer could not take, so a wait
    // watches both through the readiness set. The first one's peer reads again: its send
    // finishes inside that wait, and the socket must be named writable. (Under emulation the
    // stalled-peer test met this: its slow socket's send finished while the fast one waited,
    // and it was never named again.)
    let (l1, a1) = small_buffers_listener();
    let (l2, a2) = small_buffers_listener();
    let (p1, p2) = (
        Arc::new(AtomicBool::new(true)),
        Arc::new(AtomicBool::new(true)),
    );
    let srv1 = serve_checked(l1, 1, p1.clone());
    let srv2 = serve_checked(l2, 1, p2.clone());
    let pool = Pool::new(32 << 10, 64, false).unwrap();
    let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
    let socks = [
        ring.add(stalled_socket(a1, 0), &cfg(TxMode::Copy, 8))
            .unwrap(),
        ring.add(stalled_socket(a2, 1), &cfg(TxMode::Copy, 8))
            .unwrap(),
    ];
    let mut book = Book::default();
    let mut sent = [0u64; 2];
    let mut held = Vec::new();
    for (k, &s) in socks.iter().enumerate() {
        loop {
            let mut b = get(&pool, &mut ring, &mut book);
            common::fill_pattern(&mut b, base(k) + sent[k]);
            match ring.send(s, b) {
                Ok(_) => sent[k] += 32 << 10,
                Err(r) => {
                    assert_eq!(r.reason, Refusal::SocketFull, "{r}");
                    held.push(r.buf);
                    break;
                }
            }
        }
    }
    assert!(ring.next_writable().is_none());
    p1.store(false, Ordering::Relaxed);
    let end = Instant::now() + common::scaled(Duration::from_secs(10));
    let mut named = None;
    while named.is_none() {
        assert!(
            Instant::now() < end,
            "the first socket's send finished ({} completions) but it was never named writable",
            book.done.len()
        );
        ring.wait(Duration::from_millis(50)).unwrap();
        book.take(&mut ring);
        named = ring.next_writable();
    }
    assert_eq!(named, Some(socks[0]));
    // The rest goes: the held buffers, then the second peer reads too.
    let mut held = held.into_iter();
    ring.send(socks[0], held.next().unwrap())
        .expect("writable means a send is taken");
    sent[0] += 32 << 10;
    p2.store(false, Ordering::Relaxed);
    let b = held.next().unwrap();
    let end = Instant::now() + common::scaled(Duration::from_secs(10));
    while !ring.can_send(socks[1]) {
        assert!(Instant::now() < end, "the second socket never drained");
        ring.wait(Duration::from_millis(50)).unwrap();
        book.take(&mut ring);
    }
    ring.send(socks[1], b).unwrap();
    sent[1] += 32 << 10;
    ring.flush(common::scaled(Duration::from_secs(30))).unwrap();
    book.take(&mut ring);
    assert!(book.done.values().all(|c| c.result() == Ok(c.len)));
    for s in socks {
        ring.close(s).unwrap();
    }
    drop(ring);
    assert_eq!(srv1.join().unwrap()[0].1, sent[0]);
    assert_eq!(srv2.join().unwrap()[0].1, sent[1]);
}

#[test]
fn closing_an_unknown_or_closed_socket_is_an_error_and_a_closed_socket_has_no_path() {
    let (l, addr) = small_buffers_listener();
    let pause = Arc::new(AtomicBool::new(true));
    let server = serve_checked(l, 1, pause.clone());
    let pool = Pool::new(64 << 10, 16, false).unwrap();
    let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
    ring.register_pool(&pool).unwrap();
    let s = ring
        .add(stalled_socket(addr, 0), &cfg(TxMode::UringZcFixed, 8))
        .unwrap();
    assert!(ring.sock_path(s).is_some());
    assert!(!ring.sock_closed(s));
    // Sends the peer does not read: they are in flight when the socket is closed.
    for k in 0..8 {
        let mut b = pool.try_get().unwrap();
        common::fill_pattern(&mut b, base(0) + k * (64 << 10));
        if ring.send(s, b).is_err() {
            break;
        }
    }
    ring.submit().unwrap();
    ring.wait(Duration::from_millis(50)).unwrap();
    assert!(
        ring.sock_in_flight(s) > 0,
        "nothing in flight to close over"
    );
    ring.close(s).unwrap();
    // Closed, its last sends still completing: no path, and a second close is an error.
    assert_eq!(ring.sock_path(s), None, "a closed socket answers sock_path");
    assert!(ring.sock_closed(s));
    let e = ring.close(s).unwrap_err();
    assert!(
        matches!(&e, TxError::Socket { source, .. } if source.raw_os_error() == Some(libc::ENOENT)),
        "{e:?}"
    );
    // An id this ring never gave.
    let unknown = zcio::tx::SockId::from_raw(u64::from(u32::MAX) << 32 | 7);
    assert!(ring.close(unknown).is_err());
    assert!(!ring.sock_closed(unknown));
    ring.flush(common::scaled(Duration::from_secs(10))).unwrap();
    let n = ring.completions().count();
    assert!(n > 0);
    // Gone now: still closed, still an error to close.
    assert!(ring.sock_closed(s));
    assert!(ring.close(s).is_err());
    pause.store(false, Ordering::Relaxed);
    drop(ring);
    server.join().unwrap();
}

#[test]
fn a_listening_or_unconnected_tcp_socket_is_refused_when_added() {
    let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
    let (l, addr) = listener();
    let e = ring
        .add(l.try_clone().unwrap(), &cfg(TxMode::Auto, 8))
        .unwrap_err();
    assert!(
        matches!(&e, TxError::Socket { source, .. } if source.raw_os_error() == Some(libc::EINVAL)),
        "a listening socket: {e:?}"
    );
    let fresh = zcio::sys::socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    let e = ring.add(fresh, &cfg(TxMode::Auto, 8)).unwrap_err();
    assert!(
        matches!(&e, TxError::Socket { source, .. } if source.raw_os_error() == Some(libc::ENOTCONN)),
        "an unconnected socket: {e:?}"
    );
    let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    ring.add(a, &cfg(TxMode::Auto, 8)).unwrap();
    let unix = zcio::sys::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0).unwrap();
    assert!(ring.add(unix, &cfg(TxMode::Auto, 8)).is_err());
    // A connected one is taken, and so is one whose connect is in progress.
    let c = std::net::TcpStream::connect(addr).unwrap();
    ring.add(c, &cfg(TxMode::Auto, 8)).unwrap();
    assert_eq!(ring.sockets(), 2);
}

#[test]
fn the_readiness_descriptor_wakes_only_when_on_ready_finds_something() {
    // An event loop: send to every socket that takes one, submit, then look at the
    // readiness descriptor (sleep on it when nothing can be sent). Before, the ring's own
    // enters signalled its eventfd, so nearly every wake-up found nothing.
    let conns = 64;
    // Small socket buffers: sends wait in the kernel for room, and complete later.
    let (l, addr) = small_buffers_listener();
    // The peers read only after a pause: the first sends fill the sockets and wait in the
    // kernel, so the loop sleeps on the descriptor at least then (a fast reader on an idle
    // host let every send complete inside `submit`: no wake-up to count).
    // The pause is counted from the loop's first submit, not from here: in an emulated guest
    // the set-up below (64 sockets, the pool's registration) can take longer than the pause,
    // and then every send completed inside `submit` (6.1 guest: "the descriptor never woke
    // the loop").
    let pause = Arc::new(AtomicBool::new(true));
    let server = serve_checked(l, conns, pause.clone());
    let (go, started) = std::sync::mpsc::channel::<()>();
    let unpause = std::thread::spawn(move || {
        let _ = started.recv();
        std::thread::sleep(Duration::from_millis(300));
        pause.store(false, Ordering::Relaxed);
    });
    let mut go = Some(go);
    let pool = Pool::new(16 << 10, 4 * conns, false).unwrap();
    let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
    ring.register_pool(&pool).unwrap();
    let ids: Vec<SockId> = (0..conns)
        .map(|i| {
            ring.add(stalled_socket(addr, i), &cfg(TxMode::Auto, 4))
                .unwrap()
        })
        .collect();
    let fd = ring.readiness_fd().unwrap().as_raw_fd();
    let mut sent = vec![0u64; conns];
    let mut owner: HashMap<Ticket, usize> = HashMap::new();
    let mut blocked = vec![false; conns];
    let (mut wakes, mut empty, mut done) = (0u32, 0u32, 0usize);
    let want = 8 * 1024;
    let mut i = 0;
    let end = Instant::now() + common::scaled(Duration::from_secs(60));
    let take = |ring: &mut SendRing, blocked: &mut Vec<bool>, done: &mut usize| -> usize {
        let mut got = 0;
        for (c, _) in ring.completions() {
            assert_eq!(c.result(), Ok(c.len), "{c:?}");
            *done += 1;
            got += 1;
        }
        while let Some(id) = ring.next_writable() {
            blocked[ids.iter().position(|&x| x == id).unwrap()] = false;
            got += 1;
        }
        got
    };
    while done < want {
        assert!(Instant::now() < end, "{done} of {want} sends completed");
        let mut more = false;
        for _ in 0..conns {
            i = (i + 1) % conns;
            if blocked[i] || owner.len() >= want {
                continue;
            }
            let Some(mut b) = pool.try_get() else { break };
            common::fill_pattern(&mut b, base(i) + sent[i]);
            match ring.send(ids[i], b) {
                Ok(t) => {
                    owner.insert(t, i);
                    sent[i] += 16 << 10;
                    more = true;
                }
                Err(r) => {
                    assert!(r.reason.is_backpressure(), "{r}");
                    blocked[i] = true;
                }
            }
        }
        ring.submit().unwrap();
        if let Some(go) = go.take() {
            go.send(()).unwrap();
        }
        take(&mut ring, &mut blocked, &mut done);
        let wait_ms = if more { 0 } else { 100 };
        let ev = zcio::sys::net::poll_one(&fd, libc::POLLIN, wait_ms).unwrap();
        if ev & libc::POLLIN == 0 {
            continue;
        }
        wakes += 1;
        ring.on_ready().unwrap();
        if take(&mut ring, &mut blocked, &mut done) == 0 {
            empty += 1;
        }
    }
    ring.flush(common::scaled(Duration::from_secs(30))).unwrap();
    take(&mut ring, &mut blocked, &mut done);
    unpause.join().unwrap();
    eprintln!("{wakes} wake-ups, {empty} found nothing, {done} sends");
    assert!(wakes > 0, "the descriptor never woke the loop");
    // On the host (Linux 6.18, where CI runs this) and in the 6.1 guest under 5 % of the
    // wake-ups find nothing (before the ring disabled its eventfd during its own calls, 128 of
    // 128 did). In the 6.12 and 7.x guests more do: 1 of 19 and 3 of 20 (6.12), 18 of 60 and
    // 28 of 49 (7.2) — wake-ups for completions that the ring's own running enter then ran
    // itself (docs/design/tx.md, "Cost per call, and the readiness descriptor"). Whether that
    // is those kernels or emulation's timing is not known, so under emulation
    // (ZCIO_TIME_SCALE > 1) the share is reported, not bounded; one empty wake-up is allowed
    // in a short run.
    let emulated = common::scaled(Duration::from_secs(1)) > Duration::from_secs(1);
    let rel = zcio::sys::kernel_release();
    if emulated {
        eprintln!("Linux {rel} under emulation: {empty} of {wakes} wake-ups found nothing (reported, not bounded)");
    } else {
        assert!(
            empty <= 1 || f64::from(empty) < 0.05 * f64::from(wakes),
            "Linux {rel}: {empty} of {wakes} wake-ups of the readiness descriptor found nothing to do"
        );
    }
    for id in ids {
        ring.close(id).unwrap();
    }
    drop(ring);
    let got = server.join().unwrap();
    for (k, (b, n)) in got.iter().enumerate() {
        assert_eq!((*b, *n), (base(k), sent[k]), "stream {k}");
    }
}

#[test]
fn auto_sends_by_copy_while_zero_copy_buffers_waiting_for_acks_drain_the_pool() {
    // A path that does not copy (a NIC) is stood in for by loopback with auto's COPIED watch
    // off: zero-copy buffers then come back only when the peer ACKs (delayed ACKs: up to
    // 40 ms), and a pool smaller than what the connections keep out runs dry.
    let conns = 32;
    let (l, addr) = listener();
    let server = serve_checked(l, conns, Arc::new(AtomicBool::new(false)));
    let pool = Pool::new(16 << 10, 48, false).unwrap();
    let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
    ring.register_pool(&pool).unwrap();
    let mut c = cfg(TxMode::Auto, 4);
    c.copied_streak = u32::MAX;
    c.auto_by_size = false;
    let ids: Vec<SockId> = (0..conns)
        .map(|i| ring.add(connect_with_base(addr, base(i)), &c).unwrap())
        .collect();
    let mut sent = vec![0u64; conns];
    let mut by_path: HashMap<String, usize> = HashMap::new();
    let mut book = Book::default();
    for round in 0..16 {
        for (i, &id) in ids.iter().enumerate() {
            let mut b = get(&pool, &mut ring, &mut book);
            common::fill_pattern(&mut b, base(i) + sent[i]);
            match ring.send(id, b) {
                Ok(_) => sent[i] += 16 << 10,
                Err(r) => assert!(r.reason.is_backpressure(), "round {round}: {r}"),
            }
        }
        ring.submit().unwrap();
    }
    ring.flush(common::scaled(Duration::from_secs(30))).unwrap();
    book.take(&mut ring);
    for c in book.done.values() {
        assert_eq!(c.result(), Ok(c.len), "{c:?}");
        *by_path.entry(c.path.to_string()).or_default() += 1;
    }
    let st = ring.stats();
    let copies = by_path
        .get(&Path::UringCopy.to_string())
        .copied()
        .unwrap_or(0);
    eprintln!("paths {by_path:?}, pool copies {}", st.auto_pool_copies);
    assert!(
        copies > 0 && st.auto_pool_copies as usize == copies,
        "no send went by copy while the pool was dry: {by_path:?} {st:?}"
    );
    let why = ids
        .iter()
        .flat_map(|&id| ring.sock_fallbacks(id).to_vec())
        .find(|f| f.reason.contains("pool ran dry"))
        .expect("the dry pool recorded as a fallback");
    assert!(why.reason.contains("ACK"), "{why:?}");
    assert!(
        by_path
            .get(&Path::UringZcFixed.to_string())
            .copied()
            .unwrap_or(0)
            > 0
    );
    for id in ids {
        ring.close(id).unwrap();
    }
    drop(ring);
    let got = server.join().unwrap();
    for (k, (b, n)) in got.iter().enumerate() {
        assert_eq!((*b, *n), (base(k), sent[k]), "stream {k}");
    }
}

#[test]
fn a_udp_socket_closed_with_sends_in_flight_to_the_sink_counts_the_datagrams_that_left() {
    let test =
        "a_udp_socket_closed_with_sends_in_flight_to_the_sink_counts_the_datagrams_that_left";
    if !common::can_make_hosts(test) {
        return;
    }
    let sink = zcio_testnet::Sink::new("closecount").unwrap();
    let (src, dst) = (sink.src4, sink.dst4);
    let (done, total, out) = sink
        .host
        .run(move || {
            let pool = Pool::new(2048, 512, false).unwrap();
            // Submitted 100 at a time: at the close, 12 are still staged.
            let mut ring = SendRing::new(&SendRingConfig {
                submit_batch: 100,
                ..SendRingConfig::default()
            })
            .unwrap();
            ring.register_pool(&pool).unwrap();
            let s = std::net::UdpSocket::bind((src, 0)).unwrap();
            s.connect((dst, 9)).unwrap();
            let mut c = cfg(TxMode::UringZcFixed, 512);
            c.udp_gso = false;
            let id = ring.add(s, &c).unwrap();
            let before = common::ip_out_requests();
            for _ in 0..512 {
                let mut b = pool.try_get().unwrap();
                b.set_len(1472);
                ring.send(id, b).unwrap();
            }
            // Closed at once: some datagrams are in the kernel, the rest staged.
            ring.close(id).unwrap();
            ring.flush(common::scaled(Duration::from_secs(10))).unwrap();
            let done: Vec<Completion> = ring.completions().map(|(c, _)| c).collect();
            let out = common::ip_out_requests() - before;
            (done, ring.counters_total(), out)
        })
        .unwrap();
    assert_eq!(done.len(), 512, "every buffer came back");
    let mut went = 0u64;
    for c in &done {
        match c.bytes {
            1472 => went += 1,
            0 => assert_eq!(c.error, Some(SendError::Closed), "{c:?}"),
            n => panic!("a datagram of {n} bytes: {c:?}"),
        }
    }
    assert_eq!(
        went, out,
        "datagrams the completions say went vs IP's count"
    );
    assert_eq!(total.bytes, out * 1472, "the ring's bytes");
    assert!(total.zerocopy_bytes <= total.bytes);
    eprintln!("{went} of 512 datagrams left before the close, {out} counted by IP");
}

/// On a ring shared with a receiver, the receiver's wait may count the sends it submits
/// (`Receiver::count_in_next_wait`): the count is of the sends in the submission queue now,
/// not of every send pushed since it was last asked. Sends that an enter already took (the
/// send ring's own submit, or a harvest that let a stream's next requests go and submitted
/// them) complete before the wait, and counting them made the wait hold the answer it was
/// waiting for until its cap.
#[test]
fn the_sends_a_wait_counts_are_those_no_enter_has_taken() {
    let (mut rx, mut tx, _) = proxy_front();
    let (l, addr) = listener();
    let mut peers = vec![];
    let mut ids = vec![];
    for _ in 0..3 {
        let s = std::net::TcpStream::connect(addr).unwrap();
        peers.push(l.accept().unwrap().0);
        ids.push(tx.add(s, &cfg(TxMode::UringCopy, 8)).unwrap());
    }
    let send_all = |tx: &mut SendRing| {
        for &id in &ids {
            tx.send(id, TxBuf::Vec(vec![7u8; 100])).unwrap();
        }
        tx.prepare();
    };
    // The send ring's own enter takes them.
    send_all(&mut tx);
    tx.submit().unwrap();
    assert_eq!(tx.queued_sends(), 0, "submitted by the send ring's enter");
    // The receiver's wait takes them too.
    send_all(&mut tx);
    assert_eq!(tx.queued_sends(), 3);
    rx.poll(Duration::from_millis(1), &mut |_| {}).unwrap();
    assert_eq!(tx.queued_sends(), 0, "submitted by the receiver's wait");
    tx.flush(Duration::from_secs(5)).unwrap();
    let done: Vec<_> = tx.completions().collect();
    assert_eq!(done.len(), 6);
    for (c, _) in done {
        assert_eq!(c.result(), Ok(100), "{c:?}");
    }
    for mut p in peers {
        use std::io::Read as _;
        let mut b = [0u8; 200];
        p.read_exact(&mut b).unwrap();
        assert!(b.iter().all(|&x| x == 7));
    }
}

/// A turn whose poll found completions ready does not wait, and the sends it counted are
/// still queued at the next turn, which counts them again: the count states what is queued
/// now, it does not add up. Added up, the wait needed completions that were not coming
/// (here: one send and one receive re-arm queued; the one completion beyond the send is a
/// client's message 50 ms later), and held until its timeout.
#[test]
fn a_wait_told_twice_of_the_same_queued_sends_counts_them_once() {
    use std::io::Write as _;
    use zcio::rx::RxEvent;
    let (mut rx, mut tx, front_addr) = proxy_front();
    let mut c = std::net::TcpStream::connect(front_addr).unwrap();
    let end = Instant::now() + common::scaled(Duration::from_secs(5));
    let mut accepted = false;
    while !accepted {
        assert!(Instant::now() < end, "never accepted");
        rx.poll(Duration::from_millis(20), &mut |ev| {
            accepted |= matches!(ev, RxEvent::Accepted(_));
        })
        .unwrap();
    }
    // A peer for the send, and a second connection of the receiver whose first receive is
    // queued beside it (it completes only when that peer writes, which it does not).
    let (l, addr) = listener();
    let s = std::net::TcpStream::connect(addr).unwrap();
    let _peer = l.accept().unwrap().0;
    let id = tx.add(s, &cfg(TxMode::UringCopy, 8)).unwrap();
    let (l2, addr2) = listener();
    let quiet = std::net::TcpStream::connect(addr2).unwrap();
    let _quiet_peer = l2.accept().unwrap().0;
    let q = rx.add(quiet).unwrap();
    // Paused, its receive cancelled, then resumed: the new receive is queued, not yet
    // submitted (the next wait's enter submits it).
    rx.pause(q);
    for _ in 0..3 {
        rx.poll(Duration::from_millis(10), &mut |_| {}).unwrap();
    }
    rx.resume(q).unwrap();
    tx.send(id, TxBuf::Vec(vec![7u8; 100])).unwrap();
    tx.prepare();
    assert_eq!(tx.queued_sends(), 1);
    // Two turns' counts of the same queued send.
    rx.count_in_next_wait(tx.queued_sends());
    rx.count_in_next_wait(tx.queued_sends());
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        c.write_all(b"the answer").unwrap();
        c
    });
    let t0 = Instant::now();
    let mut data = 0;
    rx.poll(Duration::from_millis(1500), &mut |ev| {
        if let RxEvent::Data(ch) = ev {
            data += ch.len();
        }
    })
    .unwrap();
    let took = t0.elapsed();
    let _c = writer.join().unwrap();
    assert_eq!(data, 10, "the client's message");
    assert!(
        took < Duration::from_millis(1000),
        "the wait held until {took:?}"
    );
    tx.flush(Duration::from_secs(5)).unwrap();
}

//! `SendRing::send_vectored`: a header and pool buffers as one request, on every path; every
//! slice comes back once, in order, after the kernel's last reference (the notification on
//! the zero-copy paths); the bytes arrive as one stream or one datagram.

mod common;

use std::io::Read;
use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;
use zcio::buf::pool::Pool;
use zcio::ring::features::Features;
use zcio::tx::{
    Dest, Path, SendError, SendRing, SendRingConfig, SenderConfig, TxBuf, TxMode, ZcStatus,
};

const HEADER: usize = 256;
const ROUNDS: usize = 24;

fn body2_len(i: usize) -> usize {
    1000 + 997 * i
}

fn filled(len: usize, off: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    common::fill_pattern(&mut v, off);
    v
}

#[test]
fn a_vectored_send_returns_every_slice_once_in_order_after_the_notification() {
    for mode in [
        TxMode::UringZcFixed,
        TxMode::UringZc,
        TxMode::UringCopy,
        TxMode::MsgZc,
        TxMode::Copy,
    ] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let rx = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = vec![0u8; 1 << 16];
            let mut off = 0u64;
            loop {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    return off;
                }
                common::check_pattern(&buf[..n], off)
                    .unwrap_or_else(|bad| panic!("{mode}: stream corrupt at offset {bad}"));
                off += n as u64;
            }
        });
        let pool = Pool::new(64 << 10, 4 * ROUNDS, false).unwrap();
        let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
        ring.register_pool(&pool).unwrap();
        let mut c = SenderConfig::new(mode);
        c.depth = 4 * ROUNDS;
        let id = ring.add(TcpStream::connect(addr).unwrap(), &c).unwrap();
        let mut off = 0u64;
        let mut sent = Vec::new();
        for i in 0..ROUNDS {
            // Odd rounds: the header from the pool too (every slice registered: a fixed-buffer
            // vectored request); even rounds: inline.
            let head = if i % 2 == 1 {
                let mut h = pool.try_get().unwrap();
                h.set_len(HEADER);
                h.copy_from_slice(&filled(HEADER, off));
                TxBuf::Pool(h)
            } else {
                TxBuf::Vec(filled(HEADER, off))
            };
            let mut b1 = pool.try_get().unwrap();
            common::fill_pattern(&mut b1, off + HEADER as u64);
            let mut b2 = pool.try_get().unwrap();
            b2.set_len(body2_len(i));
            common::fill_pattern(&mut b2, off + HEADER as u64 + b1.len() as u64);
            let ptrs = (b1.as_ptr(), b2.as_ptr());
            let len = HEADER + b1.len() + b2.len();
            let t = ring
                .send_vectored(id, vec![head, TxBuf::Pool(b1), TxBuf::Pool(b2)], i as u64)
                .unwrap();
            sent.push((t, off, ptrs, len));
            off += len as u64;
        }
        ring.flush(common::scaled(Duration::from_secs(20))).unwrap();
        let mut done: Vec<_> = ring.completions().collect();
        assert_eq!(done.len(), ROUNDS, "{mode}");
        // Each send once (notifications of different sends may come in any order: Linux 6.1
        // posted a later send's before an earlier one's); its slices in order.
        done.sort_by_key(|(c, _)| c.ticket);
        for (i, ((c, buf), (t, at, ptrs, len))) in done.into_iter().zip(&sent).enumerate() {
            assert_eq!(c.ticket, *t, "{mode}: every send completes once");
            assert_eq!(c.token, i as u64);
            assert_eq!(c.result(), Ok(*len), "{mode}: {c:?}");
            if mode != TxMode::Copy && mode != TxMode::UringCopy {
                // Zero-copy: back only after the notification, which said copied or not.
                assert_ne!(c.zerocopy, ZcStatus::NotAttempted, "{mode}: {c:?}");
            }
            let slices = buf.into_slices().expect("the slices come back as slices");
            assert_eq!(slices.len(), 3, "{mode}");
            let mut slices = slices.into_iter();
            let head = slices.next().unwrap();
            assert_eq!(matches!(head, TxBuf::Pool(_)), i % 2 == 1, "{mode}");
            assert_eq!(head.as_bytes().unwrap(), &filled(HEADER, *at)[..], "{mode}");
            let b1 = slices
                .next()
                .unwrap()
                .into_pool()
                .expect("pool buffer back");
            let b2 = slices
                .next()
                .unwrap()
                .into_pool()
                .expect("pool buffer back");
            assert_eq!(
                (b1.as_ptr(), b2.as_ptr()),
                *ptrs,
                "{mode}: the same buffers, in order"
            );
            assert_eq!(b2.len(), body2_len(i));
        }
        let fb = ring.sock_fallbacks(id).to_vec();
        match mode {
            TxMode::UringZcFixed | TxMode::UringZc => {
                // SEND_ZC with IORING_SEND_VECTORIZED (6.17), from registered buffers where the
                // kernel takes them; otherwise SENDMSG_ZC, recorded.
                let f = Features::get();
                let direct = f.has(Features::SEND_VECTORIZED)
                    && (mode == TxMode::UringZc || f.has(Features::SEND_VECTORIZED_FIXED_BUF));
                assert_eq!(
                    fb.iter()
                        .any(|f| f.from.to_string().contains("SEND_VECTORIZED")),
                    !direct,
                    "{mode}: {fb:?}"
                );
            }
            TxMode::MsgZc | TxMode::Copy => {
                assert!(
                    fb.iter()
                        .any(|f| f.reason.contains("copied into one buffer")),
                    "{mode}: {fb:?}"
                );
            }
            _ => {}
        }
        let st = ring.ring_stats().unwrap();
        assert_eq!(st.lent, st.returned, "{mode}: {st:?}");
        ring.close(id).unwrap();
        drop(ring);
        assert_eq!(
            pool.available(),
            pool.count(),
            "{mode}: every pool buffer back"
        );
        assert_eq!(rx.join().unwrap(), off, "{mode}");
    }
}

#[test]
fn a_vectored_datagram_is_one_datagram_and_too_many_slices_fail_alone() {
    for mode in [
        TxMode::UringZcFixed,
        TxMode::UringCopy,
        TxMode::MsgZc,
        TxMode::Copy,
    ] {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        let pool = Pool::new(4 << 10, 32, false).unwrap();
        let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
        ring.register_pool(&pool).unwrap();
        let mut c = SenderConfig::new(mode);
        c.udp_gso = false;
        let id = ring.add(tx, &c).unwrap();
        let mut body = pool.try_get().unwrap();
        body.set_len(1000);
        body.fill(0xbb);
        ring.send_vectored(id, vec![TxBuf::Vec(vec![0xaa; 24]), TxBuf::Pool(body)], 1)
            .unwrap();
        let nine: Vec<TxBuf> = (0..9).map(|_| TxBuf::Vec(vec![1; 10])).collect();
        ring.send_vectored(id, nine, 2).unwrap();
        ring.flush(Duration::from_secs(5)).unwrap();
        let mut done: Vec<_> = ring.completions().collect();
        done.sort_by_key(|(c, _)| c.token);
        assert_eq!(done[0].0.result(), Ok(1024), "{mode}: {:?}", done[0].0);
        assert!(
            matches!(&done[1].0.error, Some(SendError::Invalid { errno, .. }) if *errno == libc::EINVAL),
            "{mode}: {:?}",
            done[1].0
        );
        assert_eq!(
            done[1].1.slices().len(),
            9,
            "{mode}: the nine slices come back"
        );
        let mut buf = [0u8; 2048];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(n, 1024, "{mode}: one datagram of both slices");
        assert!(buf[..24].iter().all(|&b| b == 0xaa) && buf[24..n].iter().all(|&b| b == 0xbb));
    }
}

#[test]
fn vectored_trains_to_the_sink_host_are_zero_copy() {
    let test = "vectored_trains_to_the_sink_host_are_zero_copy";
    if !common::can_make_hosts(test) {
        return;
    }
    let sink = zcio_testnet::Sink::new("vecsink").unwrap();
    let (src, dst) = (sink.src4, sink.dst4);
    let done = sink
        .host
        .run(move || {
            let pool = Pool::new(64 << 10, 64, false).unwrap();
            let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
            ring.register_pool(&pool).unwrap();
            let sock = UdpSocket::bind(SocketAddrV4::new(src, 0)).unwrap();
            let id = ring
                .add(sock, &SenderConfig::new(TxMode::UringZcFixed))
                .unwrap();
            for i in 0..16u16 {
                let mut a = pool.try_get().unwrap();
                a.set_len(1472);
                let mut b = pool.try_get().unwrap();
                b.set_len(40 * 1472);
                let to = Dest::new(SocketAddr::from((dst, 2000 + i))).segment(1472);
                ring.send_to_with(id, TxBuf::Slices(vec![a.into(), b.into()]), &to, 0)
                    .unwrap();
            }
            ring.flush(Duration::from_secs(5)).unwrap();
            let done: Vec<_> = ring
                .completions()
                .map(|(c, b)| (c, b.slices().len()))
                .collect();
            done
        })
        .unwrap();
    assert_eq!(done.len(), 16);
    for (c, n) in &done {
        assert_eq!(c.result(), Ok(41 * 1472), "{c:?}");
        // Without IORING_SEND_ZC_REPORT_USAGE (Linux 6.2) the kernel does not say.
        assert_eq!(c.zerocopy, sink_status(), "{c:?}");
        // From the registered pool where SENDMSG_ZC takes registered buffers (6.15).
        let fixed = Features::get().has(Features::SENDMSG_ZC_FIXED_BUF);
        let want = if fixed {
            Path::UringZcFixed
        } else {
            Path::UringZc
        };
        assert_eq!(c.path, want, "{c:?}");
        assert_eq!(*n, 2);
    }
}

/// What a zero-copy completion to the sink says: zero-copy, or, where notifications do not
/// report usage (`IORING_SEND_ZC_REPORT_USAGE`, Linux 6.2), unknown.
fn sink_status() -> ZcStatus {
    use zcio::ring::features::Features;
    if Features::get().has(Features::SEND_ZC_REPORT_USAGE) {
        ZcStatus::ZeroCopy
    } else {
        ZcStatus::Unknown
    }
}

#[test]
fn a_train_over_more_pages_than_one_skb_holds_goes_by_copy_with_a_reason() {
    let test = "a_train_over_more_pages_than_one_skb_holds_goes_by_copy_with_a_reason";
    if !common::can_make_hosts(test) {
        return;
    }
    let sink = zcio_testnet::Sink::new("vecfrag").unwrap();
    let (src, dst) = (sink.src4, sink.dst4);
    let (done, fb) = sink
        .host
        .run(move || {
            let pool = Pool::new(64 << 10, 16, false).unwrap();
            let heads = Pool::new(4096, 16, false).unwrap();
            let mut ring = SendRing::new(&SendRingConfig::default()).unwrap();
            ring.register_pool(&pool).unwrap();
            ring.register_pool(&heads).unwrap();
            let sock = UdpSocket::bind(SocketAddrV4::new(src, 0)).unwrap();
            let id = ring
                .add(sock, &SenderConfig::new(TxMode::UringZcFixed))
                .unwrap();
            let to = Dest::new(SocketAddr::from((dst, 9))).segment(1472);
            for fits in [false, true, false] {
                // Headers of 256 bytes (a page each) and a body from a 64 KiB slot: two
                // headers and 44 segments in all span 18 pages, one header and 41 segments
                // 16 (MAX_SKB_FRAGS is 17).
                let (heads_n, segs) = if fits { (1, 41) } else { (2, 44) };
                let mut slices: Vec<TxBuf> = Vec::new();
                for _ in 0..heads_n {
                    let mut h = heads.try_get().unwrap();
                    h.set_len(256);
                    slices.push(h.into());
                }
                let mut b = pool.try_get().unwrap();
                b.set_len(segs * 1472 - 256 * heads_n);
                slices.push(b.into());
                ring.send_to_with(id, TxBuf::Slices(slices), &to, 0)
                    .unwrap();
            }
            ring.flush(Duration::from_secs(5)).unwrap();
            let mut done: Vec<_> = ring
                .completions()
                .map(|(c, b)| (c, b.slices().len()))
                .collect();
            done.sort_by_key(|(c, _)| c.ticket);
            (done, ring.sock_fallbacks(id).to_vec())
        })
        .unwrap();
    for (i, (c, n)) in done.iter().enumerate() {
        assert_eq!(c.result(), Ok(c.len), "{c:?}");
        assert_eq!(*n, if i == 1 { 2 } else { 3 }, "every slice back");
        if i == 1 {
            // 16 pages: zero-copy.
            assert!(c.path.is_zero_copy(), "{c:?}");
            assert_ne!(c.zerocopy, ZcStatus::NotAttempted, "{c:?}");
        }
    }
    // 18 pages: where the kernel refuses the skb (EMSGSIZE), the train went by copy, and the
    // socket says why once.
    let copied = done
        .iter()
        .filter(|(c, _)| c.path == Path::UringCopy)
        .count();
    assert!(copied == 0 || copied == 2, "{done:?}");
    assert_eq!(
        fb.iter()
            .filter(|f| f.reason.contains("MAX_SKB_FRAGS"))
            .count(),
        usize::from(copied > 0),
        "{fb:?}"
    );
    eprintln!("18-page trains by copy: {copied} of 2");
}

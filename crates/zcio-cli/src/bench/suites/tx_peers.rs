//! The `tx` suite's many-peer and vectored cases, on the sink host (packets are dropped at its
//! device, before any local delivery: the one local path where zero-copy is not copied).
//!
//! **Many peers**: one unconnected UDP socket sends GSO trains (`segment`-byte datagrams,
//! `train` bytes per send) round-robin to `peers` destinations, three ways:
//!
//! - **sendmmsg + UDP_SEGMENT** (quinn-udp's way): `batch` trains per `sendmmsg`, each message
//!   with its destination and a `UDP_SEGMENT` control message; the kernel copies;
//! - **sendmsg(MSG_ZEROCOPY)** with the same control message: `tx::SendRing` on the `msg-zc`
//!   path (one `sendmsg` per train, completions from the error queue);
//! - **SENDMSG_ZC**: `tx::SendRing::send_to_with` on the ring (`uring-zc-fixed`: the pool is
//!   registered; `batch` trains per `io_uring_enter`).
//!
//! **Vectored**: a 256-byte header and a body (one train together) to the peers, three ways,
//! all on the ring (`uring-zc-fixed`): one vectored request (`send_to_with` of
//! [`TxBuf::Slices`]), the header and body copied into one buffer first, or two sends.
//!
//! Every way cycles through the same cold working set, warms up, then measures the sending
//! thread's CPU, the bytes completed and every system call it made.

use anyhow::{Context, Result};
use std::collections::VecDeque;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::time::Duration;
use zcio::stats::Report;
use zcio::sys::msg::{MsgHdr, MsgOpts};
use zcio::tx::{Dest, PoolBuf, SendRing, SendRingConfig, SenderConfig, TxBuf, TxMode};
use zcio_testnet::Sink;

/// Which sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Way {
    /// `sendmmsg` with `UDP_SEGMENT` per message (copy).
    Sendmmsg,
    /// `sendmsg(MSG_ZEROCOPY)` with `UDP_SEGMENT` (`SendRing`, `msg-zc`).
    MsgZerocopy,
    /// `SENDMSG_ZC` on the ring.
    SendmsgZc,
    /// Header + body as one vectored request.
    Vectored,
    /// Header and body copied into one buffer, one request.
    CopyIntoOne,
    /// Header and body as two requests.
    TwoSends,
}

/// One run's settings.
#[derive(Debug, Clone)]
pub(super) struct PeersOpts {
    pub(super) peers: usize,
    /// Bytes per train (header included for the vectored ways).
    pub(super) train: usize,
    pub(super) segment: u16,
    /// Vectored ways: the header's bytes.
    pub(super) header: usize,
    pub(super) warmup: Duration,
    pub(super) dur: Duration,
    /// Bytes of send buffers cycled through.
    pub(super) ws: usize,
    /// Trains per `sendmmsg` / per `io_uring_enter`.
    pub(super) batch: usize,
}

/// What one run measured (after the warm-up).
pub(super) use super::tx_many::ManyReport as PeersReport;
use super::tx_many::{buffers, Clock};

/// One measured run of `way` on the sink host, pinned to the first core.
pub(super) fn run(way: Way, o: &PeersOpts, sink: &Sink) -> Result<PeersReport> {
    let (score, _) = crate::bench::measure::core_plan(true);
    let (src, dst) = (sink.src4, sink.dst4);
    let o = o.clone();
    let before = sink.tx_counters().ok();
    let rep = sink.host.run(move || -> Result<PeersReport> {
        zcio_testnet::cpu::pin_thread(score).context("pinning")?;
        let sock = UdpSocket::bind(SocketAddrV4::new(src, 0))?;
        let dests: Vec<SocketAddr> = (0..o.peers)
            .map(|i| SocketAddr::from((dst, 1024 + i as u16)))
            .collect();
        match way {
            Way::Sendmmsg => sendmmsg(sock, &dests, &o),
            _ => ring(way, sock, &dests, &o),
        }
    })??;
    // The trains reached the device (where the sink drops them): one GSO packet each.
    if let (Some(b), Ok(a)) = (before, sink.tx_counters()) {
        anyhow::ensure!(
            a.0 + a.1 > b.0 + b.1,
            "nothing reached the sink's device ({b:?} -> {a:?})"
        );
    }
    Ok(rep)
}

/// quinn-udp's way: `batch` trains per `sendmmsg`, each with its destination and
/// `UDP_SEGMENT`.
fn sendmmsg(sock: UdpSocket, dests: &[SocketAddr], o: &PeersOpts) -> Result<PeersReport> {
    let (_pool, mut free) = buffers(o.train, o.ws, o.batch)?;
    for b in &mut free {
        b.set_len(o.train);
    }
    let mut hdrs: Vec<MsgHdr> = Vec::with_capacity(o.batch);
    let (mut bytes, mut sends, mut calls) = (0u64, 0u64, 0u64);
    let (mut b0, mut s0, mut c0) = (0, 0, 0);
    let mut clock = Clock::new(o.warmup, o.dur);
    let mut peer = 0;
    let mut batch: Vec<PoolBuf> = Vec::with_capacity(o.batch);
    loop {
        if clock.warm_done() {
            (b0, s0, c0) = (bytes, sends, calls);
        }
        if clock.over() {
            break;
        }
        hdrs.clear();
        for _ in 0..o.batch {
            let b = free.pop_front().expect("buffers");
            let opts = MsgOpts {
                dest: Some(dests[peer]),
                segment: Some(o.segment),
                tos: None,
            };
            peer = (peer + 1) % dests.len();
            let mut h = MsgHdr::new(&opts, false)?;
            h.point(&[(b.as_ptr(), b.len())])?;
            hdrs.push(h);
            batch.push(b);
        }
        let mut at = 0;
        while at < hdrs.len() {
            calls += 1;
            let k = zcio::sys::msg::sendmmsg(&sock, &mut hdrs[at..], 0).context("sendmmsg")?;
            at += k;
        }
        for b in batch.drain(..) {
            bytes += b.len() as u64;
            sends += 1;
            free.push_back(b);
        }
    }
    let (secs, cpu_s) = clock.stop();
    Ok(PeersReport {
        bytes: bytes - b0,
        sends: sends - s0,
        secs,
        cpu_s,
        syscalls: calls - c0,
        copied_fraction: None,
        note: format!(
            "sendmmsg: {} trains per call, each with its destination and UDP_SEGMENT (copied)",
            o.batch
        ),
    })
}

fn ring(way: Way, sock: UdpSocket, dests: &[SocketAddr], o: &PeersOpts) -> Result<PeersReport> {
    let depth = 256;
    let vectored = matches!(way, Way::Vectored | Way::CopyIntoOne | Way::TwoSends);
    let body = if vectored {
        o.train - o.header
    } else {
        o.train
    };
    // Vectored ways: bodies in page-aligned 64 KiB slots, so a header (its own page) and a
    // body span 17 pages, what one zero-copy skb holds (MAX_SKB_FRAGS); a body at an
    // unaligned offset would span 18, and the kernel would refuse the zero-copy train
    // (EMSGSIZE; the ring then sends it by copy, recorded).
    let slot = if vectored { 64 << 10 } else { o.train };
    let nh = 2 * depth + 2 * o.batch;
    let (pool, mut free) = buffers(slot, o.ws, 2 * depth + 2 * o.batch + nh)?;
    // Headers: slots of the same (registered) pool, so a header + body request can use the
    // pool as a fixed buffer; one per send in flight.
    let mut hfree: VecDeque<PoolBuf> = free.drain(..nh).collect();
    for b in hfree.iter_mut() {
        b.set_len(o.header);
        b.fill(0x48);
    }
    let mut ring = SendRing::new(&SendRingConfig {
        ring: zcio::RingConfig {
            entries: 1024,
            ..zcio::RingConfig::default()
        },
        files: 16,
        submit_batch: o.batch,
    })?;
    let mode = if way == Way::MsgZerocopy {
        TxMode::MsgZc
    } else {
        TxMode::UringZcFixed
    };
    if mode != TxMode::MsgZc {
        ring.register_pool(&pool).context("registering the pool")?;
    }
    let mut cfg = SenderConfig::new(mode);
    cfg.depth = depth;
    let id = ring.add(sock, &cfg)?;
    let (mut bytes, mut sends, mut errors) = (0u64, 0u64, 0u64);
    let first_error: std::cell::RefCell<Option<String>> = Default::default();
    let header = o.header;
    let mut base: Option<(zcio::stats::Counters, u64, u64)> = None;
    let mut clock = Clock::new(o.warmup, o.dur);
    let mut peer = 0;
    let take = |ring: &mut SendRing,
                free: &mut VecDeque<PoolBuf>,
                hfree: &mut VecDeque<PoolBuf>,
                bytes: &mut u64,
                sends: &mut u64,
                errors: &mut u64| {
        for (c, b) in ring.completions() {
            if let Some(e) = &c.error {
                *errors += 1;
                first_error
                    .borrow_mut()
                    .get_or_insert_with(|| format!("{e} ({} bytes, path {})", c.len, c.path));
            } else {
                *bytes += c.bytes as u64;
            }
            *sends += 1;
            let mut put = |b: TxBuf| {
                if let Some(p) = b.into_pool() {
                    // Headers are the only sends of their length.
                    if p.len() == header {
                        hfree.push_back(p);
                    } else {
                        free.push_back(p);
                    }
                }
            };
            match b {
                TxBuf::Slices(v) => v.into_iter().for_each(&mut put),
                b => put(b),
            }
        }
    };
    loop {
        if clock.warm_done() {
            base = Some((ring.counters(), bytes, sends));
        }
        if clock.over() {
            break;
        }
        if free.len() < 2 || hfree.is_empty() || !ring.can_send(id) {
            ring.wait(Duration::from_millis(100))?;
            take(
                &mut ring,
                &mut free,
                &mut hfree,
                &mut bytes,
                &mut sends,
                &mut errors,
            );
            continue;
        }
        let to = Dest::new(dests[peer]).segment(o.segment);
        peer = (peer + 1) % dests.len();
        let mut b = free.pop_front().expect("checked");
        let res = match way {
            Way::Sendmmsg => unreachable!("not on the ring"),
            Way::MsgZerocopy | Way::SendmsgZc => {
                b.set_len(o.train);
                ring.send_to_with(id, b, &to, 0)
            }
            Way::Vectored => {
                b.set_len(body);
                let h = hfree.pop_front().expect("checked");
                ring.send_to_with(id, TxBuf::Slices(vec![h.into(), b.into()]), &to, 0)
            }
            Way::CopyIntoOne => {
                // The header and a body from another buffer copied into one: the cost
                // a vectored send saves.
                let src = free.pop_front().expect("checked");
                b.set_len(o.train);
                let h = hfree.front().expect("checked");
                b[..o.header].copy_from_slice(h);
                b[o.header..].copy_from_slice(&src[..body]);
                free.push_back(src);
                ring.send_to_with(id, b, &to, 0)
            }
            Way::TwoSends => {
                let h = hfree.pop_front().expect("checked");
                b.set_len(body);
                let hd = Dest::new(to.addr);
                if let Err(r) = ring.send_to_with(id, h, &hd, 0) {
                    hfree.push_back(r.buf.into_pool().expect("pool"));
                    free.push_back(b);
                    continue;
                }
                ring.send_to_with(id, b, &to, 0)
            }
        };
        if let Err(r) = res {
            match r.buf {
                TxBuf::Slices(v) => {
                    let mut v = v.into_iter();
                    hfree.push_back(v.next().and_then(TxBuf::into_pool).expect("header"));
                    free.push_back(v.next().and_then(TxBuf::into_pool).expect("body"));
                }
                b => free.push_back(b.into_pool().expect("pool")),
            }
        }
        take(
            &mut ring,
            &mut free,
            &mut hfree,
            &mut bytes,
            &mut sends,
            &mut errors,
        );
    }
    let (secs, cpu_s) = clock.stop();
    let (c0, b0, s0) = base.unwrap_or_default();
    let c1 = ring.counters();
    let copied = {
        let zc = c1.zerocopy_bytes.saturating_sub(c0.zerocopy_bytes);
        let cp = c1.copied_bytes.saturating_sub(c0.copied_bytes);
        (zc + cp > 0).then(|| cp as f64 / (zc + cp) as f64)
    };
    let path = ring
        .sock_path(id)
        .map(|p| p.to_string())
        .unwrap_or_default();
    let fb: Vec<String> = ring
        .sock_fallbacks(id)
        .iter()
        .map(|f| f.to_string())
        .collect();
    ring.flush(Duration::from_secs(10))?;
    take(
        &mut ring,
        &mut free,
        &mut hfree,
        &mut bytes,
        &mut sends,
        &mut errors,
    );
    anyhow::ensure!(
        errors == 0,
        "{way:?}: {errors} sends failed, the first: {}",
        first_error.borrow().clone().unwrap_or_default()
    );
    let how = match way {
        Way::MsgZerocopy => "sendmsg(MSG_ZEROCOPY) with UDP_SEGMENT, one call per train",
        Way::SendmsgZc => "SENDMSG_ZC with the destination and UDP_SEGMENT",
        Way::Vectored => "one vectored request (header slice + body slice)",
        Way::CopyIntoOne => "header and body copied into one buffer, one request",
        Way::TwoSends => "header and body as two requests",
        Way::Sendmmsg => "",
    };
    Ok(PeersReport {
        bytes: bytes - b0,
        sends: sends - s0,
        secs,
        cpu_s,
        syscalls: c1.syscalls.saturating_sub(c0.syscalls),
        copied_fraction: copied,
        note: format!(
            "{how}; path {path}{}",
            if fb.is_empty() {
                String::new()
            } else {
                format!("; fallbacks: {}", fb.join("; "))
            }
        ),
    })
}

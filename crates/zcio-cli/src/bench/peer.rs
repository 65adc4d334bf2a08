//! `zcio bench --peer HOST`: the suites that cross a network (`tx`, `notify`, `rx`) run
//! against `zcio perf server` on another host, each measured run one perf test over the
//! control connection ([`crate::perf::test::run_test`]). Both hosts measure their own stream
//! threads' and whole-host CPU; the sender reports the COPIED fraction of each case on that
//! path. The suites call in here from the top of their `run` when `ctx.peer` is set.

use super::measure::size_label;
use super::{Better, Ctx, MetricDef, Sample};
use crate::perf::proto::{HostInfo, Params};
use crate::perf::test::{run_test, Outcome, TestSpec};
use crate::perf::{split_host_port, DEFAULT_PORT};
use anyhow::{Context, Result};
use serde::Serialize;
use std::sync::Mutex;
use std::time::Duration;
use zcio::tx::TxMode;

/// Suites that cross a network and run against a peer.
pub const NETWORK_SUITES: &[&str] = &["tx", "notify", "rx"];

/// What a suite measures when it runs against a peer (the report's line under its name).
pub fn about(suite: &str) -> Option<&'static str> {
    match suite {
        "tx" => Some(
            "two hosts: copy vs MSG_ZEROCOPY vs SEND_ZC (+fixed) over TCP to the peer's zcio perf \
             server; both hosts' CPU, COPIED fraction on that path",
        ),
        "notify" => Some(
            "two hosts: zero-copy completion cost over TCP to the peer: MSG_ZEROCOPY reaping \
             every send vs every 32, and vs io_uring notification CQEs",
        ),
        "rx" => Some(
            "two hosts: the peer sends, this host receives with epoll+recv vs the provided-buffer \
             ring (and auto: zcrx where the NIC can)",
        ),
        _ => None,
    }
}

/// The other host.
#[derive(Debug)]
pub struct Peer {
    /// As given (`HOST` or `HOST:PORT`).
    pub given: String,
    host: String,
    port: u16,
    hosts: Mutex<Option<(HostInfo, HostInfo)>>,
}

/// What `results.json` says about a two-host run.
#[derive(Debug, Clone, Serialize)]
pub struct PeerRun {
    /// The peer as given.
    pub host: String,
    /// This host, as seen by the tests (its NIC is the one that carried them).
    pub local: HostInfo,
    /// The peer host, as it reported itself.
    pub remote: HostInfo,
}

impl Peer {
    /// Parses `HOST[:PORT]` (port 5201 by default).
    pub fn new(given: &str) -> Result<Self> {
        let (host, port) = split_host_port(given)?;
        Ok(Self {
            given: given.to_string(),
            host,
            port: port.unwrap_or(DEFAULT_PORT),
            hosts: Mutex::new(None),
        })
    }

    /// Both hosts' descriptions once a test ran.
    pub fn run_info(&self) -> Option<PeerRun> {
        let g = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().map(|(l, r)| PeerRun {
            host: self.given.clone(),
            local: l.clone(),
            remote: r.clone(),
        })
    }

    /// Checks the peer answers: one short test. Returns its outcome.
    pub fn check(&self) -> Result<Outcome> {
        self.test(
            params(64 << 10, TxMode::Copy, Duration::from_millis(100)),
            1,
            1,
        )
        .with_context(|| {
            format!(
                "peer {} does not run a test: is `zcio perf server` running there?",
                self.given
            )
        })
    }

    fn test(&self, p: Params, notify_limit: usize, batch: usize) -> Result<Outcome> {
        let mut spec = TestSpec::new(&self.host, self.port, p);
        spec.notify_limit = notify_limit;
        spec.submit_batch = batch;
        let out = run_test(&spec, &mut |_| {})?;
        anyhow::ensure!(
            out.errors.is_empty(),
            "test against {} failed: {}",
            self.given,
            out.errors.join("; ")
        );
        let mut g = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        g.get_or_insert_with(|| (out.client.host.clone(), out.server.host.clone()));
        Ok(out)
    }
}

use crate::bench::wanted;

fn params(len: usize, tx: TxMode, dur: Duration) -> Params {
    Params {
        udp: false,
        streams: 1,
        duration_ms: dur.as_millis().max(1) as u64,
        reverse: false,
        len: len as u64,
        rate_bps: 0,
        tx: tx.to_string(),
        rx: "auto".into(),
        verify: false,
        // About 4 MB in flight, as the local tx suite.
        depth: ((4 << 20) / len).clamp(16, 1024) as u32,
        interval_ms: 0,
    }
}

/// `(quick, default, full)` by the run's mode.
fn by_mode<T>(ctx: &Ctx, quick: T, default: T, full: T) -> T {
    match ctx.mode {
        crate::bench::Mode::Quick => quick,
        crate::bench::Mode::Default => default,
        crate::bench::Mode::Full => full,
    }
}

fn run_time(ctx: &Ctx) -> Duration {
    // A two-host run is what the user came for: its default keeps the longer runs and the
    // size sweep of before (the local default is short).
    by_mode(
        ctx,
        Duration::from_millis(300),
        Duration::from_secs(1),
        Duration::from_secs(3),
    )
}

/// Both hosts' figures of one test as a sample.
fn sample(o: &Outcome) -> Sample {
    let (tx, rx) = (o.sender(), o.receiver());
    let mut s = Sample::default();
    let ops: u64 = tx.streams.iter().map(|x| x.ops).sum::<u64>().max(1);
    let notify: u64 = tx.streams.iter().map(|x| x.notify_syscalls).sum();
    s.set("throughput", rx.gbit_s)
        .set("mb_per_s", rx.bytes as f64 / rx.seconds.max(1e-9) / 1e6)
        .set("sender_cpu", tx.cpu_s_per_gb)
        .set("receiver_cpu", rx.cpu_s_per_gb)
        .set("sender_host_cpu", tx.host_cpu_s_per_gb)
        .set("receiver_host_cpu", rx.host_cpu_s_per_gb)
        .set("syscalls_per_send", tx.syscalls_per_op)
        .set("notify_syscalls_per_send", notify as f64 / ops as f64)
        .set("receiver_syscalls_per_op", rx.syscalls_per_op)
        // A copy send copies every byte.
        .set("copied_fraction", tx.copied_fraction.unwrap_or(1.0));
    if let Some(r) = tx.retransmits {
        s.set("retransmits", r as f64);
    }
    for st in tx.streams.iter().chain(&rx.streams) {
        for f in &st.fallbacks {
            s.note(format!("{}: fallback {f}", st.path));
        }
    }
    s
}

fn hosts_note(ctx: &mut Ctx, first: &Outcome) {
    let (c, s) = (&first.client.host, &first.server.host);
    ctx.note(format!(
        "two-host run: this host {} (kernel {}, {}) and peer {} = {} (kernel {}, {}); CPU is \
         measured on each host for its own side: stream threads (s/GB) and the whole host from \
         /proc/stat (`*_host_cpu`, includes softirq work outside the threads)",
        c.hostname, c.kernel, c.nic, first.host, s.hostname, s.kernel, s.nic
    ));
}

fn copied_note(ctx: &mut Ctx, case: &str, fr: &[f64]) {
    if fr.is_empty() {
        return;
    }
    let lo = fr.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = fr.iter().cloned().fold(0.0, f64::max);
    let verdict = if lo > 0.99 {
        "every completion COPIED: this path copies (local delivery, or a NIC without \
         scatter-gather/checksum offload)"
    } else if hi < 0.01 {
        "no completion COPIED: the NIC sent from the pages themselves"
    } else {
        "partly COPIED"
    };
    ctx.note(format!(
        "{case}: COPIED fraction measured on this path {lo:.3}..{hi:.3}: {verdict}"
    ));
}

const TX_METRICS: &[MetricDef] = &[
    MetricDef::new("sender_cpu", "s/GB", Better::Lower),
    MetricDef::new("receiver_cpu", "s/GB", Better::Lower),
    MetricDef::new("sender_host_cpu", "s/GB", Better::Lower),
    MetricDef::new("receiver_host_cpu", "s/GB", Better::Lower),
    MetricDef::new("throughput", "Gbit/s", Better::Higher),
    MetricDef::new("syscalls_per_send", "calls", Better::Lower),
    MetricDef::new("copied_fraction", "fraction", Better::Lower),
    MetricDef::new("retransmits", "segments", Better::Lower),
];

/// `tx` against the peer: copy vs each zero-copy path, TCP, a few write sizes.
pub fn tx(ctx: &mut Ctx, peer: &Peer) -> Result<()> {
    let first = peer.check()?;
    hosts_note(ctx, &first);
    let dur = run_time(ctx);
    let sizes: Vec<usize> = by_mode(
        ctx,
        vec![64 << 10],
        vec![4 << 10, 64 << 10, 256 << 10],
        vec![4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20],
    );
    ctx.note(format!(
        "each run is one {dur:?} TCP test against the peer's `zcio perf server` (it receives \
         with its default path); io_uring paths queue 16 sends per io_uring_enter; about 4 MB \
         in flight"
    ));
    for size in sizes {
        for mode in [TxMode::MsgZc, TxMode::UringZc, TxMode::UringZcFixed] {
            let case = format!("tcp-peer {} {mode}", size_label(size));
            if !wanted(&case) {
                continue;
            }
            let copied = std::cell::RefCell::new(Vec::new());
            ctx.compare(
                &case,
                ("copy", mode.to_string().as_str()),
                TX_METRICS,
                || {
                    Ok(sample(&peer.test(
                        params(size, TxMode::Copy, dur),
                        32,
                        16,
                    )?))
                },
                || {
                    let o = peer.test(params(size, mode, dur), 32, 16)?;
                    if let Some(f) = o.sender().copied_fraction {
                        copied.borrow_mut().push(f);
                    }
                    Ok(sample(&o))
                },
            )?;
            copied_note(ctx, &case, &copied.borrow());
        }
    }
    Ok(())
}

const NOTIFY_METRICS: &[MetricDef] = &[
    MetricDef::new("mb_per_s", "MB/s", Better::Higher),
    MetricDef::new("notify_syscalls_per_send", "calls", Better::Lower),
    MetricDef::new("syscalls_per_send", "calls", Better::Lower),
    MetricDef::new("sender_cpu", "s/GB", Better::Lower),
    MetricDef::new("receiver_cpu", "s/GB", Better::Lower),
    MetricDef::new("copied_fraction", "fraction", Better::Lower),
];

/// `notify` against the peer: MSG_ZEROCOPY reaping every send vs zcio's batched reaper vs
/// io_uring notification CQEs, 16K TCP writes.
pub fn notify(ctx: &mut Ctx, peer: &Peer) -> Result<()> {
    let first = peer.check()?;
    hosts_note(ctx, &first);
    let dur = run_time(ctx);
    let size = 16 << 10;
    let cases = [
        (
            "tcp-peer 16K msg-zc reap every send vs every 32",
            (TxMode::MsgZc, 1, 1),
            (TxMode::MsgZc, 32, 1),
            "msg-zc limit 1",
            "msg-zc limit 32",
        ),
        (
            "tcp-peer 16K msg-zc vs uring-zc",
            (TxMode::MsgZc, 32, 1),
            (TxMode::UringZc, 32, 16),
            "msg-zc limit 32",
            "uring-zc",
        ),
    ];
    for (case, a, b, la, lb) in cases {
        if !wanted(case) {
            continue;
        }
        let copied = std::cell::RefCell::new(Vec::new());
        ctx.compare(
            case,
            (la, lb),
            NOTIFY_METRICS,
            || Ok(sample(&peer.test(params(size, a.0, dur), a.1, a.2)?)),
            || {
                let o = peer.test(params(size, b.0, dur), b.1, b.2)?;
                if let Some(f) = o.sender().copied_fraction {
                    copied.borrow_mut().push(f);
                }
                Ok(sample(&o))
            },
        )?;
        copied_note(ctx, case, &copied.borrow());
    }
    Ok(())
}

const RX_METRICS: &[MetricDef] = &[
    MetricDef::new("throughput", "Gbit/s", Better::Higher),
    MetricDef::new("receiver_cpu", "s/GB", Better::Lower),
    MetricDef::new("receiver_host_cpu", "s/GB", Better::Lower),
    MetricDef::new("receiver_syscalls_per_op", "calls", Better::Lower),
    MetricDef::new("sender_cpu", "s/GB", Better::Lower),
];

/// `rx` against the peer: the peer sends (copy, `-R`), this host receives with epoll + recv
/// vs the provided-buffer ring (and zcrx where `auto` finds it).
pub fn rx(ctx: &mut Ctx, peer: &Peer) -> Result<()> {
    let first = peer.check()?;
    hosts_note(ctx, &first);
    let dur = run_time(ctx);
    ctx.note(
        "the peer sends 256K writes by copy (`-R`); this host receives: `plain` is the \
         library's epoll + recv backend, `bufring` the provided-buffer ring with multishot recv",
    );
    for zc in ["bufring", "auto"] {
        let case = format!("tcp-peer 256K plain vs {zc}");
        if !wanted(&case) {
            continue;
        }
        let mk = |rx: &str| Params {
            reverse: true,
            rx: rx.to_string(),
            ..params(256 << 10, TxMode::Copy, dur)
        };
        let mut paths = Vec::new();
        ctx.compare(
            &case,
            ("plain", zc),
            RX_METRICS,
            || Ok(sample(&peer.test(mk("plain"), 32, 1)?)),
            || {
                let o = peer.test(mk(zc), 32, 1)?;
                if let Some(s) = o.receiver().streams.first() {
                    paths.push(s.path.clone());
                }
                Ok(sample(&o))
            },
        )?;
        paths.dedup();
        ctx.note(format!("{case}: receive path used: {}", paths.join(", ")));
    }
    Ok(())
}

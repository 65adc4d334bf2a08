//! `zcio nfq`: a small NFQUEUE filter daemon on `zcio::netlink::NfQueue`.
//!
//! Accepts everything except what the rules drop (UDP/TCP destination ports, IP protocols),
//! prints stats periodically, and on SIGINT/SIGTERM decides every pending packet and unbinds.

use zcio::netlink::packet as filter;

use anyhow::{bail, Context, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use zcio::netlink::{CopyMode, Decision, NfQueue, NfQueueConfig, NfqStats, Packet, Verdict};

/// Options of `zcio nfq`.
#[derive(Debug, clap::Args)]
// A later option overrides an earlier one (a unit's defaults, then ZCIO_ARGS).
#[command(args_override_self = true)]
pub struct NfqArgs {
    /// Queue number or range `N-M` (one socket per queue; pair with `--queue-balance N:M`).
    #[arg(long)]
    pub queue: String,
    /// Verdicts are flushed after this many decided packets (and after every receive batch).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Accept packets when the queue is full instead of dropping them.
    #[arg(long)]
    pub fail_open: bool,
    /// Drop UDP packets to this destination port (repeatable).
    #[arg(long = "drop-udp-port")]
    pub drop_udp_port: Vec<u16>,
    /// Drop TCP packets to this destination port (repeatable).
    #[arg(long = "drop-tcp-port")]
    pub drop_tcp_port: Vec<u16>,
    /// Drop this IP protocol number (repeatable; 1 = ICMP, 58 = ICMPv6).
    #[arg(long = "drop-proto")]
    pub drop_proto: Vec<u8>,
    /// Verdict for packets whose ports a port rule needs but cannot see: later fragments,
    /// ESP, or a copy range that ends inside the headers.
    #[arg(long, value_enum, default_value_t = UnseenPolicy::Accept)]
    pub unseen: UnseenPolicy,
    /// Count packets per protocol and print the table on exit.
    #[arg(long)]
    pub count: bool,
    /// Bytes of each packet copied to user space (headers suffice for the rules); 0 is the
    /// whole packet, as the kernel takes it.
    #[arg(long, default_value_t = 128)]
    pub copy_range: u32,
    /// Maximum queue length in the kernel.
    #[arg(long)]
    pub max_len: Option<u32>,
    /// Receive GSO packets unsegmented.
    #[arg(long)]
    pub gso: bool,
    /// Seconds between stats lines (0: none).
    #[arg(long, default_value_t = 1.0)]
    pub stats_interval: f64,
    /// Consumer threads: the queue range is split into this many contiguous parts, each
    /// bound and decided by its own thread pinned to its own CPU. With
    /// `--queue-balance F:L --queue-cpu-fanout` on the rule and one queue per thread, a packet
    /// is queued, decided and reinjected on the CPU it arrived on.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Exit after this many seconds (for scripts and tests).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Serve the counters as Prometheus text on `ADDR:PORT` (`GET /metrics`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
}

/// What one consumer thread publishes for `--metrics`.
#[derive(Clone)]
struct Snapshot {
    queues: String,
    summary: zcio::stats::Summary,
    stats: NfqStats,
    /// `None` when the kernel's table cannot be read (it is root's, mode 0440).
    kernel: Option<Vec<zcio::netlink::KernelQueueStats>>,
}

fn snapshot(q: &NfQueue, (first, last): (u16, u16)) -> Snapshot {
    use zcio::stats::Report;
    Snapshot {
        queues: format!("{first}-{last}"),
        summary: q.summary(),
        stats: q.stats(),
        kernel: q.kernel_stats().ok(),
    }
}

/// `--metrics`: each consumer's report and counters (label `queues`), and the kernel's
/// per-queue counters (label `queue`): packets waiting, and the two kernel-side losses.
fn metrics(snaps: &[Option<Snapshot>], e: &mut crate::metrics::Exposition) {
    for s in snaps.iter().flatten() {
        let l = [("queues", s.queues.as_str())];
        e.report(&l, &s.summary);
        e.stats("zcio_nfq", &l, &s.stats, &["held"]);
        e.gauge(
            "zcio_nfq_kernel_counters_readable",
            "Whether the kernel's per-queue table (/proc/net/netfilter/nfnetlink_queue, \
             readable by root only) could be read: 0 means the zcio_nfq_kernel_* series are \
             missing",
            &l,
            f64::from(u8::from(s.kernel.is_some())),
        );
        for k in s.kernel.iter().flatten() {
            let q = k.queue.to_string();
            let l = [("queue", q.as_str())];
            e.gauge(
                "zcio_nfq_kernel_waiting",
                "Packets waiting for a verdict in the kernel's queue",
                &l,
                k.waiting as f64,
            );
            e.counter(
                "zcio_nfq_kernel_queue_dropped",
                "Packets the kernel dropped because the queue was full (lost; accepted \
                 instead with --fail-open)",
                &l,
                k.queue_dropped,
            );
            e.counter(
                "zcio_nfq_kernel_user_dropped",
                "Packets the kernel dropped because the netlink socket was full (lost)",
                &l,
                k.user_dropped,
            );
        }
    }
}

fn parse_range(s: &str) -> Result<(u16, u16)> {
    let (a, b) = match s.split_once('-') {
        Some((a, b)) => (a, b),
        None => (s, s),
    };
    let a: u16 = a
        .trim()
        .parse()
        .with_context(|| format!("queue number {a:?}"))?;
    let b: u16 = b
        .trim()
        .parse()
        .with_context(|| format!("queue number {b:?}"))?;
    if b < a {
        bail!("queue range {s} is empty");
    }
    Ok((a, b))
}

/// What `--unseen` does with a packet whose ports a port rule would need but cannot see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UnseenPolicy {
    /// Let it through (the first fragment, which carries the ports, is judged by the rules;
    /// dropping it makes the kernel discard the rest of the datagram at reassembly).
    Accept,
    /// Drop it.
    Drop,
}

struct Rules {
    udp: Vec<u16>,
    tcp: Vec<u16>,
    proto: Vec<u8>,
    unseen: UnseenPolicy,
}

impl Rules {
    /// The verdict for one packet:
    /// - not IPv4/IPv6, or no payload copied: accept (the rules are about IP);
    /// - the upper-layer protocol (after IPv4 options and AH, and every IPv6 extension
    ///   header) is in `--drop-proto`: drop;
    /// - UDP/TCP with visible ports: drop when the destination port is in the port rules;
    /// - ports a port rule would need but that are not visible (a later fragment, a copy range
    ///   that ends inside the headers, ESP): `--unseen` (accept by default);
    /// - anything else: accept.
    fn decide(&self, p: &Packet<'_>) -> Verdict {
        let Some(l4) = p.payload.and_then(filter::locate) else {
            return Verdict::Accept;
        };
        if self.proto.contains(&l4.proto) {
            return Verdict::Drop;
        }
        let ports = match l4.proto {
            17 => &self.udp,
            6 => &self.tcp,
            // Encrypted: the protocol inside is unknown, so any port rule could apply.
            50 if !(self.udp.is_empty() && self.tcp.is_empty()) => {
                return self.unseen_verdict();
            }
            _ => return Verdict::Accept,
        };
        match l4.ports {
            filter::Ports::Seen { dst, .. } if ports.contains(&dst) => Verdict::Drop,
            filter::Ports::Unseen(_) if !ports.is_empty() => self.unseen_verdict(),
            _ => Verdict::Accept,
        }
    }

    fn unseen_verdict(&self) -> Verdict {
        match self.unseen {
            UnseenPolicy::Accept => Verdict::Accept,
            UnseenPolicy::Drop => Verdict::Drop,
        }
    }
}

/// Splits queues `first..=last` into `threads` contiguous ranges (as even as possible).
fn split_queues(first: u16, last: u16, threads: usize) -> Vec<(u16, u16)> {
    let n = usize::from(last - first) + 1;
    let threads = threads.clamp(1, n);
    let mut v = Vec::new();
    let mut q = usize::from(first);
    for t in 0..threads {
        let k = n / threads + usize::from(t < n % threads);
        v.push((q as u16, (q + k - 1) as u16));
        q += k;
    }
    v
}

type ProtoCounts = std::collections::BTreeMap<u8, (u64, u64)>;

/// What a worker hands back when it stops.
struct Done {
    stats: NfqStats,
    left: u64,
    per_proto: ProtoCounts,
}

/// One consumer: binds its queues, decides until `stop`, then closes within the deadline.
fn worker(
    a: &NfqArgs,
    (first, last): (u16, u16),
    cpu: Option<usize>,
    stop: &AtomicBool,
    ready: std::sync::mpsc::Sender<Result<String>>,
    board: Option<(&crate::metrics::Board<Snapshot>, usize)>,
) -> Result<Done> {
    if let Some(cpu) = cpu {
        // Best effort: a consumer on the CPU its queue is fed from keeps the packet there.
        let _ = zcio_testnet::cpu::pin_thread(cpu);
    }
    let cfg = NfQueueConfig {
        first,
        last,
        copy: CopyMode::Packet(a.copy_range),
        max_len: a.max_len,
        fail_open: a.fail_open,
        gso: a.gso,
        batch: a.batch,
        ..NfQueueConfig::default()
    };
    let mut q = match NfQueue::open(cfg).with_context(|| format!("binding queue(s) {first}-{last}"))
    {
        Ok(q) => q,
        Err(e) => {
            let _ = ready.send(Err(anyhow::anyhow!("{e:#}")));
            return Err(e);
        }
    };
    let mut line = String::new();
    for f in q.fallbacks() {
        line.push_str(&format!("zcio nfq: fallback {f}\n"));
    }
    if let Err(e) = q.kernel_stats() {
        line.push_str(&format!(
            "zcio nfq: cannot read the kernel's queue table (/proc/net/netfilter/\
             nfnetlink_queue: {e}; it is root's, mode 0440): packets the kernel drops because \
             a queue is full or the socket is full are not counted here (the socket's \
             overruns still are)\n"
        ));
    }
    line.push_str(&format!(
        "zcio nfq: bound queue(s) {:?}, path {}, batch {}, copy range {}{}{}",
        q.queues(),
        q.path(),
        a.batch,
        a.copy_range,
        if a.fail_open { ", fail-open" } else { "" },
        cpu.map(|c| format!(", CPU {c}")).unwrap_or_default()
    ));
    let _ = ready.send(Ok(line));
    let rules = Rules {
        udp: a.drop_udp_port.clone(),
        tcp: a.drop_tcp_port.clone(),
        proto: a.drop_proto.clone(),
        unseen: a.unseen,
    };
    let mut per_proto = ProtoCounts::new();
    let interval = crate::util::interval("--stats-interval", a.stats_interval)?;
    let mut next_stats = interval.map(|i| Instant::now() + i);
    let mut last_rx = (Instant::now(), 0u64);
    while !stop.load(Ordering::Relaxed) {
        // Each call handles at most the queue's budget of packets and waits at most 20 ms,
        // so `stop` is seen promptly even when the queue is kept full.
        q.process(Some(Duration::from_millis(20)), |p| {
            let v = rules.decide(p);
            if a.count {
                let proto = p.payload.and_then(filter::locate).map_or(255, |l| l.proto);
                let e = per_proto.entry(proto).or_default();
                if v == Verdict::Drop {
                    e.1 += 1;
                } else {
                    e.0 += 1;
                }
            }
            Decision::Verdict(v)
        })?;
        if let Some((b, i)) = board {
            if b.wanted(i) {
                b.publish(i, snapshot(&q, (first, last)));
            }
        }
        let now = Instant::now();
        if let (Some(t), Some(i)) = (next_stats, interval) {
            if now >= t {
                let st = q.stats();
                let pps = (st.received - last_rx.1) as f64 / (now - last_rx.0).as_secs_f64();
                last_rx = (now, st.received);
                let k: Vec<String> = q
                    .kernel_stats()
                    .unwrap_or_default()
                    .iter()
                    .map(|k| {
                        format!(
                            "q{}: waiting {} queue_dropped {} user_dropped {}",
                            k.queue, k.waiting, k.queue_dropped, k.user_dropped
                        )
                    })
                    .collect();
                eprintln!(
                    "rx {} ({pps:.0}/s) accept {} drop {} batches {} singles {} held {} overruns {} send failures {} | {}",
                    st.received,
                    st.accepted,
                    st.dropped,
                    st.batches,
                    st.singles,
                    st.held,
                    st.overruns,
                    st.send_failures,
                    k.join("; ")
                );
                next_stats = Some(t + i);
            }
        }
    }
    let (stats, left) = q
        .close(Verdict::Accept, SHUTDOWN_DRAIN)
        .context("shutting down")?;
    Ok(Done {
        stats,
        left,
        per_proto,
    })
}

/// How long shutdown keeps deciding what the kernel still queues before it unbinds.
const SHUTDOWN_DRAIN: Duration = Duration::from_millis(25);

/// Runs the daemon: one consumer thread per range of queues (`--threads`), each pinned to
/// its own CPU when there are several; the main thread waits for SIGINT/SIGTERM or the
/// duration and stops them.
pub fn run(a: NfqArgs) -> Result<()> {
    let (first, last) = parse_range(&a.queue)?;
    crate::util::at_least_one("--batch", "batch size", a.batch)?;
    crate::util::at_least_one("--threads", "thread count", a.threads)?;
    if let Some(m) = a.max_len {
        // A queue of length 0 holds nothing: the kernel would drop (or, fail-open, accept)
        // every packet.
        crate::util::at_least_one("--max-len", "queue length", m)?;
    }
    let duration = a
        .duration
        .map(|d| crate::util::seconds("--duration", d))
        .transpose()?;
    crate::util::interval("--stats-interval", a.stats_interval)?;
    let sigfd = zcio::sys::signal::block_to_fd(&[libc::SIGINT, libc::SIGTERM])
        .context("blocking SIGINT/SIGTERM")?;
    let ranges = split_queues(first, last, a.threads);
    crate::privs::check(
        "nfq",
        &[crate::privs::Need {
            cap: crate::privs::CAP_NET_ADMIN,
            used_for: "binding NFQUEUE queues",
            without: None,
        }],
        Some((
            crate::privs::RING_NFQ * ranges.len() as u64,
            "frame-ring+recvmmsg",
        )),
    )?;
    let board = crate::metrics::start(a.metrics, "nfq", ranges.len(), metrics)?;
    let cpus = zcio_testnet::cpu::online_cpus().max(1);
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let end = duration.map(|d| start + d);
    let (signal, results) = std::thread::scope(|sc| -> Result<_> {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut handles = Vec::new();
        for (t, &range) in ranges.iter().enumerate() {
            let tx = tx.clone();
            let (a, stop) = (&a, &stop);
            let cpu = (ranges.len() > 1).then_some(t % cpus);
            let board = board.as_deref().map(|b| (b, t));
            handles.push(sc.spawn(move || worker(a, range, cpu, stop, tx, board)));
        }
        drop(tx);
        let mut bind_err = None;
        for r in rx.iter().take(ranges.len()) {
            match r {
                Ok(line) => eprintln!("{line}"),
                Err(e) => {
                    bind_err.get_or_insert(e);
                }
            }
        }
        let signal = if bind_err.is_some() {
            None
        } else {
            loop {
                let ready = zcio::sys::net::poll_one(&sigfd, libc::POLLIN, 20)
                    .context("waiting for signals")?;
                if ready > 0 {
                    if let Some(s) = zcio::sys::signal::read_signal(&sigfd)? {
                        break Some(s);
                    }
                }
                if end.is_some_and(|e| Instant::now() >= e)
                    || handles.iter().any(|h| h.is_finished())
                {
                    break None;
                }
            }
        };
        stop.store(true, Ordering::Relaxed);
        let results: Vec<Result<Done>> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("consumer thread panicked")))
            })
            .collect();
        if let Some(e) = bind_err {
            return Err(e);
        }
        Ok((signal, results))
    })?;
    let mut total = NfqStats::default();
    let mut left = 0;
    let mut per_proto = ProtoCounts::new();
    let mut first_err = None;
    for r in results {
        match r {
            Ok(d) => {
                total.add(&d.stats);
                left += d.left;
                for (p, (acc, drop)) in d.per_proto {
                    let e = per_proto.entry(p).or_default();
                    e.0 += acc;
                    e.1 += drop;
                }
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    match signal {
        Some(s) => eprintln!("zcio nfq: signal {s}: decided every pending packet, unbound"),
        None => eprintln!("zcio nfq: duration reached: decided every pending packet, unbound"),
    }
    println!("{}", serde_json::to_string(&total)?);
    if left > 0 {
        eprintln!("zcio nfq: {left} packet(s) were still in the kernel queue at unbind and were dropped by it");
    }
    if a.count {
        for (proto, (acc, drop)) in per_proto {
            println!("proto {proto:>3}: accepted {acc} dropped {drop}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_ranges_parse() {
        assert_eq!(parse_range("3").unwrap(), (3, 3));
        assert_eq!(parse_range("2-5").unwrap(), (2, 5));
        assert!(parse_range("5-2").is_err());
    }

    #[test]
    fn queues_split_evenly_across_threads() {
        assert_eq!(split_queues(0, 3, 2), vec![(0, 1), (2, 3)]);
        assert_eq!(split_queues(4, 8, 2), vec![(4, 6), (7, 8)]);
        assert_eq!(split_queues(0, 1, 8), vec![(0, 0), (1, 1)]);
        assert_eq!(split_queues(5, 5, 1), vec![(5, 5)]);
    }

    fn packet(payload: &[u8]) -> Packet<'_> {
        Packet {
            payload: Some(payload),
            ..Packet::default()
        }
    }

    fn rules(unseen: UnseenPolicy) -> Rules {
        Rules {
            udp: vec![53],
            tcp: vec![22],
            proto: vec![1],
            unseen,
        }
    }

    #[test]
    fn rules_see_ports_behind_ipv4_options_and_decide_unseen_ones_by_policy() {
        // IPv4 with 8 bytes of options, UDP to 53: the old fixed-offset reading missed it.
        let mut p = vec![0u8; 36];
        p[0] = 0x47;
        p[9] = 17;
        p[30..32].copy_from_slice(&53u16.to_be_bytes());
        assert_eq!(
            rules(UnseenPolicy::Accept).decide(&packet(&p)),
            Verdict::Drop
        );
        p[30..32].copy_from_slice(&54u16.to_be_bytes());
        assert_eq!(
            rules(UnseenPolicy::Accept).decide(&packet(&p)),
            Verdict::Accept
        );
        // A later fragment of a UDP datagram: ports unseen.
        p[6..8].copy_from_slice(&100u16.to_be_bytes());
        assert_eq!(
            rules(UnseenPolicy::Accept).decide(&packet(&p)),
            Verdict::Accept
        );
        assert_eq!(rules(UnseenPolicy::Drop).decide(&packet(&p)), Verdict::Drop);
        // ICMP is dropped by protocol; not-IP is accepted.
        p[6..8].copy_from_slice(&0u16.to_be_bytes());
        p[9] = 1;
        assert_eq!(
            rules(UnseenPolicy::Accept).decide(&packet(&p)),
            Verdict::Drop
        );
        assert_eq!(
            rules(UnseenPolicy::Drop).decide(&packet(&[0u8; 30])),
            Verdict::Accept
        );
    }

    #[test]
    fn rules_see_tcp_ports_behind_ipv6_extension_headers() {
        let mut p = vec![0u8; 40 + 8 + 16 + 20];
        p[0] = 0x60;
        p[6] = 0; // hop-by-hop
        p[40] = 60; // → destination options
        p[48] = 6; // → TCP
        p[49] = 1; // 16 bytes
        p[64 + 2..64 + 4].copy_from_slice(&22u16.to_be_bytes());
        assert_eq!(
            rules(UnseenPolicy::Accept).decide(&packet(&p)),
            Verdict::Drop
        );
        // Cut inside the destination options: unseen.
        assert_eq!(
            rules(UnseenPolicy::Drop).decide(&packet(&p[..56])),
            Verdict::Drop
        );
        assert_eq!(
            rules(UnseenPolicy::Accept).decide(&packet(&p[..56])),
            Verdict::Accept
        );
    }
}

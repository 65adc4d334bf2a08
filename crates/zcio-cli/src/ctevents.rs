//! `zcio conntrack events`: conntrack NEW/UPDATE/DESTROY events, one line each in
//! `conntrack -E`'s format (or JSON), written once per receive batch instead of once per
//! event; a loss summary on exit (the events the kernel dropped at the socket, exactly).

use anyhow::{bail, Context, Result};
use std::fmt::Write as _;
use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use zcio::netlink::{tcp_state_name, CtEvent, CtEvents, CtEventsConfig, CtStats, Tuple};

/// Options of `zcio conntrack events`.
#[derive(Debug, clap::Args)]
// A later option overrides an earlier one (a unit's defaults, then ZCIO_ARGS).
#[command(args_override_self = true)]
pub struct EventsArgs {
    /// One JSON object per line instead of `conntrack -E`'s text.
    #[arg(long)]
    pub json: bool,
    /// `conntrack -o`: `timestamp` (prefix each line with the receive time), `extended`
    /// (layer-3 protocol too); comma separated.
    #[arg(short = 'o', long = "output", value_delimiter = ',')]
    pub output: Vec<String>,
    /// Event kinds (`conntrack -e`): NEW, UPDATE, DESTROY or ALL; comma separated.
    #[arg(
        short = 'e',
        long = "event",
        value_delimiter = ',',
        default_value = "ALL"
    )]
    pub events: Vec<String>,
    /// Socket receive buffer in KiB (SO_RCVBUFFORCE, falls back to SO_RCVBUF, recorded).
    #[arg(short = 'B', long = "buffer-size", default_value_t = 8192)]
    pub buffer_kib: usize,
    /// NETLINK_NO_ENOBUFS: drop only what does not fit instead of everything until the queue
    /// is read empty; losses are still counted (the socket's drop counter).
    #[arg(long)]
    pub no_enobufs: bool,
    /// Fill frames with recvmmsg instead of io_uring.
    #[arg(long)]
    pub recvmmsg: bool,
    /// Exit after this many events.
    #[arg(short = 'c', value_name = "COUNT")]
    pub count: Option<u64>,
    /// Exit after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Seconds between stats lines on stderr (0: none).
    #[arg(long, default_value_t = 0.0)]
    pub stats_interval: f64,
    /// Serve the counters as Prometheus text on `ADDR:PORT` (`GET /metrics`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
}

/// What the receive loop publishes for `--metrics`.
#[derive(Clone)]
struct Snapshot {
    summary: zcio::stats::Summary,
    stats: CtStats,
    shown: u64,
}

/// `--metrics`: the report, the counters (events by kind; the loss counters: the events the
/// kernel dropped at the socket, overruns) and the events shown.
fn metrics(snaps: &[Option<Snapshot>], e: &mut crate::metrics::Exposition) {
    for s in snaps.iter().flatten() {
        e.report(&[], &s.summary);
        e.stats("zcio_conntrack", &[], &s.stats, &[]);
        e.counter(
            "zcio_conntrack_lost",
            "Events the kernel dropped at the socket (exact: its drop counter)",
            &[],
            s.stats.lost(),
        );
        e.counter(
            "zcio_conntrack_shown",
            "Events printed (the ones -e and -c let through)",
            &[],
            s.shown,
        );
    }
}

fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

fn json_tuple(out: &mut String, t: &Tuple, counters: Option<zcio::netlink::CtCounters>) {
    let _ = write!(out, "{{\"src\":\"{}\",\"dst\":\"{}\"", t.src, t.dst);
    if let Some(p) = t.src_port {
        let _ = write!(out, ",\"sport\":{p}");
    }
    if let Some(p) = t.dst_port {
        let _ = write!(out, ",\"dport\":{p}");
    }
    if let Some(x) = t.icmp_type {
        let _ = write!(out, ",\"type\":{x}");
    }
    if let Some(x) = t.icmp_code {
        let _ = write!(out, ",\"code\":{x}");
    }
    if let Some(x) = t.icmp_id {
        let _ = write!(out, ",\"id\":{x}");
    }
    if let Some(z) = t.zone {
        let _ = write!(out, ",\"zone\":{z}");
    }
    if let Some(c) = counters {
        let _ = write!(out, ",\"packets\":{},\"bytes\":{}", c.packets, c.bytes);
    }
    out.push('}');
}

/// One event as a JSON object (no newline).
fn json_line(out: &mut String, e: &CtEvent<'_>, t: Duration) {
    let c = &e.ct;
    let proto = c.orig.map_or(0, |o| o.proto);
    let _ = write!(
        out,
        "{{\"time\":{}.{:06},\"type\":\"{}\",\"family\":\"{}\",\"protonum\":{proto}",
        t.as_secs(),
        t.subsec_micros(),
        e.kind.as_str(),
        match e.family {
            2 => "ipv4",
            10 => "ipv6",
            _ => "unknown",
        }
    );
    if let Some(x) = c.timeout {
        let _ = write!(out, ",\"timeout\":{x}");
    }
    if let Some(tcp) = &c.tcp {
        let _ = write!(out, ",\"state\":\"{}\"", tcp_state_name(tcp.state));
    }
    if let Some(o) = &c.orig {
        out.push_str(",\"orig\":");
        json_tuple(out, o, c.counters_orig);
    }
    if let Some(r) = &c.reply {
        out.push_str(",\"reply\":");
        json_tuple(out, r, c.counters_reply);
    }
    if let Some(s) = c.status {
        let _ = write!(
            out,
            ",\"status\":{s},\"seen_reply\":{},\"assured\":{}",
            c.seen_reply(),
            c.assured()
        );
    }
    for (k, v) in [("mark", c.mark), ("id", c.id)] {
        if let Some(v) = v {
            let _ = write!(out, ",\"{k}\":{v}");
        }
    }
    if let Some(z) = c.zone {
        let _ = write!(out, ",\"zone\":{z}");
    }
    if let Some(ts) = c.timestamp {
        let _ = write!(out, ",\"start\":{}", ts.start);
        if let Some(s) = ts.stop {
            let _ = write!(out, ",\"stop\":{s}");
        }
    }
    if let Some(t) = c.event_time {
        let _ = write!(out, ",\"event_time\":{t}");
    }
    if let Some(h) = c.helper_name() {
        let _ = write!(
            out,
            ",\"helper\":{}",
            serde_json::to_string(&String::from_utf8_lossy(h)).unwrap_or_default()
        );
    }
    if e.portid != 0 {
        let _ = write!(out, ",\"portid\":{}", e.portid);
    }
    out.push('}');
}

fn summary(st: &CtStats) -> String {
    format!(
        "zcio conntrack: {} events (new {}, update {}, destroy {}), {} receive syscalls; {}",
        st.events,
        st.new,
        st.update,
        st.destroy,
        st.stream.syscalls,
        st.loss_summary()
    )
}

/// Runs `zcio conntrack events`.
pub fn run(a: EventsArgs) -> Result<()> {
    let sigfd = zcio::sys::signal::block_to_fd(&[libc::SIGINT, libc::SIGTERM])
        .context("blocking SIGINT/SIGTERM")?;
    let (mut new, mut update, mut destroy) = (false, false, false);
    for e in &a.events {
        match e.to_ascii_uppercase().as_str() {
            "NEW" => new = true,
            "UPDATE" => update = true,
            "DESTROY" => destroy = true,
            "ALL" => (new, update, destroy) = (true, true, true),
            other => bail!("unknown event kind {other:?} (NEW, UPDATE, DESTROY, ALL)"),
        }
    }
    if let Some(c) = a.count {
        crate::util::at_least_one("-c", "event count", c)?;
    }
    crate::util::at_least_one("-B", "buffer size", a.buffer_kib)?;
    let duration = a
        .duration
        .map(|d| crate::util::seconds("--duration", d))
        .transpose()?;
    let interval = crate::util::interval("--stats-interval", a.stats_interval)?;
    let (mut timestamp, mut extended) = (false, false);
    for o in &a.output {
        match o.as_str() {
            "timestamp" => timestamp = true,
            "extended" => extended = true,
            other => bail!("unknown output option {other:?} (timestamp, extended)"),
        }
    }
    crate::privs::check(
        "conntrack",
        &[crate::privs::Need {
            cap: crate::privs::CAP_NET_ADMIN,
            used_for: "joining the conntrack event groups",
            without: None,
        }],
        (!a.recvmmsg).then_some((crate::privs::RING_CT, "frame-ring+recvmmsg")),
    )?;
    let board = crate::metrics::start(a.metrics, "conntrack", 1, metrics)?;
    let mut ev = CtEvents::open(CtEventsConfig {
        new,
        update,
        destroy,
        rcvbuf: Some((a.buffer_kib << 10, true)),
        no_enobufs: a.no_enobufs,
        uring: !a.recvmmsg,
        ..CtEventsConfig::default()
    })
    .context("subscribing to conntrack events")?;
    for f in ev.fallbacks() {
        eprintln!("zcio conntrack: fallback {f}");
    }
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout());
    let mut buf = String::with_capacity(1 << 16);
    let start = Instant::now();
    let end = duration.map(|d| start + d);
    let mut next_stats = interval.map(|i| start + i);
    let shown = std::cell::Cell::new(0u64);
    let limit = a.count;
    let full = || limit.is_some_and(|c| shown.get() >= c);
    let line = |e: &CtEvent<'_>, buf: &mut String, t: Duration| {
        if full() {
            return;
        }
        shown.set(shown.get() + 1);
        if a.json {
            json_line(buf, e, t);
        } else {
            if timestamp {
                let _ = write!(buf, "[{}.{:06}]\t", t.as_secs(), t.subsec_micros());
            }
            let _ = e.write_conntrack(buf, extended, t.as_nanos() as u64);
        }
        buf.push('\n');
    };
    let signal = loop {
        if full() {
            break None;
        }
        // One clock read per receive batch, taken when its first event is handed over (after
        // the wait): every event of the batch gets the time it was received at.
        let mut t = None;
        ev.process(Some(Duration::from_millis(100)), |e| {
            let t = *t.get_or_insert_with(now);
            line(e, &mut buf, t)
        })
        .context("receiving events")?;
        if !buf.is_empty() {
            out.write_all(buf.as_bytes())?;
            out.flush()?;
            buf.clear();
        }
        if let Some(b) = board.as_deref().filter(|b| b.wanted(0)) {
            use zcio::stats::Report;
            b.publish(
                0,
                Snapshot {
                    summary: ev.summary(),
                    stats: ev.stats(),
                    shown: shown.get(),
                },
            );
        }
        if let Some(s) = zcio::sys::signal::read_signal(&sigfd)? {
            break Some(s);
        }
        let now_i = Instant::now();
        if end.is_some_and(|e| now_i >= e) {
            break None;
        }
        if let (Some(ns), Some(i)) = (next_stats, interval) {
            if now_i >= ns {
                eprintln!("{}", summary(&ev.stats()));
                next_stats = Some(ns + i);
            }
        }
    };
    // What is still queued.
    let t = now();
    while ev
        .process(Some(Duration::ZERO), |e| line(e, &mut buf, t))
        .context("receiving events")?
        > 0
    {}
    out.write_all(buf.as_bytes())?;
    out.flush()?;
    let st = ev.stats();
    if let Some(s) = signal {
        eprintln!("zcio conntrack: signal {s}");
    }
    let shown = shown.get();
    eprintln!("zcio conntrack: {shown} flow events have been shown.");
    eprintln!("{}", summary(&st));
    eprintln!(
        "zcio conntrack: stats {}",
        serde_json::json!({
            "events": st.events,
            "shown": shown,
            "new": st.new,
            "update": st.update,
            "destroy": st.destroy,
            "lost": st.lost(),
            "lost_at_least": st.loss.at_least,
            "lost_at_most": st.loss.at_most,
            "lost_exact": st.loss.exact,
            "overruns": st.stream.overruns,
            "syscalls": st.stream.syscalls,
            "datagrams": st.stream.datagrams,
            "parse_errors": st.stream.parse_errors,
            "path": ev.path().as_str(),
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use zcio::netlink::{Conntrack, CtCounters, CtEventKind};

    #[test]
    fn json_lines_parse_and_carry_the_fields() {
        let t = Tuple {
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            proto: 17,
            src_port: Some(5000),
            dst_port: Some(53),
            icmp_id: None,
            icmp_type: None,
            icmp_code: None,
            zone: None,
        };
        let e = CtEvent {
            kind: CtEventKind::Destroy,
            family: 2,
            portid: 0,
            ct: Conntrack {
                orig: Some(t),
                reply: Some(t),
                status: Some(2),
                counters_orig: Some(CtCounters {
                    packets: 1,
                    bytes: 60,
                }),
                ..Conntrack::default()
            },
        };
        let mut s = String::new();
        json_line(&mut s, &e, Duration::new(1_700_000_000, 5_000));
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["type"], "destroy");
        assert_eq!(v["orig"]["dport"], 53);
        assert_eq!(v["orig"]["packets"], 1);
        assert_eq!(v["seen_reply"], true);
        assert_eq!(v["time"].as_f64().unwrap(), 1_700_000_000.000005);
    }
}

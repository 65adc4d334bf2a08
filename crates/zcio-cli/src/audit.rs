//! `zcio audit`: the kernel's audit events, as the audit daemon (or beside one, as an
//! observer), one JSON object per event or auditd's own log lines (`--format auditd`, which
//! `ausearch -if` and `aureport -if` read); written once per receive batch; rotation by size
//! or time; the kernel's audit status at start and the loss summary at exit. Rules are
//! `auditctl`'s business.

use anyhow::{bail, Context, Result};
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use zcio::netlink::{audit_type_name, Audit, AuditConfig, AuditEvent, AuditMode, AuditStats};

/// Options of `zcio audit`.
#[derive(Debug, clap::Args)]
// A later option overrides an earlier one (a unit's defaults, then ZCIO_ARGS).
#[command(args_override_self = true)]
pub struct AuditArgs {
    /// Read beside the registered audit daemon (AUDIT_NLGRP_READLOG, CAP_AUDIT_READ) instead
    /// of registering as the daemon.
    #[arg(long)]
    pub observer: bool,
    /// Fail instead of becoming an observer when another daemon is registered.
    #[arg(long)]
    pub no_fallback: bool,
    /// Output: `json` (one object per event) or `auditd` (auditd's RAW log lines).
    #[arg(long, default_value = "json")]
    pub format: String,
    /// Write to FILE instead of stdout.
    #[arg(short = 'w', value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Start a new file after this many bytes (`64M`); the old ones become FILE.1, FILE.2, ...
    #[arg(short = 'C', value_name = "SIZE", value_parser = crate::util::parse_size)]
    pub rotate_size: Option<usize>,
    /// Start a new file after this many seconds.
    #[arg(short = 'G', value_name = "SECS")]
    pub rotate_secs: Option<f64>,
    /// Keep this many rotated files (FILE.1 .. FILE.N).
    #[arg(long, default_value_t = 5)]
    pub num_logs: u32,
    /// Primary: the kernel's backlog limit (records); set back at exit.
    #[arg(short = 'b', long)]
    pub backlog_limit: Option<u32>,
    /// Primary: how long a task waits for room in the backlog (the kernel's unit; 0: drop
    /// at once); set back at exit.
    #[arg(long)]
    pub backlog_wait_time: Option<u32>,
    /// Primary: records per second (0: no limit); set back at exit.
    #[arg(long)]
    pub rate_limit: Option<u32>,
    /// Primary: leave auditing as it is instead of turning it on (it is set back at exit).
    #[arg(long)]
    pub no_enable: bool,
    /// Milliseconds an event without an end-of-event record stays open after its last record.
    #[arg(long, default_value_t = 500)]
    pub event_wait_ms: u64,
    /// Socket receive buffer in KiB (SO_RCVBUFFORCE, falls back to SO_RCVBUF, recorded).
    #[arg(short = 'B', long = "buffer-size", default_value_t = 8192)]
    pub buffer_kib: usize,
    /// Fill frames with recvmmsg instead of io_uring.
    #[arg(long)]
    pub recvmmsg: bool,
    /// io_uring: records to gather per wait before handling them (at most 64, what one
    /// receive batch takes).
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// io_uring: milliseconds the first record of a wait may be held back while more come
    /// (Linux 6.12; records wait in the socket meanwhile, not in the kernel's backlog, so
    /// this costs latency, never loss). Each wake-up costs a context switch: at 1,000
    /// events/s, 10 ms took half the CPU per event of 1 ms.
    #[arg(long, default_value_t = 10.0)]
    pub min_wait_ms: f64,
    /// Exit after this many events.
    #[arg(short = 'c', value_name = "COUNT")]
    pub count: Option<u64>,
    /// Exit after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Seconds between stats lines on stderr (0: none).
    #[arg(long, default_value_t = 0.0)]
    pub stats_interval: f64,
    /// Stats lines (periodic and at exit) as JSON.
    #[arg(long)]
    pub json: bool,
    /// Serve the counters as Prometheus text on `ADDR:PORT` (`GET /metrics`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
}

/// What the receive loop publishes for `--metrics`.
#[derive(Clone)]
struct Snapshot {
    summary: zcio::stats::Summary,
    stats: AuditStats,
    shown: u64,
}

fn metrics(snaps: &[Option<Snapshot>], e: &mut crate::metrics::Exposition) {
    for s in snaps.iter().flatten() {
        e.report(&[], &s.summary);
        e.stats("zcio_audit", &[], &s.stats, &["open_events"]);
        e.counter(
            "zcio_audit_lost_at_least",
            "Records lost: the kernel's lost counter's growth since start plus the socket's \
             drops (a lower bound where the counter was reset or unreadable)",
            &[],
            s.stats.loss.at_least,
        );
        e.counter("zcio_audit_shown", "Events written", &[], s.shown);
    }
}

/// One event as a JSON object (no newline): serial, time, how it ended, whether records are
/// known missing, and its records with their fields decoded (hex strings too) and raw text.
pub fn json_event(out: &mut String, ev: &AuditEvent) {
    let _ = write!(
        out,
        "{{\"serial\":{},\"time\":{}.{:03},\"end\":\"{}\",\"incomplete\":{},\"records\":[",
        ev.serial,
        ev.sec,
        ev.msec,
        ev.end.as_str(),
        ev.incomplete()
    );
    let q = |s: &[u8]| serde_json::to_string(&String::from_utf8_lossy(s)).unwrap_or_default();
    for (i, r) in ev.records().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{{\"type\":{}", r.ty);
        if let Some(n) = audit_type_name(r.ty) {
            let _ = write!(out, ",\"name\":\"{n}\"");
        }
        out.push_str(",\"fields\":{");
        for (j, f) in r.fields().filter(|f| !f.key.is_empty()).enumerate() {
            if j > 0 {
                out.push(',');
            }
            let _ = write!(out, "{}:{}", q(f.key), q(&f.value()));
        }
        let _ = write!(out, "}},\"text\":{}}}", q(r.body));
    }
    out.push_str("]}");
}

/// Output file with auditd-style rotation (FILE -> FILE.1 -> FILE.2 ...).
struct Out {
    path: Option<PathBuf>,
    sink: Box<dyn Write>,
    bytes: u64,
    started: Instant,
    size: Option<u64>,
    every: Option<Duration>,
    keep: u32,
    rotations: u32,
}

impl Out {
    fn open(
        path: Option<PathBuf>,
        size: Option<u64>,
        every: Option<Duration>,
        keep: u32,
    ) -> Result<Self> {
        if path.is_none() && (size.is_some() || every.is_some()) {
            bail!("rotation (-C, -G) needs a file (-w FILE)");
        }
        let sink: Box<dyn Write> = match &path {
            Some(p) => Box::new(
                File::options()
                    .create(true)
                    .append(true)
                    .open(p)
                    .with_context(|| format!("opening {}", p.display()))?,
            ),
            None => Box::new(std::io::stdout()),
        };
        Ok(Self {
            path,
            sink,
            bytes: 0,
            started: Instant::now(),
            size,
            every,
            keep: keep.max(1),
            rotations: 0,
        })
    }

    fn write(&mut self, b: &[u8]) -> Result<()> {
        if b.is_empty() {
            return Ok(());
        }
        self.sink.write_all(b)?;
        self.sink.flush()?;
        self.bytes += b.len() as u64;
        let due = self.size.is_some_and(|s| self.bytes >= s)
            || self.every.is_some_and(|d| self.started.elapsed() >= d);
        if due {
            self.rotate()?;
        }
        Ok(())
    }

    fn rotate(&mut self) -> Result<()> {
        let Some(p) = self.path.clone() else {
            return Ok(());
        };
        let name = |n: u32| {
            let mut s = p.as_os_str().to_os_string();
            s.push(format!(".{n}"));
            PathBuf::from(s)
        };
        for n in (1..self.keep).rev() {
            let _ = std::fs::rename(name(n), name(n + 1));
        }
        std::fs::rename(&p, name(1)).with_context(|| format!("rotating {}", p.display()))?;
        self.sink =
            Box::new(File::create(&p).with_context(|| format!("creating {}", p.display()))?);
        self.bytes = 0;
        self.started = Instant::now();
        self.rotations += 1;
        Ok(())
    }
}

fn summary(st: &AuditStats, shown: u64) -> String {
    format!(
        "zcio audit: {} events ({} records; {} closed by EOE, {} single, {} after the wait), {} \
         written, {} receive syscalls; {}",
        st.events.events,
        st.events.records,
        st.events.eoe,
        st.events.single,
        st.events.waited,
        shown,
        st.stream.syscalls,
        st.loss_summary()
    )
}

fn stats_json(st: &AuditStats, shown: u64, path: &str) -> serde_json::Value {
    serde_json::json!({
        "mode": st.mode.map(AuditMode::as_str),
        "events": st.events.events,
        "records": st.events.records,
        "shown": shown,
        "eoe": st.events.eoe,
        "single": st.events.single,
        "waited": st.events.waited,
        "incomplete": st.events.incomplete,
        "evicted": st.events.evicted,
        "open_events": st.open_events,
        "kernel_lost_at_open": st.kernel_lost_at_open,
        "kernel_lost_now": st.kernel_lost_now,
        "socket_drops": st.stream.kernel_drops,
        "lost_at_least": st.loss.at_least,
        "lost_at_most": st.loss.at_most,
        "lost_exact": st.loss.exact,
        "syscalls": st.stream.syscalls,
        "datagrams": st.stream.datagrams,
        "parse_errors": st.stream.parse_errors,
        "path": path,
    })
}

/// Runs `zcio audit`.
pub fn run(a: AuditArgs) -> Result<()> {
    let sigfd = zcio::sys::signal::block_to_fd(&[libc::SIGINT, libc::SIGTERM])
        .context("blocking SIGINT/SIGTERM")?;
    let auditd = match a.format.as_str() {
        "json" => false,
        "auditd" => true,
        other => bail!("unknown --format {other:?} (json, auditd)"),
    };
    if let Some(c) = a.count {
        crate::util::at_least_one("-c", "event count", c)?;
    }
    crate::util::at_least_one("-B", "buffer size", a.buffer_kib)?;
    let duration = a
        .duration
        .map(|d| crate::util::seconds("--duration", d))
        .transpose()?;
    let every = a
        .rotate_secs
        .map(|d| crate::util::seconds("-G", d))
        .transpose()?;
    let interval = crate::util::interval("--stats-interval", a.stats_interval)?;
    let mut out = Out::open(
        a.file.clone(),
        a.rotate_size.map(|s| s as u64),
        every,
        a.num_logs,
    )?;
    let board = crate::metrics::start(a.metrics, "audit", 1, metrics)?;
    let mut au = Audit::open(AuditConfig {
        mode: if a.observer {
            AuditMode::Observer
        } else {
            AuditMode::Primary
        },
        fallback: !a.no_fallback,
        enable: !a.no_enable,
        backlog_limit: a.backlog_limit,
        backlog_wait_time: a.backlog_wait_time,
        rate_limit: a.rate_limit,
        event_wait: Duration::from_millis(a.event_wait_ms),
        rcvbuf: Some((a.buffer_kib << 10, true)),
        uring: !a.recvmmsg,
        batch: a.batch.max(1),
        min_wait: Duration::from_secs_f64(a.min_wait_ms.max(0.0) / 1e3),
        ..AuditConfig::default()
    })
    .context("opening the audit socket (root or CAP_AUDIT_CONTROL / CAP_AUDIT_READ, the initial namespaces)")?;
    match au.status_at_open() {
        Some(s) => eprintln!("zcio audit: kernel audit status at start: {s}"),
        None => eprintln!("zcio audit: kernel audit status unreadable (AUDIT_GET refused)"),
    }
    if let Ok(s) = au.kernel_status() {
        eprintln!(
            "zcio audit: {} ({}); now: {s}",
            au.mode().as_str(),
            au.path()
        );
    }
    for f in au.fallbacks() {
        eprintln!("zcio audit: fallback {f}");
    }
    let mut text = String::with_capacity(1 << 16);
    let mut bytes = Vec::with_capacity(1 << 16);
    let start = Instant::now();
    let end = duration.map(|d| start + d);
    let mut next_stats = interval.map(|i| start + i);
    let mut shown = 0u64;
    let mut next_signal_check = start;
    let limit = a.count;
    let emit = |ev: &AuditEvent, text: &mut String, bytes: &mut Vec<u8>, shown: &mut u64| {
        if limit.is_some_and(|c| *shown >= c) {
            return;
        }
        *shown += 1;
        if auditd {
            ev.write_auditd(bytes);
        } else {
            json_event(text, ev);
            text.push('\n');
        }
    };
    let signal = loop {
        if limit.is_some_and(|c| shown >= c) {
            break None;
        }
        au.process(Some(Duration::from_millis(100)), |ev| {
            emit(ev, &mut text, &mut bytes, &mut shown)
        })
        .context("receiving audit records")?;
        out.write(text.as_bytes())?;
        out.write(&bytes)?;
        text.clear();
        bytes.clear();
        if let Some(b) = board.as_deref().filter(|b| b.wanted(0)) {
            use zcio::stats::Report;
            b.publish(
                0,
                Snapshot {
                    summary: au.summary(),
                    stats: au.stats(),
                    shown,
                },
            );
        }
        let now = Instant::now();
        // The signal descriptor is read every 20 ms at most, not after every batch: one
        // syscall per batch is a measurable share of a small batch's cost.
        if now >= next_signal_check {
            next_signal_check = now + Duration::from_millis(20);
            if let Some(s) = zcio::sys::signal::read_signal(&sigfd)? {
                break Some(s);
            }
        }
        if end.is_some_and(|e| now >= e) {
            break None;
        }
        if let (Some(ns), Some(i)) = (next_stats, interval) {
            if now >= ns {
                let st = au.stats();
                if a.json {
                    eprintln!("{}", stats_json(&st, shown, au.path().as_str()));
                } else {
                    eprintln!("{}", summary(&st, shown));
                }
                next_stats = Some(ns + i);
            }
        }
    };
    // Stop being the daemon, then write what is queued and what is still open.
    if let Err(e) = au.unregister() {
        eprintln!("zcio audit: setting the audit state back: {e}");
    }
    while au
        .process(Some(Duration::ZERO), |ev| {
            emit(ev, &mut text, &mut bytes, &mut shown)
        })
        .context("receiving audit records")?
        > 0
    {}
    au.flush(|ev| emit(ev, &mut text, &mut bytes, &mut shown));
    out.write(text.as_bytes())?;
    out.write(&bytes)?;
    let st = au.stats();
    if let Some(s) = signal {
        eprintln!("zcio audit: signal {s}");
    }
    if let Ok(s) = au.kernel_status() {
        eprintln!("zcio audit: kernel audit status at exit: {s}");
    }
    eprintln!("{}", summary(&st, shown));
    eprintln!(
        "zcio audit: stats {}",
        stats_json(&st, shown, au.path().as_str())
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_events_parse_and_carry_decoded_fields() {
        // An event as the grouper builds it, from records parsed in place.
        let ev = zcio::netlink::group_audit_records(&[
            (
                1300,
                &b"audit(1700000000.005:9): syscall=257 comm=\"sh\" key=\"k\""[..],
            ),
            (1327, &b"audit(1700000000.005:9): proctitle=7368002D63"[..]),
            (1320, &b"audit(1700000000.005:9): "[..]),
        ])
        .unwrap()
        .remove(0);
        let mut s = String::new();
        json_event(&mut s, &ev);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["serial"], 9);
        assert_eq!(v["end"], "eoe");
        assert_eq!(v["records"][0]["name"], "SYSCALL");
        assert_eq!(v["records"][0]["fields"]["comm"], "sh");
        assert_eq!(v["records"][1]["fields"]["proctitle"], "sh\u{0}-c");
        assert_eq!(v["time"].as_f64().unwrap(), 1_700_000_000.005);
    }
}

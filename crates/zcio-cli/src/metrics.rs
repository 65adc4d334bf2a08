//! `--metrics ADDR:PORT`: a daemon's counters as Prometheus text exposition (format 0.0.4),
//! served over HTTP/1.1 by one thread on `std` sockets.
//!
//! The series come from the same values the stats line and `--json` print, so there is no
//! second set of counters:
//! - [`Exposition::report`] renders a [`zcio::stats::Summary`] (what every capability's
//!   `stats::Report` gives): `zcio_path_info{path}`, the common counters as
//!   `zcio_report_*_total`, and every fallback as `zcio_fallbacks{from,to,reason}`;
//! - [`Exposition::stats`] renders every number of a daemon's own stats struct (the one its
//!   `--json` serializes) as `zcio_<command>_<field>`: counters unless named as gauges;
//! - [`Exposition::counter`], [`Exposition::gauge`] and [`Exposition::histogram`] add what a
//!   daemon has beyond those (per-queue kernel counters, per-group losses, latency
//!   histograms).
//!
//! A daemon's threads publish snapshots into a [`Board`]; a scrape asks for fresh ones
//! ([`Board::wanted`] is one atomic load per loop turn, so an unscraped daemon does no extra
//! work), waits at most [`FRESH_WAIT`] for them, and renders what it has.

use anyhow::{Context, Result};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use zcio::stats::{Fallback, Summary};

/// How long a scrape waits for the daemon's threads to publish fresh snapshots (a thread
/// blocked in a longer wait is rendered from its last snapshot).
pub const FRESH_WAIT: Duration = Duration::from_millis(500);

/// Longest request head accepted (a scraper's is a few hundred bytes).
const MAX_REQUEST: usize = 8192;

/// How long a client may take to send its request or read the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// The text exposition's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The kind of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows (named `..._total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative buckets with `_bucket{le}`, `_sum`, `_count`.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Label pairs of one series.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

#[derive(Debug)]
struct Family {
    name: String,
    kind: Kind,
    help: String,
    /// Rendered sample lines (each with its newline), in the order added.
    lines: String,
    /// Label sets already used (a series appears once).
    series: Vec<String>,
}

/// One scrape's metric families, rendered in the order they were first added. Names and
/// label names are the caller's (constants, or [`sanitize`]d field names); the unit tests parse
/// every kind of page strictly. Samples of a
/// family stay together whatever order they are added in (several threads' snapshots add to
/// the same families), and a series added twice is kept once (the first value).
#[derive(Debug, Default)]
pub struct Exposition {
    families: Vec<Family>,
    index: HashMap<String, usize>,
}

/// A label value with `\`, `"` and newlines escaped.
fn escape_value(out: &mut String, v: &str) {
    for ch in v.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// `{a="x",b="y"}` (empty for no labels).
fn label_set(labels: Labels<'_>) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let mut s = String::from("{");
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(k);
        s.push_str("=\"");
        escape_value(&mut s, v);
        s.push('"');
    }
    s.push('}');
    s
}

/// A sample value as the text format wants it.
fn value_text(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// `name` as a metric name: characters outside `[a-zA-Z0-9_:]` become `_`.
pub fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Exposition {
    /// An empty exposition.
    pub fn new() -> Self {
        Self::default()
    }

    fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Family {
        let i = *self.index.entry(name.to_string()).or_insert_with(|| {
            self.families.push(Family {
                name: name.to_string(),
                kind,
                help: help.replace('\\', "\\\\").replace('\n', "\\n"),
                lines: String::new(),
                series: Vec::new(),
            });
            self.families.len() - 1
        });
        &mut self.families[i]
    }

    fn sample(&mut self, name: &str, kind: Kind, help: &str, labels: Labels<'_>, v: &str) {
        let set = label_set(labels);
        let f = self.family(name, kind, help);
        if f.series.contains(&set) {
            return;
        }
        let _ = writeln!(f.lines, "{name}{set} {v}");
        f.series.push(set);
    }

    /// A counter sample; `_total` is appended to `name` unless it ends so.
    pub fn counter(&mut self, name: &str, help: &str, labels: Labels<'_>, v: u64) {
        let name = if name.ends_with("_total") {
            name.to_string()
        } else {
            format!("{name}_total")
        };
        self.sample(&name, Kind::Counter, help, labels, &v.to_string());
    }

    /// A gauge sample.
    pub fn gauge(&mut self, name: &str, help: &str, labels: Labels<'_>, v: f64) {
        self.sample(name, Kind::Gauge, help, labels, &value_text(v));
    }

    /// A histogram: `buckets` are (upper bound, observations in that bucket alone), bounds
    /// ascending; the `+Inf` bucket is added (and holds what lies above the last bound, which
    /// may be `f64::INFINITY` itself). `sum` is the sum of the observations, where it is
    /// known (a log2 histogram kept without it has none: `_sum` is then left out, as
    /// OpenMetrics allows, rather than made up).
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: Labels<'_>,
        buckets: &[(f64, u64)],
        sum: Option<f64>,
    ) {
        let set = label_set(labels);
        let f = self.family(name, Kind::Histogram, help);
        if f.series.contains(&set) {
            return;
        }
        let mut cum = 0u64;
        let with_le = |le: &str| {
            let mut l: Vec<(&str, &str)> = labels.to_vec();
            l.push(("le", le));
            label_set(&l)
        };
        for &(le, n) in buckets {
            cum += n;
            if le.is_infinite() {
                continue;
            }
            let _ = writeln!(f.lines, "{name}_bucket{} {cum}", with_le(&value_text(le)));
        }
        let _ = writeln!(f.lines, "{name}_bucket{} {cum}", with_le("+Inf"));
        if let Some(sum) = sum {
            let _ = writeln!(f.lines, "{name}_sum{set} {}", value_text(sum));
        }
        let _ = writeln!(f.lines, "{name}_count{set} {cum}");
        f.series.push(set);
    }

    /// One fallback as `zcio_fallbacks{from,to,reason,...}`: how many times it was recorded.
    pub fn fallback(&mut self, labels: Labels<'_>, from: &str, to: &str, reason: &str, n: u64) {
        let mut l: Vec<(&str, &str)> = labels.to_vec();
        l.extend([("from", from), ("to", to), ("reason", reason)]);
        self.gauge(
            "zcio_fallbacks",
            "Fallbacks recorded: the path or setting wanted (from), the one taken (to) and why; \
             the value is how many times it was recorded",
            &l,
            n as f64,
        );
    }

    /// Fallbacks in their displayed form (`from -> to: reason`, as [`Fallback`] prints and
    /// as strings carry them), counted by their text.
    pub fn fallback_lines<S: AsRef<str>>(&mut self, labels: Labels<'_>, lines: &[S]) {
        let mut seen: Vec<(&str, u64)> = Vec::new();
        for l in lines {
            match seen.iter_mut().find(|(s, _)| *s == l.as_ref()) {
                Some(e) => e.1 += 1,
                None => seen.push((l.as_ref(), 1)),
            }
        }
        for (line, n) in seen {
            let (from, to, reason) = match line.split_once(" -> ") {
                Some((from, rest)) => match rest.split_once(": ") {
                    Some((to, reason)) => (from, to, reason),
                    None => (from, rest, ""),
                },
                None => ("", "", line),
            };
            self.fallback(labels, from, to, reason, n);
        }
    }

    /// A capability's [`zcio::stats::Report`] summary: its path (`zcio_path_info`), the common
    /// counters (`zcio_report_*_total`) and its fallbacks (`zcio_fallbacks`).
    pub fn report(&mut self, labels: Labels<'_>, s: &Summary) {
        let path = s.path.to_string();
        let mut l: Vec<(&str, &str)> = labels.to_vec();
        l.push(("path", &path));
        self.gauge(
            "zcio_path_info",
            "The path in use (label path); always 1",
            &l,
            1.0,
        );
        let c = &s.counters;
        for (name, help, v) in [
            ("zcio_report_bytes", "Payload bytes moved", c.bytes),
            (
                "zcio_report_ops",
                "Operations (packets, events, sends, receives)",
                c.ops,
            ),
            (
                "zcio_report_syscalls",
                "System calls zcio made (io_uring_enter included)",
                c.syscalls,
            ),
            (
                "zcio_report_notifications",
                "Completion notifications processed",
                c.notifications,
            ),
            (
                "zcio_report_zerocopy_bytes",
                "Bytes the kernel moved without copying",
                c.zerocopy_bytes,
            ),
            (
                "zcio_report_copied_bytes",
                "Bytes a zero-copy path reported as copied (COPIED)",
                c.copied_bytes,
            ),
        ] {
            self.counter(name, help, labels, v);
        }
        self.fallbacks(labels, &s.fallbacks);
    }

    /// Typed fallbacks (see [`Exposition::fallback`]).
    pub fn fallbacks(&mut self, labels: Labels<'_>, fallbacks: &[Fallback]) {
        let lines: Vec<String> = fallbacks.iter().map(|f| f.to_string()).collect();
        self.fallback_lines(labels, &lines);
    }

    /// Every number in `stats` (a daemon's stats struct, as its `--json` serializes it) as
    /// `<prefix>_<field>`: integers are counters unless their field is in `gauges`; floats
    /// and booleans are gauges. Nested objects join their names with `_`; strings and arrays
    /// are left to the caller (paths come from [`Exposition::report`]; arrays need labels).
    pub fn stats(
        &mut self,
        prefix: &str,
        labels: Labels<'_>,
        stats: &impl serde::Serialize,
        gauges: &[&str],
    ) {
        self.stats_without(prefix, labels, stats, gauges, &[]);
    }

    /// [`Exposition::stats`] leaving out the top-level fields named in `skip` (those the
    /// daemon renders itself, e.g. as histograms).
    pub fn stats_without(
        &mut self,
        prefix: &str,
        labels: Labels<'_>,
        stats: &impl serde::Serialize,
        gauges: &[&str],
        skip: &[&str],
    ) {
        let mut v = serde_json::to_value(stats).unwrap_or_default();
        if let Some(m) = v.as_object_mut() {
            m.retain(|k, _| !skip.contains(&k.as_str()));
        }
        let ty = std::any::type_name_of_val(stats);
        let ty = ty.rsplit("::").next().unwrap_or(ty);
        self.value(prefix, ty, "", labels, &v, gauges);
    }

    fn value(
        &mut self,
        name: &str,
        ty: &str,
        field: &str,
        labels: Labels<'_>,
        v: &serde_json::Value,
        gauges: &[&str],
    ) {
        use serde_json::Value;
        let help = || format!("{ty}::{field} (as --json prints it; documented in the zcio crate)");
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    self.value(&format!("{name}_{}", sanitize(k)), ty, k, labels, x, gauges);
                }
            }
            Value::Number(n) if n.is_u64() && !gauges.contains(&field) => {
                self.counter(name, &help(), labels, n.as_u64().unwrap_or(0))
            }
            Value::Number(n) => self.gauge(name, &help(), labels, n.as_f64().unwrap_or(0.0)),
            Value::Bool(b) => self.gauge(name, &help(), labels, f64::from(u8::from(*b))),
            _ => {}
        }
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind.as_str());
            out.push_str(&f.lines);
        }
        out
    }
}

/// What a daemon's threads last published, one slot per thread.
#[derive(Debug)]
pub struct Board<S> {
    slots: Vec<Mutex<Option<S>>>,
    /// Generation a scrape asked for.
    want: AtomicU64,
    /// Generation each slot last published for.
    have: Vec<AtomicU64>,
    published: (Mutex<()>, Condvar),
}

impl<S: Clone> Board<S> {
    /// A board with `slots` slots (one per publishing thread).
    pub fn new(slots: usize) -> Arc<Self> {
        Arc::new(Self {
            slots: (0..slots).map(|_| Mutex::new(None)).collect(),
            want: AtomicU64::new(0),
            have: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            published: (Mutex::new(()), Condvar::new()),
        })
    }

    /// Whether a scrape waits for slot `i`'s fresh snapshot (one atomic load).
    pub fn wanted(&self, i: usize) -> bool {
        self.want.load(Ordering::Acquire) > self.have[i].load(Ordering::Relaxed)
    }

    /// Publishes slot `i`'s snapshot.
    pub fn publish(&self, i: usize, s: S) {
        *self.slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
        self.have[i].store(self.want.load(Ordering::Acquire), Ordering::Release);
        let _g = self.published.0.lock().unwrap_or_else(|e| e.into_inner());
        self.published.1.notify_all();
    }

    /// The last snapshots, without asking for fresh ones.
    pub fn latest(&self) -> Vec<Option<S>> {
        self.slots
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .collect()
    }

    /// Asks every slot for a fresh snapshot and waits up to `wait` for them.
    pub fn fresh(&self, wait: Duration) -> Vec<Option<S>> {
        let gen = self.want.fetch_add(1, Ordering::AcqRel) + 1;
        let end = Instant::now() + wait;
        let mut g = self.published.0.lock().unwrap_or_else(|e| e.into_inner());
        while self.have.iter().any(|h| h.load(Ordering::Acquire) < gen) {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            g = self
                .published
                .1
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        self.latest()
    }
}

/// A running metrics endpoint (its thread lives as long as the process).
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
}

impl Server {
    /// The address it listens on (the port chosen when `:0` was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Binds `addr` now (so a bad address fails at start) and serves `GET /metrics` on a thread:
/// each request takes fresh snapshots from `board` and renders them with `render`, after
/// `zcio_build_info{command}`.
pub fn serve<S, F>(
    addr: SocketAddr,
    command: &'static str,
    board: Arc<Board<S>>,
    render: F,
) -> Result<Server>
where
    S: Clone + Send + 'static,
    F: Fn(&[Option<S>], &mut Exposition) + Send + 'static,
{
    let l = TcpListener::bind(addr).with_context(|| format!("binding --metrics {addr}"))?;
    let addr = l.local_addr()?;
    std::thread::Builder::new()
        .name("zcio-metrics".into())
        .spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { continue };
                let page = || {
                    let mut e = Exposition::new();
                    e.gauge(
                        "zcio_build_info",
                        "The zcio version and the command serving these metrics; always 1",
                        &[("version", env!("CARGO_PKG_VERSION")), ("command", command)],
                        1.0,
                    );
                    render(&board.fresh(FRESH_WAIT), &mut e);
                    e.render()
                };
                // A client that misbehaves loses its own connection only.
                let _ = handle(&mut c, page);
            }
        })
        .context("starting the metrics thread")?;
    Ok(Server { addr })
}

/// The request line's method and target, once the head has arrived.
fn read_head(c: &mut TcpStream) -> std::io::Result<Option<(String, String)>> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        if buf.len() > MAX_REQUEST {
            return Ok(None);
        }
        let n = c.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf);
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v), None) if v.starts_with("HTTP/1.") => {
            Ok(Some((m.to_string(), t.to_string())))
        }
        _ => Ok(None),
    }
}

fn handle(c: &mut TcpStream, page: impl FnOnce() -> String) -> std::io::Result<()> {
    c.set_read_timeout(Some(IO_TIMEOUT))?;
    c.set_write_timeout(Some(IO_TIMEOUT))?;
    let (status, ctype, body, head_only, allow) = match read_head(c)? {
        None => (
            "400 Bad Request",
            "text/plain",
            "bad request\n".to_string(),
            false,
            false,
        ),
        Some((m, t)) => {
            let path = t.split('?').next().unwrap_or("");
            let head_only = m == "HEAD";
            if m != "GET" && !head_only {
                (
                    "405 Method Not Allowed",
                    "text/plain",
                    "GET or HEAD\n".into(),
                    false,
                    true,
                )
            } else if path == "/metrics" {
                ("200 OK", CONTENT_TYPE, page(), head_only, false)
            } else if path == "/" {
                (
                    "200 OK",
                    "text/plain",
                    "zcio: metrics at /metrics\n".into(),
                    head_only,
                    false,
                )
            } else {
                (
                    "404 Not Found",
                    "text/plain",
                    "not found: try /metrics\n".into(),
                    head_only,
                    false,
                )
            }
        }
    };
    let mut resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if allow {
        resp.push_str("Allow: GET, HEAD\r\n");
    }
    resp.push_str("\r\n");
    if !head_only {
        resp.push_str(&body);
    }
    c.write_all(resp.as_bytes())?;
    c.flush()
}

/// Starts the endpoint when `--metrics` was given and says where it is on stderr (the line
/// tests and operators read: `zcio CMD: metrics on http://ADDR/metrics`).
pub fn start<S, F>(
    addr: Option<SocketAddr>,
    command: &'static str,
    slots: usize,
    render: F,
) -> Result<Option<Arc<Board<S>>>>
where
    S: Clone + Send + 'static,
    F: Fn(&[Option<S>], &mut Exposition) + Send + 'static,
{
    let Some((board, at)) = start_quiet(addr, command, slots, render)? else {
        return Ok(None);
    };
    eprintln!("zcio {command}: metrics on http://{at}/metrics");
    Ok(Some(board))
}

/// [`start`] without the stderr line: the board and the address served, for a daemon that
/// logs that line itself (`--log-format json`).
pub fn start_quiet<S, F>(
    addr: Option<SocketAddr>,
    command: &'static str,
    slots: usize,
    render: F,
) -> Result<Option<(Arc<Board<S>>, SocketAddr)>>
where
    S: Clone + Send + 'static,
    F: Fn(&[Option<S>], &mut Exposition) + Send + 'static,
{
    let Some(addr) = addr else { return Ok(None) };
    let board = Board::new(slots);
    let s = serve(addr, command, board.clone(), render)?;
    Ok(Some((board, s.addr())))
}

#[cfg(test)]
#[path = "../tests/common/prom.rs"]
mod prom;

#[cfg(test)]
mod tests {
    use super::*;
    use zcio::stats::{Counters, Path};

    fn summary() -> Summary {
        Summary {
            path: Path::setting("frame-ring+io_uring"),
            counters: Counters {
                bytes: 10,
                ops: 2,
                syscalls: 3,
                ..Counters::default()
            },
            fallbacks: vec![
                Fallback::new(
                    Path::setting("io_uring min-wait"),
                    Path::setting("one datagram per wait"),
                    "needs \"Linux 6.12\"\nsee docs\\netlink.md",
                ),
                Fallback::new(Path::setting("a"), Path::setting("b"), "twice"),
                Fallback::new(Path::setting("a"), Path::setting("b"), "twice"),
            ],
        }
    }

    #[derive(serde::Serialize)]
    struct Inner {
        drops: u64,
    }

    #[derive(serde::Serialize)]
    struct Stats {
        received: u64,
        held: u64,
        ratio: f64,
        on: bool,
        name: String,
        list: Vec<u64>,
        #[serde(flatten)]
        inner: Inner,
        nested: Inner,
    }

    #[test]
    fn a_report_and_stats_render_as_strict_exposition() {
        let mut e = Exposition::new();
        for q in ["0-1", "2-3"] {
            e.report(&[("queues", q)], &summary());
            e.stats(
                "zcio_test",
                &[("queues", q)],
                &Stats {
                    received: 5,
                    held: 1,
                    ratio: 0.5,
                    on: true,
                    name: "x".into(),
                    list: vec![1, 2],
                    inner: Inner { drops: 7 },
                    nested: Inner { drops: 8 },
                },
                &["held"],
            );
        }
        e.histogram(
            "zcio_test_wait_seconds",
            "Waits",
            &[],
            &[(0.001, 2), (0.01, 3), (f64::INFINITY, 1)],
            Some(0.04),
        );
        let text = e.render();
        let m = prom::parse(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
        match prom::promtool_check(&text) {
            Ok(true) => {}
            Ok(false) => {
                zcio_testnet::skip(
                    "a_report_and_stats_render_as_strict_exposition (promtool part)",
                    "promtool not installed (scripts/deps installs Debian's prometheus)",
                );
            }
            Err(e) => panic!("{e}\n{text}"),
        }
        assert_eq!(
            m.value("zcio_test_received_total", &[("queues", "2-3")]),
            Some(5.0)
        );
        assert_eq!(m.kind("zcio_test_held"), Some("gauge"));
        assert_eq!(
            m.value("zcio_test_drops_total", &[("queues", "0-1")]),
            Some(7.0)
        );
        assert_eq!(
            m.value("zcio_test_nested_drops_total", &[("queues", "0-1")]),
            Some(8.0)
        );
        assert_eq!(m.value("zcio_test_on", &[("queues", "0-1")]), Some(1.0));
        assert_eq!(m.value("zcio_test_ratio", &[("queues", "0-1")]), Some(0.5));
        assert_eq!(
            m.value("zcio_report_syscalls_total", &[("queues", "0-1")]),
            Some(3.0)
        );
        assert_eq!(
            m.value(
                "zcio_path_info",
                &[("queues", "0-1"), ("path", "frame-ring+io_uring")]
            ),
            Some(1.0)
        );
        // The same fallback twice is one series counting 2; labels keep quotes, newlines and
        // backslashes.
        assert_eq!(
            m.value(
                "zcio_fallbacks",
                &[
                    ("queues", "0-1"),
                    ("from", "a"),
                    ("to", "b"),
                    ("reason", "twice")
                ]
            ),
            Some(2.0)
        );
        assert_eq!(
            m.value(
                "zcio_fallbacks",
                &[
                    ("queues", "2-3"),
                    ("from", "io_uring min-wait"),
                    ("to", "one datagram per wait"),
                    ("reason", "needs \"Linux 6.12\"\nsee docs\\netlink.md")
                ]
            ),
            Some(1.0)
        );
        assert_eq!(
            m.value("zcio_test_wait_seconds_bucket", &[("le", "0.01")]),
            Some(5.0)
        );
        assert_eq!(m.value("zcio_test_wait_seconds_count", &[]), Some(6.0));
        // Strings and arrays are the caller's: no series from them.
        assert!(!text.contains("zcio_test_name") && !text.contains("zcio_test_list"));
    }

    #[test]
    fn the_strict_parser_refuses_what_prometheus_refuses() {
        for bad in [
            "# TYPE a counter\na 1\n# TYPE a counter\n",            // TYPE twice
            "a{b=\"1\"} 1\na{b=\"1\"} 2\n",                            // same series twice
            "# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na{x=\"1\"} 1\n", // family split
            "a{b=\"x\\q\"} 1\n",                                       // bad escape
            "a{b=\"x} 1\n",                                            // open quote
            "1a 1\n",                                                  // bad name
            "a{__b=\"1\"} 1\n",                                        // reserved label
            "a one\n",                                                 // bad value
            "# TYPE a counter\nb 1\n",                                 // TYPE without samples, then another
            "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 0\n",
            "a 1",                                                      // no final newline
        ] {
            assert!(prom::parse(bad).is_err(), "accepted: {bad:?}");
        }
        assert!(prom::parse("").is_ok());
    }

    #[test]
    fn requests_get_the_page_or_a_clear_status() {
        let board = Board::<u64>::new(1);
        let b2 = board.clone();
        let worker = std::thread::spawn(move || {
            // A daemon loop: publishes only when a scrape waits.
            let end = Instant::now() + Duration::from_secs(10);
            let mut n = 0;
            while Instant::now() < end && n < 2 {
                if b2.wanted(0) {
                    n += 1;
                    b2.publish(0, 40 + n);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let s = serve("127.0.0.1:0".parse().unwrap(), "test", board, |snaps, e| {
            if let Some(v) = snaps[0] {
                e.counter("zcio_test_turns", "Turns", &[], v);
            }
        })
        .unwrap();
        let first = prom::scrape(s.addr()).unwrap();
        let second = prom::scrape(s.addr()).unwrap();
        worker.join().unwrap();
        // Each scrape waited for its own fresh snapshot.
        assert_eq!(
            prom::parse(&first)
                .unwrap()
                .value("zcio_test_turns_total", &[]),
            Some(41.0)
        );
        let m = prom::parse(&second).unwrap();
        assert_eq!(m.value("zcio_test_turns_total", &[]), Some(42.0));
        assert_eq!(
            m.value(
                "zcio_build_info",
                &[("version", env!("CARGO_PKG_VERSION")), ("command", "test")]
            ),
            Some(1.0)
        );
        let raw = |req: &str| {
            let mut c = TcpStream::connect(s.addr()).unwrap();
            c.write_all(req.as_bytes()).unwrap();
            let mut r = String::new();
            c.read_to_string(&mut r).unwrap();
            r
        };
        assert!(raw("GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        let post = raw("POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405") && post.contains("Allow: GET, HEAD"));
        assert!(raw("garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
        let head = raw("HEAD /metrics HTTP/1.0\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"));
        assert!(head.contains("Content-Type: text/plain; version=0.0.4"));
    }
}

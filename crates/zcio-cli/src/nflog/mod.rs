//! `zcio nflog`: logged packets from NFLOG groups to pcapng (or classic pcap), a file or
//! stdout, rotated like tcpdump's `-C`/`-G`; or one text line per packet. Periodic stats lines
//! and a loss summary on exit (sequence gaps, overruns, the socket's drops).

mod capture;

use anyhow::{bail, Context, Result};
use capture::{Format, Record, Rotation, Writer, LINKTYPE_ETHERNET, LINKTYPE_RAW};
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use zcio::netlink::{link_names, CopyMode, LogPacket, NfLog, NfLogConfig, NfLogStats, RouteSocket};

/// Options of `zcio nflog`.
#[derive(Debug, clap::Args)]
// A later option overrides an earlier one (a unit's defaults, then ZCIO_ARGS).
#[command(args_override_self = true)]
pub struct NflogArgs {
    /// NFLOG group (`--nflog-group N` of the rules); repeatable.
    #[arg(long = "group", short = 'g', required = true)]
    pub groups: Vec<u16>,
    /// Write packets to this pcapng file (`-`: stdout) instead of printing a line per packet.
    #[arg(short = 'w', value_name = "FILE")]
    pub write: Option<PathBuf>,
    /// Start a new file (FILE1, FILE2, …) when the current one reaches this size: a plain
    /// number is millions of bytes (as tcpdump's -C), or give K, M, G (binary).
    #[arg(short = 'C', value_name = "SIZE")]
    pub file_size: Option<String>,
    /// Start a new file every this many seconds (as tcpdump's -G; files are numbered like -C's).
    #[arg(short = 'G', value_name = "SECS")]
    pub rotate_secs: Option<f64>,
    /// Bytes of each packet copied (the kernel copies at most 65531); 0 is the default, as
    /// tcpdump's `-s 0`.
    #[arg(long, short = 's', default_value_t = 262_144)]
    pub snaplen: u32,
    /// Classic pcap instead of pcapng (no interface blocks, no comments).
    #[arg(long)]
    pub pcap: bool,
    /// Exit after this many packets.
    #[arg(short = 'c', value_name = "COUNT")]
    pub count: Option<u64>,
    /// Exit after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Seconds between stats lines on stderr (0: none).
    #[arg(long, default_value_t = 1.0)]
    pub stats_interval: f64,
    /// Socket receive buffer in KiB (as tcpdump's -B; SO_RCVBUFFORCE, falls back to
    /// SO_RCVBUF, recorded).
    #[arg(short = 'B', long = "buffer-size", default_value_t = 8192)]
    pub buffer_kib: usize,
    /// Messages per kernel batch (NFULA_CFG_QTHRESH).
    #[arg(long, default_value_t = 256)]
    pub qthresh: u32,
    /// Kernel batch buffer in bytes (NFULA_CFG_NLBUFSIZ, 3776 to 131072).
    #[arg(long, default_value_t = zcio::netlink::DEFAULT_NLBUFSIZ)]
    pub nlbufsiz: u32,
    /// Flush timeout of a partial kernel batch, in 1/100 s (NFULA_CFG_TIMEOUT).
    #[arg(long, default_value_t = 1)]
    pub flush_timeout: u32,
    /// Do not report overruns on the socket (NETLINK_NO_ENOBUFS); losses are still counted.
    #[arg(long)]
    pub no_enobufs: bool,
    /// Fill frames with recvmmsg instead of io_uring.
    #[arg(long)]
    pub recvmmsg: bool,
    /// Serve the counters as Prometheus text on `ADDR:PORT` (`GET /metrics`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
}

/// What the receive loop publishes for `--metrics`.
#[derive(Clone)]
struct Snapshot {
    summary: zcio::stats::Summary,
    stats: NfLogStats,
    written: u64,
    skipped: u64,
    files: u64,
    writes: u64,
}

/// `--metrics`: the report, the counters (with every loss counter: sequence gaps and the
/// messages missing in them, overruns, the socket's drops), per group (label `group`), and
/// what was written.
fn metrics(snaps: &[Option<Snapshot>], e: &mut crate::metrics::Exposition) {
    for s in snaps.iter().flatten() {
        e.report(&[], &s.summary);
        e.stats("zcio_nflog", &[], &s.stats, &[]);
        for g in &s.stats.groups {
            let n = g.group.to_string();
            let l = [("group", n.as_str())];
            e.counter(
                "zcio_nflog_group_packets",
                "Packets received in the group",
                &l,
                g.packets,
            );
            e.counter(
                "zcio_nflog_group_seq_gaps",
                "Gaps in the group's sequence numbers",
                &l,
                g.seq_gaps,
            );
            e.counter(
                "zcio_nflog_group_lost",
                "Messages missing in the group's sequence gaps (lost in the kernel or at the \
                 socket)",
                &l,
                g.lost,
            );
        }
        for (name, help, v) in [
            (
                "zcio_nflog_written",
                "Packets written (file or text line)",
                s.written,
            ),
            (
                "zcio_nflog_not_written",
                "Packets not written: no link-layer header for their protocol, or a second \
                 link type in a classic pcap file",
                s.skipped,
            ),
            ("zcio_nflog_files", "Capture files opened", s.files),
            (
                "zcio_nflog_writes",
                "Write calls to capture files",
                s.writes,
            ),
        ] {
            e.counter(name, help, &[], v);
        }
    }
}

/// `-C`'s size: a plain number is millions of bytes (tcpdump); K/M/G suffixes are binary. At
/// least one byte: tcpdump refuses `-C 0` (here it would start a file per packet).
fn parse_file_size(s: &str) -> Result<u64> {
    let n = if let Ok(n) = s.trim().parse::<u64>() {
        n.checked_mul(1_000_000)
            .with_context(|| format!("-C: invalid file size '{s}': too large"))?
    } else {
        crate::util::parse_size(s)
            .map(|n| n as u64)
            .map_err(|e| anyhow::anyhow!("-C: invalid file size: {e}"))?
    };
    if n == 0 {
        bail!("-C: invalid file size '{s}' (at least 1: millions of bytes, or K, M, G)");
    }
    Ok(n)
}

/// What is printed or written for each packet (one per run: its size does not matter).
#[allow(clippy::large_enum_variant)]
enum Out {
    Capture(Writer),
    Text(std::io::BufWriter<std::io::Stdout>, String),
}

/// Interface names by index, refreshed when a packet names one not seen yet.
struct Names {
    rs: Option<RouteSocket>,
    map: HashMap<u32, String>,
    tried: std::collections::HashSet<u32>,
    /// The index last asked about (packets mostly come from one interface: no hashing).
    last: Option<u32>,
}

impl Names {
    fn new() -> Self {
        let mut rs = RouteSocket::new(4, 1 << 20).ok();
        let map = rs
            .as_mut()
            .and_then(|s| link_names(s).ok())
            .unwrap_or_default();
        Self {
            rs,
            map,
            tried: Default::default(),
            last: None,
        }
    }
    /// Whether `i` was new and the table was dumped again (the caller then passes the new
    /// names on).
    fn refresh_for(&mut self, i: u32) -> bool {
        if self.last == Some(i) {
            return false;
        }
        self.last = Some(i);
        if self.map.contains_key(&i) || !self.tried.insert(i) {
            return false;
        }
        if let Some(m) = self.rs.as_mut().and_then(|s| link_names(s).ok()) {
            self.map = m;
        }
        true
    }
}

fn now_us() -> (u64, u64) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs(), u64::from(d.subsec_micros()))
}

/// The interface and direction of a packet by its hook: PREROUTING/INPUT/FORWARD name the
/// input device (inbound), OUTPUT/POSTROUTING the output device (outbound).
fn iface_dir(p: &LogPacket<'_>) -> (Option<u32>, u32) {
    match p.hook {
        0..=2 => (p.indev.or(p.outdev), 1),
        3 | 4 => (p.outdev.or(p.indev), 2),
        _ => (p.indev.or(p.outdev), 0),
    }
}

/// The packet's full length from its IP header (the copy range may have cut it).
fn ip_len(b: &[u8]) -> Option<u32> {
    match b.first()? >> 4 {
        4 if b.len() >= 4 => Some(u32::from(u16::from_be_bytes([b[2], b[3]]))),
        6 if b.len() >= 6 => Some(u32::from(u16::from_be_bytes([b[4], b[5]])) + 40),
        _ => None,
    }
}

/// One text line for a packet (as the kernel's LOG target or ulogd's LOGEMU print them).
fn text_line(out: &mut String, p: &LogPacket<'_>, names: &HashMap<u32, String>, ts: (u64, u64)) {
    use std::fmt::Write as _;
    let name = |i: Option<u32>| {
        i.map(|i| names.get(&i).cloned().unwrap_or_else(|| format!("if{i}")))
            .unwrap_or_default()
    };
    let _ = write!(
        out,
        "{}.{:06} group={} {}IN={} OUT={} ",
        ts.0,
        ts.1,
        p.group,
        // iptables sends an empty prefix (NUL only) for a rule without one: no field then.
        p.prefix
            .filter(|x| !x.is_empty())
            .map(|x| format!("{} ", String::from_utf8_lossy(x)))
            .unwrap_or_default(),
        name(p.indev),
        name(p.outdev)
    );
    if let Some(m) = p.mark {
        let _ = write!(out, "MARK=0x{m:x} ");
    }
    let b = p.payload.unwrap_or(&[]);
    match (b.first().map(|v| v >> 4), zcio::netlink::packet::locate(b)) {
        (Some(4), Some(l4)) if b.len() >= 20 => {
            let _ = write!(
                out,
                "SRC={} DST={} LEN={} PROTO={}",
                std::net::Ipv4Addr::new(b[12], b[13], b[14], b[15]),
                std::net::Ipv4Addr::new(b[16], b[17], b[18], b[19]),
                ip_len(b).unwrap_or(0),
                l4.proto
            );
            if let zcio::netlink::packet::Ports::Seen { src, dst } = l4.ports {
                let _ = write!(out, " SPT={src} DPT={dst}");
            }
        }
        (Some(6), Some(l4)) if b.len() >= 40 => {
            let a = |o: usize| {
                let mut x = [0u8; 16];
                x.copy_from_slice(&b[o..o + 16]);
                std::net::Ipv6Addr::from(x)
            };
            let _ = write!(
                out,
                "SRC={} DST={} LEN={} PROTO={}",
                a(8),
                a(24),
                ip_len(b).unwrap_or(0),
                l4.proto
            );
            if let zcio::netlink::packet::Ports::Seen { src, dst } = l4.ports {
                let _ = write!(out, " SPT={src} DPT={dst}");
            }
        }
        _ => {
            let _ = write!(out, "HWPROTO=0x{:04x} LEN={}", p.hw_protocol, b.len());
        }
    }
    out.push('\n');
}

fn stats_line(st: &NfLogStats, pps: f64, out: &Out) -> String {
    let w = match out {
        Out::Capture(w) => format!(
            ", written {} bytes in {} file(s), {} writes",
            w.bytes,
            w.files(),
            w.writes
        ),
        Out::Text(..) => String::new(),
    };
    let lost = if st.loss.exact {
        format!("lost {} ({} gaps)", st.loss.at_least, st.seq_gaps)
    } else {
        format!(
            "lost >= {} ({} in {} gaps, {} batches dropped after the last arrival)",
            st.loss.at_least, st.lost, st.seq_gaps, st.tail_batches
        )
    };
    format!(
        "zcio nflog: {} packets ({pps:.0}/s), {} datagrams, {} receive syscalls; {lost}, \
         overruns {}, socket drops {}{w}",
        st.packets,
        st.stream.datagrams,
        st.stream.syscalls,
        st.stream.overruns,
        st.stream.kernel_drops
    )
}

/// Runs `zcio nflog`.
pub fn run(a: NflogArgs) -> Result<()> {
    let sigfd = zcio::sys::signal::block_to_fd(&[libc::SIGINT, libc::SIGTERM])
        .context("blocking SIGINT/SIGTERM")?;
    let snaplen = if a.snaplen == 0 { 262_144 } else { a.snaplen };
    let copy = snaplen.min(zcio::sys::nflog::NFULNL_COPY_RANGE_MAX);
    if let Some(c) = a.count {
        crate::util::at_least_one("-c", "packet count", c)?;
    }
    crate::util::at_least_one("-B", "buffer size", a.buffer_kib)?;
    crate::util::at_least_one("--qthresh", "batch size", a.qthresh)?;
    let duration = a
        .duration
        .map(|d| crate::util::seconds("--duration", d))
        .transpose()?;
    let interval = crate::util::interval("--stats-interval", a.stats_interval)?;
    let cfg = NfLogConfig {
        groups: a.groups.clone(),
        copy: CopyMode::Packet(copy),
        nlbufsiz: Some(a.nlbufsiz),
        timeout: Some(a.flush_timeout),
        qthresh: Some(a.qthresh),
        rcvbuf: Some((a.buffer_kib << 10, true)),
        no_enobufs: a.no_enobufs,
        uring: !a.recvmmsg,
        ..NfLogConfig::default()
    };
    let rotation = Rotation {
        size: a.file_size.as_deref().map(parse_file_size).transpose()?,
        every: a
            .rotate_secs
            .map(|s| crate::util::seconds("-G", s))
            .transpose()?,
    };
    if a.write.is_none() && (rotation.size.is_some() || rotation.every.is_some()) {
        bail!("-C and -G need -w FILE");
    }
    crate::privs::check(
        "nflog",
        &[crate::privs::Need {
            cap: crate::privs::CAP_NET_ADMIN,
            used_for: "binding NFLOG groups",
            without: None,
        }],
        (!a.recvmmsg).then_some((crate::privs::RING_NFLOG, "frame-ring+recvmmsg")),
    )?;
    let board = crate::metrics::start(a.metrics, "nflog", 1, metrics)?;
    let mut log =
        NfLog::open(cfg).with_context(|| format!("binding NFLOG group(s) {:?}", a.groups))?;
    for f in log.fallbacks() {
        eprintln!("zcio nflog: fallback {f}");
    }
    let names = Names::new();
    let format = if a.pcap { Format::Pcap } else { Format::Pcapng };
    let out = match &a.write {
        Some(p) => Out::Capture(
            Writer::new(
                format,
                Some(p),
                snaplen.min(262_144),
                rotation,
                names.map.clone(),
            )
            .with_context(|| format!("opening {}", p.display()))?,
        ),
        None => Out::Text(
            std::io::BufWriter::with_capacity(1 << 20, std::io::stdout()),
            String::new(),
        ),
    };
    eprintln!(
        "zcio nflog: listening on group(s) {:?}, path {}, copy range {copy}, {}",
        log.groups(),
        log.path(),
        match &a.write {
            Some(p) if p.as_os_str() == "-" =>
                format!("{} to stdout", if a.pcap { "pcap" } else { "pcapng" }),
            Some(p) => format!(
                "{} to {}",
                if a.pcap { "pcap" } else { "pcapng" },
                p.display()
            ),
            None => "text lines to stdout".into(),
        }
    );
    let start = Instant::now();
    let end = duration.map(|d| start + d);
    let mut next_stats = interval.map(|i| start + i);
    let mut last = (start, 0u64);
    let mut sink = Sink {
        out,
        names,
        skipped: 0,
        written: 0,
        io_err: None,
        limit: a.count,
    };
    let signal = loop {
        if sink.full() {
            break None;
        }
        // The receive time of packets without a kernel timestamp (OUTPUT, POSTROUTING): one
        // clock read per receive batch, when it is handed over.
        let n = log
            .process_batch(Some(Duration::from_millis(20)), |items| {
                sink.batch(items, now_us())
            })
            .context("receiving")?;
        sink.after_batch(n == 0)?;
        if let Some(b) = board.as_deref().filter(|b| b.wanted(0)) {
            b.publish(0, sink.snapshot(&log));
        }
        if let Some(s) = zcio::sys::signal::read_signal(&sigfd)? {
            break Some(s);
        }
        let t = Instant::now();
        if end.is_some_and(|e| t >= e) {
            break None;
        }
        if let (Some(ns), Some(i)) = (next_stats, interval) {
            if t >= ns {
                let st = log.stats();
                let pps = (st.packets - last.1) as f64 / (t - last.0).as_secs_f64();
                last = (t, st.packets);
                eprintln!("{}", stats_line(&st, pps, &sink.out));
                next_stats = Some(ns + i);
            }
        }
    };
    let path = log.path();
    // The kernel's partial batch, then everything still queued.
    let now = now_us();
    let st = log.close(Duration::from_millis(25), |p| {
        sink.batch(&mut std::iter::once(p.clone()), now)
    })?;
    sink.after_batch(true)?;
    if let Out::Capture(w) = &sink.out {
        sink.skipped += w.skipped;
    }
    match signal {
        Some(s) => eprintln!("zcio nflog: signal {s}, unbound"),
        None => eprintln!("zcio nflog: done, unbound"),
    }
    let elapsed = start.elapsed().as_secs_f64();
    eprintln!(
        "{}",
        stats_line(&st, st.packets as f64 / elapsed.max(1e-9), &sink.out)
    );
    if sink.skipped > 0 {
        eprintln!(
            "zcio nflog: {} packet(s) not written: no link-layer header for their protocol, \
             or a second link type in a classic pcap file",
            sink.skipped
        );
    }
    eprintln!("zcio nflog: {}", st.loss_summary());
    let (files, writes) = match &sink.out {
        Out::Capture(w) => (w.files(), w.writes),
        Out::Text(..) => (0, 0),
    };
    eprintln!(
        "zcio nflog: stats {}",
        serde_json::json!({
            "packets": st.packets,
            "written": sink.written,
            "lost": st.lost,
            "seq_gaps": st.seq_gaps,
            "tail_batches": st.tail_batches,
            "lost_at_least": st.loss.at_least,
            "lost_at_most": st.loss.at_most,
            "lost_exact": st.loss.exact,
            "overruns": st.stream.overruns,
            "kernel_drops": st.stream.kernel_drops,
            "datagrams": st.stream.datagrams,
            "syscalls": st.stream.syscalls,
            "parse_errors": st.stream.parse_errors,
            "files": files,
            "writes": writes,
            "path": path.as_str(),
        })
    );
    Ok(())
}

/// Where packets go, with what it needs per packet.
struct Sink {
    out: Out,
    names: Names,
    skipped: u64,
    written: u64,
    io_err: Option<std::io::Error>,
    /// `-c`: stop after this many packets.
    limit: Option<u64>,
}

impl Sink {
    fn snapshot(&self, log: &NfLog) -> Snapshot {
        use zcio::stats::Report;
        let (files, writes, skipped) = match &self.out {
            Out::Capture(w) => (w.files(), w.writes, self.skipped + w.skipped),
            Out::Text(..) => (0, 0, self.skipped),
        };
        Snapshot {
            summary: log.summary(),
            stats: log.stats(),
            written: self.written,
            skipped,
            files: files as u64,
            writes,
        }
    }

    fn full(&self) -> bool {
        self.limit.is_some_and(|c| self.written + self.skipped >= c)
    }

    /// One receive batch: every packet in it, written with one `writev` (capture files) or
    /// as text lines. `now` is the receive time of packets without a kernel timestamp.
    fn batch<'d>(&mut self, items: &mut dyn Iterator<Item = LogPacket<'d>>, now: (u64, u64)) {
        if self.io_err.is_some() {
            return;
        }
        match &mut self.out {
            Out::Capture(w) => {
                let mut b = w.batch();
                for p in items {
                    if self.limit.is_some_and(|c| self.written + self.skipped >= c) {
                        break;
                    }
                    let (ifindex, direction) = iface_dir(&p);
                    if let Some(i) = ifindex {
                        if self.names.refresh_for(i) {
                            b.set_names(self.names.map.clone());
                        }
                    }
                    let payload = p.payload.unwrap_or(&[]);
                    let (linktype, l2): (u16, &[u8]) = match p.hw_protocol {
                        0x0800 | 0x86dd => (LINKTYPE_RAW, &[]),
                        _ => match p.l2hdr.or(p.hwheader) {
                            Some(h) if h.len() == 14 => (LINKTYPE_ETHERNET, h),
                            _ => {
                                self.skipped += 1;
                                continue;
                            }
                        },
                    };
                    let orig_len =
                        ip_len(payload).unwrap_or(0).max(payload.len() as u32) + l2.len() as u32;
                    if let Err(e) = b.write(&Record {
                        ts: p.timestamp.unwrap_or(now),
                        ifindex,
                        linktype,
                        l2,
                        data: payload,
                        orig_len,
                        comment: p.prefix,
                        direction,
                    }) {
                        self.io_err = Some(e);
                        return;
                    }
                    self.written += 1;
                }
                if let Err(e) = b.finish() {
                    self.io_err = Some(e);
                }
            }
            Out::Text(_, line) => {
                for p in items {
                    if self.limit.is_some_and(|c| self.written >= c) {
                        break;
                    }
                    let (ifindex, _) = iface_dir(&p);
                    if let Some(i) = ifindex {
                        self.names.refresh_for(i);
                    }
                    text_line(line, &p, &self.names.map, p.timestamp.unwrap_or(now));
                    self.written += 1;
                }
            }
        }
    }

    /// After a receive batch: writes text lines; when `idle`, flushes.
    fn after_batch(&mut self, idle: bool) -> Result<()> {
        if let Some(e) = self.io_err.take() {
            return Err(e).context("writing packets");
        }
        match &mut self.out {
            Out::Capture(w) => {
                // Rotation happens only as a packet arrives (as tcpdump's -G): a file is
                // never opened that no packet goes into.
                if idle {
                    w.flush().context("writing packets")?;
                }
            }
            Out::Text(o, line) => {
                if !line.is_empty() {
                    o.write_all(line.as_bytes())?;
                    line.clear();
                }
                if idle {
                    o.flush()?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_sizes_are_millions_of_bytes_or_binary_with_a_suffix() {
        assert_eq!(parse_file_size("3").unwrap(), 3_000_000);
        assert_eq!(parse_file_size("64K").unwrap(), 65_536);
        assert_eq!(parse_file_size("1M").unwrap(), 1 << 20);
        assert!(parse_file_size("x").is_err());
    }

    #[test]
    fn hooks_give_the_interface_and_direction() {
        let p = LogPacket {
            hook: 1,
            indev: Some(3),
            ..LogPacket::default()
        };
        assert_eq!(iface_dir(&p), (Some(3), 1));
        let p = LogPacket {
            hook: 4,
            outdev: Some(5),
            ..LogPacket::default()
        };
        assert_eq!(iface_dir(&p), (Some(5), 2));
        assert_eq!(ip_len(&[0x45, 0, 0x05, 0xdc]), Some(1500));
        assert_eq!(ip_len(&[0x60, 0, 0, 0, 0, 8]), Some(48));
    }
}

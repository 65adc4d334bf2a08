//! `netlink`: the frame ring's read-only users against the tools people run today.
//!
//! - NFLOG: UDP floods of 64 B and 1400 B matched by a `raw PREROUTING` NFLOG rule (then
//!   dropped, so nothing but the logging costs) in a test namespace; consumers write a capture
//!   file on tmpfs: `zcio nflog -w FILE.pcapng` against `tcpdump -i nflog:N -w FILE` (libpcap's
//!   own nflog reader) and ulogd2's PCAP output.
//! - Conntrack events: a storm of UDP flows (one NEW event each) and of TCP connections to a
//!   local listener (NEW, UPDATEs through the close); `zcio conntrack events -o timestamp >
//!   FILE` against `conntrack -E -o timestamp > FILE`.
//!
//! Each measured run starts one consumer process (pinned to CPU 1; the sender runs on CPU 0),
//! then offers a ladder of rates, each step for a fixed time with a pause to drain, every packet
//! or flow numbered by its step; the capture file (or event lines) then says how many of each
//! step arrived: `loss_free_rate` is the highest offered rate up to which every step arrived
//! whole. A last step sends flat out; the consumer's CPU time during it (all threads,
//! `/proc/PID/task/*/schedstat`) over what it delivered is `consumer_cpu`. Every consumer gets
//! the same socket receive buffer.

use crate::bench::{Better, Ctx, MetricDef, Sample, Suite};
use anyhow::{bail, Context, Result};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcio_testnet::Netns;

/// The suite.
pub struct NetlinkSuite;

pub(super) const GROUP: u16 = 50;
pub(super) const LOG_PORT: u16 = 9400;
const CT_PORT: u16 = 9500;
const TCP_PORT: u16 = 9501;

pub(super) const METRICS: &[MetricDef] = &[
    MetricDef::new("loss_free_rate", "pkt/s", Better::Higher),
    MetricDef::new("consumer_cpu", "us/pkt", Better::Lower),
    MetricDef::new("saturated_rate", "pkt/s", Better::Higher),
    MetricDef::new("copied_fraction", "fraction", Better::Lower),
];

const CT_METRICS: &[MetricDef] = &[
    MetricDef::new("loss_free_rate", "events/s", Better::Higher),
    MetricDef::new("consumer_cpu", "us/event", Better::Lower),
    MetricDef::new("saturated_rate", "events/s", Better::Higher),
    MetricDef::new("copied_fraction", "fraction", Better::Lower),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Logger {
    Tcpdump,
    Ulogd,
    Zcio,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watcher {
    Conntrack,
    Zcio,
}

/// How a run offers load.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    /// Offered rates of the ladder (per second).
    rates: Vec<u64>,
    /// Duration of each step.
    step: Duration,
    /// Duration of the flat-out step.
    flat: Duration,
    /// Pause after each step for the consumer to drain.
    pause: Duration,
    /// Ends the ladder at the first step the sender could not offer at its rate (every
    /// higher step would offer the same): the default run's shortened search. `--full` climbs
    /// every step.
    stop_when_sender_bound: bool,
}

impl NetlinkSuite {
    pub(super) fn plan(ctx: &Ctx, rates: &[u64]) -> Plan {
        Plan {
            rates: match ctx.mode {
                crate::bench::Mode::Quick => rates.iter().step_by(2).copied().collect(),
                _ => rates.to_vec(),
            },
            step: ctx.pick(Duration::from_millis(150), Duration::from_secs(1)),
            flat: ctx.pick(Duration::from_millis(300), Duration::from_secs(2)),
            pause: Duration::from_millis(150),
            stop_when_sender_bound: ctx.mode != crate::bench::Mode::Full,
        }
    }
}

impl Suite for NetlinkSuite {
    fn name(&self) -> &'static str {
        "netlink"
    }
    fn about(&self) -> &'static str {
        "NFLOG to a capture file: zcio nflog vs tcpdump -i nflog:N and ulogd2's PCAP output; conntrack events: zcio conntrack events vs conntrack -E; loss-free rate (sequence-checked) and consumer CPU"
    }
    fn chart_metric(&self) -> &'static str {
        "consumer_cpu"
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        if let Err(e) = zcio_testnet::check_privileges() {
            return Err(ctx.skip(e.to_string()));
        }
        let rmem_max = zcio::sys::read_sysctl("/proc/sys/net/core/rmem_max").unwrap_or(212_992);
        // Every consumer asks for the same buffer, at most net.core.rmem_max so tools using
        // plain SO_RCVBUF (libpcap) get what they ask for too.
        let buf = (rmem_max as usize).min(4 << 20);
        ctx.note(format!(
            "every consumer has a {} KiB socket receive buffer (net.core.rmem_max {} KiB); \
             netlink delivers by copy: copied_fraction is 1 on every side",
            buf >> 10,
            rmem_max >> 10
        ));
        ctx.note(
            "method: a consumer process on CPU 1, the sender on CPU 0; a ladder of offered rates \
             (a pause after each step), every packet/flow numbered by its step and counted in \
             the consumer's output; loss_free_rate = highest offered rate up to which every step \
             arrived whole (a run whose top step is lossless is sender-bound: the consumer kept \
             up with everything offered); then a flat-out step: consumer_cpu = the consumer's \
             CPU time (all threads) / what it delivered, saturated_rate = delivered / time",
        );
        let dir = TmpDir::new()?;
        let zcio_bin = std::env::current_exe().context("the zcio binary")?;
        let have = |t: &str| {
            Command::new(t)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok()
        };
        // NFLOG.
        let ns = Netns::new("nlb").context("namespace")?;
        for rule in [
            format!(
                "-t raw -A PREROUTING -p udp --dport {LOG_PORT} -j NFLOG --nflog-group {GROUP}"
            ),
            format!("-t raw -A PREROUTING -p udp --dport {LOG_PORT} -j DROP"),
        ] {
            let o = ns
                .command("iptables")
                .args(rule.split(' '))
                .output()
                .context("iptables")?;
            if !o.status.success() {
                return Err(ctx.skip(format!(
                    "iptables NFLOG rule refused: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                )));
            }
        }
        let plan = Self::plan(
            ctx,
            &[50_000, 100_000, 200_000, 400_000, 800_000, 1_600_000],
        );
        let env = Env {
            ns: &ns,
            dir: dir.path(),
            buf,
            zcio: &zcio_bin,
        };
        for size in [64usize, 1400] {
            if have("tcpdump") {
                ctx.compare(
                    &format!("nflog udp {size}B vs tcpdump -i nflog -w"),
                    ("tcpdump -i nflog:50 -w", "zcio nflog -w pcapng"),
                    METRICS,
                    || nflog_run(&env, Logger::Tcpdump, size, &plan),
                    || nflog_run(&env, Logger::Zcio, size, &plan),
                )?;
            } else {
                ctx.note("tcpdump is not installed (scripts/deps installs it): its cases skipped");
            }
            if Path::new(ULOGD_PCAP).exists() && have("ulogd") {
                ctx.compare(
                    &format!("nflog udp {size}B vs ulogd2 PCAP"),
                    ("ulogd2 NFLOG+BASE+PCAP", "zcio nflog -w pcapng"),
                    METRICS,
                    || nflog_run(&env, Logger::Ulogd, size, &plan),
                    || nflog_run(&env, Logger::Zcio, size, &plan),
                )?;
            } else {
                ctx.note("ulogd2 with its PCAP output is not installed: its cases skipped");
            }
        }
        drop(ns);
        // Conntrack events.
        if !have("conntrack") {
            ctx.note("conntrack is not installed (scripts/deps installs it): its cases skipped");
            return Ok(());
        }
        let ns = Netns::new("ctb").context("namespace")?;
        for rule in [
            "-A INPUT -m conntrack --ctstate NEW,ESTABLISHED -j ACCEPT".to_string(),
            format!(
                "-A INPUT -p udp --dport {CT_PORT}:{} -j DROP",
                CT_PORT + 255
            ),
        ] {
            let o = ns.command("iptables").args(rule.split(' ')).output()?;
            if !o.status.success() {
                bail!("iptables: {}", String::from_utf8_lossy(&o.stderr).trim());
            }
        }
        // Short timeouts keep the table small across the ladder (flows end within seconds).
        for (k, v) in [
            ("nf_conntrack_udp_timeout", "2"),
            ("nf_conntrack_tcp_timeout_time_wait", "2"),
            ("nf_conntrack_tcp_timeout_close_wait", "2"),
            ("nf_conntrack_tcp_timeout_fin_wait", "2"),
        ] {
            let o = ns
                .command("sh")
                .arg("-c")
                .arg(format!("echo {v} > /proc/sys/net/netfilter/{k}"))
                .output()?;
            if !o.status.success() {
                bail!("{k}: {}", String::from_utf8_lossy(&o.stderr).trim());
            }
        }
        let env = Env {
            ns: &ns,
            dir: dir.path(),
            buf,
            zcio: &zcio_bin,
        };
        let plan = Self::plan(ctx, &[10_000, 20_000, 40_000, 80_000, 160_000, 320_000]);
        ctx.compare(
            "conntrack udp flows (NEW events) vs conntrack -E",
            ("conntrack -E -o timestamp", "zcio conntrack events"),
            CT_METRICS,
            || ct_run(&env, Watcher::Conntrack, Storm::Udp, &plan),
            || ct_run(&env, Watcher::Zcio, Storm::Udp, &plan),
        )?;
        let plan = Self::plan(ctx, &[2_000, 4_000, 8_000, 16_000, 32_000]);
        ctx.compare(
            "conntrack tcp connects (all events) vs conntrack -E",
            ("conntrack -E -o timestamp", "zcio conntrack events"),
            CT_METRICS,
            || ct_run(&env, Watcher::Conntrack, Storm::Tcp, &plan),
            || ct_run(&env, Watcher::Zcio, Storm::Tcp, &plan),
        )?;
        Ok(())
    }
}

const ULOGD_PCAP: &str = "/usr/lib/x86_64-linux-gnu/ulogd/ulogd_output_PCAP.so";

/// What every run needs.
struct Env<'a> {
    ns: &'a Netns,
    dir: &'a Path,
    buf: usize,
    zcio: &'a Path,
}

/// A directory on tmpfs (`/dev/shm`), removed at the end.
struct TmpDir(PathBuf);

impl TmpDir {
    fn new() -> Result<Self> {
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let p = base.join(format!("zcio-bench-netlink-{}", std::process::id()));
        std::fs::create_dir_all(&p)?;
        Ok(Self(p))
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// CPU time of every thread of `pid` so far (`/proc/PID/task/*/schedstat`, ns).
fn cpu_ns(pid: u32) -> u64 {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    rd.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Stops a consumer (`sig`) and waits for it.
pub(super) fn stop(mut child: Child, sig: &str) -> Result<String> {
    let _ = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status();
    let end = Instant::now() + Duration::from_secs(10);
    while child.try_wait()?.is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            bail!("a consumer did not exit after {sig}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    Ok(err)
}

/// Waits until NFLOG group `GROUP` is bound in the namespace.
pub(super) fn wait_bound(ns: &Netns) -> Result<()> {
    let ok = ns.run(|| {
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            let s = std::fs::read_to_string("/proc/thread-self/net/netfilter/nfnetlink_log")
                .unwrap_or_default();
            if s.lines().any(|l| {
                l.split_whitespace()
                    .next()
                    .and_then(|g| g.parse::<u16>().ok())
                    == Some(GROUP)
            }) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    })?;
    if !ok {
        bail!("the consumer did not bind NFLOG group {GROUP}");
    }
    Ok(())
}

/// What the sender did in one step.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Step {
    sent: u64,
    secs: f64,
}

/// Sends paced batches for each step of `plan` (`make` fills batch `k` of a step), then the
/// flat-out step; `cpu` samples the consumer's CPU around the flat-out step. Runs on CPU 0 in
/// the namespace. Returns the steps (the flat-out one last) and the consumer CPU it used.
fn offer(
    ns: &Netns,
    plan: &Plan,
    pid: u32,
    mut send: impl FnMut(u8, u64) -> Result<u64> + Send + 'static,
) -> Result<(Vec<Step>, u64)> {
    let plan = plan.clone();
    ns.run(move || -> Result<(Vec<Step>, u64)> {
        let _ = zcio_testnet::cpu::pin_thread(0);
        let mut steps = Vec::new();
        const BATCH: u64 = 64;
        for (i, &rate) in plan.rates.iter().enumerate() {
            let total = (rate as f64 * plan.step.as_secs_f64()) as u64;
            let start = Instant::now();
            let mut sent = 0;
            while sent < total {
                let due = start + Duration::from_secs_f64(sent as f64 / rate as f64);
                let now = Instant::now();
                if due > now {
                    let wait = due - now;
                    if wait > Duration::from_micros(200) {
                        std::thread::sleep(wait);
                    } else {
                        while Instant::now() < due {
                            std::hint::spin_loop();
                        }
                    }
                }
                sent += send(i as u8 + 1, BATCH.min(total - sent))?;
            }
            let secs = start.elapsed().as_secs_f64();
            steps.push(Step { sent, secs });
            std::thread::sleep(plan.pause);
            // Below 80 % of the target: the sender, not the consumer, set this step's pace.
            if plan.stop_when_sender_bound && (sent as f64 / secs.max(1e-9)) < 0.8 * rate as f64 {
                break;
            }
        }
        let cpu0 = cpu_ns(pid);
        let start = Instant::now();
        let mut sent = 0;
        while start.elapsed() < plan.flat {
            sent += send(255, BATCH)?;
        }
        let secs = start.elapsed().as_secs_f64();
        std::thread::sleep(plan.pause * 2);
        let cpu = cpu_ns(pid) - cpu0;
        steps.push(Step { sent, secs });
        Ok((steps, cpu))
    })?
}

/// The metrics of a run from what was sent and what arrived per step (`got[step]`, step ids
/// 1.. for the ladder, 255 flat out).
pub(super) fn sample(
    plan: &Plan,
    steps: &[Step],
    got: &std::collections::HashMap<u8, u64>,
    cpu: u64,
) -> Sample {
    let mut s = Sample::default();
    let mut loss_free = 0.0;
    let mut top = true;
    let ladder = &steps[..steps.len() - 1];
    for (i, st) in ladder.iter().enumerate() {
        let n = got.get(&(i as u8 + 1)).copied().unwrap_or(0);
        if n != st.sent {
            s.note(format!(
                "first lossy step offered {:.0} /s (target {} /s): {} of {} arrived",
                st.sent as f64 / st.secs.max(1e-9),
                plan.rates[i],
                n,
                st.sent
            ));
            top = false;
            break;
        }
        // The rate actually offered (the sender may fall short of its target).
        loss_free = st.sent as f64 / st.secs.max(1e-9);
    }
    if top && ladder.len() < plan.rates.len() {
        s.note(format!(
            "the ladder ended after {} of {} steps: the sender could not offer the next rate \
             (loss-free up to what it could send)",
            ladder.len(),
            plan.rates.len()
        ));
    } else if top {
        s.note("every step of the ladder arrived whole: the top rate is sender-bound");
    }
    let flat = steps.last().expect("the flat-out step");
    let delivered = got.get(&255).copied().unwrap_or(0);
    s.set("loss_free_rate", loss_free);
    s.set("saturated_rate", delivered as f64 / flat.secs.max(1e-9));
    if delivered > 0 {
        s.set("consumer_cpu", cpu as f64 / 1e3 / delivered as f64);
    }
    s.set("copied_fraction", 1.0);
    s.note(format!(
        "flat out: offered {:.0}/s, delivered {:.0}%",
        flat.sent as f64 / flat.secs.max(1e-9),
        100.0 * delivered as f64 / flat.sent.max(1) as f64
    ));
    s
}

fn nflog_run(env: &Env<'_>, who: Logger, size: usize, plan: &Plan) -> Result<Sample> {
    let file = env.dir.join(match who {
        Logger::Tcpdump => "tcpdump.pcap",
        Logger::Ulogd => "ulogd.pcap",
        Logger::Zcio => "zcio.pcapng",
    });
    let _ = std::fs::remove_file(&file);
    let kib = (env.buf >> 10).to_string();
    let mut cmd = env.ns.command("taskset");
    cmd.args(["-c", "1"]);
    let sig = match who {
        Logger::Tcpdump => {
            cmd.args(["tcpdump", "-i"])
                .arg(format!("nflog:{GROUP}"))
                .args(["-B", &kib, "-w"])
                .arg(&file);
            "-INT"
        }
        Logger::Ulogd => {
            let conf = env.dir.join("ulogd.conf");
            std::fs::write(
                &conf,
                format!(
                    "[global]\nlogfile=\"{}\"\nloglevel=5\n\
                     plugin=\"/usr/lib/x86_64-linux-gnu/ulogd/ulogd_inppkt_NFLOG.so\"\n\
                     plugin=\"/usr/lib/x86_64-linux-gnu/ulogd/ulogd_raw2packet_BASE.so\"\n\
                     plugin=\"{ULOGD_PCAP}\"\n\
                     stack=log1:NFLOG,base1:BASE,pcap1:PCAP\n\n\
                     [log1]\ngroup={GROUP}\nnetlink_socket_buffer_size={}\n\
                     netlink_socket_buffer_maxsize={}\n\n[pcap1]\nfile=\"{}\"\nsync=0\n",
                    env.dir.join("ulogd.log").display(),
                    env.buf,
                    env.buf,
                    file.display()
                ),
            )?;
            cmd.args(["ulogd", "-c"]).arg(&conf);
            "-TERM"
        }
        Logger::Zcio => {
            cmd.arg(env.zcio)
                .args(["nflog", "-g", &GROUP.to_string(), "-B", &kib, "-w"])
                .arg(&file)
                .args(["--stats-interval", "0"]);
            "-TERM"
        }
    };
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {who:?}"))?;
    let pid = child.id();
    let started = wait_bound(env.ns);
    if let Err(e) = started {
        let err = stop(child, "-KILL").unwrap_or_default();
        bail!("{e}: {err}");
    }
    let (steps, cpu) = offer_log(env.ns, plan, size, pid)?;
    let err = stop(child, sig)?;
    let got = count_capture(&file).with_context(|| format!("{who:?}: {err}"))?;
    let mut s = sample(plan, &steps, &got, cpu);
    if who == Logger::Zcio {
        if let Some(st) = err
            .lines()
            .find_map(|l| l.strip_prefix("zcio nflog: stats "))
            .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok())
        {
            s.note(format!(
                "zcio's own count: lost {} (sequence gaps), overruns {}, path {}",
                st["lost"], st["overruns"], st["path"]
            ));
        }
    }
    Ok(s)
}

/// Offers the NFLOG ladder of `plan` (UDP datagrams of `size` bytes to `LOG_PORT` in `ns`,
/// each carrying its step in its first byte) to the consumer `pid`, which has bound `GROUP`.
/// Returns the steps and the consumer's CPU over the flat-out step.
pub(super) fn offer_log(
    ns: &Netns,
    plan: &Plan,
    size: usize,
    pid: u32,
) -> Result<(Vec<Step>, u64)> {
    let sock = Arc::new(ns.run(|| {
        UdpSocket::bind("127.0.0.1:0").and_then(|s| {
            s.connect(("127.0.0.1", LOG_PORT))?;
            Ok(s)
        })
    })??);
    let s2 = Arc::clone(&sock);
    let mut bufs: Vec<Vec<u8>> = (0..64).map(|_| vec![0u8; size]).collect();
    let mut seq = 0u32;
    offer(ns, plan, pid, move |step, n| {
        let n = n as usize;
        for b in bufs.iter_mut().take(n) {
            b[0] = step;
            b[1..5].copy_from_slice(&seq.to_be_bytes());
            seq = seq.wrapping_add(1);
        }
        let mut refs: [&[u8]; 64] = [&[]; 64];
        for (r, b) in refs.iter_mut().zip(&bufs[..n]) {
            *r = b;
        }
        let k = zcio::sys::net::send_batch(&*s2, &refs[..n], &[])?;
        Ok(k as u64)
    })
}

/// Packets per step in a capture file (pcap: raw IP, Ethernet or NFLOG link types; pcapng),
/// from the step byte at the start of each UDP payload.
fn count_capture(path: &Path) -> Result<std::collections::HashMap<u8, u64>> {
    let b = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut got = std::collections::HashMap::new();
    let mut add = |linktype: u32, data: &[u8]| {
        let ip = match linktype {
            101 | 12 | 228 => Some(data),
            1 => data.get(14..),
            // LINKTYPE_NFLOG: a 4-byte header, then TLVs (length, type; host order).
            239 => {
                let mut o = 4;
                let mut ip = None;
                while o + 4 <= data.len() {
                    let len = u16::from_le_bytes([data[o], data[o + 1]]) as usize;
                    let ty = u16::from_le_bytes([data[o + 2], data[o + 3]]);
                    if len < 4 || o + len > data.len() {
                        break;
                    }
                    if ty == 9 {
                        ip = Some(&data[o + 4..o + len]);
                        break;
                    }
                    o += (len + 3) & !3;
                }
                ip
            }
            _ => None,
        };
        if let Some(ip) = ip {
            let ihl = usize::from(ip.first().map_or(0, |v| v & 0xf)) * 4;
            if let Some(&step) = ip.get(ihl + 8) {
                *got.entry(step).or_insert(0) += 1;
            }
        }
    };
    if b.len() < 24 {
        bail!(
            "{} is not a capture file ({} bytes)",
            path.display(),
            b.len()
        );
    }
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    if u32_at(0) == 0xa1b2_c3d4 {
        let linktype = u32_at(20);
        let mut o = 24;
        while o + 16 <= b.len() {
            let incl = u32_at(o + 8) as usize;
            if o + 16 + incl > b.len() {
                break;
            }
            add(linktype, &b[o + 16..o + 16 + incl]);
            o += 16 + incl;
        }
    } else if u32_at(0) == 0x0A0D_0D0A {
        let mut links = Vec::new();
        let mut o = 0;
        while o + 12 <= b.len() {
            let (ty, len) = (u32_at(o), u32_at(o + 4) as usize);
            if len < 12 || o + len > b.len() {
                break;
            }
            match ty {
                0x0A0D_0D0A => links.clear(),
                1 => links.push(u32::from(u16::from_le_bytes([b[o + 8], b[o + 9]]))),
                6 => {
                    let id = u32_at(o + 8) as usize;
                    let cap = u32_at(o + 20) as usize;
                    if let (Some(&lt), Some(d)) = (links.get(id), b.get(o + 28..o + 28 + cap)) {
                        add(lt, d);
                    }
                }
                _ => {}
            }
            o += len;
        }
    } else {
        bail!("{}: unknown capture format", path.display());
    }
    Ok(got)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Storm {
    /// UDP flows: one NEW event each (each to its own destination address).
    Udp,
    /// TCP connections to a local listener: NEW, then UPDATEs through the close.
    Tcp,
}

fn ct_run(env: &Env<'_>, who: Watcher, storm: Storm, plan: &Plan) -> Result<Sample> {
    // The previous run's entries would make its flows' tuples existing ones (no NEW event).
    let o = env.ns.command("conntrack").arg("-F").output()?;
    if !o.status.success() {
        bail!(
            "conntrack -F: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let file = env.dir.join("events.txt");
    let out = std::fs::File::create(&file)?;
    let mut cmd = env.ns.command("taskset");
    cmd.args(["-c", "1"]);
    let events = if storm == Storm::Udp { "NEW" } else { "ALL" };
    match who {
        Watcher::Conntrack => {
            cmd.args(["conntrack", "-E", "-o", "timestamp", "-b"])
                .arg(env.buf.to_string());
            if storm == Storm::Udp {
                cmd.args(["-e", "NEW"]);
            }
        }
        Watcher::Zcio => {
            cmd.arg(env.zcio)
                .args(["conntrack", "events", "-o", "timestamp", "-e", events, "-B"])
                .arg((env.buf >> 10).to_string());
        }
    }
    let child = cmd
        .stdout(out)
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {who:?}"))?;
    let pid = child.id();
    // Subscribed once a first flow's event is in the file.
    let mut warm = 0u32;
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        warm += 1;
        let w = warm;
        env.ns.run(move || {
            let s = UdpSocket::bind("127.0.0.1:0")?;
            s.send_to(
                b"w",
                (Ipv4Addr::new(127, 0, 200, (w % 250) as u8), CT_PORT + 7),
            )
        })??;
        std::thread::sleep(Duration::from_millis(20));
        if std::fs::read_to_string(&file)
            .unwrap_or_default()
            .contains("dst=127.0.200.")
        {
            break;
        }
        if Instant::now() > end {
            let err = stop(child, "-KILL").unwrap_or_default();
            bail!("{who:?} never printed an event: {err}");
        }
    }
    let stop_flag = Arc::new(AtomicBool::new(false));
    let (steps, cpu) = match storm {
        Storm::Udp => {
            let sock = Arc::new(env.ns.run(|| UdpSocket::bind("127.0.0.1:0"))??);
            let mut k = 0u32;
            let payloads: [&[u8]; 64] = [b"f"; 64];
            let mut to = [SocketAddrV4::new(Ipv4Addr::LOCALHOST, CT_PORT); 64];
            offer(env.ns, plan, pid, move |step, n| {
                // Flow k of a step goes to 127.S.x.y: every flow its own entry.
                let n = n as usize;
                let s = if step == 255 { 250 } else { step };
                for t in to.iter_mut().take(n) {
                    // 24 bits of k in address and port: no tuple repeats within a run.
                    *t = SocketAddrV4::new(
                        Ipv4Addr::new(127, s, (k >> 8) as u8, k as u8),
                        CT_PORT + (k >> 16) as u16 % 256,
                    );
                    k = k.wrapping_add(1);
                }
                let sent = zcio::sys::net::send_batch(&*sock, &payloads[..n], &to[..n])?;
                Ok(sent as u64)
            })?
        }
        Storm::Tcp => {
            // A listener that accepts and closes, on its own thread.
            let l = env.ns.run(|| TcpListener::bind(("0.0.0.0", TCP_PORT)))??;
            let f = Arc::clone(&stop_flag);
            let acceptor = std::thread::spawn(move || {
                l.set_nonblocking(true).ok();
                while !f.load(Ordering::Relaxed) {
                    match l.accept() {
                        Ok((s, _)) => drop(s),
                        Err(_) => std::thread::sleep(Duration::from_micros(200)),
                    }
                }
            });
            let mut k = 0u32;
            let r = offer(env.ns, plan, pid, move |step, n| {
                let s = if step == 255 { 250 } else { step };
                for _ in 0..n {
                    k = k.wrapping_add(1);
                    // From 127.S.x.y: its own port space, so TIME_WAIT never runs out of ports.
                    let src = Ipv4Addr::new(127, s, (k >> 8) as u8, (k as u8).max(1));
                    let c = tcp_from(src)?;
                    drop(c);
                }
                Ok(n)
            });
            stop_flag.store(true, Ordering::Relaxed);
            let _ = acceptor.join();
            r?
        }
    };
    std::thread::sleep(Duration::from_millis(200));
    let err = stop(child, "-INT")?;
    let text = std::fs::read_to_string(&file)?;
    let mut got = std::collections::HashMap::new();
    for line in text.lines() {
        if !line.contains("[NEW]") {
            continue;
        }
        let key = match storm {
            Storm::Udp => " dst=127.",
            Storm::Tcp => " src=127.",
        };
        if let Some(i) = line.find(key) {
            let rest = &line[i + key.len()..];
            if let Some(s) = rest.split('.').next().and_then(|x| x.parse::<u8>().ok()) {
                let s = if s == 250 { 255 } else { s };
                *got.entry(s).or_insert(0u64) += 1;
            }
        }
    }
    let mut s = sample(plan, &steps, &got, cpu);
    // CPU per event counts every event the consumer printed during the flat-out step (TCP:
    // about six per connection), not just the NEW ones.
    if storm == Storm::Tcp {
        let per_conn = text
            .lines()
            .filter(|l| l.contains(" src=127.250.") || l.contains(" dst=127.250."))
            .count() as f64
            / got.get(&255).copied().unwrap_or(1).max(1) as f64;
        if let (Some(c), Some(r)) = (
            s.values.get("consumer_cpu").copied(),
            s.values.get("saturated_rate").copied(),
        ) {
            s.set("consumer_cpu", c / per_conn.max(1.0));
            s.set("saturated_rate", r * per_conn);
        }
        if let Some(r) = s.values.get("loss_free_rate").copied() {
            s.set("loss_free_rate", r * per_conn);
        }
        s.note(format!("{per_conn:.1} events per connection"));
    }
    if err.contains("ENOBUFS") || err.contains("LOSS") {
        s.note(format!("{who:?} reported loss"));
    }
    Ok(s)
}

/// A TCP connection to the listener from `src`.
fn tcp_from(src: Ipv4Addr) -> std::io::Result<TcpStream> {
    let s = TcpStream::from(zcio::sys::socket(libc::AF_INET, libc::SOCK_STREAM, 0)?);
    zcio::sys::net::bind_v4(&s, SocketAddrV4::new(src, 0))?;
    zcio::sys::net::connect_v4(&s, SocketAddrV4::new(Ipv4Addr::LOCALHOST, TCP_PORT))?;
    Ok(s)
}

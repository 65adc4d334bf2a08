//! `python`: the same UDP flood through an NFQUEUE rule as `nfq`, consumed by a Python process
//! that accepts every packet, with `netfilterqueue` 1.1.0, `fnfqueue` 1.1.2 and zcio's Python
//! package (`zcio.NetfilterQueue`, the drop-in: the very same callback code; and
//! `zcio.NfQueue.batches`). A second case parses every packet with scapy and drops by port, to
//! show what share of a real consumer's cost is left to the library.
//!
//! The suite makes a virtual environment under `target/bench-py` and installs the three
//! libraries and scapy from PyPI into it (netfilterqueue builds against Debian's
//! `libnetfilter-queue-dev`, fnfqueue with cffi), and zcio from `crates/zcio-py` with pip, as a
//! user would. The consumer is `crates/zcio-py/bench/nfq_consumer.py`: it binds, the sender
//! fills the kernel queue (UDP GSO, CPU 0), then it decides them all (CPU 1); consumer CPU is
//! the whole Python process's user + system time (every thread: fnfqueue reads on its own).

use super::nfq::{spawn_gso_sender, spawn_receiver, waiting, Gate, PORT};
use crate::bench::pair::pair;
use crate::bench::{Better, Ctx, MetricDef, Sample, Suite};
use anyhow::{anyhow, bail, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use zcio_testnet::Netns;

/// The suite.
pub struct Python;

const QUEUE: u16 = 17;

/// The metrics of a consumer run (`run_consumer`; the `go` suite's too).
pub(super) const METRICS: &[MetricDef] = &[
    MetricDef::new("delivered", "pkt/s", Better::Higher),
    MetricDef::new("consumer_cpu", "us/pkt", Better::Lower),
    MetricDef::new("copied_fraction", "fraction", Better::Lower),
];

/// The workspace (for `crates/zcio-py`, `bindings/go`, `scripts/` and `target/`), where the
/// bench binary was built (`ZCIO_WORKSPACE` overrides it).
pub(super) fn workspace() -> PathBuf {
    std::env::var_os("ZCIO_WORKSPACE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// Makes `target/bench-py` with the three libraries and scapy; returns its interpreter.
fn venv(ws: &Path) -> Result<PathBuf> {
    let dir = ws.join("target/bench-py");
    let py = dir.join("bin/python");
    let run = |c: &mut Command, what: &str| -> Result<()> {
        let o = c.output().with_context(|| what.to_string())?;
        if !o.status.success() {
            bail!(
                "{what} failed: {}",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
        }
        Ok(())
    };
    if !py.exists() {
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&dir),
            "python3 -m venv target/bench-py",
        )?;
    }
    let pip = dir.join("bin/pip");
    run(
        Command::new(&pip).args([
            "install",
            "-q",
            "netfilterqueue==1.1.0",
            "fnfqueue==1.1.2",
            "scapy",
        ]),
        "pip install netfilterqueue==1.1.0 fnfqueue==1.1.2 scapy (netfilterqueue needs \
         libnetfilter-queue-dev and python3-dev: scripts/deps)",
    )?;
    run(
        Command::new(&pip)
            .args(["install", "-q", "--force-reinstall", "--no-deps"])
            .arg(ws.join("crates/zcio-py")),
        "pip install ./crates/zcio-py",
    )?;
    Ok(py)
}

impl Suite for Python {
    fn name(&self) -> &'static str {
        "python"
    }
    fn about(&self) -> &'static str {
        "UDP through an NFQUEUE rule consumed from Python: netfilterqueue 1.1.0 and fnfqueue 1.1.2 vs zcio.NetfilterQueue (same callback) and zcio.NfQueue batches; with and without scapy parsing"
    }
    fn chart_metric(&self) -> &'static str {
        "delivered"
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        if let Err(e) = zcio_testnet::check_privileges() {
            return Err(ctx.skip(e.to_string()));
        }
        let ws = workspace();
        let script = ws.join("crates/zcio-py/bench/nfq_consumer.py");
        if !script.exists() {
            return Err(ctx.skip(format!(
                "{} not found (set ZCIO_WORKSPACE)",
                script.display()
            )));
        }
        let py = match venv(&ws) {
            Ok(p) => p,
            Err(e) => return Err(ctx.skip(format!("{e:#}"))),
        };
        let ns = Netns::new("pyb").context("namespace")?;
        let rule = ns
            .command("iptables")
            .args(["-A", "INPUT", "-p", "udp", "--dport", &PORT.to_string()])
            .args(["-j", "NFQUEUE", "--queue-num", &QUEUE.to_string()])
            .output()
            .context("iptables")?;
        if !rule.status.success() {
            return Err(ctx.skip(format!(
                "iptables NFQUEUE rule refused: {}",
                String::from_utf8_lossy(&rule.stderr).trim()
            )));
        }
        ctx.note(
            "netlink delivers every queued packet by copy: copied_fraction is 1 on every side; \
             zcio's payload views are zero-copy from the frame ring on",
        );
        ctx.note(
            "method: a Python consumer (CPU 1) binds the queue, the sender (UDP GSO, CPU 0) queues \
             N datagrams, the consumer decides them all; delivered = datagrams the receiver got / \
             the consumer's drain time; consumer_cpu = the Python process's CPU (all threads, \
             including the reinjection its verdicts trigger) / datagrams delivered",
        );
        let count: u64 = ctx.pick(5_000, 40_000);
        let env = Env {
            ns: &ns,
            py: &py,
            script: &script,
        };
        for size in [64usize, 1400] {
            for (label, mode) in [
                ("netfilterqueue 1.1.0", "netfilterqueue"),
                ("fnfqueue 1.1.2", "fnfqueue"),
            ] {
                ctx.compare(
                    &format!("python {size}B: callback API vs {label}"),
                    (label, "zcio.NetfilterQueue"),
                    METRICS,
                    || env.run(mode, size, count, false),
                    || env.run("zcio-callback", size, count, false),
                )?;
            }
            ctx.compare(
                &format!("python {size}B: batch API vs netfilterqueue 1.1.0"),
                ("netfilterqueue 1.1.0", "zcio.NfQueue batches"),
                METRICS,
                || env.run("netfilterqueue", size, count, false),
                || env.run("zcio-batch", size, count, false),
            )?;
        }
        // scapy parses every packet: what share of the cost is left to the library.
        let count = count / 4;
        for size in [64usize, 1400] {
            ctx.compare(
                &format!("python {size}B scapy parse, drop by port: callback API vs netfilterqueue 1.1.0"),
                ("netfilterqueue 1.1.0 + scapy", "zcio.NetfilterQueue + scapy"),
                METRICS,
                || env.run("netfilterqueue", size, count, true),
                || env.run("zcio-callback", size, count, true),
            )?;
        }
        Ok(())
    }
}

struct Env<'a> {
    ns: &'a Netns,
    py: &'a Path,
    script: &'a Path,
}

impl Env<'_> {
    /// One run: receiver, consumer process, sender; the consumer drains `count` packets.
    fn run(&self, mode: &str, size: usize, count: u64, scapy: bool) -> Result<Sample> {
        let label = format!("{mode} {size}B{}", if scapy { " +scapy" } else { "" });
        run_consumer(self.ns, QUEUE, &label, size, count, |cpu| {
            let mut c = self.ns.command(&self.py.to_string_lossy());
            c.arg(self.script)
                .args([
                    mode,
                    &QUEUE.to_string(),
                    &count.to_string(),
                    &cpu.to_string(),
                ])
                .arg(if scapy { "scapy" } else { "none" });
            c
        })
    }
}

/// One run of a consumer process (the `python` and `go` suites' protocol): a UDP receiver
/// behind the queue, the consumer made by `make(consumer CPU)` (it binds `queue`, prints
/// "ready", waits for "go" on stdin, decides `count` packets and prints one JSON line with its
/// CPU seconds, wall seconds from "go" and the packets handled), and the GSO sender that fills
/// the kernel queue before "go".
pub(super) fn run_consumer(
    ns: &Netns,
    queue: u16,
    label: &str,
    size: usize,
    count: u64,
    make: impl FnOnce(usize) -> Command,
) -> Result<Sample> {
    let cpus = zcio_testnet::cpu::online_cpus();
    let (c_send, c_cons) = if cpus > 1 { (0, 1) } else { (0, 0) };
    let stop_recv = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(3));
    let filled = Arc::new(Barrier::new(2));
    let sink = pair("consumer receiver").server_core(c_send).server_in(ns);
    let receiver = spawn_receiver(&sink, &stop_recv, &received, Gate::new(&ready))?;

    let mut child = make(c_cons)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting the {label} consumer"))?;
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    out.read_line(&mut line)?;
    if line.trim() != "ready" {
        let _ = child.kill();
        let o = child.wait_with_output()?;
        bail!(
            "{label}: consumer did not bind: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let sides = pair("consumer queue")
        .cores((c_send, c_cons))
        .server_in(ns)
        .client_in(ns);
    let sender = spawn_gso_sender(&sides, size, count, (Gate::new(&ready), Gate::new(&filled)))?;
    // Our own pass through both gates: the sender starts once the receiver and we are
    // ready, and has queued everything when `filled` opens.
    Gate::new(&ready).wait();
    Gate::new(&filled).wait();
    let sent = sender.io_result()?;
    let queued = ns.run(move || waiting(queue)).unwrap_or(0);
    let mut stdin = child.stdin.take().expect("piped");
    writeln!(stdin, "go")?;
    drop(stdin);
    line.clear();
    let deadline = Instant::now() + Duration::from_secs(120);
    out.read_line(&mut line)?;
    let status = child.wait()?;
    if !status.success() || Instant::now() > deadline {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        bail!("{label}: consumer failed ({status}): {}", err.trim());
    }
    let r: serde_json::Value =
        serde_json::from_str(line.trim()).map_err(|e| anyhow!("{label}: result {line:?}: {e}"))?;
    let num = |k: &str| r.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
    let (cpu, wall, handled) = (num("cpu"), num("wall"), num("handled"));
    let end = Instant::now() + Duration::from_secs(2);
    while (received.load(Ordering::Relaxed) as f64) < handled && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(2));
    }
    stop_recv.store(true, Ordering::Relaxed);
    receiver.io_result()?;
    let delivered = received.load(Ordering::Relaxed);
    anyhow::ensure!(
        delivered > 0,
        "{label}: no packet was delivered through the queue"
    );
    let mut s = Sample::default();
    s.set("consumer_cpu", cpu / delivered as f64 * 1e6)
        .set("delivered", delivered as f64 / wall.max(1e-9))
        .set("copied_fraction", 1.0);
    let path = r.get("path").and_then(|v| v.as_str()).unwrap_or("");
    s.note(format!(
        "{label}: {sent} sent, {queued} queued before the consumer started, \
         {handled:.0} decided, {delivered} delivered{}{}",
        if path.is_empty() {
            String::new()
        } else {
            format!(" [{path}]")
        },
        match r.get("syscalls").and_then(|v| v.as_f64()) {
            Some(n) => format!(", {:.3} syscalls/pkt", n / handled.max(1.0)),
            None => String::new(),
        }
    ));
    Ok(s)
}

//! `go`: NFQUEUE and NFLOG consumed from Go — zcio's Go module (`bindings/go`, cgo over the
//! libzcio that `scripts/install-capi` installs) against go-nfqueue v2.0.3 and go-nflog
//! v2.3.0 (pure Go over mdlayher/netlink: one `recvmsg` per message, one `sendmsg` per
//! verdict).
//!
//! The consumer is `bindings/go/bench`, built twice from the same source (the callbacks are
//! the same code; `-tags peer` swaps the packages): the NFQUEUE cases use the `python`
//! suite's harness (UDP GSO flood into a pre-filled queue, a receiver behind it, the consumer
//! process on CPU 1 accepting every packet), the NFLOG case the `netlink` suite's ladder of
//! offered rates (every packet numbered by its step and counted by the consumer).

use super::netlink::{self, offer_log, sample, stop, wait_bound, NetlinkSuite, GROUP, LOG_PORT};
use super::nfq::PORT;
use super::python::{run_consumer, workspace, METRICS};
use crate::bench::{Ctx, Sample, Suite};
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use zcio_testnet::Netns;

/// The suite.
pub struct GoSuite;

const QUEUE: u16 = 19;

fn run_ok(c: &mut Command, what: &str) -> Result<()> {
    let o = c.output().with_context(|| what.to_string())?;
    if !o.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(())
}

/// The Go toolchain: `go` on PATH, or where the official archive installs it.
fn go_tool() -> PathBuf {
    let on_path = Command::new("go")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let archive = Path::new("/usr/local/go/bin/go");
    if !on_path && archive.exists() {
        archive.to_path_buf()
    } else {
        PathBuf::from("go")
    }
}

/// Installs libzcio into `target/go-capi` and builds the two consumers; returns (zcio, peer).
fn build(ws: &Path) -> Result<(PathBuf, PathBuf)> {
    let go = go_tool();
    run_ok(
        Command::new(&go).arg("version"),
        "go version (the Go toolchain, 1.22 or later)",
    )?;
    let release = ws.join("target/release");
    if !release.join("libzcio_capi.a").exists() {
        run_ok(
            Command::new("cargo")
                .args(["build", "--release", "-q", "-p", "zcio-capi"])
                .current_dir(ws),
            "cargo build --release -p zcio-capi",
        )?;
    }
    let prefix = ws.join("target/go-capi");
    run_ok(
        Command::new(ws.join("scripts/install-capi"))
            .arg(&prefix)
            .env("ZCIO_CAPI_FROM", &release),
        "scripts/install-capi target/go-capi",
    )?;
    let out = ws.join("target/go-bench");
    let (zcio, peer) = (out.join("consumer-zcio"), out.join("consumer-peer"));
    for (bin, tags) in [(&zcio, ""), (&peer, "peer")] {
        run_ok(
            Command::new(&go)
                .args(["build", "-tags", tags, "-o"])
                .arg(bin)
                .arg(".")
                .current_dir(ws.join("bindings/go/bench"))
                .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
                .env(
                    "CGO_LDFLAGS",
                    format!("-Wl,-rpath,{}", prefix.join("lib").display()),
                )
                .env("GOFLAGS", "-mod=mod"),
            &format!("go build bindings/go/bench (tags {tags:?})"),
        )?;
    }
    Ok((zcio, peer))
}

impl Suite for GoSuite {
    fn name(&self) -> &'static str {
        "go"
    }
    fn about(&self) -> &'static str {
        "NFQUEUE and NFLOG from Go: zcio's Go module (drop-in API with the same callback, batch API) vs go-nfqueue v2.0.3; NFLOG loss-free rate vs go-nflog v2.3.0"
    }
    fn chart_metric(&self) -> &'static str {
        "delivered"
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        if let Err(e) = zcio_testnet::check_privileges() {
            return Err(ctx.skip(e.to_string()));
        }
        let ws = workspace();
        if !ws.join("bindings/go/bench/consumer.go").exists() {
            return Err(ctx.skip(format!(
                "{} has no bindings/go (set ZCIO_WORKSPACE)",
                ws.display()
            )));
        }
        let (zcio, peer) = match build(&ws) {
            Ok(b) => b,
            Err(e) => return Err(ctx.skip(format!("{e:#}"))),
        };
        ctx.note(
            "netlink delivers every queued or logged packet by copy: copied_fraction is 1 on \
             every side; zcio's Go payloads point into the frame ring (no copy after that), \
             go-nfqueue's and go-nflog's into a buffer per receive",
        );
        ctx.note(
            "NFQUEUE method: the consumer (CPU 1, the same callback code built against each \
             library: accept every packet) binds; the sender (UDP GSO, CPU 0) queues N \
             datagrams; the consumer decides them all; delivered = datagrams the receiver got / \
             the consumer's drain time; consumer_cpu = the whole Go process's CPU (every \
             thread) / datagrams delivered; every consumer's socket has a 48 MiB buffer",
        );
        let ns = Netns::new("gob").context("namespace")?;
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
        let count: u64 = ctx.pick(10_000, 40_000);
        let sizes: &[usize] = ctx.pick(&[64], &[64, 1400]);
        let queue = |bin: &Path, mode: &'static str, size: usize| {
            let label = format!(
                "{} {mode} {size}B",
                bin.file_name().unwrap_or_default().to_string_lossy()
            );
            run_consumer(&ns, QUEUE, &label, size, count, |cpu| {
                let mut c = ns.command("taskset");
                c.args(["-c", &cpu.to_string()]).arg(bin).args([
                    mode,
                    &QUEUE.to_string(),
                    &count.to_string(),
                ]);
                c
            })
        };
        for &size in sizes {
            ctx.compare(
                &format!("go {size}B: drop-in API vs go-nfqueue v2.0.3 (same callback)"),
                ("go-nfqueue v2.0.3", "zcio/go/nfqueue"),
                METRICS,
                || queue(&peer, "nfq", size),
                || queue(&zcio, "nfq", size),
            )?;
            ctx.compare(
                &format!("go {size}B: batch API vs go-nfqueue v2.0.3"),
                ("go-nfqueue v2.0.3", "zcio/go/nfqueue RegisterBatch"),
                METRICS,
                || queue(&peer, "nfq", size),
                || queue(&zcio, "nfq-batch", size),
            )?;
        }
        drop(ns);

        // NFLOG: the netlink suite's ladder, counted by the Go consumer itself.
        let ns = Netns::new("gol").context("namespace")?;
        for rule in [
            format!(
                "-t raw -A PREROUTING -p udp --dport {LOG_PORT} -j NFLOG --nflog-group {GROUP}"
            ),
            format!("-t raw -A PREROUTING -p udp --dport {LOG_PORT} -j DROP"),
        ] {
            let o = ns.command("iptables").args(rule.split(' ')).output()?;
            if !o.status.success() {
                return Err(ctx.skip(format!(
                    "iptables NFLOG rule refused: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                )));
            }
        }
        ctx.note(
            "NFLOG method: the netlink suite's ladder of offered rates (sender on CPU 0, a pause \
             after each step), every packet counted by its step in the consumer (CPU 1; both \
             sockets 8 MiB, SO_RCVBUFFORCE); loss_free_rate = the highest rate up to which every \
             step arrived whole. On 2 cores the sender (which also pays the kernel's logging) \
             may top out below what either consumer drains: a run whose every step arrived is \
             sender-bound, and its ratio says nothing about the consumers (consumer_cpu does)",
        );
        let plan = NetlinkSuite::plan(
            ctx,
            &[50_000, 100_000, 200_000, 400_000, 800_000, 1_600_000],
        );
        ctx.compare(
            "go nflog udp 64B vs go-nflog v2.3.0 (same callback)",
            ("go-nflog v2.3.0", "zcio/go/nflog"),
            netlink::METRICS,
            || log_run(&ns, &peer, &plan),
            || log_run(&ns, &zcio, &plan),
        )?;
        Ok(())
    }
}

fn log_run(ns: &Netns, bin: &Path, plan: &netlink::Plan) -> Result<Sample> {
    let mut child = ns
        .command("taskset")
        .args(["-c", "1"])
        .arg(bin)
        .args(["nflog", &GROUP.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the Go NFLOG consumer")?;
    let mut out = child.stdout.take().expect("piped");
    let pid = child.id();
    if let Err(e) = wait_bound(ns) {
        let err = stop(child, "-KILL").unwrap_or_default();
        bail!("{e}: {err}");
    }
    let (steps, cpu) = offer_log(ns, plan, 64, pid)?;
    let err = stop(child, "-TERM")?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut out, &mut text)?;
    let r: serde_json::Value = serde_json::from_str(text.trim())
        .with_context(|| format!("the consumer's counts {text:?}: {err}"))?;
    let mut got = HashMap::new();
    if let Some(m) = r["counts"].as_object() {
        for (k, v) in m {
            if let (Ok(step), Some(n)) = (k.parse::<u8>(), v.as_u64()) {
                got.insert(step, n);
            }
        }
    }
    Ok(sample(plan, &steps, &got, cpu))
}

//! `audit`: `zcio audit` as the audit daemon against auditd 3.0.9 (Debian 12's), both writing
//! auditd's RAW log to tmpfs (auditd with `flush = NONE`), so the disk is not what is measured.
//!
//! Each measured run sets the kernel's `backlog_limit` (the default 64, then 8,192) and
//! `backlog_wait_time` 0 (a record that finds the backlog full is dropped and counted in
//! `lost` instead of making the task wait), starts one consumer (pinned to CPU 1), and offers
//! a ladder of audited-syscall rates from CPU 0: `openat` + `close` of a file watched by a
//! rule tagged with the suite's key, one file per step, so the log says how many events of
//! each step arrived (their PATH record's name). `loss_free_rate` is the highest offered rate
//! up to which every step arrived whole (the rate the opener reached, which falls short of
//! the target where the kernel formats every record rather than dropping some); a last step
//! opens flat out: the consumer's CPU time
//! (all threads, `/proc/PID/task/*/schedstat`) over the events it wrote is `consumer_cpu`, and
//! the kernel's `lost` counter's growth during that step is `lost_flat` (records; a lower
//! bound of the records lost: the kernel counts one where it refuses an event's first record
//! and never makes the event's others, `netlink::audit`'s "Losses"). The kernel
//! side (kauditd, the syscalls' own record building) is the same for both and not counted.
//! The host's audit state is saved first and set back after every run.

use crate::bench::{Better, Ctx, MetricDef, Sample, Suite};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zcio::netlink::audit_status;

/// The suite.
pub struct AuditSuite;

const METRICS: &[MetricDef] = &[
    MetricDef::new("loss_free_rate", "events/s", Better::Higher),
    MetricDef::new("consumer_cpu", "us/event", Better::Lower),
    MetricDef::new("saturated_rate", "events/s", Better::Higher),
    MetricDef::new("lost_flat", "records", Better::Lower),
];

const KEY: &str = "zcio-bench-audit";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Daemon {
    Auditd,
    Zcio,
}

fn auditctl(args: &[&str]) -> Result<()> {
    let o = Command::new("auditctl")
        .args(args)
        .output()
        .context("auditctl")?;
    if !o.status.success() {
        bail!(
            "auditctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(())
}

/// The host's audit state, set back on drop (rules by the suite's key included).
struct Saved(zcio::netlink::AuditStatus);

impl Drop for Saved {
    fn drop(&mut self) {
        let s = self.0;
        let _ = auditctl(&["-D", "-k", KEY]);
        let _ = zcio_testnet::audit::set_back(&s);
    }
}

/// A tmpfs directory (`/dev/shm`), removed on drop.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start(who: Daemon, dir: &Path) -> Result<Child> {
    let log = dir.join("audit.log");
    let _ = std::fs::remove_file(&log);
    let mut cmd = match who {
        Daemon::Auditd => {
            zcio_testnet::audit::write_auditd_conf(dir)?;
            let mut c = Command::new("taskset");
            c.args(["-c", "1", "auditd", "-n", "-s", "nochange", "-c"])
                .arg(dir);
            c
        }
        Daemon::Zcio => {
            let mut c = Command::new("taskset");
            c.args(["-c", "1"])
                .arg(std::env::current_exe()?)
                .args(["audit", "--format", "auditd", "--no-enable", "-w"])
                .arg(&log);
            c
        }
    };
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {who:?}"))?;
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if audit_status().is_ok_and(|s| s.pid == child.id()) {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let err = super::netlink::stop(child, "-KILL").unwrap_or_default();
    bail!("{who:?} did not register as the audit daemon: {err}")
}

/// Opens `file` `n` times at `rate` per second (0: flat out) for at most `limit`; returns
/// the opens and the seconds taken.
fn offer(file: &Path, rate: u64, limit: Duration) -> Result<(u64, f64)> {
    let start = Instant::now();
    let total = if rate == 0 {
        u64::MAX
    } else {
        (rate as f64 * limit.as_secs_f64()) as u64
    };
    let mut sent = 0u64;
    while sent < total && start.elapsed() < limit + Duration::from_millis(200) {
        if rate != 0 {
            let due = start + Duration::from_secs_f64(sent as f64 / rate as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        drop(std::fs::File::open(file).context("openat of the watched file")?);
        sent += 1;
        if rate == 0 && start.elapsed() >= limit {
            break;
        }
    }
    Ok((sent, start.elapsed().as_secs_f64()))
}

fn run_one(
    who: Daemon,
    dir: &Path,
    backlog: u32,
    rates: &[u64],
    ctx_step: Duration,
    flat: Duration,
) -> Result<Sample> {
    auditctl(&[
        "-b",
        &backlog.to_string(),
        "--backlog_wait_time",
        "0",
        "-e",
        "1",
    ])?;
    let files: Vec<PathBuf> = (0..=rates.len())
        .map(|i| dir.join(format!("s{i}")))
        .collect();
    for f in &files {
        std::fs::write(f, b"x")?;
        auditctl(&["-w", f.to_str().context("utf-8")?, "-p", "r", "-k", KEY])?;
    }
    let child = start(who, dir)?;
    let pid = child.id();
    let _ = zcio_testnet::cpu::pin_thread(0);
    let mut steps = Vec::new();
    for (i, &rate) in rates.iter().enumerate() {
        let (sent, secs) = offer(&files[i], rate, ctx_step)?;
        steps.push((sent, secs));
        std::thread::sleep(Duration::from_millis(300));
    }
    let lost0 = audit_status().map(|s| s.lost).unwrap_or(0);
    let cpu0 = super::netlink::cpu_ns(pid);
    let flat_step = offer(&files[rates.len()], 0, flat)?;
    std::thread::sleep(Duration::from_millis(600));
    let cpu = super::netlink::cpu_ns(pid) - cpu0;
    let lost1 = audit_status().map(|s| s.lost).unwrap_or(0);
    let err = super::netlink::stop(child, "-TERM")?;
    for f in &files {
        let _ = auditctl(&["-W", f.to_str().context("utf-8")?, "-p", "r", "-k", KEY]);
    }
    let log = std::fs::read(dir.join("audit.log")).context("reading the consumer's log")?;
    // Events per step: PATH records naming the step's file.
    let mut got = vec![0u64; files.len()];
    for line in log.split(|&c| c == b'\n') {
        if !line.starts_with(b"type=PATH ") {
            continue;
        }
        for (i, f) in files.iter().enumerate() {
            let want = format!("name=\"{}\"", f.display());
            if line.windows(want.len()).any(|w| w == want.as_bytes()) {
                got[i] += 1;
                break;
            }
        }
    }
    let mut s = Sample::default();
    let mut loss_free = 0.0;
    for (i, &(sent, secs)) in steps.iter().enumerate() {
        if got[i] != sent {
            s.note(format!(
                "backlog {backlog}: first lossy step offered {:.0}/s: {} of {} events written",
                sent as f64 / secs.max(1e-9),
                got[i],
                sent
            ));
            break;
        }
        // The rate actually offered: the opener slows down when the kernel formats every
        // record instead of dropping some (and on a loaded machine), so a step may offer less
        // than its target.
        loss_free = f64::max(loss_free, sent as f64 / secs.max(1e-9));
    }
    let delivered = got[rates.len()];
    s.set("loss_free_rate", loss_free);
    s.set("saturated_rate", delivered as f64 / flat_step.1.max(1e-9));
    if delivered > 0 {
        s.set("consumer_cpu", cpu as f64 / 1e3 / delivered as f64);
    }
    s.set("lost_flat", f64::from(lost1.wrapping_sub(lost0)));
    s.note(format!(
        "backlog {backlog}: flat out offered {:.0}/s, {} of {} written, kernel lost {} records",
        flat_step.0 as f64 / flat_step.1.max(1e-9),
        delivered,
        flat_step.0,
        lost1.wrapping_sub(lost0)
    ));
    if who == Daemon::Zcio {
        if let Some(l) = err.lines().find(|l| l.contains("fallback")) {
            s.note(l.to_string());
        }
    }
    Ok(s)
}

impl Suite for AuditSuite {
    fn name(&self) -> &'static str {
        "audit"
    }
    fn about(&self) -> &'static str {
        "zcio audit (the audit daemon on the frame ring) vs auditd 3.0.9, both logging to \
         tmpfs: loss-free audited-syscall rate, consumer CPU per event, the kernel's lost \
         count flat out; backlog_limit 64 and 8,192, backlog_wait_time 0"
    }
    fn chart_metric(&self) -> &'static str {
        "loss_free_rate"
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        if !zcio_testnet::is_root() {
            return Err(ctx.skip("needs root (CAP_AUDIT_CONTROL)"));
        }
        if Command::new("auditd").arg("-v").output().is_err() {
            return Err(ctx.skip("auditd missing (scripts/deps installs it)"));
        }
        let saved = match audit_status() {
            Ok(s) => Saved(s),
            Err(e) => return Err(ctx.skip(format!("AUDIT_GET: {e}"))),
        };
        if saved.0.pid != 0 {
            return Err(ctx.skip(format!(
                "pid {} is the registered audit daemon: the suite does not replace it",
                saved.0.pid
            )));
        }
        if saved.0.enabled == 2 {
            return Err(ctx.skip("audit is locked (enabled 2)"));
        }
        let dir = Dir(PathBuf::from(format!(
            "/dev/shm/zcio-bench-audit-{}",
            std::process::id()
        )));
        std::fs::create_dir_all(&dir.0)?;
        let rates: Vec<u64> = match ctx.mode {
            crate::bench::Mode::Quick => vec![500, 2_000, 8_000, 32_000],
            _ => vec![
                250, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000,
            ],
        };
        let step = ctx.pick(Duration::from_millis(300), Duration::from_secs(1));
        let flat = ctx.pick(Duration::from_millis(500), Duration::from_secs(2));
        ctx.note(
            "copied: every record is copied by the kernel into a netlink skb and out of it \
             (frame ring or recv); COPIED 1.0 for both",
        );
        ctx.note(
            "go-audit is not a second baseline: the Go module proxy refuses \
             github.com/slackhq/go-audit (403, \"module version not available\")",
        );
        for backlog in [64u32, 8192] {
            ctx.compare(
                &format!("backlog {backlog}"),
                ("auditd 3.0.9", "zcio audit"),
                METRICS,
                || run_one(Daemon::Auditd, &dir.0, backlog, &rates, step, flat),
                || run_one(Daemon::Zcio, &dir.0, backlog, &rates, step, flat),
            )?;
        }
        drop(saved);
        Ok(())
    }
}

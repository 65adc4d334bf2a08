//! `audit`: `zcio audit` as the audit daemon against auditd 3.0.9 (Debian 12's), both writing
//! auditd's RAW log to tmpfs (auditd with `flush = NONE`), so the disk is not what is measured.
//!
//! Each measured run sets the kernel's `backlog_limit` (the default 64, then 8,192) and
//! `backlog_wait_time` 0 (a record that finds the backlog full is dropped and counted in
//! `lost` instead of making the task wait), starts one consumer (pinned to CPU 1), and offers
//! steps of audited syscalls: `openat` + `close` of a file watched by a rule tagged with the
//! suite's key, one file per step, from up to 8 opener threads on every CPU (one thread tops
//! out where the kernel's record formatting fills its CPU; their CPU time is not the
//! consumer's). A step is loss-free when the log holds every one of its events whole
//! (`SYSCALL`, `CWD`, `PATH`, `PROCTITLE` under one serial), no serial between its first and
//! last event is missing (an event the kernel numbered but dropped on its way, which its
//! `lost` does not count) and the kernel's `lost` did not grow. `loss_free_rate` is found by
//! a search: rates doubling from 500/s (openers doubling wherever a step falls short of its
//! target) until a step loses, then bisection between the highest loss-free and the lowest
//! lossy offered rate; the note says both steps. A last step opens flat out from 8 threads:
//! the consumer's CPU time (all threads, `/proc/PID/task/*/schedstat`) over the events it
//! wrote is `consumer_cpu`, and the kernel's `lost` counter's growth during that step is
//! `lost_flat` (records; a lower bound of the records lost: the kernel counts one where it
//! refuses an event's first record and never makes the event's others, `netlink::audit`'s
//! "Losses"). The kernel side (kauditd, the syscalls' own record building) is the same for
//! both and not counted. The host's audit state is saved first and set back after every run.

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

/// Most opener threads a step uses: each `openat` of a watched file costs the opener the
/// kernel's record formatting (tens of microseconds), so one thread tops out far below what a
/// consumer can take; more threads (on every CPU) raise the offered rate until the machine is
/// the limit.
const MAX_OPENERS: usize = 8;

/// Opens `file` at `rate` per second in all (0: flat out) from `openers` threads, for `limit`;
/// returns the opens and the seconds taken. The threads inherit no pinning (they run on every
/// CPU; the consumer alone is pinned), and their CPU time is not the consumer's.
fn offer(file: &Path, rate: u64, openers: usize, limit: Duration) -> Result<(u64, f64)> {
    let start = Instant::now();
    let per = rate as f64 / openers as f64;
    let sent: Vec<Result<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..openers)
            .map(|_| {
                s.spawn(move || -> Result<u64> {
                    let _ = zcio_testnet::cpu::unpin_thread();
                    let total = if rate == 0 {
                        u64::MAX
                    } else {
                        (per * limit.as_secs_f64()) as u64
                    };
                    let mut sent = 0u64;
                    while sent < total && start.elapsed() < limit + Duration::from_millis(200) {
                        if rate != 0 {
                            let due = start + Duration::from_secs_f64(sent as f64 / per);
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
                    Ok(sent)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("an opener panicked")))
            })
            .collect()
    });
    let mut n = 0;
    for r in sent {
        n += r?;
    }
    Ok((n, start.elapsed().as_secs_f64()))
}

/// The consumer's log, read as it grows.
struct LogTail {
    path: PathBuf,
    offset: u64,
}

/// What the log says about one step's events.
#[derive(Debug, Default, Clone, Copy)]
struct StepLog {
    /// Events naming the step's file with every record of an audited `openat` (SYSCALL, CWD,
    /// PATH, PROCTITLE).
    whole: u64,
    /// Events naming the step's file with some of those records missing.
    broken: u64,
    /// Serials missing between the first and the last of the step's events: events the
    /// kernel numbered that never reached the log (of any process; the kernel's `lost` does
    /// not count these: a record dropped after it was made, on its way to the daemon).
    serial_gaps: u64,
}

impl LogTail {
    /// Reads what was written since the last call (whole lines) and tallies the events of
    /// `file`.
    fn step(&mut self, file: &Path) -> Result<StepLog> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open(&self.path).context("reading the consumer's log")?;
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        let whole_lines = buf.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
        self.offset += whole_lines as u64;
        let want = format!("name=\"{}\"", file.display());
        // serial -> (records seen as a bit set, names the file)
        let mut evs: std::collections::BTreeMap<u64, (u8, bool)> = Default::default();
        for line in buf[..whole_lines].split(|&c| c == b'\n') {
            let Some(serial) = serial_of(line) else {
                continue;
            };
            let bit = if line.starts_with(b"type=SYSCALL ") {
                1
            } else if line.starts_with(b"type=CWD ") {
                2
            } else if line.starts_with(b"type=PATH ") {
                4
            } else if line.starts_with(b"type=PROCTITLE ") {
                8
            } else {
                0
            };
            let e = evs.entry(serial).or_default();
            e.0 |= bit;
            if bit == 4 && line.windows(want.len()).any(|w| w == want.as_bytes()) {
                e.1 = true;
            }
        }
        let mut out = StepLog::default();
        let mine: Vec<u64> = evs.iter().filter(|e| e.1 .1).map(|e| *e.0).collect();
        for s in &mine {
            if evs[s].0 == 15 {
                out.whole += 1;
            } else {
                out.broken += 1;
            }
        }
        if let (Some(&lo), Some(&hi)) = (mine.first(), mine.last()) {
            let present = evs.range(lo..=hi).count() as u64;
            out.serial_gaps = (hi - lo + 1) - present;
        }
        Ok(out)
    }
}

/// The serial of a RAW log line (`msg=audit(SEC.MSEC:SERIAL):`).
fn serial_of(line: &[u8]) -> Option<u64> {
    let at = line.windows(10).position(|w| w == b"msg=audit(")? + 10;
    let rest = &line[at..];
    let colon = rest.iter().position(|&c| c == b':')?;
    let close = rest.iter().position(|&c| c == b')')?;
    std::str::from_utf8(rest.get(colon + 1..close)?)
        .ok()?
        .parse()
        .ok()
}

/// One offered step and what came of it.
#[derive(Debug, Clone, Copy)]
struct Step {
    target: u64,
    openers: usize,
    sent: u64,
    secs: f64,
    log: StepLog,
    kernel_lost: u32,
}

impl Step {
    fn rate(&self) -> f64 {
        self.sent as f64 / self.secs.max(1e-9)
    }
    fn loss_free(&self) -> bool {
        self.log.whole == self.sent
            && self.log.broken == 0
            && self.log.serial_gaps == 0
            && self.kernel_lost == 0
    }
    fn describe(&self) -> String {
        format!(
            "{:.0}/s (target {}) from {} opener(s): {} of {} whole, {} broken, {} serial \
             gaps, kernel lost {}",
            self.rate(),
            if self.target == 0 {
                "flat out".to_string()
            } else {
                format!("{}/s", self.target)
            },
            self.openers,
            self.log.whole,
            self.sent,
            self.log.broken,
            self.log.serial_gaps,
            self.kernel_lost
        )
    }
}

/// Files (each watched by its own rule) for the steps of one run.
const STEP_FILES: usize = 24;

fn run_one(
    who: Daemon,
    dir: &Path,
    backlog: u32,
    step_len: Duration,
    flat: Duration,
    bisect: usize,
) -> Result<Sample> {
    auditctl(&[
        "-b",
        &backlog.to_string(),
        "--backlog_wait_time",
        "0",
        "-e",
        "1",
    ])?;
    let files: Vec<PathBuf> = (0..STEP_FILES).map(|i| dir.join(format!("s{i}"))).collect();
    for f in &files {
        std::fs::write(f, b"x")?;
        auditctl(&["-w", f.to_str().context("utf-8")?, "-p", "r", "-k", KEY])?;
    }
    let child = start(who, dir)?;
    let pid = child.id();
    let mut tail = LogTail {
        path: dir.join("audit.log"),
        offset: 0,
    };
    let mut next_file = files.iter();
    let mut step = |target: u64, openers: usize, len: Duration| -> Result<(Step, u64)> {
        let file = next_file.next().context("out of step files")?;
        let lost0 = audit_status().map(|s| s.lost).unwrap_or(0);
        let cpu0 = super::netlink::cpu_ns(pid);
        let (sent, secs) = offer(file, target, openers, len)?;
        // kauditd and the consumer finish the step's records.
        std::thread::sleep(Duration::from_millis(400));
        let cpu = super::netlink::cpu_ns(pid) - cpu0;
        let lost1 = audit_status().map(|s| s.lost).unwrap_or(0);
        let log = tail.step(file)?;
        Ok((
            Step {
                target,
                openers,
                sent,
                secs,
                log,
                kernel_lost: lost1.wrapping_sub(lost0),
            },
            cpu,
        ))
    };
    // The search: doubling rates from 500/s until a step loses (adding openers wherever the
    // offered rate falls short of the target), then bisection between the highest loss-free
    // and the lowest lossy offered rate.
    let mut s = Sample::default();
    let mut openers = 1usize;
    let mut best: Option<Step> = None;
    let mut worst: Option<Step> = None;
    let mut target = 500u64;
    let mut steps = Vec::new();
    while files.len() - steps.len() > bisect + 1 {
        let (st, _) = step(target, openers, step_len)?;
        steps.push(st);
        if !st.loss_free() {
            worst = Some(st);
            break;
        }
        best = Some(st);
        if st.rate() < 0.9 * target as f64 {
            if openers >= MAX_OPENERS {
                break;
            }
            openers = (openers * 2).min(MAX_OPENERS);
        }
        target *= 2;
    }
    if let (Some(mut lo), Some(mut hi)) = (best, worst) {
        for _ in 0..bisect {
            let mid = ((lo.rate() + hi.rate()) / 2.0) as u64;
            if mid as f64 <= lo.rate() * 1.02 {
                break;
            }
            let (st, _) = step(mid, hi.openers, step_len)?;
            steps.push(st);
            if st.loss_free() {
                lo = st;
            } else {
                hi = st;
            }
        }
        best = Some(lo);
        worst = Some(hi);
    }
    let (flat_step, cpu) = step(0, MAX_OPENERS, flat)?;
    let err = super::netlink::stop(child, "-TERM")?;
    for f in &files {
        let _ = auditctl(&["-W", f.to_str().context("utf-8")?, "-p", "r", "-k", KEY]);
    }
    s.set("loss_free_rate", best.map_or(0.0, |b| b.rate()));
    match (best, worst) {
        (Some(b), Some(w)) => s.note(format!(
            "backlog {backlog}: bisection ({} steps of {:?}); highest loss-free {}; lowest lossy {}",
            steps.len(),
            step_len,
            b.describe(),
            w.describe()
        )),
        (Some(b), None) => s.note(format!(
            "backlog {backlog}: no step lost ({} steps); the loss-free rate is the most the \
             openers offered (a lower bound): {}",
            steps.len(),
            b.describe()
        )),
        (None, _) => s.note(format!(
            "backlog {backlog}: the first step lost: {}",
            steps[0].describe()
        )),
    };
    let delivered = flat_step.log.whole + flat_step.log.broken;
    s.set(
        "saturated_rate",
        delivered as f64 / flat_step.secs.max(1e-9),
    );
    if delivered > 0 {
        s.set("consumer_cpu", cpu as f64 / 1e3 / delivered as f64);
    }
    s.set("lost_flat", f64::from(flat_step.kernel_lost));
    s.note(format!(
        "backlog {backlog}: flat out: {}",
        flat_step.describe()
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
        let bisect = match ctx.mode {
            crate::bench::Mode::Quick => 1,
            _ => 4,
        };
        let step = ctx.pick(Duration::from_millis(500), Duration::from_secs(1));
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
                || run_one(Daemon::Auditd, &dir.0, backlog, step, flat, bisect),
                || run_one(Daemon::Zcio, &dir.0, backlog, step, flat, bisect),
            )?;
        }
        drop(saved);
        Ok(())
    }
}

//! `zcio bench`: suites that run baseline and zcio alternately in one run and report medians,
//! ranges and ratios, CPU seconds per GB, syscalls per operation and the COPIED fraction.
//!
//! A suite implements [`Suite`] and is listed in [`suites::all`]. Inside `run` it calls
//! [`Ctx::compare`] once per case with two closures that each perform one measured run and
//! return a [`Sample`]; the framework alternates them (A B A B …), so drift on the machine hits
//! both sides alike.

pub mod machine;
pub mod mcload;
pub mod measure;
pub mod pair;
pub mod peer;
pub mod report;
pub mod suites;

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// How long and how often to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Smoke run: under a minute for all suites.
    Quick,
    /// The default: a few minutes on 2 cores.
    Default,
    /// Longer runs, more rounds.
    Full,
}

/// Which way is better for a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    /// Larger is better (throughput).
    Higher,
    /// Smaller is better (CPU per GB, syscalls per op).
    Lower,
}

/// A metric a suite reports.
#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    /// Key in [`Sample::values`] and `metric` in the results.
    pub name: &'static str,
    /// Unit shown next to values.
    pub unit: &'static str,
    /// Direction.
    pub better: Better,
}

impl MetricDef {
    /// Shorthand constructor.
    pub const fn new(name: &'static str, unit: &'static str, better: Better) -> Self {
        Self { name, unit, better }
    }
}

/// What one measured run produced: metric values plus notes (e.g. the path taken).
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Metric name → value.
    pub values: BTreeMap<&'static str, f64>,
    /// Free-form observations worth reporting once (deduplicated).
    pub notes: Vec<String>,
}

impl Sample {
    /// Sets a metric value.
    pub fn set(&mut self, metric: &'static str, v: f64) -> &mut Self {
        self.values.insert(metric, v);
        self
    }
    /// Adds a note.
    pub fn note(&mut self, s: impl Into<String>) -> &mut Self {
        self.notes.push(s.into());
        self
    }
}

/// One line of results: a case and metric, baseline vs zcio.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The case (e.g. `tcp 64K split-cores`).
    pub case: String,
    /// Metric name.
    pub metric: String,
    /// Unit.
    pub unit: String,
    /// `higher` or `lower`.
    pub better: Better,
    /// Median of the baseline runs.
    pub baseline: f64,
    /// Median of the zcio runs.
    pub zcio: f64,
    /// `zcio / baseline`.
    pub ratio: f64,
    /// Baseline min and max.
    pub baseline_range: [f64; 2],
    /// zcio min and max.
    pub zcio_range: [f64; 2],
    /// Runs per side.
    pub runs: usize,
    /// What the baseline is.
    pub baseline_label: String,
    /// What the zcio side is.
    pub zcio_label: String,
    /// Every baseline run in the order run: its value and the hypervisor's share then.
    pub baseline_runs: Vec<RunValue>,
    /// Every zcio run, likewise.
    pub zcio_runs: Vec<RunValue>,
    /// The ratio of the medians over the runs that lost at most [`STEAL_LOUD`] to the
    /// hypervisor, when some run lost more and at least [`QUIET_RUNS_MIN`] runs per side
    /// did not (see [`quiet_ratio`]).
    pub quiet_ratio: Option<f64>,
}

/// One run's value of one metric, and the share of the machine's CPU time the hypervisor
/// took during that run (steal).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RunValue {
    /// The metric's value in that run.
    pub value: f64,
    /// Steal during that run (0.0-1.0).
    pub steal: f64,
}

/// A suite's results.
#[derive(Debug, Clone, Serialize)]
pub struct SuiteReport {
    /// Suite name.
    pub name: String,
    /// One-line description.
    pub about: String,
    /// Observations, fallbacks, and whether a path copied.
    pub notes: Vec<String>,
    /// Rows.
    pub rows: Vec<Row>,
    /// The metric charted in the HTML report.
    pub chart_metric: Option<String>,
    /// Whether the suite was skipped, and why.
    pub skipped: Option<String>,
    /// Wall seconds the suite took.
    pub seconds: f64,
    /// The share of the machine's CPU time the hypervisor took while the suite ran (steal).
    pub steal: f64,
}

/// A benchmark suite.
pub trait Suite: Sync {
    /// Name used on the command line.
    fn name(&self) -> &'static str;
    /// One line saying what it measures.
    fn about(&self) -> &'static str;
    /// The metric to chart.
    fn chart_metric(&self) -> &'static str;
    /// Runs the suite. Return `Err` only for real failures; use [`Ctx::skip`] for a missing
    /// privilege or feature.
    fn run(&self, ctx: &mut Ctx) -> Result<()>;
}

/// Why a suite skipped itself.
#[derive(Debug)]
pub struct Skip(pub String);

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "skipped: {}", self.0)
    }
}
impl std::error::Error for Skip {}

/// Run-time context handed to suites.
pub struct Ctx {
    /// Measurement mode.
    pub mode: Mode,
    /// `--peer`: the suites that cross a network run against this host.
    pub peer: Option<std::sync::Arc<peer::Peer>>,
    progress: ProgressBar,
    rows: Vec<Row>,
    notes: Vec<String>,
    /// When the previous case ended (`ZCIO_BENCH_TIMES`).
    last_case: Option<std::time::Instant>,
}

impl Ctx {
    fn new(mode: Mode, peer: Option<std::sync::Arc<peer::Peer>>, progress: ProgressBar) -> Self {
        Self {
            mode,
            peer,
            progress,
            rows: vec![],
            notes: vec![],
            last_case: None,
        }
    }

    /// Rounds per side (each round runs baseline once and zcio once).
    pub fn rounds(&self) -> usize {
        match self.mode {
            Mode::Quick => 1,
            Mode::Default => 3,
            Mode::Full => 7,
        }
    }

    /// Suggested duration of one measured run.
    pub fn run_time(&self) -> Duration {
        match self.mode {
            Mode::Quick => Duration::from_millis(150),
            Mode::Default => Duration::from_millis(300),
            Mode::Full => Duration::from_secs(2),
        }
    }

    /// Picks a size by mode: `short` for the quick and the default run (the default run
    /// differs from the quick one in its rounds and run time: medians of 3, a few minutes for
    /// every suite), `full` for `--full`.
    pub fn pick<T>(&self, short: T, full: T) -> T {
        match self.mode {
            Mode::Quick | Mode::Default => short,
            Mode::Full => full,
        }
    }

    /// Adds a suite-level note (deduplicated).
    pub fn note(&mut self, s: impl Into<String>) {
        let s = s.into();
        if !self.notes.contains(&s) {
            self.notes.push(s);
        }
    }

    /// Returns an error that marks the suite as skipped with `reason`.
    pub fn skip(&self, reason: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(Skip(reason.into()))
    }

    /// Measures one case: `baseline` and `zcio` alternate for [`Ctx::rounds`] rounds (the
    /// order flips every round), then each metric in `metrics` becomes a [`Row`]. A case
    /// `ZCIO_BENCH_ONLY` leaves out is not run.
    pub fn compare(
        &mut self,
        case: &str,
        labels: (&str, &str),
        metrics: &[MetricDef],
        mut baseline: impl FnMut() -> Result<Sample>,
        mut zcio: impl FnMut() -> Result<Sample>,
    ) -> Result<()> {
        if !wanted(case) {
            return Ok(());
        }
        let t0 = std::time::Instant::now();
        let mut a_samples = vec![];
        let mut b_samples = vec![];
        // The hypervisor's share of the machine during each run (steal), per side.
        let (mut a_steal, mut b_steal) = (vec![], vec![]);
        let timed = |run: &mut dyn FnMut() -> Result<Sample>, steal: &mut Vec<f64>| {
            let t = machine::CpuTimes::now();
            let s = run()?;
            steal.push(machine::CpuTimes::now().stolen_since(&t));
            Ok::<_, anyhow::Error>(s)
        };
        for round in 0..self.rounds() {
            self.progress
                .set_message(format!("{case} (round {}/{})", round + 1, self.rounds()));
            if round % 2 == 0 {
                a_samples.push(timed(&mut baseline, &mut a_steal)?);
                b_samples.push(timed(&mut zcio, &mut b_steal)?);
            } else {
                b_samples.push(timed(&mut zcio, &mut b_steal)?);
                a_samples.push(timed(&mut baseline, &mut a_steal)?);
            }
        }
        if let Some(n) = steal_note(&a_steal, &b_steal) {
            self.note(format!("{case}: {n}"));
        }
        let runs = a_samples
            .iter()
            .zip(&a_steal)
            .chain(b_samples.iter().zip(&b_steal));
        for (s, &steal) in runs {
            for n in &s.notes {
                self.note(format!("{case}: {}", run_note(n, steal)));
            }
        }
        let mut quiet = vec![];
        for m in metrics {
            let runs = |samples: &[Sample], steal: &[f64]| -> Vec<RunValue> {
                samples
                    .iter()
                    .zip(steal)
                    .filter_map(|(s, &steal)| {
                        let value = s.values.get(m.name).copied()?;
                        Some(RunValue { value, steal })
                    })
                    .collect()
            };
            let (a_runs, b_runs) = (runs(&a_samples, &a_steal), runs(&b_samples, &b_steal));
            let a: Vec<f64> = a_runs.iter().map(|r| r.value).collect();
            let b: Vec<f64> = b_runs.iter().map(|r| r.value).collect();
            if a.is_empty() || b.is_empty() {
                continue;
            }
            let (am, amin, amax) = stats(&a);
            let (bm, bmin, bmax) = stats(&b);
            let quiet_ratio = quiet_ratio(&a_runs, &b_runs);
            if let Some(r) = quiet_ratio {
                quiet.push(format!("{} {r:.2}", m.name));
            }
            self.rows.push(Row {
                case: case.to_string(),
                metric: m.name.to_string(),
                unit: m.unit.to_string(),
                better: m.better,
                baseline: am,
                zcio: bm,
                ratio: if am != 0.0 { bm / am } else { f64::NAN },
                baseline_range: [amin, amax],
                zcio_range: [bmin, bmax],
                runs: a.len(),
                baseline_label: labels.0.to_string(),
                zcio_label: labels.1.to_string(),
                baseline_runs: a_runs,
                zcio_runs: b_runs,
                quiet_ratio,
            });
        }
        if !quiet.is_empty() {
            let n = |v: &[f64]| v.iter().filter(|&&f| f <= STEAL_LOUD).count();
            self.note(format!(
                "{case}: ratios over the runs that lost at most {:.0} % to the hypervisor \
                 ({} baseline, {} zcio runs): {}",
                STEAL_LOUD * 100.0,
                n(&a_steal),
                n(&b_steal),
                quiet.join(", ")
            ));
        }
        self.progress.inc(1);
        if std::env::var_os("ZCIO_BENCH_TIMES").is_some() {
            // Where a suite's time goes (for keeping the default run short): the case's own
            // rounds, and the set-up before it since the previous case ended.
            let now = std::time::Instant::now();
            eprintln!(
                "bench time: {case}: {:.1} s rounds, {:.1} s before",
                (now - t0).as_secs_f64(),
                (t0 - self.last_case.unwrap_or(t0)).as_secs_f64()
            );
            self.last_case = Some(now);
        }
        Ok(())
    }
}

/// Runs in which the hypervisor took more than this share of the machine are counted out
/// loud: their figures are the neighbours' as much as the code's.
pub const STEAL_LOUD: f64 = 0.05;

/// A run's own note, with what the hypervisor took during that run when it was more than
/// [`STEAL_LOUD`]: a loop counter that moved in that run (a wait that timed out, a slow
/// first request) is then told apart from one that moved on a quiet machine.
pub fn run_note(note: &str, steal: f64) -> String {
    if steal > STEAL_LOUD {
        format!(
            "{note} [this run lost {:.1} % of the machine to the hypervisor]",
            steal * 100.0
        )
    } else {
        note.to_string()
    }
}

/// The fewest runs per side that lost at most [`STEAL_LOUD`] for [`quiet_ratio`] to be given.
pub const QUIET_RUNS_MIN: usize = 3;

/// zcio's median over baseline's median, both over the runs that lost at most
/// [`STEAL_LOUD`] to the hypervisor: `None` when no run lost more (the row's own ratio is
/// that), or when fewer than [`QUIET_RUNS_MIN`] runs of a side are left.
pub fn quiet_ratio(baseline: &[RunValue], zcio: &[RunValue]) -> Option<f64> {
    if baseline.iter().chain(zcio).all(|r| r.steal <= STEAL_LOUD) {
        return None;
    }
    let quiet = |v: &[RunValue]| -> Vec<f64> {
        v.iter()
            .filter(|r| r.steal <= STEAL_LOUD)
            .map(|r| r.value)
            .collect()
    };
    let (a, b) = (quiet(baseline), quiet(zcio));
    if a.len() < QUIET_RUNS_MIN || b.len() < QUIET_RUNS_MIN {
        return None;
    }
    let (am, bm) = (stats(&a).0, stats(&b).0);
    (am != 0.0).then(|| bm / am)
}

/// What a case's runs lost to the hypervisor, when any run lost more than 0.5 %: the medians
/// and maxima of both sides, and how many runs lost more than [`STEAL_LOUD`].
pub fn steal_note(baseline: &[f64], zcio: &[f64]) -> Option<String> {
    let worst = baseline.iter().chain(zcio).copied().fold(0.0f64, f64::max);
    if worst <= 0.005 || baseline.is_empty() || zcio.is_empty() {
        return None;
    }
    let (am, _, amax) = stats(baseline);
    let (bm, _, bmax) = stats(zcio);
    let loud = baseline
        .iter()
        .chain(zcio)
        .filter(|&&f| f > STEAL_LOUD)
        .count();
    let mut s = format!(
        "CPU time taken by the hypervisor (steal, /proc/stat) during the runs: baseline median \
         {:.1} % (max {:.1} %), zcio median {:.1} % (max {:.1} %)",
        am * 100.0,
        amax * 100.0,
        bm * 100.0,
        bmax * 100.0
    );
    if loud > 0 {
        s.push_str(&format!(
            "; {loud} of {} runs lost over {:.0} %: their figures move with the host's other \
             guests, the ranges are wider for it",
            baseline.len() + zcio.len(),
            STEAL_LOUD * 100.0
        ));
    }
    Some(s)
}

/// `ZCIO_BENCH_ONLY=substring`: run only the cases whose name contains it (for profiling
/// one case; the full suite is the default).
pub fn wanted(case: &str) -> bool {
    std::env::var("ZCIO_BENCH_ONLY").map_or(true, |f| f.is_empty() || case.contains(&f))
}

/// Median, min and max.
pub fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|x, y| x.total_cmp(y));
    let n = s.len();
    let med = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    (med, s[0], s[n - 1])
}

/// The whole run's results, as written to `results.json`.
#[derive(Debug, Serialize)]
pub struct Results {
    /// Host description.
    pub machine: machine::Machine,
    /// Mode of the run.
    pub mode: Mode,
    /// One entry per suite run.
    pub suites: Vec<SuiteReport>,
    /// A two-host run (`--peer`): both hosts; `null` for a local run.
    pub peer: Option<peer::PeerRun>,
    /// The share of the machine's CPU time the hypervisor took during the whole run (steal;
    /// 0 on bare metal).
    pub steal: f64,
}

/// Runs the named suites (all when empty) and writes `results.json` and `report.html`.
/// With `peer`, only the suites that cross a network run, against that host.
pub fn run(names: &[String], mode: Mode, out_dir: PathBuf, peer: Option<&str>) -> Result<Results> {
    let all = suites::all();
    for n in names {
        if !all.iter().any(|s| s.name() == n) {
            let known: Vec<&str> = all.iter().map(|s| s.name()).collect();
            anyhow::bail!("unknown suite '{n}'; known suites: {}", known.join(", "));
        }
        if peer.is_some() && !peer::NETWORK_SUITES.contains(&n.as_str()) {
            anyhow::bail!(
                "suite '{n}' does not cross a network; with --peer only {} run (run '{n}' \
                 without --peer)",
                peer::NETWORK_SUITES.join(", ")
            );
        }
    }
    let peer = peer
        .map(|p| peer::Peer::new(p).map(std::sync::Arc::new))
        .transpose()?;
    let names: Vec<String> = match (&peer, names.is_empty()) {
        (Some(_), true) => peer::NETWORK_SUITES.iter().map(|s| s.to_string()).collect(),
        _ => names.to_vec(),
    };
    let names = &names[..];
    std::fs::create_dir_all(&out_dir).map_err(|e| {
        anyhow::anyhow!("cannot create output directory {}: {e}", out_dir.display())
    })?;
    let chosen: Vec<&dyn Suite> = all
        .iter()
        .filter(|s| names.is_empty() || names.iter().any(|n| n == s.name()))
        .map(|b| b.as_ref())
        .collect();
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {prefix:>10} {pos:>3} cases  {msg}",
        )
        .expect("static template"),
    );
    pb.enable_steady_tick(Duration::from_millis(200));
    let mut reports = vec![];
    let run0 = machine::CpuTimes::now();
    for suite in chosen {
        pb.set_prefix(suite.name());
        let mut ctx = Ctx::new(mode, peer.clone(), pb.clone());
        let t0 = std::time::Instant::now();
        let cpu0 = machine::CpuTimes::now();
        let res = suite.run(&mut ctx);
        let mut skipped = None;
        if let Err(e) = res {
            match e.downcast_ref::<Skip>() {
                // A suite the user named explicitly must run: say why it cannot.
                Some(s) if names.iter().any(|n| n == suite.name()) => {
                    pb.finish_and_clear();
                    anyhow::bail!("suite {} cannot run here: {}", suite.name(), s.0);
                }
                Some(s) => skipped = Some(s.0.clone()),
                None => {
                    pb.finish_and_clear();
                    return Err(e.context(format!("suite {}", suite.name())));
                }
            }
        }
        let report = SuiteReport {
            name: suite.name().to_string(),
            about: peer
                .as_ref()
                .and_then(|_| peer::about(suite.name()))
                .unwrap_or(suite.about())
                .to_string(),
            notes: ctx.notes,
            rows: ctx.rows,
            chart_metric: Some(suite.chart_metric().to_string()),
            skipped,
            seconds: t0.elapsed().as_secs_f64(),
            steal: machine::CpuTimes::now().stolen_since(&cpu0),
        };
        pb.suspend(|| report::print_suite(&report));
        reports.push(report);
    }
    pb.finish_and_clear();
    let results = Results {
        machine: machine::Machine::read(),
        mode,
        suites: reports,
        peer: peer.as_ref().and_then(|p| p.run_info()),
        steal: machine::CpuTimes::now().stolen_since(&run0),
    };
    let json = serde_json::to_string_pretty(&results)?;
    write_replacing(&out_dir, "results.json", json.as_bytes())?;
    write_replacing(&out_dir, "report.html", report::html(&results)?.as_bytes())?;
    Ok(results)
}

/// Writes `dir/name` through a fresh file created exclusively next to it and renamed over
/// it: a symlink planted at `dir/name` (an output directory under /tmp, a root run) is
/// replaced, never written through.
fn write_replacing(dir: &std::path::Path, name: &str, data: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let target = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&tmp)
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", tmp.display()))?;
    std::io::Write::write_all(&mut f, data)?;
    drop(f);
    std::fs::rename(&tmp, &target)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", target.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_note_names_the_steal_of_that_run_only_when_it_was_loud() {
        assert_eq!(run_note("waits capped 0", 0.01), "waits capped 0");
        assert_eq!(
            run_note("waits capped 5", 0.244),
            "waits capped 5 [this run lost 24.4 % of the machine to the hypervisor]"
        );
    }

    #[test]
    fn the_quiet_ratio_leaves_out_the_stolen_runs_and_needs_three_quiet_runs_a_side() {
        let r = |value, steal| RunValue { value, steal };
        // Nothing stolen: the row's own ratio is the figure.
        assert_eq!(quiet_ratio(&[r(1.0, 0.0); 3], &[r(2.0, 0.01); 3]), None);
        let base = [r(4.0, 0.0), r(4.2, 0.01), r(30.0, 0.2), r(4.1, 0.0)];
        let zcio = [r(4.3, 0.02), r(90.0, 0.3), r(4.0, 0.0), r(4.4, 0.04)];
        // Medians of the quiet runs: 4.1 and 4.3.
        let q = quiet_ratio(&base, &zcio).unwrap();
        assert!((q - 4.3 / 4.1).abs() < 1e-9, "{q}");
        // Two quiet runs left on one side: no figure.
        let zcio = [r(4.3, 0.02), r(90.0, 0.3), r(4.0, 0.06), r(4.4, 0.04)];
        assert_eq!(quiet_ratio(&base, &zcio), None);
    }

    #[test]
    fn a_case_names_the_steal_of_its_runs_only_when_there_was_some() {
        assert_eq!(steal_note(&[0.0, 0.004], &[0.001, 0.0]), None);
        let n = steal_note(&[0.01, 0.02, 0.35], &[0.0, 0.01, 0.02]).unwrap();
        assert!(
            n.contains("baseline median 2.0 % (max 35.0 %)")
                && n.contains("zcio median 1.0 % (max 2.0 %)"),
            "{n}"
        );
        assert!(n.contains("1 of 6 runs lost over 5 %"), "{n}");
        let quiet = steal_note(&[0.01], &[0.02]).unwrap();
        assert!(!quiet.contains("runs lost over"), "{quiet}");
    }

    #[test]
    fn results_replace_a_planted_symlink_instead_of_writing_through_it() {
        let dir = zcio_testnet::TempDir::new("bench-out").unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("results.json")).unwrap();
        write_replacing(dir.path(), "results.json", b"{}").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let m = std::fs::symlink_metadata(dir.join("results.json")).unwrap();
        assert!(m.file_type().is_file());
        assert_eq!(std::fs::read(dir.join("results.json")).unwrap(), b"{}");
        write_replacing(dir.path(), "results.json", b"[]").unwrap();
        assert_eq!(std::fs::read(dir.join("results.json")).unwrap(), b"[]");
    }
}

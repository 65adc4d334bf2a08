//! Description of the host a run was made on.

use serde::Serialize;

/// Host facts written to `results.json` and shown in the report.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// `uname -r`.
    pub kernel: String,
    /// CPU model from `/proc/cpuinfo`.
    pub cpu_model: String,
    /// Online CPUs.
    pub cores: usize,
    /// Total memory in GiB.
    pub memory_gib: f64,
    /// zcio version.
    pub zcio_version: String,
    /// Unix time the run ended.
    pub unix_time: u64,
    /// Running as root.
    pub root: bool,
}

impl Machine {
    /// Reads the facts from this host.
    pub fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kb: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        Self {
            kernel: zcio::sys::kernel_release(),
            cpu_model,
            cores: zcio_testnet::cpu::online_cpus(),
            memory_gib: (mem_kb / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            zcio_version: env!("CARGO_PKG_VERSION").to_string(),
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            root: zcio_testnet::is_root(),
        }
    }
}

/// The machine's CPU time so far, from the first line of `/proc/stat` (in clock ticks, all
/// CPUs): what a span of a run had of it, and how much of it the hypervisor took (*steal*:
/// time a virtual CPU wanted to run and the host ran something else). A virtual machine's
/// figures move with its neighbours' load; steal is the part of that the guest can see.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// user + nice + system + idle + iowait + irq + softirq + steal.
    pub total: u64,
    /// The steal column.
    pub steal: u64,
}

impl CpuTimes {
    /// Reads `/proc/stat` now; zeros where it cannot be read (then no steal is reported).
    pub fn now() -> Self {
        std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| Self::parse(&s))
            .unwrap_or_default()
    }

    /// Parses the aggregate `cpu` line of a `/proc/stat` text.
    pub fn parse(stat: &str) -> Option<Self> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        // Kernels before 2.6.11 have no steal column: nothing to report then.
        let steal = *v.get(7)?;
        Some(Self {
            total: v.iter().sum(),
            steal,
        })
    }

    /// The fraction of the machine's CPU time since `earlier` that the hypervisor took.
    pub fn stolen_since(&self, earlier: &Self) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 {
            0.0
        } else {
            self.steal.saturating_sub(earlier.steal) as f64 / total as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_is_the_eighth_column_of_the_cpu_line_as_a_share_of_all_eight() {
        let a = CpuTimes::parse(
            "cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 50 0 25 400 5 0 2 18 0 0\nintr 1\n",
        )
        .unwrap();
        assert_eq!(
            a,
            CpuTimes {
                total: 1000,
                steal: 35
            }
        );
        let b = CpuTimes::parse("cpu  200 0 100 1500 10 0 5 185 0 0\n").unwrap();
        assert!((b.stolen_since(&a) - 0.15).abs() < 1e-9);
        assert_eq!(a.stolen_since(&a), 0.0);
        // No steal column (a very old kernel) or no aggregate line: nothing to report.
        assert_eq!(CpuTimes::parse("cpu  1 2 3 4 5 6 7\n"), None);
        assert_eq!(CpuTimes::parse("cpu0 1 2 3 4 5 6 7 8\n"), None);
    }

    #[test]
    fn this_machines_cpu_time_is_read_and_grows() {
        let a = CpuTimes::now();
        assert!(a.total > 0, "/proc/stat gave no cpu line");
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(50) {
            std::hint::spin_loop();
        }
        let b = CpuTimes::now();
        assert!(b.total > a.total, "{a:?} then {b:?}");
        let f = b.stolen_since(&a);
        assert!((0.0..=1.0).contains(&f), "{f}");
    }
}

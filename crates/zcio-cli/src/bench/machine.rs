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

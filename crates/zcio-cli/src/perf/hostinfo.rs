//! Facts about this host for the reports: name, kernel, the NIC behind an address, and the
//! whole host's busy CPU time.

use super::proto::HostInfo;
use std::net::IpAddr;
use std::process::Command;

/// This host, with the interface that owns `local` (the test's local address).
pub fn local(local: Option<IpAddr>) -> HostInfo {
    HostInfo {
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into()),
        kernel: zcio::sys::kernel_release(),
        cpus: zcio_testnet::cpu::online_cpus(),
        nic: local.map_or_else(|| "unknown (no address)".into(), nic_for),
    }
}

/// `IF (driver, speed)` for the interface that has `ip`, or why it is unknown.
pub fn nic_for(ip: IpAddr) -> String {
    let Some(iface) = iface_with(ip) else {
        return format!("unknown (no interface has {ip}, or `ip` is missing)");
    };
    describe_iface(&iface)
}

/// `IF (driver, speed)`.
pub fn describe_iface(iface: &str) -> String {
    let virt = !std::path::Path::new(&format!("/sys/class/net/{iface}/device")).exists();
    let driver = match zcio::sys::net::ethtool_driver(iface) {
        Ok((d, _)) if virt => format!("{d}, virtual"),
        Ok((d, _)) => d,
        Err(_) if virt => "virtual".into(),
        Err(e) => format!("driver unknown: {e}"),
    };
    let speed = std::fs::read_to_string(format!("/sys/class/net/{iface}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .filter(|&s| s > 0)
        .map_or(String::new(), |s| format!(", {s} Mb/s"));
    format!("{iface} ({driver}{speed})")
}

/// The interface that carries `ip`, from `ip -o addr show`.
fn iface_with(ip: IpAddr) -> Option<String> {
    if ip.is_loopback() {
        return Some("lo".into());
    }
    let out = Command::new("ip")
        .args(["-o", "addr", "show"])
        .output()
        .ok()?;
    iface_in(&String::from_utf8_lossy(&out.stdout), ip)
}

/// Parses `ip -o addr show` output: `2: eth0    inet 10.0.0.1/24 ...`.
fn iface_in(text: &str, ip: IpAddr) -> Option<String> {
    let want = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    text.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        let _idx = w.next()?;
        let name = w.next()?;
        let _fam = w.next()?;
        let addr: IpAddr = w.next()?.split('/').next()?.parse().ok()?;
        (addr == want).then(|| name.split('@').next().unwrap_or(name).to_string())
    })
}

/// Busy CPU seconds of the whole host so far (all CPUs: user, nice, system, irq, softirq,
/// steal), from `/proc/stat`; `None` if unreadable.
pub fn host_busy_s() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| v.get(i))
        .sum::<u64>();
    // /proc/stat counts in USER_HZ, which is 100 on every Linux architecture zcio runs on.
    Some(busy as f64 / 100.0)
}

/// Whole-host busy CPU seconds over a span.
#[derive(Debug, Clone, Copy)]
pub struct HostCpu(Option<f64>);

impl HostCpu {
    /// Starts the span.
    pub fn start() -> Self {
        Self(host_busy_s())
    }
    /// Busy CPU seconds since start (0 if `/proc/stat` was unreadable).
    pub fn stop(&self) -> f64 {
        match (self.0, host_busy_s()) {
            (Some(a), Some(b)) => (b - a).max(0.0),
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_is_found_by_address_in_ip_output() {
        let out = "1: lo    inet 127.0.0.1/8 scope host lo\n\
                   3: veth0@if2    inet 10.77.0.1/24 scope global veth0\n\
                   3: veth0@if2    inet6 fd77::1/64 scope global\n";
        assert_eq!(
            iface_in(out, "10.77.0.1".parse().unwrap()).as_deref(),
            Some("veth0")
        );
        assert_eq!(
            iface_in(out, "fd77::1".parse().unwrap()).as_deref(),
            Some("veth0")
        );
        assert_eq!(
            iface_in(out, "::ffff:10.77.0.1".parse().unwrap()).as_deref(),
            Some("veth0")
        );
        assert_eq!(iface_in(out, "10.9.9.9".parse().unwrap()), None);
        assert!(host_busy_s().is_some());
        assert!(local(Some("127.0.0.1".parse().unwrap()))
            .nic
            .starts_with("lo"));
    }
}

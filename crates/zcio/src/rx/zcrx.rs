//! zcrx readiness of an interface: a real `IORING_REGISTER_ZCRX_IFQ` attempt, its errno
//! explained, what the NIC must be set to, and what it is set to now.
//!
//! NIC set-up stays outside the library (it changes host-wide settings); [`check_interface`]
//! says what to run.

use crate::ring::recv::RecvRing;
use crate::ring::zcrx::ZcrxBind;
use crate::ring::RingConfig;
use io_uring::cqueue;
use std::process::Command;

/// Result of [`check_interface`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct ZcrxCheck {
    /// Interface checked.
    pub iface: String,
    /// Rx queue checked.
    pub queue: u32,
    /// Registration succeeded (the queue was bound and released again).
    pub ok: bool,
    /// The errno registration failed with.
    pub errno: Option<i32>,
    /// What went wrong and what would fix it (or what worked).
    pub explanation: String,
    /// Settings zero-copy receive needs on this interface (commands to run).
    pub needed: Vec<String>,
    /// What is set now, as far as this host can tell (`ethtool -g`/`-k`/`-l`, sysfs).
    pub current: Vec<String>,
}

/// Attempts a real zcrx registration of `iface` rx queue `queue` (a small area and refill
/// ring, released right after) and reports the outcome with the interface's current state.
pub fn check_interface(iface: &str, queue: u32) -> ZcrxCheck {
    let (ok, errno, explanation) = attempt(iface, queue);
    ZcrxCheck {
        iface: iface.to_string(),
        queue,
        ok,
        errno,
        explanation,
        needed: needed(iface, queue),
        current: current(iface),
    }
}

fn attempt(iface: &str, queue: u32) -> (bool, Option<i32>, String) {
    let cfg = RingConfig {
        entries: 8,
        ..RingConfig::default()
    };
    let mut rr = match RecvRing::<cqueue::Entry32>::new(&cfg) {
        Ok(r) => r,
        Err(e) => return (false, None, format!("no io_uring to register with: {e}")),
    };
    for need in ["SINGLE_ISSUER", "DEFER_TASKRUN"] {
        if !rr.ring().has_flag(need) {
            return (
                false,
                Some(libc::EINVAL),
                format!("the kernel refused a ring with {need}, which zcrx requires"),
            );
        }
    }
    match rr.register_zcrx(ZcrxBind::Queue { iface, queue }, 1 << 20, 64, false) {
        Ok(_) => (
            true,
            None,
            format!(
                "{iface} rx queue {queue} accepted a zcrx registration; steer the flows to it \
                 for zero-copy receive"
            ),
        ),
        Err(e) => {
            let errno = e.source.raw_os_error();
            let mut why = e.explanation.to_string();
            if errno == Some(libc::ENODEV) {
                why = format!(
                    "no interface named {iface:?} in this network namespace (if_nametoindex \
                     failed); list them with `ip link`"
                );
            } else if errno == Some(libc::EOPNOTSUPP) {
                if let Some(d) = driver(iface) {
                    why.push_str(&format!(" (driver: {d})"));
                } else {
                    why.push_str(" (a virtual device without a queue-management driver)");
                }
            }
            (false, errno, format!("{why} [{}]", e.source))
        }
    }
}

fn needed(iface: &str, queue: u32) -> Vec<String> {
    vec![
        format!("ethtool -G {iface} tcp-data-split on   # header/data split"),
        format!("ethtool -G {iface} hds-thresh 0        # split every packet (6.13+ ethtool)"),
        format!(
            "ethtool -L {iface} combined {}        # enough queues to dedicate one",
            queue + 1
        ),
        format!("ethtool -X {iface} equal {queue}           # keep RSS off queue {queue}"),
        format!(
            "ethtool -N {iface} flow-type tcp6 dst-port PORT action {queue}   # steer the flow"
        ),
        "no XDP program on the interface".to_string(),
        "CAP_NET_ADMIN".to_string(),
    ]
}

fn driver(iface: &str) -> Option<String> {
    let link = std::fs::read_link(format!("/sys/class/net/{iface}/device/driver")).ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

fn current(iface: &str) -> Vec<String> {
    let mut out = Vec::new();
    let sys = format!("/sys/class/net/{iface}");
    let exists = crate::sys::net::if_index(iface).is_some();
    if !exists {
        out.push(format!(
            "{iface}: absent (no such interface in this network namespace)"
        ));
        return out;
    }
    if !std::path::Path::new(&sys).exists() {
        // sysfs shows the namespace it was mounted in; ethtool (netlink) sees ours.
        out.push(format!(
            "{sys}: not visible (sysfs belongs to another network namespace)"
        ));
    }
    out.push(format!(
        "driver: {}",
        driver(iface).unwrap_or_else(|| "none (virtual device)".into())
    ));
    if let Ok(rd) = std::fs::read_dir(format!("{sys}/queues")) {
        let rx = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
            .count();
        out.push(format!("rx queues (sysfs): {rx}"));
    }
    if let Ok(x) = std::fs::read_to_string(format!("{sys}/xdp")) {
        out.push(format!("xdp: {}", x.trim()));
    }
    for (flag, keep) in [
        ("-g", &["data split", "hds", "RX:"][..]),
        (
            "-k",
            &["generic-receive-offload", "large-receive-offload", "ntuple"][..],
        ),
        ("-l", &["Combined:"][..]),
    ] {
        match Command::new("ethtool").arg(flag).arg(iface).output() {
            Ok(o) => {
                let text = String::from_utf8_lossy(&o.stdout).to_string()
                    + &String::from_utf8_lossy(&o.stderr);
                let lines: Vec<String> = text
                    .lines()
                    .filter(|l| keep.iter().any(|k| l.contains(k)) || l.contains("error"))
                    .map(|l| format!("ethtool {flag}: {}", l.trim()))
                    .collect();
                if lines.is_empty() {
                    out.push(format!("ethtool {flag}: nothing relevant reported"));
                } else {
                    out.extend(lines);
                }
            }
            Err(e) => {
                out.push(format!(
                    "ethtool {flag}: not runnable ({e}); install ethtool"
                ));
                break;
            }
        }
    }
    out
}

//! What a daemon needs from the system, checked at start: each capability it uses and the
//! locked memory its io_uring rings are charged against. Each missing one is named on stderr
//! with what the daemon does without it (the path it falls back to, or that it cannot run);
//! nothing here needs full root.
//!
//! Locked memory: for a process without `CAP_IPC_LOCK`, the kernel charges io_uring's rings
//! (and registered buffers, zcrx areas) to its user's `RLIMIT_MEMLOCK`; a ring it refuses
//! (`ENOMEM`) is a recorded fallback to the path without io_uring. The sizes below were
//! measured on Linux 6.18 (the smallest `RLIMIT_MEMLOCK` under which the daemon, as an
//! unprivileged user holding only `CAP_NET_ADMIN`, kept its io_uring path), rounded up to a
//! power of two.

use anyhow::{bail, Result};

/// Capability numbers (`linux/capability.h`).
pub const CAP_NET_BIND_SERVICE: u32 = 10;
pub use zcio::sys::{CAP_IPC_LOCK, CAP_NET_ADMIN};

/// Locked memory one NFQUEUE consumer thread's ring is charged (measured: under 64 KiB).
pub const RING_NFQ: u64 = 64 << 10;
/// Locked memory of the NFLOG ring (measured: under 32 KiB).
pub const RING_NFLOG: u64 = 32 << 10;
/// Locked memory of the conntrack events ring (measured: under 64 KiB).
pub const RING_CT: u64 = 64 << 10;
/// Locked memory of one proxy thread's ring (receiver and send ring share it; measured:
/// under 512 KiB with the default 1,024 receive buffers).
pub const RING_PROXY: u64 = 512 << 10;

fn cap_name(cap: u32) -> &'static str {
    match cap {
        CAP_NET_BIND_SERVICE => "CAP_NET_BIND_SERVICE",
        CAP_NET_ADMIN => "CAP_NET_ADMIN",
        CAP_IPC_LOCK => "CAP_IPC_LOCK",
        _ => "a capability",
    }
}

/// One capability a daemon uses.
#[derive(Debug, Clone, Copy)]
pub struct Need {
    /// The capability number.
    pub cap: u32,
    /// What it is for.
    pub used_for: &'static str,
    /// What happens without it: the path taken instead; `None` when the daemon cannot run.
    pub without: Option<&'static str>,
}

/// What the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// One line per missing capability or short limit that the daemon runs without, already
    /// printed.
    pub missing: Vec<String>,
}

/// The pure part of [`check`]: the lines for effective capabilities `caps` and a locked-memory
/// limit `memlock` (`None`: unlimited), and the first need the daemon cannot run without (the
/// error it stops with).
fn judge(
    cmd: &str,
    needs: &[Need],
    rings: Option<(u64, &str)>,
    caps: u64,
    memlock: Option<u64>,
) -> (Vec<String>, Option<String>) {
    let has = |c: u32| caps & (1u64 << c) != 0;
    let mut lines = Vec::new();
    let mut fatal = None;
    for n in needs {
        if has(n.cap) {
            continue;
        }
        let name = cap_name(n.cap);
        match n.without {
            Some(path) => lines.push(format!(
                "zcio {cmd}: missing {name} ({}): {path}",
                n.used_for
            )),
            None => {
                let l = format!(
                    "zcio {cmd}: missing {name} ({}): cannot run without it; grant it \
                     (AmbientCapabilities={name} in a unit, setpriv --inh-caps +{c} \
                     --ambient-caps +{c}) or run as root",
                    n.used_for,
                    c = name.trim_start_matches("CAP_").to_ascii_lowercase()
                );
                fatal.get_or_insert(l);
            }
        }
    }
    if let Some((need, without)) = rings {
        if !has(CAP_IPC_LOCK) && memlock.is_some_and(|m| m < need) {
            lines.push(format!(
                "zcio {cmd}: missing CAP_IPC_LOCK and RLIMIT_MEMLOCK is {} KiB: the io_uring \
                 rings are charged to it and need about {} KiB (LimitMEMLOCK= in a unit, \
                 ulimit -l); a ring the kernel refuses falls back to {without} (recorded as a \
                 fallback)",
                memlock.unwrap_or(0) >> 10,
                need >> 10
            ));
        }
    }
    (lines, fatal)
}

/// Checks the capabilities in `needs` and, for `rings` (locked memory needed, the path taken
/// when a ring is refused), `RLIMIT_MEMLOCK` (whose soft limit is raised to the hard one
/// first). Prints a line for each missing one; fails when one the daemon cannot run without
/// is missing.
pub fn check(cmd: &str, needs: &[Need], rings: Option<(u64, &str)>) -> Result<Found> {
    let memlock = zcio::sys::raise_rlimit(libc::RLIMIT_MEMLOCK).unwrap_or(Some(0));
    let (missing, fatal) = judge(cmd, needs, rings, zcio::sys::effective_caps(), memlock);
    for l in &missing {
        eprintln!("{l}");
    }
    if let Some(f) = fatal {
        bail!("{}", f.trim_start_matches(&format!("zcio {cmd}: ")));
    }
    Ok(Found { missing })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEEDS: &[Need] = &[
        Need {
            cap: CAP_NET_ADMIN,
            used_for: "binding NFQUEUE queues",
            without: None,
        },
        Need {
            cap: CAP_IPC_LOCK,
            used_for: "x",
            without: Some("y"),
        },
    ];

    #[test]
    fn each_missing_need_is_named_with_what_happens_without_it() {
        let all = (1 << CAP_NET_ADMIN) | (1 << CAP_IPC_LOCK);
        let (l, f) = judge("nfq", NEEDS, Some((RING_NFQ, "recvmmsg")), all, Some(0));
        assert!(l.is_empty() && f.is_none(), "{l:?}");
        let (l, f) = judge(
            "nfq",
            NEEDS,
            Some((RING_NFQ, "recvmmsg")),
            0,
            Some(16 << 10),
        );
        assert_eq!(l.len(), 2, "{l:?}");
        assert_eq!(l[0], "zcio nfq: missing CAP_IPC_LOCK (x): y");
        assert!(l[1].contains("RLIMIT_MEMLOCK is 16 KiB") && l[1].contains("to recvmmsg"));
        let f = f.unwrap();
        assert!(f.contains("missing CAP_NET_ADMIN (binding NFQUEUE queues): cannot run"));
        assert!(f.contains("--ambient-caps +net_admin"));
        // Enough locked memory, or unlimited: no line about it.
        let (l, _) = judge("nfq", &[], Some((RING_NFQ, "r")), 0, Some(8 << 20));
        assert!(l.is_empty());
        let (l, _) = judge("nfq", &[], Some((RING_NFQ, "r")), 0, None);
        assert!(l.is_empty());
    }
}

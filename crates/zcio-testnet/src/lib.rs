//! Test hosts for zcio: network namespaces joined by veth, created and removed by this crate.
//!
//! Addresses come from 198.18.0.0/15 (RFC 2544 benchmarking) and 2001:db8::/32 (RFC 3849
//! documentation), or, for [`Pair::with_addrs`], whatever the caller picks ([`PairAddrs::private`]:
//! 10.77.0.0/24 and fd77::/64); each host is its own network namespace, so nothing here is routable outside
//! loopback and the namespaces. Namespaces are named `zcio-<pid>-<n>-<tag>`; they are removed
//! on drop (also while unwinding from a panic), and [`cleanup_stale`] removes those whose
//! creating process is gone (a killed run).
//!
//! A [`Sink`] is a host whose veth peer is down and whose next hop has a static neighbour entry:
//! packets leave the socket, pass the IP stack and are dropped at the device before any local
//! delivery, which is the one local path on which zero-copy send is not copied.
//!
//! Also here, because only tests and benches need them: [`cpu`] (thread pinning and CPU
//! time) and [`scenarios`] (the epoll-equivalence scenarios the event ring is tested with).
#![deny(missing_docs)]

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

pub mod audit;
pub mod caps;
pub mod cpu;
pub mod routes;
// zcio has no event module under `--cfg loom` (scripts/test's loom model run).
#[cfg(not(loom))]
pub mod scenarios;
pub mod seccomp;
pub mod tempdir;

pub use tempdir::TempDir;

/// Name prefix of every namespace this crate creates.
pub const PREFIX: &str = "zcio-";

/// Errors creating or using test hosts.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Creating namespaces needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN).
    #[error("creating network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN); run as root or with sudo")]
    NotRoot,
    /// `ip` (iproute2) is not installed.
    #[error("the `ip` command (iproute2) is not installed: apt-get install iproute2")]
    NoIp,
    /// An `ip` command failed.
    #[error("`ip {args}` failed: {stderr}")]
    Ip {
        /// The arguments.
        args: String,
        /// What it printed.
        stderr: String,
    },
    /// Another I/O error.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;

/// Whether this process runs with euid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether `ZCIO_REQUIRE_PRIV=1` is set: then a test that would skip fails instead.
pub fn require_priv() -> bool {
    std::env::var("ZCIO_REQUIRE_PRIV")
        .map(|v| v == "1")
        .unwrap_or(false)
}

/// Skips (prints the reason, returns `false`) or, under `ZCIO_REQUIRE_PRIV=1`, panics.
pub fn skip(test: &str, reason: &str) -> bool {
    if require_priv() {
        panic!("{test}: required but unavailable (ZCIO_REQUIRE_PRIV=1): {reason}");
    }
    eprintln!("SKIP {test}: {reason}");
    false
}

/// Skips a test because this kernel lacks a feature (prints the reason, returns `false`).
///
/// A missing kernel feature is not a missing privilege, so `ZCIO_REQUIRE_PRIV=1` (CI on the
/// host) does not turn this skip into a failure; `require_env=1` does. `scripts/vmtest` sets
/// such a variable (`ZCIO_REQUIRE_ZCRX=1`) in the guest whose kernel must have the feature.
pub fn skip_kernel_feature(test: &str, require_env: &str, reason: &str) -> bool {
    if std::env::var(require_env).is_ok_and(|v| v == "1") {
        panic!("{test}: required by {require_env}=1 but unavailable: {reason}");
    }
    eprintln!("SKIP {test}: {reason}");
    false
}

/// `true` when test hosts can be made here; otherwise skips with the reason (see [`skip`]).
pub fn can_make_hosts(test: &str) -> bool {
    match check_privileges() {
        Ok(()) => true,
        Err(e) => skip(test, &e.to_string()),
    }
}

/// Checks that namespaces and veths can be created by this process.
pub fn check_privileges() -> Result<()> {
    if !is_root() {
        return Err(Error::NotRoot);
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err(Error::NoIp),
    }
}

/// Runs `ip ARGS`, turning failure into [`Error::Ip`].
pub fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new("ip").args(args).output().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            Error::NoIp
        } else {
            Error::Io {
                what: "running ip".into(),
                source: e,
            }
        }
    })?;
    check_output(args, out)
}

fn check_output(args: &[&str], out: Output) -> Result<String> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Ip {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
    /// `/etc/netns/NAME`, when [`Netns::set_hosts`] made it; removed on drop.
    etc: Option<std::path::PathBuf>,
}

impl Netns {
    /// Creates `zcio-<pid>-<n>-<tag>` with its loopback up. Removes stale namespaces of dead
    /// processes first.
    pub fn new(tag: &str) -> Result<Self> {
        check_privileges()?;
        cleanup_stale();
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("{PREFIX}{}-{n}-{tag}", std::process::id());
        ip(&["netns", "add", &name])?;
        let ns = Self { name, etc: None };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Gives programs started with [`Netns::command`] their own `/etc/hosts` with `entries`
    /// (plus `localhost`): `ip netns exec` bind-mounts `/etc/netns/NAME/hosts` over
    /// `/etc/hosts` for the program it runs. The machine's own `/etc/hosts` is not touched;
    /// `/etc/netns/NAME` is removed on drop.
    pub fn set_hosts(&mut self, entries: &[(&str, std::net::IpAddr)]) -> Result<()> {
        use std::io::Write;
        let io = |what: String| move |e| Error::Io { what, source: e };
        let base = std::path::Path::new("/etc/netns");
        std::fs::create_dir_all(base).map_err(io("creating /etc/netns".into()))?;
        let dir = base.join(&self.name);
        if self.etc.is_none() {
            // Exclusive: a directory already there (of another run, or planted) is an error.
            std::fs::create_dir(&dir).map_err(io(format!("creating {}", dir.display())))?;
            self.etc = Some(dir.clone());
        }
        let mut text = String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n");
        for (name, ip) in entries {
            text.push_str(&format!("{ip}\t{name}\n"));
        }
        let path = dir.join("hosts");
        let _ = std::fs::remove_file(&path);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io(format!("creating {}", path.display())))?;
        f.write_all(text.as_bytes())
            .map_err(io(format!("writing {}", path.display())))?;
        Ok(())
    }

    /// The namespace's name (as `ip netns` knows it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n NAME ARGS`.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// A command that runs `prog` inside the namespace (`ip netns exec`).
    pub fn command(&self, prog: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, prog]);
        c
    }

    /// Runs `f` on a new thread that has entered the namespace; sockets it creates live there.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        let handle = self.spawn(f)?;
        match handle.join() {
            Ok(v) => Ok(v),
            Err(p) => std::panic::resume_unwind(p),
        }
    }

    /// Like [`Netns::run`], but returns the thread's handle at once.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<std::thread::JoinHandle<T>> {
        let path = format!("/run/netns/{}", self.name);
        let file = File::open(&path).map_err(|e| Error::Io {
            what: format!("opening {path}"),
            source: e,
        })?;
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = std::thread::Builder::new()
            .name(format!("ns:{}", self.name))
            .spawn(move || {
                // SAFETY: setns on a valid namespace fd; it affects only this thread.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                if rc != 0 {
                    let _ = tx.send(Err(io::Error::last_os_error()));
                    panic!("setns failed");
                }
                let _ = tx.send(Ok(()));
                f()
            })
            .map_err(|e| Error::Io {
                what: "spawning namespace thread".into(),
                source: e,
            })?;
        match rx.recv() {
            Ok(Ok(())) => Ok(handle),
            Ok(Err(e)) => {
                let _ = handle.join();
                Err(Error::Io {
                    what: format!("setns into {}", self.name),
                    source: e,
                })
            }
            Err(_) => Err(Error::Io {
                what: format!("entering {}", self.name),
                source: io::Error::other("thread died"),
            }),
        }
    }

    /// Waits until `iface` in this namespace has its carrier (`LOWER_UP`) or `timeout` passes.
    pub fn wait_link_up(&self, iface: &str, timeout: std::time::Duration) -> Result<()> {
        let end = std::time::Instant::now() + timeout;
        loop {
            let out = self.ip(&["-o", "link", "show", iface])?;
            if out.contains("LOWER_UP") {
                return Ok(());
            }
            if std::time::Instant::now() > end {
                return Err(Error::Ip {
                    args: format!("-n {} link show {iface}", self.name),
                    stderr: format!("carrier still down after {timeout:?}: {}", out.trim()),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Whether a namespace with this name exists.
    pub fn exists(name: &str) -> bool {
        std::path::Path::new(&format!("/run/netns/{name}")).exists()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(dir) = self.etc.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!(
                "zcio-testnet: could not remove namespace {}: {e}",
                self.name
            );
        }
    }
}

/// Removes namespaces named `zcio-<pid>-…` whose process no longer runs. Returns how many.
pub fn cleanup_stale() -> usize {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return 0;
    };
    let mut removed = 0;
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{name}"));
        if ip(&["netns", "del", &name]).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Two hosts joined by one veth link, with IPv4 and IPv6 addresses on both ends.
#[derive(Debug)]
pub struct Pair {
    /// Host A.
    pub a: Netns,
    /// Host B.
    pub b: Netns,
    /// A's IPv4 address (198.18.0.1 unless chosen).
    pub a4: Ipv4Addr,
    /// B's IPv4 address (198.18.0.2 unless chosen).
    pub b4: Ipv4Addr,
    /// A's IPv6 address (2001:db8::1 unless chosen).
    pub a6: Ipv6Addr,
    /// B's IPv6 address (2001:db8::2 unless chosen).
    pub b6: Ipv6Addr,
    /// Interface name on both sides (`veth0`).
    pub iface: &'static str,
}

/// Addresses for a [`Pair`]: the two ends' IPv4 (on a /24) and IPv6 (on a /64).
#[derive(Debug, Clone, Copy)]
pub struct PairAddrs {
    /// A's IPv4.
    pub a4: Ipv4Addr,
    /// B's IPv4.
    pub b4: Ipv4Addr,
    /// A's IPv6.
    pub a6: Ipv6Addr,
    /// B's IPv6.
    pub b6: Ipv6Addr,
}

impl PairAddrs {
    /// The default test addresses: 198.18.0.1/2, 2001:db8::1/2.
    pub fn test_ranges() -> Self {
        Self {
            a4: Ipv4Addr::new(198, 18, 0, 1),
            b4: Ipv4Addr::new(198, 18, 0, 2),
            a6: "2001:db8::1".parse().expect("literal"),
            b6: "2001:db8::2".parse().expect("literal"),
        }
    }

    /// Private addresses outside the test ranges, 10.77.0.1/2 and fd77::1/2: they exist only
    /// inside the two namespaces, and show a tool has no address filter of its own.
    pub fn private() -> Self {
        Self {
            a4: Ipv4Addr::new(10, 77, 0, 1),
            b4: Ipv4Addr::new(10, 77, 0, 2),
            a6: "fd77::1".parse().expect("literal"),
            b6: "fd77::2".parse().expect("literal"),
        }
    }
}

impl Pair {
    /// Creates two namespaces joined by veth, addressed and up (IPv6 without DAD).
    pub fn new(tag: &str) -> Result<Self> {
        Self::with_addrs(tag, PairAddrs::test_ranges())
    }

    /// Like [`Pair::new`] with chosen addresses.
    pub fn with_addrs(tag: &str, addrs: PairAddrs) -> Result<Self> {
        let a = Netns::new(&format!("{tag}a"))?;
        let b = Netns::new(&format!("{tag}b"))?;
        let iface = "veth0";
        a.ip(&[
            "link",
            "add",
            iface,
            "type",
            "veth",
            "peer",
            "name",
            iface,
            "netns",
            b.name(),
        ])?;
        let pair = Self {
            a,
            b,
            a4: addrs.a4,
            b4: addrs.b4,
            a6: addrs.a6,
            b6: addrs.b6,
            iface,
        };
        for (ns, v4, v6) in [(&pair.a, pair.a4, pair.a6), (&pair.b, pair.b4, pair.b6)] {
            ns.ip(&["addr", "add", &format!("{v4}/24"), "dev", iface])?;
            ns.ip(&["addr", "add", &format!("{v6}/64"), "dev", iface, "nodad"])?;
            ns.ip(&["link", "set", iface, "up"])?;
        }
        // The carrier comes up asynchronously (linkwatch); packets sent before it are dropped
        // by the device's noop qdisc. Wait for it so the first packet of a test arrives.
        for ns in [&pair.a, &pair.b] {
            ns.wait_link_up(iface, std::time::Duration::from_secs(3))?;
        }
        Ok(pair)
    }
}

/// A host whose packets to [`Sink::dst4`]/[`Sink::dst6`] are dropped at its own device, before
/// any local delivery: the veth peer is down and the next hop has a permanent neighbour entry.
#[derive(Debug)]
pub struct Sink {
    /// The sending host.
    pub host: Netns,
    /// Source IPv4 (198.18.1.1).
    pub src4: Ipv4Addr,
    /// Destination IPv4 that goes nowhere (198.18.1.2).
    pub dst4: Ipv4Addr,
    /// Source IPv6 (2001:db8:1::1).
    pub src6: Ipv6Addr,
    /// Destination IPv6 that goes nowhere (2001:db8:1::2).
    pub dst6: Ipv6Addr,
    /// The sending interface (`sink0`).
    pub iface: &'static str,
}

impl Sink {
    /// Creates the sink host.
    pub fn new(tag: &str) -> Result<Self> {
        let host = Netns::new(&format!("{tag}s"))?;
        let iface = "sink0";
        host.ip(&[
            "link", "add", iface, "type", "veth", "peer", "name", "sink1",
        ])?;
        let s = Self {
            host,
            src4: Ipv4Addr::new(198, 18, 1, 1),
            dst4: Ipv4Addr::new(198, 18, 1, 2),
            src6: "2001:db8:1::1".parse().expect("literal"),
            dst6: "2001:db8:1::2".parse().expect("literal"),
            iface,
        };
        let h = &s.host;
        h.ip(&["addr", "add", &format!("{}/24", s.src4), "dev", iface])?;
        h.ip(&[
            "addr",
            "add",
            &format!("{}/64", s.src6),
            "dev",
            iface,
            "nodad",
        ])?;
        h.ip(&["link", "set", iface, "up"])?;
        // sink1 stays down: the carrier of sink0 is off and transmitted packets are dropped.
        let mac = "02:00:5e:00:53:02";
        h.ip(&[
            "neigh",
            "replace",
            &s.dst4.to_string(),
            "lladdr",
            mac,
            "dev",
            iface,
            "nud",
            "permanent",
        ])?;
        h.ip(&[
            "neigh",
            "replace",
            &s.dst6.to_string(),
            "lladdr",
            mac,
            "dev",
            iface,
            "nud",
            "permanent",
        ])?;
        Ok(s)
    }

    /// `(tx packets, tx dropped)` of the sink interface, from the kernel's link statistics.
    pub fn tx_counters(&self) -> Result<(u64, u64)> {
        let iface = self.iface;
        let out = self.host.ip(&["-s", "link", "show", iface])?;
        parse_tx_stats(&out).ok_or_else(|| Error::Ip {
            args: format!("-s link show {iface}"),
            stderr: "unparsable statistics".into(),
        })
    }
}

/// Parses `(tx packets, tx dropped)` from `ip -s link show` output.
fn parse_tx_stats(out: &str) -> Option<(u64, u64)> {
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    let i = lines.iter().position(|l| l.starts_with("TX:"))?;
    let nums: Vec<u64> = lines
        .get(i + 1)?
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // columns: bytes packets errors dropped carrier collsns
    Some((*nums.get(1)?, *nums.get(3)?))
}

/// Makes a C string, for callers that pass names to syscalls.
pub fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL in names")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tx_stats_are_parsed_from_ip_output() {
        let out = "2: sink0@sink1: <NO-CARRIER> mtu 1500\n    RX:  bytes packets errors dropped  missed   mcast\n              0       0      0       0       0       0\n    TX:  bytes packets errors dropped carrier collsns\n          1234      10      0       7       0       0\n";
        assert_eq!(parse_tx_stats(out), Some((10, 7)));
    }
}

//! What this host, its interfaces and its sockets can do, and why not.
//!
//! [`Report::collect`] tries every mechanism for real (ring set-up, opcode probe, `SO_ZEROCOPY`
//! per protocol, a zero-copy send over loopback, zcrx registration per interface, an NFQUEUE
//! bind) and turns each refusal into a sentence. It never fails as a whole: what it could not
//! check is marked with the reason (e.g. missing CAP_NET_ADMIN when run unprivileged).

mod nfq;
mod opcodes;

pub use crate::ring::features::Feature;
use crate::ring::{Ring, RingConfig, RingError, SetupFlag};
use crate::stats::Summary;
use crate::sys::{self, errqueue, net};
use serde::Serialize;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// The whole probe.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `uname -r`.
    pub kernel: String,
    /// Who we are.
    pub privileges: Privileges,
    /// io_uring availability, flags and opcodes.
    pub io_uring: IoUringReport,
    /// `SO_ZEROCOPY` per protocol and family.
    pub zerocopy: Vec<ZerocopySupport>,
    /// Limits that bound zero-copy sends.
    pub limits: Limits,
    /// A real zero-copy send over loopback and what its completions said.
    pub loopback_check: LiveCheck,
    /// Per requested interface.
    pub interfaces: Vec<InterfaceReport>,
    /// Whether an NFQUEUE consumer can bind.
    pub nfqueue: Check,
    /// The path each capability chooses here with its default settings, read through the one
    /// reporting shape ([`crate::stats::Report`]): built on loopback, used for nothing.
    pub capabilities: Vec<CapabilityReport>,
}

/// What one capability chose when built with its defaults.
#[derive(Debug, Clone, Serialize)]
pub struct CapabilityReport {
    /// `sender`, `receiver`, `event_ring`, `route_socket`.
    pub name: &'static str,
    /// Its path, counters and fallbacks; `None` when it could not be built.
    pub summary: Option<Summary>,
    /// Why it could not be built.
    pub error: Option<String>,
}

impl CapabilityReport {
    fn of<R: crate::stats::Report, E: std::fmt::Display>(
        name: &'static str,
        built: Result<R, E>,
    ) -> Self {
        match built {
            Ok(r) => Self {
                name,
                summary: Some(r.summary()),
                error: None,
            },
            Err(e) => Self {
                name,
                summary: None,
                error: Some(e.to_string()),
            },
        }
    }
}

/// Builds each capability with its defaults on loopback (a sender on a connected TCP pair, a
/// receiver on a listener, an event ring, an rtnetlink socket asked for io_uring) and reads
/// what it chose. NFQUEUE is left to [`Report::nfqueue`]: binding a queue is not free.
fn probe_capabilities() -> Vec<CapabilityReport> {
    let sender = (|| -> Result<crate::tx::Sender, String> {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let c = TcpStream::connect(l.local_addr().map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        let pool = crate::tx::Pool::new(64 << 10, 4, false).map_err(|e| e.to_string())?;
        crate::tx::Sender::new(c, &pool, crate::tx::SenderConfig::default())
            .map_err(|e| e.to_string())
    })();
    let receiver = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| e.to_string())
        .and_then(|l| {
            crate::rx::Receiver::listen(l, &crate::rx::RxConfig::default())
                .map_err(|e| e.to_string())
        });
    let route = crate::netlink::RouteSocket::new(4, 1 << 20).map(|mut s| {
        s.use_uring();
        s
    });
    vec![
        CapabilityReport::of("sender", sender),
        CapabilityReport::of("receiver", receiver),
        #[cfg(not(loom))]
        CapabilityReport::of("event_ring", crate::event::EventRing::new()),
        CapabilityReport::of("route_socket", route),
    ]
}

/// Identity and capabilities of the probing process.
#[derive(Debug, Clone, Serialize)]
pub struct Privileges {
    /// Effective uid is 0.
    pub root: bool,
    /// CAP_NET_ADMIN is effective (needed for zcrx and NFQUEUE).
    pub cap_net_admin: bool,
}

/// A yes/no with the reason for "no" (or a remark for "yes").
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Works.
    pub ok: bool,
    /// Whether the check could be made at all (false: `reason` says why not).
    pub checked: bool,
    /// Why not, or what to know.
    pub reason: Option<String>,
}

impl Check {
    fn yes(remark: Option<String>) -> Self {
        Self {
            ok: true,
            checked: true,
            reason: remark,
        }
    }
    fn no(reason: impl Into<String>) -> Self {
        Self {
            ok: false,
            checked: true,
            reason: Some(reason.into()),
        }
    }
    fn unchecked(reason: impl Into<String>) -> Self {
        Self {
            ok: false,
            checked: false,
            reason: Some(reason.into()),
        }
    }
}

/// io_uring on this host.
#[derive(Debug, Clone, Serialize)]
pub struct IoUringReport {
    /// `kernel.io_uring_disabled` (0 enabled, 1 restricted, 2 disabled), if readable.
    pub sysctl_disabled: Option<i64>,
    /// A ring could be set up.
    pub available: bool,
    /// Why not.
    pub reason: Option<String>,
    /// Set-up flags tried with the default configuration (and SQPOLL and CQE32 separately).
    pub setup_flags: Vec<SetupFlag>,
    /// Features newer than Linux 6.1 that zcio uses, each checked the way zcio would use it
    /// (a real request, registration or query where a feature bit or opcode says too little).
    pub features: Vec<crate::ring::features::Feature>,
    /// Device-less zcrx (`ZCRX_REG_NODEV`, 7.1): usable here, independent of any interface.
    pub zcrx_deviceless: Check,
    /// Opcodes the kernel supports, from `IORING_REGISTER_PROBE`.
    pub opcodes: Vec<Opcode>,
}

/// One opcode.
#[derive(Debug, Clone, Serialize)]
pub struct Opcode {
    /// Number.
    pub code: u8,
    /// Name without `IORING_OP_`.
    pub name: &'static str,
    /// Supported by this kernel.
    pub supported: bool,
}

/// `SO_ZEROCOPY` on one socket type.
#[derive(Debug, Clone, Serialize)]
pub struct ZerocopySupport {
    /// `tcp4`, `tcp6`, `udp4`, `udp6`.
    pub proto: &'static str,
    /// The result.
    pub check: Check,
}

/// Memory limits that bound zero-copy.
#[derive(Debug, Clone, Serialize)]
pub struct Limits {
    /// `net.core.optmem_max`: bounds notification memory per socket (ENOBUFS past it).
    pub optmem_max: Option<i64>,
    /// `RLIMIT_MEMLOCK` soft limit in bytes (`None`: unlimited).
    pub memlock_soft: Option<u64>,
    /// `RLIMIT_MEMLOCK` hard limit.
    pub memlock_hard: Option<u64>,
    /// What the limits mean.
    pub notes: Vec<String>,
}

/// A live zero-copy send.
#[derive(Debug, Clone, Serialize)]
pub struct LiveCheck {
    /// The check ran.
    pub ran: bool,
    /// Zero-copy send calls made.
    pub sends: u64,
    /// Send calls covered by completions.
    pub completed: u64,
    /// Of those, reported COPIED.
    pub copied: u64,
    /// What it means.
    pub explanation: String,
}

/// One interface.
#[derive(Debug, Clone, Serialize)]
pub struct InterfaceReport {
    /// Name.
    pub name: String,
    /// Exists in this network namespace.
    pub exists: bool,
    /// Driver name (ETHTOOL_GDRVINFO), if any.
    pub driver: Option<String>,
    /// Number of rx queues (sysfs).
    pub rx_queues: Option<usize>,
    /// Real zcrx registration attempt on queue 0, what the NIC needs and has.
    pub zcrx: crate::rx::zcrx::ZcrxCheck,
    /// Name of `zcrx.errno` (e.g. `EOPNOTSUPP`).
    pub zcrx_errno: Option<String>,
}

/// Name of an errno value (`EOPNOTSUPP`; `errno N` for one without a name here).
pub use crate::sys::errno_name;

impl Report {
    /// Probes everything; `ifaces` are the interfaces to check for zcrx.
    pub fn collect(ifaces: &[String]) -> Self {
        Self {
            kernel: sys::kernel_release(),
            privileges: Privileges {
                root: sys::is_root(),
                cap_net_admin: sys::has_cap_net_admin(),
            },
            io_uring: probe_io_uring(),
            zerocopy: probe_zerocopy(),
            limits: probe_limits(),
            loopback_check: loopback_check(),
            interfaces: ifaces.iter().map(|i| probe_interface(i)).collect(),
            nfqueue: nfq::check(),
            capabilities: probe_capabilities(),
        }
    }
}

fn probe_io_uring() -> IoUringReport {
    let sysctl_disabled = sys::read_sysctl("/proc/sys/kernel/io_uring_disabled").ok();
    let mut rep = IoUringReport {
        sysctl_disabled,
        available: false,
        reason: None,
        setup_flags: vec![],
        opcodes: vec![],
        features: vec![],
        zcrx_deviceless: Check::unchecked("no io_uring"),
    };
    match Ring::<io_uring::cqueue::Entry>::new(&RingConfig::default()) {
        Ok(ring) => {
            rep.available = true;
            rep.setup_flags = ring
                .setup_flags()
                .iter()
                .filter(|f| f.requested)
                .cloned()
                .collect();
            if let Ok(p) = ring.probe_opcodes() {
                rep.opcodes = opcodes::NAMES
                    .iter()
                    .enumerate()
                    .map(|(i, name)| Opcode {
                        code: i as u8,
                        name,
                        supported: p.is_supported(i as u8),
                    })
                    .collect();
            }
        }
        Err(RingError::Unavailable { reason, .. }) => rep.reason = Some(reason),
        Err(e) => rep.reason = Some(e.to_string()),
    }
    if rep.available {
        let feats = crate::ring::features::Features::get();
        rep.features = feats.list.clone();
        rep.zcrx_deviceless = zcrx_deviceless(&feats);
        let sq = RingConfig {
            sqpoll_idle_ms: Some(10),
            ..RingConfig::default()
        };
        match Ring::<io_uring::cqueue::Entry>::new(&sq) {
            Ok(r) => {
                if let Some(f) = r.setup_flags().iter().find(|f| f.name == "SQPOLL") {
                    rep.setup_flags.push(f.clone());
                }
            }
            Err(e) => rep.setup_flags.push(SetupFlag {
                name: "SQPOLL",
                requested: true,
                granted: false,
                reason: Some(e.to_string()),
            }),
        }
        let cqe32 = Ring::<io_uring::cqueue::Entry32>::new(&RingConfig::default());
        rep.setup_flags.push(SetupFlag {
            name: "CQE32",
            requested: true,
            granted: cqe32.is_ok(),
            reason: cqe32.err().map(|e| format!("{e} (CQE32 needs Linux 5.19)")),
        });
    }
    rep
}

/// Device-less zcrx as the receiver would use it: the feature (query or attempt) and, where
/// the query said yes, a real registration (which needs CAP_NET_ADMIN).
fn zcrx_deviceless(f: &crate::ring::features::Features) -> Check {
    use crate::ring::features::Features as F;
    if let Some(why) = f.why_not(F::ZCRX_NODEV) {
        return Check::no(why);
    }
    let flush = match f.why_not(F::ZCRX_FLUSH_RQ) {
        None => "refill through ZCRX_CTRL_FLUSH_RQ".to_string(),
        Some(w) => format!("but no refill flush: {w}"),
    };
    match crate::ring::features::attempt_nodev() {
        Ok(()) => Check::yes(Some(format!(
            "RECV_ZC on any TCP socket into a registered area, {flush}; the kernel copies \
             every byte (COPIED 1.0), no NIC needed"
        ))),
        Err(e) => Check::no(format!(
            "the kernel supports it, but registration failed: {e}"
        )),
    }
}

fn probe_zerocopy() -> Vec<ZerocopySupport> {
    let cases: [(&'static str, i32, i32); 4] = [
        ("tcp4", libc::AF_INET, libc::SOCK_STREAM),
        ("tcp6", libc::AF_INET6, libc::SOCK_STREAM),
        ("udp4", libc::AF_INET, libc::SOCK_DGRAM),
        ("udp6", libc::AF_INET6, libc::SOCK_DGRAM),
    ];
    cases
        .iter()
        .map(|&(proto, dom, ty)| {
            let check = match sys::socket(dom, ty, 0) {
                Err(e) => Check::no(format!("cannot create the socket: {e}")),
                Ok(fd) => match net::enable_zerocopy(&fd) {
                    Ok(()) => Check::yes(None),
                    Err(e) => Check::no(format!(
                        "SO_ZEROCOPY refused ({}): kernel older than 4.14 (TCP) / 5.0 (UDP)",
                        errno_name(e.raw_os_error().unwrap_or(0))
                    )),
                },
            };
            ZerocopySupport { proto, check }
        })
        .collect()
}

fn probe_limits() -> Limits {
    let optmem_max = sys::read_sysctl("/proc/sys/net/core/optmem_max").ok();
    let (memlock_soft, memlock_hard) =
        sys::getrlimit(libc::RLIMIT_MEMLOCK).unwrap_or((Some(0), Some(0)));
    let mut notes = vec![];
    if let Some(o) = optmem_max {
        notes.push(format!(
            "optmem_max={o}: each socket may hold about {} outstanding MSG_ZEROCOPY \
             notifications before send returns ENOBUFS (zcio then waits for completions)",
            o / 256
        ));
    }
    match memlock_soft {
        None => notes
            .push("RLIMIT_MEMLOCK unlimited: fixed buffers and zcrx areas can be pinned".into()),
        Some(v) if sys::effective_caps() & (1 << sys::CAP_IPC_LOCK) != 0 => notes.push(format!(
            "RLIMIT_MEMLOCK={v} bytes, but this process has CAP_IPC_LOCK, which io_uring \
             buffer registration is not bound by"
        )),
        Some(v) => notes.push(format!(
            "RLIMIT_MEMLOCK={v} bytes bounds registered (fixed) buffers and MSG_ZEROCOPY pinned \
             pages; past it zcio falls back to copy with a recorded reason"
        )),
    }
    Limits {
        optmem_max,
        memlock_soft,
        memlock_hard,
        notes,
    }
}

/// Sends zero-copy over TCP loopback and reads the completions.
fn loopback_check() -> LiveCheck {
    match run_loopback_check() {
        Ok((sends, completed, copied)) => {
            let explanation = if copied == completed && completed > 0 {
                "every completion carried SO_EE_CODE_ZEROCOPY_COPIED: loopback (like any local \
                 delivery, including veth to a local namespace) copies zero-copy pages before \
                 delivering to the receiving socket, so zero-copy send saves nothing here; real \
                 zero-copy needs a NIC transmit path (the sink test host shows it)"
                    .to_string()
            } else if completed < sends {
                format!("only {completed} of {sends} sends completed within 2 s")
            } else {
                format!("{} of {completed} completions were copied", copied)
            };
            LiveCheck {
                ran: true,
                sends,
                completed,
                copied,
                explanation,
            }
        }
        Err(e) => LiveCheck {
            ran: false,
            sends: 0,
            completed: 0,
            copied: 0,
            explanation: format!("loopback zero-copy check failed: {e}"),
        },
    }
}

fn run_loopback_check() -> io::Result<(u64, u64, u64)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let c = TcpStream::connect(l.local_addr()?)?;
    let (mut srv, _) = l.accept()?;
    net::enable_zerocopy(&c)?;
    let buf = vec![7u8; 64 << 10];
    let sends = 8u64;
    let reader = std::thread::spawn(move || {
        let mut sink = vec![0u8; 256 << 10];
        let mut total = 0usize;
        while total < 8 * (64 << 10) {
            match std::io::Read::read(&mut srv, &mut sink) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
        total
    });
    for _ in 0..sends {
        let mut off = 0;
        while off < buf.len() {
            off += net::send(&c, &buf[off..], sys::MSG_ZEROCOPY)?;
        }
    }
    let mut ranges = vec![];
    let mut errors = vec![];
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut completed = 0;
    while completed < sends && Instant::now() < deadline {
        net::poll_one(&c, libc::POLLERR, 100)?;
        errqueue::reap(&c, &mut ranges, &mut errors, 0)?;
        completed = ranges.iter().map(|r| r.len()).sum();
    }
    drop(c);
    let _ = reader.join();
    let copied = ranges.iter().filter(|r| r.copied).map(|r| r.len()).sum();
    Ok((sends, completed, copied))
}

fn probe_interface(name: &str) -> InterfaceReport {
    let exists = net::if_index(name).is_some();
    let zcrx = crate::rx::zcrx::check_interface(name, 0);
    InterfaceReport {
        name: name.to_string(),
        exists,
        driver: net::ethtool_driver(name)
            .ok()
            .map(|(d, _)| d)
            .filter(|d| !d.is_empty()),
        rx_queues: std::fs::read_dir(format!("/sys/class/net/{name}/queues"))
            .ok()
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                    .count()
            }),
        zcrx_errno: zcrx.errno.map(errno_name),
        zcrx,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_interface_is_reported_as_enodev() {
        let r = probe_interface("zcio-nosuch0");
        assert!(!r.exists);
        assert!(!r.zcrx.ok);
        assert_eq!(r.zcrx_errno.as_deref(), Some("ENODEV"));
        assert!(
            r.zcrx.explanation.contains("no interface named"),
            "{}",
            r.zcrx.explanation
        );
    }

    #[test]
    fn opcode_table_names_send_zc_and_recv_zc() {
        assert_eq!(opcodes::NAMES[47], "SEND_ZC");
        assert_eq!(opcodes::NAMES[58], "RECV_ZC");
        assert_eq!(io_uring::opcode::SendZc::CODE, 47);
        assert_eq!(io_uring::opcode::RecvZc::CODE, 58);
        assert_eq!(io_uring::opcode::PollAdd::CODE, 6);
    }
}

//! The long-running commands as operators run them. Each daemon (`nfq`, `nflog`, `conntrack
//! events`, `audit`, `proxy`) carries real traffic in a test namespace in a scenario that checks its
//! `--metrics` page (parsed strictly and by `promtool check metrics`): its counters against
//! the traffic, its path label the io_uring one. Each scenario runs twice: as root, and as its
//! systemd unit runs it (`packaging/systemd/*.service`: the unit's own ExecStart line, user,
//! capabilities and LimitMEMLOCK, under `setpriv`), where every system call and socket family
//! the daemon used is also checked against the unit's SystemCallFilter and
//! RestrictAddressFamilies. Then what each does without a capability or locked memory.

#[path = "common/prom.rs"]
mod prom;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zcio_testnet::Netns;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_zcio")
}

/// A daemon in a namespace whose stderr lines are collected as they come.
struct Daemon {
    child: Child,
    err: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    /// Runs `cmd` (a command made by `Netns::command`), stdout discarded.
    fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn daemon");
        let e = child.stderr.take().unwrap();
        let err = Arc::new(Mutex::new(Vec::new()));
        let l = Arc::clone(&err);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(e).lines() {
                let Ok(line) = line else { break };
                l.lock().unwrap().push(line);
            }
        });
        Self {
            child,
            err,
            reader: Some(reader),
        }
    }

    fn stderr(&self) -> String {
        self.err.lock().unwrap().join("\n")
    }

    /// Waits for a stderr line containing `what`; returns it.
    fn wait_line(&mut self, what: &str) -> String {
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            if let Some(l) = self.err.lock().unwrap().iter().find(|l| l.contains(what)) {
                return l.clone();
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(50));
                panic!("daemon exited ({st}) before {what:?}:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no {what:?} line:\n{}", self.stderr());
    }

    /// The address `--metrics` listens on, from its start line.
    fn metrics_addr(&mut self) -> SocketAddr {
        let l = self.wait_line("metrics on http://");
        l.split("http://")
            .nth(1)
            .and_then(|r| r.strip_suffix("/metrics"))
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {l:?}"))
    }

    /// SIGTERM to the `zcio` process (the child, or the first `zcio` below it when it runs
    /// under `ip netns exec`, `setpriv` and `strace`), then the exit status and the stderr
    /// text.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        let pid = zcio_below(self.child.id()).unwrap_or(self.child.id());
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let st = self.child.wait().unwrap();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        (st, self.stderr())
    }
}

/// The first process named `zcio` at or below `pid` (breadth first).
fn zcio_below(pid: u32) -> Option<u32> {
    let stat = |p: u32| std::fs::read_to_string(format!("/proc/{p}/stat")).ok();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let st = stat(p)?;
        if st.contains("(zcio)") {
            return Some(p);
        }
        for e in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(c) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            // Field 4 (after the parenthesised name) is the parent.
            let ppid = stat(c).and_then(|s| {
                s.rsplit_once(") ")
                    .and_then(|(_, r)| r.split(' ').nth(1).and_then(|x| x.parse().ok()))
            });
            if ppid == Some(p) {
                todo.insert(0, c);
            }
        }
    }
    None
}

impl Drop for Daemon {
    /// After a failed check: SIGTERM to the `zcio` below the child (a SIGKILL to `ip netns
    /// exec` or `strace` would orphan it, still bound — or still the registered audit
    /// daemon), waited for up to 5 s, then the child killed.
    fn drop(&mut self) {
        if let Some(pid) = zcio_below(self.child.id()).filter(|&p| p != self.child.id()) {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
            let end = Instant::now() + Duration::from_secs(5);
            while std::path::Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Scrapes `addr` inside `ns` until `done` holds for the parsed page (at most 20 s); checks
/// every page strictly and the last with promtool. Returns the last page.
fn scrape_until(
    test: &str,
    ns: &Netns,
    addr: SocketAddr,
    done: impl Fn(&prom::Metrics) -> bool,
) -> prom::Metrics {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let text = ns.run(move || prom::scrape(addr)).unwrap().unwrap();
        let m = prom::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        if done(&m) || Instant::now() > end {
            match prom::promtool_check(&text) {
                Ok(true) => {}
                Ok(false) => {
                    zcio_testnet::skip(
                        test,
                        "promtool not installed (scripts/deps installs Debian's prometheus); \
                         the strict parser alone checked the page",
                    );
                }
                Err(e) => panic!("{e}\n{text}"),
            }
            assert!(done(&m), "condition not met by the last page:\n{text}");
            return m;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn iptables(test: &str, ns: &Netns, args: &[&str]) -> bool {
    match ns.command("iptables").args(args).output() {
        Ok(o) if o.status.success() => true,
        other => zcio_testnet::skip(test, &format!("iptables {args:?} refused: {other:?}")),
    }
}

fn v(m: &prom::Metrics, name: &str, labels: &[(&str, &str)]) -> f64 {
    m.value(name, labels).unwrap_or(-1.0)
}

/// How a scenario's daemon is started: `base` is the command line the unit's ExecStart has
/// (after `zcio`), with `%i` already replaced by the instance; `extra` is what a scenario adds
/// (the unit's `$ZCIO_ARGS`).
type Launch<'a> = &'a dyn Fn(&Netns, &[&str], &[&str]) -> Command;

/// The plain launcher: `zcio BASE EXTRA` as root.
fn as_root(ns: &Netns, base: &[&str], extra: &[&str]) -> Command {
    let mut c = ns.command(bin());
    c.args(base).args(extra);
    c
}

/// Sends 100 datagrams to a kept port and 100 to a dropped one through `zcio nfq` on queue 42.
fn nfq_scenario(test: &str, launch: Launch<'_>) -> Option<String> {
    let ns = Netns::new("mnfq").unwrap();
    let rule = [
        "-A",
        "INPUT",
        "-p",
        "udp",
        "-j",
        "NFQUEUE",
        "--queue-num",
        "42",
    ];
    if !iptables(test, &ns, &rule) {
        return None;
    }
    let base = ["nfq", "--queue", "42", "--stats-interval", "60"];
    let extra = ["--drop-udp-port", "5001", "--metrics", "127.0.0.1:0"];
    let mut d = Daemon::spawn(launch(&ns, &base, &extra));
    let addr = d.metrics_addr();
    d.wait_line("bound queue(s)");
    let kept = ns
        .run(|| {
            let keep = UdpSocket::bind("127.0.0.1:5000").unwrap();
            keep.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            for i in 0..100u32 {
                tx.send_to(&i.to_be_bytes(), "127.0.0.1:5000").unwrap();
                tx.send_to(&i.to_be_bytes(), "127.0.0.1:5001").unwrap();
            }
            let mut n = 0;
            let mut b = [0u8; 8];
            while keep.recv(&mut b).is_ok() {
                n += 1;
            }
            n
        })
        .unwrap();
    assert_eq!(kept, 100, "{}", d.stderr());
    let q = [("queues", "42-42")];
    let m = scrape_until(test, &ns, addr, |m| {
        v(m, "zcio_nfq_received_total", &q) == 200.0
    });
    assert_eq!(v(&m, "zcio_nfq_accepted_total", &q), 100.0);
    assert_eq!(v(&m, "zcio_nfq_dropped_total", &q), 100.0);
    assert_eq!(v(&m, "zcio_nfq_held", &q), 0.0);
    assert_eq!(m.kind("zcio_nfq_held"), Some("gauge"));
    assert_eq!(
        v(
            &m,
            "zcio_path_info",
            &[("queues", "42-42"), ("path", "frame-ring+io_uring")]
        ),
        1.0
    );
    assert!(m.samples("zcio_fallbacks").is_empty(), "{m:?}");
    assert_eq!(v(&m, "zcio_report_ops_total", &q), 200.0);
    let k = [("queue", "42")];
    if v(&m, "zcio_nfq_kernel_counters_readable", &q) == 1.0 {
        assert_eq!(v(&m, "zcio_nfq_kernel_queue_dropped_total", &k), 0.0);
        assert_eq!(v(&m, "zcio_nfq_kernel_user_dropped_total", &k), 0.0);
    } else {
        // Not root: the table is root's, and the daemon said so at start.
        assert!(d.stderr().contains("cannot read the kernel's queue table"));
        assert!(m.samples("zcio_nfq_kernel_queue_dropped_total").is_empty());
    }
    let (st, err) = d.stop();
    assert!(st.success(), "{err}");
    Some(err)
}

/// Logs 50 datagrams to NFLOG group 9 through `zcio nflog`.
fn nflog_scenario(test: &str, launch: Launch<'_>) -> Option<String> {
    let ns = Netns::new("mnfl").unwrap();
    let rule = [
        "-A", "OUTPUT", "-p", "udp", "--dport", "6000", "-j", "NFLOG",
    ];
    if !iptables(test, &ns, &[&rule[..], &["--nflog-group", "9"]].concat()) {
        return None;
    }
    let base = ["nflog", "-g", "9", "--stats-interval", "60"];
    let mut d = Daemon::spawn(launch(&ns, &base, &["--metrics", "127.0.0.1:0"]));
    let addr = d.metrics_addr();
    d.wait_line("listening on group(s)");
    ns.run(|| {
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in 0..50u32 {
            tx.send_to(&i.to_be_bytes(), "127.0.0.1:6000").unwrap();
        }
    })
    .unwrap();
    let m = scrape_until(test, &ns, addr, |m| {
        v(m, "zcio_nflog_packets_total", &[]) == 50.0
    });
    let g = [("group", "9")];
    assert_eq!(v(&m, "zcio_nflog_group_packets_total", &g), 50.0);
    assert_eq!(v(&m, "zcio_nflog_group_lost_total", &g), 0.0);
    assert_eq!(v(&m, "zcio_nflog_lost_total", &[]), 0.0);
    assert_eq!(v(&m, "zcio_nflog_kernel_drops_total", &[]), 0.0);
    assert_eq!(v(&m, "zcio_nflog_overruns_total", &[]), 0.0);
    assert_eq!(v(&m, "zcio_nflog_written_total", &[]), 50.0);
    assert_eq!(
        v(&m, "zcio_path_info", &[("path", "frame-ring+io_uring")]),
        1.0
    );
    assert!(m.samples("zcio_fallbacks").is_empty(), "{m:?}");
    let (st, err) = d.stop();
    assert!(st.success(), "{err}");
    Some(err)
}

/// Registers `zcio audit` as the host's audit daemon (audit is per host, not per network
/// namespace: the daemon runs in the scenario's namespace as the others do, and kauditd sends
/// to its socket there) and counts a storm of 300 `openat` calls of a watched file. Under
/// `AuditHost`: serialised with the other audit tests, the host's audit state set back.
fn audit_scenario(test: &str, launch: Launch<'_>) -> Option<String> {
    let mut host = zcio_testnet::audit::AuditHost::take(test, false)?;
    let ns = Netns::new("maud").unwrap();
    let (file, _key) = host.watch("unit");
    // The unit's log is /var/log/zcio (systemd's LogsDirectory); here a directory the
    // daemon's user may write, given in ZCIO_ARGS (which overrides the unit's `-w`).
    let dir = host.dir().join("log");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let log = dir.join("audit.log");
    let base = [
        "audit",
        "--format",
        "auditd",
        "-w",
        "/var/log/zcio/audit.log",
        "-C",
        "8M",
        "--stats-interval",
        "60",
    ];
    let extra = ["-w", log.to_str().unwrap(), "--metrics", "127.0.0.1:0"];
    let mut d = Daemon::spawn(launch(&ns, &base, &extra));
    let addr = d.metrics_addr();
    d.wait_line("kernel audit status at start");
    const N: usize = 300;
    let end = Instant::now() + Duration::from_secs(20);
    while zcio::netlink::audit_status().unwrap().pid == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        zcio_testnet::audit::storm(&file, N)
            .wait()
            .unwrap()
            .success(),
        "the storm"
    );
    let m = scrape_until(test, &ns, addr, |m| {
        v(m, "zcio_audit_shown_total", &[]) >= N as f64
    });
    assert!(v(&m, "zcio_audit_events_total", &[]) >= N as f64);
    assert_eq!(v(&m, "zcio_audit_incomplete_total", &[]), 0.0);
    assert_eq!(v(&m, "zcio_audit_lost_at_least_total", &[]), 0.0);
    assert_eq!(
        v(&m, "zcio_path_info", &[("path", "frame-ring+io_uring")]),
        1.0
    );
    // The unit has no CAP_NET_ADMIN, so the 8 MiB receive buffer is capped by rmem_max (a
    // recorded fallback; as the registered daemon it loses nothing by it: kauditd waits for
    // room in the socket and keeps records in its backlog meanwhile).
    for f in m.samples("zcio_fallbacks") {
        assert!(
            f.labels
                .iter()
                .any(|(k, v)| k == "from" && v == "SO_RCVBUFFORCE"),
            "{f:?}"
        );
    }
    let (st, err) = d.stop();
    assert!(st.success(), "{err}");
    assert!(err.contains("no loss"), "{err}");
    let written = std::fs::read_to_string(&log).unwrap();
    assert!(
        written
            .lines()
            .filter(|l| l.starts_with("type=SYSCALL "))
            .count()
            >= N,
        "the log"
    );
    assert_eq!(
        zcio::netlink::audit_status().unwrap().pid,
        0,
        "unregistered"
    );
    Some(err)
}

/// Makes new UDP flows and counts their NEW events through `zcio conntrack events`.
fn conntrack_scenario(test: &str, launch: Launch<'_>) -> Option<String> {
    let ns = Netns::new("mct").unwrap();
    let rule = [
        "-A",
        "INPUT",
        "-m",
        "conntrack",
        "--ctstate",
        "NEW",
        "-j",
        "ACCEPT",
    ];
    if !iptables(test, &ns, &rule) {
        return None;
    }
    let base = ["conntrack", "events", "--stats-interval", "60"];
    let extra = ["-e", "NEW", "--metrics", "127.0.0.1:0"];
    let mut d = Daemon::spawn(launch(&ns, &base, &extra));
    let addr = d.metrics_addr();
    // Flows until the first one's event is counted (the subscription is live), then 10 more.
    let first = scrape_until(test, &ns, addr, |m| {
        ns.run(|| {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            let _ = s.send_to(b"x", "127.0.0.1:7000");
        })
        .unwrap();
        v(m, "zcio_conntrack_new_total", &[]) >= 1.0
    });
    let before = v(&first, "zcio_conntrack_new_total", &[]);
    ns.run(|| {
        for _ in 0..10 {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.send_to(b"x", "127.0.0.1:7001").unwrap();
        }
    })
    .unwrap();
    let m = scrape_until(test, &ns, addr, |m| {
        v(m, "zcio_conntrack_new_total", &[]) >= before + 10.0
    });
    assert_eq!(v(&m, "zcio_conntrack_lost_total", &[]), 0.0);
    assert_eq!(v(&m, "zcio_conntrack_overruns_total", &[]), 0.0);
    assert_eq!(
        v(&m, "zcio_conntrack_events_total", &[]),
        v(&m, "zcio_conntrack_new_total", &[])
    );
    assert_eq!(
        v(&m, "zcio_path_info", &[("path", "frame-ring+io_uring")]),
        1.0
    );
    assert!(m.samples("zcio_fallbacks").is_empty(), "{m:?}");
    let (st, err) = d.stop();
    assert!(st.success(), "{err}");
    Some(err)
}

/// Forwards 1 MiB up and an 8-byte answer down through `zcio proxy`.
fn proxy_scenario(test: &str, launch: Launch<'_>) -> Option<String> {
    let _ = test;
    let ns = Netns::new("mpx").unwrap();
    // The upstream: reads everything, answers with its count.
    let up = ns
        .spawn(|| {
            let l = TcpListener::bind("127.0.0.1:8401").unwrap();
            let (mut s, _) = l.accept().unwrap();
            let mut b = Vec::new();
            s.read_to_end(&mut b).unwrap();
            s.write_all(&(b.len() as u64).to_be_bytes()).unwrap();
        })
        .unwrap();
    let base = ["proxy", "--stats-interval", "60"];
    let extra = ["--listen", "127.0.0.1:8400", "--to", "127.0.0.1:8401"];
    let extra = [&extra[..], &["--metrics", "127.0.0.1:0"]].concat();
    let mut d = Daemon::spawn(launch(&ns, &base, &extra));
    let addr = d.metrics_addr();
    // The proxy listens once its threads are ready: the listening line comes last.
    d.wait_line("127.0.0.1:8400 -> ");
    let got = ns
        .run(|| {
            let mut s = TcpStream::connect("127.0.0.1:8400").unwrap();
            s.write_all(&vec![7u8; 1 << 20]).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut b = [0u8; 8];
            s.read_exact(&mut b).unwrap();
            u64::from_be_bytes(b)
        })
        .unwrap();
    up.join().unwrap();
    assert_eq!(got, 1 << 20);
    let t = [("thread", "0")];
    let m = scrape_until(test, &ns, addr, |m| {
        v(
            m,
            "zcio_proxy_ended_total",
            &[("thread", "0"), ("kind", "Done")],
        ) == 1.0
    });
    assert_eq!(v(&m, "zcio_proxy_bytes_up_total", &t), (1u64 << 20) as f64);
    assert_eq!(v(&m, "zcio_proxy_bytes_down_total", &t), 8.0);
    assert_eq!(v(&m, "zcio_proxy_accepted_total", &t), 1.0);
    assert_eq!(v(&m, "zcio_proxy_active", &t), 0.0);
    assert_eq!(v(&m, "zcio_proxy_one_ring", &t), 1.0);
    let path = |side: &str| {
        m.samples("zcio_path_info")
            .into_iter()
            .find(|s| s.labels.iter().any(|(k, v)| k == "side" && v == side))
            .and_then(|s| {
                s.labels
                    .iter()
                    .find(|(k, _)| k == "path")
                    .map(|x| x.1.clone())
            })
            .unwrap()
    };
    // lo has no zcrx: the one fallback allowed is zcrx -> bufring.
    assert_eq!(path("rx"), "bufring");
    assert!(path("tx").starts_with("uring"), "tx path {}", path("tx"));
    for f in m.samples("zcio_fallbacks") {
        let from = f.labels.iter().find(|(k, _)| k == "from").unwrap();
        assert_eq!(from.1, "zcrx", "{f:?}");
    }
    assert_eq!(m.kind("zcio_proxy_hold_seconds"), Some("histogram"));
    assert!(v(&m, "zcio_proxy_hold_seconds_count", &t) >= 1.0);
    // The latency the proxy sees itself: per chunk received -> its send completed, and per
    // pair accept -> first byte forwarded (one pair).
    for h in [
        "zcio_proxy_forward_seconds",
        "zcio_proxy_forward_new_seconds",
        "zcio_proxy_first_forward_seconds",
    ] {
        assert_eq!(m.kind(h), Some("histogram"), "{h}");
    }
    assert!(v(&m, "zcio_proxy_forward_seconds_count", &t) >= 2.0);
    assert_eq!(v(&m, "zcio_proxy_first_forward_seconds_count", &t), 1.0);
    assert!(v(&m, "zcio_proxy_first_forward_seconds_sum", &t) > 0.0);
    let (st, err) = d.stop();
    assert!(st.success(), "{err}");
    Some(err)
}

#[test]
fn nfq_metrics_count_the_verdicts_and_name_the_io_uring_path() {
    let test = "nfq_metrics_count_the_verdicts_and_name_the_io_uring_path";
    if zcio_testnet::can_make_hosts(test) {
        nfq_scenario(test, &as_root);
    }
}

#[test]
fn nflog_metrics_count_the_packets_and_the_losses_per_group() {
    let test = "nflog_metrics_count_the_packets_and_the_losses_per_group";
    if zcio_testnet::can_make_hosts(test) {
        nflog_scenario(test, &as_root);
    }
}

#[test]
fn conntrack_metrics_count_the_events_and_the_lost_ones() {
    let test = "conntrack_metrics_count_the_events_and_the_lost_ones";
    if zcio_testnet::can_make_hosts(test) {
        conntrack_scenario(test, &as_root);
    }
}

#[test]
fn audit_metrics_count_a_storms_events_and_no_loss() {
    let test = "audit_metrics_count_a_storms_events_and_no_loss";
    if zcio_testnet::can_make_hosts(test) {
        audit_scenario(test, &as_root);
    }
}

#[test]
fn proxy_metrics_count_the_bytes_and_the_pairs_per_thread() {
    let test = "proxy_metrics_count_the_bytes_and_the_pairs_per_thread";
    if zcio_testnet::can_make_hosts(test) {
        proxy_scenario(test, &as_root);
    }
}

/// `prlimit ... setpriv ... --` in `ns`: the program appended runs as `uid` (its own group, no
/// supplementary groups) with only `caps` (setpriv's names: `net_admin`) as ambient,
/// inheritable and bounding sets, no new privileges, and these limits.
fn unprivileged(
    ns: &Netns,
    uid: u32,
    caps: &[String],
    memlock: Option<u64>,
    nofile: Option<u64>,
) -> Command {
    let caps: String = caps.iter().map(|c| format!(",+{c}")).collect();
    let mut c = ns.command("prlimit");
    if let Some(m) = memlock {
        c.arg(format!("--memlock={m}:{m}"));
    }
    if let Some(n) = nofile {
        c.arg(format!("--nofile={n}:{n}"));
    }
    c.args([
        "setpriv",
        &format!("--reuid={uid}"),
        &format!("--regid={uid}"),
    ])
    .arg("--clear-groups")
    .arg(format!("--inh-caps=-all{caps}"))
    .arg(format!("--ambient-caps=-all{caps}"))
    .arg(format!("--bounding-set=-all{caps}"))
    .args(["--no-new-privs", "--"]);
    c
}

/// The settings of a unit file (`packaging/systemd/NAME`) that a run under `setpriv`
/// reproduces and checks.
#[derive(Debug)]
struct Unit {
    /// ExecStart, split on spaces.
    exec: Vec<String>,
    /// AmbientCapabilities, as setpriv names them (`net_admin`).
    caps: Vec<String>,
    bounding: Vec<String>,
    memlock: Option<u64>,
    nofile: Option<u64>,
    /// SystemCallFilter lines: allowed, then denied (`~`).
    allow: Vec<String>,
    deny: Vec<String>,
    families: Vec<String>,
    dynamic_user: bool,
}

fn size(v: &str) -> u64 {
    let (n, m) = match v.chars().last() {
        Some('K') => (&v[..v.len() - 1], 1u64 << 10),
        Some('M') => (&v[..v.len() - 1], 1 << 20),
        Some('G') => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    n.parse::<u64>().unwrap() * m
}

fn unit(name: &str) -> Unit {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../packaging/systemd")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut u = Unit {
        exec: Vec::new(),
        caps: Vec::new(),
        bounding: Vec::new(),
        memlock: None,
        nofile: None,
        allow: Vec::new(),
        deny: Vec::new(),
        families: Vec::new(),
        dynamic_user: false,
    };
    let caps = |v: &str| -> Vec<String> {
        v.split_whitespace()
            .map(|c| c.trim_start_matches("CAP_").to_ascii_lowercase())
            .collect()
    };
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        match k {
            "ExecStart" => u.exec = v.split_whitespace().map(String::from).collect(),
            "AmbientCapabilities" => u.caps = caps(v),
            "CapabilityBoundingSet" => u.bounding = caps(v),
            "LimitMEMLOCK" => u.memlock = Some(size(v)),
            "LimitNOFILE" => u.nofile = Some(size(v)),
            "SystemCallFilter" => match v.strip_prefix('~') {
                Some(d) => u.deny.extend(d.split_whitespace().map(String::from)),
                None => u.allow.extend(v.split_whitespace().map(String::from)),
            },
            "RestrictAddressFamilies" => {
                u.families = v.split_whitespace().map(String::from).collect()
            }
            "DynamicUser" => u.dynamic_user = v == "yes",
            _ => {}
        }
    }
    u
}

/// The hard limit of `resource` here (a test cannot raise it without CAP_SYS_RESOURCE).
fn hard_limit(name: &str) -> u64 {
    let l = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = l.lines().find(|x| x.starts_with(name)).unwrap();
    let f: Vec<&str> = line[name.len()..].split_whitespace().collect();
    f[1].parse().unwrap_or(u64::MAX)
}

/// systemd's syscall groups (`systemd-analyze syscall-filter`), expanded: the system calls
/// in `names` (groups and single calls).
fn expand(
    groups: &std::collections::HashMap<String, Vec<String>>,
    names: &[String],
) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo: Vec<String> = names.to_vec();
    let mut seen = std::collections::HashSet::new();
    while let Some(n) = todo.pop() {
        if !seen.insert(n.clone()) {
            continue;
        }
        match groups.get(&n) {
            Some(g) => todo.extend(g.iter().cloned()),
            None => out.push(n),
        }
    }
    out
}

fn syscall_groups() -> std::collections::HashMap<String, Vec<String>> {
    let o = Command::new("systemd-analyze")
        .arg("syscall-filter")
        .output()
        .unwrap();
    let mut g: std::collections::HashMap<String, Vec<String>> = Default::default();
    let mut cur = None;
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        if line.starts_with('@') {
            cur = Some(line.trim().to_string());
            g.insert(line.trim().to_string(), Vec::new());
        } else if let (Some(c), Some(e)) = (&cur, line.strip_prefix("    ")) {
            if !e.starts_with('#') && !e.trim().is_empty() {
                g.get_mut(c).unwrap().push(e.trim().to_string());
            }
        }
    }
    assert!(
        g.contains_key("@system-service"),
        "systemd-analyze syscall-filter: {o:?}"
    );
    g
}

/// Runs `scenario` as the unit runs its daemon: the unit's ExecStart (with `%i` = `instance`
/// and `$ZCIO_ARGS` = the scenario's extra arguments; `/usr/bin/zcio` is the binary under
/// test), as a fresh unprivileged user (the unit's `DynamicUser=yes`), with the unit's
/// ambient capabilities and bounding set only, no new privileges, its LimitMEMLOCK, under
/// strace. Then checks that the daemon named nothing missing, and that every system call and
/// socket family it used passes the unit's SystemCallFilter and RestrictAddressFamilies.
fn unit_case(
    test: &str,
    name: &str,
    instance: &str,
    uid: u32,
    scenario: fn(&str, Launch<'_>) -> Option<String>,
) {
    if !zcio_testnet::can_make_hosts(test) {
        return;
    }
    for tool in ["setpriv", "strace", "prlimit", "systemd-analyze"] {
        if Command::new(tool).arg("--version").output().is_err() {
            zcio_testnet::skip(test, &format!("{tool} not installed (scripts/deps)"));
            return;
        }
    }
    let u = unit(name);
    assert!(u.dynamic_user, "{name}: DynamicUser=yes expected");
    assert_eq!(
        u.caps, u.bounding,
        "{name}: ambient and bounding sets differ"
    );
    assert_eq!(u.exec.first().map(String::as_str), Some("/usr/bin/zcio"));
    let dir = zcio_testnet::tempdir::TempDir::new("unit").unwrap();
    std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid)).unwrap();
    let trace = dir.join("trace");
    let hard_memlock = hard_limit("Max locked memory");
    let memlock = u.memlock.expect("LimitMEMLOCK").min(hard_memlock);
    if memlock < u.memlock.unwrap() {
        eprintln!(
            "{test}: LimitMEMLOCK {} clamped to this host's hard limit {memlock} (raising it \
             needs CAP_SYS_RESOURCE)",
            u.memlock.unwrap()
        );
    }
    let launch = |ns: &Netns, base: &[&str], extra: &[&str]| {
        let mut exec: Vec<String> = Vec::new();
        for t in &u.exec[1..] {
            match t.as_str() {
                "$ZCIO_ARGS" => exec.extend(extra.iter().map(|s| s.to_string())),
                t => exec.push(t.replace("%i", instance)),
            }
        }
        // The scenario's command line is the unit's.
        assert_eq!(
            &exec[..exec.len() - extra.len()],
            base,
            "{name}: ExecStart differs from the scenario"
        );
        let nofile = u.nofile.map(|n| n.min(hard_limit("Max open files")));
        let mut c = unprivileged(ns, uid, &u.caps, Some(memlock), nofile);
        c.args(["strace", "-f", "-qq", "-o"])
            .arg(&trace)
            .arg(bin())
            .args(&exec);
        c
    };
    let Some(err) = scenario(test, &launch) else {
        return;
    };
    assert!(
        !err.contains(": missing "),
        "{name}: the daemon lacked something:\n{err}"
    );
    // System calls and socket families against the unit's filters.
    let t = std::fs::read_to_string(&trace).unwrap();
    let groups = syscall_groups();
    let allowed = expand(&groups, &u.allow);
    let denied = expand(&groups, &u.deny);
    let mut used = std::collections::BTreeSet::new();
    let mut families = std::collections::BTreeSet::new();
    for line in t.lines() {
        let rest = line.split_once(' ').map_or(line, |(_, r)| r.trim_start());
        let rest = rest.strip_prefix("<... ").unwrap_or(rest);
        let Some(name) = rest.split(['(', ' ']).next().filter(|n| {
            !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        }) else {
            continue;
        };
        used.insert(name.to_string());
        if let Some(f) = rest.strip_prefix("socket(") {
            families.insert(f.split(',').next().unwrap().to_string());
        }
    }
    assert!(
        used.contains("io_uring_setup") && used.contains("io_uring_enter"),
        "{used:?}"
    );
    let refused: Vec<&String> = used
        .iter()
        .filter(|s| !allowed.contains(s) || denied.contains(s))
        .collect();
    assert!(
        refused.is_empty(),
        "{name}: SystemCallFilter would refuse {refused:?} (used: {used:?})"
    );
    for f in &families {
        assert!(
            u.families.contains(f),
            "{name}: RestrictAddressFamilies lacks {f} (used: {families:?})"
        );
    }
    eprintln!(
        "{test}: {} system calls, families {families:?}: all allowed",
        used.len()
    );
}

/// A uid from systemd's DynamicUser range (61184-65519), distinct per test (`k` < 9) and run:
/// the kernel charges io_uring rings to the user, so tests that run at once must not share one.
fn dynamic_uid(k: u32) -> u32 {
    61184 + (std::process::id() % 480) * 9 + k
}

#[test]
fn nfq_unit_runs_unprivileged_on_the_io_uring_path_within_its_filters() {
    let test = "nfq_unit_runs_unprivileged_on_the_io_uring_path_within_its_filters";
    unit_case(
        test,
        "zcio-nfq@.service",
        "42",
        dynamic_uid(0),
        nfq_scenario,
    );
}

#[test]
fn nflog_unit_runs_unprivileged_on_the_io_uring_path_within_its_filters() {
    let test = "nflog_unit_runs_unprivileged_on_the_io_uring_path_within_its_filters";
    unit_case(
        test,
        "zcio-nflog@.service",
        "9",
        dynamic_uid(1),
        nflog_scenario,
    );
}

#[test]
fn conntrack_unit_runs_unprivileged_on_the_io_uring_path_within_its_filters() {
    let test = "conntrack_unit_runs_unprivileged_on_the_io_uring_path_within_its_filters";
    unit_case(
        test,
        "zcio-conntrack-events.service",
        "",
        dynamic_uid(2),
        conntrack_scenario,
    );
}

#[test]
fn audit_unit_runs_unprivileged_on_the_io_uring_path_within_its_filters() {
    let test = "audit_unit_runs_unprivileged_on_the_io_uring_path_within_its_filters";
    unit_case(
        test,
        "zcio-audit.service",
        "",
        dynamic_uid(8),
        audit_scenario,
    );
}

#[test]
fn proxy_unit_runs_unprivileged_on_the_io_uring_path_within_its_filters() {
    let test = "proxy_unit_runs_unprivileged_on_the_io_uring_path_within_its_filters";
    unit_case(
        test,
        "zcio-proxy@.service",
        "a",
        dynamic_uid(3),
        proxy_scenario,
    );
}

#[test]
fn without_cap_net_admin_the_netlink_daemons_name_it_and_stop() {
    let test = "without_cap_net_admin_the_netlink_daemons_name_it_and_stop";
    if !zcio_testnet::can_make_hosts(test) {
        return;
    }
    let ns = Netns::new("nocap").unwrap();
    for (k, args) in [
        &["nfq", "--queue", "43"][..],
        &["nflog", "-g", "10"],
        &["conntrack", "events"],
    ]
    .into_iter()
    .enumerate()
    {
        let o = unprivileged(&ns, dynamic_uid(4 + k as u32), &[], None, None)
            .arg(bin())
            .args(args)
            .args(["--duration", "1"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("missing CAP_NET_ADMIN (") && err.contains("cannot run without it"),
            "{args:?}: {err}"
        );
        assert!(err.contains("--ambient-caps +net_admin"), "{err}");
    }
}

#[test]
fn short_locked_memory_is_named_and_each_netlink_daemon_runs_on_recvmmsg() {
    let test = "short_locked_memory_is_named_and_each_netlink_daemon_runs_on_recvmmsg";
    if !zcio_testnet::can_make_hosts(test) {
        return;
    }
    let ns = Netns::new("memlk").unwrap();
    for (k, (args, label)) in [
        (&["nfq", "--queue", "44"][..], Some(("queues", "44-44"))),
        (&["nflog", "-g", "11"], None),
        (&["conntrack", "events"], None),
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = unprivileged(
            &ns,
            dynamic_uid(4 + k as u32),
            &["net_admin".into()],
            Some(4 << 10),
            None,
        );
        c.arg(bin())
            .args(args)
            .args(["--stats-interval", "0", "--metrics", "127.0.0.1:0"]);
        let mut d = Daemon::spawn(c);
        let addr = d.metrics_addr();
        let line = d.wait_line("RLIMIT_MEMLOCK is 4 KiB");
        assert!(
            line.contains("missing CAP_IPC_LOCK") && line.contains("frame-ring+recvmmsg"),
            "{line}"
        );
        let l: Vec<(&str, &str)> = label.into_iter().collect();
        let m = scrape_until(test, &ns, addr, |m| {
            let mut p = l.clone();
            p.push(("path", "frame-ring+recvmmsg"));
            v(m, "zcio_path_info", &p) == 1.0
        });
        // The refused ring is a recorded fallback, with the reason.
        let f = m.samples("zcio_fallbacks");
        assert!(
            f.iter().any(|s| s
                .labels
                .iter()
                .any(|(k, v)| k == "to" && v == "frame-ring+recvmmsg")),
            "{args:?}: {f:?}"
        );
        let (st, err) = d.stop();
        assert!(st.success(), "{args:?}: {err}");
    }
}

#[test]
fn proxy_runs_without_capabilities_and_names_what_each_missing_one_costs() {
    let test = "proxy_runs_without_capabilities_and_names_what_each_missing_one_costs";
    if !zcio_testnet::can_make_hosts(test) {
        return;
    }
    let ns = Netns::new("pxnc").unwrap();
    let proxy = |memlock: Option<u64>, listen: &str| {
        let mut c = unprivileged(&ns, dynamic_uid(7), &[], memlock, None);
        c.arg(bin())
            .args(["proxy", "--listen", listen, "--to", "127.0.0.1:8411"]);
        c
    };
    // The receive path a proxy took, after the line naming what it lacked.
    let rx_path = |memlock: Option<u64>, listen: &str, named: &str, without: &str| {
        let mut c = proxy(memlock, listen);
        c.args(["--stats-interval", "0", "--metrics", "127.0.0.1:0"]);
        let mut d = Daemon::spawn(c);
        let addr = d.metrics_addr();
        let line = d.wait_line(named);
        assert!(line.contains(without), "{line}");
        let m = scrape_until(test, &ns, addr, |m| !m.samples("zcio_path_info").is_empty());
        let (st, err) = d.stop();
        assert!(st.success(), "{err}");
        m.samples("zcio_path_info")
            .into_iter()
            .find(|s| s.labels.iter().any(|(k, v)| k == "side" && v == "rx"))
            .and_then(|s| {
                s.labels
                    .iter()
                    .find(|(k, _)| k == "path")
                    .map(|x| x.1.clone())
            })
            .unwrap()
    };
    // No capability, the host's locked-memory limit: zcrx is given up (named), the rings
    // stay (bufring receive, io_uring sends).
    let p = rx_path(
        None,
        "127.0.0.1:8410",
        "missing CAP_NET_ADMIN",
        "falls back from zcrx to bufring",
    );
    assert_eq!(p, "bufring");
    // Too little locked memory: the rings are refused, named with the path taken instead.
    let p = rx_path(
        Some(4 << 10),
        "127.0.0.1:8412",
        "RLIMIT_MEMLOCK is 4 KiB",
        "epoll + recv",
    );
    assert_eq!(p, "plain");
    // A port below 1024 needs CAP_NET_BIND_SERVICE: named before anything is bound.
    let o = proxy(None, "127.0.0.1:80").output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("missing CAP_NET_BIND_SERVICE"), "{err}");
}

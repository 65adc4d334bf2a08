//! The long-running commands as operators run them: `--metrics` scraped while each daemon
//! (`nfq`, `nflog`, `conntrack events`, `proxy`) carries real traffic in a test namespace,
//! every page parsed strictly and checked by `promtool check metrics`, its counters matched
//! against the traffic and its path label the io_uring one.

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

    /// SIGTERM, then the exit status and the stderr text.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let st = self.child.wait().unwrap();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        (st, self.stderr())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
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

#[test]
fn nfq_metrics_count_the_verdicts_and_name_the_io_uring_path() {
    let test = "nfq_metrics_count_the_verdicts_and_name_the_io_uring_path";
    if !zcio_testnet::can_make_hosts(test) {
        return;
    }
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
        return;
    }
    let mut c = ns.command(bin());
    c.args(["nfq", "--queue", "42", "--drop-udp-port", "5001"])
        .args(["--stats-interval", "0", "--metrics", "127.0.0.1:0"]);
    let mut d = Daemon::spawn(c);
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
    assert_eq!(kept, 100);
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
    assert_eq!(v(&m, "zcio_report_ops_total", &q), 200.0);
    let k = [("queue", "42")];
    assert_eq!(v(&m, "zcio_nfq_kernel_queue_dropped_total", &k), 0.0);
    assert_eq!(v(&m, "zcio_nfq_kernel_user_dropped_total", &k), 0.0);
    let (st, err) = d.stop();
    assert!(st.success(), "{err}");
}

#[test]
fn nflog_metrics_count_the_packets_and_the_losses_per_group() {
    let test = "nflog_metrics_count_the_packets_and_the_losses_per_group";
    if !zcio_testnet::can_make_hosts(test) {
        return;
    }
    let ns = Netns::new("mnfl").unwrap();
    let rule = [
        "-A", "OUTPUT", "-p", "udp", "--dport", "6000", "-j", "NFLOG",
    ];
    if !iptables(test, &ns, &[&rule[..], &["--nflog-group", "9"]].concat()) {
        return;
    }
    let mut c = ns.command(bin());
    c.args(["nflog", "-g", "9", "--stats-interval", "0"])
        .args(["--metrics", "127.0.0.1:0"]);
    let mut d = Daemon::spawn(c);
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
    let (st, err) = d.stop();
    assert!(st.success(), "{err}");
}

#[test]
fn conntrack_metrics_count_the_events_and_the_lost_ones() {
    let test = "conntrack_metrics_count_the_events_and_the_lost_ones";
    if !zcio_testnet::can_make_hosts(test) {
        return;
    }
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
        return;
    }
    let mut c = ns.command(bin());
    c.args([
        "conntrack",
        "events",
        "-e",
        "NEW",
        "--metrics",
        "127.0.0.1:0",
    ]);
    let mut d = Daemon::spawn(c);
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
    let (st, err) = d.stop();
    assert!(st.success(), "{err}");
}

#[test]
fn proxy_metrics_count_the_bytes_and_the_pairs_per_thread() {
    let test = "proxy_metrics_count_the_bytes_and_the_pairs_per_thread";
    if !zcio_testnet::can_make_hosts(test) {
        return;
    }
    let ns = Netns::new("mpx").unwrap();
    let mut c = ns.command(bin());
    c.args([
        "proxy",
        "--listen",
        "127.0.0.1:8400",
        "--to",
        "127.0.0.1:8401",
    ])
    .args(["--stats-interval", "0", "--metrics", "127.0.0.1:0"]);
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
    let mut d = Daemon::spawn(c);
    let addr = d.metrics_addr();
    d.wait_line("thread 0:");
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
    let rx = m
        .samples("zcio_path_info")
        .into_iter()
        .find(|s| s.labels.iter().any(|(k, v)| k == "side" && v == "rx"))
        .and_then(|s| {
            s.labels
                .iter()
                .find(|(k, _)| k == "path")
                .map(|x| x.1.clone())
        })
        .unwrap();
    assert!(
        rx.starts_with("bufring") || rx.starts_with("zcrx"),
        "rx path {rx}"
    );
    assert_eq!(m.kind("zcio_proxy_hold_seconds"), Some("histogram"));
    assert!(v(&m, "zcio_proxy_hold_seconds_count", &t) >= 1.0);
    let (st, err) = d.stop();
    assert!(st.success(), "{err}");
}

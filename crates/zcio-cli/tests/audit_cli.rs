//! `zcio audit` as the audit daemon: a storm of `openat` calls of a watched file, written in
//! auditd's format, is read back by `ausearch -if` (every event, each with its records) and
//! `aureport -if`; JSON lines parse; the kernel's audit status is printed at start, the loss
//! summary at exit, and the host's audit state is as before.

#[path = "common/prom.rs"]
mod prom;

use std::process::{Command, Stdio};
use std::time::Duration;
use zcio::netlink::audit_status;
use zcio_testnet::audit::AuditHost;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_zcio")
}

fn storm(file: &std::path::Path, n: usize) {
    assert!(zcio_testnet::audit::storm(file, n)
        .wait()
        .unwrap()
        .success());
}

/// Starts `zcio audit` with `args`, waits until it is the registered daemon.
fn start(args: &[&str]) -> std::process::Child {
    let mut child = Command::new(bin())
        .arg("audit")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for _ in 0..500 {
        if audit_status().is_ok_and(|s| s.pid == child.id()) {
            return child;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    panic!(
        "zcio audit did not register: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn auditd_format_output_is_read_back_by_ausearch_and_aureport() {
    let t = "auditd_format_output_is_read_back_by_ausearch_and_aureport";
    let Some(mut host) = AuditHost::take(t, false) else {
        return;
    };
    let before = audit_status().unwrap();
    let (file, key) = host.watch("cli");
    let log = host.dir().join("zcio.log");
    const N: usize = 400;
    let child = start(&[
        "--format",
        "auditd",
        "-w",
        log.to_str().unwrap(),
        "-c",
        "401",
    ]);
    storm(&file, N);
    // The count: N opens and the sh's own event that closes it off.
    storm(&file, 1);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("kernel audit status at start: enabled"),
        "{err}"
    );
    assert!(err.contains("no loss"), "{err}");
    let o = Command::new("ausearch")
        .arg("-if")
        .arg(&log)
        .args(["--raw", "-k", &key])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8(o.stdout).unwrap();
    let syscalls = text
        .lines()
        .filter(|l| l.starts_with("type=SYSCALL "))
        .count();
    assert_eq!(syscalls, N + 1, "ausearch finds every event");
    for ty in ["PATH", "CWD", "PROCTITLE"] {
        let n = text
            .lines()
            .filter(|l| l.starts_with(&format!("type={ty} ")))
            .count();
        assert_eq!(n, N + 1, "{ty} records");
    }
    let o = Command::new("aureport")
        .arg("-if")
        .arg(&log)
        .args(["--summary", "-k"])
        .output()
        .unwrap();
    let rep = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{rep}");
    assert!(
        rep.contains(&format!("{}  {key}", N + 1)),
        "aureport: {rep}"
    );
    // JSON lines.
    let child = start(&["-c", "3"]);
    storm(&file, 3);
    let out = child.wait_with_output().unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    for v in &lines {
        assert_eq!(v["end"], "eoe");
        assert_eq!(v["records"][0]["name"], "SYSCALL");
        assert_eq!(v["records"][0]["fields"]["key"], key.as_str());
    }
    let after = audit_status().unwrap();
    assert_eq!((after.pid, after.enabled), (0, before.enabled));
}

/// `zcio audit --metrics` as `zcio-audit.service` runs it (its ExecStart's options): the page
/// (parsed strictly and by promtool) counts a storm's events, no loss, the io_uring path.
#[test]
fn audit_metrics_count_a_storms_events_and_no_loss() {
    use std::io::BufRead;
    let t = "audit_metrics_count_a_storms_events_and_no_loss";
    let Some(mut host) = AuditHost::take(t, false) else {
        return;
    };
    let (file, _key) = host.watch("metrics");
    let log = host.dir().join("audit.log");
    let mut child = start(&[
        "--format",
        "auditd",
        "-w",
        log.to_str().unwrap(),
        "-C",
        "8M",
        "--stats-interval",
        "60",
        "--metrics",
        "127.0.0.1:0",
    ]);
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr: std::net::SocketAddr = loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "no metrics address");
        if let Some(a) = line.trim().split("http://").nth(1) {
            break a.strip_suffix("/metrics").unwrap().parse().unwrap();
        }
    };
    let drain = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        rest
    });
    const N: usize = 300;
    storm(&file, N);
    let v = |m: &prom::Metrics, n: &str| m.value(n, &[]).unwrap_or(-1.0);
    let end = std::time::Instant::now() + Duration::from_secs(20);
    let (m, text) = loop {
        let text = prom::scrape(addr).unwrap();
        let m = prom::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        if v(&m, "zcio_audit_shown_total") >= N as f64 || std::time::Instant::now() > end {
            break (m, text);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !prom::promtool_check(&text).unwrap_or_else(|e| panic!("{e}\n{text}")) {
        zcio_testnet::skip(
            t,
            "promtool not installed (scripts/deps); the strict parser alone checked the page",
        );
    }
    assert!(v(&m, "zcio_audit_shown_total") >= N as f64, "{text}");
    assert!(v(&m, "zcio_audit_events_total") >= N as f64, "{text}");
    assert!(
        v(&m, "zcio_audit_records_total") >= 3.0 * N as f64,
        "{text}"
    );
    assert_eq!(v(&m, "zcio_audit_incomplete_total"), 0.0, "{text}");
    assert_eq!(v(&m, "zcio_audit_lost_at_least_total"), 0.0, "{text}");
    assert_eq!(
        m.value("zcio_path_info", &[("path", "frame-ring+io_uring")]),
        Some(1.0),
        "{text}"
    );
    assert!(m.samples("zcio_fallbacks").is_empty(), "{text}");
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    assert!(child.wait().unwrap().success());
    let rest = drain.join().unwrap();
    assert!(rest.contains("no loss"), "{rest}");
    assert_eq!(audit_status().unwrap().pid, 0, "unregistered at exit");
}

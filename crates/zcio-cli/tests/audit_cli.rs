//! `zcio audit` as the audit daemon: a storm of `openat` calls of a watched file, written in
//! auditd's format, is read back by `ausearch -if` (every event, each with its records) and
//! `aureport -if`; JSON lines parse; the kernel's audit status is printed at start, the loss
//! summary at exit, and the host's audit state is as before.

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

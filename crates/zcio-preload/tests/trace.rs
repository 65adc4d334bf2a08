//! The epoll trace program (tests/c/epoll_trace.c) prints the identical trace natively and
//! under `LD_PRELOAD=libzcio_epoll.so`.

mod common;

use common::{shim_path, tool, Preload, TempDir};
use std::process::Command;

fn build_trace(dir: &TempDir) -> Option<std::path::PathBuf> {
    let cc = tool("epoll_trace", "cc")?;
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/epoll_trace.c");
    let exe = dir.path().join("epoll_trace");
    let st = Command::new(cc)
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(src)
        .arg("-lpthread")
        .status()
        .expect("run cc");
    assert!(st.success(), "compiling epoll_trace.c failed");
    Some(exe)
}

fn run(exe: &std::path::Path, pre: &Preload) -> (String, String) {
    let mut cmd = Command::new(exe);
    pre.apply(&mut cmd);
    let out = cmd.output().expect("run epoll_trace");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "epoll_trace failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

#[test]
fn trace_is_identical_with_and_without_the_shim() {
    let dir = TempDir::new("trace");
    let Some(exe) = build_trace(&dir) else { return };
    let (native, _) = run(&exe, &Preload::default());
    assert!(
        native.ends_with("done\n"),
        "native trace incomplete:\n{native}"
    );
    let stats = dir.path().join("stats");
    let pre = Preload {
        shim: Some(shim_path()),
        stats: Some(stats.clone()),
        log: true,
    };
    let (shimmed, log) = run(&exe, &pre);
    let diff: Vec<String> = native
        .lines()
        .zip(shimmed.lines())
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("  native: {a}\n  shim:   {b}"))
        .collect();
    assert!(
        diff.is_empty() && native.lines().count() == shimmed.lines().count(),
        "traces differ:\n{}\nshim log:\n{log}",
        diff.join("\n")
    );
    // The shim really served the scenarios from the ring (and fell back where it must).
    assert!(log.contains("served by the event ring"), "shim log:\n{log}");
    assert!(
        common::stats_sum(&stats, "ring_waits") > 20,
        "{:?}",
        std::fs::read_to_string(&stats)
    );
    assert!(
        log.contains("nested in another epoll set") || log.contains("duplicated"),
        "{log}"
    );
}

#[test]
fn trace_is_identical_when_io_uring_is_unavailable() {
    let dir = TempDir::new("trace-nouring");
    let Some(exe) = build_trace(&dir) else { return };
    let (native, _) = run(&exe, &Preload::default());
    let pre = Preload {
        shim: Some(shim_path()),
        stats: None,
        log: true,
    };
    // io_uring_setup fails with ENOSYS in a thread made for it, and in the program it spawns
    // (seccomp filters are inherited): every instance must fall back to the real epoll.
    let (shimmed, log) = std::thread::spawn(move || {
        zcio_testnet::seccomp::deny_syscall_in_this_thread(libc::SYS_io_uring_setup, libc::ENOSYS)
            .expect("install seccomp filter");
        run(&exe, &pre)
    })
    .join()
    .expect("trace thread");
    assert_eq!(native, shimmed, "traces differ; shim log:\n{log}");
    assert!(log.contains("event ring unavailable"), "shim log:\n{log}");
    assert!(
        !log.contains("served by the event ring"),
        "shim log:\n{log}"
    );
}

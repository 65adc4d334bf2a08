//! Programs that manage their own descriptors (close everything they did not open, `dup2`
//! onto fixed numbers, close through `close_range`/`closefrom`/`fclose`/`dup2`), fork while
//! another thread waits, close from a signal handler during a wait storm, and make calls that
//! fail in libc: `tests/c/epoll_fds.c` prints the same lines natively and under the shim, with
//! and without io_uring (seccomp), and the shim serves it from the ring without falling back.

mod common;

use common::{assert_same_output, run_program, shim_path, Preload, TempDir};
use std::path::{Path, PathBuf};

fn build(dir: &TempDir) -> Option<PathBuf> {
    common::compile_c(dir, "epoll_fds")
}

fn run(exe: &Path, args: &[&str], pre: &Preload) -> (String, String) {
    run_program(exe, pre, args, &[])
}

fn run_env(exe: &Path, args: &[&str], pre: &Preload, env: &[(&str, &str)]) -> (String, String) {
    run_program(exe, pre, args, env)
}

fn shim(stats: Option<PathBuf>) -> Preload {
    Preload {
        shim: Some(shim_path()),
        stats,
        log: true,
    }
}

#[test]
fn descriptor_management_fork_and_signals_behave_as_without_the_shim() {
    let dir = TempDir::new("fds");
    let Some(exe) = build(&dir) else { return };
    let (native, _) = run(&exe, &[], &Preload::default());
    assert!(
        native.ends_with("done\n"),
        "native run incomplete:\n{native}"
    );
    // The scenarios' own expectations hold natively (the program is a faithful model).
    for want in [
        "fork-while-waiting/child: wait, dup, poll, close ok",
        "fork-while-waiting/parent: event 42",
        "close-unknown/new-pipe-untouched: yes",
        "failing/still-registered: n=1 5",
        "vfork/parent-still-registered: n=1 11",
        "vfork-wait/child: exit 0",
        "vfork-wait/parent-after: n=1 12",
        "vfork-wait/parent-new-event: n=1 12",
        "thread-close/peer sees close: yes",
        "signal-close: 24 closed by the handler, 24 peers saw the close",
    ] {
        assert!(native.contains(want), "native lacks {want:?}:\n{native}");
    }
    for path in [
        "close",
        "close_range",
        "close_range-unshare",
        "closefrom",
        "fclose",
    ] {
        assert!(
            native.contains(&format!("close-path/{path}: r=0 peer sees close: yes")),
            "{native}"
        );
    }
    // The default (EPOLL_WAIT over the program's own epoll fd): the interest list and every
    // close are the kernel's, nothing to convert or defer.
    let (shimmed, log) = run(&exe, &[], &shim(None));
    assert_same_output(&native, &shimmed, &log);
    assert!(
        log.contains("served by the event ring (io_uring_epoll_wait)"),
        "{log}"
    );
    assert!(!log.contains("falling back"), "{log}");
    // The poll ring (the shim keeps the interest list): the descriptor machinery below.
    let stats = dir.path().join("stats");
    let (shimmed, log) = run_env(
        &exe,
        &[],
        &shim(Some(stats.clone())),
        &[("ZCIO_EPOLL_BACKEND", "poll")],
    );
    assert_same_output(&native, &shimmed, &log);
    assert!(log.contains("served by the event ring"), "shim log:\n{log}");
    // The only fallbacks are the forked child's own (its ring is the parent's), the vfork
    // child's that waits (the ring refuses it, EEXIST; it shares the parent's memory, so the
    // parent's instance is the real epoll afterwards, with its interest list replayed), and
    // the parent's when the child's replay into the epoll they share becomes ready before the
    // parent's next wait (the ring's watch on the epoll fd: a registration made behind its
    // back; from then on both use the one interest list, as natively).
    for line in log.lines().filter(|l| l.contains("falling back")) {
        assert!(
            line.contains("forked child")
                || line.contains("ring failed: File exists")
                || line.contains("registration made behind the shim's back became ready"),
            "unexpected fallback: {line}\n{log}"
        );
    }
    // The child of a fork taken while another thread sat in a ring wait got the interest list.
    assert!(log.contains("forked during a wait"), "{log}");
    assert!(!log.contains("registrations lost"), "{log}");
    let text = std::fs::read_to_string(&stats).unwrap_or_default();
    assert!(common::stats_sum(&stats, "ring_waits") > 10, "{text}");
    // The signal handler's closes took the deferred (lock-free) path, and the close-unknown
    // loop met the shim's own descriptors and was refused.
    assert!(common::stats_sum(&stats, "deferred_closes") > 0, "{text}");
    assert!(common::stats_sum(&stats, "refused") > 0, "{text}");
}

#[test]
fn descriptor_management_behaves_the_same_when_io_uring_is_unavailable() {
    let dir = TempDir::new("fds-nouring");
    let Some(exe) = build(&dir) else { return };
    let (native, _) = run(&exe, &[], &Preload::default());
    let pre = shim(None);
    let (shimmed, log) = std::thread::spawn(move || {
        zcio_testnet::seccomp::deny_syscall_in_this_thread(libc::SYS_io_uring_setup, libc::ENOSYS)
            .expect("install seccomp filter");
        run(&exe, &[], &pre)
    })
    .join()
    .expect("run thread");
    assert_same_output(&native, &shimmed, &log);
    assert!(log.contains("event ring unavailable"), "shim log:\n{log}");
}

#[test]
fn the_shims_own_descriptors_sit_high_close_on_exec_and_refuse_the_program() {
    let dir = TempDir::new("fds-probe");
    let Some(exe) = build(&dir) else { return };
    let (native, _) = run(&exe, &["probe"], &Preload::default());
    let stats = dir.path().join("stats");
    let (shimmed, log) = run(&exe, &["probe"], &shim(Some(stats.clone())));
    let limit: u64 = shimmed
        .lines()
        .find_map(|l| l.strip_prefix("probe: limit "))
        .and_then(|l| l.split(',').next())
        .and_then(|v| v.parse().ok())
        .expect("limit line");
    let foreign = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.starts_with("probe: fd "))
            .map(str::to_string)
            .collect()
    };
    let native_fds = foreign(&native);
    let mine: Vec<String> = foreign(&shimmed)
        .into_iter()
        .filter(|l| !native_fds.contains(l))
        .collect();
    // An event ring: its io_uring fd and its wake-up eventfd.
    assert!(mine.len() >= 2, "shim fds not found:\n{shimmed}\n{log}");
    let floor = limit.min(1 << 16) - 256;
    for l in &mine {
        let fd: u64 = l["probe: fd ".len()..]
            .split(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("fd");
        assert!(fd >= floor, "shim fd {fd} below {floor}: {l}");
        assert!(
            l.ends_with("cloexec=1 dup=-1/9 fcntl=-1/9 dup2-onto=-1/9 close=-1/9")
                || l.contains("cloexec=1 dup=-1/9 fcntl=-1/9 dup2-onto=-1/9 close=-1/9"),
            "not refused: {l}"
        );
    }
    assert!(
        shimmed.contains("probe/wait: n=1 1"),
        "ring stopped serving:\n{shimmed}\n{log}"
    );
    assert!(!log.contains("falling back"), "{log}");
    assert!(
        common::stats_sum(&stats, "refused") >= 8,
        "{:?}",
        std::fs::read_to_string(&stats)
    );
}

//! The epoll trace program (tests/c/epoll_trace.c) prints the identical trace natively and
//! under `LD_PRELOAD=libzcio_epoll.so`.

mod common;

use common::{assert_same_output, run_program, shim_path, Preload, TempDir};

fn build_trace(dir: &TempDir) -> Option<std::path::PathBuf> {
    common::compile_c(dir, "epoll_trace")
}

fn run(exe: &std::path::Path, pre: &Preload) -> (String, String) {
    run_with(exe, pre, &[], &[])
}

/// Runs the trace program with arguments and extra environment.
fn run_with(
    exe: &std::path::Path,
    pre: &Preload,
    args: &[&str],
    env: &[(&str, &str)],
) -> (String, String) {
    run_program(exe, pre, args, env)
}

/// The trace under the shim with `env`; returns the shim's log and its stats file.
fn shim_run(
    dir: &TempDir,
    exe: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (String, String, std::path::PathBuf) {
    let stats = dir.path().join(format!("stats{}", env.len() + args.len()));
    let pre = Preload {
        shim: Some(shim_path()),
        stats: Some(stats.clone()),
        log: true,
    };
    let (shimmed, log) = run_with(exe, &pre, args, env);
    (shimmed, log, stats)
}

/// The shim's two modes and the environment that selects each: kernel mode (`EPOLL_WAIT` over
/// the program's epoll fd, the default on 6.15+) and the poll ring.
const BACKENDS: [(&str, &[(&str, &str)]); 2] = [
    ("epoll_wait", &[]),
    ("poll", &[("ZCIO_EPOLL_BACKEND", "poll")]),
];

#[test]
fn trace_is_identical_with_and_without_the_shim() {
    // The default: EPOLL_WAIT over the program's own epoll fd (Linux 6.15).
    let dir = TempDir::new("trace");
    let Some(exe) = build_trace(&dir) else { return };
    let (native, _) = run(&exe, &Preload::default());
    assert!(
        native.ends_with("done\n"),
        "native trace incomplete:\n{native}"
    );
    let (shimmed, log, stats) = shim_run(&dir, &exe, &[], &[]);
    assert_same_output(&native, &shimmed, &log);
    assert!(
        log.contains("served by the event ring (io_uring_epoll_wait)"),
        "shim log:\n{log}"
    );
    // The interest list is the kernel's: nesting, dup, poll, other threads and forked
    // children need no fallback.
    assert!(!log.contains("falling back"), "shim log:\n{log}");
    assert!(
        common::stats_sum(&stats, "ring_waits") > 20,
        "{:?}",
        std::fs::read_to_string(&stats)
    );
}

#[test]
fn closes_behind_the_shims_back_behave_as_without_it() {
    // A raw close system call (libuv's) that no interposer sees, and exec with close-on-exec:
    // with the interest list in the program's own epoll, the kernel drops the registration
    // with the file.
    let dir = TempDir::new("trace-behind");
    let Some(exe) = build_trace(&dir) else { return };
    let (native, _) = run_with(&exe, &Preload::default(), &["behind"], &[]);
    assert!(
        native.contains("connect-after-raw-close: refused"),
        "{native}"
    );
    let (shimmed, log, stats) = shim_run(&dir, &exe, &["behind"], &[]);
    assert_same_output(&native, &shimmed, &log);
    assert!(common::stats_sum(&stats, "ring_waits") >= 3, "{log}");
}

#[test]
fn an_epoll_fd_closed_behind_the_shims_back_leaves_nothing_to_its_number() {
    // libuv closes its epoll fd with a raw close system call; the number comes back for an
    // eventfd (added to another epoll set) and for a new epoll fd that gets no ring (io_uring
    // refused, as when many loops exist at once). Unless the stale instance is retired, on the
    // poll ring the new epoll fd is taken for the old instance: its add fails EEXIST and its
    // wait reports the old loop's registration.
    let dir = TempDir::new("trace-raw-epoll-close");
    let Some(exe) = build_trace(&dir) else { return };
    let (native, _) = run_with(&exe, &Preload::default(), &["raw-epoll-close"], &[]);
    assert!(
        native.contains("new-epoll-got-the-number: yes") && native.ends_with("done\n"),
        "{native}"
    );
    for (backend, env) in BACKENDS {
        let (shimmed, log, _) = shim_run(&dir, &exe, &["raw-epoll-close"], env);
        assert_same_output(&native, &shimmed, &log);
        assert!(
            log.contains("closed behind the shim's back"),
            "{backend}: the stale instance was not detected:\n{log}"
        );
    }
}

#[test]
fn registrations_made_through_io_uring_are_reported_as_without_the_shim() {
    // libuv (>= 1.45) sends every epoll_ctl through an io_uring of its own
    // (IORING_OP_EPOLL_CTL), which no interposer sees. Kernel mode: they land in the
    // program's own epoll, which the ring collects. Poll ring (kernels before 6.15): the ring
    // watches the program's epoll fd, which holds nothing of the shim's, and converts the
    // instance when it becomes readable (before the watch, such registrations were never
    // reported and libuv's loops hung).
    let dir = TempDir::new("trace-uring-ctl");
    let Some(exe) = build_trace(&dir) else { return };
    let (native, _) = run_with(&exe, &Preload::default(), &["uring-ctl"], &[]);
    assert!(
        native.contains("io_uring-registered-ready: n=1 1:IN") && native.ends_with("done\n"),
        "{native}"
    );
    for (backend, env) in BACKENDS {
        let (shimmed, log, _) = shim_run(&dir, &exe, &["uring-ctl"], env);
        assert_same_output(&native, &shimmed, &log);
        if backend == "poll" {
            assert!(
                log.contains("registration made behind the shim's back became ready"),
                "poll ring: the behind-the-back registration was not detected:\n{log}"
            );
        } else {
            assert!(!log.contains("falling back"), "{log}");
        }
    }
}

#[test]
fn a_ring_short_of_memory_leaves_the_instance_on_the_real_epoll() {
    // io_uring_setup fails with ENOMEM for small rings (the shim's EPOLL_WAIT ring), as when
    // ring memory (RLIMIT_MEMLOCK, freed asynchronously after a ring goes) is short. The poll
    // ring, which could still be made, keeps the interest list to itself: an instance put
    // there lost libuv's io_uring registrations (tty_pty_partial hung under load). A lack of
    // resources now means the real epoll.
    let dir = TempDir::new("trace-short-memory");
    let Some(exe) = build_trace(&dir) else { return };
    let (native, _) = run_with(&exe, &Preload::default(), &["uring-ctl-short-memory"], &[]);
    let (shimmed, log, stats) = shim_run(&dir, &exe, &["uring-ctl-short-memory"], &[]);
    assert_same_output(&native, &shimmed, &log);
    assert!(
        log.contains("Cannot allocate memory") && log.contains("using the real epoll"),
        "{log}"
    );
    assert!(
        !log.contains("served by the event ring (io_uring)"),
        "{log}"
    );
    assert_eq!(common::stats_sum(&stats, "ring_instances"), 0, "{log}");
}

#[test]
fn many_loops_of_an_unprivileged_user_each_get_an_epoll_wait_ring() {
    // Ring memory counts against RLIMIT_MEMLOCK (8 MiB) for an unprivileged user. The
    // EPOLL_WAIT ring holds one request: sized for it (2 pages), 100 loops at once all get
    // one; sized like the poll ring (81 pages) only 24 did. Run as a uid of its own, whose
    // locked-memory count no other test shares.
    let test = "many_loops_of_an_unprivileged_user_each_get_an_epoll_wait_ring";
    if !zcio_testnet::is_root() {
        zcio_testnet::skip(test, "needs root to run the program as another user");
        return;
    }
    let Some(setpriv) = common::tool(test, "setpriv") else {
        return;
    };
    let dir = TempDir::new("trace-many-loops");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let Some(exe) = build_trace(&dir) else { return };
    let stats = dir.path().join("stats");
    let pre = Preload {
        shim: Some(shim_path()),
        stats: Some(stats.clone()),
        log: true,
    };
    let mut cmd = std::process::Command::new(setpriv);
    cmd.args(["--reuid=64999", "--regid=64999", "--clear-groups"])
        .arg(&exe)
        .args(["many-loops", "100"]);
    pre.apply(&mut cmd);
    let out = cmd.output().expect("run setpriv");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{log}");
    assert!(
        stdout.contains("100-loops-each-saw-its-event: 100"),
        "{stdout}\n{log}"
    );
    if log.contains("no EPOLL_WAIT ring") {
        zcio_testnet::skip_kernel_feature(
            test,
            "ZCIO_REQUIRE_EPOLL_WAIT",
            "the kernel lacks IORING_OP_EPOLL_WAIT (Linux 6.15)",
        );
        return;
    }
    let text = std::fs::read_to_string(&stats).unwrap_or_default();
    assert_eq!(
        common::stats_sum(&stats, "ring_instances"),
        100,
        "{text}\n{log}"
    );
    assert_eq!(common::stats_sum(&stats, "fallbacks"), 0, "{text}\n{log}");
}

#[test]
fn trace_is_identical_on_the_poll_ring() {
    // ZCIO_EPOLL_BACKEND=poll: one POLL_ADD per fd, the interest list kept by the shim.
    let dir = TempDir::new("trace-poll");
    let Some(exe) = build_trace(&dir) else { return };
    let (native, _) = run(&exe, &Preload::default());
    let (shimmed, log, stats) = shim_run(&dir, &exe, &[], &[("ZCIO_EPOLL_BACKEND", "poll")]);
    assert_same_output(&native, &shimmed, &log);
    // The shim really served the scenarios from the ring (and fell back where it must).
    assert!(
        log.contains("served by the event ring (io_uring)"),
        "shim log:\n{log}"
    );
    assert!(
        common::stats_sum(&stats, "ring_waits") > 20,
        "{:?}",
        std::fs::read_to_string(&stats)
    );
    // The fork/dup/nest section converts its instance: for the nesting or the dup, or first
    // because the forked child's replay into the epoll it shares with the parent is, for the
    // parent's ring, a registration made behind its back.
    assert!(
        log.contains("nested in another epoll set")
            || log.contains("duplicated")
            || log.contains("registration made behind the shim's back became ready"),
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

#[test]
fn trace_is_identical_across_ring_and_epoll_wait_switches() {
    // The per-workload choice's two modes on the program's own epoll fd: always epoll_wait,
    // and a switch at every wait (each wait reaps what the other mode left armed).
    let dir = TempDir::new("trace-modes");
    let Some(exe) = build_trace(&dir) else { return };
    let (native, _) = run(&exe, &Preload::default());
    for mode in ["plain", "alternate"] {
        let (shimmed, log, stats) = shim_run(&dir, &exe, &[], &[("ZCIO_EPOLL_WAIT_MODE", mode)]);
        assert_same_output(&native, &shimmed, &log);
        assert!(
            log.contains("served by the event ring (io_uring_epoll_wait)"),
            "{mode}: shim log:\n{log}"
        );
        assert!(
            common::stats_sum(&stats, "ring_waits") > 20,
            "{mode}: {:?}",
            std::fs::read_to_string(&stats)
        );
        let switches = common::stats_sum(&stats, "mode_switches");
        if mode == "alternate" {
            assert!(switches > 20, "{:?}", std::fs::read_to_string(&stats));
        } else {
            assert_eq!(switches, 0, "{:?}", std::fs::read_to_string(&stats));
        }
    }
}

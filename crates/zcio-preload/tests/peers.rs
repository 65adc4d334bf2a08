//! Other projects' event-loop test suites under the shim: CPython's own epoll,
//! selectors and asyncio tests, from Debian's Python 3.11 and `libpython3.11-testsuite`,
//! run natively and under `LD_PRELOAD=libzcio_epoll.so` (and with io_uring denied by
//! seccomp, the fallback path). Every test that passes natively must pass under the shim.
//!
//! CI runs a bounded selection ([`CPYTHON_CI`], about a minute per side on 2 cores);
//! `ZCIO_PEER_SUITES=full` runs all of `test_asyncio` instead (`scripts/peer-suites`).
//!
//! libuv's own test runner (all 527 tests, about a minute per side), built by
//! `scripts/libuv-tests` from the libuv source tree the crates.io crate `libuv-sys2` vendors,
//! natively and under the shim; with io_uring denied, [`LIBUV_NO_URING_CI`] in CI and all
//! tests with `ZCIO_PEER_SUITES=full`; on the poll ring (`ZCIO_EPOLL_BACKEND=poll`, the mode
//! of kernels before 6.15), the tests named by [`LIBUV_IO_URING_OFF_CI`] in CI and all of
//! them with `ZCIO_PEER_SUITES=full`.
//!
//! The same runner built with libuv's io_uring path off (`scripts/libuv-tests build
//! --no-uring`: every `epoll_ctl` through the C library, where the shim sees it): in CI the
//! tests named by [`LIBUV_IO_URING_OFF_CI`] under the default (kernel-mode) shim; with
//! `ZCIO_PEER_SUITES=full` all of them, and all of them again on the poll ring
//! (`ZCIO_EPOLL_BACKEND=poll`).
//! A test that differs is re-run alone on both sides once (timing-sensitive asyncio tests on
//! a loaded machine); it counts as a difference only if it passes natively and fails under
//! the shim again.

mod common;

use common::{shim_path, TempDir};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const PYTHON: &str = "/usr/bin/python3.11";
const TESTSUITE: &str = "/usr/lib/python3.11/test/test_asyncio/test_events.py";

/// The CI selection: every epoll and selectors test, and the asyncio modules that exercise
/// the event loop's descriptors (connections, servers, sockets, streams, subprocesses).
const CPYTHON_CI: &[&str] = &[
    "test_epoll",
    "test_selectors",
    "test_asyncio.test_events",
    "test_asyncio.test_server",
    "test_asyncio.test_sock_lowlevel",
    "test_asyncio.test_streams",
    "test_asyncio.test_selector_events",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Passed,
    Failed,
    Skipped,
}

fn available(test: &str) -> bool {
    let ok = Path::new(PYTHON).is_file() && Path::new(TESTSUITE).is_file();
    if !ok {
        let why = "Debian's python3.11 and libpython3.11-testsuite are not installed \
                   (scripts/deps installs them)";
        if std::env::var("ZCIO_REQUIRE_PRIV").as_deref() == Ok("1") {
            panic!("{test}: {why}");
        }
        println!("SKIP {test}: {why}");
    }
    ok
}

/// Parses regrtest's `--junit-xml` output: test id → outcome.
fn parse_junit(xml: &str) -> BTreeMap<String, Outcome> {
    let mut out = BTreeMap::new();
    for chunk in xml.split("<testcase ").skip(1) {
        let Some(name) = chunk
            .split_once("name=\"")
            .and_then(|(_, r)| r.split_once('"'))
            .map(|(n, _)| n.to_string())
        else {
            continue;
        };
        // The chunk runs to the next testcase: children of this one only.
        let body = chunk.split("</testcase>").next().unwrap_or(chunk);
        let o = if body.contains("<failure") || body.contains("<error") {
            Outcome::Failed
        } else if body.contains("<skipped") || chunk.contains("status=\"skipped\"") {
            Outcome::Skipped
        } else if chunk.contains("result=\"completed\"") {
            Outcome::Passed
        } else {
            Outcome::Failed
        };
        out.insert(name, o);
    }
    out
}

/// How a side runs: natively, under the shim, or under the shim with io_uring denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Native,
    Shim,
    ShimNoUring,
}

/// Runs regrtest on `modules` (or with `--match` patterns) and returns the outcomes.
fn cpython(
    dir: &TempDir,
    side: Side,
    modules: &[&str],
    matching: &[String],
) -> BTreeMap<String, Outcome> {
    let xml = dir.path().join(format!(
        "junit-{side:?}-{}.xml",
        matching.len() + modules.len()
    ));
    let mut cmd = Command::new(PYTHON);
    cmd.args(["-m", "test", "-j2", "--timeout", "600", "--junit-xml"])
        .arg(&xml);
    for m in matching {
        cmd.args(["--match", m]);
    }
    cmd.args(modules);
    // regrtest's workers inherit the environment: every Python process is preloaded.
    if side != Side::Native {
        cmd.env("LD_PRELOAD", shim_path());
        cmd.env(
            "ZCIO_EPOLL_STATS",
            dir.path().join(format!("stats-{side:?}")),
        );
    }
    let mut run = move || cmd.output().expect("run python3.11 -m test");
    let out = if side == Side::ShimNoUring {
        std::thread::spawn(move || {
            zcio_testnet::seccomp::deny_syscall_in_this_thread(
                libc::SYS_io_uring_setup,
                libc::ENOSYS,
            )
            .expect("seccomp filter");
            run()
        })
        .join()
        .expect("regrtest thread")
    } else {
        run()
    };
    let text = std::fs::read_to_string(&xml).unwrap_or_default();
    let res = parse_junit(&text);
    assert!(
        !res.is_empty(),
        "regrtest ({side:?}) produced no results:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    res
}

/// The suites share two cores: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn passed(r: &BTreeMap<String, Outcome>) -> usize {
    r.values().filter(|o| **o == Outcome::Passed).count()
}

/// Compares `side` against the native results, prints the comparison and returns the names
/// that pass natively and fail under `side` (after one re-run of each, alone, on both sides).
fn compare(
    dir: &TempDir,
    modules: &[&str],
    native: &BTreeMap<String, Outcome>,
    side: Side,
) -> Vec<String> {
    let shimmed = cpython(dir, side, modules, &[]);
    let suspects: Vec<String> = native
        .iter()
        .filter(|(k, o)| **o == Outcome::Passed && shimmed.get(*k) != Some(&Outcome::Passed))
        .map(|(k, _)| k.clone())
        .collect();
    let mut diffs = Vec::new();
    let mut flaky = Vec::new();
    for name in &suspects {
        let pat = vec![name.clone()];
        let again = cpython(dir, side, modules, &pat);
        let native_again = cpython(dir, Side::Native, modules, &pat);
        if again.get(name) == Some(&Outcome::Passed)
            || native_again.get(name) != Some(&Outcome::Passed)
        {
            flaky.push(name.clone());
        } else {
            diffs.push(name.clone());
        }
    }
    println!(
        "CPython ({}): {} tests; passed natively {}, passed under the shim ({side:?}) {}; \
         passed when re-run alone (or failed natively too): {flaky:?}; differences: {diffs:?}",
        modules.join(" "),
        native.len(),
        passed(native),
        passed(&shimmed),
    );
    diffs
}

#[test]
fn cpython_epoll_selectors_and_asyncio_tests_pass_under_the_shim_as_natively() {
    let test = "cpython_epoll_selectors_and_asyncio_tests_pass_under_the_shim_as_natively";
    if !available(test) {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = TempDir::new("peers");
    let full = std::env::var("ZCIO_PEER_SUITES").as_deref() == Ok("full");
    let modules: Vec<&str> = if full {
        vec!["test_epoll", "test_selectors", "test_asyncio"]
    } else {
        CPYTHON_CI.to_vec()
    };
    let native = cpython(&dir, Side::Native, &modules, &[]);
    let on_ring = compare(&dir, &modules, &native, Side::Shim);
    let stats = dir.path().join("stats-Shim");
    assert!(
        common::stats_sum(&stats, "ring_waits") > 100,
        "the shim served (almost) no waits from the ring: {:?}",
        std::fs::read_to_string(&stats)
    );
    // The fallback path: io_uring denied by seccomp, every instance on the real epoll.
    let no_uring = compare(&dir, &modules, &native, Side::ShimNoUring);
    assert!(
        on_ring.is_empty() && no_uring.is_empty(),
        "pass natively, fail under the shim: {on_ring:?}; with io_uring denied: {no_uring:?}"
    );
}

/// libuv tests run a second time with io_uring denied in CI: connections, pipes, polls,
/// shutdowns, closes and bind errors.
const LIBUV_NO_URING_CI: &[&str] = &[
    "close_fd",
    "pipe_ping_pong",
    "pipe_ping_pong_vec",
    "poll_close",
    "poll_duplex",
    "poll_multiple_handles",
    "poll_nested_epoll",
    "poll_oob",
    "poll_unidirectional",
    "shutdown_close_tcp",
    "shutdown_eof",
    "tcp_bind_error_addrinuse_connect",
    "tcp_bind_error_addrinuse_listen",
    "tcp_close",
    "tcp_close_accept",
    "tcp_close_reset_accepted",
    "tcp_close_while_connecting",
    "tcp_ping_pong",
    "tcp_ping_pong_vec",
    "tcp_read_stop",
    "tcp_read_stop_start",
    "tcp_shutdown_after_write",
    "tcp_writealot",
    "udp_send_and_recv",
];

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/libuv-tests")
}

/// Runs `scripts/libuv-tests compare` (optionally with io_uring denied for it and every
/// process it starts); returns its last line and whether it found no difference.
fn libuv_compare(no_uring: bool, tests: &[&str]) -> (String, bool) {
    libuv_compare_with(&[], no_uring, "", tests)
}

/// `scripts/libuv-tests compare` with `variant` arguments (`--no-uring`: the io_uring-off
/// build) and `shim_env` for the shimmed side.
fn libuv_compare_with(
    variant: &[&str],
    no_uring: bool,
    shim_env: &str,
    tests: &[&str],
) -> (String, bool) {
    let mut cmd = Command::new(script());
    cmd.arg("compare")
        .args(variant)
        .args(tests)
        .env("SHIM", shim_path())
        .env("SHIM_ENV", shim_env);
    let mut run = move || cmd.output().expect("run scripts/libuv-tests");
    let out = if no_uring {
        std::thread::spawn(move || {
            zcio_testnet::seccomp::deny_syscall_in_this_thread(
                libc::SYS_io_uring_setup,
                libc::ENOSYS,
            )
            .expect("seccomp filter");
            run()
        })
        .join()
        .expect("libuv thread")
    } else {
        run()
    };
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let last = text.lines().last().unwrap_or("").to_string();
    assert!(
        last.starts_with("libuv "),
        "scripts/libuv-tests compare printed no summary:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (last, out.status.success())
}

/// Builds libuv's runner (`variant`: `[]` stock, `["--no-uring"]` io_uring path off); false
/// (after printing the skip) when the tools or the source are missing outside CI.
fn libuv_build(test: &str, variant: &[&str]) -> bool {
    // strace: the io_uring-off build proves with it that its runner sets up no ring.
    let strace: &[&str] = if variant.is_empty() { &[] } else { &["strace"] };
    let mut missing = ["cmake", "make", "cc", "setpriv", "python3"]
        .iter()
        .chain(strace)
        .filter(|t| common::tool(test, t).is_none());
    if missing.next().is_some() {
        return false;
    }
    let build = Command::new(script())
        .arg("build")
        .args(variant)
        .output()
        .expect("run scripts/libuv-tests build");
    if !build.status.success() {
        // No source (crates.io unreachable) or no compiler: a skip, except in CI.
        let why = format!(
            "building libuv's test runner failed:\n{}",
            String::from_utf8_lossy(&build.stderr)
        );
        if std::env::var("ZCIO_REQUIRE_PRIV").as_deref() == Ok("1") {
            panic!("{test}: {why}");
        }
        println!("SKIP {test}: {why}");
        return false;
    }
    true
}

#[test]
fn libuv_tests_pass_under_the_shim_as_natively() {
    let test = "libuv_tests_pass_under_the_shim_as_natively";
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !libuv_build(test, &[]) {
        return;
    }
    let (line, same) = libuv_compare(false, &[]);
    println!("all tests: {line}");
    // The fallback path on the descriptor-handling tests (the ones the issue saw fail under
    // the shim), or all of them with ZCIO_PEER_SUITES=full.
    let full = std::env::var("ZCIO_PEER_SUITES").as_deref() == Ok("full");
    let (line_nu, same_nu) = libuv_compare(true, if full { &[] } else { LIBUV_NO_URING_CI });
    println!("with io_uring denied: {line_nu}");
    // The poll ring (the shim's mode on kernels before 6.15, where stock libuv still sends
    // its registrations through an io_uring of its own): the ring watches the epoll fd and
    // hands the instance to the real epoll when one of them becomes ready (before the watch,
    // libuv's loops hung). The CI selection, or all tests with ZCIO_PEER_SUITES=full.
    let selected = if full {
        Vec::new()
    } else {
        libuv_tests_named(&libuv_dir().join("src"), LIBUV_IO_URING_OFF_CI)
    };
    let tests: Vec<&str> = selected.iter().map(String::as_str).collect();
    let (line_poll, same_poll) = libuv_compare_with(&[], false, "ZCIO_EPOLL_BACKEND=poll", &tests);
    println!("poll ring: {line_poll}");
    assert!(
        same && same_nu && same_poll,
        "libuv tests pass natively and fail under the shim: {line} / io_uring denied: \
         {line_nu} / poll ring: {line_poll}"
    );
}

/// Where scripts/libuv-tests builds (its `ZCIO_LIBUV_DIR` default).
fn libuv_dir() -> std::path::PathBuf {
    std::env::var_os("ZCIO_LIBUV_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/libuv"))
}

/// The CI selection for libuv built with its io_uring path off under the default (kernel-mode)
/// shim, and for stock libuv on the poll ring. io_uring path off:
/// every libuv `epoll_ctl` then reaches the shim through the C library (stock libuv sends them
/// through its own io_uring), closes stay raw `syscall(SYS_close)`. The selection: every test
/// whose name starts with one of these (connections, pipes, polls, closes, shutdowns, bind
/// errors, signals, UDP; 186 tests of libuv 1.53, ≈45 s for both sides on 2 cores).
const LIBUV_IO_URING_OFF_CI: &[&str] = &[
    "tcp_",
    "tcp4_",
    "tcp6_",
    "pipe_",
    "poll_",
    "udp_",
    "signal_",
    "we_get_signal",
    "close",
    "shutdown_",
    "socket_",
    "connection_",
    "getsockname",
    "delayed_accept",
    "multiple_listen",
    "emfile",
    "watcher_cross_stop",
];

/// The runner's test names (`TEST_ENTRY` and `TEST_ENTRY_CUSTOM` in `test/test-list.h` of the
/// built source) that start with one of `prefixes`.
fn libuv_tests_named(src: &Path, prefixes: &[&str]) -> Vec<String> {
    let list = std::fs::read_to_string(src.join("test/test-list.h")).expect("libuv test-list.h");
    let mut names: Vec<String> = list
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l
                .strip_prefix("TEST_ENTRY_CUSTOM")
                .or_else(|| l.strip_prefix("TEST_ENTRY"))?;
            let name = rest
                .trim_start()
                .strip_prefix('(')?
                .split([',', ')'])
                .next()?;
            Some(name.trim().to_string())
        })
        .filter(|n| prefixes.iter().any(|p| n.starts_with(p)))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn libuv_built_without_io_uring_passes_under_the_shim_as_natively() {
    let test = "libuv_built_without_io_uring_passes_under_the_shim_as_natively";
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !libuv_build(test, &["--no-uring"]) {
        return;
    }
    let full = std::env::var("ZCIO_PEER_SUITES").as_deref() == Ok("full");
    // The runner's processes run as nobody: the stats directory must be theirs to write.
    let dir = TempDir::new("peers-libuv");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
        .expect("chmod stats dir");
    let stats = dir.path().join("stats-kernel");
    let selected = if full {
        Vec::new()
    } else {
        let src = libuv_dir().join("src-nouring");
        let names = libuv_tests_named(&src, LIBUV_IO_URING_OFF_CI);
        assert!(names.len() > 100, "libuv's test list: only {names:?}");
        names
    };
    let tests: Vec<&str> = selected.iter().map(String::as_str).collect();
    let (line, same) = libuv_compare_with(
        &["--no-uring"],
        false,
        &format!("ZCIO_EPOLL_STATS={}", stats.display()),
        &tests,
    );
    println!("io_uring path off, kernel mode: {line}");
    let served = common::stats_sum(&stats, "ring_waits");
    assert!(
        served > 100,
        "the shim served (almost) no libuv waits from the ring ({served}): {:?}",
        std::fs::read_to_string(&stats)
    );
    let mut lines = vec![line];
    let mut all_same = same;
    if full {
        // The poll ring: the shim keeps the interest list itself, so it sees every epoll_ctl.
        let stats = dir.path().join("stats-poll");
        let (line, same) = libuv_compare_with(
            &["--no-uring"],
            false,
            &format!(
                "ZCIO_EPOLL_BACKEND=poll ZCIO_EPOLL_STATS={}",
                stats.display()
            ),
            &[],
        );
        println!("io_uring path off, poll ring: {line}");
        lines.push(line);
        all_same &= same;
    }
    assert!(
        all_same,
        "libuv (io_uring path off) tests pass natively and fail under the shim: {lines:?}"
    );
}

#[test]
fn junit_results_are_parsed_per_test() {
    let xml = r#"<testsuites><testsuite><testcase name="a.B.test_ok" status="run" result="completed" time="0.1" /><testcase name="a.B.test_bad" status="run" result="completed" time="0.1"><failure type="AssertionError">x</failure></testcase><testcase name="a.B.test_err" status="run" result="completed"><error>y</error></testcase><testcase name="a.B.test_skip" status="run" result="completed"><skipped>z</skipped></testcase></testsuite></testsuites>"#;
    let r = parse_junit(xml);
    assert_eq!(r["a.B.test_ok"], Outcome::Passed);
    assert_eq!(r["a.B.test_bad"], Outcome::Failed);
    assert_eq!(r["a.B.test_err"], Outcome::Failed);
    assert_eq!(r["a.B.test_skip"], Outcome::Skipped);
    assert_eq!(r.len(), 4);
}

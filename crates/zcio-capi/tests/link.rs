//! Installs libzcio with `scripts/install-capi` into a temp prefix, then compiles the C
//! example and a C++ program against the INSTALLED header and library (pkg-config), links
//! them shared and static, and runs them. Also checks the soname and symbol versions.

use std::path::{Path, PathBuf};
use std::process::Command;

fn tool(name: &str) -> bool {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let why = format!("{name} is not installed (scripts/deps installs it)");
        if std::env::var("ZCIO_REQUIRE_PRIV").as_deref() == Ok("1") {
            panic!("{why}");
        }
        println!("SKIP: {why}");
    }
    ok
}

/// Root with unshare, ip and iptables (as in CI); otherwise SKIP (a failure under
/// ZCIO_REQUIRE_PRIV=1).
fn privileged(what: &str) -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"));
    let why = if !root {
        "needs root (a network namespace and an iptables rule)".to_string()
    } else if let Some(t) = ["unshare", "ip", "iptables"].into_iter().find(|t| !tool(t)) {
        format!("{t} missing")
    } else {
        return true;
    };
    if std::env::var("ZCIO_REQUIRE_PRIV").as_deref() == Ok("1") {
        panic!("{what}: {why}");
    }
    println!("SKIP {what}: {why}");
    false
}

fn zcio_core_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{text}",
        out.status
    );
    text
}

/// Compiles one C example against the installed library (warnings are errors).
fn cc_example(exe: &Path, src: impl AsRef<std::ffi::OsStr>, flags: &[&str], rpath: &str) {
    run(Command::new("cc")
        .args([
            "-std=c11",
            "-D_GNU_SOURCE",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
        ])
        .arg(exe)
        .arg(src.as_ref())
        .args(flags)
        .arg(rpath)
        .arg("-lpthread"));
}

fn built_dir() -> PathBuf {
    // target/<profile>/deps/link-xxxx → target/<profile>, where cargo put libzcio_capi.a.
    let exe = std::env::current_exe().expect("exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

struct Prefix(PathBuf);
impl Drop for Prefix {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn c_and_cpp_programs_link_against_the_installed_library() {
    if !(tool("cc") && tool("c++") && tool("pkg-config") && tool("readelf")) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let prefix = Prefix(std::env::temp_dir().join(format!("zcio-capi-{}", std::process::id())));
    let p = &prefix.0;
    run(Command::new(root.join("scripts/install-capi"))
        .arg(p)
        .env("ZCIO_CAPI_FROM", built_dir()));

    let lib = p.join("lib/libzcio.so.0");
    let dynamic = run(Command::new("readelf").arg("-d").arg(&lib));
    assert!(
        dynamic.contains("Library soname: [libzcio.so.0]"),
        "{dynamic}"
    );
    let syms = run(Command::new("readelf").args(["--dyn-syms", "-W"]).arg(&lib));
    let exported: Vec<&str> = syms
        .lines()
        .filter(|l| l.contains(" GLOBAL ") && !l.contains(" UND "))
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    assert!(!exported.is_empty(), "{syms}");
    // Symbols keep the version they were released with: the send ring and the reports came
    // in ZCIO_0.2, held NFQUEUE packets and the last error in ZCIO_0.3, audit in ZCIO_0.4 (each
    // listed by name in zcio.map); the rest is ZCIO_0.1's glob.
    let map = std::fs::read_to_string(root.join("crates/zcio-capi/zcio.map")).expect("zcio.map");
    let node = |v: &str| -> Vec<String> {
        map.split(&format!("{v} {{"))
            .nth(1)
            .unwrap_or_else(|| panic!("a {v} node"))
            .split('}')
            .next()
            .unwrap_or("")
            .lines()
            .map(|l| l.trim().trim_end_matches(';'))
            .filter(|l| l.starts_with("zcio_"))
            .map(str::to_string)
            .collect()
    };
    let named = [
        ("ZCIO_0.2", node("ZCIO_0.2")),
        ("ZCIO_0.3", node("ZCIO_0.3")),
        ("ZCIO_0.4", node("ZCIO_0.4")),
    ];
    for s in &exported {
        let name = s.split('@').next().unwrap_or(s);
        let want = named
            .iter()
            .find(|(_, names)| names.iter().any(|n| n == name))
            .map_or("ZCIO_0.1", |(v, _)| *v);
        assert!(
            s.starts_with("zcio_") && s.ends_with(&format!("@@{want}"))
                || ["ZCIO_0.1", "ZCIO_0.2", "ZCIO_0.3", "ZCIO_0.4"].contains(s),
            "unexpected export {s} (want {want})"
        );
    }
    for (v, names) in &named {
        for name in names {
            assert!(
                exported.contains(&format!("{name}@@{v}").as_str()),
                "{name} is not exported as {v}"
            );
        }
    }

    let pc = p.join("lib/pkgconfig");
    let flags = run(Command::new("pkg-config")
        .args(["--cflags", "--libs", "zcio"])
        .env("PKG_CONFIG_PATH", &pc));
    let flags: Vec<&str> = flags.split_whitespace().collect();
    let rpath = format!("-Wl,-rpath,{}", p.join("lib").display());
    let example = root.join("crates/zcio-capi/examples/c/event_ring.c");
    let cpp = root.join("crates/zcio-capi/tests/c/link_test.cpp");

    // C, shared.
    let c_exe = p.join("event_ring");
    cc_example(&c_exe, &example, &flags, &rpath);
    let out = run(&mut Command::new(&c_exe));
    assert!(
        out.contains("user event token=99") && out.ends_with("ok\n"),
        "{out}"
    );

    // The sender example (zero-copy send over loopback, every byte checked).
    let tx_exe = p.join("sender");
    cc_example(
        &tx_exe,
        root.join("crates/zcio-capi/examples/c/sender.c"),
        &flags,
        &rpath,
    );
    let out = run(&mut Command::new(&tx_exe));
    assert!(
        out.contains("completions 16") && out.ends_with("ok\n"),
        "{out}"
    );

    // The send ring example: 64 sockets on one ring, -EAGAIN backpressure with the buffer
    // kept, every byte of every connection checked, the report read from C.
    let ring_exe = p.join("send_ring");
    cc_example(
        &ring_exe,
        root.join("crates/zcio-capi/examples/c/send_ring.c"),
        &flags,
        &rpath,
    );
    let out = run(&mut Command::new(&ring_exe));
    assert!(
        out.contains("sockets 64 completions 2048") && out.ends_with("ok\n"),
        "{out}"
    );
    // The pool is registered (the sockets start on fixed buffers); the ring reports the path
    // its sends took, which on loopback becomes uring-copy once the completions come back
    // COPIED (the route's verdict).
    assert!(
        out.contains("socket 0 path uring-zc-fixed")
            && (out.contains("ring: path uring-zc-fixed") || out.contains("ring: path uring-copy")),
        "{out}"
    );
    // The memlock limit reached: the pool registration fails, the fallback is readable from C
    // and every send still completes. Without CAP_IPC_LOCK (dropped from the bounding set when
    // root) under a memlock limit below the pool (4 MiB).
    if tool("prlimit") && tool("setpriv") {
        let mut cmd = Command::new("prlimit");
        cmd.args(["--memlock=1048576:1048576", "--"]);
        if zcio_core_is_root() {
            cmd.args([
                "setpriv",
                "--bounding-set=-ipc_lock",
                "--inh-caps=-ipc_lock",
                "--",
            ]);
        }
        let out = run(cmd.arg(&ring_exe));
        assert!(
            out.contains("pool not registered") && out.contains("RLIMIT_MEMLOCK"),
            "{out}"
        );
        assert!(out.contains("fallback uring-zc-fixed -> uring-zc"), "{out}");
        assert!(
            out.contains("sockets 64 completions 2048") && out.ends_with("ok\n"),
            "{out}"
        );
    }

    // The many-peers example: one unconnected UDP socket, 16 peers, GSO trains with
    // send_to; a refused destination fails its train alone; every datagram checked.
    let to_exe = p.join("send_to");
    cc_example(
        &to_exe,
        root.join("crates/zcio-capi/examples/c/send_to.c"),
        &flags,
        &rpath,
    );
    let out = run(&mut Command::new(&to_exe));
    assert!(
        out.contains("trains 64 completed 64 unreachable 1 datagrams 320") && out.ends_with("ok\n"),
        "{out}"
    );

    // Header + body as one send (vectored), every byte checked, every body back.
    let hdr_exe = p.join("send_hdr");
    cc_example(
        &hdr_exe,
        root.join("crates/zcio-capi/examples/c/send_hdr.c"),
        &flags,
        &rpath,
    );
    let out = run(&mut Command::new(&hdr_exe));
    assert!(
        out.contains("completions 64 bodies back 64 bytes 1064960") && out.ends_with("ok\n"),
        "{out}"
    );

    // The receiver example (accept + receive over loopback, every byte checked).
    let rx_exe = p.join("receiver");
    cc_example(
        &rx_exe,
        root.join("crates/zcio-capi/examples/c/receiver.c"),
        &flags,
        &rpath,
    );
    let out = run(&mut Command::new(&rx_exe));
    assert!(
        out.contains("bytes 1048576") && out.ends_with("ok\n"),
        "{out}"
    );

    // The send ring's API edges (adding sockets that cannot send, closing an unknown or a
    // closed id, the path of a closed socket) and its counters after closes with sends in
    // flight: each closed socket's completions add up to what its peer received.
    let edges_exe = p.join("send_ring_edges");
    cc_example(
        &edges_exe,
        root.join("crates/zcio-capi/tests/c/send_ring_edges.c"),
        &flags,
        &rpath,
    );
    let out = run(&mut Command::new(&edges_exe));
    assert!(
        out.contains("unconnected socket refused (-ENOTCONN)")
            && out.contains("their path is \"closed\"")
            && out.contains("counters after close")
            && out.ends_with("ok\n"),
        "{out}"
    );

    // The header's thread and ownership rules: chunks freed on another thread (and after
    // the receiver), pool buffers empty and zeroed, a poster on another thread.
    let rules_exe = p.join("thread_rules");
    cc_example(
        &rules_exe,
        root.join("crates/zcio-capi/tests/c/thread_rules.c"),
        &flags,
        &rpath,
    );
    let out = run(&mut Command::new(&rules_exe));
    assert!(
        out.contains("8388608 bytes checked")
            && out.contains("come back empty and zeroed")
            && out.contains("refuse other threads with -EPERM")
            && out.ends_with("ok\n"),
        "{out}"
    );

    // The NFQUEUE example, in a fresh network namespace with an NFQUEUE rule on loopback.
    let nfq_exe = p.join("nfqueue");
    run(Command::new("cc")
        .args([
            "-std=c11",
            "-D_GNU_SOURCE",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
        ])
        .arg(&nfq_exe)
        .arg(root.join("crates/zcio-capi/examples/c/nfqueue.c"))
        .args(&flags)
        .arg(&rpath));
    if privileged("nfqueue example") {
        let script = format!(
            "ip link set lo up && iptables -A OUTPUT -o lo -p udp --dport 9999 -j NFQUEUE \
             --queue-num 41 && {} 41",
            nfq_exe.display()
        );
        let out = run(Command::new("unshare").args(["--net", "sh", "-c", &script]));
        assert!(
            out.contains("accepted 10, dropped 10, arrived 10") && out.ends_with("ok\n"),
            "{out}"
        );
    }

    // Held packets in batches (the shape of the Go module): receive, decide, rewrite.
    let held_exe = p.join("nfqueue_held");
    cc_example(
        &held_exe,
        root.join("crates/zcio-capi/examples/c/nfqueue_held.c"),
        &flags,
        &rpath,
    );
    if privileged("nfqueue_held example") {
        let script = format!(
            "ip link set lo up && iptables -A OUTPUT -o lo -p udp --dport 9999 -j NFQUEUE \
             --queue-num 43 && {} 43",
            held_exe.display()
        );
        let out = run(Command::new("unshare").args(["--net", "sh", "-c", &script]));
        assert!(
            out.contains("held 20, decided 20, arrived 10 (rewritten 1), wrong 0")
                && out.ends_with("ok\n"),
            "{out}"
        );
    }

    // The NFLOG and conntrack event examples, each in a fresh network namespace.
    let nflog_exe = p.join("nflog");
    cc_example(
        &nflog_exe,
        root.join("crates/zcio-capi/examples/c/nflog.c"),
        &flags,
        &rpath,
    );
    let ct_exe = p.join("conntrack");
    cc_example(
        &ct_exe,
        root.join("crates/zcio-capi/examples/c/conntrack.c"),
        &flags,
        &rpath,
    );
    if privileged("nflog and conntrack examples") {
        let script = format!(
            "ip link set lo up && iptables -A OUTPUT -o lo -p udp --dport 9998 -j NFLOG \
             --nflog-group 42 --nflog-prefix c-example && {} 42",
            nflog_exe.display()
        );
        let out = run(Command::new("unshare").args(["--net", "sh", "-c", &script]));
        assert!(
            out.contains("logged 10, bad 0, packets 10, lost 0") && out.ends_with("ok\n"),
            "{out}"
        );
        let script = format!(
            "ip link set lo up && iptables -A INPUT -m conntrack --ctstate NEW -j ACCEPT && {}",
            ct_exe.display()
        );
        let out = run(Command::new("unshare").args(["--net", "sh", "-c", &script]));
        assert!(
            out.contains("flows 5, bad 0, new 5, lost 0") && out.ends_with("ok\n"),
            "{out}"
        );
    }

    // The audit example on the host (audit is global: `AuditHost` serialises with the other
    // audit tests, and sets back the enabled flag, the registered pid and its watch): a storm
    // of openat calls of a file the test names, every event once and whole, nothing lost.
    let audit_exe = p.join("audit");
    cc_example(
        &audit_exe,
        root.join("crates/zcio-capi/examples/c/audit.c"),
        &flags,
        &rpath,
    );
    if let Some(mut host) = zcio_testnet::audit::AuditHost::take("audit_example", false) {
        let (file, key) = host.watch("c-storm");
        let out = run(Command::new(&audit_exe).arg(&file).arg(&key).arg("1000"));
        assert!(
            out.contains("events 1000, bad 0, dup 0, late 0")
                && out.contains("lost 0 (exact)")
                && out.ends_with("ok\n"),
            "{out}"
        );
        drop(host);
        assert_eq!(zcio_core::netlink::audit_status().unwrap().pid, 0);
    }

    // C, static.
    let static_flags = run(Command::new("pkg-config")
        .args(["--static", "--libs-only-other", "--libs-only-l", "zcio"])
        .env("PKG_CONFIG_PATH", &pc));
    let c_static = p.join("event_ring_static");
    let mut cmd = Command::new("cc");
    cmd.args(["-std=c11", "-D_GNU_SOURCE", "-o"])
        .arg(&c_static)
        .arg(&example)
        .arg(format!("-I{}", p.join("include").display()))
        .arg(p.join("lib/libzcio.a"));
    for f in static_flags.split_whitespace().filter(|f| *f != "-lzcio") {
        cmd.arg(f);
    }
    run(&mut cmd);
    let needed = run(Command::new("readelf").arg("-d").arg(&c_static));
    assert!(
        !needed.contains("libzcio"),
        "static binary needs libzcio.so:\n{needed}"
    );
    let out = run(&mut Command::new(&c_static));
    assert!(out.ends_with("ok\n"), "{out}");

    // C++, shared.
    let cpp_exe = p.join("link_test");
    run(Command::new("c++")
        .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&cpp_exe)
        .arg(&cpp)
        .args(&flags)
        .arg(&rpath));
    let out = run(&mut Command::new(&cpp_exe));
    assert!(out.contains("c++ ok"), "{out}");
}

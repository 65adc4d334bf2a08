//! `zcio perf` and `zcio bench --peer` between two hosts: two network namespaces joined by
//! veth, each side a separate `zcio` process started with `ip netns exec`. The addresses are
//! private ones outside the project's test ranges (10.77.0.0/24, fd77::/64, existing only
//! inside the namespaces this test creates), so a leftover address filter would fail here; the
//! client names the server by a host name from the namespace's own hosts file.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use zcio_testnet::{Pair, PairAddrs};

const PEER: &str = "zcio-peer.test";

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_zcio")
}

/// Two hosts on 10.77.0.0/24 + fd77::/64; host A knows B as [`PEER`].
fn hosts(tag: &str) -> Option<Pair> {
    if !zcio_testnet::can_make_hosts(tag) {
        return None;
    }
    let mut pair = Pair::with_addrs(tag, PairAddrs::private()).expect("test hosts");
    pair.a
        .set_hosts(&[(PEER, IpAddr::V4(pair.b4)), (PEER, IpAddr::V6(pair.b6))])
        .expect("hosts file for A");
    Some(pair)
}

/// A `zcio perf server` process in B; killed on drop. Its log goes to the test's stderr.
struct Server {
    child: Child,
}

impl Server {
    fn start(pair: &Pair, args: &[&str]) -> Self {
        let mut child = pair
            .b
            .command(bin())
            .args(["perf", "server"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the server");
        let (tx, log) = mpsc::channel();
        let err = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("server: {l}");
                let _ = tx.send(l);
            }
        });
        let first = log
            .recv_timeout(Duration::from_secs(20))
            .expect("server says where it listens");
        assert!(first.contains("listening on"), "{first}");
        Server { child }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `zcio ARGS` in A; returns (success, stdout, stderr).
fn in_a(pair: &Pair, args: &[&str]) -> (bool, String, String) {
    let o = pair
        .a
        .command(bin())
        .args(args)
        .output()
        .expect("run zcio in A");
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    (o.status.success(), out, err)
}

fn json(out: &str, err: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("bad JSON ({e}): {out}\nstderr: {err}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn perf_client_by_host_name_with_four_streams_reports_both_hosts() {
    let Some(pair) = hosts("pf4") else { return };
    let _srv = Server::start(&pair, &["-B", "10.77.0.2", "-p", "5201"]);
    let (ok, out, err) = in_a(
        &pair,
        &["perf", "client", PEER, "-4", "-P", "4", "-t", "3", "--json"],
    );
    assert!(ok, "{err}\n{out}");
    let v = json(&out, &err);
    assert_eq!(v["version"], 1);
    assert_eq!(v["server_addr"], "10.77.0.2:5201");
    let (c, s) = (&v["client"], &v["server"]);
    assert_eq!(c["role"], "sender");
    assert_eq!(s["role"], "receiver");
    let ncpu = c["host"]["cpus"].as_u64().unwrap();
    for side in [c, s] {
        let streams = side["streams"].as_array().unwrap();
        assert_eq!(streams.len(), 4, "{side}");
        for (i, st) in streams.iter().enumerate() {
            assert!(st["bytes"].as_u64().unwrap() > 0, "{st}");
            assert!(st["error"].is_null(), "{st}");
            // One thread per stream, each on its own CPU (wrapping when streams > CPUs).
            assert_eq!(st["cpu"].as_u64(), Some(i as u64 % ncpu), "{st}");
        }
        assert!(f(&side["gbit_s"]) > 0.0);
        assert!(f(&side["cpu_s_per_gb"]) > 0.0);
        assert!(f(&side["host_cpu_s_per_gb"]) > 0.0);
        assert!(f(&side["syscalls_per_op"]) > 0.0);
        assert!(!side["host"]["kernel"].as_str().unwrap().is_empty());
        assert!(
            side["host"]["nic"].as_str().unwrap().starts_with("veth0"),
            "{side}"
        );
    }
    // Every completed byte arrived, measured on both hosts.
    assert_eq!(c["bytes"], s["bytes"]);
    assert!(c["retransmits"].is_u64(), "TCP_INFO retransmits: {c}");
    let copied = f(&c["copied_fraction"]);
    assert!((0.0..=1.0).contains(&copied));
    assert!(v["intervals"].as_array().unwrap().len() >= 2, "{v}");
}

#[test]
fn perf_reverse_over_ipv6_and_udp_at_a_rate_work_between_hosts() {
    let Some(pair) = hosts("pfr") else { return };
    let _srv = Server::start(&pair, &["-p", "5202"]);
    // -R: the server sends, over IPv6 (the host name resolves to both families).
    let (ok, out, err) = in_a(
        &pair,
        &[
            "perf", "client", PEER, "-6", "-p", "5202", "-R", "-t", "1", "--verify", "--json",
        ],
    );
    assert!(ok, "{err}\n{out}");
    let v = json(&out, &err);
    assert_eq!(v["server_addr"], "[fd77::2]:5202");
    assert_eq!(v["server"]["role"], "sender");
    assert_eq!(v["client"]["role"], "receiver");
    let sent = v["server"]["bytes"].as_u64().unwrap();
    assert!(sent > 0);
    assert_eq!(v["client"]["bytes"].as_u64().unwrap(), sent);
    assert_eq!(v["client"]["streams"][0]["verified"], true);
    assert!(v["server"]["copied_fraction"].is_number(), "{v}");
    // UDP at 20 Mbit/s for 1 s: the sender keeps to the rate, the receiver counts what came.
    let (ok, out, err) = in_a(
        &pair,
        &[
            "perf", "client", PEER, "-4", "-p", "5202", "-u", "-b", "20M", "-t", "1", "--json",
        ],
    );
    assert!(ok, "{err}\n{out}");
    let v = json(&out, &err);
    let g = f(&v["client"]["gbit_s"]);
    assert!(g > 0.005 && g < 0.03, "rate 20M not kept: {g} Gbit/s");
    assert!(v["server"]["bytes"].as_u64().unwrap() > 0);
    assert!(v["lost_bytes"].is_u64());
    // UDP with -R: the server sends datagrams to the client.
    let (ok, out, err) = in_a(
        &pair,
        &[
            "perf", "client", PEER, "-p", "5202", "-u", "-R", "-b", "10M", "-t", "1", "--json",
        ],
    );
    assert!(ok, "{err}\n{out}");
    let v = json(&out, &err);
    assert!(v["client"]["bytes"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn perf_udp_peers_sends_gso_trains_to_every_peer_from_one_socket() {
    let Some(pair) = hosts("pfp") else { return };
    let _srv = Server::start(&pair, &["-p", "5203"]);
    // 16 peers (server ports) from one unconnected socket, 16 KiB trains (GSO), 5 Mbit/s per
    // peer, every byte checked by the server (offsets and pattern per peer).
    let (ok, out, err) = in_a(
        &pair,
        &[
            "perf", "client", PEER, "-4", "-p", "5203", "-u", "--peers", "16", "-l", "16K", "-b",
            "5M", "-t", "1", "--verify", "--json",
        ],
    );
    assert!(ok, "{err}\n{out}");
    let v = json(&out, &err);
    let client = v["client"]["streams"].as_array().expect("client streams");
    let server = v["server"]["streams"].as_array().expect("server streams");
    assert_eq!(client.len(), 16, "{v}");
    assert_eq!(server.len(), 16, "{v}");
    for (c, s) in client.iter().zip(server) {
        let sent = c["bytes"].as_u64().unwrap();
        assert!(sent > 0, "peer {} got nothing: {v}", c["stream"]);
        assert_eq!(
            s["bytes"].as_u64().unwrap(),
            sent,
            "peer {}: {v}",
            c["stream"]
        );
        assert_eq!(s["verified"], true);
        assert!(s["error"].is_null(), "{v}");
    }
    // One socket, one ring: the path is a ring path.
    let path = client[0]["path"].as_str().unwrap();
    assert!(path.starts_with("uring-"), "{path}");
    assert_eq!(v["lost_bytes"].as_u64(), Some(0), "{v}");
    // A request to send the other way with --peers is refused with a reason.
    let (ok, _, err) = in_a(
        &pair,
        &[
            "perf", "client", PEER, "-p", "5203", "-u", "-R", "--peers", "4", "-t", "1",
        ],
    );
    assert!(!ok && err.contains("--peers"), "{err}");
}

#[test]
fn bench_tx_peer_quick_writes_a_two_host_report() {
    let Some(pair) = hosts("pfb") else { return };
    let _srv = Server::start(&pair, &["-p", "5203"]);
    let tmp = zcio_testnet::TempDir::new("peer-bench").unwrap();
    let out_dir = tmp.join("out");
    let (ok, out, err) = in_a(
        &pair,
        &[
            "bench",
            "tx",
            "--peer",
            &format!("{PEER}:5203"),
            "--quick",
            "--out",
            out_dir.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}\n{out}");
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("results.json")).unwrap())
            .unwrap();
    let peer = &results["peer"];
    assert_eq!(peer["host"], format!("{PEER}:5203"));
    assert!(
        peer["local"]["nic"].as_str().unwrap().starts_with("veth0"),
        "{peer}"
    );
    assert!(
        peer["remote"]["nic"].as_str().unwrap().starts_with("veth0"),
        "{peer}"
    );
    assert!(!peer["remote"]["kernel"].as_str().unwrap().is_empty());
    let tx = &results["suites"][0];
    assert_eq!(tx["name"], "tx");
    let rows = tx["rows"].as_array().unwrap();
    for metric in [
        "sender_cpu",
        "receiver_cpu",
        "throughput",
        "copied_fraction",
    ] {
        assert!(
            rows.iter().any(|r| r["metric"] == metric),
            "no {metric} row: {tx}"
        );
    }
    let html = std::fs::read_to_string(out_dir.join("report.html")).unwrap();
    assert!(
        html.contains("Two-host run"),
        "report does not say two hosts"
    );
    assert!(html.contains(PEER));
    assert!(html.contains(peer["remote"]["kernel"].as_str().unwrap()));
    // Without suite names, --peer runs the other network suites too: notify and rx.
    let out2 = tmp.join("all");
    let (ok, out, err) = in_a(
        &pair,
        &[
            "bench",
            "--peer",
            &format!("{PEER}:5203"),
            "--quick",
            "--out",
            out2.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}\n{out}");
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(out2.join("results.json")).unwrap()).unwrap();
    let names: Vec<&str> = results["suites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["tx", "notify", "rx"]);
    for s in results["suites"].as_array().unwrap() {
        assert!(!s["rows"].as_array().unwrap().is_empty(), "{s}");
        assert!(s["skipped"].is_null(), "{s}");
    }
}

#[test]
fn hosts_file_of_a_namespace_is_its_own_and_goes_away() {
    let Some(pair) = hosts("pfh") else { return };
    let name = pair.a.name().to_string();
    let o = pair
        .a
        .command("getent")
        .args(["hosts", PEER])
        .output()
        .expect("getent");
    let got = String::from_utf8_lossy(&o.stdout);
    assert!(
        got.contains("10.77.0.2") || got.contains("fd77::2"),
        "{got}"
    );
    let mine = Command::new("getent")
        .args(["hosts", PEER])
        .output()
        .unwrap();
    assert!(
        !mine.status.success(),
        "the machine's /etc/hosts must not know {PEER}"
    );
    drop(pair);
    assert!(!std::path::Path::new(&format!("/etc/netns/{name}")).exists());
}

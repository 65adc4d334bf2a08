//! `zcio nflog` as a process in test namespaces with real NFLOG rules: every logged packet
//! appears in the pcapng byte for byte (read back with tcpdump), with its prefix as the packet
//! comment, its interface and its direction (read back with tshark); `-w -` streams to tshark;
//! `-C`/`-G` rotate into files that each stand alone; `--pcap` writes classic pcap; losses
//! are reported with their counts.

mod common;

use std::io::Read;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use zcio_testnet::Netns;

const PORT: u16 = 9300;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_zcio")
}

/// `tool` is installed, or the test skips (a failure under ZCIO_REQUIRE_PRIV=1).
fn have(test: &str, tool: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        // (scripts/vmtest puts tshark into its guests with this group.)
        let reason = format!("{tool} is not installed (scripts/deps installs it)");
        return zcio_testnet::skip(test, &reason);
    }
    true
}

/// A namespace logging UDP to `PORT` on OUTPUT (prefix `out`) and INPUT (prefix `in`) to
/// `group`.
fn host(test: &str, group: u16) -> Option<Netns> {
    if !zcio_testnet::can_make_hosts(test) {
        return None;
    }
    let ns = Netns::new("nflc").unwrap();
    for (chain, prefix) in [("OUTPUT", "out"), ("INPUT", "in")] {
        let o = ns
            .command("iptables")
            .args(["-A", chain, "-p", "udp", "--dport", &PORT.to_string()])
            .args(["-j", "NFLOG", "--nflog-group", &group.to_string()])
            .args(["--nflog-prefix", prefix])
            .output();
        match o {
            Ok(o) if o.status.success() => {}
            other => {
                zcio_testnet::skip(test, &format!("iptables NFLOG rule refused: {other:?}"));
                return None;
            }
        }
    }
    Some(ns)
}

/// Waits until `group` is bound in the namespace (`/proc/net/netfilter/nfnetlink_log`).
fn wait_bound(ns: &Netns, group: u16) {
    let bound = ns
        .run(move || {
            let end = Instant::now() + Duration::from_secs(10);
            while Instant::now() < end {
                let s = std::fs::read_to_string("/proc/thread-self/net/netfilter/nfnetlink_log")
                    .unwrap_or_default();
                if s.lines().any(|l| {
                    l.split_whitespace()
                        .next()
                        .and_then(|g| g.parse::<u16>().ok())
                        == Some(group)
                }) {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            false
        })
        .unwrap();
    assert!(bound, "zcio nflog did not bind group {group}");
}

/// An IPv4/UDP packet to 127.0.0.1:`PORT` whose every byte is fixed here (identification,
/// checksum, source port), so what is logged can be compared byte for byte.
fn packet(i: u16, payload: usize) -> Vec<u8> {
    let total = 20 + 8 + payload;
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[4..6].copy_from_slice(&(0x1000 + i).to_be_bytes());
    p[6] = 0x40; // DF
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&[127, 0, 0, 1]);
    p[16..20].copy_from_slice(&[127, 0, 0, 1]);
    let mut sum = 0u32;
    for c in p[..20].chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    p[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    p[20..22].copy_from_slice(&(40_000 + i).to_be_bytes());
    p[22..24].copy_from_slice(&PORT.to_be_bytes());
    p[24..26].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
    // UDP checksum 0: none (legal for IPv4).
    for (k, b) in p[28..].iter_mut().enumerate() {
        *b = (k as u16).wrapping_mul(31).wrapping_add(i) as u8;
    }
    p
}

/// Sends `pkts` through a raw socket (`IPPROTO_RAW`: the header is ours).
fn send_raw(pkts: &[Vec<u8>]) {
    let fd = zcio::sys::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW).unwrap();
    let s = UdpSocket::from(fd);
    for p in pkts {
        s.send_to(p, "127.0.0.1:0").unwrap();
    }
}

fn spawn(ns: &Netns, args: &[&str], stdout: Stdio) -> Child {
    ns.command(bin())
        .args(args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` to exit (killing it with SIGTERM after `limit`), returns its output.
fn finish(mut child: Child, limit: Duration) -> Output {
    let end = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= end {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// The records of a classic pcap file: (link type, data).
fn read_pcap(b: &[u8]) -> (u32, Vec<Vec<u8>>) {
    assert!(b.len() >= 24, "pcap of {} bytes", b.len());
    assert_eq!(u32::from_le_bytes(b[0..4].try_into().unwrap()), 0xa1b2_c3d4);
    let linktype = u32::from_le_bytes(b[20..24].try_into().unwrap());
    let mut o = 24;
    let mut v = Vec::new();
    while o + 16 <= b.len() {
        let incl = u32::from_le_bytes(b[o + 8..o + 12].try_into().unwrap()) as usize;
        v.push(b[o + 16..o + 16 + incl].to_vec());
        o += 16 + incl;
    }
    (linktype, v)
}

/// Reads a capture file with tcpdump (libpcap's pcapng reader) and returns its packets, by
/// having tcpdump rewrite it as classic pcap.
fn tcpdump_packets(file: &Path) -> Vec<Vec<u8>> {
    let out = file.with_extension("via-tcpdump.pcap");
    let o = Command::new("tcpdump")
        .args(["-r"])
        .arg(file)
        .arg("-w")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "tcpdump -r {}: {}",
        file.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    let (linktype, pkts) = read_pcap(&std::fs::read(&out).unwrap());
    assert_eq!(linktype, 101, "LINKTYPE_RAW");
    pkts
}

fn stats_json(stderr: &str) -> serde_json::Value {
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("zcio nflog: stats "))
        .unwrap_or_else(|| panic!("no stats line in:\n{stderr}"));
    serde_json::from_str(line).unwrap()
}

fn tmp(test: &str) -> zcio_testnet::tempdir::TempDir {
    zcio_testnet::tempdir::TempDir::new(test).unwrap()
}

#[test]
fn pcapng_holds_every_logged_packet_byte_for_byte_with_prefix_interface_and_direction() {
    let test = "pcapng_holds_every_logged_packet_byte_for_byte_with_prefix_interface_and_direction";
    let Some(ns) = host(test, 30) else {
        return;
    };
    if !have(test, "tcpdump") {
        return;
    }
    let dir = tmp("nflog-bytes");
    let file = dir.join("log.pcapng");
    let pkts: Vec<Vec<u8>> = (0..24u16)
        .map(|i| packet(i, [0, 1, 17, 100, 1000, 1400, 3000, 9000][i as usize % 8]))
        .collect();
    let n = pkts.len() * 2;
    let child = spawn(
        &ns,
        &[
            "nflog",
            "-g",
            "30",
            "-w",
            file.to_str().unwrap(),
            "-c",
            &n.to_string(),
        ],
        Stdio::null(),
    );
    wait_bound(&ns, 30);
    let p = pkts.clone();
    ns.run(move || send_raw(&p)).unwrap();
    let out = finish(child, Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("no loss"), "{err}");
    assert_eq!(stats_json(&err)["written"], n);
    // tcpdump reads every packet back, each logged twice (OUTPUT, then INPUT), byte for byte.
    let got = tcpdump_packets(&file);
    assert_eq!(got.len(), n);
    for (i, p) in pkts.iter().enumerate() {
        assert_eq!(&got[2 * i], p, "packet {i} at OUTPUT");
        assert_eq!(&got[2 * i + 1], p, "packet {i} at INPUT");
    }
    // tshark sees the prefixes as packet comments, the interface by name and the direction.
    if have(test, "tshark") {
        let o = Command::new("tshark")
            .args(["-r"])
            .arg(&file)
            .args([
                "-T",
                "fields",
                "-e",
                "frame.comment",
                "-e",
                "frame.interface_name",
            ])
            .args(["-e", "frame.p2p_dir", "-e", "frame.cap_len"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let lines: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(lines.len(), n);
        for (i, l) in lines.iter().enumerate() {
            let f: Vec<&str> = l.split('\t').collect();
            let (prefix, dir) = if i % 2 == 0 {
                ("out", "0")
            } else {
                ("in", "1")
            };
            assert_eq!(f[0], prefix, "comment of packet {i}: {l}");
            assert_eq!(f[1], "lo", "interface of packet {i}: {l}");
            assert_eq!(
                f[2], dir,
                "direction of packet {i} (0 sent, 1 received): {l}"
            );
            assert_eq!(f[3], pkts[i / 2].len().to_string());
        }
    }
}

#[test]
fn pcapng_streams_to_stdout_into_tshark() {
    let test = "pcapng_streams_to_stdout_into_tshark";
    let Some(ns) = host(test, 31) else {
        return;
    };
    if !have(test, "tshark") {
        return;
    }
    let pipeline = format!(
        "{} nflog -g 31 -w - -c 10 --stats-interval 0 | tshark -r - -T fields -e frame.len -e frame.comment",
        bin()
    );
    let child = ns
        .command("sh")
        .args(["-c", &pipeline])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_bound(&ns, 31);
    let pkts: Vec<Vec<u8>> = (0..5u16).map(|i| packet(i, 10 * i as usize)).collect();
    let p = pkts.clone();
    ns.run(move || send_raw(&p)).unwrap();
    let out = finish(child, Duration::from_secs(20));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        10,
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (i, l) in lines.iter().enumerate() {
        let want = format!(
            "{}\t{}",
            pkts[i / 2].len(),
            if i % 2 == 0 { "out" } else { "in" }
        );
        assert_eq!(*l, want);
    }
}

/// Sends `n` UDP datagrams of `size` bytes to `PORT` in the namespace.
fn send_udp(ns: &Netns, n: u32, size: usize, gap: Duration) {
    ns.run(move || {
        let rx = UdpSocket::bind(("127.0.0.1", PORT)).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in 0..n {
            let mut b = vec![0u8; size];
            b[..4].copy_from_slice(&i.to_be_bytes());
            tx.send_to(&b, ("127.0.0.1", PORT)).unwrap();
            if !gap.is_zero() {
                std::thread::sleep(gap);
            }
        }
        drop(rx);
    })
    .unwrap();
}

/// The sequence numbers in the UDP payloads of logged IPv4 packets.
fn seqs(pkts: &[Vec<u8>]) -> Vec<u32> {
    pkts.iter()
        .map(|p| u32::from_be_bytes(p[28..32].try_into().unwrap()))
        .collect()
}

/// The files of a rotated capture: `base`, `base1`, `base2`, …
fn rotated(base: &Path) -> Vec<PathBuf> {
    let mut v = vec![base.to_path_buf()];
    for k in 1.. {
        let mut s = base.as_os_str().to_os_string();
        s.push(k.to_string());
        let p = PathBuf::from(s);
        if !p.exists() {
            break;
        }
        v.push(p);
    }
    v
}

#[test]
fn rotation_by_size_and_by_time_makes_files_that_each_stand_alone() {
    let test = "rotation_by_size_and_by_time_makes_files_that_each_stand_alone";
    let Some(ns) = host(test, 32) else {
        return;
    };
    if !have(test, "tcpdump") {
        return;
    }
    let dir = tmp("nflog-rotate");
    for (flag, value, gap) in [
        ("-C", "8K", Duration::ZERO),
        ("-G", "0.2", Duration::from_millis(5)),
    ] {
        let base = dir.join(format!("rot{flag}.pcapng"));
        let n = 100u32;
        let child = spawn(
            &ns,
            &[
                "nflog",
                "-g",
                "32",
                "-w",
                base.to_str().unwrap(),
                flag,
                value,
                "-c",
                &(2 * n).to_string(),
            ],
            Stdio::null(),
        );
        wait_bound(&ns, 32);
        send_udp(&ns, n, 400, gap);
        let out = finish(child, Duration::from_secs(20));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        let files = rotated(&base);
        assert!(
            files.len() >= 3,
            "{flag} {value}: {} file(s)\n{err}",
            files.len()
        );
        assert_eq!(stats_json(&err)["files"], files.len());
        let mut all = Vec::new();
        for f in &files {
            let pkts = tcpdump_packets(f);
            assert!(!pkts.is_empty(), "{} is empty", f.display());
            if flag == "-C" {
                let len = std::fs::metadata(f).unwrap().len();
                assert!(len < 8192 + 2048, "{} has {len} bytes", f.display());
            }
            all.extend(pkts);
        }
        // Every packet once (logged at OUTPUT and at INPUT), in order, across the files.
        let s = seqs(&all);
        let want: Vec<u32> = (0..n).flat_map(|i| [i, i]).collect();
        assert_eq!(s, want, "{flag}");
    }
}

#[test]
fn classic_pcap_reads_back_with_tcpdump() {
    let test = "classic_pcap_reads_back_with_tcpdump";
    let Some(ns) = host(test, 33) else {
        return;
    };
    if !have(test, "tcpdump") {
        return;
    }
    let dir = tmp("nflog-pcap");
    let file = dir.join("c.pcap");
    let pkts: Vec<Vec<u8>> = (0..6u16).map(|i| packet(i, 50 + i as usize)).collect();
    let child = spawn(
        &ns,
        &[
            "nflog",
            "-g",
            "33",
            "--pcap",
            "-w",
            file.to_str().unwrap(),
            "-c",
            "12",
            "-s",
            "64",
        ],
        Stdio::null(),
    );
    wait_bound(&ns, 33);
    let p = pkts.clone();
    ns.run(move || send_raw(&p)).unwrap();
    let out = finish(child, Duration::from_secs(10));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (linktype, ours) = read_pcap(&std::fs::read(&file).unwrap());
    assert_eq!(linktype, 101);
    let via = tcpdump_packets(&file);
    assert_eq!(ours, via, "tcpdump reads the same records");
    assert_eq!(ours.len(), 12);
    for (i, p) in pkts.iter().enumerate() {
        // Cut to the snap length (64).
        assert_eq!(ours[2 * i], p[..p.len().min(64)], "packet {i}");
    }
}

/// `zcio nflog -g GROUP` into a file with a 64 KiB buffer, stopped (SIGSTOP: it reads
/// nothing) while `sent` packets are logged, so the burst overflows its buffer; then
/// continued, `after()` run, and ended with `end_signal`. Returns its stderr.
fn capture_through_a_stop(
    ns: &Netns,
    group: u16,
    sent: u32,
    after: impl FnOnce(),
    end_signal: &str,
) -> String {
    let dir = tmp("nflog-stop");
    let file = dir.join("stop.pcapng");
    let g = group.to_string();
    let mut child = spawn(
        ns,
        &[
            "nflog",
            "-g",
            &g,
            "-w",
            file.to_str().unwrap(),
            "-B",
            "64",
            "--qthresh",
            "8",
            "--stats-interval",
            "0",
        ],
        Stdio::null(),
    );
    wait_bound(ns, group);
    let pid = child.id().to_string();
    let sig = |s: &str| {
        assert!(Command::new("kill")
            .args([s, &pid])
            .status()
            .unwrap()
            .success());
    };
    sig("-STOP");
    send_udp(ns, sent, 300, Duration::ZERO);
    // Still stopped when the kernel's flush timer sends the last partial batch.
    std::thread::sleep(Duration::from_millis(200));
    sig("-CONT");
    after();
    sig(end_signal);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(child.wait().unwrap().success(), "{err}");
    err
}

#[test]
fn losses_are_reported_with_their_counts() {
    let test = "losses_are_reported_with_their_counts";
    let Some(ns) = host(test, 34) else {
        return;
    };
    let sent = 2000u32;
    let err = capture_through_a_stop(
        &ns,
        34,
        sent,
        || {
            // One more after the drain closes the last sequence gap.
            std::thread::sleep(Duration::from_millis(300));
            send_udp(&ns, 1, 300, Duration::ZERO);
            std::thread::sleep(Duration::from_millis(300));
        },
        "-TERM",
    );
    let st = stats_json(&err);
    let (written, lost) = (
        st["written"].as_u64().unwrap(),
        st["lost"].as_u64().unwrap(),
    );
    assert!(lost > 0, "{err}");
    // Each packet is logged twice (OUTPUT, INPUT): every message is written or counted lost.
    assert_eq!(written + lost, 2 * (u64::from(sent) + 1), "{err}");
    assert!(st["overruns"].as_u64().unwrap() > 0, "{err}");
    assert!(st["kernel_drops"].as_u64().unwrap() > 0, "{err}");
    // The gap is exact; whether every dropped batch lies in it cannot be shown, so the
    // summary gives the count as a bound and names the gap.
    assert!(
        err.contains(&format!("{lost} message(s) missing in"))
            && err.contains(&format!("lost >= {lost}")),
        "the summary names the count: {err}"
    );
    assert_eq!(st["lost_at_least"].as_u64(), Some(lost), "{err}");
    assert!(st["lost_at_most"].as_u64().unwrap() >= lost, "{err}");
}

#[test]
fn a_capture_stopped_for_a_whole_burst_reports_a_lower_bound_not_zero() {
    // Stopped while a whole burst is logged, resumed, interrupted: no message came after the
    // loss, so no sequence gap shows it; the batches the socket dropped say it.
    let test = "a_capture_stopped_for_a_whole_burst_reports_a_lower_bound_not_zero";
    let Some(ns) = host(test, 35) else {
        return;
    };
    let sent = 2000u32;
    let err = capture_through_a_stop(
        &ns,
        35,
        sent,
        || std::thread::sleep(Duration::from_millis(300)),
        "-INT",
    );
    let st = stats_json(&err);
    let written = st["written"].as_u64().unwrap();
    // Each packet is logged twice (OUTPUT, INPUT).
    let missing = 2 * u64::from(sent) - written;
    assert!(missing > 0, "a 64 KiB buffer held the burst? {err}");
    let at_least = st["lost_at_least"].as_u64().unwrap();
    assert!(
        at_least > 0 && at_least <= missing,
        "a true lower bound of {missing}: {err}"
    );
    assert!(st["lost_at_most"].as_u64().unwrap() >= missing, "{err}");
    assert_eq!(st["lost_exact"], false, "{err}");
    assert!(st["tail_batches"].as_u64().unwrap() > 0, "{err}");
    assert!(
        err.contains(&format!("LOSS: lost >= {at_least}"))
            && err.contains("after the last message that arrived"),
        "{err}"
    );
    assert!(!err.contains("lost 0 "), "{err}");
}

#[test]
fn invalid_sizes_counts_and_durations_are_refused_with_one_error_line() {
    let dir = tmp("nflog-args");
    let file = dir.join("x.pcapng");
    let w = file.to_str().unwrap();
    for (args, names) in [
        (vec!["-w", w, "-C", "0"], "-C"),
        (vec!["-w", w, "-C", "0K"], "-C"),
        (vec!["-w", w, "-C", "12Q"], "-C"),
        (vec!["-w", w, "-C", "99999999999999"], "-C"),
        (vec!["-w", w, "-G", "0"], "-G"),
        (vec!["-c", "0"], "-c"),
        (vec!["-B", "0"], "-B"),
        (vec!["--qthresh", "0"], "--qthresh"),
        (vec!["--duration", "0"], "--duration"),
        (vec!["--duration=-1"], "--duration"),
        (vec!["--duration", "NaN"], "--duration"),
        (vec!["--stats-interval", "inf"], "--stats-interval"),
    ] {
        let mut all = vec!["nflog", "-g", "47"];
        all.extend(&args);
        common::refused_with_one_line(&all, names);
    }
    assert!(!file.exists(), "nothing was written");
}

#[test]
fn text_lines_have_single_spaces_when_the_rule_has_no_prefix() {
    let test = "text_lines_have_single_spaces_when_the_rule_has_no_prefix";
    if !zcio_testnet::can_make_hosts(test) {
        return;
    }
    let ns = Netns::new("nflcp").unwrap();
    let o = ns
        .command("iptables")
        .args(["-A", "OUTPUT", "-p", "udp", "--dport", &PORT.to_string()])
        .args(["-j", "NFLOG", "--nflog-group", "37"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let child = spawn(&ns, &["nflog", "-g", "37", "-c", "1"], Stdio::piped());
    wait_bound(&ns, 37);
    send_udp(&ns, 1, 40, Duration::ZERO);
    let out = finish(child, Duration::from_secs(10));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .next()
        .unwrap_or_else(|| panic!("no line: {out:?}"));
    assert!(line.contains(" group=37 IN= OUT=lo "), "{line}");
    assert!(!line.contains("  "), "a double space: {line:?}");
}

/// The one error line of a `zcio nflog -g GROUP` started in `ns` through `wrap` (a command
/// put before zcio, e.g. setpriv), which must fail.
fn refused_line(ns: &Netns, wrap: &[&str], group: u16) -> String {
    let mut cmd = ns.command(wrap.first().copied().unwrap_or(bin()));
    if !wrap.is_empty() {
        cmd.args(&wrap[1..]).arg(bin());
    }
    let o = cmd
        .args(["nflog", "-g", &group.to_string(), "--stats-interval", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{err}");
    err.lines().last().unwrap_or_default().to_string()
}

#[test]
fn a_group_another_socket_holds_is_reported_in_use_with_its_process() {
    let test = "a_group_another_socket_holds_is_reported_in_use_with_its_process";
    let Some(ns) = host(test, 38) else {
        return;
    };
    let first = spawn(
        &ns,
        &["nflog", "-g", "38", "-w", "/dev/null"],
        Stdio::null(),
    );
    let holder = first.id();
    wait_bound(&ns, 38);
    let line = refused_line(&ns, &[], 38);
    assert!(
        line.starts_with("zcio: error: binding NFLOG group"),
        "{line}"
    );
    let _ = Command::new("kill")
        .args(["-TERM", &holder.to_string()])
        .status();
    let _ = finish(first, Duration::from_secs(5));
    assert!(line.contains("group 38 is in use"), "{line}");
    assert!(line.contains(&format!("pid {holder} (zcio)")), "{line}");
    assert!(!line.contains("CAP_NET_ADMIN"), "{line}");
}

#[test]
fn without_cap_net_admin_the_error_says_the_capability_is_missing() {
    let test = "without_cap_net_admin_the_error_says_the_capability_is_missing";
    if !have(test, "setpriv") {
        return;
    }
    let Some(ns) = host(test, 39) else {
        return;
    };
    let line = refused_line(
        &ns,
        &[
            "setpriv",
            "--inh-caps=-net_admin",
            "--bounding-set=-net_admin",
        ],
        39,
    );
    // The start-up check of the capabilities names the missing one before any bind is tried
    // (the library's own refusal, told apart from a group in use, is tested in
    // crates/zcio/tests/nflog.rs with the capability dropped in one thread).
    assert!(
        line.starts_with("zcio: error: missing CAP_NET_ADMIN (binding NFLOG groups)"),
        "{line}"
    );
    assert!(!line.contains("in use"), "{line}");
}

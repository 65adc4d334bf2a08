//! CtEvents against conntrack in test namespaces: every event of a scripted set of connections
//! (TCP, UDP over IPv4 and IPv6, ICMP) arrives with its tuples, states, counters and
//! timestamps, formatted as `conntrack -E` prints it; a burst that overflows the receive
//! buffer is lost and counted exactly, with and without `NETLINK_NO_ENOBUFS`; and the ctnetlink
//! parser on bytes captured from the kernel (parse → emit → compare, fixtures, fuzz corpus).

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use zcio::netlink::msg::{self, emit_header, finish, NlMsg};
use zcio::netlink::{CtEvent, CtEventKind, CtEvents, CtEventsConfig, NetlinkPath};
use zcio::sys::ctnetlink::*;
use zcio::sys::netlink as nl;
use zcio_testnet::Netns;

/// A namespace where conntrack tracks IPv4 and IPv6 (a conntrack match on INPUT makes the
/// kernel register its hooks there), with accounting and timestamps on.
fn host(test: &str) -> Option<Netns> {
    if !common::can_make_hosts(test) {
        return None;
    }
    let ns = Netns::new("ct").expect("namespace");
    for tool in ["iptables", "ip6tables"] {
        let out = ns
            .command(tool)
            .args(["-A", "INPUT", "-m", "conntrack", "--ctstate"])
            .args(["NEW,ESTABLISHED,RELATED", "-j", "ACCEPT"])
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            other => {
                common::skip(test, &format!("{tool} conntrack rule refused: {other:?}"));
                return None;
            }
        }
    }
    for (k, v) in [
        ("net.netfilter.nf_conntrack_acct", "1"),
        ("net.netfilter.nf_conntrack_timestamp", "1"),
    ] {
        let o = ns
            .command("sh")
            .arg("-c")
            .arg(format!("echo {v} > /proc/sys/{}", k.replace('.', "/")))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{k}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Some(ns)
}

/// Flushes the conntrack table of `family` (2 or 10) with a hand-built ctnetlink request:
/// every entry is destroyed, each with a DESTROY event carrying this socket's port id.
fn flush(family: u8) -> u32 {
    let fd = common::netlink_socket(nl::NETLINK_NETFILTER);
    let mut out = Vec::new();
    emit_header(
        &mut out,
        (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE,
        nl::NLM_F_REQUEST | nl::NLM_F_ACK,
        1,
        0,
    );
    out.extend_from_slice(&[family, 0, 0, 0]);
    finish(&mut out, 0).unwrap();
    nl::send_to_kernel(&fd, &out).unwrap();
    let mut buf = vec![0u8; 8192];
    let k = common::recv_netlink(&fd, &mut buf, "conntrack flush ACK");
    let (m, _) = NlMsg::parse(&buf[..k]).unwrap();
    assert_eq!(m.error_code().unwrap(), 0, "flush refused");
    // The kernel addresses the ACK to our port id.
    m.pid
}

/// The scripted connections.
struct Script {
    tcp_ports: Vec<u16>,
    udp_ports: Vec<u16>,
    udp6_ports: Vec<u16>,
    icmp_ids: Vec<u16>,
}

const TCP_PORT: u16 = 7100;
const UDP_PORT: u16 = 7101;

fn icmp_checksum(b: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in b.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Runs the scripted set inside the namespace: `tcp` connections (connect, exchange, close
/// both sides), `udp` IPv4 and `udp6` IPv6 flows with a reply each, `icmp` echo exchanges.
fn run_script(tcp: usize, udp: usize, udp6: usize, icmp: usize) -> Script {
    let l = TcpListener::bind(("127.0.0.1", TCP_PORT)).unwrap();
    let mut tcp_ports = Vec::new();
    for _ in 0..tcp {
        let mut c = TcpStream::connect(("127.0.0.1", TCP_PORT)).unwrap();
        let (mut s, _) = l.accept().unwrap();
        c.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        s.write_all(b"pong").unwrap();
        c.read_exact(&mut b).unwrap();
        tcp_ports.push(c.local_addr().unwrap().port());
        drop(c);
        let _ = s.read(&mut b);
        drop(s);
    }
    let flows = |bind: &str, peer: &str, n: usize| -> Vec<u16> {
        let srv = UdpSocket::bind((peer, UDP_PORT)).unwrap();
        let mut ports = Vec::new();
        for _ in 0..n {
            let c = UdpSocket::bind((bind, 0)).unwrap();
            c.send_to(b"q", (peer, UDP_PORT)).unwrap();
            let mut b = [0u8; 8];
            let (_, from) = srv.recv_from(&mut b).unwrap();
            srv.send_to(b"r", from).unwrap();
            c.recv(&mut b).unwrap();
            ports.push(c.local_addr().unwrap().port());
        }
        ports
    };
    let udp_ports = flows("127.0.0.1", "127.0.0.1", udp);
    let udp6_ports = flows("::1", "::1", udp6);
    let mut icmp_ids = Vec::new();
    if icmp > 0 {
        let raw = zcio::sys::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP).unwrap();
        let raw: std::os::fd::OwnedFd = raw;
        let sock = socket2_like(raw);
        for i in 0..icmp as u16 {
            let id = 0x5a00 + i;
            let mut pkt = vec![8u8, 0, 0, 0];
            pkt.extend_from_slice(&id.to_be_bytes());
            pkt.extend_from_slice(&1u16.to_be_bytes());
            pkt.extend_from_slice(b"zcio");
            let c = icmp_checksum(&pkt);
            pkt[2..4].copy_from_slice(&c.to_be_bytes());
            sock.send_to(&pkt, "127.0.0.1:0").unwrap();
            icmp_ids.push(id);
        }
    }
    Script {
        tcp_ports,
        udp_ports,
        udp6_ports,
        icmp_ids,
    }
}

/// A raw ICMP socket used through `UdpSocket`'s `send_to` (same `sendto(2)` underneath).
fn socket2_like(fd: std::os::fd::OwnedFd) -> UdpSocket {
    UdpSocket::from(fd)
}

/// What the tests keep of an event.
#[derive(Debug, Clone)]
struct Ev {
    kind: CtEventKind,
    line: String,
    proto: u8,
    family: u8,
    sport: Option<u16>,
    dport: Option<u16>,
    icmp_id: Option<u16>,
    tcp_state: Option<u8>,
    assured: bool,
    counters: Option<(u64, u64)>,
    timestamp: Option<(u64, Option<u64>)>,
    portid: u32,
    src: IpAddr,
}

impl From<&CtEvent<'_>> for Ev {
    fn from(e: &CtEvent<'_>) -> Self {
        let mut line = String::new();
        e.write_conntrack(&mut line, false, 0).unwrap();
        let o = e.ct.orig.expect("original tuple");
        Self {
            kind: e.kind,
            line,
            proto: o.proto,
            family: e.family,
            sport: o.src_port,
            dport: o.dst_port,
            icmp_id: o.icmp_id,
            tcp_state: e.ct.tcp.map(|t| t.state),
            assured: e.ct.assured(),
            counters: e
                .ct
                .counters_orig
                .zip(e.ct.counters_reply)
                .map(|(a, b)| (a.packets, b.packets)),
            timestamp: e.ct.timestamp.map(|t| (t.start, t.stop)),
            portid: e.portid,
            src: o.src,
        }
    }
}

/// `conntrack -E` running in the namespace (when the tool is installed), its lines collected
/// by a thread as it prints them.
struct Tool {
    child: Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Tool {
    fn start(ns: &Netns, test: &str) -> Option<Self> {
        let mut child = match ns
            .command("conntrack")
            .args(["-E"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                common::skip(
                    test,
                    &format!("conntrack not runnable ({e}): apt-get install -y conntrack"),
                );
                return None;
            }
        };
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let l = std::sync::Arc::clone(&lines);
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                l.lock().unwrap().push(line);
            }
        });
        Some(Self {
            child,
            lines,
            reader: Some(reader),
        })
    }

    /// Index of the first printed line containing `needle`.
    fn find(&self, needle: &str) -> Option<usize> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .position(|l| l.contains(needle))
    }

    /// Stops the tool and returns every line it printed.
    fn stop(mut self) -> Vec<String> {
        let _ = std::process::Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        std::mem::take(&mut *self.lines.lock().unwrap())
    }
}

fn scripted_set_arrives(test: &str, uring: bool) {
    let Some(ns) = host(test) else {
        return;
    };
    let tool = std::sync::Arc::new(Tool::start(&ns, test));
    let t = std::sync::Arc::clone(&tool);
    let (got, script, st, marks) = ns
        .run(move || {
            let mut ev = CtEvents::open(CtEventsConfig {
                uring,
                ..CtEventsConfig::default()
            })
            .unwrap();
            let want = if uring {
                NetlinkPath::FrameRingUring
            } else {
                NetlinkPath::FrameRingRecvmmsg
            };
            assert_eq!(ev.path(), want, "{:?}", ev.fallbacks());
            let mut got = Vec::new();
            // A sentinel flow marks where the script starts, once both subscribers (zcio and
            // `conntrack -E`, started just before) printed it.
            let first = sentinel(&mut ev, &mut got, 1, t.as_ref().as_ref());
            got.clear();
            let script = run_script(10, 10, 5, 4);
            let portids = [flush(2), flush(10)];
            let last = sentinel(&mut ev, &mut got, 2, t.as_ref().as_ref());
            assert!(
                got.iter()
                    .filter(|e| e.kind == CtEventKind::Destroy)
                    .all(|e| portids.contains(&e.portid)),
                "DESTROY events name the flushing socket"
            );
            let st = ev.stats();
            (got, script, st, (first, last))
        })
        .unwrap();
    assert_eq!(st.stream.kernel_drops, 0, "{st:?}");
    assert_eq!(st.stream.overruns, 0);
    assert_eq!(st.stream.parse_errors, 0);
    let by =
        |pred: &dyn Fn(&Ev) -> bool| got.iter().filter(|e| pred(e)).cloned().collect::<Vec<_>>();
    // TCP: NEW (SYN_SENT), updates through ESTABLISHED [ASSURED] to the close, DESTROY at the
    // flush with counters and start/stop times.
    for &p in &script.tcp_ports {
        let evs = by(&|e| e.proto == 6 && e.sport == Some(p));
        let kinds: Vec<CtEventKind> = evs.iter().map(|e| e.kind).collect();
        assert_eq!(kinds.first(), Some(&CtEventKind::New), "tcp {p}: {evs:#?}");
        assert_eq!(
            kinds.last(),
            Some(&CtEventKind::Destroy),
            "tcp {p}: {evs:#?}"
        );
        assert_eq!(kinds.iter().filter(|k| **k == CtEventKind::New).count(), 1);
        assert_eq!(evs[0].tcp_state, Some(1), "SYN_SENT");
        assert!(
            evs.iter().any(|e| e.tcp_state == Some(3) && e.assured),
            "ESTABLISHED and assured: {evs:#?}"
        );
        let d = evs.last().unwrap();
        let (op, rp) = d.counters.expect("destroy carries counters (acct on)");
        assert!(op >= 4 && rp >= 3, "packets both ways: {op} {rp}");
        let (start, stop) = d.timestamp.expect("destroy carries timestamps");
        assert!(stop.is_some_and(|s| s >= start));
        assert_ne!(d.portid, 0, "a flush is a userspace request");
        assert_eq!(d.dport, Some(TCP_PORT));
    }
    // UDP, both families: NEW [UNREPLIED], an update when the reply is seen, DESTROY.
    for (ports, fam) in [(&script.udp_ports, 2u8), (&script.udp6_ports, 10)] {
        for &p in ports {
            let evs = by(&|e| e.proto == 17 && e.sport == Some(p) && e.family == fam);
            let kinds: Vec<CtEventKind> = evs.iter().map(|e| e.kind).collect();
            assert_eq!(
                kinds,
                vec![CtEventKind::New, CtEventKind::Update, CtEventKind::Destroy],
                "udp {p} family {fam}: {evs:#?}"
            );
            assert!(evs[0].line.contains("[UNREPLIED]"), "{}", evs[0].line);
            assert!(!evs[1].line.contains("[UNREPLIED]"), "{}", evs[1].line);
            assert_eq!(evs[2].counters, Some((1, 1)));
            assert_eq!(evs[0].src.is_ipv6(), fam == 10);
        }
    }
    // ICMP echo: NEW for the request, DESTROY at the end.
    for &id in &script.icmp_ids {
        let evs = by(&|e| e.proto == 1 && e.icmp_id == Some(id));
        assert_eq!(
            evs.first().map(|e| e.kind),
            Some(CtEventKind::New),
            "icmp {id}: {evs:#?}"
        );
        assert_eq!(
            evs.last().map(|e| e.kind),
            Some(CtEventKind::Destroy),
            "icmp {id}"
        );
        assert!(
            evs[0].line.contains(&format!("type=8 code=0 id={id}")),
            "{}",
            evs[0].line
        );
    }
    // The same events, line for line, as `conntrack -E` printed them.
    if let Some(tool) = std::sync::Arc::into_inner(tool).flatten() {
        let (first, last) = marks;
        let lines = tool.stop();
        let (a, b) = (first.expect("start mark") + 1, last.expect("end mark"));
        let theirs: Vec<String> = lines[a..b]
            .iter()
            .map(|l| match l.find(" progname=") {
                // conntrack names the requesting program; zcio prints the port id only.
                Some(i) => l[..i].to_string(),
                None => l.clone(),
            })
            .collect();
        let ours: Vec<&str> = got.iter().map(|e| e.line.as_str()).collect();
        assert_eq!(
            theirs.len(),
            ours.len(),
            "zcio and conntrack -E saw different numbers of events:\nzcio:\n{}\nconntrack:\n{}",
            ours.join("\n"),
            theirs.join("\n")
        );
        for (a, b) in ours.iter().zip(&theirs) {
            assert_eq!(a, b, "zcio vs conntrack -E");
        }
    }
}

/// Makes UDP flows to port `dport` until one's NEW event arrived at zcio and (when running)
/// at `conntrack -E`, so everything before it has been delivered to both. The sentinel's event
/// is left out of `got`; returns the index of its line in the tool's output.
fn sentinel(
    ev: &mut CtEvents,
    got: &mut Vec<Ev>,
    dport: u16,
    tool: Option<&Tool>,
) -> Option<usize> {
    let end = Instant::now() + common::scaled(Duration::from_secs(5));
    loop {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.send_to(b"s", ("127.0.0.1", dport)).unwrap();
        let port = s.local_addr().unwrap().port();
        let needle = format!("sport={port} dport={dport} ");
        let mark = got.len();
        let wait = Instant::now() + common::scaled(Duration::from_millis(500));
        let mut ours = false;
        let mut theirs = None;
        while Instant::now() < wait && !(ours && (tool.is_none() || theirs.is_some())) {
            ev.process(Some(Duration::from_millis(10)), |e| got.push(Ev::from(e)))
                .unwrap();
            ours = got[mark..]
                .iter()
                .any(|e| e.sport == Some(port) && e.dport == Some(dport));
            theirs = tool.and_then(|t| t.find(&needle));
        }
        if ours && (tool.is_none() || theirs.is_some()) {
            let i = got.iter().rposition(|e| e.sport == Some(port)).unwrap();
            got.remove(i);
            return theirs;
        }
        assert!(Instant::now() < end, "no sentinel event for port {dport}");
    }
}

#[test]
fn every_event_of_a_scripted_set_arrives_as_conntrack_prints_it() {
    scripted_set_arrives(
        "every_event_of_a_scripted_set_arrives_as_conntrack_prints_it",
        true,
    );
}

#[test]
fn every_event_of_a_scripted_set_arrives_on_recvmmsg() {
    scripted_set_arrives("every_event_of_a_scripted_set_arrives_on_recvmmsg", false);
}

/// `flows` UDP flows while nobody reads a small receive buffer, then a drain: every NEW event
/// is received or counted in the socket's drops, exactly.
fn burst_is_counted(test: &str, no_enobufs: bool, uring: bool) -> (u64, u64, u64) {
    let Some(ns) = host(test) else {
        return (0, 0, 0);
    };
    ns.run(move || {
        let mut ev = CtEvents::open(CtEventsConfig {
            update: false,
            destroy: false,
            rcvbuf: Some((32 << 10, false)),
            no_enobufs,
            uring,
            ..CtEventsConfig::default()
        })
        .unwrap();
        let srv = UdpSocket::bind(("127.0.0.1", UDP_PORT)).unwrap();
        let flows = 2000u64;
        // Distinct source ports below the ephemeral range: each flow is a new entry (a port
        // the kernel handed out twice would meet its old entry and make no event).
        for i in 0..flows as u16 {
            let c = UdpSocket::bind(("127.0.0.1", 20_000 + i)).unwrap();
            c.send_to(b"x", ("127.0.0.1", UDP_PORT)).unwrap();
        }
        drop(srv);
        let mut got = Vec::new();
        // Drain: until a wait of 50 ms brings nothing.
        while ev
            .process(Some(Duration::from_millis(50)), |e| got.push(Ev::from(e)))
            .unwrap()
            > 0
        {}
        let st = ev.stats();
        assert_eq!(
            st.new + st.lost(),
            flows,
            "every NEW event received or counted lost: {st:?}"
        );
        assert!(st.lost() > 0, "a 32 KiB buffer held {flows} events? {st:?}");
        if no_enobufs {
            assert_eq!(st.stream.overruns, 0, "{st:?}");
        } else {
            assert!(st.stream.overruns > 0, "ENOBUFS reported: {st:?}");
        }
        // Drops at the socket explain every overrun: the count is exact, also for the events
        // lost after the last one that arrived (read at the end, not from sequence numbers).
        assert!(st.loss.exact, "{st:?}");
        assert_eq!(st.loss.at_least, st.lost(), "{st:?}");
        // The events that arrived are whole.
        assert_eq!(st.stream.parse_errors, 0);
        assert!(got.iter().all(|e| e.kind == CtEventKind::New));
        (st.new, st.lost(), st.stream.overruns)
    })
    .unwrap()
}

#[test]
fn a_burst_past_the_receive_buffer_is_lost_and_counted_exactly() {
    let (got, lost, overruns) = burst_is_counted(
        "a_burst_past_the_receive_buffer_is_lost_and_counted_exactly",
        false,
        true,
    );
    println!("ENOBUFS on: received {got}, lost {lost}, overruns {overruns}");
}

#[test]
fn a_burst_is_counted_on_recvmmsg_too() {
    burst_is_counted("a_burst_is_counted_on_recvmmsg_too", false, false);
}

#[test]
fn no_enobufs_loses_only_what_does_not_fit_and_still_counts_it() {
    let (got, lost, _) = burst_is_counted(
        "no_enobufs_loses_only_what_does_not_fit_and_still_counts_it",
        true,
        true,
    );
    println!("NETLINK_NO_ENOBUFS: received {got}, lost {lost}");
}

// ---- wire format: captured bytes, round trips, fuzz corpus ----

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/parse_ctevents")
}

fn assert_event_round_trip(name: &str, bytes: &[u8]) -> CtEventKind {
    let re = msg::reemit(bytes, 4).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(re, bytes, "{name}: generic re-emit differs");
    let e = CtEvent::parse_bytes(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(e.ct.unknown, 0, "{name}: attributes not modelled");
    let mut out = Vec::new();
    e.emit(&mut out).unwrap();
    assert_eq!(
        out, bytes,
        "{name}: typed emit differs from the kernel's bytes"
    );
    e.kind
}

/// Raw event datagrams captured on a socket joined to the three groups by hand.
#[test]
fn captured_events_round_trip() {
    let test = "captured_events_round_trip";
    let Some(ns) = host(test) else {
        return;
    };
    let raw = ns
        .run(|| {
            let fd = nl::socket(nl::NETLINK_NETFILTER).unwrap();
            nl::bind(&fd, 0, 0).unwrap();
            for g in [
                NFNLGRP_CONNTRACK_NEW,
                NFNLGRP_CONNTRACK_UPDATE,
                NFNLGRP_CONNTRACK_DESTROY,
            ] {
                nl::add_membership(&fd, g).unwrap();
            }
            run_script(1, 1, 1, 0);
            flush(2);
            flush(10);
            let mut raw = Vec::new();
            let mut buf = vec![0u8; 8192];
            loop {
                match zcio::sys::net::recv(&fd, &mut buf, libc::MSG_DONTWAIT) {
                    Ok(k) => raw.push(buf[..k].to_vec()),
                    Err(_) => {
                        if zcio::sys::net::poll_one(&fd, libc::POLLIN, 200).unwrap() == 0 {
                            break;
                        }
                    }
                }
            }
            raw
        })
        .unwrap();
    let mut named: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (i, d) in raw.iter().enumerate() {
        let e = CtEvent::parse_bytes(d).unwrap();
        let kind = assert_event_round_trip(&format!("event {i}"), d);
        let proto = e.ct.orig.unwrap().proto;
        let name = format!(
            "ct_{}_{}_{}.bin",
            kind.as_str(),
            match proto {
                6 => "tcp",
                17 => "udp",
                _ => "other",
            },
            if e.family == 10 { "v6" } else { "v4" }
        );
        named.entry(name).or_insert_with(|| d.clone());
    }
    for k in ["new", "update", "destroy"] {
        assert!(
            named.keys().any(|n| n.starts_with(&format!("ct_{k}_"))),
            "no {k} event captured: {:?}",
            named.keys()
        );
    }
    if std::env::var("ZCIO_WRITE_FIXTURES").is_ok() {
        std::fs::create_dir_all(corpus_dir()).unwrap();
        for (n, b) in &named {
            std::fs::write(data_dir().join(n), b).unwrap();
            std::fs::write(corpus_dir().join(n), b).unwrap();
        }
    }
}

#[test]
fn committed_event_fixtures_round_trip() {
    let mut n = 0;
    for e in std::fs::read_dir(data_dir()).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("ct_") {
            assert_event_round_trip(&name, &std::fs::read(&p).unwrap());
            n += 1;
        }
    }
    assert!(
        n >= 3,
        "conntrack fixtures missing in {}",
        data_dir().display()
    );
}

#[test]
fn ctevent_parser_survives_fuzz_corpus_and_mutations() {
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    for e in std::fs::read_dir(corpus_dir()).unwrap() {
        seeds.push(std::fs::read(e.unwrap().path()).unwrap());
    }
    assert!(seeds.len() >= 3, "no conntrack seeds");
    for s in &seeds {
        zcio::netlink::fuzz_parse_ctevents(s).unwrap();
    }
    let errors = common::mutate(&seeds, 20_000, |b| {
        zcio::netlink::fuzz_parse_ctevents(b).is_err()
    });
    assert!(errors > 0, "mutations never produced a malformed message");
}

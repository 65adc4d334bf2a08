//! `zcio conntrack events` as a process in test namespaces: the same lines as `conntrack -E`
//! for a scripted set of connections (`-o timestamp` aside), JSON lines that parse, and lost
//! events reported with their count.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zcio_testnet::Netns;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_zcio")
}

/// A namespace where conntrack tracks IPv4 (a conntrack match on INPUT), accounting on.
fn host(test: &str) -> Option<Netns> {
    if !zcio_testnet::can_make_hosts(test) {
        return None;
    }
    let ns = Netns::new("ctc").unwrap();
    let o = ns
        .command("iptables")
        .args([
            "-A",
            "INPUT",
            "-m",
            "conntrack",
            "--ctstate",
            "NEW,ESTABLISHED",
        ])
        .args(["-j", "ACCEPT"])
        .output();
    match o {
        Ok(o) if o.status.success() => {}
        other => {
            zcio_testnet::skip(test, &format!("iptables conntrack rule refused: {other:?}"));
            return None;
        }
    }
    let o = ns
        .command("sh")
        .args(["-c", "echo 1 > /proc/sys/net/netfilter/nf_conntrack_acct"])
        .output()
        .unwrap();
    assert!(o.status.success());
    Some(ns)
}

/// A process whose stdout lines are collected as they come.
struct Lines {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Lines {
    fn spawn(ns: &Netns, prog: &str, args: &[&str]) -> std::io::Result<Self> {
        let mut child = ns
            .command(prog)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let out = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = Arc::clone(&lines);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                l.lock().unwrap().push(line);
            }
        });
        Ok(Self {
            child,
            lines,
            reader: Some(reader),
        })
    }
    /// The first line naming the flow from `sport` to `dport` (text or JSON).
    fn find_flow(&self, sport: u16, dport: u16) -> Option<usize> {
        let text = format!("sport={sport} dport={dport} ");
        let json = format!("\"sport\":{sport},\"dport\":{dport}");
        self.lines
            .lock()
            .unwrap()
            .iter()
            .position(|l| l.contains(&text) || l.contains(&json))
    }
    fn signal(&self, sig: &str) {
        assert!(Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success());
    }
    /// SIGINT, then every line and the stderr text.
    fn stop(mut self) -> (Vec<String>, String) {
        self.signal("-INT");
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let lines = std::mem::take(&mut *self.lines.lock().unwrap());
        (lines, err)
    }
}

/// Makes UDP flows to `dport` until every one of `procs` printed one's line; returns the index
/// of that line in each.
fn sentinel(ns: &Netns, procs: &[&Lines], dport: u16) -> Vec<usize> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let port = ns
            .run(move || {
                let s = UdpSocket::bind("127.0.0.1:0").unwrap();
                s.send_to(b"s", ("127.0.0.1", dport)).unwrap();
                s.local_addr().unwrap().port()
            })
            .unwrap();
        let wait = Instant::now() + Duration::from_millis(500);
        while Instant::now() < wait {
            let found: Vec<Option<usize>> =
                procs.iter().map(|p| p.find_flow(port, dport)).collect();
            if found.iter().all(Option::is_some) {
                return found.into_iter().map(Option::unwrap).collect();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(Instant::now() < end, "no sentinel line for port {dport}");
    }
}

/// TCP connections and UDP exchanges inside the namespace.
fn script(ns: &Netns) {
    ns.run(|| {
        let l = TcpListener::bind("127.0.0.1:7200").unwrap();
        for _ in 0..5 {
            let mut c = TcpStream::connect("127.0.0.1:7200").unwrap();
            let (mut s, _) = l.accept().unwrap();
            c.write_all(b"hello").unwrap();
            let mut b = [0u8; 5];
            s.read_exact(&mut b).unwrap();
            drop(c);
            let _ = s.read(&mut b);
        }
        let srv = UdpSocket::bind("127.0.0.1:7201").unwrap();
        for _ in 0..5 {
            let c = UdpSocket::bind("127.0.0.1:0").unwrap();
            c.send_to(b"q", "127.0.0.1:7201").unwrap();
            let mut b = [0u8; 4];
            let (_, from) = srv.recv_from(&mut b).unwrap();
            srv.send_to(b"r", from).unwrap();
            c.recv(&mut b).unwrap();
        }
    })
    .unwrap();
}

#[test]
fn events_print_as_conntrack_prints_them_and_as_json() {
    let test = "events_print_as_conntrack_prints_them_and_as_json";
    let Some(ns) = host(test) else {
        return;
    };
    let ours = Lines::spawn(&ns, bin(), &["conntrack", "events"]).unwrap();
    let json = Lines::spawn(&ns, bin(), &["conntrack", "events", "--json"]).unwrap();
    let theirs = match Lines::spawn(&ns, "conntrack", &["-E"]) {
        Ok(t) => Some(t),
        Err(e) => {
            zcio_testnet::skip(test, &format!("conntrack not runnable: {e}"));
            None
        }
    };
    let mut procs = vec![&ours, &json];
    if let Some(t) = &theirs {
        procs.push(t);
    }
    let first = sentinel(&ns, &procs, 1);
    script(&ns);
    let last = sentinel(&ns, &procs, 2);
    let (o_lines, o_err) = ours.stop();
    let (j_lines, _) = json.stop();
    let o = &o_lines[first[0] + 1..last[0]];
    assert!(o.len() >= 5 * 6 + 5 * 2, "{o:#?}");
    assert!(o_err.contains("no loss"), "{o_err}");
    assert!(o_err.contains("flow events have been shown."), "{o_err}");
    // JSON: the same events, each line an object.
    let j = &j_lines[first[1] + 1..last[1]];
    assert_eq!(j.len(), o.len());
    for (line, text) in j.iter().zip(o) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let kind = v["type"].as_str().unwrap().to_uppercase();
        assert!(text.contains(&format!("[{kind}]")), "{line} vs {text}");
        let sport = v["orig"]["sport"].as_u64().unwrap();
        assert!(
            text.contains(&format!("sport={sport} ")),
            "{line} vs {text}"
        );
    }
    if let Some(t) = theirs {
        let (t_lines, _) = t.stop();
        let t = &t_lines[first[2] + 1..last[2]];
        assert_eq!(o, t, "zcio conntrack events vs conntrack -E");
    }
}

#[test]
fn lost_events_are_reported_with_their_count() {
    let test = "lost_events_are_reported_with_their_count";
    let Some(ns) = host(test) else {
        return;
    };
    let p = Lines::spawn(
        &ns,
        bin(),
        &["conntrack", "events", "-e", "NEW", "-B", "32"],
    )
    .unwrap();
    sentinel(&ns, &[&p], 1);
    // Stopped, it reads nothing: 2000 NEW events overflow its 32 KiB buffer.
    p.signal("-STOP");
    let flows = 2000u16;
    ns.run(move || {
        let srv = UdpSocket::bind("127.0.0.1:7202").unwrap();
        for i in 0..flows {
            let c = UdpSocket::bind(("127.0.0.1", 20_000 + i)).unwrap();
            c.send_to(b"x", "127.0.0.1:7202").unwrap();
        }
        drop(srv);
    })
    .unwrap();
    p.signal("-CONT");
    std::thread::sleep(Duration::from_millis(300));
    let (lines, err) = p.stop();
    let st: serde_json::Value = serde_json::from_str(
        err.lines()
            .find_map(|l| l.strip_prefix("zcio conntrack: stats "))
            .unwrap_or_else(|| panic!("{err}")),
    )
    .unwrap();
    let (events, lost) = (st["events"].as_u64().unwrap(), st["lost"].as_u64().unwrap());
    // The sentinel's event came before the stop.
    assert_eq!(events + lost, u64::from(flows) + 1, "{err}");
    assert!(lost > 0, "{err}");
    assert_eq!(lines.len() as u64, events);
    // Lost after the last event that arrived, and still counted exactly: the socket's drop
    // counter, read at the end, explains the overrun.
    assert_eq!(st["lost_exact"], true, "{err}");
    assert_eq!(st["lost_at_least"].as_u64(), Some(lost), "{err}");
    assert!(
        err.contains(&format!("LOSS: lost {lost} event(s), exactly")),
        "the summary names the count: {err}"
    );
}

#[test]
fn invalid_counts_and_durations_are_refused_with_one_error_line() {
    for (args, name) in [
        (vec!["-c", "0"], "-c"),
        (vec!["-B", "0"], "-B"),
        (vec!["--duration", "0"], "--duration"),
        (vec!["--duration=-2"], "--duration"),
        (vec!["--stats-interval", "inf"], "--stats-interval"),
    ] {
        let mut all = vec!["conntrack", "events"];
        all.extend(&args);
        common::refused_with_one_line(&all, name);
    }
}

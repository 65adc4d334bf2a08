//! `zcio perf server` against hostile clients, on loopback: garbage, stalls, resets, a
//! corrupted stream under `--verify`, too many connections, running out of descriptors. After
//! each, the server (a separate process) still answers an honest `zcio perf client`.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_zcio")
}

/// A server process on 127.0.0.1 and a free port; killed on drop. Keeps its log lines.
struct Server {
    child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// `zcio perf server -B 127.0.0.1 -p 0 ARGS`, optionally under `ulimit -n NOFILE`.
    fn start(args: &[&str], nofile: Option<u32>) -> Self {
        Self::start_on("127.0.0.1", args, nofile)
    }

    /// Like [`Server::start`], listening on `bind`.
    fn start_on(bind: &str, args: &[&str], nofile: Option<u32>) -> Self {
        let mut cmd = match nofile {
            Some(n) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(bin());
                c
            }
            None => Command::new(bin()),
        };
        let mut child = cmd
            .args(["perf", "server", "-B", bind, "-p", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the server");
        let (tx, rx) = mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let l2 = Arc::clone(&log);
        let err = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if l.contains("listening on") {
                    let _ = tx.send(l.clone());
                }
                l2.lock().unwrap().push(l);
            }
        });
        let first = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("server says where it listens");
        let addr = first
            .split("listening on ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {first}"));
        Server { child, addr, log }
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    fn logged(&self, what: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(what))
    }

    /// Waits up to 15 s for a log line containing `what`.
    fn wait_log(&self, what: &str) -> bool {
        let end = Instant::now() + Duration::from_secs(15);
        while Instant::now() < end {
            if self.logged(what) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// An honest client's test; panics unless it succeeds with both sides' figures.
    fn honest(&mut self, extra: &[&str]) -> Value {
        assert!(self.alive(), "server died");
        let port = self.addr.port().to_string();
        let o = Command::new(bin())
            .args([
                "perf",
                "client",
                "127.0.0.1",
                "-p",
                &port,
                "-t",
                "0.5",
                "--json",
            ])
            .args(extra)
            .output()
            .expect("client");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "honest client failed: {}\n{out}\nserver log: {:?}",
            String::from_utf8_lossy(&o.stderr),
            self.log.lock().unwrap()
        );
        let v: Value = serde_json::from_str(&out).expect("JSON");
        assert!(v["server"]["bytes"].as_u64().unwrap() > 0);
        assert_eq!(v["server"]["bytes"], v["client"]["bytes"]);
        v
    }

    fn cpu_seconds(&self) -> f64 {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let f: Vec<&str> = s[s.rfind(')').unwrap() + 2..].split_whitespace().collect();
        (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn frame(v: &Value) -> Vec<u8> {
    let body = serde_json::to_vec(v).unwrap();
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(&body);
    f
}

fn read_frame(s: &mut TcpStream) -> Value {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).expect("frame length");
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).expect("frame body");
    serde_json::from_slice(&body).expect("frame JSON")
}

fn params(reverse: bool, verify: bool, secs: u64) -> Value {
    json!({"control": {"version": 1, "params": {
        "udp": false, "streams": 1, "duration_ms": secs * 1000, "reverse": reverse,
        "len": 65536, "rate_bps": 0, "tx": "copy", "rx": "plain", "verify": verify,
        "depth": 16, "interval_ms": 0}}})
}

/// A hand-made client up to the start of its test: `(control, data stream)`.
fn raw_test(addr: SocketAddr, reverse: bool, verify: bool) -> (TcpStream, TcpStream) {
    raw_test_secs(addr, reverse, verify, 5)
}

fn raw_test_secs(
    addr: SocketAddr,
    reverse: bool,
    verify: bool,
    secs: u64,
) -> (TcpStream, TcpStream) {
    let mut ctl = TcpStream::connect(addr).unwrap();
    ctl.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    ctl.write_all(&frame(&params(reverse, verify, secs)))
        .unwrap();
    let ans = read_frame(&mut ctl);
    let cookie = ans["accept"]["cookie"]
        .as_str()
        .expect("accepted")
        .to_string();
    let mut data = TcpStream::connect(addr).unwrap();
    data.write_all(&frame(&json!({"data": {"cookie": cookie, "stream": 0}})))
        .unwrap();
    assert_eq!(read_frame(&mut ctl), json!("start"));
    (ctl, data)
}

#[test]
fn a_thousand_garbage_connections_do_not_stop_the_next_honest_client() {
    let mut srv = Server::start(&["--max-conns", "64", "--handshake-timeout", "2s"], None);
    let addr = srv.addr;
    let garbage: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        u32::MAX.to_be_bytes().to_vec(),
        [&8u32.to_be_bytes()[..], b"\xff\xfe{{{{{{"].concat(),
        [&20u32.to_be_bytes()[..], br#"{"data":{"cookie":1}}"#].concat(),
        frame(&json!({"data": {"cookie": "00".repeat(16), "stream": 4_000_000_000u64}})),
        frame(&json!({"control": {"version": 99, "params": {}}})),
        frame(&json!({"control": {"version": 1, "params": {"streams": -1}}})),
        vec![0u8; 5000],
        frame(&json!({"forged\nzcio perf server: all good\u{1b}[2J": 1})),
    ];
    let garbage = Arc::new(garbage);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let g = Arc::clone(&garbage);
            std::thread::spawn(move || {
                for i in 0..125 {
                    if let Ok(mut s) = TcpStream::connect(addr) {
                        let _ = s.write_all(&g[(t + i) % g.len()]);
                        let _ = s.shutdown(Shutdown::Write);
                        let mut sink = [0u8; 256];
                        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                        let _ = s.read(&mut sink);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(srv.alive());
    assert!(srv.logged("bad hello"), "{:?}", srv.log.lock().unwrap());
    // Log lines are rate-limited; past the burst, each kind is logged with its reason, and a
    // client of another protocol version or with bad parameters is told why.
    std::thread::sleep(Duration::from_millis(1100));
    for (g, log) in [
        (5, "unknown test cookie"),
        (6, "protocol version 99"),
        (7, "bad test parameters"),
    ] {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&garbage[g - 1]).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        if g > 5 {
            let ans = read_frame(&mut s);
            assert!(ans["refuse"]["reason"].is_string(), "{ans}");
        }
        assert!(srv.wait_log(log), "{log}: {:?}", srv.log.lock().unwrap());
    }
    // What a client sent is quoted with its control characters escaped: no forged lines.
    assert!(srv.logged("forged\\nzcio perf server: all good\\u{1b}[2J"));
    assert!(!srv.logged("\u{1b}"));
    assert!(!srv
        .log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.starts_with("zcio perf server: all good")));
    srv.honest(&[]);
}

#[test]
fn a_reverse_client_that_never_reads_is_dropped_after_the_idle_timeout() {
    // The idle timeout leaves room for a loaded machine (an honest client's first bytes can
    // take a second to come when every CPU is busy).
    let mut srv = Server::start(&["--idle-timeout", "3s"], None);
    // The server sends for 1 s into a client that reads nothing: its buffers fill, and it
    // gives up waiting for them within the idle timeout instead of holding a thread forever.
    let (ctl, data) = raw_test_secs(srv.addr, true, false, 1);
    let t0 = Instant::now();
    assert!(
        srv.wait_log("stream(s) sent"),
        "{:?}",
        srv.log.lock().unwrap()
    );
    assert!(
        t0.elapsed() < Duration::from_secs(8),
        "took {:?}",
        t0.elapsed()
    );
    srv.honest(&[]);
    drop((ctl, data));
}

#[test]
fn a_stalled_client_is_dropped_after_the_handshake_timeout_and_blocks_nobody() {
    let mut srv = Server::start(&["--handshake-timeout", "1s"], None);
    let mut silent = TcpStream::connect(srv.addr).unwrap();
    let mut half = TcpStream::connect(srv.addr).unwrap();
    half.write_all(&100u32.to_be_bytes()).unwrap();
    half.write_all(b"{\"control\":").unwrap();
    // A test whose streams never come.
    let mut lonely = TcpStream::connect(srv.addr).unwrap();
    lonely.write_all(&frame(&params(false, false, 5))).unwrap();
    // While those stall, an honest client is served.
    srv.honest(&[]);
    for s in [&mut silent, &mut half] {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let t0 = Instant::now();
        let mut b = [0u8; 16];
        assert_eq!(s.read(&mut b).unwrap_or(0), 0, "server should close it");
        assert!(t0.elapsed() < Duration::from_secs(4));
    }
    lonely
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert!(read_frame(&mut lonely)["accept"].is_object());
    let abort = read_frame(&mut lonely);
    assert!(
        abort["abort"]["reason"]
            .as_str()
            .unwrap()
            .contains("0 of 1 streams attached"),
        "{abort}"
    );
    assert!(srv.wait_log("bad hello"));
    srv.honest(&[]);
}

#[test]
fn a_client_that_resets_mid_stream_ends_only_its_own_test() {
    let mut srv = Server::start(&["--idle-timeout", "5s"], None);
    // -R: the server sends; the client reads a little and resets both connections (closing
    // a socket with unread data makes the kernel send RST).
    let (ctl, mut data) = raw_test(srv.addr, true, false);
    let mut b = vec![0u8; 4096];
    data.read_exact(&mut b).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    drop(data);
    drop(ctl);
    // Forward: the client sends a little, never reads the server's "start", and closes: the
    // unread message makes the kernel reset the control connection mid-test.
    let mut ctl = TcpStream::connect(srv.addr).unwrap();
    ctl.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    ctl.write_all(&frame(&params(false, false, 5))).unwrap();
    let cookie = read_frame(&mut ctl)["accept"]["cookie"]
        .as_str()
        .unwrap()
        .to_string();
    let mut data = TcpStream::connect(srv.addr).unwrap();
    data.write_all(&frame(&json!({"data": {"cookie": cookie, "stream": 0}})))
        .unwrap();
    data.write_all(&[0u8; 10000]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(ctl);
    assert!(
        srv.wait_log("control connection"),
        "{:?}",
        srv.log.lock().unwrap()
    );
    drop(data);
    assert!(srv.wait_log("stream 0:"), "{:?}", srv.log.lock().unwrap());
    assert!(srv.alive());
    srv.honest(&[]);
    srv.honest(&["-R"]);
}

#[test]
fn a_corrupted_stream_under_verify_is_dropped_and_the_next_client_is_served() {
    let mut srv = Server::start(&["--verify"], None);
    let (mut ctl, mut data) = raw_test(srv.addr, false, true);
    // Not the pattern: the server stops at the first wrong byte.
    let _ = data.write_all(&vec![0x55u8; 1 << 20]);
    drop(data);
    ctl.write_all(&frame(&json!({"results": {}}))).ok();
    assert!(
        srv.wait_log("corrupt at offset"),
        "{:?}",
        srv.log.lock().unwrap()
    );
    drop(ctl);
    // Without --verify on the client the server refuses, and says why.
    let port = srv.addr.port().to_string();
    let o = Command::new(bin())
        .args(["perf", "client", "127.0.0.1", "-p", &port, "-t", "0.3"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--verify"));
    let v = srv.honest(&["--verify"]);
    assert_eq!(v["server"]["streams"][0]["verified"], true);
    assert!(v["server"]["streams"][0]["corrupt_at"].is_null());
}

#[test]
fn connections_over_the_limit_are_closed_at_accept() {
    let mut srv = Server::start(&["--max-conns", "4", "--handshake-timeout", "6s"], None);
    let held: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(srv.addr).unwrap())
        .collect();
    // Room for a loaded machine to accept the four before the fifth comes.
    std::thread::sleep(Duration::from_millis(1000));
    let mut extra = TcpStream::connect(srv.addr).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let t0 = Instant::now();
    let mut b = [0u8; 4];
    assert_eq!(extra.read(&mut b).unwrap_or(0), 0);
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "closed at accept, not by the handshake timeout"
    );
    assert!(srv.wait_log("--max-conns"));
    // Closing them frees their slots (their hello threads see EOF).
    drop(held);
    std::thread::sleep(Duration::from_secs(2));
    srv.honest(&[]);
}

#[test]
fn running_out_of_descriptors_backs_off_instead_of_spinning() {
    // 40 descriptors: the server's own few plus ~30 connections, then EMFILE.
    let mut srv = Server::start(
        &["--max-conns", "10000", "--handshake-timeout", "4s"],
        Some(40),
    );
    let held: Vec<TcpStream> = (0..60)
        .filter_map(|_| TcpStream::connect(srv.addr).ok())
        .collect();
    assert!(srv.wait_log("backing off"), "{:?}", srv.log.lock().unwrap());
    let cpu0 = srv.cpu_seconds();
    std::thread::sleep(Duration::from_secs(1));
    let spent = srv.cpu_seconds() - cpu0;
    assert!(
        spent < 0.3,
        "server used {spent} CPU s in 1 s while out of descriptors"
    );
    drop(held);
    std::thread::sleep(Duration::from_millis(4500));
    assert!(srv.alive());
    srv.honest(&[]);
}

#[test]
fn streams_from_another_host_than_the_control_connection_are_refused() {
    // Listening on every address (dual-stack): control from 127.0.0.1, the data stream with
    // the right cookie from ::1 (another source address, as another host would be).
    let mut srv = Server::start_on("::", &["--handshake-timeout", "2s"], None);
    let v4: SocketAddr = ([127, 0, 0, 1], srv.addr.port()).into();
    let v6: SocketAddr = (std::net::Ipv6Addr::LOCALHOST, srv.addr.port()).into();
    let mut ctl = TcpStream::connect(v4).unwrap();
    ctl.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    ctl.write_all(&frame(&params(false, false, 5))).unwrap();
    let cookie = read_frame(&mut ctl)["accept"]["cookie"]
        .as_str()
        .unwrap()
        .to_string();
    let mut other = TcpStream::connect(v6).unwrap();
    other
        .write_all(&frame(&json!({"data": {"cookie": cookie, "stream": 0}})))
        .unwrap();
    assert!(
        srv.wait_log("from another host"),
        "{:?}",
        srv.log.lock().unwrap()
    );
    let abort = read_frame(&mut ctl);
    assert!(abort["abort"].is_object(), "{abort}");
    // UDP: the hello with the right cookie comes from 127.0.0.2; it is ignored, and the test
    // ends for want of its stream.
    let mut ctl = TcpStream::connect(v4).unwrap();
    ctl.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut p = params(false, false, 1);
    p["control"]["params"]["udp"] = json!(true);
    ctl.write_all(&frame(&p)).unwrap();
    let ans = read_frame(&mut ctl);
    let cookie = ans["accept"]["cookie"].as_str().unwrap();
    let port = ans["accept"]["udp_ports"][0].as_u64().unwrap() as u16;
    let mut hello = b"ZCIOUDP1".to_vec();
    for i in 0..16 {
        hello.push(u8::from_str_radix(&cookie[2 * i..2 * i + 2], 16).unwrap());
    }
    hello.extend_from_slice(&0u32.to_be_bytes());
    let u = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
    for _ in 0..5 {
        u.send_to(&hello, ("127.0.0.1", port)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    let abort = read_frame(&mut ctl);
    assert!(
        abort["abort"]["reason"]
            .as_str()
            .unwrap()
            .contains("no hello"),
        "{abort}"
    );
    srv.honest(&[]);
    srv.honest(&["-u", "-b", "10M"]);
}

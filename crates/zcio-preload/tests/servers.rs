//! More unmodified event-loop servers under the shim, each on a different loop: memcached
//! (libevent, one loop per worker thread), lighttpd (its own loop, `epoll_create1`), haproxy
//! (its own loop, one poller per thread). Each answers byte-identical responses natively and
//! under the shim, and the shim's stats show it served the waits from the ring.

mod common;

use common::{free_port, shim_path, shimmed, stats_sum, tool, Preload, Server, TempDir};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Sends `req` on a fresh connection and reads until `done(bytes)` or the peer closes.
fn exchange(port: u16, req: &[u8], done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req).expect("send");
    let mut out = Vec::new();
    let mut b = [0u8; 65536];
    while !done(&out) {
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&b[..n]),
            Err(e) => panic!("read: {e}; got {:?}", String::from_utf8_lossy(&out)),
        }
    }
    out
}

fn assert_ring_served(stats: &Path, log: &str) {
    let text = std::fs::read_to_string(stats).unwrap_or_default();
    assert!(
        log.contains("served by the event ring"),
        "shim inactive:\n{log}"
    );
    assert!(
        stats_sum(stats, "ring_waits") > 0 && stats_sum(stats, "ring_events") > 0,
        "no ring-served waits: {text}\n{log}"
    );
}

// --- memcached (libevent) ---------------------------------------------------------------

fn memcached(bin: &Path, pre: &Preload) -> Server {
    let dir = TempDir::new("memcached");
    let port = free_port();
    let mut cmd = Command::new(bin);
    cmd.args([
        "-l",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "0",
        "-t",
        "2",
    ])
    .args(["-u", "nobody", "-m", "64"]);
    pre.apply(&mut cmd);
    let log = dir.path().join("stderr.log");
    let mut s = Server::spawn_with(cmd, libc::SIGTERM, port, dir, log);
    s.wait_ready(|p| TcpStream::connect(("127.0.0.1", p)).is_ok());
    s
}

fn memcached_session(port: u16, c: usize) -> Vec<u8> {
    let mut req = Vec::new();
    for i in 0..500 {
        let v = format!("value-{}-{}", i, "x".repeat(i % 97));
        write!(req, "set c{c}:{i} {i} 0 {}\r\n{v}\r\n", v.len()).unwrap();
    }
    for i in (0..500).step_by(7) {
        write!(req, "get c{c}:{i}\r\n").unwrap();
    }
    write!(
        req,
        "incr nokey 1\r\ndelete c{c}:3\r\nget c{c}:3 c{c}:4\r\nquit\r\n"
    )
    .unwrap();
    exchange(port, &req, |_| false)
}

#[test]
fn memcached_answers_byte_identically_from_the_event_ring() {
    let test = "memcached_answers_byte_identically_from_the_event_ring";
    let Some(bin) = tool(test, "memcached") else {
        return;
    };
    let mut native = memcached(&bin, &Preload::default());
    let want: Vec<Vec<u8>> = (0..4).map(|c| memcached_session(native.port, c)).collect();
    native.stop();
    assert!(
        want[0].ends_with(b"END\r\n"),
        "{}",
        String::from_utf8_lossy(&want[0])
    );
    let dir = TempDir::new("memcached-stats");
    let (pre, stats) = shimmed(&dir);
    let mut server = memcached(&bin, &pre);
    // Several clients at once, each with its own keys.
    let port = server.port;
    let got: Vec<Vec<u8>> = (0..4)
        .map(|c| std::thread::spawn(move || memcached_session(port, c)))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().expect("client"))
        .collect();
    let log = server.output();
    assert!(server.stop(), "memcached did not stop: {log}");
    for (g, w) in got.iter().zip(&want) {
        assert!(g == w, "reply differs:\n{}", String::from_utf8_lossy(g));
    }
    assert_ring_served(&stats, &server.output());
    // memcached creates each worker's event base (its epoll instance) on the main thread and
    // waits on it only from the worker: the worker's waits must be the ring's too, not the
    // real epoll_wait a non-owner thread gets.
    assert_eq!(
        stats_sum(&stats, "real_waits"),
        0,
        "worker waits went to the real epoll: {}",
        std::fs::read_to_string(&stats).unwrap_or_default()
    );
}

/// One connection, one request in flight (a `set` and a `get` of each key, each awaited):
/// every wait of the worker that serves it returns about one event.
fn memcached_one_at_a_time(port: u16, n: usize) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut transcript = Vec::new();
    let mut b = [0u8; 4096];
    for i in 0..n {
        let v = format!("v{i}-{}", "y".repeat(i % 50));
        for (req, end) in [
            (
                format!("set k{i} {i} 0 {}\r\n{v}\r\n", v.len()),
                &b"STORED\r\n"[..],
            ),
            (format!("get k{i}\r\n"), &b"END\r\n"[..]),
        ] {
            s.write_all(req.as_bytes()).expect("send");
            let start = transcript.len();
            while !transcript[start..].ends_with(end) {
                match s.read(&mut b) {
                    Ok(0) => panic!("memcached closed the connection"),
                    Ok(k) => transcript.extend_from_slice(&b[..k]),
                    Err(e) => panic!("read: {e}"),
                }
            }
        }
    }
    transcript
}

#[test]
fn memcached_worker_serving_one_request_at_a_time_is_handed_to_the_real_epoll() {
    let test = "memcached_worker_serving_one_request_at_a_time_is_handed_to_the_real_epoll";
    let Some(bin) = tool(test, "memcached") else {
        return;
    };
    let mut native = memcached(&bin, &Preload::default());
    let want = memcached_one_at_a_time(native.port, 600);
    native.stop();
    let dir = TempDir::new("memcached-handed");
    let (pre, stats) = shimmed(&dir);
    let mut server = memcached(&bin, &pre);
    let got = memcached_one_at_a_time(server.port, 600);
    let log = server.output();
    assert!(server.stop(), "memcached did not stop: {log}");
    assert!(
        got == want,
        "replies differ:\n{}",
        String::from_utf8_lossy(&got)
    );
    let log = server.output();
    let text = std::fs::read_to_string(&stats).unwrap_or_default();
    // The worker's instance (made by the main thread, waited on by the worker) went to the
    // real epoll after two windows of ring waits with one event each, with its reason; the
    // idle worker and the listener's loop stayed on the ring.
    assert_eq!(stats_sum(&stats, "handed"), 1, "{text}\n{log}");
    assert!(
        log.contains("handed to the real epoll"),
        "hand-over not logged:\n{log}"
    );
    assert!(stats_sum(&stats, "handed_waits") > 600, "{text}");
    assert!(stats_sum(&stats, "ring_waits") >= 256, "{text}");
    assert_eq!(stats_sum(&stats, "real_waits"), 0, "{text}");
}

// --- lighttpd (own loop) ----------------------------------------------------------------

fn lighttpd(bin: &Path, files: &[(&str, &[u8])], pre: &Preload) -> Server {
    let dir = TempDir::new("lighttpd");
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    for (n, b) in files {
        std::fs::write(root.join(n), b).unwrap();
    }
    let port = free_port();
    let conf = format!(
        "server.document-root = \"{}\"\nserver.port = {port}\nserver.bind = \"127.0.0.1\"\n\
         server.event-handler = \"linux-sysepoll\"\nserver.errorlog = \"{}/error.log\"\n\
         server.max-keep-alive-requests = 1000\nserver.tag = \"lighttpd\"\n",
        root.display(),
        dir.path().display()
    );
    std::fs::write(dir.path().join("lighttpd.conf"), conf).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("-D")
        .arg("-f")
        .arg(dir.path().join("lighttpd.conf"));
    pre.apply(&mut cmd);
    let log = dir.path().join("stderr.log");
    let mut s = Server::spawn_with(cmd, libc::SIGTERM, port, dir, log);
    s.wait_ready(|p| common::http_get(p, "/small").is_some());
    s
}

fn bodies(port: u16) -> Vec<(String, Vec<u8>)> {
    ["/small", "/big", "/missing", "/small", "/big"]
        .iter()
        .map(|p| common::http_get(port, p).expect("answer"))
        .collect()
}

fn files() -> Vec<(&'static str, Vec<u8>)> {
    let big: Vec<u8> = (0..3 << 20).map(|i: u32| (i * 31 % 251) as u8).collect();
    vec![("small", b"hello from the ring\n".to_vec()), ("big", big)]
}

#[test]
fn lighttpd_serves_byte_identical_files_from_the_event_ring() {
    let test = "lighttpd_serves_byte_identical_files_from_the_event_ring";
    let Some(bin) = tool(test, "lighttpd") else {
        return;
    };
    let f = files();
    let fr: Vec<(&str, &[u8])> = f.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    let mut native = lighttpd(&bin, &fr, &Preload::default());
    let want = bodies(native.port);
    native.stop();
    assert_eq!(want[1].1, f[1].1);
    let dir = TempDir::new("lighttpd-stats");
    let (pre, stats) = shimmed(&dir);
    let mut server = lighttpd(&bin, &fr, &pre);
    let got = bodies(server.port);
    let log = server.output();
    assert!(server.stop(), "lighttpd did not stop: {log}");
    assert!(got == want, "responses differ");
    assert_ring_served(&stats, &server.output());
}

// --- haproxy (own loop, threads) ----------------------------------------------------------

fn haproxy(bin: &Path, pre: &Preload) -> Server {
    let dir = TempDir::new("haproxy");
    let port = free_port();
    let conf = format!(
        "global\n  nbthread 2\ndefaults\n  mode http\n  timeout client 10s\n  timeout connect 5s\n  \
         timeout server 10s\nfrontend fe\n  bind 127.0.0.1:{port}\n  \
         http-request return status 200 content-type text/plain string \"hello from haproxy\" if {{ path /hello }}\n  \
         http-request return status 404 content-type text/plain string \"nothing here\"\n"
    );
    std::fs::write(dir.path().join("haproxy.cfg"), conf).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("-db").arg("-f").arg(dir.path().join("haproxy.cfg"));
    pre.apply(&mut cmd);
    let log = dir.path().join("stderr.log");
    let mut s = Server::spawn_with(cmd, libc::SIGUSR1, port, dir, log);
    s.wait_ready(|p| common::http_get(p, "/hello").is_some());
    s
}

fn haproxy_session(port: u16) -> Vec<u8> {
    // Keep-alive: three requests on one connection, read until the third body.
    let req = b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /no HTTP/1.1\r\nHost: x\r\n\r\n\
                GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    exchange(port, req, |_| false)
}

#[test]
fn haproxy_answers_byte_identically_from_the_event_ring() {
    let test = "haproxy_answers_byte_identically_from_the_event_ring";
    let Some(bin) = tool(test, "haproxy") else {
        return;
    };
    let mut native = haproxy(&bin, &Preload::default());
    let want = haproxy_session(native.port);
    native.stop();
    assert!(
        String::from_utf8_lossy(&want)
            .matches("hello from haproxy")
            .count()
            == 2,
        "{}",
        String::from_utf8_lossy(&want)
    );
    let dir = TempDir::new("haproxy-stats");
    let (pre, stats) = shimmed(&dir);
    let mut server = haproxy(&bin, &pre);
    for _ in 0..20 {
        let got = haproxy_session(server.port);
        assert!(
            got == want,
            "reply differs:\n{}",
            String::from_utf8_lossy(&got)
        );
    }
    let log = server.output();
    assert!(server.stop(), "haproxy did not stop: {log}");
    assert_ring_served(&stats, &server.output());
}

#[test]
fn the_servers_answer_the_same_when_io_uring_is_unavailable() {
    let test = "the_servers_answer_the_same_when_io_uring_is_unavailable";
    let (Some(mc), Some(lt), Some(hp)) = (
        tool(test, "memcached"),
        tool(test, "lighttpd"),
        tool(test, "haproxy"),
    ) else {
        return;
    };
    let f = files();
    let run = |pre: Preload| {
        let fr: Vec<(&str, &[u8])> = f.iter().map(|(n, b)| (*n, b.as_slice())).collect();
        let mut m = memcached(&mc, &pre);
        let a = memcached_session(m.port, 0);
        let ml = m.output();
        m.stop();
        let mut l = lighttpd(&lt, &fr, &pre);
        let b = bodies(l.port);
        let ll = l.output();
        l.stop();
        let mut h = haproxy(&hp, &pre);
        let c = haproxy_session(h.port);
        let hl = h.output();
        h.stop();
        (a, b, c, format!("{ml}{ll}{hl}"))
    };
    let native = run(Preload::default());
    let pre = Preload {
        shim: Some(shim_path()),
        stats: None,
        log: true,
    };
    // io_uring_setup fails with ENOSYS for the servers (seccomp filters are inherited):
    // every instance falls back to the real epoll.
    let shimmed = std::thread::scope(|s| {
        s.spawn(|| {
            zcio_testnet::seccomp::deny_syscall_in_this_thread(
                libc::SYS_io_uring_setup,
                libc::ENOSYS,
            )
            .expect("install seccomp filter");
            run(pre)
        })
        .join()
        .expect("server thread")
    });
    assert!(shimmed.0 == native.0, "memcached differs");
    assert!(shimmed.1 == native.1, "lighttpd differs");
    assert!(shimmed.2 == native.2, "haproxy differs");
    assert!(
        shimmed.3.contains("event ring unavailable"),
        "{}",
        shimmed.3
    );
    assert!(
        !shimmed.3.contains("served by the event ring"),
        "{}",
        shimmed.3
    );
}

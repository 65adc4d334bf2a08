//! The tokio file server (zcio `Sender`/`Receiver` and the tokio `TcpStream` baseline):
//! `curl` downloads a file byte-identical, a missing file is a 404, `wrk` runs without
//! errors.

use std::net::SocketAddr;
use std::process::Command;
use zcio_examples::fileserver::{FileServer, FileServerConfig, Io};
use zcio_testnet::tempdir::TempDir;

/// 8 MiB + 123 bytes of a non-repeating pattern (a chunk-size multiple plus a tail).
fn make_file(dir: &TempDir) -> Vec<u8> {
    let len = (8 << 20) + 123;
    let data: Vec<u8> = (0..len as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("big.bin"), &data).unwrap();
    data
}

fn tool(test: &str, name: &str) -> bool {
    let ok = Command::new(name).arg("--version").output().is_ok();
    ok || zcio_testnet::skip(test, &format!("{name} not installed (scripts/deps)"))
}

fn start(io: Io, dir: &TempDir) -> FileServer {
    let cfg = FileServerConfig::new(io, dir.path());
    FileServer::start(cfg, "127.0.0.1:0".parse::<SocketAddr>().unwrap()).unwrap()
}

fn curl_downloads_byte_identical(test: &str, io: Io) {
    if !tool(test, "curl") {
        return;
    }
    let dir = TempDir::new("fsrv").unwrap();
    let data = make_file(&dir);
    let srv = start(io, &dir);
    let url = format!("http://{}/big.bin", srv.addr);
    // Twice on one connection (keep-alive), then once more on a new one.
    let out = Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "60", &url, &url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout.len(), 2 * data.len());
    assert!(
        out.stdout[..data.len()] == data[..],
        "first download differs"
    );
    assert!(
        out.stdout[data.len()..] == data[..],
        "second download differs"
    );
    let missing = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("http://{}/nope.bin", srv.addr))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&missing.stdout), "404");
    let stats = srv.stop().unwrap();
    assert_eq!(stats.errors.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(
        stats.responses.load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    if io == Io::Zcio {
        println!(
            "{test}: tx path {}, rx path {}",
            stats.tx_path.lock().unwrap(),
            stats.rx_path.lock().unwrap()
        );
    }
}

#[test]
fn curl_downloads_a_file_byte_identical_through_zcio() {
    curl_downloads_byte_identical(
        "curl_downloads_a_file_byte_identical_through_zcio",
        Io::Zcio,
    );
}

#[test]
fn curl_downloads_a_file_byte_identical_through_tokio() {
    curl_downloads_byte_identical(
        "curl_downloads_a_file_byte_identical_through_tokio",
        Io::Tokio,
    );
}

fn wrk_runs_without_errors(test: &str, io: Io) {
    if !tool(test, "wrk") {
        return;
    }
    let dir = TempDir::new("fsrv").unwrap();
    make_file(&dir);
    let srv = start(io, &dir);
    let out = Command::new("wrk")
        .args(["-t", "2", "-c", "4", "-d", "2s", "--timeout", "10s"])
        .arg(format!("http://{}/big.bin", srv.addr))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "wrk: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("Socket errors"), "{text}");
    assert!(!text.contains("Non-2xx"), "{text}");
    let reqs: u64 = text
        .lines()
        .find_map(|l| {
            l.trim()
                .split_once(" requests in ")
                .map(|(n, _)| n.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no request count in {text}"));
    assert!(reqs > 0, "{text}");
    let stats = srv.stop().unwrap();
    assert_eq!(
        stats.errors.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "{text}"
    );
    println!("{test}: {text}");
}

#[test]
fn wrk_runs_without_errors_against_zcio() {
    wrk_runs_without_errors("wrk_runs_without_errors_against_zcio", Io::Zcio);
}

#[test]
fn wrk_runs_without_errors_against_tokio() {
    wrk_runs_without_errors("wrk_runs_without_errors_against_tokio", Io::Tokio);
}

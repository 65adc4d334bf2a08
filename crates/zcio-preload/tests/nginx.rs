//! Unmodified nginx (master + workers) serves a file to curl under the shim, with its epoll
//! calls answered from the event ring.

mod common;

use common::{shim_path, stats_sum, tool, Preload, TempDir};
use std::process::Command;

fn body(len: usize) -> Vec<u8> {
    (0..len).map(|i| b'a' + (i * 7 % 26) as u8).collect()
}

#[test]
fn nginx_serves_files_to_curl_from_the_event_ring() {
    let test = "nginx_serves_files_to_curl_from_the_event_ring";
    let (Some(nginx), Some(curl)) = (tool(test, "nginx"), tool(test, "curl")) else {
        return;
    };
    let small = body(1000);
    let big = body(3 << 20);
    let stats_dir = TempDir::new("nginx-stats");
    let stats = stats_dir.path().join("stats");
    let pre = Preload {
        shim: Some(shim_path()),
        stats: Some(stats.clone()),
        log: true,
    };
    let mut server = common::nginx(&nginx, 2, &[("small.txt", &small), ("big.bin", &big)], &pre);
    let url = |p: &str| format!("http://127.0.0.1:{}/{p}", server.port);
    // Several requests over one keep-alive connection, and fresh connections.
    for _ in 0..3 {
        let out = Command::new(&curl)
            .args(["-sS", "--fail", "--max-time", "10"])
            .arg(url("small.txt"))
            .arg(url("big.bin"))
            .arg(url("small.txt"))
            .output()
            .expect("run curl");
        assert!(
            out.status.success(),
            "curl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want: Vec<u8> = [&small[..], &big[..], &small[..]].concat();
        assert!(
            out.stdout == want,
            "body differs ({} bytes)",
            out.stdout.len()
        );
    }
    let (status, _) = common::http_get(server.port, "/missing").expect("404 answer");
    assert!(status.contains("404"), "{status}");
    let log = server.output();
    assert!(server.stop(), "nginx did not stop on SIGQUIT: {log}");
    assert!(
        log.contains("served by the event ring"),
        "shim inactive:\n{log}"
    );
    assert!(
        stats_sum(&stats, "ring_waits") > 0 && stats_sum(&stats, "ring_events") > 0,
        "no ring-served waits: {:?}\n{log}",
        std::fs::read_to_string(&stats)
    );
    let errors = std::fs::read_to_string(server.dir.path().join("error.log")).unwrap_or_default();
    assert!(
        !errors.contains("[alert]") && !errors.contains("[crit]") && !errors.contains("[emerg]"),
        "nginx error log:\n{errors}"
    );
}

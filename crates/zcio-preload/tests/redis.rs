//! Unmodified redis-server answers redis-cli under the shim, its event loop on the ring.

mod common;

use common::{shim_path, stats_sum, tool, Preload, TempDir};
use std::io::Write;
use std::process::{Command, Stdio};

#[test]
fn redis_answers_redis_cli_from_the_event_ring() {
    let test = "redis_answers_redis_cli_from_the_event_ring";
    let (Some(redis), Some(cli)) = (tool(test, "redis-server"), tool(test, "redis-cli")) else {
        return;
    };
    let stats_dir = TempDir::new("redis-stats");
    let stats = stats_dir.path().join("stats");
    let pre = Preload {
        shim: Some(shim_path()),
        stats: Some(stats.clone()),
        log: true,
    };
    let mut server = common::redis(&redis, &pre);
    let port = server.port.to_string();
    let cli_run = |args: &[&str]| -> String {
        let out = Command::new(&cli)
            .args(["-h", "127.0.0.1", "-p", &port])
            .args(args)
            .output()
            .expect("run redis-cli");
        assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(cli_run(&["SET", "greeting", "hello ring"]), "OK");
    assert_eq!(cli_run(&["GET", "greeting"]), "hello ring");
    // Many keys through one pipelined connection.
    let n = 5000;
    let mut child = Command::new(&cli)
        .args(["-h", "127.0.0.1", "-p", &port, "--pipe"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli --pipe");
    {
        let mut w = child.stdin.take().expect("stdin");
        let mut buf = Vec::new();
        for i in 0..n {
            let (k, v) = (format!("key:{i}"), format!("value-{}", i * 31));
            write!(
                buf,
                "*3\r\n$3\r\nSET\r\n${}\r\n{k}\r\n${}\r\n{v}\r\n",
                k.len(),
                v.len()
            )
            .unwrap();
        }
        w.write_all(&buf).expect("pipe keys");
    }
    let out = child.wait_with_output().expect("redis-cli --pipe");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(&format!("replies: {n}")),
        "{text}"
    );
    assert_eq!(cli_run(&["DBSIZE"]), (n + 1).to_string());
    for i in [0, 1, 777, n - 1] {
        assert_eq!(
            cli_run(&["GET", &format!("key:{i}")]),
            format!("value-{}", i * 31)
        );
    }
    // Several clients at once.
    let bench = tool(test, "redis-benchmark");
    if let Some(b) = bench {
        let out = Command::new(b)
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-c",
                "8",
                "-n",
                "2000",
                "-t",
                "set,get",
                "-q",
            ])
            .output()
            .expect("redis-benchmark");
        assert!(out.status.success(), "{out:?}");
    }
    let log = server.output();
    assert!(server.stop(), "redis did not stop on SIGTERM: {log}");
    assert!(
        log.contains("served by the event ring"),
        "shim inactive:\n{log}"
    );
    assert!(
        stats_sum(&stats, "ring_waits") > 0 && stats_sum(&stats, "ring_events") > n as u64 / 100,
        "no ring-served waits: {:?}",
        std::fs::read_to_string(&stats)
    );
}

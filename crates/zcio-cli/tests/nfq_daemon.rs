//! `zcio nfq` as a process: filters by port inside a namespace with a real NFQUEUE rule, and
//! on SIGTERM decides every pending packet and unbinds.

use std::io::Read;
use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use zcio::netlink::kernel_queue_stats;
use zcio_testnet::Netns;

#[test]
fn nfq_daemon_filters_and_shuts_down_cleanly() {
    if !zcio_testnet::can_make_hosts("nfq_daemon_filters_and_shuts_down_cleanly") {
        return;
    }
    let ns = Netns::new("nfqd").unwrap();
    let o = ns
        .command("iptables")
        .args([
            "-A",
            "INPUT",
            "-p",
            "udp",
            "-j",
            "NFQUEUE",
            "--queue-num",
            "40",
        ])
        .output();
    match o {
        Ok(o) if o.status.success() => {}
        other => {
            zcio_testnet::skip(
                "nfq_daemon_filters_and_shuts_down_cleanly",
                &format!("iptables NFQUEUE rule not possible: {other:?}"),
            );
            return;
        }
    }
    let mut child = ns
        .command(env!("CARGO_BIN_EXE_zcio"))
        .args([
            "nfq",
            "--queue",
            "40",
            "--drop-udp-port",
            "5001",
            "--stats-interval",
            "0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let bound = ns
        .run(|| {
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end {
                if kernel_queue_stats().unwrap().iter().any(|k| k.queue == 40) {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            false
        })
        .unwrap();
    assert!(bound, "zcio nfq did not bind queue 40");
    let (kept, dropped) = ns
        .run(|| {
            let keep = UdpSocket::bind("127.0.0.1:5000").unwrap();
            let drop = UdpSocket::bind("127.0.0.1:5001").unwrap();
            for s in [&keep, &drop] {
                s.set_read_timeout(Some(Duration::from_millis(300)))
                    .unwrap();
            }
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            for i in 0..200u32 {
                tx.send_to(&i.to_be_bytes(), "127.0.0.1:5000").unwrap();
                tx.send_to(&i.to_be_bytes(), "127.0.0.1:5001").unwrap();
            }
            let count = |s: &UdpSocket| {
                let mut b = [0u8; 16];
                let mut n = 0;
                while s.recv(&mut b).is_ok() {
                    n += 1;
                }
                n
            };
            (count(&keep), count(&drop))
        })
        .unwrap();
    assert_eq!((kept, dropped), (200, 0));
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let end = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < end, "zcio nfq did not exit on SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "exit {status}: {err}");
    assert!(err.contains("signal 15"), "{err}");
    let stats: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(stats["received"], 400, "{out}");
    assert_eq!(stats["accepted"], 200);
    assert_eq!(stats["dropped"], 200);
    assert_eq!(stats["kernel_errors"], 0);
    let left = ns.run(|| kernel_queue_stats().unwrap()).unwrap();
    assert!(
        !left.iter().any(|k| k.queue == 40),
        "queue still bound: {left:?}"
    );
}

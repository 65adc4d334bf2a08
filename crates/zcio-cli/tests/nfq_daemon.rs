//! `zcio nfq` as a process: filters by port inside a namespace with a real NFQUEUE rule, and
//! on SIGTERM decides every pending packet and unbinds.

mod common;

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
    assert_eq!((kept, dropped), (200, 0), "daemon said: {out}{err}");
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

#[test]
fn nfq_daemon_exits_within_200ms_of_sigterm_while_its_queue_is_kept_full() {
    let test = "nfq_daemon_exits_within_200ms_of_sigterm_while_its_queue_is_kept_full";
    if !zcio_testnet::can_make_hosts(test) {
        return;
    }
    let ns = Netns::new("nfqt").unwrap();
    let o = ns
        .command("iptables")
        .args(["-A", "INPUT", "-p", "udp", "--dport", "5002"])
        .args(["-j", "NFQUEUE", "--queue-num", "41"])
        .output();
    match o {
        Ok(o) if o.status.success() => {}
        other => {
            zcio_testnet::skip(
                test,
                &format!("iptables NFQUEUE rule not possible: {other:?}"),
            );
            return;
        }
    }
    let mut child = ns
        .command(env!("CARGO_BIN_EXE_zcio"))
        .args(["nfq", "--queue", "41", "--max-len", "256"])
        .args(["--stats-interval", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    // A sender in the namespace that keeps the queue full until told to stop.
    let sender = ns
        .spawn(move || {
            let rx = UdpSocket::bind("127.0.0.1:5002").unwrap();
            rx.set_nonblocking(true).unwrap();
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut b = [0u8; 64];
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                for _ in 0..64 {
                    let _ = tx.send_to(&[0u8; 64], "127.0.0.1:5002");
                }
                while rx.recv(&mut b).is_ok() {}
            }
        })
        .unwrap();
    // Wait until the queue is bound and overflowing (the kernel drops for a full queue).
    let full = ns
        .run(|| {
            let end = Instant::now() + Duration::from_secs(10);
            while Instant::now() < end {
                let k = kernel_queue_stats().unwrap();
                if let Some(k) = k.iter().find(|k| k.queue == 41) {
                    if k.queue_dropped > 1000 {
                        return true;
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            false
        })
        .unwrap();
    assert!(full, "the sender did not keep queue 41 full");
    let t0 = Instant::now();
    // SAFETY: sending a signal to our own child process.
    let rc = unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "zcio nfq did not exit on SIGTERM under load"
        );
        std::thread::sleep(Duration::from_micros(500));
    };
    let took = t0.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sender.join().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "exit {status}: {err}");
    assert!(err.contains("signal 15"), "{err}");
    eprintln!("SIGTERM to exit under load: {took:?}\n{err}");
    assert!(
        took < Duration::from_millis(200),
        "zcio nfq took {took:?} to exit after SIGTERM under load"
    );
}

#[test]
fn invalid_sizes_counts_and_durations_are_refused_with_one_error_line() {
    for (args, name) in [
        (vec!["--batch", "0"], "--batch"),
        (vec!["--threads", "0"], "--threads"),
        (vec!["--max-len", "0"], "--max-len"),
        (vec!["--duration", "0"], "--duration"),
        (vec!["--duration=-1"], "--duration"),
        (vec!["--stats-interval=-1"], "--stats-interval"),
    ] {
        let mut all = vec!["nfq", "--queue", "48"];
        all.extend(&args);
        common::refused_with_one_line(&all, name);
    }
}

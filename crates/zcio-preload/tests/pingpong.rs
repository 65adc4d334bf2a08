//! The per-instance choice between the ring's `EPOLL_WAIT` and the real epoll (kernel mode):
//! an instance whose waits return about one event each (a request/response client, what
//! memcached's workers see under memcaslap) costs more on the ring than in `epoll_wait`, so the
//! shim hands it to the real epoll, records why (log, stats line) and goes on serving it
//! exactly as before; an instance whose waits only time out stays on the ring.
//! `tests/c/epoll_pingpong.c` prints the same trace natively and under the shim.

mod common;

use common::{assert_same_output, run_program, shimmed, stats_sum, Preload, TempDir};

/// The `handed_instances=` field of the stats line (`-` when none).
fn handed_instances(stats: &std::path::Path) -> String {
    let text = std::fs::read_to_string(stats).unwrap_or_default();
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix("handed_instances="))
        .unwrap_or("")
        .to_string()
}

#[test]
fn an_instance_whose_waits_return_one_event_each_is_handed_to_the_real_epoll() {
    let dir = TempDir::new("pingpong");
    let Some(exe) = common::compile_c(&dir, "epoll_pingpong") else {
        return;
    };
    let (native, _) = run_program(&exe, &Preload::default(), &[], &[]);
    assert!(
        native.contains("answered 2000 requests, 0 out of order, about one event per wait"),
        "{native}"
    );
    let (pre, stats) = shimmed(&dir);
    let (shim, log) = run_program(&exe, &pre, &[], &[]);
    assert_same_output(&native, &shim, &log);
    let text = std::fs::read_to_string(&stats).unwrap_or_default();
    // The ping-pong instance (created by the main thread, waited on by the server thread) and
    // not the one whose waits time out.
    assert_eq!(stats_sum(&stats, "handed"), 1, "{text}\n{log}");
    let listed = handed_instances(&stats);
    assert!(
        listed.split(',').count() == 1 && listed.ends_with(":1.0ev/wait"),
        "{text}"
    );
    assert!(
        log.contains("handed to the real epoll")
            && log.contains("a ring wait costs more than epoll_wait"),
        "the hand-over and its reason are not logged:\n{log}"
    );
    // Two windows of 128 ring waits decided it; the rest of the 2000 requests (and the waits
    // of the contract part) went to the real epoll; the timed-out waits of the idle instance
    // stayed on the ring.
    let ring = stats_sum(&stats, "ring_waits");
    assert!((256 + 300..2000).contains(&ring), "{text}");
    assert!(stats_sum(&stats, "handed_waits") >= 2000 - 256, "{text}");
    assert_eq!(stats_sum(&stats, "fallbacks"), 0, "{text}");
    assert_eq!(stats_sum(&stats, "real_waits"), 0, "{text}");
}

#[test]
fn a_pinned_ring_wait_is_never_handed_over() {
    let dir = TempDir::new("pingpong-pinned");
    let Some(exe) = common::compile_c(&dir, "epoll_pingpong") else {
        return;
    };
    let (native, _) = run_program(&exe, &Preload::default(), &["600"], &[]);
    let (pre, stats) = shimmed(&dir);
    let (shim, log) = run_program(&exe, &pre, &["600"], &[("ZCIO_EPOLL_WAIT_MODE", "ring")]);
    assert_same_output(&native, &shim, &log);
    let text = std::fs::read_to_string(&stats).unwrap_or_default();
    assert_eq!(stats_sum(&stats, "handed"), 0, "{text}");
    assert_eq!(handed_instances(&stats), "-", "{text}");
    assert!(stats_sum(&stats, "ring_waits") >= 600, "{text}");
}

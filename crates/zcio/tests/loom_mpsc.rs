//! loom model of the user-posted event ring (`buf/mpsc.rs`): every interleaving of producers
//! and the consumer delivers each entry exactly once, and a consumer that goes to sleep is
//! always woken by the producer that publishes after it announced the sleep.
//!
//! Run with: `RUSTFLAGS="--cfg loom" cargo test -p zcio --test loom_mpsc --release`
#![cfg(loom)]

#[path = "../src/buf/mpsc.rs"]
#[allow(dead_code)]
mod mpsc;

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;
use mpsc::{MpscRing, Pushed};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

#[test]
fn concurrent_posts_are_each_harvested_once() {
    model(|| {
        let r = Arc::new(MpscRing::new(4));
        let hs: Vec<_> = (0..2u64)
            .map(|t| {
                let r = r.clone();
                thread::spawn(move || {
                    r.push(t + 1, 1).unwrap();
                })
            })
            .collect();
        let mut got = Vec::new();
        // Consume concurrently with the producers.
        r.pop_batch(4, |t, _| got.push(t));
        for h in hs {
            h.join().unwrap();
        }
        // After both producers finished, the last one published everything.
        r.pop_batch(4, |t, _| got.push(t));
        got.sort();
        assert_eq!(got, vec![1, 2]);
        assert!(!r.has_entries());
    });
}

#[test]
fn slots_are_reused_only_after_harvest() {
    model(|| {
        let r = Arc::new(MpscRing::new(2));
        let p = {
            let r = r.clone();
            thread::spawn(move || {
                let mut sent = 0;
                let mut refused = 0;
                for tok in 10..13u64 {
                    match r.push(tok, tok as u32) {
                        Ok(_) => sent += 1,
                        Err(_) => refused += 1,
                    }
                }
                (sent, refused)
            })
        };
        let mut got = Vec::new();
        r.pop_batch(2, |t, e| got.push((t, e)));
        let (sent, _refused) = p.join().unwrap();
        r.pop_batch(2, |t, e| got.push((t, e)));
        r.pop_batch(2, |t, e| got.push((t, e)));
        // Entries come out intact (token and events written together) and in order.
        assert_eq!(got.len(), sent);
        for w in got.windows(2) {
            assert!(w[0].0 < w[1].0);
        }
        for (t, e) in got {
            assert_eq!(t as u32, e);
        }
    });
}

#[test]
fn a_sleeping_consumer_is_never_left_asleep() {
    model(|| {
        let r = Arc::new(MpscRing::new(4));
        let woken = Arc::new(AtomicBool::new(false));
        let hs: Vec<_> = (0..2u64)
            .map(|t| {
                let r = r.clone();
                let woken = woken.clone();
                thread::spawn(move || {
                    if r.push(t, 0).unwrap() == Pushed::WakeConsumer {
                        // Exactly one wake per sleep.
                        assert!(!woken.swap(true, Ordering::SeqCst));
                    }
                })
            })
            .collect();
        let slept = r.prepare_sleep();
        for h in hs {
            h.join().unwrap();
        }
        if slept {
            // It announced sleep with nothing published: someone must have woken it.
            assert!(woken.load(Ordering::SeqCst), "lost wake-up");
            r.end_sleep();
        }
        let mut n = 0;
        r.pop_batch(4, |_, _| n += 1);
        assert_eq!(n, 2);
    });
}

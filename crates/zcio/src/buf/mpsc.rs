//! A bounded multi-producer, single-consumer ring of `(token, events)` pairs: the uepoll
//! insertion design (Roman Penyaev's "epoll: support pollable epoll from userspace", 2019).
//!
//! One 64-bit control word packs three counters, so one atomic read-modify-write reserves a
//! slot and one publishes it:
//!
//! ```text
//!  63           48 47            24 23             0
//! +---------------+----------------+----------------+
//! |     refs      |    advance     |   monotonic    |
//! +---------------+----------------+----------------+
//! ```
//!
//! - `monotonic`: next slot to reserve (mod 2^24). A producer reserves slot `monotonic` and
//!   increments both `monotonic` and `refs` in one CAS.
//! - `refs`: producers that reserved a slot and have not yet written it.
//! - `advance`: the published tail. The consumer reads slots `[head, advance)`.
//!
//! A producer writes its slot, then decrements `refs` with release ordering; the producer
//! that brings `refs` to zero (the last concurrent inserter) sets `advance = monotonic` in
//! that same CAS, publishing every slot reserved so far — all of them are written, since
//! nobody holds a reservation any more. Since every change to the word is a read-modify-write,
//! the consumer's acquire load of `advance` synchronises with the release of every producer
//! whose slot it covers (a release sequence), so slot contents written before are visible.
//!
//! Known limit (shared with uepoll): under a continuous overlap of producers `refs` may not
//! reach zero for a while, delaying publication (never losing an entry).
//!
//! Sleeping: the consumer sets `sleeping`, issues a SeqCst fence and re-checks for entries;
//! the producer that publishes issues a SeqCst fence and reads `sleeping`. One of them sees
//! the other, so a wake-up is never lost; producers wake the consumer only when it sleeps.
//!
//! The code uses only atomics (no `unsafe`); under `--cfg loom` the loom model test compiles
//! this file against loom's atomics (`tests/loom_mpsc.rs`).

#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

const BITS: u32 = 24;
const M24: u64 = (1 << BITS) - 1;
const ADV_SHIFT: u32 = 24;
const REFS_SHIFT: u32 = 48;
const ONE_REF: u64 = 1 << REFS_SHIFT;
const MAX_REFS: u64 = 0xffff;
/// Largest capacity (a power of two well below the 2^24 counter space).
pub const MAX_CAPACITY: usize = 1 << 22;

/// The ring is full: the consumer has not harvested enough entries yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("user event ring full ({capacity} entries not yet harvested)")]
pub struct Full {
    /// The ring's capacity.
    pub capacity: usize,
}

/// What a successful [`MpscRing::push`] asks of the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Entry stored; the consumer is awake or another producer wakes it.
    Done,
    /// Entry published and the consumer is asleep: the caller must wake it (exactly one
    /// producer is told so per sleep).
    WakeConsumer,
}

/// The ring. Share it between threads with an `Arc`.
#[derive(Debug)]
pub struct MpscRing {
    ctl: AtomicU64,
    head: AtomicU32,
    sleeping: AtomicBool,
    tokens: Box<[AtomicU64]>,
    events: Box<[AtomicU32]>,
    mask: u64,
}

fn mono(c: u64) -> u64 {
    c & M24
}
fn advance(c: u64) -> u64 {
    (c >> ADV_SHIFT) & M24
}
fn refs(c: u64) -> u64 {
    c >> REFS_SHIFT
}

impl MpscRing {
    /// A ring of `capacity` entries (rounded up to a power of two, at most
    /// [`MAX_CAPACITY`]).
    pub fn new(capacity: usize) -> Self {
        let cap = capacity.clamp(2, MAX_CAPACITY).next_power_of_two();
        Self {
            ctl: AtomicU64::new(0),
            head: AtomicU32::new(0),
            sleeping: AtomicBool::new(false),
            tokens: (0..cap).map(|_| AtomicU64::new(0)).collect(),
            events: (0..cap).map(|_| AtomicU32::new(0)).collect(),
            mask: cap as u64 - 1,
        }
    }

    /// Capacity in entries.
    pub fn capacity(&self) -> usize {
        self.mask as usize + 1
    }

    /// Posts one entry from any thread. Never blocks and makes no syscall.
    pub fn push(&self, token: u64, events: u32) -> Result<Pushed, Full> {
        // Reserve: monotonic += 1, refs += 1, if there is room.
        let mut cur = self.ctl.load(Ordering::Relaxed);
        let pos = loop {
            let head = u64::from(self.head.load(Ordering::Acquire));
            if mono(cur).wrapping_sub(head) & M24 > self.mask {
                return Err(Full {
                    capacity: self.capacity(),
                });
            }
            if refs(cur) == MAX_REFS {
                std::hint::spin_loop();
                cur = self.ctl.load(Ordering::Relaxed);
                continue;
            }
            let new = (cur & !M24) | ((mono(cur) + 1) & M24);
            let new = new + ONE_REF;
            match self
                .ctl
                .compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break mono(cur),
                Err(c) => cur = c,
            }
        };
        // Write the slot; published by the release below.
        let i = (pos & self.mask) as usize;
        self.tokens[i].store(token, Ordering::Relaxed);
        self.events[i].store(events, Ordering::Relaxed);
        // Finish: refs -= 1; the last inserter advances the tail to monotonic.
        let mut cur = self.ctl.load(Ordering::Relaxed);
        let last = loop {
            let last = refs(cur) == 1;
            let mut new = cur - ONE_REF;
            if last {
                new = (new & !(M24 << ADV_SHIFT)) | (mono(cur) << ADV_SHIFT);
            }
            match self
                .ctl
                .compare_exchange_weak(cur, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => break last,
                Err(c) => cur = c,
            }
        };
        if !last {
            return Ok(Pushed::Done);
        }
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::AcqRel) {
            return Ok(Pushed::WakeConsumer);
        }
        Ok(Pushed::Done)
    }

    /// Consumer only: moves up to `max` published entries to `f`, oldest first. No syscall.
    pub fn pop_batch(&self, max: usize, mut f: impl FnMut(u64, u32)) -> usize {
        let c = self.ctl.load(Ordering::Acquire);
        let head = u64::from(self.head.load(Ordering::Relaxed));
        let avail = advance(c).wrapping_sub(head) & M24;
        let n = avail.min(max as u64);
        for k in 0..n {
            let i = ((head + k) & self.mask) as usize;
            f(
                self.tokens[i].load(Ordering::Relaxed),
                self.events[i].load(Ordering::Relaxed),
            );
        }
        if n > 0 {
            self.head
                .store(((head + n) & M24) as u32, Ordering::Release);
        }
        n as usize
    }

    /// Consumer only: whether published entries are waiting.
    pub fn has_entries(&self) -> bool {
        let c = self.ctl.load(Ordering::Acquire);
        advance(c) != u64::from(self.head.load(Ordering::Relaxed))
    }

    /// Consumer only: announces that it is about to sleep. Returns `false` (and cancels the
    /// announcement) when entries are already published; after `true` the consumer may sleep
    /// until a producer that got [`Pushed::WakeConsumer`] wakes it.
    pub fn prepare_sleep(&self) -> bool {
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.has_entries() {
            self.sleeping.store(false, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Consumer only: it is awake again (woken or timed out).
    pub fn end_sleep(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }
}

/// Threads under the real memory model (and under Miri's data-race detector and weak-memory
/// emulation, `scripts/miri`); the exhaustive interleavings are `tests/loom_mpsc.rs`.
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn concurrent_producers_each_entry_harvested_once_in_per_producer_order() {
        let per = if cfg!(miri) { 40 } else { 20_000 };
        let producers = 3u64;
        let r = Arc::new(MpscRing::new(8));
        let hs: Vec<_> = (0..producers)
            .map(|p| {
                let r = Arc::clone(&r);
                std::thread::spawn(move || {
                    for i in 0..per {
                        // Full is backpressure: retry until the consumer makes room.
                        while r.push(p << 32 | i, p as u32 + 1).is_err() {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut next = vec![0u64; producers as usize];
        let mut total = 0;
        while total < producers * per {
            let n = r.pop_batch(5, |token, events| {
                let (p, i) = (token >> 32, token & 0xffff_ffff);
                assert_eq!(events, p as u32 + 1, "slot contents torn");
                assert_eq!(i, next[p as usize], "producer {p} out of order or repeated");
                next[p as usize] += 1;
            });
            total += n as u64;
            if n == 0 {
                std::thread::yield_now();
            }
        }
        for h in hs {
            h.join().unwrap();
        }
        assert!(!r.has_entries());
        assert_eq!(next, vec![per; producers as usize]);
    }

    #[test]
    fn the_counters_wrap_without_losing_entries() {
        // 2^24 wraps of a tiny ring are too many for Miri; natively this crosses the 24-bit
        // wrap of `monotonic`, `advance` and `head`.
        let rounds: u64 = if cfg!(miri) { 300 } else { (1 << 24) / 2 + 100 };
        let r = MpscRing::new(2);
        for i in 0..rounds {
            assert_eq!(r.push(2 * i, 1), Ok(Pushed::Done));
            assert_eq!(r.push(2 * i + 1, 2), Ok(Pushed::Done));
            assert_eq!(r.push(0, 0), Err(Full { capacity: 2 }));
            let mut got = Vec::new();
            assert_eq!(r.pop_batch(4, |t, e| got.push((t, e))), 2);
            assert_eq!(got, vec![(2 * i, 1), (2 * i + 1, 2)]);
        }
    }

    #[test]
    fn a_sleeping_consumer_is_woken_by_exactly_the_publishing_producer() {
        let r = MpscRing::new(4);
        assert!(r.prepare_sleep());
        assert_eq!(r.push(1, 1), Ok(Pushed::WakeConsumer));
        assert_eq!(r.push(2, 1), Ok(Pushed::Done), "one wake per sleep");
        assert!(!r.prepare_sleep(), "entries waiting: no sleep");
        r.end_sleep();
        assert_eq!(r.pop_batch(4, |_, _| {}), 2);
    }
}

//! Pacing of `io_uring_setup`, process-wide: the kernel must never be handed rings to free
//! faster than it frees them.
//!
//! A ring with `IORING_SETUP_DEFER_TASKRUN` is freed by a kernel worker (`iou_exit`) that waits
//! for an RCU grace period first. That is true of a ring the program closes and of a set-up the
//! kernel *refused* after allocating the context (`ENOMEM` when the ring's pages do not fit in
//! `RLIMIT_MEMLOCK`). Measured on 6.18 (2 CPUs): the workers free about 2,000–3,000 such rings a
//! second, while a loop of set-ups makes 60,000 rings a second as root, or 130,000 refusals a
//! second as an unprivileged user whose memlock is taken by rings still waiting to be freed.
//! What waits is unreclaimable kernel memory (the context and its caches: `kmalloc-1k`,
//! `kmalloc-2k`), 1 GB a second in that loop, until the machine runs out of memory. A program
//! under the epoll shim that creates and closes event loops in a loop (libuv's
//! `signal_multiple_loops`) did exactly that: a global OOM, twice, in CI.
//!
//! Without the flag, neither a closed ring nor a refused set-up waits for a grace period, and
//! the same loops leave nothing behind. So:
//!
//! - **After a refusal for lack of resources** (`ENOMEM`, `EMFILE`, `ENFILE`, `EAGAIN`) no ring
//!   is asked of the kernel for a back-off time (10 ms, doubling to 1 s while refusals go on,
//!   back to 10 ms after a ring is granted). A set-up in that window fails at once with
//!   [`RingError::Throttled`](super::RingError::Throttled), carrying the errno the kernel
//!   gave; callers fall back as they do for the kernel's own refusal, with the reason recorded.
//! - **Closing a `DEFER_TASKRUN` ring** takes a token from a bucket of [`BURST`] refilled at
//!   [`RATE`] a second (without waiting); a `DEFER_TASKRUN` set-up *waits* while the bucket is
//!   empty. A loop that makes and closes rings slows to `RATE`, well below what the kernel
//!   frees; rings that stay open (a send ring per connection) cost nothing; nothing falls back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `DEFER_TASKRUN` rings a process may close at once before its next set-up waits.
pub const BURST: f64 = 1024.0;
/// `DEFER_TASKRUN` ring closes a second absorbed without a wait, for as long as they go on.
pub const RATE: f64 = 512.0;
/// Closes beyond the bucket that a set-up makes up for by waiting, at most.
pub const MAX_DEBT: f64 = RATE / 4.0;
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// What the pacing has done in this process so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SetupCounts {
    /// `io_uring_setup` calls made (each flag set tried counts).
    pub kernel_calls: u64,
    /// Calls the kernel refused for lack of resources.
    pub refused: u64,
    /// Set-ups failed without a call, inside a back-off window.
    pub throttled: u64,
    /// Set-ups that waited for the closes of earlier rings to be absorbed.
    pub delayed: u64,
}

/// The counts, outside the lock (read from an exit handler, which must not wait).
static KERNEL_CALLS: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);
static THROTTLED: AtomicU64 = AtomicU64::new(0);
static DELAYED: AtomicU64 = AtomicU64::new(0);

struct State {
    /// No set-up before this instant (after a refusal).
    closed_until: Option<Instant>,
    backoff: Duration,
    /// The errno of the last refusal, and when it came.
    last_refusal: Option<(i32, Instant)>,
    tokens: f64,
    refilled: Option<Instant>,
}

static STATE: Mutex<State> = Mutex::new(State {
    closed_until: None,
    backoff: BACKOFF_MIN,
    last_refusal: None,
    tokens: BURST,
    refilled: None,
});

/// The state, if it can be had without blocking for long. Never blocks: a ring may be made
/// or dropped in a child forked while another thread held the lock (it is never released
/// there), or in a signal handler that interrupted the holder (the epoll shim closes
/// instances from handlers). After a bounded spin the caller goes on unpaced.
fn state() -> Option<std::sync::MutexGuard<'static, State>> {
    for _ in 0..1000 {
        match STATE.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    None
}

/// The counts so far (lock-free).
pub fn counts() -> SetupCounts {
    let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
    SetupCounts {
        kernel_calls: g(&KERNEL_CALLS),
        refused: g(&REFUSED),
        throttled: g(&THROTTLED),
        delayed: g(&DELAYED),
    }
}

/// Why a set-up may not be asked of the kernel now: the errno of the refusal that opened the
/// window, and a sentence for the fallback record.
pub(super) struct Closed {
    pub errno: i32,
    pub reason: String,
}

/// Lets one set-up go ahead: `Err` inside a back-off window; with `defer`, first waits while
/// the closes of `DEFER_TASKRUN` rings have emptied the bucket.
pub(super) fn admit(defer: bool) -> Result<(), Closed> {
    loop {
        let wait = {
            let Some(mut st) = state() else {
                return Ok(());
            };
            let now = Instant::now();
            if let (Some(until), Some((errno, when))) = (st.closed_until, st.last_refusal) {
                if now < until {
                    THROTTLED.fetch_add(1, Ordering::Relaxed);
                    return Err(Closed {
                        errno,
                        reason: format!(
                            "the kernel refused a ring for lack of resources ({}; ring \
                             memory counts against RLIMIT_MEMLOCK for unprivileged users) {} \
                             ms ago; no ring is asked for until {} ms have passed (every \
                             refused set-up leaves the kernel a ring context to free, and a \
                             loop of them exhausts its memory)",
                            crate::sys::errno_name(errno),
                            now.duration_since(when).as_millis(),
                            until.duration_since(when).as_millis()
                        ),
                    });
                }
            }
            if !defer {
                return Ok(());
            }
            refill(&mut st, now);
            if st.tokens >= 0.0 {
                return Ok(());
            }
            DELAYED.fetch_add(1, Ordering::Relaxed);
            Duration::from_secs_f64(-st.tokens / RATE)
        };
        std::thread::sleep(wait);
    }
}

fn refill(st: &mut State, now: Instant) {
    let last = st.refilled.unwrap_or(now);
    st.tokens = (st.tokens + now.duration_since(last).as_secs_f64() * RATE).min(BURST);
    st.refilled = Some(now);
}

/// A `DEFER_TASKRUN` ring was closed: one more for the kernel to free. Takes a token without
/// waiting (the debt is capped at [`MAX_DEBT`], so a program that closes thousands of rings
/// at once waits at most `MAX_DEBT / RATE` for its next ring).
pub(super) fn released() {
    let Some(mut st) = state() else { return };
    refill(&mut st, Instant::now());
    st.tokens = (st.tokens - 1.0).max(-MAX_DEBT);
}

/// Records the outcome of one `io_uring_setup` call (`Err` holds its errno).
pub(super) fn record(result: Result<(), i32>) {
    KERNEL_CALLS.fetch_add(1, Ordering::Relaxed);
    let Some(mut st) = state() else { return };
    match result {
        Ok(()) => {
            st.backoff = BACKOFF_MIN;
            st.closed_until = None;
        }
        Err(errno) if is_resource(errno) => {
            let now = Instant::now();
            REFUSED.fetch_add(1, Ordering::Relaxed);
            // A refusal that follows an expired window doubles the wait; the first one after a
            // granted ring starts at the minimum.
            let backoff = st.backoff;
            st.closed_until = Some(now + backoff);
            st.last_refusal = Some((errno, now));
            st.backoff = (backoff * 2).min(BACKOFF_MAX);
        }
        Err(_) => {}
    }
}

/// Errnos of `io_uring_setup` that mean "not now" rather than "not here".
pub(super) fn is_resource(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENOMEM | libc::EMFILE | libc::ENFILE | libc::EAGAIN
    )
}

//! The send core driven by synthetic kernel events: one test per transition, then property
//! tests over random interleavings against a small model of the kernel.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

const ECANCELED: i32 = -libc::ECANCELED;

fn pop(t: &mut SendTracker<u64>, room: usize) -> Vec<Request> {
    let mut v = Vec::new();
    t.pop_requests(room, &mut v);
    v
}

fn done(t: &mut SendTracker<u64>) -> Vec<Finished<u64>> {
    std::iter::from_fn(|| t.next_done()).collect()
}

#[test]
fn buffer_comes_back_only_after_the_notification_that_follows_its_result() {
    let mut t = SendTracker::new(false, 100);
    t.stage(1, 10, 50);
    let r = pop(&mut t, 8);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].off, r[0].len, r[0].link), (0, 50, false));
    t.on_result(r[0].key, 50, true);
    assert!(done(&mut t).is_empty(), "the kernel still holds the pages");
    assert_eq!(t.notifs_pending(), 1);
    t.on_notif(r[0].key, Usage::ZeroCopy);
    let d = done(&mut t);
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].tag, d[0].buf, d[0].bytes, d[0].zc), (1, 10, 50, 1));
    assert_eq!(t.live(), 0);
}

#[test]
fn notification_before_its_result_is_kept_until_the_result() {
    let mut t = SendTracker::new(false, 100);
    t.stage(1, 10, 50);
    let r = pop(&mut t, 8);
    t.on_notif(r[0].key, Usage::Copied);
    assert!(
        done(&mut t).is_empty(),
        "no result yet: the request is in the kernel"
    );
    assert_eq!(t.stats().notifs_early, 1);
    t.on_result(r[0].key, 50, true);
    let d = done(&mut t);
    assert_eq!((d.len(), d[0].copied, d[0].zc), (1, 1, 0));
    assert_eq!(t.stats().stray_notifs, 0);
}

#[test]
fn out_of_order_notifications_each_return_their_own_buffer() {
    let mut t = SendTracker::new(false, 100);
    for tag in 0..3 {
        t.stage(tag, 100 + tag, 10);
    }
    let r = pop(&mut t, 8);
    for q in &r {
        t.on_result(q.key, 10, true);
    }
    t.on_notif(r[2].key, Usage::ZeroCopy);
    t.on_notif(r[0].key, Usage::Copied);
    let d = done(&mut t);
    assert_eq!(
        d.iter().map(|f| (f.tag, f.buf)).collect::<Vec<_>>(),
        vec![(2, 102), (0, 100)]
    );
    t.on_notif(r[1].key, Usage::ZeroCopy);
    assert_eq!(done(&mut t)[0].tag, 1);
}

#[test]
fn a_send_larger_than_chunk_waits_for_every_request() {
    let mut t = SendTracker::new(false, 4);
    t.stage(7, 70, 10);
    let r = pop(&mut t, 8);
    assert_eq!(
        r.iter().map(|q| (q.off, q.len)).collect::<Vec<_>>(),
        vec![(0, 4), (4, 4), (8, 2)]
    );
    for q in &r {
        t.on_result(q.key, q.len as i32, true);
    }
    t.on_notif(r[0].key, Usage::ZeroCopy);
    t.on_notif(r[1].key, Usage::ZeroCopy);
    assert!(done(&mut t).is_empty());
    t.on_notif(r[2].key, Usage::Copied);
    let d = done(&mut t);
    assert_eq!((d[0].bytes, d[0].zc, d[0].copied), (10, 2, 1));
}

#[test]
fn stream_chain_is_linked_and_the_next_waits_for_all_results() {
    let mut t = SendTracker::new(true, 4);
    t.stage(0, 0, 8);
    t.stage(1, 1, 4);
    let r = pop(&mut t, 2);
    assert_eq!(r.len(), 2, "chain limited by SQ room");
    assert!(r[0].link && !r[1].link, "every member but the last links");
    t.stage(2, 2, 4);
    assert!(pop(&mut t, 8).is_empty(), "one chain at a time");
    t.on_result(r[0].key, 4, true);
    assert!(pop(&mut t, 8).is_empty());
    t.on_result(r[1].key, 4, true);
    let r2 = pop(&mut t, 8);
    assert_eq!(
        r2.iter().map(|q| (q.key.slot, q.off)).collect::<Vec<_>>(),
        vec![(1, 0), (2, 0)]
    );
}

#[test]
fn short_send_continues_where_it_stopped_ahead_of_what_was_queued() {
    let mut t = SendTracker::new(true, 100);
    t.stage(0, 0, 10);
    t.stage(1, 1, 10);
    let r = pop(&mut t, 8);
    t.on_result(r[0].key, 3, true);
    t.on_result(r[1].key, ECANCELED, false);
    let r2 = pop(&mut t, 8);
    assert_eq!(
        r2.iter()
            .map(|q| (q.key.slot, q.off, q.len))
            .collect::<Vec<_>>(),
        vec![(0, 3, 7), (1, 0, 10)]
    );
    assert_eq!(t.stats().resubmits, 2);
}

#[test]
fn cancelled_link_whose_notification_comes_waits_for_it() {
    let mut t = SendTracker::new(true, 100);
    t.stage(0, 0, 10);
    t.stage(1, 1, 10);
    let r = pop(&mut t, 8);
    t.entered(1);
    t.on_result(r[0].key, 5, true);
    t.on_result(r[1].key, ECANCELED, false);
    t.settle();
    // The short send is continued, the cancelled one requeued; the cancelled attempt may
    // still get a notification (it passed prep).
    let r2 = pop(&mut t, 8);
    assert_eq!(
        r2.iter()
            .map(|q| (q.key.slot, q.off, q.len))
            .collect::<Vec<_>>(),
        vec![(0, 5, 5), (1, 0, 10)]
    );
    assert_ne!(r2[1].key, r[1].key, "a resubmission is a new request");
    // The new attempts' notifications come before their results.
    for q in &r2 {
        t.on_notif(q.key, Usage::ZeroCopy);
        t.on_result(q.key, q.len as i32, true);
    }
    t.on_notif(r[0].key, Usage::ZeroCopy);
    let d = done(&mut t);
    assert_eq!(
        d.iter().map(|f| (f.tag, f.bytes, f.zc)).collect::<Vec<_>>(),
        vec![(0, 10, 2)]
    );
    // Slot 1 still owes "maybe one" for its cancelled attempt.
    t.on_notif(r[1].key, Usage::Copied);
    let d = done(&mut t);
    assert_eq!((d[0].tag, d[0].bytes, d[0].zc, d[0].copied), (1, 10, 1, 0));
    assert_eq!(t.stats().stray_notifs, 0);
}

#[test]
fn cancelled_link_whose_notification_never_comes_settles_after_the_next_enter() {
    let mut t = SendTracker::new(true, 100);
    t.stage(0, 0, 10);
    let r = pop(&mut t, 8);
    t.entered(5);
    t.on_result(r[0].key, -libc::ECONNRESET, false);
    t.settle();
    assert!(
        done(&mut t).is_empty(),
        "the enter that posts it has not run yet"
    );
    t.entered(6);
    t.settle();
    let d = done(&mut t);
    assert_eq!((d[0].error, d[0].bytes), (Some(libc::ECONNRESET), 0));
    // The stream failed: later sends complete at once with the error.
    t.stage(1, 1, 5);
    assert_eq!(done(&mut t)[0].error, Some(libc::ECONNRESET));
}

#[test]
fn late_notification_for_a_reused_slot_is_never_matched_to_the_new_send() {
    let mut t = SendTracker::new(false, 100);
    t.stage(0, 0, 10);
    let r = pop(&mut t, 8);
    t.on_result(r[0].key, -libc::EFAULT, false);
    t.entered(1);
    t.settle();
    assert_eq!(done(&mut t)[0].tag, 0);
    // A notification for the failed request arrives after the slot was reused.
    t.stage(1, 1, 10);
    let r2 = pop(&mut t, 8);
    assert_eq!(r2[0].key.slot, r[0].key.slot);
    assert_ne!(r2[0].key.gen, r[0].key.gen);
    t.on_result(r2[0].key, 10, true);
    t.on_notif(r[0].key, Usage::ZeroCopy);
    assert!(
        done(&mut t).is_empty(),
        "stale notification taken for the new send"
    );
    assert_eq!(t.stats().stray_notifs, 1);
    t.on_notif(r2[0].key, Usage::ZeroCopy);
    assert_eq!(done(&mut t)[0].tag, 1);
}

#[test]
fn no_room_halves_the_chain_then_waits_for_a_notification_then_gives_up() {
    let mut t = SendTracker::new(true, 100);
    for i in 0..4 {
        t.stage(i, i, 10);
    }
    let r = pop(&mut t, 8);
    assert_eq!(r.len(), 4);
    let first = r[0].key;
    t.on_result(r[0].key, 10, true);
    t.on_result(r[1].key, -libc::ENOBUFS, false);
    t.on_result(r[2].key, ECANCELED, false);
    t.on_result(r[3].key, ECANCELED, false);
    let r = pop(&mut t, 8);
    assert_eq!(r.len(), 2, "chain halved after a room failure");
    t.on_result(r[0].key, -libc::ENOBUFS, false);
    t.on_result(r[1].key, ECANCELED, false);
    let r = pop(&mut t, 8);
    assert_eq!(r.len(), 1);
    t.on_result(r[0].key, -libc::ENOBUFS, false);
    assert!(
        pop(&mut t, 8).is_empty(),
        "blocked until a notification frees room"
    );
    t.on_notif(first, Usage::ZeroCopy);
    assert_eq!(done(&mut t)[0].tag, 0);
    let r = pop(&mut t, 8);
    assert_eq!(r.len(), 1, "room is back");
    t.on_result(r[0].key, -libc::ENOBUFS, false);
    t.entered(9);
    t.settle();
    // Nothing of ours in flight and still no room: give up, the rest is unsent, in order.
    assert!(pop(&mut t, 8).is_empty());
    assert_eq!(t.gave_up(), Some(libc::ENOBUFS));
    let d = done(&mut t);
    assert_eq!(
        d.iter()
            .map(|f| (f.tag, f.unsent.clone()))
            .collect::<Vec<_>>(),
        vec![(1, vec![(0, 10)]), (2, vec![(0, 10)]), (3, vec![(0, 10)])]
    );
}

#[test]
fn giving_up_with_a_chain_out_waits_for_its_results_and_keeps_order() {
    let mut t = SendTracker::new(true, 4);
    t.stage(0, 0, 8);
    t.stage(1, 1, 8);
    let r = pop(&mut t, 3);
    assert_eq!(r.len(), 3);
    t.give_up(libc::EIO);
    assert_eq!(
        t.staged(),
        1,
        "requests staged behind the chain stay until it ends"
    );
    t.on_result(r[0].key, 4, true);
    t.on_result(r[1].key, 2, true);
    t.on_result(r[2].key, ECANCELED, false);
    assert_eq!(t.staged(), 0);
    t.on_notif(r[0].key, Usage::ZeroCopy);
    t.on_notif(r[1].key, Usage::ZeroCopy);
    t.entered(1);
    t.settle();
    let d = done(&mut t);
    let got: Vec<_> = d
        .iter()
        .map(|f| (f.tag, f.bytes, f.unsent.clone()))
        .collect();
    assert_eq!(got, vec![(0, 6, vec![(6, 2)]), (1, 0, vec![(0, 8)])]);
    t.stage(2, 2, 3);
    assert_eq!(done(&mut t)[0].unsent, vec![(0, 3)]);
}

#[test]
fn eopnotsupp_gives_up_and_everything_goes_unsent() {
    let mut t = SendTracker::new(false, 4);
    t.stage(0, 0, 8);
    let r = pop(&mut t, 1);
    t.on_result(r[0].key, -libc::EOPNOTSUPP, false);
    t.entered(1);
    t.settle();
    let d = done(&mut t);
    assert_eq!(d[0].unsent, vec![(0, 8)]);
    assert_eq!(t.gave_up(), Some(libc::EOPNOTSUPP));
}

#[test]
fn notifications_without_usage_reports_count_as_unknown() {
    let mut t = SendTracker::new(false, 100);
    t.stage(0, 0, 10);
    let r = pop(&mut t, 1);
    t.on_result(r[0].key, 10, true);
    t.on_notif(r[0].key, Usage::Unknown);
    let d = done(&mut t);
    assert_eq!((d[0].zc, d[0].copied, d[0].unknown), (0, 0, 1));
    assert_eq!(t.stats().notifs_unknown, 1);
}

#[test]
fn failed_result_with_more_owes_a_notification_that_reports_nothing() {
    let mut t = SendTracker::new(false, 100);
    t.stage(0, 0, 10);
    let r = pop(&mut t, 1);
    t.on_result(r[0].key, -libc::EFAULT, true);
    assert!(done(&mut t).is_empty());
    t.on_notif(r[0].key, Usage::Copied);
    let d = done(&mut t);
    assert_eq!((d[0].error, d[0].copied), (Some(libc::EFAULT), 0));
}

// ---- Property tests: random interleavings against a model of the kernel ----

/// What the model kernel does with one request.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    Full,
    Short,
    NoRoomAtPrep,
    NoRoomAtIssue,
    FailWithMore,
    Reset,
}

#[derive(Debug, Clone)]
enum Op {
    Stage(usize),
    /// Pop requests (SQ room), then enter: the kernel runs up to `run` requests.
    Enter {
        room: usize,
        run: usize,
    },
    Harvest,
    GiveUp,
}

fn outcome(b: u8, fatal_ok: bool) -> Outcome {
    match b % 32 {
        0..=19 => Outcome::Full,
        20..=23 => Outcome::Short,
        24..=25 => Outcome::NoRoomAtPrep,
        26..=27 => Outcome::NoRoomAtIssue,
        28..=30 => Outcome::FailWithMore,
        _ if fatal_ok => Outcome::Reset,
        _ => Outcome::Full,
    }
}

/// A posted CQE.
#[derive(Debug, Clone, Copy)]
enum Cqe {
    Result(Key, i32, bool),
    Notif(Key, Usage),
}

/// The kernel: requests in submission order, refs on buffers, CQEs posted at enters.
struct Kernel {
    stream: bool,
    /// Submitted requests not yet run, with the id of their chain.
    queue: VecDeque<(Request, u64)>,
    /// Chains cancelled from a member on (chain id).
    cancelled: Vec<u64>,
    chain_id: u64,
    /// Notifications owed, to post at a later enter, with the buffer they release.
    owed: Vec<(Key, Usage, u64)>,
    /// Maybe-notifications of failed requests: posted at the latest by the next enter.
    maybe: Vec<(Key, bool)>,
    cq: Vec<Cqe>,
    /// Requests per buffer that the kernel may still read.
    refs: HashMap<u64, u32>,
    /// Bytes moved, in the order the kernel moved them: (tag, off, len).
    wire: Vec<(u64, usize, usize)>,
    rng: u64,
}

impl Kernel {
    fn rand(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn submit(&mut self, reqs: &[Request], t: &SendTracker<u64>) {
        let mut new_chain = true;
        for r in reqs {
            if new_chain {
                self.chain_id += 1;
            }
            *self.refs.entry(*t.buf(r.key.slot)).or_default() += 1;
            self.queue.push_back((*r, self.chain_id));
            new_chain = !r.link;
        }
    }

    fn enter(&mut self, run: usize, t: &SendTracker<u64>, fatal_ok: bool, calm: bool) {
        // Maybe-notifications from earlier enters are posted now (task work runs).
        for (k, post) in std::mem::take(&mut self.maybe) {
            if post {
                self.cq.push(Cqe::Notif(k, Usage::Copied));
            }
        }
        let mut posted = Vec::new();
        for _ in 0..run {
            // Datagrams may run in any order; a stream runs in submission order.
            if self.queue.is_empty() {
                break;
            }
            let i = if self.stream {
                0
            } else {
                (self.rand() as usize) % self.queue.len()
            };
            let (r, chain) = self.queue.remove(i).expect("in range");
            let buf = *t.buf(r.key.slot);
            let release = |k: &mut Kernel| {
                *k.refs.get_mut(&buf).expect("ref") -= 1;
            };
            if self.cancelled.contains(&chain) {
                posted.push(Cqe::Result(r.key, ECANCELED, false));
                release(self);
                let post = self.rand() % 2 == 0;
                self.maybe.push((r.key, post));
                continue;
            }
            let o = if calm {
                Outcome::Full
            } else {
                outcome(self.rand() as u8, fatal_ok)
            };
            let usage = if self.rand() % 2 == 0 {
                Usage::ZeroCopy
            } else {
                Usage::Copied
            };
            let cut = |k: &mut Kernel| {
                if r.link {
                    k.cancelled.push(chain);
                }
            };
            match o {
                Outcome::Full => {
                    self.wire.push((buf, r.off, r.len));
                    posted.push(Cqe::Result(r.key, r.len as i32, true));
                    self.owed.push((r.key, usage, buf));
                }
                Outcome::Short if r.len > 1 && self.stream => {
                    let n = 1 + (self.rand() as usize) % (r.len - 1);
                    self.wire.push((buf, r.off, n));
                    posted.push(Cqe::Result(r.key, n as i32, true));
                    self.owed.push((r.key, usage, buf));
                    cut(self);
                }
                Outcome::Short | Outcome::NoRoomAtPrep => {
                    posted.push(Cqe::Result(r.key, -libc::ENOBUFS, false));
                    release(self);
                    cut(self);
                }
                Outcome::NoRoomAtIssue => {
                    posted.push(Cqe::Result(r.key, -libc::ENOMEM, false));
                    release(self);
                    let post = self.rand() % 2 == 0;
                    self.maybe.push((r.key, post));
                    cut(self);
                }
                Outcome::FailWithMore => {
                    posted.push(Cqe::Result(r.key, -libc::ENOBUFS, true));
                    self.owed.push((r.key, Usage::Copied, buf));
                    cut(self);
                }
                Outcome::Reset => {
                    posted.push(Cqe::Result(r.key, -libc::ECONNRESET, false));
                    release(self);
                    let post = self.rand() % 2 == 0;
                    self.maybe.push((r.key, post));
                    cut(self);
                }
            }
        }
        // Some owed notifications are posted now, in any order; the rest later.
        let mut keep = Vec::new();
        for (k, u, buf) in std::mem::take(&mut self.owed) {
            if calm || self.rand() % 3 != 0 {
                posted.push(Cqe::Notif(k, u));
                *self.refs.get_mut(&buf).expect("ref") -= 1;
            } else {
                keep.push((k, u, buf));
            }
        }
        self.owed = keep;
        // CQ order within one enter is arbitrary: a notification may precede its result.
        for i in (1..posted.len()).rev() {
            let j = (self.rand() as usize) % (i + 1);
            posted.swap(i, j);
        }
        self.cq.extend(posted);
    }
}

/// Moves finished sends from the tracker into `finished`: each ticket once, with its own
/// buffer, and never while the kernel still holds a reference to that buffer.
fn collect_finished(
    t: &mut SendTracker<u64>,
    refs: &HashMap<u64, u32>,
    finished: &mut HashMap<u64, Finished<u64>>,
) {
    while let Some(f) = t.next_done() {
        assert_eq!(f.buf, f.tag, "a send came back with another send's buffer");
        assert_eq!(
            refs.get(&f.buf).copied().unwrap_or(0),
            0,
            "buffer {} returned while the kernel may still read it",
            f.buf
        );
        assert!(
            finished.insert(f.tag, f).is_none(),
            "ticket completed twice"
        );
    }
}

/// Every ticket finished once, reporting the bytes the kernel moved for it (`wire`: tag,
/// offset, length).
fn check_moved_bytes(
    lens: &[usize],
    finished: &HashMap<u64, Finished<u64>>,
    wire: &[(u64, usize, usize)],
) {
    assert_eq!(finished.len(), lens.len(), "every ticket completes once");
    let mut moved: HashMap<u64, usize> = HashMap::new();
    for &(tag, _, len) in wire {
        *moved.entry(tag).or_default() += len;
    }
    for (tag, f) in finished {
        assert_eq!(
            f.bytes,
            moved.get(tag).copied().unwrap_or(0),
            "bytes of {tag}"
        );
    }
}

/// `seq` (tag, offset, length) walks the stream of sends of `lens` in order, without gaps;
/// when `complete`, to its end (otherwise a prefix is enough: after a fatal error).
fn check_stream_order(lens: &[usize], seq: &[(u64, usize, usize)], complete: bool) {
    let n = lens.len() as u64;
    let mut pos = (0u64, 0usize);
    for &(tag, off, len) in seq {
        while pos.0 < n && pos.1 == lens[pos.0 as usize] {
            pos = (pos.0 + 1, 0);
        }
        assert_eq!((tag, off), pos, "byte ranges out of order");
        pos.1 += len;
    }
    while pos.0 < n && pos.1 == lens[pos.0 as usize] {
        pos = (pos.0 + 1, 0);
    }
    if complete {
        assert_eq!(pos.0, n, "bytes lost from the stream");
    }
}

struct Run {
    t: SendTracker<u64>,
    k: Kernel,
    lens: Vec<usize>,
    finished: HashMap<u64, Finished<u64>>,
    enters: u64,
    fatal_ok: bool,
}

impl Run {
    fn new(stream: bool, seed: u64, fatal_ok: bool) -> Self {
        Self {
            t: SendTracker::new(stream, 4),
            k: Kernel {
                stream,
                queue: VecDeque::new(),
                cancelled: Vec::new(),
                chain_id: 0,
                owed: Vec::new(),
                maybe: Vec::new(),
                cq: Vec::new(),
                refs: HashMap::new(),
                wire: Vec::new(),
                rng: seed | 1,
            },
            lens: Vec::new(),
            finished: HashMap::new(),
            enters: 0,
            fatal_ok,
        }
    }

    fn collect(&mut self) {
        collect_finished(&mut self.t, &self.k.refs, &mut self.finished);
    }

    fn step(&mut self, op: &Op, calm: bool) {
        match *op {
            Op::Stage(len) => {
                let tag = self.lens.len() as u64;
                self.lens.push(len);
                self.t.stage(tag, tag, len);
            }
            Op::Enter { room, run } => {
                let mut reqs = Vec::new();
                self.t.pop_requests(room, &mut reqs);
                self.k.submit(&reqs, &self.t);
                self.k.enter(run, &self.t, self.fatal_ok && !calm, calm);
                self.enters += 1;
                self.t.entered(self.enters);
            }
            Op::Harvest => {
                for c in std::mem::take(&mut self.k.cq) {
                    match c {
                        Cqe::Result(k, res, more) => self.t.on_result(k, res, more),
                        Cqe::Notif(k, u) => self.t.on_notif(k, u),
                    }
                }
                self.t.settle();
            }
            Op::GiveUp => self.t.give_up(libc::EIO),
        }
        self.collect();
    }

    /// Runs until nothing is in flight (the kernel behaves from here on).
    fn drain(&mut self) {
        for _ in 0..10_000 {
            if self.t.live() == 0 {
                return;
            }
            self.step(&Op::Enter { room: 8, run: 64 }, true);
            self.step(&Op::Harvest, true);
        }
        panic!(
            "did not drain: {} live: {:#?} kernel queue {:?} owed {:?} maybe {:?}",
            self.t.live(),
            self.t,
            self.k.queue,
            self.k.owed,
            self.k.maybe
        );
    }

    fn check(&self) {
        let n = self.lens.len() as u64;
        check_moved_bytes(&self.lens, &self.finished, &self.k.wire);
        if self.k.stream {
            // The bytes the kernel moved, then the unsent ranges in ticket order, are the
            // stream in order; after a fatal error what moved is a prefix (and unsent ranges
            // would fail like the rest).
            let mut seq: Vec<(u64, usize, usize)> = self.k.wire.clone();
            let fatal = self.finished.values().any(|f| f.error.is_some());
            for tag in (0..n).filter(|_| !fatal) {
                for &(off, len) in &self.finished[&tag].unsent {
                    seq.push((tag, off, len));
                }
            }
            check_stream_order(&self.lens, &seq, !fatal);
        } else {
            for tag in 0..n {
                let f = &self.finished[&tag];
                if f.error.is_some() {
                    continue;
                }
                let mut cover: Vec<(usize, usize)> = self
                    .k
                    .wire
                    .iter()
                    .filter(|w| w.0 == tag)
                    .map(|w| (w.1, w.2))
                    .chain(f.unsent.iter().copied())
                    .collect();
                cover.sort_unstable();
                let mut at = 0;
                for (off, len) in cover {
                    assert_eq!(off, at, "datagram bytes of {tag} lost or sent twice");
                    at += len;
                }
                assert_eq!(at, self.lens[tag as usize], "datagram bytes of {tag}");
            }
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..=12).prop_map(Op::Stage),
        4 => (1usize..=8, 0usize..=6).prop_map(|(room, run)| Op::Enter { room, run }),
        3 => Just(Op::Harvest),
        1 => Just(Op::GiveUp),
    ]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..120).prop_map(|v| {
        // Give up at most once, late in some runs only.
        let mut seen = false;
        v.into_iter()
            .filter(|o| !matches!(o, Op::GiveUp) || !std::mem::replace(&mut seen, true))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn stream_sends_complete_once_in_order_and_never_early(
        ops in ops(), seed in any::<u64>(), fatal in any::<bool>()
    ) {
        let mut run = Run::new(true, seed, fatal);
        for op in &ops {
            run.step(op, false);
        }
        run.drain();
        run.check();
    }

    #[test]
    fn datagram_sends_complete_once_and_never_early(
        ops in ops(), seed in any::<u64>()
    ) {
        let mut run = Run::new(false, seed, false);
        for op in &ops {
            run.step(op, false);
        }
        run.drain();
        run.check();
    }
}

// ---- MSG_ZEROCOPY: synchronous calls, errqueue ranges ----

/// One synchronous call per request, each accepted in full and taking a sequence number.
fn call_all(t: &mut SendTracker<u64>) -> Vec<Request> {
    let mut all = Vec::new();
    loop {
        let r = pop(t, 1);
        let Some(&r) = r.first() else { break };
        t.on_sent(r.key, r.len as i32, true);
        all.push(r);
    }
    all
}

#[test]
fn one_errqueue_range_completes_several_sends() {
    let mut t = SendTracker::new(true, 100);
    for tag in 0..3 {
        t.stage(tag, 10 + tag, 150);
    }
    assert_eq!(call_all(&mut t).len(), 6, "two calls per send");
    assert!(
        done(&mut t).is_empty(),
        "no range yet: the kernel holds every page"
    );
    assert_eq!(t.errq_outstanding(), 6);
    assert_eq!(t.on_range(0, 5, false), 0);
    let d = done(&mut t);
    assert_eq!(
        d.iter()
            .map(|f| (f.tag, f.buf, f.bytes, f.zc))
            .collect::<Vec<_>>(),
        vec![(0, 10, 150, 2), (1, 11, 150, 2), (2, 12, 150, 2)]
    );
    assert_eq!((t.errq_outstanding(), t.live(), t.errq_next()), (0, 0, 6));
}

#[test]
fn partial_range_returns_only_sends_whose_every_call_completed() {
    let mut t = SendTracker::new(false, 100);
    t.stage(0, 10, 250); // calls 0, 1, 2
    t.stage(1, 11, 50); // call 3
    call_all(&mut t);
    t.on_range(0, 1, false);
    assert!(done(&mut t).is_empty(), "call 2 of send 0 is still out");
    t.on_range(2, 2, false);
    assert_eq!(done(&mut t)[0].tag, 0);
    assert_eq!(t.errq_oldest(), 3);
    t.on_range(3, 3, false);
    assert_eq!(done(&mut t)[0].tag, 1);
}

#[test]
fn out_of_order_errqueue_ranges_each_return_their_own_buffer() {
    let mut t = SendTracker::new(false, 10);
    for tag in 0..4 {
        t.stage(tag, 100 + tag, 10);
    }
    call_all(&mut t);
    t.on_range(2, 3, false);
    let d = done(&mut t);
    assert_eq!(d.iter().map(|f| f.buf).collect::<Vec<_>>(), vec![102, 103]);
    assert_eq!(t.errq_oldest(), 0, "the window cannot advance past 0 yet");
    t.on_range(1, 1, false);
    t.on_range(0, 0, false);
    let d = done(&mut t);
    assert_eq!(d.iter().map(|f| f.buf).collect::<Vec<_>>(), vec![101, 100]);
    assert_eq!((t.errq_oldest(), t.errq_outstanding()), (4, 0));
}

#[test]
fn errqueue_counter_wrap_is_followed() {
    let mut t = SendTracker::new(true, 10);
    t.errq_start(u32::MAX - 2);
    for tag in 0..6 {
        t.stage(tag, 100 + tag, 10);
    }
    call_all(&mut t);
    assert_eq!(t.errq_next(), 3);
    // One range across the wrap: MAX-1, MAX, 0, 1.
    assert_eq!(t.on_range(u32::MAX - 1, 1, false), 0);
    t.on_range(2, 2, true);
    assert_eq!(
        done(&mut t).iter().map(|f| f.tag).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    t.on_range(u32::MAX - 2, u32::MAX - 2, false);
    assert_eq!(done(&mut t)[0].tag, 0);
    assert_eq!((t.errq_outstanding(), t.errq_next()), (0, 3));
    t.stage(9, 109, 10);
    call_all(&mut t);
    t.on_range(3, 3, false);
    assert_eq!(done(&mut t)[0].tag, 9);
}

#[test]
fn copied_is_counted_per_range_for_the_calls_it_covers() {
    let mut t = SendTracker::new(true, 100);
    t.stage(0, 10, 300); // calls 0, 1, 2
    call_all(&mut t);
    t.on_range(0, 0, false);
    t.on_range(1, 2, true);
    let d = done(&mut t);
    assert_eq!((d[0].zc, d[0].copied, d[0].unknown), (1, 2, 0));
    assert_eq!(t.stats().notifs_copied, 2);
    assert_eq!(t.stats().ranges, 2);
}

#[test]
fn numbers_never_issued_or_completed_twice_are_counted_not_matched() {
    // A socket with history (another sender took numbers 0..5 before this tracker, which
    // believes it starts at 0) would see its numbers shifted: such numbers must never
    // return a buffer that the kernel still reads. The backend refuses such sockets; the
    // tracker never matches a number twice or one it never issued.
    let mut t = SendTracker::new(true, 100);
    t.stage(0, 10, 100);
    call_all(&mut t);
    assert_eq!(t.on_range(5, 9, false), 5, "never issued");
    assert!(done(&mut t).is_empty());
    assert_eq!(t.on_range(0, 0, false), 0);
    assert_eq!(done(&mut t).len(), 1);
    assert_eq!(t.on_range(0, 0, false), 1, "completed twice");
    assert_eq!(t.stats().unknown_ids, 6);
}

#[test]
fn short_stream_call_is_continued_before_the_next_send() {
    let mut t = SendTracker::new(true, 100);
    t.stage(0, 10, 100);
    t.stage(1, 11, 100);
    let r = pop(&mut t, 1);
    t.on_sent(r[0].key, 40, true);
    let r = pop(&mut t, 1);
    assert_eq!((t.tag(r[0].key.slot), r[0].off, r[0].len), (0, 40, 60));
    t.on_sent(r[0].key, 60, true);
    let r = pop(&mut t, 1);
    assert_eq!((t.tag(r[0].key.slot), r[0].off), (1, 0));
    t.on_sent(r[0].key, 100, true);
    t.on_range(0, 2, false);
    let d = done(&mut t);
    assert_eq!(
        d.iter().map(|f| (f.tag, f.bytes, f.zc)).collect::<Vec<_>>(),
        vec![(0, 100, 2), (1, 100, 1)]
    );
}

#[test]
fn failed_datagram_call_waits_for_its_number_only_if_it_took_one() {
    let mut t = SendTracker::new(false, 100);
    t.stage(0, 10, 100);
    t.stage(1, 11, 100);
    let r = pop(&mut t, 1);
    t.on_sent(r[0].key, -libc::EMSGSIZE, true);
    assert!(
        done(&mut t).is_empty(),
        "its completion is queued: pages still lent"
    );
    let r = pop(&mut t, 1);
    t.on_sent(r[0].key, -libc::ECONNREFUSED, false);
    let d = done(&mut t);
    assert_eq!((d[0].tag, d[0].error), (1, Some(libc::ECONNREFUSED)));
    t.on_range(0, 0, true);
    let d = done(&mut t);
    assert_eq!(
        (d[0].tag, d[0].error, d[0].bytes),
        (0, Some(libc::EMSGSIZE), 0)
    );
    // A failed call's notification reports nothing about copying.
    assert_eq!((d[0].zc, d[0].copied), (0, 0));
}

#[test]
fn socket_error_while_waiting_fails_every_send_still_owned() {
    let mut t = SendTracker::new(true, 100);
    t.stage(0, 10, 100);
    call_all(&mut t);
    t.fail(libc::ECONNRESET);
    t.stage(1, 11, 100);
    let d = done(&mut t);
    assert_eq!((d[0].tag, d[0].error), (1, Some(libc::ECONNRESET)));
    t.on_range(0, 0, false);
    let d = done(&mut t);
    assert_eq!((d[0].tag, d[0].error), (0, Some(libc::ECONNRESET)));
}

/// What the model socket does with one `send(MSG_ZEROCOPY)` call.
#[derive(Debug, Clone, Copy)]
enum Call {
    Full,
    /// Stream only: part of the bytes.
    Short,
    /// ENOBUFS with nothing outstanding: the backend sends the piece by copy.
    ByCopy,
    /// Datagram only: failed, but the kernel took a number (its completion will come).
    FailTook,
    /// Failed without taking a number (datagram: that datagram; stream: the connection).
    Fail,
}

#[derive(Debug, Clone)]
enum ErrqOp {
    Stage(usize),
    /// Make up to `n` calls.
    Call(usize),
    /// The kernel completes up to `n` outstanding numbers (in any order).
    Complete(usize),
    /// Read up to `n` queued ranges.
    Reap(usize),
}

/// A socket with `SO_ZEROCOPY`: a u32 counter that starts near the wrap, numbers whose
/// pages the kernel still reads, completed numbers queued as ranges.
struct ErrqRun {
    t: SendTracker<u64>,
    stream: bool,
    fatal: bool,
    next: u32,
    /// Outstanding numbers: (number, buffer, copied).
    out: Vec<(u32, u64, bool)>,
    /// Completed, not yet read: ranges (lo, hi, copied), built the way the kernel merges a
    /// completion into the queue's tail message when it extends it.
    queued: VecDeque<(u32, u32, bool)>,
    refs: HashMap<u64, u32>,
    wire: Vec<(u64, usize, usize)>,
    lens: Vec<usize>,
    finished: HashMap<u64, Finished<u64>>,
    rng: u64,
}

impl ErrqRun {
    fn new(stream: bool, seed: u64, first: u32) -> Self {
        let mut t = SendTracker::new(stream, 4);
        t.errq_start(first);
        Self {
            t,
            stream,
            fatal: false,
            next: first,
            out: Vec::new(),
            queued: VecDeque::new(),
            refs: HashMap::new(),
            wire: Vec::new(),
            lens: Vec::new(),
            finished: HashMap::new(),
            rng: seed | 1,
        }
    }

    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn take_number(&mut self, buf: u64) {
        let copied = self.rand() % 4 == 0;
        self.out.push((self.next, buf, copied));
        self.next = self.next.wrapping_add(1);
        *self.refs.entry(buf).or_default() += 1;
    }

    fn call(&mut self, calm: bool) -> bool {
        let r = pop(&mut self.t, 1);
        let Some(&r) = r.first() else { return false };
        let buf = *self.t.buf(r.key.slot);
        let c = if calm {
            Call::Full
        } else {
            match self.rand() % 16 {
                0..=10 => Call::Full,
                11..=12 if self.stream => Call::Short,
                11..=12 => Call::FailTook,
                13 => Call::ByCopy,
                14 if !self.stream || self.rand() % 4 == 0 => Call::Fail,
                _ => Call::Full,
            }
        };
        match c {
            Call::Short if r.len > 1 => {
                let n = 1 + (self.rand() as usize) % (r.len - 1);
                self.wire.push((buf, r.off, n));
                self.take_number(buf);
                self.t.on_sent(r.key, n as i32, true);
            }
            Call::Full | Call::Short => {
                self.wire.push((buf, r.off, r.len));
                self.take_number(buf);
                self.t.on_sent(r.key, r.len as i32, true);
            }
            Call::ByCopy => {
                self.wire.push((buf, r.off, r.len));
                self.t.on_sent(r.key, r.len as i32, false);
            }
            Call::FailTook => {
                self.take_number(buf);
                self.t.on_sent(r.key, -libc::EMSGSIZE, true);
            }
            Call::Fail => {
                if self.stream {
                    self.fatal = true;
                }
                self.t.on_sent(r.key, -libc::ECONNRESET, false);
            }
        }
        true
    }

    fn complete(&mut self, n: usize) {
        for _ in 0..n {
            if self.out.is_empty() {
                return;
            }
            let i = (self.rand() as usize) % self.out.len();
            let (id, buf, copied) = self.out.swap_remove(i);
            *self.refs.get_mut(&buf).expect("ref") -= 1;
            match self.queued.back_mut() {
                Some((_, hi, c)) if *c == copied && hi.wrapping_add(1) == id => *hi = id,
                _ => self.queued.push_back((id, id, copied)),
            }
        }
    }

    fn collect(&mut self) {
        collect_finished(&mut self.t, &self.refs, &mut self.finished);
    }

    fn step(&mut self, op: &ErrqOp, calm: bool) {
        match *op {
            ErrqOp::Stage(len) => {
                let tag = self.lens.len() as u64;
                self.lens.push(len);
                self.t.stage(tag, tag, len);
            }
            ErrqOp::Call(n) => {
                for _ in 0..n {
                    if !self.call(calm) {
                        break;
                    }
                }
            }
            ErrqOp::Complete(n) => self.complete(n),
            ErrqOp::Reap(n) => {
                for _ in 0..n {
                    let Some((lo, hi, copied)) = self.queued.pop_front() else {
                        break;
                    };
                    assert_eq!(self.t.on_range(lo, hi, copied), 0, "every number matched");
                }
            }
        }
        self.collect();
    }

    fn drain(&mut self) {
        for _ in 0..10_000 {
            if self.t.live() == 0 {
                return;
            }
            self.step(&ErrqOp::Call(64), true);
            self.step(&ErrqOp::Complete(64), true);
            self.step(&ErrqOp::Reap(64), true);
        }
        panic!("did not drain: {:#?}", self.t);
    }

    fn check(&self) {
        let n = self.lens.len() as u64;
        check_moved_bytes(&self.lens, &self.finished, &self.wire);
        assert!(self.finished.values().all(|f| f.unsent.is_empty()));
        if self.stream {
            // What moved is the stream in order: the whole of it, or a prefix after a reset.
            check_stream_order(&self.lens, &self.wire, !self.fatal);
        } else {
            for tag in 0..n {
                let f = &self.finished[&tag];
                if f.error.is_some() {
                    continue;
                }
                assert_eq!(f.bytes, self.lens[tag as usize], "datagram bytes of {tag}");
            }
        }
    }
}

fn errq_ops() -> impl Strategy<Value = Vec<ErrqOp>> {
    prop::collection::vec(
        prop_oneof![
            4 => (1usize..=12).prop_map(ErrqOp::Stage),
            4 => (1usize..=6).prop_map(ErrqOp::Call),
            3 => (1usize..=6).prop_map(ErrqOp::Complete),
            3 => (1usize..=4).prop_map(ErrqOp::Reap),
        ],
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn errqueue_stream_sends_complete_once_in_order_and_never_early(
        ops in errq_ops(), seed in any::<u64>(), back in 0u32..64
    ) {
        // The counter starts close enough to the wrap that many runs cross it.
        let mut run = ErrqRun::new(true, seed, 0u32.wrapping_sub(back));
        for op in &ops {
            run.step(op, false);
        }
        run.drain();
        run.check();
    }

    #[test]
    fn errqueue_datagram_sends_complete_once_and_never_early(
        ops in errq_ops(), seed in any::<u64>(), back in 0u32..64
    ) {
        let mut run = ErrqRun::new(false, seed, 0u32.wrapping_sub(back));
        for op in &ops {
            run.step(op, false);
        }
        run.drain();
        run.check();
    }
}

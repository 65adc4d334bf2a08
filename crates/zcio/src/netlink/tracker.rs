//! The verdict tracker: which packets of one queue still need a verdict to reach the kernel,
//! as a state machine that never makes a syscall. [`super::NfQueue`] feeds it kernel events
//! (a packet received, a send completed or failed); the tests drive it with synthetic
//! sequences against a model of the kernel's queue.
//!
//! States of a packet (ids in arrival order, which is id order):
//!
//! - **decided**: the caller decided it; no message carrying the verdict is out;
//! - **held**: the caller holds it (its frame stays); [`Tracker::decide`] moves it to decided;
//! - **in flight**: its verdict is in a datagram handed to the kernel (a `sendto` under way or
//!   a ring send not yet completed), tagged with that datagram's [`SendId`];
//! - **confirmed**: the send of that datagram completed whole; the packet leaves the tracker.
//!
//! A failed send moves its packets back to decided, so the next [`Tracker::build`] sends
//! their verdicts again.
//!
//! Invariants (checked by the property tests):
//!
//! 1. a packet leaves the tracker only when a send carrying its verdict completed;
//! 2. a `VERDICT_BATCH(V, n)` is emitted only when every tracked id ≤ n is decided and in the
//!    same datagram: the batch's range starts at the oldest tracked id, so everything below
//!    it is confirmed, and it stops before the first held or in-flight id. A batch therefore
//!    never decides a held packet, nor a packet whose verdict went out in a send that may
//!    still fail (the kernel would otherwise decide it with V when that send fails);
//! 3. within a datagram, individual verdicts for ids ≤ n that are not plain V come before the
//!    batch (the kernel handles a datagram's messages in order), so the batch reaches only V's;
//! 4. a packet is in at most one datagram in flight at a time, so it never gets two verdicts.

use super::msg::{EmitError, MAX_ATTR_PAYLOAD};
use super::nfqmsg::{Verdict, VerdictMsg};
use std::collections::VecDeque;

/// A decided verdict, checked to fit one netlink message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The verdict.
    pub verdict: Verdict,
    /// A new mark.
    pub mark: Option<u32>,
    /// A replacement payload.
    pub payload: Option<Vec<u8>>,
}

impl Decided {
    /// A verdict, refusing a payload that an attribute cannot carry.
    pub fn new(
        verdict: Verdict,
        mark: Option<u32>,
        payload: Option<Vec<u8>>,
    ) -> Result<Self, EmitError> {
        if let Some(p) = &payload {
            if p.len() > MAX_ATTR_PAYLOAD {
                return Err(EmitError::AttrTooLong {
                    ty: crate::sys::nfqueue::NFQA_PAYLOAD,
                    len: p.len(),
                    max: MAX_ATTR_PAYLOAD,
                });
            }
        }
        Ok(Self {
            verdict,
            mark,
            payload,
        })
    }

    fn plain(&self) -> Option<Verdict> {
        (self.mark.is_none() && self.payload.is_none()).then_some(self.verdict)
    }
}

/// The frame of a held packet whose bytes were given up ([`Tracker::detach`]).
pub const NO_FRAME: u32 = u32::MAX;

/// Names one datagram handed to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SendId(pub u64);

/// State of a tracked packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Decided, not sent.
    Decided(Decided),
    /// Held by the caller; the value is the frame that keeps its bytes.
    Held(u32),
    /// Its verdict is in the datagram `SendId`.
    InFlight(Decided, SendId),
}

#[derive(Debug, Clone)]
struct Entry {
    id: u32,
    st: State,
}

/// What one [`Tracker::build`] put into a datagram.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Built {
    /// Packets whose verdicts it carries.
    pub packets: u64,
    /// `VERDICT` messages.
    pub singles: u64,
    /// `VERDICT_BATCH` messages (0 or 1).
    pub batches: u64,
    /// Packets decided by the batch.
    pub batched: u64,
}

/// Errors of the tracker's caller-facing operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrackError {
    /// The id is not held.
    NotHeld(u32),
}

/// The verdict tracker of one queue; see the module docs.
#[derive(Debug, Default)]
pub struct Tracker {
    queue: u16,
    entries: VecDeque<Entry>,
    next_send: u64,
    /// Sends not completed yet.
    in_flight: Vec<SendId>,
    /// Consecutive failed sends (reset by a completed one).
    failures: u32,
    /// A packet arrived that could not be identified: its id is unknown and stays pending
    /// in the kernel, so no batch may be sent any more (every later batch could cover it).
    no_batches: bool,
}

/// `a` comes after `b` in the kernel's wrapping id sequence (`nfq_id_after`).
fn id_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

impl Tracker {
    /// An empty tracker for `queue`.
    pub fn new(queue: u16) -> Self {
        Self {
            queue,
            ..Self::default()
        }
    }

    /// A packet arrived: decided (`Some`) or held in frame `frame` (`None`). Ids arrive in
    /// increasing order (the kernel assigns them in queue order and delivers in order).
    pub fn receive(&mut self, id: u32, d: Option<Decided>, frame: u32) {
        debug_assert!(
            self.entries.back().map_or(true, |e| id_after(id, e.id)),
            "ids arrive in order"
        );
        let st = match d {
            Some(d) => State::Decided(d),
            None => State::Held(frame),
        };
        self.entries.push_back(Entry { id, st });
    }

    /// A message whose packet id could not be read was received: from now on only individual
    /// verdicts are sent (a batch could decide the unknown packet). The kernel drops it at
    /// unbind.
    pub fn forbid_batches(&mut self) {
        self.no_batches = true;
    }

    /// Decides a held packet; returns the frame that held it.
    pub fn decide(&mut self, id: u32, d: Decided) -> Result<u32, TrackError> {
        let i = self.index(id).ok_or(TrackError::NotHeld(id))?;
        let e = &mut self.entries[i];
        let State::Held(frame) = e.st else {
            return Err(TrackError::NotHeld(id));
        };
        e.st = State::Decided(d);
        Ok(frame)
    }

    /// Keeps a held packet held but records that no frame keeps its bytes any more
    /// ([`NO_FRAME`]); returns the frame that did.
    pub fn detach(&mut self, id: u32) -> Result<u32, TrackError> {
        let i = self.index(id).ok_or(TrackError::NotHeld(id))?;
        let e = &mut self.entries[i];
        let State::Held(frame) = e.st else {
            return Err(TrackError::NotHeld(id));
        };
        e.st = State::Held(NO_FRAME);
        Ok(frame)
    }

    /// The state of a tracked packet.
    pub fn state(&self, id: u32) -> Option<&State> {
        self.index(id).map(|i| &self.entries[i].st)
    }

    /// Where `id` is tracked: a binary search, since entries are in the kernel's (wrapping)
    /// id order and span less than half the id space (`nfq_id_after`).
    fn index(&self, id: u32) -> Option<usize> {
        self.entries
            .binary_search_by(|e| (e.id.wrapping_sub(id) as i32).cmp(&0))
            .ok()
    }

    /// Held packets: `(id, frame)`.
    pub fn held(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.entries.iter().filter_map(|e| match e.st {
            State::Held(f) => Some((e.id, f)),
            _ => None,
        })
    }

    /// Packets tracked (not confirmed).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Packets decided and not sent.
    pub fn unsent(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| matches!(e.st, State::Decided(_)))
            .count()
    }

    /// Sends not completed yet.
    pub fn sends_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Consecutive failed sends.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Appends verdict messages for decided packets to `out` (numbered from `*seq + 1`),
    /// stopping before `out` would exceed `max_bytes` (one message at least), and marks them
    /// in flight under the returned [`SendId`]. `None` when nothing is decided.
    pub fn build(
        &mut self,
        out: &mut Vec<u8>,
        seq: &mut u32,
        max_bytes: usize,
    ) -> Option<(SendId, Built)> {
        if !self
            .entries
            .iter()
            .any(|e| matches!(e.st, State::Decided(_)))
        {
            return None;
        }
        let send = SendId(self.next_send);
        self.next_send += 1;
        let mut built = Built::default();
        let queue = self.queue;
        let full = |out: &Vec<u8>, d: &Decided| {
            // A verdict message is 16 + 4 + 12 bytes, + 8 for a mark, + 4 + payload.
            let need = 32 + 8 + d.payload.as_ref().map_or(0, |p| 4 + p.len() + 3);
            !out.is_empty() && out.len() + need > max_bytes
        };
        let mut emit = |out: &mut Vec<u8>, msg: &VerdictMsg<'_>| {
            *seq = seq.wrapping_add(1);
            // `Decided::new` bounded the payload, so the message fits its length fields.
            msg.emit(out, *seq)
                .expect("a checked verdict fits one message");
        };
        // 1. The batch prefix: decided packets from the oldest tracked id up to the first held
        //    or in-flight one. Its most common plain verdict V goes out as one batch for the
        //    highest id of V in the prefix, after individual verdicts for the prefix's other
        //    packets up to that id.
        let prefix = if self.no_batches {
            0
        } else {
            self.entries
                .iter()
                .position(|e| !matches!(e.st, State::Decided(_)))
                .unwrap_or(self.entries.len())
        };
        let mut counts: [(Option<Verdict>, usize); 4] = [(None, 0); 4];
        for e in self.entries.iter().take(prefix) {
            if let State::Decided(d) = &e.st {
                if let Some(v) = d.plain() {
                    if let Some(c) = counts.iter_mut().find(|c| c.0 == Some(v) || c.0.is_none()) {
                        c.0 = Some(v);
                        c.1 += 1;
                    }
                }
            }
        }
        let major = counts
            .iter()
            .filter(|c| c.1 >= 2)
            .max_by_key(|c| c.1)
            .and_then(|c| c.0);
        // The batch ends at the last plain-V packet of the prefix that fits this datagram.
        let mut batch_end = None;
        if let Some(v) = major {
            let mut bytes = out.len() + 40; // the batch message itself
            for (i, e) in self.entries.iter().take(prefix).enumerate() {
                let State::Decided(d) = &e.st else { break };
                if d.plain() == Some(v) {
                    batch_end = Some(i);
                } else {
                    let need = 32 + 8 + d.payload.as_ref().map_or(0, |p| 4 + p.len() + 3);
                    if bytes + need > max_bytes && batch_end.is_some() {
                        break;
                    }
                    bytes += need;
                }
            }
        }
        let mut n_major = 0u64;
        if let (Some(v), Some(end)) = (major, batch_end) {
            for e in self.entries.iter_mut().take(end + 1) {
                let State::Decided(d) = &e.st else {
                    unreachable!("the prefix holds decided packets only")
                };
                if d.plain() == Some(v) {
                    n_major += 1;
                } else {
                    emit(
                        out,
                        &VerdictMsg::single(queue, d.verdict, e.id, d.mark, d.payload.as_deref()),
                    );
                    built.singles += 1;
                }
                let State::Decided(d) = std::mem::replace(&mut e.st, State::Held(u32::MAX)) else {
                    unreachable!()
                };
                e.st = State::InFlight(d, send);
                built.packets += 1;
            }
            let last = self.entries[end].id;
            let mut msg = VerdictMsg::single(queue, v, last, None, None);
            msg.batch = n_major > 1;
            emit(out, &msg);
            if n_major > 1 {
                built.batches += 1;
                built.batched += n_major;
            } else {
                built.singles += 1;
            }
        }
        // 2. Every other decided packet: an individual verdict each, while they fit.
        for e in self.entries.iter_mut() {
            let State::Decided(d) = &e.st else { continue };
            if full(out, d) {
                break;
            }
            emit(
                out,
                &VerdictMsg::single(queue, d.verdict, e.id, d.mark, d.payload.as_deref()),
            );
            built.singles += 1;
            built.packets += 1;
            let State::Decided(d) = std::mem::replace(&mut e.st, State::Held(u32::MAX)) else {
                unreachable!()
            };
            e.st = State::InFlight(d, send);
        }
        if built.packets == 0 {
            return None;
        }
        self.in_flight.push(send);
        Some((send, built))
    }

    /// The datagram `send` reached the kernel whole: its packets are confirmed and leave.
    /// Returns how many left.
    pub fn confirmed(&mut self, send: SendId) -> usize {
        self.in_flight.retain(|s| *s != send);
        self.failures = 0;
        let before = self.entries.len();
        self.entries
            .retain(|e| !matches!(&e.st, State::InFlight(_, s) if *s == send));
        before - self.entries.len()
    }

    /// The datagram `send` failed: its packets are decided again (sent by the next build).
    /// Returns how many.
    pub fn failed(&mut self, send: SendId) -> usize {
        self.in_flight.retain(|s| *s != send);
        self.failures += 1;
        let mut n = 0;
        for e in self.entries.iter_mut() {
            if matches!(&e.st, State::InFlight(_, s) if *s == send) {
                let State::InFlight(d, _) = std::mem::replace(&mut e.st, State::Held(u32::MAX))
                else {
                    unreachable!()
                };
                e.st = State::Decided(d);
                n += 1;
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::msg::messages;
    use crate::netlink::nfqmsg::VerdictMsg;
    use std::collections::BTreeMap;

    fn plain(v: Verdict) -> Option<Decided> {
        Some(Decided::new(v, None, None).unwrap())
    }

    /// The verdict messages of a datagram: `(batch, verdict, id)`.
    fn msgs(out: &[u8]) -> Vec<(bool, Verdict, u32)> {
        messages(out)
            .map(|m| {
                let v = VerdictMsg::parse(&m.unwrap()).unwrap();
                (v.batch, v.verdict, v.id)
            })
            .collect()
    }

    #[test]
    fn a_run_of_equal_verdicts_is_one_batch() {
        let mut t = Tracker::new(0);
        for id in 1..=5 {
            t.receive(id, plain(Verdict::Accept), 0);
        }
        let mut out = Vec::new();
        let (s, b) = t.build(&mut out, &mut 0, 1 << 16).unwrap();
        assert_eq!(msgs(&out), vec![(true, Verdict::Accept, 5)]);
        assert_eq!((b.batches, b.batched, b.packets), (1, 5, 5));
        assert_eq!(t.len(), 5, "nothing leaves before the send completes");
        assert_eq!(t.confirmed(s), 5);
        assert!(t.is_empty());
    }

    #[test]
    fn failed_send_is_sent_again_and_a_later_batch_does_not_cover_it() {
        let mut t = Tracker::new(0);
        t.receive(1, plain(Verdict::Drop), 0);
        t.receive(2, plain(Verdict::Drop), 0);
        let mut out = Vec::new();
        let (s1, _) = t.build(&mut out, &mut 0, 1 << 16).unwrap();
        // While the first datagram is in flight, later accepts must not be batched over it.
        t.receive(3, plain(Verdict::Accept), 0);
        t.receive(4, plain(Verdict::Accept), 0);
        out.clear();
        let (s2, b) = t.build(&mut out, &mut 0, 1 << 16).unwrap();
        assert_eq!(b.batches, 0);
        assert_eq!(
            msgs(&out),
            vec![(false, Verdict::Accept, 3), (false, Verdict::Accept, 4)]
        );
        assert_eq!(t.failed(s1), 2);
        assert_eq!(t.confirmed(s2), 2);
        out.clear();
        let (s3, _) = t.build(&mut out, &mut 0, 1 << 16).unwrap();
        assert_eq!(msgs(&out), vec![(true, Verdict::Drop, 2)]);
        t.confirmed(s3);
        assert!(t.is_empty());
    }

    #[test]
    fn batch_stops_before_a_held_id_and_held_gets_its_own_verdict() {
        let mut t = Tracker::new(0);
        t.receive(1, plain(Verdict::Accept), 0);
        t.receive(2, plain(Verdict::Accept), 0);
        t.receive(3, None, 7);
        t.receive(4, plain(Verdict::Accept), 0);
        let mut out = Vec::new();
        let (s, _) = t.build(&mut out, &mut 0, 1 << 16).unwrap();
        assert_eq!(
            msgs(&out),
            vec![(true, Verdict::Accept, 2), (false, Verdict::Accept, 4)]
        );
        t.confirmed(s);
        assert_eq!(t.held().collect::<Vec<_>>(), vec![(3, 7)]);
        assert_eq!(t.decide(3, plain(Verdict::Drop).unwrap()), Ok(7));
        assert_eq!(
            t.decide(3, plain(Verdict::Drop).unwrap()),
            Err(TrackError::NotHeld(3))
        );
        out.clear();
        let (s, _) = t.build(&mut out, &mut 0, 1 << 16).unwrap();
        assert_eq!(msgs(&out), vec![(false, Verdict::Drop, 3)]);
        t.confirmed(s);
        assert!(t.is_empty());
    }

    #[test]
    fn other_verdicts_below_the_batch_id_go_first() {
        let mut t = Tracker::new(0);
        t.receive(1, plain(Verdict::Accept), 0);
        t.receive(2, plain(Verdict::Drop), 0);
        t.receive(
            3,
            Some(Decided::new(Verdict::Accept, Some(9), None).unwrap()),
            0,
        );
        t.receive(4, plain(Verdict::Accept), 0);
        let mut out = Vec::new();
        t.build(&mut out, &mut 0, 1 << 16).unwrap();
        assert_eq!(
            msgs(&out),
            vec![
                (false, Verdict::Drop, 2),
                (false, Verdict::Accept, 3),
                (true, Verdict::Accept, 4)
            ]
        );
    }

    #[test]
    fn an_oversize_payload_is_refused_before_it_is_tracked() {
        let e = Decided::new(Verdict::Accept, None, Some(vec![0; MAX_ATTR_PAYLOAD + 1]));
        assert!(matches!(e, Err(EmitError::AttrTooLong { .. })));
        assert!(Decided::new(Verdict::Accept, None, Some(vec![0; MAX_ATTR_PAYLOAD])).is_ok());
    }

    #[test]
    fn datagram_stops_at_max_bytes_and_the_rest_goes_next() {
        let mut t = Tracker::new(0);
        for id in 1..=10 {
            t.receive(
                id,
                Some(Decided::new(Verdict::Accept, None, Some(vec![1; 1000])).unwrap()),
                0,
            );
        }
        let mut out = Vec::new();
        let (s, b) = t.build(&mut out, &mut 0, 4096).unwrap();
        assert!(out.len() <= 4096, "{}", out.len());
        assert!(b.packets >= 1 && b.packets < 10);
        t.confirmed(s);
        let mut left = 10 - b.packets;
        while left > 0 {
            out.clear();
            let (s, b) = t.build(&mut out, &mut 0, 4096).unwrap();
            left -= b.packets;
            t.confirmed(s);
        }
        assert!(t.is_empty());
    }

    /// A model of the kernel's queue: ids waiting for a verdict, and the verdict each got.
    #[derive(Default)]
    struct Kernel {
        /// In queue (arrival) order, as `queue_list`.
        pending: VecDeque<u32>,
        got: BTreeMap<u32, Verdict>,
    }

    impl Kernel {
        /// Applies a datagram the way nfnetlink_queue does, message by message.
        fn apply(&mut self, out: &[u8], want: &BTreeMap<u32, Verdict>) {
            for m in messages(out) {
                let v = VerdictMsg::parse(&m.unwrap()).unwrap();
                if v.batch {
                    // `nfqnl_recv_verdict_batch`: queue order, up to the first id after n.
                    let covered: Vec<u32> = self
                        .pending
                        .iter()
                        .copied()
                        .take_while(|&id| !id_after(id, v.id))
                        .collect();
                    assert!(!covered.is_empty(), "a batch that decides nothing");
                    for id in covered {
                        assert_eq!(
                            want.get(&id),
                            Some(&v.verdict),
                            "batch {:?} ≤ {} covered id {id}, which is not decided {:?}",
                            v.verdict,
                            v.id,
                            v.verdict
                        );
                        self.pending.retain(|&p| p != id);
                        self.got.insert(id, v.verdict);
                    }
                } else {
                    let at = self.pending.iter().position(|&p| p == v.id);
                    assert!(
                        at.and_then(|i| self.pending.remove(i)).is_some(),
                        "verdict for id {} that the kernel no longer has",
                        v.id
                    );
                    assert_eq!(want.get(&v.id), Some(&v.verdict));
                    self.got.insert(v.id, v.verdict);
                }
            }
        }
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Ev {
            /// A packet: verdict index (0..3) or held (3), with a mark.
            Recv(u8, bool),
            /// Decide the n-th held packet.
            Decide(usize, u8),
            /// Build a datagram (at most this many bytes).
            Build(usize),
            /// Complete the n-th in-flight send: ok or failed.
            Complete(usize, bool),
        }

        fn ev() -> impl Strategy<Value = Ev> {
            prop_oneof![
                4 => (0u8..4, any::<bool>()).prop_map(|(v, m)| Ev::Recv(v, m)),
                2 => (0usize..8, 0u8..3).prop_map(|(i, v)| Ev::Decide(i, v)),
                2 => prop_oneof![Just(100usize), Just(400), Just(1 << 16)].prop_map(Ev::Build),
                3 => (0usize..4, prop::bool::weighted(0.7)).prop_map(|(i, ok)| Ev::Complete(i, ok)),
            ]
        }

        fn verdict(i: u8) -> Verdict {
            [Verdict::Accept, Verdict::Drop, Verdict::Queue(3)][i as usize % 3]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Whatever the order of receives, decisions, builds and send results (sends
            /// complete out of order and fail), the kernel model sees each packet decided
            /// exactly once and with the caller's verdict; nothing leaves the tracker before
            /// its send completed; at the end everything is confirmed.
            #[test]
            fn every_packet_gets_its_own_verdict_exactly_once(
                evs in prop::collection::vec(ev(), 1..200),
                start in prop_oneof![Just(1u32), Just(u32::MAX - 20)],
            ) {
                let mut t = Tracker::new(0);
                let mut k = Kernel::default();
                let mut want = BTreeMap::new();
                let mut next = start;
                let mut held: Vec<u32> = Vec::new();
                let mut flights: Vec<(SendId, Vec<u8>)> = Vec::new();
                let mut seq = 0;
                for e in evs {
                    match e {
                        Ev::Recv(v, mark) => {
                            let id = next;
                            next = next.wrapping_add(1);
                            k.pending.push_back(id);
                            if v == 3 {
                                held.push(id);
                                t.receive(id, None, id);
                            } else {
                                want.insert(id, verdict(v));
                                let d = Decided::new(verdict(v), mark.then_some(7), None).unwrap();
                                t.receive(id, Some(d), 0);
                            }
                        }
                        Ev::Decide(i, v) => {
                            if !held.is_empty() {
                                let id = held.remove(i % held.len());
                                want.insert(id, verdict(v));
                                let d = Decided::new(verdict(v), None, None).unwrap();
                                prop_assert_eq!(t.decide(id, d), Ok(id));
                            }
                        }
                        Ev::Build(max) => {
                            let mut out = Vec::new();
                            if let Some((s, b)) = t.build(&mut out, &mut seq, max) {
                                prop_assert!(b.packets > 0);
                                flights.push((s, out));
                            }
                        }
                        Ev::Complete(i, ok) => {
                            if !flights.is_empty() {
                                let (s, out) = flights.remove(i % flights.len());
                                if ok {
                                    k.apply(&out, &want);
                                    t.confirmed(s);
                                } else {
                                    t.failed(s);
                                }
                            }
                        }
                    }
                    // Invariant 1: the tracker has exactly the ids the kernel still has.
                    prop_assert_eq!(t.len(), k.pending.len());
                }
                // Drain: decide the held, send and confirm everything.
                for id in held.drain(..) {
                    want.insert(id, Verdict::Accept);
                    t.decide(id, Decided::new(Verdict::Accept, None, None).unwrap()).unwrap();
                }
                for (s, out) in flights.drain(..) {
                    k.apply(&out, &want);
                    t.confirmed(s);
                }
                while let Some((s, _)) = {
                    let mut out = Vec::new();
                    let r = t.build(&mut out, &mut seq, 1 << 16);
                    if r.is_some() { k.apply(&out, &want); }
                    r
                } {
                    t.confirmed(s);
                }
                prop_assert!(t.is_empty());
                prop_assert!(k.pending.is_empty());
                prop_assert_eq!(&k.got, &want);
            }
        }
    }
}

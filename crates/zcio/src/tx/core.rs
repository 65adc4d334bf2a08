//! The send core without I/O: [`SendTracker`] decides when a zero-copy send is finished and
//! its buffer may be handed back; [`AutoPolicy`](super::policy::AutoPolicy) decides which
//! path a send takes. Neither makes a syscall: the backend (`ring::send::SendRing`) feeds
//! them kernel events and carries out what they return, and tests drive them with synthetic
//! event sequences (the states, transitions and invariants are in `docs/design/tx.md`).
//!
//! A send (one ticket, one buffer) is split into requests of at most `chunk` bytes. A request
//! is *staged* (queued here), then *in the kernel* (popped by the backend and pushed as an
//! SQE) until its result arrives. A result with `F_MORE` and bytes announces a notification
//! that says whether the kernel copied; `F_MORE` without bytes announces one that says
//! nothing; a failed result without `F_MORE` *may* still be followed by one (a request that
//! passed prep flushes its notification in cleanup), which is settled by the first harvest
//! after the next `GETEVENTS` enter. The send is finished when no request is staged or in the
//! kernel and no notification is owed: only then does its buffer come back.
//!
//! `MSG_ZEROCOPY` (`tx::msgzc`) drives the same machine: each accepted `send` call is a
//! request whose result is known at once ([`SendTracker::on_sent`]) and which takes the
//! socket's next errqueue sequence number; its notification is the errqueue range that covers
//! that number ([`SendTracker::on_range`], inclusive `[lo, hi]`, any order, u32 wrap).

use std::collections::VecDeque;

/// Longest chain submitted at once on a stream socket.
pub(crate) const MAX_CHAIN: usize = 256;

/// What a request's SQE carries in `user_data`: the slot (buffer) it belongs to, the slot's
/// generation (one per use of the slot, so a late notification of an earlier use never
/// matches a later one) and the request's number within that use (every submission,
/// resubmissions included, gets a new one, so each notification names exactly one request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub(crate) slot: u32,
    pub(crate) gen: u16,
    pub(crate) req: u32,
}

/// One request for the backend to submit: `len` bytes of the slot's buffer from `off`;
/// `link` = chain it to the next request (`IOSQE_IO_LINK`, stream sockets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) key: Key,
    pub(crate) off: usize,
    pub(crate) len: usize,
    pub(crate) link: bool,
}

/// What a notification said about copying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Usage {
    /// Sent without a copy.
    ZeroCopy,
    /// `IORING_NOTIF_USAGE_ZC_COPIED`: the kernel copied after all.
    Copied,
    /// No usage report (`IORING_SEND_ZC_REPORT_USAGE` not set: kernels before 6.2).
    Unknown,
}

/// A send whose buffer the kernel no longer references.
#[derive(Debug)]
pub(crate) struct Finished<B> {
    pub(crate) tag: u64,
    pub(crate) buf: B,
    /// Bytes the kernel accepted.
    pub(crate) bytes: usize,
    /// The first error (errno) of the send, or the stream's fatal error.
    pub(crate) error: Option<i32>,
    pub(crate) zc: u32,
    pub(crate) copied: u32,
    pub(crate) unknown: u32,
    /// Byte ranges `(offset, len)` never handed to the kernel because the tracker gave up;
    /// in offset order. The caller sends them another way, in ticket order.
    pub(crate) unsent: Vec<(usize, usize)>,
}

/// Counters of a [`SendTracker`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TrackStats {
    /// Requests handed to the backend.
    pub(crate) requests: u64,
    /// Result CQEs seen.
    pub(crate) results: u64,
    /// Notification CQEs seen.
    pub(crate) notifs: u64,
    /// Notifications with `IORING_NOTIF_USAGE_ZC_COPIED`.
    pub(crate) notifs_copied: u64,
    /// Notifications of sends that moved bytes but carried no usage report.
    pub(crate) notifs_unknown: u64,
    /// Notifications that arrived before their request's result.
    pub(crate) notifs_early: u64,
    /// Requests resubmitted (short sends continued, cancelled links, ENOBUFS retries).
    pub(crate) resubmits: u64,
    /// Times submission paused for room (ENOBUFS/ENOMEM) until a notification came.
    pub(crate) room_waits: u64,
    /// Notifications that matched no request awaiting one (late ones of failed requests).
    pub(crate) stray_notifs: u64,
    /// `MSG_ZEROCOPY` errqueue ranges seen.
    pub(crate) ranges: u64,
    /// Sequence numbers in errqueue ranges that no outstanding send had (never issued by
    /// this tracker, or completed twice): counted, never matched to a buffer.
    pub(crate) unknown_ids: u64,
}

/// What may still come for a request after its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// A notification (`F_MORE`, or an errqueue sequence number taken).
    Notif,
    /// Perhaps a notification (io_uring: failed without `F_MORE`).
    Maybe,
    /// Nothing.
    Nothing,
}

#[derive(Debug)]
struct Slot<B> {
    buf: B,
    tag: u64,
    gen: u16,
    done: usize,
    /// Requests handed to the backend whose chain (stream) or result (datagram) is not
    /// settled yet.
    reqs: u32,
    /// Requests waiting here.
    staged: u32,
    /// Requests handed out and not finished (see [`Open`]).
    open: Vec<Open>,
    /// Number of the next request of this use of the slot.
    next_req: u32,
    zc: u32,
    copied: u32,
    unknown: u32,
    error: Option<i32>,
    unsent: Vec<(usize, usize)>,
}

#[derive(Debug, Clone, Copy)]
struct Req {
    slot: u32,
    off: usize,
    len: usize,
}

/// A request handed to the backend and not finished.
#[derive(Debug, Clone, Copy)]
struct Open {
    id: u32,
    off: usize,
    len: usize,
    state: ReqState,
}

/// Where one request stands. It finishes (leaves [`Slot::open`]) when nothing more can come
/// for it: a result without a notification to wait for, or its notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReqState {
    /// In the kernel, no result yet; `early` = its notification came first.
    InKernel { early: Option<Usage> },
    /// Result with `F_MORE`; `counts` = it moved bytes, so the notification's usage counts.
    Owed { counts: bool },
    /// Failed result without `F_MORE`: a notification may still come, posted at the latest
    /// by the first `GETEVENTS` enter after `seen_at` (then harvested).
    Maybe { seen_at: u64 },
}

/// The send-side state machine of one socket. `B` is the buffer type (the backend's
/// `PoolBuf`; anything in tests); the tracker only holds it.
#[derive(Debug)]
pub(crate) struct SendTracker<B> {
    stream: bool,
    chunk: usize,
    slots: Vec<Option<Slot<B>>>,
    /// Emptied `Slot::open` lists, kept for the next sends.
    spare_open: Vec<Vec<Open>>,
    gens: Vec<u16>,
    free: Vec<u32>,
    staged: VecDeque<Req>,
    chain: Vec<(Req, u32, Option<i32>)>,
    /// Scratch lists of `end_chain`, kept for their capacity.
    scratch_front: Vec<Req>,
    scratch_touched: Vec<u32>,
    chain_pending: usize,
    chain_cap: usize,
    in_kernel: usize,
    notifs_pending: usize,
    unsettled: Vec<u32>,
    live: usize,
    blocked: bool,
    /// Report "no room with nothing in flight" instead of giving up (the backend switches
    /// the socket to a path that needs no room and calls [`SendTracker::unblock`]).
    starve_signal: bool,
    starved: bool,
    fatal: Option<i32>,
    gave_up: Option<i32>,
    epoch: u64,
    /// `MSG_ZEROCOPY`: the request of each errqueue sequence number from `errq_base` on,
    /// `None` once completed.
    errq: VecDeque<Option<Key>>,
    errq_base: u32,
    errq_live: usize,
    done: VecDeque<Finished<B>>,
    stats: TrackStats,
}

impl<B> SendTracker<B> {
    /// A tracker for one socket: `stream` = ordered, linked chains (TCP); `chunk` = most
    /// bytes per request (datagram sockets: one GSO write).
    pub(crate) fn new(stream: bool, chunk: usize) -> Self {
        Self {
            stream,
            chunk: chunk.max(1),
            slots: Vec::new(),
            spare_open: Vec::new(),
            gens: Vec::new(),
            free: Vec::new(),
            staged: VecDeque::new(),
            chain: Vec::new(),
            scratch_front: Vec::new(),
            scratch_touched: Vec::new(),
            chain_pending: 0,
            chain_cap: MAX_CHAIN,
            in_kernel: 0,
            notifs_pending: 0,
            unsettled: Vec::new(),
            live: 0,
            blocked: false,
            starve_signal: false,
            starved: false,
            fatal: None,
            gave_up: None,
            epoch: 0,
            errq: VecDeque::new(),
            errq_base: 0,
            errq_live: 0,
            done: VecDeque::new(),
            stats: TrackStats::default(),
        }
    }

    /// Stages a send of `len` bytes of `buf`; returns its slot and generation (the key of
    /// its requests). An empty send, or any send after a fatal stream error or after the
    /// tracker gave up, finishes at once (`None`).
    pub(crate) fn stage(&mut self, tag: u64, buf: B, len: usize) -> Option<(u32, u16)> {
        let mut slot = Slot {
            buf,
            tag,
            gen: 0,
            done: 0,
            reqs: 0,
            staged: 0,
            // Reused: a send's bookkeeping allocates nothing in the steady state.
            open: self.spare_open.pop().unwrap_or_default(),
            next_req: 0,
            zc: 0,
            copied: 0,
            unknown: 0,
            error: None,
            unsent: Vec::new(),
        };
        if len == 0 {
            self.emit(slot);
            return None;
        }
        if let Some(e) = self.fatal {
            slot.error = Some(e);
            self.emit(slot);
            return None;
        }
        if self.gave_up.is_some() {
            slot.unsent.push((0, len));
            self.emit(slot);
            return None;
        }
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                // Slots are named by 16 bits in user_data; live sends are bounded by the
                // sender's depth, far below that.
                assert!(self.slots.len() < 1 << 16, "too many sends in flight");
                self.slots.push(None);
                self.gens.push(0);
                (self.slots.len() - 1) as u32
            }
        };
        // Generations wrap within the bits user_data has for them (`ring::key`).
        self.gens[idx as usize] =
            self.gens[idx as usize].wrapping_add(1) & crate::ring::key::SEND_GEN_MASK;
        slot.gen = self.gens[idx as usize];
        let mut off = 0;
        while off < len {
            let n = (len - off).min(self.chunk);
            self.staged.push_back(Req {
                slot: idx,
                off,
                len: n,
            });
            slot.staged += 1;
            off += n;
        }
        let gen = slot.gen;
        self.slots[idx as usize] = Some(slot);
        self.live += 1;
        Some((idx, gen))
    }

    /// Makes "no room even with nothing in flight" a signal ([`SendTracker::starved`]) instead
    /// of giving up: for a backend that can switch the socket to a path that needs no room.
    pub(crate) fn signal_starvation(&mut self, on: bool) {
        self.starve_signal = on;
    }

    /// Whether a request found no room with nothing of ours in flight (see
    /// [`SendTracker::signal_starvation`]); requests wait until [`SendTracker::unblock`].
    pub(crate) fn starved(&self) -> bool {
        self.starved
    }

    /// Submission may go on (the backend changed what the requests need).
    pub(crate) fn unblock(&mut self) {
        self.blocked = false;
        self.starved = false;
    }

    /// Moves up to `room` requests that may go now into `out` and counts them as in the
    /// kernel. Stream sockets: one linked chain at a time, the next only once every result
    /// of the previous one is in. After a request found no room: nothing until a
    /// notification frees some; with nothing of ours in flight the tracker gives up
    /// (`ENOBUFS`) and the staged ranges become unsent.
    pub(crate) fn pop_requests(&mut self, room: usize, out: &mut Vec<Request>) {
        if self.staged.is_empty() || room == 0 {
            return;
        }
        if let Some(e) = self.gave_up {
            self.give_up(e);
            return;
        }
        if self.blocked {
            if self.notifs_pending > 0 || self.in_kernel > 0 {
                return;
            }
            if self.starve_signal {
                self.starved = true;
                return;
            }
            self.give_up(libc::ENOBUFS);
            return;
        }
        if self.stream {
            if self.chain_pending > 0 {
                return;
            }
            let n = self.staged.len().min(self.chain_cap).min(room);
            for i in 0..n {
                let req = self.staged.pop_front().expect("counted");
                let r = self.hand_out(req, i + 1 < n);
                self.chain.push((req, r.key.req, None));
                out.push(r);
            }
            self.chain_pending = n;
        } else {
            for _ in 0..room {
                let Some(req) = self.staged.pop_front() else {
                    break;
                };
                out.push(self.hand_out(req, false));
            }
        }
    }

    fn hand_out(&mut self, req: Req, link: bool) -> Request {
        let slot = self.slots[req.slot as usize]
            .as_mut()
            .expect("staged request has a live slot");
        slot.staged -= 1;
        slot.reqs += 1;
        let id = slot.next_req;
        // Request numbers wrap within the bits user_data has for them (`ring::key`).
        slot.next_req = slot.next_req.wrapping_add(1) & crate::ring::key::SEND_REQ_MASK;
        slot.open.push(Open {
            id,
            off: req.off,
            len: req.len,
            state: ReqState::InKernel { early: None },
        });
        self.in_kernel += 1;
        self.stats.requests += 1;
        Request {
            key: Key {
                slot: req.slot,
                gen: slot.gen,
                req: id,
            },
            off: req.off,
            len: req.len,
            link,
        }
    }

    /// The buffer of a live slot (for the backend to point an SQE at).
    pub(crate) fn buf(&self, slot: u32) -> &B {
        &self.slots[slot as usize].as_ref().expect("live slot").buf
    }

    /// The ticket of a live slot.
    pub(crate) fn tag(&self, slot: u32) -> u64 {
        self.slots[slot as usize].as_ref().expect("live slot").tag
    }

    /// The backend entered the kernel with `GETEVENTS`; `total` counts such enters so far.
    /// Task work (the notifications of failed requests included) has run by then.
    pub(crate) fn entered(&mut self, total: u64) {
        self.epoch = self.epoch.max(total);
    }

    /// A result CQE: `res` bytes or `-errno`; `more` = `IORING_CQE_F_MORE`.
    pub(crate) fn on_result(&mut self, key: Key, res: i32, more: bool) {
        let then = if more {
            Then::Notif
        } else if res < 0 {
            Then::Maybe
        } else {
            Then::Nothing
        };
        self.result(key, res, then);
    }

    /// The result of a request that never notifies (io_uring `SEND`: the kernel copied): it
    /// is done, failed or not.
    pub(crate) fn on_copy_result(&mut self, key: Key, res: i32) {
        self.result(key, res, Then::Nothing);
    }

    /// `MSG_ZEROCOPY`: the `send` call of request `key` returned `res` (bytes or `-errno`);
    /// `took_id` = the kernel gave it the socket's next errqueue sequence number (every call
    /// that moved bytes by zero-copy; a failed datagram whose completion was queued anyway),
    /// so an errqueue range will name it.
    pub(crate) fn on_sent(&mut self, key: Key, res: i32, took_id: bool) {
        if took_id {
            self.errq.push_back(Some(key));
            self.errq_live += 1;
            self.result(key, res, Then::Notif);
        } else {
            self.result(key, res, Then::Nothing);
        }
    }

    /// `MSG_ZEROCOPY`: the errqueue range `[lo, hi]` (inclusive, wrap-aware) completed;
    /// `copied` = `SO_EE_CODE_ZEROCOPY_COPIED`. Each outstanding number in it is its
    /// request's notification; returns how many numbers were not outstanding (never issued
    /// here, or completed twice), which are counted, never matched.
    pub(crate) fn on_range(&mut self, lo: u32, hi: u32, copied: bool) -> u64 {
        self.stats.ranges += 1;
        let usage = if copied {
            Usage::Copied
        } else {
            Usage::ZeroCopy
        };
        let n = u64::from(hi.wrapping_sub(lo)) + 1;
        let len = self.errq.len() as u64;
        let mut unknown = 0;
        for k in 0..n {
            let pos = u64::from(lo.wrapping_add(k as u32).wrapping_sub(self.errq_base));
            let key = if pos < len {
                self.errq[pos as usize].take()
            } else {
                None
            };
            match key {
                Some(key) => {
                    self.errq_live -= 1;
                    self.on_notif(key, usage);
                }
                None => unknown += 1,
            }
        }
        while let Some(None) = self.errq.front() {
            self.errq.pop_front();
            self.errq_base = self.errq_base.wrapping_add(1);
        }
        self.stats.unknown_ids += unknown;
        unknown
    }

    /// `MSG_ZEROCOPY`: the sequence number the next accepted call will take (the socket's
    /// counter starts at 0 with its first `MSG_ZEROCOPY` call).
    pub(crate) fn errq_next(&self) -> u32 {
        self.errq_base.wrapping_add(self.errq.len() as u32)
    }

    /// `MSG_ZEROCOPY`: the oldest outstanding sequence number (meaningful when
    /// [`SendTracker::errq_outstanding`] is not 0).
    pub(crate) fn errq_oldest(&self) -> u32 {
        self.errq_base
    }

    /// `MSG_ZEROCOPY`: sequence numbers taken and not completed.
    pub(crate) fn errq_outstanding(&self) -> usize {
        self.errq_live
    }

    /// `MSG_ZEROCOPY`: the socket's next sequence number is `first` (only before any call;
    /// no call reads the kernel's counter, so only tests start elsewhere than 0).
    #[cfg(test)]
    pub(crate) fn errq_start(&mut self, first: u32) {
        debug_assert!(self.errq.is_empty(), "errqueue counter set with sends out");
        if self.errq.is_empty() {
            self.errq_base = first;
        }
    }

    /// The connection failed outside any request (a socket error seen while waiting):
    /// every send still owned here carries `errno`, staged requests are dropped, and new
    /// sends finish at once with it. Requests in the kernel finish as they would have.
    pub(crate) fn fail(&mut self, errno: i32) {
        self.fatal.get_or_insert(errno);
        self.fail_staged();
    }

    fn fail_staged(&mut self) {
        let Some(e) = self.fatal else { return };
        for s in self.slots.iter_mut().flatten() {
            s.error.get_or_insert(e);
        }
        let mut touched = Vec::new();
        while let Some(r) = self.staged.pop_front() {
            let slot = self.slot(r.slot);
            slot.staged -= 1;
            slot.error.get_or_insert(e);
            touched.push(r.slot);
        }
        for idx in touched {
            self.finish(idx);
        }
    }

    fn result(&mut self, key: Key, res: i32, then: Then) {
        let Some(i) = self.find(key, |st| matches!(st, ReqState::InKernel { .. })) else {
            // Cannot happen: a request's result comes once, and its slot lives until then.
            self.stats.stray_notifs += 1;
            return;
        };
        self.stats.results += 1;
        self.in_kernel -= 1;
        let idx = key.slot;
        let epoch = self.epoch;
        let slot = self.slots[idx as usize].as_mut().expect("found");
        let Open {
            off, len, state, ..
        } = slot.open[i];
        let ReqState::InKernel { early } = state else {
            unreachable!("found in kernel")
        };
        let next = match (then, res > 0, early) {
            // Its notification came first: nothing more will come for it.
            (Then::Notif, true, Some(u)) => {
                count_usage(
                    &mut slot.zc,
                    &mut slot.copied,
                    &mut slot.unknown,
                    &mut self.stats,
                    u,
                );
                None
            }
            (_, _, Some(_)) => None,
            (Then::Notif, counts, None) => {
                self.notifs_pending += 1;
                Some(ReqState::Owed { counts })
            }
            (Then::Maybe, _, None) => {
                self.unsettled.push(idx);
                Some(ReqState::Maybe { seen_at: epoch })
            }
            (Then::Nothing, _, None) => None,
        };
        match next {
            Some(st) => slot.open[i].state = st,
            None => {
                slot.open.swap_remove(i);
            }
        }
        if self.stream {
            if let Some(e) = self
                .chain
                .iter_mut()
                .find(|(r, id, _)| r.slot == idx && *id == key.req)
            {
                e.2 = Some(res);
            }
            self.chain_pending -= 1;
            if self.chain_pending == 0 {
                self.end_chain();
            }
            return;
        }
        let gave_up = self.gave_up.is_some();
        let fatal = self.fatal.is_some();
        let slot = self.slot(idx);
        slot.reqs -= 1;
        if res >= 0 {
            slot.done += res as usize;
        } else if gave_up && (is_room(-res) || -res == libc::EOPNOTSUPP || -res == libc::ECANCELED)
        {
            slot.unsent.push((off, len));
        } else if is_room(-res) {
            slot.staged += 1;
            self.staged.push_front(Req {
                slot: idx,
                off,
                len,
            });
            self.stats.resubmits += 1;
            self.stats.room_waits += 1;
            self.blocked = true;
        } else if -res == libc::ECANCELED && !fatal {
            // Refused for a reason the backend removed (it changed the socket's path): again,
            // in order.
            slot.staged += 1;
            self.staged.push_front(Req {
                slot: idx,
                off,
                len,
            });
            self.stats.resubmits += 1;
        } else if -res == libc::EOPNOTSUPP {
            slot.unsent.push((off, len));
            self.give_up(libc::EOPNOTSUPP);
        } else {
            slot.error.get_or_insert(-res);
        }
        self.finish(idx);
    }

    /// A notification CQE (`IORING_CQE_F_NOTIF`) with what it said about copying.
    pub(crate) fn on_notif(&mut self, key: Key, usage: Usage) {
        self.stats.notifs += 1;
        let Some(i) = self.find(key, |_| true) else {
            self.stats.stray_notifs += 1;
            return;
        };
        let idx = key.slot;
        let slot = self.slots[idx as usize].as_mut().expect("found");
        match slot.open[i].state {
            ReqState::InKernel { early: None } => {
                // Before its result: kept until the result says what it belongs to.
                self.stats.notifs_early += 1;
                self.blocked = false;
                slot.open[i].state = ReqState::InKernel { early: Some(usage) };
                return;
            }
            ReqState::InKernel { early: Some(_) } => {
                self.stats.stray_notifs += 1;
                return;
            }
            ReqState::Owed { counts } => {
                self.notifs_pending -= 1;
                if counts {
                    // The kernel released pages of a send: room may be back.
                    self.blocked = false;
                    count_usage(
                        &mut slot.zc,
                        &mut slot.copied,
                        &mut slot.unknown,
                        &mut self.stats,
                        usage,
                    );
                }
            }
            ReqState::Maybe { .. } => {}
        }
        slot.open.swap_remove(i);
        self.finish(idx);
    }

    /// The backend handed the request `key` to the ring, but the kernel never took it (the
    /// `io_uring_enter` that would have submitted it failed, and the ring will not be
    /// entered again): it is as if it had never been handed out. Call after
    /// [`SendTracker::give_up`], so its range becomes unsent.
    pub(crate) fn withdraw(&mut self, key: Key) {
        let Some(i) = self.find(key, |st| matches!(st, ReqState::InKernel { .. })) else {
            return;
        };
        self.in_kernel -= 1;
        let slot = self.slots[key.slot as usize].as_mut().expect("found");
        let Open { off, len, .. } = slot.open.swap_remove(i);
        if self.stream {
            if let Some(e) = self
                .chain
                .iter_mut()
                .find(|(r, id, _)| r.slot == key.slot && *id == key.req)
            {
                e.2 = Some(-libc::ECANCELED);
            }
            self.chain_pending -= 1;
            if self.chain_pending == 0 {
                self.end_chain();
            }
            return;
        }
        slot.reqs -= 1;
        slot.staged += 1;
        self.staged.push_front(Req {
            slot: key.slot,
            off,
            len,
        });
        if let Some(e) = self.gave_up {
            self.give_up(e);
        }
        self.finish(key.slot);
    }

    /// Hands every unsent range decided so far, of live and finished sends alike, to `f` in
    /// ticket and offset order (`f(tag, buf, off, len)` sends them another way and returns
    /// the bytes it sent and its error); the bytes are added to the send's count. Call only
    /// once no request is in the kernel and none is staged, so nothing sent later can
    /// overtake them.
    pub(crate) fn send_unsent(
        &mut self,
        mut f: impl FnMut(u64, &B, usize, usize) -> (usize, Option<i32>),
    ) {
        // (tag, where): where = Ok(slot index) or Err(index in `done`).
        let mut todo: Vec<(u64, Result<usize, usize>)> = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(s) = s.as_ref().filter(|s| !s.unsent.is_empty()) {
                todo.push((s.tag, Ok(i)));
            }
        }
        for (i, d) in self.done.iter().enumerate() {
            if !d.unsent.is_empty() {
                todo.push((d.tag, Err(i)));
            }
        }
        todo.sort_unstable_by_key(|t| t.0);
        for (tag, at) in todo {
            let (buf, ranges, bytes, error) = match at {
                Ok(i) => {
                    let s = self.slots[i].as_mut().expect("live");
                    s.unsent.sort_unstable();
                    (
                        &s.buf,
                        std::mem::take(&mut s.unsent),
                        &mut s.done,
                        &mut s.error,
                    )
                }
                Err(i) => {
                    let d = &mut self.done[i];
                    (
                        &d.buf,
                        std::mem::take(&mut d.unsent),
                        &mut d.bytes,
                        &mut d.error,
                    )
                }
            };
            for (off, len) in ranges {
                let (n, e) = f(tag, buf, off, len);
                *bytes += n;
                if let Some(e) = e {
                    error.get_or_insert(e);
                }
            }
        }
    }

    /// The open request `key` names, if its state passes `f`.
    fn find(&self, key: Key, f: impl Fn(&ReqState) -> bool) -> Option<usize> {
        let slot = self.slots.get(key.slot as usize)?.as_ref()?;
        if slot.gen != key.gen {
            return None;
        }
        slot.open
            .iter()
            .position(|o| o.id == key.req && f(&o.state))
    }

    /// End of a harvest: failed requests whose notification, if the kernel posts one, would
    /// have been posted by an enter since their result was seen stop waiting for it.
    pub(crate) fn settle(&mut self) {
        if self.unsettled.is_empty() {
            return;
        }
        let epoch = self.epoch;
        let mut keep = Vec::new();
        for idx in std::mem::take(&mut self.unsettled) {
            let Some(Some(slot)) = self.slots.get_mut(idx as usize) else {
                continue;
            };
            let before = slot.open.len();
            slot.open
                .retain(|o| !matches!(o.state, ReqState::Maybe { seen_at } if epoch > seen_at));
            let left = slot
                .open
                .iter()
                .any(|o| matches!(o.state, ReqState::Maybe { .. }));
            if left && !keep.contains(&idx) {
                keep.push(idx);
            }
            if slot.open.len() != before {
                self.finish(idx);
            }
        }
        self.unsettled = keep;
    }

    fn end_chain(&mut self) {
        // The lists keep their capacity from chain to chain: no allocation per chain.
        let mut chain = std::mem::take(&mut self.chain);
        let n = chain.len();
        let mut room = false;
        let mut front = std::mem::take(&mut self.scratch_front);
        let mut touched = std::mem::take(&mut self.scratch_touched);
        for (req, _, res) in chain.drain(..) {
            let res = res.unwrap_or(-libc::ECANCELED);
            touched.push(req.slot);
            let fatal = self.fatal;
            let slot = self.slot(req.slot);
            slot.reqs -= 1;
            if res >= 0 {
                let n = res as usize;
                slot.done += n;
                if n < req.len {
                    slot.staged += 1;
                    front.push(Req {
                        slot: req.slot,
                        off: req.off + n,
                        len: req.len - n,
                    });
                }
            } else if -res == libc::ECANCELED && fatal.is_none() {
                slot.staged += 1;
                front.push(req);
            } else if is_room(-res) && fatal.is_none() {
                slot.staged += 1;
                front.push(req);
                room = true;
            } else if -res == libc::EOPNOTSUPP && fatal.is_none() {
                slot.staged += 1;
                front.push(req);
                self.gave_up.get_or_insert(libc::EOPNOTSUPP);
            } else {
                let e = fatal.unwrap_or(-res);
                slot.error.get_or_insert(e);
                self.fatal.get_or_insert(e);
            }
        }
        if room {
            // With links, one request without room (ENOMEM/ENOBUFS, often at prep) fails
            // the whole chain, whose other requests held room meanwhile: shorter chains
            // first, and wait for a notification only once a single request lacks room.
            self.stats.room_waits += 1;
            if n > 1 {
                self.chain_cap = (n / 2).max(1);
            } else {
                self.blocked = true;
            }
        } else if self.chain_cap < MAX_CHAIN {
            self.chain_cap = (self.chain_cap * 2).min(MAX_CHAIN);
        }
        self.chain = chain;
        self.stats.resubmits += front.len() as u64;
        for r in front.drain(..).rev() {
            self.staged.push_front(r);
        }
        self.scratch_front = front;
        if self.fatal.is_some() {
            // Everything still owned by the tracker failed with the connection: mark it, so
            // buffers that come back later (on notification) carry the error too.
            self.fail_staged();
        } else if let Some(e) = self.gave_up {
            self.give_up(e);
        }
        for &idx in &touched {
            self.finish(idx);
        }
        touched.clear();
        self.scratch_touched = touched;
    }

    /// Stops submitting: every staged request becomes an unsent range of its send, and so
    /// does every request that comes back unsent (cancelled, short, no room) from now on.
    /// Requests in the kernel finish as they would have.
    pub(crate) fn give_up(&mut self, errno: i32) {
        self.gave_up.get_or_insert(errno);
        if self.stream && self.chain_pending > 0 {
            // The chain's results decide what is unsent (`end_chain` comes back here).
            return;
        }
        let mut touched = Vec::new();
        while let Some(r) = self.staged.pop_front() {
            let slot = self.slot(r.slot);
            slot.staged -= 1;
            slot.unsent.push((r.off, r.len));
            touched.push(r.slot);
        }
        for idx in touched {
            self.finish(idx);
        }
    }

    fn slot(&mut self, idx: u32) -> &mut Slot<B> {
        self.slots[idx as usize]
            .as_mut()
            .expect("event for a live slot")
    }

    fn finish(&mut self, idx: u32) {
        let ready = matches!(&self.slots[idx as usize],
            Some(s) if s.reqs == 0 && s.open.is_empty() && s.staged == 0);
        if !ready {
            return;
        }
        let slot = self.slots[idx as usize].take().expect("checked");
        self.free.push(idx);
        self.live -= 1;
        self.emit(slot);
    }

    fn emit(&mut self, mut slot: Slot<B>) {
        let mut open = std::mem::take(&mut slot.open);
        if open.capacity() > 0 && self.spare_open.len() < 1 << 16 {
            open.clear();
            self.spare_open.push(open);
        }
        slot.unsent.sort_unstable();
        // Adjacent unsent ranges (a send cut into requests) become one.
        let mut unsent: Vec<(usize, usize)> = Vec::with_capacity(slot.unsent.len());
        for (off, len) in slot.unsent {
            match unsent.last_mut() {
                Some((o, l)) if *o + *l == off => *l += len,
                _ => unsent.push((off, len)),
            }
        }
        self.done.push_back(Finished {
            tag: slot.tag,
            buf: slot.buf,
            bytes: slot.done,
            error: slot.error,
            zc: slot.zc,
            copied: slot.copied,
            unknown: slot.unknown,
            unsent,
        });
    }

    /// Takes the buffers of every live send, which the kernel may still read: the caller
    /// must never reuse them (the backend leaks them when dropped with sends in flight).
    pub(crate) fn take_live(&mut self) -> Vec<B> {
        self.live = 0;
        self.staged.clear();
        self.slots
            .iter_mut()
            .filter_map(Option::take)
            .map(|s| s.buf)
            .collect()
    }

    /// Takes the next finished send.
    pub(crate) fn next_done(&mut self) -> Option<Finished<B>> {
        self.done.pop_front()
    }

    /// The slots of the sends owned by the tracker.
    pub(crate) fn live_slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .map(|(i, _)| i as u32)
    }

    /// Sends owned by the tracker (staged, in the kernel, or owed a notification).
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// Requests staged here.
    pub(crate) fn staged(&self) -> usize {
        self.staged.len()
    }

    /// Requests in the kernel without their result.
    pub(crate) fn in_kernel(&self) -> usize {
        self.in_kernel
    }

    /// Whether failed requests wait for a notification that may still come (settled by
    /// [`SendTracker::settle`] after the next `GETEVENTS` enter).
    pub(crate) fn has_unsettled(&self) -> bool {
        !self.unsettled.is_empty()
    }

    /// Notifications announced and not yet seen.
    pub(crate) fn notifs_pending(&self) -> usize {
        self.notifs_pending
    }

    /// Whether a stream chain is out (its results not all in).
    pub(crate) fn chain_out(&self) -> bool {
        self.chain_pending > 0
    }

    /// The errno that made the tracker stop submitting, if it did.
    pub(crate) fn gave_up(&self) -> Option<i32> {
        self.gave_up
    }

    /// Counters.
    pub(crate) fn stats(&self) -> &TrackStats {
        &self.stats
    }
}

fn count_usage(
    zc: &mut u32,
    copied: &mut u32,
    unknown: &mut u32,
    stats: &mut TrackStats,
    u: Usage,
) {
    match u {
        Usage::ZeroCopy => *zc += 1,
        Usage::Copied => {
            *copied += 1;
            stats.notifs_copied += 1;
        }
        Usage::Unknown => {
            *unknown += 1;
            stats.notifs_unknown += 1;
        }
    }
}

fn is_room(errno: i32) -> bool {
    errno == libc::ENOBUFS || errno == libc::ENOMEM || errno == libc::EAGAIN
}

#[cfg(test)]
mod tests;

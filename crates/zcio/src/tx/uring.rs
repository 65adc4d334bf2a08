//! The io_uring side of a [`SendRing`]: staging sends into their socket's send core
//! (`tx::core::SendTracker`, which decides order and completion), pushing the requests it lets
//! go into the shared ring (`ring::lend::LendRing`, which keeps every buffer and socket until
//! the kernel is done with it), one `io_uring_enter` for all sockets, and routing every CQE
//! back to its socket's core.
//!
//! A CQE names its buffer (`ring::key`: generation, buffer number, request number); the
//! buffer's *route* says which socket and which slot of that socket's core it belongs to:
//! `socket index (32 bits) · core slot (16) · core generation (16)`.

use super::copy;
use super::core::{Finished, Key, Request, SendTracker, Usage};
use super::ring::SendRing;
use super::{status_of, Path, SendError, SendRingConfig};
use crate::buf::lent::Lent;
use crate::ring::lend::{self, LendId, LendRing, SendCqe, SendSqe};
use crate::ring::RingError;
use crate::stats::{self, Fallback};
use crate::sys::msg::{MsgHdr, MsgOpts};
use crate::sys::IORING_NOTIF_USAGE_ZC_COPIED;
use std::io;
use std::time::{Duration, Instant};

fn route(idx: u32, slot: u32, gen: u16) -> u64 {
    (u64::from(idx) << 32) | (u64::from(slot & 0xffff) << 16) | u64::from(gen)
}

fn unroute(r: u64) -> (u32, u32, u16) {
    ((r >> 32) as u32, ((r >> 16) & 0xffff) as u32, r as u16)
}

/// Rounds of push-submit-harvest a call makes for requests its harvests let go
/// (`SendRing::ring_continue`).
const CONTINUE_ROUNDS: usize = 4;

/// The ring of a [`SendRing`] and what drives it.
#[derive(Debug)]
pub(super) struct Uring {
    pub(super) lr: LendRing<Lent>,
    pub(super) send_zc: Result<bool, String>,
    pub(super) report_usage: bool,
    /// `SENDMSG_ZC` takes registered buffers (`IORING_RECVSEND_FIXED_BUF`, Linux 6.15).
    pub(super) msg_fixed: bool,
    /// `SEND_ZC` takes an iovec array (`IORING_SEND_VECTORIZED`, Linux 6.17).
    pub(super) send_vectorized: bool,
    /// ... in a registered buffer.
    pub(super) vectorized_fixed: bool,
    reqs: Vec<Request>,
    /// Sockets with staged requests that may be pushed (and the list a pump walks).
    dirty: Vec<u32>,
    dirty_spare: Vec<u32>,
    /// Requests may go that no pump has pushed: a harvest ended a socket's chain (or brought
    /// what a socket waited for) while more of it was staged, or a pump stopped at a full
    /// submission queue. Nothing in the kernel announces them (the completion that let them
    /// go is taken), so the call that harvested pushes them (`ring_continue`) and, if its
    /// rounds run out, leaves the readiness descriptor readable for `on_ready`.
    pub(super) released: bool,
    /// Sockets with ring sends in flight (each once: `Sock::ring_listed`), pruned as they
    /// are walked; what a wait looks at instead of every socket.
    busy: Vec<u32>,
    /// Requests staged since the last submission (the batch trigger).
    staged_new: usize,
    /// Sockets whose core waits for "maybe" notifications to settle after an enter.
    unsettled: Vec<u32>,
    /// Sockets touched by the current harvest, and sockets pumped by the current submit.
    touched: Vec<u32>,
    pumped: Vec<u32>,
    cqes: Vec<SendCqe>,
    /// The ring's enters at the last accounting.
    enters_seen: u64,
    /// Nesting of the ring's calls that keep its eventfd quiet, and the ring's enters when
    /// the outermost began.
    pub(super) quiet_depth: u32,
    pub(super) quiet_enters: u64,
    /// [`LendRing::eventfd_calls`] already counted in the ring's own counters.
    pub(super) eventfd_seen: u64,
}

impl Uring {
    /// The ring, and the set-up steps down it took (flags refused, no registered-file table).
    pub(super) fn new(cfg: &SendRingConfig) -> Result<(Self, Vec<Fallback>), String> {
        let lr = match LendRing::new(&cfg.ring, cfg.files) {
            Ok(lr) => lr,
            Err(RingError::Unavailable { reason, .. }) => return Err(reason),
            Err(e) => return Err(e.to_string()),
        };
        Ok(Self::with(lr))
    }

    /// The send side of a ring a receiver owns too.
    pub(super) fn on(
        core: Box<dyn crate::ring::SendCore>,
        cfg: &SendRingConfig,
    ) -> (Self, Vec<Fallback>) {
        Self::with(LendRing::on(core, cfg.files))
    }

    fn with(lr: LendRing<Lent>) -> (Self, Vec<Fallback>) {
        let mut notes = Vec::new();
        for f in lr.setup_flags() {
            if f.requested && !f.granted {
                notes.push(Fallback::new(
                    stats::Path::setting(format!("ring with {}", f.name)),
                    stats::Path::setting(format!("ring without {}", f.name)),
                    f.reason.clone().unwrap_or_default(),
                ));
            }
        }
        if let Some(e) = lr.file_table_error() {
            notes.push(Fallback::new(
                stats::Path::setting("registered files"),
                stats::Path::setting("socket descriptors"),
                e.to_string(),
            ));
        }
        let send_zc = lr.supports_send_zc().map_err(|e| e.to_string());
        let feats = crate::ring::features::Features::get();
        let report_usage = feats.has(crate::ring::features::Features::SEND_ZC_REPORT_USAGE);
        let msg_fixed = feats.has(crate::ring::features::Features::SENDMSG_ZC_FIXED_BUF);
        let send_vectorized = feats.has(crate::ring::features::Features::SEND_VECTORIZED);
        let vectorized_fixed =
            feats.has(crate::ring::features::Features::SEND_VECTORIZED_FIXED_BUF);
        (
            Self {
                lr,
                send_zc,
                report_usage,
                msg_fixed,
                send_vectorized,
                vectorized_fixed,
                reqs: Vec::new(),
                dirty: Vec::new(),
                dirty_spare: Vec::new(),
                released: false,
                busy: Vec::new(),
                staged_new: 0,
                unsettled: Vec::new(),
                touched: Vec::new(),
                pumped: Vec::new(),
                cqes: Vec::new(),
                enters_seen: 0,
                quiet_depth: 0,
                quiet_enters: 0,
                eventfd_seen: 0,
            },
            notes,
        )
    }

    /// Whether enough requests are staged to enter now.
    pub(super) fn due(&self, cfg: &SendRingConfig) -> bool {
        self.staged_new >= cfg.submit_batch.max(1)
    }

    /// Whether anything waits to be submitted.
    pub(super) fn has_staged(&mut self) -> bool {
        !self.dirty.is_empty() || self.lr.pending() > 0
    }
}

impl SendRing {
    /// Puts a socket on the ring: a registered-file slot if one is free, and its send core.
    pub(super) fn attach(&mut self, _idx: u32, s: &mut super::sock::Sock) {
        let u = self.uring.as_mut().expect("a ring path has a ring");
        let (file, why) = u.lr.add_file(s.fd.clone());
        if let Some(why) = why {
            s.fallbacks.push(Fallback::new(
                stats::Path::setting("registered file"),
                stats::Path::setting("socket descriptor"),
                why,
            ));
        }
        s.file = Some(file);
        let chunk = if s.stream {
            lend::MAX_REQ
        } else {
            s.chunk.clamp(1, lend::MAX_REQ)
        };
        let mut t = SendTracker::new(s.stream, chunk);
        // No room even with nothing in flight: the socket goes on by `uring-copy`.
        t.signal_starvation(true);
        s.tracker = Some(t);
    }

    /// Stages one send on the ring.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ring_stage(
        &mut self,
        idx: u32,
        seq: u64,
        lent: Lent,
        more: Vec<Lent>,
        len: usize,
        mut path: Path,
        dest: Option<MsgOpts>,
    ) {
        let u = self.uring.as_mut().expect("ring path");
        let s = self.socks[idx as usize].as_mut().expect("live");
        let file = s.file.expect("on the ring");
        let vectored = !more.is_empty();
        let lend = u.lr.lend_slices(lent, more, file, 0);
        if path == Path::UringZcFixed && !u.lr.is_fixed_buffer(lend) {
            // A buffer outside the registered pools (a `TxBuf::Vec`, a received chunk): its
            // pages are pinned per send, and its completion says so.
            path = Path::UringZc;
            if let Some(m) = s.meta.get_mut(seq) {
                m.path = path;
            }
        }
        // Slices go as SEND_ZC with IORING_SEND_VECTORIZED (6.17), except where the kernel
        // lacks it, or lacks it from registered buffers (then SENDMSG_ZC from the pool beats
        // pinning the slices per send).
        let fixed_path = path == Path::UringZcFixed;
        let vec_msg = vectored && (!u.send_vectorized || (fixed_path && !u.vectorized_fixed));
        if vec_msg && path.is_zero_copy() && dest.is_none() && !s.vec_noted {
            s.vec_noted = true;
            let feats = crate::ring::features::Features::get();
            let (what, why) = if !u.send_vectorized {
                (
                    "SEND_ZC with IORING_SEND_VECTORIZED",
                    feats.why_not(crate::ring::features::Features::SEND_VECTORIZED),
                )
            } else {
                (
                    "SEND_ZC with IORING_SEND_VECTORIZED from registered buffers",
                    feats.why_not(crate::ring::features::Features::SEND_VECTORIZED_FIXED_BUF),
                )
            };
            s.fallbacks.push(Fallback::new(
                stats::Path::setting(what),
                stats::Path::setting("SENDMSG_ZC with an iovec"),
                why.unwrap_or_default(),
            ));
        }
        // A request with a message header: a destination, or slices that go as SENDMSG_ZC.
        let msg_req = dest.is_some() || vec_msg;
        let dest = if vectored && dest.is_none() {
            Some(MsgOpts {
                dest: None,
                segment: None,
                tos: None,
            })
        } else {
            dest
        };
        if let Some(o) = &dest {
            if path == Path::UringZcFixed && msg_req && !u.msg_fixed {
                // SENDMSG_ZC takes registered buffers only since Linux 6.15: pin per send (and
                // the completion says so).
                path = Path::UringZc;
                if let Some(m) = s.meta.get_mut(seq) {
                    m.path = path;
                }
                if !s.msg_fixed_noted {
                    s.msg_fixed_noted = true;
                    s.fallbacks.push(Fallback::new(
                        Path::UringZcFixed,
                        Path::UringZc,
                        format!(
                            "sends with a destination (or slices without SEND_VECTORIZED) go \
                             as SENDMSG_ZC, which {}: their pages are pinned per send",
                            crate::ring::features::Features::get()
                                .why_not(crate::ring::features::Features::SENDMSG_ZC_FIXED_BUF)
                                .unwrap_or_default()
                        ),
                    ));
                }
            }
            match MsgHdr::new(o, s.v6) {
                Ok(m) => u.lr.set_msg(lend, m),
                Err(e) => {
                    // Checked before (family, segment): cannot happen; if it did, fail the send.
                    let errno = e.raw_os_error().unwrap_or(libc::EINVAL);
                    let (buf, more) = u.lr.take(lend).expect("no request yet");
                    self.finish_parts(
                        idx,
                        seq,
                        buf,
                        more,
                        0,
                        Some(SendError::Invalid {
                            errno,
                            reason: e.to_string(),
                        }),
                        crate::tx::ZcStatus::NotAttempted,
                    );
                    return;
                }
            }
        }
        let t = s.tracker.as_mut().expect("on the ring");
        match t.stage(seq, lend, len) {
            Some((slot, gen)) => {
                u.lr.set_route(lend, route(idx, slot, gen));
                let slot = slot as usize;
                if s.slot_paths.len() <= slot {
                    s.slot_paths.resize(slot + 1, Path::UringZc);
                }
                s.slot_paths[slot] = path;
                u.staged_new += if s.stream {
                    1
                } else {
                    len.div_ceil(s.chunk.max(1))
                };
                if !s.dirty {
                    s.dirty = true;
                    u.dirty.push(idx);
                }
                if !s.ring_listed {
                    s.ring_listed = true;
                    u.busy.push(idx);
                }
            }
            None => self.ring_collect(idx),
        }
    }

    /// [`SendRing::prepare`]: pushes what may go, without entering.
    pub(super) fn ring_prepare(&mut self) {
        if let Some(u) = self.uring.as_mut() {
            u.staged_new = 0;
        }
        self.pump();
    }

    /// Pushes what the cores of the listed sockets let go into the submission queue; returns
    /// whether anything was pushed.
    fn pump(&mut self) -> bool {
        let Some(u) = self.uring.as_mut() else {
            return false;
        };
        if u.lr.is_dead() {
            return false;
        }
        // This pass walks every socket that may push; one that cannot push now waits for an
        // event of the kernel (a result, a notification), or for room (set again below).
        u.released = false;
        if u.dirty.is_empty() {
            return false;
        }
        // Double-buffered: staging pushes into `dirty` while this pass walks the other list,
        // and neither is reallocated per pass.
        let mut dirty = std::mem::take(&mut u.dirty_spare);
        std::mem::swap(&mut dirty, &mut u.dirty);
        let mut pushed = false;
        for (k, &idx) in dirty.iter().enumerate() {
            let Some(s) = self.socks.get_mut(idx as usize).and_then(Option::as_mut) else {
                continue;
            };
            let Some(t) = s.tracker.as_mut() else {
                s.dirty = false;
                continue;
            };
            if t.staged() == 0 || s.closing {
                s.dirty = false;
                continue;
            }
            let room = u.lr.sq_room();
            if room == 0 {
                // The SQ is full: this socket and the rest wait for the next pump, in order
                // and still marked, without a look at each (a pump's work is bounded by
                // what fits, not by how many sockets have something staged).
                u.dirty.extend_from_slice(&dirty[k..]);
                u.released = true;
                break;
            }
            s.dirty = false;
            t.pop_requests(room, &mut u.reqs);
            if t.starved() {
                // No room (RLIMIT_MEMLOCK, optmem) even with nothing of this socket in
                // flight: its zero-copy sends go by copy on the ring from now on.
                t.unblock();
                for p in &mut s.slot_paths {
                    if p.is_zero_copy() {
                        *p = Path::UringCopy;
                    }
                }
                let why = "SEND_ZC found no room (ENOBUFS/ENOMEM) with nothing of this socket \
                           in flight: RLIMIT_MEMLOCK or optmem_max is below one send; sending \
                           by copy on the ring (io_uring SEND)";
                switch_to_copy(s, why);
                let t = s.tracker.as_mut().expect("on the ring");
                t.pop_requests(room, &mut u.reqs);
            }
            let t = s.tracker.as_mut().expect("on the ring");
            let file = s.file.expect("on the ring");
            for r in u.reqs.drain(..) {
                let lend: LendId = *t.buf(r.key.slot);
                let p = s.slot_paths[r.key.slot as usize];
                let sqe = SendSqe {
                    lend,
                    req: r.key.req,
                    off: r.off,
                    len: r.len,
                    file,
                    zc: p.is_zero_copy(),
                    fixed: p == Path::UringZcFixed,
                    report_usage: u.report_usage,
                    msg_flags: if s.stream { libc::MSG_WAITALL } else { 0 },
                    link: r.link,
                    vectorized: u.send_vectorized,
                    vectorized_fixed: u.vectorized_fixed,
                };
                match u.lr.push_send(&sqe) {
                    Ok(()) => {
                        pushed = true;
                    }
                    // Cannot happen for a held buffer, a range inside it and an open socket
                    // (all checked by construction); if it did, the request failed.
                    Err(e) => t.on_result(r.key, -e.raw_os_error().unwrap_or(libc::EINVAL), false),
                }
            }
            if !s.pumped {
                s.pumped = true;
                u.pumped.push(idx);
            }
            if t.staged() > 0 && !t.chain_out() {
                u.dirty.push(idx);
                s.dirty = true;
            }
        }
        dirty.clear();
        u.dirty_spare = dirty;
        pushed
    }

    /// Counts the ring's new `io_uring_enter` calls; `submitting`: they submitted sends (else
    /// they only collected completions).
    fn account(&mut self, submitting: bool) {
        let Some(u) = self.uring.as_mut() else { return };
        let e = u.lr.enters();
        let d = e - u.enters_seen;
        u.enters_seen = e;
        self.own.0.syscalls += d;
        if submitting {
            self.own.1.send_syscalls += d;
        } else {
            self.own.1.notify_syscalls += d;
        }
    }

    /// Pushes what may go, enters once for every socket, and collects. A chain that met a
    /// full socket buffer is retried from poll as task work, which under `DEFER_TASKRUN` runs
    /// only when we enter with GETEVENTS: when the kernel flags it while a chain is out, one
    /// more enter runs it now rather than at the caller's next wait; and chains that ended in
    /// this enter and let more go are pushed and submitted once more.
    pub(super) fn ring_submit(&mut self) -> io::Result<()> {
        let Some(u) = self.uring.as_mut() else {
            return Ok(());
        };
        if u.lr.is_dead() {
            return Ok(());
        }
        u.staged_new = 0;
        for idx in u.pumped.drain(..) {
            if let Some(s) = self.socks.get_mut(idx as usize).and_then(Option::as_mut) {
                s.pumped = false;
            }
        }
        self.pump();
        let res = self.uring.as_mut().expect("ring").lr.submit();
        self.account(true);
        res?;
        self.ring_harvest()?;
        let u = self.uring.as_mut().expect("ring");
        let chain_out = u.pumped.iter().any(|&i| {
            self.socks
                .get(i as usize)
                .and_then(Option::as_ref)
                .and_then(|s| s.tracker.as_ref())
                .is_some_and(|t| t.chain_out())
        });
        if chain_out && u.lr.task_work_pending() {
            let res = u.lr.enter_getevents();
            self.account(true);
            res?;
            self.ring_harvest()?;
        }
        self.ring_continue()
    }

    /// Pushes and submits what the last harvest let go (`Uring::released`): a stream chain's
    /// results let the socket's next requests go, and nothing else would submit them — the
    /// kernel has nothing of theirs to announce. A few rounds (each one's results may let
    /// more go, and one enter runs a bounded batch of task work); what is left stays
    /// released, and the outermost call then leaves the readiness descriptor readable.
    pub(super) fn ring_continue(&mut self) -> io::Result<()> {
        for _ in 0..CONTINUE_ROUNDS {
            let Some(u) = self.uring.as_mut() else {
                return Ok(());
            };
            if !u.released || u.lr.is_dead() {
                return Ok(());
            }
            self.pump();
            let u = self.uring.as_mut().expect("ring");
            if u.lr.pending() == 0 {
                // Nothing could go (a socket waits for room or a notification).
                continue;
            }
            let res = u.lr.submit();
            self.account(true);
            res?;
            self.ring_harvest()?;
        }
        Ok(())
    }

    /// Whether requests were let go that no call has pushed yet (see `Uring::released`).
    pub(super) fn ring_released(&self) -> bool {
        self.uring
            .as_ref()
            .is_some_and(|u| u.released && !u.lr.is_dead())
    }

    /// Reads what the kernel has posted, without entering (unless the CQ overflowed).
    pub(super) fn ring_harvest_only(&mut self, _submitting: bool) -> io::Result<()> {
        if self.uring.as_ref().is_none_or_dead() {
            return Ok(());
        }
        let res = self.ring_harvest();
        self.account(false);
        res
    }

    /// Reads what the kernel has posted and, if it flagged deferred task work while buffers
    /// are in the kernel (under `DEFER_TASKRUN` notifications of sends that left the socket
    /// are task work), runs it with one `io_uring_enter` and reads again. No syscall when
    /// the kernel has nothing pending for us.
    pub(super) fn ring_reap(&mut self) -> io::Result<()> {
        if self.uring.as_ref().is_none_or_dead() {
            return Ok(());
        }
        self.ring_harvest()?;
        let u = self.uring.as_mut().expect("ring");
        // Deferred task work flagged while buffers are out, or failed zero-copy requests whose
        // late notification (if any) only an enter with GETEVENTS would post: enter once.
        if (u.lr.live() > 0 && u.lr.task_work_pending()) || !u.unsettled.is_empty() {
            let res = u.lr.enter_getevents();
            self.account(false);
            res?;
            self.ring_harvest()?;
        }
        self.account(false);
        self.ring_continue()
    }

    /// Submits, then waits until at least one CQE arrives or `timeout` passes (no wait when
    /// nothing is in the kernel), and collects. A signal ends the wait early.
    pub(super) fn ring_wait(&mut self, timeout: Duration) -> io::Result<()> {
        if self.uring.as_ref().is_none_or_dead() {
            return Ok(());
        }
        self.pump();
        let before = self.ready.len();
        self.ring_harvest()?;
        let u = self.uring.as_mut().expect("ring");
        if self.ready.len() > before && u.lr.pending() == 0 {
            // Something came back already: no need to wait (only to push what it let go).
            return self.ring_continue();
        }
        let in_kernel = self.ring_busy_in_kernel();
        let u = self.uring.as_mut().expect("ring");
        let res = if !in_kernel && u.lr.ignored_live() == 0 {
            // Nothing the kernel would complete: an enter with GETEVENTS still settles failed
            // zero-copy requests that may have a late notification (their only wait).
            if u.unsettled.is_empty() && u.lr.pending() == 0 {
                u.lr.submit()
            } else {
                u.lr.enter_getevents()
            }
        } else {
            u.lr.wait(Some(timeout))
        };
        self.account(true);
        res?;
        self.ring_harvest()?;
        // Results may have let staged requests go (next chain, retries): push them now.
        self.ring_continue()
    }

    /// Reads every CQE posted and hands each to its socket's core; collects what finished.
    fn ring_harvest(&mut self) -> io::Result<()> {
        let Some(u) = self.uring.as_mut() else {
            return Ok(());
        };
        let mut cqes = std::mem::take(&mut u.cqes);
        let res = u.lr.harvest(|c| cqes.push(c), |_, _, _| {});
        let epoch = u.lr.enters();
        let report_usage = u.report_usage;
        let mut touched = std::mem::take(&mut u.touched);
        for c in cqes.drain(..) {
            let (idx, slot, gen) = unroute(c.route);
            let Some(s) = self.socks.get_mut(idx as usize).and_then(Option::as_mut) else {
                continue;
            };
            let Some(t) = s.tracker.as_mut() else {
                continue;
            };
            t.entered(epoch);
            let key = Key {
                slot,
                gen,
                req: c.req,
            };
            if c.is_notif() {
                let usage = if !report_usage {
                    Usage::Unknown
                } else if (c.res as u32) & IORING_NOTIF_USAGE_ZC_COPIED != 0 {
                    Usage::Copied
                } else {
                    Usage::ZeroCopy
                };
                t.on_notif(key, usage);
            } else {
                let mut res = c.res;
                let zc = s
                    .slot_paths
                    .get(slot as usize)
                    .is_some_and(|p| p.is_zero_copy());
                if res == -libc::EOPNOTSUPP && zc {
                    // The socket does no SEND_ZC: the request goes again, in order, by copy.
                    for p in &mut s.slot_paths {
                        if p.is_zero_copy() {
                            *p = Path::UringCopy;
                        }
                    }
                    switch_to_copy(
                        s,
                        "SEND_ZC refused by this socket (EOPNOTSUPP): zero-copy needs a TCP or \
                         UDP socket; sending by copy on the ring (io_uring SEND)",
                    );
                    res = -libc::ECANCELED;
                }
                if res == -libc::EMSGSIZE && zc && !s.stream {
                    // One datagram train is one skb, and a zero-copy skb holds at most
                    // MAX_SKB_FRAGS page fragments: a train whose slices span more pages is
                    // refused whole (nothing sent). It goes again, in order, by copy.
                    if let Some(p) = s.slot_paths.get_mut(slot as usize) {
                        *p = Path::UringCopy;
                    }
                    let tag = s.tracker.as_ref().expect("on the ring").tag(slot);
                    if let Some(m) = s.meta.get_mut(tag) {
                        m.path = Path::UringCopy;
                    }
                    if !s.frags_noted {
                        s.frags_noted = true;
                        s.fallbacks.push(Fallback::new(
                            s.path,
                            Path::UringCopy,
                            "a zero-copy datagram train referenced more page fragments than one \
                             skb holds (MAX_SKB_FRAGS, 17; EMSGSIZE): such trains (slices \
                             spanning more than 16 pages) are sent by copy, the others stay \
                             zero-copy",
                        ));
                    }
                    res = -libc::ECANCELED;
                }
                let t = s.tracker.as_mut().expect("on the ring");
                if zc {
                    t.on_result(key, res, c.more());
                } else {
                    // A copy (SEND) never notifies: a failed one is done too.
                    t.on_copy_result(key, res);
                }
            }
            if !s.touched {
                s.touched = true;
                touched.push(idx);
            }
        }
        let u = self.uring.as_mut().expect("ring");
        u.cqes = cqes;
        let unsettled = std::mem::take(&mut u.unsettled);
        for idx in unsettled {
            if let Some(s) = self.socks.get_mut(idx as usize).and_then(Option::as_mut) {
                if !s.touched {
                    s.touched = true;
                    touched.push(idx);
                }
            }
        }
        for &idx in &touched {
            let Some(s) = self.socks.get_mut(idx as usize).and_then(Option::as_mut) else {
                continue;
            };
            s.touched = false;
            let Some(t) = s.tracker.as_mut() else {
                continue;
            };
            t.entered(epoch);
            t.settle();
            s.stats.room_waits = t.stats().room_waits;
            let u = self.uring.as_mut().expect("ring");
            if t.has_unsettled() {
                u.unsettled.push(idx);
            }
            if t.staged() > 0 && !t.chain_out() && !s.closing {
                // The chain ended (or what the socket waited for came): its next requests
                // may go, and only a pump sends them.
                if !s.dirty {
                    s.dirty = true;
                    u.dirty.push(idx);
                }
                u.released = true;
            }
            self.ring_collect(idx);
            self.settle_sock(idx);
        }
        touched.clear();
        let u = self.uring.as_mut().expect("ring");
        u.touched = touched;
        // Buffers an owner asked back early, now that the kernel let go of them.
        while let Some((r, lend, buf)) = self.uring.as_mut().expect("ring").lr.next_returned() {
            let (idx, _, _) = unroute(r);
            let pos = self
                .socks
                .get(idx as usize)
                .and_then(Option::as_ref)
                .and_then(|s| s.held.iter().position(|f| f.buf == lend));
            match pos {
                Some(i) => {
                    let f = self.socks[idx as usize]
                        .as_mut()
                        .expect("live")
                        .held
                        .swap_remove(i);
                    self.complete(idx, f, buf.0, buf.1);
                    self.settle_sock(idx);
                }
                None => drop(buf),
            }
        }
        res.map(drop)
    }

    /// Moves a socket's finished sends to the ready list.
    pub(super) fn ring_collect(&mut self, idx: u32) {
        loop {
            let Some(s) = self.socks.get_mut(idx as usize).and_then(Option::as_mut) else {
                return;
            };
            let Some(f) = s.tracker.as_mut().and_then(|t| t.next_done()) else {
                return;
            };
            let u = self.uring.as_mut().expect("ring path");
            match u.lr.take(f.buf) {
                Some((buf, more)) => self.complete(idx, f, buf, more),
                None => s.held.push(f),
            }
        }
    }

    /// A finished send of the ring: counts, sends what the ring left unsent (only after it
    /// failed) by copy, and hands the completion on.
    fn complete(&mut self, idx: u32, f: Finished<LendId>, buf: Lent, more: Vec<Lent>) {
        let s = self.socks[idx as usize].as_mut().expect("live");
        s.counters.notifications += u64::from(f.zc + f.copied + f.unknown);
        let status = status_of(f.zc, f.copied, f.unknown);
        super::ring::count_zc(&mut s.counters, status, f.bytes);
        let mut bytes = f.bytes;
        let mut error = f.error.map(SendError::from_errno);
        let dest = s.meta.get(f.tag).and_then(|m| m.dest);
        for &(off, len) in &f.unsent {
            let parts: Vec<&[u8]> = std::iter::once(&*buf)
                .chain(more.iter().map(|b| &**b))
                .collect();
            let range = copy::range_of(&parts, off, len);
            let out = match &dest {
                Some(o) => copy::send_msg(&*s.fd, &range, o, s.v6, true),
                None => copy::send_all(&*s.fd, &range, s.chunk),
            };
            s.counters.syscalls += out.syscalls;
            s.stats.send_syscalls += out.syscalls;
            s.stats.room_copies += 1;
            bytes += out.bytes;
            if let Some(e) = out.error {
                error.get_or_insert(SendError::from_errno(e));
            }
        }
        self.finish_parts(idx, f.tag, buf, more, bytes, error, status);
    }

    /// Whether a request or a notification of a listed socket is in the kernel. Stops at
    /// the first such socket; sockets with no ring send left that it meets on the way leave
    /// the list (so a wait costs O(1) while sends are out, and the list only holds sockets
    /// with work).
    fn ring_busy_in_kernel(&mut self) -> bool {
        let Some(u) = self.uring.as_mut() else {
            return false;
        };
        let mut i = 0;
        while i < u.busy.len() {
            let idx = u.busy[i];
            let Some(s) = self.socks.get_mut(idx as usize).and_then(Option::as_mut) else {
                u.busy.swap_remove(i);
                continue;
            };
            let (live, k) = s.tracker.as_ref().map_or((0, false), |t| {
                (t.live(), t.in_kernel() > 0 || t.notifs_pending() > 0)
            });
            if k {
                return true;
            }
            if live == 0 && s.held.is_empty() {
                s.ring_listed = false;
                u.busy.swap_remove(i);
                continue;
            }
            i += 1;
        }
        false
    }

    /// Sends of the ring still owned by it (all sockets): all sends in flight but those of
    /// the syscall paths (listed sockets only), so no walk over every socket.
    pub(super) fn ring_in_flight(&self) -> usize {
        self.in_flight_n - self.sys_in_flight()
    }

    /// Closing a socket on the ring: requests not yet handed over fail, those in the kernel
    /// are cancelled; the socket ends with a reset when data was still queued.
    pub(super) fn ring_close(&mut self, idx: u32) {
        let Some(u) = self.uring.as_mut() else { return };
        let Some(s) = self.socks.get_mut(idx as usize).and_then(Option::as_mut) else {
            return;
        };
        let Some(t) = s.tracker.as_mut() else { return };
        // Zero-copy sends whose pages the socket may hold (a copy's bytes are the socket's
        // own once its result came: those go out as the close lets them).
        let paths = &s.slot_paths;
        let zc_out = t
            .live_slots()
            .any(|k| paths.get(k as usize).is_some_and(|p| p.is_zero_copy()));
        t.fail(libc::ECANCELED);
        if let Some(f) = s.file {
            if u.lr.file_inflight(f) > 0 && !u.lr.is_dead() {
                let _ = u.lr.cancel_file(f);
            }
        }
        if zc_out && s.stream {
            // Data may be queued in the socket, its pages ours until the peer acknowledges
            // it, which a peer that stopped reading never does: reset the connection so the
            // kernel frees them (and notifies) now.
            self.reset_closing(idx);
        }
        self.account(true);
        self.ring_collect(idx);
    }

    /// Abandoning a socket on the ring: its core is dropped and the ring keeps each buffer
    /// the kernel may still read until its last CQE, then drops it (the *ignored* life
    /// cycle of `ring::lend`); the rest are dropped now.
    pub(super) fn ring_abandon(&mut self, idx: u32) {
        let Some(u) = self.uring.as_mut() else { return };
        let Some(s) = self.socks.get_mut(idx as usize).and_then(Option::as_mut) else {
            return;
        };
        let Some(mut t) = s.tracker.take() else {
            return;
        };
        let busy = t.live() > 0;
        // Sends that end here without a completion leave the in-flight count.
        let mut gone = 0;
        while let Some(f) = t.next_done() {
            u.lr.discard(f.buf);
            gone += 1;
        }
        for lend in t.take_live() {
            u.lr.discard(lend);
            gone += 1;
        }
        for f in s.held.drain(..) {
            u.lr.discard(f.buf);
            gone += 1;
        }
        s.slot_paths.clear();
        s.meta = Default::default();
        if let Some(f) = s.file {
            if u.lr.file_inflight(f) > 0 && !u.lr.is_dead() {
                let _ = u.lr.cancel_file(f);
            }
        }
        if busy && s.stream {
            reset(&s.fd);
        }
        self.in_flight_n -= gone;
        self.account(true);
    }

    /// `io_uring_enter` failed (`e`): the ring is not used for new sends any more. Requests
    /// not yet handed to the kernel become unsent ranges; once the kernel's requests have
    /// their results, those ranges go out by copy in ticket order, so every stream keeps
    /// every byte once and in order. If the results cannot be collected (the ring cannot be
    /// entered any more), the ring is abandoned and, on a stream, every later send fails with
    /// the error: what the kernel did with its requests is unknown, and sending after them
    /// could reorder or duplicate bytes.
    pub(super) fn ring_failed(&mut self, e: io::Error) {
        let Some(u) = self.uring.as_mut() else { return };
        if u.lr.is_dead() {
            return;
        }
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        for t in self
            .socks
            .iter_mut()
            .flatten()
            .filter_map(|s| s.tracker.as_mut())
        {
            t.give_up(errno);
        }
        let ok = matches!(self.settle_results(Duration::from_secs(5)), Ok(true));
        if !ok {
            let _ = self.ring_harvest();
            let u = self.uring.as_mut().expect("ring");
            let never = u.lr.abandon(errno);
            for (r, _lend, req) in never.into_iter().rev() {
                let (idx, slot, gen) = unroute(r);
                if let Some(t) = self
                    .socks
                    .get_mut(idx as usize)
                    .and_then(Option::as_mut)
                    .and_then(|s| s.tracker.as_mut())
                {
                    t.withdraw(Key { slot, gen, req });
                }
            }
        }
        let n = self.socks.len() as u32;
        for idx in 0..n {
            let Some(s) = self.socks[idx as usize].as_mut() else {
                continue;
            };
            let Some(t) = s.tracker.as_ref() else {
                continue;
            };
            if s.retired {
                continue;
            }
            let settled = t.in_kernel() == 0 && t.staged() == 0;
            let reason = if settled {
                format!(
                    "io_uring_enter failed: {e}; requests not yet submitted were sent by copy, \
                     in order"
                )
            } else {
                format!(
                    "io_uring_enter failed: {e}, and the results of requests in the kernel \
                     cannot be collected; the ring is abandoned (its buffers are not reused)"
                )
            };
            s.fall_back(Path::Copy, reason);
            s.retired = true;
            if let Some(a) = s.auto.as_mut() {
                a.zc = None;
            }
            if !settled && s.stream {
                s.broken = Some(errno);
            }
            s.stuck = !ok;
            self.send_unsent(idx);
            self.ring_collect(idx);
            self.settle_sock(idx);
        }
    }

    /// Waits until no request is in the kernel without its result and no notification is
    /// owed, or `timeout` passes; returns whether every result came in. Notifications owed
    /// are waited for too, so a ring that cannot be entered to collect them fails here (and
    /// is abandoned) instead of being retried forever.
    fn settle_results(&mut self, timeout: Duration) -> io::Result<bool> {
        let end = Instant::now() + timeout;
        loop {
            let (mut results_out, mut notifs) = (false, false);
            for t in self
                .socks
                .iter()
                .flatten()
                .filter_map(|s| s.tracker.as_ref())
            {
                results_out |= t.in_kernel() > 0;
                notifs |= t.notifs_pending() > 0;
            }
            results_out |= self.uring.as_mut().is_some_and(|u| u.lr.pending() > 0);
            if !results_out && !notifs {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= end {
                return Ok(!results_out);
            }
            self.ring_wait((end - now).min(Duration::from_millis(100)))?;
        }
    }

    /// Sends every unsent range of a socket's core by copy, in ticket order (or, on a broken
    /// stream, fails them).
    fn send_unsent(&mut self, idx: u32) {
        let Some(u) = self.uring.as_mut() else { return };
        let Some(s) = self.socks.get_mut(idx as usize).and_then(Option::as_mut) else {
            return;
        };
        let Some(t) = s.tracker.as_mut() else { return };
        let (fd, chunk, broken, v6) = (s.fd.clone(), s.chunk, s.broken, s.v6);
        let lr = &u.lr;
        let meta = &s.meta;
        let (mut calls, mut copies) = (0, 0);
        t.send_unsent(|tag, lend, off, len| {
            if let Some(e) = broken {
                return (0, Some(e));
            }
            let parts = lr.slices(*lend);
            if parts.is_empty() {
                return (0, Some(libc::EIO));
            }
            let bytes = copy::range_of(&parts, off, len);
            let out = match meta.get(tag).and_then(|m| m.dest) {
                Some(o) => copy::send_msg(&*fd, &bytes, &o, v6, true),
                None => copy::send_all(&*fd, &bytes, chunk),
            };
            calls += out.syscalls;
            copies += 1;
            (out.bytes, out.error)
        });
        s.counters.syscalls += calls;
        s.stats.send_syscalls += calls;
        s.stats.room_copies += copies;
    }
}

/// Resets a TCP connection at once: `SO_LINGER` 0 for the close to come, and a disconnect
/// now (`tcp_disconnect` purges the write queue, so zero-copy pages come back while the
/// descriptor is still open).
fn reset(fd: &std::os::fd::OwnedFd) {
    let _ = crate::sys::net::set_linger_zero(fd);
    let _ = crate::sys::net::disconnect(fd);
}

/// A ring socket's zero-copy sends go by copy from now on (recorded).
fn switch_to_copy(s: &mut super::sock::Sock, why: &str) {
    if let Some(a) = s.auto.as_mut() {
        a.zc = None;
    }
    if s.path.is_zero_copy() {
        s.fall_back(Path::UringCopy, why);
    }
}

trait RingOpt {
    fn is_none_or_dead(&self) -> bool;
}

impl RingOpt for Option<&Uring> {
    fn is_none_or_dead(&self) -> bool {
        self.map_or(true, |u| u.lr.is_dead())
    }
}

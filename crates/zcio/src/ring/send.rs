//! Safe, ownership-taking zero-copy sends over io_uring `IORING_OP_SEND_ZC` (Linux 6.0).
//!
//! [`SendRing::send`] takes a [`PoolBuf`] by value and keeps it until the kernel is done with
//! it: every request posts a result CQE (bytes or `-errno`; `IORING_CQE_F_MORE` when a
//! notification follows) and, if `F_MORE` was set, a notification CQE (`IORING_CQE_F_NOTIF`,
//! whose `res` carries `IORING_NOTIF_USAGE_ZC_COPIED` with `IORING_SEND_ZC_REPORT_USAGE`, 6.2)
//! once the kernel no longer references the pages. Only then does the buffer come back, in a
//! [`SendDone`]. Requests that fail still notify when the kernel set `F_MORE` on them, and
//! the slot waits for that notification too.
//!
//! Ordering on stream sockets: io_uring may reorder two sends to one socket (a send that
//! meets a full socket buffer is retried later from poll, and a later send can pass it). So on
//! stream sockets requests are submitted as one `IOSQE_IO_LINK` chain with `MSG_WAITALL`
//! (the kernel then retries short sends itself, and a short or failed send cancels the rest of
//! the chain with `ECANCELED`); the next chain is submitted only once every result of the
//! previous one is in. A send that stopped short is continued from where it stopped, before
//! anything queued after it. Datagram sockets need no ordering and get no links.
#![allow(unsafe_code)]

use super::{Ring, RingConfig, RingError};
use crate::buf::pool::{Pool, PoolBuf, PoolPin};
use crate::sys::{IORING_CQE_F_MORE, IORING_CQE_F_NOTIF, IORING_NOTIF_USAGE_ZC_COPIED};
use io_uring::{opcode, squeue, types};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest chain submitted at once on a stream socket.
const MAX_CHAIN: usize = 256;
/// Longest single request (the SQE length field is 32 bits).
const MAX_REQ: usize = 1 << 30;

/// A send whose buffer the kernel no longer references.
#[derive(Debug)]
pub struct SendDone {
    /// The tag given to [`SendRing::send`].
    pub tag: u64,
    /// The buffer, back in the caller's hands.
    pub buf: PoolBuf,
    /// Bytes the kernel accepted for sending.
    pub bytes: usize,
    /// The first error a request of this send returned (errno), if any.
    pub error: Option<i32>,
    /// Notifications that said the data went out without a copy.
    pub notifs_zerocopy: u32,
    /// Notifications that said the kernel copied the data after all.
    pub notifs_copied: u32,
    /// Notifications that said nothing about copying: the kernel lacks
    /// `IORING_SEND_ZC_REPORT_USAGE` (before 6.2), see [`SendRing::reports_usage`].
    pub notifs_unreported: u32,
    /// Byte ranges `(offset, len)` never handed to the kernel because the ring gave up (see
    /// [`SendRing::gave_up`]); the caller sends them another way.
    pub unsent: Vec<(usize, usize)>,
}

#[derive(Debug)]
struct Slot {
    buf: PoolBuf,
    tag: u64,
    done: usize,
    reqs: u32,
    /// Notifications announced by `F_MORE` on a result that sent bytes, not yet seen.
    notifs: u32,
    /// Notifications announced by `F_MORE` on a result that sent nothing (their usage
    /// report says nothing about this send's bytes), not yet seen.
    notifs_idle: u32,
    /// Failed results without `F_MORE`: the kernel may still post a notification for them
    /// (a request that passed prep flushes its notification in cleanup, cancelled links
    /// included). Settled by the first harvest after the next enter.
    unsure: u32,
    unsure_at: u64,
    gen: u16,
    staged: u32,
    zc: u32,
    copied: u32,
    unreported: u32,
    error: Option<i32>,
    unsent: Vec<(usize, usize)>,
}

#[derive(Debug, Clone, Copy)]
struct Req {
    slot: u32,
    off: usize,
    len: usize,
}

/// Counters of a [`SendRing`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendRingStats {
    /// SEND_ZC requests pushed.
    pub requests: u64,
    /// Result CQEs seen.
    pub results: u64,
    /// Notification CQEs seen.
    pub notifs: u64,
    /// Notification CQEs with `IORING_NOTIF_USAGE_ZC_COPIED`.
    pub notifs_copied: u64,
    /// Requests resubmitted (short sends continued, cancelled links, ENOBUFS retries).
    pub resubmits: u64,
    /// Times submission paused for room (ENOBUFS/ENOMEM) until a notification came.
    pub room_waits: u64,
    /// Notifications that matched no request awaiting one (late ones of failed requests).
    pub stray_notifs: u64,
}

/// A send-only io_uring bound to one socket, owning every buffer in flight.
pub struct SendRing {
    // Field order matters: the ring is dropped (and its registration released) before the
    // registered pool's pin.
    ring: Ring,
    fd: RawFd,
    stream: bool,
    chunk: usize,
    msg_flags: i32,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    staged: VecDeque<Req>,
    chain: Vec<(Req, Option<i32>)>,
    chain_pending: usize,
    in_kernel: usize,
    notifs_pending: usize,
    gens: Vec<u16>,
    unsettled: Vec<u32>,
    chain_cap: usize,
    live: usize,
    blocked: bool,
    fatal: Option<i32>,
    gave_up: Option<i32>,
    done: VecDeque<SendDone>,
    cqes: Vec<(u64, i32, u32)>,
    stats: SendRingStats,
    own_enters: u64,
    fixed_file: bool,
    /// `zc_flags` of every SEND_ZC, from the probed features.
    zc_flags: u16,
    fixed: Option<(u64, PoolPin)>,
    _sock: Arc<OwnedFd>,
}

impl std::fmt::Debug for SendRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendRing")
            .field("fd", &self.fd)
            .field("stream", &self.stream)
            .field("live", &self.live)
            .field("stats", &self.stats)
            .finish()
    }
}

impl SendRing {
    /// A ring for sends on `sock`. `stream` selects linked, ordered submission (TCP);
    /// `chunk` is the most bytes one request carries (datagram sockets: one GSO write).
    pub fn new(
        sock: Arc<OwnedFd>,
        stream: bool,
        chunk: usize,
        cfg: &RingConfig,
    ) -> Result<Self, RingError> {
        let ring = Ring::new(cfg)?;
        let chunk = chunk.clamp(1, MAX_REQ);
        // The socket as registered file 0: requests then skip the per-request file table
        // lookup and reference count (fget/fput). The fd stays open for the ring's lifetime
        // (`_sock`). Without registration (ENOMEM/EINVAL) requests name the fd.
        let fixed_file = ring
            .raw()
            .submitter()
            .register_files(&[sock.as_raw_fd()])
            .is_ok();
        Ok(Self {
            ring,
            fd: sock.as_raw_fd(),
            stream,
            chunk: if stream { MAX_REQ } else { chunk },
            msg_flags: libc::MSG_NOSIGNAL | if stream { libc::MSG_WAITALL } else { 0 },
            slots: Vec::new(),
            free: Vec::new(),
            staged: VecDeque::new(),
            chain: Vec::new(),
            chain_pending: 0,
            in_kernel: 0,
            notifs_pending: 0,
            gens: Vec::new(),
            unsettled: Vec::new(),
            chain_cap: MAX_CHAIN,
            live: 0,
            blocked: false,
            fatal: None,
            gave_up: None,
            done: VecDeque::new(),
            cqes: Vec::new(),
            stats: SendRingStats::default(),
            own_enters: 0,
            fixed_file,
            zc_flags: super::features::Features::get().send_zc_flags(),
            fixed: None,
            _sock: sock,
        })
    }

    /// Whether notifications report copies (`IORING_SEND_ZC_REPORT_USAGE`, 6.2, probed by a
    /// real request at set-up). Without it a notification only says the pages are free.
    pub fn reports_usage(&self) -> bool {
        self.zc_flags & crate::sys::IORING_SEND_ZC_REPORT_USAGE != 0
    }

    /// Whether the kernel knows `IORING_OP_SEND_ZC`.
    pub fn supports_send_zc(&self) -> io::Result<bool> {
        Ok(self
            .ring
            .probe_opcodes()?
            .is_supported(opcode::SendZc::CODE))
    }

    /// Registers the whole of `pool` as fixed buffer 0; sends of its buffers then use
    /// `IORING_RECVSEND_FIXED_BUF`. Fails with `ENOMEM` when `RLIMIT_MEMLOCK` is exhausted
    /// (for callers without `CAP_IPC_LOCK`).
    pub fn register_pool(&mut self, pool: &Pool) -> io::Result<()> {
        let (iov, pin) = pool.iovec();
        // SAFETY: `iov` describes the pool's live mapping; `pin` keeps it mapped and is stored
        // in `self.fixed`, which is dropped after `self.ring` (field order), i.e. after the
        // registration is gone.
        unsafe { self.ring.raw().submitter().register_buffers(&[iov]) }?;
        self.fixed = Some((pool.id(), pin));
        Ok(())
    }

    /// Whether a pool is registered.
    pub fn has_fixed(&self) -> bool {
        self.fixed.is_some()
    }

    /// Queues `buf[..buf.len()]` for sending; `tag` comes back in its [`SendDone`]. An empty
    /// buffer completes at once without a request. After a fatal error on a stream socket,
    /// or after the ring gave up, the buffer completes at once with that error (or unsent).
    pub fn send(&mut self, tag: u64, buf: PoolBuf) {
        let len = buf.len();
        let mut slot = Slot {
            buf,
            tag,
            done: 0,
            reqs: 0,
            notifs: 0,
            notifs_idle: 0,
            unsure: 0,
            unsure_at: 0,
            gen: 0,
            staged: 0,
            zc: 0,
            copied: 0,
            unreported: 0,
            error: None,
            unsent: Vec::new(),
        };
        if len == 0 {
            self.emit(slot);
            return;
        }
        if let Some(e) = self.fatal {
            slot.error = Some(e);
            self.emit(slot);
            return;
        }
        if self.gave_up.is_some() {
            slot.unsent.push((0, len));
            self.emit(slot);
            return;
        }
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.gens.push(0);
                (self.slots.len() - 1) as u32
            }
        };
        // A new generation per use of the slot: a late notification of an earlier use can
        // never be taken for this one.
        self.gens[idx as usize] = self.gens[idx as usize].wrapping_add(1);
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
        self.slots[idx as usize] = Some(slot);
        self.live += 1;
    }

    /// Sends still owned by the ring (queued, in the kernel, or awaiting a notification).
    pub fn in_flight(&self) -> usize {
        self.live
    }

    /// Requests queued here but not yet handed to the kernel.
    pub fn staged(&self) -> usize {
        self.staged.len()
    }

    /// Whether requests are in the kernel without their result CQE yet.
    pub fn results_pending(&self) -> bool {
        self.in_kernel > 0
    }

    /// The errno that made the ring stop submitting (`EOPNOTSUPP`: the socket does not do
    /// SEND_ZC; `ENOBUFS`/`ENOMEM`: no room even with nothing in flight). Sends returned
    /// after that carry their unsent ranges.
    pub fn gave_up(&self) -> Option<i32> {
        self.gave_up
    }

    /// `io_uring_enter` calls made.
    pub fn enters(&self) -> u64 {
        self.ring.enters() + self.own_enters
    }

    /// Counters.
    pub fn stats(&self) -> &SendRingStats {
        &self.stats
    }

    /// Pushes what may be pushed and enters the kernel if there is anything to submit.
    pub fn submit(&mut self) -> io::Result<()> {
        self.pump()?;
        self.enter_submit()?;
        self.harvest()?;
        if self.chain_pending > 0 && self.task_work_pending() {
            // A chain member met a full socket buffer and was retried from poll: under
            // DEFER_TASKRUN that retry is task work that runs only when we enter with
            // GETEVENTS. Run it now rather than when the caller next waits.
            self.enter_getevents()?;
            self.harvest()?;
        }
        if !self.staged.is_empty() && self.chain_pending == 0 {
            // The previous chain ended during this enter: start the next one.
            self.pump()?;
            self.enter_submit()?;
            self.harvest()?;
        }
        Ok(())
    }

    /// Collects what the kernel has posted and, if it flagged deferred task work while
    /// requests or notifications are outstanding (under `DEFER_TASKRUN` notifications of
    /// sends that left the socket are task work), runs it with one `io_uring_enter` and
    /// collects again. No syscall when the kernel has nothing pending for us.
    pub fn reap_notifications(&mut self) -> io::Result<()> {
        self.harvest()?;
        if (self.notifs_pending > 0 || self.in_kernel > 0) && self.task_work_pending() {
            self.enter_getevents()?;
            self.harvest()?;
        }
        Ok(())
    }

    /// Collects what is already in the completion queue; never makes a syscall (unless the
    /// kernel's CQ overflowed and must be flushed).
    pub fn harvest_ready(&mut self) -> io::Result<()> {
        self.harvest()
    }

    /// Submits queued entries with `IORING_ENTER_GETEVENTS`: under `DEFER_TASKRUN`
    /// notifications of earlier sends are task work that only runs when the owner enters with
    /// GETEVENTS, so every submitting enter also posts them, and collecting them needs no
    /// syscall of its own. No syscall when nothing is queued.
    fn enter_submit(&mut self) -> io::Result<()> {
        if self.ring.pending() == 0 {
            return Ok(());
        }
        self.enter_getevents()
    }

    /// Whether the kernel flagged deferred task work (`IORING_SQ_TASKRUN`).
    fn task_work_pending(&self) -> bool {
        // SAFETY: only the shared flags word is read; this thread is the ring's only user.
        unsafe { self.ring.raw().submission_shared() }.taskrun()
    }

    /// One `io_uring_enter(pending, 0, GETEVENTS)`.
    fn enter_getevents(&mut self) -> io::Result<()> {
        let pending = self.ring.pending();
        self.own_enters += 1;
        // SAFETY: no argument pointer is passed; the entries submitted are the ones `push`
        // queued, whose buffer contract `push` upholds.
        let res = unsafe {
            self.ring.raw().submitter().enter::<libc::sigset_t>(
                pending as u32,
                0,
                io_uring::EnterFlags::GETEVENTS.bits(),
                None,
            )
        };
        match res {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Submits, then waits until at least one CQE arrives or `timeout` passes (no wait when
    /// nothing is in the kernel), and harvests.
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.pump()?;
        let before = self.done.len();
        self.harvest()?;
        if self.done.len() > before && self.ring.pending() == 0 {
            // Something came back already: no need to enter.
            return Ok(());
        }
        if self.in_kernel == 0 && self.notifs_pending == 0 {
            self.enter_submit()?;
        } else {
            self.ring.submit_and_wait(1, timeout)?;
        }
        self.harvest()?;
        // Results may have unblocked staged requests (next chain, retries): push them now.
        if !self.staged.is_empty() {
            self.pump()?;
            self.enter_submit()?;
            self.harvest()?;
        }
        Ok(())
    }

    /// Waits until nothing is in flight or `timeout` passes; returns whether all came back.
    pub fn drain(&mut self, timeout: Duration) -> io::Result<bool> {
        let end = Instant::now() + timeout;
        while self.live > 0 {
            let now = Instant::now();
            if now >= end {
                return Ok(false);
            }
            self.wait(Some((end - now).min(Duration::from_millis(100))))?;
        }
        Ok(true)
    }

    /// Takes the next finished send.
    pub fn next_done(&mut self) -> Option<SendDone> {
        self.done.pop_front()
    }

    /// Finished sends waiting to be taken.
    pub fn done_len(&self) -> usize {
        self.done.len()
    }

    fn pump(&mut self) -> io::Result<()> {
        if self.staged.is_empty() {
            return Ok(());
        }
        if self.blocked {
            if self.notifs_pending > 0 || self.in_kernel > 0 {
                return Ok(());
            }
            // No room although nothing of ours is in flight: the limit is not ours to wait
            // out (RLIMIT_MEMLOCK, optmem_max below one send). Hand everything back.
            self.give_up(libc::ENOBUFS);
            return Ok(());
        }
        if self.stream {
            if self.chain_pending > 0 {
                return Ok(());
            }
            let n = self.staged.len().min(self.chain_cap);
            for i in 0..n {
                let req = self.staged.pop_front().expect("counted");
                self.push(req, i + 1 < n)?;
                self.chain.push((req, None));
            }
            self.chain_pending = n;
        } else {
            while let Some(req) = self.staged.pop_front() {
                self.push(req, false)?;
            }
        }
        Ok(())
    }

    fn push(&mut self, req: Req, link: bool) -> io::Result<()> {
        let slot = self.slots[req.slot as usize]
            .as_mut()
            .expect("staged request has a live slot");
        // SAFETY (pointer arithmetic): `off + len <= buf.len()`, checked when staging.
        let ptr = unsafe { slot.buf.as_ptr().add(req.off) };
        let fixed = matches!(&self.fixed, Some((id, _)) if *id == slot.buf.pool_id());
        let mut op = if self.fixed_file {
            opcode::SendZc::new(types::Fixed(0), ptr, req.len as u32)
        } else {
            opcode::SendZc::new(types::Fd(self.fd), ptr, req.len as u32)
        }
        .flags(self.msg_flags)
        .zc_flags(self.zc_flags);
        if fixed {
            op = op.buf_index(Some(0));
        }
        let mut sqe = op
            .build()
            .user_data((u64::from(slot.gen) << 48) | (u64::from(req.slot) << 32) | req.off as u64);
        if link {
            sqe = sqe.flags(squeue::Flags::IO_LINK);
        }
        slot.staged -= 1;
        slot.reqs += 1;
        self.in_kernel += 1;
        self.stats.requests += 1;
        // SAFETY: the SQE points at `len` bytes of `slot.buf` (and, when fixed, inside the
        // registered pool kept mapped by `self.fixed`). The PoolBuf stays in `self.slots`
        // until this request's result CQE and, when that CQE has F_MORE, its notification
        // CQE have been harvested (`finish` checks `reqs == 0 && notifs == 0`). A failed
        // result without F_MORE sent nothing, so the kernel does not read the buffer for it;
        // its possible late notification is matched by generation, never to a new use. On drop with
        // requests outstanding the buffers are leaked, never reused. The socket fd stays open
        // as `self._sock` is held for the ring's lifetime.
        unsafe { self.ring.push(&sqe) }
    }

    fn harvest(&mut self) -> io::Result<()> {
        let mut cqes = std::mem::take(&mut self.cqes);
        self.ring
            .harvest(|c| cqes.push((c.user_data(), c.result(), c.flags())))?;
        for &(ud, res, flags) in &cqes {
            self.on_cqe(ud, res, flags);
        }
        cqes.clear();
        self.cqes = cqes;
        self.settle();
        Ok(())
    }

    /// Failed requests whose notification, if the kernel posts one, would have been posted
    /// by now (an enter with GETEVENTS ran the task work after their result was seen): stop
    /// waiting for it.
    fn settle(&mut self) {
        if self.unsettled.is_empty() {
            return;
        }
        let enters = self.enters();
        let mut keep = Vec::new();
        for idx in std::mem::take(&mut self.unsettled) {
            let Some(Some(slot)) = self.slots.get_mut(idx as usize) else {
                continue;
            };
            if slot.unsure == 0 {
                continue;
            }
            if enters > slot.unsure_at {
                slot.unsure = 0;
                self.finish(idx);
            } else if !keep.contains(&idx) {
                keep.push(idx);
            }
        }
        self.unsettled = keep;
    }

    fn on_cqe(&mut self, ud: u64, res: i32, flags: u32) {
        let gen = (ud >> 48) as u16;
        let idx = ((ud >> 32) & 0xffff) as u32;
        let off = (ud & 0xffff_ffff) as usize;
        let live = matches!(self.slots.get(idx as usize), Some(Some(sl)) if sl.gen == gen);
        if flags & IORING_CQE_F_NOTIF != 0 {
            self.stats.notifs += 1;
            if !live {
                self.stats.stray_notifs += 1;
                return;
            }
            let reports_usage = self.reports_usage();
            let slot = self.slots[idx as usize].as_mut().expect("live");
            if slot.notifs_idle > 0 {
                // Belongs to a request that sent nothing: no usage to report.
                slot.notifs_idle -= 1;
                self.notifs_pending -= 1;
            } else if slot.unsure > 0 && slot.notifs == 0 {
                slot.unsure -= 1;
            } else if slot.notifs > 0 {
                // The kernel released pages of a send: room may be back.
                self.blocked = false;
                slot.notifs -= 1;
                self.notifs_pending -= 1;
                if !reports_usage {
                    slot.unreported += 1;
                } else if (res as u32) & IORING_NOTIF_USAGE_ZC_COPIED != 0 {
                    slot.copied += 1;
                    self.stats.notifs_copied += 1;
                } else {
                    slot.zc += 1;
                }
            } else {
                self.stats.stray_notifs += 1;
                return;
            }
            self.finish(idx);
            return;
        }
        if !live {
            // Cannot happen: a slot is only freed once all its results are in.
            self.stats.stray_notifs += 1;
            return;
        }
        self.stats.results += 1;
        self.in_kernel -= 1;
        let more = flags & IORING_CQE_F_MORE != 0;
        if more {
            self.notifs_pending += 1;
        }
        let stream = self.stream;
        let enters = self.enters();
        let slot = self.slot(idx);
        if !stream {
            // Stream results are applied in chain order by `end_chain`.
            slot.reqs -= 1;
        }
        if more && res > 0 {
            slot.notifs += 1;
        } else if more {
            slot.notifs_idle += 1;
        } else if res < 0 {
            slot.unsure += 1;
            slot.unsure_at = enters;
            self.unsettled.push(idx);
        }
        if stream {
            if let Some(e) = self
                .chain
                .iter_mut()
                .find(|(r, res)| r.slot == idx && r.off == off && res.is_none())
            {
                e.1 = Some(res);
            }
            self.chain_pending -= 1;
            if self.chain_pending == 0 {
                self.end_chain();
            }
        } else {
            let chunk = self.chunk;
            let slot = self.slot(idx);
            let len = (slot.buf.len() - off).min(chunk);
            let req = Req {
                slot: idx,
                off,
                len,
            };
            if res >= 0 {
                slot.done += res as usize;
            } else if is_room(-res) {
                slot.staged += 1;
                self.staged.push_front(req);
                self.stats.resubmits += 1;
                self.stats.room_waits += 1;
                self.blocked = true;
            } else if -res == libc::EOPNOTSUPP {
                slot.unsent.push((req.off, req.len));
                self.give_up(libc::EOPNOTSUPP);
            } else {
                slot.error.get_or_insert(-res);
            }
            self.finish(idx);
        }
    }

    fn end_chain(&mut self) {
        let chain = std::mem::take(&mut self.chain);
        let n = chain.len();
        let mut room = false;
        let mut front: Vec<Req> = Vec::new();
        let mut touched = Vec::new();
        for (req, res) in chain {
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
            } else if -res == libc::EOPNOTSUPP {
                slot.unsent.push((req.off, req.len));
                self.gave_up = Some(libc::EOPNOTSUPP);
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
        self.stats.resubmits += front.len() as u64;
        for r in front.into_iter().rev() {
            self.staged.push_front(r);
        }
        if let Some(e) = self.fatal {
            // Everything still owned by the ring failed with the connection: mark it, so
            // buffers that come back later (on notification) carry the error too.
            for s in self.slots.iter_mut().flatten() {
                s.error.get_or_insert(e);
            }
            while let Some(r) = self.staged.pop_front() {
                let slot = self.slot(r.slot);
                slot.staged -= 1;
                slot.error.get_or_insert(e);
                touched.push(r.slot);
            }
        } else if let Some(e) = self.gave_up {
            self.give_up(e);
        }
        for idx in touched {
            self.finish(idx);
        }
    }

    /// Stops submitting: every staged request becomes an unsent range of its send.
    fn give_up(&mut self, errno: i32) {
        self.gave_up.get_or_insert(errno);
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

    fn slot(&mut self, idx: u32) -> &mut Slot {
        self.slots[idx as usize]
            .as_mut()
            .expect("CQE for a live slot")
    }

    fn finish(&mut self, idx: u32) {
        let ready = matches!(&self.slots[idx as usize],
            Some(s) if s.reqs == 0 && s.notifs == 0 && s.notifs_idle == 0 && s.unsure == 0
                && s.staged == 0);
        if !ready {
            return;
        }
        let slot = self.slots[idx as usize].take().expect("checked");
        self.free.push(idx);
        self.live -= 1;
        self.emit(slot);
    }

    fn emit(&mut self, mut slot: Slot) {
        slot.unsent.sort_unstable();
        self.done.push_back(SendDone {
            tag: slot.tag,
            buf: slot.buf,
            bytes: slot.done,
            error: slot.error,
            notifs_zerocopy: slot.zc,
            notifs_copied: slot.copied,
            notifs_unreported: slot.unreported,
            unsent: slot.unsent,
        });
    }
}

fn is_room(errno: i32) -> bool {
    errno == libc::ENOBUFS || errno == libc::ENOMEM || errno == libc::EAGAIN
}

impl Drop for SendRing {
    fn drop(&mut self) {
        if self.live > 0 {
            // Give the kernel a moment to hand the buffers back.
            let _ = self.drain(Duration::from_secs(2));
        }
        let mut leaked = 0;
        for s in self.slots.iter_mut().filter_map(Option::take) {
            // The kernel may still read these pages: never let the pool reuse them.
            std::mem::forget(s.buf);
            leaked += 1;
        }
        if leaked > 0 {
            tracing::warn!(
                leaked,
                "SendRing dropped with sends in flight: their buffers are leaked, not reused"
            );
            if let Some(pin) = self.fixed.take() {
                std::mem::forget(pin);
            }
        }
    }
}

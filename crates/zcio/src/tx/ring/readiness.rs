//! The readiness descriptor of a [`SendRing`]: an epoll set with the ring's eventfd and the
//! syscall-path sockets that wait for their socket.

use super::SendRing;
use crate::sys;
use crate::tx::TxError;
use std::os::fd::{AsFd, BorrowedFd};

/// The readiness set and which sources are in it.
#[derive(Debug)]
pub(in crate::tx) struct Readiness {
    pub(in crate::tx) set: sys::ready::ReadySet,
    pub(in crate::tx) ring: bool,
    /// Sockets in the set (syscall paths: error queues, `EPOLLOUT`).
    pub(in crate::tx) socks: usize,
    /// Watched edge-triggered ([`SendRing::set_edge_readiness`]).
    pub(in crate::tx) edge: bool,
}

/// Token of the ring's eventfd in the readiness set (sockets use their index).
pub(in crate::tx) const RING_TOKEN: u64 = u64::MAX;

impl SendRing {
    // ---- readiness ----

    pub(super) fn sync_readiness_set(&mut self) -> Result<(), TxError> {
        if self.readiness.is_none() {
            let set = sys::ready::ReadySet::new()
                .map_err(|e| crate::tx::sock_err("readiness descriptor", e))?;
            self.readiness = Some(Readiness {
                set,
                ring: false,
                socks: 0,
                edge: false,
            });
            // Sockets that wait on their error queue join now.
            let n = self.socks.len() as u32;
            for idx in 0..n {
                let Some(mut s) = self.socks[idx as usize].take() else {
                    continue;
                };
                if s.msg.is_some() && !s.in_epoll {
                    self.watch_socket(idx, &mut s, false);
                }
                self.socks[idx as usize] = Some(s);
            }
        }
        Ok(())
    }

    /// Creates the readiness set (on first call) and puts the ring's eventfd in it.
    pub(super) fn sync_readiness(&mut self) -> Result<(), TxError> {
        self.sync_readiness_set()?;
        let has_ring = self.readiness.as_ref().is_some_and(|r| r.ring);
        if !has_ring {
            if let Some(u) = self.uring.as_mut().filter(|u| !u.lr.is_dead()) {
                let err = |e| crate::tx::sock_err("readiness descriptor", e);
                let fd = u.lr.notify_fd().map_err(err)?;
                let rd = self.readiness.as_mut().expect("created");
                rd.set
                    .add_level_token(fd, libc::EPOLLIN as u32, RING_TOKEN)
                    .map_err(err)?;
                rd.ring = true;
            }
        }
        Ok(())
    }

    /// The readiness descriptor, created on first call: it polls readable when
    /// [`SendRing::on_ready`] would find something to do — a completion or notification on
    /// the ring (its registered eventfd; under `DEFER_TASKRUN` the kernel signals it when it
    /// queues the task work that posts them), a `MSG_ZEROCOPY` notification on a socket's
    /// error queue, or a socket that a stalled copy or zero-copy send waits for becoming
    /// writable. The ring's own calls never leave it readable for work they did themselves
    /// (the eventfd is quiet while they run, `IORING_CQ_EVENTFD_DISABLED`), except for
    /// requests their harvests let go (a stream chain ended) that they did not submit within
    /// their rounds: `on_ready` submits them. It may wake without a completion to take in
    /// two cases: the result of a zero-copy send came before its notification (`on_ready`
    /// lets the socket's next requests go), and a ring shared with a receiver is woken by
    /// the receiver's completions too. A third, kernel-dependent:
    /// the kernel may flag task work while one of the ring's calls runs and that call then
    /// runs it itself; the ring looks once when it sees the flag after its own enters, but a
    /// wake-up that lands before that look finds nothing (measured: 0.05–0.5 % of wake-ups
    /// on 6.18, under 5 % on 6.1, up to 3 of 20 in a 6.12 guest and 28 of 49 in a 7.2
    /// guest, where emulation's timing may add to it). Sends that complete inside
    /// [`SendRing::send`] (copy) do not signal it: check [`SendRing::ready`] before waiting.
    /// Rules per task-run mode: `docs/design/async.md`.
    pub fn readiness_fd(&mut self) -> Result<BorrowedFd<'_>, TxError> {
        self.sync_readiness()?;
        Ok(self.readiness.as_ref().expect("readiness").set.as_fd())
    }

    /// Whether the readiness descriptor polls readable now.
    pub fn readiness_is_set(&self) -> bool {
        self.readiness.as_ref().is_some_and(|r| r.set.is_ready())
    }

    /// Harvests after the readiness descriptor fired (or at any time): takes the socket
    /// events off the descriptor, runs deferred task work if the kernel flagged some, reaps
    /// error queues, continues stalled sends, submits queued requests, and collects
    /// completions. Leaves the descriptor set only if work is left. Its work is
    /// O(completions + sockets with work), whatever the number of sockets, and bounded (at
    /// most four rounds of submit-or-reap; what is left keeps the descriptor readable).
    /// Returns the number of completions ready.
    pub fn on_ready(&mut self) -> Result<usize, TxError> {
        self.sync_readiness()?;
        // Edges first: an event that lands after this makes a new one. Watched
        // edge-triggered with only the ring's eventfd in the set, there is nothing to take:
        // the watcher's edges come from the eventfd's signals, whatever the set holds.
        let mut socks = Vec::new();
        if let Some(rd) = self
            .readiness
            .as_ref()
            .filter(|rd| !rd.edge || rd.socks > 0)
        {
            rd.set.drain(|token, _ev| {
                if token != RING_TOKEN {
                    socks.push(token as u32);
                }
            });
            self.own.0.syscalls += 1;
            self.own.1.notify_syscalls += 1;
        }
        for idx in socks {
            self.list_stalled(idx);
        }
        // Woken by the descriptor: the eventfd may be readable; unless work is left when
        // this ends, it is taken back (a wake-up is for work, not for work already done).
        self.quiet(true);
        // At most four rounds: one call's work is bounded (each enter runs a bounded batch
        // of deferred task work, Linux 6.13+: 20 items), and what is left keeps the
        // descriptor readable for the next call.
        for _ in 0..4 {
            if let Err(e) = self.ring_progress(true) {
                self.ring_failed(e);
            }
            self.reap_syscall_paths();
            if !self.ring_has_work() && !self.ring_released() {
                break;
            }
        }
        self.unquiet();
        Ok(self.ready.len())
    }

    /// The readiness descriptor is watched edge-triggered (epoll's `EPOLLET`, as tokio's
    /// `AsyncFd` watches every descriptor): [`SendRing::on_ready`] and the calls that
    /// harvest leave the ring's eventfd counter as it is instead of reading a signal back,
    /// and `on_ready` makes no `epoll_wait` on the set while no socket is in it. Each is one
    /// system call per harvest saved. Work left when a call ends is still signalled (an
    /// eventfd write: a new edge). Correct only for edge-triggered watchers: a
    /// level-triggered one would find the descriptor readable for ever.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn set_edge_readiness(&mut self, edge: bool) -> Result<(), TxError> {
        self.sync_readiness()?;
        if let Some(rd) = self.readiness.as_mut() {
            rd.edge = edge;
        }
        if let Some(u) = &self.uring {
            u.lr.set_edge_readiness(edge);
        }
        Ok(())
    }

    /// Whether the ring has completions or flagged task work waiting (no syscall).
    fn ring_has_work(&mut self) -> bool {
        self.uring
            .as_mut()
            .filter(|u| !u.lr.is_dead())
            .is_some_and(|u| u.lr.has_work())
    }

    /// A call that may enter the ring begins: the ring's eventfd stays quiet until the
    /// outermost such call ends, so its own enters' completions, which it harvests itself, do
    /// not leave the readiness descriptor readable (see `ring::SharedRing::begin_quiet`).
    pub(in crate::tx) fn quiet(&mut self, signalled: bool) {
        if let Some(u) = self.uring.as_mut() {
            if u.quiet_depth == 0 {
                u.quiet_enters = u.lr.enters();
            }
            u.quiet_depth += 1;
            u.lr.begin_quiet(signalled);
        }
    }

    /// The call ends: the descriptor is readable now exactly when work waits.
    ///
    /// A task-work flag seen after this call's own enters may be stale: the kernel sets
    /// `IORING_SQ_TASKRUN` when it queues work on an empty list, and (Linux 7.x, whose list is
    /// drained while it fills) the enter that was running then may have run that work too.
    /// Signalling for it would wake the caller for nothing (measured in a 7.2 guest: half the
    /// wake-ups), so the outermost call that entered looks once more (one enter) instead.
    pub(in crate::tx) fn unquiet(&mut self) {
        let Some(u) = self.uring.as_mut() else { return };
        u.quiet_depth = u.quiet_depth.saturating_sub(1);
        if u.quiet_depth == 0
            && !u.lr.is_dead()
            && u.lr.enters() != u.quiet_enters
            && u.lr.live() > 0
            && u.lr.task_work_pending()
        {
            if let Err(e) = self.ring_reap() {
                self.ring_failed(e);
            }
        }
        // Requests the call's harvests let go and its rounds did not push: nothing in the
        // kernel will announce them, so the descriptor says so itself.
        let left = self.ring_released();
        if let Some(u) = self.uring.as_mut() {
            u.lr.end_quiet(left);
            // The eventfd reads and writes count as the ring's own system calls.
            let e = u.lr.eventfd_calls();
            let d = e - u.eventfd_seen;
            u.eventfd_seen = e;
            self.own.0.syscalls += d;
            self.own.1.notify_syscalls += d;
        }
    }

    /// Submits what is queued (that enter also runs deferred task work), else collects what
    /// the kernel posted (`reap`: entering when it flagged deferred task work while buffers
    /// are out; else reading the CQ only); then submits what that let go: a chain's results
    /// let the socket's next requests go, which nothing else would submit.
    pub(super) fn ring_progress(&mut self, reap: bool) -> std::io::Result<()> {
        if self.uring.as_mut().is_some_and(|u| u.has_staged()) {
            self.ring_submit()?;
        } else if reap {
            self.ring_reap()?;
        } else {
            self.ring_harvest_only(true)?;
        }
        if self.uring.as_mut().is_some_and(|u| u.has_staged()) {
            self.ring_submit()?;
        }
        Ok(())
    }
}

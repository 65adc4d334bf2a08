//! Sockets of a [`SendRing`] on the syscall paths (`MSG_ZEROCOPY`, copy): sends the socket
//! could not take yet, error-queue reaps, and the readiness set's socket entries.

use super::{count_zc, SendRing};
use crate::buf::lent::Lent;
use crate::sys::msg::MsgOpts;
use crate::tx::copy;
use crate::tx::msgzc::Stall;
use crate::tx::sock::{Pending, Sock};
use crate::tx::{status_of, SendError, ZcStatus};
use std::os::fd::AsRawFd;

impl SendRing {
    /// A copy send by syscall: as much as the socket takes now; the rest when it is
    /// writable.
    pub(super) fn copy_send(&mut self, idx: u32, seq: u64, lent: Lent, dest: Option<MsgOpts>) {
        let s = self.socks[idx as usize].as_mut().expect("live");
        let out = match &dest {
            Some(o) => copy::send_msg(&*s.fd, &lent, o, s.v6, false),
            None => copy::send_nb(&*s.fd, &lent, s.chunk, 0),
        };
        s.counters.syscalls += out.syscalls;
        s.stats.send_syscalls += out.syscalls;
        if out.would_block && out.error.is_none() {
            s.pending = Some(Pending {
                seq,
                buf: lent,
                sent: out.bytes,
                dest,
            });
            self.stall(idx);
            return;
        }
        let error = out.error.map(SendError::from_errno);
        self.finish(idx, seq, lent, out.bytes, error, ZcStatus::NotAttempted);
    }

    /// Continues a copy send the socket buffer could not take in full.
    pub(super) fn continue_copy(&mut self, idx: u32) {
        let Some(s) = self.sock_at(idx) else { return };
        let Some(mut p) = s.pending.take() else {
            return;
        };
        let out = match &p.dest {
            Some(o) => copy::send_msg(&*s.fd, &p.buf, o, s.v6, false),
            None => copy::send_nb(&*s.fd, &p.buf, s.chunk, p.sent),
        };
        s.counters.syscalls += out.syscalls;
        s.stats.send_syscalls += out.syscalls;
        p.sent += out.bytes;
        if out.would_block && out.error.is_none() {
            s.pending = Some(p);
            return;
        }
        let error = out.error.map(SendError::from_errno);
        let Pending { seq, buf, sent, .. } = p;
        self.finish(idx, seq, buf, sent, error, ZcStatus::NotAttempted);
    }

    /// A syscall-path socket waits for its socket: into the readiness set (writable).
    pub(super) fn stall(&mut self, idx: u32) {
        self.list_stalled(idx);
        self.list_sys(idx);
        let Some(mut s) = self.socks[idx as usize].take() else {
            return;
        };
        self.watch_socket(idx, &mut s, true);
        self.socks[idx as usize] = Some(s);
    }

    /// Puts a syscall-path socket into the readiness set (creating it): its error queue
    /// always, `EPOLLOUT` while `out`.
    pub(super) fn watch_socket(&mut self, idx: u32, s: &mut Sock, out: bool) {
        if self.readiness.is_none() && !out {
            // Created on first use of the descriptor or first stall; `sync_readiness` adds
            // the sockets then.
            return;
        }
        if self.sync_readiness_set().is_err() {
            return;
        }
        let rd = self.readiness.as_ref().expect("created");
        let ev = if out { libc::EPOLLOUT as u32 } else { 0 };
        let res = if s.in_epoll {
            rd.set.modify_edge(s.fd.as_raw_fd(), ev, u64::from(idx))
        } else {
            rd.set.add_edge_token(s.fd.as_raw_fd(), ev, u64::from(idx))
        };
        if res.is_ok() {
            if !s.in_epoll {
                self.readiness.as_mut().expect("created").socks += 1;
            }
            s.in_epoll = true;
            s.counters.syscalls += 1;
            s.stats.notify_syscalls += 1;
        }
    }

    /// Makes progress on the syscall-path sockets that wait for their socket: continues
    /// copy sends, reaps error queues, makes the calls that may go.
    pub(super) fn pump_stalled(&mut self) {
        let list = std::mem::take(&mut self.stalled);
        for &idx in &list {
            let Some(s) = self.sock_at(idx) else { continue };
            s.stalled = false;
            if s.pending.is_some() {
                self.continue_copy(idx);
            }
            let s = self.sock_at(idx).expect("live");
            if let Some(m) = s.msg.as_mut() {
                m.reap();
                if m.stall() == Some(Stall::Full) {
                    m.on_writable();
                }
            }
            self.collect_msg(idx);
            // A copy send that finished here leaves a refused socket able to send again:
            // name it writable (collect_msg does so only for MSG_ZEROCOPY sockets).
            self.settle_sock(idx);
            let Some(s) = self.sock_at(idx) else { continue };
            let still = s.pending.is_some() || s.msg.as_ref().is_some_and(|m| m.stall().is_some());
            if still {
                self.list_stalled(idx);
            } else if s.in_epoll && s.msg.is_none() {
                // Writable again: stop asking for EPOLLOUT edges.
                let fd = s.fd.as_raw_fd();
                if let Some(rd) = &self.readiness {
                    let _ = rd.set.modify_edge(fd, 0, u64::from(idx));
                }
            }
        }
    }

    /// Moves finished `MSG_ZEROCOPY` sends of a socket to the ready list.
    pub(in crate::tx) fn collect_msg(&mut self, idx: u32) {
        loop {
            let Some(s) = self.sock_at(idx) else { return };
            let Some(m) = s.msg.as_mut() else { return };
            let Some(d) = m.next_done() else { break };
            s.counters.notifications += u64::from(d.ranges_zc + d.ranges_copied);
            let status = status_of(d.ranges_zc, d.ranges_copied, 0);
            let error = d.error.map(SendError::from_errno);
            let bytes = d.zc_bytes + d.copy_bytes;
            let zc_bytes = d.zc_bytes;
            count_zc(&mut s.counters, status, zc_bytes);
            self.finish(idx, d.tag, d.buf, bytes, error, status);
        }
        let Some(s) = self.sock_at(idx) else { return };
        if let Some(st) = s.msg.as_ref().map(|m| m.stats.clone()) {
            // The backend keeps totals: count what is new since the last look.
            let seen = &s.msg_seen;
            let ds = st.send_calls - seen.send_calls;
            let dn = st.notify_calls - seen.notify_calls;
            s.counters.syscalls += ds + dn;
            s.stats.send_syscalls += ds;
            s.stats.notify_syscalls += dn;
            s.stats.room_waits += st.enobufs_waits - seen.enobufs_waits;
            s.stats.room_copies += st.enobufs_copies - seen.enobufs_copies;
            s.stats.unmatched_notifications = st.unknown_ids;
            s.stats.queued_errors = st.queued_errors;
            s.msg_seen = st;
        }
        self.settle_sock(idx);
    }

    /// `idx` waits for its socket (listed once).
    pub(super) fn list_stalled(&mut self, idx: u32) {
        if let Some(s) = self.sock_at(idx) {
            if !s.stalled {
                s.stalled = true;
                self.stalled.push(idx);
            }
        }
    }

    /// `idx` has syscall-path sends in flight (listed once, until they are all done).
    pub(in crate::tx) fn list_sys(&mut self, idx: u32) {
        if let Some(s) = self.sock_at(idx) {
            if !s.sys_listed && s.sys_in_flight() > 0 {
                s.sys_listed = true;
                self.sys_busy.push(idx);
            }
        }
    }

    /// Error-queue reaps and stalled copy sends of the syscall paths: only the sockets
    /// listed as waiting or with sends in flight, each once; a socket leaves the list when
    /// its last syscall-path send is done.
    pub(super) fn reap_syscall_paths(&mut self) {
        if !self.stalled.is_empty() {
            self.pump_stalled();
        }
        if self.sys_busy.is_empty() {
            return;
        }
        let list = std::mem::take(&mut self.sys_busy);
        for &idx in &list {
            let Some(s) = self.sock_at(idx) else { continue };
            if let Some(m) = s.msg.as_mut() {
                if m.in_flight() > 0 {
                    m.reap();
                }
                self.collect_msg(idx);
            }
            if let Some(s) = self.sock_at(idx) {
                if s.sys_in_flight() > 0 {
                    self.sys_busy.push(idx);
                } else {
                    s.sys_listed = false;
                }
            }
        }
    }

    /// Sends of the syscall paths in flight (all sockets): those of the listed sockets.
    pub(in crate::tx) fn sys_in_flight(&self) -> usize {
        self.sys_busy
            .iter()
            .filter_map(|&i| self.socks.get(i as usize).and_then(Option::as_ref))
            .map(Sock::sys_in_flight)
            .sum()
    }
}

//! What a [`SendRing`] reports: sockets, sends in flight, counters, paths and fallbacks.

use super::SendRing;
use crate::stats::{Counters, Fallback, Report};
use crate::sys;
use crate::tx::sock::Sock;
use crate::tx::{Path, SockId, TxError, TxMode, TxStats, ZcStatus};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};

impl SendRing {
    // ---- what it reports ----

    /// Sockets open (closing ones included).
    pub fn sockets(&self) -> usize {
        self.open_n
    }

    /// Sends handed over whose completion has not been produced yet (all sockets). No walk
    /// over the sockets: a count kept as sends are handed over and complete.
    pub fn in_flight(&self) -> usize {
        debug_assert!(
            self.socks.len() > 64
                || self.in_flight_n
                    == self
                        .socks
                        .iter()
                        .flatten()
                        .map(Sock::in_flight)
                        .sum::<usize>(),
            "in-flight count {} differs from the sockets' sum",
            self.in_flight_n
        );
        self.in_flight_n
    }

    /// Sends of `sock` in flight (0 for a socket that is gone).
    pub fn sock_in_flight(&self, sock: SockId) -> usize {
        self.sock_ref(sock).map_or(0, Sock::in_flight)
    }

    /// The path `sock`'s new sends take now; `None` for a socket closed ([`SendRing::close`]
    /// and [`SendRing::sock_closed`], even while its last sends complete) or unknown.
    pub fn sock_path(&self, sock: SockId) -> Option<Path> {
        self.sock_ref(sock).filter(|s| !s.closing).map(|s| s.path)
    }

    /// The mode `sock` was added with.
    pub fn sock_mode(&self, sock: SockId) -> Option<TxMode> {
        self.sock_ref(sock).map(|s| s.cfg.mode)
    }

    /// Every fallback `sock` took, with its reason (empty for a socket that is gone).
    pub fn sock_fallbacks(&self, sock: SockId) -> &[Fallback] {
        self.sock_ref(sock).map_or(&[], |s| &s.fallbacks)
    }

    /// `sock`'s counters (its syscalls without the ring's shared enters).
    pub fn sock_counters(&self, sock: SockId) -> Counters {
        self.sock_ref(sock)
            .map_or_else(Counters::default, |s| s.counters.clone())
    }

    /// `sock`'s path counters (`auto`'s cost-by-size figures are the ring's).
    pub fn sock_stats(&self, sock: SockId) -> TxStats {
        self.sock_ref(sock).map_or_else(TxStats::default, |s| {
            let mut st = s.stats.clone();
            self.merge_policy(&mut st);
            st
        })
    }

    pub(super) fn merge_policy(&self, st: &mut TxStats) {
        let p = self.policy.stats();
        st.auto_windows = p.windows;
        st.auto_explores = p.explores;
        st.auto_drift_explores = p.drift_explores;
        st.auto_copy_below = self.policy.copy_below().map(|b| b as u64);
    }

    /// Whether `sock` is a stream (TCP).
    pub fn sock_is_stream(&self, sock: SockId) -> Option<bool> {
        self.sock_ref(sock).map(|s| s.stream)
    }

    /// UDP: bytes per datagram write of `sock` (a GSO batch when GSO is on); `usize::MAX`
    /// for TCP.
    pub fn sock_chunk(&self, sock: SockId) -> Option<usize> {
        self.sock_ref(sock).map(|s| s.chunk)
    }

    /// UDP: payload bytes per datagram on the wire of `sock`; `usize::MAX` for TCP.
    pub fn sock_segment(&self, sock: SockId) -> Option<usize> {
        self.sock_ref(sock).map(|s| s.segment)
    }

    /// The socket.
    pub fn socket(&self, sock: SockId) -> Option<BorrowedFd<'_>> {
        self.sock_ref(sock).map(|s| s.fd.as_fd())
    }

    /// Sets `TCP_CORK` (TCP) or `UDP_CORK` (UDP) on `sock`. Uncorking submits what is
    /// queued first.
    pub fn set_cork(&mut self, sock: SockId, on: bool) -> Result<(), TxError> {
        if !on {
            self.submit()?;
        }
        let s = self.sock_ref(sock).ok_or_else(|| {
            crate::tx::sock_err("set_cork", io::Error::from_raw_os_error(libc::EBADF))
        })?;
        let (level, name) = if s.stream {
            (libc::IPPROTO_TCP, libc::TCP_CORK)
        } else {
            (libc::IPPROTO_UDP, libc::UDP_CORK)
        };
        sys::setsockopt_int(&*s.fd, level, name, i32::from(on))
            .map_err(|e| crate::tx::sock_err("setsockopt(CORK)", e))
    }

    /// Counters of all sockets, with the ring's own kernel entries.
    pub fn counters_total(&self) -> Counters {
        let mut c = self.gone.0.clone();
        add_counters(&mut c, &self.own.0);
        for s in self.socks.iter().flatten() {
            add_counters(&mut c, &s.counters);
        }
        c
    }

    /// Path counters of all sockets, with the ring's own kernel entries.
    pub fn stats(&self) -> TxStats {
        let mut st = self.gone.1.clone();
        st.add(&self.own.1);
        for s in self.socks.iter().flatten() {
            st.add(&s.stats);
        }
        self.merge_policy(&mut st);
        st
    }

    /// One line: the ring (io_uring or syscalls), its sockets, and the paths its sends took
    /// with how many of each (what the bytes took, not what was offered).
    pub fn describe(&self) -> String {
        let st = self.stats();
        let names = ["copy", "msg-zc", "uring-zc", "uring-zc-fixed", "uring-copy"];
        let mix: Vec<String> = names
            .iter()
            .zip(st.sends_by_path)
            .filter(|(_, n)| *n > 0)
            .map(|(p, n)| format!("{p} {n}"))
            .collect();
        let mix = if mix.is_empty() {
            "no sends yet".to_string()
        } else {
            format!("sends by path: {}", mix.join(", "))
        };
        let ring = match &self.uring {
            Some(_) if self.has_registered_pool() => "io_uring send ring, registered pool",
            Some(_) => "io_uring send ring",
            None => "send ring without io_uring",
        };
        format!("{ring}, {} sockets; {mix}", self.sockets())
    }

    /// `io_uring_enter` calls made (0 without a ring).
    pub fn enters(&self) -> u64 {
        self.uring.as_ref().map_or(0, |u| u.lr.enters())
    }

    /// The ring's own counters (buffers lent and returned, requests, sockets without a
    /// registered-file slot); `None` without a ring.
    pub fn ring_stats(&self) -> Option<crate::ring::lend::LendStats> {
        self.uring.as_ref().map(|u| u.lr.stats().clone())
    }

    /// Whether io_uring carries this ring's sends (else every socket uses syscalls).
    pub fn has_uring(&self) -> bool {
        self.uring.is_some()
    }

    /// Makes the io_uring's `io_uring_enter` calls fail as `fault` says (tests of the
    /// failure paths); returns whether there is a ring.
    #[cfg(feature = "fault-injection")]
    pub fn inject_ring_fault(&mut self, fault: crate::ring::lend::Fault) -> bool {
        self.uring.as_mut().map(|u| u.lr.inject(fault)).is_some()
    }
}

pub(in crate::tx) fn count_zc(c: &mut Counters, status: ZcStatus, bytes: usize) {
    match status {
        ZcStatus::ZeroCopy => c.zerocopy_bytes += bytes as u64,
        ZcStatus::Copied | ZcStatus::Mixed => c.copied_bytes += bytes as u64,
        ZcStatus::NotAttempted | ZcStatus::Unknown => {}
    }
}

pub(in crate::tx) fn add_counters(a: &mut Counters, b: &Counters) {
    a.bytes += b.bytes;
    a.ops += b.ops;
    a.syscalls += b.syscalls;
    a.notifications += b.notifications;
    a.zerocopy_bytes += b.zerocopy_bytes;
    a.copied_bytes += b.copied_bytes;
}

impl SendRing {
    /// The best path the ring offers a new `auto` socket (what [`Report::path`] says before
    /// any send).
    pub fn offered_path(&self) -> Path {
        match &self.uring {
            Some(u) if u.lr.has_any_pool() => Path::UringZcFixed,
            Some(u) if matches!(u.send_zc, Ok(true)) => Path::UringZc,
            Some(_) => Path::UringCopy,
            None => Path::MsgZc,
        }
    }
}

impl Report for SendRing {
    type Path = Path;
    /// The path most of the ring's sends took (what its bytes took: loopback sends of an
    /// `auto` ring go by `uring-copy` although the ring offers `uring-zc-fixed`); the offered
    /// path before any send. [`SendRing::describe`] lists the mix, [`SendRing::sock_path`]
    /// says it per socket.
    fn path(&self) -> Path {
        let by = self.stats().sends_by_path;
        let all = [
            Path::Copy,
            Path::MsgZc,
            Path::UringZc,
            Path::UringZcFixed,
            Path::UringCopy,
        ];
        match all.into_iter().max_by_key(|p| by[p.index()]) {
            Some(p) if by[p.index()] > 0 => p,
            _ => self.offered_path(),
        }
    }
    fn counters(&self) -> Counters {
        self.counters_total()
    }
    fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }
}

//! The per-send path of a [`SendRing`]: checks, the path of each send, staging, and a finished
//! send becoming a completion.

use super::routes::{follow_verdict, watch_of};
use super::SendRing;
use crate::buf::lent::Lent;
use crate::stats::{self, Fallback};
use crate::sys;
use crate::tx::copy;
use crate::tx::policy::{Choice, Decision, Event};
use crate::tx::sock::{Meta, Parts, Sock};
use crate::tx::{
    Completion, Dest, Path, Refusal, Refused, SendError, SockId, Ticket, TxBuf, ZcStatus,
    MAX_SEGMENTS, MAX_SLICES,
};

impl SendRing {
    // ---- sending ----

    /// Sends `buf` on `sock`. The buffer comes back with its [`Completion`] from
    /// [`SendRing::next_completion`]; errors of the send are in the completion. Never waits:
    /// a send that cannot be queued now comes back as [`Refused`] with the buffer (see
    /// [`Refusal`]), and the socket is reported by [`SendRing::next_writable`] when it can
    /// take one again.
    pub fn send(&mut self, sock: SockId, buf: impl Into<TxBuf>) -> Result<Ticket, Refused<TxBuf>> {
        self.send_with(sock, buf, 0)
    }

    /// [`SendRing::send`] with a token of the caller's, returned in the completion (e.g.
    /// the connection a forwarded chunk came from).
    pub fn send_with(
        &mut self,
        id: SockId,
        buf: impl Into<TxBuf>,
        token: u64,
    ) -> Result<Ticket, Refused<TxBuf>> {
        self.send_inner(id, buf.into(), token, None)
    }

    /// Writes `slices` on the stream `sock` now, with one non-blocking `sendmsg` from the
    /// caller's memory: for sockets whose sends are copied by the kernel anyway (their path is
    /// `uring-copy` or `copy`, e.g. `auto` after the route's COPIED verdict), where copying
    /// the bytes into a pool buffer first would copy them twice. Only when nothing of `sock`
    /// is in flight, so the bytes keep their order with the ring's sends. Counted as a
    /// `copy`-path send ([`TxStats::sends_by_path`](crate::tx::TxStats), the socket's
    /// counters) as soon as it returns: it has no completion.
    ///
    /// `Ok(None)`: not taken (a zero-copy path, sends in flight, a datagram socket, a socket
    /// closing or unknown); the caller sends through the ring. `Ok(Some(n))`: `n` bytes were
    /// written (maybe fewer than given). `Err` with [`std::io::ErrorKind::WouldBlock`]: the
    /// socket buffer is full; other errors are the send's (a reset, a broken pipe).
    pub fn send_direct(
        &mut self,
        sock: SockId,
        slices: &[std::io::IoSlice<'_>],
    ) -> std::io::Result<Option<usize>> {
        let Some(s) = self.sock_mut(sock) else {
            return Ok(None);
        };
        if !s.stream
            || s.path.is_zero_copy()
            || s.in_flight() > 0
            || s.refusal().is_some()
            || s.broken.is_some()
        {
            return Ok(None);
        }
        let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
        let r = match slices {
            [one] => sys::net::send(&*s.fd, one, flags),
            many => sys::net::send_slices(&*s.fd, many, flags),
        };
        s.counters.syscalls += 1;
        s.stats.send_syscalls += 1;
        let n = r?;
        s.counters.ops += 1;
        s.counters.bytes += n as u64;
        s.counters.copied_bytes += n as u64;
        s.stats.sends_by_path[Path::Copy.index()] += 1;
        Ok(Some(n))
    }

    /// Sends the slices as one request (a vectored send): a small header (a
    /// [`TxBuf::Vec`] carried with the request, or a pool buffer) and one or more pool
    /// buffers or received chunks, at most [`MAX_SLICES`]. On the ring a zero-copy send goes
    /// as `SEND_ZC` with `IORING_SEND_VECTORIZED` (Linux 6.17; from a registered pool when
    /// every slice is in it) or, before 6.17, `SENDMSG_ZC` with an iovec (each step down
    /// recorded in [`SendRing::sock_fallbacks`]); a copy as `SENDMSG`. Without io_uring the
    /// slices are gathered into one buffer first (recorded). The completion hands back
    /// [`TxBuf::Slices`], every slice once, in order, after the kernel's last reference to
    /// any of them. On a UDP socket the slices are one datagram (or GSO train); with
    /// [`SendRing::send_to_with`] and a [`TxBuf::Slices`] they go to a destination.
    pub fn send_vectored(
        &mut self,
        sock: SockId,
        slices: Vec<TxBuf>,
        token: u64,
    ) -> Result<Ticket, Refused<TxBuf>> {
        self.send_inner(sock, TxBuf::Slices(slices), token, None)
    }

    /// Sends `buf` on an unconnected UDP socket to `dest`, cut into datagrams of `segment`
    /// bytes when given (GSO): one `IORING_OP_SENDMSG_ZC` with the destination in the message
    /// header and `UDP_SEGMENT` as a control message. See [`SendRing::send_to_with`].
    pub fn send_to(
        &mut self,
        sock: SockId,
        buf: impl Into<TxBuf>,
        dest: std::net::SocketAddr,
        segment: Option<u16>,
    ) -> Result<Ticket, Refused<TxBuf>> {
        let d = Dest {
            addr: dest,
            segment,
            tos: None,
        };
        self.send_to_with(sock, buf, &d, 0)
    }

    /// Sends `buf` as one datagram train to `dest` (its peer, GSO segment size and TOS/ECN)
    /// on a UDP socket, with a token returned in the completion. Many peers, one socket: each
    /// send is its own message, and many of them go to the kernel in one `io_uring_enter`.
    ///
    /// Paths, best first (each step down recorded in [`SendRing::sock_fallbacks`]):
    /// `SENDMSG_ZC` on the ring (from a registered pool where the kernel takes registered
    /// buffers for it, Linux 6.15), `sendmsg(MSG_ZEROCOPY)` with the same control messages,
    /// `sendmsg` by copy (`SENDMSG` on the ring for `uring-copy`). The completion says how
    /// many bytes went, whether the kernel copied, and the error: a send the kernel refuses
    /// (an unreachable destination, `ENETUNREACH`; a segment larger than the path MTU,
    /// `EINVAL`) fails alone, and the socket goes on. A buffer longer than one UDP datagram
    /// (65,507 bytes over IPv4) fails with [`SendError::MessageTooBig`], one cut into more
    /// than [`MAX_SEGMENTS`] segments, a segment size of 0 or an IPv6 destination on an IPv4
    /// socket with [`SendError::Invalid`], without a syscall.
    pub fn send_to_with(
        &mut self,
        sock: SockId,
        buf: impl Into<TxBuf>,
        dest: &Dest,
        token: u64,
    ) -> Result<Ticket, Refused<TxBuf>> {
        self.send_inner(sock, buf.into(), token, Some(*dest))
    }

    /// Why a send to `dest` cannot be made on socket `s` (before any syscall).
    pub(super) fn check_dest(s: &Sock, dest: &Dest, len: usize) -> Option<SendError> {
        let invalid = |errno, reason: String| Some(SendError::Invalid { errno, reason });
        if s.stream {
            return invalid(
                libc::EISCONN,
                "a destination on a stream socket: send_to is for UDP sockets (use send)".into(),
            );
        }
        if dest.addr.is_ipv6() && !s.v6 {
            return invalid(
                libc::EAFNOSUPPORT,
                format!(
                    "IPv6 destination {} on an IPv4 socket: bind an AF_INET6 socket to reach \
                     IPv6 peers",
                    dest.addr
                ),
            );
        }
        // One request: at most one datagram, and (on a connected socket with socket-wide GSO)
        // at most the train its core would otherwise cut the buffer into.
        let max = s.max_datagram.min(s.chunk);
        if len > max {
            return Some(SendError::MessageTooBig { len, max });
        }
        match dest.segment {
            Some(0) => invalid(libc::EINVAL, "a GSO segment size of 0".into()),
            Some(seg) if len.div_ceil(usize::from(seg)) > MAX_SEGMENTS => invalid(
                libc::EINVAL,
                format!(
                    "{len} bytes in segments of {seg} are {} datagrams, more than the {} one \
                     GSO send may carry: send smaller trains or larger segments",
                    len.div_ceil(usize::from(seg)),
                    MAX_SEGMENTS
                ),
            ),
            _ => None,
        }
    }

    pub(super) fn send_inner(
        &mut self,
        id: SockId,
        buf: TxBuf,
        token: u64,
        dest: Option<Dest>,
    ) -> Result<Ticket, Refused<TxBuf>> {
        let idx = id.idx;
        let Some(s) = self.sock_mut(id) else {
            return Err(Refused {
                buf,
                reason: Refusal::Closed,
            });
        };
        if let Some(reason) = s.refusal() {
            match reason {
                Refusal::Depth => s.stats.depth_refusals += 1,
                Refusal::SocketFull | Refusal::NoRoom => s.stats.full_refusals += 1,
                Refusal::Closed => {}
            }
            if reason.is_backpressure() {
                s.refused = true;
            }
            return Err(Refused { buf, reason });
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let s = self.sock_at(idx).expect("checked");
        let seq = s.seq;
        s.seq += 1;
        s.counters.ops += 1;
        self.in_flight_n += 1;
        let s = self.sock_at(idx).expect("checked");
        let len = buf.len();
        let (mut lent, mut more, chunk, mut parts, bad_slices) = split_slices(buf);
        let opts = dest.map(|d| d.opts());
        let meta = |path, parts| Meta {
            ticket,
            len,
            path,
            token,
            chunk,
            dest: opts,
            parts,
        };
        let bad = match &dest {
            _ if bad_slices.is_some() => bad_slices,
            Some(d) => Self::check_dest(s, d, len),
            None if s.unconnected => Some(SendError::Invalid {
                errno: libc::EDESTADDRREQ,
                reason: "the UDP socket has no peer: name one per send with send_to, or \
                         connect the socket"
                    .into(),
            }),
            None => None,
        };
        let vectored = !more.is_empty();
        let bad = bad.or_else(|| {
            // A vectored datagram is one request: one datagram or GSO train.
            (vectored && !s.stream && dest.is_none() && len > s.chunk.min(s.max_datagram))
                .then_some(SendError::MessageTooBig {
                    len,
                    max: s.chunk.min(s.max_datagram),
                })
        });
        if let Some(e) = bad {
            s.meta.insert(seq, meta(Path::Copy, parts));
            self.finish_parts(idx, seq, lent, more, 0, Some(e), ZcStatus::NotAttempted);
            return Ok(Ticket(ticket));
        }
        if let Some(errno) = s.broken {
            // The ring failed with requests of unknown outcome ahead of this one.
            s.meta.insert(seq, meta(Path::Copy, parts));
            self.finish_parts(
                idx,
                seq,
                lent,
                more,
                0,
                Some(SendError::Os { errno }),
                ZcStatus::NotAttempted,
            );
            return Ok(Ticket(ticket));
        }
        if len == 0 {
            // Nothing to lend: TCP needs no call, UDP sends an empty datagram.
            s.meta.insert(seq, meta(Path::Copy, parts));
            let mut error = None;
            if !s.stream {
                let out = match &opts {
                    Some(o) => copy::send_msg(&*s.fd, &[], o, s.v6, false),
                    None => copy::send_nb(&*s.fd, &[], 1, 0),
                };
                s.counters.syscalls += out.syscalls;
                s.stats.send_syscalls += out.syscalls;
                error = out
                    .error
                    .or(out.would_block.then_some(libc::EAGAIN))
                    .map(SendError::from_errno);
            }
            self.finish_parts(idx, seq, lent, more, 0, error, ZcStatus::NotAttempted);
            return Ok(Ticket(ticket));
        }
        if !s.stream && s.chunk == usize::MAX && len > s.max_datagram {
            let e = SendError::MessageTooBig {
                len,
                max: s.max_datagram,
            };
            s.meta.insert(seq, meta(Path::Copy, parts));
            self.finish_parts(idx, seq, lent, more, 0, Some(e), ZcStatus::NotAttempted);
            return Ok(Ticket(ticket));
        }
        let dry = self.pool_dry(&lent);
        let path = self.route(idx, seq, len, dry);
        let no_uring = self.no_uring.clone();
        let s = self.sock_at(idx).expect("checked");
        if vectored && !path.is_uring() {
            // Without io_uring the slices are gathered into one buffer (a copy) and that goes
            // by the socket's path; the slices come back with the completion.
            if !s.vec_noted {
                s.vec_noted = true;
                s.fallbacks.push(Fallback::new(
                    stats::Path::setting("vectored send as one request"),
                    stats::Path::setting("slices gathered into one buffer"),
                    format!(
                        "the socket sends by {path} ({}); a vectored send's slices are copied \
                         into one buffer first",
                        no_uring.as_deref().unwrap_or("not on the io_uring")
                    ),
                ));
            }
            let mut v = Vec::with_capacity(len);
            v.extend_from_slice(&lent);
            for b in &more {
                v.extend_from_slice(b);
            }
            let first = std::mem::replace(&mut lent, Lent::Vec(v));
            let p = parts.get_or_insert_with(Default::default);
            p.gathered_from.push(first);
            p.gathered_from.append(&mut more);
        }
        s.meta.insert(seq, meta(path, parts));
        match path {
            Path::Copy => self.copy_send(idx, seq, lent, opts),
            Path::MsgZc => {
                let s = self.sock_at(idx).expect("checked");
                let v6 = s.v6;
                let m = s.msg.as_mut().expect("msg-zc backend");
                m.send(seq, lent, opts.map(|o| (o, v6)));
                let stalled = m.stall().is_some();
                if stalled {
                    self.stall(idx);
                }
                self.collect_msg(idx);
                self.list_sys(idx);
            }
            Path::UringZc | Path::UringZcFixed | Path::UringCopy => {
                self.ring_stage(idx, seq, lent, more, len, path, opts);
                if self.uring.as_ref().is_some_and(|u| u.due(&self.cfg)) {
                    self.quiet(false);
                    let res = self.ring_submit();
                    if let Err(e) = res {
                        self.ring_failed(e);
                    }
                    self.unquiet();
                }
            }
        }
        Ok(Ticket(ticket))
    }

    /// The path of one send (`auto` decides per send).
    /// Whether `lent`'s pool is running dry with its buffers held by this ring's sends: fewer
    /// than an eighth of its buffers free and at least half of them in the ring (back to
    /// normal once a quarter is free). A zero-copy buffer comes back with its notification,
    /// which on TCP waits for the peer's ACK (a round trip, plus the peer's delayed ACK): a
    /// pool sized below connections × RTT × rate runs dry, and `auto` then sends by copy,
    /// whose buffer comes back as soon as the socket took the bytes.
    fn pool_dry(&mut self, lent: &Lent) -> bool {
        let Some((free, n)) = lent.pool_free() else {
            return false;
        };
        let held = self.in_flight_n * 2 >= n;
        self.pool_dry = if self.pool_dry {
            free * 4 < n
        } else {
            free * 8 < n && held
        };
        self.pool_dry
    }

    pub(super) fn route(&mut self, idx: u32, seq: u64, len: usize, dry: bool) -> Path {
        let Self {
            policy,
            socks,
            routes,
            ..
        } = self;
        let s = socks[idx as usize].as_mut().expect("live");
        if !s.is_auto() {
            return s.path;
        }
        let copy = s.copy_path();
        let by_size = s.cfg.auto_by_size;
        let Some(a) = s.auto.as_mut() else {
            return copy;
        };
        let Some(zc) = a.zc else {
            return copy;
        };
        let (watch, peer) = watch_of(routes, a.route, &mut a.watch);
        let d = match watch.decide() {
            Some(d) => d,
            // The socket asked for no choice by size (`SenderConfig::auto_by_size`).
            None if !by_size => Decision {
                choice: Choice::ZeroCopy,
                clock: false,
                probe: false,
            },
            None => {
                let d = policy.decide_size(len);
                if d.clock {
                    policy.clock(sys::thread_cpu_time().as_nanos() as u64);
                }
                d
            }
        };
        let in_copy = watch.in_copy();
        let interval = watch.interval();
        if d.probe {
            a.probe = Some(seq);
            s.stats.auto_reprobes += 1;
        }
        if in_copy != a.in_copy {
            // The route's verdict changed since this socket last sent (other sockets'
            // completions found it): the socket follows without probing.
            if in_copy {
                s.stats.auto_route_verdicts += 1;
            }
            follow_verdict(s, in_copy, copy, interval, None, peer);
        }
        match d.choice {
            Choice::Copy => {
                if !in_copy {
                    s.stats.auto_size_copies += 1;
                }
                copy
            }
            Choice::ZeroCopy if dry && zc.is_uring() => {
                s.stats.auto_pool_copies += 1;
                let noted = s
                    .auto
                    .as_mut()
                    .map_or(true, |a| std::mem::replace(&mut a.pool_noted, true));
                if !noted {
                    s.fallbacks.push(Fallback::new(
                        zc,
                        copy,
                        "the send pool ran dry (fewer than 1/8 of its buffers free) while the \
                         ring's zero-copy sends held them: a zero-copy buffer comes back when \
                         the peer ACKs its bytes (a round trip, and up to the peer's delayed \
                         ACK, 40 ms on Linux), a copy's as soon as the socket took them; \
                         sending by copy until a quarter of the pool is free (a larger pool: \
                         connections x round trip x rate per connection)",
                    ));
                }
                copy
            }
            Choice::ZeroCopy => zc,
        }
    }

    /// A send is done: its completion (and buffer) goes to the ready list.
    pub(in crate::tx) fn finish(
        &mut self,
        idx: u32,
        seq: u64,
        lent: Lent,
        bytes: usize,
        error: Option<SendError>,
        status: ZcStatus,
    ) {
        self.finish_parts(idx, seq, lent, Vec::new(), bytes, error, status);
    }

    /// [`SendRing::finish`] of a send whose slices after the first are `more`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::tx) fn finish_parts(
        &mut self,
        idx: u32,
        seq: u64,
        lent: Lent,
        more: Vec<Lent>,
        bytes: usize,
        error: Option<SendError>,
        status: ZcStatus,
    ) {
        self.in_flight_n -= 1;
        let s = self.socks[idx as usize].as_mut().expect("live");
        let meta = s.meta.remove(seq).unwrap_or(Meta {
            ticket: u64::MAX,
            len: lent.len(),
            path: s.path,
            token: 0,
            chunk: None,
            dest: None,
            parts: None,
        });
        s.counters.bytes += bytes as u64;
        s.stats.sends_by_path[meta.path.index()] += 1;
        let error = match error {
            // EMSGSIZE from the kernel (no sizes): say what was sent and the limit.
            Some(SendError::MessageTooBig { len: 0, max: 0 }) => Some(SendError::MessageTooBig {
                len: meta.len,
                max: s.max_datagram,
            }),
            e => e,
        };
        let sock = SockId { idx, gen: s.gen };
        let done = Completion {
            ticket: Ticket(meta.ticket),
            sock,
            token: meta.token,
            len: meta.len,
            bytes,
            path: meta.path,
            zerocopy: status,
            error,
        };
        if meta.path.is_zero_copy() {
            self.observe(idx, seq, status);
        }
        let s = self.socks[idx as usize].as_mut().expect("live");
        if s.discard {
            // Its owner has gone: the buffer goes back to its pool or receiver now.
            drop(lent);
            drop(more);
            drop(meta.parts);
            if let Some(p) = s.purge.as_mut() {
                p.held.push((done, None));
            }
            return;
        }
        let buf = match meta.parts {
            None => TxBuf::from_lent(lent, meta.chunk),
            Some(p) => {
                let Parts {
                    chunks,
                    gathered_from,
                } = *p;
                let lents: Vec<Lent> = if gathered_from.is_empty() {
                    std::iter::once(lent).chain(more).collect()
                } else {
                    // The gathered copy goes; the slices come back.
                    drop(lent);
                    gathered_from
                };
                TxBuf::Slices(
                    lents
                        .into_iter()
                        .zip(chunks)
                        .map(|(l, c)| TxBuf::from_lent(l, c))
                        .collect(),
                )
            }
        };
        if let Some(p) = self.sock_at(idx).and_then(|s| s.purge.as_mut()) {
            p.held.push((done, Some(buf)));
            return;
        }
        self.ready.push_back((done, buf));
    }

    /// `auto` learns from a zero-copy completion of one of its sockets (for the socket's
    /// route: every socket to the same peer follows at its next send).
    pub(super) fn observe(&mut self, idx: u32, seq: u64, status: ZcStatus) {
        let Self { socks, routes, .. } = self;
        let s = socks[idx as usize].as_mut().expect("live");
        let copy = s.copy_path();
        let Some(a) = s.auto.as_mut() else { return };
        let probe = a.probe == Some(seq);
        if probe {
            a.probe = None;
        }
        let (watch, peer) = watch_of(routes, a.route, &mut a.watch);
        match watch.observe(status, probe) {
            Some(Event::SwitchedToCopy { streak, interval }) => {
                s.stats.auto_switches_to_copy += 1;
                follow_verdict(s, true, copy, interval, Some(streak), peer);
            }
            Some(Event::SwitchedBack) => {
                s.stats.auto_switches_back += 1;
                follow_verdict(s, false, copy, 0, None, peer);
            }
            None => {}
        }
    }
}

/// Takes a buffer apart for sending: its first slice, the slices after it, the first's chunk
/// metadata (single buffers), the slices' metadata (vectored sends), and why a vectored send
/// cannot go (no slice, or more than one request carries).
#[allow(clippy::type_complexity)]
pub(super) fn split_slices(
    buf: TxBuf,
) -> (
    Lent,
    Vec<Lent>,
    Option<(crate::rx::ConnId, crate::rx::RxPath)>,
    Option<Box<Parts>>,
    Option<SendError>,
) {
    let TxBuf::Slices(v) = buf else {
        let (l, c) = buf.into_lent();
        return (l, Vec::new(), c, None, None);
    };
    // Nested slices are flattened (and come back flat).
    let mut flat = Vec::with_capacity(v.len());
    let mut stack: Vec<TxBuf> = v.into_iter().rev().collect();
    while let Some(b) = stack.pop() {
        match b {
            TxBuf::Slices(inner) => stack.extend(inner.into_iter().rev()),
            b => flat.push(b),
        }
    }
    let n = flat.len();
    let mut parts = Box::<Parts>::default();
    let mut lents = Vec::with_capacity(n);
    for b in flat {
        let (l, c) = b.into_lent();
        lents.push(l);
        parts.chunks.push(c);
    }
    let bad = match n {
        0 => Some(SendError::Invalid {
            errno: libc::EINVAL,
            reason: "a vectored send without slices".into(),
        }),
        n if n > MAX_SLICES => Some(SendError::Invalid {
            errno: libc::EINVAL,
            reason: format!(
                "a vectored send of {n} slices: at most {MAX_SLICES} go in one request \
                 (send the rest separately, or gather small ones)"
            ),
        }),
        _ => None,
    };
    let mut it = lents.into_iter();
    let first = it.next().unwrap_or(Lent::Vec(Vec::new()));
    (first, it.collect(), None, Some(parts), bad)
}

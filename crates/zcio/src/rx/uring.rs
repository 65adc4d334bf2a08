//! The ring backends: multishot `RECV` with a provided-buffer ring, and multishot `RECV_ZC`
//! over a zcrx queue. Both accept with a multishot `ACCEPT`.

use super::{
    AcceptBackoff, Backend, ConnId, RxChunk, RxConfig, RxCounters, RxError, RxEvent, RxPath, Slab,
    ZcrxTarget,
};
use crate::buf::bufring::{BufRing, BufRingConfig};
use crate::buf::refill::ZcrxArea;
use crate::ring::recv::{Completion, Cqe, Lease, RecvRing, MAX_TAG};
use crate::ring::RingConfig;
use crate::stats::Fallback;
use io_uring::cqueue;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::Duration;

const LISTENER: u64 = MAX_TAG;

struct RConn {
    fd: Rc<OwnedFd>,
    closing: bool,
    /// Paused by the application ([`super::Receiver::pause`]): not re-armed until resumed.
    paused: bool,
    /// A cancel asked for by `pause` whose end has not been seen yet.
    cancelling: bool,
}

pub(crate) struct RingRx<C: Cqe> {
    rr: RecvRing<C>,
    bufs: Option<Rc<BufRing>>,
    zarea: Option<Rc<ZcrxArea>>,
    zc: bool,
    /// Device-less zcrx: the kernel copies; refill needs `ZCRX_CTRL_FLUSH_RQ`.
    nodev: bool,
    bundle: bool,
    conns: Slab<RConn>,
    listener: Option<Rc<OwnedFd>>,
    /// Accepting paused after EMFILE and the like (the multishot accept is not re-armed).
    accept_backoff: AcceptBackoff,
    /// Connections whose receive ended with ENOBUFS, with the ring's recycle count then.
    waiting: Vec<(ConnId, u64)>,
    /// Connections whose receive ended in a harvest whose data the application has not seen
    /// yet (a bundle that took the ring's last buffers, or a pause's cancel after a resume):
    /// armed again when the next waiting poll starts, once the application could pause them
    /// (a zero-timeout poll arms and submits them before it returns).
    rearm: Vec<ConnId>,
    batch: usize,
    min_wait: Duration,
    /// The caller's requests queued for the next wait's enter that complete inside it
    /// (`Receiver::count_in_next_wait`), and the ring's enters when they were counted (an
    /// enter since then submitted them).
    counted: (usize, u64),
    defer: bool,
    hot_min: u16,
    dry_streak: u32,
    quiet: u32,
    urgent: bool,
    terminated: bool,
    enters_seen: u64,
    /// `recycled()` when the current harvest began.
    harvest_mark: u64,
    scratch: Vec<Completion>,
    desc: String,
}

fn ring_config(cfg: &RxConfig) -> RingConfig {
    RingConfig {
        entries: 256,
        cq_entries: Some((u32::from(cfg.buffers) * 2).max(4096)),
        defer_taskrun: cfg.defer_taskrun,
        ..RingConfig::default()
    }
}

fn note_flags<C: Cqe>(rr: &RecvRing<C>, fallbacks: &mut Vec<Fallback>) {
    for f in rr.ring().setup_flags() {
        if f.requested && !f.granted {
            fallbacks.push(Fallback::new(
                crate::stats::Path::setting(format!("ring with {}", f.name)),
                crate::stats::Path::setting(format!("ring without {}", f.name)),
                f.reason.clone().unwrap_or_default(),
            ));
        }
    }
}

impl RingRx<cqueue::Entry> {
    pub(crate) fn bufring(cfg: &RxConfig, fallbacks: &mut Vec<Fallback>) -> Result<Self, RxError> {
        let mut rr = RecvRing::<cqueue::Entry>::new(&ring_config(cfg))?;
        note_flags(&rr, fallbacks);
        if cfg.batch > 1 && !cfg.min_wait.is_zero() && !rr.ring().has_min_wait() {
            fallbacks.push(Fallback::new(
                crate::stats::Path::setting("batched waits (min-wait)"),
                crate::stats::Path::setting("return on the first completion"),
                "kernel lacks IORING_FEAT_MIN_TIMEOUT (Linux 6.12)",
            ));
        }
        let mut bundle = cfg.bundle.unwrap_or(true) && !cfg.incremental;
        if bundle && !rr.has_bundles() {
            fallbacks.push(Fallback::new(
                crate::stats::Path::setting("recv bundles"),
                crate::stats::Path::setting("one buffer per completion"),
                "kernel lacks IORING_FEAT_RECVSEND_BUNDLE (Linux 6.10)",
            ));
            bundle = false;
        }
        let mut bcfg = BufRingConfig {
            bgid: 0,
            entries: cfg.buffers,
            buf_size: cfg.buf_size,
            incremental: cfg.incremental,
            huge_pages: cfg.huge_pages,
            hot: if cfg.hot_bytes == 0 {
                0
            } else {
                (cfg.hot_bytes / cfg.buf_size.max(1) as usize).clamp(2, usize::from(u16::MAX))
                    as u16
            },
        };
        let bufs = match rr.register_bufs(&bcfg) {
            Ok(b) => b,
            Err(e) if bcfg.incremental && e.raw_os_error() == Some(libc::EINVAL) => {
                fallbacks.push(Fallback::new(
                    crate::stats::Path::setting("incremental buffer consumption"),
                    crate::stats::Path::setting("whole buffers"),
                    format!("IOU_PBUF_RING_INC refused ({e}); needs Linux 6.12"),
                ));
                bcfg.incremental = false;
                // Whole buffers: bundles again where the kernel has them (asked for by
                // default, left out only because they do not combine with incremental).
                bundle = cfg.bundle.unwrap_or(true) && rr.has_bundles();
                rr.register_bufs(&bcfg).map_err(RxError::BufRing)?
            }
            Err(e) => return Err(RxError::BufRing(e)),
        };
        if let Some(why) = bufs.fallback() {
            fallbacks.push(Fallback::new(
                crate::stats::Path::setting("kernel-allocated buffer ring"),
                crate::stats::Path::setting("buffer ring in user memory"),
                why,
            ));
        }
        let desc = format!(
            "bufring: multishot recv{}{}, {} x {} B buffers ({} in rotation, {} ring), batch {} / min-wait {:?}{}",
            if bundle { " + bundles" } else { "" },
            if bufs.incremental() {
                " + incremental consumption"
            } else {
                ""
            },
            bufs.entries(),
            bufs.buf_size(),
            bufs.hot(),
            if bufs.kernel_allocated() {
                "kernel-allocated"
            } else {
                "user-memory"
            },
            cfg.batch,
            cfg.min_wait,
            if rr.ring().has_flag("DEFER_TASKRUN") {
                ", DEFER_TASKRUN"
            } else {
                ", no DEFER_TASKRUN"
            },
        );
        Ok(Self::with(rr, Some(bufs), false, bundle, cfg, desc))
    }
}

impl RingRx<cqueue::Entry32> {
    pub(crate) fn zcrx(cfg: &RxConfig, t: &ZcrxTarget) -> Result<Self, RxError> {
        let mut rr = RecvRing::<cqueue::Entry32>::new(&ring_config(cfg))?;
        for need in ["SINGLE_ISSUER", "DEFER_TASKRUN"] {
            if !rr.ring().has_flag(need) {
                return Err(RxError::Io(io::Error::other(format!(
                    "zcrx needs a ring with {need}, which this kernel refused"
                ))));
            }
        }
        let bind = t.bind();
        let area = rr.register_zcrx(bind, t.area_len, t.rq_entries, t.huge_pages)?;
        let desc = if t.deviceless {
            format!(
                "zcrx device-less (ZCRX_REG_NODEV): RECV_ZC into a {} B area, {} refill \
                 entries; the kernel copies every byte (COPIED 1.0)",
                t.area_len,
                area.refill().entries()
            )
        } else {
            format!(
                "zcrx: {bind}, {} B area, {} refill entries",
                t.area_len,
                area.refill().entries()
            )
        };
        let mut me = Self::with(rr, None, true, false, cfg, desc);
        me.zarea = Some(area);
        me.nodev = t.deviceless;
        Ok(me)
    }
}

impl<C: Cqe> RingRx<C> {
    fn with(
        rr: RecvRing<C>,
        bufs: Option<Rc<BufRing>>,
        zc: bool,
        bundle: bool,
        cfg: &RxConfig,
        desc: String,
    ) -> Self {
        let defer = rr.ring().has_flag("DEFER_TASKRUN");
        let hot_min = match &bufs {
            Some(b) if b.hot() < b.entries() => b.hot(),
            _ => 0,
        };
        Self {
            rr,
            bufs,
            zarea: None,
            zc,
            nodev: false,
            bundle,
            conns: Slab::new(),
            listener: None,
            accept_backoff: AcceptBackoff::default(),
            waiting: Vec::new(),
            rearm: Vec::new(),
            batch: cfg.batch.max(1),
            min_wait: cfg.min_wait,
            counted: (0, 0),
            defer,
            hot_min,
            dry_streak: 0,
            quiet: 0,
            urgent: false,
            terminated: false,
            enters_seen: 0,
            harvest_mark: 0,
            scratch: Vec::new(),
            desc,
        }
    }

    /// The ring, for a send ring to share.
    pub(crate) fn shared_ring(&self) -> Rc<crate::ring::SharedRing<C>> {
        self.rr.shared()
    }

    fn arm(&mut self, id: ConnId) -> io::Result<()> {
        let Some(conn) = self.conns.get_mut(id) else {
            return Ok(());
        };
        let fd = Rc::clone(&conn.fd);
        if self.zc {
            self.rr.recv_zc(fd, id.tag())
        } else {
            self.rr.recv_multi(fd, id.tag(), self.bundle)
        }
    }

    /// Buffers (or zcrx ranges) returned so far, and lent now.
    fn recycled(&self) -> (u64, u64) {
        match (&self.bufs, &self.zarea) {
            (Some(b), _) => (b.recycled(), u64::from(b.lent())),
            (None, Some(z)) => (z.returned(), z.lent()),
            (None, None) => (u64::MAX, 0),
        }
    }

    /// Arms the receives that ended in an earlier harvest ([`RingRx::rearm`]) of connections
    /// still open and not paused.
    fn rearm_ended(&mut self, c: &mut RxCounters) -> io::Result<()> {
        for id in std::mem::take(&mut self.rearm) {
            let Some(conn) = self.conns.get(id) else {
                continue;
            };
            if conn.paused || conn.closing || self.rr.is_armed(id.tag()) {
                continue;
            }
            self.arm(id)?;
            c.rearms += 1;
            // The socket holds data (the receive ended with the ring dry, or was resumed).
            self.urgent = true;
        }
        Ok(())
    }

    /// Re-arms connections that ran out of buffers once some came back.
    fn rearm_waiting(&mut self, c: &mut RxCounters) -> io::Result<()> {
        self.rearm_ended(c)?;
        if self.waiting.is_empty() {
            return Ok(());
        }
        let (recycled, lent) = self.recycled();
        let mut i = 0;
        while i < self.waiting.len() {
            let (id, at) = self.waiting[i];
            if recycled > at || lent == 0 {
                self.waiting.swap_remove(i);
                self.arm(id)?;
                c.rearms += 1;
            } else {
                i += 1;
            }
        }
        if !self.waiting.is_empty() {
            c.backpressure_waits += 1;
        }
        Ok(())
    }

    fn handle(
        &mut self,
        comp: Completion,
        c: &mut RxCounters,
        f: &mut dyn FnMut(RxEvent),
    ) -> io::Result<usize> {
        match comp {
            Completion::Data { tag, lease } => {
                let id = ConnId::from_tag(tag);
                match self.conns.get_mut(id) {
                    Some(conn) if !conn.closing => {
                        let path = match &lease {
                            Lease::Buf(_) => RxPath::BufRing,
                            Lease::Zcrx(_) if self.nodev => RxPath::ZcrxNodev,
                            Lease::Zcrx(_) => RxPath::Zcrx,
                        };
                        c.bytes += lease.len() as u64;
                        c.chunks += 1;
                        match path {
                            RxPath::Zcrx => c.zerocopy_bytes += lease.len() as u64,
                            RxPath::ZcrxNodev => c.copy_fallback_bytes += lease.len() as u64,
                            _ => {}
                        }
                        f(RxEvent::Data(RxChunk {
                            conn: id,
                            path,
                            data: lease.into(),
                        }));
                        Ok(1)
                    }
                    // Closed by the application: the bytes go straight back.
                    _ => Ok(0),
                }
            }
            Completion::Accepted { fd, .. } => {
                self.accept_backoff.reset();
                let id = self.conns.insert(RConn {
                    fd: Rc::new(fd),
                    closing: false,
                    paused: false,
                    cancelling: false,
                });
                self.arm(id)?;
                c.accepted += 1;
                f(RxEvent::Accepted(id));
                Ok(1)
            }
            Completion::Error { tag, errno } => {
                tracing::debug!(tag, errno, "non-final error completion");
                if tag == LISTENER && self.accept_backoff.on_error(errno, c) {
                    // Out of descriptors while the accept stays armed: stop it for the pause
                    // (its ECANCELED end is not re-armed; `poll` re-arms when the pause ends).
                    self.rr.cancel(LISTENER)?;
                }
                Ok(0)
            }
            Completion::Ended { tag, res } if tag == LISTENER => {
                if res != -libc::ECANCELED {
                    if let Some(l) = &self.listener {
                        // After EMFILE and the like the accept is re-armed when the pause
                        // ends (`poll`), not at once: the next accept would fail the same way.
                        if res >= 0 || !self.accept_backoff.on_error(-res, c) {
                            self.rr.accept_multi(Rc::clone(l), LISTENER)?;
                            c.rearms += 1;
                        }
                    }
                }
                Ok(0)
            }
            Completion::Ended { tag, res } => {
                let id = ConnId::from_tag(tag);
                let Some(conn) = self.conns.get_mut(id) else {
                    return Ok(0);
                };
                if conn.closing {
                    self.conns.remove(id);
                    return Ok(0);
                }
                let paused = conn.paused;
                if std::mem::take(&mut conn.cancelling) && res == -libc::ECANCELED {
                    // Ended by `pause`; resumed meanwhile: arm again, after the application
                    // has seen the data that came before (see `RingRx::rearm`).
                    if !paused {
                        self.rearm.push(id);
                    }
                    return Ok(0);
                }
                if paused && (res > 0 || res == -libc::ENOBUFS || (self.zc && res == -libc::ENOMEM))
                {
                    // Ended on its own while paused: `resume` arms it (the data waits in the
                    // socket).
                    return Ok(0);
                }
                if res > 0 {
                    // Terminated with data: a bundle that took every buffer left in the ring
                    // (the kernel ends the multishot then, even when it used fewer than it
                    // took), or a full CQ. The data came just before; arm again, the socket
                    // keeps the rest. It counts as the ring running dry.
                    //
                    // Not armed here: the application has not seen this harvest's data, and
                    // may pause the connection for it. An arm queued now would go in with the
                    // next enter, ahead of the pause's cancel, and its first receive would
                    // take every buffer the application gave back meanwhile: a second burst
                    // after the pause (a proxy pair held 92 chunks against a 16-chunk limit
                    // and a 64-buffer ring that way).
                    self.terminated = true;
                    self.rearm.push(id);
                    Ok(0)
                } else if res == -libc::ENOBUFS || (self.zc && res == -libc::ENOMEM) {
                    // Out of buffers (a zcrx area answers ENOMEM when every page is lent or
                    // not yet refilled): wait for one to come back, then re-arm; the data
                    // waits in the socket.
                    c.enobufs += 1;
                    // Not the count now: chunks of this same harvest may already have come back
                    // (and been put in the ring), and if the application holds the rest, no
                    // later return would ever wake this connection (seen on 6.1, where a
                    // multishot recv ends with ENOBUFS instead of bundling).
                    let at = self.harvest_mark;
                    self.waiting.push((id, at));
                    if let Some(b) = &self.bufs {
                        // Free buffers (if any) go in now; the rest come as chunks drop.
                        b.top_up();
                    }
                    Ok(0)
                } else {
                    self.conns.remove(id);
                    let err = (res < 0).then(|| io::Error::from_raw_os_error(-res));
                    f(RxEvent::Closed(id, err));
                    Ok(1)
                }
            }
        }
    }

    fn drain_ready(&mut self, c: &mut RxCounters, f: &mut dyn FnMut(RxEvent)) -> io::Result<usize> {
        let mut scratch = std::mem::take(&mut self.scratch);
        // Buffers returned from here on (chunks the application drops while it handles these
        // completions) came back after the kernel found the ring or area empty.
        self.harvest_mark = self.recycled().0;
        let res = self.rr.harvest(|comp| scratch.push(comp));
        let mut events = 0;
        let mut out = Ok(());
        for comp in scratch.drain(..) {
            match self.handle(comp, c, f) {
                Ok(n) => events += n,
                Err(e) => {
                    out = Err(e);
                }
            }
        }
        self.scratch = scratch;
        res?;
        out?;
        Ok(events)
    }

    /// Keeps the number of buffers in rotation near what one wait consumes: grows (doubles)
    /// when the ring ran dry in two waits in a row (sustained demand, e.g. a receiver that
    /// shares its core with the sender finds large backlogs), shrinks back towards the
    /// configured size after 64 waits without running dry. Isolated bursts (the receiver was
    /// preempted) only cost a re-arm.
    fn size_rotation(&mut self, dry: bool) {
        let Some(b) = &self.bufs else { return };
        if self.hot_min == 0 {
            return;
        }
        if dry {
            self.quiet = 0;
            self.dry_streak += 1;
            if self.dry_streak >= 2 {
                self.dry_streak = 0;
                b.grow();
            }
        } else {
            self.dry_streak = 0;
            self.quiet += 1;
            if self.quiet >= 64 {
                self.quiet = 0;
                b.shrink(self.hot_min);
            }
        }
    }

    fn account(&mut self, c: &mut RxCounters) {
        let e = self.rr.enters();
        c.ring_enters += e - self.enters_seen;
        c.syscalls += e - self.enters_seen;
        self.enters_seen = e;
    }
}

impl<C: Cqe> Backend for RingRx<C> {
    fn notify_fd(&mut self) -> io::Result<std::os::fd::BorrowedFd<'_>> {
        self.rr.notify_fd()
    }
    fn clear_notify(&mut self) -> bool {
        self.rr.clear_notify()
    }
    fn has_work(&self) -> bool {
        self.rr.has_work()
    }
    fn clear_is_syscall(&self) -> bool {
        true
    }
    fn keep_notify(&mut self) {
        self.rr.keep_notify()
    }
    fn path(&self) -> RxPath {
        if self.nodev {
            RxPath::ZcrxNodev
        } else if self.zc {
            RxPath::Zcrx
        } else {
            RxPath::BufRing
        }
    }
    fn describe(&self) -> String {
        self.desc.clone()
    }
    fn add(&mut self, stream: TcpStream, c: &mut RxCounters) -> io::Result<ConnId> {
        let id = self.conns.insert(RConn {
            fd: Rc::new(OwnedFd::from(stream)),
            closing: false,
            paused: false,
            cancelling: false,
        });
        if let Err(e) = self.arm(id) {
            self.conns.remove(id);
            return Err(e);
        }
        self.rr.submit()?;
        self.account(c);
        Ok(id)
    }
    fn listen(&mut self, l: TcpListener) -> io::Result<()> {
        let fd = Rc::new(OwnedFd::from(l));
        self.rr.accept_multi(Rc::clone(&fd), LISTENER)?;
        self.listener = Some(fd);
        self.rr.submit()
    }
    fn close(&mut self, conn: ConnId, c: &mut RxCounters) {
        self.waiting.retain(|(id, _)| *id != conn);
        self.rearm.retain(|id| *id != conn);
        if self.rr.is_armed(conn.tag()) {
            if let Some(cn) = self.conns.get_mut(conn) {
                cn.closing = true;
            }
            let _ = self.rr.cancel(conn.tag());
            let _ = self.rr.submit();
            self.account(c);
        } else {
            self.conns.remove(conn);
        }
    }
    fn open(&self) -> usize {
        self.conns.len()
    }
    fn socket(&self, conn: ConnId) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.conns.get(conn).map(|c| c.fd.as_fd())
    }
    fn pause(&mut self, conn: ConnId, c: &mut RxCounters) {
        let armed = self.rr.is_armed(conn.tag());
        let Some(cn) = self.conns.get_mut(conn) else {
            return;
        };
        if cn.paused || cn.closing {
            return;
        }
        cn.paused = true;
        self.waiting.retain(|(id, _)| *id != conn);
        self.rearm.retain(|id| *id != conn);
        if armed && !cn.cancelling {
            // The multishot ends with ECANCELED (data it took before comes first); the
            // cancel rides the next enter.
            cn.cancelling = true;
            let _ = self.rr.cancel(conn.tag());
            if !self.defer {
                // Without DEFER_TASKRUN the kernel receives whenever its task work runs (any
                // syscall's return): a cancel left in the queue until the next wait would let
                // it fill the buffers the application gives back meanwhile.
                let _ = self.rr.submit();
                self.account(c);
            }
        }
    }
    fn starved(&self) -> usize {
        self.waiting.len()
    }
    fn lent(&self) -> (u64, u64) {
        // Provided buffers only: a zcrx area's ranges are not counted here.
        match &self.bufs {
            Some(b) => (u64::from(b.lent()), u64::from(b.entries())),
            None => (0, 0),
        }
    }
    fn set_wait(&mut self, batch: usize, min_wait: Duration) -> bool {
        let ok = batch <= 1 || min_wait.is_zero() || self.rr.ring().has_min_wait();
        self.batch = batch.max(1);
        self.min_wait = min_wait;
        ok
    }
    fn count_in_next_wait(&mut self, n: usize) {
        // What is queued now: a count from an earlier turn whose poll did not wait is of the
        // same requests (those still queued) and is replaced, not added to.
        self.counted = (n, self.rr.enters());
    }
    fn resume(&mut self, conn: ConnId, c: &mut RxCounters) -> io::Result<()> {
        let armed = self.rr.is_armed(conn.tag());
        let Some(cn) = self.conns.get_mut(conn) else {
            return Ok(());
        };
        if !cn.paused || cn.closing {
            return Ok(());
        }
        cn.paused = false;
        if cn.cancelling || armed {
            // The pause's cancel has not ended the receive yet: its end re-arms.
            return Ok(());
        }
        self.arm(conn)?;
        c.rearms += 1;
        self.urgent = true;
        Ok(())
    }

    fn poll(
        &mut self,
        timeout: Duration,
        c: &mut RxCounters,
        f: &mut dyn FnMut(RxEvent),
    ) -> io::Result<usize> {
        // Returns that found the refill ring full go out now that the kernel had time; a
        // device-less zcrx has the kernel consume the ring now. Before re-arming, so that a
        // receive waiting for area pages finds them.
        let flushes = self.rr.flush_refill()?;
        c.refill_flushes += flushes;
        c.syscalls += flushes;
        self.rearm_waiting(c)?;
        if self.accept_backoff.due() {
            if let Some(l) = &self.listener {
                self.rr.accept_multi(Rc::clone(l), LISTENER)?;
                c.rearms += 1;
                self.urgent = true;
            }
        }
        let timeout = self.accept_backoff.cap(timeout);
        let mut n = self.drain_ready(c, f)?;
        if n == 0 {
            // The caller's requests that this enter submits and that complete inside it (sends
            // to sockets with room) are not what a first-completion wait waits for: it waits
            // for one completion beyond them. Not those an enter since then submitted.
            let (counted, at) = std::mem::take(&mut self.counted);
            let counted = if at == self.rr.enters() {
                counted.min(self.rr.pending())
            } else {
                0
            };
            if self.urgent || self.batch <= 1 {
                // A first-completion wait, or data is known to be waiting (the ring ran dry
                // or a receive was just re-armed): not held back for the min-wait.
                self.rr.wait_for(1 + counted, timeout)?;
            } else {
                self.rr.wait(self.batch, self.min_wait, timeout)?;
            }
            n = self.drain_ready(c, f)?;
            let dry = self.bufs.as_ref().is_some_and(|b| b.take_ran_dry())
                | std::mem::take(&mut self.terminated);
            if dry {
                c.ring_dry += 1;
            }
            self.size_rotation(dry);
            self.urgent = dry || self.rr.pending() > 0;
        } else if !self.defer && self.rr.pending() > 0 {
            // Without DEFER_TASKRUN completions can appear without an enter; submit re-arms
            // now so no connection waits behind busy ones. With it, they go in with the next
            // wait's enter (nothing could run before it anyway).
            self.rr.submit()?;
        }
        if timeout.is_zero() {
            // The caller may wait on the readiness descriptor next, which fires for none of
            // these: arm them now. Their first receive goes in below, while this harvest's
            // chunks are still lent, so it takes only buffers that were free before it.
            self.rearm_ended(c)?;
        }
        if timeout.is_zero() && self.rr.pending() > 0 {
            // A harvest that does not wait (`on_ready`, an event loop's look) may be the last
            // call before the caller waits on the readiness descriptor, which a receive still
            // queued here would never make readable: a connection re-armed by this harvest
            // (its multishot ended when a bundle took the ring's last buffers, or buffers came
            // back for a starved one) would receive nothing again. Submit it now.
            self.rr.submit()?;
        }
        self.account(c);
        Ok(n)
    }
}

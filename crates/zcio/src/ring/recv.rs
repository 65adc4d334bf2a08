//! Safe multishot receive and accept on a ring: [`RecvRing`] owns the ring, the provided
//! buffer ring and the zcrx area it registered, and the descriptors of every armed request,
//! so no memory or descriptor the kernel uses can go away before the request's final
//! completion. Completions come out decoded: received bytes as [`Lease`]s (borrowed from the
//! ring's buffers, returned when dropped), accepted sockets as `OwnedFd`s.
//!
//! Dropping a `RecvRing` cancels every armed request and waits for their final completions
//! before the ring and the memory are released.

use super::key::{self, Key, Op};
use super::zcrx::{flush_refill, refill_region_len, register_ifq, IfqError, ZcrxBind};
use super::{Ring, RingConfig, RingError, SharedRing};
use crate::buf::bufring::{BufLease, BufRing, BufRingConfig};
use crate::buf::frames::{FrameMemory, LentFrame};
use crate::buf::refill::{RefillRing, ZcrxArea, ZcrxLease};
use crate::buf::Region;
use crate::sys::IORING_CQE_F_MORE;
use io_uring::{cqueue, opcode, types};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// A completion entry type this module can decode: 16-byte CQEs carry no zcrx payload,
/// 32-byte ones carry `io_uring_zcrx_cqe` in their second half.
pub trait Cqe: cqueue::EntryMarker + 'static {
    /// `(user_data, res, flags, zcrx offset)`.
    fn parts(&self) -> (u64, i32, u32, Option<u64>);
}
impl Cqe for cqueue::Entry {
    fn parts(&self) -> (u64, i32, u32, Option<u64>) {
        (self.user_data(), self.result(), self.flags(), None)
    }
}
impl Cqe for cqueue::Entry32 {
    fn parts(&self) -> (u64, i32, u32, Option<u64>) {
        (
            self.user_data(),
            self.result(),
            self.flags(),
            Some(self.big_cqe()[0]),
        )
    }
}

/// Received bytes lent by the kernel: a provided buffer (or part of one) or a zcrx area range.
#[derive(Debug)]
pub enum Lease {
    /// From the provided-buffer ring (the kernel copied into it).
    Buf(BufLease),
    /// From the zcrx area (the NIC wrote it; no copy).
    Zcrx(ZcrxLease),
}

impl std::ops::Deref for Lease {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Lease::Buf(b) => b,
            Lease::Zcrx(z) => z,
        }
    }
}

/// A decoded completion.
#[derive(Debug)]
pub enum Completion {
    /// Bytes for the request `tag`, in stream order.
    Data {
        /// The caller's tag.
        tag: u64,
        /// The bytes.
        lease: Lease,
    },
    /// A connection accepted by the multishot accept `tag`.
    Accepted {
        /// The caller's tag.
        tag: u64,
        /// The new socket.
        fd: OwnedFd,
    },
    /// An error that did not end the request (`res` < 0 with `F_MORE`).
    Error {
        /// The caller's tag.
        tag: u64,
        /// The errno.
        errno: i32,
    },
    /// The request is no longer armed (its CQE lacked `F_MORE`). `res` is that CQE's result:
    /// bytes (delivered as `Data` just before), 0 for end of stream, or `-errno` (`-ENOBUFS`
    /// when the buffer ring ran dry, `-ECANCELED` after [`RecvRing::cancel`]).
    Ended {
        /// The caller's tag.
        tag: u64,
        /// The final result.
        res: i32,
    },
}

/// Largest tag callers may use.
pub const MAX_TAG: u64 = key::MAX_TAG;

/// A registered zcrx interface queue.
#[derive(Debug)]
pub struct ZcrxQueue {
    /// The area and its refill ring.
    pub area: Rc<ZcrxArea>,
    /// `zcrx_id` for `RECV_ZC`.
    pub id: u32,
    /// Registered without a device (`ZCRX_REG_NODEV`): the kernel copies, and the refill ring
    /// is consumed only by [`RecvRing::flush_refill`].
    pub nodev: bool,
}

/// A ring for multishot receives and accepts; see the module docs.
pub struct RecvRing<C: Cqe = cqueue::Entry> {
    // Field order is drop order: the ring is closed (unless a send ring shares it; see Drop)
    // before the memory it used is released.
    ring: Rc<SharedRing<C>>,
    bufs: Option<Rc<BufRing>>,
    zcrx: Option<ZcrxQueue>,
    armed: HashMap<Key, Rc<OwnedFd>>,
    submitted_sqes: u64,
}

impl<C: Cqe> std::fmt::Debug for RecvRing<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvRing")
            .field("bufs", &self.bufs)
            .field("armed", &self.armed.len())
            .finish()
    }
}

impl<C: Cqe> RecvRing<C> {
    /// Creates the ring.
    pub fn new(cfg: &RingConfig) -> Result<Self, RingError> {
        Ok(Self {
            ring: SharedRing::new(Ring::new(cfg)?),
            bufs: None,
            zcrx: None,
            armed: HashMap::new(),
            submitted_sqes: 0,
        })
    }

    /// Whether the kernel has receive bundles (`IORING_FEAT_RECVSEND_BUNDLE`, 6.10).
    pub fn has_bundles(&self) -> bool {
        self.ring.get().raw().params().is_feature_recvsend_bundle()
    }

    /// The ring (flags, counters), for one call.
    pub fn ring(&self) -> std::cell::RefMut<'_, Ring<C>> {
        self.ring.get()
    }

    /// The ring, shared: a send ring on this receiver's ring (one ring per thread).
    pub fn shared(&self) -> Rc<SharedRing<C>> {
        Rc::clone(&self.ring)
    }

    /// Registers the provided-buffer ring receives select from. One per `RecvRing`.
    pub fn register_bufs(&mut self, cfg: &BufRingConfig) -> io::Result<Rc<BufRing>> {
        if self.bufs.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "buffer ring already registered",
            ));
        }
        let ring = self.ring.get();
        let sub = ring.raw().submitter();
        let fd = ring.raw().as_raw_fd();
        let br = BufRing::register(fd, cfg, |addr, entries, bgid, flags| {
            // SAFETY: `addr` is 0 (kernel-allocated) or a region owned by the BufRing, which
            // `self` keeps until the ring is closed or the group unregistered (see Drop).
            unsafe { sub.register_buf_ring_with_flags(addr, entries, bgid, flags) }
        })?;
        drop(ring);
        let br = Rc::new(br);
        self.bufs = Some(Rc::clone(&br));
        Ok(br)
    }

    /// Arms a multishot receive with buffer selection on `fd` (bundles if `bundle`): every
    /// chunk of data becomes [`Completion::Data`] until [`Completion::Ended`].
    pub fn recv_multi(&mut self, fd: Rc<OwnedFd>, tag: u64, bundle: bool) -> io::Result<()> {
        let bgid = self
            .bufs
            .as_ref()
            .ok_or_else(|| io::Error::other("no buffer ring registered"))?
            .bgid();
        let raw = types::Fd(fd.as_raw_fd());
        let sqe = if bundle {
            opcode::RecvMultiBundle::new(raw, bgid).build()
        } else {
            opcode::RecvMulti::new(raw, bgid).build()
        };
        self.arm(sqe, Op::Recv, tag, fd)
    }

    /// Arms a multishot accept on the listening socket `fd`.
    pub fn accept_multi(&mut self, fd: Rc<OwnedFd>, tag: u64) -> io::Result<()> {
        let sqe = opcode::AcceptMulti::new(types::Fd(fd.as_raw_fd()))
            .flags(libc::SOCK_CLOEXEC)
            .build();
        self.arm(sqe, Op::Accept, tag, fd)
    }

    fn arm(
        &mut self,
        sqe: io_uring::squeue::Entry,
        op: Op,
        tag: u64,
        fd: Rc<OwnedFd>,
    ) -> io::Result<()> {
        if tag > MAX_TAG {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "tag too large"));
        }
        let ud = Key::tagged(op, tag);
        if self.armed.contains_key(&ud) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a request with this tag is armed",
            ));
        }
        // SAFETY: the entry references only the descriptor, kept open in `armed` until the
        // final completion, and the registered buffer ring / zcrx area, which `self` owns and
        // releases only after every armed request has ended (Drop).
        unsafe { self.ring.get().push(&sqe.user_data(ud.raw())) }?;
        self.armed.insert(ud, fd);
        self.submitted_sqes += 1;
        Ok(())
    }

    /// Asks the kernel to end the receive (or zcrx receive, or accept) `tag`; its
    /// [`Completion::Ended`] follows.
    pub fn cancel(&mut self, tag: u64) -> io::Result<()> {
        for op in [Op::Recv, Op::RecvZc, Op::Accept] {
            let ud = Key::tagged(op, tag);
            if self.armed.contains_key(&ud) {
                let sqe =
                    opcode::AsyncCancel2::new(types::CancelBuilder::user_data(ud.raw()).all())
                        .build()
                        .user_data(Key::cancel().raw());
                // SAFETY: a cancel references no memory.
                unsafe { self.ring.get().push(&sqe) }?;
            }
        }
        Ok(())
    }

    /// Arms a multishot `RECV_ZC` on `fd` (a TCP socket whose flow is steered to the
    /// registered queue).
    pub fn recv_zc(&mut self, fd: Rc<OwnedFd>, tag: u64) -> io::Result<()> {
        let id = self
            .zcrx
            .as_ref()
            .ok_or_else(|| io::Error::other("no zcrx queue registered"))?
            .id;
        let sqe = opcode::RecvZc::new(types::Fd(fd.as_raw_fd()), 0)
            .ifq(id)
            .build();
        self.arm(sqe, Op::RecvZc, tag, fd)
    }

    /// Whether `tag` has an armed receive.
    pub fn is_armed(&self, tag: u64) -> bool {
        [Op::Recv, Op::RecvZc]
            .into_iter()
            .any(|op| self.armed.contains_key(&Key::tagged(op, tag)))
    }

    /// Entries queued but not yet submitted.
    pub fn pending(&mut self) -> usize {
        self.ring.get().pending()
    }

    /// Requests armed now.
    pub fn armed(&self) -> usize {
        self.armed.len()
    }

    /// Submits queued entries (no syscall when there are none).
    pub fn submit(&mut self) -> io::Result<()> {
        self.ring.get().submit().map(drop)
    }

    /// Submits and waits for completions: at least one within `timeout`, up to `want` within
    /// `min_wait` (see [`Ring::submit_and_wait_batch`]).
    /// A signal that cuts the wait short is a wake-up (`Ok`): the caller harvests what is
    /// there and waits again.
    pub fn wait(&mut self, want: usize, min_wait: Duration, timeout: Duration) -> io::Result<()> {
        let r = self
            .ring
            .get()
            .submit_and_wait_batch(want, min_wait, timeout);
        interrupted_is_a_wake(r)
    }

    /// Submits and waits up to `timeout` for `want` completions, all of them (no min-wait):
    /// for a caller that knows how many of them the requests it submits post inside the
    /// enter. A signal that cuts the wait short is a wake-up (`Ok`), as in
    /// [`RecvRing::wait`].
    pub fn wait_for(&mut self, want: usize, timeout: Duration) -> io::Result<()> {
        let r = self.ring.get().submit_and_wait(want.max(1), Some(timeout));
        interrupted_is_a_wake(r)
    }

    /// The ring's readiness eventfd (see [`SharedRing::notify_fd`]).
    pub fn notify_fd(&self) -> io::Result<std::os::fd::BorrowedFd<'_>> {
        self.ring.notify_fd()
    }

    /// Resets the eventfd and says whether work came in meanwhile (see
    /// [`SharedRing::has_work`]).
    pub fn clear_notify(&self) -> bool {
        self.ring.clear_notify();
        self.ring.has_work()
    }

    /// Whether work came in (see [`SharedRing::has_work`]), the eventfd left as it is.
    pub fn has_work(&self) -> bool {
        self.ring.has_work()
    }

    /// Makes the eventfd readable: work is left that a cleared eventfd would not announce
    /// again (the kernel signals task work only when its list goes from empty to non-empty).
    pub fn keep_notify(&self) {
        self.ring.signal();
    }

    /// `io_uring_enter` calls made.
    pub fn enters(&self) -> u64 {
        self.ring.get().enters()
    }

    /// Completions ready without a syscall.
    pub fn ready(&mut self) -> usize {
        self.ring.ready()
    }

    /// Decodes every ready completion into `f`. Returns how many CQEs were consumed.
    pub fn harvest(&mut self, mut f: impl FnMut(Completion)) -> io::Result<usize> {
        let bufs = &self.bufs;
        let zcrx = &self.zcrx;
        let armed = &mut self.armed;
        let mut err: Option<io::Error> = None;
        let n = self.ring.harvest_others(|cqe| {
            let (ud, res, flags, big) = cqe.parts();
            let ud = Key::from_raw(ud);
            let (op, tag) = (ud.op(), ud.tag());
            let more = flags & IORING_CQE_F_MORE != 0;
            match op {
                Some(Op::Recv) if res > 0 => {
                    if let Some(b) = bufs {
                        // SAFETY: `res`/`flags` are this CQE's, harvested once, for a request
                        // that selected from this ring's only buffer group.
                        let r = unsafe {
                            b.lease_from_cqe(res, flags, |l| {
                                f(Completion::Data {
                                    tag,
                                    lease: Lease::Buf(l),
                                })
                            })
                        };
                        if let Err(e) = r {
                            err.get_or_insert(e);
                        }
                    }
                }
                Some(Op::RecvZc) if res > 0 => match (zcrx, big) {
                    (Some(z), Some(off)) => {
                        // SAFETY: this CQE32's zcrx payload, harvested once, for a RECV_ZC on
                        // the registered queue.
                        match unsafe { z.area.lease_from_cqe(res, off) } {
                            Ok(l) => f(Completion::Data {
                                tag,
                                lease: Lease::Zcrx(l),
                            }),
                            Err(e) => {
                                err.get_or_insert(e);
                            }
                        }
                    }
                    _ => {
                        err.get_or_insert(io::Error::other("RECV_ZC completion without zcrx"));
                    }
                },
                Some(Op::Accept) if res >= 0 => {
                    // SAFETY: a successful accept CQE's result is a new descriptor we own.
                    let fd = unsafe { OwnedFd::from_raw_fd(res) };
                    f(Completion::Accepted { tag, fd });
                }
                Some(Op::Cancel) => return,
                _ => {
                    if res < 0 && more {
                        f(Completion::Error { tag, errno: -res });
                    }
                }
            }
            if !more {
                armed.remove(&ud);
                f(Completion::Ended { tag, res });
            }
        })?;
        match err {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }

    /// Publishes queued returns and, for a device-less zcrx whose refill ring holds entries
    /// the kernel has not consumed, asks the kernel to consume them (`ZCRX_CTRL_FLUSH_RQ`, one
    /// `io_uring_register` call; a NIC's page pool consumes the ring by itself). Returns
    /// how many such calls were made.
    pub fn flush_refill(&mut self) -> io::Result<u64> {
        let Some(z) = &self.zcrx else {
            return Ok(0);
        };
        let rq = z.area.refill();
        rq.flush();
        let mut calls = 0;
        // Returns that found the ring full fit once the kernel has consumed it: a few rounds
        // drain any backlog (each round frees the whole ring).
        while z.nodev && rq.tail() != rq.head() && calls < 8 {
            flush_refill(&self.ring.get(), z.id)?;
            calls += 1;
            rq.flush();
        }
        Ok(calls)
    }

    fn drain(&mut self) {
        if self.armed.is_empty() {
            return;
        }
        let shared = Rc::strong_count(&self.ring) > 1;
        let cancels: Vec<io_uring::squeue::Entry> = if shared {
            // A send ring uses the ring too: cancel only our own requests.
            self.armed
                .keys()
                .map(|k| {
                    opcode::AsyncCancel2::new(types::CancelBuilder::user_data(k.raw()).all())
                        .build()
                        .user_data(Key::cancel().raw())
                })
                .collect()
        } else {
            vec![opcode::AsyncCancel2::new(types::CancelBuilder::any())
                .build()
                .user_data(Key::cancel().raw())]
        };
        for sqe in &cancels {
            // SAFETY: a cancel references no memory.
            if unsafe { self.ring.get().push(sqe) }.is_err() {
                return;
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.armed.is_empty() && Instant::now() < deadline {
            let _ = self
                .ring
                .get()
                .submit_and_wait(1, Some(Duration::from_millis(50)));
            let _ = self.harvest(drop);
        }
        if !self.armed.is_empty() {
            tracing::error!(
                armed = self.armed.len(),
                "requests still armed after cancel; leaking their memory"
            );
            // Keep the memory mapped forever rather than free it under the kernel.
            if let Some(b) = self.bufs.take() {
                std::mem::forget(b);
            }
            if let Some(z) = self.zcrx.take() {
                std::mem::forget(z);
            }
        }
    }
}

impl RecvRing<cqueue::Entry32> {
    /// Registers a zcrx instance bound to `bind` (a NIC rx queue, or no device) with an
    /// `area_len`-byte area (on huge pages if `huge`) and a refill ring of `rq_entries`. The
    /// ring must have CQE32, SINGLE_ISSUER and DEFER_TASKRUN.
    pub fn register_zcrx(
        &mut self,
        bind: ZcrxBind<'_>,
        area_len: usize,
        rq_entries: u32,
        huge: bool,
    ) -> Result<Rc<ZcrxArea>, IfqError> {
        let wrap = |source: io::Error| IfqError::new(bind, source);
        let rq_entries = rq_entries.max(1).next_power_of_two();
        let area = Region::new(area_len, huge).map_err(wrap)?;
        let refill = Region::new(refill_region_len(rq_entries), false).map_err(wrap)?;
        let reg = register_ifq(&self.ring.get(), bind, &area, &refill, rq_entries)?;
        let rq = RefillRing::new(
            refill,
            reg.head_off,
            reg.tail_off,
            reg.rqes_off,
            reg.rq_entries,
        )
        .map_err(wrap)?;
        let za = Rc::new(ZcrxArea::new(area, rq, reg.rq_area_token));
        self.zcrx = Some(ZcrxQueue {
            area: Rc::clone(&za),
            id: reg.zcrx_id,
            nodev: bind == ZcrxBind::NoDev,
        });
        Ok(za)
    }
}

impl<C: Cqe> Drop for RecvRing<C> {
    fn drop(&mut self) {
        self.drain();
        if let Some(b) = &self.bufs {
            let _ = self
                .ring
                .get()
                .raw()
                .submitter()
                .unregister_buf_ring(b.bgid());
        }
        if Rc::strong_count(&self.ring) > 1 {
            // A send ring keeps the ring open: the zcrx area stays registered with it (and the
            // buffer ring's memory may still be named by a request the kernel has not let go
            // of), so both live until the ring is closed.
            if let Some(z) = self.zcrx.take() {
                self.ring.keep(Box::new(z));
            }
            if let Some(b) = self.bufs.take() {
                self.ring.keep(Box::new(b));
            }
        }
    }
}

/// The one multishot receive of a [`FrameRecv`].
const FRAME_RECV_KEY: Key = Key::tagged(Op::Recv, 0);

/// What one completion of a [`FrameRecv`]'s multishot receive said.
#[derive(Debug)]
pub enum FrameEvent {
    /// A datagram of `len` bytes landed in buffer (frame) `bid`.
    Data {
        /// The buffer id the frame was provided under.
        bid: u16,
        /// Bytes received.
        len: u32,
    },
    /// `ENOBUFS` with no buffer provided: every frame is ready or held.
    Dry,
    /// `ENOBUFS` with buffers provided: the socket overran (messages were lost).
    Overrun,
    /// Another error.
    Error(io::Error),
}

/// The netlink frame ring's io_uring ring: one multishot `RECV` on a socket that picks frames
/// from a provided-buffer ring ([`crate::buf::bufring::PbufRing`]), and the verdict sends that
/// ride the same ring (submitted with the next wait, so a receive → decide → verdict cycle
/// costs one `io_uring_enter`). The frames themselves (memory and states) are
/// [`crate::buf::frames::FrameRing`]'s and the orchestration (which frames to lend, what a
/// completion makes of a frame) is the netlink side's (`netlink::source`); this owns the ring,
/// the requests and a handle on the frames' memory.
///
/// Dropping it cancels the multishot receive, waits for its last completion and unregisters
/// the buffer ring, so the kernel never writes into a frame after that; only then does it let
/// go of the frame memory ([`FrameMemory`]), so the mapping outlives every kernel write
/// whatever order the owners drop things in.
#[derive(Debug)]
pub struct FrameRecv {
    pub(crate) ring: Ring,
    bufs: crate::buf::bufring::PbufRing,
    /// The frames' memory, kept mapped until Drop has torn the receive down (fields drop
    /// after `Drop::drop`).
    memory: FrameMemory,
    /// Entries of the buffer ring: the most buffers it holds at once.
    capacity: u32,
    /// Entries added since the last publish.
    unpublished: u16,
    armed: bool,
    /// Buffers currently in the kernel's buffer ring.
    provided: u32,
    /// Send buffers owned by the kernel until their CQE (index = the key's tag), with the
    /// caller's token.
    sends: Vec<Option<(u64, Vec<u8>)>>,
    /// Send buffers back from the kernel, for reuse.
    spare: Vec<Vec<u8>>,
    /// Completed sends not yet taken by the caller: token and result.
    done: Vec<(u64, io::Result<()>)>,
    /// Scratch for one harvest.
    got: Vec<(u32, i32, u32)>,
    sent: Vec<(usize, i32)>,
}

impl FrameRecv {
    /// A ring with a buffer ring of room for `count` buffers (≤ 32768) under group 0, lending
    /// frames of `memory`. The error says why io_uring cannot be used (the caller records it
    /// as a fallback).
    pub fn new(count: u32, memory: FrameMemory) -> Result<Self, String> {
        if count > 32768 {
            return Err("more than 32768 frames: a buffer ring holds at most 32768".into());
        }
        let cq = (count * 2).clamp(256, 65536);
        let ring = Ring::new(&RingConfig {
            entries: 16,
            cq_entries: Some(cq),
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
        let entries = (count as u16).next_power_of_two();
        let sub = ring.raw().submitter();
        let bufs = crate::buf::bufring::PbufRing::register(
            ring.raw().as_raw_fd(),
            entries,
            0,
            false,
            |a, n, g, f| {
                // SAFETY: `a` is 0 (kernel-allocated) or the PbufRing's own region, which
                // lives in `self` until Drop unregisters the group.
                unsafe { sub.register_buf_ring_with_flags(a, n, g, f) }
            },
        )
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ENOMEM) {
                format!(
                    "IORING_REGISTER_PBUF_RING: {e} (the ring's memory counts against \
                     RLIMIT_MEMLOCK for a process without CAP_IPC_LOCK)"
                )
            } else {
                format!("IORING_REGISTER_PBUF_RING: {e} (needs Linux 5.19)")
            }
        })?;
        Ok(Self {
            ring,
            bufs,
            memory,
            capacity: u32::from(entries),
            unpublished: 0,
            armed: false,
            provided: 0,
            sends: Vec::new(),
            spare: Vec::new(),
            done: Vec::new(),
            got: Vec::new(),
            sent: Vec::new(),
        })
    }

    /// Adds a frame to the buffer ring under its id; it becomes visible at
    /// [`FrameRecv::publish`] and comes back as a [`FrameEvent::Data`] with that id.
    ///
    /// # Panics
    ///
    /// If the frame is not inside the memory this ring was made with, its id does not fit a
    /// buffer id (a ring has at most 32768 frames), or the buffer ring is full.
    pub fn provide(&mut self, frame: LentFrame) {
        assert!(
            self.memory.contains(frame.addr(), frame.len() as usize),
            "a frame of another frame ring"
        );
        assert!(
            self.provided < self.capacity,
            "more frames provided than the buffer ring holds"
        );
        let bid = u16::try_from(frame.id().0).expect("frame ids fit a buffer id");
        // SAFETY: the payload lies inside `self.memory`, which this value keeps mapped until
        // Drop has cancelled the receive, seen its last completion and unregistered the buffer
        // ring; a `LentFrame` is made only by `FrameRing::lend` for a frame it marked RESERVED,
        // and the ring does not read or write a RESERVED frame's payload until the completion
        // carrying its id gives it back (`FrameRing::complete`). Fewer than `capacity` buffers
        // are in the ring (asserted above), so the slot is not one the kernel may still read.
        unsafe {
            self.bufs
                .add(frame.addr(), frame.len(), bid, self.unpublished)
        };
        self.unpublished += 1;
        self.provided += 1;
    }

    /// Publishes every buffer added since the last call.
    pub fn publish(&mut self) {
        if self.unpublished > 0 {
            self.bufs.advance(std::mem::take(&mut self.unpublished));
        }
    }

    /// Buffers in the kernel's buffer ring now.
    pub fn provided(&self) -> u32 {
        self.provided
    }

    /// Whether the multishot receive is armed.
    pub fn armed(&self) -> bool {
        self.armed
    }

    /// `io_uring_enter` calls made so far.
    pub fn enters(&self) -> u64 {
        self.ring.enters()
    }

    /// Queues `buf` (whole netlink messages for the kernel) as a send on `fd`. The ring owns
    /// the buffer until its completion, whose result comes back under `token` from
    /// [`FrameRecv::take_send_results`]; it is submitted with the next wait or by
    /// [`FrameRecv::submit_sends`]. When the submission queue is full the buffer comes back.
    pub fn queue_send(
        &mut self,
        fd: &impl AsRawFd,
        buf: Vec<u8>,
        token: u64,
    ) -> Result<(), Vec<u8>> {
        let slot = match self.sends.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.sends.push(None);
                self.sends.len() - 1
            }
        };
        let e = opcode::Send::new(types::Fd(fd.as_raw_fd()), buf.as_ptr(), buf.len() as u32)
            .build()
            .user_data(Key::send(slot).raw());
        // SAFETY: `buf` is moved into `self.sends[slot]` below and stays there (heap storage
        // unmoved, never touched) until the CQE with this slot is harvested.
        if unsafe { self.ring.push(&e) }.is_err() {
            return Err(buf);
        }
        self.sends[slot] = Some((token, buf));
        Ok(())
    }

    /// Submits queued sends now (no syscall when none are queued).
    pub fn submit_sends(&mut self) -> io::Result<()> {
        if self.ring.pending() > 0 {
            self.ring.submit()?;
        }
        Ok(())
    }

    /// An empty buffer for the next send (recycled from completed sends when possible).
    pub fn spare_send_buf(&mut self) -> Vec<u8> {
        self.spare.pop().unwrap_or_else(|| Vec::with_capacity(4096))
    }

    /// Results of the sends completed since the last call, appended to `out`; a short send
    /// is an error (a netlink datagram goes whole or not at all).
    pub fn take_send_results(&mut self, out: &mut Vec<(u64, io::Result<()>)>) {
        out.append(&mut self.done);
    }

    /// Sends queued or submitted whose completion has not been harvested yet.
    pub fn sends_outstanding(&self) -> usize {
        self.sends.iter().filter(|s| s.is_some()).count()
    }

    /// Whether the kernel can hold a wait's first completion back to gather more
    /// (`IORING_FEAT_MIN_TIMEOUT`, Linux 6.12), for [`FrameRecv::wait`]'s `batch`.
    pub fn has_min_wait(&self) -> bool {
        self.ring.has_min_wait()
    }

    /// Arms the multishot receive on `fd` if needed (the caller checks that buffers are
    /// provided), submits what is queued and waits up to `wait` (`ZERO`: not at all; `MAX`:
    /// forever) for a completion unless some are ready, then harvests: send results are kept
    /// for [`FrameRecv::take_send_results`], receive completions go to `f` in order. With
    /// `batch = Some((n, min_wait))` (and [`FrameRecv::has_min_wait`]), a wait returns once `n`
    /// completions are there or `min_wait` has passed with at least one: fewer wake-ups when
    /// datagrams trickle in one at a time, at most `min_wait` of added latency.
    pub fn wait(
        &mut self,
        fd: &impl AsRawFd,
        wait: Duration,
        batch: Option<(usize, Duration)>,
        mut f: impl FnMut(FrameEvent),
    ) -> io::Result<()> {
        if !self.armed {
            let e = opcode::RecvMulti::new(types::Fd(fd.as_raw_fd()), self.bufs.bgid())
                .build()
                .user_data(FRAME_RECV_KEY.raw());
            // SAFETY: the receive writes only into buffers added with `provide`, whose
            // contract keeps them valid until their completion or until Drop has cancelled
            // this request and seen its last completion; the socket is passed to every wait.
            unsafe { self.ring.push(&e) }?;
            self.armed = true;
        }
        if self.ring.ready() == 0 {
            let r = match batch {
                _ if wait.is_zero() => self.ring.submit().map(drop),
                Some((n, min_wait)) if n > 1 && self.ring.has_min_wait() => {
                    // The whole wait still needs a bound: a day stands for "forever".
                    let t = wait.min(Duration::from_secs(86_400));
                    self.ring.submit_and_wait_batch(n, min_wait, t).map(drop)
                }
                _ => {
                    let t = (wait != Duration::MAX).then_some(wait);
                    self.ring.submit_and_wait(1, t).map(drop)
                }
            };
            match r {
                // A signal cut the wait short (job control's SIGSTOP/SIGCONT, a handler):
                // harvest what is there; the caller looks at its signals and waits again.
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                other => other?,
            }
        }
        let (got, sent) = (&mut self.got, &mut self.sent);
        self.ring.harvest(|c| {
            let key = Key::from_raw(c.user_data());
            if key == FRAME_RECV_KEY {
                got.push((
                    cqueue::buffer_select(c.flags()).map_or(u32::MAX, u32::from),
                    c.result(),
                    c.flags(),
                ));
            } else if key.op() == Some(Op::Send) {
                sent.push((key.tag() as usize, c.result()));
            }
        })?;
        for (slot, res) in self.sent.drain(..) {
            if let Some((token, mut b)) = self.sends.get_mut(slot).and_then(Option::take) {
                let r = if res < 0 {
                    Err(io::Error::from_raw_os_error(-res))
                } else if (res as usize) < b.len() {
                    Err(io::Error::other(format!(
                        "short netlink send: {res} of {} bytes",
                        b.len()
                    )))
                } else {
                    Ok(())
                };
                self.done.push((token, r));
                b.clear();
                self.spare.push(b);
            }
        }
        for (bid, res, flags) in self.got.drain(..) {
            if !cqueue::more(flags) {
                self.armed = false;
            }
            if res < 0 {
                if res == -libc::ENOBUFS {
                    f(if self.provided == 0 {
                        FrameEvent::Dry
                    } else {
                        FrameEvent::Overrun
                    });
                } else if res != -libc::ECANCELED {
                    f(FrameEvent::Error(io::Error::from_raw_os_error(-res)));
                }
                continue;
            }
            let Ok(bid) = u16::try_from(bid) else {
                continue;
            };
            self.provided = self.provided.saturating_sub(1);
            f(FrameEvent::Data {
                bid,
                len: res as u32,
            });
        }
        Ok(())
    }
}

impl Drop for FrameRecv {
    fn drop(&mut self) {
        if self.armed {
            let e = opcode::AsyncCancel::new(FRAME_RECV_KEY.raw())
                .build()
                .user_data(Key::cancel().raw());
            // SAFETY: a cancel request references no memory.
            if unsafe { self.ring.push(&e) }.is_ok() {
                let deadline = Instant::now() + Duration::from_secs(1);
                while self.armed && Instant::now() < deadline {
                    let _ = self
                        .ring
                        .submit_and_wait(1, Some(Duration::from_millis(50)));
                    let mut done = false;
                    let _ = self.ring.harvest(|c| {
                        if Key::from_raw(c.user_data()) == FRAME_RECV_KEY
                            && !cqueue::more(c.flags())
                        {
                            done = true;
                        }
                    });
                    if done {
                        self.armed = false;
                    }
                }
            }
            if self.armed {
                tracing::error!("frame receive still armed after cancel; leaking the frame memory");
                // Keep the frames mapped forever rather than free them under the kernel.
                std::mem::forget(self.memory.clone());
            }
        }
        let _ = self
            .ring
            .raw()
            .submitter()
            .unregister_buf_ring(self.bufs.bgid());
    }
}

/// A wait that a signal cut short (`EINTR`: a handler ran, job control stopped and continued
/// the process, a tracer attached) returns like one that timed out: what completed is
/// harvested, and the caller, which loops on its own conditions, waits again.
fn interrupted_is_a_wake(r: io::Result<usize>) -> io::Result<()> {
    match r {
        Err(e) if e.raw_os_error() == Some(libc::EINTR) => Ok(()),
        other => other.map(drop),
    }
}

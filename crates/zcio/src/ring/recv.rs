//! Safe multishot receive and accept on a ring: [`RecvRing`] owns the ring, the provided
//! buffer ring and the zcrx area it registered, and the descriptors of every armed request,
//! so no memory or descriptor the kernel uses can go away before the request's final
//! completion. Completions come out decoded: received bytes as [`Lease`]s (borrowed from the
//! ring's buffers, returned when dropped), accepted sockets as `OwnedFd`s.
//!
//! Dropping a `RecvRing` cancels every armed request and waits for their final completions
//! before the ring and the memory are released.

use super::zcrx::{flush_refill, refill_region_len, register_ifq, IfqError, ZcrxBind};
use super::{Ring, RingConfig, RingError};
use crate::buf::bufring::{BufLease, BufRing, BufRingConfig};
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
pub trait Cqe: cqueue::EntryMarker {
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

const KIND_SHIFT: u32 = 60;
const TAG_MASK: u64 = (1 << KIND_SHIFT) - 1;
const K_RECV: u64 = 1;
const K_ACCEPT: u64 = 2;
const K_ZC: u64 = 3;
const K_CANCEL: u64 = 4;

/// Largest tag callers may use.
pub const MAX_TAG: u64 = TAG_MASK;

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
    // Field order is drop order: the ring is closed before the memory it used is released.
    ring: Ring<C>,
    bufs: Option<Rc<BufRing>>,
    zcrx: Option<ZcrxQueue>,
    armed: HashMap<u64, Rc<OwnedFd>>,
    submitted_sqes: u64,
}

impl<C: Cqe> std::fmt::Debug for RecvRing<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvRing")
            .field("ring", &self.ring)
            .field("bufs", &self.bufs)
            .field("armed", &self.armed.len())
            .finish()
    }
}

impl<C: Cqe> RecvRing<C> {
    /// Creates the ring.
    pub fn new(cfg: &RingConfig) -> Result<Self, RingError> {
        Ok(Self {
            ring: Ring::new(cfg)?,
            bufs: None,
            zcrx: None,
            armed: HashMap::new(),
            submitted_sqes: 0,
        })
    }

    /// Whether the kernel has receive bundles (`IORING_FEAT_RECVSEND_BUNDLE`, 6.10).
    pub fn has_bundles(&self) -> bool {
        self.ring.raw().params().is_feature_recvsend_bundle()
    }

    /// The ring (flags, counters).
    pub fn ring(&self) -> &Ring<C> {
        &self.ring
    }

    /// Registers the provided-buffer ring receives select from. One per `RecvRing`.
    pub fn register_bufs(&mut self, cfg: &BufRingConfig) -> io::Result<Rc<BufRing>> {
        if self.bufs.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "buffer ring already registered",
            ));
        }
        let sub = self.ring.raw().submitter();
        let fd = self.ring.raw().as_raw_fd();
        let br = BufRing::register(fd, cfg, |addr, entries, bgid, flags| {
            // SAFETY: `addr` is 0 (kernel-allocated) or a region owned by the BufRing, which
            // `self` keeps until the ring is closed or the group unregistered (see Drop).
            unsafe { sub.register_buf_ring_with_flags(addr, entries, bgid, flags) }
        })?;
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
        self.arm(sqe, K_RECV, tag, fd)
    }

    /// Arms a multishot accept on the listening socket `fd`.
    pub fn accept_multi(&mut self, fd: Rc<OwnedFd>, tag: u64) -> io::Result<()> {
        let sqe = opcode::AcceptMulti::new(types::Fd(fd.as_raw_fd()))
            .flags(libc::SOCK_CLOEXEC)
            .build();
        self.arm(sqe, K_ACCEPT, tag, fd)
    }

    fn arm(
        &mut self,
        sqe: io_uring::squeue::Entry,
        kind: u64,
        tag: u64,
        fd: Rc<OwnedFd>,
    ) -> io::Result<()> {
        if tag > TAG_MASK {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "tag too large"));
        }
        let ud = (kind << KIND_SHIFT) | tag;
        if self.armed.contains_key(&ud) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a request with this tag is armed",
            ));
        }
        // SAFETY: the entry references only the descriptor, kept open in `armed` until the
        // final completion, and the registered buffer ring / zcrx area, which `self` owns and
        // releases only after every armed request has ended (Drop).
        unsafe { self.ring.push(&sqe.user_data(ud)) }?;
        self.armed.insert(ud, fd);
        self.submitted_sqes += 1;
        Ok(())
    }

    /// Asks the kernel to end the receive (or zcrx receive, or accept) `tag`; its
    /// [`Completion::Ended`] follows.
    pub fn cancel(&mut self, tag: u64) -> io::Result<()> {
        for kind in [K_RECV, K_ZC, K_ACCEPT] {
            let ud = (kind << KIND_SHIFT) | tag;
            if self.armed.contains_key(&ud) {
                let sqe = opcode::AsyncCancel2::new(types::CancelBuilder::user_data(ud).all())
                    .build()
                    .user_data(K_CANCEL << KIND_SHIFT);
                // SAFETY: a cancel references no memory.
                unsafe { self.ring.push(&sqe) }?;
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
        self.arm(sqe, K_ZC, tag, fd)
    }

    /// Whether `tag` has an armed receive.
    pub fn is_armed(&self, tag: u64) -> bool {
        [K_RECV, K_ZC]
            .iter()
            .any(|k| self.armed.contains_key(&((k << KIND_SHIFT) | tag)))
    }

    /// Entries queued but not yet submitted.
    pub fn pending(&mut self) -> usize {
        self.ring.pending()
    }

    /// Requests armed now.
    pub fn armed(&self) -> usize {
        self.armed.len()
    }

    /// Submits queued entries (no syscall when there are none).
    pub fn submit(&mut self) -> io::Result<()> {
        self.ring.submit().map(drop)
    }

    /// Submits and waits for completions: at least one within `timeout`, up to `want` within
    /// `min_wait` (see [`Ring::submit_and_wait_batch`]).
    pub fn wait(&mut self, want: usize, min_wait: Duration, timeout: Duration) -> io::Result<()> {
        self.ring
            .submit_and_wait_batch(want, min_wait, timeout)
            .map(drop)
    }

    /// `io_uring_enter` calls made.
    pub fn enters(&self) -> u64 {
        self.ring.enters()
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
        let n = self.ring.harvest(|cqe| {
            let (ud, res, flags, big) = cqe.parts();
            let kind = ud >> KIND_SHIFT;
            let tag = ud & TAG_MASK;
            let more = flags & IORING_CQE_F_MORE != 0;
            match kind {
                K_RECV if res > 0 => {
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
                K_ZC if res > 0 => match (zcrx, big) {
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
                K_ACCEPT if res >= 0 => {
                    // SAFETY: a successful accept CQE's result is a new descriptor we own.
                    let fd = unsafe { OwnedFd::from_raw_fd(res) };
                    f(Completion::Accepted { tag, fd });
                }
                K_CANCEL => return,
                _ => {
                    if res < 0 && more {
                        f(Completion::Error { tag, errno: -res });
                    }
                }
            }
            if !more && kind != K_CANCEL {
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
            flush_refill(&self.ring, z.id)?;
            calls += 1;
            rq.flush();
        }
        Ok(calls)
    }

    fn drain(&mut self) {
        if self.armed.is_empty() {
            return;
        }
        let sqe = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(K_CANCEL << KIND_SHIFT);
        // SAFETY: a cancel references no memory.
        if unsafe { self.ring.push(&sqe) }.is_err() {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.armed.is_empty() && Instant::now() < deadline {
            let _ = self
                .ring
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
        let reg = register_ifq(&self.ring, bind, &area, &refill, rq_entries)?;
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
            let _ = self.ring.raw().submitter().unregister_buf_ring(b.bgid());
        }
    }
}

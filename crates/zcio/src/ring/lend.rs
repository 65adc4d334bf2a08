//! Sends from lent buffers on one io_uring, for any number of sockets.
//!
//! [`LendRing`] owns the ring, every buffer lent to the kernel, the sockets whose requests it
//! carries (in one sparse registered-file table) and the registered send pools. It knows
//! nothing of what a send means to its caller (ordering, accounting, paths: that is
//! `tx`'s); it only guarantees that no byte the kernel may still read is released, and no
//! socket a request names is closed or replaced, before the kernel is done with it.
//!
//! Life cycle of a lent buffer ([`LendId`]), after monoio's and tokio-uring's operation slabs:
//!
//! - **Held**: lent with [`LendRing::lend`]; its owner pushes requests that read it
//!   ([`LendRing::push_send`]). Each request is *in the kernel* until its result CQE; a result
//!   with `IORING_CQE_F_MORE` (zero-copy) leaves it *owing a notification* until the
//!   notification CQE (`IORING_CQE_F_NOTIF`), which may also come first. A result without
//!   `F_MORE` ends the request: a request that failed without `F_MORE` sent nothing, so the
//!   kernel holds no reference to the pages for it (a late notification of such a request is
//!   passed on, but changes nothing here).
//! - **Taken back** ([`LendRing::take`]): returned at once when no request is in the kernel or
//!   owes a notification; otherwise kept, and handed back by [`LendRing::next_returned`] after
//!   the last CQE (the owner's own accounting should never ask early; this is the guarantee
//!   if it does).
//! - **Ignored** ([`LendRing::discard`]): the owner has gone while the kernel may still read
//!   the buffer; the ring keeps it until the last CQE, then drops it (a pool slot goes back to
//!   its pool then).
//!
//! A socket ([`FileId`]) added with [`LendRing::add_file`] takes a slot of the registered-file
//! table when one is free (requests then skip the file-table lookup and reference count);
//! [`LendRing::remove_file`] closes it only once no request naming it is left without its
//! result, so its descriptor number or table slot can never be reused under a request.
#![allow(unsafe_code)]

use super::key::{self, Op};
use super::{Ring, RingConfig, RingError, SendCore, SetupFlag, SharedRing};
use crate::buf::lent::Stable;
use crate::buf::pool::{Pool, PoolPin};
use crate::sys::msg::{MsgHdr, MsgOpts};
use crate::sys::{
    IORING_CQE_F_MORE, IORING_CQE_F_NOTIF, IORING_SEND_VECTORIZED, IORING_SEND_ZC_REPORT_USAGE,
};
use io_uring::{opcode, squeue, types};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// Largest single request (the SQE length field is 32 bits).
pub const MAX_REQ: usize = 1 << 30;

/// Registered pools a ring can hold (one sparse buffer table slot each).
pub const MAX_REGIONS: u32 = 16;

/// A buffer lent to a [`LendRing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LendId {
    idx: u32,
    gen: u16,
}

impl LendId {
    /// The buffer's number in the ring (below [`key::SEND_SLOTS`]).
    pub fn index(self) -> u32 {
        self.idx
    }
}

/// A socket of a [`LendRing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    idx: u32,
    gen: u32,
}

impl FileId {
    /// The socket's number in the ring (its registered-file slot when it has one).
    pub fn index(self) -> u32 {
        self.idx
    }
}

/// One send request: `len` bytes of the lent buffer from `off`, to `file`.
#[derive(Debug, Clone, Copy)]
pub struct SendSqe {
    /// The buffer read.
    pub lend: LendId,
    /// The request's number within this use of the buffer (masked to
    /// [`key::SEND_REQ_MASK`]; it comes back in [`SendCqe::req`]).
    pub req: u32,
    /// Offset in the buffer.
    pub off: usize,
    /// Bytes (at most [`MAX_REQ`]).
    pub len: usize,
    /// The socket.
    pub file: FileId,
    /// `IORING_OP_SEND_ZC` (with a notification), or `IORING_OP_SEND` (a copy).
    pub zc: bool,
    /// Zero-copy from a registered pool uses it as a fixed buffer (no pinning per send).
    pub fixed: bool,
    /// `IORING_SEND_ZC_REPORT_USAGE` (zero-copy only; Linux 6.2).
    pub report_usage: bool,
    /// `send(2)` flags (`MSG_WAITALL`, ...); `MSG_NOSIGNAL` is always added.
    pub msg_flags: i32,
    /// `IOSQE_IO_LINK`: the next request runs only after this one completed in full.
    pub link: bool,
    /// A zero-copy request of a buffer with a message header but no destination or control
    /// messages goes as `SEND_ZC` with `IORING_SEND_VECTORIZED` (Linux 6.17) instead of
    /// `SENDMSG_ZC`.
    pub vectorized: bool,
    /// `SEND_ZC` with `IORING_SEND_VECTORIZED` takes a registered buffer; where it does not,
    /// a vectored request whose slices all lie in a registered pool goes as `SENDMSG_ZC` from
    /// that pool (no pinning) rather than `SEND_ZC` pinning them.
    pub vectorized_fixed: bool,
}

/// A completion of a request pushed with [`LendRing::push_send`].
#[derive(Debug, Clone, Copy)]
pub struct SendCqe {
    /// What the owner gave [`LendRing::lend`] (or [`LendRing::set_route`]).
    pub route: u64,
    /// The buffer.
    pub lend: LendId,
    /// The request's number.
    pub req: u32,
    /// The CQE's result.
    pub res: i32,
    /// The CQE's flags.
    pub flags: u32,
}

impl SendCqe {
    /// `IORING_CQE_F_NOTIF`: a zero-copy notification (the kernel released the pages).
    pub fn is_notif(&self) -> bool {
        self.flags & IORING_CQE_F_NOTIF != 0
    }
    /// `IORING_CQE_F_MORE` on a result: a notification follows.
    pub fn more(&self) -> bool {
        self.flags & IORING_CQE_F_MORE != 0
    }
}

/// A failure injected into a [`LendRing`] for tests (feature `fault-injection`).
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// Fail `io_uring_enter` once this many requests have been pushed.
    pub after_requests: u64,
    /// The errno the failing enters return.
    pub errno: i32,
    /// How many enters fail (then the ring works again); `u32::MAX` = for ever.
    pub times: u32,
}

/// Counters of a [`LendRing`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LendStats {
    /// Buffers lent.
    pub lent: u64,
    /// Requests pushed.
    pub requests: u64,
    /// Buffers handed back to their owner.
    pub returned: u64,
    /// Buffers an owner asked back while the kernel still held them (kept until the last
    /// CQE; 0 unless an owner's own accounting is wrong).
    pub returned_late: u64,
    /// Buffers whose owner had gone (dropped after their last CQE).
    pub ignored: u64,
    /// CQEs that matched no live buffer (late notifications of failed requests whose buffer
    /// was already back).
    pub stray: u64,
    /// `io_uring_register` calls made for sockets and pools (set-up, not per send).
    pub register_calls: u64,
    /// Sockets that got no registered-file slot (the table was full or refused).
    pub unregistered_files: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    /// No result yet; `notified` = its notification came first.
    InKernel { notified: bool },
    /// Result with `F_MORE`: the notification is owed.
    Owed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Held,
    /// Taken back while requests were out: returned after the last CQE.
    Waiting,
    /// The owner has gone: dropped after the last CQE.
    Ignored,
}

#[derive(Debug)]
struct LSlot<B> {
    buf: Option<B>,
    gen: u16,
    file: u32,
    route: u64,
    owner: Owner,
    reqs: Vec<(u32, Life)>,
    /// The message header of a `SENDMSG`/`SENDMSG_ZC` buffer (destination, control
    /// messages): the kernel reads it at prep and at every (re-)issue, so it lives with the
    /// buffer until the last CQE.
    msg: Option<Box<MsgHdr>>,
    /// Slices after `buf` of a vectored send (their bytes follow `buf`'s in the request's
    /// range), held like `buf`.
    more: Vec<B>,
}

#[derive(Debug)]
struct FSlot {
    fd: Option<Arc<OwnedFd>>,
    raw: RawFd,
    gen: u32,
    fixed: bool,
    /// Requests naming this socket without their result yet.
    inflight: u32,
    closing: bool,
}

/// The ring, its lent buffers, sockets and registered pools. See the [module docs](self).
pub struct LendRing<B: Stable> {
    // Field order is drop order: the ring (and with it every registration, unless a receiver
    // shares it: see Drop) goes before the pools' pins and the sockets.
    ring: Box<dyn SendCore>,
    slots: Vec<LSlot<B>>,
    free: Vec<u32>,
    spare_reqs: Vec<Vec<(u32, Life)>>,
    live: usize,
    ignored_live: usize,
    returned: Vec<(u64, LendId, (B, Vec<B>))>,
    files: Vec<FSlot>,
    free_files: Vec<u32>,
    /// Size of the sparse registered-file table (0: none).
    file_table: u32,
    file_table_error: Option<String>,
    /// Registered pools: (pool id, buffer index, pin).
    regions: Vec<(u64, u16, PoolPin)>,
    sparse_bufs: Option<bool>,
    cqes: Vec<(u64, i32, u32)>,
    own_enters: u64,
    /// Entries pushed and not yet taken by the kernel, in order, with their number in the
    /// ring's submission order (see `SendCore::pushed_taken`).
    unentered: VecDeque<(LendId, u32, u64)>,
    dead: Option<i32>,
    #[cfg(feature = "fault-injection")]
    fault: Option<Fault>,
    stats: LendStats,
}

impl<B: Stable> std::fmt::Debug for LendRing<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LendRing")
            .field("live", &self.live)
            .field("files", &(self.files.len() - self.free_files.len()))
            .field("stats", &self.stats)
            .finish()
    }
}

impl<B: Stable> LendRing<B> {
    /// A ring set up with `cfg` and a sparse registered-file table of `files` slots (0: no
    /// table; requests name descriptors). The table's size is capped by `RLIMIT_NOFILE`, which
    /// the kernel enforces; a table it refuses is recorded ([`LendRing::file_table_error`])
    /// and every socket is named by descriptor.
    pub fn new(cfg: &RingConfig, files: u32) -> Result<Self, RingError> {
        let ring: Ring = Ring::new(cfg)?;
        Ok(Self::on(Box::new(SharedRing::new(ring)), files))
    }

    /// Sends on a ring another side uses too (a receiver's: one ring per thread), with a
    /// sparse registered-file table of `files` slots (see [`LendRing::new`]).
    pub fn on(ring: Box<dyn SendCore>, files: u32) -> Self {
        let mut me = Self {
            ring,
            slots: Vec::new(),
            free: Vec::new(),
            spare_reqs: Vec::new(),
            live: 0,
            ignored_live: 0,
            returned: Vec::new(),
            files: Vec::new(),
            free_files: Vec::new(),
            file_table: 0,
            file_table_error: None,
            regions: Vec::new(),
            sparse_bufs: None,
            cqes: Vec::new(),
            own_enters: 0,
            unentered: VecDeque::new(),
            dead: None,
            #[cfg(feature = "fault-injection")]
            fault: None,
            stats: LendStats::default(),
        };
        if files > 0 {
            let nofile = crate::sys::getrlimit(libc::RLIMIT_NOFILE)
                .ok()
                .and_then(|(soft, _)| soft)
                .unwrap_or(u64::from(files));
            let n = files.min(nofile.min(1 << 20) as u32).max(1);
            me.stats.register_calls += 1;
            let mut res = Ok(());
            me.ring
                .with_submitter(&mut |s| res = s.register_files_sparse(n));
            match res {
                Ok(()) => me.file_table = n,
                Err(e) => {
                    me.file_table_error = Some(format!(
                        "IORING_REGISTER_FILES (sparse, {n} slots) failed: {e}; requests name \
                         socket descriptors (one file-table lookup and reference per request)"
                    ))
                }
            }
        }
        me
    }

    /// The ring's set-up flags, asked for and granted.
    pub fn setup_flags(&self) -> Vec<SetupFlag> {
        self.ring.setup_flags()
    }

    /// Whether a receiver shares the ring.
    pub fn is_shared(&self) -> bool {
        self.ring.is_shared()
    }

    /// Why the registered-file table could not be set up, if it could not.
    pub fn file_table_error(&self) -> Option<&str> {
        self.file_table_error.as_deref()
    }

    /// Slots in the registered-file table.
    pub fn file_table_size(&self) -> u32 {
        self.file_table
    }

    /// Makes `io_uring_enter` fail as `fault` says (tests of the failure paths).
    #[cfg(feature = "fault-injection")]
    pub fn inject(&mut self, fault: Fault) {
        self.fault = Some(fault);
    }

    /// Whether the kernel knows `IORING_OP_SEND_ZC`.
    pub fn supports_send_zc(&self) -> io::Result<bool> {
        Ok(self
            .ring
            .probe_opcodes()?
            .is_supported(opcode::SendZc::CODE))
    }

    /// Counters.
    pub fn stats(&self) -> &LendStats {
        &self.stats
    }

    // ---- sockets ----

    /// Adds a socket. Returns its id and, when it got no registered-file slot, why (its
    /// requests then name the descriptor).
    pub fn add_file(&mut self, fd: Arc<OwnedFd>) -> (FileId, Option<String>) {
        let raw = fd.as_raw_fd();
        let idx = match self.free_files.pop() {
            Some(i) => i,
            None => {
                self.files.push(FSlot {
                    fd: None,
                    raw: -1,
                    gen: 0,
                    fixed: false,
                    inflight: 0,
                    closing: false,
                });
                (self.files.len() - 1) as u32
            }
        };
        let mut why = None;
        let mut fixed = false;
        if idx < self.file_table {
            self.stats.register_calls += 1;
            let mut res = Ok(0);
            self.ring
                .with_submitter(&mut |s| res = s.register_files_update(idx, &[raw]));
            match res {
                Ok(_) => fixed = true,
                Err(e) => why = Some(format!("IORING_REGISTER_FILES_UPDATE failed: {e}")),
            }
        } else if let Some(e) = &self.file_table_error {
            why = Some(e.clone());
        } else {
            why = Some(if self.file_table == 0 {
                "no registered-file table was asked for".to_string()
            } else {
                format!(
                    "the registered-file table is full ({} sockets; raise the ring's file \
                     table size and RLIMIT_NOFILE)",
                    self.file_table
                )
            });
        }
        if !fixed {
            self.stats.unregistered_files += 1;
        }
        let f = &mut self.files[idx as usize];
        f.gen = f.gen.wrapping_add(1);
        f.fd = Some(fd);
        f.raw = raw;
        f.fixed = fixed;
        f.inflight = 0;
        f.closing = false;
        (FileId { idx, gen: f.gen }, why)
    }

    fn file(&self, id: FileId) -> Option<&FSlot> {
        self.files
            .get(id.idx as usize)
            .filter(|f| f.gen == id.gen && f.fd.is_some())
    }

    /// Whether the socket has a registered-file slot.
    pub fn is_fixed(&self, id: FileId) -> bool {
        self.file(id).is_some_and(|f| f.fixed)
    }

    /// Requests naming the socket whose result has not come.
    pub fn file_inflight(&self, id: FileId) -> u32 {
        self.file(id).map_or(0, |f| f.inflight)
    }

    /// Removes a socket: no request may name it any more; it is closed (and its table slot
    /// freed) once every request naming it has its result, now if none is out.
    pub fn remove_file(&mut self, id: FileId) {
        let Some(f) = self
            .files
            .get_mut(id.idx as usize)
            .filter(|f| f.gen == id.gen && f.fd.is_some())
        else {
            return;
        };
        f.closing = true;
        if f.inflight == 0 {
            self.release_file(id.idx);
        }
    }

    fn release_file(&mut self, idx: u32) {
        let f = &mut self.files[idx as usize];
        if f.fixed {
            f.fixed = false;
            self.stats.register_calls += 1;
            // A failure leaves a reference to the file in the table until the ring closes:
            // the socket stays open a little longer, nothing worse.
            self.ring.with_submitter(&mut |s| {
                let _ = s.register_files_update(idx, &[-1]);
            });
        }
        f.fd = None;
        f.raw = -1;
        f.closing = false;
        self.free_files.push(idx);
    }

    // ---- registered pools ----

    /// Registers `pool` as a fixed buffer: requests sending from its buffers then use
    /// `IORING_RECVSEND_FIXED_BUF` (no page pinning per request). Registering a pool twice is
    /// a no-op. `ENOMEM`: `RLIMIT_MEMLOCK` is exhausted (without `CAP_IPC_LOCK` registered
    /// memory is charged to it).
    pub fn register_pool(&mut self, pool: &Pool) -> io::Result<()> {
        if self.regions.iter().any(|r| r.0 == pool.id()) {
            return Ok(());
        }
        if self.regions.len() as u32 >= MAX_REGIONS {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("at most {MAX_REGIONS} pools can be registered with one ring"),
            ));
        }
        if self.sparse_bufs.is_none() {
            self.stats.register_calls += 1;
            let mut ok = false;
            self.ring
                .with_submitter(&mut |s| ok = s.register_buffers_sparse(MAX_REGIONS).is_ok());
            self.sparse_bufs = Some(ok);
        }
        let (iov, pin) = pool.iovec();
        let idx = self.regions.len() as u16;
        self.stats.register_calls += 1;
        let mut res = Ok(());
        if self.sparse_bufs == Some(true) {
            self.ring.with_submitter(&mut |s| {
                // SAFETY: `iov` describes the pool's live mapping; `pin` keeps it mapped and
                // is kept in `self.regions`, which is dropped after `self.ring` (field order),
                // i.e. after the registration is gone, or, on a ring a receiver shares, after
                // the registration was removed (Drop).
                res = unsafe { s.register_buffers_update(u32::from(idx), &[iov], None) };
            });
        } else {
            if idx > 0 {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "this kernel registers one pool per ring (no sparse buffer table)",
                ));
            }
            self.ring.with_submitter(&mut |s| {
                // SAFETY: as above.
                res = unsafe { s.register_buffers(&[iov]) };
            });
        }
        res?;
        self.regions.push((pool.id(), idx, pin));
        Ok(())
    }

    /// Whether `pool` is registered.
    pub fn has_pool(&self, pool_id: u64) -> bool {
        self.regions.iter().any(|r| r.0 == pool_id)
    }

    /// Whether any pool is registered.
    pub fn has_any_pool(&self) -> bool {
        !self.regions.is_empty()
    }

    // ---- lent buffers ----

    /// Lends `buf` for requests to `file`; `route` comes back with each of its CQEs.
    pub fn lend(&mut self, buf: B, file: FileId, route: u64) -> LendId {
        self.lend_slices(buf, Vec::new(), file, route)
    }

    /// Lends the slices `buf`, `more…` of one vectored send: a request's range covers their
    /// bytes in this order. A buffer with more than one slice is sent only with a message
    /// header ([`LendRing::set_msg`]): `SENDMSG_ZC`/`SENDMSG` with an iovec, or `SEND_ZC`
    /// with `IORING_SEND_VECTORIZED`. All slices come back together.
    pub fn lend_slices(&mut self, buf: B, more: Vec<B>, file: FileId, route: u64) -> LendId {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                assert!(
                    (self.slots.len() as u32) < key::SEND_SLOTS,
                    "more than 2^24 sends in flight on one ring"
                );
                self.slots.push(LSlot {
                    buf: None,
                    gen: 0,
                    file: 0,
                    route: 0,
                    owner: Owner::Held,
                    reqs: Vec::new(),
                    msg: None,
                    more: Vec::new(),
                });
                (self.slots.len() - 1) as u32
            }
        };
        let reqs = self.spare_reqs.pop().unwrap_or_default();
        let s = &mut self.slots[idx as usize];
        s.gen = s.gen.wrapping_add(1) & key::SEND_GEN_MASK;
        s.buf = Some(buf);
        s.file = file.idx;
        s.route = route;
        s.owner = Owner::Held;
        s.reqs = reqs;
        s.msg = None;
        s.more = more;
        self.live += 1;
        self.stats.lent += 1;
        LendId { idx, gen: s.gen }
    }

    /// The registered pool (its buffer index) that holds every slice of `slot`, if any: the
    /// kernel checks each iovec of a fixed-buffer request against the one registered buffer
    /// the request names.
    fn fixed_region(&self, slot: &LSlot<B>) -> Option<u16> {
        let first = slot.buf.as_ref().and_then(|b| b.region());
        first
            .filter(|&r| slot.more.iter().all(|b| b.region() == Some(r)))
            .and_then(|id| self.regions.iter().find(|r| r.0 == id))
            .map(|r| r.1)
    }

    /// Whether a zero-copy send of `id` can use a registered buffer (every slice lies in one
    /// registered pool); else its pages are pinned per send.
    pub fn is_fixed_buffer(&self, id: LendId) -> bool {
        self.slot(id)
            .is_some_and(|s| self.fixed_region(s).is_some())
    }

    fn slot(&self, id: LendId) -> Option<&LSlot<B>> {
        self.slots
            .get(id.idx as usize)
            .filter(|s| s.gen == id.gen && s.buf.is_some())
    }

    /// Sends of a held buffer go as `SENDMSG_ZC` (zero-copy) or `SENDMSG` (copy) with `msg`
    /// (its destination and control messages); the header is kept with the buffer until its
    /// last CQE. Only one request of such a buffer is in the kernel at a time
    /// ([`LendRing::push_send`] refuses a second before the first's result), since each
    /// request points the header at its own range.
    pub fn set_msg(&mut self, id: LendId, msg: MsgHdr) {
        if let Some(s) = self
            .slots
            .get_mut(id.idx as usize)
            .filter(|s| s.gen == id.gen && s.buf.is_some() && s.reqs.is_empty())
        {
            s.msg = Some(Box::new(msg));
        }
    }

    /// The message options of a held buffer sent with a header ([`LendRing::set_msg`]).
    pub fn msg_opts(&self, id: LendId) -> Option<MsgOpts> {
        self.slot(id)
            .and_then(|s| s.msg.as_ref())
            .map(|m| *m.opts())
    }

    /// Changes the route of a held buffer.
    pub fn set_route(&mut self, id: LendId, route: u64) {
        if let Some(s) = self
            .slots
            .get_mut(id.idx as usize)
            .filter(|s| s.gen == id.gen && s.buf.is_some())
        {
            s.route = route;
        }
    }

    /// The bytes of a held buffer (its first slice).
    pub fn bytes(&self, id: LendId) -> Option<&[u8]> {
        self.slot(id).and_then(|s| s.buf.as_deref())
    }

    /// The slices of a held buffer, in order.
    pub fn slices(&self, id: LendId) -> Vec<&[u8]> {
        match self.slot(id) {
            Some(s) => std::iter::once(s.buf.as_deref().unwrap_or(&[]))
                .chain(s.more.iter().map(|b| &**b))
                .collect(),
            None => Vec::new(),
        }
    }

    /// Buffers lent and not yet back (held, waiting or ignored).
    pub fn live(&self) -> usize {
        self.live
    }

    /// Buffers whose owner has gone and that the kernel still holds: the ring must still be
    /// entered for them to go.
    pub fn ignored_live(&self) -> usize {
        self.ignored_live
    }

    /// Whether the kernel may still read the buffer (a request without its result, or owing
    /// a notification).
    pub fn in_kernel(&self, id: LendId) -> bool {
        self.slot(id).is_some_and(|s| !s.reqs.is_empty())
    }

    /// Takes a held buffer back. `None` while the kernel may still read it: it is then
    /// returned by [`LendRing::next_returned`] after its last CQE.
    pub fn take(&mut self, id: LendId) -> Option<(B, Vec<B>)> {
        let s = self
            .slots
            .get_mut(id.idx as usize)
            .filter(|s| s.gen == id.gen && s.buf.is_some() && s.owner == Owner::Held)?;
        if s.reqs.is_empty() {
            self.stats.returned += 1;
            return Some(self.free_slot(id.idx));
        }
        s.owner = Owner::Waiting;
        self.stats.returned_late += 1;
        None
    }

    /// The owner of a held buffer has gone: the buffer is dropped once the kernel is done
    /// with it (now, if it is).
    pub fn discard(&mut self, id: LendId) {
        let Some(s) = self
            .slots
            .get_mut(id.idx as usize)
            .filter(|s| s.gen == id.gen && s.buf.is_some())
        else {
            return;
        };
        self.stats.ignored += 1;
        if s.reqs.is_empty() {
            drop(self.free_slot(id.idx));
        } else {
            s.owner = Owner::Ignored;
            self.ignored_live += 1;
        }
    }

    /// A buffer taken back while the kernel still held it, now that it no longer does.
    pub fn next_returned(&mut self) -> Option<(u64, LendId, (B, Vec<B>))> {
        self.returned.pop()
    }

    fn free_slot(&mut self, idx: u32) -> (B, Vec<B>) {
        let s = &mut self.slots[idx as usize];
        let buf = s.buf.take().expect("live slot");
        let more = std::mem::take(&mut s.more);
        let mut reqs = std::mem::take(&mut s.reqs);
        reqs.clear();
        // The kernel has no request of this buffer left: its header may go.
        s.msg = None;
        if reqs.capacity() > 0 && self.spare_reqs.len() < 4096 {
            self.spare_reqs.push(reqs);
        }
        self.free.push(idx);
        self.live -= 1;
        (buf, more)
    }

    /// Queues one request. Fails (and queues nothing) for a buffer that is not held, a range
    /// outside it, or a socket that is not open or is being removed. Fixed buffers are used
    /// when the buffer lies in a registered pool (zero-copy requests), registered files when
    /// the socket has a slot.
    pub fn push_send(&mut self, s: &SendSqe) -> io::Result<()> {
        let inval = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
        let slot = self
            .slots
            .get(s.lend.idx as usize)
            .filter(|x| x.gen == s.lend.gen && x.owner == Owner::Held)
            .ok_or_else(|| inval("request for a buffer that is not held"))?;
        let buf = slot.buf.as_deref().ok_or_else(|| inval("no buffer"))?;
        let total = buf.len() + slot.more.iter().map(|b| b.len()).sum::<usize>();
        if s.len > MAX_REQ || s.off.checked_add(s.len).map_or(true, |end| end > total) {
            return Err(inval("request outside its buffer"));
        }
        if !slot.more.is_empty() && slot.msg.is_none() {
            return Err(inval("a vectored buffer without a message header"));
        }
        if slot.file != s.file.idx {
            return Err(inval("request to another socket than the buffer's"));
        }
        if slot.msg.is_some()
            && slot
                .reqs
                .iter()
                .any(|r| matches!(r.1, Life::InKernel { .. }))
        {
            // The header is pointed at this request's range: a request still without its
            // result may be re-issued and read it again.
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        let f = self
            .files
            .get(s.file.idx as usize)
            .filter(|f| f.gen == s.file.gen && f.fd.is_some() && !f.closing)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        // The request's range over the slices, in order.
        let mut iov: [(*const u8, usize); crate::sys::msg::MAX_IOV] =
            [(std::ptr::null(), 0); crate::sys::msg::MAX_IOV];
        let mut n_iov = 0;
        let (mut skip, mut want) = (s.off, s.len);
        for part in std::iter::once(buf).chain(slot.more.iter().map(|b| &**b)) {
            if want == 0 {
                break;
            }
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            let take = (part.len() - skip).min(want);
            if n_iov == iov.len() {
                return Err(inval("more slices than one message carries"));
            }
            iov[n_iov] = (part[skip..].as_ptr(), take);
            n_iov += 1;
            want -= take;
            skip = 0;
        }
        let ptr = if s.len == 0 { buf.as_ptr() } else { iov[0].0 };
        let flags = s.msg_flags | libc::MSG_NOSIGNAL;
        // A registered pool is used when every slice lies in it (the kernel checks each
        // iovec against the one registered buffer the request names).
        let region = if s.zc && s.fixed {
            self.fixed_region(slot)
        } else {
            None
        };
        let (fixed_file, raw) = (f.fixed, f.raw);
        let sqe = if slot.msg.is_some() {
            let slot = &mut self.slots[s.lend.idx as usize];
            let msg = slot.msg.as_mut().expect("checked");
            let hdr = msg.point(&iov[..n_iov.max(1)])?;
            let zc_flags = if s.report_usage {
                IORING_SEND_ZC_REPORT_USAGE
            } else {
                0
            };
            let plain = msg.opts().dest.is_none()
                && msg.opts().segment.is_none()
                && msg.opts().tos.is_none();
            if s.zc && s.vectorized && plain && (region.is_none() || s.vectorized_fixed) {
                // SEND_ZC of the header's iovec array (Linux 6.17): no msghdr to copy in.
                let (iov_ptr, iov_n) = msg.iovecs();
                let op = if fixed_file {
                    opcode::SendZc::new(types::Fixed(s.file.idx), iov_ptr.cast(), iov_n as u32)
                } else {
                    opcode::SendZc::new(types::Fd(raw), iov_ptr.cast(), iov_n as u32)
                };
                op.flags(flags)
                    .buf_index(region)
                    .zc_flags(zc_flags | IORING_SEND_VECTORIZED)
                    .build()
            } else {
                match (s.zc, fixed_file) {
                    (true, true) => opcode::SendMsgZc::new(types::Fixed(s.file.idx), hdr)
                        .flags(flags as u32)
                        .ioprio(zc_flags)
                        .buf_index(region)
                        .build(),
                    (true, false) => opcode::SendMsgZc::new(types::Fd(raw), hdr)
                        .flags(flags as u32)
                        .ioprio(zc_flags)
                        .buf_index(region)
                        .build(),
                    (false, true) => opcode::SendMsg::new(types::Fixed(s.file.idx), hdr)
                        .flags(flags as u32)
                        .build(),
                    (false, false) => opcode::SendMsg::new(types::Fd(raw), hdr)
                        .flags(flags as u32)
                        .build(),
                }
            }
        } else {
            match (s.zc, fixed_file) {
                (true, fixed) => {
                    let mut op = if fixed {
                        opcode::SendZc::new(types::Fixed(s.file.idx), ptr, s.len as u32)
                    } else {
                        opcode::SendZc::new(types::Fd(raw), ptr, s.len as u32)
                    }
                    .flags(flags)
                    .buf_index(region);
                    if s.report_usage {
                        op = op.zc_flags(IORING_SEND_ZC_REPORT_USAGE);
                    }
                    op.build()
                }
                (false, true) => opcode::Send::new(types::Fixed(s.file.idx), ptr, s.len as u32)
                    .flags(flags)
                    .build(),
                (false, false) => opcode::Send::new(types::Fd(raw), ptr, s.len as u32)
                    .flags(flags)
                    .build(),
            }
        };
        let mut sqe = sqe.user_data(key::Key::send_zc(s.lend.gen, s.lend.idx, s.req).raw());
        if s.link {
            sqe = sqe.flags(squeue::Flags::IO_LINK);
        }
        // Room first, so the entry is never half-queued: `Ring::push` would otherwise submit
        // on a full queue, which callers that count chains must not see.
        if self.ring.sq_room() == 0 {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        // SAFETY: the entry points at `len` bytes inside the lent buffer's slices (the range
        // checked above against their total), each `Stable` (its bytes neither move nor change
        // while this ring owns it) and all held in the slot, and, with a buffer index, inside
        // a registered pool kept mapped by `self.regions` (every slice in it, checked above). A
        // `SENDMSG`/`SENDMSG_ZC` entry points at the buffer's boxed header (its address, iovec
        // and control bytes, all inside the box, which does not move), a vectored `SEND_ZC` at
        // that header's iovec array; the header is kept in the slot with the buffer and
        // re-pointed only once no request of the buffer is without its result. The
        // ring keeps the buffer until this request's result CQE and, when that CQE has
        // `F_MORE`, its notification CQE have been harvested (`on_cqe`), also when the owner
        // takes it back or goes earlier (`take`, `discard`). A failed result without `F_MORE`
        // sent nothing, so the kernel does not read the buffer for it. The socket is named by
        // a registered slot or a descriptor that `remove_file` keeps until this request's
        // result. On drop with requests outstanding the buffers are leaked, never freed.
        unsafe { self.ring.push(&sqe) }?;
        let seq = self.ring.pushed_taken().0 - 1;
        let slot = &mut self.slots[s.lend.idx as usize];
        slot.reqs.push((
            s.req & key::SEND_REQ_MASK,
            Life::InKernel { notified: false },
        ));
        self.files[s.file.idx as usize].inflight += 1;
        self.unentered
            .push_back((s.lend, s.req & key::SEND_REQ_MASK, seq));
        self.stats.requests += 1;
        Ok(())
    }

    /// Asks the kernel to cancel every request naming `file` (their results come back,
    /// `-ECANCELED` or the bytes sent so far) and submits at once, while the socket is
    /// certainly still open: a cancel by descriptor submitted later could meet a new socket
    /// that took the number.
    pub fn cancel_file(&mut self, id: FileId) -> io::Result<()> {
        let f = self
            .file(id)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        let b = if f.fixed {
            types::CancelBuilder::fd(types::Fixed(id.idx))
        } else {
            types::CancelBuilder::fd(types::Fd(f.raw))
        }
        .all();
        let sqe = opcode::AsyncCancel2::new(b)
            .build()
            .user_data(key::Key::cancel().raw());
        if self.ring.sq_room() == 0 {
            self.submit()?;
        }
        // SAFETY: a cancel references no memory.
        unsafe { self.ring.push(&sqe) }?;
        self.enter_getevents()
    }

    /// Free submission queue entries.
    pub fn sq_room(&mut self) -> usize {
        self.ring.sq_room()
    }

    /// Entries queued and not yet handed to the kernel.
    pub fn pending(&mut self) -> usize {
        self.ring.pending()
    }

    // ---- entering the kernel ----

    /// `io_uring_enter` calls this side made (each with `GETEVENTS`: after one, deferred task
    /// work queued before it has run). On a shared ring the receiver's enters are its own and
    /// not counted here: a lower bound, which only delays what waits for an enter.
    pub fn enters(&self) -> u64 {
        self.own_enters
    }

    /// Whether the ring was abandoned after failing ([`LendRing::abandon`]).
    pub fn is_dead(&self) -> bool {
        self.dead.is_some()
    }

    /// The injected failure, if one is due now (it stands for an enter that failed: the
    /// kernel took none of the queued entries).
    fn fault_due(&mut self) -> io::Result<()> {
        if let Some(e) = self.dead {
            return Err(io::Error::from_raw_os_error(e));
        }
        #[cfg(feature = "fault-injection")]
        if let Some(f) = self.fault.as_mut() {
            if self.stats.requests > f.after_requests && f.times > 0 {
                if f.times != u32::MAX {
                    f.times -= 1;
                }
                self.own_enters += 1;
                return Err(io::Error::from_raw_os_error(f.errno));
            }
        }
        Ok(())
    }

    /// Submits what is queued with `IORING_ENTER_GETEVENTS` (min_complete 0): under
    /// `DEFER_TASKRUN` the kernel then also runs deferred task work, posting notifications
    /// and retried sends. No syscall when nothing is queued.
    pub fn submit(&mut self) -> io::Result<()> {
        if self.ring.pending() == 0 {
            return Ok(());
        }
        self.enter_getevents()
    }

    /// One `io_uring_enter(pending, 0, GETEVENTS)` whether or not anything is queued; a
    /// signal (`EINTR`) is retried.
    pub fn enter_getevents(&mut self) -> io::Result<()> {
        loop {
            let res = self.fault_due().and_then(|()| {
                self.own_enters += 1;
                self.ring.enter_getevents()
            });
            match res {
                Ok(_) => {
                    self.entered_ok();
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    self.entered_ok();
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Submits and waits until at least one CQE is there or `timeout` passes. A signal ends
    /// the wait early (`Ok`).
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let res = self.fault_due().and_then(|()| {
            self.own_enters += 1;
            self.ring.submit_and_wait(1, timeout)
        });
        match res {
            Ok(_) => {
                self.entered_ok();
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Send requests pushed and not yet taken by the kernel (by any enter of the ring, this
    /// side's or a receiver's that shares it).
    pub fn untaken_sends(&mut self) -> usize {
        self.entered_ok();
        self.unentered.len()
    }

    fn entered_ok(&mut self) {
        let (_, taken) = self.ring.pushed_taken();
        while self.unentered.front().is_some_and(|e| e.2 < taken) {
            self.unentered.pop_front();
        }
    }

    /// Whether the kernel flagged deferred task work (`IORING_SQ_TASKRUN`): an enter with
    /// GETEVENTS would post completions.
    pub fn task_work_pending(&self) -> bool {
        self.ring.task_work_pending()
    }

    /// The ring was entered for the last time (it failed and will not be entered again):
    /// requests it queued that the kernel never took are forgotten (their buffers can be
    /// taken back) and returned, oldest first, for their owners to withdraw.
    pub fn abandon(&mut self, errno: i32) -> Vec<(u64, LendId, u32)> {
        self.dead.get_or_insert(errno);
        self.entered_ok();
        let never: Vec<(LendId, u32, u64)> = self.unentered.drain(..).collect();
        let mut out = Vec::with_capacity(never.len());
        for (lend, req, _) in never {
            let Some(s) = self
                .slots
                .get_mut(lend.idx as usize)
                .filter(|s| s.gen == lend.gen && s.buf.is_some())
            else {
                continue;
            };
            if let Some(i) = s.reqs.iter().position(|r| r.0 == req) {
                s.reqs.swap_remove(i);
                let file = s.file;
                let route = s.route;
                if let Some(f) = self.files.get_mut(file as usize) {
                    f.inflight = f.inflight.saturating_sub(1);
                }
                out.push((route, lend, req));
            }
        }
        out
    }

    // ---- readiness ----

    /// The ring's readiness eventfd (see [`Ring::notify_fd`]), registered on first call.
    pub fn notify_fd(&mut self) -> io::Result<RawFd> {
        self.ring.notify_raw()
    }

    /// Resets the ring's eventfd (see [`Ring::clear_notify`]).
    pub fn clear_notify(&self) {
        self.ring.clear_notify()
    }

    /// A send-side call that may enter begins (see [`SharedRing::begin_quiet`]).
    pub fn begin_quiet(&self, signalled: bool) {
        self.ring.begin_quiet(signalled)
    }

    /// The outermost such call ends (see [`SharedRing::end_quiet`]); `left`: the caller
    /// left work of its own for `on_ready`. Returns whether work waits.
    pub fn end_quiet(&self, left: bool) -> bool {
        self.ring.end_quiet(left)
    }

    /// The readiness descriptor is watched edge-triggered (see
    /// [`SharedRing::set_edge_readiness`]).
    pub fn set_edge_readiness(&self, edge: bool) {
        self.ring.set_edge_readiness(edge)
    }

    /// System calls the quiet calls' ends made on the eventfd (see
    /// [`SharedRing::eventfd_calls`]).
    pub fn eventfd_calls(&self) -> u64 {
        self.ring.eventfd_calls()
    }

    /// Completions or flagged task work wait in the ring (see [`Ring::has_work`]).
    pub fn has_work(&mut self) -> bool {
        !self.is_dead() && self.ring.has_work()
    }

    // ---- completions ----

    /// Reads every CQE the kernel has posted (no syscall unless the CQ overflowed): each of
    /// a lent buffer's requests goes to `on_send` after the buffer's life cycle was updated
    /// (buffers whose owner had gone are dropped at their last CQE; buffers taken back early
    /// become [`LendRing::next_returned`]); every other CQE goes to `other` as
    /// `(user_data, res, flags)`. Returns how many CQEs were read.
    pub fn harvest(
        &mut self,
        mut on_send: impl FnMut(SendCqe),
        mut other: impl FnMut(u64, i32, u32),
    ) -> io::Result<usize> {
        // Entries another side's enter took are the kernel's now.
        self.entered_ok();
        let mut cqes = std::mem::take(&mut self.cqes);
        let before = self.ring.enters();
        let res = self
            .ring
            .harvest_sends(&mut |ud, r, flags| cqes.push((ud, r, flags)));
        // Enters made to flush an overflowed CQ count as this side's.
        self.own_enters += self.ring.enters() - before;
        let n = cqes.len();
        for &(ud, r, flags) in &cqes {
            let k = key::Key::from_raw(ud);
            if k.op() != Some(Op::SendZc) {
                other(ud, r, flags);
                continue;
            }
            let (gen, idx, req) = k.send_zc_parts();
            match self.on_cqe(LendId { idx, gen }, req, flags) {
                Some(route) => on_send(SendCqe {
                    route,
                    lend: LendId { idx, gen },
                    req,
                    res: r,
                    flags,
                }),
                None => self.stats.stray += 1,
            }
        }
        cqes.clear();
        self.cqes = cqes;
        res.map(|_| n)
    }

    /// Updates the life cycle for one CQE; returns the buffer's route, or `None` for a CQE
    /// of no live buffer (or of one whose owner has gone).
    fn on_cqe(&mut self, id: LendId, req: u32, flags: u32) -> Option<u64> {
        let s = self
            .slots
            .get_mut(id.idx as usize)
            .filter(|s| s.gen == id.gen && s.buf.is_some())?;
        let notif = flags & IORING_CQE_F_NOTIF != 0;
        let more = flags & IORING_CQE_F_MORE != 0;
        let pos = s.reqs.iter().position(|r| r.0 == req);
        let mut result_of_file = false;
        match (pos, notif) {
            (Some(i), true) => match s.reqs[i].1 {
                Life::Owed => {
                    s.reqs.swap_remove(i);
                }
                Life::InKernel { .. } => s.reqs[i].1 = Life::InKernel { notified: true },
            },
            (Some(i), false) => {
                result_of_file = true;
                match s.reqs[i].1 {
                    Life::InKernel { notified } if more && !notified => s.reqs[i].1 = Life::Owed,
                    _ => {
                        s.reqs.swap_remove(i);
                    }
                }
            }
            // A late notification of a request that failed without F_MORE: nothing of ours.
            (None, _) => {}
        }
        let (route, owner, empty, file) = (s.route, s.owner, s.reqs.is_empty(), s.file);
        if result_of_file {
            let f = &mut self.files[file as usize];
            f.inflight = f.inflight.saturating_sub(1);
            if f.inflight == 0 && f.closing {
                self.release_file(file);
            }
        }
        match owner {
            Owner::Held => Some(route),
            Owner::Waiting => {
                if empty {
                    let b = self.free_slot(id.idx);
                    self.stats.returned += 1;
                    self.returned.push((route, id, b));
                }
                Some(route)
            }
            Owner::Ignored => {
                if empty {
                    drop(self.free_slot(id.idx));
                    self.ignored_live -= 1;
                }
                None
            }
        }
    }
}

impl<B: Stable> Drop for LendRing<B> {
    fn drop(&mut self) {
        // Requests still out: give the kernel a moment to finish them.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while self.dead.is_none()
            && self
                .slots
                .iter()
                .any(|s| s.buf.is_some() && !s.reqs.is_empty())
            && std::time::Instant::now() < deadline
        {
            if self.wait(Some(Duration::from_millis(50))).is_err() {
                break;
            }
            if self.harvest(drop, |_, _, _| {}).is_err() {
                break;
            }
        }
        let mut leaked = 0;
        for s in &mut self.slots {
            if s.buf.is_some() && !s.reqs.is_empty() {
                // The kernel may still read these pages: never let anyone reuse them.
                std::mem::forget(s.buf.take());
                std::mem::forget(std::mem::take(&mut s.more));
                leaked += 1;
            }
        }
        if leaked > 0 {
            tracing::warn!(
                leaked,
                "send ring dropped with requests in the kernel: their buffers are leaked, not \
                 reused"
            );
            // The registered pools too: the kernel may still read through the registration.
            for r in self.regions.drain(..) {
                std::mem::forget(r);
            }
        } else if self.ring.is_shared() {
            // The ring lives on (a receiver uses it): take our registrations off it before
            // the pools' pins and the sockets go.
            if !self.regions.is_empty() {
                self.ring.with_submitter(&mut |s| {
                    let _ = s.unregister_buffers();
                });
            }
            for idx in 0..self.files.len() as u32 {
                if self.files[idx as usize].fd.is_some() {
                    self.release_file(idx);
                }
            }
        } else if self.files.iter().any(|f| f.fixed) {
            // The table's references to the sockets go now, not with the ring: a ring closed
            // with DEFER_TASKRUN is freed by a kernel worker after an RCU grace period, and
            // until then its table keeps every registered socket open, so the peer's end of
            // stream came 29-40 ms after the last completion. Without the table's
            // reference, closing the descriptor releases the socket at once.
            self.stats.register_calls += 1;
            self.ring.with_submitter(&mut |s| {
                let _ = s.unregister_files();
            });
            for f in &mut self.files {
                f.fixed = false;
            }
        }
    }
}

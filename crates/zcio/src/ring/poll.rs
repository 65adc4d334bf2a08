//! Safe poll submissions: `POLL_ADD` (one-shot or multishot), `POLL_UPDATE` and `POLL_REMOVE`.
//!
//! These requests reference no user memory (only a descriptor number, an event mask and
//! user_data values), so pushing them cannot break memory safety whatever the kernel does
//! with them: the wrappers here are safe. A descriptor that is closed before the entry is
//! submitted makes the kernel answer `-EBADF` in the completion.

use super::key::Key;
use super::Ring;
use crate::sys::{
    assert_layout, IORING_POLL_ADD_MULTI, IORING_POLL_UPDATE_EVENTS, IORING_POLL_UPDATE_USER_DATA,
};
use io_uring::{cqueue, opcode, squeue, types};
use std::io;
use std::os::fd::RawFd;

/// `struct io_uring_sqe` as used by `IORING_OP_POLL_REMOVE` in its update form (5.13), which
/// the io-uring crate does not build: `addr` is the user_data of the poll to update, `off` the
/// new user_data, `len` the `IORING_POLL_*` flags, `poll32_events` the new mask.
#[repr(C)]
#[derive(Clone, Copy)]
struct PollUpdateSqe {
    opcode: u8,
    flags: u8,
    ioprio: u16,
    fd: i32,
    off: u64,
    addr: u64,
    len: u32,
    poll32_events: u32,
    user_data: u64,
    rest: [u64; 3],
}
assert_layout!(
    PollUpdateSqe,
    size = 64,
    align = 8,
    opcode = 0,
    flags = 1,
    ioprio = 2,
    fd = 4,
    off = 8,
    addr = 16,
    len = 24,
    poll32_events = 28,
    user_data = 32,
    rest = 40
);
const _: () = assert!(std::mem::size_of::<squeue::Entry>() == 64);
// And the kernel's own `struct io_uring_sqe` (linux-raw-sys): the unions' members start at
// the union's offset.
crate::sys::kernel_abi::same_layout!(
    PollUpdateSqe,
    linux_raw_sys::io_uring::io_uring_sqe,
    opcode => opcode,
    flags => flags,
    ioprio => ioprio,
    fd => fd,
    off => __bindgen_anon_1,
    addr => __bindgen_anon_2,
    len => len,
    poll32_events => __bindgen_anon_3,
    user_data => user_data,
    rest => __bindgen_anon_4,
);

/// What a `POLL_UPDATE` changes in the armed poll it targets.
#[derive(Debug, Clone, Copy)]
pub struct PollUpdate {
    /// Key of the armed poll.
    pub target: Key,
    /// New event mask (`None` keeps the old one).
    pub events: Option<u32>,
    /// New key for the poll's future completions (`None` keeps it).
    pub new_user_data: Option<Key>,
    /// Whether the updated poll is multishot (only used when `events` is set).
    pub multishot: bool,
}

impl<C: cqueue::EntryMarker> Ring<C> {
    /// Queues a `POLL_ADD` on `fd` for `events` (EPOLL* bits, incl. `EPOLLEXCLUSIVE`);
    /// `multishot` keeps it armed after each completion (CQEs carry `F_MORE` while it stays).
    pub fn poll_add(
        &mut self,
        fd: RawFd,
        events: u32,
        multishot: bool,
        user_data: Key,
    ) -> io::Result<()> {
        let e = opcode::PollAdd::new(types::Fd(fd), events)
            .multi(multishot)
            .build()
            .user_data(user_data.raw());
        // SAFETY: a poll request references no memory; only the descriptor number is used.
        unsafe { self.push(&e) }
    }

    /// Queues a `POLL_REMOVE` of the poll whose user_data is `target`. Its own completion
    /// (with `user_data`) is 0, or `-ENOENT` when the poll had already finished; the poll
    /// itself completes with `-ECANCELED`.
    pub fn poll_remove(&mut self, target: Key, user_data: Key) -> io::Result<()> {
        let e = opcode::PollRemove::new(target.raw())
            .build()
            .user_data(user_data.raw());
        // SAFETY: references no memory.
        unsafe { self.push(&e) }
    }

    /// Queues a `POLL_UPDATE` (Linux 5.13): re-arms the poll `u.target` in place with a new
    /// mask and/or user_data. Its own completion (`user_data`) is 0 on success or `-ENOENT`
    /// when the target had already finished (then nothing is armed: add a new poll).
    pub fn poll_update(&mut self, u: PollUpdate, user_data: Key) -> io::Result<()> {
        let mut len = 0;
        if u.events.is_some() {
            len |= IORING_POLL_UPDATE_EVENTS;
            if u.multishot {
                len |= IORING_POLL_ADD_MULTI;
            }
        }
        if u.new_user_data.is_some() {
            len |= IORING_POLL_UPDATE_USER_DATA;
        }
        let raw = PollUpdateSqe {
            opcode: opcode::PollRemove::CODE,
            flags: 0,
            ioprio: 0,
            fd: -1,
            off: u.new_user_data.map_or(0, Key::raw),
            addr: u.target.raw(),
            len,
            poll32_events: u.events.unwrap_or(0),
            user_data: user_data.raw(),
            rest: [0; 3],
        };
        // SAFETY: `squeue::Entry` is `#[repr(C)]` around `io_uring_sqe`, 64 bytes of plain
        // integers (size checked above) for which every bit pattern is valid; `raw` has the
        // kernel's field layout (checked by assert_layout!). The request references no memory.
        let e: squeue::Entry = unsafe { std::mem::transmute::<PollUpdateSqe, squeue::Entry>(raw) };
        // SAFETY: references no memory.
        unsafe { self.push(&e) }
    }

    /// Whether the kernel flags deferred completion work (`IORING_SQ_TASKRUN`, set with
    /// `TASKRUN_FLAG`): an `io_uring_enter` with GETEVENTS would post more completions.
    pub fn work_pending(&mut self) -> bool {
        let mut sq = self.ring.submission();
        sq.sync();
        sq.taskrun()
    }

    /// Submits what is queued and runs the kernel's deferred completion work without waiting
    /// and without a timer: `io_uring_enter(to_submit, 0, GETEVENTS)`. Unlike
    /// `submit_and_wait(n, Some(0))`, which arms an hrtimer and sleeps until it fires when
    /// fewer than `n` completions are ready, this returns at once; with `DEFER_TASKRUN` one
    /// call runs at most 20 deferred wake-ups (`IO_LOCAL_TW_DEFAULT_MAX`), so callers loop
    /// while [`Ring::work_pending`] says more are queued. With SQPOLL it falls back to
    /// `submit_and_wait(1, Some(0))`.
    pub fn get_events(&mut self) -> io::Result<()> {
        if self.sqpoll {
            self.submit_and_wait(1, Some(std::time::Duration::ZERO))?;
            return Ok(());
        }
        let pending = {
            let mut sq = self.ring.submission();
            sq.sync();
            sq.len()
        };
        self.enters += 1;
        // SAFETY: queued entries were pushed through `push`, whose contract covers the memory
        // they reference; no argument struct is passed.
        let r = unsafe {
            self.ring.submitter().enter::<libc::sigset_t>(
                pending as u32,
                0,
                io_uring::EnterFlags::GETEVENTS.bits(),
                None,
            )
        };
        match r {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::ETIME)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Queues an `ASYNC_CANCEL` of the request with user_data `target`.
    pub fn cancel(&mut self, target: Key, user_data: Key) -> io::Result<()> {
        let e = opcode::AsyncCancel::new(target.raw())
            .build()
            .user_data(user_data.raw());
        // SAFETY: references no memory.
        unsafe { self.push(&e) }
    }
}

//! The epoll backend: the kernel's epoll, used when io_uring is unavailable and as the
//! baseline. epoll's `data` carries the fd number; tokens live in a table, so the wake-up
//! eventfd of the user ring is told apart from any user token.

use super::{CtlError, Event};
use crate::buf::mpsc::MpscRing;
use crate::sys::epoll::{self as ep, EpollEvent};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

pub(super) struct EpollEvents {
    pub(super) epfd: OwnedFd,
    tokens: Vec<u64>,
    wake_fd: RawFd,
    buf: Vec<EpollEvent>,
    syscalls: u64,
    waits: u64,
}

fn ms(t: Option<Duration>) -> i32 {
    match t {
        None => -1,
        Some(d) => {
            let m = d.as_nanos().div_ceil(1_000_000);
            m.min(i32::MAX as u128) as i32
        }
    }
}

impl EpollEvents {
    pub(super) fn new(wake_fd: RawFd) -> io::Result<Self> {
        let epfd = ep::create()?;
        ep::ctl(
            epfd.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            wake_fd,
            (libc::EPOLLIN | libc::EPOLLET) as u32,
            wake_fd as u64,
        )?;
        Ok(Self {
            epfd,
            tokens: Vec::new(),
            wake_fd,
            buf: vec![ep::empty_event(); 256],
            syscalls: 2,
            waits: 0,
        })
    }

    fn ctl(&mut self, op: i32, fd: RawFd, events: u32, what: &'static str) -> Result<(), CtlError> {
        self.syscalls += 1;
        if fd == self.wake_fd {
            return Err(CtlError::Invalid("fd is the event ring's own descriptor"));
        }
        ep::ctl(self.epfd.as_raw_fd(), op, fd, events, fd as u64)
            .map_err(|e| CtlError::from_errno(e, fd, what))
    }

    fn set_token(&mut self, fd: RawFd, token: u64) {
        let i = fd as usize;
        if self.tokens.len() <= i {
            self.tokens.resize(i + 1, 0);
        }
        self.tokens[i] = token;
    }

    pub(super) fn add(&mut self, fd: RawFd, events: u32, token: u64) -> Result<(), CtlError> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events, "epoll_ctl ADD")?;
        self.set_token(fd, token);
        Ok(())
    }

    pub(super) fn modify(&mut self, fd: RawFd, events: u32, token: u64) -> Result<(), CtlError> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, events, "epoll_ctl MOD")?;
        self.set_token(fd, token);
        Ok(())
    }

    pub(super) fn delete(&mut self, fd: RawFd) -> Result<(), CtlError> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, "epoll_ctl DEL")
    }

    pub(super) fn wait(
        &mut self,
        out: &mut [Event],
        timeout: Option<Duration>,
        user: &MpscRing,
        block: bool,
    ) -> io::Result<usize> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let sleep = block && remaining != Some(Duration::ZERO) && user.prepare_sleep();
            let t = if sleep {
                remaining
            } else {
                Some(Duration::ZERO)
            };
            // Up to `out.len()` events per wait, as epoll_wait (the buffer grows to it, up
            // to 128 Ki events).
            let want = out.len().min(1 << 17);
            if self.buf.len() < want {
                self.buf.resize(want, ep::empty_event());
            }
            let max = out.len().min(self.buf.len());
            self.syscalls += 1;
            self.waits += 1;
            let r = ep::wait(self.epfd.as_raw_fd(), &mut self.buf[..max], ms(t));
            if sleep {
                user.end_sleep();
            }
            let k = r?;
            let mut n = 0;
            for ev in &self.buf[..k] {
                let fd = ev.u64 as RawFd;
                if fd == self.wake_fd {
                    continue;
                }
                out[n] = Event {
                    events: ev.events,
                    token: self.tokens.get(fd as usize).copied().unwrap_or(0),
                };
                n += 1;
            }
            if n > 0 || user.has_entries() || !block {
                return Ok(n);
            }
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    return Ok(0);
                }
            }
        }
    }

    pub(super) fn stats(&self) -> super::EventStats {
        super::EventStats {
            syscalls: self.syscalls,
            wait_entries: self.waits,
            ..Default::default()
        }
    }
}

//! The plain backend: level-triggered epoll and `recv(2)` into pooled buffers.

use super::{AcceptBackoff, Backend, ConnId, RxChunk, RxConfig, RxCounters, RxEvent, RxPath, Slab};
use crate::buf::lent::{HeapPool, Lent};
use crate::sys::net;
use crate::sys::poller::Poller;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::rc::Rc;
use std::time::Duration;

const LISTENER: u64 = u64::MAX;
/// Reads per connection per poll, so one busy connection cannot starve the others.
const READS_PER_TURN: usize = 16;

pub(crate) struct PlainRx {
    poller: Poller,
    listener: Option<TcpListener>,
    /// Accepting paused after EMFILE and the like (the listener is out of the epoll set).
    backoff: AcceptBackoff,
    conns: Slab<TcpStream>,
    pool: Rc<HeapPool>,
    max: usize,
    size: usize,
    ready: Vec<(u64, u32)>,
    /// Connections paused by the application (out of the epoll set).
    paused: std::collections::HashSet<ConnId>,
}

impl PlainRx {
    pub(crate) fn new(cfg: &RxConfig) -> io::Result<Self> {
        Ok(Self {
            poller: Poller::new(256)?,
            listener: None,
            backoff: AcceptBackoff::default(),
            conns: Slab::new(),
            pool: HeapPool::new(
                cfg.buf_size.max(1) as usize,
                usize::from(cfg.buffers).max(1),
            ),
            max: usize::from(cfg.buffers).max(1),
            size: cfg.buf_size.max(1) as usize,
            ready: Vec::new(),
            paused: std::collections::HashSet::new(),
        })
    }

    fn register(&mut self, s: TcpStream, c: &mut RxCounters) -> io::Result<ConnId> {
        s.set_nonblocking(true)?;
        let id = self.conns.insert(s);
        let s = self.conns.get_mut(id).expect("just inserted");
        c.epoll_calls += 1;
        c.syscalls += 1;
        if let Err(e) = self.poller.add(s, id.tag(), libc::EPOLLIN as u32) {
            self.conns.remove(id);
            return Err(e);
        }
        Ok(id)
    }

    fn drop_conn(&mut self, id: ConnId, c: &mut RxCounters) {
        if let Some(s) = self.conns.remove(id) {
            if !self.paused.remove(&id) {
                c.epoll_calls += 1;
                c.syscalls += 1;
                let _ = self.poller.delete(&s);
            }
        }
    }
}

impl Backend for PlainRx {
    fn notify_fd(&mut self) -> io::Result<std::os::fd::BorrowedFd<'_>> {
        // The epoll set itself: level-triggered, readable while a member socket is.
        Ok(std::os::fd::AsFd::as_fd(&self.poller))
    }
    fn clear_notify(&mut self) -> bool {
        false
    }
    fn path(&self) -> RxPath {
        RxPath::Plain
    }
    fn describe(&self) -> String {
        format!(
            "plain: epoll + recv into {} x {} B pooled buffers",
            self.max, self.size
        )
    }
    fn add(&mut self, stream: TcpStream, c: &mut RxCounters) -> io::Result<ConnId> {
        self.register(stream, c)
    }
    fn listen(&mut self, l: TcpListener) -> io::Result<()> {
        l.set_nonblocking(true)?;
        self.poller.add(&l, LISTENER, libc::EPOLLIN as u32)?;
        self.listener = Some(l);
        Ok(())
    }
    fn close(&mut self, conn: ConnId, c: &mut RxCounters) {
        self.drop_conn(conn, c);
    }
    fn open(&self) -> usize {
        self.conns.len()
    }
    fn socket(&self, conn: ConnId) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.conns.get(conn).map(|s| s.as_fd())
    }
    fn pause(&mut self, conn: ConnId, c: &mut RxCounters) {
        if let Some(s) = self.conns.get_mut(conn) {
            if self.paused.insert(conn) {
                c.epoll_calls += 1;
                c.syscalls += 1;
                let _ = self.poller.delete(s);
            }
        }
    }
    fn set_wait(&mut self, batch: usize, _min_wait: Duration) -> bool {
        // Readiness waits return with whatever is ready; there is nothing to gather.
        batch <= 1
    }
    fn resume(&mut self, conn: ConnId, c: &mut RxCounters) -> io::Result<()> {
        if let Some(s) = self.conns.get_mut(conn) {
            if self.paused.remove(&conn) {
                c.epoll_calls += 1;
                c.syscalls += 1;
                self.poller.add(s, conn.tag(), libc::EPOLLIN as u32)?;
            }
        }
        Ok(())
    }

    fn poll(
        &mut self,
        timeout: Duration,
        c: &mut RxCounters,
        f: &mut dyn FnMut(RxEvent),
    ) -> io::Result<usize> {
        if self.pool.out() >= self.max {
            // Every buffer is lent: read nothing until chunks come back (backpressure).
            c.backpressure_waits += 1;
            return Ok(0);
        }
        if self.backoff.due() {
            if let Some(l) = &self.listener {
                c.epoll_calls += 1;
                c.syscalls += 1;
                self.poller.add(l, LISTENER, libc::EPOLLIN as u32)?;
            }
        }
        let timeout = self.backoff.cap(timeout);
        let ready = &mut self.ready;
        ready.clear();
        c.epoll_calls += 1;
        c.syscalls += 1;
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        self.poller.wait(ms, |t, e| ready.push((t, e)))?;
        let mut events = 0;
        let ready = std::mem::take(&mut self.ready);
        for &(token, _) in &ready {
            if token == LISTENER {
                while let Some(l) = &self.listener {
                    c.syscalls += 1;
                    match l.accept() {
                        Ok((s, _)) => {
                            self.backoff.reset();
                            let id = self.register(s, c)?;
                            c.accepted += 1;
                            f(RxEvent::Accepted(id));
                            events += 1;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if self.backoff.on_error(e.raw_os_error().unwrap_or(0), c) => {
                            // Level-triggered: the listener stays readable while the queue
                            // holds connections, so it leaves the epoll set until the pause
                            // ends.
                            c.epoll_calls += 1;
                            c.syscalls += 1;
                            self.poller.delete(l)?;
                            break;
                        }
                        // A connection that died in the queue (ECONNABORTED) and the like:
                        // the next one may be fine.
                        Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                        Err(e) => return Err(e),
                    }
                }
                continue;
            }
            let id = ConnId::from_tag(token);
            for _ in 0..READS_PER_TURN {
                let Some(s) = self.conns.get_mut(id) else {
                    break;
                };
                let Some(mut buf) = self.pool.take() else {
                    c.backpressure_waits += 1;
                    break;
                };
                c.recv_calls += 1;
                c.syscalls += 1;
                match net::recv(s, &mut buf, 0) {
                    Ok(0) => {
                        self.pool.give(buf);
                        self.drop_conn(id, c);
                        f(RxEvent::Closed(id, None));
                        events += 1;
                        break;
                    }
                    Ok(n) => {
                        let full = n == buf.len();
                        c.bytes += n as u64;
                        c.chunks += 1;
                        f(RxEvent::Data(RxChunk {
                            conn: id,
                            path: RxPath::Plain,
                            data: Lent::Heap(self.pool.lend(buf, n)),
                        }));
                        events += 1;
                        if !full {
                            // Short read: the socket is drained (level-triggered epoll
                            // reports it again if more arrived meanwhile).
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.pool.give(buf);
                        break;
                    }
                    Err(e) => {
                        self.pool.give(buf);
                        self.drop_conn(id, c);
                        f(RxEvent::Closed(id, Some(e)));
                        events += 1;
                        break;
                    }
                }
            }
        }
        self.ready = ready;
        Ok(events)
    }
}

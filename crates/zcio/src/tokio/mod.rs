//! Async I/O for tokio: byte streams on one send ring and one receiver per thread
//! ([`LocalIo`], [`TcpStream`]: tokio's `AsyncRead` + `AsyncWrite`, so hyper, tonic and the
//! tokio-util codecs run on them), and adapters for each capability built on its readiness
//! descriptor ([`AsyncSender`], [`AsyncSendRing`], [`AsyncReceiver`], [`AsyncNfQueue`],
//! [`AsyncNfLog`], [`AsyncCtEvents`], [`AsyncAudit`]) with [`tokio::io::unix::AsyncFd`].
//!
//! The rings are `SINGLE_ISSUER` (only the creating thread may enter them), so these types
//! are not `Send`: run them in a `LocalSet` (a task per connection with `spawn_local`), on
//! one current-thread runtime per core for a server that scales, or in the future given to
//! `Runtime::block_on`. Readiness per backend and task-run mode: the design note
//! `docs/design/async.md` in the repository.
//!
//! # Quick start: an echo server
//!
//! ```no_run
//! use tokio::io::AsyncWriteExt;
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> std::io::Result<()> {
//!     let local = tokio::task::LocalSet::new();
//!     local.run_until(async {
//!         let io = zcio::tokio::LocalIo::new()?; // this thread's send ring and receiver
//!         let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//!         loop {
//!             let (s, _) = listener.accept().await?;
//!             let stream = io.from_tokio(s)?; // no ring per connection
//!             tokio::task::spawn_local(async move {
//!                 let (mut r, mut w) = stream.into_split();
//!                 let _ = tokio::io::copy(&mut r, &mut w).await;
//!                 let _ = w.shutdown().await; // the peer reads its end of stream at once
//!             });
//!         }
//!     }).await
//! }
//! ```
//!
//! # A server that scales: one runtime, one `LocalIo` per core
//!
//! Each thread runs a current-thread runtime with a `LocalSet`, its own [`LocalIo`] (one
//! send ring, one receiver, one send pool) and its own listener on the same port
//! (`SO_REUSEPORT`, so the kernel spreads the connections); a task per connection; a watch
//! channel asks every thread to stop accepting, and each waits for its connections to end.
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use tokio::sync::watch;
//!
//! fn serve_thread(addr: SocketAddr, mut stop: watch::Receiver<bool>) -> std::io::Result<()> {
//!     let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//!     let local = tokio::task::LocalSet::new();
//!     local.block_on(&rt, async move {
//!         let io = zcio::tokio::LocalIo::new()?;
//!         let sock = tokio::net::TcpSocket::new_v4()?;
//!         sock.set_reuseport(true)?;
//!         sock.bind(addr)?;
//!         let listener = sock.listen(1024)?;
//!         let mut conns = Vec::new();
//!         loop {
//!             tokio::select! {
//!                 _ = stop.changed() => break,
//!                 accepted = listener.accept() => {
//!                     let (s, _) = accepted?;
//!                     let mut stream = io.from_tokio(s)?;
//!                     conns.push(tokio::task::spawn_local(async move {
//!                         let mut req = [0u8; 4096];
//!                         while let Ok(n) = stream.read(&mut req).await {
//!                             if n == 0 {
//!                                 break;
//!                             }
//!                             let body = bytes::Bytes::from_static(b"hello\n");
//!                             if stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\n").await.is_err()
//!                                 || stream.send_bytes(body).await.is_err()
//!                             {
//!                                 break;
//!                             }
//!                         }
//!                         let _ = stream.shutdown().await;
//!                     }));
//!                 }
//!             }
//!         }
//!         // Graceful: no new connections; the open ones finish.
//!         for c in conns {
//!             let _ = c.await;
//!         }
//!         Ok(())
//!     })
//! }
//!
//! fn main() -> std::io::Result<()> {
//!     let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
//!     let (stop_tx, stop_rx) = watch::channel(false);
//!     let threads: Vec<_> = (0..std::thread::available_parallelism()?.get())
//!         .map(|_| {
//!             let stop = stop_rx.clone();
//!             std::thread::spawn(move || serve_thread(addr, stop))
//!         })
//!         .collect();
//!     std::thread::sleep(std::time::Duration::from_secs(60)); // or wait for a signal
//!     let _ = stop_tx.send(true);
//!     for t in threads {
//!         t.join().unwrap()?;
//!     }
//!     Ok(())
//! }
//! ```
//!
//! Why no `Send` handle: a stream's every call (copying into a pool buffer, queueing the
//! send, taking received chunks) touches the thread's rings, which only that thread may
//! enter. A `Send` handle would forward each call to the owning thread through a channel and
//! a wake-up of that thread: two cross-thread hand-offs per read or write, more than the
//! syscall it saves. Per-thread runtimes are how tokio-uring, monoio and glommio scale too.
//!
//! # The capability adapters
//!
//! One socket, one [`Sender`] with its own ring ([`AsyncSender`]; `stream` is a connected
//! `std::net::TcpStream`: a tokio stream gives its with `into_std()?`):
//!
//! ```no_run
//! # async fn demo(stream: std::net::TcpStream) -> Result<(), Box<dyn std::error::Error>> {
//! use zcio::tx::TxMode;
//! use zcio::{Pool, Sender, SenderConfig};
//! let pool = Pool::new(64 << 10, 16, false)?;
//! let mut tx = zcio::tokio::AsyncSender::new(Sender::new(
//!     stream,
//!     &pool,
//!     SenderConfig::new(TxMode::Auto),
//! )?)?;
//! let mut buf = pool.try_get().expect("a free buffer");
//! buf.set_len(5);
//! buf.copy_from_slice(b"hello");
//! let (done, buf) = tx.send(buf).await?; // a failed send is an Err, with the buffer
//! assert_eq!(done.result().ok(), Some(5));
//! tx.shutdown().await?; // after the last completion; the peer reads end of stream at once
//! # drop(buf); Ok(()) }
//! ```
//!
//! Many sockets on one ring ([`AsyncSendRing`]): a send that meets backpressure waits for
//! the ring's readiness instead of the thread.
//!
//! ```no_run
//! # async fn demo(streams: Vec<std::net::TcpStream>) -> Result<(), Box<dyn std::error::Error>> {
//! use zcio::tx::{Pool, SendRing, SendRingConfig, SenderConfig, TxMode};
//! let pool = Pool::new(16 << 10, 256, false)?;
//! let mut ring = SendRing::new(&SendRingConfig::default())?;
//! let _ = ring.register_pool(&pool);
//! let mut socks = Vec::new();
//! for s in streams {
//!     socks.push(ring.add(s, &SenderConfig::new(TxMode::Auto))?);
//! }
//! let mut tx = zcio::tokio::AsyncSendRing::new(ring)?;
//! for &sock in &socks {
//!     let buf = pool.try_get().expect("a free buffer");
//!     tx.send(sock, buf).await.map_err(|(e, _buf)| e)?;
//! }
//! tx.flush().await?;
//! while let Some((done, buf)) = tx.next_completion().await? {
//!     assert!(done.result().is_ok());
//!     drop(buf);
//! }
//! # Ok(()) }
//! ```

mod stream;

pub use stream::{LocalIo, LocalIoConfig, OwnedReadHalf, OwnedWriteHalf, TcpStream};

use crate::buf::pool::PoolBuf;
use crate::netlink::nfqmsg::Packet;
use crate::netlink::{
    Audit, AuditError, AuditEvent, CtError, CtEvent, CtEvents, Decision, LogPacket, NfLog,
    NfLogError, NfQueue, NfqError,
};
use crate::rx::{Receiver, RxError, RxEvent};
use crate::tx::{Completion, Dest, SendRing, Sender, SockId, Ticket, TxBuf, TxError};
use ::tokio::io::unix::AsyncFd;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

/// The reactor's own duplicate of an object's readiness descriptor.
type Borrowed = OwnedFd;

/// Registers a duplicate of `fd` with the current runtime's reactor; an error (not tokio's
/// panic) outside a runtime.
fn register(fd: BorrowedFd<'_>) -> io::Result<AsyncFd<OwnedFd>> {
    in_runtime()?;
    crate::sys::ready::tokio_register(fd)
}

/// `Ok` inside a tokio runtime; the error a constructor returns outside one.
pub(crate) fn in_runtime() -> io::Result<()> {
    ::tokio::runtime::Handle::try_current()
        .map(drop)
        .map_err(|e| {
            io::Error::other(format!(
                "zcio::tokio needs a tokio runtime with I/O enabled (#[tokio::main], \
             Runtime::block_on, a LocalSet): {e}"
            ))
        })
}

/// A send the kernel failed, or a failure of the ring that carried it.
#[derive(Debug, thiserror::Error)]
pub enum SendFailure<B: std::fmt::Debug> {
    /// The send failed (a reset connection, a broken pipe, ...): its completion, whose
    /// [`Completion::error`] says why, and the buffer back.
    #[error("{}", .completion.error.as_ref().map_or_else(|| "send failed".to_string(), |e| e.to_string()))]
    Failed {
        /// The completion, with its error.
        completion: Completion,
        /// The buffer, back from the kernel.
        buf: B,
    },
    /// Driving the ring or waiting on its readiness failed.
    #[error(transparent)]
    Tx(#[from] TxError),
}

impl<B: std::fmt::Debug> SendFailure<B> {
    /// The buffer, if the kernel handed it back.
    pub fn into_buf(self) -> Option<B> {
        match self {
            SendFailure::Failed { buf, .. } => Some(buf),
            SendFailure::Tx(_) => None,
        }
    }

    /// The [`io::ErrorKind`]: the send error's errno's kind, or the ring error's.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            SendFailure::Failed { completion, .. } => {
                completion.error.as_ref().map_or(io::ErrorKind::Other, |e| {
                    io::Error::from_raw_os_error(e.errno()).kind()
                })
            }
            SendFailure::Tx(e) => e.kind(),
        }
    }
}

/// For `?` in functions returning `io::Result`; the kind is kept ([`SendFailure::kind`]).
impl<B: std::fmt::Debug + Send + Sync + 'static> From<SendFailure<B>> for io::Error {
    fn from(e: SendFailure<B>) -> Self {
        io::Error::new(e.kind(), e)
    }
}

fn tx_io(e: io::Error) -> TxError {
    TxError::Socket {
        what: "waiting on the sender's readiness descriptor".into(),
        source: e,
    }
}

/// A [`Sender`] for async code: `send(buf).await` gives the buffer back with its
/// completion; `start` + `next_completion` keep many sends in flight.
#[derive(Debug)]
pub struct AsyncSender {
    fd: AsyncFd<Borrowed>,
    tx: Sender,
    /// Completions taken while looking for another ticket's.
    stash: VecDeque<(Completion, PoolBuf)>,
}

impl AsyncSender {
    /// Registers the sender's readiness descriptor with the current runtime's reactor
    /// (call from inside a runtime; outside one this is an error, not a panic).
    pub fn new(mut tx: Sender) -> Result<Self, TxError> {
        let fd = register(tx.readiness_fd()?).map_err(tx_io)?;
        // tokio watches the descriptor edge-triggered: no eventfd read per harvest.
        tx.set_edge_readiness(true)?;
        Ok(Self {
            fd,
            tx,
            stash: VecDeque::new(),
        })
    }

    /// The sender.
    pub fn get_ref(&self) -> &Sender {
        &self.tx
    }

    /// The sender, for its counters and settings (harvesting through it directly is fine:
    /// it keeps its descriptor honest).
    pub fn get_mut(&mut self) -> &mut Sender {
        &mut self.tx
    }

    /// Waits on the descriptor once and harvests.
    async fn wait_ready(&mut self) -> Result<(), TxError> {
        // Queued requests must be in the kernel before anything can fire.
        self.tx.poll()?;
        if self.tx.ready() > 0 {
            return Ok(());
        }
        // Nothing can wake us for sends stuck in an abandoned ring.
        self.tx.check_stuck()?;
        let mut guard = self.fd.readable().await.map_err(tx_io)?;
        self.tx.on_ready()?;
        // on_ready left the descriptor readable only for later events, which signal anew.
        guard.clear_ready();
        Ok(())
    }

    /// Hands `buf` to the kernel, first waiting (without blocking the thread) while the
    /// sender refuses it (`depth` sends in flight, or a full socket buffer on the syscall
    /// paths). Its completion comes from [`AsyncSender::next_completion`].
    pub async fn start(&mut self, mut buf: PoolBuf) -> Result<Ticket, TxError> {
        loop {
            match self.tx.send(buf) {
                Ok(t) => return Ok(t),
                Err(r) => {
                    buf = r.buf;
                    self.wait_ready().await?;
                    while let Some(c) = self.tx.next_completion() {
                        self.stash.push_back(c);
                    }
                }
            }
        }
    }

    /// The next completion (any ticket), waiting for it; `None` when nothing is in flight
    /// and nothing is left to take.
    pub async fn next_completion(&mut self) -> Result<Option<(Completion, PoolBuf)>, TxError> {
        loop {
            if let Some(c) = self.stash.pop_front() {
                return Ok(Some(c));
            }
            if let Some(c) = self.tx.next_completion() {
                return Ok(Some(c));
            }
            if self.tx.in_flight() == 0 {
                self.tx.poll()?;
                return Ok(self.tx.next_completion());
            }
            self.wait_ready().await?;
        }
    }

    /// Sends `buf` and waits for its own completion; completions of other sends met on the
    /// way stay for [`AsyncSender::next_completion`]. A send the kernel failed (a reset, a
    /// broken pipe) is an `Err` ([`SendFailure::Failed`]) with its completion and the buffer.
    pub async fn send(
        &mut self,
        buf: PoolBuf,
    ) -> Result<(Completion, PoolBuf), SendFailure<PoolBuf>> {
        let t = self.start(buf).await?;
        let (completion, buf) = loop {
            if let Some(i) = self.stash.iter().position(|(c, _)| c.ticket == t) {
                break self.stash.remove(i).expect("stashed");
            }
            let mut mine = None;
            while let Some(c) = self.tx.next_completion() {
                if c.0.ticket == t {
                    mine = Some(c);
                    break;
                }
                self.stash.push_back(c);
            }
            if let Some(c) = mine {
                break c;
            }
            self.wait_ready().await?;
        };
        if completion.error.is_some() {
            return Err(SendFailure::Failed { completion, buf });
        }
        Ok((completion, buf))
    }

    /// Waits for every send in flight ([`AsyncSender::flush`]), then shuts the sending
    /// direction down (`shutdown(2)`, `SHUT_WR`): the peer reads its end of stream right
    /// after the last byte. The completions stay to be taken.
    pub async fn shutdown(&mut self) -> Result<(), TxError> {
        self.flush().await?;
        self.tx.shutdown_now(std::net::Shutdown::Write)
    }

    /// Waits until every send has completed; their completions stay to be taken.
    pub async fn flush(&mut self) -> Result<(), TxError> {
        while self.tx.in_flight() > 0 {
            self.wait_ready().await?;
            while let Some(c) = self.tx.next_completion() {
                self.stash.push_back(c);
            }
        }
        Ok(())
    }
}

/// A [`SendRing`] for async code: `send(sock, buf).await` waits for room (backpressure)
/// without blocking the thread; completions of every socket come from
/// [`AsyncSendRing::next_completion`].
#[derive(Debug)]
pub struct AsyncSendRing {
    fd: AsyncFd<Borrowed>,
    ring: SendRing,
}

impl AsyncSendRing {
    /// Registers the ring's readiness descriptor with the current runtime's reactor (call
    /// from inside a runtime; outside one this is an error, not a panic).
    pub fn new(mut ring: SendRing) -> Result<Self, TxError> {
        let fd = register(ring.readiness_fd()?).map_err(tx_io)?;
        // tokio watches the descriptor edge-triggered: no eventfd read per harvest.
        ring.set_edge_readiness(true)?;
        Ok(Self { fd, ring })
    }

    /// The ring.
    pub fn get_ref(&self) -> &SendRing {
        &self.ring
    }

    /// The ring (to add and close sockets, read counters).
    pub fn get_mut(&mut self) -> &mut SendRing {
        &mut self.ring
    }

    /// Waits on the descriptor once and harvests.
    async fn wait_ready(&mut self) -> Result<(), TxError> {
        // Queued requests must be in the kernel before anything can fire.
        self.ring.poll()?;
        if self.ring.ready() > 0 {
            return Ok(());
        }
        self.ring.check_stuck()?;
        let mut guard = self.fd.readable().await.map_err(tx_io)?;
        self.ring.on_ready()?;
        guard.clear_ready();
        Ok(())
    }

    /// Sends `buf` on `sock`, waiting (without blocking the thread) while the socket refuses
    /// it for backpressure; the completion comes from [`AsyncSendRing::next_completion`]. On
    /// an error (a closed socket, a failed ring) the buffer comes back with it.
    pub async fn send(
        &mut self,
        sock: SockId,
        buf: impl Into<TxBuf>,
    ) -> Result<Ticket, (TxError, TxBuf)> {
        self.send_inner(sock, buf.into(), None).await
    }

    /// [`SendRing::send_to_with`]: `buf` as one datagram train to `dest` on an unconnected
    /// UDP socket, waiting (without blocking the thread) while the socket refuses it for
    /// backpressure. Errors of the send itself (an unreachable peer) are in its completion.
    pub async fn send_to(
        &mut self,
        sock: SockId,
        buf: impl Into<TxBuf>,
        dest: &Dest,
    ) -> Result<Ticket, (TxError, TxBuf)> {
        self.send_inner(sock, buf.into(), Some(dest)).await
    }

    async fn send_inner(
        &mut self,
        sock: SockId,
        mut buf: TxBuf,
        dest: Option<&Dest>,
    ) -> Result<Ticket, (TxError, TxBuf)> {
        loop {
            let res = match dest {
                Some(d) => self.ring.send_to_with(sock, buf, d, 0),
                None => self.ring.send(sock, buf),
            };
            match res {
                Ok(t) => return Ok(t),
                Err(r) if r.reason.is_backpressure() => {
                    buf = r.buf;
                    if let Err(e) = self.wait_ready().await {
                        return Err((e, buf));
                    }
                }
                Err(r) => {
                    let e = TxError::Socket {
                        what: format!("sending on {sock}"),
                        source: io::Error::from_raw_os_error(r.reason.errno()),
                    };
                    return Err((e, r.buf));
                }
            }
        }
    }

    /// The next completion (any socket), waiting for one; `None` when nothing is in flight
    /// and nothing is left to take.
    pub async fn next_completion(&mut self) -> Result<Option<(Completion, TxBuf)>, TxError> {
        loop {
            if let Some(c) = self.ring.next_completion() {
                return Ok(Some(c));
            }
            if self.ring.in_flight() == 0 {
                self.ring.poll()?;
                return Ok(self.ring.next_completion());
            }
            self.wait_ready().await?;
        }
    }

    /// Waits until every send of every socket has completed; the completions stay to be
    /// taken.
    pub async fn flush(&mut self) -> Result<(), TxError> {
        while self.ring.in_flight() > 0 {
            self.wait_ready().await?;
        }
        Ok(())
    }

    /// Waits until every send of `sock` has completed, then shuts its sending direction down
    /// (`shutdown(2)`, `SHUT_WR`): the peer reads its end of stream right after the last
    /// byte. The socket stays on the ring (for its completions) until
    /// [`SendRing::close`]; completions of every socket met on the way stay to be taken.
    pub async fn shutdown(&mut self, sock: SockId) -> Result<(), TxError> {
        while self.ring.sock_in_flight(sock) > 0 {
            self.wait_ready().await?;
        }
        self.ring.shutdown(sock, std::net::Shutdown::Write)
    }
}

/// A [`Receiver`] for async code: [`AsyncReceiver::next_event`] awaits accepted
/// connections, chunks and closes in the receiver's order.
#[derive(Debug)]
pub struct AsyncReceiver {
    fd: AsyncFd<Borrowed>,
    rx: Receiver,
    queue: VecDeque<RxEvent>,
}

impl AsyncReceiver {
    /// Registers the receiver's readiness descriptor with the current runtime's reactor
    /// (call from inside a runtime; outside one this is an error).
    pub fn new(mut rx: Receiver) -> Result<Self, RxError> {
        let fd = register(rx.readiness_fd()?)?;
        // tokio watches the descriptor edge-triggered: no eventfd read per harvest.
        rx.set_edge_readiness();
        Ok(Self {
            fd,
            rx,
            queue: VecDeque::new(),
        })
    }

    /// The receiver.
    pub fn get_ref(&self) -> &Receiver {
        &self.rx
    }

    /// The receiver (to add or close connections).
    pub fn get_mut(&mut self) -> &mut Receiver {
        &mut self.rx
    }

    /// The next event, waiting for one.
    pub async fn next_event(&mut self) -> io::Result<RxEvent> {
        loop {
            if let Some(ev) = self.queue.pop_front() {
                return Ok(ev);
            }
            let q = &mut self.queue;
            // Harvest before waiting: a receive armed just now may already have data, and
            // the ring backends arm receives of new connections on this call.
            self.rx.on_ready(&mut |ev| q.push_back(ev))?;
            if !self.queue.is_empty() {
                continue;
            }
            let mut guard = self.fd.readable().await?;
            let q = &mut self.queue;
            self.rx.on_ready(&mut |ev| q.push_back(ev))?;
            guard.clear_ready();
        }
    }

    /// The next chunk of data (skipping accepts), or `None` once a connection closed (its
    /// [`RxEvent::Closed`] is dropped): for a receiver with one connection, a byte stream.
    pub async fn recv(&mut self) -> io::Result<Option<crate::rx::RxChunk>> {
        loop {
            match self.next_event().await? {
                RxEvent::Data(c) => return Ok(Some(c)),
                RxEvent::Closed(..) => return Ok(None),
                RxEvent::Accepted(_) => {}
            }
        }
    }
}

/// An [`NfQueue`] for async code: [`AsyncNfQueue::process`] waits for packets and decides
/// them with the caller's closure.
#[derive(Debug)]
pub struct AsyncNfQueue {
    fd: AsyncFd<Borrowed>,
    q: NfQueue,
}

impl AsyncNfQueue {
    /// Registers the queue's readiness descriptor with the current runtime's reactor.
    pub fn new(mut q: NfQueue) -> Result<Self, NfqError> {
        let fd = register(q.readiness_fd()?).map_err(|source| NfqError::Socket {
            what: "registering the NFQUEUE readiness descriptor with tokio".into(),
            source,
        })?;
        // tokio watches the descriptor edge-triggered: no eventfd read per harvest.
        q.set_edge_readiness(true);
        Ok(Self { fd, q })
    }

    /// The queue.
    pub fn get_ref(&self) -> &NfQueue {
        &self.q
    }

    /// The queue (for held packets and their verdicts).
    pub fn get_mut(&mut self) -> &mut NfQueue {
        &mut self.q
    }

    /// Waits until packets are there, hands each to `f` in id order and sends the verdicts
    /// (as [`NfQueue::process`] does). Returns the number handled (at least one).
    pub async fn process<F>(&mut self, mut f: F) -> Result<usize, NfqError>
    where
        F: FnMut(&Packet<'_>) -> Decision,
    {
        let q = &mut self.q;
        until_some(
            &self.fd,
            || q.on_ready(&mut f),
            |source| NfqError::Socket {
                what: "waiting on the NFQUEUE readiness descriptor".into(),
                source,
            },
        )
        .await
    }
}

/// The loop every netlink adapter runs: handle what is ready (`poll`, a non-blocking
/// `on_ready`), and while it handled nothing, wait on the readiness descriptor and look again.
/// Returns the count of the first call that handled something.
async fn until_some<E>(
    fd: &AsyncFd<Borrowed>,
    mut poll: impl FnMut() -> Result<usize, E>,
    io_err: impl Fn(io::Error) -> E,
) -> Result<usize, E> {
    loop {
        let n = poll()?;
        if n > 0 {
            return Ok(n);
        }
        let mut guard = fd.readable().await.map_err(&io_err)?;
        let n = poll()?;
        // `on_ready` left the descriptor readable only for later events, which signal anew.
        guard.clear_ready();
        if n > 0 {
            return Ok(n);
        }
    }
}

/// An [`NfLog`] for async code: [`AsyncNfLog::process`] waits for logged packets and hands
/// them to the caller's closure.
#[derive(Debug)]
pub struct AsyncNfLog {
    fd: AsyncFd<Borrowed>,
    log: NfLog,
}

impl AsyncNfLog {
    /// Registers the consumer's readiness descriptor with the current runtime's reactor.
    pub fn new(mut log: NfLog) -> Result<Self, NfLogError> {
        let fd = register(log.readiness_fd()?).map_err(|source| NfLogError::Socket {
            what: "registering the NFLOG readiness descriptor with tokio".into(),
            source,
        })?;
        // tokio watches the descriptor edge-triggered: no eventfd read per harvest.
        log.set_edge_readiness(true);
        Ok(Self { fd, log })
    }

    /// The consumer (counters, path, fallbacks).
    pub fn get_ref(&self) -> &NfLog {
        &self.log
    }

    /// The consumer.
    pub fn get_mut(&mut self) -> &mut NfLog {
        &mut self.log
    }

    /// The consumer back (to [`NfLog::close`] it), its descriptor fit for any watcher again.
    pub fn into_inner(mut self) -> NfLog {
        self.log.set_edge_readiness(false);
        self.log
    }

    /// Waits until packets are there and hands each to `f` in arrival order (as
    /// [`NfLog::process`] does). Returns the number handled (at least one).
    pub async fn process<F>(&mut self, mut f: F) -> Result<usize, NfLogError>
    where
        F: FnMut(&LogPacket<'_>),
    {
        let log = &mut self.log;
        until_some(
            &self.fd,
            || log.on_ready(&mut f),
            |source| NfLogError::Socket {
                what: "waiting on the NFLOG readiness descriptor".into(),
                source,
            },
        )
        .await
    }
}

/// A [`CtEvents`] for async code: [`AsyncCtEvents::process`] waits for conntrack events and
/// hands them to the caller's closure.
#[derive(Debug)]
pub struct AsyncCtEvents {
    fd: AsyncFd<Borrowed>,
    ev: CtEvents,
}

impl AsyncCtEvents {
    /// Registers the subscriber's readiness descriptor with the current runtime's reactor.
    pub fn new(mut ev: CtEvents) -> Result<Self, CtError> {
        let fd = register(ev.readiness_fd()?).map_err(|source| CtError::Socket {
            what: "registering the conntrack events readiness descriptor with tokio".into(),
            source,
        })?;
        // tokio watches the descriptor edge-triggered: no eventfd read per harvest.
        ev.set_edge_readiness(true);
        Ok(Self { fd, ev })
    }

    /// The subscriber (counters, path, fallbacks).
    pub fn get_ref(&self) -> &CtEvents {
        &self.ev
    }

    /// The subscriber.
    pub fn get_mut(&mut self) -> &mut CtEvents {
        &mut self.ev
    }

    /// Waits until events are there and hands each to `f` in arrival order (as
    /// [`CtEvents::process`] does). Returns the number handled (at least one).
    pub async fn process<F>(&mut self, mut f: F) -> Result<usize, CtError>
    where
        F: FnMut(&CtEvent<'_>),
    {
        let ev = &mut self.ev;
        until_some(
            &self.fd,
            || ev.on_ready(&mut f),
            |source| CtError::Socket {
                what: "waiting on the conntrack events readiness descriptor".into(),
                source,
            },
        )
        .await
    }
}

/// An [`Audit`] consumer for async code: [`AsyncAudit::process`] waits for audit events and
/// hands them to the caller's closure.
///
/// An event whose end-of-event record does not come closes after the consumer's
/// [`event_wait`](crate::netlink::AuditConfig::event_wait): while such an event is open,
/// `process` waits on a tokio timer too, so the runtime needs its time driver (as
/// `#[tokio::main]` and `Builder::enable_all` give).
#[derive(Debug)]
pub struct AsyncAudit {
    fd: AsyncFd<Borrowed>,
    audit: Audit,
}

impl AsyncAudit {
    /// Registers the consumer's readiness descriptor with the current runtime's reactor.
    pub fn new(mut audit: Audit) -> Result<Self, AuditError> {
        let fd = register(audit.readiness_fd()?).map_err(|source| AuditError::Socket {
            what: "registering the audit readiness descriptor with tokio".into(),
            source,
        })?;
        // tokio watches the descriptor edge-triggered: no eventfd read per harvest.
        audit.set_edge_readiness(true);
        Ok(Self { fd, audit })
    }

    /// The consumer (mode, path, fallbacks).
    pub fn get_ref(&self) -> &Audit {
        &self.audit
    }

    /// The consumer (counters, [`Audit::flush`], [`Audit::unregister`]).
    pub fn get_mut(&mut self) -> &mut Audit {
        &mut self.audit
    }

    /// The consumer back, its descriptor fit for any watcher again.
    pub fn into_inner(mut self) -> Audit {
        self.audit.set_edge_readiness(false);
        self.audit
    }

    /// Waits until events complete and hands each to `f` in the order they completed (as
    /// [`Audit::process`] does). Returns the number handled (at least one).
    pub async fn process<F>(&mut self, mut f: F) -> Result<usize, AuditError>
    where
        F: FnMut(&AuditEvent),
    {
        let io_err = |source| AuditError::Socket {
            what: "waiting on the audit readiness descriptor".into(),
            source,
        };
        loop {
            let n = self.audit.on_ready(&mut f)?;
            if n > 0 {
                return Ok(n);
            }
            // Looked at again after every readiness round: a record that opened an event (one
            // whose end-of-event record may never come) arms the timer for its close.
            let ready = match self.audit.next_close() {
                None => Some(self.fd.readable().await),
                Some(wait) => ::tokio::time::timeout(wait, self.fd.readable()).await.ok(),
            };
            // `None`: the wait ended; `on_ready` above closes the event.
            if let Some(guard) = ready {
                let mut guard = guard.map_err(io_err)?;
                let n = self.audit.on_ready(&mut f)?;
                // `on_ready` left the descriptor readable only for later events, which
                // signal anew.
                guard.clear_ready();
                if n > 0 {
                    return Ok(n);
                }
            }
        }
    }
}

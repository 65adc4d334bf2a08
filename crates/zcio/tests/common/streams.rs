//! Pattern streams into a `Receiver`: senders, per-connection checkers, socket options.

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};
use zcio::rx::{ConnId, Receiver, RxChunk, RxConfig, RxEvent, RxPath};

/// Sends an 8-byte header with the stream's pattern base, then `len` pattern bytes.
pub fn send_stream(
    addr: SocketAddr,
    base: u64,
    len: u64,
    write: usize,
) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(addr)?;
    s.write_all(&base.to_le_bytes())?;
    let mut buf = vec![0u8; write];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(write as u64) as usize;
        super::fill_pattern(&mut buf[..n], base + off);
        s.write_all(&buf[..n])?;
        off += n as u64;
    }
    Ok(s)
}

/// Per-connection checker: header, then the pattern in order.
#[derive(Default)]
pub struct Stream {
    pub header: Vec<u8>,
    pub base: u64,
    pub got: u64,
}

impl Stream {
    pub fn eat(&mut self, mut data: &[u8]) {
        if self.header.len() < 8 {
            let n = (8 - self.header.len()).min(data.len());
            self.header.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.header.len() == 8 {
                self.base = u64::from_le_bytes(self.header[..].try_into().unwrap());
            }
        }
        if let Err(bad) = super::check_pattern(data, self.base + self.got) {
            panic!(
                "stream {:#x}: byte at offset {} is wrong (reordered or corrupt)",
                self.base,
                bad - self.base
            );
        }
        self.got += data.len() as u64;
    }
}

pub fn run_streams(name: &str, cfg: &RxConfig, path: RxPath, conns: usize, len: u64) {
    let t0 = Instant::now();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut rx = Receiver::listen(listener, cfg).unwrap();
    assert_eq!(rx.path(), path, "{name}: {}", rx.describe());
    let senders: Vec<_> = (0..conns)
        .map(|k| {
            std::thread::spawn(move || {
                let s = send_stream(addr, (k as u64) << 36, len, 48 << 10).unwrap();
                s.shutdown(std::net::Shutdown::Write).unwrap();
                // Keep the socket until the receiver has seen the end.
                let mut b = [0u8; 1];
                let _ = std::io::Read::read(&mut &s, &mut b);
            })
        })
        .collect();
    let streams = collect(&mut rx, conns, path);
    for t in senders {
        t.join().unwrap();
    }
    let mut bases: Vec<u64> = streams.iter().map(|s| s.base).collect();
    bases.sort_unstable();
    assert_eq!(
        bases,
        (0..conns as u64).map(|k| k << 36).collect::<Vec<_>>()
    );
    for s in &streams {
        assert_eq!(s.got, len, "{name}: stream {:#x} short", s.base);
    }
    let c = rx.stats();
    eprintln!(
        "{name} x{conns} in {:?}: {} {c:?} fallbacks {:?}",
        t0.elapsed(),
        rx.describe(),
        rx.fallbacks()
    );
    assert_eq!(c.bytes, conns as u64 * (len + 8), "{name}: {c:?}");
    assert_eq!(rx.open_connections(), 0);
}

/// Receives until `conns` streams have ended; returns them.
pub fn collect(rx: &mut Receiver, conns: usize, path: RxPath) -> Vec<Stream> {
    let mut streams: HashMap<ConnId, Stream> = HashMap::new();
    let mut done = Vec::new();
    let deadline = Instant::now() + super::scaled(Duration::from_secs(30));
    while done.len() < conns {
        assert!(
            Instant::now() < deadline,
            "timed out: {} of {conns} done",
            done.len()
        );
        rx.poll(Duration::from_millis(100), &mut |ev| match ev {
            RxEvent::Accepted(id) => {
                streams.insert(id, Stream::default());
            }
            RxEvent::Data(chunk) => {
                assert_eq!(chunk.path(), path);
                streams
                    .get_mut(&chunk.conn())
                    .expect("data for an accepted connection")
                    .eat(&chunk);
            }
            RxEvent::Closed(id, err) => {
                assert!(err.is_none(), "{id}: {err:?}");
                done.push(streams.remove(&id).expect("known connection"));
            }
        })
        .unwrap();
    }
    done
}

/// Sets `SO_RCVBUF`/`SO_SNDBUF` small so that a stalled receiver stalls the sender quickly.
pub fn small_buffers(fd: &impl std::os::fd::AsRawFd, opt: i32) {
    zcio::sys::setsockopt_int(fd, libc::SOL_SOCKET, opt, 32 << 10).unwrap();
}

/// `SO_LINGER {on, 0}`: closing sends a reset instead of a FIN.
pub fn set_linger_zero(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `l` lives for the call and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as u32,
        )
    };
    assert_eq!(r, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
}

/// Sends `total` pattern bytes to `addr` in 4 KiB writes through a small send buffer, so the
/// sender stalls as soon as the receiver stops reading; the counter says how far it got.
pub fn paced_pattern_sender(
    addr: SocketAddr,
    total: u64,
) -> (
    std::thread::JoinHandle<()>,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sent2 = sent.clone();
    let h = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        small_buffers(&s, libc::SO_SNDBUF);
        let mut buf = vec![0u8; 4096];
        let mut off = 0;
        while off < total {
            super::fill_pattern(&mut buf, off);
            s.write_all(&buf).unwrap();
            off += buf.len() as u64;
            sent2.store(off, std::sync::atomic::Ordering::Relaxed);
        }
    });
    (h, sent)
}

/// Polls `rx` for `hold` and keeps every data chunk it delivers (the consumer that does not
/// give buffers back); returns the chunks and how many bytes they hold.
pub fn hold_chunks(rx: &mut Receiver, hold: Duration) -> (Vec<RxChunk>, u64) {
    let mut held = Vec::new();
    let mut got = 0u64;
    let until = Instant::now() + hold;
    while Instant::now() < until {
        rx.poll(Duration::from_millis(20), &mut |ev| {
            if let RxEvent::Data(c) = ev {
                got += c.len() as u64;
                held.push(c);
            }
        })
        .unwrap();
    }
    (held, got)
}

/// Checks the `held` chunks (the stream's start) against the pattern, releases them, then
/// receives and checks the rest of a `total`-byte pattern stream within `limit`.
pub fn release_and_receive_rest(
    name: &str,
    rx: &mut Receiver,
    held: Vec<RxChunk>,
    total: u64,
    limit: Duration,
) {
    let mut off = 0u64;
    for c in held {
        super::check_pattern(&c, off).unwrap();
        off += c.len() as u64;
    }
    let deadline = Instant::now() + limit;
    while off < total {
        assert!(
            Instant::now() < deadline,
            "{name}: stuck at {off} of {total}"
        );
        rx.poll(Duration::from_millis(50), &mut |ev| {
            if let RxEvent::Data(c) = ev {
                super::check_pattern(&c, off).unwrap();
                off += c.len() as u64;
            }
        })
        .unwrap();
    }
    assert_eq!(off, total, "{name}");
}

/// Accepts `conns` connections on `l` and reads each to end of stream with a [`Stream`]
/// checker (8-byte base header, then the pattern in order), all on one thread with `poll`.
/// Returns `(base, bytes)` per connection, sorted by base. `pause` holds every read back
/// while it is set (a peer that stops reading).
pub fn serve_checked(
    l: TcpListener,
    conns: usize,
    pause: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<(u64, u64)>> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::Ordering;
    std::thread::spawn(move || {
        let mut socks: Vec<(TcpStream, Stream, bool)> = Vec::with_capacity(conns);
        while socks.len() < conns {
            let (s, _) = l.accept().expect("accept");
            s.set_nonblocking(true).unwrap();
            socks.push((s, Stream::default(), false));
        }
        let mut buf = vec![0u8; 256 << 10];
        let mut open = conns;
        let deadline = Instant::now() + super::scaled(Duration::from_secs(120));
        while open > 0 {
            assert!(Instant::now() < deadline, "{open} connections never ended");
            if pause.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            let mut fds: Vec<libc::pollfd> = socks
                .iter()
                .map(|(s, _, done)| libc::pollfd {
                    fd: if *done { -1 } else { s.as_raw_fd() },
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: `fds` is a valid array for the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
            if n <= 0 {
                continue;
            }
            for (i, p) in fds.iter().enumerate() {
                if p.revents == 0 {
                    continue;
                }
                let (s, st, done) = &mut socks[i];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => {
                            *done = true;
                            open -= 1;
                            break;
                        }
                        Ok(n) => st.eat(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                            *done = true;
                            open -= 1;
                            break;
                        }
                        Err(e) => panic!("read: {e}"),
                    }
                }
            }
        }
        let mut out: Vec<(u64, u64)> = socks.iter().map(|(_, st, _)| (st.base, st.got)).collect();
        out.sort_unstable();
        out
    })
}

/// Connects to `addr` and writes the 8-byte base header of a [`Stream`] checker.
pub fn connect_with_base(addr: SocketAddr, base: u64) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(&base.to_le_bytes()).expect("header");
    s
}

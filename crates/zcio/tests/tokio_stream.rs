//! `zcio::tokio::TcpStream` on `LocalIo` (one send ring and one receiver per thread, shared by
//! its tasks): tokio's `AsyncRead`/`AsyncWrite` carry every byte in order both ways, hyper's
//! HTTP/1 server and a tokio-util codec run on it, `send_bytes` lends `Bytes` to the kernel,
//! halves and shutdown behave as tokio's, a reset is an error. Real loopback sockets; clients
//! are plain `std` threads that check every byte.

mod common;

use bytes::Bytes;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use zcio::tokio::{LocalIo, LocalIoConfig};

/// A test's time limit: a hang fails the test within it, with the server's `LocalIo` state
/// printed (`common::Watchdog`), instead of holding CI until its own limit.
fn watchdog() -> common::Watchdog {
    common::Watchdog::new(common::scaled(Duration::from_secs(60)))
}

/// Runs `serve(io, listener)` on a current-thread runtime in a `LocalSet` on its own thread.
/// Shortly before `dog` fires, the `LocalIo`'s state (every stream, the driver, both rings)
/// is left for it to print.
fn server<F, Fut>(
    dog: &common::Watchdog,
    serve: F,
) -> (std::net::SocketAddr, std::thread::JoinHandle<()>)
where
    F: FnOnce(LocalIo, tokio::net::TcpListener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    server_with(dog, LocalIoConfig::default(), serve)
}

/// [`server`] with the `LocalIo` built from `cfg`.
fn server_with<F, Fut>(
    dog: &common::Watchdog,
    cfg: LocalIoConfig,
    serve: F,
) -> (std::net::SocketAddr, std::thread::JoinHandle<()>)
where
    F: FnOnce(LocalIo, tokio::net::TcpListener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (state, limit) = (dog.state(), dog.limit());
    let h = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            l.set_nonblocking(true).unwrap();
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            let io = LocalIo::with_config(cfg).unwrap();
            let snap = io.clone();
            tokio::task::spawn_local(async move {
                tokio::time::sleep(limit - limit / 12).await;
                *state.lock().unwrap() = format!("server: {snap:#?}");
            });
            serve(io, l).await;
        });
    });
    (addr, h)
}

fn read_to_end_checked(s: &mut TcpStream, off0: u64, want: u64) -> u64 {
    let mut buf = vec![0u8; 1 << 20];
    let mut off = off0;
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        assert_eq!(common::check_pattern(&buf[..n], off), Ok(()), "at {off}");
        off += n as u64;
    }
    assert_eq!(off - off0, want, "every byte, then end of stream");
    off - off0
}

#[test]
fn streams_echo_every_byte_in_order_through_split_halves_and_shut_down() {
    const CONNS: usize = 8;
    const LEN: usize = 3 << 20;
    let dog = watchdog();
    let (addr, h) = server(&dog, |io, l| async move {
        let mut tasks = Vec::new();
        for _ in 0..CONNS {
            let (s, _) = l.accept().await.unwrap();
            let s = io.from_tokio(s).unwrap();
            tasks.push(tokio::task::spawn_local(async move {
                let (mut r, mut w) = s.into_split();
                let n = tokio::io::copy(&mut r, &mut w).await.unwrap();
                w.shutdown().await.unwrap();
                n
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), LEN as u64);
        }
        assert_eq!(io.streams(), 0, "every stream closed");
        eprintln!("{}", io.describe());
    });
    let clients: Vec<_> = (0..CONNS)
        .map(|_| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                let mut r = s.try_clone().unwrap();
                let reader = std::thread::spawn(move || read_to_end_checked(&mut r, 0, LEN as u64));
                let mut data = vec![0u8; LEN];
                common::fill_pattern(&mut data, 0);
                // Odd-sized writes, so the server's reads and pool buffers never line up.
                for part in data.chunks(12_345) {
                    s.write_all(part).unwrap();
                }
                s.shutdown(Shutdown::Write).unwrap();
                reader.join().unwrap()
            })
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap(), LEN as u64);
    }
    h.join().unwrap();
}

/// Many streams writing large buffers faster than their peers read: on loopback (`auto` finds
/// the route copies) writes go straight to the socket and wait for room as tokio's stream
/// does; every byte arrives in order, then the end of stream, and the writes that went
/// straight to the socket outnumber those copied into the pool.
#[test]
fn large_writes_to_slow_readers_arrive_in_order_and_go_straight_to_the_socket_on_loopback() {
    const CONNS: usize = 16;
    const LEN: usize = 24 << 20;
    let dog = watchdog();
    let (addr, h) = server(&dog, |io, l| async move {
        let mut data = vec![0u8; LEN];
        common::fill_pattern(&mut data, 0);
        let data = std::rc::Rc::new(data);
        let mut tasks = Vec::new();
        for _ in 0..CONNS {
            let (s, _) = l.accept().await.unwrap();
            let mut s = io.from_tokio(s).unwrap();
            let data = data.clone();
            tasks.push(tokio::task::spawn_local(async move {
                // 1 MiB and odd-sized writes, so pool buffers and direct writes mix.
                for part in data.chunks((1 << 20) + 4_321) {
                    s.write_all(part).await.unwrap();
                }
                s.shutdown().await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let d = io.describe();
        eprintln!("{d}");
        // "writes: N direct (B B), M through the pool (B B)"
        let bytes: Vec<u64> = d
            .split("writes: ")
            .nth(1)
            .expect("the write counts in describe()")
            .split('(')
            .skip(1)
            .take(2)
            .map(|p| p.split(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(
            bytes[0] > 2 * bytes[1],
            "most bytes go straight to the socket, not through the pool: {d}"
        );
    });
    let clients: Vec<_> = (0..CONNS)
        .map(|i| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                if i % 2 == 0 {
                    // A slow start: the server's socket buffer fills.
                    std::thread::sleep(Duration::from_millis(50));
                }
                read_to_end_checked(&mut s, 0, LEN as u64)
            })
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap(), LEN as u64);
    }
    h.join().unwrap();
}

/// Writes through the pool to a send ring whose submission queue holds one request: each
/// chain of the stream is one send, done inside the enter that submits it, so each harvest
/// lets the stream's next staged send go with nothing of it in the kernel to announce it.
/// Every byte arrives and the stream shuts down. Before, the driver slept with the stream's
/// last sends staged and its shutdown waited for ever (the echo test's rare hang, made to
/// happen every time).
#[test]
fn a_stream_whose_sends_go_one_per_enter_still_sends_every_byte_and_shuts_down() {
    const LEN: usize = 8 << 20;
    let dog = watchdog();
    let mut cfg = LocalIoConfig::default();
    cfg.ring.ring.entries = 1;
    // Every write through the pool and the ring, none straight to the socket.
    cfg.direct_min = usize::MAX;
    let (addr, h) = server_with(&dog, cfg, |io, l| async move {
        let (s, _) = l.accept().await.unwrap();
        let mut s = io.from_tokio(s).unwrap();
        let mut data = vec![0u8; LEN];
        common::fill_pattern(&mut data, 0);
        s.write_all(&data).await.unwrap();
        s.shutdown().await.unwrap();
        eprintln!("{}", io.describe());
    });
    let mut s = TcpStream::connect(addr).unwrap();
    assert_eq!(read_to_end_checked(&mut s, 0, LEN as u64), LEN as u64);
    h.join().unwrap();
}

#[test]
fn send_bytes_lends_bytes_in_order_after_written_bytes_and_the_peer_sees_end_of_stream_at_once() {
    const BODY: usize = 16 << 20;
    let mut pattern = vec![0u8; 4096 + BODY];
    common::fill_pattern(&mut pattern, 0);
    let pattern = Bytes::from(pattern);
    let p2 = pattern.clone();
    let dog = watchdog();
    let (addr, h) = server(&dog, move |io, l| async move {
        let (s, _) = l.accept().await.unwrap();
        let mut s = io.from_tokio(s).unwrap();
        s.write_all(&p2[..4096]).await.unwrap();
        s.send_bytes(p2.slice(4096..)).await.unwrap();
        s.shutdown().await.unwrap();
        // The stream is still alive: the peer's end of stream must not wait for its drop.
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(s);
    });
    let mut s = TcpStream::connect(addr).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0usize;
    let mut last = Instant::now();
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        assert_eq!(&buf[..n], &pattern[off..off + n], "at {off}");
        off += n;
        last = Instant::now();
    }
    let eof = last.elapsed();
    assert_eq!(off, pattern.len());
    assert!(
        eof < Duration::from_millis(200),
        "end of stream {eof:?} after the last byte: shutdown must not wait for the drop"
    );
    h.join().unwrap();
}

#[test]
fn hyper_http1_server_answers_every_request_on_zcio_streams() {
    use http_body_util::Full;
    use hyper::service::service_fn;
    const CONNS: usize = 4;
    const REQS: usize = 50;
    let dog = watchdog();
    let (addr, h) = server(&dog, |io, l| async move {
        let mut tasks = Vec::new();
        for _ in 0..CONNS {
            let (s, _) = l.accept().await.unwrap();
            let s = io.from_tokio(s).unwrap();
            tasks.push(tokio::task::spawn_local(async move {
                let svc = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                    // /N answers N bytes of the pattern.
                    let n: usize = req.uri().path()[1..].parse().unwrap_or(0);
                    let mut body = vec![0u8; n];
                    common::fill_pattern(&mut body, 0);
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(Bytes::from(
                        body,
                    ))))
                });
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await
                    .unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let clients: Vec<_> = (0..CONNS)
        .map(|c| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                let mut r = std::io::BufReader::new(s.try_clone().unwrap());
                for i in 0..REQS {
                    let n = [1024, 1, 0, 300_000][(i + c) % 4];
                    write!(s, "GET /{n} HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
                    let mut len = None;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        std::io::BufRead::read_line(&mut r, &mut line).unwrap();
                        if i == 0 && line.starts_with("HTTP/") {
                            assert!(line.starts_with("HTTP/1.1 200"), "{line}");
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            len = Some(v.trim().parse::<usize>().unwrap());
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    assert_eq!(len, Some(n), "content-length of /{n}");
                    let mut body = vec![0u8; n];
                    r.read_exact(&mut body).unwrap();
                    assert_eq!(common::check_pattern(&body, 0), Ok(()), "body of /{n}");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    h.join().unwrap();
}

#[test]
fn a_tokio_codec_frames_every_message_on_a_zcio_stream() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_util::codec::{Framed, LengthDelimitedCodec};
    const FRAMES: u32 = 2000;
    let dog = watchdog();
    let (addr, h) = server(&dog, |io, l| async move {
        let (s, _) = l.accept().await.unwrap();
        let mut framed = Framed::new(io.from_tokio(s).unwrap(), LengthDelimitedCodec::new());
        let mut n = 0;
        while let Some(frame) = framed.next().await {
            let mut f = frame.unwrap().to_vec();
            f.reverse();
            framed.send(Bytes::from(f)).await.unwrap();
            n += 1;
        }
        assert_eq!(n, FRAMES);
    });
    let mut s = TcpStream::connect(addr).unwrap();
    let mut r = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        for i in 0..FRAMES {
            let len = (i as usize * 7919) % 70_000;
            let mut f = vec![0u8; len];
            common::fill_pattern(&mut f, u64::from(i));
            s.write_all(&(len as u32).to_be_bytes()).unwrap();
            s.write_all(&f).unwrap();
        }
        s.shutdown(Shutdown::Write).unwrap();
    });
    for i in 0..FRAMES {
        let mut hdr = [0u8; 4];
        r.read_exact(&mut hdr).unwrap();
        let len = u32::from_be_bytes(hdr) as usize;
        assert_eq!(len, (i as usize * 7919) % 70_000, "frame {i}");
        let mut f = vec![0u8; len];
        r.read_exact(&mut f).unwrap();
        f.reverse();
        assert_eq!(common::check_pattern(&f, u64::from(i)), Ok(()), "frame {i}");
    }
    writer.join().unwrap();
    h.join().unwrap();
}

#[test]
fn a_stream_whose_receiver_runs_dry_at_every_harvest_still_reads_every_byte() {
    // 4 receive buffers of 4 KiB in rotation against 8 MiB: the kernel ends the connection's
    // multishot receive each time a bundle takes the last buffers, and the driver's harvest
    // re-arms it. A re-arm left unsubmitted after that harvest is never announced by the
    // receiver's descriptor, and the stream stalls for good.
    reads_every_byte_from_a_receiver_that_runs_dry(false);
}

#[test]
fn a_stream_whose_incremental_receive_buffers_run_out_still_reads_every_byte() {
    // The same with buffers consumed incrementally (the default where the kernel has it):
    // the receive ends with ENOBUFS once the 4 buffers are lent, and is re-armed when reads
    // give them back.
    reads_every_byte_from_a_receiver_that_runs_dry(true);
}

fn reads_every_byte_from_a_receiver_that_runs_dry(incremental: bool) {
    use tokio::io::AsyncReadExt;
    const LEN: usize = 8 << 20;
    let dog = watchdog();
    let mut cfg = LocalIoConfig::default();
    cfg.rx.incremental = incremental;
    cfg.rx.buf_size = 4096;
    cfg.rx.buffers = 4;
    cfg.rx.hot_bytes = 0;
    let (addr, h) = server_with(&dog, cfg, |io, l| async move {
        let (s, _) = l.accept().await.unwrap();
        let mut s = io.from_tokio(s).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let mut off = 0u64;
        let limit = common::scaled(Duration::from_secs(20));
        loop {
            let n = match tokio::time::timeout(limit, s.read(&mut buf)).await {
                Ok(r) => r.unwrap(),
                Err(_) => panic!("stalled at {off} of {LEN} bytes: {io:#?}"),
            };
            if n == 0 {
                break;
            }
            assert_eq!(common::check_pattern(&buf[..n], off), Ok(()), "at {off}");
            off += n as u64;
        }
        assert_eq!(off, LEN as u64, "every byte, then end of stream");
        assert!(io.rx_counters().ops > 0);
        eprintln!("{}", io.describe());
    });
    let mut s = TcpStream::connect(addr).unwrap();
    let mut data = vec![0u8; LEN];
    common::fill_pattern(&mut data, 0);
    s.write_all(&data).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    h.join().unwrap();
}

/// The small messages of many streams that arrive together (requests) are received into the
/// same few buffers: with the default receive buffers consumed incrementally, 64 messages of
/// 100 bytes taken in one harvest fit in one 64 KiB buffer and no receive runs out of
/// buffers. With a whole 64 KiB buffer per receive (bundles) and 1 MiB in rotation, 32 of the
/// 64 receives ended for lack of buffers (ENOBUFS) and were re-armed after reads gave buffers
/// back, and the ring ran dry in 3 harvests (Linux 6.18).
#[test]
fn small_messages_of_many_streams_share_receive_buffers_without_running_out() {
    use tokio::io::AsyncReadExt;
    const CONNS: usize = 64;
    const MSG: usize = 100;
    let dog = watchdog();
    let (go_tx, go) = std::sync::mpsc::channel::<()>();
    let (written_tx, written) = std::sync::mpsc::channel::<()>();
    let (addr, h) = server(&dog, move |io, l| async move {
        let mut streams = Vec::new();
        for _ in 0..CONNS {
            let (s, _) = l.accept().await.unwrap();
            streams.push(io.from_tokio(s).unwrap());
        }
        go_tx.send(()).unwrap();
        // The thread stays busy (no driver tick) until every message is in its socket: the
        // kernel runs the receives queued for them in the driver's next enter, together.
        written.recv().unwrap();
        for (i, s) in streams.iter_mut().enumerate() {
            let mut m = [0u8; MSG];
            s.read_exact(&mut m).await.unwrap();
            assert_eq!(
                common::check_pattern(&m, (i * MSG) as u64),
                Ok(()),
                "stream {i}"
            );
        }
        let st = io.rx_stats();
        let d = io.describe();
        eprintln!("{d}; {st:?}");
        let refused = io
            .fallbacks()
            .into_iter()
            .find(|f| f.to_string().contains("incremental"));
        match refused {
            None => assert_eq!((st.enobufs, st.ring_dry, st.rearms), (0, 0, 0), "{d}"),
            Some(f) => {
                zcio_testnet::skip_kernel_feature(
                    "small_messages_of_many_streams_share_receive_buffers_without_running_out",
                    "ZCIO_REQUIRE_PBUF_INC",
                    &f.to_string(),
                );
            }
        }
    });
    let mut conns: Vec<_> = (0..CONNS)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    go.recv().unwrap();
    for (i, c) in conns.iter_mut().enumerate() {
        let mut m = [0u8; MSG];
        common::fill_pattern(&mut m, (i * MSG) as u64);
        c.write_all(&m).unwrap();
    }
    written_tx.send(()).unwrap();
    h.join().unwrap();
    drop(conns);
}

/// A request-response exchange where every request is its own harvest (the client waits for
/// each answer): every byte arrives, and the receiver's system calls are its ring enters
/// alone. The driver watches the receiver's eventfd through tokio (edge-triggered), so no
/// harvest reads it back to zero: that read was one extra system call per harvest.
#[test]
fn a_stream_answers_each_request_without_an_eventfd_read_per_harvest() {
    use tokio::io::AsyncReadExt;
    const ROUNDS: usize = 200;
    const MSG: usize = 64;
    let dog = watchdog();
    let (addr, h) = server(&dog, move |io, l| async move {
        let (s, _) = l.accept().await.unwrap();
        let mut s = io.from_tokio(s).unwrap();
        for r in 0..ROUNDS {
            let mut m = [0u8; MSG];
            s.read_exact(&mut m).await.unwrap();
            assert_eq!(common::check_pattern(&m, (r * MSG) as u64), Ok(()), "{r}");
            s.write_all(&m).await.unwrap();
        }
        let st = io.rx_stats();
        eprintln!("{}; {st:?}", io.describe());
        assert!(st.ring_enters > 0, "{st:?}");
        assert_eq!(st.syscalls, st.ring_enters, "{st:?}");
    });
    let mut c = TcpStream::connect(addr).unwrap();
    for r in 0..ROUNDS {
        let mut m = [0u8; MSG];
        common::fill_pattern(&mut m, (r * MSG) as u64);
        c.write_all(&m).unwrap();
        let mut back = [0u8; MSG];
        c.read_exact(&mut back).unwrap();
        assert_eq!(back, m, "{r}");
    }
    h.join().unwrap();
}

#[test]
fn a_reset_connection_fails_the_writes_with_the_kind_of_the_error() {
    let dog = watchdog();
    let (added_tx, added) = std::sync::mpsc::channel();
    let (addr, h) = server(&dog, move |io, l| async move {
        let (s, _) = l.accept().await.unwrap();
        let mut s = io.from_tokio(s).unwrap();
        // The reset comes after the stream was added (adding a reset socket fails, rightly).
        added_tx.send(()).unwrap();
        let chunk = vec![7u8; 256 << 10];
        let t0 = Instant::now();
        let err = loop {
            if let Err(e) = s.write_all(&chunk).await {
                break e;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "writes never failed"
            );
        };
        assert!(
            matches!(
                err.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ),
            "{err:?}"
        );
    });
    let s = TcpStream::connect(addr).unwrap();
    added.recv().unwrap();
    // SO_LINGER 0: close resets.
    let sock = socket2_linger_zero(s);
    drop(sock);
    h.join().unwrap();
}

/// Sets `SO_LINGER` to 0 (close sends a reset) through the std API's descriptor.
fn socket2_linger_zero(s: TcpStream) -> TcpStream {
    use std::os::fd::AsRawFd;
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a linger struct of the size given.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
    s
}

#[test]
fn constructors_outside_a_runtime_return_an_error_instead_of_panicking() {
    let e = LocalIo::with_config(LocalIoConfig::default()).unwrap_err();
    assert!(e.to_string().contains("tokio runtime"), "{e}");
    let pool = zcio::Pool::new(4096, 4, false).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let tx = zcio::Sender::new(c, &pool, zcio::SenderConfig::default()).unwrap();
    let e = zcio::tokio::AsyncSender::new(tx).unwrap_err();
    assert!(e.to_string().contains("tokio runtime"), "{e}");
    let e: std::io::Error = e.into();
    assert_eq!(e.kind(), std::io::ErrorKind::Other);
}

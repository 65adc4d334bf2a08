//! An HTTP/1.1 keep-alive file server under tokio, in two variants that share everything but
//! the socket I/O: [`Io::Zcio`] receives requests through a [`Receiver`] and sends responses
//! through a [`Sender`] (zcio's async adapters on their readiness descriptors), [`Io::Tokio`]
//! uses tokio's own `TcpStream`. `zcio bench fileserver` compares them with `wrk`.
//!
//! The server runs `workers` threads, each a current-thread runtime accepting from the same
//! listener: zcio's objects keep their rings `SINGLE_ISSUER`, so a connection's task stays on
//! the thread that created them (thread-per-core, as tokio-uring and monoio do); the tokio
//! variant runs the same way so the comparison differs in I/O only.
//!
//! `GET /<name>` serves the file `<name>` from the served directory (plain names only); the
//! body is read with `pread` into the send buffers (one copy from the page cache in both
//! variants). Loopback only.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zcio::rx::{Receiver, RxConfig, RxMode};
use zcio::tokio::{AsyncReceiver, AsyncSender};
use zcio::tx::{SendError, Sender, SenderConfig, TxMode};
use zcio::{Pool, PoolBuf};

/// Which socket I/O the server uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Io {
    /// zcio `Receiver` + `Sender` through `zcio::tokio`.
    Zcio,
    /// tokio's `TcpStream`.
    Tokio,
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct FileServerConfig {
    /// Socket I/O.
    pub io: Io,
    /// Worker threads (one current-thread runtime each).
    pub workers: usize,
    /// Directory whose files are served.
    pub root: PathBuf,
    /// Bytes per send buffer (body chunk).
    pub chunk: usize,
    /// Sends in flight per connection (zcio).
    pub depth: usize,
    /// Send path (zcio).
    pub tx_mode: TxMode,
    /// Receive backend (zcio).
    pub rx_mode: RxMode,
}

impl FileServerConfig {
    /// Defaults: 2 workers, 256 KiB chunks, 8 in flight, `auto` send, `bufring` receive.
    pub fn new(io: Io, root: impl Into<PathBuf>) -> Self {
        Self {
            io,
            workers: 2,
            root: root.into(),
            chunk: 256 << 10,
            depth: 8,
            tx_mode: TxMode::Auto,
            rx_mode: RxMode::BufRing,
        }
    }
}

/// What the server did.
#[derive(Debug, Default)]
pub struct FileServerStats {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Responses sent (any status).
    pub responses: AtomicU64,
    /// Body bytes sent.
    pub body_bytes: AtomicU64,
    /// Connections that ended with an error (logged to stderr).
    pub errors: AtomicU64,
    /// Connections the client reset or closed in the middle of a response (as `wrk` does
    /// when its run ends): not server errors.
    pub disconnects: AtomicU64,
    /// The send path of the last zcio connection (its `Sender::path`), for reports.
    pub tx_path: std::sync::Mutex<String>,
    /// The receive path of the last zcio connection.
    pub rx_path: std::sync::Mutex<String>,
}

/// A running server.
#[derive(Debug)]
pub struct FileServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Counters, shared with the workers.
    pub stats: Arc<FileServerStats>,
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<io::Result<()>>>,
}

impl FileServer {
    /// Binds `addr` (loopback) and starts the workers.
    pub fn start(cfg: FileServerConfig, addr: SocketAddr) -> io::Result<Self> {
        if !addr.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the example file server listens on loopback only",
            ));
        }
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(FileServerStats::default());
        let cfg = Arc::new(cfg);
        let mut workers = Vec::new();
        for i in 0..cfg.workers.max(1) {
            let l = listener.try_clone()?;
            let (stop, stats, cfg) = (stop.clone(), stats.clone(), cfg.clone());
            workers.push(
                std::thread::Builder::new()
                    .name(format!("fileserver-{i}"))
                    .spawn(move || worker(l, cfg, stats, stop))?,
            );
        }
        Ok(Self {
            addr,
            stats,
            stop,
            workers,
        })
    }

    /// Stops accepting, lets open connections finish their current response, and joins.
    pub fn stop(self) -> io::Result<Arc<FileServerStats>> {
        self.stop.store(true, Ordering::Relaxed);
        for w in self.workers {
            w.join()
                .map_err(|_| io::Error::other("a file server worker panicked"))??;
        }
        Ok(self.stats)
    }
}

fn worker(
    l: TcpListener,
    cfg: Arc<FileServerConfig>,
    stats: Arc<FileServerStats>,
    stop: Arc<AtomicBool>,
) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let l = tokio::net::TcpListener::from_std(l)?;
        let mut conns = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let Ok(accepted) = tokio::time::timeout(Duration::from_millis(50), l.accept()).await
            else {
                continue;
            };
            let (s, _) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("fileserver: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            stats.accepted.fetch_add(1, Ordering::Relaxed);
            let (cfg, stats, stop) = (cfg.clone(), stats.clone(), stop.clone());
            conns.push(tokio::task::spawn_local(async move {
                let r = match cfg.io {
                    Io::Zcio => serve_zcio(s, &cfg, &stats, &stop).await,
                    Io::Tokio => serve_tokio(s, &cfg, &stats, &stop).await,
                };
                match r {
                    Ok(()) => {}
                    Err(e) if peer_gone(&e) => {
                        stats.disconnects.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        stats.errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("fileserver: connection: {e}");
                    }
                }
            }));
            conns.retain(|c| !c.is_finished());
        }
        for c in conns {
            let _ = c.await;
        }
        Ok(())
    })
}

/// The client went away (reset, broken pipe): its business, not a server error.
fn peer_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::NotConnected
    )
}

/// A send's outcome as an `io::Error` keeping its kind (reset, broken pipe, ...).
fn send_result(done: &zcio::tx::Completion) -> io::Result<()> {
    match done.result() {
        Ok(_) => Ok(()),
        Err(SendError::Connection { errno } | SendError::Os { errno }) => {
            Err(io::Error::from_raw_os_error(*errno))
        }
        Err(e) => Err(io::Error::other(e.to_string())),
    }
}

/// A parsed request head.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    /// The file name asked for (`None`: not a plain name, answered 404).
    pub name: Option<String>,
    /// `Connection: close` (or HTTP/1.0 without keep-alive).
    pub close: bool,
}

/// Takes one request head (through `\r\n\r\n`) off the front of `buf`; `Ok(None)` when it is
/// incomplete; an error for a malformed or oversized head.
pub fn parse_request(buf: &mut Vec<u8>) -> io::Result<Option<Request>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > 16 << 10 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request head over 16 KiB",
            ));
        }
        return Ok(None);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    buf.drain(..end + 4);
    let mut lines = head.split("\r\n");
    let line = lines.next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad request line {line:?}"),
        ));
    };
    if method != "GET" {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("method {method} not served"),
        ));
    }
    let mut close = version == "HTTP/1.0";
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            if k.trim().eq_ignore_ascii_case("connection") {
                let v = v.trim();
                close = v.eq_ignore_ascii_case("close")
                    || (close && !v.eq_ignore_ascii_case("keep-alive"));
            }
        }
    }
    let name = target.strip_prefix('/').filter(|n| {
        !n.is_empty()
            && !n.starts_with('.')
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    });
    Ok(Some(Request {
        name: name.map(str::to_string),
        close,
    }))
}

/// The file to serve and the response head.
fn open(root: &Path, req: &Request) -> (Option<(File, u64)>, String) {
    let file = req
        .name
        .as_ref()
        .and_then(|n| File::open(root.join(n)).ok())
        .and_then(|f| {
            let m = f.metadata().ok()?;
            m.is_file().then_some((f, m.len()))
        });
    let conn = if req.close { "close" } else { "keep-alive" };
    let head = match &file {
        Some((_, len)) => format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nContent-Type: application/octet-stream\r\nConnection: {conn}\r\n\r\n"
        ),
        None => format!("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: {conn}\r\n\r\n"),
    };
    (file, head)
}

async fn serve_zcio(
    s: tokio::net::TcpStream,
    cfg: &FileServerConfig,
    stats: &FileServerStats,
    stop: &AtomicBool,
) -> io::Result<()> {
    let s = s.into_std()?;
    s.set_nodelay(true)?;
    let rx_cfg = RxConfig {
        buffers: 16,
        buf_size: 16 << 10,
        hot_bytes: 0,
        ..RxConfig::low_latency(RxConfig::with_mode(cfg.rx_mode))
    };
    let mut rx = AsyncReceiver::new(Receiver::new(&rx_cfg).map_err(io::Error::other)?)?;
    rx.get_mut().add(s.try_clone()?)?;
    let pool = Pool::new(cfg.chunk, cfg.depth + 1, false)?;
    let tx_cfg = SenderConfig {
        depth: cfg.depth,
        ..SenderConfig::new(cfg.tx_mode)
    };
    let mut tx = AsyncSender::new(Sender::new(s, &pool, tx_cfg).map_err(io::Error::other)?)
        .map_err(io::Error::other)?;
    *stats.tx_path.lock().expect("lock") = tx.get_ref().path().to_string();
    *stats.rx_path.lock().expect("lock") = rx.get_ref().path().name().to_string();
    let mut inbuf = Vec::new();
    loop {
        let req = loop {
            if let Some(r) = parse_request(&mut inbuf)? {
                break r;
            }
            match rx.recv().await? {
                Some(chunk) => inbuf.extend_from_slice(&chunk),
                None => return Ok(()),
            }
        };
        let (file, head) = open(&cfg.root, &req);
        let len = file.as_ref().map_or(0, |f| f.1);
        let mut off = 0u64;
        let mut first = true;
        let mut spare: VecDeque<PoolBuf> = VecDeque::new();
        while first || off < len {
            let mut b = match spare.pop_front().or_else(|| pool.try_get()) {
                Some(b) => b,
                None => {
                    let (done, b) = tx
                        .next_completion()
                        .await
                        .map_err(io::Error::other)?
                        .expect("buffers in flight");
                    send_result(&done)?;
                    b
                }
            };
            let mut n = 0;
            if first {
                n = head.len();
                b.set_len(n);
                b.copy_from_slice(head.as_bytes());
                first = false;
            }
            let want = ((len - off) as usize).min(pool.slot_size() - n);
            if want > 0 {
                let (f, _) = file.as_ref().expect("file");
                b.set_len(n + want);
                f.read_exact_at(&mut b[n..], off)?;
                off += want as u64;
            }
            tx.start(b).await.map_err(io::Error::other)?;
        }
        // Every byte of this response sent before the next request is read.
        tx.flush().await.map_err(io::Error::other)?;
        while let Some((done, _b)) = tx.next_completion().await.map_err(io::Error::other)? {
            send_result(&done)?;
        }
        stats.responses.fetch_add(1, Ordering::Relaxed);
        stats.body_bytes.fetch_add(len, Ordering::Relaxed);
        if req.close || stop.load(Ordering::Relaxed) {
            return Ok(());
        }
    }
}

async fn serve_tokio(
    mut s: tokio::net::TcpStream,
    cfg: &FileServerConfig,
    stats: &FileServerStats,
    stop: &AtomicBool,
) -> io::Result<()> {
    s.set_nodelay(true)?;
    let mut inbuf = Vec::new();
    let mut rbuf = vec![0u8; 16 << 10];
    let mut body = vec![0u8; cfg.chunk];
    loop {
        let req = loop {
            if let Some(r) = parse_request(&mut inbuf)? {
                break r;
            }
            let n = s.read(&mut rbuf).await?;
            if n == 0 {
                return Ok(());
            }
            inbuf.extend_from_slice(&rbuf[..n]);
        };
        let (file, head) = open(&cfg.root, &req);
        let len = file.as_ref().map_or(0, |f| f.1);
        // Head and first chunk in one write, as the zcio variant does.
        let mut off = 0u64;
        let mut first = true;
        while first || off < len {
            let mut n = 0;
            if first {
                n = head.len();
                body[..n].copy_from_slice(head.as_bytes());
                first = false;
            }
            let want = ((len - off) as usize).min(cfg.chunk - n);
            if want > 0 {
                let (f, _) = file.as_ref().expect("file");
                f.read_exact_at(&mut body[n..n + want], off)?;
                off += want as u64;
            }
            s.write_all(&body[..n + want]).await?;
        }
        stats.responses.fetch_add(1, Ordering::Relaxed);
        stats.body_bytes.fetch_add(len, Ordering::Relaxed);
        if req.close || stop.load(Ordering::Relaxed) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_parse_with_keep_alive_rules_and_plain_names_only() {
        let mut b = b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\nGET /../etc HTTP/1.1\r\nConnection: close\r\n\r\nGET /a".to_vec();
        let r = parse_request(&mut b).unwrap().unwrap();
        assert_eq!(
            r,
            Request {
                name: Some("big.bin".into()),
                close: false
            }
        );
        let r = parse_request(&mut b).unwrap().unwrap();
        assert_eq!(
            r,
            Request {
                name: None,
                close: true
            }
        );
        assert!(parse_request(&mut b).unwrap().is_none());
        assert_eq!(b, b"GET /a");
        let mut b = b"GET /x HTTP/1.0\r\n\r\n".to_vec();
        assert!(parse_request(&mut b).unwrap().unwrap().close);
        let mut b = b"POST /x HTTP/1.1\r\n\r\n".to_vec();
        assert!(parse_request(&mut b).is_err());
        let mut b = vec![b'a'; 20 << 10];
        assert!(parse_request(&mut b).is_err());
    }
}

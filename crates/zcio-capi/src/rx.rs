//! Receive (`zcio::rx::Receiver`) for C: chunks are borrowed from the receiver's memory
//! (buffer ring, zcrx area or pool) and go back when the caller frees them.

use crate::{guard, neg};
use libc::{c_char, c_int, c_void};
use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use zcio_core::rx::{ConnId, Receiver, RxChunk, RxConfig, RxError, RxEvent, RxMode, RxPath};

/// epoll + `recv(2)`.
pub const ZCIO_RX_PLAIN: u32 = 0;
/// Multishot receive into a provided-buffer ring.
pub const ZCIO_RX_BUFRING: u32 = 1;
/// io_uring zcrx without a device (`ZCRX_REG_NODEV`, Linux 7.1): `RECV_ZC` into a registered
/// area, returned through the refill ring; the kernel copies every byte. Older kernels fall
/// back to bufring (then plain), recorded. A NIC queue is not taken by the C API yet.
pub const ZCIO_RX_ZCRX: u32 = 2;
/// The best that works here (bufring, else plain; the fallback is recorded). zcrx needs an
/// interface queue, which the C API does not take yet.
pub const ZCIO_RX_AUTO: u32 = 3;

/// Event kind: a connection was accepted from the listener.
pub const ZCIO_RX_ACCEPTED: u32 = 1;
/// Event kind: bytes arrived (`chunk`, `data`, `len`).
pub const ZCIO_RX_DATA: u32 = 2;
/// Event kind: the connection ended (`error` 0 at end of stream, else `-errno`).
pub const ZCIO_RX_CLOSED: u32 = 3;

/// A receiver of many TCP connections. Opaque; one thread at a time.
pub struct zcio_receiver {
    owner: crate::Owner,
    rx: Receiver,
    ids: HashMap<ConnId, u64>,
    conns: HashMap<u64, ConnId>,
    next_id: u64,
    shared: Arc<Shared>,
}

/// What a receiver and its chunks share. The receiver's buffer bookkeeping (reference counts,
/// free lists) is single-threaded, so every drop of a chunk and every receiver call happen
/// under `lock`; a chunk freed on another thread while the receiver's thread holds the lock
/// (e.g. inside `zcio_receiver_next_event`) is queued in `deferred` and dropped by the
/// receiver's thread when its call ends.
pub(crate) struct Shared {
    lock: Mutex<()>,
    deferred: Mutex<Deferred>,
    /// Chunks handed out and not yet dropped. While some are out, a long
    /// `zcio_receiver_next_event` waits in short slices and drops the chunks other threads
    /// freed in between: on the buffer-ring path the receiver may need exactly those buffers
    /// back before more data can arrive.
    live: AtomicUsize,
}

struct Deferred {
    chunks: Vec<ChunkPtr>,
    /// The receiver was freed: nobody drains the queue any more.
    gone: bool,
}

/// A chunk handed to another thread's care.
struct ChunkPtr(*mut zcio_rx_chunk);
// SAFETY: the pointer is only dereferenced (dropped) under `Shared::lock`.
unsafe impl Send for ChunkPtr {}

/// Received bytes, borrowed; `zcio_rx_chunk_free` gives the memory back (from any thread).
/// Opaque.
pub struct zcio_rx_chunk {
    pub(crate) chunk: RxChunk,
    pub(crate) shared: Arc<Shared>,
}

impl Drop for zcio_rx_chunk {
    fn drop(&mut self) {
        self.shared.live.fetch_sub(1, Ordering::Relaxed);
    }
}

// SAFETY: a chunk's single-threaded state (reference-counted buffers) is only touched under
// its receiver's `Shared::lock` (see `zcio_rx_chunk_free`).
unsafe impl Send for zcio_rx_chunk {}

fn lock(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Drops the chunks other threads freed (the caller holds `lock`).
    fn drain(&self) {
        let chunks = std::mem::take(
            &mut self
                .deferred
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .chunks,
        );
        for c in chunks {
            // SAFETY: queued by zcio_rx_chunk_free, freed exactly once here, under `lock`.
            drop(unsafe { Box::from_raw(c.0) });
        }
    }
}

/// One receiver event.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct zcio_rx_event {
    /// `ZCIO_RX_ACCEPTED`, `ZCIO_RX_DATA` or `ZCIO_RX_CLOSED`.
    pub kind: u32,
    /// `ZCIO_RX_CLOSED`: 0 at end of stream, else `-errno`.
    pub error: c_int,
    /// The connection (ids are never reused by this handle).
    pub conn: u64,
    /// `ZCIO_RX_DATA`: the chunk, owned by the caller until `zcio_rx_chunk_free`.
    pub chunk: *mut zcio_rx_chunk,
    /// `ZCIO_RX_DATA`: the bytes (valid until the chunk is freed).
    pub data: *const c_void,
    /// `ZCIO_RX_DATA`: how many.
    pub len: usize,
}

fn rx_errno(e: &RxError) -> c_int {
    match e {
        RxError::Ring(_) | RxError::NoZcrxTarget => -libc::EOPNOTSUPP,
        RxError::Zcrx(_) => -libc::EOPNOTSUPP,
        RxError::BufRing(e) | RxError::Io(e) => neg(e),
    }
}

fn config(mode: u32) -> Option<RxConfig> {
    let mode = match mode {
        ZCIO_RX_PLAIN => RxMode::Plain,
        ZCIO_RX_BUFRING => RxMode::BufRing,
        ZCIO_RX_ZCRX => RxMode::Zcrx,
        ZCIO_RX_AUTO => RxMode::Auto,
        _ => return None,
    };
    Some(RxConfig::with_mode(mode))
}

fn boxed(out: *mut *mut zcio_receiver, rx: Receiver) -> c_int {
    let r = zcio_receiver {
        owner: crate::Owner::here(),
        rx,
        ids: HashMap::new(),
        conns: HashMap::new(),
        next_id: 1,
        shared: Arc::new(Shared {
            lock: Mutex::new(()),
            deferred: Mutex::new(Deferred {
                chunks: Vec::new(),
                gone: false,
            }),
            live: AtomicUsize::new(0),
        }),
    };
    // SAFETY: `out` is non-null (checked by the callers).
    unsafe { *out = Box::into_raw(Box::new(r)) };
    0
}

/// Creates a receiver without a listener (`mode`: `ZCIO_RX_PLAIN`, `_BUFRING`, `_ZCRX`,
/// `_AUTO`);
/// connections are added with `zcio_receiver_add`.
///
/// Thread: any; the calling thread becomes the owner. Ownership: `*out` until `zcio_receiver_free`.
#[no_mangle]
pub extern "C" fn zcio_receiver_new(out: *mut *mut zcio_receiver, mode: u32) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    let Some(cfg) = config(mode) else {
        return -libc::EINVAL;
    };
    guard(|| match Receiver::new(&cfg) {
        Ok(rx) => boxed(out, rx),
        Err(e) => rx_errno(&e),
    })
}

/// Creates a receiver that accepts from the listening TCP socket `listen_fd` (ownership
/// passes to the receiver) and receives from every accepted connection.
///
/// Thread: any; the calling thread becomes the owner. Ownership: `listen_fd` passes to the receiver (closed on failure too).
#[no_mangle]
pub extern "C" fn zcio_receiver_listen(
    out: *mut *mut zcio_receiver,
    listen_fd: c_int,
    mode: u32,
) -> c_int {
    if out.is_null() || listen_fd < 0 {
        return -libc::EINVAL;
    }
    let Some(cfg) = config(mode) else {
        return -libc::EINVAL;
    };
    guard(|| {
        // SAFETY: the caller hands over ownership of the listening socket.
        let l = TcpListener::from(unsafe { OwnedFd::from_raw_fd(listen_fd) });
        match Receiver::listen(l, &cfg) {
            Ok(rx) => boxed(out, rx),
            Err(e) => rx_errno(&e),
        }
    })
}

/// Frees a receiver and closes its sockets (NULL is ignored). Chunks already handed out stay
/// valid until freed (from any thread).
///
/// Thread: the owner (its rings are bound to it); freed once.
#[no_mangle]
pub extern "C" fn zcio_receiver_free(r: *mut zcio_receiver) {
    if !r.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: `r` came from zcio_receiver_new/listen and is freed once.
            let rx = unsafe { Box::from_raw(r) };
            let shared = rx.shared.clone();
            let g = lock(&shared.lock);
            drop(rx);
            shared.drain();
            shared
                .deferred
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .gone = true;
            shared.drain();
            drop(g);
        }));
    }
}

fn with_rx(r: *mut zcio_receiver, f: impl FnOnce(&mut zcio_receiver) -> c_int) -> c_int {
    if r.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `r` is a live receiver handle; only its (immutable) owner is read first.
    if !unsafe { (*r).owner }.is_here() {
        return -libc::EPERM;
    }
    // SAFETY: the owner thread's exclusive use of its live handle.
    let rx = unsafe { &mut *r };
    let shared = rx.shared.clone();
    let g = lock(&shared.lock);
    let res = guard(|| f(rx));
    shared.drain();
    drop(g);
    res
}

impl zcio_receiver {
    fn id(&mut self, c: ConnId) -> u64 {
        if let Some(&id) = self.ids.get(&c) {
            return id;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.ids.insert(c, id);
        self.conns.insert(id, c);
        id
    }
    fn forget(&mut self, id: u64) {
        if let Some(c) = self.conns.remove(&id) {
            self.ids.remove(&c);
        }
    }
}

/// Hands the connected TCP socket `fd` to the receiver (ownership passes); writes its id.
///
/// Thread: the owner only (`-EPERM` from any other; `fd` is then not taken).
#[no_mangle]
pub extern "C" fn zcio_receiver_add(r: *mut zcio_receiver, fd: c_int, conn: *mut u64) -> c_int {
    if fd < 0 {
        return -libc::EBADF;
    }
    with_rx(r, |rx| {
        // SAFETY: the caller hands over ownership of the connected socket.
        let s = TcpStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
        match rx.rx.add(s) {
            Ok(c) => {
                let id = rx.id(c);
                if !conn.is_null() {
                    // SAFETY: non-null output pointer.
                    unsafe { *conn = id };
                }
                0
            }
            Err(e) => neg(&e),
        }
    })
}

/// Stops receiving on `conn` and closes it (`-ENOENT` for an unknown id).
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_receiver_close(r: *mut zcio_receiver, conn: u64) -> c_int {
    with_rx(r, |rx| match rx.conns.get(&conn).copied() {
        Some(c) => {
            rx.rx.close(c);
            rx.forget(conn);
            0
        }
        None => -libc::ENOENT,
    })
}

/// Waits up to `timeout_ms` for the next event: returns 1 with `*out` filled, 0 on timeout,
/// or `-errno`.
///
/// Thread: the owner only (`-EPERM` from any other). Ownership: a `ZCIO_RX_DATA` event's chunk is the caller's until `zcio_rx_chunk_free`.
#[no_mangle]
pub extern "C" fn zcio_receiver_next_event(
    r: *mut zcio_receiver,
    out: *mut zcio_rx_event,
    timeout_ms: c_int,
) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    let timeout = Duration::from_millis(timeout_ms.max(0) as u64);
    with_rx(r, |rx| {
        let deadline = std::time::Instant::now() + timeout;
        let ev = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let slice = if rx.shared.live.load(Ordering::Relaxed) > 0 {
                left.min(Duration::from_millis(5))
            } else {
                left
            };
            match rx.rx.next_event(slice) {
                Ok(Some(ev)) => break ev,
                Ok(None) if slice >= left => return 0,
                Ok(None) => rx.shared.drain(),
                Err(e) => return neg(&e),
            }
        };
        let mut e = zcio_rx_event {
            kind: 0,
            error: 0,
            conn: 0,
            chunk: std::ptr::null_mut(),
            data: std::ptr::null(),
            len: 0,
        };
        match ev {
            RxEvent::Accepted(c) => {
                e.kind = ZCIO_RX_ACCEPTED;
                e.conn = rx.id(c);
            }
            RxEvent::Data(chunk) => {
                e.kind = ZCIO_RX_DATA;
                e.conn = rx.id(chunk.conn());
                e.len = chunk.len();
                rx.shared.live.fetch_add(1, Ordering::Relaxed);
                let b = Box::into_raw(Box::new(zcio_rx_chunk {
                    chunk,
                    shared: rx.shared.clone(),
                }));
                // SAFETY: `b` was just created; the bytes live as long as the chunk.
                e.data = unsafe { (*b).chunk.as_ptr().cast() };
                e.chunk = b;
            }
            RxEvent::Closed(c, err) => {
                e.kind = ZCIO_RX_CLOSED;
                e.conn = rx.id(c);
                e.error = err.map_or(0, |x| neg(&x));
                rx.forget(e.conn);
            }
        }
        // SAFETY: `out` is non-null.
        unsafe { *out = e };
        1
    })
}

/// Gives a chunk's memory back to the receiver (NULL is ignored). Any thread may free a
/// chunk, also while the receiver's thread is inside a receiver call (the chunk is then
/// returned when that call ends) and after the receiver was freed. Each chunk is freed once.
///
/// Thread: any (see above).
#[no_mangle]
pub extern "C" fn zcio_rx_chunk_free(c: *mut zcio_rx_chunk) {
    if c.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `c` came from zcio_receiver_next_event and is live until freed here; only
        // its `shared` handle (thread-safe) is read before the lock is taken.
        let shared = unsafe { (*c).shared.clone() };
        let tried = match shared.lock.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        match tried {
            Some(g) => {
                // SAFETY: freed once, under the receiver's lock.
                drop(unsafe { Box::from_raw(c) });
                drop(g);
            }
            None => {
                let mut d = shared.deferred.lock().unwrap_or_else(|p| p.into_inner());
                if !d.gone {
                    d.chunks.push(ChunkPtr(c));
                    return;
                }
                drop(d);
                // The receiver is gone; whoever holds the lock releases it soon.
                let g = lock(&shared.lock);
                // SAFETY: freed once, under the receiver's lock.
                drop(unsafe { Box::from_raw(c) });
                drop(g);
            }
        };
    }));
}

/// A snapshot of what the receiver reports into `*out`: its path, counters, every fallback
/// with its reason, and its receive counters (`stats` in the JSON). Free it with
/// `zcio_report_free`. Returns 0 or `-EINVAL`.
///
/// Thread: the owner only (`-EPERM` from any other).
#[no_mangle]
pub extern "C" fn zcio_receiver_report(
    r: *mut zcio_receiver,
    out: *mut *mut crate::report::zcio_report,
) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    with_rx(r, |r| {
        crate::report::put(out, crate::report::of(&r.rx, r.rx.stats()))
    })
}

/// The receive path, as a static string (`"plain"`, `"bufring"`, `"zcrx"`, `"zcrx-nodev"`).
///
/// Thread: any.
#[no_mangle]
pub extern "C" fn zcio_receiver_path(r: *const zcio_receiver) -> *const c_char {
    if r.is_null() {
        return std::ptr::null();
    }
    // SAFETY: `r` is a live receiver handle.
    match unsafe { (*r).rx.path() } {
        RxPath::Plain => c"plain".as_ptr(),
        RxPath::BufRing => c"bufring".as_ptr(),
        RxPath::Zcrx => c"zcrx".as_ptr(),
        RxPath::ZcrxNodev => c"zcrx-nodev".as_ptr(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;
    use std::io::Write;
    use std::os::fd::IntoRawFd;

    fn pattern(i: u64) -> u8 {
        (i.wrapping_mul(2654435761) >> 13) as u8
    }

    /// The C receiver with `ZCIO_RX_ZCRX`, called through the exported functions as a C
    /// program would: on Linux 7.1+ the bytes arrive through device-less zcrx and every byte
    /// is checked; before 7.1 the receiver falls back to bufring (kernel-feature skip of the
    /// zcrx half; a failure under `ZCIO_REQUIRE_ZCRX=1`, set in the 7.x guest of vmtest).
    #[test]
    fn zcrx_c_abi_receiver_receives_a_verified_stream() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut r: *mut zcio_receiver = std::ptr::null_mut();
        assert_eq!(
            zcio_receiver_listen(&mut r, l.into_raw_fd(), ZCIO_RX_ZCRX),
            0
        );
        // SAFETY: the path is a static C string.
        let path = unsafe { CStr::from_ptr(zcio_receiver_path(r)) }
            .to_str()
            .unwrap()
            .to_string();
        let total = 2u64 << 20;
        let sender = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let buf: Vec<u8> = (0..total).map(pattern).collect();
            s.write_all(&buf).unwrap();
        });
        let (mut got, mut closed) = (0u64, false);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !closed {
            assert!(std::time::Instant::now() < deadline, "stuck at {got}");
            let mut ev = std::mem::MaybeUninit::<zcio_rx_event>::uninit();
            let n = zcio_receiver_next_event(r, ev.as_mut_ptr(), 100);
            assert!(n >= 0, "next_event: {n}");
            if n == 0 {
                continue;
            }
            // SAFETY: next_event returned 1 and filled the event.
            let ev = unsafe { ev.assume_init() };
            match ev.kind {
                ZCIO_RX_DATA => {
                    // SAFETY: `data`/`len` describe the chunk's bytes until it is freed.
                    let b = unsafe { std::slice::from_raw_parts(ev.data.cast::<u8>(), ev.len) };
                    for (k, &x) in b.iter().enumerate() {
                        assert_eq!(x, pattern(got + k as u64), "byte {}", got + k as u64);
                    }
                    got += ev.len as u64;
                    zcio_rx_chunk_free(ev.chunk);
                }
                ZCIO_RX_CLOSED => {
                    assert_eq!(ev.error, 0);
                    closed = true;
                }
                _ => {}
            }
        }
        sender.join().unwrap();
        zcio_receiver_free(r);
        assert_eq!(got, total);
        if path == "zcrx-nodev" {
            return;
        }
        assert_eq!(path, "bufring");
        let why = "device-less zcrx needs Linux 7.1+ (EINVAL here); the C receiver fell back to \
                   bufring";
        if zcio_testnet::is_root() {
            zcio_testnet::skip_kernel_feature(
                "zcrx_c_abi_receiver_receives_a_verified_stream",
                "ZCIO_REQUIRE_ZCRX",
                why,
            );
        } else {
            zcio_testnet::skip("zcrx_c_abi_receiver_receives_a_verified_stream", why);
        }
    }
}

//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod streams;

#[allow(unused_imports)] // not every test file skips by hand
pub use zcio_testnet::{can_make_hosts, skip};

/// A deterministic byte pattern: byte `i` of a stream is `pattern_byte(i)`.
pub fn pattern_byte(i: u64) -> u8 {
    (i.wrapping_mul(2654435761) >> 13) as u8
}

/// Fills `buf` with the stream pattern starting at stream offset `off`.
pub fn fill_pattern(buf: &mut [u8], off: u64) {
    for (k, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(off + k as u64);
    }
}

/// Checks `buf` against the stream pattern at `off`; returns the first bad offset.
pub fn check_pattern(buf: &[u8], off: u64) -> Result<(), u64> {
    for (k, &b) in buf.iter().enumerate() {
        if b != pattern_byte(off + k as u64) {
            return Err(off + k as u64);
        }
    }
    Ok(())
}

/// A time limit scaled by `ZCIO_TIME_SCALE` (set by `scripts/vmtest` in its software-emulated
/// guests, where everything runs many times slower); unscaled when unset.
pub fn scaled(d: std::time::Duration) -> std::time::Duration {
    let k = std::env::var("ZCIO_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1);
    d * k
}

/// Sends `buf` on `tx`, waiting for room while the sender refuses it for backpressure (the
/// refusal hands the buffer back; nothing waits inside `send`).
pub fn send(tx: &mut zcio::tx::Sender, mut buf: zcio::tx::PoolBuf) -> zcio::tx::Ticket {
    loop {
        match tx.send(buf) {
            Ok(t) => return t,
            Err(r) => {
                assert!(r.reason.is_backpressure(), "send refused: {r}");
                let why = format!("{:?}", r.reason);
                buf = r.buf;
                tx.wait(std::time::Duration::from_millis(100))
                    .unwrap_or_else(|e| panic!("waiting for room after {why}: {e:?}"));
            }
        }
    }
}

/// Runs `parse` over `rounds` deterministic mutations of `seeds` (bit flips, truncations,
/// 16-bit fields overwritten, splices of two seeds, inserted bytes); returns how many it
/// rejected. A panic in `parse` fails the calling test.
pub fn mutate(seeds: &[Vec<u8>], rounds: usize, mut parse: impl FnMut(&[u8]) -> bool) -> usize {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut errors = 0;
    for round in 0..rounds {
        let s = &seeds[round % seeds.len()];
        let mut b = s.clone();
        match rnd() % 5 {
            0 => {
                for _ in 0..1 + rnd() % 4 {
                    if !b.is_empty() {
                        let i = (rnd() as usize) % b.len();
                        b[i] ^= 1 << (rnd() % 8);
                    }
                }
            }
            1 => b.truncate((rnd() as usize) % (b.len() + 1)),
            2 => {
                // Overwrite a 16-bit length-looking field with a random value.
                if b.len() >= 4 {
                    let i = ((rnd() as usize) % (b.len() - 3)) & !1;
                    let v = (rnd() as u16).to_ne_bytes();
                    b[i..i + 2].copy_from_slice(&v);
                }
            }
            3 => {
                let o = &seeds[(rnd() as usize) % seeds.len()];
                let cut = (rnd() as usize) % (o.len() + 1);
                b.extend_from_slice(&o[..cut]);
            }
            _ => {
                let i = (rnd() as usize) % (b.len() + 1);
                b.insert(i.min(b.len()), rnd() as u8);
            }
        }
        errors += usize::from(parse(&b));
    }
    errors
}

/// Gives up CAP_NET_ADMIN on the calling thread (capabilities are per thread), binds with
/// `open` — an NFQUEUE queue or an NFLOG group, returning its error's refusal and text — and
/// checks the refusal says the capability is missing, not that the queue or group is in use
/// (the kernel's EPERM means either).
pub fn refused_for_a_missing_capability(
    open: impl FnOnce() -> (Option<zcio::netlink::BindRefusal>, String),
) {
    zcio_testnet::caps::drop_effective_in_this_thread(zcio_testnet::caps::CAP_NET_ADMIN)
        .expect("capset");
    let (refusal, text) = open();
    assert!(
        matches!(
            refusal,
            Some(zcio::netlink::BindRefusal::NoCapability { held_by: None })
        ),
        "{refusal:?}: {text}"
    );
    assert!(
        text.contains("missing capability") && text.contains("CAP_NET_ADMIN"),
        "{text}"
    );
    assert!(!text.contains("in use"), "{text}");
}

/// IPv4 + IPv6 datagrams this thread's network namespace handed down for sending
/// (`Ip: OutRequests` in `snmp`, `Ip6OutRequests` in `snmp6`).
pub fn ip_out_requests() -> u64 {
    let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").unwrap();
    let mut ip = snmp.lines().filter(|l| l.starts_with("Ip: "));
    let (names, values) = (ip.next().unwrap(), ip.next().unwrap());
    let col = names
        .split_whitespace()
        .position(|n| n == "OutRequests")
        .unwrap();
    let v4: u64 = values.split_whitespace().nth(col).unwrap().parse().unwrap();
    let snmp6 = std::fs::read_to_string("/proc/thread-self/net/snmp6").unwrap();
    let v6: u64 = snmp6
        .lines()
        .find_map(|l| l.strip_prefix("Ip6OutRequests"))
        .map_or(0, |v| v.trim().parse().unwrap());
    v4 + v6
}

/// Turns a hang into a failure: unless dropped within `limit` (give it [`scaled`]), it prints
/// the test's name (the current thread's, which libtest names after the test) and the state
/// left in [`Watchdog::state`], then ends the test process with exit code 101, as a failed
/// test does. A test that hangs thus fails with its state printed instead of holding CI
/// until its time limit.
pub struct Watchdog {
    stop: Option<std::sync::mpsc::Sender<()>>,
    state: std::sync::Arc<std::sync::Mutex<String>>,
    limit: std::time::Duration,
}

impl Watchdog {
    pub fn new(limit: std::time::Duration) -> Self {
        let test = std::thread::current()
            .name()
            .unwrap_or("a test")
            .to_string();
        let (stop, wait) = std::sync::mpsc::channel::<()>();
        let state = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let st = std::sync::Arc::clone(&state);
        std::thread::spawn(move || {
            use std::io::Write;
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(limit) {
                let st = st.lock().map(|s| s.clone()).unwrap_or_default();
                let st = if st.is_empty() {
                    "(none recorded)"
                } else {
                    &st
                };
                // Straight to the descriptor: libtest captures `eprintln!` (in threads a test
                // spawns too), and an exiting process never shows what it captured.
                let _ = writeln!(
                    std::io::stderr(),
                    "\n{test}: still running after {limit:?}: a hang. State:\n{st}"
                );
                std::process::exit(101);
            }
        });
        Self {
            stop: Some(stop),
            state,
            limit,
        }
    }

    /// When it fires, counted from its creation.
    pub fn limit(&self) -> std::time::Duration {
        self.limit
    }

    /// Where the test's parts leave what the watchdog prints (e.g. a `Debug` dump of the
    /// objects a server thread owns, taken shortly before the limit).
    pub fn state(&self) -> std::sync::Arc<std::sync::Mutex<String>> {
        std::sync::Arc::clone(&self.state)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Disarms: the thread sees the channel closed (or the message) and ends.
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// How long a test's blocking netlink receive waits before the test fails instead of hanging.
pub const NETLINK_REPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A bound raw netlink socket for hand-built requests. Its blocking receives give up after
/// [`NETLINK_REPLY_WAIT`], so a message that never comes fails the test with a message
/// ([`recv_netlink`]) instead of hanging the test binary until CI's limit.
pub fn netlink_socket(protocol: i32) -> std::os::fd::OwnedFd {
    use std::os::fd::AsRawFd;
    let fd = zcio::sys::netlink::socket(protocol).unwrap();
    let tv = libc::timeval {
        tv_sec: NETLINK_REPLY_WAIT.as_secs() as libc::time_t,
        tv_usec: 0,
    };
    // SAFETY: `tv` is a valid timeval that lives for the call; the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_RCVTIMEO: {}", std::io::Error::last_os_error());
    zcio::sys::netlink::bind(&fd, 0, 0).unwrap();
    fd
}

/// One datagram from a [`netlink_socket`]; panics naming `what` when none came in time.
pub fn recv_netlink(fd: &std::os::fd::OwnedFd, buf: &mut [u8], what: &str) -> usize {
    match zcio::sys::net::recv(fd, buf, 0) {
        Ok(k) => k,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            panic!("{what}: no netlink message within {NETLINK_REPLY_WAIT:?}")
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Sends a netfilter config request that binds a queue or log group and returns the kernel's
/// ACK. A bind can find the number still held by this process's previous socket for it: a
/// fork in another test thread (iptables, ip) holds a copy of every descriptor until its exec,
/// so closing the socket does not yet unbind. The kernel answers `EPERM` then (another port
/// holds it; the tests run with CAP_NET_ADMIN, so it is not the capability); the request is
/// retried for up to 5 s. Any other refusal, or a lasting one, fails the test.
pub fn bind_netfilter(fd: &std::os::fd::OwnedFd, request: &[u8], what: &str) -> Vec<u8> {
    use zcio::netlink::msg::NlMsg;
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut buf = vec![0u8; 8192];
    loop {
        zcio::sys::netlink::send_to_kernel(fd, request).unwrap();
        let k = recv_netlink(fd, &mut buf, what);
        let (m, _) = NlMsg::parse(&buf[..k]).unwrap();
        match m.error_code().unwrap() {
            0 => return buf[..k].to_vec(),
            e if e == -libc::EPERM && std::time::Instant::now() < end => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            e => panic!(
                "{what}: bind refused: {}",
                std::io::Error::from_raw_os_error(-e)
            ),
        }
    }
}

//! The perf control protocol: every TCP connection to `zcio perf server` starts with one
//! framed JSON message (a 4-byte big-endian length, then that many bytes of JSON). A control
//! connection says [`Hello::Control`] with the test's [`Params`]; each TCP data stream says
//! [`Hello::Data`] with the cookie the server handed out. UDP streams say hello with a
//! datagram of [`UDP_HELLO`] + cookie + stream index. Everything read from the wire is checked
//! here before it is used: frame length, JSON shape, version, and every parameter's range.

use anyhow::{bail, Context, Result};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::io::{Read, Write};

/// Protocol version; a server refuses any other.
pub const VERSION: u32 = 1;
/// Largest control message either side accepts.
pub const MAX_MSG: usize = 64 << 10;
/// Most streams per test.
pub const MAX_STREAMS: u32 = 128;
/// Largest write (`-l`).
pub const MAX_LEN: u64 = 16 << 20;
/// Longest test.
pub const MAX_DURATION_MS: u64 = 24 * 3600 * 1000;
/// Magic at the start of a UDP hello datagram.
pub const UDP_HELLO: &[u8; 8] = b"ZCIOUDP1";
/// Bytes of a UDP hello: magic, 16-byte cookie, 4-byte stream index.
pub const UDP_HELLO_LEN: usize = 8 + 16 + 4;

/// The first message on a connection.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Hello {
    /// A control connection: one test.
    Control {
        /// [`VERSION`].
        version: u32,
        /// What to run: [`Params`] of that version (parsed only once the version is known
        /// to be this one's, so another version gets a clear refusal).
        params: serde_json::Value,
    },
    /// A TCP data stream of an accepted test.
    Data {
        /// The test's cookie (hex).
        cookie: String,
        /// Stream index, `0..streams`.
        stream: u32,
    },
}

impl Hello {
    /// The control hello for `params`.
    pub fn control(params: &Params) -> Self {
        Hello::Control {
            version: VERSION,
            params: serde_json::to_value(params).expect("params serialise"),
        }
    }
}

/// Test parameters, sent by the client.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Params {
    /// UDP instead of TCP.
    pub udp: bool,
    /// Parallel streams.
    pub streams: u32,
    /// Sending time in milliseconds.
    pub duration_ms: u64,
    /// The server sends (`-R`).
    pub reverse: bool,
    /// Bytes per write.
    pub len: u64,
    /// Bit/s per stream, 0 = unlimited.
    pub rate_bps: u64,
    /// Send path of the sending side (copy, msg-zc, uring-zc, uring-zc-fixed, auto).
    pub tx: String,
    /// Receive path of the receiving side (plain, bufring, zcrx, auto).
    pub rx: String,
    /// Stream carries the verification pattern; the receiver checks it.
    pub verify: bool,
    /// Sends in flight per stream.
    pub depth: u32,
    /// Interval between the client's progress lines in milliseconds (0 = none); the server
    /// only records it.
    pub interval_ms: u64,
}

impl Params {
    /// Checks every field; `Err` says which one is out of range.
    pub fn check(&self) -> Result<()> {
        if self.streams == 0 || self.streams > MAX_STREAMS {
            bail!("streams {} out of range 1..={MAX_STREAMS}", self.streams);
        }
        if self.duration_ms == 0 || self.duration_ms > MAX_DURATION_MS {
            bail!(
                "duration {} ms out of range 1..={MAX_DURATION_MS}",
                self.duration_ms
            );
        }
        if self.len == 0 || self.len > MAX_LEN {
            bail!("write size {} out of range 1..={MAX_LEN}", self.len);
        }
        if self.depth == 0 || self.depth > 4096 {
            bail!("depth {} out of range 1..=4096", self.depth);
        }
        if self.tx.parse::<zcio::tx::TxMode>().is_err() {
            bail!("unknown send path '{}'", truncate(&self.tx));
        }
        if self.rx.parse::<zcio::rx::RxMode>().is_err() {
            bail!("unknown receive path '{}'", truncate(&self.rx));
        }
        Ok(())
    }

    /// Bytes the sending side of one stream holds in buffers.
    pub fn send_memory(&self) -> u64 {
        self.len.saturating_mul(u64::from(self.depth))
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(32).collect()
}

/// The server's answer to [`Hello::Control`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// Accepted: open the streams.
    Accept {
        /// [`VERSION`].
        version: u32,
        /// Cookie the data streams present (hex, 32 digits).
        cookie: String,
        /// UDP: one server port per stream (empty for TCP).
        udp_ports: Vec<u16>,
        /// The server host.
        host: HostInfo,
    },
    /// Refused, with the reason.
    Refuse {
        /// Why.
        reason: String,
    },
}

/// Messages after the handshake.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Msg {
    /// Server → client: every stream is attached; the clock starts.
    Start,
    /// Server → client: the test failed on the server (a stream broke, a timeout).
    Abort {
        /// Why.
        reason: String,
    },
    /// Either side: its figures for the test.
    Results(Box<SideReport>),
}

/// The host a side ran on.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HostInfo {
    /// Host name.
    pub hostname: String,
    /// Kernel release.
    pub kernel: String,
    /// Online CPUs.
    pub cpus: usize,
    /// The interface that carries the test's local address, with its driver (e.g.
    /// `eth0 (mlx5_core, 25000 Mb/s)`), or why it is unknown.
    pub nic: String,
}

/// One stream's figures on one side.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StreamReport {
    /// Stream index.
    pub stream: u32,
    /// Bytes sent (completed) or received.
    pub bytes: u64,
    /// Seconds.
    #[serde(deserialize_with = "f64_or_nan")]
    pub seconds: f64,
    /// Gbit/s.
    #[serde(deserialize_with = "f64_or_nan")]
    pub gbit_s: f64,
    /// The stream thread's CPU seconds.
    #[serde(deserialize_with = "f64_or_nan")]
    pub cpu_s: f64,
    /// CPU the thread was pinned to.
    pub cpu: Option<usize>,
    /// Sends or receive chunks / datagrams.
    pub ops: u64,
    /// Syscalls made by the stream thread's I/O object.
    pub syscalls: u64,
    /// Sender: syscalls made only to collect zero-copy completions.
    #[serde(default)]
    pub notify_syscalls: u64,
    /// Path in use (send or receive path).
    pub path: String,
    /// Sender: fraction of zero-copy-attempted bytes the kernel copied. Receiver (TCP): fraction
    /// of the bytes the kernel copied into the application's memory (1.0 except NIC zcrx).
    pub copied_fraction: Option<f64>,
    /// TCP: segments retransmitted (`TCP_INFO`), sender side.
    pub retransmits: Option<u32>,
    /// Whether the bytes were checked against the pattern.
    pub verified: bool,
    /// First offset that did not match the pattern.
    pub corrupt_at: Option<u64>,
    /// UDP receiver: bytes missing between datagrams.
    pub gap_bytes: u64,
    /// Errors (failed sends, a reset) in words.
    pub error: Option<String>,
    /// Fallbacks taken, in words.
    pub fallbacks: Vec<String>,
}

/// One side's figures for a test.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SideReport {
    /// `sender` or `receiver`.
    pub role: String,
    /// The host.
    pub host: HostInfo,
    /// Per stream.
    pub streams: Vec<StreamReport>,
    /// Sum of bytes.
    pub bytes: u64,
    /// Longest stream's seconds.
    #[serde(deserialize_with = "f64_or_nan")]
    pub seconds: f64,
    /// Aggregate Gbit/s.
    #[serde(deserialize_with = "f64_or_nan")]
    pub gbit_s: f64,
    /// Stream threads' CPU seconds, summed.
    #[serde(deserialize_with = "f64_or_nan")]
    pub cpu_s: f64,
    /// Stream threads' CPU seconds per GB (10^9 bytes).
    #[serde(deserialize_with = "f64_or_nan")]
    pub cpu_s_per_gb: f64,
    /// Whole-host CPU seconds (all CPUs, `/proc/stat`: user+system+irq+softirq) during the
    /// test; includes the kernel's network work done outside the stream threads.
    #[serde(deserialize_with = "f64_or_nan")]
    pub host_cpu_s: f64,
    /// Whole-host CPU seconds per GB.
    #[serde(deserialize_with = "f64_or_nan")]
    pub host_cpu_s_per_gb: f64,
    /// Syscalls per operation (send or receive chunk).
    #[serde(deserialize_with = "f64_or_nan")]
    pub syscalls_per_op: f64,
    /// COPIED fraction over all streams (bytes-weighted; see [`StreamReport::copied_fraction`]).
    pub copied_fraction: Option<f64>,
    /// TCP sender: retransmitted segments, summed.
    pub retransmits: Option<u64>,
}

impl SideReport {
    /// Sums the streams into the totals; `host_cpu_s` is set by the caller.
    pub fn total(role: &str, host: HostInfo, streams: Vec<StreamReport>, host_cpu_s: f64) -> Self {
        let bytes: u64 = streams.iter().map(|s| s.bytes).sum();
        let seconds = streams.iter().map(|s| s.seconds).fold(0.0, f64::max);
        let cpu_s: f64 = streams.iter().map(|s| s.cpu_s).sum();
        let ops: u64 = streams.iter().map(|s| s.ops).sum();
        let sys: u64 = streams.iter().map(|s| s.syscalls).sum();
        let per_gb = |c: f64| {
            if bytes == 0 {
                f64::NAN
            } else {
                c / (bytes as f64 / 1e9)
            }
        };
        let zc: Vec<(f64, u64)> = streams
            .iter()
            .filter_map(|s| s.copied_fraction.map(|f| (f, s.bytes)))
            .collect();
        let zc_bytes: u64 = zc.iter().map(|x| x.1).sum();
        let copied_fraction = (!zc.is_empty()).then(|| {
            if zc_bytes == 0 {
                zc.iter().map(|x| x.0).sum::<f64>() / zc.len() as f64
            } else {
                zc.iter().map(|(f, b)| f * *b as f64).sum::<f64>() / zc_bytes as f64
            }
        });
        let retransmits = streams.iter().any(|s| s.retransmits.is_some()).then(|| {
            streams
                .iter()
                .filter_map(|s| s.retransmits)
                .map(u64::from)
                .sum()
        });
        Self {
            role: role.to_string(),
            host,
            bytes,
            seconds,
            gbit_s: if seconds > 0.0 {
                bytes as f64 * 8.0 / seconds / 1e9
            } else {
                0.0
            },
            cpu_s,
            cpu_s_per_gb: per_gb(cpu_s),
            host_cpu_s,
            host_cpu_s_per_gb: per_gb(host_cpu_s),
            syscalls_per_op: if ops == 0 {
                0.0
            } else {
                sys as f64 / ops as f64
            },
            copied_fraction,
            retransmits,
            streams,
        }
    }
}

/// JSON has no NaN: serde_json writes a non-finite `f64` as `null`; read `null` back as NaN
/// (a figure that could not be measured, e.g. CPU per GB of a stream that moved nothing).
fn f64_or_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Writes one framed message.
pub fn write_msg<T: Serialize>(w: &mut impl Write, m: &T) -> Result<()> {
    let body = serde_json::to_vec(m)?;
    anyhow::ensure!(
        body.len() <= MAX_MSG,
        "message of {} bytes too large",
        body.len()
    );
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame).context("writing a control message")?;
    Ok(())
}

/// Reads one framed message; refuses frames over [`MAX_MSG`] before reading them.
pub fn read_msg<T: DeserializeOwned>(r: &mut impl Read) -> Result<T> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)
        .context("reading a control message length")?;
    let n = u32::from_be_bytes(len) as usize;
    if n == 0 || n > MAX_MSG {
        bail!("control message length {n} out of range 1..={MAX_MSG}");
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body)
        .with_context(|| format!("reading a control message of {n} bytes"))?;
    serde_json::from_slice(&body).map_err(|e| anyhow::anyhow!("bad control message: {e}"))
}

/// A fresh 128-bit cookie from the kernel's random pool, as 32 hex digits.
pub fn new_cookie() -> Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("reading /dev/urandom")?;
    Ok(hex(&b))
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Parses a 32-digit hex cookie.
pub fn parse_cookie(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// A UDP hello datagram.
pub fn udp_hello(cookie: &[u8; 16], stream: u32) -> [u8; UDP_HELLO_LEN] {
    let mut d = [0u8; UDP_HELLO_LEN];
    d[..8].copy_from_slice(UDP_HELLO);
    d[8..24].copy_from_slice(cookie);
    d[24..28].copy_from_slice(&stream.to_be_bytes());
    d
}

/// Parses a UDP hello: `(cookie, stream)`, or `None` for anything else.
pub fn parse_udp_hello(d: &[u8]) -> Option<([u8; 16], u32)> {
    if d.len() != UDP_HELLO_LEN || &d[..8] != UDP_HELLO {
        return None;
    }
    Some((
        d[8..24].try_into().ok()?,
        u32::from_be_bytes(d[24..28].try_into().ok()?),
    ))
}

/// A valid one-stream, one-second TCP test: the fixture the protocol and server tests vary.
#[cfg(test)]
pub fn test_params() -> Params {
    Params {
        udp: false,
        streams: 1,
        duration_ms: 1000,
        reverse: false,
        len: 65536,
        rate_bps: 0,
        tx: "auto".into(),
        rx: "auto".into(),
        verify: false,
        depth: 64,
        interval_ms: 1000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        test_params()
    }

    #[test]
    fn control_messages_round_trip_through_frames() {
        let h = Hello::control(&params());
        let mut buf = Vec::new();
        write_msg(&mut buf, &h).unwrap();
        assert_eq!(
            u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize,
            buf.len() - 4
        );
        let back: Hello = read_msg(&mut &buf[..]).unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn oversized_empty_truncated_and_garbage_frames_are_refused() {
        let mut big = (u32::MAX).to_be_bytes().to_vec();
        big.extend_from_slice(b"{}");
        let e = read_msg::<Hello>(&mut &big[..]).unwrap_err().to_string();
        assert!(e.contains("out of range"), "{e}");
        let zero = 0u32.to_be_bytes();
        assert!(read_msg::<Hello>(&mut &zero[..]).is_err());
        let mut short = 100u32.to_be_bytes().to_vec();
        short.extend_from_slice(b"{\"data\":");
        assert!(read_msg::<Hello>(&mut &short[..]).is_err());
        let mut junk = 4u32.to_be_bytes().to_vec();
        junk.extend_from_slice(b"\xff\x00ab");
        let e = read_msg::<Hello>(&mut &junk[..]).unwrap_err().to_string();
        assert!(e.contains("bad control message"), "{e}");
        // HTTP or a TLS hello: the "length" is huge, refused before any allocation.
        let e = read_msg::<Hello>(&mut &b"GET / HTTP/1.1\r\n\r\n"[..])
            .unwrap_err()
            .to_string();
        assert!(e.contains("out of range"), "{e}");
    }

    #[test]
    fn parameters_out_of_range_are_named() {
        assert!(params().check().is_ok());
        for (p, word) in [
            (
                Params {
                    streams: 0,
                    ..params()
                },
                "streams",
            ),
            (
                Params {
                    streams: 100_000,
                    ..params()
                },
                "streams",
            ),
            (
                Params {
                    duration_ms: 0,
                    ..params()
                },
                "duration",
            ),
            (
                Params {
                    duration_ms: u64::MAX,
                    ..params()
                },
                "duration",
            ),
            (Params { len: 0, ..params() }, "write size"),
            (
                Params {
                    len: u64::MAX,
                    ..params()
                },
                "write size",
            ),
            (
                Params {
                    depth: 0,
                    ..params()
                },
                "depth",
            ),
            (
                Params {
                    tx: "x".repeat(10_000),
                    ..params()
                },
                "send path",
            ),
            (
                Params {
                    rx: "fast".into(),
                    ..params()
                },
                "receive path",
            ),
        ] {
            let e = p.check().unwrap_err().to_string();
            assert!(e.contains(word), "{e}");
            assert!(e.len() < 200, "error echoes the input: {e}");
        }
        let p = Params {
            len: u64::MAX,
            depth: u32::MAX,
            ..params()
        };
        assert_eq!(p.send_memory(), u64::MAX);
    }

    #[test]
    fn cookies_and_udp_hellos_parse_only_when_well_formed() {
        let c = new_cookie().unwrap();
        let b = parse_cookie(&c).unwrap();
        assert_eq!(hex(&b), c);
        assert!(parse_cookie("zz").is_none());
        assert!(parse_cookie(&"g".repeat(32)).is_none());
        assert!(parse_cookie("é".repeat(16).as_str()).is_none());
        let d = udp_hello(&b, 7);
        assert_eq!(parse_udp_hello(&d), Some((b, 7)));
        assert!(parse_udp_hello(&d[..20]).is_none());
        let mut bad = d;
        bad[0] = b'X';
        assert!(parse_udp_hello(&bad).is_none());
    }

    #[test]
    fn figures_that_could_not_be_measured_survive_the_wire() {
        let r = SideReport::total(
            "receiver",
            HostInfo::default(),
            vec![StreamReport::default()],
            0.0,
        );
        assert!(r.cpu_s_per_gb.is_nan());
        let mut buf = Vec::new();
        write_msg(&mut buf, &Msg::Results(Box::new(r))).unwrap();
        let Msg::Results(back) = read_msg::<Msg>(&mut &buf[..]).unwrap() else {
            panic!("not results")
        };
        assert!(back.cpu_s_per_gb.is_nan());
        assert_eq!(back.bytes, 0);
    }

    #[test]
    fn totals_weigh_copied_by_bytes_and_sum_retransmits() {
        let s = |bytes, f, r| StreamReport {
            bytes,
            seconds: 1.0,
            cpu_s: 0.5,
            ops: 10,
            syscalls: 20,
            copied_fraction: f,
            retransmits: r,
            ..StreamReport::default()
        };
        let t = SideReport::total(
            "sender",
            HostInfo::default(),
            vec![
                s(3_000_000_000, Some(1.0), Some(2)),
                s(1_000_000_000, Some(0.0), Some(3)),
            ],
            2.0,
        );
        assert_eq!(t.bytes, 4_000_000_000);
        assert!((t.copied_fraction.unwrap() - 0.75).abs() < 1e-9);
        assert_eq!(t.retransmits, Some(5));
        assert!((t.cpu_s_per_gb - 0.25).abs() < 1e-9);
        assert!((t.host_cpu_s_per_gb - 0.5).abs() < 1e-9);
        assert!((t.syscalls_per_op - 2.0).abs() < 1e-9);
        assert!((t.gbit_s - 32.0).abs() < 1e-9);
    }
}

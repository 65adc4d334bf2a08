//! `zcio perf server|client`: an iperf3-style throughput tool for zcio's send and receive
//! paths between real hosts.
//!
//! One TCP control connection per test carries the parameters and both sides' results as
//! versioned, length-framed JSON ([`proto`]); data streams (TCP connections to the same port,
//! or UDP sockets on ports the server hands out) say hello with the test's cookie first. The
//! client prints both sides: Gbit/s, CPU seconds per GB of the stream threads and of the whole
//! host, syscalls per operation, TCP retransmits, and the COPIED fraction of the sender.
//!
//! The server is built to face the network: connection, test and per-client memory limits,
//! handshake and idle timeouts, every length and offset from the wire checked, a misbehaving
//! client dropped with a logged reason while the others carry on, and accept errors such as
//! EMFILE backed off instead of retried at once.

pub mod client;
pub mod hostinfo;
pub mod pattern;
pub mod proto;
pub mod server;
pub mod stream;
pub mod test;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// Default port (iperf3's).
pub const DEFAULT_PORT: u16 = 5201;

/// `zcio perf` subcommands.
#[derive(Subcommand, Debug)]
pub enum PerfCmd {
    /// Serve tests: receive (or with a client's -R, send) and report to the client.
    Server(ServerArgs),
    /// Run a test against a server and print both sides' figures.
    Client(ClientArgs),
}

/// Server options.
#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Address or host name to listen on (`ADDR` or `ADDR:PORT`); default: every address
    /// (IPv6 and IPv4).
    #[arg(short = 'B', long = "bind")]
    pub bind: Option<String>,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(short = 'p', long = "port")]
    pub port: Option<u16>,
    /// Accepted for compatibility; the client chooses TCP or UDP per test.
    #[arg(short = 'u', long, hide = true)]
    pub udp: bool,
    /// Refuse tests whose stream does not carry the verification pattern, and check every
    /// byte.
    #[arg(long)]
    pub verify: bool,
    /// First CPU to pin stream threads to (stream i gets CPU (N + i) mod CPUs).
    #[arg(short = 'A', long = "cpu", visible_alias = "affinity")]
    pub cpu: Option<usize>,
    /// Serve one test and exit (`-1` in iperf3).
    #[arg(short = '1', long, visible_alias = "one-off")]
    pub once: bool,
    /// Receive path when the server receives: plain, bufring, zcrx (on the NIC queue of
    /// --zcrx-queue, else device-less on Linux 7.1+, where the kernel copies into the zcrx
    /// area; older kernels fall back to bufring with the reason), auto (the client's choice,
    /// which defaults to the best available).
    #[arg(long, default_value = "auto")]
    pub rx: String,
    /// Interface and rx queue for zcrx (`IF:QUEUE`); without it `--rx zcrx` is device-less.
    #[arg(long)]
    pub zcrx_queue: Option<String>,
    /// Print one JSON line per test.
    #[arg(short = 'J', long)]
    pub json: bool,
    /// Connections open at once (handshaking, control and data); more are closed at accept.
    #[arg(long, default_value_t = 256)]
    pub max_conns: usize,
    /// Tests running at once.
    #[arg(long, default_value_t = 8)]
    pub max_tests: usize,
    /// Buffer memory one test may use on the server (e.g. 1G).
    #[arg(long, default_value = "1G")]
    pub max_client_mem: String,
    /// Longest test a client may ask for.
    #[arg(long, default_value = "1h")]
    pub max_duration: String,
    /// Time a new connection has to say hello, and a test to attach its streams.
    #[arg(long, default_value = "5s")]
    pub handshake_timeout: String,
    /// A stream or control connection silent this long is dropped.
    #[arg(long, default_value = "10s")]
    pub idle_timeout: String,
}

/// Client options.
#[derive(Args, Debug)]
pub struct ClientArgs {
    /// Server: host name or address, optionally with `:PORT` (`[v6]:PORT`).
    #[arg(value_name = "HOST")]
    pub host: Option<String>,
    /// Server (alias of HOST, as in earlier versions: `--connect 127.0.0.1:5201`).
    #[arg(short = 'c', long = "connect", conflicts_with = "host")]
    pub connect: Option<String>,
    /// Server port (default 5201, or the port in HOST).
    #[arg(short = 'p', long = "port")]
    pub port: Option<u16>,
    /// Resolve HOST to IPv4 only.
    #[arg(short = '4', long = "ipv4", conflicts_with = "ipv6")]
    pub ipv4: bool,
    /// Resolve HOST to IPv6 only.
    #[arg(short = '6', long = "ipv6")]
    pub ipv6: bool,
    /// Parallel streams, each on its own thread pinned to its own CPU.
    #[arg(short = 'P', long = "parallel", default_value_t = 1)]
    pub parallel: u32,
    /// How long to send (10, 5s, 500ms, 2m).
    #[arg(
        short = 't',
        long = "time",
        visible_alias = "duration",
        default_value = "10s"
    )]
    pub time: String,
    /// Seconds between interval lines (0: none).
    #[arg(short = 'i', long = "interval", default_value = "1s")]
    pub interval: String,
    /// Reverse: the server sends, the client receives.
    #[arg(short = 'R', long)]
    pub reverse: bool,
    /// UDP instead of TCP.
    #[arg(short = 'u', long)]
    pub udp: bool,
    /// UDP: send to N peers (the server opens a port for each, at most 128) from one
    /// unconnected socket on one send ring: each write is a GSO train to one peer
    /// (`SENDMSG_ZC` with the destination and `UDP_SEGMENT`), round-robin; -b is per peer.
    /// Replaces -P.
    #[arg(long, value_name = "N", requires = "udp", conflicts_with_all = ["parallel", "reverse"])]
    pub peers: Option<u32>,
    /// Rate per stream in bit/s (10M, 1G; K/M/G are powers of 1000 here); 0 = unlimited.
    #[arg(short = 'b', long = "bitrate", visible_alias = "bandwidth")]
    pub bitrate: Option<String>,
    /// Bytes per write (TCP default 128K, UDP default 1400; K/M = 1024-based).
    #[arg(short = 'l', long = "len", visible_alias = "size")]
    pub len: Option<String>,
    /// Send path of the sending host: copy, msg-zc, uring-zc, uring-zc-fixed, auto.
    #[arg(long, default_value = "auto")]
    pub tx: String,
    /// Receive path of the receiving host: plain, bufring, zcrx, auto.
    #[arg(long, default_value = "auto")]
    pub rx: String,
    /// First CPU to pin stream threads to (stream i gets CPU (N + i) mod CPUs; default 0).
    #[arg(short = 'A', long = "cpu", visible_alias = "affinity")]
    pub cpu: Option<usize>,
    /// Sends in flight per stream.
    #[arg(long, default_value_t = 64)]
    pub depth: usize,
    /// MSG_ZEROCOPY: reap completions after this many sends.
    #[arg(long, default_value_t = 32)]
    pub notify_limit: usize,
    /// io_uring paths: sends queued per submitting io_uring_enter.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Send the verification pattern; the receiver checks every byte.
    #[arg(long)]
    pub verify: bool,
    /// Print one JSON document with both sides and the intervals.
    #[arg(short = 'J', long)]
    pub json: bool,
}

/// Runs a perf subcommand.
pub fn run(cmd: PerfCmd) -> Result<()> {
    match cmd {
        PerfCmd::Server(a) => server::run(a),
        PerfCmd::Client(a) => test::run(a),
    }
}

/// Parses `5s`, `500ms`, `2m`, `1.5s`, `1h`, or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v * mult < 1e9 => {
            Ok(Duration::from_secs_f64(v * mult))
        }
        _ => bail!("bad duration '{s}': expected e.g. 5s, 500ms or 2m"),
    }
}

/// Parses a bit rate: `100M`, `1G`, `2.5G`, `1000000` (decimal multiples, as iperf3).
pub fn parse_rate(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1e3),
        Some('m' | 'M') => (&t[..t.len() - 1], 1e6),
        Some('g' | 'G') => (&t[..t.len() - 1], 1e9),
        Some('t' | 'T') => (&t[..t.len() - 1], 1e12),
        _ => (t, 1.0),
    };
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * mult < 1e15 => Ok((v * mult) as u64),
        _ => bail!("bad bitrate '{s}': expected e.g. 100M or 1G (bit/s)"),
    }
}

/// Splits `HOST`, `HOST:PORT`, `[V6]:PORT`, `V6` into host and optional port.
pub fn split_host_port(s: &str) -> Result<(String, Option<u16>)> {
    let s = s.trim();
    if s.is_empty() {
        bail!("empty host");
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (h, tail) = rest
            .split_once(']')
            .with_context(|| format!("bad address '{s}': missing ']'"))?;
        let port = match tail {
            "" => None,
            t => Some(parse_port(t.strip_prefix(':').unwrap_or(t), s)?),
        };
        return Ok((h.to_string(), port));
    }
    if s.parse::<IpAddr>().is_ok() {
        return Ok((s.to_string(), None));
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Ok((h.to_string(), Some(parse_port(p, s)?))),
        _ => Ok((s.to_string(), None)),
    }
}

fn parse_port(p: &str, whole: &str) -> Result<u16> {
    p.parse()
        .map_err(|_| anyhow::anyhow!("bad port in '{whole}': expected 0..65535"))
}

/// Address family filter for resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Either.
    Any,
    /// IPv4 only.
    V4,
    /// IPv6 only.
    V6,
}

/// Resolves a host name or address (getaddrinfo through the standard library) to socket
/// addresses on `port`, in the resolver's order.
pub fn resolve(host: &str, port: u16, fam: Family) -> Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve host '{host}'"))?
        .filter(|a| match fam {
            Family::Any => true,
            Family::V4 => a.is_ipv4(),
            Family::V6 => a.is_ipv6(),
        })
        .collect();
    if addrs.is_empty() {
        bail!("host '{host}' has no {fam:?} address");
    }
    Ok(addrs)
}

/// Stream `i`'s CPU when the first is `base`: one CPU per stream, wrapping around.
pub fn stream_cpu(base: usize, i: usize) -> usize {
    (base + i) % zcio_testnet::cpu::online_cpus().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_rates_and_host_ports_parse() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("1e300").is_err());
        assert_eq!(parse_rate("100M").unwrap(), 100_000_000);
        assert_eq!(parse_rate("2.5G").unwrap(), 2_500_000_000);
        assert_eq!(parse_rate("0").unwrap(), 0);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("-1M").is_err());
        assert_eq!(split_host_port("h:80").unwrap(), ("h".into(), Some(80)));
        assert_eq!(split_host_port("h").unwrap(), ("h".into(), None));
        assert_eq!(split_host_port("::1").unwrap(), ("::1".into(), None));
        assert_eq!(split_host_port("[::1]:9").unwrap(), ("::1".into(), Some(9)));
        assert_eq!(
            split_host_port("10.1.2.3:5201").unwrap(),
            ("10.1.2.3".into(), Some(5201))
        );
        assert!(split_host_port("h:99999").is_err());
        assert!(split_host_port("[::1").is_err());
    }

    #[test]
    fn any_address_and_host_names_resolve() {
        // No address filter: any literal resolves, host names go through the resolver.
        assert_eq!(
            resolve("10.1.2.3", 5201, Family::Any).unwrap(),
            vec!["10.1.2.3:5201".parse().unwrap()]
        );
        let lo = resolve("localhost", 7, Family::Any).unwrap();
        assert!(lo.iter().all(|a| a.ip().is_loopback()), "{lo:?}");
        assert!(resolve("127.0.0.1", 1, Family::V6).is_err());
        assert!(resolve("no-such-host.invalid", 1, Family::Any).is_err());
    }
}

//! `zcio perf server|client`: a netperf-like throughput tool for `tx::Sender`.
//!
//! The client sends fixed-size writes for a duration through one of the send paths and
//! reports Gbit/s, its CPU seconds per GB, syscalls per send and the COPIED fraction. The
//! server receives with plain blocking reads and can verify the stream's bytes (the client
//! must then also pass `--verify`). UDP: each datagram starts with its stream offset; the
//! client ends with an empty datagram.
//!
//! Addresses are restricted to loopback and the test ranges (198.18.0.0/15, 2001:db8::/32).

pub mod client;
pub mod pattern;
pub mod server;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// `zcio perf` subcommands.
#[derive(Subcommand, Debug)]
pub enum PerfCmd {
    /// Receive and report (plain blocking reads).
    Server(ServerArgs),
    /// Send for a duration and report.
    Client(ClientArgs),
}

/// Server options.
#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:5201")]
    pub bind: String,
    /// UDP instead of TCP.
    #[arg(long)]
    pub udp: bool,
    /// Check every byte against the stream pattern (the client must send with --verify).
    #[arg(long)]
    pub verify: bool,
    /// Pin the receiving thread to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Serve one connection (or one UDP stream) and exit.
    #[arg(long)]
    pub once: bool,
    /// TCP receive path: plain (epoll + recv), bufring (provided-buffer ring + multishot recv),
    /// zcrx (io_uring zero-copy receive: on the NIC queue of --zcrx-queue, else device-less on
    /// Linux 7.1+, where the kernel copies into the zcrx area; older kernels fall back to
    /// bufring), auto (best available).
    #[arg(long, default_value = "auto")]
    pub rx: String,
    /// Interface and rx queue for zcrx (`IF:QUEUE`), with `--rx zcrx|auto`; without it
    /// `--rx zcrx` is device-less.
    #[arg(long)]
    pub zcrx_queue: Option<String>,
    /// Print reports as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Client options.
#[derive(Args, Debug)]
pub struct ClientArgs {
    /// Server address.
    #[arg(long, default_value = "127.0.0.1:5201")]
    pub connect: String,
    /// UDP instead of TCP.
    #[arg(long)]
    pub udp: bool,
    /// Send path: copy, msg-zc, uring-zc, uring-zc-fixed, auto.
    #[arg(long, default_value = "auto")]
    pub tx: String,
    /// Bytes per send (4K, 64K, 1M).
    #[arg(long, default_value = "64K")]
    pub size: String,
    /// How long to send (5s, 500ms).
    #[arg(long, default_value = "5s")]
    pub duration: String,
    /// Pin the sending thread to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Sends in flight (buffers in the pool).
    #[arg(long, default_value_t = 64)]
    pub depth: usize,
    /// MSG_ZEROCOPY: reap completions after this many sends.
    #[arg(long, default_value_t = 32)]
    pub notify_limit: usize,
    /// io_uring paths: sends queued per submitting io_uring_enter.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Fill each buffer with the stream pattern (for a server with --verify).
    #[arg(long)]
    pub verify: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs a perf subcommand.
pub fn run(cmd: PerfCmd) -> Result<()> {
    match cmd {
        PerfCmd::Server(a) => server::run(a),
        PerfCmd::Client(a) => client::run(a),
    }
}

/// Parses `5s`, `500ms`, `2m`, `1.5s`.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(Duration::from_secs_f64(v * mult)),
        _ => bail!("bad duration '{s}': expected e.g. 5s, 500ms or 2m"),
    }
}

/// Parses an address and refuses anything outside loopback and the test ranges.
pub fn parse_test_addr(s: &str) -> Result<SocketAddr> {
    let addr: SocketAddr = match s.parse() {
        Ok(a) => a,
        Err(_) => bail!("bad address '{s}': expected IP:PORT, e.g. 127.0.0.1:5201 or [::1]:5201"),
    };
    if !is_test_ip(addr.ip()) {
        bail!(
            "address {} is not loopback or a test host (198.18.0.0/15, 2001:db8::/32): zcio perf \
             only sends to those",
            addr.ip()
        );
    }
    Ok(addr)
}

fn is_test_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback() || v4.is_unspecified() || (o[0] == 198 && (o[1] & 0xfe) == 18)
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            v6.is_loopback() || v6.is_unspecified() || (s[0] == 0x2001 && s[1] == 0x0db8)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_addresses_are_checked() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_test_addr("127.0.0.1:1").is_ok());
        assert!(parse_test_addr("198.19.3.4:1").is_ok());
        assert!(parse_test_addr("[2001:db8::2]:1").is_ok());
        assert!(parse_test_addr("8.8.8.8:53").is_err());
        assert!(parse_test_addr("[2001:4860::1]:53").is_err());
        assert!(parse_test_addr("localhost").is_err());
    }
}

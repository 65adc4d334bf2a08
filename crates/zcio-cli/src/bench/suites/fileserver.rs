//! `fileserver`: the HTTP/1.1 file server of `zcio_examples::fileserver` under tokio, its
//! socket I/O through zcio's `Receiver` + `Sender` (async adapters on their readiness
//! descriptors) vs through tokio's own `TcpStream`; same workers, same request handling,
//! same `pread` into the send buffers. Load: `wrk` downloading one large file over
//! keep-alive connections on loopback.
//!
//! Loopback only: the sink path (a veth whose peer is down) cannot carry TCP — there is no
//! peer to complete the handshake or acknowledge data — so an HTTP server cannot run over
//! it; the `tx` suite measures the send path to the sink with UDP instead.

use crate::bench::{Better, Ctx, MetricDef, Sample, Suite};
use anyhow::{bail, Context, Result};
use std::process::Command;
use std::sync::atomic::Ordering;
use zcio::tx::TxMode;
use zcio_examples::fileserver::{FileServer, FileServerConfig, Io};
use zcio_testnet::tempdir::TempDir;

/// The suite.
pub struct FileServerSuite;

const METRICS: &[MetricDef] = &[
    MetricDef::new("throughput", "Gbit/s", Better::Higher),
    MetricDef::new("req_per_s", "req/s", Better::Higher),
    MetricDef::new("server_cpu_per_gb", "s/GB", Better::Lower),
];

const FILE_LEN: usize = 16 << 20;

impl Suite for FileServerSuite {
    fn name(&self) -> &'static str {
        "fileserver"
    }
    fn about(&self) -> &'static str {
        "HTTP/1.1 file server under tokio, wrk on loopback: zcio Sender/Receiver vs tokio TcpStream"
    }
    fn chart_metric(&self) -> &'static str {
        "throughput"
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        if Command::new("wrk").arg("--version").output().is_err() {
            return Err(ctx.skip("wrk not installed (scripts/deps)"));
        }
        let dir = TempDir::new("fsbench").context("temp dir")?;
        let data: Vec<u8> = (0..FILE_LEN as u64)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(dir.join("big.bin"), &data).context("writing the served file")?;
        ctx.note(
            "sink path not measured: an HTTP server needs a TCP peer, and the sink's veth \
             peer is down (nothing answers the handshake); see the tx suite for the sink",
        );
        ctx.note("server: 2 workers, one current-thread runtime each; server CPU from /proc/self/stat (10 ms ticks)");
        let secs = ctx.pick(1, 10);
        let conns = 4;
        let case = format!(
            "GET {} keep-alive, {conns} conns",
            crate::bench::measure::size_label(FILE_LEN)
        );
        let root = dir.path().to_path_buf();
        ctx.compare(
            &case,
            ("tokio TcpStream", "zcio Sender/Receiver (auto/bufring)"),
            METRICS,
            || run_once(Io::Tokio, TxMode::Auto, &root, conns, secs),
            || run_once(Io::Zcio, TxMode::Auto, &root, conns, secs),
        )?;
        // The same with zcio's copy path: what the adapters and the Receiver cost by
        // themselves, without zero-copy (which loopback copies at delivery anyway).
        ctx.compare(
            &format!("{case}, zcio copy path"),
            ("tokio TcpStream", "zcio Sender/Receiver (copy/bufring)"),
            METRICS,
            || run_once(Io::Tokio, TxMode::Copy, &root, conns, secs),
            || run_once(Io::Zcio, TxMode::Copy, &root, conns, secs),
        )?;
        Ok(())
    }
}

fn run_once(
    io: Io,
    tx_mode: TxMode,
    root: &std::path::Path,
    conns: usize,
    secs: u32,
) -> Result<Sample> {
    let cfg = FileServerConfig {
        tx_mode,
        ..FileServerConfig::new(io, root)
    };
    let srv = FileServer::start(cfg, "127.0.0.1:0".parse()?)?;
    let cpu0 = crate::bench::measure::process_cpu()?;
    let out = Command::new("wrk")
        .args([
            "-t",
            "2",
            "-c",
            &conns.to_string(),
            "-d",
            &format!("{secs}s"),
        ])
        .args(["--timeout", "10s"])
        .arg(format!("http://{}/big.bin", srv.addr))
        .output()
        .context("running wrk")?;
    let cpu = crate::bench::measure::process_cpu()? - cpu0;
    let addr = srv.addr;
    let stats = srv.stop()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() || text.contains("Socket errors") || text.contains("Non-2xx") {
        bail!("wrk against {addr} ({io:?}) reported errors: {text}");
    }
    let errors = stats.errors.load(Ordering::Relaxed);
    if errors > 0 {
        bail!("the {io:?} server had {errors} connection errors");
    }
    let (reqs, wall) = text
        .lines()
        .find_map(|l| {
            let (n, rest) = l.trim().split_once(" requests in ")?;
            let t = rest.split(',').next()?.trim();
            let wall = if let Some(ms) = t.strip_suffix("ms") {
                ms.parse::<f64>().ok()? / 1e3
            } else {
                t.strip_suffix('s')?.parse::<f64>().ok()?
            };
            Some((n.trim().parse::<u64>().ok()?, wall))
        })
        .with_context(|| format!("no request count in wrk's output: {text}"))?;
    let bytes = reqs * FILE_LEN as u64;
    let mut s = Sample::default();
    s.set("throughput", crate::bench::measure::gbit_per_s(bytes, wall));
    s.set("req_per_s", reqs as f64 / wall.max(1e-9));
    s.set(
        "server_cpu_per_gb",
        crate::bench::measure::cpu_s_per_gb(cpu, bytes),
    );
    if io == Io::Zcio {
        s.note(format!(
            "zcio paths: tx {}, rx {}",
            stats.tx_path.lock().expect("lock"),
            stats.rx_path.lock().expect("lock")
        ));
    }
    Ok(s)
}

//! `tokio`: zcio's tokio streams (`zcio::tokio::LocalIo` + `TcpStream`: one send ring and one
//! receiver per thread) against tokio's own `TcpStream`, on loopback.
//!
//! - `new connection set-up`: adding 200 accepted connections to the thread's `LocalIo`
//!   (no ring each) against the earlier way, a `Sender` (a ring each) wrapped in an
//!   `AsyncSender`; µs per connection.
//! - `16 x 64M write_all`: a server writes 64 MiB to each of 16 connections with
//!   `write_all` (zcio: copied into the thread's send pool and batched on the ring), client
//!   threads read and count every byte; throughput and the server thread's CPU per GB.
//!   Loopback copies every byte at delivery (COPIED 1.0 on the zero-copy paths; `auto` sends
//!   by `uring-copy` here), so this row measures syscalls and batching, not zero-copy.

use crate::bench::{Better, Ctx, MetricDef, Sample, Suite};
use anyhow::{Context, Result};
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use tokio::io::AsyncWriteExt;

/// The suite.
pub struct TokioSuite;

const SETUP: &[MetricDef] = &[MetricDef::new("setup_us", "µs/conn", Better::Lower)];
const BULK: &[MetricDef] = &[
    MetricDef::new("throughput", "Gbit/s", Better::Higher),
    MetricDef::new("server_cpu_per_gb", "s/GB", Better::Lower),
];

impl Suite for TokioSuite {
    fn name(&self) -> &'static str {
        "tokio"
    }
    fn about(&self) -> &'static str {
        "tokio streams on one ring per thread (LocalIo) vs tokio TcpStream / a ring per Sender, loopback"
    }
    fn chart_metric(&self) -> &'static str {
        "throughput"
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        ctx.note(
            "loopback: every byte is copied at delivery (COPIED 1.0 where zero-copy is tried; \
             auto sends by uring-copy), so the bulk row measures syscalls and batching",
        );
        ctx.compare(
            "new connection set-up, 200 conns",
            (
                "Sender + AsyncSender (a ring each)",
                "LocalIo::from_std (shared ring)",
            ),
            SETUP,
            || setup(false),
            || setup(true),
        )?;
        let len = ctx.pick(16usize << 20, 64 << 20);
        ctx.compare(
            &format!("16 x {} write_all", crate::bench::measure::size_label(len)),
            ("tokio TcpStream", "zcio TcpStream (LocalIo)"),
            BULK,
            || bulk(false, 16, len),
            || bulk(true, 16, len),
        )?;
        Ok(())
    }
}

fn pairs(n: usize) -> Result<(Vec<TcpStream>, Vec<TcpStream>)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let mut clients = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..n {
        clients.push(TcpStream::connect(l.local_addr()?)?);
        servers.push(l.accept()?.0);
    }
    Ok((clients, servers))
}

fn local_block_on<F: std::future::Future>(f: F) -> Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    Ok(local.block_on(&rt, f))
}

fn setup(shared: bool) -> Result<Sample> {
    const N: usize = 200;
    let (clients, servers) = pairs(N)?;
    let us = local_block_on(async move {
        let pool = zcio::Pool::new(64 << 10, 16, false)?;
        let io = zcio::tokio::LocalIo::new()?;
        let t0 = std::time::Instant::now();
        if shared {
            let mut v = Vec::new();
            for s in servers {
                v.push(io.from_std(s)?);
            }
            let us = t0.elapsed().as_secs_f64() * 1e6 / N as f64;
            drop(v);
            Ok::<f64, anyhow::Error>(us)
        } else {
            let mut v = Vec::new();
            for s in servers {
                let tx = zcio::Sender::new(s, &pool, zcio::SenderConfig::default())?;
                v.push(zcio::tokio::AsyncSender::new(tx)?);
            }
            let us = t0.elapsed().as_secs_f64() * 1e6 / N as f64;
            drop(v);
            Ok(us)
        }
    })??;
    drop(clients);
    let mut s = Sample::default();
    s.set("setup_us", us);
    Ok(s)
}

fn bulk(zcio: bool, conns: usize, len: usize) -> Result<Sample> {
    let (clients, servers) = pairs(conns)?;
    let readers: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                let mut n = 0usize;
                loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return n,
                        Ok(k) => n += k,
                    }
                }
            })
        })
        .collect();
    let t0 = std::time::Instant::now();
    let (cpu, path) = local_block_on(async move {
        let cpu0 = zcio_testnet::cpu::thread_cpu_time();
        let data = vec![7u8; 1 << 20];
        let io = zcio::tokio::LocalIo::new()?;
        let mut tasks = Vec::new();
        for s in servers {
            let data = data.clone();
            let io = io.clone();
            tasks.push(tokio::task::spawn_local(async move {
                if zcio {
                    let mut s = io.from_std(s)?;
                    for _ in 0..len / data.len() {
                        s.write_all(&data).await?;
                    }
                    s.shutdown().await?;
                } else {
                    s.set_nonblocking(true)?;
                    let mut s = tokio::net::TcpStream::from_std(s)?;
                    for _ in 0..len / data.len() {
                        s.write_all(&data).await?;
                    }
                    s.shutdown().await?;
                }
                Ok::<(), std::io::Error>(())
            }));
        }
        for t in tasks {
            t.await.context("server task")??;
        }
        let cpu = (zcio_testnet::cpu::thread_cpu_time() - cpu0).as_secs_f64();
        Ok::<_, anyhow::Error>((cpu, io.describe()))
    })??;
    let mut bytes = 0u64;
    for r in readers {
        let n = r.join().map_err(|_| anyhow::anyhow!("reader panicked"))?;
        anyhow::ensure!(n == len, "a reader got {n} of {len} bytes");
        bytes += n as u64;
    }
    let wall = t0.elapsed().as_secs_f64();
    let mut s = Sample::default();
    s.set("throughput", crate::bench::measure::gbit_per_s(bytes, wall));
    s.set(
        "server_cpu_per_gb",
        crate::bench::measure::cpu_s_per_gb(cpu, bytes),
    );
    if zcio {
        s.note(format!("zcio: {path}"));
    }
    Ok(s)
}

//! `loopback`: TCP over 127.0.0.1, plain `send` vs `MSG_ZEROCOPY` with zcio's batched errqueue
//! reaper, for 4K–1M writes, sender and receiver on the same core and on different cores.
//!
//! Loopback delivery always copies (the kernel copies zero-copy frags before local delivery),
//! so every zero-copy completion here carries the COPIED code; the suite says so in its notes.

use crate::bench::measure::{core_plan, cpu_s_per_gb, gbit_per_s, size_label, Span};
use crate::bench::pair::{ensure_bytes, pair};
use crate::bench::{Better, Ctx, MetricDef, Sample, Suite};
use anyhow::{Context, Result};
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use zcio::sys::{errqueue, net, MSG_ZEROCOPY};

/// The suite.
pub struct Loopback;

const METRICS: &[MetricDef] = &[
    MetricDef::new("throughput", "Gbit/s", Better::Higher),
    MetricDef::new("sender_cpu", "s/GB", Better::Lower),
    MetricDef::new("syscalls_per_write", "calls", Better::Lower),
    MetricDef::new("copied_fraction", "fraction", Better::Lower),
];

const SIZES: &[usize] = &[4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20];

impl Suite for Loopback {
    fn name(&self) -> &'static str {
        "loopback"
    }
    fn about(&self) -> &'static str {
        "TCP over 127.0.0.1: plain send vs MSG_ZEROCOPY + batched errqueue reaper, 4K-1M writes, same vs split cores"
    }
    fn chart_metric(&self) -> &'static str {
        "sender_cpu"
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        ctx.note(
            "loopback delivery copies: the kernel copies zero-copy pages before local delivery \
             (skb_orphan_frags_rx), so MSG_ZEROCOPY here is a copy plus notification overhead; \
             completions carry SO_EE_CODE_ZEROCOPY_COPIED",
        );
        let dur = ctx.run_time();
        for split in [false, true] {
            for &size in SIZES {
                let case = format!(
                    "tcp {} {}",
                    size_label(size),
                    if split { "split-cores" } else { "same-core" }
                );
                ctx.compare(
                    &case,
                    ("send(2)", "MSG_ZEROCOPY+reaper"),
                    METRICS,
                    || run_once(size, split, dur, false),
                    || run_once(size, split, dur, true),
                )?;
            }
        }
        Ok(())
    }
}

struct SendStats {
    bytes: u64,
    syscalls: u64,
    writes: u64,
    zc_ranges: u64,
    copied_ranges: u64,
    cpu: f64,
}

fn run_once(size: usize, split: bool, dur: Duration, zerocopy: bool) -> Result<Sample> {
    let case = format!("loopback tcp {}", size_label(size));
    let p = pair(case).cores(core_plan(split));
    let listener = TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1")?;
    let addr = listener.local_addr()?;
    let receiver = p.server(move || -> std::io::Result<(u64, Instant)> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 256 << 10];
        let mut total = 0u64;
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok((total, Instant::now()));
            }
            total += n as u64;
        }
    })?;
    let t0 = Instant::now();
    let sender = p.client(move || -> std::io::Result<SendStats> {
        let s = TcpStream::connect(addr)?;
        send_loop(&s, size, dur, zerocopy)
    })?;
    let st = sender.io_result()?;
    let (rbytes, t_end) = receiver.io_result()?;
    ensure_bytes(rbytes, st.bytes)?;
    let wall = (t_end - t0).as_secs_f64();
    let mut s = Sample::default();
    s.set("throughput", gbit_per_s(rbytes, wall))
        .set("sender_cpu", cpu_s_per_gb(st.cpu, st.bytes))
        .set(
            "syscalls_per_write",
            st.syscalls as f64 / st.writes.max(1) as f64,
        );
    if zerocopy {
        let total = (st.zc_ranges + st.copied_ranges).max(1);
        s.set("copied_fraction", st.copied_ranges as f64 / total as f64);
    } else {
        s.set("copied_fraction", 1.0);
    }
    Ok(s)
}

/// Sends `size`-byte writes for `dur`; with `zerocopy`, reaps completions in batches and waits
/// for all of them before returning (the buffer is only released once the kernel is done).
fn send_loop(
    s: &TcpStream,
    size: usize,
    dur: Duration,
    zerocopy: bool,
) -> std::io::Result<SendStats> {
    let buf = vec![0xa5u8; size];
    let mut st = SendStats {
        bytes: 0,
        syscalls: 0,
        writes: 0,
        zc_ranges: 0,
        copied_ranges: 0,
        cpu: 0.0,
    };
    if zerocopy {
        net::enable_zerocopy(s)?;
    }
    let flags = if zerocopy { MSG_ZEROCOPY } else { 0 };
    let mut ranges = Vec::with_capacity(64);
    let mut errors = Vec::new();
    let mut sent_calls: u64 = 0;
    let mut completed: u64 = 0;
    let span = Span::start();
    let deadline = Instant::now() + dur;
    let account = |ranges: &mut Vec<errqueue::ZcRange>, st: &mut SendStats, completed: &mut u64| {
        for r in ranges.drain(..) {
            *completed += r.len();
            if r.copied {
                st.copied_ranges += r.len();
            } else {
                st.zc_ranges += r.len();
            }
        }
    };
    while Instant::now() < deadline {
        let mut off = 0;
        while off < size {
            st.syscalls += 1;
            match net::send(s, &buf[off..], flags) {
                Ok(n) => {
                    off += n;
                    st.bytes += n as u64;
                    if zerocopy {
                        sent_calls += 1;
                    }
                }
                Err(e) if zerocopy && e.raw_os_error() == Some(libc::ENOBUFS) => {
                    // optmem_max reached: wait for completions to free notification memory.
                    st.syscalls += 1;
                    net::poll_one(s, libc::POLLERR, 100)?;
                }
                Err(e) => return Err(e),
            }
            if zerocopy && sent_calls - completed >= 32 {
                let r = errqueue::reap(s, &mut ranges, &mut errors, 0)?;
                st.syscalls += r.syscalls;
                account(&mut ranges, &mut st, &mut completed);
            }
        }
        st.writes += 1;
    }
    while zerocopy && completed < sent_calls {
        st.syscalls += 1;
        net::poll_one(s, libc::POLLERR, 1000)?;
        let r = errqueue::reap(s, &mut ranges, &mut errors, 0)?;
        st.syscalls += r.syscalls;
        account(&mut ranges, &mut st, &mut completed);
    }
    st.cpu = span.stop().1;
    s.shutdown(std::net::Shutdown::Write)?;
    if !errors.is_empty() {
        return Err(std::io::Error::other(format!(
            "error queue reported {errors:?}"
        )));
    }
    Ok(st)
}

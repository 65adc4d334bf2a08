//! `shim`: unmodified event-loop servers on loopback, native vs under
//! `LD_PRELOAD=libzcio_epoll.so` (epoll served by the event ring), alternating runs against two
//! servers started side by side: req/s, p99 latency, server CPU per request. nginx, lighttpd
//! and haproxy under wrk, redis-server under redis-benchmark, memcached under our own client
//! (`bench::mcload`: pipelined get/set, every reply verified, p50/p99; memslap has no
//! percentiles) and under Debian's `memcaslap` (libmemcached-tools; its default 90 % get /
//! 10 % set mix, 50 connections, one request in flight per connection), with 1 and 4 workers.
//!
//! The shim is found next to the `zcio` binary (`target/release/libzcio_epoll.so`; built by
//! `scripts/bench`). Loopback request rates drift run to run: the rounds alternate.

use crate::bench::mcload::{self, proto::Mix};
use crate::bench::{Better, Ctx, MetricDef, Sample, Suite};
use anyhow::{anyhow, bail, Context, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zcio_testnet::tempdir::{read_nofollow, write_new, TempDir};

/// The suite.
pub struct Shim;

const METRICS: &[MetricDef] = &[
    MetricDef::new("req_per_s", "req/s", Better::Higher),
    MetricDef::new("p99_latency", "ms", Better::Lower),
    MetricDef::new("server_cpu_per_req", "us", Better::Lower),
];

/// memcached's: our client also gives the median.
const MC_METRICS: &[MetricDef] = &[
    MetricDef::new("req_per_s", "req/s", Better::Higher),
    MetricDef::new("p50_latency", "ms", Better::Lower),
    MetricDef::new("p99_latency", "ms", Better::Lower),
    MetricDef::new("server_cpu_per_req", "us", Better::Lower),
];

/// Every server the suite runs, with the load tool each needs (`None`: our own client); the
/// test below holds it against the cases and scripts/deps.
#[cfg(test)]
const SERVERS: &[(&str, Option<&str>)] = &[
    ("nginx", Some("wrk")),
    ("redis-server", Some("redis-benchmark")),
    ("lighttpd", Some("wrk")),
    ("haproxy", Some("wrk")),
    ("memcached", None),
    ("memcached", Some("memcaslap")),
];

/// memcaslap reports throughput only.
const MEMCASLAP_METRICS: &[MetricDef] = &[
    MetricDef::new("req_per_s", "req/s", Better::Higher),
    MetricDef::new("server_cpu_per_req", "us", Better::Lower),
];

impl Suite for Shim {
    fn name(&self) -> &'static str {
        "shim"
    }
    fn about(&self) -> &'static str {
        "unmodified nginx, lighttpd, haproxy (wrk), redis-server (redis-benchmark) and memcached (own pipelined get/set client; memcaslap) on loopback: native epoll vs LD_PRELOAD libzcio_epoll.so (event ring)"
    }
    fn chart_metric(&self) -> &'static str {
        "req_per_s"
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        let shim = find_shim().map_err(|e| ctx.skip(e.to_string()))?;
        let secs = ctx.pick(2, 10);
        ctx.note(format!(
            "the shim: {}; no data is copied differently: the shim changes only how readiness \
             reaches the program (COPIED fraction not applicable)",
            shim.display()
        ));
        let mut ran = false;
        if let (Some(nginx), Some(wrk)) = (which("nginx"), which("wrk")) {
            let body = vec![b'x'; 1024];
            // Default: EPOLL_WAIT over the program's own epoll fd (Linux 6.15). The poll ring
            // (ZCIO_EPOLL_BACKEND=poll) with DEFER_TASKRUN: wake-ups run only when the loop
            // enters the ring, so about every wait enters; with COOP_TASKRUN they run on any
            // kernel exit of the worker (its recv/writev), so most waits find events in
            // shared memory.
            for (label, env) in [
                ("", &[][..]),
                (
                    ", shim on the poll ring",
                    &[("ZCIO_EPOLL_BACKEND", "poll")][..],
                ),
                (
                    ", shim on the poll ring with COOP_TASKRUN",
                    &[
                        ("ZCIO_EPOLL_BACKEND", "poll"),
                        ("ZCIO_EPOLL_TASKRUN", "coop"),
                    ][..],
                ),
            ] {
                let native = Server::nginx(&nginx, &body, None)?;
                let shimmed = Server::nginx(&nginx, &body, Some(&Shimmed(&shim, env)))?;
                ctx.compare(
                    &format!("nginx 1 worker, 1 KiB file, wrk 1 thread 32 conns{label}"),
                    ("native epoll", "libzcio_epoll.so"),
                    METRICS,
                    || wrk_run(&wrk, &native, secs),
                    || wrk_run(&wrk, &shimmed, secs),
                )?;
                drop(native);
                if let Some(st) = shimmed.finish()? {
                    ctx.note(format!("nginx under the shim{label}, per process: {st}"));
                }
            }
            ran = true;
        } else {
            ctx.note("nginx or wrk missing (scripts/deps installs them): nginx case skipped");
        }
        if let (Some(redis), Some(rb)) = (which("redis-server"), which("redis-benchmark")) {
            for (label, env) in [
                ("", &[][..]),
                (
                    ", shim on the poll ring",
                    &[("ZCIO_EPOLL_BACKEND", "poll")][..],
                ),
            ] {
                let native = Server::redis(&redis, None)?;
                let shimmed = Server::redis(&redis, Some(&Shimmed(&shim, env)))?;
                let n = ctx.pick(40_000, 200_000);
                ctx.compare(
                    &format!("redis GET, redis-benchmark 32 conns{label}"),
                    ("native epoll", "libzcio_epoll.so"),
                    METRICS,
                    || redis_run(&rb, &native, n),
                    || redis_run(&rb, &shimmed, n),
                )?;
                drop(native);
                if let Some(st) = shimmed.finish()? {
                    ctx.note(format!("redis under the shim{label}: {st}"));
                }
            }
            ran = true;
        } else {
            ctx.note("redis-server or redis-benchmark missing: redis case skipped");
        }
        // Two more loops: lighttpd (its own, epoll_create1) and haproxy (its own, 1 thread
        // here), both under wrk like nginx.
        for name in ["lighttpd", "haproxy"] {
            let (Some(bin), Some(wrk)) = (which(name), which("wrk")) else {
                ctx.note(format!(
                    "{name} or wrk missing (scripts/deps): {name} case skipped"
                ));
                continue;
            };
            let start = |shim: Option<&Shimmed>| match name {
                "lighttpd" => Server::lighttpd(&bin, &[b'x'; 1024], shim),
                _ => Server::haproxy(&bin, shim),
            };
            let native = start(None)?;
            let shimmed = start(Some(&Shimmed(&shim, &[])))?;
            ctx.compare(
                &format!("{name}, 1 KiB response, wrk 1 thread 32 conns"),
                ("native epoll", "libzcio_epoll.so"),
                METRICS,
                || wrk_run(&wrk, &native, secs),
                || wrk_run(&wrk, &shimmed, secs),
            )?;
            drop(native);
            let mut shimmed = shimmed;
            if name == "haproxy" {
                // haproxy stops on SIGUSR1 (soft stop); SIGTERM leaves it running until the
                // group is killed, which would lose its exit stats.
                kill(shimmed.child.id() as i32, libc::SIGUSR1);
                let deadline = Instant::now() + Duration::from_secs(3);
                while Instant::now() < deadline && !matches!(shimmed.child.try_wait(), Ok(Some(_)))
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            if let Some(st) = shimmed.finish()? {
                ctx.note(format!("{name} under the shim: {st}"));
            }
            ran = true;
        }
        // memcached (libevent, one loop per worker thread; 1 worker here, its listener on
        // the main thread's loop) under our own client: without pipelining, and 8 deep.
        if let Some(mc) = which("memcached") {
            for depth in [1, 8] {
                let native = Server::memcached(&mc, None)?;
                let shimmed = Server::memcached(&mc, Some(&Shimmed(&shim, &[])))?;
                ctx.compare(
                    &format!(
                        "memcached 1 worker, 32 conns x {depth} pipelined, 90% get / 10% set, \
                         100 B values, every reply verified"
                    ),
                    ("native epoll", "libzcio_epoll.so"),
                    MC_METRICS,
                    || memcached_run(&native, depth, secs),
                    || memcached_run(&shimmed, depth, secs),
                )?;
                drop(native);
                if let Some(st) = shimmed.finish()? {
                    ctx.note(format!("memcached under the shim, depth {depth}: {st}"));
                }
            }
            ran = true;
        } else {
            ctx.note("memcached missing (scripts/deps): memcached case skipped");
        }
        // memcached as a user would load it: Debian's memcaslap, one thread, 50 connections
        // with one request in flight each, its default mix (90 % get / 10 % set, values of
        // up to ~1 KiB); 1 and 4 workers. With few events per wait (each worker sleeps for
        // about every request) the ring's waits cost more than epoll_wait: the shim hands
        // such instances to the real epoll (the note shows `handed_instances`).
        if let (Some(mc), Some(slap)) = (which("memcached"), which("memcaslap")) {
            for threads in [1, 4] {
                let native = Server::memcached_with(&mc, threads, None)?;
                let shimmed = Server::memcached_with(&mc, threads, Some(&Shimmed(&shim, &[])))?;
                ctx.compare(
                    &format!(
                        "memcached -t {threads}, memcaslap -T1 -c50 default get/set mix \
                         ({secs} s runs)"
                    ),
                    ("native epoll", "libzcio_epoll.so"),
                    MEMCASLAP_METRICS,
                    || memcaslap_run(&slap, &native, secs),
                    || memcaslap_run(&slap, &shimmed, secs),
                )?;
                drop(native);
                if let Some(st) = shimmed.finish()? {
                    ctx.note(format!(
                        "memcached -t {threads} under memcaslap, under the shim: {st}"
                    ));
                }
                // The same comparison between two native servers: how far apart two identical
                // servers measure in this run. A handed instance runs the real epoll, so the
                // shim's rows above are at parity when they differ from native by no more
                // than this row does.
                let a = Server::memcached_with(&mc, threads, None)?;
                let b = Server::memcached_with(&mc, threads, None)?;
                ctx.compare(
                    &format!(
                        "memcached -t {threads}, memcaslap -T1 -c50 default get/set mix \
                         ({secs} s runs), native vs native (the run's spread)"
                    ),
                    ("native epoll", "native epoll, a second server"),
                    MEMCASLAP_METRICS,
                    || memcaslap_run(&slap, &a, secs),
                    || memcaslap_run(&slap, &b, secs),
                )?;
            }
            ran = true;
        } else {
            ctx.note("memcached or memcaslap missing (scripts/deps): memcaslap cases skipped");
        }
        if !ran {
            return Err(ctx.skip(
                "none of nginx+wrk, redis-server+redis-benchmark, lighttpd+wrk, haproxy+wrk, \
                 memcached installed",
            ));
        }
        Ok(())
    }
}

fn find_shim() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("zcio binary has no directory")?;
    let p = dir.join("libzcio_epoll.so");
    if p.exists() {
        Ok(p)
    } else {
        bail!(
            "{} not built (cargo build --release -p zcio-preload; scripts/bench does it)",
            p.display()
        )
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file());
    found
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The shim and extra environment for it.
struct Shimmed<'a>(&'a Path, &'a [(&'a str, &'a str)]);

/// A server in its own process group and temp dir; killed with its group on drop.
struct Server {
    child: Child,
    port: u16,
    dir: TempDir,
    shim: bool,
}

/// The account nginx workers run as when the bench runs as root: `(user, group, uid, gid)`.
/// The files they must read or write are given to it; nothing is made world-accessible.
fn worker_account() -> Option<(String, String, u32, u32)> {
    if !zcio_testnet::is_root() {
        return None;
    }
    let id = |flag: &str| -> Option<String> {
        let o = Command::new("id").args([flag, "nobody"]).output().ok()?;
        o.status
            .success()
            .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    Some((
        "nobody".into(),
        id("-gn")?,
        id("-u")?.parse().ok()?,
        id("-g")?.parse().ok()?,
    ))
}

/// A directory (mode 0700) owned by the worker account when there is one.
fn private_dir(path: &Path, owner: Option<(u32, u32)>) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(path)?;
    if let Some((u, g)) = owner {
        std::os::unix::fs::lchown(path, Some(u), Some(g))?;
    }
    Ok(())
}

impl Server {
    fn spawn(
        mut cmd: Command,
        port: u16,
        dir: TempDir,
        shim: Option<&Shimmed>,
        owner: Option<(u32, u32)>,
    ) -> Result<Self> {
        if let Some(Shimmed(s, env)) = shim {
            for (k, v) in *env {
                cmd.env(k, v);
            }
            // Created exclusively (never through a planted symlink), 0600, owned by the
            // process that appends to it; the directory is not writable by it, so the file
            // cannot be swapped for a link.
            let stats = dir.join("stats");
            let f = write_new(&stats, b"", 0o600)?;
            if let Some((u, g)) = owner {
                std::os::unix::fs::fchown(&f, Some(u), Some(g))?;
            }
            cmd.env("LD_PRELOAD", s).env("ZCIO_EPOLL_STATS", &stats);
        }
        let log = write_new(&dir.join("out.log"), b"", 0o600)?;
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        let child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let s = Server {
            child,
            port,
            dir,
            shim: shim.is_some(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!(
                    "server on port {port} did not start: see {}",
                    s.dir.path().display()
                );
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        Ok(s)
    }

    fn nginx(nginx: &Path, body: &[u8], shim: Option<&Shimmed>) -> Result<Self> {
        let dir = TempDir::new("bench-nginx")?;
        // As root, the master keeps root and the workers run as `nobody`: the directory
        // becomes traversable (0711, not listable, not writable), and only www/ (the file
        // served, the temp paths) and the stats file belong to the workers.
        let worker = worker_account();
        let owner = worker.as_ref().map(|w| (w.2, w.3));
        if owner.is_some() {
            std::fs::set_permissions(dir.path(), PermissionsExt::from_mode(0o711))?;
        }
        private_dir(&dir.join("www"), owner)?;
        private_dir(&dir.join("www/tmp"), owner)?;
        let f = write_new(&dir.join("www/file"), body, 0o600)?;
        if let Some((u, g)) = owner {
            std::os::unix::fs::fchown(&f, Some(u), Some(g))?;
        }
        let port = free_port()?;
        let d = dir.path().display();
        let user = worker
            .as_ref()
            .map_or(String::new(), |w| format!("user {} {};\n", w.0, w.1));
        let conf = format!(
            "{user}daemon off;\nmaster_process on;\nworker_processes 1;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\nevents {{ worker_connections 4096; }}\n\
             http {{\n access_log off;\n sendfile on;\n tcp_nopush on;\n keepalive_requests 100000000;\n\
             client_body_temp_path {d}/www/tmp;\n proxy_temp_path {d}/www/tmp;\n\
             fastcgi_temp_path {d}/www/tmp;\n uwsgi_temp_path {d}/www/tmp;\n scgi_temp_path {d}/www/tmp;\n\
             server {{ listen 127.0.0.1:{port}; root {d}/www; location / {{ }} }}\n}}\n"
        );
        write_new(&dir.join("nginx.conf"), conf.as_bytes(), 0o600)?;
        let mut cmd = Command::new(nginx);
        cmd.arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(dir.join("nginx.conf"));
        cmd.arg("-e").arg(dir.join("error.log"));
        Self::spawn(cmd, port, dir, shim, owner)
    }

    fn lighttpd(bin: &Path, body: &[u8], shim: Option<&Shimmed>) -> Result<Self> {
        let dir = TempDir::new("bench-lighttpd")?;
        private_dir(&dir.join("www"), None)?;
        write_new(&dir.join("www/file"), body, 0o600)?;
        let port = free_port()?;
        let conf = format!(
            "server.document-root = \"{d}/www\"\nserver.port = {port}\n\
             server.bind = \"127.0.0.1\"\nserver.event-handler = \"linux-sysepoll\"\n\
             server.errorlog = \"{d}/error.log\"\nserver.max-keep-alive-requests = 100000000\n\
             server.max-connections = 4096\n",
            d = dir.path().display()
        );
        write_new(&dir.join("lighttpd.conf"), conf.as_bytes(), 0o600)?;
        let mut cmd = Command::new(bin);
        cmd.arg("-D").arg("-f").arg(dir.join("lighttpd.conf"));
        Self::spawn(cmd, port, dir, shim, None)
    }

    fn haproxy(bin: &Path, shim: Option<&Shimmed>) -> Result<Self> {
        let dir = TempDir::new("bench-haproxy")?;
        let port = free_port()?;
        let body = "x".repeat(1024);
        let conf = format!(
            "global\n  nbthread 1\ndefaults\n  mode http\n  timeout client 30s\n  \
             timeout connect 5s\n  timeout server 30s\nfrontend fe\n  bind 127.0.0.1:{port}\n  \
             http-request return status 200 content-type text/plain string \"{body}\"\n"
        );
        write_new(&dir.join("haproxy.cfg"), conf.as_bytes(), 0o600)?;
        let mut cmd = Command::new(bin);
        cmd.arg("-db").arg("-f").arg(dir.join("haproxy.cfg"));
        Self::spawn(cmd, port, dir, shim, None)
    }

    fn memcached(bin: &Path, shim: Option<&Shimmed>) -> Result<Self> {
        Self::memcached_args(bin, &["-t", "1", "-m", "64", "-c", "1024"], shim)
    }

    /// memcached as the user ran it: `-t threads -m 256 -c 4096`.
    fn memcached_with(bin: &Path, threads: usize, shim: Option<&Shimmed>) -> Result<Self> {
        let t = threads.to_string();
        Self::memcached_args(bin, &["-t", &t, "-m", "256", "-c", "4096"], shim)
    }

    fn memcached_args(bin: &Path, args: &[&str], shim: Option<&Shimmed>) -> Result<Self> {
        let dir = TempDir::new("bench-memcached")?;
        // As root memcached must drop to an account (-u): the directory becomes traversable
        // and the stats file (written at exit, after the drop) belongs to that account.
        let worker = worker_account();
        let owner = worker.as_ref().map(|w| (w.2, w.3));
        if owner.is_some() {
            std::fs::set_permissions(dir.path(), PermissionsExt::from_mode(0o711))?;
        }
        let port = free_port()?;
        let mut cmd = Command::new(bin);
        cmd.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"])
            .args(args);
        if let Some(w) = &worker {
            cmd.args(["-u", &w.0]);
        }
        Self::spawn(cmd, port, dir, shim, owner)
    }

    fn redis(redis: &Path, shim: Option<&Shimmed>) -> Result<Self> {
        let dir = TempDir::new("bench-redis")?;
        let port = free_port()?;
        let mut cmd = Command::new(redis);
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--protected-mode", "no"])
            .arg("--dir")
            .arg(dir.path());
        Self::spawn(cmd, port, dir, shim, None)
    }

    /// CPU seconds (user + system) of the server and its children (nginx workers).
    fn cpu_secs(&self) -> f64 {
        let pid = self.child.id();
        let mut total = proc_cpu(pid);
        if let Ok(rd) = std::fs::read_dir("/proc") {
            for e in rd.flatten() {
                let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
                    continue;
                };
                if proc_ppid(p) == Some(pid) {
                    total += proc_cpu(p);
                }
            }
        }
        total
    }

    /// Stops the server; for the shimmed one, returns what the shim wrote at exit and fails
    /// when it served no wait from the ring (it fell back: the comparison would be void).
    fn finish(mut self) -> Result<Option<String>> {
        self.stop();
        if !self.shim {
            return Ok(None);
        }
        let stats = read_nofollow(&self.dir.join("stats")).unwrap_or_default();
        let waits: u64 = stats
            .split_whitespace()
            .filter_map(|kv| kv.strip_prefix("ring_waits="))
            .filter_map(|v| v.parse::<u64>().ok())
            .sum();
        if waits == 0 {
            bail!("the shim served no wait from the event ring: {stats}");
        }
        let sum = |key: &str| -> u64 {
            stats
                .split_whitespace()
                .filter_map(|kv| kv.strip_prefix(key))
                .filter_map(|v| v.parse::<u64>().ok())
                .sum()
        };
        // A thread that waits on an instance the shim gave to another thread is served by the
        // real epoll_wait: a comparison where most waits did so measures the fallback (as
        // memcached's workers did before instances went to their first waiter).
        if sum("real_waits=") > waits {
            bail!("most waits went to the real epoll, not the event ring: {stats}");
        }
        // The ring's own kernel entries (io_uring_enter) plus the epoll_ctl calls the shim
        // passed to the kernel, per 1000 events it delivered from the ring.
        let entries = sum("ring_enters=") + sum("ring_ctls=");
        let per_1000 = entries as f64 * 1000.0 / sum("ring_events=").max(1) as f64;
        Ok(Some(format!(
            "kernel entries per 1000 ring events {per_1000:.1}; {}",
            stats.trim().replace('\n', "; ")
        )))
    }

    fn stop(&mut self) {
        let pid = self.child.id() as i32;
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        kill(pid, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        kill(-pid, libc::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The directory goes with `self.dir`, after the server has stopped.
        self.stop();
    }
}

/// Signals a process (or, with a negative pid, a process group) through kill(1), which keeps
/// the CLI free of unsafe code.
fn kill(pid: i32, sig: i32) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg("--")
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

fn proc_stat_fields(pid: u32) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

fn proc_ppid(pid: u32) -> Option<u32> {
    proc_stat_fields(pid)?.get(1)?.parse().ok()
}

fn proc_cpu(pid: u32) -> f64 {
    // Fields after the command: state(0) ppid(1) ... utime(11) stime(12), in clock ticks.
    let Some(f) = proc_stat_fields(pid) else {
        return 0.0;
    };
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

fn wrk_run(wrk: &Path, s: &Server, secs: u64) -> Result<Sample> {
    // A warm-up request so the worker is running.
    let mut c = TcpStream::connect(("127.0.0.1", s.port))?;
    c.write_all(b"GET /file HTTP/1.0\r\n\r\n")?;
    let mut sink = Vec::new();
    c.read_to_end(&mut sink)?;
    let cpu0 = s.cpu_secs();
    let out = Command::new(wrk)
        .args(["-t1", "-c32", "--latency"])
        .arg(format!("-d{secs}s"))
        .arg(format!("http://127.0.0.1:{}/file", s.port))
        .output()
        .context("running wrk")?;
    let cpu = s.cpu_secs() - cpu0;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "wrk failed: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let super::wrk::WrkOut {
        rps,
        p99_ms: p99,
        reqs,
    } = super::wrk::parse(&text, secs as f64)?;
    let errors = text
        .lines()
        .any(|l| l.contains("Non-2xx") || l.contains("Socket errors"));
    let mut sm = Sample::default();
    sm.set("req_per_s", rps)
        .set("p99_latency", p99)
        .set("server_cpu_per_req", cpu / reqs.max(1.0) * 1e6);
    if errors {
        sm.note("wrk reported errors (see its output)");
    }
    Ok(sm)
}

fn memcached_run(s: &Server, depth: usize, secs: u64) -> Result<Sample> {
    let load = mcload::Load {
        addr: ([127, 0, 0, 1], s.port).into(),
        conns: 32,
        depth,
        mix: Mix {
            keys: 64,
            value_size: 100,
            get_percent: 90,
        },
        time: Duration::from_secs(secs),
        max_requests: u64::MAX,
    };
    let cpu0 = s.cpu_secs();
    let r = mcload::run(&load)?;
    let cpu = s.cpu_secs() - cpu0;
    let mut sm = Sample::default();
    sm.set("req_per_s", r.rate())
        .set("p50_latency", r.percentile_ms(50.0))
        .set("p99_latency", r.percentile_ms(99.0))
        .set("server_cpu_per_req", cpu / r.requests.max(1) as f64 * 1e6);
    Ok(sm)
}

/// One memcaslap run: req/s as it reports them (`Ops: N TPS: T`), server CPU per operation.
fn memcaslap_run(slap: &Path, s: &Server, secs: u64) -> Result<Sample> {
    let cpu0 = s.cpu_secs();
    let out = Command::new(slap)
        .arg("-s")
        .arg(format!("127.0.0.1:{}", s.port))
        .args(["-T1", "-c50"])
        .arg(format!("-t{secs}s"))
        .output()
        .context("running memcaslap")?;
    let cpu = s.cpu_secs() - cpu0;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "memcaslap failed: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (ops, tps) = parse_memcaslap(&text)?;
    let mut sm = Sample::default();
    sm.set("req_per_s", tps)
        .set("server_cpu_per_req", cpu / ops.max(1.0) * 1e6);
    Ok(sm)
}

/// memcaslap's summary line: `Run time: 5.0s Ops: 344717 TPS: 68926 Net_rate: 77.1M/s`.
fn parse_memcaslap(text: &str) -> Result<(f64, f64)> {
    let line = text
        .lines()
        .find(|l| l.starts_with("Run time:"))
        .ok_or_else(|| anyhow!("memcaslap printed no summary: {text}"))?;
    let field = |key: &str| -> Result<f64> {
        let mut it = line.split_whitespace();
        it.find(|w| *w == key)
            .and_then(|_| it.next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("memcaslap summary without {key} {line:?}"))
    };
    let ops = field("Ops:")?;
    if ops == 0.0 {
        bail!("memcaslap completed no operation: {text}");
    }
    Ok((ops, field("TPS:")?))
}

fn redis_run(rb: &Path, s: &Server, n: u64) -> Result<Sample> {
    let cpu0 = s.cpu_secs();
    let out = Command::new(rb)
        .args(["-h", "127.0.0.1", "-p", &s.port.to_string()])
        .args(["-c", "32", "-t", "get", "--csv"])
        .args(["-n", &n.to_string()])
        .output()
        .context("running redis-benchmark")?;
    let cpu = s.cpu_secs() - cpu0;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("redis-benchmark failed: {text}");
    }
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms",
    // "p99_latency_ms","max_latency_ms"
    let row = text
        .lines()
        .find(|l| l.starts_with("\"GET\""))
        .ok_or_else(|| anyhow!("redis-benchmark csv: {text}"))?;
    let f: Vec<f64> = row
        .split(',')
        .skip(1)
        .filter_map(|x| x.trim_matches('"').parse().ok())
        .collect();
    if f.len() < 6 {
        bail!("redis-benchmark csv row: {row}");
    }
    let mut sm = Sample::default();
    sm.set("req_per_s", f[0])
        .set("p99_latency", f[5])
        .set("server_cpu_per_req", cpu / n as f64 * 1e6);
    Ok(sm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcaslap_summary_is_parsed_and_an_empty_run_refused() {
        let out = "servers: 127.0.0.1:1\ncmd_get: 260211\n\n\
                   Run time: 3.0s Ops: 289148 TPS: 96357 Net_rate: 107.8M/s\n";
        assert_eq!(parse_memcaslap(out).unwrap(), (289148.0, 96357.0));
        assert!(parse_memcaslap("Run time: 3.0s Ops: 0 TPS: 0 Net_rate: 0M/s\n").is_err());
        assert!(parse_memcaslap("connection refused\n").is_err());
    }

    /// `scripts/deps` installs every server the suite runs and every load tool it drives.
    #[test]
    fn every_server_and_load_tool_of_the_suite_is_installed_by_scripts_deps() {
        let deps =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/deps"))
                .expect("scripts/deps");
        let listed = |cmd: &str| deps.contains(&format!("[{cmd}]="));
        for (server, tool) in SERVERS {
            assert!(listed(server), "{server} not in scripts/deps");
            if let Some(t) = tool {
                assert!(listed(t), "{t} not in scripts/deps");
            }
        }
        let about = Shim.about();
        for name in ["nginx", "redis-server", "lighttpd", "haproxy", "memcached"] {
            assert!(SERVERS.iter().any(|s| s.0 == name), "{name} not in SERVERS");
            assert!(about.contains(name), "about() does not name {name}");
        }
    }
}

//! Test helpers: the built shim, a C compiler, and unmodified nginx / redis-server started
//! in their own temp dirs on a free loopback port, stopped by a Drop guard (never left
//! running, even when a test panics).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `libzcio_epoll.so` as cargo built it for these tests.
pub fn shim_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let deps = exe.parent().expect("deps dir");
    for dir in [deps, deps.parent().expect("target dir")] {
        let p = dir.join("libzcio_epoll.so");
        if p.exists() {
            return p;
        }
    }
    panic!("libzcio_epoll.so not found next to {}", exe.display());
}

/// Finds a program in PATH or /usr/sbin; `None` prints SKIP (or panics under
/// ZCIO_REQUIRE_PRIV=1, where scripts/deps installed everything).
pub fn tool(test: &str, name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        let why = format!("{name} is not installed (scripts/deps installs it)");
        if std::env::var("ZCIO_REQUIRE_PRIV").as_deref() == Ok("1") {
            panic!("{test}: {why}");
        }
        println!("SKIP {test}: {why}");
    }
    found
}

/// Compiles `tests/c/<name>.c` (with `-lpthread`) into `dir`; `None` (after the SKIP or the
/// CI panic of [`tool`]) without a C compiler.
pub fn compile_c(dir: &TempDir, name: &str) -> Option<PathBuf> {
    let cc = tool(name, "cc")?;
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(format!("{name}.c"));
    let exe = dir.path().join(name);
    let st = Command::new(cc)
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-lpthread")
        .status()
        .expect("run cc");
    assert!(st.success(), "compiling {name}.c failed");
    Some(exe)
}

/// A fresh temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "zcio-{tag}-{}-{}",
            std::process::id(),
            Instant::now().elapsed().as_nanos() ^ rand_seed()
        ));
        std::fs::create_dir_all(&p).expect("mkdir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rand_seed() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// How to run a program under test.
#[derive(Clone, Debug, Default)]
pub struct Preload {
    /// The shim to preload, if any.
    pub shim: Option<PathBuf>,
    /// `ZCIO_EPOLL_STATS` file.
    pub stats: Option<PathBuf>,
    /// `ZCIO_EPOLL_LOG=1`.
    pub log: bool,
}

impl Preload {
    pub fn apply(&self, cmd: &mut Command) {
        if let Some(s) = &self.shim {
            cmd.env("LD_PRELOAD", s);
        }
        if let Some(s) = &self.stats {
            // nginx workers run as nobody: the file must be writable by anyone.
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(s);
            let _ = std::fs::set_permissions(s, std::fs::Permissions::from_mode(0o666));
            cmd.env("ZCIO_EPOLL_STATS", s);
        }
        if self.log {
            cmd.env("ZCIO_EPOLL_LOG", "1");
        }
    }
}

/// A started server, stopped (signal, wait, then SIGKILL of its process group) on drop.
pub struct Server {
    child: Option<Child>,
    stop_signal: i32,
    pub port: u16,
    pub dir: TempDir,
    pub log: PathBuf,
}

impl Server {
    fn spawn(mut cmd: Command, stop_signal: i32, port: u16, dir: TempDir, log: PathBuf) -> Self {
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = cmd.spawn().expect("spawn server");
        Server {
            child: Some(child),
            stop_signal,
            port,
            dir,
            log,
        }
    }

    /// Starts `cmd` (its own process group; output to `log`), stopped with `stop_signal`.
    pub fn spawn_with(
        cmd: Command,
        stop_signal: i32,
        port: u16,
        dir: TempDir,
        log: PathBuf,
    ) -> Self {
        Self::spawn(cmd, stop_signal, port, dir, log)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// The server's stdout/stderr so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops the server (graceful signal, 5 s, then SIGKILL to the whole group) and returns
    /// whether it exited on its own.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let pid = child.id() as i32;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, self.stop_signal) };
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut clean = false;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                clean = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: the group was created for this child (process_group(0)): workers included.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        let _ = child.wait();
        clean
    }

    /// Waits until `probe` succeeds (up to 10 s); panics with the server's output otherwise.
    pub fn wait_ready(&mut self, probe: impl Fn(u16) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if probe(self.port) {
                return;
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("server exited early ({st}): {}", self.output());
                }
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        panic!("server did not answer within 10 s: {}", self.output());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An unmodified nginx (master + `workers` workers) serving `files` from its temp prefix.
pub fn nginx(nginx: &Path, workers: usize, files: &[(&str, &[u8])], pre: &Preload) -> Server {
    let dir = TempDir::new("nginx");
    let root = dir.path().join("www");
    std::fs::create_dir_all(root.join("tmp")).expect("mkdir");
    for (name, body) in files {
        std::fs::write(root.join(name), body).expect("write file");
    }
    // Workers run as nobody when started by root: everything must be world-readable.
    let _ = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(dir.path())
        .status();
    let port = free_port();
    let d = dir.path().display();
    let conf = format!(
        "daemon off;\nmaster_process on;\nworker_processes {workers};\npid {d}/nginx.pid;\n\
         error_log {d}/error.log info;\nevents {{ worker_connections 1024; }}\n\
         http {{\n access_log off;\n sendfile on;\n keepalive_requests 1000000;\n\
         client_body_temp_path {d}/www/tmp;\n proxy_temp_path {d}/www/tmp;\n\
         fastcgi_temp_path {d}/www/tmp;\n uwsgi_temp_path {d}/www/tmp;\n scgi_temp_path {d}/www/tmp;\n\
         server {{ listen 127.0.0.1:{port}; root {d}/www; location / {{ }} }}\n}}\n"
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).expect("write conf");
    let mut cmd = Command::new(nginx);
    cmd.arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(dir.path().join("nginx.conf"))
        .arg("-e")
        .arg(dir.path().join("error.log"));
    pre.apply(&mut cmd);
    let log = dir.path().join("stderr.log");
    let mut s = Server::spawn(cmd, libc::SIGQUIT, port, dir, log);
    s.wait_ready(|p| http_get(p, "/").is_some());
    s
}

/// A minimal HTTP/1.0 GET: the status line and body, or None if nothing answered.
pub fn http_get(port: u16, path: &str) -> Option<(String, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..split]).to_string();
    let status = head.lines().next()?.to_string();
    Some((status, buf[split + 4..].to_vec()))
}

/// An unmodified redis-server on a free loopback port, without persistence.
pub fn redis(redis: &Path, pre: &Preload) -> Server {
    let dir = TempDir::new("redis");
    let port = free_port();
    let mut cmd = Command::new(redis);
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--protected-mode", "no", "--loglevel", "notice"])
        .arg("--dir")
        .arg(dir.path());
    pre.apply(&mut cmd);
    let log = dir.path().join("stderr.log");
    let mut s = Server::spawn(cmd, libc::SIGTERM, port, dir, log);
    s.wait_ready(redis_ping);
    s
}

/// PING over RESP.
pub fn redis_ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut b = [0u8; 16];
    matches!(s.read(&mut b), Ok(n) if b[..n].starts_with(b"+PONG"))
}

/// The shim with its log on and its stats file in `dir`; returns the file's path too.
pub fn shimmed(dir: &TempDir) -> (Preload, PathBuf) {
    let stats = dir.path().join("stats");
    (
        Preload {
            shim: Some(shim_path()),
            stats: Some(stats.clone()),
            log: true,
        },
        stats,
    )
}

/// Sums `key=value` fields over the lines of a `ZCIO_EPOLL_STATS` file.
pub fn stats_sum(path: &Path, key: &str) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == key)
        .filter_map(|(_, v)| v.parse::<u64>().ok())
        .sum()
}

/// Runs a test program (natively or under `pre`) with `args` and extra `env`; asserts it exits
/// 0 and returns its stdout and stderr (the shim's log).
pub fn run_program(
    exe: &Path,
    pre: &Preload,
    args: &[&str],
    env: &[(&str, &str)],
) -> (String, String) {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    pre.apply(&mut cmd);
    cmd.envs(env.iter().copied());
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", exe.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{stderr}",
        exe.display(),
        out.status
    );
    (stdout, stderr)
}

/// Asserts that a program printed the same lines natively and under the shim.
pub fn assert_same_output(native: &str, shimmed: &str, log: &str) {
    let diff: Vec<String> = native
        .lines()
        .zip(shimmed.lines())
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("  native: {a}\n  shim:   {b}"))
        .collect();
    assert!(
        diff.is_empty() && native.lines().count() == shimmed.lines().count(),
        "outputs differ:\n{}\nnative:\n{native}\nshim:\n{shimmed}\nshim log:\n{log}",
        diff.join("\n")
    );
}

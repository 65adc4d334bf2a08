//! The host's audit state for tests that change it (audit is global to the host): one test
//! at a time (a lock across test binaries), refused where another daemon is registered unless
//! the test only observes, and everything set back on drop — the enabled flag, the limits,
//! the registered pid, the rules the test added (each tagged with its own key).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use zcio::netlink::{audit_status, AuditEvent, AuditStatus, EventEnd};

static SERIAL: Mutex<()> = Mutex::new(());

/// The host's audit state while a test runs: locked, saved, and set back on drop.
#[derive(Debug)]
pub struct AuditHost {
    _guard: std::sync::MutexGuard<'static, ()>,
    _lock: std::fs::File,
    saved: AuditStatus,
    keys: Vec<String>,
    dir: PathBuf,
}

/// Runs `auditctl` with `args`.
pub fn auditctl(args: &[&str]) -> std::process::Output {
    Command::new("auditctl")
        .args(args)
        .output()
        .expect("auditctl runs")
}

impl AuditHost {
    /// `None` (skipped) without root, audit or auditctl; with `observer`, another registered
    /// daemon is allowed.
    pub fn take(test: &str, observer: bool) -> Option<Self> {
        let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        if !crate::is_root() {
            crate::skip(test, "needs root (CAP_AUDIT_CONTROL)");
            return None;
        }
        if Command::new("auditctl").arg("-v").output().is_err() {
            crate::skip(test, "auditctl missing (scripts/deps installs auditd)");
            return None;
        }
        let lock = std::fs::File::create("/tmp/zcio-audit.lock").expect("lock file");
        {
            use std::os::fd::AsRawFd;
            // SAFETY: flock on a descriptor this function owns; held until `lock` closes.
            let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
            assert_eq!(rc, 0, "flock /tmp/zcio-audit.lock");
        }
        let saved = match audit_status() {
            Ok(s) => s,
            Err(e) => {
                crate::skip(
                    test,
                    &format!("AUDIT_GET: {e} (not the initial namespaces?)"),
                );
                return None;
            }
        };
        if saved.enabled == 2 {
            crate::skip(test, "audit is locked (enabled 2)");
            return None;
        }
        if saved.pid != 0 && !observer {
            panic!(
                "{test}: pid {} is registered as the audit daemon: refusing to change the \
                 host's audit state beside it",
                saved.pid
            );
        }
        let dir = std::env::temp_dir().join(format!("zcio-audit-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Some(Self {
            _guard: guard,
            _lock: lock,
            saved,
            keys: Vec::new(),
            dir,
        })
    }

    /// The audit status when the host was taken.
    pub fn saved(&self) -> AuditStatus {
        self.saved
    }

    /// A directory of the test's own, removed on drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Adds a read watch on a fresh file, tagged with a key of its own; returns the file.
    pub fn watch(&mut self, name: &str) -> (PathBuf, String) {
        let file = self.dir.join(name);
        std::fs::write(&file, b"x").unwrap();
        let key = format!("zcio-{name}-{}", std::process::id());
        let f = file.to_str().unwrap();
        let o = auditctl(&["-w", f, "-p", "r", "-k", &key]);
        assert!(
            o.status.success(),
            "auditctl -w: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        self.keys.push(format!("{f}\0{key}"));
        (file, key)
    }
}

impl Drop for AuditHost {
    fn drop(&mut self) {
        for k in &self.keys {
            let (f, key) = k.split_once('\0').unwrap();
            let o = auditctl(&["-W", f, "-p", "r", "-k", key]);
            if !o.status.success() {
                eprintln!("auditctl -W {f}: {}", String::from_utf8_lossy(&o.stderr));
            }
        }
        let s = self.saved;
        let now = audit_status().ok();
        if now.is_some_and(|n| n.pid != 0 && s.pid == 0) {
            eprintln!(
                "audit: pid {} still registered after the test",
                now.unwrap().pid
            );
        }
        let o = set_back(&s);
        if !o.status.success() {
            eprintln!("auditctl restore: {}", String::from_utf8_lossy(&o.stderr));
        }
        let after = audit_status().expect("AUDIT_GET");
        let _ = std::fs::remove_dir_all(&self.dir);
        if !std::thread::panicking() {
            assert_eq!(
                (
                    after.enabled,
                    after.backlog_limit,
                    after.backlog_wait_time,
                    after.rate_limit
                ),
                (
                    s.enabled,
                    s.backlog_limit,
                    s.backlog_wait_time,
                    s.rate_limit
                ),
                "audit state set back"
            );
            if s.pid == 0 {
                assert_eq!(after.pid, 0, "no daemon left registered");
            }
        }
    }
}

/// A process that opens `file` `n` times (one `openat` each): a storm of events for a watch
/// on `file` ([`AuditHost::watch`]).
pub fn storm(file: &Path, n: usize) -> std::process::Child {
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "i=0; while [ $i -lt {n} ]; do : < '{}'; i=$((i+1)); done",
            file.display()
        ))
        .spawn()
        .expect("sh")
}

/// The `key` of an event's `SYSCALL` record (the rule's key that audited it).
pub fn key_of(ev: &AuditEvent) -> Option<String> {
    ev.records()
        .find(|r| r.ty == 1300)
        .and_then(|r| r.field("key"))
        .map(|k| String::from_utf8_lossy(&k).into_owned())
}

/// Whether `ev` is a whole `openat` event of `file`: closed by its end-of-event record, not
/// incomplete, `SYSCALL` first, a `PATH` record naming `file` and a `PROCTITLE` record.
pub fn whole(ev: &AuditEvent, file: &Path) -> bool {
    let types: Vec<u16> = ev.records().map(|r| r.ty).collect();
    let name = file.to_str().unwrap().as_bytes().to_vec();
    ev.end == EventEnd::Eoe
        && !ev.incomplete()
        && types.first() == Some(&1300)
        && types.contains(&1302)
        && types.contains(&1327)
        && ev
            .records()
            .any(|r| r.ty == 1302 && r.field("name").is_some_and(|n| *n == name[..]))
}

/// Sets the enabled flag, the backlog limit, the backlog wait time and the rate limit back to
/// `s`'s (`auditctl`).
pub fn set_back(s: &AuditStatus) -> std::process::Output {
    auditctl(&[
        "-e",
        &s.enabled.to_string(),
        "-b",
        &s.backlog_limit.to_string(),
        "--backlog_wait_time",
        &s.backlog_wait_time.to_string(),
        "-r",
        &s.rate_limit.to_string(),
    ])
}

/// auditd 3.0.9's configuration for a daemon of the tests' or benchmarks' own: `auditd -n -s
/// nochange -c DIR` logs to `DIR/audit.log` in the RAW format without flushing (`flush =
/// NONE`), with no plugin, no network and no disk-space action.
pub fn write_auditd_conf(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("plugins"))?;
    let d = dir
        .to_str()
        .ok_or_else(|| std::io::Error::other("a non-UTF-8 directory"))?;
    std::fs::write(dir.join("auditd.conf"), AUDITD_CONF.replace("DIR", d))
}

const AUDITD_CONF: &str = "local_events = yes
write_logs = yes
log_file = DIR/audit.log
log_group = root
log_format = RAW
flush = NONE
freq = 0
max_log_file = 4096
num_logs = 2
priority_boost = 0
name_format = NONE
max_log_file_action = IGNORE
space_left = 75
space_left_action = IGNORE
verify_email = no
action_mail_acct = root
admin_space_left = 50
admin_space_left_action = IGNORE
disk_full_action = IGNORE
disk_error_action = IGNORE
tcp_listen_queue = 5
tcp_max_per_addr = 1
tcp_client_max_idle = 0
transport = TCP
distribute_network = no
q_depth = 2000
overflow_action = IGNORE
max_restarts = 10
plugin_dir = DIR/plugins
end_of_event_timeout = 2
";

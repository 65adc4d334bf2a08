//! The shim's settings cannot be turned against a program: the stats file is never written
//! through a symlink planted at its path, and a set-user-ID program (the shim preloaded
//! system-wide, `/etc/ld.so.preload`) ignores `ZCIO_EPOLL_*` from its caller's environment.

mod common;

use common::{shim_path, tool, Preload, TempDir};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A program that makes one epoll instance, waits once on it, and exits (the shim writes its
/// stats line at exit). `link`: linked against the shim (for the set-user-ID case, where
/// `LD_PRELOAD` is not honoured) instead of preloading it.
fn build(dir: &Path, link: Option<&Path>) -> Option<PathBuf> {
    let cc = tool("settings", "cc")?;
    let src = dir.join("one_wait.c");
    std::fs::write(
        &src,
        "#include <sys/epoll.h>\n#include <unistd.h>\nint main(void) {\n\
         int ep = epoll_create1(0); struct epoll_event e;\n\
         return epoll_wait(ep, &e, 1, 1) < 0; }\n",
    )
    .unwrap();
    let exe = dir.join(if link.is_some() { "linked" } else { "plain" });
    let mut cmd = Command::new(cc);
    cmd.args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src);
    if let Some(lib_dir) = link {
        cmd.arg(format!("-L{}", lib_dir.display()))
            .arg("-lzcio_epoll")
            .arg(format!("-Wl,-rpath,{}", lib_dir.display()));
    }
    assert!(cmd.status().expect("cc").success(), "cc failed");
    Some(exe)
}

#[test]
fn the_stats_file_is_not_written_through_a_symlink() {
    let dir = TempDir::new("settings-link");
    let Some(exe) = build(dir.path(), None) else {
        return;
    };
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let link = dir.path().join("stats");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let mut cmd = Command::new(&exe);
    Preload {
        shim: Some(shim_path()),
        stats: None,
        log: false,
    }
    .apply(&mut cmd);
    cmd.env("ZCIO_EPOLL_STATS", &link);
    assert!(cmd.status().expect("run").success());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    // The same program writes a regular file at a plain path (the check above is not vacuous).
    let plain = dir.path().join("plain-stats");
    let mut cmd = Command::new(&exe);
    Preload {
        shim: Some(shim_path()),
        stats: None,
        log: false,
    }
    .apply(&mut cmd);
    cmd.env("ZCIO_EPOLL_STATS", &plain);
    assert!(cmd.status().expect("run").success());
    let text = std::fs::read_to_string(&plain).expect("stats written");
    assert!(text.contains("ring_instances="), "{text}");
    let mode = std::fs::metadata(&plain).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "created private");
}

#[test]
fn a_setuid_program_ignores_the_shims_settings() {
    let test = "a_setuid_program_ignores_the_shims_settings";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let why = "needs root to make a set-user-ID program and run it as nobody";
        if std::env::var("ZCIO_REQUIRE_PRIV").as_deref() == Ok("1") {
            panic!("{test}: {why}");
        }
        println!("SKIP {test}: {why}");
        return;
    }
    let Some(_) = tool(test, "setpriv") else {
        return;
    };
    let dir = TempDir::new("settings-suid");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // The shim next to the program, readable by nobody.
    let lib_dir = dir.path().join("lib");
    std::fs::create_dir(&lib_dir).unwrap();
    std::fs::copy(shim_path(), lib_dir.join("libzcio_epoll.so")).unwrap();
    let Some(exe) = build(dir.path(), Some(&lib_dir)) else {
        return;
    };
    let run_as_nobody = |stats: &Path| {
        let st = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&exe)
            .env("ZCIO_EPOLL_STATS", stats)
            .env("ZCIO_EPOLL_LOG", "1")
            .output()
            .expect("setpriv");
        assert!(st.status.success(), "{st:?}");
        String::from_utf8_lossy(&st.stderr).to_string()
    };
    // Not set-user-ID: the settings apply (the program really runs the shim).
    let control = dir.path().join("control-stats");
    let log = run_as_nobody(&control);
    assert!(control.exists(), "control run wrote no stats: {log}");
    assert!(
        log.contains("served by the event ring") || log.contains("unavailable"),
        "{log}"
    );
    // Set-user-ID root: secure execution; the caller's ZCIO_EPOLL_* are not read.
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let secure = dir.path().join("secure-stats");
    let log = run_as_nobody(&secure);
    assert!(
        !secure.exists(),
        "a set-user-ID program wrote the caller's stats file"
    );
    assert!(log.is_empty(), "a set-user-ID program logged: {log}");
}

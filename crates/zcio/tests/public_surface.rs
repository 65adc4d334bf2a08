//! The public surface: without the `unstable-raw` feature a user of the crate can name the
//! capabilities and their configs, and cannot name the kernel ABI (`sys`), the io_uring set-up
//! (`ring`) or the memory areas (`buf`).
//!
//! This crate's own tests build zcio with `unstable-raw` (a dev-dependency feature), and the
//! workspace's other members enable it too, so the check builds a small user crate outside the
//! workspace with `cargo check`, where zcio has no features: one file that must compile (the
//! capability surface) and one per raw module that must fail with "private module".

use std::path::{Path, PathBuf};
use std::process::Command;

/// Checks `src` as the `main.rs` of a crate that depends on zcio without features; returns
/// whether it compiled and cargo's stderr.
fn check_user_crate(dir: &Path, name: &str, src: &str) -> (bool, String) {
    let zcio = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let krate = dir.join(name);
    std::fs::create_dir_all(krate.join("src")).unwrap();
    std::fs::write(
        krate.join("Cargo.toml"),
        format!(
            "[package]\nname = \"{name}\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             publish = false\n\n[dependencies]\nzcio = {{ path = {:?} }}\n\n[workspace]\n",
            zcio.display().to_string()
        ),
    )
    .unwrap();
    std::fs::write(krate.join("src/main.rs"), src).unwrap();
    // The workspace's lock file pins the same dependency versions, so this builds offline.
    let lock = zcio.join("../../Cargo.lock");
    std::fs::copy(&lock, krate.join("Cargo.lock")).unwrap();
    let target = zcio.join("../../target/public-surface");
    let out = Command::new(env!("CARGO"))
        .args(["check", "--offline", "--quiet", "--manifest-path"])
        .arg(krate.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("run cargo check");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn raw_modules_are_private_without_the_unstable_raw_feature() {
    let dir = std::env::temp_dir().join(format!("zcio-public-surface-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    // The capability surface compiles for a user without features.
    let (ok, err) = check_user_crate(
        &dir,
        "surface_user",
        r#"
use zcio::stats::{Path, Report};
use zcio::{Counters, Fallback, Pool, PoolBuf, RingConfig, SetupFlag};
use zcio::{EventConfig, EventRing, NfQueue, NfQueueConfig, Receiver, RouteSocket, RxConfig};
use zcio::{CtEvents, CtEventsConfig, NfLog, NfLogConfig, Sender, SenderConfig};
use zcio::{Audit, AuditConfig};
fn report<R: Report>(r: &R) -> (Path, Counters, Vec<Fallback>) {
    (r.path().into(), r.counters(), r.fallbacks().to_vec())
}
fn main() {
    let _ = (report::<Sender>, report::<Receiver>, report::<EventRing>);
    let _ = (report::<NfQueue>, report::<RouteSocket>);
    let _ = (report::<NfLog>, report::<CtEvents>, report::<Audit>);
    let _: Option<(NfLogConfig, CtEventsConfig, AuditConfig)> = None;
    let _: Option<(&Pool, PoolBuf, SenderConfig, RxConfig, EventConfig, NfQueueConfig)> = None;
    let _: Option<(RingConfig, SetupFlag)> = None;
}
"#,
    );
    assert!(
        ok,
        "the capability surface does not compile for a user:\n{err}"
    );

    for module in ["sys", "ring", "buf"] {
        let (ok, err) = check_user_crate(
            &dir,
            &format!("raw_{module}_user"),
            &format!("use zcio::{module};\nfn main() {{}}\n"),
        );
        assert!(
            !ok,
            "`zcio::{module}` is public without the unstable-raw feature"
        );
        assert!(
            err.contains(&format!("module `{module}` is private")),
            "`use zcio::{module}` failed, but not because the module is private:\n{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The doc examples (every `///` and `//!` example, and the README's Rust snippets) built and
/// run as a user's crate sees zcio: a package outside the workspace whose library is zcio's
/// own `src/lib.rs`, with zcio's dependencies and only its public features (`tokio`), so
/// `unstable-raw` (which this crate's tests turn on) cannot make an example compile that a
/// user's would not. `no_run` examples are compiled, the others run.
#[test]
fn doc_examples_and_readme_snippets_build_as_users_see_them() {
    let zcio = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("zcio-user-doctests-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // zcio's manifest, with the workspace's versions written out and no dev-dependencies
    // but what the examples use.
    let manifest = format!(
        r#"[package]
name = "zcio"
version = "0.0.0"
edition = "2021"
publish = false

[lib]
path = {lib:?}

[dependencies]
io-uring = "0.7.16"
libc = "0.2.170"
linux-raw-sys = {{ version = "0.12.1", default-features = false, features = ["std", "general", "io_uring", "net", "netlink", "ptrace"] }}
thiserror = "2"
tracing = "0.1"
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"
tokio = {{ version = "1.54.1", default-features = false, features = ["net", "rt", "time"], optional = true }}
bytes = "1"

[dev-dependencies]
tokio = {{ version = "1.54.1", features = ["net", "rt", "macros", "io-util", "sync"] }}

[features]
tokio = ["dep:tokio"]
fault-injection = []
unstable-raw = []

[lints.rust]
unexpected_cfgs = {{ level = "allow", check-cfg = ['cfg(loom)'] }}

[workspace]
"#,
        lib = zcio.join("src/lib.rs").display().to_string()
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::copy(zcio.join("../../Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let target = zcio.join("../../target/public-surface");
    let out = Command::new(env!("CARGO"))
        .args([
            "test",
            "--doc",
            "--offline",
            "--features",
            "tokio",
            "--manifest-path",
        ])
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTDOCFLAGS")
        .output()
        .expect("run cargo test --doc");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "doc examples that do not build for a user:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ReadmeDoctests"),
        "the README's snippets were not among the doctests:\n{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

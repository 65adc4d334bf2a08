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
fn report<R: Report>(r: &R) -> (Path, Counters, Vec<Fallback>) {
    (r.path().into(), r.counters(), r.fallbacks().to_vec())
}
fn main() {
    let _ = (report::<Sender>, report::<Receiver>, report::<EventRing>);
    let _ = (report::<NfQueue>, report::<RouteSocket>);
    let _ = (report::<NfLog>, report::<CtEvents>);
    let _: Option<(NfLogConfig, CtEventsConfig)> = None;
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

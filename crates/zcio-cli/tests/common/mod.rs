//! Helpers shared by the CLI's test files.

/// Runs `zcio ARGS` (no namespace, no privilege: options are checked before anything is
/// bound) and checks it was refused as tcpdump refuses a bad option: exit status 1 and one
/// error line that names the option `opt`.
pub fn refused_with_one_line(args: &[&str], opt: &str) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_zcio"))
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
    assert!(
        err.starts_with("zcio: error: ") && err.contains(opt) && err.contains("invalid"),
        "{args:?}: {err}"
    );
}

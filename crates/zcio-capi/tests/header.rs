//! The committed `include/zcio.h` is what cbindgen generates from the sources
//! (`ZCIO_BLESS=1 cargo test -p zcio-capi --test header` rewrites it).

#[test]
fn header_is_current() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let cfg = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(cfg)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut out);
    let generated = String::from_utf8(out).expect("utf-8 header");
    let path = format!("{dir}/include/zcio.h");
    if std::env::var("ZCIO_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, &generated).expect("write header");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/zcio.h is out of date: run ZCIO_BLESS=1 cargo test -p zcio-capi --test header"
    );
    for f in [
        "zcio_event_ring_new",
        "zcio_event_ring_wait",
        "zcio_event_poster_post",
    ] {
        assert!(generated.contains(f), "{f} missing from the header");
    }
}

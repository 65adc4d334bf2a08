//! Link arguments for the cdylib cargo builds (`target/*/libzcio_capi.so`): soname and no
//! undefined symbols. Symbol versions (`zcio.map`) cannot be applied here: rustc passes its
//! own version script first and GNU ld honours only that one, so `scripts/install-capi` links
//! the installed `libzcio.so.0.1.0` from `libzcio_capi.a` with `zcio.map` (see
//! docs/design/capi-preload.md).

fn main() {
    println!("cargo:rerun-if-changed=zcio.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libzcio_capi.so");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,defs");
}

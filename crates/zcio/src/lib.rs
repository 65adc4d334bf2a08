//! zcio: zero-copy, low-syscall network I/O for Linux.
//!
//! Data and events move between the kernel and the application through shared memory and
//! pinned pages, with completion notifications instead of copies and syscalls:
//!
//! - `tx`: zero-copy send with completions (io_uring `SEND_ZC`, `MSG_ZEROCOPY`, copy);
//! - `rx`: zero-copy receive with a refill ring (zcrx, buffer rings, plain recv);
//! - `event`: readiness events harvested from a ring without syscalls;
//! - `netlink`: a netlink frame ring and an NFQUEUE consumer with batch verdicts;
//! - [`probe`]: what this host, NIC and socket can do, and why not;
//! - `tokio` (feature `tokio`): async adapters on the objects' readiness descriptors.
//!
//! Every object reports the path it took, its [`stats::Counters`] and the
//! [`stats::Fallback`]s it recorded.
//!
//! # The `unstable-raw` feature
//!
//! The kernel ABI (`sys`), the io_uring set-up (`ring`) and the memory areas handed to the
//! kernel (`buf`) are crate-private by default: a user of the capabilities never needs them,
//! and they change with every kernel feature the crate learns. The crates built on zcio's
//! internals (the C ABI `zcio-capi`, the `LD_PRELOAD` shim `zcio-preload`, the `zcio`
//! command's probe and bench, the examples) and this crate's own integration tests enable the
//! `unstable-raw` feature, which makes these three modules public. Nothing under them is
//! covered by semver.
#![deny(unsafe_code)]
#![deny(missing_docs)]
#![warn(unreachable_pub)]

#[cfg(feature = "unstable-raw")]
pub mod buf;
#[cfg(not(feature = "unstable-raw"))]
mod buf;
#[cfg(not(loom))]
pub mod event;
pub mod netlink;
pub mod probe;
pub mod proxy;
#[cfg(feature = "unstable-raw")]
pub mod ring;
#[cfg(not(feature = "unstable-raw"))]
mod ring;
pub mod rx;
pub mod stats;
#[cfg(feature = "unstable-raw")]
pub mod sys;
#[cfg(not(feature = "unstable-raw"))]
mod sys;
#[cfg(feature = "tokio")]
pub mod tokio;
pub mod tx;

// The capabilities and what it takes to build and read them (in the manner of mio's lib.rs);
// everything else stays in its module.
#[cfg(not(loom))]
pub use event::{EventConfig, EventRing};
pub use netlink::{
    Audit, AuditConfig, CtEvents, CtEventsConfig, NfLog, NfLogConfig, NfQueue, NfQueueConfig,
    RouteSocket,
};
pub use ring::{RingConfig, SetupFlag};
pub use rx::{Receiver, RxConfig};
pub use stats::{Counters, Fallback};
pub use tx::{Pool, PoolBuf};
pub use tx::{SendRing, SendRingConfig, Sender, SenderConfig};

#[cfg(feature = "unstable-raw")]
pub use ring::{Ring, RingError};

/// The README's Rust snippets, built as doctests (with the `tokio` feature, as a user builds
/// them: `tests/public_surface.rs` runs the doctests outside the workspace).
#[cfg(all(doctest, feature = "tokio"))]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// An error as an `io::Error` for `?`: the kind of the first `io::Error` in its source chain
/// (`Other` without one), the error itself inside.
pub(crate) fn to_io_error<E>(e: E) -> std::io::Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    let mut kind = std::io::ErrorKind::Other;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            kind = io.kind();
            break;
        }
        cur = c.source();
    }
    std::io::Error::new(kind, e)
}

/// `From<$t> for io::Error` by [`to_io_error`].
macro_rules! into_io_error {
    ($($t:ty),*) => {$(
        /// For `?` in functions returning `io::Result`: the kind of the kernel error inside
        /// (`Other` without one), the error itself inside (`get_ref`, `source`).
        impl From<$t> for std::io::Error {
            fn from(e: $t) -> Self {
                crate::to_io_error(e)
            }
        }
    )*};
}
into_io_error!(netlink::NfqError, netlink::NfLogError, netlink::CtError);

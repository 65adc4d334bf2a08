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
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod buf;
#[cfg(not(loom))]
pub mod event;
pub mod netlink;
pub mod probe;
pub mod ring;
pub mod rx;
pub mod stats;
pub mod sys;
#[cfg(feature = "tokio")]
pub mod tokio;
pub mod tx;

pub use ring::{Ring, RingConfig, RingError};
pub use stats::{Counters, Fallback};

//! `zcio._native`: the Rust half of the `zcio` Python package (see `python/zcio`).
//!
//! NFQUEUE through zcio's frame ring with batch verdicts, exposed as `NfQueue` (batches of
//! held packets with zero-copy payload views), `Packet` (netfilterqueue's packet API) and
//! `Batch`. The netfilterqueue-compatible `NetfilterQueue` and the asyncio and thread helpers
//! are Python, in `python/zcio`.
#![deny(unsafe_code)]

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

mod audit;
mod errors;
mod logs;
mod queue;
mod view;

/// `fix_checksums(packet) -> bytes`: the packet with its IP length fields and its IPv4
/// header, TCP, UDP, UDP-Lite, ICMP or ICMPv6 checksums recomputed for its bytes (ValueError
/// for fragments, ESP, cut packets and other packets whose sums cannot be known here).
#[pyfunction]
fn fix_checksums<'py>(py: Python<'py>, packet: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    let mut v = packet.to_vec();
    zcio::netlink::packet::fix_checksums(&mut v)
        .map_err(|e| PyValueError::new_err(format!("cannot fix checksums: {e}")))?;
    Ok(PyBytes::new(py, &v))
}

/// `checksums_ok(packet) -> bool | None`: whether the IPv4 header and transport checksums are
/// right (None when they cannot be checked here).
#[pyfunction]
fn checksums_ok(packet: &[u8]) -> Option<bool> {
    zcio::netlink::packet::checksums_ok(packet)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<queue::NfQueue>()?;
    m.add_class::<queue::Packet>()?;
    m.add_class::<queue::Batch>()?;
    m.add_class::<logs::NfLog>()?;
    m.add_class::<logs::LogEntry>()?;
    m.add_class::<logs::CtEvents>()?;
    m.add_class::<logs::CtEvent>()?;
    m.add_class::<audit::Audit>()?;
    m.add("DROP", 0u32)?;
    m.add("ACCEPT", 1u32)?;
    m.add("REPEAT", 4u32)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    m.add_function(wrap_pyfunction!(fix_checksums, m)?)?;
    m.add_function(wrap_pyfunction!(checksums_ok, m)?)?;
    Ok(())
}

//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod streams;

#[allow(unused_imports)] // not every test file skips by hand
pub use zcio_testnet::{can_make_hosts, skip};

/// A deterministic byte pattern: byte `i` of a stream is `pattern_byte(i)`.
pub fn pattern_byte(i: u64) -> u8 {
    (i.wrapping_mul(2654435761) >> 13) as u8
}

/// Fills `buf` with the stream pattern starting at stream offset `off`.
pub fn fill_pattern(buf: &mut [u8], off: u64) {
    for (k, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(off + k as u64);
    }
}

/// Checks `buf` against the stream pattern at `off`; returns the first bad offset.
pub fn check_pattern(buf: &[u8], off: u64) -> Result<(), u64> {
    for (k, &b) in buf.iter().enumerate() {
        if b != pattern_byte(off + k as u64) {
            return Err(off + k as u64);
        }
    }
    Ok(())
}

/// A time limit scaled by `ZCIO_TIME_SCALE` (set by `scripts/vmtest` in its software-emulated
/// guests, where everything runs many times slower); unscaled when unset.
pub fn scaled(d: std::time::Duration) -> std::time::Duration {
    let k = std::env::var("ZCIO_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1);
    d * k
}

/// Sends `buf` on `tx`, waiting for room while the sender refuses it for backpressure (the
/// refusal hands the buffer back; nothing waits inside `send`).
pub fn send(tx: &mut zcio::tx::Sender, mut buf: zcio::tx::PoolBuf) -> zcio::tx::Ticket {
    loop {
        match tx.send(buf) {
            Ok(t) => return t,
            Err(r) => {
                assert!(r.reason.is_backpressure(), "send refused: {r}");
                buf = r.buf;
                tx.wait(std::time::Duration::from_millis(100))
                    .expect("waiting for room");
            }
        }
    }
}

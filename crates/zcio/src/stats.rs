//! Counters every zcio object keeps, and recorded fallbacks.

use serde::Serialize;

/// A path not taken, and why. Every fallback zcio takes is recorded as one of these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fallback {
    /// The path that was wanted (e.g. `uring-zc`).
    pub from: String,
    /// The path taken instead (e.g. `msg-zc`).
    pub to: String,
    /// Why, in words a user can act on.
    pub reason: String,
}

impl Fallback {
    /// Records a fallback and logs it once at `info` level.
    pub fn new(from: impl Into<String>, to: impl Into<String>, reason: impl Into<String>) -> Self {
        let f = Self {
            from: from.into(),
            to: to.into(),
            reason: reason.into(),
        };
        tracing::info!(from = %f.from, to = %f.to, reason = %f.reason, "zcio fallback");
        f
    }
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} -> {}: {}", self.from, self.to, self.reason)
    }
}

/// I/O counters. Plain integers: each object is owned by one thread.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Payload bytes moved.
    pub bytes: u64,
    /// Operations the caller asked for (sends, receives, harvested events).
    pub ops: u64,
    /// System calls zcio made on the caller's behalf (including `io_uring_enter`).
    pub syscalls: u64,
    /// Completion notifications processed.
    pub notifications: u64,
    /// Bytes the kernel sent or received without copying.
    pub zerocopy_bytes: u64,
    /// Bytes a zero-copy path reported as copied after all (`COPIED`).
    pub copied_bytes: u64,
}

impl Counters {
    /// Fraction of zero-copy-attempted bytes the kernel copied; `None` when nothing was
    /// attempted zero-copy.
    pub fn copied_fraction(&self) -> Option<f64> {
        let total = self.zerocopy_bytes + self.copied_bytes;
        (total > 0).then(|| self.copied_bytes as f64 / total as f64)
    }

    /// Syscalls per operation.
    pub fn syscalls_per_op(&self) -> f64 {
        if self.ops == 0 {
            0.0
        } else {
            self.syscalls as f64 / self.ops as f64
        }
    }
}

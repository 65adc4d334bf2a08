//! The one shape every capability reports itself in: the [`Report`] trait (its path as a typed
//! enum, its [`Counters`], the [`Fallback`]s it recorded), and those types.

use serde::{Serialize, Serializer};
use std::borrow::Cow;

/// What every capability ([`Sender`](crate::tx::Sender), [`Receiver`](crate::rx::Receiver),
/// `EventRing`, [`NfQueue`](crate::netlink::NfQueue),
/// [`RouteSocket`](crate::netlink::RouteSocket)) reports about itself. `zcio probe`, the
/// bench's `results.json` and the C ABI read this one shape.
pub trait Report {
    /// The capability's own path enum (e.g. [`tx::Path`](crate::tx::Path)).
    type Path: Copy + Into<Path> + std::fmt::Display;
    /// The path in use now (chosen once at construction; a sender's `Auto` mode may move
    /// between its zero-copy path and copy, recording each move in [`Report::fallbacks`]).
    fn path(&self) -> Self::Path;
    /// The common counters.
    fn counters(&self) -> Counters;
    /// Every fallback taken, with its reason, in order.
    fn fallbacks(&self) -> &[Fallback];
    /// One line for people: the path and each fallback's `from -> to` (the reasons are in
    /// [`Report::fallbacks`]). Capabilities with more to say (`Sender`, `SendRing`,
    /// `Receiver`) have their own `describe` too.
    fn describe(&self) -> String {
        let mut s = format!("path {}", self.path());
        for f in self.fallbacks() {
            s.push_str(&format!("; {} -> {}", f.from, f.to));
        }
        s
    }
    /// The three together, ready to serialize (`{"path", "counters", "fallbacks"}`).
    fn summary(&self) -> Summary {
        Summary {
            path: self.path().into(),
            counters: self.counters(),
            fallbacks: self.fallbacks().to_vec(),
        }
    }
}

/// A [`Report`] taken at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The path (serialized as its name).
    pub path: Path,
    /// The common counters.
    pub counters: Counters,
    /// The fallbacks recorded.
    pub fallbacks: Vec<Fallback>,
}

/// `path: uring-copy; 1048576 bytes in 16 ops, 3 syscalls, 16 notifications, zero-copy 0 B,
/// copied 0 B` and one line per fallback (`  fallback: from -> to: reason`).
impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.counters;
        write!(
            f,
            "path: {}; {} bytes in {} ops, {} syscalls, {} notifications, zero-copy {} B, \
             copied {} B",
            self.path,
            c.bytes,
            c.ops,
            c.syscalls,
            c.notifications,
            c.zerocopy_bytes,
            c.copied_bytes
        )?;
        if let Some(x) = c.copied_fraction() {
            write!(f, " (COPIED {x:.2})")?;
        }
        for fb in &self.fallbacks {
            write!(f, "\n  fallback: {fb}")?;
        }
        Ok(())
    }
}

/// A path of any capability, or a setting: what a [`Fallback`] goes from and to. Displayed
/// (and serialized) as the path's short name, e.g. `uring-zc`, `bufring`, `epoll`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Path {
    /// A send path.
    Tx(crate::tx::Path),
    /// A send mode that was asked for (e.g. `auto`, or `uring-zc` before its ring existed).
    TxMode(crate::tx::TxMode),
    /// A receive path.
    Rx(crate::rx::RxPath),
    /// An event backend.
    #[cfg(not(loom))]
    Event(crate::event::EventPath),
    /// A netlink receive path (NFQUEUE, rtnetlink dumps).
    Netlink(crate::netlink::NetlinkPath),
    /// A setting rather than a path: a socket option (`SO_RCVBUFFORCE`), an offload
    /// (`udp-gso`), an io_uring set-up flag (`ring with DEFER_TASKRUN`).
    Setting(Cow<'static, str>),
}

impl Path {
    /// A setting (see [`Path::Setting`]).
    pub fn setting(name: impl Into<Cow<'static, str>>) -> Self {
        Path::Setting(name.into())
    }
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Tx(p) => p.fmt(f),
            Path::TxMode(m) => m.fmt(f),
            Path::Rx(p) => f.write_str(p.name()),
            #[cfg(not(loom))]
            Path::Event(p) => p.fmt(f),
            Path::Netlink(p) => p.fmt(f),
            Path::Setting(s) => f.write_str(s),
        }
    }
}

impl Serialize for Path {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl From<crate::tx::Path> for Path {
    fn from(p: crate::tx::Path) -> Self {
        Path::Tx(p)
    }
}

impl From<crate::tx::TxMode> for Path {
    fn from(m: crate::tx::TxMode) -> Self {
        Path::TxMode(m)
    }
}

impl From<crate::rx::RxPath> for Path {
    fn from(p: crate::rx::RxPath) -> Self {
        Path::Rx(p)
    }
}

#[cfg(not(loom))]
impl From<crate::event::EventPath> for Path {
    fn from(p: crate::event::EventPath) -> Self {
        Path::Event(p)
    }
}

impl From<crate::netlink::NetlinkPath> for Path {
    fn from(p: crate::netlink::NetlinkPath) -> Self {
        Path::Netlink(p)
    }
}

/// A path not taken, and why. Every fallback zcio takes is recorded as one of these, where the
/// choice is made. `from` and `to` serialize as their names (strings), as before they were typed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fallback {
    /// The path (or setting) that was wanted (e.g. `uring-zc`).
    pub from: Path,
    /// The path (or setting) taken instead (e.g. `msg-zc`).
    pub to: Path,
    /// Why, in words a user can act on.
    pub reason: String,
}

impl Fallback {
    /// Records a fallback and logs it once at `info` level.
    pub fn new(from: impl Into<Path>, to: impl Into<Path>, reason: impl Into<String>) -> Self {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_fallbacks_serialize_and_display_as_path_names() {
        let f = Fallback::new(
            crate::rx::RxPath::ZcrxNodev,
            crate::rx::RxPath::BufRing,
            "needs Linux 7.1",
        );
        assert_eq!(f.from, Path::Rx(crate::rx::RxPath::ZcrxNodev));
        assert_eq!(f.to_string(), "zcrx-nodev -> bufring: needs Linux 7.1");
        assert_eq!(
            serde_json::to_value(&f).unwrap(),
            serde_json::json!({"from": "zcrx-nodev", "to": "bufring", "reason": "needs Linux 7.1"})
        );
        let f = Fallback::new(
            crate::tx::TxMode::Auto,
            Path::setting("SO_RCVBUFFORCE"),
            "r",
        );
        assert_eq!(f.to_string(), "auto -> SO_RCVBUFFORCE: r");
        #[cfg(not(loom))]
        assert_eq!(
            Path::from(crate::event::EventPath::UringEpollWait).to_string(),
            "io_uring_epoll_wait"
        );
        assert_eq!(
            Path::from(crate::netlink::NetlinkPath::FrameRingUring).to_string(),
            "frame-ring+io_uring"
        );
        assert_eq!(
            Path::from(crate::tx::Path::UringZcFixed).to_string(),
            "uring-zc-fixed"
        );
    }
}

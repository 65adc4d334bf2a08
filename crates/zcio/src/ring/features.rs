//! What the running kernel's io_uring accepts, probed once per process.
//!
//! Opcode presence (`IORING_REGISTER_PROBE`) does not say which flags an opcode takes: Linux
//! 6.0 and 6.1 know `SEND_ZC` but reject `IORING_SEND_ZC_REPORT_USAGE` (6.2) with `EINVAL`,
//! for every request. So each feature zcio uses beyond Linux 6.1 is checked the way the kernel
//! would be asked for it — a feature bit from `io_uring_setup`, an opcode from the probe, a
//! real request, a real registration, or `IORING_REGISTER_QUERY` — and recorded with how it
//! was checked and, when missing, why. Code that builds requests asks [`Features::get`]
//! rather than assuming.

use super::recv::RecvRing;
use super::zcrx::ZcrxBind;
use super::{Ring, RingConfig, RingError, SetupFlag};
use crate::sys::{self, IORING_CQE_F_MORE, IORING_SEND_ZC_REPORT_USAGE};
use io_uring::{cqueue, opcode, types};
use std::sync::{Arc, OnceLock};

/// One feature: whether this kernel accepts it, how that was found out, and why not.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Feature {
    /// Kernel name of the feature (flag, opcode or feature bit).
    pub name: &'static str,
    /// The Linux version that introduced it.
    pub since: &'static str,
    /// The kernel accepts it.
    pub supported: bool,
    /// How it was checked (`feature bit`, `opcode probe`, `request`, `registration`, `query`).
    pub checked_by: &'static str,
    /// Why it is missing (or could not be checked).
    pub reason: Option<String>,
}

/// Everything zcio checked about this kernel's io_uring; see the module docs.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Features {
    /// A ring could be set up at all (`None`), or why not.
    pub unavailable: Option<String>,
    /// Set-up flags of a default ring (and CQE32).
    pub setup_flags: Vec<SetupFlag>,
    /// The individual features, in the order of [`Features::NAMES`].
    pub list: Vec<Feature>,
}

static CACHE: OnceLock<Arc<Features>> = OnceLock::new();

impl Features {
    /// `IORING_OP_SEND_ZC` (6.0).
    pub const SEND_ZC: &'static str = "IORING_OP_SEND_ZC";
    /// `IORING_SEND_ZC_REPORT_USAGE` (6.2): notifications say whether the kernel copied.
    pub const SEND_ZC_REPORT_USAGE: &'static str = "IORING_SEND_ZC_REPORT_USAGE";
    /// `IORING_OP_SENDMSG_ZC` with `IORING_RECVSEND_FIXED_BUF` (6.15): zero-copy sendmsg
    /// (destinations, control messages, iovecs) from registered buffers.
    pub const SENDMSG_ZC_FIXED_BUF: &'static str = "IORING_OP_SENDMSG_ZC+IORING_RECVSEND_FIXED_BUF";
    /// `IORING_SEND_VECTORIZED` (6.17): `SEND_ZC` of an iovec array.
    pub const SEND_VECTORIZED: &'static str = "IORING_SEND_VECTORIZED";
    /// `IORING_SEND_VECTORIZED` with `IORING_RECVSEND_FIXED_BUF`: an iovec array in a
    /// registered buffer (refused by 6.18 with `EINVAL` when the request is prepared).
    pub const SEND_VECTORIZED_FIXED_BUF: &'static str =
        "IORING_SEND_VECTORIZED+IORING_RECVSEND_FIXED_BUF";
    /// `IORING_FEAT_RECVSEND_BUNDLE` (6.10): receive bundles.
    pub const RECV_BUNDLE: &'static str = "IORING_FEAT_RECVSEND_BUNDLE";
    /// `IORING_FEAT_MIN_TIMEOUT` (6.12): batched waits with `min_wait_usec`.
    pub const MIN_WAIT: &'static str = "IORING_FEAT_MIN_TIMEOUT";
    /// `IOU_PBUF_RING_INC` (6.12): incrementally consumed provided buffers.
    pub const PBUF_RING_INC: &'static str = "IOU_PBUF_RING_INC";
    /// `IORING_OP_RECV_ZC` (6.15).
    pub const RECV_ZC: &'static str = "IORING_OP_RECV_ZC";
    /// `IORING_OP_EPOLL_WAIT` (6.15).
    pub const EPOLL_WAIT: &'static str = "IORING_OP_EPOLL_WAIT";
    /// `ZCRX_REG_NODEV` (7.1): device-less zcrx.
    pub const ZCRX_NODEV: &'static str = "ZCRX_REG_NODEV";
    /// `IORING_REGISTER_ZCRX_CTRL` with `ZCRX_CTRL_FLUSH_RQ` (6.19).
    pub const ZCRX_FLUSH_RQ: &'static str = "ZCRX_CTRL_FLUSH_RQ";

    /// The features checked, in order.
    pub const NAMES: [&'static str; 12] = [
        Self::SEND_ZC,
        Self::SEND_ZC_REPORT_USAGE,
        Self::SENDMSG_ZC_FIXED_BUF,
        Self::SEND_VECTORIZED,
        Self::SEND_VECTORIZED_FIXED_BUF,
        Self::RECV_BUNDLE,
        Self::MIN_WAIT,
        Self::PBUF_RING_INC,
        Self::RECV_ZC,
        Self::EPOLL_WAIT,
        Self::ZCRX_NODEV,
        Self::ZCRX_FLUSH_RQ,
    ];

    /// The features of this kernel, probed on first use and kept for the process. A probe
    /// that found no io_uring (a seccomp filter on this thread, a sysctl) is not kept: the
    /// next call probes again.
    pub fn get() -> Arc<Features> {
        if let Some(f) = CACHE.get() {
            return Arc::clone(f);
        }
        let f = Arc::new(Self::probe());
        if f.unavailable.is_some() {
            return f;
        }
        Arc::clone(CACHE.get_or_init(|| f))
    }

    /// Whether `name` (one of [`Features::NAMES`]) is supported.
    pub fn has(&self, name: &str) -> bool {
        self.feature(name).is_some_and(|f| f.supported)
    }

    /// The record of `name`.
    pub fn feature(&self, name: &str) -> Option<&Feature> {
        self.list.iter().find(|f| f.name == name)
    }

    /// Why `name` is not supported (`None` when it is).
    pub fn why_not(&self, name: &str) -> Option<String> {
        match self.feature(name) {
            Some(f) if f.supported => None,
            Some(f) => Some(f.reason.clone().unwrap_or_else(|| "not supported".into())),
            None => Some(format!("{name} was not probed")),
        }
    }

    /// Probes every feature now (no cache).
    pub fn probe() -> Features {
        let mut ring: Ring = match Ring::new(&RingConfig::default()) {
            Ok(r) => r,
            Err(e) => {
                let why = match &e {
                    RingError::Unavailable { reason, .. } => reason.clone(),
                    other => other.to_string(),
                };
                let list = Self::NAMES
                    .iter()
                    .map(|&n| Feature {
                        name: n,
                        since: since(n),
                        supported: false,
                        checked_by: "ring set-up",
                        reason: Some(format!("no io_uring: {why}")),
                    })
                    .collect();
                return Features {
                    unavailable: Some(why),
                    setup_flags: Vec::new(),
                    list,
                };
            }
        };
        let mut setup_flags: Vec<SetupFlag> = ring
            .setup_flags()
            .iter()
            .filter(|f| f.requested)
            .cloned()
            .collect();
        let cqe32 = Ring::<cqueue::Entry32>::new(&RingConfig {
            entries: 8,
            ..RingConfig::default()
        });
        setup_flags.push(SetupFlag {
            name: "CQE32",
            requested: true,
            granted: cqe32.is_ok(),
            reason: cqe32.err().map(|e| format!("{e} (CQE32 needs Linux 5.19)")),
        });
        let params = ring.raw().params();
        let (bundle, min_wait) = (
            params.is_feature_recvsend_bundle(),
            params.is_feature_min_timeout(),
        );
        let probe = ring.probe_opcodes().ok();
        let op = |code: u8| probe.as_ref().map(|p| p.is_supported(code));
        let mut list = Vec::new();
        let opcode_feature = |name: &'static str, code: u8| {
            let (supported, reason) = match op(code) {
                Some(true) => (true, None),
                Some(false) => (
                    false,
                    Some(format!("kernel lacks {name} (needs Linux {})", since(name))),
                ),
                None => (false, Some("IORING_REGISTER_PROBE failed".to_string())),
            };
            Feature {
                name,
                since: since(name),
                supported,
                checked_by: "opcode probe",
                reason,
            }
        };
        let send_zc = opcode_feature(Self::SEND_ZC, opcode::SendZc::CODE);
        let report = if send_zc.supported {
            send_zc_report_usage(&mut ring)
        } else {
            Feature {
                name: Self::SEND_ZC_REPORT_USAGE,
                since: since(Self::SEND_ZC_REPORT_USAGE),
                supported: false,
                checked_by: "opcode probe",
                reason: Some("no IORING_OP_SEND_ZC".into()),
            }
        };
        let (msg_fixed, vectorized, vec_fixed) = if send_zc.supported {
            (
                flag_probe(&mut ring, Self::SENDMSG_ZC_FIXED_BUF, Probe::MsgZcFixed),
                flag_probe(&mut ring, Self::SEND_VECTORIZED, Probe::Vectorized),
                flag_probe(
                    &mut ring,
                    Self::SEND_VECTORIZED_FIXED_BUF,
                    Probe::VectorizedFixed,
                ),
            )
        } else {
            let no = |name| Feature {
                name,
                since: since(name),
                supported: false,
                checked_by: "opcode probe",
                reason: Some("no IORING_OP_SEND_ZC".into()),
            };
            (
                no(Self::SENDMSG_ZC_FIXED_BUF),
                no(Self::SEND_VECTORIZED),
                no(Self::SEND_VECTORIZED_FIXED_BUF),
            )
        };
        list.push(send_zc);
        list.push(report);
        list.push(msg_fixed);
        list.push(vectorized);
        list.push(vec_fixed);
        list.push(bit(Self::RECV_BUNDLE, bundle));
        list.push(bit(Self::MIN_WAIT, min_wait));
        list.push(pbuf_ring_inc());
        let recv_zc = opcode_feature(Self::RECV_ZC, opcode::RecvZc::CODE);
        let have_recv_zc = recv_zc.supported;
        list.push(recv_zc);
        list.push(opcode_feature(Self::EPOLL_WAIT, 59));
        let (nodev, flush) = zcrx_nodev(have_recv_zc);
        list.push(nodev);
        list.push(flush);
        Features {
            unavailable: None,
            setup_flags,
            list,
        }
    }

    /// The flag bits for an `IORING_OP_SEND_ZC` request's `ioprio` field (`zc_flags`), from
    /// what this kernel accepts: `IORING_SEND_ZC_REPORT_USAGE` only where it is known.
    pub fn send_zc_flags(&self) -> u16 {
        if self.has(Self::SEND_ZC_REPORT_USAGE) {
            IORING_SEND_ZC_REPORT_USAGE
        } else {
            0
        }
    }
}

/// Whether the kernel knows `IORING_OP_RECV_ZC` (zcrx, 6.15), from the opcode probe of a
/// throw-away ring, once per process. Kept apart from [`Features::get`] so that explaining a
/// registration error never re-enters the feature probe. `None` when the probe ring could
/// not be made (out of memory for now, or held back by [`super::pace`]); that is not kept:
/// the next call probes again.
pub(crate) fn kernel_has_recv_zc() -> Option<bool> {
    static HAS: OnceLock<bool> = OnceLock::new();
    if let Some(&has) = HAS.get() {
        return Some(has);
    }
    let Ok(ring) = Ring::<cqueue::Entry>::new(&RingConfig {
        entries: 4,
        ..RingConfig::default()
    }) else {
        return None;
    };
    let probe = ring.probe_opcodes().ok()?;
    Some(*HAS.get_or_init(|| probe.is_supported(opcode::RecvZc::CODE)))
}

fn since(name: &str) -> &'static str {
    match name {
        Features::SEND_ZC => "6.0",
        Features::SEND_ZC_REPORT_USAGE => "6.2",
        Features::SENDMSG_ZC_FIXED_BUF => "6.15",
        Features::SEND_VECTORIZED => "6.17",
        Features::SEND_VECTORIZED_FIXED_BUF => "> 6.18",
        Features::RECV_BUNDLE => "6.10",
        Features::MIN_WAIT | Features::PBUF_RING_INC => "6.12",
        Features::RECV_ZC | Features::EPOLL_WAIT => "6.15",
        Features::ZCRX_FLUSH_RQ => "6.19",
        Features::ZCRX_NODEV => "7.1",
        _ => "?",
    }
}

fn bit(name: &'static str, set: bool) -> Feature {
    Feature {
        name,
        since: since(name),
        supported: set,
        checked_by: "feature bit",
        reason: (!set).then(|| format!("kernel lacks {name} (needs Linux {})", since(name))),
    }
}

/// One `SEND_ZC` of a byte with `IORING_SEND_ZC_REPORT_USAGE` on a unix socket pair. The
/// kernel checks the flags when it prepares the request (`EINVAL` for an unknown flag), and
/// only then finds that the socket does not do zero-copy (`EOPNOTSUPP`); a control request
/// without the flag tells an `EINVAL` for the flag from an `EINVAL` for anything else.
fn send_zc_report_usage(ring: &mut Ring) -> Feature {
    let name = Features::SEND_ZC_REPORT_USAGE;
    let mut f = Feature {
        name,
        since: since(name),
        supported: false,
        checked_by: "request",
        reason: None,
    };
    let with = match attempt_send_zc(ring, IORING_SEND_ZC_REPORT_USAGE) {
        Ok(res) => res,
        Err(e) => {
            f.reason = Some(format!("could not check: {e}"));
            return f;
        }
    };
    if with != -libc::EINVAL {
        f.supported = true;
        return f;
    }
    let without = attempt_send_zc(ring, 0).unwrap_or(-libc::EINVAL);
    f.reason = Some(if without == -libc::EINVAL {
        "SEND_ZC is refused with EINVAL even without the flag; zero-copy send unusable".into()
    } else {
        format!(
            "kernel rejects SEND_ZC with IORING_SEND_ZC_REPORT_USAGE (EINVAL; needs Linux {}): \
             notifications cannot say whether the kernel copied",
            since(name)
        )
    });
    f
}

/// A request form checked by [`flag_probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// `SENDMSG_ZC` with `IORING_RECVSEND_FIXED_BUF` (buffer index 0).
    MsgZcFixed,
    /// `SEND_ZC` with `IORING_SEND_VECTORIZED` (one iovec).
    Vectorized,
    /// The same from registered buffer 0.
    VectorizedFixed,
}

/// Checks a request form on a unix socket pair, like [`send_zc_report_usage`]: a kernel that
/// does not know the flag refuses it when preparing the request (`EINVAL`); one that knows it
/// prepares it and only then finds that a unix socket does no zero-copy (`EOPNOTSUPP`), before
/// it would look the (unregistered) buffer up.
fn flag_probe(ring: &mut Ring, name: &'static str, form: Probe) -> Feature {
    let mut f = Feature {
        name,
        since: since(name),
        supported: false,
        checked_by: "request",
        reason: None,
    };
    match attempt_form(ring, form) {
        // Prepared, then refused by the unix socket at issue: the kernel knows the form.
        Ok(res) if res == -libc::EOPNOTSUPP || res >= 0 => f.supported = true,
        Ok(res) if res == -libc::EINVAL => {
            f.reason = Some(format!(
                "kernel rejects {name} (EINVAL; needs Linux {})",
                since(name)
            ))
        }
        Ok(res) => {
            f.reason = Some(format!(
                "could not check: the probe request failed with {}",
                std::io::Error::from_raw_os_error(-res)
            ))
        }
        Err(e) => f.reason = Some(format!("could not check: {e}")),
    }
    f
}

/// One probe request of `form` on a fresh unix socket pair. The fixed-buffer forms name a
/// buffer registered for the probe (a kernel that knows the flag but finds no registered
/// buffer answers `EFAULT` before it would refuse the form: Linux 6.1 checks the buffer index
/// of `SENDMSG_ZC` first, then refuses `IORING_RECVSEND_FIXED_BUF` for it with `EINVAL`).
fn attempt_form(ring: &mut Ring, form: Probe) -> std::io::Result<i32> {
    use std::os::fd::AsRawFd;
    let fixed = matches!(form, Probe::MsgZcFixed | Probe::VectorizedFixed);
    // The bytes sent: inside the registered buffer for the fixed forms.
    let mut page = vec![0x5au8; 4096].into_boxed_slice();
    let data: *const u8 = if fixed {
        page.as_mut_ptr()
    } else {
        PROBE_BYTE.as_ptr()
    };
    if fixed {
        let reg = libc::iovec {
            iov_base: page.as_mut_ptr().cast(),
            iov_len: page.len(),
        };
        // SAFETY: `page` is a live heap allocation of that length; it outlives the
        // registration (unregistered below, or leaked with the request when it did not
        // complete).
        unsafe { ring.raw().submitter().register_buffers(&[reg]) }?;
    }
    let res = (|| {
        let (a, _b) = sys::socketpair(libc::AF_UNIX, libc::SOCK_STREAM)?;
        let mut msg = Box::new(sys::msg::MsgHdr::new(
            &sys::msg::MsgOpts {
                dest: None,
                segment: None,
                tos: None,
            },
            false,
        )?);
        let hdr = msg.point(&[(data, 1)])?;
        let iov = Box::new([libc::iovec {
            iov_base: data as *mut libc::c_void,
            iov_len: 1,
        }]);
        let sqe = match form {
            Probe::MsgZcFixed => opcode::SendMsgZc::new(types::Fd(a.as_raw_fd()), hdr)
                .buf_index(Some(0))
                .build(),
            Probe::Vectorized | Probe::VectorizedFixed => opcode::SendZc::new(
                types::Fd(a.as_raw_fd()),
                iov.as_ptr().cast(),
                iov.len() as u32,
            )
            .zc_flags(sys::IORING_SEND_VECTORIZED)
            .buf_index(fixed.then_some(0))
            .build(),
        }
        .user_data(0x5a5b);
        // SAFETY: the request reads one byte (PROBE_BYTE, a static, or `page`) through `msg`
        // or `iov`, boxed and kept until every completion of the request is in, or leaked
        // (with `a`) when they did not come, so the kernel never reads freed memory or a
        // reused descriptor.
        unsafe { ring.push(&sqe) }?;
        let res = wait_probe(ring);
        if res.is_err() {
            std::mem::forget(msg);
            std::mem::forget(iov);
            std::mem::forget(a);
        }
        res
    })();
    if fixed {
        if res.is_ok() {
            let _ = ring.raw().submitter().unregister_buffers();
        } else {
            // A request may still hold the registered page: never free it.
            std::mem::forget(page);
        }
    }
    res
}

/// Waits for the probe request's result and, if announced, its notification.
fn wait_probe(ring: &mut Ring) -> std::io::Result<i32> {
    let mut res = None;
    let mut notif_due = false;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while (res.is_none() || notif_due) && std::time::Instant::now() < deadline {
        ring.submit_and_wait(1, Some(std::time::Duration::from_millis(100)))?;
        ring.harvest(|c| {
            if c.flags() & sys::IORING_CQE_F_NOTIF != 0 {
                notif_due = false;
            } else {
                res = Some(c.result());
                notif_due = c.flags() & IORING_CQE_F_MORE != 0;
            }
        })?;
    }
    res.ok_or_else(|| std::io::Error::other("no completion for the probe request within 2 s"))
}

static PROBE_BYTE: [u8; 1] = [0x5a];

/// Sends one byte with `SEND_ZC` and `zc_flags` on a fresh unix socket pair; returns the
/// result CQE's `res`, after waiting for the notification that `F_MORE` announces.
fn attempt_send_zc(ring: &mut Ring, zc_flags: u16) -> std::io::Result<i32> {
    let (a, _b) = sys::socketpair(libc::AF_UNIX, libc::SOCK_STREAM)?;
    use std::os::fd::AsRawFd;
    let sqe = opcode::SendZc::new(
        types::Fd(a.as_raw_fd()),
        PROBE_BYTE.as_ptr(),
        PROBE_BYTE.len() as u32,
    )
    .zc_flags(zc_flags)
    .build()
    .user_data(0x5a5a);
    // SAFETY: the request reads PROBE_BYTE, a static, and names `a`, which stays open until
    // every completion of the request (result, and the notification if announced) is in.
    unsafe { ring.push(&sqe) }?;
    wait_probe(ring)
}

/// Registers a one-buffer incremental ring and removes it again.
fn pbuf_ring_inc() -> Feature {
    use crate::buf::bufring::{BufRingConfig, IOU_PBUF_RING_INC};
    let name = Features::PBUF_RING_INC;
    let _ = IOU_PBUF_RING_INC;
    let mut f = Feature {
        name,
        since: since(name),
        supported: false,
        checked_by: "registration",
        reason: None,
    };
    let mut rr = match RecvRing::<cqueue::Entry>::new(&RingConfig {
        entries: 8,
        ..RingConfig::default()
    }) {
        Ok(r) => r,
        Err(e) => {
            f.reason = Some(format!("could not check: {e}"));
            return f;
        }
    };
    let cfg = BufRingConfig {
        bgid: 0,
        entries: 2,
        buf_size: 4096,
        incremental: true,
        huge_pages: false,
        hot: 0,
    };
    match rr.register_bufs(&cfg) {
        Ok(_) => f.supported = true,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            f.reason = Some(format!(
                "IOU_PBUF_RING_INC refused with EINVAL (needs Linux {})",
                since(name)
            ))
        }
        Err(e) => f.reason = Some(format!("could not check: {e}")),
    }
    f
}

/// Device-less zcrx: asked of `IORING_REGISTER_QUERY` where the kernel has the zcrx query
/// (6.19), otherwise by a real registration (64 KiB area, released at once; needs
/// CAP_NET_ADMIN).
fn zcrx_nodev(have_recv_zc: bool) -> (Feature, Feature) {
    let mut nodev = Feature {
        name: Features::ZCRX_NODEV,
        since: since(Features::ZCRX_NODEV),
        supported: false,
        checked_by: "query",
        reason: None,
    };
    let mut flush = Feature {
        name: Features::ZCRX_FLUSH_RQ,
        since: since(Features::ZCRX_FLUSH_RQ),
        supported: false,
        checked_by: "query",
        reason: None,
    };
    if !have_recv_zc {
        let why = "kernel lacks IORING_OP_RECV_ZC (zcrx needs Linux 6.15)".to_string();
        nodev.checked_by = "opcode probe";
        flush.checked_by = "opcode probe";
        nodev.reason = Some(why.clone());
        flush.reason = Some(why);
        return (nodev, flush);
    }
    let query = crate::sys::zcrx::query_zcrx();
    match &query {
        Ok(q) => {
            flush.supported = q.nr_ctrl_opcodes > crate::sys::zcrx::ZCRX_CTRL_FLUSH_RQ;
            if !flush.supported {
                flush.reason = Some("the zcrx query lists no control operations".into());
            }
        }
        Err(e) => {
            flush.reason = Some(format!(
                "no zcrx query (IORING_REGISTER_QUERY: {e}); IORING_REGISTER_ZCRX_CTRL needs \
                 Linux {}",
                since(Features::ZCRX_FLUSH_RQ)
            ));
        }
    }
    if let Ok(q) = &query {
        nodev.supported = q.register_flags & u64::from(crate::sys::zcrx::ZCRX_REG_NODEV) != 0;
        if !nodev.supported {
            nodev.reason = Some(format!(
                "the kernel's zcrx query lists register flags {:#x} without ZCRX_REG_NODEV \
                 (device-less zcrx needs Linux 7.1+)",
                q.register_flags
            ));
        }
        return (nodev, flush);
    }
    nodev.checked_by = "registration";
    match attempt_nodev() {
        Ok(()) => {
            nodev.supported = true;
        }
        Err(e) => nodev.reason = Some(e),
    }
    (nodev, flush)
}

/// A real device-less registration on a throw-away ring (released at once); the errno
/// explained on failure.
pub fn attempt_nodev() -> Result<(), String> {
    let mut rr = RecvRing::<cqueue::Entry32>::new(&RingConfig {
        entries: 8,
        ..RingConfig::default()
    })
    .map_err(|e| format!("no io_uring to register with: {e}"))?;
    for need in ["SINGLE_ISSUER", "DEFER_TASKRUN"] {
        if !rr.ring().has_flag(need) {
            return Err(format!(
                "the kernel refused a ring with {need}, which zcrx requires"
            ));
        }
    }
    rr.register_zcrx(ZcrxBind::NoDev, 64 << 10, 16, false)
        .map(drop)
        .map_err(|e| format!("{} ({})", e.explanation, e.source))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_feature_is_recorded_with_a_reason_when_missing() {
        let f = Features::probe();
        if let Some(why) = &f.unavailable {
            eprintln!("skip: no io_uring: {why}");
            return;
        }
        let names: Vec<_> = f.list.iter().map(|x| x.name).collect();
        assert_eq!(names, Features::NAMES);
        for x in &f.list {
            assert_eq!(x.supported, x.reason.is_none(), "{x:?}");
            assert_ne!(x.since, "?", "{x:?}");
        }
        // The flags a SEND_ZC carries are exactly what the probe found.
        assert_eq!(
            f.send_zc_flags() != 0,
            f.has(Features::SEND_ZC_REPORT_USAGE)
        );
    }
}

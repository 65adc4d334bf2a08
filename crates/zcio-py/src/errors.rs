//! zcio errors as Python exceptions that say what to do.

use pyo3::exceptions::{PyOSError, PyPermissionError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use zcio::netlink::{BindRefusal, FrameError, NfqError};

pyo3::create_exception!(
    _native,
    QueueBusy,
    PyOSError,
    "The queue is bound by another netlink socket (another process or NfQueue)."
);
pyo3::create_exception!(
    _native,
    FramesExhausted,
    PyRuntimeError,
    "Every frame holds a packet that awaits its verdict: decide some, or open the queue with more frames."
);
pyo3::create_exception!(
    _native,
    QueueUnbound,
    PyRuntimeError,
    "The queue was unbound (closed), or given up after verdict sends kept failing."
);

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("QueueBusy", py.get_type::<QueueBusy>())?;
    m.add("FramesExhausted", py.get_type::<FramesExhausted>())?;
    m.add("QueueUnbound", py.get_type::<QueueUnbound>())?;
    Ok(())
}

fn os_error(errno: Option<i32>, msg: String) -> PyErr {
    match errno {
        Some(e) => PyOSError::new_err((e, msg)),
        None => PyOSError::new_err(msg),
    }
}

/// Maps an [`NfqError`] while binding queue `queue` (or using it) to the exception a Python
/// user can act on.
pub(crate) fn nfq_err(e: NfqError) -> PyErr {
    match &e {
        NfqError::Config {
            queue,
            what,
            source,
            refusal,
            hint,
        } => {
            let errno = source.raw_os_error();
            // The kernel answers EPERM both for a queue bound by another socket and for a
            // caller without CAP_NET_ADMIN; the library checked which (`refusal`).
            match refusal {
                Some(BindRefusal::InUse { .. } | BindRefusal::BoundHere) => QueueBusy::new_err((
                    libc::EBUSY,
                    format!(
                        "Failed to create queue {queue}: it is already bound by another netlink \
                         socket{hint} (see the portid column of \
                         /proc/net/netfilter/nfnetlink_queue)"
                    ),
                )),
                Some(BindRefusal::NoCapability { .. }) => PyPermissionError::new_err((
                    libc::EPERM,
                    format!(
                        "Failed to create queue {queue}: binding an NFQUEUE queue needs \
                         CAP_NET_ADMIN (in the network namespace's user namespace) in the \
                         process that sends the bind and the verdicts, also on a socket handed \
                         over (sockfd=): run as root, or give the interpreter the capability \
                         (e.g. `setpriv --inh-caps +net_admin --ambient-caps +net_admin python3 \
                         ...`)"
                    ),
                )),
                _ => os_error(
                    errno,
                    format!("Failed to create queue {queue}: kernel refused {what}: {e}"),
                ),
            }
        }
        NfqError::Socket { source, .. } => {
            let errno = source.raw_os_error();
            if errno == Some(libc::EPERM) || errno == Some(libc::EACCES) {
                PyPermissionError::new_err((
                    errno.unwrap_or(libc::EPERM),
                    format!("{e}: NFQUEUE needs CAP_NET_ADMIN; run as root or grant it"),
                ))
            } else {
                os_error(errno, e.to_string())
            }
        }
        NfqError::Frames(FrameError::AllHeld(n)) => FramesExhausted::new_err(format!(
            "all {n} frames hold packets that await their verdicts (held past their batch): \
             decide some (accept/drop), or open the queue with more frames (frames=...)"
        )),
        NfqError::Frames(FrameError::Io(io)) => os_error(io.raw_os_error(), e.to_string()),
        NfqError::Send { source, .. } | NfqError::SendFailing { source, .. } => {
            os_error(source.raw_os_error(), e.to_string())
        }
        NfqError::Unbound => QueueUnbound::new_err("Parent queue has already been unbound"),
        NfqError::Emit { .. } | NfqError::MangleGso { .. } => PyValueError::new_err(e.to_string()),
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

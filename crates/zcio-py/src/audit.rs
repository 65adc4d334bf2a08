//! `Audit` for Python: the kernel's audit events on the frame ring, read as `NfLog` and
//! `CtEvents` are (batches fetched with the GIL released in 20 ms slices, or `ready_batch()`
//! after `fileno()` polled readable). Each event becomes a dict as `zcio audit` writes it in
//! JSON: `serial`, `time`, `end`, `incomplete`, and `records` in arrival order, each with
//! `type`, `name` (where the type has one), `fields` (hex-encoded values decoded) and `text`
//! (the fields as the kernel wrote them).

use crate::logs::loss_items;
use crate::queue::{in_slices, OnThisThread};
use pyo3::exceptions::{PyOSError, PyPermissionError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::time::Duration;
use zcio::netlink::{
    audit_type_name, Audit as LibAudit, AuditConfig, AuditError, AuditEvent, AuditMode,
};

fn audit_err(e: AuditError) -> PyErr {
    let errno = match &e {
        AuditError::Socket { source, .. } | AuditError::Refused { source, .. } => {
            source.raw_os_error()
        }
        _ => None,
    };
    match errno {
        Some(libc::EPERM) | Some(libc::EACCES) => PyPermissionError::new_err((
            libc::EPERM,
            format!(
                "{e}: registering as the audit daemon and setting its limits need \
                 CAP_AUDIT_CONTROL, observing needs CAP_AUDIT_READ, both in the initial \
                 namespaces (run as root)"
            ),
        )),
        Some(n) => PyOSError::new_err((n, e.to_string())),
        None => PyRuntimeError::new_err(e.to_string()),
    }
}

/// One event as a dict (the shape of `zcio audit`'s JSON lines).
fn event_dict<'py>(py: Python<'py>, ev: &AuditEvent) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("serial", ev.serial)?;
    d.set_item("time", ev.sec as f64 + f64::from(ev.msec) / 1000.0)?;
    d.set_item("end", ev.end.as_str())?;
    d.set_item("incomplete", ev.incomplete())?;
    let recs = PyList::empty(py);
    for r in ev.records() {
        let rd = PyDict::new(py);
        rd.set_item("type", r.ty)?;
        rd.set_item("name", audit_type_name(r.ty))?;
        let fields = PyDict::new(py);
        for f in r.fields().filter(|f| !f.key.is_empty()) {
            fields.set_item(
                String::from_utf8_lossy(f.key),
                String::from_utf8_lossy(&f.value()),
            )?;
        }
        rd.set_item("fields", fields)?;
        rd.set_item("text", String::from_utf8_lossy(r.body))?;
        recs.append(rd)?;
    }
    d.set_item("records", recs)?;
    Ok(d)
}

/// An audit consumer: the registered audit daemon, or an observer beside one.
#[pyclass(unsendable, subclass, module = "zcio._native")]
pub struct Audit {
    audit: Option<LibAudit>,
    path: &'static str,
    mode: &'static str,
    fallbacks: Vec<String>,
}

impl Audit {
    fn audit(&mut self) -> PyResult<&mut LibAudit> {
        self.audit
            .as_mut()
            .ok_or_else(|| PyRuntimeError::new_err("the audit consumer was closed"))
    }

    /// Receives what comes within `wait` (GIL released; the events copied out of the frames
    /// there), then makes the dicts.
    fn take<'py>(
        &mut self,
        py: Python<'py>,
        wait: Duration,
        ready_only: bool,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let mut raw: Vec<AuditEvent> = Vec::new();
        let a = OnThisThread((self.audit()?, &mut raw));
        let r = py.detach(move || {
            let (a, raw) = a.into_inner();
            let mut f = |ev: &AuditEvent| raw.push(ev.clone());
            if ready_only {
                a.on_ready(&mut f)
            } else {
                a.process(Some(wait), f)
            }
        });
        r.map_err(audit_err)?;
        raw.iter().map(|ev| event_dict(py, ev)).collect()
    }
}

#[pymethods]
impl Audit {
    /// Opens the consumer: the audit daemon (registered by pid; by default auditing is turned
    /// on, and set back at close), or with `observer=True` a reader of the multicast group
    /// beside whatever daemon runs. With `fallback` (the default) a primary that finds
    /// another daemon registered, or is refused, becomes an observer (listed in
    /// `fallbacks`).
    #[new]
    #[pyo3(signature = (*, observer=false, fallback=true, enable=true, backlog_limit=None,
        backlog_wait_time=None, rate_limit=None, event_wait=0.5, sock_len=None, frames=None,
        uring=true))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        observer: bool,
        fallback: bool,
        enable: bool,
        backlog_limit: Option<u32>,
        backlog_wait_time: Option<u32>,
        rate_limit: Option<u32>,
        event_wait: f64,
        sock_len: Option<usize>,
        frames: Option<u32>,
        uring: bool,
    ) -> PyResult<Self> {
        if !(event_wait.is_finite() && event_wait >= 0.0) {
            return Err(PyValueError::new_err(format!(
                "event_wait must be a non-negative number of seconds, not {event_wait}"
            )));
        }
        let d = AuditConfig::default();
        let cfg = AuditConfig {
            mode: if observer {
                AuditMode::Observer
            } else {
                AuditMode::Primary
            },
            fallback,
            enable,
            backlog_limit,
            backlog_wait_time,
            rate_limit,
            event_wait: Duration::from_secs_f64(event_wait),
            rcvbuf: sock_len.map(|n| (n, true)).or(d.rcvbuf),
            frames: frames.unwrap_or(d.frames).max(2),
            uring,
            ..d
        };
        let a = LibAudit::open(cfg).map_err(audit_err)?;
        Ok(Self {
            path: a.path().as_str(),
            mode: a.mode().as_str(),
            fallbacks: a
                .fallbacks()
                .iter()
                .map(|f| format!("{} -> {}: {}", f.from, f.to, f.reason))
                .collect(),
            audit: Some(a),
        })
    }

    /// Events that complete within `timeout` seconds (forever when None: until some do); an
    /// empty list when none did.
    #[pyo3(signature = (timeout=None))]
    fn next_batch<'py>(
        slf: &Bound<'py, Self>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let py = slf.py();
        in_slices(py, timeout, |wait| slf.borrow_mut().take(py, wait, false))
    }

    /// Seconds until the earliest open event closes by the wait for its end-of-event record
    /// (None: no event is open). An event loop that waits on `fileno()` waits at most this
    /// long, then calls `ready_batch()`, which closes it.
    fn next_close(&mut self) -> PyResult<Option<f64>> {
        Ok(self.audit()?.next_close().map(|d| d.as_secs_f64()))
    }

    /// What is ready now (after `fileno()` polled readable).
    fn ready_batch<'py>(&mut self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.take(py, Duration::ZERO, true)
    }

    /// Closes the events still open (their end-of-event records may yet come: at exit) and
    /// returns them.
    fn flush<'py>(&mut self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let mut raw = Vec::new();
        self.audit()?.flush(|ev| raw.push(ev.clone()));
        raw.iter().map(|ev| event_dict(py, ev)).collect()
    }

    /// A descriptor that polls readable when `ready_batch()` would find records.
    fn fileno(&mut self) -> PyResult<i32> {
        use std::os::fd::AsRawFd;
        Ok(self.audit()?.readiness_fd().map_err(audit_err)?.as_raw_fd())
    }

    /// Counters: records, events (eoe, single, waited: how they closed), incomplete, evicted,
    /// open_events, kernel_lost_at_open / kernel_lost_now (the kernel's host-wide `lost`;
    /// None when unreadable), kernel_drops (the socket's), parse_errors, datagrams, syscalls,
    /// and the loss: lost_at_least, lost_at_most, lost_exact, loss_summary.
    #[getter]
    fn stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.audit()?.stats();
        let d = PyDict::new(py);
        d.set_item("mode", self.mode)?;
        d.set_item("records", s.events.records)?;
        d.set_item("events", s.events.events)?;
        d.set_item("eoe", s.events.eoe)?;
        d.set_item("single", s.events.single)?;
        d.set_item("waited", s.events.waited)?;
        d.set_item("incomplete", s.events.incomplete)?;
        d.set_item("evicted", s.events.evicted)?;
        d.set_item("open_events", s.open_events)?;
        d.set_item("kernel_lost_at_open", s.kernel_lost_at_open)?;
        d.set_item("kernel_lost_now", s.kernel_lost_now)?;
        d.set_item("kernel_drops", s.stream.kernel_drops)?;
        d.set_item("parse_errors", s.stream.parse_errors)?;
        d.set_item("datagrams", s.stream.datagrams)?;
        d.set_item("syscalls", s.stream.syscalls)?;
        loss_items(&d, &s.loss, s.loss_summary()).map(|()| d)
    }

    /// "primary" or "observer" (after any fallback).
    #[getter]
    fn mode(&self) -> &'static str {
        self.mode
    }

    /// The receive path.
    #[getter]
    fn path(&self) -> &'static str {
        self.path
    }

    /// Fallbacks taken at open.
    #[getter]
    fn fallbacks(&self) -> Vec<String> {
        self.fallbacks.clone()
    }

    /// Unregisters (primary) and sets back what open changed; events still open are dropped
    /// (`flush()` first to have them).
    fn close(&mut self) -> PyResult<()> {
        if let Some(mut a) = self.audit.take() {
            a.unregister().map_err(audit_err)?;
        }
        Ok(())
    }
}

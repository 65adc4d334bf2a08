//! `NfLog` (NFLOG groups) and `CtEvents` (conntrack events) for Python: the frame ring's other
//! users, read the same way as `NfQueue` — batches fetched with the GIL released in 20 ms
//! slices (signals handled between them), or `ready_batch()` after `fileno()` polled readable.
//!
//! Nothing is decided here, so nothing is held: each logged packet or event is copied out of
//! its frame into a small Python object inside the library's closure, and the frame goes back
//! at once.

use crate::queue::{in_slices, OnThisThread};
use pyo3::exceptions::{PyOSError, PyPermissionError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use zcio::netlink::{
    BindRefusal, CopyMode, CtEvent as LibCtEvent, CtEvents as LibCtEvents, CtEventsConfig,
    LogPacket, Loss, NfLog as LibNfLog, NfLogConfig, Tuple,
};

fn io_err(what: String, e: Option<&std::io::Error>) -> PyErr {
    match e.and_then(|e| e.raw_os_error()) {
        Some(libc::EPERM) | Some(libc::EACCES) => PyPermissionError::new_err(format!(
            "{what}: needs CAP_NET_ADMIN (run as root, or grant the capability)"
        )),
        Some(n) => PyOSError::new_err((n, what)),
        None => PyRuntimeError::new_err(what),
    }
}

/// `lost_at_least`, `lost_at_most` (None: no bound known), `lost_exact` and `loss_summary`
/// (the sentence `zcio nflog` / `zcio conntrack events` print on exit).
pub(crate) fn loss_items(d: &Bound<'_, PyDict>, loss: &Loss, summary: String) -> PyResult<()> {
    d.set_item("lost_at_least", loss.at_least)?;
    d.set_item("lost_at_most", loss.at_most)?;
    d.set_item("lost_exact", loss.exact)?;
    d.set_item("loss_summary", summary)
}

fn log_err(e: zcio::netlink::NfLogError) -> PyErr {
    use zcio::netlink::NfLogError as E;
    let src = match &e {
        E::Socket { source, .. } | E::Config { source, .. } => Some(source),
        _ => None,
    };
    match &e {
        E::Invalid(_) => return PyValueError::new_err(e.to_string()),
        // EPERM from a bind is a missing capability or a group in use: the library checked.
        E::Config {
            refusal: Some(BindRefusal::InUse { .. } | BindRefusal::BoundHere),
            ..
        } => return PyOSError::new_err((libc::EBUSY, e.to_string())),
        E::Config {
            refusal: Some(BindRefusal::Unexplained),
            source,
            ..
        } => {
            return PyOSError::new_err((
                source.raw_os_error().unwrap_or(libc::EPERM),
                e.to_string(),
            ))
        }
        _ => {}
    }
    io_err(e.to_string(), src)
}

fn ct_err(e: zcio::netlink::CtError) -> PyErr {
    use zcio::netlink::CtError as E;
    match &e {
        E::Socket { source, .. } => io_err(e.to_string(), Some(source)),
        E::NothingSelected => PyValueError::new_err(e.to_string()),
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

/// One logged packet (copied out of its frame).
#[pyclass(frozen, module = "zcio._native", get_all)]
pub struct LogEntry {
    /// The NFLOG group (`--nflog-group`).
    group: u16,
    /// Address family of the hook (2 IPv4, 10 IPv6, 7 bridge).
    family: u8,
    /// EtherType, host order.
    hw_protocol: u16,
    /// Netfilter hook.
    hook: u8,
    /// `--nflog-prefix`.
    prefix: Option<String>,
    mark: Option<u32>,
    indev: Option<u32>,
    outdev: Option<u32>,
    physindev: Option<u32>,
    physoutdev: Option<u32>,
    /// Source hardware address.
    hwaddr: Option<Py<PyBytes>>,
    /// When the kernel received the packet (Unix time, float), where it has a timestamp.
    timestamp: Option<f64>,
    uid: Option<u32>,
    gid: Option<u32>,
    /// Per-group sequence number (gaps count lost messages).
    seq: Option<u32>,
    /// The packet from its network header on, up to the copy range.
    payload: Option<Py<PyBytes>>,
}

#[pymethods]
impl LogEntry {
    fn __repr__(&self) -> String {
        format!(
            "<zcio.LogEntry group={} hook={} prefix={:?} len={}>",
            self.group,
            self.hook,
            self.prefix.as_deref().unwrap_or(""),
            Python::attach(|py| self
                .payload
                .as_ref()
                .map_or(0, |p| p.bind(py).as_bytes().len()))
        )
    }
}

/// An NFLOG consumer (one socket for the groups given).
#[pyclass(unsendable, subclass, module = "zcio._native")]
pub struct NfLog {
    log: Option<LibNfLog>,
    path: &'static str,
    fallbacks: Vec<String>,
}

impl NfLog {
    fn log(&mut self) -> PyResult<&mut LibNfLog> {
        self.log
            .as_mut()
            .ok_or_else(|| PyRuntimeError::new_err("the NFLOG consumer was closed"))
    }

    /// Receives what comes within `wait` (GIL released), then makes the entries.
    fn take(
        &mut self,
        py: Python<'_>,
        wait: Duration,
        ready_only: bool,
    ) -> PyResult<Vec<LogEntry>> {
        // The library hands out borrowed views: copy the bytes while they are there, without
        // the GIL (Python objects are made afterwards).
        let mut raw: Vec<(LogPacketOwned, Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let log = OnThisThread((self.log()?, &mut raw));
        let r = py.detach(move || {
            let (log, raw) = log.into_inner();
            let mut f = |p: &LogPacket<'_>| {
                raw.push((
                    LogPacketOwned::from(p),
                    p.payload.map(<[u8]>::to_vec).unwrap_or_default(),
                    p.hwaddr.map(<[u8]>::to_vec),
                ))
            };
            if ready_only {
                log.on_ready(&mut f)
            } else {
                log.process(Some(wait), f)
            }
        });
        r.map_err(log_err)?;
        Ok(raw
            .into_iter()
            .map(|(o, payload, hw)| o.into_entry(py, payload, hw))
            .collect())
    }
}

/// The fields of a [`LogPacket`] that are not bytes.
struct LogPacketOwned {
    group: u16,
    family: u8,
    hw_protocol: u16,
    hook: u8,
    prefix: Option<String>,
    mark: Option<u32>,
    indev: Option<u32>,
    outdev: Option<u32>,
    physindev: Option<u32>,
    physoutdev: Option<u32>,
    timestamp: Option<(u64, u64)>,
    uid: Option<u32>,
    gid: Option<u32>,
    seq: Option<u32>,
    has_payload: bool,
}

impl From<&LogPacket<'_>> for LogPacketOwned {
    fn from(p: &LogPacket<'_>) -> Self {
        Self {
            group: p.group,
            family: p.family,
            hw_protocol: p.hw_protocol,
            hook: p.hook,
            prefix: p.prefix.map(|b| String::from_utf8_lossy(b).into_owned()),
            mark: p.mark,
            indev: p.indev,
            outdev: p.outdev,
            physindev: p.physindev,
            physoutdev: p.physoutdev,
            timestamp: p.timestamp,
            uid: p.uid,
            gid: p.gid,
            seq: p.seq,
            has_payload: p.payload.is_some(),
        }
    }
}

impl LogPacketOwned {
    fn into_entry(self, py: Python<'_>, payload: Vec<u8>, hw: Option<Vec<u8>>) -> LogEntry {
        LogEntry {
            group: self.group,
            family: self.family,
            hw_protocol: self.hw_protocol,
            hook: self.hook,
            prefix: self.prefix,
            mark: self.mark,
            indev: self.indev,
            outdev: self.outdev,
            physindev: self.physindev,
            physoutdev: self.physoutdev,
            hwaddr: hw.map(|b| PyBytes::new(py, &b).unbind()),
            timestamp: self.timestamp.map(|(s, us)| s as f64 + us as f64 / 1e6),
            uid: self.uid,
            gid: self.gid,
            seq: self.seq,
            payload: self
                .has_payload
                .then(|| PyBytes::new(py, &payload).unbind()),
        }
    }
}

#[pymethods]
impl NfLog {
    /// Binds NFLOG `groups` (an int or a list of ints).
    #[new]
    #[pyo3(signature = (groups, *, copy_range=65531, meta=false, nlbufsiz=None, timeout=None,
        qthresh=None, seq=true, conntrack=false, sock_len=None, frames=128, uring=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        groups: &Bound<'_, PyAny>,
        copy_range: u32,
        meta: bool,
        nlbufsiz: Option<u32>,
        timeout: Option<f64>,
        qthresh: Option<u32>,
        seq: bool,
        conntrack: bool,
        sock_len: Option<usize>,
        frames: u32,
        uring: bool,
    ) -> PyResult<Self> {
        let groups: Vec<u16> = match groups.extract::<u16>() {
            Ok(g) => vec![g],
            Err(_) => groups.extract()?,
        };
        let d = NfLogConfig::default();
        let cfg = NfLogConfig {
            groups,
            copy: if meta {
                CopyMode::Meta
            } else {
                CopyMode::Packet(copy_range)
            },
            nlbufsiz: nlbufsiz.or(d.nlbufsiz),
            // Seconds -> the kernel's 1/100 s.
            timeout: timeout
                .map(|t| (t * 100.0).round().max(0.0) as u32)
                .or(d.timeout),
            qthresh: qthresh.or(d.qthresh),
            seq,
            conntrack,
            rcvbuf: sock_len.map(|n| (n, true)).or(d.rcvbuf),
            frames: frames.max(2),
            uring,
            ..d
        };
        let log = LibNfLog::open(cfg).map_err(log_err)?;
        Ok(Self {
            path: log.path().as_str(),
            fallbacks: log
                .fallbacks()
                .iter()
                .map(|f| format!("{} -> {}: {}", f.from, f.to, f.reason))
                .collect(),
            log: Some(log),
        })
    }

    /// Logged packets that arrive within `timeout` seconds (forever when None: until some
    /// arrive); an empty list when none did.
    #[pyo3(signature = (timeout=None))]
    fn next_batch(slf: &Bound<'_, Self>, timeout: Option<f64>) -> PyResult<Vec<LogEntry>> {
        let py = slf.py();
        in_slices(py, timeout, |wait| slf.borrow_mut().take(py, wait, false))
    }

    /// What is ready now (after `fileno()` polled readable).
    fn ready_batch(&mut self, py: Python<'_>) -> PyResult<Vec<LogEntry>> {
        self.take(py, Duration::ZERO, true)
    }

    /// A descriptor that polls readable when `ready_batch()` would find entries.
    fn fileno(&mut self) -> PyResult<i32> {
        use std::os::fd::AsRawFd;
        Ok(self.log()?.readiness_fd().map_err(log_err)?.as_raw_fd())
    }

    /// Counters: packets, seq_gaps, lost (exact, from the sequence numbers), any_loss,
    /// overruns (ENOBUFS), kernel_drops, syscalls.
    #[getter]
    fn stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.log()?.stats();
        let d = PyDict::new(py);
        d.set_item("packets", s.packets)?;
        d.set_item("seq_gaps", s.seq_gaps)?;
        d.set_item("lost", s.lost)?;
        d.set_item("any_loss", s.any_loss())?;
        d.set_item("overruns", s.stream.overruns)?;
        d.set_item("kernel_drops", s.stream.kernel_drops)?;
        d.set_item("tail_batches", s.tail_batches)?;
        loss_items(&d, &s.loss, s.loss_summary())?;
        d.set_item("syscalls", s.stream.syscalls)?;
        d.set_item("datagrams", s.stream.datagrams)?;
        Ok(d)
    }

    /// The receive path.
    #[getter]
    fn path(&self) -> &'static str {
        self.path
    }

    /// Fallbacks taken at bind.
    #[getter]
    fn fallbacks(&self) -> Vec<String> {
        self.fallbacks.clone()
    }

    /// Unbinds the groups.
    fn close(&mut self) -> PyResult<()> {
        if let Some(log) = self.log.take() {
            log.close(Duration::ZERO, |_| {}).map_err(log_err)?;
        }
        Ok(())
    }
}

fn tuple_dict<'py>(py: Python<'py>, t: &Tuple) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let ip = |a: &IpAddr| a.to_string();
    d.set_item("src", ip(&t.src))?;
    d.set_item("dst", ip(&t.dst))?;
    d.set_item("proto", t.proto)?;
    d.set_item("sport", t.src_port)?;
    d.set_item("dport", t.dst_port)?;
    if t.icmp_type.is_some() {
        d.set_item("icmp_type", t.icmp_type)?;
        d.set_item("icmp_code", t.icmp_code)?;
        d.set_item("icmp_id", t.icmp_id)?;
    }
    Ok(d)
}

/// One conntrack event.
#[pyclass(frozen, module = "zcio._native", get_all)]
pub struct CtEvent {
    /// "new", "update" or "destroy".
    kind: &'static str,
    family: u8,
    /// Non-zero: the event was caused by a netlink request of that port.
    portid: u32,
    /// The original direction: dict with src, dst, proto, sport, dport (icmp_* for ICMP).
    orig: Option<Py<PyDict>>,
    /// The reply direction.
    reply: Option<Py<PyDict>>,
    status: Option<u32>,
    timeout: Option<u32>,
    mark: Option<u32>,
    zone: Option<u16>,
    id: Option<u32>,
    /// The event as `conntrack -E` prints it.
    line: String,
}

#[pymethods]
impl CtEvent {
    fn __repr__(&self) -> String {
        format!("<zcio.CtEvent {}>", self.line.trim())
    }
    fn __str__(&self) -> String {
        self.line.clone()
    }
}

/// Owned copy of an event, made without the GIL.
struct CtOwned {
    kind: &'static str,
    family: u8,
    portid: u32,
    orig: Option<Tuple>,
    reply: Option<Tuple>,
    status: Option<u32>,
    timeout: Option<u32>,
    mark: Option<u32>,
    zone: Option<u16>,
    id: Option<u32>,
    line: String,
}

/// A conntrack event listener.
#[pyclass(unsendable, subclass, module = "zcio._native")]
pub struct CtEvents {
    ev: Option<LibCtEvents>,
    path: &'static str,
}

impl CtEvents {
    fn ev(&mut self) -> PyResult<&mut LibCtEvents> {
        self.ev
            .as_mut()
            .ok_or_else(|| PyRuntimeError::new_err("the conntrack event listener was closed"))
    }

    fn take(&mut self, py: Python<'_>, wait: Duration, ready_only: bool) -> PyResult<Vec<CtEvent>> {
        let mut raw: Vec<CtOwned> = Vec::new();
        let ev = OnThisThread((self.ev()?, &mut raw));
        let r = py.detach(move || {
            let (ev, raw) = ev.into_inner();
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            let mut f = |e: &LibCtEvent<'_>| {
                let mut line = String::new();
                let _ = e.write_conntrack(&mut line, false, now);
                raw.push(CtOwned {
                    kind: e.kind.as_str(),
                    family: e.family,
                    portid: e.portid,
                    orig: e.ct.orig,
                    reply: e.ct.reply,
                    status: e.ct.status,
                    timeout: e.ct.timeout,
                    mark: e.ct.mark,
                    zone: e.ct.zone,
                    id: e.ct.id,
                    line,
                });
            };
            if ready_only {
                ev.on_ready(&mut f)
            } else {
                ev.process(Some(wait), f)
            }
        });
        r.map_err(ct_err)?;
        raw.into_iter()
            .map(|o| {
                Ok(CtEvent {
                    kind: o.kind,
                    family: o.family,
                    portid: o.portid,
                    orig: o
                        .orig
                        .as_ref()
                        .map(|t| tuple_dict(py, t).map(Bound::unbind))
                        .transpose()?,
                    reply: o
                        .reply
                        .as_ref()
                        .map(|t| tuple_dict(py, t).map(Bound::unbind))
                        .transpose()?,
                    status: o.status,
                    timeout: o.timeout,
                    mark: o.mark,
                    zone: o.zone,
                    id: o.id,
                    line: o.line,
                })
            })
            .collect()
    }
}

#[pymethods]
impl CtEvents {
    /// Listens for conntrack events of the kinds asked for.
    #[new]
    #[pyo3(signature = (*, new=true, update=true, destroy=true, sock_len=None, frames=None, uring=true))]
    fn py_new(
        new: bool,
        update: bool,
        destroy: bool,
        sock_len: Option<usize>,
        frames: Option<u32>,
        uring: bool,
    ) -> PyResult<Self> {
        let d = CtEventsConfig::default();
        let cfg = CtEventsConfig {
            new,
            update,
            destroy,
            rcvbuf: sock_len.map(|n| (n, true)).or(d.rcvbuf),
            frames: frames.unwrap_or(d.frames).max(2),
            uring,
            ..d
        };
        let ev = LibCtEvents::open(cfg).map_err(ct_err)?;
        Ok(Self {
            path: ev.path().as_str(),
            ev: Some(ev),
        })
    }

    /// Events that arrive within `timeout` seconds (forever when None: until some arrive).
    #[pyo3(signature = (timeout=None))]
    fn next_batch(slf: &Bound<'_, Self>, timeout: Option<f64>) -> PyResult<Vec<CtEvent>> {
        let py = slf.py();
        in_slices(py, timeout, |wait| slf.borrow_mut().take(py, wait, false))
    }

    /// What is ready now (after `fileno()` polled readable).
    fn ready_batch(&mut self, py: Python<'_>) -> PyResult<Vec<CtEvent>> {
        self.take(py, Duration::ZERO, true)
    }

    /// A descriptor that polls readable when `ready_batch()` would find events.
    fn fileno(&mut self) -> PyResult<i32> {
        use std::os::fd::AsRawFd;
        Ok(self.ev()?.readiness_fd().map_err(ct_err)?.as_raw_fd())
    }

    /// Counters: events, new, update, destroy, lost (events the kernel dropped at the
    /// socket, exact), overruns, syscalls.
    #[getter]
    fn stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.ev()?.stats();
        let d = PyDict::new(py);
        d.set_item("events", s.events)?;
        d.set_item("new", s.new)?;
        d.set_item("update", s.update)?;
        d.set_item("destroy", s.destroy)?;
        d.set_item("lost", s.lost())?;
        d.set_item("overruns", s.stream.overruns)?;
        loss_items(&d, &s.loss, s.loss_summary())?;
        d.set_item("syscalls", s.stream.syscalls)?;
        Ok(d)
    }

    /// The receive path.
    #[getter]
    fn path(&self) -> &'static str {
        self.path
    }

    /// Stops listening.
    fn close(&mut self) {
        self.ev = None;
    }
}

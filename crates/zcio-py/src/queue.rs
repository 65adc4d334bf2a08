//! `NfQueue`, `Packet` and `Batch`: zcio's `netlink::NfQueue` for Python.
//!
//! Every packet is received *held* ([`zcio::netlink::NfQueue::receive`]) with its payload
//! pinned in its frame; Python decides it, and the verdicts go out together as batch verdicts
//! with the next receive (or at once for a packet decided after its batch). The wait for
//! packets runs with the GIL released, in slices of [`SLICE`], between which pending signals
//! are handled (so Ctrl+C stops `run()` within a slice) and verdicts given on other threads
//! are applied.
//!
//! Who may decide a packet: any thread. The queue's io_uring belongs to the thread that bound
//! it (the queue object is `unsendable`), so a verdict given on another thread is recorded in
//! the packet and applied by that thread at its next slice.

use crate::errors::{nfq_err, QueueUnbound};
use crate::view::view_of;
use pyo3::exceptions::{PyIndexError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;
use std::time::{Duration, Instant};
use zcio::netlink::{
    CopyMode, Decision, FramePin, NfQueue as Queue, NfQueueConfig, NfqStats, PacketInfo, PacketRef,
    Received, Verdict,
};
use zcio::stats::Report;

/// Longest wait without looking at signals and cross-thread verdicts.
const SLICE: Duration = Duration::from_millis(20);

/// `NFQA_SKB_GSO`.
const SKB_GSO: u32 = 2;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the library knows of one packet's verdict, shared by its `Packet` object, its queue
/// and (for a verdict given elsewhere) the thread that gave it.
struct Slot {
    r: PacketRef,
    st: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    /// A verdict given but not applied yet (given on another thread).
    decision: Option<Decision>,
    /// The verdict reached the library (it goes out with the next send).
    applied: bool,
    /// Given by the queue, not the user: the default after a raising callback or at the end
    /// of its batch, or at unbind.
    by_default: bool,
    /// Kept past its batch (`hold()`) or retained past its callback.
    held: bool,
    /// The payload's pin (`None` once decided, or after its callback in the
    /// netfilterqueue-compatible mode).
    pin: Option<Arc<FramePin>>,
    /// The memoryview handed out, released at the verdict.
    view: Option<Py<PyAny>>,
    /// Its callback is running, in the netfilterqueue-compatible mode: the payload stays
    /// readable until the callback returns, verdict or not (as netfilterqueue's).
    in_callback: bool,
}

/// State shared by a queue and its packets, which may live on other threads.
struct Shared {
    owner: ThreadId,
    /// Packets decided on other threads, to apply.
    remote: Mutex<Vec<Arc<Slot>>>,
    closed: AtomicBool,
}

/// A value bound to this thread (an io_uring owner: the queue, the NFLOG and conntrack
/// sockets) handed to `Python::detach`'s closure, which wants `Send`.
pub(crate) struct OnThisThread<T>(pub(crate) T);

// SAFETY: `Python::detach` runs its closure on the calling thread, before it returns, so the
// value never leaves the thread it belongs to (it is `!Send` only because its io_uring is bound
// to this thread); the closures touch no Python object.
#[allow(unsafe_code)]
unsafe impl<T> Send for OnThisThread<T> {}

impl<T> OnThisThread<T> {
    /// The value (call inside the closure, so the closure captures the whole wrapper).
    pub(crate) fn into_inner(self) -> T {
        self.0
    }
}

/// A descriptor of our own for the caller's `fd` (close-on-exec), which stays the caller's.
fn dup_fd(fd: i32) -> PyResult<std::os::fd::OwnedFd> {
    if fd < 0 {
        return Err(pyo3::exceptions::PyOSError::new_err((
            libc::EBADF,
            format!("socket {fd} is not a descriptor"),
        )));
    }
    #[allow(unsafe_code)]
    // SAFETY: the borrow lives for the one `try_clone_to_owned` call (`F_DUPFD_CLOEXEC`),
    // while the caller holds `fd` open (`NetfilterQueue` keeps its descriptor until it goes);
    // a number that is not open fails with EBADF.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    borrowed.try_clone_to_owned().map_err(|e| {
        pyo3::exceptions::PyOSError::new_err((e.raw_os_error(), format!("dup of socket {fd}: {e}")))
    })
}

fn verdict_of(v: u32) -> PyResult<Verdict> {
    Verdict::from_wire(v).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown verdict {v}: use zcio.ACCEPT, zcio.DROP, zcio.REPEAT or zcio.queue_verdict(n)"
        ))
    })
}

/// Releases a memoryview we handed out; one with buffers exported from it (a NumPy array over
/// it) cannot be, and keeps its frame pinned until those go (never reused meanwhile).
fn release_view(py: Python<'_>, view: Option<Py<PyAny>>) {
    if let Some(v) = view {
        if v.bind(py).call_method0("release").is_err() {
            // BufferError: exported; the pin keeps the bytes.
            PyErr::fetch(py);
        }
    }
}

/// An NFQUEUE consumer (one queue or a range, one socket each).
#[pyclass(unsendable, subclass, module = "zcio._native")]
pub struct NfQueue {
    q: Option<Queue>,
    shared: Arc<Shared>,
    default: Verdict,
    /// netfilterqueue semantics: a packet's bytes are readable during its callback only
    /// (unless retained), so undecided packets give their frames back.
    compat: bool,
    /// The packets of the current batch.
    batch: Vec<Arc<Slot>>,
    /// Undecided packets kept past their batch or callback.
    kept: HashMap<PacketRef, Arc<Slot>>,
    /// Received, not yet handed to the callback (the callback raised before them).
    pending: VecDeque<Received>,
    scratch: Vec<Received>,
    default_verdicts: u64,
    callback_errors: u64,
    /// Per queue, the highest id decided since the last send: a verdict for a lower id is
    /// preceded by a flush, so verdicts reach the kernel in the order they were given (the
    /// batch builder writes a datagram in id order; netfilterqueue users reorder packets by
    /// accepting them out of order).
    unsent_max: HashMap<u16, u32>,
    last_stats: NfqStats,
    queues: Vec<u16>,
    fallbacks: Vec<String>,
    path: &'static str,
}

impl NfQueue {
    fn queue(&mut self) -> PyResult<&mut Queue> {
        self.q
            .as_mut()
            .ok_or_else(|| QueueUnbound::new_err("Parent queue has already been unbound"))
    }

    /// Applies a verdict recorded in `slot` (decided on this thread, or collected from
    /// another one).
    fn apply(&mut self, py: Python<'_>, slot: &Arc<Slot>) -> PyResult<()> {
        let mut st = lock(&slot.st);
        let Some(d) = st.decision.take() else {
            return Ok(());
        };
        let Some(q) = self.q.as_mut() else {
            return Err(QueueUnbound::new_err(
                "Parent queue has already been unbound",
            ));
        };
        let r = slot.r;
        if let Some(&max) = self.unsent_max.get(&r.queue) {
            if (r.id.wrapping_sub(max) as i32) < 0 {
                // Out of order: what was decided before goes out first.
                if let Err(e) = q.flush() {
                    st.decision = Some(d);
                    return Err(nfq_err(e));
                }
                self.unsent_max.clear();
            }
        }
        let max = self.unsent_max.entry(r.queue).or_insert(r.id);
        if (r.id.wrapping_sub(*max) as i32) > 0 {
            *max = r.id;
        }
        if let Err(e) = q.verdict(slot.r, d) {
            let e = match e {
                zcio::netlink::NfqError::NotHeld { .. } => {
                    st.applied = true;
                    PyRuntimeError::new_err("Verdict already given for this packet")
                }
                e => nfq_err(e),
            };
            return Err(e);
        }
        st.applied = true;
        let (view, pin) = if st.in_callback {
            (None, None)
        } else {
            (st.view.take(), st.pin.take())
        };
        drop(st);
        release_view(py, view);
        drop(pin);
        if self.kept.remove(&slot.r).is_some() {
            // Decided after its batch: nothing else is on its way out, send now.
            self.queue()?.flush().map_err(nfq_err)?;
            self.unsent_max.clear();
        }
        Ok(())
    }

    fn apply_remote(&mut self, py: Python<'_>) -> PyResult<()> {
        let slots = std::mem::take(&mut *lock(&self.shared.remote));
        let mut first = Ok(());
        for s in slots {
            if let Err(e) = self.apply(py, &s) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// Gives `slot` the default verdict unless it has one.
    fn default_verdict(&mut self, py: Python<'_>, slot: &Arc<Slot>) -> PyResult<()> {
        {
            let mut st = lock(&slot.st);
            if st.applied || st.decision.is_some() {
                drop(st);
                return self.apply(py, slot);
            }
            st.decision = Some(Decision::Verdict(self.default));
            st.by_default = true;
        }
        self.default_verdicts += 1;
        self.apply(py, slot)
    }

    /// Ends the current batch: packets neither decided nor held get the default verdict,
    /// held ones are kept.
    fn close_batch(&mut self, py: Python<'_>) -> PyResult<()> {
        let mut first = Ok(());
        for slot in std::mem::take(&mut self.batch) {
            let held = {
                let st = lock(&slot.st);
                if st.applied {
                    continue;
                }
                st.held && st.decision.is_none()
            };
            let r = if held {
                self.kept.insert(slot.r, slot);
                Ok(())
            } else {
                self.default_verdict(py, &slot)
            };
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Receives up to `max` packets (pending ones first), waiting up to `wait` with the GIL
    /// released. Ends the current batch first.
    fn receive(
        &mut self,
        py: Python<'_>,
        max: usize,
        wait: Duration,
        ready_only: bool,
    ) -> PyResult<Vec<Received>> {
        self.close_batch(py)?;
        self.apply_remote(py)?;
        if !self.pending.is_empty() {
            let n = self.pending.len().min(max);
            return Ok(self.pending.drain(..n).collect());
        }
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        let q = OnThisThread((self.queue()?, &mut out));
        let r = py.detach(move || {
            let (q, out) = q.into_inner();
            if ready_only {
                q.receive_ready(max, out)
            } else {
                q.receive(Some(wait), max, out)
            }
        });
        // The receive sent every verdict given before it.
        self.unsent_max.clear();
        self.refresh();
        match r {
            Ok(_) => Ok(out),
            Err(e) => {
                // Packets received before the error are still ours to hand out.
                self.pending.extend(out.drain(..));
                Err(nfq_err(e))
            }
        }
    }

    fn refresh(&mut self) {
        if let Some(q) = &self.q {
            self.last_stats = q.stats();
        }
    }

    fn make_packet(&self, py: Python<'_>, me: Py<NfQueue>, r: Received) -> PyResult<Py<Packet>> {
        let slot = Arc::new(Slot {
            r: r.packet,
            st: Mutex::new(SlotState {
                pin: r.payload.map(Arc::new),
                ..SlotState::default()
            }),
        });
        let payload_len = lock(&slot.st).pin.as_ref().map_or(0, |p| p.len());
        Py::new(
            py,
            Packet {
                slot,
                shared: Arc::clone(&self.shared),
                queue: me,
                info: r.info,
                payload_len,
                given_mark: None,
                given_payload: None,
                retained: None,
                compat: self.compat,
            },
        )
    }

    /// After the callback of `pkt`: apply its verdict, or keep it (giving its frame back in
    /// compat mode), or — when the callback raised — give it the default verdict (outside
    /// compat mode; netfilterqueue leaves such a packet undecided, for the caller to decide
    /// after `run` re-raised, and so does compat mode).
    fn after_callback(&mut self, py: Python<'_>, pkt: &Packet, raised: bool) -> PyResult<()> {
        let slot = &pkt.slot;
        if raised {
            self.callback_errors += 1;
        }
        let (decided, applied) = {
            let mut st = lock(&slot.st);
            st.in_callback = false;
            (st.decision.is_some(), st.applied)
        };
        if applied {
            // Decided in its callback: its bytes go now that the callback has returned.
            let (view, pin) = {
                let mut st = lock(&slot.st);
                (st.view.take(), st.pin.take())
            };
            release_view(py, view);
            drop(pin);
            return Ok(());
        }
        if decided {
            return self.apply(py, slot);
        }
        if raised && !self.compat {
            return self.default_verdict(py, slot);
        }
        let (view, pin) = {
            let mut st = lock(&slot.st);
            st.held = true;
            (st.view.take(), st.pin.take())
        };
        release_view(py, view);
        drop(pin);
        self.kept.insert(slot.r, Arc::clone(slot));
        // Its bytes are gone (or retained as a copy): the frame can carry other packets while
        // the packet waits for its verdict (bounded by the kernel's max_len, as with
        // libnetfilter_queue).
        self.queue()?.release_frame(slot.r).map_err(nfq_err)
    }

    /// Unbinds: every packet we hold gets the default verdict first.
    fn close_all(&mut self, py: Python<'_>, drain: Duration) -> PyResult<()> {
        if self.q.is_none() {
            return Ok(());
        }
        let _ = self.apply_remote(py);
        let mut slots: Vec<Arc<Slot>> = std::mem::take(&mut self.batch);
        slots.extend(self.kept.drain().map(|(_, s)| s));
        for s in &slots {
            let _ = self.default_verdict(py, s);
        }
        let pending: Vec<Received> = self.pending.drain(..).collect();
        for r in pending {
            if let Some(q) = self.q.as_mut() {
                if q.verdict(r.packet, Decision::Verdict(self.default)).is_ok() {
                    self.default_verdicts += 1;
                }
            }
        }
        self.shared.closed.store(true, Ordering::Release);
        let q = self.q.take().expect("checked");
        let (stats, _left) = q.close(self.default, drain).map_err(nfq_err)?;
        self.last_stats = stats;
        Ok(())
    }

    fn batch_of(
        &mut self,
        py: Python<'_>,
        me: &Bound<'_, NfQueue>,
        got: Vec<Received>,
    ) -> PyResult<Batch> {
        let mut packets = Vec::with_capacity(got.len());
        for r in got {
            let p = self.make_packet(py, me.clone().unbind(), r)?;
            self.batch.push(Arc::clone(&p.borrow(py).slot));
            packets.push(p);
        }
        Ok(Batch {
            packets,
            queue: me.clone().unbind(),
            owner: self.shared.owner,
        })
    }
}

/// Calls `take(wait)` with waits of at most [`SLICE`] until it returns something or
/// `timeout` seconds (forever when None) have passed, handling pending signals between
/// slices (Ctrl-C ends a wait within one slice). Used by every `next_batch`.
pub(crate) fn in_slices<T>(
    py: Python<'_>,
    timeout: Option<f64>,
    mut take: impl FnMut(Duration) -> PyResult<Vec<T>>,
) -> PyResult<Vec<T>> {
    let deadline = secs(timeout)?.map(|t| Instant::now() + t);
    loop {
        let wait = deadline.map_or(SLICE, |d| {
            d.saturating_duration_since(Instant::now()).min(SLICE)
        });
        let got = take(wait)?;
        if !got.is_empty() || deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(got);
        }
        py.check_signals()?;
    }
}

fn secs(t: Option<f64>) -> PyResult<Option<Duration>> {
    match t {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(PyValueError::new_err(format!(
            "timeout must be a non-negative number of seconds, not {s}"
        ))),
    }
}

#[pymethods]
impl NfQueue {
    /// Binds queue `queue` (or the range `queue..=last`, one socket each).
    #[new]
    #[pyo3(signature = (queue, last=None, *, copy_range=0xffff, meta=false, max_len=None,
        fail_open=false, sock_len=None, gso=false, uid_gid=false, conntrack=false,
        default_verdict=0, frames=256, frame_size=4096, uring=true, compat=false, sockfd=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        queue: u16,
        last: Option<u16>,
        copy_range: u32,
        meta: bool,
        max_len: Option<u32>,
        fail_open: bool,
        sock_len: Option<usize>,
        gso: bool,
        uid_gid: bool,
        conntrack: bool,
        default_verdict: u32,
        frames: u32,
        frame_size: usize,
        uring: bool,
        compat: bool,
        sockfd: Option<i32>,
    ) -> PyResult<Self> {
        let last = last.unwrap_or(queue);
        if last < queue {
            return Err(PyValueError::new_err(format!(
                "last queue {last} is below the first {queue}"
            )));
        }
        let default = verdict_of(default_verdict)?;
        let cfg = NfQueueConfig {
            first: queue,
            last,
            copy: if meta {
                CopyMode::Meta
            } else {
                CopyMode::Packet(copy_range.min(0xffff))
            },
            max_len,
            fail_open,
            gso,
            conntrack,
            uid_gid,
            frames: frames.max(2),
            frame_size,
            uring,
            rcvbuf: Some((sock_len.unwrap_or(4 << 20), true)),
            on_error: default,
            ..NfQueueConfig::default()
        };
        let q = match sockfd {
            // A socket opened elsewhere (netfilterqueue's `sockfd=`): the queue works on a
            // duplicate of it, frame ring included.
            Some(fd) => Queue::from_socket(cfg, dup_fd(fd)?),
            None => Queue::open(cfg),
        }
        .map_err(nfq_err)?;
        let fallbacks = q
            .fallbacks()
            .iter()
            .map(|f| format!("{} -> {}: {}", f.from, f.to, f.reason))
            .collect();
        Ok(Self {
            queues: q.queues(),
            path: q.path().as_str(),
            fallbacks,
            last_stats: q.stats(),
            q: Some(q),
            shared: Arc::new(Shared {
                owner: std::thread::current().id(),
                remote: Mutex::new(Vec::new()),
                closed: AtomicBool::new(false),
            }),
            default,
            compat,
            batch: Vec::new(),
            kept: HashMap::new(),
            pending: VecDeque::new(),
            scratch: Vec::new(),
            default_verdicts: 0,
            callback_errors: 0,
            unsent_max: HashMap::new(),
        })
    }

    /// The next batch of up to `max` packets (waiting up to `timeout` seconds, forever when
    /// None; an empty batch when nothing came). Ends the previous batch first: its packets
    /// neither decided nor held get the default verdict.
    #[pyo3(signature = (max=64, timeout=None))]
    fn next_batch(slf: &Bound<'_, Self>, max: usize, timeout: Option<f64>) -> PyResult<Batch> {
        let py = slf.py();
        let got = in_slices(py, timeout, |wait| {
            slf.borrow_mut().receive(py, max.max(1), wait, false)
        })?;
        let mut me = slf.borrow_mut();
        me.batch_of(py, slf, got)
    }

    /// What is ready now, without waiting (for an event loop woken by `fileno()`).
    #[pyo3(signature = (max=64))]
    fn ready_batch(slf: &Bound<'_, Self>, max: usize) -> PyResult<Batch> {
        let py = slf.py();
        let mut me = slf.borrow_mut();
        let got = me.receive(py, max.max(1), Duration::ZERO, true)?;
        me.batch_of(py, slf, got)
    }

    /// Calls `callback(packet)` for every packet, in id order (netfilterqueue's `run`): until
    /// an exception (Ctrl+C included) with `block`, or until nothing is ready without. A
    /// packet the callback neither decided nor kept gets... nothing: it stays queued until its
    /// verdict (call `accept()` later). A callback that raises gives its packet the default
    /// verdict (with `compat`, as netfilterqueue: it stays undecided for the caller to
    /// decide) and `run` re-raises; packets received after it are handed to the next `run`.
    #[pyo3(signature = (callback, block=true, max=64))]
    fn run(
        slf: &Bound<'_, Self>,
        callback: Bound<'_, PyAny>,
        block: bool,
        max: usize,
    ) -> PyResult<()> {
        let py = slf.py();
        let wait = if block { SLICE } else { Duration::ZERO };
        let r = (|| loop {
            let got = slf.borrow_mut().receive(py, max.max(1), wait, false)?;
            if got.is_empty() {
                py.check_signals()?;
                if !block {
                    return Ok(());
                }
                continue;
            }
            let mut rest = got.into_iter();
            while let Some(r) = rest.next() {
                let pkt = slf.borrow().make_packet(py, slf.clone().unbind(), r)?;
                let compat = slf.borrow().compat;
                lock(&pkt.borrow(py).slot.st).in_callback = compat;
                let res = callback.call1((pkt.clone_ref(py),));
                let raised = res.is_err();
                {
                    let p = pkt.borrow(py);
                    slf.borrow_mut().after_callback(py, &p, raised)?;
                }
                if let Err(e) = res {
                    slf.borrow_mut().pending.extend(rest);
                    return Err(e);
                }
            }
            py.check_signals()?;
        })();
        // Verdicts given so far go out now, whatever ended the loop.
        let mut me = slf.borrow_mut();
        me.unsent_max.clear();
        if let Some(q) = me.q.as_mut() {
            let f = q.flush();
            me.refresh();
            if let (Ok(()), Err(e)) = (&r, f) {
                return Err(nfq_err(e));
            }
        }
        r
    }

    /// Ends the current batch now (its packets neither decided nor held get the default
    /// verdict) and sends the verdicts.
    fn end_batch(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.q.is_none() {
            return Ok(());
        }
        let r = self.close_batch(py);
        self.flush(py)?;
        r
    }

    /// Puts a datagram read from `get_fd()` by the caller (`run_socket`) into the frame ring.
    fn feed(&mut self, data: &[u8]) -> PyResult<()> {
        let queue = self.queues[0];
        self.queue()?.feed(queue, data).map_err(nfq_err)
    }

    /// Sends every verdict given so far now.
    fn flush(&mut self, py: Python<'_>) -> PyResult<()> {
        self.apply_remote(py)?;
        self.queue()?.flush().map_err(nfq_err)?;
        self.unsent_max.clear();
        self.refresh();
        Ok(())
    }

    /// Unbinds: the packets this queue still holds get the default verdict; with `drain`
    /// seconds, packets the kernel still queues are received and decided with it too.
    #[pyo3(signature = (drain=0.0))]
    fn close(&mut self, py: Python<'_>, drain: f64) -> PyResult<()> {
        let d = secs(Some(drain))?.unwrap_or_default();
        self.close_all(py, d)
    }

    /// Whether the queue is bound.
    #[getter]
    fn bound(&self) -> bool {
        self.q.is_some()
    }

    /// A descriptor that polls readable when `ready_batch()` would find packets (asyncio's
    /// `add_reader`).
    fn fileno(&mut self) -> PyResult<i32> {
        use std::os::fd::AsRawFd;
        Ok(self.queue()?.readiness_fd().map_err(nfq_err)?.as_raw_fd())
    }

    /// The netlink socket of the (first) queue.
    fn socket_fd(&mut self) -> PyResult<i32> {
        Ok(self.queue()?.fds()[0])
    }

    /// The queue numbers bound.
    #[getter]
    fn queues(&self) -> Vec<u16> {
        self.queues.clone()
    }

    /// The receive path: `frame-ring+io_uring` or `frame-ring+recvmmsg`.
    #[getter]
    fn path(&self) -> &'static str {
        self.path
    }

    /// Fallbacks taken at bind, each `from -> to: reason`.
    #[getter]
    fn fallbacks(&self) -> Vec<String> {
        self.fallbacks.clone()
    }

    /// The default verdict (for packets a batch or a raising callback left undecided).
    #[getter(default_verdict)]
    fn default_verdict_wire(&self) -> u32 {
        self.default.to_wire()
    }

    /// Packets received and not decided yet (held, kept past their batch, pending).
    #[getter]
    fn undecided(&self) -> usize {
        self.q.as_ref().map_or(0, |q| q.unconfirmed())
    }

    /// Counters: the library's (received, accepted, dropped, batches, singles, overruns,
    /// recv_syscalls, send_syscalls, ...) plus `default_verdicts`, `callback_errors`,
    /// `pending`, `kept`, and `bound`.
    #[getter]
    fn stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.refresh();
        let d = PyDict::new(py);
        let s = &self.last_stats;
        for (k, v) in [
            ("received", s.received),
            ("accepted", s.accepted),
            ("dropped", s.dropped),
            ("repeated", s.repeated),
            ("requeued", s.requeued),
            ("batches", s.batches),
            ("batched", s.batched),
            ("singles", s.singles),
            ("held", s.held),
            ("held_total", s.held_total),
            ("overruns", s.overruns),
            ("send_syscalls", s.send_syscalls),
            ("ring_sends", s.ring_sends),
            ("recv_syscalls", s.recv_syscalls),
            ("kernel_errors", s.kernel_errors),
            ("copies", s.copies),
            ("send_failures", s.send_failures),
            ("parse_errors", s.parse_errors),
            ("refused", s.refused),
            ("abandoned", s.abandoned),
            ("verdicts", s.verdicts()),
            ("default_verdicts", self.default_verdicts),
            ("callback_errors", self.callback_errors),
            ("pending", self.pending.len() as u64),
            ("kept", self.kept.len() as u64),
        ] {
            d.set_item(k, v)?;
        }
        d.set_item("bound", self.q.is_some())?;
        d.set_item(
            "syscalls",
            self.q.as_ref().map_or(0, |q| q.counters().syscalls),
        )?;
        Ok(d)
    }

    /// The kernel's view of the bound queues (/proc/net/netfilter/nfnetlink_queue): a list of
    /// dicts with queue, portid, waiting, copy_mode, copy_range, queue_dropped, user_dropped,
    /// id_sequence.
    fn kernel_stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let ks = self
            .queue()?
            .kernel_stats()
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let l = PyList::empty(py);
        for k in ks {
            let d = PyDict::new(py);
            d.set_item("queue", k.queue)?;
            d.set_item("portid", k.portid)?;
            d.set_item("waiting", k.waiting)?;
            d.set_item("copy_mode", k.copy_mode)?;
            d.set_item("copy_range", k.copy_range)?;
            d.set_item("queue_dropped", k.queue_dropped)?;
            d.set_item("user_dropped", k.user_dropped)?;
            d.set_item("id_sequence", k.id_sequence)?;
            l.append(d)?;
        }
        Ok(l)
    }
}

impl Drop for NfQueue {
    fn drop(&mut self) {
        if self.q.is_some() {
            Python::attach(|py| {
                let _ = self.close_all(py, Duration::ZERO);
            });
        }
    }
}

/// A queued packet.
#[pyclass(module = "zcio._native")]
pub struct Packet {
    slot: Arc<Slot>,
    shared: Arc<Shared>,
    queue: Py<NfQueue>,
    info: PacketInfo,
    payload_len: usize,
    given_mark: Option<u32>,
    given_payload: Option<Py<PyBytes>>,
    retained: Option<Py<PyBytes>>,
    compat: bool,
}

impl Packet {
    fn decide(&mut self, py: Python<'_>, v: Verdict) -> PyResult<()> {
        {
            // A verdict the caller gave is reported before an unbind (netfilterqueue's order);
            // one the queue gave at unbind is not the caller's: that is "unbound".
            let st = lock(&self.slot.st);
            if (st.applied || st.decision.is_some()) && !st.by_default {
                return Err(PyRuntimeError::new_err(
                    "Verdict already given for this packet",
                ));
            }
        }
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(QueueUnbound::new_err(
                "Parent queue has already been unbound",
            ));
        }
        let d = match (&self.given_payload, self.given_mark) {
            (Some(p), mark) => Decision::Mangle(v, p.as_bytes(py).to_vec(), mark),
            (None, Some(m)) => Decision::Mark(v, m),
            (None, None) => Decision::Verdict(v),
        };
        {
            let mut st = lock(&self.slot.st);
            if st.applied || st.decision.is_some() {
                return Err(PyRuntimeError::new_err(if st.by_default {
                    "Verdict already given for this packet (the default verdict: its batch \
                     ended, or its callback raised; call hold() to keep a packet past its batch)"
                } else {
                    "Verdict already given for this packet"
                }));
            }
            st.decision = Some(d);
        }
        if std::thread::current().id() != self.shared.owner {
            // Applied by the queue's own thread at its next slice (at most 20 ms later while
            // it waits for packets).
            lock(&self.shared.remote).push(Arc::clone(&self.slot));
            return Ok(());
        }
        match self.queue.bind(py).try_borrow_mut() {
            Ok(mut q) => q.apply(py, &self.slot),
            // The queue is inside one of its own calls (a signal handler or a callback run
            // from it): its next call applies the verdict, as for another thread's.
            Err(_) => {
                lock(&self.shared.remote).push(Arc::clone(&self.slot));
                Ok(())
            }
        }
    }

    fn pin(&self) -> Option<Arc<FramePin>> {
        lock(&self.slot.st).pin.clone()
    }
}

#[pymethods]
impl Packet {
    /// Accept the packet.
    fn accept(&mut self, py: Python<'_>) -> PyResult<()> {
        self.decide(py, Verdict::Accept)
    }

    /// Drop the packet.
    fn drop(&mut self, py: Python<'_>) -> PyResult<()> {
        self.decide(py, Verdict::Drop)
    }

    /// Re-run the packet's hook (NF_REPEAT).
    fn repeat(&mut self, py: Python<'_>) -> PyResult<()> {
        self.decide(py, Verdict::Repeat)
    }

    /// Any verdict by its wire value (zcio.ACCEPT, zcio.DROP, zcio.REPEAT,
    /// zcio.queue_verdict(n)).
    fn verdict(&mut self, py: Python<'_>, verdict: u32) -> PyResult<()> {
        let v = verdict_of(verdict)?;
        self.decide(py, v)
    }

    /// Keep the packet past its batch: it waits (and its payload view stays valid) until its
    /// verdict. Held packets keep their frames: there are `frames` per queue.
    fn hold(&self) {
        lock(&self.slot.st).held = true;
    }

    /// Whether the packet has a verdict (given or pending on another thread).
    #[getter]
    fn decided(&self) -> bool {
        let st = lock(&self.slot.st);
        st.applied || st.decision.is_some()
    }

    /// Whether the packet is kept past its batch.
    #[getter]
    fn held(&self) -> bool {
        lock(&self.slot.st).held
    }

    /// The payload as a read-only memoryview into its frame (no copy), valid until the
    /// verdict: then it is released (ValueError on use). None without a payload.
    #[getter(payload)]
    fn payload_view<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let mut st = lock(&self.slot.st);
        if let Some(v) = &st.view {
            return Ok(Some(v.bind(py).clone()));
        }
        let Some(pin) = st.pin.clone() else {
            if st.applied || st.decision.is_some() || (self.compat && self.payload_len > 0) {
                return Err(PyValueError::new_err(
                    "the packet's payload view was released at its verdict (its frame went \
                     back to the ring): copy what you need before deciding (bytes(p.payload))",
                ));
            }
            return Ok(None);
        };
        let v = view_of(py, pin)?;
        st.view = Some(v.clone().unbind());
        Ok(Some(v))
    }

    /// The payload as bytes (a copy); set_payload's bytes once given.
    fn get_payload<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        if let Some(p) = &self.given_payload {
            return Ok(p.bind(py).clone());
        }
        if let Some(p) = &self.retained {
            return Ok(p.bind(py).clone());
        }
        if let Some(pin) = self.pin() {
            return Ok(PyBytes::new(py, pin.as_slice()));
        }
        if self.payload_len == 0 {
            return Err(PyRuntimeError::new_err(
                "Packet has no payload -- perhaps you're using COPY_META mode?",
            ));
        }
        Err(PyRuntimeError::new_err(if self.compat {
            "Payload data is no longer available. You must call retain() within the \
             user_callback in order to copy the payload if you need to expect it after your \
             callback has returned."
        } else {
            "Payload data is no longer available: the packet has its verdict and its frame went \
             back to the ring (copy it before deciding)"
        }))
    }

    /// Length of the payload as queued.
    fn get_payload_len(&self) -> usize {
        self.payload_len
    }

    /// Length of the payload as queued (cut to the copy range; see `cap_len`).
    #[getter(payload_len)]
    fn payload_len_attr(&self) -> usize {
        self.payload_len
    }

    /// Replace the packet's bytes with the verdict. With `fix_checksums=True` the IP length
    /// fields and the IPv4/TCP/UDP/ICMP checksums are recomputed for the new bytes
    /// (ValueError when that is impossible: fragments, ESP, cut packets).
    #[pyo3(signature = (payload, fix_checksums=false))]
    fn set_payload(&mut self, py: Python<'_>, payload: &[u8], fix_checksums: bool) -> PyResult<()> {
        if payload.len() > 65531 {
            return Err(PyValueError::new_err(format!(
                "a replacement payload of {} bytes does not fit a netlink attribute (65531 at most)",
                payload.len()
            )));
        }
        if fix_checksums {
            let mut v = payload.to_vec();
            zcio::netlink::packet::fix_checksums(&mut v)
                .map_err(|e| PyValueError::new_err(format!("cannot fix checksums: {e}")))?;
            self.given_payload = Some(PyBytes::new(py, &v).unbind());
        } else {
            self.given_payload = Some(PyBytes::new(py, payload).unbind());
        }
        Ok(())
    }

    /// Give the packet a mark with its verdict.
    fn set_mark(&mut self, mark: u32) {
        self.given_mark = Some(mark);
    }

    /// The mark given with set_mark, or the one the packet arrived with.
    fn get_mark(&self) -> u32 {
        self.given_mark.or(self.info.mark).unwrap_or(0)
    }

    /// Copy the payload, so get_payload works after the callback (netfilterqueue).
    fn retain(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.retained.is_none() {
            if let Some(pin) = self.pin() {
                self.retained = Some(PyBytes::new(py, pin.as_slice()).unbind());
            } else if self.payload_len > 0 && self.given_payload.is_none() {
                return Err(PyRuntimeError::new_err(
                    "Payload data is no longer available to retain (call retain() within the callback)",
                ));
            }
        }
        Ok(())
    }

    /// The source hardware address (8 bytes as the kernel gives it, zero-padded) or None
    /// (OUTPUT and POSTROUTING hooks).
    fn get_hw<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.info.hwaddr.map(|(a, _)| PyBytes::new(py, &a))
    }

    /// When the kernel received the packet (Unix time, float), 0.0 when it has no timestamp.
    fn get_timestamp(&self) -> f64 {
        self.info
            .timestamp
            .map_or(0.0, |(s, us)| s as f64 + us as f64 / 1_000_000.0)
    }

    /// The kernel's packet id.
    #[getter]
    fn id(&self) -> u32 {
        self.slot.r.id
    }
    /// The queue it came from.
    #[getter]
    fn queue(&self) -> u16 {
        self.slot.r.queue
    }
    /// Netfilter hook (0 PREROUTING … 4 POSTROUTING).
    #[getter]
    fn hook(&self) -> u8 {
        self.info.hook
    }
    /// Link-layer protocol (EtherType), host order.
    #[getter]
    fn hw_protocol(&self) -> u16 {
        self.info.hw_protocol
    }
    /// Address family of the hook (2 IPv4, 10 IPv6).
    #[getter]
    fn family(&self) -> u8 {
        self.info.family
    }
    /// The mark the packet arrived with (0 if none).
    #[getter(mark)]
    fn arrival_mark(&self) -> u32 {
        self.info.mark.unwrap_or(0)
    }
    /// Input interface index (0 if none).
    #[getter]
    fn indev(&self) -> u32 {
        self.info.indev.unwrap_or(0)
    }
    /// Output interface index (0 if none).
    #[getter]
    fn outdev(&self) -> u32 {
        self.info.outdev.unwrap_or(0)
    }
    /// Bridge port it arrived on (0 if none).
    #[getter]
    fn physindev(&self) -> u32 {
        self.info.physindev.unwrap_or(0)
    }
    /// Bridge port it leaves by (0 if none).
    #[getter]
    fn physoutdev(&self) -> u32 {
        self.info.physoutdev.unwrap_or(0)
    }
    /// Owner uid of the local socket (queues bound with uid_gid=True), else None.
    #[getter]
    fn uid(&self) -> Option<u32> {
        self.info.uid
    }
    /// Owner gid of the local socket (queues bound with uid_gid=True), else None.
    #[getter]
    fn gid(&self) -> Option<u32> {
        self.info.gid
    }
    /// The packet's full length when the payload was cut to the copy range, else None.
    #[getter]
    fn cap_len(&self) -> Option<u32> {
        self.info.cap_len
    }
    /// Whether the kernel queued a whole GSO burst (queues bound with gso=True).
    #[getter]
    fn gso(&self) -> bool {
        self.info.skb_info.is_some_and(|i| i & SKB_GSO != 0)
    }

    fn __str__(&self, py: Python<'_>) -> PyResult<String> {
        let first = if let Some(p) = &self.given_payload {
            p.as_bytes(py).get(9).copied()
        } else if let Some(p) = &self.retained {
            p.as_bytes(py).get(9).copied()
        } else {
            self.pin()
                .map(|pin| pin.as_slice().get(9).copied().unwrap_or(0))
        };
        let Some(proto) = first else {
            return Ok(format!(
                "{} byte packet, contents unretained",
                self.payload_len
            ));
        };
        let names = py.import("zcio._protocols")?.getattr("PROTOCOLS")?;
        let name: String = names
            .call_method1("get", (proto, "Unknown protocol"))?
            .extract()?;
        Ok(format!("{name} packet, {} bytes", self.payload_len))
    }

    fn __repr__(&self) -> String {
        format!(
            "<zcio.Packet queue={} id={} hook={} len={}>",
            self.slot.r.queue, self.slot.r.id, self.info.hook, self.payload_len
        )
    }
}

/// The packets of one receive, in id order. Its undecided packets get the queue's default
/// verdict when the next batch is fetched, unless held (`Packet.hold()`).
#[pyclass(module = "zcio._native", sequence)]
pub struct Batch {
    packets: Vec<Py<Packet>>,
    queue: Py<NfQueue>,
    owner: ThreadId,
}

impl Batch {
    fn decide_all(&self, py: Python<'_>, v: Verdict) -> PyResult<usize> {
        let mut n = 0;
        for p in &self.packets {
            let mut p = p.borrow_mut(py);
            let skip = {
                let st = lock(&p.slot.st);
                st.applied || st.decision.is_some() || st.held
            };
            if !skip {
                p.decide(py, v)?;
                n += 1;
            }
        }
        // The batch is decided: send its verdicts now (one datagram, a VERDICT_BATCH for the
        // run of equal verdicts) rather than with the next fetch, which may be a long await
        // away. Verdicts given one by one without a batch-wide call go with the next fetch.
        if std::thread::current().id() == self.owner {
            if let Ok(mut q) = self.queue.bind(py).try_borrow_mut() {
                if q.q.is_some() {
                    q.flush(py)?;
                }
            }
        }
        Ok(n)
    }
}

#[pymethods]
impl Batch {
    fn __len__(&self) -> usize {
        self.packets.len()
    }

    fn __bool__(&self) -> bool {
        !self.packets.is_empty()
    }

    fn __getitem__(&self, py: Python<'_>, i: isize) -> PyResult<Py<Packet>> {
        let n = self.packets.len() as isize;
        let j = if i < 0 { i + n } else { i };
        if j < 0 || j >= n {
            return Err(PyIndexError::new_err("batch index out of range"));
        }
        Ok(self.packets[j as usize].clone_ref(py))
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let l = PyList::new(py, self.packets.iter().map(|p| p.clone_ref(py)))?;
        Ok(l.into_any().try_iter()?.into_any())
    }

    /// The packets, as a list.
    #[getter]
    fn packets<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.packets.iter().map(|p| p.clone_ref(py)))
    }

    /// Accept every packet not yet decided nor held; returns how many.
    fn accept(&self, py: Python<'_>) -> PyResult<usize> {
        self.decide_all(py, Verdict::Accept)
    }

    /// Drop every packet not yet decided nor held; returns how many.
    fn drop(&self, py: Python<'_>) -> PyResult<usize> {
        self.decide_all(py, Verdict::Drop)
    }

    /// Give every packet not yet decided nor held `verdict`; returns how many.
    fn verdict(&self, py: Python<'_>, verdict: u32) -> PyResult<usize> {
        let v = verdict_of(verdict)?;
        self.decide_all(py, v)
    }

    fn __repr__(&self) -> String {
        format!("<zcio.Batch of {} packets>", self.packets.len())
    }
}

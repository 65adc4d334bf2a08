//! Zero-copy payload views: a read-only `memoryview` over a packet's bytes in its frame.
//!
//! The view is made from a tiny exporter object (`zcio._native.FrameView`) that owns the
//! packet's [`FramePin`]. CPython's memoryview keeps its exporter alive as long as any view of
//! it exists — the one we hand out *and* every slice or `memoryview(view)` derived from it, which
//! share its managed buffer. So:
//!
//! - at the packet's verdict the view we handed out is `release()`d: touching it afterwards
//!   raises `ValueError` ("operation forbidden on released memoryview object");
//! - a slice the user took before the verdict keeps the exporter, hence the pin, hence the
//!   frame: the ring does not reuse that frame until the slice is gone, so the slice still
//!   shows the packet's own bytes, never another packet's;
//! - the pin also keeps the ring's memory mapped, so views survive the queue itself.
//!
//! Why a hand-made type: PyO3 offers `__getbuffer__` only where the buffer protocol is in the
//! limited API (CPython 3.11+), and this module is built for the 3.9 stable ABI (one wheel for
//! 3.9+). The two buffer slots (`Py_bf_getbuffer` = 1) have been accepted by
//! `PyType_FromSpec` since 3.2 and `Py_buffer`'s layout has not changed since 3.3; 3.11 made
//! both part of the stable ABI as they were. This file is the crate's only `unsafe` besides
//! handing thread-bound objects to the GIL-free wait (`queue.rs`, `OnThisThread`).
#![allow(unsafe_code)]

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;
use zcio::netlink::FramePin;

/// `Py_buffer` (Include/pybuffer.h), unchanged since CPython 3.3; part of the stable ABI since
/// 3.11. Declared here because PyO3 exposes it only when built for 3.11+.
#[repr(C)]
struct PyBufferRaw {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

// The layout every CPython 3.x on a 64-bit target uses (11 pointer-sized words, the two ints
// sharing one).
const _: () = assert!(std::mem::size_of::<PyBufferRaw>() == 80);
const _: () = assert!(std::mem::offset_of!(PyBufferRaw, readonly) == 32);
const _: () = assert!(std::mem::offset_of!(PyBufferRaw, format) == 40);

extern "C" {
    /// In every CPython 3 (stable ABI since 3.11): fills a simple contiguous byte buffer view,
    /// taking a reference to `o`; refuses a writable request for read-only memory with
    /// `BufferError`.
    fn PyBuffer_FillInfo(
        view: *mut PyBufferRaw,
        o: *mut ffi::PyObject,
        buf: *mut c_void,
        len: ffi::Py_ssize_t,
        readonly: c_int,
        flags: c_int,
    ) -> c_int;
}

/// The exporter's instance layout.
#[repr(C)]
struct FrameView {
    ob_base: ffi::PyObject,
    /// `Box<Arc<FramePin>>` from [`view_of`]; null in an instance not made by it.
    pin: *mut Arc<FramePin>,
}

/// `bf_getbuffer`: a read-only view of the pinned bytes.
unsafe extern "C" fn frame_view_getbuffer(
    obj: *mut ffi::PyObject,
    view: *mut PyBufferRaw,
    flags: c_int,
) -> c_int {
    // SAFETY: CPython calls this slot with the GIL held, `obj` an instance of our type (so a
    // `FrameView`) and `view` a writable `Py_buffer`.
    unsafe {
        let pin = (*obj.cast::<FrameView>()).pin;
        if pin.is_null() {
            ffi::PyErr_SetString(
                ffi::PyExc_BufferError,
                c"zcio FrameView: no packet bytes (made outside zcio)".as_ptr(),
            );
            (*view).obj = std::ptr::null_mut();
            return -1;
        }
        let pin: &FramePin = &*pin;
        // Read-only: nothing may write a frame the kernel filled (the pin's contract).
        PyBuffer_FillInfo(
            view,
            obj,
            pin.as_ptr().cast_mut().cast(),
            pin.len() as ffi::Py_ssize_t,
            1,
            flags,
        )
    }
}

/// `tp_dealloc`: drops the pin (the frame may go back to the ring), frees the object.
unsafe extern "C" fn frame_view_dealloc(obj: *mut ffi::PyObject) {
    // SAFETY: called once by CPython when the last reference goes, GIL held; `pin` is null or
    // the box `view_of` stored; the type is a heap type, so its instances own a reference to
    // it, which is dropped after the memory is freed with the type's own `tp_free`.
    unsafe {
        let me = obj.cast::<FrameView>();
        let pin = (*me).pin;
        if !pin.is_null() {
            (*me).pin = std::ptr::null_mut();
            drop(Box::from_raw(pin));
        }
        let tp = ffi::Py_TYPE(obj);
        let free: ffi::freefunc = std::mem::transmute(ffi::PyType_GetSlot(tp, ffi::Py_tp_free));
        free(obj.cast());
        ffi::Py_DECREF(tp.cast());
    }
}

static FRAME_VIEW_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn frame_view_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    FRAME_VIEW_TYPE
        .get_or_try_init(py, || {
            // Slots and spec must outlive the type only during `PyType_FromSpec` (CPython
            // copies what it keeps), but statics keep it simple.
            static mut SLOTS: [ffi::PyType_Slot; 3] = [
                ffi::PyType_Slot {
                    slot: ffi::Py_bf_getbuffer,
                    pfunc: frame_view_getbuffer as *mut c_void,
                },
                ffi::PyType_Slot {
                    slot: ffi::Py_tp_dealloc,
                    pfunc: frame_view_dealloc as *mut c_void,
                },
                ffi::PyType_Slot {
                    slot: 0,
                    pfunc: std::ptr::null_mut(),
                },
            ];
            static mut SPEC: ffi::PyType_Spec = ffi::PyType_Spec {
                name: c"zcio._native.FrameView".as_ptr(),
                basicsize: std::mem::size_of::<FrameView>() as c_int,
                itemsize: 0,
                flags: ffi::Py_TPFLAGS_DEFAULT as _,
                slots: std::ptr::null_mut(),
            };
            // SAFETY: runs once, under the GIL (`PyOnceLock`), so nothing else touches the
            // statics; the slot functions match the slot signatures.
            unsafe {
                let spec = &raw mut SPEC;
                (*spec).slots = (&raw mut SLOTS).cast();
                let tp = ffi::PyType_FromSpec(spec);
                Bound::from_owned_ptr_or_err(py, tp)
                    .map(|t| t.cast_into_unchecked::<PyType>().unbind())
            }
        })
        .map(|t| t.bind(py))
}

/// A read-only `memoryview` of `pin`'s bytes that keeps `pin` (and so the frame) as long as it
/// or any view derived from it lives.
pub(crate) fn view_of(py: Python<'_>, pin: Arc<FramePin>) -> PyResult<Bound<'_, PyAny>> {
    let tp = frame_view_type(py)?;
    // SAFETY: GIL held; `PyType_GenericAlloc` returns a zeroed instance of our heap type (or
    // null with an exception set), whose `pin` field we then own; `PyMemoryView_FromObject`
    // takes its own reference to the exporter through `bf_getbuffer`, so ours is dropped.
    unsafe {
        let obj = ffi::PyType_GenericAlloc(tp.as_ptr().cast(), 0);
        let obj = Bound::from_owned_ptr_or_err(py, obj)?;
        (*obj.as_ptr().cast::<FrameView>()).pin = Box::into_raw(Box::new(pin));
        let mv = ffi::PyMemoryView_FromObject(obj.as_ptr());
        Bound::from_owned_ptr_or_err(py, mv)
    }
}

//! The op's per-call path in one native call: `Allreduce.all_reduce` and `should_run` of every
//! op built by python/artune/allreduce.py are this object's methods, so an eager call runs no
//! Python frame. It reads each tensor's fields once, torch's current stream (its raw getter, a C
//! function) and whether the driver is capturing it, asks the routes and launches. The rare
//! cases (a closed or failed op, a broken group, an output the kernels cannot write, a launch
//! that fails) go to the op's Python methods, which hold the rules for them, so the two forms
//! of a call answer alike.
//!
//! Not a torch custom op: registering a kernel with torch's dispatcher takes C++ built against
//! the installed libtorch (or its versioned C shim), which the wheel, built once for every
//! torch an engine pins, cannot carry; and an eager call of `torch.ops.*` from Python runs the
//! op packet's Python `__call__` and a boxed dispatch before the kernel, more than this call.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::{intern, PyTraverseError};

use super::allreduce::{code, AllreduceKernels};
use super::ArtuneError;
use crate::allreduce::Backend;

/// What the calls run on: artune's kernels, called in Rust, or an object with their surface
/// (the tests' device layer without a GPU), called through Python.
enum Layer {
    Kernels(Py<AllreduceKernels>),
    Python(Py<PyAny>),
}

impl Layer {
    fn faulted(&self, py: Python<'_>) -> PyResult<bool> {
        match self {
            Layer::Kernels(k) => Ok(k.bind(py).try_borrow()?.faulted()),
            Layer::Python(o) => o.bind(py).call_method0(intern!(py, "faulted"))?.is_truthy(),
        }
    }

    fn missed(&self, py: Python<'_>) -> PyResult<bool> {
        match self {
            Layer::Kernels(k) => Ok(k.bind(py).try_borrow()?.missed_registration()),
            Layer::Python(o) => o
                .bind(py)
                .call_method0(intern!(py, "missed_registration"))?
                .is_truthy(),
        }
    }

    /// Whether the call is being captured: the driver asked about `stream` (torch's current
    /// stream, where it was read) on artune's kernels, else torch's `capturing` hook.
    fn capturing(&self, py: Python<'_>, h: &Hooks, stream: Option<u64>) -> PyResult<bool> {
        if let (Layer::Kernels(_), Some(s)) = (self, stream) {
            // SAFETY: `s` is torch's current stream, just read, which outlives this call.
            if let Some(c) = unsafe { crate::fabric::cuda::op::capturing(s) } {
                return Ok(c);
            }
        }
        h.capturing.bind(py).call0()?.is_truthy()
    }

    fn route(&self, py: Python<'_>, nbytes: u64, graph: bool) -> PyResult<i32> {
        match self {
            Layer::Kernels(k) => Ok(k.bind(py).try_borrow()?.route(nbytes, graph)),
            Layer::Python(o) => o
                .bind(py)
                .call_method1(intern!(py, "route"), (nbytes, graph))?
                .extract(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        py: Python<'_>,
        code: i32,
        input: u64,
        output: u64,
        nbytes: u64,
        stream: u64,
        registered: bool,
    ) -> PyResult<()> {
        match self {
            Layer::Kernels(k) => k
                .bind(py)
                .try_borrow()?
                .launch(code, input, output, nbytes, stream, 1, registered),
            Layer::Python(o) => {
                // As the Python form passes it: the keyword only for the registered form.
                let kw = PyDict::new(py);
                if registered {
                    kw.set_item(intern!(py, "registered"), true)?;
                }
                let args = (code, input, output, nbytes, stream);
                o.bind(py)
                    .call_method(intern!(py, "launch"), args, Some(&kw))
                    .map(drop)
            }
        }
    }
}

/// The op's Python side the native path reads or hands over to: the op's methods as plain
/// functions of the op, which is held weakly (the op holds this object: no cycle, so an op
/// an engine drops goes at once, as a Python object does).
struct Hooks {
    /// A weak reference to the op.
    owner: Py<PyAny>,
    /// The Python form of `all_reduce` (`Allreduce.all_reduce`).
    slow: Py<PyAny>,
    /// `_launch_failed(op, error, inp, out, fallback)`: the op off, the call to the fallback.
    failed: Py<PyAny>,
    /// `_said_missed(op)`: the line on a replay that found its calls unregistered.
    missed: Py<PyAny>,
    /// `_faulted(op)`: the line on a broken group, and the op's mark of it.
    fault: Py<PyAny>,
    empty_like: Py<PyAny>,
    /// torch's current stream: called with `ordinal` where that is set.
    stream: Py<PyAny>,
    capturing: Py<PyAny>,
    dtype: Py<PyAny>,
    device: Py<PyAny>,
}

/// One op's calls, natively (module docs). The flags are the op's state, which its Python
/// methods read and set through the properties below.
#[pyclass(module = "artune")]
pub struct EagerPath {
    layer: Option<Layer>,
    hooks: Option<Hooks>,
    ordinal: Option<i64>,
    register_graphs: bool,
    off: AtomicBool,
    broken: AtomicBool,
    in_capture: AtomicBool,
    registers: AtomicBool,
}

impl Hooks {
    /// The op, or an error where it is gone (a call through this object alone).
    fn op<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let op = self.owner.bind(py).call0()?;
        if op.is_none() {
            return Err(ArtuneError::new_err("the op is gone"));
        }
        Ok(op)
    }
}

impl EagerPath {
    fn stream(&self, py: Python<'_>, h: &Hooks) -> PyResult<u64> {
        let s = h.stream.bind(py);
        match self.ordinal {
            Some(i) => s.call1((i,)),
            None => s.call0(),
        }?
        .extract()
    }
}

#[pymethods]
impl EagerPath {
    /// `native`: the op's device layer (`AllreduceKernels`, or an object with its methods);
    /// `stream(ordinal)` (or `stream()` without `ordinal`) torch's current raw stream;
    /// `capturing()` whether torch captures; `owner` a weak reference to the op; the rest as
    /// `Hooks` says.
    #[new]
    #[pyo3(signature = (native, *, owner, dtype, device, stream, ordinal, capturing, empty_like,
                        slow, failed, missed, fault, register_graphs))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        native: &Bound<'_, PyAny>,
        owner: Py<PyAny>,
        dtype: Py<PyAny>,
        device: Py<PyAny>,
        stream: Py<PyAny>,
        ordinal: Option<i64>,
        capturing: Py<PyAny>,
        empty_like: Py<PyAny>,
        slow: Py<PyAny>,
        failed: Py<PyAny>,
        missed: Py<PyAny>,
        fault: Py<PyAny>,
        register_graphs: bool,
    ) -> EagerPath {
        let layer = match native.cast::<AllreduceKernels>() {
            Ok(k) => Layer::Kernels(k.clone().unbind()),
            Err(_) => Layer::Python(native.clone().unbind()),
        };
        EagerPath {
            layer: Some(layer),
            hooks: Some(Hooks {
                owner,
                slow,
                failed,
                missed,
                fault,
                empty_like,
                stream,
                capturing,
                dtype,
                device,
            }),
            ordinal,
            register_graphs,
            off: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            in_capture: AtomicBool::new(false),
            registers: AtomicBool::new(register_graphs),
        }
    }

    /// Whether the calls run natively on artune's kernels (not a Python device layer).
    #[getter]
    fn native(&self) -> bool {
        matches!(self.layer, Some(Layer::Kernels(_)))
    }

    /// The op is off (a failure, or closed): every call takes the engine's path.
    #[getter]
    fn off(&self) -> bool {
        self.off.load(Relaxed)
    }
    #[setter]
    fn set_off(&self, v: bool) {
        self.off.store(v, Relaxed)
    }
    /// The group is broken: every call answers NaN.
    #[getter]
    fn broken(&self) -> bool {
        self.broken.load(Relaxed)
    }
    #[setter]
    fn set_broken(&self, v: bool) {
        self.broken.store(v, Relaxed)
    }
    /// Inside `Allreduce.capture()`: captured calls take the registered form.
    #[getter]
    fn in_capture(&self) -> bool {
        self.in_capture.load(Relaxed)
    }
    #[setter]
    fn set_in_capture(&self, v: bool) {
        self.in_capture.store(v, Relaxed)
    }
    /// Whether any call may have taken the registered form (the line on a missed one).
    #[getter]
    fn registers(&self) -> bool {
        self.registers.load(Relaxed)
    }
    #[setter]
    fn set_registers(&self, v: bool) {
        self.registers.store(v, Relaxed)
    }

    /// `Allreduce.should_run`, natively: the same reads in the same order (the capture status
    /// through torch's stream, as `all_reduce` reads it).
    fn should_run(&self, py: Python<'_>, inp: &Bound<'_, PyAny>) -> PyResult<bool> {
        let (Some(layer), Some(h)) = (&self.layer, &self.hooks) else {
            return Ok(false);
        };
        if !self.broken.load(Relaxed) && layer.faulted(py)? {
            h.fault.call1(py, (h.op(py)?,))?;
        }
        if self.registers.load(Relaxed) && layer.missed(py)? {
            h.missed.call1(py, (h.op(py)?,))?;
        }
        if self.off.load(Relaxed) || !inp.getattr(intern!(py, "dtype"))?.is(h.dtype.bind(py)) {
            return Ok(false);
        }
        if !inp.getattr(intern!(py, "device"))?.eq(h.device.bind(py))? {
            return Ok(false);
        }
        if !inp
            .call_method0(intern!(py, "is_contiguous"))?
            .is_truthy()?
        {
            return Ok(false);
        }
        let ptr: u64 = inp.call_method0(intern!(py, "data_ptr"))?.extract()?;
        if !ptr.is_multiple_of(16) {
            return Ok(false);
        }
        let nbytes: u64 = inp.getattr(intern!(py, "nbytes"))?.extract()?;
        let stream = self.stream(py, h).ok();
        let graph = layer.capturing(py, h, stream)?;
        Ok(layer.route(py, nbytes, graph)? >= 0)
    }

    /// `Allreduce.all_reduce`, natively (its docs there). An output passed in is checked as
    /// the Python form checks it; one allocated here (`empty_like` of a contiguous input) fits
    /// by construction.
    #[pyo3(signature = (inp, out = None, backend = None, fallback = None))]
    fn all_reduce<'py>(
        &self,
        py: Python<'py>,
        inp: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        backend: Option<Bound<'py, PyAny>>,
        fallback: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let Some(h) = &self.hooks else {
            return Err(ArtuneError::new_err("the op is closed"));
        };
        let slow = |out: Option<Bound<'py, PyAny>>| {
            h.slow
                .bind(py)
                .call1((h.op(py)?, &inp, out, &backend, &fallback))
        };
        let layer = match &self.layer {
            Some(l) if !self.off.load(Relaxed) && !self.broken.load(Relaxed) => l,
            _ => return slow(out),
        };
        if self.registers.load(Relaxed) && layer.missed(py)? {
            h.missed.call1(py, (h.op(py)?,))?;
        }
        if layer.faulted(py)? {
            return slow(out);
        }
        let nbytes: u64 = inp.getattr(intern!(py, "nbytes"))?.extract()?;
        let input: u64 = inp.call_method0(intern!(py, "data_ptr"))?.extract()?;
        let (out, output) = match out {
            Some(o) => match fits(py, &inp, input, nbytes, &o)? {
                Some(ptr) => (o, ptr),
                None => return slow(Some(o)),
            },
            None => {
                let o = h.empty_like.bind(py).call1((&inp,))?;
                let ptr: u64 = o.call_method0(intern!(py, "data_ptr"))?.extract()?;
                (o, ptr)
            }
        };
        // torch's stream first: its capture status is then one driver call, not a Python one.
        let stream = self.stream(py, h);
        let graph = layer.capturing(py, h, stream.as_ref().ok().copied())?;
        let code = match &backend {
            None => layer.route(py, nbytes, graph)?,
            Some(b) => b
                .extract::<String>()
                .ok()
                .and_then(|s| Backend::from_id(&s))
                .map_or(-1, code),
        };
        let registered = (self.register_graphs || self.in_capture.load(Relaxed)) && graph;
        let done = if code < 0 {
            Err(ArtuneError::new_err(format!(
                "{nbytes} bytes is not routed to artune's kernels"
            )))
        } else {
            stream.and_then(|stream| {
                layer.launch(py, code, input, output, nbytes, stream, registered)
            })
        };
        match done {
            Ok(()) => Ok(out),
            Err(e) => h
                .failed
                .bind(py)
                .call1((h.op(py)?, e.into_value(py), &inp, &out, &fallback)),
        }
    }

    /// Drops the device layer (the op's `close()`): every later call takes the Python form.
    fn close(&mut self) {
        self.off.store(true, Relaxed);
        self.layer = None;
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        match &self.layer {
            Some(Layer::Kernels(k)) => visit.call(k)?,
            Some(Layer::Python(o)) => visit.call(o)?,
            None => {}
        }
        if let Some(h) = &self.hooks {
            for o in [
                &h.owner,
                &h.slow,
                &h.failed,
                &h.missed,
                &h.fault,
                &h.empty_like,
                &h.stream,
                &h.capturing,
                &h.dtype,
                &h.device,
            ] {
                visit.call(o)?;
            }
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.layer = None;
        self.hooks = None;
    }
}

/// `out`'s address where the kernels can write it for `inp` (`input`, `nbytes` its fields): a
/// distinct, contiguous, 16-byte aligned tensor of the input's dtype, size and device; None
/// for anything else (an in-place call), which the Python form serves (it gives the kernels a
/// tensor and copies back).
fn fits(
    py: Python<'_>,
    inp: &Bound<'_, PyAny>,
    input: u64,
    nbytes: u64,
    out: &Bound<'_, PyAny>,
) -> PyResult<Option<u64>> {
    let dtype = intern!(py, "dtype");
    if !out.getattr(dtype)?.is(inp.getattr(dtype)?) {
        return Ok(None);
    }
    if out.getattr(intern!(py, "nbytes"))?.extract::<u64>()? != nbytes {
        return Ok(None);
    }
    if !out
        .call_method0(intern!(py, "is_contiguous"))?
        .is_truthy()?
    {
        return Ok(None);
    }
    let device = intern!(py, "device");
    if !out.getattr(device)?.eq(inp.getattr(device)?)? {
        return Ok(None);
    }
    let ptr: u64 = out.call_method0(intern!(py, "data_ptr"))?.extract()?;
    Ok((ptr.is_multiple_of(16) && ptr != input).then_some(ptr))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<EagerPath>()
}

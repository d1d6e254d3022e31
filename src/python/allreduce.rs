//! The native half of `artune.allreduce`: which messages a profile routes to artune's kernels
//! ([`Routes`]) and the kernels themselves in the engine's process ([`AllreduceKernels`], over
//! [`crate::fabric::cuda::op::Op`]). python/artune/allreduce.py holds the torch side: the
//! process group, the agreement of every rank, the tensors and the stream.

use std::sync::Mutex;

use pyo3::prelude::*;

use super::{mode, tp_size, unsigned, ArtuneError, BadInputError, HardwareError, Profile};
use crate::allreduce::{Backend, Mode};
use crate::fabric::cuda::op::{self, Op, OpError, RankBuffers};
use crate::fabric::cuda::registry::Published;
use crate::profile::kernels;
use crate::profile::routes;

/// (backend, bytes per GPU, measured, largest message they serve, bytes the chosen sizes need)
type ProfileMemory = (&'static str, u64, bool, Option<u64>, Option<u64>);

fn backend(id: &str) -> PyResult<Backend> {
    // What the op runs: the SM kernels, and the copy-engine backends where switched on.
    let runs = |b: &Backend| routes::KernelSetting::Artune.takes(*b);
    Backend::from_id(id).filter(runs).ok_or_else(|| {
        let kernels: Vec<&str> = Backend::ALL
            .iter()
            .filter(|b| runs(b))
            .map(|b| b.id())
            .collect();
        BadInputError::new_err(format!(
            "`{id}` is not one of artune's kernels; pass one of {}",
            kernels.join(", ")
        ))
    })
}

/// The C ABI code of a backend (its place in `artune.backends()`).
pub(super) fn code(b: Backend) -> i32 {
    Backend::ALL
        .iter()
        .position(|&x| x == b)
        .map_or(-1, |i| i as i32)
}

fn op_err(e: OpError) -> PyErr {
    match e {
        OpError::Device(_) => HardwareError::new_err(e.to_string()),
        _ => ArtuneError::new_err(e.to_string()),
    }
}

/// The messages of one TP size that artune's kernels serve, and the buffers that takes.
#[pyclass(module = "artune", frozen)]
#[derive(Clone)]
pub struct Routes {
    routes: routes::Routes,
}

#[pymethods]
impl Routes {
    /// The profile's custom choices at `tp` (both modes); `only` limits them to those
    /// backends. Raises ArtuneError, with the reason, where the profile routes nothing.
    #[staticmethod]
    #[pyo3(signature = (profile, tp, only = None))]
    fn from_profile(
        profile: &Profile,
        tp: &Bound<'_, PyAny>,
        only: Option<Vec<String>>,
    ) -> PyResult<Routes> {
        let only = only
            .map(|v| v.iter().map(|s| backend(s)).collect::<PyResult<Vec<_>>>())
            .transpose()?;
        routes::Routes::from_profile(&profile.profile, tp_size(tp)?, only.as_deref())
            .map(|routes| Routes { routes })
            .map_err(|e| ArtuneError::new_err(e.to_string()))
    }

    /// `backend` at every size up to `max_bytes`, whatever the profile chose (proofs and
    /// benchmarks); without `max_bytes`, buffers sized as the tune sized them.
    #[staticmethod]
    #[pyo3(signature = (profile, tp, backend, max_bytes = None))]
    fn forced(
        profile: &Profile,
        tp: &Bound<'_, PyAny>,
        backend: &str,
        max_bytes: Option<i64>,
    ) -> PyResult<Routes> {
        let max = max_bytes.map(|m| unsigned("max_bytes", m)).transpose()?;
        Ok(Routes {
            routes: routes::Routes::forced(
                &profile.profile,
                tp_size(tp)?,
                self::backend(backend)?,
                max,
            ),
        })
    }

    #[getter]
    fn tp(&self) -> usize {
        self.routes.tp
    }

    /// The element type the profile measured ("bf16", "fp16", "fp32").
    #[getter]
    fn dtype(&self) -> &'static str {
        self.routes.dtype.id()
    }

    /// Each backend routed and the largest message it serves, in bytes.
    #[getter]
    fn buffers(&self) -> Vec<(&'static str, u64)> {
        self.routes
            .buffers
            .iter()
            .map(|(b, m)| (b.id(), *m))
            .collect()
    }

    /// What the profile says each routed backend's buffers cost per GPU: (backend, bytes,
    /// measured, largest message those bytes serve, bytes the profile's chosen sizes need).
    #[getter]
    fn profile_memory(&self) -> Vec<ProfileMemory> {
        self.routes
            .profile_memory
            .iter()
            .map(|(b, m)| {
                (
                    b.id(),
                    m.bytes_per_gpu,
                    m.measured,
                    m.serves_up_to_bytes,
                    m.required_bytes_per_gpu,
                )
            })
            .collect()
    }

    /// The backend artune's kernels run for `nbytes` in `mode`, or None.
    #[pyo3(signature = (nbytes, mode = "graph"))]
    fn backend(&self, nbytes: i64, mode: &str) -> PyResult<Option<&'static str>> {
        let bytes = unsigned("nbytes", nbytes)?;
        Ok(self
            .routes
            .backend(self::mode(mode)?, bytes)
            .map(Backend::id))
    }

    /// One line for the engine's log: what each mode sends to artune's kernels.
    fn describe(&self) -> String {
        self.routes.describe()
    }
}

/// artune's kernels on one GPU of this process, for one rank of a group.
#[pyclass(module = "artune")]
pub struct AllreduceKernels {
    /// Locked per call (uncontended: an engine calls from one thread at a time), so an engine
    /// may call from whichever thread runs its model.
    op: Mutex<Op>,
    routes: Option<routes::Routes>,
}

impl AllreduceKernels {
    fn op(&self) -> std::sync::MutexGuard<'_, Op> {
        self.op.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl AllreduceKernels {
    /// Opens GPU `ordinal` (torch's device index) in its primary context, loads the kernels and
    /// checks they are the ones `profile` timed. Raises ArtuneError, one sentence, when the
    /// profile records no kernels (older or simulated: checked before the GPU is touched),
    /// when they differ, or when the calling thread runs another context; HardwareError when
    /// there is no GPU or driver.
    #[staticmethod]
    fn open(profile: &Profile, ordinal: i64) -> PyResult<AllreduceKernels> {
        let ordinal = unsigned("ordinal", ordinal)? as usize;
        let recorded = &profile.profile.kernels;
        if recorded.is_empty() {
            return Err(ArtuneError::new_err(
                kernels::KernelMismatch::NotRecorded.to_string(),
            ));
        }
        let op = Op::open(ordinal).map_err(op_err)?;
        let loaded: kernels::KernelImages = op.images().map_err(op_err)?.into();
        kernels::check(recorded, &loaded).map_err(|e| ArtuneError::new_err(e.to_string()))?;
        Ok(AllreduceKernels {
            op: Mutex::new(op),
            routes: None,
        })
    }

    /// The GPU's PCI bus id: ranks that share one are counted by the caller.
    #[getter]
    fn bus_id(&self) -> String {
        self.op().facts().bus_id.clone()
    }

    /// The loaded kernels as the profile records them (JSON).
    fn images(&self) -> PyResult<String> {
        let k: kernels::KernelImages = self.op().images().map_err(op_err)?.into();
        Ok(serde_json::to_string(&k).unwrap_or_default())
    }

    /// Allocates this rank's buffers for `routes` and returns the handles to publish (JSON).
    /// `ranks_on_gpu`: ranks of the group on this rank's GPU, the same number on every rank
    /// (`ranks_per_gpu` of every rank's bus id).
    fn allocate(
        &mut self,
        rank: i64,
        world: i64,
        ranks_on_gpu: i64,
        routes: &Routes,
    ) -> PyResult<String> {
        let (rank, world) = (
            unsigned("rank", rank)? as usize,
            unsigned("world", world)? as usize,
        );
        let on_gpu = unsigned("ranks_on_gpu", ranks_on_gpu)?.clamp(1, 64) as u32;
        let r = &routes.routes;
        let mine = self
            .op()
            .allocate(
                rank,
                world,
                on_gpu,
                r.dtype,
                &r.buffers,
                r.islands.as_ref().map(|(g, i)| (&g[..], i)),
            )
            .map_err(op_err)?;
        self.routes = Some(r.clone());
        Ok(serde_json::to_string(&mine).unwrap_or_default())
    }

    /// Opens every rank's buffers; `handles[r]` is what rank r's `allocate` returned.
    fn connect(&mut self, handles: Vec<String>) -> PyResult<()> {
        let all = handles
            .iter()
            .enumerate()
            .map(|(r, h)| {
                serde_json::from_str::<RankBuffers>(h).map_err(|e| {
                    ArtuneError::new_err(format!(
                        "rank {r}'s handles are not artune's ({e}); every rank of the group must run this artune"
                    ))
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        self.op().connect(&all).map_err(op_err)
    }

    /// Per backend: (backend, largest message, device bytes measured, bytes allocated).
    fn memory(&self) -> Vec<(&'static str, u64, u64, u64)> {
        self.op()
            .memory()
            .into_iter()
            .map(|(b, m, x, a)| (b.id(), m, x, a))
            .collect()
    }

    /// The code (`artune.backends()` index) of the backend routed for `nbytes` in graph mode
    /// (`graph`) or eager mode, or -1: the engine's own path.
    pub(super) fn route(&self, nbytes: u64, graph: bool) -> i32 {
        let m = if graph { Mode::Graph } else { Mode::Eager };
        self.routes
            .as_ref()
            .and_then(|r| r.backend(m, nbytes))
            .map_or(-1, code)
    }

    /// Queues one allreduce of `nbytes` from device address `input` to `output` on the CUDA
    /// stream `stream` (torch's `cuda_stream`), with the backend of code `backend`; `repeat`
    /// queues it that many times (the benchmark's raw launch).
    ///
    /// Like ctypes, this trusts its caller: `input` and `output` must be contiguous, distinct
    /// tensors of `nbytes` bytes of the profile's dtype on this GPU, kept alive until the work
    /// has run, and `stream` a live stream of this GPU. allreduce.py checks all of it.
    /// `registered`: the call is being captured into a graph the caller will register
    /// (`register_graph_inputs`): the registered form, where the backend has one.
    #[pyo3(signature = (backend, input, output, nbytes, stream, repeat = 1, registered = false))]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch(
        &self,
        backend: i32,
        input: u64,
        output: u64,
        nbytes: u64,
        stream: u64,
        repeat: u32,
        registered: bool,
    ) -> PyResult<()> {
        let b = usize::try_from(backend)
            .ok()
            .and_then(|i| Backend::ALL.get(i).copied())
            .ok_or_else(|| BadInputError::new_err(format!("{backend} is not a backend code")))?;
        let dtype = self
            .routes
            .as_ref()
            .map(|r| r.dtype)
            .ok_or_else(|| ArtuneError::new_err("allocate before launching"))?;
        if !nbytes.is_multiple_of(dtype.size()) {
            return Err(BadInputError::new_err(format!(
                "{nbytes} bytes is not a whole number of {} elements",
                dtype.id()
            )));
        }
        // SAFETY: the Python caller's contract above (allreduce.py passes torch tensors it
        // checked and keeps alive, and torch's current stream on this device).
        unsafe {
            self.op().launch(
                op::Call {
                    backend: b,
                    input,
                    output,
                    elems: nbytes / dtype.size(),
                },
                stream,
                repeat.max(1),
                registered,
            )
        }
        .map_err(op_err)
    }

    /// The handles of the inputs captured since the last registration (JSON), for the group's
    /// exchange.
    fn publish_graph_inputs(&self) -> PyResult<String> {
        let p = self.op().publish_graph_inputs().map_err(op_err)?;
        Ok(serde_json::to_string(&p).unwrap_or_default())
    }

    /// Maps every rank's captured inputs (`published[r]` is rank r's `publish_graph_inputs`)
    /// and fills the captured calls' slots; returns how many calls were registered.
    fn register_graph_inputs(&self, published: Vec<String>) -> PyResult<usize> {
        let all = published
            .iter()
            .enumerate()
            .map(|(r, h)| {
                serde_json::from_str::<Vec<Published>>(h).map_err(|e| {
                    ArtuneError::new_err(format!(
                        "rank {r}'s captured inputs are not artune's ({e}); every rank of the group must run this artune"
                    ))
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        self.op().register_graph_inputs(&all).map_err(op_err)
    }

    /// Drops every registration: replays of graphs captured so far return NaN.
    fn unregister_graph_inputs(&self) -> PyResult<()> {
        self.op().unregister_graph_inputs().map_err(op_err)
    }

    /// (calls registered, calls captured and waiting for registration).
    fn graph_calls(&self) -> (usize, usize) {
        self.op().graph_calls()
    }

    /// Whether a replay found its call unregistered (its output NaN) since this last said so:
    /// a host read, no CUDA call.
    pub(super) fn missed_registration(&self) -> bool {
        self.op().missed_registration()
    }

    /// Device bytes the registered form holds (its slot table).
    fn registration_bytes(&self) -> u64 {
        self.op().registration_bytes()
    }

    /// Closes the peers' buffers this rank opened; run a barrier of the group before dropping
    /// the object (which frees this rank's own buffers).
    fn disconnect(&self) -> PyResult<()> {
        self.op().disconnect().map_err(op_err)
    }

    /// Whether a kernel found a wait of the group given up (a dead or stalled peer) and left
    /// its output NaN: a plain read of a host word the kernels set, no CUDA call, so it can
    /// be asked before every call.
    pub(super) fn faulted(&self) -> bool {
        self.op().faulted()
    }

    /// Backends whose barrier gave up waiting for a peer on this rank (a dead or stalled peer),
    /// or were told by a peer whose barrier did: their results since are NaN. A synchronous
    /// read: for health checks.
    fn failed(&self) -> PyResult<Vec<&'static str>> {
        Ok(self
            .op()
            .failed()
            .map_err(op_err)?
            .into_iter()
            .map(Backend::id)
            .collect())
    }
}

/// The backends artune's kernels take inside an engine under the plugins' kernels setting
/// (`islands`: those no engine has a path of, the default; `artune`: every custom one): the
/// rule `artune why` reports from.
#[pyfunction]
pub fn engine_kernels(setting: &str) -> PyResult<Vec<&'static str>> {
    let k = routes::KernelSetting::from_id(setting).ok_or_else(|| {
        BadInputError::new_err(format!(
            "`{setting}` is not a kernels setting; pass islands or artune"
        ))
    })?;
    Ok(k.backends().into_iter().map(Backend::id).collect())
}

/// How many ranks share the busiest GPU among `bus_ids` (one per rank).
#[pyfunction]
pub fn ranks_per_gpu(bus_ids: Vec<String>) -> u32 {
    op::ranks_per_gpu(&bus_ids)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Routes>()?;
    m.add_class::<AllreduceKernels>()?;
    m.add_function(wrap_pyfunction!(ranks_per_gpu, m)?)?;
    m.add_function(wrap_pyfunction!(engine_kernels, m)?)?;
    Ok(())
}

//! artune's allreduce kernels inside another program's process: one rank of an engine's TP
//! group, launching on the engine's stream.
//!
//! Nothing here is a second copy of the tune's CUDA code. The context is the GPU's primary
//! one (the one torch and every CUDA runtime program run on), retained as the workers retain
//! it; the kernels are loaded through the same compile cache and their images hashed as the
//! profile records them ([`Op::images`]); each backend's buffers are allocated by the
//! function that allocates the tune's ([`setup::custom_bufs`]) and measured as the tune
//! measures them; and every launch takes its kernel, grid and block from
//! [`super::kernels::GpuKernels::plan`] with the tune's programmatic-launch rule.
//!
//! What an engine call adds to the kernel is where the tensors meet the shared buffers, and
//! the kernel does it itself: it reads the engine's input and writes the engine's output
//! (`ArArgs::src`, `dst`), staging the input into its shared input where peers read it and
//! copying the result out of its shared output where peers write it, as the tune timed it. So
//! nothing but the kernel is queued: under CUDA-graph capture the graph holds one kernel node
//! per call with the tensors' addresses, and each replay stages the bytes again inside it.
//!
//! In graph mode the op can run the registered form instead (super::registry): calls
//! captured while [`Op::launch`] is told so are recorded, [`Op::publish_graph_inputs`] and
//! [`Op::register_graph_inputs`] (one exchange of the group after capture) map every rank's
//! captured tensors into its peers (inputs where they read them, outputs where they write
//! them), and replays reach them there, with nothing staged.
//!
//! The order of calls is [`Op::open`], [`Op::allocate`], [`Op::connect`] with every rank's
//! handles, then [`Op::launch`]; the handle exchange between them is the caller's (the
//! engine's process group).

use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::copy::{self, watch};
use super::driver::{self, dev, DeviceFacts, Imported, IpcHandle, Span};
use super::kernels;
use super::layout::{MAX_RANKS, SIGNAL_STATUS_OFFSET};
use super::protocol::{BufHandles, Shape};
use super::registry::{Published, Registry};
use super::setup::{self, CustomOwned, CustomView};
use super::Gpu;
use crate::allreduce::Executor;
use crate::fabric::{Backend, Dtype, FabricError, Islands, LoadedKernels};

/// Why the op cannot be set up or cannot run a call. Every message is one sentence ending in
/// what the engine does instead: its own path.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("{0}")]
    Device(#[from] FabricError),
    #[error("the calling thread runs another CUDA context than GPU {ordinal}'s primary one, which torch uses; artune's kernels would not see the engine's memory")]
    OtherContext { ordinal: usize },
    #[error("{0}")]
    Setup(String),
    /// A rank's handles could not be read or opened (no P2P between the GPUs, or a handle
    /// from another group).
    #[error("rank {rank}: {why}")]
    Peer { rank: usize, why: String },
    /// This call is not one the op serves (the caller checks first; this is the backstop).
    #[error("{0}")]
    Call(String),
}

/// What one rank allocated for one backend, and, once connected, every rank's buffers.
struct Prepared {
    backend: Backend,
    max_bytes: u64,
    /// Device memory the allocation took (free memory before minus after).
    measured: u64,
    /// Bytes asked of cuMemAlloc (whole pages above 2 MiB).
    asked: u64,
    view: Option<CustomView>,
    own: CustomOwned,
}

/// The rank and group this process serves.
#[derive(Debug, Clone)]
struct Place {
    rank: usize,
    world: usize,
    /// Ranks of the group sharing this GPU (more than one only in loopback); the same on
    /// every rank, so every rank plans the same grid.
    ranks_on_gpu: u32,
    dtype: Dtype,
    /// The GPUs of the profile's group (rank r on `gpus[r]`) and their islands, for the island
    /// schedules; None for a group without islands.
    islands: Option<(Vec<usize>, Islands)>,
}

impl Place {
    /// The shape of this group for buffers of `max_bytes`: its islands where it has some.
    fn shape(&self, max_bytes: u64) -> Shape {
        Shape::new(
            self.world,
            self.dtype,
            max_bytes,
            self.islands.as_ref().map(|(g, i)| (&g[..], i)),
        )
    }
}

/// One rank's allreduce op. Fields drop in order: peers' buffers are closed before this
/// rank's own are freed, and the GPU (its context) goes last.
pub struct Op {
    /// Releases copy-engine calls stuck on a peer (copy::watch); stopped before the rest.
    watch: Option<watch::Watchdog>,
    bufs: Vec<Prepared>,
    imported: Vec<Imported>,
    place: Option<Place>,
    /// The fault word, set by the kernels once a wait of the group gave up on this rank
    /// ([`Op::faulted`]), and the words copy-engine calls mark for the watchdog.
    words: Arc<watch::HostWords>,
    /// The fault knob's `absent=BACKEND:RANK` (testing only): that rank's calls queue nothing.
    absent: Option<(Backend, usize)>,
    /// The registered form's slots (graph mode).
    registry: Registry,
    gpu: Gpu,
}

// SAFETY: the only non-Send parts are the `Rc`s between the loaded kernels and their module
// (kernels::GpuKernels). Every clone of those `Rc`s lives inside this op (no function or module
// is handed out; `plan` lends `&Function`), so moving the whole op moves every clone with it
// and no count is ever touched from two threads. CUDA handles are usable from any thread once
// the context is bound, which every entry point does.
unsafe impl Send for Op {}

/// One allreduce: `elems` elements of the op's dtype from device address `input` to
/// `output`, with `backend`'s kernel.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    pub backend: Backend,
    pub input: u64,
    pub output: u64,
    pub elems: u64,
}

/// The handles one rank publishes: its GPU, and each backend's buffers.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankBuffers {
    pub rank: usize,
    pub bus_id: String,
    pub backends: Vec<(Backend, BufHandles)>,
}

impl Op {
    /// Opens GPU `ordinal`'s primary context and loads the kernels, refusing when the calling
    /// thread runs another context (torch runs the primary one).
    pub fn open(ordinal: usize) -> Result<Op, OpError> {
        if !driver::driver_present() {
            return Err(OpError::Setup(
                "no NVIDIA driver (libcuda.so) was found on this machine".into(),
            ));
        }
        // SAFETY: cuInit may be called any number of times; it loads nothing else.
        dev(unsafe { sys::cuInit(0).result() }, "initialising CUDA")?;
        let before = dev(
            result::ctx::get_current(),
            "reading the current CUDA context",
        )?;
        let gpu = Gpu::open(ordinal)?;
        let primary = gpu.ctx.cuda().cu_ctx();
        if let Some(c) = before.filter(|&c| c != primary) {
            // Give the thread back the context it had.
            // SAFETY: `c` was current on this thread a moment ago.
            let _ = unsafe { result::ctx::set_current(c) };
            return Err(OpError::OtherContext { ordinal });
        }
        gpu.kernels().map_err(FabricError::Device)?;
        let words = dev(
            watch::HostWords::alloc(&gpu.ctx),
            "allocating the fault word in pinned host memory",
        )?;
        let registry = Registry::alloc(&gpu.ctx)?;
        Ok(Op {
            watch: None,
            bufs: Vec::new(),
            imported: Vec::new(),
            place: None,
            words: Arc::new(words),
            absent: super::WorkerFaults::from_env().absent,
            registry,
            gpu,
        })
    }

    /// The GPU: its bus id tells which ranks share it.
    pub fn facts(&self) -> &DeviceFacts {
        &self.gpu.facts
    }

    /// What the loaded kernels are (a profile records them as its `KernelImages`).
    pub fn images(&self) -> Result<LoadedKernels, OpError> {
        Ok(self
            .gpu
            .kernels()
            .map_err(FabricError::Device)?
            .images
            .clone())
    }

    /// Allocates this rank's buffers for each backend and the largest message it serves,
    /// measuring each as the tune does, and returns the handles to publish. `ranks_on_gpu`
    /// is how many ranks of the group share this GPU (the same on every rank).
    pub fn allocate(
        &mut self,
        rank: usize,
        world: usize,
        ranks_on_gpu: u32,
        dtype: Dtype,
        backends: &[(Backend, u64)],
        islands: Option<(&[usize], &Islands)>,
    ) -> Result<RankBuffers, OpError> {
        if world == 0 || world > MAX_RANKS || rank >= world {
            return Err(OpError::Setup(format!(
                "rank {rank} of {world}: artune's kernels serve groups of 1 to {MAX_RANKS} ranks"
            )));
        }
        if self.place.is_some() {
            return Err(OpError::Setup(
                "the op's buffers are allocated already".into(),
            ));
        }
        let place = Place {
            rank,
            world,
            ranks_on_gpu: ranks_on_gpu.max(1),
            dtype,
            islands: islands.map(|(g, i)| (g.to_vec(), i.clone())),
        };
        let mut published = Vec::new();
        for &(b, max_bytes) in backends {
            let kernel = match b.executor() {
                Executor::SmKernel => max_bytes > 0,
                Executor::CopyEngine(_) => super::copy::runs() && max_bytes > 0,
                Executor::Nccl => false,
            };
            if !kernel {
                return Err(OpError::Setup(format!(
                    "{b} up to {max_bytes} bytes is not a custom kernel artune can run"
                )));
            }
            let shape = place.shape(max_bytes);
            if b.is_hierarchical() && shape.island == world {
                return Err(OpError::Setup(format!(
                    "{b} needs the group's islands, and the profile gives none for {world} ranks"
                )));
            }
            let ctx = &self.gpu.ctx;
            driver::sync_ctx(ctx, "synchronizing the GPU")?;
            let free = || dev(driver::free_bytes(ctx), "reading free device memory");
            let before = free()?;
            let own = setup::custom_bufs(&self.gpu, shape, b, rank).map_err(FabricError::from)?;
            driver::sync_ctx(ctx, "synchronizing the GPU")?;
            let measured = before.saturating_sub(free()?);
            let (i, s, o, g) = own.spans();
            let asked = [i, s, o, Some(g)]
                .iter()
                .flatten()
                .map(|x| x.bytes() as u64)
                .sum();
            published.push((b, own.handles()?));
            self.bufs.push(Prepared {
                backend: b,
                max_bytes,
                measured,
                asked,
                view: None,
                own,
            });
        }
        self.place = Some(place);
        Ok(RankBuffers {
            rank,
            bus_id: self.gpu.facts.bus_id.clone(),
            backends: published,
        })
    }

    /// Device bytes the registered form holds whatever the backends (its slot table).
    pub fn registration_bytes(&self) -> u64 {
        self.registry.bytes()
    }

    /// Per backend: the largest message it serves, device bytes measured, bytes asked for.
    pub fn memory(&self) -> Vec<(Backend, u64, u64, u64)> {
        self.bufs
            .iter()
            .map(|p| (p.backend, p.max_bytes, p.measured, p.asked))
            .collect()
    }

    /// Opens every other rank's buffers (`all[r]` is rank r's) and readies the launches. A
    /// peer whose buffers cannot be opened or read (no P2P between the GPUs) fails it.
    pub fn connect(&mut self, all: &[RankBuffers]) -> Result<(), OpError> {
        let place = self
            .place
            .clone()
            .ok_or_else(|| OpError::Setup("allocate the op's buffers before connecting".into()))?;
        if all.len() != place.world {
            return Err(OpError::Setup(format!(
                "{} ranks' handles for a group of {}",
                all.len(),
                place.world
            )));
        }
        if self.bufs.iter().any(|p| p.view.is_some()) {
            return Err(OpError::Setup("the op is connected already".into()));
        }
        let ctx = self.gpu.ctx.clone();
        // The fault knob's `noipc=A-B` (testing only): ranks A and B cannot open each other's
        // buffers, as between GPUs without a peer mapping.
        let no_ipc = super::WorkerFaults::from_env().no_ipc;
        let mut imported = Vec::new();
        let mut views = Vec::new();
        for p in &self.bufs {
            let shape = place.shape(p.max_bytes);
            let mut v = CustomView::new(p.backend, shape);
            for (r, theirs) in all.iter().enumerate() {
                let peer = |why: String| OpError::Peer { rank: r, why };
                if theirs.rank != r {
                    return Err(peer(format!("its handles came as rank {}'s", theirs.rank)));
                }
                if r == place.rank {
                    // This rank's own input and output are the engine's tensors, set per call.
                    let (i, s, o, g) = p.own.spans();
                    v.set(
                        r,
                        i.unwrap_or(Span::NONE),
                        s,
                        o.unwrap_or(Span::NONE),
                        g,
                        (Span::NONE, Span::NONE),
                    );
                    continue;
                }
                let h = theirs
                    .backends
                    .iter()
                    .find(|(b, _)| *b == p.backend)
                    .map(|(_, h)| h)
                    .ok_or_else(|| peer(format!("it published no buffers for {}", p.backend)))?;
                if no_ipc
                    .is_some_and(|(a, b)| (a, b) == (place.rank, r) || (b, a) == (place.rank, r))
                {
                    return Err(peer(format!(
                        "GPU {} could not open its buffers (switched off by ARTUNE_CUDA_FAULTS, noipc); artune's kernels need CUDA IPC between the group's GPUs",
                        self.gpu.facts.ordinal
                    )));
                }
                let mut open = |h: &IpcHandle, what: &str| -> Result<Span, OpError> {
                    let i = Imported::open(&ctx, h).map_err(|e| {
                        peer(format!(
                            "GPU {} could not open its {what} ({e}); artune's kernels need CUDA IPC between the group's GPUs",
                            self.gpu.facts.ordinal
                        ))
                    })?;
                    let s = i.span();
                    imported.push(i);
                    Ok(s)
                };
                let input = h
                    .input
                    .as_ref()
                    .map(|h| open(h, "shared input"))
                    .transpose()?;
                let scratch = h.scratch.as_ref().map(|h| open(h, "slots")).transpose()?;
                let out = h
                    .out
                    .as_ref()
                    .map(|h| open(h, "shared output"))
                    .transpose()?;
                let signal = open(&h.signal, "flags")?;
                check_reads_zero(&signal).map_err(peer)?;
                v.set(
                    r,
                    input.unwrap_or(Span::NONE),
                    scratch,
                    out.unwrap_or(Span::NONE),
                    signal,
                    // Peers' tensors are theirs alone.
                    (Span::NONE, Span::NONE),
                );
            }
            views.push(v);
        }
        for (p, v) in self.bufs.iter_mut().zip(views) {
            p.view = Some(v);
        }
        self.imported = imported;
        self.watch = self.watchdog();
        Ok(())
    }

    /// Queues `call` on `stream`: the backend's kernel as the tune ran it, which stages
    /// through its shared buffers itself (module docs). With `registered` (the engine is
    /// capturing a graph it will register) a backend that has a registered form runs it: the
    /// call is recorded, and its replays reach the peers' tensors once registered, NaN before.
    /// `repeat` queues it that many times, from one call (the raw launch a benchmark compares
    /// the op's Python path with).
    ///
    /// # Safety
    /// The call's `input` and `output` each hold `elems` elements of the op's dtype, stay allocated until
    /// the calls have run, and do not overlap; `stream` is a live stream of this GPU's primary
    /// context (torch's current stream); nothing else writes `output` meanwhile. With
    /// `registered`, the input stays allocated as long as the captured graph may be replayed.
    pub unsafe fn launch(
        &mut self,
        call: Call,
        stream: u64,
        repeat: u32,
        registered: bool,
    ) -> Result<(), OpError> {
        let Call {
            backend,
            input,
            output,
            elems,
        } = call;
        let place = self
            .place
            .as_ref()
            .ok_or_else(|| OpError::Call("the op is not set up".into()))?;
        let p = self
            .bufs
            .iter()
            .find(|p| p.backend == backend)
            .ok_or_else(|| OpError::Call(format!("{backend} was not prepared")))?;
        let view = p
            .view
            .as_ref()
            .ok_or_else(|| OpError::Call("the op is not connected".into()))?;
        let bytes = elems.saturating_mul(place.dtype.size());
        if elems == 0 || bytes > p.max_bytes {
            return Err(OpError::Call(format!(
                "{bytes} bytes is outside what {backend}'s buffers serve (1 to {} bytes)",
                p.max_bytes
            )));
        }
        if input % 16 != 0 || output % 16 != 0 || input == 0 || output == 0 {
            return Err(OpError::Call(
                "the tensors must start on a 16-byte boundary".into(),
            ));
        }
        let gpu = &self.gpu;
        let k = gpu.kernels().map_err(FabricError::Device)?;
        let mut work = kernels::Work {
            backend,
            dtype: place.dtype,
            elems,
            ranks: place.shape(p.max_bytes).ranks(),
            base: place.rank,
            count: 1,
            on_gpu: place.ranks_on_gpu,
            registered: None,
        };
        let takes_registered = registered
            && k.plan(
                backend,
                place.dtype,
                elems,
                work.ranks,
                self.gpu.facts.sms,
                place.ranks_on_gpu,
                true,
            )
            .is_some_and(|p| p.3);
        if takes_registered {
            // The tensors peers read or write: inputs, outputs, or both (the island two-shot).
            let tensors = kernels::registered_tensors(backend)
                .map_or_else(|| vec![input], |t| t.of(input, output));
            let r = self
                .registry
                .record(&tensors, bytes)
                .map_err(|e| OpError::Call(e.to_string()))?;
            work.registered = Some(r);
        }
        let (shared_in, _, shared_out, _) = p.own.spans();
        let mut a = view.args;
        a.fault = self.words.fault.device_ptr();
        a.src[place.rank] = input;
        a.dst[place.rank] = output;
        // Where no peer touches them, the tensors are the kernel's buffers (nothing staged).
        if shared_in.is_none() {
            a.input[place.rank] = input;
        }
        if shared_out.is_none() {
            a.out[place.rank] = output;
        }
        let raw = stream as sys::CUstream;
        gpu.ctx
            .bind_to_thread()
            .map_err(|e| OpError::Call(format!("binding the context failed: {e}")))?;
        if let Executor::CopyEngine(_) = backend.executor() {
            // Captured copies name the tensors themselves: no registered form to record.
            let c = copy::Call {
                backend,
                dtype: place.dtype,
                elems,
                ranks: work.ranks,
                local: place.rank..place.rank + 1,
                max_bytes: setup::padded(p.max_bytes),
                absent: self.absent.filter(|a| a.0 == backend).map(|a| a.1),
                watch: Some(self.words.words()),
            };
            for _ in 0..repeat {
                // SAFETY: as below; the steps name only the buffers of `a`.
                unsafe { copy::launch(&c, &a, k, gpu.facts.sms, raw) }
                    .map_err(|e| OpError::Call(e.to_string()))?;
            }
            return Ok(());
        }
        // The fault knob's absent rank queues nothing: its peers' kernels wait for it.
        if self.absent == Some((backend, place.rank)) {
            return Ok(());
        }
        for _ in 0..repeat {
            // SAFETY: `a` names every rank's buffers for this backend, each sized for
            // max_bytes >= bytes, and this rank's tensors (the caller's contract); `raw` is a
            // stream of the kernels' context.
            unsafe { k.launch(work, &a, &gpu.facts, raw) }
                .map_err(|e| OpError::Call(e.to_string()))?;
        }
        Ok(())
    }

    /// The watchdog of the connected copy-engine backends (None without any).
    fn watchdog(&self) -> Option<watch::Watchdog> {
        let place = self.place.as_ref()?;
        let mut t = watch::Targets::default();
        for p in &self.bufs {
            let (Executor::CopyEngine(_), Some(v)) = (p.backend.executor(), &p.view) else {
                continue;
            };
            let sig = &v.args.sig[..place.world];
            t.status
                .extend(sig.iter().map(|s| s + SIGNAL_STATUS_OFFSET as u64));
            t.inboxes.push(sig[place.rank]);
        }
        if t.inboxes.is_empty() {
            return None;
        }
        let ctx = self.gpu.ctx.clone();
        Some(watch::Watchdog::start(ctx, self.words.clone(), t))
    }

    /// The handles (allocation and offset) of every input captured since the last
    /// registration, for the group's exchange.
    pub fn publish_graph_inputs(&self) -> Result<Vec<Published>, OpError> {
        Ok(self.registry.publish(&self.gpu.ctx)?)
    }

    /// Opens the peers' captured inputs (`all[r]` is rank r's [`Op::publish_graph_inputs`])
    /// and fills the captured calls' slots: their replays read the peers' tensors from now on.
    /// Returns how many calls were registered.
    pub fn register_graph_inputs(&mut self, all: &[Vec<Published>]) -> Result<usize, OpError> {
        let rank = self
            .place
            .as_ref()
            .ok_or_else(|| OpError::Setup("the op is not set up".into()))?
            .rank;
        self.registry
            .register(&self.gpu.ctx, rank, all)
            .map_err(OpError::Setup)
    }

    /// Drops every registration (after draining this rank's work): replays of graphs captured
    /// so far return NaN, and captures from now on need a new registration.
    pub fn unregister_graph_inputs(&mut self) -> Result<(), OpError> {
        self.gpu
            .ctx
            .synchronize("draining artune's allreduce calls")?;
        Ok(self.registry.reset()?)
    }

    /// (calls registered, calls captured and waiting for registration).
    pub fn graph_calls(&self) -> (usize, usize) {
        let b = &self.registry.book;
        (b.registered(), b.pending_calls())
    }

    /// Whether a replayed call found its slot unregistered (its output was NaN) since the last
    /// time this answered true: a host read, no CUDA call.
    pub fn missed_registration(&self) -> bool {
        let m = self.registry.missed();
        if m {
            self.registry.clear_missed();
        }
        m
    }

    /// Closes every peer's buffers this rank opened, after draining its work. Before any rank
    /// frees its own buffers every rank closes what it opened (CUDA leaves freeing memory a
    /// peer still maps undefined), so the caller runs a barrier between this and the drop.
    pub fn disconnect(&mut self) -> Result<(), OpError> {
        self.gpu
            .ctx
            .synchronize("draining artune's allreduce calls")?;
        // It writes the peers' flags: stopped before they are closed.
        self.watch = None;
        for p in &mut self.bufs {
            p.view = None;
        }
        self.imported.clear();
        self.registry.reset()?;
        Ok(())
    }

    /// Whether a kernel of this op found a wait of the group given up (this rank's or a
    /// peer's) and left its output NaN: a read of host memory the kernels write, without any
    /// synchronization, cheap enough for every call. It is set from the first such kernel's
    /// end on, so calls queued before the host reads it may return NaN too.
    pub fn faulted(&self) -> bool {
        self.words.fault.get() != 0
    }

    /// Backends whose barrier on this rank gave up waiting for a peer, or were told by a peer
    /// whose barrier did (the kernels record it in the signal's status word and finish, with
    /// NaN results, rather than hang). Reads device memory synchronously: a health check, not
    /// for every call.
    pub fn failed(&self) -> Result<Vec<Backend>, OpError> {
        let mut out = Vec::new();
        dev(self.gpu.ctx.bind_to_thread(), "binding the CUDA context")?;
        for p in &self.bufs {
            let (.., sig) = p.own.spans();
            let mut w = [0u8; 4];
            dev(
                sig.download(SIGNAL_STATUS_OFFSET, &mut w),
                "reading barrier status",
            )?;
            if u32::from_le_bytes(w) != 0 {
                out.push(p.backend);
            }
        }
        Ok(out)
    }
}

impl Drop for Op {
    /// Waits (bounded) for queued work before anything is freed: the engine's stream may still
    /// hold calls that use these buffers. A wait that expires poisons the context, which
    /// then keeps the memory (driver::Ctx).
    fn drop(&mut self) {
        let _ = self
            .gpu
            .ctx
            .synchronize("draining artune's allreduce calls");
        self.watch = None;
    }
}

/// The real-transfer check of a peer's mapping: the start of its signal, zeroed by its owner
/// before it published the handle, reads back as zeros through P2P.
fn check_reads_zero(signal: &Span) -> Result<(), String> {
    let mut got = vec![0xa5u8; 256.min(signal.bytes())];
    signal
        .download(0, &mut got)
        .map_err(|e| format!("reading its flags through P2P failed: {e}"))?;
    match got.iter().all(|&b| b == 0) {
        true => Ok(()),
        false => Err("its flags read through P2P differ from what its owner wrote".into()),
    }
}

/// Whether the engine's stream `stream` is being captured (a driver error: None, and the
/// caller asks torch), read here rather than through torch's Python getter on every eager call.
///
/// # Safety
/// `stream` must be a live stream handle (torch's current stream), or 0.
pub unsafe fn capturing(stream: u64) -> Option<bool> {
    // SAFETY: the caller's contract.
    unsafe { driver::stream_capturing(stream) }.ok()
}

/// How many of `bus_ids` (one per rank) name the GPU of the rank that shares it most: the
/// `ranks_on_gpu` every rank plans with.
pub fn ranks_per_gpu(bus_ids: &[String]) -> u32 {
    bus_ids
        .iter()
        .map(|b| bus_ids.iter().filter(|x| *x == b).count())
        .max()
        .unwrap_or(1) as u32
}

#[cfg(test)]
mod tests;

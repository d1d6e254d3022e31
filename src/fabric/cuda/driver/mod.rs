//! Thin owners of CUDA driver objects (the context, memory, streams, events, graphs). Every
//! call that can fail returns a `FabricError`; nothing here panics, and dropping releases the
//! object with its context bound, unless the context is poisoned ([`Ctx`]).
//!
//! No `unsafe impl Send`/`Sync` here. Streams, events, graphs and modules hold raw handles,
//! which keep them on the worker's one thread. Memory handles ([`DevBuf`], [`Imported`],
//! [`Span`]) are `Send` and `Sync` by their fields alone: a device address names the same
//! memory from any thread (unified addressing), and memory binds its context before it is
//! freed. Spans keep memory allocated (as cudarc's views do), so no safe call touches freed
//! memory.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cudarc::driver::{result, sys, CudaContext, DriverError};

use super::watchdog::{self, Poll, Waited};
use crate::fabric::{DeviceError, FabricError};

pub use super::ipc::{Imported, IpcHandle};
pub use super::module::{Function, Modules};

/// Maps a driver failure to the device error of `what` (out of memory is its own cause).
pub fn dev<T>(r: Result<T, DriverError>, what: &str) -> Result<T, FabricError> {
    r.map_err(|e| FabricError::Device(driver_error(&e, what, None)))
}

/// The device error of driver failure `e` while doing `what`, on `ctx` when known (to read the
/// GPU and its free memory for an out-of-memory error).
pub fn driver_error(e: &DriverError, what: &str, ctx: Option<&Ctx>) -> DeviceError {
    if is_oom(e) {
        return DeviceError::OutOfMemory {
            gpu: ctx.map_or(0, |c| c.cu.ordinal()),
            what: what.into(),
            bytes: None,
            free: ctx.and_then(|c| free_bytes(c).ok()),
        };
    }
    DeviceError::Driver {
        what: what.into(),
        code: e.to_string(),
    }
}

/// The error of a wait on work that belongs to no backend (a copy, a probe, a check): there is
/// nothing to disqualify, so a hang ends the run.
fn wait_error(w: Waited, what: &str) -> DeviceError {
    match w {
        Waited::Expired(t) => DeviceError::Stuck {
            what: what.into(),
            seconds: t.as_secs_f64(),
        },
        Waited::Failed(code) => DeviceError::Driver {
            what: what.into(),
            code,
        },
    }
}

/// One GPU's CUDA context. Once a wait on its work expired without the work being known
/// finished, it is *poisoned*: queued kernels and copies may still read and write any of its
/// memory, so from then on nothing of it is freed, closed or destroyed (every owner below
/// checks on drop) and the context itself is never released: all of it goes when the worker
/// process ends, which the coordinator then makes happen. Freeing under queued work is
/// undefined behaviour; `cuMemFree` could also block behind a kernel that never ends.
pub struct Ctx {
    cu: Arc<CudaContext>,
    poisoned: OnceLock<DeviceError>,
}

impl Ctx {
    pub fn new(ordinal: usize) -> Result<Arc<Ctx>, DriverError> {
        let cu = CudaContext::new(ordinal)?;
        // SAFETY: we synchronize streams explicitly; cudarc's per-allocation events would
        // only add latency to small calls.
        unsafe { cu.disable_event_tracking() };
        Ok(Arc::new(Ctx {
            cu,
            poisoned: OnceLock::new(),
        }))
    }

    pub fn cuda(&self) -> &Arc<CudaContext> {
        &self.cu
    }

    pub fn bind_to_thread(&self) -> Result<(), DriverError> {
        self.cu.bind_to_thread()
    }

    /// Marks the context poisoned (the first reason is kept).
    pub fn poison(&self, why: DeviceError) {
        if self.poisoned.set(why.clone()).is_ok() {
            tracing::warn!(
                "GPU {}: {why}; its memory is kept until the worker ends",
                self.cu.ordinal()
            );
        }
    }

    /// Why the context is poisoned, if it is.
    pub fn poisoned(&self) -> Option<&DeviceError> {
        self.poisoned.get()
    }

    /// Waits for everything queued on the context, including the legacy-stream work of
    /// synchronous fills (cuCtxSynchronize can only block, so it runs on a helper thread under
    /// a deadline; one that expires poisons the context).
    pub fn synchronize(&self, what: &str) -> Result<(), FabricError> {
        let c = self.cu.clone();
        let limit = watchdog::OP_DEADLINE;
        match watchdog::bounded(limit, move || {
            c.bind_to_thread()?;
            c.synchronize()
        }) {
            Some(r) => r.map_err(|e| driver_error(&e, what, Some(self)).into()),
            None => Err(self.expired(Waited::Expired(limit), what)),
        }
    }

    /// The error of a wait that ended without the work done; an expired one poisons.
    fn expired(&self, w: Waited, what: &str) -> FabricError {
        let e = wait_error(w, what);
        if matches!(e, DeviceError::Stuck { .. }) {
            self.poison(e.clone());
        }
        e.into()
    }
}

impl Drop for Ctx {
    /// A poisoned context is not released: releasing the primary context under a kernel that
    /// never ends can block, and its memory must stay. Process exit tears it down.
    fn drop(&mut self) {
        if self.poisoned().is_some() {
            std::mem::forget(self.cu.clone());
        }
    }
}

/// Waits for everything queued on `ctx` (see [`Ctx::synchronize`]).
pub fn sync_ctx(ctx: &Ctx, what: &str) -> Result<(), FabricError> {
    ctx.synchronize(what)
}

/// A query's answer as the watchdog reads it: done, still running, or failed.
fn poll(r: Result<(), DriverError>) -> Poll {
    match r {
        Ok(()) => Poll::Done,
        Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_READY => Poll::Pending,
        Err(e) => Poll::Failed(e.to_string()),
    }
}

/// True when the driver reports it is out of memory.
pub fn is_oom(e: &DriverError) -> bool {
    e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY
}

/// True when libcuda can be loaded (cudarc panics on first use when it cannot).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// Buffers of a large page or more are whole large pages. A peer that opens a buffer whose
/// last 2 MiB page is partial gets it mapped with small pages throughout: the two-stage kernels
/// lost a third of their bandwidth over 8 ranks' 64 MiB buffers that way
/// (profiles/hardware/h200/2026-12-01-pages/). The driver takes the whole page anyway.
pub const LARGE_PAGE: usize = 2 << 20;

/// `bytes` rounded up to whole large pages from one large page on.
pub fn whole_pages(bytes: usize) -> usize {
    if bytes >= LARGE_PAGE {
        bytes.div_ceil(LARGE_PAGE) * LARGE_PAGE
    } else {
        bytes
    }
}

/// Device memory in this process: allocated here (freed on drop) or another process's opened
/// through its IPC handle (closed on drop). Shared by every handle to it, so it goes only
/// when the last one does.
pub(super) struct Mem {
    pub(super) ptr: sys::CUdeviceptr,
    pub(super) bytes: usize,
    pub(super) imported: bool,
    pub(super) ctx: Arc<Ctx>,
}

impl Drop for Mem {
    fn drop(&mut self) {
        if self.ctx.poisoned().is_some() || self.ctx.bind_to_thread().is_err() {
            return;
        }
        if self.imported {
            // SAFETY: opened by cuIpcOpenMemHandle and closed once, by its last handle.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr).result() };
        } else {
            // SAFETY: allocated by cuMemAlloc and freed once, by its last handle; the context
            // is not poisoned, so no queued work is known to still use it.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Plain `cuMemAlloc` memory: exportable through IPC, unlike stream-ordered pool memory.
/// Its address and length are read-only: safe code cannot enlarge what a bounds check uses.
pub struct DevBuf {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    mem: Arc<Mem>,
}

impl DevBuf {
    /// The device address (for kernel arguments and raw driver calls).
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The length in bytes (whole pages).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn alloc(ctx: &Arc<Ctx>, bytes: usize) -> Result<DevBuf, DriverError> {
        let bytes = whole_pages(bytes);
        ctx.bind_to_thread()?;
        // SAFETY: plain allocation; contents are set by the caller before use.
        let ptr = unsafe { result::malloc_sync(bytes.max(16)) }?;
        Ok(DevBuf {
            ptr,
            bytes,
            mem: Arc::new(Mem {
                ptr,
                bytes,
                imported: false,
                ctx: ctx.clone(),
            }),
        })
    }

    /// Synchronous byte fill.
    pub fn fill(&self, byte: u8) -> Result<(), DriverError> {
        self.mem.ctx.bind_to_thread()?;
        self.span().fill_range(0, self.bytes, byte)
    }

    /// Bounds-checked synchronous upload (see [`Span::upload`]).
    pub fn upload(&self, offset: usize, data: &[u8]) -> Result<(), DriverError> {
        self.mem.ctx.bind_to_thread()?;
        self.span().upload(offset, data)
    }

    /// Bounds-checked synchronous download (see [`Span::download`]).
    pub fn download(&self, offset: usize, out: &mut [u8]) -> Result<(), DriverError> {
        self.mem.ctx.bind_to_thread()?;
        self.span().download(offset, out)
    }

    /// The buffer as a bounds-checked span, which keeps it allocated.
    pub fn span(&self) -> Span {
        Span {
            ptr: self.ptr,
            bytes: self.bytes,
            _mem: Some(self.mem.clone()),
        }
    }

    /// An IPC handle another process opens with [`Imported::open`] (cuIpcGetMemHandle; the
    /// buffer came from plain cuMemAlloc, which IPC accepts).
    pub fn export(&self) -> Result<IpcHandle, DriverError> {
        self.mem.ctx.bind_to_thread()?;
        // self.mem keeps the allocation alive; ptr is its base.
        export_base(self.ptr, self.bytes)
    }
}

/// An IPC handle of the allocation at `base` (a cuMemAlloc'd range of `bytes`, such as
/// torch's caching allocator's segments), in the bound context: what an engine's tensors are
/// shared by once a graph captured them.
pub fn export_base(base: sys::CUdeviceptr, bytes: usize) -> Result<IpcHandle, DriverError> {
    // SAFETY: zeroed bytes are a valid handle to fill in.
    let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: the out-pointer is valid; the caller names the base of a live allocation of the
    // bound context (cuMemGetAddressRange's answer).
    unsafe { sys::cuIpcGetMemHandle(&mut h, base).result() }?;
    Ok(IpcHandle {
        hex: h
            .reserved
            .iter()
            .map(|b| format!("{:02x}", *b as u8))
            .collect(),
        bytes: bytes as u64,
    })
}

/// One 32-bit word of pinned host memory that kernels write through its device address
/// (cuMemHostAlloc with DEVICEMAP) and the host reads without synchronizing: a flag a kernel
/// raises for a host that must not wait on the GPU to learn it.
pub struct HostWord {
    host: *mut u32,
    device: sys::CUdeviceptr,
    ctx: Arc<Ctx>,
}

impl HostWord {
    /// A zeroed word, mapped into `ctx`'s device address space.
    pub fn alloc(ctx: &Arc<Ctx>) -> Result<HostWord, DriverError> {
        ctx.bind_to_thread()?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: a plain allocation of 4 bytes, zeroed below before any kernel sees it.
        let host = unsafe { result::malloc_host(4, flags) }? as *mut u32;
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated by cuMemHostAlloc with DEVICEMAP just above.
        let mapped =
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0).result() };
        let word = HostWord {
            host,
            device,
            ctx: ctx.clone(),
        };
        mapped?;
        word.clear();
        Ok(word)
    }

    /// The address kernels write.
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.device
    }

    /// The word as the host sees it now (a volatile read: a kernel may set it at any time).
    pub fn get(&self) -> u32 {
        // SAFETY: `host` points to 4 live, aligned bytes until drop.
        unsafe { std::ptr::read_volatile(self.host) }
    }

    pub fn clear(&self) {
        self.set(0)
    }
    pub fn set(&self, value: u32) {
        // SAFETY: as in `get`.
        unsafe { std::ptr::write_volatile(self.host, value) }
    }
}

impl Drop for HostWord {
    fn drop(&mut self) {
        // Queued kernels may still write a word of a poisoned context: it is kept then.
        if self.ctx.poisoned().is_some() || self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: allocated by cuMemHostAlloc and freed once, here; the owner synchronized its
        // work first (Op's drop), so no kernel writes it any more.
        let _ = unsafe { result::free_host(self.host.cast()) };
    }
}

/// A device range in this process's address space (own or opened by IPC), with its length:
/// every copy into or out of it is checked against the length, and the memory stays
/// allocated (or opened) while the span lives. Cloning shares the memory, never copies it.
#[derive(Clone)]
pub struct Span {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    _mem: Option<Arc<Mem>>,
}

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Span({:#x}, {} bytes)", self.ptr, self.bytes)
    }
}

impl Span {
    /// The device address (for kernel arguments and raw driver calls).
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The length in bytes every copy is checked against.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// All of `mem`, which the span keeps allocated (or opened).
    pub(super) fn of(mem: &Arc<Mem>) -> Span {
        Span {
            ptr: mem.ptr,
            bytes: mem.bytes,
            _mem: Some(mem.clone()),
        }
    }

    /// No memory: the place of a peer's buffer this GPU could not open, never launched on.
    pub const NONE: Span = Span {
        ptr: 0,
        bytes: 0,
        _mem: None,
    };

    fn check(&self, offset: usize, len: usize) -> Result<(), DriverError> {
        if offset.checked_add(len).is_some_and(|end| end <= self.bytes) {
            Ok(())
        } else {
            Err(DriverError(sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE))
        }
    }

    /// Synchronous copy of `data` to `offset` (the caller's context is bound).
    pub fn upload(&self, offset: usize, data: &[u8]) -> Result<(), DriverError> {
        self.check(offset, data.len())?;
        // SAFETY: the range lies inside the span (checked above), which keeps it allocated.
        unsafe { result::memcpy_htod_sync(self.ptr + offset as u64, data) }
    }

    pub fn download(&self, offset: usize, out: &mut [u8]) -> Result<(), DriverError> {
        self.check(offset, out.len())?;
        // SAFETY: as above.
        unsafe { result::memcpy_dtoh_sync(out, self.ptr + offset as u64) }
    }

    pub fn fill_range(&self, offset: usize, len: usize, byte: u8) -> Result<(), DriverError> {
        self.check(offset, len)?;
        // SAFETY: as above.
        unsafe { result::memset_d8_sync(self.ptr + offset as u64, byte, len) }
    }
}

/// Whether the stream `raw` is being captured into a graph (an invalidated capture counts), as
/// torch's `is_current_stream_capturing` answers for its current stream: one driver call, no
/// context needed (the stream names its own).
///
/// # Safety
/// `raw` must be a live stream handle, or 0 (the legacy stream).
pub unsafe fn stream_capturing(raw: u64) -> Result<bool, DriverError> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the caller's contract; `status` is a valid place to write.
    unsafe { sys::cuStreamIsCapturing(raw as sys::CUstream, &mut status).result()? };
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// A non-blocking stream.
pub struct Stream {
    pub raw: sys::CUstream,
    ctx: Arc<Ctx>,
}

impl Stream {
    pub fn new(ctx: &Arc<Ctx>) -> Result<Stream, DriverError> {
        ctx.bind_to_thread()?;
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)?;
        Ok(Stream {
            raw,
            ctx: ctx.clone(),
        })
    }

    pub fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// Whether everything queued on the stream has finished (cuStreamQuery).
    pub fn query(&self) -> Poll {
        // SAFETY: the stream is alive.
        poll(unsafe { sys::cuStreamQuery(self.raw).result() })
    }

    /// Waits for the stream's work by polling, up to `limit`.
    pub fn wait(&self, limit: Duration) -> Result<(), Waited> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Waited::Failed(e.to_string()))?;
        watchdog::wait_real(limit, || self.query())
    }

    /// [`Stream::wait`] for work of no backend (`what`): a wait that expires poisons the
    /// context, since the work may still use its memory.
    pub fn finish(&self, limit: Duration, what: &str) -> Result<(), FabricError> {
        self.wait(limit).map_err(|w| self.ctx.expired(w, what))
    }

    /// Queues a device-to-device copy.
    ///
    /// # Safety
    /// `dst` and `src` start ranges of at least `bytes` in live allocations that stay alive
    /// until the copy has finished.
    pub unsafe fn copy(
        &self,
        dst: sys::CUdeviceptr,
        src: sys::CUdeviceptr,
        bytes: usize,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract.
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.raw).result() }
    }

    /// Queues a write of `v` to the 4-byte word at `word` and returns (the probes' latch).
    pub fn set_u32(&self, word: &Span, v: u32) -> Result<(), DriverError> {
        word.check(0, 4)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: one word inside the span (checked above).
        unsafe { sys::cuMemsetD32Async(word.ptr, v, 1, self.raw).result() }
    }

    /// Starts capturing into a graph. Relaxed mode: NCCL and other threads' capture-unsafe
    /// calls must not invalidate this capture.
    pub fn begin_capture(&self) -> Result<(), DriverError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: the stream is alive.
        unsafe {
            result::stream::begin_capture(
                self.raw,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        }
    }

    /// Ends the capture and instantiates the graph, uploaded and ready to launch.
    pub fn end_capture(&self) -> Result<Graph, DriverError> {
        // SAFETY: capture was begun on this stream.
        let graph = unsafe { result::stream::end_capture(self.raw) }?;
        // SAFETY: graph is a valid captured graph; it is destroyed once instantiated.
        let exec = unsafe {
            let exec = result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0));
            let _ = result::graph::destroy(graph);
            exec?
        };
        let g = Graph {
            exec,
            ctx: self.ctx.clone(),
        };
        // SAFETY: exec and stream are alive.
        unsafe { result::graph::upload(g.exec, self.raw) }?;
        Ok(g)
    }

    /// Abandons a capture after an error so the stream is usable again.
    pub fn abort_capture(&self) {
        // SAFETY: ending a capture that may or may not be active is harmless.
        unsafe {
            if let Ok(g) = result::stream::end_capture(self.raw) {
                if !g.is_null() {
                    let _ = result::graph::destroy(g);
                }
            }
        }
    }
}

impl Drop for Stream {
    /// Waits (bounded) for queued work, then destroys the stream; a stream still busy after
    /// the drain deadline (a stuck GPU) poisons the context and is left alone rather than
    /// waited for for ever.
    fn drop(&mut self) {
        if self.ctx.poisoned().is_some() {
            return;
        }
        match self.wait(watchdog::DRAIN_DEADLINE) {
            // SAFETY: created above, idle, and destroyed once.
            Ok(()) => drop(unsafe { result::stream::destroy(self.raw) }),
            Err(w) => drop(
                self.ctx
                    .expired(w, "a stream's work, waited for before destroying it"),
            ),
        }
    }
}

/// An instantiated CUDA graph.
pub struct Graph {
    exec: sys::CUgraphExec,
    ctx: Arc<Ctx>,
}

impl Graph {
    pub fn launch(&self, stream: &Stream) -> Result<(), DriverError> {
        // SAFETY: both alive; the caller binds the context.
        unsafe { result::graph::launch(self.exec, stream.raw) }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.ctx.poisoned().is_none() && self.ctx.bind_to_thread().is_ok() {
            // SAFETY: instantiated above and destroyed once.
            let _ = unsafe { result::graph::exec_destroy(self.exec) };
        }
    }
}

/// A timing event.
pub struct Event {
    raw: sys::CUevent,
    ctx: Arc<Ctx>,
}

impl Event {
    pub fn new(ctx: &Arc<Ctx>) -> Result<Event, DriverError> {
        ctx.bind_to_thread()?;
        let raw = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)?;
        Ok(Event {
            raw,
            ctx: ctx.clone(),
        })
    }

    pub fn record(&self, stream: &Stream) -> Result<(), DriverError> {
        // SAFETY: both alive.
        unsafe { result::event::record(self.raw, stream.raw) }
    }

    /// Whether the work before the event's record has finished (cuEventQuery).
    pub fn query(&self) -> Poll {
        // SAFETY: the event is alive.
        poll(unsafe { result::event::query(self.raw) })
    }

    /// Waits for the event by polling, up to `limit`.
    pub fn wait(&self, limit: Duration) -> Result<(), Waited> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Waited::Failed(e.to_string()))?;
        watchdog::wait_real(limit, || self.query())
    }

    /// [`Event::wait`] for work of no backend; see [`Stream::finish`].
    pub fn finish(&self, limit: Duration, what: &str) -> Result<(), FabricError> {
        self.wait(limit).map_err(|w| self.ctx.expired(w, what))
    }

    /// Milliseconds from `self` to `end`; both must have completed (see [`Event::wait`]).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, DriverError> {
        // SAFETY: both alive, recorded and completed.
        unsafe { result::event::elapsed(self.raw, end.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.ctx.poisoned().is_none() && self.ctx.bind_to_thread().is_ok() {
            // SAFETY: created above and destroyed once.
            let _ = unsafe { result::event::destroy(self.raw) };
        }
    }
}

pub use super::device::{cuda_version, device_facts, p2p_matrix, visible_bus_ids, DeviceFacts};

/// Free bytes on the context's device.
pub fn free_bytes(ctx: &Ctx) -> Result<u64, DriverError> {
    ctx.bind_to_thread()?;
    Ok(result::mem_get_info()?.0 as u64)
}

#[cfg(test)]
mod tests;

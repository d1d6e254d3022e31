//! Thin owners of CUDA driver objects (memory, streams, events, graphs, modules). Every call
//! that can fail returns a `FabricError`; nothing here panics, and dropping releases the
//! object with its context bound.

use std::ffi::{c_void, CString};
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, DriverError};

use super::watchdog::{self, Poll, Waited};
use crate::fabric::FabricError;

/// What to do after the driver or a GPU failed.
pub const DEVICE_HINT: &str =
    "check the GPUs with `nvidia-smi` and the kernel log (`dmesg`) for Xid errors, then run again";

/// Maps a driver failure to a device error that names what was being done and what to do.
pub fn dev<T>(r: Result<T, DriverError>, what: &str) -> Result<T, FabricError> {
    r.map_err(|e| FabricError::Device(format!("{what} failed: {e}; {DEVICE_HINT}")))
}

/// Maps the end of a wait on work that belongs to no backend (a copy, a probe) to a device
/// error: there is nothing to disqualify, so a hang ends the run.
pub fn wait_dev(r: Result<(), Waited>, what: &str) -> Result<(), FabricError> {
    r.map_err(|w| match w {
        Waited::Expired(t) => FabricError::Device(format!(
            "{what} did not finish within {:.0} s: the GPU may be stuck; reset it (`nvidia-smi -r`, or reboot) and run again",
            t.as_secs_f64()
        )),
        Waited::Failed(e) => FabricError::Device(format!("{what} failed: {e}; {DEVICE_HINT}")),
    })
}

/// Waits for everything queued on `ctx`, including the legacy-stream work of synchronous
/// fills (cuCtxSynchronize can only block, so it runs on a helper thread under a deadline).
pub fn sync_ctx(ctx: &Arc<CudaContext>, what: &str) -> Result<(), FabricError> {
    let c = ctx.clone();
    let limit = watchdog::OP_DEADLINE;
    match watchdog::bounded(limit, move || {
        c.bind_to_thread()?;
        c.synchronize()
    }) {
        Some(r) => dev(r, what),
        None => wait_dev(Err(Waited::Expired(limit)), what),
    }
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

/// Plain `cuMemAlloc` memory: exportable through IPC, unlike stream-ordered pool memory.
pub struct DevBuf {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: a device pointer is a plain number; the driver allows freeing it from any thread
// once the owning context is bound, which Drop does.
unsafe impl Send for DevBuf {}
unsafe impl Sync for DevBuf {}

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

impl DevBuf {
    pub fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DevBuf, DriverError> {
        let bytes = whole_pages(bytes);
        ctx.bind_to_thread()?;
        // SAFETY: plain allocation; contents are set by the caller before use.
        let ptr = unsafe { result::malloc_sync(bytes.max(16)) }?;
        Ok(DevBuf {
            ptr,
            bytes,
            ctx: ctx.clone(),
        })
    }

    /// Synchronous byte fill.
    pub fn fill(&self, byte: u8) -> Result<(), DriverError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: the range lies inside this allocation.
        unsafe { result::memset_d8_sync(self.ptr, byte, self.bytes) }
    }

    /// Bounds-checked synchronous upload (see [`Span::upload`]).
    pub fn upload(&self, offset: usize, data: &[u8]) -> Result<(), DriverError> {
        self.ctx.bind_to_thread()?;
        self.span().upload(offset, data)
    }

    /// Bounds-checked synchronous download (see [`Span::download`]).
    pub fn download(&self, offset: usize, out: &mut [u8]) -> Result<(), DriverError> {
        self.ctx.bind_to_thread()?;
        self.span().download(offset, out)
    }
}

impl DevBuf {
    /// The buffer as a bounds-checked span.
    pub fn span(&self) -> Span {
        Span {
            ptr: self.ptr,
            bytes: self.bytes,
        }
    }

    /// An IPC handle another process opens with [`Imported::open`] (cuIpcGetMemHandle; the
    /// buffer came from plain cuMemAlloc, which IPC accepts).
    pub fn export(&self) -> Result<IpcHandle, DriverError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: zeroed bytes are a valid handle to fill in; ptr is this allocation's base.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        unsafe { sys::cuIpcGetMemHandle(&mut h, self.ptr).result() }?;
        Ok(IpcHandle {
            hex: h
                .reserved
                .iter()
                .map(|b| format!("{:02x}", *b as u8))
                .collect(),
            bytes: self.bytes as u64,
        })
    }
}

/// A device range in this process's address space (own or opened by IPC), with its length:
/// every copy into or out of it is checked against the length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
}

impl Span {
    /// No memory: the place of a peer's buffer this GPU could not open, never launched on.
    pub const NONE: Span = Span { ptr: 0, bytes: 0 };

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
        // SAFETY: the range lies inside the span (checked above).
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

/// A cuIpcGetMemHandle handle in hex, with the size of the buffer it names.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IpcHandle {
    pub hex: String,
    pub bytes: u64,
}

/// Another process's buffer opened through its IPC handle; closed on drop (before the owner
/// frees it: the coordinator releases importers first).
pub struct Imported {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: as DevBuf.
unsafe impl Send for Imported {}
unsafe impl Sync for Imported {}

/// Why an IPC handle could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum IpcError {
    #[error("the handle is not 64 bytes of hex")]
    Malformed,
    #[error("cuIpcOpenMemHandle failed: {0}")]
    Open(DriverError),
}

impl Imported {
    pub fn open(ctx: &Arc<CudaContext>, h: &IpcHandle) -> Result<Imported, IpcError> {
        let raw = h.hex.as_bytes();
        if raw.len() != 128 {
            return Err(IpcError::Malformed);
        }
        // SAFETY: zeroed bytes are a valid handle to fill in.
        let mut handle: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        for (i, pair) in raw.chunks(2).enumerate() {
            let s = std::str::from_utf8(pair).map_err(|_| IpcError::Malformed)?;
            handle.reserved[i] =
                u8::from_str_radix(s, 16).map_err(|_| IpcError::Malformed)? as std::ffi::c_char;
        }
        ctx.bind_to_thread().map_err(IpcError::Open)?;
        let mut ptr = 0;
        let lazy = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: a handle exported by cuIpcGetMemHandle in another process; out-pointer valid.
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, lazy).result() }
            .map_err(IpcError::Open)?;
        Ok(Imported {
            ptr,
            bytes: h.bytes as usize,
            ctx: ctx.clone(),
        })
    }

    pub fn span(&self) -> Span {
        Span {
            ptr: self.ptr,
            bytes: self.bytes,
        }
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: opened above and closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr).result() };
        }
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemAlloc above and freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// A non-blocking stream.
pub struct Stream {
    pub raw: sys::CUstream,
    ctx: Arc<CudaContext>,
}

// SAFETY: CUDA streams may be used from any thread with their context bound.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Stream, DriverError> {
        ctx.bind_to_thread()?;
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)?;
        Ok(Stream {
            raw,
            ctx: ctx.clone(),
        })
    }

    pub fn ctx(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Whether everything queued on the stream has finished (cuStreamQuery).
    pub fn query(&self) -> Poll {
        // SAFETY: the stream is alive.
        poll(unsafe { sys::cuStreamQuery(self.raw).result() })
    }

    /// Waits for the stream's work by polling, up to `limit`.
    pub fn wait(&self, limit: std::time::Duration) -> Result<(), Waited> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Waited::Failed(e.to_string()))?;
        watchdog::wait_real(limit, || self.query())
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
    /// the drain deadline (a stuck GPU) is left alone rather than waited for for ever.
    fn drop(&mut self) {
        if self.wait(watchdog::DRAIN_DEADLINE).is_ok() {
            // SAFETY: created above, idle, and destroyed once.
            let _ = unsafe { result::stream::destroy(self.raw) };
        }
    }
}

/// An instantiated CUDA graph.
pub struct Graph {
    exec: sys::CUgraphExec,
    ctx: Arc<CudaContext>,
}

// SAFETY: graph execs may be launched from any thread with their context bound.
unsafe impl Send for Graph {}
unsafe impl Sync for Graph {}

impl Graph {
    pub fn launch(&self, stream: &Stream) -> Result<(), DriverError> {
        // SAFETY: both alive; the caller binds the context.
        unsafe { result::graph::launch(self.exec, stream.raw) }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: instantiated above and destroyed once.
            let _ = unsafe { result::graph::exec_destroy(self.exec) };
        }
    }
}

/// A timing event.
pub struct Event {
    raw: sys::CUevent,
    ctx: Arc<CudaContext>,
}

// SAFETY: events may be recorded and queried from any thread with their context bound.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Event, DriverError> {
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
    pub fn wait(&self, limit: std::time::Duration) -> Result<(), Waited> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Waited::Failed(e.to_string()))?;
        watchdog::wait_real(limit, || self.query())
    }

    /// Milliseconds from `self` to `end`; both must have completed (see [`Event::wait`]).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, DriverError> {
        // SAFETY: both alive, recorded and completed.
        unsafe { result::event::elapsed(self.raw, end.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: created above and destroyed once.
            let _ = unsafe { result::event::destroy(self.raw) };
        }
    }
}

/// A loaded module and the functions taken from it.
pub struct Module {
    raw: sys::CUmodule,
    ctx: Arc<CudaContext>,
}

// SAFETY: modules and their functions are usable from any thread with the context bound.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl Module {
    /// Loads a cubin or NUL-terminated PTX image.
    pub fn load(ctx: &Arc<CudaContext>, image: &[u8]) -> Result<Module, DriverError> {
        ctx.bind_to_thread()?;
        // SAFETY: image is a complete cubin or NUL-terminated PTX produced by NVRTC.
        let raw = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }?;
        Ok(Module {
            raw,
            ctx: ctx.clone(),
        })
    }

    pub fn function(&self, name: &str) -> Result<Function, FabricError> {
        let cname = CString::new(name)
            .map_err(|_| FabricError::Device(format!("kernel name `{name}` contains NUL")))?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| FabricError::Device(format!("binding the CUDA context failed: {e}")))?;
        // SAFETY: the module is loaded; the function lives as long as the module (kept by
        // the owner of both).
        let raw = unsafe { result::module::get_function(self.raw, cname) }.map_err(|e| {
            FabricError::Device(format!("kernel `{name}` is missing from the module: {e}"))
        })?;
        Ok(Function { raw })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: loaded above and unloaded once.
            let _ = unsafe { result::module::unload(self.raw) };
        }
    }
}

/// A kernel in a loaded module; valid while the module is.
#[derive(Clone, Copy)]
pub struct Function {
    pub raw: sys::CUfunction,
}

// SAFETY: a CUfunction handle is immutable and usable from any thread.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

impl Function {
    /// Launches with a single by-value argument struct `args`.
    ///
    /// # Safety
    /// The kernel takes exactly one parameter of type `A`, and every pointer in `args` names
    /// memory that holds what the kernel reads and writes until it has finished.
    pub unsafe fn launch<A>(
        &self,
        grid: (u32, u32),
        block: u32,
        stream: &Stream,
        args: &A,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_with(grid, block, stream, args, false) }
    }

    /// `launch`, optionally as a programmatic dependent launch (compute capability 9.0 and
    /// later): the grid may be scheduled while the previous kernel in the stream drains, and
    /// waits in `griddepcontrol.wait` (kernels/common.cuh, pdl_wait) until that kernel has
    /// finished and its memory is visible. It hides the gap between back-to-back launches.
    ///
    /// # Safety
    /// As [`Function::launch`].
    pub unsafe fn launch_with<A>(
        &self,
        grid: (u32, u32),
        block: u32,
        stream: &Stream,
        args: &A,
        pdl: bool,
    ) -> Result<(), DriverError> {
        // The kernel takes exactly one parameter of type A (layouts mirrored in the CUDA
        // sources); the driver copies it before returning.
        let mut params = [args as *const A as *mut c_void];
        if !pdl {
            // SAFETY: the caller's contract; `params` points at one A.
            return unsafe { self.launch_raw(grid, block, stream, &mut params) };
        }
        // SAFETY: a zeroed attribute is valid; the union field set is the one its id names.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: stream.raw,
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: `params` as above; `config` and `attr` outlive the call.
        unsafe {
            sys::cuLaunchKernelEx(&config, self.raw, params.as_mut_ptr(), std::ptr::null_mut())
                .result()
        }
    }

    /// Launches with raw parameter pointers.
    ///
    /// # Safety
    /// `params` matches the kernel's signature, each entry pointing at one argument, and the
    /// memory the arguments name stays valid until the kernel has finished.
    pub unsafe fn launch_raw(
        &self,
        grid: (u32, u32),
        block: u32,
        stream: &Stream,
        params: &mut [*mut c_void],
    ) -> Result<(), DriverError> {
        // SAFETY: the caller matches `params` to the kernel's signature.
        unsafe {
            sys::cuLaunchKernel(
                self.raw,
                grid.0,
                grid.1,
                1,
                block,
                1,
                1,
                0,
                stream.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()
        }
    }

    /// Blocks of `threads` that fit on one multiprocessor at once.
    pub fn blocks_per_sm(&self, threads: u32) -> Result<u32, DriverError> {
        let mut n: i32 = 0;
        // SAFETY: valid function handle.
        unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, self.raw, threads as i32, 0)
                .result()
        }?;
        Ok(n.max(0) as u32)
    }
}

pub use super::device::{
    cuda_version, device_facts, free_bytes, p2p_matrix, visible_bus_ids, DeviceFacts,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_are_whole_large_pages_small_ones_are_left_alone() {
        assert_eq!(whole_pages(4096), 4096);
        assert_eq!(whole_pages(LARGE_PAGE - 1), LARGE_PAGE - 1);
        assert_eq!(whole_pages(LARGE_PAGE), LARGE_PAGE);
        // A 64 MiB message plus its guard bytes: the page the guard spills into is whole.
        assert_eq!(whole_pages((64 << 20) + 4096), 66 << 20);
    }
}

//! The copy-engine executor ([`Executor::CopyEngine`](crate::allreduce::Executor)) on real
//! GPUs: a call's copy plan (copy_plan/) becomes copy-engine copies between the IPC-mapped
//! buffers, the SM sum of kernels/ce_sum.cu and stream memory operations on IPC-mapped flags
//! ([`steps`]), all queued on the worker's stream, so a CUDA graph captures them as nodes.

pub mod steps;
pub mod watch;

use std::ops::Range;

use cudarc::driver::sys;

use self::steps::{Addrs, Enqueue, Step};
use super::copy_plan;
use super::driver::Function;
use super::kernels;
use super::layout::{ArArgs, CeSumArgs, MAX_RANKS, THREADS};
use crate::allreduce::Ranks;
use crate::fabric::{Backend, Dtype, FabricError};

/// The environment variable that turns the executor on.
pub use crate::allreduce::COPY_ENGINE_SWITCH as SWITCH;

/// Whether this fabric runs copy-engine backends ([`crate::allreduce::copy_engines_on`]).
pub fn runs() -> bool {
    crate::allreduce::copy_engines_on()
}

/// Why it does not, for the waiver a tune records.
pub const SWITCHED_OFF: &str = "copy-engine backends are switched off by ARTUNE_COPY_ENGINE=0; \
                                unset it to run them";

/// One call of a copy-engine backend for the ranks `local` of a group of `ranks`, `elems`
/// elements each.
#[derive(Debug, Clone)]
pub struct Call {
    pub backend: Backend,
    pub dtype: Dtype,
    pub elems: u64,
    pub ranks: Ranks,
    pub local: Range<usize>,
    /// Largest message the buffers were allocated for, padded as at setup.
    pub max_bytes: u64,
    /// A rank of `local` whose calls are left out: a peer that never arrives (the fault knob's
    /// `absent`, for testing the recovery).
    pub absent: Option<usize>,
    /// Where an op's watchdog looks (super::watch): the device addresses of its words.
    pub watch: Option<watch::Words>,
}

/// Where the buffers `args` names lie, with the backend's scratch entries.
pub fn addrs(call: &Call, args: &ArArgs) -> Addrs {
    let n = call.ranks.n.min(MAX_RANKS);
    Addrs {
        src: args.src[..n].to_vec(),
        dst: args.dst[..n].to_vec(),
        input: args.input[..n].to_vec(),
        scratch: args.scratch[..n].to_vec(),
        sig: args.sig[..n].to_vec(),
        entries: kernels::scratch_entries(call.backend, call.max_bytes, call.ranks),
        elem: call.dtype.size(),
    }
}

/// The calls the stream runs for `call` over the buffers of `args`.
pub fn call_steps(call: &Call, args: &ArArgs) -> Result<Vec<Step>, FabricError> {
    let plan = copy_plan::plan(call.backend, call.ranks, call.elems);
    let local: Vec<usize> = call
        .local
        .clone()
        .filter(|&r| Some(r) != call.absent)
        .collect();
    let s =
        steps::steps(&plan, call.ranks, call.elems, &local, &addrs(call, args)).map_err(|e| {
            FabricError::Backend {
                backend: call.backend,
                reason: format!("its copy plan cannot run: {e}"),
            }
        })?;
    Ok(match call.watch {
        Some(w) => w.around(s),
        None => s,
    })
}

/// The driver, queuing on one stream.
struct Driver<'a> {
    stream: sys::CUstream,
    sum: &'a Function,
    dtype: Dtype,
    /// Most blocks a sum takes.
    cap: u32,
    /// The host's fault word the guard sets (0: none).
    fault: u64,
}

impl Enqueue for Driver<'_> {
    type Error = String;

    unsafe fn copy(&mut self, dst: u64, src: u64, bytes: u64) -> Result<(), String> {
        // SAFETY: the caller's contract (Enqueue::copy).
        let r = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes as usize, self.stream) };
        r.result()
            .map_err(|e| format!("cuMemcpyDtoDAsync failed: {e}"))
    }

    unsafe fn sum(&mut self, inputs: &[u64], out: u64, elems: u64) -> Result<(), String> {
        let mut a = CeSumArgs {
            out,
            n: elems,
            count: inputs.len() as i32,
            ..CeSumArgs::default()
        };
        a.inputs[..inputs.len()].copy_from_slice(inputs);
        let vectors = elems.div_ceil(16 / self.dtype.size());
        let blocks = vectors.div_ceil(THREADS as u64).clamp(1, self.cap as u64) as u32;
        // SAFETY: ce_sum_<dtype> takes one CeSumArgs; the memory is the caller's contract.
        unsafe {
            self.sum
                .launch_on((blocks, 1), THREADS, self.stream, &a, false)
        }
        .map_err(|e| format!("launching the sum failed: {e}"))
    }

    unsafe fn guard(&mut self, status: u64, out: u64, elems: u64) -> Result<(), String> {
        let a = CeSumArgs {
            out,
            n: elems,
            status,
            fault: self.fault,
            ..CeSumArgs::default()
        };
        // SAFETY: as in `sum`; one block reads the status and, on a fault only, writes `out`.
        unsafe { self.sum.launch_on((1, 1), THREADS, self.stream, &a, false) }
            .map_err(|e| format!("launching the guard failed: {e}"))
    }

    unsafe fn wait_eq(&mut self, addr: u64, value: u32) -> Result<(), String> {
        let eq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32;
        // SAFETY: the caller's contract (Enqueue::wait_eq).
        let r = unsafe { sys::cuStreamWaitValue32_v2(self.stream, addr, value, eq) };
        r.result()
            .map_err(|e| format!("cuStreamWaitValue32 failed: {e}"))
    }

    unsafe fn write(&mut self, addr: u64, value: u32) -> Result<(), String> {
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // SAFETY: the caller's contract (Enqueue::write).
        let r = unsafe { sys::cuStreamWriteValue32_v2(self.stream, addr, value, flags) };
        r.result()
            .map_err(|e| format!("cuStreamWriteValue32 failed: {e}"))
    }
}

/// Queues `call` on `stream`: its copies, sums and flags.
///
/// # Safety
/// `args` names every rank's buffers of `call.backend`, allocated for `call.max_bytes` and
/// mapped in this process, alive until the stream has run the call; `stream` is a live stream
/// of the context `gpu` was loaded in.
pub unsafe fn launch(
    call: &Call,
    args: &ArArgs,
    gpu: &kernels::GpuKernels,
    sms: u32,
    stream: sys::CUstream,
) -> Result<(), FabricError> {
    let backend = call.backend;
    let sum = gpu
        .copy_sum(backend, call.dtype)
        .ok_or_else(|| FabricError::Backend {
            backend,
            reason: "its sum kernel (kernels/ce_sum.cu) was not loaded".into(),
        })?;
    let steps = call_steps(call, args)?;
    let mut q = Driver {
        stream,
        sum,
        dtype: call.dtype,
        cap: sms.max(1) * 2,
        fault: args.fault,
    };
    // SAFETY: the steps name only the buffers of `args` (the function's contract).
    unsafe { steps::enqueue(&steps, &mut q) }
        .map_err(|reason| FabricError::Backend { backend, reason })
}

#[cfg(test)]
mod tests;

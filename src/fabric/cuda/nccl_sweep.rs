//! One rank of a short allreduce sweep through NCCL, in a process of its own (`artune
//! __nccl-rank`, started by `check --nccl-audit`): the environment it was started with decides
//! which tuner and profiler NCCL loads, so nothing here touches it. Each size is called a few
//! times and timed on the host around a synchronized stream; what NCCL ran is the profiler's to
//! record.

use std::ffi::c_int;
use std::time::{Duration, Instant};

use super::driver::{Ctx, DevBuf, Stream};
use super::nccl::{self, Comms};
use crate::fabric::Dtype;

/// What one rank runs.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub id_hex: String,
    pub rank: usize,
    pub nranks: usize,
    pub ordinal: usize,
    /// Message sizes in bytes (even: bf16).
    pub sizes: Vec<u64>,
    /// Timed calls per size, after one untimed.
    pub iters: usize,
    pub max_ctas: Option<c_int>,
    /// Run-time channels forced on the communicator; None: NCCL's own count.
    pub channels: Option<c_int>,
}

/// Setup and each call are bounded: a hang ends in an abort and an error, never a stuck rank.
const LIMIT: Duration = Duration::from_secs(60);

/// Runs the sweep; returns the mean host time per call of each size in microseconds.
pub fn run(s: &Sweep) -> Result<Vec<(u64, f64)>, String> {
    let lib = nccl::library()?;
    let largest = s.sizes.iter().copied().max().unwrap_or(2).max(2) as usize;
    let ctx = Ctx::new(s.ordinal).map_err(|e| format!("CUDA context on GPU {}: {e}", s.ordinal))?;
    let alloc = |what| DevBuf::alloc(&ctx, largest).map_err(|e| format!("{what} buffer: {e}"));
    let (send, recv) = (alloc("send")?, alloc("receive")?);
    send.fill(0).map_err(|e| e.to_string())?;
    let stream = Stream::new(&ctx).map_err(|e| e.to_string())?;
    let ctas = nccl::Ctas::of(s.channels, s.max_ctas);
    let comms = Comms::init_rank_ctas(lib, &s.id_hex, s.rank, s.nranks, LIMIT, ctas)?;
    let mut times = Vec::with_capacity(s.sizes.len());
    for &bytes in &s.sizes {
        let count = (bytes / 2) as usize;
        let call = || {
            // SAFETY: both buffers hold the largest size; the stream is this context's.
            unsafe {
                comms.all_reduce(
                    0,
                    send.ptr(),
                    recv.ptr(),
                    count,
                    Dtype::Bf16,
                    stream.raw as *mut _,
                    LIMIT,
                )
            }
            .map_err(|w| format!("ncclAllReduce of {bytes} bytes: {w:?}"))
        };
        call()?;
        stream
            .wait(LIMIT)
            .map_err(|w| format!("{bytes} bytes: {w:?}"))?;
        let t = Instant::now();
        for _ in 0..s.iters {
            call()?;
        }
        stream
            .wait(LIMIT)
            .map_err(|w| format!("{bytes} bytes: {w:?}"))?;
        times.push((
            bytes,
            t.elapsed().as_secs_f64() * 1e6 / s.iters.max(1) as f64,
        ));
    }
    // Finalized and destroyed here: NCCL finalizes the profiler, which writes its summary.
    drop(comms);
    Ok(times)
}

//! One rank of a short allreduce sweep through NCCL, in a process of its own (`artune
//! __nccl-rank`, started by `check --nccl-audit`): the environment it was started with decides
//! which tuner and profiler NCCL loads, so nothing here touches it. Each size is called a few
//! times and timed on the host around a synchronized stream; what NCCL ran is the profiler's to
//! record.

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::driver::{Ctx, DevBuf, Stream};
use super::nccl::{self, Comms};
use crate::fabric::Dtype;

/// What one rank runs.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// One NCCL unique id per communicator (its bootstrap root serves one initialisation).
    pub ids: Vec<String>,
    pub rank: usize,
    pub nranks: usize,
    pub ordinal: usize,
    /// Message sizes in bytes (even: bf16).
    pub sizes: Vec<u64>,
    /// Timed calls per size, after one untimed.
    pub iters: usize,
    pub max_ctas: Option<c_int>,
    /// The communicators made in turn (one per id), each timing every size: the run-time
    /// channels forced on it (`minCTAs` = `maxCTAs`), None for NCCL's own count. One process
    /// for them all, so a channel sweep starts its ranks once per pin, not once per count.
    pub channels: Vec<Option<c_int>>,
    /// Where rank 0's profiler writes its summaries (the audit directory): after a
    /// communicator with a forced count rank 0 files them under [`count_dir`], so each count's
    /// read-back is its own; NCCL's own count's stay where the audit reads them.
    pub summaries: Option<PathBuf>,
}

/// The folder of `dir` holding rank 0's profiler summaries of the communicator forced to
/// `channels`.
pub fn count_dir(dir: &Path, channels: c_int) -> PathBuf {
    dir.join(format!("c{channels}"))
}

/// Setup and each call are bounded: a hang ends in an abort and an error, never a stuck rank.
const LIMIT: Duration = Duration::from_secs(60);

/// One communicator's times: its forced count (None: NCCL's own) and (bytes, µs) per size.
pub type CommTimes = (Option<c_int>, Vec<(u64, f64)>);

/// Runs the sweep; returns, per communicator in turn (its forced count), the mean host time
/// per call of each size in microseconds.
pub fn run(s: &Sweep) -> Result<Vec<CommTimes>, String> {
    let lib = nccl::library()?;
    let largest = s.sizes.iter().copied().max().unwrap_or(2).max(2) as usize;
    let ctx = Ctx::new(s.ordinal).map_err(|e| format!("CUDA context on GPU {}: {e}", s.ordinal))?;
    let alloc = |what| DevBuf::alloc(&ctx, largest).map_err(|e| format!("{what} buffer: {e}"));
    let (send, recv) = (alloc("send")?, alloc("receive")?);
    send.fill(0).map_err(|e| e.to_string())?;
    let stream = Stream::new(&ctx).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(s.channels.len());
    if s.ids.len() != s.channels.len() {
        return Err(format!(
            "{} ids for {} communicators",
            s.ids.len(),
            s.channels.len()
        ));
    }
    for (id, &forced) in s.ids.iter().zip(&s.channels) {
        let ctas = nccl::Ctas::of(forced, s.max_ctas);
        let comms = Comms::init_rank_ctas(lib, id, s.rank, s.nranks, LIMIT, ctas)?;
        out.push((forced, time_sizes(s, &comms, &send, &recv, &stream)?));
        // Finalized and destroyed here: NCCL finalizes the profiler, which writes its summary.
        drop(comms);
        if let (0, Some(dir), Some(c)) = (s.rank, &s.summaries, forced) {
            file_summaries(dir, &count_dir(dir, c))?;
        }
    }
    Ok(out)
}

/// Every size of the sweep on one communicator.
fn time_sizes(
    s: &Sweep,
    comms: &Comms,
    send: &DevBuf,
    recv: &DevBuf,
    stream: &Stream,
) -> Result<Vec<(u64, f64)>, String> {
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
    Ok(times)
}

/// Moves rank 0's summaries (`*-r0.json`, written by this process alone) from `dir` into `to`.
fn file_summaries(dir: &Path, to: &Path) -> Result<(), String> {
    let err = |e: std::io::Error| format!("cannot file the profiler's summaries: {e}");
    std::fs::create_dir_all(to).map_err(err)?;
    for e in std::fs::read_dir(dir).map_err(err)?.flatten() {
        let name = e.file_name();
        if name.to_string_lossy().ends_with("-r0.json") {
            std::fs::rename(e.path(), to.join(&name)).map_err(err)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After each forced count, rank 0 files its own summaries (and no other rank's) under the
    /// count's folder, where the fabric reads that count's channels back.
    #[test]
    fn rank_0_files_its_summaries_per_count_and_leaves_the_others() {
        let d = tempfile::tempdir().unwrap();
        for name in ["audit-1-00aa-r0.json", "audit-2-00aa-r1.json"] {
            std::fs::write(d.path().join(name), "{}").unwrap();
        }
        file_summaries(d.path(), &count_dir(d.path(), 4)).unwrap();
        assert!(d.path().join("c4/audit-1-00aa-r0.json").exists());
        assert!(d.path().join("audit-2-00aa-r1.json").exists());
        assert!(!d.path().join("audit-1-00aa-r0.json").exists());
    }
}

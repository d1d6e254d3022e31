//! One rank of a short allreduce sweep through NCCL, in a process of its own (`artune
//! __nccl-rank`, started by `check --nccl-audit` and the CUDA fabric's K-rank timings): the
//! environment it was started with decides which tuner and profiler NCCL loads; where it is
//! given variants, it switches NCCL between them through that tuner's override
//! ([`super::nccl_ranks::switch`]). Each size is timed in samples, each a batch of calls (host-launched, or one
//! replay of a CUDA graph holding the batch) timed on the host around a synchronized stream,
//! and its sum checked against every rank's known input first; what NCCL ran is the
//! profiler's to record.

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::driver::{Ctx, DevBuf, Stream};
use super::nccl::{self, Comms};
use super::nccl_ranks::switch::Switch;
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
    /// Calls per sample (the batch a graph holds), after one untimed call.
    pub iters: usize,
    /// Samples per size: the spread the tune's intervals are made of.
    pub samples: usize,
    /// Each sample replays a CUDA graph of the batch, as an engine's graph mode does.
    pub graph: bool,
    pub max_ctas: Option<c_int>,
    /// The communicators made in turn (one per id), each timing every size: the run-time
    /// channels forced, None for NCCL's own count. With `variants` the count is set per call
    /// through the tuner's override, as the plugin sets a profile's count (NCCL may run fewer
    /// for a small message, per call as it will under the plugin); without, on the
    /// communicator (`minCTAs` = `maxCTAs`). One process for them all, so a channel sweep
    /// starts its ranks once, not once per count.
    pub channels: Vec<Option<c_int>>,
    /// The NCCL variants each communicator runs in turn, each switched to through the tuner's
    /// measurement override before its calls ([`super::nccl_ranks::switch`]); empty: one run,
    /// whatever the environment pins.
    pub variants: Vec<crate::allreduce::Backend>,
    /// Where rank 0's profiler writes its summaries (the audit directory): after a
    /// communicator with a forced count rank 0 files them under [`count_dir`], so each count's
    /// read-back is its own; NCCL's own count's stay where the audit reads them.
    pub summaries: Option<PathBuf>,
    /// Where the times so far are written after each communicator's calls and before its
    /// teardown (`CHANNELS BYTES US...`, [`super::nccl_ranks::parse_times`]): a teardown
    /// that hangs (torch's under MPS did, 2026-12-05) loses no time, and the caller can stop
    /// the ranks once every line is there.
    pub times: Option<PathBuf>,
}

/// The folder of `dir` holding rank 0's profiler summaries of the communicator forced to
/// `channels`.
pub fn count_dir(dir: &Path, channels: c_int) -> PathBuf {
    dir.join(format!("c{channels}"))
}

/// Setup and each call are bounded: a hang ends in an abort and an error, never a stuck rank.
const LIMIT: Duration = Duration::from_secs(60);

/// One run of the sizes on one communicator.
#[derive(Debug, Clone, PartialEq)]
pub struct CommTimes {
    /// The count forced on the communicator; None: NCCL's own.
    pub channels: Option<c_int>,
    /// The variant the tuner's override switched to; None: the environment's.
    pub variant: Option<crate::allreduce::Backend>,
    /// Per size its bytes and samples (µs per call).
    pub sizes: Vec<(u64, Vec<f64>)>,
}

/// Why a rank's sweep stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SweepError {
    /// NCCL's sum differs from the one every rank's input makes.
    WrongSum(String),
    /// Anything else: NCCL, CUDA, a file.
    Failed(String),
}

impl From<String> for SweepError {
    fn from(s: String) -> SweepError {
        SweepError::Failed(s)
    }
}

impl std::fmt::Display for SweepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SweepError::WrongSum(s) | SweepError::Failed(s) => f.write_str(s),
        }
    }
}

/// Runs the sweep; returns, per communicator in turn (its forced count) and variant, each
/// size's samples of the host time per call in microseconds.
pub fn run(s: &Sweep) -> Result<Vec<CommTimes>, SweepError> {
    let lib = nccl::library()?;
    let switch = match s.variants.is_empty() {
        true => None,
        false => Some(Switch::from_env()?),
    };
    let runs: Vec<Option<crate::allreduce::Backend>> = match &switch {
        None => vec![None],
        Some(_) => s.variants.iter().copied().map(Some).collect(),
    };
    let largest = s.sizes.iter().copied().max().unwrap_or(2).max(2) as usize;
    let ctx = Ctx::new(s.ordinal).map_err(|e| format!("CUDA context on GPU {}: {e}", s.ordinal))?;
    let alloc = |what| DevBuf::alloc(&ctx, largest).map_err(|e| format!("{what} buffer: {e}"));
    let (send, recv) = (alloc("send")?, alloc("receive")?);
    send.upload(0, &input(s.rank, largest / 2))
        .map_err(|e| format!("the input: {e}"))?;
    let stream = Stream::new(&ctx).map_err(|e| e.to_string())?;
    settle(&stream)?;
    let mut out = Vec::with_capacity(s.channels.len());
    if s.ids.len() != s.channels.len() {
        return Err(format!("{} ids for {} communicators", s.ids.len(), s.channels.len()).into());
    }
    for (id, &forced) in s.ids.iter().zip(&s.channels) {
        // With the tuner's switch the count goes per call, as the plugin sets a profile's.
        let (on_comm, per_call) = match switch {
            Some(_) => (None, forced),
            None => (forced, None),
        };
        let ctas = nccl::Ctas::of(on_comm, s.max_ctas);
        let comms = Comms::init_rank_ctas(lib, id, s.rank, s.nranks, LIMIT, ctas)?;
        for &variant in &runs {
            // Set before the variant's first call and capture (NCCL decides there); the
            // stream is idle, so no call of the variant before runs under it.
            if let (Some(sw), Some(v)) = (&switch, variant) {
                sw.set(v, per_call)?;
            }
            out.push(CommTimes {
                channels: forced,
                variant,
                sizes: time_sizes(s, &comms, &send, &recv, &stream)?,
            });
            if let Some(p) = &s.times {
                write_times(p, &out)?;
            }
        }
        if let Some(sw) = &switch {
            sw.set(crate::allreduce::Backend::Nccl, None)?;
        }
        // Finalized and destroyed here: NCCL finalizes the profiler, which writes its summary.
        drop(comms);
        if let (0, Some(dir), Some(c)) = (s.rank, &s.summaries, forced) {
            file_summaries(dir, &count_dir(dir, c))?;
        }
    }
    Ok(out)
}

/// Every size of the sweep on one communicator: one call whose sum is checked, then (in graph
/// mode) the batch captured, replayed once and checked again, then the samples.
fn time_sizes(
    s: &Sweep,
    comms: &Comms,
    send: &DevBuf,
    recv: &DevBuf,
    stream: &Stream,
) -> Result<Vec<(u64, Vec<f64>)>, SweepError> {
    let mut times = Vec::with_capacity(s.sizes.len());
    let waited = |bytes: u64| {
        stream
            .wait(LIMIT)
            .map_err(|w| format!("{bytes} bytes: {w:?}"))
    };
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
        let iters = s.iters.max(1);
        // The output poisoned (NaN) first, so a call that writes nothing is caught.
        let checked = |what: &str| -> Result<(), SweepError> {
            waited(bytes)?;
            let mut got = vec![0u8; count * 2];
            recv.download(0, &mut got)
                .map_err(|e| format!("reading the sum: {e}"))?;
            check_sum(&got, s.nranks)
                .map_err(|e| SweepError::WrongSum(format!("{what} of {bytes} bytes: {e}")))?;
            recv.fill(0xff).map_err(|e| e.to_string())?;
            settle(stream).map_err(SweepError::from)
        };
        recv.fill(0xff).map_err(|e| e.to_string())?;
        settle(stream)?;
        call()?;
        checked("ncclAllReduce")?;
        let graph = match s.graph {
            true => {
                let g = capture(stream, iters, &call)?;
                g.launch(stream)
                    .map_err(|e| format!("replaying the graph of {bytes} bytes: {e}"))?;
                checked("a replayed CUDA graph of ncclAllReduce")?;
                Some(g)
            }
            false => None,
        };
        let mut samples = Vec::with_capacity(s.samples.max(1));
        for _ in 0..s.samples.max(1) {
            let t = Instant::now();
            match &graph {
                Some(g) => g
                    .launch(stream)
                    .map_err(|e| format!("replaying the graph of {bytes} bytes: {e}"))?,
                None => (0..iters).try_for_each(|_| call())?,
            }
            waited(bytes)?;
            samples.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
        }
        times.push((bytes, samples));
    }
    Ok(times)
}

/// Waits for the context's copies and fills, which the driver may still run on the legacy
/// stream that a non-blocking stream's NCCL calls do not wait for.
fn settle(stream: &Stream) -> Result<(), String> {
    stream
        .ctx()
        .synchronize("the rank's buffers")
        .map_err(|e| e.to_string())
}

/// `iters` calls captured into one CUDA graph on `stream`.
fn capture(
    stream: &Stream,
    iters: usize,
    call: &dyn Fn() -> Result<(), String>,
) -> Result<super::driver::Graph, String> {
    stream
        .begin_capture()
        .map_err(|e| format!("starting a graph capture of ncclAllReduce: {e}"))?;
    if let Err(e) = (0..iters).try_for_each(|_| call()) {
        stream.abort_capture();
        return Err(format!("capturing ncclAllReduce: {e}"));
    }
    stream
        .end_capture()
        .map_err(|e| format!("instantiating the graph of ncclAllReduce: {e}"))
}

/// A rank's input element `i`: a small integer, so every sum of up to 16 ranks is exact in
/// bf16 whatever order NCCL adds in.
fn element(rank: usize, i: usize) -> u32 {
    ((i * 7 + rank * 3) % 5) as u32
}

/// Rank `rank`'s input of `count` bf16 elements, as bytes.
fn input(rank: usize, count: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|i| bf16(element(rank, i) as f32).to_le_bytes())
        .collect()
}

/// A value's bf16 bits (exact for the small integers [`element`] makes).
fn bf16(v: f32) -> u16 {
    (v.to_bits() >> 16) as u16
}

/// Whether `got` (bf16, as bytes) is the sum of every one of `nranks` ranks' [`input`].
fn check_sum(got: &[u8], nranks: usize) -> Result<(), String> {
    for (i, w) in got.chunks_exact(2).enumerate() {
        let want: u32 = (0..nranks).map(|r| element(r, i)).sum();
        let v = u16::from_le_bytes([w[0], w[1]]);
        if v != bf16(want as f32) {
            let as_f32 = f32::from_bits((v as u32) << 16);
            return Err(format!(
                "element {i} is {as_f32}, not {want} (the sum over {nranks} ranks)"
            ));
        }
    }
    Ok(())
}

/// The times so far into `path`, whole: written beside it, then renamed over it.
pub fn write_times(path: &Path, times: &[CommTimes]) -> Result<(), String> {
    let part = path.with_extension("part");
    std::fs::write(&part, super::nccl_ranks::format_times(times))
        .and_then(|()| std::fs::rename(&part, path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
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

    /// What each rank puts in sums exactly, and a sum with one rank left out, one element
    /// off, or nothing written (the NaN the output is poisoned with) is caught.
    #[test]
    fn the_sum_of_every_rank_s_input_is_checked_element_by_element() {
        let count = 1000;
        let sum = |ranks: std::ops::Range<usize>| -> Vec<u8> {
            (0..count)
                .flat_map(|i| {
                    bf16(ranks.clone().map(|r| element(r, i)).sum::<u32>() as f32).to_le_bytes()
                })
                .collect()
        };
        assert_eq!(check_sum(&sum(0..4), 4), Ok(()));
        assert_eq!(check_sum(&sum(0..16), 16), Ok(()));
        assert!(check_sum(&sum(0..3), 4).is_err(), "a rank left out");
        let mut off = sum(0..4);
        off[2 * 777] ^= 0x40;
        let e = check_sum(&off, 4).unwrap_err();
        assert!(e.starts_with("element 777 is "), "{e}");
        let e = check_sum(&vec![0xff; 2 * count], 2).unwrap_err();
        assert!(e.starts_with("element 0 is NaN, not"), "{e}");
        // Every rank's input is its own: a sum of copies of one rank's would differ.
        assert_ne!(input(0, count), input(1, count));
        assert_eq!(input(2, count).len(), 2 * count);
    }

    /// The times so far replace the file whole, with nothing left beside it.
    #[test]
    fn the_times_so_far_replace_the_file_whole() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("rank0.times");
        let t = |channels, sizes| CommTimes {
            channels,
            variant: None,
            sizes,
        };
        write_times(&p, &[t(Some(4), vec![(1024, vec![3.5])])]).unwrap();
        write_times(&p, &[t(None, vec![(1024, vec![2.5]), (2048, vec![4.0])])]).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "0 1024 2.500\n0 2048 4.000\n"
        );
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

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

//! Worker side of verification: fresh data drawn on the GPU into the inputs of the ranks this
//! worker launches, the backend run as it is timed (eager calls in a row, or a CUDA graph of
//! them replayed), and every launched rank's output compared bit for bit with the expected
//! sum by a kernel (kernels/check.cu): nothing of the message crosses to the host.

use std::ffi::c_void;

use super::data;
use super::driver::{dev, DevBuf, Span};
use super::kernels::GpuKernels;
use super::layout::THREADS;
use super::setup::{Impl, Launcher, GUARD};
use super::{Gpu, WorkerFaults};
use crate::fabric::{Backend, DeviceError, FabricError, Mode};
use crate::units::fmt_size;

fn kernels_of(gpu: &Gpu) -> Result<&GpuKernels, FabricError> {
    Ok(gpu.kernels()?)
}

/// Blocks for a grid-stride pass over `n` elements: enough to fill the GPU, no more.
fn grid(n: u64, gpu: &Gpu) -> (u32, u32) {
    let blocks = n
        .div_ceil(THREADS as u64)
        .min(gpu.facts.sms as u64 * 8)
        .max(1);
    (blocks as u32, 1)
}

impl Launcher {
    /// The ranks whose data this worker stages and checks for `backend`, and the size of the
    /// world the reference sums over: its launched ranks for custom kernels, its NCCL rank.
    fn checked_ranks(&self, backend: Backend) -> Result<(Vec<usize>, usize), FabricError> {
        Ok(match &self.find(backend)?.imp {
            Impl::Custom(_) => (
                (self.launch.base..self.launch.base + self.launch.count).collect(),
                self.shape.n,
            ),
            Impl::Nccl { rank, nranks, .. } => (vec![*rank], *nranks),
        })
    }

    /// Rank `r`'s own input and output, which every backend reads and writes as an engine's
    /// tensors (custom kernels stage through their shared buffers themselves).
    fn spans(&self, backend: Backend, r: usize) -> Result<(Span, Span), FabricError> {
        Ok(match &self.find(backend)?.imp {
            Impl::Custom(_) => self.user[r].clone(),
            Impl::Nccl { .. } => self.user[r.min(self.user.len() - 1)].clone(),
        })
    }

    /// Draws the data of `seed` into the inputs of this worker's ranks on the GPU, and
    /// poisons their outputs (and the guard bytes past them).
    pub fn stage(
        &mut self,
        gpu: &Gpu,
        backend: Backend,
        bytes: u64,
        seed: u64,
    ) -> Result<(), FabricError> {
        let elems = self.elems(bytes)?;
        dev(gpu.ctx.bind_to_thread(), "binding the CUDA context")?;
        self.test_data_agrees(gpu)?;
        let (ranks, _) = self.checked_ranks(backend)?;
        for r in ranks {
            let (input, out) = self.spans(backend, r)?;
            if input.bytes() < bytes as usize {
                return Err(FabricError::BadRequest(format!(
                    "rank {r}'s input holds {} bytes, less than {bytes}",
                    input.bytes()
                )));
            }
            // SAFETY: the input holds at least `bytes` = `elems` elements (checked above), and
            // the stream is synchronized below, before the input can be freed.
            unsafe { self.launch_fill(gpu, input.ptr(), elems, seed, r as u32) }?;
            let span = (bytes as usize + GUARD).min(out.bytes());
            dev(out.fill_range(0, span, 0xff), "poisoning the output")?;
        }
        super::driver::sync_ctx(&gpu.ctx, "synchronizing the GPU")
    }

    /// Queues `fill_<dtype>`: rank `rank`'s test data of `seed`, `elems` elements at `ptr`.
    ///
    /// # Safety
    /// `ptr` holds `elems` elements of the group's dtype and stays allocated until this
    /// worker's stream has been synchronized.
    unsafe fn launch_fill(
        &self,
        gpu: &Gpu,
        ptr: u64,
        elems: u64,
        seed: u64,
        rank: u32,
    ) -> Result<(), FabricError> {
        let k = kernels_of(gpu)?;
        let (mut ptr, mut n, mut seed, mut rank) = (ptr, elems, seed, rank);
        let mut params = [
            &mut ptr as *mut u64 as *mut c_void,
            &mut n as *mut u64 as *mut c_void,
            &mut seed as *mut u64 as *mut c_void,
            &mut rank as *mut u32 as *mut c_void,
        ];
        // SAFETY: the parameters match fill_<dtype>(char*, u64, u64, u32); the memory is the
        // caller's contract.
        dev(
            unsafe {
                k.fill(self.shape.dtype).launch_raw(
                    grid(elems, gpu),
                    THREADS,
                    &self.unit.stream,
                    &mut params,
                )
            },
            "launching the test-data kernel",
        )
    }

    /// Once per worker: the GPU's test data is the host's, so the values a wrong result is
    /// reported with are the ones the GPU compared.
    fn test_data_agrees(&mut self, gpu: &Gpu) -> Result<(), FabricError> {
        if self.data_checked {
            return Ok(());
        }
        let dtype = self.shape.dtype;
        let (n, seed, rank) = (4096u64, 0x5eed, 3);
        let buf = dev(
            DevBuf::alloc(&gpu.ctx, (n * dtype.size()) as usize),
            "allocating the test-data check",
        )?;
        // SAFETY: buf holds n elements of the dtype; the stream is waited for before it is freed.
        unsafe { self.launch_fill(gpu, buf.ptr(), n, seed, rank as u32) }?;
        self.unit.stream.finish(
            self.deadline.for_work(n * dtype.size(), 1),
            "drawing test data",
        )?;
        let mut got = vec![0u8; (n * dtype.size()) as usize];
        dev(buf.download(0, &mut got), "reading test data")?;
        if got != data::encode(dtype, &data::rank_values(seed, rank, n as usize)) {
            return Err(DeviceError::Bug(
                "the GPU's test data differs from the host's (kernels/check.cu and src/fabric/cuda/data.rs disagree)".into(),
            )
            .into());
        }
        self.data_checked = true;
        Ok(())
    }

    /// Runs `backend` `calls` times in `mode` on the staged data and checks this worker's
    /// ranks. Every rank must have been staged first (the coordinator waits for all). A
    /// backend that hangs or fails is aborted and forgotten (see `recover`).
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &mut self,
        gpu: &Gpu,
        faults: &WorkerFaults,
        backend: Backend,
        bytes: u64,
        seed: u64,
        mode: Mode,
        calls: u32,
    ) -> Result<Option<String>, FabricError> {
        self.check_stuck()?;
        self.check_inner(gpu, faults, backend, bytes, seed, mode, calls)
            .map_err(|e| self.recover(backend, e))
    }

    #[allow(clippy::too_many_arguments)]
    fn check_inner(
        &mut self,
        gpu: &Gpu,
        faults: &WorkerFaults,
        backend: Backend,
        bytes: u64,
        seed: u64,
        mode: Mode,
        calls: u32,
    ) -> Result<Option<String>, FabricError> {
        let elems = self.elems(bytes)?;
        let calls = calls.max(1);
        let what = format!("{backend} allreduce of {}", fmt_size(bytes));
        match mode {
            Mode::Eager => {
                let limit = self.deadline.for_work(bytes, calls);
                self.launch_calls(gpu, faults, backend, elems, calls, Mode::Eager)?;
                self.finish(backend, None, limit, &what)?;
            }
            Mode::Graph => {
                let g = self.capture(gpu, faults, backend, elems, calls)?;
                let limit = self.deadline.for_work(bytes, calls);
                let r = dev(g.launch(&self.unit.stream), "launching a CUDA graph")
                    .and_then(|_| self.finish(backend, None, limit, &what));
                // The graph holds NCCL's communicator: the caller may abort it on an error.
                drop(g);
                r?;
            }
        }
        self.check_status(backend)?;
        let dtype = self.shape.dtype;
        let (ranks, world) = self.checked_ranks(backend)?;
        let k = kernels_of(gpu)?;
        // Three counters per rank, every rank's check queued before one wait and one read.
        let verdict = dev(
            DevBuf::alloc(&gpu.ctx, 24 * ranks.len()),
            "allocating the verification counters",
        )?;
        let fresh: Vec<u8> = ranks
            .iter()
            .flat_map(|_| [0u64, u64::MAX, 0])
            .flat_map(|v| v.to_le_bytes())
            .collect();
        dev(
            verdict.upload(0, &fresh),
            "clearing the verification counters",
        )?;
        let mut spans = Vec::with_capacity(ranks.len());
        for (i, &r) in ranks.iter().enumerate() {
            let (_, out) = self.spans(backend, r)?;
            let span = (bytes as usize + GUARD).min(out.bytes());
            if faults.wrong == Some(backend) {
                // The middle element's low byte: a wrong value wherever the kernel splits work.
                let mid = (elems / 2 * dtype.size()) as usize;
                dev(
                    out.fill_range(mid, 1, 0x5a),
                    "spoiling the output (fault knob)",
                )?;
            }
            let (mut ptr, mut n, mut seed_, mut world_, mut data_end, mut guard_end, mut res) = (
                out.ptr(),
                elems,
                seed,
                world as u32,
                bytes,
                span as u64,
                verdict.ptr() + 24 * i as u64,
            );
            let mut params = [
                &mut ptr as *mut u64 as *mut c_void,
                &mut n as *mut u64 as *mut c_void,
                &mut seed_ as *mut u64 as *mut c_void,
                &mut world_ as *mut u32 as *mut c_void,
                &mut data_end as *mut u64 as *mut c_void,
                &mut guard_end as *mut u64 as *mut c_void,
                &mut res as *mut u64 as *mut c_void,
            ];
            // SAFETY: check_<dtype>(const char*, u64, u64, u32, u64, u64, u64*) reads `span`
            // bytes of the output (inside it: span is clipped to its size) and writes the
            // three words of rank i in `verdict`; the stream is waited for below, before either
            // is freed.
            dev(
                unsafe {
                    k.check(dtype).launch_raw(
                        grid(elems, gpu),
                        THREADS,
                        &self.unit.stream,
                        &mut params,
                    )
                },
                "launching the verification kernel",
            )?;
            spans.push((r, out, span));
        }
        self.unit.stream.finish(
            self.deadline.for_work(bytes, ranks.len() as u32),
            "checking the output",
        )?;
        let mut v = vec![0u8; 24 * ranks.len()];
        dev(
            verdict.download(0, &mut v),
            "reading the verification counters",
        )?;
        for (i, (r, out, span)) in spans.into_iter().enumerate() {
            let word = |j: usize| {
                let at = 24 * i + 8 * j;
                u64::from_le_bytes(v[at..at + 8].try_into().unwrap_or_default())
            };
            let (wrong, first, spoiled) = (word(0), word(1), word(2));
            if wrong > 0 {
                let size = dtype.size() as usize;
                let mut raw = [0u8; 4];
                dev(
                    out.download(first as usize * size, &mut raw[..size]),
                    "reading the output",
                )?;
                let got = u32::from_le_bytes(raw);
                let want = data::expected_bits(dtype, seed, world, first);
                return Ok(Some(format!(
                    "{backend} at {} ({} x{calls}), rank {r}: {}",
                    fmt_size(bytes),
                    mode.id(),
                    data::mismatch(dtype, first, elems, got, want, wrong)
                )));
            }
            if spoiled > 0 {
                return Ok(Some(format!(
                    "{backend} at {}, rank {r}: wrote past the end of the output ({spoiled} of the {} bytes after it changed)",
                    fmt_size(bytes),
                    span - bytes as usize
                )));
            }
        }
        Ok(None)
    }
}

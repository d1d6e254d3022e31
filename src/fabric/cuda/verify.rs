//! Worker side of verification: fresh data into the inputs of the ranks this worker launches,
//! the backend run as it is timed (eager calls in a row, or a CUDA graph of them replayed),
//! and every launched rank's output compared bit for bit with the host reference.

use rayon::prelude::*;

use super::data;
use super::driver::{dev, Span};
use super::run::{Impl, Launcher};
use super::setup::GUARD;
use super::{Faults, Gpu};
use crate::fabric::{Backend, FabricError, Mode};

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

    fn spans(&self, backend: Backend, r: usize) -> Result<(Span, Span), FabricError> {
        Ok(match &self.find(backend)?.imp {
            Impl::Custom(c) => (c.input[r], c.out[r]),
            Impl::Nccl { .. } => self.user[r.min(self.user.len() - 1)],
        })
    }

    /// Uploads the data of `seed` into the inputs and poisons the outputs (and the guard bytes
    /// past them) of this worker's ranks.
    pub fn stage(
        &mut self,
        gpu: &Gpu,
        backend: Backend,
        bytes: u64,
        seed: u64,
    ) -> Result<(), FabricError> {
        let elems = self.elems(bytes)?;
        dev(gpu.ctx.bind_to_thread(), "binding the CUDA context")?;
        let (ranks, _) = self.checked_ranks(backend)?;
        // Generating 64 MiB of values per rank takes the host longer than the GPU's work: per
        // rank in parallel, and kept for the check that follows.
        let dtype = self.shape.dtype;
        let values: Vec<Vec<f32>> = ranks
            .par_iter()
            .map(|&r| data::rank_values(seed, r, elems as usize))
            .collect();
        let data: Vec<Vec<u8>> = values.par_iter().map(|v| data::encode(dtype, v)).collect();
        self.staged = Some((seed, elems, ranks.clone(), values));
        for (r, d) in ranks.into_iter().zip(data) {
            let (input, out) = self.spans(backend, r)?;
            dev(input.upload(0, &d), "uploading test data")?;
            let span = (bytes as usize + GUARD).min(out.bytes);
            dev(out.fill_range(0, span, 0xff), "poisoning the output")?;
        }
        super::driver::sync_ctx(&gpu.ctx, "synchronizing the GPU")
    }

    /// Runs `backend` `calls` times in `mode` on the staged data and checks this worker's
    /// ranks. Every rank must have been staged first (the coordinator waits for all). A
    /// backend that hangs or fails is aborted and forgotten (see `recover`).
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &mut self,
        gpu: &Gpu,
        faults: &Faults,
        backend: Backend,
        bytes: u64,
        seed: u64,
        mode: Mode,
        calls: u32,
    ) -> Result<Option<String>, FabricError> {
        if let Some(why) = &self.stuck {
            return Err(FabricError::Device(why.clone()));
        }
        self.check_inner(gpu, faults, backend, bytes, seed, mode, calls)
            .map_err(|e| self.recover(backend, e))
    }

    #[allow(clippy::too_many_arguments)]
    fn check_inner(
        &mut self,
        gpu: &Gpu,
        faults: &Faults,
        backend: Backend,
        bytes: u64,
        seed: u64,
        mode: Mode,
        calls: u32,
    ) -> Result<Option<String>, FabricError> {
        let elems = self.elems(bytes)?;
        let calls = calls.max(1);
        let what = format!("{backend} allreduce of {bytes} bytes");
        match mode {
            Mode::Eager => {
                let limit = self.deadline.for_work(bytes, calls);
                self.launch_calls(gpu, faults, backend, elems, calls)?;
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
        let staged = self.staged.take();
        let inputs: Vec<Vec<f32>> = match staged {
            Some((s, e, r, v))
                if s == seed && e == elems && r == (0..world).collect::<Vec<_>>() =>
            {
                v
            }
            _ => (0..world)
                .into_par_iter()
                .map(|r| data::rank_values(seed, r, elems as usize))
                .collect(),
        };
        let want = data::reference(dtype, &inputs);
        dev(gpu.ctx.bind_to_thread(), "binding the CUDA context")?;
        for r in ranks {
            let (_, out) = self.spans(backend, r)?;
            let span = (bytes as usize + GUARD).min(out.bytes);
            let mut got = vec![0u8; span];
            dev(out.download(0, &mut got), "reading the output")?;
            if let Some(diff) = data::compare(dtype, &got[..bytes as usize], &want) {
                return Ok(Some(format!(
                    "{backend} at {bytes} bytes ({} x{calls}), rank {r}: {diff}",
                    mode.id()
                )));
            }
            if let Some(i) = got[bytes as usize..].iter().position(|&b| b != 0xff) {
                return Ok(Some(format!(
                    "{backend} at {bytes} bytes, rank {r}: wrote past the end of the output (byte {})",
                    bytes as usize + i
                )));
            }
        }
        Ok(None)
    }
}

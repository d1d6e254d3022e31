//! A worker's NCCL ranks between groups. Destroying a communicator is what a release between
//! groups costs (ncclCommFinalize and ncclCommDestroy: about 0.4 s each on the H200), while
//! creating one after the first is cheap; a check or a tune prepares group after group. So a
//! closing group's ranks are kept, taken by the next group whose NCCL ranks are the same
//! processes in the same places (in loopback every group's: one rank on worker 0), destroyed
//! by all their ranks together when the coordinator says they do not come back (before the
//! next group's buffers: never more than one per backend held), and at the end left to the
//! process's exit, which releases them with the context.

use super::driver::{self, dev};
use super::nccl;
use super::setup::{Impl, Launcher, Ready};
use super::Gpu;
use crate::fabric::{Backend, FabricError};

/// One NCCL rank kept past the group it was created for.
pub struct Kept {
    pub backend: Backend,
    pub rank: usize,
    pub nranks: usize,
    comms: nccl::Comms,
    /// Device bytes it held once warmed, reported again with what a reuse adds.
    bytes: u64,
}

impl Launcher {
    /// Takes this launcher's NCCL ranks out, to outlive it: the graphs that captured them go
    /// first (NCCL waits for them on destroy) and the stream is drained. A stream that does not
    /// drain keeps them in, for the launcher's drop to abort.
    pub fn take_nccl(&mut self) -> Vec<Kept> {
        self.graphs.clear();
        if self.drain().is_err() {
            return Vec::new();
        }
        let (nccl, rest): (Vec<Ready>, Vec<Ready>) = std::mem::take(&mut self.ready)
            .into_iter()
            .partition(|r| matches!(r.imp, Impl::Nccl { .. }));
        self.ready = rest;
        self.warm
            .retain(|(b, _)| !nccl.iter().any(|r| r.backend == *b));
        nccl.into_iter()
            .filter_map(|r| match r.imp {
                Impl::Nccl {
                    comms,
                    rank,
                    nranks,
                    bytes,
                } if !comms.is_aborted() => Some(Kept {
                    backend: r.backend,
                    rank,
                    nranks,
                    comms,
                    bytes,
                }),
                _ => None,
            })
            .collect()
    }

    /// Takes `kept` in for this group and warms it over this group's size classes. Ok(Err)
    /// waives the backend (its rank is aborted).
    pub fn nccl_reuse(
        &mut self,
        gpu: &Gpu,
        kept: Kept,
    ) -> Result<Result<u64, String>, FabricError> {
        dev(gpu.ctx.bind_to_thread(), "binding the CUDA context")?;
        let before = dev(driver::free_bytes(&gpu.ctx), "reading free device memory")?;
        let Kept {
            backend,
            rank,
            nranks,
            comms,
            bytes,
        } = kept;
        self.warm_nccl(gpu, backend, comms, (rank, nranks), before, bytes)
    }

    /// Readies `comms` as `backend`'s rank `rank` of `nranks` and warms it up over every size
    /// class it will be timed on (NCCL connects each algorithm lazily), so the memory measured
    /// is what it holds in use: `held` bytes from before, plus what the free memory read
    /// `before` lost. Ok(Err) waives the backend.
    pub(super) fn warm_nccl(
        &mut self,
        gpu: &Gpu,
        backend: Backend,
        comms: nccl::Comms,
        (rank, nranks): (usize, usize),
        before: u64,
        held: u64,
    ) -> Result<Result<u64, String>, FabricError> {
        self.ready.push(Ready {
            backend,
            imp: Impl::Nccl {
                comms,
                rank,
                nranks,
                bytes: held,
            },
        });
        let size = self.shape.dtype.size();
        let max_elems = (self.shape.max_bytes / size).max(1);
        let mut count = (4096 / size).min(max_elems);
        loop {
            if let Err(e) = self.warm_up(gpu, backend, count) {
                let reason = e.to_string();
                self.forget(backend);
                self.drain()?;
                return Ok(Err(reason));
            }
            if count >= max_elems {
                break;
            }
            count = (count * 4).min(max_elems);
        }
        driver::sync_ctx(&gpu.ctx, "synchronizing the GPU")?;
        let after = dev(driver::free_bytes(&gpu.ctx), "reading free device memory")?;
        let bytes = held + before.saturating_sub(after);
        if let Some(Impl::Nccl { bytes: b, .. }) = self
            .ready
            .iter_mut()
            .find(|r| r.backend == backend)
            .map(|r| &mut r.imp)
        {
            *b = bytes;
        }
        Ok(Ok(bytes))
    }
}

/// The NCCL ranks a worker keeps between groups: at most one per backend.
#[derive(Default)]
pub struct KeptRanks(Vec<Kept>);

impl KeptRanks {
    /// Keeps `more`. A rank of a backend already kept replaces the older one, which is aborted
    /// (local, never waiting for peers): the coordinator retires a kept rank before it creates
    /// another, so this is only ever a rank it did not know of (a set-up that failed).
    pub fn keep(&mut self, more: Vec<Kept>) {
        for k in more {
            if let Some(pos) = self.0.iter().position(|o| o.backend == k.backend) {
                let mut old = self.0.remove(pos);
                tracing::warn!(
                    "worker {}: an older NCCL rank of {} was still kept; aborted",
                    std::process::id(),
                    old.backend
                );
                old.comms.abort();
            }
            self.0.push(k);
        }
    }

    /// The kept rank `rank` of `nranks` of `backend`, taken out.
    pub fn take(&mut self, backend: Backend, rank: usize, nranks: usize) -> Option<Kept> {
        let pos = self
            .0
            .iter()
            .position(|k| (k.backend, k.rank, k.nranks) == (backend, rank, nranks))?;
        Some(self.0.remove(pos))
    }

    /// Destroys the kept rank of `backend` (finalized with its peers, then destroyed; see
    /// `nccl::Comms`'s drop); whether there was one.
    pub fn retire(&mut self, backend: Backend) -> bool {
        let before = self.0.len();
        self.0.retain(|k| k.backend != backend);
        self.0.len() < before
    }

    /// How many ranks are kept.
    pub fn count(&self) -> usize {
        self.0.len()
    }

    /// At the process's end: the ranks are not destroyed here (every peer is exiting too, and
    /// the exit releases them with the context), saving a destroy that waits on NCCL.
    pub fn leave_to_exit(&mut self) -> usize {
        let n = self.0.len();
        std::mem::forget(std::mem::take(&mut self.0));
        n
    }
}

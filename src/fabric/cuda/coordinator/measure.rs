//! Coordinator side of measuring a prepared backend: which workers run it, verification (and
//! the check before its first timing), a copy timing, and what to do when a request goes wrong:
//! fail the backend, or replace its workers.

use super::not_prepared;
use super::processes::{unexpected, Trouble};
use super::CudaFabric;
use crate::allreduce::Executor;
use crate::fabric::cuda::layout::LL2_MAX_BYTES;
use crate::fabric::cuda::protocol::{Req, Resp};
use crate::fabric::{Backend, FabricError, Mode, Verification};

/// Calls in a row a backend is verified with at `bytes` in each mode before its first timing:
/// eight where a kernel's LL forms run (their lines and flags are reused call after call),
/// three past them and for the copy engines, whose hazards (the next call's reuse of a buffer,
/// the barrier's epoch, the next kernel starting early under PDL) recur every call. Eight at
/// every size cost a TP8 tune in loopback 4.9 s of its 11.3 s of timing on the H100, most of
/// it calls of 64 MiB and up, and graphs of eight copy-engine calls (50 ms each to capture).
fn calls_verified(backend: Backend, bytes: u64) -> u32 {
    match backend.executor() {
        Executor::SmKernel | Executor::Nccl if bytes <= LL2_MAX_BYTES => 8,
        _ => 3,
    }
}

impl CudaFabric {
    /// The set running `backend` in the prepared group, and the workers it runs on.
    pub(super) fn targets(&self, backend: Backend) -> Result<(usize, Vec<usize>), FabricError> {
        let p = self.prepared.as_ref().ok_or_else(not_prepared)?;
        let set = p
            .ready
            .iter()
            .find(|(b, _)| *b == backend)
            .map(|(_, s)| *s)
            .ok_or_else(|| {
                FabricError::BadRequest(format!(
                    "backend {backend} was not prepared (or was waived) for this group"
                ))
            })?;
        let ws = match backend.executor() {
            Executor::SmKernel | Executor::CopyEngine(_) => {
                p.launchers.iter().map(|(w, _)| *w).collect()
            }
            Executor::Nccl => p.nccl.iter().map(|(w, _)| *w).collect(),
        };
        Ok((set, ws))
    }

    /// Runs `op` for `backend`. A failure of the backend alone fails it (every worker drops
    /// it). A worker that hung, died or whose GPU is stuck says nothing yet about the backend
    /// (a `kill -9`, an Xid elsewhere): every worker is replaced, the group is set up again
    /// *with* the backend and `op` runs once more on the fresh workers. Only a second loss
    /// there fails the backend, and the group is set up once more without it. Both restarts
    /// are on record ([`crate::fabric::Recovery`]).
    pub(super) fn backend_op<T>(
        &mut self,
        backend: Backend,
        mut op: impl FnMut(&mut Self) -> Result<T, Trouble>,
    ) -> Result<T, FabricError> {
        let mut retried = false;
        loop {
            match op(self) {
                Ok(v) => return Ok(v),
                Err(Trouble::Fabric(e)) => {
                    if e.backend_local() {
                        self.drop_backend(backend)?;
                    }
                    return Err(e);
                }
                Err(Trouble::Restart(why)) if !retried => {
                    self.restart(Some((backend, true)), &why)?;
                    retried = true;
                    if self.targets(backend).is_err() {
                        return Err(FabricError::Backend {
                            backend,
                            reason: format!(
                                "{why}; fresh workers could not set it up again, so it was left out"
                            ),
                        });
                    }
                }
                Err(Trouble::Restart(why)) => {
                    self.restart(Some((backend, false)), &why)?;
                    return Err(FabricError::Backend {
                        backend,
                        reason: format!(
                            "{why}; it failed again after its workers were killed and fresh ones set the group up again, so it was left out"
                        ),
                    });
                }
            }
        }
    }

    /// Tells every worker running `backend` to abort and forget it.
    fn drop_backend(&mut self, backend: Backend) -> Result<(), FabricError> {
        let Ok((set, ws)) = self.targets(backend) else {
            return Ok(());
        };
        if let Some(p) = &mut self.prepared {
            p.ready.retain(|(b, _)| *b != backend);
        }
        self.forget_comm(backend);
        let reqs = ws.into_iter().map(|w| (w, Req::Drop { backend })).collect();
        match self.exchange(set, reqs, self.limit(0, 1)) {
            Ok(_) | Err(Trouble::Fabric(_)) => Ok(()),
            Err(Trouble::Restart(why)) => self.restart(None, &why),
        }
    }

    /// Like [`Fabric::verify`](crate::fabric::Fabric::verify), but `calls` calls in a row, eagerly
    /// or captured in one CUDA graph: verification of each mode a backend is timed in, on the same
    /// buffers.
    pub fn verify_with(
        &mut self,
        backend: Backend,
        bytes: u64,
        seed: u64,
        mode: Mode,
        calls: u32,
    ) -> Result<Verification, FabricError> {
        self.at_bytes = Some(bytes);
        self.backend_op(backend, |f| f.verify_run(backend, bytes, seed, mode, calls))
    }

    /// One verification on the workers running `backend` now: stage the data on all, then
    /// run and check on all.
    fn verify_run(
        &mut self,
        backend: Backend,
        bytes: u64,
        seed: u64,
        mode: Mode,
        calls: u32,
    ) -> Result<Verification, Trouble> {
        let (set, ws) = self.targets(backend)?;
        let limit = self.limit(bytes, 2 * calls.max(1) + 2);
        let each = |req: Req| ws.iter().map(|&w| (w, req.clone())).collect();
        let stage = Req::Stage {
            backend,
            bytes,
            seed,
        };
        self.exchange(set, each(stage), limit)?;
        let check = Req::Check {
            backend,
            bytes,
            seed,
            mode,
            calls,
        };
        for r in self.exchange(set, each(check), limit)? {
            match r {
                Resp::Checked(None) => {}
                Resp::Checked(Some(reason)) => return Ok(Verification::Wrong { reason }),
                other => return Err(unexpected(other)),
            }
        }
        Ok(Verification::Correct)
    }

    /// Before the first timing of `backend` at `bytes` in `mode` on these workers: verifies it
    /// in that mode, [`calls_verified`] calls in a row on the same buffers (one graph of them in
    /// graph mode), so what is timed is what was checked. A wrong result fails the backend.
    /// Fresh workers after a restart verify again (the new plan has verified nothing).
    pub(super) fn verify_timed(
        &mut self,
        backend: Backend,
        bytes: u64,
        mode: Mode,
    ) -> Result<(), Trouble> {
        let key = (backend, bytes, mode);
        let p = self.prepared.as_ref().ok_or_else(not_prepared)?;
        if p.verified.contains(&key) {
            return Ok(());
        }
        let seed = 0x7e57 ^ bytes.rotate_left(17) ^ (backend as u64) << 40 ^ (mode as u64) << 48;
        match self.verify_run(backend, bytes, seed, mode, calls_verified(backend, bytes))? {
            Verification::Correct => {
                if let Some(p) = &mut self.prepared {
                    p.verified.insert(key);
                }
                Ok(())
            }
            // A backend failure: `backend_op` makes every worker drop it.
            Verification::Wrong { reason } => Err(Trouble::Fabric(FabricError::Backend {
                backend,
                reason: format!("wrong result before timing: {reason}"),
            })),
        }
    }

    /// Microseconds per device-to-device copy of `bytes` on GPU 0, `batch` copies per sample.
    pub fn time_copy(
        &mut self,
        bytes: u64,
        batch: u32,
        samples: u32,
    ) -> Result<Vec<f64>, FabricError> {
        let limit = self.limit(bytes, batch.max(1) * samples.max(1) + 2);
        let req = Req::Copy {
            bytes,
            batch,
            samples,
        };
        match self.one(0, 0, req, limit).map_err(|t| self.settle(t))? {
            Resp::Times(t) => Ok(t),
            other => Err(self.settle(unexpected(other))),
        }
    }
}

//! Lost workers, put right: every worker replaced, and the group that was prepared set up
//! again on the fresh ones. Above both the worker sets ([`super::processes`]) and the group
//! set-up ([`super::group`]), which it uses; neither calls back into it.

use super::processes::Trouble;
use super::CudaFabric;
use crate::fabric::{Backend, FabricError, WorkerError};

impl CudaFabric {
    /// Kills every worker, starts fresh ones and prepares the group again with the backends
    /// still ready: all of them, or all but `running`'s backend when it is not to be kept.
    /// `running`: the backend whose operation lost the worker, and whether it stays (to run
    /// again on the fresh workers).
    pub(super) fn restart(
        &mut self,
        running: Option<(Backend, bool)>,
        cause: &WorkerError,
    ) -> Result<(), FabricError> {
        let prepared = self.prepared.take();
        let gpus = prepared.as_ref().map(|p| p.group.gpus.clone());
        self.replace(gpus.unwrap_or_default(), running, cause)?;
        let Some(p) = prepared else {
            return Ok(());
        };
        let keep: Vec<Backend> = p
            .ready
            .iter()
            .map(|(b, _)| *b)
            .filter(|b| running.is_none_or(|(r, keep)| keep || r != *b))
            .collect();
        self.setup(&p.group, &keep).map(|_| ())
    }

    /// A trouble outside any backend's operation, as an error: a lost worker is replaced at
    /// once and the group set up again, never left in place for the next request to find and
    /// be blamed for.
    pub(super) fn settle(&mut self, t: Trouble) -> FabricError {
        let why = match t {
            Trouble::Fabric(e) => return e,
            Trouble::Restart(why) => why,
        };
        if let Err(e) = self.restart(None, &why) {
            tracing::warn!("after {why}: {e}");
        }
        FabricError::Worker(why)
    }
}

//! The workers' NCCL communicators between groups, as the coordinator decides them: a closing
//! group's ranks stay in their workers (`worker_nccl`), and the next group's set-up either
//! takes them (the same backend in the same set, on the same workers as the same ranks: in
//! loopback every group's one rank on worker 0) or has every rank of them destroyed at once
//! before its buffers are allocated. So at most one communicator per backend and worker set
//! is ever held, as before, and a release between groups destroys none: the destroy
//! (about 0.4 s on the H200) is paid only where a communicator's ranks do not come back,
//! and never at the end, where the workers' exit releases them. Not on a thread beside the
//! next set-up either: its frees would skew the free-memory readings each backend's memory
//! is measured by.

use std::collections::BTreeMap;

use super::processes::{unexpected, Trouble};
use super::{CudaFabric, PreparedGroup};
use crate::fabric::cuda::protocol::{Req, Resp};
use crate::fabric::{Backend, NcclAlgo, NcclProto};

/// One backend's NCCL communicator as the workers hold it: its worker set and each rank's
/// worker, in rank order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Clique {
    pub(super) set: usize,
    pub(super) backend: Backend,
    /// (worker, rank) of every rank, as `PreparedGroup::nccl`.
    pub(super) ranks: Vec<(usize, usize)>,
}

/// What the next group's set-up does with a communicator the workers hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    /// This group creates the very same one: it takes it instead.
    Reuse,
    /// Its ranks do not come back as they were: every rank destroys it, together.
    Destroy,
}

/// The rule: a held communicator is reused only where the group about to be set up would
/// create one equal to it (`wanted`); anything else about it differing (another worker, rank
/// order or count, another set's pin) makes it a different communicator.
pub(super) fn fate(held: &Clique, wanted: &[Clique]) -> Fate {
    match wanted.contains(held) {
        true => Fate::Reuse,
        false => Fate::Destroy,
    }
}

impl CudaFabric {
    /// Why NCCL cannot be set up here, if it cannot (scripted workers run it without one).
    pub(super) fn nccl_missing(&self) -> Option<String> {
        #[cfg(test)]
        if self.script.is_some() {
            return None;
        }
        crate::fabric::cuda::nccl::library().err()
    }

    /// The communicators a group of `plan` creates: in each of `pins`' sets that runs, one for
    /// each backend `here` names, over the plan's NCCL ranks.
    pub(super) fn wanted_comms(
        &self,
        pins: &[Option<(NcclAlgo, NcclProto)>],
        plan: &PreparedGroup,
        here: impl Fn(Option<(NcclAlgo, NcclProto)>) -> Vec<Backend>,
    ) -> Vec<Clique> {
        let mut wanted = Vec::new();
        for &pin in pins {
            if let Some(set) = self.sets.iter().position(|s| s.pin == pin) {
                wanted.extend(here(pin).into_iter().map(|backend| Clique {
                    set,
                    backend,
                    ranks: plan.nccl.clone(),
                }));
            }
        }
        wanted
    }

    /// Before a group's set-up: destroys every held communicator the group does not reuse,
    /// all of their ranks asked at once (NCCL's finalize waits for every rank), and returns
    /// those it reuses.
    pub(super) fn settle_comms(&mut self, wanted: &[Clique]) -> Result<Vec<Clique>, Trouble> {
        let (reuse, retire): (Vec<Clique>, Vec<Clique>) = std::mem::take(&mut self.comms)
            .into_iter()
            .partition(|c| fate(c, wanted) == Fate::Reuse);
        self.comms = reuse.clone();
        if retire.is_empty() {
            return Ok(reuse);
        }
        let t = std::time::Instant::now();
        // One request per worker (a link awaits one answer at a time), naming its backends in
        // the same order on every worker.
        let mut per: BTreeMap<(usize, usize), Vec<Backend>> = BTreeMap::new();
        for c in &retire {
            for &(w, _) in &c.ranks {
                per.entry((c.set, w)).or_default().push(c.backend);
            }
        }
        let reqs = per
            .into_iter()
            .map(|(at, backends)| (at, Req::NcclRetire { backends }))
            .collect();
        for r in self.exchange_sets(reqs, self.limit(0, 1))? {
            if r != Resp::Done {
                return Err(unexpected(r));
            }
        }
        tracing::info!(
            "workers: NCCL communicators of {} destroyed in {:.2} s (their ranks do not come \
             back)",
            retire
                .iter()
                .map(|c| c.backend.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            t.elapsed().as_secs_f64()
        );
        Ok(reuse)
    }

    /// Takes `b`'s communicator kept in the workers of `set` into this group's launchers, and
    /// warms it over the group's sizes; the bytes it holds, as `nccl_init` answers them.
    pub(super) fn nccl_reuse(
        &mut self,
        set: usize,
        plan: &PreparedGroup,
        b: Backend,
    ) -> Result<Result<u64, String>, Trouble> {
        let limit = self.limit(plan.group.max_bytes, 16);
        let nranks = plan.nccl.len();
        let reqs = plan
            .nccl
            .iter()
            .map(|&(w, rank)| {
                let req = Req::NcclReuse {
                    backend: b,
                    rank,
                    nranks,
                };
                (w, req)
            })
            .collect();
        let answers = self.exchange(set, reqs, limit);
        // Taken out of the kept ones whatever came back: a failure aborts it on the worker.
        self.comms.retain(|c| (c.set, c.backend) != (set, b));
        let mut most = 0;
        for r in answers? {
            match r {
                Resp::Memory(Ok(bytes)) => most = most.max(bytes),
                Resp::Memory(Err(e)) => return Ok(Err(e)),
                other => return Err(unexpected(other)),
            }
        }
        Ok(Ok(most))
    }

    /// Records that the workers of `set` now hold `b`'s communicator over `plan`'s ranks.
    pub(super) fn hold_comm(&mut self, set: usize, plan: &PreparedGroup, b: Backend) {
        self.comms.retain(|c| (c.set, c.backend) != (set, b));
        self.comms.push(Clique {
            set,
            backend: b,
            ranks: plan.nccl.clone(),
        });
    }

    /// `b`'s communicator is gone from every worker (aborted with its backend).
    pub(super) fn forget_comm(&mut self, b: Backend) {
        self.comms.retain(|c| c.backend != b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clique(set: usize, backend: Backend, ranks: &[(usize, usize)]) -> Clique {
        Clique {
            set,
            backend,
            ranks: ranks.to_vec(),
        }
    }

    #[test]
    fn a_communicator_is_reused_only_where_the_next_group_would_create_the_same_one() {
        let nccl = Backend::Nccl;
        // Loopback: every group's NCCL is one rank on worker 0 of the main set.
        let loopback = clique(0, nccl, &[(0, 0)]);
        assert_eq!(
            fate(&loopback, std::slice::from_ref(&loopback)),
            Fate::Reuse
        );
        // Several GPUs: TP2 on GPUs 0-1, then TP4 on 0-3: other ranks, destroyed.
        let tp2 = clique(0, nccl, &[(0, 0), (1, 1)]);
        let tp4 = clique(0, nccl, &[(0, 0), (1, 1), (2, 2), (3, 3)]);
        assert_eq!(fate(&tp2, std::slice::from_ref(&tp4)), Fate::Destroy);
        assert_eq!(fate(&tp4, std::slice::from_ref(&tp4)), Fate::Reuse);
        // The same GPUs in another placement or rank order, or on other workers: destroyed.
        assert_eq!(
            fate(&tp2, &[clique(0, nccl, &[(1, 0), (0, 1)])]),
            Fate::Destroy
        );
        assert_eq!(
            fate(&tp2, &[clique(0, nccl, &[(2, 0), (3, 1)])]),
            Fate::Destroy
        );
        // Another backend (a pin), or the same ranks in another worker set: destroyed.
        let pin = Backend::NcclRingLl;
        assert_eq!(
            fate(&tp2, &[clique(0, pin, &[(0, 0), (1, 1)])]),
            Fate::Destroy
        );
        assert_eq!(
            fate(&tp2, &[clique(1, nccl, &[(0, 0), (1, 1)])]),
            Fate::Destroy
        );
        // A group that sets no NCCL up (all of it waived): nothing is kept for later.
        assert_eq!(fate(&tp2, &[]), Fate::Destroy);
    }
}

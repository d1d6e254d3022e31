//! Coordinator side of preparing a group: which worker owns and launches which rank, the
//! worker sets each backend needs, what is waived and why, and releasing the group again.

use std::collections::BTreeMap;

use super::processes::{no_workers, unexpected, Trouble};
use super::waivers::{ll128_waiver, unlike};
use super::PreparedGroup;
use super::{not_prepared, CudaFabric};
use crate::allreduce::Executor;
use crate::fabric::cuda::copy;
use crate::fabric::cuda::driver::DeviceFacts;
use crate::fabric::cuda::layout::MAX_RANKS;
use crate::fabric::cuda::nccl_ranks::ranked::Ranked;
use crate::fabric::cuda::protocol::{Launch, Req, Resp, Shape};
use crate::fabric::{
    memory, Backend, Directions, FabricError, Group, NcclAlgo, NcclProto, Ranks, Readiness,
};

/// Testing only: `one` makes the first worker of a loopback group own every rank's buffers
/// (no IPC between processes), to compare with IPC-shared buffers.
const ENV_LOOPBACK_OWNERS: &str = "ARTUNE_LOOPBACK_OWNERS";
/// NCCL channels assumed for the memory model (NCCL does not report its channel count).
const MODEL_NCCL_CHANNELS: u32 = 2;

impl CudaFabric {
    fn layout(&self, group: &Group) -> Result<PreparedGroup, FabricError> {
        let mut owners = Vec::new();
        for &i in &group.gpus {
            match self.map.get(i) {
                Some(Some(w)) => owners.push(*w),
                Some(None) => {
                    return Err(FabricError::BadRequest(format!(
                    "GPU {i} of the topology is not visible to CUDA (check CUDA_VISIBLE_DEVICES)"
                )))
                }
                None => {
                    return Err(FabricError::BadRequest(format!(
                        "GPU {i} does not exist; this machine has {} GPUs",
                        self.topo.gpu_count()
                    )))
                }
            }
        }
        let n = owners.len();
        if self.loopback.is_some() && std::env::var(ENV_LOOPBACK_OWNERS).is_ok_and(|v| v == "one") {
            owners = vec![owners[0]; n];
        }
        let (launchers, nccl) = if self.loopback.is_some() && !self.launch_each {
            (
                vec![(owners[0], Launch { base: 0, count: n })],
                vec![(owners[0], 0)],
            )
        } else if self.loopback.is_some() {
            let l = (0..n)
                .map(|r| (owners[r], Launch { base: r, count: 1 }))
                .collect();
            (l, vec![(owners[0], 0)])
        } else {
            let l = (0..n)
                .map(|r| (owners[r], Launch { base: r, count: 1 }))
                .collect();
            (l, (0..n).map(|r| (owners[r], r)).collect())
        };
        Ok(PreparedGroup {
            group: group.clone(),
            owners,
            launchers,
            nccl,
            ready: Vec::new(),
            no_p2p: None,
            verified: Default::default(),
        })
    }

    /// Sets `backends` up on `group` through the workers (see
    /// [`Fabric::prepare`](crate::fabric::Fabric::prepare)).
    pub(super) fn setup(
        &mut self,
        group: &Group,
        backends: &[Backend],
    ) -> Result<Vec<Readiness>, FabricError> {
        let mut plan = self.layout(group)?;
        if self.sets.is_empty() {
            return Err(no_workers());
        }
        self.holding = true;
        let n = plan.owners.len();
        let shape = Shape::of(group);
        let mut waived: BTreeMap<Backend, String> = BTreeMap::new();
        // NCCL pins timed by K rank processes in loopback, not set up in the workers.
        let mut ranked: Vec<Backend> = Vec::new();
        self.ranked = None;
        for &b in backends {
            if let (true, Err(why)) = (b.is_hierarchical(), &group.islands) {
                waived.insert(b, why.clone());
            } else if let Some(why) = executor_waiver(b, n) {
                waived.insert(b, why);
            } else if b.is_nccl() {
                if let Some(e) = self.nccl_missing() {
                    waived.insert(b, e);
                } else if self.loopback.is_some() && b.nccl_pin().is_some() {
                    match loopback_pin(self.loopback_nccl.as_ref()) {
                        None => ranked.push(b),
                        Some(why) => drop(waived.insert(b, why)),
                    }
                } else if let Some(why) = ll128_waiver(b, &self.topo, &group.gpus) {
                    waived.insert(b, why);
                }
            }
        }
        let launching: Vec<&DeviceFacts> = plan
            .launchers
            .iter()
            .map(|(w, _)| &self.sets[0].workers[*w].facts)
            .collect();
        if let Some(why) = unlike(&launching) {
            for &b in backends.iter().filter(|b| b.is_custom()) {
                waived.entry(b).or_insert_with(|| why.clone());
            }
        }
        let custom: Vec<Backend> = backends
            .iter()
            .copied()
            .filter(|b| b.is_custom() && !waived.contains_key(b))
            .collect();
        let pins: Vec<Option<(NcclAlgo, NcclProto)>> = {
            let mut v = vec![None];
            for b in backends
                .iter()
                .filter(|b| b.is_nccl() && !waived.contains_key(b) && !ranked.contains(b))
            {
                if !v.contains(&b.nccl_pin()) {
                    v.push(b.nccl_pin());
                }
            }
            v
        };
        let nccl_here =
            |pin, waived: &BTreeMap<Backend, String>| nccl_here(backends, pin, waived, &ranked);
        // Communicators the workers hold from the last group: this group's own are taken,
        // the others destroyed before any buffer is allocated (comms.rs).
        let wanted = self.wanted_comms(&pins, &plan, |pin| nccl_here(pin, &waived));
        let reuse = self
            .settle_comms(&wanted)
            .map_err(|t| self.lost_in_setup(group, t))?;
        let mut memory: BTreeMap<Backend, u64> = BTreeMap::new();
        for pin in pins {
            let set = match self.sets.iter().position(|s| s.pin == pin) {
                Some(s) => s,
                None => {
                    let s = self.start_set(pin)?;
                    self.sets.push(s);
                    self.sets.len() - 1
                }
            };
            let custom_here = if pin.is_none() {
                custom.clone()
            } else {
                Vec::new()
            };
            let t = std::time::Instant::now();
            self.connect_set(
                set,
                &mut plan,
                shape,
                &custom_here,
                &mut waived,
                &mut memory,
            )
            .map_err(|t| self.lost_in_setup(group, t))?;
            tracing::info!(
                "GPUs {:?}: buffers of {} custom backends set up and connected in {:.2} s",
                group.gpus,
                custom_here.len(),
                t.elapsed().as_secs_f64()
            );
            for b in nccl_here(pin, &waived) {
                let t = std::time::Instant::now();
                let kept = reuse.iter().any(|c| (c.set, c.backend) == (set, b));
                let r = match kept {
                    true => self.nccl_reuse(set, &plan, b),
                    false => self.nccl_init(set, &plan, b),
                }
                .map_err(|t| self.lost_in_setup(group, t))?;
                tracing::info!(
                    "GPUs {:?}: {b} set up in {:.2} s{}",
                    group.gpus,
                    t.elapsed().as_secs_f64(),
                    match kept {
                        true => " (the communicator kept from the last group)",
                        false => "",
                    }
                );
                match r {
                    Ok(bytes) => {
                        memory.insert(b, bytes);
                        plan.ready.push((b, set));
                        self.hold_comm(set, &plan, b);
                    }
                    Err(e) => {
                        waived.insert(b, e);
                    }
                }
            }
        }
        for &b in &custom {
            if !waived.contains_key(&b) {
                plan.ready.push((b, 0));
            }
        }
        self.start_ranked(group, &mut plan, &mut ranked, &mut waived);
        self.prepared = Some(plan);
        let mut out = readiness(backends, &waived, &memory, group.ranks(), group.max_bytes);
        if self.ranked.is_some() {
            ranked_memory(&mut out, &ranked, group);
        }
        Ok(out)
    }

    /// In loopback, NCCL's own choice timed by K rank processes over the whole grid (its
    /// channels are the profile's), then the pins in `ranked` ready beside it; where the
    /// ranks fail, the pins are waived and the fabric line says so.
    fn start_ranked(
        &mut self,
        group: &Group,
        plan: &mut PreparedGroup,
        ranked: &mut Vec<Backend>,
        waived: &mut BTreeMap<Backend, String>,
    ) {
        let wanted = !ranked.is_empty() || nccl_ready(plan);
        if let (Some(k), Some(Ok(())), true) = (self.loopback, &self.loopback_nccl, wanted) {
            // NCCL's own choice first, over the whole grid: its channels are the profile's.
            let grid = crate::plan::size_grid(256, group.max_bytes);
            let variants = std::iter::once(Backend::Nccl).chain(ranked.iter().copied());
            let mut r = Ranked::new(self.program.clone(), k, grid, variants.collect());
            match r.prime(Backend::Nccl, crate::allreduce::Mode::Eager) {
                Ok(_) => {
                    plan.ready.extend(ranked.iter().map(|&b| (b, 0)));
                    self.ranked = Some(r);
                }
                Err(e) => {
                    // The profile's fabric line must not claim K ranks where they did not run.
                    self.info.description.push_str(&format!(
                        "; on GPUs {:?} the {k} NCCL ranks failed ({e}), so NCCL ran there with \
                         1 rank and its pins were waived",
                        group.gpus
                    ));
                    ranked
                        .drain(..)
                        .for_each(|b| drop(waived.insert(b, e.to_string())));
                }
            }
        }
    }

    /// A trouble while setting `group` up, as an error: lost workers are replaced at once,
    /// with nothing set up again (the setup that failed is not retried from within itself).
    fn lost_in_setup(&mut self, group: &Group, t: Trouble) -> FabricError {
        let why = match t {
            Trouble::Fabric(e) => return e,
            Trouble::Restart(why) => why,
        };
        self.prepared = None;
        if let Err(e) = self.replace(group.gpus.clone(), None, &why) {
            tracing::warn!("after {why}: {e}");
        }
        FabricError::Worker(why)
    }

    /// Tells the workers launching the island kernels which phases push (see
    /// [`Fabric::orient`](crate::fabric::Fabric::orient)), and keeps it with the group so a
    /// group set up again after a restart runs the same way.
    pub(super) fn orient_inner(&mut self, d: &Directions) -> Result<(), FabricError> {
        let p = self.prepared.as_mut().ok_or_else(not_prepared)?;
        if let Ok(i) = &mut p.group.islands {
            i.directions = Some(d.clone());
        }
        let Some(&(b, _)) = p.ready.iter().find(|(b, _)| b.is_hierarchical()) else {
            return Ok(());
        };
        let (set, ws) = self.targets(b)?;
        let req = Req::Orient {
            dirs: crate::fabric::cuda::protocol::dirs(d),
        };
        let limit = self.limit(0, 1);
        let reqs = ws.iter().map(|&w| (w, req.clone())).collect();
        match self.exchange(set, reqs, limit) {
            Ok(rs) => match rs.into_iter().find(|r| *r != Resp::Done) {
                Some(r) => Err(self.settle(unexpected(r))),
                None => Ok(()),
            },
            Err(t) => Err(self.settle(t)),
        }
    }

    /// Closes every import on every worker, then frees: each round waits at most `limit`.
    pub(super) fn release_inner(&mut self, limit: std::time::Duration) -> Result<(), Trouble> {
        self.release_rounds(limit, &[Req::Disconnect, Req::Release])?;
        self.holding = false;
        Ok(())
    }

    /// Closes every import on every worker, and nothing more: for workers about to exit,
    /// whose exit frees what they own (each frees nothing at its end of input, see
    /// `WorkerState`'s drop), at less cost than a round of frees before it.
    pub(super) fn disconnect_inner(&mut self, limit: std::time::Duration) -> Result<(), Trouble> {
        self.release_rounds(limit, &[Req::Disconnect])
    }

    /// Sends each of `rounds` to every worker of every set at once, each answered by all
    /// before the next is sent.
    fn release_rounds(
        &mut self,
        limit: std::time::Duration,
        rounds: &[Req],
    ) -> Result<(), Trouble> {
        self.prepared = None;
        self.probe_bytes = 0;
        // Every opened handle is closed before any owner frees what it names.
        for req in rounds {
            let t = std::time::Instant::now();
            let reqs = self
                .sets
                .iter()
                .enumerate()
                .flat_map(|(s, set)| (0..set.workers.len()).map(move |w| (s, w)))
                .map(|at| (at, req.clone()))
                .collect();
            // Only the reply to this very request acknowledges it (ids match), and only
            // `Done` says the handles are closed.
            for r in self.exchange_sets(reqs, limit)? {
                if r != Resp::Done {
                    return Err(unexpected(r));
                }
            }
            // Disconnect closes the probe's imports too.
            self.probe_mapped = false;
            tracing::info!(
                "workers: {} in {:.2} s",
                match req {
                    Req::Disconnect => {
                        "every import closed (graphs, peers' buffers; NCCL communicators kept)"
                    }
                    _ => "every buffer freed",
                },
                t.elapsed().as_secs_f64()
            );
        }
        Ok(())
    }
}

/// The NCCL backends of `backends` the workers of `pin`'s set create: not waived, and not
/// timed by K rank processes (`ranked`).
fn nccl_here(
    backends: &[Backend],
    pin: Option<(NcclAlgo, NcclProto)>,
    waived: &BTreeMap<Backend, String>,
    ranked: &[Backend],
) -> Vec<Backend> {
    backends
        .iter()
        .copied()
        .filter(|b| b.is_nccl() && b.nccl_pin() == pin && !waived.contains_key(b))
        .filter(|b| !ranked.contains(b))
        .collect()
}

/// Why a loopback tune waives an NCCL pin, or None where K rank processes time it: `decision`
/// is [`ranked::loopback`](crate::fabric::cuda::nccl_ranks::ranked::loopback)'s (None: no NCCL).
fn loopback_pin(decision: Option<&Result<(), String>>) -> Option<String> {
    let why = match decision {
        Some(Ok(())) => return None,
        Some(Err(why)) => why.as_str(),
        None => "no NCCL was loaded",
    };
    Some(format!(
        "loopback runs NCCL with one rank, which only copies locally and uses no algorithm or \
         protocol, so pinning NCCL_ALGO/NCCL_PROTO measures nothing different from `nccl`; K \
         ranks on this GPU cannot run: {why}"
    ))
}

/// Whether NCCL's own choice is set up in the workers of `plan`.
fn nccl_ready(plan: &PreparedGroup) -> bool {
    plan.ready.iter().any(|(b, _)| *b == Backend::Nccl)
}

/// What `prepare` answers per backend asked for: waived with the reason, or ready with the
/// memory its workers measured beside what the model expects for `n` ranks.
fn readiness(
    backends: &[Backend],
    waived: &BTreeMap<Backend, String>,
    memory: &BTreeMap<Backend, u64>,
    ranks: Ranks,
    max_bytes: u64,
) -> Vec<Readiness> {
    backends
        .iter()
        .map(|&b| match (waived.get(&b), memory.get(&b)) {
            (Some(reason), _) => Readiness::Waived {
                backend: b,
                reason: reason.clone(),
            },
            (None, Some(&bytes)) => Readiness::Ready {
                backend: b,
                memory: crate::fabric::MemoryCost {
                    bytes_per_gpu: bytes,
                    measured: true,
                    modelled_bytes_per_gpu: memory::modelled(
                        b,
                        ranks,
                        max_bytes,
                        MODEL_NCCL_CHANNELS,
                    ),
                },
            },
            (None, None) => Readiness::Waived {
                backend: b,
                reason: "it was not set up".into(),
            },
        })
        .collect()
}

/// Why this fabric cannot run `b`'s executor on a group of `n` ranks, if it cannot.
fn executor_waiver(b: Backend, n: usize) -> Option<String> {
    executor_waiver_with(b, n, copy::runs())
}

/// [`executor_waiver`] with copy-engine backends switched on or off.
fn executor_waiver_with(b: Backend, n: usize, copies: bool) -> Option<String> {
    match b.executor() {
        Executor::Nccl => None,
        Executor::SmKernel => (n > MAX_RANKS).then(|| {
            format!("custom kernels support at most {MAX_RANKS} ranks; this group has {n}")
        }),
        Executor::CopyEngine(_) if !copies => Some(copy::SWITCHED_OFF.into()),
        Executor::CopyEngine(_) => (n > MAX_RANKS).then(|| {
            format!("copy-engine backends support at most {MAX_RANKS} ranks; this group has {n}")
        }),
    }
}

/// The loopback ranks' NCCL memory is not measured: each ranked pin is ready with the
/// model's figure, said so.
fn ranked_memory(out: &mut [Readiness], ranked: &[Backend], group: &Group) {
    for r in out.iter_mut() {
        if let Readiness::Waived { backend, .. } = *r {
            if ranked.contains(&backend) {
                let bytes =
                    memory::modelled(backend, group.ranks(), group.max_bytes, MODEL_NCCL_CHANNELS);
                *r = Readiness::Ready {
                    backend,
                    memory: crate::fabric::MemoryCost {
                        bytes_per_gpu: bytes,
                        measured: false,
                        modelled_bytes_per_gpu: bytes,
                    },
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_pins_run_as_k_ranks_where_nccl_can_else_the_waiver_says_what_is_needed() {
        assert_eq!(loopback_pin(Some(&Ok(()))), None);
        let old = crate::fabric::cuda::nccl_ranks::ranked::loopback(22703, None, 4);
        let why = loopback_pin(Some(&old)).unwrap();
        assert!(
            why.starts_with("loopback runs NCCL with one rank")
                && why.contains("cannot run: 4 ranks need 4 GPUs")
                && why.ends_with("set ARTUNE_NCCL_LIB to a newer libnccl.so.2"),
            "{why}"
        );
        assert!(loopback_pin(None).unwrap().ends_with("no NCCL was loaded"));
    }

    #[test]
    fn copy_rows_are_waived_when_switched_off_else_only_past_the_rank_limit() {
        let b = Backend::TwoStageCopy;
        assert_eq!(
            executor_waiver_with(b, 4, false).as_deref(),
            Some(copy::SWITCHED_OFF)
        );
        assert_eq!(executor_waiver_with(b, 4, true), None);
        let why = executor_waiver_with(b, MAX_RANKS + 1, true).unwrap();
        assert!(why.contains("at most 16 ranks"), "{why}");
        assert_eq!(executor_waiver_with(Backend::TwoStagePull, 4, false), None);
    }
}

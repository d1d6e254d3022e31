//! From measurements to choices: per size the backend that is significantly faster ([`rule`]),
//! smoothed into bands an engine can follow ([`bands`]), with the memory each choice needs.
//!
//! NCCL counts as no extra memory because an engine keeps its communicator in any case, so a
//! custom kernel must earn its IPC buffers.

pub mod bands;
pub mod rule;

use std::collections::BTreeMap;

pub use rule::{
    beats, beats_settled, beyond, choose, model_error, nccl_choice, open, unsettled, MIN_EFFECT,
};

use crate::allreduce::{memory, Backend, Dtype, MemoryCost, Mode, Readiness};
use crate::profile::{Bucket, Crossover, GroupProfile, Memory};
use crate::results::{GroupResults, Timing};

/// Extra memory per GPU a backend costs an engine to serve messages up to `bytes`.
pub fn extra_memory(backend: Backend, tp: usize, bytes: u64) -> u64 {
    if backend.is_custom() {
        memory::modelled(backend, tp, bytes, 0)
    } else {
        0
    }
}

/// The rule's choice for a group of `tp` ranks at `bytes` bytes, counting each custom kernel's
/// buffers as extra memory.
pub fn rule_choice(results: &BTreeMap<Backend, Timing>, tp: usize, bytes: u64) -> Option<Backend> {
    choose(results, |b| extra_memory(b, tp, bytes))
}

/// The choice at each measured size of a group of `tp` ranks, as its profile would make it:
/// the rule per size, then stable bands. The winner the plan refines around: a band edge
/// that smoothing places between two sizes where the rule's choice is the same is as much a
/// crossover as a change of the rule, and must be bisected as finely.
pub fn winner(
    cells: &BTreeMap<u64, BTreeMap<Backend, Timing>>,
    tp: usize,
) -> BTreeMap<u64, Backend> {
    let ruled: Vec<(u64, Backend, &BTreeMap<Backend, Timing>)> = cells
        .iter()
        .filter_map(|(&bytes, r)| Some((bytes, rule_choice(r, tp, bytes)?, r)))
        .collect();
    let steps: Vec<bands::Step> = ruled
        .iter()
        .map(|&(bytes, rule, results)| bands::Step {
            bytes,
            rule,
            results,
        })
        .collect();
    ruled
        .iter()
        .map(|(bytes, ..)| *bytes)
        .zip(bands::smooth(&steps))
        .collect()
}

/// Where the choice changes between neighbouring buckets: the first bucket of each new choice.
pub fn crossovers(buckets: &[Bucket]) -> Vec<Crossover> {
    buckets
        .windows(2)
        .filter(|w| w[0].choice != w[1].choice)
        .map(|w| Crossover {
            bytes: w[1].bytes,
            from: w[0].choice,
            to: w[1].choice,
        })
        .collect()
}

/// Decision settings for one group.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub mem_budget: Option<u64>,
}

/// Builds the profile of one group in one mode from its measurements.
pub fn group_profile(
    res: &GroupResults,
    mode: Mode,
    dtype: Dtype,
    policy: Policy,
    faults: &mut Vec<String>,
) -> GroupProfile {
    let tp = res.gpus.len();
    let mut waived_group: BTreeMap<Backend, String> = res.disqualified.clone();
    let mut costs: BTreeMap<Backend, MemoryCost> = BTreeMap::new();
    for r in &res.readiness {
        match r {
            Readiness::Waived { backend, reason } => {
                waived_group.insert(*backend, reason.clone());
            }
            Readiness::Ready { backend, memory } => {
                costs.insert(*backend, *memory);
            }
        }
    }
    // Largest message each custom backend may serve within the budget.
    let limit = |b: Backend| -> Option<u64> {
        let budget = policy.mem_budget?;
        if !b.is_custom() {
            return None;
        }
        Some(memory::largest_within(b, tp, budget, 0).unwrap_or(0))
    };

    // Per size: the eligible timings and the rule's choices; sizes with nothing measured drop out.
    let mut measured = Vec::new();
    let empty = BTreeMap::new();
    for (&bytes, results) in res.cells.get(&mode).unwrap_or(&empty) {
        let mut eligible = results.clone();
        let mut waived = BTreeMap::new();
        for b in results.keys() {
            if let Some(max) = limit(*b) {
                if bytes > max {
                    eligible.remove(b);
                    waived.insert(
                        *b,
                        format!(
                            "its buffers for {} need {} per GPU, above the memory budget of {}",
                            crate::units::fmt_bytes(bytes),
                            crate::units::fmt_bytes(memory::modelled(*b, tp, bytes, 0)),
                            crate::units::fmt_bytes(policy.mem_budget.unwrap_or(0))
                        ),
                    );
                }
            }
        }
        match choose(&eligible, |b| extra_memory(b, tp, bytes)) {
            Some(choice) => measured.push((bytes, choice, nccl_choice(&eligible), eligible, results, waived)),
            None => faults.push(format!(
                "GPUs {:?} {}: no backend could be measured at {}; the size is left out of the profile",
                res.gpus,
                mode.id(),
                crate::units::fmt_size(bytes)
            )),
        }
    }
    let steps: Vec<bands::Step> = measured
        .iter()
        .map(|(bytes, choice, _, eligible, _, _)| bands::Step {
            bytes: *bytes,
            rule: *choice,
            results: eligible,
        })
        .collect();
    let chosen = bands::smooth(&steps);
    let regret = bands::regret(&steps, &chosen);
    // The NCCL variant gets its own bands, among NCCL variants only: the plugin follows them.
    let nccl_only: Vec<BTreeMap<Backend, Timing>> = measured
        .iter()
        .map(|(.., eligible, _, _)| {
            eligible
                .iter()
                .filter(|(b, _)| !b.is_custom())
                .map(|(b, t)| (*b, *t))
                .collect()
        })
        .collect();
    let nccl_steps: Vec<bands::Step> = measured
        .iter()
        .zip(&nccl_only)
        .filter_map(|((bytes, _, nccl, ..), results)| {
            Some(bands::Step {
                bytes: *bytes,
                rule: (*nccl)?,
                results,
            })
        })
        .collect();
    let nccl_bands = if nccl_steps.len() == measured.len() {
        bands::smooth(&nccl_steps).into_iter().map(Some).collect()
    } else {
        measured
            .iter()
            .map(|(_, _, nccl, ..)| *nccl)
            .collect::<Vec<_>>()
    };
    let buckets: Vec<Bucket> = measured
        .into_iter()
        .zip(chosen)
        .zip(nccl_bands)
        .map(
            |(((bytes, _, _, _, results, waived), choice), nccl_choice)| Bucket {
                bytes,
                choice,
                nccl_choice,
                results: results.clone(),
                waived,
            },
        )
        .collect();

    let crossovers = crossovers(&buckets);

    let max_bytes = res
        .cells
        .values()
        .flat_map(|c| c.keys())
        .copied()
        .max()
        .unwrap_or(0);
    let memory = costs
        .iter()
        .map(|(&b, cost)| {
            let chosen_up_to = buckets
                .iter()
                .filter(|k| k.choice == b)
                .map(|k| k.bytes)
                .max();
            let required = match (b.is_custom(), chosen_up_to) {
                (true, Some(up_to)) => Some(memory::modelled(b, tp, up_to, 0)),
                (true, None) => None,
                (false, _) => Some(cost.bytes_per_gpu),
            };
            (
                b,
                Memory {
                    bytes_per_gpu: cost.bytes_per_gpu,
                    measured: cost.measured,
                    serves_up_to_bytes: b.is_custom().then_some(max_bytes),
                    chosen_up_to_bytes: chosen_up_to,
                    required_bytes_per_gpu: required,
                },
            )
        })
        .collect();

    GroupProfile {
        gpus: res.gpus.clone(),
        tp,
        mode,
        dtype,
        placement: res.placement.clone(),
        buckets,
        crossovers,
        memory,
        nccl_channels: res.nccl_channels,
        waived: waived_group,
        regret,
        drift: res
            .drift
            .get(&mode)
            .map(|d| d.iter().map(|(b, ln)| (*b, ln.exp() - 1.0)).collect())
            .unwrap_or_default(),
        beside: res.beside.clone(),
    }
}

#[cfg(test)]
mod tests;

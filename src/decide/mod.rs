//! From measurements to choices: per size the backend that is significantly faster ([`rule`]),
//! smoothed into bands an engine can follow ([`bands`]), with the memory each choice needs.
//!
//! NCCL counts as no extra memory because an engine keeps its communicator in any case, so a
//! custom kernel must earn its IPC buffers.

pub mod bands;
pub mod rule;

use std::collections::BTreeMap;

pub use rule::{
    beats, beats_settled, beyond, choose, model_error, nccl_choice, open, short, unsettled,
    verdict, Clause, Passed, Short, Verdict, MIN_EFFECT,
};

use crate::allreduce::{memory, Backend, Dtype, MemoryCost, Mode, Ranks, Readiness};
use crate::profile::{Bucket, Crossover, GroupProfile, Memory};
use crate::results::{GroupResults, Timing};
use crate::units::fmt_bytes;

/// Extra memory per GPU a backend costs an engine to serve messages up to `bytes`.
pub fn extra_memory(backend: Backend, ranks: Ranks, bytes: u64) -> u64 {
    if backend.is_custom() {
        memory::modelled(backend, ranks, bytes, 0)
    } else {
        0
    }
}

/// The rule's choice for a group of `ranks` at `bytes` bytes, counting each custom kernel's
/// buffers as extra memory.
pub fn rule_choice(
    results: &BTreeMap<Backend, Timing>,
    ranks: Ranks,
    bytes: u64,
) -> Option<Backend> {
    rule_verdict(results, ranks, bytes).map(|v| v.choice)
}

/// [`rule_choice`] with the clause that gave it and the margins that decided it.
pub fn rule_verdict(
    results: &BTreeMap<Backend, Timing>,
    ranks: Ranks,
    bytes: u64,
) -> Option<Verdict> {
    verdict(results, |b| extra_memory(b, ranks, bytes))
}

/// What an engine without artune's kernels runs at one size where `choice` is a backend no
/// engine has: the rule among the backends engines have. None where engines have `choice`.
pub fn fallback(
    choice: Backend,
    results: &BTreeMap<Backend, Timing>,
    ranks: Ranks,
    bytes: u64,
) -> Option<Backend> {
    if choice.engines_have() {
        return None;
    }
    let runnable: BTreeMap<Backend, Timing> = results
        .iter()
        .filter(|(b, _)| b.engines_have())
        .map(|(b, t)| (*b, *t))
        .collect();
    rule_choice(&runnable, ranks, bytes)
}

/// The choice at each measured size of a group of `ranks`, as its profile would make it:
/// the rule per size, then stable bands. The winner the plan refines around: a band edge
/// that smoothing places between two sizes where the rule's choice is the same is as much a
/// crossover as a change of the rule, and must be bisected as finely.
pub fn winner(
    cells: &BTreeMap<u64, BTreeMap<Backend, Timing>>,
    ranks: Ranks,
) -> BTreeMap<u64, Backend> {
    let ruled: Vec<(u64, Backend, &BTreeMap<Backend, Timing>)> = cells
        .iter()
        .filter_map(|(&bytes, r)| Some((bytes, rule_choice(r, ranks, bytes)?, r)))
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

/// What may serve a size besides speed: the memory a custom kernel's buffers may take.
#[derive(Debug, Clone, Copy)]
pub struct Constraints {
    pub mem_budget: Option<u64>,
}

impl Constraints {
    /// Why `b` may not serve `bytes` on `ranks`: its buffers for that size, the memory
    /// [`extra_memory`] counts, exceed the budget. The one place the budget applies.
    pub fn excludes(&self, b: Backend, ranks: Ranks, bytes: u64) -> Option<String> {
        let budget = self.mem_budget?;
        let need = extra_memory(b, ranks, bytes);
        (need > budget).then(|| {
            format!(
                "its buffers for {} need {} per GPU, above the memory budget of {}",
                fmt_bytes(bytes),
                crate::units::fmt_mem(need),
                fmt_bytes(budget)
            )
        })
    }
}

/// One measured size of a group: what may serve it and what the rule chose among those.
struct SizeChoice<'a> {
    bytes: u64,
    /// The rule's per-size choice, and the NCCL variant's among NCCL variants.
    rule: Backend,
    nccl: Option<Backend>,
    /// The timings of the backends within the memory budget.
    eligible: BTreeMap<Backend, Timing>,
    /// Every timing, and why a backend was excluded here.
    results: &'a BTreeMap<Backend, Timing>,
    waived: BTreeMap<Backend, String>,
}

/// Builds the profile of one group in one mode from its measurements.
pub fn group_profile(
    res: &GroupResults,
    mode: Mode,
    dtype: Dtype,
    policy: Constraints,
    faults: &mut Vec<String>,
) -> GroupProfile {
    let tp = res.gpus.len();
    let ranks = Ranks::of(tp, res.islands.as_ref());
    let (waived, costs) = readiness(res);
    let sizes = sizes(res, mode, policy, faults);
    let steps: Vec<bands::Step> = sizes
        .iter()
        .map(|s| bands::Step {
            bytes: s.bytes,
            rule: s.rule,
            results: &s.eligible,
        })
        .collect();
    let chosen = bands::smooth(&steps);
    let regret = bands::regret(&steps, &chosen);
    let nccl = nccl_bands(&sizes);
    let fallbacks = engine_bands(&sizes, ranks);
    let buckets: Vec<Bucket> = sizes
        .into_iter()
        .zip(chosen)
        .zip(nccl)
        .zip(fallbacks)
        .map(|(((s, choice), nccl_choice), fallback)| Bucket {
            bytes: s.bytes,
            choice,
            // Where NCCL serves, the variant it runs is the choice itself (the one answer
            // select, show and the plugin give); the NCCL-only bands stand where a kernel does.
            nccl_choice: match choice.executor() {
                crate::allreduce::Executor::Nccl => Some(choice),
                _ => nccl_choice,
            },
            fallback: fallback.filter(|_| !choice.engines_have()),
            results: s.results.clone(),
            waived: s.waived,
        })
        .collect();
    // The count measured fastest in this mode for each bucket's NCCL pin (measure::channels).
    let pin_channels = buckets
        .iter()
        .filter_map(|b| {
            let at = res.pin_channels.get(&mode)?.get(&b.nccl_choice?)?;
            Some((b.bytes, *at.get(&b.bytes)?))
        })
        .collect();
    // Only where a bucket pins a variant that would have had one.
    let pinned = |b: &Bucket| b.nccl_choice.is_some_and(|c| c.nccl_pin().is_some());
    let channels_unmeasured =
        (res.channels_unmeasured.get(&mode).cloned()).filter(|_| buckets.iter().any(pinned));
    GroupProfile {
        gpus: res.gpus.clone(),
        tp,
        mode,
        dtype,
        placement: res.placement.clone(),
        islands: res.islands.clone(),
        crossovers: crossovers(&buckets),
        memory: memory_table(res, &costs, &buckets),
        forms: res
            .forms
            .get(&mode)
            .into_iter()
            .flatten()
            .filter(|(b, _)| buckets.iter().any(|k| k.choice == **b))
            .map(|(b, f)| (*b, *f))
            .collect(),
        buckets,
        nccl_channels: res.nccl_channels,
        channels_unmeasured,
        pin_channels,
        waived,
        regret,
        drift: res
            .drift
            .get(&mode)
            .map(|d| d.iter().map(|(b, ln)| (*b, ln.exp() - 1.0)).collect())
            .unwrap_or_default(),
        beside: res.beside.clone(),
    }
}

/// The backends waived for the whole group (not set up, disqualified), and what each one
/// that was set up costs in memory.
fn readiness(res: &GroupResults) -> (BTreeMap<Backend, String>, BTreeMap<Backend, MemoryCost>) {
    let mut waived: BTreeMap<Backend, String> = res.disqualified.clone();
    let mut costs: BTreeMap<Backend, MemoryCost> = BTreeMap::new();
    for r in &res.readiness {
        match r {
            Readiness::Waived { backend, reason } => {
                waived.insert(*backend, reason.clone());
            }
            Readiness::Ready { backend, memory } => {
                costs.insert(*backend, *memory);
            }
        }
    }
    (waived, costs)
}

/// Per measured size: the timings within the memory budget and the rule's choices among them;
/// a size where nothing can be chosen is left out, and said so in `faults`.
fn sizes<'a>(
    res: &'a GroupResults,
    mode: Mode,
    policy: Constraints,
    faults: &mut Vec<String>,
) -> Vec<SizeChoice<'a>> {
    let ranks = Ranks::of(res.gpus.len(), res.islands.as_ref());
    let mut out = Vec::new();
    let Some(cells) = res.cells.get(&mode) else {
        return out;
    };
    for (&bytes, results) in cells {
        let waived: BTreeMap<Backend, String> = results
            .keys()
            .filter_map(|&b| Some((b, policy.excludes(b, ranks, bytes)?)))
            .collect();
        let eligible: BTreeMap<Backend, Timing> = results
            .iter()
            .filter(|(b, _)| !waived.contains_key(b))
            .map(|(b, t)| (*b, *t))
            .collect();
        match choose(&eligible, |b| extra_memory(b, ranks, bytes)) {
            Some(rule) => out.push(SizeChoice {
                bytes,
                rule,
                nccl: nccl_choice(&eligible),
                eligible,
                results,
                waived,
            }),
            None => faults.push(format!(
                "GPUs {} {}: no backend could be measured at {}; the size is left out of the profile",
                crate::topology::fmt_gpus(&res.gpus),
                mode.id(),
                crate::units::fmt_size(bytes)
            )),
        }
    }
    out
}

/// The NCCL variant per size, in bands of its own among NCCL variants only: the plugin
/// follows them. Where a size has no NCCL variant to choose, the per-size choices stand.
fn nccl_bands(sizes: &[SizeChoice<'_>]) -> Vec<Option<Backend>> {
    let nccl_only: Vec<BTreeMap<Backend, Timing>> = sizes
        .iter()
        .map(|s| {
            s.eligible
                .iter()
                .filter(|(b, _)| !b.is_custom())
                .map(|(b, t)| (*b, *t))
                .collect()
        })
        .collect();
    let steps: Vec<bands::Step> = sizes
        .iter()
        .zip(&nccl_only)
        .filter_map(|(s, results)| {
            Some(bands::Step {
                bytes: s.bytes,
                rule: s.nccl?,
                results,
            })
        })
        .collect();
    if steps.len() == sizes.len() {
        bands::smooth(&steps).into_iter().map(Some).collect()
    } else {
        sizes.iter().map(|s| s.nccl).collect()
    }
}

/// The bands among the backends engines have (NCCL and the flat kernels): what an engine
/// without artune's kernels runs where the profile chooses one only artune runs. The same rule
/// and smoothing as the profile's own choice, on the timings of those backends.
fn engine_bands(sizes: &[SizeChoice<'_>], ranks: Ranks) -> Vec<Option<Backend>> {
    let runnable: Vec<(u64, BTreeMap<Backend, Timing>)> = sizes
        .iter()
        .map(|s| {
            let r = s
                .eligible
                .iter()
                .filter(|(b, _)| b.engines_have())
                .map(|(b, t)| (*b, *t))
                .collect();
            (s.bytes, r)
        })
        .collect();
    let ruled: Vec<Option<Backend>> = runnable
        .iter()
        .map(|(bytes, r)| rule_choice(r, ranks, *bytes))
        .collect();
    if ruled.iter().any(Option::is_none) {
        return ruled;
    }
    let steps: Vec<bands::Step> = runnable
        .iter()
        .zip(&ruled)
        .map(|((bytes, results), rule)| bands::Step {
            bytes: *bytes,
            rule: rule.unwrap_or(Backend::Nccl),
            results,
        })
        .collect();
    bands::smooth(&steps).into_iter().map(Some).collect()
}

/// Per backend set up: what it cost, up to which size it was chosen, and what serving those
/// sizes needs.
fn memory_table(
    res: &GroupResults,
    costs: &BTreeMap<Backend, MemoryCost>,
    buckets: &[Bucket],
) -> BTreeMap<Backend, Memory> {
    let ranks = Ranks::of(res.gpus.len(), res.islands.as_ref());
    let max_bytes = res
        .cells
        .values()
        .flat_map(|c| c.keys())
        .copied()
        .max()
        .unwrap_or(0);
    costs
        .iter()
        .map(|(&b, cost)| {
            let chosen_up_to = buckets
                .iter()
                .filter(|k| k.choice == b)
                .map(|k| k.bytes)
                .max();
            let required = match (b.is_custom(), chosen_up_to) {
                (true, Some(up_to)) => Some(memory::modelled(b, ranks, up_to, 0)),
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
        .collect()
}

#[cfg(test)]
mod tests;

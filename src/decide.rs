//! From measurements to choices: which GPU subsets to tune, which sizes, and per size the
//! backend that is significantly faster.
//!
//! A backend wins a size only if its advantage is statistically significant: the 95% CIs of
//! the medians do not overlap. Among backends the fastest is not significantly faster than,
//! the one costing the least *extra* memory wins; NCCL counts as zero extra because an engine
//! keeps its communicator in any case, so a custom kernel must earn its IPC buffers.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::Error;
use crate::fabric::{memory, Backend, Dtype, Mode, Readiness};
use crate::measure::GroupResults;
use crate::profile::{Bucket, Crossover, GroupProfile, Memory, Timing};
use crate::topology::{PathClass, Topology};

/// Default TP sizes: powers of two from 2 up to the GPU count.
pub fn default_tp(gpus: usize) -> Vec<usize> {
    (1..)
        .map(|k| 1usize << k)
        .take_while(|&t| t <= gpus)
        .collect()
}

/// Parses `--tp 2,4,8` against the machine's GPU count.
pub fn parse_tp(items: &[String], gpus: usize) -> Result<Vec<usize>, Error> {
    let mut out = BTreeSet::new();
    for it in items {
        let t: usize = it.trim().parse().map_err(|_| {
            Error::bad_input(format!(
                "--tp `{it}` is not a number; give TP sizes like --tp 2,4,8"
            ))
        })?;
        if t < 2 || t > gpus {
            return Err(Error::bad_input(format!(
                "--tp {t} does not fit this machine of {gpus} GPUs; choose sizes from 2 to {gpus}"
            )));
        }
        out.insert(t);
    }
    if out.is_empty() {
        return Err(Error::bad_input(
            "--tp is empty; give TP sizes like --tp 2,4,8",
        ));
    }
    Ok(out.into_iter().collect())
}

/// Size grid: every power of two in [lo, hi], plus lo and hi themselves.
pub fn size_grid(lo: u64, hi: u64) -> Vec<u64> {
    let mut s: BTreeSet<u64> = (0..63)
        .map(|k| 1u64 << k)
        .filter(|&b| b >= lo && b <= hi)
        .collect();
    s.insert(lo);
    s.insert(hi);
    s.into_iter().collect()
}

/// What sets a GPU subset apart: the multiset of pair path classes and how many switches,
/// root complexes and sockets it spans. Subsets with equal signatures behave alike.
fn signature(t: &Topology, gpus: &[usize]) -> (Vec<(String, usize)>, usize, usize, usize) {
    let mut classes: BTreeMap<String, usize> = BTreeMap::new();
    for (i, &a) in gpus.iter().enumerate() {
        for &b in &gpus[i + 1..] {
            let label = t
                .pair(a, b)
                .map_or_else(|| "?".into(), |p| p.path.label(p.nvlinks));
            *classes.entry(label).or_default() += 1;
        }
    }
    // Over NVLink the PCIe tree carries no allreduce traffic: path classes say it all.
    if classes.keys().all(|k| k.starts_with("NV")) {
        return (classes.into_iter().collect(), 0, 0, 0);
    }
    let parents: BTreeSet<&str> = gpus
        .iter()
        .filter_map(|&g| t.gpus.get(g))
        .map(|g| g.parent.as_str())
        .collect();
    let rcs: BTreeSet<String> = gpus
        .iter()
        .filter_map(|&g| t.root_of(g))
        .map(|r| r.id.clone())
        .collect();
    let sockets: BTreeSet<u32> = gpus.iter().filter_map(|&g| t.socket_of(g)).collect();
    (
        classes.into_iter().collect(),
        parents.len(),
        rcs.len(),
        sockets.len(),
    )
}

/// A short human label for a subset, e.g. "1 switch" or "2 switches, 1 root complex".
pub fn placement_label(t: &Topology, gpus: &[usize]) -> String {
    let all_nv = gpus.iter().enumerate().all(|(i, &a)| {
        gpus[i + 1..]
            .iter()
            .all(|&b| t.pair(a, b).is_some_and(|p| p.path == PathClass::NV))
    });
    if t.origin.kind == "loopback" {
        return "loopback: virtual ranks on one GPU".into();
    }
    if all_nv {
        return if t.nvswitch.is_some() {
            "NVSwitch".into()
        } else {
            "NVLink".into()
        };
    }
    let (_, parents, rcs, sockets) = signature(t, gpus);
    let switches = gpus
        .iter()
        .filter_map(|&g| t.gpus.get(g))
        .filter(|g| t.switch(&g.parent).is_some())
        .map(|g| g.parent.as_str())
        .collect::<BTreeSet<_>>()
        .len();
    let rc = if rcs == 1 {
        "1 root complex".to_string()
    } else {
        format!("{rcs} root complexes")
    };
    let mut parts = Vec::new();
    if switches > 0 {
        parts.push(if switches == 1 {
            "1 switch".to_string()
        } else {
            format!("{switches} switches")
        });
    } else {
        parts.push(if parents == 1 {
            "1 root port".to_string()
        } else {
            format!("{parents} root ports")
        });
    }
    if switches != 1 {
        parts.push(rc);
    }
    if sockets > 1 {
        parts.push(format!("{sockets} sockets"));
    }
    parts.join(", ")
}

/// GPU subsets of size `tp` worth tuning: ranks on GPUs 0..tp (what engines do by default)
/// first, then subsets that differ in topology class (not every subset), at most `max`.
pub fn placements(t: &Topology, tp: usize, max: usize) -> Vec<(Vec<usize>, String)> {
    let n = t.gpu_count();
    let mut candidates: Vec<Vec<usize>> = Vec::new();
    for start in (0..n).step_by((tp / 2).max(1)) {
        if start + tp <= n {
            candidates.push((start..start + tp).collect());
        }
    }
    for stride in 2..=n / tp {
        candidates.push((0..tp).map(|i| i * stride).collect());
    }
    // One GPU from each island in turn, so small groups that span islands are seen.
    let islands = t.islands();
    let mut spread = Vec::new();
    for k in 0.. {
        let before = spread.len();
        for isl in &islands {
            if let Some(&g) = isl.get(k) {
                if spread.len() < tp {
                    spread.push(g);
                }
            }
        }
        if spread.len() == tp || spread.len() == before {
            break;
        }
    }
    if spread.len() == tp {
        spread.sort_unstable();
        candidates.push(spread);
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for c in candidates {
        if out.len() >= max {
            break;
        }
        if seen.insert(signature(t, &c)) {
            let label = placement_label(t, &c);
            out.push((c, label));
        }
    }
    out
}

/// Extra memory per GPU a backend costs an engine to serve messages up to `bytes`.
pub fn extra_memory(backend: Backend, tp: usize, bytes: u64) -> u64 {
    if backend.is_custom() {
        memory::modelled(backend, tp, bytes, 0)
    } else {
        0
    }
}

/// An advantage smaller than this fraction is not worth more memory or a pinned NCCL
/// setting, however tight the confidence intervals are.
pub const MIN_EFFECT: f64 = 0.05;

/// The backend to use given the timings at one size; `extra` is each backend's extra memory.
pub fn choose(
    results: &BTreeMap<Backend, Timing>,
    extra: impl Fn(Backend) -> u64,
) -> Option<Backend> {
    let (_, fastest) = results
        .iter()
        .min_by(|a, b| a.1.median_us.total_cmp(&b.1.median_us))?;
    results
        .iter()
        // Ties with the fastest: the CIs overlap (not statistically significant) or the gap is
        // under MIN_EFFECT (not practically significant).
        .filter(|(_, t)| {
            t.ci_low_us <= fastest.ci_high_us
                || t.median_us <= fastest.median_us * (1.0 + MIN_EFFECT)
        })
        .min_by(|(a, ta), (b, tb)| {
            extra(**a)
                .cmp(&extra(**b))
                .then((**a != Backend::Nccl).cmp(&(**b != Backend::Nccl)))
                .then(ta.median_us.total_cmp(&tb.median_us))
        })
        .map(|(b, _)| *b)
}

/// Sizes to measure next: midpoints where the winner changes between neighbouring sizes,
/// until neighbours are within 1/8 of each other.
pub fn refine_points(
    cells: &BTreeMap<u64, BTreeMap<Backend, Timing>>,
    disqualified: &BTreeMap<Backend, String>,
    tp: usize,
    dtype: Dtype,
) -> Vec<u64> {
    let align = (tp as u64 * 16).max(256).max(dtype.size());
    let winners: Vec<(u64, Option<Backend>)> = cells
        .iter()
        .map(|(&bytes, r)| {
            let r: BTreeMap<Backend, Timing> = r
                .iter()
                .filter(|(b, _)| !disqualified.contains_key(b))
                .map(|(b, t)| (*b, *t))
                .collect();
            (bytes, choose(&r, |b| extra_memory(b, tp, bytes)))
        })
        .collect();
    let mut out = Vec::new();
    for w in winners.windows(2) {
        let ((a, wa), (b, wb)) = (w[0], w[1]);
        if wa == wb || b - a <= (a / 8).max(align) {
            continue;
        }
        let mid = (a + (b - a) / 2) / align * align;
        if mid > a && mid < b && !cells.contains_key(&mid) {
            out.push(mid);
        }
    }
    out
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
    let mut costs: BTreeMap<Backend, crate::fabric::MemoryCost> = BTreeMap::new();
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

    let mut buckets = Vec::new();
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
            Some(choice) => buckets.push(Bucket { bytes, choice, results: results.clone(), waived }),
            None => faults.push(format!(
                "GPUs {:?} {}: no backend could be measured at {bytes} bytes; the size is left out of the profile",
                res.gpus,
                mode.id()
            )),
        }
    }

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
    }
}

#[cfg(test)]
mod tests;

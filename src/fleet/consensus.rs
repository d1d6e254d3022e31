//! The class profile: per TP group, mode and size, the median over the class's good nodes of
//! each backend's time and the choice most of them made, so every node of the class can use one
//! profile. Outliers, nodes on other versions or that tuned other groups, and (in a measured
//! class) simulated ones are left out and named.

use std::collections::{BTreeMap, HashSet};

use super::read::{Collected, NodeInfo};
use super::{majority, ClassReport, FleetReport};
use crate::allreduce::{Backend, Mode};
use crate::error::Error;
use crate::profile::{
    Bucket, Fingerprint, Fleet, GroupProfile, LeftOut, Profile, Timing, Versions,
};
use crate::stats::{median_ci_indices, median_sorted};

/// A group's consensus buckets and the channel count of each bucket's pin, by its bytes.
type GroupBuckets = (Vec<Bucket>, BTreeMap<u64, u32>);

/// The class profile of `class` from its (per-mode) reports; None when no node is left to
/// build it from.
pub fn class_profile(
    c: &Collected,
    report: &FleetReport,
    class: &str,
) -> Option<Result<Profile, Error>> {
    let modes: Vec<&ClassReport> = report
        .classes
        .iter()
        .filter(|r| r.topology_class == class)
        .collect();
    // Group details (placement, memory, islands, channels) come from a node the profile is
    // built from: it tuned the groups most of the class tuned, which are the ones here.
    let usual = super::usual_groups(c, report.dtype, class);
    let first = modes
        .iter()
        .flat_map(|r| r.included.iter().copied())
        .filter(|&i| c.nodes[i].groups == usual)
        .min()?;
    let template = match super::read::reread(c, first) {
        Ok(mut t) => {
            for g in &mut t.groups {
                g.buckets.clear();
                g.crossovers.clear();
            }
            t
        }
        Err(e) => return Some(Err(e)),
    };
    let template = &template;
    let mut groups = Vec::new();
    let mut included: Vec<usize> = Vec::new();
    for r in &modes {
        let data = &c.classes[&(report.dtype, class.to_string(), r.mode)];
        let good: HashSet<usize> = r.included.iter().copied().collect();
        for &i in &r.included {
            if !included.contains(&i) {
                included.push(i);
            }
        }
        groups.extend(mode_groups(template, report.dtype, r.mode, data, &good));
    }
    if groups.is_empty() {
        return None;
    }
    let mut tps: Vec<usize> = groups.iter().map(|g: &GroupProfile| g.tp).collect();
    tps.sort_unstable();
    tps.dedup();
    let modes_held: Vec<Mode> = [Mode::Graph, Mode::Eager]
        .into_iter()
        .filter(|m| groups.iter().any(|g| g.mode == *m))
        .collect();
    let nodes: Vec<&NodeInfo> = included.iter().map(|&i| &c.nodes[i]).collect();
    let all: Vec<_> = nodes.iter().map(|n| n.versions.clone()).collect();
    let versions = super::compare::usual_versions(&all).0;
    let simulated = nodes.iter().any(|n| n.simulated);
    let mut topology = template.topology.clone();
    for g in &mut topology.gpus {
        g.uuid = None;
    }
    topology.host.hostname = None;
    topology.host.driver = versions.0.clone();
    topology.host.cuda = versions.1.clone();
    topology.host.nccl = versions.2.clone();
    let left_out: Vec<LeftOut> = modes
        .iter()
        .flat_map(|r| {
            r.left_out.iter().map(|l| LeftOut {
                node: l.node.clone(),
                reason: format!("{}: {}", r.mode.id(), l.reason),
            })
        })
        .collect();
    let p = Profile {
        schema_version: crate::profile::SCHEMA_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").into(),
        created: crate::profile::utc_now(),
        simulated,
        fabric: format!(
            "fleet consensus of {} {}node{} of class {class}",
            included.len(),
            if simulated { "simulated " } else { "" },
            if included.len() == 1 { "" } else { "s" }
        ),
        fingerprint: Fingerprint {
            topology_class: class.to_string(),
            host: topology.host_hash(),
        },
        versions: Versions {
            driver: versions.0,
            cuda: versions.1,
            nccl: versions.2,
        },
        topology,
        groups,
        contention: Vec::new(),
        // What the profile holds, not what the template node was asked for.
        settings: crate::profile::Settings {
            tp: tps,
            modes: modes_held,
            ..template.settings.clone()
        },
        faults: Vec::new(),
        node: None,
        fleet: Some(Fleet {
            nodes: included.iter().map(|&i| report.names[i].clone()).collect(),
            left_out,
        }),
        assumed: Vec::new(),
        environment: template.environment.clone(),
        recovered: Vec::new(),
        // The template node's kernels: a node that compiled others is refused by the
        // in-engine allreduce, which then keeps the engine's path.
        kernels: match simulated {
            true => Vec::new(),
            false => template.kernels.clone(),
        },
    };
    Some(crate::profile::validate_built(&p).map(|()| p))
}

/// The class's groups of one mode from the good nodes' entries in `data`: per cell, the median
/// of each backend's times and the choice most of them made.
fn mode_groups(
    template: &Profile,
    dtype: crate::allreduce::Dtype,
    mode: Mode,
    data: &super::read::ClassData,
    good: &HashSet<usize>,
) -> Vec<GroupProfile> {
    // Per cell: backend values and choices of the good nodes.
    let mut values: BTreeMap<u32, BTreeMap<Backend, Vec<f64>>> = BTreeMap::new();
    let mut choices: BTreeMap<u32, Vec<Backend>> = BTreeMap::new();
    let mut pins: BTreeMap<u32, Vec<(Backend, u32)>> = BTreeMap::new();
    for e in data.entries.iter().filter(|e| good.contains(&e.node)) {
        for &(cell, pin, c) in &e.pins {
            pins.entry(cell).or_default().push((pin, c));
        }
        for &(cell, b, us) in &e.times {
            values
                .entry(cell)
                .or_default()
                .entry(b)
                .or_default()
                .push(us as f64);
        }
        for &(cell, b) in &e.choices {
            choices.entry(cell).or_default().push(b);
        }
    }
    let mut by_group: BTreeMap<(usize, Vec<usize>), GroupBuckets> = BTreeMap::new();
    for (cell, per) in values {
        let cc = &data.cells[cell as usize];
        let picks = choices.remove(&cell).unwrap_or_default();
        // A size only some nodes refined to is not the class's.
        if picks.len() * 2 < good.len() {
            continue;
        }
        let results: BTreeMap<Backend, Timing> =
            per.into_iter().map(|(b, v)| (b, nodes_timing(v))).collect();
        let Some(choice) = majority(picks.into_iter().filter(|b| results.contains_key(b))) else {
            continue;
        };
        // The one rule on the class's medians: no node's own plugin answer decides.
        let nccl_choice = crate::decide::nccl_choice(&results);
        let (buckets, channels) = by_group.entry((cc.tp, cc.gpus.clone())).or_default();
        let measured = pins.remove(&cell).unwrap_or_default();
        if let Some(c) = nccl_choice.and_then(|p| pin_channels(p, &measured)) {
            channels.insert(cc.bytes, c);
        }
        buckets.push(Bucket {
            bytes: cc.bytes,
            choice,
            nccl_choice,
            fallback: None,
            results,
            waived: BTreeMap::new(),
        });
    }
    by_group
        .into_iter()
        .map(|((tp, gpus), (mut buckets, channels))| {
            buckets.sort_by_key(|b| b.bytes);
            group(template, dtype, (tp, gpus), mode, buckets, channels)
        })
        .collect()
}

/// One backend's class timing at one size from the good nodes' medians `v`: their median,
/// with the order statistics of its 95% interval.
fn nodes_timing(mut v: Vec<f64>) -> Timing {
    v.sort_by(f64::total_cmp);
    let (lo, hi) = median_ci_indices(v.len());
    Timing {
        median_us: median_sorted(&v),
        ci_low_us: v[lo],
        ci_high_us: v[hi],
        samples: v.len() as u32,
        outliers: 0,
        model: None,
    }
}

/// The channel count the class pins `pin` with at one size, from the good nodes' `measured`
/// (pin, count) there: the count most of the nodes that pinned the same variant measured
/// fastest, the smaller on a tie (as one node's sweep keeps the smaller count within its
/// gain); nodes that pinned another variant measured channels for it, not for this one. None
/// where no node measured it: the bucket then keeps the group's `nccl_channels`.
pub fn pin_channels(pin: Backend, measured: &[(Backend, u32)]) -> Option<u32> {
    majority(measured.iter().filter(|(p, _)| *p == pin).map(|&(_, c)| c))
}

/// A group of the class profile: the template's placement and memory, the consensus buckets
/// and the channels of their pins.
fn group(
    template: &Profile,
    dtype: crate::allreduce::Dtype,
    (tp, gpus): (usize, Vec<usize>),
    mode: Mode,
    mut buckets: Vec<Bucket>,
    pin_channels: BTreeMap<u64, u32>,
) -> GroupProfile {
    let t = template
        .groups
        .iter()
        .find(|g| g.tp == tp && g.gpus == gpus && g.mode == mode);
    let ranks = crate::allreduce::Ranks::of(tp, t.and_then(|t| t.islands.as_ref()));
    for b in &mut buckets {
        b.fallback = crate::decide::fallback(b.choice, &b.results, ranks, b.bytes);
    }
    let crossovers = crate::decide::crossovers(&buckets);
    let steps: Vec<crate::decide::bands::Step> = buckets
        .iter()
        .map(|b| crate::decide::bands::Step {
            bytes: b.bytes,
            rule: b.choice,
            results: &b.results,
        })
        .collect();
    let chosen: Vec<Backend> = buckets.iter().map(|b| b.choice).collect();
    let regret = crate::decide::bands::regret(&steps, &chosen);
    let mut memory = t.map(|t| t.memory.clone()).unwrap_or_default();
    for (b, m) in memory.iter_mut() {
        m.chosen_up_to_bytes = buckets
            .iter()
            .filter(|k| k.choice == *b)
            .map(|k| k.bytes)
            .max();
        if m.chosen_up_to_bytes.is_none() {
            m.required_bytes_per_gpu = None;
        }
    }
    GroupProfile {
        gpus,
        tp,
        mode,
        dtype,
        placement: t.map(|t| t.placement.clone()).unwrap_or_default(),
        islands: t.and_then(|t| t.islands.clone()),
        buckets,
        crossovers,
        memory,
        // The forms the template's kernels ran, for the backends the consensus still chooses.
        forms: t
            .map(|t| t.forms.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|(b, _)| chosen.contains(b))
            .collect(),
        nccl_channels: t.and_then(|t| t.nccl_channels),
        // The template's reason, where no node measured a count for the class's pins.
        channels_unmeasured: t
            .and_then(|t| t.channels_unmeasured.clone())
            .filter(|_| pin_channels.is_empty()),
        pin_channels,
        waived: BTreeMap::new(),
        regret,
        // The template node's variation: the consensus keeps its placement and memory too.
        drift: t.map(|t| t.drift.clone()).unwrap_or_default(),
        // Nodes measured beside other work are the nodes' own record, not the class's.
        beside: Vec::new(),
    }
}

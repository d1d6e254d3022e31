//! The GPU subsets worth tuning, and the islands the hierarchical backends work in.

use std::collections::{BTreeMap, BTreeSet};

use super::Placement;
use crate::allreduce::{Islands, Separation};
use crate::topology::{PathClass, Topology};

/// The islands of `gpus`: the sets that the slowest crossing among them separates (GPUs
/// joined by anything faster than the worst path class of the group), so the island schedule
/// crosses that link once with a shard per GPU where flat kernels cross it with every pair.
/// Err says, in a sentence, why the group has none: NVLink or one kind of path throughout
/// (nothing to work around), a GPU alone in its island, or islands of unequal size.
pub fn islands(t: &Topology, gpus: &[usize]) -> Result<Islands, String> {
    let class = |a: usize, b: usize| t.pair(a, b).map(|p| p.path);
    let mut worst = PathClass::X;
    let mut best = PathClass::SYS;
    for (i, &a) in gpus.iter().enumerate() {
        for &b in &gpus[i + 1..] {
            let c = class(a, b).ok_or_else(|| {
                format!("the topology has no path between GPUs {a} and {b}, so its islands cannot be derived")
            })?;
            worst = worst.max(c);
            best = best.min(c);
        }
    }
    let list = format!("{gpus:?}");
    if worst == PathClass::NV {
        return Err(format!(
            "every pair of GPUs {list} is joined by NVLink: one island, nothing to cross"
        ));
    }
    if worst == best {
        return Err(format!(
            "every pair of GPUs {list} is joined alike ({worst:?}): one island, no slower crossing to work around"
        ));
    }
    // Islands: the components of "joined by a faster path than the worst".
    let mut island_of: Vec<usize> = (0..gpus.len()).collect();
    for i in 0..gpus.len() {
        for j in i + 1..gpus.len() {
            if class(gpus[i], gpus[j]).is_some_and(|c| c < worst) {
                let (a, b) = (island_of[i], island_of[j]);
                island_of
                    .iter_mut()
                    .filter(|x| **x == b)
                    .for_each(|x| *x = a);
            }
        }
    }
    let mut sets: Vec<Vec<usize>> = Vec::new();
    let mut seen: Vec<usize> = Vec::new();
    for (i, &g) in gpus.iter().enumerate() {
        match seen.iter().position(|&k| k == island_of[i]) {
            Some(k) => sets[k].push(g),
            None => {
                seen.push(island_of[i]);
                sets.push(vec![g]);
            }
        }
    }
    // Named for what holds each island together: the slowest path inside one.
    let within = sets
        .iter()
        .flat_map(|s| {
            s.iter()
                .enumerate()
                .flat_map(move |(i, &a)| s[i + 1..].iter().map(move |&b| (a, b)))
        })
        .filter_map(|(a, b)| class(a, b))
        .max()
        .unwrap_or(PathClass::X);
    let by = match within {
        PathClass::X | PathClass::NV => Separation::Nvlink,
        PathClass::PIX | PathClass::PXB => Separation::Switch,
        PathClass::PHB => Separation::RootComplex,
        PathClass::NODE | PathClass::SYS => Separation::Socket,
    };
    equal_islands(sets, by)
}

/// Islands of the given sizes, over a group's GPUs in rank order (`--islands`).
pub fn given_islands(gpus: &[usize], sizes: &[usize]) -> Result<Islands, String> {
    if sizes.iter().sum::<usize>() != gpus.len() {
        return Err(format!(
            "islands of {sizes:?} GPUs add up to {}, not to the group's {} GPUs",
            sizes.iter().sum::<usize>(),
            gpus.len()
        ));
    }
    let mut at = 0;
    let sets = sizes
        .iter()
        .map(|&k| {
            at += k;
            gpus[at - k..at].to_vec()
        })
        .collect();
    equal_islands(sets, Separation::Given)
}

/// `sets` as islands, if the island schedules can run on them: two or more, of equal size,
/// two or more GPUs each.
fn equal_islands(sets: Vec<Vec<usize>>, by: Separation) -> Result<Islands, String> {
    let shown: Vec<String> = sets.iter().map(|s| format!("{s:?}")).collect();
    let shown = shown.join(" ");
    if let Some(alone) = sets.iter().find(|s| s.len() < 2) {
        return Err(format!(
            "GPU {} is alone in its {} (islands {shown}): an island schedule needs 2 or more GPUs in every island",
            alone.first().copied().unwrap_or_default(),
            by.noun()
        ));
    }
    if sets.windows(2).any(|w| w[0].len() != w[1].len()) {
        return Err(format!(
            "the islands {shown} are of unequal size: the island schedules need islands of equal size"
        ));
    }
    if sets.len() < 2 {
        return Err(format!("{shown} is one island: nothing to cross"));
    }
    Ok(Islands {
        gpus: sets,
        by,
        directions: None,
    })
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
/// first, then subsets that differ in topology class (not every subset), at most `max`; each
/// with its islands, from the topology or, for a group of as many GPUs as `given` sums to,
/// of those sizes (`--islands`).
pub fn placements(t: &Topology, tp: usize, max: usize, given: Option<&[usize]>) -> Vec<Placement> {
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
    let under = t.islands();
    let mut spread = Vec::new();
    for k in 0.. {
        let before = spread.len();
        for isl in &under {
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
            let split = match given {
                Some(sizes) if sizes.iter().sum::<usize>() == c.len() => given_islands(&c, sizes),
                _ => islands(t, &c),
            };
            out.push(Placement {
                gpus: c,
                label,
                islands: split,
            });
        }
    }
    out
}

/// Every peer count up to this many is probed; past it, a curve doubles.
const PROBE_DENSE: usize = 8;

/// The peer counts a contention probe of `n` GPUs runs, ascending: each up to [`PROBE_DENSE`]
/// (all of them on a machine of 9 GPUs or fewer), then doubling, plus the two the islands are
/// oriented by (`Islands::orient`: one island's peers and every peer), so a large group probes
/// O(log n) times and orients as it would with every count.
pub fn probe_peers(n: usize, island: Option<usize>) -> Vec<usize> {
    let last = n.saturating_sub(1);
    let mut out: BTreeSet<usize> = (1..=last.min(PROBE_DENSE)).collect();
    let doubling = std::iter::successors(Some(PROBE_DENSE * 2), |k| k.checked_mul(2));
    out.extend(doubling.take_while(|&k| k < last));
    out.extend(island.map(|s| s.saturating_sub(1)).filter(|&k| k >= 1));
    if last >= 1 {
        out.insert(last);
    }
    out.into_iter().collect()
}

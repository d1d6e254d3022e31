//! What to measure, before anything is measured: TP sizes, the size grid, the GPU subsets worth
//! tuning, and where to refine the grid once a first pass shows where the winner changes.

use std::collections::{BTreeMap, BTreeSet};

use crate::allreduce::{Backend, Dtype, Islands, Ll, Ranks, Separation};
use crate::results::Timing;
use crate::topology::{PathClass, Topology};

/// The decision's choice at each size of a group of `ranks`, given its timings per size
/// (sizes where nothing can be chosen are left out). Passed in so planning does not depend on
/// deciding.
pub type Winner = fn(&BTreeMap<u64, BTreeMap<Backend, Timing>>, Ranks) -> BTreeMap<u64, Backend>;

/// A GPU subset to tune: its GPUs in rank order, what sets it apart, and the islands the
/// hierarchical backends work in (or why it has none).
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub gpus: Vec<usize>,
    pub label: String,
    pub islands: Result<Islands, String>,
}

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

/// The backends at one size whose comparisons the decision's choice hangs on and more samples
/// could still turn (close calls). Passed in for the same reason as [`Winner`].
pub type CloseCalls = fn(&BTreeMap<Backend, Timing>) -> BTreeSet<Backend>;

/// Default TP sizes: powers of two from 2 up to the GPU count.
pub fn default_tp(gpus: usize) -> Vec<usize> {
    (1..)
        .map(|k| 1usize << k)
        .take_while(|&t| t <= gpus)
        .collect()
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

/// The granularity of every size artune adds between grid points: whole elements, and at
/// least 16 bytes per rank (and 256 in all) so each rank's share stays vector-aligned.
pub fn alignment(tp: usize, dtype: Dtype) -> u64 {
    (tp as u64 * 16).max(256).max(dtype.size())
}

/// Whether two sizes are within one refinement step of each other: 1/8 of the smaller, or
/// one `align` unit where that is coarser. Bisection stops here, so crossovers are only
/// known to this resolution.
pub fn within_step(a: u64, b: u64, align: u64) -> bool {
    let (lo, hi) = (a.min(b), a.max(b));
    hi - lo <= (lo / 8).max(align)
}

/// The aligned size bisection puts between `a < b`, unless they are already within a step.
fn split(a: u64, b: u64, align: u64) -> Option<u64> {
    if within_step(a, b, align) {
        return None;
    }
    let mid = (a + (b - a) / 2) / align * align;
    (mid > a && mid < b).then_some(mid)
}

/// The reference grid: [`size_grid`] plus every size bisection could ever add between its
/// points (7 per octave, aligned by `align`), so a tune on it needs no refinement and its
/// crossovers are where a refined tune's should converge.
pub fn fine_grid(lo: u64, hi: u64, align: u64) -> Vec<u64> {
    fn fill(a: u64, b: u64, align: u64, out: &mut BTreeSet<u64>) {
        if let Some(mid) = split(a, b, align) {
            out.insert(mid);
            fill(a, mid, align, out);
            fill(mid, b, align, out);
        }
    }
    let coarse = size_grid(lo, hi);
    let mut out: BTreeSet<u64> = coarse.iter().copied().collect();
    for w in coarse.windows(2) {
        fill(w[0], w[1], align, &mut out);
    }
    out.into_iter().collect()
}

/// The sizes of the fine grid just past each LL limit of `backends` (the table's
/// `Ll::max_bytes`) within [lo, hi]: a kernel changes form there and its time jumps, which
/// the winners at the powers of two on either side need not show (the limits are powers of
/// two). Measured from the first pass, a change of winner across the jump is then bisected
/// like any other.
pub fn form_edges(backends: &[Backend], lo: u64, hi: u64, align: u64) -> Vec<u64> {
    let fine = fine_grid(lo, hi, align);
    let limits: BTreeSet<u64> = backends
        .iter()
        .filter_map(|b| b.spec().kernel?.ll.map(Ll::max_bytes))
        .filter(|&l| lo <= l && l < hi)
        .collect();
    limits
        .into_iter()
        .filter_map(|l| fine.iter().copied().find(|&s| s > l))
        .collect()
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

/// Medians within this share of each other are taken as the same code path: NCCL running the
/// pinned variant it chose itself. Beyond twice it, clearly another.
const TWIN: f64 = 0.02;

/// The pinned NCCL variants NCCL's own choice may have run at one size, recognised by their
/// time: those whose median is within [`TWIN`] of `nccl`'s (more than one where pins tie), and
/// those clearly not (beyond twice it), as masks over [`Backend::ALL`].
fn nccl_twins(results: &BTreeMap<Backend, Timing>) -> (u64, u64) {
    let Some(own) = results.get(&Backend::Nccl).map(|t| t.median_us) else {
        return (0, 0);
    };
    let mut masks = (0, 0);
    for (b, t) in results.iter().filter(|(b, _)| b.nccl_pin().is_some()) {
        let Some(i) = Backend::ALL.iter().position(|x| x == b) else {
            continue;
        };
        let gap = (t.median_us / own - 1.0).abs();
        if gap <= TWIN {
            masks.0 |= 1 << i;
        } else if gap > 2.0 * TWIN {
            masks.1 |= 1 << i;
        }
    }
    masks
}

/// Sizes to measure next: midpoints where the choice changes between neighbouring sizes,
/// or where NCCL's own choice changes its algorithm or protocol, seen as NCCL matching a pin
/// at one end that it clearly does not match at the other (its tuning model switches where it
/// predicts, and a pinned variant can beat it anywhere between where it truly wins and that
/// switch, though both ends agree), until neighbours are within one step ([`within_step`]).
pub fn refine_points(
    cells: &BTreeMap<u64, BTreeMap<Backend, Timing>>,
    disqualified: &BTreeMap<Backend, String>,
    ranks: Ranks,
    dtype: Dtype,
    winner: Winner,
) -> Vec<u64> {
    let align = alignment(ranks.n, dtype);
    // Every backend is eligible unless one was disqualified: then the cells without it.
    let filtered;
    let eligible = if disqualified.is_empty() {
        cells
    } else {
        filtered = cells
            .iter()
            .map(|(&bytes, r)| {
                let r = r
                    .iter()
                    .filter(|(b, _)| !disqualified.contains_key(b))
                    .map(|(b, t)| (*b, *t))
                    .collect();
                (bytes, r)
            })
            .collect::<BTreeMap<u64, BTreeMap<Backend, Timing>>>();
        &filtered
    };
    let chosen = winner(eligible, ranks);
    let sizes: Vec<u64> = cells.keys().copied().collect();
    let twins: Vec<(u64, u64)> = sizes.iter().map(|s| nccl_twins(&eligible[s])).collect();
    let mut out = Vec::new();
    for (i, w) in sizes.windows(2).enumerate() {
        let (a, b) = (w[0], w[1]);
        let ((x, x_off), (y, y_off)) = (twins[i], twins[i + 1]);
        // NCCL matched a pin at one end that it clearly does not match at the other.
        let switched = x != 0 && y != 0 && (x & y_off != 0 || y & x_off != 0);
        if chosen.get(&a) == chosen.get(&b) && !switched {
            continue;
        }
        if let Some(mid) = split(a, b, align).filter(|m| !cells.contains_key(m)) {
            out.push(mid);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::presets;

    fn t(median: f64, half: f64) -> Timing {
        Timing::around(median, half)
    }

    #[test]
    fn refinement_bisects_where_winner_changes() {
        let cells: BTreeMap<u64, BTreeMap<Backend, Timing>> = [
            (
                32768,
                [
                    (Backend::Nccl, t(20.0, 0.1)),
                    (Backend::OneStagePull, t(10.0, 0.1)),
                ]
                .into(),
            ),
            (
                65536,
                [
                    (Backend::Nccl, t(22.0, 0.1)),
                    (Backend::OneStagePull, t(15.0, 0.1)),
                ]
                .into(),
            ),
            (
                131072,
                [
                    (Backend::Nccl, t(30.0, 0.1)),
                    (Backend::OneStagePull, t(45.0, 0.1)),
                ]
                .into(),
            ),
        ]
        .into();
        assert_eq!(
            refine_points(
                &cells,
                &BTreeMap::new(),
                Ranks::flat(8),
                Dtype::Bf16,
                crate::decide::winner
            ),
            vec![98304]
        );
        let mut dq = BTreeMap::new();
        dq.insert(Backend::OneStagePull, "wrong".to_string());
        assert!(refine_points(
            &cells,
            &dq,
            Ranks::flat(8),
            Dtype::Bf16,
            crate::decide::winner
        )
        .is_empty());
    }

    #[test]
    fn refinement_bisects_where_nccl_switches_protocol() {
        // NCCL agrees with its ring/LL pin at 1 MiB and its ring/Simple pin at 2 MiB: its
        // model switched protocol in between, where Simple may already win.
        let at = |nccl: f64, ll: f64, simple: f64| -> BTreeMap<Backend, Timing> {
            [
                (Backend::Nccl, t(nccl, 0.5)),
                (Backend::NcclRingLl, t(ll, 0.5)),
                (Backend::NcclRingSimple, t(simple, 0.5)),
            ]
            .into()
        };
        let cells: BTreeMap<u64, BTreeMap<Backend, Timing>> = [
            (1 << 20, at(100.0, 100.2, 97.0)),
            (2 << 20, at(150.0, 190.0, 150.3)),
        ]
        .into();
        let winner = crate::decide::winner;
        assert_eq!(
            refine_points(
                &cells,
                &BTreeMap::new(),
                Ranks::flat(8),
                Dtype::Bf16,
                winner
            ),
            vec![3 << 19]
        );
        // Two pins tie with NCCL at one end, one of them alone at the other: NCCL may have
        // switched from the other, so look in between.
        let tied: BTreeMap<u64, BTreeMap<Backend, Timing>> = [
            (1 << 20, at(100.0, 100.2, 99.9)),
            (2 << 20, at(150.0, 190.0, 150.3)),
        ]
        .into();
        assert_eq!(
            refine_points(&tied, &BTreeMap::new(), Ranks::flat(8), Dtype::Bf16, winner),
            vec![3 << 19]
        );
        // The same code path at both ends: nothing to look for in between.
        let same: BTreeMap<u64, BTreeMap<Backend, Timing>> = [
            (1 << 20, at(100.0, 100.2, 97.0)),
            (2 << 20, at(190.0, 190.3, 200.0)),
        ]
        .into();
        assert!(
            refine_points(&same, &BTreeMap::new(), Ranks::flat(8), Dtype::Bf16, winner).is_empty()
        );
        // A tied pin drifting just past the twin share at the other end, not clearly away:
        // noise, not a switch, so nothing to look for.
        let drift: BTreeMap<u64, BTreeMap<Backend, Timing>> = [
            (1 << 20, at(100.0, 100.2, 101.9)),
            (2 << 20, at(150.0, 150.2, 154.5)),
        ]
        .into();
        assert!(refine_points(
            &drift,
            &BTreeMap::new(),
            Ranks::flat(8),
            Dtype::Bf16,
            winner
        )
        .is_empty());
    }

    #[test]
    fn grids_and_tp() {
        assert_eq!(default_tp(8), vec![2, 4, 8]);
        assert_eq!(default_tp(6), vec![2, 4]);
        assert_eq!(size_grid(1024, 8192), vec![1024, 2048, 4096, 8192]);
        assert_eq!(size_grid(1000, 3000), vec![1000, 1024, 2048, 3000]);
    }

    #[test]
    fn the_grid_steps_past_every_ll_limit() {
        // One-stage push's LL form runs to 32 KiB, two-stage push's to 64 KiB: the first fine
        // sizes past them, an eighth above.
        let all = form_edges(&Backend::ALL, 1024, 256 << 20, 256);
        assert_eq!(all, vec![36 << 10, 72 << 10]);
        assert_eq!(
            form_edges(&[Backend::TwoStagePush], 1024, 1 << 20, 256),
            vec![72 << 10]
        );
        assert!(form_edges(&[Backend::OneStagePull, Backend::Nccl], 1024, 1 << 20, 256).is_empty());
        // Limits outside the range add nothing.
        assert!(form_edges(&Backend::ALL, 128 << 10, 1 << 20, 256).is_empty());
        assert!(form_edges(&Backend::ALL, 1024, 16 << 10, 256).is_empty());
    }

    #[test]
    fn the_fine_grid_is_every_size_bisection_can_reach() {
        let g = fine_grid(1 << 20, 1 << 21, 256);
        let eighth = (1u64 << 20) / 8;
        assert_eq!(
            g,
            (0..=8).map(|i| (1 << 20) + i * eighth).collect::<Vec<_>>()
        );
        // Below 2 KiB an eighth is finer than the alignment: steps of 256 bytes.
        assert_eq!(
            fine_grid(1024, 2048, 256),
            vec![1024, 1280, 1536, 1792, 2048]
        );
        assert_eq!(fine_grid(1024, 256 << 20, 256).len(), 19 + 18 * 7 - 4);
        // Bisection with the winner changing at every size, for as many rounds as it takes,
        // lands on the same grid.
        let alternating = |sizes: &[u64]| -> BTreeMap<u64, BTreeMap<Backend, Timing>> {
            sizes
                .iter()
                .enumerate()
                .map(|(i, &b)| {
                    let (fast, slow) = if i % 2 == 0 {
                        (Backend::Nccl, Backend::OneStagePull)
                    } else {
                        (Backend::OneStagePull, Backend::Nccl)
                    };
                    (b, [(fast, t(10.0, 0.1)), (slow, t(20.0, 0.1))].into())
                })
                .collect()
        };
        let mut sizes = size_grid(1024, 1 << 20);
        loop {
            let cells = alternating(&sizes);
            let more = refine_points(
                &cells,
                &BTreeMap::new(),
                Ranks::flat(8),
                Dtype::Bf16,
                crate::decide::winner,
            );
            if more.is_empty() {
                break;
            }
            sizes.extend(more);
            sizes.sort_unstable();
        }
        assert_eq!(sizes, fine_grid(1024, 1 << 20, alignment(8, Dtype::Bf16)));
    }

    #[test]
    fn one_step_is_an_eighth_or_one_alignment_unit() {
        assert!(within_step(1 << 20, (1 << 20) + (1 << 17), 256));
        assert!(!within_step(1 << 20, (1 << 20) + (1 << 17) + 256, 256));
        assert!(within_step((1 << 20) + (1 << 17), 1 << 20, 256));
        assert!(within_step(1024, 1280, 256));
        assert!(!within_step(1024, 1536, 256));
    }

    #[test]
    fn placements_differ_in_class() {
        let t = presets::get("pcie-8x-2switch").unwrap();
        let p4 = placements(&t, 4, 3, None);
        assert_eq!(p4[0].gpus, vec![0, 1, 2, 3]);
        assert_eq!(p4[0].label, "1 switch");
        assert!(
            p4.iter().any(|p| p.label == "2 switches, 1 root complex"),
            "{p4:?}"
        );
        let p2 = placements(&t, 2, 3, None);
        assert_eq!(p2.len(), 2, "{p2:?}");
        let p8 = placements(&t, 8, 3, None);
        assert_eq!(p8.len(), 1);
        let nv = presets::get("nvswitch-8x").unwrap();
        let p = placements(&nv, 4, 3, None);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].label, "NVSwitch");
        let d = presets::get("pcie-8x-direct-2socket").unwrap();
        assert!(placements(&d, 4, 3, None)
            .iter()
            .any(|p| p.label.contains("2 sockets")));
    }

    #[test]
    fn islands_are_what_the_slowest_crossing_separates() {
        let t = presets::get("pcie-8x-2switch").unwrap();
        let i = islands(&t, &[0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
        assert_eq!(i.gpus, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert_eq!(i.by, Separation::Switch);
        // Rank order is kept inside each island.
        let i = islands(&t, &[4, 0, 5, 1]).unwrap();
        assert_eq!(i.gpus, vec![vec![4, 5], vec![0, 1]]);
        let e = islands(&t, &[0, 1, 2, 3]).unwrap_err();
        assert!(e.contains("joined alike (PIX)"), "{e}");
        let e = islands(&t, &[0, 1, 2, 4]).unwrap_err();
        assert!(e.contains("GPU 4 is alone in its switch"), "{e}");
        let e = islands(&t, &[0, 1, 2, 4, 5]).unwrap_err();
        assert!(e.contains("unequal size"), "{e}");
        let d = presets::get("pcie-8x-direct-2socket").unwrap();
        let i = islands(&d, &[0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
        assert_eq!((i.count(), i.by), (2, Separation::Socket));
        let nv = presets::get("nvswitch-8x").unwrap();
        assert!(islands(&nv, &[0, 1, 2, 3]).unwrap_err().contains("NVLink"));
        // The override: consecutive ranks, checked as derived ones are.
        let g = given_islands(&[0, 4, 1, 5], &[2, 2]).unwrap();
        assert_eq!(g.gpus, vec![vec![0, 4], vec![1, 5]]);
        assert!(given_islands(&[0, 1, 2], &[1, 2])
            .unwrap_err()
            .contains("alone"));
        assert!(given_islands(&[0, 1, 2], &[2, 2])
            .unwrap_err()
            .contains("add up to 4"));
        let p8 = placements(&t, 8, 3, Some(&[2, 2, 2, 2]));
        assert_eq!(p8[0].islands.as_ref().unwrap().count(), 4);
    }
}

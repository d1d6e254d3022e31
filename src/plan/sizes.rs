//! The sizes to measure: the grid, the sizes past each LL limit, and where to refine it once
//! a first pass shows where the winner changes.

use std::collections::{BTreeMap, BTreeSet};

use super::Winner;
use crate::allreduce::{Backend, Dtype, Ll, Ranks};
use crate::results::Timing;

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

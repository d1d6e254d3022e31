//! What to measure, before anything is measured: TP sizes, the size grid, the GPU subsets worth
//! tuning, and where to refine the grid once a first pass shows where the winner changes.

use std::collections::{BTreeMap, BTreeSet};

use crate::allreduce::{Backend, Islands, Ranks};
use crate::results::Timing;

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

/// The backends at one size whose comparisons the decision's choice hangs on and more samples
/// could still turn (close calls). Passed in for the same reason as [`Winner`].
pub type CloseCalls = fn(&BTreeMap<Backend, Timing>) -> BTreeSet<Backend>;

mod groups;
mod sizes;

pub use self::groups::{given_islands, islands, placement_label, placements, probe_peers};
pub use self::sizes::{
    alignment, default_tp, fine_grid, form_edges, refine_points, size_grid, within_step,
};

#[cfg(test)]
mod tests;

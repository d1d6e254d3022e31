//! What measuring one GPU set produced: the hand-over from measure to decide, below both.

use std::collections::BTreeMap;

use crate::allreduce::{Backend, Islands, Mode, Readiness};
use crate::profile::{ContentionCurve, GroupPhases, Timing};

/// Everything measured on one GPU set.
#[derive(Debug, Clone, Default)]
pub struct GroupResults {
    pub gpus: Vec<usize>,
    pub placement: String,
    /// The islands the hierarchical backends ran in, oriented by the probe.
    pub islands: Option<Islands>,
    pub readiness: Vec<Readiness>,
    /// Backends that failed verification or timed out, for the whole group.
    pub disqualified: BTreeMap<Backend, String>,
    /// Per mode, per size, per backend.
    pub cells: BTreeMap<Mode, BTreeMap<u64, BTreeMap<Backend, Timing>>>,
    pub contention: Vec<ContentionCurve>,
    pub nccl_channels: Option<u32>,
    /// Where this group's measuring time went.
    pub phases: GroupPhases,
    /// Per mode and backend, the largest |ln| of the ratio between a cell's revisit median
    /// and its first visit's, seconds apart: how far this machine moved the backend while it
    /// was measured, which a later `check --measure` must not mistake for a change.
    pub drift: BTreeMap<Mode, BTreeMap<Backend, f64>>,
}

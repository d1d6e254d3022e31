//! What measuring one GPU set produced: the hand-over from measure to decide, below both.
//! The timings and curves here are kept in the profile as they are (the profile re-exports them).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::allreduce::{Backend, Direction, Form, Islands, Mode, ProbeSample, Readiness};

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
    /// NCCL's run-time channels (`Fabric::nccl_channels`).
    pub nccl_channels: Option<u32>,
    /// Per mode, pinned NCCL variant and size, the channel count measured fastest in that
    /// mode (`measure::channels`); empty where the fabric cannot set NCCL's channels per call.
    pub pin_channels: BTreeMap<Mode, BTreeMap<Backend, BTreeMap<u64, u32>>>,
    /// Per mode, why no channel count was timed for the pins, where none was.
    pub channels_unmeasured: BTreeMap<Mode, String>,
    /// Where this group's measuring time went.
    pub phases: GroupPhases,
    /// Per mode and backend, the largest |ln| of the ratio between a cell's revisit median
    /// and its first visit's, seconds apart: how far this machine moved the backend while it
    /// was measured, which a later `check --measure` must not mistake for a change.
    pub drift: BTreeMap<Mode, BTreeMap<Backend, f64>>,
    /// Other processes seen on the GPUs while this group was measured (`--allow-busy`).
    pub beside: Vec<crate::topology::occupancy::BusyGpu>,
    /// Per mode, the form each custom backend was timed in, where the fabric tells.
    pub forms: BTreeMap<Mode, BTreeMap<Backend, Form>>,
}

/// One backend's timing at one size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Timing {
    pub median_us: f64,
    /// 95% confidence interval of the median.
    pub ci_low_us: f64,
    pub ci_high_us: f64,
    pub samples: u32,
    /// Samples set aside as outliers (beyond 3 scaled MADs) before the median was taken.
    #[serde(default)]
    pub outliers: u32,
    /// Simulated times only: how wrong the model can be, as factors on the median
    /// (fabric/sim/band.rs, docs/MODEL-ERROR.md). The steering rule widens the interval by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelBand>,
}

/// The simulator's error band on one time: the true time lies within
/// [median · low, median · high] as far as the calibration residuals can tell.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ModelBand {
    pub low: f64,
    pub high: f64,
    /// Whether a property the topology did not state widened it.
    #[serde(default)]
    pub assumed: bool,
    /// The model the time came from. Two times of one family share the parts whose error
    /// dominates, so their ratio does not carry the band (decide::rule). None: unknown,
    /// taken as independent of every other time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<ModelFamily>,
}

/// Which half of the simulator a time came from: NCCL's model (copy-engine links, root
/// complex and sockets, then the protocol) or the custom kernels' (loads and stores under
/// switch contention).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ModelFamily {
    Nccl,
    Custom,
    /// The copy-engine backends' (sim/copy/): copy-engine flows and assumed fixed costs.
    CopyEngine,
}

impl ModelFamily {
    /// The model a backend's simulated times come from: its executor's.
    pub fn of(b: crate::allreduce::Backend) -> ModelFamily {
        match b.executor() {
            crate::allreduce::Executor::Nccl => ModelFamily::Nccl,
            crate::allreduce::Executor::SmKernel => ModelFamily::Custom,
            crate::allreduce::Executor::CopyEngine(_) => ModelFamily::CopyEngine,
        }
    }
}

impl From<crate::fabric::TimeBand> for ModelBand {
    fn from(b: crate::fabric::TimeBand) -> ModelBand {
        ModelBand {
            low: b.low,
            high: b.high,
            assumed: b.assumed,
            family: Some(match b.model {
                crate::fabric::TimeModel::Nccl => ModelFamily::Nccl,
                crate::fabric::TimeModel::Custom => ModelFamily::Custom,
                crate::fabric::TimeModel::CopyEngine => ModelFamily::CopyEngine,
            }),
        }
    }
}

/// A contention curve: bandwidth as more peers transfer at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ContentionCurve {
    pub gpus: Vec<usize>,
    pub direction: Direction,
    /// Bytes each GPU moved with each peer per probe.
    pub bytes: u64,
    pub points: Vec<ProbeSample>,
}

/// Seconds one GPU group spent in each phase, both modes together.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GroupPhases {
    pub gpus: Vec<usize>,
    /// Preparing and releasing the backends: buffers, IPC handles, NCCL communicators.
    pub setup_s: f64,
    pub probes_s: f64,
    /// Checking each backend's results against a reference before it is timed.
    pub verify_s: f64,
    /// Warm-up and timed samples, CUDA-graph capture included.
    pub timing_s: f64,
}

#[cfg(test)]
impl Timing {
    /// A timing with the median's 95% interval `half` either side (20 samples), for tests.
    pub(crate) fn around(median: f64, half: f64) -> Timing {
        Timing {
            median_us: median,
            ci_low_us: median - half,
            ci_high_us: median + half,
            samples: 20,
            outliers: 0,
            model: None,
        }
    }
}

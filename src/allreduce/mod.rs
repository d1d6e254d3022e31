//! What an allreduce is, in the words every layer shares: its backends (one table: NCCL and its
//! pinned variants, the flat and the island kernels), islands, element types, launch modes,
//! probe directions, and what each backend's buffers cost. Below the fabric, the profile and the exports, so none of them
//! depends on the hardware seam.

mod backend;
mod form;
pub mod islands;
pub mod memory;

pub use backend::{
    copy_engines_on, Backend, Buffers, CopySum, Count, EnginePath, Executor, Extent, Family,
    Kernel, Ll, Part, Peers, Phase, Plane, Schedule, Spec, COPY_ENGINE_SWITCH, TABLE,
};
pub use form::Form;
pub use islands::{phases_in_words, Directions, Islands, Ranks, Separation};
pub use memory::MemoryCost;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// NCCL algorithm, as NCCL_ALGO names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum NcclAlgo {
    Ring,
    Tree,
}

/// NCCL protocol, as NCCL_PROTO names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum NcclProto {
    LL,
    LL128,
    Simple,
}

impl NcclAlgo {
    pub fn name(self) -> &'static str {
        match self {
            NcclAlgo::Ring => "Ring",
            NcclAlgo::Tree => "Tree",
        }
    }
}

impl NcclProto {
    pub fn name(self) -> &'static str {
        match self {
            NcclProto::LL => "LL",
            NcclProto::LL128 => "LL128",
            NcclProto::Simple => "Simple",
        }
    }
}

/// How the engine launches collectives: captured in a CUDA graph (decode) or one by one.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Graph,
    Eager,
}

impl Mode {
    pub fn id(self) -> &'static str {
        match self {
            Mode::Graph => "graph",
            Mode::Eager => "eager",
        }
    }
}

/// Element type reduced.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    Bf16,
    Fp16,
    Fp32,
}

impl Dtype {
    pub const ALL: [Dtype; 3] = [Dtype::Bf16, Dtype::Fp16, Dtype::Fp32];

    pub fn size(self) -> u64 {
        match self {
            Dtype::Bf16 | Dtype::Fp16 => 2,
            Dtype::Fp32 => 4,
        }
    }

    pub fn id(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
            Dtype::Fp32 => "fp32",
        }
    }
}

/// Which way a contention probe moves bytes.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Each GPU reads from its peers (non-posted).
    Read,
    /// Each GPU writes into its peers (posted).
    Write,
}

/// One point of a contention curve: every GPU of the group moves `bytes` with each of `peers`
/// peers at once (peer i+1 .. i+peers), all starting together.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProbeSample {
    pub peers: usize,
    /// Mean over GPUs of bytes each GPU moved per second, GB/s.
    pub per_gpu_gbps: f64,
    /// All bytes moved by all GPUs per second, GB/s.
    pub aggregate_gbps: f64,
}

/// Outcome of preparing one backend for a group: what a fabric's `prepare` answers, and what
/// the results hand to the decision, so neither depends on the fabric for it.
#[derive(Debug, Clone, PartialEq)]
pub enum Readiness {
    Ready {
        backend: Backend,
        memory: MemoryCost,
    },
    Waived {
        backend: Backend,
        reason: String,
    },
}

impl Readiness {
    pub fn backend(&self) -> Backend {
        match self {
            Readiness::Ready { backend, .. } | Readiness::Waived { backend, .. } => *backend,
        }
    }
}

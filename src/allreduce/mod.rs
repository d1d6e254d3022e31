//! What an allreduce is, in the words every layer shares: its backends (NCCL and its pinned
//! variants, the custom kernels), element types, launch modes, probe directions, and what each
//! backend's buffers cost. Below the fabric, the profile and the exports, so none of them
//! depends on the hardware seam.

pub mod memory;

pub use memory::MemoryCost;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An allreduce implementation. The serialized ids are a contract with profile readers.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// NCCL with its own algorithm and protocol choice.
    Nccl,
    NcclRingLl,
    NcclRingLl128,
    NcclRingSimple,
    NcclTreeLl,
    NcclTreeLl128,
    NcclTreeSimple,
    /// Every GPU reads all peers' inputs through peer memory and reduces locally.
    OneStagePull,
    /// Every GPU writes its input into every peer's receive slot, then each reduces locally.
    OneStagePush,
    /// Reduce-scatter by reading peers' shards, then all-gather by reading peers' results.
    TwoStagePull,
    /// Reduce-scatter by writing shards to their owners, then all-gather by writing results.
    TwoStagePush,
}

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

impl Backend {
    pub const ALL: [Backend; 11] = [
        Backend::Nccl,
        Backend::NcclRingLl,
        Backend::NcclRingLl128,
        Backend::NcclRingSimple,
        Backend::NcclTreeLl,
        Backend::NcclTreeLl128,
        Backend::NcclTreeSimple,
        Backend::OneStagePull,
        Backend::OneStagePush,
        Backend::TwoStagePull,
        Backend::TwoStagePush,
    ];

    /// The id written in profiles, e.g. "one_stage_pull".
    pub fn id(self) -> &'static str {
        match self {
            Backend::Nccl => "nccl",
            Backend::NcclRingLl => "nccl_ring_ll",
            Backend::NcclRingLl128 => "nccl_ring_ll128",
            Backend::NcclRingSimple => "nccl_ring_simple",
            Backend::NcclTreeLl => "nccl_tree_ll",
            Backend::NcclTreeLl128 => "nccl_tree_ll128",
            Backend::NcclTreeSimple => "nccl_tree_simple",
            Backend::OneStagePull => "one_stage_pull",
            Backend::OneStagePush => "one_stage_push",
            Backend::TwoStagePull => "two_stage_pull",
            Backend::TwoStagePush => "two_stage_push",
        }
    }

    pub fn from_id(id: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.id() == id)
    }

    /// A peer-to-peer kernel of ours (needs P2P and IPC buffers), as opposed to NCCL.
    pub fn is_custom(self) -> bool {
        matches!(
            self,
            Backend::OneStagePull
                | Backend::OneStagePush
                | Backend::TwoStagePull
                | Backend::TwoStagePush
        )
    }

    pub fn is_nccl(self) -> bool {
        !self.is_custom()
    }

    /// The algorithm and protocol NCCL is pinned to; None for NCCL's own choice and custom kernels.
    pub fn nccl_pin(self) -> Option<(NcclAlgo, NcclProto)> {
        use NcclAlgo::*;
        use NcclProto::*;
        Some(match self {
            Backend::NcclRingLl => (Ring, LL),
            Backend::NcclRingLl128 => (Ring, LL128),
            Backend::NcclRingSimple => (Ring, Simple),
            Backend::NcclTreeLl => (Tree, LL),
            Backend::NcclTreeLl128 => (Tree, LL128),
            Backend::NcclTreeSimple => (Tree, Simple),
            _ => return None,
        })
    }

    /// Reads peers (pull) rather than writes to them (push).
    pub fn pulls(self) -> bool {
        matches!(self, Backend::OneStagePull | Backend::TwoStagePull)
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.id())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_roundtrip_and_match_serde() {
        for b in Backend::ALL {
            assert_eq!(Backend::from_id(b.id()), Some(b));
            assert_eq!(
                serde_json::to_string(&b).unwrap(),
                format!("\"{}\"", b.id())
            );
        }
    }
}

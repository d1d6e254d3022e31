//! The one seam between the tuner and hardware.
//!
//! 1. Build a fabric: [`sim::SimFabric`] (runs anywhere, always labelled simulated) or
//!    [`cuda::CudaFabric`] (the machine's real GPUs).
//! 2. [`Fabric::prepare`] a TP group with the backends to try; each comes back ready with its
//!    memory cost, or waived with the reason.
//! 3. [`Fabric::verify`] each backend on fresh random data, then [`Fabric::time`] it; run
//!    [`Fabric::probe`] for contention curves. Nothing above this trait knows which fabric it
//!    talks to.

pub mod cuda;
pub mod memory;
pub mod sim;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::topology::Topology;

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

/// A tensor-parallel group to prepare.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// GPU indices of the topology, in rank order.
    pub gpus: Vec<usize>,
    pub dtype: Dtype,
    /// Largest message (bytes) any backend will be asked to reduce: sizes IPC buffers.
    pub max_bytes: u64,
}

impl Group {
    /// Checks the group fits a machine of `gpu_count` GPUs: 2 or more GPUs, each existing and
    /// listed once, and a largest message of at least 1 byte. Every fabric's `prepare` starts here.
    pub fn check(&self, gpu_count: usize) -> Result<(), FabricError> {
        let bad = |m: String| Err(FabricError::BadRequest(m));
        let last = gpu_count.saturating_sub(1);
        if self.gpus.len() < 2 {
            return bad(format!(
                "a group needs at least 2 GPUs, this one has {}; pick 2 or more of GPUs 0..{last}",
                self.gpus.len()
            ));
        }
        if let Some(g) = self.gpus.iter().find(|&&g| g >= gpu_count) {
            return bad(format!(
                "GPU {g} does not exist; this machine has GPUs 0..{last}"
            ));
        }
        let mut seen = self.gpus.clone();
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!(
                "GPU {} appears twice in the group; list each GPU once",
                w[0]
            ));
        }
        if self.max_bytes == 0 {
            return bad("a group's largest message must be at least 1 byte".into());
        }
        Ok(())
    }
}

/// What one backend costs each GPU of the group.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MemoryCost {
    /// The figure to trust: measured where `measured`, else modelled.
    pub bytes_per_gpu: u64,
    /// True when read from the device (cuMemGetInfo before/after setup).
    pub measured: bool,
    /// What the model predicts, kept beside a measurement for comparison.
    pub modelled_bytes_per_gpu: u64,
}

/// Outcome of preparing one backend.
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

/// Result of checking a backend's output against a host reference.
#[derive(Debug, Clone, PartialEq)]
pub enum Verification {
    Correct,
    Wrong { reason: String },
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

/// What a fabric is, for the profile header.
#[derive(Debug, Clone, PartialEq)]
pub struct FabricInfo {
    pub simulated: bool,
    /// Human description, e.g. "simulated pcie-8x-2switch" or "CUDA 13.0, 1 x NVIDIA H200".
    pub description: String,
    pub driver: Option<String>,
    pub cuda: Option<String>,
    pub nccl: Option<String>,
}

/// Failures below the seam.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// The request itself is wrong (a GPU index out of range, a group of one).
    #[error("{0}")]
    BadRequest(String),
    /// A backend did not finish within its deadline; the run can go on with others.
    #[error("{backend} did not finish within {seconds:.1} s ({what}); it was aborted")]
    Timeout {
        backend: Backend,
        what: String,
        seconds: f64,
    },
    /// One backend failed (launch error, out of memory); the run can go on with others.
    #[error("{backend} failed: {reason}")]
    Backend { backend: Backend, reason: String },
    /// The device, driver or a library failed; the run cannot continue.
    #[error("{0}")]
    Device(String),
    /// What was asked cannot run on this group (contention probes between GPUs without working
    /// P2P); the run goes on without it.
    #[error("{0}")]
    Waived(String),
    #[error("interrupted")]
    Interrupted,
}

impl FabricError {
    /// True when only one backend is affected and the tune can continue without it.
    pub fn backend_local(&self) -> bool {
        matches!(
            self,
            FabricError::Timeout { .. } | FabricError::Backend { .. }
        )
    }
}

/// The hardware seam. See the module docs for the order of calls.
pub trait Fabric {
    fn info(&self) -> FabricInfo;

    fn topology(&self) -> &Topology;

    /// Sets up `backends` on `group` (communicators, IPC buffers, compiled kernels) and
    /// returns, per backend in the same order, its memory cost or why it is waived. Replaces
    /// any group prepared before.
    fn prepare(
        &mut self,
        group: &Group,
        backends: &[Backend],
    ) -> Result<Vec<Readiness>, FabricError>;

    /// Runs `backend` once at `bytes` on fresh random data drawn from `seed` and compares the
    /// result with a host reference.
    fn verify(
        &mut self,
        backend: Backend,
        bytes: u64,
        seed: u64,
    ) -> Result<Verification, FabricError>;

    /// Times `samples` batches of `batch` back-to-back calls (captured in one CUDA graph in
    /// graph mode) and returns microseconds per call for each batch.
    fn time(
        &mut self,
        backend: Backend,
        bytes: u64,
        mode: Mode,
        batch: u32,
        samples: u32,
    ) -> Result<Vec<f64>, FabricError>;

    /// Contention probe on the prepared group: every GPU moves `bytes` with `peers` peers at
    /// once in `direction`.
    fn probe(
        &mut self,
        direction: Direction,
        peers: usize,
        bytes: u64,
    ) -> Result<ProbeSample, FabricError>;

    /// NCCL channels the prepared group's NCCL backends run with, when known.
    fn nccl_channels(&self) -> Option<u32> {
        None
    }

    /// Releases everything the prepared group holds.
    fn release(&mut self) -> Result<(), FabricError>;
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

    #[test]
    fn group_check_names_the_problem() {
        let g = |gpus: Vec<usize>, max_bytes| Group {
            gpus,
            dtype: Dtype::Bf16,
            max_bytes,
        };
        assert!(g(vec![0, 1], 1).check(2).is_ok());
        let msg = |r: Result<(), FabricError>| r.unwrap_err().to_string();
        assert!(msg(g(vec![0], 1).check(2)).contains("at least 2 GPUs"));
        assert!(msg(g(vec![0, 5], 1).check(2)).contains("GPU 5 does not exist"));
        assert!(msg(g(vec![1, 1], 1).check(2)).contains("appears twice"));
        assert!(msg(g(vec![0, 1], 0).check(2)).contains("at least 1 byte"));
    }
}

//! What each backend costs a GPU in device memory: the model both fabrics start from and the
//! decision uses to honour `--mem-budget`. The CUDA fabric measures the real figure beside it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Backend;

/// Cross-GPU signal flags: one cache line per (rank, peer, phase), rounded up generously.
pub const SIGNAL_BYTES: u64 = 64 << 10;
/// Table of peer buffer pointers registered for CUDA-graph replay (production kernels keep a
/// few thousand entries of rank pointers; vLLM reserves 8 MiB, we model 2 MiB).
pub const GRAPH_TABLE_BYTES: u64 = 2 << 20;
/// One NCCL connection's buffers per channel with default NCCL_BUFFSIZE: LL 512 KiB +
/// LL128 4.69 MiB + Simple 4 MiB (calibration C4).
pub const NCCL_CONN_BYTES: u64 = 9_646_899;

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

/// Modelled bytes per GPU for `backend` in a group of `tp` ranks whose buffers serve messages up
/// to `max_bytes`. `nccl_channels` is the channel count NCCL uses on this fabric.
pub fn modelled(backend: Backend, tp: usize, max_bytes: u64, nccl_channels: u32) -> u64 {
    let n = tp.max(1) as u64;
    let shard = max_bytes.div_ceil(n);
    let fixed = SIGNAL_BYTES + GRAPH_TABLE_BYTES;
    match backend {
        // Peers read this GPU's input from one IPC-shared buffer.
        Backend::OneStagePull => max_bytes + fixed,
        // Every peer writes its whole input into its own receive slot here.
        Backend::OneStagePush => (n - 1) * max_bytes + fixed,
        // Input shared for the reduce-scatter reads, plus this rank's reduced shard for the
        // all-gather reads.
        Backend::TwoStagePull => max_bytes + shard + fixed,
        // Receive slots for peers' shards, plus the gathered result written by peers.
        Backend::TwoStagePush => (n - 1) * shard + max_bytes + fixed,
        // Ring and tree each keep a send/receive connection per channel.
        _ => 2 * nccl_channels as u64 * NCCL_CONN_BYTES,
    }
}

/// Largest message a backend's buffers can serve within `budget` bytes per GPU, or None when
/// even the fixed part does not fit. NCCL's cost does not grow with message size.
pub fn largest_within(backend: Backend, tp: usize, budget: u64, nccl_channels: u32) -> Option<u64> {
    if !backend.is_custom() {
        return (modelled(backend, tp, 0, nccl_channels) <= budget).then_some(u64::MAX);
    }
    if modelled(backend, tp, 0, nccl_channels) > budget {
        return None;
    }
    // Cost is monotone in max_bytes: bisect.
    let (mut lo, mut hi) = (0u64, 1u64 << 42);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if modelled(backend, tp, mid, nccl_channels) <= budget {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_costs_more_than_pull_at_tp8() {
        let pull = modelled(Backend::OneStagePull, 8, 1 << 20, 2);
        let push = modelled(Backend::OneStagePush, 8, 1 << 20, 2);
        assert_eq!(pull, (1 << 20) + SIGNAL_BYTES + GRAPH_TABLE_BYTES);
        assert_eq!(push, 7 * (1 << 20) + SIGNAL_BYTES + GRAPH_TABLE_BYTES);
    }

    #[test]
    fn budget_inverts_cost() {
        let budget = 64 << 20;
        let m = largest_within(Backend::OneStagePush, 8, budget, 2).unwrap();
        assert!(modelled(Backend::OneStagePush, 8, m, 2) <= budget);
        assert!(modelled(Backend::OneStagePush, 8, m + 1, 2) > budget);
        assert_eq!(largest_within(Backend::OneStagePull, 8, 1024, 2), None);
    }
}

//! What each backend costs a GPU in device memory: the model both fabrics start from and the
//! decision uses to honour `--mem-budget`. The CUDA fabric measures the real figure beside it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Backend, Count, Executor, Extent, Ll, Ranks};

/// Cross-GPU signal flags: one cache line per (rank, peer, phase), rounded up generously. The
/// CUDA fabric's `Signal` allocation (layout.rs `SIGNAL_ALLOC`); the LL lines follow it.
pub const SIGNAL_BYTES: u64 = 64 << 10;
/// The slot table an op holds for the calls captured in CUDA graphs (the registered form's
/// peers' tensors, filled by `register_graph_buffers()`): the CUDA fabric's registry sizes its
/// slots to fill exactly this, so the model counts what registration holds (vLLM reserves
/// 8 MiB for the same purpose). Opening the peers' allocations adds address space, not memory.
pub const GRAPH_TABLE_BYTES: u64 = 3 << 20;
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

/// Bytes of one extent for messages up to `max_bytes` over `ranks`.
pub fn extent_bytes(e: Extent, ranks: Ranks, max_bytes: u64) -> u64 {
    match e {
        Extent::Message => max_bytes,
        Extent::Shard => max_bytes.div_ceil(ranks.n.max(1) as u64),
        Extent::IslandShard => max_bytes.div_ceil(ranks.island.max(1) as u64),
    }
}

/// How many buffers of a count one GPU keeps.
pub fn count(c: Count, ranks: Ranks) -> u64 {
    match c {
        Count::One => 1,
        Count::Peers => ranks.n.saturating_sub(1) as u64,
        Count::IslandPeers => ranks.island.saturating_sub(1) as u64,
        Count::OtherIslands => ranks.islands().saturating_sub(1) as u64,
    }
}

/// Bytes of one rank's signal allocation: the flags, then the lines of the backend's LL
/// kernel ([`Ll::lines`]; none where it has no LL form), whatever the message size.
pub fn signal(backend: Backend, ranks: Ranks) -> u64 {
    SIGNAL_BYTES + backend.ll_lines(ranks) * Ll::LINE_BYTES
}

/// Modelled bytes per GPU for `backend` in a group of `ranks` whose buffers serve messages up
/// to `max_bytes`: its entry's buffers (backend/) plus its signal allocation and, for an SM
/// kernel, the graph table, or NCCL's connections (`nccl_channels` is the channel count NCCL uses on this
/// fabric).
pub fn modelled(backend: Backend, ranks: Ranks, max_bytes: u64, nccl_channels: u32) -> u64 {
    let table = match backend.executor() {
        // Ring and tree each keep a send/receive connection per channel.
        Executor::Nccl => return 2 * nccl_channels as u64 * NCCL_CONN_BYTES,
        Executor::SmKernel => GRAPH_TABLE_BYTES,
        // A captured copy names its pointers in its graph node: no table to register.
        Executor::CopyEngine(_) => 0,
    };
    let Some(b) = backend.spec().buffers else {
        return table;
    };
    let whole = |on: bool| if on { max_bytes } else { 0 };
    let scratch: u64 = b
        .scratch
        .iter()
        .map(|&(c, e)| count(c, ranks) * extent_bytes(e, ranks, max_bytes))
        .sum();
    whole(b.input) + scratch + whole(b.output) + signal(backend, ranks) + table
}

/// Largest message a backend's buffers can serve within `budget` bytes per GPU, or None when
/// even the fixed part does not fit. NCCL's cost does not grow with message size.
pub fn largest_within(
    backend: Backend,
    ranks: Ranks,
    budget: u64,
    nccl_channels: u32,
) -> Option<u64> {
    if !backend.is_custom() {
        return (modelled(backend, ranks, 0, nccl_channels) <= budget).then_some(u64::MAX);
    }
    if modelled(backend, ranks, 0, nccl_channels) > budget {
        return None;
    }
    // Cost is monotone in max_bytes: bisect.
    let (mut lo, mut hi) = (0u64, 1u64 << 42);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if modelled(backend, ranks, mid, nccl_channels) <= budget {
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

    const FIXED: u64 = SIGNAL_BYTES + GRAPH_TABLE_BYTES;
    const KIB: u64 = 1 << 10;

    #[test]
    fn flat_kernels_cost_what_their_buffers_hold() {
        let (m, r) = (1u64 << 20, Ranks::flat(8));
        // Pull: the shared input, and no LL form; push: a slot per peer, and its LL lines
        // (2 buffers x 8 senders x 4096 words of 32 KiB, 16 bytes each: 1 MiB).
        assert_eq!(modelled(Backend::OneStagePull, r, m, 2), m + FIXED);
        assert_eq!(
            modelled(Backend::OneStagePush, r, m, 2),
            7 * m + FIXED + 1024 * KIB
        );
        // Two-stage pull: the input and the reduced shard, and 2 x 8 slots of a shard of
        // 64 KiB's 8192 words in lines (256 KiB); push: a shard slot per peer and the output
        // peers gather into, and two stages of those lines (512 KiB).
        assert_eq!(
            modelled(Backend::TwoStagePull, r, m, 2),
            m + m / 8 + FIXED + 256 * KIB
        );
        assert_eq!(
            modelled(Backend::TwoStagePush, r, m, 2),
            7 * m / 8 + m + FIXED + 512 * KIB
        );
        assert_eq!(
            modelled(Backend::Nccl, r, m, 2),
            4 * NCCL_CONN_BYTES,
            "NCCL's connections, whatever the message"
        );
    }

    #[test]
    fn island_kernels_cost_slots_for_either_direction() {
        // Two islands of four: input, 3 island-peer slots + the partial + 1 other island's
        // slot of a quarter each, and the output (two-shot); whole messages for one-shot.
        // Lines: two-shot, 2 stages x 2 buffers x 9 slots of a quarter of 4096 words
        // (576 KiB); one-shot, 2 buffers x 9 slots of 4096 words (1152 KiB).
        let (m, r) = (1u64 << 20, Ranks { n: 8, island: 4 });
        assert_eq!(
            modelled(Backend::IslandTwoShot, r, m, 2),
            m + 5 * (m / 4) + m + FIXED + 576 * KIB
        );
        assert_eq!(
            modelled(Backend::IslandOneShot, r, m, 2),
            m + 5 * m + FIXED + 1152 * KIB
        );
        // Four islands of two: 1 island peer, the partial, 3 other islands, of halves; lines
        // of half of 4096 words.
        let r = Ranks { n: 8, island: 2 };
        assert_eq!(
            modelled(Backend::IslandTwoShot, r, m, 2),
            m + 5 * (m / 2) + m + FIXED + 1152 * KIB
        );
    }

    #[test]
    fn copy_engine_backends_cost_their_slots_and_flags_and_no_graph_table() {
        // Two-stage by copy engines over 8: the shared input, a shard slot per peer and the
        // reduced shard, the flags; no LL lines, no registered pointer table.
        let (m, r) = (1u64 << 20, Ranks::flat(8));
        assert_eq!(
            modelled(Backend::TwoStageCopy, r, m, 2),
            m + 7 * m / 8 + m / 8 + SIGNAL_BYTES
        );
        // Its island schedule over two islands of four: the input, 3 island-peer slots, the
        // partial, 1 other island's slot and the summed shard, of a quarter each.
        let r = Ranks { n: 8, island: 4 };
        assert_eq!(
            modelled(Backend::IslandTwoShotCopy, r, m, 2),
            m + 6 * (m / 4) + SIGNAL_BYTES
        );
    }

    #[test]
    fn the_lines_cost_the_same_at_every_size() {
        // The signal allocation is made once for the LL kernel's largest message: a budget
        // too small for it serves no size at all.
        let r = Ranks::flat(8);
        let fixed = modelled(Backend::OneStagePush, r, 0, 2);
        assert_eq!(fixed, FIXED + 1024 * KIB);
        assert_eq!(
            largest_within(Backend::OneStagePush, r, FIXED + 1024 * KIB - 1, 2),
            None
        );
        assert_eq!(
            largest_within(Backend::OneStagePush, r, fixed + 7 * 1000, 2),
            Some(1000)
        );
    }

    #[test]
    fn budget_inverts_cost() {
        let (budget, r) = (64 << 20, Ranks::flat(8));
        let m = largest_within(Backend::OneStagePush, r, budget, 2).unwrap();
        assert!(modelled(Backend::OneStagePush, r, m, 2) <= budget);
        assert!(modelled(Backend::OneStagePush, r, m + 1, 2) > budget);
        assert_eq!(largest_within(Backend::OneStagePull, r, 1024, 2), None);
    }
}

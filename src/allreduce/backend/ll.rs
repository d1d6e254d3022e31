//! The line layouts of the SM kernels' LL (small-message) forms.

use super::Ranks;

/// The lines an LL (small-message) kernel keeps in each rank's signal allocation after the
/// flags, which fix how large a message it serves and its grid (src/fabric/cuda/kernels/).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ll {
    /// A line per data word of the message from each sender, in two buffers by flag parity
    /// (kernels/allreduce.cu ll1).
    Message,
    /// As `Message` with one slot more, the rank's own sum, which peers pull (island.cu lli).
    MessageAndSum,
    /// Two stages of `MessageAndSum`'s slots, each of an island shard (island.cu lli).
    IslandShards,
    /// A line per data word of a shard from each sender, for two stages (allreduce.cu ll2).
    Shards,
    /// A line per data word of a shard for each rank, which peers pull: the rank's input
    /// words of each peer's shard, and its own reduced shard in its own slot, in two buffers
    /// by flag parity (allreduce.cu llp).
    PulledShard,
}

impl Ll {
    /// Bytes of one line: an 8-byte data word and two 4-byte flags. Shared with kernels/*.cu
    /// as layout.rs's `LL_LINE`.
    pub const LINE_BYTES: u64 = 16;

    /// The largest message per rank (bytes) this layout serves: what its lines hold. The one
    /// rule both the CUDA fabric's choice of kernel (src/fabric/cuda/kernels/ `ll_blocks`,
    /// and kernels/*.cu through layout.rs's `LL1_MAX_BYTES` and `LL2_MAX_BYTES`) and the
    /// simulator's read.
    pub const fn max_bytes(self) -> u64 {
        match self {
            Ll::Message | Ll::MessageAndSum | Ll::IslandShards => 32 << 10,
            Ll::Shards | Ll::PulledShard => 64 << 10,
        }
    }

    /// Lines this layout keeps in each rank's signal allocation over `ranks`, sized for its
    /// largest message: the one rule both the CUDA fabric's allocation (kernels.rs
    /// `signal_bytes`, mirroring the line addresses of kernels/allreduce.cu ll1, ll2, llp and
    /// island.cu lli) and the memory model (memory.rs) read.
    pub fn lines(self, ranks: Ranks) -> u64 {
        let words = self.max_bytes() / 8;
        // Data words of a shard over `of` ranks: at least one.
        let shard = |of: usize| words.div_ceil(of.max(1) as u64).max(1);
        let n = ranks.n as u64;
        match self {
            // Two buffers (by flag parity) of a line per data word from each sender.
            Ll::Message => 2 * n * words,
            // The same with one slot more, the rank's own sum.
            Ll::MessageAndSum => 2 * (n + 1) * words,
            // Two stages x two buffers of n + 1 slots of an island shard.
            Ll::IslandShards => 4 * (n + 1) * shard(ranks.island),
            // Two stages x two buffers of a shard's lines from each sender.
            Ll::Shards => 4 * n * shard(ranks.n),
            // Two buffers of a shard's lines for each rank: the rank's input words of each
            // peer's shard, and its own reduced shard in its own slot.
            Ll::PulledShard => 2 * n * shard(ranks.n),
        }
    }
}

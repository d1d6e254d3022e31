//! What the host and kernels/*.cu agree on: the constants passed to NVRTC as -D options (so
//! neither side defines them twice) and the argument structs the kernels read. Both the
//! compiler's options and the host-side kernel code read them from here.

use crate::allreduce::{memory, Ll};

// The constants below marked "shared" reach kernels/*.cu as NVRTC -D options ([`defines`]).

/// Shared.
pub const MAX_RANKS: usize = 16;
/// Shared.
pub const MAX_BLOCKS: u32 = 256;
/// Shared: threads per block of the bandwidth kernels.
pub const THREADS: u32 = 512;
/// Bytes reserved for one rank's `Signal` (kernels/common.cuh): the memory model's
/// ([`memory::SIGNAL_BYTES`]); its LL lines follow. Shared as `LL_OFFSET`.
pub const SIGNAL_ALLOC: usize = memory::SIGNAL_BYTES as usize;
/// Offset of `Signal::status` (3 x 256 x 16 flags + 256 epochs, all u32).
pub const SIGNAL_STATUS_OFFSET: usize = (3 * 256 * 16 + 256) * 4;
/// Largest message per rank (bytes) that one-stage push and the island kernels send through
/// their LL kernels: the table's rule ([`Ll::max_bytes`]). Shared as `LL1_MAX_BYTES`.
pub const LL1_MAX_BYTES: u64 = Ll::Message.max_bytes();
/// The same for two-stage push and pull. Shared as `LL2_MAX_BYTES`.
pub const LL2_MAX_BYTES: u64 = Ll::Shards.max_bytes();
/// Bytes of one LL line: the table's ([`Ll::LINE_BYTES`]). Shared.
pub const LL_LINE: u64 = Ll::LINE_BYTES;
/// Threads per block of the LL kernels, one 8-byte data word each. Shared.
pub const LL_THREADS: u32 = 128;
/// The same for one-stage push's LL kernel (`Ll::Message`): smaller blocks spread its lines
/// over more multiprocessors (src/fabric/cuda/kernels/, ll_threads). Shared.
pub const LL1_THREADS: u32 = 64;

/// The NVRTC options that give kernels/*.cu the constants shared with this file.
pub fn defines() -> Vec<String> {
    [
        ("MAX_RANKS", MAX_RANKS as u64),
        ("MAX_BLOCKS", MAX_BLOCKS as u64),
        ("THREADS", THREADS as u64),
        ("LL_OFFSET", SIGNAL_ALLOC as u64),
        ("LL_LINE", LL_LINE),
        ("LL_THREADS", LL_THREADS as u64),
        ("LL1_THREADS", LL1_THREADS as u64),
        ("LL1_MAX_BYTES", LL1_MAX_BYTES),
        ("LL2_MAX_BYTES", LL2_MAX_BYTES),
    ]
    .iter()
    .map(|(k, v)| format!("-D{k}={v}"))
    .collect()
}

/// Mirrors `struct ArArgs` in kernels/common.cuh. Its default is all zero: no buffers, the
/// staged form, no fault word.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ArArgs {
    pub input: [u64; MAX_RANKS],
    pub out: [u64; MAX_RANKS],
    pub scratch: [u64; MAX_RANKS],
    pub sig: [u64; MAX_RANKS],
    /// Each rank's own input and output: the caller's tensors. A kernel whose peers read the
    /// input or write the output copies between these and `input` / `out` itself, so the
    /// copies run inside the timed (and captured) kernel.
    pub src: [u64; MAX_RANKS],
    pub dst: [u64; MAX_RANKS],
    pub n: u64,
    pub slot_bytes: u64,
    /// Device address of a host word the kernels set to 1 when the rank's status is set (a
    /// wait of the group gave up; its output is then NaN), for a host that must not
    /// synchronize to learn it (the op inside an engine); 0 where the host reads the status
    /// itself (the tune).
    pub fault: u64,
    pub nranks: i32,
    pub rank_base: i32,
    pub island: i32,
    pub dirs: u32,
    pub order: [i32; MAX_RANKS],
    /// The registered form (graph mode): device address of this call's [`RegSlot`], whose
    /// peers' inputs the host fills after capture; 0 for the staged form.
    pub reg: u64,
    /// Device address of a host word the registered form sets to 1 when its slot did not hold
    /// `reg_gen` (a replay before registration): its output is then NaN.
    pub missed: u64,
    /// The generation `reg` must hold for the call to read peers' tensors.
    pub reg_gen: u32,
}

/// Mirrors `struct RegSlot` in kernels/common.cuh: one captured call's peers' tensors (their
/// inputs, or their outputs where peers write them: [`super::kernels::registered_tensors`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RegSlot {
    pub peer: [u64; MAX_RANKS],
    pub gen: u32,
    pub pad: u32,
}

impl RegSlot {
    pub const BYTES: usize = std::mem::size_of::<RegSlot>();

    /// The slot as the kernels read it (little-endian, as every CUDA GPU).
    pub fn to_bytes(self) -> [u8; RegSlot::BYTES] {
        let mut b = [0u8; RegSlot::BYTES];
        for (i, p) in self.peer.iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&p.to_le_bytes());
        }
        b[MAX_RANKS * 8..MAX_RANKS * 8 + 4].copy_from_slice(&self.gen.to_le_bytes());
        b
    }
}

/// `ArArgs::dirs` bit: the phases inside islands push.
pub const DIRS_PUSH_INSIDE: u32 = 1;
/// `ArArgs::dirs` bit: the phase across islands pushes.
pub const DIRS_PUSH_ACROSS: u32 = 2;

/// Mirrors `struct ProbeArgs` in kernels/probe.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProbeArgs {
    pub src: [u64; MAX_RANKS],
    pub dst: [u64; MAX_RANKS],
    pub bytes: u64,
    pub sink: u64,
    pub nranks: i32,
    pub rank: i32,
    pub peers: i32,
    pub pad: i32,
}

/// Mirrors `struct CeSumArgs` in kernels/ce_sum.cu: the sum of a copy-engine backend, `count`
/// landed buffers added into `out`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CeSumArgs {
    pub inputs: [u64; MAX_RANKS],
    pub out: u64,
    pub n: u64,
    pub count: i32,
    pub pad: i32,
    /// The guard's (`count` 0): the rank's `Signal::status` word, and the host's fault word.
    pub status: u64,
    pub fault: u64,
}

//! Host side of kernels/*.cu: the functions loaded per GPU, launch shapes and how many bytes
//! each kernel moves (the constants and argument layouts both sides share: [`super::layout`]).

use std::sync::Arc;

use cudarc::driver::sys;

use super::compile;
use super::driver::{dev, Ctx, DeviceFacts, Function, Modules};
use super::layout::{ArArgs, LL1_THREADS, LL_LINE, LL_THREADS, MAX_BLOCKS, SIGNAL_ALLOC, THREADS};
use crate::allreduce::{memory, Executor, Extent, Kernel, Ll, Part, Ranks, TABLE};
use crate::fabric::LoadedKernels;
use crate::fabric::{Backend, DeviceError, Dtype, FabricError};

/// Kernel name for a custom backend and element type, e.g. "one_stage_pull_bf16".
pub fn kernel_name(backend: Backend, dtype: Dtype) -> Option<String> {
    let k = backend.spec().kernel?;
    Some(format!("{}_{}", k.name, dtype.id()))
}

/// The custom backends, each with its kernel: every entry of the table that has one.
pub fn custom() -> impl Iterator<Item = (Backend, Kernel)> {
    TABLE.iter().filter_map(|s| Some((s.backend, s.kernel?)))
}

pub const DTYPES: [Dtype; 3] = [Dtype::Bf16, Dtype::Fp16, Dtype::Fp32];

/// Name of the LL (small-message) kernel of a backend, e.g. "two_stage_push_ll_bf16".
pub fn ll_kernel_name(backend: Backend, dtype: Dtype) -> Option<String> {
    let k = backend.spec().kernel.filter(|k| k.ll.is_some())?;
    Some(format!("{}_ll_{}", k.name, dtype.id()))
}

/// Name of the registered form's kernel, e.g. "one_stage_pull_reg_bf16".
pub fn registered_kernel_name(backend: Backend, dtype: Dtype) -> Option<String> {
    let k = backend
        .spec()
        .kernel
        .filter(|_| backend.has_registered_form())?;
    Some(format!("{}_reg_{}", k.name, dtype.id()))
}

/// The tensors of a call its registered form maps into the peers: those its staged form
/// copies through a shared buffer (the entry's `buffers`), each a slot, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegTensors {
    /// Peers read the input (the pull kernels, the island one-shot): one slot.
    Input,
    /// Peers write the output (two-stage push): one slot.
    Output,
    /// Peers read the input and reach the output (the island two-shot): two slots, inputs
    /// then outputs (island.cu, reg_load_both).
    Both,
}

impl RegTensors {
    /// The call's tensors to record, in slot order.
    pub fn of(self, input: u64, output: u64) -> Vec<u64> {
        match self {
            RegTensors::Input => vec![input],
            RegTensors::Output => vec![output],
            RegTensors::Both => vec![input, output],
        }
    }
}

/// Which tensors `backend`'s registered form maps; None where it has no such form.
pub fn registered_tensors(backend: Backend) -> Option<RegTensors> {
    let b = backend
        .spec()
        .buffers
        .filter(|_| backend.has_registered_form())?;
    match (b.input, b.output) {
        (true, true) => Some(RegTensors::Both),
        (true, false) => Some(RegTensors::Input),
        (false, true) => Some(RegTensors::Output),
        (false, false) => None,
    }
}

/// Threads per block of the LL kernel of layout `ll` (its `__launch_bounds__` in kernels/):
/// `LL_THREADS`, but one-stage push's `LL1_THREADS`. Each of its threads sends a line to
/// every peer and polls one from each, so smaller blocks spread that over more
/// multiprocessors.
pub fn ll_threads(ll: Ll) -> u32 {
    match ll {
        Ll::Message => LL1_THREADS,
        Ll::MessageAndSum | Ll::IslandShards | Ll::Shards | Ll::PulledShard => LL_THREADS,
    }
}

/// Blocks the LL kernel of `backend` needs for a message of `bytes` per rank over `ranks`
/// (one 8-byte data word per thread, [`ll_threads`] threads per block, but in the island
/// two-shot; mirrors `ll_launch_ok` in kernels/common.cuh), or None when the message is too
/// large for LL or the backend has no LL kernel. The limits are each layout's own
/// ([`Ll::max_bytes`], which the simulator reads too).
pub fn ll_blocks(backend: Backend, bytes: u64, ranks: Ranks) -> Option<u32> {
    let words = bytes.div_ceil(8);
    let ll = backend.ll_at(bytes)?;
    let threads = ll_threads(ll) as u64;
    let (covered, per_block) = match ll {
        // A line per data word.
        Ll::Message | Ll::MessageAndSum => (words, threads),
        // A line per data word of a shard.
        Ll::Shards | Ll::PulledShard => (ll_shard(words, ranks.n), threads),
        // A line per data word of an island shard, each word a thread at each of the
        // island's places (island.cu ll_island_block).
        Ll::IslandShards => (
            ll_shard(words, ranks.island),
            (threads / ranks.island.max(1) as u64).max(1),
        ),
    };
    Some(covered.div_ceil(per_block) as u32)
}

/// Data words per shard in the two-stage LL kernels: at least one.
fn ll_shard(words: u64, n: usize) -> u64 {
    words.div_ceil(n.max(1) as u64).max(1)
}

/// Bytes of one rank's signal allocation for `backend` over `ranks`: the `Signal` flags, then
/// the LL lines its LL kernel uses ([`Ll::lines`]).
pub fn signal_bytes(backend: Backend, ranks: Ranks) -> u64 {
    SIGNAL_ALLOC as u64 + backend.ll_lines(ranks) * LL_LINE
}

/// The compiled kernels loaded into one GPU's context.
pub struct GpuKernels {
    _modules: Modules,
    allreduce: Vec<(Backend, Dtype, Function, u32)>,
    ll: Vec<(Backend, Dtype, Function, u32)>,
    /// The registered forms ([`Backend::has_registered_form`]).
    registered: Vec<(Backend, Dtype, Function, u32)>,
    /// The sums of the copy-engine backends (kernels/ce_sum.cu).
    copy_sum: Vec<(Backend, Dtype, Function)>,
    pub latch_wait: Function,
    pub probe_read: Function,
    pub probe_write: Function,
    /// The fault knob's never-ending kernel.
    pub spin_forever: Function,
    /// Test data and its check (kernels/check.cu), one per dtype (see [`slot`]).
    fill: [Function; 3],
    check: [Function; 3],
    /// What NVRTC was asked for, e.g. "--gpu-architecture=sm_90".
    pub target: String,
    /// The hashes of the images loaded, which a profile records (profile::kernels).
    pub images: LoadedKernels,
}

impl GpuKernels {
    /// Loads the kernels of `dtypes` ([`compile::loaded_types`]).
    pub fn load(
        ctx: &Arc<Ctx>,
        cc: (u32, u32),
        dtypes: &[Dtype],
    ) -> Result<GpuKernels, FabricError> {
        let images = compile::images_for(cc, dtypes)?;
        let dtypes = || compile::loaded_types(dtypes);
        let modules = Modules::load(ctx, &images)?;
        let load = |name: &str, threads: u32| -> Result<(Function, u32), FabricError> {
            let f = modules.function(name)?;
            let per_sm = dev(f.blocks_per_sm(threads), "the occupancy query")?;
            if per_sm == 0 {
                return Err(FabricError::Device(DeviceError::Kernel {
                    name: name.into(),
                    detail: format!("it cannot run {threads} threads per block on this GPU"),
                }));
            }
            Ok((f, per_sm))
        };
        let (mut allreduce, mut ll, mut registered) = (Vec::new(), Vec::new(), Vec::new());
        for (b, k) in custom() {
            for d in dtypes() {
                let name = kernel_name(b, d).expect("a custom backend has a kernel");
                let (f, per_sm) = load(&name, THREADS)?;
                allreduce.push((b, d, f, per_sm));
                if let (Some(name), Some(l)) = (ll_kernel_name(b, d), k.ll) {
                    let (f, per_sm) = load(&name, ll_threads(l))?;
                    ll.push((b, d, f, per_sm));
                }
                if let Some(name) = registered_kernel_name(b, d) {
                    let (f, per_sm) = load(&name, THREADS)?;
                    registered.push((b, d, f, per_sm));
                }
            }
        }
        let mut copy_sum = Vec::new();
        for s in TABLE {
            let Executor::CopyEngine(sum) = s.executor else {
                continue;
            };
            for d in dtypes() {
                let (f, _) = load(&format!("{}_{}", sum.name, d.id()), THREADS)?;
                copy_sum.push((s.backend, d, f));
            }
        }
        Ok(GpuKernels {
            copy_sum,
            latch_wait: modules.function("latch_wait")?,
            probe_read: modules.function("probe_read")?,
            probe_write: modules.function("probe_write")?,
            spin_forever: modules.function("spin_forever")?,
            fill: per_dtype(|d| modules.function(&format!("fill_{}", d.id())))?,
            check: per_dtype(|d| modules.function(&format!("check_{}", d.id())))?,
            _modules: modules,
            allreduce,
            ll,
            registered,
            target: images.target().option(),
            images: images.record(),
        })
    }

    /// `fill_<dtype>(out, n, seed, rank)`: writes rank `rank`'s test data.
    pub fn fill(&self, dtype: Dtype) -> &Function {
        &self.fill[slot(dtype)]
    }

    /// `check_<dtype>(out, n, seed, world, data_bytes, guard_end, result)`: counts wrong
    /// elements and spoiled guard bytes.
    pub fn check(&self, dtype: Dtype) -> &Function {
        &self.check[slot(dtype)]
    }

    /// The sum kernel of a copy-engine backend.
    pub fn copy_sum(&self, backend: Backend, dtype: Dtype) -> Option<&Function> {
        self.copy_sum
            .iter()
            .find(|(b, d, _)| *b == backend && *d == dtype)
            .map(|(_, _, f)| f)
    }

    /// The kernel and how many of its blocks fit on one multiprocessor.
    pub fn allreduce(&self, backend: Backend, dtype: Dtype) -> Option<(&Function, u32)> {
        self.allreduce
            .iter()
            .find(|(b, d, _, _)| *b == backend && *d == dtype)
            .map(|(_, _, f, n)| (f, *n))
    }

    /// The kernel, blocks and threads per block for one call of `elems` elements over `n`
    /// ranks, `ranks_on_gpu` of which share this GPU of `sms` multiprocessors, and whether it
    /// is the registered form: the LL kernel for small messages when its grid fits beside the
    /// other ranks' (it stages nothing), else the registered form where `registered` asks for
    /// it and the backend has one, else the bandwidth kernel. Depends only on the arguments,
    /// so every rank of a group of like GPUs makes the same choice.
    #[allow(clippy::too_many_arguments)]
    pub fn plan(
        &self,
        backend: Backend,
        dtype: Dtype,
        elems: u64,
        ranks: Ranks,
        sms: u32,
        ranks_on_gpu: u32,
        registered: bool,
    ) -> Option<(&Function, u32, u32, bool)> {
        let find = |v: &'_ [(Backend, Dtype, Function, u32)]| -> Option<(usize, u32)> {
            v.iter()
                .position(|(b, d, _, _)| *b == backend && *d == dtype)
                .map(|i| (i, v[i].3))
        };
        let bytes = elems * dtype.size();
        if let (Some((i, per_sm)), Some(need), Some(ll)) = (
            find(&self.ll),
            ll_blocks(backend, bytes, ranks),
            backend.ll_at(bytes),
        ) {
            let threads = ll_threads(ll);
            if need <= ll_block_cap(sms, per_sm, ranks_on_gpu, threads) {
                return Some((&self.ll[i].2, need, threads, false));
            }
        }
        let reg = find(&self.registered).filter(|_| registered);
        let (f, per_sm) = match reg {
            Some((i, per_sm)) => (&self.registered[i].2, per_sm),
            None => self.allreduce(backend, dtype)?,
        };
        let cap = block_cap(sms, per_sm, ranks_on_gpu);
        let (blocks, threads) = grid(backend, elems, dtype, ranks, cap, reg.is_some());
        Some((f, blocks, threads, reg.is_some()))
    }
}

/// The registered form of one call (kernels/common.cuh, RegSlot): the device address of its
/// slot, the generation the slot must hold, and the host word set when it does not.
#[derive(Debug, Clone, Copy)]
pub struct Registered {
    pub slot: u64,
    pub gen: u32,
    pub missed: u64,
}

/// One call of a custom backend: `elems` elements of `dtype` over a group of `nranks`, for the
/// ranks `base .. base + count` in one grid (rank = base + blockIdx.y), `on_gpu` ranks of the
/// group sharing this GPU (more than one only in loopback).
#[derive(Debug, Clone, Copy)]
pub struct Work {
    pub backend: Backend,
    pub dtype: Dtype,
    pub elems: u64,
    /// The group's ranks, in islands where its kernel works in them.
    pub ranks: Ranks,
    pub base: usize,
    pub count: u32,
    pub on_gpu: u32,
    /// Where the call may take the registered form (graph mode) and the backend has one.
    pub registered: Option<Registered>,
}

impl GpuKernels {
    /// Queues `work` on `stream`: the one launch rule of the tune's workers and of artune's
    /// in-engine op. The kernel, blocks and threads come from [`GpuKernels::plan`], programmatic
    /// launch where the GPU has it; `args` gets the call's size and first rank.
    ///
    /// # Safety
    /// `args` names every rank's buffers, each holding `elems` elements (and what the backend's
    /// kernel reads and writes besides), alive until the call has run; `stream` is a live
    /// stream of the context these kernels were loaded in.
    pub unsafe fn launch(
        &self,
        work: Work,
        args: &ArArgs,
        gpu: &DeviceFacts,
        stream: sys::CUstream,
    ) -> Result<(), FabricError> {
        let Work { backend, dtype, .. } = work;
        let reg = work.registered;
        let (f, blocks, threads, registered) = self
            .plan(
                backend,
                dtype,
                work.elems,
                work.ranks,
                gpu.sms,
                work.on_gpu,
                reg.is_some(),
            )
            .ok_or_else(|| DeviceError::Kernel {
                name: format!("{backend} {}", dtype.id()),
                detail: "no such kernel was loaded".into(),
            })?;
        let a = call_args(args, &work, registered);
        let pdl = programmatic_launch(gpu.cc);
        // SAFETY: the caller's contract; the kernel takes exactly one ArArgs.
        unsafe { f.launch_on((blocks, work.count), threads, stream, &a, pdl) }.map_err(|e| {
            FabricError::Backend {
                backend,
                reason: format!("kernel launch failed: {e}"),
            }
        })
    }
}

/// The arguments of one call: `args` with the call's size and first rank, and its registered
/// slot where the kernel planned is the registered form (`registered`); the staged and LL
/// kernels get none, so they never read a slot.
pub fn call_args(args: &ArArgs, work: &Work, registered: bool) -> ArArgs {
    let mut a = *args;
    a.n = work.elems;
    a.rank_base = work.base as i32;
    if let Some(r) = work.registered.filter(|_| registered) {
        a.reg = r.slot;
        a.reg_gen = r.gen;
        a.missed = r.missed;
    }
    a
}

/// Where a dtype's kernel sits in a per-dtype array.
fn slot(dtype: Dtype) -> usize {
    match dtype {
        Dtype::Bf16 => 0,
        Dtype::Fp16 => 1,
        Dtype::Fp32 => 2,
    }
}

fn per_dtype(
    mut load: impl FnMut(Dtype) -> Result<Function, FabricError>,
) -> Result<[Function; 3], FabricError> {
    Ok([load(Dtype::Bf16)?, load(Dtype::Fp16)?, load(Dtype::Fp32)?])
}

/// Most blocks one rank may use. With `ranks_on_device` ranks sharing one GPU (loopback), the
/// blocks of all of them must be resident together or spinning blocks would starve the rest,
/// so the GPU's capacity is split between them.
pub fn block_cap(sms: u32, blocks_per_sm: u32, ranks_on_device: u32) -> u32 {
    share(sms, blocks_per_sm.clamp(1, 2), ranks_on_device)
}

/// [`block_cap`] for an LL kernel of `threads` per block: its share of each multiprocessor
/// counted in threads, two blocks of `LL_THREADS`, so one-stage push's smaller blocks get as
/// many more blocks and keep their whole LL range in loopback 8.
pub fn ll_block_cap(sms: u32, blocks_per_sm: u32, ranks_on_device: u32, threads: u32) -> u32 {
    let most = (2 * LL_THREADS / threads.max(1)).max(1);
    share(sms, blocks_per_sm.clamp(1, most), ranks_on_device)
}

/// `per_sm` blocks on each of `sms` multiprocessors split between `ranks_on_device` ranks.
fn share(sms: u32, per_sm: u32, ranks_on_device: u32) -> u32 {
    (sms.saturating_mul(per_sm) / ranks_on_device.max(1)).clamp(1, MAX_BLOCKS)
}

/// Vectors of the widest part of a message any phase of `backend` works through per rank:
/// the whole message, a shard of it, or an island's shard.
fn work_vectors(backend: Backend, nvec: u64, ranks: Ranks) -> u64 {
    backend
        .phases()
        .iter()
        .map(|p| match p.part {
            Part::Message => nvec,
            Part::Shard => nvec.div_ceil(ranks.n.max(1) as u64),
            Part::IslandShard => nvec.div_ceil(ranks.island.max(1) as u64),
        })
        .max()
        .unwrap_or(nvec)
}

/// Threads per block of a registered form's small call (at most [`SMALL_VECTORS`] vectors in
/// its widest part; in practice one-stage pull, the other backends' small calls take their LL
/// kernels): a call waits for each of its SMs to pull its vectors from every peer, so more,
/// smaller blocks (up to four times as many) cut that wait, which graph mode's latency is.
pub const SMALL_THREADS: u32 = 128;
/// The most vectors a call runs in [`SMALL_THREADS`] blocks: those `THREADS` would cover in
/// four blocks (32 KiB per rank in the one-stage kernels).
pub const SMALL_VECTORS: u64 = 4 * THREADS as u64;

/// Blocks and threads per block of a bandwidth kernel's call (`registered`: its registered
/// form): enough blocks for one vector per thread of the widest part, at most `cap`, of
/// `THREADS` threads, but [`SMALL_THREADS`] for a registered form's small call. The kernels
/// stride by the block's size, so either covers the message.
pub fn grid(
    backend: Backend,
    elems: u64,
    dtype: Dtype,
    ranks: Ranks,
    cap: u32,
    registered: bool,
) -> (u32, u32) {
    let per_vec = 16 / dtype.size();
    let work = work_vectors(backend, elems / per_vec, ranks);
    let threads = if registered && work <= SMALL_VECTORS {
        SMALL_THREADS
    } else {
        THREADS
    };
    let blocks = (work.div_ceil(threads as u64).min(cap as u64) as u32).max(1);
    (blocks, threads)
}
/// Whether the allreduce kernels go out as programmatic dependent launches: compute
/// capability 9.0 and later have `griddepcontrol` (kernels/common.cuh, pdl_wait and
/// pdl_trigger), which lets a call's grid be scheduled while the previous one drains.
/// What it saves is in profiles/hardware/h200/NOTES-kernel-choices.md.
pub fn programmatic_launch(cc: (u32, u32)) -> bool {
    cc.0 >= 9
}

/// Bytes of one scratch slot of `extent` for messages up to `max_bytes` over `ranks`: whole
/// vectors, plus one vector for a shard's tail, 256-byte aligned.
pub fn extent_slot(extent: Extent, max_bytes: u64, ranks: Ranks) -> u64 {
    let shard = |k: usize| (max_bytes / 16).div_ceil(k.max(1) as u64) * 16 + 16;
    let need = match extent {
        Extent::Message => max_bytes,
        Extent::Shard => shard(ranks.n),
        Extent::IslandShard => shard(ranks.island),
    };
    need.div_ceil(256).max(1) * 256
}

/// Slot spacing of a backend's scratch: its entry's scratch extent (one per backend), or the
/// message where it keeps none.
pub fn slot_bytes(backend: Backend, max_bytes: u64, ranks: Ranks) -> u64 {
    let extent = backend
        .spec()
        .buffers
        .and_then(|b| b.scratch.first().map(|&(_, e)| e))
        .unwrap_or(Extent::Message);
    extent_slot(extent, max_bytes, ranks)
}

/// Bytes of a backend's scratch: each of its entry's (count, extent) as slots.
pub fn scratch_bytes(backend: Backend, max_bytes: u64, ranks: Ranks) -> u64 {
    scratch_entries(backend, max_bytes, ranks)
        .last()
        .map_or(0, |&(start, count, slot)| start + count * slot)
}

/// Where each of a backend's scratch entries lies in its scratch: (start, slots, slot bytes),
/// the entries one after another in the table's order.
pub fn scratch_entries(backend: Backend, max_bytes: u64, ranks: Ranks) -> Vec<(u64, u64, u64)> {
    let mut start = 0;
    let scratch = backend.spec().buffers.map_or(&[][..], |b| b.scratch);
    scratch
        .iter()
        .map(|&(c, e)| {
            let (count, slot) = (memory::count(c, ranks), extent_slot(e, max_bytes, ranks));
            let entry = (start, count, slot);
            start += count * slot;
            entry
        })
        .collect()
}

#[cfg(test)]
mod tests;

//! Host side of kernels/*.cu: the functions loaded per GPU, launch shapes and how many bytes
//! each kernel moves (the constants and argument layouts both sides share: [`super::layout`]).

use std::sync::Arc;

use cudarc::driver::sys;

use super::compile;
use super::driver::{dev, Ctx, DeviceFacts, Function, Modules};
use super::layout::{ArArgs, LL_LINE, LL_THREADS, MAX_BLOCKS, SIGNAL_ALLOC, THREADS};
use crate::allreduce::{memory, Extent, Kernel, Ll, Part, Ranks, TABLE};
use crate::fabric::{Backend, DeviceError, Dtype, FabricError};
use crate::profile::KernelImages;

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

/// Blocks the LL kernel of `backend` needs for a message of `bytes` per rank over `ranks`
/// (one 8-byte data word per thread, `LL_THREADS` threads per block, but in the island
/// two-shot; mirrors `ll_launch_ok` in kernels/common.cuh), or None when the message is too
/// large for LL or the backend has no LL kernel. The limits are each layout's own
/// ([`Ll::max_bytes`], which the simulator reads too).
pub fn ll_blocks(backend: Backend, bytes: u64, ranks: Ranks) -> Option<u32> {
    let words = bytes.div_ceil(8);
    let threads = LL_THREADS as u64;
    let (covered, per_block) = match backend.ll_at(bytes)? {
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
pub struct Kernels {
    _modules: Modules,
    allreduce: Vec<(Backend, Dtype, Function, u32)>,
    ll: Vec<(Backend, Dtype, Function, u32)>,
    /// The registered forms ([`Backend::has_registered_form`]).
    registered: Vec<(Backend, Dtype, Function, u32)>,
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
    pub images: KernelImages,
}

impl Kernels {
    pub fn load(ctx: &Arc<Ctx>, cc: (u32, u32)) -> Result<Kernels, FabricError> {
        let images = compile::images_for(cc)?;
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
        for (b, _) in custom() {
            for d in DTYPES {
                let name = kernel_name(b, d).expect("a custom backend has a kernel");
                let (f, per_sm) = load(&name, THREADS)?;
                allreduce.push((b, d, f, per_sm));
                if let Some(name) = ll_kernel_name(b, d) {
                    let (f, per_sm) = load(&name, LL_THREADS)?;
                    ll.push((b, d, f, per_sm));
                }
                if let Some(name) = registered_kernel_name(b, d) {
                    let (f, per_sm) = load(&name, THREADS)?;
                    registered.push((b, d, f, per_sm));
                }
            }
        }
        Ok(Kernels {
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
        if let (Some((i, per_sm)), Some(need)) = (
            find(&self.ll),
            ll_blocks(backend, elems * dtype.size(), ranks),
        ) {
            if need <= block_cap(sms, per_sm, ranks_on_gpu) {
                return Some((&self.ll[i].2, need, LL_THREADS, false));
            }
        }
        let reg = find(&self.registered).filter(|_| registered);
        let (f, per_sm) = match reg {
            Some((i, per_sm)) => (&self.registered[i].2, per_sm),
            None => self.allreduce(backend, dtype)?,
        };
        let cap = block_cap(sms, per_sm, ranks_on_gpu);
        Some((
            f,
            blocks(backend, elems, dtype, ranks, cap),
            THREADS,
            reg.is_some(),
        ))
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

impl Kernels {
    /// Queues `work` on `stream`: the one launch rule of the tune's workers and of artune's
    /// in-engine op. The kernel, blocks and threads come from [`Kernels::plan`], programmatic
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
        let mut a = *args;
        a.n = work.elems;
        a.rank_base = work.base as i32;
        if let Some(r) = reg.filter(|_| registered) {
            a.reg = r.slot;
            a.reg_gen = r.gen;
            a.missed = r.missed;
        }
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
    let per_gpu = sms.saturating_mul(blocks_per_sm.clamp(1, 2));
    (per_gpu / ranks_on_device.max(1)).clamp(1, MAX_BLOCKS)
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

/// Blocks for one call: enough for one vector per thread of the widest part, at most `cap`.
pub fn blocks(backend: Backend, elems: u64, dtype: Dtype, ranks: Ranks, cap: u32) -> u32 {
    let per_vec = 16 / dtype.size();
    let work = work_vectors(backend, elems / per_vec, ranks);
    (work.div_ceil(THREADS as u64).min(cap as u64) as u32).max(1)
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
    backend.spec().buffers.map_or(0, |b| {
        b.scratch
            .iter()
            .map(|&(c, e)| memory::count(c, ranks) * extent_slot(e, max_bytes, ranks))
            .sum()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::cuda::layout::{
        defines, ArArgs, ProbeArgs, RegSlot, LL1_MAX_BYTES, LL2_MAX_BYTES, MAX_RANKS,
        SIGNAL_STATUS_OFFSET,
    };

    #[test]
    fn the_flat_pull_kernels_and_only_they_have_a_registered_form() {
        let with: Vec<Backend> = Backend::ALL
            .into_iter()
            .filter(|b| b.has_registered_form())
            .collect();
        assert_eq!(with, [Backend::OneStagePull, Backend::TwoStagePull]);
        assert_eq!(
            registered_kernel_name(Backend::TwoStagePull, Dtype::Fp16).as_deref(),
            Some("two_stage_pull_reg_fp16")
        );
        assert_eq!(
            registered_kernel_name(Backend::TwoStagePush, Dtype::Bf16),
            None
        );
        // Every registered kernel is in the source.
        for b in with {
            for d in DTYPES {
                let name = registered_kernel_name(b, d).unwrap();
                let (stem, _) = name.rsplit_once('_').unwrap();
                assert!(
                    compile::ALLREDUCE.contains(&format!("{stem}_##suffix")),
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn programmatic_launch_from_hopper_on() {
        assert!(!programmatic_launch((7, 5)));
        assert!(!programmatic_launch((8, 9)));
        assert!(programmatic_launch((9, 0)));
        assert!(programmatic_launch((12, 0)));
    }

    /// Field offsets and size of `struct name` as declared in `src` (kernels/*.cu), laid out
    /// by C's rules (natural alignment), with the shared constants the -D options give it.
    fn c_layout(src: &str, name: &str) -> (Vec<(String, usize)>, usize) {
        let start = src
            .find(&format!("struct {name} {{"))
            .unwrap_or_else(|| panic!("struct {name} is not in the source"));
        let body = &src[start..][..src[start..].find("};").unwrap()];
        let (mut at, mut align_all, mut fields) = (0usize, 1usize, Vec::new());
        for line in body.lines().skip(1) {
            let decl = line.split("//").next().unwrap().trim();
            let Some(decl) = decl.strip_suffix(';') else {
                continue;
            };
            let (ty, rest) = decl.split_once(' ').unwrap();
            let size = match ty {
                "u64" => 8,
                "u32" | "int" => 4,
                other => panic!("unknown C type {other} in {name}"),
            };
            let mut parts = rest.split('[');
            let field = parts.next().unwrap().trim().to_string();
            let count: usize = parts
                .map(|d| match d.trim_end_matches(']') {
                    "MAX_RANKS" => 16,
                    "MAX_BLOCKS" => 256,
                    n => n.parse::<usize>().unwrap(),
                })
                .product();
            at = at.div_ceil(size) * size;
            fields.push((field, at));
            at += size * count;
            align_all = align_all.max(size);
        }
        (fields, at.div_ceil(align_all) * align_all)
    }

    #[test]
    fn arg_layouts_match_the_cuda_structs() {
        use std::mem::{offset_of, size_of};
        // The offsets the CUDA compiler gives each field, read from the declarations.
        let (f, size) = c_layout(compile::COMMON, "ArArgs");
        let rust = [
            ("in", offset_of!(ArArgs, input)),
            ("out", offset_of!(ArArgs, out)),
            ("scratch", offset_of!(ArArgs, scratch)),
            ("sig", offset_of!(ArArgs, sig)),
            ("src", offset_of!(ArArgs, src)),
            ("dst", offset_of!(ArArgs, dst)),
            ("n", offset_of!(ArArgs, n)),
            ("slot_bytes", offset_of!(ArArgs, slot_bytes)),
            ("fault", offset_of!(ArArgs, fault)),
            ("nranks", offset_of!(ArArgs, nranks)),
            ("rank_base", offset_of!(ArArgs, rank_base)),
            ("island", offset_of!(ArArgs, island)),
            ("dirs", offset_of!(ArArgs, dirs)),
            ("order", offset_of!(ArArgs, order)),
            ("reg", offset_of!(ArArgs, reg)),
            ("missed", offset_of!(ArArgs, missed)),
            ("reg_gen", offset_of!(ArArgs, reg_gen)),
        ];
        let rust: Vec<(String, usize)> = rust.iter().map(|(n, o)| (n.to_string(), *o)).collect();
        assert_eq!(f, rust);
        assert_eq!(size, size_of::<ArArgs>());
        let (f, size) = c_layout(compile::COMMON, "RegSlot");
        let rust = [
            ("in", offset_of!(RegSlot, input)),
            ("gen", offset_of!(RegSlot, gen)),
            ("pad", offset_of!(RegSlot, pad)),
        ];
        let rust: Vec<(String, usize)> = rust.iter().map(|(n, o)| (n.to_string(), *o)).collect();
        assert_eq!(f, rust);
        assert_eq!(size, size_of::<RegSlot>());
        let s = RegSlot {
            input: [7; MAX_RANKS],
            gen: 3,
            pad: 0,
        };
        assert_eq!(s.to_bytes()[offset_of!(RegSlot, gen)], 3);
        let (f, size) = c_layout(compile::PROBE, "ProbeArgs");
        let rust = [
            ("src", offset_of!(ProbeArgs, src)),
            ("dst", offset_of!(ProbeArgs, dst)),
            ("bytes", offset_of!(ProbeArgs, bytes)),
            ("sink", offset_of!(ProbeArgs, sink)),
            ("nranks", offset_of!(ProbeArgs, nranks)),
            ("rank", offset_of!(ProbeArgs, rank)),
            ("peers", offset_of!(ProbeArgs, peers)),
            ("pad", offset_of!(ProbeArgs, pad)),
        ];
        let rust: Vec<(String, usize)> = rust.iter().map(|(n, o)| (n.to_string(), *o)).collect();
        assert_eq!(f, rust);
        assert_eq!(size, size_of::<ProbeArgs>());
        // The host reads `Signal::status` at SIGNAL_STATUS_OFFSET; the LL lines start after it all.
        let (f, size) = c_layout(compile::COMMON, "Signal");
        let status = f.iter().find(|(n, _)| n == "status").unwrap().1;
        assert_eq!(SIGNAL_STATUS_OFFSET, status);
        assert!(size <= SIGNAL_ALLOC, "Signal is {size} bytes");
        let d = defines();
        for want in ["-DMAX_BLOCKS=256", "-DMAX_RANKS=16", "-DTHREADS=512"] {
            assert!(d.iter().any(|x| x == want), "{d:?}");
        }
        // The sources define none of the shared constants themselves.
        for name in [
            "MAX_RANKS",
            "MAX_BLOCKS",
            "THREADS",
            "LL_OFFSET",
            "LL_LINE",
            "LL_THREADS",
        ] {
            assert!(
                !compile::COMMON.contains(&format!("#define {name} ")),
                "{name}"
            );
        }
    }

    /// Every allreduce kernel, flat (staged or registered) or island, ends in `fail_safe`
    /// (common.cuh), after its work: where a wait of the group gave up, its output is NaN,
    /// never a sum that looks right.
    #[test]
    fn every_allreduce_kernel_ends_failing_safe() {
        let split = |src: &'static str| src.split("extern \"C\" __global__").skip(1);
        let kernels: Vec<&str> = split(compile::ALLREDUCE)
            .chain(split(compile::ISLAND))
            .collect();
        assert_eq!(kernels.len(), 9 + 4);
        for k in kernels {
            let name = k
                .split("(const")
                .next()
                .unwrap()
                .rsplit(' ')
                .next()
                .unwrap();
            let body = &k[..k.find("\n  }").unwrap_or(k.len())];
            let safe = body.find("fail_safe<T>(a);");
            // The first call taking the arguments: the kernel's work.
            let work = body.find(">(a);").unwrap();
            assert!(
                safe.is_some_and(|s| s > work),
                "{name} does not call fail_safe after its work"
            );
        }
    }

    #[test]
    fn loopback_ranks_share_the_gpu() {
        // H200: 132 SMs, one 512-thread block each; 8 virtual ranks get 16 blocks each.
        assert_eq!(block_cap(132, 1, 8), 16);
        assert!(block_cap(132, 1, 8) * 8 <= 132);
        assert_eq!(block_cap(132, 4, 1), MAX_BLOCKS);
        assert_eq!(block_cap(10, 1, 16), 1);
    }

    /// The table names the program each kernel is in; the loader finds kernels by name in
    /// every unit, so only this keeps the table's word true.
    #[test]
    fn each_kernel_is_defined_in_the_program_the_table_names() {
        for (b, k) in custom() {
            let (_, src) = compile::PROGRAMS
                .iter()
                .find(|(name, _)| *name == k.source)
                .unwrap_or_else(|| panic!("{b}: kernels/{} is not a program", k.source));
            let mut names = vec![format!(" {}_##suffix(", k.name)];
            if k.ll.is_some() {
                names.push(format!(" {}_ll_##suffix(", k.name));
            }
            for n in names {
                assert!(src.contains(&n), "{b}: no `{n}` in kernels/{}", k.source);
            }
        }
    }

    /// Each LL kernel refuses a message past the limit of its layout's size, as the table
    /// states it ([`Ll::max_bytes`], which the host and the simulator read): the constant its
    /// `ll_launch_ok` checks is that limit.
    #[test]
    fn each_ll_kernel_checks_the_tables_limit() {
        for (b, k) in custom() {
            let Some(ll) = k.ll else { continue };
            let (_, src) = compile::PROGRAMS
                .iter()
                .find(|(name, _)| *name == k.source)
                .unwrap();
            let body = src
                .split_once(&format!("void {}_ll(const ArArgs& a)", k.name))
                .unwrap_or_else(|| panic!("{b}: no {}_ll in kernels/{}", k.name, k.source))
                .1;
            let call = body.split_once("ll_launch_ok(").unwrap().1;
            let limit = call.split(',').nth(2).unwrap().trim();
            let bytes = match limit {
                "LL1_MAX_BYTES" => LL1_MAX_BYTES,
                "LL2_MAX_BYTES" => LL2_MAX_BYTES,
                other => panic!("{b}: its LL kernel checks `{other}`"),
            };
            assert_eq!(bytes, ll.max_bytes(), "{b}: {limit}");
        }
    }

    #[test]
    fn small_messages_use_one_block() {
        assert_eq!(
            blocks(Backend::OneStagePull, 2048, Dtype::Bf16, Ranks::flat(8), 16),
            1
        );
        assert_eq!(
            blocks(
                Backend::OneStagePull,
                1 << 24,
                Dtype::Bf16,
                Ranks::flat(8),
                16
            ),
            16
        );
        assert_eq!(
            blocks(Backend::TwoStagePush, 3, Dtype::Fp32, Ranks::flat(8), 16),
            1
        );
    }

    #[test]
    fn ll_constants_match_the_kernels() {
        let d = defines();
        for want in [
            "-DLL_OFFSET=65536",
            "-DLL_LINE=16",
            "-DLL1_MAX_BYTES=32768",
            "-DLL2_MAX_BYTES=65536",
            "-DLL_THREADS=128",
        ] {
            assert!(d.iter().any(|x| x == want), "{d:?}");
        }
        // The Signal struct (flags, epochs, status, LL epochs) ends before the LL lines.
        const { assert!(SIGNAL_STATUS_OFFSET + 4 + 256 * 4 <= SIGNAL_ALLOC) };
        for b in [
            Backend::OneStagePush,
            Backend::TwoStagePull,
            Backend::TwoStagePush,
        ] {
            let d = Dtype::Bf16;
            let name = ll_kernel_name(b, d).unwrap();
            assert!(compile::ALLREDUCE
                .contains(&format!("{}_##suffix", name.trim_end_matches("_bf16"))));
        }
        assert_eq!(ll_kernel_name(Backend::OneStagePull, Dtype::Bf16), None);
    }

    #[test]
    fn ll_grids_cover_one_word_per_thread() {
        // 4 KiB: 512 words, four blocks of 128; two-stage: a shard of 64 words.
        assert_eq!(
            ll_blocks(Backend::OneStagePush, 4096, Ranks::flat(8)),
            Some(4)
        );
        assert_eq!(
            ll_blocks(Backend::TwoStagePush, 4096, Ranks::flat(8)),
            Some(1)
        );
        assert_eq!(
            ll_blocks(Backend::OneStagePush, 32 << 10, Ranks::flat(8)),
            Some(32)
        );
        assert_eq!(
            ll_blocks(Backend::OneStagePush, (32 << 10) + 2, Ranks::flat(8)),
            None
        );
        assert_eq!(
            ll_blocks(Backend::TwoStagePull, 64 << 10, Ranks::flat(2)),
            Some(32)
        );
        assert_eq!(
            ll_blocks(Backend::TwoStagePull, 64 << 10, Ranks::flat(8)),
            Some(8)
        );
        // The largest LL grids still fit beside 7 other loopback ranks on an H200.
        assert!(32 <= block_cap(132, 2, 8));
        assert_eq!(
            ll_blocks(Backend::TwoStagePush, (64 << 10) + 2, Ranks::flat(8)),
            None
        );
        assert_eq!(ll_blocks(Backend::OneStagePull, 4096, Ranks::flat(8)), None);
        // The island one-shot: a line per word of the message, as one-stage push; the
        // two-shot: a line per word of an island shard (4 KiB in islands of 4: 128 words),
        // each word a thread at each of the 4 places, so 32 words per block.
        let two_fours = Ranks { n: 8, island: 4 };
        assert_eq!(ll_blocks(Backend::IslandOneShot, 4096, two_fours), Some(4));
        assert_eq!(
            ll_blocks(Backend::IslandOneShot, (32 << 10) + 2, two_fours),
            None
        );
        assert_eq!(ll_blocks(Backend::IslandTwoShot, 4096, two_fours), Some(4));
        assert_eq!(
            ll_blocks(Backend::IslandTwoShot, 32 << 10, two_fours),
            Some(32)
        );
        // Islands of 2: 256-word shards, 64 words per block; of 3: 171-word shards, 42 words
        // per block (two threads idle).
        let pairs = Ranks { n: 8, island: 2 };
        assert_eq!(ll_blocks(Backend::IslandTwoShot, 4096, pairs), Some(4));
        let threes = Ranks { n: 6, island: 3 };
        assert_eq!(ll_blocks(Backend::IslandTwoShot, 4096, threes), Some(5));
        assert_eq!(ll_blocks(Backend::IslandTwoShot, 2, two_fours), Some(1));
        assert!(32 <= block_cap(132, 2, 8));
        assert_eq!(
            ll_blocks(Backend::IslandTwoShot, (32 << 10) + 2, two_fours),
            None
        );
        // Tiny messages still exchange a (padded) word between every pair.
        assert_eq!(
            ll_blocks(Backend::TwoStagePush, 2, Ranks::flat(16)),
            Some(1)
        );
        assert_eq!(ll_shard(1, 16), 1);
        assert_eq!(ll_shard(8193, 8), 1025);
    }

    /// island.cu island_two_shot_ll: thread t of block b serves place t / per and shard word
    /// b * per + t % per (per = LL_THREADS / m). The grid must give every (place, word) of the
    /// shard one thread, and every block a word at every place: the lines' reuse argument
    /// needs each block to exchange with every peer in every call.
    #[test]
    fn island_two_shot_ll_grid_gives_each_place_and_word_one_thread() {
        for m in 2..=8usize {
            let ranks = Ranks {
                n: 16 / m * m,
                island: m,
            };
            let per = LL_THREADS as u64 / m as u64;
            for bytes in (1..=LL1_MAX_BYTES)
                .step_by(61)
                .chain([8 * 1023, LL1_MAX_BYTES])
            {
                let sw = ll_shard(bytes.div_ceil(8), m);
                let blocks = ll_blocks(Backend::IslandTwoShot, bytes, ranks).unwrap() as u64;
                let mut seen = vec![0u32; m * sw as usize];
                for b in 0..blocks {
                    let mut places = vec![false; m];
                    for t in 0..LL_THREADS as u64 {
                        let (p, i) = ((t / per) as usize, b * per + t % per);
                        if p < m && i < sw {
                            seen[p * sw as usize + i as usize] += 1;
                            places[p] = true;
                        }
                    }
                    assert!(
                        places.iter().all(|x| *x),
                        "m={m} {bytes} B: block {b} idles"
                    );
                }
                assert!(seen.iter().all(|c| *c == 1), "m={m} {bytes} B: {seen:?}");
            }
        }
    }

    #[test]
    fn ll_lines_fit_the_signal_allocation() {
        // Written out from kernels/allreduce.cu's line addresses (LL_OFFSET + index * 16 bytes):
        // ll1: ((q * n + src) * LL1_LINES + j), q < 2, src < n, j < 4096 (32 KiB / 8): 2n x 4096
        // lines; ll2: (((stage * 2 + q) * n + src) * smax + i), smax = ceil(8192 / n): 4n x smax
        // lines; llp: ((q * n + s) * smax + i), q < 2, s < n, i < smax: 2n x smax lines.
        let signal = 64 << 10;
        for (n, one_push, two_push, two_pull) in [
            // n, 2n*4096, 4n*ceil(8192/n), 2n*ceil(8192/n) lines
            (2usize, 16384u64, 32768u64, 16384u64),
            (3, 24576, 32772, 16386),
            (8, 65536, 32768, 16384),
            (16, 131072, 32768, 16384),
        ] {
            assert_eq!(
                signal_bytes(Backend::OneStagePush, Ranks::flat(n)),
                signal + one_push * 16,
                "n={n}"
            );
            assert_eq!(
                signal_bytes(Backend::TwoStagePush, Ranks::flat(n)),
                signal + two_push * 16,
                "n={n}"
            );
            assert_eq!(
                signal_bytes(Backend::TwoStagePull, Ranks::flat(n)),
                signal + two_pull * 16,
                "n={n}"
            );
            assert_eq!(
                signal_bytes(Backend::OneStagePull, Ranks::flat(n)),
                signal,
                "n={n}"
            );
            // island.cu lli: (((stage * 2 + q) * (n + 1) + s) * len + j), q < 2, s <= n; the
            // one-shot: one stage, len 4096 (32 KiB / 8); the two-shot: two stages, len
            // ceil(4096 / m) for islands of m.
            let n1 = n as u64 + 1;
            assert_eq!(
                signal_bytes(Backend::IslandOneShot, Ranks::flat(n)),
                signal + 2 * n1 * 4096 * 16,
                "n={n}"
            );
            assert_eq!(
                signal_bytes(Backend::IslandTwoShot, Ranks { n, island: 2 }),
                signal + 4 * n1 * 2048 * 16,
                "n={n}"
            );
        }
        // K = 8: 1 MiB of lines for one-stage push, 512 KiB for two-stage push.
        assert_eq!(
            signal_bytes(Backend::OneStagePush, Ranks::flat(8)),
            (64 << 10) + (1 << 20)
        );
        assert_eq!(
            signal_bytes(Backend::TwoStagePush, Ranks::flat(8)),
            (64 << 10) + (512 << 10)
        );
        // 256 KiB for two-stage pull, whose reduce-scatter travels in lines too.
        assert_eq!(
            signal_bytes(Backend::TwoStagePull, Ranks::flat(8)),
            (64 << 10) + (256 << 10)
        );
    }

    /// The memory model counts what this fabric allocates for each rank's signal, for every
    /// backend with a kernel: the flags and the table's lines ([`Ll::lines`]), 16 bytes each.
    #[test]
    fn the_model_counts_the_signal_allocation() {
        for (b, _) in custom() {
            for ranks in [
                Ranks::flat(2),
                Ranks::flat(3),
                Ranks::flat(4),
                Ranks { n: 4, island: 2 },
                Ranks::flat(8),
                Ranks { n: 8, island: 4 },
                Ranks { n: 8, island: 2 },
                Ranks::flat(16),
            ] {
                let signal = signal_bytes(b, ranks);
                assert_eq!(
                    signal - SIGNAL_ALLOC as u64,
                    b.ll_lines(ranks) * 16,
                    "{b} {ranks:?}"
                );
                // With buffers for no message, the model is the signal and the graph table.
                assert_eq!(
                    memory::modelled(b, ranks, 0, 2),
                    signal + memory::GRAPH_TABLE_BYTES,
                    "{b} {ranks:?}"
                );
            }
        }
    }

    #[test]
    fn slots_hold_a_shard_and_its_tail() {
        assert_eq!(
            slot_bytes(Backend::TwoStagePush, 1 << 20, Ranks::flat(8)) % 256,
            0
        );
        assert!(
            slot_bytes(Backend::TwoStagePush, 1000, Ranks::flat(3))
                >= (1000 / 16u64).div_ceil(3) * 16 + 16
        );
        assert!(slot_bytes(Backend::OneStagePush, 1001, Ranks::flat(8)) >= 1001);
    }
}

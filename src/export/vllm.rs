//! vLLM: what its allreduce chain runs per TP size and size on this GPU, which of the profile's
//! choices it can follow, and the GPU P2P access cache it reads.
//!
//! As read in the vLLM 0.34.0 wheel (`vllm/distributed/device_communicators/`); the size
//! tables live in the shared engine model (python/artune/engines.json, [`engines`]):
//! - `cuda_communicator.py`, CudaCommunicator.all_reduce: FlashInfer first (on by default,
//!   VLLM_ALLREDUCE_USE_FLASHINFER; capabilities 9.0 and 10.x at TP 2/4/8, up to its size
//!   table), then NCCL symmetric memory, quick reduce (ROCm), FlashInfer PCIe IPC (opt-in),
//!   AITER (ROCm), custom allreduce (`should_custom_ar`), torch symmetric memory
//!   (`should_use_symm_mem`), then pynccl.
//! - `custom_all_reduce.py`: world sizes 2, 4, 6, 8; more than two GPUs only when fully
//!   NVLinked; P2P required; max_size 8 MiB, lowered to CUSTOM_ALL_REDUCE_MAX_SIZES[capability]
//!   [world size] while symmetric memory is enabled (the default); a message must be under
//!   max_size and a multiple of 16 bytes. Its kernels (csrc/custom_all_reduce.cuh) read peers:
//!   one-stage on two GPUs, and on NVLink one-stage below 512 KiB (up to 4 GPUs) or 256 KiB
//!   (up to 8), two-stage above.
//! - `all_reduce_utils.py`: gpu_p2p_access_check reads
//!   `$VLLM_CACHE_ROOT/gpu_p2p_access_cache_for_<CUDA_VISIBLE_DEVICES>.json` ("i->j": bool for
//!   every ordered pair of visible devices, self pairs included).
//! - `symm_mem.py`: capability and world size in the table, bf16 only, NVLink multicast
//!   required, size under the table's limit and a multiple of 4; multimem at world sizes
//!   4/6/8 (9.0) or 6/8 (10.0), torch two-shot otherwise.
//! - `envs.py`: VLLM_SKIP_P2P_CHECK defaults to 1, so vLLM trusts the driver's P2P answer and
//!   reads the cache only with VLLM_SKIP_P2P_CHECK=0, where the cache replaces its functional
//!   P2P test; VLLM_CACHE_ROOT defaults to `${XDG_CACHE_HOME:-~/.cache}/vllm`.

use super::*;
use crate::units::fmt_bytes;

/// What vLLM's chain runs for one allreduce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Path {
    /// FlashInfer's standalone allreduce, first in the chain, up to this many bytes.
    FlashInfer(u64),
    /// Its custom kernel, as the profile's backend id (one_stage_pull or two_stage_pull).
    Custom(Backend),
    /// torch symmetric memory (multimem or two-shot), which artune does not measure.
    SymmMem(&'static str),
    /// NCCL (pynccl), and why.
    Nccl(String),
}

fn model() -> &'static engines::Vllm {
    &engines::model().vllm
}

/// Why vLLM would not run its custom all-reduce on these GPUs at all, if it would not.
pub fn disabled_because(t: &Topology, gpus: &[usize]) -> Option<&'static str> {
    let n = gpus.len();
    if !model().custom_world_sizes.contains(&n) {
        Some("vLLM's custom all-reduce does not support this number of GPUs")
    } else if n > 2 && !fully_nvlinked(t, gpus) {
        Some("vLLM disables its custom all-reduce on more than two PCIe-only GPUs")
    } else if !p2p_ok(t, gpus) {
        Some("P2P is not available between these GPUs")
    } else {
        None
    }
}

/// The largest message (exclusive) vLLM's custom all-reduce takes on these GPUs.
pub fn custom_limit(t: &Topology, gpus: &[usize]) -> u64 {
    model().custom_max(capability(t, gpus), gpus.len())
}

/// The largest message (inclusive) FlashInfer's standalone allreduce takes on these GPUs, where
/// vLLM builds it: capabilities 9.0 and 10.x, TP 2, 4 or 8, GPUs that reach each other.
pub fn flashinfer_limit(t: &Topology, gpus: &[usize]) -> Option<u64> {
    if !p2p_ok(t, gpus) || (gpus.len() > 2 && !fully_nvlinked(t, gpus)) {
        return None;
    }
    model().flashinfer_max(capability(t, gpus), gpus.len())
}

/// vLLM's chain for one allreduce of `bytes` bytes of `dtype` on `gpus`.
pub fn builtin(t: &Topology, gpus: &[usize], dtype: Dtype, bytes: u64) -> Path {
    let n = gpus.len();
    let cap = capability(t, gpus);
    if let Some(max) = flashinfer_limit(t, gpus).filter(|&m| bytes <= m) {
        return Path::FlashInfer(max);
    }
    let limit = model().custom_max(cap, n);
    let custom_no = match disabled_because(t, gpus) {
        Some(why) => why.to_string(),
        None if !bytes.is_multiple_of(16) => "the message is not a multiple of 16 bytes".into(),
        None if bytes >= limit => format!(
            "the message is at or above the custom all-reduce limit of {} on {}",
            fmt_bytes(limit),
            cap.map_or("this GPU".into(), |c| format!("capability {c}"))
        ),
        None => {
            return Path::Custom(if model().custom_one_stage(n, bytes) {
                Backend::OneStagePull
            } else {
                Backend::TwoStagePull
            });
        }
    };
    let multimem = model().symm_mem_multimem(cap, n);
    let symm = match model().symm_mem_max(cap, n) {
        None => "symmetric memory has no entry for this capability and world size",
        Some(_) if !multicast(t, gpus) => "symmetric memory needs NVLink multicast",
        Some(_) if dtype != Dtype::Bf16 => "symmetric memory takes bf16 only",
        Some(max) if !bytes.is_multiple_of(4) || bytes >= max => {
            "the message is outside symmetric memory's limit"
        }
        Some(_) if multimem => return Path::SymmMem("torch symmetric-memory multimem"),
        Some(_) => return Path::SymmMem("torch symmetric-memory two-shot"),
    };
    Path::Nccl(format!("{custom_no}; {symm}"))
}

/// vLLM's name for its custom kernel of this shape.
fn custom_name(k: Backend) -> String {
    let stage = if k == Backend::OneStagePull {
        "1stage"
    } else {
        "2stage"
    };
    format!("custom allreduce, {stage}")
}

/// What vLLM runs for `bytes` on group `g`, with artune's `--disable-custom-all-reduce` advice.
pub(super) fn runs(p: &Profile, g: &GroupProfile, bytes: u64) -> EngineRun {
    let engine = "vLLM";
    let keep = keep_custom(p, g);
    match builtin(&p.topology, &g.gpus, g.dtype, bytes) {
        Path::Custom(k) if keep => EngineRun {
            engine,
            runs: custom_name(k),
            backend: Some(k),
            because: "should_custom_ar takes it (size under the limit, a multiple of 16 bytes)"
                .into(),
        },
        Path::Custom(_) => EngineRun {
            engine,
            runs: "NCCL".into(),
            backend: Some(Backend::Nccl),
            because: "artune's export disables the custom all-reduce for this TP size (NCCL was faster where vLLM would use it)".into(),
        },
        Path::FlashInfer(max) => EngineRun {
            engine,
            runs: "FlashInfer allreduce".into(),
            backend: None,
            because: format!(
                "FlashInfer comes first in CudaCommunicator.all_reduce and takes up to {} here{}; --disable-custom-all-reduce leaves it on (VLLM_ALLREDUCE_USE_FLASHINFER=0 turns it off), artune's vLLM plugin gives NCCL the sizes the profile gives NCCL",
                fmt_bytes(max),
                hisparse_note(p, g, bytes)
            ),
        },
        Path::SymmMem(what) => EngineRun {
            engine,
            runs: what.into(),
            backend: None,
            because: "custom all-reduce does not take it and symmetric memory does; artune did not measure it".into(),
        },
        Path::Nccl(why) => EngineRun {
            engine,
            runs: "NCCL".into(),
            backend: Some(Backend::Nccl),
            because: why,
        },
    }
}

/// What vLLM runs for `bytes` on group `g` with artune's vLLM plugin loaded: artune's own
/// kernels where the plugin routes the size to them, else the plugin's own rule ([`follow`])
/// on vLLM's order. The plugin knows the TP size, not the GPUs, so it follows
/// the profile's default placement. The fusion pass is said apart, because it replaces an
/// allreduce followed by RMSNorm, not every allreduce.
pub(super) fn plugin_runs(p: &Profile, g: &GroupProfile, bytes: u64) -> EngineRun {
    let engine = "vLLM + artune's plugin";
    let sel = p.selector();
    let rule = follow::Follow::new(&sel, g.tp, None);
    let mut run = if !rule.allows(bytes, g.mode) {
        EngineRun {
            engine,
            runs: "NCCL".into(),
            backend: Some(Backend::Nccl),
            because: format!("{}, so the plugin turns down FlashInfer, custom all-reduce and symmetric memory at this size", nccl_here(p, g)),
        }
    } else {
        match builtin(&p.topology, &g.gpus, g.dtype, bytes) {
            Path::Custom(k) => EngineRun {
                engine,
                runs: custom_name(k),
                backend: Some(k),
                because: "inside the profile's custom band vLLM's own order applies, and should_custom_ar takes it".into(),
            },
            Path::FlashInfer(max) => EngineRun {
                engine,
                runs: "FlashInfer allreduce".into(),
                backend: None,
                because: format!(
                    "inside the profile's custom band vLLM's own order applies, and FlashInfer comes first (to {} here{})",
                    fmt_bytes(max),
                    hisparse_note(p, g, bytes)
                ),
            },
            Path::SymmMem(what) => EngineRun {
                engine,
                runs: what.into(),
                backend: None,
                because: "inside the profile's custom band vLLM's own order applies; custom all-reduce does not take it and symmetric memory does".into(),
            },
            Path::Nccl(why) => EngineRun {
                engine,
                runs: "NCCL".into(),
                backend: Some(Backend::Nccl),
                because: format!("vLLM has no peer-to-peer path for it ({why})"),
            },
        }
    };
    run = with_own_kernels(p, g, bytes, "vLLM", run);
    let vllm_max = model().fusion_max(capability(&p.topology, &g.gpus), g.gpus.len());
    if let Some(max) = vllm_max {
        let top = rule.fused_up_to(Some(max));
        let fused = "; at -O2 an allreduce followed by RMSNorm is";
        run.because.push_str(&match (rule.custom_prefix(), top) {
            // The pass serves both modes: where the profile lacks one, vLLM's sizes stand.
            (None, _) => format!(
                "{fused} {} (vLLM fuses to {}; the profile lacks a mode at this TP size and the pass serves both, so the plugin leaves vLLM's sizes)",
                if bytes <= max { "fused into FlashInfer's kernel here" } else { "not fused here" },
                fmt_bytes(max)
            ),
            (_, Some(top)) if bytes <= top => format!("{fused} fused into FlashInfer's kernel here"),
            _ => format!(
                "{fused} not fused here (vLLM fuses to {}, the plugin only inside the profile's custom band from the smallest size in both modes{})",
                fmt_bytes(max),
                match top {
                    Some(top) => format!(", to {}", fmt_bytes(top)),
                    None => ", which starts with NCCL".into(),
                }
            ),
        });
    }
    run
}

/// Under HiSparse vLLM moves FlashInfer to its trtllm backend on one node (MNNVL's fused
/// all-reduce+RMSNorm can crash with it), whose limit is the fusion table's: where that is
/// smaller, the message may run custom all-reduce or NCCL instead.
fn hisparse_note(p: &Profile, g: &GroupProfile, bytes: u64) -> String {
    match model().flashinfer_max_trtllm(capability(&p.topology, &g.gpus), g.gpus.len()) {
        Some(t) if bytes > t => format!(
            "; with HiSparse vLLM runs FlashInfer's trtllm backend, which takes only up to {}, so there this size goes down vLLM's order past FlashInfer",
            fmt_bytes(t)
        ),
        _ => String::new(),
    }
}

/// vLLM's custom kernel against NCCL (with artune's plugin) where vLLM would run it.
fn custom_vs_nccl(p: &Profile, g: &GroupProfile) -> Versus {
    Versus::of(g.buckets.iter().filter_map(|b| {
        match builtin(&p.topology, &g.gpus, g.dtype, b.bytes) {
            Path::Custom(k) => Some((median(b, k)?, plugin_time(b)?.median_us)),
            _ => None,
        }
    }))
}

/// Keep vLLM's custom all-reduce unless it is slower than NCCL where it runs.
fn keep_custom(p: &Profile, g: &GroupProfile) -> bool {
    custom_vs_nccl(p, g).keep()
}

/// Whether artune can vouch for P2P between `a` and `b`: NVML says read and write work, and a
/// peer kernel of a measured group holding both was verified (measured, never disqualified).
fn verified_pair(p: &Profile, a: usize, b: usize) -> bool {
    nvml_p2p(p, a, b)
        && p.groups.iter().any(|g| {
            g.gpus.contains(&a)
                && g.gpus.contains(&b)
                && Backend::ALL.into_iter().any(|k| {
                    k.is_custom()
                        && !g.waived.contains_key(&k)
                        && g.buckets.iter().any(|x| x.results.contains_key(&k))
                })
        })
}

/// Whether NVML (and artune's transfer check, which marks the pairs it found broken) allows
/// P2P reads and writes between `a` and `b`.
fn nvml_p2p(p: &Profile, a: usize, b: usize) -> bool {
    p.topology
        .pair(a, b)
        .is_some_and(|x| x.p2p.read == Status::Ok && x.p2p.write == Status::Ok)
}

/// Why no P2P cache may be written for `gpus` (the devices CUDA_VISIBLE_DEVICES names) from
/// this profile, if none may.
fn no_cache_because(p: &Profile, gpus: &[usize]) -> Option<String> {
    if p.topology.origin.kind == "loopback" {
        return Some("its GPUs are virtual ranks on one GPU (loopback), so no P2P between real GPUs was exercised".into());
    }
    let n = gpus.len();
    let pairs = || {
        gpus.iter()
            .flat_map(move |&a| gpus.iter().map(move |&b| (a, b)))
            .filter(|&(a, b)| a != b)
    };
    if !pairs().any(|(a, b)| verified_pair(p, a, b)) {
        return Some("no peer kernel of the profile verified P2P between any two GPUs".into());
    }
    // The cache answers for every pair, so a pair NVML allows but no kernel exercised would
    // be written false and turn vLLM's custom all-reduce off where P2P may well work.
    let allowed: Vec<(usize, usize)> = pairs().filter(|&(a, b)| nvml_p2p(p, a, b)).collect();
    let unverified: Vec<String> = allowed
        .iter()
        .filter(|&&(a, b)| !verified_pair(p, a, b))
        .map(|(a, b)| format!("{a}->{b}"))
        .collect();
    (!unverified.is_empty()).then(|| {
        let shown: Vec<&str> = unverified.iter().take(4).map(String::as_str).collect();
        format!(
            "{} of the {} GPU pairs NVML reports P2P for ({}{}) were not exercised by any peer kernel of the profile, and the cache must answer for every pair; tune a TP size whose groups hold them (all {n} GPUs: --tp {n}) to write one",
            unverified.len(),
            allowed.len(),
            shown.join(", "),
            if unverified.len() > shown.len() { ", ..." } else { "" }
        )
    })
}

/// The P2P cache vLLM reads with CUDA_VISIBLE_DEVICES set to `gpus`: its keys are CUDA device
/// indices, which count the visible devices from 0, so "0->1" is `gpus[0]` to `gpus[1]`.
fn p2p_cache(p: &Profile, o: &Options, gpus: &[usize]) -> File {
    let mut s = String::from("{\n");
    for (i, &a) in gpus.iter().enumerate() {
        for (j, &b) in gpus.iter().enumerate() {
            let ok = a == b || verified_pair(p, a, b);
            s.push_str(&format!("    \"{i}->{j}\": {ok},\n"));
        }
    }
    s.push_str(&format!(
        "    \"artune\": {}\n}}\n",
        serde_json::to_string(&provenance_json(p, o)).unwrap_or_default()
    ));
    File {
        name: format!("gpu_p2p_access_cache_for_{}.json", gpu_list(gpus)),
        contents: s,
    }
}

pub(super) fn export(p: &Profile, o: &Options, tps: &[usize]) -> Result<Export, Error> {
    if p.simulated && !o.allow_simulated {
        return Err(Error::bad_input(
            "the profile is SIMULATED, and a vLLM export writes a GPU P2P access cache that replaces vLLM's own P2P test; export from a measured profile, or pass --allow-simulated for tests only",
        ));
    }
    // One cache per GPU set vLLM may be started on: all GPUs (CUDA_VISIBLE_DEVICES unset),
    // and each placement of the profile, whose file vLLM reads when started on those GPUs.
    let all: Vec<usize> = (0..p.topology.gpu_count()).collect();
    let mut sets: Vec<Vec<usize>> = vec![all.clone()];
    for &tp in tps {
        for g in placements(p, tp) {
            if !sets.contains(&g.gpus) {
                sets.push(g.gpus.clone());
            }
        }
    }
    let caches: Vec<(Vec<usize>, Result<File, String>)> = sets
        .into_iter()
        .map(|gpus| {
            let c = match no_cache_because(p, &gpus) {
                None => Ok(p2p_cache(p, o, &gpus)),
                Some(why) => Err(why),
            };
            (gpus, c)
        })
        .collect();
    let mut s = String::new();
    s.push_str("# vLLM: what its allreduce chain runs per TP size on this GPU, and the GPU P2P access cache.\n");
    s.push_str(&format!(
        "# Read against vLLM {} (cuda_communicator.py, all_reduce_utils.py, flashinfer_all_reduce.py, symm_mem.py).\n",
        model().read_against
    ));
    s.push_str(&provenance(p, o, "#"));
    let cap = p
        .topology
        .gpus
        .first()
        .and_then(|g| g.compute_capability)
        .map_or("unknown".to_string(), |c| c.to_string());
    s.push_str(&format!(
        "#\n# Chain, in order: FlashInfer, NCCL symmetric memory (NCCL), quick reduce and AITER (ROCm only: never here),\n# custom allreduce, torch symmetric memory, NCCL.\n# GPU capability {cap}.\n"
    ));
    for &tp in tps {
        for g in placements(p, tp) {
            // vLLM puts its ranks on the visible devices in order, so another placement is
            // selected by starting it with those GPUs visible.
            let visible = if default_placement(&g.gpus) {
                String::new()
            } else {
                format!("CUDA_VISIBLE_DEVICES={} ", gpu_list(&g.gpus))
            };
            s.push_str(&format!(
                "#\n# TP{tp} (GPUs {:?}, {} mode measurements):\n",
                g.gpus,
                g.mode.id()
            ));
            if let Some(max) = flashinfer_limit(&p.topology, &g.gpus) {
                s.push_str(&format!(
                "#   FlashInfer allreduce: up to {} (first in the chain; --disable-custom-all-reduce leaves it on; artune's vLLM plugin gives NCCL the sizes the profile gives NCCL).\n",
                fmt_bytes(max)
            ));
            }
            if let Some(max) = model().fusion_max(capability(&p.topology, &g.gpus), tp) {
                s.push_str(&format!(
                "#   fusion pass (-O2): allreduce+RMSNorm fused into FlashInfer's kernel up to {} (--disable-custom-all-reduce leaves it on; artune's vLLM plugin fuses only inside the profile's custom band from the smallest size).\n",
                fmt_bytes(max)
            ));
            }
            if let Some(why) = disabled_because(&p.topology, &g.gpus) {
                s.push_str(&format!("#   custom allreduce: off ({why}).\n"));
            } else {
                s.push_str(&format!(
                "#   custom allreduce: below {} (CUSTOM_ALL_REDUCE_MAX_SIZES on this capability, or max_size).\n",
                fmt_bytes(custom_limit(&p.topology, &g.gpus))
            ));
            }
            let keep = keep_custom(p, g);
            let (mut follows, mut cannot) = (0, 0);
            for b in &g.buckets {
                let run = runs(p, g, b.bytes);
                let chosen = median(b, b.engine_choice());
                let t = match run.backend {
                    Some(Backend::Nccl) => plugin_time(b).map(|t| t.median_us),
                    Some(k) => median(b, k),
                    None => None,
                };
                let same = match run.backend {
                    Some(Backend::Nccl) => b.engine_choice().is_nccl(),
                    Some(k) => k == b.engine_choice(),
                    None => false,
                };
                let verdict = if same {
                    follows += 1;
                    "follows the profile".to_string()
                } else {
                    cannot += 1;
                    match (t, chosen) {
                        (Some(t), Some(c)) => {
                            format!("cannot follow {} ({})", b.engine_choice(), pct(t, c))
                        }
                        _ => format!("cannot follow {} (not measured)", b.engine_choice()),
                    }
                };
                s.push_str(&format!(
                    "#   {:>8}: {:<34} {:>10}  {verdict}\n",
                    fmt_bytes(b.bytes),
                    run.runs,
                    t.map_or("-".into(), |t| format!("{t:.1} us"))
                ));
            }
            s.push_str(&format!(
            "#   vLLM follows the profile at {follows} of {} sizes (NCCL sizes with artune's NCCL plugin loaded).\n",
            follows + cannot
        ));
            let v = custom_vs_nccl(p, g);
            let runs_custom = g.buckets.iter().any(|b| {
                matches!(
                    builtin(&p.topology, &g.gpus, g.dtype, b.bytes),
                    Path::Custom(_)
                )
            });
            if !runs_custom {
                s.push_str(&format!(
                "#   vLLM runs no custom kernel at any measured size; the flag only frees its buffers.\n{visible}vllm serve MODEL --tensor-parallel-size {tp} --disable-custom-all-reduce\n"
            ));
            } else if keep {
                s.push_str(&format!(
                "#   Where vLLM runs its custom kernel it is {}: keep it.\n{visible}vllm serve MODEL --tensor-parallel-size {tp}\n",
                v.describe()
            ));
            } else {
                s.push_str(&format!(
                "#   Where vLLM runs its custom kernel it is {}:\n#   disable it (also frees about {} MiB per GPU{}).\n{visible}vllm serve MODEL --tensor-parallel-size {tp} --disable-custom-all-reduce\n",
                v.describe(),
                model().custom_buffer_bytes(custom_limit(&p.topology, &g.gpus)) >> 20,
                if fully_nvlinked(&p.topology, &g.gpus) {
                    ", and moves vLLM's custom all-gather and reduce-scatter, which artune did not measure, to NCCL; artune's vLLM plugin gates only the all-reduce"
                } else {
                    ""
                }
            ));
            }
        }
    }
    s.push_str("#\n# GPU P2P access cache:\n");
    if caches.iter().any(|(_, c)| c.is_ok()) {
        s.push_str("# Each gpu_p2p_access_cache_for_<GPUs>.json marks a pair true only where NVML reported P2P read\n");
        s.push_str("# and write OK and a peer kernel of this profile verified results between the two GPUs; every\n");
        s.push_str("# other pair is false. vLLM reads it only with VLLM_SKIP_P2P_CHECK=0 (the default 1 trusts the\n");
        s.push_str("# driver), and then it replaces vLLM's own functional P2P test. vLLM names the file after\n");
        s.push_str("# CUDA_VISIBLE_DEVICES and keys it by visible-device index; copy the files for the GPU sets you run:\n");
        s.push_str("#   cp gpu_p2p_access_cache_for_*.json \"${VLLM_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm}/\"\n");
    }
    for (gpus, c) in &caches {
        let serves = if *gpus == all {
            format!("CUDA_VISIBLE_DEVICES unset or {}", gpu_list(gpus))
        } else {
            format!("CUDA_VISIBLE_DEVICES={}", gpu_list(gpus))
        };
        match c {
            Ok(f) => s.push_str(&format!("#   {}: serves {serves}\n", f.name)),
            Err(why) => s.push_str(&format!("#   {serves}: not written: {why}; leave VLLM_SKIP_P2P_CHECK as it is there and let vLLM test P2P itself.\n")),
        }
    }
    if caches.iter().any(|(_, c)| c.is_ok()) {
        s.push_str("export VLLM_SKIP_P2P_CHECK=0\n");
    }
    s.push_str("#\n# What vLLM's knobs cannot express:\n");
    s.push_str("# - Per-size choice: --disable-custom-all-reduce is all or nothing; vLLM's size limits are fixed per capability.\n");
    s.push_str("# - One-stage vs two-stage: fixed in csrc/custom_all_reduce.cuh.\n");
    s.push_str(
        "# - Push kernels (one_stage_push, two_stage_push): vLLM's kernels read peers (pull).\n",
    );
    s.push_str("# - NCCL's algorithm and protocol: load artune's NCCL tuner plugin (artune export --engine nccl).\n");
    s.push_str("# - Launch mode: the flag covers CUDA-graph and eager launches alike; graph-mode measurements are used.\n");
    let mut files = vec![File {
        name: "vllm.txt".into(),
        contents: s,
    }];
    files.extend(caches.into_iter().filter_map(|(_, c)| c.ok()));
    Ok(Export { files })
}

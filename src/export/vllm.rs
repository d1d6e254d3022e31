//! vLLM: whether to keep its custom all-reduce per TP size, and the GPU P2P access cache it
//! reads, filled from the profile's topology.
//!
//! vLLM's built-in rule as read in vllm-project/vllm: `CustomAllreduce` (vllm/distributed/
//! device_communicators/custom_all_reduce.py) runs only for world sizes 2, 4, 6, 8, only on two
//! GPUs or fully NVLink-connected ones, only with working P2P, and only for messages under
//! max_size = 8 MiB whose size is a multiple of 16 bytes; else NCCL. Its kernels
//! (csrc/custom_all_reduce.cuh) read peers' buffers: one-stage on two GPUs, and on NVLink
//! one-stage below 512 KiB (up to 4 GPUs) or 256 KiB (up to 8), two-stage above. The P2P cache
//! (custom_all_reduce_utils.py, gpu_p2p_access_check) is `$VLLM_CACHE_ROOT/
//! gpu_p2p_access_cache_for_<CUDA_VISIBLE_DEVICES>.json` mapping "i->j" to a boolean for every
//! ordered pair of visible devices, self pairs included.

use super::*;
use crate::topology::{PathClass, Status, Topology};

/// vLLM's custom all-reduce message limit (CustomAllreduce max_size).
pub const MAX_SIZE: u64 = 8192 * 1024;
/// Device memory vLLM's custom all-reduce allocates per GPU: meta + scratch (max_size), the
/// IPC input buffer (max_size) and the rank-data table (8 MiB).
pub const BUFFER_BYTES: u64 = 3 * MAX_SIZE;

/// What vLLM's built-in rule runs for one allreduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Its custom kernel, as the profile's backend id (one_stage_pull or two_stage_pull).
    Custom(Backend),
    /// NCCL, and why.
    Nccl(&'static str),
}

fn fully_nvlinked(t: &Topology, gpus: &[usize]) -> bool {
    gpus.iter().all(|&a| {
        gpus.iter()
            .all(|&b| a == b || t.pair(a, b).is_some_and(|p| p.path == PathClass::NV))
    })
}

fn p2p_ok(t: &Topology, gpus: &[usize]) -> bool {
    gpus.iter().all(|&a| {
        gpus.iter().all(|&b| {
            a == b
                || t.pair(a, b)
                    .is_some_and(|p| p.p2p.read != Status::No && p.p2p.write != Status::No)
        })
    })
}

/// Why vLLM would not run its custom all-reduce on these GPUs at all, if it would not.
pub fn disabled_because(t: &Topology, gpus: &[usize]) -> Option<&'static str> {
    let n = gpus.len();
    if ![2, 4, 6, 8].contains(&n) {
        Some("vLLM's custom all-reduce supports 2, 4, 6 or 8 GPUs only")
    } else if n > 2 && !fully_nvlinked(t, gpus) {
        Some("vLLM disables its custom all-reduce on more than two PCIe-only GPUs")
    } else if !p2p_ok(t, gpus) {
        Some("P2P is not available between these GPUs")
    } else {
        None
    }
}

/// vLLM's built-in choice for one allreduce of `bytes` bytes on `gpus`.
pub fn builtin(t: &Topology, gpus: &[usize], bytes: u64) -> Path {
    if let Some(why) = disabled_because(t, gpus) {
        return Path::Nccl(why);
    }
    if bytes % 16 != 0 {
        return Path::Nccl("the message is not a multiple of 16 bytes");
    }
    if bytes >= MAX_SIZE {
        return Path::Nccl("the message is 8 MiB or more");
    }
    let n = gpus.len();
    let one = n == 2 || (n <= 4 && bytes < 512 * 1024) || (n <= 8 && bytes < 256 * 1024);
    Path::Custom(if one {
        Backend::OneStagePull
    } else {
        Backend::TwoStagePull
    })
}

/// Comparison of vLLM's custom kernel with NCCL over the sizes where vLLM would use it.
struct Verdict {
    faster: usize,
    slower: usize,
    unmeasured: usize,
    lines: String,
}

fn compare(p: &Profile, g: &GroupProfile) -> Verdict {
    let mut v = Verdict {
        faster: 0,
        slower: 0,
        unmeasured: 0,
        lines: String::new(),
    };
    for b in &g.buckets {
        let Path::Custom(k) = builtin(&p.topology, &g.gpus, b.bytes) else {
            continue;
        };
        let (custom, nccl) = (b.results.get(&k), nccl_time(b));
        let verdict = match (custom, nccl) {
            (Some(c), Some(n)) if c.median_us < n.median_us => {
                v.faster += 1;
                "custom faster"
            }
            (Some(_), Some(_)) => {
                v.slower += 1;
                "NCCL faster"
            }
            _ => {
                v.unmeasured += 1;
                "not measured"
            }
        };
        let us =
            |t: Option<&Timing>| t.map_or("-".to_string(), |t| format!("{:.1} us", t.median_us));
        v.lines.push_str(&format!(
            "#   {:>10} bytes: {k} {:>10}, NCCL {:>10}: {verdict}\n",
            b.bytes,
            us(custom),
            us(nccl.as_ref())
        ));
    }
    v
}

/// The P2P cache for all GPUs of the profile's topology, in vLLM's key order.
fn p2p_cache(p: &Profile, o: &Options) -> File {
    let n = p.topology.gpu_count();
    let ids: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    let mut s = String::from("{\n");
    for a in 0..n {
        for b in 0..n {
            let ok = a == b
                || p.topology
                    .pair(a, b)
                    .is_some_and(|x| x.p2p.read == Status::Ok && x.p2p.write == Status::Ok);
            s.push_str(&format!("    \"{a}->{b}\": {ok},\n"));
        }
    }
    s.push_str(&format!(
        "    \"artune\": {}\n}}\n",
        serde_json::to_string(&provenance_json(p, o)).unwrap_or_default()
    ));
    File {
        name: format!("gpu_p2p_access_cache_for_{}.json", ids.join(",")),
        contents: s,
    }
}

pub(super) fn export(p: &Profile, o: &Options, tps: &[usize]) -> Result<Export, Error> {
    let cache = p2p_cache(p, o);
    let mut s = String::new();
    s.push_str("# vLLM: custom all-reduce on/off per TP size, and the GPU P2P access cache.\n");
    s.push_str(&provenance(p, o, "#"));
    for &tp in tps {
        let Some(g) = preferred_group(p, tp) else {
            continue;
        };
        s.push_str(&format!(
            "#\n# TP{tp} (GPUs {:?}, {} mode measurements):\n",
            g.gpus,
            g.mode.id()
        ));
        if let Some(why) = disabled_because(&p.topology, &g.gpus) {
            s.push_str(&format!(
                "#   {why}, so vLLM uses NCCL at every size whatever the flag says;\n#   the flag only silences its warning.\nvllm serve MODEL --tensor-parallel-size {tp} --disable-custom-all-reduce\n"
            ));
            continue;
        }
        let v = compare(p, g);
        s.push_str("#   Where vLLM would run its custom kernel (under 8 MiB), measured:\n");
        s.push_str(&v.lines);
        if v.slower > v.faster {
            s.push_str(&format!(
                "#   NCCL was faster at {} of {} sizes: disable the custom all-reduce (also frees about {} MiB per GPU).\n",
                v.slower,
                v.faster + v.slower + v.unmeasured,
                BUFFER_BYTES >> 20
            ));
            s.push_str(&format!(
                "vllm serve MODEL --tensor-parallel-size {tp} --disable-custom-all-reduce\n"
            ));
        } else {
            s.push_str(&format!(
                "#   The custom kernel was faster at {} of {} sizes: keep it (the default).\n",
                v.faster,
                v.faster + v.slower + v.unmeasured
            ));
            s.push_str(&format!("vllm serve MODEL --tensor-parallel-size {tp}\n"));
        }
    }
    s.push_str("#\n# GPU P2P access cache: vLLM tests P2P between every GPU pair at first start and caches the\n");
    s.push_str(&format!(
        "# result. {} is that cache filled from the profile's topology (true where NVML\n",
        cache.name
    ));
    s.push_str("# reported P2P read and write OK). vLLM names the file after CUDA_VISIBLE_DEVICES, so this one\n");
    s.push_str(&format!(
        "# serves CUDA_VISIBLE_DEVICES unset or set to {}. Copy it into vLLM's cache directory:\n",
        (0..p.topology.gpu_count())
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    ));
    s.push_str(&format!(
        "#   cp {} \"${{VLLM_CACHE_ROOT:-$HOME/.cache/vllm}}/\"\n",
        cache.name
    ));
    s.push_str("#\n# What vLLM's knobs cannot express:\n");
    s.push_str("# - Per-size choice: the flag is all or nothing; vLLM decides by size itself (8 MiB limit, fixed).\n");
    s.push_str("# - One-stage vs two-stage: fixed in csrc/custom_all_reduce.cuh. VLLM_CUSTOM_ALLREDUCE_ALGO\n");
    s.push_str(
        "#   (1stage|2stage) is read only by some vLLM forks, not by the upstream sources read.\n",
    );
    s.push_str(
        "# - Push kernels (one_stage_push, two_stage_push): vLLM's kernels read peers (pull).\n",
    );
    s.push_str("# - NCCL's algorithm and protocol: use artune's NCCL tuner plugin (artune export --engine env).\n");
    s.push_str("# - Launch mode: the flag covers CUDA-graph and eager launches alike; graph-mode measurements are used.\n");
    Ok(Export {
        files: vec![
            File {
                name: "vllm.txt".into(),
                contents: s,
            },
            cache,
        ],
    })
}

//! TensorRT-LLM (PyTorch backend): `allreduce_strategy` and, on NVLink, an autotuner cache
//! holding only the sizes where a custom kernel beats NCCL.
//!
//! As read in NVIDIA/TensorRT-LLM:
//! - `cpp/tensorrt_llm/thop/allreduceOp.cpp` (commit 4bb1ef88800b), ifFallbackToNCCL: ONESHOT
//!   and TWOSHOT become NCCL when the message exceeds the workspace, without P2P, or without
//!   NVLink between every pair, so on a PCIe box any cache is inert and NCCL runs.
//! - `cpp/tensorrt_llm/common/customAllReduceUtils.h` (commit b78a54611b6f),
//!   getMaxRequiredWorkspaceSize: 64 MiB, or TRTLLM_ALLREDUCE_FUSION_WORKSPACE_SIZE (older
//!   releases: 16 MB up to TP2, 8 MB above).
//! - `tensorrt_llm/_torch/autotuner.py` (commit b35ac1b64368), AutoTunerProfilingCache
//!   load_cache: a JSON object with `metadata` and one section `rank_<r>` per rank, and it
//!   asserts that the process's `rank_<r>` exists. This layout is from TensorRT-LLM PR #10336;
//!   older releases read one file per rank, which artune does not write.
//! - `tensorrt_llm/_torch/custom_ops/torch_custom_ops.py`, AllReduceRunner: tokens tuned at
//!   powers of two up to 8192 (get_last_power_of_2_num_tokens_buckets(8192)), looked up as
//!   last_positive_power_of_2 clamped to tune_max_num_tokens (autotuner.py
//!   _find_nearest_profile), so 16384 tokens and more use the 8192 entry; TWOSHOT only from
//!   one token per rank; the key is `("trtllm::tunable_allreduce::allreduce",
//!   "AllReduceRunner", str((tp, fusion_op)), shapes)` with the six inputs' shapes, the
//!   residual's token dimension -1 and absent inputs `(0,)`. Tactics are AllReduceStrategy
//!   values: ONESHOT=4, TWOSHOT=5. NCCL bands get no entry: TensorRT-LLM tunes those itself
//!   (NCCL or NCCL_SYMMETRIC on NVSwitch), which a written NCCL tactic would stop.

use super::*;
use crate::units::fmt_bytes;

const OP: &str = "trtllm::tunable_allreduce::allreduce";
/// TensorRT-LLM's largest token bucket (get_last_power_of_2_num_tokens_buckets(8192)).
const MAX_TOKENS: u64 = 8192;
/// The fusion workspace bound of current releases (getMaxRequiredWorkspaceSize).
const WORKSPACE: u64 = 64 << 20;
/// AllReduceFusionOp values written: NONE and RESIDUAL_RMS_NORM.
const FUSIONS: [(u32, &str); 2] = [(0, "NONE"), (1, "RESIDUAL_RMS_NORM")];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    OneShot,
    TwoShot,
}

impl Strategy {
    fn tactic(self) -> u32 {
        match self {
            Strategy::OneShot => 4,
            Strategy::TwoShot => 5,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Strategy::OneShot => "ONESHOT",
            Strategy::TwoShot => "TWOSHOT",
        }
    }
    /// The backend whose entry names this strategy among its engine paths.
    fn backend(self) -> Backend {
        Backend::ALL
            .into_iter()
            .find(|&k| Strategy::of(k) == Some(self))
            .unwrap_or(Backend::Nccl)
    }

    /// TensorRT-LLM's strategy of `k`'s shape, from its table entry (allreduce/backend/).
    fn of(k: Backend) -> Option<Strategy> {
        let path = k
            .spec()
            .engine_paths
            .iter()
            .find(|(engine, _)| *engine == ENGINE)?
            .1;
        [Strategy::OneShot, Strategy::TwoShot]
            .into_iter()
            .find(|s| s.name() == path)
    }
}

/// The engine's name in the backend table's engine paths.
const ENGINE: &str = "TensorRT-LLM";

/// The custom strategy for one bucket, if the steering rule picks one among what TensorRT-LLM
/// can run (NCCL variants, one-shot push, two-shot push with a token per rank), within the
/// workspace. The profile's own choice stands where TensorRT-LLM can run it.
fn decide(b: &Bucket, tp: usize, tokens: u64, bytes: u64) -> Option<Strategy> {
    if bytes > WORKSPACE {
        return None;
    }
    let runnable = |k: Backend| match Strategy::of(k) {
        _ if k.is_nccl() => true,
        Some(Strategy::OneShot) => true,
        Some(Strategy::TwoShot) => tokens >= tp as u64,
        None => false,
    };
    let choice = if runnable(b.engine_choice()) {
        b.engine_choice()
    } else {
        let eligible: std::collections::BTreeMap<Backend, Timing> = b
            .results
            .iter()
            .filter(|(k, _)| runnable(**k) && !b.waived.contains_key(k))
            .map(|(k, t)| (*k, *t))
            .collect();
        crate::decide::rule_choice(&eligible, crate::allreduce::Ranks::flat(tp), bytes)?
    };
    Strategy::of(choice)
}

/// What TensorRT-LLM runs for `bytes` on group `g` with artune's export applied.
pub(super) fn runs(p: &Profile, g: &GroupProfile, bytes: u64) -> EngineRun {
    let engine = "TensorRT-LLM";
    let nccl = |because: &str| EngineRun {
        engine,
        runs: "NCCL".into(),
        backend: Some(Backend::Nccl),
        because: because.into(),
    };
    if !fully_nvlinked(&p.topology, &g.gpus) {
        return nccl("no NVLink: ifFallbackToNCCL turns ONESHOT/TWOSHOT into NCCL; the export sets allreduce_strategy: NCCL");
    }
    if bytes > WORKSPACE {
        return nccl("above the 64 MiB fusion workspace, ifFallbackToNCCL runs NCCL");
    }
    // The token count is the model's (bytes / hidden size), unknown here: TWOSHOT needs one
    // token per rank, so where that decides, both answers are given.
    let b = bucket_for(g, bytes);
    let (many, few) = (
        b.and_then(|b| decide(b, g.tp, u64::MAX, bytes)),
        b.and_then(|b| decide(b, g.tp, 0, bytes)),
    );
    match many {
        Some(s) if many != few => EngineRun {
            engine,
            runs: format!(
                "{} from {} tokens, else {}",
                s.name(),
                g.tp,
                few.map_or("NCCL", |f| f.name())
            ),
            backend: Some(s.backend()),
            because: format!(
                "the exported autotuner cache entry for this size's token bucket: TWOSHOT needs a token per rank, and with fewer the cache {} (the export with the model's --hidden lists each bucket)",
                few.map_or("has no entry and TensorRT-LLM tunes it".into(), |f| format!("holds {}", f.name()))
            ),
        },
        Some(s) => EngineRun {
            engine,
            runs: s.name().into(),
            backend: Some(s.backend()),
            because: "the exported autotuner cache entry for the token bucket of this size".into(),
        },
        None => EngineRun {
            engine,
            runs: "its own tuning (NCCL or NCCL_SYMMETRIC)".into(),
            backend: None,
            because: "no custom kernel beats NCCL here, so the cache has no entry and TensorRT-LLM tunes it".into(),
        },
    }
}

/// Python's repr of a cache key.
fn key(tp: usize, op: u32, tokens: u64, hidden: u64) -> String {
    let (res, norm) = if op == 0 {
        ("(0,)".to_string(), "(0,)".to_string())
    } else {
        (format!("(-1, {hidden})"), format!("({hidden},)"))
    };
    let workspace = 3 * tp + 2;
    format!("('{OP}', 'AllReduceRunner', '({tp}, {op})', (({tokens}, {hidden}), {res}, {norm}, (0,), (0,), ({workspace},)))")
}

/// Unix seconds of an RFC 3339 UTC time like "2026-11-29T08:49:54Z".
fn unix_seconds(s: &str) -> Option<i64> {
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some((era * 146_097 + doe - 719_468) * 86_400 + hh * 3600 + mm * 60 + ss)
}

struct Entry {
    key: String,
    strategy: Strategy,
    min_time_ms: f64,
}

pub(super) fn export(p: &Profile, o: &Options, tps: &[usize]) -> Result<Export, Error> {
    let hidden = o.hidden.ok_or_else(|| {
        Error::bad_input("TensorRT-LLM keys its allreduce cache by token count; pass the model's --hidden size (and --dtype if not bf16)")
    })?;
    if hidden == 0 || hidden > 1 << 24 {
        return Err(Error::bad_input(format!(
            "--hidden {hidden} is not a model hidden size; give a number from 1 to 16777216"
        )));
    }
    let row = hidden * o.dtype.size();
    let world = o
        .world_size
        .unwrap_or_else(|| tps.iter().copied().max().unwrap_or(1));
    let mut entries: Vec<Entry> = Vec::new();
    let mut notes = String::new();
    let (mut nvlink, mut pcie) = (Vec::new(), Vec::new());
    for &tp in tps {
        // The cache's keys carry no GPU set: it holds one NVLink placement per TP size.
        let mut held: Option<&[usize]> = None;
        for g in placements(p, tp) {
            if !fully_nvlinked(&p.topology, &g.gpus) {
                if !pcie.contains(&tp) {
                    pcie.push(tp);
                }
                notes.push_str(&format!(
                "#\n# TP{tp} (GPUs {:?}): no NVLink between them, so ifFallbackToNCCL runs NCCL at every size\n#   whatever the strategy or cache says; artune's NCCL plugin then picks NCCL's variant.\n",
                g.gpus
            ));
                continue;
            }
            if let Some(held) = held {
                notes.push_str(&format!(
                "#\n# TP{tp} (GPUs {:?}): NOT in the cache, whose keys carry no GPU set: on these GPUs TensorRT-LLM\n#   reads the entries of GPUs {}; artune why {} --tp {tp} --gpus {} --bytes N gives this\n#   placement's own answers.\n",
                g.gpus,
                gpu_list(held),
                shell_quote(&o.source),
                gpu_list(&g.gpus)
            ));
                continue;
            }
            held = Some(&g.gpus);
            nvlink.push(tp);
            notes.push_str(&format!(
            "#\n# TP{tp} (GPUs {:?}, {} mode measurements), {hidden} x {} per token; entries only where a custom kernel wins:\n",
            g.gpus,
            g.mode.id(),
            o.dtype.id()
        ));
            let mut tokens = 1u64;
            while tokens <= MAX_TOKENS {
                let bytes = tokens * row;
                let line = match bucket_for(g, bytes) {
                    None => "beyond the profile: no entry (TensorRT-LLM tunes it)".to_string(),
                    Some(_) if bytes > WORKSPACE => format!(
                        "above the {} workspace: NCCL (no entry)",
                        fmt_bytes(WORKSPACE)
                    ),
                    Some(b) => match decide(b, tp, tokens, bytes) {
                        Some(s) => {
                            let us = median(b, s.backend()).unwrap_or(f64::NAN);
                            for (op, _) in FUSIONS {
                                entries.push(Entry {
                                    key: key(tp, op, tokens, hidden),
                                    strategy: s,
                                    min_time_ms: us / 1000.0,
                                });
                            }
                            format!(
                                "{} ({us:.1} us measured at {} bytes; profile chose {})",
                                s.name(),
                                b.bytes,
                                b.choice
                            )
                        }
                        None => format!(
                            "NCCL band (profile chose {}): no entry, TensorRT-LLM tunes it",
                            b.choice
                        ),
                    },
                };
                notes.push_str(&format!(
                    "#   {tokens:>5} tokens = {bytes:>9} bytes: {line}\n"
                ));
                tokens *= 2;
            }
        }
    }

    let mut y = String::new();
    y.push_str("# TensorRT-LLM LLM API options (pass with --extra_llm_api_options FILE).\n");
    y.push_str("# Read against NVIDIA/TensorRT-LLM cpp/tensorrt_llm/thop/allreduceOp.cpp (4bb1ef88800b),\n");
    y.push_str("# customAllReduceUtils.h (b78a54611b6f) and tensorrt_llm/_torch/autotuner.py (b35ac1b64368).\n");
    y.push_str(&provenance(p, o, "#"));
    y.push_str("#\n");
    let with_cache = !nvlink.is_empty() && !entries.is_empty();
    if with_cache {
        y.push_str("# A custom kernel wins some sizes on NVLink: keep AUTO, which consults the autotuner cache:\n");
        y.push_str("#   export TLLM_AUTOTUNER_CACHE_PATH=/path/to/trtllm-autotuner-cache.json\n");
        y.push_str("allreduce_strategy: AUTO\n");
    } else {
        y.push_str("# NCCL serves every size TensorRT-LLM will use a kernel for here (no NVLink, or no custom kernel\n");
        y.push_str(
            "# wins), so no cache is written: run NCCL, steered by artune's NCCL tuner plugin:\n",
        );
        y.push_str("allreduce_strategy: NCCL\n");
        y.push_str("# and in the server's environment:\n");
        for line in super::nccl::plugin_lines(p, o).lines() {
            y.push_str(&format!("#   {}\n", line.trim_start_matches("# ")));
        }
    }
    if !pcie.is_empty() && with_cache {
        y.push_str(&format!(
            "# TP {}: no NVLink, NCCL at every size; for those deployments use allreduce_strategy: NCCL and\n# artune's NCCL plugin (artune export --engine nccl).\n",
            pcie.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
        ));
    }
    y.push_str("#\n# What TensorRT-LLM's knobs cannot express:\n");
    y.push_str("# - Pull kernels (one_stage_pull, two_stage_pull): TensorRT-LLM's one-shot and two-shot kernels write\n");
    y.push_str("#   into peers' buffers (push). Where the profile chose a pull kernel, the steering rule is applied\n");
    y.push_str("#   again among what TensorRT-LLM can run (NCCL, ONESHOT, TWOSHOT).\n");
    y.push_str("# - Token counts between powers of two round down to one, and counts above 8192 are clamped to\n");
    y.push_str("#   tune_max_num_tokens (8192 by default), so the 8192 entry, measured at 8192 tokens, serves them.\n");
    y.push_str("# - Fusions: entries for NONE and RESIDUAL_RMS_NORM carry plain-allreduce timings; quantizing fusions are\n");
    y.push_str("#   not written. Keys assume 2-D [tokens, hidden] inputs and a workspace of 3*TP+2 pointers.\n");
    y.push_str("# - One/two-shot above the 64 MiB fusion workspace run NCCL (ifFallbackToNCCL).\n");
    let nvlinked = |tp: usize| {
        placements(p, tp)
            .iter()
            .filter(|g| fully_nvlinked(&p.topology, &g.gpus))
            .count()
    };
    if tps.iter().any(|&tp| nvlinked(tp) > 1) {
        y.push_str("# - Placements: cache keys carry TP size and shapes, not GPUs; for a TP size with several NVLink\n");
        y.push_str("#   placements the cache holds the first (named below), and TensorRT-LLM uses it on the others.\n");
    }
    y.push_str("# - Launch mode: the autotuner has none; graph-mode measurements are used where the profile has them.\n");
    y.push_str(&notes);

    let mut files = vec![File {
        name: "extra-llm-api-options.yaml".into(),
        contents: y,
    }];
    if with_cache {
        files.push(cache(p, o, world, &entries));
    }
    Ok(Export { files })
}

/// The cache in the `rank_<r>` layout (PR #10336), one identical section per rank of `world`.
fn cache(p: &Profile, o: &Options, world: usize, entries: &[Entry]) -> File {
    let cap = p.topology.gpus.first().and_then(|g| g.compute_capability);
    let metadata = serde_json::json!({
        "lib_version": format!("artune {}", env!("CARGO_PKG_VERSION")),
        "creation_timestamp": unix_seconds(&p.created).unwrap_or(0) as f64,
        "device_name": p.topology.gpus.first().map(|g| g.name.clone()).unwrap_or_default(),
        "device_capability": cap.map(|c| serde_json::json!([c.major, c.minor])).unwrap_or(serde_json::Value::Null),
    });
    let mut section = String::from("{");
    for (i, e) in entries.iter().enumerate() {
        let value = serde_json::json!({
            "runner_id": 0,
            "tactic": e.strategy.tactic().to_string(),
            "min_time": e.min_time_ms,
        });
        section.push_str(&format!(
            "{}\n    {}: {}",
            if i == 0 { "" } else { "," },
            serde_json::to_string(&e.key).unwrap_or_default(),
            serde_json::to_string(&value).unwrap_or_default()
        ));
    }
    section.push_str(if entries.is_empty() { "}" } else { "\n  }" });
    let mut j = String::from("{\n");
    j.push_str(&format!(
        "  \"metadata\": {},\n",
        serde_json::to_string(&metadata).unwrap_or_default()
    ));
    j.push_str(&format!(
        "  \"artune\": {}",
        serde_json::to_string(&provenance_json(p, o)).unwrap_or_default()
    ));
    for r in 0..world {
        j.push_str(&format!(",\n  \"rank_{r}\": {section}"));
    }
    j.push_str("\n}\n");
    File {
        name: "trtllm-autotuner-cache.json".into(),
        contents: j,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_matches_python_repr() {
        assert_eq!(
            key(2, 0, 8, 7168),
            "('trtllm::tunable_allreduce::allreduce', 'AllReduceRunner', '(2, 0)', ((8, 7168), (0,), (0,), (0,), (0,), (8,)))"
        );
        assert_eq!(
            key(4, 1, 1, 4096),
            "('trtllm::tunable_allreduce::allreduce', 'AllReduceRunner', '(4, 1)', ((1, 4096), (-1, 4096), (4096,), (0,), (0,), (14,)))"
        );
    }

    #[test]
    fn custom_entries_reach_the_64_mib_workspace_and_never_pick_nccl() {
        let p = sample::profile_with("nvswitch-8x", &[4], &[32 << 20, 128 << 20]);
        let mut b = p.groups[0].buckets[0].clone();
        let nccl = b.results[&Backend::Nccl].median_us;
        for k in [Backend::TwoStagePush, Backend::TwoStagePull] {
            let t = b.results.get_mut(&k).unwrap();
            (t.median_us, t.ci_low_us, t.ci_high_us) = (nccl / 2.0, nccl / 2.1, nccl / 1.9);
        }
        b.choice = Backend::TwoStagePull;
        // 32 MiB at TP4: above the 8 MB of older releases, inside today's 64 MiB workspace; the
        // pull choice maps to TensorRT-LLM's push kernel by the rule among what it runs.
        assert_eq!(decide(&b, 4, 2048, 32 << 20), Some(Strategy::TwoShot));
        assert_eq!(
            decide(&b, 4, 2, 32 << 20),
            None,
            "TWOSHOT needs a token per rank"
        );
        assert_eq!(decide(&b, 4, 8192, 65 << 20), None, "above the workspace");
        b.choice = Backend::Nccl;
        assert_eq!(
            decide(&b, 4, 2048, 32 << 20),
            None,
            "NCCL bands get no entry"
        );
    }

    #[test]
    fn unix_seconds_inverts_rfc3339() {
        for s in [0, 951_782_400, 1_795_942_194] {
            assert_eq!(unix_seconds(&crate::profile::rfc3339(s)), Some(s));
        }
        assert_eq!(unix_seconds("yesterday"), None);
    }
}

//! TensorRT-LLM (PyTorch backend): an autotuner cache for `allreduce_strategy: AUTO` and the
//! LLM API option line.
//!
//! Format as read in NVIDIA/TensorRT-LLM `tensorrt_llm/_torch/autotuner.py`
//! (AutoTunerProfilingCache.save_cache/load_cache): a JSON object with `metadata` and one
//! section `rank_<r>` per rank; each entry maps `str(cache_key)` to `{runner_id, tactic
//! (repr), min_time (ms)}`. The allreduce key (`custom_ops/torch_custom_ops.py`,
//! AllReduceRunner) is `("trtllm::tunable_allreduce::allreduce", "AllReduceRunner",
//! str((tp, fusion_op)), shapes)` where shapes are the six inputs' shapes with the token count
//! rounded down to a power of two (1..8192), the residual's token dimension -1 and absent
//! inputs `(0,)`. Tactics are AllReduceStrategy values: NCCL=0, ONESHOT=4, TWOSHOT=5.

use super::*;

const OP: &str = "trtllm::tunable_allreduce::allreduce";
/// TensorRT-LLM's token buckets: powers of two up to 8192 (get_last_power_of_2_num_tokens_buckets).
const MAX_TOKENS: u64 = 8192;
/// AllReduceFusionOp values written: NONE and RESIDUAL_RMS_NORM.
const FUSIONS: [(u32, &str); 2] = [(0, "NONE"), (1, "RESIDUAL_RMS_NORM")];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    Nccl,
    OneShot,
    TwoShot,
}

impl Strategy {
    fn tactic(self) -> u32 {
        match self {
            Strategy::Nccl => 0,
            Strategy::OneShot => 4,
            Strategy::TwoShot => 5,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Strategy::Nccl => "NCCL",
            Strategy::OneShot => "ONESHOT",
            Strategy::TwoShot => "TWOSHOT",
        }
    }
}

/// Largest message the one/two-shot kernels may take: the fusion workspace size of
/// CustomAllReduceHelper.max_workspace_size_auto in releases that sized it by TP (16 MB up to
/// TP2, 8 MB above); newer releases allocate 64 MiB, so this is the safe bound for both.
fn workspace_limit(tp: usize) -> u64 {
    if tp <= 2 {
        16_000_000
    } else {
        8_000_000
    }
}

/// The strategy for `tokens` tokens of `bytes` bytes, and its expected time (us).
fn decide(b: &Bucket, tp: usize, tokens: u64, bytes: u64) -> Option<(Strategy, f64)> {
    let custom_ok = bytes <= workspace_limit(tp);
    let mut cands: Vec<(Strategy, f64)> = Vec::new();
    if let Some(t) = nccl_time(b) {
        cands.push((Strategy::Nccl, t.median_us));
    }
    if custom_ok {
        if let Some(t) = b.results.get(&Backend::OneStagePush) {
            cands.push((Strategy::OneShot, t.median_us));
        }
        // TWOSHOT needs at least one token per rank (AllReduceRunner.get_valid_tactics).
        if tokens >= tp as u64 {
            if let Some(t) = b.results.get(&Backend::TwoStagePush) {
                cands.push((Strategy::TwoShot, t.median_us));
            }
        }
    }
    let wanted = match b.choice {
        Backend::OneStagePush => Some(Strategy::OneShot),
        Backend::TwoStagePush => Some(Strategy::TwoShot),
        c if c.is_nccl() => Some(Strategy::Nccl),
        _ => None,
    };
    wanted
        .and_then(|w| cands.iter().find(|c| c.0 == w).copied())
        .or_else(|| cands.iter().copied().min_by(|x, y| x.1.total_cmp(&y.1)))
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
    let mut entries: Vec<Entry> = Vec::new();
    let mut notes = String::new();
    let mut strategies: Vec<Strategy> = Vec::new();
    let mut uncovered = false;
    for &tp in tps {
        let Some(g) = preferred_group(p, tp) else {
            continue;
        };
        notes.push_str(&format!(
            "#\n# TP{tp} ({} mode measurements), {hidden} x {} per token:\n",
            g.mode.id(),
            o.dtype.id()
        ));
        let mut tokens = 1u64;
        while tokens <= MAX_TOKENS {
            let bytes = tokens * row;
            let i = g.buckets.partition_point(|b| b.bytes < bytes);
            match g
                .buckets
                .get(i)
                .and_then(|b| decide(b, tp, tokens, bytes).map(|d| (b, d)))
            {
                Some((b, (s, us))) => {
                    notes.push_str(&format!(
                        "#   {tokens:>5} tokens = {:>9} bytes: {:<7} ({:.1} us measured at {} bytes; profile chose {})\n",
                        bytes,
                        s.name(),
                        us,
                        b.bytes,
                        b.choice
                    ));
                    strategies.push(s);
                    for (op, _) in FUSIONS {
                        entries.push(Entry {
                            key: key(tp, op, tokens, hidden),
                            strategy: s,
                            min_time_ms: us / 1000.0,
                        });
                    }
                }
                None => {
                    uncovered = true;
                    notes.push_str(&format!("#   {tokens:>5} tokens = {bytes:>9} bytes: beyond the profile, no entry (TensorRT-LLM's default)\n"));
                }
            }
            tokens *= 2;
        }
    }
    let uniform = match strategies.first() {
        Some(s) if !uncovered && strategies.iter().all(|x| x == s) => Some(*s),
        _ => None,
    };

    let mut y = String::new();
    y.push_str("# TensorRT-LLM LLM API options (pass with --extra_llm_api_options FILE).\n");
    y.push_str(&provenance(p, o, "#"));
    y.push_str("#\n");
    match uniform {
        Some(s) => {
            y.push_str(&format!("# One strategy holds for every token bucket below, so a fixed strategy suffices\n# (the autotuner cache is then not needed).\nallreduce_strategy: {}\n", s.name()));
        }
        None => {
            y.push_str("# The best strategy changes with size: keep AUTO, which consults the autotuner cache, and set\n");
            y.push_str(
                "#   export TLLM_AUTOTUNER_CACHE_PATH=/path/to/trtllm-autotuner-cache.json\n",
            );
            y.push_str("allreduce_strategy: AUTO\n");
        }
    }
    y.push_str("#\n# What the cache cannot express:\n");
    y.push_str("# - Pull kernels (one_stage_pull, two_stage_pull): TensorRT-LLM's one-shot and two-shot kernels write\n");
    y.push_str("#   into peers' buffers (push), so ONESHOT stands for one_stage_push and TWOSHOT for two_stage_push.\n");
    y.push_str("#   Where the profile chose a pull kernel, the fastest of NCCL / ONESHOT / TWOSHOT measured there is used.\n");
    y.push_str("# - Token counts between powers of two: TensorRT-LLM rounds down to a power of two, so each entry,\n");
    y.push_str("#   chosen from the measurement at 2^k tokens, also serves up to 2^(k+1)-1 tokens; above 8192 the\n");
    y.push_str("#   8192 entry is used. Sizes beyond the profile get no entry and fall back to TensorRT-LLM's default.\n");
    y.push_str("# - Fusions: entries are written for NONE and RESIDUAL_RMS_NORM with plain-allreduce timings; the\n");
    y.push_str("#   norm/quantization work fused into the kernel was not measured, quantizing fusions are not written.\n");
    y.push_str(
        "# - One/two-shot above the fusion workspace (16 MB at TP2, 8 MB above, smaller than newer releases'\n#   64 MiB) are written as NCCL. Keys assume 2-D [tokens, hidden] inputs and a workspace of 3*TP+2\n#   pointers (TensorRT-LLM 1.x; older releases used 3*TP+1). A log line \"Using the fallback tactic, due\n#   to cache miss\" means the keys did not match this TensorRT-LLM.\n",
    );
    y.push_str("# - Ranks: sections rank_0..rank_<TP-1>; with pipeline parallelism copy a section for every rank.\n");
    y.push_str("# - Launch mode: the autotuner has none; graph-mode measurements are used where the profile has them.\n");
    y.push_str(&notes);

    let ranks = tps.iter().copied().max().unwrap_or(0);
    let cap = p.topology.gpus.first().and_then(|g| g.compute_capability);
    let metadata = serde_json::json!({
        "lib_version": format!("artune {}", env!("CARGO_PKG_VERSION")),
        "creation_timestamp": unix_seconds(&p.created).unwrap_or(0) as f64,
        "device_name": p.topology.gpus.first().map(|g| g.name.clone()).unwrap_or_default(),
        "device_capability": cap.map(|c| serde_json::json!([c.major, c.minor])).unwrap_or(serde_json::Value::Null),
    });
    let mut j = String::new();
    j.push_str("{\n");
    j.push_str(&format!(
        "  \"metadata\": {},\n",
        serde_json::to_string(&metadata).unwrap_or_default()
    ));
    j.push_str(&format!(
        "  \"artune\": {}",
        serde_json::to_string(&provenance_json(p, o)).unwrap_or_default()
    ));
    for r in 0..ranks {
        j.push_str(&format!(",\n  \"rank_{r}\": {{"));
        for (i, e) in entries.iter().enumerate() {
            let value = serde_json::json!({
                "runner_id": 0,
                "tactic": e.strategy.tactic().to_string(),
                "min_time": e.min_time_ms,
            });
            j.push_str(&format!(
                "{}\n    {}: {}",
                if i == 0 { "" } else { "," },
                serde_json::to_string(&e.key).unwrap_or_default(),
                serde_json::to_string(&value).unwrap_or_default()
            ));
        }
        j.push_str(if entries.is_empty() { "}" } else { "\n  }" });
    }
    j.push_str("\n}\n");
    Ok(Export {
        files: vec![
            File {
                name: "extra-llm-api-options.yaml".into(),
                contents: y,
            },
            File {
                name: "trtllm-autotuner-cache.json".into(),
                contents: j,
            },
        ],
    })
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
    fn unix_seconds_inverts_rfc3339() {
        for s in [0, 951_782_400, 1_795_942_194] {
            assert_eq!(unix_seconds(&crate::profile::rfc3339(s)), Some(s));
        }
        assert_eq!(unix_seconds("yesterday"), None);
    }
}

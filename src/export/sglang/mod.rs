//! SGLang: which custom all-reduce it runs per TP size, and the limits that make it follow the
//! profile where it can.
//!
//! As read in the SGLang 0.5.23 wheel, `sglang/srt/distributed/device_communicators/` (the
//! multicast table lives in the shared engine model, python/artune/engines.json):
//! - `custom_all_reduce_v2.py`: v2 (default on,
//!   SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2) needs `can_use_custom_all_reduce_v2`, i.e. full
//!   NVLink between all GPUs of the group, even at TP2. It runs 1shot_push up to the first
//!   limit, 1shot_pull up to the second, 2shot_pull up to the third, NCCL above, and takes a
//!   message only up to its pull workspace: SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB (16 MiB by
//!   default) caps the tuned sizes. Its push workspace is 2 x world size buffers of the push
//!   limit.
//! - `config/custom_all_reduce_v2_tuning.py`: limits per architecture and world size, graph
//!   and eager, as `(one_shot_push, one_shot_pull, two_shot_pull[, mc range])`;
//!   `_make_band_default_policy` puts the multicast range (two-shot over NVLink multicast)
//!   after one-shot pull and BEFORE the two-shot pull band, so a size inside it runs
//!   multicast whatever that limit says.
//! - `custom_all_reduce.py` (v1, the fallback): world sizes 2, 4, 6, 8; two GPUs need only
//!   P2P (a PCIe pair works), more need full NVLink; messages up to 8 MiB (`inp_size <= max_size`); its kernels are
//!   vLLM's (one-stage pull on two GPUs).

mod file;
mod plugin;
#[cfg(test)]
mod tests;

pub(super) use file::export;
pub(super) use plugin::plugin_runs;
pub use plugin::{plugin_plan, plugin_setup, PluginPlan, Setup};

use super::*;
use crate::units::fmt_bytes;

const KIB: u64 = 1 << 10;
/// v2's default pull workspace (SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB), from the model.
fn v2_workspace() -> u64 {
    engines::model().sglang.v2_workspace_bytes
}
/// The largest size SGLang's v2 tables reach: no limit artune sets goes above it.
fn v2_max() -> u64 {
    engines::model().sglang.largest_range()
}
/// v1's message limit (CustomAllreduce max_size, exclusive), from the model.
fn v1_max() -> u64 {
    engines::model().sglang.v1_max_bytes
}

/// The four v2 bands in SGLang's fixed order.
const BANDS: [(Option<Backend>, &str); 4] = [
    (Some(Backend::OneStagePush), "1shot_push"),
    (Some(Backend::OneStagePull), "1shot_pull"),
    (Some(Backend::TwoStagePull), "2shot_pull"),
    (None, "NCCL"),
];

/// Cost of a band that was not measured: never chosen unless nothing was measured at all.
const UNMEASURED: f64 = 1e12;

/// Which custom all-reduce SGLang builds for a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    V2,
    V1,
    None(&'static str),
}

fn kind(t: &Topology, gpus: &[usize]) -> Kind {
    let n = gpus.len();
    if fully_nvlinked(t, gpus) && (2..=16).contains(&n) {
        Kind::V2
    } else if n == 2 && p2p_ok(t, gpus) {
        Kind::V1
    } else if n == 2 {
        Kind::None("P2P is not available between the two GPUs")
    } else {
        Kind::None("SGLang's custom all-reduce needs full NVLink for more than two GPUs")
    }
}

/// Time of a band at a bucket; NCCL as it runs with artune's plugin.
fn band_time(b: &Bucket, band: usize) -> Option<f64> {
    match BANDS[band].0 {
        Some(k) => median(b, k),
        None => plugin_time(b).map(|t| t.median_us),
    }
}

/// Whether band `s` is what the profile chose at this bucket.
fn is_choice(b: &Bucket, s: usize) -> bool {
    match BANDS[s].0 {
        Some(k) => k == b.engine_choice(),
        None => b.engine_choice().is_nccl(),
    }
}

/// Bands per bucket, non-decreasing in SGLang's order, minimising summed time; sizes above
/// the workspace can only be NCCL, and a kernel the profile excluded at a size (its memory
/// budget) cannot serve it. A band other than the profile's choice never counts as faster
/// than it unless it beats it, so ties follow the profile rather than noise.
fn assign(g: &GroupProfile, workspace: u64) -> Vec<usize> {
    let n = g.buckets.len();
    let cost = |i: usize, s: usize| {
        let b = &g.buckets[i];
        if s < 3 && b.bytes > workspace {
            return UNMEASURED;
        }
        if BANDS[s].0.is_some_and(|k| b.waived.contains_key(&k)) {
            return UNMEASURED;
        }
        let timing = match BANDS[s].0 {
            Some(k) => b.results.get(&k).copied(),
            None => plugin_time(b),
        };
        match (timing, b.results.get(&b.engine_choice())) {
            (None, _) => UNMEASURED,
            // Not significantly faster than the choice (intervals and model bands, as the
            // profile's rule judges): it costs what the choice's band costs, and a hair more,
            // so an exact tie goes to the choice and not to the earlier band.
            (Some(x), Some(c)) if !is_choice(b, s) && !crate::decide::beats(&x, c) => {
                let own = (0..4)
                    .filter(|&q| is_choice(b, q))
                    .find_map(|q| band_time(b, q));
                x.median_us.max(c.median_us).max(own.unwrap_or(0.0)) * (1.0 + 1e-9)
            }
            (Some(x), _) => x.median_us,
        }
    };
    let mut dp = vec![[0f64; 4]; n];
    let mut from = vec![[0usize; 4]; n];
    for i in 0..n {
        for s in 0..4 {
            let (prev, arg) = if i == 0 {
                (0.0, 0)
            } else {
                (0..=s)
                    .map(|q| (dp[i - 1][q], q))
                    .min_by(|a, b| a.0.total_cmp(&b.0))
                    .unwrap_or((0.0, 0))
            };
            dp[i][s] = prev + cost(i, s);
            from[i][s] = arg;
        }
    }
    let mut out = vec![3; n];
    if n == 0 {
        return out;
    }
    let mut s = (0..4)
        .min_by(|&a, &b| dp[n - 1][a].total_cmp(&dp[n - 1][b]))
        .unwrap_or(3);
    for i in (0..n).rev() {
        out[i] = s;
        s = from[i][s];
    }
    out
}

/// The three limits for a band assignment: each band's last bucket size, carried forward.
fn limits(g: &GroupProfile, bands: &[usize]) -> [u64; 3] {
    let mut lim = [0u64; 3];
    for k in 0..3 {
        let last = g
            .buckets
            .iter()
            .zip(bands)
            .filter(|(_, &s)| s <= k)
            .map(|(b, _)| b.bytes)
            .max();
        lim[k] = last
            .unwrap_or(if k == 0 { 0 } else { lim[k - 1] })
            .min(v2_max());
    }
    lim
}

/// SGLang's own multicast range for this architecture, world size and mode, from the shared
/// engine model; artune does not measure multicast.
fn multicast_range(cap: Option<ComputeCapability>, n: usize, mode: Mode) -> Option<(u64, u64)> {
    engines::model()
        .sglang
        .multicast(cap, n, mode == Mode::Graph)
}

/// The multicast range v2 runs under artune's limits: SGLang's own clipped to the two-shot
/// limit `lim2`, as the plugin (python/artune/sglang.py) sets it. SGLang tests the range before
/// that limit, so the part above it would run multicast where the profile says NCCL; a range
/// wholly above it is none, where clipping both ends would leave multicast at `lim2` itself.
fn multicast_under(
    cap: Option<ComputeCapability>,
    n: usize,
    mode: Mode,
    lim2: u64,
) -> Option<(u64, u64)> {
    multicast_range(cap, n, mode)
        .filter(|&(lo, _)| lo <= lim2)
        .map(|(lo, hi)| (lo, hi.min(lim2)))
}

/// v2's plan for one group: limits within the default workspace, and what a larger workspace
/// would let the order serve.
struct V2Plan {
    bands: Vec<usize>,
    lim: [u64; 3],
    /// The two-shot limit the order wants with the largest workspace, when above the default.
    wants: Option<u64>,
}

fn v2_plan(g: &GroupProfile) -> V2Plan {
    let bands = assign(g, v2_workspace());
    let lim = limits(g, &bands);
    let big = limits(g, &assign(g, v2_max()));
    V2Plan {
        bands,
        lim,
        wants: (big[2] > v2_workspace()).then_some(big[2]),
    }
}

/// v1 at TP2 (one-stage pull up to 8 MiB) against NCCL with artune's plugin.
fn v1_versus(g: &GroupProfile) -> Versus {
    Versus::of(
        g.buckets
            .iter()
            .filter(|b| b.bytes <= v1_max())
            .filter_map(|b| Some((median(b, Backend::OneStagePull)?, plugin_time(b)?.median_us))),
    )
}

/// What SGLang runs for `bytes` on group `g` in `mode`, with artune's export applied.
pub(super) fn runs(p: &Profile, g: &GroupProfile, bytes: u64) -> EngineRun {
    let engine = "SGLang";
    let nccl = |because: String| EngineRun {
        engine,
        runs: "NCCL".into(),
        backend: Some(Backend::Nccl),
        because,
    };
    match kind(&p.topology, &g.gpus) {
        Kind::None(why) => nccl(why.into()),
        Kind::V1 => {
            let keep = v1_versus(g).keep();
            if bytes > v1_max() || !bytes.is_multiple_of(16) {
                nccl(
                    "custom all-reduce v1 takes messages up to 8 MiB, multiples of 16 bytes".into(),
                )
            } else if !keep {
                nccl("artune's export disables the custom all-reduce at this TP size (NCCL was faster where v1 runs)".into())
            } else {
                EngineRun {
                    engine,
                    runs: "custom all-reduce v1, 1stage".into(),
                    backend: Some(Backend::OneStagePull),
                    because: "v2 needs full NVLink; v1 admits a PCIe pair and runs one-stage pull on two GPUs".into(),
                }
            }
        }
        Kind::V2 => {
            let plan = v2_plan(g);
            let band = if !bytes.is_multiple_of(16) || bytes > v2_workspace() {
                3
            } else {
                (0..3).find(|&k| bytes <= plan.lim[k]).unwrap_or(3)
            };
            let cap = capability(&p.topology, &g.gpus);
            if let Some((lo, hi)) = multicast_under(cap, g.gpus.len(), g.mode, plan.lim[2]) {
                if band == 2 && bytes >= lo && bytes <= hi {
                    return EngineRun {
                        engine,
                        runs: "custom all-reduce v2, 2shot_pull over multicast".into(),
                        backend: None,
                        because: "inside SGLang's multicast range, which artune does not measure"
                            .into(),
                    };
                }
            }
            match BANDS[band].0 {
                Some(k) => EngineRun {
                    engine,
                    runs: format!("custom all-reduce v2, {}", BANDS[band].1),
                    backend: Some(k),
                    because: "the exported v2 limits".into(),
                },
                None => nccl("above the exported v2 limits or its 16 MiB workspace".into()),
            }
        }
    }
}

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
//! - `configs/custom_all_reduce_v2.py`: limits per architecture and world size as
//!   `(one_shot_push, one_shot_pull, two_shot_pull[, mc range])`; `_pick_config` tests the
//!   multicast range (two-shot over NVLink multicast) after one-shot pull and BEFORE the
//!   two-shot pull limit, so a size inside it runs multicast whatever that limit says.
//! - `custom_all_reduce.py` (v1, the fallback): world sizes 2, 4, 6, 8; two GPUs need only
//!   P2P (a PCIe pair works), more need full NVLink; messages up to 8 MiB (`inp_size <= max_size`); its kernels are
//!   vLLM's (one-stage pull on two GPUs).

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
            if bytes > v1_max() || bytes % 16 != 0 {
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
            let band = if bytes % 16 != 0 || bytes > v2_workspace() {
                3
            } else {
                (0..3).find(|&k| bytes <= plan.lim[k]).unwrap_or(3)
            };
            if let Some((lo, hi)) =
                multicast_range(capability(&p.topology, &g.gpus), g.gpus.len(), g.mode)
            {
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

/// What artune's SGLang plugin (python/artune/sglang.py) configures for one group: the same
/// limits the export writes, applied at start-up instead of pasted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginPlan {
    /// Full NVLink: v2 with (one_shot_push, one_shot_pull, two_shot_pull) limits in bytes,
    /// within the default workspace.
    V2 { limits: [u64; 3] },
    /// A PCIe pair: v1, kept only where it beats NCCL; its buffers sized to `max_bytes`, the
    /// largest size below v1's limit the profile routes to a custom kernel (0: none).
    V1 { keep: bool, max_bytes: u64 },
    /// SGLang runs NCCL here whatever it is told.
    Nccl { because: &'static str },
}

pub fn plugin_plan(p: &Profile, g: &GroupProfile) -> PluginPlan {
    match kind(&p.topology, &g.gpus) {
        Kind::V2 => PluginPlan::V2 {
            limits: v2_plan(g).lim,
        },
        Kind::V1 => PluginPlan::V1 {
            keep: v1_versus(g).keep(),
            max_bytes: g
                .buckets
                .iter()
                .filter(|b| b.bytes <= v1_max() && b.engine_choice().is_custom())
                .map(|b| b.bytes)
                .max()
                .unwrap_or(0),
        },
        Kind::None(because) => PluginPlan::Nccl { because },
    }
}

/// What artune's SGLang plugin sets up for a TP size, from the default placement's groups
/// (the plugin knows the TP size, not the GPUs), both modes together as SGLang builds one
/// custom all-reduce for both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setup {
    /// v2 at these limits per mode (a mode the profile lacks takes the other's).
    V2 { graph: [u64; 3], eager: [u64; 3] },
    /// v1, built with `max_size` cut to `max_bytes` (rounded up to 16) where `build`, else
    /// not built at all (NCCL at every size).
    V1 { build: bool, max_bytes: u64 },
    /// No custom all-reduce built: SGLang runs NCCL here whatever it is told.
    Nccl { because: &'static str },
}

pub fn plugin_setup(p: &Profile, tp: usize) -> Option<Setup> {
    let plan = |mode| {
        p.group(Query {
            tp,
            mode,
            gpus: None,
        })
        .map(|g| plugin_plan(p, g))
    };
    match (plan(Mode::Graph), plan(Mode::Eager)) {
        (None, None) => None,
        (Some(PluginPlan::V2 { limits: g }), Some(PluginPlan::V2 { limits: e })) => {
            Some(Setup::V2 { graph: g, eager: e })
        }
        (Some(PluginPlan::V2 { limits }), None) | (None, Some(PluginPlan::V2 { limits })) => {
            Some(Setup::V2 {
                graph: limits,
                eager: limits,
            })
        }
        (a, b) => {
            let plans: Vec<PluginPlan> = [a, b].into_iter().flatten().collect();
            if let Some(because) = plans.iter().find_map(|x| match x {
                PluginPlan::Nccl { because } => Some(*because),
                _ => None,
            }) {
                return Some(Setup::Nccl { because });
            }
            let keep = plans
                .iter()
                .all(|x| matches!(x, PluginPlan::V1 { keep: true, .. }));
            let max_bytes = plans
                .iter()
                .filter_map(|x| match x {
                    PluginPlan::V1 { max_bytes, .. } => Some(*max_bytes),
                    _ => None,
                })
                .max()
                .unwrap_or(0);
            Some(Setup::V1 {
                build: keep && max_bytes > 0,
                max_bytes,
            })
        }
    }
}

/// What SGLang runs for `bytes` on group `g` with artune's SGLang plugin loaded: the plugin's
/// setup ([`plugin_setup`]) and its gates ([`follow`]) on SGLang's order. `flashinfer`: the
/// group is one SGLang tags for FlashInfer's allreduce (the fusion is on for the model), where
/// FlashInfer comes first (in eager mode too) for a message within its workspace.
pub(super) fn plugin_runs(
    p: &Profile,
    g: &GroupProfile,
    bytes: u64,
    flashinfer: bool,
) -> EngineRun {
    let engine = if flashinfer {
        "SGLang + artune's plugin, FlashInfer group"
    } else {
        "SGLang + artune's plugin"
    };
    let sel = p.selector();
    let rule = follow::Follow::new(&sel, g.tp, None);
    let run = |runs: &str, backend: Option<Backend>, because: String| EngineRun {
        engine,
        runs: runs.into(),
        backend,
        because,
    };
    let nccl = |because: String| run("NCCL", Some(Backend::Nccl), because);
    let cap = capability(&p.topology, &g.gpus);
    if flashinfer {
        let tagged = cap.is_some_and(|c| c.major == 9 || c.major == 10);
        if tagged && rule.allows(bytes, g.mode) {
            return run(
                "FlashInfer allreduce",
                None,
                format!(
                    "SGLang tags this group for FlashInfer's allreduce and tries it before its custom all-reduce; the profile does not give NCCL here, so the plugin lets it take a message of up to {} tokens (its workspace)",
                    engines::model().sglang.flashinfer_max_tokens
                ),
            );
        }
    }
    let refused = if rule.allows(bytes, g.mode) {
        ""
    } else {
        "the profile gives NCCL here; "
    };
    match plugin_setup(p, g.tp) {
        None => nccl("the profile has no such TP size, so SGLang keeps its own choice".into()),
        Some(Setup::Nccl { because }) => nccl(because.into()),
        Some(Setup::V1 { build: false, .. }) => nccl(
            "the plugin builds no custom all-reduce at this TP size (the profile gives NCCL wherever v1 runs)"
                .into(),
        ),
        Some(Setup::V1 {
            build: true,
            max_bytes,
        }) => {
            let max = max_bytes.div_ceil(16) * 16;
            if bytes > max || bytes % 16 != 0 {
                nccl(format!(
                    "above v1's max_size, which the plugin cut to {} (the profile's largest custom size), or not a multiple of 16 bytes",
                    fmt_bytes(max)
                ))
            } else if !rule.allows(bytes, g.mode) {
                nccl("the profile gives NCCL here, so the plugin turns down v1's should_custom_ar".into())
            } else {
                run(
                    "custom all-reduce v1, 1stage",
                    Some(Backend::OneStagePull),
                    "the profile gives a custom kernel here and v1 takes it (one-stage pull on two GPUs)".into(),
                )
            }
        }
        Some(Setup::V2 { graph, eager }) => {
            let lim = if g.mode == Mode::Graph { graph } else { eager };
            let band = if bytes % 16 != 0 {
                3
            } else {
                (0..3).find(|&k| bytes <= lim[k]).unwrap_or(3)
            };
            // The plugin clips SGLang's multicast range to the two-shot limit; SGLang keeps
            // multicast only where its rendezvous got a multicast pointer (NVSwitch).
            let mc = multicast_range(cap, g.gpus.len(), g.mode)
                .filter(|_| multicast(&p.topology, &g.gpus))
                .map(|(lo, hi)| (lo.min(lim[2]), hi.min(lim[2])));
            if band == 2 && mc.is_some_and(|(lo, hi)| bytes >= lo && bytes <= hi) {
                return run(
                    "custom all-reduce v2, 2shot_pull over multicast",
                    None,
                    format!("{refused}inside the plugin's two-shot limit and SGLang's multicast range (clipped to it), which artune does not measure"),
                );
            }
            match BANDS[band].0 {
                Some(k) => run(
                    &format!("custom all-reduce v2, {}", BANDS[band].1),
                    Some(k),
                    format!("{refused}v2's limits are the plugin's plan {:?} (one-shot push, one-shot pull, two-shot pull)", lim),
                ),
                None => nccl(format!(
                    "above the plugin's v2 limits {:?} (within SGLang's 16 MiB workspace)",
                    lim
                )),
            }
        }
    }
}

fn tuple(lim: [u64; 3], mc: Option<(u64, u64)>) -> String {
    let mc = mc.map_or("None".into(), |(a, b)| format!("({a}, {b})"));
    format!("({}, {}, {}, {mc})", lim[0], lim[1], lim[2])
}

pub(super) fn export(p: &Profile, o: &Options, tps: &[usize]) -> Result<Export, Error> {
    let mut table = String::new();
    let mut notes = String::new();
    let mut flags = String::new();
    let mut env = String::new();
    for &tp in tps {
        let all = placements(p, tp);
        // The table holds one entry per TP size: the first full-NVLink placement's.
        let mut tabled: Option<&[usize]> = None;
        for &first in &all {
            // SGLang puts its ranks on the visible devices in order: another placement is
            // selected by starting it with those GPUs visible.
            let (name, visible) = if all.len() == 1 {
                (format!("TP{tp}"), String::new())
            } else if default_placement(&first.gpus) {
                (
                    format!("TP{tp} on GPUs {}", gpu_list(&first.gpus)),
                    String::new(),
                )
            } else {
                (
                    format!("TP{tp} on GPUs {}", gpu_list(&first.gpus)),
                    format!(
                        " (start SGLang with CUDA_VISIBLE_DEVICES={})",
                        gpu_list(&first.gpus)
                    ),
                )
            };
            match kind(&p.topology, &first.gpus) {
                Kind::None(why) => {
                    flags.push_str(&format!("#   {name}: {why}, so SGLang runs NCCL at every size; the flag only makes it explicit:\n#     --tp-size {tp} --disable-custom-all-reduce{visible}\n"));
                }
                Kind::V1 => {
                    let g = first;
                    let v = v1_versus(g);
                    notes.push_str(&format!("# TP{tp} (GPUs {:?}, {} mode): no full NVLink, so v2 is refused; v1 runs one-stage pull up to 8 MiB:\n", g.gpus, g.mode.id()));
                    for b in &g.buckets {
                        let r = runs(p, g, b.bytes);
                        let t = match r.backend {
                            Some(Backend::Nccl) => plugin_time(b).map(|t| t.median_us),
                            Some(k) => median(b, k),
                            None => None,
                        };
                        let chosen = median(b, b.choice);
                        let cmp = match (t, chosen) {
                            (Some(t), Some(c))
                                if r.backend != Some(b.choice)
                                    && !(r.backend == Some(Backend::Nccl)
                                        && b.choice.is_nccl()) =>
                            {
                                format!("; profile chose {} ({c:.1} us), {}", b.choice, pct(t, c))
                            }
                            _ => String::new(),
                        };
                        notes.push_str(&format!(
                            "#   {:>8}: {:<30} {}{cmp}\n",
                            fmt_bytes(b.bytes),
                            r.runs,
                            t.map_or("not measured".into(), |t| format!("{t:.1} us"))
                        ));
                    }
                    flags.push_str(&if v.keep() {
                    format!("#   {name}: v1 is {} up to 8 MiB: keep it: --tp-size {tp}{visible}\n", v.describe())
                } else {
                    format!("#   {name}: v1 is {} up to 8 MiB: --tp-size {tp} --disable-custom-all-reduce{visible}\n", v.describe())
                });
                }
                Kind::V2 => {
                    let mut entry = Vec::new();
                    for mode in [Mode::Graph, Mode::Eager] {
                        let Some(g) = same_gpus(p, first, mode) else {
                            notes.push_str(&format!(
                                "# {name} {}: not in the profile; SGLang keeps its own limits.\n",
                                mode.id()
                            ));
                            continue;
                        };
                        let plan = v2_plan(g);
                        // _pick_config tests the multicast range before the two-shot limit:
                        // clipped to that limit, NCCL sizes stay NCCL (as the plugin does).
                        let mc = multicast_range(capability(&p.topology, &g.gpus), tp, mode)
                            .map(|(lo, hi)| (lo.min(plan.lim[2]), hi.min(plan.lim[2])));
                        entry.push(format!("\"{}\": {}", mode.id(), tuple(plan.lim, mc)));
                        let (mut ordered, mut chosen, mut worst) = (0.0, 0.0, (0.0f64, 0u64));
                        notes.push_str(&format!("# TP{tp} {} (GPUs {:?}):\n", mode.id(), g.gpus));
                        for (b, &s) in g.buckets.iter().zip(&plan.bands) {
                            let t = band_time(b, s);
                            let c = median(b, b.choice);
                            if let (Some(t), Some(c)) = (t, c) {
                                ordered += t;
                                chosen += c;
                                if t / c - 1.0 > worst.0 {
                                    worst = (t / c - 1.0, b.bytes);
                                }
                            }
                            let same = is_choice(b, s);
                            let cmp = match (t, c) {
                                (Some(t), Some(c)) if !same => {
                                    format!(
                                        "; profile chose {} ({c:.1} us), {}",
                                        b.choice,
                                        pct(t, c)
                                    )
                                }
                                _ => String::new(),
                            };
                            notes.push_str(&format!(
                                "#   {:>8}: {:<10} {}{cmp}\n",
                                fmt_bytes(b.bytes),
                                BANDS[s].1,
                                t.map_or("not measured".into(), |t| format!("{t:.1} us"))
                            ));
                        }
                        let worst = if worst.0 > 0.0 {
                            format!("worst {:+.1}% at {}", worst.0 * 100.0, fmt_bytes(worst.1))
                        } else {
                            "slower at no size".into()
                        };
                        notes.push_str(&format!(
                        "#   SGLang's order (push, pull, two-shot, NCCL) costs {:+.1}% summed against the profile's bands ({ordered:.1} vs {chosen:.1} us), {worst}.\n",
                        (ordered / chosen - 1.0) * 100.0,
                    ));
                        if let Some((lo, hi)) = mc.filter(|&(_, hi)| hi > 0) {
                            notes.push_str(&format!("#   Where its two-shot band falls between {} and {}, SGLang runs it over NVLink multicast, which artune did not measure.\n", fmt_bytes(lo), fmt_bytes(hi)));
                        }
                        let push = plan.lim[0].min(v2_workspace());
                        notes.push_str(&format!(
                        "#   v2 workspace per GPU at these limits: pull {} + push 2 x {tp} x {} = {}.\n",
                        fmt_bytes(v2_workspace()),
                        fmt_bytes(push),
                        fmt_bytes(v2_workspace() + 2 * tp as u64 * push)
                    ));
                        if let Some(want) = plan.wants {
                            env.push_str(&format!(
                            "#   TP{tp} {}: the order would run 2shot_pull up to {}, above the 16 MiB workspace. To allow it,\n#     export SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB={}  (costs {} more pull workspace per GPU)\n#   and raise the third limit to {want}.\n",
                            mode.id(),
                            fmt_bytes(want),
                            want.div_ceil(KIB),
                            fmt_bytes(want - v2_workspace())
                        ));
                        }
                    }
                    match tabled {
                    _ if entry.is_empty() => {}
                    None => {
                        table.push_str(&format!("    {tp}: {{{}}},\n", entry.join(", ")));
                        tabled = Some(&first.gpus);
                    }
                    Some(held) => notes.push_str(&format!(
                        "#   NOT in the table, which holds one entry per TP size (GPUs {}'s); on these GPUs SGLang\n#   would need {{{}}}.\n",
                        gpu_list(held),
                        entry.join(", ")
                    )),
                }
                    let which = match tabled {
                        Some(held) if held != first.gpus.as_slice() => format!(
                            "the table's limits (GPUs {}'s; this placement's own are in the notes)",
                            gpu_list(held)
                        ),
                        _ => "the limits above".into(),
                    };
                    flags.push_str(&format!("#   {name}: full NVLink: custom all-reduce v2 with {which}: --tp-size {tp}{visible}\n"));
                }
            }
        }
    }

    let mut s = String::new();
    s.push_str("# SGLang custom all-reduce: what it runs per TP size, and v2 limits for full-NVLink groups.\n");
    s.push_str(&format!(
        "# Read against SGLang {} (custom_all_reduce_v2.py, configs/custom_all_reduce_v2.py).\n",
        engines::model().sglang.read_against
    ));
    s.push_str(&provenance(p, o, "#"));
    s.push_str("#\n");
    if table.is_empty() {
        s.push_str("# No TP size here has full NVLink, so SGLang's v2 (which requires it, even at TP2) never runs:\n# no v2 limits are written.\n");
    } else {
        s.push_str("# v2 limits (one_shot_push, one_shot_pull, two_shot_pull, multicast range or None) per TP size, for\n");
        s.push_str("# the tuning(...) entries of config/custom_all_reduce_v2_tuning.py for this architecture. The\n");
        s.push_str("# multicast range is SGLang's own (artune does not measure multicast), clipped to the two-shot limit:\n");
        s.push_str("# SGLang tests it before that limit, so unclipped it would run multicast where the profile says NCCL.\n");
        s.push_str("ARTUNE_CUSTOM_ALL_REDUCE_V2 = {\n");
        s.push_str(&table);
        s.push_str("}\n");
    }
    s.push_str("#\n# Server flags:\n");
    s.push_str(&flags);
    if !env.is_empty() {
        s.push_str("#\n# Larger v2 workspace:\n");
        s.push_str(&env);
    }
    s.push_str("#\n# What SGLang's knobs cannot express:\n");
    s.push_str("# - A runtime setting for the limits: SGLang reads them from its source, per GPU architecture.\n");
    if tps.iter().any(|&tp| placements(p, tp).len() > 1) {
        s.push_str("# - Placements: the table holds one entry per TP size, not per GPU set; where a TP size has several\n");
        s.push_str("#   full-NVLink placements it holds the first, and the notes give the others' limits. A placement\n");
        s.push_str("#   other than GPUs 0..TP is started with those GPUs visible (CUDA_VISIBLE_DEVICES).\n");
    }
    s.push_str("# - two_stage_push: no SGLang kernel matches it.\n");
    s.push_str("# - Choices out of SGLang's order: v2 bands go push, pull, two-shot, NCCL by size; where the profile\n");
    s.push_str("#   alternates, the limits minimise summed time and each size below says what that costs.\n");
    s.push_str(
        "# - v1 (PCIe pairs): one-stage pull up to 8 MiB or nothing; its size limit is fixed.\n",
    );
    s.push_str("# - Sizes above the largest measured size go to NCCL.\n");
    s.push_str("# - NCCL's algorithm and protocol: load artune's NCCL tuner plugin (artune export --engine nccl).\n");
    s.push_str("#\n");
    s.push_str(&notes);
    Ok(Export {
        files: vec![File {
            name: "sglang_custom_all_reduce.py".into(),
            contents: s,
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_never_go_backwards_and_stay_in_the_workspace() {
        let p = sample::profile_with("nvswitch-8x", &[4], &[1 << 10, 1 << 20, 32 << 20]);
        for g in &p.groups {
            let bands = assign(g, v2_workspace());
            assert!(bands.windows(2).all(|w| w[0] <= w[1]), "{bands:?}");
            let lim = limits(g, &bands);
            assert!(lim[0] <= lim[1] && lim[1] <= lim[2], "{lim:?}");
            assert!(lim[2] <= v2_workspace(), "{lim:?}");
            assert_eq!(bands[2], 3, "32 MiB is above the workspace: NCCL");
        }
    }

    /// A simulated profile that keeps NCCL where a kernel is modelled faster but within the
    /// model's error: v2 takes none of those sizes, as the rule of docs/ENGINE-PATHS.md says
    /// (an exact tie once went to the earlier band).
    #[test]
    fn a_kernel_faster_only_within_the_model_band_gets_no_v2_size() {
        let mut p = sample::profile_with("nvswitch-8x", &[4], &[1 << 10, 64 << 10, 1 << 20]);
        let g = &mut p.groups[0];
        for b in &mut g.buckets {
            // The NCCL variant the plugin runs, so that the kernel ties the choice's band.
            b.choice = plugin_nccl(b);
            for (k, t) in b.results.iter_mut() {
                let family = if k.is_custom() {
                    crate::profile::ModelFamily::Custom
                } else {
                    crate::profile::ModelFamily::Nccl
                };
                t.model = Some(crate::profile::ModelBand {
                    low: 0.4,
                    high: 2.5,
                    assumed: false,
                    family: Some(family),
                });
            }
            let nccl = b.results[&b.choice].median_us;
            let pull = b.results.get_mut(&Backend::OneStagePull).unwrap();
            (pull.median_us, pull.ci_low_us, pull.ci_high_us) =
                (nccl / 1.5, nccl / 1.52, nccl / 1.48);
        }
        let plan = v2_plan(&p.groups[0]);
        assert_eq!(plan.lim, [0, 0, 0], "{:?}", plan.bands);
        // Beyond the band, 1shot_pull takes the sizes again.
        for b in &mut p.groups[0].buckets {
            b.choice = Backend::OneStagePull;
            let nccl = b.results[&Backend::Nccl].median_us;
            let pull = b.results.get_mut(&Backend::OneStagePull).unwrap();
            (pull.median_us, pull.ci_low_us, pull.ci_high_us) =
                (nccl / 10.0, nccl / 10.2, nccl / 9.8);
        }
        assert_eq!(v2_plan(&p.groups[0]).lim, [0, 1 << 20, 1 << 20]);
    }

    #[test]
    fn a_two_shot_band_past_the_workspace_is_clipped_and_priced() {
        let mut p = sample::profile_with("nvswitch-8x", &[4], &[1 << 10, 1 << 20, 32 << 20]);
        let g = &mut p.groups[0];
        // Make two-shot pull win clearly at 32 MiB.
        let nccl = g.buckets[2].results[&Backend::Nccl].median_us;
        let t = g.buckets[2]
            .results
            .get_mut(&Backend::TwoStagePull)
            .unwrap();
        (t.median_us, t.ci_low_us, t.ci_high_us) = (nccl / 2.0, nccl / 2.1, nccl / 1.9);
        let plan = v2_plan(&p.groups[0]);
        assert!(plan.lim[2] <= v2_workspace(), "{:?}", plan.lim);
        assert_eq!(plan.wants, Some(32 << 20));
        let o = Options {
            engine: Engine::Sglang,
            tp: None,
            hidden: None,
            dtype: Dtype::Bf16,
            source: "s.json".into(),
            world_size: None,
            allow_simulated: false,
            plugin: "libartune.so".into(),
        };
        let text = export(&p, &o, &[4]).unwrap().files.remove(0).contents;
        assert!(
            text.contains("SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB=32768"),
            "{text}"
        );
        assert!(
            text.contains("costs 16M more pull workspace per GPU"),
            "{text}"
        );
        // Excluded at 32 MiB by a memory budget, two-shot pull is neither a band there nor a
        // reason to grow the workspace.
        p.groups[0].buckets[2].waived.insert(
            Backend::TwoStagePull,
            "its buffers ... above the memory budget".into(),
        );
        let plan = v2_plan(&p.groups[0]);
        assert_eq!(plan.wants, None);
        let text = export(&p, &o, &[4]).unwrap().files.remove(0).contents;
        assert!(
            !text.contains("SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB"),
            "{text}"
        );
    }
}

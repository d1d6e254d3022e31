//! What artune's SGLang plugin sets up per TP size, and what SGLang runs with it: the
//! plugin (python/artune/sglang.py) reads the setup through the extension module and `artune
//! why` reports from the same code.

use super::*;

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
/// (the plugin knows the TP size, not the GPUs). v2 has limits per mode; v1 is one object
/// for both modes, so its build and `max_size` follow the profile only where it has both (a
/// mode it lacks has no answer, and SGLang's own v1 stands for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setup {
    /// v2 at these limits per mode; None: the profile lacks the mode, SGLang's own limits.
    V2 {
        graph: Option<[u64; 3]>,
        eager: Option<[u64; 3]>,
    },
    /// v1, built with `max_size` cut to `max_bytes` (rounded up to 16; None: SGLang's own)
    /// where `build`, else not built at all (NCCL at every size).
    V1 { build: bool, max_bytes: Option<u64> },
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
    let plans = [plan(Mode::Graph), plan(Mode::Eager)];
    if plans.iter().all(Option::is_none) {
        return None;
    }
    if let Some(because) = plans.iter().flatten().find_map(|x| match x {
        PluginPlan::Nccl { because } => Some(*because),
        _ => None,
    }) {
        return Some(Setup::Nccl { because });
    }
    let v2 = |x: &Option<PluginPlan>| match x {
        Some(PluginPlan::V2 { limits }) => Some(*limits),
        _ => None,
    };
    if plans.iter().any(|x| v2(x).is_some()) {
        return Some(Setup::V2 {
            graph: v2(&plans[0]),
            eager: v2(&plans[1]),
        });
    }
    match plans {
        [Some(PluginPlan::V1 {
            keep: kg,
            max_bytes: mg,
        }), Some(PluginPlan::V1 {
            keep: ke,
            max_bytes: me,
        })] => {
            let max_bytes = mg.max(me);
            Some(Setup::V1 {
                build: kg && ke && max_bytes > 0,
                max_bytes: Some(max_bytes),
            })
        }
        _ => Some(Setup::V1 {
            build: true,
            max_bytes: None,
        }),
    }
}

/// What SGLang runs for `bytes` on group `g` with artune's SGLang plugin loaded: artune's own
/// kernels where the plugin routes the size to them, else the plugin's setup
/// ([`plugin_setup`]) and its gates ([`follow`]) on SGLang's order. `flashinfer`: the
/// group is one SGLang tags for FlashInfer's allreduce (the fusion is on for the model), where
/// FlashInfer comes first (in eager mode too) for a message within its workspace.
pub(in crate::export) fn plugin_runs(
    p: &Profile,
    g: &GroupProfile,
    bytes: u64,
    flashinfer: bool,
) -> EngineRun {
    let run = paths_under_plugin(p, g, bytes, flashinfer);
    with_own_kernels(p, g, bytes, "SGLang", run)
}

/// What SGLang's own paths run for `bytes` under the plugin, where artune's kernels do not.
fn paths_under_plugin(p: &Profile, g: &GroupProfile, bytes: u64, flashinfer: bool) -> EngineRun {
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
            let max = max_bytes.map_or(v1_max(), |m| m.div_ceil(16) * 16);
            if bytes > max || !bytes.is_multiple_of(16) {
                nccl(match max_bytes {
                    Some(_) => format!(
                        "above v1's max_size, which the plugin cut to {} (the profile's largest custom size), or not a multiple of 16 bytes",
                        fmt_bytes(max)
                    ),
                    None => format!(
                        "above v1's max_size, SGLang's own {} (the profile lacks a mode, so the plugin leaves it), or not a multiple of 16 bytes",
                        fmt_bytes(max)
                    ),
                })
            } else if !rule.allows(bytes, g.mode) {
                nccl(format!("{}, so the plugin turns down v1's should_custom_ar", nccl_here(p, g)))
            } else {
                run(
                    "custom all-reduce v1, 1stage",
                    Some(Backend::OneStagePull),
                    "the profile gives a custom kernel here and v1 takes it (one-stage pull on two GPUs)".into(),
                )
            }
        }
        Some(Setup::V2 { .. }) if !rule.allows(bytes, g.mode) => nccl(
            format!("{}, so the plugin turns down v2's should_custom_ar", nccl_here(p, g)),
        ),
        Some(Setup::V2 { graph, eager }) => {
            let Some(lim) = (if g.mode == Mode::Graph { graph } else { eager }) else {
                return run(
                    "custom all-reduce v2 at SGLang's own limits",
                    None,
                    format!("the profile has no {} group at the default placement of TP{}, so the plugin leaves SGLang's limits of that mode", g.mode.id(), g.tp),
                );
            };
            let band = if !bytes.is_multiple_of(16) {
                3
            } else {
                (0..3).find(|&k| bytes <= lim[k]).unwrap_or(3)
            };
            // The plugin clips SGLang's multicast range to the two-shot limit; SGLang keeps
            // multicast only where its rendezvous got a multicast pointer (NVSwitch).
            let mc = multicast_under(cap, g.gpus.len(), g.mode, lim[2])
                .filter(|_| multicast(&p.topology, &g.gpus));
            if band == 2 && mc.is_some_and(|(lo, hi)| bytes >= lo && bytes <= hi) {
                return run(
                    "custom all-reduce v2, 2shot_pull over multicast",
                    None,
                    "inside the plugin's two-shot limit and SGLang's multicast range (clipped to it), which artune does not measure".into(),
                );
            }
            match BANDS[band].0 {
                Some(k) => run(
                    &format!("custom all-reduce v2, {}", BANDS[band].1),
                    Some(k),
                    format!("v2's limits are the plugin's plan {:?} (one-shot push, one-shot pull, two-shot pull)", lim),
                ),
                None => nccl(format!(
                    "above the plugin's v2 limits {:?} (within SGLang's 16 MiB workspace)",
                    lim
                )),
            }
        }
    }
}

//! The file `artune export --engine sglang` writes: v2 limits per TP size for SGLang's
//! tuning table, the server flags, and per size what SGLang's order costs against the
//! profile.

use super::*;

fn tuple(lim: [u64; 3], mc: Option<(u64, u64)>) -> String {
    let mc = mc.map_or("None".into(), |(a, b)| format!("({a}, {b})"));
    format!("({}, {}, {}, {mc})", lim[0], lim[1], lim[2])
}

pub(in crate::export) fn export(p: &Profile, o: &Options, tps: &[usize]) -> Result<Export, Error> {
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
                        let mc = multicast_under(
                            capability(&p.topology, &g.gpus),
                            tp,
                            mode,
                            plan.lim[2],
                        );
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
                            "#   TP{tp} {}: the order would run 2shot_pull up to {}, above the 16 MiB workspace. To allow it\n#   without artune's plugin (which keeps the workspace: ENGINE-PATHS.md),\n#     export SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB={}  (costs {} more pull workspace per GPU)\n#   and raise the third limit to {want}.\n",
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
        "# Read against SGLang {} (custom_all_reduce_v2.py, config/custom_all_reduce_v2_tuning.py).\n",
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

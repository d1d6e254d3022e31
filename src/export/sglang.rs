//! SGLang: custom all-reduce on/off and byte limits in the shape of its custom all-reduce v2
//! table (sgl-project/sglang python/sglang/srt/distributed/device_communicators/configs/
//! custom_all_reduce_v2.py, `Heuristic`): per world size, for CUDA-graph and eager dispatch,
//! `(one_shot_push, one_shot_pull, two_shot_pull)` byte limits. SGLang runs 1shot_push for
//! nbytes <= one_shot_push, else 1shot_pull for nbytes <= one_shot_pull, else 2shot_pull for
//! nbytes <= two_shot_pull, else NCCL; limits must not decrease.

use super::*;

/// The four bands in SGLang's fixed order.
const BANDS: [(Option<Backend>, &str); 4] = [
    (Some(Backend::OneStagePush), "1shot_push"),
    (Some(Backend::OneStagePull), "1shot_pull"),
    (Some(Backend::TwoStagePull), "2shot_pull"),
    (None, "NCCL"),
];

/// Cost of a band that was not measured: never chosen unless nothing was measured at all.
const UNMEASURED: f64 = 1e12;

fn band_time(b: &Bucket, band: usize) -> Option<f64> {
    match BANDS[band].0 {
        Some(k) => b.results.get(&k).map(|t| t.median_us),
        None => nccl_time(b).map(|t| t.median_us),
    }
}

/// Bands per bucket, non-decreasing in SGLang's order, minimising the summed slowdown relative
/// to the profile's choice (dynamic programming over buckets × 4 bands).
fn assign(g: &GroupProfile) -> Vec<usize> {
    let n = g.buckets.len();
    let cost = |i: usize, s: usize| {
        let b = &g.buckets[i];
        let reference = b
            .results
            .get(&b.choice)
            .map_or(1.0, |t| t.median_us.max(1e-9));
        band_time(b, s).map_or(UNMEASURED, |t| t / reference)
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
    let mut out = vec![0; n];
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
        lim[k] = last.unwrap_or(if k == 0 { 0 } else { lim[k - 1] });
    }
    lim
}

pub(super) fn export(p: &Profile, o: &Options, tps: &[usize]) -> Result<Export, Error> {
    let mut table = String::from("ARTUNE_CUSTOM_ALL_REDUCE_V2 = {\n");
    let mut notes = String::new();
    let mut flags = String::new();
    for &tp in tps {
        let mut entry = Vec::new();
        let mut any_custom = false;
        for mode in [Mode::Graph, Mode::Eager] {
            let Some(g) = p.group(Query {
                tp,
                mode,
                gpus: None,
            }) else {
                notes.push_str(&format!(
                    "# TP{tp} {}: not in the profile; SGLang keeps its own limits.\n",
                    mode.id()
                ));
                continue;
            };
            let bands = assign(g);
            let lim = limits(g, &bands);
            any_custom |= bands.iter().any(|&s| s < 3);
            entry.push(format!(
                "\"{}\": ({}, {}, {})",
                mode.id(),
                lim[0],
                lim[1],
                lim[2]
            ));
            notes.push_str(&format!("# TP{tp} {} (GPUs {:?}):\n", mode.id(), g.gpus));
            for (b, &s) in g.buckets.iter().zip(&bands) {
                let t = band_time(b, s);
                let chosen = b.results.get(&b.choice).map(|t| t.median_us);
                let cmp = match (t, chosen) {
                    (Some(t), Some(c))
                        if BANDS[s].0 != Some(b.choice)
                            && !(BANDS[s].0.is_none() && b.choice.is_nccl()) =>
                    {
                        format!(
                            "; profile chose {} ({c:.1} us), {:+.0}%",
                            b.choice,
                            (t / c - 1.0) * 100.0
                        )
                    }
                    _ => String::new(),
                };
                notes.push_str(&format!(
                    "#   {:>10} bytes: {:<10} {}{cmp}\n",
                    b.bytes,
                    BANDS[s].1,
                    t.map_or("not measured".into(), |t| format!("{t:.1} us"))
                ));
            }
        }
        if !entry.is_empty() {
            table.push_str(&format!("    {tp}: {{{}}},\n", entry.join(", ")));
        }
        flags.push_str(&if any_custom {
            format!("#   TP{tp}: keep the custom all-reduce (default): --tp-size {tp}\n")
        } else {
            format!("#   TP{tp}: NCCL wins at every size: --tp-size {tp} --disable-custom-all-reduce (frees its buffers)\n")
        });
    }
    table.push_str("}\n");

    let mut s = String::new();
    s.push_str("# SGLang custom all-reduce v2 byte limits: (one_shot_push, one_shot_pull, two_shot_pull) per TP size\n");
    s.push_str("# for CUDA-graph and eager dispatch. SGLang runs 1shot_push up to the first limit, 1shot_pull up to\n");
    s.push_str("# the second, 2shot_pull up to the third, NCCL above (configs/custom_all_reduce_v2.py, Heuristic).\n");
    s.push_str(&provenance(p, o, "#"));
    s.push_str("#\n");
    s.push_str(&table);
    s.push_str("#\n# Server flags:\n");
    s.push_str(&flags);
    s.push_str("#\n# What SGLang's knobs cannot express:\n");
    s.push_str("# - A runtime setting: SGLang reads this table from its source, per GPU architecture, not per machine.\n");
    s.push_str("#   Paste the limits into graph_map / eager_map (configs/custom_all_reduce_v2.py) or the tuning(...)\n");
    s.push_str("#   entries (config/custom_all_reduce_v2_tuning.py, newer releases) for your architecture.\n");
    s.push_str("# - two_stage_push: no SGLang kernel matches it; its 2shot_lamport and multicast bands are left as they are.\n");
    s.push_str("# - Choices out of SGLang's order: bands go push, pull, two-shot, NCCL by size. Where the profile\n");
    s.push_str("#   alternates, the limits minimise the summed slowdown against its choice; each size is listed below.\n");
    s.push_str("# - Sizes above the largest measured size go to NCCL.\n");
    s.push_str("# - The push limit also sizes SGLang's push workspace (device memory per GPU).\n");
    s.push_str("# - NCCL's algorithm and protocol: use artune's NCCL tuner plugin (artune export --engine env).\n");
    s.push_str("#\n");
    s.push_str(&notes);
    Ok(Export {
        files: vec![File {
            name: "sglang_custom_all_reduce_v2.py".into(),
            contents: s,
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_never_go_backwards_and_follow_clear_winners() {
        let p = sample::profile();
        for g in &p.groups {
            let bands = assign(g);
            assert!(bands.windows(2).all(|w| w[0] <= w[1]), "{bands:?}");
            let lim = limits(g, &bands);
            assert!(lim[0] <= lim[1] && lim[1] <= lim[2], "{lim:?}");
        }
        // TP4 has no one-stage push (waived): the push limit must be 0.
        let g = p
            .group(Query {
                tp: 4,
                mode: Mode::Graph,
                gpus: None,
            })
            .unwrap();
        assert_eq!(limits(g, &assign(g))[0], 0);
    }
}

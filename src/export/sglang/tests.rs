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
            let family = crate::profile::ModelFamily::of(*k);
            t.model = Some(crate::profile::ModelBand {
                low: 0.4,
                high: 2.5,
                assumed: false,
                family: Some(family),
            });
        }
        let nccl = b.results[&b.choice].median_us;
        let pull = b.results.get_mut(&Backend::OneStagePull).unwrap();
        (pull.median_us, pull.ci_low_us, pull.ci_high_us) = (nccl / 1.5, nccl / 1.52, nccl / 1.48);
    }
    let plan = v2_plan(&p.groups[0]);
    assert_eq!(plan.lim, [0, 0, 0], "{:?}", plan.bands);
    // Beyond the band, 1shot_pull takes the sizes again.
    for b in &mut p.groups[0].buckets {
        b.choice = Backend::OneStagePull;
        let nccl = b.results[&Backend::Nccl].median_us;
        let pull = b.results.get_mut(&Backend::OneStagePull).unwrap();
        (pull.median_us, pull.ci_low_us, pull.ci_high_us) = (nccl / 10.0, nccl / 10.2, nccl / 9.8);
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

/// v2's limits are bands: a profile that goes custom, NCCL, custom is covered by limits
/// that take the NCCL size between, and the plugin's per-call gate still gives it to NCCL.
#[test]
fn the_plugin_runs_nccl_inside_v2s_limits_where_the_profile_says_nccl() {
    let mut p = sample::profile_with("nvswitch-8x", &[4], &[4 << 10, 64 << 10, 1 << 20]);
    for g in &mut p.groups {
        g.buckets[1].choice = plugin_nccl(&g.buckets[1]);
    }
    for g in &p.groups {
        let Some(Setup::V2 { graph, eager }) = plugin_setup(&p, 4) else {
            panic!("full NVLink at TP4 runs v2");
        };
        let lim = if g.mode == Mode::Graph { graph } else { eager }.unwrap();
        assert!(lim[2] >= 64 << 10, "the limits cover 64K: {lim:?}");
        let run = |n| plugin_runs(&p, g, n, false).backend;
        assert_eq!(run(64 << 10), Some(Backend::Nccl), "{:?}", g.mode);
        assert_ne!(run(4 << 10), Some(Backend::Nccl));
    }
}

/// On an H200 at TP8, SGLang's own graph-mode multicast range starts at 512K. A profile whose
/// two-shot band ends at 64K gives no multicast at all: not the file's entry, not what `why`
/// says SGLang runs with the export or the plugin (clipping both ends once left multicast at
/// 64K itself, where the profile chose a two-shot kernel).
#[test]
fn a_multicast_range_above_the_two_shot_band_is_none() {
    let mut p = sample::profile_with("nvswitch-8x", &[8], &[4 << 10, 16 << 10, 64 << 10, 1 << 20]);
    p.groups.retain(|g| g.mode == Mode::Graph);
    let g = &mut p.groups[0];
    let (own, _) = multicast_range(capability(&p.topology, &g.gpus), 8, Mode::Graph)
        .expect("SGLang runs multicast at TP8 on Hopper in graph mode");
    assert!(
        own > 64 << 10,
        "the premise: SGLang's range starts above 64K ({own})"
    );
    for (b, k) in g.buckets.iter_mut().zip([
        Backend::OneStagePush,
        Backend::OneStagePull,
        Backend::TwoStagePull,
        Backend::Nccl,
    ]) {
        b.choice = k;
        for (x, t) in b.results.iter_mut() {
            let us = if *x == k { 5.0 } else { 50.0 };
            (t.median_us, t.ci_low_us, t.ci_high_us) = (us, us * 0.99, us * 1.01);
        }
    }
    let g = &p.groups[0];
    assert_eq!(v2_plan(g).lim[2], 64 << 10, "the two-shot band ends at 64K");
    let o = crate::export::Options {
        engine: crate::export::Engine::Sglang,
        tp: None,
        hidden: None,
        dtype: crate::allreduce::Dtype::Bf16,
        source: "p.json".into(),
        world_size: None,
        allow_simulated: true,
        plugin: "libartune.so".into(),
    };
    let text = export(&p, &o, &[8]).unwrap().files[0].contents.clone();
    let entry = text.lines().find(|l| l.starts_with("    8: ")).unwrap();
    assert!(entry.ends_with(", 65536, None)},"), "{entry}");
    for run in [runs(&p, g, 64 << 10), plugin_runs(&p, g, 64 << 10, false)] {
        assert_eq!(run.backend, Some(Backend::TwoStagePull), "{}", run.runs);
    }
}

/// A graph-only profile answers nothing about eager calls: v1 (one object for both modes) is
/// built at SGLang's own max_size, and v2's eager limits stay SGLang's.
#[test]
fn a_mode_the_profile_lacks_keeps_sglangs_own_setup() {
    let mut v1 = sample::profile_with("pcie-2x", &[2], &[4 << 10, 64 << 10, 1 << 20]);
    for g in &mut v1.groups {
        for b in &mut g.buckets {
            b.choice = plugin_nccl(b);
        }
    }
    let both = plugin_setup(&v1, 2);
    assert!(
        matches!(both, Some(Setup::V1 { build: false, .. })),
        "{both:?}"
    );
    v1.groups.retain(|g| g.mode == Mode::Graph);
    let graph_only = plugin_setup(&v1, 2);
    assert_eq!(
        graph_only,
        Some(Setup::V1 {
            build: true,
            max_bytes: None
        })
    );
    // Graph calls still run NCCL, per call.
    let run = plugin_runs(&v1, &v1.groups[0], 64 << 10, false);
    assert_eq!(run.backend, Some(Backend::Nccl), "{run:?}");

    let mut v2 = sample::profile_with("nvswitch-8x", &[4], &[4 << 10, 64 << 10, 1 << 20]);
    v2.groups.retain(|g| g.mode == Mode::Graph);
    let Some(Setup::V2 { graph, eager }) = plugin_setup(&v2, 4) else {
        panic!("full NVLink at TP4 runs v2");
    };
    assert!(graph.is_some());
    assert_eq!(eager, None);
}

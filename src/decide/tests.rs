use super::*;
use crate::topology::presets;

fn t(median: f64, half: f64) -> Timing {
    Timing {
        median_us: median,
        ci_low_us: median - half,
        ci_high_us: median + half,
        samples: 20,
        outliers: 0,
    }
}

#[test]
fn significant_winner_takes_it() {
    let r: BTreeMap<_, _> = [
        (Backend::Nccl, t(20.0, 0.2)),
        (Backend::OneStagePull, t(8.0, 0.1)),
    ]
    .into();
    assert_eq!(
        choose(&r, |b| extra_memory(b, 8, 4096)),
        Some(Backend::OneStagePull)
    );
}

#[test]
fn tie_goes_to_less_extra_memory() {
    // one_stage_pull is nominally faster but its CI overlaps NCCL's: NCCL costs no extra memory.
    let r: BTreeMap<_, _> = [
        (Backend::Nccl, t(10.0, 0.3)),
        (Backend::OneStagePull, t(9.8, 0.3)),
    ]
    .into();
    assert_eq!(
        choose(&r, |b| extra_memory(b, 8, 4096)),
        Some(Backend::Nccl)
    );
    // Between two custom kernels, the cheaper one (pull needs 1 buffer, push N-1) wins a tie.
    let r: BTreeMap<_, _> = [
        (Backend::OneStagePush, t(9.8, 0.3)),
        (Backend::OneStagePull, t(10.0, 0.3)),
    ]
    .into();
    assert_eq!(
        choose(&r, |b| extra_memory(b, 8, 4096)),
        Some(Backend::OneStagePull)
    );
}

#[test]
fn small_gaps_are_ties_even_with_tight_cis() {
    // 2% apart with tiny CIs: statistically but not practically significant.
    let r: BTreeMap<_, _> = [
        (Backend::Nccl, t(10.0, 0.01)),
        (Backend::TwoStagePull, t(9.8, 0.01)),
    ]
    .into();
    assert_eq!(
        choose(&r, |b| extra_memory(b, 8, 1 << 20)),
        Some(Backend::Nccl)
    );
    // 10% apart: the custom kernel earns its memory.
    let r: BTreeMap<_, _> = [
        (Backend::Nccl, t(10.0, 0.01)),
        (Backend::TwoStagePull, t(9.0, 0.01)),
    ]
    .into();
    assert_eq!(
        choose(&r, |b| extra_memory(b, 8, 1 << 20)),
        Some(Backend::TwoStagePull)
    );
}

#[test]
fn nccl_own_choice_preferred_among_nccl_ties() {
    let r: BTreeMap<_, _> = [
        (Backend::NcclRingLl, t(9.9, 0.3)),
        (Backend::Nccl, t(10.0, 0.3)),
    ]
    .into();
    assert_eq!(choose(&r, |_| 0), Some(Backend::Nccl));
}

#[test]
fn refinement_bisects_where_winner_changes() {
    let cells: BTreeMap<u64, BTreeMap<Backend, Timing>> = [
        (
            32768,
            [
                (Backend::Nccl, t(20.0, 0.1)),
                (Backend::OneStagePull, t(10.0, 0.1)),
            ]
            .into(),
        ),
        (
            65536,
            [
                (Backend::Nccl, t(22.0, 0.1)),
                (Backend::OneStagePull, t(15.0, 0.1)),
            ]
            .into(),
        ),
        (
            131072,
            [
                (Backend::Nccl, t(30.0, 0.1)),
                (Backend::OneStagePull, t(45.0, 0.1)),
            ]
            .into(),
        ),
    ]
    .into();
    assert_eq!(
        refine_points(&cells, &BTreeMap::new(), 8, Dtype::Bf16),
        vec![98304]
    );
    let mut dq = BTreeMap::new();
    dq.insert(Backend::OneStagePull, "wrong".to_string());
    assert!(refine_points(&cells, &dq, 8, Dtype::Bf16).is_empty());
}

#[test]
fn grids_and_tp() {
    assert_eq!(default_tp(8), vec![2, 4, 8]);
    assert_eq!(default_tp(6), vec![2, 4]);
    assert_eq!(size_grid(1024, 8192), vec![1024, 2048, 4096, 8192]);
    assert_eq!(size_grid(1000, 3000), vec![1000, 1024, 2048, 3000]);
    assert_eq!(parse_tp(&["4".into(), "2".into()], 8).unwrap(), vec![2, 4]);
    assert!(parse_tp(&["16".into()], 8).is_err());
    assert!(parse_tp(&["x".into()], 8).is_err());
}

#[test]
fn placements_differ_in_class() {
    let t = presets::get("pcie-8x-2switch").unwrap();
    let p4 = placements(&t, 4, 3);
    assert_eq!(p4[0].0, vec![0, 1, 2, 3]);
    assert_eq!(p4[0].1, "1 switch");
    assert!(
        p4.iter().any(|(_, l)| l == "2 switches, 1 root complex"),
        "{p4:?}"
    );
    let p2 = placements(&t, 2, 3);
    assert_eq!(p2.len(), 2, "{p2:?}");
    let p8 = placements(&t, 8, 3);
    assert_eq!(p8.len(), 1);
    let nv = presets::get("nvswitch-8x").unwrap();
    let p = placements(&nv, 4, 3);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].1, "NVSwitch");
    let d = presets::get("pcie-8x-direct-2socket").unwrap();
    assert!(placements(&d, 4, 3)
        .iter()
        .any(|(_, l)| l.contains("2 sockets")));
}

use super::*;
use crate::allreduce::{Dtype, Separation};
use crate::topology::presets;

fn t(median: f64, half: f64) -> Timing {
    Timing::around(median, half)
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
        refine_points(
            &cells,
            &BTreeMap::new(),
            Ranks::flat(8),
            Dtype::Bf16,
            crate::decide::winner
        ),
        vec![98304]
    );
    let mut dq = BTreeMap::new();
    dq.insert(Backend::OneStagePull, "wrong".to_string());
    assert!(refine_points(
        &cells,
        &dq,
        Ranks::flat(8),
        Dtype::Bf16,
        crate::decide::winner
    )
    .is_empty());
}

#[test]
fn refinement_bisects_where_nccl_switches_protocol() {
    // NCCL agrees with its ring/LL pin at 1 MiB and its ring/Simple pin at 2 MiB: its
    // model switched protocol in between, where Simple may already win.
    let at = |nccl: f64, ll: f64, simple: f64| -> BTreeMap<Backend, Timing> {
        [
            (Backend::Nccl, t(nccl, 0.5)),
            (Backend::NcclRingLl, t(ll, 0.5)),
            (Backend::NcclRingSimple, t(simple, 0.5)),
        ]
        .into()
    };
    let cells: BTreeMap<u64, BTreeMap<Backend, Timing>> = [
        (1 << 20, at(100.0, 100.2, 97.0)),
        (2 << 20, at(150.0, 190.0, 150.3)),
    ]
    .into();
    let winner = crate::decide::winner;
    assert_eq!(
        refine_points(
            &cells,
            &BTreeMap::new(),
            Ranks::flat(8),
            Dtype::Bf16,
            winner
        ),
        vec![3 << 19]
    );
    // Two pins tie with NCCL at one end, one of them alone at the other: NCCL may have
    // switched from the other, so look in between.
    let tied: BTreeMap<u64, BTreeMap<Backend, Timing>> = [
        (1 << 20, at(100.0, 100.2, 99.9)),
        (2 << 20, at(150.0, 190.0, 150.3)),
    ]
    .into();
    assert_eq!(
        refine_points(&tied, &BTreeMap::new(), Ranks::flat(8), Dtype::Bf16, winner),
        vec![3 << 19]
    );
    // The same code path at both ends: nothing to look for in between.
    let same: BTreeMap<u64, BTreeMap<Backend, Timing>> = [
        (1 << 20, at(100.0, 100.2, 97.0)),
        (2 << 20, at(190.0, 190.3, 200.0)),
    ]
    .into();
    assert!(refine_points(&same, &BTreeMap::new(), Ranks::flat(8), Dtype::Bf16, winner).is_empty());
    // A tied pin drifting just past the twin share at the other end, not clearly away:
    // noise, not a switch, so nothing to look for.
    let drift: BTreeMap<u64, BTreeMap<Backend, Timing>> = [
        (1 << 20, at(100.0, 100.2, 101.9)),
        (2 << 20, at(150.0, 150.2, 154.5)),
    ]
    .into();
    assert!(refine_points(
        &drift,
        &BTreeMap::new(),
        Ranks::flat(8),
        Dtype::Bf16,
        winner
    )
    .is_empty());
}

#[test]
fn grids_and_tp() {
    assert_eq!(default_tp(8), vec![2, 4, 8]);
    assert_eq!(default_tp(6), vec![2, 4]);
    assert_eq!(size_grid(1024, 8192), vec![1024, 2048, 4096, 8192]);
    assert_eq!(size_grid(1000, 3000), vec![1000, 1024, 2048, 3000]);
}

#[test]
fn the_grid_steps_past_every_ll_limit() {
    // One-stage push's LL form runs to 32 KiB, two-stage push's to 64 KiB: the first fine
    // sizes past them, an eighth above.
    let all = form_edges(&Backend::ALL, 1024, 256 << 20, 256);
    assert_eq!(all, vec![36 << 10, 72 << 10]);
    assert_eq!(
        form_edges(&[Backend::TwoStagePush], 1024, 1 << 20, 256),
        vec![72 << 10]
    );
    assert!(form_edges(&[Backend::OneStagePull, Backend::Nccl], 1024, 1 << 20, 256).is_empty());
    // Limits outside the range add nothing.
    assert!(form_edges(&Backend::ALL, 128 << 10, 1 << 20, 256).is_empty());
    assert!(form_edges(&Backend::ALL, 1024, 16 << 10, 256).is_empty());
}

#[test]
fn the_fine_grid_is_every_size_bisection_can_reach() {
    let g = fine_grid(1 << 20, 1 << 21, 256);
    let eighth = (1u64 << 20) / 8;
    assert_eq!(
        g,
        (0..=8).map(|i| (1 << 20) + i * eighth).collect::<Vec<_>>()
    );
    // Below 2 KiB an eighth is finer than the alignment: steps of 256 bytes.
    assert_eq!(
        fine_grid(1024, 2048, 256),
        vec![1024, 1280, 1536, 1792, 2048]
    );
    assert_eq!(fine_grid(1024, 256 << 20, 256).len(), 19 + 18 * 7 - 4);
    // Bisection with the winner changing at every size, for as many rounds as it takes,
    // lands on the same grid.
    let alternating = |sizes: &[u64]| -> BTreeMap<u64, BTreeMap<Backend, Timing>> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                let (fast, slow) = if i % 2 == 0 {
                    (Backend::Nccl, Backend::OneStagePull)
                } else {
                    (Backend::OneStagePull, Backend::Nccl)
                };
                (b, [(fast, t(10.0, 0.1)), (slow, t(20.0, 0.1))].into())
            })
            .collect()
    };
    let mut sizes = size_grid(1024, 1 << 20);
    loop {
        let cells = alternating(&sizes);
        let more = refine_points(
            &cells,
            &BTreeMap::new(),
            Ranks::flat(8),
            Dtype::Bf16,
            crate::decide::winner,
        );
        if more.is_empty() {
            break;
        }
        sizes.extend(more);
        sizes.sort_unstable();
    }
    assert_eq!(sizes, fine_grid(1024, 1 << 20, alignment(8, Dtype::Bf16)));
}

#[test]
fn one_step_is_an_eighth_or_one_alignment_unit() {
    assert!(within_step(1 << 20, (1 << 20) + (1 << 17), 256));
    assert!(!within_step(1 << 20, (1 << 20) + (1 << 17) + 256, 256));
    assert!(within_step((1 << 20) + (1 << 17), 1 << 20, 256));
    assert!(within_step(1024, 1280, 256));
    assert!(!within_step(1024, 1536, 256));
}

#[test]
fn placements_differ_in_class() {
    let t = presets::get("pcie-8x-2switch").unwrap();
    let p4 = placements(&t, 4, 3, None);
    assert_eq!(p4[0].gpus, vec![0, 1, 2, 3]);
    assert_eq!(p4[0].label, "1 switch");
    assert!(
        p4.iter().any(|p| p.label == "2 switches, 1 root complex"),
        "{p4:?}"
    );
    let p2 = placements(&t, 2, 3, None);
    assert_eq!(p2.len(), 2, "{p2:?}");
    let p8 = placements(&t, 8, 3, None);
    assert_eq!(p8.len(), 1);
    let nv = presets::get("nvswitch-8x").unwrap();
    let p = placements(&nv, 4, 3, None);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].label, "NVSwitch");
    let d = presets::get("pcie-8x-direct-2socket").unwrap();
    assert!(placements(&d, 4, 3, None)
        .iter()
        .any(|p| p.label.contains("2 sockets")));
}

#[test]
fn islands_are_what_the_slowest_crossing_separates() {
    let t = presets::get("pcie-8x-2switch").unwrap();
    let i = islands(&t, &[0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
    assert_eq!(i.gpus, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    assert_eq!(i.by, Separation::Switch);
    // Rank order is kept inside each island.
    let i = islands(&t, &[4, 0, 5, 1]).unwrap();
    assert_eq!(i.gpus, vec![vec![4, 5], vec![0, 1]]);
    let e = islands(&t, &[0, 1, 2, 3]).unwrap_err();
    assert!(e.contains("joined alike (PIX)"), "{e}");
    let e = islands(&t, &[0, 1, 2, 4]).unwrap_err();
    assert!(e.contains("GPU 4 is alone in its switch"), "{e}");
    let e = islands(&t, &[0, 1, 2, 4, 5]).unwrap_err();
    assert!(e.contains("unequal size"), "{e}");
    let d = presets::get("pcie-8x-direct-2socket").unwrap();
    let i = islands(&d, &[0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
    assert_eq!((i.count(), i.by), (2, Separation::Socket));
    let nv = presets::get("nvswitch-8x").unwrap();
    assert!(islands(&nv, &[0, 1, 2, 3]).unwrap_err().contains("NVLink"));
    // The override: consecutive ranks, checked as derived ones are.
    let g = given_islands(&[0, 4, 1, 5], &[2, 2]).unwrap();
    assert_eq!(g.gpus, vec![vec![0, 4], vec![1, 5]]);
    assert!(given_islands(&[0, 1, 2], &[1, 2])
        .unwrap_err()
        .contains("alone"));
    assert!(given_islands(&[0, 1, 2], &[2, 2])
        .unwrap_err()
        .contains("add up to 4"));
    let p8 = placements(&t, 8, 3, Some(&[2, 2, 2, 2]));
    assert_eq!(p8[0].islands.as_ref().unwrap().count(), 4);
}

#[test]
fn probe_peers_are_dense_then_double_and_keep_what_orients() {
    // A machine of 8 GPUs probes every count, as before.
    assert_eq!(probe_peers(8, Some(4)), (1..8).collect::<Vec<_>>());
    // 256 GPUs in islands of 32: 1..8, doublings, one island's 31 peers and all 255.
    assert_eq!(
        probe_peers(256, Some(32)),
        [1, 2, 3, 4, 5, 6, 7, 8, 16, 31, 32, 64, 128, 255]
    );
    assert_eq!(probe_peers(2, None), [1]);
    assert!(probe_peers(1, None).is_empty());
}

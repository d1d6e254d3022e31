use super::*;

fn t(median: f64, half: f64) -> Timing {
    Timing::around(median, half)
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

/// A simulated time's model band widens its interval: a kernel modelled 1.5x faster than NCCL
/// with tight sampling intervals does not win when the model could be wrong by more, and wins
/// when its advantage lies beyond both bands. More samples cannot settle it either way.
#[test]
fn a_simulated_kernel_wins_only_beyond_the_model_band() {
    let band = |t: Timing, f: f64| Timing {
        model: Some(crate::profile::ModelBand {
            low: 1.0 / f,
            high: f,
            assumed: false,
        }),
        ..t
    };
    let r: BTreeMap<_, _> = [
        (Backend::Nccl, band(t(15.0, 0.1), 1.3)),
        (Backend::OneStagePull, band(t(10.0, 0.1), 1.3)),
    ]
    .into();
    assert_eq!(
        choose(&r, |b| extra_memory(b, 8, 4096)),
        Some(Backend::Nccl)
    );
    assert!(unsettled(&r).is_empty(), "{:?}", unsettled(&r));
    let r: BTreeMap<_, _> = [
        (Backend::Nccl, band(t(20.0, 0.1), 1.3)),
        (Backend::OneStagePull, band(t(10.0, 0.1), 1.3)),
    ]
    .into();
    assert_eq!(
        choose(&r, |b| extra_memory(b, 8, 4096)),
        Some(Backend::OneStagePull)
    );
    assert!(beats_settled(
        &r[&Backend::OneStagePull],
        &r[&Backend::Nccl]
    ));
}

use super::*;
use crate::allreduce::Ranks;

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
        choose(&r, |b| extra_memory(b, Ranks::flat(8), 4096)),
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
        choose(&r, |b| extra_memory(b, Ranks::flat(8), 4096)),
        Some(Backend::Nccl)
    );
    // Between two custom kernels, the cheaper one (pull needs 1 buffer, push N-1) wins a tie.
    let r: BTreeMap<_, _> = [
        (Backend::OneStagePush, t(9.8, 0.3)),
        (Backend::OneStagePull, t(10.0, 0.3)),
    ]
    .into();
    assert_eq!(
        choose(&r, |b| extra_memory(b, Ranks::flat(8), 4096)),
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
        choose(&r, |b| extra_memory(b, Ranks::flat(8), 1 << 20)),
        Some(Backend::Nccl)
    );
    // 10% apart: the custom kernel earns its memory.
    let r: BTreeMap<_, _> = [
        (Backend::Nccl, t(10.0, 0.01)),
        (Backend::TwoStagePull, t(9.0, 0.01)),
    ]
    .into();
    assert_eq!(
        choose(&r, |b| extra_memory(b, Ranks::flat(8), 1 << 20)),
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
            family: None,
        }),
        ..t
    };
    let r: BTreeMap<_, _> = [
        (Backend::Nccl, band(t(15.0, 0.1), 1.3)),
        (Backend::OneStagePull, band(t(10.0, 0.1), 1.3)),
    ]
    .into();
    assert_eq!(
        choose(&r, |b| extra_memory(b, Ranks::flat(8), 4096)),
        Some(Backend::Nccl)
    );
    assert!(unsettled(&r).is_empty(), "{:?}", unsettled(&r));
    let r: BTreeMap<_, _> = [
        (Backend::Nccl, band(t(20.0, 0.1), 1.3)),
        (Backend::OneStagePull, band(t(10.0, 0.1), 1.3)),
    ]
    .into();
    assert_eq!(
        choose(&r, |b| extra_memory(b, Ranks::flat(8), 4096)),
        Some(Backend::OneStagePull)
    );
    assert!(beats_settled(
        &r[&Backend::OneStagePull],
        &r[&Backend::Nccl]
    ));
}

/// Two times of one model family share the parts their band is made of, so the band cancels
/// in their ratio: a pin 20% faster than NCCL wins as a measured one would, and a kernel 20%
/// faster than another is not tied with it. The same times from different families (or of
/// unknown family) keep both bands and stay tied.
#[test]
fn the_model_band_cancels_within_a_family_and_stands_across_them() {
    use crate::profile::{ModelBand, ModelFamily};
    let sim = |t: Timing, family: Option<ModelFamily>| Timing {
        model: Some(ModelBand {
            low: 1.0 / 1.3,
            high: 1.3,
            assumed: false,
            family,
        }),
        ..t
    };
    let nccl = Some(ModelFamily::Nccl);
    let pins = |f: Option<ModelFamily>| -> BTreeMap<_, _> {
        [
            (Backend::Nccl, sim(t(10.0, 0.05), nccl)),
            (Backend::NcclRingSimple, sim(t(8.0, 0.05), f)),
        ]
        .into()
    };
    assert_eq!(nccl_choice(&pins(nccl)), Some(Backend::NcclRingSimple));
    assert!(beats_settled(
        &pins(nccl)[&Backend::NcclRingSimple],
        &pins(nccl)[&Backend::Nccl]
    ));
    assert_eq!(nccl_choice(&pins(None)), Some(Backend::Nccl));
    // Kernels: NCCL far behind; one-stage pull 20% faster than two-stage push, which needs
    // less memory. Correlated, pull beats push; independent, they tie and memory decides.
    let custom = Some(ModelFamily::Custom);
    let kernels = |f: Option<ModelFamily>| -> BTreeMap<_, _> {
        [
            (Backend::Nccl, sim(t(40.0, 0.05), nccl)),
            (Backend::OneStagePull, sim(t(8.0, 0.05), custom)),
            (Backend::TwoStagePush, sim(t(10.0, 0.05), f)),
        ]
        .into()
    };
    let extra = |b: Backend| match b {
        Backend::OneStagePull => 2,
        Backend::TwoStagePush => 1,
        _ => 0,
    };
    assert_eq!(choose(&kernels(custom), extra), Some(Backend::OneStagePull));
    assert_eq!(choose(&kernels(None), extra), Some(Backend::TwoStagePush));
    // Across families the bands stand: the kernel 2x faster than NCCL within two 1.3x bands
    // (1.69x apart at most) wins; 1.5x faster does not.
    let across = |k: f64| -> BTreeMap<_, _> {
        [
            (Backend::Nccl, sim(t(15.0, 0.05), nccl)),
            (Backend::OneStagePull, sim(t(k, 0.05), custom)),
        ]
        .into()
    };
    assert_eq!(choose(&across(10.0), |_| 0), Some(Backend::Nccl));
    assert_eq!(choose(&across(7.5), |_| 0), Some(Backend::OneStagePull));
    let r = across(10.0);
    assert_eq!(
        beyond(&r[&Backend::OneStagePull], &r[&Backend::Nccl]),
        0.0,
        "a regret within the bands is no significant regret"
    );
}

/// Where a model band applies, the verdict's edge is the bands' ratio (here 1.3² = 1.69), and
/// a comparison straddling it is open, so it is sampled until it settles; one straddling the
/// effect on the sampling intervals alone stays open as it would be measured.
#[test]
fn a_banded_comparison_is_open_at_the_band_edge_and_at_the_sampling_edge() {
    use crate::profile::{ModelBand, ModelFamily};
    let sim = |t: Timing, family| Timing {
        model: Some(ModelBand {
            low: 1.0 / 1.3,
            high: 1.3,
            assumed: false,
            family: Some(family),
        }),
        ..t
    };
    let n = sim(t(16.9, 0.3), ModelFamily::Nccl);
    // 1.69x apart, intervals ±2%: more samples decide whether the kernel wins.
    let k = sim(t(10.0, 0.2), ModelFamily::Custom);
    assert!(open(&k, &n));
    // 5% apart, as close a call as a measured one: still sampled.
    let near = sim(t(16.1, 0.3), ModelFamily::Custom);
    assert!(open(&near, &n));
    // 1.3x apart with tight intervals: nothing more samples could change.
    let mid = sim(t(13.0, 0.05), ModelFamily::Custom);
    assert!(!open(&mid, &sim(t(16.9, 0.05), ModelFamily::Nccl)));
}

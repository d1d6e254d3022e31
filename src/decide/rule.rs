//! The one steering rule: which backend serves one size, and which NCCL variant runs when NCCL
//! does. The profile's choices, `select`, the C ABI, the NCCL plugin and every export read its
//! answer; none of them decides again.
//!
//! 1. NCCL's own choice (`nccl`) is the reference, because it is what an engine runs when told
//!    nothing. A pinned variant replaces it only if it [`beats`] it; the fastest such pin wins.
//! 2. A custom kernel must beat that NCCL reference, since it costs IPC buffers. Among the
//!    kernels that do, the fastest is the second reference: any that it does not beat is a tie,
//!    and the tie goes to the least extra memory.
//!
//! Every comparison is against one reference, so ties are transitive: a pin "tied" with a
//! kernel that NCCL loses to can never displace NCCL, and neighbouring sizes cannot flap on a
//! 1% difference.

use std::collections::{BTreeMap, BTreeSet};

use crate::allreduce::Backend;
use crate::results::Timing;

/// An advantage smaller than this fraction is not worth more memory or a pinned NCCL
/// setting, however tight the confidence intervals are.
pub const MIN_EFFECT: f64 = 0.05;

/// `a` is significantly faster than `b`: statistically (the 95% intervals of the medians do
/// not overlap, each widened by its model band where the [`model_error`] of the pair says so)
/// and practically (by more than [`MIN_EFFECT`]). A simulated custom kernel thus wins over
/// simulated NCCL only beyond what the model could be wrong by.
pub fn beats(a: &Timing, b: &Timing) -> bool {
    high(a, b) < low(b, a) && b.median_us > a.median_us * (1.0 + MIN_EFFECT)
}

/// The model band's factors (low, high) that `t`'s interval takes in a comparison with
/// `other`: 1 where the time is measured, and 1 where both times come from the same family
/// of the model. Two NCCL variants cross the same links, root complex and sockets and differ
/// only in the protocol's costs; two custom kernels cross the same switch contention model.
/// Those shared parts make up the band, so their error moves both times alike and cancels in
/// the ratio; treated as independent, a pin would need about twice the band to win, i.e.
/// never. The protocol part the NCCL variants do not share is not split out (a band records
/// no parts): within a family the comparison is the sampling intervals' alone. Across
/// families (NCCL against a kernel) the bands stand as they are (docs/MODEL-ERROR.md).
pub fn model_error(t: &Timing, other: &Timing) -> (f64, f64) {
    match (t.model, other.model) {
        (Some(m), Some(o)) if m.family.is_some() && m.family == o.family => (1.0, 1.0),
        (Some(m), _) => (m.low, m.high),
        (None, _) => (1.0, 1.0),
    }
}

/// Lower end of `t`'s interval as compared with `other`: sampling interval times model band.
fn low(t: &Timing, other: &Timing) -> f64 {
    t.ci_low_us * model_error(t, other).0
}

/// Upper end, as [`low`].
fn high(t: &Timing, other: &Timing) -> f64 {
    t.ci_high_us * model_error(t, other).1
}

/// Whether more samples could still turn `beats(a, b)`: the intervals allow `a`'s advantage
/// to be above the rule's edge and below it. A comparison that is not open stays as it is
/// however long either side is sampled, up to noise beyond the intervals.
///
/// Where a model band applies, the edge is the larger of the effect (on the medians) and the
/// bands' ratio (on the intervals), not their product; model bands do not shrink with samples.
/// The edge of the sampling intervals alone stays open too: the band must not take away the
/// settle rounds a measured cell of the same spread gets, which outlier rejection in noisy
/// cells relies on.
pub fn open(a: &Timing, b: &Timing) -> bool {
    let effect = 1.0 + MIN_EFFECT;
    let banded = model_error(a, b).1 / model_error(b, a).0;
    let straddles =
        |edge: f64| b.ci_low_us < a.ci_high_us * edge && b.ci_high_us > a.ci_low_us * edge;
    straddles(effect) || straddles(banded.max(effect))
}

/// `a` beats `b` whatever more samples say: `b`'s widened interval lies above `a`'s by more
/// than the effect, so [`beats`] holds and the comparison is not [`open`].
pub fn beats_settled(a: &Timing, b: &Timing) -> bool {
    low(b, a) >= high(a, b) * (1.0 + MIN_EFFECT)
}

/// How much slower `b` is than `a` beyond what their intervals and model bands can tell, µs
/// (never below 0): the part of a regret that is not noise or model error.
pub fn beyond(a: &Timing, b: &Timing) -> f64 {
    (low(b, a) - high(a, b)).max(0.0)
}

/// The backends at one size whose comparisons, as [`choose`] makes them, are [`open`]: where
/// the choice is a close call that more samples would settle. Comparisons that cannot change
/// the choice are left out: a kernel the fastest kernel beats whatever the samples say.
pub fn unsettled(results: &BTreeMap<Backend, Timing>) -> BTreeSet<Backend> {
    let mut out = BTreeSet::new();
    let mut mark = |a: (&Backend, &Timing), b: (&Backend, &Timing)| {
        if a.0 != b.0 && open(a.1, b.1) {
            out.extend([*a.0, *b.0]);
        }
    };
    let pins = results.iter().filter(|(b, _)| b.nccl_pin().is_some());
    if let Some(own) = results.get_key_value(&Backend::Nccl) {
        pins.for_each(|p| mark(p, own));
    }
    let customs = || results.iter().filter(|(b, _)| b.is_custom());
    let reference = nccl_choice(results).and_then(|b| results.get_key_value(&b));
    if let (Some(r), Some((_, quickest))) = (reference, fastest(customs())) {
        customs()
            .filter(|(_, t)| !beats_settled(quickest, t))
            .for_each(|c| mark(c, r));
    }
    let earning = earning(results, reference.map(|(_, t)| t));
    if let Some(best) = fastest(earning.iter().copied()) {
        earning.iter().for_each(|&t| mark(best, t));
    }
    out
}

/// The custom kernels that earn their buffers: those that beat the NCCL reference, or all of
/// them where no NCCL variant was measured.
fn earning<'a>(
    results: &'a BTreeMap<Backend, Timing>,
    reference: Option<&Timing>,
) -> Vec<(&'a Backend, &'a Timing)> {
    let customs = results.iter().filter(|(b, _)| b.is_custom());
    match reference {
        Some(r) => customs.filter(|(_, t)| beats(t, r)).collect(),
        None => customs.collect(),
    }
}

fn fastest<'a>(
    it: impl Iterator<Item = (&'a Backend, &'a Timing)>,
) -> Option<(&'a Backend, &'a Timing)> {
    it.min_by(|a, b| a.1.median_us.total_cmp(&b.1.median_us))
}

/// The NCCL variant to run at this size: `nccl` unless a pinned variant beats it, the fastest
/// pin where `nccl` itself was not measured, None where no NCCL variant was.
pub fn nccl_choice(results: &BTreeMap<Backend, Timing>) -> Option<Backend> {
    let pins = results.iter().filter(|(b, _)| b.nccl_pin().is_some());
    match results.get(&Backend::Nccl) {
        Some(own) => {
            Some(fastest(pins.filter(|(_, t)| beats(t, own))).map_or(Backend::Nccl, |(b, _)| *b))
        }
        None => fastest(pins).map(|(b, _)| *b),
    }
}

/// The backend to use given the timings at one size; `extra` is each backend's extra memory.
pub fn choose(
    results: &BTreeMap<Backend, Timing>,
    extra: impl Fn(Backend) -> u64,
) -> Option<Backend> {
    let reference = nccl_choice(results).and_then(|b| results.get(&b).map(|t| (b, t)));
    let earning = earning(results, reference.map(|(_, t)| t));
    let Some((_, best)) = fastest(earning.iter().copied()) else {
        return reference.map(|(b, _)| b);
    };
    earning
        .iter()
        .filter(|(_, t)| !beats(best, t))
        .min_by(|(a, ta), (b, tb)| {
            extra(**a)
                .cmp(&extra(**b))
                .then(ta.median_us.total_cmp(&tb.median_us))
        })
        .map(|(b, _)| **b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(median: f64, half: f64) -> Timing {
        Timing::around(median, half)
    }

    #[test]
    fn a_pin_within_min_effect_of_nccl_leaves_nccl() {
        // The case of the issue: NCCL 10.0 us, Ring/LL 9.7 us, both ±0.5%.
        let r: BTreeMap<_, _> = [
            (Backend::Nccl, t(10.0, 0.05)),
            (Backend::NcclRingLl, t(9.7, 0.05)),
        ]
        .into();
        assert_eq!(nccl_choice(&r), Some(Backend::Nccl));
        assert_eq!(choose(&r, |_| 0), Some(Backend::Nccl));
        // 20% faster with tight intervals: the pin earns it.
        let r: BTreeMap<_, _> = [
            (Backend::Nccl, t(10.0, 0.05)),
            (Backend::NcclRingLl, t(8.0, 0.05)),
        ]
        .into();
        assert_eq!(nccl_choice(&r), Some(Backend::NcclRingLl));
        assert_eq!(choose(&r, |_| 0), Some(Backend::NcclRingLl));
    }

    #[test]
    fn ties_are_against_one_reference_so_they_are_transitive() {
        // A kernel 6% faster than NCCL; a pin 2% slower than the kernel (4% faster than NCCL,
        // so not beating it). Calling the pin a tie with the fastest would take it for its zero
        // memory; NCCL stays the NCCL reference and the kernel earns its buffers.
        let r: BTreeMap<_, _> = [
            (Backend::Nccl, t(10.0, 0.01)),
            (Backend::NcclRingSimple, t(9.6, 0.01)),
            (Backend::TwoStagePush, t(9.4, 0.01)),
        ]
        .into();
        assert_eq!(nccl_choice(&r), Some(Backend::Nccl));
        assert_eq!(
            choose(&r, |b| u64::from(b.is_custom())),
            Some(Backend::TwoStagePush)
        );
    }

    #[test]
    fn kernels_must_beat_nccl_and_ties_among_them_go_to_memory() {
        let r: BTreeMap<_, _> = [
            (Backend::Nccl, t(20.0, 0.2)),
            (Backend::OneStagePush, t(9.8, 0.3)),
            (Backend::OneStagePull, t(10.0, 0.3)),
        ]
        .into();
        let extra = |b: Backend| match b {
            Backend::OneStagePush => 7,
            Backend::OneStagePull => 1,
            _ => 0,
        };
        assert_eq!(choose(&r, extra), Some(Backend::OneStagePull));
        // Overlapping NCCL: no kernel earns its memory.
        let r: BTreeMap<_, _> = [
            (Backend::Nccl, t(10.0, 0.3)),
            (Backend::OneStagePull, t(9.8, 0.3)),
        ]
        .into();
        assert_eq!(choose(&r, extra), Some(Backend::Nccl));
    }

    #[test]
    fn without_nccl_the_fastest_measured_serves() {
        let r: BTreeMap<_, _> = [
            (Backend::NcclTreeLl, t(12.0, 0.1)),
            (Backend::NcclRingLl, t(11.0, 0.1)),
        ]
        .into();
        assert_eq!(nccl_choice(&r), Some(Backend::NcclRingLl));
        let r: BTreeMap<_, _> = [(Backend::OneStagePull, t(11.0, 0.1))].into();
        assert_eq!(nccl_choice(&r), None);
        assert_eq!(choose(&r, |_| 0), Some(Backend::OneStagePull));
        assert_eq!(choose(&BTreeMap::new(), |_| 0), None);
    }

    #[test]
    fn a_close_call_is_open_until_the_intervals_settle_the_effect() {
        let nccl = (Backend::Nccl, t(10.0, 0.1));
        // 5.3% faster, intervals apart: the rule picks the kernel, but its intervals allow
        // 3% as well as 7%, so both sides are unsettled.
        let close: BTreeMap<_, _> = [nccl, (Backend::TwoStagePush, t(9.5, 0.1))].into();
        assert_eq!(choose(&close, |_| 0), Some(Backend::TwoStagePush));
        let both: BTreeSet<_> = [Backend::Nccl, Backend::TwoStagePush].into();
        assert_eq!(unsettled(&close), both);
        // 20% faster, or 1% faster: settled either way.
        for far in [8.0, 9.9] {
            let r: BTreeMap<_, _> = [nccl, (Backend::TwoStagePush, t(far, 0.05))].into();
            assert!(unsettled(&r).is_empty(), "{far}");
        }
        // A pin as close to NCCL is a close call too.
        let pin: BTreeMap<_, _> = [nccl, (Backend::NcclRingLl, t(9.5, 0.1))].into();
        assert_eq!(unsettled(&pin), [Backend::Nccl, Backend::NcclRingLl].into());
    }

    #[test]
    fn a_close_call_that_cannot_change_the_choice_is_left_alone() {
        // One-stage is far ahead; two-stage is close to NCCL, but one-stage beats it whatever
        // more samples say, so neither NCCL nor two-stage needs them.
        let r: BTreeMap<_, _> = [
            (Backend::Nccl, t(10.0, 0.2)),
            (Backend::OneStagePull, t(6.0, 0.05)),
            (Backend::TwoStagePush, t(9.5, 0.2)),
        ]
        .into();
        assert_eq!(choose(&r, |_| 0), Some(Backend::OneStagePull));
        assert!(open(&r[&Backend::TwoStagePush], &r[&Backend::Nccl]));
        assert!(unsettled(&r).is_empty(), "{:?}", unsettled(&r));
        // Two kernels that beat NCCL, 5% apart: which one (the memory tie) is the close call.
        let r: BTreeMap<_, _> = [
            (Backend::Nccl, t(20.0, 0.1)),
            (Backend::OneStagePull, t(9.5, 0.1)),
            (Backend::TwoStagePush, t(10.0, 0.1)),
        ]
        .into();
        assert_eq!(
            unsettled(&r),
            [Backend::OneStagePull, Backend::TwoStagePush].into()
        );
    }
}

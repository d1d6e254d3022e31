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

use serde::Serialize;

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
    verdict(results, extra).map(|v| v.choice)
}

/// Why `a`, faster than `b` by its median, does not [`beats`] it: the margin that decided.
/// `speedup` is `b`'s median over `a`'s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "because", rename_all = "snake_case")]
pub enum Short {
    /// Faster by no more than [`MIN_EFFECT`]: not worth more memory or a pinned setting.
    UnderEffect { speedup: f64 },
    /// The 95% intervals of the medians overlap: the samples cannot tell the two apart.
    Overlap { speedup: f64 },
    /// Simulated: the intervals are apart, but widened by the model's error bands (factors
    /// `a_band`, `b_band`, as [`model_error`] applies them) they overlap: `a` may take as much
    /// as `a_high_us` and `b` as little as `b_low_us`.
    WithinModel {
        speedup: f64,
        a_band: (f64, f64),
        b_band: (f64, f64),
        a_high_us: f64,
        b_low_us: f64,
    },
}

/// Why `a` does not beat `b` though its median is lower; None where it beats `b`, or is not
/// faster at all.
pub fn short(a: &Timing, b: &Timing) -> Option<Short> {
    if a.median_us >= b.median_us || beats(a, b) {
        return None;
    }
    let speedup = b.median_us / a.median_us;
    Some(if b.median_us <= a.median_us * (1.0 + MIN_EFFECT) {
        Short::UnderEffect { speedup }
    } else if a.ci_high_us >= b.ci_low_us {
        Short::Overlap { speedup }
    } else {
        Short::WithinModel {
            speedup,
            a_band: model_error(a, b),
            b_band: model_error(b, a),
            a_high_us: high(a, b),
            b_low_us: low(b, a),
        }
    })
}

/// A backend faster than the one it was compared with, by its median, that lost, and why.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Passed {
    pub backend: Backend,
    #[serde(flatten)]
    pub short: Short,
}

/// Which clause of the rule gave the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Clause {
    /// No custom kernel beats the NCCL reference, so the reference serves.
    NcclReference,
    /// The fastest of the custom kernels that beat the reference.
    FastestKernel,
    /// A kernel the fastest does not beat (a tie), taken for its lesser extra memory.
    LeastMemory,
}

/// The rule's answer at one size, the clause that gave it, and the margins that decided it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub choice: Backend,
    pub clause: Clause,
    /// The NCCL variant kernels must beat ([`nccl_choice`]); None where none was measured.
    pub reference: Option<Backend>,
    /// Pinned NCCL variants faster than NCCL's own choice by their medians that do not beat it.
    pub pins_short: Vec<Passed>,
    /// Custom kernels faster than the reference by their medians that do not beat it: they
    /// do not earn their buffers.
    pub kernels_short: Vec<Passed>,
    /// The kernels that beat the reference (every kernel where there is none), fastest first.
    pub earning: Vec<Backend>,
    /// Under [`Clause::LeastMemory`]: the fastest kernel and why it does not beat the choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tie: Option<Backend>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tie_short: Option<Short>,
}

impl Verdict {
    /// Why the rule did not take `b` though its median was faster than what it was compared
    /// with: its margin against the NCCL reference (a custom kernel), against `nccl` (a pin),
    /// or against the kernel taken for its lesser memory (the fastest kernel). None where `b`
    /// lost on its median, or is the choice.
    pub fn short_of(&self, b: Backend) -> Option<Short> {
        if self.tie == Some(b) {
            return self.tie_short;
        }
        self.kernels_short
            .iter()
            .chain(&self.pins_short)
            .find(|p| p.backend == b)
            .map(|p| p.short)
    }
}

/// The rule's answer given the timings at one size, with why; `extra` is each backend's
/// extra memory. None where nothing was measured.
pub fn verdict(
    results: &BTreeMap<Backend, Timing>,
    extra: impl Fn(Backend) -> u64,
) -> Option<Verdict> {
    let reference = nccl_choice(results);
    let reference_t = reference.and_then(|b| results.get(&b));
    let passed = |against: Option<&Timing>, pick: fn(&Backend) -> bool| -> Vec<Passed> {
        let Some(r) = against else {
            return Vec::new();
        };
        let mut v: Vec<(f64, Passed)> = results
            .iter()
            .filter(|(b, _)| pick(b))
            .filter_map(|(b, t)| {
                let short = short(t, r)?;
                Some((t.median_us, Passed { backend: *b, short }))
            })
            .collect();
        v.sort_by(|x, y| x.0.total_cmp(&y.0));
        v.into_iter().map(|(_, p)| p).collect()
    };
    let pins_short = passed(results.get(&Backend::Nccl), |b| b.nccl_pin().is_some());
    let kernels_short = passed(reference_t, |b| b.is_custom());
    let mut earning = earning(results, reference_t);
    earning.sort_by(|a, b| a.1.median_us.total_cmp(&b.1.median_us));
    let mut v = Verdict {
        choice: reference.or(earning.first().map(|(b, _)| **b))?,
        clause: Clause::NcclReference,
        reference,
        pins_short,
        kernels_short,
        earning: earning.iter().map(|(b, _)| **b).collect(),
        tie: None,
        tie_short: None,
    };
    let Some(&(best_b, best)) = earning.first() else {
        return Some(v);
    };
    let (choice, choice_t) = earning
        .iter()
        .filter(|(_, t)| !beats(best, t))
        .min_by(|(a, ta), (b, tb)| {
            extra(**a)
                .cmp(&extra(**b))
                .then(ta.median_us.total_cmp(&tb.median_us))
        })
        .copied()
        .unwrap_or((best_b, best));
    v.choice = *choice;
    v.clause = Clause::FastestKernel;
    if choice != best_b {
        v.clause = Clause::LeastMemory;
        v.tie = Some(*best_b);
        v.tie_short = short(best, choice_t);
    }
    Some(v)
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

    #[test]
    fn the_verdict_names_the_margin_each_faster_backend_lost_by() {
        let banded = |median: f64, low: f64, high: f64, family| {
            let mut t = t(median, 0.1);
            t.model = Some(crate::profile::ModelBand {
                low,
                high,
                assumed: false,
                family: Some(family),
            });
            t
        };
        use crate::profile::ModelFamily::{Custom, Nccl};
        // NCCL serves: one kernel 2% faster, one whose intervals overlap NCCL's, one 25%
        // faster whose model band overlaps NCCL's, one slower (not named at all).
        let r: BTreeMap<_, _> = [
            (Backend::Nccl, banded(10.0, 0.7, 1.4, Nccl)),
            (Backend::NcclRingLl, banded(9.9, 0.7, 1.4, Nccl)),
            (Backend::OneStagePush, banded(9.8, 0.5, 2.0, Custom)),
            (Backend::TwoStagePush, Timing::around(9.0, 1.2)),
            (Backend::OneStagePull, banded(8.0, 0.5, 2.0, Custom)),
            (Backend::TwoStagePull, banded(12.0, 0.5, 2.0, Custom)),
        ]
        .into();
        let v = verdict(&r, |_| 0).unwrap();
        assert_eq!((v.choice, v.clause), (Backend::Nccl, Clause::NcclReference));
        assert_eq!(v.reference, Some(Backend::Nccl));
        let kinds: Vec<(Backend, &str)> = v
            .kernels_short
            .iter()
            .map(|p| {
                let k = match p.short {
                    Short::UnderEffect { .. } => "effect",
                    Short::Overlap { .. } => "overlap",
                    Short::WithinModel { .. } => "model",
                };
                (p.backend, k)
            })
            .collect();
        assert_eq!(
            kinds,
            [
                (Backend::OneStagePull, "model"),
                (Backend::TwoStagePush, "overlap"),
                (Backend::OneStagePush, "effect"),
            ]
        );
        let Short::WithinModel {
            speedup,
            a_band,
            b_band,
            a_high_us,
            b_low_us,
        } = v.kernels_short[0].short
        else {
            unreachable!()
        };
        assert!((speedup - 1.25).abs() < 1e-9);
        assert_eq!((a_band, b_band), ((0.5, 2.0), (0.7, 1.4)));
        assert!(a_high_us > b_low_us, "{a_high_us} {b_low_us}");
        assert!(matches!(
            v.pins_short[..],
            [Passed {
                backend: Backend::NcclRingLl,
                short: Short::UnderEffect { .. }
            }]
        ));
        // A kernel beyond NCCL and a faster one it ties with: the tie goes to memory, and
        // the verdict says so and by what margin.
        let r: BTreeMap<_, _> = [
            (Backend::Nccl, t(20.0, 0.1)),
            (Backend::OneStagePush, t(9.8, 0.3)),
            (Backend::OneStagePull, t(10.0, 0.3)),
        ]
        .into();
        let v = verdict(&r, |b| u64::from(b == Backend::OneStagePush)).unwrap();
        assert_eq!(
            (v.choice, v.clause),
            (Backend::OneStagePull, Clause::LeastMemory)
        );
        assert_eq!(v.tie, Some(Backend::OneStagePush));
        assert!(matches!(v.tie_short, Some(Short::UnderEffect { .. })));
        assert_eq!(v.earning, [Backend::OneStagePush, Backend::OneStagePull]);
        let v = verdict(&r, |_| 0).unwrap();
        assert_eq!(
            (v.choice, v.clause),
            (Backend::OneStagePush, Clause::FastestKernel)
        );
    }
}

//! Stable bands: an engine follows a profile as a few size ranges, one backend each, so a
//! band change must pay for itself. Per size, [`super::rule`] says what serves; this pass keeps
//! that choice except where a short excursion gains less than [`MIN_EFFECT`], and reports what
//! the final bands cost against the fastest backend measured at each size.
//!
//! Dynamic programming over the buckets, one state per backend the rule chose somewhere in the
//! group. Staying on a backend the rule did not choose at a bucket is allowed only where it is
//! not significantly slower than the rule's choice there (a tie), and it never counts as faster
//! than that choice: smoothing only ever removes changes, it never chases noise. A backend that
//! asks more of the engine than the rule's choice is never stretched over it (a custom kernel
//! must earn its buffers at every size it serves), except that a pinned NCCL variant may bridge
//! a tie with NCCL's own choice between two sizes where the rule chose the pin: a pin is free to
//! keep, and a band of NCCL's own choice that gains nothing does not split one pinned band in
//! two. Each change of
//! backend costs MIN_EFFECT/2 of the time at the change, so a one-bucket band inside another
//! (two changes) survives only if it wins by more than MIN_EFFECT there.
//!
//! Then no band flaps: a band between two others whose backend gains less than MIN_EFFECT (on
//! the medians, at its best size) over each neighbour's backend merges into them, whatever
//! the rule chose there. Such a band is the rule's caution, not a win: an engine would switch
//! away and back for nothing, and a kernel chosen on both sides already holds the buffers.

use std::collections::BTreeMap;

use super::rule::{beats, MIN_EFFECT};
use crate::allreduce::Backend;
use crate::profile::Regret;
use crate::results::Timing;

/// One bucket as the smoothing sees it.
pub struct Step<'a> {
    pub bytes: u64,
    /// The rule's choice at this size.
    pub rule: Backend,
    /// Timings of the backends eligible here.
    pub results: &'a BTreeMap<Backend, Timing>,
}

/// What a backend asks of an engine beyond what it has: nothing (NCCL as it is), a pinned
/// setting, or IPC buffers.
fn demand(b: Backend) -> u8 {
    if b.is_custom() {
        2
    } else if b.nccl_pin().is_some() {
        1
    } else {
        0
    }
}

/// What staying on `b` at `s` costs, or None where `b` may not serve `s`; `inside` says
/// whether `s` lies between two sizes where the rule chose `b`.
fn cost(s: &Step<'_>, b: Backend, inside: bool) -> Option<f64> {
    let chosen = s.results.get(&s.rule)?.median_us;
    if b == s.rule {
        return Some(chosen);
    }
    let t = s.results.get(&b)?;
    let r = &s.results[&s.rule];
    let bridge = inside && b.nccl_pin().is_some() && s.rule == Backend::Nccl;
    ((demand(b) <= demand(s.rule) || bridge) && !beats(r, t)).then_some(t.median_us.max(chosen))
}

/// The backend per step: the rule's choice wherever no smoother sequence is as cheap, with
/// no band that flaps. Every consumer reads these bands (the profile's buckets).
pub fn smooth(steps: &[Step<'_>]) -> Vec<Backend> {
    let mut chosen = follow(steps);
    while let Some((at, len)) = flap(steps, &chosen) {
        merge(steps, &mut chosen, at, len);
    }
    chosen
}

/// The rule's choices, changed only where a tie saves a band change (the dynamic programme).
fn follow(steps: &[Step<'_>]) -> Vec<Backend> {
    let mut states: Vec<Backend> = steps.iter().map(|s| s.rule).collect();
    states.sort_unstable();
    states.dedup();
    let n = steps.len();
    if n == 0 {
        return Vec::new();
    }
    let k = states.len();
    // Per state, the first and last step where the rule chose it: the span it may bridge.
    let span: Vec<(usize, usize)> = states
        .iter()
        .map(|&b| {
            let at = |i: &usize| steps[*i].rule == b;
            let first = (0..n).find(at).unwrap_or(0);
            let last = (0..n).rev().find(at).unwrap_or(0);
            (first, last)
        })
        .collect();
    let inside = |i: usize, j: usize| span[j].0 < i && i < span[j].1;
    // best[i][j]: least cost of steps 0..=i ending on states[j]; from[i][j]: the state before.
    let mut best = vec![vec![f64::INFINITY; k]; n];
    let mut from = vec![vec![usize::MAX; k]; n];
    for (j, &b) in states.iter().enumerate() {
        if let Some(c) = cost(&steps[0], b, false) {
            best[0][j] = c;
        }
    }
    for i in 1..n {
        let penalty = MIN_EFFECT / 2.0 * steps[i].results[&steps[i].rule].median_us;
        for (j, &b) in states.iter().enumerate() {
            let Some(c) = cost(&steps[i], b, inside(i, j)) else {
                continue;
            };
            for p in 0..k {
                let v = best[i - 1][p] + c + if p == j { 0.0 } else { penalty };
                // On equal cost keep the earlier state: a change happens as late as it can,
                // so a tie at the edge of a band stays with the band below.
                if v < best[i][j] || (v == best[i][j] && p == j) {
                    best[i][j] = v;
                    from[i][j] = p;
                }
            }
        }
    }
    let mut j = (0..k)
        .min_by(|&a, &b| best[n - 1][a].total_cmp(&best[n - 1][b]))
        .unwrap_or(0);
    let mut out = vec![steps[n - 1].rule; n];
    for i in (0..n).rev() {
        if !best[i][j].is_finite() {
            // Cannot happen (the rule's own choice is always a finite path), but fall back
            // to the rule rather than trust a broken path.
            return steps.iter().map(|s| s.rule).collect();
        }
        out[i] = states[j];
        if i > 0 {
            j = from[i][j];
        }
    }
    out
}

/// The runs of one backend in `chosen`: (first step, length).
fn runs(chosen: &[Backend]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (i, b) in chosen.iter().enumerate() {
        match out.last_mut() {
            Some((at, len)) if chosen[*at] == *b => *len += 1,
            _ => out.push((i, 1)),
        }
    }
    out
}

/// What `b` gains over `n` at its best step of `at..at + len`: max of t_n / t_b − 1. None
/// where `n` was not measured (or is not eligible) at one of them: it cannot take the band.
fn best_gain(steps: &[Step<'_>], at: usize, len: usize, b: Backend, n: Backend) -> Option<f64> {
    steps[at..at + len]
        .iter()
        .map(|s| Some(s.results.get(&n)?.median_us / s.results.get(&b)?.median_us - 1.0))
        .try_fold(f64::NEG_INFINITY, |m, g| Some(m.max(g?)))
}

/// The band that flaps worst (its larger gain over a neighbour the least), as (first step,
/// length): one between two others whose backend gains less than MIN_EFFECT over both.
fn flap(steps: &[Step<'_>], chosen: &[Backend]) -> Option<(usize, usize)> {
    let runs = runs(chosen);
    runs.windows(3)
        .filter_map(|w| {
            let (at, len) = w[1];
            let b = chosen[at];
            let left = best_gain(steps, at, len, b, chosen[w[0].0])?;
            let right = best_gain(steps, at, len, b, chosen[w[2].0])?;
            (left < MIN_EFFECT && right < MIN_EFFECT).then_some((left.max(right), w[1]))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, band)| band)
}

/// Hands the band `at..at + len` to its neighbours: all of it to one backend where both are
/// the same, else its first steps to the left one and the rest to the right, split where the
/// fewest steps go against the rule between the two (a tie goes to the one asking less of the
/// engine), then where the medians sum least.
fn merge(steps: &[Step<'_>], chosen: &mut [Backend], at: usize, len: usize) {
    let (left, right) = (chosen[at - 1], chosen[at + len]);
    let band = &steps[at..at + len];
    let prefer = |s: &Step<'_>| {
        let (l, r) = (&s.results[&left], &s.results[&right]);
        if beats(l, r) || (!beats(r, l) && demand(left) < demand(right)) {
            left
        } else if beats(r, l) || demand(right) < demand(left) {
            right
        } else if l.median_us <= r.median_us {
            left
        } else {
            right
        }
    };
    let score = |k: usize| {
        band.iter()
            .enumerate()
            .fold((0usize, 0.0f64), |(against, sum), (i, s)| {
                let b = if i < k { left } else { right };
                (
                    against + usize::from(b != prefer(s)),
                    sum + s.results[&b].median_us,
                )
            })
    };
    let k = (0..=len)
        .min_by(|&a, &b| {
            let (sa, sb) = (score(a), score(b));
            sa.0.cmp(&sb.0).then(sa.1.total_cmp(&sb.1))
        })
        .unwrap_or(len);
    for (i, c) in chosen[at..at + len].iter_mut().enumerate() {
        *c = if i < k { left } else { right };
    }
}

/// What `chosen` costs against the fastest backend measured at each step.
pub fn regret(steps: &[Step<'_>], chosen: &[Backend]) -> Option<Regret> {
    let mut sum_chosen = 0.0;
    let mut sum_best = 0.0;
    let mut worst = (0.0f64, 0u64);
    for (s, b) in steps.iter().zip(chosen) {
        let t = s.results.get(b)?.median_us;
        let best = s
            .results
            .values()
            .map(|t| t.median_us)
            .fold(f64::INFINITY, f64::min);
        sum_chosen += t;
        sum_best += best;
        let r = t / best - 1.0;
        if r > worst.0 {
            worst = (r, s.bytes);
        }
    }
    (sum_best > 0.0).then(|| Regret {
        summed: sum_chosen / sum_best - 1.0,
        worst: worst.0,
        worst_bytes: worst.1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(median: f64) -> Timing {
        Timing {
            median_us: median,
            ci_low_us: median * 0.995,
            ci_high_us: median * 1.005,
            samples: 20,
            outliers: 0,
            model: None,
        }
    }

    fn steps<'a>(rules: &[Backend], results: &'a [BTreeMap<Backend, Timing>]) -> Vec<Step<'a>> {
        rules
            .iter()
            .zip(results)
            .enumerate()
            .map(|(i, (&rule, results))| Step {
                bytes: 1024 << i,
                rule,
                results,
            })
            .collect()
    }

    use Backend::{OneStagePull as Pull, TwoStagePush as Push};

    #[test]
    fn a_one_bucket_excursion_that_ties_is_absorbed() {
        // Push, pull (3% faster than push there: a tie), push: one band of push.
        let r = [
            BTreeMap::from([(Push, t(10.0)), (Pull, t(11.0))]),
            BTreeMap::from([(Push, t(10.3)), (Pull, t(10.0))]),
            BTreeMap::from([(Push, t(10.0)), (Pull, t(11.0))]),
        ];
        let s = steps(&[Push, Pull, Push], &r);
        assert_eq!(smooth(&s), [Push, Push, Push]);
        let g = regret(&s, &smooth(&s)).unwrap();
        assert!((g.worst - 0.03).abs() < 1e-9, "{g:?}");
        assert_eq!(g.worst_bytes, 2048);
    }

    #[test]
    fn a_one_bucket_band_that_wins_clearly_stays() {
        // Pull beats push by 30% at the middle size: push is not admissible there.
        let r = [
            BTreeMap::from([(Push, t(10.0)), (Pull, t(11.0))]),
            BTreeMap::from([(Push, t(13.0)), (Pull, t(10.0))]),
            BTreeMap::from([(Push, t(10.0)), (Pull, t(11.0))]),
        ];
        let s = steps(&[Push, Pull, Push], &r);
        assert_eq!(smooth(&s), [Push, Pull, Push]);
        assert_eq!(regret(&s, &smooth(&s)).unwrap().summed, 0.0);
    }

    #[test]
    fn smoothing_never_chases_a_faster_tie() {
        // The rule says NCCL everywhere (the kernel ties it): the kernel never appears.
        let r = [
            BTreeMap::from([(Backend::Nccl, t(10.0)), (Pull, t(9.8))]),
            BTreeMap::from([(Backend::Nccl, t(10.0)), (Pull, t(9.8))]),
        ];
        let s = steps(&[Backend::Nccl, Backend::Nccl], &r);
        assert_eq!(smooth(&s), [Backend::Nccl, Backend::Nccl]);
        let g = regret(&s, &smooth(&s)).unwrap();
        assert!((g.summed - 0.2 / 9.8).abs() < 1e-9, "{g:?}");
    }

    #[test]
    fn a_band_that_must_earn_its_pin_is_not_stretched_over_ties() {
        // Ring Simple beats NCCL at the middle size only; at its neighbours it ties NCCL.
        // Smoothing may not extend the pin there, so the pin stays a one-size band, and at the
        // neighbours NCCL keeps its own choice.
        let mk = |nccl: f64, ring: f64| {
            BTreeMap::from([(Backend::Nccl, t(nccl)), (Backend::NcclRingSimple, t(ring))])
        };
        let r = [mk(10.0, 9.8), mk(10.0, 8.0), mk(10.0, 9.8)];
        let rules = [Backend::Nccl, Backend::NcclRingSimple, Backend::Nccl];
        let s = steps(&rules, &r);
        assert_eq!(smooth(&s), rules);
        // The other way round NCCL may absorb a tied pin's bucket: it asks nothing.
        let r = [mk(10.0, 9.8), mk(10.0, 9.6), mk(10.0, 9.8)];
        let s = steps(&[Backend::Nccl, Backend::NcclRingSimple, Backend::Nccl], &r);
        assert_eq!(smooth(&s), [Backend::Nccl; 3]);
    }

    #[test]
    fn a_pinned_band_bridges_a_tie_with_nccl_but_is_not_stretched_past_its_wins() {
        // pcie-4x-1switch TP4 graph had ring_simple → nccl → ring_simple where the pin tied
        // NCCL (0.999x) at 52K-64K: three bands where one pinned band gains as much.
        let mk = |nccl: f64, ring: f64| {
            BTreeMap::from([(Backend::Nccl, t(nccl)), (Backend::NcclRingSimple, t(ring))])
        };
        let r = [
            mk(10.0, 9.9),
            mk(10.0, 8.0),
            mk(10.0, 9.99),
            mk(10.0, 10.01),
            mk(10.0, 8.0),
            mk(10.0, 9.9),
        ];
        let rules = [
            Backend::Nccl,
            Backend::NcclRingSimple,
            Backend::Nccl,
            Backend::Nccl,
            Backend::NcclRingSimple,
            Backend::Nccl,
        ];
        let s = steps(&rules, &r);
        assert_eq!(
            smooth(&s),
            [
                Backend::Nccl,
                Backend::NcclRingSimple,
                Backend::NcclRingSimple,
                Backend::NcclRingSimple,
                Backend::NcclRingSimple,
                Backend::Nccl
            ]
        );
        // A gap the pin loses significantly is not bridged.
        let r2 = [
            r[0].clone(),
            r[1].clone(),
            mk(10.0, 12.0),
            r[3].clone(),
            r[4].clone(),
            r[5].clone(),
        ];
        assert_eq!(smooth(&steps(&rules, &r2)), rules);
    }

    #[test]
    fn a_band_that_gains_less_than_the_margin_over_both_neighbours_merges() {
        // pcie-8x-direct-2socket TP2 graph: push, then NCCL where push ties it within the
        // model's band (NCCL at best 0.5% faster), then push again: one band of push.
        let mk = |nccl: f64, push: f64| BTreeMap::from([(Backend::Nccl, t(nccl)), (Push, t(push))]);
        let r = [
            mk(20.0, 10.0),
            mk(20.0, 20.1),
            mk(20.0, 19.0),
            mk(20.0, 10.0),
        ];
        let rules = [Push, Backend::Nccl, Backend::Nccl, Push];
        assert_eq!(smooth(&steps(&rules, &r)), [Push; 4]);
        // A band that gains the margin at one of its sizes stays.
        let r = [
            mk(20.0, 10.0),
            mk(20.0, 21.2),
            mk(20.0, 19.0),
            mk(20.0, 10.0),
        ];
        assert_eq!(smooth(&steps(&rules, &r)), rules);
        // At the ends a band has one neighbour and is no flap.
        let r = [mk(20.0, 20.1), mk(20.0, 10.0), mk(20.0, 10.0)];
        let rules = [Backend::Nccl, Push, Push];
        assert_eq!(smooth(&steps(&rules, &r)), rules);
    }

    #[test]
    fn a_flapping_band_between_two_backends_goes_to_the_rule_between_them() {
        // Push, NCCL tying both, Ring LL: Ring LL ties push at the middle sizes (NCCL asks
        // less than push), so the band goes to the pin, however fast push is modelled.
        let ring = Backend::NcclRingLl;
        let mk = |nccl: f64, ll: f64, push: f64| {
            BTreeMap::from([(Backend::Nccl, t(nccl)), (ring, t(ll)), (Push, t(push))])
        };
        let r = [
            mk(20.0, 20.0, 10.0),
            mk(20.0, 20.1, 19.5),
            mk(20.0, 20.1, 19.5),
            mk(20.0, 10.0, 30.0),
        ];
        let rules = [Push, Backend::Nccl, Backend::Nccl, ring];
        assert_eq!(smooth(&steps(&rules, &r)), [Push, ring, ring, ring]);
    }

    #[test]
    fn a_long_band_change_is_kept() {
        let mk = |push: f64, pull: f64| BTreeMap::from([(Push, t(push)), (Pull, t(pull))]);
        let r = [
            mk(10.0, 20.0),
            mk(10.0, 20.0),
            mk(20.0, 10.0),
            mk(20.0, 10.0),
        ];
        let s = steps(&[Push, Push, Pull, Pull], &r);
        assert_eq!(smooth(&s), [Push, Push, Pull, Pull]);
        assert!(smooth(&[]).is_empty());
    }
}

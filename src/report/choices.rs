//! What a group's choices are and what they pass over: ranges of equal choice, the kernels the
//! memory budget excluded, and why a faster backend was not chosen.

use serde::Serialize;

use crate::allreduce::Backend;
use crate::decide::rule::Short;
use crate::profile::{Bucket, GroupProfile};

/// A run of neighbouring sizes with the same choice.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Range {
    pub from_bytes: u64,
    pub to_bytes: u64,
    pub backend: Backend,
    /// NCCL's time divided by the choice's, lowest and highest over the range (> 1 = faster).
    pub speedup_vs_nccl: Option<(f64, f64)>,
    /// The better one-stage kernel's time divided by the choice's, over the range, when the
    /// choice is not one-stage: how much slower forcing a one-stage allreduce would be.
    pub custom_slowdown: Option<(Backend, f64, f64)>,
    /// Extra memory per GPU the choice costs (custom buffers sized to the range's top).
    pub extra_bytes_per_gpu: u64,
}

fn ratio_range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}

fn median(b: &Bucket, be: Backend) -> Option<f64> {
    b.results.get(&be).map(|t| t.median_us)
}

/// Collapses a group's buckets into ranges of equal choice.
pub fn ranges(g: &GroupProfile) -> Vec<Range> {
    let mut out: Vec<Range> = Vec::new();
    let mut start = 0;
    for i in 0..g.buckets.len() {
        let last = i + 1 == g.buckets.len() || g.buckets[i + 1].choice != g.buckets[i].choice;
        if !last {
            continue;
        }
        let run = &g.buckets[start..=i];
        let backend = run[0].choice;
        let speedup = ratio_range(
            run.iter()
                .filter_map(|b| Some(median(b, Backend::Nccl)? / median(b, backend)?)),
        );
        // What forcing a one-stage kernel (what engines force on PCIe) would cost here.
        let custom_slowdown = if matches!(backend, Backend::OneStagePull | Backend::OneStagePush) {
            None
        } else {
            [Backend::OneStagePull, Backend::OneStagePush]
                .into_iter()
                .filter_map(|c| {
                    let r = ratio_range(
                        run.iter()
                            .filter_map(|b| Some(median(b, c)? / median(b, backend)?)),
                    )?;
                    Some((c, r.0, r.1))
                })
                .min_by(|a, b| (a.1 + a.2).total_cmp(&(b.1 + b.2)))
        };
        let extra = crate::decide::extra_memory(backend, g.ranks(), run[run.len() - 1].bytes);
        out.push(Range {
            from_bytes: run[0].bytes,
            to_bytes: run[run.len() - 1].bytes,
            backend,
            speedup_vs_nccl: speedup,
            custom_slowdown,
            extra_bytes_per_gpu: extra,
        });
        start = i + 1;
    }
    out
}

pub(super) fn fmt_ratio((lo, hi): (f64, f64)) -> String {
    if (hi - lo) / lo.max(1e-9) < 0.05 {
        format!("{lo:.2}x")
    } else {
        format!("{lo:.2}–{hi:.2}x")
    }
}

/// Within this share of 1.0 a ratio is a tie: not "1.00x faster" nor "at best 1.00x faster".
const TIE: f64 = 0.005;

/// A range's time against NCCL's, (lowest, highest) speed-up: "faster" only where it is at
/// every size; a band kept over a tie (stable bands, src/decide/bands.rs) is "up to" its best.
pub(super) fn fmt_speedup((lo, hi): (f64, f64)) -> String {
    if lo >= 1.0 - TIE {
        format!("{} faster", fmt_ratio((lo, hi)))
    } else if hi >= 1.0 + TIE {
        format!("up to {hi:.2}x faster")
    } else {
        format!("{} slower", fmt_ratio((1.0 / hi, 1.0 / lo)))
    }
}

/// What forcing one-stage kernel `c` over a range would cost, from its time over the choice's
/// (lowest, highest). Where it was faster (within the model's error or the sampling intervals,
/// or not worth its memory: the group's other lines say which), say by how much rather than
/// printing "0.96x slower" or nothing.
pub(super) fn forcing_note(c: Backend, lo: f64, hi: f64) -> String {
    if hi < 1.0 + TIE && lo >= 1.0 - TIE {
        String::new()
    } else if hi < 1.0 - TIE {
        let (fast, slow) = (1.0 / lo, 1.0 / hi);
        if (fast - slow) / slow < 0.05 {
            format!("forcing {c}: {fast:.2}x faster")
        } else {
            format!("forcing {c}: {slow:.2}–{fast:.2}x faster")
        }
    } else if hi < 1.0 + TIE {
        format!("forcing {c}: up to {:.2}x faster", 1.0 / lo)
    } else if lo >= 1.0 - TIE {
        let lo = lo.max(1.0);
        if (hi - lo) / lo < 0.05 {
            format!("forcing {c}: {hi:.2}x slower")
        } else {
            format!("forcing {c}: {lo:.2}–{hi:.2}x slower")
        }
    } else {
        format!(
            "forcing {c}: up to {hi:.2}x slower, at best {:.2}x faster",
            1.0 / lo
        )
    }
}

/// A backend the memory budget excluded over a run of sizes, and what it gave up.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OverBudget {
    pub backend: Backend,
    pub from_bytes: u64,
    pub to_bytes: u64,
    /// The profile's choice's time over the excluded backend's, highest over the sizes
    /// (> 1: the excluded kernel would have been faster).
    pub best_speedup: Option<f64>,
}

/// What the memory budget excluded at one bucket: each backend, its time against the
/// bucket's choice (choice over it; > 1 means it was faster), and the reason recorded.
/// The one reading of `Bucket::waived` for `show` and `why`.
pub fn budget_exclusions(b: &Bucket) -> Vec<(Backend, Option<f64>, &str)> {
    b.waived
        .iter()
        .map(|(k, why)| {
            let r = median(b, b.choice).zip(median(b, *k)).map(|(c, x)| c / x);
            (*k, r, why.as_str())
        })
        .collect()
}

/// Per backend, the sizes the memory budget excluded it from (first to last), and the most
/// it would have gained there.
pub fn over_budget(g: &GroupProfile) -> Vec<OverBudget> {
    let mut out: Vec<OverBudget> = Vec::new();
    for b in &g.buckets {
        for (k, r, _) in budget_exclusions(b) {
            match out.iter_mut().find(|o| o.backend == k) {
                Some(o) => {
                    o.to_bytes = b.bytes;
                    o.best_speedup = match (o.best_speedup, r) {
                        (Some(x), Some(y)) => Some(x.max(y)),
                        (x, y) => x.or(y),
                    };
                }
                None => out.push(OverBudget {
                    backend: k,
                    from_bytes: b.bytes,
                    to_bytes: b.bytes,
                    best_speedup: r,
                }),
            }
        }
    }
    out
}

/// Why a backend faster than the choice at a size was not chosen there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PassedOver {
    /// Its buffers for that size exceed the memory budget.
    OverBudget,
    /// Its lead lies within the model's error (a simulated profile): not sure; a
    /// measurement on the machine decides.
    WithinModel,
    /// Not significantly faster by the rule (the intervals overlap, or by under 5%), or kept
    /// in its neighbours' band.
    NotSignificant,
}

impl PassedOver {
    pub fn why(self) -> &'static str {
        match self {
            PassedOver::OverBudget => "over the memory budget",
            PassedOver::WithinModel => "not sure: within the model's error",
            PassedOver::NotSignificant => "not significantly faster, or kept in the band",
        }
    }
}

/// Per size, each backend whose median beats the choice's by more than the rule's effect
/// ([`crate::decide::MIN_EFFECT`]), and why it was not chosen, as the rule's verdict at that
/// size says (over the budget where the bucket excluded it, within the model's error where its
/// margin was, else not significant or kept in the band): what a plot or a table must say
/// wherever it shows a backend faster than the choice.
pub fn passed_over(g: &GroupProfile) -> Vec<(u64, Backend, PassedOver)> {
    let mut out = Vec::new();
    for b in &g.buckets {
        let Some(chosen) = b.results.get(&b.choice) else {
            continue;
        };
        let verdict = crate::decide::rule_verdict(&b.eligible(), g.ranks(), b.bytes);
        for (k, t) in &b.results {
            if *k == b.choice || t.median_us * (1.0 + crate::decide::MIN_EFFECT) >= chosen.median_us
            {
                continue;
            }
            let short = verdict.as_ref().and_then(|v| v.short_of(*k));
            let why = match short {
                _ if b.waived.contains_key(k) => PassedOver::OverBudget,
                Some(Short::WithinModel { .. }) => PassedOver::WithinModel,
                _ => PassedOver::NotSignificant,
            };
            out.push((b.bytes, *k, why));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::Timing;

    #[test]
    fn a_speedup_below_one_is_never_called_faster() {
        assert_eq!(fmt_speedup((1.21, 1.3)), "1.21–1.30x faster");
        assert_eq!(fmt_speedup((0.99, 1.21)), "up to 1.21x faster");
        assert_eq!(fmt_speedup((0.9, 0.95)), "1.05–1.11x slower");
    }

    #[test]
    fn forcing_note_never_calls_a_faster_kernel_slower() {
        let c = Backend::OneStagePull;
        for (lo, hi, want) in [
            (1.5, 1.52, "forcing one_stage_pull: 1.52x slower"),
            (1.0, 7.1, "forcing one_stage_pull: 1.00–7.10x slower"),
            (
                0.96,
                22.12,
                "forcing one_stage_pull: up to 22.12x slower, at best 1.04x faster",
            ),
            // Faster at every size (a simulated choice within the model's error): said, not
            // left blank.
            (0.45, 0.58, "forcing one_stage_pull: 1.72–2.22x faster"),
            (0.5, 0.51, "forcing one_stage_pull: 2.00x faster"),
            (0.9, 1.001, "forcing one_stage_pull: up to 1.11x faster"),
            (0.998, 1.003, ""),
        ] {
            assert_eq!(forcing_note(c, lo, hi), want, "{lo} {hi}");
        }
    }

    /// Two kernels of one model family share its error, so a tie between them is the sampling
    /// intervals' alone: the faster kernel passed over for the one with less memory is "not
    /// significant", as the rule's verdict says, never "within the model's error".
    #[test]
    fn passed_over_says_what_the_rules_verdict_says() {
        use crate::profile::{ModelBand, ModelFamily};
        let mut g = crate::profile::tests::fixture().groups[0].clone();
        let ranks = g.ranks();
        let b = &mut g.buckets[0];
        let timed = |us: f64, half: f64, family| Timing {
            median_us: us,
            ci_low_us: us - half,
            ci_high_us: us + half,
            samples: 20,
            outliers: 0,
            model: Some(ModelBand {
                low: 0.5,
                high: 2.0,
                assumed: false,
                family: Some(family),
            }),
        };
        let lean = Backend::OneStagePull;
        let extra = |k| crate::decide::extra_memory(k, ranks, 4096);
        let fat = Backend::ALL
            .into_iter()
            .find(|&k| k.is_custom() && !k.is_hierarchical() && extra(k) > extra(lean))
            .unwrap();
        b.results = [
            (Backend::Nccl, timed(100.0, 1.0, ModelFamily::Nccl)),
            (lean, timed(20.0, 3.0, ModelFamily::Custom)),
            (fat, timed(18.0, 3.0, ModelFamily::Custom)),
        ]
        .into();
        let v = crate::decide::rule_verdict(&b.results, ranks, b.bytes).unwrap();
        assert_eq!((v.choice, v.tie), (lean, Some(fat)), "{v:?}");
        b.choice = lean;
        let bytes = b.bytes;
        let passed: Vec<_> = passed_over(&g)
            .into_iter()
            .filter(|(at, ..)| *at == bytes)
            .collect();
        assert_eq!(passed, [(bytes, fat, PassedOver::NotSignificant)]);
    }

    #[test]
    fn ranges_merge_equal_choices() {
        let p = crate::profile::tests::fixture();
        let r = ranges(&p.groups[0]);
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].from_bytes, r[0].to_bytes, r[0].backend),
            (4096, 8192, Backend::OneStagePull)
        );
        assert_eq!(r[1].backend, Backend::Nccl);
    }
}

//! Two profiles of the same machine side by side: a simulated one against one measured on the
//! box, two machines, two driver versions, or a fast tune against the exhaustive reference.
//! How much A's choices would cost if B's measurements are the truth (regret), and where their
//! crossovers differ.
//!
//! Raw figures measure noise as well as choices: two reference runs of one machine differ by
//! 5–7% at single sizes and place tied kernels' band edges anywhere in the tie. So the worst
//! size is also judged by its *significant* regret (the part beyond B's confidence intervals),
//! and a crossover without a counterpart within a step is *tied*, not a miss, where B's own
//! rule cannot tell A's choice from B's anywhere in between, its intervals included
//! ([`decide::beats_settled`]): a verdict they leave open at the 5% effect could go either way. The summed
//! regret stays raw: it is the expected cost.
//!
//! Groups are matched by TP size and mode (and GPUs, when both profiles have that group).
//! Each of B's buckets is a size an engine may send; A answers it as an engine following A
//! would, through A's [`Selector`], so profiles with different grids (a refined fast tune
//! and the fine reference grid) compare size for size.

use serde::Serialize;

use crate::decide;
use crate::fabric::{Backend, Dtype, Mode};
use crate::plan;
use crate::profile::{Crossover, GroupProfile, Profile, Query, Selector};

/// Why two profiles cannot be compared.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CompareError {
    #[error("the profiles share no TP size and mode (A has {a}, B has {b}); tune both with the same --tp and --mode")]
    NoCommonGroup { a: String, b: String },
    #[error("TP{tp} {mode} is {a} in A and {b} in B; tune both with the same --dtype")]
    Dtype {
        tp: usize,
        mode: &'static str,
        a: &'static str,
        b: &'static str,
    },
}

/// One of B's buckets, answered by A and timed by B.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BucketRegret {
    /// B's bucket size.
    pub bytes: u64,
    /// What A chooses for a message of `bytes`.
    pub a_choice: Backend,
    pub b_choice: Backend,
    /// B's median for A's choice; None when B did not measure it (waived there).
    pub a_choice_us: Option<f64>,
    /// B's median for B's own choice.
    pub b_choice_us: f64,
    /// `a_choice_us − b_choice_us` (never below 0), µs; None as above.
    pub regret_us: Option<f64>,
    /// The regret B's intervals can tell from noise: B's interval low for A's choice minus its
    /// interval high for B's choice (never below 0), µs; None as above.
    pub significant_us: Option<f64>,
    /// Whether B's choice beats A's choice by B's own rule with the effect beyond B's
    /// intervals ([`decide::beats_settled`]), so no number of samples would make them a tie;
    /// None as above.
    pub b_beats_a: Option<bool>,
}

impl BucketRegret {
    pub fn regret_pct(&self) -> Option<f64> {
        self.regret_us.map(|r| 100.0 * r / self.b_choice_us)
    }

    pub fn significant_pct(&self) -> Option<f64> {
        self.significant_us.map(|r| 100.0 * r / self.b_choice_us)
    }

    /// B cannot tell A's choice here from its own: the same backend, one its rule does not
    /// beat, or one it beats only by a verdict its intervals leave open (a close call its caps
    /// could not settle). Unmeasured is not a tie: nothing shows it is one.
    fn tied(&self) -> bool {
        self.b_beats_a == Some(false)
    }
}

/// One profile's crossover, looked for in the other's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CrossoverMatch {
    #[serde(flatten)]
    pub crossover: Crossover,
    /// The other profile's crossover between the same two backends, in the same direction,
    /// nearest in size; None if it has none.
    pub nearest_bytes: Option<u64>,
    /// Whether `nearest_bytes` is within one refinement step ([`plan::within_step`]): the
    /// resolution a refined tune finds crossovers to.
    pub within_step: bool,
    /// B's sizes (first and last) judged when not `within_step`: from this crossover to its
    /// nearest counterpart, widened by the sizes next to them where the choices differ.
    pub span: Option<[u64; 2]>,
    /// Not within a step, but B's rule cannot tell A's choice from B's at any size of `span`:
    /// the two placements are equally right, and this is no miss.
    pub tied: bool,
}

impl CrossoverMatch {
    /// No counterpart within a step, and not a tie either.
    pub fn missed(&self) -> bool {
        !self.within_step && !self.tied
    }
}

/// One matched group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupComparison {
    pub tp: usize,
    pub mode: Mode,
    pub gpus: Vec<usize>,
    pub placement: String,
    /// B's buckets A serves (those above A's largest bucket are left out and counted).
    pub buckets: Vec<BucketRegret>,
    /// Regret summed over `buckets` where B measured A's choice, µs (one call per bucket).
    pub regret_sum_us: f64,
    /// B's choices' time over the same buckets, µs: what `regret_sum_us` is relative to.
    pub b_sum_us: f64,
    /// `regret_sum_us` as a percentage of `b_sum_us`.
    pub regret_sum_pct: f64,
    /// The bucket of largest regret relative to B's choice, if any regret.
    pub worst: Option<BucketRegret>,
    /// `worst`'s regret, % of B's choice there (0 without regret).
    pub worst_pct: f64,
    /// The bucket of largest significant regret, if any: what the worst-size bound judges.
    pub worst_significant: Option<BucketRegret>,
    /// `worst_significant`'s significant regret, % of B's choice there (0 without).
    pub worst_significant_pct: f64,
    /// B's buckets whose size A's choice there B did not measure.
    pub unmeasured: usize,
    /// B's buckets above A's largest, which A does not serve.
    pub beyond_a: usize,
    pub crossovers_a: Vec<Crossover>,
    pub crossovers_b: Vec<Crossover>,
    /// Each of A's crossovers looked for in B, and each of B's in A.
    pub a_in_b: Vec<CrossoverMatch>,
    pub b_in_a: Vec<CrossoverMatch>,
    /// No crossover missed: every crossover of either profile has one in the other within one
    /// refinement step, or is tied ([`CrossoverMatch::tied`]).
    pub crossovers_within_step: bool,
    /// Crossovers of either profile without a counterpart within a step, tied ones included:
    /// the raw count.
    pub crossovers_off_step: usize,
    /// Of those, the tied ones.
    pub crossovers_tied: usize,
}

impl GroupComparison {
    /// Whether the two profiles change backend at different places (or to different ones).
    pub fn crossovers_differ(&self) -> bool {
        self.crossovers_a != self.crossovers_b
    }

    /// The crossovers of either profile, looked for in the other.
    pub fn all_matches(&self) -> impl Iterator<Item = &CrossoverMatch> {
        self.a_in_b.iter().chain(&self.b_in_a)
    }
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub a_fabric: String,
    pub b_fabric: String,
    pub a_simulated: bool,
    pub b_simulated: bool,
    pub a_sampling: &'static str,
    pub b_sampling: &'static str,
    pub groups: Vec<GroupComparison>,
    /// A's groups ("TP4 eager") with no counterpart in B, not compared.
    pub only_in_a: Vec<String>,
}

fn mode_id(m: Mode) -> &'static str {
    match m {
        Mode::Graph => "graph",
        Mode::Eager => "eager",
    }
}

fn dtype_id(d: Dtype) -> &'static str {
    d.id()
}

fn key(g: &GroupProfile) -> String {
    format!("TP{} {}", g.tp, mode_id(g.mode))
}

fn keys(p: &Profile) -> String {
    let mut k: Vec<String> = p.groups.iter().map(key).collect();
    k.dedup();
    if k.is_empty() {
        "no groups".into()
    } else {
        k.join(", ")
    }
}

/// B's group for A's group `g`: the same GPUs, else B's default placement of that TP and mode.
fn partner<'b>(g: &GroupProfile, b: &'b Profile) -> Option<&'b GroupProfile> {
    let q = |gpus| Query {
        tp: g.tp,
        mode: g.mode,
        gpus,
    };
    b.group(q(Some(&g.gpus))).or_else(|| b.group(q(None)))
}

/// The indices of B's buckets a crossover off step is judged over: those from `c` to its
/// counterpart `nearest` (or at `c` alone), widened on both sides while A's and B's choices
/// differ. None when no bucket of B lies there.
fn span(c: u64, nearest: Option<u64>, buckets: &[BucketRegret]) -> Option<(usize, usize)> {
    let (lo, hi) = match nearest {
        Some(n) => (c.min(n), c.max(n)),
        None => (c, c),
    };
    let first = buckets.partition_point(|b| b.bytes < lo);
    let last = buckets.partition_point(|b| b.bytes <= hi);
    // No bucket inside: the one B has next above `lo`.
    let (mut i, mut j) = (first, last.max(first + 1).min(buckets.len()));
    if i >= j {
        return None;
    }
    let differ = |b: &BucketRegret| b.a_choice != b.b_choice;
    while i > 0 && differ(&buckets[i - 1]) {
        i -= 1;
    }
    while j < buckets.len() && differ(&buckets[j]) {
        j += 1;
    }
    Some((i, j))
}

/// Each of `mine` looked for among `theirs`; those off step judged over B's `buckets`.
fn matches(
    mine: &[Crossover],
    theirs: &[Crossover],
    align: u64,
    buckets: &[BucketRegret],
) -> Vec<CrossoverMatch> {
    mine.iter()
        .map(|c| {
            let nearest = theirs
                .iter()
                .filter(|t| t.from == c.from && t.to == c.to)
                .map(|t| t.bytes)
                .min_by_key(|&b| b.abs_diff(c.bytes));
            let within_step = nearest.is_some_and(|b| plan::within_step(b, c.bytes, align));
            let span = (!within_step)
                .then(|| span(c.bytes, nearest, buckets))
                .flatten();
            CrossoverMatch {
                crossover: c.clone(),
                nearest_bytes: nearest,
                within_step,
                span: span.map(|(i, j)| [buckets[i].bytes, buckets[j - 1].bytes]),
                tied: span.is_some_and(|(i, j)| buckets[i..j].iter().all(BucketRegret::tied)),
            }
        })
        .collect()
}

fn share(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        100.0 * part / whole
    } else {
        0.0
    }
}

/// The bucket where `by` is largest, among those where it is above 0.
fn worst_by(
    buckets: &[BucketRegret],
    by: fn(&BucketRegret) -> Option<f64>,
) -> Option<BucketRegret> {
    buckets
        .iter()
        .filter(|b| by(b).is_some_and(|r| r > 0.0))
        .max_by(|x, y| {
            let pct = |b: &BucketRegret| share(by(b).unwrap_or(0.0), b.b_choice_us);
            pct(x).total_cmp(&pct(y))
        })
        .cloned()
}

fn group(sel: &Selector, g: &GroupProfile, h: &GroupProfile) -> GroupComparison {
    let mine = sel.group(Query {
        tp: g.tp,
        mode: g.mode,
        gpus: Some(&g.gpus),
    });
    let mut beyond_a = 0;
    let buckets: Vec<BucketRegret> = h
        .buckets
        .iter()
        .filter_map(|kb| {
            let Some((_, answer)) = mine.and_then(|m| m.at(kb.bytes)) else {
                beyond_a += 1;
                return None;
            };
            let best = kb.results.get(&kb.choice)?;
            let theirs = kb.results.get(&answer.backend);
            Some(BucketRegret {
                bytes: kb.bytes,
                a_choice: answer.backend,
                b_choice: kb.choice,
                a_choice_us: theirs.map(|t| t.median_us),
                b_choice_us: best.median_us,
                regret_us: theirs.map(|t| (t.median_us - best.median_us).max(0.0)),
                significant_us: theirs.map(|t| (t.ci_low_us - best.ci_high_us).max(0.0)),
                b_beats_a: theirs.map(|t| decide::beats_settled(best, t)),
            })
        })
        .collect();
    let measured = || buckets.iter().filter(|b| b.regret_us.is_some());
    let regret_sum_us: f64 = measured().filter_map(|b| b.regret_us).sum();
    let b_sum_us: f64 = measured().map(|b| b.b_choice_us).sum();
    let worst = worst_by(&buckets, |b| b.regret_us);
    let worst_significant = worst_by(&buckets, |b| b.significant_us);
    let align = plan::alignment(g.tp, g.dtype);
    let a_in_b = matches(&g.crossovers, &h.crossovers, align, &buckets);
    let b_in_a = matches(&h.crossovers, &g.crossovers, align, &buckets);
    let off_step = || a_in_b.iter().chain(&b_in_a).filter(|m| !m.within_step);
    GroupComparison {
        tp: g.tp,
        mode: g.mode,
        gpus: g.gpus.clone(),
        placement: g.placement.clone(),
        unmeasured: buckets.iter().filter(|b| b.regret_us.is_none()).count(),
        beyond_a,
        regret_sum_us,
        b_sum_us,
        regret_sum_pct: share(regret_sum_us, b_sum_us),
        worst_pct: worst
            .as_ref()
            .and_then(BucketRegret::regret_pct)
            .unwrap_or(0.0),
        worst,
        worst_significant_pct: worst_significant
            .as_ref()
            .and_then(BucketRegret::significant_pct)
            .unwrap_or(0.0),
        worst_significant,
        buckets,
        crossovers_a: g.crossovers.clone(),
        crossovers_b: h.crossovers.clone(),
        crossovers_within_step: !off_step().any(CrossoverMatch::missed),
        crossovers_off_step: off_step().count(),
        crossovers_tied: off_step().filter(|m| m.tied).count(),
        a_in_b,
        b_in_a,
    }
}

/// Compares A's choices against B's measurements, group by group.
pub fn compare(a: &Profile, b: &Profile) -> Result<Comparison, CompareError> {
    let sel = a.selector();
    let mut groups = Vec::new();
    let mut only_in_a = Vec::new();
    for g in &a.groups {
        let Some(h) = partner(g, b) else {
            only_in_a.push(key(g));
            continue;
        };
        if g.dtype != h.dtype {
            return Err(CompareError::Dtype {
                tp: g.tp,
                mode: mode_id(g.mode),
                a: dtype_id(g.dtype),
                b: dtype_id(h.dtype),
            });
        }
        groups.push(group(&sel, g, h));
    }
    if groups.is_empty() {
        return Err(CompareError::NoCommonGroup {
            a: keys(a),
            b: keys(b),
        });
    }
    only_in_a.dedup();
    Ok(Comparison {
        a_fabric: a.fabric.clone(),
        b_fabric: b.fabric.clone(),
        a_simulated: a.simulated,
        b_simulated: b.simulated,
        a_sampling: a.settings.sampling.id(),
        b_sampling: b.settings.sampling.id(),
        groups,
        only_in_a,
    })
}

fn label(fabric: &str, simulated: bool, sampling: &str) -> String {
    let fabric = if simulated && !fabric.starts_with("simulated") {
        format!("simulated {fabric}")
    } else {
        fabric.to_string()
    };
    format!("{fabric} ({sampling} sampling)")
}

fn crossings(c: &[Crossover]) -> String {
    if c.is_empty() {
        return "none".into();
    }
    c.iter()
        .map(|x| format!("{} {}→{}", crate::units::fmt_bytes(x.bytes), x.from, x.to))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The crossovers off step that `pick` keeps, in words.
fn off_step(
    ms: &[CrossoverMatch],
    mine: &str,
    other: &str,
    pick: fn(&CrossoverMatch) -> bool,
) -> Vec<String> {
    use crate::units::fmt_bytes;
    ms.iter()
        .filter(|m| !m.within_step && pick(m))
        .map(|m| {
            let c = &m.crossover;
            let at = fmt_bytes(c.bytes);
            let mut w = match m.nearest_bytes {
                Some(n) => format!(
                    "{mine}'s {}→{} at {at}, nearest in {other} at {}",
                    c.from,
                    c.to,
                    fmt_bytes(n)
                ),
                None => format!("{mine}'s {}→{} at {at}, none in {other}", c.from, c.to),
            };
            if m.tied {
                if let Some([lo, hi]) = m.span {
                    w += &format!(
                        ", B cannot tell the choices apart over {}..{}",
                        fmt_bytes(lo),
                        fmt_bytes(hi)
                    );
                }
            }
            w
        })
        .collect()
}

/// The comparison in words: per group the regret (summed and worst bucket), the buckets
/// where the choices differ, and whether the crossovers agree to within one refinement step.
pub fn render(c: &Comparison) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "A: {}\nB: {}\nRegret: what A's choice costs over B's choice, timed by B's measurements at B's sizes.",
        label(&c.a_fabric, c.a_simulated, c.a_sampling),
        label(&c.b_fabric, c.b_simulated, c.b_sampling)
    );
    for k in &c.only_in_a {
        let _ = writeln!(s, "A's {k} has no counterpart in B: not compared");
    }
    for g in &c.groups {
        let _ = writeln!(
            s,
            "\nTP{} {} (GPUs {:?}{}):",
            g.tp,
            mode_id(g.mode),
            g.gpus,
            if g.placement.is_empty() {
                String::new()
            } else {
                format!(", {}", g.placement)
            }
        );
        let same = g
            .buckets
            .iter()
            .filter(|b| b.a_choice == b.b_choice)
            .count();
        let _ = writeln!(
            s,
            "  same choice in {same} of {} sizes; regret {} ({:.2}%) summed over one call per size",
            g.buckets.len(),
            crate::units::fmt_us(g.regret_sum_us),
            g.regret_sum_pct
        );
        match &g.worst {
            Some(w) => {
                let _ = writeln!(
                    s,
                    "  worst: {} at {} ({:.1}%): A chose {}, B chose {}",
                    crate::units::fmt_us(w.regret_us.unwrap_or(0.0)),
                    crate::units::fmt_bytes(w.bytes),
                    w.regret_pct().unwrap_or(0.0),
                    w.a_choice,
                    w.b_choice
                );
                match &g.worst_significant {
                    Some(w) => {
                        let _ = writeln!(
                            s,
                            "  worst beyond B's intervals: {} at {} ({:.1}%): A chose {}, B chose {}",
                            crate::units::fmt_us(w.significant_us.unwrap_or(0.0)),
                            crate::units::fmt_bytes(w.bytes),
                            w.significant_pct().unwrap_or(0.0),
                            w.a_choice,
                            w.b_choice
                        );
                    }
                    None => {
                        let _ = writeln!(
                            s,
                            "  worst beyond B's intervals: none (every regret is within B's noise)"
                        );
                    }
                }
            }
            None => {
                let _ = writeln!(
                    s,
                    "  no regret: A's choices are as fast as B's (or B did not measure them)"
                );
            }
        }
        if g.unmeasured > 0 {
            let _ = writeln!(
                s,
                "  {} sizes where B did not measure A's choice (waived there)",
                g.unmeasured
            );
        }
        if g.beyond_a > 0 {
            let _ = writeln!(
                s,
                "  {} of B's sizes lie above A's largest: not compared",
                g.beyond_a
            );
        }
        for b in g.buckets.iter().filter(|b| b.a_choice != b.b_choice) {
            let a = b
                .a_choice_us
                .map_or("not measured".into(), crate::units::fmt_us);
            let _ = writeln!(
                s,
                "    {:>9}  A {} ({a} in B)  B {} ({})",
                crate::units::fmt_bytes(b.bytes),
                b.a_choice,
                b.b_choice,
                crate::units::fmt_us(b.b_choice_us)
            );
        }
        if g.crossovers_differ() {
            let _ = writeln!(s, "  crossovers differ:");
            let _ = writeln!(s, "    A: {}", crossings(&g.crossovers_a));
            let _ = writeln!(s, "    B: {}", crossings(&g.crossovers_b));
        } else {
            let _ = writeln!(s, "  crossovers agree: {}", crossings(&g.crossovers_a));
        }
        let mut tied = off_step(&g.a_in_b, "A", "B", |m| m.tied);
        tied.extend(off_step(&g.b_in_a, "B", "A", |m| m.tied));
        let tied = if tied.is_empty() {
            String::new()
        } else {
            format!("{} tied: {}", tied.len(), tied.join("; "))
        };
        if g.crossovers_within_step {
            let tied = if tied.is_empty() {
                tied
            } else {
                format!(" ({tied})")
            };
            let _ = writeln!(s, "  crossovers within one refinement step: yes{tied}");
        } else {
            let mut m = off_step(&g.a_in_b, "A", "B", CrossoverMatch::missed);
            m.extend(off_step(&g.b_in_a, "B", "A", CrossoverMatch::missed));
            let tied = if tied.is_empty() {
                tied
            } else {
                format!("; {tied}")
            };
            let _ = writeln!(
                s,
                "  crossovers within one refinement step: no ({} missed: {}{tied})",
                m.len(),
                m.join("; ")
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::Backend;
    use crate::profile::{Bucket, Timing};

    fn timing(us: f64) -> Timing {
        Timing {
            median_us: us,
            ci_low_us: us * 0.99,
            ci_high_us: us * 1.01,
            samples: 10,
            outliers: 0,
            model: None,
        }
    }

    fn bucket(bytes: u64, choice: Backend, times: &[(Backend, f64)]) -> Bucket {
        Bucket {
            bytes,
            choice,
            nccl_choice: None,
            results: times.iter().map(|&(b, t)| (b, timing(t))).collect(),
            waived: Default::default(),
        }
    }

    fn profile(buckets: Vec<Bucket>, dtype: Dtype) -> Profile {
        let mut p = crate::profile::tests::fixture();
        p.groups.truncate(1);
        p.groups[0].crossovers = crate::decide::crossovers(&buckets);
        p.groups[0].buckets = buckets;
        p.groups[0].dtype = dtype;
        p
    }

    #[test]
    fn a_coarse_profile_answers_a_fine_one_as_an_engine_would() {
        let (n, o) = (Backend::Nccl, Backend::OneStagePush);
        // A (a fast tune) saw only 4K and 64K; B (the reference) every size in between.
        let a = profile(
            vec![
                bucket(4096, o, &[(n, 20.0), (o, 8.0)]),
                bucket(65536, n, &[(n, 30.0), (o, 40.0)]),
            ],
            Dtype::Bf16,
        );
        let b = profile(
            vec![
                bucket(4096, o, &[(n, 20.0), (o, 8.0)]),
                bucket(16384, o, &[(n, 20.0), (o, 10.0)]),
                bucket(32768, n, &[(n, 25.0), (o, 30.0)]),
                bucket(65536, n, &[(n, 30.0), (o, 40.0)]),
                bucket(131072, n, &[(n, 40.0), (o, 80.0)]),
            ],
            Dtype::Bf16,
        );
        let c = compare(&a, &b).unwrap();
        let g = &c.groups[0];
        // A's 64K bucket serves 16K: NCCL there, 10 us slower than B's choice.
        let at16 = g.buckets.iter().find(|k| k.bytes == 16384).unwrap();
        assert_eq!((at16.a_choice, at16.regret_us), (n, Some(10.0)));
        assert_eq!(g.buckets.len(), 4);
        assert_eq!(g.beyond_a, 1);
        assert_eq!(g.regret_sum_us, 10.0);
        assert_eq!(g.b_sum_us, 8.0 + 10.0 + 25.0 + 30.0);
        assert!((g.regret_sum_pct - 1000.0 / 73.0).abs() < 1e-9);
        assert_eq!(g.worst.as_ref().unwrap().bytes, 16384);
        // A crosses at 64K, B at 32K: an octave apart, far more than one refinement step.
        assert!(!g.crossovers_within_step);
        assert_eq!(g.a_in_b[0].nearest_bytes, Some(32768));
        let text = render(&c);
        assert!(
            text.contains("1 of B's sizes lie above A's largest"),
            "{text}"
        );
        assert!(
            text.contains("crossovers within one refinement step: no (2 missed: A's one_stage_push→nccl at 64K, nearest in B at 32K"),
            "{text}"
        );
    }

    #[test]
    fn crossovers_match_within_one_step_between_the_same_backends() {
        let (n, o, p) = (Backend::Nccl, Backend::OneStagePush, Backend::OneStagePull);
        let x = |bytes: u64, from, to| Crossover { bytes, from, to };
        let mib = 1u64 << 20;
        let m = matches(&[x(mib, o, n)], &[x(mib + mib / 8, o, n)], 256, &[]);
        assert!(m[0].within_step);
        let m = matches(&[x(mib, o, n)], &[x(mib + mib / 4, o, n)], 256, &[]);
        assert!(!m[0].within_step);
        // Near in size, but between other backends: no match.
        let m = matches(&[x(mib, o, n)], &[x(mib, p, n)], 256, &[]);
        assert_eq!((m[0].nearest_bytes, m[0].within_step), (None, false));
        // Off step with no size of B to judge it by: a miss, not a tie.
        assert!(m[0].missed() && m[0].span.is_none());
    }

    #[test]
    fn regret_is_a_choice_timed_by_b() {
        let (n, o) = (Backend::Nccl, Backend::OneStagePush);
        let a = profile(
            vec![
                bucket(4096, o, &[(n, 20.0), (o, 8.0)]),
                bucket(65536, o, &[(n, 30.0), (o, 25.0)]),
            ],
            Dtype::Bf16,
        );
        let b = profile(
            vec![
                bucket(4096, o, &[(n, 22.0), (o, 9.0)]),
                bucket(65536, n, &[(n, 28.0), (o, 40.0)]),
            ],
            Dtype::Bf16,
        );
        let c = compare(&a, &b).unwrap();
        let g = &c.groups[0];
        assert_eq!(g.buckets[0].regret_us, Some(0.0));
        assert_eq!(g.buckets[1].regret_us, Some(12.0));
        assert_eq!(g.regret_sum_us, 12.0);
        assert_eq!(g.worst.as_ref().unwrap().bytes, 65536);
        assert!(render(&c).contains("worst: 12"), "{}", render(&c));
        // Against itself: no regret.
        let same = compare(&b, &b).unwrap();
        assert_eq!(same.groups[0].regret_sum_us, 0.0);
        assert!(!same.groups[0].crossovers_differ());
    }

    fn spread(us: f64, half: f64) -> Timing {
        Timing {
            median_us: us,
            ci_low_us: us - half,
            ci_high_us: us + half,
            samples: 10,
            outliers: 0,
            model: None,
        }
    }

    fn noisy(bytes: u64, choice: Backend, times: &[(Backend, f64, f64)]) -> Bucket {
        Bucket {
            bytes,
            choice,
            nccl_choice: None,
            results: times.iter().map(|&(b, t, h)| (b, spread(t, h))).collect(),
            waived: Default::default(),
        }
    }

    #[test]
    fn significant_regret_is_what_lies_beyond_b_intervals() {
        let (n, o) = (Backend::Nccl, Backend::OneStagePush);
        let a = profile(
            vec![noisy(4096, o, &[(n, 20.0, 0.2), (o, 10.0, 0.1)])],
            Dtype::Bf16,
        );
        // B: NCCL 7% faster than A's choice, ±2%: a raw regret over 5%, 3% beyond the noise.
        let b = profile(
            vec![noisy(4096, n, &[(n, 100.0, 2.0), (o, 107.0, 2.0)])],
            Dtype::Bf16,
        );
        let c = compare(&a, &b).unwrap();
        let g = &c.groups[0];
        let k = &g.buckets[0];
        assert_eq!((k.regret_us, k.significant_us), (Some(7.0), Some(3.0)));
        // B's rule picks NCCL, but its intervals allow an advantage of 3% as well as 11%: a
        // verdict they leave open, so no placement of a crossover here is a miss.
        assert_eq!(k.b_beats_a, Some(false));
        assert!((g.worst_pct - 7.0).abs() < 1e-9 && (g.worst_significant_pct - 3.0).abs() < 1e-9);
        let text = render(&c);
        assert!(text.contains("worst: 7.0 us at 4K (7.0%)"), "{text}");
        assert!(
            text.contains("worst beyond B's intervals: 3.0 us at 4K (3.0%)"),
            "{text}"
        );
        // Overlapping intervals: a raw regret, none beyond the noise.
        let b = profile(
            vec![noisy(4096, n, &[(n, 100.0, 2.0), (o, 103.0, 2.0)])],
            Dtype::Bf16,
        );
        let g = &compare(&a, &b).unwrap().groups[0];
        assert_eq!(g.buckets[0].significant_us, Some(0.0));
        assert!(g.worst_significant.is_none() && g.worst_pct > 2.9);
        // 20% slower with the same intervals: beaten whatever more samples say.
        let b = profile(
            vec![noisy(4096, n, &[(n, 100.0, 2.0), (o, 120.0, 2.0)])],
            Dtype::Bf16,
        );
        assert_eq!(
            compare(&a, &b).unwrap().groups[0].buckets[0].b_beats_a,
            Some(true)
        );
    }

    /// A with an NCCL→kernel crossover two octaves below B's: off step either way.
    fn apart(kernel_us_at_8k: f64) -> Comparison {
        let (n, o) = (Backend::Nccl, Backend::OneStagePush);
        let row =
            |bytes, choice, nccl, kernel| noisy(bytes, choice, &[(n, nccl, 1.0), (o, kernel, 1.0)]);
        let a = profile(
            vec![
                row(4096, n, 50.0, 60.0),
                row(8192, o, 50.0, 40.0),
                row(16384, o, 60.0, 40.0),
                row(32768, o, 80.0, 40.0),
            ],
            Dtype::Bf16,
        );
        let b = profile(
            vec![
                row(4096, n, 50.0, 60.0),
                row(8192, n, 50.0, kernel_us_at_8k),
                row(16384, n, 50.0, 49.0),
                row(32768, o, 80.0, 40.0),
            ],
            Dtype::Bf16,
        );
        compare(&a, &b).unwrap()
    }

    #[test]
    fn a_crossover_off_step_is_tied_where_b_cannot_tell_the_choices_apart() {
        // B's kernel is within its noise of NCCL at 8K and 16K: B keeps NCCL (no memory),
        // A switched earlier. Equally right: tied, no miss.
        let c = apart(51.0);
        let g = &c.groups[0];
        assert_eq!((g.crossovers_off_step, g.crossovers_tied), (2, 2));
        assert!(g.crossovers_within_step);
        assert_eq!(g.a_in_b[0].span, Some([8192, 32768]));
        let text = render(&c);
        assert!(
            text.contains("crossovers within one refinement step: yes (2 tied: A's nccl→one_stage_push at 8K, nearest in B at 32K, B cannot tell the choices apart over 8K..32K"),
            "{text}"
        );
        // At 8K the kernel is 40% slower in B: B's rule tells them apart, a miss.
        let c = apart(70.0);
        let g = &c.groups[0];
        assert_eq!((g.crossovers_off_step, g.crossovers_tied), (2, 0));
        assert!(!g.crossovers_within_step && g.a_in_b[0].missed());
        assert!(render(&c).contains("no (2 missed: A's nccl→one_stage_push at 8K"));
    }

    #[test]
    fn different_dtype_or_no_common_group_is_refused() {
        let n = Backend::Nccl;
        let a = profile(vec![bucket(4096, n, &[(n, 20.0)])], Dtype::Bf16);
        let b = profile(vec![bucket(4096, n, &[(n, 20.0)])], Dtype::Fp32);
        assert!(matches!(compare(&a, &b), Err(CompareError::Dtype { .. })));
        let mut c = a.clone();
        c.groups[0].tp = 4;
        assert!(matches!(
            compare(&a, &c),
            Err(CompareError::NoCommonGroup { .. })
        ));
    }
}

//! Two profiles of the same machine side by side: a simulated one against one measured on the
//! box, two machines, two driver versions, or a fast tune against the exhaustive reference.
//! How much A's choices would cost if B's measurements are the truth (regret), and where their
//! crossovers differ.
//!
//! Raw figures measure noise as well as choices: two reference runs of one machine differ by
//! 5–7% at single sizes and place tied kernels' band edges anywhere in the tie. So the worst
//! size is also judged by its *significant* regret (the part beyond B's confidence intervals,
//! and beyond the model band where B is simulated and the rule applies it: a crossover the
//! band leaves open sits anywhere in the band, so misplacing it is a tie, not a regret),
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

pub mod band;
mod render;
pub use band::BandCheck;
pub use render::render;

use crate::allreduce::{Backend, Dtype, Mode};
use crate::decide;
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
    /// The regret B's intervals can tell from noise and, where B is simulated, from model
    /// error: B's interval low for A's choice minus its interval high for B's choice, each
    /// widened as the steering rule widens them ([`decide::beyond`]), never below 0, µs; None
    /// as above.
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
    /// B's GPUs where B has no group on A's (its default placement of the TP size and mode
    /// stands in), with its placement: a comparison across placements, said as one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub b_gpus: Option<(Vec<usize>, String)>,
    /// B's buckets A serves (those above A's largest bucket are left out and counted).
    pub buckets: Vec<BucketRegret>,
    /// Regret summed over `buckets` where B measured A's choice, µs (one call per bucket).
    pub regret_sum_us: f64,
    /// B's choices' time over the same buckets, µs: what `regret_sum_us` is relative to.
    pub b_sum_us: f64,
    /// `regret_sum_us` as a percentage of `b_sum_us`.
    pub regret_sum_pct: f64,
    /// The bucket of largest regret relative to B's choice, if any regret (the worst share).
    pub worst: Option<BucketRegret>,
    /// `worst`'s regret, % of B's choice there (0 without regret).
    pub worst_pct: f64,
    /// The bucket of largest regret in time, if any regret (the most time lost per call).
    pub most_lost: Option<BucketRegret>,
    /// The bucket of largest significant regret relative to B's choice, if any: what the
    /// worst-size bound judges.
    pub worst_significant: Option<BucketRegret>,
    /// `worst_significant`'s significant regret, % of B's choice there (0 without).
    pub worst_significant_pct: f64,
    /// B's buckets whose size A's choice there B did not measure.
    pub unmeasured: usize,
    /// B's buckets A does not serve: above its largest, or below its smallest.
    pub beyond_a: usize,
    /// Of those, the ones below A's smallest.
    pub below_a: usize,
    /// Each profile's crossovers within the sizes both measured (the rest cannot be compared).
    pub crossovers_a: Vec<Crossover>,
    pub crossovers_b: Vec<Crossover>,
    /// Crossovers of either profile outside the sizes both measured: not compared.
    pub crossovers_outside: usize,
    /// Each profile's crossovers in the words `show` gives them ("above" the bucket before).
    #[serde(skip)]
    words: [Vec<String>; 2],
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
    /// Where one profile is simulated and the other measured: per size and backend, whether
    /// the measurement falls inside the simulator's error band.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub band: Vec<BandCheck>,
}

impl GroupComparison {
    /// Whether the two profiles change backend at different places (or to different ones),
    /// as the words say them: two first buckets after the same bucket serve the same sizes.
    pub fn crossovers_differ(&self) -> bool {
        self.words[0] != self.words[1]
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
    /// Which profile's model bands the other's measurements are checked against.
    pub model_side: Option<char>,
    /// Different topology classes or GPU models, in words.
    pub warnings: Vec<String>,
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
    let mut k: Vec<String> = Vec::new();
    for g in &p.groups {
        let g = key(g);
        if !k.contains(&g) {
            k.push(g);
        }
    }
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

/// The bucket where `by`'s share of B's choice there is largest, among those where `by` is
/// above 0: the worst share (a small size can lose little time but most of its own).
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

/// The bucket of largest regret in time, if any regret: where A loses most per call.
fn most_lost(buckets: &[BucketRegret]) -> Option<BucketRegret> {
    buckets
        .iter()
        .filter(|b| b.regret_us.is_some_and(|r| r > 0.0))
        .max_by(|x, y| {
            x.regret_us
                .unwrap_or(0.0)
                .total_cmp(&y.regret_us.unwrap_or(0.0))
        })
        .cloned()
}

fn group(
    sel: &Selector,
    g: &GroupProfile,
    h: &GroupProfile,
    side: Option<char>,
) -> GroupComparison {
    let mine = sel.group(Query {
        tp: g.tp,
        mode: g.mode,
        gpus: Some(&g.gpus),
    });
    let (mut beyond_a, mut below_a) = (0, 0);
    let smallest = g.buckets.first().map_or(0, |b| b.bytes);
    let buckets: Vec<BucketRegret> = h
        .buckets
        .iter()
        .filter_map(|kb| {
            let Some((_, answer)) = mine.and_then(|m| m.at(kb.bytes)) else {
                beyond_a += 1;
                below_a += usize::from(kb.bytes < smallest);
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
                significant_us: theirs.map(|t| decide::beyond(best, t)),
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
    // Only a crossover both profiles could have shows where they differ: one that falls
    // within the sizes both measured (above the larger smallest, at most the smaller largest).
    let ends = |p: &GroupProfile| {
        p.buckets
            .first()
            .zip(p.buckets.last())
            .map(|(f, l)| (f.bytes, l.bytes))
    };
    let (lo, hi) = match (ends(g), ends(h)) {
        (Some(a), Some(b)) => (a.0.max(b.0), a.1.min(b.1)),
        _ => (0, 0),
    };
    let inside = |p: &GroupProfile| -> Vec<Crossover> {
        p.crossovers
            .iter()
            .filter(|c| lo < c.bytes && c.bytes <= hi)
            .cloned()
            .collect()
    };
    let (xa, xb) = (inside(g), inside(h));
    let outside = g.crossovers.len() + h.crossovers.len() - xa.len() - xb.len();
    let a_in_b = matches(&xa, &xb, align, &buckets);
    let b_in_a = matches(&xb, &xa, align, &buckets);
    let off_step = || a_in_b.iter().chain(&b_in_a).filter(|m| !m.within_step);
    GroupComparison {
        tp: g.tp,
        mode: g.mode,
        gpus: g.gpus.clone(),
        placement: g.placement.clone(),
        b_gpus: (h.gpus != g.gpus).then(|| (h.gpus.clone(), h.placement.clone())),
        unmeasured: buckets.iter().filter(|b| b.regret_us.is_none()).count(),
        beyond_a,
        below_a,
        regret_sum_us,
        b_sum_us,
        regret_sum_pct: share(regret_sum_us, b_sum_us),
        worst_pct: worst
            .as_ref()
            .and_then(BucketRegret::regret_pct)
            .unwrap_or(0.0),
        worst,
        most_lost: most_lost(&buckets),
        worst_significant_pct: worst_significant
            .as_ref()
            .and_then(BucketRegret::significant_pct)
            .unwrap_or(0.0),
        worst_significant,
        buckets,
        words: [(g, &xa), (h, &xb)].map(|(p, x)| x.iter().map(|c| p.crossover_words(c)).collect()),
        crossovers_a: xa,
        crossovers_b: xb,
        crossovers_outside: outside,
        crossovers_within_step: !off_step().any(CrossoverMatch::missed),
        crossovers_off_step: off_step().count(),
        crossovers_tied: off_step().filter(|m| m.tied).count(),
        a_in_b,
        b_in_a,
        band: match side {
            Some('A') => band::checks(g, h),
            Some(_) => band::checks(h, g),
            None => Vec::new(),
        },
    }
}

/// Compares A's choices against B's measurements, group by group.
pub fn compare(a: &Profile, b: &Profile) -> Result<Comparison, CompareError> {
    let sel = a.selector();
    let side = band::model_side(a, b);
    let mut groups = Vec::new();
    let mut only_in_a = Vec::new();
    for g in &a.groups {
        let Some(h) = partner(g, b) else {
            // Named with its GPUs: a profile holds several groups of one size and mode.
            let k = format!("{} on GPUs {}", key(g), crate::topology::fmt_gpus(&g.gpus));
            if !only_in_a.contains(&k) {
                only_in_a.push(k);
            }
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
        groups.push(group(&sel, g, h, side));
    }
    if groups.is_empty() {
        return Err(CompareError::NoCommonGroup {
            a: keys(a),
            b: keys(b),
        });
    }
    Ok(Comparison {
        a_fabric: a.fabric.clone(),
        b_fabric: b.fabric.clone(),
        a_simulated: a.simulated,
        b_simulated: b.simulated,
        a_sampling: a.settings.sampling.id(),
        b_sampling: b.settings.sampling.id(),
        groups,
        only_in_a,
        model_side: side,
        warnings: band::warnings(a, b),
    })
}

#[cfg(test)]
mod tests;

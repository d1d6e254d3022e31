//! Two profiles of the same machine side by side, e.g. a simulated one (`tune --sim` or
//! `--topology`) against one measured on the box: how much A's choices would cost if B's
//! measurements are the truth (regret), and where their crossovers differ.
//!
//! Groups are matched by TP size and mode (and GPUs, when both profiles have that group);
//! each of A's buckets is timed by B's bucket that serves the same message size.

use serde::Serialize;

use crate::fabric::{Backend, Dtype, Mode};
use crate::profile::{Crossover, GroupProfile, Profile};

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

/// One of A's buckets timed by B.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BucketRegret {
    pub bytes: u64,
    pub a_choice: Backend,
    pub b_choice: Backend,
    /// B's median for A's choice; None when B did not measure it (waived there).
    pub a_choice_us: Option<f64>,
    /// B's median for B's own choice.
    pub b_choice_us: f64,
    /// `a_choice_us − b_choice_us` (never below 0), µs; None as above.
    pub regret_us: Option<f64>,
}

impl BucketRegret {
    pub fn regret_pct(&self) -> Option<f64> {
        self.regret_us.map(|r| 100.0 * r / self.b_choice_us)
    }
}

/// One matched group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupComparison {
    pub tp: usize,
    pub mode: Mode,
    pub gpus: Vec<usize>,
    pub placement: String,
    pub buckets: Vec<BucketRegret>,
    /// Regret summed over A's buckets that B measured, µs (one call per bucket).
    pub regret_sum_us: f64,
    /// The bucket of largest regret relative to B's best, if any regret.
    pub worst: Option<BucketRegret>,
    /// A's buckets whose choice B did not measure.
    pub unmeasured: usize,
    pub crossovers_a: Vec<Crossover>,
    pub crossovers_b: Vec<Crossover>,
}

impl GroupComparison {
    /// Whether the two profiles change backend at different places (or to different ones).
    pub fn crossovers_differ(&self) -> bool {
        self.crossovers_a != self.crossovers_b
    }
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub a_fabric: String,
    pub b_fabric: String,
    pub a_simulated: bool,
    pub b_simulated: bool,
    pub groups: Vec<GroupComparison>,
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

fn keys(p: &Profile) -> String {
    let mut k: Vec<String> = p
        .groups
        .iter()
        .map(|g| format!("TP{} {}", g.tp, mode_id(g.mode)))
        .collect();
    k.dedup();
    if k.is_empty() {
        "no groups".into()
    } else {
        k.join(", ")
    }
}

/// B's group for A's group `g`: same GPUs and mode, else the first of the same TP and mode.
fn partner<'b>(g: &GroupProfile, b: &'b Profile) -> Option<&'b GroupProfile> {
    b.groups
        .iter()
        .find(|h| h.gpus == g.gpus && h.tp == g.tp && h.mode == g.mode)
        .or_else(|| b.groups.iter().find(|h| h.tp == g.tp && h.mode == g.mode))
}

/// B's bucket serving a message of `bytes`: the smallest at or above it.
fn serving(h: &GroupProfile, bytes: u64) -> Option<&crate::profile::Bucket> {
    h.buckets.iter().find(|k| k.bytes >= bytes)
}

fn group(g: &GroupProfile, h: &GroupProfile) -> GroupComparison {
    let buckets: Vec<BucketRegret> = g
        .buckets
        .iter()
        .filter_map(|k| {
            let kb = serving(h, k.bytes)?;
            let best = kb.results.get(&kb.choice)?.median_us;
            let mine = kb.results.get(&k.choice).map(|t| t.median_us);
            Some(BucketRegret {
                bytes: k.bytes,
                a_choice: k.choice,
                b_choice: kb.choice,
                a_choice_us: mine,
                b_choice_us: best,
                regret_us: mine.map(|m| (m - best).max(0.0)),
            })
        })
        .collect();
    let regret_sum_us = buckets.iter().filter_map(|b| b.regret_us).sum();
    let worst = buckets
        .iter()
        .filter(|b| b.regret_us.is_some_and(|r| r > 0.0))
        .max_by(|x, y| {
            x.regret_pct()
                .unwrap_or(0.0)
                .total_cmp(&y.regret_pct().unwrap_or(0.0))
        })
        .cloned();
    GroupComparison {
        tp: g.tp,
        mode: g.mode,
        gpus: g.gpus.clone(),
        placement: g.placement.clone(),
        unmeasured: buckets.iter().filter(|b| b.regret_us.is_none()).count(),
        regret_sum_us,
        worst,
        buckets,
        crossovers_a: g.crossovers.clone(),
        crossovers_b: h.crossovers.clone(),
    }
}

/// Compares A's choices against B's measurements, group by group.
pub fn compare(a: &Profile, b: &Profile) -> Result<Comparison, CompareError> {
    let mut groups = Vec::new();
    for g in &a.groups {
        let Some(h) = partner(g, b) else { continue };
        if g.dtype != h.dtype {
            return Err(CompareError::Dtype {
                tp: g.tp,
                mode: mode_id(g.mode),
                a: dtype_id(g.dtype),
                b: dtype_id(h.dtype),
            });
        }
        groups.push(group(g, h));
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
        groups,
    })
}

fn label(fabric: &str, simulated: bool) -> String {
    if simulated && !fabric.starts_with("simulated") {
        format!("simulated {fabric}")
    } else {
        fabric.to_string()
    }
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

/// The comparison in words: per group the regret (summed and worst bucket), the buckets
/// where the choices differ, and both crossover lists when they differ.
pub fn render(c: &Comparison) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "A: {}\nB: {}\nRegret: what A's choice costs over B's fastest, timed by B's measurements.",
        label(&c.a_fabric, c.a_simulated),
        label(&c.b_fabric, c.b_simulated)
    );
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
            "  same choice in {same} of {} sizes; regret {} summed over one call per size",
            g.buckets.len(),
            crate::units::fmt_us(g.regret_sum_us)
        );
        match &g.worst {
            Some(w) => {
                let _ = writeln!(
                    s,
                    "  worst: {} at {} ({:.1}%): A chose {}, B measured {} fastest",
                    crate::units::fmt_us(w.regret_us.unwrap_or(0.0)),
                    crate::units::fmt_bytes(w.bytes),
                    w.regret_pct().unwrap_or(0.0),
                    w.a_choice,
                    w.b_choice
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    "  no regret: A's choices are B's fastest (or B did not measure them)"
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
        p.groups[0].buckets = buckets;
        p.groups[0].dtype = dtype;
        p
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

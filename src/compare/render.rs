//! `artune compare`'s text: each matched group's regret, worst sizes and crossovers.

use super::*;

fn label(fabric: &str, simulated: bool, sampling: &str) -> String {
    let fabric = if simulated && !fabric.starts_with("simulated") {
        format!("simulated {fabric}")
    } else {
        fabric.to_string()
    };
    format!("{fabric} ({sampling} sampling)")
}

fn crossings(words: &[String]) -> String {
    match words.is_empty() {
        true => "none".into(),
        false => words.join("; "),
    }
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
                    "{mine}'s {}→{} at its {at} bucket, nearest in {other} at its {} bucket",
                    c.from,
                    c.to,
                    fmt_bytes(n)
                ),
                None => format!(
                    "{mine}'s {}→{} at its {at} bucket, none in {other}",
                    c.from, c.to
                ),
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

/// One bucket's regret in words: `label: time at size (share of B's): choices`.
fn regret_line(label: &str, us: f64, pct: f64, w: &BucketRegret) -> String {
    format!(
        "  {label}: {} at {} ({pct:.1}% of B's choice there): A chose {}, B chose {}\n",
        crate::units::fmt_us(us),
        crate::units::fmt_bytes(w.bytes),
        w.a_choice,
        w.b_choice
    )
}

/// The group's worst regret twice, as a share of B's time (where A is furthest off) and in
/// time (where A loses most per call), and its worst share beyond B's intervals.
fn render_worst(g: &GroupComparison, s: &mut String) {
    let (Some(w), Some(m)) = (&g.worst, &g.most_lost) else {
        s.push_str("  no regret: A's choices are as fast as B's (or B did not measure them)\n");
        return;
    };
    let raw = |b: &BucketRegret| (b.regret_us.unwrap_or(0.0), b.regret_pct().unwrap_or(0.0));
    if w.bytes == m.bytes {
        let (us, pct) = raw(w);
        s.push_str(&regret_line("worst share and most time lost", us, pct, w));
    } else {
        let (us, pct) = raw(w);
        s.push_str(&regret_line("worst share", us, pct, w));
        let (us, pct) = raw(m);
        s.push_str(&regret_line("most time lost", us, pct, m));
    }
    let label = "worst share beyond B's intervals";
    match &g.worst_significant {
        Some(w) => {
            let us = w.significant_us.unwrap_or(0.0);
            let pct = w.significant_pct().unwrap_or(0.0);
            s.push_str(&regret_line(label, us, pct, w));
        }
        None => {
            s.push_str(&format!(
                "  {label}: none (every regret is within B's noise)\n"
            ));
        }
    }
}

/// The comparison in words: per group the regret (summed, worst share and most time lost),
/// the buckets where the choices differ, and whether the crossovers agree to within one
/// refinement step.
pub fn render(c: &Comparison) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "A: {}\nB: {}\nRegret: what A's choice costs over B's choice, timed by B's measurements at B's sizes.",
        label(&c.a_fabric, c.a_simulated, c.a_sampling),
        label(&c.b_fabric, c.b_simulated, c.b_sampling)
    );
    for w in &c.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    for k in &c.only_in_a {
        let _ = writeln!(s, "A's {k} has no counterpart in B: not compared");
    }
    for g in &c.groups {
        let _ = writeln!(
            s,
            "\nTP{} {} (GPUs {}{}):",
            g.tp,
            mode_id(g.mode),
            crate::topology::fmt_gpus(&g.gpus),
            if g.placement.is_empty() {
                String::new()
            } else {
                format!(", {}", g.placement)
            }
        );
        if let Some((gpus, placement)) = &g.b_gpus {
            let at = match placement.is_empty() {
                true => String::new(),
                false => format!(", {placement}"),
            };
            let _ = writeln!(
                s,
                "  B has no group on these GPUs: judged by B's GPUs {}{at}, another placement",
                crate::topology::fmt_gpus(gpus)
            );
        }
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
        render_worst(g, &mut s);
        if g.unmeasured > 0 {
            let _ = writeln!(
                s,
                "  {} where B did not measure A's choice (waived there)",
                crate::report::count(g.unmeasured, "size", "sizes")
            );
        }
        for (n, side) in [
            (g.below_a, "below A's smallest"),
            (g.beyond_a - g.below_a, "above A's largest"),
        ] {
            if n > 0 {
                let lie = if n == 1 { "sizes lies" } else { "sizes lie" };
                let _ = writeln!(s, "  {n} of B's {lie} {side}: not compared");
            }
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
        if g.crossovers_outside > 0 {
            let _ = writeln!(
                s,
                "  {} outside the sizes both measured: not compared",
                crate::report::count(g.crossovers_outside, "crossover", "crossovers")
            );
        }
        if g.crossovers_differ() {
            let _ = writeln!(s, "  crossovers differ:");
            let _ = writeln!(s, "    A: {}", crossings(&g.words[0]));
            let _ = writeln!(s, "    B: {}", crossings(&g.words[1]));
        } else {
            let _ = writeln!(s, "  crossovers agree: {}", crossings(&g.words[0]));
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
        if let Some(side) = c.model_side {
            band::render(&g.band, side, &mut s);
        }
    }
    s
}

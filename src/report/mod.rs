//! Everything artune prints about a profile: the text summary, its JSON form, and SVG plots.
//! Pure functions of a [`Profile`], so `tune` and `show` print the same thing.

mod plot;

use std::fmt::Write;

use serde::Serialize;

use crate::allreduce::{Backend, Direction};
use crate::profile::{Bucket, GroupProfile, Profile, Sampling};
use crate::units::fmt_bytes;

pub use plot::plots;

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
        let extra = crate::decide::extra_memory(backend, g.tp, run[run.len() - 1].bytes);
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

fn fmt_ratio((lo, hi): (f64, f64)) -> String {
    if (hi - lo) / lo.max(1e-9) < 0.05 {
        format!("{lo:.2}x")
    } else {
        format!("{lo:.2}–{hi:.2}x")
    }
}

/// What forcing one-stage kernel `c` over a range would cost, from its time over the choice's
/// (lowest, highest). Where it was sometimes a little faster (below the decision's threshold,
/// or not worth its memory), say by how much rather than printing "0.96x slower".
fn forcing_note(c: Backend, lo: f64, hi: f64) -> String {
    if hi <= 1.0 {
        String::new()
    } else if lo >= 1.0 {
        format!("forcing {c}: {} slower", fmt_ratio((lo, hi)))
    } else {
        format!(
            "forcing {c}: up to {hi:.2}x slower, at best {:.0}% faster",
            (1.0 / lo - 1.0) * 100.0
        )
    }
}

fn fmt_gpus(gpus: &[usize]) -> String {
    let contiguous = gpus.windows(2).all(|w| w[1] == w[0] + 1);
    if contiguous && gpus.len() > 2 {
        format!("{}-{}", gpus[0], gpus[gpus.len() - 1])
    } else {
        gpus.iter()
            .map(|g| g.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// How the cells were sampled, in words.
fn sampling(s: &crate::profile::Settings) -> String {
    let how = match s.sampling {
        Sampling::Fast => {
            "powers of two refined where the winner changes, clearly slower backends stop early"
        }
        Sampling::Exhaustive => {
            "the reference: every size refinement could reach, every backend sampled to its target"
        }
    };
    if s.target_ci > 0.0 {
        format!(
            "{} (±{}% interval target; {how})",
            s.sampling.id(),
            s.target_ci * 100.0
        )
    } else {
        format!("{} ({how})", s.sampling.id())
    }
}

/// The header lines: what measured it, when, for which machine.
fn header(p: &Profile, out: &mut String) {
    if p.simulated {
        let _ = writeln!(
            out,
            "SIMULATED profile — {} (a model of the machine, not a measurement)",
            p.fabric
        );
    } else {
        let _ = writeln!(out, "Measured profile — {}", p.fabric);
    }
    let v = &p.versions;
    let opt = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".into());
    let _ = writeln!(
        out,
        "created {}  artune {}  driver {}  CUDA {}  NCCL {}",
        p.created,
        p.tool_version,
        opt(&v.driver),
        opt(&v.cuda),
        opt(&v.nccl)
    );
    let _ = writeln!(
        out,
        "fingerprint: topology class {}  host {}",
        p.fingerprint.topology_class, p.fingerprint.host
    );
    for a in &p.assumed {
        let _ = writeln!(out, "assumed (the topology does not state it): {a}");
    }
    let _ = writeln!(out, "sampling: {}", sampling(&p.settings));
    if p.settings.tuning_seconds > 0.0 {
        let _ = writeln!(out, "tuning took {:.2} s", p.settings.tuning_seconds);
    }
    if let Some(ph) = &p.settings.phases {
        let sum = |f: fn(&crate::profile::GroupPhases) -> f64| ph.groups.iter().map(f).sum::<f64>();
        let _ = writeln!(
            out,
            "  where it went: start-up {:.2} s, set-up {:.2} s, probes {:.2} s, verification {:.2} s, timing {:.2} s (graph capture included) over {} GPU groups",
            ph.startup_s,
            sum(|g| g.setup_s),
            sum(|g| g.probes_s),
            sum(|g| g.verify_s),
            sum(|g| g.timing_s),
            ph.groups.len()
        );
    }
}

/// Simulated groups: the model's error band per backend kind, and the sizes where a custom
/// kernel is modelled faster than the choice but not beyond what the model could be wrong by.
fn model_lines(g: &GroupProfile, out: &mut String) {
    let span = |custom: bool| {
        let ms = g.buckets.iter().flat_map(|b| b.results.iter());
        let ms = ms
            .filter(|(k, _)| k.is_custom() == custom)
            .filter_map(|(_, t)| t.model);
        ms.fold(None, |a: Option<(f64, f64)>, m| {
            Some(a.map_or((m.low, m.high), |(l, h)| (l.min(m.low), h.max(m.high))))
        })
    };
    let (Some(n), c) = (span(false), span(true)) else {
        return;
    };
    let c = c.map_or(String::new(), |(l, h)| {
        format!(", custom kernels x{l:.2}-x{h:.2}")
    });
    let _ = writeln!(
        out,
        "  model error (simulated; docs/MODEL-ERROR.md): NCCL x{:.2}-x{:.2}{c}; a choice of custom is sure beyond it",
        n.0, n.1
    );
    let unsure: Vec<&Bucket> = g
        .buckets
        .iter()
        .filter(|b| !b.choice.is_custom())
        .filter(|b| {
            let chosen = b.results.get(&b.choice).map_or(f64::NAN, |t| t.median_us);
            b.results
                .iter()
                .any(|(k, t)| k.is_custom() && t.median_us * 1.05 < chosen)
        })
        .collect();
    if let (Some(a), Some(z)) = (unsure.first(), unsure.last()) {
        let _ = writeln!(
            out,
            "  not sure: at {} of the sizes {}–{} a custom kernel is modelled faster than {}, but within the model's error; measure on the machine to decide",
            unsure.len(),
            fmt_bytes(a.bytes),
            fmt_bytes(z.bytes),
            a.choice
        );
    }
}

/// The text summary printed by `tune` and `show`.
pub fn summary(p: &Profile) -> String {
    let mut out = String::new();
    header(p, &mut out);
    for g in &p.groups {
        let _ = writeln!(
            out,
            "\nTP{} {} — GPUs {} ({}), {}",
            g.tp,
            g.mode.id(),
            fmt_gpus(&g.gpus),
            g.placement,
            g.dtype.id()
        );
        let _ = writeln!(
            out,
            "  {:<15} {:<17} {:<16} {:<12} notes",
            "sizes", "backend", "vs nccl", "extra mem/GPU"
        );
        for r in ranges(g) {
            let sizes = if r.from_bytes == r.to_bytes {
                fmt_bytes(r.from_bytes)
            } else {
                format!("{}–{}", fmt_bytes(r.from_bytes), fmt_bytes(r.to_bytes))
            };
            let vs = match (r.backend, r.speedup_vs_nccl) {
                (Backend::Nccl, _) => "-".to_string(),
                (_, Some(s)) => format!("{} faster", fmt_ratio(s)),
                (_, None) => "nccl not measured".into(),
            };
            let mem = if r.extra_bytes_per_gpu > 0 {
                fmt_bytes(r.extra_bytes_per_gpu)
            } else {
                "0".into()
            };
            let note = r
                .custom_slowdown
                .map(|(c, lo, hi)| forcing_note(c, lo, hi))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {sizes:<15} {:<17} {vs:<18} {mem:<13} {note}",
                r.backend.id()
            );
        }
        if !g.crossovers.is_empty() {
            let xs: Vec<String> = g
                .crossovers
                .iter()
                .map(|c| format!("{} → {} at {}", c.from, c.to, fmt_bytes(c.bytes)))
                .collect();
            let _ = writeln!(out, "  crossovers: {}", xs.join("; "));
        }
        model_lines(g, &mut out);
        if let Some(r) = g.regret {
            let _ = writeln!(
                out,
                "  regret against the fastest measured at each size: {:.1}% summed, worst {:.1}% at {}",
                r.summed * 100.0,
                r.worst * 100.0,
                fmt_bytes(r.worst_bytes)
            );
        }
        for (b, why) in &g.waived {
            let _ = writeln!(out, "  waived {b}: {why}");
        }
        if let Some(m) = g.memory.get(&Backend::Nccl) {
            let _ = writeln!(
                out,
                "  NCCL communicator: {} per GPU{}",
                fmt_bytes(m.bytes_per_gpu),
                if m.measured {
                    " (measured)"
                } else {
                    " (modelled)"
                }
            );
        }
    }
    for c in &p.contention {
        let dir = match c.direction {
            Direction::Read => "read (pull)",
            Direction::Write => "write (push)",
        };
        let pts: Vec<String> = c
            .points
            .iter()
            .map(|s| format!("{}:{:.1}/{:.0}", s.peers, s.per_gpu_gbps, s.aggregate_gbps))
            .collect();
        let _ = writeln!(
            out,
            "\ncontention GPUs {} {dir}, peers:GB/s per GPU/aggregate  {}",
            fmt_gpus(&c.gpus),
            pts.join("  ")
        );
    }
    if !p.faults.is_empty() {
        let _ = writeln!(out, "\nfaults:");
        for f in &p.faults {
            let _ = writeln!(out, "  {f}");
        }
    }
    out
}

/// The summary as JSON, for scripts.
pub fn summary_json(p: &Profile) -> serde_json::Value {
    let groups: Vec<serde_json::Value> = p
        .groups
        .iter()
        .map(|g| {
            serde_json::json!({
                "tp": g.tp, "mode": g.mode, "gpus": g.gpus, "placement": g.placement,
                "ranges": ranges(g), "crossovers": g.crossovers, "waived": g.waived,
                "regret": g.regret,
            })
        })
        .collect();
    serde_json::json!({
        "simulated": p.simulated, "fabric": p.fabric, "created": p.created,
        "fingerprint": p.fingerprint, "versions": p.versions,
        "sampling": p.settings.sampling, "target_ci": p.settings.target_ci,
        "tuning_seconds": p.settings.tuning_seconds, "phases": p.settings.phases,
        "assumed": p.assumed, "groups": groups, "faults": p.faults,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_labels_simulation_and_ranges() {
        let p = crate::profile::tests::fixture();
        let s = summary(&p);
        assert!(s.starts_with("SIMULATED profile"), "{s}");
        assert!(s.contains("4K–8K"), "{s}");
        assert!(s.contains("one_stage_pull"), "{s}");
        assert!(s.contains("2.50x faster"), "{s}");
        // Above the crossover NCCL is chosen and the cost of forcing the custom kernel shows.
        assert!(s.contains("forcing one_stage_pull: 1.50x slower"), "{s}");
        assert!(s.contains("one_stage_pull → nccl at 16K"), "{s}");
        assert!(!s.contains("assumed"), "{s}");
        assert!(s.contains("sampling: fast (powers of two"), "{s}");
        let mut p = p.clone();
        p.settings.target_ci = 0.02;
        let s = summary(&p);
        assert!(s.contains("sampling: fast (±2% interval target;"), "{s}");
        assert_eq!(summary_json(&p)["sampling"], "fast");
        let mut e = p.clone();
        e.settings.sampling = Sampling::Exhaustive;
        assert!(summary(&e).contains("sampling: exhaustive (±2%"));
        assert_eq!(summary_json(&e)["sampling"], "exhaustive");
    }

    #[test]
    fn summary_says_what_the_simulator_assumed_and_where_time_went() {
        let mut p = crate::profile::tests::fixture();
        p.assumed = vec!["kernel traffic through switch `sw0`: Microchip defaults".into()];
        p.settings.phases = Some(crate::profile::Phases {
            startup_s: 1.5,
            groups: vec![crate::profile::GroupPhases {
                gpus: vec![0, 1],
                setup_s: 2.0,
                probes_s: 0.5,
                verify_s: 3.0,
                timing_s: 4.0,
            }],
        });
        let s = summary(&p);
        assert!(
            s.contains(
                "assumed (the topology does not state it): kernel traffic through switch `sw0`"
            ),
            "{s}"
        );
        assert!(
            s.contains(
                "start-up 1.50 s, set-up 2.00 s, probes 0.50 s, verification 3.00 s, timing 4.00 s"
            ),
            "{s}"
        );
        let j = summary_json(&p);
        assert_eq!(j["phases"]["startup_s"], 1.5);
        assert_eq!(j["assumed"][0], p.assumed[0].as_str());
    }

    #[test]
    fn forcing_note_never_calls_a_faster_kernel_slower() {
        let c = Backend::OneStagePull;
        assert_eq!(
            forcing_note(c, 1.5, 1.52),
            "forcing one_stage_pull: 1.50x slower"
        );
        assert_eq!(
            forcing_note(c, 1.0, 7.1),
            "forcing one_stage_pull: 1.00–7.10x slower"
        );
        assert_eq!(
            forcing_note(c, 0.96, 22.12),
            "forcing one_stage_pull: up to 22.12x slower, at best 4% faster"
        );
        assert_eq!(forcing_note(c, 0.9, 0.99), "");
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

    #[test]
    fn plots_are_svg_files() {
        let p = crate::profile::tests::fixture();
        let dir = tempfile::tempdir().unwrap();
        let files = plots(&p, dir.path()).unwrap();
        assert_eq!(files.len(), 1);
        let svg = std::fs::read_to_string(&files[0]).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("SIMULATED") && svg.contains("one_stage_pull")
        );
    }
}

//! Everything artune prints about a profile: the text summary, its JSON form, and SVG plots.
//! Pure functions of a [`Profile`], so `tune` and `show` print the same thing.

mod choices;
mod environment;
mod group;
pub mod model;
mod plot;

use std::fmt::Write;

use crate::allreduce::Direction;
use crate::profile::{Profile, Sampling};
use crate::topology::fmt_gpus;
use crate::units::fmt_bytes;

pub use choices::{
    budget_exclusions, over_budget, passed_over, ranges, OverBudget, PassedOver, Range,
};
pub use group::{group_label, outside};
use group::{group_notes, group_said, group_section, shared_notes};
pub use plot::{check_plot_dir, plots};

/// A count and its noun: "1 GPU", "2 GPUs".
pub fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// How the cells were sampled, in words, with how many sizes' choices met the interval target
/// where not all did (a cell stops at its sample cap, and a target tighter than the noise
/// allows is not met).
fn sampling(p: &Profile) -> String {
    let s = &p.settings;
    let how = match s.sampling {
        Sampling::Fast => {
            "powers of two refined where the winner changes, clearly slower backends stop early"
        }
        Sampling::Exhaustive => {
            "the reference: every size refinement could reach, every backend sampled to its target"
        }
    };
    if s.target_ci > 0.0 {
        let choices: Vec<bool> = p
            .groups
            .iter()
            .flat_map(|g| &g.buckets)
            .filter_map(|b| b.results.get(&b.choice))
            .map(|t| (t.ci_high_us - t.ci_low_us) / 2.0 <= s.target_ci * t.median_us * 1.0001)
            .collect();
        let met = choices.iter().filter(|m| **m).count();
        let short = match met < choices.len() {
            true => format!(
                ", met by the choice's interval at {met} of {} sizes",
                choices.len()
            ),
            false => String::new(),
        };
        format!(
            "{} (±{}% interval target{short}; {how})",
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
    environment::lines(p, out);
    let _ = writeln!(out, "sampling: {}", sampling(p));
    if p.settings.tuning_seconds > 0.0 {
        let _ = writeln!(out, "tuning took {:.2} s", p.settings.tuning_seconds);
    }
    if let Some(ph) = &p.settings.phases {
        let sum = |f: fn(&crate::profile::GroupPhases) -> f64| ph.groups.iter().map(f).sum::<f64>();
        let _ = writeln!(
            out,
            "  where it went: {}start-up {:.2} s, set-up {:.2} s, probes {:.2} s, verification {:.2} s, timing {:.2} s (graph capture included) over {}",
            if ph.checks_s > 0.0 {
                format!("busy check {:.2} s, ", ph.checks_s)
            } else {
                String::new()
            },
            ph.startup_s,
            sum(|g| g.setup_s),
            sum(|g| g.probes_s),
            sum(|g| g.verify_s),
            sum(|g| g.timing_s),
            count(ph.groups.len(), "set of GPUs", "sets of GPUs")
        );
    }
}

/// The text summary printed by `tune` and `show`.
pub fn summary(p: &Profile) -> String {
    let mut out = String::new();
    header(p, &mut out);
    if let Some(b) = p.settings.mem_budget_bytes {
        let _ = writeln!(
            out,
            "memory budget: {} per GPU for custom kernels' buffers (kernels over it are excluded at those sizes, listed per group)",
            fmt_bytes(b)
        );
    }
    let notes: Vec<Vec<String>> = p.groups.iter().map(group_notes).collect();
    let shared = shared_notes(&notes);
    for (title, lines) in [
        ("every group:", &shared.every),
        ("several groups:", &shared.several),
    ] {
        if !lines.is_empty() {
            let _ = writeln!(out, "{title}");
            for l in lines {
                let _ = writeln!(out, "  {l}");
            }
        }
    }
    for (g, notes) in p.groups.iter().zip(&notes) {
        group_section(g, &mut out);
        for l in notes.iter().filter(|l| !shared.hoisted.contains(l)) {
            let _ = writeln!(out, "  {l}");
        }
    }
    contention_and_faults(p, &mut out);
    out
}

/// The contention curves, the recoveries and the faults, after the groups.
fn contention_and_faults(p: &Profile, out: &mut String) {
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
    for r in &p.recovered {
        let at = r
            .bytes
            .map_or(String::new(), |b| format!(" at {}", fmt_bytes(b)));
        let what = r
            .backend
            .map_or(String::new(), |b| format!(" while timing {b}{at}"));
        let _ = writeln!(
            out,
            "RECOVERED on GPUs {}{what}: {}; its workers were replaced and the group measured again{}",
            fmt_gpus(&r.group),
            r.cause,
            match (r.backend, r.kept) {
                (Some(b), true) => format!(" with {b}, which was timed again on the fresh workers"),
                (Some(b), false) => format!(" without {b}, which failed again"),
                (None, _) => String::new(),
            },
        );
    }
    if !p.faults.is_empty() {
        let _ = writeln!(out, "\nfaults:");
        for f in &p.faults {
            let _ = writeln!(out, "  {f}");
        }
    }
}

/// What `tune` says after writing a profile (on stderr, with its other status lines): where
/// it went and the commands to run next, filled in with this profile's path, a group and a
/// size it measured, so each runs as printed (tests/suggestions.rs runs them). A simulated
/// profile gets the NCCL export: the engine exports refuse it.
pub fn next_steps(path: &std::path::Path, p: &Profile) -> String {
    let written = path.display();
    let path = crate::shell::quote(&written.to_string());
    let mut lines: Vec<(String, &str)> =
        vec![(format!("artune show {path}"), "this summary again")];
    let graph = p
        .groups
        .iter()
        .find(|g| g.mode == crate::allreduce::Mode::Graph);
    if let Some(g) = graph.or(p.groups.first()) {
        // A measured size near 1M, so the answer is a measurement, not an interpolation.
        let bytes = g
            .buckets
            .iter()
            .map(|b| b.bytes)
            .filter(|b| b.is_power_of_two())
            .min_by_key(|b| b.abs_diff(1 << 20));
        if let Some(bytes) = bytes {
            let gpus: Vec<String> = g.gpus.iter().map(|x| x.to_string()).collect();
            let mode = match g.mode {
                crate::allreduce::Mode::Graph => String::new(),
                m => format!(" --mode {}", m.id()),
            };
            lines.push((
                format!(
                    "artune why {path} --tp {} --gpus {} --bytes {}{mode}",
                    g.tp,
                    gpus.join(","),
                    fmt_bytes(bytes)
                ),
                "one answer explained",
            ));
        }
    }
    if p.simulated {
        lines.push((
            format!("artune export {path} --engine nccl"),
            "NCCL's settings; a model: the plugins and vLLM's export refuse it",
        ));
    } else {
        lines.push((
            format!("artune export {path} --engine vllm"),
            "what vLLM needs (also sglang, nccl, env; trtllm with --hidden N)",
        ));
        lines.push((
            format!("artune check {path}"),
            "later: does it still hold for this machine",
        ));
    }
    let width = lines.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
    let mut s = format!("profile written to {written}\nnext:\n");
    for (c, why) in lines {
        let _ = writeln!(s, "  {c:<width$}   # {why}");
    }
    s
}

/// The summary as JSON, for scripts.
pub fn summary_json(p: &Profile) -> serde_json::Value {
    let groups: Vec<serde_json::Value> = p
        .groups
        .iter()
        .map(|g| {
            serde_json::json!({
                "tp": g.tp, "mode": g.mode, "gpus": g.gpus, "placement": g.placement,
                "dtype": g.dtype, "islands": g.islands,
                "ranges": ranges(g), "crossovers": g.crossovers, "waived": g.waived,
                "regret": g.regret, "over_budget": over_budget(g), "beside": g.beside,
                "said": group_said(g),
            })
        })
        .collect();
    serde_json::json!({
        "simulated": p.simulated, "fabric": p.fabric, "created": p.created,
        "fingerprint": p.fingerprint, "versions": p.versions,
        "sampling": p.settings.sampling, "target_ci": p.settings.target_ci,
        "tuning_seconds": p.settings.tuning_seconds, "phases": p.settings.phases,
        "mem_budget_bytes": p.settings.mem_budget_bytes,
        "assumed": p.assumed, "groups": groups, "faults": p.faults, "recovered": p.recovered,
        "environment": p.environment, "dtype": p.settings.dtype,
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
        assert!(s.contains("forcing one_stage_pull: 1.5"), "{s}");
        // Buckets at 4K, 8K and 16K: the 16K bucket serves the sizes above 8K.
        assert!(s.contains("one_stage_pull → nccl above 8K"), "{s}");
        assert!(!s.contains("assumed"), "{s}");
        assert!(s.contains("sampling: fast (powers of two"), "{s}");
        let mut p = p.clone();
        p.settings.target_ci = 0.02;
        let s = summary(&p);
        assert!(s.contains("sampling: fast (±2% interval target;"), "{s}");
        // A target the intervals did not reach is said, not only named.
        let mut tight = p.clone();
        tight.settings.target_ci = 1e-6;
        let t = summary(&tight);
        assert!(
            t.contains("interval target, met by the choice's interval at 0 of"),
            "{t}"
        );
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
            checks_s: 0.0,
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

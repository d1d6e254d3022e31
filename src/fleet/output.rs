//! The fleet report for people, as JSON, and as a Prometheus text file for node_exporter's
//! textfile collector.

use std::fmt::Write;

use super::{ClassReport, FleetReport};
use crate::allreduce::Backend;
use crate::units::{fmt_bytes, fmt_us};

/// Rows of the per-size table shown per class; the JSON has them all.
const TABLE_ROWS: usize = 40;

fn short(class: &str) -> &str {
    class.strip_prefix("sha256:").unwrap_or(class)
}

/// The human report.
pub fn text(r: &FleetReport) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "artune fleet: {} profile{} ({}), {} topology class{}",
        r.profiles,
        if r.profiles == 1 { "" } else { "s" },
        r.dtype.id(),
        r.class_count(),
        if r.class_count() == 1 { "" } else { "es" }
    );
    for c in &r.classes {
        class_text(&mut o, c, r.class_profiles.get(&c.topology_class));
    }
    files(&mut o, &r.skipped, |n| format!("skipped {n}"));
    files(&mut o, &r.duplicates, |n| {
        format!("left out, the same node as another file ({n})")
    });
    if !r.class_profiles_found.is_empty() {
        let _ = writeln!(
            o,
            "\nleft out, class profiles a fleet run wrote (not nodes): {}",
            r.class_profiles_found.join(", ")
        );
    }
    files(&mut o, &r.other_dtype, |n| {
        format!("not compared here, of another dtype ({n})")
    });
    o
}

/// Files the report sets aside, where there are any: a heading with their count ("2 files"),
/// then each file and why.
fn files(o: &mut String, list: &[super::read::Skipped], heading: impl Fn(String) -> String) {
    if list.is_empty() {
        return;
    }
    let n = crate::report::count(list.len(), "file", "files");
    let _ = writeln!(o, "\n{}:", heading(n));
    for s in list {
        let _ = writeln!(o, "  {}: {}", s.file, s.reason);
    }
}

fn class_text(o: &mut String, c: &ClassReport, profile: Option<&String>) {
    let _ = writeln!(
        o,
        "\nclass {} {}: {} node{}{}",
        short(&c.topology_class),
        c.mode.id(),
        c.nodes.len(),
        if c.nodes.len() == 1 { "" } else { "s" },
        if c.simulated.len() == c.nodes.len() {
            " (all SIMULATED)".to_string()
        } else if c.simulated.is_empty() {
            String::new()
        } else {
            format!(
                " ({} SIMULATED: {})",
                c.simulated.len(),
                c.simulated.join(", ")
            )
        }
    );
    if !c.outliers_judged {
        let _ = writeln!(
            o,
            "  outliers: not judged: it takes {} nodes to tell one apart, and the class has {} (its profile is their median)",
            super::compare::OUTLIER_NODES,
            c.nodes.len()
        );
    } else if c.outliers.is_empty() {
        let _ = writeln!(o, "  outliers: none");
    }
    for out in &c.outliers {
        let worst: Vec<String> = out
            .deviations
            .iter()
            .take(3)
            .map(|d| {
                format!(
                    "{} {:.2}x at {} TP{}",
                    d.backend,
                    d.ratio,
                    fmt_bytes(d.bytes),
                    d.tp
                )
            })
            .collect();
        let _ = writeln!(
            o,
            "  OUTLIER {}: {} of {} {}; worst {}",
            out.node,
            out.deviating,
            out.results,
            if out.deviating == 1 {
                "results deviates"
            } else {
                "results deviate"
            },
            worst.join(", ")
        );
    }
    let tied: usize = c.choices_differ.iter().filter(|d| d.ties > 0).count();
    if tied > 0 {
        let _ = writeln!(
            o,
            "  {tied} node{} chose otherwise only within their own intervals (ties, in --json)",
            if tied == 1 { "" } else { "s" }
        );
    }
    let edged: usize = c.choices_differ.iter().filter(|d| d.edges > 0).count();
    if edged > 0 {
        let _ = writeln!(
            o,
            "  {edged} node{} put a crossover one size from the class's (band edges, in --json)",
            if edged == 1 { "" } else { "s" }
        );
    }
    for d in c.choices_differ.iter().filter(|d| d.differ > 0) {
        let ex: Vec<String> = d
            .examples
            .iter()
            .map(|(tp, b, mine, class, gpus)| {
                let gpus: Vec<String> = gpus.iter().map(usize::to_string).collect();
                format!(
                    "TP{tp} on GPUs {} at {}: {mine} (class {class})",
                    gpus.join(","),
                    fmt_bytes(*b)
                )
            })
            .collect();
        let _ = writeln!(
            o,
            "  choices differ on {}: {} of {} sizes, e.g. {}",
            d.node,
            d.differ,
            d.of,
            ex.join("; ")
        );
    }
    if !c.version_sets.is_empty() {
        let sets: Vec<String> = c
            .version_sets
            .iter()
            .map(|s| {
                let n = s.nodes.len();
                match n {
                    1..=3 => format!("{} ({})", s.versions, s.nodes.join(", ")),
                    _ => format!("{} ({n} nodes)", s.versions),
                }
            })
            .collect();
        let _ = writeln!(
            o,
            "  MIXED VERSIONS: {}; the class profile is built from the first, and fleet cannot see which versions each node runs now",
            sets.join("; ")
        );
    }
    for s in &c.versions_differ {
        let _ = writeln!(o, "  versions differ on {}: {}", s.node, s.reason);
    }
    for s in &c.groups_differ {
        let _ = writeln!(o, "  groups differ on {}: {}", s.node, s.reason);
    }
    match profile {
        Some(p) => {
            let n = c.included.len();
            let _ = writeln!(
                o,
                "  class profile: {p} (consensus of {n} node{} in this mode)",
                if n == 1 { "" } else { "s" }
            );
        }
        None if c.included.is_empty() => {
            let _ = writeln!(
                o,
                "  class profile: not written (no node left to build it from)"
            );
        }
        None => {
            let _ = writeln!(o, "  class profile: not written (see the error)");
        }
    }
    let shown = size_table(o, c);
    node_lines(o, c, &shown);
}

/// Per (TP, size): the median of each backend the class ever chose, and NCCL's; returns those
/// backends.
fn size_table(o: &mut String, c: &ClassReport) -> Vec<Backend> {
    let mut shown: Vec<Backend> = vec![Backend::Nccl];
    for b in c.cells.iter().filter_map(|cell| cell.choice) {
        if !shown.contains(&b) {
            shown.push(b);
        }
    }
    // Sizes only nodes left out of the class measured (an outlier's own refinement) have no
    // class choice, and their medians are not the class's: named, not tabled.
    let (cells, apart): (Vec<_>, Vec<_>) = c.cells.iter().partition(|cell| cell.choice.is_some());
    let head: Vec<String> = shown.iter().map(|b| format!("{:>17}", b.id())).collect();
    let _ = writeln!(
        o,
        "  {:<6} {:<12} {:>8} {:>16} {}",
        "TP",
        "GPUs",
        "size",
        "class choice",
        head.join("")
    );
    for cell in cells.iter().take(TABLE_ROWS) {
        let cols: Vec<String> = shown
            .iter()
            .map(|b| {
                cell.backends.get(b).map_or(format!("{:>17}", "-"), |cb| {
                    format!("{:>17}", fmt_us(cb.median_us))
                })
            })
            .collect();
        let gpus: Vec<String> = cell.gpus.iter().map(|g| g.to_string()).collect();
        let _ = writeln!(
            o,
            "  {:<6} {:<12} {:>8} {:>16} {}",
            format!("TP{}", cell.tp),
            gpus.join(","),
            fmt_bytes(cell.bytes),
            cell.choice.map_or("-", |b| b.id()),
            cols.join("")
        );
    }
    if cells.len() > TABLE_ROWS {
        let _ = writeln!(o, "  ... {} more rows in --json", cells.len() - TABLE_ROWS);
    }
    if !apart.is_empty() {
        let sizes: Vec<String> = apart
            .iter()
            .map(|cell| format!("TP{} {}", cell.tp, fmt_bytes(cell.bytes)))
            .collect();
        let _ = writeln!(
            o,
            "  not in the table: {} measured only by nodes left out of the class profile ({}; in --json)",
            crate::report::count(apart.len(), "size", "sizes"),
            sizes.join(", ")
        );
    }
    shown
}

/// The nodes away from their class, by their slowest group's ratio per backend in `shown`.
fn node_lines(o: &mut String, c: &ClassReport, shown: &[Backend]) {
    // Only nodes away from their class: a healthy fleet of hundreds prints one line here.
    let pct = super::DEVIATION * 100.0;
    let away: Vec<&String> = c
        .nodes
        .iter()
        .filter(|n| {
            c.node_ratios
                .get(*n)
                .is_some_and(|per| per.values().any(|r| (r - 1.0).abs() >= super::DEVIATION))
        })
        .collect();
    if away.is_empty() {
        let _ = writeln!(
            o,
            "  every node is within ±{pct:.0}% of the class median on every backend (ratios in --json)"
        );
    } else {
        let _ = writeln!(
            o,
            "  nodes ±{pct:.0}% or more from the class, ratio of their slowest group (median over its sizes; 1.00 = typical; the other {} in --json):",
            c.nodes.len() - away.len()
        );
    }
    for node in away {
        let per = &c.node_ratios[node];
        let cols: Vec<String> = shown
            .iter()
            .filter_map(|b| per.get(b).map(|r| format!("{} {r:.2}", b.id())))
            .collect();
        let _ = writeln!(o, "    {node}: {}", cols.join(", "));
    }
}

/// The report as pretty JSON with a trailing newline.
pub fn json(r: &FleetReport) -> String {
    let mut s = serde_json::to_string_pretty(r).expect("fleet report serializes");
    s.push('\n');
    s
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text exposition format, for node_exporter's textfile collector.
pub fn prom(r: &FleetReport) -> String {
    let mut o = String::new();
    let mut metric = |name: &str, help: &str, rows: Vec<(String, f64)>| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (labels, v) in rows {
            if labels.is_empty() {
                let _ = writeln!(o, "{name} {v}");
            } else {
                let _ = writeln!(o, "{name}{{{labels}}} {v}");
            }
        }
    };
    let base = |c: &ClassReport| {
        format!(
            "class=\"{}\",mode=\"{}\"",
            label(&c.topology_class),
            c.mode.id()
        )
    };
    let per_node = |f: &dyn Fn(&ClassReport, &str) -> f64| {
        let mut rows = Vec::new();
        for c in &r.classes {
            for n in &c.nodes {
                rows.push((format!("{},node=\"{}\"", base(c), label(n)), f(c, n)));
            }
        }
        rows
    };
    metric(
        "artune_fleet_class_nodes",
        "Nodes per topology class and launch mode.",
        r.classes
            .iter()
            .map(|c| (base(c), c.nodes.len() as f64))
            .collect(),
    );
    let mut ratios = Vec::new();
    for c in &r.classes {
        for (n, per) in &c.node_ratios {
            for (b, v) in per {
                ratios.push((
                    format!("{},node=\"{}\",backend=\"{}\"", base(c), label(n), b.id()),
                    *v,
                ));
            }
        }
    }
    metric(
        "artune_fleet_node_ratio",
        "A node's allreduce time over its class's median in its slowest TP group (median over the group's sizes), per backend (1 is typical, 2 twice as slow).",
        ratios,
    );
    metric(
        "artune_fleet_node_outlier",
        "1 when the node is an outlier of its class (MAD-based), else 0.",
        per_node(&|c, n| f64::from(u8::from(c.outliers.iter().any(|o| o.node == n)))),
    );
    metric(
        "artune_fleet_node_choices_differ",
        "Sizes at which the node chose another backend than most of its class.",
        per_node(&|c, n| {
            c.choices_differ
                .iter()
                .find(|d| d.node == n)
                .map_or(0.0, |d| d.differ as f64)
        }),
    );
    metric(
        "artune_fleet_node_versions_differ",
        "1 when the node was tuned with other driver, CUDA or NCCL versions than most of its class.",
        per_node(&|c, n| f64::from(u8::from(c.versions_differ.iter().any(|s| s.node == n)))),
    );
    metric(
        "artune_fleet_class_version_sets",
        "Distinct driver, CUDA and NCCL version sets the class's profiles were tuned with (above 1: mixed).",
        r.classes
            .iter()
            .map(|c| (base(c), c.version_sets.len().max(1) as f64))
            .collect(),
    );
    metric(
        "artune_fleet_node_groups_differ",
        "1 when the node tuned other groups (TP sizes, GPUs, modes) than most of its class.",
        per_node(&|c, n| f64::from(u8::from(c.groups_differ.iter().any(|s| s.node == n)))),
    );
    metric(
        "artune_fleet_node_simulated",
        "1 when the node's profile is simulated, not measured.",
        per_node(&|c, n| f64::from(u8::from(c.simulated.iter().any(|s| s == n)))),
    );
    metric(
        "artune_fleet_skipped_files",
        "Profile files in the directory that could not be aggregated.",
        vec![(String::new(), r.skipped.len() as f64)],
    );
    o
}

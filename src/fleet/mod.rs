//! `artune fleet`: which of many nodes is not like the others.
//!
//! 1. [`read::collect`] streams a directory of node profiles into compact per-class tables.
//! 2. [`analyze`] groups nodes by topology class and launch mode and compares each node with its
//!    class: per (TP group, size) the median time of every backend and each node's ratio to it,
//!    outliers by the median absolute deviation, choices that differ, stale and simulated nodes.
//! 3. [`consensus`] builds a class profile from the nodes that are neither outliers nor stale,
//!    with `fleet` provenance; [`output`] renders the report for people, JSON and Prometheus.

pub mod consensus;
pub mod output;
pub mod read;

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::error::Error;
use crate::fabric::{Backend, Dtype, Mode};
use crate::stats::{median_sorted, OUTLIER_Z};
use read::{ClassData, Collected, Skipped, Versions};

/// How far from its class's median a result must be, relative to it, to count as deviating
/// (on top of the robust z-score), and what share of a node's results must deviate for the
/// node to be an outlier. Noise between healthy nodes stays well inside 10%.
pub const DEVIATION: f64 = 0.10;
pub const OUTLIER_SHARE: f64 = 0.05;

/// A MAD below this share of the median is taken as this share, so identical simulated nodes
/// (MAD 0) do not make every tiny difference infinitely significant.
const MAD_FLOOR: f64 = 0.01;

#[derive(Debug, Clone, Serialize)]
pub struct Deviation {
    pub tp: usize,
    pub gpus: Vec<usize>,
    pub bytes: u64,
    pub backend: Backend,
    /// Node time over the class median.
    pub ratio: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Outlier {
    pub node: String,
    /// Results of the node that deviate, and how many it has.
    pub deviating: usize,
    pub results: usize,
    /// The deviating results, largest deviation first.
    pub deviations: Vec<Deviation>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChoiceDiff {
    pub node: String,
    /// Cells where the node chose otherwise, of the cells it has.
    pub differ: usize,
    pub of: usize,
    /// A few of them: (TP, bytes, the node's choice, the class's).
    pub examples: Vec<(usize, u64, Backend, Backend)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeNote {
    pub node: String,
    pub reason: String,
}

/// One backend at one cell across the class.
#[derive(Debug, Clone, Serialize)]
pub struct CellBackend {
    pub median_us: f64,
    /// Each node's time over the median, in the order of the class's `nodes` (null where the
    /// node has no result): a list, so a report on thousands of nodes stays small.
    pub ratios: Vec<Option<f64>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CellReport {
    pub tp: usize,
    pub gpus: Vec<usize>,
    pub bytes: u64,
    /// The choice most nodes made.
    pub choice: Backend,
    pub backends: BTreeMap<Backend, CellBackend>,
}

/// One topology class in one launch mode.
#[derive(Debug, Clone, Serialize)]
pub struct ClassReport {
    pub topology_class: String,
    pub mode: Mode,
    pub nodes: Vec<String>,
    pub simulated: Vec<String>,
    pub stale: Vec<NodeNote>,
    pub outliers: Vec<Outlier>,
    pub choices_differ: Vec<ChoiceDiff>,
    /// Per node and backend, the median over cells of its ratio to the class median.
    pub node_ratios: BTreeMap<String, BTreeMap<Backend, f64>>,
    pub cells: Vec<CellReport>,
    /// Nodes whose results make the class profile.
    #[serde(skip)]
    pub included: Vec<usize>,
    /// Nodes left out of it, and why.
    pub left_out: Vec<NodeNote>,
}

/// The whole fleet report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub dtype: Dtype,
    /// Profiles aggregated.
    pub profiles: usize,
    pub skipped: Vec<Skipped>,
    pub classes: Vec<ClassReport>,
    /// Class profiles written, by topology class.
    pub class_profiles: BTreeMap<String, String>,
    /// Node names by index into [`Collected::nodes`].
    #[serde(skip)]
    pub names: Vec<String>,
}

/// The dtype to compare: the one asked for, else the one most profiles have.
fn choose_dtype(c: &Collected, asked: Option<Dtype>, dir: &str) -> Result<Dtype, Error> {
    let mut counts: BTreeMap<Dtype, usize> = BTreeMap::new();
    for n in &c.nodes {
        *counts.entry(n.dtype).or_default() += 1;
    }
    let found = || {
        counts
            .iter()
            .map(|(d, n)| format!("{}: {n}", d.id()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if counts.is_empty() {
        let why = c
            .skipped
            .first()
            .map(|s| {
                format!(
                    " ({} skipped, first {}: {})",
                    c.skipped.len(),
                    s.file,
                    s.reason
                )
            })
            .unwrap_or_default();
        return Err(Error::bad_input(format!(
            "{dir} holds no artune profile to aggregate{why}; write one per node with `artune tune --out {dir}/{{host}}.json`"
        )));
    }
    if let Some(d) = asked {
        return if counts.contains_key(&d) {
            Ok(d)
        } else {
            Err(Error::bad_input(format!(
                "no profile in {dir} is of dtype {} (found {}); choose one of those with --dtype",
                d.id(),
                found()
            )))
        };
    }
    let top = counts.values().copied().max().unwrap_or(0);
    let leaders: Vec<Dtype> = counts
        .iter()
        .filter(|(_, &n)| n == top)
        .map(|(d, _)| *d)
        .collect();
    match leaders.as_slice() {
        [d] => Ok(*d),
        _ => Err(Error::bad_input(format!(
            "{dir} holds profiles of different dtypes ({}) and none is the majority; choose one with --dtype",
            found()
        ))),
    }
}

/// Node names: the host name where it is unique, else the file name without `.json`.
fn names(c: &Collected, dtype: Dtype) -> Vec<String> {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for n in c.nodes.iter().filter(|n| n.dtype == dtype) {
        if let Some(h) = &n.hostname {
            *count.entry(h.as_str()).or_default() += 1;
        }
    }
    let stem = |i: usize| c.nodes[i].file.trim_end_matches(".json").to_string();
    let mut names: Vec<String> = c
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| match &n.hostname {
            Some(h) if count.get(h.as_str()) == Some(&1) => h.clone(),
            _ => stem(i),
        })
        .collect();
    // A host name can equal another node's file name; file names are unique, so turning every
    // clashing node to its file name ends after a few rounds.
    loop {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for n in &names {
            *seen.entry(n.as_str()).or_default() += 1;
        }
        let clash: Vec<usize> = (0..names.len())
            .filter(|&i| seen[names[i].as_str()] > 1 && names[i] != stem(i))
            .collect();
        if clash.is_empty() {
            return names;
        }
        for i in clash {
            names[i] = stem(i);
        }
    }
}

/// Compares every class's nodes; `dir` names the directory in messages.
pub fn analyze(c: &mut Collected, asked: Option<Dtype>, dir: &str) -> Result<Report, Error> {
    let dtype = choose_dtype(c, asked, dir)?;
    let names = names(c, dtype);
    for n in c.nodes.iter().filter(|n| n.dtype != dtype) {
        c.skipped.push(Skipped {
            file: n.file.clone(),
            reason: format!(
                "its dtype is {}, and this report compares {} (choose with --dtype)",
                n.dtype.id(),
                dtype.id()
            ),
        });
    }
    let mut classes = Vec::new();
    for ((d, class, mode), data) in &c.classes {
        if *d != dtype || data.entries.is_empty() {
            continue;
        }
        classes.push(class_report(c, data, class, *mode, &names));
    }
    Ok(Report {
        dtype,
        profiles: c.nodes.iter().filter(|n| n.dtype == dtype).count(),
        skipped: c.skipped.clone(),
        classes,
        class_profiles: BTreeMap::new(),
        names,
    })
}

/// The most common item; ties go to the first in order.
fn majority<T: Ord + Clone>(items: impl Iterator<Item = T>) -> Option<T> {
    let mut counts: BTreeMap<T, usize> = BTreeMap::new();
    for i in items {
        *counts.entry(i).or_default() += 1;
    }
    let top = counts.values().copied().max()?;
    counts.into_iter().find(|(_, n)| *n == top).map(|(t, _)| t)
}

fn fmt_versions(v: &Versions) -> String {
    let s = |o: &Option<String>| o.clone().unwrap_or_else(|| "?".into());
    format!("driver {}, CUDA {}, NCCL {}", s(&v.0), s(&v.1), s(&v.2))
}

fn class_report(
    c: &Collected,
    data: &ClassData,
    class: &str,
    mode: Mode,
    names: &[String],
) -> ClassReport {
    let name = |e: usize| names[data.entries[e].node].clone();
    let info = |e: usize| &c.nodes[data.entries[e].node];
    // Values per (cell, backend): (entry, µs).
    let mut values: HashMap<(u32, Backend), Vec<(usize, f64)>> = HashMap::new();
    for (e, entry) in data.entries.iter().enumerate() {
        for &(cell, b, us) in &entry.times {
            values.entry((cell, b)).or_default().push((e, us as f64));
        }
    }
    let n = data.entries.len();
    let mut deviations: Vec<Vec<Deviation>> = vec![Vec::new(); n];
    let mut results = vec![0usize; n];
    let mut ratios: Vec<BTreeMap<Backend, Vec<f64>>> = vec![BTreeMap::new(); n];
    let mut cell_backends: BTreeMap<u32, BTreeMap<Backend, CellBackend>> = BTreeMap::new();
    let mut keys: Vec<&(u32, Backend)> = values.keys().collect();
    keys.sort();
    for key in keys {
        let vs = &values[key];
        let mut xs: Vec<f64> = vs.iter().map(|v| v.1).collect();
        xs.sort_by(f64::total_cmp);
        let m = median_sorted(&xs);
        let mut dev: Vec<f64> = xs.iter().map(|x| (x - m).abs()).collect();
        dev.sort_by(f64::total_cmp);
        let mad = median_sorted(&dev).max(MAD_FLOOR * m);
        let mut cb = CellBackend {
            median_us: m,
            ratios: vec![None; n],
        };
        for &(e, v) in vs {
            let ratio = if m > 0.0 { v / m } else { 1.0 };
            results[e] += 1;
            ratios[e].entry(key.1).or_default().push(ratio);
            cb.ratios[e] = Some(ratio);
            // Modified z-score as for timing samples (stats::OUTLIER_Z); needs 3 nodes.
            let z = if mad > 0.0 {
                0.6745 * (v - m).abs() / mad
            } else {
                0.0
            };
            if n >= 3 && z > OUTLIER_Z && (ratio - 1.0).abs() >= DEVIATION {
                let cell = &data.cells[key.0 as usize];
                deviations[e].push(Deviation {
                    tp: cell.tp,
                    gpus: cell.gpus.clone(),
                    bytes: cell.bytes,
                    backend: key.1,
                    ratio,
                });
            }
        }
        cell_backends.entry(key.0).or_default().insert(key.1, cb);
    }
    // The class's choice per cell, and who chose otherwise.
    let mut choices: HashMap<u32, Vec<(usize, Backend)>> = HashMap::new();
    for (e, entry) in data.entries.iter().enumerate() {
        for &(cell, b) in &entry.choices {
            choices.entry(cell).or_default().push((e, b));
        }
    }
    let class_choice: HashMap<u32, Backend> = choices
        .iter()
        .filter_map(|(cell, v)| Some((*cell, majority(v.iter().map(|x| x.1))?)))
        .collect();
    let mut choices_differ = Vec::new();
    for (e, entry) in data.entries.iter().enumerate() {
        let mut differ: Vec<(usize, u64, Backend, Backend)> = entry
            .choices
            .iter()
            .filter_map(|&(cell, b)| {
                let cc = class_choice.get(&cell).copied()?;
                let c = &data.cells[cell as usize];
                (cc != b).then_some((c.tp, c.bytes, b, cc))
            })
            .collect();
        if !differ.is_empty() {
            let count = differ.len();
            differ.truncate(4);
            choices_differ.push(ChoiceDiff {
                node: name(e),
                differ: count,
                of: entry.choices.len(),
                examples: differ,
            });
        }
    }
    let usual = majority((0..n).map(|e| info(e).versions.clone())).unwrap_or_default();
    let stale: Vec<(usize, NodeNote)> = (0..n)
        .filter(|&e| info(e).versions != usual)
        .map(|e| {
            (
                e,
                NodeNote {
                    node: name(e),
                    reason: format!(
                        "tuned with {} while most of the class has {}",
                        fmt_versions(&info(e).versions),
                        fmt_versions(&usual)
                    ),
                },
            )
        })
        .collect();
    let any_real = (0..n).any(|e| !info(e).simulated);
    let mut outliers = Vec::new();
    let mut left_out = Vec::new();
    let mut included = Vec::new();
    for e in 0..n {
        let devs = &mut deviations[e];
        let is_outlier = !devs.is_empty() && devs.len() as f64 >= OUTLIER_SHARE * results[e] as f64;
        if is_outlier {
            devs.sort_by(|a, b| (b.ratio - 1.0).abs().total_cmp(&(a.ratio - 1.0).abs()));
            let worst = &devs[0];
            left_out.push(NodeNote {
                node: name(e),
                reason: format!(
                    "outlier: {} of {} results deviate, up to {:.2}x the class median ({} at {} TP{})",
                    devs.len(),
                    results[e],
                    worst.ratio,
                    worst.backend,
                    crate::units::fmt_bytes(worst.bytes),
                    worst.tp
                ),
            });
            outliers.push(Outlier {
                node: name(e),
                deviating: devs.len(),
                results: results[e],
                deviations: devs.clone(),
            });
        } else if let Some((_, s)) = stale.iter().find(|(i, _)| *i == e) {
            left_out.push(NodeNote {
                node: s.node.clone(),
                reason: format!("stale: {}", s.reason),
            });
        } else if any_real && info(e).simulated {
            left_out.push(NodeNote {
                node: name(e),
                reason: "simulated, while the class has measured nodes".into(),
            });
        } else {
            included.push(data.entries[e].node);
        }
    }
    let cells = cell_backends
        .into_iter()
        .map(|(cell, backends)| {
            let c = &data.cells[cell as usize];
            CellReport {
                tp: c.tp,
                gpus: c.gpus.clone(),
                bytes: c.bytes,
                choice: class_choice.get(&cell).copied().unwrap_or(Backend::Nccl),
                backends,
            }
        })
        .collect::<Vec<_>>();
    let mut cells = cells;
    cells.sort_by(|a, b| (a.tp, &a.gpus, a.bytes).cmp(&(b.tp, &b.gpus, b.bytes)));
    ClassReport {
        topology_class: class.to_string(),
        mode,
        nodes: (0..n).map(name).collect(),
        simulated: (0..n).filter(|&e| info(e).simulated).map(name).collect(),
        stale: stale.into_iter().map(|(_, s)| s).collect(),
        outliers,
        choices_differ,
        node_ratios: (0..n)
            .map(|e| {
                let per: BTreeMap<Backend, f64> = ratios[e]
                    .iter()
                    .map(|(b, v)| {
                        let mut v = v.clone();
                        v.sort_by(f64::total_cmp);
                        (*b, median_sorted(&v))
                    })
                    .collect();
                (name(e), per)
            })
            .collect(),
        cells,
        included,
        left_out,
    }
}

/// Reads `dir`, compares its nodes and returns the report with what a class profile needs.
pub fn run(dir: &std::path::Path, dtype: Option<Dtype>) -> Result<(Report, Collected), Error> {
    let mut c = read::collect(dir)?;
    let r = analyze(&mut c, dtype, &dir.display().to_string())?;
    Ok((r, c))
}

#[cfg(test)]
mod tests;

//! `artune fleet`: which of many nodes is not like the others.
//!
//! 1. [`read::collect`] streams a directory of node profiles into compact per-class tables.
//! 2. [`analyze`] groups nodes by topology class and launch mode and compares each node with its
//!    class: per (TP group, size) the median time of every backend and each node's ratio to it,
//!    outliers by the median absolute deviation, choices that differ, mixed versions, nodes
//!    that tuned other groups, simulated nodes.
//! 3. [`consensus`] builds a class profile from the nodes that are neither outliers, on other
//!    versions, nor tuned other groups, with `fleet` provenance; [`output`] renders the report
//!    for people, JSON and Prometheus.

mod compare;
pub mod consensus;
pub mod output;
pub mod read;

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::allreduce::{Backend, Dtype, Mode};
use crate::error::Error;
use compare::class_report;
use read::{Collected, Skipped};

pub use compare::{DEVIATION, OUTLIER_SHARE};

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
    /// Cells where the node chose otherwise beyond its intervals, of the cells it has.
    pub differ: usize,
    /// Cells where it chose otherwise within its intervals (a tie with the class's choice).
    pub ties: usize,
    /// Cells where it chose what the class chose at a neighbouring size (its crossover sits
    /// one size from the class's).
    pub edges: usize,
    pub of: usize,
    /// A few of them: (TP, bytes, the node's choice, the class's, the group's GPUs), so that
    /// `artune why` can be asked about the same group.
    pub examples: Vec<(usize, u64, Backend, Backend, Vec<usize>)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeNote {
    pub node: String,
    pub reason: String,
}

/// Nodes of a class tuned with one set of driver, CUDA and NCCL versions.
#[derive(Debug, Clone, Serialize)]
pub struct VersionSet {
    pub versions: String,
    pub nodes: Vec<String>,
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
    /// The choice most of the nodes the class profile is built from made; none where only
    /// nodes left out of it measured this size.
    pub choice: Option<Backend>,
    pub backends: BTreeMap<Backend, CellBackend>,
}

/// One topology class in one launch mode.
#[derive(Debug, Clone, Serialize)]
pub struct ClassReport {
    pub topology_class: String,
    pub mode: Mode,
    pub nodes: Vec<String>,
    pub simulated: Vec<String>,
    /// Nodes tuned with other versions than most of the class: another software state (a
    /// rolling upgrade, or a node whose re-tune failed and kept its last profile), left out.
    pub versions_differ: Vec<NodeNote>,
    /// The class's version sets where it has more than one (the class profile's first), else
    /// empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub version_sets: Vec<VersionSet>,
    /// Nodes that tuned other groups (TP sizes, GPUs, modes) than most of the class: left out,
    /// as the class profile holds the groups most nodes tuned.
    pub groups_differ: Vec<NodeNote>,
    pub outliers: Vec<Outlier>,
    /// Whether the class has the nodes an outlier can be told apart among (3 or more).
    pub outliers_judged: bool,
    pub choices_differ: Vec<ChoiceDiff>,
    /// Per node and backend, its slowest group's ratio to the class median (the median over
    /// the group's sizes), so one slow link shows.
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
pub struct FleetReport {
    pub dtype: Dtype,
    /// Profiles aggregated.
    pub profiles: usize,
    pub skipped: Vec<Skipped>,
    /// Profiles of another dtype: sound, left to a run with `--dtype`, so no warning.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub other_dtype: Vec<Skipped>,
    /// Older profiles of a node another file also holds: left out, so each node counts once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub duplicates: Vec<Skipped>,
    /// Class profiles found in the directory (a fleet run's own output): not nodes, left out.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub class_profiles_found: Vec<String>,
    pub classes: Vec<ClassReport>,
    /// Class profiles written, by topology class.
    pub class_profiles: BTreeMap<String, String>,
    /// Node names by index into [`Collected::nodes`].
    #[serde(skip)]
    pub names: Vec<String>,
}

impl FleetReport {
    /// Distinct topology classes (each may hold a graph and an eager report).
    pub fn class_count(&self) -> usize {
        let mut v: Vec<&str> = self
            .classes
            .iter()
            .map(|c| c.topology_class.as_str())
            .collect();
        v.sort_unstable();
        v.dedup();
        v.len()
    }

    /// The exit code the report calls for: class profiles that could not be written first (the
    /// run failed at its job), then an outlier (it needs a person), then a class of mixed
    /// versions (exit 3: some profiles may no longer hold), then skipped files or nodes that
    /// tuned other groups than their class (exit 5), else 0.
    pub fn exit_code(&self, not_written: bool) -> i32 {
        use crate::error::{EXIT_NOT_WRITTEN, EXIT_OUTLIER, EXIT_STALE};
        if not_written {
            EXIT_NOT_WRITTEN
        } else if self.classes.iter().any(|c| !c.outliers.is_empty()) {
            EXIT_OUTLIER
        } else if self.classes.iter().any(|c| !c.versions_differ.is_empty()) {
            EXIT_STALE
        } else if !self.skipped.is_empty()
            || self.classes.iter().any(|c| !c.groups_differ.is_empty())
        {
            crate::error::EXIT_WARNINGS
        } else {
            0
        }
    }
}

/// Writes one class profile per topology class into `out_dir`, recording each in the report.
/// Profiles that cannot be written are returned (one sentence each) rather than failing at
/// once: the report is worth printing from a read-only directory, and the exit code says so.
/// `default_out`: `out_dir` is DIR/classes, no --out given (so errors do not name --out).
pub fn write_class_profiles(
    report: &mut FleetReport,
    collected: &Collected,
    out_dir: &std::path::Path,
    default_out: bool,
    force: bool,
) -> Result<Vec<String>, Error> {
    let mut classes: Vec<String> = report
        .classes
        .iter()
        .map(|c| c.topology_class.clone())
        .collect();
    classes.dedup();
    let mut warnings = Vec::new();
    if classes.is_empty() {
        return Ok(warnings);
    }
    if let Err(e) = std::fs::create_dir_all(out_dir) {
        warnings.push(format!(
            "class profiles not written: cannot create {}: {e}; pass --out a writable directory",
            out_dir.display()
        ));
        return Ok(warnings);
    }
    // All or none: a set of class profiles with one missing would leave that class's nodes
    // following an older one beside the new.
    let mut planned = Vec::new();
    for class in classes {
        let Some(profile) = consensus::class_profile(collected, report, &class) else {
            continue;
        };
        let profile = match profile {
            Ok(p) => p,
            Err(e @ Error::Bug(_)) => return Err(e),
            Err(e) => {
                warnings.push(format!("class profiles not written: {e}"));
                return Ok(warnings);
            }
        };
        // The dtype in the name: a run for another dtype writes beside it, never over it.
        let hash = class.strip_prefix("sha256:").unwrap_or(&class);
        let path = out_dir.join(format!("class-{hash}-{}.json", report.dtype.id()));
        use crate::profile::paths::{check_replace, check_replace_as, Writes};
        let refused = match default_out {
            true => check_replace_as(
                &path,
                &format!(
                    "{}, the class profile fleet writes by default (into DIR/classes)",
                    path.display()
                ),
                "give --out another directory",
                Writes::Profile,
                force,
            ),
            false => check_replace(&path, "--out", Writes::Profile, force),
        };
        if let Err(e) = refused {
            warnings.push(format!("class profiles not written: {e}"));
        }
        planned.push((class, path, profile.to_json()));
    }
    if !warnings.is_empty() {
        return Ok(warnings);
    }
    let files: Vec<(&std::path::Path, &[u8])> = planned
        .iter()
        .map(|(_, path, json)| (path.as_path(), json.as_bytes()))
        .collect();
    if let Err(e) = crate::profile::write_all_atomic(&files) {
        warnings.push(format!("class profiles not written: {e}"));
        return Ok(warnings);
    }
    for (class, path, _) in planned {
        report
            .class_profiles
            .insert(class, path.display().to_string());
    }
    Ok(warnings)
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
pub fn analyze(c: &mut Collected, asked: Option<Dtype>, dir: &str) -> Result<FleetReport, Error> {
    let dtype = choose_dtype(c, asked, dir)?;
    let names = names(c, dtype);
    let mut other_dtype = Vec::new();
    for n in c.nodes.iter().filter(|n| n.dtype != dtype) {
        other_dtype.push(Skipped {
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
        let groups = usual_groups(c, dtype, class);
        classes.push(class_report(c, data, class, *mode, &names, groups));
    }
    Ok(FleetReport {
        dtype,
        profiles: c.nodes.iter().filter(|n| n.dtype == dtype).count(),
        skipped: c.skipped.clone(),
        other_dtype,
        duplicates: c.duplicates.clone(),
        class_profiles_found: c.class_profiles.clone(),
        classes,
        class_profiles: BTreeMap::new(),
        names,
    })
}

/// The set of groups most nodes of `class` tuned (an index into `group_sets`); on a tie the
/// larger set, as a node that tuned less is the one that stopped short.
pub(crate) fn usual_groups(c: &Collected, dtype: Dtype, class: &str) -> usize {
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    for n in c
        .nodes
        .iter()
        .filter(|n| n.dtype == dtype && n.class == class)
    {
        *counts.entry(n.groups).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|&(set, k)| (k, c.group_sets[set].len(), usize::MAX - set))
        .map_or(0, |(set, _)| set)
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

/// Reads `dir`, compares its nodes and returns the report with what a class profile needs.
pub fn run(dir: &std::path::Path, dtype: Option<Dtype>) -> Result<(FleetReport, Collected), Error> {
    let mut c = read::collect(dir)?;
    let r = analyze(&mut c, dtype, &dir.display().to_string())?;
    Ok((r, c))
}

#[cfg(test)]
mod tests;

//! One class compared node by node: per (cell, backend) the class median, each node's ratio
//! to it and whether it deviates; then outliers, differing choices, nodes on other versions or
//! that tuned other groups, simulated nodes, and who the class profile is built from.

use std::collections::{BTreeMap, HashMap};

use super::read::GroupKey;
use super::read::{ClassData, Collected, NodeVersions};
use super::{
    majority, CellBackend, CellReport, ChoiceDiff, ClassReport, Deviation, NodeNote, Outlier,
    VersionSet,
};
use crate::allreduce::{Backend, Mode};
use crate::stats::{median_sorted, OUTLIER_Z};

/// How far from its class's median a result must be, relative to it, to count as deviating
/// (on top of the robust z-score), and what share of a node's results must deviate for the
/// node to be an outlier. Noise between healthy nodes stays well inside 10%.
pub const DEVIATION: f64 = 0.10;
pub const OUTLIER_SHARE: f64 = 0.05;

/// A MAD below this share of the median is taken as this share, so identical simulated nodes
/// (MAD 0) do not make every tiny difference infinitely significant.
const MAD_FLOOR: f64 = 0.01;

/// Fewest nodes a class needs before any can be told apart as an outlier (a robust z-score of
/// two values says nothing).
pub(super) const OUTLIER_NODES: usize = 3;

/// A version as numbers where it is one ("570.86.10" above "560.35.3", whatever the strings
/// sort as); None sorts first, so a known version beats an unknown one.
fn version_key(v: &Option<String>) -> Option<Vec<u64>> {
    v.as_ref().map(|s| {
        s.split(['.', '-', '+'])
            .map(|p| p.parse().unwrap_or(0))
            .collect()
    })
}

/// The versions the class is judged against: those most of its nodes have; where two sets tie,
/// the newest (upgrades move forward, so the older are the ones behind). True where it is a
/// tie, for the words.
pub(super) fn usual_versions(all: &[NodeVersions]) -> (NodeVersions, bool) {
    let mut counts: Vec<(NodeVersions, usize)> = Vec::new();
    for v in all {
        match counts.iter_mut().find(|(u, _)| u == v) {
            Some((_, n)) => *n += 1,
            None => counts.push((v.clone(), 1)),
        }
    }
    let top = counts.iter().map(|c| c.1).max().unwrap_or(0);
    let key = |v: &NodeVersions| (version_key(&v.0), version_key(&v.1), version_key(&v.2));
    let tied = counts.iter().filter(|c| c.1 == top).count() > 1;
    let usual = counts
        .into_iter()
        .filter(|c| c.1 == top)
        .map(|c| c.0)
        .max_by(|a, b| key(a).cmp(&key(b)))
        .unwrap_or_default();
    (usual, tied)
}

pub(super) fn fmt_versions(v: &NodeVersions) -> String {
    let s = |o: &Option<String>| o.clone().unwrap_or_else(|| "?".into());
    format!("driver {}, CUDA {}, NCCL {}", s(&v.0), s(&v.1), s(&v.2))
}

/// A set of groups in words: "graph TP2 (4 groups), eager TP2, TP4".
pub(super) fn fmt_groups(set: &[GroupKey]) -> String {
    let mut parts: Vec<String> = Vec::new();
    for mode in [Mode::Graph, Mode::Eager] {
        let mut tps: BTreeMap<usize, usize> = BTreeMap::new();
        for (_, tp, _) in set.iter().filter(|g| g.0 == mode) {
            *tps.entry(*tp).or_default() += 1;
        }
        if tps.is_empty() {
            continue;
        }
        let tps: Vec<String> = tps
            .iter()
            .map(|(tp, k)| match k {
                1 => format!("TP{tp}"),
                k => format!("TP{tp} ({k} groups)"),
            })
            .collect();
        parts.push(format!("{} {}", mode.id(), tps.join(", ")));
    }
    match parts.is_empty() {
        true => "no groups".into(),
        false => parts.join("; "),
    }
}

/// Compares the nodes of one topology class in one launch mode; `names` by node index.
pub(super) fn class_report(
    c: &Collected,
    data: &ClassData,
    class: &str,
    mode: Mode,
    names: &[String],
    usual_groups: usize,
) -> ClassReport {
    let name = |e: usize| names[data.entries[e].node].clone();
    let info = |e: usize| &c.nodes[data.entries[e].node];
    let n = data.entries.len();
    let t = timings(data);
    let all: Vec<NodeVersions> = (0..n).map(|e| info(e).versions.clone()).collect();
    let (usual, tied) = usual_versions(&all);
    let most = match tied {
        false => "most of the class has",
        true => "as many nodes of the class have the newer",
    };
    // The oldest profile on the usual versions: one older than all of them was not re-tuned.
    let oldest_usual = (0..n)
        .filter(|&e| info(e).versions == usual)
        .map(|e| info(e).created.as_str())
        .min();
    let versions_differ: Vec<(usize, NodeNote)> = (0..n)
        .filter(|&e| info(e).versions != usual)
        .map(|e| {
            let older = match oldest_usual.is_some_and(|o| info(e).created.as_str() < o) {
                true => ", and its profile is older than all of theirs (a failed re-tune keeps the last profile)",
                false => "",
            };
            let note = NodeNote {
                node: name(e),
                reason: format!(
                    "tuned with {} while {most} {}{older}",
                    fmt_versions(&info(e).versions),
                    fmt_versions(&usual)
                ),
            };
            (e, note)
        })
        .collect();
    let groups_differ: Vec<(usize, NodeNote)> = (0..n)
        .filter(|&e| info(e).groups != usual_groups)
        .map(|e| {
            let note = NodeNote {
                node: name(e),
                reason: format!(
                    "tuned {} while most of the class tuned {}",
                    fmt_groups(&c.group_sets[info(e).groups]),
                    fmt_groups(&c.group_sets[usual_groups])
                ),
            };
            (e, note)
        })
        .collect();
    let mut version_sets: Vec<VersionSet> = Vec::new();
    for e in 0..n {
        let v = fmt_versions(&info(e).versions);
        match version_sets.iter_mut().find(|s| s.versions == v) {
            Some(s) => s.nodes.push(name(e)),
            None => version_sets.push(VersionSet {
                versions: v,
                nodes: vec![name(e)],
            }),
        }
    }
    if version_sets.len() < 2 {
        version_sets.clear();
    }
    // The class profile's set first, then by size.
    let usual_set = fmt_versions(&usual);
    version_sets.sort_by_key(|s| (s.versions != usual_set, usize::MAX - s.nodes.len()));
    let (outliers, left_out, included) = who_is_left_out(
        c,
        data,
        t.deviations,
        &t.results,
        &[&versions_differ, &groups_differ],
        &name,
    );
    let class_choice = class_choices(data, &included);
    let choices_differ = choice_diffs(data, &class_choice, &name);
    let mut cells = t
        .cell_backends
        .into_iter()
        .map(|(cell, backends)| {
            let c = &data.cells[cell as usize];
            CellReport {
                tp: c.tp,
                gpus: c.gpus.clone(),
                bytes: c.bytes,
                choice: class_choice.get(&cell).copied(),
                backends,
            }
        })
        .collect::<Vec<_>>();
    cells.sort_by(|a, b| (a.tp, &a.gpus, a.bytes).cmp(&(b.tp, &b.gpus, b.bytes)));
    ClassReport {
        topology_class: class.to_string(),
        mode,
        nodes: (0..n).map(name).collect(),
        simulated: (0..n).filter(|&e| info(e).simulated).map(name).collect(),
        versions_differ: versions_differ.into_iter().map(|(_, s)| s).collect(),
        version_sets,
        groups_differ: groups_differ.into_iter().map(|(_, s)| s).collect(),
        outliers,
        outliers_judged: n >= OUTLIER_NODES,
        choices_differ,
        node_ratios: (0..n)
            .map(|e| (name(e), worst_group(&t.ratios[e])))
            .collect(),
        cells,
        included,
        left_out,
    }
}

/// What the nodes' timings say: per (cell, backend) the class median and each node's ratio to
/// it, and per node the results it has, its ratios per backend and its deviating results.
struct Timings {
    deviations: Vec<Vec<Deviation>>,
    results: Vec<usize>,
    /// Per node, backend and group (TP, GPUs): its ratios over the group's sizes.
    ratios: Vec<GroupRatios>,
    cell_backends: BTreeMap<u32, BTreeMap<Backend, CellBackend>>,
}

/// Per backend and group (TP, GPUs): (bytes, ratio) at each of the group's sizes.
type GroupRatios = BTreeMap<Backend, BTreeMap<(usize, Vec<usize>), Vec<(u64, f64)>>>;

/// Adjacent sizes a node's ratio is taken over: one noisy size cannot move it, a slowdown
/// over a range of sizes (bandwidth-bound ones through a slow link, latency-bound ones) does.
const RATIO_SIZES: usize = 3;

/// Per backend, the node's ratio where it is slowest: in each group, the median ratio of
/// every run of [`RATIO_SIZES`] adjacent sizes, and the largest of those. A median over every
/// size of every group hides one slow link, which slows only the large sizes of the groups
/// through it (a node with GPU 2 at x8 read 1.00).
fn worst_group(ratios: &GroupRatios) -> BTreeMap<Backend, f64> {
    let worst_run = |v: &Vec<(u64, f64)>| {
        let mut v = v.clone();
        v.sort_by_key(|x| x.0);
        let r: Vec<f64> = v.iter().map(|x| x.1).collect();
        r.windows(RATIO_SIZES.min(r.len()))
            .map(|w| {
                let mut w = w.to_vec();
                w.sort_by(f64::total_cmp);
                median_sorted(&w)
            })
            .fold(f64::MIN, f64::max)
    };
    ratios
        .iter()
        .map(|(b, groups)| (*b, groups.values().map(worst_run).fold(f64::MIN, f64::max)))
        .collect()
}

fn timings(data: &ClassData) -> Timings {
    // Values per (cell, backend): (entry, µs).
    let mut values: HashMap<(u32, Backend), Vec<(usize, f64)>> = HashMap::new();
    for (e, entry) in data.entries.iter().enumerate() {
        for &(cell, b, us) in &entry.times {
            values.entry((cell, b)).or_default().push((e, us as f64));
        }
    }
    let n = data.entries.len();
    let mut t = Timings {
        deviations: vec![Vec::new(); n],
        results: vec![0usize; n],
        ratios: vec![BTreeMap::new(); n],
        cell_backends: BTreeMap::new(),
    };
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
            t.results[e] += 1;
            let cell = &data.cells[key.0 as usize];
            let group = (cell.tp, cell.gpus.clone());
            let per = t.ratios[e].entry(key.1).or_default();
            per.entry(group).or_default().push((cell.bytes, ratio));
            cb.ratios[e] = Some(ratio);
            // Modified z-score as for timing samples (stats::OUTLIER_Z); needs 3 nodes.
            let z = if mad > 0.0 {
                0.6745 * (v - m).abs() / mad
            } else {
                0.0
            };
            if n >= OUTLIER_NODES && z > OUTLIER_Z && (ratio - 1.0).abs() >= DEVIATION {
                let cell = &data.cells[key.0 as usize];
                t.deviations[e].push(Deviation {
                    tp: cell.tp,
                    gpus: cell.gpus.clone(),
                    bytes: cell.bytes,
                    backend: key.1,
                    ratio,
                });
            }
        }
        t.cell_backends.entry(key.0).or_default().insert(key.1, cb);
    }
    t
}

/// The class's choice per cell: what most of the nodes the class profile is built from
/// (`included`, by node index) chose there, as the class profile has it; none at a cell only
/// nodes left out of it have (an outlier's own refinement sizes). Where every node is left
/// out, what most of them chose.
fn class_choices(data: &ClassData, included: &[usize]) -> HashMap<u32, Backend> {
    let mut choices: HashMap<u32, Vec<Backend>> = HashMap::new();
    let counted = |node: usize| included.is_empty() || included.contains(&node);
    for entry in data.entries.iter().filter(|e| counted(e.node)) {
        for &(cell, b) in &entry.choices {
            choices.entry(cell).or_default().push(b);
        }
    }
    choices
        .into_iter()
        .filter_map(|(cell, v)| Some((cell, majority(v.into_iter())?)))
        .collect()
}

/// Who chose otherwise than the class, per node. Two kinds of difference are counted, not
/// reported: a tie (the node's own intervals cannot tell its choice from the class's), and a
/// band edge (the node chose what the class chose at the neighbouring size: its crossover sits
/// one size from the class's). Healthy nodes of one class differ that way all the time: 12 of
/// 30 were listed for a crossover one size off.
fn choice_diffs(
    data: &ClassData,
    class_choice: &HashMap<u32, Backend>,
    name: &dyn Fn(usize) -> String,
) -> Vec<ChoiceDiff> {
    // Per group, its cells in size order (bytes, cell), for the neighbours of a cell.
    type Sizes = Vec<(u64, u32)>;
    let mut by_group: HashMap<(usize, &[usize]), Sizes> = HashMap::new();
    for (i, c) in data.cells.iter().enumerate() {
        if class_choice.contains_key(&(i as u32)) {
            by_group
                .entry((c.tp, &c.gpus))
                .or_default()
                .push((c.bytes, i as u32));
        }
    }
    by_group.values_mut().for_each(|v| v.sort_unstable());
    let at_edge = |cell: u32, mine: Backend| {
        let c = &data.cells[cell as usize];
        let sizes = &by_group[&(c.tp, &c.gpus[..])];
        let at = sizes.iter().position(|&(_, i)| i == cell).unwrap_or(0);
        [at.checked_sub(1), Some(at + 1)]
            .into_iter()
            .flatten()
            .filter_map(|j| sizes.get(j))
            .any(|(_, i)| class_choice.get(i) == Some(&mine))
    };
    let mut out = Vec::new();
    for (e, entry) in data.entries.iter().enumerate() {
        let (mut ties, mut edges) = (0, 0);
        let mut differ: Vec<(usize, u64, Backend, Backend, Vec<usize>)> = Vec::new();
        for (&(cell, b), &tied) in entry.choices.iter().zip(&entry.ties) {
            let Some(cc) = class_choice.get(&cell).copied().filter(|cc| *cc != b) else {
                continue;
            };
            let c = &data.cells[cell as usize];
            if tied & super::read::tie_bit(cc) != 0 {
                ties += 1;
            } else if at_edge(cell, b) {
                edges += 1;
            } else {
                differ.push((c.tp, c.bytes, b, cc, c.gpus.clone()));
            }
        }
        if !differ.is_empty() || ties > 0 || edges > 0 {
            let count = differ.len();
            differ.truncate(4);
            out.push(ChoiceDiff {
                node: name(e),
                differ: count,
                ties,
                edges,
                of: entry.choices.len(),
                examples: differ,
            });
        }
    }
    out
}

/// Which nodes the class profile leaves out (outliers, then the nodes `apart`: on other
/// versions or with other groups than most of the class, then simulated nodes where the class
/// has measured ones), and which it is built from.
fn who_is_left_out(
    c: &Collected,
    data: &ClassData,
    mut deviations: Vec<Vec<Deviation>>,
    results: &[usize],
    apart: &[&[(usize, NodeNote)]],
    name: &dyn Fn(usize) -> String,
) -> (Vec<Outlier>, Vec<NodeNote>, Vec<usize>) {
    let info = |e: usize| &c.nodes[data.entries[e].node];
    let n = data.entries.len();
    let any_real = (0..n).any(|e| !info(e).simulated);
    let (mut outliers, mut left_out, mut included) = (Vec::new(), Vec::new(), Vec::new());
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
        } else if let Some((_, s)) = apart.iter().flat_map(|a| a.iter()).find(|(i, _)| *i == e) {
            left_out.push(s.clone());
        } else if any_real && info(e).simulated {
            left_out.push(NodeNote {
                node: name(e),
                reason: "simulated, while the class has measured nodes".into(),
            });
        } else {
            included.push(data.entries[e].node);
        }
    }
    (outliers, left_out, included)
}

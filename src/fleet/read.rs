//! Reads a directory of node profiles one at a time, keeping only what the fleet report needs
//! from each: its name, versions, and a median per (cell, backend). A parsed profile is dropped
//! before the next file is opened, so memory grows with nodes × measured cells, never with the
//! size of the files.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use crate::allreduce::{Backend, Dtype, Mode};
use crate::error::Error;
use crate::profile::Profile;

/// A file that was not aggregated, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Skipped {
    pub file: String,
    pub reason: String,
}

/// One TP group (by its GPUs) at one message size; the launch mode is part of the class.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cell {
    pub tp: usize,
    pub gpus: Vec<usize>,
    pub bytes: u64,
}

/// Driver, CUDA and NCCL versions of a node.
pub type NodeVersions = (Option<String>, Option<String>, Option<String>);

/// What one node's profile contributes to one class.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeEntry {
    /// Index into [`Collected::nodes`].
    pub node: usize,
    /// (cell index, backend, median µs) for every result.
    pub times: Vec<(u32, Backend, f32)>,
    /// (cell index, the node's choice).
    pub choices: Vec<(u32, Backend)>,
    /// Per choice (same order), the backends the node's own intervals cannot tell from its
    /// choice there (neither beats the other), as bits of [`Backend::ALL`] positions: a class
    /// choice among them is a tie, not a difference.
    pub ties: Vec<u16>,
    /// (cell index, the node's NCCL pin there, the channel count it measured for it), where
    /// the node pinned a variant and measured its channels.
    pub pins: Vec<(u32, Backend, u32)>,
}

/// One tuned group: launch mode, TP size and GPUs.
pub type GroupKey = (Mode, usize, Vec<usize>);

/// A node: one profile file.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    /// File name within the directory.
    pub file: String,
    pub hostname: Option<String>,
    pub simulated: bool,
    pub versions: NodeVersions,
    pub dtype: Dtype,
    /// The profile's topology class.
    pub class: String,
    /// When the profile was written (RFC 3339).
    pub created: String,
    /// The groups it tuned, as an index into [`Collected::group_sets`].
    pub groups: usize,
}

/// Nodes of one topology class in one launch mode.
#[derive(Debug, Clone, Default)]
pub struct ClassData {
    pub cells: Vec<Cell>,
    index: HashMap<Cell, u32>,
    pub entries: Vec<NodeEntry>,
}

impl ClassData {
    fn cell(&mut self, c: Cell) -> u32 {
        if let Some(&i) = self.index.get(&c) {
            return i;
        }
        let i = self.cells.len() as u32;
        self.index.insert(c.clone(), i);
        self.cells.push(c);
        i
    }
}

/// Everything read from a directory, before a dtype is chosen.
#[derive(Debug, Default)]
pub struct Collected {
    pub nodes: Vec<NodeInfo>,
    /// By (dtype, topology class, mode).
    pub classes: BTreeMap<(Dtype, String, Mode), ClassData>,
    /// Each distinct set of groups nodes tuned, sorted: nodes point into it.
    pub group_sets: Vec<Vec<GroupKey>>,
    pub skipped: Vec<Skipped>,
    /// Profiles of a node already read (same scheduler node and dtype): the older of the two
    /// is left out, and named here.
    pub duplicates: Vec<Skipped>,
    /// Class profiles found among the nodes (a fleet run's own output): not nodes, left out.
    pub class_profiles: Vec<String>,
    /// The directory read, where a class profile re-reads its template node.
    pub dir: std::path::PathBuf,
    /// Node index by (scheduler node name, dtype), to find duplicates.
    by_scheduler: HashMap<(String, Dtype), usize>,
}

/// Most nodes a fleet directory may hold: names and per-node summaries stay in memory.
pub const MAX_NODES: usize = 100_000;

/// Reads every `*.json` file directly under `dir`, in name order.
pub fn collect(dir: &Path) -> Result<Collected, Error> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::Read {
        path: dir.into(),
        reason: e.to_string(),
    })?;
    let mut names: Vec<String> = Vec::new();
    for e in entries {
        let e = e.map_err(|e| Error::Read {
            path: dir.into(),
            reason: e.to_string(),
        })?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".json") && !name.starts_with('.') {
            names.push(name);
        }
        if names.len() > MAX_NODES {
            return Err(Error::bad_input(format!(
                "{} holds more than {MAX_NODES} profiles; split the fleet into directories of at most that many",
                dir.display()
            )));
        }
    }
    names.sort_by(|a, b| natural(a, b));
    let mut c = Collected {
        dir: dir.to_path_buf(),
        ..Default::default()
    };
    for name in names {
        match Profile::load(&dir.join(&name)) {
            Ok(p) => add(&mut c, name, p),
            Err(e) => c.skipped.push(Skipped {
                file: name,
                reason: reason(&e),
            }),
        }
    }
    Ok(c)
}

/// The reason alone, without the path and advice the CLI adds.
/// Orders names as people count: node2 before node10, n1 < n10 < n100.
pub fn natural(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut v = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                v.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        v
    }
    let (x, y) = (chunks(a), chunks(b));
    for ((dx, cx), (dy, cy)) in x.iter().zip(&y) {
        let o = if *dx && *dy {
            let (tx, ty) = (cx.trim_start_matches('0'), cy.trim_start_matches('0'));
            tx.len().cmp(&ty.len()).then(tx.cmp(ty))
        } else {
            cx.cmp(cy)
        };
        if o.is_ne() {
            return o;
        }
    }
    x.len().cmp(&y.len()).then(a.cmp(b))
}

/// The backends tied with a bucket's choice by its own intervals, as bits of `Backend::ALL`.
fn ties(b: &crate::profile::Bucket) -> u16 {
    let Some(chosen) = b.results.get(&b.choice) else {
        return 0;
    };
    let mut mask = 0;
    for (i, k) in Backend::ALL.iter().enumerate() {
        if let Some(t) = b.results.get(k) {
            if !crate::decide::beats(t, chosen) && !crate::decide::beats(chosen, t) {
                mask |= 1 << i;
            }
        }
    }
    mask
}

/// Bit of `b` in a [`NodeEntry::ties`] mask.
pub fn tie_bit(b: Backend) -> u16 {
    Backend::ALL
        .iter()
        .position(|k| *k == b)
        .map_or(0, |i| 1 << i)
}

fn reason(e: &Error) -> String {
    match e {
        Error::Read { reason, .. } => format!("cannot be read: {reason}"),
        Error::Parse { reason, .. } => reason.clone(),
        Error::Profile { reason, .. } => reason.clone(),
        other => other.to_string(),
    }
}

fn add(c: &mut Collected, file: String, p: Profile) {
    if p.fleet.is_some() {
        c.class_profiles.push(file);
        return;
    }
    let Some(dtype) = p.settings.dtype.or(p.groups.first().map(|g| g.dtype)) else {
        c.skipped.push(Skipped {
            file,
            reason: "it has no groups to compare".into(),
        });
        return;
    };
    let class = p.fingerprint.topology_class.clone();
    let v = &p.versions;
    let h = &p.topology.host;
    let mut groups: Vec<GroupKey> = p
        .groups
        .iter()
        .filter(|g| g.dtype == dtype)
        .map(|g| (g.mode, g.tp, g.gpus.clone()))
        .collect();
    groups.sort();
    groups.dedup();
    let groups = match c.group_sets.iter().position(|s| *s == groups) {
        Some(i) => i,
        None => {
            c.group_sets.push(groups);
            c.group_sets.len() - 1
        }
    };
    let info = NodeInfo {
        file,
        hostname: p
            .node
            .as_ref()
            .and_then(|n| n.name().map(str::to_string))
            .or_else(|| h.hostname.clone()),
        simulated: p.simulated,
        versions: (
            v.driver.clone().or(h.driver.clone()),
            v.cuda.clone().or(h.cuda.clone()),
            v.nccl.clone().or(h.nccl.clone()),
        ),
        dtype,
        class: class.clone(),
        created: p.created.clone(),
        groups,
    };
    // The same node twice (a copied or renamed file): the newer profile counts, once.
    let scheduler = p.node.as_ref().and_then(|n| n.scheduler_node.clone());
    // Where the older profile's entries stood, so the newer keeps the node's place.
    let mut at: HashMap<(Dtype, String, Mode), usize> = HashMap::new();
    let node = match scheduler.map(|s| (s, dtype)) {
        Some(key) => match c.by_scheduler.get(&key).copied() {
            Some(old) => {
                let kept = &c.nodes[old];
                if info.created <= kept.created {
                    let than = match info.created == kept.created {
                        true => "as old as",
                        false => "older than",
                    };
                    c.duplicates.push(Skipped {
                        reason: format!(
                            "node {} again, {than} {}, which counts instead",
                            key.0, kept.file
                        ),
                        file: info.file,
                    });
                    return;
                }
                c.duplicates.push(Skipped {
                    reason: format!(
                        "node {} again, older than {}, which counts instead",
                        key.0, info.file
                    ),
                    file: kept.file.clone(),
                });
                for (k, d) in c.classes.iter_mut() {
                    if let Some(pos) = d.entries.iter().position(|e| e.node == old) {
                        d.entries.remove(pos);
                        at.insert(k.clone(), pos);
                    }
                }
                c.nodes[old] = info;
                old
            }
            None => {
                c.by_scheduler.insert(key, c.nodes.len());
                c.nodes.push(info);
                c.nodes.len() - 1
            }
        },
        None => {
            c.nodes.push(info);
            c.nodes.len() - 1
        }
    };
    let mut per_mode: BTreeMap<Mode, NodeEntry> = BTreeMap::new();
    for g in p.groups.iter().filter(|g| g.dtype == dtype) {
        let data = c.classes.entry((dtype, class.clone(), g.mode)).or_default();
        let entry = per_mode.entry(g.mode).or_insert_with(|| NodeEntry {
            node,
            times: Vec::new(),
            choices: Vec::new(),
            ties: Vec::new(),
            pins: Vec::new(),
        });
        for b in &g.buckets {
            let cell = data.cell(Cell {
                tp: g.tp,
                gpus: g.gpus.clone(),
                bytes: b.bytes,
            });
            entry.choices.push((cell, b.choice));
            entry.ties.push(ties(b));
            let pin = b.nccl_choice.filter(|p| p.nccl_pin().is_some());
            if let (Some(pin), Some(&c)) = (pin, g.pin_channels.get(&b.bytes)) {
                entry.pins.push((cell, pin, c));
            }
            for (be, t) in &b.results {
                entry.times.push((cell, *be, t.median_us as f32));
            }
        }
    }
    for (mode, entry) in per_mode {
        let key = (dtype, class.clone(), mode);
        if let Some(d) = c.classes.get_mut(&key) {
            match at.get(&key) {
                Some(&pos) => d.entries.insert(pos, entry),
                None => d.entries.push(entry),
            }
        }
    }
}

/// The profile of node `i` again, for the topology and group details a class profile takes
/// from it (only medians are kept while reading); refused where the file changed since.
pub fn reread(c: &Collected, i: usize) -> Result<Profile, Error> {
    let n = &c.nodes[i];
    let p = Profile::load(&c.dir.join(&n.file))?;
    if p.created != n.created {
        return Err(Error::bad_input(format!(
            "{} changed while fleet read the directory; run fleet again",
            c.dir.join(&n.file).display()
        )));
    }
    Ok(p)
}

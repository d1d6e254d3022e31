//! Joining an NVML reading with the PCIe tree: GPUs placed under their switches and root
//! complexes (from sysfs, or inferred from NVML's path classes where sysfs is hidden), NVLinks
//! resolved to GPUs or an NVSwitch, pairs filled in, and the whole checked.
//!
//! Pure: it takes a [`Reading`] (what [`super::nvml::read`] got from the driver), so it is
//! tested with made-up readings on machines without a GPU.

use super::sysfs::{self, Sysfs, Tree};
use super::{Gpu, Host, Link, NvSwitch, Origin, P2p, Pair, PathClass, Status, Topology};
use crate::error::Error;

/// Everything read from NVML, before the PCIe tree is joined in.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    pub host: Host,
    pub gpus: Vec<Gpu>,
    /// PCIe class per ordered pair from nvmlDeviceGetTopologyCommonAncestor; None when unknown.
    pub levels: Vec<Vec<Option<PathClass>>>,
    /// P2P status per ordered pair (diagonal unused).
    pub p2p: Vec<Vec<P2p>>,
    /// "idle", "load" or "unknown".
    pub link_reading: String,
    pub notes: Notes,
}

/// Notes that name the same failure once, listing every GPU (or pair) it hit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Notes(Vec<(String, Vec<String>)>);

impl Notes {
    pub fn add(&mut self, what: impl Into<String>, who: impl Into<String>) {
        let (what, who) = (what.into(), who.into());
        match self.0.iter_mut().find(|(w, _)| *w == what) {
            Some((_, v)) => v.push(who),
            None => self.0.push((what, vec![who])),
        }
    }

    pub fn lines(&self) -> Vec<String> {
        self.0
            .iter()
            .map(|(what, who)| {
                let who: Vec<&str> = who
                    .iter()
                    .map(String::as_str)
                    .filter(|w| !w.is_empty())
                    .collect();
                if who.is_empty() {
                    what.clone()
                } else {
                    format!("{what} ({})", who.join(", "))
                }
            })
            .collect()
    }
}

/// Nominal NVLink rate per link and direction, GB/s, from NVIDIA's per-GPU totals (P100 160 GB/s
/// over 4 links, V100 300/6, A100 600/12, H100 900/18, B200 1800/18, both directions counted).
pub fn nvlink_gbps(generation: u32) -> Option<f64> {
    Some(match generation {
        1 => 20.0,
        2..=4 => 25.0,
        5 => 50.0,
        _ => return None,
    })
}

/// Joins an NVML reading with the PCIe tree and checks the result.
pub fn assemble(r: Reading, sys: &Sysfs) -> Result<Topology, Error> {
    let mut notes = r.notes.lines();
    let n = r.gpus.len();
    let bus_ids: Option<Vec<String>> = r.gpus.iter().map(|g| g.bus_id.clone()).collect();
    let from_sysfs = match bus_ids {
        Some(ids) if sys.available() => {
            let numa: Vec<Option<u32>> = r.gpus.iter().map(|g| g.numa_node).collect();
            sys.tree(&ids, &numa)
        }
        Some(_) => Err("/sys/bus/pci is not readable here".into()),
        None => Err("a GPU has no PCI bus id".into()),
    };
    let (tree, have_sysfs) = match from_sysfs {
        Ok(t) => (t, true),
        Err(why) => {
            notes.push(format!(
                "PCIe tree inferred from NVML path classes because {why}: switch models and uplink speeds are unknown"
            ));
            (infer_tree(&r.levels), false)
        }
    };
    notes.extend(tree.notes.iter().cloned());
    let mut gpus = r.gpus;
    for (i, g) in gpus.iter_mut().enumerate() {
        g.parent = tree.parents[i].clone();
        if let Some(f) = tree.gpus.get(i) {
            g.numa_node = g.numa_node.or(f.numa_node);
            g.cpu_affinity = g.cpu_affinity.take().or_else(|| f.local_cpulist.clone());
            g.pcie.gen = g.pcie.gen.or(f.link.gen);
            g.pcie.width = g.pcie.width.or(f.link.width);
            g.pcie.max_gen = g.pcie.max_gen.or(f.link.max_gen);
            g.pcie.max_width = g.pcie.max_width.or(f.link.max_width);
        }
    }
    let nvswitch = resolve_nvlinks(&mut gpus, &mut notes);
    let mut t = Topology {
        name: None,
        origin: Origin {
            kind: "nvml".into(),
            name: None,
            link_reading: r.link_reading,
        },
        host: r.host,
        sockets: tree.sockets,
        root_complexes: tree.root_complexes,
        switches: tree.switches,
        nvswitch,
        gpus,
        pairs: Vec::new(),
        notes: Vec::new(),
    };
    let mut unknown = Vec::new();
    let mut disagree = Vec::new();
    for a in 0..n {
        for b in 0..n {
            if a == b {
                continue;
            }
            let p2p = r.p2p[a][b].clone();
            let nv = nvlinks_between(&t, a, b, p2p.nvlink);
            let tree_class = t.pcie_path(a, b);
            let pcie = match r.levels[a][b] {
                Some(c) => {
                    let same =
                        c == tree_class || (c == PathClass::X && tree_class == PathClass::PIX);
                    if have_sysfs && !same && a < b {
                        disagree.push(format!("{a}-{b} NVML {c:?}, sysfs {tree_class:?}"));
                    }
                    c
                }
                None => {
                    if a < b {
                        unknown.push(format!("{a}-{b}"));
                    }
                    tree_class
                }
            };
            let path = if nv > 0 { PathClass::NV } else { pcie };
            t.pairs.push(Pair {
                from: a,
                to: b,
                path,
                nvlinks: nv,
                p2p,
            });
        }
    }
    if !unknown.is_empty() {
        notes.push(format!(
            "NVML gave no path class for GPUs {}: taken from the PCIe tree{}",
            unknown.join(", "),
            if have_sysfs {
                ""
            } else {
                ", which places them apart (SYS)"
            }
        ));
    }
    if !disagree.is_empty() {
        notes.push(format!(
            "NVML and the sysfs PCIe tree disagree on GPUs {}: pairs keep NVML's class",
            disagree.join("; ")
        ));
    }
    t.notes = notes;
    t.normalize().map_err(|e| {
        Error::Hardware(format!(
            "the topology NVML and sysfs describe is inconsistent ({e}): please report it with the output of `nvidia-smi topo -m`"
        ))
    })?;
    Ok(t)
}

/// Active NVLinks from `a` reaching `b`: direct links, else (through NVSwitch) the smaller
/// number of switch links of the two, when NVML says P2P over NVLink works or did not answer.
fn nvlinks_between(t: &Topology, a: usize, b: usize, p2p_nvlink: Status) -> u32 {
    let direct = t.gpus[a]
        .nvlinks
        .iter()
        .filter(|l| l.active && l.remote_gpu == Some(b))
        .count() as u32;
    if direct > 0 || p2p_nvlink == Status::No {
        return direct;
    }
    let to_switch = |g: usize| {
        t.gpus[g]
            .nvlinks
            .iter()
            .filter(|l| l.active && l.remote_gpu.is_none())
            .count() as u32
    };
    to_switch(a).min(to_switch(b))
}

/// Sets remote_gpu from the remote bus id; returns an NVSwitch when links lead to devices that
/// are not GPUs of this machine.
fn resolve_nvlinks(gpus: &mut [Gpu], notes: &mut Vec<String>) -> Option<NvSwitch> {
    let ids: Vec<Option<String>> = gpus
        .iter()
        .map(|g| g.bus_id.as_deref().map(sysfs::normalize_bus_id))
        .collect();
    let mut switch_links = Vec::new();
    let mut generation = None;
    for g in gpus.iter_mut() {
        let mut to_switch = 0;
        for l in g.nvlinks.iter_mut().filter(|l| l.active) {
            let remote = l.remote_bus_id.as_deref().map(sysfs::normalize_bus_id);
            l.remote_gpu =
                remote.and_then(|r| ids.iter().position(|id| id.as_deref() == Some(r.as_str())));
            if l.remote_gpu.is_none() {
                to_switch += 1;
            }
            generation = generation.max(l.version);
        }
        if to_switch > 0 {
            switch_links.push(to_switch);
        }
    }
    if switch_links.len() < 2 {
        return None;
    }
    let links = *switch_links.iter().min().unwrap_or(&0);
    match generation.and_then(|gen| Some((gen, nvlink_gbps(gen)?))) {
        Some((gen, per_link)) => {
            notes.push(format!(
                "NVLinks lead to devices that are not GPUs of this machine: NVSwitch assumed, at a nominal {per_link} GB/s per link and direction (NVLink{gen}); a tune measures it"
            ));
            Some(NvSwitch {
                generation: gen,
                gpu_gbps: per_link * links as f64,
                latency_us: None,
            })
        }
        None => {
            notes.push("NVLinks lead to devices that are not GPUs of this machine, but their NVLink version is unknown: NVSwitch rate left unset".into());
            None
        }
    }
}

/// Groups `members` into connected components of `joined`, each in index order.
fn components(members: &[usize], joined: impl Fn(usize, usize) -> bool) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    for &m in members {
        let hits: Vec<usize> = (0..out.len())
            .filter(|&c| out[c].iter().any(|&o| joined(o, m)))
            .collect();
        let mut merged = vec![m];
        for &c in hits.iter().rev() {
            merged.extend(out.remove(c));
        }
        merged.sort_unstable();
        out.push(merged);
    }
    out.sort_by_key(|c| c[0]);
    out
}

/// A PCIe tree that reproduces NVML's path classes, for machines whose sysfs is hidden: sockets
/// join GPUs closer than SYS, root complexes closer than NODE, a switch those closer than PHB,
/// and a leaf switch per PIX group when a switch holds several.
pub fn infer_tree(levels: &[Vec<Option<PathClass>>]) -> Tree {
    use super::{RootComplex, Socket, Switch};
    let n = levels.len();
    let within = |max: PathClass| move |a: usize, b: usize| levels[a][b].is_some_and(|c| c <= max);
    let mut t = Tree {
        parents: vec![String::new(); n],
        ..Default::default()
    };
    let all: Vec<usize> = (0..n).collect();
    for (s, sock) in components(&all, within(PathClass::NODE))
        .into_iter()
        .enumerate()
    {
        let s = s as u32;
        t.sockets.push(Socket {
            id: s,
            interconnect: None,
            contention: None,
        });
        for rc in components(&sock, within(PathClass::PHB)) {
            let rc_id = format!("rc{}", t.root_complexes.len());
            t.root_complexes.push(RootComplex {
                id: rc_id.clone(),
                socket: s,
                contention: None,
            });
            for group in components(&rc, within(PathClass::PXB)) {
                if group.len() == 1 {
                    t.parents[group[0]] = rc_id.clone();
                    continue;
                }
                let mut switch = |parent: &str| {
                    let id = format!("sw{}", t.switches.len());
                    t.switches.push(Switch {
                        id: id.clone(),
                        parent: parent.to_string(),
                        vendor: None,
                        device: None,
                        uplink: Link::default(),
                        contention: None,
                    });
                    id
                };
                let top = switch(&rc_id);
                let leaves = components(&group, within(PathClass::PIX));
                for leaf in &leaves {
                    let parent = if leaves.len() == 1 {
                        top.clone()
                    } else {
                        switch(&top)
                    };
                    for &g in leaf {
                        t.parents[g] = parent.clone();
                    }
                }
            }
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{ComputeCapability, NvLink};
    use PathClass::*;

    fn levels(rows: &[&[PathClass]]) -> Vec<Vec<Option<PathClass>>> {
        rows.iter()
            .map(|r| r.iter().map(|&c| Some(c)).collect())
            .collect()
    }

    fn gpu(i: usize, bus: &str) -> Gpu {
        Gpu {
            index: i,
            uuid: None,
            name: "NVIDIA H200".into(),
            bus_id: Some(bus.into()),
            compute_capability: Some(ComputeCapability { major: 9, minor: 0 }),
            memory_bytes: Some(150 << 30),
            numa_node: None,
            cpu_affinity: None,
            pcie: Link {
                gen: Some(1),
                width: Some(16),
                max_gen: Some(5),
                max_width: Some(16),
                ..Default::default()
            },
            parent: String::new(),
            nvlinks: Vec::new(),
        }
    }

    fn reading(levels: Vec<Vec<Option<PathClass>>>) -> Reading {
        let n = levels.len();
        Reading {
            host: Host {
                driver: Some("580.159.04".into()),
                cuda: Some("13.0".into()),
                ..Default::default()
            },
            gpus: (0..n)
                .map(|i| gpu(i, &format!("00000000:{:02x}:00.0", 0x10 + i)))
                .collect(),
            levels,
            p2p: vec![
                vec![
                    P2p {
                        read: Status::Ok,
                        write: Status::Ok,
                        nvlink: Status::No,
                        atomics: Status::Ok
                    };
                    n
                ];
                n
            ],
            link_reading: "idle".into(),
            notes: Notes::default(),
        }
    }

    /// Two switches of two on one root complex, a GPU on its own root complex, another socket.
    fn mixed() -> Vec<Vec<Option<PathClass>>> {
        levels(&[
            &[X, PIX, PXB, PXB, NODE, SYS],
            &[PIX, X, PXB, PXB, NODE, SYS],
            &[PXB, PXB, X, PIX, NODE, SYS],
            &[PXB, PXB, PIX, X, NODE, SYS],
            &[NODE, NODE, NODE, NODE, X, SYS],
            &[SYS, SYS, SYS, SYS, SYS, X],
        ])
    }

    #[test]
    #[allow(clippy::needless_range_loop)] // a and b index the matrix and name the pair
    fn inferred_tree_reproduces_nvml_classes() {
        let lv = mixed();
        let t = assemble(reading(lv.clone()), &Sysfs::new("/nonexistent")).unwrap();
        for a in 0..6 {
            for b in 0..6 {
                if a != b {
                    assert_eq!(Some(t.pcie_path(a, b)), lv[a][b], "{a}-{b}");
                    assert_eq!(Some(t.pair(a, b).unwrap().path), lv[a][b]);
                }
            }
        }
        assert_eq!(t.sockets.len(), 2);
        assert_eq!(t.root_complexes.len(), 3);
        assert_eq!(t.switches.len(), 3, "one top switch and two leaves");
        assert_eq!(t.origin.kind, "nvml");
        assert!(
            t.notes
                .iter()
                .any(|n| n.contains("inferred from NVML path classes")),
            "{:?}",
            t.notes
        );
    }

    #[test]
    fn phb_pairs_hang_from_the_root_complex() {
        let t = infer_tree(&levels(&[&[X, PHB], &[PHB, X]]));
        assert!(t.switches.is_empty());
        assert_eq!(t.parents, vec!["rc0", "rc0"]);
    }

    #[test]
    fn unknown_class_is_noted_and_kept_apart() {
        let mut lv = levels(&[&[X, PIX], &[PIX, X]]);
        lv[0][1] = None;
        lv[1][0] = None;
        let t = assemble(reading(lv), &Sysfs::new("/nonexistent")).unwrap();
        assert_eq!(t.pair(0, 1).unwrap().path, SYS);
        assert!(
            t.notes
                .iter()
                .any(|n| n.contains("no path class for GPUs 0-1")),
            "{:?}",
            t.notes
        );
    }

    #[test]
    fn nvlinks_resolve_to_gpus_and_nvswitch() {
        let mut r = reading(levels(&[&[X, SYS, SYS], &[SYS, X, SYS], &[SYS, SYS, X]]));
        let link = |l, remote: &str| NvLink {
            link: l,
            active: true,
            version: Some(4),
            remote_bus_id: Some(remote.into()),
            remote_gpu: None,
        };
        // GPUs 0 and 1: two direct links; GPUs 0..2 also reach a switch at bus 0xff.
        r.gpus[0].nvlinks = vec![
            link(0, "00000000:11:00.0"),
            link(1, "00000000:11:00.0"),
            link(2, "0000:ff:00.0"),
        ];
        r.gpus[1].nvlinks = vec![
            link(0, "00000000:10:00.0"),
            link(1, "00000000:10:00.0"),
            link(2, "0000:ff:00.0"),
        ];
        r.gpus[2].nvlinks = vec![link(0, "0000:ff:00.0"), link(1, "0000:ff:00.0")];
        for row in r.p2p.iter_mut() {
            for p in row.iter_mut() {
                p.nvlink = Status::Ok;
            }
        }
        let t = assemble(r, &Sysfs::new("/nonexistent")).unwrap();
        assert_eq!(t.gpus[0].nvlinks[0].remote_gpu, Some(1));
        assert_eq!(t.pair(0, 1).unwrap().path, NV);
        assert_eq!(t.pair(0, 1).unwrap().nvlinks, 2);
        assert_eq!(t.pair(0, 2).unwrap().nvlinks, 1);
        assert_eq!(t.nvswitch.as_ref().unwrap().generation, 4);
        assert_eq!(t.nvswitch.as_ref().unwrap().gpu_gbps, 25.0);
    }

    #[test]
    fn sysfs_tree_is_used_and_disagreement_noted() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let r = reading(levels(&[&[X, PIX], &[PIX, X]]));
        for (i, g) in r.gpus.iter().enumerate() {
            let bus = sysfs::normalize_bus_id(g.bus_id.as_deref().unwrap());
            let dir = root.join(format!("devices/pci0000:00/{bus}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("numa_node"), format!("{i}\n")).unwrap();
            std::fs::write(dir.join("local_cpulist"), "0-7\n").unwrap();
            std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
            std::os::unix::fs::symlink(&dir, root.join("bus/pci/devices").join(&bus)).unwrap();
        }
        let t = assemble(r, &Sysfs::new(root)).unwrap();
        assert_eq!(t.gpus[0].parent, "pci0000:00");
        assert_eq!(
            t.gpus[1].numa_node,
            Some(1),
            "NUMA node from sysfs when NVML has none"
        );
        assert_eq!(t.gpus[0].cpu_affinity.as_deref(), Some("0-7"));
        assert_eq!(t.pair(0, 1).unwrap().path, PIX, "NVML's class wins");
        assert!(
            t.notes.iter().any(|n| n.contains("disagree")),
            "{:?}",
            t.notes
        );
    }

    #[test]
    fn notes_group_gpus() {
        let mut n = Notes::default();
        n.add("NVLink: not supported on this GPU or driver", "GPU 0");
        n.add("NVLink: not supported on this GPU or driver", "GPU 1");
        n.add("driver version: no data", "");
        assert_eq!(
            n.lines(),
            vec![
                "NVLink: not supported on this GPU or driver (GPU 0, GPU 1)",
                "driver version: no data"
            ]
        );
    }
}

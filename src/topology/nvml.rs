//! Topology discovery through NVML, with the PCIe tree from sysfs.
//!
//! [`discover`] reads everything NVML knows ([`read`]), then [`assemble`] joins it with the
//! PCIe tree that sysfs shows (or, where sysfs is hidden, one inferred from NVML's path classes).
//! Queries a GPU or driver does not support (VMs, consumer GPUs) leave a field unknown and a line
//! in `notes`; only a missing library, no GPU or a GPU NVML cannot open stop discovery.

use std::ffi::OsStr;

use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::sysfs::{self, Sysfs, Tree};
use super::{
    ComputeCapability, Gpu, Host, Link, NvLink, NvSwitch, Origin, P2p, Pair, PathClass, Status,
    Topology,
};
use crate::error::Error;

/// The driver installs the versioned name; the bare name comes only with development packages.
const LIBRARIES: [&str; 2] = ["libnvidia-ml.so.1", "libnvidia-ml.so"];

/// NVML_NVLINK_MAX_LINKS in nvml.h (18 on Hopper and Blackwell).
const MAX_NVLINKS: u32 = 18;

/// GPU utilization (percent) from which link speeds count as read under load: idle GPUs drop
/// their PCIe generation to save power.
const LOAD_UTILIZATION: u32 = 10;

/// nvmlAffinityScope_t for NUMA nodes (NVML_AFFINITY_SCOPE_NODE in nvml.h).
const NVML_AFFINITY_SCOPE_NODE: u32 = 0;

const SIMULATE: &str = "or simulate a machine with --sim PRESET / --topology FILE";

/// Reads the machine's topology through NVML and sysfs. `nccl` is the NCCL version the caller
/// loaded (part of the host hash: a profile goes stale when NCCL changes under it); topology
/// discovery itself loads no NCCL.
pub fn discover(nccl: Option<String>) -> Result<Topology, Error> {
    let nvml = open()?;
    let mut reading = read(&nvml)?;
    reading.host.nccl = nccl;
    assemble(reading, &Sysfs::system())
}

/// What `artune doctor` reads per GPU beyond the topology; each reading is the value or why
/// NVML could not give it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSettings {
    pub index: usize,
    pub bus_id: Option<String>,
    /// Total BAR1 (the window peers and the host map GPU memory through), bytes.
    pub bar1_bytes: Result<u64, String>,
    pub persistence: Result<bool, String>,
}

/// BAR1 size and persistence mode of every GPU, in NVML's order.
pub fn read_settings() -> Result<Vec<GpuSettings>, Error> {
    let nvml = open()?;
    let count = nvml.device_count().map_err(|e| {
        Error::Hardware(format!(
            "NVML cannot count the GPUs ({e}): check that `nvidia-smi` works"
        ))
    })?;
    let mut out = Vec::new();
    for i in 0..count {
        let d = nvml.device_by_index(i).map_err(|e| {
            Error::Hardware(format!(
                "NVML cannot open GPU {i} ({e}): check `nvidia-smi` for that GPU"
            ))
        })?;
        out.push(GpuSettings {
            index: i as usize,
            bus_id: d.pci_info().ok().map(|p| p.bus_id),
            bar1_bytes: d
                .bar1_memory_info()
                .map(|b| b.total)
                .map_err(|e| reason(&e)),
            persistence: d.is_in_persistent_mode().map_err(|e| reason(&e)),
        });
    }
    Ok(out)
}

/// Loads and starts NVML, turning each way it can fail into one actionable sentence.
pub(crate) fn open() -> Result<Nvml, Error> {
    for lib in LIBRARIES {
        match Nvml::builder().lib_path(OsStr::new(lib)).init() {
            Ok(n) => return Ok(n),
            Err(NvmlError::LibloadingError(e)) => tracing::debug!("cannot load {lib}: {e}"),
            Err(e) => return Err(init_error(e)),
        }
    }
    Err(Error::bad_input(format!(
        "cannot load the NVIDIA management library (libnvidia-ml.so.1): install the NVIDIA driver, {SIMULATE}"
    )))
}

fn init_error(e: NvmlError) -> Error {
    match e {
        NvmlError::FailedToLoadSymbol(s) => Error::bad_input(format!(
            "libnvidia-ml.so.1 was found but is not a usable NVIDIA management library ({s}): reinstall the NVIDIA driver, {SIMULATE}"
        )),
        NvmlError::DriverNotLoaded => Error::Hardware(format!(
            "the NVIDIA kernel driver is not loaded: load it (`nvidia-smi` should then list the GPUs), {SIMULATE}"
        )),
        NvmlError::LibRmVersionMismatch => Error::Hardware(format!(
            "the NVIDIA kernel driver and libnvidia-ml.so.1 are different versions: reboot or reload the driver, {SIMULATE}"
        )),
        NvmlError::NoPermission => Error::Hardware(format!(
            "NVML has no permission to talk to the driver: run as a user who can open /dev/nvidia*, {SIMULATE}"
        )),
        other => Error::Hardware(format!("NVML failed to start ({other}): check that `nvidia-smi` works, {SIMULATE}")),
    }
}

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

/// Why a query gave nothing, as a phrase.
fn reason(e: &NvmlError) -> String {
    match e {
        NvmlError::NotSupported => "not supported on this GPU or driver".into(),
        NvmlError::NoPermission => "no permission (run as root to read it)".into(),
        NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_) => {
            "not in this driver's NVML".into()
        }
        other => other.to_string(),
    }
}

/// The value, or None and a note naming the query and the GPU.
fn soft<T>(r: Result<T, NvmlError>, what: &str, who: String, notes: &mut Notes) -> Option<T> {
    r.map_err(|e| notes.add(format!("{what}: {}", reason(&e)), who))
        .ok()
}

/// Reads hosts, GPUs, pair classes and P2P status.
pub fn read(nvml: &Nvml) -> Result<Reading, Error> {
    let count = nvml.device_count().map_err(|e| {
        Error::Hardware(format!(
            "NVML cannot count the GPUs ({e}): check that `nvidia-smi` works, {SIMULATE}"
        ))
    })?;
    if count == 0 {
        return Err(Error::bad_input(format!(
            "NVML works but finds no NVIDIA GPU on this machine: check `nvidia-smi`, {SIMULATE}"
        )));
    }
    let devices = (0..count)
        .map(|i| {
            nvml.device_by_index(i).map_err(|e| {
                Error::Hardware(format!(
                    "NVML cannot open GPU {i} ({e}): check `nvidia-smi` for that GPU, {SIMULATE}"
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut r = Reading::default();
    let mut utilization = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        let who = format!("GPU {i}");
        utilization.push(
            soft(
                d.utilization_rates(),
                "GPU utilization",
                who.clone(),
                &mut r.notes,
            )
            .map(|u| u.gpu),
        );
        let g = read_gpu(i, d, &mut r.notes);
        r.gpus.push(g);
    }
    r.host = read_host(nvml, &mut r.notes);
    r.link_reading = link_reading(&utilization).into();
    let n = devices.len();
    r.levels = vec![vec![None; n]; n];
    r.p2p = vec![vec![P2p::default(); n]; n];
    for a in 0..n {
        for b in 0..n {
            if a == b {
                continue;
            }
            let who = format!("GPUs {a}-{b}");
            if a < b {
                let lvl = soft(
                    nvml.topology_common_ancestor(&devices[a], &devices[b]),
                    "PCIe path class (nvmlDeviceGetTopologyCommonAncestor)",
                    who.clone(),
                    &mut r.notes,
                );
                r.levels[a][b] = lvl.map(class_of);
                r.levels[b][a] = r.levels[a][b];
            }
            r.p2p[a][b] = read_p2p(&devices[a], &devices[b], who, &mut r.notes);
        }
    }
    Ok(r)
}

fn read_host(nvml: &Nvml, notes: &mut Notes) -> Host {
    Host {
        hostname: hostname(),
        driver: soft(
            nvml.sys_driver_version(),
            "driver version",
            String::new(),
            notes,
        ),
        cuda: soft(
            nvml.sys_cuda_driver_version(),
            "CUDA driver version",
            String::new(),
            notes,
        )
        .map(|v| {
            format!(
                "{}.{}",
                nvml_wrapper::cuda_driver_version_major(v),
                nvml_wrapper::cuda_driver_version_minor(v)
            )
        }),
        // Filled by `discover`'s caller, which knows which NCCL it loaded.
        nccl: None,
    }
}

/// This machine's host name (gethostname), if it has one.
pub fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned()).filter(|s| !s.is_empty())
}

/// "load" when any GPU is busy, "idle" when every GPU that answered is not.
fn link_reading(utilization: &[Option<u32>]) -> &'static str {
    if utilization.iter().flatten().any(|&u| u >= LOAD_UTILIZATION) {
        "load"
    } else if utilization.iter().any(Option::is_some) {
        "idle"
    } else {
        "unknown"
    }
}

fn read_gpu(i: usize, d: &Device, notes: &mut Notes) -> Gpu {
    let who = || format!("GPU {i}");
    let u8_of = |v: u32| u8::try_from(v).ok();
    Gpu {
        index: i,
        uuid: soft(d.uuid(), "UUID", who(), notes),
        name: soft(d.name(), "name", who(), notes).unwrap_or_else(|| "unknown".into()),
        bus_id: soft(d.pci_info(), "PCI bus id", who(), notes).map(|p| p.bus_id),
        compute_capability: soft(
            d.cuda_compute_capability(),
            "compute capability",
            who(),
            notes,
        )
        .and_then(|c| {
            Some(ComputeCapability {
                major: u32::try_from(c.major).ok()?,
                minor: u32::try_from(c.minor).ok()?,
            })
        }),
        memory_bytes: soft(d.memory_info(), "memory size", who(), notes).map(|m| m.total),
        // The NUMA node nvidia-smi shows as "NUMA Affinity" (nvmlDeviceGetNumaNodeId is the GPU
        // memory's own node on coherent systems, not the CPUs' node near it).
        numa_node: soft(
            d.memory_affinity(4, NVML_AFFINITY_SCOPE_NODE),
            "NUMA node",
            who(),
            notes,
        )
        .and_then(|m| lowest_bit(&m)),
        cpu_affinity: soft(d.cpu_affinity(64), "CPU affinity", who(), notes)
            .and_then(|m| cpulist(&m)),
        pcie: Link {
            gen: soft(d.current_pcie_link_gen(), "PCIe generation", who(), notes).and_then(u8_of),
            width: soft(d.current_pcie_link_width(), "PCIe width", who(), notes).and_then(u8_of),
            max_gen: soft(d.max_pcie_link_gen(), "PCIe max generation", who(), notes)
                .and_then(u8_of),
            max_width: soft(d.max_pcie_link_width(), "PCIe max width", who(), notes)
                .and_then(u8_of),
            ..Default::default()
        },
        parent: String::new(),
        nvlinks: read_nvlinks(i, d, notes),
    }
}

/// Every NVLink whose state NVML reports; remote_gpu is resolved later from the bus id.
fn read_nvlinks(i: usize, d: &Device, notes: &mut Notes) -> Vec<NvLink> {
    let mut out = Vec::new();
    for link in 0..MAX_NVLINKS {
        let w = d.link_wrapper_for(link);
        let active = match w.is_active() {
            Ok(a) => a,
            // Past the GPU's last link.
            Err(NvmlError::InvalidArg) if link > 0 => break,
            Err(e) => {
                notes.add(format!("NVLink: {}", reason(&e)), format!("GPU {i}"));
                break;
            }
        };
        let mut l = NvLink {
            link,
            active,
            version: None,
            remote_bus_id: None,
            remote_gpu: None,
        };
        if active {
            let who = format!("GPU {i} link {link}");
            l.version = soft(w.version(), "NVLink version", who.clone(), notes).and_then(|v| {
                let g = nvlink_generation(v);
                if g.is_none() {
                    notes.add(
                        format!("NVLink version: NVML reports {v}, which artune does not know"),
                        who.clone(),
                    );
                }
                g
            });
            l.remote_bus_id =
                soft(w.remote_pci_info(), "NVLink remote PCI bus id", who, notes).map(|p| p.bus_id);
        }
        out.push(l);
    }
    out
}

fn read_p2p(a: &Device, b: &Device, who: String, notes: &mut Notes) -> P2p {
    let mut one = |idx: P2pCapabilitiesIndex, what: &str| match a.p2p_status(b, idx) {
        Ok(P2pStatus::Ok) => Status::Ok,
        Ok(P2pStatus::Unknown) => Status::Unknown,
        Ok(refused) => {
            notes.add(format!("P2P {what}: NVML says {refused:?}"), who.clone());
            Status::No
        }
        Err(e) => {
            notes.add(format!("P2P {what} status: {}", reason(&e)), who.clone());
            Status::Unknown
        }
    };
    P2p {
        read: one(P2pCapabilitiesIndex::Read, "read"),
        write: one(P2pCapabilitiesIndex::Write, "write"),
        nvlink: one(P2pCapabilitiesIndex::NvLink, "over NVLink"),
        atomics: one(P2pCapabilitiesIndex::Atomics, "atomics"),
    }
}

/// NVML's topology level as nvidia-smi names it.
pub fn class_of(l: TopologyLevel) -> PathClass {
    match l {
        TopologyLevel::Internal => PathClass::X,
        TopologyLevel::Single => PathClass::PIX,
        TopologyLevel::Multiple => PathClass::PXB,
        TopologyLevel::HostBridge => PathClass::PHB,
        TopologyLevel::Node => PathClass::NODE,
        TopologyLevel::System => PathClass::SYS,
    }
}

/// nvmlDeviceGetNvLinkVersion answers with nvmlNvlinkVersion_t (1.0, 2.0, 2.2, 3.0, 3.1, 4.0,
/// 5.0 as 1..7), not the generation; the model keeps the generation.
pub fn nvlink_generation(v: u32) -> Option<u32> {
    Some(match v {
        1 => 1,
        2 | 3 => 2,
        4 | 5 => 3,
        6 => 4,
        7 => 5,
        _ => return None,
    })
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

/// A CPU bitmask (word i, bit j = CPU 64i + j) as a Linux cpulist, "0-23,48-71".
pub fn cpulist(mask: &[libc::c_ulong]) -> Option<String> {
    let bits = libc::c_ulong::BITS as usize;
    let set = |c: usize| mask[c / bits] >> (c % bits) & 1 == 1;
    let mut ranges = Vec::new();
    let mut c = 0;
    while c < mask.len() * bits {
        if set(c) {
            let start = c;
            while c + 1 < mask.len() * bits && set(c + 1) {
                c += 1;
            }
            ranges.push(if start == c {
                format!("{c}")
            } else {
                format!("{start}-{c}")
            });
        }
        c += 1;
    }
    (!ranges.is_empty()).then(|| ranges.join(","))
}

/// The lowest set bit of a bitmask (word i, bit j = 64i + j).
pub fn lowest_bit(mask: &[libc::c_ulong]) -> Option<u32> {
    let bits = libc::c_ulong::BITS;
    mask.iter()
        .enumerate()
        .find(|(_, w)| **w != 0)
        .map(|(i, w)| i as u32 * bits + w.trailing_zeros())
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
                "NVLinks lead to devices that are not GPUs of this machine: NVSwitch assumed, at a nominal {per_link} GB/s per link and direction (NVLink{gen}); `artune tune` measures it"
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

    #[test]
    fn cpulists_versions_and_readings() {
        assert_eq!(cpulist(&[0xff, 0]).as_deref(), Some("0-7"));
        assert_eq!(cpulist(&[0b1011, 1]).as_deref(), Some("0-1,3,64"));
        assert_eq!(cpulist(&[0, 0]), None);
        assert_eq!(lowest_bit(&[0, 0b100]), Some(66));
        assert_eq!(lowest_bit(&[0]), None);
        assert_eq!(
            cpulist(&[u64::MAX as libc::c_ulong]).as_deref(),
            Some("0-63")
        );
        assert_eq!(nvlink_generation(6), Some(4));
        assert_eq!(nvlink_generation(5), Some(3));
        assert_eq!(nvlink_generation(0), None);
        assert_eq!(link_reading(&[Some(0), None]), "idle");
        assert_eq!(link_reading(&[Some(0), Some(55)]), "load");
        assert_eq!(link_reading(&[None]), "unknown");
        assert_eq!(class_of(TopologyLevel::HostBridge), PHB);
    }
}

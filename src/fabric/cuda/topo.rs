//! The topology the CUDA fabric reports: K virtual GPUs in loopback, the NVML model on a real
//! machine (or, when NVML discovery fails, what CUDA alone can tell), and PCIe link readings.

use std::sync::OnceLock;

use nvml_wrapper::Nvml;

use super::driver::DeviceFacts;
use crate::topology::reading::LinkReading;
use crate::topology::{
    Gpu, Host, Link, Origin, P2p, Pair, PathClass, RootComplex, Socket, Status, Topology,
};

fn nvml() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(|| Nvml::init().ok()).as_ref()
}

/// The NVIDIA driver version, e.g. "580.159.04", from NVML.
pub fn driver_version() -> Option<String> {
    nvml()?.sys_driver_version().ok()
}

/// Reads current and maximum PCIe generation and width of each GPU through NVML.
pub fn read_links(gpus: &[(usize, &DeviceFacts)]) -> Vec<LinkReading> {
    gpus.iter()
        .map(|(i, f)| {
            let d = nvml().and_then(|n| n.device_by_pci_bus_id(f.bus_id.as_str()).ok());
            LinkReading {
                gpu: *i,
                bus_id: f.bus_id.clone(),
                gen: d.as_ref().and_then(|d| d.current_pcie_link_gen().ok()),
                width: d.as_ref().and_then(|d| d.current_pcie_link_width().ok()),
                max_gen: d.as_ref().and_then(|d| d.max_pcie_link_gen().ok()),
                max_width: d.as_ref().and_then(|d| d.max_pcie_link_width().ok()),
            }
        })
        .collect()
}

fn to_link(r: &LinkReading) -> Link {
    let b = |v: Option<u32>| v.and_then(|x| u8::try_from(x).ok());
    Link {
        gen: b(r.gen),
        width: b(r.width),
        max_gen: b(r.max_gen),
        max_width: b(r.max_width),
        ..Default::default()
    }
}

fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: writes at most buf.len() bytes.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if r != 0 {
        return None;
    }
    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

pub fn host(cuda: Option<String>, nccl: Option<String>) -> Host {
    Host {
        hostname: hostname(),
        driver: driver_version(),
        cuda,
        nccl,
    }
}

fn gpu(index: usize, f: &DeviceFacts, link: Link, parent: &str) -> Gpu {
    Gpu {
        index,
        uuid: None,
        name: f.name.clone(),
        bus_id: Some(f.bus_id.clone()),
        compute_capability: Some(crate::topology::ComputeCapability {
            major: f.cc.0,
            minor: f.cc.1,
        }),
        memory_bytes: Some(f.total_mem),
        numa_node: None,
        cpu_affinity: None,
        pcie: link,
        parent: parent.into(),
        nvlinks: Vec::new(),
    }
}

fn one_root(gpus: Vec<Gpu>, origin: Origin, host: Host, notes: Vec<String>) -> Topology {
    Topology {
        name: origin.name.clone(),
        origin,
        host,
        sockets: vec![Socket {
            id: 0,
            interconnect: None,
            contention: None,
        }],
        root_complexes: vec![RootComplex {
            id: "rc0".into(),
            socket: 0,
            contention: None,
        }],
        switches: Vec::new(),
        nvswitch: None,
        gpus,
        pairs: Vec::new(),
        notes,
    }
}

/// K virtual GPUs that are all GPU `f`: same name, compute capability and memory, one root
/// complex, P2P everywhere.
pub fn loopback(k: usize, f: &DeviceFacts, host: Host) -> Result<Topology, String> {
    let link = to_link(&read_links(&[(0, f)])[0]);
    let gpus = (0..k).map(|i| gpu(i, f, link.clone(), "rc0")).collect();
    let origin = Origin {
        kind: "loopback".into(),
        name: Some(format!("loopback-{k}x-{}", f.name.replace(' ', "-"))),
        link_reading: "idle".into(),
    };
    let note = format!(
        "loopback: these {k} GPUs are virtual ranks on one {} (bus {}); their peer traffic stays \
         in that GPU's memory, so PCIe/NVLink bandwidth and contention are not measured",
        f.name, f.bus_id
    );
    let mut t = one_root(gpus, origin, host, vec![note]);
    t.normalize().map_err(|e| e.to_string())?;
    Ok(t)
}

/// What CUDA alone knows when NVML discovery failed: GPUs, and P2P per ordered pair from
/// cuDeviceCanAccessPeer (`p2p[a][b]`). The PCIe tree is unknown.
pub fn from_cuda(
    facts: &[DeviceFacts],
    p2p: &[Vec<bool>],
    host: Host,
    why: &str,
) -> Result<Topology, String> {
    let reads = read_links(&facts.iter().enumerate().collect::<Vec<_>>());
    let gpus = facts
        .iter()
        .zip(&reads)
        .enumerate()
        .map(|(i, (f, r))| gpu(i, f, to_link(r), "rc0"))
        .collect();
    let origin = Origin {
        kind: "cuda".into(),
        name: None,
        link_reading: "idle".into(),
    };
    let note = format!(
        "topology from CUDA only ({why}): the PCIe tree is unknown, so every GPU is placed under \
         one root complex"
    );
    let mut t = one_root(gpus, origin, host, vec![note]);
    for (a, row) in p2p.iter().enumerate().take(facts.len()) {
        for (b, &can) in row.iter().enumerate().take(facts.len()) {
            if a != b {
                let ok = if can { Status::Ok } else { Status::No };
                t.pairs.push(Pair {
                    from: a,
                    to: b,
                    path: PathClass::PHB,
                    nvlinks: 0,
                    p2p: P2p {
                        read: ok,
                        write: ok,
                        nvlink: Status::Unknown,
                        atomics: Status::Unknown,
                    },
                });
            }
        }
    }
    t.normalize().map_err(|e| e.to_string())?;
    Ok(t)
}

/// CUDA ordinal for each topology GPU, matched by PCI bus id (CUDA and NVML may number GPUs
/// differently), falling back to the same index.
pub fn ordinals(topo: &Topology, facts: &[DeviceFacts]) -> Vec<Option<usize>> {
    topo.gpus
        .iter()
        .map(|g| {
            let by_bus = g
                .bus_id
                .as_deref()
                .and_then(|b| facts.iter().position(|f| same_bus(b, &f.bus_id)));
            by_bus.or_else(|| {
                (g.index < facts.len() && topo.gpus.len() == facts.len()).then_some(g.index)
            })
        })
        .collect()
}

/// Restricts an NVML topology to the GPUs CUDA can see (`facts`, in CUDA ordinal order),
/// matched by PCI bus id: GPUs hidden by CUDA_VISIBLE_DEVICES (or that CUDA does not list) are
/// dropped with a note saying which and why, the rest renumbered. Returns, per remaining GPU,
/// its CUDA ordinal. A topology without bus ids keeps its order, matched by index.
pub fn visible(t: &mut Topology, facts: &[DeviceFacts]) -> Vec<Option<usize>> {
    if t.gpus.iter().any(|g| g.bus_id.is_none()) {
        return ordinals(t, facts);
    }
    let found: Vec<Option<usize>> = t
        .gpus
        .iter()
        .map(|g| {
            let b = g.bus_id.as_deref().unwrap_or_default();
            facts.iter().position(|f| same_bus(b, &f.bus_id))
        })
        .collect();
    if found.iter().all(Option::is_some) {
        return found;
    }
    let mut renumber = vec![None; t.gpus.len()];
    let mut next = 0;
    for (i, f) in found.iter().enumerate() {
        if f.is_some() {
            renumber[i] = Some(next);
            next += 1;
        } else {
            let note = left_out(i, &t.gpus[i]);
            if !t.notes.contains(&note) {
                t.notes.push(note);
            }
        }
    }
    let mut gpus = Vec::new();
    for (i, mut g) in std::mem::take(&mut t.gpus).into_iter().enumerate() {
        let Some(new) = renumber[i] else { continue };
        g.index = new;
        for l in &mut g.nvlinks {
            l.remote_gpu = l
                .remote_gpu
                .and_then(|r| renumber.get(r).copied().flatten());
        }
        gpus.push(g);
    }
    t.gpus = gpus;
    t.pairs = std::mem::take(&mut t.pairs)
        .into_iter()
        .filter_map(|mut p| {
            p.from = renumber.get(p.from).copied().flatten()?;
            p.to = renumber.get(p.to).copied().flatten()?;
            Some(p)
        })
        .collect();
    found.into_iter().flatten().map(Some).collect()
}

/// The note for NVML's GPU `i` that CUDA does not see.
fn left_out(i: usize, g: &Gpu) -> String {
    format!(
        "GPU {i} ({}, bus {}) is left out: CUDA does not see it{}",
        g.name,
        g.bus_id.as_deref().unwrap_or("?"),
        match std::env::var("CUDA_VISIBLE_DEVICES") {
            Ok(v) => format!(" (CUDA_VISIBLE_DEVICES={v})"),
            Err(_) => String::new(),
        }
    )
}

/// Notes naming the GPUs of an NVML topology that CUDA does not see (hidden by
/// CUDA_VISIBLE_DEVICES), matched by PCI bus id, for `artune topo` and profiles; none when
/// there is no driver to ask or a GPU has no bus id.
pub fn hidden_gpu_notes(t: &Topology) -> Vec<String> {
    if !super::driver::driver_present() || t.gpus.iter().any(|g| g.bus_id.is_none()) {
        return Vec::new();
    }
    let Ok(visible) = super::driver::visible_bus_ids() else {
        return Vec::new();
    };
    t.gpus
        .iter()
        .enumerate()
        .filter(|(_, g)| {
            let b = g.bus_id.as_deref().unwrap_or_default();
            !visible.iter().any(|v| same_bus(b, v))
        })
        .map(|(i, g)| left_out(i, g))
        .collect()
}

/// Compares PCI bus ids written with different domain widths ("00000000:00:06.0" vs
/// "0000:00:06.0") and case.
pub fn same_bus(a: &str, b: &str) -> bool {
    fn parts(s: &str) -> Option<(u32, u32, u32, u32)> {
        let (dom, rest) = s.trim().split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (dev, func) = rest.split_once('.')?;
        Some((
            u32::from_str_radix(dom, 16).ok()?,
            u32::from_str_radix(bus, 16).ok()?,
            u32::from_str_radix(dev, 16).ok()?,
            u32::from_str_radix(func, 16).ok()?,
        ))
    }
    match (parts(a), parts(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a.eq_ignore_ascii_case(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> DeviceFacts {
        DeviceFacts {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            cc: (9, 0),
            sms: 132,
            total_mem: 150_000_000_000,
            bus_id: "0000:00:06.0".into(),
        }
    }

    #[test]
    fn loopback_is_k_copies_under_one_root_with_p2p() {
        let t = loopback(8, &h200(), Host::default()).unwrap();
        assert_eq!(t.gpu_count(), 8);
        assert_eq!(t.origin.kind, "loopback");
        assert!(t.notes[0].starts_with("loopback:"));
        assert!(t
            .gpus
            .iter()
            .all(|g| g.name == "NVIDIA H200" && g.parent == "rc0"));
        assert_eq!(t.pairs.len(), 56);
        assert!(t
            .pairs
            .iter()
            .all(|p| p.p2p.read == Status::Ok && p.p2p.write == Status::Ok));
    }

    #[test]
    fn only_gpus_cuda_sees_are_kept_matched_by_bus_id() {
        // NVML sees three GPUs; CUDA (CUDA_VISIBLE_DEVICES=2,0) sees the third and the first,
        // numbered 0 and 1 in that order.
        let f = |o: usize, bus: &str| DeviceFacts {
            ordinal: o,
            bus_id: bus.into(),
            ..h200()
        };
        let nvml: Vec<DeviceFacts> = vec![
            f(0, "00000000:00:06.0"),
            f(1, "00000000:00:07.0"),
            f(2, "00000000:00:08.0"),
        ];
        let all = vec![vec![true; 3]; 3];
        let mut t = from_cuda(&nvml, &all, Host::default(), "test").unwrap();
        for (g, n) in t.gpus.iter_mut().zip(&nvml) {
            g.bus_id = Some(n.bus_id.clone());
        }
        let cuda = vec![f(0, "0000:00:08.0"), f(1, "0000:00:06.0")];
        let map = visible(&mut t, &cuda);
        assert_eq!(t.gpu_count(), 2);
        assert_eq!(map, vec![Some(1), Some(0)]);
        assert_eq!(t.gpus[1].bus_id.as_deref(), Some("00000000:00:08.0"));
        assert!(t.gpus.iter().enumerate().all(|(i, g)| g.index == i));
        assert!(t.pairs.iter().all(|p| p.from < 2 && p.to < 2));
        assert_eq!(t.pairs.len(), 2);
        assert!(
            t.notes.iter().any(|n| n.starts_with(
                "GPU 1 (NVIDIA H200, bus 00000000:00:07.0) is left out: CUDA does not see it"
            )),
            "{:?}",
            t.notes
        );
        t.normalize().unwrap();
    }

    #[test]
    fn bus_ids_match_across_domain_widths() {
        assert!(same_bus("00000000:00:06.0", "0000:00:06.0"));
        assert!(same_bus("0000:0A:00.0", "0000:0a:00.0"));
        assert!(!same_bus("0000:0a:00.0", "0000:0b:00.0"));
    }

    #[test]
    fn cuda_only_topology_keeps_p2p_answers() {
        let f = vec![
            h200(),
            DeviceFacts {
                ordinal: 1,
                bus_id: "0000:00:07.0".into(),
                ..h200()
            },
        ];
        let t = from_cuda(
            &f,
            &[vec![false, true], vec![false, false]],
            Host::default(),
            "no NVML",
        )
        .unwrap();
        assert_eq!(t.pair(0, 1).unwrap().p2p.read, Status::Ok);
        assert_eq!(t.pair(1, 0).unwrap().p2p.read, Status::No);
        assert_eq!(ordinals(&t, &f), vec![Some(0), Some(1)]);
    }
}

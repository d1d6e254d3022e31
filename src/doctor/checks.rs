//! The checks, each a pure function of the gathered [`Facts`].

use super::facts::{Facts, Machine};
use super::{Check, Status};
use crate::topology::sysfs::{self, Acs, PortType, ACS_REDIRECTS};
use crate::topology::{PathClass, Status as P2pStatus, Topology};
use crate::units::fmt_bytes;

/// Every check, in the order the report lists them.
pub fn all(f: &Facts) -> Vec<Check> {
    vec![
        driver(f),
        acs(f),
        iommu(f),
        bar1(f),
        p2p(f),
        links(f),
        persistence(f),
        islands(f),
        environment(&f.env),
        versions(f),
    ]
}

/// "0, 1, 2" for at most 8 items, then "and N more".
fn list<T: std::fmt::Display>(items: &[T]) -> String {
    const SHOWN: usize = 8;
    let mut s = items
        .iter()
        .take(SHOWN)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > SHOWN {
        s.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    s
}

const ON_THE_NODE: &str = "run `artune doctor` on the GPU node itself, as root";

/// What a check that needs the topology says when NVML gave none (the driver check has why).
fn no_topology(id: &'static str) -> Check {
    Check::new(
        id,
        Status::Unknown,
        "NVML could not describe the GPUs (the driver check says why)",
        "fix the driver check first",
    )
}

pub fn driver(f: &Facts) -> Check {
    const ID: &str = "driver";
    match (&f.machine, &f.topology) {
        (m, Ok(t)) if m.simulated() => Check::ok(
            ID,
            format!(
                "{} is a model of {} GPUs: no driver is involved, and the checks below describe the model",
                m.describe(),
                t.gpu_count()
            ),
        ),
        (_, Ok(t)) => {
            let mut names: Vec<&str> = t.gpus.iter().map(|g| g.name.as_str()).collect();
            names.dedup();
            Check::ok(
                ID,
                format!(
                    "NVML sees {} GPU{} ({}), driver {}",
                    t.gpu_count(),
                    if t.gpu_count() == 1 { "" } else { "s" },
                    names.join(" + "),
                    t.host.driver.as_deref().unwrap_or("of unknown version")
                ),
            )
        }
        (_, Err(why)) if !f.gpu_bus_ids.is_empty() => Check::new(
            ID,
            Status::Fail,
            format!(
                "sysfs shows {} NVIDIA GPU{} ({}) but NVML cannot read them: {why}",
                f.gpu_bus_ids.len(),
                if f.gpu_bus_ids.len() == 1 { "" } else { "s" },
                list(&f.gpu_bus_ids)
            ),
            "install or reload the NVIDIA driver until `nvidia-smi` lists every GPU",
        ),
        (_, Err(why)) => Check::new(
            ID,
            Status::Fail,
            format!("no NVIDIA GPU was found: {why}"),
            "run on a GPU node, or check a model with --sim PRESET or --topology FILE",
        ),
    }
}

/// A bridge on the way between GPUs whose ACS was read.
struct Port {
    bus_id: String,
    port_type: Option<PortType>,
    acs: Acs,
}

/// Every bridge on a GPU's path that can redirect peer traffic (not switch upstream ports),
/// once each, or why the paths could not be read.
fn ports_between_gpus(f: &Facts) -> Result<Vec<Port>, String> {
    let sys = f.sysfs.as_ref().map_err(Clone::clone)?;
    let mut out: Vec<Port> = Vec::new();
    for id in &f.gpu_bus_ids {
        let path = sys.path(id)?;
        for b in path.bridges.iter().filter(|b| b.is_bridge()) {
            if b.port_type == Some(PortType::Upstream) || out.iter().any(|p| p.bus_id == b.bus_id) {
                continue;
            }
            let acs = match sys.config(&b.bus_id) {
                Ok(cfg) => sysfs::acs(&cfg),
                Err(e) => Acs::Unreadable(e),
            };
            out.push(Port {
                bus_id: b.bus_id.clone(),
                port_type: b.port_type,
                acs,
            });
        }
    }
    Ok(out)
}

pub fn acs(f: &Facts) -> Check {
    const ID: &str = "acs";
    if f.gpu_bus_ids.len() < 2 {
        return match (&f.sysfs, f.gpu_bus_ids.len()) {
            (Err(why), _) => Check::new(ID, Status::Unknown, why.clone(), ON_THE_NODE),
            (Ok(_), 1) => Check::ok(ID, "one GPU: no switch port lies between GPUs"),
            (Ok(_), _) => Check::new(
                ID,
                Status::Unknown,
                "no GPU has a PCI bus id to find its ports by",
                ON_THE_NODE,
            ),
        };
    }
    let ports = match ports_between_gpus(f) {
        Ok(p) => p,
        Err(why) => return Check::new(ID, Status::Unknown, why, ON_THE_NODE),
    };
    if ports.is_empty() {
        return Check::ok(
            ID,
            "the GPUs sit directly on a root bus: no switch or root port between them to check",
        );
    }
    let redirect = |p: &&Port| matches!(p.acs, Acs::Control(c) if c & ACS_REDIRECTS != 0);
    let control = |p: &Port| match p.acs {
        Acs::Control(c) => format!("{} (ACSCtl {c:#06x})", p.bus_id),
        _ => p.bus_id.clone(),
    };
    let switch_ports: Vec<String> = ports
        .iter()
        .filter(redirect)
        .filter(|p| p.port_type != Some(PortType::RootPort))
        .map(control)
        .collect();
    let root_ports: Vec<String> = ports
        .iter()
        .filter(redirect)
        .filter(|p| p.port_type == Some(PortType::RootPort))
        .map(control)
        .collect();
    let unreadable: Vec<(&str, &str)> = ports
        .iter()
        .filter_map(|p| match &p.acs {
            Acs::Unreadable(why) => Some((p.bus_id.as_str(), why.as_str())),
            _ => None,
        })
        .collect();
    let first = ports
        .iter()
        .find(|p| redirect(p))
        .map_or("BDF", |p| p.bus_id.as_str());
    let fix = format!(
        "disable ACS on each listed port as root with `setpci -s {first} ECAP_ACS+6.w=0000` (again after every boot), or turn ACS off in the BIOS"
    );
    if !switch_ports.is_empty() {
        return Check::new(
            ID,
            Status::Fail,
            format!(
                "ACS redirects peer-to-peer traffic up to the root complex at switch port{} {}",
                if switch_ports.len() == 1 { "" } else { "s" },
                list(&switch_ports)
            ),
            fix,
        );
    }
    if !root_ports.is_empty() {
        return Check::new(
            ID,
            Status::Warn,
            format!(
                "ACS redirects peer-to-peer requests at root port{} {} (traffic between root ports then goes through the IOMMU)",
                if root_ports.len() == 1 { "" } else { "s" },
                list(&root_ports)
            ),
            fix,
        );
    }
    if let Some((id, why)) = unreadable.first() {
        return Check::new(
            ID,
            Status::Unknown,
            format!(
                "the ACS of {} port{} is unknown: {id}: {why}",
                unreadable.len(),
                if unreadable.len() == 1 { "" } else { "s" }
            ),
            ON_THE_NODE,
        );
    }
    let ids: Vec<&str> = ports.iter().map(|p| p.bus_id.as_str()).collect();
    Check::ok(
        ID,
        format!(
            "ACS redirects no peer-to-peer traffic at the {} port{} between the GPUs ({})",
            ports.len(),
            if ports.len() == 1 { "" } else { "s" },
            list(&ids)
        ),
    )
}

/// What the kernel command line asks of the IOMMU.
fn cmdline_iommu(cmdline: &str) -> Vec<&str> {
    cmdline
        .split_whitespace()
        .filter(|w| {
            w.starts_with("iommu") || w.starts_with("intel_iommu=") || w.starts_with("amd_iommu=")
        })
        .collect()
}

pub fn iommu(f: &Facts) -> Check {
    const ID: &str = "iommu";
    let sys = match &f.sysfs {
        Ok(s) => s,
        Err(why) => return Check::new(ID, Status::Unknown, why.clone(), ON_THE_NODE),
    };
    let words = f.cmdline.as_deref().map(cmdline_iommu).unwrap_or_default();
    let cmdline = if words.is_empty() {
        match &f.cmdline {
            Ok(_) => "no IOMMU option on the kernel command line".to_string(),
            Err(why) => why.clone(),
        }
    } else {
        format!("kernel command line `{}`", words.join(" "))
    };
    let units = sys.iommu_units().unwrap_or_default();
    let types: Vec<(usize, Option<String>)> = f
        .gpu_bus_ids
        .iter()
        .enumerate()
        .map(|(i, id)| (i, sys.iommu_group_type(id)))
        .collect();
    let translated: Vec<String> = types
        .iter()
        .filter(|(_, t)| t.as_deref().is_some_and(|t| t.starts_with("DMA")))
        .map(|(i, t)| format!("GPU {i} ({})", t.as_deref().unwrap_or("")))
        .collect();
    if !translated.is_empty() {
        return Check::new(
            ID,
            Status::Warn,
            format!(
                "the IOMMU translates the DMA of {} (units {}; {cmdline}), so every peer access is translated",
                list(&translated),
                list(&units)
            ),
            "boot with `iommu=pt` on the kernel command line (passthrough), or turn the IOMMU off in the BIOS if nothing needs it, then reboot",
        );
    }
    let identity = types
        .iter()
        .filter(|(_, t)| t.as_deref() == Some("identity"))
        .count();
    if !types.is_empty() && identity == types.len() {
        return Check::ok(
            ID,
            format!("the IOMMU passes the GPUs' DMA through untranslated (group type identity; {cmdline})"),
        );
    }
    if units.is_empty() && types.iter().all(|(_, t)| t.is_none()) {
        return Check::ok(
            ID,
            format!("no IOMMU is active (/sys/class/iommu lists no unit; {cmdline})"),
        );
    }
    let odd: Vec<String> = types
        .iter()
        .map(|(i, t)| format!("GPU {i}: {}", t.as_deref().unwrap_or("no group")))
        .collect();
    Check::new(
        ID,
        Status::Unknown,
        format!(
            "IOMMU units {} are registered but the GPUs' IOMMU mode is unclear ({}; {cmdline})",
            list(&units),
            list(&odd)
        ),
        "check `/sys/bus/pci/devices/<GPU>/iommu_group/type`; passthrough (`iommu=pt`) is what peer-to-peer wants",
    )
}

pub fn bar1(f: &Facts) -> Check {
    const ID: &str = "bar1";
    let t = f.topology.as_ref().ok();
    let n = f.gpu_bus_ids.len().max(t.map_or(0, Topology::gpu_count));
    let mut small = Vec::new();
    let mut fine = Vec::new();
    let mut unknown = Vec::new();
    for i in 0..n {
        let nvml = f
            .settings
            .as_ref()
            .ok()
            .and_then(|s| s.get(i))
            .and_then(|s| s.bar1_bytes.clone().ok());
        let from_sysfs = || {
            let sys = f.sysfs.as_ref().ok()?;
            sys.bar_sizes(f.gpu_bus_ids.get(i)?)?.get(1).copied()
        };
        let memory = t.and_then(|t| t.gpus.get(i)).and_then(|g| g.memory_bytes);
        match (nvml.or_else(from_sysfs), memory) {
            (Some(bar), Some(mem)) if bar < mem => small.push(format!(
                "GPU {i}: {} for {} of memory",
                fmt_bytes(bar),
                fmt_bytes(mem)
            )),
            (Some(bar), Some(mem)) => fine.push(format!(
                "GPU {i}: {} for {}",
                fmt_bytes(bar),
                fmt_bytes(mem)
            )),
            (Some(bar), None) => unknown.push(format!(
                "GPU {i}: {} for an unknown memory size",
                fmt_bytes(bar)
            )),
            (None, _) => unknown.push(format!("GPU {i}")),
        }
    }
    if !small.is_empty() {
        return Check::new(
            ID,
            Status::Warn,
            format!(
                "BAR1, the window peers map GPU memory through, is smaller than the memory: {}",
                list(&small)
            ),
            "enable Resizable BAR and Above 4G Decoding in the BIOS (`nvidia-smi -q -d MEMORY` shows BAR1)",
        );
    }
    if fine.is_empty() && unknown.iter().any(|u| u.contains(" for ")) {
        return Check::new(
            ID,
            Status::Unknown,
            format!(
                "BAR1 cannot be compared with the memory: {}",
                list(&unknown)
            ),
            ON_THE_NODE,
        );
    }
    if fine.is_empty() {
        let why = match &f.settings {
            Err(why) => why.clone(),
            Ok(s) => s
                .iter()
                .find_map(|s| s.bar1_bytes.clone().err())
                .unwrap_or_else(|| "NVML gave no BAR1 size".into()),
        };
        return Check::new(
            ID,
            Status::Unknown,
            format!("the BAR1 size is unknown: {why}, and sysfs shows no BAR1 either"),
            ON_THE_NODE,
        );
    }
    let mut evidence = format!("BAR1 covers every GPU's memory ({})", list(&fine));
    if !unknown.is_empty() {
        evidence = format!("{evidence}; unknown for {}", list(&unknown));
    }
    Check::ok(ID, evidence)
}

pub fn p2p(f: &Facts) -> Check {
    const ID: &str = "p2p";
    let t = match &f.topology {
        Ok(t) => t,
        Err(_) => return no_topology(ID),
    };
    if t.gpu_count() < 2 {
        return Check::ok(ID, "one GPU: there is no pair to check");
    }
    let refused =
        |p: &crate::topology::Pair| p.p2p.read == P2pStatus::No || p.p2p.write == P2pStatus::No;
    let close = |c: PathClass| matches!(c, PathClass::NV | PathClass::PIX | PathClass::PXB);
    let label =
        |p: &crate::topology::Pair| format!("{}→{} ({})", p.from, p.to, p.path.label(p.nvlinks));
    let near: Vec<String> = t
        .pairs
        .iter()
        .filter(|p| refused(p) && close(p.path))
        .map(label)
        .collect();
    let far: Vec<String> = t
        .pairs
        .iter()
        .filter(|p| refused(p) && !close(p.path))
        .map(label)
        .collect();
    let measured = f.measured.as_ref().map(|m| &m.pairs);
    // Pairs a transfer verified need no status from the driver.
    let transferred = |a: usize, b: usize| {
        matches!(measured, Some(Ok(pairs)) if pairs.iter().any(|p| {
            p.result.is_ok() && ((p.a, p.b) == (a, b) || (p.b, p.a) == (a, b))
        }))
    };
    let unknown: Vec<String> = t
        .pairs
        .iter()
        .filter(|p| {
            !refused(p)
                && (p.p2p.read == P2pStatus::Unknown || p.p2p.write == P2pStatus::Unknown)
                && !transferred(p.from, p.to)
        })
        .map(label)
        .collect();
    let source = if f.machine.simulated() {
        "the model states"
    } else {
        "the driver reports"
    };
    if let Some(Ok(pairs)) = measured {
        let bad: Vec<String> = pairs
            .iter()
            .filter_map(|p| {
                p.result
                    .as_ref()
                    .err()
                    .map(|e| format!("{}-{}: {e}", p.a, p.b))
            })
            .collect();
        if let Some(first) = bad.first() {
            return Check::new(
                ID,
                Status::Fail,
                format!(
                    "a transfer through peer memory went wrong between {} of {} pairs ({first})",
                    bad.len(),
                    pairs.len()
                ),
                "do not use custom allreduce on these GPUs until `artune doctor --measure` passes: check ACS, IOMMU and the BIOS, and update the driver",
            );
        }
    }
    if !near.is_empty() {
        return Check::new(
            ID,
            Status::Fail,
            format!(
                "{source} no P2P between GPUs under one switch or NVLink: {}",
                list(&near)
            ),
            "check ACS and the IOMMU (the checks above) and that the driver supports P2P on this board, then `nvidia-smi topo -p2p rw`",
        );
    }
    let verified = match measured {
        Some(Ok(pairs)) if !pairs.is_empty() => {
            let what: Vec<&str> = pairs
                .iter()
                .filter_map(|p| p.result.as_ref().ok().map(String::as_str))
                .take(1)
                .collect();
            format!(
                "; a transfer verified {} pair{} ({})",
                pairs.len(),
                if pairs.len() == 1 { "" } else { "s" },
                what.join("")
            )
        }
        Some(Err(why)) => format!("; not verified by a transfer: {why}"),
        _ => "; `--measure` verifies it with a transfer".into(),
    };
    if !far.is_empty() {
        return Check::new(
            ID,
            Status::Warn,
            format!(
                "{source} no P2P between GPUs across host bridges or sockets: {}{verified}",
                list(&far)
            ),
            "keep each TP group within GPUs that have P2P (custom allreduce cannot span these pairs; NCCL goes through host memory)",
        );
    }
    if !unknown.is_empty() {
        return Check::new(
            ID,
            Status::Unknown,
            format!("{source} no P2P status for {}{verified}", list(&unknown)),
            "run `artune doctor --measure` to verify them with a transfer (`nvidia-smi topo -p2p rw` shows what the driver allows)",
        );
    }
    let stated = t
        .pairs
        .iter()
        .filter(|p| p.p2p.read == P2pStatus::Ok && p.p2p.write == P2pStatus::Ok)
        .count();
    Check::ok(
        ID,
        format!(
            "{source} P2P read and write between {stated} of {} ordered pairs{verified}",
            t.pairs.len()
        ),
    )
}

pub fn links(f: &Facts) -> Check {
    const ID: &str = "links";
    let measured = f.measured.as_ref().map(|m| &m.links);
    let t = match (measured, &f.topology) {
        (Some(Ok(t)), _) => t,
        (_, Ok(t)) => t,
        (_, Err(_)) => return no_topology(ID),
    };
    let reading = if f.machine.simulated() {
        "as the model states them"
    } else {
        match t.origin.link_reading.as_str() {
            "load" => "read under load",
            "idle" => "read while idle",
            _ => "read at an unknown load",
        }
    };
    let mut hard = Vec::new();
    let mut idle = Vec::new();
    for (what, l) in t.links() {
        if !l.degraded() {
            continue;
        }
        let s = format!(
            "{what} Gen{} x{} (max Gen{} x{})",
            l.gen.unwrap_or(0),
            l.width.unwrap_or(0),
            l.max_gen.unwrap_or(0),
            l.max_width.unwrap_or(0)
        );
        let narrow = matches!((l.width, l.max_width), (Some(w), Some(m)) if w < m);
        // Idle GPUs lower their generation to save power, never their width.
        if narrow || f.machine.simulated() || t.origin.link_reading == "load" {
            hard.push(s);
        } else {
            idle.push(s);
        }
    }
    let not_measured = match measured {
        Some(Err(why)) => format!("; not re-read under load: {why}"),
        _ => String::new(),
    };
    if !hard.is_empty() {
        return Check::new(
            ID,
            Status::Fail,
            format!("links trained below their maximum, {reading}: {}{not_measured}", list(&hard)),
            "reseat the card or move it to a full-width slot, check the slot's link speed in the BIOS, then run `artune doctor --measure` again",
        );
    }
    if !idle.is_empty() {
        return Check::new(
            ID,
            Status::Warn,
            format!("links below their maximum generation, {reading}: {}{not_measured}", list(&idle)),
            "run `artune doctor --measure` to read them under load (idle GPUs lower the generation to save power)",
        );
    }
    Check::ok(
        ID,
        format!(
            "all {} links run at their maximum generation and width, {reading}{not_measured}",
            t.links().len()
        ),
    )
}

pub fn persistence(f: &Facts) -> Check {
    const ID: &str = "persistence";
    let s = match &f.settings {
        Ok(s) => s,
        Err(why) => return Check::new(ID, Status::Unknown, why.clone(), ON_THE_NODE),
    };
    let off: Vec<usize> = s
        .iter()
        .filter(|g| g.persistence == Ok(false))
        .map(|g| g.index)
        .collect();
    let on = s.iter().filter(|g| g.persistence == Ok(true)).count();
    if !off.is_empty() {
        return Check::new(
            ID,
            Status::Warn,
            format!(
                "persistence mode is off on GPU{} {}: the driver tears down and re-initializes the GPU between processes",
                if off.len() == 1 { "" } else { "s" },
                list(&off)
            ),
            "enable it with `nvidia-smi -pm 1` as root, or run the nvidia-persistenced service",
        );
    }
    if on == 0 || on < s.len() {
        let why = s
            .iter()
            .find_map(|g| g.persistence.clone().err())
            .unwrap_or_else(|| "NVML lists no GPU".into());
        return Check::new(
            ID,
            Status::Unknown,
            format!("persistence mode is unknown: {why}"),
            ON_THE_NODE,
        );
    }
    Check::ok(ID, format!("persistence mode is on for all {on} GPUs"))
}

pub fn islands(f: &Facts) -> Check {
    const ID: &str = "islands";
    let t = match &f.topology {
        Ok(t) => t,
        Err(_) => return no_topology(ID),
    };
    let model = |i: usize| {
        let g = &t.gpus[i];
        match g.memory_bytes {
            Some(m) => format!("{} {} GiB", g.name, m >> 30),
            None => g.name.clone(),
        }
    };
    let mut mixed = Vec::new();
    let islands = t.islands();
    for island in &islands {
        let mut kinds: Vec<(String, Vec<usize>)> = Vec::new();
        for &g in island {
            let k = model(g);
            match kinds.iter_mut().find(|(m, _)| *m == k) {
                Some((_, v)) => v.push(g),
                None => kinds.push((k, vec![g])),
            }
        }
        if kinds.len() > 1 {
            let parts: Vec<String> = kinds
                .iter()
                .map(|(k, v)| format!("{k} on GPUs {}", list(v)))
                .collect();
            mixed.push(parts.join(" with "));
        }
    }
    if !mixed.is_empty() {
        return Check::new(
            ID,
            Status::Warn,
            format!(
                "an island mixes unlike GPUs, so a TP group in it runs at the slowest one's pace: {}",
                mixed.join("; ")
            ),
            "keep each TP group to GPUs of one model (choose them with CUDA_VISIBLE_DEVICES), or move the odd GPU",
        );
    }
    Check::ok(
        ID,
        match islands.len() {
            1 => "the one island holds GPUs of one model".to_string(),
            n => format!("each of the {n} islands holds GPUs of one model"),
        },
    )
}

/// NCCL and CUDA variables that change what a tune measures; `NCCL_IB_*` and `NCCL_NET*` are
/// left over from multi-node jobs (artune measures one node).
const MEASUREMENT_VARS: &[&str] = &[
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_P2P_DIRECT_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_NTHREADS",
    "NCCL_BUFFSIZE",
    "NCCL_TUNER_PLUGIN",
    "NCCL_NVLS_ENABLE",
    "NCCL_CUMEM_ENABLE",
    "NCCL_TOPO_FILE",
    "NCCL_GRAPH_FILE",
    "NCCL_LAUNCH_MODE",
    "NCCL_NET_GDR_LEVEL",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "CUDA_MPS_PIPE_DIRECTORY",
    "ARTUNE_GPU_DEADLINE_MS",
];
const MEASUREMENT_PREFIXES: &[&str] = &["NCCL_IB_", "NCCL_NET"];

pub fn environment(env: &[(String, String)]) -> Check {
    const ID: &str = "environment";
    let mut set: Vec<String> = env
        .iter()
        .filter(|(k, _)| {
            MEASUREMENT_VARS.contains(&k.as_str())
                || MEASUREMENT_PREFIXES.iter().any(|p| k.starts_with(p))
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    set.sort();
    if set.is_empty() {
        return Check::ok(
            ID,
            "no NCCL or CUDA variable that changes the measurement is set",
        );
    }
    let first = set[0].split('=').next().unwrap_or("NAME").to_string();
    Check::new(
        ID,
        Status::Warn,
        format!(
            "set in this environment and changing what a tune measures: {}",
            list(&set)
        ),
        format!(
            "unset them before `artune tune` (e.g. `env -u {first} artune tune ...`), unless the engines run with exactly these settings"
        ),
    )
}

pub fn versions(f: &Facts) -> Check {
    const ID: &str = "versions";
    let t = match &f.topology {
        Ok(t) => t,
        Err(_) => return no_topology(ID),
    };
    let h = &t.host;
    let now = format!(
        "driver {}, CUDA {}, NCCL {}",
        h.driver.as_deref().unwrap_or("unknown"),
        h.cuda.as_deref().unwrap_or("unknown"),
        h.nccl.as_deref().unwrap_or("not found")
    );
    if let Some(p) = &f.profile {
        if p.simulated && f.machine == Machine::Real {
            return Check::new(
                ID,
                Status::Warn,
                format!(
                    "{} is a simulated profile, not a measurement of this machine ({now})",
                    p.path.display()
                ),
                "run `artune tune` on this machine and give engines that profile",
            );
        }
        if !p.changes.is_empty() {
            return Check::new(
                ID,
                Status::Warn,
                format!("since {} was tuned: {}", p.path.display(), list(&p.changes)),
                "run `artune tune` again on this machine (`artune check` exits 3 on this profile)",
            );
        }
        let unchecked = if p.unchecked.is_empty() {
            String::new()
        } else {
            format!("; not compared: {}", list(&p.unchecked))
        };
        return Check::ok(
            ID,
            format!(
                "{} matches this machine ({now}){unchecked}",
                p.path.display()
            ),
        );
    }
    if f.machine.simulated() {
        return Check::ok(
            ID,
            if h.driver.is_none() && h.cuda.is_none() && h.nccl.is_none() {
                "the model states no driver, CUDA or NCCL version; give --profile FILE to compare with a profile".to_string()
            } else {
                format!("the model states {now}; give --profile FILE to compare with a profile")
            },
        );
    }
    if h.nccl.is_none() {
        return Check::new(
            ID,
            Status::Warn,
            format!("NCCL was not found, so a tune cannot measure it ({now})"),
            "install NCCL or the nvidia-nccl-cu12/cu13 wheel, or point ARTUNE_NCCL_LIB at libnccl.so.2",
        );
    }
    Check::ok(
        ID,
        format!("{now}; give --profile FILE to compare with a profile"),
    )
}

#[cfg(test)]
mod tests;

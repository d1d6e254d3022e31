//! Checks of what PCI config space and sysfs say: ACS on the ports between GPUs, the IOMMU,
//! BAR1.

use super::{driver_says, list, Check, Status, NVML_SAID, ON_THE_NODE};
use crate::doctor::facts::Facts;
use crate::topology::sysfs::{self, Acs, PortType, ACS_REDIRECTS};
use crate::topology::Topology;
use crate::units::fmt_mem;

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
            // No GPU found at all is the driver check's finding: pointing at it, not at root.
            (Ok(_), _) if f.topology.is_err() => Check::new(
                ID,
                Status::Unknown,
                "no GPU was found to find its switch ports by",
                "fix the driver check first",
            ),
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
                fmt_mem(bar),
                fmt_mem(mem)
            )),
            (Some(bar), Some(mem)) => {
                fine.push(format!("GPU {i}: {} for {}", fmt_mem(bar), fmt_mem(mem)))
            }
            (Some(bar), None) => unknown.push(format!(
                "GPU {i}: {} for an unknown memory size",
                fmt_mem(bar)
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
            Err(why) if driver_says(f, why) => {
                return Check::new(
                    ID,
                    Status::Unknown,
                    format!(
                        "the BAR1 size is unknown: {NVML_SAID}, and sysfs shows no BAR1 either"
                    ),
                    "fix the driver check first",
                )
            }
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

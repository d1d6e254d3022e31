//! The PCIe tree above each GPU, read from Linux sysfs.
//!
//! NVML names the path class between two GPUs but not the switches on the way. sysfs has them:
//! `/sys/bus/pci/devices/<bus id>` links to a path through every upstream bridge, e.g.
//! `/sys/devices/pci0000:40/0000:40:01.1/0000:41:00.0/0000:42:00.0/0000:43:00.0`. The
//! `pci<domain>:<bus>` host bridge is the root complex; below it come the root port, then one
//! upstream and one downstream port per switch, then the GPU. The upstream port's link is the
//! switch's uplink, and its vendor/device ids name the switch chip.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

pub use super::pci_config::{acs, port_type, Acs, PortType, ACS_REDIRECTS};
use super::{Link, RootComplex, Socket, Switch};

/// A sysfs tree: `/sys` on a real machine, a temporary directory in tests.
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

/// One PCI function as sysfs shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PciFunction {
    /// Bus id as sysfs writes it, "0000:43:00.0".
    pub bus_id: String,
    /// Class code, e.g. 0x060400 for a PCI-to-PCI bridge.
    pub class: Option<u32>,
    pub vendor: Option<u16>,
    pub device: Option<u16>,
    /// The link above this function (current and maximum speed and width).
    pub link: Link,
    pub numa_node: Option<u32>,
    /// CPUs close to this function, as a Linux cpulist.
    pub local_cpulist: Option<String>,
    /// From config space; None when it is not readable (non-root users see only 64 bytes).
    pub port_type: Option<PortType>,
}

impl PciFunction {
    pub fn is_bridge(&self) -> bool {
        matches!(self.class, Some(c) if c >> 8 == 0x0604)
    }
}

/// A device and the bridges between it and its host bridge, top first.
#[derive(Debug, Clone, PartialEq)]
pub struct PciPath {
    /// "pci0000:40".
    pub host_bridge: String,
    pub bridges: Vec<PciFunction>,
    pub device: PciFunction,
}

/// The PCIe tree shared by a set of GPUs, in the topology model's terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tree {
    pub sockets: Vec<Socket>,
    pub root_complexes: Vec<RootComplex>,
    pub switches: Vec<Switch>,
    /// Per GPU, in the order asked: the switch or root complex it hangs from.
    pub parents: Vec<String>,
    /// Per GPU: the GPU's own PCI function.
    pub gpus: Vec<PciFunction>,
    pub notes: Vec<String>,
}

/// "00000000:41:00.0" (NVML) or "0000:41:00.0" (sysfs) → "0000:41:00.0", lower case.
pub fn normalize_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 && u32::from_str_radix(domain, 16).is_ok() => {
            let d = u32::from_str_radix(domain, 16).unwrap_or(0);
            format!("{d:04x}:{rest}")
        }
        _ => id,
    }
}

/// "32.0 GT/s PCIe" or "8 GT/s" → PCIe generation.
pub fn parse_link_speed(s: &str) -> Option<u8> {
    let gts: f64 = s.split_whitespace().next()?.parse().ok()?;
    let gen = match gts {
        x if (x - 2.5).abs() < 0.01 => 1,
        x if (x - 5.0).abs() < 0.01 => 2,
        x if (x - 8.0).abs() < 0.01 => 3,
        x if (x - 16.0).abs() < 0.01 => 4,
        x if (x - 32.0).abs() < 0.01 => 5,
        x if (x - 64.0).abs() < 0.01 => 6,
        x if (x - 128.0).abs() < 0.01 => 7,
        _ => return None,
    };
    Some(gen)
}

/// "16" or "x16" → 16; "0" (link down) → None.
pub fn parse_link_width(s: &str) -> Option<u8> {
    let w: u8 = s.trim().trim_start_matches('x').parse().ok()?;
    (w > 0).then_some(w)
}

/// Vendor names for the ids found in a GPU's PCIe path. Deterministic (no system database), so
/// identical boxes get identical topology hashes.
pub fn vendor_name(id: u16) -> Option<&'static str> {
    Some(match id {
        0x1000 => "Broadcom",
        0x10b5 => "Broadcom (PLX)",
        0x11f8 => "Microchip",
        0x10de => "NVIDIA",
        0x1022 => "AMD",
        0x8086 => "Intel",
        0x1b36 => "Red Hat (QEMU)",
        0x15ad => "VMware",
        _ => return None,
    })
}

fn is_bus_id(s: &str) -> bool {
    // dddd:bb:dd.f (the domain may be longer on VMD and Hyper-V).
    let Some((head, func)) = s.rsplit_once('.') else {
        return false;
    };
    let parts: Vec<&str> = head.split(':').collect();
    parts.len() == 3
        && func.len() == 1
        && parts
            .iter()
            .chain([&func])
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_hexdigit()))
}

fn is_host_bridge(s: &str) -> bool {
    s.strip_prefix("pci")
        .and_then(|r| r.split_once(':'))
        .is_some_and(|(d, b)| {
            !d.is_empty()
                && !b.is_empty()
                && (d.to_string() + b).chars().all(|c| c.is_ascii_hexdigit())
        })
}

fn read_trimmed(p: &Path) -> Option<String> {
    fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn read_hex(p: &Path) -> Option<u32> {
    let s = read_trimmed(p)?;
    u32::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

impl Sysfs {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Sysfs { root: root.into() }
    }

    /// The running system's sysfs.
    pub fn system() -> Self {
        Sysfs::new("/sys")
    }

    fn devices_dir(&self) -> PathBuf {
        self.root.join("bus/pci/devices")
    }

    /// True when the PCI device list can be read (it cannot in some containers and VMs).
    pub fn available(&self) -> bool {
        fs::read_dir(self.devices_dir()).is_ok_and(|mut d| d.next().is_some())
    }

    /// A function's whole config space as sysfs lets this user read it.
    pub fn config(&self, bus_id: &str) -> Result<Vec<u8>, String> {
        let p = self
            .devices_dir()
            .join(normalize_bus_id(bus_id))
            .join("config");
        fs::read(&p).map_err(|e| format!("{} cannot be read ({e})", p.display()))
    }

    /// Sizes of a function's memory regions (BARs) from its `resource` file, by index; 0 where
    /// a BAR is unused.
    pub fn bar_sizes(&self, bus_id: &str) -> Option<Vec<u64>> {
        let text = read_trimmed(
            &self
                .devices_dir()
                .join(normalize_bus_id(bus_id))
                .join("resource"),
        )?;
        text.lines()
            .take(16)
            .map(|l| {
                let mut f = l
                    .split_whitespace()
                    .map(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16));
                let (start, end) = (f.next()?.ok()?, f.next()?.ok()?);
                Some(if end > start { end - start + 1 } else { 0 })
            })
            .collect()
    }

    /// IOMMU units the kernel registered (`/sys/class/iommu`); None when the class is absent.
    pub fn iommu_units(&self) -> Option<Vec<String>> {
        let dir = fs::read_dir(self.root.join("class/iommu")).ok()?;
        let mut v: Vec<String> = dir
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        v.sort();
        Some(v)
    }

    /// The domain type of a function's IOMMU group ("identity" for passthrough, "DMA" or
    /// "DMA-FQ" for translated); None when it belongs to no group.
    pub fn iommu_group_type(&self, bus_id: &str) -> Option<String> {
        read_trimmed(
            &self
                .devices_dir()
                .join(normalize_bus_id(bus_id))
                .join("iommu_group/type"),
        )
    }

    /// NVIDIA display and 3D controllers on the bus, sorted: the GPUs, when NVML cannot say.
    pub fn nvidia_gpus(&self) -> Vec<String> {
        let Ok(dir) = fs::read_dir(self.devices_dir()) else {
            return Vec::new();
        };
        let mut v: Vec<String> = dir
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|id| {
                let d = self.devices_dir().join(id);
                read_hex(&d.join("vendor")) == Some(0x10de)
                    && read_hex(&d.join("class")).is_some_and(|c| c >> 16 == 0x03)
            })
            .collect();
        v.sort();
        v
    }

    /// Reads one PCI function's attributes from its sysfs directory.
    pub fn function(&self, dir: &Path, bus_id: &str) -> PciFunction {
        let attr = |name: &str| read_trimmed(&dir.join(name));
        let config = fs::read(dir.join("config")).unwrap_or_default();
        PciFunction {
            bus_id: bus_id.to_string(),
            class: read_hex(&dir.join("class")),
            vendor: read_hex(&dir.join("vendor")).and_then(|v| u16::try_from(v).ok()),
            device: read_hex(&dir.join("device")).and_then(|v| u16::try_from(v).ok()),
            link: Link {
                gen: attr("current_link_speed").and_then(|s| parse_link_speed(&s)),
                width: attr("current_link_width").and_then(|s| parse_link_width(&s)),
                max_gen: attr("max_link_speed").and_then(|s| parse_link_speed(&s)),
                max_width: attr("max_link_width").and_then(|s| parse_link_width(&s)),
                ..Default::default()
            },
            numa_node: attr("numa_node")
                .and_then(|s| s.parse::<i64>().ok())
                .and_then(|n| u32::try_from(n).ok()),
            local_cpulist: attr("local_cpulist"),
            port_type: port_type(&config),
        }
    }

    /// The host bridge and every bridge above a device. The error is a phrase.
    pub fn path(&self, bus_id: &str) -> Result<PciPath, String> {
        let id = normalize_bus_id(bus_id);
        let link = self.devices_dir().join(&id);
        let real = fs::canonicalize(&link)
            .map_err(|e| format!("{} cannot be resolved ({e})", link.display()))?;
        let comps: Vec<(String, PathBuf)> = real
            .ancestors()
            .filter_map(|p| Some((p.file_name()?.to_str()?.to_string(), p.to_path_buf())))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        // The last host bridge on the way: VMD and Hyper-V nest a domain below another device.
        let hb = comps
            .iter()
            .rposition(|(n, _)| is_host_bridge(n))
            .ok_or_else(|| format!("{} is not below a PCI host bridge", real.display()))?;
        let below: Vec<&(String, PathBuf)> = comps[hb + 1..]
            .iter()
            .filter(|(n, _)| is_bus_id(n))
            .collect();
        let Some(((dev_name, dev_dir), above)) = below.split_last() else {
            return Err(format!("{} names no PCI function", real.display()));
        };
        if normalize_bus_id(dev_name) != id {
            return Err(format!("{} does not end in {id}", real.display()));
        }
        Ok(PciPath {
            host_bridge: comps[hb].0.clone(),
            bridges: above.iter().map(|(n, d)| self.function(d, n)).collect(),
            device: self.function(dev_dir, dev_name),
        })
    }

    /// The PCIe tree above the given GPUs (NVML bus ids). `numa` (per GPU, from NVML) places a
    /// root complex whose sysfs entries give no NUMA node. The error is a phrase.
    pub fn tree(&self, bus_ids: &[String], numa: &[Option<u32>]) -> Result<Tree, String> {
        let paths = bus_ids
            .iter()
            .map(|b| self.path(b))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(build_tree(&paths, numa))
    }
}

/// Which bridges of a path are switch upstream ports. With config space readable the port type
/// says so; otherwise by position: a root port (when the count is odd), then one upstream and one
/// downstream port per switch.
fn upstream_ports(bridges: &[PciFunction]) -> Vec<usize> {
    let bridge_idx: Vec<usize> = (0..bridges.len())
        .filter(|&i| bridges[i].is_bridge())
        .collect();
    if !bridge_idx.is_empty() && bridge_idx.iter().all(|&i| bridges[i].port_type.is_some()) {
        return bridge_idx
            .into_iter()
            .filter(|&i| bridges[i].port_type == Some(PortType::Upstream))
            .collect();
    }
    let skip = bridge_idx.len() % 2;
    bridge_idx.into_iter().skip(skip).step_by(2).collect()
}

/// Builds the tree from the paths of every GPU; `numa` as in [`Sysfs::tree`].
pub fn build_tree(paths: &[PciPath], numa: &[Option<u32>]) -> Tree {
    let mut t = Tree::default();
    let mut rc_numa: BTreeMap<String, Option<u32>> = BTreeMap::new();
    for (k, p) in paths.iter().enumerate() {
        let rc = p.host_bridge.clone();
        let numa = p
            .bridges
            .iter()
            .chain([&p.device])
            .find_map(|f| f.numa_node)
            .or(numa.get(k).copied().flatten());
        let slot = rc_numa.entry(rc.clone()).or_insert(None);
        if slot.is_none() {
            *slot = numa;
        }
        if !t.root_complexes.iter().any(|r| r.id == rc) {
            t.root_complexes.push(RootComplex {
                id: rc.clone(),
                socket: 0,
                contention: None,
            });
        }
        let mut parent = rc;
        for i in upstream_ports(&p.bridges) {
            let up = &p.bridges[i];
            let mut uplink = up.link.clone();
            // The port above sees the same link; fill what the upstream port leaves out.
            if let Some(above) = i.checked_sub(1).map(|j| &p.bridges[j].link) {
                uplink.gen = uplink.gen.or(above.gen);
                uplink.width = uplink.width.or(above.width);
                uplink.max_gen = uplink.max_gen.or(above.max_gen);
                uplink.max_width = uplink.max_width.or(above.max_width);
            }
            let id = up.bus_id.clone();
            if !t.switches.iter().any(|s| s.id == id) {
                t.switches.push(Switch {
                    id: id.clone(),
                    parent: parent.clone(),
                    vendor: up.vendor.map(|v| {
                        vendor_name(v)
                            .map(String::from)
                            .unwrap_or(format!("0x{v:04x}"))
                    }),
                    device: up.device.map(|d| format!("0x{d:04x}")),
                    uplink,
                    contention: None,
                });
            }
            parent = id;
        }
        t.parents.push(parent);
        t.gpus.push(p.device.clone());
    }
    // Socket = NUMA node of the root complex: the boundary NVML's NODE/SYS classes use.
    let mut assumed = Vec::new();
    for r in &mut t.root_complexes {
        match rc_numa.get(&r.id).copied().flatten() {
            Some(n) => r.socket = n,
            None => assumed.push(r.id.clone()),
        }
    }
    if !assumed.is_empty() && t.root_complexes.len() > 1 {
        t.notes.push(format!(
            "sysfs gives no NUMA node for root complex {}: placed on socket 0",
            assumed.join(", ")
        ));
    }
    let mut ids: Vec<u32> = t.root_complexes.iter().map(|r| r.socket).collect();
    ids.sort_unstable();
    ids.dedup();
    t.sockets = ids
        .into_iter()
        .map(|id| Socket {
            id,
            interconnect: None,
            contention: None,
        })
        .collect();
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// Writes one PCI function directory with the usual attribute files.
    fn func(
        dir: &Path,
        class: &str,
        vendor: &str,
        device: &str,
        speed: &str,
        width: &str,
        numa: &str,
    ) {
        fs::create_dir_all(dir).unwrap();
        for (name, val) in [
            ("class", class),
            ("vendor", vendor),
            ("device", device),
            ("current_link_speed", speed),
            ("current_link_width", width),
            ("max_link_speed", "32.0 GT/s PCIe"),
            ("max_link_width", "16"),
            ("numa_node", numa),
        ] {
            fs::write(dir.join(name), format!("{val}\n")).unwrap();
        }
    }

    fn link_device(root: &Path, real: &Path) {
        let name = real.file_name().unwrap();
        let devs = root.join("bus/pci/devices");
        fs::create_dir_all(&devs).unwrap();
        let rel = Path::new("../../../").join(real.strip_prefix(root).unwrap());
        symlink(rel, devs.join(name)).unwrap();
    }

    /// Root port → Microchip switch (up + two down ports) → two GPUs, plus a GPU on its own
    /// root port of another host bridge on NUMA node 1.
    fn fake_machine() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        let rp = r.join("devices/pci0000:00/0000:00:01.1");
        func(
            &rp,
            "0x060400",
            "0x1022",
            "0x14ab",
            "32.0 GT/s PCIe",
            "16",
            "0",
        );
        let up = rp.join("0000:01:00.0");
        func(
            &up,
            "0x060400",
            "0x11f8",
            "0x4000",
            "32.0 GT/s PCIe",
            "16",
            "0",
        );
        for (d, g) in [
            ("0000:02:00.0", "0000:03:00.0"),
            ("0000:02:01.0", "0000:04:00.0"),
        ] {
            let down = up.join(d);
            func(
                &down,
                "0x060400",
                "0x11f8",
                "0x4000",
                "32.0 GT/s PCIe",
                "16",
                "0",
            );
            let gpu = down.join(g);
            func(
                &gpu,
                "0x030200",
                "0x10de",
                "0x2bb5",
                "2.5 GT/s PCIe",
                "16",
                "0",
            );
            link_device(r, &gpu);
        }
        let rp2 = r.join("devices/pci0000:80/0000:80:01.1");
        func(
            &rp2,
            "0x060400",
            "0x1022",
            "0x14ab",
            "32.0 GT/s PCIe",
            "16",
            "1",
        );
        let gpu = rp2.join("0000:81:00.0");
        func(
            &gpu,
            "0x030200",
            "0x10de",
            "0x2bb5",
            "32.0 GT/s PCIe",
            "8",
            "1",
        );
        link_device(r, &gpu);
        tmp
    }

    #[test]
    fn switch_and_direct_gpus() {
        let tmp = fake_machine();
        let s = Sysfs::new(tmp.path());
        assert!(s.available());
        let ids = ["00000000:03:00.0", "00000000:04:00.0", "00000000:81:00.0"].map(String::from);
        let t = s.tree(&ids, &[]).unwrap();
        assert_eq!(t.switches.len(), 1, "{t:?}");
        let sw = &t.switches[0];
        assert_eq!(sw.id, "0000:01:00.0");
        assert_eq!(sw.parent, "pci0000:00");
        assert_eq!(sw.vendor.as_deref(), Some("Microchip"));
        assert_eq!(sw.device.as_deref(), Some("0x4000"));
        assert_eq!((sw.uplink.gen, sw.uplink.width), (Some(5), Some(16)));
        assert_eq!(
            t.parents,
            vec!["0000:01:00.0", "0000:01:00.0", "pci0000:80"]
        );
        let sockets: Vec<u32> = t.root_complexes.iter().map(|r| r.socket).collect();
        assert_eq!(sockets, vec![0, 1]);
        assert_eq!(t.sockets.len(), 2);
        assert_eq!(t.gpus[0].link.gen, Some(1));
        assert_eq!(t.gpus[2].link.width, Some(8));
        assert_eq!(t.gpus[2].link.max_width, Some(16));
    }

    #[test]
    fn vm_gpu_on_the_root_bus() {
        let tmp = tempfile::tempdir().unwrap();
        let gpu = tmp.path().join("devices/pci0000:00/0000:00:06.0");
        func(
            &gpu,
            "0x030200",
            "0x10de",
            "0x2335",
            "32.0 GT/s PCIe",
            "16",
            "-1",
        );
        link_device(tmp.path(), &gpu);
        let t = Sysfs::new(tmp.path())
            .tree(&["00000000:00:06.0".into()], &[])
            .unwrap();
        assert!(t.switches.is_empty());
        assert_eq!(t.parents, vec!["pci0000:00"]);
        assert_eq!(t.gpus[0].numa_node, None);
        assert!(
            t.notes.is_empty(),
            "one root complex needs no socket note: {:?}",
            t.notes
        );
    }

    #[test]
    fn missing_device_is_an_error_phrase() {
        let tmp = tempfile::tempdir().unwrap();
        let s = Sysfs::new(tmp.path());
        assert!(!s.available());
        let e = s.tree(&["0000:09:00.0".into()], &[]).unwrap_err();
        assert!(e.contains("0000:09:00.0"), "{e}");
    }

    #[test]
    fn port_types_override_position() {
        let b = |t| PciFunction {
            class: Some(0x060400),
            port_type: Some(t),
            ..Default::default()
        };
        // Two root-port-like bridges, then a switch: position alone would guess wrong.
        let bridges = [
            b(PortType::RootPort),
            b(PortType::Other),
            b(PortType::Upstream),
            b(PortType::Downstream),
        ];
        assert_eq!(upstream_ports(&bridges), vec![2]);
        let plain = |_| PciFunction {
            class: Some(0x060400),
            ..Default::default()
        };
        let five: Vec<PciFunction> = (0..5).map(plain).collect();
        assert_eq!(upstream_ports(&five), vec![1, 3]);
        assert_eq!(upstream_ports(&five[..4]), vec![0, 2]);
    }

    #[test]
    fn bars_iommu_and_gpu_scan() {
        let tmp = fake_machine();
        let s = Sysfs::new(tmp.path());
        let dev = tmp.path().join("bus/pci/devices/0000:03:00.0");
        fs::write(
            dev.join("resource"),
            "0x00000000fa000000 0x00000000faffffff 0x0000000000040200\n0x0000380000000000 0x0000381fffffffff 0x000000000014220c\n0x0000000000000000 0x0000000000000000 0x0000000000000000\n",
        )
        .unwrap();
        assert_eq!(
            s.bar_sizes("0000:03:00.0"),
            Some(vec![16 << 20, 128 << 30, 0])
        );
        assert_eq!(s.bar_sizes("0000:04:00.0"), None);
        assert_eq!(s.iommu_units(), None);
        fs::create_dir_all(tmp.path().join("class/iommu/dmar0")).unwrap();
        assert_eq!(s.iommu_units(), Some(vec!["dmar0".to_string()]));
        fs::create_dir_all(dev.join("iommu_group")).unwrap();
        fs::write(dev.join("iommu_group/type"), "DMA-FQ\n").unwrap();
        assert_eq!(
            s.iommu_group_type("0000:03:00.0").as_deref(),
            Some("DMA-FQ")
        );
        assert_eq!(
            s.nvidia_gpus(),
            vec!["0000:03:00.0", "0000:04:00.0", "0000:81:00.0"]
        );
        assert!(s.config("0000:03:00.0").unwrap_err().contains("config"));
    }

    #[test]
    fn parses_speeds_widths_and_ids() {
        assert_eq!(parse_link_speed("32.0 GT/s PCIe"), Some(5));
        assert_eq!(parse_link_speed("8 GT/s"), Some(3));
        assert_eq!(parse_link_speed("2.5 GT/s PCIe"), Some(1));
        assert_eq!(parse_link_speed("Unknown speed"), None);
        assert_eq!(parse_link_width("x16"), Some(16));
        assert_eq!(parse_link_width("0"), None);
        assert_eq!(normalize_bus_id("00000000:0A:00.0"), "0000:0a:00.0");
        assert_eq!(normalize_bus_id("0000:41:00.0"), "0000:41:00.0");
        assert_eq!(normalize_bus_id("00010000:e1:00.0"), "10000:e1:00.0");
        assert!(
            is_bus_id("10000:e1:00.0")
                && !is_bus_id("pci0000:00")
                && !is_bus_id("0000:00:01.1:pcie001")
        );
        assert!(is_host_bridge("pci0000:40") && !is_host_bridge("pcie001"));
    }

    #[test]
    fn vendor_names() {
        assert_eq!(vendor_name(0x11f8), Some("Microchip"));
        assert_eq!(vendor_name(0x1000), Some("Broadcom"));
        assert_eq!(vendor_name(0x1234), None);
    }
}

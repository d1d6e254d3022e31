//! The machine's GPUs and how they are wired: PCIe tree (switches, root complexes, sockets),
//! NVLink, and per-pair path class and P2P status.
//!
//! 1. Get a [`Topology`] from NVML ([`discover`]), a JSON file ([`file::load`]) or a built-in
//!    preset ([`presets::get`]).
//! 2. [`Topology::normalize`] checks references and derives what the file left out (pairs,
//!    islands), so every consumer sees the same complete model.
//! 3. [`Topology::fingerprint`] gives the layout hash (same wiring → same hash) and the host hash.

mod assemble;
pub mod file;
pub mod fingerprint;
pub mod lock;
mod normalize;
pub mod nvml;
pub mod occupancy;
pub mod p2p;
mod paths;
mod pci_config;
pub mod presets;
pub mod reading;
pub mod render;
pub mod samples;
pub mod sysfs;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use nvml::discover;

/// Where the model came from, and whether link speeds were read idle or under load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[serde(rename_all = "snake_case")]
pub struct Origin {
    /// "nvml", "file" or "preset".
    pub kind: String,
    /// Preset name or file path, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// When link generation/width were read: "idle", "load", "unknown", or "preset" (a
    /// built-in machine's, never read). GPUs drop PCIe generation when idle, so an idle
    /// reading below max is not necessarily a fault.
    #[serde(default = "unknown")]
    pub link_reading: String,
}

fn unknown() -> String {
    "unknown".into()
}

/// A file without an origin says nothing of when its links were read: "unknown", as serde's
/// default for the field, never "".
impl Default for Origin {
    fn default() -> Origin {
        Origin {
            kind: String::new(),
            name: None,
            link_reading: unknown(),
        }
    }
}

/// Software versions that a profile depends on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Host {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// CUDA driver API version, e.g. "13.0".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<String>,
}

/// Per-direction parameters of one link. Everything but the PCIe gen/width is optional: when
/// absent, the simulated fabric derives rates from gen × width and uses typical latencies; when a
/// user measured their machine, the file states it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// PCIe generation in use (1..6); None for non-PCIe links or when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gen: Option<u8>,
    /// Lanes in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gen: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_width: Option<u8>,
    /// Measured rate away from the GPU side (towards the host), GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_gbps: Option<f64>,
    /// Measured rate towards the GPU side, GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_gbps: Option<f64>,
    /// The most one flow gets through this link, GB/s (e.g. a single cross-socket pair).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_flow_gbps: Option<f64>,
    /// One-way latency across this link, microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<f64>,
}

impl Link {
    pub fn pcie(gen: u8, width: u8) -> Self {
        Link {
            gen: Some(gen),
            width: Some(width),
            max_gen: Some(gen),
            max_width: Some(width),
            ..Default::default()
        }
    }

    /// True when the link trained below its maximum generation or width.
    pub fn degraded(&self) -> bool {
        matches!((self.gen, self.max_gen), (Some(g), Some(m)) if g < m) || self.narrowed()
    }

    /// True when the link trained narrower than its maximum: a fault (a bad slot, riser or
    /// seating), never power saving, since idle GPUs lower their generation but not their width.
    pub fn narrowed(&self) -> bool {
        matches!((self.width, self.max_width), (Some(w), Some(m)) if w < m)
    }

    /// Usable unidirectional PCIe payload rate in GB/s from gen × width (after encoding and
    /// typical TLP overhead; Gen5 x16 ≈ 56 GB/s as measured in calibration C1), if known.
    pub fn pcie_gbps(&self) -> Option<f64> {
        let per_lane = match self.gen? {
            1 => 0.22,
            2 => 0.44,
            3 => 0.88,
            4 => 1.76,
            5 => 3.52,
            6 => 7.04,
            _ => return None,
        };
        Some(per_lane * self.width? as f64)
    }
}

/// How a PCIe switch or root complex behaves when many peer flows cross it at once. Switch
/// chips differ (C3 in the calibration notes): Broadcom PEX890xx collapse the data several of
/// their GPUs send out to several root complexes (pushed or pulled), Microchip Switchtec read
/// slower than they write under all-to-all. Unset fields take defaults from the vendor.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Contention {
    /// Aggregate peer throughput the node forwards at best, GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_gbps: Option<f64>,
    /// Concurrent flows the node sustains at peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub knee_flows: Option<u32>,
    /// Capacity loss per flow past the knee: capacity = peak / (1 + slope · (flows − knee)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slope: Option<f64>,
    /// Multiplier on capacity for read (pull, non-posted) traffic, 0..1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_factor: Option<f64>,
    /// Multiplier on capacity for write (push, posted) traffic, 0..1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_factor: Option<f64>,
    /// Rate (GB/s) that the data leaving this switch collapses to, all together, when two or
    /// more of its GPUs send to peers behind two or more different root complexes at once (one
    /// GPU sending to two root complexes does not collapse). A Broadcom's collapse takes
    /// pulled data too (C3's 16-flow reads); one stated for another make, posted writes only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_collapse_gbps: Option<f64>,
    /// How peer loads and stores issued by kernels (SM traffic) fare here, apart from the
    /// copy-engine traffic the fields above describe. Unset: vendor defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelTraffic>,
    /// On a socket only: the CPU vendor ("AMD", "Intel"). NCCL's own choices depend on it
    /// (its P2P level default and hard-coded inter-socket bandwidth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_vendor: Option<String>,
}

/// Kernel (SM-driven) peer traffic through a node, per direction: stores are posted writes,
/// loads non-posted reads. Copy-engine tables (p2pBandwidthLatencyTest) do not show it: one
/// kernel stream reaches less than a copy engine, and many degrade differently by switch chip.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KernelTraffic {
    /// Share of the link rate one kernel store stream reaches alone, 0..1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_factor: Option<f64>,
    /// Share of the link rate one kernel load stream reaches alone, 0..1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_factor: Option<f64>,
    /// Share of the copy-engine capacity kernel stores get with `flows` distinct kernel flows
    /// crossing the node; interpolated between points, flat past the ends. Flows strictly
    /// increasing, factors 0..1 and never rising with more flows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub store_curve: Vec<KernelPoint>,
    /// The same for kernel loads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load_curve: Vec<KernelPoint>,
}

/// One point of a kernel-traffic curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KernelPoint {
    pub flows: u32,
    pub factor: f64,
}

/// A CPU socket. Sockets are joined by an interconnect (UPI, xGMI, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Socket {
    pub id: u32,
    /// Link to the other sockets, per direction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interconnect: Option<Link>,
    /// The socket's I/O fabric between its root complexes (AMD IO die, Intel mesh), which
    /// every peer flow between two root complexes of the socket crosses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contention: Option<Contention>,
}

/// A PCIe root complex (host bridge) on a socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RootComplex {
    pub id: String,
    pub socket: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contention: Option<Contention>,
}

/// A PCIe switch. `parent` is a root complex id or another switch id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Switch {
    pub id: String,
    pub parent: String,
    /// PCI vendor name or id as sysfs shows it, e.g. "Broadcom" / "0x1000", "Microchip" / "0x11f8".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// PCI device id or model, e.g. "PM50100", "PEX89144".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Link from this switch to its parent.
    pub uplink: Link,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contention: Option<Contention>,
}

/// NVSwitch fabric joining GPUs by NVLink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NvSwitch {
    /// NVLink generation, e.g. 4 for H100/H200.
    pub generation: u32,
    /// Per-GPU NVLink bandwidth into the switch, per direction, GB/s.
    pub gpu_gbps: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<f64>,
}

/// One NVLink of a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NvLink {
    pub link: u32,
    pub active: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// PCI bus id of the far end (a GPU or an NVSwitch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_bus_id: Option<String>,
    /// Far end's GPU index when it is a GPU of this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_gpu: Option<usize>,
}

/// Compute capability, written "9.0".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeCapability {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl JsonSchema for ComputeCapability {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ComputeCapability".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "pattern": "^[0-9]+\\.[0-9]+$" })
    }
}

impl Serialize for ComputeCapability {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ComputeCapability {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let bad =
            || serde::de::Error::custom(format!("compute capability `{s}` is not like \"9.0\""));
        let (a, b) = s.split_once('.').ok_or_else(bad)?;
        Ok(ComputeCapability {
            major: a.parse().map_err(|_| bad())?,
            minor: b.parse().map_err(|_| bad())?,
        })
    }
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<ComputeCapability>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// CPUs close to this GPU, as a Linux cpulist ("0-23,48-71").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_affinity: Option<String>,
    /// The GPU's own PCIe link (to its switch or root port).
    pub pcie: Link,
    /// Id of the switch or root complex the GPU hangs from.
    pub parent: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlinks: Vec<NvLink>,
}

/// Path class between two GPUs, named as `nvidia-smi topo -m` names it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum PathClass {
    /// Same GPU.
    X,
    /// NVLink (NVSwitch or direct links); the number of links is in [`Pair::nvlinks`].
    NV,
    /// At most one PCIe switch between them.
    PIX,
    /// Several PCIe switches, no host bridge.
    PXB,
    /// Through a PCIe host bridge (root complex).
    PHB,
    /// Across host bridges within one NUMA node / socket.
    NODE,
    /// Across the socket interconnect.
    SYS,
}

impl PathClass {
    /// Name as nvidia-smi prints it (NV# with the link count).
    pub fn label(&self, nvlinks: u32) -> String {
        match self {
            PathClass::NV => format!("NV{nvlinks}"),
            other => format!("{other:?}"),
        }
    }
}

/// A tri-state answer from a driver query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    No,
    #[default]
    Unknown,
}

/// NVML's peer-to-peer status from one GPU to another.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct P2p {
    pub read: Status,
    pub write: Status,
    pub nvlink: Status,
    pub atomics: Status,
}

/// What lies between two GPUs (ordered: `from` → `to`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Pair {
    pub from: usize,
    pub to: usize,
    pub path: PathClass,
    #[serde(default)]
    pub nvlinks: u32,
    #[serde(default)]
    pub p2p: P2p,
}

/// The whole machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Short name, e.g. the preset's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default)]
    pub origin: Origin,
    #[serde(default)]
    pub host: Host,
    pub sockets: Vec<Socket>,
    pub root_complexes: Vec<RootComplex>,
    #[serde(default)]
    pub switches: Vec<Switch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvswitch: Option<NvSwitch>,
    pub gpus: Vec<Gpu>,
    /// Ordered pairs; derived from the tree when a file leaves them out.
    #[serde(default)]
    pub pairs: Vec<Pair>,
    /// Things that could not be read, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// A node of the PCIe tree, for walking paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Node<'a> {
    Gpu(usize),
    Switch(&'a str),
    RootComplex(&'a str),
}

/// Why a topology (a file, a preset, a discovered machine) was refused. Each message is a
/// phrase to embed in a sentence that names the source.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TopologyError {
    #[error("it is {}, more than the {} a topology file may have", crate::units::fmt_mem_apart(*len, *limit).0, crate::units::fmt_mem_apart(*len, *limit).1)]
    TooLarge { len: u64, limit: u64 },
    /// Not JSON, or JSON of the wrong shape (a missing field, a value of the wrong type).
    #[error("{0}")]
    Json(String),
    /// Sound JSON describing an impossible machine: a limit exceeded, a dangling or cyclic
    /// parent, a value no link can have.
    #[error("{0}")]
    Invalid(String),
}

/// Limits on what a topology may contain, so a hostile file cannot make us allocate without
/// bound (pairs grow with the square of GPUs).
pub const MAX_GPUS: usize = 256;
pub const MAX_SWITCHES: usize = 1024;

impl Topology {
    pub fn gpu_count(&self) -> usize {
        self.gpus.len()
    }

    pub fn switch(&self, id: &str) -> Option<&Switch> {
        self.switches.iter().find(|s| s.id == id)
    }

    pub fn root_complex(&self, id: &str) -> Option<&RootComplex> {
        self.root_complexes.iter().find(|r| r.id == id)
    }

    /// The pair `from` → `to`: at its row-major place, where pairs derived from the tree are,
    /// without a search of all pairs (their count grows with the square of GPUs).
    pub fn pair(&self, from: usize, to: usize) -> Option<&Pair> {
        let at =
            (from * self.gpus.len().saturating_sub(1) + to).checked_sub(usize::from(to > from));
        match at.and_then(|i| self.pairs.get(i)) {
            Some(p) if p.from == from && p.to == to => Some(p),
            _ => self.pairs.iter().find(|p| p.from == from && p.to == to),
        }
    }

    /// Every link with a label, for validation and display.
    pub fn links(&self) -> Vec<(String, &Link)> {
        let mut out = Vec::new();
        for g in &self.gpus {
            out.push((format!("GPU {} PCIe link", g.index), &g.pcie));
        }
        for s in &self.switches {
            out.push((format!("switch `{}` uplink", s.id), &s.uplink));
        }
        for s in &self.sockets {
            if let Some(l) = &s.interconnect {
                out.push((format!("socket {} interconnect", s.id), l));
            }
        }
        out
    }

    /// Warnings a user should see: degraded links, missing P2P.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        for (what, l) in self.links() {
            if l.degraded() {
                w.push(format!(
                    "{what} runs at Gen{} x{} below its maximum Gen{} x{}{}",
                    l.gen.unwrap_or(0),
                    l.width.unwrap_or(0),
                    l.max_gen.unwrap_or(0),
                    l.max_width.unwrap_or(0),
                    if self.origin.link_reading == "idle" {
                        " (read while idle: GPUs lower the link speed to save power; a tune re-reads it under load)"
                    } else {
                        ""
                    }
                ));
            }
        }
        let no_p2p: Vec<String> = self
            .pairs
            .iter()
            .filter(|p| p.from < p.to && (p.p2p.read == Status::No || p.p2p.write == Status::No))
            .map(|p| format!("{}-{}", p.from, p.to))
            .collect();
        if !no_p2p.is_empty() {
            w.push(format!(
                "P2P is not available between GPUs {}: custom allreduce cannot run across them",
                no_p2p.join(", ")
            ));
        }
        w
    }
}

/// GPU ids as "0-3" when contiguous and more than two, else "0,1" or "3,4".
pub fn fmt_gpus(gpus: &[usize]) -> String {
    let contiguous = gpus.windows(2).all(|w| w[1] == w[0] + 1);
    if contiguous && gpus.len() > 2 {
        format!("{}-{}", gpus[0], gpus[gpus.len() - 1])
    } else {
        gpus.iter()
            .map(|g| g.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_switch_paths() {
        let t = presets::get("pcie-8x-2switch").unwrap();
        assert_eq!(t.pcie_path(0, 1), PathClass::PIX);
        assert_eq!(t.pcie_path(0, 4), PathClass::PHB);
        assert_eq!(t.islands(), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert_eq!(t.pairs.len(), 56);
    }

    #[test]
    fn two_socket_paths() {
        let t = presets::get("pcie-8x-direct-2socket").unwrap();
        assert_eq!(t.pcie_path(0, 1), PathClass::NODE);
        assert_eq!(t.pcie_path(0, 4), PathClass::SYS);
        assert_eq!(t.islands().len(), 8);
    }

    #[test]
    fn nvswitch_pairs_are_nvlink() {
        let t = presets::get("nvswitch-8x").unwrap();
        let p = t.pair(0, 5).unwrap();
        assert_eq!(p.path, PathClass::NV);
        assert_eq!(p.nvlinks, 18);
    }

    #[test]
    fn cycle_is_rejected() {
        let mut t = presets::get("pcie-2x").unwrap();
        t.pairs.clear();
        t.switches[0].parent = t.switches[0].id.clone();
        let e = t.normalize().unwrap_err();
        assert!(matches!(e, TopologyError::Invalid(_)), "{e:?}");
        assert!(e.to_string().contains("cycle"), "{e}");
    }
}

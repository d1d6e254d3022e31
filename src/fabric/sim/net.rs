//! The link graph of a topology: every capacity-limited thing a peer transfer crosses, the
//! route of each GPU→GPU flow over them, and the rates concurrent flows get (via [`flow`]).
//!
//! Resources, each per direction where the hardware is full duplex:
//! - a GPU's PCIe port (up = away from the GPU) and, with NVSwitch, its NVLink port;
//! - a switch's uplink, and the switch itself as a node whose forwarding capacity shrinks with
//!   the number of flows crossing it ([`Contention`]);
//! - a root complex as a node; a socket's I/O fabric as a node crossed by flows between its root
//!   complexes or to/from the socket interconnect; the interconnect per direction, with a
//!   per-flow cap (`max_flow_gbps`);
//! - a socket's host memory, where NCCL's SHM transport stages data between GPUs it does not
//!   connect peer to peer (reached without the root complex's peer forwarding).
//!
//! Kernel (SM) loads and stores weigh more than copy-engine bytes on every resource they
//! cross, by the node factors of [`kernel`](super::kernel).

use std::collections::HashMap;

use self::assumed::Assumed;

use super::band::Part;
use super::calibration::Calibration;
use super::flow::{self, Problem};
use super::kernel::{Kernel, NodeKind};
use crate::fabric::Direction;
use crate::topology::{Contention, Link, Node, PathClass, Topology};

/// Used when a link states neither gen × width nor a measured rate: PCIe Gen4 x16.
const FALLBACK_PCIE_GBPS: f64 = 28.16;
/// One-way latency of a GPU's own PCIe link when the file gives none. Two of them make
/// C1's 0.63–0.73 µs GPU-resident latency inside one switch.
const DEFAULT_GPU_LINK_US: f64 = 0.33;
/// Switch uplink latency when unstated: C1's 1.07 µs across switches minus the in-switch 0.66.
const DEFAULT_UPLINK_US: f64 = 0.2;
/// Socket interconnect latency per side when unstated: C2 reads 0.91 µs across sockets vs
/// 0.83 µs within one.
const DEFAULT_INTERCONNECT_US: f64 = 0.04;
/// NVSwitch hop latency when unstated.
const DEFAULT_NVSWITCH_US: f64 = 0.5;
/// Per-direction rate of one NVLink (NVLink3/4: 25 GB/s), for direct links without NVSwitch.
const NVLINK_LANE_GBPS: f64 = 25.0;
/// Host DRAM access behind the root complex, one way, µs (a DRAM access of about 100-150 ns).
pub const HOST_MEM_US: f64 = 0.15;
/// C3: bytes leaving a Broadcom PEX890xx partition towards two root complexes from two of its
/// GPUs collapse to about 2.7 GB/s (rtx6kpro's two-flow posted-write figure).
const BROADCOM_COLLAPSE_GBPS: f64 = 2.7;

/// Rates a file states but `Topology::normalize` does not check (contention peaks, collapse
/// rates, NVSwitch ports) are kept above zero, so a bad file slows flows instead of stalling
/// the solver.
fn positive(gbps: f64) -> f64 {
    if gbps > 1e-3 {
        gbps
    } else {
        1e-3
    }
}

/// A node's capacity as a function of the flows crossing it, and its read/write factors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Curve {
    pub peak: f64,
    pub knee: f64,
    pub slope: f64,
    pub read_factor: f64,
    pub write_factor: f64,
}

/// How a switch or a socket's I/O fabric forwards peer traffic when its file does not say,
/// from the only published aggregate of such a node: C1's switches (Microchip PM50100, five
/// Gen5 x16 ports: four GPUs and the uplink), 56 copy-engine flows at 179 GB/s in total, 44 of
/// them through each switch, which this curve reproduces. A crossbar without limit is no
/// default: every measured box forwards all-to-all far below the sum of its ports (C3).
pub const FORWARDING_DEFAULT: Contention = Contention {
    peak_gbps: Some(300.0),
    knee_flows: Some(8),
    slope: Some(0.03),
    read_factor: Some(0.9),
    write_factor: Some(1.0),
    write_collapse_gbps: None,
    kernel: None,
    cpu_vendor: None,
};
/// The ports of C1's switch [`FORWARDING_DEFAULT`] was measured on, and their rate.
const FORWARDING_PORTS: f64 = 5.0;
const FORWARDING_PORT_GBPS: f64 = 56.32;

/// Flows through each switch at C1's calibration point (12 inside, 16 out, 16 in).
pub const FORWARDING_CALIBRATED_FLOWS: usize = 44;

impl Curve {
    /// C1's curve for a node with ports of `ports` GB/s: a crossbar grows with its ports, and
    /// contention with the flows per port, so the peak scales with the ports' total rate and
    /// the knee and slope with their count. On C1's own five Gen5 ports it is C1's curve.
    /// With no ports given, C1's curve as it is (a socket's I/O fabric, below).
    pub fn forwarding_default(ports: &[f64]) -> Curve {
        Curve::forwarding_with(ports, Calibration::fitted().forwarding_peak_gbps)
    }

    /// [`Curve::forwarding_default`] with C1's peak fitted as `peak` GB/s.
    fn forwarding_with(ports: &[f64], peak: f64) -> Curve {
        let d = Curve {
            peak,
            ..Curve::from(&FORWARDING_DEFAULT)
        };
        if ports.is_empty() {
            return d;
        }
        let n = ports.len() as f64;
        let total: f64 = ports.iter().sum();
        let total = if total > 0.0 && total.is_finite() {
            total
        } else {
            FORWARDING_PORTS * FORWARDING_PORT_GBPS
        };
        Curve {
            peak: d.peak * total / (FORWARDING_PORTS * FORWARDING_PORT_GBPS),
            knee: d.knee * n / FORWARDING_PORTS,
            slope: d.slope * FORWARDING_PORTS / n,
            ..d
        }
    }

    /// A node's curve: what its file states, or where it states no peak, the forwarding of
    /// [`Curve::forwarding_default`] for its `ports` (with any read/write factor it states).
    /// Returns also whether that was assumed.
    pub fn resolve(c: Option<&Contention>, ports: &[f64]) -> (Curve, bool) {
        Curve::resolve_with(c, ports, Calibration::fitted().forwarding_peak_gbps)
    }

    /// [`Curve::resolve`] with the default's peak fitted as `peak` GB/s.
    fn resolve_with(c: Option<&Contention>, ports: &[f64], peak: f64) -> (Curve, bool) {
        match c {
            Some(c) if c.peak_gbps.is_some() => (Curve::from(c), false),
            _ => {
                let mut d = Curve::forwarding_with(ports, peak);
                if let Some(c) = c {
                    let stated = Curve::from(c);
                    if c.read_factor.is_some() {
                        d.read_factor = stated.read_factor;
                    }
                    if c.write_factor.is_some() {
                        d.write_factor = stated.write_factor;
                    }
                }
                (d, true)
            }
        }
    }

    /// Unset fields mean "no limit": infinite peak, no slope, factors of 1.
    pub fn from(c: &Contention) -> Curve {
        Curve {
            peak: c.peak_gbps.map_or(f64::INFINITY, positive),
            knee: c.knee_flows.unwrap_or(0) as f64,
            slope: c.slope.unwrap_or(0.0).max(0.0),
            read_factor: c.read_factor.unwrap_or(1.0).clamp(0.01, 1.0),
            write_factor: c.write_factor.unwrap_or(1.0).clamp(0.01, 1.0),
        }
    }

    /// Aggregate capacity with `flows` crossing: peak / (1 + slope · (flows − knee)) past the knee.
    pub fn capacity(&self, flows: usize) -> f64 {
        let over = (flows as f64 - self.knee).max(0.0);
        self.peak / (1.0 + self.slope * over)
    }

    /// ln of the capacity this curve loses past the flows per port C1 measured (44 through
    /// a switch whose knee is 8): its extrapolation, added to an assumed curve's band.
    pub fn extrapolated(&self, flows: usize) -> f64 {
        let knee = FORWARDING_DEFAULT.knee_flows.unwrap_or(8) as f64;
        let measured = FORWARDING_CALIBRATED_FLOWS as f64 * self.knee.max(1.0) / knee;
        let at = |f: f64| self.peak / (1.0 + self.slope * (f.max(measured) - self.knee).max(0.0));
        (at(measured) / at(flows as f64)).ln().max(0.0)
    }

    /// Capacity units one unit of payload costs in `dir`.
    pub fn weight(&self, dir: Direction) -> f64 {
        match dir {
            Direction::Read => 1.0 / self.read_factor,
            Direction::Write => 1.0 / self.write_factor,
        }
    }
}

/// How one GPU reaches another (or host memory).
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub resources: Vec<usize>,
    /// One-way latency, µs.
    pub latency_us: f64,
    /// The most one flow may get on this route (socket interconnect `max_flow_gbps`).
    pub flow_cap: f64,
    pub nvlink: bool,
    /// Root complex the destination GPU sits behind; None for host memory and NVLink.
    pub dst_root: Option<usize>,
}

/// What moves the bytes: a copy engine (DMA, large TLPs) or a kernel's loads and stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Engine {
    Copy,
    Kernel,
}

/// One transfer: bytes move `src` → `dst`; `dir` says who drives it (Read: `dst` pulls,
/// non-posted; Write: `src` pushes, posted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    pub src: usize,
    pub dst: usize,
    pub dir: Direction,
    pub engine: Engine,
}

impl Flow {
    pub fn copy(src: usize, dst: usize, dir: Direction) -> Flow {
        Flow {
            src,
            dst,
            dir,
            engine: Engine::Copy,
        }
    }

    pub fn kernel(src: usize, dst: usize, dir: Direction) -> Flow {
        Flow {
            src,
            dst,
            dir,
            engine: Engine::Kernel,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Switch(usize),
    Root(usize),
}

/// The link graph.
#[derive(Debug, Clone)]
pub struct Net {
    caps: Vec<f64>,
    curves: Vec<Option<Curve>>,
    gpu_up: Vec<usize>,
    gpu_down: Vec<usize>,
    gpu_lat: Vec<f64>,
    /// Places from each GPU up to its root complex.
    chains: Vec<Vec<Place>>,
    nv_up: Vec<usize>,
    nv_down: Vec<usize>,
    nv_lat: f64,
    direct_nv: HashMap<(usize, usize), usize>,
    sw_node: Vec<usize>,
    sw_up: Vec<usize>,
    sw_down: Vec<usize>,
    sw_lat: Vec<f64>,
    /// Collapse rate of each switch's outgoing bytes (C3, Broadcom).
    sw_collapse: Vec<Option<f64>>,
    /// Whether a switch's collapse takes reads' completions too (a Broadcom's), or only its
    /// posted writes.
    sw_collapse_reads: Vec<bool>,
    rc_node: Vec<usize>,
    rc_socket: Vec<usize>,
    sock_fabric: Vec<usize>,
    sock_mem: Vec<usize>,
    sock_x_up: Vec<usize>,
    sock_x_down: Vec<usize>,
    sock_x_lat: Vec<f64>,
    sock_x_flow_cap: Vec<f64>,
    /// Path class per ordered GPU pair, row-major.
    paths: Vec<PathClass>,
    /// Kernel-traffic behaviour of each node resource (switch, root complex, socket fabric).
    kernel: Vec<Option<Kernel>>,
    /// Lone-stream kernel shares of each GPU's port (store, load), from the node above it.
    gpu_alone: Vec<(f64, f64)>,
    /// Which kernel-traffic and collapse values no file stated, in words.
    assumed: Vec<String>,
    /// The model part (and so the error band) of each switch's kernel traffic.
    sw_part: Vec<Part>,
    /// Per resource: whether its forwarding curve came from [`FORWARDING_DEFAULT`].
    forwarding_assumed: Vec<bool>,
    n: usize,
    cal: Calibration,
}

/// Up and down rate of a PCIe link, GB/s.
fn link_rates(l: &Link) -> (f64, f64) {
    let base = l.pcie_gbps().unwrap_or(FALLBACK_PCIE_GBPS);
    (l.up_gbps.unwrap_or(base), l.down_gbps.unwrap_or(base))
}

/// The net as it is assembled, node by node ([`Net::build_with`]).
#[derive(Default)]
struct Builder {
    caps: Vec<f64>,
    curves: Vec<Option<Curve>>,
    /// Kernel-traffic behaviour of node resources, by resource index.
    node_kernel: Vec<(usize, Kernel)>,
    assumed: Assumed,
    forwarding_assumed: Vec<usize>,
}

impl Builder {
    fn add(&mut self, cap: f64, curve: Option<Curve>) -> usize {
        self.caps.push(cap);
        self.curves.push(curve);
        self.caps.len() - 1
    }
}

/// Each GPU's port (up, down) and its latency.
struct GpuPorts {
    up: Vec<usize>,
    down: Vec<usize>,
    lat: Vec<f64>,
}

/// NVSwitch ports per GPU, or direct NVLinks per ordered pair.
struct NvLinks {
    up: Vec<usize>,
    down: Vec<usize>,
    lat: f64,
    direct: HashMap<(usize, usize), usize>,
}

/// Per switch: its node, uplink (up, down) and its latency, posted-write collapse rate, and
/// the model part of its kernel traffic.
#[derive(Default)]
struct Switches {
    node: Vec<usize>,
    up: Vec<usize>,
    down: Vec<usize>,
    lat: Vec<f64>,
    collapse: Vec<Option<f64>>,
    collapse_reads: Vec<bool>,
    part: Vec<Part>,
}

/// Per socket: its I/O fabric node, host memory, and interconnect (up, down, latency, per-flow
/// cap).
#[derive(Default)]
struct Sockets {
    fabric: Vec<usize>,
    mem: Vec<usize>,
    x_up: Vec<usize>,
    x_down: Vec<usize>,
    x_lat: Vec<f64>,
    x_flow_cap: Vec<f64>,
}

fn gpu_ports(b: &mut Builder, t: &Topology) -> GpuPorts {
    let mut p = GpuPorts {
        up: vec![],
        down: vec![],
        lat: vec![],
    };
    for g in &t.gpus {
        let (u, d) = link_rates(&g.pcie);
        p.up.push(b.add(u, None));
        p.down.push(b.add(d, None));
        p.lat.push(g.pcie.latency_us.unwrap_or(DEFAULT_GPU_LINK_US));
    }
    p
}

fn nvlinks(b: &mut Builder, t: &Topology) -> NvLinks {
    let mut nv = NvLinks {
        up: vec![],
        down: vec![],
        lat: t
            .nvswitch
            .as_ref()
            .and_then(|s| s.latency_us)
            .unwrap_or(DEFAULT_NVSWITCH_US),
        direct: HashMap::new(),
    };
    if let Some(sw) = &t.nvswitch {
        for _ in &t.gpus {
            nv.up.push(b.add(positive(sw.gpu_gbps), None));
            nv.down.push(b.add(positive(sw.gpu_gbps), None));
        }
    } else {
        for p in t.pairs.iter().filter(|p| p.path == PathClass::NV) {
            let links = p.nvlinks.max(1) as f64;
            let r = b.add(links * NVLINK_LANE_GBPS, None);
            nv.direct.insert((p.from, p.to), r);
        }
    }
    nv
}

/// A switch's ports: the GPUs and switches below it, and its uplink.
fn switch_ports(t: &Topology, s: &crate::topology::Switch) -> Vec<f64> {
    t.gpus
        .iter()
        .filter(|g| g.parent == s.id)
        .map(|g| link_rates(&g.pcie).0)
        .chain(
            t.switches
                .iter()
                .filter(|c| c.parent == s.id)
                .map(|c| link_rates(&c.uplink).0),
        )
        .chain([link_rates(&s.uplink).0])
        .collect()
}

fn switches(b: &mut Builder, t: &Topology, cal: &Calibration) -> Switches {
    let mut out = Switches::default();
    for s in &t.switches {
        let (curve, guessed) = Curve::resolve_with(
            s.contention.as_ref(),
            &switch_ports(t, s),
            cal.forwarding_peak_gbps,
        );
        let node = b.add(curve.peak, Some(curve));
        if guessed {
            b.assumed.forwarding.push(format!("switch `{}`", s.id));
            b.forwarding_assumed.push(node);
        }
        out.node.push(node);
        // An unknown make was refused by `check_topology`; a hand-built one gets the middle.
        let kind = NodeKind::of_switch(s.vendor.as_deref()).unwrap_or(NodeKind::Unstated);
        let (k, guessed) = Kernel::resolve(s.contention.as_ref(), kind, cal.kernel.as_ref());
        if guessed {
            b.assumed.kernel(kind, format!("switch `{}`", s.id));
        }
        out.part.push(match kind {
            NodeKind::Broadcom => Part::KernelBroadcom,
            NodeKind::Unstated if guessed => Part::KernelUnstated,
            _ => Part::KernelMicrochip,
        });
        b.node_kernel.push((node, k));
        let (u, d) = link_rates(&s.uplink);
        out.up.push(b.add(u, None));
        out.down.push(b.add(d, None));
        out.lat
            .push(s.uplink.latency_us.unwrap_or(DEFAULT_UPLINK_US));
        out.collapse.push(collapse_rate(b, s, kind));
        out.collapse_reads.push(kind == NodeKind::Broadcom);
    }
    out
}

/// C3: the rate a switch's posted writes collapse to, where its file states one or it is a
/// Broadcom PEX890xx.
fn collapse_rate(b: &mut Builder, s: &crate::topology::Switch, kind: NodeKind) -> Option<f64> {
    let stated = s
        .contention
        .as_ref()
        .and_then(|c| c.write_collapse_gbps.map(positive));
    let pex890 = s
        .device
        .as_deref()
        .is_none_or(|d| d.to_ascii_uppercase().starts_with("PEX89"));
    match stated {
        Some(r) => Some(r),
        None if kind == NodeKind::Broadcom && pex890 => {
            b.assumed.collapse.push(format!("switch `{}`", s.id));
            Some(BROADCOM_COLLAPSE_GBPS)
        }
        None => None,
    }
}

/// Per root complex: its node and its socket's index.
fn root_complexes(b: &mut Builder, t: &Topology, cal: &Calibration) -> (Vec<usize>, Vec<usize>) {
    let (mut node, mut socket) = (vec![], vec![]);
    for r in &t.root_complexes {
        let curve = r.contention.as_ref().map(Curve::from);
        let x = b.add(curve.map_or(f64::INFINITY, |c| c.peak), curve);
        node.push(x);
        let (k, guessed) =
            Kernel::resolve(r.contention.as_ref(), NodeKind::Cpu, cal.kernel.as_ref());
        if guessed {
            b.assumed
                .kernel(NodeKind::Cpu, format!("root complex `{}`", r.id));
        }
        b.node_kernel.push((x, k));
        socket.push(t.sockets.iter().position(|s| s.id == r.socket).unwrap_or(0));
    }
    (node, socket)
}

fn sockets(b: &mut Builder, t: &Topology, cal: &Calibration) -> Sockets {
    let mut out = Sockets::default();
    for s in &t.sockets {
        let crossed =
            t.sockets.len() > 1 || t.root_complexes.iter().filter(|r| r.socket == s.id).count() > 1;
        // A CPU's I/O fabric is one size whatever its root ports carry, so it takes the
        // curve unscaled: C2's sockets (four GPUs and the interconnect) forward as C1's
        // switches, and C9's CX8 halves (two switch uplinks each) are not held back.
        let (curve, guessed) =
            Curve::resolve_with(s.contention.as_ref(), &[], cal.forwarding_peak_gbps);
        if guessed && crossed {
            b.assumed
                .forwarding
                .push(format!("socket {} I/O fabric", s.id));
        }
        let node = b.add(curve.peak, Some(curve));
        if guessed {
            b.forwarding_assumed.push(node);
        }
        out.fabric.push(node);
        let (k, guessed) =
            Kernel::resolve(s.contention.as_ref(), NodeKind::Cpu, cal.kernel.as_ref());
        if guessed && crossed {
            b.assumed
                .kernel(NodeKind::Cpu, format!("socket {} I/O fabric", s.id));
        }
        b.node_kernel.push((node, k));
        out.mem.push(b.add(f64::INFINITY, None));
        let x = s.interconnect.clone().unwrap_or_default();
        let base = x.pcie_gbps().unwrap_or(f64::INFINITY);
        out.x_up.push(b.add(x.up_gbps.unwrap_or(base), None));
        out.x_down.push(b.add(x.down_gbps.unwrap_or(base), None));
        out.x_lat
            .push(x.latency_us.unwrap_or(DEFAULT_INTERCONNECT_US));
        out.x_flow_cap
            .push(x.max_flow_gbps.unwrap_or(f64::INFINITY));
    }
    out
}

/// Places from each GPU up to its root complex.
fn chains(t: &Topology) -> Vec<Vec<Place>> {
    (0..t.gpus.len())
        .map(|g| {
            t.ancestry(g)
                .into_iter()
                .filter_map(|node| match node {
                    Node::Switch(id) => t
                        .switches
                        .iter()
                        .position(|s| s.id == id)
                        .map(Place::Switch),
                    Node::RootComplex(id) => t
                        .root_complexes
                        .iter()
                        .position(|r| r.id == id)
                        .map(Place::Root),
                    Node::Gpu(_) => None,
                })
                .collect()
        })
        .collect()
}

/// Path class per ordered GPU pair, row-major.
fn path_classes(t: &Topology) -> Vec<PathClass> {
    let n = t.gpus.len();
    let mut paths = vec![PathClass::X; n * n];
    for a in 0..n {
        for b in (0..n).filter(|&b| b != a) {
            paths[a * n + b] = t.pair(a, b).map_or_else(|| t.pcie_path(a, b), |p| p.path);
        }
    }
    paths
}

impl Net {
    /// The net of `t`, with the constants fitted on every calibration source.
    pub fn build(t: &Topology) -> Net {
        Net::build_with(t, &Calibration::fitted())
    }

    /// The net of `t`, with `cal`'s constants.
    pub fn build_with(t: &Topology, cal: &Calibration) -> Net {
        let mut b = Builder::default();
        let gpus = gpu_ports(&mut b, t);
        let nv = nvlinks(&mut b, t);
        let sw = switches(&mut b, t, cal);
        let (rc_node, rc_socket) = root_complexes(&mut b, t, cal);
        let so = sockets(&mut b, t, cal);
        let mut kernel = vec![None; b.caps.len()];
        for (node, k) in std::mem::take(&mut b.node_kernel) {
            kernel[node] = Some(k);
        }
        let kernel_rates = cal.kernel;
        // Lone-stream kernel shares of each GPU's port, from the node above it.
        let gpu_alone = t
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let node = t
                    .switches
                    .iter()
                    .position(|s| s.id == g.parent)
                    .map(|s| sw.node[s])
                    .or_else(|| {
                        t.root_complexes
                            .iter()
                            .position(|r| r.id == g.parent)
                            .map(|r| rc_node[r])
                    });
                let k = node
                    .and_then(|x| kernel[x].clone())
                    .unwrap_or_else(|| Kernel::default_for(NodeKind::Cpu, kernel_rates.as_ref()));
                (
                    k.alone_on(Direction::Write, b.caps[gpus.up[i]]),
                    k.alone_on(Direction::Read, b.caps[gpus.down[i]]),
                )
            })
            .collect();
        let forwarding_assumed = (0..b.caps.len())
            .map(|x| b.forwarding_assumed.contains(&x))
            .collect();
        Net {
            curves: b.curves,
            gpu_up: gpus.up,
            gpu_down: gpus.down,
            gpu_lat: gpus.lat,
            chains: chains(t),
            nv_up: nv.up,
            nv_down: nv.down,
            nv_lat: nv.lat,
            direct_nv: nv.direct,
            sw_node: sw.node,
            sw_up: sw.up,
            sw_down: sw.down,
            sw_lat: sw.lat,
            sw_collapse: sw.collapse,
            sw_collapse_reads: sw.collapse_reads,
            rc_node,
            rc_socket,
            sock_fabric: so.fabric,
            sock_x_up: so.x_up,
            sock_x_down: so.x_down,
            sock_x_lat: so.x_lat,
            sock_x_flow_cap: so.x_flow_cap,
            sock_mem: so.mem,
            paths: path_classes(t),
            kernel,
            gpu_alone,
            assumed: b.assumed.into_words(kernel_rates.as_ref()),
            sw_part: sw.part,
            forwarding_assumed,
            n: t.gpus.len(),
            cal: *cal,
            caps: b.caps,
        }
    }

    /// The fitted constants this net was built with.
    pub fn calibration(&self) -> &Calibration {
        &self.cal
    }

    /// What the model assumed because the topology did not say, one sentence each.
    pub fn assumed(&self) -> &[String] {
        &self.assumed
    }

    pub fn path(&self, a: usize, b: usize) -> PathClass {
        self.paths[a * self.n + b]
    }

    /// Root complex index above a GPU, if it reaches one.
    fn root_of(&self, g: usize) -> Option<usize> {
        match self.chains[g].last() {
            Some(Place::Root(r)) => Some(*r),
            _ => None,
        }
    }

    fn place_node(&self, p: Place) -> usize {
        match p {
            Place::Switch(s) => self.sw_node[s],
            Place::Root(r) => self.rc_node[r],
        }
    }

    /// The route from GPU `a` to GPU `b`: NVLink when their path is NV, else up the PCIe tree
    /// to the lowest common switch or root complex (through the socket fabric and
    /// interconnect when they have none) and down again.
    pub fn route(&self, a: usize, b: usize) -> Route {
        if self.path(a, b) == PathClass::NV {
            if !self.nv_up.is_empty() {
                return Route {
                    resources: vec![self.nv_up[a], self.nv_down[b]],
                    latency_us: self.nv_lat,
                    flow_cap: f64::INFINITY,
                    nvlink: true,
                    dst_root: None,
                };
            }
            if let Some(&r) = self.direct_nv.get(&(a, b)) {
                return Route {
                    resources: vec![r],
                    latency_us: self.nv_lat,
                    flow_cap: f64::INFINITY,
                    nvlink: true,
                    dst_root: None,
                };
            }
        }
        let (pa, pb) = (&self.chains[a], &self.chains[b]);
        let mut res = vec![self.gpu_up[a]];
        let mut lat = self.gpu_lat[a] + self.gpu_lat[b];
        let mut flow_cap = f64::INFINITY;
        let lca = pa
            .iter()
            .enumerate()
            .find_map(|(i, p)| pb.iter().position(|q| q == p).map(|j| (i, j)));
        let (ia, jb) = lca.unwrap_or((pa.len().saturating_sub(1), pb.len().saturating_sub(1)));
        for p in &pa[..ia.min(pa.len())] {
            if let Place::Switch(s) = *p {
                res.extend([self.sw_node[s], self.sw_up[s]]);
                lat += self.sw_lat[s];
            }
        }
        match lca {
            Some((i, _)) => res.push(self.place_node(pa[i])),
            None => {
                if let (Some(ra), Some(rb)) = (self.root_of(a), self.root_of(b)) {
                    let (ka, kb) = (self.rc_socket[ra], self.rc_socket[rb]);
                    res.push(self.rc_node[ra]);
                    if ka == kb {
                        res.push(self.sock_fabric[ka]);
                    } else {
                        res.extend([
                            self.sock_fabric[ka],
                            self.sock_x_up[ka],
                            self.sock_x_down[kb],
                            self.sock_fabric[kb],
                        ]);
                        lat += self.sock_x_lat[ka] + self.sock_x_lat[kb];
                        flow_cap = self.sock_x_flow_cap[ka].min(self.sock_x_flow_cap[kb]);
                    }
                    res.push(self.rc_node[rb]);
                }
            }
        }
        for p in pb[..jb.min(pb.len())].iter().rev() {
            if let Place::Switch(s) = *p {
                res.extend([self.sw_down[s], self.sw_node[s]]);
                lat += self.sw_lat[s];
            }
        }
        res.push(self.gpu_down[b]);
        Route {
            resources: res,
            latency_us: lat,
            flow_cap,
            nvlink: false,
            dst_root: self.root_of(b),
        }
    }

    /// Socket index a GPU's root complex is on.
    pub fn socket_of(&self, g: usize) -> usize {
        self.root_of(g).map_or(0, |r| self.rc_socket[r])
    }

    /// The route between GPU `g` and host memory on socket `socket`, towards memory when
    /// `to_host` (NCCL's SHM transport: the sender writes there, the receiver reads from
    /// there). It climbs the switches to the root complex and reaches memory without the root
    /// complex's peer forwarding, crossing the socket interconnect if the memory is remote.
    pub fn host_route(&self, g: usize, socket: usize, to_host: bool) -> Route {
        let mut res = vec![if to_host {
            self.gpu_up[g]
        } else {
            self.gpu_down[g]
        }];
        let mut lat = self.gpu_lat[g] + HOST_MEM_US;
        for p in &self.chains[g] {
            if let Place::Switch(s) = *p {
                res.push(self.sw_node[s]);
                res.push(if to_host {
                    self.sw_up[s]
                } else {
                    self.sw_down[s]
                });
                lat += self.sw_lat[s];
            }
        }
        let mine = self.socket_of(g);
        let mut flow_cap = f64::INFINITY;
        if !self.sock_mem.is_empty() {
            let socket = socket.min(self.sock_mem.len() - 1);
            if socket != mine && mine < self.sock_x_up.len() {
                let (from, to) = if to_host {
                    (mine, socket)
                } else {
                    (socket, mine)
                };
                res.extend([self.sock_x_up[from], self.sock_x_down[to]]);
                lat += self.sock_x_lat[from] + self.sock_x_lat[to];
                flow_cap = self.sock_x_flow_cap[from].min(self.sock_x_flow_cap[to]);
            }
            res.push(self.sock_mem[socket]);
        }
        if !to_host {
            res.reverse();
        }
        Route {
            resources: res,
            latency_us: lat,
            flow_cap,
            nvlink: false,
            dst_root: None,
        }
    }

    /// Max-min rates (GB/s) of `flows` running together over `routes` (one per flow).
    pub fn rates(&self, flows: &[Flow], routes: &[&Route]) -> Vec<f64> {
        // A node's load is counted in distinct GPU pairs: several NCCL channels between the
        // same two GPUs are one stream of TLPs to the switch, not several.
        let mut pairs: Vec<Vec<(usize, usize, bool)>> = vec![Vec::new(); self.caps.len()];
        for (f, r) in flows.iter().zip(routes) {
            let key = (f.src, f.dst, r.dst_root.is_none());
            for &x in r.resources.iter().filter(|&&x| self.curves[x].is_some()) {
                if !pairs[x].contains(&key) {
                    pairs[x].push(key);
                }
            }
        }
        let count: Vec<usize> = pairs.iter().map(Vec::len).collect();
        let costs = self.kernel_costs(flows, routes);
        let caps = self
            .caps
            .iter()
            .zip(&self.curves)
            .zip(&count)
            .map(|((&c, curve), &k)| curve.map_or(c, |cv| cv.capacity(k)))
            .collect();
        let mut p = Problem::new(caps);
        let collapse = self.collapse_groups(flows, routes, &mut p);
        for (i, (f, r)) in flows.iter().zip(routes).enumerate() {
            let (weight, cap) = costs[i];
            let extra = collapse
                .iter()
                .filter(|(_, members)| members.contains(&i))
                .map(|(res, _)| (*res, weight));
            let path = r
                .resources
                .iter()
                .map(|&x| (x, weight * self.curves[x].map_or(1.0, |c| c.weight(f.dir))));
            p.add_flow(path.chain(extra).collect::<Vec<_>>(), r.flow_cap.min(cap));
        }
        flow::max_min(&p)
    }

    /// When each flow finishes (µs) if all start together and flow `i` moves `bytes[i]`; rates
    /// are re-shared (and node flow counts drop) each time one finishes.
    pub fn finish_times(&self, flows: &[Flow], routes: &[&Route], bytes: &[f64]) -> Vec<f64> {
        let mut left: Vec<f64> = bytes.to_vec();
        let mut done = vec![f64::NAN; flows.len()];
        let mut now = 0.0;
        loop {
            let live: Vec<usize> = (0..flows.len()).filter(|&i| done[i].is_nan()).collect();
            if live.is_empty() {
                return done;
            }
            let fl: Vec<Flow> = live.iter().map(|&i| flows[i]).collect();
            let ro: Vec<&Route> = live.iter().map(|&i| routes[i]).collect();
            // GB/s = 1e3 bytes/µs.
            let rates: Vec<f64> = self.rates(&fl, &ro).into_iter().map(|r| r * 1e3).collect();
            let dt = live
                .iter()
                .zip(&rates)
                .map(|(&i, &r)| left[i] / r)
                .fold(f64::INFINITY, f64::min);
            if !dt.is_finite() {
                // Only flows with no capacity left: they never finish.
                for &i in &live {
                    done[i] = f64::INFINITY;
                }
                return done;
            }
            now += dt;
            for (&i, &r) in live.iter().zip(&rates) {
                left[i] -= r * dt;
                if left[i] <= bytes[i] * 1e-9 {
                    done[i] = now;
                }
            }
        }
    }
}

mod assumed;
mod costs;
mod parts;

#[cfg(test)]
mod tests;

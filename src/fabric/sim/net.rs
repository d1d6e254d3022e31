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

use std::collections::{BTreeMap, HashMap};

use super::band::Part;
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
/// C3: posted writes of a Broadcom PEX890xx switch collapse to about 2.7 GB/s.
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

impl Curve {
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
    /// Posted-write collapse rate of each switch (C3, Broadcom).
    sw_collapse: Vec<Option<f64>>,
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
    n: usize,
}

/// Nodes whose kernel-traffic or collapse behaviour came from defaults, by kind.
#[derive(Debug, Default)]
struct Assumed {
    microchip: Vec<String>,
    broadcom: Vec<String>,
    unstated: Vec<String>,
    cpu: Vec<String>,
    collapse: Vec<String>,
}

impl Assumed {
    fn kernel(&mut self, kind: NodeKind, what: String) {
        match kind {
            NodeKind::Microchip => self.microchip.push(what),
            NodeKind::Broadcom => self.broadcom.push(what),
            NodeKind::Cpu => self.cpu.push(what),
            NodeKind::Unstated => self.unstated.push(what),
        }
    }

    fn into_words(self) -> Vec<String> {
        let pct = |k: &Kernel, dir, flows| 100.0 * k.factor(dir, flows);
        let (m, b) = (
            Kernel::default_for(NodeKind::Microchip),
            Kernel::default_for(NodeKind::Broadcom),
        );
        let mut out = Vec::new();
        if !self.microchip.is_empty() {
            out.push(format!(
                "kernel traffic through {} (Microchip): calibration C5, one kernel stream reaches {:.1}% (stores) / {:.1}% (loads) of its link, and with 12 or more kernel flows through the switch {:.1}% / {:.1}% of the copy-engine capacity",
                self.microchip.join(", "),
                100.0 * m.store_alone,
                100.0 * m.load_alone,
                pct(&m, Direction::Write, 12),
                pct(&m, Direction::Read, 12),
            ));
        }
        if !self.broadcom.is_empty() {
            out.push(format!(
                "kernel traffic through {} (Broadcom): C5's curves with directions swapped, as Broadcom keeps reads better than writes (C3): stores {:.1}%, loads {:.1}% of the copy-engine capacity at 12 or more kernel flows",
                self.broadcom.join(", "),
                pct(&b, Direction::Write, 12),
                pct(&b, Direction::Read, 12),
            ));
        }
        if !self.unstated.is_empty() {
            let u = Kernel::default_for(NodeKind::Unstated);
            out.push(format!(
                "switch make not stated for {} (switches[].vendor): kernel traffic takes the middle of the Microchip and Broadcom data, {:.1}% of the copy-engine capacity both ways at 12 or more kernel flows, with the widest model band (either make's curve may hold)",
                self.unstated.join(", "),
                pct(&u, Direction::Write, 12),
            ));
        }
        if !self.cpu.is_empty() {
            out.push(format!(
                "kernel traffic through {}: no worse than copy-engine traffic under contention (C2: one-shot pulls match the copy-engine all-to-all rate)",
                self.cpu.join(", ")
            ));
        }
        if !self.collapse.is_empty() {
            out.push(format!(
                "posted writes of {} (Broadcom PEX890xx) collapse to {BROADCOM_COLLAPSE_GBPS} GB/s when two or more of its GPUs write to peers behind different root complexes (C3)",
                self.collapse.join(", ")
            ));
        }
        out
    }
}

/// Up and down rate of a PCIe link, GB/s.
fn link_rates(l: &Link) -> (f64, f64) {
    let base = l.pcie_gbps().unwrap_or(FALLBACK_PCIE_GBPS);
    (l.up_gbps.unwrap_or(base), l.down_gbps.unwrap_or(base))
}

impl Net {
    pub fn build(t: &Topology) -> Net {
        let n = t.gpus.len();
        let mut caps = Vec::new();
        let mut curves = Vec::new();
        let mut add = |cap: f64, curve: Option<Curve>| {
            caps.push(cap);
            curves.push(curve);
            caps.len() - 1
        };
        let (mut gpu_up, mut gpu_down, mut gpu_lat) = (vec![], vec![], vec![]);
        for g in &t.gpus {
            let (u, d) = link_rates(&g.pcie);
            gpu_up.push(add(u, None));
            gpu_down.push(add(d, None));
            gpu_lat.push(g.pcie.latency_us.unwrap_or(DEFAULT_GPU_LINK_US));
        }
        let (mut nv_up, mut nv_down) = (vec![], vec![]);
        if let Some(nv) = &t.nvswitch {
            for _ in &t.gpus {
                nv_up.push(add(positive(nv.gpu_gbps), None));
                nv_down.push(add(positive(nv.gpu_gbps), None));
            }
        }
        let nv_lat = t
            .nvswitch
            .as_ref()
            .and_then(|s| s.latency_us)
            .unwrap_or(DEFAULT_NVSWITCH_US);
        let mut direct_nv = HashMap::new();
        if t.nvswitch.is_none() {
            for p in t.pairs.iter().filter(|p| p.path == PathClass::NV) {
                let links = p.nvlinks.max(1) as f64;
                direct_nv.insert((p.from, p.to), add(links * NVLINK_LANE_GBPS, None));
            }
        }
        let (mut sw_node, mut sw_up, mut sw_down, mut sw_lat, mut sw_collapse) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut node_kernel: Vec<(usize, Kernel)> = Vec::new();
        let mut assumed = Assumed::default();
        let mut sw_part = vec![];
        for s in &t.switches {
            let curve = s.contention.as_ref().map(Curve::from);
            let node = add(curve.map_or(f64::INFINITY, |c| c.peak), curve);
            sw_node.push(node);
            // An unknown make was refused by `check_topology`; a hand-built one gets the middle.
            let kind = NodeKind::of_switch(s.vendor.as_deref()).unwrap_or(NodeKind::Unstated);
            let (k, guessed) = Kernel::resolve(s.contention.as_ref(), kind);
            if guessed {
                assumed.kernel(kind, format!("switch `{}`", s.id));
            }
            sw_part.push(match kind {
                NodeKind::Broadcom => Part::KernelBroadcom,
                NodeKind::Unstated if guessed => Part::KernelUnstated,
                _ => Part::KernelMicrochip,
            });
            node_kernel.push((node, k));
            let (u, d) = link_rates(&s.uplink);
            sw_up.push(add(u, None));
            sw_down.push(add(d, None));
            sw_lat.push(s.uplink.latency_us.unwrap_or(DEFAULT_UPLINK_US));
            let stated = s
                .contention
                .as_ref()
                .and_then(|c| c.write_collapse_gbps.map(positive));
            let pex890 = s
                .device
                .as_deref()
                .is_none_or(|d| d.to_ascii_uppercase().starts_with("PEX89"));
            sw_collapse.push(match stated {
                Some(r) => Some(r),
                None if kind == NodeKind::Broadcom && pex890 => {
                    assumed.collapse.push(format!("switch `{}`", s.id));
                    Some(BROADCOM_COLLAPSE_GBPS)
                }
                None => None,
            });
        }
        let (mut rc_node, mut rc_socket) = (vec![], vec![]);
        for r in &t.root_complexes {
            let curve = r.contention.as_ref().map(Curve::from);
            let node = add(curve.map_or(f64::INFINITY, |c| c.peak), curve);
            rc_node.push(node);
            let (k, guessed) = Kernel::resolve(r.contention.as_ref(), NodeKind::Cpu);
            if guessed {
                assumed.kernel(NodeKind::Cpu, format!("root complex `{}`", r.id));
            }
            node_kernel.push((node, k));
            rc_socket.push(t.sockets.iter().position(|s| s.id == r.socket).unwrap_or(0));
        }
        let (mut sock_fabric, mut sock_x_up, mut sock_x_down, mut sock_x_lat, mut sock_x_flow_cap) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut sock_mem = vec![];
        for s in &t.sockets {
            let curve = s.contention.as_ref().map(Curve::from);
            let node = add(curve.map_or(f64::INFINITY, |c| c.peak), curve);
            sock_fabric.push(node);
            let (k, guessed) = Kernel::resolve(s.contention.as_ref(), NodeKind::Cpu);
            let crossed = t.sockets.len() > 1
                || t.root_complexes.iter().filter(|r| r.socket == s.id).count() > 1;
            if guessed && crossed {
                assumed.kernel(NodeKind::Cpu, format!("socket {} I/O fabric", s.id));
            }
            node_kernel.push((node, k));
            sock_mem.push(add(f64::INFINITY, None));
            let x = s.interconnect.clone().unwrap_or_default();
            let base = x.pcie_gbps().unwrap_or(f64::INFINITY);
            sock_x_up.push(add(x.up_gbps.unwrap_or(base), None));
            sock_x_down.push(add(x.down_gbps.unwrap_or(base), None));
            sock_x_lat.push(x.latency_us.unwrap_or(DEFAULT_INTERCONNECT_US));
            sock_x_flow_cap.push(x.max_flow_gbps.unwrap_or(f64::INFINITY));
        }
        let chains = (0..n)
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
            .collect();
        let mut kernel = vec![None; caps.len()];
        for (node, k) in node_kernel {
            kernel[node] = Some(k);
        }
        let gpu_alone = t
            .gpus
            .iter()
            .map(|g| {
                let node = t
                    .switches
                    .iter()
                    .position(|s| s.id == g.parent)
                    .map(|s| sw_node[s])
                    .or_else(|| {
                        t.root_complexes
                            .iter()
                            .position(|r| r.id == g.parent)
                            .map(|r| rc_node[r])
                    });
                let k = node
                    .and_then(|x| kernel[x].clone())
                    .unwrap_or_else(|| Kernel::default_for(NodeKind::Cpu));
                (k.alone(Direction::Write), k.alone(Direction::Read))
            })
            .collect();
        let mut paths = vec![PathClass::X; n * n];
        for a in 0..n {
            for b in (0..n).filter(|&b| b != a) {
                paths[a * n + b] = t.pair(a, b).map_or_else(|| t.pcie_path(a, b), |p| p.path);
            }
        }
        Net {
            caps,
            curves,
            gpu_up,
            gpu_down,
            gpu_lat,
            chains,
            nv_up,
            nv_down,
            nv_lat,
            direct_nv,
            sw_node,
            sw_up,
            sw_down,
            sw_lat,
            sw_collapse,
            rc_node,
            rc_socket,
            sock_fabric,
            sock_x_up,
            sock_x_down,
            sock_x_lat,
            sock_x_flow_cap,
            sock_mem,
            paths,
            kernel,
            gpu_alone,
            assumed: assumed.into_words(),
            sw_part,
            n,
        }
    }

    /// The model parts the peer routes between `gpus` cross, each at its half-width for the
    /// all-to-all of the group (a switch's kernel band grows with the flows crossing it).
    pub fn parts(&self, gpus: &[usize]) -> BTreeMap<Part, f64> {
        let mut out = BTreeMap::new();
        let mut sw_flows = vec![0usize; self.sw_node.len()];
        for &a in gpus {
            for &b in gpus.iter().filter(|&&b| b != a) {
                let r = self.route(a, b);
                if r.nvlink {
                    out.insert(Part::NvLink, Part::NvLink.half_width());
                    continue;
                }
                out.insert(Part::Links, Part::Links.half_width());
                for (s, &node) in self.sw_node.iter().enumerate() {
                    if r.resources.contains(&node) {
                        sw_flows[s] += 1;
                    }
                }
                if self.rc_node.iter().any(|x| r.resources.contains(x)) {
                    out.insert(Part::RootComplex, Part::RootComplex.half_width());
                }
                if self.sock_x_up.iter().any(|x| r.resources.contains(x)) {
                    out.insert(Part::Interconnect, Part::Interconnect.half_width());
                }
            }
        }
        for (s, &flows) in sw_flows.iter().enumerate().filter(|(_, &f)| f > 0) {
            let (part, w) = (self.sw_part[s], self.sw_part[s].width(flows));
            let e = out.entry(part).or_insert(w);
            *e = e.max(w);
        }
        out
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

    /// Per flow, (weight on every resource, own cap): 1 and no cap for copy-engine flows and
    /// on NVLink. A kernel flow weighs 1 / the lowest concurrency factor of the nodes it
    /// crosses, each at the number of distinct kernel flows crossing it, and is capped at its
    /// driving GPU's lone-stream share of that GPU's port rate.
    fn kernel_costs(&self, flows: &[Flow], routes: &[&Route]) -> Vec<(f64, f64)> {
        let mut seen: Vec<Vec<(usize, usize, bool)>> = vec![Vec::new(); self.caps.len()];
        for (f, r) in flows.iter().zip(routes) {
            if f.engine != Engine::Kernel || r.nvlink {
                continue;
            }
            let key = (f.src, f.dst, r.dst_root.is_none());
            for &x in r.resources.iter().filter(|&&x| self.kernel[x].is_some()) {
                if !seen[x].contains(&key) {
                    seen[x].push(key);
                }
            }
        }
        flows
            .iter()
            .zip(routes)
            .map(|(f, r)| {
                if f.engine != Engine::Kernel || r.nvlink {
                    return (1.0, f64::INFINITY);
                }
                let factor = r
                    .resources
                    .iter()
                    .filter_map(|&x| {
                        self.kernel[x]
                            .as_ref()
                            .map(|k| k.factor(f.dir, seen[x].len()))
                    })
                    .fold(1.0, f64::min);
                let cap = match f.dir {
                    Direction::Write => self.gpu_alone[f.src].0 * self.caps[self.gpu_up[f.src]],
                    Direction::Read => self.gpu_alone[f.dst].1 * self.caps[self.gpu_down[f.dst]],
                };
                (1.0 / factor, cap)
            })
            .collect()
    }

    /// C3: posted writes leaving one switch collapse to its `write_collapse_gbps`, all
    /// together, once two or more of its GPUs write to peers behind two or more different root
    /// complexes. One GPU writing to two root complexes does not trigger it. Adds one resource
    /// per collapsing switch and returns it with its member flows.
    fn collapse_groups(
        &self,
        flows: &[Flow],
        routes: &[&Route],
        p: &mut Problem,
    ) -> Vec<(usize, Vec<usize>)> {
        let mut out = Vec::new();
        for (s, rate) in self.sw_collapse.iter().enumerate() {
            let Some(rate) = *rate else { continue };
            let members: Vec<usize> = (0..flows.len())
                .filter(|&i| {
                    flows[i].dir == Direction::Write
                        && routes[i].dst_root.is_some()
                        && routes[i].resources.contains(&self.sw_up[s])
                })
                .collect();
            let mut roots: Vec<usize> =
                members.iter().filter_map(|&i| routes[i].dst_root).collect();
            roots.sort_unstable();
            roots.dedup();
            let mut sources: Vec<usize> = members.iter().map(|&i| flows[i].src).collect();
            sources.sort_unstable();
            sources.dedup();
            if roots.len() >= 2 && sources.len() >= 2 {
                p.caps.push(rate);
                out.push((p.caps.len() - 1, members));
            }
        }
        out
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::presets;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs()
    }

    fn run(net: &Net, pairs: &[(usize, usize)], dir: Direction) -> Vec<f64> {
        let flows: Vec<Flow> = pairs
            .iter()
            .map(|&(src, dst)| Flow::copy(src, dst, dir))
            .collect();
        let routes: Vec<Route> = pairs.iter().map(|&(a, b)| net.route(a, b)).collect();
        let refs: Vec<&Route> = routes.iter().collect();
        net.rates(&flows, &refs)
    }

    #[test]
    fn curve_matches_its_formula() {
        // peak 300, knee 8, slope 0.03, 44 flows: 300 / (1 + 0.03 · 36) = 144.23.
        let c = Curve::from(&Contention {
            peak_gbps: Some(300.0),
            knee_flows: Some(8),
            slope: Some(0.03),
            ..Default::default()
        });
        assert!(close(c.capacity(44), 144.23, 1e-3));
        assert_eq!(c.capacity(8), 300.0);
    }

    #[test]
    fn cross_switch_route_and_latency() {
        let t = presets::get("pcie-8x-2switch").unwrap();
        let net = Net::build(&t);
        let r = net.route(0, 4);
        // GPU port, sw0 node, sw0 uplink up, rc0, sw1 uplink down, sw1 node, GPU port.
        assert_eq!(r.resources.len(), 7);
        // 0.33 + 0.2 + 0.2 + 0.33 (C1: about 1.07 µs across switches).
        assert!(close(r.latency_us, 1.06, 1e-9));
        assert!(close(net.route(0, 1).latency_us, 0.66, 1e-9));
    }

    #[test]
    fn one_pair_runs_at_link_rate_and_uplink_is_shared() {
        let t = presets::get("pcie-8x-2switch").unwrap();
        let net = Net::build(&t);
        // Gen5 x16 = 16 · 3.52 = 56.32 GB/s (C1: 56.2–56.3).
        let one = run(&net, &[(0, 4)], Direction::Write);
        assert!(close(one[0], 56.32, 1e-9));
        // Two pairs across one uplink share it (C1: 56.4 GB/s in total).
        let two = run(&net, &[(0, 4), (1, 5)], Direction::Write);
        assert!(close(two[0] + two[1], 56.32, 1e-9));
    }

    #[test]
    fn cross_socket_flow_is_capped() {
        let t = presets::get("pcie-8x-direct-2socket").unwrap();
        let net = Net::build(&t);
        let r = run(&net, &[(0, 4)], Direction::Read);
        let cap = t.sockets[0]
            .interconnect
            .as_ref()
            .unwrap()
            .max_flow_gbps
            .unwrap();
        assert!(close(r[0], cap, 1e-9));
    }

    #[test]
    fn finish_times_reshare_after_a_flow_ends() {
        // Two flows into GPU 1's port (56.32 shared): the 1 MB one ends first at half rate,
        // then the 2 MB one has the port alone.
        let t = presets::get("pcie-4x-1switch").unwrap();
        let net = Net::build(&t);
        let flows = [
            Flow::copy(0, 1, Direction::Write),
            Flow::copy(2, 1, Direction::Write),
        ];
        let routes = [net.route(0, 1), net.route(2, 1)];
        let refs: Vec<&Route> = routes.iter().collect();
        let done = net.finish_times(&flows, &refs, &[1e6, 2e6]);
        let half = 56.32e3 / 2.0;
        assert!(close(done[0], 1e6 / half, 1e-9));
        assert!(close(done[1], 1e6 / half + 1e6 / 56.32e3, 1e-9));
    }

    #[test]
    fn zero_capacity_in_a_file_slows_instead_of_stalling() {
        let mut t = presets::get("pcie-2x").unwrap();
        t.switches[0].contention.as_mut().unwrap().peak_gbps = Some(0.0);
        let net = Net::build(&t);
        let flows = [Flow::copy(0, 1, Direction::Write)];
        let routes = [net.route(0, 1)];
        let refs: Vec<&Route> = routes.iter().collect();
        let done = net.finish_times(&flows, &refs, &[1e6]);
        assert!(done[0].is_finite() && done[0] > 1e5, "{done:?}");
    }

    /// A Broadcom switch under rc0 whose GPUs write to peers behind rc1 and rc2.
    fn broadcom() -> Topology {
        let mut t = presets::get("pcie-8x-2switch").unwrap();
        t.pairs.clear();
        t.root_complexes.push(crate::topology::RootComplex {
            id: "rc1".into(),
            socket: 0,
            contention: None,
        });
        t.root_complexes.push(crate::topology::RootComplex {
            id: "rc2".into(),
            socket: 0,
            contention: None,
        });
        t.switches[0].vendor = Some("Broadcom".into());
        t.switches[0].contention = Some(Contention {
            write_collapse_gbps: Some(2.7),
            ..Default::default()
        });
        t.switches[1].parent = "rc1".into();
        t.gpus[7].parent = "rc2".into();
        t.normalize().unwrap();
        t
    }

    #[test]
    fn posted_writes_collapse_towards_two_root_complexes() {
        let net = Net::build(&broadcom());
        // One destination root complex: full rate.
        let one = run(&net, &[(0, 4)], Direction::Write);
        assert!(close(one[0], 56.32, 1e-9));
        // rc1 and rc2 at once: writes collapse to 2.7 GB/s together (C3) ...
        let w = run(&net, &[(0, 4), (1, 7)], Direction::Write);
        assert!(close(w[0] + w[1], 2.7, 1e-9), "{w:?}");
        // ... while reads of the same pairs keep the uplink rate.
        let r = run(&net, &[(0, 4), (1, 7)], Direction::Read);
        assert!(close(r[0] + r[1], 56.32, 1e-9), "{r:?}");
    }

    #[test]
    fn one_gpu_writing_to_two_root_complexes_does_not_collapse() {
        let net = Net::build(&broadcom());
        // GPU 0 alone towards rc1 and rc2: the uplink's rate, shared.
        let w = run(&net, &[(0, 4), (0, 7)], Direction::Write);
        assert!(close(w[0] + w[1], 56.32, 1e-9), "{w:?}");
        // Two GPUs towards one root complex: no collapse either.
        let w = run(&net, &[(0, 4), (1, 5)], Direction::Write);
        assert!(close(w[0] + w[1], 56.32, 1e-9), "{w:?}");
    }

    /// Kernel stores of every GPU of the switch to every peer behind rc1 and rc2.
    fn kernel_rates(net: &Net, pairs: &[(usize, usize)], engine: Engine) -> f64 {
        let flows: Vec<Flow> = pairs
            .iter()
            .map(|&(src, dst)| Flow {
                src,
                dst,
                dir: Direction::Write,
                engine,
            })
            .collect();
        let routes: Vec<Route> = pairs.iter().map(|&(a, b)| net.route(a, b)).collect();
        let refs: Vec<&Route> = routes.iter().collect();
        net.rates(&flows, &refs).iter().sum()
    }

    #[test]
    fn kernel_all_to_all_collapses_at_least_as_badly_as_two_copies() {
        let net = Net::build(&broadcom());
        let two = kernel_rates(&net, &[(0, 4), (1, 7)], Engine::Copy);
        let all: Vec<(usize, usize)> = (0..4).flat_map(|a| [4, 5, 6, 7].map(|b| (a, b))).collect();
        let kernel = kernel_rates(&net, &all, Engine::Kernel);
        assert!(kernel <= two * (1.0 + 1e-9), "{kernel} vs {two}");
    }

    #[test]
    fn broadcom_pex890_collapses_by_default_and_says_so() {
        let mut t = broadcom();
        t.switches[0].contention = None;
        t.switches[0].device = Some("PEX89144".into());
        let net = Net::build(&t);
        let w = run(&net, &[(0, 4), (1, 7)], Direction::Write);
        assert!(close(w[0] + w[1], 2.7, 1e-9), "{w:?}");
        assert!(
            net.assumed()
                .iter()
                .any(|a| a.contains("sw0") && a.contains("2.7")),
            "{:?}",
            net.assumed()
        );
    }

    #[test]
    fn kernel_streams_are_capped_and_degrade_under_all_to_all() {
        let t = presets::get("pcie-4x-1switch").unwrap();
        let net = Net::build(&t);
        // One kernel store stream: C5's 44.8 GB/s share of the 56.32 port.
        let one = kernel_rates(&net, &[(0, 1)], Engine::Kernel);
        assert!(close(one, 56.32 * 44.78 / 56.25, 1e-9), "{one}");
        // All 12 directed pairs: 25.4 GB/s per GPU's share of the port (C5).
        let all: Vec<(usize, usize)> = (0..4)
            .flat_map(|a| (0..4).filter(move |&b| b != a).map(move |b| (a, b)))
            .collect();
        let per_gpu = kernel_rates(&net, &all, Engine::Kernel) / 4.0;
        assert!(close(per_gpu, 56.32 * 25.40 / 56.25, 1e-9), "{per_gpu}");
        // Copy engines on the same pattern keep the full port.
        let copy = kernel_rates(&net, &all, Engine::Copy) / 4.0;
        assert!(close(copy, 56.32, 1e-9), "{copy}");
    }

    #[test]
    fn host_route_skips_peer_forwarding() {
        let t = presets::get("pcie-8x-2switch").unwrap();
        let net = Net::build(&t);
        let up = net.host_route(0, 0, true);
        // GPU port, sw0 node, sw0 uplink, host memory.
        assert_eq!(up.resources.len(), 4);
        assert!(close(up.latency_us, 0.33 + 0.2 + HOST_MEM_US, 1e-9));
        let down = net.host_route(4, 0, false);
        assert_eq!(down.resources.last(), Some(&net.gpu_down[4]));
    }
}

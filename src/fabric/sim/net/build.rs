//! Assembling the net from a topology, node by node.

use std::collections::HashMap;

use super::assumed::Assumed;
use super::curve::{positive, Curve};
use super::{
    Net, Place, BROADCOM_COLLAPSE_GBPS, DEFAULT_GPU_LINK_US, DEFAULT_INTERCONNECT_US,
    DEFAULT_NVSWITCH_US, DEFAULT_UPLINK_US, FALLBACK_PCIE_GBPS, NVLINK_LANE_GBPS,
};
use crate::fabric::sim::band::BandPart;
use crate::fabric::sim::calibration::Calibration;
use crate::fabric::sim::kernel::{KernelFactors, NodeKind};
use crate::fabric::Direction;
use crate::topology::{Link, Node, PathClass, Topology};

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
    node_kernel: Vec<(usize, KernelFactors)>,
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
    part: Vec<BandPart>,
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
        let (k, guessed) = KernelFactors::resolve(s.contention.as_ref(), kind, cal.kernel.as_ref());
        if guessed {
            b.assumed.kernel(kind, format!("switch `{}`", s.id));
        }
        out.part.push(match kind {
            NodeKind::Broadcom => BandPart::KernelBroadcom,
            NodeKind::Unstated if guessed => BandPart::KernelUnstated,
            _ => BandPart::KernelMicrochip,
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
            KernelFactors::resolve(r.contention.as_ref(), NodeKind::Cpu, cal.kernel.as_ref());
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
            KernelFactors::resolve(s.contention.as_ref(), NodeKind::Cpu, cal.kernel.as_ref());
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
                let k = node.and_then(|x| kernel[x].clone()).unwrap_or_else(|| {
                    KernelFactors::default_for(NodeKind::Cpu, kernel_rates.as_ref())
                });
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
}

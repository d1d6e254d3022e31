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
//! Kernel (SM) loads and stores weigh more than copy-engine bytes on their driving GPU's port
//! (and a collapsing uplink), by the node factors of [`kernel`](super::kernel).

use std::collections::HashMap;

pub use self::curve::{Curve, FORWARDING_CALIBRATED_FLOWS, FORWARDING_DEFAULT};
use super::band::BandPart;
use super::calibration::Calibration;
use super::kernel::KernelFactors;
use crate::fabric::Direction;
use crate::topology::PathClass;

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
    kernel: Vec<Option<KernelFactors>>,
    /// Lone-stream kernel shares of each GPU's port (store, load), from the node above it.
    gpu_alone: Vec<(f64, f64)>,
    /// Which kernel-traffic and collapse values no file stated, in words.
    assumed: Vec<String>,
    /// The model part (and so the error band) of each switch's kernel traffic.
    sw_part: Vec<BandPart>,
    /// Per resource: whether its forwarding curve came from [`FORWARDING_DEFAULT`].
    forwarding_assumed: Vec<bool>,
    n: usize,
    cal: Calibration,
}

impl Net {
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
}

mod assumed;
mod build;
mod costs;
mod curve;
mod parts;
mod share;

#[cfg(test)]
mod tests;

//! The link graph of a topology: every capacity-limited thing a peer transfer crosses, the
//! route of each GPU→GPU flow over them, and the rates concurrent flows get (via [`flow`]).
//!
//! Resources, each per direction where the hardware is full duplex:
//! - a GPU's PCIe port (up = away from the GPU) and, with NVSwitch, its NVLink port;
//! - a switch's uplink, and the switch itself as a node whose forwarding capacity shrinks with
//!   the number of flows crossing it ([`Contention`]);
//! - a root complex as a node; a socket's I/O fabric as a node crossed by flows between its root
//!   complexes or to/from the socket interconnect; the interconnect per direction, with a
//!   per-flow cap (`max_flow_gbps`).

use std::collections::HashMap;

use super::flow::{self, Problem};
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

/// How one GPU reaches another.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub resources: Vec<usize>,
    /// One-way latency, µs.
    pub latency_us: f64,
    /// The most one flow may get on this route (socket interconnect `max_flow_gbps`).
    pub flow_cap: f64,
    pub nvlink: bool,
}

/// One transfer: bytes move `src` → `dst`; `dir` says who drives it (Read: `dst` pulls,
/// non-posted; Write: `src` pushes, posted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    pub src: usize,
    pub dst: usize,
    pub dir: Direction,
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
    sock_x_up: Vec<usize>,
    sock_x_down: Vec<usize>,
    sock_x_lat: Vec<f64>,
    sock_x_flow_cap: Vec<f64>,
    /// Path class per ordered GPU pair, row-major.
    paths: Vec<PathClass>,
    n: usize,
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
        for s in &t.switches {
            let curve = s.contention.as_ref().map(Curve::from);
            sw_node.push(add(curve.map_or(f64::INFINITY, |c| c.peak), curve));
            let (u, d) = link_rates(&s.uplink);
            sw_up.push(add(u, None));
            sw_down.push(add(d, None));
            sw_lat.push(s.uplink.latency_us.unwrap_or(DEFAULT_UPLINK_US));
            sw_collapse.push(
                s.contention
                    .as_ref()
                    .and_then(|c| c.write_collapse_gbps.map(positive)),
            );
        }
        let (mut rc_node, mut rc_socket) = (vec![], vec![]);
        for r in &t.root_complexes {
            let curve = r.contention.as_ref().map(Curve::from);
            rc_node.push(add(curve.map_or(f64::INFINITY, |c| c.peak), curve));
            rc_socket.push(t.sockets.iter().position(|s| s.id == r.socket).unwrap_or(0));
        }
        let (mut sock_fabric, mut sock_x_up, mut sock_x_down, mut sock_x_lat, mut sock_x_flow_cap) =
            (vec![], vec![], vec![], vec![], vec![]);
        for s in &t.sockets {
            let curve = s.contention.as_ref().map(Curve::from);
            sock_fabric.push(add(curve.map_or(f64::INFINITY, |c| c.peak), curve));
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
            paths,
            n,
        }
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
                };
            }
            if let Some(&r) = self.direct_nv.get(&(a, b)) {
                return Route {
                    resources: vec![r],
                    latency_us: self.nv_lat,
                    flow_cap: f64::INFINITY,
                    nvlink: true,
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
        }
    }

    /// Max-min rates (GB/s) of `flows` running together over `routes` (one per flow).
    pub fn rates(&self, flows: &[Flow], routes: &[&Route]) -> Vec<f64> {
        let mut count = vec![0usize; self.caps.len()];
        for r in routes {
            for &x in &r.resources {
                count[x] += 1;
            }
        }
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
            let extra = collapse
                .iter()
                .filter(|(_, members)| members.contains(&i))
                .map(|(res, _)| (*res, 1.0));
            let path = r
                .resources
                .iter()
                .map(|&x| (x, self.curves[x].map_or(1.0, |c| c.weight(f.dir))));
            p.add_flow(path.chain(extra).collect::<Vec<_>>(), r.flow_cap);
        }
        flow::max_min(&p)
    }

    /// C3: posted writes leaving one switch towards peers behind two or more different root
    /// complexes collapse to the switch's `write_collapse_gbps`, all together. Adds one
    /// resource per collapsing switch and returns it with its member flows.
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
                    flows[i].dir == Direction::Write && routes[i].resources.contains(&self.sw_up[s])
                })
                .collect();
            let mut roots: Vec<Option<usize>> = members
                .iter()
                .map(|&i| self.root_of(flows[i].dst))
                .collect();
            roots.sort_unstable();
            roots.dedup();
            if roots.len() >= 2 {
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
            .map(|&(src, dst)| Flow { src, dst, dir })
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
            Flow {
                src: 0,
                dst: 1,
                dir: Direction::Write,
            },
            Flow {
                src: 2,
                dst: 1,
                dir: Direction::Write,
            },
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
        let flows = [Flow {
            src: 0,
            dst: 1,
            dir: Direction::Write,
        }];
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
}

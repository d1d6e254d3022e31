//! NCCL on the simulated network, in two parts that deliberately differ:
//!
//! - [`Model`]: what NCCL *predicts* (src/graph/tuning.cc: base + per-hop latency, channel
//!   bandwidth with per-protocol factors). NCCL's own choice (`Backend::Nccl`) is the
//!   algorithm × protocol this model ranks first, not necessarily the fastest.
//! - [`Schedule`]: what the run *costs* on the link graph: ring (2(N−1) lockstep steps over
//!   all channels) or tree (within one node a chain: reduce up, broadcast down, pipelined in
//!   chunks), each step paying the protocol's per-hop cost, bytes moving at the max-min rate
//!   of the ring's (or chain's) flows times the protocol's wire efficiency.

use super::net::{Flow, Net, Route};
use crate::fabric::{Direction, NcclAlgo, NcclProto};
use crate::topology::{PathClass, Topology};

/// Base latency, µs, [Tree, Ring] × [LL, LL128, Simple] (calibration C4).
const BASE_LAT: [[f64; 3]; 2] = [[6.8, 14.0, 8.4], [6.6, 14.0, 8.4]];
/// Per-hop latency, µs, [NVLink, PCIe] × [Tree, Ring] × [LL, LL128, Simple] (C4; NCCL
/// src/graph/tuning.cc hwLat). Tree/Simple's 28 µs is NCCL's stand-in for a 256 KB chunk.
const HW_LAT: [[[f64; 3]; 2]; 2] = [
    [[0.6, 1.25, 28.0], [0.6, 1.9, 3.4]],
    [[1.0, 1.9, 28.0], [1.0, 2.5, 5.7]],
];
/// NCCL's per-node caps by GPU generation [Volta, Ampere, Hopper+] (tuning.cc, one node).
const LL_MAX_BW: [f64; 3] = [39.0, 87.7, 87.7];
const PER_CH_RING_LL128: [f64; 3] = [20.0, 20.0, 36.7];
const PER_CH_TREE_LL128: [f64; 3] = [20.0, 20.0, 36.7];
const PER_CH_TREE: [f64; 3] = [26.5, 24.0, 38.7];
/// tuning.cc treeCorrectionFactor, indexed by log2(bytes / 64), [LL, LL128, Simple].
const TREE_CORRECTION: [[f64; 23]; 3] = [
    [
        1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8,
        0.9, 1.0, 1.0, 1.0, 1.0,
    ],
    [
        1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9,
        0.9, 0.9, 0.9, 1.0, 1.0,
    ],
    [
        0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8,
        0.7, 0.7, 0.8, 0.9, 0.9,
    ],
];
/// Ring-search speeds, GB/s per channel (NCCL src/graph/search.cc), by GPU generation.
const SPEEDS: [f64; 13] = [
    40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0,
];
const SPEEDS_SM90: [f64; 11] = [
    60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0,
];
const SPEEDS_SM100: [f64; 12] = [
    90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0,
];
/// The ring search keeps at most this many channels before duplicating them.
const MAX_SEARCH_CHANNELS: u32 = 16;
/// search.cc duplicates channels (halving their bandwidth) when one channel gets this much.
const DUPLICATE_AT_GBPS: f64 = 25.0;
/// NCCL's modelled PCIe rate per lane at Gen5 (C4: Gen5 x16 = 48, Gen4 x16 = 24 GB/s).
const NCCL_PCIE_LANE_GEN5: f64 = 3.0;

/// Payload share of the bytes a protocol puts on the wire: LL sends an 8-byte flag word with
/// every 8 bytes (half), LL128 one flag per 128 bytes (120/128).
const LL_EFFICIENCY: f64 = 0.5;
const LL128_EFFICIENCY: f64 = 120.0 / 128.0;
/// Simple: an empirical factor fitted to C1's ring plateau (46 GB/s busbw where one pair
/// writes at 56.2 GB/s); NCCL's per-step flag handshake and copy loop are not modelled apart.
const SIMPLE_EFFICIENCY: f64 = 0.82;
/// Tree pipeline chunk per protocol (the 256 KB Simple chunk NCCL's hwLat comment names).
const TREE_CHUNK: [f64; 3] = [32.0 * 1024.0, 128.0 * 1024.0, 256.0 * 1024.0];

fn algo_index(a: NcclAlgo) -> usize {
    match a {
        NcclAlgo::Tree => 0,
        NcclAlgo::Ring => 1,
    }
}

fn proto_index(p: NcclProto) -> usize {
    match p {
        NcclProto::LL => 0,
        NcclProto::LL128 => 1,
        NcclProto::Simple => 2,
    }
}

fn efficiency(p: NcclProto) -> f64 {
    match p {
        NcclProto::LL => LL_EFFICIENCY,
        NcclProto::LL128 => LL128_EFFICIENCY,
        NcclProto::Simple => SIMPLE_EFFICIENCY,
    }
}

/// The order NCCL's ring visits the group: GPUs sorted by their place in the PCIe tree
/// (socket, root complex, switches), so each switch's GPUs are contiguous and the ring
/// crosses every uplink once each way.
pub fn ring_order(t: &Topology, gpus: &[usize]) -> Vec<usize> {
    let key = |g: usize| {
        let mut path: Vec<String> = t
            .ancestry(g)
            .iter()
            .skip(1)
            .map(|n| format!("{n:?}"))
            .collect();
        path.reverse();
        (t.socket_of(g).unwrap_or(0), path, g)
    };
    let mut out = gpus.to_vec();
    out.sort_by_cached_key(|&g| key(g));
    out
}

/// NCCL's modelled rate of a PCIe link, GB/s.
fn nccl_pcie(l: &crate::topology::Link) -> f64 {
    match (l.gen, l.width) {
        (Some(g), Some(w)) => NCCL_PCIE_LANE_GEN5 * w as f64 * 2f64.powi(g as i32 - 5),
        _ => l.up_gbps.map_or(24.0, |u| u * 48.0 / 56.32),
    }
}

/// NCCL's per-link NVLink rate by compute capability (topo.h: SM90 20.6 per C4).
fn nvlink_bw(cc_major: Option<u32>) -> f64 {
    match cc_major {
        Some(m) if m >= 10 => 40.1,
        Some(9) => 20.6,
        _ => 20.0,
    }
}

/// What NCCL's tuning model believes about a group.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub n: usize,
    pub channels: u32,
    /// NCCL's modelled bandwidth per channel, GB/s.
    pub bw_per_channel: f64,
    /// Every ring hop is NVLink (NCCL's LINK_NVL intra type).
    pub nvlink: bool,
    /// None when LL128 is on, else why NCCL turns it off.
    pub ll128_off: Option<String>,
    cc_index: usize,
}

impl Model {
    pub fn new(t: &Topology, net: &Net, ring: &[usize]) -> Model {
        let n = ring.len();
        let hops: Vec<(usize, usize)> = (0..n).map(|i| (ring[i], ring[(i + 1) % n])).collect();
        let nvlink = hops.iter().all(|&(a, b)| net.path(a, b) == PathClass::NV);
        let ccs: Vec<Option<(u32, u32)>> = ring
            .iter()
            .map(|&g| t.gpus[g].compute_capability.map(|c| (c.major, c.minor)))
            .collect();
        let cc_min = ccs.iter().flatten().min().copied();
        let major = cc_min.map(|c| c.0);
        let cc_index = match major {
            Some(m) if m >= 9 => 2,
            Some(8) | None => 1,
            Some(_) => 0,
        };
        let max_bw = hops
            .iter()
            .map(|&(a, b)| hop_bw(t, net, a, b, major))
            .fold(f64::INFINITY, f64::min);
        let speeds: &[f64] = match major {
            Some(m) if m >= 10 => &SPEEDS_SM100,
            Some(9) => &SPEEDS_SM90,
            _ => &SPEEDS,
        };
        let speed = speeds
            .iter()
            .copied()
            .find(|&s| s <= max_bw)
            .unwrap_or(max_bw);
        let mut channels = ((max_bw / speed).floor() as u32).clamp(1, MAX_SEARCH_CHANNELS);
        let mut bw_per_channel = speed;
        if speed >= DUPLICATE_AT_GBPS {
            channels *= 2;
            bw_per_channel /= 2.0;
        }
        let ll128_off = if !nvlink {
            let (a, b) = hops
                .iter()
                .copied()
                .find(|&(a, b)| net.path(a, b) != PathClass::NV)
                .unwrap_or(hops[0]);
            Some(format!(
                "NCCL disables LL128 on PCIe paths by default (GPU {a} to GPU {b} is {:?})",
                net.path(a, b)
            ))
        } else if ccs.iter().flatten().any(|c| Some(*c) != cc_min) {
            Some("NCCL disables LL128 when the group mixes compute capabilities".into())
        } else {
            match cc_min {
                Some((7..=9, 0)) | None => None,
                Some((ma, mi)) => Some(format!(
                    "NCCL enables LL128 by default only on compute capability 7.0, 8.0 and 9.0; these GPUs are {ma}.{mi}"
                )),
            }
        };
        Model {
            n,
            channels,
            bw_per_channel,
            nvlink,
            ll128_off,
            cc_index,
        }
    }

    /// NCCL's predicted time (µs) for `bytes`; None when the protocol is off.
    pub fn predict(&self, algo: NcclAlgo, proto: NcclProto, bytes: u64) -> Option<f64> {
        if proto == NcclProto::LL128 && self.ll128_off.is_some() {
            return None;
        }
        let (a, p) = (algo_index(algo), proto_index(proto));
        let c = self.channels as f64;
        let bus = c * self.bw_per_channel;
        let nsteps = 2.0 * (self.n as f64 - 1.0);
        let kind = if self.nvlink { 0 } else { 1 };
        let (algbw, lat) = match algo {
            NcclAlgo::Ring => {
                let busbw = match proto {
                    NcclProto::LL => (bus / 4.0).min(LL_MAX_BW[self.cc_index]),
                    NcclProto::LL128 => (bus * 0.92).min(c * PER_CH_RING_LL128[self.cc_index]),
                    NcclProto::Simple => bus,
                };
                (
                    busbw * self.n as f64 / nsteps,
                    BASE_LAT[a][p] + nsteps * HW_LAT[kind][a][p],
                )
            }
            NcclAlgo::Tree => {
                let t = (bus * 0.92).min(c * PER_CH_TREE[self.cc_index]);
                let busbw = match proto {
                    NcclProto::LL => (t / 3.8).min(LL_MAX_BW[self.cc_index]),
                    NcclProto::LL128 => (t * 7.0 / 9.0).min(c * PER_CH_TREE_LL128[self.cc_index]),
                    NcclProto::Simple => t,
                };
                let log = (bytes >> 6).max(1).ilog2() as usize;
                let corr = TREE_CORRECTION[p].get(log).copied().unwrap_or(1.0);
                (
                    busbw * 0.5 * corr,
                    BASE_LAT[a][p] + nsteps * HW_LAT[kind][a][p],
                )
            }
        };
        Some(lat + bytes as f64 / (1e3 * algbw))
    }

    /// The algorithm and protocol NCCL picks for `bytes`: the lowest predicted time.
    pub fn choose(&self, bytes: u64) -> (NcclAlgo, NcclProto) {
        let mut best = (NcclAlgo::Ring, NcclProto::Simple, f64::INFINITY);
        for algo in [NcclAlgo::Tree, NcclAlgo::Ring] {
            for proto in [NcclProto::LL, NcclProto::LL128, NcclProto::Simple] {
                if let Some(t) = self.predict(algo, proto, bytes) {
                    if t < best.2 {
                        best = (algo, proto, t);
                    }
                }
            }
        }
        (best.0, best.1)
    }
}

/// NCCL's modelled bandwidth of one ring hop: NVLinks × per-link rate, or the slowest PCIe
/// link on the path (and the socket interconnect when the hop crosses sockets).
fn hop_bw(t: &Topology, net: &Net, a: usize, b: usize, cc_major: Option<u32>) -> f64 {
    if net.path(a, b) == PathClass::NV {
        let links = t.pair(a, b).map_or(1, |p| p.nvlinks.max(1));
        return links as f64 * nvlink_bw(cc_major);
    }
    let mut bw = nccl_pcie(&t.gpus[a].pcie).min(nccl_pcie(&t.gpus[b].pcie));
    let (pa, pb) = (t.ancestry(a), t.ancestry(b));
    for (mine, other) in [(&pa, &pb), (&pb, &pa)] {
        for node in mine.iter().skip(1).take_while(|n| !other.contains(n)) {
            if let crate::topology::Node::Switch(id) = node {
                if let Some(s) = t.switch(id) {
                    bw = bw.min(nccl_pcie(&s.uplink));
                }
            }
        }
    }
    if t.socket_of(a) != t.socket_of(b) {
        let x = t
            .sockets
            .iter()
            .find(|s| Some(s.id) == t.socket_of(a))
            .and_then(|s| s.interconnect.as_ref());
        if let Some(rate) = x.and_then(|l| l.max_flow_gbps.or(l.up_gbps)) {
            bw = bw.min(rate);
        }
    }
    bw
}

/// What a ring or chain costs on the link graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    n: usize,
    channels: u32,
    nvlink: bool,
    /// Slowest flow of the ring (all channels running), GB/s.
    ring_gbps: f64,
    /// Slowest ring hop, one-way µs.
    ring_hop_us: f64,
    chain_gbps: f64,
    chain_hop_us: f64,
}

/// Rate of the slowest of `pairs` (× channels) all writing at once, and the slowest hop.
fn lockstep(net: &Net, pairs: &[(usize, usize)], channels: u32) -> (f64, f64) {
    let routes: Vec<Route> = pairs.iter().map(|&(a, b)| net.route(a, b)).collect();
    let hop = routes.iter().map(|r| r.latency_us).fold(0.0, f64::max);
    let mut flows = Vec::new();
    let mut refs = Vec::new();
    for _ in 0..channels {
        for (&(src, dst), r) in pairs.iter().zip(&routes) {
            flows.push(Flow {
                src,
                dst,
                dir: Direction::Write,
            });
            refs.push(r);
        }
    }
    let rate = net
        .rates(&flows, &refs)
        .into_iter()
        .fold(f64::INFINITY, f64::min);
    (rate, hop)
}

impl Schedule {
    /// NCCL writes into the next rank's buffers (P2P write is its PCIe default), so every flow
    /// here is posted.
    pub fn new(net: &Net, ring: &[usize], model: &Model) -> Schedule {
        let n = ring.len();
        let ring_pairs: Vec<(usize, usize)> =
            (0..n).map(|i| (ring[i], ring[(i + 1) % n])).collect();
        let chain_pairs: Vec<(usize, usize)> = (0..n - 1)
            .flat_map(|i| [(ring[i + 1], ring[i]), (ring[i], ring[i + 1])])
            .collect();
        let (ring_gbps, ring_hop_us) = lockstep(net, &ring_pairs, model.channels);
        let (chain_gbps, chain_hop_us) = lockstep(net, &chain_pairs, model.channels);
        Schedule {
            n,
            channels: model.channels,
            nvlink: model.nvlink,
            ring_gbps,
            ring_hop_us,
            chain_gbps,
            chain_hop_us,
        }
    }

    /// Cost of one protocol step over a hop of `hop_us`: NCCL's per-hop figure (C4), which
    /// assumes a hop no slower than its LL figure; a slower wire adds its excess.
    fn step_us(&self, proto: NcclProto, hop_us: f64) -> f64 {
        let kind = if self.nvlink { 0 } else { 1 };
        let per_hop = HW_LAT[kind][1];
        per_hop[proto_index(proto)] + (hop_us - per_hop[0]).max(0.0)
    }

    /// Device time (µs) of one allreduce of `bytes`, launch excluded.
    pub fn time(&self, algo: NcclAlgo, proto: NcclProto, bytes: u64) -> f64 {
        let n = self.n as f64;
        let steps = 2.0 * (n - 1.0);
        let per_channel = bytes as f64 / self.channels as f64;
        let wire = 1.0 / efficiency(proto);
        let p = proto_index(proto);
        match algo {
            NcclAlgo::Ring => {
                let data = wire * (steps / n) * per_channel / (self.ring_gbps * 1e3);
                BASE_LAT[1][p] + steps * self.step_us(proto, self.ring_hop_us) + data
            }
            NcclAlgo::Tree => {
                // Each link carries the whole message up (reduce) and down (broadcast); the
                // first chunk crosses 2(N−1) hops before the pipeline is full.
                let chunks = (per_channel / TREE_CHUNK[p]).ceil().max(1.0);
                let data =
                    wire * per_channel / (self.chain_gbps * 1e3) * (chunks + steps - 1.0) / chunks;
                BASE_LAT[0][p] + steps * self.step_us(proto, self.chain_hop_us) + data
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::presets;

    fn model(preset: &str, gpus: &[usize]) -> (Model, Schedule) {
        let t = presets::get(preset).unwrap();
        let net = Net::build(&t);
        let ring = ring_order(&t, gpus);
        let m = Model::new(&t, &net, &ring);
        let s = Schedule::new(&net, &ring, &m);
        (m, s)
    }

    #[test]
    fn pcie_gen5_gets_two_channels_and_no_ll128() {
        // Gen5 x16 modelled at 48 GB/s; SM120 speeds pick 45, one channel, duplicated to two
        // of 22.5 (search.cc).
        let (m, _) = model("pcie-8x-2switch", &[0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(m.channels, 2);
        assert_eq!(m.bw_per_channel, 22.5);
        assert!(m.ll128_off.as_deref().unwrap().contains("PCIe"));
        assert_eq!(m.predict(NcclAlgo::Ring, NcclProto::LL128, 4096), None);
    }

    #[test]
    fn nvswitch_keeps_ll128() {
        let (m, _) = model("nvswitch-8x", &[0, 1, 2, 3, 4, 5, 6, 7]);
        assert!(m.nvlink && m.ll128_off.is_none());
        assert!(m.channels >= 8);
    }

    #[test]
    fn predicted_latency_follows_tuning_cc() {
        // Ring LL on 8 PCIe GPUs: 6.6 + 14 × 1.0 µs, plus 4096 B at busbw 45/4 × 8/14.
        let (m, _) = model("pcie-8x-2switch", &[0, 1, 2, 3, 4, 5, 6, 7]);
        let t = m.predict(NcclAlgo::Ring, NcclProto::LL, 4096).unwrap();
        let want = 20.6 + 4096.0 / (1e3 * 45.0 / 4.0 * 8.0 / 14.0);
        assert!((t - want).abs() < 1e-9, "{t} vs {want}");
        // Small messages: LL; large: Simple.
        assert_eq!(m.choose(4096), (NcclAlgo::Ring, NcclProto::LL));
        assert_eq!(m.choose(64 << 20), (NcclAlgo::Ring, NcclProto::Simple));
    }

    #[test]
    fn ring_order_keeps_switches_contiguous() {
        let t = presets::get("pcie-8x-2switch").unwrap();
        assert_eq!(ring_order(&t, &[4, 0, 5, 1]), vec![0, 1, 4, 5]);
    }

    #[test]
    fn ring_is_faster_than_chain_for_large_messages() {
        let (_, s) = model("pcie-4x-1switch", &[0, 1, 2, 3]);
        let big = 64 << 20;
        assert!(
            s.time(NcclAlgo::Ring, NcclProto::Simple, big)
                < s.time(NcclAlgo::Tree, NcclProto::Simple, big)
        );
        // LL moves twice the bytes of Simple's payload.
        assert!(
            s.time(NcclAlgo::Ring, NcclProto::LL, big)
                > s.time(NcclAlgo::Ring, NcclProto::Simple, big)
        );
    }
}

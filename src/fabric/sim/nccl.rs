//! NCCL on the simulated network, in two parts that deliberately differ:
//!
//! - [`Model`]: what NCCL *predicts* (NCCL 2.27.5, the version of calibration C1:
//!   src/graph/tuning.cc base + per-hop latency, channel bandwidth with per-protocol factors;
//!   src/graph/search.cc speeds and channel duplication; src/graph/topo.h host constants;
//!   src/graph/paths.cc P2P level). NCCL's own choice (`Backend::Nccl`) is the algorithm ×
//!   protocol this model ranks first, not necessarily the fastest.
//! - [`StepSchedule`]: what the run *costs* on the link graph: ring (2(N−1) lockstep steps over
//!   all channels) or tree (within one node a chain: reduce up, broadcast down, pipelined in
//!   chunks), each step paying the protocol's per-hop cost, bytes moving as kernel stores at
//!   the max-min rate of the ring's (or chain's) flows times the protocol's wire efficiency.
//!   A hop NCCL connects peer to peer is one store stream into the next GPU; a hop beyond
//!   `NCCL_P2P_LEVEL` goes through host memory (SHM transport): the sender stores into host
//!   memory, the receiver loads from it and polls its flags there.

use super::net::Net;
use crate::fabric::{NcclAlgo, NcclProto};
use crate::topology::{PathClass, Status, Topology};

/// Base latency, µs, [Tree, Ring] × [LL, LL128, Simple] (tuning.cc baseLat; calibration C4).
const BASE_LAT: [[f64; 3]; 2] = [[6.8, 14.0, 8.4], [6.6, 14.0, 8.4]];
/// Per-hop latency, µs, [NVLink, PCIe] × [Tree, Ring] × [LL, LL128, Simple] (tuning.cc hwLat).
const HW_LAT: [[[f64; 3]; 2]; 2] = [
    [[0.6, 1.25, 4.0], [0.6, 1.9, 3.4]],
    [[1.0, 1.9, 4.0], [1.0, 2.5, 5.7]],
];
/// NCCL's one-node caps by GPU generation [Volta, Ampere, Hopper, Blackwell] (tuning.cc).
const LL_MAX_BW: [f64; 4] = [39.0, 87.7, 141.0, 282.0];
const PER_CH_RING_LL128: [f64; 4] = [20.0, 20.0, 36.7, 73.4];
const PER_CH_TREE_LL128: [f64; 4] = [20.0, 20.0, 36.7, 73.4];
const PER_CH_TREE: [f64; 4] = [26.5, 24.0, 38.7, 77.4];
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
/// Ring-search speeds, GB/s per channel (search.cc, one node), by GPU generation.
const SPEEDS: [f64; 13] = [
    40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0,
];
const SPEEDS_SM90: [f64; 11] = [
    60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0,
];
const SPEEDS_SM100: [f64; 11] = [
    90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0,
];
/// The ring search keeps at most this many channels before duplicating them.
const MAX_SEARCH_CHANNELS: u32 = 16;
/// search.cc duplicates channels (halving their bandwidth) when one channel gets this much.
const DUPLICATE_AT_GBPS: f64 = 25.0;
/// search.cc: when no speed fits, "falling back to simple order" at this bandwidth, one
/// channel, path type SYS.
const FALLBACK_GBPS: f64 = 0.1;
/// connect.cc (ncclTopoPostset) runs twice the channels the search found.
const RUNTIME_CHANNELS_PER_GRAPH_CHANNEL: u32 = 2;
/// NCCL's modelled PCIe rate per lane at Gen5 (C4: Gen5 x16 = 48, Gen4 x16 = 24 GB/s).
const NCCL_PCIE_LANE_GEN5: f64 = 3.0;
/// topo.h inter-socket bandwidths: AMD_BW for every AMD CPU; for Intel the Sapphire Rapids
/// figure (SRP_QPI_BW), as a topology file names the vendor, not the model.
const AMD_BW: f64 = 16.0;
const INTEL_QPI_BW: f64 = 22.0;
/// topo.h INTEL_P2P_OVERHEAD: through an Intel root complex GPU traffic costs 6/5.
const INTEL_P2P_OVERHEAD: f64 = 1.2;

/// Payload share of the bytes a protocol puts on the wire: LL sends an 8-byte flag word with
/// every 8 bytes (half), LL128 one flag per 128 bytes (120/128), Simple only payload. What a
/// kernel store stream achieves beyond that is the kernel-traffic model's (net.rs).
const LL_EFFICIENCY: f64 = 0.5;
const LL128_EFFICIENCY: f64 = 120.0 / 128.0;
const SIMPLE_EFFICIENCY: f64 = 1.0;
/// Tree pipeline chunk of Simple (the 256 KB chunk NCCL's hwLat comment names), indexed by
/// protocol; LL and LL128 forward line by line.
const TREE_CHUNK: [f64; 3] = [f64::NAN, f64::NAN, 256.0 * 1024.0];

/// NCCL's own base latency (tuning.cc baseLat), µs: the per-operation part of a time.
pub fn base_latency(algo: NcclAlgo, proto: NcclProto) -> f64 {
    BASE_LAT[algo_index(algo)][proto_index(proto)]
}

/// NCCL's own per-hop latency over PCIe (tuning.cc hwLat), µs.
pub fn pcie_hop_latency(algo: NcclAlgo, proto: NcclProto) -> f64 {
    HW_LAT[1][algo_index(algo)][proto_index(proto)]
}

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

/// NCCL's path types in its order (topo.h), as far as a topology file can express them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Loc,
    Nvl,
    Nvb,
    Pix,
    Pxb,
    Phb,
    Sys,
}

impl Level {
    /// NCCL's class of a path: NUMA-local paths through host bridges are all PHB to NCCL (its
    /// CPU node is a NUMA domain).
    pub fn of(p: PathClass) -> Level {
        match p {
            PathClass::X => Level::Loc,
            PathClass::NV => Level::Nvl,
            PathClass::PIX => Level::Pix,
            PathClass::PXB => Level::Pxb,
            PathClass::PHB | PathClass::NODE => Level::Phb,
            PathClass::SYS => Level::Sys,
        }
    }

    /// `NCCL_P2P_LEVEL` as NCCL reads it (paths.cc ncclGetLevel): a path type name or the
    /// old numbering 0-5; anything else is ignored, as NCCL ignores it.
    pub fn parse(s: &str) -> Option<Level> {
        let s = s.trim();
        Some(match s {
            "LOC" => Level::Loc,
            "NVL" => Level::Nvl,
            "NVB" => Level::Nvb,
            "PIX" => Level::Pix,
            "PXB" => Level::Pxb,
            "PHB" => Level::Phb,
            "SYS" => Level::Sys,
            _ => match s.chars().next()?.to_digit(10)? {
                0 => Level::Loc,
                1 => Level::Pix,
                2 => Level::Pxb,
                3 => Level::Phb,
                _ => Level::Sys,
            },
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::Loc => "LOC",
            Level::Nvl => "NVL",
            Level::Nvb => "NVB",
            Level::Pix => "PIX",
            Level::Pxb => "PXB",
            Level::Phb => "PHB",
            Level::Sys => "SYS",
        }
    }
}

/// The CPU vendor NCCL sees (it sets its P2P level default and inter-socket bandwidth).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cpu {
    Amd,
    Intel,
    Unknown,
}

/// What NCCL knows about the host: CPU vendor and the P2P level the user set, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct Host {
    pub cpu: Cpu,
    pub user: Option<Level>,
}

impl Host {
    /// NCCL's view of `t`; `user` is `NCCL_P2P_LEVEL` (or LOC for `NCCL_P2P_DISABLE=1`).
    pub fn new(t: &Topology, user: Option<Level>) -> Host {
        let vendor = t
            .sockets
            .iter()
            .find_map(|s| s.contention.as_ref().and_then(|c| c.cpu_vendor.clone()))
            .unwrap_or_default()
            .to_ascii_lowercase();
        let cpu = if vendor.contains("amd") {
            Cpu::Amd
        } else if vendor.contains("intel") {
            Cpu::Intel
        } else {
            Cpu::Unknown
        };
        Host { cpu, user }
    }

    /// The P2P level in force for a communicator of `gpus` GPUs on this host (paths.cc
    /// ncclTopoCheckP2p): up to PXB, except SYS on AMD hosts where the communicator has at
    /// most two GPUs (NCCL's topology holds only its own ranks' GPUs); the user's overrides.
    pub fn p2p_level(&self, gpus: usize) -> Level {
        let default = if self.cpu == Cpu::Amd && gpus <= 2 {
            Level::Sys
        } else {
            Level::Pxb
        };
        self.user.unwrap_or(default)
    }

    /// The level from the environment, as NCCL reads it: `NCCL_P2P_DISABLE=1` wins, then
    /// `NCCL_P2P_LEVEL`.
    pub fn env_level() -> Option<Level> {
        if std::env::var("NCCL_P2P_DISABLE").is_ok_and(|v| v.trim() == "1") {
            return Some(Level::Loc);
        }
        std::env::var("NCCL_P2P_LEVEL")
            .ok()
            .and_then(|v| Level::parse(&v))
    }

    /// NCCL's inter-socket bandwidth (topo.h); None for a CPU it has no constant for.
    fn inter_cpu_bw(&self) -> Option<f64> {
        match self.cpu {
            Cpu::Amd => Some(AMD_BW),
            Cpu::Intel => Some(INTEL_QPI_BW),
            Cpu::Unknown => None,
        }
    }
}

/// How NCCL connects one ordered pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Peer to peer: stores into the receiver's buffer.
    P2p,
    /// Through host memory.
    Shm,
}

/// NCCL's transport from `a` to `b` in a communicator of `gpus` GPUs: P2P when their path is
/// within the P2P level and the driver reports P2P reads and writes (an unknown status counts
/// as available, as NVML reports it on a real box).
pub fn transport(
    t: &Topology,
    net: &Net,
    host: &Host,
    gpus: usize,
    a: usize,
    b: usize,
) -> Transport {
    let within = Level::of(net.path(a, b)) <= host.p2p_level(gpus);
    let allowed = t
        .pair(a, b)
        .is_none_or(|p| p.p2p.read != Status::No && p.p2p.write != Status::No);
    if within && allowed {
        Transport::P2p
    } else {
        Transport::Shm
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
    /// How each ring hop (ring[i] → ring[i+1]) is connected.
    pub transports: Vec<Transport>,
    /// The ring search found no speed its slowest hop carries and fell back to 0.1 GB/s.
    pub fallback: bool,
    cc_index: usize,
}

impl Model {
    pub fn new(t: &Topology, net: &Net, host: &Host, ring: &[usize]) -> Model {
        let n = ring.len();
        let hops: Vec<(usize, usize)> = (0..n).map(|i| (ring[i], ring[(i + 1) % n])).collect();
        let nvlink = hops.iter().all(|&(a, b)| net.path(a, b) == PathClass::NV);
        let transports: Vec<Transport> = hops
            .iter()
            .map(|&(a, b)| transport(t, net, host, n, a, b))
            .collect();
        let ccs: Vec<Option<(u32, u32)>> = ring
            .iter()
            .map(|&g| t.gpus[g].compute_capability.map(|c| (c.major, c.minor)))
            .collect();
        let cc_min = ccs.iter().flatten().min().copied();
        let major = cc_min.map(|c| c.0);
        let cc_index = match major {
            Some(m) if m >= 10 => 3,
            Some(9) => 2,
            Some(8) | None => 1,
            Some(_) => 0,
        };
        let max_bw = hops
            .iter()
            .zip(&transports)
            .map(|(&(a, b), &x)| hop_bw(t, net, host, a, b, x, major))
            .fold(f64::INFINITY, f64::min);
        let speeds: &[f64] = match major {
            Some(m) if m >= 10 => &SPEEDS_SM100,
            Some(9) => &SPEEDS_SM90,
            _ => &SPEEDS,
        };
        let (mut channels, mut bw_per_channel, fallback) =
            match speeds.iter().copied().find(|&s| s <= max_bw) {
                Some(speed) => (
                    ((max_bw / speed).floor() as u32).clamp(1, MAX_SEARCH_CHANNELS),
                    speed,
                    false,
                ),
                None => (1, FALLBACK_GBPS, true),
            };
        let many_slow = major.is_some_and(|m| m > 8) && bw_per_channel < 50.0 && channels > 4;
        if bw_per_channel >= DUPLICATE_AT_GBPS && !many_slow {
            channels = (channels * 2).min(MAX_SEARCH_CHANNELS);
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
                Some((ma, mi)) if ma < 7 => Some(format!(
                    "NCCL enables LL128 only from compute capability 7.0; these GPUs are {ma}.{mi}"
                )),
                _ => None,
            }
        };
        Model {
            n,
            channels,
            bw_per_channel,
            nvlink,
            ll128_off,
            transports,
            fallback,
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
        let ll_max = LL_MAX_BW[self.cc_index];
        let (algbw, lat) = match algo {
            NcclAlgo::Ring => {
                let busbw = match proto {
                    NcclProto::LL => (bus * 0.5).min(ll_max),
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
                    NcclProto::LL => (t / 3.8).min(ll_max),
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

/// NCCL's modelled bandwidth of one ring hop (search.cc followPath over paths.cc paths):
/// NVLinks × per-link rate, or the slowest PCIe link on the path; a hop across sockets also
/// crosses NCCL's inter-socket constant, and a hop through an Intel root complex costs 6/5.
/// An SHM hop goes through the receiver's CPU: the same links up and down.
fn hop_bw(
    t: &Topology,
    net: &Net,
    host: &Host,
    a: usize,
    b: usize,
    via: Transport,
    cc_major: Option<u32>,
) -> f64 {
    if net.path(a, b) == PathClass::NV && via == Transport::P2p {
        let links = t.pair(a, b).map_or(1, |p| p.nvlinks.max(1));
        return links as f64 * nvlink_bw(cc_major);
    }
    let mut bw = nccl_pcie(&t.gpus[a].pcie).min(nccl_pcie(&t.gpus[b].pcie));
    let (pa, pb) = (t.ancestry(a), t.ancestry(b));
    for (mine, other) in [(&pa, &pb), (&pb, &pa)] {
        for node in mine.iter().skip(1) {
            // A P2P hop climbs only to the lowest common switch; SHM climbs to the CPU.
            if via == Transport::P2p && other.contains(node) {
                break;
            }
            if let crate::topology::Node::Switch(id) = node {
                if let Some(s) = t.switch(id) {
                    bw = bw.min(nccl_pcie(&s.uplink));
                }
            }
        }
    }
    if t.socket_of(a) != t.socket_of(b) {
        if let Some(x) = host.inter_cpu_bw() {
            bw = bw.min(x);
        }
    }
    let through_cpu = via == Transport::Shm || Level::of(net.path(a, b)) >= Level::Phb;
    if through_cpu && host.cpu == Cpu::Intel {
        bw /= INTEL_P2P_OVERHEAD;
    }
    bw
}

pub mod call;
mod channels;
mod schedule;
pub use schedule::StepSchedule;

#[cfg(test)]
mod tests;

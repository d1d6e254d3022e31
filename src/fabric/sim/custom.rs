//! Our peer-to-peer kernels on the simulated network, priced phase by phase from the
//! schedule their table entry states (allreduce/backend.rs), so a new backend of known phases
//! needs no new model:
//!
//! - a barrier first (inputs ready, receive slots free) among the first phase's peers;
//! - each phase moves its part of the message with each of its peers, every GPU at once, on
//!   the link graph: the flows of that phase alone (all peers, the island, or the
//!   counterparts in other islands), so the crossing link, switch forwarding and root complex
//!   limits apply per phase. Reads wait a round trip for their first bytes (non-posted),
//!   writes one way and then a barrier (landed);
//! - a reducing phase sums: pulled data in registers as it arrives (only the local input is
//!   read), pushed data from the landed slots after the barrier;
//! - a phase that reads what the previous phase produced waits for a barrier first, and a
//!   schedule that ends reading ends with a barrier (peers done reading).
//!
//! Transfers are kernel loads and stores ([`Engine::Kernel`]) and cost their max-min finish
//! time. Two-stage moves size/N per flow but over the same N(N−1) concurrent flows as
//! one-stage, so it meets the same contention.

use std::collections::HashMap;

use super::kernel::FLAG_POLL_US;
use super::net::{Engine, Flow, Net, Route};
use crate::allreduce::{Directions, Islands, Part, Peers, Plane};
use crate::fabric::{Backend, Direction};

/// Fixed cost of the local reduce loop.
const REDUCE_FIXED_US: f64 = 0.2;
/// Local memory rate for the reduce, GB/s: conservative for both GDDR7 (RTX PRO 6000, ~1.8
/// TB/s) and HBM3 (H100, ~3.3 TB/s); it is a few percent of the total either way.
const LOCAL_MEM_GBPS: f64 = 1500.0;

/// One pattern of concurrent flows: every GPU with each of its peers of one kind.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pattern {
    /// µs per byte per flow when all the pattern's flows run at once, reading / writing.
    read_us_per_byte: f64,
    write_us_per_byte: f64,
    /// Slowest one-way latency between two GPUs of the pattern.
    max_latency_us: f64,
    /// Peers each GPU exchanges with.
    peers: usize,
}

/// Transfer costs of one group's patterns, computed once.
#[derive(Debug, Clone, PartialEq)]
pub struct Custom {
    n: usize,
    island: usize,
    patterns: HashMap<PeersKey, Pattern>,
    /// The kernel's prologue, µs (calibration: C2's 1 KB one-shot).
    prologue_us: f64,
}

/// `Peers` as a map key.
type PeersKey = u8;

fn key(p: Peers) -> PeersKey {
    match p {
        Peers::All => 0,
        Peers::Island => 1,
        Peers::Counterparts => 2,
    }
}

/// Every ordered pair of `gpus`, as flows in `dir`.
pub fn all_to_all(gpus: &[usize], dir: Direction) -> Vec<Flow> {
    let mut out = Vec::with_capacity(gpus.len() * gpus.len());
    for &src in gpus {
        for &dst in gpus.iter().filter(|&&d| d != src) {
            out.push(Flow {
                src,
                dst,
                dir,
                engine: Engine::Kernel,
            });
        }
    }
    out
}

/// The ordered pairs of a pattern: all pairs, pairs inside an island, or pairs at the same
/// place of different islands.
fn pairs(gpus: &[usize], islands: Option<&Islands>, peers: Peers) -> Vec<(usize, usize)> {
    let sets: Vec<Vec<usize>> = match (peers, islands) {
        (Peers::All, _) | (_, None) => vec![gpus.to_vec()],
        (Peers::Island, Some(i)) => i.gpus.clone(),
        (Peers::Counterparts, Some(i)) => (0..i.size())
            .map(|j| {
                i.gpus
                    .iter()
                    .filter_map(|isl| isl.get(j).copied())
                    .collect()
            })
            .collect(),
    };
    sets.iter()
        .flat_map(|s| {
            s.iter()
                .flat_map(move |&a| s.iter().filter(move |&&b| b != a).map(move |&b| (a, b)))
        })
        .collect()
}

/// Time for the slowest of `flows` to move `probe` bytes each, µs, divided by `probe`.
fn us_per_byte(net: &Net, flows: &[Flow], routes: &[&Route]) -> f64 {
    const PROBE: f64 = 1e6;
    let sizes = vec![PROBE; flows.len()];
    net.finish_times(flows, routes, &sizes)
        .into_iter()
        .fold(0.0, f64::max)
        / PROBE
}

fn pattern(net: &Net, pairs: &[(usize, usize)], peers: usize) -> Pattern {
    let flows = |dir| -> Vec<Flow> {
        pairs
            .iter()
            .map(|&(src, dst)| Flow {
                src,
                dst,
                dir,
                engine: Engine::Kernel,
            })
            .collect()
    };
    let routes: Vec<Route> = pairs.iter().map(|&(a, b)| net.route(a, b)).collect();
    let refs: Vec<&Route> = routes.iter().collect();
    Pattern {
        read_us_per_byte: us_per_byte(net, &flows(Direction::Read), &refs),
        write_us_per_byte: us_per_byte(net, &flows(Direction::Write), &refs),
        max_latency_us: routes.iter().map(|r| r.latency_us).fold(0.0, f64::max),
        peers,
    }
}

impl Custom {
    /// The patterns of `gpus`: all pairs, and with `islands` the island and counterpart pairs.
    pub fn new(net: &Net, gpus: &[usize], islands: Option<&Islands>) -> Custom {
        let n = gpus.len();
        let island = islands.map_or(n, Islands::size);
        let mut patterns = HashMap::new();
        patterns.insert(
            key(Peers::All),
            pattern(net, &pairs(gpus, None, Peers::All), n - 1),
        );
        if let Some(i) = islands {
            for (p, peers) in [
                (Peers::Island, island - 1),
                (Peers::Counterparts, i.count() - 1),
            ] {
                patterns.insert(key(p), pattern(net, &pairs(gpus, islands, p), peers));
            }
        }
        Custom {
            n,
            island,
            patterns,
            prologue_us: net.calibration().kernel_prologue_us,
        }
    }

    fn pattern(&self, p: Peers) -> &Pattern {
        self.patterns
            .get(&key(p))
            .unwrap_or(&self.patterns[&key(Peers::All)])
    }

    /// One remote flag write per peer, then a poll: about one path latency.
    fn barrier(&self, p: Peers) -> f64 {
        self.pattern(p).max_latency_us + FLAG_POLL_US
    }

    /// One phase moving `bytes` per flow in `dir`.
    fn transfer(&self, p: Peers, bytes: f64, dir: Direction) -> f64 {
        let pat = self.pattern(p);
        match dir {
            Direction::Read => 2.0 * pat.max_latency_us + bytes * pat.read_us_per_byte,
            Direction::Write => pat.max_latency_us + bytes * pat.write_us_per_byte,
        }
    }

    /// Reading `inputs` buffers of `bytes` from local memory and writing one.
    fn reduce(inputs: f64, bytes: f64) -> f64 {
        REDUCE_FIXED_US + (inputs + 1.0) * bytes / (LOCAL_MEM_GBPS * 1e3)
    }

    fn part(&self, part: Part, bytes: f64) -> f64 {
        match part {
            Part::Message => bytes,
            Part::Shard => (bytes / self.n as f64).ceil(),
            Part::IslandShard => (bytes / self.island as f64).ceil(),
        }
    }

    /// Device time (µs) of one allreduce of `bytes`, launch excluded; `directions` orient
    /// the phases of a per-phase backend (reads where none are given).
    pub fn time(&self, backend: Backend, bytes: u64, directions: Option<&Directions>) -> f64 {
        let phases = backend.phases();
        let dir = |peers| match backend.spec().plane {
            Plane::Pull | Plane::Nccl => Direction::Read,
            Plane::Push => Direction::Write,
            Plane::PerPhase => directions.map_or(Direction::Read, |d| d.of(peers)),
        };
        let Some(first) = phases.first() else {
            return f64::NAN;
        };
        let mut t = self.prologue_us + self.barrier(first.peers);
        for (i, ph) in phases.iter().enumerate() {
            let d = dir(ph.peers);
            let part = self.part(ph.part, bytes as f64);
            if i > 0 && d == Direction::Read {
                // What this phase reads was produced by its peers in the previous one.
                t += self.barrier(ph.peers);
            }
            t += self.transfer(ph.peers, part, d);
            if d == Direction::Write {
                t += self.barrier(ph.peers);
            }
            if ph.reduces {
                t += match d {
                    Direction::Read => Self::reduce(1.0, part),
                    Direction::Write => {
                        Self::reduce((self.pattern(ph.peers).peers + 1) as f64, part)
                    }
                };
            }
        }
        if phases.last().map(|p| dir(p.peers)) == Some(Direction::Read) {
            // Peers done reading this GPU's buffers: every peer of every phase.
            t += phases
                .iter()
                .map(|p| self.barrier(p.peers))
                .fold(0.0, f64::max);
        }
        t
    }

    /// Bytes each GPU sends or receives through a phase's pattern in one call: what the
    /// crossing carries (tests check schedules against arithmetic).
    pub fn phase_bytes(&self, backend: Backend, bytes: u64) -> Vec<(Peers, f64)> {
        backend
            .phases()
            .iter()
            .map(|p| {
                let per_flow = self.part(p.part, bytes as f64);
                (p.peers, per_flow * self.pattern(p.peers).peers as f64)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::presets;

    fn custom(preset: &str, gpus: &[usize]) -> Custom {
        let t = presets::get(preset).unwrap();
        Custom::new(&Net::build(&t), gpus, None)
    }

    #[test]
    fn four_under_one_switch_load_at_c5_concurrent_rate() {
        // Each GPU loads from 3 peers at once, as kernel loads: C5's 20.6 GB/s per GPU (a
        // transaction limit, the same GB/s on the preset's 56.32 GB/s port), so 20.6 / 3.
        let c = custom("pcie-4x-1switch", &[0, 1, 2, 3]);
        let rate = 1.0 / (c.pattern(Peers::All).read_us_per_byte * 1e3);
        let want = 20.60 / 3.0;
        assert!((rate - want).abs() < 1e-6, "{rate} vs {want}");
    }

    #[test]
    fn two_stage_phases_meet_the_same_contention_as_one_stage() {
        // The data part of a two-stage phase is exactly 1/N of a one-stage phase: the same
        // N(N−1) flows at the same per-byte cost.
        let c = custom("pcie-8x-2switch", &[0, 1, 2, 3, 4, 5, 6, 7]);
        let (b, n) = (8.0 * 1024.0 * 1024.0, 8.0);
        let lat = c.pattern(Peers::All).max_latency_us;
        let one = c.transfer(Peers::All, b, Direction::Write) - lat;
        let two = c.transfer(Peers::All, b / n, Direction::Write) - lat;
        assert!((one / two - n).abs() < 1e-9, "{one} vs {two}");
    }

    #[test]
    fn two_stage_moves_less_per_flow_than_one_stage() {
        let c = custom("pcie-8x-2switch", &[0, 1, 2, 3, 4, 5, 6, 7]);
        let big = 8 << 20;
        assert!(
            c.time(Backend::TwoStagePull, big, None)
                < c.time(Backend::OneStagePull, big, None) / 2.0
        );
        // Tiny messages: the extra phase and barrier make two-stage slower.
        assert!(
            c.time(Backend::TwoStagePull, 1024, None) > c.time(Backend::OneStagePull, 1024, None)
        );
    }

    /// Bytes each resource of the net carries in one call of `backend` on `gpus` in `islands`:
    /// every phase's flows, each moving its part, summed over the resources of its route.
    fn link_bytes(
        net: &Net,
        gpus: &[usize],
        islands: &Islands,
        b: Backend,
        bytes: u64,
    ) -> Vec<f64> {
        let c = Custom::new(net, gpus, Some(islands));
        let mut load: Vec<f64> = Vec::new();
        for p in b.phases() {
            let part = c.part(p.part, bytes as f64);
            for (src, dst) in pairs(gpus, Some(islands), p.peers) {
                for &r in &net.route(src, dst).resources {
                    if load.len() <= r {
                        load.resize(r + 1, 0.0);
                    }
                    load[r] += part;
                }
            }
        }
        load
    }

    #[test]
    fn the_crossing_carries_a_shard_per_gpu_not_every_pair() {
        // Two switches of four under one root complex (pcie-8x-2switch): the resources only
        // flows between the islands use are the switches' uplinks. Island two-shot sends each
        // GPU's island shard (S/4) to its one counterpart: S across in each direction, where a
        // ring sends 2(N-1)/N·S = 1.75·S through every link and the flat kernels more.
        let t = presets::get("pcie-8x-2switch").unwrap();
        let net = Net::build(&t);
        let gpus: Vec<usize> = (0..8).collect();
        let islands = crate::plan::islands(&t, &gpus).unwrap();
        let inside: std::collections::BTreeSet<usize> = pairs(&gpus, Some(&islands), Peers::Island)
            .into_iter()
            .flat_map(|(a, b)| net.route(a, b).resources)
            .collect();
        let s = (8u64 << 20) as f64;
        // The links from GPU 0 to GPU 4 that no flow inside an island uses, one direction
        // each (the root complex, which carries both, is counted on its own below).
        let across: Vec<usize> = net
            .route(0, 4)
            .resources
            .into_iter()
            .filter(|r| !inside.contains(r))
            .collect();
        assert!(!across.is_empty());
        let crossing = |b: Backend| {
            let load = link_bytes(&net, &gpus, &islands, b, 8 << 20);
            across
                .iter()
                .map(|&r| load[r] / s)
                .fold(f64::INFINITY, f64::min)
        };
        assert_eq!(crossing(Backend::IslandTwoShot), 1.0);
        assert_eq!(crossing(Backend::IslandOneShot), 4.0);
        // Flat: every GPU with every GPU of the other island.
        assert_eq!(crossing(Backend::OneStagePull), 16.0);
        assert_eq!(crossing(Backend::TwoStagePull), 4.0);
    }

    #[test]
    fn island_phases_price_their_own_flows() {
        // The counterpart phase has one flow per GPU across the uplink; the island phase
        // three per GPU inside its switch: each is solved alone, so neither sees the other's
        // contention, and the one-shot's across phase moves the whole message.
        let t = presets::get("pcie-8x-2switch").unwrap();
        let net = Net::build(&t);
        let gpus: Vec<usize> = (0..8).collect();
        let islands = crate::plan::islands(&t, &gpus).unwrap();
        let c = Custom::new(&net, &gpus, Some(&islands));
        assert_eq!(c.pattern(Peers::Island).peers, 3);
        assert_eq!(c.pattern(Peers::Counterparts).peers, 1);
        let per_gpu = c.phase_bytes(Backend::IslandTwoShot, 8 << 20);
        let quarter = (2u64 << 20) as f64;
        assert_eq!(
            per_gpu,
            vec![
                (Peers::Island, 3.0 * quarter),
                (Peers::Counterparts, quarter),
                (Peers::Island, 3.0 * quarter)
            ]
        );
        // At large sizes the island schedule beats the flat two-stage kernel, which drives
        // 28 flows through both uplinks at once; at 1 KiB its extra phase costs latency.
        let read = Directions {
            inside: Direction::Read,
            across: Direction::Read,
            because: String::new(),
        };
        let big = 64 << 20;
        assert!(
            c.time(Backend::IslandTwoShot, big, Some(&read))
                < c.time(Backend::TwoStagePull, big, None)
        );
        assert!(
            c.time(Backend::IslandTwoShot, 1024, Some(&read))
                > c.time(Backend::OneStagePull, 1024, None)
        );
    }

    #[test]
    fn push_pays_the_local_reduce_pull_does_not() {
        // On one switch with equal read/write rates push would win by its one-way latency;
        // the reduce of N landed buffers costs it more at large sizes.
        let c = custom("nvswitch-8x", &[0, 1, 2, 3, 4, 5, 6, 7]);
        assert!(
            c.time(Backend::OneStagePush, 1024, None) < c.time(Backend::OneStagePull, 1024, None)
        );
        assert!(
            c.time(Backend::OneStagePush, 64 << 20, None)
                > c.time(Backend::OneStagePull, 64 << 20, None)
        );
    }
}

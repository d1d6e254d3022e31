//! Our peer-to-peer kernels on the simulated network, priced phase by phase from the
//! schedule their table entry states (allreduce/backend.rs), so a new backend of known phases
//! needs no new model. A call is a list of [`Step`]s, in the form the real kernel runs at that
//! size (the table's `Ll::max_bytes`, the rule the CUDA fabric reads too), each priced on the
//! same flow network:
//!
//! Bandwidth form:
//! - a barrier first (inputs ready, receive slots free) among the first phase's peers;
//! - each phase moves its part of the message with each of its peers, every GPU at once, on
//!   the link graph: the flows of that phase alone (all peers, the island, or the
//!   counterparts in other islands), so the crossing link, switch forwarding and root complex
//!   limits apply per phase. Reads wait a round trip for their first bytes (non-posted),
//!   writes one way and then a barrier (landed);
//! - a reducing phase sums: pulled data in registers as it arrives (only the local input is
//!   read), pushed data from the landed slots after the barrier;
//! - a phase that reads what the previous phase produced waits for a barrier first, and a
//!   schedule that ends reading ends with a barrier (peers done reading);
//! - staging: where peers read this GPU's input from its shared copy, the kernel first copies
//!   the input there; where peers write this GPU's result into its shared output, the kernel
//!   copies it to the caller's output after the last barrier. Each is a local copy of the
//!   message (its bytes read and written in the GPU's own memory).
//!
//! LL form (small messages): each 8-byte data word travels beside its flag in a 16-byte line,
//! so a phase carries twice its data on the same flows, needs no barrier, and costs one flag
//! round trip: pushed, the lines cross once and the receiver polls its own memory; pulled, the
//! receiver's poll is a remote read round trip. Peers read only lines, so nothing is staged.
//!
//! Transfers are kernel loads and stores ([`Engine::Kernel`]) and cost their max-min finish
//! time. Two-stage moves size/N per flow but over the same N(N−1) concurrent flows as
//! one-stage, so it meets the same contention. LL lines are 16-byte accesses like the
//! bandwidth kernels' vectors, so they move at the pattern's same per-byte rate.

use std::collections::HashMap;

use super::kernel::FLAG_POLL_US;
use super::net::{Engine, Flow, Net, Route};
use crate::allreduce::{Directions, Islands, Ll, Part, Peers, Phase, Plane};
use crate::fabric::{Backend, Direction};

/// Fixed cost of a local pass over a buffer (the reduce loop, a staging copy).
const REDUCE_FIXED_US: f64 = 0.2;
/// Local memory rate for the reduce and the staging copies, GB/s: conservative for both GDDR7
/// (RTX PRO 6000, ~1.8 TB/s) and HBM3 (H100, ~3.3 TB/s); it is a few percent of the total
/// either way.
const LOCAL_MEM_GBPS: f64 = 1500.0;
/// Bytes on the wire per data byte in an LL line: 8 data bytes and two 4-byte flags
/// (kernels/common.cuh, `ll_store`).
const LL_WIRE_PER_DATA: f64 = 2.0;

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

/// One thing a call of a kernel does, in order: a call costs the sum of its steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// A flag written to each peer of the pattern, then a poll for theirs.
    Barrier(Peers),
    /// Every GPU moves `bytes` (on the wire) with each of its peers of the pattern at once, in
    /// `dir`; `lines`: as LL lines, whose flag rides with the data.
    Transfer {
        peers: Peers,
        bytes: f64,
        dir: Direction,
        lines: bool,
    },
    /// `bytes` read plus written in the GPU's own memory, in a pass of its own (`pass`: the
    /// reduce loop, a staging copy) or folded into a phase's (an LL thread's one word).
    Local { bytes: f64, pass: bool },
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

    /// What a step costs, µs. An LL transfer is a flag round trip with no barrier: pushed
    /// lines cross once and the receiver sees their flags as it sees a barrier's (a poll of
    /// its own memory); pulled, the receiver's poll is the read round trip itself.
    fn cost(&self, step: Step) -> f64 {
        match step {
            Step::Barrier(p) => self.barrier(p),
            Step::Transfer {
                peers,
                bytes,
                dir,
                lines,
            } => {
                let poll = if lines && dir == Direction::Write {
                    FLAG_POLL_US
                } else {
                    0.0
                };
                self.transfer(peers, bytes, dir) + poll
            }
            Step::Local { bytes, pass } => {
                let fixed = if pass { REDUCE_FIXED_US } else { 0.0 };
                fixed + bytes / (LOCAL_MEM_GBPS * 1e3)
            }
        }
    }

    /// Reading `inputs` buffers of `bytes` from local memory and writing one, in a pass; a
    /// staging copy is the reduce of one buffer.
    fn reduce(inputs: f64, bytes: f64) -> Step {
        Step::Local {
            bytes: (inputs + 1.0) * bytes,
            pass: true,
        }
    }

    fn part(&self, part: Part, bytes: f64) -> f64 {
        match part {
            Part::Message => bytes,
            Part::Shard => (bytes / self.n as f64).ceil(),
            Part::IslandShard => (bytes / self.island as f64).ceil(),
        }
    }

    /// The steps of one allreduce of `bytes` per GPU, in the form the real kernel runs at that
    /// size; `directions` orient the phases of a per-phase backend (reads where none are
    /// given). Empty for NCCL.
    pub fn steps(
        &self,
        backend: Backend,
        bytes: u64,
        directions: Option<&Directions>,
    ) -> Vec<Step> {
        self.steps_as(backend, backend.ll_at(bytes), bytes as f64, directions)
    }

    /// The steps of `backend`'s LL form `ll`, or its bandwidth form (None), for `bytes`.
    fn steps_as(
        &self,
        backend: Backend,
        ll: Option<Ll>,
        bytes: f64,
        directions: Option<&Directions>,
    ) -> Vec<Step> {
        let phases = backend.phases();
        let Some(first) = phases.first() else {
            return Vec::new();
        };
        let dir = |peers| match backend.spec().plane {
            Plane::Pull | Plane::Nccl => Direction::Read,
            Plane::Push => Direction::Write,
            Plane::PerPhase => directions.map_or(Direction::Read, |d| d.of(peers)),
        };
        if ll.is_some() {
            // Every phase in lines: no staging, no barrier.
            return phases
                .iter()
                .flat_map(|ph| self.ll_phase(ph, dir(ph.peers), bytes))
                .collect();
        }
        let buffers = backend.spec().buffers;
        let mut s = Vec::new();
        // Peers read this GPU's input from its shared copy, which the kernel fills first.
        let staged_in = buffers.is_some_and(|b| b.input) && dir(first.peers) == Direction::Read;
        if staged_in {
            s.push(Self::reduce(1.0, bytes));
        }
        s.push(Step::Barrier(first.peers));
        for (i, ph) in phases.iter().enumerate() {
            let d = dir(ph.peers);
            let part = self.part(ph.part, bytes);
            if i > 0 && d == Direction::Read {
                // What this phase reads was produced by its peers in the previous one.
                s.push(Step::Barrier(ph.peers));
            }
            s.push(Step::Transfer {
                peers: ph.peers,
                bytes: part,
                dir: d,
                lines: false,
            });
            if d == Direction::Write {
                s.push(Step::Barrier(ph.peers));
            }
            if ph.reduces {
                let landed = match d {
                    Direction::Read => 1.0,
                    Direction::Write => (self.pattern(ph.peers).peers + 1) as f64,
                };
                s.push(Self::reduce(landed, part));
            }
        }
        if phases.last().map(|p| dir(p.peers)) == Some(Direction::Read) {
            // Peers done reading this GPU's buffers: every peer of every phase.
            let slowest = phases
                .iter()
                .map(|p| p.peers)
                .max_by(|a, b| self.barrier(*a).total_cmp(&self.barrier(*b)))
                .unwrap_or(first.peers);
            s.push(Step::Barrier(slowest));
        }
        // Peers wrote this GPU's result into its shared output: copied out after the last
        // barrier.
        let last = phases[phases.len() - 1];
        if buffers.is_some_and(|b| b.output) && !last.reduces && dir(last.peers) == Direction::Write
        {
            s.push(Self::reduce(1.0, bytes));
        }
        s
    }

    /// One LL phase: its lines over the pattern's flows, then what it touches in the GPU's own
    /// memory, folded into the phase (each thread holds one word): pushed, the receiver reads
    /// and zeroes each peer's landed line; pulled, the sender writes its own, one per peer where
    /// each gets another shard (a reduce-scatter), one for all where all get the same; and the
    /// data word it loads or stores.
    fn ll_phase(&self, ph: &Phase, dir: Direction, bytes: f64) -> [Step; 2] {
        let part = self.part(ph.part, bytes);
        let line = LL_WIRE_PER_DATA * part;
        let peers = self.pattern(ph.peers).peers as f64;
        let landed = match dir {
            Direction::Write => 2.0 * peers * line,
            Direction::Read if ph.reduces && ph.part != Part::Message => peers * line,
            Direction::Read => line,
        };
        [
            Step::Transfer {
                peers: ph.peers,
                bytes: line,
                dir,
                lines: true,
            },
            Step::Local {
                bytes: landed + part,
                pass: false,
            },
        ]
    }

    /// Device time (µs) of one allreduce of `bytes`, launch excluded, in the form the real
    /// kernel runs at that size; `directions` as [`Custom::steps`].
    pub fn time(&self, backend: Backend, bytes: u64, directions: Option<&Directions>) -> f64 {
        self.price(&self.steps(backend, bytes, directions))
    }

    /// What the form that runs `bytes` costs with no bytes: the fixed part of
    /// [`Custom::time`].
    pub fn fixed(&self, backend: Backend, bytes: u64, directions: Option<&Directions>) -> f64 {
        self.price(&self.steps_as(backend, backend.ll_at(bytes), 0.0, directions))
    }

    fn price(&self, steps: &[Step]) -> f64 {
        if steps.is_empty() {
            return f64::NAN;
        }
        self.prologue_us + steps.iter().map(|&s| self.cost(s)).sum::<f64>()
    }

    /// Bytes each GPU sends or receives through each transfer's pattern in one call, on the
    /// wire: what the crossing carries (tests check schedules against arithmetic).
    pub fn phase_bytes(
        &self,
        backend: Backend,
        bytes: u64,
        directions: Option<&Directions>,
    ) -> Vec<(Peers, f64)> {
        self.steps(backend, bytes, directions)
            .into_iter()
            .filter_map(|s| match s {
                Step::Transfer { peers, bytes, .. } => {
                    Some((peers, bytes * self.pattern(peers).peers as f64))
                }
                _ => None,
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
        // Tiny messages: the extra phase and barrier make two-stage's bandwidth form slower
        // (its LL form, which runs there, has no barrier between its phases).
        let bw = |b| c.price(&c.steps_as(b, None, 1024.0, None));
        assert!(bw(Backend::TwoStagePull) > bw(Backend::OneStagePull));
    }

    /// The 8 GPUs of pcie-8x-2switch in the two switch islands the plan derives.
    fn two_switches() -> (Net, Vec<usize>, Islands) {
        let t = presets::get("pcie-8x-2switch").unwrap();
        let gpus: Vec<usize> = (0..8).collect();
        let islands = crate::plan::islands(&t, &gpus).unwrap();
        (Net::build(&t), gpus, islands)
    }

    /// The links from GPU 0 to GPU 4 (the other switch) that no flow inside an island uses,
    /// one direction each: what only the flows between the islands load (the root complex,
    /// which carries both directions, is left to the tests that count it).
    fn crossing_links(net: &Net, gpus: &[usize], islands: &Islands) -> Vec<usize> {
        let inside: std::collections::BTreeSet<usize> = pairs(gpus, Some(islands), Peers::Island)
            .into_iter()
            .flat_map(|(a, b)| net.route(a, b).resources)
            .collect();
        let across: Vec<usize> = net
            .route(0, 4)
            .resources
            .into_iter()
            .filter(|r| !inside.contains(r))
            .collect();
        assert!(!across.is_empty());
        across
    }

    /// The least any crossing link carries per byte of a `bytes` message in one call of `b`.
    fn crossing(net: &Net, gpus: &[usize], islands: &Islands, b: Backend, bytes: u64) -> f64 {
        let load = link_bytes(net, gpus, islands, b, bytes);
        crossing_links(net, gpus, islands)
            .iter()
            .map(|&r| load[r] / bytes as f64)
            .fold(f64::INFINITY, f64::min)
    }

    /// Bytes each resource of the net carries in one call of `b` on `gpus` in `islands`, as
    /// the model prices it.
    fn link_bytes(
        net: &Net,
        gpus: &[usize],
        islands: &Islands,
        b: Backend,
        bytes: u64,
    ) -> Vec<f64> {
        let c = Custom::new(net, gpus, Some(islands));
        steps_load(net, gpus, islands, &c.steps(b, bytes, None))
    }

    /// Bytes each resource carries for `steps`: every transfer step's flows, each moving its
    /// bytes on the wire, summed over the resources of its route.
    fn steps_load(net: &Net, gpus: &[usize], islands: &Islands, steps: &[Step]) -> Vec<f64> {
        let mut load: Vec<f64> = Vec::new();
        for &step in steps {
            let Step::Transfer { peers, bytes, .. } = step else {
                continue;
            };
            for (src, dst) in pairs(gpus, Some(islands), peers) {
                for &r in &net.route(src, dst).resources {
                    if load.len() <= r {
                        load.resize(r + 1, 0.0);
                    }
                    load[r] += bytes;
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
        let (net, gpus, islands) = two_switches();
        let crossing = |b: Backend| crossing(&net, &gpus, &islands, b, 8 << 20);
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
        let (net, gpus, islands) = two_switches();
        let c = Custom::new(&net, &gpus, Some(&islands));
        assert_eq!(c.pattern(Peers::Island).peers, 3);
        assert_eq!(c.pattern(Peers::Counterparts).peers, 1);
        let per_gpu = c.phase_bytes(Backend::IslandTwoShot, 8 << 20, None);
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
        // 28 flows through both uplinks at once; at 1 KiB its bandwidth form's extra phase
        // costs latency.
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
        let bw = |b, d| c.price(&c.steps_as(b, None, 1024.0, d));
        assert!(bw(Backend::IslandTwoShot, Some(&read)) > bw(Backend::OneStagePull, None));
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

    /// Every custom backend with the LL layout of its kernel, from the table.
    fn with_ll() -> Vec<(Backend, Option<Ll>)> {
        crate::allreduce::TABLE
            .iter()
            .filter_map(|s| Some((s.backend, s.kernel?.ll)))
            .collect()
    }

    fn lined(steps: &[Step]) -> bool {
        steps
            .iter()
            .any(|s| matches!(s, Step::Transfer { lines: true, .. }))
    }

    #[test]
    fn the_ll_form_runs_exactly_up_to_the_tables_limit() {
        let (net, gpus, islands) = two_switches();
        let c = Custom::new(&net, &gpus, Some(&islands));
        let mut seen = 0;
        for (b, ll) in with_ll() {
            let Some(ll) = ll else {
                // No LL kernel (one_stage_pull): the bandwidth form at every size.
                for bytes in [8, 1 << 10, 32 << 10, 64 << 10] {
                    assert!(!lined(&c.steps(b, bytes, None)), "{b} at {bytes}");
                }
                continue;
            };
            seen += 1;
            let max = ll.max_bytes();
            for bytes in [8, 1 << 10, max] {
                let steps = c.steps(b, bytes, None);
                assert!(lined(&steps), "{b} at {bytes}: not LL");
                // Lines carry their flags: every phase in lines, no barrier, nothing staged.
                assert!(
                    steps.iter().all(|s| match s {
                        Step::Transfer { lines, .. } => *lines,
                        Step::Local { pass, .. } => !pass,
                        Step::Barrier(_) => false,
                    }),
                    "{b} at {bytes}: {steps:?}"
                );
                assert_eq!(
                    steps.len(),
                    2 * b.phases().len(),
                    "{b} at {bytes}: a transfer and its words per phase"
                );
            }
            assert!(!lined(&c.steps(b, max + 8, None)), "{b} past {max}");
        }
        assert_eq!(seen, 5, "every LL layout of the table");
    }

    #[test]
    fn an_ll_phase_carries_twice_its_data_on_every_link() {
        // Two switches of four (pcie-8x-2switch), 8 KiB per GPU, within every LL limit: each
        // resource carries what the bandwidth form's flows carry, twice over where the phase
        // travels in lines (8 data bytes and 8 of flags per line).
        let (net, gpus, islands) = two_switches();
        let s = 8u64 << 10;
        let crossing = |b: Backend| crossing(&net, &gpus, &islands, b, s);
        // The bandwidth forms' crossings (the_crossing_carries_a_shard_per_gpu_not_every_pair)
        // doubled; one-stage pull has no LL form.
        assert_eq!(crossing(Backend::IslandTwoShot), 2.0);
        assert_eq!(crossing(Backend::IslandOneShot), 8.0);
        assert_eq!(crossing(Backend::OneStagePush), 32.0);
        assert_eq!(crossing(Backend::TwoStagePush), 8.0);
        assert_eq!(crossing(Backend::TwoStagePull), 8.0);
        assert_eq!(crossing(Backend::OneStagePull), 16.0);
        // Every link: an LL form carries exactly twice its bandwidth form's bytes.
        let c = Custom::new(&net, &gpus, Some(&islands));
        for (b, ll) in with_ll() {
            let Some(ll) = ll else {
                continue;
            };
            let load = |steps: Vec<Step>| steps_load(&net, &gpus, &islands, &steps);
            let lines = load(c.steps_as(b, Some(ll), s as f64, None));
            let data = load(c.steps_as(b, None, s as f64, None));
            assert!(data.iter().any(|&x| x > 0.0));
            for (r, (l, d)) in lines.iter().zip(&data).enumerate() {
                assert_eq!(*l, 2.0 * d, "{b}: resource {r}");
            }
        }
    }

    #[test]
    fn kernels_stage_where_peers_read_the_input_or_write_the_output() {
        // A local copy of the message (read and written: 2·S) before the first barrier where
        // peers read the shared input, after the last where they wrote the shared output;
        // none in the LL forms, whose peers read and write only lines.
        let (net, gpus, islands) = two_switches();
        let c = Custom::new(&net, &gpus, Some(&islands));
        let (big, small) = (1u64 << 20, 4u64 << 10);
        let copy = |bytes: u64| Step::Local {
            bytes: 2.0 * bytes as f64,
            pass: true,
        };
        let first = |b, bytes, d| c.steps(b, bytes, d).first().copied();
        let last = |b, bytes, d| c.steps(b, bytes, d).last().copied();
        let dirs = |inside| Directions {
            inside,
            across: Direction::Read,
            because: String::new(),
        };
        let (pull, push) = (dirs(Direction::Read), dirs(Direction::Write));
        for b in [Backend::OneStagePull, Backend::TwoStagePull] {
            assert_eq!(first(b, big, None), Some(copy(big)), "{b}");
        }
        // One-stage pull has no LL form; two-stage pull's pulls lines.
        assert_eq!(first(Backend::OneStagePull, small, None), Some(copy(small)));
        assert_ne!(first(Backend::TwoStagePull, small, None), Some(copy(small)));
        for b in [Backend::IslandOneShot, Backend::IslandTwoShot] {
            assert_eq!(first(b, big, Some(&pull)), Some(copy(big)), "{b}");
            assert_ne!(first(b, big, Some(&push)), Some(copy(big)), "{b}");
            assert_ne!(first(b, small, Some(&pull)), Some(copy(small)), "{b} LL");
        }
        assert_eq!(last(Backend::TwoStagePush, big, None), Some(copy(big)));
        assert_eq!(
            last(Backend::IslandTwoShot, big, Some(&push)),
            Some(copy(big))
        );
        // island_one_shot's result is its own (it shares no output).
        assert_ne!(
            last(Backend::IslandOneShot, big, Some(&push)),
            Some(copy(big))
        );
        for (b, bytes) in [
            (Backend::OneStagePush, big),
            (Backend::OneStagePush, small),
            (Backend::TwoStagePush, small),
        ] {
            let steps = c.steps(b, bytes, None);
            assert!(!steps.contains(&copy(bytes)), "{b} at {bytes}");
        }
    }

    #[test]
    fn two_stage_pull_ll_pulls_both_phases_in_lines() {
        // 4 KiB on 8 GPUs under two switches: the reduce-scatter and the all-gather each a
        // read round trip of a shard's lines (512 B of data, 1 KiB on the wire per flow), with
        // no staging copy and no barrier. In local memory the sender writes a line per peer
        // (each takes another shard) in the reduce-scatter and one for all in the all-gather,
        // beside the word it loads or stores.
        let c = custom("pcie-8x-2switch", &[0, 1, 2, 3, 4, 5, 6, 7]);
        let shard = 512.0;
        let pat = c.pattern(Peers::All);
        let phase = 2.0 * pat.max_latency_us + 2.0 * shard * pat.read_us_per_byte;
        let local = |lines: f64| (lines * 2.0 * shard + shard) / (LOCAL_MEM_GBPS * 1e3);
        let want = c.prologue_us + 2.0 * phase + local(7.0) + local(1.0);
        let got = c.time(Backend::TwoStagePull, 4096, None);
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        // So it beats its bandwidth form by the staging copy and three barriers, less the
        // lines' second 4 KiB on the wire.
        assert!(got < c.price(&c.steps_as(Backend::TwoStagePull, None, 4096.0, None)));
    }

    #[test]
    fn the_ll_form_saves_the_barriers_of_a_small_message() {
        // One-stage push at 1 KiB on two switches: the bandwidth form pays a barrier before and
        // after its stores; the LL form one crossing and a poll, with twice the bytes.
        let c = custom("pcie-8x-2switch", &[0, 1, 2, 3, 4, 5, 6, 7]);
        let b = Backend::OneStagePush;
        let ll = c.price(&c.steps_as(b, Some(Ll::Message), 1024.0, None));
        let bw = c.price(&c.steps_as(b, None, 1024.0, None));
        assert!(ll < bw, "{ll} vs {bw}");
        assert_eq!(c.time(b, 1024, None), ll);
        // Two barriers and the reduce loop saved, a poll and 1 KiB more on the wire paid (and
        // a few hundredths of a µs of lines in local memory).
        let saved = 2.0 * c.barrier(Peers::All) + REDUCE_FIXED_US - FLAG_POLL_US;
        let lines = 1024.0 * c.pattern(Peers::All).write_us_per_byte;
        assert!((bw - ll - saved + lines).abs() < 0.05, "{bw} - {ll}");
    }
}

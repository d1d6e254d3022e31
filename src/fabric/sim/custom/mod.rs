//! Our peer-to-peer kernels on the simulated network, priced phase by phase from the
//! schedule their table entry states (allreduce/backend/), so a new backend of known phases
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

pub mod fixed;

use super::kernel::FLAG_POLL_US;
use super::net::{Engine, Flow, Net, Route};
use crate::allreduce::{Directions, Islands, Ll, Part, Peers, Phase, Plane};
use crate::fabric::{Backend, Direction};

/// Fixed cost of a local pass over a buffer (the reduce loop, a staging copy).
pub(super) const REDUCE_FIXED_US: f64 = 0.2;
/// Local memory rate for the reduce and the staging copies, GB/s: conservative for both GDDR7
/// (RTX PRO 6000, ~1.8 TB/s) and HBM3 (H100, ~3.3 TB/s); it is a few percent of the total
/// either way.
pub(super) const LOCAL_MEM_GBPS: f64 = 1500.0;
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
    /// Per [`key`]: every group has the all-peers pattern, a group with islands the others.
    patterns: [Option<Pattern>; 3],
    /// The kernel's prologue, µs: its GPU class's ([`fixed`]).
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

/// `Peers` as an index into the patterns: looked up at every priced step, so no hashing.
fn key(p: Peers) -> usize {
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
pub(in crate::fabric::sim) fn pairs(
    gpus: &[usize],
    islands: Option<&Islands>,
    peers: Peers,
) -> Vec<(usize, usize)> {
    sets(gpus, islands, peers)
        .iter()
        .flat_map(|s| {
            s.iter()
                .flat_map(move |&a| s.iter().filter(move |&&b| b != a).map(move |&b| (a, b)))
        })
        .collect()
}

/// The sets of GPUs a pattern exchanges within: the group, each island, or the GPUs at each
/// place of the islands.
pub(super) fn sets(gpus: &[usize], islands: Option<&Islands>, peers: Peers) -> Vec<Vec<usize>> {
    match (peers, islands) {
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
    }
}

/// Time for the slowest of `flows` to move `probe` bytes each, µs, divided by `probe`.
pub(super) fn us_per_byte(net: &Net, flows: &[Flow], routes: &[&Route]) -> f64 {
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
        let mut patterns = [None; 3];
        patterns[key(Peers::All)] = Some(pattern(net, &pairs(gpus, None, Peers::All), n - 1));
        if let Some(i) = islands {
            for (p, peers) in [
                (Peers::Island, island - 1),
                (Peers::Counterparts, i.count() - 1),
            ] {
                patterns[key(p)] = Some(pattern(net, &pairs(gpus, islands, p), peers));
            }
        }
        Custom {
            n,
            island,
            patterns,
            prologue_us: net.calibration().kernel_prologue_us,
        }
    }

    /// The same with the prologue of the group's GPU class ([`fixed::prologue_us`]) in place
    /// of the calibrated class's.
    pub fn with_prologue(self, prologue_us: f64) -> Custom {
        Custom {
            prologue_us,
            ..self
        }
    }

    fn pattern(&self, p: Peers) -> &Pattern {
        self.patterns[key(p)]
            .as_ref()
            .or(self.patterns[key(Peers::All)].as_ref())
            .expect("every group has the all-peers pattern")
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
mod tests;

//! Copy-engine backends ([`Executor::CopyEngine`]) on the simulated network: every phase's
//! data moves as copy-engine flows, whose rates are the network's own (the copy-engine link,
//! forwarding and collapse figures of calibration C1, C2, C3 and C9), not the kernel loads
//! and stores [`super::custom`] prices.
//!
//! A call, on one stream per GPU, in order:
//! - the input is staged into the shared buffer peers copy from: one local copy;
//! - a barrier: a flag written into each peer's memory and a wait on the GPU's own flags, by
//!   stream memory operations (no SM spins);
//! - each phase: the GPU's copy engine copies its part from each peer in turn, the k-th copy
//!   from the peer k places on, so at any moment every GPU pulls from one peer (the staggered
//!   pattern C2 probes); each copy pays its own fixed cost and a read round trip for its first
//!   bytes. A reducing phase then runs an SM kernel summing the landed slots and the GPU's own
//!   part; a gathering phase copies the GPU's own part locally. A phase that reads what its
//!   peers produced in the previous one waits at a barrier first;
//! - a last barrier: peers done reading this GPU's buffers.
//!
//! No published figure times a copy's or a stream memory operation's fixed cost: those
//! constants are assumptions, and [`BandPart::CopyFixed`]'s band says so.

use super::band::{Band, BandPart, GroupParts};
use super::custom::{sets, us_per_byte, LOCAL_MEM_GBPS, REDUCE_FIXED_US};
use super::kernel::FLAG_POLL_US;
use super::net::{Flow, Net, Route};
use crate::allreduce::{Executor, Islands, Part as Share, Peers, Phase};
use crate::fabric::{Backend, Direction, Mode};

/// Device time one copy costs beyond its bytes (the copy engine taking the work and signalling
/// it done before the stream's next operation), µs. Assumed.
const COPY_FIXED_US: f64 = 2.0;
/// Device time of one stream memory operation (a flag write or wait), µs. Assumed.
const MEMOP_US: f64 = 0.5;
/// Host time to enqueue one stream operation (a copy, a memory operation, a kernel) in eager
/// mode, µs: a call is as many of them as its schedule has. Assumed.
const ENQUEUE_US: f64 = 2.5;

/// The staggered patterns of one kind of peers: for the k-th copy (k = 1..peers), µs per
/// byte per flow while every GPU copies from the peer k places on.
#[derive(Debug, Clone, PartialEq)]
struct Staggered {
    us_per_byte: Vec<f64>,
    max_latency_us: f64,
}

/// One thing a call does, in order.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    /// Flags to each of `peers` peers, then a wait on as many.
    Barrier(Peers),
    /// The copies of one phase: `bytes` from each peer in turn.
    Copies { peers: Peers, bytes: f64 },
    /// One copy inside the GPU's own memory.
    LocalCopy(f64),
    /// The SM kernel summing `inputs` buffers of `bytes` into one.
    Sum { inputs: f64, bytes: f64 },
}

/// Transfer costs of one group's copy-engine patterns, computed once.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyEngines {
    n: usize,
    island: usize,
    /// Per [`key`]: every group has the all-peers pattern, a group with islands the others.
    patterns: [Option<Staggered>; 3],
    prologue_us: f64,
}

fn key(p: Peers) -> usize {
    match p {
        Peers::All => 0,
        Peers::Island => 1,
        Peers::Counterparts => 2,
    }
}

fn staggered(net: &Net, sets: &[Vec<usize>]) -> Staggered {
    let peers = sets
        .iter()
        .map(Vec::len)
        .max()
        .unwrap_or(1)
        .saturating_sub(1);
    let mut max_latency_us: f64 = 0.0;
    let us_per_byte = (1..=peers)
        .map(|k| {
            let pairs: Vec<(usize, usize)> = sets
                .iter()
                .flat_map(|s| (0..s.len()).map(move |i| (s[(i + k) % s.len()], s[i])))
                .filter(|(a, b)| a != b)
                .collect();
            let flows: Vec<Flow> = pairs
                .iter()
                .map(|&(src, dst)| Flow::copy(src, dst, Direction::Read))
                .collect();
            let routes: Vec<Route> = pairs.iter().map(|&(a, b)| net.route(a, b)).collect();
            max_latency_us = routes
                .iter()
                .map(|r| r.latency_us)
                .fold(max_latency_us, f64::max);
            us_per_byte(net, &flows, &routes.iter().collect::<Vec<_>>())
        })
        .collect();
    Staggered {
        us_per_byte,
        max_latency_us,
    }
}

impl CopyEngines {
    /// The staggered patterns of `gpus`: all of them, and with `islands` inside each island
    /// and between counterparts.
    pub fn new(net: &Net, gpus: &[usize], islands: Option<&Islands>) -> CopyEngines {
        let mut patterns = [None, None, None];
        let kinds: &[Peers] = match islands {
            Some(_) => &[Peers::All, Peers::Island, Peers::Counterparts],
            None => &[Peers::All],
        };
        for &p in kinds {
            patterns[key(p)] = Some(staggered(net, &sets(gpus, islands, p)));
        }
        CopyEngines {
            n: gpus.len(),
            island: islands.map_or(gpus.len(), Islands::size),
            patterns,
            prologue_us: net.calibration().kernel_prologue_us,
        }
    }

    fn pattern(&self, p: Peers) -> &Staggered {
        self.patterns[key(p)]
            .as_ref()
            .or(self.patterns[key(Peers::All)].as_ref())
            .expect("every group has the all-peers pattern")
    }

    fn part(&self, part: Share, bytes: f64) -> f64 {
        match part {
            Share::Message => bytes,
            Share::Shard => (bytes / self.n as f64).ceil(),
            Share::IslandShard => (bytes / self.island as f64).ceil(),
        }
    }

    /// The steps of one call of a copy-engine backend for `bytes` per GPU; empty for others.
    fn steps(&self, backend: Backend, bytes: f64) -> Vec<Step> {
        let phases: &[Phase] = match backend.executor() {
            Executor::CopyEngine(_) => backend.phases(),
            Executor::Nccl | Executor::SmKernel => &[],
        };
        let Some(first) = phases.first() else {
            return Vec::new();
        };
        let mut s = vec![Step::LocalCopy(bytes), Step::Barrier(first.peers)];
        for (i, ph) in phases.iter().enumerate() {
            let part = self.part(ph.part, bytes);
            if i > 0 {
                s.push(Step::Barrier(ph.peers));
            }
            s.push(Step::Copies {
                peers: ph.peers,
                bytes: part,
            });
            s.push(match ph.reduces {
                true => Step::Sum {
                    inputs: (self.pattern(ph.peers).us_per_byte.len() + 1) as f64,
                    bytes: part,
                },
                false => Step::LocalCopy(part),
            });
        }
        let slowest = phases
            .iter()
            .map(|p| p.peers)
            .max_by(|a, b| self.barrier(*a).total_cmp(&self.barrier(*b)))
            .unwrap_or(first.peers);
        s.push(Step::Barrier(slowest));
        s
    }

    fn barrier(&self, p: Peers) -> f64 {
        let pat = self.pattern(p);
        2.0 * pat.us_per_byte.len() as f64 * MEMOP_US + pat.max_latency_us + FLAG_POLL_US
    }

    fn cost(&self, step: Step) -> f64 {
        let local = |b: f64| b / (LOCAL_MEM_GBPS * 1e3);
        match step {
            Step::Barrier(p) => self.barrier(p),
            Step::Copies { peers, bytes } => {
                let pat = self.pattern(peers);
                pat.us_per_byte
                    .iter()
                    .map(|upb| COPY_FIXED_US + 2.0 * pat.max_latency_us + bytes * upb)
                    .sum()
            }
            Step::LocalCopy(bytes) => COPY_FIXED_US + local(2.0 * bytes),
            Step::Sum { inputs, bytes } => {
                self.prologue_us + REDUCE_FIXED_US + local((inputs + 1.0) * bytes)
            }
        }
    }

    /// Stream operations one call enqueues.
    fn ops(&self, step: Step) -> usize {
        match step {
            Step::Barrier(p) => 2 * self.pattern(p).us_per_byte.len(),
            Step::Copies { peers, .. } => self.pattern(peers).us_per_byte.len(),
            Step::LocalCopy(_) | Step::Sum { .. } => 1,
        }
    }

    /// Device time (µs) of one call of `backend` for `bytes` per GPU, launch excluded; NaN
    /// for a backend copy engines do not run.
    pub fn time(&self, backend: Backend, bytes: u64) -> f64 {
        let steps = self.steps(backend, bytes as f64);
        match steps.is_empty() {
            true => f64::NAN,
            false => steps.iter().map(|&s| self.cost(s)).sum(),
        }
    }

    /// What a call costs with no bytes: the fixed part of [`CopyEngines::time`].
    pub fn fixed(&self, backend: Backend) -> f64 {
        self.time_at(backend, 0.0)
    }

    fn time_at(&self, backend: Backend, bytes: f64) -> f64 {
        self.steps(backend, bytes)
            .iter()
            .map(|&s| self.cost(s))
            .sum()
    }

    /// Launch cost of one call in `mode`, µs: a graph replays its copies, flag operations and
    /// kernel as one launch (`graph_us`); eager, the host enqueues each of them.
    pub fn launch(&self, backend: Backend, mode: Mode, graph_us: f64) -> f64 {
        match mode {
            Mode::Graph => graph_us,
            Mode::Eager => {
                let ops: usize = self.steps(backend, 0.0).iter().map(|&s| self.ops(s)).sum();
                ops as f64 * ENQUEUE_US
            }
        }
    }
}

/// The band of a copy-engine time of `fixed_us` fixed costs and `data_us` moving its bytes:
/// [`BandPart::CopyFixed`] and the links' latencies price the fixed side; the fabric its copies
/// cross prices the bytes, without the kernel-traffic parts (copy engines move large TLPs,
/// which the copy-engine figures calibrate).
pub fn band(parts: &GroupParts, fixed_us: f64, data_us: f64) -> Band {
    let data = parts
        .fabric
        .iter()
        .filter(|(p, _)| {
            !matches!(
                p,
                BandPart::KernelMicrochip | BandPart::KernelBroadcom | BandPart::KernelUnstated
            )
        })
        .map(|(&p, &w)| (p, w))
        .collect();
    let mut fixed: std::collections::BTreeMap<BandPart, f64> =
        [(BandPart::CopyFixed, BandPart::CopyFixed.half_width())].into();
    for p in [BandPart::Links, BandPart::NvLink] {
        if parts.fabric.contains_key(&p) {
            fixed.insert(p, p.half_width());
        }
    }
    Band::split(&fixed, &data, fixed_us, data_us)
}

#[cfg(test)]
mod tests;

//! Our peer-to-peer kernels on the simulated network, scheduled phase by phase:
//!
//! - one-stage pull: barrier (inputs ready) → every GPU reads all N−1 peers at once, reducing
//!   as data arrives → barrier (peers done reading);
//! - one-stage push: barrier (receive slots free) → every GPU writes its input to all N−1
//!   peers → barrier (data landed) → local reduce of N inputs;
//! - two-stage pull/push: the same all-to-all pattern twice with size/N per flow
//!   (reduce-scatter, then all-gather), a barrier before, between and after.
//!
//! Transfers are kernel loads and stores ([`Engine::Kernel`]) and cost their max-min finish
//! time on the link graph; reads wait a round trip for their first bytes (non-posted), writes
//! one way. Two-stage moves size/N per flow but over the same N(N−1) concurrent flows as
//! one-stage, so it meets the same contention: its phases are priced from the same solve.

use super::kernel::FLAG_POLL_US;
use super::net::{Engine, Flow, Net, Route};
use crate::fabric::{Backend, Direction};

/// Fixed cost of the local reduce loop.
const REDUCE_FIXED_US: f64 = 0.2;
/// Local memory rate for the reduce, GB/s: conservative for both GDDR7 (RTX PRO 6000, ~1.8
/// TB/s) and HBM3 (H100, ~3.3 TB/s); it is a few percent of the total either way.
const LOCAL_MEM_GBPS: f64 = 1500.0;

/// All-to-all transfer costs of one group, computed once.
#[derive(Debug, Clone, PartialEq)]
pub struct Custom {
    n: usize,
    /// µs per byte per flow when all N(N−1) flows run at once, reading / writing.
    read_us_per_byte: f64,
    write_us_per_byte: f64,
    /// Slowest one-way latency between two GPUs of the group.
    max_latency_us: f64,
    /// The kernel's prologue, µs (calibration: C2's 1 KB one-shot).
    prologue_us: f64,
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

/// Time for the slowest of `flows` to move `probe` bytes each, µs, divided by `probe`.
fn us_per_byte(net: &Net, flows: &[Flow], routes: &[&Route]) -> f64 {
    const PROBE: f64 = 1e6;
    let sizes = vec![PROBE; flows.len()];
    net.finish_times(flows, routes, &sizes)
        .into_iter()
        .fold(0.0, f64::max)
        / PROBE
}

impl Custom {
    pub fn new(net: &Net, gpus: &[usize]) -> Custom {
        let reads = all_to_all(gpus, Direction::Read);
        let writes = all_to_all(gpus, Direction::Write);
        let routes: Vec<Route> = reads.iter().map(|f| net.route(f.src, f.dst)).collect();
        let refs: Vec<&Route> = routes.iter().collect();
        Custom {
            n: gpus.len(),
            read_us_per_byte: us_per_byte(net, &reads, &refs),
            write_us_per_byte: us_per_byte(net, &writes, &refs),
            max_latency_us: routes.iter().map(|r| r.latency_us).fold(0.0, f64::max),
            prologue_us: net.calibration().kernel_prologue_us,
        }
    }

    /// One remote flag write per peer, then a poll: about one path latency.
    fn barrier(&self) -> f64 {
        self.max_latency_us + FLAG_POLL_US
    }

    /// One all-to-all phase moving `bytes` per flow.
    fn phase(&self, bytes: f64, pull: bool) -> f64 {
        if pull {
            2.0 * self.max_latency_us + bytes * self.read_us_per_byte
        } else {
            self.max_latency_us + bytes * self.write_us_per_byte
        }
    }

    /// Reading `inputs` buffers of `bytes` from local memory and writing one.
    fn reduce(inputs: f64, bytes: f64) -> f64 {
        REDUCE_FIXED_US + (inputs + 1.0) * bytes / (LOCAL_MEM_GBPS * 1e3)
    }

    /// Device time (µs) of one allreduce of `bytes`, launch excluded.
    pub fn time(&self, backend: Backend, bytes: u64) -> f64 {
        let n = self.n as f64;
        let b = bytes as f64;
        let shard = (b / n).ceil();
        let start = self.prologue_us + self.barrier();
        match backend {
            // Pulled data is summed in registers as it arrives: only the local input is read.
            Backend::OneStagePull => {
                start + self.phase(b, true) + Self::reduce(1.0, b) + self.barrier()
            }
            Backend::OneStagePush => {
                start + self.phase(b, false) + self.barrier() + Self::reduce(n, b)
            }
            Backend::TwoStagePull => {
                start
                    + self.phase(shard, true)
                    + Self::reduce(1.0, shard)
                    + self.barrier()
                    + self.phase(shard, true)
                    + self.barrier()
            }
            Backend::TwoStagePush => {
                start
                    + self.phase(shard, false)
                    + self.barrier()
                    + Self::reduce(n, shard)
                    + self.phase(shard, false)
                    + self.barrier()
            }
            _ => f64::NAN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::presets;

    fn custom(preset: &str, gpus: &[usize]) -> Custom {
        let t = presets::get(preset).unwrap();
        Custom::new(&Net::build(&t), gpus)
    }

    #[test]
    fn four_under_one_switch_load_at_c5_concurrent_rate() {
        // Each GPU loads from 3 peers at once, as kernel loads: C5's 20.6 GB/s per GPU (a
        // transaction limit, the same GB/s on the preset's 56.32 GB/s port), so 20.6 / 3.
        let c = custom("pcie-4x-1switch", &[0, 1, 2, 3]);
        let rate = 1.0 / (c.read_us_per_byte * 1e3);
        let want = 20.60 / 3.0;
        assert!((rate - want).abs() < 1e-6, "{rate} vs {want}");
    }

    #[test]
    fn two_stage_phases_meet_the_same_contention_as_one_stage() {
        // The data part of a two-stage phase is exactly 1/N of a one-stage phase: the same
        // N(N−1) flows at the same per-byte cost.
        let c = custom("pcie-8x-2switch", &[0, 1, 2, 3, 4, 5, 6, 7]);
        let (b, n) = (8.0 * 1024.0 * 1024.0, 8.0);
        let one = c.phase(b, false) - c.max_latency_us;
        let two = c.phase(b / n, false) - c.max_latency_us;
        assert!((one / two - n).abs() < 1e-9, "{one} vs {two}");
    }

    #[test]
    fn two_stage_moves_less_per_flow_than_one_stage() {
        let c = custom("pcie-8x-2switch", &[0, 1, 2, 3, 4, 5, 6, 7]);
        let big = 8 << 20;
        assert!(c.time(Backend::TwoStagePull, big) < c.time(Backend::OneStagePull, big) / 2.0);
        // Tiny messages: the extra phase and barrier make two-stage slower.
        assert!(c.time(Backend::TwoStagePull, 1024) > c.time(Backend::OneStagePull, 1024));
    }

    #[test]
    fn push_pays_the_local_reduce_pull_does_not() {
        // On one switch with equal read/write rates push would win by its one-way latency;
        // the reduce of N landed buffers costs it more at large sizes.
        let c = custom("nvswitch-8x", &[0, 1, 2, 3, 4, 5, 6, 7]);
        assert!(c.time(Backend::OneStagePush, 1024) < c.time(Backend::OneStagePull, 1024));
        assert!(c.time(Backend::OneStagePush, 64 << 20) > c.time(Backend::OneStagePull, 64 << 20));
    }
}

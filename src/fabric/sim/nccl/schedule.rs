//! What NCCL's ring or chain costs on the link graph when it runs, apart from what NCCL's
//! tuning model predicts ([`Model`]).
//!
//! A time has three parts:
//! - a fixed cost per operation, whatever the ranks or hops: NCCL's own base latency per
//!   algorithm and protocol (tuning.cc baseLat, C4: launch of its kernel, loading its
//!   communicator and work, the teardown). nccl-tests#123 measures it as the intercept of the
//!   small-message time against the ring's steps (6 µs on DGX-A100, about 2 µs per step), and
//!   the rtx6kpro boxes show it on PCIe: 4 GPUs take 13 µs flat from 256 B to 64 KB, 8 GPUs 18-
//!   25 µs, not 6/14 of it;
//! - the critical path: each rank forwards a slice as soon as its predecessor's has landed,
//!   so a small message crosses the chain of hops its path takes, each at its own cost: on a
//!   ring 2(N−1) consecutive hops (every hop twice but the two the path starts after), on a
//!   chain every hop up and every hop down. A ring with two slow hops among fast ones pays
//!   the slow ones twice, not 2(N−1) times (C6's per-step cost through host memory against
//!   C1's between peers);
//! - the data, overlapped with the path as the protocol allows: LL forwards every flagged
//!   line as it lands, so a ring step costs the larger of its hop and its chunk's time on the
//!   wire; Simple forwards a chunk only after its flag, stored behind a memory fence, so a
//!   step costs both.

use super::{
    algo_index, efficiency, proto_index, transport, Host, Model, Transport, BASE_LAT, HW_LAT,
    RUNTIME_CHANNELS_PER_GRAPH_CHANNEL, TREE_CHUNK,
};
use crate::fabric::sim::kernel::FLAG_POLL_US;
use crate::fabric::sim::net::{Flow, Net, Route};
use crate::fabric::{Direction, NcclAlgo, NcclProto};
use crate::topology::Topology;

/// enqueue.cc (getAlgoInfo): an operation runs on fewer channels than the communicator has
/// while its bytes are below channels × threads × this many bytes per thread (device.h
/// thread thresholds; tuning.cc multiplies Ring LL's by the ranks), [LL, LL128, Simple].
const THREAD_THRESHOLD: [f64; 3] = [8.0, 8.0, 64.0];
/// Threads per channel (device.h maxima; tuning.cc gives Ring Simple 256 when the graph's
/// bandwidth is at most PCI_BW), [LL, LL128, Simple].
const MAX_THREADS: [f64; 3] = [512.0, 640.0, 512.0];
const PCI_BW: f64 = 12.0;

/// A receiver polling host memory issues its loads back to back, one round trip apart, so the
/// first to reach memory after a line lands does so half a round trip later on average and
/// returns half a round trip after that: one round trip.
const HOST_POLL_ROUND_TRIPS: f64 = 1.0;

/// Bytes of one LL line: a thread's volatile load, 8 bytes of data and two 4-byte flags
/// (prims_ll.h readLL).
const LL_LINE_BYTES: f64 = 16.0;

/// What one channel's LL receiver loads out of host memory at most, GB/s on the wire: each
/// of its threads spins on one line with a volatile load (prims_ll.h readLL), so it has one
/// line in flight per load round trip over PCIe. NCCL keeps every protocol's buffer in host
/// memory on the receiver's side (shm.cc, NCCL_SHM_LOCALITY=2). A P2P receiver polls its own
/// memory, a round trip short enough that C6's channel rate binds first.
fn polled_gbps(hops: &[HopLat]) -> f64 {
    hops.iter()
        .filter(|h| h.fetch > 0.0)
        .map(|h| MAX_THREADS[0] * LL_LINE_BYTES / (h.fetch * 1e3))
        .fold(f64::INFINITY, f64::min)
}

/// One hop's latency as a protocol step sees it, µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HopLat {
    /// The sender's stores land: in the receiver's buffer (P2P) or in host memory (SHM).
    pub land: f64,
    /// The receiver sees them: a poll of its own memory (P2P) or of host memory over PCIe.
    pub poll: f64,
    /// SHM only: Simple's data is read from host memory after its flag, one load round trip
    /// (LL's lines carry their flags, so the poll that sees them has fetched them).
    pub fetch: f64,
    /// Simple only: the sender's system-scope fence between its data and its flag, a round
    /// trip to where the data lands (GPU stores are weakly ordered; LL's flags travel inside
    /// each 8-byte line, "so that we avoid expensive memory barriers", NVIDIA/nccl#281).
    pub fence: f64,
}

impl HopLat {
    /// Cost of one protocol step over this hop, data apart: LL's lines land and are seen by
    /// the receiver's poll (C1: about 1 µs a step between peers); Simple adds the fence before
    /// its flag and, through host memory, the fetch after it (C4: NCCL's own per-hop figure
    /// for Simple on PCIe is several times LL's; rtx6kpro: LL is 1.5-1.9x faster than Simple
    /// at small sizes). LL128 adds NCCL's own per-hop figure for its 128-byte lines over LL's
    /// (C4); it runs only on NVLink.
    pub fn step(&self, proto: NcclProto, nvlink: bool) -> f64 {
        let base = self.land + self.poll;
        match proto {
            NcclProto::LL => base,
            NcclProto::LL128 => {
                let kind = if nvlink { 0 } else { 1 };
                base + HW_LAT[kind][1][1] - HW_LAT[kind][1][0]
            }
            NcclProto::Simple => base + self.fence + self.fetch,
        }
    }
}

/// What a ring or chain costs on the link graph.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSchedule {
    n: usize,
    channels: u32,
    nvlink: bool,
    /// Ring Simple runs 256 threads per channel (the graph's bandwidth is at most PCI_BW).
    narrow_simple: bool,
    /// What one channel moves over PCIe at most, GB/s (calibration: C6).
    channel_gbps: f64,
    /// What one channel's LL receiver polls out of host memory at most, GB/s: ring, chain.
    polled_gbps: [f64; 2],
    /// Slowest flow of the ring (all channels running), GB/s.
    ring_gbps: f64,
    /// Latency of each ring hop ring[i] → ring[i+1].
    pub ring_hops: Vec<HopLat>,
    chain_gbps: f64,
    /// Latency of each chain hop, up (towards ring[0]) and down alike.
    chain_hops: Vec<HopLat>,
}

/// The flows and routes of one hop a → b, and the hop's latency.
fn hop_flows(net: &Net, a: usize, b: usize, via: Transport) -> (Vec<Flow>, Vec<Route>, HopLat) {
    let (flows, mut routes, lat) = match via {
        Transport::P2p => {
            let r = net.route(a, b);
            let lat = HopLat {
                land: r.latency_us,
                poll: FLAG_POLL_US,
                fetch: 0.0,
                fence: 2.0 * r.latency_us,
            };
            (vec![Flow::kernel(a, b, Direction::Write)], vec![r], lat)
        }
        Transport::Shm => {
            // The buffer is in the receiver's host memory: the sender's stores land there
            // one way; the receiver finds them by polling it, loads over PCIe.
            let mem = net.socket_of(b);
            let up = net.host_route(a, mem, true);
            let down = net.host_route(b, mem, false);
            let round_trip = 2.0 * down.latency_us;
            let lat = HopLat {
                land: up.latency_us,
                poll: HOST_POLL_ROUND_TRIPS * round_trip,
                fetch: round_trip,
                fence: 2.0 * up.latency_us,
            };
            (
                vec![
                    Flow::kernel(a, b, Direction::Write),
                    Flow::kernel(a, b, Direction::Read),
                ],
                vec![up, down],
                lat,
            )
        }
    };
    // What one NCCL channel (one thread block) moves over PCIe at most (calibration: C6).
    let channel = net.calibration().nccl_channel_gbps;
    for r in routes.iter_mut().filter(|r| !r.nvlink) {
        r.flow_cap = r.flow_cap.min(channel);
    }
    (flows, routes, lat)
}

/// Rate of the slowest of `hops` (× channels) all moving at once, and each hop's latency.
fn lockstep(net: &Net, hops: &[(usize, usize, Transport)], channels: u32) -> (f64, Vec<HopLat>) {
    let mut flows = Vec::new();
    let mut routes = Vec::new();
    let mut lats = Vec::with_capacity(hops.len());
    for &(a, b, via) in hops {
        let (f, r, lat) = hop_flows(net, a, b, via);
        lats.push(lat);
        for _ in 0..channels {
            flows.extend(f.iter().copied());
            routes.extend(r.iter().cloned());
        }
    }
    let refs: Vec<&Route> = routes.iter().collect();
    let rate = net
        .rates(&flows, &refs)
        .into_iter()
        .fold(f64::INFINITY, f64::min);
    (rate, lats)
}

impl StepSchedule {
    /// NCCL stores into the next rank's buffers (P2P write is its PCIe default) or, for SHM
    /// hops, into host memory the next rank loads from.
    pub fn new(
        t: &Topology,
        net: &Net,
        host: &Host,
        ring: &[usize],
        model: &Model,
    ) -> StepSchedule {
        let n = ring.len();
        let ring_hops: Vec<(usize, usize, Transport)> = (0..n)
            .map(|i| (ring[i], ring[(i + 1) % n], model.transports[i]))
            .collect();
        let chain_hops: Vec<(usize, usize, Transport)> = (0..n - 1)
            .flat_map(|i| [(ring[i + 1], ring[i]), (ring[i], ring[i + 1])])
            .map(|(a, b)| (a, b, transport(t, net, host, n, a, b)))
            .collect();
        let channels = model.channels * RUNTIME_CHANNELS_PER_GRAPH_CHANNEL;
        let (ring_gbps, ring_lats) = lockstep(net, &ring_hops, channels);
        let (chain_gbps, chain_lats) = lockstep(net, &chain_hops, channels);
        StepSchedule {
            n,
            channels,
            nvlink: model.nvlink,
            narrow_simple: model.bw_per_channel * model.channels as f64 <= PCI_BW,
            channel_gbps: net.calibration().nccl_channel_gbps,
            polled_gbps: [polled_gbps(&ring_lats), polled_gbps(&chain_lats)],
            ring_gbps,
            ring_hops: ring_lats,
            chain_gbps,
            chain_hops: chain_lats,
        }
    }

    /// The ring's critical path for `proto` with `chunk` µs of data per step on the wire:
    /// the slowest run of 2(N−1) consecutive hops. A line-forwarding protocol (LL, LL128)
    /// starts a step once the previous step's first line has landed and its link has sent the
    /// previous chunk, so a step costs the larger of the two, and the last line lands the
    /// smaller of the two after its link sends it: S·max(h, c) + min(h, c). Simple forwards
    /// a chunk after its flag, so a step costs both.
    fn ring_path_us(&self, proto: NcclProto, chunk: f64) -> f64 {
        let n = self.ring_hops.len();
        let cost: Vec<f64> = self
            .ring_hops
            .iter()
            .map(|h| {
                let hop = h.step(proto, self.nvlink);
                match proto {
                    NcclProto::Simple => hop + chunk,
                    _ => hop.max(chunk),
                }
            })
            .collect();
        let run = 2 * n.saturating_sub(1);
        let quickest = self
            .ring_hops
            .iter()
            .map(|h| h.step(proto, self.nvlink))
            .fold(f64::INFINITY, f64::min);
        let drain = match proto {
            NcclProto::Simple => 0.0,
            _ => chunk.min(quickest),
        };
        // A run of 2(N−1) hops from s crosses every hop twice but the two before s, so each
        // start costs O(1) and a ring of N ranks O(N), not O(N²).
        let twice: f64 = 2.0 * cost.iter().sum::<f64>();
        let slowest = match run {
            0 => 0.0,
            _ => (0..n)
                .map(|s| twice - cost[(s + run) % n] - cost[(s + run + 1) % n])
                .fold(0.0, f64::max),
        };
        slowest + drain
    }

    /// The chain's critical path: every hop up (reduce), then every hop down (broadcast).
    fn chain_path_us(&self, proto: NcclProto) -> f64 {
        self.chain_hops
            .iter()
            .map(|h| h.step(proto, self.nvlink))
            .sum()
    }

    /// The channels one operation of `bytes` runs on (enqueue.cc getAlgoInfo): NCCL drops
    /// channels while the bytes would give each thread less than its threshold.
    pub(super) fn op_channels(&self, algo: NcclAlgo, proto: NcclProto, bytes: u64) -> f64 {
        let p = proto_index(proto);
        let mut threshold = THREAD_THRESHOLD[p];
        if algo == NcclAlgo::Ring && proto == NcclProto::LL {
            threshold *= self.n as f64;
        }
        let threads = if algo == NcclAlgo::Ring && proto == NcclProto::Simple && self.narrow_simple
        {
            256.0
        } else {
            MAX_THREADS[p]
        };
        let per_channel = threads * threshold;
        (bytes as f64 / per_channel)
            .ceil()
            .clamp(1.0, self.channels as f64)
    }

    /// What `nc` of the channels move over the slowest hop together, GB/s: each channel at most
    /// its own PCIe rate, all of them at most what the hop gives all channels at once.
    /// LL's receivers through host memory move at most their polled rate.
    fn hop_gbps(&self, all_channels_gbps: f64, nc: f64, polled: f64) -> f64 {
        let all = all_channels_gbps * self.channels as f64;
        if self.nvlink {
            all
        } else {
            all.min(nc * self.channel_gbps.min(polled))
        }
    }

    /// Device time (µs) of one allreduce of `bytes`, launch excluded.
    pub fn time(&self, algo: NcclAlgo, proto: NcclProto, bytes: u64) -> f64 {
        let n = self.n as f64;
        let steps = 2.0 * (n - 1.0);
        let nc = self.op_channels(algo, proto, bytes);
        let wire = 1.0 / efficiency(proto);
        let p = proto_index(proto);
        let b = bytes as f64;
        let base = BASE_LAT[algo_index(algo)][p];
        let polled = |i: usize| match proto {
            NcclProto::LL => self.polled_gbps[i],
            _ => f64::INFINITY,
        };
        match algo {
            NcclAlgo::Ring => {
                // Each step moves 1/N of the message over every hop.
                let chunk = wire * b / n / (self.hop_gbps(self.ring_gbps, nc, polled(0)) * 1e3);
                base + self.ring_path_us(proto, chunk)
            }
            NcclAlgo::Tree => {
                // Each link carries the whole message up (reduce) and down (broadcast). Simple
                // forwards whole chunks of a fixed size (the last one what remains), so the
                // first chunk crosses 2(N−1) hops before the pipeline is full; LL and LL128
                // forward each flagged line as it lands, so their fill is the per-hop latency
                // already counted in the path.
                let stream = wire * b / (self.hop_gbps(self.chain_gbps, nc, polled(1)) * 1e3);
                let data = if proto == NcclProto::Simple && b > 0.0 {
                    let per_channel = b / nc;
                    let first = TREE_CHUNK[p].min(per_channel) / per_channel;
                    stream * (1.0 + (steps - 1.0) * first)
                } else {
                    stream
                };
                base + self.chain_path_us(proto) + data
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring of `n` hops whose latencies all differ, so every start's run costs its own.
    fn ring(n: usize) -> StepSchedule {
        let hop = |i: usize| HopLat {
            land: 0.7 + (i * 7 % 5) as f64 * 0.9,
            poll: 0.3 + (i % 3) as f64 * 0.4,
            fetch: (i % 2) as f64,
            fence: 1.1 + (i * 3 % 4) as f64,
        };
        StepSchedule {
            n,
            channels: 2,
            nvlink: false,
            narrow_simple: false,
            channel_gbps: 11.1,
            polled_gbps: [f64::INFINITY; 2],
            ring_gbps: 20.0,
            ring_hops: (0..n).map(hop).collect(),
            chain_gbps: 20.0,
            chain_hops: Vec::new(),
        }
    }

    #[test]
    fn the_ring_path_is_the_slowest_run_of_two_n_minus_two_hops() {
        for n in [1, 2, 3, 5, 8, 13] {
            let r = ring(n);
            for proto in [NcclProto::LL, NcclProto::Simple] {
                for chunk in [0.0, 0.5, 2.0, 9.0] {
                    let cost: Vec<f64> = r
                        .ring_hops
                        .iter()
                        .map(|h| match proto {
                            NcclProto::Simple => h.step(proto, false) + chunk,
                            _ => h.step(proto, false).max(chunk),
                        })
                        .collect();
                    let run = 2 * (n - 1);
                    let slowest = (0..n)
                        .map(|s| (0..run).map(|k| cost[(s + k) % n]).sum::<f64>())
                        .fold(0.0, f64::max);
                    let quickest = r
                        .ring_hops
                        .iter()
                        .map(|h| h.step(proto, false))
                        .fold(f64::INFINITY, f64::min);
                    let drain = match proto {
                        NcclProto::Simple => 0.0,
                        _ => chunk.min(quickest),
                    };
                    let got = r.ring_path_us(proto, chunk);
                    let want = slowest + drain;
                    assert!(
                        (got - want).abs() <= 1e-12 * want.max(1.0),
                        "{n} {proto:?} {chunk}"
                    );
                }
            }
        }
    }
}

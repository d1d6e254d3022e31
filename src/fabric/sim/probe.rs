//! The contention probe's pattern on the simulated net.

use super::net::{Flow, Net, Route};
use super::Direction;

/// Per GPU of a probe, (finish µs per byte, one-way latency µs) of each of its flows.
pub(super) type ProbePattern = Vec<Vec<(f64, f64)>>;

/// Probe shape: GPU at rank i moves bytes with ranks i+1 .. i+peers, all at once. Finish
/// times of equal-sized flows scale with their size, so one solve serves every size.
pub(super) fn probe_pattern(
    net: &Net,
    gpus: &[usize],
    direction: Direction,
    peers: usize,
) -> ProbePattern {
    let n = gpus.len();
    let mut flows = Vec::with_capacity(n * peers);
    for (i, &g) in gpus.iter().enumerate() {
        for k in 1..=peers {
            let p = gpus[(i + k) % n];
            // Probes time copy-engine transfers (p2pBandwidthLatencyTest), like the tables
            // they are compared with.
            flows.push(match direction {
                Direction::Read => Flow::copy(p, g, direction),
                Direction::Write => Flow::copy(g, p, direction),
            });
        }
    }
    let routes: Vec<Route> = flows.iter().map(|f| net.route(f.src, f.dst)).collect();
    let refs: Vec<&Route> = routes.iter().collect();
    const UNIT: f64 = 1e6;
    let done = net.finish_times(&flows, &refs, &vec![UNIT; flows.len()]);
    (0..n)
        .map(|i| {
            (0..peers)
                .map(|k| (done[i * peers + k] / UNIT, routes[i * peers + k].latency_us))
                .collect()
        })
        .collect()
}

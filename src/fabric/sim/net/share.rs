//! The rates concurrent flows get on the net, and when they finish.

use super::{Engine, Flow, Net, Route};
use crate::fabric::sim::flow::{self, Problem};

/// What a node counts a flow as: its (source, destination, to host memory). Several NCCL
/// channels between the same two GPUs are one stream of TLPs to a switch, not several.
fn key(f: &Flow, r: &Route) -> (usize, usize, bool) {
    (f.src, f.dst, r.dst_root.is_none())
}

/// The flows' indices sorted by [`key`], so equal keys are neighbours.
fn key_order(flows: &[Flow], routes: &[&Route]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..flows.len()).collect();
    order.sort_unstable_by_key(|&i| key(&flows[i], routes[i]));
    order
}

impl Net {
    /// Per resource `counted`, how many distinct [`key`]s of the flows in `order` (sorted by
    /// key, [`key_order`]) cross it: O(E) for E route entries, with no search per entry.
    pub(super) fn distinct_pairs(
        &self,
        flows: &[Flow],
        routes: &[&Route],
        order: &[usize],
        counted: impl Fn(usize) -> bool,
    ) -> Vec<usize> {
        let mut count = vec![0usize; self.caps.len()];
        // The run of equal keys that last counted each resource.
        let mut stamp = vec![usize::MAX; self.caps.len()];
        let mut run = 0;
        for (j, &i) in order.iter().enumerate() {
            if j > 0 && key(&flows[order[j - 1]], routes[order[j - 1]]) != key(&flows[i], routes[i])
            {
                run += 1;
            }
            for &x in &routes[i].resources {
                if stamp[x] != run && counted(x) {
                    stamp[x] = run;
                    count[x] += 1;
                }
            }
        }
        count
    }

    /// Max-min rates (GB/s) of `flows` running together over `routes` (one per flow).
    pub fn rates(&self, flows: &[Flow], routes: &[&Route]) -> Vec<f64> {
        self.rates_in(flows, routes, &key_order(flows, routes))
    }

    /// [`Net::rates`] with the flows' [`key_order`] given.
    fn rates_in(&self, flows: &[Flow], routes: &[&Route], order: &[usize]) -> Vec<f64> {
        let count = self.distinct_pairs(flows, routes, order, |x| self.curves[x].is_some());
        let costs = self.kernel_costs(flows, routes, order);
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
            let (weight, port, cap) = costs[i];
            // A kernel's loads and stores weigh on a collapsing uplink as on its port; a copy
            // served by a busy GPU is slowed at that GPU's port only.
            let on_collapse = if f.engine == Engine::Kernel {
                weight
            } else {
                1.0
            };
            let extra = collapse
                .iter()
                .filter(|(_, members)| members.binary_search(&i).is_ok())
                .map(|(res, _)| (*res, on_collapse));
            let path = r.resources.iter().map(|&x| {
                let w = if port == Some(x) { weight } else { 1.0 };
                (x, w * self.curves[x].map_or(1.0, |c| c.weight(f.dir)))
            });
            p.add_flow(path.chain(extra), r.flow_cap.min(cap));
        }
        flow::max_min(&p)
    }

    /// When each flow finishes (µs) if all start together and flow `i` moves `bytes[i]`; rates
    /// are re-shared (and node flow counts drop) each time one finishes.
    pub fn finish_times(&self, flows: &[Flow], routes: &[&Route], bytes: &[f64]) -> Vec<f64> {
        let mut left: Vec<f64> = bytes.to_vec();
        let mut done = vec![f64::NAN; flows.len()];
        let mut now = 0.0;
        // Sorted once: each round's live flows keep this order.
        let all = key_order(flows, routes);
        let mut local = vec![usize::MAX; flows.len()];
        loop {
            let live: Vec<usize> = (0..flows.len()).filter(|&i| done[i].is_nan()).collect();
            if live.is_empty() {
                return done;
            }
            for (j, &i) in live.iter().enumerate() {
                local[i] = j;
            }
            let order: Vec<usize> = all
                .iter()
                .filter(|&&i| done[i].is_nan())
                .map(|&i| local[i])
                .collect();
            let fl: Vec<Flow> = live.iter().map(|&i| flows[i]).collect();
            let ro: Vec<&Route> = live.iter().map(|&i| routes[i]).collect();
            // GB/s = 1e3 bytes/µs.
            let rates: Vec<f64> = self
                .rates_in(&fl, &ro, &order)
                .into_iter()
                .map(|r| r * 1e3)
                .collect();
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

//! Max-min fair sharing of capacity-limited resources by concurrent flows (progressive filling).
//!
//! All unfrozen flows grow at the same pace; a resource that fills freezes every flow crossing
//! it, and a flow that reaches its own cap freezes alone. A flow may weigh more than 1 on a
//! resource (a read costs a switch `1/read_factor` units per unit of payload), so equal rates
//! can consume unequal capacity.

/// One sharing problem. Flow `f` crosses `entries[start[f]..start[f + 1]]` as
/// (resource, weight) pairs.
#[derive(Debug, Clone, Default)]
pub struct Problem {
    /// Capacity of each resource, GB/s (may be `f64::INFINITY`).
    pub caps: Vec<f64>,
    pub start: Vec<usize>,
    pub entries: Vec<(usize, f64)>,
    /// The most each flow may get on its own, GB/s.
    pub flow_caps: Vec<f64>,
}

impl Problem {
    pub fn new(caps: Vec<f64>) -> Self {
        Problem {
            caps,
            start: vec![0],
            entries: Vec::new(),
            flow_caps: Vec::new(),
        }
    }

    /// Adds a flow over `resources` (with weights), capped at `cap`; returns its index.
    pub fn add_flow(
        &mut self,
        resources: impl IntoIterator<Item = (usize, f64)>,
        cap: f64,
    ) -> usize {
        self.entries.extend(resources);
        self.start.push(self.entries.len());
        self.flow_caps.push(cap);
        self.flow_caps.len() - 1
    }

    pub fn flows(&self) -> usize {
        self.flow_caps.len()
    }

    fn path(&self, f: usize) -> &[(usize, f64)] {
        &self.entries[self.start[f]..self.start[f + 1]]
    }
}

/// Relative slack under which a resource counts as full.
const EPS: f64 = 1e-9;

/// Max-min fair rates (GB/s), one per flow. A flow crossing no finite resource and with no cap
/// gets `f64::INFINITY`.
pub fn max_min(p: &Problem) -> Vec<f64> {
    let n = p.flows();
    let mut rate = vec![0.0; n];
    // The unfrozen flows in index order, so every sum adds in the same order as over all.
    let mut active: Vec<usize> = (0..n).collect();
    let mut used = vec![0.0; p.caps.len()];
    let mut load = vec![0.0; p.caps.len()];
    while !active.is_empty() {
        load.iter_mut().for_each(|l| *l = 0.0);
        for &f in &active {
            for &(r, w) in p.path(f) {
                load[r] += w;
            }
        }
        let mut inc = f64::INFINITY;
        for (r, &l) in load.iter().enumerate() {
            if l > 0.0 {
                inc = inc.min((p.caps[r] - used[r]).max(0.0) / l);
            }
        }
        for &f in &active {
            inc = inc.min(p.flow_caps[f] - rate[f]);
        }
        if !inc.is_finite() {
            for &f in &active {
                rate[f] = f64::INFINITY;
            }
            break;
        }
        for &f in &active {
            rate[f] += inc;
            for &(r, w) in p.path(f) {
                used[r] += inc * w;
            }
        }
        let full =
            |r: usize| p.caps[r].is_finite() && p.caps[r] - used[r] <= EPS * p.caps[r].max(1.0);
        active.retain(|&f| {
            !(rate[f] >= p.flow_caps[f] * (1.0 - EPS) || p.path(f).iter().any(|&(r, _)| full(r)))
        });
    }
    rate
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn three_flows_on_two_links() {
        // Link A (10) carries f0 and f1; link B (20) carries f1 and f2. A fills first at 5
        // each, freezing f0 and f1; f2 then takes what B has left: 20 − 5 = 15.
        let mut p = Problem::new(vec![10.0, 20.0]);
        p.add_flow([(0, 1.0)], f64::INFINITY);
        p.add_flow([(0, 1.0), (1, 1.0)], f64::INFINITY);
        p.add_flow([(1, 1.0)], f64::INFINITY);
        let r = max_min(&p);
        assert!(
            close(r[0], 5.0) && close(r[1], 5.0) && close(r[2], 15.0),
            "{r:?}"
        );
    }

    #[test]
    fn flow_cap_leaves_room_for_others() {
        // One link of 10; f0 may take at most 3, so f1 gets the other 7.
        let mut p = Problem::new(vec![10.0]);
        p.add_flow([(0, 1.0)], 3.0);
        p.add_flow([(0, 1.0)], f64::INFINITY);
        let r = max_min(&p);
        assert!(close(r[0], 3.0) && close(r[1], 7.0), "{r:?}");
    }

    #[test]
    fn weights_make_equal_rates_cost_more() {
        // A node of 12 where f0 weighs 2 (a read at read_factor 0.5) and f1 weighs 1: both
        // rise together until 2x + x = 12, so 4 each.
        let mut p = Problem::new(vec![12.0]);
        p.add_flow([(0, 2.0)], f64::INFINITY);
        p.add_flow([(0, 1.0)], f64::INFINITY);
        let r = max_min(&p);
        assert!(close(r[0], 4.0) && close(r[1], 4.0), "{r:?}");
    }

    #[test]
    fn bottleneck_chain() {
        // Classic parking lot: links L0, L1 of 1; long flow f0 crosses both, f1 only L0,
        // f2 only L1. Everyone gets 1/2.
        let mut p = Problem::new(vec![1.0, 1.0]);
        p.add_flow([(0, 1.0), (1, 1.0)], f64::INFINITY);
        p.add_flow([(0, 1.0)], f64::INFINITY);
        p.add_flow([(1, 1.0)], f64::INFINITY);
        let r = max_min(&p);
        assert!(r.iter().all(|&x| close(x, 0.5)), "{r:?}");
    }

    #[test]
    fn unlimited_resource_freezes_nobody() {
        // f0 is capped at 3; f1 shares the unlimited node with it and fills its own link of 8.
        let mut p = Problem::new(vec![f64::INFINITY, 8.0]);
        p.add_flow([(0, 1.0)], 3.0);
        p.add_flow([(0, 1.0), (1, 1.0)], f64::INFINITY);
        let r = max_min(&p);
        assert!(close(r[0], 3.0) && close(r[1], 8.0), "{r:?}");
    }

    #[test]
    fn unconstrained_flow_is_infinite() {
        let mut p = Problem::new(vec![f64::INFINITY]);
        p.add_flow([(0, 1.0)], f64::INFINITY);
        assert_eq!(max_min(&p), vec![f64::INFINITY]);
    }
}

//! The model parts a group's routes cross, for the error band of its times ([`band`]).
//!
//! [`band`]: crate::fabric::sim::band

use std::collections::BTreeMap;

use super::costs::SERVED_PEERS;
use super::{Net, Place};
use crate::fabric::sim::band::{BandPart, COLLAPSE_UNSTATED};
use crate::fabric::Direction;

impl Net {
    /// The model parts the peer routes between `gpus` cross, each at its half-width for the
    /// all-to-all of the group (a switch's kernel band grows with the flows crossing it).
    pub fn parts(&self, gpus: &[usize]) -> BTreeMap<BandPart, f64> {
        let pairs: Vec<(usize, usize)> = gpus
            .iter()
            .flat_map(|&a| gpus.iter().filter(move |&&b| b != a).map(move |&b| (a, b)))
            .collect();
        self.parts_of(&pairs)
    }

    /// [`Net::parts`] for the flows of one pattern, `pairs` (source, destination) at once.
    pub fn parts_of(&self, pairs: &[(usize, usize)]) -> BTreeMap<BandPart, f64> {
        let mut out = BTreeMap::new();
        let tree = self.tree_uplinks();
        // Distinct GPU pairs crossing each resource.
        let mut flows = vec![0usize; self.caps.len()];
        let mut partners = Vec::with_capacity(2 * pairs.len());
        for &(a, b) in pairs {
            let r = self.route(a, b);
            if r.nvlink {
                out.insert(BandPart::NvLink, BandPart::NvLink.half_width());
                continue;
            }
            out.insert(BandPart::Links, BandPart::Links.half_width());
            if a != b {
                partners.extend([(a, b), (b, a)]);
            }
            for &x in &r.resources {
                flows[x] += 1;
            }
            if self.rc_node.iter().any(|x| r.resources.contains(x)) {
                out.insert(BandPart::RootComplex, BandPart::RootComplex.half_width());
            }
            if tree.iter().any(|x| r.resources.contains(x)) {
                out.insert(BandPart::SwitchTree, BandPart::SwitchTree.half_width());
            }
            if self.sock_x_up.iter().any(|x| r.resources.contains(x)) {
                out.insert(BandPart::Interconnect, BandPart::Interconnect.half_width());
            }
        }
        // A GPU with SERVED_PEERS partners over PCIe may serve as many peers' copies at once.
        partners.sort_unstable();
        partners.dedup();
        if partners
            .chunk_by(|x, y| x.0 == y.0)
            .any(|c| c.len() >= SERVED_PEERS)
        {
            out.insert(BandPart::CopyServed, BandPart::CopyServed.half_width());
        }
        for (part, w) in self.collapse_parts(pairs) {
            let e = out.entry(part).or_insert(w);
            *e = e.max(w);
        }
        let mut widen = |part: BandPart, w: f64| {
            let e = out.entry(part).or_insert(w);
            *e = e.max(w);
        };
        for (s, &node) in self.sw_node.iter().enumerate() {
            if flows[node] > 0 {
                let reach = self.cal.kernel_flows_reach;
                widen(self.sw_part[s], self.sw_part[s].width(flows[node], reach));
            }
        }
        for (node, &f) in flows.iter().enumerate() {
            if f > 0 && self.forwarding_assumed[node] {
                widen(BandPart::ForwardingUnstated, self.forwarding_width(node, f));
            }
        }
        out
    }

    /// The collapse parts of the group's all-to-all: for each switch whose uplink two or more
    /// of the group's GPUs send out of towards two or more root complexes (C3's condition),
    /// [`BandPart::Collapse`] where it collapses, or where its make is unstated
    /// [`BandPart::CollapseUnstated`], as wide as the collapse would slow its uplink's bytes.
    fn collapse_parts(&self, pairs: &[(usize, usize)]) -> Vec<(BandPart, f64)> {
        // Which switch an uplink resource belongs to, so one pass over the pairs serves all.
        let mut uplink_of = vec![None; self.caps.len()];
        for (s, &up) in self.sw_up.iter().enumerate() {
            uplink_of[up] = Some(s);
        }
        let mut seen = vec![(Vec::new(), Vec::new()); self.sw_up.len()];
        for &(a, b) in pairs {
            let r = self.route(a, b);
            let Some(root) = r.dst_root else { continue };
            for s in r.resources.iter().filter_map(|&x| uplink_of[x]) {
                seen[s].0.push(a);
                seen[s].1.push(root);
            }
        }
        let mut out = Vec::new();
        for (s, (mut sources, mut roots)) in seen.into_iter().enumerate() {
            let up = self.sw_up[s];
            for v in [&mut sources, &mut roots] {
                v.sort_unstable();
                v.dedup();
            }
            if sources.len() < 2 || roots.len() < 2 {
                continue;
            }
            if self.sw_collapse[s].is_some() {
                out.push((BandPart::Collapse, BandPart::Collapse.half_width()));
            } else if self.sw_part[s] == BandPart::KernelUnstated {
                // Kernel bytes weigh by their concurrency factor at a collapse (costs.rs).
                let f = self.kernel[self.sw_node[s]].as_ref().map_or(1.0, |k| {
                    k.factor(Direction::Read, usize::MAX)
                        .min(k.factor(Direction::Write, usize::MAX))
                });
                let w = (self.caps[up] / (COLLAPSE_UNSTATED * f)).ln();
                out.push((
                    BandPart::CollapseUnstated,
                    w.max(BandPart::CollapseUnstated.half_width()),
                ));
            }
        }
        out
    }

    /// The uplinks (both directions) of switches under another switch: a route crossing one
    /// is forwarded between switches by the switch above.
    fn tree_uplinks(&self) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .chains
            .iter()
            .flat_map(|c| c.windows(2))
            .filter_map(|w| match (w[0], w[1]) {
                (Place::Switch(s), Place::Switch(_)) => Some([self.sw_up[s], self.sw_down[s]]),
                _ => None,
            })
            .flatten()
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// An assumed forwarding curve's half-width with `flows` through its node.
    fn forwarding_width(&self, node: usize, flows: usize) -> f64 {
        let extra = self.curves[node].map_or(0.0, |c| c.extrapolated(flows));
        BandPart::ForwardingUnstated.half_width() + extra
    }
}

//! The model parts a group's routes cross, for the error band of its times ([`band`]).
//!
//! [`band`]: crate::fabric::sim::band

use std::collections::BTreeMap;

use super::Net;
use crate::fabric::sim::band::Part;

impl Net {
    /// The model parts the peer routes between `gpus` cross, each at its half-width for the
    /// all-to-all of the group (a switch's kernel band grows with the flows crossing it).
    pub fn parts(&self, gpus: &[usize]) -> BTreeMap<Part, f64> {
        let mut out = BTreeMap::new();
        let mut sw_flows = vec![0usize; self.sw_node.len()];
        for &a in gpus {
            for &b in gpus.iter().filter(|&&b| b != a) {
                let r = self.route(a, b);
                if r.nvlink {
                    out.insert(Part::NvLink, Part::NvLink.half_width());
                    continue;
                }
                out.insert(Part::Links, Part::Links.half_width());
                for (s, &node) in self.sw_node.iter().enumerate() {
                    if r.resources.contains(&node) {
                        sw_flows[s] += 1;
                    }
                }
                if self.rc_node.iter().any(|x| r.resources.contains(x)) {
                    out.insert(Part::RootComplex, Part::RootComplex.half_width());
                }
                if self.sock_x_up.iter().any(|x| r.resources.contains(x)) {
                    out.insert(Part::Interconnect, Part::Interconnect.half_width());
                }
            }
        }
        for (s, &flows) in sw_flows.iter().enumerate().filter(|(_, &f)| f > 0) {
            let (part, w) = (self.sw_part[s], self.sw_part[s].width(flows));
            let e = out.entry(part).or_insert(w);
            *e = e.max(w);
        }
        out
    }
}

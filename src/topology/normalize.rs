//! Checking a topology and completing what it left out (pairs, islands, defaults), so every
//! consumer sees the same whole model whatever it came from.

use super::*;

/// GPU indices are 0, 1, 2, … in list order: the one rule a topology file's checks and
/// [`Topology::normalize`] apply, first, so a repeated or missing index is named before any
/// count of pairs it throws off.
pub(crate) fn index_order(gpus: &[Gpu]) -> Result<(), String> {
    for (i, g) in gpus.iter().enumerate() {
        if g.index != i {
            let twice = gpus[..i].iter().any(|x| x.index == g.index);
            let what = if twice { ", listed twice" } else { "" };
            return Err(format!(
                "GPU at position {i} has index {}{what}; indices must be 0, 1, 2, … in order",
                g.index
            ));
        }
    }
    Ok(())
}

impl Topology {
    /// Fills derived fields and checks the model is consistent. Called on everything that
    /// enters the program, so consumers never see dangling references.
    pub fn normalize(&mut self) -> Result<(), TopologyError> {
        self.fill_and_check().map_err(TopologyError::Invalid)
    }

    fn fill_and_check(&mut self) -> Result<(), String> {
        if self.gpus.is_empty() {
            return Err("it lists no GPUs".into());
        }
        if self.gpus.len() > MAX_GPUS {
            return Err(format!(
                "it lists {} GPUs; at most {MAX_GPUS} are supported",
                self.gpus.len()
            ));
        }
        if self.switches.len() > MAX_SWITCHES {
            return Err(format!(
                "it lists {} switches; at most {MAX_SWITCHES} are supported",
                self.switches.len()
            ));
        }
        index_order(&self.gpus)?;
        for (i, g) in self.gpus.iter().enumerate() {
            if self.switch(&g.parent).is_none() && self.root_complex(&g.parent).is_none() {
                return Err(format!(
                    "GPU {i} hangs from `{}`, which is neither a switch nor a root complex",
                    g.parent
                ));
            }
            for l in &g.nvlinks {
                if let Some(r) = l.remote_gpu {
                    if r >= self.gpus.len() || r == i {
                        return Err(format!(
                            "GPU {i} NVLink {} points at GPU {r}, which does not exist",
                            l.link
                        ));
                    }
                }
            }
        }
        for s in &self.switches {
            if self.switch(&s.parent).is_none() && self.root_complex(&s.parent).is_none() {
                return Err(format!(
                    "switch `{}` hangs from `{}`, which is neither a switch nor a root complex",
                    s.id, s.parent
                ));
            }
        }
        // A cycle among switches would make ancestry never reach a root complex.
        for g in 0..self.gpus.len() {
            if !matches!(self.ancestry(g).last(), Some(Node::RootComplex(_))) {
                return Err(format!(
                    "GPU {g} does not reach a root complex; the switch parents form a cycle"
                ));
            }
        }
        for r in &self.root_complexes {
            if !self.sockets.iter().any(|s| s.id == r.socket) {
                return Err(format!(
                    "root complex `{}` is on socket {}, which is not listed",
                    r.id, r.socket
                ));
            }
        }
        for (what, link) in self.links() {
            for v in [
                link.up_gbps,
                link.down_gbps,
                link.max_flow_gbps,
                link.latency_us,
            ]
            .into_iter()
            .flatten()
            {
                if !(v.is_finite() && v > 0.0 && v < 1e6) {
                    return Err(format!(
                        "{what} has a rate or latency of {v}; it must be a positive number"
                    ));
                }
            }
        }
        let n = self.gpus.len();
        if self.pairs.is_empty() {
            // Each GPU's path to its root complex, walked once rather than once per pair.
            let ancestry: Vec<Vec<Node<'_>>> = (0..n).map(|g| self.ancestry(g)).collect();
            let mut pairs = Vec::with_capacity(n * n.saturating_sub(1));
            for a in 0..n {
                for b in 0..n {
                    if a == b {
                        continue;
                    }
                    let nv = self.nvlinks_between(a, b);
                    let path = if nv > 0 {
                        PathClass::NV
                    } else {
                        self.path_between(&ancestry[a], &ancestry[b])
                    };
                    // A file states the wiring; P2P is assumed where the path allows it.
                    let ok = if path == PathClass::SYS {
                        Status::Unknown
                    } else {
                        Status::Ok
                    };
                    pairs.push(Pair {
                        from: a,
                        to: b,
                        path,
                        nvlinks: nv,
                        p2p: P2p {
                            read: ok,
                            write: ok,
                            nvlink: if nv > 0 { Status::Ok } else { Status::No },
                            atomics: ok,
                        },
                    });
                }
            }
            drop(ancestry);
            self.pairs = pairs;
        } else {
            for p in &self.pairs {
                if p.from >= n || p.to >= n || p.from == p.to {
                    return Err(format!(
                        "pair {}→{} names a GPU that does not exist",
                        p.from, p.to
                    ));
                }
            }
            if self.pairs.len() > n * n {
                return Err("it lists the same GPU pair more than once".into());
            }
        }
        Ok(())
    }
}

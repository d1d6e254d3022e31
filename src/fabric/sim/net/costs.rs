//! What kernel traffic, a GPU serving many peers' copies and Broadcom's posted-write collapse
//! add to a max-min solve.

use super::{Engine, Flow, Net, Route};
use crate::fabric::sim::flow::Problem;
use crate::fabric::Direction;

/// How many peers' copy engines must access one GPU's memory at once before it serves them at
/// [`Calibration::copy_served_share`](crate::fabric::sim::calibration::Calibration) of its
/// port: four GPUs, three peers each. One accessor moves at the link's rate (p2pmark's
/// single reader of three peers, the staggered reads); two is unpublished and taken as one.
pub const SERVED_PEERS: usize = 3;

impl Net {
    /// Per GPU, how many distinct peers' copy engines access its memory among `flows` (a
    /// read's source, a write's destination); empty when no copy flow crosses PCIe.
    fn copy_accessors(&self, flows: &[Flow], routes: &[&Route]) -> Vec<usize> {
        let mut pairs: Vec<(usize, usize)> = flows
            .iter()
            .zip(routes)
            .filter(|(f, r)| f.engine == Engine::Copy && !r.nvlink && f.src != f.dst)
            .map(|(f, _)| match f.dir {
                Direction::Read => (f.src, f.dst),
                Direction::Write => (f.dst, f.src),
            })
            .collect();
        if pairs.is_empty() {
            return Vec::new();
        }
        pairs.sort_unstable();
        pairs.dedup();
        let mut count = vec![0usize; self.n];
        for (owner, _) in pairs {
            count[owner] += 1;
        }
        count
    }

    /// Per flow, (weight, the resource it weighs on, own cap): 1, none and no cap on NVLink
    /// and for a copy-engine flow, unless its data's owner (a read's source, a write's
    /// destination) has [`SERVED_PEERS`] or more copy accessors: then it weighs 1 / the
    /// served share on that GPU's port (four GPUs each copying with three peers move 0.54-0.68
    /// of their links, one reading three alone the link). A kernel flow weighs 1 / the lowest concurrency factor
    /// of the nodes it crosses, each at the number of distinct kernel flows crossing it, on its
    /// driving GPU's port only (the issuer's outstanding requests, a transaction limit per
    /// GPU, not a share of every resource: docs/MODEL.md), and is capped at that GPU's
    /// lone-stream share of its port rate; both as shares of the driving port
    /// ([`KernelFactors::factor_on`](crate::fabric::sim::kernel::KernelFactors::factor_on)).
    pub(super) fn kernel_costs(
        &self,
        flows: &[Flow],
        routes: &[&Route],
        order: &[usize],
    ) -> Vec<(f64, Option<usize>, f64)> {
        let kernel: Vec<bool> = flows
            .iter()
            .zip(routes)
            .map(|(f, r)| f.engine == Engine::Kernel && !r.nvlink)
            .collect();
        let seen = if kernel.iter().any(|&k| k) {
            // Only kernel flows count towards a node's kernel concurrency.
            let only: Vec<usize> = order.iter().copied().filter(|&i| kernel[i]).collect();
            self.distinct_pairs(flows, routes, &only, |x| self.kernel[x].is_some())
        } else {
            Vec::new()
        };
        let served = self.copy_accessors(flows, routes);
        let share = self.cal.copy_served_share;
        flows
            .iter()
            .zip(routes)
            .map(|(f, r)| {
                if r.nvlink {
                    return (1.0, None, f64::INFINITY);
                }
                if f.engine == Engine::Copy {
                    let (owner, port) = match f.dir {
                        Direction::Read => (f.src, self.gpu_up[f.src]),
                        Direction::Write => (f.dst, self.gpu_down[f.dst]),
                    };
                    if share < 1.0 && served.get(owner).is_some_and(|&k| k >= SERVED_PEERS) {
                        return (1.0 / share, Some(port), f64::INFINITY);
                    }
                    return (1.0, None, f64::INFINITY);
                }
                let issuer = match f.dir {
                    Direction::Write => self.gpu_up[f.src],
                    Direction::Read => self.gpu_down[f.dst],
                };
                let port = self.caps[issuer];
                let factor = r
                    .resources
                    .iter()
                    .filter_map(|&x| {
                        self.kernel[x]
                            .as_ref()
                            .map(|k| k.factor_on(f.dir, seen[x], port))
                    })
                    .fold(1.0, f64::min);
                let alone = match f.dir {
                    Direction::Write => self.gpu_alone[f.src].0,
                    Direction::Read => self.gpu_alone[f.dst].1,
                };
                (1.0 / factor, Some(issuer), alone * port)
            })
            .collect()
    }

    /// C3: bytes leaving one switch's uplink collapse to its `write_collapse_gbps`, all
    /// together, once two or more of its GPUs send to peers behind two or more different root
    /// complexes; one GPU sending to two does not trigger it. The source names posted writes;
    /// on its Broadcom box its own table collapses reads too where their completions meet the
    /// condition (16 flows across the chips: 9.0 GB/s), and not where the data leaves a
    /// partition from one GPU, so a Broadcom's condition is on the bytes, whichever side
    /// drives them. Elsewhere only posted writes: on 16 GPUs behind four Microchip switches
    /// whose writes fell to 2.6 GB/s, pulls from three other islands at once ran at full
    /// rate (local-inference-lab/b12x#139). Adds one resource per collapsing switch and
    /// returns it with its member flows.
    pub(super) fn collapse_groups(
        &self,
        flows: &[Flow],
        routes: &[&Route],
        p: &mut Problem,
    ) -> Vec<(usize, Vec<usize>)> {
        let mut out = Vec::new();
        for (s, rate) in self.sw_collapse.iter().enumerate() {
            let Some(rate) = *rate else { continue };
            let members: Vec<usize> = (0..flows.len())
                .filter(|&i| {
                    (flows[i].dir == Direction::Write || self.sw_collapse_reads[s])
                        && routes[i].dst_root.is_some()
                        && routes[i].resources.contains(&self.sw_up[s])
                })
                .collect();
            let mut roots: Vec<usize> =
                members.iter().filter_map(|&i| routes[i].dst_root).collect();
            roots.sort_unstable();
            roots.dedup();
            let mut sources: Vec<usize> = members.iter().map(|&i| flows[i].src).collect();
            sources.sort_unstable();
            sources.dedup();
            if roots.len() >= 2 && sources.len() >= 2 {
                p.caps.push(rate);
                out.push((p.caps.len() - 1, members));
            }
        }
        out
    }
}

//! Which backends a group's GPUs can run for want of P2P: the one rule a simulated tune waives
//! a backend by, and `artune check` (and every consumer of the validity rule) judges a
//! profile's choices by on another machine. A kernel that reads peers' memory needs P2P reads
//! between every pair of the group, one that writes needs P2P writes, one that does either per
//! phase needs both; one pair without them is enough to rule it out for the whole group. NCCL
//! chooses its own transports and needs neither.

use super::{Status, Topology};
use crate::allreduce::{Backend, Plane};

/// A pair of GPUs (from, to) without P2P in one direction, if there is one.
type Gap = Option<(usize, usize)>;

/// The first pair of a group (in group order) whose P2P reads, and whose P2P writes, the
/// topology states unavailable. A pair left unknown counts as working, as the model runs it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct P2pGaps {
    pub read: Gap,
    pub write: Gap,
}

impl P2pGaps {
    /// The gaps of `t` between the GPUs of `gpus`.
    pub fn of(t: &Topology, gpus: &[usize]) -> P2pGaps {
        let first = |write: bool| {
            gpus.iter().find_map(|&a| {
                gpus.iter().filter(|&&b| b != a).find_map(|&b| {
                    let status = t.pair(a, b).map_or(Status::Unknown, |p| match write {
                        false => p.p2p.read,
                        true => p.p2p.write,
                    });
                    (status == Status::No).then_some((a, b))
                })
            })
        };
        P2pGaps {
            read: first(false),
            write: first(true),
        }
    }

    /// Why `backend` cannot run on the group for want of P2P, if it cannot.
    pub fn waiver(&self, backend: Backend) -> Option<String> {
        let needs: &[(Gap, &str, &str)] = match backend.spec().plane {
            Plane::Nccl => return None,
            Plane::Pull => &[(self.read, "read", "reads")],
            Plane::Push => &[(self.write, "write", "writes")],
            Plane::PerPhase => &[
                (self.read, "read", "reads or writes"),
                (self.write, "write", "reads or writes"),
            ],
        };
        needs.iter().find_map(|&(gap, what, needed)| {
            gap.map(|(a, b)| {
                format!(
                    "P2P {what} is not available from GPU {a} to GPU {b}, and {backend} {needed} peer memory directly"
                )
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pair_without_p2p_rules_out_the_kernels_that_need_it_for_its_groups_only() {
        let mut t = crate::topology::presets::get("pcie-4x-1switch").unwrap();
        for p in t.pairs.iter_mut() {
            if (p.from, p.to) == (0, 1) {
                p.p2p.write = Status::No;
            }
        }
        let gaps = P2pGaps::of(&t, &[0, 1, 2, 3]);
        assert_eq!(gaps.read, None);
        assert_eq!(gaps.write, Some((0, 1)));
        let why = gaps.waiver(Backend::OneStagePush).unwrap();
        assert!(
            why.contains("P2P write is not available from GPU 0 to GPU 1"),
            "{why}"
        );
        assert_eq!(gaps.waiver(Backend::Nccl), None);
        assert_eq!(gaps.waiver(Backend::OneStagePull), None);
        // The other pair's group keeps every kernel.
        let other = P2pGaps::of(&t, &[2, 3]);
        assert_eq!(other, P2pGaps::default());
        assert_eq!(other.waiver(Backend::OneStagePush), None);
    }
}

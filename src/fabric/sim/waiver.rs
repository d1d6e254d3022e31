//! Why a backend cannot run on a group: no islands for an island schedule, LL128 off for
//! NCCL, or a pair of GPUs without the P2P reads or writes a kernel needs.

use super::{nccl, Backend, Direction, Group, SimFabric};
use crate::allreduce::Plane;
use crate::topology::Status;

impl SimFabric {
    /// The pairs whose P2P the file leaves unknown (as the driver reports across sockets on
    /// some hosts), which the model runs as working: said, since topo and doctor show "?".
    pub(super) fn unknown_p2p(&self) -> Option<String> {
        let unknown: Vec<String> = self
            .topo
            .pairs
            .iter()
            .filter(|p| p.from < p.to)
            .filter(|p| [p.p2p.read, p.p2p.write].contains(&Status::Unknown))
            .map(|p| format!("{}-{}", p.from, p.to))
            .collect();
        let shown = match unknown.len() {
            0 => return None,
            n if n > 4 => format!("{} ...", unknown[..4].join(", ")),
            _ => unknown.join(", "),
        };
        Some(format!(
            "P2P reads and writes not stated for {} of the GPU pairs ({shown}): modelled as working, at the paths' rates; `doctor --measure` on the machine tells",
            unknown.len()
        ))
    }

    /// The first pair of `gpus` (in group order) without P2P in `dir`, if any.
    pub(super) fn no_p2p(&self, gpus: &[usize], dir: Direction) -> Option<(usize, usize)> {
        gpus.iter().find_map(|&a| {
            gpus.iter().filter(|&&b| b != a).find_map(|&b| {
                let p2p = self.topo.pair(a, b).map(|p| &p.p2p);
                let status = p2p.map_or(Status::Unknown, |p| match dir {
                    Direction::Read => p.read,
                    Direction::Write => p.write,
                });
                (status == Status::No).then_some((a, b))
            })
        })
    }

    /// Why `backend` cannot run on `group`, if it cannot, given the first pair without P2P
    /// reads and writes ([`SimFabric::no_p2p`], found once per group).
    pub(super) fn waiver(
        backend: Backend,
        group: &Group,
        model: &nccl::Model,
        no_p2p: [Option<(usize, usize)>; 2],
    ) -> Option<String> {
        if backend.is_hierarchical() {
            if let Err(why) = &group.islands {
                return Some(why.clone());
            }
        }
        let needs: &[(usize, &str, &str)] = match backend.spec().plane {
            Plane::Nccl => {
                return match backend.nccl_pin() {
                    Some((_, crate::fabric::NcclProto::LL128)) => model.ll128_off.clone(),
                    _ => None,
                }
            }
            Plane::Pull => &[(0, "read", "reads")],
            Plane::Push => &[(1, "write", "writes")],
            Plane::PerPhase => &[
                (0, "read", "reads or writes"),
                (1, "write", "reads or writes"),
            ],
        };
        needs.iter().find_map(|&(dir, what, needed)| {
            no_p2p[dir].map(|(a, b)| {
                format!(
                    "P2P {what} is not available from GPU {a} to GPU {b}, and {backend} {needed} peer memory directly"
                )
            })
        })
    }
}

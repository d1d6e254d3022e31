//! Why a backend cannot run on a group: no islands for an island schedule, LL128 off for
//! NCCL, or a pair of GPUs without the P2P reads or writes a kernel needs.

use super::{nccl, Backend, Group, SimFabric};
use crate::topology::p2p::P2pGaps;
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

    /// Why `backend` cannot run on `group`, if it cannot, given the group's first pairs
    /// without P2P reads and writes (found once per group; the rule is [`P2pGaps::waiver`]).
    pub(super) fn waiver(
        backend: Backend,
        group: &Group,
        model: &nccl::Model,
        no_p2p: &P2pGaps,
    ) -> Option<String> {
        if backend.is_hierarchical() {
            if let Err(why) = &group.islands {
                return Some(why.clone());
            }
        }
        match backend.nccl_pin() {
            Some((_, crate::fabric::NcclProto::LL128)) => model.ll128_off.clone(),
            _ => no_p2p.waiver(backend),
        }
    }
}

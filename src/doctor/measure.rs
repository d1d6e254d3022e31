//! `--measure`: P2P verified by real transfers through peer memory, over the fabric seam.
//!
//! For each GPU pair, a two-rank group runs a one-stage allreduce that reads the peer's buffer
//! (pull) and one that writes into it (push), on fresh random data checked against a host
//! reference. A driver that reports P2P but corrupts data or hangs shows up here: the fabric's
//! watchdog turns a hang into a timeout.

use super::facts::PairTransfer;
use crate::allreduce::{Backend, Dtype, Readiness};
use crate::fabric::{Fabric, FabricError, Group, Verification};

/// Bytes each transfer check moves: big enough to cross many pages, small enough for any BAR1.
pub const BYTES: u64 = 1 << 20;

const BACKENDS: [Backend; 2] = [Backend::OneStagePull, Backend::OneStagePush];

/// Checks every unordered pair of the fabric's GPUs that the driver does not refuse P2P (a
/// refused pair failing is no news); an error only when the fabric itself fails (an interrupt,
/// a request it refuses), not when a pair does.
pub fn pairs(fabric: &mut dyn Fabric) -> Result<Vec<PairTransfer>, FabricError> {
    let n = fabric.topology().gpu_count();
    let refused = |t: &crate::topology::Topology, a: usize, b: usize| {
        t.pair(a, b).is_some_and(|p| {
            p.p2p.read == crate::topology::Status::No || p.p2p.write == crate::topology::Status::No
        })
    };
    let mut out = Vec::new();
    for a in 0..n {
        for b in a + 1..n {
            let t = fabric.topology();
            if refused(t, a, b) || refused(t, b, a) {
                continue;
            }
            out.push(PairTransfer {
                a,
                b,
                result: pair(fabric, a, b)?,
            });
        }
    }
    // A GPU left stuck by a hung pair fails the release too; the pairs already say so.
    let _ = fabric.release();
    Ok(out)
}

fn pair(
    fabric: &mut dyn Fabric,
    a: usize,
    b: usize,
) -> Result<Result<String, String>, FabricError> {
    let group = Group::flat(vec![a, b], Dtype::Bf16, BYTES);
    let ready = match fabric.prepare(&group, &BACKENDS) {
        Ok(r) => r,
        Err(e) if e.backend_local() => return Ok(Err(e.to_string())),
        Err(e @ (FabricError::Device(_) | FabricError::Worker(_))) => {
            return Ok(Err(e.to_string()))
        }
        Err(e) => return Err(e),
    };
    let mut ran = Vec::new();
    for r in ready {
        let backend = match r {
            Readiness::Ready { backend, .. } => backend,
            Readiness::Waived { backend, reason } => {
                return Ok(Err(format!("{backend} could not be set up: {reason}")))
            }
        };
        match fabric.verify(backend, BYTES, 0x0d0c + (a * 64 + b) as u64) {
            Ok(Verification::Correct) => ran.push(backend.id()),
            Ok(Verification::Wrong { reason }) => {
                return Ok(Err(format!("{backend} gave wrong data: {reason}")))
            }
            Err(e) if e.backend_local() => return Ok(Err(e.to_string())),
            Err(e) => return Err(e),
        }
    }
    Ok(Ok(format!(
        "{} of {} each way came out right",
        ran.join(" and "),
        crate::units::fmt_bytes(BYTES)
    )))
}

/// The topology with each GPU's link replaced by a reading taken under load.
pub fn with_links(
    t: &crate::topology::Topology,
    readings: &[crate::topology::reading::LinkReading],
) -> crate::topology::Topology {
    let mut t = t.clone();
    let small = |v: Option<u32>| v.and_then(|x| u8::try_from(x).ok());
    for r in readings {
        let same = |b: &str| {
            crate::topology::sysfs::normalize_bus_id(b)
                == crate::topology::sysfs::normalize_bus_id(&r.bus_id)
        };
        if let Some(g) = t
            .gpus
            .iter_mut()
            .find(|g| g.bus_id.as_deref().is_some_and(same))
        {
            g.pcie.gen = small(r.gen).or(g.pcie.gen);
            g.pcie.width = small(r.width).or(g.pcie.width);
            g.pcie.max_gen = small(r.max_gen).or(g.pcie.max_gen);
            g.pcie.max_width = small(r.max_width).or(g.pcie.max_width);
        }
    }
    t.origin.link_reading = "load".into();
    t
}

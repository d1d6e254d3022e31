//! What the simulator computes once per GPU group, and where it keeps it.

use std::collections::{BTreeMap, HashMap};

use super::band::{self, Band, GroupParts};
use super::copy::{self, CopyEngines};
use super::custom::{self, Custom};
use super::memo::BySize;
use super::net::Net;
use super::probe::ProbePattern;
use super::{nccl, Backend, Direction, Islands, Mode, NcclAlgo};
use crate::allreduce::Peers;
use crate::topology::Topology;

/// A family's band on a group, fixed side and data side, each as ln of its (low, high)
/// factors, and whether any part assumed what the topology did not state:
/// [`band::Band::split`] precomputed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Halves {
    pub(super) fixed: (f64, f64),
    pub(super) data: (f64, f64),
    pub(super) assumed: bool,
}

impl Halves {
    pub(super) fn of(fixed: Band, data: Band) -> Halves {
        Halves {
            fixed: (fixed.low.ln(), fixed.high.ln()),
            data: (data.low.ln(), data.high.ln()),
            assumed: fixed.parts.union(&data.parts).any(|p| p.assumed()),
        }
    }

    /// (low, high) for a time of `f` µs fixed costs and `d` µs data.
    pub(super) fn ends(&self, f: f64, d: f64) -> (f64, f64) {
        let (f, d) = band::shares(f, d);
        (
            f * self.fixed.0.exp() + d * self.data.0.exp(),
            f * self.fixed.1.exp() + d * self.data.1.exp(),
        )
    }
}

/// Everything computed once per GPU group.
#[derive(Debug, Clone)]
pub(super) struct GroupModel {
    pub(super) nccl: nccl::Model,
    pub(super) schedule: nccl::StepSchedule,
    /// NCCL's ring at each channel count a sweep asked for: its flows' rates are solved once
    /// per count, not once per pin and size.
    pub(super) at_channels: BTreeMap<u32, nccl::StepSchedule>,
    pub(super) custom: Custom,
    pub(super) copy: CopyEngines,
    /// The model parts the group's times use, for their error bands.
    pub(super) parts: GroupParts,
    /// Noiseless times per (backend, mode) and bytes.
    pub(super) cache: BySize<(Backend, Mode), f64>,
    /// [`SimFabric::model_split`] per backend and bytes, which every measured cell asks for.
    pub(super) splits: BySize<Backend, (f64, f64)>,
    /// NCCL's device time with no bytes, per algorithm and protocol.
    pub(super) fixed: HashMap<(NcclAlgo, crate::fabric::NcclProto), f64>,
    /// The custom kernels' and NCCL's band half-widths on this group, and the island
    /// schedules' where it has islands.
    pub(super) custom_halves: Halves,
    pub(super) island_halves: Option<Halves>,
    pub(super) nccl_halves: Halves,
    pub(super) copy_halves: Halves,
    pub(super) probes: HashMap<(Direction, usize), ProbePattern>,
}

impl GroupModel {
    /// Forgets the times and splits of the backends `drop` picks.
    pub(super) fn forget(&mut self, drop: impl Fn(Backend) -> bool + Copy) {
        self.cache.forget(drop);
        self.splits.forget(drop);
    }
}

/// The fabric parts of the island schedules' phases, each phase's flows alone (inside the
/// islands, then between counterparts), a part at the wider of its two widths.
fn island_parts(net: &Net, gpus: &[usize], islands: &Islands) -> BTreeMap<band::BandPart, f64> {
    let mut out = BTreeMap::new();
    for peers in [Peers::Island, Peers::Counterparts] {
        for (p, w) in net.parts_of(&custom::pairs(gpus, Some(islands), peers)) {
            let e = out.entry(p).or_insert(w);
            *e = e.max(w);
        }
    }
    out
}

/// A group model's key: its GPUs and its islands.
pub(super) type ModelKey = (Vec<usize>, Option<Vec<Vec<usize>>>);

/// Where the model of `gpus` in `islands` is in `models`, built on first use. A tune has a few
/// groups, so a scan beats hashing the key on every call.
pub(super) fn group_model(
    models: &mut Vec<(ModelKey, GroupModel)>,
    topo: &Topology,
    net: &Net,
    host: &nccl::Host,
    gpus: &[usize],
    islands: Option<&Islands>,
) -> usize {
    let same = |k: &ModelKey| {
        k.0 == gpus
            && match (&k.1, islands) {
                (None, None) => true,
                (Some(a), Some(b)) => *a == b.gpus,
                _ => false,
            }
    };
    if let Some(i) = models.iter().position(|(k, _)| same(k)) {
        return i;
    }
    let key = (gpus.to_vec(), islands.map(|i| i.gpus.clone()));
    models.push((key, {
        let ring = nccl::ring_order(topo, gpus);
        let model = nccl::Model::new(topo, net, host, &ring);
        let schedule = nccl::StepSchedule::new(topo, net, host, &ring, &model);
        let parts = GroupParts {
            fabric: net.parts(gpus),
            host_stated: host.cpu != nccl::Cpu::Unknown,
            islands: islands.map(|i| island_parts(net, gpus, i)),
        };
        let island_halves = parts.islands.as_ref().map(|_| {
            Halves::of(
                parts.custom_of(true, 1.0, 0.0),
                parts.custom_of(true, 0.0, 1.0),
            )
        });
        GroupModel {
            nccl: model,
            schedule,
            at_channels: BTreeMap::new(),
            custom: Custom::new(net, gpus, islands).with_prologue(custom::fixed::prologue_us(
                topo,
                gpus,
                net.calibration(),
            )),
            copy: CopyEngines::new(net, gpus, islands),
            copy_halves: Halves::of(copy::band(&parts, 1.0, 0.0), copy::band(&parts, 0.0, 1.0)),
            custom_halves: Halves::of(parts.custom(1.0, 0.0), parts.custom(0.0, 1.0)),
            island_halves,
            nccl_halves: Halves::of(parts.nccl(1.0, 0.0), parts.nccl(0.0, 1.0)),
            parts,
            fixed: HashMap::new(),
            cache: BySize::new(),
            splits: BySize::new(),
            probes: HashMap::new(),
        }
    }));
    models.len() - 1
}

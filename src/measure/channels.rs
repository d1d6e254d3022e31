//! Channels as a tuned dimension (issue 48): for every pinned NCCL variant and measured size,
//! the channel count that runs fastest among NCCL's own and powers of two, which the profile
//! records per bucket for the tuner plugin to set with that size's pin.

use std::collections::{BTreeMap, BTreeSet};

use crate::allreduce::Backend;
use crate::fabric::Fabric;

/// The counts tried besides NCCL's own: NCCL's per-call maximum is 32 for a ring on one node
/// (MAXCHANNELS 64, half of them for the other direction).
pub const TRIED: [u32; 5] = [2, 4, 8, 16, 32];

/// A larger count must beat a smaller one by this fraction to be kept: more channels cost
/// NCCL buffers and SMs, and on a tie (the links full) the smaller count is as fast.
pub const MIN_GAIN: f64 = 0.01;

/// Per pinned variant in `ready`, per size, the count measured fastest (the smallest within
/// [`MIN_GAIN`]). None where the fabric cannot set NCCL's channels per call.
pub fn sweep(
    fabric: &mut dyn Fabric,
    ready: &[Backend],
    sizes: &BTreeSet<u64>,
) -> Option<BTreeMap<Backend, BTreeMap<u64, u32>>> {
    let own = fabric.nccl_channels();
    let mut counts: Vec<u32> = TRIED.iter().copied().chain(own).collect();
    counts.sort_unstable();
    counts.dedup();
    let mut best = BTreeMap::new();
    for &pin in ready.iter().filter(|b| b.nccl_pin().is_some()) {
        let mut at = BTreeMap::new();
        for &bytes in sizes {
            let mut fastest: Option<(f64, u32)> = None;
            for &c in &counts {
                let us = fabric.nccl_time_at_channels(pin, bytes, c)?;
                if fastest.is_none_or(|(t, _)| us < t * (1.0 - MIN_GAIN)) {
                    fastest = Some((us, c));
                }
            }
            if let Some((_, c)) = fastest {
                at.insert(bytes, c);
            }
        }
        best.insert(pin, at);
    }
    Some(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allreduce::Dtype;
    use crate::fabric::sim::SimFabric;
    use crate::fabric::Group;
    use crate::topology::presets;

    #[test]
    fn the_sweep_keeps_the_count_that_ran_fastest_per_pin_and_size() {
        let mut f = SimFabric::new(presets::get("pcie-8x-2switch").unwrap(), 42);
        let ready = [Backend::Nccl, Backend::NcclRingSimple];
        let g = Group::flat((0..8).collect(), Dtype::Bf16, 1 << 28);
        f.prepare(&g, &ready).unwrap();
        let sizes: BTreeSet<u64> = [1 << 28].into();
        let best = sweep(&mut f, &ready, &sizes).unwrap();
        assert!(
            !best.contains_key(&Backend::Nccl),
            "NCCL's own choice is no pin"
        );
        // Two channels are held to C6's 22.2 GB/s; from four the links are full.
        let c = best[&Backend::NcclRingSimple][&(1 << 28)];
        assert_eq!(
            c, 4,
            "past four the links are full: no more channels than that"
        );
        let us =
            |f: &mut SimFabric, c| f.nccl_time_at_channels(Backend::NcclRingSimple, 1 << 28, c);
        assert!(us(&mut f, c).unwrap() < 0.6 * us(&mut f, 2).unwrap());
    }

    /// The count the fabric reports (the profile's `nccl_channels`, what the plugin sets) is
    /// the run-time count NCCL runs unforced: forcing it changes no time.
    #[test]
    fn the_reported_count_is_the_one_nccl_runs_unforced() {
        let mut f = SimFabric::new(presets::get("pcie-8x-2switch").unwrap(), 42);
        let g = Group::flat((0..8).collect(), Dtype::Bf16, 1 << 28);
        f.prepare(&g, &[Backend::NcclRingSimple]).unwrap();
        let own = f.nccl_channels().unwrap();
        assert_eq!(own, 4, "the search's two channels run as four");
        for bytes in [1 << 16, 1 << 28] {
            let (fixed, added) = f.model_split(Backend::NcclRingSimple, bytes).unwrap();
            let forced = f
                .nccl_time_at_channels(Backend::NcclRingSimple, bytes, own)
                .unwrap();
            assert!(
                (forced - (fixed + added)).abs() < 1e-9,
                "{forced} {fixed}+{added}"
            );
        }
    }
}

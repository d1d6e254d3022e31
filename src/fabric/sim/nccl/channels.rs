//! NCCL at a channel count it is told to run (a tuner's `nChannels`, `NCCL_MIN_NCHANNELS`)
//! rather than the one its ring search found. Each runtime channel moves at most C6's
//! per-channel rate over PCIe (`Calibration::nccl_channel_gbps`: NCCL's defaults on a dual-AMD
//! box reach 22.2 GB/s busbw at 32 MB with one search channel run as two, 11.1 each; the same
//! box tuned reaches 37.6), so on PCIe the time falls with the count until the links are full.

use super::{Model, StepSchedule, RUNTIME_CHANNELS_PER_GRAPH_CHANNEL};
use crate::fabric::sim::SimFabric;
use crate::fabric::{Group, NcclAlgo, NcclProto};

impl Model {
    /// The model running `runtime` channels: NCCL duplicates every graph channel at run time,
    /// so the count rounds up to whole graph channels.
    pub fn at_channels(&self, runtime: u32) -> Model {
        Model {
            channels: runtime.div_ceil(RUNTIME_CHANNELS_PER_GRAPH_CHANNEL).max(1),
            ..self.clone()
        }
    }
}

impl SimFabric {
    /// NCCL's channels at run time on `group` when nothing forces a count.
    pub fn nccl_runtime_channels(&self, group: &Group) -> u32 {
        self.nccl_search_channels(group) * RUNTIME_CHANNELS_PER_GRAPH_CHANNEL
    }

    /// The noiseless time (µs) of NCCL's `algo` x `proto` on `group` for `bytes` with
    /// `runtime` channels; None for a group of fewer than two GPUs of this topology.
    pub fn nccl_us_at(
        &self,
        group: &Group,
        algo: NcclAlgo,
        proto: NcclProto,
        bytes: u64,
        runtime: u32,
    ) -> Option<f64> {
        Some(
            self.nccl_schedule_at(group, runtime)?
                .time(algo, proto, bytes),
        )
    }

    /// The channels NCCL runs one operation of `bytes` on, of those it has at run time
    /// (enqueue.cc: fewer while each thread would get less than its threshold); None for a
    /// group of fewer than two GPUs of this topology.
    pub fn nccl_op_channels(
        &self,
        group: &Group,
        algo: NcclAlgo,
        proto: NcclProto,
        bytes: u64,
    ) -> Option<f64> {
        let runtime = self.nccl_runtime_channels(group);
        Some(
            self.nccl_schedule_at(group, runtime)?
                .op_channels(algo, proto, bytes),
        )
    }

    /// NCCL's ring on `group` running `runtime` channels, whatever the algorithm, protocol or
    /// bytes: what a channel sweep builds once per count and times at every size.
    pub(in crate::fabric::sim) fn nccl_schedule_at(
        &self,
        group: &Group,
        runtime: u32,
    ) -> Option<StepSchedule> {
        let ring = self.nccl_ring(group)?;
        let model = Model::new(&self.topo, &self.net, &self.host, &ring).at_channels(runtime);
        Some(StepSchedule::new(
            &self.topo, &self.net, &self.host, &ring, &model,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::sim::calibration::Calibration;
    use crate::fabric::Dtype;
    use crate::topology::presets;

    /// Bus bandwidth (GB/s) of Ring Simple at 256 MiB on 8 PCIe GPUs with `runtime` channels.
    fn busbw(runtime: u32) -> f64 {
        let f = SimFabric::new(presets::get("pcie-8x-2switch").unwrap(), 42);
        let g = Group::flat((0..8).collect(), Dtype::Bf16, 1 << 28);
        let bytes = 1u64 << 28;
        let us = f
            .nccl_us_at(&g, NcclAlgo::Ring, NcclProto::Simple, bytes, runtime)
            .unwrap();
        bytes as f64 / (us * 1e3) * 2.0 * 7.0 / 8.0
    }

    #[test]
    fn each_channel_moves_at_most_c6s_rate() {
        let per = Calibration::fitted().nccl_channel_gbps;
        assert!((per - 11.1).abs() < 1e-9);
        let (two, four, sixteen) = (busbw(2), busbw(4), busbw(16));
        eprintln!("busbw 2/4/16 channels: {two:.1} {four:.1} {sixteen:.1}");
        // Two channels are held to C6's 22.2 GB/s (within the protocol's overheads).
        assert!(two <= 2.0 * per && two > 0.8 * 2.0 * per, "{two}");
        // More channels lift the cap until the links are full.
        assert!(four > 1.5 * two, "{four} vs {two}");
        assert!(sixteen >= four);
    }

    #[test]
    fn the_runtime_count_rounds_up_to_graph_channels() {
        let f = SimFabric::new(presets::get("pcie-8x-2switch").unwrap(), 42);
        let g = Group::flat((0..8).collect(), Dtype::Bf16, 1 << 20);
        assert_eq!(f.nccl_runtime_channels(&g), 4);
        let us = |c| f.nccl_us_at(&g, NcclAlgo::Ring, NcclProto::Simple, 1 << 20, c);
        assert_eq!(us(3), us(4));
        assert!(f
            .nccl_us_at(
                &Group::flat(vec![0], Dtype::Bf16, 1),
                NcclAlgo::Ring,
                NcclProto::LL,
                8,
                2
            )
            .is_none());
    }
}

//! A kernel's fixed cost by GPU class: what a call of one of our kernels costs on the GPU
//! before its first flag or byte moves (block scheduling, loading arguments and peer
//! pointers), beside the launch (sim/mod.rs) and the crossings the schedule prices. It is a
//! property of the GPU that runs the kernel, so each class takes its own figure, from a
//! timing of a kernel whose crossings the model prices on that class:
//! - Blackwell workstation (sm_12x, RTX PRO 6000): the published one-shots (C2's 1 KB,
//!   without C2 R1's; `Calibration::kernel_prologue_us`).
//! - Hopper (sm_9x, H100/H200): artune's one-stage push LL form at 4 KiB per rank in CUDA
//!   graphs on one H200, 3.25 µs (profiles/hardware/h200/2026-12-04-pullll, bench.txt, `artune
//!   bench kernels --loopback 8`): its lines land in the GPU's own memory, so the call is the
//!   graph launch, the prologue and a poll of a flag (its local line traffic, under 0.1 µs,
//!   aside).
//! - Any other class, or a GPU that states none: no kernel timing of it is published, so it
//!   takes the Blackwell figure, the one class timed over PCIe.

use crate::fabric::sim::calibration::Calibration;
use crate::fabric::sim::kernel::FLAG_POLL_US;
use crate::fabric::sim::LAUNCH_GRAPH_US;
use crate::topology::Topology;

/// The H200 loopback timing above, µs per call.
const H200_ONE_STAGE_PUSH_LL_4K_US: f64 = 3.25;

/// The GPU classes whose kernel fixed cost has a figure of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuClass {
    /// sm_12x: RTX PRO 6000, RTX 5090.
    Blackwell,
    /// sm_9x: H100, H200.
    Hopper,
    /// Another class, or none stated.
    Other,
}

impl GpuClass {
    /// The class of GPU `index` of `topo`, from its compute capability.
    pub fn of(topo: &Topology, index: usize) -> GpuClass {
        let cc = topo
            .gpus
            .iter()
            .find(|g| g.index == index)
            .and_then(|g| g.compute_capability);
        match cc.map(|c| c.major) {
            Some(12) => GpuClass::Blackwell,
            Some(9) => GpuClass::Hopper,
            _ => GpuClass::Other,
        }
    }

    /// The kernel's prologue on this class, µs.
    pub fn prologue_us(self, cal: &Calibration) -> f64 {
        match self {
            GpuClass::Hopper => H200_ONE_STAGE_PUSH_LL_4K_US - LAUNCH_GRAPH_US - FLAG_POLL_US,
            GpuClass::Blackwell | GpuClass::Other => cal.kernel_prologue_us,
        }
    }
}

/// The prologue of a call on `gpus`: the slowest rank's, since every rank waits for all.
pub fn prologue_us(topo: &Topology, gpus: &[usize], cal: &Calibration) -> f64 {
    gpus.iter()
        .map(|&g| GpuClass::of(topo, g).prologue_us(cal))
        .fold(0.0, f64::max)
}

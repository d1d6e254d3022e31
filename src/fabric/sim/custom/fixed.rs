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
//!
//! Beside the prologue, a call's fixed cost is its launch, its flag polls and its first
//! touches over PCIe: each barrier's flags and each phase's first bytes cross the path's
//! latency (a read a round trip), so that part grows with the hops of the group's routes
//! (switch, root complex, socket) and with the phases and barriers of its form, and nothing
//! else ([`KernelCost`]).

use super::{Custom, Step, REDUCE_FIXED_US};
use crate::allreduce::{Directions, Executor};
use crate::fabric::sim::band::Band;
use crate::fabric::sim::calibration::Calibration;
use crate::fabric::sim::kernel::FLAG_POLL_US;
use crate::fabric::sim::{SimFabric, LAUNCH_EAGER_CUSTOM_US, LAUNCH_GRAPH_US};
use crate::fabric::{Backend, Direction, Mode};
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

/// Which form of a kernel to price: the one the real kernel runs at the size, or its
/// bandwidth form (barriers, no LL lines) whatever the size, as kernels without an LL form
/// run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    AsRun,
    Bandwidth,
}

/// One call of a kernel, µs, in the parts its time is made of.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KernelCost {
    /// Graph replay or eager launch.
    pub launch_us: f64,
    /// The GPU class's prologue ([`GpuClass::prologue_us`]).
    pub prologue_us: f64,
    /// Waiting for a flag to land in the GPU's own memory, once per barrier or LL phase.
    pub polls_us: f64,
    /// First touch over PCIe: the path latency each barrier's flags and each phase's first
    /// bytes cross (two for a read), a function of the route's hops.
    pub first_touch_us: f64,
    /// Starting each pass over the GPU's own memory (the sum, staging copies).
    pub local_us: f64,
    /// What the bytes add, on the wire and in the GPU's own memory.
    pub data_us: f64,
}

impl KernelCost {
    /// The call's time: every part.
    pub fn total(&self) -> f64 {
        self.fixed() + self.data_us
    }

    /// What the call costs with no bytes.
    pub fn fixed(&self) -> f64 {
        self.launch_us + self.prologue_us + self.polls_us + self.first_touch_us + self.local_us
    }
}

impl Custom {
    /// [`KernelCost`] of `backend` at `bytes` in `form`, launch excluded.
    fn cost_parts(
        &self,
        backend: Backend,
        bytes: u64,
        form: Form,
        directions: Option<&Directions>,
    ) -> KernelCost {
        let ll = match form {
            Form::AsRun => backend.ll_at(bytes),
            Form::Bandwidth => None,
        };
        let mut c = KernelCost {
            prologue_us: self.prologue_us,
            ..KernelCost::default()
        };
        for step in self.steps_as(backend, ll, bytes as f64, directions) {
            let all = self.cost(step);
            match step {
                Step::Barrier(p) => {
                    c.first_touch_us += self.pattern(p).max_latency_us;
                    c.polls_us += FLAG_POLL_US;
                }
                Step::Transfer {
                    peers, dir, lines, ..
                } => {
                    let hops = match dir {
                        Direction::Read => 2.0,
                        Direction::Write => 1.0,
                    };
                    let touch = hops * self.pattern(peers).max_latency_us;
                    let poll = if lines && dir == Direction::Write {
                        FLAG_POLL_US
                    } else {
                        0.0
                    };
                    c.first_touch_us += touch;
                    c.polls_us += poll;
                    c.data_us += all - touch - poll;
                }
                Step::Local { pass, .. } => {
                    let fixed = if pass { REDUCE_FIXED_US } else { 0.0 };
                    c.local_us += fixed;
                    c.data_us += all - fixed;
                }
            }
        }
        c
    }
}

impl SimFabric {
    /// A call of `backend` at `bytes` on the prepared group in `mode`, in its parts, the form
    /// `form`; None for a backend that is not one of our SM kernels or with no group prepared.
    /// For the form the kernel runs, its total is the simulated noiseless time.
    pub fn kernel_cost(
        &mut self,
        backend: Backend,
        bytes: u64,
        mode: Mode,
        form: Form,
    ) -> Option<KernelCost> {
        if backend.executor() != Executor::SmKernel {
            return None;
        }
        let p = self.prepared.as_ref()?;
        let m = &self.models[p.model].1;
        let mut c = m
            .custom
            .cost_parts(backend, bytes, form, p.directions.as_ref());
        c.launch_us = match mode {
            Mode::Graph => LAUNCH_GRAPH_US,
            Mode::Eager => LAUNCH_EAGER_CUSTOM_US,
        };
        Some(c)
    }

    /// The band of a kernel's call priced as `cost`: its fixed side (launch excluded, as
    /// [`SimFabric::band`]) and its bytes.
    pub fn kernel_band(&mut self, cost: &KernelCost) -> Option<Band> {
        let gpus = self.prepared.as_ref()?.group.gpus.clone();
        let parts = &self.model(&gpus).parts;
        let fixed = cost.fixed() - cost.launch_us;
        Some(parts.custom(fixed, cost.data_us))
    }
}

//! Which kernel-traffic and collapse behaviour came from defaults, said in words for `show`.

use super::{BROADCOM_COLLAPSE_GBPS, FORWARDING_DEFAULT};
use crate::fabric::sim::calibration::KernelRates;
use crate::fabric::sim::kernel::{KernelFactors, NodeKind};
use crate::fabric::Direction;

/// Nodes whose kernel-traffic or collapse behaviour came from defaults, by kind.
#[derive(Debug, Default)]
pub(super) struct Assumed {
    pub(super) microchip: Vec<String>,
    broadcom: Vec<String>,
    unstated: Vec<String>,
    cpu: Vec<String>,
    pub(super) collapse: Vec<String>,
    pub(super) forwarding: Vec<String>,
}

impl Assumed {
    pub(super) fn kernel(&mut self, kind: NodeKind, what: String) {
        match kind {
            NodeKind::Microchip => self.microchip.push(what),
            NodeKind::Broadcom => self.broadcom.push(what),
            NodeKind::Cpu => self.cpu.push(what),
            NodeKind::Unstated => self.unstated.push(what),
        }
    }

    /// The assumptions in words, quoting the kernel defaults fitted as `rates`.
    pub(super) fn into_words(self, rates: Option<&KernelRates>) -> Vec<String> {
        let pct = |k: &KernelFactors, dir, flows| 100.0 * k.factor(dir, flows);
        let (m, b) = (
            KernelFactors::default_for(NodeKind::Microchip, rates),
            KernelFactors::default_for(NodeKind::Broadcom, rates),
        );
        let mut out = Vec::new();
        if !self.microchip.is_empty() {
            out.push(format!(
                "kernel traffic through {} (Microchip): calibration C5, one kernel stream reaches {:.1}% (stores) / {:.1}% (loads) of its link, and with 12 or more kernel flows through the switch {:.1}% / {:.1}% of the copy-engine capacity",
                self.microchip.join(", "),
                100.0 * m.store_alone,
                100.0 * m.load_alone,
                pct(&m, Direction::Write, 12),
                pct(&m, Direction::Read, 12),
            ));
        }
        if !self.broadcom.is_empty() {
            out.push(format!(
                "kernel traffic through {} (Broadcom): C5's curves with directions swapped, as Broadcom keeps reads better than writes (C3): stores {:.1}%, loads {:.1}% of the copy-engine capacity at 12 or more kernel flows",
                self.broadcom.join(", "),
                pct(&b, Direction::Write, 12),
                pct(&b, Direction::Read, 12),
            ));
        }
        if !self.unstated.is_empty() {
            let u = KernelFactors::default_for(NodeKind::Unstated, rates);
            out.push(format!(
                "switch make not stated for {} (switches[].vendor): kernel traffic takes the middle of the Microchip and Broadcom data, {:.1}% of the copy-engine capacity both ways at 12 or more kernel flows, with the widest model band (either make's curve may hold)",
                self.unstated.join(", "),
                pct(&u, Direction::Write, 12),
            ));
        }
        if !self.cpu.is_empty() {
            out.push(format!(
                "kernel traffic through {}: no worse than copy-engine traffic under contention (C2: one-shot pulls match the copy-engine all-to-all rate)",
                self.cpu.join(", ")
            ));
        }
        if !self.forwarding.is_empty() {
            let d = FORWARDING_DEFAULT;
            out.push(format!(
                "forwarding under many flows not stated for {} (contention.peak_gbps): C1's measured switch curve, {:.0} GB/s over five Gen5 x16 ports up to {} flows and 1/(1 + {} per flow) past them; a switch takes it scaled to its ports (the peak by their rate, the knee and slope by their count), a socket fabric as it is; custom kernels' model band is widened for it (no other make's aggregate is published)",
                self.forwarding.join(", "),
                d.peak_gbps.unwrap_or_default(),
                d.knee_flows.unwrap_or_default(),
                d.slope.unwrap_or_default(),
            ));
        }
        if !self.collapse.is_empty() {
            out.push(format!(
                "bytes leaving {} (Broadcom PEX890xx) collapse to {BROADCOM_COLLAPSE_GBPS} GB/s when two or more of its GPUs send to peers behind different root complexes, pushed or pulled (C3)",
                self.collapse.join(", ")
            ));
        }
        out
    }
}

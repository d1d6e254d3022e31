//! How wrong a simulated time can be: each time carries a band derived from the calibration
//! residuals of the model parts it used (docs/MODEL-ERROR.md has the residual tables and the
//! derivation; tests/sim_residuals.rs recomputes the residuals, in sample and with each
//! calibration source left out of the fit, and fails when one leaves its band).
//!
//! A part's half-width is the largest |ln(simulated / published)| over the published figures
//! that part explains, in sample or predicted by a fit without the figure's source, rounded
//! up. A time is a fixed part (launch, prologue, barriers, NCCL's per-operation and per-step
//! costs) and a data part (bytes over the fabric): each is priced by its own parts, combined
//! in quadrature (calibrated on different figures, so taken as independent), and each side
//! may be off by its own factor, both the same way: true ∈ [f·e^−hf + d·e^−hd, f·e^hf +
//! d·e^hd] for a time of f fixed and d data. A small message's band is its fixed costs' and a
//! large one's its fabric's.
//!
//! Where the topology left a property unstated, the model takes the middle of its class's
//! calibration data and the part's band covers every make of the class: the widest band.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Kernel flows through the switch in C5's concurrent case (4 GPUs × 3 peers) and the loads'
/// factor there against a copy engine.
const C5_FLOWS: usize = 12;
const C5_LOAD_FACTOR: f64 = 20.60 / 56.25;

/// One model part whose error was calibrated on its own figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BandPart {
    /// Copy-engine link and uplink rates and hop latencies (C1, C2, C7 point to point).
    Links,
    /// Kernel loads and stores under contention through a Microchip switch (C5).
    KernelMicrochip,
    /// The same through a Broadcom switch: C5's curves with directions swapped (C3); no C1-C9
    /// figure times it (R2's 4 GPUs do), so its band also covers Microchip's.
    KernelBroadcom,
    /// The same through a switch whose make or kernel behaviour the topology does not state:
    /// the middle of both makes, with a band covering either.
    KernelUnstated,
    /// Peer traffic forwarded by a CPU root complex or socket I/O fabric (C2 all-to-all,
    /// C2's one-shot column, C7).
    RootComplex,
    /// Crossing the socket interconnect (C2 staggered cross-socket reads, C9 CX7).
    Interconnect,
    /// NCCL's bandwidth terms: channel rates and each protocol's payload share (C1's and
    /// C2's large messages, C6's busbw).
    NcclProtocol,
    /// NCCL's choices on a host whose CPU vendor the topology does not state (C6: AMD_BW, C9:
    /// the host's make moves peer bandwidth by about 20%).
    HostUnstated,
    /// NVLink/NVSwitch rates: no published NVLink figure in the calibration set.
    NvLink,
    /// A switch or socket fabric whose forwarding under many flows the topology does not
    /// state: C1's curve, the only published aggregate of such a node.
    ForwardingUnstated,
    /// Copy-engine bytes forwarded by a switch whose ports lead to other switches (a root
    /// switch above leaf switches): C1's curve was measured on switches of GPUs, and the one
    /// published all-to-all through such a switch (R5's, 48 flows) moves more than it gives.
    SwitchTree,
    /// Copy-engine bytes of a GPU whose memory three or more peers' copy engines access at
    /// once: the served share fitted on four-GPU copy all-to-alls (R1's box, R2's, R5's page).
    CopyServed,
    /// A custom kernel's fixed costs: prologue, barriers, first bytes (C2's small one-shots).
    KernelFixed,
    /// NCCL's fixed costs: its per-operation base latency and per-step hops (C1's and C2's
    /// small messages, C6's 8 bytes).
    NcclFixed,
    /// A copy-engine backend's fixed costs: each copy's and each stream memory operation's
    /// (sim/copy/). No published figure times them.
    CopyFixed,
    /// Bytes leaving a Broadcom PEX890xx partition's uplink from two or more of its GPUs
    /// towards two or more root complexes: C3's collapse, for posted writes and for the
    /// completions that carry reads' data alike (rtx6kpro's 16-flow table; R2's one-shot).
    Collapse,
    /// The same pattern through a switch whose make the topology does not state: were it a
    /// PEX890xx, those bytes would collapse; the model does not collapse them, so the band
    /// covers the collapse ([`COLLAPSE_UNSTATED`]).
    CollapseUnstated,
}

/// The uplink rate that bytes collapse to (C3), against which [`BandPart::CollapseUnstated`]'s
/// width is the most a collapse can slow an uplink's bytes: ln(uplink rate / this).
pub const COLLAPSE_UNSTATED: f64 = 2.7;

impl BandPart {
    /// Half-width of the part's band, ln of the factor, where the part is used within the
    /// range it was calibrated on. From docs/MODEL-ERROR.md's tables: the largest residual of
    /// the part's own figures, in sample or left out of the fit, rounded up to the next 0.01
    /// (a coarser step would widen a kernel's band past 2x for no figure's sake).
    pub fn half_width(self) -> f64 {
        match self {
            // C1/C2 point to point: largest residual ln(112.64/109.3) = 0.030 (C1's two
            // pairs both ways).
            BandPart::Links => 0.04,
            // C5 in sample to 0.3%; fitted without C5 (R1's one-shot gives the loads' rate),
            // C5's concurrent stores come out 0.52x: ln(25.40/13.23) = 0.652. See `width`
            // for flows beyond C5's twelve.
            BandPart::KernelMicrochip => 0.66,
            // R2's 4 GPUs, the one Broadcom kernel timing, reach ln 0.16 (1 MB, 1.17x); its
            // curves are C5's swapped, so at least as wide as Microchip's.
            BandPart::KernelBroadcom => 0.66,
            // The middle of the two makes, and either make's curve may hold: the widest.
            BandPart::KernelUnstated => 0.75,
            // C1 across switches, C1 56 pairs, C2 same socket: largest residual
            // ln(186.03/179) = 0.039, C1's 56 pairs read through one probe's jitter (σ 1.3%).
            BandPart::RootComplex => 0.04,
            // C2 staggered cross-socket reads: largest residual ln(52.99/40.8) = 0.261 (k = 7).
            BandPart::Interconnect => 0.27,
            // NCCL's bandwidth terms: Simple through host memory is slower than modelled, R2's
            // busbw at 32 MB with NCCL's default level (SHM across partitions) by ln 0.35
            // (1.42x), C6 #1603's SHM busbw by ln 0.25 (fitted without C6). R2's start-up loop,
            // priced at that level, lies within 0.78-1.32x.
            BandPart::NcclProtocol => 0.36,
            // C9: the host CPU's make moves peer bandwidth by about 20%: ln(1.2) = 0.182.
            BandPart::HostUnstated => 0.19,
            // No NVLink figure in the calibration set: a guess, said so in the doc.
            BandPart::NvLink => 0.50,
            // C1's curve on another node: no second make's aggregate is published, so as
            // wide as the unstated make of kernel traffic; past C1's flows per port the
            // curve's own further loss is added (`Curve::extrapolated`).
            BandPart::ForwardingUnstated => 0.30,
            // R5's copy-engine all-to-all through its root switch, 191.8 GB/s where C1's curve
            // forwards 142.5: ln(191.8/142.53) = 0.297, beside links' 0.04 in quadrature.
            // One figure, so as wide both ways.
            BandPart::SwitchTree => 0.30,
            // Four GPUs' copy all-to-alls: R2's chip A, 153 GB/s, predicted without R2 (share
            // 0.585) at 131.3, ln 0.153; R1's flat rebuild, 121, without R1 at 1.13x, ln 0.120.
            BandPart::CopyServed => 0.16,
            // R2's one-shot on 4 GPUs at 256 B and 4 KB, 1.34x: ln 0.29 (C2's at 1 KB fitted
            // without C2, no prologue: 0.84x, ln 0.17).
            BandPart::KernelFixed => 0.30,
            // Slow side: R4's NCCL replayed in the CUDA graphs of a decode step on four V100
            // behind one PLX switch, 1.52x at 16 and 32 KB: ln 0.42 (fitted without R4). Its
            // fast side: `fast_half_width`.
            BandPart::NcclFixed => 0.43,
            // Assumed constants no figure checks: either way by a factor of two, ln 2.
            BandPart::CopyFixed => 0.70,
            // rtx6kpro's 16 flows across the chips collapse to 7.7 GB/s (writes) and 9.0
            // (reads) over two uplinks, where C3's 2.7 per uplink gives 5.4: ln(9.0/5.4) =
            // 0.511. R2's one-shot, left out, reaches ln 1.47 = 0.39 (4 KB).
            BandPart::Collapse => 0.52,
            // Per switch, ln(uplink rate / 2.7) from `Net::parts`; this is a floor.
            BandPart::CollapseUnstated => 0.52,
        }
    }

    /// Half-width of the band's fast side, where the figures only ever found the model too
    /// fast beyond it: a time can then be slower than simulated by [`BandPart::half_width`],
    /// faster only by this.
    pub fn fast_half_width(self) -> f64 {
        match self {
            // Every figure past 0.14 found NCCL slower than modelled (Simple through host
            // memory: R2's busbw at 32 MB, C6 #1603). Faster than modelled, its own figures reach ln 0.08
            // (R2's nccl-tests busbw at 16 MB) and R2's nccl-tests at 8 KB, 0.72x in busbw (a
            // time of both sides), needs 0.14 beside nccl-fixed for its band to hold it.
            BandPart::NcclProtocol => 0.14,
            // nccl-tests on R2's four GPUs at 8 KB, 1.39x: ln 0.328 (C1's ring at 16 KB,
            // 1.37x: ln(23.65/17.31) = 0.312); no figure finds NCCL's fixed costs faster.
            BandPart::NcclFixed => 0.33,
            p => p.half_width(),
        }
    }

    /// Half-width where `flows` distinct kernel flows cross the node, the factor being known
    /// to `reach` flows ([`Calibration::kernel_flows_reach`]). The model holds the factor flat
    /// past C5's 12 flows; were the loss to go on past `reach` at C5's own log-slope (ln f₁₂ /
    /// ln 12 per ln flows), the factor at `flows` would be lower by |ln f₁₂| · ln(flows/reach)
    /// / ln 12. That extrapolation is the band added beyond the calibrated range (f₁₂ =
    /// 20.60/56.25, the loads' factor, the larger loss), on its slow side only: a further
    /// loss can only slow the bytes ([`GroupParts::custom`]).
    ///
    /// [`Calibration::kernel_flows_reach`]: super::calibration::Calibration::kernel_flows_reach
    pub fn width(self, flows: usize, reach: usize) -> f64 {
        let base = self.half_width();
        let reach = reach.max(C5_FLOWS);
        if !self.kernel() || flows <= reach {
            return base;
        }
        let slope = (C5_LOAD_FACTOR.ln() / (C5_FLOWS as f64).ln()).abs();
        base + slope * (flows as f64 / reach as f64).ln()
    }

    /// Whether the part prices kernel loads and stores through a switch.
    pub fn kernel(self) -> bool {
        matches!(
            self,
            BandPart::KernelMicrochip | BandPart::KernelBroadcom | BandPart::KernelUnstated
        )
    }

    /// Whether the part stands for a property the topology did not state.
    pub fn assumed(self) -> bool {
        matches!(
            self,
            BandPart::KernelUnstated
                | BandPart::HostUnstated
                | BandPart::ForwardingUnstated
                | BandPart::CollapseUnstated
        )
    }

    /// Whether the part prices a time's fixed costs rather than its bytes.
    pub fn fixed(self) -> bool {
        matches!(
            self,
            BandPart::KernelFixed | BandPart::NcclFixed | BandPart::CopyFixed
        )
    }

    pub fn id(self) -> &'static str {
        match self {
            BandPart::Links => "links",
            BandPart::KernelMicrochip => "kernel-microchip",
            BandPart::KernelBroadcom => "kernel-broadcom",
            BandPart::KernelUnstated => "kernel-unstated-make",
            BandPart::RootComplex => "root-complex",
            BandPart::Interconnect => "socket-interconnect",
            BandPart::NcclProtocol => "nccl-protocol",
            BandPart::HostUnstated => "host-unstated",
            BandPart::NvLink => "nvlink",
            BandPart::ForwardingUnstated => "forwarding-unstated",
            BandPart::SwitchTree => "switch-tree",
            BandPart::CopyServed => "copy-served",
            BandPart::KernelFixed => "kernel-fixed",
            BandPart::NcclFixed => "nccl-fixed",
            BandPart::CopyFixed => "copy-fixed",
            BandPart::Collapse => "uplink-collapse",
            BandPart::CollapseUnstated => "collapse-unstated-make",
        }
    }
}

impl fmt::Display for BandPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// The band of a time that used `parts`: (low, high) factors on the simulated time.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    pub low: f64,
    pub high: f64,
    pub parts: BTreeSet<BandPart>,
}

/// The half-width of parts taken as independent: in quadrature.
pub fn quadrature(parts: &BTreeMap<BandPart, f64>) -> f64 {
    parts.values().map(|w| w * w).sum::<f64>().sqrt()
}

/// The fixed and data shares of a time of `fixed_us` and `data_us`.
pub fn shares(fixed_us: f64, data_us: f64) -> (f64, f64) {
    let total = fixed_us + data_us;
    if total > 0.0 {
        (fixed_us / total, data_us / total)
    } else {
        (1.0, 0.0)
    }
}

impl Band {
    /// The band of parts used within their calibrated range.
    pub fn of(parts: BTreeSet<BandPart>) -> Band {
        Band::widths(&parts.iter().map(|&p| (p, p.half_width())).collect())
    }

    /// The band of parts at the given half-widths, in quadrature.
    pub fn widths(parts: &BTreeMap<BandPart, f64>) -> Band {
        Band::half(quadrature(parts), parts.keys().copied().collect())
    }

    /// The band of a time of `fixed_us` priced by the `fixed` parts and `data_us` priced by
    /// the `data` parts: each side may be off by its own band, both the same way, so the
    /// time's ends are the sums of the sides' ends. A small share of bytes known only to a
    /// factor of ten still moves the time by that share times ten.
    pub fn split(
        fixed: &BTreeMap<BandPart, f64>,
        data: &BTreeMap<BandPart, f64>,
        fixed_us: f64,
        data_us: f64,
    ) -> Band {
        let (f, d) = shares(fixed_us, data_us);
        let (hf, hd) = (quadrature(fixed), quadrature(data));
        Band {
            low: f * (-hf).exp() + d * (-hd).exp(),
            high: f * hf.exp() + d * hd.exp(),
            parts: fixed.keys().chain(data.keys()).copied().collect(),
        }
    }

    /// [`Band::split`] with the data side's fast end priced by `data_fast`, where a part's
    /// width on the slow side holds a loss that can only slow the bytes, and the fixed side's
    /// by each part's [`BandPart::fast_half_width`].
    pub fn split_sides(
        fixed: &BTreeMap<BandPart, f64>,
        data_fast: &BTreeMap<BandPart, f64>,
        data: &BTreeMap<BandPart, f64>,
        fixed_us: f64,
        data_us: f64,
    ) -> Band {
        let (f, d) = shares(fixed_us, data_us);
        let fixed_fast: BTreeMap<BandPart, f64> = fixed
            .iter()
            .map(|(&p, &w)| (p, w.min(p.fast_half_width())))
            .collect();
        let (hf, hf_fast) = (quadrature(fixed), quadrature(&fixed_fast));
        let (fast, slow) = (quadrature(data_fast), quadrature(data));
        Band {
            low: f * (-hf_fast).exp() + d * (-fast).exp(),
            high: f * hf.exp() + d * slow.exp(),
            parts: fixed.keys().chain(data.keys()).copied().collect(),
        }
    }

    fn half(h: f64, parts: BTreeSet<BandPart>) -> Band {
        Band {
            low: (-h).exp(),
            high: h.exp(),
            parts,
        }
    }
}

/// The parts a group's times use, per kind of backend.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupParts {
    /// Crossed by the group's peer routes (links, switches by make, root complexes, sockets),
    /// each at its half-width for the flows the group puts through it.
    pub fabric: BTreeMap<BandPart, f64>,
    /// Whether the host CPU vendor NCCL's choices depend on was stated.
    pub host_stated: bool,
    /// The island schedules' fabric: each of their phases runs alone (custom/mod.rs), so a
    /// switch carries the flows of one phase at a time, inside islands or across them, not
    /// the group's all-to-all. None where the group has no islands.
    pub islands: Option<BTreeMap<BandPart, f64>>,
}

impl GroupParts {
    /// The fixed parts of a time: its own fixed costs and the links' latencies.
    fn fixed(&self, own: BandPart) -> BTreeMap<BandPart, f64> {
        let mut out: BTreeMap<BandPart, f64> = [(own, own.half_width())].into();
        for p in [BandPart::Links, BandPart::NvLink] {
            if self.fabric.contains_key(&p) {
                out.insert(p, p.half_width());
            }
        }
        out
    }

    /// The band of a custom kernel's time of `fixed_us` fixed costs and `data_us` moving its
    /// bytes: the fabric its kernel loads and stores cross prices the bytes. A switch's kernel
    /// part past the factor's reach ([`BandPart::width`]) widens the slow end only: were the
    /// loss to go on, the bytes would be slower; faster than the factor measured they are
    /// known only to the make's own calibrated width.
    pub fn custom(&self, fixed_us: f64, data_us: f64) -> Band {
        Self::kernel_band(
            &self.fixed(BandPart::KernelFixed),
            &self.fabric,
            fixed_us,
            data_us,
        )
    }

    fn kernel_band(
        fixed: &BTreeMap<BandPart, f64>,
        fabric: &BTreeMap<BandPart, f64>,
        fixed_us: f64,
        data_us: f64,
    ) -> Band {
        // A switch tree's root forwards kernel bytes too, but the switch's kernel part prices
        // them: its figures include R5's one-shot through that very root switch. A kernel's
        // loads and stores are not copies served by a busy GPU: its factor prices them.
        let fabric: BTreeMap<BandPart, f64> = fabric
            .iter()
            .filter(|(&p, _)| !matches!(p, BandPart::SwitchTree | BandPart::CopyServed))
            .map(|(&p, &w)| (p, w))
            .collect();
        let fast: BTreeMap<BandPart, f64> = fabric
            .iter()
            .map(|(&p, &w)| (p, if p.kernel() { w.min(p.half_width()) } else { w }))
            .collect();
        Band::split_sides(fixed, &fast, &fabric, fixed_us, data_us)
    }

    /// [`GroupParts::custom`] for an island schedule (`islands`: priced phase by phase on
    /// the group's islands) or a flat kernel.
    pub fn custom_of(&self, islands: bool, fixed_us: f64, data_us: f64) -> Band {
        match self.islands.as_ref().filter(|_| islands) {
            Some(fabric) => Self::kernel_band(
                &self.fixed(BandPart::KernelFixed),
                fabric,
                fixed_us,
                data_us,
            ),
            None => self.custom(fixed_us, data_us),
        }
    }

    /// The band of an NCCL time, as [`GroupParts::custom`]: the copy-engine fabric (kernel-
    /// traffic parts do not apply) and NCCL's protocol costs price the bytes, and the host's
    /// make where unstated moves both. An unstated forwarding curve, a switch tree's root or a
    /// GPU serving many peers' copies does not apply either:
    /// NCCL's rings and trees put one or two flows per GPU through a node, below any curve's
    /// knee, where all-to-all kernels put N−1; nor does a collapse, which takes two GPUs of
    /// one switch sending out of it at once, where a ring sends one.
    pub fn nccl(&self, fixed_us: f64, data_us: f64) -> Band {
        let mut data: BTreeMap<BandPart, f64> = self
            .fabric
            .keys()
            .copied()
            .filter(|p| {
                !matches!(
                    p,
                    BandPart::KernelMicrochip
                        | BandPart::KernelBroadcom
                        | BandPart::KernelUnstated
                        | BandPart::Collapse
                        | BandPart::CollapseUnstated
                        | BandPart::ForwardingUnstated
                        | BandPart::SwitchTree
                        | BandPart::CopyServed
                )
            })
            .map(|p| (p, p.half_width()))
            .collect();
        data.insert(BandPart::NcclProtocol, BandPart::NcclProtocol.half_width());
        let mut fixed = self.fixed(BandPart::NcclFixed);
        if !self.host_stated {
            for side in [&mut data, &mut fixed] {
                side.insert(BandPart::HostUnstated, BandPart::HostUnstated.half_width());
            }
        }
        let fast: BTreeMap<BandPart, f64> = data
            .iter()
            .map(|(&p, &w)| (p, w.min(p.fast_half_width())))
            .collect();
        Band::split_sides(&fixed, &fast, &data, fixed_us, data_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_add_in_quadrature() {
        let b = Band::of([BandPart::Links, BandPart::Interconnect].into());
        let h = (BandPart::Links.half_width().powi(2)
            + BandPart::Interconnect.half_width().powi(2))
        .sqrt();
        assert!((b.high - h.exp()).abs() < 1e-12 && (b.low * b.high - 1.0).abs() < 1e-12);
    }

    #[test]
    fn a_small_message_takes_its_fixed_parts_band_and_a_large_one_its_fabrics() {
        let g = GroupParts {
            fabric: [(BandPart::Links, 0.05), (BandPart::Interconnect, 1.0)].into(),
            host_stated: true,
            islands: None,
        };
        let links = BandPart::Links.half_width();
        let fixed = (links.powi(2) + BandPart::KernelFixed.half_width().powi(2)).sqrt();
        let data = (0.05f64.powi(2) + 1.0f64.powi(2)).sqrt();
        assert!((g.custom(5.0, 0.0).high.ln() - fixed).abs() < 1e-12);
        assert!((g.custom(0.0, 5.0).high.ln() - data).abs() < 1e-12);
        // Half and half: each half off by its own factor, the same way.
        let b = g.custom(5.0, 5.0);
        assert!((b.high - (fixed.exp() + data.exp()) / 2.0).abs() < 1e-12);
        assert!((b.low - ((-fixed).exp() + (-data).exp()) / 2.0).abs() < 1e-12);
        assert!(g.custom(5.0, 1.0).high < g.custom(5.0, 50.0).high);
    }

    #[test]
    fn an_unstated_make_is_the_widest_switch_band() {
        for p in [BandPart::KernelMicrochip, BandPart::KernelBroadcom] {
            assert!(
                BandPart::KernelUnstated.half_width() >= p.half_width(),
                "{p}"
            );
        }
        let g = GroupParts {
            fabric: [(BandPart::Links, 0.05), (BandPart::KernelMicrochip, 0.05)].into(),
            host_stated: false,
            islands: None,
        };
        let n = g.nccl(1.0, 1.0);
        assert!(n.parts.contains(&BandPart::HostUnstated));
        assert!(!n.parts.contains(&BandPart::KernelMicrochip));
        assert!(
            n.parts.contains(&BandPart::NcclFixed) && n.parts.contains(&BandPart::NcclProtocol)
        );
    }

    #[test]
    fn kernel_bands_grow_past_the_calibrated_flow_count() {
        let k = BandPart::KernelMicrochip;
        assert_eq!(k.width(12, 12), k.half_width());
        assert!(k.width(56, 12) > k.width(24, 12) && k.width(24, 12) > k.width(12, 12));
        // At C5's slope, 144 flows (12²) lose one more factor f₁₂: |ln f₁₂| more width.
        assert!((k.width(144, 12) - k.half_width() - C5_LOAD_FACTOR.ln().abs()).abs() < 1e-9);
        assert_eq!(BandPart::Links.width(56, 12), BandPart::Links.half_width());
        // Past the reach the slow end widens and the fast end keeps the make's own width.
        let g = GroupParts {
            fabric: [(k, k.width(56, 12))].into(),
            host_stated: true,
            islands: None,
        };
        let b = g.custom(0.0, 1.0);
        assert!((b.high.ln() - k.width(56, 12)).abs() < 1e-12);
        assert!((b.low.ln() + k.half_width()).abs() < 1e-12);
        // Known to 24 flows: flat to there, and from there at the same slope.
        assert_eq!(k.width(24, 24), k.half_width());
        assert!((k.width(48, 24) - k.width(24, 12)).abs() < 1e-12);
    }

    #[test]
    fn a_switch_trees_part_prices_copy_engine_bytes_only() {
        let t = BandPart::SwitchTree;
        let g = GroupParts {
            fabric: [(BandPart::Links, 0.04), (t, t.half_width())].into(),
            host_stated: true,
            islands: None,
        };
        let copy = super::super::copy::band(&g, 0.0, 1.0);
        assert!(copy.parts.contains(&t));
        assert!((copy.high.ln() - 0.04f64.hypot(t.half_width())).abs() < 1e-12);
        // NCCL's rings put one or two flows through the root; a kernel's bytes are priced by
        // its switch's kernel part.
        assert!(!g.nccl(0.0, 1.0).parts.contains(&t));
        let custom = g.custom_of(false, 0.0, 1.0);
        assert!(!custom.parts.contains(&t) && (custom.high.ln() - 0.04).abs() < 1e-12);
    }

    #[test]
    fn a_busy_gpus_served_share_prices_copy_engine_bytes_only() {
        let c = BandPart::CopyServed;
        let g = GroupParts {
            fabric: [(BandPart::Links, 0.04), (c, c.half_width())].into(),
            host_stated: true,
            islands: None,
        };
        let copy = super::super::copy::band(&g, 0.0, 1.0);
        assert!(copy.parts.contains(&c));
        assert!((copy.high.ln() - 0.04f64.hypot(c.half_width())).abs() < 1e-12);
        // NCCL's and a kernel's bytes are loads and stores, priced by their own parts.
        assert!(!g.nccl(0.0, 1.0).parts.contains(&c));
        let custom = g.custom_of(false, 0.0, 1.0);
        assert!(!custom.parts.contains(&c) && (custom.high.ln() - 0.04).abs() < 1e-12);
    }
}

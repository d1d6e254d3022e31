//! Kernel (SM-driven) peer traffic, apart from copy-engine traffic.
//!
//! Copy-engine tables (p2pBandwidthLatencyTest, calibration C1/C2) describe DMA transfers in
//! large TLPs. A kernel moving data through peer mappings issues 16-byte loads and stores:
//! one stream reaches less than a copy engine (C5: 44.8 GB/s stores, 42.8 loads where a copy
//! engine writes 56.2), and under all-to-all a switch degrades them further and differently
//! per direction and per chip (C5: 25.4 / 20.6 GB/s per GPU with every rank driving all
//! peers; C3: Microchip keeps writes better than reads, Broadcom the opposite).
//!
//! Two effects, each with its own place in the flow model:
//! - the lone-stream share ([`Kernel::store_alone`], [`Kernel::load_alone`]) caps each flow
//!   at that share of the driving GPU's port rate (issue rate and outstanding requests of one
//!   SM stream: a GPU-side limit, the same behind any switch);
//! - the concurrency curve scales the driving GPU's port by the factor of the most-degraded
//!   node on its route, at the number of distinct kernel flows crossing that node: a GPU
//!   issues so many outstanding requests, a limit of its port, so its flows weigh more there
//!   and on nothing shared (uplinks, root complexes forward their bytes as a copy engine's).
//!   Weighted on every resource, 16 GPUs in four-GPU islands (R3, b12x#139) came out 1.9-2.0x
//!   too slow where their pulls cross the uplinks, and R2's four GPUs behind two Broadcom
//!   partitions up to 1.66x; weighted at the port, 1.12-1.24x and 1.16-1.19x, with C5 as
//!   before (its four GPUs under one switch cross nothing shared that binds). A Broadcom
//!   collapse still takes kernel bytes at their weight (C3: they collapse at least as badly).
//!
//! The defaults are transaction limits, not shares of a lane rate: a window of outstanding
//! requests or credits over a round trip is so many GB/s whatever the link's generation. C5
//! measured them on Gen5 x16 links (56.25 GB/s by copy engine); a slower link reaches
//! min(1, share × 56.25 / its rate) of itself, so a Gen4 link is barely held back and a
//! Gen3 link not at all. The shape this reproduces: NCCL's kernel stores reach 46.1 of 56.25
//! GB/s on C1's Gen5 box (82%) but 26.0 of 26.26 on Gen4 4090s (C6 tinygrad#36 against C9's
//! Gen4 single hop: 99%). What a topology file states keeps its meaning there: shares of
//! that node's own links.

use super::calibration::{KernelRates, COPY_PAIR_GBPS};
use crate::fabric::Direction;
use crate::topology::{Contention, KernelPoint, KernelTraffic};

/// A kernel polling a flag in its own GPU's memory sees it this long after it lands, µs.
pub const FLAG_POLL_US: f64 = 0.3;

/// Which defaults a node gets when its file says nothing about kernel traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// Microchip Switchtec (C5 is the only published kernel-traffic data).
    Microchip,
    /// Broadcom / PLX: reads are the robust direction (C3), so C5's curves swap directions.
    Broadcom,
    /// Root complexes and a socket's I/O fabric: C2's one-shot pulls run at the copy-engine
    /// all-to-all rate (1 MB: 7 MB per GPU in 288.6 µs = 24.3 GB/s vs 22.7-24.3 with copy
    /// engines), so no degradation beyond the copy-engine curve.
    Cpu,
    /// A switch whose make the topology does not state: the middle of the two makes' data
    /// (the mean of C5's store and load factors, the same both ways), not one make's curve.
    Unstated,
}

/// Vendor strings (as sysfs or a file names them) of the switch makes the model knows.
const MICROCHIP: &[&str] = &["microchip", "microsemi", "pmc", "switchtec", "0x11f8"];
const BROADCOM: &[&str] = &["broadcom", "plx", "avago", "0x1000", "0x10b5", "0x14e4"];

impl NodeKind {
    /// The defaults class of a switch from its vendor string; None for a make the model has
    /// no calibration data for (the simulator refuses such a topology).
    pub fn of_switch(vendor: Option<&str>) -> Option<NodeKind> {
        let v = vendor.unwrap_or("").trim().to_ascii_lowercase();
        if v.is_empty() {
            Some(NodeKind::Unstated)
        } else if BROADCOM.iter().any(|m| v.contains(m)) {
            Some(NodeKind::Broadcom)
        } else if MICROCHIP.iter().any(|m| v.contains(m)) {
            Some(NodeKind::Microchip)
        } else {
            None
        }
    }
}

/// One node's kernel-traffic behaviour, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelFactors {
    pub store_alone: f64,
    pub load_alone: f64,
    store: Vec<(f64, f64)>,
    load: Vec<(f64, f64)>,
    /// The calibration defaults: shares of C5's Gen5 link, i.e. absolute rates. False where
    /// a file stated any of it: shares of the node's own links.
    absolute: bool,
}

fn points(p: &[KernelPoint]) -> Vec<(f64, f64)> {
    p.iter().map(|p| (p.flows as f64, p.factor)).collect()
}

impl KernelFactors {
    /// The calibration-derived defaults for a kind of node, from kernel rates measured as C5
    /// measured them; with none (a fit without C5), kernel traffic moves as copy engines do.
    pub fn default_for(kind: NodeKind, rates: Option<&KernelRates>) -> KernelFactors {
        let Some(r) = rates else {
            return KernelFactors {
                store_alone: 1.0,
                load_alone: 1.0,
                store: vec![],
                load: vec![],
                absolute: true,
            };
        };
        let flows = r.flows as f64;
        let store = vec![(1.0, 1.0), (flows, r.store_concurrent / COPY_PAIR_GBPS)];
        let load = vec![(1.0, 1.0), (flows, r.load_concurrent / COPY_PAIR_GBPS)];
        let middle = (r.store_concurrent + r.load_concurrent) / 2.0 / COPY_PAIR_GBPS;
        let (store, load) = match kind {
            NodeKind::Microchip => (store, load),
            NodeKind::Broadcom => (load, store),
            NodeKind::Cpu => (vec![], vec![]),
            NodeKind::Unstated => {
                let mid = vec![(1.0, 1.0), (flows, middle)];
                (mid.clone(), mid)
            }
        };
        KernelFactors {
            store_alone: r.store_alone / COPY_PAIR_GBPS,
            load_alone: r.load_alone / COPY_PAIR_GBPS,
            store,
            load,
            absolute: true,
        }
    }

    /// The node's behaviour: what its file states, the rest from `kind`'s defaults. Returns
    /// also whether anything was assumed.
    pub fn resolve(
        c: Option<&Contention>,
        kind: NodeKind,
        rates: Option<&KernelRates>,
    ) -> (KernelFactors, bool) {
        let d = KernelFactors::default_for(kind, rates);
        let Some(k) = c.and_then(|c| c.kernel.as_ref()) else {
            return (d, true);
        };
        let KernelTraffic {
            store_factor,
            load_factor,
            store_curve,
            load_curve,
        } = k;
        let assumed = store_factor.is_none()
            || load_factor.is_none()
            || store_curve.is_empty()
            || load_curve.is_empty();
        (
            KernelFactors {
                store_alone: store_factor.unwrap_or(d.store_alone),
                load_alone: load_factor.unwrap_or(d.load_alone),
                store: if store_curve.is_empty() {
                    d.store
                } else {
                    points(store_curve)
                },
                load: if load_curve.is_empty() {
                    d.load
                } else {
                    points(load_curve)
                },
                absolute: false,
            },
            assumed,
        )
    }

    /// Lone-stream share of the port rate for traffic in `dir`.
    pub fn alone(&self, dir: Direction) -> f64 {
        match dir {
            Direction::Read => self.load_alone,
            Direction::Write => self.store_alone,
        }
    }

    /// `share` of C5's link as a share of a link of `port_gbps` (the defaults), or as it is
    /// (a file's own figure).
    fn on_link(&self, share: f64, port_gbps: f64) -> f64 {
        if self.absolute && port_gbps.is_finite() && port_gbps > 0.0 {
            (share * COPY_PAIR_GBPS / port_gbps).min(1.0)
        } else {
            share
        }
    }

    /// Lone-stream share of a port of `port_gbps` (the driving GPU's).
    pub fn alone_on(&self, dir: Direction, port_gbps: f64) -> f64 {
        self.on_link(self.alone(dir), port_gbps)
    }

    /// Concurrency factor with `flows` kernel flows, for a flow driven through a port of
    /// `port_gbps`.
    pub fn factor_on(&self, dir: Direction, flows: usize, port_gbps: f64) -> f64 {
        self.on_link(self.factor(dir, flows), port_gbps)
    }

    /// Concurrency factor with `flows` distinct kernel flows crossing the node: linear
    /// between points, flat past the ends (nothing is extrapolated beyond what was measured).
    pub fn factor(&self, dir: Direction, flows: usize) -> f64 {
        let curve = match dir {
            Direction::Read => &self.load,
            Direction::Write => &self.store,
        };
        let k = flows as f64;
        let (Some(first), Some(last)) = (curve.first(), curve.last()) else {
            return 1.0;
        };
        if k <= first.0 {
            return first.1;
        }
        if k >= last.0 {
            return last.1;
        }
        curve
            .windows(2)
            .find(|w| k <= w[1].0)
            .map_or(last.1, |w| {
                let t = (k - w[0].0) / (w[1].0 - w[0].0);
                w[0].1 + t * (w[1].1 - w[0].1)
            })
            .clamp(1e-3, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::sim::calibration::Calibration;

    fn default_for(kind: NodeKind) -> KernelFactors {
        KernelFactors::default_for(kind, Calibration::fitted().kernel.as_ref())
    }

    #[test]
    fn microchip_defaults_reproduce_c5() {
        let k = default_for(NodeKind::Microchip);
        assert!((k.factor(Direction::Write, 12) * COPY_PAIR_GBPS - 25.40).abs() < 1e-9);
        assert!((k.factor(Direction::Read, 12) * COPY_PAIR_GBPS - 20.60).abs() < 1e-9);
        assert_eq!(k.factor(Direction::Write, 1), 1.0);
        // Flat past the last measured point, monotone in between.
        assert_eq!(k.factor(Direction::Read, 44), k.factor(Direction::Read, 12));
        assert!(k.factor(Direction::Read, 6) < 1.0 && k.factor(Direction::Read, 6) > 0.37);
    }

    #[test]
    fn broadcom_swaps_directions_and_cpus_do_not_degrade() {
        let m = default_for(NodeKind::Microchip);
        let b = default_for(NodeKind::Broadcom);
        assert_eq!(
            b.factor(Direction::Read, 12),
            m.factor(Direction::Write, 12)
        );
        assert_eq!(default_for(NodeKind::Cpu).factor(Direction::Read, 56), 1.0);
        assert_eq!(
            NodeKind::of_switch(Some("Broadcom (PLX)")),
            Some(NodeKind::Broadcom)
        );
        assert_eq!(NodeKind::of_switch(None), Some(NodeKind::Unstated));
        assert_eq!(NodeKind::of_switch(Some("ASMedia")), None);
    }

    #[test]
    fn an_unstated_make_sits_between_the_makes_both_ways() {
        let (m, b, u) = (
            default_for(NodeKind::Microchip),
            default_for(NodeKind::Broadcom),
            default_for(NodeKind::Unstated),
        );
        for d in [Direction::Read, Direction::Write] {
            let lo = m.factor(d, 12).min(b.factor(d, 12));
            let hi = m.factor(d, 12).max(b.factor(d, 12));
            assert!(lo < u.factor(d, 12) && u.factor(d, 12) < hi, "{d:?}");
        }
    }

    #[test]
    fn a_file_overrides_what_it_states() {
        let c = Contention {
            kernel: Some(KernelTraffic {
                store_factor: Some(0.5),
                load_curve: vec![
                    KernelPoint {
                        flows: 1,
                        factor: 0.9,
                    },
                    KernelPoint {
                        flows: 5,
                        factor: 0.5,
                    },
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let rates = Calibration::fitted().kernel;
        let (k, assumed) = KernelFactors::resolve(Some(&c), NodeKind::Microchip, rates.as_ref());
        assert!(assumed);
        assert_eq!(k.alone(Direction::Write), 0.5);
        assert!((k.factor(Direction::Read, 3) - 0.7).abs() < 1e-9);
    }
}

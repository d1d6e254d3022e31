//! How a switch or a socket's I/O fabric forwards under many flows: its capacity curve.

use super::super::calibration::Calibration;
use crate::fabric::Direction;
use crate::topology::Contention;

/// Rates a file states but `Topology::normalize` does not check (contention peaks, collapse
/// rates, NVSwitch ports) are kept above zero, so a bad file slows flows instead of stalling
/// the solver.
pub(super) fn positive(gbps: f64) -> f64 {
    if gbps > 1e-3 {
        gbps
    } else {
        1e-3
    }
}

/// A node's capacity as a function of the flows crossing it, and its read/write factors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Curve {
    pub peak: f64,
    pub knee: f64,
    pub slope: f64,
    pub read_factor: f64,
    pub write_factor: f64,
}

/// How a switch or a socket's I/O fabric forwards peer traffic when its file does not say,
/// from the only published aggregate of such a node: C1's switches (Microchip PM50100, five
/// Gen5 x16 ports: four GPUs and the uplink), 56 copy-engine flows at 179 GB/s in total, 44 of
/// them through each switch, which this curve reproduces. A crossbar without limit is no
/// default: every measured box forwards all-to-all far below the sum of its ports (C3).
pub const FORWARDING_DEFAULT: Contention = Contention {
    peak_gbps: Some(300.0),
    knee_flows: Some(8),
    slope: Some(0.03),
    read_factor: Some(0.9),
    write_factor: Some(1.0),
    write_collapse_gbps: None,
    kernel: None,
    cpu_vendor: None,
};
/// The ports of C1's switch [`FORWARDING_DEFAULT`] was measured on, and their rate.
const FORWARDING_PORTS: f64 = 5.0;
const FORWARDING_PORT_GBPS: f64 = 56.32;

/// Flows through each switch at C1's calibration point (12 inside, 16 out, 16 in).
pub const FORWARDING_CALIBRATED_FLOWS: usize = 44;

impl Curve {
    /// C1's curve for a node with ports of `ports` GB/s: a crossbar grows with its ports, and
    /// contention with the flows per port, so the peak scales with the ports' total rate and
    /// the knee and slope with their count. On C1's own five Gen5 ports it is C1's curve.
    /// With no ports given, C1's curve as it is (a socket's I/O fabric, below).
    pub fn forwarding_default(ports: &[f64]) -> Curve {
        Curve::forwarding_with(ports, Calibration::fitted().forwarding_peak_gbps)
    }

    /// [`Curve::forwarding_default`] with C1's peak fitted as `peak` GB/s.
    fn forwarding_with(ports: &[f64], peak: f64) -> Curve {
        let d = Curve {
            peak,
            ..Curve::from(&FORWARDING_DEFAULT)
        };
        if ports.is_empty() {
            return d;
        }
        let n = ports.len() as f64;
        let total: f64 = ports.iter().sum();
        let total = if total > 0.0 && total.is_finite() {
            total
        } else {
            FORWARDING_PORTS * FORWARDING_PORT_GBPS
        };
        Curve {
            peak: d.peak * total / (FORWARDING_PORTS * FORWARDING_PORT_GBPS),
            knee: d.knee * n / FORWARDING_PORTS,
            slope: d.slope * FORWARDING_PORTS / n,
            ..d
        }
    }

    /// A node's curve: what its file states, or where it states no peak, the forwarding of
    /// [`Curve::forwarding_default`] for its `ports` (with any read/write factor it states).
    /// Returns also whether that was assumed.
    pub fn resolve(c: Option<&Contention>, ports: &[f64]) -> (Curve, bool) {
        Curve::resolve_with(c, ports, Calibration::fitted().forwarding_peak_gbps)
    }

    /// [`Curve::resolve`] with the default's peak fitted as `peak` GB/s.
    pub(super) fn resolve_with(c: Option<&Contention>, ports: &[f64], peak: f64) -> (Curve, bool) {
        match c {
            Some(c) if c.peak_gbps.is_some() => (Curve::from(c), false),
            _ => {
                let mut d = Curve::forwarding_with(ports, peak);
                if let Some(c) = c {
                    let stated = Curve::from(c);
                    if c.read_factor.is_some() {
                        d.read_factor = stated.read_factor;
                    }
                    if c.write_factor.is_some() {
                        d.write_factor = stated.write_factor;
                    }
                }
                (d, true)
            }
        }
    }

    /// Unset fields mean "no limit": infinite peak, no slope, factors of 1.
    pub fn from(c: &Contention) -> Curve {
        Curve {
            peak: c.peak_gbps.map_or(f64::INFINITY, positive),
            knee: c.knee_flows.unwrap_or(0) as f64,
            slope: c.slope.unwrap_or(0.0).max(0.0),
            read_factor: c.read_factor.unwrap_or(1.0).clamp(0.01, 1.0),
            write_factor: c.write_factor.unwrap_or(1.0).clamp(0.01, 1.0),
        }
    }

    /// Aggregate capacity with `flows` crossing: peak / (1 + slope · (flows − knee)) past the knee.
    pub fn capacity(&self, flows: usize) -> f64 {
        let over = (flows as f64 - self.knee).max(0.0);
        self.peak / (1.0 + self.slope * over)
    }

    /// ln of the capacity this curve loses past the flows per port C1 measured (44 through
    /// a switch whose knee is 8): its extrapolation, added to an assumed curve's band.
    pub fn extrapolated(&self, flows: usize) -> f64 {
        let knee = FORWARDING_DEFAULT.knee_flows.unwrap_or(8) as f64;
        let measured = FORWARDING_CALIBRATED_FLOWS as f64 * self.knee.max(1.0) / knee;
        let at = |f: f64| self.peak / (1.0 + self.slope * (f.max(measured) - self.knee).max(0.0));
        (at(measured) / at(flows as f64)).ln().max(0.0)
    }

    /// Capacity units one unit of payload costs in `dir`.
    pub fn weight(&self, dir: Direction) -> f64 {
        match dir {
            Direction::Read => 1.0 / self.read_factor,
            Direction::Write => 1.0 / self.write_factor,
        }
    }
}

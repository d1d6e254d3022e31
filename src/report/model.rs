//! What a simulated time's error band lets artune say. Within the model's calibration a time
//! is an estimate with its band; a band wider than [`CALIBRATED`] either way comes from parts
//! the calibration does not cover (an unstated switch make's collapse, extrapolation past the
//! calibrated flows: docs/MODEL-ERROR.md), and such a time is no estimate of the machine.

use crate::profile::ModelBand;

/// The widest band, as a factor either way, that artune still prints as an estimate.
pub const CALIBRATED: f64 = 10.0;

/// Whether `m` reaches beyond [`CALIBRATED`]: the model cannot tell the time within it.
pub fn outside_calibration(m: &ModelBand) -> bool {
    m.high > CALIBRATED || m.low < 1.0 / CALIBRATED
}

/// A time known only roughly, to two significant digits in a unit that fits: "~770 s", not
/// "766165.94 ms".
pub fn fmt_rough(us: f64) -> String {
    let (v, unit) = match us {
        u if u < 1e3 => (u, "us"),
        u if u < 1e6 => (u / 1e3, "ms"),
        u if u < 60e6 => (u / 1e6, "s"),
        u if u < 3600e6 => (u / 60e6, "min"),
        u => (u / 3600e6, "h"),
    };
    format!("~{} {unit}", two_digits(v))
}

/// `v` to two significant digits: 766165.94 as "770000", 0.0389 as "0.039".
pub fn two_digits(v: f64) -> String {
    if !v.is_finite() || v == 0.0 {
        return format!("{v}");
    }
    let digits = v.abs().log10().floor() as i32;
    let step = 10f64.powi(digits - 1);
    let rounded = (v / step).round() * step;
    let decimals = (1 - digits).max(0) as usize;
    format!("{rounded:.decimals$}")
}

/// A band's factors as "x0.04-x26": two significant digits, as rough as the band is.
pub fn fmt_factors(m: &ModelBand) -> String {
    format!("x{}-x{}", two_digits(m.low), two_digits(m.high))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn band(low: f64, high: f64) -> ModelBand {
        ModelBand {
            low,
            high,
            assumed: true,
            family: None,
        }
    }

    #[test]
    fn a_band_past_ten_either_way_is_outside_calibration() {
        assert!(!outside_calibration(&band(0.29, 3.41)));
        assert!(outside_calibration(&band(0.04, 25.71)));
        assert!(outside_calibration(&band(0.5, 12.0)));
        assert!(outside_calibration(&band(0.08, 2.0)));
    }

    #[test]
    fn rough_times_keep_two_digits_in_a_unit_that_fits() {
        assert_eq!(fmt_rough(766_165_940.0), "~13 min");
        assert_eq!(fmt_rough(97_848_237_000.0), "~27 h");
        assert_eq!(fmt_rough(22_209_790.0), "~22 s");
        assert_eq!(fmt_rough(792_860.0), "~790 ms");
        assert_eq!(fmt_rough(7.69), "~7.7 us");
        assert_eq!(fmt_rough(0.04), "~0.040 us");
        assert_eq!(fmt_factors(&band(0.0389, 25.71)), "x0.039-x26");
        assert_eq!(two_digits(766165.94), "770000");
        assert_eq!(two_digits(-163.476), "-160");
    }
}

//! Small statistics on timing samples: outliers, the median and its confidence interval.

use statrs::distribution::{Binomial, DiscreteCDF};

/// Samples whose modified z-score exceeds this are outliers (Iglewicz & Hoaglin, "How to
/// Detect and Handle Outliers", 1993: |0.6745·(x − median)/MAD| > 3.5).
pub const OUTLIER_Z: f64 = 3.5;

/// Fewest samples whose median has a 95% confidence interval; below, the interval is their
/// whole range.
pub const MIN_FOR_95: usize = 6;

/// Summary of one set of timing samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    /// Samples kept after outlier removal.
    pub kept: usize,
    pub outliers: usize,
}

impl Summary {
    /// Half-width of the CI relative to the median.
    pub fn rel_half_width(&self) -> f64 {
        if self.median > 0.0 {
            (self.ci_high - self.ci_low) / 2.0 / self.median
        } else {
            f64::INFINITY
        }
    }
}

/// Median of a sorted slice.
pub fn median_sorted(xs: &[f64]) -> f64 {
    let n = xs.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// Indices (0-based, into the sorted samples) of the distribution-free 95% confidence
/// interval of the median: the order statistics x(l) and x(u) with P(l ≤ B < u) ≥ 0.95 for
/// B ~ Binomial(n, 1/2) (Conover, Practical Nonparametric Statistics, 3rd ed., §3.2).
pub fn median_ci_indices(n: usize) -> (usize, usize) {
    // Every interval of every sample set asks for these, and the binomial CDF is the tune's
    // costliest arithmetic: remember them per n.
    const CACHED: usize = 4096;
    static MEMO: [std::sync::OnceLock<(usize, usize)>; CACHED] =
        [const { std::sync::OnceLock::new() }; CACHED];
    match MEMO.get(n) {
        Some(cell) => *cell.get_or_init(|| ci_indices(n)),
        None => ci_indices(n),
    }
}

fn ci_indices(n: usize) -> (usize, usize) {
    if n < MIN_FOR_95 {
        // Too few samples to reach 95% coverage: the CI is the whole range.
        return (0, n.saturating_sub(1));
    }
    let b = Binomial::new(0.5, n as u64).expect("p in [0,1]");
    // 1-based r has coverage 1 − 2·P(B ≤ r−1); take the largest r (0-based l = r−1) with
    // P(B ≤ l) ≤ 0.025.
    let mut l = 0usize;
    while l + 1 < n / 2 && b.cdf((l + 1) as u64) <= 0.025 {
        l += 1;
    }
    let u = n - 1 - l;
    (l, u)
}

/// Removes outliers (modified z-score) and summarises the rest.
pub fn summarize(samples: &[f64]) -> Summary {
    let mut xs = Vec::with_capacity(samples.len());
    xs.extend(samples.iter().copied().filter(|x| x.is_finite()));
    // Values equal under `total_cmp` are the same bits, so any sort gives the same slice.
    xs.sort_unstable_by(f64::total_cmp);
    let non_finite = samples.len() - xs.len();
    if xs.is_empty() {
        return Summary {
            median: f64::NAN,
            ci_low: f64::NAN,
            ci_high: f64::NAN,
            kept: 0,
            outliers: non_finite,
        };
    }
    let m = median_sorted(&xs);
    let mad = median_deviation(&xs, m);
    let finite = xs.len();
    if mad > 0.0 {
        xs.retain(|x| (0.6745 * (x - m) / mad).abs() <= OUTLIER_Z);
    }
    let outliers = finite - xs.len() + non_finite;
    let (l, u) = median_ci_indices(xs.len());
    Summary {
        median: median_sorted(&xs),
        ci_low: xs[l],
        ci_high: xs[u],
        kept: xs.len(),
        outliers,
    }
}

/// The median of `|x − m|` over sorted, non-empty `xs`. The deviations grow away from `m` on
/// each side, so walking outwards from `m` takes them in ascending order: no second sort.
fn median_deviation(xs: &[f64], m: f64) -> f64 {
    let n = xs.len();
    // Walked so far: xs[below..above]; xs[..below] lie below m.
    let mut below = xs.partition_point(|&x| x < m);
    let mut above = below;
    let mut next = || {
        let down = below.checked_sub(1).map(|i| (xs[i] - m).abs());
        let up = xs.get(above).map(|x| (x - m).abs());
        match (down, up) {
            (Some(d), u) if u.is_none_or(|u| d < u) => {
                below -= 1;
                d
            }
            (_, u) => {
                above += 1;
                u.unwrap_or(f64::NAN)
            }
        }
    };
    // The n/2-th smallest deviation and the one before it, as `median_sorted` reads them.
    let mut cur = next();
    let mut prev = cur;
    for _ in 0..n / 2 {
        prev = cur;
        cur = next();
    }
    if n % 2 == 1 {
        cur
    } else {
        (prev + cur) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_indices_match_tables() {
        // Conover's table A3 / standard results: n=10 → (x(2), x(9)) 1-based, i.e. (1, 8).
        assert_eq!(median_ci_indices(10), (1, 8));
        // n=20 → (x(6), x(15)) 1-based.
        assert_eq!(median_ci_indices(20), (5, 14));
        // n=100 → (x(40), x(61)) 1-based.
        assert_eq!(median_ci_indices(100), (39, 60));
        assert_eq!(median_ci_indices(3), (0, 2));
    }

    #[test]
    fn outlier_is_removed() {
        let mut xs: Vec<f64> = (0..20).map(|i| 10.0 + (i % 5) as f64 * 0.1).collect();
        xs.push(50.0);
        let s = summarize(&xs);
        assert_eq!(s.outliers, 1);
        assert_eq!(s.kept, 20);
        assert!((s.median - 10.2).abs() < 1e-9, "{}", s.median);
        assert!(s.ci_low <= s.median && s.median <= s.ci_high);
    }

    #[test]
    fn a_minority_at_another_level_is_dropped_as_outliers() {
        // What a revisit that met the machine 20% slower leaves of a long, tight first visit.
        let first = (0..20).map(|i| 10.0 + (i % 3) as f64 * 0.01);
        let later = (0..8).map(|i| 12.0 + (i % 3) as f64 * 0.01);
        let s = summarize(&first.chain(later).collect::<Vec<_>>());
        assert_eq!((s.outliers, s.kept), (8, 20));
        assert!(s.ci_high < 10.1, "{s:?}");
    }

    #[test]
    fn constant_samples_have_zero_width() {
        let s = summarize(&[5.0; 12]);
        assert_eq!(
            (s.median, s.ci_low, s.ci_high, s.outliers),
            (5.0, 5.0, 5.0, 0)
        );
        assert_eq!(s.rel_half_width(), 0.0);
    }

    #[test]
    fn non_finite_counted_as_outliers() {
        let s = summarize(&[1.0, 1.0, f64::NAN, 1.0, 1.0, 1.0, 1.0]);
        assert_eq!(s.outliers, 1);
        assert_eq!(s.median, 1.0);
    }

    #[test]
    fn the_deviations_median_is_the_sorted_ones() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for n in 1..60 {
            for _ in 0..50 {
                // Few distinct levels make ties; a spread of scales makes uneven sides.
                let xs: Vec<f64> = (0..n)
                    .map(|_| {
                        let level = rng.random_range(0..4) as f64;
                        10f64.powi(rng.random_range(-3..12)) * (1.0 + level * rng.random::<f64>())
                    })
                    .collect();
                let mut sorted = xs.clone();
                sorted.sort_by(f64::total_cmp);
                let m = median_sorted(&sorted);
                let mut dev: Vec<f64> = sorted.iter().map(|x| (x - m).abs()).collect();
                dev.sort_by(f64::total_cmp);
                let want = median_sorted(&dev);
                assert_eq!(
                    median_deviation(&sorted, m).to_bits(),
                    want.to_bits(),
                    "{xs:?}"
                );
            }
        }
    }
}

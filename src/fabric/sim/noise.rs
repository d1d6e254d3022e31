//! Seeded measurement noise, so simulated samples look like timings of a real machine: a small
//! multiplicative jitter on every sample and, now and then, an outlier (a preempted launch, a
//! clock dip) several times slower. Same seed and same call sequence give the same samples.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Relative jitter of a single call (σ); averaging a batch leaves a floor of the same size
/// (clocks and neighbours drift batch to batch), so σ runs 2% → 1%.
const JITTER_CALL: f64 = 0.01;
const JITTER_FLOOR: f64 = 0.01;
/// Share of samples that are outliers, and how much slower they are.
const OUTLIER_P: f64 = 0.03;
const OUTLIER_MIN: f64 = 1.3;
const OUTLIER_MAX: f64 = 3.0;

#[derive(Debug, Clone)]
pub struct Noise {
    rng: ChaCha8Rng,
}

impl Noise {
    pub fn new(seed: u64) -> Noise {
        Noise {
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// A standard normal draw (Box–Muller).
    fn normal(&mut self) -> f64 {
        let u1: f64 = self.rng.random::<f64>().max(f64::MIN_POSITIVE);
        let u2: f64 = self.rng.random::<f64>();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Jitter alone, for a probe that averages `batch` transfers.
    pub fn jitter(&mut self, batch: u32) -> f64 {
        let sigma = JITTER_FLOOR + JITTER_CALL / (batch.max(1) as f64).sqrt();
        (1.0 + sigma * self.normal()).max(0.9)
    }

    /// Multiplier for one sample that averages `batch` calls.
    pub fn factor(&mut self, batch: u32) -> f64 {
        let jitter = self.jitter(batch);
        if self.rng.random_bool(OUTLIER_P) {
            jitter * self.rng.random_range(OUTLIER_MIN..OUTLIER_MAX)
        } else {
            jitter
        }
    }

    /// One noisy sample of a call whose noiseless time is `base_us`.
    pub fn sample(&mut self, base_us: f64, batch: u32) -> f64 {
        base_us * self.factor(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_samples() {
        let (mut a, mut b) = (Noise::new(7), Noise::new(7));
        let xa: Vec<f64> = (0..100).map(|_| a.sample(10.0, 1)).collect();
        let xb: Vec<f64> = (0..100).map(|_| b.sample(10.0, 1)).collect();
        assert_eq!(xa, xb);
        let mut c = Noise::new(8);
        assert_ne!(xa, (0..100).map(|_| c.sample(10.0, 1)).collect::<Vec<_>>());
    }

    #[test]
    fn jitter_is_small_and_outliers_are_rare() {
        let mut n = Noise::new(1);
        let xs: Vec<f64> = (0..20_000).map(|_| n.factor(10)).collect();
        let outliers = xs.iter().filter(|&&x| x >= 1.25).count() as f64 / xs.len() as f64;
        assert!((0.02..0.04).contains(&outliers), "{outliers}");
        let mut inliers: Vec<f64> = xs.iter().copied().filter(|&x| x < 1.25).collect();
        inliers.sort_by(f64::total_cmp);
        let median = inliers[inliers.len() / 2];
        assert!((median - 1.0).abs() < 0.005, "{median}");
        // σ ≈ 1.3% at batch 10: the 16th–84th percentile span is about 2σ.
        let span = inliers[inliers.len() * 84 / 100] - inliers[inliers.len() * 16 / 100];
        assert!((0.015..0.04).contains(&span), "{span}");
        assert!(xs.iter().all(|&x| x < 3.0 * 1.1));
    }
}

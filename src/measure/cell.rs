//! One (backend, size, mode) cell: its samples, when it has enough, and its timing.

use super::{check_interrupt, Harness, Rivals};
use crate::allreduce::{Backend, Mode};
use crate::cancel::Cancel;
use crate::fabric::{Fabric, FabricError};
use crate::results::{ModelBand, Timing};
use crate::stats::{self, Summary};

/// One cell's samples so far, kept while its group is measured so a close call can add more.
#[derive(Debug, Clone)]
pub struct Sampled {
    pub samples: Vec<f64>,
    /// Calls averaged per sample, fixed at the warm-up.
    pub batch: u32,
    /// Measured time spent on the cell, µs: what [`Harness::time_cap_us`] caps.
    pub spent_us: f64,
    /// The model's error band on its times, which the rule widens their interval by; None
    /// where measured.
    pub model: Option<ModelBand>,
}

impl Sampled {
    /// Warm-up, then the batch that makes a sample about [`Harness::batch_target_us`] long.
    /// Where `below_us`, the backend's median at a smaller size, is already over that target,
    /// the warm-up starts with one call: one over the target fixes the batch at one call, and
    /// the fabric warms each backend itself before it times it, so the rest is skipped.
    pub fn start(
        fabric: &mut dyn Fabric,
        backend: Backend,
        bytes: u64,
        mode: Mode,
        h: &Harness,
        below_us: Option<f64>,
    ) -> Result<Sampled, FabricError> {
        let want = h.warmup_samples.max(1);
        let long = |w: &[f64]| w.iter().any(|x| *x >= h.batch_target_us);
        let mut warm = match below_us {
            Some(t) if t >= h.batch_target_us => fabric.time(backend, bytes, mode, 1, 1)?,
            _ => fabric.time(backend, bytes, mode, 1, want)?,
        };
        if (warm.len() as u32) < want && !long(&warm) {
            let more = want - warm.len() as u32;
            warm.extend(fabric.time(backend, bytes, mode, 1, more)?);
        }
        let mut w: Vec<f64> = warm
            .iter()
            .copied()
            .filter(|x| x.is_finite() && *x > 0.0)
            .collect();
        w.sort_by(f64::total_cmp);
        let est = stats::median_sorted(&w);
        let batch = if est.is_finite() && est > 0.0 {
            ((h.batch_target_us / est).ceil() as u32).clamp(1, h.max_batch)
        } else {
            1
        };
        Ok(Sampled {
            samples: Vec::new(),
            batch,
            spent_us: 0.0,
            model: fabric.model_band(backend, bytes).map(Into::into),
        })
    }

    /// How many samples the cell's next round takes: the first round's (where hopeless cells
    /// stop), the rest of the minimum, then a step.
    pub fn round_len(&self, h: &Harness) -> u32 {
        let taken = self.samples.len() as u32;
        match h.hopeless {
            _ if taken >= h.min_samples => h.step_samples,
            Some(x) if taken == 0 => x.first_samples.clamp(1, h.min_samples),
            _ => h.min_samples - taken,
        }
    }

    /// The timing its samples so far stand for, with its model band; a cell without one
    /// valid sample fails its backend.
    pub fn timing(&self, backend: Backend, s: &Summary) -> Result<Timing, FabricError> {
        timing(backend, s).map(|t| Timing {
            model: self.model,
            ..t
        })
    }

    /// Adds `n` samples.
    pub fn add(
        &mut self,
        fabric: &mut dyn Fabric,
        backend: Backend,
        bytes: u64,
        mode: Mode,
        n: u32,
    ) -> Result<(), FabricError> {
        let got = fabric.time(backend, bytes, mode, self.batch, n)?;
        self.spent_us += got.iter().filter(|x| x.is_finite()).sum::<f64>() * self.batch as f64;
        self.samples.extend(got);
        Ok(())
    }

    /// The samples so far, outliers removed.
    pub fn summary(&self) -> Summary {
        stats::summarize(&self.samples)
    }

    /// Whether the caps leave room for more samples.
    pub fn room(&self, h: &Harness) -> bool {
        self.spent_us < h.time_cap_us && self.samples.len() < h.max_samples as usize
    }

    /// The one stopping rule: whether more samples could no longer change what this cell
    /// tells the steering rule. Always at a cap; in the sweep, once [`Self::hopeless`];
    /// otherwise never below the minimum. In the sweep, once the interval is within the
    /// target, or (racing) the cell is clearly slower than the fastest of its `rivals`. In a
    /// close call, once the interval is within [`Harness::settle_ci`]: the verdict could then
    /// only flip between two backends within the rule's effect of each other.
    pub fn done(&self, s: &Summary, h: &Harness, rivals: &Rivals, stage: Stage) -> bool {
        if !self.room(h) || (stage == Stage::Sweep && self.hopeless(h, rivals)) {
            return true;
        }
        if s.kept < h.min_samples as usize {
            return false;
        }
        match stage {
            Stage::Sweep => {
                // Racing still wants a median worth reporting (what forcing it would cost):
                // within five times the target, so a run of early spikes cannot stand for it.
                let lost = match (h.race_margin, rivals.fastest) {
                    (Some(m), Some(r)) => {
                        s.ci_low > r.ci_high_us * (1.0 + m)
                            && s.rel_half_width() <= 5.0 * h.target_ci
                    }
                    _ => false,
                };
                s.rel_half_width() <= h.target_ci || lost
            }
            Stage::CloseCall => h.settle_ci.is_some_and(|t| s.rel_half_width() <= t),
        }
    }

    /// Whether the cell is out of the running ([`super::Hopeless`]): after its first round, its
    /// fastest sample is over the factor times the upper bound of [`Rivals::everywhere`]. Its
    /// fastest sample, outliers included, rather than its interval: a few samples' interval is
    /// their range anyway (`stats::median_ci_indices`), and a fast sample set aside as an
    /// outlier must not make the cell look slower. A slow moment cannot make a cell hopeless:
    /// rounds interleave the cells, so it slows the rival's samples and raises its bound too.
    pub fn hopeless(&self, h: &Harness, rivals: &Rivals) -> bool {
        let (Some(x), Some(r)) = (h.hopeless, rivals.everywhere) else {
            return false;
        };
        if self.samples.len() < x.first_samples as usize {
            return false;
        }
        let finite = || self.samples.iter().copied().filter(|t| t.is_finite());
        // Most cells are in the running: their floor says so before any sort.
        let Some(floor) = finite().min_by(f64::total_cmp) else {
            return false;
        };
        let far = floor * self.model.map_or(1.0, |m| m.low) > x.factor * super::widened_high(&r);
        if !far {
            return false;
        }
        let mut sorted: Vec<f64> = finite().collect();
        sorted.sort_unstable_by(f64::total_cmp);
        stats::median_sorted(&sorted) <= x.agree * floor
    }
}

/// What a cell's next samples are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Its visits in the sweep: a median within the target, unless it clearly lost.
    Sweep,
    /// A close call the steering rule's intervals leave open.
    CloseCall,
}

/// The timing a summary stands for; a cell without one valid sample fails its backend.
pub fn timing(backend: Backend, s: &Summary) -> Result<Timing, FabricError> {
    if !s.median.is_finite() {
        return Err(FabricError::Backend {
            backend,
            reason: "it returned no valid timings".into(),
        });
    }
    Ok(Timing {
        median_us: s.median,
        ci_low_us: s.ci_low,
        ci_high_us: s.ci_high,
        samples: s.kept as u32,
        outliers: s.outliers as u32,
        model: None,
    })
}

/// Times one cell on its own: warm-up, pick a batch size, then sample until it is
/// [`Sampled::done`].
pub fn measure_cell(
    fabric: &mut dyn Fabric,
    backend: Backend,
    bytes: u64,
    mode: Mode,
    h: &Harness,
    rival: Option<&Timing>,
    cancel: &Cancel,
) -> Result<Timing, FabricError> {
    let mut cell = Sampled::start(fabric, backend, bytes, mode, h, None)?;
    loop {
        // A cell can take a second or more on a GPU: stop between its rounds too.
        check_interrupt(cancel)?;
        cell.add(fabric, backend, bytes, mode, cell.round_len(h))?;
        let s = cell.summary();
        let rivals = Rivals {
            fastest: rival.copied(),
            everywhere: None,
        };
        if cell.done(&s, h, &rivals, Stage::Sweep) {
            return cell.timing(backend, &s);
        }
    }
}

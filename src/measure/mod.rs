//! The measurement harness, shared by every fabric.
//!
//! For each GPU group: prepare the backends, run the contention probes, then for each mode
//! and size verify each backend on fresh data and time it until the 95% confidence interval of
//! its median is within the target (or a cap is hit). Where the winner changes between
//! neighbouring sizes (by the rule the plan carries), [`plan::refine_points`] asks for sizes in
//! between.

use std::collections::BTreeMap;

use crate::cancel::Cancel;
use crate::fabric::{
    Backend, Direction, Dtype, Fabric, FabricError, Group, Mode, Readiness, Verification,
};
use crate::plan::{self, Winner};
use crate::profile::{ContentionCurve, GroupPhases, Timing};
pub use crate::results::GroupResults;
use crate::stats;

/// How hard to measure one (backend, size, mode) cell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Harness {
    /// Target half-width of the median's 95% CI, relative to the median.
    pub target_ci: f64,
    pub warmup_samples: u32,
    pub min_samples: u32,
    pub max_samples: u32,
    /// Samples added per round once the minimum is reached.
    pub step_samples: u32,
    /// Aim for batches of about this many microseconds (event timing resolution).
    pub batch_target_us: f64,
    pub max_batch: u32,
    /// Stop a cell after this much measured time even if the CI is wider than the target.
    pub time_cap_us: f64,
    /// Bytes each GPU moves per peer in a contention probe.
    pub probe_bytes: u64,
    /// Bisection rounds where the winner changes between neighbouring sizes.
    pub refine_rounds: u32,
    /// Racing: once a cell's interval lies wholly above the fastest interval already measured
    /// at that size, by more than this fraction, and its median is known within five times
    /// the target, it stops sampling; more samples could not make it the choice. `None`
    /// samples every cell to its target.
    pub race_margin: Option<f64>,
}

impl Default for Harness {
    fn default() -> Self {
        Harness {
            target_ci: 0.02,
            warmup_samples: 3,
            min_samples: 10,
            max_samples: 200,
            step_samples: 10,
            batch_target_us: 200.0,
            max_batch: 100,
            time_cap_us: 1.0e6,
            probe_bytes: 16 << 20,
            refine_rounds: 3,
            race_margin: None,
        }
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    /// GPU sets with a label saying what sets each apart.
    pub groups: Vec<(Vec<usize>, String)>,
    pub modes: Vec<Mode>,
    pub dtype: Dtype,
    /// Grid of sizes (bytes), ascending.
    pub sizes: Vec<u64>,
    pub backends: Vec<Backend>,
    pub seed: u64,
    pub contention: bool,
    pub harness: Harness,
    /// Checked between measurements: once cancelled, the run ends with `Interrupted`.
    pub cancel: Cancel,
    /// Names the winner at a size, to refine the grid where it changes.
    pub winner: Winner,
}

/// Progress events for a UI; the harness knows nothing about terminals.
#[derive(Debug, Clone)]
pub enum Progress {
    /// Roughly this many cells remain to be measured in total.
    Planned(u64),
    Group {
        gpus: Vec<usize>,
        placement: String,
    },
    Cell {
        backend: Backend,
        bytes: u64,
        mode: Mode,
    },
    /// A backend was disqualified (wrong result, timeout, failure); the text is also in the
    /// returned faults. Shown as it happens, so a long tune does not hide it until the end.
    Fault(String),
}

/// Runs the plan. Backend-local failures disqualify that backend for the group and are
/// returned as faults; device failures and interrupts end the run.
pub fn run(
    fabric: &mut dyn Fabric,
    plan: &Plan,
    progress: &mut dyn FnMut(Progress),
) -> Result<(Vec<GroupResults>, Vec<String>), FabricError> {
    let per_group = (plan.modes.len() * plan.sizes.len() * plan.backends.len()) as u64;
    progress(Progress::Planned(per_group * plan.groups.len() as u64));
    let mut out = Vec::new();
    let mut faults = Vec::new();
    for (gpus, placement) in &plan.groups {
        progress(Progress::Group {
            gpus: gpus.clone(),
            placement: placement.clone(),
        });
        let r = measure_group(fabric, plan, gpus, placement, progress, &mut faults);
        let mut release_s = 0.0;
        let released = timed(&mut release_s, || fabric.release());
        let mut r = r?;
        released?;
        r.phases.setup_s += release_s;
        out.push(r);
    }
    Ok((out, faults))
}

/// Runs `f`, adding its wall-clock seconds to `acc`.
fn timed<T>(acc: &mut f64, f: impl FnOnce() -> T) -> T {
    let start = std::time::Instant::now();
    let out = f();
    *acc += start.elapsed().as_secs_f64();
    out
}

fn check_interrupt(cancel: &Cancel) -> Result<(), FabricError> {
    if cancel.is_cancelled() {
        Err(FabricError::Interrupted)
    } else {
        Ok(())
    }
}

fn measure_group(
    fabric: &mut dyn Fabric,
    plan: &Plan,
    gpus: &[usize],
    placement: &str,
    progress: &mut dyn FnMut(Progress),
    faults: &mut Vec<String>,
) -> Result<GroupResults, FabricError> {
    let max_bytes = plan.sizes.last().copied().unwrap_or(0);
    let group = Group {
        gpus: gpus.to_vec(),
        dtype: plan.dtype,
        max_bytes,
    };
    let mut phases = GroupPhases {
        gpus: gpus.to_vec(),
        ..Default::default()
    };
    let readiness = timed(&mut phases.setup_s, || {
        fabric.prepare(&group, &plan.backends)
    })?;
    let mut res = GroupResults {
        gpus: gpus.to_vec(),
        placement: placement.into(),
        readiness,
        nccl_channels: fabric.nccl_channels(),
        phases,
        ..Default::default()
    };
    let ready: Vec<Backend> = res
        .readiness
        .iter()
        .filter_map(|r| match r {
            Readiness::Ready { backend, .. } => Some(*backend),
            Readiness::Waived { .. } => None,
        })
        .collect();

    if plan.contention && gpus.len() > 1 {
        'probes: for direction in [Direction::Read, Direction::Write] {
            let mut points = Vec::new();
            for peers in 1..gpus.len() {
                check_interrupt(&plan.cancel)?;
                let probe = timed(&mut res.phases.probes_s, || {
                    fabric.probe(direction, peers, plan.harness.probe_bytes)
                });
                match probe {
                    Ok(p) => points.push(p),
                    // The reason is in the waived custom backends of the same group.
                    Err(FabricError::Waived(_)) => break 'probes,
                    Err(e) => return Err(e),
                }
            }
            res.contention.push(ContentionCurve {
                gpus: gpus.to_vec(),
                direction,
                bytes: plan.harness.probe_bytes,
                points,
            });
        }
    }

    let mut verified: BTreeMap<(Backend, u64), ()> = BTreeMap::new();
    for &mode in &plan.modes {
        let mut sizes = plan.sizes.clone();
        let mut round = 0;
        loop {
            for &bytes in &sizes {
                for &backend in &ready {
                    if res.disqualified.contains_key(&backend) {
                        continue;
                    }
                    check_interrupt(&plan.cancel)?;
                    progress(Progress::Cell {
                        backend,
                        bytes,
                        mode,
                    });
                    let seed = cell_seed(plan.seed, gpus, backend, bytes);
                    let phases = &mut res.phases;
                    let outcome = (|| {
                        if verified.insert((backend, bytes), ()).is_none() {
                            let v = timed(&mut phases.verify_s, || {
                                fabric.verify(backend, bytes, seed)
                            })?;
                            if let Verification::Wrong { reason } = v {
                                return Ok(Err(format!("wrong result at {bytes} bytes: {reason}")));
                            }
                        }
                        let rival = res
                            .cells
                            .get(&mode)
                            .and_then(|m| m.get(&bytes))
                            .and_then(|c| fastest(c, &res.disqualified));
                        timed(&mut phases.timing_s, || {
                            measure_cell(
                                fabric,
                                backend,
                                bytes,
                                mode,
                                &plan.harness,
                                rival.as_ref(),
                                &plan.cancel,
                            )
                        })
                        .map(Ok)
                    })();
                    match outcome {
                        Ok(Ok(t)) => {
                            res.cells
                                .entry(mode)
                                .or_default()
                                .entry(bytes)
                                .or_default()
                                .insert(backend, t);
                        }
                        Ok(Err(reason)) => disqualify(&mut res, faults, progress, backend, reason),
                        Err(e) if e.backend_local() => {
                            disqualify(&mut res, faults, progress, backend, e.to_string())
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            if round >= plan.harness.refine_rounds {
                break;
            }
            round += 1;
            let cells = res.cells.get(&mode).cloned().unwrap_or_default();
            sizes = plan::refine_points(
                &cells,
                &res.disqualified,
                gpus.len(),
                plan.dtype,
                plan.winner,
            );
            if sizes.is_empty() {
                break;
            }
        }
    }
    // A backend disqualified mid-way must not keep the timings it got before.
    for modes in res.cells.values_mut() {
        for cell in modes.values_mut() {
            cell.retain(|b, _| !res.disqualified.contains_key(b));
        }
    }
    Ok(res)
}

fn disqualify(
    res: &mut GroupResults,
    faults: &mut Vec<String>,
    progress: &mut dyn FnMut(Progress),
    backend: Backend,
    reason: String,
) {
    let fault = format!("GPUs {:?}: {backend} disqualified: {reason}", res.gpus);
    progress(Progress::Fault(fault.clone()));
    faults.push(fault);
    res.disqualified.insert(backend, reason);
}

/// The timing with the lowest upper bound among the backends still in the running: the one
/// a racing cell must be able to beat.
fn fastest(
    cell: &BTreeMap<Backend, Timing>,
    disqualified: &BTreeMap<Backend, String>,
) -> Option<Timing> {
    cell.iter()
        .filter(|(b, _)| !disqualified.contains_key(b))
        .map(|(_, t)| *t)
        .min_by(|a, b| a.ci_high_us.total_cmp(&b.ci_high_us))
}

/// A seed per cell so each backend sees fresh data, reproducibly.
fn cell_seed(seed: u64, gpus: &[usize], backend: Backend, bytes: u64) -> u64 {
    let mut h = seed ^ 0x9e37_79b9_7f4a_7c15;
    for v in gpus
        .iter()
        .map(|&g| g as u64)
        .chain([backend as u64, bytes])
    {
        h = (h ^ v).wrapping_mul(0x0100_0000_01b3).rotate_left(17);
    }
    h
}

/// Times one cell: warm-up, pick a batch size, then sample until the CI is tight or capped,
/// or (racing) until it is clearly slower than `rival`, the fastest cell at this size so far.
pub fn measure_cell(
    fabric: &mut dyn Fabric,
    backend: Backend,
    bytes: u64,
    mode: Mode,
    h: &Harness,
    rival: Option<&Timing>,
    cancel: &Cancel,
) -> Result<Timing, FabricError> {
    let warm = fabric.time(backend, bytes, mode, 1, h.warmup_samples.max(1))?;
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
    let mut samples: Vec<f64> = Vec::new();
    let mut spent = 0.0;
    loop {
        // A cell can take a second or more on a GPU: stop between its rounds too.
        check_interrupt(cancel)?;
        let n = if samples.is_empty() {
            h.min_samples
        } else {
            h.step_samples
        };
        let got = fabric.time(backend, bytes, mode, batch, n)?;
        spent += got.iter().filter(|x| x.is_finite()).sum::<f64>() * batch as f64;
        samples.extend(got);
        let s = stats::summarize(&samples);
        let enough = s.kept >= h.min_samples as usize;
        // Racing still wants a median worth reporting (what forcing it would cost): within
        // five times the target, so a run of early spikes cannot stand for the cell.
        let lost = match (h.race_margin, rival) {
            (Some(m), Some(r)) => {
                s.ci_low > r.ci_high_us * (1.0 + m) && s.rel_half_width() <= 5.0 * h.target_ci
            }
            _ => false,
        };
        let done = enough && (s.rel_half_width() <= h.target_ci || lost);
        if done || spent >= h.time_cap_us || samples.len() >= h.max_samples as usize {
            if !s.median.is_finite() {
                return Err(FabricError::Backend {
                    backend,
                    reason: "it returned no valid timings".into(),
                });
            }
            return Ok(Timing {
                median_us: s.median,
                ci_low_us: s.ci_low,
                ci_high_us: s.ci_high,
                samples: s.kept as u32,
                outliers: s.outliers as u32,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::sim::SimFabric;
    use crate::fabric::{FabricInfo, ProbeSample};
    use crate::topology::Topology;

    /// The simulated machine, except that contention probes cannot run on it (a group
    /// without working P2P on a real machine).
    struct NoProbes(SimFabric);

    impl Fabric for NoProbes {
        fn info(&self) -> FabricInfo {
            self.0.info()
        }
        fn topology(&self) -> &Topology {
            self.0.topology()
        }
        fn prepare(&mut self, g: &Group, b: &[Backend]) -> Result<Vec<Readiness>, FabricError> {
            self.0.prepare(g, b)
        }
        fn verify(&mut self, b: Backend, n: u64, s: u64) -> Result<Verification, FabricError> {
            self.0.verify(b, n, s)
        }
        fn time(
            &mut self,
            b: Backend,
            n: u64,
            m: Mode,
            batch: u32,
            samples: u32,
        ) -> Result<Vec<f64>, FabricError> {
            self.0.time(b, n, m, batch, samples)
        }
        fn probe(&mut self, _: Direction, _: usize, _: u64) -> Result<ProbeSample, FabricError> {
            Err(FabricError::Waived("no P2P between GPU 0 and GPU 1".into()))
        }
        fn release(&mut self) -> Result<(), FabricError> {
            self.0.release()
        }
    }

    #[test]
    fn probes_that_cannot_run_leave_the_group_without_curves_not_the_tune_failed() {
        let t = crate::topology::presets::get("pcie-8x-2switch").unwrap();
        let mut f = NoProbes(SimFabric::new(t, 1));
        let plan = Plan {
            groups: vec![(vec![0, 1], "test".into())],
            modes: vec![Mode::Graph],
            dtype: Dtype::Bf16,
            sizes: vec![4096, 1 << 20],
            backends: vec![Backend::Nccl, Backend::OneStagePull],
            seed: 1,
            contention: true,
            harness: Harness {
                refine_rounds: 0,
                ..Harness::default()
            },
            cancel: Cancel::new(),
            winner: crate::decide::winner,
        };
        let (groups, faults) = run(&mut f, &plan, &mut |_| {}).unwrap();
        assert!(faults.is_empty(), "{faults:?}");
        assert!(groups[0].contention.is_empty());
        assert_eq!(groups[0].cells[&Mode::Graph].len(), 2);
    }

    /// A fabric whose only timings are noisy: `slow` takes twice as long as everyone else,
    /// with a 15% spread no 2% target is met within a few samples.
    struct Noisy {
        inner: SimFabric,
        slow: Backend,
        draws: u64,
    }

    impl Fabric for Noisy {
        fn info(&self) -> FabricInfo {
            self.inner.info()
        }
        fn topology(&self) -> &Topology {
            self.inner.topology()
        }
        fn prepare(&mut self, g: &Group, b: &[Backend]) -> Result<Vec<Readiness>, FabricError> {
            self.inner.prepare(g, b)
        }
        fn verify(&mut self, b: Backend, n: u64, s: u64) -> Result<Verification, FabricError> {
            self.inner.verify(b, n, s)
        }
        fn time(
            &mut self,
            b: Backend,
            _: u64,
            _: Mode,
            _: u32,
            samples: u32,
        ) -> Result<Vec<f64>, FabricError> {
            let base = if b == self.slow { 20.0 } else { 10.0 };
            let spread = if b == self.slow { 0.15 } else { 0.01 };
            Ok((0..samples)
                .map(|_| {
                    self.draws += 1;
                    let u = (self.draws.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 11) as f64
                        / (1u64 << 53) as f64;
                    base * (1.0 + spread * (u - 0.5))
                })
                .collect())
        }
        fn probe(&mut self, _: Direction, _: usize, _: u64) -> Result<ProbeSample, FabricError> {
            Err(FabricError::Waived("not probed".into()))
        }
        fn release(&mut self) -> Result<(), FabricError> {
            self.inner.release()
        }
    }

    fn samples_of_the_slow_cell(race_margin: Option<f64>) -> (u32, Timing) {
        let t = crate::topology::presets::get("pcie-8x-2switch").unwrap();
        let mut f = Noisy {
            inner: SimFabric::new(t, 1),
            slow: Backend::OneStagePull,
            draws: 0,
        };
        let plan = Plan {
            groups: vec![(vec![0, 1], "test".into())],
            modes: vec![Mode::Graph],
            dtype: Dtype::Bf16,
            sizes: vec![4096],
            backends: vec![Backend::Nccl, Backend::OneStagePull],
            seed: 1,
            contention: false,
            harness: Harness {
                refine_rounds: 0,
                race_margin,
                ..Harness::default()
            },
            cancel: Cancel::new(),
            winner: crate::decide::winner,
        };
        let (groups, _) = run(&mut f, &plan, &mut |_| {}).unwrap();
        let t = groups[0].cells[&Mode::Graph][&4096][&Backend::OneStagePull];
        (t.samples, t)
    }

    #[test]
    fn racing_stops_a_clearly_slower_cell_at_its_minimum_and_keeps_it_beaten() {
        let (raced, t) = samples_of_the_slow_cell(Some(0.05));
        let (full, _) = samples_of_the_slow_cell(None);
        let min = Harness::default().min_samples;
        assert_eq!(raced, min, "{t:?}");
        assert!(full > 3 * min, "without racing it samples on: {full}");
        // What racing stops on is what the rule needs: NCCL (10 us) beats it.
        assert!(t.ci_low_us > 10.0 * 1.05 * 1.01, "{t:?}");
    }
}

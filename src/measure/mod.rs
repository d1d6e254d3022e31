//! The measurement harness, shared by every fabric.
//!
//! For each GPU group: prepare the backends, run the contention probes, then for each mode
//! and size verify each backend on fresh data and time them all, in turn (`size.rs`), until the
//! 95% confidence interval of each median is within the target (or a cap is hit). Where the
//! winner changes between neighbouring sizes (by the rule the plan carries),
//! [`plan::refine_points`] asks for sizes in between. Then every cell is revisited once, and
//! close calls are sampled until settled.

use std::collections::{BTreeMap, BTreeSet};

use crate::cancel::Cancel;
use crate::fabric::{Backend, Direction, Dtype, Fabric, FabricError, Group, Mode, Readiness};
use crate::plan::{self, CloseCalls, Winner};
use crate::profile::{ContentionCurve, GroupPhases, Timing};
pub use crate::results::GroupResults;

mod cell;
mod size;

pub use cell::{measure_cell, Sampled};
use size::{At, Raw};

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
    /// At most this many rounds of bisection where the winner changes between neighbouring
    /// sizes; it stops earlier once no change is left wider than a step. Three reach the
    /// finest step from the powers of two; the rest follow band edges that sizes added later
    /// move into a gap not yet bisected.
    pub refine_rounds: u32,
    /// Racing: once a cell's interval lies wholly above the fastest interval already measured
    /// at that size, by more than this fraction, and its median is known within five times
    /// the target, it stops sampling; more samples could not make it the choice. `None`
    /// samples every cell to its target.
    pub race_margin: Option<f64>,
    /// Contenders: two cells at one size whose intervals are not apart by more than this
    /// fraction. A cell that is finished keeps sampling, in turn with the others, while a
    /// contender still samples, so both medians come from the same moments. `None` lets each
    /// cell stop on its own.
    pub contender_margin: Option<f64>,
    /// Once the sweep (and its refinement) is over, every cell gets one more round and close
    /// calls are settled again: seconds after its first samples, so a backend whose time
    /// drifts (NCCL's host-side launch path on a busy host, in eager mode) gets an interval as
    /// wide as its drift, and a verdict that only held at one moment no longer holds.
    pub revisit: bool,
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
            refine_rounds: 8,
            race_margin: None,
            contender_margin: None,
            revisit: false,
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
    /// Names the close calls at a size, to sample them until settled; None samples each cell
    /// once, to its target.
    pub close_calls: Option<CloseCalls>,
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

    let mut verified = BTreeSet::new();
    for &mode in &plan.modes {
        let mut raw = Raw::new();
        let mut sizes = plan.sizes.clone();
        let mut round = 0;
        let mut revisited = !plan.harness.revisit;
        loop {
            for &bytes in &sizes {
                let mut at = At {
                    fabric: &mut *fabric,
                    plan,
                    mode,
                    bytes,
                };
                at.measure(&ready, &mut verified, &mut res, &mut raw, progress, faults)?;
            }
            let mut refine = round < plan.harness.refine_rounds;
            let mut next = if refine {
                refinement(&res, mode, gpus.len(), plan)
            } else {
                Vec::new()
            };
            if next.is_empty() && !revisited {
                // Every size once more, now that the sweep is over: seconds after its first.
                revisited = true;
                sizes = res
                    .cells
                    .get(&mode)
                    .map(|c| c.keys().copied().collect())
                    .unwrap_or_default();
                for &bytes in &sizes {
                    let mut at = At {
                        fabric: &mut *fabric,
                        plan,
                        mode,
                        bytes,
                    };
                    at.revisit(&mut res, &mut raw, progress, faults)?;
                }
                refine = round < plan.harness.refine_rounds;
            }
            if let Some(close_calls) = plan.close_calls {
                for &bytes in &sizes {
                    let mut at = At {
                        fabric: &mut *fabric,
                        plan,
                        mode,
                        bytes,
                    };
                    at.settle(close_calls, &mut res, &mut raw, progress, faults)?;
                }
            }
            if refine {
                next = refinement(&res, mode, gpus.len(), plan);
            }
            if next.is_empty() {
                break;
            }
            round += 1;
            sizes = next;
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

/// The sizes to bisect next in `mode`, given everything measured so far.
fn refinement(res: &GroupResults, mode: Mode, tp: usize, plan: &Plan) -> Vec<u64> {
    let cells = res.cells.get(&mode).cloned().unwrap_or_default();
    plan::refine_points(&cells, &res.disqualified, tp, plan.dtype, plan.winner)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::sim::SimFabric;
    use crate::fabric::Verification;
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
            close_calls: Some(crate::decide::unsettled),
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
            close_calls: Some(crate::decide::unsettled),
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

    /// Each backend at a base time with a uniform spread (fraction of it), NCCL at 10 us and
    /// one kernel 6.4% faster within ±2% unless told otherwise: a close call at the rule's
    /// effect that the first samples leave open.
    struct Close {
        inner: SimFabric,
        draws: u64,
        kernel: (f64, f64),
        nccl_spread: f64,
    }

    impl Fabric for Close {
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
            let (base, spread) = if b == Backend::Nccl {
                (10.0, self.nccl_spread)
            } else {
                self.kernel
            };
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

    fn close_call(close_calls: Option<CloseCalls>) -> BTreeMap<Backend, Timing> {
        sample_close(close_calls, (9.4, 0.04), 0.04, Harness::default())
    }

    fn sample_close(
        close_calls: Option<CloseCalls>,
        kernel: (f64, f64),
        nccl_spread: f64,
        harness: Harness,
    ) -> BTreeMap<Backend, Timing> {
        let t = crate::topology::presets::get("pcie-8x-2switch").unwrap();
        let mut f = Close {
            inner: SimFabric::new(t, 1),
            draws: 0,
            kernel,
            nccl_spread,
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
                ..harness
            },
            cancel: Cancel::new(),
            winner: crate::decide::winner,
            close_calls,
        };
        let (groups, _) = run(&mut f, &plan, &mut |_| {}).unwrap();
        groups[0].cells[&Mode::Graph][&4096].clone()
    }

    #[test]
    fn a_finished_cell_keeps_sampling_beside_a_contender_that_is_not() {
        // NCCL needs many samples (±15%); the kernel, 1% faster and ±0.5%, needs ten.
        let h = |contender_margin| Harness {
            contender_margin,
            ..Harness::default()
        };
        let alone = sample_close(None, (9.9, 0.01), 0.3, h(None));
        let min = Harness::default().min_samples;
        let (k, n) = (Backend::OneStagePull, Backend::Nccl);
        assert!(
            alone[&k].samples == min && alone[&n].samples > 3 * min,
            "{alone:?}"
        );
        let together = sample_close(None, (9.9, 0.01), 0.3, h(Some(0.05)));
        assert_eq!(together[&k].samples, together[&n].samples, "{together:?}");
        // A kernel twice as fast is no contender: it stops at its minimum.
        let apart = sample_close(None, (5.0, 0.01), 0.3, h(Some(0.05)));
        assert_eq!(apart[&k].samples, min, "{apart:?}");
    }

    #[test]
    fn a_close_call_is_sampled_until_the_intervals_settle_it() {
        let min = Harness::default().min_samples;
        let once = close_call(None);
        assert!(once.values().all(|t| t.samples == min), "{once:?}");
        assert!(crate::decide::open(
            &once[&Backend::OneStagePull],
            &once[&Backend::Nccl]
        ));
        let settled = close_call(Some(crate::decide::unsettled));
        let max = Harness::default().max_samples;
        assert!(
            settled.values().all(|t| t.samples > min && t.samples < max),
            "{settled:?}"
        );
        let (k, n) = (&settled[&Backend::OneStagePull], &settled[&Backend::Nccl]);
        assert!(!crate::decide::open(k, n), "{settled:?}");
        assert!(crate::decide::beats(k, n), "{settled:?}");
    }

    /// Every backend takes 10 us, except while the machine is in a slow phase (30% slower,
    /// draws 16..26 of the whole run): a launch rate that shifts under the measurement.
    struct Phased {
        inner: SimFabric,
        draws: u64,
    }

    impl Fabric for Phased {
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
            _: Backend,
            _: u64,
            _: Mode,
            _: u32,
            samples: u32,
        ) -> Result<Vec<f64>, FabricError> {
            Ok((0..samples)
                .map(|_| {
                    self.draws += 1;
                    let slow = (16..26).contains(&(self.draws - 1));
                    let jitter = 1.0 + 0.001 * (self.draws % 7) as f64;
                    10.0 * jitter * if slow { 1.3 } else { 1.0 }
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

    fn phased() -> Phased {
        let t = crate::topology::presets::get("pcie-8x-2switch").unwrap();
        Phased {
            inner: SimFabric::new(t, 1),
            draws: 0,
        }
    }

    #[test]
    fn contenders_at_one_size_share_the_moments_they_are_sampled_in() {
        let (a, b) = (Backend::OneStagePull, Backend::OneStagePush);
        let h = Harness {
            refine_rounds: 0,
            ..Harness::default()
        };
        // The control: timed one after the other, the second meets the slow phase.
        let mut f = phased();
        let c = Cancel::new();
        let first = measure_cell(&mut f, a, 4096, Mode::Graph, &h, None, &c).unwrap();
        let second = measure_cell(&mut f, b, 4096, Mode::Graph, &h, None, &c).unwrap();
        assert!(
            crate::decide::beats(&first, &second),
            "{first:?} {second:?}"
        );
        // In rounds, sample by sample, both meet it alike: the same speed, no verdict.
        let plan = Plan {
            groups: vec![(vec![0, 1], "test".into())],
            modes: vec![Mode::Graph],
            dtype: Dtype::Bf16,
            sizes: vec![4096],
            backends: vec![a, b],
            seed: 1,
            contention: false,
            harness: h,
            cancel: Cancel::new(),
            winner: crate::decide::winner,
            close_calls: Some(crate::decide::unsettled),
        };
        let (groups, _) = run(&mut phased(), &plan, &mut |_| {}).unwrap();
        let cell = &groups[0].cells[&Mode::Graph][&4096];
        let (ta, tb) = (&cell[&a], &cell[&b]);
        assert!((ta.median_us / tb.median_us - 1.0).abs() < 0.02, "{cell:?}");
        assert!(!crate::decide::beats(ta, tb) && !crate::decide::beats(tb, ta));
    }

    /// NCCL at 10 us for its first 13 calls (warm-up and first round), 7 us after: a host
    /// launch path that speeds up mid-tune. The kernel takes 8 us throughout.
    struct Drifting {
        inner: SimFabric,
        nccl_draws: u64,
    }

    impl Fabric for Drifting {
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
            Ok((0..samples)
                .map(|_| {
                    if b != Backend::Nccl {
                        return 8.0;
                    }
                    self.nccl_draws += 1;
                    if self.nccl_draws <= 13 {
                        10.0
                    } else {
                        7.0
                    }
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

    #[test]
    fn a_revisit_after_the_sweep_sees_a_backend_drift() {
        let choice = |revisit| {
            let t = crate::topology::presets::get("pcie-8x-2switch").unwrap();
            let mut f = Drifting {
                inner: SimFabric::new(t, 1),
                nccl_draws: 0,
            };
            let plan = Plan {
                groups: vec![(vec![0, 1], "test".into())],
                modes: vec![Mode::Eager],
                dtype: Dtype::Bf16,
                sizes: vec![4096],
                backends: vec![Backend::Nccl, Backend::OneStagePull],
                seed: 1,
                contention: false,
                harness: Harness {
                    refine_rounds: 0,
                    revisit,
                    ..Harness::default()
                },
                cancel: Cancel::new(),
                winner: crate::decide::winner,
                close_calls: Some(crate::decide::unsettled),
            };
            let (groups, _) = run(&mut f, &plan, &mut |_| {}).unwrap();
            let cell = groups[0].cells[&Mode::Eager][&4096].clone();
            (crate::decide::rule_choice(&cell, 2, 4096), cell)
        };
        // Timed once, NCCL's slow moment stands and the kernel wins by 25%.
        let (once, cell) = choice(false);
        assert_eq!(once, Some(Backend::OneStagePull), "{cell:?}");
        // Revisited, NCCL's drift shows; settled, NCCL is the faster.
        let (again, cell) = choice(true);
        assert_eq!(again, Some(Backend::Nccl), "{cell:?}");
    }
}

//! The measurement harness, shared by every fabric.
//!
//! For each GPU group: prepare the backends, run the contention probes, then for each mode
//! and size verify each backend on fresh data and time them all, in turn (`size.rs`), until the
//! 95% confidence interval of each median is within the target (or a cap is hit). Where the
//! winner changes between neighbouring sizes (by the rule the plan carries),
//! [`plan::refine_points`] asks for sizes in between. Then every cell is revisited once, and
//! close calls are sampled until settled.

use std::collections::{BTreeMap, BTreeSet};

use crate::allreduce::{Backend, Direction, Dtype, Islands, Mode, Ranks, Readiness};
use crate::cancel::Cancel;
use crate::fabric::{Fabric, FabricError, Group};
use crate::plan::{self, CloseCalls, Placement, Winner};
pub use crate::results::GroupResults;
use crate::results::{ContentionCurve, GroupPhases, Timing};
use crate::topology::occupancy::{BusyGpu, Neighbours};

mod cell;
pub mod channels;
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
    /// Samples each cell takes in its revisit: enough to see a drift, not a new measurement.
    pub revisit_samples: u32,
    /// A close call stops sampling a side once its interval is this narrow (half-width over
    /// the median): past it, the verdict can only flip between two backends within the rule's
    /// effect of each other, which costs at most twice this. `None` samples a close call
    /// until the intervals settle it or a cap is hit.
    pub settle_ci: Option<f64>,
    /// A short first round after which a cell out of the running stops ([`Hopeless`]); `None`
    /// takes every cell to the minimum.
    pub hopeless: Option<Hopeless>,
}

/// A cell so much slower than a rival that no number of samples could bring it into any
/// comparison the steering rule makes: it stops after its first round, is not revisited and
/// never enters a close call, so it costs a few calls instead of the minimum and a revisit.
/// Its median stays, as what forcing it would cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hopeless {
    /// Samples in every cell's first round (at most the minimum; the rest follow in a
    /// second round, so a cell still in the running takes the minimum as before).
    pub first_samples: u32,
    /// A cell is out once its fastest sample is over this many times its rival's upper
    /// bound, each widened by its model band where it has one.
    pub factor: f64,
    /// ... and its median within this many times that fastest sample: the median is what it
    /// reports, and a few samples' median can be a run of spikes (two of four samples 20x
    /// slower made one 10x too slow in `tests/faults.rs`); such a cell samples on.
    pub agree: f64,
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
            revisit_samples: 10,
            settle_ci: None,
            hopeless: None,
        }
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    /// GPU sets, what sets each apart, and their islands.
    pub groups: Vec<Placement>,
    pub modes: Vec<Mode>,
    pub dtype: Dtype,
    /// Grid of sizes (bytes), ascending.
    pub sizes: Vec<u64>,
    /// The reference grid instead: between the grid's ends, every size bisection could ever
    /// add, aligned for each group's own TP size (so a group's sizes do not depend on which
    /// other TP sizes are tuned).
    pub fine: bool,
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
    /// Asked between phases and groups who else is on the GPUs.
    pub neighbours: Neighbours,
}

/// Progress events for a UI; the harness knows nothing about terminals.
#[derive(Debug, Clone)]
pub enum Progress {
    /// Roughly this many steps (cells and contention probes) remain in total.
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
    /// A contention probe starts: every GPU moves bytes with `peers` of `of` peers at once.
    Probe {
        direction: Direction,
        peers: usize,
        of: usize,
    },
    /// A backend was disqualified (wrong result, timeout, failure); the text is also in the
    /// returned faults. Shown as it happens, so a long tune does not hide it until the end.
    Fault(String),
    /// Processes that started using the GPUs while `gpus` were measured (allowed by the plan's
    /// neighbours, and recorded with the group).
    Beside {
        gpus: Vec<usize>,
        who: Vec<BusyGpu>,
    },
}

/// Runs the plan. Backend-local failures disqualify that backend for the group and are
/// returned as faults; device failures and interrupts end the run.
pub fn run(
    fabric: &mut dyn Fabric,
    plan: &Plan,
    progress: &mut dyn FnMut(Progress),
) -> Result<(Vec<GroupResults>, Vec<String>), FabricError> {
    let per_group = (plan.modes.len() * plan.sizes.len() * plan.backends.len()) as u64;
    // A probe is a step of its own: on a large group they take longer than its cells. Each
    // peer count is probed in both directions.
    let probes: u64 = plan
        .groups
        .iter()
        .map(|g| 2 * probe_peers(plan, g.gpus.len(), g.islands.as_ref().ok()).len() as u64)
        .sum();
    progress(Progress::Planned(
        per_group * plan.groups.len() as u64 + probes,
    ));
    let mut out = Vec::new();
    let mut faults = Vec::new();
    for placement in &plan.groups {
        progress(Progress::Group {
            gpus: placement.gpus.clone(),
            placement: placement.label.clone(),
        });
        let r = measure_group(fabric, plan, placement, progress, &mut faults);
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

/// Between phases: who else is on the GPUs. Anyone there is recorded as measured beside this
/// group (a stop, unless the plan allows it); the revisit drift of such a group is not kept,
/// since it would be the neighbour's doing, not the machine's.
fn look_around(
    fabric: &dyn Fabric,
    plan: &Plan,
    res: &mut GroupResults,
    during: &str,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), FabricError> {
    // Workers replaced since the last look are the fabric's own, not neighbours.
    let generation = fabric.recoveries().len();
    let looked = plan
        .neighbours
        .look(&format!("{during} GPUs {:?}", res.gpus), generation)
        .map_err(FabricError::Busy)?;
    if !looked.new.is_empty() {
        progress(Progress::Beside {
            gpus: res.gpus.clone(),
            who: looked.new,
        });
    }
    for b in looked.now {
        if !res.beside.contains(&b) {
            res.beside.push(b);
        }
    }
    Ok(())
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
    placement: &Placement,
    progress: &mut dyn FnMut(Progress),
    faults: &mut Vec<String>,
) -> Result<GroupResults, FabricError> {
    let max_bytes = plan.sizes.last().copied().unwrap_or(0);
    let gpus = &placement.gpus[..];
    let align = plan::alignment(gpus.len(), plan.dtype);
    let grid = match (plan.fine, plan.sizes.first()) {
        (true, Some(&lo)) => plan::fine_grid(lo, max_bytes, align),
        (false, Some(&lo)) => {
            let edges = plan::form_edges(&plan.backends, lo, max_bytes, align);
            let sizes: BTreeSet<u64> = plan.sizes.iter().copied().chain(edges).collect();
            sizes.into_iter().collect()
        }
        _ => plan.sizes.clone(),
    };
    let group = Group {
        gpus: gpus.to_vec(),
        dtype: plan.dtype,
        max_bytes,
        islands: placement.islands.clone(),
    };
    let mut res = GroupResults {
        gpus: gpus.to_vec(),
        placement: placement.label.clone(),
        islands: placement.islands.clone().ok(),
        phases: GroupPhases {
            gpus: gpus.to_vec(),
            ..Default::default()
        },
        ..Default::default()
    };
    look_around(fabric, plan, &mut res, "before setting up", progress)?;
    res.readiness = timed(&mut res.phases.setup_s, || {
        fabric.prepare(&group, &plan.backends)
    })?;
    res.nccl_channels = fabric.nccl_channels();
    let ready: Vec<Backend> = res
        .readiness
        .iter()
        .filter_map(|r| match r {
            Readiness::Ready { backend, .. } => Some(*backend),
            Readiness::Waived { .. } => None,
        })
        .collect();

    probe_contention(fabric, plan, &mut res, progress)?;
    orient(fabric, &mut res, &ready)?;

    for &mode in &plan.modes {
        let forms = ready
            .iter()
            .filter_map(|&b| Some((b, fabric.form(b, mode)?)));
        res.forms.insert(mode, forms.collect());
    }
    let mut verified = BTreeSet::new();
    for &mode in &plan.modes {
        look_around(
            fabric,
            plan,
            &mut res,
            &format!("before timing {}", mode.id()),
            progress,
        )?;
        let mut raw = Raw::new();
        let mut sizes = grid.clone();
        let mut round = 0;
        let mut revisited = !plan.harness.revisit;
        loop {
            for &bytes in &sizes {
                At::new(fabric, plan, mode, bytes).measure(
                    &ready,
                    &mut verified,
                    &mut res,
                    &mut raw,
                    progress,
                    faults,
                )?;
            }
            let refine = round < plan.harness.refine_rounds;
            let mut next = if refine {
                refinement(&res, mode, plan)
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
                    At::new(fabric, plan, mode, bytes)
                        .revisit(&mut res, &mut raw, progress, faults)?;
                }
            }
            if let Some(close_calls) = plan.close_calls {
                for &bytes in &sizes {
                    At::new(fabric, plan, mode, bytes).settle(
                        close_calls,
                        &mut res,
                        &mut raw,
                        progress,
                        faults,
                    )?;
                }
            }
            if refine {
                next = refinement(&res, mode, plan);
            }
            if next.is_empty() {
                break;
            }
            round += 1;
            sizes = next;
            look_around(
                fabric,
                plan,
                &mut res,
                &format!("while timing {}", mode.id()),
                progress,
            )?;
        }
    }
    look_around(fabric, plan, &mut res, "at the end of measuring", progress)?;
    if !res.beside.is_empty() {
        res.drift.clear();
    }
    // A backend disqualified mid-way must not keep the timings it got before.
    for modes in res.cells.values_mut() {
        for cell in modes.values_mut() {
            cell.retain(|b, _| !res.disqualified.contains_key(b));
        }
    }
    sweep_channels(fabric, ready, &mut res);
    Ok(res)
}

/// Per mode measured, the channel count per pinned variant still qualified and per size
/// measured in that mode, or why the fabric could not time them there (the profile records
/// it); a mode that fails leaves the other's counts as they are.
fn sweep_channels(fabric: &mut dyn Fabric, ready: Vec<Backend>, res: &mut GroupResults) {
    let pinned: Vec<Backend> = ready
        .into_iter()
        .filter(|b| !res.disqualified.contains_key(b))
        .collect();
    let modes: Vec<(Mode, BTreeSet<u64>)> = (res.cells.iter())
        .map(|(m, cells)| (*m, cells.keys().copied().collect()))
        .collect();
    for (mode, sizes) in modes {
        match timed(&mut res.phases.timing_s, || {
            channels::sweep(fabric, &pinned, &sizes, mode)
        }) {
            Ok(best) => drop(res.pin_channels.insert(mode, best)),
            Err(why) => drop(res.channels_unmeasured.insert(mode, why)),
        }
    }
}

/// The peer counts a group of `n` GPUs probes in each direction: every one on the reference
/// grid, else `plan::probe_peers`; none where the plan probes nothing.
fn probe_peers(plan: &Plan, n: usize, islands: Option<&Islands>) -> Vec<usize> {
    match (plan.contention && n >= 2, plan.fine) {
        (false, _) => Vec::new(),
        (true, true) => (1..n).collect(),
        (true, false) => plan::probe_peers(n, islands.map(Islands::size)),
    }
}

/// The contention curves of the group: reads, then writes, at each of its peer counts.
fn probe_contention(
    fabric: &mut dyn Fabric,
    plan: &Plan,
    res: &mut GroupResults,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), FabricError> {
    let n = res.gpus.len();
    let counts = probe_peers(plan, n, res.islands.as_ref());
    if counts.is_empty() {
        return Ok(());
    }
    'probes: for direction in [Direction::Read, Direction::Write] {
        let mut points = Vec::new();
        for &peers in &counts {
            check_interrupt(&plan.cancel)?;
            progress(Progress::Probe {
                direction,
                peers,
                of: n - 1,
            });
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
            gpus: res.gpus.clone(),
            direction,
            bytes: plan.harness.probe_bytes,
            points,
        });
    }
    Ok(())
}

/// Which way the hierarchical backends move data in each phase, from the group's probe
/// curves (reads where none ran), told to the fabric and kept with the results.
fn orient(
    fabric: &mut dyn Fabric,
    res: &mut GroupResults,
    ready: &[Backend],
) -> Result<(), FabricError> {
    let Some(islands) = res.islands.as_mut() else {
        return Ok(());
    };
    if !ready.iter().any(|b| b.is_hierarchical()) {
        return Ok(());
    }
    let curve = |d: Direction| {
        res.contention
            .iter()
            .find(|c| c.direction == d)
            .map_or(&[][..], |c| &c.points[..])
    };
    let directions = islands.orient(curve(Direction::Read), curve(Direction::Write));
    fabric.orient(&directions)?;
    islands.directions = Some(directions);
    Ok(())
}

/// The sizes to bisect next in `mode`, given everything measured so far.
fn refinement(res: &GroupResults, mode: Mode, plan: &Plan) -> Vec<u64> {
    let cells = res.cells.get(&mode).cloned().unwrap_or_default();
    let ranks = Ranks::of(res.gpus.len(), res.islands.as_ref());
    plan::refine_points(&cells, &res.disqualified, ranks, plan.dtype, plan.winner)
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

/// The cells at one size that another is measured against.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rivals {
    /// The lowest upper bound among the other backends still in the running: the one a
    /// racing cell must be able to beat.
    pub fastest: Option<Timing>,
    /// The lowest upper bound, widened by its model band, among those of them that are in
    /// every comparison the steering rule makes with this cell ([`alongside`]): the one a
    /// [`Hopeless`] cell is out against.
    pub everywhere: Option<Timing>,
}

/// The rivals of `but` among the timings at one size.
fn rivals(
    cell: &BTreeMap<Backend, Timing>,
    disqualified: &BTreeMap<Backend, String>,
    but: Backend,
) -> Rivals {
    let mut out = Rivals::default();
    let below = |t: &Timing, than: Option<Timing>, by: &dyn Fn(&Timing) -> f64| {
        than.is_none_or(|o| by(t) < by(&o))
    };
    for (b, t) in cell {
        if *b == but || disqualified.contains_key(b) {
            continue;
        }
        if below(t, out.fastest, &|t| t.ci_high_us) {
            out.fastest = Some(*t);
        }
        if alongside(but, *b) && below(t, out.everywhere, &widened_high) {
            out.everywhere = Some(*t);
        }
    }
    out
}

/// The upper end of `t`'s interval widened by its model band, whichever backend it is
/// compared with: the safe side for calling another cell hopeless against it.
fn widened_high(t: &Timing) -> f64 {
    t.ci_high_us * t.model.map_or(1.0, |m| m.high)
}

/// Whether `other` is in every set of backends the steering rule compares `b` within: all of
/// them; NCCL's variants among themselves (which of them is the reference kernels must beat);
/// the backends engines have (the fallback where the choice is one they lack). A cell far
/// slower than such a rival loses in each set, whatever the others measure.
fn alongside(b: Backend, other: Backend) -> bool {
    (b.is_custom() || !other.is_custom()) && (!b.engines_have() || other.engines_have())
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
mod tests;

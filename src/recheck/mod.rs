//! Does a profile still hold on this machine, measured rather than fingerprinted? A driver
//! upgrade changes the fingerprint, but the question is whether the choices changed. This
//! re-times only what decides the profile: at each crossover the sizes on both sides, and the
//! middle of every band, each time the chosen backend against its rival there, then applies
//! the one steering rule to the fresh numbers.
//!
//! A choice no longer holds where a backend moved since the tune by more than this machine
//! moved it while tuning, and that move makes another backend faster than the profile's choice
//! by more than the rule's margin (twice MIN_EFFECT, once for the tune's noise and once for
//! this check's) compounded with the drift between this check's passes. What the tune saw is
//! [`GroupProfile::drift`]: each cell's revisit, seconds after its first samples, against
//! them. On the H200's VM NCCL's one-rank eager time moves by up to 45% for seconds at a time,
//! longer than a check lasts: judged on its own passes, the check called a profile tuned
//! seconds before stale in 15 of 20 runs. A point that looks changed is timed three times (the
//! second in the opposite order); one that only the drift between them could explain is
//! undecided ([`EXIT_UNDECIDED`]), not stale.

use std::collections::{BTreeMap, BTreeSet};

use crate::allreduce::{Backend, Readiness};
use crate::cancel::Cancel;
use crate::error::Error;
use crate::fabric::{Fabric, FabricError, Group, Verification};
use crate::measure::{measure_cell, Harness};
use crate::profile::{GroupProfile, Profile, Timing};
use crate::topology::occupancy::{BusyGpu, Neighbours};

pub use crate::error::EXIT_UNDECIDED;

/// A lighter harness than a tune's: a recheck asks a yes/no question at a few sizes.
pub fn harness() -> Harness {
    Harness {
        target_ci: 0.03,
        min_samples: 8,
        max_samples: 40,
        step_samples: 8,
        time_cap_us: 2.0e5,
        ..Harness::default()
    }
}

/// One re-timed size of one group.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Point {
    pub tp: usize,
    pub gpus: Vec<usize>,
    pub mode: crate::allreduce::Mode,
    pub bytes: u64,
    /// What the profile chose here.
    pub chosen: Backend,
    /// One pass where the choice held; a second, in the opposite order, where it did not.
    pub passes: Vec<Pass>,
    /// How far each backend timed here moved while the profile was tuned (its
    /// [`GroupProfile::drift`], the largest over the profile's groups in this mode): the
    /// machine's own variation over seconds, which one check's passes cannot see.
    pub tuned: BTreeMap<Backend, f64>,
    /// Other processes on the GPUs while this point was timed (`--allow-busy`).
    pub beside: Vec<BusyGpu>,
    /// Why the profile's choice cannot run here (the fabric waived it, or it failed here),
    /// where it cannot: the choice no longer holds, whatever the others' timings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

/// One round of fresh timings at a point, and what the rule chooses from them.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Pass {
    /// What the rule chooses from the fresh timings.
    pub now: Backend,
    /// Fresh medians, microseconds.
    pub us: BTreeMap<Backend, f64>,
    /// What the rule chooses once each backend's move since the tune is allowed for up to
    /// the variation the tune saw in it ([`beyond_variation`]).
    pub judged: Backend,
    /// Those medians, microseconds.
    pub beyond_us: BTreeMap<Backend, f64>,
}

/// How much faster `now` is than `chosen` in `us`, as a fraction.
fn gain_in(us: &BTreeMap<Backend, f64>, chosen: Backend, now: Backend) -> f64 {
    match (us.get(&chosen), us.get(&now)) {
        (Some(c), Some(n)) if *n > 0.0 => c / n - 1.0,
        _ => 0.0,
    }
}

impl Pass {
    /// How much faster `now` is than `chosen` in this pass, as a fraction.
    pub fn gain(&self, chosen: Backend) -> f64 {
        gain_in(&self.us, chosen, self.now)
    }

    pub fn holds(&self, chosen: Backend) -> bool {
        self.now == chosen || self.gain(chosen) <= 2.0 * crate::decide::MIN_EFFECT
    }

    /// The gain that is left once the tune's variation is allowed for.
    pub fn gain_beyond(&self, chosen: Backend) -> f64 {
        gain_in(&self.beyond_us, chosen, self.judged)
    }

    fn holds_beyond(&self, chosen: Backend) -> bool {
        self.judged == chosen || self.gain_beyond(chosen) <= 2.0 * crate::decide::MIN_EFFECT
    }
}

/// A fresh timing with the move since the tune allowed for: a backend whose median moved from
/// `then` by no more than the `drift` the tune saw in it is taken as it was, and one that
/// moved further keeps only the part beyond that drift. What is left is what changed.
fn beyond_variation(fresh: &Timing, then: Option<&Timing>, drift: f64) -> Timing {
    let Some(then) = then.filter(|t| t.median_us > 0.0 && fresh.median_us > 0.0) else {
        return *fresh;
    };
    let moved = (fresh.median_us / then.median_us).ln();
    let left = moved.signum() * (moved.abs() - (1.0 + drift.max(0.0)).ln()).max(0.0);
    let scale = then.median_us * left.exp() / fresh.median_us;
    Timing {
        median_us: fresh.median_us * scale,
        ci_low_us: fresh.ci_low_us * scale,
        ci_high_us: fresh.ci_high_us * scale,
        ..*fresh
    }
}

/// Passes timed at a point that looked changed: the first, one in the opposite order, and one
/// more in the first order, so the drift between passes is seen both ways.
const CONFIRMING_PASSES: usize = 3;

impl Point {
    /// Every pass finds another backend faster than the choice by more than the rule's margin.
    fn looks_changed(&self) -> bool {
        self.passes.iter().all(|p| !p.holds(self.chosen))
    }

    /// Every pass finds another backend faster by more than the rule's margin even once each
    /// backend's move since the tune is allowed for up to the variation the tune saw.
    fn changed_beyond_variation(&self) -> bool {
        self.passes.iter().all(|p| !p.holds_beyond(self.chosen))
    }

    /// How far the fastest and slowest pass of any backend timed here lie apart, as a
    /// fraction: this machine's run-to-run variation at this point, right now.
    pub fn drift(&self) -> f64 {
        let mut worst: f64 = 0.0;
        if let Some(first) = self.passes.first() {
            for k in first.us.keys() {
                let xs: Vec<f64> = self
                    .passes
                    .iter()
                    .filter_map(|p| p.us.get(k))
                    .copied()
                    .collect();
                let (lo, hi) = xs.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| {
                    (lo.min(x), hi.max(x))
                });
                if xs.len() > 1 && lo > 0.0 {
                    worst = worst.max(hi / lo - 1.0);
                }
            }
        }
        worst
    }

    /// The choice no longer holds: it cannot run here, or every pass says so beyond the
    /// variation the tune saw, and by more than the rule's margin compounded with the drift
    /// measured between passes.
    pub fn changed(&self) -> bool {
        let bar = (1.0 + 2.0 * crate::decide::MIN_EFFECT) * (1.0 + self.drift()) - 1.0;
        self.unavailable.is_some() || self.changed_beyond_variation() && self.gain_beyond() > bar
    }

    /// Every pass finds a faster backend beyond the tune's variation, but the machine moved
    /// between passes by as much: it drifts too much right now to tell.
    pub fn drifting(&self) -> bool {
        self.unavailable.is_none() && self.changed_beyond_variation() && !self.changed()
    }

    /// Every pass finds a faster backend, but no backend moved since the tune by more than
    /// this machine moved it while tuning: the profile's call holds.
    pub fn within_variation(&self) -> bool {
        self.unavailable.is_none() && self.looks_changed() && !self.changed_beyond_variation()
    }

    /// The passes disagree: the timings here moved by more than the rule's margin between
    /// two passes, so this point cannot be judged.
    pub fn unsettled(&self) -> bool {
        self.unavailable.is_none()
            && !self.looks_changed()
            && self.passes.iter().any(|p| !p.holds(self.chosen))
    }

    pub fn holds(&self) -> bool {
        !self.changed()
    }

    /// What the rule chooses now (the last pass).
    pub fn now(&self) -> Backend {
        self.passes.last().map_or(self.chosen, |p| p.now)
    }

    /// How much faster `now` is than the profile's choice, at least, over the passes.
    pub fn gain(&self) -> f64 {
        self.passes
            .iter()
            .map(|p| p.gain(self.chosen))
            .fold(f64::INFINITY, f64::min)
            .max(0.0)
    }

    /// The same once the tune's variation is allowed for.
    pub fn gain_beyond(&self) -> f64 {
        self.passes
            .iter()
            .map(|p| p.gain_beyond(self.chosen))
            .fold(f64::INFINITY, f64::min)
            .max(0.0)
    }
}

/// The variation the tune saw, per mode and backend: the largest over the profile's groups,
/// since what moves a backend (the host's launch path, clocks) is the machine's, not one
/// group's, and one group's revisits may have missed a phase another's met.
fn tuned_drift(p: &Profile) -> BTreeMap<(crate::allreduce::Mode, Backend), f64> {
    let mut out: BTreeMap<(crate::allreduce::Mode, Backend), f64> = BTreeMap::new();
    for g in &p.groups {
        for (b, d) in &g.drift {
            let e = out.entry((g.mode, *b)).or_insert(0.0);
            *e = e.max(*d);
        }
    }
    out
}

/// The sizes that decide a group: both sides of every crossover and the middle of each band.
pub fn decisive(g: &GroupProfile) -> BTreeSet<usize> {
    let mut at = BTreeSet::new();
    let n = g.buckets.len();
    let mut start = 0;
    for i in 0..n {
        let end_of_band = i + 1 == n || g.buckets[i + 1].choice != g.buckets[i].choice;
        if end_of_band {
            at.insert((start + i) / 2);
            at.insert(i);
            if i + 1 < n {
                at.insert(i + 1);
            }
            start = i + 1;
        }
    }
    at
}

/// The backends to time at bucket `i`: the choice, and the choices of its neighbours (the
/// rivals a crossover names), and NCCL's own choice as the rule's reference.
fn contenders(g: &GroupProfile, i: usize) -> BTreeSet<Backend> {
    let mut set = BTreeSet::new();
    for j in [i.saturating_sub(1), i, (i + 1).min(g.buckets.len() - 1)] {
        set.insert(g.buckets[j].choice);
    }
    set.insert(Backend::Nccl);
    set
}

/// Verifies and times each of `order` at `bytes`, in that order; a backend that fails here is
/// left out (the rule then chooses among the rest), and why kept in `failed`.
fn retime(
    fabric: &mut dyn Fabric,
    order: &[Backend],
    (bytes, mode): (u64, crate::allreduce::Mode),
    h: &Harness,
    cancel: &Cancel,
    failed: &mut BTreeMap<Backend, String>,
) -> Result<BTreeMap<Backend, Timing>, Error> {
    let mut fresh = BTreeMap::new();
    for &k in order {
        if cancel.is_cancelled() {
            return Err(Error::Interrupted);
        }
        match fabric.verify(k, bytes, 7) {
            Ok(Verification::Correct) => {}
            Ok(Verification::Wrong { .. }) => {
                failed.insert(k, "it gave wrong results here".into());
                continue;
            }
            Err(e) if e.backend_local() => {
                failed.insert(k, e.to_string());
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        match measure_cell(fabric, k, bytes, mode, h, None, cancel) {
            Ok(t) => {
                fresh.insert(k, t);
            }
            Err(e) if e.backend_local() => {
                failed.insert(k, e.to_string());
            }
            Err(FabricError::Interrupted) => return Err(Error::Interrupted),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(fresh)
}

/// Refuses a profile with a group on GPUs a machine of `n` GPUs does not have. A profile of
/// virtual ranks (`tune --loopback N`) is re-timed the same way, so the advice names it.
pub fn fits(p: &Profile, n: usize) -> Result<(), Error> {
    let Some(g) = p.groups.iter().find(|g| g.gpus.iter().any(|&x| x >= n)) else {
        return Ok(());
    };
    let what = format!(
        "the profile's group on GPUs {} does not fit this machine of {}",
        crate::topology::fmt_gpus(&g.gpus),
        crate::report::count(n, "GPU", "GPUs")
    );
    Err(Error::bad_input(if p.topology.origin.kind == "loopback" {
        format!(
            "{what}; it was tuned as {} virtual ranks on one GPU: add --loopback {}",
            p.topology.gpus.len(),
            p.topology.gpus.len()
        )
    } else {
        format!("{what}; check it on the machine it was made for")
    }))
}

/// Prepares `wanted` on `group`: those ready, and why each the fabric waived cannot run.
fn prepare(
    fabric: &mut dyn Fabric,
    group: &Group,
    wanted: &[Backend],
) -> Result<(BTreeSet<Backend>, BTreeMap<Backend, String>), Error> {
    let (mut ready, mut waived) = (BTreeSet::new(), BTreeMap::new());
    for r in fabric.prepare(group, wanted)? {
        match r {
            Readiness::Ready { backend, .. } => drop(ready.insert(backend)),
            Readiness::Waived { backend, reason } => drop(waived.insert(backend, reason)),
        }
    }
    Ok((ready, waived))
}

/// Re-times the decisive sizes of every group of `p` on `fabric`, asking `neighbours` before
/// and after each point who else is on the GPUs. Each preparation releases the group before
/// it; the last group stays prepared for the caller to release or drop (the CUDA fabric's
/// drop closes what its workers map and lets their exits free the rest).
pub fn run(
    fabric: &mut dyn Fabric,
    p: &Profile,
    h: &Harness,
    cancel: &Cancel,
    neighbours: &Neighbours,
) -> Result<Vec<Point>, Error> {
    fits(p, fabric.topology().gpu_count())?;
    let mut points = Vec::new();
    let tuned = tuned_drift(p);
    // Groups of the same GPUs (one per mode) share one preparation.
    let mut by_gpus: BTreeMap<Vec<usize>, Vec<&GroupProfile>> = BTreeMap::new();
    for g in &p.groups {
        by_gpus.entry(g.gpus.clone()).or_default().push(g);
    }
    for (gpus, groups) in by_gpus {
        let wanted: BTreeSet<Backend> = groups
            .iter()
            .flat_map(|g| decisive(g).into_iter().flat_map(|i| contenders(g, i)))
            .collect();
        let max_bytes = groups
            .iter()
            .flat_map(|g| g.buckets.iter().map(|b| b.bytes))
            .max()
            .unwrap_or(0);
        let group = Group {
            gpus: gpus.clone(),
            dtype: groups[0].dtype,
            max_bytes,
            islands: groups[0]
                .islands
                .clone()
                .ok_or_else(|| "the profile gives this group no islands".to_string()),
        };
        let wanted: Vec<Backend> = wanted.into_iter().collect();
        let t = std::time::Instant::now();
        let (ready, waived) = prepare(fabric, &group, &wanted)?;
        // The island phases run the way the tune oriented them.
        if let Some(d) = groups[0]
            .islands
            .as_ref()
            .and_then(|i| i.directions.as_ref())
        {
            if ready.iter().any(|b| b.is_hierarchical()) {
                fabric.orient(d)?;
            }
        }
        tracing::info!(
            "GPUs {gpus:?}: prepared in {:.2} s",
            t.elapsed().as_secs_f64()
        );
        let t = std::time::Instant::now();
        let result = (|| -> Result<(), Error> {
            for g in &groups {
                for i in decisive(g) {
                    let b = &g.buckets[i];
                    let order: Vec<Backend> = contenders(g, i)
                        .into_iter()
                        .filter(|k| ready.contains(k))
                        .collect();
                    let drift_of = |k: &Backend| tuned.get(&(g.mode, *k)).copied().unwrap_or(0.0);
                    // Why each backend that cannot run at this size cannot: waived, or
                    // failed in the first pass.
                    let mut failed = waived.clone();
                    let pass =
                        |fabric: &mut dyn Fabric,
                         order: &[Backend],
                         failed: &mut BTreeMap<Backend, String>| {
                            let fresh =
                                retime(fabric, order, (b.bytes, g.mode), h, cancel, failed)?;
                            let beyond: BTreeMap<Backend, Timing> = fresh
                                .iter()
                                .map(|(k, t)| {
                                    (*k, beyond_variation(t, b.results.get(k), drift_of(k)))
                                })
                                .collect();
                            let rule = |r: &BTreeMap<Backend, Timing>| {
                                crate::decide::rule_choice(r, g.ranks(), b.bytes)
                            };
                            let medians = |r: &BTreeMap<Backend, Timing>| {
                                r.iter().map(|(k, t)| (*k, t.median_us)).collect()
                            };
                            Ok::<_, Error>(rule(&fresh).zip(rule(&beyond)).map(|(now, judged)| {
                                Pass {
                                    now,
                                    us: medians(&fresh),
                                    judged,
                                    beyond_us: medians(&beyond),
                                }
                            }))
                        };
                    let at = format!("before timing GPUs {gpus:?} {}", g.mode.id());
                    let before = neighbours
                        .look(&at, fabric.recoveries().len())
                        .map_err(Error::BadInput)?;
                    let Some(first) = pass(fabric, &order, &mut failed)? else {
                        continue;
                    };
                    let mut point = Point {
                        tp: g.tp,
                        gpus: g.gpus.clone(),
                        mode: g.mode,
                        bytes: b.bytes,
                        chosen: b.choice,
                        passes: vec![first],
                        tuned: order
                            .iter()
                            .filter(|k| tuned.contains_key(&(g.mode, **k)))
                            .map(|k| (*k, drift_of(k)))
                            .collect(),
                        beside: before.now,
                        unavailable: failed.get(&b.choice).cloned(),
                    };
                    if !point.passes[0].holds(b.choice) {
                        // Confirmed in the opposite order, then once more, before it counts: a
                        // GPU still clocking up, or a host that stalls one process for a
                        // while, slows whatever is timed first, and must not pass for a
                        // changed machine; the spread of the passes is the drift it is
                        // judged against.
                        let rev: Vec<Backend> = order.iter().rev().copied().collect();
                        for k in 1..CONFIRMING_PASSES {
                            let o = if k % 2 == 1 { &rev } else { &order };
                            if let Some(again) = pass(fabric, o, &mut BTreeMap::new())? {
                                point.passes.push(again);
                            }
                        }
                    }
                    let at = format!("while timing GPUs {gpus:?} {}", g.mode.id());
                    let after = neighbours.look(&at, fabric.recoveries().len());
                    for b in after.map_err(Error::BadInput)?.now {
                        if !point.beside.contains(&b) {
                            point.beside.push(b);
                        }
                    }
                    points.push(point);
                }
            }
            Ok(())
        })();
        tracing::info!(
            "GPUs {gpus:?}: decisive sizes re-timed in {:.2} s",
            t.elapsed().as_secs_f64()
        );
        result?;
    }
    Ok(points)
}

#[cfg(test)]
mod tests;

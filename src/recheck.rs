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

    /// The choice no longer holds: every pass says so beyond the variation the tune saw, and
    /// by more than the rule's margin compounded with the drift measured between passes.
    pub fn changed(&self) -> bool {
        let bar = (1.0 + 2.0 * crate::decide::MIN_EFFECT) * (1.0 + self.drift()) - 1.0;
        self.changed_beyond_variation() && self.gain_beyond() > bar
    }

    /// Every pass finds a faster backend beyond the tune's variation, but the machine moved
    /// between passes by as much: it drifts too much right now to tell.
    pub fn drifting(&self) -> bool {
        self.changed_beyond_variation() && !self.changed()
    }

    /// Every pass finds a faster backend, but no backend moved since the tune by more than
    /// this machine moved it while tuning: the profile's call holds.
    pub fn within_variation(&self) -> bool {
        self.looks_changed() && !self.changed_beyond_variation()
    }

    /// The passes disagree: the timings here moved by more than the rule's margin between
    /// two passes, so this point cannot be judged.
    pub fn unsettled(&self) -> bool {
        !self.looks_changed() && self.passes.iter().any(|p| !p.holds(self.chosen))
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
/// left out (the rule then chooses among the rest).
fn retime(
    fabric: &mut dyn Fabric,
    order: &[Backend],
    bytes: u64,
    mode: crate::allreduce::Mode,
    h: &Harness,
    cancel: &Cancel,
) -> Result<BTreeMap<Backend, Timing>, Error> {
    let mut fresh = BTreeMap::new();
    for &k in order {
        if cancel.is_cancelled() {
            return Err(Error::Interrupted);
        }
        match fabric.verify(k, bytes, 7) {
            Ok(Verification::Correct) => {}
            Ok(Verification::Wrong { .. }) => continue,
            Err(e) if e.backend_local() => continue,
            Err(e) => return Err(e.into()),
        }
        match measure_cell(fabric, k, bytes, mode, h, None, cancel) {
            Ok(t) => {
                fresh.insert(k, t);
            }
            Err(e) if e.backend_local() => {}
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
        crate::report::fmt_gpus(&g.gpus),
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

/// Re-times the decisive sizes of every group of `p` on `fabric`, asking `neighbours` before
/// and after each point who else is on the GPUs.
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
        let ready: BTreeSet<Backend> = fabric
            .prepare(&group, &wanted)?
            .into_iter()
            .filter_map(|r| match r {
                Readiness::Ready { backend, .. } => Some(backend),
                Readiness::Waived { .. } => None,
            })
            .collect();
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
                    let pass = |fabric: &mut dyn Fabric, order: &[Backend]| {
                        let fresh = retime(fabric, order, b.bytes, g.mode, h, cancel)?;
                        let beyond: BTreeMap<Backend, Timing> = fresh
                            .iter()
                            .map(|(k, t)| (*k, beyond_variation(t, b.results.get(k), drift_of(k))))
                            .collect();
                        let rule = |r: &BTreeMap<Backend, Timing>| {
                            crate::decide::rule_choice(r, g.ranks(), b.bytes)
                        };
                        let medians = |r: &BTreeMap<Backend, Timing>| {
                            r.iter().map(|(k, t)| (*k, t.median_us)).collect()
                        };
                        Ok::<_, Error>(rule(&fresh).zip(rule(&beyond)).map(|(now, judged)| Pass {
                            now,
                            us: medians(&fresh),
                            judged,
                            beyond_us: medians(&beyond),
                        }))
                    };
                    let at = format!("before timing GPUs {gpus:?} {}", g.mode.id());
                    let before = neighbours
                        .look(&at, fabric.recoveries().len())
                        .map_err(Error::BadInput)?;
                    let Some(first) = pass(fabric, &order)? else {
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
                            if let Some(again) = pass(fabric, o)? {
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
        fabric.release()?;
        result?;
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::sim::{Faults, SimFabric};
    use crate::topology::presets;

    /// TP4 on GPUs 0-3 of the direct-attached box: NCCL's defaults go through host memory
    /// there, so the custom kernel the profile chooses at its smallest sizes wins beyond the
    /// model's error (under one switch NCCL's ring is within it). One placement, as on a
    /// 4-GPU box.
    const PRESET: &str = "pcie-8x-direct-2socket";

    /// Up to 512K, where the kernels win there: a crossover from a kernel to NCCL is set by the
    /// model band, so its bucket sits at the band's edge, where a re-timing lands on either
    /// side (the phases profile below has one and is checked without bursts).
    fn tuned() -> Profile {
        let t = presets::get(PRESET).unwrap();
        let mut f = SimFabric::new(t, 1);
        let o = crate::tune::Options {
            tp: vec![4],
            min_bytes: 4096,
            max_bytes: 512 << 10,
            placements_per_tp: 1,
            modes: vec![crate::allreduce::Mode::Graph],
            contention: false,
            ..Default::default()
        };
        crate::tune::run(&mut f, &o, &mut |_| {}).unwrap()
    }

    /// TP4 inside one switch of the two-switch box, from 64K (below it a kernel wins, and its
    /// crossover to NCCL sits at the model band's edge): NCCL's own choice serves most sizes
    /// there, with a pinned ring/Simple band through it, so NCCL's phases decide choices.
    const PHASES_PRESET: &str = "pcie-8x-2switch";

    /// A graph profile of TP4 on `preset` from `min_bytes` to 4M tuned while `phased` ran 1.3x
    /// slower in every other run of 300 fabric calls: a host whose phases outlast one size's
    /// samples.
    fn tuned_in_phases(preset: &str, phased: Backend, min_bytes: u64) -> Profile {
        let t = presets::get(preset).unwrap();
        let faults = Faults::parse(&format!("phases={}:1.3:300", phased.id())).unwrap();
        let mut f = SimFabric::new(t, 1).with_faults(faults);
        let o = crate::tune::Options {
            tp: vec![4],
            min_bytes,
            max_bytes: 4 << 20,
            placements_per_tp: 1,
            modes: vec![crate::allreduce::Mode::Graph],
            contention: false,
            ..Default::default()
        };
        crate::tune::run(&mut f, &o, &mut |_| {}).unwrap()
    }

    fn check_with(preset: &str, p: &Profile, faults: &str) -> Vec<Point> {
        let t = presets::get(preset).unwrap();
        let mut f = SimFabric::new(t, 2).with_faults(Faults::parse(faults).unwrap());
        run(&mut f, p, &harness(), &Cancel::new(), &Default::default()).unwrap()
    }

    #[test]
    fn the_tune_records_how_far_a_backend_moved_while_it_was_measured() {
        let g = &tuned_in_phases(PRESET, Backend::Nccl, 4096).groups[0];
        assert!(
            (0.2..0.4).contains(&g.drift[&Backend::Nccl]),
            "{:?}",
            g.drift
        );
        let kernel = g.drift[&Backend::OneStagePull];
        assert!(kernel < 0.06, "{:?}", g.drift);
        assert!(g
            .drift
            .keys()
            .all(|b| g.buckets[0].results.contains_key(b) || !b.is_custom()));
    }

    #[test]
    fn a_backend_moving_as_far_as_it_did_while_tuned_is_not_a_changed_machine() {
        // NCCL's own choice serves most sizes there, so its phases decide choices.
        let phased = Backend::Nccl;
        let p = tuned_in_phases(PHASES_PRESET, phased, 64 << 10);
        assert!(p.groups[0].buckets.iter().any(|b| b.choice == phased));
        let slow = |x: f64| format!("slow={}:{x}", phased.id());
        // Steady at the slow phase's time for the whole check: it moved as far when tuned.
        let pts = check_with(PHASES_PRESET, &p, &slow(1.3));
        assert!(pts.iter().all(Point::holds), "{pts:?}");
        let within: Vec<&Point> = pts.iter().filter(|x| x.within_variation()).collect();
        assert!(!within.is_empty(), "{pts:?}");
        // The same check of the same profile without the record calls it stale.
        let mut blind = p.clone();
        for g in &mut blind.groups {
            g.drift.clear();
        }
        let pts = check_with(PHASES_PRESET, &blind, &slow(1.3));
        assert!(pts.iter().any(Point::changed), "{pts:?}");
        // Moving further than it did while tuned is a change again.
        let pts = check_with(PHASES_PRESET, &p, &slow(1.8));
        assert!(
            pts.iter().any(|x| x.changed() && x.chosen == phased),
            "{pts:?}"
        );
    }

    #[test]
    fn a_slowed_kernel_is_named_though_its_rival_moved_while_tuned() {
        let p = tuned_in_phases(PRESET, Backend::Nccl, 4096);
        let chosen = p.groups[0].buckets[0].choice;
        assert!(chosen.is_custom(), "{chosen:?}");
        let pts = check_with(PRESET, &p, &format!("slow={}:3", chosen.id()));
        assert!(
            pts.iter().any(|x| x.changed() && x.chosen == chosen),
            "{pts:?}"
        );
    }

    #[test]
    fn decisive_sizes_are_both_sides_of_each_crossover_and_band_middles() {
        let p = tuned();
        let g = &p.groups[0];
        let at = decisive(g);
        for c in &g.crossovers {
            let i = g.buckets.iter().position(|b| b.bytes == c.bytes).unwrap();
            assert!(at.contains(&i) && at.contains(&(i - 1)), "{c:?} {at:?}");
        }
        assert!(
            at.len() < g.buckets.len(),
            "a recheck must not re-time everything"
        );
    }

    #[test]
    fn the_same_machine_holds_and_a_slowed_kernel_is_named() {
        let p = tuned();
        let t = presets::get(PRESET).unwrap();
        let mut same = SimFabric::new(t.clone(), 2);
        let pts = run(
            &mut same,
            &p,
            &harness(),
            &Cancel::new(),
            &Default::default(),
        )
        .unwrap();
        assert!(!pts.is_empty() && pts.iter().all(Point::holds), "{pts:?}");
        // The machine changed: the custom kernel the profile relies on got 3x slower.
        let chosen = p.groups[0].buckets[0].choice;
        assert!(chosen.is_custom(), "{chosen:?}");
        let faults = Faults::parse(&format!("slow={}:3", chosen.id())).unwrap();
        let mut slower = SimFabric::new(t, 2).with_faults(faults);
        let pts = run(
            &mut slower,
            &p,
            &harness(),
            &Cancel::new(),
            &Default::default(),
        )
        .unwrap();
        let broken: Vec<&Point> = pts.iter().filter(|x| x.changed()).collect();
        assert!(!broken.is_empty(), "{pts:?}");
        assert!(
            broken
                .iter()
                .all(|x| x.chosen == chosen && x.gain() > 0.05 && x.passes.len() == 3),
            "{broken:?}"
        );
    }

    /// What `victim`'s timing at a size becomes in pass 1, 2, 3 (how many times it was
    /// verified there): the backend whose time it takes (None: its own), times a factor.
    type Shape = fn(usize) -> (Option<Backend>, f64);
    type TimeResult = Result<Vec<f64>, FabricError>;

    /// The simulated machine, except that `victim`'s timings go through `shape`.
    struct Reshaped {
        inner: SimFabric,
        victim: Backend,
        verified: BTreeMap<u64, usize>,
        shape: Shape,
    }

    impl Reshaped {
        fn new(victim: Backend, shape: Shape) -> Reshaped {
            let t = presets::get(PRESET).unwrap();
            Reshaped {
                inner: SimFabric::new(t, 2),
                victim,
                verified: BTreeMap::new(),
                shape,
            }
        }
    }

    impl Fabric for Reshaped {
        fn info(&self) -> crate::fabric::FabricInfo {
            self.inner.info()
        }
        fn topology(&self) -> &crate::topology::Topology {
            self.inner.topology()
        }
        fn prepare(&mut self, g: &Group, b: &[Backend]) -> Result<Vec<Readiness>, FabricError> {
            self.inner.prepare(g, b)
        }
        fn verify(&mut self, b: Backend, n: u64, s: u64) -> Result<Verification, FabricError> {
            if b == self.victim {
                *self.verified.entry(n).or_default() += 1;
            }
            self.inner.verify(b, n, s)
        }
        fn time(
            &mut self,
            b: Backend,
            n: u64,
            m: crate::allreduce::Mode,
            batch: u32,
            samples: u32,
        ) -> TimeResult {
            if b != self.victim {
                return self.inner.time(b, n, m, batch, samples);
            }
            let (like, k) = (self.shape)(self.verified[&n]);
            let t = self.inner.time(like.unwrap_or(b), n, m, batch, samples)?;
            Ok(t.into_iter().map(|x| k * x).collect())
        }
        fn probe(
            &mut self,
            d: crate::allreduce::Direction,
            peers: usize,
            bytes: u64,
        ) -> Result<crate::fabric::ProbeSample, FabricError> {
            self.inner.probe(d, peers, bytes)
        }
        fn orient(&mut self, d: &crate::fabric::Directions) -> Result<(), FabricError> {
            self.inner.orient(d)
        }
        fn release(&mut self) -> Result<(), FabricError> {
            self.inner.release()
        }
    }

    /// 3x slower the first time it is timed at each size: a burst on the host, not a
    /// changed machine.
    fn burst(pass: usize) -> (Option<Backend>, f64) {
        (None, if pass == 1 { 3.0 } else { 1.0 })
    }

    /// As long as NCCL times a factor that changes from pass to pass (1.6, 1.25, 1.4):
    /// always slower than NCCL, by an amount that moves more than the gain. A drifting host,
    /// not a changed one.
    fn drift(pass: usize) -> (Option<Backend>, f64) {
        (Some(Backend::Nccl), [1.6, 1.25, 1.4][(pass - 1) % 3])
    }

    #[test]
    fn a_burst_in_one_pass_leaves_a_point_unjudged_not_the_profile_stale() {
        let p = tuned();
        let chosen = p.groups[0].buckets[0].choice;
        let mut f = Reshaped::new(chosen, burst);
        let pts = run(&mut f, &p, &harness(), &Cancel::new(), &Default::default()).unwrap();
        assert!(pts.iter().all(Point::holds), "{pts:?}");
        let moved: Vec<&Point> = pts.iter().filter(|x| x.unsettled()).collect();
        assert!(!moved.is_empty(), "{pts:?}");
        for x in moved {
            assert_eq!(x.passes.len(), 3);
            assert!(!x.passes[0].holds(x.chosen), "{x:?}");
            assert!(x.passes[1].holds(x.chosen), "{x:?}");
        }
    }

    #[test]
    fn a_machine_drifting_between_passes_is_undecided_not_stale() {
        let p = tuned();
        let chosen = p.groups[0].buckets[0].choice;
        let mut f = Reshaped::new(chosen, drift);
        let pts = run(&mut f, &p, &harness(), &Cancel::new(), &Default::default()).unwrap();
        // Where the victim's only rival is NCCL, the one it drifts against.
        let against_nccl: Vec<&Point> = pts
            .iter()
            .filter(|x| x.chosen == chosen && x.passes[0].us.len() == 2)
            .collect();
        assert!(!against_nccl.is_empty(), "{pts:?}");
        for x in against_nccl {
            assert!(x.holds() && x.drifting(), "{x:?}");
            assert_eq!(x.passes.len(), 3, "{x:?}");
            assert!(x.gain() > 0.2 && x.drift() > 0.25, "{x:?}");
        }
    }
}

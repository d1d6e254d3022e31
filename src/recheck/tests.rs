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
    /// Groups prepared, and releases asked for.
    prepared: usize,
    released: usize,
}

impl Reshaped {
    fn new(victim: Backend, shape: Shape) -> Reshaped {
        let t = presets::get(PRESET).unwrap();
        Reshaped {
            inner: SimFabric::new(t, 2),
            victim,
            verified: BTreeMap::new(),
            shape,
            prepared: 0,
            released: 0,
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
        self.prepared += 1;
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
        self.released += 1;
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
    // Each preparation replaces the group before it; the last is left to the fabric's drop
    // (the CUDA fabric's workers then exit without a round of frees).
    let sets: std::collections::BTreeSet<&Vec<usize>> = p.groups.iter().map(|g| &g.gpus).collect();
    assert!(
        f.prepared == sets.len() && f.released == 0,
        "{} {}",
        f.prepared,
        f.released
    );
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

//! The pipeline in one call: plan from the topology → measure through a fabric → decide per
//! group and mode → a [`Profile`]. The CLI adds files, progress and output around it.

use crate::allreduce::{Backend, Dtype, Mode};
use crate::cancel::Cancel;
use crate::decide::{self, Constraints};
use crate::error::Error;
use crate::fabric::Fabric;
use crate::measure::{self, Harness, Plan, Progress};
use crate::plan;
use crate::profile::{Fingerprint, Profile, Sampling, Settings, Versions, SCHEMA_VERSION};
use crate::units::fmt_size;

/// What to tune.
#[derive(Debug, Clone)]
pub struct Options {
    /// TP sizes; empty means powers of two from 2 to the GPU count.
    pub tp: Vec<usize>,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub modes: Vec<Mode>,
    pub dtype: Dtype,
    pub mem_budget: Option<u64>,
    pub seed: u64,
    pub contention: bool,
    /// GPU subsets tried per TP size (differing in topology class).
    pub placements_per_tp: usize,
    /// Fast (the default) or the exhaustive reference a fast tune is judged against.
    pub sampling: Sampling,
    /// How the fast default samples. The exhaustive reference ignores it and samples with
    /// [`exhaustive_harness`], so a reference is the same reference whoever asked for it.
    pub harness: Harness,
    /// Stops the run between measurements; [`run`] then returns [`Error::Interrupted`].
    pub cancel: Cancel,
    /// Seconds the caller spent before opening the fabric (the busy check), and opening it,
    /// recorded with the other phases.
    pub checks_seconds: f64,
    pub startup_seconds: f64,
    /// The NCCL and CUDA variables the tune runs with ([`crate::profile::environment::current`]
    /// from the CLI), recorded in the profile.
    pub environment: std::collections::BTreeMap<String, String>,
    /// Island sizes for the groups of as many GPUs as they add up to (`--islands`), in place of
    /// the islands the topology gives: an experiment, or virtual islands on one GPU.
    pub islands: Option<Vec<usize>>,
    /// The caller measured beside other processes on the GPUs (`--allow-busy`), and which.
    pub allow_busy: bool,
    pub busy: Vec<crate::profile::environment::BusyGpu>,
    /// Asked between phases and groups who else is on the GPUs (nobody watches by default).
    pub neighbours: crate::topology::occupancy::Neighbours,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            tp: Vec::new(),
            min_bytes: 1 << 10,
            max_bytes: 256 << 20,
            modes: vec![Mode::Graph, Mode::Eager],
            dtype: Dtype::Bf16,
            mem_budget: None,
            seed: 1,
            contention: true,
            placements_per_tp: 3,
            sampling: Sampling::Fast,
            harness: fast_harness(),
            cancel: Cancel::new(),
            checks_seconds: 0.0,
            startup_seconds: 0.0,
            environment: Default::default(),
            islands: None,
            allow_busy: false,
            busy: Vec::new(),
            neighbours: Default::default(),
        }
    }
}

/// A tune's default sampling: racing at the rule's effect size, so a cell stops once the
/// rule could no longer choose it, contenders within it sampled together, every cell
/// revisited once after the sweep with a few samples, and a close call sampled until its
/// intervals are within a fifth of the effect (see [`crate::measure::Sampled::done`]). The
/// statistical rule itself is unchanged.
///
/// A cell whose fastest of 4 first samples is over twice its rival's upper bound stops
/// there ([`measure::Hopeless`]): in profiles/hardware/h200/2026-12-05-speed2's profiles and
/// the presets' exhaustive ones no cell the rule chose (nor a fallback or NCCL reference) had
/// its lower bound above that rival's upper bound, while loopback's copy-engine cells are 6.9
/// to 760 times it.
pub fn fast_harness() -> Harness {
    Harness {
        race_margin: Some(decide::MIN_EFFECT),
        contender_margin: Some(decide::MIN_EFFECT),
        revisit: true,
        revisit_samples: 5,
        settle_ci: Some(decide::MIN_EFFECT / 5.0),
        hopeless: Some(measure::Hopeless {
            first_samples: 4,
            factor: 2.0,
            agree: 1.5,
        }),
        ..Harness::default()
    }
}

/// The reference sampling: every cell to its target (no racing), contenders sampled
/// together, every cell revisited once, and no refinement rounds since [`plan::fine_grid`]
/// already holds every size they could add.
pub fn exhaustive_harness() -> Harness {
    Harness {
        refine_rounds: 0,
        contender_margin: Some(decide::MIN_EFFECT),
        revisit: true,
        ..Harness::default()
    }
}

impl Options {
    /// The harness this sampling measures with, and whether on the reference grid.
    fn sampling_plan(&self) -> (Harness, bool) {
        match self.sampling {
            Sampling::Fast => (self.harness, false),
            Sampling::Exhaustive => (exhaustive_harness(), true),
        }
    }

    /// Checks what can be checked before any hardware is touched: every size on the grid
    /// must be a whole number of elements, or the first measurement would fail mid-tune.
    pub fn check(&self) -> Result<(), Error> {
        check_sizes(self.min_bytes, self.max_bytes, self.dtype)?;
        if self.modes.is_empty() {
            return Err(Error::bad_input(
                "no mode to tune; give graph, eager or both",
            ));
        }
        Ok(())
    }
}

/// Every size from `min_bytes` to `max_bytes` on the grid must be a whole number of `dtype`
/// elements, or the first measurement would fail mid-tune. The grid is powers of two plus the
/// two ends, and element sizes are powers of two; sizes added between them are multiples of
/// [`plan::alignment`], itself a multiple of the element size. So checking the ends suffices.
pub fn check_sizes(min_bytes: u64, max_bytes: u64, dtype: Dtype) -> Result<(), Error> {
    let size = dtype.size();
    if min_bytes == 0 || min_bytes > max_bytes {
        return Err(Error::bad_input(format!(
            "the size range {}..{} is empty; give LOW:HIGH with 1 <= LOW <= HIGH",
            fmt_size(min_bytes),
            fmt_size(max_bytes)
        )));
    }
    match [min_bytes, max_bytes].into_iter().find(|b| b % size != 0) {
        Some(bad) => Err(Error::bad_input(format!(
            "{} is not a whole number of {} elements ({size} bytes each); choose sizes that are multiples of {size}",
            fmt_size(bad),
            dtype.id()
        ))),
        None => Ok(()),
    }
}

/// Why a machine of fewer than 2 GPUs cannot be tuned, and what can be, from where the user
/// is: --loopback runs on a real GPU only, so a topology file gets --sim instead.
fn too_few_gpus(t: &crate::topology::Topology) -> String {
    let n = t.gpu_count();
    let gpus = if n == 1 { "GPU" } else { "GPUs" };
    match t.origin.kind.as_str() {
        "file" => format!(
            "the topology file describes {n} {gpus}; an allreduce needs at least 2 (describe 2 \
             or more, or tune a simulated machine with --sim PRESET instead; on the real \
             one-GPU machine, --loopback 8 without --topology runs 8 virtual ranks on its GPU)"
        ),
        _ => format!(
            "this machine has {n} {gpus}; an allreduce needs at least 2 (on one GPU, try \
             --loopback 8)"
        ),
    }
}

/// Measures and decides; returns the profile (not yet written anywhere), after the checks a
/// profile must pass before anyone may act on it: a group with nothing measured is a
/// hardware failure, an invalid profile is a bug in artune, and a run cancelled after its
/// last measurement still returns [`Error::Interrupted`] (the caller keeps the old profile).
pub fn run(
    fabric: &mut dyn Fabric,
    opts: &Options,
    progress: &mut dyn FnMut(Progress),
) -> Result<Profile, Error> {
    opts.check()?;
    let started = std::time::Instant::now();
    let topology = fabric.topology().clone();
    let n = topology.gpu_count();
    if n < 2 {
        return Err(Error::bad_input(too_few_gpus(&topology)));
    }
    let tps = if opts.tp.is_empty() {
        plan::default_tp(n)
    } else {
        opts.tp.clone()
    };
    let mut groups = Vec::new();
    for &tp in &tps {
        groups.extend(plan::placements(
            &topology,
            tp,
            opts.placements_per_tp,
            opts.islands.as_deref(),
        ));
    }
    let (harness, fine) = opts.sampling_plan();
    let plan = Plan {
        groups,
        modes: opts.modes.clone(),
        dtype: opts.dtype,
        sizes: plan::size_grid(opts.min_bytes, opts.max_bytes),
        fine,
        backends: Backend::ALL.to_vec(),
        seed: opts.seed,
        contention: opts.contention,
        harness,
        cancel: opts.cancel.clone(),
        winner: decide::winner,
        close_calls: Some(decide::unsettled),
        neighbours: opts.neighbours.clone(),
    };
    let (results, mut faults) = measure::run(fabric, &plan, progress)?;
    let policy = Constraints {
        mem_budget: opts.mem_budget,
    };
    let mut out_groups = Vec::new();
    let mut contention = Vec::new();
    for r in &results {
        for &mode in &opts.modes {
            out_groups.push(decide::group_profile(
                r,
                mode,
                opts.dtype,
                policy,
                &mut faults,
            ));
        }
        contention.extend(r.contention.iter().cloned());
    }
    let info = fabric.info();
    // Taken again after measuring: the fabric may have re-read links under load.
    let mut topology = fabric.topology().clone();
    topology.host.driver = topology.host.driver.or(info.driver.clone());
    topology.host.cuda = topology.host.cuda.or(info.cuda.clone());
    topology.host.nccl = topology.host.nccl.or(info.nccl.clone());
    let environment = crate::profile::Environment {
        allow_busy: opts.allow_busy,
        busy: opts.busy.clone(),
        ..crate::profile::Environment::capture(
            opts.environment.clone(),
            info.simulated,
            info.nccl.clone(),
        )
    };
    let profile = Profile {
        schema_version: SCHEMA_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").into(),
        created: crate::profile::utc_now(),
        simulated: info.simulated,
        fabric: info.description,
        fingerprint: Fingerprint {
            topology_class: topology.class_hash(),
            host: topology.host_hash(),
        },
        versions: Versions {
            driver: info.driver,
            cuda: info.cuda,
            nccl: info.nccl,
        },
        topology,
        groups: out_groups,
        contention,
        settings: Settings {
            min_bytes: opts.min_bytes,
            max_bytes: opts.max_bytes,
            tp: tps,
            modes: opts.modes.clone(),
            seed: Some(opts.seed),
            mem_budget_bytes: opts.mem_budget,
            target_ci: harness.target_ci,
            sampling: opts.sampling,
            tuning_seconds: started.elapsed().as_secs_f64(),
            dtype: Some(opts.dtype),
            phases: Some(crate::profile::Phases {
                checks_s: opts.checks_seconds,
                startup_s: opts.startup_seconds,
                groups: results.iter().map(|r| r.phases.clone()).collect(),
            }),
        },
        faults,
        assumed: fabric.assumed(),
        node: Some(crate::profile::Node::here()),
        fleet: None,
        environment: Some(environment),
        recovered: fabric
            .recoveries()
            .into_iter()
            .map(|r| crate::profile::Recovered {
                group: r.group,
                backend: r.backend,
                kept: r.kept,
                bytes: r.bytes,
                cause: r.cause,
            })
            .collect(),
        kernels: fabric.kernels().into_iter().map(Into::into).collect(),
    };
    check_measured(&profile)?;
    crate::profile::validate_built(&profile)?;
    if opts.cancel.is_cancelled() {
        return Err(Error::Interrupted);
    }
    Ok(profile)
}

/// A group where every backend failed or was waived has nothing to offer: that is a hardware
/// failure to report, not a profile to write.
fn check_measured(p: &Profile) -> Result<(), Error> {
    let Some(g) = p.groups.iter().find(|g| g.buckets.is_empty()) else {
        return Ok(());
    };
    let first = g
        .waived
        .iter()
        .next()
        .map(|(b, why)| format!("; first, {b}: {why}"))
        .unwrap_or_default();
    Err(Error::Hardware(format!(
        "no backend could be measured on GPUs {} ({} mode), so no profile was written{first}; fix what the warnings report, then run again",
        crate::topology::fmt_gpus(&g.gpus),
        g.mode.id()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::*;
    use crate::topology::{presets, Topology};

    /// A fabric with a closed-form cost per backend and no noise: custom kernels cost
    /// 5 µs + bytes/2 GB/s, NCCL 20 µs + bytes/40 GB/s, so they cross near 78 KB.
    struct Toy {
        topo: Topology,
        wrong: Option<Backend>,
    }

    impl Fabric for Toy {
        fn info(&self) -> FabricInfo {
            FabricInfo {
                simulated: true,
                description: "toy".into(),
                driver: None,
                cuda: None,
                nccl: None,
            }
        }
        fn topology(&self) -> &Topology {
            &self.topo
        }
        fn prepare(
            &mut self,
            g: &Group,
            backends: &[Backend],
        ) -> Result<Vec<Readiness>, FabricError> {
            Ok(backends
                .iter()
                .map(|&b| match b {
                    Backend::Nccl | Backend::OneStagePull | Backend::TwoStagePush => {
                        Readiness::Ready {
                            backend: b,
                            memory: MemoryCost {
                                bytes_per_gpu: memory::modelled(b, g.ranks(), g.max_bytes, 2),
                                measured: false,
                                modelled_bytes_per_gpu: memory::modelled(
                                    b,
                                    g.ranks(),
                                    g.max_bytes,
                                    2,
                                ),
                            },
                        }
                    }
                    _ => Readiness::Waived {
                        backend: b,
                        reason: "toy fabric".into(),
                    },
                })
                .collect())
        }
        fn verify(&mut self, b: Backend, _: u64, _: u64) -> Result<Verification, FabricError> {
            Ok(if Some(b) == self.wrong {
                Verification::Wrong {
                    reason: "element 3".into(),
                }
            } else {
                Verification::Correct
            })
        }
        fn time(
            &mut self,
            b: Backend,
            bytes: u64,
            _: Mode,
            _: u32,
            n: u32,
        ) -> Result<Vec<f64>, FabricError> {
            let us = match b {
                Backend::Nccl => 20.0 + bytes as f64 / 40e3,
                Backend::OneStagePull => 5.0 + bytes as f64 / 2e3,
                _ => 1e9,
            };
            Ok(vec![us; n as usize])
        }
        fn probe(
            &mut self,
            _: Direction,
            peers: usize,
            _: u64,
        ) -> Result<ProbeSample, FabricError> {
            Ok(ProbeSample {
                peers,
                per_gpu_gbps: 50.0 / peers as f64,
                aggregate_gbps: 100.0,
            })
        }
        fn orient(&mut self, _: &crate::fabric::Directions) -> Result<(), FabricError> {
            Ok(())
        }
        fn release(&mut self) -> Result<(), FabricError> {
            Ok(())
        }
        fn form(&self, b: Backend, mode: Mode) -> Option<crate::allreduce::Form> {
            crate::allreduce::Form::runs(b, mode)
        }
    }

    fn opts() -> Options {
        Options {
            tp: vec![2],
            min_bytes: 1024,
            max_bytes: 1 << 20,
            modes: vec![Mode::Graph],
            ..Default::default()
        }
    }

    #[test]
    fn pipeline_finds_the_crossover() {
        let mut f = Toy {
            topo: presets::get("pcie-2x").unwrap(),
            wrong: None,
        };
        let p = run(&mut f, &opts(), &mut |_| {}).unwrap();
        assert!(p.simulated);
        let g = &p.groups[0];
        assert_eq!(g.buckets[0].choice, Backend::OneStagePull);
        assert_eq!(g.buckets.last().unwrap().choice, Backend::Nccl);
        assert_eq!(g.crossovers.len(), 1);
        // The custom kernel must win by MIN_EFFECT (5%): 5 + x/2000 = 0.95·(20 + x/40000) at
        // x ≈ 29393 bytes; bisection must land within 1/8 above it.
        let x = g.crossovers[0].bytes as f64;
        assert!(
            x > 29393.0 && x < 29393.0 * 1.125 + 1024.0,
            "crossover at {x}"
        );
        assert!(g.waived.contains_key(&Backend::OneStagePush));
        assert_eq!(p.contention.len(), 2);
        crate::profile::validate_built(&p).unwrap();
    }

    #[test]
    fn the_profile_records_the_form_each_mode_timed_its_chosen_kernels_in() {
        use crate::allreduce::Form;
        let mut f = Toy {
            topo: presets::get("pcie-2x").unwrap(),
            wrong: None,
        };
        let o = Options {
            modes: vec![Mode::Graph, Mode::Eager],
            ..opts()
        };
        let p = run(&mut f, &o, &mut |_| {}).unwrap();
        let forms = |m: Mode| p.groups.iter().find(|g| g.mode == m).unwrap().forms.clone();
        // Chosen kernels only: two_stage_push was timed but never chosen, NCCL has no form.
        let want = |f: Form| [(Backend::OneStagePull, f)].into();
        assert_eq!(forms(Mode::Graph), want(Form::Registered));
        assert_eq!(forms(Mode::Eager), want(Form::Staged));
        crate::profile::validate_built(&p).unwrap();
    }

    #[test]
    fn wrong_results_disqualify() {
        let mut f = Toy {
            topo: presets::get("pcie-2x").unwrap(),
            wrong: Some(Backend::OneStagePull),
        };
        let p = run(&mut f, &opts(), &mut |_| {}).unwrap();
        let g = &p.groups[0];
        assert!(g.buckets.iter().all(|b| b.choice == Backend::Nccl));
        assert!(g.waived[&Backend::OneStagePull].contains("wrong result"));
        assert!(p
            .faults
            .iter()
            .any(|f| f.contains("one_stage_pull disqualified")));
    }

    #[test]
    fn memory_budget_caps_custom_sizes() {
        let mut f = Toy {
            topo: presets::get("pcie-2x").unwrap(),
            wrong: None,
        };
        let o = Options {
            mem_budget: Some(
                crate::allreduce::memory::GRAPH_TABLE_BYTES
                    + crate::allreduce::memory::SIGNAL_BYTES
                    + 8192,
            ),
            ..opts()
        };
        let p = run(&mut f, &o, &mut |_| {}).unwrap();
        let g = &p.groups[0];
        // Budget leaves 8 KiB of data buffer for one_stage_pull: above that it is waived.
        for b in &g.buckets {
            if b.bytes > 8192 {
                assert_ne!(b.choice, Backend::OneStagePull, "at {}", b.bytes);
                assert!(b
                    .waived
                    .get(&Backend::OneStagePull)
                    .is_some_and(|w| w.contains("memory budget")));
            }
        }
        assert_eq!(g.buckets[0].choice, Backend::OneStagePull);
    }

    #[test]
    fn a_cancelled_run_is_interrupted_and_the_next_run_works() {
        let mut f = Toy {
            topo: presets::get("pcie-2x").unwrap(),
            wrong: None,
        };
        let o = opts();
        o.cancel.cancel();
        assert!(matches!(
            run(&mut f, &o, &mut |_| {}),
            Err(Error::Interrupted)
        ));
        // A second run in the same process, with its own token, is not poisoned by the first.
        let p = run(&mut f, &opts(), &mut |_| {}).unwrap();
        assert!(!p.groups[0].buckets.is_empty());
    }

    #[test]
    fn the_profile_says_where_the_time_went() {
        let t = presets::get("pcie-2x").unwrap();
        let faults = crate::fabric::sim::Faults::parse("delay=1").unwrap();
        let mut f = crate::fabric::sim::SimFabric::new(t, 1).with_faults(faults);
        let o = Options {
            startup_seconds: 0.25,
            ..opts()
        };
        let p = run(&mut f, &o, &mut |_| {}).unwrap();
        let ph = p.settings.phases.expect("phases recorded");
        assert_eq!(ph.startup_s, 0.25);
        assert_eq!(ph.groups.len(), 1);
        let g = &ph.groups[0];
        assert_eq!(g.gpus, [0, 1]);
        // Each timing call sleeps 1 ms here, so timing dominates and nothing exceeds the total.
        assert!(g.timing_s > 0.01, "{g:?}");
        let measured = g.setup_s + g.probes_s + g.verify_s + g.timing_s;
        assert!(
            measured <= p.settings.tuning_seconds + 1e-6,
            "{g:?} vs {}",
            p.settings.tuning_seconds
        );
    }

    #[test]
    fn sizes_that_are_not_whole_elements_are_refused_before_measuring() {
        let mut f = Toy {
            topo: presets::get("pcie-2x").unwrap(),
            wrong: None,
        };
        let o = Options {
            min_bytes: 6,
            dtype: Dtype::Fp32,
            ..opts()
        };
        let mut events = 0;
        let e = run(&mut f, &o, &mut |_| events += 1).unwrap_err();
        assert!(matches!(e, Error::BadInput(_)), "{e}");
        assert!(e.to_string().contains("multiples of 4"), "{e}");
        assert_eq!(events, 0, "progress was reported before the check");
        assert!(Options { min_bytes: 8, ..o }.check().is_ok());
    }
}

//! Misbehaviour injected into the simulated fabric, so what sits above the seam (harness,
//! decisions, CLI) can be tested against the failures real machines have: a backend that
//! returns wrong data or never finishes, one that is slow, samples slowed at random (a
//! preempted launch, a noisy neighbour), a GPU that falls off the bus mid-tune.
//!
//! Reached from the binary through the hidden, testing-only `artune tune --sim-faults SPEC`.
//! SPEC is a comma-separated list of items:
//!
//! | item             | effect                                                              |
//! |------------------|---------------------------------------------------------------------|
//! | `wrong=B[+B..]`  | backend B returns wrong data: verification fails                    |
//! | `hang=B[+B..]`   | B never finishes: reported as a timeout after the simulated deadline (virtual time, nothing sleeps) |
//! | `slow=B[+B..]:F` | B is F times slower on every call                                   |
//! | `spikes=P:F`     | a share P (0 to 1) of all timing samples, drawn from `--seed`, is F times slower |
//! | `drift=B[+B..]:F` | B's time moves by F between successive timings: F or F² times slower, alternating, never back to the model's; which comes first is drawn from `--seed` ([`Drift`]) |
//! | `phases=B[+B..]:F:N` | B is F times slower in every other run of N fabric calls (calls N to 2N, 3N to 4N, ...): a host whose launch path moves for seconds at a time, steady within a phase |
//! | `lose=G:N`       | GPU G falls off the bus after N fabric calls: every later call fails |
//! | `delay=MS`       | every timing call sleeps MS milliseconds of real time (to interrupt a tune) |
//! | `panic=N`        | the fabric panics at call N, standing in for a bug in artune (exit 70) |

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use crate::fabric::{Backend, Mode};

/// A share of samples slowed by a factor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spikes {
    /// Share of samples affected, 0 to 1.
    pub fraction: f64,
    /// How many times slower an affected sample is.
    pub factor: f64,
}

/// A GPU that disappears mid-tune.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LostGpu {
    pub gpu: usize,
    /// Fabric calls (prepare, verify, time, probe) that succeed before it is gone.
    pub after_calls: u64,
}

/// Misbehaviour to inject. The default injects nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// Backends whose output is wrong: verify reports it.
    pub wrong: Vec<Backend>,
    /// Backends that never finish: verify and time time out.
    pub hang: Vec<Backend>,
    /// Backends slower than the model by a factor.
    pub slow: Vec<(Backend, f64)>,
    /// Samples slowed at random, on every backend.
    pub spikes: Option<Spikes>,
    /// Backends whose time moves by a factor between successive timings ([`Drift`]).
    pub drift: Vec<(Backend, f64)>,
    /// Backends slowed by a factor in every other run of so many fabric calls.
    pub phases: Vec<(Backend, f64, u64)>,
    pub lost_gpu: Option<LostGpu>,
    /// Real time each timing call sleeps.
    pub delay: Duration,
    /// The fabric call that panics, standing in for a bug in artune.
    pub panic_at_call: Option<u64>,
}

const EXAMPLE: &str = "write items like wrong=one_stage_pull,hang=nccl_tree_ll,slow=two_stage_push:3,spikes=0.2:20,drift=one_stage_pull:1.5,phases=nccl:1.3:400,lose=3:100,delay=20";

impl Faults {
    /// True when nothing is injected.
    pub fn is_empty(&self) -> bool {
        *self == Faults::default()
    }

    /// Parses a SPEC (see the module docs). The error is one sentence saying what to fix.
    pub fn parse(spec: &str) -> Result<Faults, String> {
        let mut f = Faults::default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("`{item}` has no `=`; {EXAMPLE}"))?;
            match key.trim() {
                "wrong" => f.wrong.extend(backends(value)?),
                "hang" => f.hang.extend(backends(value)?),
                "slow" => {
                    let (bs, factor) = value.rsplit_once(':').ok_or_else(|| {
                        format!("slow=`{value}` needs a factor, e.g. slow=one_stage_pull:3")
                    })?;
                    let factor = number(factor, "slow factor")?;
                    if factor < 1.0 {
                        return Err(format!(
                            "slow factor {factor} is below 1; give how many times slower, e.g. 3"
                        ));
                    }
                    f.slow
                        .extend(backends(bs)?.into_iter().map(|b| (b, factor)));
                }
                "drift" => {
                    let (bs, factor) = value.rsplit_once(':').ok_or_else(|| {
                        format!("drift=`{value}` needs a factor, e.g. drift=one_stage_pull:1.5")
                    })?;
                    let factor = number(factor, "drift factor")?;
                    if factor < 1.0 {
                        return Err(format!(
                            "drift factor {factor} is below 1; give how far the time moves between timings, e.g. 1.5"
                        ));
                    }
                    f.drift
                        .extend(backends(bs)?.into_iter().map(|b| (b, factor)));
                }
                "phases" => {
                    let mut parts = value.rsplitn(3, ':');
                    let (Some(n), Some(factor), Some(bs)) =
                        (parts.next(), parts.next(), parts.next())
                    else {
                        return Err(format!(
                            "phases=`{value}` needs BACKENDS:FACTOR:CALLS, e.g. phases=nccl:1.3:400"
                        ));
                    };
                    let factor = number(factor, "phases factor")?;
                    let n = whole(n, "phases call count")? as u64;
                    if factor < 1.0 || n == 0 {
                        return Err(format!(
                            "phases={value} is out of range; the factor goes from 1 up and a phase lasts at least 1 call, e.g. phases=nccl:1.3:400"
                        ));
                    }
                    f.phases
                        .extend(backends(bs)?.into_iter().map(|b| (b, factor, n)));
                }
                "spikes" => {
                    let (p, factor) = value.split_once(':').ok_or_else(|| {
                        format!("spikes=`{value}` needs SHARE:FACTOR, e.g. spikes=0.2:20")
                    })?;
                    let fraction = number(p, "spikes share")?;
                    let factor = number(factor, "spikes factor")?;
                    if !(0.0..=1.0).contains(&fraction) || factor < 1.0 {
                        return Err(format!(
                            "spikes={value} is out of range; the share goes from 0 to 1 and the factor from 1 up, e.g. spikes=0.2:20"
                        ));
                    }
                    f.spikes = Some(Spikes { fraction, factor });
                }
                "lose" => {
                    let (g, n) = value.split_once(':').ok_or_else(|| {
                        format!("lose=`{value}` needs GPU:CALLS, e.g. lose=3:100")
                    })?;
                    f.lost_gpu = Some(LostGpu {
                        gpu: whole(g, "lose GPU index")?,
                        after_calls: whole(n, "lose call count")? as u64,
                    });
                }
                "delay" => {
                    let ms = whole(value, "delay in milliseconds")?;
                    if ms > 60_000 {
                        return Err(format!(
                            "delay={ms} is over a minute per call; give milliseconds, e.g. delay=20"
                        ));
                    }
                    f.delay = Duration::from_millis(ms as u64);
                }
                "panic" => f.panic_at_call = Some(whole(value, "panic call number")? as u64),
                other => {
                    return Err(format!(
                        "`{other}` is not a fault; use wrong, hang, slow, spikes, drift, phases, lose, delay or panic ({EXAMPLE})"
                    ))
                }
            }
        }
        Ok(f)
    }

    /// Checks the faults against a machine of `gpus` GPUs.
    pub fn check(&self, gpus: usize) -> Result<(), String> {
        match self.lost_gpu {
            Some(l) if l.gpu >= gpus => Err(format!(
                "lose={}:{} names GPU {}, but this machine has GPUs 0..{}; pick one of those",
                l.gpu,
                l.after_calls,
                l.gpu,
                gpus.saturating_sub(1)
            )),
            _ => Ok(()),
        }
    }
}

/// Where the drifting backends stand, as a host whose launch path moves for seconds at a time
/// would leave them (the H200's VM moves eager launches by up to 45%): a drifting backend
/// enters a new episode whenever it is timed after any other fabric call than a timing of the
/// same backend, size and mode, i.e. at each size a tune or a check comes back to. Within an
/// episode its factor holds; from one episode to the next it moves by F, between F and F²
/// times slower, so the backend is never as fast as the model and never steady. Which of the
/// two a backend starts with is drawn once from the seed: deterministic for a seed.
#[derive(Debug, Clone)]
pub struct Drift {
    /// Per backend, whether its first episode is the slower one.
    starts_high: u64,
    /// Episodes begun so far, per backend.
    episodes: HashMap<Backend, u64>,
    /// The last timing call, while nothing else has been called since.
    last: Option<(Backend, u64, Mode)>,
}

impl Drift {
    pub fn new(seed: u64) -> Drift {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
        Drift {
            starts_high: rng.random(),
            episodes: HashMap::new(),
            last: None,
        }
    }

    /// A fabric call other than a timing: the next timing starts a new episode.
    pub fn interrupt(&mut self) {
        self.last = None;
    }

    /// The factor a timing call of `backend` at `bytes` in `mode` is slowed by under `drift`
    /// (1 for a backend that does not drift).
    pub fn factor(
        &mut self,
        drift: &[(Backend, f64)],
        backend: Backend,
        bytes: u64,
        mode: Mode,
    ) -> f64 {
        let key = (backend, bytes, mode);
        let new_episode = self.last != Some(key);
        self.last = Some(key);
        let f = drift
            .iter()
            .filter(|(b, _)| *b == backend)
            .map(|(_, f)| *f)
            .product::<f64>();
        if f == 1.0 {
            return 1.0;
        }
        let n = self.episodes.entry(backend).or_insert(0);
        if new_episode {
            *n += 1;
        }
        let index = Backend::ALL.iter().position(|&b| b == backend).unwrap_or(0);
        let high = (*n + (self.starts_high >> index & 1)).is_multiple_of(2);
        if high {
            f * f
        } else {
            f
        }
    }
}

fn backends(list: &str) -> Result<Vec<Backend>, String> {
    list.split('+')
        .map(|id| {
            let id = id.trim();
            Backend::from_id(id).ok_or_else(|| {
                let all: Vec<&str> = Backend::ALL.iter().map(|b| b.id()).collect();
                format!("`{id}` is not a backend; choose from {}", all.join(", "))
            })
        })
        .collect()
}

fn number(s: &str, what: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| format!("{what} `{s}` is not a number; {EXAMPLE}"))
}

fn whole(s: &str, what: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .map_err(|_| format!("{what} `{s}` is not a whole number; {EXAMPLE}"))
}

/// The canonical SPEC, as `parse` reads it.
impl fmt::Display for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids = |v: &[Backend]| v.iter().map(|b| b.id()).collect::<Vec<_>>().join("+");
        let mut items = Vec::new();
        if !self.wrong.is_empty() {
            items.push(format!("wrong={}", ids(&self.wrong)));
        }
        if !self.hang.is_empty() {
            items.push(format!("hang={}", ids(&self.hang)));
        }
        for (b, x) in &self.slow {
            items.push(format!("slow={b}:{x}"));
        }
        if let Some(s) = self.spikes {
            items.push(format!("spikes={}:{}", s.fraction, s.factor));
        }
        for (b, x) in &self.drift {
            items.push(format!("drift={b}:{x}"));
        }
        for (b, x, n) in &self.phases {
            items.push(format!("phases={b}:{x}:{n}"));
        }
        if let Some(l) = self.lost_gpu {
            items.push(format!("lose={}:{}", l.gpu, l.after_calls));
        }
        if !self.delay.is_zero() {
            items.push(format!("delay={}", self.delay.as_millis()));
        }
        if let Some(n) = self.panic_at_call {
            items.push(format!("panic={n}"));
        }
        f.write_str(&items.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_parses_and_prints_back() {
        let f = Faults::parse(
            "wrong=one_stage_pull+two_stage_push, hang=nccl_tree_ll,slow=nccl:2.5,spikes=0.2:20,drift=one_stage_pull:1.5,phases=nccl:1.3:400,lose=3:100,delay=15,panic=9",
        )
        .unwrap();
        assert_eq!(f.wrong, [Backend::OneStagePull, Backend::TwoStagePush]);
        assert_eq!(f.hang, [Backend::NcclTreeLl]);
        assert_eq!(f.slow, [(Backend::Nccl, 2.5)]);
        assert_eq!(
            f.spikes,
            Some(Spikes {
                fraction: 0.2,
                factor: 20.0
            })
        );
        assert_eq!(
            f.lost_gpu,
            Some(LostGpu {
                gpu: 3,
                after_calls: 100
            })
        );
        assert_eq!(f.drift, [(Backend::OneStagePull, 1.5)]);
        assert_eq!(f.phases, [(Backend::Nccl, 1.3, 400)]);
        assert_eq!(f.delay, Duration::from_millis(15));
        assert_eq!(f.panic_at_call, Some(9));
        assert_eq!(Faults::parse(&f.to_string()).unwrap(), f);
        assert!(Faults::parse("").unwrap().is_empty());
    }

    #[test]
    fn bad_specs_say_what_to_write() {
        for (spec, says) in [
            ("wrong", "has no `=`"),
            ("wrong=fast_one", "is not a backend"),
            ("slow=nccl", "needs a factor"),
            ("slow=nccl:0.5", "below 1"),
            ("spikes=1.5:3", "out of range"),
            ("spikes=0.1", "SHARE:FACTOR"),
            ("drift=nccl", "needs a factor"),
            ("phases=nccl:1.3", "needs BACKENDS:FACTOR:CALLS"),
            ("phases=nccl:0.5:10", "out of range"),
            ("drift=nccl:0.9", "below 1"),
            ("drift=fast_one:2", "is not a backend"),
            ("lose=x:3", "not a whole number"),
            ("delay=-1", "not a whole number"),
            ("melt=1", "is not a fault"),
        ] {
            let e = Faults::parse(spec).unwrap_err();
            assert!(e.contains(says), "{spec}: {e}");
        }
        let f = Faults::parse("lose=8:1").unwrap();
        assert!(f.check(8).unwrap_err().contains("GPUs 0..7"));
        assert!(f.check(9).is_ok());
    }

    #[test]
    fn a_drifting_backend_moves_by_its_factor_from_one_timing_to_the_next() {
        let drift = [(Backend::OneStagePull, 2.0)];
        let (b, m) = (Backend::OneStagePull, Mode::Eager);
        let mut d = Drift::new(3);
        let first = d.factor(&drift, b, 4096, m);
        // Timed again with nothing between: the same episode.
        assert_eq!(d.factor(&drift, b, 4096, m), first);
        // Another call between, or another size: the next episode, F apart, never below F.
        d.interrupt();
        let second = d.factor(&drift, b, 4096, m);
        let third = d.factor(&drift, b, 8192, m);
        let seen = [first, second, third];
        assert!(seen.iter().all(|&x| x == 2.0 || x == 4.0), "{seen:?}");
        assert_eq!(first * second, 8.0, "{seen:?}");
        assert_eq!(first, third, "{seen:?}");
        // Backends that do not drift are left alone.
        assert_eq!(d.factor(&drift, Backend::Nccl, 4096, m), 1.0);
        // The seed picks where each backend starts; some seed starts it the other way.
        let starts: Vec<f64> = (0..16)
            .map(|s| Drift::new(s).factor(&drift, b, 4096, m))
            .collect();
        assert!(starts.contains(&2.0) && starts.contains(&4.0), "{starts:?}");
        assert_eq!(Drift::new(3).factor(&drift, b, 4096, m), first);
    }

    /// Through the simulated fabric: the drifting backend's median moves by F from one
    /// verified timing to the next and stays F or more slower than without the fault; a
    /// backend it does not name is timed exactly as without it.
    #[test]
    fn the_simulated_fabric_moves_a_drifting_backend_between_timings() {
        use crate::fabric::sim::SimFabric;
        use crate::fabric::{Dtype, Fabric, Group};
        let t = crate::topology::presets::get("pcie-4x-1switch").unwrap();
        let g = Group::flat(vec![0, 1, 2, 3], Dtype::Bf16, 1 << 20);
        let (b, m, n) = (Backend::OneStagePull, Mode::Eager, 64 << 10);
        let median = |f: &mut SimFabric, k: Backend| {
            f.verify(k, n, 7).unwrap();
            let mut xs = f.time(k, n, m, 10, 40).unwrap();
            xs.sort_by(f64::total_cmp);
            xs[20]
        };
        let mut plain = SimFabric::new(t.clone(), 5);
        let mut drifting =
            SimFabric::new(t, 5).with_faults(Faults::parse("drift=one_stage_pull:1.5").unwrap());
        for f in [&mut plain, &mut drifting] {
            f.prepare(&g, &[b, Backend::Nccl]).unwrap();
        }
        let model: Vec<f64> = (0..4).map(|_| median(&mut plain, b)).collect();
        let moved: Vec<f64> = (0..4).map(|_| median(&mut drifting, b)).collect();
        for i in 0..4 {
            let r = moved[i] / model[i];
            assert!((1.4..2.4).contains(&r), "{i}: {r} ({moved:?} vs {model:?})");
            if i > 0 {
                let step = moved[i] / moved[i - 1];
                let step = step.max(1.0 / step);
                assert!((1.35..1.65).contains(&step), "{i}: {step} ({moved:?})");
            }
        }
        assert_eq!(
            median(&mut plain, Backend::Nccl),
            median(&mut drifting, Backend::Nccl)
        );
    }
}

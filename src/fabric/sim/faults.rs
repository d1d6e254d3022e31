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
//! | `lose=G:N`       | GPU G falls off the bus after N fabric calls: every later call fails |
//! | `delay=MS`       | every timing call sleeps MS milliseconds of real time (to interrupt a tune) |
//! | `panic=N`        | the fabric panics at call N, standing in for a bug in artune (exit 70) |

use std::fmt;
use std::time::Duration;

use crate::fabric::Backend;

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
    pub lost_gpu: Option<LostGpu>,
    /// Real time each timing call sleeps.
    pub delay: Duration,
    /// The fabric call that panics, standing in for a bug in artune.
    pub panic_at_call: Option<u64>,
}

const EXAMPLE: &str = "write items like wrong=one_stage_pull,hang=nccl_tree_ll,slow=two_stage_push:3,spikes=0.2:20,lose=3:100,delay=20";

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
                        "`{other}` is not a fault; use wrong, hang, slow, spikes, lose, delay or panic ({EXAMPLE})"
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
            "wrong=one_stage_pull+two_stage_push, hang=nccl_tree_ll,slow=nccl:2.5,spikes=0.2:20,lose=3:100,delay=15,panic=9",
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
}

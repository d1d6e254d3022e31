//! `artune why`: everything behind one answer of the profile, for an engine maintainer. Every
//! backend's time and interval at the size, which clause of the steering rule chose and
//! whether band smoothing overrode it, what forcing each alternative costs, and what each
//! engine will run there with artune's export applied.

use std::collections::BTreeMap;

use serde::Serialize;

use super::*;
use crate::decide::{extra_memory, Clause, Passed, Short, Verdict, MIN_EFFECT};
use crate::report::model::outside_calibration;
use crate::units::{fmt_bytes, fmt_size, fmt_us};

mod render;
pub use render::render;

/// One backend measured at the bucket.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub backend: Backend,
    pub median_us: f64,
    pub ci_low_us: f64,
    pub ci_high_us: f64,
    /// Simulated: the model's error band (µs) the rule compared with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_us: Option<(f64, f64)>,
    /// Simulated: the band reaches beyond the model's calibration ([`crate::report::model`]), so
    /// the time is no estimate of the machine.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub outside_calibration: bool,
    /// Forcing this backend instead of the profile's choice: its time over the choice's, minus 1.
    pub vs_chosen: f64,
    /// Extra device memory per GPU it costs an engine at this size (0 for NCCL).
    pub extra_bytes: u64,
    /// Excluded at this size (memory budget), with the reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waived: Option<String>,
    /// Its samples, where too few for a 95% interval (a cell the tune stopped early as far
    /// slower): its interval is then their range.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range_of: Option<u32>,
}

/// What one engine runs here, and its time where artune measured it.
#[derive(Debug, Clone, Serialize)]
pub struct EngineLine {
    #[serde(flatten)]
    pub run: EngineRun,
    pub median_us: Option<f64>,
    /// Against the profile's choice, where both were measured.
    pub vs_chosen: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Why {
    pub simulated: bool,
    /// Measured on one GPU as K virtual ranks: every time, NCCL's K ranks too, is one GPU's.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub loopback: bool,
    pub fabric: String,
    pub tp: usize,
    pub mode: Mode,
    pub gpus: Vec<usize>,
    /// The group answered for, named for a reader ("TP2 graph on GPUs 3,4 (...)").
    pub group: String,
    pub bytes: u64,
    /// The bucket that serves this size (the first measured size at or above it).
    pub bucket_bytes: u64,
    pub rows: Vec<Row>,
    /// Backends not measured at this size or for the group, and why.
    pub not_measured: BTreeMap<Backend, String>,
    /// The NCCL reference the rule compares against (NCCL's own unless a pin beats it).
    pub nccl_reference: Option<Backend>,
    /// The steering rule's answer at this size alone.
    pub rule_choice: Backend,
    /// The clause of the rule that gave `rule_choice` and the margins that decided it.
    pub rule: Option<Verdict>,
    /// The profile's answer (after band smoothing).
    pub chosen: Backend,
    /// Band smoothing replaced the per-size answer to avoid a band change worth less than MIN_EFFECT.
    pub smoothed: bool,
    /// The form the choice was timed in, where the profile records it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub form: Option<crate::allreduce::Form>,
    /// The NCCL variant artune's plugin runs here.
    pub nccl_choice: Backend,
    /// The channel count the plugin sets with that variant, where it pins one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_channels: Option<u32>,
    /// Why that variant's channel count was not measured (it keeps NCCL's own), where not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels_unmeasured: Option<String>,
    /// Which clause of the rule decided, in words.
    pub reason: String,
    /// Where `chosen` is an island schedule no engine has: what an engine without artune's
    /// kernels runs instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Backend>,
    /// The group's islands and each island schedule's phases, where it has islands.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub islands: Option<IslandsView>,
    /// Kernels the memory budget (`--mem-budget`) excluded here that would have beaten the
    /// choice: the reason, rather than the rule, that they do not serve.
    pub over_budget: Vec<OverBudget>,
    pub engines: Vec<EngineLine>,
}

/// A group's islands and the island schedules' phases on them, as `why` prints them.
#[derive(Debug, Clone, Serialize)]
pub struct IslandsView {
    pub islands: crate::allreduce::Islands,
    /// Per island schedule measured here, its phases in words.
    pub phases: Vec<(Backend, String)>,
}

/// A kernel the memory budget excluded at the bucket though it is faster than the choice.
#[derive(Debug, Clone, Serialize)]
pub struct OverBudget {
    pub backend: Backend,
    /// The choice's time over the kernel's (> 1: the kernel is that many times faster).
    pub speedup: f64,
    /// The exclusion as the profile recorded it.
    pub because: String,
}

/// Explains the profile's answer for `bytes` on the group `q` names (`q.gpus` None: the
/// engine's default placement, GPUs 0..tp); the answer names that group.
/// The group `q` names, or what the profile has instead.
fn find_group<'a>(p: &'a Profile, q: Query<'_>) -> Result<&'a GroupProfile, Error> {
    let (tp, mode) = (q.tp, q.mode);
    p.group(q).ok_or_else(|| match q.gpus {
        Some(gpus) => Error::bad_input(format!(
            "the profile has no TP{tp} {} group on GPUs {} (it has {}); pass one of those to --gpus",
            mode.id(),
            crate::topology::fmt_gpus(gpus),
            placements(p, tp, mode)
        )),
        None => Error::bad_input(format!(
            "the profile has no TP{tp} {} group (it has {}); pass one of those to --tp and --mode",
            mode.id(),
            p.group_names()
        )),
    })
}

/// The bucket serving `bytes`, or which way the asked size is outside the measured ones.
fn find_bucket<'a>(g: &'a GroupProfile, q: Query<'_>, bytes: u64) -> Result<&'a Bucket, Error> {
    let (tp, mode) = (q.tp, q.mode);
    bucket_for(g, bytes).ok_or_else(|| {
        let smallest = g.buckets.first().map_or(0, |b| b.bytes);
        if bytes < smallest {
            return Error::bad_input(format!(
                "{} is below the smallest size measured for TP{tp} {} ({}, above the 4 KiB where times stop depending on size); ask about a larger size or tune from 1K",
                fmt_size(bytes),
                mode.id(),
                fmt_size(smallest)
            ));
        }
        Error::bad_input(format!(
            "{} is above the largest size measured for TP{tp} {} ({}); ask about a smaller size or tune larger sizes",
            fmt_size(bytes),
            mode.id(),
            fmt_size(g.buckets.last().map_or(0, |b| b.bytes))
        ))
    })
}

pub fn explain(p: &Profile, q: Query<'_>, bytes: u64) -> Result<Why, Error> {
    let (tp, mode) = (q.tp, q.mode);
    let g = find_group(p, q)?;
    let b = find_bucket(g, q, bytes)?;
    let eligible = b.eligible();
    let verdict = crate::decide::rule_verdict(&eligible, g.ranks(), b.bytes);
    let rule_choice = verdict.as_ref().map_or(b.choice, |v| v.choice);
    let chosen_us = median(b, b.choice).unwrap_or(f64::NAN);
    let mut rows: Vec<Row> = b
        .results
        .iter()
        .map(|(k, t)| Row {
            backend: *k,
            median_us: t.median_us,
            ci_low_us: t.ci_low_us,
            ci_high_us: t.ci_high_us,
            model_us: t.model.map(|m| (t.median_us * m.low, t.median_us * m.high)),
            outside_calibration: t.model.is_some_and(|m| outside_calibration(&m)),
            vs_chosen: t.median_us / chosen_us - 1.0,
            extra_bytes: extra_memory(*k, g.ranks(), b.bytes),
            waived: b.waived.get(k).cloned(),
            range_of: ((t.samples as usize) < crate::stats::MIN_FOR_95).then_some(t.samples),
        })
        .collect();
    rows.sort_by(|x, y| x.median_us.total_cmp(&y.median_us));
    let mut not_measured: BTreeMap<Backend, String> = g.waived.clone();
    for k in Backend::ALL {
        if !b.results.contains_key(&k) {
            not_measured
                .entry(k)
                .or_insert_with(|| "not measured at this size".into());
        } else {
            not_measured.remove(&k);
        }
    }
    let nccl_reference = crate::decide::nccl_choice(&eligible);
    let mut over_budget: Vec<OverBudget> = crate::report::budget_exclusions(b)
        .into_iter()
        .filter_map(|(k, r, why)| {
            r.filter(|&r| r > 1.0).map(|speedup| OverBudget {
                backend: k,
                speedup,
                because: why.to_string(),
            })
        })
        .collect();
    over_budget.sort_by(|a, b| b.speedup.total_cmp(&a.speedup));
    // What the rule would answer here with nothing excluded: where that is an excluded kernel,
    // the budget, not the rule, is why it does not serve.
    let unbudgeted_verdict = crate::decide::rule_verdict(&b.results, g.ranks(), b.bytes);
    let unbudgeted = unbudgeted_verdict
        .as_ref()
        .map_or(rule_choice, |v| v.choice);
    let budget_decided = unbudgeted != rule_choice && b.waived.contains_key(&unbudgeted);
    let mut reason = verdict.as_ref().map_or_else(
        || "Nothing within the memory budget was measured here.".to_string(),
        |v| reason(v, &eligible, b.choice, !over_budget.is_empty()),
    );
    reason.push_str(&budget_reason(
        p,
        b,
        &over_budget,
        budget_decided.then_some(unbudgeted),
        unbudgeted_verdict.as_ref(),
    ));
    if b.nccl_choice.is_none() {
        reason.push_str(" The profile records no NCCL variant per size (an older profile), so artune's plugin leaves NCCL its own choice.");
    } else if nccl_reference.is_some_and(|r| r != plugin_nccl(b)) {
        reason.push_str(&format!(
            " Among NCCL variants the bands keep {} here (not significantly slower than {}), so that is what artune's plugin runs.",
            plugin_nccl(b),
            nccl_reference.map_or("-", |r| r.id())
        ));
    }
    let engines = engine_lines(p, g, b, bytes, chosen_us);
    Ok(Why {
        simulated: p.simulated,
        loopback: p.is_loopback(),
        fabric: p.fabric.clone(),
        tp,
        mode,
        gpus: g.gpus.clone(),
        group: crate::report::group_label(g),
        bytes,
        bucket_bytes: b.bytes,
        rows,
        not_measured,
        nccl_reference,
        rule_choice,
        rule: verdict,
        chosen: b.choice,
        smoothed: rule_choice != b.choice,
        form: g.forms.get(&b.choice).copied(),
        nccl_choice: plugin_nccl(b),
        nccl_channels: g
            .channels_at(b.bytes)
            .filter(|_| plugin_nccl(b).nccl_pin().is_some()),
        channels_unmeasured: g
            .channels_unmeasured
            .clone()
            .filter(|_| plugin_nccl(b).nccl_pin().is_some() && g.channels_at(b.bytes).is_none()),
        reason,
        fallback: b.fallback,
        islands: g.islands.as_ref().map(|i| IslandsView {
            islands: i.clone(),
            phases: b
                .results
                .keys()
                .filter(|k| k.is_hierarchical())
                .map(|&k| {
                    let words =
                        crate::allreduce::phases_in_words(k, g.ranks(), i.directions.as_ref());
                    (k, words)
                })
                .collect(),
        }),
        over_budget,
        engines,
    })
}

/// What each engine runs at `bytes`, with and without artune's plugins, priced from the bucket.
fn engine_lines(
    p: &Profile,
    g: &GroupProfile,
    b: &Bucket,
    bytes: u64,
    chosen_us: f64,
) -> Vec<EngineLine> {
    [
        vllm::runs(p, g, bytes),
        vllm::plugin_runs(p, g, bytes),
        sglang::runs(p, g, bytes),
        sglang::plugin_runs(p, g, bytes, false),
        sglang::plugin_runs(p, g, bytes, true),
        trtllm::runs(p, g, bytes),
        nccl::runs(g, bytes),
    ]
    .into_iter()
    .map(|run| {
        let t = match run.backend {
            Some(Backend::Nccl) if run.engine != "NCCL with artune's plugin" => {
                plugin_time(b).map(|t| t.median_us)
            }
            Some(k) => median(b, k),
            None => None,
        };
        EngineLine {
            vs_chosen: t.map(|t| t / chosen_us - 1.0),
            median_us: t,
            run,
        }
    })
    .collect()
}

/// How `--mem-budget` bears on the answer: the reason, where without it the rule picks
/// `unbudgeted`; else the faster kernels it excluded, which would not have won anyway, by the
/// margins the rule's verdict without the budget (`free`) gives.
fn budget_reason(
    p: &Profile,
    b: &Bucket,
    over: &[OverBudget],
    unbudgeted: Option<Backend>,
    free: Option<&Verdict>,
) -> String {
    let Some(fastest) = over.first() else {
        return String::new();
    };
    let budget = p
        .settings
        .mem_budget_bytes
        .map_or("the memory budget".to_string(), |m| {
            format!("the memory budget of {} per GPU", fmt_bytes(m))
        });
    let names = over
        .iter()
        .map(|o| format!("{} ({:.2}x faster)", o.backend, o.speedup))
        .collect::<Vec<_>>()
        .join(", ");
    match unbudgeted {
        Some(k) => {
            let because = over
                .iter()
                .find(|o| o.backend == k)
                .map_or(fastest.because.as_str(), |o| o.because.as_str());
            format!(
                " The reason is --mem-budget: without it the rule picks {k}, but {budget} excluded it here ({because}); in all it excluded {names}. Raise --mem-budget and tune again to let it serve."
            )
        }
        None => {
            let lost: Vec<Passed> = free
                .map(|v| v.kernels_short.clone())
                .unwrap_or_default()
                .into_iter()
                .filter(|k| over.iter().any(|o| o.backend == k.backend))
                .collect();
            let why = match (free.and_then(|v| v.reference), lost.is_empty()) {
                (Some(r), false) => format!(": {}", passed_words(&lost, r)),
                _ => ", as none of them beats it by the rule".to_string(),
            };
            format!(
                " --mem-budget ({budget}) excluded {names} here; without the budget the rule would still answer {}{why}.",
                b.choice
            )
        }
    }
}

/// The placements of a TP size and mode, "GPUs 0,1, GPUs 3,4" (for messages).
fn placements(p: &Profile, tp: usize, mode: Mode) -> String {
    let v: Vec<String> = p
        .groups
        .iter()
        .filter(|g| g.tp == tp && g.mode == mode)
        .map(|g| format!("GPUs {}", crate::topology::fmt_gpus(&g.gpus)))
        .collect();
    if v.is_empty() {
        p.group_names()
    } else {
        v.join(", ")
    }
}

/// A speed-up (a time over a faster one) in words: "17.9% faster", or "2.77x faster" from
/// twice as fast.
fn faster(speedup: f64) -> String {
    match (speedup - 1.0) * 100.0 {
        p if p < 0.05 => "less than 0.1% faster".into(),
        p if p < 100.0 => format!("{p:.1}% faster"),
        _ => format!("{speedup:.2}x faster"),
    }
}

/// Why `a` does not beat `b`, in words: the margin of the rule that decided.
fn short_words(a: Backend, b: Backend, s: &Short) -> String {
    let edge = (MIN_EFFECT * 100.0).round();
    match *s {
        Short::UnderEffect { speedup } => {
            let f = faster(speedup);
            let only = if f.starts_with("less") { "" } else { "only " };
            format!("{a} is {only}{f} than {b}, not the more than {edge}% the rule asks")
        }
        Short::Overlap { speedup } => format!(
            "{a} is {} than {b} by the medians, but their 95% intervals overlap",
            faster(speedup)
        ),
        Short::WithinModel {
            speedup,
            a_band,
            b_band,
            a_high_us,
            b_low_us,
        } => format!(
            "{a} is modelled {} than {b}, but within the model's error: their 95% intervals' ends widened by their bands put {a} (x{:.2}-x{:.2}) as high as {} and {b} (x{:.2}-x{:.2}) as low as {}",
            faster(speedup),
            a_band.0,
            a_band.1,
            fmt_us(a_high_us),
            b_band.0,
            b_band.1,
            fmt_us(b_low_us)
        ),
    }
}

/// The backends `passed` that lost to `b`, in words: the first of each kind of margin in full,
/// the others of that kind after it.
fn passed_words(passed: &[Passed], b: Backend) -> String {
    let mut kinds: Vec<(std::mem::Discriminant<Short>, String, Vec<String>)> = Vec::new();
    for p in passed {
        let kind = std::mem::discriminant(&p.short);
        let speedup = match p.short {
            Short::UnderEffect { speedup }
            | Short::Overlap { speedup }
            | Short::WithinModel { speedup, .. } => speedup,
        };
        let brief = format!("{} ({})", p.backend, faster(speedup));
        match kinds.iter_mut().find(|(k, ..)| *k == kind) {
            Some((.., more)) => more.push(brief),
            None => kinds.push((kind, short_words(p.backend, b, &p.short), Vec::new())),
        }
    }
    kinds
        .into_iter()
        .map(|(_, first, more)| match more.is_empty() {
            true => first,
            false => format!("{first}; likewise {}", more.join(", ")),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The clause of the steering rule (src/decide/rule.rs) that gave `v.choice`, in words, with
/// the margins that decided it, then band smoothing's part where `chosen` differs.
fn reason(v: &Verdict, r: &BTreeMap<Backend, Timing>, chosen: Backend, budgeted: bool) -> String {
    let pct_edge = (MIN_EFFECT * 100.0).round();
    let rule = v.choice;
    let mut s = match v.reference {
        Some(Backend::Nccl) => format!(
            "NCCL's own choice is the reference: no pinned algorithm x protocol beats it (intervals apart and more than {pct_edge}% faster)"
        ),
        Some(n) if r.contains_key(&Backend::Nccl) => {
            format!(
                "{n} beats NCCL's own choice (intervals apart, more than {pct_edge}% faster), so it is the NCCL reference"
            )
        }
        Some(n) => format!(
            "NCCL's own choice was not measured; {n}, the fastest pinned variant, is the reference"
        ),
        None => "No NCCL variant was measured".into(),
    };
    if v.reference == Some(Backend::Nccl) && !v.pins_short.is_empty() {
        s.push_str(&format!(": {}", passed_words(&v.pins_short, Backend::Nccl)));
    }
    s.push('.');
    let within = if budgeted {
        " within the memory budget"
    } else {
        ""
    };
    match (v.clause, v.reference) {
        (Clause::NcclReference, Some(n)) if v.kernels_short.is_empty() => s.push_str(&format!(
            " No custom kernel{within} is faster than {n}, so it serves."
        )),
        (Clause::NcclReference, Some(n)) => s.push_str(&format!(
            " No custom kernel{within} beats {n} by that test (with the model's error on a simulated profile), so none earns its IPC buffers and {n} serves: {}.",
            passed_words(&v.kernels_short, n)
        )),
        _ => {
            let beat = match v.reference {
                Some(n) => format!("Custom kernels that beat {n}"),
                None => "Custom kernels measured".into(),
            };
            let names: Vec<&str> = v.earning.iter().map(|k| k.id()).collect();
            s.push_str(&format!(" {beat}: {}.", names.join(", ")));
            match (v.tie, v.tie_short) {
                (Some(best), short) => s.push_str(&format!(
                    " {best} is the fastest but does not beat {rule} by the rule{}, and {rule} needs less extra memory, so the tie goes to {rule}.",
                    short.map_or(String::new(), |x| format!(" ({})", short_words(best, rule, &x)))
                )),
                (None, _) => s.push_str(&format!(
                    " {rule} is the fastest of them; any it does not beat by the rule is a tie that goes to the least extra memory."
                )),
            }
        }
    }
    if chosen != rule {
        let short = r
            .get(&rule)
            .zip(r.get(&chosen))
            .and_then(|(a, b)| crate::decide::short(a, b));
        s.push_str(&format!(
            " Band smoothing keeps {chosen} here instead: {}, and a band change must gain more than {pct_edge}%.",
            short.map_or(format!("it is not significantly slower than {rule}"), |x| {
                short_words(rule, chosen, &x)
            })
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(tp: usize) -> Query<'static> {
        Query {
            tp,
            mode: Mode::Graph,
            gpus: None,
        }
    }

    #[test]
    fn explains_the_rule_and_prices_every_alternative() {
        let p = sample::profile();
        let w = explain(&p, q(2), 4096).unwrap();
        assert_eq!(w.bucket_bytes, 4096);
        assert_eq!(w.chosen, p.groups[0].buckets[1].choice);
        assert!(w
            .rows
            .iter()
            .any(|r| r.backend == w.chosen && r.vs_chosen == 0.0));
        assert_eq!(w.engines.len(), 7);
        // With the plugin, vLLM follows the profile: NCCL where it says NCCL.
        let plugin = w
            .engines
            .iter()
            .find(|e| e.run.engine == "vLLM + artune's plugin")
            .unwrap();
        assert_eq!(plugin.run.runs == "NCCL", w.chosen.is_nccl(), "{plugin:?}");
        let text = render(&w);
        assert!(
            text.contains("SIMULATED") && text.contains("why: "),
            "{text}"
        );
        assert!(!text.contains("LOOPBACK"), "{text}");
        assert!(explain(&p, q(8), 4096).is_err());
        assert!(explain(&p, q(2), 1 << 40).is_err());
    }

    /// A loopback profile's answer says its times are one GPU's, with the fabric's own words
    /// (which say how NCCL ran).
    #[test]
    fn a_loopback_profile_says_its_times_are_one_gpu_s() {
        let mut p = sample::profile();
        p.simulated = false;
        p.topology.origin.kind = "loopback".into();
        p.fabric = "CUDA loopback: 2 virtual ranks; NCCL timed as 2 rank processes".into();
        let text = render(&explain(&p, q(2), 4096).unwrap());
        let head = text.lines().next().unwrap();
        assert!(
            head.ends_with(
                "; LOOPBACK profile (CUDA loopback: 2 virtual ranks; NCCL timed as 2 rank \
                 processes): every rank shared one GPU, so no time here is multi-GPU evidence"
            ),
            "{head}"
        );
    }

    #[test]
    fn smoothing_is_reported_when_it_overrides_the_rule() {
        let mut p = sample::profile();
        let b = &mut p.groups[0].buckets[1];
        let rule = b.choice;
        // Pretend the bands kept another measured backend here.
        let other = *b.results.keys().find(|k| **k != rule).unwrap();
        b.choice = other;
        let bytes = b.bytes;
        let w = explain(&p, q(2), bytes).unwrap();
        assert!(w.smoothed && w.rule_choice == rule && w.chosen == other);
        assert!(w.reason.contains("Band smoothing"), "{}", w.reason);
    }
}

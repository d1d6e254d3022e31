//! `artune check`: does a profile still hold here? By the validity rule (the hardware that
//! decides; versions and NCCL/CUDA variables are notes: [`crate::profile::validity`]), or with
//! `--measure` by its decisive sizes re-timed and judged against this machine's own
//! run-to-run variation (see [`crate::recheck`]). A stale verdict names the
//! command that tunes this machine again into the same file.

use super::output::outln;
use super::{load_topology, CheckArgs, Source};
use crate::error::Error;
use crate::profile::Profile;
use crate::recheck::Point;
use crate::report::count;
use crate::units::fmt_bytes;

fn source(a: &CheckArgs) -> Source {
    Source {
        sim: a.sim.clone(),
        topology: a.topology.clone(),
    }
}

/// The command that tunes the machine `a` checks against again, into the profile's file (as
/// virtual ranks again where `p` was tuned so and nothing else names the machine).
fn retune(a: &CheckArgs, p: &Profile) -> String {
    retune_on(a, p, None)
}

/// [`retune`] for a machine read with `machine_gpus` GPUs: one GPU tunes only as virtual ranks,
/// as many as the profile had.
fn retune_on(a: &CheckArgs, p: &Profile, machine_gpus: Option<usize>) -> String {
    let q = |s: &str| crate::shell::quote(s);
    let mut c = String::from("artune tune");
    // A measured profile is made again by measuring, on the machine the model stands for: a
    // simulated tune into its file would replace the measurement with a model.
    if p.simulated {
        if let Some(s) = &a.sim {
            c += &format!(" --sim {}", q(s));
        }
        if let Some(t) = &a.topology {
            c += &format!(" --topology {}", q(&t.display().to_string()));
        }
    }
    let one_gpu = machine_gpus == Some(1);
    let modelled = p.simulated && (a.sim.is_some() || a.topology.is_some());
    let virtual_ranks = ((p.topology.origin.kind == "loopback" || one_gpu) && !modelled)
        .then_some(p.topology.gpu_count().max(2));
    let ranks = a.loopback.or(virtual_ranks);
    if let Some(k) = ranks {
        c += &format!(" --loopback {k}");
    }
    let gpus = ranks.or(machine_gpus).unwrap_or(p.topology.gpu_count());
    c + &settings_flags(p, gpus) + &format!(" --out {}", q(&a.profile.display().to_string()))
}

/// The flags that tune what the profile holds again on a machine of `gpus` GPUs, where they
/// differ from a plain tune's: its TP sizes (those that fit), one mode, another dtype, its
/// sizes, budget and sampling. Without them the command replaced an fp32 eager-only profile
/// with a bf16 tune of both modes.
fn settings_flags(p: &Profile, gpus: usize) -> String {
    let s = &p.settings;
    let mut c = String::new();
    let tp: Vec<String> =
        s.tp.iter()
            .filter(|&&t| t <= gpus)
            .map(|t| t.to_string())
            .collect();
    let plain: Vec<String> = crate::plan::default_tp(gpus)
        .iter()
        .map(|t| t.to_string())
        .collect();
    if !tp.is_empty() && tp != plain {
        c += &format!(" --tp {}", tp.join(","));
    }
    if let [mode] = s.modes[..] {
        c += &format!(" --mode {}", mode.id());
    }
    if let Some(d) = s.dtype.filter(|&d| d != crate::allreduce::Dtype::Bf16) {
        c += &format!(" --dtype {}", d.id());
    }
    // As the user types sizes ("64K"), or a plain byte count where no unit fits.
    let typed = |b: u64| match crate::units::fmt_size(b) {
        t if t.contains(' ') => b.to_string(),
        t => t,
    };
    if (s.min_bytes, s.max_bytes) != (1 << 10, 256 << 20) {
        c += &format!(" --sizes {}:{}", typed(s.min_bytes), typed(s.max_bytes));
    }
    if let Some(b) = s.mem_budget_bytes {
        c += &format!(" --mem-budget {}", typed(b));
    }
    if s.sampling == crate::profile::Sampling::Exhaustive {
        c += " --exhaustive";
    }
    c
}

fn stale(a: &CheckArgs, p: &Profile, why: String) -> Error {
    Error::Stale {
        why,
        retune: retune(a, p),
    }
}

/// A verdict of stale before anything was timed: as JSON too with `--json` (scripts read the
/// verdict there), with the re-tune for a machine of `gpus` GPUs where it was read.
fn stale_before(a: &CheckArgs, p: &Profile, why: String, gpus: Option<usize>) -> Result<(), Error> {
    let retune = retune_on(a, p, gpus);
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "profile": a.profile, "measured": a.measure, "holds": false,
                "changes": [why], "simulated": p.simulated, "retune": retune,
            }))
            .expect("json")
        );
    }
    Err(Error::Stale { why, retune })
}

/// `artune check PROFILE [--measure]`.
pub fn run(a: CheckArgs) -> Result<i32, Error> {
    // Only the audit reads it; clap's requirement lets it through beside --sim, --topology,
    // --measure or --json, which the audit conflicts with.
    if let Some(k) = a.tp {
        return Err(Error::bad_input(format!(
            "--tp {k} only chooses the TP size that --nccl-audit sweeps; add --nccl-audit, or drop --tp to check every group of the profile"
        )));
    }
    let p = Profile::load(&a.profile)?;
    if p.groups.is_empty() {
        return empty(&a, &p);
    }
    if a.measure {
        return measured(&a, &p);
    }
    let now = load_topology(&source(&a))?;
    busy_note(&a.profile, &p);
    let v = crate::profile::validity::judged(&p, &now);
    let against = match (&a.topology, &a.sim) {
        (Some(f), _) => format!("the topology in {}", f.display()),
        (None, Some(preset)) => format!("the simulated preset {preset}"),
        (None, None) => "this machine".into(),
    };
    let words = |c: &mut dyn Iterator<Item = &crate::profile::validity::Change>| -> Vec<String> {
        c.map(ToString::to_string).collect()
    };
    let (reasons, notes) = (words(&mut v.reasons()), words(&mut v.notes()));
    let unchecked: Vec<String> = v.unchecked.iter().map(ToString::to_string).collect();
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "profile": a.profile, "against": against, "measured": false,
                "holds": v.valid(), "changes": reasons, "notes": notes, "unchecked": unchecked,
                "simulated": p.simulated,
                "retune": (!v.valid()).then(|| retune_on(&a, &p, Some(now.gpu_count()))),
            }))
            .expect("json")
        );
    }
    if !v.valid() {
        return Err(Error::Stale {
            why: v.summary(4),
            retune: retune_on(&a, &p, Some(now.gpu_count())),
        });
    }
    if a.json {
        return Ok(0);
    }
    let unchecked = match unchecked.is_empty() {
        true => String::new(),
        false => format!("; not checked (unknown here): {}", unchecked.join(", ")),
    };
    let verdict = v.verdict(crate::profile::validity::Allow::default());
    let notes = verdict.strip_prefix("valid here").unwrap_or_default();
    outln!(
        "{} holds for {against}: topology class {} ({}){notes}{unchecked}{}",
        a.profile.display(),
        p.fingerprint.topology_class,
        p.group_names(),
        if p.simulated {
            "; the profile is SIMULATED"
        } else {
            ""
        }
    );
    Ok(0)
}

/// A profile of no groups (hand-edited, or cut short) holds nothing an engine could follow:
/// stale, whatever the machine, with the command that tunes it again (as JSON too).
fn empty(a: &CheckArgs, p: &Profile) -> Result<i32, Error> {
    let why =
        "it has no groups (no TP size and mode), so nothing in it can be followed".to_string();
    stale_before(a, p, why, None).map(|()| 0)
}

/// Says on standard error that the profile was measured beside other work (`--allow-busy`).
pub fn busy_note(path: &std::path::Path, p: &Profile) {
    let Some(e) = p.environment.as_ref().filter(|e| e.allow_busy) else {
        return;
    };
    let mut who: Vec<String> = Vec::new();
    for b in e.busy.iter().chain(p.groups.iter().flat_map(|g| &g.beside)) {
        let b = b.to_string();
        if !who.contains(&b) {
            who.push(b);
        }
    }
    eprintln!(
        "note: {} was measured with --allow-busy, beside other processes ({}); its timings may include theirs",
        path.display(),
        if who.is_empty() { "none found".into() } else { who.join("; ") }
    );
}

/// The variables of this process that differ from the profile's measuring environment, as
/// one stale verdict: measuring under another environment would judge another machine.
fn environment_verdict(a: &CheckArgs, p: &Profile) -> Result<(), Error> {
    let mut v = crate::profile::validity::Validity::default();
    crate::profile::validity::add_environment(&mut v, p, &crate::profile::environment::current());
    if v.changes.is_empty() {
        return Ok(());
    }
    let what: Vec<String> = v.changes.iter().map(ToString::to_string).collect();
    stale_before(
        a,
        p,
        format!(
            "the NCCL/CUDA environment differs from the tune's: {}",
            what.join(", ")
        ),
        None,
    )
}

/// The GPUs and links of the machine against the profile's, before measuring: a link that
/// trained narrower or a GPU that changed is a changed machine whether or not the choices
/// still hold on it (a downtrained link slows NCCL and the kernels alike, so re-timing alone
/// can miss it). Versions are left to the measurement: deciding whether a driver upgrade
/// changed anything is what `--measure` is for.
fn hardware_verdict(
    a: &CheckArgs,
    p: &Profile,
    now: &crate::topology::Topology,
) -> Result<(), Error> {
    let mut v = crate::profile::validity::validity(p, now);
    v.changes.retain(crate::profile::validity::Change::is_gpu);
    if v.valid() {
        return Ok(());
    }
    stale_before(
        a,
        p,
        format!(
            "the GPUs or their links differ from the tune's: {}",
            v.summary(4)
        ),
        Some(now.gpu_count()),
    )
}

/// `check --measure`: the profile's decisive sizes re-timed here, the rule applied again.
fn measured(a: &CheckArgs, p: &Profile) -> Result<i32, Error> {
    let source = source(a);
    let faults = super::sim_faults(a.sim_faults.as_deref(), &source)?;
    environment_verdict(a, p)?;
    busy_note(&a.profile, p);
    let mut dtypes: Vec<crate::allreduce::Dtype> = p.groups.iter().map(|g| g.dtype).collect();
    dtypes.sort_by_key(|d| d.id());
    dtypes.dedup();
    super::compile_ahead(&source, &dtypes);
    let status = super::progress::StatusLine::new();
    let cancel = crate::cancel::Cancel::new();
    let stopping = super::progress::stop_on_signals(&cancel, &status);
    status.stage("looking for other processes on the GPUs");
    let ask = super::gate::Ask {
        simulated: source.sim.is_some() || source.topology.is_some(),
        loopback: a.loopback,
        fake: a.sim_occupancy.as_deref(),
        allow_busy: a.allow_busy,
        wait: std::time::Duration::from_secs(a.wait),
        command: "check --measure",
    };
    let (gated, mut fabric, spent) =
        super::gate::gate_then_open(&ask, &mut || status.stage("opening the machine"), |_| {
            super::open_fabric(&source, a.loopback, 7, faults, &dtypes)
        })?;
    let neighbours = gated.neighbours;
    // What it took from opening the machine: the busy check's own wait is not counted.
    let now = std::time::Instant::now();
    let started = now
        .checked_sub(std::time::Duration::from_secs_f64(spent.startup_s))
        .unwrap_or(now);
    // Another machine is stale (exit 3) before its GPU count is bad input, but for a profile
    // of virtual ranks, which --loopback fits here.
    if p.topology.origin.kind == "loopback" {
        crate::recheck::fits(p, fabric.topology().gpu_count())?;
    }
    hardware_verdict(a, p, fabric.topology())?;
    crate::recheck::fits(p, fabric.topology().gpu_count())?;
    status.stage("re-timing the decisive sizes");
    let points = crate::recheck::run(
        fabric.as_mut(),
        p,
        &crate::recheck::harness(),
        &cancel,
        &neighbours,
    );
    stopping.commit();
    status.finish();
    drop(fabric);
    let points = points?;
    beside_note(&points);
    verdict(a, p, &points, started.elapsed().as_secs_f64())
}

/// The measured verdict on `points`, printed (as text, or as JSON with `--json`): 0 holds,
/// 3 stale, 8 undecided.
fn verdict(a: &CheckArgs, p: &Profile, points: &[Point], took: f64) -> Result<i32, Error> {
    let broken: Vec<&crate::recheck::Point> = points.iter().filter(|x| x.changed()).collect();
    let unsettled: Vec<&crate::recheck::Point> = points.iter().filter(|x| x.unsettled()).collect();
    let at = |x: &crate::recheck::Point| {
        format!(
            "TP{} {} GPUs {} at {}",
            x.tp,
            x.mode.id(),
            crate::topology::fmt_gpus(&x.gpus),
            fmt_bytes(x.bytes)
        )
    };
    let drifting: Vec<&crate::recheck::Point> = points.iter().filter(|x| x.drifting()).collect();
    if a.json {
        let v = match (broken.is_empty(), drifting.is_empty()) {
            (false, _) => "stale",
            (true, false) => "undecided",
            (true, true) => "holds",
        };
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "profile": a.profile, "measured": true, "verdict": v, "seconds": took,
                "points": points, "retune": (v == "stale").then(|| retune(a, p)),
            }))
            .expect("json")
        );
    }
    let outln_text = |line: String| -> Result<(), Error> {
        if !a.json {
            outln!("{line}");
        }
        Ok(())
    };
    for x in &unsettled {
        let first = &x.passes[0];
        outln_text(format!(
            "{}: not judged: a first pass found {} {:.0}% faster than the profile's {}, a later pass (one in the other order) did not",
            at(x),
            first.now,
            first.gain(x.chosen) * 100.0,
            x.chosen
        ))?;
    }
    let varied: Vec<&crate::recheck::Point> =
        points.iter().filter(|x| x.within_variation()).collect();
    for x in &varied {
        outln_text(format!(
            "{}: holds: {} beat the profile's {} by {:.0}% in every pass, within the variation this machine showed when tuned ({})",
            at(x),
            x.now(),
            x.chosen,
            x.gain() * 100.0,
            tuned_moves(x)
        ))?;
    }
    for x in &drifting {
        outln_text(format!(
            "{}: undecided: {} beat the profile's {} by {:.0}% in every pass ({:.0}% beyond the variation the tune saw), but the timings moved {:.0}% between passes",
            at(x),
            x.now(),
            x.chosen,
            x.gain() * 100.0,
            x.gain_beyond() * 100.0,
            x.drift() * 100.0
        ))?;
    }
    if broken.is_empty() && !drifting.is_empty() {
        let msg = format!(
            "{}: undecided, measured: this machine drifts too much right now to tell whether the profile holds ({} of {} moved between passes by as much as the difference; re-timed in {:.1} s); run the check again when the GPUs are quiet",
            a.profile.display(),
            drifting.len(),
            count(points.len(), "decisive size", "decisive sizes"),
            took
        );
        // Said once, on standard error like a stale verdict, so it is also seen with --json.
        eprintln!("{msg}");
        return Ok(crate::recheck::EXIT_UNDECIDED);
    }
    if broken.is_empty() {
        let judged = points.len() - unsettled.len();
        outln_text(format!(
            "{} holds, measured: at the {} judged here no other backend beats its choice by more than 10% plus this machine's variation (as the tune saw it, and between passes) (re-timed in {:.1} s){}{}",
            a.profile.display(),
            count(judged, "decisive size", "decisive sizes"),
            took,
            match unsettled.len() {
                0 => String::new(),
                n => format!("; {n} more moved between passes (listed above)"),
            },
            if p.simulated { "; the profile is SIMULATED" } else { "" }
        ))?;
        return Ok(0);
    }
    for x in &broken {
        if let Some(why) = &x.unavailable {
            outln_text(format!(
                "{}: the profile chose {}, which cannot run here ({why}); {} runs in its place",
                at(x),
                x.chosen,
                x.now()
            ))?;
            continue;
        }
        outln_text(format!(
            "{}: the profile chose {}, now {} is {:.0}% faster (at least, over three passes; {:.0}% beyond what the variation the tune saw and the drift between passes explain); {}",
            at(x),
            x.chosen,
            x.now(),
            x.gain() * 100.0,
            x.gain_beyond() * 100.0,
            moved(p, x)
        ))?;
    }
    let unavailable = broken.iter().filter(|x| x.unavailable.is_some()).count();
    Err(stale(
        a,
        p,
        format!(
            "{} of {} re-timed here no longer {} what the profile says ({}listed above; re-timed in {:.1} s)",
            broken.len(),
            count(points.len(), "decisive size", "decisive sizes"),
            if broken.len() == 1 {
                "chooses"
            } else {
                "choose"
            },
            match unavailable {
                0 => String::new(),
                n => format!("at {n} of them its choice cannot run here; "),
            },
            took
        ),
    ))
}

/// Says on standard error which points were timed beside other processes (`--allow-busy`).
fn beside_note(points: &[crate::recheck::Point]) {
    let beside: Vec<&crate::recheck::Point> =
        points.iter().filter(|x| !x.beside.is_empty()).collect();
    let Some(first) = beside.first() else {
        return;
    };
    let mut who: Vec<String> = Vec::new();
    for b in beside.iter().flat_map(|x| &x.beside) {
        let b = b.to_string();
        if !who.contains(&b) {
            who.push(b);
        }
    }
    let groups: std::collections::BTreeSet<String> = beside
        .iter()
        .map(|x| {
            format!(
                "TP{} {} GPUs {}",
                x.tp,
                x.mode.id(),
                crate::topology::fmt_gpus(&x.gpus)
            )
        })
        .collect();
    eprintln!(
        "note: {} of {} {} timed beside other processes ({}; --allow-busy), in {} (first at {}); their verdicts may be that work's",
        beside.len(),
        count(points.len(), "decisive size", "decisive sizes"),
        if beside.len() == 1 { "was" } else { "were" },
        who.join("; "),
        groups.into_iter().collect::<Vec<_>>().join(", "),
        crate::units::fmt_bytes(first.bytes)
    );
}

/// How far the backends of a point moved while the profile was tuned, in words.
fn tuned_moves(x: &crate::recheck::Point) -> String {
    let parts: Vec<String> = x
        .tuned
        .iter()
        .map(|(b, d)| format!("{b} by up to {:.0}%", d * 100.0))
        .collect();
    if parts.is_empty() {
        "none recorded".into()
    } else {
        parts.join(", ")
    }
}

/// Which backends moved since the profile was made, at a re-timed point: the profile's
/// median against the last pass's, so a user sees whether the choice got slower or a rival
/// got faster.
fn moved(p: &Profile, x: &crate::recheck::Point) -> String {
    let bucket = p
        .group(crate::profile::Query {
            tp: x.tp,
            mode: x.mode,
            gpus: Some(&x.gpus),
        })
        .and_then(|g| g.buckets.iter().find(|b| b.bytes == x.bytes));
    let (Some(b), Some(last)) = (bucket, x.passes.last()) else {
        return String::new();
    };
    let parts: Vec<String> = last
        .us
        .iter()
        .filter_map(|(k, now)| {
            let then = b.results.get(k)?.median_us;
            Some(format!(
                "{k} {} when profiled → {} ({:+.0}%)",
                crate::units::fmt_us(then),
                crate::units::fmt_us(*now),
                (now / then - 1.0) * 100.0
            ))
        })
        .collect();
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_profile_is_tuned_again_as_virtual_ranks_on_this_machine() {
        let mut p = crate::export::sample::profile();
        // A plain tune's sizes: no --sizes in the commands below (settings_flags' part).
        (p.settings.min_bytes, p.settings.max_bytes) = (1 << 10, 256 << 20);
        let mut a = CheckArgs {
            profile: "p.json".into(),
            topology: None,
            sim: None,
            measure: false,
            loopback: None,
            sim_faults: None,
            allow_busy: false,
            wait: 60,
            sim_occupancy: None,
            json: false,
            nccl_audit: false,
            tp: None,
        };
        assert_eq!(retune(&a, &p), "artune tune --out p.json");
        // A machine of one GPU tunes the profile's GPUs as virtual ranks.
        assert_eq!(
            retune_on(&a, &p, Some(1)),
            format!(
                "artune tune --loopback {} --out p.json",
                p.topology.gpu_count()
            )
        );
        assert_eq!(retune_on(&a, &p, Some(2)), "artune tune --out p.json");
        p.topology.origin.kind = "loopback".into();
        assert_eq!(retune(&a, &p), "artune tune --loopback 4 --out p.json");
        a.topology = Some("one.json".into());
        assert_eq!(
            retune(&a, &p),
            "artune tune --topology one.json --out p.json"
        );
    }
}

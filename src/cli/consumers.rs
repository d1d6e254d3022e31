//! `artune select`, `export`, `check`, `predict`: reading a profile for engines and operators.

use super::output::{out, outln};
use std::path::Path;

use super::{DtypeArg, ExportArgs, MessageArgs, PredictArgs};
use crate::allreduce::Mode;
use crate::error::{Error, EXIT_NO_ANSWER};
use crate::export;
use crate::profile::{GroupProfile, Profile, Query, Selection, UnknownReason};
use crate::report;
use crate::report::model::two_digits;
use crate::units::fmt_bytes;
use crate::workload::{self, Policy, Workload};

fn warn_simulated(path: &Path, p: &Profile) {
    if p.simulated {
        eprintln!(
            "warning: {} is a SIMULATED profile ({}); its numbers are not measurements of any machine",
            path.display(),
            p.fabric
        );
    }
}

/// `--tp` of a question about a profile: a group's size, so at least 2 (every consumer command
/// refuses the same way, before reading the profile where it can).
fn group_size(tp: usize) -> Result<usize, Error> {
    match tp {
        0 | 1 => Err(Error::bad_input(format!(
            "--tp {tp}: an allreduce needs at least 2 GPUs; give the group's size, e.g. --tp 2"
        ))),
        tp => Ok(tp),
    }
}

/// The group a `select` or `why` question is about, or why the profile has no answer there.
/// `--gpus` of the wrong length or with repeats is bad input; GPUs the profile never tuned
/// are a question it cannot answer (the engine keeps its default).
fn asked_group<'p>(
    p: &'p Profile,
    a: &MessageArgs,
) -> Result<Result<&'p GroupProfile, String>, Error> {
    group_of(p, &a.profile, a.tp, a.mode.into(), a.gpus.as_deref())
}

/// [`asked_group`] for any command that names a group by `--tp`, `--mode` and `--gpus` (the
/// profile read from `path`): one rule and one wording for select, why and predict.
fn group_of<'p>(
    p: &'p Profile,
    path: &Path,
    tp: usize,
    mode: Mode,
    gpus: Option<&[usize]>,
) -> Result<Result<&'p GroupProfile, String>, Error> {
    group_size(tp)?;
    if let Some(gpus) = gpus {
        if !crate::profile::is_placement(tp, gpus) {
            return Err(Error::bad_input(format!(
                "--gpus {} must name {tp} different GPUs for --tp {tp}",
                ids(gpus),
            )));
        }
    }
    if let Some(g) = p.group(Query { tp, mode, gpus }) {
        return Ok(Ok(g));
    }
    let placements: Vec<String> = p
        .groups
        .iter()
        .filter(|g| g.tp == tp && g.mode == mode)
        .map(|g| format!("GPUs {}", ids(&g.gpus)))
        .collect();
    Ok(Err(match (gpus, placements.is_empty()) {
        (Some(gpus), false) => format!(
            "{} has no TP{tp} {} group on GPUs {} (it has {}); pass one of those to --gpus",
            path.display(),
            mode.id(),
            crate::topology::fmt_gpus(gpus),
            placements.join(", ")
        ),
        _ => format!(
            "{} has no TP{tp} {} group {}",
            path.display(),
            mode.id(),
            p.no_group(tp, mode)
        ),
    }))
}

/// GPU ids as `--gpus` takes them.
fn ids(gpus: &[usize]) -> String {
    gpus.iter()
        .map(|g| g.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The other placements of the asked TP size and mode, so an answer for one is never taken
/// for the answer for all.
fn other_placements<'p>(p: &'p Profile, g: &GroupProfile) -> Vec<&'p GroupProfile> {
    p.groups
        .iter()
        .filter(|o| o.tp == g.tp && o.mode == g.mode && o.gpus != g.gpus)
        .collect()
}

fn note_other_placements(p: &Profile, g: &GroupProfile) {
    let others: Vec<String> = other_placements(p, g)
        .iter()
        .map(|o| {
            format!(
                "GPUs {} ({}): --gpus {}",
                crate::topology::fmt_gpus(&o.gpus),
                o.placement,
                ids(&o.gpus)
            )
        })
        .collect();
    if !others.is_empty() {
        eprintln!(
            "note: the profile also has TP{} {} on {}",
            g.tp,
            g.mode.id(),
            others.join("; ")
        );
    }
}

/// "No answer here": exit [`EXIT_NO_ANSWER`] so the engine keeps its default, with the reason
/// on stderr, and for `--json` a `null` backend on stdout so a script reads an answer either way.
fn no_answer(a: &MessageArgs, p: &Profile, reason: &str) -> Result<i32, Error> {
    let json = a.json.then(|| {
        serde_json::json!({
            "backend": null,
            "reason": reason,
            "tp": a.tp,
            "mode": Mode::from(a.mode).id(),
            "gpus": a.gpus,
            "simulated": p.simulated,
        })
        .to_string()
    });
    said_no_answer(json, reason)
}

/// The one way select, why and predict say they have no answer: `json` (for `--json`) on
/// stdout, the reason on stderr, exit [`EXIT_NO_ANSWER`].
fn said_no_answer(json: Option<String>, reason: &str) -> Result<i32, Error> {
    if let Some(v) = json {
        outln!("{v}");
    }
    eprintln!("no answer (keep the engine's default): {reason}");
    Ok(EXIT_NO_ANSWER)
}

fn message_bytes(a: &MessageArgs) -> Result<u64, Error> {
    let bytes = crate::units::parse_bytes(&a.bytes)?;
    if bytes == 0 {
        return Err(Error::bad_input(
            "--bytes 0 is not a message; give at least 1 byte",
        ));
    }
    Ok(bytes)
}

pub fn select(a: MessageArgs) -> Result<i32, Error> {
    let p = Profile::load(&a.profile)?;
    let bytes = message_bytes(&a)?;
    let g = match asked_group(&p, &a)? {
        Ok(g) => g,
        Err(reason) => return no_answer(&a, &p, &reason),
    };
    let q = Query {
        tp: g.tp,
        mode: g.mode,
        gpus: Some(&g.gpus),
    };
    match p.select(q, bytes) {
        Selection::Chosen {
            backend,
            nccl,
            fallback,
            expected_us,
            bucket_bytes,
            buffer_bytes,
        } => {
            warn_simulated(&a.profile, &p);
            if a.json {
                let v = serde_json::json!({
                    "backend": backend.id(),
                    "expected_us": expected_us,
                    "bucket_bytes": bucket_bytes,
                    "buffer_bytes": buffer_bytes,
                    "nccl_variant": nccl.id(),
                    "fallback": fallback.id(),
                    "tp": g.tp,
                    "mode": g.mode.id(),
                    "gpus": g.gpus,
                    "placement": g.placement,
                    "other_placements": other_placements(&p, g)
                        .iter()
                        .map(|o| o.gpus.clone())
                        .collect::<Vec<_>>(),
                    "simulated": p.simulated,
                });
                outln!("{v}");
            } else {
                outln!("{backend}");
                eprintln!(
                    "answered for {}, bucket {}",
                    report::group_label(g),
                    fmt_bytes(bucket_bytes)
                );
                if fallback != backend {
                    eprintln!(
                        "{backend} is an island schedule only artune's kernels run; an engine without them runs {fallback} here"
                    );
                }
                note_other_placements(&p, g);
            }
            Ok(0)
        }
        Selection::Unknown(UnknownReason::NoGroup) => {
            // asked_group found it; the selector agrees on groups, so this is a bug.
            Err(Error::Bug(format!(
                "the selector found no group for {}",
                report::group_label(g)
            )))
        }
        Selection::Unknown(why) => no_answer(
            &a,
            &p,
            &report::outside(&a.profile.display().to_string(), g, bytes, why),
        ),
    }
}

pub fn export(a: ExportArgs) -> Result<i32, Error> {
    a.tp.map(group_size).transpose()?;
    let p = Profile::load(&a.profile)?;
    let source = std::fs::canonicalize(&a.profile)
        .unwrap_or_else(|_| a.profile.clone())
        .display()
        .to_string();
    let o = export::Options {
        engine: a.engine,
        tp: a.tp,
        hidden: a.hidden,
        dtype: match a.dtype {
            DtypeArg::Bf16 => crate::allreduce::Dtype::Bf16,
            DtypeArg::Fp16 => crate::allreduce::Dtype::Fp16,
            DtypeArg::Fp32 => crate::allreduce::Dtype::Fp32,
        },
        source,
        world_size: a.world_size,
        allow_simulated: a.allow_simulated,
        plugin: crate::plugin::library::tuner_plugin_value(),
    };
    let e = export::export(&p, &o)?;
    // `--out -` is standard output, as no --out is (not a file named "-").
    let a = ExportArgs {
        out: a.out.filter(|o| o.as_os_str() != "-"),
        ..a
    };
    if let Some(out) = &a.out {
        use crate::profile::paths::{check_output, Expect};
        let one = !a.engine.writes_several() && e.files.len() == 1 && !out.is_dir();
        check_output(out, "--out", if one { Expect::File } else { Expect::Dir })?;
        use crate::profile::paths::{check_not_input, check_replace, Writes};
        let targets: Vec<_> = match one {
            true => vec![out.clone()],
            false => e.files.iter().map(|f| out.join(&f.name)).collect(),
        };
        for t in &targets {
            check_not_input(t, "--out", &a.profile, "profile")?;
            check_replace(t, "--out", Writes::Export, a.force)?;
        }
    }
    warn_simulated(&a.profile, &p);
    for note in export::unread_options(&o) {
        eprintln!("note: {note}");
    }
    match a.out {
        None => {
            let many = e.files.len() > 1;
            for f in &e.files {
                if many {
                    outln!("==> {} <==", f.name);
                }
                out!("{}", f.contents);
            }
        }
        // Engines whose export can hold several files always take a directory, so where
        // the files land does not depend on the profile.
        Some(out) if !a.engine.writes_several() && e.files.len() == 1 && !out.is_dir() => {
            crate::profile::write_atomic(&out, e.files[0].contents.as_bytes())?;
            eprintln!("wrote {}", out.display());
        }
        Some(dir) => {
            if dir.exists() && !dir.is_dir() {
                return Err(Error::bad_input(format!(
                    "{} is a file, but the {} export writes into a directory; give a directory to --out",
                    dir.display(),
                    format!("{:?}", a.engine).to_lowercase()
                )));
            }
            std::fs::create_dir_all(&dir).map_err(|err| Error::Write {
                path: dir.clone(),
                reason: err.to_string(),
            })?;
            // All or nothing: a file left from a half-written export would tell the engine
            // to use one that is not there.
            let paths: Vec<_> = e.files.iter().map(|f| dir.join(&f.name)).collect();
            let files: Vec<_> = paths
                .iter()
                .zip(&e.files)
                .map(|(p, f)| (p.as_path(), f.contents.as_bytes()))
                .collect();
            crate::profile::write_all_atomic(&files)?;
            for path in &paths {
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(0)
}

pub fn why(a: MessageArgs) -> Result<i32, Error> {
    let p = Profile::load(&a.profile)?;
    let bytes = message_bytes(&a)?;
    let g = match asked_group(&p, &a)? {
        Ok(g) => g,
        Err(reason) => return no_answer(&a, &p, &reason),
    };
    let q = Query {
        tp: g.tp,
        mode: g.mode,
        gpus: Some(&g.gpus),
    };
    if let Selection::Unknown(why) = p.select(q, bytes) {
        return no_answer(
            &a,
            &p,
            &report::outside(&a.profile.display().to_string(), g, bytes, why),
        );
    }
    let w = export::why::explain(&p, q, bytes)?;
    warn_simulated(&a.profile, &p);
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&w).unwrap_or_default());
    } else {
        out!("{}", export::why::render(&w));
        note_other_placements(&p, g);
    }
    Ok(0)
}

fn describe(w: &Workload) -> String {
    let terms: Vec<String> = w
        .terms
        .iter()
        .map(|t| match t.size {
            workload::Size::Bytes(b) => format!("{} x {}", t.count, fmt_bytes(b)),
            workload::Size::PerToken { hidden, dtype } => {
                format!("{} x {hidden}·{}·T", t.count, dtype.id())
            }
        })
        .collect();
    let tokens = match (w.tokens.first(), w.tokens.last()) {
        (Some(a), Some(b)) if w.tokens.len() > 1 && b - a + 1 == w.tokens.len() as u64 => {
            format!(", T = {a}..{b}")
        }
        (Some(_), _) => format!(
            ", T = {}",
            w.tokens
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ),
        _ => String::new(),
    };
    format!("{} allreduce bytes per step{tokens}", terms.join(" + "))
}

/// `predict` for a group the profile lacks: no step priced, the reason said (and, for
/// `--json`, written with no steps), exit 6.
fn predict_no_group(a: &PredictArgs, p: &Profile, tp: usize, reason: &str) -> Result<i32, Error> {
    let mode: Mode = a.mode.into();
    let json = a.json.then(|| {
        let v = serde_json::json!({
            "profile": a.profile.display().to_string(),
            "simulated": p.simulated,
            "tp": tp,
            "mode": mode.id(),
            "gpus": a.gpus,
            "steps": [],
            "reason": reason,
        });
        serde_json::to_string_pretty(&v).unwrap_or_default()
    });
    said_no_answer(json, reason)
}

pub fn predict(a: PredictArgs) -> Result<i32, Error> {
    a.tp.map(group_size).transpose()?;
    let p = Profile::load(&a.profile)?;
    let w = Workload::load(&a.workload)?;
    let mode: Mode = a.mode.into();
    let tp = match a.tp {
        Some(t) => t,
        None => {
            let mut tps: Vec<usize> = p.groups.iter().map(|g| g.tp).collect();
            tps.sort_unstable();
            tps.dedup();
            match tps.as_slice() {
                [t] => *t,
                [] => {
                    return Err(Error::bad_input(
                        "the profile has no groups; there is nothing to price a workload with",
                    ))
                }
                _ => {
                    return Err(Error::bad_input(format!(
                        "the profile has several TP sizes ({}); pass --tp to choose one",
                        p.group_names()
                    )))
                }
            }
        }
    };
    // The group as select and why name it, in their words; a missing one prices no step, so
    // it is no answer, as select's (exit 6), not bad input.
    let g = match group_of(&p, &a.profile, tp, mode, a.gpus.as_deref())? {
        Ok(g) => g,
        Err(reason) => return predict_no_group(&a, &p, tp, &reason),
    };
    let pr = workload::predict(&p, g, &w)?;
    // No step priced under the profile's own choice: no answer, as select's (exit 6).
    let code = match pr.rows.iter().any(|r| r.us[0].is_ok()) {
        true => 0,
        false => EXIT_NO_ANSWER,
    };
    let ms = |r: &Result<f64, String>| r.as_ref().ok().map(|us| us / 1000.0);
    if a.json {
        let steps: Vec<serde_json::Value> = pr.rows.iter().map(step_json).collect();
        let v = serde_json::json!({
            "profile": a.profile.display().to_string(),
            "simulated": p.simulated,
            "loopback": p.is_loopback(),
            "tp": tp,
            "mode": mode.id(),
            "gpus": pr.group.gpus,
            "largest_bytes": pr.largest,
            "workload": describe(&w),
            "estimate": workload::ESTIMATE,
            "steps": steps,
        });
        outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(code);
    }
    outln!(
        "{}: TP{tp} {} on GPUs {}{}",
        a.profile.display(),
        mode.id(),
        crate::topology::fmt_gpus(&pr.group.gpus),
        if p.simulated {
            format!(" (SIMULATED: {})", p.fabric)
        } else if p.is_loopback() {
            format!(
                " (LOOPBACK: {}; every rank shared one GPU, so no time here is multi-GPU evidence)",
                p.fabric
            )
        } else {
            String::new()
        }
    );
    outln!("workload: {}", describe(&w));
    outln!("estimate: {}", workload::ESTIMATE);
    outln!("allreduce milliseconds per step under each policy; saving = policy minus the profile's choice");
    outln!(
        "{:>6} {:>10} {:>10} {:>10} {:>10}  {:>15} {:>15} {:>15}",
        "T",
        "profile",
        "nccl",
        "one-stage",
        "vllm",
        "saves vs nccl",
        "vs one-stage",
        "vs vllm"
    );
    let mut reasons: Vec<String> = Vec::new();
    let mut rough = false;
    for r in &pr.rows {
        // "~": priced from times outside the model's calibration, as rough as they are known.
        let out = |k: usize| r.outside_calibration[k];
        rough |= r.outside_calibration.iter().any(|o| *o);
        let num = |v: f64, k: bool| match k {
            true => format!("~{}", two_digits(v)),
            false => format!("{v:.3}"),
        };
        let cell = |k: usize| ms(&r.us[k]).map_or("n/a".to_string(), |v| num(v, out(k)));
        let mine = ms(&r.us[0]);
        let save = |k: usize| match (mine, ms(&r.us[k])) {
            (Some(m), Some(o)) if o > 0.0 => match out(0) || out(k) {
                true => format!(
                    "~{} (~{}%)",
                    two_digits(o - m),
                    two_digits((o - m) / o * 100.0)
                ),
                false => format!("{:.3} ({:.0}%)", o - m, (o - m) / o * 100.0),
            },
            _ => "n/a".to_string(),
        };
        outln!(
            "{:>6} {:>10} {:>10} {:>10} {:>10}  {:>15} {:>15} {:>15}",
            r.tokens.map_or("-".to_string(), |t| t.to_string()),
            cell(0),
            cell(1),
            cell(2),
            cell(3),
            save(1),
            save(2),
            save(3)
        );
        for (k, pol) in Policy::ALL.into_iter().enumerate() {
            if let Err(why) = &r.us[k] {
                let line = if r.beyond.is_empty() {
                    format!("{}: {why}", pol.label())
                } else {
                    format!(
                        "T={}: {why}; not predicted",
                        r.tokens.map_or("-".into(), |t| t.to_string())
                    )
                };
                if !reasons.contains(&line) {
                    reasons.push(line);
                }
            }
        }
    }
    for line in reasons {
        outln!("n/a: {line}");
    }
    if rough {
        outln!(
            "~: priced from simulated times OUTSIDE the model's calibration (bands beyond x{} either way): no estimate of the machine; measure it",
            crate::report::model::CALIBRATED
        );
    }
    Ok(code)
}

/// One row of `predict --json`: each policy's milliseconds, its saving against the profile's
/// choice, why a policy has no figure, and which figures are outside the model's calibration.
fn step_json(r: &workload::Row) -> serde_json::Value {
    let ms = |r: &Result<f64, String>| r.as_ref().ok().map(|us| us / 1000.0);
    let mut msv = serde_json::Map::new();
    let mut saving = serde_json::Map::new();
    let mut unavailable = serde_json::Map::new();
    let mine = ms(&r.us[0]);
    for (k, pol) in Policy::ALL.into_iter().enumerate() {
        let key = serde_json::to_value(pol)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        msv.insert(key.clone(), ms(&r.us[k]).into());
        if let Err(why) = &r.us[k] {
            unavailable.insert(key.clone(), why.clone().into());
        }
        if k > 0 {
            let s = match (mine, ms(&r.us[k])) {
                (Some(m), Some(o)) => Some(o - m),
                _ => None,
            };
            saving.insert(key, s.into());
        }
    }
    serde_json::json!({
        "tokens": r.tokens,
        "ms": msv,
        "saving_ms": saving,
        "unavailable": unavailable,
        "beyond_profile_bytes": r.beyond,
        "outside_calibration": Policy::ALL
            .into_iter()
            .zip(r.outside_calibration)
            .filter(|(_, o)| *o)
            .map(|(p, _)| p)
            .collect::<Vec<_>>(),
    })
}

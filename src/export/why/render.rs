//! `why` in words: the text form of a [`Why`].

use super::*;
use crate::report::model::{fmt_factors, fmt_rough};
use crate::units::fmt_mem;

/// What the form the choice was timed in means for an engine.
fn form_words(f: crate::allreduce::Form, mode: Mode) -> String {
    match f {
        crate::allreduce::Form::Registered => "was timed registered: peers read the engine's own tensors, nothing staged; the engine calls register_graph_buffers() after capture, and a replay before it returns NaN".into(),
        crate::allreduce::Form::Staged => format!("was timed staged: each {} call copies the tensors through its shared buffers inside the kernel", mode.id()),
    }
}

/// The explanation as text.
pub fn render(w: &Why) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{}, {}: served by the bucket at {}{}\n",
        w.group,
        fmt_size(w.bytes),
        fmt_size(w.bucket_bytes),
        if w.simulated {
            format!("; SIMULATED profile ({}), not a measurement", w.fabric)
        } else if w.loopback {
            format!(
                "; LOOPBACK profile ({}): every rank shared one GPU, so no time here is \
                 multi-GPU evidence",
                w.fabric
            )
        } else {
            String::new()
        }
    ));
    s.push_str(&format!(
        "choice: {}{}; NCCL with artune's plugin runs {}{}\n",
        w.chosen,
        if w.smoothed {
            format!(" (band smoothing over the per-size {})", w.rule_choice)
        } else {
            " (the steering rule's per-size answer)".into()
        },
        w.nccl_choice,
        match (w.nccl_channels, &w.channels_unmeasured) {
            (Some(c), _) => format!(" on {c} run-time channels"),
            (None, Some(why)) => format!(" on NCCL's own channel count (not measured: {why})"),
            (None, None) => String::new(),
        }
    ));
    if let Some(f) = w.fallback {
        s.push_str(&format!(
            "{} is an island schedule: only artune's own kernels run it; an engine without them runs {f} here (the same rule among the backends engines have)\n",
            w.chosen
        ));
    }
    if let Some(f) = w.form {
        s.push_str(&format!("form: {} {}\n", w.chosen, form_words(f, w.mode)));
    }
    s.push_str(&format!("why: {}\n", w.reason));
    if let Some(v) = &w.islands {
        let i = &v.islands;
        let dirs = i.directions.as_ref().map_or(String::new(), |d| {
            format!(" (phases oriented by the probe: {})", d.because)
        });
        s.push_str(&format!("islands: {}{dirs}\n", i.describe()));
        for (k, words) in &v.phases {
            s.push_str(&format!("  {k}: {words}\n"));
        }
    }
    s.push('\n');
    // As wide as the longest backend name shown (island_two_shot_copy is 20).
    let bw = (w.rows.iter().map(|r| r.backend))
        .chain(w.not_measured.keys().copied())
        .map(|k| k.id().len())
        .fold(18, usize::max);
    s.push_str(&format!(
        "{:<bw$} {:>12} {:>25} {:>10} {:>12}\n",
        "backend", "median", "95% interval", "forcing it", "extra memory"
    ));
    for r in &w.rows {
        // A time outside the model's calibration is printed as rough as it is known.
        let us = |x: f64| match r.outside_calibration {
            true => fmt_rough(x),
            false => fmt_us(x),
        };
        let band = match (r.model_us, r.outside_calibration) {
            (Some((lo, hi)), true) => format!(
                "  OUTSIDE CALIBRATION: model band x{}, no estimate",
                fmt_factors(&crate::profile::ModelBand {
                    low: lo / r.median_us,
                    high: hi / r.median_us,
                    assumed: false,
                    family: None,
                })
                .trim_start_matches('x')
            ),
            (Some((lo, hi)), false) => format!(
                "  model band of the median {} .. {}",
                fmt_us(lo),
                fmt_us(hi)
            ),
            (None, _) => String::new(),
        };
        s.push_str(&format!(
            "{:<bw$} {:>12} {:>25} {:>10} {:>12}{}\n",
            r.backend.id(),
            us(r.median_us),
            format!("{} .. {}", us(r.ci_low_us), us(r.ci_high_us)),
            match r.vs_chosen * 100.0 {
                _ if r.backend == w.chosen => "chosen".to_string(),
                v if v.abs() < 0.05 => "0.0%".into(),
                v => format!("{v:+.1}%"),
            },
            fmt_mem(r.extra_bytes),
            r.waived
                .as_ref()
                .map_or(String::new(), |why| format!("  (excluded: {why})"))
                + &band
                + &r.range_of.map_or(String::new(), |n| {
                    format!("  (interval: the range of {n} samples; stopped as far slower)")
                })
        ));
    }
    for (k, why) in &w.not_measured {
        s.push_str(&format!("{:<bw$} not measured: {why}\n", k.id()));
    }
    s.push_str("\nwhat each engine runs here (with artune's export applied):\n");
    let width = w
        .engines
        .iter()
        .map(|e| e.run.engine.len())
        .max()
        .unwrap_or(0);
    for e in &w.engines {
        s.push_str(&format!(
            "  {:<width$} {}{}: {}\n",
            e.run.engine,
            e.run.runs,
            match (e.median_us, e.vs_chosen) {
                (Some(t), Some(v)) if e.run.backend == Some(w.chosen) || v.abs() < 1e-12 =>
                    format!(" ({}, as chosen)", fmt_us(t)),
                (Some(t), Some(v)) => format!(" ({}, {:+.1}% vs the choice)", fmt_us(t), v * 100.0),
                _ => " (not measured by artune)".into(),
            },
            e.run.because
        ));
    }
    s
}

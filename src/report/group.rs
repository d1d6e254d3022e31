//! One group's section of the summary: its table of choices, its notes, and what qualifies the
//! choices (the model's error, islands, the regret, the memory budget).

use std::fmt::Write;

use super::choices::{fmt_speedup, forcing_note};
use super::model::{fmt_factors, outside_calibration};
use super::{fmt_gpus, over_budget, passed_over, ranges, PassedOver};
use crate::allreduce::{Backend, Direction};
use crate::decide::Short;
use crate::profile::{Bucket, GroupProfile, ModelBand, UnknownReason};
use crate::units::{fmt_bytes, fmt_mem};

/// A group named for a reader: "TP2 graph on GPUs 3,4 (2 switches, 1 root complex)".
pub fn group_label(g: &GroupProfile) -> String {
    let placement = if g.placement.is_empty() {
        String::new()
    } else {
        format!(" ({})", g.placement)
    };
    format!(
        "TP{} {} on GPUs {}{placement}",
        g.tp,
        g.mode.id(),
        fmt_gpus(&g.gpus)
    )
}

/// Lines about a group that are not its table: waivers (one line per reason) and NCCL's
/// memory. Lines every group shares are printed once per profile.
pub(super) fn group_notes(g: &GroupProfile) -> Vec<String> {
    let mut by_reason: Vec<(&str, Vec<&str>)> = Vec::new();
    for (b, why) in &g.waived {
        match by_reason.iter_mut().find(|(r, _)| *r == why.as_str()) {
            Some((_, v)) => v.push(b.id()),
            None => by_reason.push((why.as_str(), vec![b.id()])),
        }
    }
    let mut v: Vec<String> = by_reason
        .into_iter()
        .map(|(why, bs)| format!("waived {}: {why}", bs.join(", ")))
        .collect();
    if let Some(m) = g.memory.get(&Backend::Nccl) {
        v.push(format!(
            "NCCL communicator: {} per GPU ({})",
            fmt_mem(m.bytes_per_gpu),
            if m.measured { "measured" } else { "modelled" }
        ));
    }
    // Only a variation the rule could mistake for a difference is worth a line.
    if g.drift.values().any(|d| *d > crate::decide::MIN_EFFECT) {
        let moved: Vec<String> = g
            .drift
            .iter()
            .filter(|(_, d)| **d > crate::decide::MIN_EFFECT)
            .map(|(b, d)| format!("{b} up to {:.0}%", d * 100.0))
            .collect();
        v.push(format!(
            "moved while tuned (a size's revisit against its first samples): {}; `check --measure` allows for it",
            moved.join(", ")
        ));
    }
    if !g.beside.is_empty() {
        let who: Vec<String> = g.beside.iter().map(ToString::to_string).collect();
        v.push(format!(
            "BESIDE other work: measured while another process used the GPUs ({}; --allow-busy): its times may include that work, and no drift is recorded for `check --measure`",
            who.join("; ")
        ));
    }
    v
}

/// Sizes as "4K" or "4K–8K".
fn fmt_span(from: u64, to: u64) -> String {
    if from == to {
        fmt_bytes(from)
    } else {
        format!("{}–{}", fmt_bytes(from), fmt_bytes(to))
    }
}

/// Least widths of the per-group table's columns (sizes, backend, vs nccl, extra memory): the
/// header and the rows share them so the titles sit over their values.
const COLUMNS: [usize; 4] = [15, 17, 18, 13];

/// The table's rows, header first, each column as wide as its default or its longest value
/// and one more, so a full cell never runs into the next.
fn table(out: &mut String, rows: &[[String; 5]]) {
    let mut w = COLUMNS;
    for r in rows.iter().skip(1) {
        for (i, wi) in w.iter_mut().enumerate() {
            let n = r[i].chars().count();
            if n >= *wi {
                *wi = n + 1;
            }
        }
    }
    let [w0, w1, w2, w3] = w;
    for c in rows {
        let line = format!(
            "  {:<w0$} {:<w1$} {:<w2$} {:<w3$} {}",
            c[0], c[1], c[2], c[3], c[4]
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// Simulated groups: the model's error band per backend kind, and the sizes where a custom
/// kernel is modelled faster than the choice but not beyond what the model could be wrong by.
fn model_lines(g: &GroupProfile, out: &mut String) {
    let bands = || {
        g.buckets
            .iter()
            .flat_map(|b| b.results.iter().map(move |(k, t)| (b.bytes, *k, t.model)))
            .filter_map(|(bytes, k, m)| Some((bytes, k, m?)))
    };
    let span = |custom: bool| {
        let ms = bands().filter(|(_, k, m)| k.is_custom() == custom && !outside_calibration(m));
        ms.fold(None, |a: Option<(f64, f64)>, (.., m)| {
            Some(a.map_or((m.low, m.high), |(l, h)| (l.min(m.low), h.max(m.high))))
        })
    };
    if bands().next().is_none() {
        return;
    }
    let side =
        |name: &str, b: Option<(f64, f64)>| b.map(|(l, h)| format!("{name} x{l:.2}-x{h:.2}"));
    let within: Vec<String> = [
        side("NCCL", span(false)),
        side("custom kernels", span(true)),
    ]
    .into_iter()
    .flatten()
    .collect();
    let _ = writeln!(
        out,
        "  model error (simulated; docs/MODEL-ERROR.md): {}; a choice of custom is sure beyond it",
        match within.is_empty() {
            true => "no time within the model's calibration".to_string(),
            false => within.join(", "),
        }
    );
    if let Some(line) = outside_line(g) {
        let _ = writeln!(out, "  {line}");
    }
    if let Some(line) = not_sure(g) {
        let _ = writeln!(out, "  {line}");
    }
}

/// The backends and sizes whose simulated times lie outside the model's calibration (a band
/// beyond [`super::model::CALIBRATED`] either way), said once, with the widest band: those
/// times are printed but are no estimate.
fn outside_line(g: &GroupProfile) -> Option<String> {
    let mut kernels: Vec<Backend> = Vec::new();
    let (mut first, mut last, mut widest): (Option<u64>, u64, Option<ModelBand>) = (None, 0, None);
    for b in &g.buckets {
        for (k, m) in b.results.iter().filter_map(|(k, t)| Some((*k, t.model?))) {
            if !outside_calibration(&m) {
                continue;
            }
            if !kernels.contains(&k) {
                kernels.push(k);
            }
            first.get_or_insert(b.bytes);
            last = b.bytes;
            if widest.is_none_or(|w| m.high / m.low > w.high / w.low) {
                widest = Some(m);
            }
        }
    }
    let (first, widest) = (first?, widest?);
    let names: Vec<&str> = kernels.iter().map(|k| k.id()).collect();
    Some(format!(
        "OUTSIDE CALIBRATION: {} at {}: bands up to {} (beyond x{} either way), so those times are no estimate of the machine; measure it",
        names.join(", "),
        fmt_span(first, last),
        fmt_factors(&widest),
        super::model::CALIBRATED
    ))
}

/// Where a custom kernel is modelled faster than the choice but within the model's error: the
/// sizes, in spans of neighbouring sizes, the kernels and the choices they were measured
/// against, and the measurement that settles it (a tune on the machine, which has no model
/// error).
fn not_sure(g: &GroupProfile) -> Option<String> {
    let passed = passed_over(g);
    // At `b`: the fastest custom kernel passed over for lying within the model's error, and
    // the choice it was passed over for; or the custom kernel band smoothing chose where the
    // rule passed it over so, and the rule's own choice.
    let faster = |b: &Bucket| -> Option<(Backend, Backend)> {
        if b.choice.is_custom() {
            let v = crate::decide::rule_verdict(&b.eligible(), g.ranks(), b.bytes)?;
            let within = matches!(v.short_of(b.choice), Some(Short::WithinModel { .. }));
            return (within && !v.choice.is_custom()).then_some((b.choice, v.choice));
        }
        passed
            .iter()
            .filter(|(bytes, k, why)| {
                *bytes == b.bytes && k.is_custom() && *why == PassedOver::WithinModel
            })
            .map(|(_, k, _)| *k)
            .min_by(|x, y| b.results[x].median_us.total_cmp(&b.results[y].median_us))
            .map(|k| (k, b.choice))
    };
    let mut spans: Vec<(u64, u64)> = Vec::new();
    let (mut kernels, mut choices) = (Vec::new(), Vec::new());
    let mut open = false;
    for b in &g.buckets {
        match faster(b) {
            Some((k, choice)) => {
                match spans.last_mut() {
                    Some(last) if open => last.1 = b.bytes,
                    _ => spans.push((b.bytes, b.bytes)),
                }
                open = true;
                for (list, x) in [(&mut kernels, k), (&mut choices, choice)] {
                    if !list.contains(&x) {
                        list.push(x);
                    }
                }
            }
            None => open = false,
        }
    }
    let (first, last) = (spans.first()?.0, spans.last()?.1);
    // As `--sizes` reads them: whole KiB (or MiB) around the span, bytes below 1 KiB.
    let arg = |b: u64, up: bool| match b {
        b if b < 1024 => b.to_string(),
        b if b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b => format!("{}K", if up { b.div_ceil(1024) } else { b / 1024 }),
    };
    let sizes: Vec<String> = spans.iter().map(|&(a, z)| fmt_span(a, z)).collect();
    let names = |l: &[Backend]| l.iter().map(|b| b.id()).collect::<Vec<_>>().join(" or ");
    // The group's own settings, into a file of its own: run as printed, it times what this
    // group is (not bf16 in both modes into artune-profile.json).
    let dtype = match g.dtype {
        crate::allreduce::Dtype::Bf16 => String::new(),
        d => format!(" --dtype {}", d.id()),
    };
    Some(format!(
        "not sure at {}: {} modelled faster than {}, but within the model's error; `artune tune --tp {} --mode {}{dtype} --sizes {}:{} --out settle.json` on the machine settles it",
        sizes.join(", "),
        names(&kernels),
        names(&choices),
        g.tp,
        g.mode.id(),
        arg(first, false),
        arg(last, true)
    ))
}

/// Groups with islands: how they split and which way each phase moved data, and where an
/// island schedule was the fastest measured: by how much over the choice, and whether it was
/// chosen (what engines without artune's kernels run instead) or why not.
fn island_lines(g: &GroupProfile, out: &mut String) {
    let Some(i) = &g.islands else {
        return;
    };
    let dirs = i.directions.as_ref().map_or(String::new(), |d| {
        format!(
            "; inside islands {}, across {} (probe: {})",
            plane_word(d.inside),
            plane_word(d.across),
            d.because
        )
    });
    let _ = writeln!(out, "  islands: {}{dirs}", i.describe());
    for k in Backend::ALL.into_iter().filter(|k| k.is_hierarchical()) {
        let fastest: Vec<(&Bucket, f64)> = g
            .buckets
            .iter()
            .filter_map(|b| {
                let t = b.results.get(&k)?.median_us;
                let best = b
                    .results
                    .iter()
                    .filter(|(x, _)| !x.is_hierarchical())
                    .map(|(_, t)| t.median_us)
                    .fold(f64::INFINITY, f64::min);
                (t < best).then(|| (b, best / t))
            })
            .collect();
        let (Some(first), Some(last)) = (fastest.first(), fastest.last()) else {
            if g.buckets.iter().any(|b| b.results.contains_key(&k)) {
                let _ = writeln!(out, "  {k}: never faster than every flat backend here");
            }
            continue;
        };
        let best = fastest.iter().map(|x| x.1).fold(0.0, f64::max);
        let chosen: Vec<&Bucket> = g.buckets.iter().filter(|b| b.choice == k).collect();
        let mut instead: Vec<&str> = chosen
            .iter()
            .filter_map(|b| b.fallback.map(|f| f.id()))
            .collect();
        instead.dedup();
        let verdict = match (chosen.first(), chosen.last()) {
            (Some(a), Some(z)) => format!(
                "chosen at {}; engines without artune's kernels run {} there",
                fmt_span(a.bytes, z.bytes),
                if instead.is_empty() {
                    "their own choice".to_string()
                } else {
                    instead.join(" then ")
                }
            ),
            // Another island schedule ahead of it there is the reason, before any band.
            _ if rival(&fastest, k).is_some() => format!(
                "not chosen: {} is faster at those sizes",
                rival(&fastest, k).map_or("", |r| r.id())
            ),
            _ if fastest.iter().any(|(b, _)| b.results[&k].model.is_some()) => {
                "not chosen: within the model's error (see not sure)".into()
            }
            _ => "not chosen: not significantly faster than the choice".into(),
        };
        let _ = writeln!(
            out,
            "  {k}: faster than every flat backend at {} of the sizes {}–{}, up to {best:.2}x; {verdict}",
            fastest.len(),
            fmt_bytes(first.0.bytes),
            fmt_bytes(last.0.bytes),
        );
    }
}

/// The island schedule other than `k` faster than it at most of `sizes`, if one is.
fn rival(sizes: &[(&Bucket, f64)], k: Backend) -> Option<Backend> {
    Backend::ALL
        .into_iter()
        .filter(|r| r.is_hierarchical() && *r != k)
        .find(|r| {
            let ahead = sizes
                .iter()
                .filter(|(b, _)| match (b.results.get(r), b.results.get(&k)) {
                    (Some(x), Some(y)) => x.median_us < y.median_us,
                    _ => false,
                })
                .count();
            2 * ahead > sizes.len()
        })
}

/// "pull" or "push", for a phase's direction.
fn plane_word(d: Direction) -> &'static str {
    match d {
        Direction::Read => "pull",
        Direction::Write => "push",
    }
}

/// Group notes said once: those every group has, and waivers of one set of backends that
/// several groups have for reasons differing only in which GPUs they name (on a large machine
/// the LL128 waiver was printed once per group, 40 times).
pub(super) struct SharedNotes {
    pub every: Vec<String>,
    pub several: Vec<String>,
    /// Every note said once above, to leave out of the groups.
    pub hoisted: Vec<String>,
}

pub(super) fn shared_notes(notes: &[Vec<String>]) -> SharedNotes {
    let every: Vec<String> = match notes.split_first() {
        Some((first, rest)) if !rest.is_empty() => first
            .iter()
            .filter(|l| rest.iter().all(|n| n.contains(l)))
            .cloned()
            .collect(),
        _ => Vec::new(),
    };
    let mut hoisted = every.clone();
    // "waived A, B: why" by the backends waived: (backends, the notes, groups having one).
    let mut by_backends: Vec<(&str, Vec<&String>, usize)> = Vec::new();
    for n in notes {
        for l in n
            .iter()
            .filter(|l| l.starts_with("waived ") && !every.contains(l))
        {
            let key = l.split(':').next().unwrap_or(l);
            match by_backends.iter_mut().find(|(k, ..)| *k == key) {
                Some((_, ls, groups)) => {
                    ls.push(l);
                    *groups += 1;
                }
                None => by_backends.push((key, vec![l], 1)),
            }
        }
    }
    let (mut every, mut several) = (every, Vec::new());
    for (key, ls, groups) in by_backends.into_iter().filter(|(.., g)| *g > 1) {
        let why = ls[0].split_once(": ").map_or("", |(_, w)| w);
        let alike = match ls.iter().collect::<std::collections::BTreeSet<_>>().len() {
            1 => "",
            _ => ", and alike for each group's own GPUs",
        };
        match groups == notes.len() {
            true => every.push(format!("{key}: {why}{alike}")),
            false => several.push(format!(
                "{key} in {groups} of {} groups: {why}{alike}",
                notes.len()
            )),
        }
        hoisted.extend(ls.into_iter().cloned());
    }
    SharedNotes {
        every,
        several,
        hoisted,
    }
}

/// One group's table of choices and what qualifies them (crossovers, the model's error, the
/// regret, what the memory budget excluded).
/// What the text says of a group below its table (model error, not sure, islands, regret),
/// one line each, for `show --json`: the same sentences, so the two never disagree.
pub(super) fn group_said(g: &GroupProfile) -> Vec<String> {
    let mut s = String::new();
    model_lines(g, &mut s);
    island_lines(g, &mut s);
    if let Some(l) = regret_line(g) {
        let _ = writeln!(s, "  {l}");
    }
    s.lines().map(|l| l.trim().to_string()).collect()
}

pub(super) fn group_section(g: &GroupProfile, out: &mut String) {
    let _ = writeln!(
        out,
        "\nTP{} {} — GPUs {} ({}), {}",
        g.tp,
        g.mode.id(),
        fmt_gpus(&g.gpus),
        g.placement,
        g.dtype.id()
    );
    let mut rows =
        vec![["sizes", "backend", "vs nccl", "extra mem/GPU", "notes"].map(String::from)];
    for r in ranges(g) {
        let sizes = fmt_span(r.from_bytes, r.to_bytes);
        let vs = match (r.backend, r.speedup_vs_nccl) {
            (Backend::Nccl, _) => "-".to_string(),
            (_, Some(s)) => fmt_speedup(s),
            (_, None) => "nccl not measured".into(),
        };
        let mem = fmt_mem(r.extra_bytes_per_gpu);
        let note = r
            .custom_slowdown
            .map(|(c, lo, hi)| forcing_note(c, lo, hi))
            .unwrap_or_default();
        rows.push([sizes, r.backend.id().to_string(), vs, mem, note]);
    }
    table(out, &rows);
    if !g.crossovers.is_empty() {
        let xs: Vec<String> = g.crossovers.iter().map(|c| g.crossover_words(c)).collect();
        let _ = writeln!(out, "  crossovers: {}", xs.join("; "));
    }
    model_lines(g, out);
    island_lines(g, out);
    if let Some(l) = regret_line(g) {
        let _ = writeln!(out, "  {l}");
    }
    let excluded: Vec<String> = over_budget(g)
        .iter()
        .map(|o| {
            let gain = match o.best_speedup {
                Some(x) if x > 1.0 => format!("would have been up to {x:.2}x faster"),
                _ => "no faster than the choice".into(),
            };
            format!(
                "{} at {} ({gain})",
                o.backend,
                fmt_span(o.from_bytes, o.to_bytes)
            )
        })
        .collect();
    if !excluded.is_empty() {
        let _ = writeln!(
            out,
            "  over the memory budget, excluded: {}",
            excluded.join("; ")
        );
    }
}

/// What the choices give away against the fastest backend at each size. On a simulated
/// profile the medians are the model's, which can be wrong by more than a kernel's apparent
/// lead (the not sure line): the headline is the regret beyond the model's error, with the
/// medians' figure beside it, so a 186% "worst regret" within the model's error does not read
/// as a broken tuner.
fn regret_line(g: &GroupProfile) -> Option<String> {
    let r = g.regret?;
    if r.worst <= 0.0 {
        return Some("regret: none, the choice is the fastest measured at every size".into());
    }
    let medians = format!(
        "{:.1}% summed, worst {:.1}% at {}",
        r.summed * 100.0,
        r.worst * 100.0,
        fmt_bytes(r.worst_bytes)
    );
    let modelled = g
        .buckets
        .iter()
        .any(|b| b.results.values().any(|t| t.model.is_some()));
    if !modelled {
        return Some(format!(
            "regret against the fastest measured at each size: {medians}"
        ));
    }
    // Per size: how much longer the choice takes than the fastest, beyond both intervals
    // widened by the model's error (decide::beyond), against the fastest's median.
    let (mut beyond, mut best, mut worst) = (0.0, 0.0, (0.0f64, 0u64));
    for b in &g.buckets {
        let Some(chosen) = b.results.get(&b.choice) else {
            continue;
        };
        let fastest = b
            .results
            .values()
            .min_by(|x, y| x.median_us.total_cmp(&y.median_us))
            .unwrap_or(chosen);
        let over = crate::decide::beyond(fastest, chosen);
        beyond += over;
        best += fastest.median_us;
        if over / fastest.median_us > worst.0 {
            worst = (over / fastest.median_us, b.bytes);
        }
    }
    Some(match worst.0 > 0.0 {
        true => format!(
            "regret beyond the model's error: {:.1}% summed, worst {:.1}% at {} (against the modelled medians: {medians})",
            beyond / best * 100.0,
            worst.0 * 100.0,
            fmt_bytes(worst.1)
        ),
        false => format!(
            "regret beyond the model's error: none (against the modelled medians: {medians}, all within the model's error)"
        ),
    })
}

/// Why `file`'s group `g` answers nothing for `bytes` (`why`), and what would: the size it
/// lies beyond, and the tune that measures it. One sentence for `select`, `why` and the
/// package's `explain`.
pub fn outside(file: &str, g: &GroupProfile, bytes: u64, why: UnknownReason) -> String {
    let (side, at, note, hint) = match why {
        UnknownReason::BelowSmallestBucket => (
            "below the smallest",
            g.buckets.first(),
            ", above the 4 KiB where times stop depending on size",
            "tune from 1K for an answer",
        ),
        _ => (
            "above the largest",
            g.buckets.last(),
            "",
            "tune larger sizes for an answer",
        ),
    };
    format!(
        "{} is {side} size {file} measured for {} ({}{note}); {hint}",
        crate::units::fmt_size(bytes),
        group_label(g),
        crate::units::fmt_size(at.map_or(0, |b| b.bytes))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiver_several_groups_share_is_said_once() {
        let n = |g: &str| {
            vec![
                format!("waived a, b: no LL128 ({g})"),
                "NCCL communicator: 1M".to_string(),
            ]
        };
        let notes = vec![n("0-1"), n("2-3"), vec!["NCCL communicator: 1M".into()]];
        let s = shared_notes(&notes);
        assert_eq!(s.every, ["NCCL communicator: 1M"]);
        assert_eq!(
            s.several,
            ["waived a, b in 2 of 3 groups: no LL128 (0-1), and alike for each group's own GPUs"]
        );
        assert!(s.hoisted.contains(&notes[1][0]));
    }

    #[test]
    fn not_sure_names_its_sizes_the_kernels_and_the_tune_that_settles_it() {
        let mut g = crate::profile::tests::fixture().groups[0].clone();
        // Simulated times: each with a band of a factor of two either way.
        for t in g.buckets.iter_mut().flat_map(|b| b.results.iter_mut()) {
            t.1.model = Some(crate::profile::ModelBand {
                low: 0.5,
                high: 2.0,
                assumed: false,
                family: Some(crate::profile::ModelFamily::of(*t.0)),
            });
        }
        let kernel_faster = |b: &mut Bucket, us: f64| {
            b.choice = Backend::Nccl;
            let t = b.results.get_mut(&Backend::OneStagePull).unwrap();
            (t.median_us, t.ci_low_us, t.ci_high_us) = (us, us * 0.99, us * 1.01);
        };
        // 4K and 8K open (the kernel modelled faster than NCCL's 20 µs), 16K not.
        kernel_faster(&mut g.buckets[0], 15.0);
        kernel_faster(&mut g.buckets[1], 12.0);
        let line = not_sure(&g).unwrap();
        assert_eq!(
            line,
            "not sure at 4K–8K: one_stage_pull modelled faster than nccl, but within the model's error; `artune tune --tp 2 --mode graph --sizes 4K:8K --out settle.json` on the machine settles it"
        );
        // Spans apart are named apart, and the tune covers both.
        kernel_faster(&mut g.buckets[1], 25.0);
        kernel_faster(&mut g.buckets[2], 10.0);
        let line = not_sure(&g).unwrap();
        assert!(line.starts_with("not sure at 4K, 16K:"), "{line}");
        assert!(line.contains("--sizes 4K:16K"), "{line}");
        // Another dtype is named, so the tune times what this group reduces.
        g.dtype = crate::allreduce::Dtype::Fp32;
        assert!(not_sure(&g)
            .unwrap()
            .contains("--mode graph --dtype fp32 --sizes"));
        g.dtype = crate::allreduce::Dtype::Bf16;
        kernel_faster(&mut g.buckets[0], 25.0);
        kernel_faster(&mut g.buckets[2], 25.0);
        assert_eq!(not_sure(&g), None);
    }
}

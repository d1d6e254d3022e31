//! Everything artune prints about a profile: the text summary, its JSON form, and SVG plots.
//! Pure functions of a [`Profile`], so `tune` and `show` print the same thing.

mod environment;
mod plot;

use std::fmt::Write;

use serde::Serialize;

use crate::allreduce::{Backend, Direction};
use crate::profile::{Bucket, GroupProfile, Profile, Sampling};
use crate::units::fmt_bytes;

pub use plot::{check_plot_dir, plots};

/// A run of neighbouring sizes with the same choice.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Range {
    pub from_bytes: u64,
    pub to_bytes: u64,
    pub backend: Backend,
    /// NCCL's time divided by the choice's, lowest and highest over the range (> 1 = faster).
    pub speedup_vs_nccl: Option<(f64, f64)>,
    /// The better one-stage kernel's time divided by the choice's, over the range, when the
    /// choice is not one-stage: how much slower forcing a one-stage allreduce would be.
    pub custom_slowdown: Option<(Backend, f64, f64)>,
    /// Extra memory per GPU the choice costs (custom buffers sized to the range's top).
    pub extra_bytes_per_gpu: u64,
}

fn ratio_range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}

fn median(b: &Bucket, be: Backend) -> Option<f64> {
    b.results.get(&be).map(|t| t.median_us)
}

/// Collapses a group's buckets into ranges of equal choice.
pub fn ranges(g: &GroupProfile) -> Vec<Range> {
    let mut out: Vec<Range> = Vec::new();
    let mut start = 0;
    for i in 0..g.buckets.len() {
        let last = i + 1 == g.buckets.len() || g.buckets[i + 1].choice != g.buckets[i].choice;
        if !last {
            continue;
        }
        let run = &g.buckets[start..=i];
        let backend = run[0].choice;
        let speedup = ratio_range(
            run.iter()
                .filter_map(|b| Some(median(b, Backend::Nccl)? / median(b, backend)?)),
        );
        // What forcing a one-stage kernel (what engines force on PCIe) would cost here.
        let custom_slowdown = if matches!(backend, Backend::OneStagePull | Backend::OneStagePush) {
            None
        } else {
            [Backend::OneStagePull, Backend::OneStagePush]
                .into_iter()
                .filter_map(|c| {
                    let r = ratio_range(
                        run.iter()
                            .filter_map(|b| Some(median(b, c)? / median(b, backend)?)),
                    )?;
                    Some((c, r.0, r.1))
                })
                .min_by(|a, b| (a.1 + a.2).total_cmp(&(b.1 + b.2)))
        };
        let extra = crate::decide::extra_memory(backend, g.ranks(), run[run.len() - 1].bytes);
        out.push(Range {
            from_bytes: run[0].bytes,
            to_bytes: run[run.len() - 1].bytes,
            backend,
            speedup_vs_nccl: speedup,
            custom_slowdown,
            extra_bytes_per_gpu: extra,
        });
        start = i + 1;
    }
    out
}

fn fmt_ratio((lo, hi): (f64, f64)) -> String {
    if (hi - lo) / lo.max(1e-9) < 0.05 {
        format!("{lo:.2}x")
    } else {
        format!("{lo:.2}–{hi:.2}x")
    }
}

/// What forcing one-stage kernel `c` over a range would cost, from its time over the choice's
/// (lowest, highest). Where it was sometimes a little faster (below the decision's threshold,
/// or not worth its memory), say by how much rather than printing "0.96x slower".
fn forcing_note(c: Backend, lo: f64, hi: f64) -> String {
    // Within half a percent of the choice is a tie, not "at best 1.00x faster".
    if hi < 1.005 {
        String::new()
    } else if lo >= 0.995 {
        let lo = lo.max(1.0);
        if (hi - lo) / lo < 0.05 {
            format!("forcing {c}: {hi:.2}x slower")
        } else {
            format!("forcing {c}: {lo:.2}–{hi:.2}x slower")
        }
    } else {
        format!(
            "forcing {c}: up to {hi:.2}x slower, at best {:.2}x faster",
            1.0 / lo
        )
    }
}

/// GPU ids as "0-3" when contiguous and more than two, else "0,1" or "3,4".
pub fn fmt_gpus(gpus: &[usize]) -> String {
    let contiguous = gpus.windows(2).all(|w| w[1] == w[0] + 1);
    if contiguous && gpus.len() > 2 {
        format!("{}-{}", gpus[0], gpus[gpus.len() - 1])
    } else {
        gpus.iter()
            .map(|g| g.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// A backend the memory budget excluded over a run of sizes, and what it gave up.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OverBudget {
    pub backend: Backend,
    pub from_bytes: u64,
    pub to_bytes: u64,
    /// The profile's choice's time over the excluded backend's, highest over the sizes
    /// (> 1: the excluded kernel would have been faster).
    pub best_speedup: Option<f64>,
}

/// What the memory budget excluded at one bucket: each backend, its time against the
/// bucket's choice (choice over it; > 1 means it was faster), and the reason recorded.
/// The one reading of `Bucket::waived` for `show` and `why`.
pub fn budget_exclusions(b: &Bucket) -> Vec<(Backend, Option<f64>, &str)> {
    b.waived
        .iter()
        .map(|(k, why)| {
            let r = median(b, b.choice).zip(median(b, *k)).map(|(c, x)| c / x);
            (*k, r, why.as_str())
        })
        .collect()
}

/// Per backend, the sizes the memory budget excluded it from (first to last), and the most
/// it would have gained there.
pub fn over_budget(g: &GroupProfile) -> Vec<OverBudget> {
    let mut out: Vec<OverBudget> = Vec::new();
    for b in &g.buckets {
        for (k, r, _) in budget_exclusions(b) {
            match out.iter_mut().find(|o| o.backend == k) {
                Some(o) => {
                    o.to_bytes = b.bytes;
                    o.best_speedup = match (o.best_speedup, r) {
                        (Some(x), Some(y)) => Some(x.max(y)),
                        (x, y) => x.or(y),
                    };
                }
                None => out.push(OverBudget {
                    backend: k,
                    from_bytes: b.bytes,
                    to_bytes: b.bytes,
                    best_speedup: r,
                }),
            }
        }
    }
    out
}

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

/// How the cells were sampled, in words.
fn sampling(s: &crate::profile::Settings) -> String {
    let how = match s.sampling {
        Sampling::Fast => {
            "powers of two refined where the winner changes, clearly slower backends stop early"
        }
        Sampling::Exhaustive => {
            "the reference: every size refinement could reach, every backend sampled to its target"
        }
    };
    if s.target_ci > 0.0 {
        format!(
            "{} (±{}% interval target; {how})",
            s.sampling.id(),
            s.target_ci * 100.0
        )
    } else {
        format!("{} ({how})", s.sampling.id())
    }
}

/// The header lines: what measured it, when, for which machine.
fn header(p: &Profile, out: &mut String) {
    if p.simulated {
        let _ = writeln!(
            out,
            "SIMULATED profile — {} (a model of the machine, not a measurement)",
            p.fabric
        );
    } else {
        let _ = writeln!(out, "Measured profile — {}", p.fabric);
    }
    let v = &p.versions;
    let opt = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".into());
    let _ = writeln!(
        out,
        "created {}  artune {}  driver {}  CUDA {}  NCCL {}",
        p.created,
        p.tool_version,
        opt(&v.driver),
        opt(&v.cuda),
        opt(&v.nccl)
    );
    let _ = writeln!(
        out,
        "fingerprint: topology class {}  host {}",
        p.fingerprint.topology_class, p.fingerprint.host
    );
    for a in &p.assumed {
        let _ = writeln!(out, "assumed (the topology does not state it): {a}");
    }
    environment::lines(p, out);
    let _ = writeln!(out, "sampling: {}", sampling(&p.settings));
    if p.settings.tuning_seconds > 0.0 {
        let _ = writeln!(out, "tuning took {:.2} s", p.settings.tuning_seconds);
    }
    if let Some(ph) = &p.settings.phases {
        let sum = |f: fn(&crate::profile::GroupPhases) -> f64| ph.groups.iter().map(f).sum::<f64>();
        let _ = writeln!(
            out,
            "  where it went: {}start-up {:.2} s, set-up {:.2} s, probes {:.2} s, verification {:.2} s, timing {:.2} s (graph capture included) over {} GPU groups",
            if ph.checks_s > 0.0 {
                format!("busy check {:.2} s, ", ph.checks_s)
            } else {
                String::new()
            },
            ph.startup_s,
            sum(|g| g.setup_s),
            sum(|g| g.probes_s),
            sum(|g| g.verify_s),
            sum(|g| g.timing_s),
            ph.groups.len()
        );
    }
}

/// Lines about a group that are not its table: waivers (one line per reason) and NCCL's
/// memory. Lines every group shares are printed once per profile.
fn group_notes(g: &GroupProfile) -> Vec<String> {
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
            fmt_bytes(m.bytes_per_gpu),
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

/// Widths of the per-group table's columns (sizes, backend, vs nccl, extra memory): the
/// header and the rows share them so the titles sit over their values.
const COLUMNS: [usize; 4] = [15, 17, 18, 13];

fn table_row(out: &mut String, cells: [&str; 5]) {
    let [w0, w1, w2, w3] = COLUMNS;
    let line = format!(
        "  {:<w0$} {:<w1$} {:<w2$} {:<w3$} {}",
        cells[0], cells[1], cells[2], cells[3], cells[4]
    );
    let _ = writeln!(out, "{}", line.trim_end());
}

/// Why a backend faster than the choice at a size was not chosen there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PassedOver {
    /// Its buffers for that size exceed the memory budget.
    OverBudget,
    /// Its lead lies within the model's error (a simulated profile): not sure; a
    /// measurement on the machine decides.
    WithinModel,
    /// Not significantly faster by the rule (the intervals overlap, or by under 5%), or kept
    /// in its neighbours' band.
    NotSignificant,
}

impl PassedOver {
    pub fn why(self) -> &'static str {
        match self {
            PassedOver::OverBudget => "over the memory budget",
            PassedOver::WithinModel => "not sure: within the model's error",
            PassedOver::NotSignificant => "not significantly faster, or kept in the band",
        }
    }
}

/// Per size, each backend whose median beats the choice's by more than the rule's effect
/// ([`crate::decide::MIN_EFFECT`]), and why it was not chosen: what a plot or a table must say
/// wherever it shows a backend faster than the choice.
pub fn passed_over(g: &GroupProfile) -> Vec<(u64, Backend, PassedOver)> {
    let mut out = Vec::new();
    for b in &g.buckets {
        let Some(chosen) = b.results.get(&b.choice) else {
            continue;
        };
        for (k, t) in &b.results {
            if *k == b.choice || t.median_us * (1.0 + crate::decide::MIN_EFFECT) >= chosen.median_us
            {
                continue;
            }
            let why = if b.waived.contains_key(k) {
                PassedOver::OverBudget
            } else if t.model.is_some() && crate::decide::beyond(t, chosen) <= 0.0 {
                PassedOver::WithinModel
            } else {
                PassedOver::NotSignificant
            };
            out.push((b.bytes, *k, why));
        }
    }
    out
}

/// Simulated groups: the model's error band per backend kind, and the sizes where a custom
/// kernel is modelled faster than the choice but not beyond what the model could be wrong by.
fn model_lines(g: &GroupProfile, out: &mut String) {
    let span = |custom: bool| {
        let ms = g.buckets.iter().flat_map(|b| b.results.iter());
        let ms = ms
            .filter(|(k, _)| k.is_custom() == custom)
            .filter_map(|(_, t)| t.model);
        ms.fold(None, |a: Option<(f64, f64)>, m| {
            Some(a.map_or((m.low, m.high), |(l, h)| (l.min(m.low), h.max(m.high))))
        })
    };
    let (Some(n), c) = (span(false), span(true)) else {
        return;
    };
    let c = c.map_or(String::new(), |(l, h)| {
        format!(", custom kernels x{l:.2}-x{h:.2}")
    });
    let _ = writeln!(
        out,
        "  model error (simulated; docs/MODEL-ERROR.md): NCCL x{:.2}-x{:.2}{c}; a choice of custom is sure beyond it",
        n.0, n.1
    );
    if let Some(line) = not_sure(g) {
        let _ = writeln!(out, "  {line}");
    }
}

/// Where a custom kernel is modelled faster than the choice but within the model's error: the
/// sizes, in spans of neighbouring sizes, the kernels and the choices they were measured
/// against, and the measurement that settles it (a tune on the machine, which has no model
/// error).
fn not_sure(g: &GroupProfile) -> Option<String> {
    let passed = passed_over(g);
    // The fastest custom kernel passed over at `b` for lying within the model's error.
    let faster = |b: &Bucket| -> Option<Backend> {
        passed
            .iter()
            .filter(|(bytes, k, why)| {
                *bytes == b.bytes && k.is_custom() && *why == PassedOver::WithinModel
            })
            .map(|(_, k, _)| *k)
            .min_by(|x, y| b.results[x].median_us.total_cmp(&b.results[y].median_us))
    };
    let mut spans: Vec<(u64, u64)> = Vec::new();
    let (mut kernels, mut choices) = (Vec::new(), Vec::new());
    let mut open = false;
    for b in &g.buckets {
        match faster(b).filter(|_| !b.choice.is_custom()) {
            Some(k) => {
                match spans.last_mut() {
                    Some(last) if open => last.1 = b.bytes,
                    _ => spans.push((b.bytes, b.bytes)),
                }
                open = true;
                for (list, x) in [(&mut kernels, k), (&mut choices, b.choice)] {
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
    Some(format!(
        "not sure at {}: {} modelled faster than {}, but within the model's error; `artune tune --tp {} --sizes {}:{}` on the machine settles it",
        sizes.join(", "),
        names(&kernels),
        names(&choices),
        g.tp,
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
                let _ = writeln!(out, "  {k}: never the fastest measured here");
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
            _ if fastest.iter().any(|(b, _)| b.results[&k].model.is_some()) => {
                "not chosen: within the model's error (see not sure)".into()
            }
            _ => "not chosen: not significantly faster than the choice".into(),
        };
        let _ = writeln!(
            out,
            "  {k}: the fastest measured at {} of the sizes {}–{}, up to {best:.2}x faster than every flat backend; {verdict}",
            fastest.len(),
            fmt_bytes(first.0.bytes),
            fmt_bytes(last.0.bytes),
        );
    }
}

/// "pull" or "push", for a phase's direction.
fn plane_word(d: Direction) -> &'static str {
    match d {
        Direction::Read => "pull",
        Direction::Write => "push",
    }
}

/// The text summary printed by `tune` and `show`.
pub fn summary(p: &Profile) -> String {
    let mut out = String::new();
    header(p, &mut out);
    if let Some(b) = p.settings.mem_budget_bytes {
        let _ = writeln!(
            out,
            "memory budget: {} per GPU for custom kernels' buffers (kernels over it are excluded at those sizes, listed per group)",
            fmt_bytes(b)
        );
    }
    let notes: Vec<Vec<String>> = p.groups.iter().map(group_notes).collect();
    let shared = shared_notes(&notes);
    for (title, lines) in [
        ("every group:", &shared.every),
        ("several groups:", &shared.several),
    ] {
        if !lines.is_empty() {
            let _ = writeln!(out, "{title}");
            for l in lines {
                let _ = writeln!(out, "  {l}");
            }
        }
    }
    for (g, notes) in p.groups.iter().zip(&notes) {
        group_section(g, &mut out);
        for l in notes.iter().filter(|l| !shared.hoisted.contains(l)) {
            let _ = writeln!(out, "  {l}");
        }
    }
    contention_and_faults(p, &mut out);
    out
}

/// Group notes said once: those every group has, and waivers of one set of backends that
/// several groups have for reasons differing only in which GPUs they name (on a large machine
/// the LL128 waiver was printed once per group, 40 times).
struct SharedNotes {
    every: Vec<String>,
    several: Vec<String>,
    /// Every note said once above, to leave out of the groups.
    hoisted: Vec<String>,
}

fn shared_notes(notes: &[Vec<String>]) -> SharedNotes {
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
fn group_section(g: &GroupProfile, out: &mut String) {
    let _ = writeln!(
        out,
        "\nTP{} {} — GPUs {} ({}), {}",
        g.tp,
        g.mode.id(),
        fmt_gpus(&g.gpus),
        g.placement,
        g.dtype.id()
    );
    table_row(
        out,
        ["sizes", "backend", "vs nccl", "extra mem/GPU", "notes"],
    );
    for r in ranges(g) {
        let sizes = fmt_span(r.from_bytes, r.to_bytes);
        let vs = match (r.backend, r.speedup_vs_nccl) {
            (Backend::Nccl, _) => "-".to_string(),
            (_, Some(s)) => format!("{} faster", fmt_ratio(s)),
            (_, None) => "nccl not measured".into(),
        };
        let mem = if r.extra_bytes_per_gpu > 0 {
            fmt_bytes(r.extra_bytes_per_gpu)
        } else {
            "0".into()
        };
        let note = r
            .custom_slowdown
            .map(|(c, lo, hi)| forcing_note(c, lo, hi))
            .unwrap_or_default();
        table_row(out, [&sizes, r.backend.id(), &vs, &mem, &note]);
    }
    if !g.crossovers.is_empty() {
        let xs: Vec<String> = g
            .crossovers
            .iter()
            .map(|c| format!("{} → {} at {}", c.from, c.to, fmt_bytes(c.bytes)))
            .collect();
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

/// The contention curves, the recoveries and the faults, after the groups.
fn contention_and_faults(p: &Profile, out: &mut String) {
    for c in &p.contention {
        let dir = match c.direction {
            Direction::Read => "read (pull)",
            Direction::Write => "write (push)",
        };
        let pts: Vec<String> = c
            .points
            .iter()
            .map(|s| format!("{}:{:.1}/{:.0}", s.peers, s.per_gpu_gbps, s.aggregate_gbps))
            .collect();
        let _ = writeln!(
            out,
            "\ncontention GPUs {} {dir}, peers:GB/s per GPU/aggregate  {}",
            fmt_gpus(&c.gpus),
            pts.join("  ")
        );
    }
    for r in &p.recovered {
        let at = r
            .bytes
            .map_or(String::new(), |b| format!(" at {}", fmt_bytes(b)));
        let what = r
            .backend
            .map_or(String::new(), |b| format!(" while timing {b}{at}"));
        let _ = writeln!(
            out,
            "RECOVERED on GPUs {}{what}: {}; its workers were replaced and the group measured again{}",
            fmt_gpus(&r.group),
            r.cause,
            match (r.backend, r.kept) {
                (Some(b), true) => format!(" with {b}, which was timed again on the fresh workers"),
                (Some(b), false) => format!(" without {b}, which failed again"),
                (None, _) => String::new(),
            },
        );
    }
    if !p.faults.is_empty() {
        let _ = writeln!(out, "\nfaults:");
        for f in &p.faults {
            let _ = writeln!(out, "  {f}");
        }
    }
}

/// What `tune` says after writing a profile (on stderr, with its other status lines): where
/// it went and the commands to run next, filled in with this profile's path, a group and a
/// size it measured, so each runs as printed (tests/suggestions.rs runs them). A simulated
/// profile gets the NCCL export: the engine exports refuse it.
pub fn next_steps(path: &std::path::Path, p: &Profile) -> String {
    let written = path.display();
    let path = crate::shell::quote(&written.to_string());
    let mut lines: Vec<(String, &str)> =
        vec![(format!("artune show {path}"), "this summary again")];
    let graph = p
        .groups
        .iter()
        .find(|g| g.mode == crate::allreduce::Mode::Graph);
    if let Some(g) = graph.or(p.groups.first()) {
        // A measured size near 1M, so the answer is a measurement, not an interpolation.
        let bytes = g
            .buckets
            .iter()
            .map(|b| b.bytes)
            .filter(|b| b.is_power_of_two())
            .min_by_key(|b| b.abs_diff(1 << 20));
        if let Some(bytes) = bytes {
            let gpus: Vec<String> = g.gpus.iter().map(|x| x.to_string()).collect();
            let mode = match g.mode {
                crate::allreduce::Mode::Graph => String::new(),
                m => format!(" --mode {}", m.id()),
            };
            lines.push((
                format!(
                    "artune why {path} --tp {} --gpus {} --bytes {}{mode}",
                    g.tp,
                    gpus.join(","),
                    fmt_bytes(bytes)
                ),
                "one answer explained",
            ));
        }
    }
    if p.simulated {
        lines.push((
            format!("artune export {path} --engine nccl"),
            "NCCL's settings; engine exports need a measured profile",
        ));
    } else {
        lines.push((
            format!("artune export {path} --engine vllm"),
            "what vLLM needs (also sglang, nccl, env; trtllm with --hidden N)",
        ));
        lines.push((
            format!("artune check {path}"),
            "later: does it still hold for this machine",
        ));
    }
    let width = lines.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
    let mut s = format!("profile written to {written}\nnext:\n");
    for (c, why) in lines {
        let _ = writeln!(s, "  {c:<width$}   # {why}");
    }
    s
}

/// The summary as JSON, for scripts.
pub fn summary_json(p: &Profile) -> serde_json::Value {
    let groups: Vec<serde_json::Value> = p
        .groups
        .iter()
        .map(|g| {
            serde_json::json!({
                "tp": g.tp, "mode": g.mode, "gpus": g.gpus, "placement": g.placement,
                "ranges": ranges(g), "crossovers": g.crossovers, "waived": g.waived,
                "regret": g.regret, "over_budget": over_budget(g), "beside": g.beside,
            })
        })
        .collect();
    serde_json::json!({
        "simulated": p.simulated, "fabric": p.fabric, "created": p.created,
        "fingerprint": p.fingerprint, "versions": p.versions,
        "sampling": p.settings.sampling, "target_ci": p.settings.target_ci,
        "tuning_seconds": p.settings.tuning_seconds, "phases": p.settings.phases,
        "mem_budget_bytes": p.settings.mem_budget_bytes,
        "assumed": p.assumed, "groups": groups, "faults": p.faults, "recovered": p.recovered,
        "environment": p.environment, "mem_budget_bytes": p.settings.mem_budget_bytes,
    })
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
    fn summary_labels_simulation_and_ranges() {
        let p = crate::profile::tests::fixture();
        let s = summary(&p);
        assert!(s.starts_with("SIMULATED profile"), "{s}");
        assert!(s.contains("4K–8K"), "{s}");
        assert!(s.contains("one_stage_pull"), "{s}");
        assert!(s.contains("2.50x faster"), "{s}");
        // Above the crossover NCCL is chosen and the cost of forcing the custom kernel shows.
        assert!(s.contains("forcing one_stage_pull: 1.5"), "{s}");
        assert!(s.contains("one_stage_pull → nccl at 16K"), "{s}");
        assert!(!s.contains("assumed"), "{s}");
        assert!(s.contains("sampling: fast (powers of two"), "{s}");
        let mut p = p.clone();
        p.settings.target_ci = 0.02;
        let s = summary(&p);
        assert!(s.contains("sampling: fast (±2% interval target;"), "{s}");
        assert_eq!(summary_json(&p)["sampling"], "fast");
        let mut e = p.clone();
        e.settings.sampling = Sampling::Exhaustive;
        assert!(summary(&e).contains("sampling: exhaustive (±2%"));
        assert_eq!(summary_json(&e)["sampling"], "exhaustive");
    }

    #[test]
    fn summary_says_what_the_simulator_assumed_and_where_time_went() {
        let mut p = crate::profile::tests::fixture();
        p.assumed = vec!["kernel traffic through switch `sw0`: Microchip defaults".into()];
        p.settings.phases = Some(crate::profile::Phases {
            checks_s: 0.0,
            startup_s: 1.5,
            groups: vec![crate::profile::GroupPhases {
                gpus: vec![0, 1],
                setup_s: 2.0,
                probes_s: 0.5,
                verify_s: 3.0,
                timing_s: 4.0,
            }],
        });
        let s = summary(&p);
        assert!(
            s.contains(
                "assumed (the topology does not state it): kernel traffic through switch `sw0`"
            ),
            "{s}"
        );
        assert!(
            s.contains(
                "start-up 1.50 s, set-up 2.00 s, probes 0.50 s, verification 3.00 s, timing 4.00 s"
            ),
            "{s}"
        );
        let j = summary_json(&p);
        assert_eq!(j["phases"]["startup_s"], 1.5);
        assert_eq!(j["assumed"][0], p.assumed[0].as_str());
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
                family: Some(if t.0.is_custom() {
                    crate::profile::ModelFamily::Custom
                } else {
                    crate::profile::ModelFamily::Nccl
                }),
            });
        }
        let kernel_faster = |b: &mut Bucket, us: f64| {
            b.choice = Backend::Nccl;
            b.results.get_mut(&Backend::OneStagePull).unwrap().median_us = us;
        };
        // 4K and 8K open (the kernel modelled faster than NCCL's 20 µs), 16K not.
        kernel_faster(&mut g.buckets[0], 15.0);
        kernel_faster(&mut g.buckets[1], 12.0);
        let line = not_sure(&g).unwrap();
        assert_eq!(
            line,
            "not sure at 4K–8K: one_stage_pull modelled faster than nccl, but within the model's error; `artune tune --tp 2 --sizes 4K:8K` on the machine settles it"
        );
        // Spans apart are named apart, and the tune covers both.
        kernel_faster(&mut g.buckets[1], 25.0);
        kernel_faster(&mut g.buckets[2], 10.0);
        let line = not_sure(&g).unwrap();
        assert!(line.starts_with("not sure at 4K, 16K:"), "{line}");
        assert!(line.contains("--sizes 4K:16K"), "{line}");
        kernel_faster(&mut g.buckets[0], 25.0);
        kernel_faster(&mut g.buckets[2], 25.0);
        assert_eq!(not_sure(&g), None);
    }

    #[test]
    fn forcing_note_never_calls_a_faster_kernel_slower() {
        let c = Backend::OneStagePull;
        assert_eq!(
            forcing_note(c, 1.5, 1.52),
            "forcing one_stage_pull: 1.52x slower"
        );
        assert_eq!(
            forcing_note(c, 1.0, 7.1),
            "forcing one_stage_pull: 1.00–7.10x slower"
        );
        assert_eq!(
            forcing_note(c, 0.96, 22.12),
            "forcing one_stage_pull: up to 22.12x slower, at best 1.04x faster"
        );
        assert_eq!(forcing_note(c, 0.9, 0.99), "");
    }

    #[test]
    fn ranges_merge_equal_choices() {
        let p = crate::profile::tests::fixture();
        let r = ranges(&p.groups[0]);
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].from_bytes, r[0].to_bytes, r[0].backend),
            (4096, 8192, Backend::OneStagePull)
        );
        assert_eq!(r[1].backend, Backend::Nccl);
    }

    #[test]
    fn plots_are_svg_files() {
        let p = crate::profile::tests::fixture();
        let dir = tempfile::tempdir().unwrap();
        let files = plots(&p, dir.path()).unwrap();
        assert_eq!(files.len(), 1);
        let svg = std::fs::read_to_string(&files[0]).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("SIMULATED") && svg.contains("one_stage_pull")
        );
    }
}

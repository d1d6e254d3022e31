//! SVG plots: per group, time vs size per backend (log-log, choice marked, crossovers drawn)
//! above the speed-up over NCCL where the decision shows; and contention curves. Titles name
//! the fabric; a run's plots replace the previous run's in the same directory.
//!
//! A plot never shows a backend faster than the choice without saying why it was not chosen
//! (a mark per reason, by [`super::passed_over`]), draws whatever backends the group measured
//! (no list of them here), and keeps its legend in a column of its own, clear of the data.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::PassedOver;
use crate::allreduce::{Backend, Direction};
use crate::error::Error;
use crate::profile::{GroupProfile, Profile};

/// One colour per backend in table order; the island schedules get the two darkest, the
/// copy-engine backends the last two.
const COLORS: [RGBColor; Backend::COUNT] = [
    RGBColor(31, 119, 180),
    RGBColor(174, 199, 232),
    RGBColor(158, 218, 229),
    RGBColor(23, 190, 207),
    RGBColor(127, 127, 127),
    RGBColor(199, 199, 199),
    RGBColor(188, 189, 34),
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(0, 128, 96),
    RGBColor(96, 48, 144),
];

/// A backend's colour: by its place in the backend table, the palette repeating past its end
/// (NCCL's own choice is drawn in black).
fn color(b: Backend) -> RGBColor {
    if b == Backend::Nccl {
        return BLACK;
    }
    let i = Backend::ALL.iter().position(|x| *x == b).unwrap_or(0);
    COLORS[i % COLORS.len()]
}

/// The backends a group measured, in the backend table's order, NCCL's own choice last (it
/// is drawn last and thick, so it stays visible over the pinned variants that follow it).
fn drawn(g: &GroupProfile) -> Vec<Backend> {
    let mut v: Vec<Backend> = Backend::ALL
        .into_iter()
        .filter(|b| *b != Backend::Nccl)
        .filter(|b| g.buckets.iter().any(|k| k.results.contains_key(b)))
        .collect();
    if g.buckets
        .iter()
        .any(|k| k.results.contains_key(&Backend::Nccl))
    {
        v.push(Backend::Nccl);
    }
    v
}

/// Width of the plots, and of the legend column to their right.
const PLOT_WIDTH: u32 = 900;
const LEGEND_WIDTH: u32 = 330;

/// One legend entry: what its mark looks like, and its label.
enum Mark {
    Line(RGBColor, u32),
    Dot,
    /// A heading: no mark.
    Heading,
    /// A backend faster than the choice, passed over for this reason.
    Passed(PassedOver, RGBColor),
    Rule,
}

/// The marks of backends faster than the choice that were passed over, one shape per reason
/// so a reader tells them apart on the plot as in the legend: a ring for within the model's
/// error, a square for not significantly faster (or kept in the band), a cross for over the
/// memory budget. Centred on the pixel origin; an [`EmptyElement`] places them.
fn ring(c: RGBColor) -> Circle<(i32, i32), i32> {
    Circle::new((0, 0), 6, c.stroke_width(2))
}

fn square(c: RGBColor) -> Rectangle<(i32, i32)> {
    Rectangle::new([(-5, -5), (5, 5)], c.stroke_width(2))
}

fn cross(c: RGBColor) -> Cross<(i32, i32), i32> {
    Cross::new((0, 0), 6, c.stroke_width(2))
}

/// Draws the legend column: one entry per line, from the top.
fn legend(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    entries: &[(Mark, String)],
    path: &Path,
) -> Result<(), Error> {
    let font = ("sans-serif", 14).into_font();
    for (i, (mark, label)) in entries.iter().enumerate() {
        let y = 60 + 22 * i as i32;
        let r = match mark {
            Mark::Line(c, w) => {
                area.draw(&PathElement::new([(10, y), (36, y)], c.stroke_width(*w)))
            }
            Mark::Dot => area.draw(&Circle::new((23, y), 4, BLACK.filled())),
            Mark::Heading => Ok(()),
            Mark::Passed(r, c) => {
                let at = EmptyElement::at((23, y));
                match r {
                    PassedOver::WithinModel => area.draw(&(at + ring(*c))),
                    PassedOver::NotSignificant => area.draw(&(at + square(*c))),
                    PassedOver::OverBudget => area.draw(&(at + cross(*c))),
                }
            }
            Mark::Rule => area.draw(&PathElement::new(
                [(23, y - 7), (23, y + 7)],
                BLACK.mix(0.3),
            )),
        };
        r.map_err(|e| draw_err(path, e))?;
        area.draw(&Text::new(label.clone(), (44, y - 8), font.clone()))
            .map_err(|e| draw_err(path, e))?;
    }
    Ok(())
}

fn draw_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Write {
        path: path.into(),
        reason: format!("plotting failed: {e}"),
    }
}

/// Writes every plot for the profile into `dir` and returns the files written.
pub fn plots(p: &Profile, dir: &Path) -> Result<Vec<PathBuf>, Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Write {
        path: dir.into(),
        reason: e.to_string(),
    })?;
    let mut out = Vec::new();
    let tag = if p.simulated {
        format!(" — {} [SIMULATED]", p.fabric)
    } else {
        format!(" — {}", p.fabric)
    };
    let tag = tag.as_str();
    for g in &p.groups {
        let gpus: Vec<String> = g.gpus.iter().map(|x| x.to_string()).collect();
        let path = dir.join(format!(
            "tp{}-{}-gpus{}.svg",
            g.tp,
            g.mode.id(),
            gpus.join("_")
        ));
        group_plot(g, &path, tag)?;
        out.push(path);
    }
    let mut sets: Vec<&Vec<usize>> = p.contention.iter().map(|c| &c.gpus).collect();
    sets.dedup();
    for gpus in sets {
        let names: Vec<String> = gpus.iter().map(|x| x.to_string()).collect();
        let path = dir.join(format!("contention-gpus{}.svg", names.join("_")));
        contention_plot(p, gpus, &path, tag)?;
        out.push(path);
    }
    remove_stale(dir, &out)?;
    Ok(out)
}

/// Whether `name` is a plot file artune writes (so only those are ever removed).
fn is_plot_name(name: &str) -> bool {
    name.ends_with(".svg")
        && ((name.starts_with("tp") && name.contains("-gpus"))
            || name.starts_with("contention-gpus"))
}

/// Refuses, before a tune, a `--plot DIR` holding a file with a plot's name that is not an
/// SVG: the plots would replace or remove it.
pub fn check_plot_dir(dir: &Path, force: bool) -> Result<(), Error> {
    use crate::profile::paths::{check_replace, Writes};
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        if is_plot_name(&e.file_name().to_string_lossy()) {
            check_replace(&e.path(), "--plot", Writes::Plot, force)?;
        }
    }
    Ok(())
}

/// Removes plots an earlier run left in `dir` that this one did not write: a later tune into
/// the same directory must not leave another machine's plots beside its own.
fn remove_stale(dir: &Path, written: &[PathBuf]) -> Result<(), Error> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = crate::profile::paths::replaceable(&path, crate::profile::paths::Writes::Plot);
        if is_plot_name(&name) && !written.contains(&path) && ours {
            std::fs::remove_file(&path).map_err(|err| Error::Write {
                path: path.clone(),
                reason: format!("cannot remove the previous run's plot: {err}"),
            })?;
        }
    }
    Ok(())
}

/// A time on a log axis as a person reads it: 5 µs, 120 µs, 1.5 ms.
fn fmt_tick_us(us: f64) -> String {
    if us >= 1000.0 {
        format!("{} ms", trim(us / 1000.0))
    } else {
        format!("{} µs", trim(us))
    }
}

fn trim(v: f64) -> String {
    let s = if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    };
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

fn group_plot(g: &GroupProfile, path: &Path, tag: &str) -> Result<(), Error> {
    // x is log2(bytes) on a linear axis, so ticks fall on powers of two (1K, 4K, 16K, ...).
    let lx = |bytes: u64| (bytes as f64).log2();
    let xs: Vec<f64> = g.buckets.iter().map(|b| lx(b.bytes)).collect();
    let ys = g
        .buckets
        .iter()
        .flat_map(|b| b.results.values().map(|t| t.median_us));
    let (ymin, ymax) = ys.fold((f64::MAX, 0f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    if xs.is_empty() || ymax <= 0.0 {
        return Ok(());
    }
    let (xmin, xmax) = (xs[0] - 0.25, xs[xs.len() - 1].max(xs[0] + 1.0) + 0.25);
    let root = SVGBackend::new(path, (PLOT_WIDTH + LEGEND_WIDTH, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(path, e))?;
    let (plots, side) = root.split_horizontally(PLOT_WIDTH);
    let (top, bottom) = plots.split_vertically(560);
    let title = format!(
        "TP{} {} GPUs {} ({}){tag}",
        g.tp,
        g.mode.id(),
        super::fmt_gpus(&g.gpus),
        g.placement
    );
    let x_labels = ((xmax - xmin) as usize + 1).min(30);
    let fmt_x = |x: &f64| crate::units::fmt_bytes(2f64.powf(x.round()) as u64);
    let mut chart = ChartBuilder::on(&top)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(xmin..xmax, (ymin * 0.8..ymax * 1.25).log_scale())
        .map_err(|e| draw_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("time per allreduce")
        .x_labels(x_labels)
        .x_label_formatter(&fmt_x)
        .y_label_formatter(&|y| fmt_tick_us(*y))
        .draw()
        .map_err(|e| draw_err(path, e))?;
    for c in &g.crossovers {
        let x = lx(c.bytes);
        chart
            .draw_series(LineSeries::new(
                [(x, ymin * 0.8), (x, ymax * 1.25)],
                BLACK.mix(0.3).stroke_width(1),
            ))
            .map_err(|e| draw_err(path, e))?;
    }
    let backends = drawn(g);
    for &b in &backends {
        let pts: Vec<(f64, f64)> = g
            .buckets
            .iter()
            .filter_map(|k| k.results.get(&b).map(|t| (lx(k.bytes), t.median_us)))
            .collect();
        let width = if b == Backend::Nccl { 3 } else { 2 };
        chart
            .draw_series(LineSeries::new(pts, color(b).stroke_width(width)))
            .map_err(|e| draw_err(path, e))?;
    }
    // The choice at each size: a filled dot in the chosen backend's colour.
    chart
        .draw_series(g.buckets.iter().filter_map(|k| {
            let t = k.results.get(&k.choice)?;
            Some(Circle::new(
                (lx(k.bytes), t.median_us),
                4,
                color(k.choice).filled(),
            ))
        }))
        .map_err(|e| draw_err(path, e))?;
    let passed = super::passed_over(g);
    speedup_panel(g, &passed, &bottom, path, (xmin, xmax), x_labels)?;
    let mut entries: Vec<(Mark, String)> = backends
        .iter()
        .map(|&b| {
            let w = if b == Backend::Nccl { 3 } else { 2 };
            (Mark::Line(color(b), w), b.id().to_string())
        })
        .collect();
    if !g.crossovers.is_empty() {
        entries.push((Mark::Rule, "crossover: the choice changes".into()));
    }
    entries.push((Mark::Dot, "the profile's choice at each size (dot)".into()));
    let mut reasons: Vec<PassedOver> = passed.iter().map(|p| p.2).collect();
    reasons.sort();
    reasons.dedup();
    if !reasons.is_empty() {
        entries.push((
            Mark::Heading,
            "faster than the choice, not chosen (lower panel):".into(),
        ));
        for r in reasons {
            entries.push((
                Mark::Passed(r, RGBColor(96, 96, 96)),
                format!("  {}", r.why()),
            ));
        }
    }
    legend(&side, &entries, path)?;
    root.present().map_err(|e| draw_err(path, e))
}

/// Below the times: NCCL's time over each backend's (above 1 = faster than NCCL), where a
/// decision a log-log time plot hides is plain. A backend faster than the choice at a size
/// gets the mark of the reason it was not chosen there, which the legend names.
fn speedup_panel(
    g: &GroupProfile,
    passed: &[(u64, Backend, PassedOver)],
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    path: &Path,
    (xmin, xmax): (f64, f64),
    x_labels: usize,
) -> Result<(), Error> {
    let lx = |bytes: u64| (bytes as f64).log2();
    let nccl = |k: &crate::profile::Bucket| k.results.get(&Backend::Nccl).map(|t| t.median_us);
    let ratio = |k: &crate::profile::Bucket, b: Backend| {
        Some(nccl(k)? / k.results.get(&b)?.median_us).filter(|r| r.is_finite())
    };
    let rmax = g
        .buckets
        .iter()
        .flat_map(|k| k.results.keys().filter_map(move |b| ratio(k, *b)))
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(
            "speed-up over NCCL (NCCL's time / the backend's)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(xmin..xmax, 0f64..(rmax * 1.1).min(20.0))
        .map_err(|e| draw_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("x faster than NCCL")
        .x_labels(x_labels)
        .x_label_formatter(&|x| crate::units::fmt_bytes(2f64.powf(x.round()) as u64))
        .y_label_formatter(&|y| format!("{y:.1}x"))
        .draw()
        .map_err(|e| draw_err(path, e))?;
    chart
        .draw_series(LineSeries::new(
            [(xmin, 1.0), (xmax, 1.0)],
            BLACK.stroke_width(2),
        ))
        .map_err(|e| draw_err(path, e))?;
    for b in drawn(g).into_iter().filter(|b| *b != Backend::Nccl) {
        let pts: Vec<(f64, f64)> = g
            .buckets
            .iter()
            .filter_map(|k| Some((lx(k.bytes), ratio(k, b)?)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color(b).stroke_width(2)))
            .map_err(|e| draw_err(path, e))?;
    }
    let marks = |why: PassedOver| {
        passed
            .iter()
            .filter(move |p| p.2 == why)
            .filter_map(|(bytes, b, _)| {
                let k = g.buckets.iter().find(|k| k.bytes == *bytes)?;
                Some((EmptyElement::at((lx(*bytes), ratio(k, *b)?)), color(*b)))
            })
    };
    let at = |(e, c)| e + ring(c);
    chart
        .draw_series(marks(PassedOver::WithinModel).map(at))
        .map_err(|e| draw_err(path, e))?;
    chart
        .draw_series(marks(PassedOver::NotSignificant).map(|(e, c)| e + square(c)))
        .map_err(|e| draw_err(path, e))?;
    chart
        .draw_series(marks(PassedOver::OverBudget).map(|(e, c)| e + cross(c)))
        .map_err(|e| draw_err(path, e))?;
    chart
        .draw_series(g.buckets.iter().filter_map(|k| {
            let r = ratio(k, k.choice)?;
            Some(Circle::new((lx(k.bytes), r), 4, color(k.choice).filled()))
        }))
        .map_err(|e| draw_err(path, e))?;
    Ok(())
}

fn contention_plot(p: &Profile, gpus: &[usize], path: &Path, tag: &str) -> Result<(), Error> {
    let curves: Vec<_> = p.contention.iter().filter(|c| c.gpus == gpus).collect();
    let peers = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|s| s.peers))
        .max()
        .unwrap_or(1);
    let ymax = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|s| s.per_gpu_gbps))
        .fold(0f64, f64::max);
    if ymax <= 0.0 {
        return Ok(());
    }
    let root = SVGBackend::new(path, (800, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Contention, GPUs {}{tag}", super::fmt_gpus(gpus)),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.5f64..peers as f64 + 0.5, 0f64..ymax * 1.15)
        .map_err(|e| draw_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("peers each GPU transfers with at once")
        .x_labels(peers)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("GB/s per GPU")
        .draw()
        .map_err(|e| draw_err(path, e))?;
    for c in curves {
        let (label, col) = match c.direction {
            Direction::Read => ("read (pull)", RGBColor(31, 119, 180)),
            Direction::Write => ("write (push)", RGBColor(214, 39, 40)),
        };
        let pts: Vec<(f64, f64)> = c
            .points
            .iter()
            .map(|s| (s.peers as f64, s.per_gpu_gbps))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))
            .map_err(|e| draw_err(path, e))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], col.stroke_width(2)));
        chart
            .draw_series(pts.into_iter().map(|pt| Circle::new(pt, 4, col.filled())))
            .map_err(|e| draw_err(path, e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(|e| draw_err(path, e))?;
    root.present().map_err(|e| draw_err(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each reason a faster backend was passed over has a mark of its own: the legend entries
    /// of the three reasons, drawn alone and with one label, are three different drawings.
    #[test]
    fn each_reason_for_passing_a_backend_over_has_its_own_mark() {
        let draw = |r: PassedOver| {
            let mut svg = String::new();
            {
                let area = SVGBackend::with_string(&mut svg, (200, 100)).into_drawing_area();
                let entries = [(Mark::Passed(r, BLACK), "x".to_string())];
                legend(&area, &entries, Path::new("t.svg")).unwrap();
                area.present().unwrap();
            }
            svg
        };
        let marks = [
            draw(PassedOver::WithinModel),
            draw(PassedOver::NotSignificant),
            draw(PassedOver::OverBudget),
        ];
        assert_ne!(marks[0], marks[1]);
        assert_ne!(marks[1], marks[2]);
        assert_ne!(marks[0], marks[2]);
    }
}

//! SVG plots: time vs size per backend (log-log, choice marked, crossovers drawn) and
//! contention curves.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::allreduce::{Backend, Direction};
use crate::error::Error;
use crate::profile::{GroupProfile, Profile};

const COLORS: [RGBColor; 11] = [
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
];

fn color(b: Backend) -> RGBColor {
    COLORS[Backend::ALL.iter().position(|x| *x == b).unwrap_or(0)]
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
    let tag = if p.simulated { " [SIMULATED]" } else { "" };
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
    Ok(out)
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
    let root = SVGBackend::new(path, (960, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(path, e))?;
    let title = format!(
        "TP{} {} GPUs {:?} ({}){tag}",
        g.tp,
        g.mode.id(),
        g.gpus,
        g.placement
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(xmin..xmax, (ymin * 0.8..ymax * 1.25).log_scale())
        .map_err(|e| draw_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("time per allreduce (µs)")
        .x_labels(((xmax - xmin) as usize + 1).min(30))
        .x_label_formatter(&|x| crate::units::fmt_bytes(2f64.powf(x.round()) as u64))
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
    for b in Backend::ALL {
        let pts: Vec<(f64, f64)> = g
            .buckets
            .iter()
            .filter_map(|k| k.results.get(&b).map(|t| (lx(k.bytes), t.median_us)))
            .collect();
        if pts.is_empty() {
            continue;
        }
        let col = color(b);
        chart
            .draw_series(LineSeries::new(pts, col.stroke_width(2)))
            .map_err(|e| draw_err(path, e))?
            .label(b.id())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], col.stroke_width(2)));
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
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(|e| draw_err(path, e))?;
    root.present().map_err(|e| draw_err(path, e))
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
            format!("Contention, GPUs {gpus:?}{tag}"),
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

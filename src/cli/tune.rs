//! `artune tune` and `artune show`.

use super::output::{out, outln};
use std::io::IsTerminal;

use super::{ShowArgs, TuneArgs};
use std::collections::BTreeSet;

use crate::cancel::Cancel;
use crate::error::Error;
use crate::measure::Progress;
use crate::profile::{Profile, Sampling};
use crate::{report, tune, units};

/// Parses `--tp 2,4,8` against the machine's GPU count.
pub fn parse_tp(items: &[String], gpus: usize) -> Result<Vec<usize>, Error> {
    let mut out = BTreeSet::new();
    for it in items {
        let t: usize = it.trim().parse().map_err(|_| {
            Error::bad_input(format!(
                "--tp `{it}` is not a number; give TP sizes like --tp 2,4,8"
            ))
        })?;
        if t < 2 || t > gpus {
            return Err(Error::bad_input(format!(
                "--tp {t} does not fit this machine of {gpus} GPUs; choose sizes from 2 to {gpus}"
            )));
        }
        out.insert(t);
    }
    if out.is_empty() {
        return Err(Error::bad_input(
            "--tp is empty; give TP sizes like --tp 2,4,8",
        ));
    }
    Ok(out.into_iter().collect())
}

/// Parses `--islands 4,4` against the TP sizes to tune (`tps`, the default ones where empty):
/// equal islands of 2 or more GPUs, two or more of them, adding up to a tuned group's size.
pub fn parse_islands(items: &[String], tps: &[usize]) -> Result<Vec<usize>, Error> {
    let sizes = items
        .iter()
        .map(|it| {
            it.trim().parse::<usize>().map_err(|_| {
                Error::bad_input(format!(
                    "--islands `{it}` is not a number; give island sizes like --islands 4,4"
                ))
            })
        })
        .collect::<Result<Vec<usize>, Error>>()?;
    let shown = sizes
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    if sizes.len() < 2 {
        return Err(Error::bad_input(format!(
            "--islands {shown} is one island: an island schedule crosses between two or more; give sizes like --islands 4,4"
        )));
    }
    if sizes.iter().any(|&s| s < 2) {
        return Err(Error::bad_input(format!(
            "--islands {shown} has an island of fewer than 2 GPUs, with nothing to reduce inside it; give islands of 2 or more"
        )));
    }
    if sizes.windows(2).any(|w| w[0] != w[1]) {
        return Err(Error::bad_input(format!(
            "--islands {shown} are of unequal size: the island schedules need equal islands; give equal sizes such as --islands 4,4"
        )));
    }
    let sum: usize = sizes.iter().sum();
    if !tps.contains(&sum) {
        let list = tps
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Error::bad_input(format!(
            "--islands {shown} adds up to {sum} GPUs, but the groups tuned have {list}; give sizes that add up to one of them (or tune that size with --tp {sum})"
        )));
    }
    Ok(sizes)
}

/// Connects SIGINT and SIGTERM to `cancel`: the first stops the tune between measurements, a
/// second exits at once with code 130.
fn cancel_on_signals(cancel: &Cancel) {
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Registered first, so it sees the flag as it was before this signal set it.
        let _ = signal_hook::flag::register_conditional_shutdown(sig, 130, cancel.flag().clone());
        let _ = signal_hook::flag::register(sig, cancel.flag().clone());
    }
}

/// Parses `--target-ci PCT` (a percentage, `2` or `2%`) into a fraction.
pub fn parse_target_ci(text: &str) -> Result<f64, Error> {
    let pct: f64 = text
        .trim()
        .trim_end_matches('%')
        .trim()
        .parse()
        .ok()
        .filter(|p: &f64| p.is_finite())
        .ok_or_else(|| {
            Error::bad_input(format!(
                "--target-ci `{text}` is not a number; give the interval's half-width in percent, e.g. --target-ci 2"
            ))
        })?;
    if !(0.1..=20.0).contains(&pct) {
        return Err(Error::bad_input(format!(
            "--target-ci {text} is outside 0.1%..20%; give the interval's half-width in percent, e.g. --target-ci 2"
        )));
    }
    Ok(pct / 100.0)
}

/// The sampling asked for, or why the flags contradict each other.
fn sampling(a: &TuneArgs) -> Result<(Sampling, Option<f64>), Error> {
    let target = a.target_ci.as_deref().map(parse_target_ci).transpose()?;
    if a.exhaustive && target.is_some() {
        return Err(Error::bad_input(
            "--exhaustive samples every backend to the reference 2% target, so --target-ci cannot change it; drop one of them",
        ));
    }
    let s = if a.exhaustive {
        Sampling::Exhaustive
    } else {
        Sampling::Fast
    };
    Ok((s, target))
}

fn options(a: &TuneArgs, gpus: usize, cancel: Cancel) -> Result<tune::Options, Error> {
    let (min_bytes, max_bytes) = units::parse_range(&a.sizes)?;
    if max_bytes > crate::profile::LIMITS.message_bytes {
        return Err(Error::bad_input(format!(
            "--sizes {} goes above 1 TiB; choose a smaller upper bound",
            a.sizes
        )));
    }
    let tp = match &a.tp {
        Some(items) => parse_tp(items, gpus)?,
        None => Vec::new(),
    };
    let islands = match &a.islands {
        Some(items) if tp.is_empty() => Some(parse_islands(items, &crate::plan::default_tp(gpus))?),
        Some(items) => Some(parse_islands(items, &tp)?),
        None => None,
    };
    let mem_budget = a
        .mem_budget
        .as_deref()
        .map(units::parse_bytes)
        .transpose()?;
    let (sampling, target_ci) = sampling(a)?;
    let mut harness = tune::fast_harness();
    if let Some(t) = target_ci {
        harness.target_ci = t;
    }
    Ok(tune::Options {
        tp,
        sampling,
        harness,
        min_bytes,
        max_bytes,
        modes: a.mode.modes(),
        dtype: a.dtype.into(),
        mem_budget,
        seed: a.seed,
        contention: !a.no_contention,
        islands,
        cancel,
        ..Default::default()
    })
}

/// `--out` with `{host}` replaced by this node's name (the scheduler's, else the host name), so
/// one command line launched on every node writes one file per node.
fn out_path(
    out: &std::path::Path,
    node: &crate::profile::Node,
) -> Result<std::path::PathBuf, Error> {
    let text = out.to_string_lossy();
    if !text.contains("{host}") {
        return Ok(out.to_path_buf());
    }
    let name = node
        .scheduler_node
        .clone()
        .or_else(|| node.hostname.clone())
        .filter(|n| !n.contains('/') && n != "." && n != "..")
        .ok_or_else(|| {
            Error::bad_input(
                "--out names {host}, but this machine's host name is unknown or not a file name; write the file name out",
            )
        })?;
    Ok(text.replace("{host}", &name).into())
}

pub fn run(mut a: TuneArgs) -> Result<i32, Error> {
    let mut node = crate::profile::Node::here();
    node.args = std::env::args().skip(1).collect();
    a.out = out_path(&a.out, &node)?;
    // Validate everything cheap before touching hardware.
    let (min_bytes, max_bytes) = units::parse_range(&a.sizes)?;
    tune::check_sizes(min_bytes, max_bytes, a.dtype.into())
        .map_err(|e| Error::bad_input(format!("--sizes {}: {e}", a.sizes)))?;
    // A budget of 0 would exclude every custom kernel at every size: refused, not applied.
    if let Some(b) = &a.mem_budget {
        if units::parse_bytes(b)? == 0 {
            return Err(Error::bad_input(format!("--mem-budget {b} leaves no custom kernel; give a size such as 256MiB, or leave --mem-budget out to allow any")));
        }
    }
    sampling(&a)?;
    let faults = super::sim_faults(a.sim_faults.as_deref(), &a.source)?;
    crate::profile::check_writable(&a.out)?;
    if let Some(dir) = &a.plot {
        crate::profile::paths::check_output(dir, "--plot", crate::profile::paths::Expect::Dir)?;
    }
    let entered = std::time::Instant::now();
    super::compile_ahead(&a.source);
    let busy = occupancy_gate(
        &a.source,
        a.loopback,
        a.sim_occupancy.as_deref(),
        a.allow_busy,
        "tune",
    )?;
    let cancel = Cancel::new();
    cancel_on_signals(&cancel);
    let opening = std::time::Instant::now();
    let mut fabric = super::open_fabric(&a.source, a.loopback, a.seed, faults)
        .map_err(|e| beside_busy(e, &busy))?;
    let opts = tune::Options {
        checks_seconds: (opening - entered).as_secs_f64(),
        startup_seconds: opening.elapsed().as_secs_f64(),
        environment: crate::profile::environment::current(),
        allow_busy: a.allow_busy,
        busy,
        ..options(&a, fabric.topology().gpu_count(), cancel)?
    };

    let bar = std::io::stderr().is_terminal().then(|| {
        let pb = indicatif::ProgressBar::new(0);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    });
    let mut on_progress = |p: Progress| {
        if let Progress::Fault(f) = &p {
            match &bar {
                Some(pb) => pb.println(format!("warning: {f}")),
                None => eprintln!("warning: {f}"),
            }
        }
        let Some(pb) = &bar else { return };
        match p {
            Progress::Planned(n) => pb.set_length(n),
            Progress::Group { gpus, placement } => {
                pb.set_message(format!("GPUs {gpus:?} ({placement})"))
            }
            Progress::Cell { .. } => pb.inc(1),
            Progress::Fault(_) => {}
        }
    };
    let result = tune::run(fabric.as_mut(), &opts, &mut on_progress);
    if let Some(pb) = &bar {
        pb.finish_and_clear();
    }
    // Releases communicators and device memory before anything is written.
    drop(fabric);
    let mut profile = result.map_err(|e| beside_busy(e, &opts.busy))?;
    profile.node = Some(node);
    profile.write_atomic(&a.out)?;
    if let Some(dir) = &a.plot {
        let files = report::plots(&profile, dir)?;
        eprintln!("wrote {} plots to {}", files.len(), dir.display());
    }
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report::summary_json(&profile)).expect("json")
        );
    } else {
        out!("{}", report::summary(&profile));
        eprint!("\n{}", report::next_steps(&a.out, &profile));
    }
    Ok(0)
}

/// Before measuring: who else is on the GPUs the command will use (NVML on real GPUs, or the
/// testing `--sim-occupancy FILE`). Another process refuses the command (exit 2) unless
/// `allow_busy`; then it is warned about and returned for the profile.
pub fn occupancy_gate(
    source: &super::Source,
    loopback: Option<usize>,
    fake: Option<&std::path::Path>,
    allow_busy: bool,
    command: &str,
) -> Result<Vec<crate::profile::environment::BusyGpu>, Error> {
    use crate::topology::occupancy;
    let simulated = source.sim.is_some() || source.topology.is_some();
    let reading = match fake {
        Some(f) => occupancy::read_file(f)?,
        None if simulated => return Ok(Vec::new()),
        None => match occupancy::read_nvml(None, std::time::Duration::from_secs(1)) {
            Ok(mut r) => {
                let uuids: Vec<(usize, String)> = r
                    .gpus
                    .iter()
                    .filter_map(|g| Some((g.index, g.uuid.clone()?)))
                    .collect();
                let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
                if let Some(keep) =
                    occupancy::cuda_indices(visible.as_deref(), &uuids, loopback.is_some())
                {
                    r.gpus.retain(|g| keep.contains(&g.index));
                }
                r
            }
            // Opening the GPUs will say what is wrong with NVML or the driver.
            Err(e) => {
                tracing::debug!("GPU occupancy not read: {e}");
                return Ok(Vec::new());
            }
        },
    };
    match (reading.refusal(command), reading.describe()) {
        (Some(_), Some(what)) if allow_busy => {
            eprintln!("warning: measuring beside other work (--allow-busy, recorded in the profile): {what}");
            Ok(reading.busy())
        }
        (Some(why), _) => Err(Error::bad_input(why)),
        _ => Ok(Vec::new()),
    }
}

/// A hardware failure on GPUs measured with `--allow-busy` (out of memory, typically) names
/// who else held them and how much, as read before the tune.
fn beside_busy(e: Error, busy: &[crate::profile::environment::BusyGpu]) -> Error {
    match e {
        Error::Hardware(msg) if !busy.is_empty() => {
            let who: Vec<String> = busy.iter().map(ToString::to_string).collect();
            Error::Hardware(format!(
                "{msg} (with --allow-busy: before the tune, {} held the GPUs)",
                who.join("; ")
            ))
        }
        e => e,
    }
}

pub fn show(a: ShowArgs) -> Result<i32, Error> {
    let p = Profile::load(&a.profile)?;
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report::summary_json(&p)).expect("json")
        );
    } else {
        out!("{}", report::summary(&p));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::{beside_busy, parse_target_ci, parse_tp};
    use crate::error::Error;
    use crate::profile::environment::BusyGpu;

    #[test]
    fn a_hardware_failure_beside_allowed_work_names_who_held_the_gpu() {
        let busy = [BusyGpu {
            gpu: 0,
            pid: 9,
            name: "matmul".into(),
            memory_bytes: Some(140 << 30),
        }];
        let e = beside_busy(
            Error::Hardware("opening GPU 0 failed: OUT_OF_MEMORY".into()),
            &busy,
        );
        let msg = e.to_string();
        assert!(
            msg.contains("GPU 0: pid 9 (matmul) holding 140G held the GPUs"),
            "{msg}"
        );
        assert_eq!(e.exit_code(), crate::error::EXIT_HARDWARE);
        let quiet = beside_busy(Error::Hardware("x".into()), &[]);
        assert_eq!(quiet.to_string(), "x");
    }

    #[test]
    fn target_ci_is_a_percentage_within_bounds() {
        assert_eq!(parse_target_ci("2").unwrap(), 0.02);
        assert_eq!(parse_target_ci("0.5%").unwrap(), 0.005);
        assert_eq!(parse_target_ci("20").unwrap(), 0.2);
        for bad in ["0.05", "25", "-1", "x", "nan", "inf"] {
            assert!(parse_target_ci(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tp_sizes_parse_against_the_gpu_count() {
        assert_eq!(parse_tp(&["4".into(), "2".into()], 8).unwrap(), vec![2, 4]);
        assert!(parse_tp(&["16".into()], 8).is_err());
        assert!(parse_tp(&["x".into()], 8).is_err());
    }
}

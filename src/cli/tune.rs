//! `artune tune` and `artune show`.

use std::io::IsTerminal;

use super::{ShowArgs, TuneArgs};
use crate::error::Error;
use crate::fabric::sim::{Faults, SimFabric};
use crate::fabric::Fabric;
use crate::measure::Progress;
use crate::profile::Profile;
use crate::{report, tune, units};

/// The injected faults the arguments ask for (testing only), checked before anything runs.
fn faults(a: &TuneArgs) -> Result<Faults, Error> {
    let Some(spec) = &a.sim_faults else {
        return Ok(Faults::default());
    };
    if a.source.sim.is_none() && a.source.topology.is_none() {
        return Err(Error::bad_input(
            "--sim-faults only applies to a simulated machine; add --sim PRESET or --topology FILE, or drop --sim-faults",
        ));
    }
    Faults::parse(spec).map_err(|e| Error::bad_input(format!("--sim-faults: {e}")))
}

/// Opens the fabric the arguments ask for: simulated for --sim/--topology, else the GPUs.
fn open_fabric(a: &TuneArgs, faults: Faults) -> Result<Box<dyn Fabric>, Error> {
    let simulated = a.source.sim.is_some() || a.source.topology.is_some();
    if simulated && a.loopback.is_some() {
        return Err(Error::bad_input(
            "--loopback runs custom kernels on a real GPU; drop it to simulate, or drop --sim/--topology to use the GPU",
        ));
    }
    if simulated {
        let t = super::load_topology(&a.source)?;
        faults
            .check(t.gpu_count())
            .map_err(|e| Error::bad_input(format!("--sim-faults: {e}")))?;
        return Ok(Box::new(SimFabric::new(t, a.seed).with_faults(faults)));
    }
    Ok(Box::new(crate::fabric::cuda::CudaFabric::open(a.loopback)?))
}

/// A group where every backend failed or was waived has nothing to offer: that is a hardware
/// failure to report, not a profile to write.
fn check_measured(p: &Profile) -> Result<(), Error> {
    let Some(g) = p.groups.iter().find(|g| g.buckets.is_empty()) else {
        return Ok(());
    };
    let first = g
        .waived
        .iter()
        .next()
        .map(|(b, why)| format!("; first, {b}: {why}"))
        .unwrap_or_default();
    Err(Error::Hardware(format!(
        "no backend could be measured on GPUs {:?} ({} mode), so no profile was written{first}; fix what the warnings report, then run again",
        g.gpus,
        g.mode.id()
    )))
}

fn options(a: &TuneArgs, gpus: usize) -> Result<tune::Options, Error> {
    let (min_bytes, max_bytes) = units::parse_range(&a.sizes)?;
    if max_bytes > crate::profile::LIMITS.message_bytes {
        return Err(Error::bad_input(format!(
            "--sizes {} goes above 1 TiB; choose a smaller upper bound",
            a.sizes
        )));
    }
    let tp = match &a.tp {
        Some(items) => crate::decide::parse_tp(items, gpus)?,
        None => Vec::new(),
    };
    let mem_budget = a
        .mem_budget
        .as_deref()
        .map(units::parse_bytes)
        .transpose()?;
    Ok(tune::Options {
        tp,
        min_bytes,
        max_bytes,
        modes: a.mode.modes(),
        dtype: a.dtype.into(),
        mem_budget,
        seed: a.seed,
        contention: !a.no_contention,
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
    units::parse_range(&a.sizes)?;
    if let Some(b) = &a.mem_budget {
        units::parse_bytes(b)?;
    }
    let faults = faults(&a)?;
    crate::profile::check_writable(&a.out)?;
    crate::measure::install_interrupt_handler();
    let mut fabric = open_fabric(&a, faults)?;
    let opts = options(&a, fabric.topology().gpu_count())?;

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
    let mut profile = result?;
    profile.node = Some(node);
    check_measured(&profile)?;
    crate::profile::validate_built(&profile)?;
    // A signal that came after the last measurement still means: leave the old profile.
    if crate::measure::interrupted() {
        return Err(Error::Interrupted);
    }
    profile.write_atomic(&a.out)?;
    if let Some(dir) = &a.plot {
        let files = report::plots(&profile, dir)?;
        eprintln!("wrote {} plots to {}", files.len(), dir.display());
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report::summary_json(&profile)).expect("json")
        );
    } else {
        print!("{}", report::summary(&profile));
        println!("\nprofile written to {}", a.out.display());
    }
    Ok(0)
}

pub fn show(a: ShowArgs) -> Result<i32, Error> {
    let p = Profile::load(&a.profile)?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report::summary_json(&p)).expect("json")
        );
    } else {
        print!("{}", report::summary(&p));
    }
    Ok(0)
}

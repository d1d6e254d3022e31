//! `artune doctor`.

use std::path::PathBuf;

use clap::Args;

use super::Source;
use crate::doctor::facts::{Facts, Machine, Measured, ProfileFacts, Roots};
use crate::doctor::{checks, measure, Report};
use crate::error::Error;
use crate::fabric::sim::{Faults, SimFabric};
use crate::fabric::Fabric;
use crate::profile::Profile;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub source: Source,
    /// Print the checks as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also read links under load and verify P2P with transfers (uses the GPUs for seconds).
    #[arg(long)]
    pub measure: bool,
    /// Compare the driver, CUDA and NCCL versions with this profile's.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Testing only: read this directory as /sys.
    #[arg(long, hide = true, value_name = "DIR")]
    pub sysfs_root: Option<PathBuf>,
    /// Testing only: read this directory as /proc.
    #[arg(long, hide = true, value_name = "DIR")]
    pub proc_root: Option<PathBuf>,
    /// Testing only: read the GPUs' occupancy from this JSON file (as `tune --sim-occupancy`).
    #[arg(long, hide = true, value_name = "FILE")]
    pub sim_occupancy: Option<PathBuf>,
    /// Testing only: faults for the simulated machine's `--measure` (as for `artune tune`).
    #[arg(long, hide = true, value_name = "SPEC")]
    pub sim_faults: Option<String>,
}

pub fn run(a: DoctorArgs) -> Result<i32, Error> {
    let machine = match (&a.source.sim, &a.source.topology) {
        (Some(p), _) => Machine::Preset(p.clone()),
        (None, Some(f)) => Machine::File(f.clone()),
        (None, None) => Machine::Real,
    };
    let faults = super::sim_faults(a.sim_faults.as_deref(), &a.source)?;
    let profile = a.profile.as_deref().map(Profile::load).transpose()?;
    // A model that does not load is bad input; a real machine NVML cannot read is a finding.
    let topology = match machine {
        Machine::Real => crate::topology::discover(crate::fabric::cuda::nccl_version())
            .map_err(|e| e.to_string()),
        _ => Ok(super::load_topology(&a.source)?),
    };
    let roots = Roots {
        sysfs: a.sysfs_root.clone(),
        proc: a.proc_root.clone(),
    };
    let mut facts = Facts::gather(machine, topology, &roots);
    if let Some(f) = &a.sim_occupancy {
        facts.occupancy = Ok(crate::topology::occupancy::read_file(f)?);
    }
    if let (Some(p), Some(path)) = (&profile, &a.profile) {
        let mut pf = ProfileFacts {
            path: path.clone(),
            simulated: p.simulated,
            ..Default::default()
        };
        if let Ok(now) = &facts.topology {
            use crate::profile::validity::Change;
            let v = crate::profile::validity::judged(p, now);
            pf.changes = v.reasons().map(ToString::to_string).collect();
            // Another node of the class is no finding for the platform.
            let other = |c: &&Change| matches!(c, Change::OtherNode);
            pf.notes = v
                .notes()
                .filter(|c| !other(c))
                .map(ToString::to_string)
                .collect();
            pf.unchecked = v.unchecked.iter().map(ToString::to_string).collect();
        }
        facts.profile = Some(pf);
    }
    if a.measure {
        facts.measured = Some(measured(&facts, faults)?);
    }
    let report = Report {
        machine: facts.machine.describe(),
        simulated: facts.machine.simulated(),
        // Measured only where something was: without GPUs to open, --measure says why not.
        measured: facts
            .measured
            .as_ref()
            .is_some_and(|m| m.links.is_ok() || m.pairs.is_ok()),
        not_measured: facts
            .measured
            .as_ref()
            .filter(|m| m.links.is_err() && m.pairs.is_err())
            .and_then(|m| m.links.as_ref().err().cloned()),
        checks: checks::all(&facts),
    };
    let out = if a.json {
        let mut s = serde_json::to_string_pretty(&report.json()).expect("report serializes");
        s.push('\n');
        s
    } else {
        report.text()
    };
    super::output::write_fmt(format_args!("{out}"))?;
    Ok(report.exit_code())
}

/// Links under load and P2P transfers: on the simulated fabric for a model, else on the GPUs.
fn measured(facts: &Facts, faults: Faults) -> Result<Measured, Error> {
    let interrupted = |e: crate::fabric::FabricError| match e {
        crate::fabric::FabricError::Interrupted => Err(Error::Interrupted),
        other => Ok(other.to_string()),
    };
    if facts.machine != Machine::Real {
        let t = facts.topology.clone().map_err(Error::bad_input)?;
        faults
            .check(t.gpu_count())
            .map_err(|e| Error::bad_input(format!("--sim-faults: {e}")))?;
        let mut sim = SimFabric::new(t.clone(), 1).with_faults(faults);
        let pairs = match measure::pairs(&mut sim) {
            Ok(p) => Ok(p),
            Err(e) => Err(interrupted(e)?),
        };
        return Ok(Measured {
            links: Ok(t),
            pairs,
        });
    }
    let mut fabric = match crate::fabric::cuda::CudaFabric::open(None) {
        Ok(f) => f,
        Err(e) => {
            let why = format!(
                "the GPUs could not be opened for measuring ({})",
                interrupted(e)?
            );
            return Ok(Measured {
                links: Err(why.clone()),
                pairs: Err(why),
            });
        }
    };
    let links = match (fabric.link_under_load(), &facts.topology) {
        (Ok(r), Ok(t)) => Ok(measure::with_links(t, &r)),
        (Ok(r), Err(_)) => Ok(measure::with_links(fabric.topology(), &r)),
        (Err(e), _) => Err(interrupted(e)?),
    };
    let pairs = match measure::pairs(&mut fabric) {
        Ok(p) => Ok(p),
        Err(e) => Err(interrupted(e)?),
    };
    Ok(Measured { links, pairs })
}

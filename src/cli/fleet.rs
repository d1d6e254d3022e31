//! `artune fleet`.

use std::path::PathBuf;

use clap::Args;

use super::DtypeArg;
use crate::error::Error;
use crate::fleet::output;

#[derive(Args, Debug)]
pub struct FleetArgs {
    /// Directory of node profiles (`artune tune --out DIR/{host}.json` on each node).
    pub dir: PathBuf,
    /// Compare profiles of this dtype (default: the one most profiles have).
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeArg>,
    /// Where to write one class profile per topology class (default: DIR/classes).
    #[arg(long, short, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Also write per-node ratios and outlier flags for node_exporter's textfile collector.
    #[arg(long, value_name = "FILE")]
    pub prom: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Replace the output even where the file there is not one artune wrote (refused without).
    #[arg(long)]
    pub force: bool,
}

pub fn run(a: FleetArgs) -> Result<i32, Error> {
    use crate::profile::paths::{check_output, check_replace, Expect, Writes};
    let out_dir = a.out.clone().unwrap_or_else(|| a.dir.join("classes"));
    // An --out that names a file (a typo for a directory) is bad input, found before the
    // work; class profiles that cannot be written still let the report print (from a
    // read-only place, say), then exit 9.
    if let Some(out) = a.out.as_ref().filter(|o| o.exists() && !o.is_dir()) {
        check_output(out, "--out", Expect::Dir)?;
    }
    if let Some(p) = &a.prom {
        check_output(p, "--prom", Expect::File)?;
        check_replace(p, "--prom", Writes::Metrics, a.force)?;
    }
    let (mut report, collected) = crate::fleet::run(&a.dir, a.dtype.map(Into::into))?;
    let not_written = crate::fleet::write_class_profiles(
        &mut report,
        &collected,
        &out_dir,
        a.out.is_none(),
        a.force,
    )?;
    if let Some(p) = &a.prom {
        crate::profile::write_atomic(p, output::prom(&report).as_bytes())?;
    }
    let text = if a.json {
        output::json(&report)
    } else {
        output::text(&report)
    };
    super::output::write_fmt(format_args!("{text}"))?;
    for e in &not_written {
        eprintln!("error: {e}");
    }
    Ok(report.exit_code(!not_written.is_empty()))
}

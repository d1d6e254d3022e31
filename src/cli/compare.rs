//! `artune compare A B`: A's choices timed by B's measurements (see [`crate::compare`]).

use std::path::PathBuf;

use clap::Args;

use super::output::{out, outln};
use crate::error::Error;
use crate::profile::Profile;

#[derive(Args, Debug)]
pub struct CompareArgs {
    /// The profile whose choices are judged, e.g. `tune --sim` or `--topology` output.
    pub a: PathBuf,
    /// The profile whose measurements judge them, e.g. one measured on the machine.
    pub b: PathBuf,
    /// Print the comparison as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: CompareArgs) -> Result<i32, Error> {
    let pa = Profile::load(&a.a)?;
    let pb = Profile::load(&a.b)?;
    let c = crate::compare::compare(&pa, &pb).map_err(|e| Error::BadInput(e.to_string()))?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&c).expect("json"));
    } else {
        out!("{}", crate::compare::render(&c));
    }
    Ok(0)
}

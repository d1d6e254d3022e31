//! `artune topo`.
use std::io::Write;

use super::TopoArgs;
use crate::error::Error;

pub fn run(a: TopoArgs) -> Result<i32, Error> {
    let out = if a.list_presets {
        crate::topology::presets::list()
            .map(|(name, desc)| format!("{name:<24} {desc}\n"))
            .collect()
    } else {
        let t = super::load_topology(&a.source)?;
        if a.json {
            let mut s = serde_json::to_string_pretty(&t).expect("topology serializes");
            s.push('\n');
            s
        } else {
            crate::topology::render::text(&t)
        }
    };
    emit(&out)?;
    Ok(0)
}

/// Writes to standard output; a reader that went away (`artune topo | head`) is not an error.
pub(super) fn emit(s: &str) -> Result<(), Error> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(s.as_bytes()).and_then(|_| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Error::bad_input(format!(
            "cannot write to standard output ({e}): check where the output goes"
        ))),
        _ => Ok(()),
    }
}

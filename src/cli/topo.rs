//! `artune topo`.
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
    super::output::write_fmt(format_args!("{out}"))?;
    Ok(0)
}

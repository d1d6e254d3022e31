//! `artune topo`.
use super::TopoArgs;
use crate::error::Error;

pub fn run(a: TopoArgs) -> Result<i32, Error> {
    if a.list_presets {
        for (name, desc) in crate::topology::presets::list() {
            println!("{name:<24} {desc}");
        }
        return Ok(0);
    }
    let t = super::load_topology(&a.source)?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&t).expect("topology serializes")
        );
    } else {
        print!("{}", crate::topology::render::text(&t));
    }
    Ok(0)
}

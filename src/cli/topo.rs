//! `artune topo`.
use super::TopoArgs;
use crate::error::Error;

pub fn run(a: TopoArgs) -> Result<i32, Error> {
    let out = if a.list_presets && a.json {
        let v: Vec<serde_json::Value> = crate::topology::presets::list()
            .map(|(name, desc)| serde_json::json!({ "name": name, "description": desc }))
            .collect();
        let mut s = serde_json::to_string_pretty(&v).expect("presets serialize");
        s.push('\n');
        s
    } else if a.list_presets {
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
            let mut s = crate::topology::render::text(&t);
            s.push_str(&island_schedules(&t));
            s
        }
    };
    super::output::write_fmt(format_args!("{out}"))?;
    Ok(0)
}

/// The islands the island schedules take for a group of every GPU, or why there are none: the
/// partition `tune` derives (src/plan/), so it can be read before a tune.
fn island_schedules(t: &crate::topology::Topology) -> String {
    let all: Vec<usize> = (0..t.gpu_count()).collect();
    if all.len() < 2 {
        return String::new();
    }
    let names: Vec<&str> = crate::allreduce::Backend::ALL
        .iter()
        .filter(|b| b.is_hierarchical())
        .map(|b| b.id())
        .collect();
    let split = match crate::plan::islands(t, &all) {
        Ok(i) => i.describe(),
        Err(why) => format!("none: {why}"),
    };
    format!(
        "\nIsland schedules ({}) on all {} GPUs: {split}\n",
        names.join(", "),
        all.len()
    )
}

//! Built-in machines for the simulated fabric, stored as JSON under profiles/topologies/ and
//! embedded in the binary so `--sim NAME` works from anywhere.

use super::Topology;
use crate::error::Error;

const PRESETS: &[(&str, &str, &str)] = &[
    (
        "pcie-8x-2switch",
        "8 GPUs (RTX PRO 6000 class), two Gen5 x16 switches of 4, one socket (calibration C1)",
        include_str!("../../profiles/topologies/pcie-8x-2switch.json"),
    ),
    (
        "pcie-8x-direct-2socket",
        "8 GPUs on CPU root ports, 4 per socket, two sockets (calibration C2)",
        include_str!("../../profiles/topologies/pcie-8x-direct-2socket.json"),
    ),
    (
        "pcie-4x-1switch",
        "4 GPUs under one Gen5 switch",
        include_str!("../../profiles/topologies/pcie-4x-1switch.json"),
    ),
    (
        "pcie-2x",
        "2 GPUs under one Gen5 switch",
        include_str!("../../profiles/topologies/pcie-2x.json"),
    ),
    (
        "nvswitch-8x",
        "8 H100-class GPUs on NVSwitch (NVLink4, 18 links each)",
        include_str!("../../profiles/topologies/nvswitch-8x.json"),
    ),
];

/// Names and one-line descriptions of the presets.
pub fn list() -> impl Iterator<Item = (&'static str, &'static str)> {
    PRESETS.iter().map(|(n, d, _)| (*n, *d))
}

/// The raw JSON of a preset.
pub fn json(name: &str) -> Option<&'static str> {
    PRESETS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, _, j)| *j)
}

/// A preset, normalized.
pub fn get(name: &str) -> Result<Topology, Error> {
    let text = json(name).ok_or_else(|| {
        let names: Vec<&str> = list().map(|(n, _)| n).collect();
        Error::bad_input(format!(
            "there is no simulated preset `{name}`; choose one of: {}",
            names.join(", ")
        ))
    })?;
    let mut t = super::file::parse(text)
        .map_err(|e| Error::Bug(format!("built-in preset `{name}` is broken: {e}")))?;
    t.origin.kind = "preset".into();
    t.origin.name = Some(name.into());
    t.origin.link_reading = "preset".into();
    Ok(t)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_preset_loads() {
        for (name, _) in super::list() {
            let t = super::get(name).unwrap();
            assert!(t.gpu_count() >= 2, "{name}");
        }
    }

    #[test]
    fn unknown_preset_lists_choices() {
        let e = super::get("nope").unwrap_err().to_string();
        assert!(e.contains("pcie-8x-2switch"), "{e}");
    }
}

//! The `artune topo` text view: what a provisioning engineer checks before tuning. Path matrix
//! as `nvidia-smi topo -m` prints it, islands, P2P status, the PCIe tree with link speeds,
//! fingerprints, notes and warnings.

use std::fmt::Write;

use super::{Link, Status, Topology};

/// The `artune topo` text view.
pub fn text(t: &Topology) -> String {
    let mut o = String::new();
    header(&mut o, t);
    gpus(&mut o, t);
    paths(&mut o, t);
    islands(&mut o, t);
    p2p(&mut o, t);
    tree(&mut o, t);
    nvlinks(&mut o, t);
    list(&mut o, "Notes", &t.notes);
    list(&mut o, "Warnings", &t.warnings());
    o
}

fn header(o: &mut String, t: &Topology) {
    let n = t.gpu_count();
    let what = match (t.origin.kind.as_str(), t.origin.name.as_deref()) {
        ("nvml", _) => format!(
            "read through NVML, link speeds read {}",
            reading(&t.origin.link_reading)
        ),
        ("preset", Some(name)) => format!("simulated machine: preset `{name}`"),
        ("file", Some(path)) => format!("simulated machine: topology file {path}"),
        (kind, _) => format!("simulated machine ({kind})"),
    };
    let _ = writeln!(o, "{n} GPU{}, {what}", if n == 1 { "" } else { "s" });
    let h = &t.host;
    let host: Vec<String> = [
        h.hostname.as_ref().map(|v| format!("host {v}")),
        h.driver.as_ref().map(|v| format!("driver {v}")),
        h.cuda.as_ref().map(|v| format!("CUDA {v}")),
        h.nccl.as_ref().map(|v| format!("NCCL {v}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !host.is_empty() {
        let _ = writeln!(o, "{}", host.join(", "));
    }
    let _ = writeln!(
        o,
        "class hash {}  host hash {}",
        t.class_hash(),
        t.host_hash()
    );
}

fn reading(r: &str) -> &str {
    match r {
        "load" => "under load",
        "idle" => "idle (GPUs lower PCIe speed when idle)",
        other => other,
    }
}

fn gpus(o: &mut String, t: &Topology) {
    let _ = writeln!(o, "\nGPUs");
    for g in &t.gpus {
        let mut parts = vec![g.name.clone()];
        if let Some(c) = g.compute_capability {
            parts.push(format!("cc {c}"));
        }
        if let Some(m) = g.memory_bytes {
            parts.push(format!("{:.1} GiB", m as f64 / (1u64 << 30) as f64));
        }
        if let Some(b) = &g.bus_id {
            parts.push(format!("bus {b}"));
        }
        if let Some(u) = &g.uuid {
            parts.push(u.clone());
        }
        let _ = writeln!(o, "  GPU{:<3} {}", g.index, parts.join(", "));
    }
}

/// A grid with GPU row and column headers plus extra trailing columns.
fn grid(
    o: &mut String,
    t: &Topology,
    cell: impl Fn(usize, usize) -> String,
    extra: &[(&str, Vec<String>)],
) {
    let n = t.gpu_count();
    let cells: Vec<Vec<String>> = (0..n)
        .map(|a| (0..n).map(|b| cell(a, b)).collect())
        .collect();
    let width = cells
        .iter()
        .flatten()
        .map(String::len)
        .chain([format!("GPU{}", n - 1).len()])
        .max()
        .unwrap_or(4)
        + 2;
    let row_head = format!("GPU{}", n - 1).len() + 2;
    let mut line = format!("  {:row_head$}", "");
    for b in 0..n {
        let _ = write!(line, "{:<width$}", format!("GPU{b}"));
    }
    for (name, _) in extra {
        let _ = write!(line, "{name}  ");
    }
    let _ = writeln!(o, "{}", line.trim_end());
    for (a, row) in cells.iter().enumerate() {
        let mut line = format!("  {:row_head$}", format!("GPU{a}"));
        for c in row {
            let _ = write!(line, "{c:<width$}");
        }
        for (name, vals) in extra {
            let _ = write!(line, "{:<w$}", vals[a], w = name.len() + 2);
        }
        let _ = writeln!(o, "{}", line.trim_end());
    }
}

fn paths(o: &mut String, t: &Topology) {
    let _ = writeln!(o, "\nPaths (as `nvidia-smi topo -m`)");
    let na = |v: Option<String>| v.unwrap_or_else(|| "N/A".into());
    let affinity = t.gpus.iter().map(|g| na(g.cpu_affinity.clone())).collect();
    let numa = t
        .gpus
        .iter()
        .map(|g| na(g.numa_node.map(|n| n.to_string())))
        .collect();
    let label = |a: usize, b: usize| match (a == b, t.pair(a, b)) {
        (true, _) => "X".to_string(),
        (false, Some(p)) => p.path.label(p.nvlinks),
        (false, None) => "?".to_string(),
    };
    grid(o, t, label, &[("CPU Affinity", affinity), ("NUMA", numa)]);
    let _ = writeln!(
        o,
        "  X same GPU, NV# # NVLinks, PIX one PCIe switch, PXB several switches, PHB one host bridge,\n  NODE host bridges of one NUMA node, SYS across the socket interconnect"
    );
}

fn islands(o: &mut String, t: &Topology) {
    let _ = writeln!(
        o,
        "\nBehind one uplink (GPUs that reach each other without crossing one)"
    );
    for isl in t.islands() {
        let ids: Vec<String> = isl.iter().map(|g| g.to_string()).collect();
        let parent = &t.gpus[isl[0]].parent;
        let under = match t.switch(parent) {
            Some(s) => format!(
                "switch {}{}",
                s.id,
                chip(s.vendor.as_deref(), s.device.as_deref())
            ),
            None => format!("root complex {parent}"),
        };
        let _ = writeln!(o, "  GPU {:<12} under {under}", ids.join(" "));
    }
}

fn chip(vendor: Option<&str>, device: Option<&str>) -> String {
    match (vendor, device) {
        (None, None) => String::new(),
        (v, d) => format!(
            " ({})",
            [v, d].into_iter().flatten().collect::<Vec<_>>().join(" ")
        ),
    }
}

fn p2p(o: &mut String, t: &Topology) {
    if t.gpu_count() < 2 {
        return;
    }
    let s = |v: Status| match v {
        Status::Ok => "ok",
        Status::No => "no",
        Status::Unknown => "?",
    };
    let rw = |p: &super::Pair| format!("{}/{}", s(p.p2p.read), s(p.p2p.write));
    let n = t.gpu_count();
    let first = t.pairs.first().map(rw);
    if t.pairs.len() == n * (n - 1) && t.pairs.iter().all(|p| Some(rw(p)) == first) {
        let _ = writeln!(
            o,
            "\nP2P read/write: {} between every pair (ok, no, ? unknown)",
            first.unwrap_or_default()
        );
        return;
    }
    let _ = writeln!(o, "\nP2P read/write (ok, no, ? unknown)");
    let cell = |a: usize, b: usize| match (a == b, t.pair(a, b)) {
        (true, _) => "X".to_string(),
        (false, Some(p)) => rw(p),
        (false, None) => "?".to_string(),
    };
    grid(o, t, cell, &[]);
}

/// "Gen5 x16", with the maximum when the link trained below it; rates for non-PCIe links.
pub fn link(l: &Link) -> String {
    if [l.gen, l.width, l.max_gen, l.max_width]
        .iter()
        .all(Option::is_none)
    {
        let rates: Vec<String> = [
            l.up_gbps.map(|v| format!("{v} GB/s up")),
            l.down_gbps.map(|v| format!("{v} GB/s down")),
            l.max_flow_gbps.map(|v| format!("{v} GB/s per flow")),
            l.latency_us.map(|v| format!("{v} us")),
        ]
        .into_iter()
        .flatten()
        .collect();
        return if rates.is_empty() {
            "unknown".into()
        } else {
            rates.join(", ")
        };
    }
    let part = |g: Option<u8>, w: Option<u8>| {
        format!(
            "Gen{} x{}",
            g.map_or("?".into(), |v| v.to_string()),
            w.map_or("?".into(), |v| v.to_string())
        )
    };
    let now = part(l.gen, l.width);
    let max = part(l.max_gen.or(l.gen), l.max_width.or(l.width));
    if l.degraded() {
        format!("{now} (max {max})")
    } else if now != max {
        format!("{now}, max {max}")
    } else {
        now
    }
}

fn tree(o: &mut String, t: &Topology) {
    let _ = writeln!(o, "\nPCIe tree (link now, max)");
    for s in &t.sockets {
        let ic = s
            .interconnect
            .as_ref()
            .map(|l| format!(", interconnect {}", link(l)))
            .unwrap_or_default();
        let _ = writeln!(o, "  socket {}{ic}", s.id);
        for r in t.root_complexes.iter().filter(|r| r.socket == s.id) {
            let _ = writeln!(o, "    root complex {}", r.id);
            subtree(o, t, &r.id, 3);
        }
    }
}

fn subtree(o: &mut String, t: &Topology, parent: &str, depth: usize) {
    // Depth is bounded by the switch count, so a cycle in a file cannot recurse forever.
    if depth > t.switches.len() + 3 {
        return;
    }
    let pad = "  ".repeat(depth);
    for g in t.gpus.iter().filter(|g| g.parent == parent) {
        let _ = writeln!(o, "{pad}GPU{}  {}", g.index, link(&g.pcie));
    }
    for s in t.switches.iter().filter(|s| s.parent == parent) {
        let _ = writeln!(
            o,
            "{pad}switch {}{}  uplink {}",
            s.id,
            chip(s.vendor.as_deref(), s.device.as_deref()),
            link(&s.uplink)
        );
        subtree(o, t, &s.id, depth + 1);
    }
}

fn nvlinks(o: &mut String, t: &Topology) {
    if t.gpus.iter().all(|g| g.nvlinks.is_empty()) {
        return;
    }
    let _ = writeln!(o, "\nNVLink");
    if let Some(s) = &t.nvswitch {
        let _ = writeln!(
            o,
            "  NVSwitch: NVLink{}, {} GB/s per GPU and direction",
            s.generation, s.gpu_gbps
        );
    }
    for g in &t.gpus {
        let active: Vec<_> = g.nvlinks.iter().filter(|l| l.active).collect();
        let mut to: Vec<String> = Vec::new();
        for l in &active {
            let name = l
                .remote_gpu
                .map_or("NVSwitch".to_string(), |r| format!("GPU{r}"));
            if !to.contains(&name) {
                to.push(name);
            }
        }
        let version = active
            .iter()
            .find_map(|l| l.version)
            .map(|v| format!(" NVLink{v}"))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "  GPU{:<3} {} of {} links active{version}{}",
            g.index,
            active.len(),
            g.nvlinks.len(),
            if to.is_empty() {
                String::new()
            } else {
                format!(" to {}", to.join(", "))
            }
        );
    }
}

fn list(o: &mut String, title: &str, items: &[String]) {
    if items.is_empty() {
        return;
    }
    let _ = writeln!(o, "\n{title}");
    for i in items {
        let _ = writeln!(o, "  - {i}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::presets;

    #[test]
    fn two_switch_preset() {
        let t = presets::get("pcie-8x-2switch").unwrap();
        let s = text(&t);
        assert!(
            s.starts_with("8 GPUs, simulated machine: preset `pcie-8x-2switch`"),
            "{s}"
        );
        assert!(
            s.contains(&t.class_hash()) && s.contains(&t.host_hash()),
            "{s}"
        );
        let row0 = s
            .lines()
            .find(|l| l.trim_start().starts_with("GPU0 ") && l.contains("PIX"))
            .unwrap();
        let cols: Vec<&str> = row0.split_whitespace().collect();
        assert_eq!(
            &cols[..9],
            ["GPU0", "X", "PIX", "PIX", "PIX", "PHB", "PHB", "PHB", "PHB"],
            "{row0}"
        );
        assert!(s.contains("CPU Affinity  NUMA"), "{s}");
        assert!(s.contains("GPU 0 1 2 3"), "{s}");
        assert!(
            s.contains("P2P read/write: ok/ok between every pair"),
            "{s}"
        );
        assert!(s.contains("(Microchip PM50100)  uplink Gen5 x16"), "{s}");
        assert!(
            !s.contains("Warnings"),
            "a healthy preset has no warnings: {s}"
        );
    }

    #[test]
    fn nvswitch_preset_shows_nv18() {
        let s = text(&presets::get("nvswitch-8x").unwrap());
        assert!(s.contains("NV18"), "{s}");
        assert!(
            s.contains("18 of 18 links active NVLink4 to NVSwitch"),
            "{s}"
        );
    }

    #[test]
    fn degraded_idle_link_is_warned_as_idle() {
        let mut t = presets::get("pcie-2x").unwrap();
        t.gpus[1].pcie.gen = Some(1);
        t.origin.kind = "nvml".into();
        t.origin.link_reading = "idle".into();
        t.notes
            .push("NVLink: not supported on this GPU or driver (GPU 0, GPU 1)".into());
        let s = text(&t);
        assert!(s.contains("GPU1  Gen1 x16 (max Gen5 x16)"), "{s}");
        assert!(s.contains("link speeds read idle"), "{s}");
        let warn = s.split("\nWarnings\n").nth(1).expect("warnings section");
        assert!(
            warn.contains("GPU 1 PCIe link runs at Gen1 x16") && warn.contains("read while idle"),
            "{s}"
        );
        assert!(s.contains("\nNotes\n  - NVLink: not supported"), "{s}");
    }

    #[test]
    fn one_gpu_has_no_p2p_matrix() {
        let mut t = presets::get("pcie-2x").unwrap();
        t.gpus.truncate(1);
        t.pairs.clear();
        t.gpus[0].pcie = Link::default();
        let s = text(&t);
        assert!(s.starts_with("1 GPU,"), "{s}");
        assert!(!s.contains("P2P"), "{s}");
        assert!(s.contains("GPU0  unknown"), "{s}");
    }

    #[test]
    fn mixed_p2p_is_a_matrix() {
        let mut t = presets::get("pcie-8x-direct-2socket").unwrap();
        for p in t.pairs.iter_mut().filter(|p| p.from == 0 && p.to == 1) {
            p.p2p.write = Status::No;
        }
        let s = text(&t);
        let row0 = s
            .split("P2P read/write (ok")
            .nth(1)
            .unwrap()
            .lines()
            .find(|l| l.contains("GPU0  X"))
            .unwrap();
        assert!(row0.contains("ok/no") && row0.contains("?/?"), "{s}");
        assert!(s.contains("P2P is not available between GPUs 0-1"), "{s}");
        assert!(
            s.contains(
                "socket 1, interconnect 80 GB/s up, 80 GB/s down, 43 GB/s per flow, 0.04 us"
            ),
            "{s}"
        );
    }

    #[test]
    fn link_formats() {
        assert_eq!(link(&Link::pcie(5, 16)), "Gen5 x16");
        let l = Link {
            gen: Some(4),
            width: Some(16),
            max_gen: Some(5),
            max_width: Some(16),
            ..Default::default()
        };
        assert_eq!(link(&l), "Gen4 x16 (max Gen5 x16)");
        let l = Link {
            gen: Some(5),
            width: Some(16),
            ..Default::default()
        };
        assert_eq!(link(&l), "Gen5 x16");
    }
}

//! Checks of the GPUs: P2P per pair, links against their maximum, persistence mode, like GPUs
//! per island.

use super::{list, no_topology, nvml_failed, Check, Status, ON_THE_NODE};
use crate::doctor::facts::Facts;
use crate::topology::{PathClass, Status as P2pStatus};

pub fn p2p(f: &Facts) -> Check {
    const ID: &str = "p2p";
    let t = match &f.topology {
        Ok(t) => t,
        Err(_) => return no_topology(ID),
    };
    if t.gpu_count() < 2 {
        return Check::ok(ID, "one GPU: there is no pair to check");
    }
    let refused =
        |p: &crate::topology::Pair| p.p2p.read == P2pStatus::No || p.p2p.write == P2pStatus::No;
    let close = |c: PathClass| matches!(c, PathClass::NV | PathClass::PIX | PathClass::PXB);
    let label =
        |p: &crate::topology::Pair| format!("{}→{} ({})", p.from, p.to, p.path.label(p.nvlinks));
    let near: Vec<String> = t
        .pairs
        .iter()
        .filter(|p| refused(p) && close(p.path))
        .map(label)
        .collect();
    let far: Vec<String> = t
        .pairs
        .iter()
        .filter(|p| refused(p) && !close(p.path))
        .map(label)
        .collect();
    let measured = f.measured.as_ref().map(|m| &m.pairs);
    // Pairs a transfer verified need no status from the driver.
    let transferred = |a: usize, b: usize| {
        matches!(measured, Some(Ok(pairs)) if pairs.iter().any(|p| {
            p.result.is_ok() && ((p.a, p.b) == (a, b) || (p.b, p.a) == (a, b))
        }))
    };
    let unknown: Vec<String> = t
        .pairs
        .iter()
        .filter(|p| {
            !refused(p)
                && (p.p2p.read == P2pStatus::Unknown || p.p2p.write == P2pStatus::Unknown)
                && !transferred(p.from, p.to)
        })
        .map(label)
        .collect();
    let source = if f.machine.simulated() {
        "the model states"
    } else {
        "the driver reports"
    };
    if let Some(Ok(pairs)) = measured {
        let bad: Vec<String> = pairs
            .iter()
            .filter_map(|p| {
                p.result
                    .as_ref()
                    .err()
                    .map(|e| format!("{}-{}: {e}", p.a, p.b))
            })
            .collect();
        if let Some(first) = bad.first() {
            return Check::new(
                ID,
                Status::Fail,
                format!(
                    "a transfer through peer memory went wrong between {} of {} pairs ({first})",
                    bad.len(),
                    pairs.len()
                ),
                "do not use custom allreduce on these GPUs until `artune doctor --measure` passes: check ACS, IOMMU and the BIOS, and update the driver",
            );
        }
    }
    if !near.is_empty() {
        return Check::new(
            ID,
            Status::Fail,
            format!(
                "{source} no P2P between GPUs under one switch or NVLink: {}",
                list(&near)
            ),
            "check ACS and the IOMMU (the checks above) and that the driver supports P2P on this board, then `nvidia-smi topo -p2p rw`",
        );
    }
    let verified = match measured {
        Some(Ok(pairs)) if !pairs.is_empty() => {
            let what: Vec<&str> = pairs
                .iter()
                .filter_map(|p| p.result.as_ref().ok().map(String::as_str))
                .take(1)
                .collect();
            format!(
                "; a transfer verified {} pair{} ({})",
                pairs.len(),
                if pairs.len() == 1 { "" } else { "s" },
                what.join("")
            )
        }
        Some(Err(why)) => format!("; not verified by a transfer: {why}"),
        _ => "; `--measure` verifies it with a transfer".into(),
    };
    if !far.is_empty() {
        return Check::new(
            ID,
            Status::Warn,
            format!(
                "{source} no P2P between GPUs across host bridges or sockets: {}{verified}",
                list(&far)
            ),
            "keep each TP group within GPUs that have P2P (custom allreduce cannot span these pairs; NCCL goes through host memory)",
        );
    }
    if !unknown.is_empty() {
        return Check::new(
            ID,
            Status::Unknown,
            format!("{source} no P2P status for {}{verified}", list(&unknown)),
            "run `artune doctor --measure` to verify them with a transfer (`nvidia-smi topo -p2p rw` shows what the driver allows)",
        );
    }
    let stated = t
        .pairs
        .iter()
        .filter(|p| p.p2p.read == P2pStatus::Ok && p.p2p.write == P2pStatus::Ok)
        .count();
    Check::ok(
        ID,
        format!(
            "{source} P2P read and write between {stated} of {} ordered pairs{verified}",
            t.pairs.len()
        ),
    )
}

pub fn links(f: &Facts) -> Check {
    const ID: &str = "links";
    let measured = f.measured.as_ref().map(|m| &m.links);
    let t = match (measured, &f.topology) {
        (Some(Ok(t)), _) => t,
        (_, Ok(t)) => t,
        (_, Err(_)) => return no_topology(ID),
    };
    let reading = if f.machine.simulated() {
        "as the model states them"
    } else {
        match t.origin.link_reading.as_str() {
            "load" => "read under load",
            "idle" => "read while idle",
            _ => "read at an unknown load",
        }
    };
    let mut hard = Vec::new();
    let mut idle = Vec::new();
    for (what, l) in t.links() {
        if !l.degraded() {
            continue;
        }
        let s = format!(
            "{what} Gen{} x{} (max Gen{} x{})",
            l.gen.unwrap_or(0),
            l.width.unwrap_or(0),
            l.max_gen.unwrap_or(0),
            l.max_width.unwrap_or(0)
        );
        if l.narrowed() || f.machine.simulated() || t.origin.link_reading == "load" {
            hard.push(s);
        } else {
            idle.push(s);
        }
    }
    let not_measured = match measured {
        Some(Err(why)) => format!("; not re-read under load: {why}"),
        _ => String::new(),
    };
    if !hard.is_empty() {
        return Check::new(
            ID,
            Status::Fail,
            format!("links trained below their maximum, {reading}: {}{not_measured}", list(&hard)),
            "reseat the card or move it to a full-width slot, check the slot's link speed in the BIOS, then run `artune doctor --measure` again",
        );
    }
    if !idle.is_empty() {
        return Check::new(
            ID,
            Status::Warn,
            format!("links below their maximum generation, {reading}: {}{not_measured}", list(&idle)),
            "run `artune doctor --measure` to read them under load (idle GPUs lower the generation to save power)",
        );
    }
    Check::ok(
        ID,
        format!(
            "{} at {} maximum generation and width, {reading}{not_measured}",
            match t.links().len() {
                1 => "the one link runs".to_string(),
                n => format!("all {n} links run"),
            },
            if t.links().len() == 1 { "its" } else { "their" }
        ),
    )
}

/// Another process on a GPU makes every tune there measure the neighbour too.
pub fn busy(f: &Facts) -> Check {
    const ID: &str = "busy";
    let r = match &f.occupancy {
        Ok(r) => r,
        Err(why) => return nvml_failed(f, ID, why),
    };
    match r.describe() {
        None => Check::ok(
            ID,
            format!(
                "no other compute process and under {}% utilization over 1 s on {} GPU{}",
                crate::topology::occupancy::BUSY_UTILIZATION,
                r.gpus.len(),
                if r.gpus.len() == 1 { "" } else { "s" }
            ),
        ),
        Some(what) => Check::new(
            ID,
            Status::Warn,
            format!("the GPUs are in use: {what}"),
            "stop that work before `artune tune` (tune refuses it unless --allow-busy, and then records it)",
        ),
    }
}

pub fn persistence(f: &Facts) -> Check {
    const ID: &str = "persistence";
    let s = match &f.settings {
        Ok(s) => s,
        Err(why) => return nvml_failed(f, ID, why),
    };
    let off: Vec<usize> = s
        .iter()
        .filter(|g| g.persistence == Ok(false))
        .map(|g| g.index)
        .collect();
    let on = s.iter().filter(|g| g.persistence == Ok(true)).count();
    if !off.is_empty() {
        return Check::new(
            ID,
            Status::Warn,
            format!(
                "persistence mode is off on GPU{} {}: the driver tears down and re-initializes the GPU between processes",
                if off.len() == 1 { "" } else { "s" },
                list(&off)
            ),
            "enable it with `nvidia-smi -pm 1` as root, or run the nvidia-persistenced service",
        );
    }
    if on == 0 || on < s.len() {
        let why = s
            .iter()
            .find_map(|g| g.persistence.clone().err())
            .unwrap_or_else(|| "NVML lists no GPU".into());
        return Check::new(
            ID,
            Status::Unknown,
            format!("persistence mode is unknown: {why}"),
            ON_THE_NODE,
        );
    }
    Check::ok(
        ID,
        match on {
            1 => "persistence mode is on for the one GPU".to_string(),
            n => format!("persistence mode is on for all {n} GPUs"),
        },
    )
}

pub fn islands(f: &Facts) -> Check {
    const ID: &str = "islands";
    let t = match &f.topology {
        Ok(t) => t,
        Err(_) => return no_topology(ID),
    };
    let model = |i: usize| {
        let g = &t.gpus[i];
        match g.memory_bytes {
            Some(m) => format!("{} {} GiB", g.name, m >> 30),
            None => g.name.clone(),
        }
    };
    let mut mixed = Vec::new();
    let islands = t.islands();
    for island in &islands {
        let mut kinds: Vec<(String, Vec<usize>)> = Vec::new();
        for &g in island {
            let k = model(g);
            match kinds.iter_mut().find(|(m, _)| *m == k) {
                Some((_, v)) => v.push(g),
                None => kinds.push((k, vec![g])),
            }
        }
        if kinds.len() > 1 {
            let parts: Vec<String> = kinds
                .iter()
                .map(|(k, v)| format!("{k} on GPUs {}", list(v)))
                .collect();
            mixed.push(parts.join(" with "));
        }
    }
    if !mixed.is_empty() {
        return Check::new(
            ID,
            Status::Warn,
            format!(
                "an island mixes unlike GPUs, so a TP group in it runs at the slowest one's pace: {}",
                mixed.join("; ")
            ),
            "keep each TP group to GPUs of one model (choose them with CUDA_VISIBLE_DEVICES), or move the odd GPU",
        );
    }
    Check::ok(
        ID,
        match islands.len() {
            1 => "the one island holds GPUs of one model".to_string(),
            n => format!("each of the {n} islands holds GPUs of one model"),
        },
    )
}

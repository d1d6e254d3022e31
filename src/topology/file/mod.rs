//! Reading and writing topology JSON files.
//!
//! Users describe machines artune cannot see (or calibrate the simulator from their own
//! measurements) in this format; `artune topo --json` writes it. docs/FORMATS.md documents it.
//!
//! Everything read from a file passes three gates, in order, each ending in a phrase that
//! names what is wrong: [`read_text`] (size, UTF-8), [`check_json`] (syntax, nesting depth,
//! repeated keys) and [`check`] plus [`Topology::normalize`] (counts, ids, references, values).
//! Profiles embed a topology and reuse all three.

use super::{Contention, KernelPoint, Link, Topology, TopologyError, MAX_GPUS, MAX_SWITCHES};
use crate::error::Error;
use std::collections::{HashMap, HashSet};

mod json;
#[cfg(test)]
use json::locate;
use json::shorten;
pub use json::{check_json, describe};
use std::io::Read;
use std::path::Path;

/// Largest topology file accepted. A 256-GPU machine with every pair listed fits well below.
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// Deepest nesting of arrays and objects accepted in any artune JSON file. Real files nest 7
/// deep; serde_json would stop at 128 with a message that names no file format.
pub const MAX_DEPTH: usize = 32;
pub const MAX_SOCKETS: usize = 64;
pub const MAX_ROOT_COMPLEXES: usize = 1024;
/// Switches between a GPU and its root complex. Real machines have one to three; the bound
/// keeps path derivation (GPUs² walks up the tree) fast on a hostile file.
pub const MAX_SWITCH_DEPTH: usize = 8;
/// Points per kernel-traffic curve.
pub const MAX_KERNEL_POINTS: usize = 1024;
/// NVLinks per GPU (H100/H200/B200 have 18).
pub const MAX_NVLINKS: usize = 64;
/// Longest id (switch, root complex, parent) in bytes.
pub const MAX_ID_BYTES: usize = 128;
/// Largest GPU memory a file may state (1 PiB).
pub const MAX_GPU_MEMORY_BYTES: u64 = 1 << 50;

/// Loads and normalizes a topology file.
pub fn load(path: &Path) -> Result<Topology, Error> {
    let text = read_text(path, MAX_FILE_BYTES, "topology file")?;
    let mut t = parse(&text).map_err(|e| Error::Parse {
        path: path.into(),
        what: "topology file",
        reason: format!("{e}; see \"Topology files\" in docs/FORMATS.md"),
    })?;
    t.origin.kind = "file".into();
    t.origin.name = Some(path.display().to_string());
    Ok(t)
}

/// Parses topology JSON and normalizes it.
pub fn parse(text: &str) -> Result<Topology, TopologyError> {
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(TopologyError::TooLarge {
            len: text.len() as u64,
            limit: MAX_FILE_BYTES,
        });
    }
    check_json(text).map_err(TopologyError::Json)?;
    #[derive(serde::Deserialize)]
    struct Peek {
        schema_version: Option<serde::de::IgnoredAny>,
        groups: Option<serde::de::IgnoredAny>,
    }
    if let Ok(Peek {
        schema_version: Some(_),
        groups: Some(_),
    }) = serde_json::from_str(text)
    {
        return Err(TopologyError::Invalid(
            "it is an artune profile, not a topology file; give the topology file the tune \
             read, or write one on the machine with `artune topo --json > topo.json`"
                .into(),
        ));
    }
    check_no_model_error(text).map_err(TopologyError::Invalid)?;
    let mut t: Topology =
        serde_json::from_str(text).map_err(|e| TopologyError::Json(describe(&e, text)))?;
    // Pairs are derived data: a file cut down from `topo --json` (GPUs removed) keeps the
    // pairs of the GPUs it no longer lists, which describe nothing here. They are dropped
    // where the rest are then every pair of the GPUs listed; else (a typo in one pair) the
    // checks below name the pair.
    let listed: HashSet<usize> = t.gpus.iter().map(|g| g.index).collect();
    let n = listed.len();
    let of_listed = |p: &&super::Pair| listed.contains(&p.from) && listed.contains(&p.to);
    if t.pairs.iter().filter(of_listed).count() == n * n.saturating_sub(1) {
        t.pairs.retain(|p| of_listed(&p));
    }
    check(&t).map_err(TopologyError::Invalid)?;
    t.normalize()?;
    Ok(t)
}

fn too_big(len: u64, limit: u64, what: &str) -> String {
    let (len, limit) = crate::units::fmt_mem_apart(len, limit);
    format!("it is {len}, more than the {limit} a {what} may have")
}

/// Reads a whole text file of at most `limit` bytes. The size is checked on the open file
/// before reading, and the read itself stops past the limit, so a device or a file that
/// grows while read (`/dev/zero`, a pipe) cannot make us allocate without bound.
pub fn read_text(path: &Path, limit: u64, what: &'static str) -> Result<String, Error> {
    let read_err = |e: std::io::Error| Error::Read {
        path: path.into(),
        reason: e.to_string(),
    };
    let parse_err = |reason: String| Error::Parse {
        path: path.into(),
        what,
        reason,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    if meta.is_dir() {
        return Err(Error::Read {
            path: path.into(),
            reason: "it is a directory".into(),
        });
    }
    if meta.len() > limit {
        return Err(parse_err(too_big(meta.len(), limit, what)));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > limit {
        return Err(parse_err(format!(
            "it is more than the {} a {what} may have",
            crate::units::fmt_mem(limit)
        )));
    }
    String::from_utf8(bytes).map_err(|e| {
        parse_err(format!(
            "it is not UTF-8 text (invalid byte at offset {}); a {what} is JSON in UTF-8, so name the right file or save this one as UTF-8",
            e.utf8_error().valid_up_to()
        ))
    })
}

/// Keys that would state the simulator's error instead of the machine.
const MODEL_ERROR_KEYS: &[&str] = &[
    "error_band",
    "model_error",
    "model_band",
    "band",
    "error",
    "uncertainty",
    "tolerance",
];

/// A topology states the machine; the simulator's error bands come from its calibration
/// residuals (docs/MODEL-ERROR.md), so a file that states one is refused rather than ignored.
fn check_no_model_error(text: &str) -> Result<(), String> {
    fn walk(v: &serde_json::Value, path: &str) -> Result<(), String> {
        match v {
            serde_json::Value::Object(m) => m.iter().try_for_each(|(k, v)| {
                let here = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                if MODEL_ERROR_KEYS.contains(&k.to_ascii_lowercase().as_str()) {
                    return Err(format!(
                        "`{}` states a model error band, which a topology cannot: the simulator derives its bands from calibration residuals (docs/MODEL-ERROR.md); remove the key",
                        shorten(&here)
                    ));
                }
                walk(v, &here)
            }),
            serde_json::Value::Array(a) => a
                .iter()
                .enumerate()
                .try_for_each(|(i, v)| walk(v, &format!("{path}[{i}]"))),
            _ => Ok(()),
        }
    }
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| describe(&e, text))?;
    walk(&v, "")
}

/// Checks what [`Topology::normalize`] leaves to the reader: counts that bound its work, ids
/// that are unique and printable, a switch tree without cycles or absurd depth, link values a
/// PCIe or NVLink link can have, and each GPU pair listed at most once.
pub fn check(t: &Topology) -> Result<(), String> {
    let count = |n: usize, max: usize, what: &str| {
        if n > max {
            Err(format!("it lists {n} {what}; at most {max} are supported"))
        } else {
            Ok(())
        }
    };
    count(t.gpus.len(), MAX_GPUS, "GPUs")?;
    count(t.switches.len(), MAX_SWITCHES, "switches")?;
    count(t.root_complexes.len(), MAX_ROOT_COMPLEXES, "root complexes")?;
    count(t.sockets.len(), MAX_SOCKETS, "sockets")?;
    let n = t.gpus.len();
    if t.pairs.len() > n * n.saturating_sub(1) {
        return Err(format!(
            "it lists {} GPU pairs, but its {n} GPUs have {} ordered pairs; list each pair once, or none (artune derives them)",
            t.pairs.len(),
            n * n.saturating_sub(1)
        ));
    }

    let mut sockets = HashSet::new();
    for s in &t.sockets {
        if !sockets.insert(s.id) {
            return Err(format!("socket {} is listed twice", s.id));
        }
    }
    // Switches and root complexes share one name space: a parent names either.
    let mut ids = HashSet::new();
    for id in t
        .root_complexes
        .iter()
        .map(|r| &r.id)
        .chain(t.switches.iter().map(|s| &s.id))
    {
        check_id(id, "switch or root complex id")?;
        if !ids.insert(id.as_str()) {
            return Err(format!(
                "the id `{id}` is used twice; switch and root complex ids must be unique"
            ));
        }
    }
    let parents: HashMap<&str, &str> = t
        .switches
        .iter()
        .map(|s| (s.id.as_str(), s.parent.as_str()))
        .collect();
    for s in &t.switches {
        check_id(&s.parent, &format!("switch `{}` parent", s.id))?;
        let mut cur = s.parent.as_str();
        let mut depth = 1;
        while let Some(&up) = parents.get(cur) {
            depth += 1;
            if depth > MAX_SWITCH_DEPTH {
                return Err(format!(
                    "switch `{}` does not reach a root complex within {MAX_SWITCH_DEPTH} switches; its parents form a cycle or a chain too deep",
                    s.id
                ));
            }
            cur = up;
        }
    }
    crate::topology::normalize::index_order(&t.gpus)?;
    for g in &t.gpus {
        check_id(&g.parent, &format!("GPU {} parent", g.index))?;
        if g.nvlinks.len() > MAX_NVLINKS {
            return Err(format!(
                "GPU {} lists {} NVLinks; at most {MAX_NVLINKS} are supported",
                g.index,
                g.nvlinks.len()
            ));
        }
        let mut links = HashSet::new();
        for l in &g.nvlinks {
            if !links.insert(l.link) {
                return Err(format!("GPU {} lists NVLink {} twice", g.index, l.link));
            }
        }
        if g.memory_bytes
            .is_some_and(|m| m == 0 || m > MAX_GPU_MEMORY_BYTES)
        {
            return Err(format!(
                "GPU {} has {} bytes of memory; it must be 1 byte to 1 PiB",
                g.index,
                g.memory_bytes.unwrap_or(0)
            ));
        }
    }
    for (what, l) in t.links() {
        check_link(&what, l)?;
    }
    for (what, c) in contentions(t) {
        check_contention(&what, c)?;
    }
    for s in t.switches.iter().map(|s| (&s.id, &s.contention)) {
        if s.1.as_ref().is_some_and(|c| c.cpu_vendor.is_some()) {
            return Err(format!(
                "switch `{}` contention cpu_vendor is set; cpu_vendor belongs to a socket's contention",
                s.0
            ));
        }
    }
    for r in &t.root_complexes {
        if r.contention
            .as_ref()
            .is_some_and(|c| c.cpu_vendor.is_some())
        {
            return Err(format!(
                "root complex `{}` contention cpu_vendor is set; cpu_vendor belongs to a socket's contention",
                r.id
            ));
        }
    }
    if let Some(nv) = &t.nvswitch {
        if !(1..=16).contains(&nv.generation) {
            return Err(format!(
                "the NVSwitch has NVLink generation {}; it must be 1 to 16",
                nv.generation
            ));
        }
        positive("the NVSwitch gpu_gbps", nv.gpu_gbps)?;
        if let Some(v) = nv.latency_us {
            positive("the NVSwitch latency_us", v)?;
        }
    }
    let mut seen = HashSet::new();
    for p in &t.pairs {
        if !seen.insert((p.from, p.to)) {
            return Err(format!("pair {}→{} is listed twice", p.from, p.to));
        }
        if p.nvlinks as usize > MAX_NVLINKS {
            return Err(format!(
                "pair {}→{} has {} NVLinks; at most {MAX_NVLINKS} are supported",
                p.from, p.to, p.nvlinks
            ));
        }
    }
    let all = n * n.saturating_sub(1);
    if !t.pairs.is_empty() && t.pairs.len() != all {
        return Err(format!(
            "it lists {} of the {all} ordered GPU pairs; list every pair or none (artune derives them)",
            t.pairs.len()
        ));
    }
    Ok(())
}

/// Ids and parents: non-empty, short, printable, so every message that quotes one is one line.
fn check_id(id: &str, what: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_ID_BYTES || id.chars().any(char::is_control) {
        return Err(format!(
            "{what} \"{}\" is not a valid id; ids are 1 to {MAX_ID_BYTES} bytes without control characters",
            shorten(id)
        ));
    }
    Ok(())
}

fn positive(what: &str, v: f64) -> Result<(), String> {
    if v.is_finite() && v > 0.0 && v < 1e6 {
        Ok(())
    } else {
        Err(format!(
            "{what} is {v}; it must be a positive number below 1000000"
        ))
    }
}

/// PCIe generations 1 to 7 (sysfs knows 128 GT/s) and 1 to 32 lanes. Odd lane counts are left
/// alone: a discovered link reports what it reports, and nothing divides by it.
fn check_link(what: &str, l: &Link) -> Result<(), String> {
    for g in [l.gen, l.max_gen].into_iter().flatten() {
        if !(1..=7).contains(&g) {
            return Err(format!("{what} has PCIe generation {g}; it must be 1 to 7"));
        }
    }
    for w in [l.width, l.max_width].into_iter().flatten() {
        if !(1..=32).contains(&w) {
            return Err(format!(
                "{what} has width x{w}; a PCIe link has 1 to 32 lanes"
            ));
        }
    }
    Ok(())
}

fn contentions(t: &Topology) -> Vec<(String, &Contention)> {
    let mut out = Vec::new();
    for s in &t.sockets {
        out.extend(
            s.contention
                .as_ref()
                .map(|c| (format!("socket {} contention", s.id), c)),
        );
    }
    for r in &t.root_complexes {
        out.extend(
            r.contention
                .as_ref()
                .map(|c| (format!("root complex `{}` contention", r.id), c)),
        );
    }
    for s in &t.switches {
        out.extend(
            s.contention
                .as_ref()
                .map(|c| (format!("switch `{}` contention", s.id), c)),
        );
    }
    out
}

fn check_contention(what: &str, c: &Contention) -> Result<(), String> {
    for (name, v) in [
        ("peak_gbps", c.peak_gbps),
        ("write_collapse_gbps", c.write_collapse_gbps),
    ] {
        if let Some(v) = v {
            positive(&format!("{what} {name}"), v)?;
        }
    }
    if let Some(s) = c.slope {
        if !(s.is_finite() && (0.0..1e3).contains(&s)) {
            return Err(format!(
                "{what} slope is {s}; it must be 0 or more and below 1000"
            ));
        }
    }
    for (name, v) in [
        ("read_factor", c.read_factor),
        ("write_factor", c.write_factor),
    ] {
        if let Some(v) = v {
            check_factor(&format!("{what} {name}"), v)?;
        }
    }
    if let Some(v) = &c.cpu_vendor {
        check_id(v, &format!("{what} cpu_vendor"))?;
    }
    if let Some(k) = &c.kernel {
        for (name, v) in [
            ("kernel.store_factor", k.store_factor),
            ("kernel.load_factor", k.load_factor),
        ] {
            if let Some(v) = v {
                check_factor(&format!("{what} {name}"), v)?;
            }
        }
        check_curve(&format!("{what} kernel.store_curve"), &k.store_curve)?;
        check_curve(&format!("{what} kernel.load_curve"), &k.load_curve)?;
    }
    Ok(())
}

/// A share of a rate: above 0 (a node that passes nothing would stall every flow) and at most 1.
fn check_factor(what: &str, v: f64) -> Result<(), String> {
    if v > 0.0 && v <= 1.0 {
        Ok(())
    } else {
        Err(format!("{what} is {v}; it must be above 0 and at most 1"))
    }
}

/// Kernel-traffic curves: flows strictly increasing from 1, factors in (0, 1] that never rise
/// with more flows (more concurrent flows cannot make each one more efficient).
fn check_curve(what: &str, points: &[KernelPoint]) -> Result<(), String> {
    if points.len() > MAX_KERNEL_POINTS {
        return Err(format!(
            "{what} has {} points; at most {MAX_KERNEL_POINTS} are supported",
            points.len()
        ));
    }
    for (i, p) in points.iter().enumerate() {
        if p.flows == 0 {
            return Err(format!(
                "{what}[{i}] has flows 0; flows count concurrent kernel flows and start at 1"
            ));
        }
        check_factor(&format!("{what}[{i}] factor"), p.factor)?;
        if let Some(prev) = i.checked_sub(1).map(|j| points[j]) {
            if p.flows <= prev.flows {
                return Err(format!(
                    "{what}[{i}] has flows {} after {}; flows must increase from point to point",
                    p.flows, prev.flows
                ));
            }
            if p.factor > prev.factor {
                return Err(format!(
                    "{what}[{i}] factor {} at {} flows is above {} at {} flows; the factor must not rise with more flows",
                    p.factor, p.flows, prev.factor, prev.flows
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_is_named() {
        let full = crate::topology::presets::json("pcie-2x").unwrap();
        let err = parse(&full[..full.len() / 2]).unwrap_err();
        assert!(matches!(err, TopologyError::Json(_)), "{err:?}");
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    #[test]
    fn dangling_parent_is_named() {
        let mut t = crate::topology::presets::get("pcie-2x").unwrap();
        t.pairs.clear();
        t.gpus[1].parent = "nowhere".into();
        let text = serde_json::to_string(&t).unwrap();
        assert!(parse(&text).unwrap_err().to_string().contains("nowhere"));
    }

    #[test]
    fn roundtrip() {
        let t = crate::topology::presets::get("pcie-8x-2switch").unwrap();
        let text = serde_json::to_string_pretty(&t).unwrap();
        assert_eq!(parse(&text).unwrap(), t);
    }

    #[test]
    fn repeated_key_is_found_at_any_depth() {
        let e = check_json(r#"{"a": [{"b": 1, "c": {"d": 1, "d": 2}}]}"#).unwrap_err();
        assert!(
            e.contains("`a[0].c.d`") && e.contains("appears twice"),
            "{e}"
        );
        // Escapes do not hide a repeat: "\u0064" is "d".
        assert!(check_json(r#"{"d": 1, "\u0064": 2}"#)
            .unwrap_err()
            .contains("twice"));
        assert!(check_json(r#"{"a": {"d": 1}, "b": {"d": 1}}"#).is_ok());
    }

    #[test]
    fn depth_is_bounded() {
        let ok = format!(
            "{{\"a\":{}1{}}}",
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert!(check_json(&ok).is_ok());
        let deep = format!(
            "{{\"a\":{}1{}}}",
            "[".repeat(MAX_DEPTH),
            "]".repeat(MAX_DEPTH)
        );
        assert!(check_json(&deep)
            .unwrap_err()
            .contains("nested more than 32 deep"));
    }

    #[test]
    fn locate_names_the_path() {
        let text = r#"{"gpus": [{"a": 1}, {"pcie": {"gen": "x"}}]}"#;
        let at = text.find("\"x\"").unwrap() + 2;
        assert_eq!(locate(text, at, false), "gpus[1].pcie.gen");
        assert_eq!(locate(text, at, true), "gpus[1].pcie");
    }
}

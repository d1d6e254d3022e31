//! The shape of the source tree, as CONTRIBUTING.md describes it: data flows one way, so the
//! modules at the bottom (the machine, the measurements handed over, the seam's errors) name
//! nothing above them; the CUDA coordinator's parts form no circle; a module with children is
//! a folder's mod.rs; and no function runs over 150 lines.

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// `text` up to its test module (`#[cfg(test)]` on a `mod`): tests may reach anywhere.
fn code(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            lines[i].trim() == "#[cfg(test)]"
                && lines
                    .get(i + 1)
                    .is_some_and(|l| l.trim_start().starts_with("mod "))
        })
        .unwrap_or(lines.len());
    lines[..end].join("\n")
}

/// Every .rs file under `dir`, with its code (see [`code`]).
fn sources(dir: &str) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![Path::new(ROOT).join(dir)];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("tests.rs") {
            let text = std::fs::read_to_string(&p).unwrap();
            out.push((p, code(&text)));
        }
    }
    if out.is_empty() {
        out.push((Path::new(ROOT).join(format!("{dir}.rs")), String::new()));
        let p = Path::new(ROOT).join(dir);
        if let Ok(t) = std::fs::read_to_string(&p) {
            out[0] = (p, code(&t));
        }
    }
    out
}

/// Lines of code (comments left out) in `text` that name `path`.
fn naming<'a>(text: &'a str, path: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .filter(|l| l.contains(path))
        .collect()
}

#[test]
fn the_bottom_of_the_flow_names_nothing_above_it() {
    // (files, a path they must not name, why)
    let rules: [(&str, &str, &str); 6] = [
        (
            "src/topology",
            "crate::profile",
            "the machine's reading is below the profile",
        ),
        (
            "src/results.rs",
            "crate::profile",
            "what the harness hands over is below the profile",
        ),
        (
            "src/results.rs",
            "crate::measure",
            "measure hands results over, not the reverse",
        ),
        (
            "src/fabric/error.rs",
            "fabric::cuda",
            "the seam's errors may not depend on CUDA",
        ),
        (
            "src/fabric/mod.rs",
            "cuda::",
            "the seam may not depend on one fabric behind it",
        ),
        (
            "src/allreduce",
            "crate::",
            "the shared vocabulary is the bottom",
        ),
    ];
    let mut broken = Vec::new();
    for (dir, path, why) in rules {
        for (file, code) in sources(dir) {
            for line in naming(&code, path) {
                if file.ends_with("fabric/mod.rs") && line.trim_start().starts_with("pub mod cuda")
                {
                    continue;
                }
                broken.push(format!("{}: `{}` ({why})", file.display(), line.trim()));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_coordinators_parts_form_no_circle() {
    let dir = "src/fabric/cuda/coordinator";
    let files: Vec<(String, String)> = sources(dir)
        .into_iter()
        .filter(|(p, _)| p.parent().unwrap().ends_with("coordinator"))
        .map(|(p, code)| (p.file_stem().unwrap().to_string_lossy().into_owned(), code))
        .collect();
    let names: Vec<&str> = files
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| *n != "mod")
        .collect();
    assert!(
        names.contains(&"group") && names.contains(&"processes"),
        "{names:?}"
    );
    // Edges: a file naming `super::other`.
    let edges: Vec<(&str, &str)> = files
        .iter()
        .flat_map(|(from, code)| {
            names
                .iter()
                .filter(move |to| **to != from.as_str())
                .filter(move |to| !naming(code, &format!("super::{to}")).is_empty())
                .map(move |to| (from.as_str(), *to))
        })
        .filter(|(from, _)| *from != "mod")
        .collect();
    // Depth-first search for a cycle.
    fn reaches(edges: &[(&str, &str)], from: &str, to: &str, seen: &mut Vec<String>) -> bool {
        if seen.iter().any(|s| s == from) {
            return false;
        }
        seen.push(from.to_string());
        edges
            .iter()
            .filter(|(a, _)| *a == from)
            .any(|(_, b)| *b == to || reaches(edges, b, to, seen))
    }
    let circles: Vec<String> = edges
        .iter()
        .filter(|(a, b)| reaches(&edges, b, a, &mut Vec::new()))
        .map(|(a, b)| format!("{a} -> {b}"))
        .collect();
    assert!(
        circles.is_empty(),
        "edges in a circle: {circles:?} (all: {edges:?})"
    );
}

/// Modules kept as foo.rs beside foo/ by their owners for now: the simulator's (issue #34).
const OLD_STYLE: [&str; 2] = ["src/fabric/sim/net.rs", "src/fabric/sim/nccl.rs"];

#[test]
fn a_module_with_children_is_a_folders_mod_rs() {
    let both: Vec<String> = sources("src")
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n != "mod.rs" && n != "lib.rs" && n != "main.rs")
        })
        .filter(|p| p.with_extension("").is_dir())
        .map(|p| p.strip_prefix(ROOT).unwrap().display().to_string())
        .filter(|p| !OLD_STYLE.contains(&p.as_str()))
        .collect();
    assert!(
        both.is_empty(),
        "move each to its folder's mod.rs: {both:?}"
    );
}

/// Functions over the limit that their owners are splitting: the simulator's network model
/// (issue #34) and the vLLM and SGLang exports (issue #36). Remove an entry when it is done.
const LONG_FOR_NOW: [&str; 3] = [
    "src/fabric/sim/net.rs: build",
    "src/export/sglang/file.rs: export",
    "src/export/vllm.rs: export",
];

#[test]
fn no_function_runs_over_150_lines() {
    let mut long = Vec::new();
    for (file, code) in sources("src") {
        let lines: Vec<&str> = code.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            let Some(rest) = [
                "pub fn ",
                "fn ",
                "pub(crate) fn ",
                "pub(super) fn ",
                "unsafe fn ",
                "pub unsafe fn ",
            ]
            .iter()
            .find_map(|k| t.strip_prefix(k)) else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let indent = line.len() - t.len();
            // The body ends at the first line back at the signature's indent that closes it.
            let close = format!("{}}}", " ".repeat(indent));
            let end = lines[i..]
                .iter()
                .position(|l| l.as_bytes().starts_with(close.as_bytes()))
                .map_or(0, |e| e + 1);
            let rel = file.strip_prefix(ROOT).unwrap().display().to_string();
            if end > 150 && !LONG_FOR_NOW.contains(&format!("{rel}: {name}").as_str()) {
                long.push(format!("{rel}: {name} ({end} lines)"));
            }
        }
    }
    assert!(long.is_empty(), "split these: {long:?}");
}

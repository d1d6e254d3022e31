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

/// The top-level modules each line of `text` names, `crate::a::..` and `crate::{a, b}` alike.
fn tops_named(text: &str) -> Vec<String> {
    let word = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (i, _) in line.match_indices("crate::") {
            let rest = &line[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = group.split('}').next().unwrap_or("");
                out.extend(group.split(',').map(|s| word(s.trim())));
            } else {
                out.push(word(rest));
            }
        }
    }
    out.retain(|w| !w.is_empty());
    out
}

/// `text` without its `#[cfg(test)]` modules, and the names of those declared in other files.
fn without_tests(text: &str) -> (String, Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let (mut kept, mut test_files) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < lines.len() {
        let next = lines.get(i + 1).map_or("", |l| l.trim());
        if lines[i].trim() == "#[cfg(test)]" && next.starts_with("mod ") {
            if let Some(name) = next.strip_prefix("mod ").and_then(|n| n.strip_suffix(';')) {
                test_files.push(name.to_string());
                i += 2;
                continue;
            }
            // An inline module: skip to the brace that closes it.
            let mut depth = 0i32;
            i += 1;
            while i < lines.len() {
                depth +=
                    lines[i].matches('{').count() as i32 - lines[i].matches('}').count() as i32;
                i += 1;
                if depth <= 0 && lines[i - 1].contains('}') {
                    break;
                }
            }
            continue;
        }
        kept.push(lines[i]);
        i += 1;
    }
    (kept.join("\n"), test_files)
}

/// Every .rs file under src/ that is not a test file, with its code outside test modules.
fn non_test_sources() -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    let mut stack = vec![Path::new(ROOT).join("src")];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
    let mut test_only: Vec<PathBuf> = Vec::new();
    let mut out = Vec::new();
    for p in &files {
        let (code, tests) = without_tests(&std::fs::read_to_string(p).unwrap());
        let stem = p.file_stem().unwrap().to_string_lossy();
        let dir = if ["mod", "lib", "main"].contains(&stem.as_ref()) {
            p.parent().unwrap().to_path_buf()
        } else {
            p.with_extension("")
        };
        for t in tests {
            test_only.push(dir.join(format!("{t}.rs")));
            test_only.push(dir.join(t));
        }
        out.push((p.clone(), code));
    }
    out.retain(|(p, _)| !test_only.iter().any(|t| p.starts_with(t)));
    out
}

#[test]
fn no_two_top_level_modules_name_each_other() {
    let src = Path::new(ROOT).join("src");
    let mut edges: Vec<(String, String)> = Vec::new();
    for (path, text) in non_test_sources() {
        let rel = path.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let from = first.trim_end_matches(".rs").to_string();
        if from == "lib" || from == "main" {
            continue;
        }
        for to in tops_named(&text) {
            if to != from && !edges.contains(&(from.clone(), to.clone())) {
                edges.push((from.clone(), to));
            }
        }
    }
    assert!(
        edges.len() > 50,
        "the scan found too few imports: {edges:?}"
    );
    let mut pairs: Vec<String> = edges
        .iter()
        .filter(|(a, b)| a < b && edges.contains(&(b.clone(), a.clone())))
        .map(|(a, b)| format!("{a} <-> {b}"))
        .collect();
    pairs.sort();
    assert!(
        pairs.is_empty(),
        "top-level modules that name each other (move what one borrows to where it belongs): {}",
        pairs.join(", ")
    );
}

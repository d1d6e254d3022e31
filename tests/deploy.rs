//! The image deploy/kubernetes/ names can be built from what is here, checked without Docker
//! (no daemon runs in CI): deploy/Dockerfile and the GUIDE build and tag the image the
//! manifests name; every file the crate embeds at compile time is in the build context
//! .dockerignore leaves; the Rust image is new enough for the crate; and the binary and the
//! plugin library land where artune finds the library to name it for NCCL.

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(p: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// The images the Kubernetes manifests run.
fn images() -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(Path::new(ROOT).join("deploy/kubernetes")).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        for l in text.lines() {
            if let Some(i) = l.trim().strip_prefix("image:") {
                out.push(i.split('#').next().unwrap().trim().to_string());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn the_dockerfile_builds_the_image_the_manifests_name() {
    let images = images();
    assert!(!images.is_empty());
    let (dockerfile, guide) = (read("deploy/Dockerfile"), read("docs/GUIDE.md"));
    for image in &images {
        let tag = format!("-t {image} .");
        assert!(
            dockerfile.contains(&tag),
            "deploy/Dockerfile does not build {image}"
        );
        assert!(
            guide.contains(&tag),
            "GUIDE's build command does not tag {image}"
        );
        assert!(
            guide.contains("docker build -f deploy/Dockerfile"),
            "no build recipe in GUIDE"
        );
    }
}

/// Whether `.dockerignore` (its patterns: a path, `*` within a name, `**/` any depth) leaves
/// `path`, relative to the root, in the build context.
fn in_context(ignore: &[String], path: &str) -> bool {
    fn glob(p: &str, s: &str) -> bool {
        match p.split_once('*') {
            None => p == s,
            Some((a, b)) => {
                s.starts_with(a)
                    && (0..=s.len() - a.len()).any(|i| {
                        let rest = &s[a.len() + i..];
                        !s[a.len()..a.len() + i].contains('/') && glob(b, rest)
                    })
            }
        }
    }
    !ignore.iter().any(|pat| {
        let (pat, any_depth) = match pat.strip_prefix("**/") {
            Some(p) => (p, true),
            None => (pat.as_str(), false),
        };
        let parts: Vec<&str> = path.split('/').collect();
        let starts: Vec<usize> = if any_depth {
            (0..parts.len()).collect()
        } else {
            vec![0]
        };
        starts
            .iter()
            .any(|&s| (s + 1..=parts.len()).any(|e| glob(pat, &parts[s..e].join("/"))))
    })
}

#[test]
fn every_file_the_build_embeds_is_in_the_build_context() {
    let ignore: Vec<String> = read(".dockerignore")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    assert!(!in_context(&ignore, "target/release/artune"));
    assert!(!in_context(&ignore, "python/artune/__pycache__/x.pyc"));
    assert!(in_context(&ignore, "src/main.rs"));
    let mut stack = vec![PathBuf::from(ROOT).join("src")];
    let mut embedded = Vec::new();
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        for (i, _) in text
            .match_indices("include_str!(\"")
            .chain(text.match_indices("include_bytes!(\""))
        {
            let start = text[i..].find('"').unwrap() + i + 1;
            let rel = &text[start..start + text[start..].find('"').unwrap()];
            let file = p.parent().unwrap().join(rel).canonicalize().unwrap();
            embedded.push(file.strip_prefix(ROOT).unwrap().display().to_string());
        }
    }
    assert!(
        embedded.iter().any(|e| e.starts_with("kernels/")),
        "{embedded:?}"
    );
    for needed in embedded.iter().map(String::as_str).chain([
        "Cargo.toml",
        "Cargo.lock",
        "build.rs",
        "benches/tune.rs",
    ]) {
        assert!(
            in_context(&ignore, needed),
            "{needed} is left out of the Docker build context"
        );
    }
}

#[test]
fn the_rust_image_is_new_enough_and_the_files_land_where_artune_looks() {
    let dockerfile = read("deploy/Dockerfile");
    let want = read("Cargo.toml")
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap();
    let from = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("FROM rust:"))
        .expect("a rust build stage");
    let have = from.split('-').next().unwrap();
    // Major, minor, patch: "1.88" is "1.88.0".
    let num = |v: &str| {
        let mut n: Vec<u32> = v.split('.').map(|x| x.parse().unwrap()).collect();
        n.resize(3, 0);
        n
    };
    assert!(
        num(have) >= num(&want),
        "rust:{have} is older than rust-version {want}"
    );
    // And rust-version is new enough for every locked dependency (libloading 0.9.1 asked for
    // 1.88 while it said 1.85, so rust:1.85 could not build the image).
    let meta = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .current_dir(ROOT)
        .output()
        .expect("cargo metadata runs");
    assert!(
        meta.status.success(),
        "{}",
        String::from_utf8_lossy(&meta.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&meta.stdout).unwrap();
    for p in meta["packages"].as_array().unwrap() {
        if let Some(v) = p["rust_version"].as_str() {
            let (name, version) = (&p["name"], &p["version"]);
            assert!(
                num(v) <= num(&want),
                "{name} {version} needs Rust {v}, above rust-version {want}"
            );
        }
    }
    assert!(read("README.md").contains(&format!("A Rust toolchain ({want}+)")));
    // plugin::library looks beside the binary, then in ../lib.
    for copy in [
        "target/release/artune /usr/local/bin/artune",
        "target/release/libartune.so /usr/local/lib/libartune.so",
    ] {
        assert!(
            dockerfile.contains(copy),
            "the image does not install {copy}"
        );
    }
    assert!(dockerfile.contains("NVIDIA_DRIVER_CAPABILITIES=compute,utility"));
}

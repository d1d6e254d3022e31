//! Two jobs. Always: the commit the binary was built from, for `artune --version` (from git, or
//! `ARTUNE_COMMIT` where a package is built from a tarball; "unknown" when neither says).
//! Only for the Python package: with `--features python` (maturin), also build the plain
//! `libartune.so` — the C ABI and NCCL tuner plugin without Python — and put it in the Python
//! package beside the extension module, where `artune.plugin_path()` finds it. NCCL loads the
//! plugin into processes that need not be Python, so it cannot be the extension module, which
//! expects the interpreter's symbols. The same build makes the `artune` binary, put where the
//! wheel's data `scripts/artune` links to (pyproject.toml `data`; maturin copies the file a
//! link names), which pip installs as `bin/artune`: so
//! `pip install artune` gives the whole tool, as ruff's and uv's wheels do. Every other build
//! does nothing here.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    commit();
    if std::env::var_os("CARGO_FEATURE_PYTHON").is_none() {
        return;
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    // A target directory of its own: the outer build holds the lock on its own one.
    let target = out.join("plain");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--release",
        "--lib",
        "--bin",
        "artune",
        "--locked",
        "--target-dir",
    ])
    .arg(&target)
    .arg("--manifest-path")
    .arg(manifest.join("Cargo.toml"))
    .current_dir(&manifest)
    // NCCL maps the plugin into every engine process, and the binary is in every wheel:
    // no debug info to carry along.
    .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
    .env("CARGO_PROFILE_RELEASE_STRIP", "symbols");
    // The outer build's feature flags and flags for the extension module must not leak into it.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("CARGO_FEATURE_")
            || k.starts_with("CARGO_CFG_")
            || k == "RUSTFLAGS"
            || k == "CARGO_ENCODED_RUSTFLAGS"
            || k == "CARGO_TARGET_DIR"
        {
            cmd.env_remove(&k);
        }
    }
    let status = cmd.status().expect("cargo runs");
    assert!(status.success(), "building the plain libartune.so failed");
    let built = target.join("release").join("libartune.so");
    let dest = manifest.join("python").join("artune").join("libartune.so");
    copy(&built, &dest);
    // python/artune.data/scripts/artune, the wheel's script, is a link to this file.
    let cli = manifest.join("python").join(".cli");
    std::fs::create_dir_all(&cli)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", cli.display()));
    copy(&target.join("release").join("artune"), &cli.join("artune"));
    for f in ["src", "kernels", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={f}");
    }
}

fn copy(from: &std::path::Path, to: &std::path::Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("cannot copy {} to {}: {e}", from.display(), to.display()));
}

/// Sets `ARTUNE_COMMIT` for the crate: the short hash of HEAD (a work tree's uncommitted
/// changes are not tracked, that would rebuild on every edit), and reruns when HEAD moves.
fn commit() {
    println!("cargo:rerun-if-env-changed=ARTUNE_COMMIT");
    let git = |args: &[&str]| -> Option<String> {
        let o = Command::new("git").args(args).output().ok()?;
        let s = String::from_utf8(o.stdout).ok()?.trim().to_string();
        (o.status.success() && !s.is_empty()).then_some(s)
    };
    let hash = std::env::var("ARTUNE_COMMIT")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let (Some(common), Some(head)) = (
            git(&["rev-parse", "--git-common-dir"]),
            git(&["symbolic-ref", "-q", "HEAD"]),
        ) {
            println!("cargo:rerun-if-changed={common}/{head}");
            println!("cargo:rerun-if-changed={common}/packed-refs");
        }
    }
    println!(
        "cargo:rustc-env=ARTUNE_COMMIT={}",
        hash.unwrap_or_else(|| "unknown".into())
    );
}

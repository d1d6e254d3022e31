//! The command line's edge through the binary: a closed standard output is a quiet success for
//! every command, and a bug in artune has an exit code of its own.

mod common;

use std::path::{Path, PathBuf};

use common::{artune, text, tuned, with_closed_stdout};

/// A small simulated profile, tuned once per test binary.
fn profile(dir: &Path) -> PathBuf {
    let args = [
        "--sim",
        "pcie-4x-1switch",
        "--tp",
        "4",
        "--mode",
        "graph",
        "--sizes",
        "4K:1M",
    ];
    tuned(dir, "p.json", &args)
}

#[test]
fn every_command_into_a_closed_pipe_exits_0_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile(dir.path());
    let p = p.to_str().unwrap();
    let out = dir.path().join("again.json");
    let commands: Vec<Vec<&str>> = vec![
        vec!["topo", "--sim", "pcie-8x-2switch"],
        vec!["topo", "--sim", "pcie-8x-2switch", "--json"],
        vec!["topo", "--list-presets"],
        vec![
            "tune",
            "--sim",
            "pcie-8x-2switch",
            "--tp",
            "8",
            "--mode",
            "graph",
            "--sizes",
            "4K:64K",
            "--no-contention",
            "--out",
            out.to_str().unwrap(),
        ],
        vec!["show", p],
        vec!["show", p, "--json"],
        vec!["select", p, "--tp", "4", "--bytes", "64K"],
        vec!["select", p, "--tp", "4", "--bytes", "64K", "--json"],
        vec!["export", p, "--engine", "sglang"],
        vec!["export", p, "--engine", "env"],
        vec!["why", p, "--tp", "4", "--bytes", "64K"],
        vec!["why", p, "--tp", "4", "--bytes", "64K", "--json"],
        vec!["check", p, "--sim", "pcie-4x-1switch"],
        vec!["predict", p, "--workload", "10x4096xbf16@1..4"],
        vec!["schema"],
        vec!["compare", p, p],
        vec!["doctor", "--sim", "pcie-8x-2switch"],
        vec!["doctor", "--sim", "pcie-8x-2switch", "--json"],
        vec!["fleet", dir.path().to_str().unwrap()],
    ];
    for args in commands {
        let o = with_closed_stdout(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
        assert!(
            !err.contains("error") && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    // The tune still wrote its profile: the pipe only closed on the summary printed after it.
    assert!(out.exists());
}

#[test]
fn a_bug_in_artune_exits_70_with_one_line_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let o = artune(&[
        "tune",
        "--sim",
        "pcie-2x",
        "--mode",
        "graph",
        "--sizes",
        "4K:64K",
        "--no-contention",
        "--sim-faults",
        "panic=20",
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(70), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: internal error (simulated bug"),
        "{err}"
    );
    assert!(err.contains("bug in artune"), "{err}");
    assert!(!out.exists());
}

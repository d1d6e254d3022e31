//! Verdicts survive a closed pipe: `artune doctor | grep -q fail` style pipelines close standard
//! output early, and doctor (4/5), fleet (5) and check (3) must still exit with their verdict.

mod common;

use common::{text, tuned, with_closed_stdout};

fn fixture(p: &str) -> String {
    format!("{}/tests/fixtures/doctor/{p}", env!("CARGO_MANIFEST_DIR"))
}

/// Doctor on a fixture topology and sysfs tree, standard output already closed.
fn doctor(tree: &str) -> std::process::Output {
    let (topo, sys, proc) = (
        fixture("two-gpus.json"),
        fixture(&format!("{tree}/sys")),
        fixture(&format!("{tree}/proc")),
    );
    with_closed_stdout(&[
        "doctor",
        "--topology",
        &topo,
        "--sysfs-root",
        &sys,
        "--proc-root",
        &proc,
    ])
}

#[test]
fn doctor_keeps_4_and_5_when_stdout_closes() {
    let o = doctor("acs-on");
    assert_eq!(o.status.code(), Some(4), "{}", text(&o.stderr));
    let o = doctor("acs-root");
    assert_eq!(o.status.code(), Some(5), "{}", text(&o.stderr));
}

#[test]
fn fleet_keeps_5_and_check_keeps_3_when_stdout_closes() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = dir.path().join("nodes");
    std::fs::create_dir(&nodes).unwrap();
    let args = [
        "--sim",
        "pcie-4x-1switch",
        "--tp",
        "4",
        "--mode",
        "graph",
        "--sizes",
        "4K:1M",
        "--no-contention",
    ];
    let p = tuned(&nodes, "a.json", &args);
    std::fs::write(nodes.join("broken.json"), "{").unwrap();
    let o = with_closed_stdout(&["fleet", nodes.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(5), "{}", text(&o.stderr));
    // The profile was made for another machine: stale, whoever reads the output.
    let o = with_closed_stdout(&["check", p.to_str().unwrap(), "--sim", "pcie-8x-2switch"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("stale"), "{}", text(&o.stderr));
}

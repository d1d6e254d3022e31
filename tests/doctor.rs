//! `artune doctor` through the binary, against the fixture sysfs trees and topology files under
//! tests/fixtures/doctor/ (written by make.py there): ACS on and off, the IOMMU translating, off
//! and in passthrough, a link at Gen4 x8, config space as a non-root user reads it.

mod common;

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

fn fixture(p: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/doctor")
        .join(p)
        .display()
        .to_string()
}

/// Runs doctor on a fixture topology file and sysfs tree, in a clean environment.
fn doctor(topology: &str, tree: &str, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let (sys, proc) = (
        fixture(&format!("{tree}/sys")),
        fixture(&format!("{tree}/proc")),
    );
    let mut args = vec![
        "doctor".to_string(),
        "--topology".into(),
        fixture(topology),
        "--sysfs-root".into(),
        sys,
        "--proc-root".into(),
        proc,
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    run(&args, env)
}

fn run(args: &[String], env: &[(&str, &str)]) -> Output {
    let mut c = common::dies_with_test(common::BIN);
    c.args(args).env_clear().env("PATH", "/usr/bin:/bin");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("artune runs")
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// (status, evidence, action) of one check.
fn check(report: &Value, id: &str) -> (String, String, String) {
    let c = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no check {id}: {report}"));
    let s = |k: &str| c[k].as_str().unwrap().to_string();
    (s("status"), s("evidence"), s("action"))
}

#[test]
fn acs_on_and_iommu_translating_fail_with_the_ports_named() {
    let o = doctor("two-gpus.json", "acs-on", &["--json"], &[]);
    assert_eq!(o.status.code(), Some(4), "a failure exits 4");
    let r = json(&o);
    let (st, ev, act) = check(&r, "acs");
    assert_eq!(st, "fail");
    assert!(
        ev.contains("0000:02:00.0") && ev.contains("0000:02:01.0"),
        "{ev}"
    );
    assert!(
        !ev.contains("0000:00:01.0"),
        "the root port redirects nothing: {ev}"
    );
    assert!(
        act.contains("setpci -s 0000:02:00.0 ECAP_ACS+6.w=0000"),
        "{act}"
    );
    let (st, ev, act) = check(&r, "iommu");
    assert_eq!(st, "warn");
    assert!(
        ev.contains("DMA-FQ") && ev.contains("intel_iommu=on"),
        "{ev}"
    );
    assert!(act.contains("iommu=pt"));
    assert_eq!(r["exit_code"], 4);
    assert_eq!(r["simulated"], true);
    assert_eq!(r["summary"]["fail"], 1);
}

#[test]
fn acs_off_and_no_iommu_pass() {
    let o = doctor("two-gpus.json", "acs-off", &["--json"], &[]);
    let r = json(&o);
    assert_eq!(o.status.code(), Some(0), "{r}");
    assert_eq!(check(&r, "acs").0, "ok");
    assert!(check(&r, "acs").1.contains("3 ports"));
    let (st, ev, _) = check(&r, "iommu");
    assert_eq!(st, "ok");
    assert!(ev.contains("no IOMMU is active"), "{ev}");
    let (st, ev, _) = check(&r, "bar1");
    assert_eq!(st, "ok", "BAR1 from the sysfs resource file");
    assert!(ev.contains("256.0 GiB for 140.4 GiB"), "{ev}");
    // NVML is not read for a model: unknown, and the exit code ignores it.
    assert_eq!(check(&r, "persistence").0, "unknown");
    for c in r["checks"].as_array().unwrap() {
        assert!(!c["evidence"].as_str().unwrap().is_empty());
        assert!(!c["action"].as_str().unwrap().is_empty());
    }
}

#[test]
fn a_link_at_gen4_x8_fails_and_passthrough_is_ok() {
    let o = doctor("two-gpus-gen4x8.json", "gen4x8", &["--json"], &[]);
    assert_eq!(o.status.code(), Some(4));
    let r = json(&o);
    let (st, ev, act) = check(&r, "links");
    assert_eq!(st, "fail");
    assert!(
        ev.contains("GPU 1 PCIe link Gen4 x8 (max Gen5 x16)"),
        "{ev}"
    );
    assert!(act.contains("reseat"), "{act}");
    let (st, ev, _) = check(&r, "iommu");
    assert_eq!(st, "ok");
    assert!(ev.contains("identity") && ev.contains("iommu=pt"), "{ev}");
}

#[test]
fn acs_at_the_root_port_only_warns() {
    let o = doctor("two-gpus.json", "acs-root", &["--json"], &[]);
    assert_eq!(o.status.code(), Some(5));
    let (st, ev, _) = check(&json(&o), "acs");
    assert_eq!(st, "warn");
    assert!(
        ev.contains("root port 0000:00:01.0 (ACSCtl 0x001d)"),
        "{ev}"
    );
}

#[test]
fn unreadable_config_space_is_unknown_not_a_crash() {
    let o = doctor("two-gpus.json", "user", &["--json"], &[]);
    assert_eq!(o.status.code(), Some(0));
    let (st, ev, act) = check(&json(&o), "acs");
    assert_eq!(st, "unknown");
    assert!(
        ev.contains("only 64 bytes") && act.contains("as root"),
        "{ev}"
    );
}

#[test]
fn warnings_only_exit_5_and_name_the_variables() {
    let env = [("NCCL_P2P_DISABLE", "1"), ("NCCL_IB_HCA", "mlx5")];
    let o = doctor("two-gpus.json", "acs-off", &[], &env);
    assert_eq!(o.status.code(), Some(5), "warnings only exit 5");
    let text = String::from_utf8(o.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("warn"))
        .expect("a warn line");
    assert!(
        line.contains("environment") && line.contains("NCCL_P2P_DISABLE=1"),
        "{line}"
    );
    assert!(
        text.contains("do: tune without them (`env -u NCCL_P2P_DISABLE artune tune`)"),
        "{text}"
    );
    assert!(text.contains("0 fail"), "{text}");
}

#[test]
fn unlike_gpus_and_refused_p2p_in_one_switch() {
    let o = doctor("unlike-no-p2p.json", "acs-off", &["--json"], &[]);
    let r = json(&o);
    assert_eq!(o.status.code(), Some(4));
    let (st, ev, _) = check(&r, "islands");
    assert_eq!(st, "warn");
    assert!(
        ev.contains("NVIDIA H100 80GB HBM3") && ev.contains("NVIDIA H200"),
        "{ev}"
    );
    let (st, ev, _) = check(&r, "p2p");
    assert_eq!(st, "fail");
    assert!(ev.contains("0→1 (PIX)"), "{ev}");
    // --measure does not try a pair the driver refuses: the finding stays the driver's.
    let o = doctor(
        "unlike-no-p2p.json",
        "acs-off",
        &["--json", "--measure"],
        &[],
    );
    let (st, ev, _) = check(&json(&o), "p2p");
    assert_eq!(st, "fail");
    assert!(ev.contains("no P2P between GPUs under one switch"), "{ev}");
}

#[test]
fn measure_finds_p2p_that_corrupts_on_the_simulated_fabric() {
    let args = |faults: Option<&str>| {
        let mut a: Vec<String> = ["doctor", "--sim", "pcie-4x-1switch", "--measure", "--json"]
            .map(String::from)
            .to_vec();
        if let Some(f) = faults {
            a.extend(["--sim-faults".to_string(), f.to_string()]);
        }
        a
    };
    let o = run(&args(None), &[]);
    let r = json(&o);
    assert_eq!(r["measured"], true);
    let (st, ev, _) = check(&r, "p2p");
    assert_eq!(st, "ok");
    assert!(ev.contains("a transfer verified 6 pairs"), "{ev}");
    let o = run(&args(Some("wrong=one_stage_pull")), &[]);
    assert_eq!(o.status.code(), Some(4));
    let (st, ev, _) = check(&json(&o), "p2p");
    assert_eq!(st, "fail");
    assert!(
        ev.contains("6 of 6 pairs") && ev.contains("wrong data"),
        "{ev}"
    );
}

#[test]
fn versions_against_a_profile() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.json");
    let tune = run(
        &[
            "tune",
            "--topology",
            &fixture("two-gpus.json"),
            "--tp",
            "2",
            "--sizes",
            "1K:4K",
            "--mode",
            "graph",
            "--no-contention",
            "--out",
            p.to_str().unwrap(),
        ]
        .map(String::from),
        &[],
    );
    assert!(
        tune.status.success(),
        "{}",
        String::from_utf8_lossy(&tune.stderr)
    );
    // A simulated profile is a warning against any machine, the model it came from included:
    // engines refuse it.
    let o = doctor(
        "two-gpus.json",
        "acs-off",
        &["--json", "--profile", p.to_str().unwrap()],
        &[],
    );
    assert_eq!(o.status.code(), Some(5));
    let (st, ev, act) = check(&json(&o), "versions");
    assert_eq!(st, "warn");
    assert!(ev.contains("is a SIMULATED profile"), "{ev}");
    assert!(
        act.contains(&format!("`artune tune --out {}`", p.display())),
        "{act}"
    );
    // The profile's versions are the model's; as if measured, pretend the driver was upgraded.
    let mut v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    v["versions"]["driver"] = "570.86.15".into();
    v["simulated"] = false.into();
    v["fabric"] = "CUDA, 2 GPUs".into();
    std::fs::write(&p, v.to_string()).unwrap();
    let o = doctor(
        "two-gpus.json",
        "acs-off",
        &["--json", "--profile", p.to_str().unwrap()],
        &[],
    );
    assert_eq!(o.status.code(), Some(5));
    let (st, ev, act) = check(&json(&o), "versions");
    assert_eq!(st, "warn");
    assert!(ev.contains("driver 570.86.15 → 580.159.04"), "{ev}");
    assert!(
        act.contains("artune check") && act.contains("--measure"),
        "{act}"
    );
}

/// A SIMULATED profile of other GPUs is stale against the model as `artune check` judges it,
/// and the versions check says so, not only that it is simulated.
#[test]
fn versions_say_a_simulated_profile_of_other_gpus_is_stale() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.json");
    let p = p.to_str().unwrap();
    let owned = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let tune = [
        "tune",
        "--sim",
        "pcie-8x-2switch",
        "--tp",
        "2",
        "--sizes",
        "1K:4K",
        "--out",
        p,
    ];
    let tune = run(&owned(&tune), &[]);
    assert!(
        tune.status.success(),
        "{}",
        String::from_utf8_lossy(&tune.stderr)
    );
    let checked = run(&owned(&["check", p, "--sim", "pcie-4x-1switch"]), &[]);
    assert_eq!(checked.status.code(), Some(3));
    let args = [
        "doctor",
        "--json",
        "--profile",
        p,
        "--sim",
        "pcie-4x-1switch",
    ];
    let (st, ev, act) = check(&json(&run(&owned(&args), &[])), "versions");
    assert_eq!(st, "warn");
    assert!(
        ev.contains("GPU count 8 → 4") && ev.contains("SIMULATED"),
        "{ev}"
    );
    assert!(act.contains("exits 3 until then"), "{act}");
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let cases: [&[&str]; 3] = [
        &["doctor", "--topology", "/nonexistent/t.json"],
        &["doctor", "--sim-faults", "wrong=nccl"],
        &[
            "doctor",
            "--sim",
            "pcie-2x",
            "--profile",
            "/nonexistent/p.json",
        ],
    ];
    for args in cases {
        let o = run(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>(), &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8(o.stderr).unwrap();
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(o.stdout.is_empty());
    }
}

#[test]
fn the_real_machine_never_crashes() {
    // Here (CI, no GPU) NVML is missing: the driver check fails, the rest is unknown or ok.
    for extra in [&[][..], &["--json"][..], &["--measure", "--json"][..]] {
        let mut args = vec!["doctor".to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let o = run(&args, &[]);
        let code = o.status.code();
        assert!(
            matches!(code, Some(0 | 4 | 5)),
            "{code:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!String::from_utf8_lossy(&o.stderr).contains("internal error"));
        // Where NVML cannot be loaded, the driver check says so once, not every check.
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.matches("NVIDIA management library").count() <= 1,
            "{out}"
        );
        if extra.contains(&"--json") {
            let r = json(&o);
            assert_eq!(r["checks"].as_array().unwrap().len(), 11);
            assert_eq!(r["simulated"], false);
        }
    }
}

#[test]
fn an_environment_value_that_is_not_utf8_is_named() {
    use std::os::unix::ffi::OsStrExt;
    let o = common::dies_with_test(common::BIN)
        .args(["doctor", "--sim", "pcie-2x", "--json"])
        .env_clear()
        .env("NCCL_ALGO", std::ffi::OsStr::from_bytes(b"Ri\xffng"))
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (st, ev, _) = check(&json(&o), "environment");
    assert_eq!(st, "warn");
    assert!(ev.contains("NCCL_ALGO=Ri"), "{ev}");
}

#[test]
fn a_busy_gpu_is_a_warning_naming_who() {
    let dir = tempfile::tempdir().unwrap();
    let reading = dir.path().join("busy.json");
    std::fs::write(
        &reading,
        r#"{"gpus": [{"index": 0, "processes": [{"pid": 4242, "name": "matmul", "memory_bytes": 1073741824}], "utilization_pct": 98}]}"#,
    )
    .unwrap();
    let r = reading.to_str().unwrap();
    let o = doctor(
        "two-gpus.json",
        "acs-off",
        &["--json", "--sim-occupancy", r],
        &[],
    );
    assert_eq!(
        o.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (st, ev, act) = check(&json(&o), "busy");
    assert_eq!(st, "warn");
    assert!(
        ev.contains("GPU 0: pid 4242 (matmul) holding 1.0 GiB, 98% utilized"),
        "{ev}"
    );
    assert!(act.contains("--allow-busy"), "{act}");
}

/// `--measure` on this machine: where the GPUs cannot be opened (no driver, as in CI) the report
/// says it measured nothing and why, in its header and JSON, rather than "measured".
#[test]
fn measure_without_gpus_says_nothing_was_measured() {
    let o = common::artune(&["doctor", "--measure", "--json"]);
    let r = json(&o);
    let (driver, _, _) = check(&r, "driver");
    if driver == "ok" {
        eprintln!("skipped: this machine has a GPU to measure");
        return;
    }
    assert_eq!(r["measured"], false, "{r}");
    assert!(
        r["not_measured"]
            .as_str()
            .is_some_and(|w| w.contains("could not be opened")),
        "{r}"
    );
    let o = common::artune(&["doctor", "--measure"]);
    let head = String::from_utf8_lossy(&o.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(
        head.contains(", not measured: the GPUs could not be opened"),
        "{head}"
    );
}

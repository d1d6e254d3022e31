//! `artune compare` through the binary: a simulated profile against another profile of the
//! same machine, and profiles that cannot be compared.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

fn artune(args: &[&str], level: Option<&str>) -> Output {
    let mut c = common::dies_with_test(common::BIN);
    c.args(args)
        .env_remove("NCCL_P2P_LEVEL")
        .env_remove("NCCL_P2P_DISABLE");
    if let Some(l) = level {
        c.env("NCCL_P2P_LEVEL", l);
    }
    c.output().expect("artune runs")
}

fn tune(dir: &Path, name: &str, extra: &[&str], level: Option<&str>) -> PathBuf {
    let out = dir.join(name);
    let mut args = vec![
        "tune",
        "--sim",
        "pcie-8x-2switch",
        "--sizes",
        "4K:4M",
        "--no-contention",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = artune(&args, level);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

#[test]
fn a_profile_against_itself_has_no_regret_and_a_changed_host_has_some() {
    let dir = tempfile::tempdir().unwrap();
    let a = tune(
        dir.path(),
        "a.json",
        &["--tp", "8", "--mode", "graph"],
        None,
    );
    let b = tune(
        dir.path(),
        "b.json",
        &["--tp", "8", "--mode", "graph", "--seed", "5"],
        Some("SYS"),
    );
    let same = artune(&["compare", a.to_str().unwrap(), a.to_str().unwrap()], None);
    assert!(same.status.success());
    let text = String::from_utf8_lossy(&same.stdout);
    assert!(text.contains("regret 0.0 us"), "{text}");
    assert!(text.contains("crossovers agree"), "{text}");
    // NCCL_P2P_LEVEL=SYS makes NCCL faster on this box, close enough to the custom kernels
    // that the simulator's error band leaves them no sure win: the profile tuned with it
    // chooses NCCL where NCCL's defaults leave a custom kernel clearly faster, which costs
    // the default host time, and the crossovers move.
    let o = artune(
        &[
            "compare",
            b.to_str().unwrap(),
            a.to_str().unwrap(),
            "--json",
        ],
        None,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let g = &c["groups"][0];
    assert!(g["regret_sum_us"].as_f64().unwrap() > 0.0, "{g}");
    assert!(g["worst"]["bytes"].as_u64().is_some(), "{g}");
    assert_ne!(g["crossovers_a"], g["crossovers_b"]);
    // The part beyond B's intervals is never more than the raw regret, and both are shown.
    let (raw, sig) = (
        g["worst_pct"].as_f64().unwrap(),
        g["worst_significant_pct"].as_f64().unwrap(),
    );
    assert!(raw > 0.0 && (0.0..=raw).contains(&sig), "{g}");
    let words = artune(&["compare", b.to_str().unwrap(), a.to_str().unwrap()], None);
    let words = String::from_utf8_lossy(&words.stdout);
    assert!(
        words.contains("worst share beyond B's intervals"),
        "{words}"
    );
}

#[test]
fn profiles_of_different_tp_mode_or_dtype_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let a = tune(
        dir.path(),
        "a.json",
        &["--tp", "8", "--mode", "graph"],
        None,
    );
    // Both modes, on each of several placements.
    let tp4 = tune(dir.path(), "tp4.json", &["--tp", "4"], None);
    let eager = tune(
        dir.path(),
        "e.json",
        &["--tp", "8", "--mode", "eager"],
        None,
    );
    let fp32 = tune(
        dir.path(),
        "f.json",
        &["--tp", "8", "--mode", "graph", "--dtype", "fp32"],
        None,
    );
    for (other, needle) in [
        (&tp4, "share no TP size and mode"),
        (&eager, "share no TP size and mode"),
        (&fp32, "bf16 in A and fp32 in B"),
    ] {
        let o = artune(
            &["compare", a.to_str().unwrap(), other.to_str().unwrap()],
            None,
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(needle), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        // Several placements of one TP size and mode are named once.
        if other == &tp4 {
            assert!(
                err.contains("(A has TP8 graph, B has TP4 graph, TP4 eager)"),
                "{err}"
            );
        }
    }
    let missing = dir.path().join("none.json");
    let o = artune(
        &["compare", a.to_str().unwrap(), missing.to_str().unwrap()],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
}

/// A measured profile against the simulated one: compare says per size whether each
/// measurement falls inside the simulator's error band, and warns when the machines differ in
/// topology class or GPU model.
#[test]
fn compare_checks_measurements_against_the_model_band_and_warns_on_other_machines() {
    let dir = tempfile::tempdir().unwrap();
    let a = tune(
        dir.path(),
        "a.json",
        &["--tp", "8", "--mode", "graph"],
        None,
    );
    let mut p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&a).unwrap()).unwrap();
    p["simulated"] = false.into();
    p["fabric"] = "a measured box".into();
    let mut buckets = 0;
    for g in p["groups"].as_array_mut().unwrap() {
        for b in g["buckets"].as_array_mut().unwrap() {
            buckets += 1;
            for (k, t) in b["results"].as_object_mut().unwrap() {
                let t = t.as_object_mut().unwrap();
                t.remove("model");
                // NCCL measured 3x the model everywhere: outside any band of this box.
                if k == "nccl" {
                    for f in ["median_us", "ci_low_us", "ci_high_us"] {
                        let v = t[f].as_f64().unwrap() * 3.0;
                        t[f] = v.into();
                    }
                }
            }
        }
    }
    let b = dir.path().join("b.json");
    std::fs::write(&b, serde_json::to_string(&p).unwrap()).unwrap();
    let o = artune(&["compare", a.to_str().unwrap(), b.to_str().unwrap()], None);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        text.contains("B's measurements inside A's simulated error band"),
        "{text}"
    );
    assert!(text.contains("nccl OUTSIDE (3.00x the model)"), "{text}");
    assert!(text.contains("two_stage_push inside"), "{text}");
    assert!(buckets > 0);
    assert!(!text.contains("warning:"), "{text}");
    // The same against a box of other GPUs and another topology class: warned.
    for g in p["topology"]["gpus"].as_array_mut().unwrap() {
        g["name"] = "NVIDIA GeForce RTX 4090".into();
    }
    p["fingerprint"]["topology_class"] = "sha256:0123456789abcdef01234567".into();
    std::fs::write(&b, serde_json::to_string(&p).unwrap()).unwrap();
    let o = artune(&["compare", a.to_str().unwrap(), b.to_str().unwrap()], None);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("warning: A and B are different topology classes"),
        "{text}"
    );
    assert!(
        text.contains("warning: A and B have different GPU models"),
        "{text}"
    );
}

/// A narrow profile against a wide one: B's sizes below A's smallest and above its largest are
/// counted apart (all were once "above A's largest"), B's crossovers outside the sizes both
/// measured are set aside instead of judged over sizes A never timed, and groups without a
/// counterpart are named once each, with their GPUs.
#[test]
fn sizes_and_crossovers_outside_the_common_range_are_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let wide = tune(dir.path(), "wide.json", &[], None);
    let narrow = dir.path().join("narrow.json");
    let args = [
        "tune",
        "--sim",
        "pcie-8x-2switch",
        "--tp",
        "2",
        "--mode",
        "graph",
    ];
    let o = artune(
        &[
            &args[..],
            &["--sizes", "1M:2M", "--out", narrow.to_str().unwrap()],
        ]
        .concat(),
        None,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = artune(
        &["compare", narrow.to_str().unwrap(), wide.to_str().unwrap()],
        None,
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{text}");
    let group = text
        .split("\n\n")
        .find(|g| g.starts_with("TP2 graph (GPUs 0,1"))
        .unwrap();
    assert!(
        group.contains("of B's sizes lie below A's smallest: not compared"),
        "{group}"
    );
    assert!(group.contains("above A's largest: not compared"), "{group}");
    assert!(
        group.contains("outside the sizes both measured: not compared"),
        "{group}"
    );
    assert!(
        !group.contains("none in A"),
        "judged over sizes A never measured: {group}"
    );
    let o = artune(
        &["compare", wide.to_str().unwrap(), narrow.to_str().unwrap()],
        None,
    );
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("no counterpart"))
        .collect();
    assert!(
        lines.iter().any(|l| l.contains("TP2 eager on GPUs 3,4")),
        "{lines:?}"
    );
    let mut unique = lines.clone();
    unique.dedup();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), lines.len(), "{lines:?}");
}

/// A group of A whose GPUs B has no group on is judged by B's default placement of that TP
/// size and mode, and the text says so, naming B's GPUs (it once named only A's).
#[test]
fn a_group_judged_by_another_placement_names_it() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a.json"), d.path().join("b.json"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    for (preset, out) in [("pcie-8x-2switch", a), ("pcie-2x", b)] {
        let o = common::artune(&[
            "tune", "--sim", preset, "--tp", "2", "--mode", "eager", "--out", out,
        ]);
        assert!(o.status.success(), "{}", common::text(&o.stderr));
    }
    let o = common::artune(&["compare", a, b]);
    let out = common::text(&o.stdout);
    let section = out
        .split("\n\n")
        .find(|s| s.contains("TP2 eager (GPUs 3,4"))
        .unwrap();
    assert!(
        section.contains("B has no group on these GPUs: judged by B's GPUs 0,1"),
        "{section}"
    );
    let own = out
        .split("\n\n")
        .find(|s| s.contains("TP2 eager (GPUs 0,1"))
        .unwrap();
    assert!(!own.contains("B has no group"), "{own}");
}

//! The validity rule through the binary: `artune check` against topology files standing for
//! the nodes of a fleet. A node's profile holds on an identical node (other GPU UUIDs, host
//! name and bus ids), a `fleet` class profile on every node of its class, a driver bump is a
//! note with `check --measure` suggested, and other hardware is exit 3 naming it.

mod common;

use std::path::{Path, PathBuf};

use common::{artune, text, tuned};
use serde_json::Value;

/// `pcie-4x-1switch` as node `tag` reads it: its own GPU UUIDs, bus ids and host name, and
/// `driver`, with `edit` applied.
fn node(dir: &Path, tag: &str, driver: &str, edit: impl Fn(&mut Value)) -> PathBuf {
    let o = artune(&["topo", "--sim", "pcie-4x-1switch", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let mut t: Value = serde_json::from_slice(&o.stdout).unwrap();
    for (i, g) in t["gpus"].as_array_mut().unwrap().iter_mut().enumerate() {
        g["uuid"] = format!("GPU-{tag}-{i}").into();
        g["bus_id"] = format!("0000:{:02x}:00.0", 0x20 + 0x10 * i + tag.len()).into();
    }
    t["host"] = serde_json::json!({ "hostname": tag, "driver": driver });
    edit(&mut t);
    let path = dir.join(format!("{tag}.topology.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(&t).unwrap()).unwrap();
    path
}

fn check(profile: &Path, machine: &Path) -> (i32, String, String) {
    let o = artune(&[
        "check",
        profile.to_str().unwrap(),
        "--topology",
        machine.to_str().unwrap(),
    ]);
    common::assert_no_panic(&text(&o.stderr));
    (o.status.code().unwrap(), text(&o.stdout), text(&o.stderr))
}

#[test]
fn a_profile_holds_on_every_node_of_its_class_and_not_on_other_hardware() {
    let d = tempfile::tempdir().unwrap();
    let a = node(d.path(), "node-a", "570.86.15", |_| {});
    let b = node(d.path(), "node-b", "570.86.15", |_| {});
    let args = [
        "--topology",
        a.to_str().unwrap(),
        "--tp",
        "2,4",
        "--sizes",
        "1K:64K",
    ];
    let pa = tuned(d.path(), "node-a.json", &args);

    // An identical node: other UUIDs, bus ids and host name.
    let (code, out, err) = check(&pa, &b);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("holds for") && out.contains("; tuned on another node of this class"));

    // A driver bump is a note that suggests measuring, not a refusal.
    let upgraded = node(d.path(), "node-a-580", "580.159.04", |_| {});
    let (code, out, err) = check(&pa, &upgraded);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("driver 570.86.15 → 580.159.04")
            && out.contains("re-timing its decisive sizes (artune check --measure) tells whether its choices still hold"),
        "{out}"
    );

    // The class profile `artune fleet` writes from both nodes holds on each of them.
    let nodes = d.path().join("nodes");
    std::fs::create_dir(&nodes).unwrap();
    for (tag, uuid) in [("node-a", "a"), ("node-b", "b")] {
        let mut p: Value = serde_json::from_slice(&std::fs::read(&pa).unwrap()).unwrap();
        p["node"]["hostname"] = tag.into();
        for (i, g) in p["topology"]["gpus"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .enumerate()
        {
            g["uuid"] = format!("GPU-node-{uuid}-{i}").into();
        }
        std::fs::write(nodes.join(format!("{tag}.json")), p.to_string()).unwrap();
    }
    let classes = d.path().join("classes");
    let o = artune(&[
        "fleet",
        nodes.to_str().unwrap(),
        "--out",
        classes.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let class = std::fs::read_dir(&classes)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    for machine in [&a, &b] {
        let (code, out, err) = check(&class, machine);
        assert_eq!(code, 0, "{}: {out}{err}", machine.display());
        assert!(!out.contains("another node"), "{out}");
    }

    // Another GPU model, GPU count or link width: exit 3, naming it.
    let model = node(d.path(), "l40s", "570.86.15", |t| {
        t["gpus"][1]["name"] = "NVIDIA L40S".into()
    });
    let narrow = node(d.path(), "x8", "570.86.15", |t| {
        t["gpus"][2]["pcie"]["max_width"] = 8.into();
        t["gpus"][2]["pcie"]["width"] = 8.into();
    });
    let o = artune(&["topo", "--sim", "pcie-2x", "--json"]);
    let pair = d.path().join("pair.topology.json");
    std::fs::write(&pair, &o.stdout).unwrap();
    for (machine, reason) in [
        (
            &model,
            "GPU 1 NVIDIA RTX PRO 6000 Blackwell Server Edition → NVIDIA L40S",
        ),
        (&narrow, "GPU 2 PCIe link Gen5 x16 → Gen5 x8"),
        (&pair, "GPU count 4 → 2"),
    ] {
        for profile in [&pa, &class] {
            let (code, out, err) = check(profile, machine);
            assert_eq!(code, 3, "{reason}: {out}{err}");
            assert!(
                err.contains(&format!("profile is stale: {reason}")),
                "{err}"
            );
        }
    }
}

/// A loopback profile (`tune --loopback 4`: four virtual ranks on one GPU) as the tune writes
/// it, from a simulated tune of `pcie-4x-1switch` whose GPUs stand for the one real GPU.
fn loopback_profile(dir: &Path) -> PathBuf {
    let p = tuned(
        dir,
        "sim.json",
        &[
            "--sim",
            "pcie-4x-1switch",
            "--tp",
            "2,4",
            "--sizes",
            "1K:64K",
        ],
    );
    let mut v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    v["simulated"] = false.into();
    v["fabric"] = "cuda".into();
    v["topology"]["origin"] = serde_json::json!({ "kind": "loopback", "link_reading": "idle" });
    v["topology"]["host"] = serde_json::json!({ "hostname": "box", "driver": "570.86.15" });
    v["versions"]["driver"] = "570.86.15".into();
    for g in v["topology"]["gpus"].as_array_mut().unwrap() {
        g["bus_id"] = "0000:21:00.0".into();
    }
    let path = dir.join("loopback.json");
    std::fs::write(&path, v.to_string()).unwrap();
    path
}

#[test]
fn a_loopback_profile_holds_on_its_one_real_gpu_and_not_on_another_model() {
    let d = tempfile::tempdir().unwrap();
    let p = loopback_profile(d.path());
    let one_gpu = |tag: &str, name: &str, driver: &str| {
        node(d.path(), tag, driver, |t| {
            t["gpus"] = serde_json::json!([t["gpus"][0].clone()]);
            t["gpus"][0]["name"] = name.into();
            t["pairs"] = serde_json::json!([]);
        })
    };
    let same = "NVIDIA RTX PRO 6000 Blackwell Server Edition";
    let (code, out, err) = check(&p, &one_gpu("one", same, "570.86.15"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("holds for"), "{out}");

    // A driver bump is a note, as for any profile.
    let (code, out, err) = check(&p, &one_gpu("bumped", same, "580.159.04"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("driver 570.86.15 → 580.159.04"), "{out}");

    // Another GPU model: stale, naming it.
    let (code, out, err) = check(&p, &one_gpu("l40s", "NVIDIA L40S", "570.86.15"));
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        err.contains(&format!("profile is stale: GPU 0 {same} → NVIDIA L40S")),
        "{err}"
    );
}

/// A profile whose groups were cut out holds nothing an engine could follow: `check` calls it
/// stale (exit 3) on its own machine, by the rule and by measurement, with the tune command,
/// where it once said "holds ... (no groups)".
#[test]
fn a_profile_of_no_groups_does_not_hold() {
    let dir = tempfile::tempdir().unwrap();
    let p = tuned(dir.path(), "p.json", &["--sim", "pcie-2x", "--tp", "2"]);
    let mut v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    v["groups"] = serde_json::json!([]);
    std::fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    for extra in [&[][..], &["--measure"], &["--json"]] {
        let args = [
            &["check", p.to_str().unwrap(), "--sim", "pcie-2x"][..],
            extra,
        ]
        .concat();
        let o = artune(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{extra:?}: {err}");
        assert!(
            err.contains("it has no groups") && err.contains("artune tune --sim pcie-2x"),
            "{extra:?}: {err}"
        );
        assert!(!text(&o.stdout).contains("holds for"), "{extra:?}");
    }
}

/// A measured profile checked against a model is not advised to be tuned again on that model
/// into its own file (a simulated tune there would replace the measurement), and a simulated
/// tune refuses to write over a measured profile without --force.
#[test]
fn a_measured_profile_is_not_replaced_by_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let measured = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/profiles/hardware/h100/2026-12-05-percall/tune4graph.json"
    );
    let p = dir.path().join("lb.json");
    std::fs::copy(measured, &p).unwrap();
    let before = std::fs::read(&p).unwrap();
    let ps = p.to_str().unwrap();
    let o = artune(&["check", ps, "--sim", "pcie-4x-1switch"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains(&format!(
            "run `artune tune --loopback 4 --tp 4 --mode graph --sizes 16K:64K --out {ps}`"
        )),
        "{err}"
    );
    assert!(!err.contains("--sim"), "{err}");
    let o = artune(&["tune", "--sim", "pcie-4x-1switch", "--out", ps]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("holds a profile measured on CUDA loopback") && err.contains("--force"));
    assert_eq!(
        std::fs::read(&p).unwrap(),
        before,
        "the measured profile was changed"
    );
    let o = artune(&["tune", "--sim", "pcie-4x-1switch", "--out", ps, "--force"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

/// The tune `check` advises for a stale profile makes the same kind of profile again: its
/// mode, dtype, TP sizes and sizes, not a default bf16 tune of both modes over it. Run as
/// printed, it writes a profile with the old one's settings.
#[test]
fn the_advised_retune_keeps_the_profiles_settings() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("p.json");
    let ps = p.to_str().unwrap();
    let o = artune(&[
        "tune",
        "--sim",
        "pcie-8x-2switch",
        "--mode",
        "eager",
        "--dtype",
        "fp32",
        "--tp",
        "4",
        "--sizes",
        "4K:16M",
        "--out",
        ps,
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = artune(&["check", ps, "--sim", "pcie-4x-1switch"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    let cmd = err
        .split("run `")
        .nth(1)
        .and_then(|r| r.split('`').next())
        .unwrap();
    assert!(
        cmd.contains("--tp 4 --mode eager --dtype fp32 --sizes 4K:16M"),
        "{cmd}"
    );
    let args: Vec<&str> = cmd.split_whitespace().skip(1).collect();
    let o = artune(&args);
    assert!(o.status.success(), "{cmd}: {}", text(&o.stderr));
    let s = artune::profile::Profile::load(&p).unwrap().settings;
    assert_eq!(
        (
            s.tp,
            s.modes.len(),
            s.dtype.map(|d| d.id()),
            s.min_bytes,
            s.max_bytes
        ),
        (vec![4], 1, Some("fp32"), 4 << 10, 16 << 20)
    );
}

/// One pair without P2P rules the kernels that need it out for the groups holding that pair,
/// as the tune waives them there, and for no other group: a profile tuned with P2P is stale
/// there, naming only those groups, and one tuned there holds.
#[test]
fn one_pair_without_p2p_rules_out_the_kernels_of_its_groups_only() {
    let d = tempfile::tempdir().unwrap();
    let good = node(d.path(), "good", "570.86.15", |_| {});
    let broken = node(d.path(), "broken", "570.86.15", |t| {
        for p in t["pairs"].as_array_mut().unwrap() {
            let ends = (p["from"].as_u64().unwrap(), p["to"].as_u64().unwrap());
            if ends == (0, 1) || ends == (1, 0) {
                p["p2p"]["read"] = "no".into();
                p["p2p"]["write"] = "no".into();
            }
        }
    });
    let tune = |on: &Path, name: &str| {
        let args = [
            "--topology",
            on.to_str().unwrap(),
            "--tp",
            "2,4",
            "--mode",
            "graph",
        ];
        let args = [&args[..], &["--sizes", "1K:64K"]].concat();
        tuned(d.path(), name, &args)
    };
    let pg = tune(&good, "good.json");
    let (code, out, err) = check(&pg, &broken);
    assert_eq!(code, 3, "{out}{err}");
    assert!(err.contains("TP2 graph on GPUs 0,1 chooses"), "{err}");
    assert!(err.contains("TP4 graph on GPUs 0-3 chooses"), "{err}");
    assert!(!err.contains("on GPUs 2,3"), "{err}");
    let pb = tune(&broken, "broken.json");
    let (code, out, err) = check(&pb, &broken);
    assert_eq!(code, 0, "{out}{err}");
}

/// A link trained below its maximum generation is a note, not a changed machine: idle GPUs
/// lower the generation to save power (the class has each link's maximum). One trained
/// narrower is stale.
#[test]
fn a_lower_generation_is_a_note_and_a_narrower_link_stale() {
    let d = tempfile::tempdir().unwrap();
    let good = node(d.path(), "good", "570.86.15", |_| {});
    let args = [
        "--topology",
        good.to_str().unwrap(),
        "--tp",
        "4",
        "--sizes",
        "1K:64K",
    ];
    let p = tuned(d.path(), "p.json", &args);
    let gen4 = node(d.path(), "gen4", "570.86.15", |t| {
        t["gpus"][0]["pcie"]["gen"] = 4.into()
    });
    let (code, out, err) = check(&p, &gen4);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("holds for") && out.contains("GPU 0 PCIe link at Gen4 of Gen5"),
        "{out}"
    );
    let x8 = node(d.path(), "x8", "570.86.15", |t| {
        t["gpus"][0]["pcie"]["width"] = 8.into()
    });
    let (code, out, err) = check(&p, &x8);
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        err.contains("GPU 0 PCIe link trained at x8 of x16"),
        "{err}"
    );
}

//! The island schedules through the binary: islands derived from the topology or given with
//! `--islands`, what `show`, `why` and `select` say of them, and bad input.

mod common;

use std::path::Path;

use common::{artune, assert_no_panic, text, tuned};

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Bad `--islands`: one line, exit 2, no profile written.
#[test]
fn bad_islands_are_refused_in_one_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let o = out.to_str().unwrap();
    for (islands, says) in [
        ("4,2", "unequal size"),
        ("1,7", "fewer than 2 GPUs"),
        ("8", "one island"),
        ("3,3", "adds up to 6 GPUs"),
        ("2,2", "(or tune that size with --tp 4)"),
        // A size the machine cannot run is no advice (it once said "--tp 32").
        ("16,16", "adds up to 32 GPUs, but the groups tuned have 8; give sizes that add up to one of them (this machine has 8 GPUs)"),
        ("x,4", "not a number"),
    ] {
        let r = artune(&[
            "tune",
            "--sim",
            "pcie-8x-2switch",
            "--tp",
            "8",
            "--islands",
            islands,
            "--out",
            o,
        ]);
        let err = text(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "--islands {islands}: {err}");
        assert!(err.contains(says), "--islands {islands}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert_no_panic(&err);
        assert!(!out.exists(), "--islands {islands} left a profile");
    }
    // Adding up to a TP size that is tuned by default (8 of 2, 4, 8) is fine.
    let r = artune(&[
        "tune",
        "--sim",
        "pcie-8x-2switch",
        "--islands",
        "2,2",
        "--sizes",
        "4K:64K",
        "--out",
        o,
        "--mode",
        "graph",
    ]);
    assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
    let p = json(&out);
    let given: Vec<_> = p["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["islands"]["by"] == "given")
        .collect();
    assert!(!given.is_empty(), "no group took the given islands");
    assert!(given.iter().all(|g| g["tp"] == 4), "{given:?}");
}

/// On every multi-island machine the island schedules are measured in the islands the
/// topology gives; where a group is one island they are waived with the reason.
#[test]
fn islands_come_from_the_topology_and_show_says_where_they_win() {
    let dir = tempfile::tempdir().unwrap();
    let sixteen = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/topologies/16x-four-switches.json"
    );
    for (source, arg, tp, islands, by) in [
        ("--sim", "pcie-8x-2switch", "8", 2, "switch"),
        ("--sim", "pcie-8x-direct-2socket", "8", 2, "socket"),
        ("--topology", sixteen, "16", 4, "switch"),
    ] {
        let p = tuned(
            dir.path(),
            &format!("{arg}.json").replace('/', "_"),
            &[
                source, arg, "--tp", tp, "--mode", "graph", "--sizes", "4K:4M",
            ],
        );
        let v = json(&p);
        let g = &v["groups"][0];
        assert_eq!(
            g["islands"]["gpus"].as_array().unwrap().len(),
            islands,
            "{arg}"
        );
        assert_eq!(g["islands"]["by"], by, "{arg}");
        assert!(g["islands"]["directions"]["because"].is_string(), "{arg}");
        let timed = g["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["results"]["island_two_shot"].is_object());
        assert!(timed, "{arg}: island_two_shot was not timed at every size");
        let show = text(&artune(&["show", p.to_str().unwrap()]).stdout);
        assert!(show.contains("  islands: "), "{show}");
        assert!(show.contains("  island_two_shot: "), "{show}");
    }
    // One switch: one island, waived with the reason.
    let p = tuned(
        dir.path(),
        "one.json",
        &[
            "--sim",
            "pcie-4x-1switch",
            "--tp",
            "4",
            "--mode",
            "graph",
            "--sizes",
            "4K:64K",
        ],
    );
    let g = &json(&p)["groups"][0];
    assert!(g["islands"].is_null());
    let why = g["waived"]["island_two_shot"].as_str().unwrap();
    assert!(why.contains("one island"), "{why}");
}

/// TP8 graph on the two-socket box, 4K to 4M: a profile that chooses island_two_shot at
/// some sizes.
fn two_sockets_tp8(dir: &std::path::Path) -> std::path::PathBuf {
    tuned(
        dir,
        "p.json",
        &[
            "--sim",
            "pcie-8x-direct-2socket",
            "--tp",
            "8",
            "--mode",
            "graph",
            "--sizes",
            "4K:4M",
        ],
    )
}

/// Where the profile chooses an island schedule: `why` names the partition, the phases and
/// what an engine without artune's kernels runs; `select` gives that in its JSON; the C ABI's
/// fallback is tested in tests/plugin.rs.
#[test]
fn an_island_choice_is_explained_with_its_phases_and_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let p = two_sockets_tp8(dir.path());
    let v = json(&p);
    let b = v["groups"][0]["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["choice"] == "island_two_shot")
        .expect("the two-socket box chooses island_two_shot somewhere")
        .clone();
    let fallback = b["fallback"].as_str().unwrap();
    assert!(!fallback.starts_with("island"), "{fallback}");
    let bytes = b["bytes"].as_u64().unwrap().to_string();
    let ps = p.to_str().unwrap();
    let why = text(&artune(&["why", ps, "--tp", "8", "--bytes", &bytes]).stdout);
    assert!(why.contains("choice: island_two_shot"), "{why}");
    assert!(
        why.contains(&format!("an engine without them runs {fallback} here")),
        "{why}"
    );
    assert!(
        why.contains("islands: 2 sockets of 4 GPUs: [0, 1, 2, 3] [4, 5, 6, 7]"),
        "{why}"
    );
    assert!(
        why.contains("island_two_shot: inside each island (3 peers, 1/4 of the message each"),
        "{why}"
    );
    let sel = artune(&["select", ps, "--tp", "8", "--bytes", &bytes, "--json"]);
    let s: serde_json::Value = serde_json::from_slice(&sel.stdout).unwrap();
    assert_eq!(s["backend"], "island_two_shot");
    assert_eq!(s["fallback"], fallback);
}

/// A profile naming a backend this version does not know is refused in one sentence, as an
/// older artune refuses a profile with the island schedules.
#[test]
fn an_unknown_backend_name_is_refused_in_one_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let p = tuned(
        dir.path(),
        "p.json",
        &[
            "--sim",
            "pcie-8x-2switch",
            "--tp",
            "8",
            "--mode",
            "graph",
            "--sizes",
            "4K:64K",
        ],
    );
    let s = std::fs::read_to_string(&p).unwrap();
    assert!(s.contains("\"island_two_shot\""));
    let future = dir.path().join("future.json");
    std::fs::write(
        &future,
        s.replace("\"island_two_shot\"", "\"island_three_shot\""),
    )
    .unwrap();
    for cmd in [
        vec!["show", future.to_str().unwrap()],
        vec![
            "select",
            future.to_str().unwrap(),
            "--tp",
            "8",
            "--bytes",
            "4K",
        ],
    ] {
        let r = artune(&cmd);
        let err = text(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{cmd:?}: {err}");
        assert!(err.contains("island_three_shot"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert_no_panic(&err);
    }
}

/// An engine without artune's kernels, facing an island choice, runs what it would if the
/// profile had chosen the bucket's fallback: every engine line of `why` is the same for the
/// profile as tuned and for one with the fallback written as the choice, except the vLLM and
/// SGLang plugins', whose op runs the island schedule and falls back to exactly that line.
#[test]
fn engines_follow_the_fallback_where_an_island_schedule_is_chosen() {
    let dir = tempfile::tempdir().unwrap();
    let p = two_sockets_tp8(dir.path());
    let mut v = json(&p);
    let buckets = v["groups"][0]["buckets"].as_array_mut().unwrap();
    let at: Vec<u64> = buckets
        .iter()
        .filter(|b| b["choice"] == "island_two_shot")
        .map(|b| b["bytes"].as_u64().unwrap())
        .collect();
    assert!(!at.is_empty());
    for b in buckets.iter_mut().filter(|b| b["fallback"].is_string()) {
        b["choice"] = b["fallback"].clone();
        b.as_object_mut().unwrap().remove("fallback");
    }
    let flat = dir.path().join("flat.json");
    std::fs::write(&flat, serde_json::to_string(&v).unwrap()).unwrap();
    let engines = |file: &Path, bytes: u64| {
        let o = artune(&[
            "why",
            file.to_str().unwrap(),
            "--tp",
            "8",
            "--bytes",
            &bytes.to_string(),
            "--json",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        let w: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        w["engines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
                (s("engine"), s("runs"), s("backend"), s("because"))
            })
            .collect::<Vec<_>>()
    };
    for bytes in at {
        let (island, fallback) = (engines(&p, bytes), engines(&flat, bytes));
        assert_eq!(island.len(), fallback.len());
        let mut routed = 0;
        for (i, f) in island.iter().zip(&fallback) {
            if i.0.starts_with("vLLM + ") || i.0.starts_with("SGLang + ") {
                assert_eq!(
                    i.1, "artune's kernels, island_two_shot",
                    "at {bytes}: {i:?}"
                );
                assert_eq!(i.2, "island_two_shot");
                // The flat profile's line, less its note on the opt-in (which the island
                // size needs no more: the op takes it under either setting).
                let paths = f.3.split("; with ARTUNE_KERNELS=artune").next().unwrap();
                let without = format!("Where the op cannot be built: {}, because {paths}", f.1);
                assert!(i.3.contains(&without), "at {bytes}: {i:?} / {f:?}");
                routed += 1;
            } else {
                assert_eq!(i, f, "at {bytes} bytes");
                assert!(!i.1.contains("island") && !i.2.contains("island"), "{i:?}");
            }
        }
        assert_eq!(routed, 3, "{island:?}");
    }
}

/// Where two island schedules both beat every flat backend, the one not chosen names the other
/// as the reason (it once said "within the model's error" beside a line calling the other the
/// fastest at the same sizes), and neither is called "the fastest measured".
#[test]
fn an_island_schedule_behind_another_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("d.json");
    let o = out.to_str().unwrap();
    let args = [
        "tune",
        "--sim",
        "pcie-8x-direct-2socket",
        "--tp",
        "8",
        "--mode",
        "graph",
    ];
    let r = artune(&[&args[..], &["--no-contention", "--out", o]].concat());
    assert_eq!(r.status.code(), Some(0), "{}", text(&r.stderr));
    let shown = text(&artune(&["show", o]).stdout);
    let line = |k: &str| {
        shown
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{k}: ")))
            .unwrap_or_else(|| panic!("no {k} line: {shown}"))
            .to_string()
    };
    assert!(line("island_two_shot").contains("chosen at"), "{shown}");
    let copy = line("island_two_shot_copy");
    assert!(
        copy.contains("not chosen: island_two_shot is faster at those sizes"),
        "{copy}"
    );
    assert!(!shown.contains("the fastest measured at"), "{shown}");
    // show --json says what the text says below each table, and the dtype.
    let j: serde_json::Value =
        serde_json::from_slice(&artune(&["show", o, "--json"]).stdout).unwrap();
    assert_eq!(j["dtype"], "bf16");
    let said: Vec<&str> = j["groups"][0]["said"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(j["groups"][0]["dtype"], "bf16");
    assert!(
        said.iter()
            .any(|l| l.starts_with("island_two_shot_copy: ") && copy.trim() == *l),
        "{said:?}"
    );
    assert!(
        said.iter().any(|l| l.starts_with("model error (simulated")),
        "{said:?}"
    );
}

//! `artune topo` through the binary: every preset renders, JSON round-trips, bad input is one
//! line and exit code 2.

mod common;

use std::path::Path;
use std::process::Output;

use common::{artune, assert_no_panic};

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8 output")
}

fn presets() -> Vec<String> {
    let o = artune(&["topo", "--list-presets"]);
    assert!(o.status.success());
    let names: Vec<String> = stdout(&o)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect();
    assert!(names.len() >= 5, "{names:?}");
    // The same list as JSON, and no machine option beside it.
    let j = artune(&["topo", "--list-presets", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).expect("--json is JSON");
    let json_names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(json_names, names);
    assert_eq!(
        artune(&["topo", "--list-presets", "--sim", "pcie-2x"])
            .status
            .code(),
        Some(2)
    );
    names
}

fn class_hash_line(text: &str) -> String {
    text.lines()
        .find(|l| l.starts_with("class hash "))
        .expect("class hash line")
        .split_whitespace()
        .nth(2)
        .unwrap()
        .into()
}

/// Bad input: exit 2, one line on stderr that contains every `needles`, nothing on stdout.
fn assert_bad_input(args: &[&str], needles: &[&str]) {
    let o = artune(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: one line expected, got:\n{err}"
    );
    assert_no_panic(&err);
    for n in needles {
        assert!(err.contains(n), "{args:?}: `{n}` missing from: {err}");
    }
    assert!(o.stdout.is_empty(), "{args:?} printed: {}", stdout(&o));
}

#[test]
fn every_preset_renders_as_text() {
    for name in presets() {
        let o = artune(&["topo", "--sim", &name]);
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let s = stdout(&o);
        assert!(
            s.contains(&format!("simulated machine: preset `{name}`")),
            "{s}"
        );
        assert!(class_hash_line(&s).starts_with("sha256:"), "{s}");
        for section in [
            "\nGPUs\n",
            "\nPaths (as `nvidia-smi topo -m`)\n",
            "\nBehind one uplink",
            "\nPCIe tree",
        ] {
            assert!(s.contains(section), "{name}: no {section:?} in\n{s}");
        }
        let n: usize = s.split_whitespace().next().unwrap().parse().unwrap();
        let rows = s
            .lines()
            .filter(|l| l.trim_start().starts_with("GPU") && l.contains(" X "))
            .count();
        assert!(
            rows >= n,
            "{name}: {n} GPUs but {rows} matrix rows with X:\n{s}"
        );
    }
}

#[test]
fn preset_json_round_trips_through_a_file() {
    let dir = tempfile::tempdir().unwrap();
    for name in presets() {
        let json = artune(&["topo", "--sim", &name, "--json"]);
        assert!(json.status.success(), "{name}");
        let parsed =
            artune::topology::file::parse(&stdout(&json)).expect("topo --json is a topology file");
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(&path, &json.stdout).unwrap();
        let p = path.to_str().unwrap();

        let from_sim = stdout(&artune(&["topo", "--sim", &name]));
        let from_file = artune(&["topo", "--topology", p]);
        assert!(
            from_file.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&from_file.stderr)
        );
        let from_file = stdout(&from_file);
        assert_eq!(
            class_hash_line(&from_sim),
            class_hash_line(&from_file),
            "{name}"
        );
        assert_eq!(class_hash_line(&from_sim), parsed.class_hash(), "{name}");
        assert!(
            from_file.contains(&format!("topology file {p}")),
            "{from_file}"
        );

        let again = artune(&["topo", "--topology", p, "--json"]);
        let again = artune::topology::file::parse(&stdout(&again)).unwrap();
        assert_eq!(again.class_hash(), parsed.class_hash(), "{name}");
        assert_eq!(again.gpus, parsed.gpus, "{name}");
    }
}

#[test]
fn malformed_file_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    std::fs::write(&path, "{ this is not json").unwrap();
    assert_bad_input(
        &["topo", "--topology", path.to_str().unwrap()],
        &["bad.json", "not a valid topology file"],
    );
}

#[test]
fn truncated_file_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let full = stdout(&artune(&["topo", "--sim", "pcie-8x-2switch", "--json"]));
    let path = dir.path().join("cut.json");
    std::fs::write(&path, &full[..full.len() / 3]).unwrap();
    assert_bad_input(
        &["topo", "--topology", path.to_str().unwrap()],
        &["cut.json", "truncated"],
    );
}

#[test]
fn wrong_shape_file_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.json");
    std::fs::write(
        &path,
        r#"{"sockets": [], "root_complexes": [], "gpus": []}"#,
    )
    .unwrap();
    assert_bad_input(
        &["topo", "--topology", path.to_str().unwrap()],
        &["empty.json", "no GPUs"],
    );
}

/// A profile given where a topology file goes is named for what it is (the reverse mistake
/// is, in profile/validate.rs).
#[test]
fn a_profile_given_as_a_topology_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = common::tuned(
        dir.path(),
        "p.json",
        &["--sim", "pcie-2x", "--sizes", "1K:8K"],
    );
    assert_bad_input(
        &["topo", "--topology", p.to_str().unwrap()],
        &["p.json", "it is an artune profile, not a topology file"],
    );
}

/// The command that error suggests writes a topology file; pasted as printed, it must not
/// overwrite the profile the user gave (docs/GUIDE.md names its profile box.json), from
/// any of the commands that take --topology.
#[test]
fn the_suggested_topo_command_does_not_overwrite_the_profile() {
    let dir = tempfile::tempdir().unwrap();
    let p = common::tuned(
        dir.path(),
        "box.json",
        &["--sim", "pcie-2x", "--sizes", "1K:8K"],
    );
    let p = p.to_str().unwrap();
    let out = dir.path().join("zz.json");
    for args in [
        vec!["topo", "--topology", p],
        vec!["check", p, "--topology", p],
        vec!["tune", "--topology", p, "--out", out.to_str().unwrap()],
        vec!["doctor", "--topology", p],
    ] {
        let err = String::from_utf8_lossy(&artune(&args).stderr).into_owned();
        let target = err
            .split("`artune topo --json > ")
            .nth(1)
            .and_then(|rest| rest.split('`').next())
            .unwrap_or_else(|| panic!("{args:?}: no topo command suggested: {err}"));
        assert_ne!(target, "box.json", "{args:?}: {err}");
    }
}

#[test]
fn unknown_preset_is_bad_input() {
    assert_bad_input(
        &["topo", "--sim", "no-such-box"],
        &["no-such-box", "pcie-8x-2switch"],
    );
}

#[test]
fn missing_file_is_bad_input() {
    let missing = Path::new("/nonexistent/artune/topology.json");
    assert_bad_input(
        &["topo", "--topology", missing.to_str().unwrap()],
        &["cannot read", "topology.json", "check the path"],
    );
}

#[test]
fn no_nvml_library_is_bad_input() {
    if nvml_wrapper::Nvml::init().is_ok() {
        eprintln!("skipped: this machine has NVML, so `artune topo` reads the real GPUs");
        return;
    }
    for json in [false, true] {
        let mut args = vec!["topo"];
        if json {
            args.push("--json");
        }
        assert_bad_input(
            &args,
            &[
                "libnvidia-ml.so.1",
                "install the NVIDIA driver",
                "--sim PRESET",
                "--topology FILE",
            ],
        );
    }
}

#[test]
fn committed_h200_capture_loads() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/profiles/hardware/h200/2026-11-29-topo/topo.json"
    );
    let o = artune(&["topo", "--topology", path]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = stdout(&o);
    for want in [
        "NVIDIA H200, cc 9.0",
        "bus 00000000:00:06.0",
        "GPU0  Gen5 x16",
        "NVLink: not supported",
    ] {
        assert!(s.contains(want), "`{want}` missing from:\n{s}");
    }
}

/// docs/FORMATS.md invites describing a machine by editing `topo --json`: a file with GPUs
/// removed from the end (and their pairs left in) is that machine, not a broken limit.
#[test]
fn a_topo_json_with_gpus_removed_describes_the_smaller_machine() {
    let dir = tempfile::tempdir().unwrap();
    let json = artune(&["topo", "--sim", "pcie-8x-2switch", "--json"]);
    assert!(json.status.success());
    let mut v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    v["gpus"].as_array_mut().unwrap().truncate(4);
    assert_eq!(
        v["pairs"].as_array().unwrap().len(),
        56,
        "pairs left as written"
    );
    let path = dir.path().join("four.json");
    std::fs::write(&path, v.to_string()).unwrap();
    let p = path.to_str().unwrap();
    let o = artune(&["topo", "--topology", p]);
    assert!(o.status.success(), "{}", common::text(&o.stderr));
    assert!(stdout(&o).starts_with("4 GPUs"), "{}", stdout(&o));
    let out = dir.path().join("p.json");
    let args = ["tune", "--topology", p, "--tp", "4", "--sizes", "1K:4K"];
    let o = artune(&[&args[..], &["--out", out.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", common::text(&o.stderr));
}

/// A misspelt key in a topology file is refused, naming it, rather than read as absent: a
/// `contnetion` curve once left the switch modelled without the contention its author gave.
#[test]
fn a_misspelt_key_is_refused_by_name() {
    let d = tempfile::tempdir().unwrap();
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/topologies/8x-one-switch-as-read.json");
    let mut t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(base).unwrap()).unwrap();
    t["switches"][0]["contnetion"] = serde_json::json!({"peak_gbps": 1.0});
    let f = d.path().join("typo.json");
    std::fs::write(&f, t.to_string()).unwrap();
    let out = d.path().join("p.json");
    let (f, out) = (f.to_str().unwrap(), out.to_str().unwrap());
    let needle = ["`switches[0].contnetion` is wrong: unknown field `contnetion`"];
    assert_bad_input(&["topo", "--topology", f], &needle);
    assert_bad_input(&["tune", "--topology", f, "--out", out], &needle);
}

/// A number of the wrong kind is said in words, without serde's type names and without a
/// range the field narrows later (memory "from 0 up" beside "1 byte to 1 PiB" for 0).
#[test]
fn a_number_of_the_wrong_kind_is_said_in_words() {
    let d = tempfile::tempdir().unwrap();
    let base =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/topologies/8x-one-switch-as-read.json");
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(base).unwrap()).unwrap();
    for (field, value, said) in [
        ("memory_bytes", serde_json::json!(-1), "`gpus[0].memory_bytes` is wrong: it is -1, and it cannot be negative"),
        ("memory_bytes", serde_json::json!(1.5), "`gpus[0].memory_bytes` is wrong: it is 1.5; it must be a whole number"),
        ("gen", serde_json::json!("5"), "`gpus[0].pcie.gen` is wrong: it is a string \"5\"; write a whole number without quotes"),
    ] {
        let mut t = t.clone();
        match field {
            "gen" => t["gpus"][0]["pcie"]["gen"] = value,
            f => t["gpus"][0][f] = value,
        }
        let f = d.path().join("t.json");
        std::fs::write(&f, t.to_string()).unwrap();
        assert_bad_input(&["topo", "--topology", f.to_str().unwrap()], &[said]);
        let err = String::from_utf8_lossy(&artune(&["topo", "--topology", f.to_str().unwrap()]).stderr).to_string();
        assert!(!err.contains("expected u") && !err.contains("from 0 up"), "{err}");
    }
}

/// Every origin says when its links were read in one of the words FORMATS.md lists: a file
/// that does not say is "unknown" (it was "", which no reader of the documented values knew).
#[test]
fn link_reading_is_one_of_the_documented_values() {
    let dir = format!("{}/docs/topologies", env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let reading = |args: &[&str]| -> String {
        let o = artune(args);
        assert!(o.status.success(), "{args:?}");
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        v["origin"]["link_reading"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let tmp = tempfile::tempdir().unwrap();
    for f in &files {
        let r = reading(&["topo", "--topology", f.to_str().unwrap(), "--json"]);
        assert!(
            ["idle", "load", "unknown"].contains(&r.as_str()),
            "{}: {r}",
            f.display()
        );
        // The same machine written by hand, with no origin at all.
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        v.as_object_mut().unwrap().remove("origin");
        let bare = tmp.path().join(f.file_name().unwrap());
        std::fs::write(&bare, v.to_string()).unwrap();
        let r = reading(&["topo", "--topology", bare.to_str().unwrap(), "--json"]);
        assert_eq!(r, "unknown", "{} without its origin", f.display());
    }
    for name in presets() {
        assert_eq!(
            reading(&["topo", "--sim", &name, "--json"]),
            "preset",
            "{name}"
        );
    }
}

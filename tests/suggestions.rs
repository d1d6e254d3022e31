//! Every command artune suggests runs as printed: the `next:` lines after a tune, the `do:`
//! lines of doctor, the commands errors and exported files name in backticks. Each situation
//! below makes artune print some; each suggested command is then run, as printed, in the
//! directory where it was printed, and must exit 0, or exit with the code the docs give for
//! its verdict (`check` 3, `doctor` 4 or 5), or stop only because this machine has no GPU (a
//! command meant for the GPU node). A scan of the sources keeps the situations complete: every
//! message with a backticked command must be printed by one of them.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{text, BIN};

/// What artune printed in one situation, and where.
struct Said {
    situation: String,
    dir: PathBuf,
    text: String,
}

/// Runs `artune ARGS` in `dir` with `env` set (and artune's own variables unset).
fn artune_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = common::dies_with_test(BIN);
    c.args(args).current_dir(dir);
    for (k, _) in std::env::vars() {
        if ["NCCL_", "ARTUNE_", "CUDA_", "SLURM"]
            .iter()
            .any(|p| k.starts_with(p))
            || k == "NODE_NAME"
        {
            c.env_remove(k);
        }
    }
    c.envs(env.iter().copied());
    c.output().expect("artune runs")
}

/// Runs a situation's command and keeps everything it printed.
fn say(situation: &str, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Said {
    let o = artune_in(dir, args, env);
    Said {
        situation: situation.into(),
        dir: dir.to_path_buf(),
        text: format!("{}{}", text(&o.stdout), text(&o.stderr)),
    }
}

/// The commands in `text`: each line under `next:` (up to its `#` comment), and every
/// backticked span that starts with `artune ` or `env -u `.
fn suggested(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut next = false;
    for line in text.lines() {
        if line.trim_end() == "next:" {
            next = true;
            continue;
        }
        if next {
            match line.strip_prefix("  ").filter(|l| l.starts_with("artune ")) {
                Some(l) => out.push(l.split("   #").next().unwrap().trim().to_string()),
                None => next = false,
            }
        }
        for (i, span) in line.split('`').enumerate() {
            if i % 2 == 1 && (span.starts_with("artune ") || span.starts_with("env -u ")) {
                out.push(span.to_string());
            }
        }
    }
    out
}

/// Splits a command as a POSIX shell does for plain words and single quotes.
fn words(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), None::<String>, false);
    for c in line.chars() {
        match (quoted, c) {
            (true, '\'') => quoted = false,
            (true, c) => cur.get_or_insert_with(String::new).push(c),
            (false, '\'') => {
                quoted = true;
                cur.get_or_insert_with(String::new);
            }
            (false, c) if c.is_whitespace() => out.extend(cur.take()),
            (false, c) => cur.get_or_insert_with(String::new).push(c),
        }
    }
    assert!(!quoted, "unclosed quote in `{line}`");
    out.extend(cur);
    out
}

/// Runs one suggested command where it was printed: `env -u NAME` words unset NAME, and the
/// rest must be an artune command.
fn run_suggestion(dir: &Path, line: &str) -> Output {
    let mut w = words(line);
    let mut unset = Vec::new();
    if w.first().is_some_and(|x| x == "env") {
        w.remove(0);
        while w.first().is_some_and(|x| x == "-u") {
            w.remove(0);
            unset.push(w.remove(0));
        }
    }
    assert_eq!(w.first().map(String::as_str), Some("artune"), "`{line}`");
    let mut c = common::dies_with_test(BIN);
    c.args(&w[1..]).current_dir(dir);
    for k in unset {
        c.env_remove(k);
    }
    c.output().expect("artune runs")
}

/// Whether a suggested command's outcome is what it promises here. A command for the GPU
/// node, run on this machine without one, must get as far as finding no GPU.
fn acceptable(line: &str, o: &Output) -> bool {
    let code = o.status.code();
    let err = text(&o.stderr);
    let no_gpu = err.contains("on a machine without an NVIDIA GPU")
        || err.contains("cannot load the NVIDIA management library");
    let verdicts: &[i32] = match words(line).get(1).map(String::as_str) {
        Some("check") => &[0, 3],
        Some("doctor") => &[0, 4, 5],
        _ => &[0],
    };
    code.is_some_and(|c| verdicts.contains(&c)) || (code == Some(2) && no_gpu)
}

/// A sample measured profile (as if tuned on GPUs) at `path`.
fn measured(path: &Path) {
    let mut p = artune::export::sample::profile();
    p.simulated = false;
    p.write_atomic(path).unwrap();
}

/// Every situation in which artune suggests a command, each in a directory of its own.
fn situations(root: &Path) -> Vec<Said> {
    let mut out = Vec::new();
    let at = |name: &str| {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    };
    // After a tune: what to run next, for a simulated profile and a measured one.
    let d = at("tune");
    out.push(say(
        "a simulated tune",
        &d,
        &["tune", "--sim", "pcie-8x-2switch", "--out", "p.json"],
        &[],
    ));
    out.push(say(
        "an eager tune of a few sizes, to a path with a space",
        &d,
        &[
            "tune",
            "--sim",
            "pcie-4x-1switch",
            "--sizes",
            "4K:64K",
            "--mode",
            "eager",
            "--out",
            "my p.json",
        ],
        &[],
    ));
    let d = at("measured");
    measured(&d.join("m.json"));
    let m = artune::profile::Profile::load(&d.join("m.json")).unwrap();
    out.push(Said {
        situation: "a measured profile's next steps".into(),
        dir: d.clone(),
        text: artune::report::next_steps(Path::new("m.json"), &m),
    });
    // Stale verdicts name the command that tunes the checked machine again.
    let d = at("stale");
    assert!(artune_in(
        &d,
        &[
            "tune",
            "--sim",
            "pcie-4x-1switch",
            "--tp",
            "4",
            "--out",
            "box.json"
        ],
        &[]
    )
    .status
    .success());
    out.push(say(
        "check on another machine",
        &d,
        &["check", "box.json", "--sim", "pcie-2x"],
        &[],
    ));
    let d = at("stale-measured");
    assert!(artune_in(
        &d,
        &[
            "tune",
            "--sim",
            "pcie-4x-1switch",
            "--tp",
            "4",
            "--mode",
            "graph",
            "--out",
            "box.json"
        ],
        &[]
    )
    .status
    .success());
    out.push(say(
        "check --measure with NCCL slowed",
        &d,
        &[
            "check",
            "box.json",
            "--measure",
            "--sim",
            "pcie-4x-1switch",
            "--sim-faults",
            "slow=nccl:3",
        ],
        &[],
    ));
    out.push(say(
        "check in another NCCL environment",
        &d,
        &["check", "box.json", "--sim", "pcie-4x-1switch"],
        &[("NCCL_PROTO", "Simple")],
    ));
    // A profile that does not parse.
    let d = at("broken");
    std::fs::write(d.join("bad.json"), "{").unwrap();
    out.push(say("a broken profile", &d, &["show", "bad.json"], &[]));
    std::fs::write(d.join("old.json"), r#"{"schema_version": 0}"#).unwrap();
    out.push(say("an old profile", &d, &["show", "old.json"], &[]));
    let topo = artune_in(&d, &["topo", "--sim", "pcie-2x", "--json"], &[]);
    std::fs::write(d.join("box.json"), topo.stdout).unwrap();
    out.push(say(
        "a topology file as a profile",
        &d,
        &["show", "box.json"],
        &[],
    ));
    // doctor's advice: on a model, with a simulated profile, with NCCL variables set, and on
    // fixture trees where P2P, a link or another process is wrong.
    let d = at("doctor");
    assert!(
        artune_in(&d, &["tune", "--sim", "pcie-2x", "--out", "sim.json"], &[])
            .status
            .success()
    );
    out.push(say(
        "doctor on a model",
        &d,
        &["doctor", "--sim", "pcie-8x-2switch"],
        &[],
    ));
    out.push(say(
        "doctor with a simulated profile",
        &d,
        &["doctor", "--sim", "pcie-2x", "--profile", "sim.json"],
        &[],
    ));
    measured(&d.join("m.json"));
    out.push(say(
        "doctor with a profile of another machine",
        &d,
        &["doctor", "--sim", "pcie-2x", "--profile", "m.json"],
        &[],
    ));
    out.push(say(
        "doctor with NCCL variables set",
        &d,
        &["doctor", "--sim", "pcie-2x"],
        &[("NCCL_ALGO", "Ring"), ("NCCL_PROTO", "Simple")],
    ));
    let fixture = |p: &str| format!("{}/tests/fixtures/doctor/{p}", env!("CARGO_MANIFEST_DIR"));
    for (what, topo, tree) in [
        ("doctor on refused P2P", "unlike-no-p2p.json", "acs-off"),
        ("doctor on a narrow link", "two-gpus-gen4x8.json", "gen4x8"),
        ("doctor on a topology file", "two-gpus.json", "acs-off"),
    ] {
        let (t, sys, proc) = (
            fixture(topo),
            fixture(&format!("{tree}/sys")),
            fixture(&format!("{tree}/proc")),
        );
        out.push(say(
            what,
            &d,
            &[
                "doctor",
                "--topology",
                &t,
                "--sysfs-root",
                &sys,
                "--proc-root",
                &proc,
            ],
            &[],
        ));
    }
    out.push(say(
        "doctor --measure finding wrong data",
        &d,
        &[
            "doctor",
            "--sim",
            "pcie-4x-1switch",
            "--measure",
            "--sim-faults",
            "wrong=one_stage_pull",
        ],
        &[],
    ));
    let o = artune_in(&d, &["topo", "--sim", "pcie-2x", "--json"], &[]);
    let mut t: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for pair in t["pairs"].as_array_mut().unwrap() {
        pair["p2p"]["read"] = "unknown".into();
        pair["p2p"]["write"] = "unknown".into();
    }
    std::fs::write(d.join("unknown-p2p.json"), t.to_string()).unwrap();
    out.push(say(
        "doctor on a topology with no P2P status",
        &d,
        &["doctor", "--topology", "unknown-p2p.json"],
        &[],
    ));
    std::fs::write(
        d.join("busy.json"),
        r#"{"gpus": [{"index": 0, "processes": [{"pid": 4242, "name": "matmul"}], "utilization_pct": 90}]}"#,
    )
    .unwrap();
    out.push(say(
        "doctor beside another process",
        &d,
        &["doctor", "--sim", "pcie-2x", "--sim-occupancy", "busy.json"],
        &[],
    ));
    // Many nodes, none tuned yet.
    let d = at("fleet");
    std::fs::create_dir_all(d.join("nodes")).unwrap();
    out.push(say("fleet of no profile", &d, &["fleet", "nodes"], &[]));
    // A workload that does not parse.
    let d = at("predict");
    assert!(
        artune_in(&d, &["tune", "--sim", "pcie-2x", "--out", "p.json"], &[])
            .status
            .success()
    );
    out.push(say(
        "a bad workload",
        &d,
        &["predict", "p.json", "--workload", "x"],
        &[],
    ));
    std::fs::write(d.join("w.json"), "{").unwrap();
    out.push(say(
        "a workload file that does not parse",
        &d,
        &["predict", "p.json", "--workload", "w.json"],
        &[],
    ));
    // The exports' own pointers to other commands.
    out.push(say(
        "the env export",
        &d,
        &["export", "p.json", "--engine", "env"],
        &[],
    ));
    // Commands that need a GPU, on this machine without one.
    let d = at("no-gpu");
    out.push(say("bench without a GPU", &d, &["bench", "kernels"], &[]));
    assert!(
        artune_in(&d, &["tune", "--sim", "pcie-2x", "--out", "sim.json"], &[])
            .status
            .success()
    );
    out.push(say(
        "check --measure without a GPU",
        &d,
        &["check", "sim.json", "--measure"],
        &[],
    ));
    out.push(say(
        "tune without a GPU",
        &d,
        &["tune", "--out", "p.json"],
        &[],
    ));
    out
}

#[test]
fn every_suggested_command_runs_as_printed() {
    let root = tempfile::tempdir().unwrap();
    let said = situations(root.path());
    let mut failed = Vec::new();
    let mut ran = 0;
    for s in &said {
        for line in suggested(&s.text) {
            ran += 1;
            let o = run_suggestion(&s.dir, &line);
            common::assert_no_panic(&text(&o.stderr));
            if !acceptable(&line, &o) {
                failed.push(format!(
                    "{}: `{line}` exited {:?}: {}",
                    s.situation,
                    o.status.code(),
                    text(&o.stderr).trim()
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    // Enough ran for the scan below to mean something (at least one command per situation).
    assert!(
        ran >= said.len(),
        "only {ran} commands for {} situations",
        said.len()
    );
}

/// The string literals under src/ (test modules left out) that print a backticked command,
/// cut into the parts between `{...}` format arguments.
fn suggesting_literals() -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let name = p.file_name().unwrap().to_string_lossy();
        if !name.ends_with(".rs") || name == "tests.rs" {
            continue;
        }
        let src = std::fs::read_to_string(&p).unwrap();
        let src = src.split("#[cfg(test)]").next().unwrap();
        for line in src.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for lit in line.split('"').skip(1).step_by(2) {
                if !(lit.contains("`artune ") || lit.contains("`env -u")) {
                    continue;
                }
                let parts: Vec<String> = lit
                    .replace("\\n", "")
                    .replace("{{", "\u{0}")
                    .replace("}}", "\u{1}")
                    .split(['{', '}'])
                    .step_by(2)
                    .map(|s| s.replace('\u{0}', "{").replace('\u{1}', "}"))
                    .filter(|s| s.trim().len() >= 4)
                    .collect();
                out.push((format!("{}: \"{lit}\"", p.display()), parts));
            }
        }
    }
    out
}

/// Messages no situation here can print, and why; their commands are among those run above.
const UNREACHABLE: [&str; 1] = [
    // Links below their maximum as NVML read them idle: only a real machine reads links.
    "to read them under load (idle GPUs lower the generation",
];

#[test]
fn every_message_that_suggests_a_command_is_printed_by_a_situation_above() {
    let root = tempfile::tempdir().unwrap();
    let all: String = situations(root.path())
        .into_iter()
        .map(|s| s.text)
        .collect::<Vec<_>>()
        .join("\n");
    let literals = suggesting_literals();
    assert!(literals.len() >= 10, "{literals:?}");
    let missing: Vec<&String> = literals
        .iter()
        .filter(|(at, _)| !UNREACHABLE.iter().any(|u| at.contains(u)))
        .filter(|(_, parts)| !parts.iter().all(|p| all.contains(p.as_str())))
        .map(|(at, _)| at)
        .collect();
    assert!(
        missing.is_empty(),
        "no situation in tests/suggestions.rs prints these; add one that does:\n{}",
        missing
            .iter()
            .map(|m| m.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

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

/// A profile with two placements of TP2 (GPUs 0,1 on one socket; 3,4 across the two).
fn two_placements(dir: &Path) -> PathBuf {
    let args = [
        "--sim",
        "pcie-8x-direct-2socket",
        "--tp",
        "2",
        "--mode",
        "graph",
    ];
    tuned(dir, "two.json", &args)
}

#[test]
fn select_and_why_answer_for_the_placement_asked_and_name_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = two_placements(dir.path());
    let p = p.to_str().unwrap();
    let json = |args: &[&str]| -> serde_json::Value {
        let o = artune(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o.stderr));
        serde_json::from_str(&text(&o.stdout)).unwrap()
    };
    let default = json(&["select", p, "--tp", "2", "--bytes", "1M", "--json"]);
    let across = json(&[
        "select", p, "--tp", "2", "--bytes", "1M", "--gpus", "3,4", "--json",
    ]);
    assert_eq!(default["gpus"], serde_json::json!([0, 1]));
    assert_eq!(default["other_placements"], serde_json::json!([[3, 4]]));
    assert_eq!(across["gpus"], serde_json::json!([3, 4]));
    assert_eq!(
        across["placement"],
        "2 root ports, 2 root complexes, 2 sockets"
    );
    // At 1M the two placements choose differently (NCCL's own choice on one socket,
    // one-stage push across sockets, where NCCL's rings cross the socket link): the answer
    // depends on the GPUs asked.
    assert_ne!(default["backend"], across["backend"], "{default} {across}");
    // Text: the backend alone on stdout, the group it answered for on stderr.
    let o = artune(&["select", p, "--tp", "2", "--bytes", "1M"]);
    assert_eq!(text(&o.stdout).trim(), default["backend"].as_str().unwrap());
    let err = text(&o.stderr);
    assert!(
        err.contains("answered for TP2 graph on GPUs 0,1 (2 root ports, 2 root complexes)")
            && err.contains("--gpus 3,4"),
        "{err}"
    );
    // why explains the same group select answered for.
    let w = json(&[
        "why", p, "--tp", "2", "--bytes", "1M", "--gpus", "3,4", "--json",
    ]);
    assert_eq!(w["gpus"], serde_json::json!([3, 4]));
    assert_eq!(w["chosen"], across["backend"]);
    // The same GPUs in another order (the ranks' order) are the same group.
    for cmd in ["select", "why"] {
        let swapped = json(&[
            cmd, p, "--tp", "2", "--bytes", "1M", "--gpus", "4,3", "--json",
        ]);
        assert_eq!(swapped["gpus"], serde_json::json!([3, 4]), "{cmd}");
    }
    let o = json(&[
        "select", p, "--tp", "2", "--bytes", "1M", "--gpus", "4,3", "--json",
    ]);
    assert_eq!(o["backend"], across["backend"]);
}

#[test]
fn no_answer_exits_6_with_a_null_backend_and_bad_gpus_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let p = two_placements(dir.path());
    let p = p.to_str().unwrap();
    for cmd in ["select", "why"] {
        for (extra, says) in [
            (vec!["--tp", "2", "--bytes", "1G"], "above the largest size"),
            (
                vec!["--tp", "2", "--bytes", "4K", "--gpus", "5,6"],
                "no TP2 graph group on GPUs 5,6",
            ),
            (vec!["--bytes", "4K", "--tp", "8"], "no TP8 graph group"),
        ] {
            let mut args = vec![cmd, p, "--json"];
            args.extend(&extra);
            let o = artune(&args);
            let err = text(&o.stderr);
            assert_eq!(o.status.code(), Some(6), "{args:?}: {err}");
            assert!(
                err.contains("keep the engine's default") && err.contains(says),
                "{err}"
            );
            let v: serde_json::Value = serde_json::from_str(&text(&o.stdout)).unwrap();
            assert!(v["backend"].is_null(), "{v}");
        }
        for gpus in ["3", "3,3", "3,4,5"] {
            let o = artune(&[cmd, p, "--tp", "2", "--bytes", "4K", "--gpus", gpus]);
            let err = text(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{gpus}: {err}");
            assert!(
                err.starts_with("error: --gpus") && !err.contains("panicked"),
                "{err}"
            );
        }
    }
}

#[test]
fn version_names_the_commit_and_help_shows_examples() {
    let o = artune(&["--version"]);
    let v = text(&o.stdout);
    assert!(v.starts_with("artune 0.") && v.contains("(commit "), "{v}");
    let o = artune(&["select", "--help"]);
    let h = text(&o.stdout);
    assert!(
        h.contains("Example: artune select") && h.contains("--gpus <IDS>"),
        "{h}"
    );
    let o = artune(&["tune", "--sim", "pcie-2x", "--mem-budget", "0"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("leaves no custom kernel; give a size"),
        "{err}"
    );
    // Nor does 1 byte or half a KiB leave one, refused alike with the least that does.
    for b in ["1", "0.5K"] {
        let o = artune(&["tune", "--sim", "pcie-2x", "--mem-budget", b]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains("leaves no custom kernel at any size: the smallest needs"),
            "{err}"
        );
    }
}

#[test]
fn show_prints_shared_lines_once_aligns_columns_and_lists_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--sim",
        "pcie-8x-2switch",
        "--tp",
        "4",
        "--mem-budget",
        "4M",
        "--no-contention",
    ];
    let p = tuned(dir.path(), "b.json", &args);
    let o = artune(&["show", p.to_str().unwrap()]);
    let s = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0));
    // Four groups, one NCCL memory line: the same for each, so printed once.
    assert_eq!(s.matches("\nTP4 ").count(), 4, "{s}");
    assert_eq!(s.matches("NCCL communicator").count(), 1, "{s}");
    assert!(s.contains("every group:\n  NCCL communicator"), "{s}");
    assert!(s.contains("memory budget: 4M per GPU"), "{s}");
    // From 384K two_stage_push needs more than 4M per GPU (512K of it its LL lines, whatever
    // the size): excluded from the first bucket
    // there (384K where the tune refined around a change of winner, else 512K), and show
    // says so.
    assert!(
        s.contains("over the memory budget, excluded:")
            && ["384K", "448K", "512K"]
                .iter()
                .any(|at| s.contains(&format!("two_stage_push at {at}"))),
        "{s}"
    );
    // Titles sit over their values.
    let lines: Vec<&str> = s.lines().collect();
    let head = lines
        .iter()
        .position(|l| l.contains("extra mem/GPU"))
        .unwrap();
    let (h, row) = (lines[head], lines[head + 1]);
    let row: Vec<char> = row.chars().collect();
    for title in ["backend", "vs nccl", "extra mem/GPU"] {
        let at = h[..h.find(title).unwrap()].chars().count();
        assert!(
            row[at] != ' ' && row[at - 1] == ' ',
            "{title} not over its column:\n{h}\n{}",
            row.iter().collect::<String>()
        );
    }
    assert!(!s.contains("at 0B") && !s.contains("% faster"), "{s}");
    let j: serde_json::Value = serde_json::from_str(&text(
        &artune(&["show", p.to_str().unwrap(), "--json"]).stdout,
    ))
    .unwrap();
    assert_eq!(j["mem_budget_bytes"], 4 << 20);
    assert!(j["groups"][0]["over_budget"]
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o["backend"] == "two_stage_push"));
}

#[test]
fn tune_prints_status_on_stderr_with_the_next_commands() {
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
        "--plot",
        dir.path().join("plots").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(
        !stdout.contains("written") && !stdout.contains("wrote"),
        "{stdout}"
    );
    assert!(
        stderr.contains("wrote") && stderr.contains("profile written to"),
        "{stderr}"
    );
    let p = out.display().to_string();
    assert!(stderr.contains(&format!("artune show {p}")), "{stderr}");
    assert!(
        stderr.contains(&format!("artune why {p} --tp 2 --gpus 0,1")),
        "{stderr}"
    );
}

#[test]
fn predict_interpolates_between_buckets_and_follows_select_below_them() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--sim",
        "pcie-8x-2switch",
        "--tp",
        "8",
        "--mode",
        "graph",
        "--sizes",
        "16K:256K",
        "--no-contention",
    ];
    let p = tuned(dir.path(), "story.json", &args);
    let p = p.to_str().unwrap();
    let o = artune(&["predict", p, "--workload", "122x7168xbf16@3..16", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_str(&text(&o.stdout)).unwrap();
    assert!(v["estimate"].as_str().unwrap().contains("log-log"), "{v}");
    let ms: Vec<f64> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["ms"]["profile"].as_f64().unwrap())
        .collect();
    // Each token adds bytes, and so time: no two token counts share one bucket's time. Where
    // the profile's choice changes, the time may step down by less than the rule's 5% edge
    // (a backend up to 5% faster does not displace the choice until it is more).
    assert!(
        ms.windows(2).all(|w| w[1] != w[0] && w[1] > 0.95 * w[0]),
        "{ms:?}"
    );
    // NCCL's LL steps overlap their data (C1: 17.3 µs at 4 KB, 25.0 at 256 KB), so 3 to 16
    // tokens (43 KB to 229 KB) add a tenth or more, not much more.
    assert!(ms[ms.len() - 1] > 1.1 * ms[0], "{ms:?}");
    // At a measured size the prediction is the measurement select reports.
    let sel = artune(&["select", p, "--tp", "8", "--bytes", "32K", "--json"]);
    let sel: serde_json::Value = serde_json::from_str(&text(&sel.stdout)).unwrap();
    let o = artune(&["predict", p, "--workload", "1x32K", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&text(&o.stdout)).unwrap();
    let at = v["steps"][0]["ms"]["profile"].as_f64().unwrap() * 1000.0;
    assert!(
        (at - sel["expected_us"].as_f64().unwrap()).abs() < 1e-6,
        "{at} {sel}"
    );
    // Below the smallest size (16K, above the 4 KiB floor) select has no answer: nor has predict.
    assert_eq!(
        artune(&["select", p, "--tp", "8", "--bytes", "8K"])
            .status
            .code(),
        Some(6)
    );
    // No step priced is no answer, as select's: exit 6, in text and JSON.
    let o = artune(&["predict", p, "--workload", "1x8K"]);
    let s = text(&o.stdout);
    assert_eq!(o.status.code(), Some(6));
    assert!(
        s.contains("below the smallest measured") && s.contains("not predicted"),
        "{s}"
    );
    let o = artune(&["predict", p, "--workload", "1x8K", "--json"]);
    assert_eq!(o.status.code(), Some(6));
    // One step that holds sizes on both sides names each side, not the last one for both.
    let o = artune(&["predict", p, "--workload", "1x8K+2x1M"]);
    let s = text(&o.stdout);
    assert!(
        s.contains(
            "1 size below the smallest measured (16K); 1 size above the largest measured (256K)"
        ),
        "{s}"
    );
    // Priced where any step is (8K at T=4 is not, 128K at T=64 is): exit 0.
    let o = artune(&["predict", p, "--workload", "1x1024xbf16@4,64"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
}

#[test]
fn plots_name_the_fabric_label_every_mark_and_replace_a_previous_run() {
    let dir = tempfile::tempdir().unwrap();
    let plots = dir.path().join("plots");
    let plot_args = |sim: &str, out: &str| {
        let out = dir.path().join(out);
        let o = artune(&[
            "tune",
            "--sim",
            sim,
            "--tp",
            "2",
            "--mode",
            "graph",
            "--sizes",
            "64K:8M",
            "--no-contention",
            "--plot",
            plots.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    };
    plot_args("pcie-8x-2switch", "a.json");
    assert!(plots.join("tp2-graph-gpus3_4.svg").exists());
    std::fs::write(plots.join("notes.txt"), "mine").unwrap();
    plot_args("pcie-4x-1switch", "b.json");
    let mut names: Vec<String> = std::fs::read_dir(&plots)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // The 8-GPU machine's GPUs 3,4 plot is gone; a file artune did not write stays.
    assert_eq!(names, ["notes.txt", "tp2-graph-gpus0_1.svg"]);
    let svg = std::fs::read_to_string(plots.join("tp2-graph-gpus0_1.svg")).unwrap();
    for needle in [
        "simulated pcie-4x-1switch [SIMULATED]",
        " µs",
        "crossover: the choice changes",
        "the profile&apos;s choice at each size (dot)",
        "speed-up over NCCL",
    ] {
        assert!(svg.contains(needle), "{needle} missing");
    }
    assert!(!svg.contains("00000.0"), "raw log ticks");
}

/// The x of every `<text x="..">LABEL</text>` in an SVG plotters wrote.
fn text_x(svg: &str, label: &str) -> Vec<f64> {
    let mut out = Vec::new();
    for (i, _) in svg.match_indices(&format!(">\n{label}\n</text>")) {
        let start = svg[..i].rfind("<text x=\"").unwrap() + 9;
        let x: String = svg[start..].chars().take_while(|c| *c != '"').collect();
        out.push(x.parse().unwrap());
    }
    out
}

/// A plot never shows a backend faster than the choice without saying why (on NVSwitch the
/// kernels are modelled up to 2.8x faster than NCCL at 1K, within the model's error, while
/// the choice is NCCL), names every backend the group measured, and keeps its legend in a
/// column of its own, right of the data (on TP2 it covered the curves).
#[test]
fn plots_say_why_a_faster_backend_was_not_chosen_and_keep_the_legend_clear() {
    let dir = tempfile::tempdir().unwrap();
    let plots = dir.path().join("plots");
    let out = dir.path().join("p.json");
    let o = artune(&[
        "tune",
        "--sim",
        "nvswitch-8x",
        "--tp",
        "8",
        "--mode",
        "graph",
        "--no-contention",
        "--plot",
        plots.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let svg = std::fs::read_to_string(plots.join("tp8-graph-gpus0_1_2_3_4_5_6_7.svg")).unwrap();
    assert!(
        svg.contains("faster than the choice, not chosen (lower panel):"),
        "no legend for the passed-over marks"
    );
    assert!(
        svg.contains("not sure: within the model&apos;s error"),
        "no reason"
    );
    let p = artune::profile::Profile::load(&out).unwrap();
    let data_right = 900.0;
    for b in p.groups[0].buckets[0].results.keys() {
        let xs = text_x(&svg, b.id());
        assert_eq!(xs.len(), 1, "{} in the legend once: {xs:?}", b.id());
        assert!(
            xs[0] > data_right,
            "{}'s legend entry at x {} is over the data",
            b.id(),
            xs[0]
        );
    }
}

/// Whether `cell` reads as an amount of memory: "0 B", "2.3 MiB", "139.7 GiB".
fn reads_as_memory(cell: &str) -> bool {
    let Some((n, unit)) = cell.trim().split_once(' ') else {
        return false;
    };
    let tenths = n.split_once('.').is_some_and(|(i, f)| {
        f.len() == 1 && [i, f].iter().all(|d| d.chars().all(|c| c.is_ascii_digit()))
    });
    match unit {
        "B" => n.chars().all(|c| c.is_ascii_digit()),
        "KiB" | "MiB" | "GiB" => tenths,
        _ => false,
    }
}

#[test]
fn memory_reads_as_memory_in_show_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--sim", "pcie-4x-1switch", "--tp", "4", "--sizes", "1K:1M"];
    let p = tuned(dir.path(), "m.json", &args);
    let s = text(&artune(&["show", p.to_str().unwrap()]).stdout);
    let lines: Vec<&str> = s.lines().collect();
    let head = lines
        .iter()
        .position(|l| l.contains("extra mem/GPU"))
        .unwrap();
    let h = lines[head];
    let col = |t: &str| h[..h.find(t).unwrap()].chars().count();
    let (from, to) = (col("extra mem/GPU"), col("notes"));
    let rows: Vec<String> = lines[head + 1..]
        .iter()
        .take_while(|l| !l.contains("crossovers:"))
        .map(|l| l.chars().skip(from).take(to - from).collect())
        .collect();
    assert!(rows.len() >= 2, "{s}");
    assert!(rows.iter().all(|c| reads_as_memory(c)), "{rows:?}\n{s}");
    assert!(rows.iter().any(|c| c.contains("MiB")), "{rows:?}");
    let nccl = s.split("NCCL communicator: ").nth(1).unwrap();
    assert!(
        reads_as_memory(nccl.split(" per GPU").next().unwrap()),
        "{s}"
    );

    let o = artune(&["why", p.to_str().unwrap(), "--tp", "4", "--bytes", "16K"]);
    let w = text(&o.stdout);
    let head = w.lines().position(|l| l.ends_with("extra memory")).unwrap();
    let cells: Vec<String> = w
        .lines()
        .skip(head + 1)
        .take_while(|l| !l.is_empty() && !l.contains("not measured"))
        .map(|l| {
            let t: Vec<&str> = l
                .split("  model band")
                .next()
                .unwrap()
                .split_whitespace()
                .collect();
            t[t.len() - 2..].join(" ")
        })
        .collect();
    assert!(cells.len() >= 2, "{w}");
    assert!(cells.iter().all(|c| reads_as_memory(c)), "{cells:?}\n{w}");
}

/// A log read through a pipe (a file, `head`, CI) is plain text: no terminal colour codes.
#[test]
fn a_piped_log_has_no_colour_codes() {
    let o = artune(&["-vv", "topo", "--sim", "pcie-2x"]);
    assert_eq!(o.status.code(), Some(0));
    let err = text(&o.stderr);
    assert!(err.contains("INFO"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err:?}");
}

/// A negative number is the tool's own one-sentence refusal, not clap's tip to write `-- -1`
/// (which then fails too).
#[test]
fn negative_numbers_are_refused_in_the_tools_words() {
    let dir = tempfile::tempdir().unwrap();
    let p = tuned(
        dir.path(),
        "p.json",
        &["--sim", "pcie-2x", "--sizes", "1K:64K"],
    );
    let p = p.to_str().unwrap();
    for args in [
        vec!["select", p, "--tp", "2", "--bytes", "-1"],
        vec!["predict", p, "--tp", "2", "--workload", "-1x4K"],
        vec!["tune", "--sim", "pcie-2x", "--seed", "-1"],
        vec!["check", p, "--sim", "pcie-2x", "--measure", "--wait", "-1"],
    ] {
        let o = artune(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            !err.contains("tip:") && err.contains("-1"),
            "{args:?}: {err}"
        );
    }
}

/// The same for the numeric options of the commands that ask a profile: `--tp -2` was
/// "unexpected argument '-2' found" and `--tp x` "invalid digit found in string".
#[test]
fn numeric_options_of_the_asking_commands_are_refused_in_their_words() {
    let dir = tempfile::tempdir().unwrap();
    let p = tuned(
        dir.path(),
        "p.json",
        &["--sim", "pcie-2x", "--sizes", "1K:64K"],
    );
    let p = p.to_str().unwrap();
    let tp = "is not a TP size";
    let gpu = "is not a GPU index";
    for (args, said) in [
        (vec!["select", p, "--bytes", "4K", "--tp", "-2"], tp),
        (vec!["why", p, "--bytes", "4K", "--tp", "two"], tp),
        (
            vec!["select", p, "--bytes", "4K", "--tp", "2", "--gpus", "0,-1"],
            gpu,
        ),
        (vec!["predict", p, "--workload", "2x4K", "--tp", "-2"], tp),
        (vec!["predict", p, "--workload", "2x4K", "--gpus", "x"], gpu),
        (vec!["export", p, "--engine", "vllm", "--tp", "-2"], tp),
        (
            vec!["export", p, "--engine", "trtllm", "--hidden", "-7168"],
            "is not a hidden size",
        ),
        (
            vec![
                "export",
                p,
                "--engine",
                "trtllm",
                "--hidden",
                "4096",
                "--world-size",
                "-8",
            ],
            "is not a number of ranks",
        ),
        (vec!["check", p, "--nccl-audit", "--tp", "-2"], tp),
        (
            vec!["bench", "kernels", "--loopback", "-8"],
            "is not a number of virtual ranks",
        ),
    ] {
        let o = artune(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(said), "{args:?}: {err}");
        assert!(
            !err.contains("unexpected argument") && !err.contains("invalid digit"),
            "{args:?}: {err}"
        );
    }
}

/// A negative or unit-bearing value of a numeric tune option is read as that option's value,
/// and refused in the option's own words (it was "unexpected argument '-1' found", which names
/// a value as a flag, or "invalid digit found in string").
#[test]
fn negative_and_odd_numbers_are_refused_in_the_options_words() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("q.json");
    for (flag, value, said) in [
        ("--tp", "-2", "--tp -2: an allreduce needs at least 2 GPUs"),
        ("--tp", "two", "--tp `two` is not a number"),
        ("--sizes", "-1K:1M", "`-1K` is not a byte size"),
        ("--mem-budget", "-1", "`-1` is not a byte size"),
        ("--target-ci", "-1", "--target-ci -1 is outside 0.1%..20%"),
        (
            "--islands",
            "-2,2",
            "--islands -2,2 has an island of fewer than 2 GPUs",
        ),
        ("--islands", "x,2", "--islands `x` is not a number"),
        ("--wait", "5s", "`5s` is not a whole number of seconds"),
        ("--seed", "-1", "`-1` is not a seed"),
        ("--loopback", "-2", "`-2` is not a number of virtual ranks"),
    ] {
        let o = common::artune(&[
            "tune",
            "--sim",
            "pcie-2x",
            "--out",
            out.to_str().unwrap(),
            flag,
            value,
        ]);
        let err = common::text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(said), "{flag} {value}: {err}");
        assert!(
            !err.contains("unexpected argument"),
            "{flag} {value}: {err}"
        );
        assert!(!out.exists());
    }
}

/// Without a GPU, each command's advice is for that command: `check --measure` re-times a
/// simulated machine with --sim or --topology (so said, and so it does), and `bench kernels`,
/// which has no simulated form, says so. Both once offered a simulated `tune` instead.
#[test]
fn without_a_gpu_each_command_says_what_works_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.json");
    let p = p.to_str().unwrap();
    assert!(artune(&["tune", "--sim", "pcie-2x", "--out", p])
        .status
        .success());
    let err = text(&artune(&["check", p, "--measure"]).stderr);
    if !err.contains("without an NVIDIA GPU") {
        eprintln!("skipped: this machine has a GPU ({err})");
        return;
    }
    assert!(err.contains("add --sim PRESET or --topology FILE"), "{err}");
    assert!(!err.contains("artune tune"), "{err}");
    let o = artune(&["check", p, "--measure", "--sim", "pcie-2x"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let err = text(&artune(&["bench", "kernels"]).stderr);
    assert!(err.contains("has no simulated form"), "{err}");
    assert!(!err.contains("artune tune"), "{err}");
}

/// `check --tp`, which only the audit reads, is refused beside --sim, --topology, --measure or
/// --json as it is alone (clap's requirement let it through beside what the audit conflicts
/// with, and --tp 0 with it).
#[test]
fn check_tp_without_the_audit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = tuned(
        dir.path(),
        "p.json",
        &["--sim", "pcie-2x", "--sizes", "1K:64K"],
    );
    let p = p.to_str().unwrap();
    for extra in [
        &["--sim", "pcie-2x", "--tp", "7"][..],
        &["--sim", "pcie-2x", "--tp", "0"],
        &["--sim", "pcie-2x", "--measure", "--tp", "2"],
        &["--sim", "pcie-2x", "--json", "--tp", "2"],
    ] {
        let o = artune(&[&["check", p][..], extra].concat());
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains("add --nccl-audit"), "{extra:?}: {err}");
        assert!(o.stdout.is_empty(), "{extra:?}");
    }
}

/// An export names each engine-specific option its engine does not read (one command line
/// serves every engine, so they are accepted).
#[test]
fn an_export_names_the_options_its_engine_does_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let p = tuned(
        dir.path(),
        "p.json",
        &["--sim", "pcie-2x", "--sizes", "1K:64K"],
    );
    let p = p.to_str().unwrap();
    let o = artune(&[
        "export",
        p,
        "--engine",
        "nccl",
        "--hidden",
        "7168",
        "--allow-simulated",
    ]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("note: --hidden maps bytes to tokens for --engine trtllm only; the nccl export does not read it"),
        "{err}"
    );
    let o = artune(&[
        "export",
        p,
        "--engine",
        "trtllm",
        "--hidden",
        "7168",
        "--allow-simulated",
    ]);
    assert!(!text(&o.stderr).contains("--hidden"), "{}", text(&o.stderr));
}

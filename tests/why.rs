//! `artune why` through the binary: the explanation an engine maintainer asks for first, as
//! text and JSON, and its refusals.

mod common;

use std::path::Path;

use artune::export::sample;
use artune::profile::Profile;

fn run(args: &[&str]) -> (i32, String, String) {
    let o = common::artune(args);
    let err = common::text(&o.stderr);
    common::assert_no_panic(&err);
    (o.status.code().unwrap_or(-1), common::text(&o.stdout), err)
}

fn write(dir: &Path, name: &str, p: &Profile) -> String {
    let path = dir.join(name);
    p.write_atomic(&path).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn why_prints_every_backend_the_rule_and_every_engine() {
    let d = tempfile::tempdir().unwrap();
    let p = sample::profile();
    let file = write(d.path(), "p.json", &p);
    let (code, out, err) = run(&["why", &file, "--tp", "2", "--bytes", "3000"]);
    assert_eq!(code, 0, "{err}");
    let g = &p.groups[0];
    let b = &g.buckets[1];
    assert_eq!(b.bytes, 4096, "3000 bytes is served by the 4 KiB bucket");
    assert!(
        out.contains("3000 bytes: served by the bucket at 4K"),
        "{out}"
    );
    assert!(out.contains(&format!("choice: {}", b.choice)), "{out}");
    assert!(out.contains("why: "), "{out}");
    for k in b.results.keys() {
        assert!(out.contains(k.id()), "{k} missing: {out}");
    }
    for engine in [
        "vLLM",
        "vLLM + artune's plugin",
        "SGLang",
        "SGLang + artune's plugin",
        "SGLang + artune's plugin, FlashInfer group",
        "TensorRT-LLM",
        "NCCL with artune's plugin",
    ] {
        assert!(out.contains(engine), "{engine}: {out}");
    }
    assert!(out.contains("SIMULATED"));
    assert!(err.contains("SIMULATED"));

    let (code, out, err) = run(&[
        "why", &file, "--tp", "4", "--bytes", "1M", "--mode", "eager", "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["tp"], 4);
    assert_eq!(v["mode"], "eager");
    assert_eq!(v["bucket_bytes"], 1 << 20);
    assert!(v["rows"].as_array().unwrap().len() >= 5);
    for r in v["rows"].as_array().unwrap() {
        assert!(r["ci_low_us"].as_f64() <= r["median_us"].as_f64());
        assert!(r["vs_chosen"].is_number());
    }
    assert_eq!(v["engines"].as_array().unwrap().len(), 7);
    assert!(v["smoothed"].is_boolean() && v["reason"].is_string());
    // TP4 on PCIe: vLLM and SGLang disable their kernels, TensorRT-LLM falls back to NCCL.
    for e in v["engines"].as_array().unwrap() {
        assert_eq!(
            e["runs"],
            if e["engine"] == "NCCL with artune's plugin" {
                e["runs"].clone()
            } else {
                "NCCL".into()
            },
            "{e}"
        );
    }
}

#[test]
fn why_refuses_what_the_profile_cannot_answer() {
    let d = tempfile::tempdir().unwrap();
    let file = write(d.path(), "p.json", &sample::profile());
    // No answer is not bad input: exit 6, the engine keeps its default.
    for (args, needle) in [
        (["--tp", "8", "--bytes", "4096"], "no TP8 graph group"),
        (["--tp", "2", "--bytes", "1G"], "above the largest size"),
    ] {
        let (code, out, err) = run(&[&["why", file.as_str()][..], &args[..]].concat());
        assert_eq!(code, 6, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(err.contains("no answer") && err.contains(needle), "{err}");
    }
    for (args, needle) in [
        (vec!["--tp", "2", "--bytes", "0"], "--bytes 0"),
        (vec!["--tp", "2", "--bytes", "lots"], "lots"),
    ] {
        let mut a = vec!["why", file.as_str()];
        a.extend(args.iter().copied());
        let (code, out, err) = run(&a);
        assert_eq!(code, 2, "{a:?}: {err}");
        assert!(out.is_empty(), "{a:?}: {out}");
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{err}");
        assert!(errors[0].contains(needle), "{a:?}: {err}");
    }
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn why_answers_for_the_placement_asked_and_names_it() {
    let d = tempfile::tempdir().unwrap();
    let file = common::tuned(d.path(), "p.json", &["--sim", "pcie-8x-2switch"]);
    let file = file.to_str().unwrap();
    // pcie-8x-2switch tunes TP2 on GPUs 0,1 (one switch) and 3,4 (across the root complex).
    for (gpus, label) in [
        (None, "TP2 graph on GPUs 0,1 (1 switch)"),
        (Some("0,1"), "TP2 graph on GPUs 0,1 (1 switch)"),
        (Some("3,4"), "TP2 graph on GPUs 3,4 (2 switches"),
    ] {
        let mut args = vec!["why", file, "--tp", "2", "--bytes", "3M"];
        args.extend(gpus.iter().flat_map(|g| ["--gpus", *g]));
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{gpus:?}: {err}");
        assert!(out.starts_with(label), "{gpus:?}: {out}");
        args.push("--json");
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{gpus:?}: {err}");
        let v = json(&out);
        let want: Vec<usize> = gpus
            .unwrap_or("0,1")
            .split(',')
            .map(|g| g.parse().unwrap())
            .collect();
        assert_eq!(v["gpus"], serde_json::json!(want), "{gpus:?}");
        assert!(v["group"].as_str().unwrap().starts_with(label), "{v}");
        // The answer is that group's: its chosen backend is the profile's for those GPUs.
        let p = Profile::load(Path::new(file)).unwrap();
        let q = artune::profile::Query {
            tp: 2,
            mode: artune::fabric::Mode::Graph,
            gpus: Some(&want),
        };
        let chosen = match p.select(q, 3 << 20) {
            artune::profile::Selection::Chosen { backend, .. } => backend,
            s => panic!("{s:?}"),
        };
        assert_eq!(v["chosen"], chosen.id(), "{gpus:?}");
    }
}

#[test]
fn why_names_the_memory_budget_as_the_reason_when_it_decided() {
    let d = tempfile::tempdir().unwrap();
    let budget = common::tuned(
        d.path(),
        "b.json",
        &["--sim", "pcie-8x-direct-2socket", "--mem-budget", "1M"],
    );
    let free = common::tuned(d.path(), "p.json", &["--sim", "pcie-8x-direct-2socket"]);
    let why = |file: &Path, bytes: &str| {
        let (code, out, err) = run(&[
            "why",
            file.to_str().unwrap(),
            "--tp",
            "8",
            "--bytes",
            bytes,
            "--json",
        ]);
        assert_eq!(code, 0, "{err}");
        json(&out)
    };
    // At 4K the rule takes two_stage_push (its LL form) unless the budget excludes it (on
    // this box NCCL's defaults cross root complexes through host memory; the kernel wins
    // beyond the bands).
    let v = why(&free, "4K");
    assert_eq!(v["chosen"], "two_stage_push", "{v}");
    assert!(
        !v["reason"].as_str().unwrap().contains("--mem-budget"),
        "{v}"
    );
    let v = why(&budget, "4K");
    let reason = v["reason"].as_str().unwrap();
    // An NCCL variant serves (its ring and tree LL tie there; band smoothing picks one).
    assert!(v["chosen"].as_str().unwrap().starts_with("nccl"), "{v}");
    assert!(
        reason.contains("The reason is --mem-budget: without it the rule picks two_stage_push"),
        "{reason}"
    );
    assert!(reason.contains("memory budget of 1M per GPU"), "{reason}");
    assert!(!reason.contains("No custom kernel beats it"), "{reason}");
    assert!(!v["over_budget"].as_array().unwrap().is_empty(), "{v}");
    // At 16M the excluded kernels are faster by median but within the model's bands, so
    // they would not have won: the budget is named, and not as the reason.
    let v = why(&budget, "16M");
    let reason = v["reason"].as_str().unwrap();
    assert!(reason.contains("--mem-budget"), "{reason}");
    assert!(reason.contains("would still answer nccl"), "{reason}");
    assert!(!reason.contains("The reason is --mem-budget"), "{reason}");
    // The text form says the same.
    let (code, out, err) = run(&[
        "why",
        budget.to_str().unwrap(),
        "--tp",
        "8",
        "--bytes",
        "4K",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("The reason is --mem-budget"), "{out}");
}

#[test]
fn why_never_says_no_kernel_is_faster_beside_a_faster_kernel() {
    let d = tempfile::tempdir().unwrap();
    let file = common::tuned(d.path(), "p.json", &["--sim", "pcie-8x-2switch"]);
    let file = file.to_str().unwrap();
    // README's own example (TP8 112K) and TP2 64K: NCCL serves though a custom kernel's row
    // is faster. The reason must be the margin the rule lost it by, named with its band.
    for (tp, bytes) in [("8", "112K"), ("2", "64K"), ("8", "64K"), ("2", "1M")] {
        let (code, out, err) = run(&["why", file, "--tp", tp, "--bytes", bytes, "--json"]);
        assert_eq!(code, 0, "{err}");
        let v = json(&out);
        let reason = v["reason"].as_str().unwrap();
        assert!(v["chosen"].as_str().unwrap().starts_with("nccl"), "{v}");
        let faster: Vec<&str> = v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| !r["backend"].as_str().unwrap().starts_with("nccl"))
            .filter(|r| r["vs_chosen"].as_f64().unwrap() < 0.0)
            .map(|r| r["backend"].as_str().unwrap())
            .collect();
        assert!(!faster.is_empty(), "TP{tp} {bytes}: {v}");
        assert!(!reason.contains("No custom kernel is faster"), "{reason}");
        let shorts = v["rule"]["kernels_short"].as_array().unwrap();
        for k in &faster {
            assert!(reason.contains(k), "TP{tp} {bytes}: {k} unnamed: {reason}");
            let s = shorts.iter().find(|s| s["backend"] == *k).unwrap();
            assert!(s["because"].is_string(), "{s}");
        }
        // On this simulated box the decisive margin of the fastest is the model's error,
        // with the bands that decided it.
        assert_eq!(shorts[0]["because"], "within_model", "{v}");
        assert!(shorts[0]["a_band"][1].as_f64().unwrap() > 1.0, "{v}");
        assert_eq!(v["rule"]["clause"], "nccl_reference");
        let (_, text, _) = run(&["why", file, "--tp", tp, "--bytes", bytes]);
        let why = text.lines().find(|l| l.starts_with("why: ")).unwrap();
        // The prose's times are the 95% intervals' ends widened by the bands, the table's
        // the medians': each says which, so the two figures do not read as a contradiction.
        assert!(
            why.contains(
                "but within the model's error: their 95% intervals' ends widened by their bands put "
            ),
            "{why}"
        );
        assert!(text.contains("  model band of the median "), "{text}");
    }
}

/// A topology that leaves its switches' make unstated, on four root complexes: the custom
/// kernels' band covers a collapse it may have (about x26 either way), far outside what the
/// model's calibration supports. show, why and predict flag those times and print them as
/// rough as they are known; a preset's times within calibration are not flagged.
#[test]
fn times_outside_the_models_calibration_are_flagged_not_printed_precisely() {
    let d = tempfile::tempdir().unwrap();
    let o = common::artune(&["topo", "--sim", "pcie-8x-2switch", "--json"]);
    let mut t: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let (so, rc, sw, g) = (
        t["sockets"][0].clone(),
        t["root_complexes"][0].clone(),
        t["switches"][0].clone(),
        t["gpus"][0].clone(),
    );
    let with = |v: &serde_json::Value, kv: serde_json::Value| {
        let mut v = v.clone();
        for (k, x) in kv.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    t["pairs"] = serde_json::json!([]);
    t["sockets"] = (0..2)
        .map(|i| with(&so, serde_json::json!({"id": i})))
        .collect();
    t["root_complexes"] = (0..4)
        .map(|i| {
            with(
                &rc,
                serde_json::json!({"id": format!("rc{i}"), "socket": i / 2}),
            )
        })
        .collect();
    t["switches"] = (0..4)
        .map(|i| {
            let mut s = with(
                &sw,
                serde_json::json!({"id": format!("sw{i}"), "parent": format!("rc{i}")}),
            );
            for k in ["vendor", "device", "contention"] {
                s.as_object_mut().unwrap().remove(k);
            }
            s
        })
        .collect();
    t["gpus"] = (0..8)
        .map(|i| {
            let parent = format!("sw{}", i / 2);
            with(
                &g,
                serde_json::json!({"index": i, "parent": parent, "numa_node": i / 4}),
            )
        })
        .collect();
    let topo = d.path().join("t.json");
    std::fs::write(&topo, t.to_string()).unwrap();
    let args = [
        "--topology",
        topo.to_str().unwrap(),
        "--tp",
        "8",
        "--sizes",
        "64K:1M",
    ];
    let file = common::tuned(
        d.path(),
        "p.json",
        &[&args[..], &["--no-contention"]].concat(),
    );
    let file = file.to_str().unwrap();

    let (code, out, err) = run(&["show", file]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.contains("OUTSIDE CALIBRATION"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("no estimate of the machine"), "{line}");
    assert!(
        !out.contains("custom kernels x0.0"),
        "a band outside calibration as a range: {out}"
    );

    let (code, out, err) = run(&["why", file, "--tp", "8", "--bytes", "1M", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let flagged: Vec<&serde_json::Value> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["outside_calibration"] == true)
        .collect();
    assert!(!flagged.is_empty(), "{v}");
    let (_, text, _) = run(&["why", file, "--tp", "8", "--bytes", "1M"]);
    for r in flagged {
        let id = r["backend"].as_str().unwrap();
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("{id} ")))
            .unwrap();
        assert!(
            row.contains("OUTSIDE CALIBRATION") && row.contains('~'),
            "{row}"
        );
        assert!(!row.contains(" ms .."), "printed precisely: {row}");
    }

    let (code, out, err) = run(&["predict", file, "--workload", "4x1M", "--tp", "8"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("\n~: priced from simulated times OUTSIDE the model's calibration"),
        "{out}"
    );
    let (_, out, _) = run(&["predict", file, "--workload", "4x1M", "--tp", "8", "--json"]);
    assert_eq!(
        json(&out)["steps"][0]["outside_calibration"][0],
        "one_stage",
        "{out}"
    );

    // A preset within calibration: nothing flagged.
    let preset = common::tuned(
        d.path(),
        "q.json",
        &[
            "--sim",
            "pcie-8x-2switch",
            "--tp",
            "8",
            "--sizes",
            "64K:1M",
            "--no-contention",
        ],
    );
    let (_, out, _) = run(&["show", preset.to_str().unwrap()]);
    assert!(!out.contains("OUTSIDE"), "{out}");
}

#[test]
fn why_says_the_form_the_choice_was_timed_in_where_the_profile_records_it() {
    use artune::allreduce::{Form, Mode};
    let d = tempfile::tempdir().unwrap();
    let mut p = sample::profile();
    let at = |p: &Profile, mode: Mode| {
        let g = p.groups.iter().position(|g| g.tp == 2 && g.mode == mode);
        let g = g.unwrap();
        let b = p.groups[g].buckets.iter().find(|b| b.choice.is_custom());
        (g, b.expect("a custom choice").clone())
    };
    let ((graph, gb), (eager, eb)) = (at(&p, Mode::Graph), at(&p, Mode::Eager));
    let ask = |file: &str, mode: &str, bytes: u64| {
        let (code, out, err) = run(&[
            "why",
            file,
            "--tp",
            "2",
            "--bytes",
            &bytes.to_string(),
            "--mode",
            mode,
        ]);
        assert_eq!(code, 0, "{err}");
        out
    };
    // An older profile records none: nothing is said.
    let file = write(d.path(), "old.json", &p);
    assert!(!ask(&file, "graph", gb.bytes).contains("form:"));
    p.groups[graph].forms = [(gb.choice, Form::Registered)].into();
    p.groups[eager].forms = [(eb.choice, Form::Staged)].into();
    let file = write(d.path(), "p.json", &p);
    let out = ask(&file, "graph", gb.bytes);
    assert!(
        out.contains(&format!("form: {} was timed registered", gb.choice))
            && out.contains("register_graph_buffers()"),
        "{out}"
    );
    let out = ask(&file, "eager", eb.bytes);
    assert!(
        out.contains(&format!(
            "form: {} was timed staged: each eager call",
            eb.choice
        )),
        "{out}"
    );
    let (code, out, _) = run(&[
        "why",
        &file,
        "--tp",
        "2",
        "--bytes",
        &gb.bytes.to_string(),
        "--json",
    ]);
    assert_eq!(code, 0);
    assert_eq!(json(&out)["form"], "registered", "{out}");
}

/// The sample's TP2 graph group and its first bucket from 1000 bytes, where NCCL's answer is a
/// pinned variant.
fn tp2_graph_pin(
    p: &mut artune::profile::Profile,
) -> (&mut artune::profile::GroupProfile, artune::profile::Bucket) {
    let g = p
        .groups
        .iter()
        .position(|g| g.tp == 2 && g.mode == artune::allreduce::Mode::Graph);
    let g = &mut p.groups[g.unwrap()];
    let pinned = g.buckets.iter().find(|b| b.bytes >= 1000).unwrap().clone();
    let pin = pinned.nccl_choice.unwrap();
    assert!(pin.nccl_pin().is_some(), "{pin}");
    (g, pinned)
}

#[test]
fn why_names_the_channel_count_the_plugin_sets_with_a_pin() {
    use artune::allreduce::Backend;
    let d = tempfile::tempdir().unwrap();
    let mut p = sample::profile();
    let (g, pinned) = tp2_graph_pin(&mut p);
    let pin = pinned.nccl_choice.unwrap();
    g.nccl_channels = Some(8);
    g.pin_channels.insert(pinned.bytes, 2);
    let own = g
        .buckets
        .iter()
        .find(|b| b.nccl_choice == Some(Backend::Nccl))
        .map(|b| b.bytes);
    let file = write(d.path(), "p.json", &p);
    let ask = |bytes: u64, json: bool| {
        let bytes = bytes.to_string();
        let mut args = vec!["why", &file, "--tp", "2", "--bytes", &bytes];
        if json {
            args.push("--json");
        }
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{err}");
        out
    };
    let out = ask(1000, false);
    let line = format!("NCCL with artune's plugin runs {pin} on 2 run-time channels\n");
    assert!(out.contains(&line), "{out}");
    assert_eq!(json(&ask(1000, true))["nccl_channels"], 2);
    if let Some(bytes) = own {
        let out = ask(bytes, false);
        assert!(
            !out.contains("channels\n"),
            "NCCL's own choice sets no count: {out}"
        );
    }
}

#[test]
fn why_says_when_a_pins_channel_count_was_not_measured() {
    let d = tempfile::tempdir().unwrap();
    let mut p = sample::profile();
    let (g, pinned) = tp2_graph_pin(&mut p);
    let pin = pinned.nccl_choice.unwrap();
    g.nccl_channels = None;
    g.pin_channels.clear();
    g.channels_unmeasured = Some("NCCL 2.29.7 cannot put 2 ranks on 1 GPU".into());
    let file = write(d.path(), "p.json", &p);
    let (code, out, err) = run(&["why", &file, "--tp", "2", "--bytes", "1000"]);
    assert_eq!(code, 0, "{err}");
    let line = format!(
        "runs {pin} on NCCL's own channel count (not measured: NCCL 2.29.7 cannot put 2 ranks on 1 GPU)\n"
    );
    assert!(out.contains(&line), "{out}");
    let (_, out, _) = run(&["why", &file, "--tp", "2", "--bytes", "1000", "--json"]);
    assert!(json(&out)["channels_unmeasured"].is_string(), "{out}");
}

#[test]
fn a_cell_stopped_after_a_few_samples_says_its_interval_is_their_range() {
    let d = tempfile::tempdir().unwrap();
    let mut p = sample::profile();
    let b = &mut p.groups[0].buckets[1];
    let (slow, _) = b
        .results
        .iter()
        .max_by(|x, y| x.1.median_us.total_cmp(&y.1.median_us))
        .map(|(k, t)| (*k, *t))
        .unwrap();
    let bytes = b.bytes.to_string();
    let file = write(d.path(), "full.json", &p);
    let (_, out, _) = run(&["why", &file, "--tp", "2", "--bytes", &bytes]);
    assert!(!out.contains("the range of"), "{out}");
    p.groups[0].buckets[1]
        .results
        .get_mut(&slow)
        .unwrap()
        .samples = 4;
    let file = write(d.path(), "hopeless.json", &p);
    let (code, out, err) = run(&["why", &file, "--tp", "2", "--bytes", &bytes]);
    assert_eq!(code, 0, "{err}");
    let row = out.lines().find(|l| l.starts_with(slow.id())).unwrap();
    assert!(
        row.contains("(interval: the range of 4 samples; stopped as far slower)"),
        "{out}"
    );
}

/// Where band smoothing keeps a custom kernel that the rule passed over for lying within the
/// model's error (`why` says so), `show` lists that size as not sure, as it does where the rule
/// passed a kernel over for NCCL: a simulated choice of custom is never presented as sure there.
#[test]
fn show_calls_not_sure_what_smoothing_kept_within_the_models_error() {
    let d = tempfile::tempdir().unwrap();
    let file = common::tuned(
        d.path(),
        "p.json",
        &[
            "--sim",
            "pcie-8x-direct-2socket",
            "--tp",
            "2",
            "--mode",
            "graph",
        ],
    );
    let file = file.to_str().unwrap();
    let p = Profile::load(Path::new(file)).unwrap();
    let g = &p.groups[0];
    let mut kept = Vec::new();
    for b in &g.buckets {
        let bytes = b.bytes.to_string();
        let (code, out, err) = run(&["why", file, "--tp", "2", "--bytes", &bytes, "--json"]);
        assert_eq!(code, 0, "{err}");
        let w: serde_json::Value = serde_json::from_str(&out).unwrap();
        let custom = |k: &str| artune::allreduce::Backend::from_id(k).unwrap().is_custom();
        if w["smoothed"] == true
            && custom(w["chosen"].as_str().unwrap())
            && !custom(w["rule_choice"].as_str().unwrap())
            && w["reason"]
                .as_str()
                .unwrap()
                .contains("within the model's error")
        {
            kept.push(b.bytes);
        }
    }
    assert!(
        !kept.is_empty(),
        "the preset no longer smooths over NCCL: pick another"
    );
    let (code, show, err) = run(&["show", file]);
    assert_eq!(code, 0, "{err}");
    // The first group's section, and its spans of sizes not sure.
    let section = show
        .split("\n\n")
        .find(|s| s.contains("TP2 graph — GPUs 0,1"))
        .unwrap();
    let line = section
        .lines()
        .find(|l| l.trim_start().starts_with("not sure at "))
        .unwrap();
    let spans: Vec<(u64, u64)> = line.trim_start()["not sure at ".len()..]
        .split(':')
        .next()
        .unwrap()
        .split(", ")
        .map(|s| {
            let mut e = s.split('–').map(|x| artune::units::parse_bytes(x).unwrap());
            let lo = e.next().unwrap();
            (lo, e.next().unwrap_or(lo))
        })
        .collect();
    for bytes in kept {
        assert!(
            spans.iter().any(|&(lo, hi)| lo <= bytes && bytes <= hi),
            "{bytes} bytes kept by smoothing within the model's error, not in: {line}"
        );
    }
}

/// What `why` says TensorRT-LLM runs agrees with the cache `export --engine trtllm` writes, at
/// every token bucket the export lists: TWOSHOT only where the bucket holds a token per rank,
/// and otherwise the file's own answer (ONESHOT, or no entry).
#[test]
fn why_names_the_trtllm_entry_the_export_writes() {
    let d = tempfile::tempdir().unwrap();
    let file = common::tuned(
        d.path(),
        "p.json",
        &["--sim", "nvswitch-8x", "--tp", "8", "--mode", "graph"],
    );
    let file = file.to_str().unwrap();
    let out = d.path().join("t");
    let (code, _, err) = run(&[
        "export",
        file,
        "--engine",
        "trtllm",
        "--hidden",
        "7168",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let yaml = std::fs::read_to_string(out.join("extra-llm-api-options.yaml")).unwrap();
    let mut split = 0;
    for l in yaml.lines().filter(|l| l.contains(" tokens = ")) {
        let w: Vec<&str> = l.trim_start_matches('#').split_whitespace().collect();
        let (tokens, bytes): (u64, &str) = (w[0].parse().unwrap(), w[3]);
        let entry = match w[5] {
            "ONESHOT" | "TWOSHOT" => w[5],
            _ => "NCCL",
        };
        let (code, out, err) = run(&["why", file, "--tp", "8", "--bytes", bytes, "--json"]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let e = v["engines"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["engine"] == "TensorRT-LLM");
        let runs = e.unwrap()["runs"].as_str().unwrap();
        let said = match runs.split_once(" from 8 tokens, else ") {
            Some((many, few)) => {
                split += 1;
                if tokens >= 8 {
                    many
                } else {
                    few
                }
            }
            None => runs,
        };
        let said = if said.starts_with("its own tuning") {
            "NCCL"
        } else {
            said
        };
        assert_eq!(said, entry, "{l}: why says {runs}");
    }
    assert!(
        split > 0,
        "no bucket where the token count decides: the test proves nothing"
    );
}

/// Where an engine plugin gives NCCL a size that the asked placement's own choice gives a
/// kernel, the line says the plugin follows another placement's answers, naming it, rather
/// than "the profile gives NCCL here" (the profile did not, for these GPUs).
#[test]
fn a_plugin_following_another_placement_names_it() {
    let d = tempfile::tempdir().unwrap();
    let file = common::tuned(
        d.path(),
        "p.json",
        &["--sim", "pcie-8x-2switch", "--tp", "4"],
    );
    let file = file.to_str().unwrap();
    let p = Profile::load(Path::new(file)).unwrap();
    let mut seen = 0;
    for g in p.groups.iter().filter(|g| g.gpus != [0, 1, 2, 3]) {
        let gpus: Vec<String> = g.gpus.iter().map(|x| x.to_string()).collect();
        for b in g.buckets.iter().filter(|b| b.choice.is_custom()) {
            let bytes = b.bytes.to_string();
            let args = [
                "why",
                file,
                "--tp",
                "4",
                "--gpus",
                &gpus.join(","),
                "--mode",
                g.mode.id(),
                "--bytes",
                &bytes,
                "--json",
            ];
            let (code, out, err) = run(&args);
            assert_eq!(code, 0, "{err}");
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            for e in v["engines"].as_array().unwrap() {
                if e["engine"].as_str().unwrap().contains("plugin") && e["runs"] == "NCCL" {
                    let because = e["because"].as_str().unwrap();
                    if because.contains("give NCCL here") || because.contains("gives NCCL here") {
                        seen += 1;
                        assert!(
                            because.contains("follows GPUs 0-3's answers"),
                            "{:?} at {bytes}: {because}",
                            g.gpus
                        );
                    }
                }
            }
        }
    }
    assert!(
        seen > 0,
        "no placement whose plugin follows another's NCCL: the test proves nothing"
    );
}

/// vLLM's fusion pass serves both modes: a profile that starts with NCCL in both refuses it,
/// and the same profile with its graph group alone has no answer for eager calls, so the
/// plugin leaves vLLM's fusion sizes and `why` says so.
#[test]
fn a_graph_only_profile_leaves_vllms_fusion_sizes() {
    let d = tempfile::tempdir().unwrap();
    let mut p = sample::profile_with("nvswitch-8x", &[8], &[4 << 10, 64 << 10, 1 << 20]);
    for g in &mut p.groups {
        g.buckets[0].choice = artune::Backend::Nccl;
    }
    let line = |p: &Profile, name: &str| {
        let file = write(d.path(), name, p);
        let (code, out, err) = run(&["why", &file, "--tp", "8", "--bytes", "4096"]);
        assert_eq!(code, 0, "{err}");
        let line = out.lines().find(|l| l.contains("vLLM + artune's plugin"));
        line.unwrap_or_else(|| panic!("{out}")).to_string()
    };
    let both = line(&p, "both.json");
    assert!(both.contains("is not fused here") && both.contains("which starts with NCCL"));
    p.groups.retain(|g| g.mode == artune::Mode::Graph);
    let graph = line(&p, "graph.json");
    assert!(
        graph.contains("is fused into FlashInfer's kernel here")
            && graph.contains("the profile lacks a mode at this TP size"),
        "{graph}"
    );
}

//! `artune fleet` through the binary: 1,000 generated node profiles with two outliers, a
//! directory of broken files, and the inputs that must be refused.

mod common;

use std::path::Path;

use serde_json::Value;

use common::{artune, tuned};

/// A small simulated tune, the template every generated node profile is made from.
fn template(dir: &Path) -> Value {
    let args = [
        "--sim",
        "pcie-4x-1switch",
        "--tp",
        "2,4",
        "--sizes",
        "1K:64K",
        "--mode",
        "graph",
        "--no-contention",
    ];
    let out = tuned(dir, "template.json", &args);
    serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap()
}

/// Multiplies every timing of the backends `pick` selects by `factor`.
fn scale(p: &mut Value, pick: impl Fn(&str) -> bool, factor: impl Fn(u64) -> f64) {
    for g in p["groups"].as_array_mut().unwrap() {
        for b in g["buckets"].as_array_mut().unwrap() {
            let bytes = b["bytes"].as_u64().unwrap();
            for (backend, t) in b["results"].as_object_mut().unwrap() {
                if pick(backend) {
                    for k in ["median_us", "ci_low_us", "ci_high_us"] {
                        t[k] = (t[k].as_f64().unwrap() * factor(bytes)).into();
                    }
                }
            }
        }
    }
}

/// Peak resident memory of the children this process waited for, bytes.
fn children_max_rss() -> u64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: u is a valid rusage to fill.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    u.ru_maxrss as u64 * 1024
}

#[test]
fn a_thousand_nodes_two_outliers_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let nodes = tmp.path().join("nodes");
    std::fs::create_dir(&nodes).unwrap();
    let base = template(tmp.path());
    for i in 0..1000u64 {
        let mut p = base.clone();
        p["node"]["hostname"] = format!("gpu{i:04}").into();
        // Healthy nodes differ by up to ±2%, deterministically.
        let jitter = 1.0 + ((i * 7919) % 41) as f64 / 1000.0 - 0.02;
        scale(&mut p, |_| true, |_| jitter);
        match i {
            // NCCL three times slower everywhere (a leftover NCCL_P2P_DISABLE, say).
            137 => scale(&mut p, |b| b.starts_with("nccl"), |_| 3.0),
            // Custom kernels slower only at large sizes (a link at Gen4 x8).
            842 => scale(
                &mut p,
                |b| b.contains("stage"),
                |bytes| if bytes >= 16 << 10 { 1.8 } else { 1.0 },
            ),
            _ => {}
        }
        std::fs::write(nodes.join(format!("node-{i:04}.json")), p.to_string()).unwrap();
    }
    let prom = tmp.path().join("artune.prom");
    let classes = tmp.path().join("classes");
    let o = artune(&[
        "fleet",
        nodes.to_str().unwrap(),
        "--json",
        "--prom",
        prom.to_str().unwrap(),
        "--out",
        classes.to_str().unwrap(),
    ]);
    let rss = children_max_rss();
    assert_eq!(
        o.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["profiles"], 1000);
    assert_eq!(r["skipped"].as_array().unwrap().len(), 0);
    let class = &r["classes"][0];
    assert_eq!(r["classes"].as_array().unwrap().len(), 1);
    assert_eq!(class["nodes"].as_array().unwrap().len(), 1000);
    assert_eq!(class["nodes"][137], "gpu0137", "named by host name");
    let outliers: Vec<&str> = class["outliers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["node"].as_str().unwrap())
        .collect();
    assert_eq!(outliers, ["gpu0137", "gpu0842"]);
    let o137 = &class["outliers"][0]["deviations"];
    assert!(o137
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["backend"].as_str().unwrap().starts_with("nccl")));
    let worst = o137[0]["ratio"].as_f64().unwrap();
    assert!((2.8..3.2).contains(&worst), "{worst}");
    let o842 = &class["outliers"][1]["deviations"];
    assert!(o842
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["bytes"].as_u64().unwrap() >= 16 << 10));
    // Each cell has the median per backend and every node's ratio, in `nodes` order.
    let cell = &class["cells"][0]["backends"]["nccl"];
    assert_eq!(cell["ratios"].as_array().unwrap().len(), 1000);
    assert!(cell["ratios"][137].as_f64().unwrap() > 2.8);
    // The class profile: consensus of the 998 others, with provenance; any engine can load it.
    let path = r["class_profiles"][class["topology_class"].as_str().unwrap()]
        .as_str()
        .unwrap()
        .to_string();
    let p: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(p["fleet"]["nodes"].as_array().unwrap().len(), 998);
    let left: Vec<&str> = p["fleet"]["left_out"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["node"].as_str().unwrap())
        .collect();
    assert_eq!(left, ["gpu0137", "gpu0842"]);
    let show = artune(&["show", &path]);
    assert!(
        show.status.success(),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
    let prom = std::fs::read_to_string(prom).unwrap();
    assert!(prom.contains("node=\"gpu0137\"} 1\n"), "outlier flag");
    assert!(prom.contains("node=\"gpu0001\"} 0\n"));
    // Bounded memory: 1,000 profiles of ~50 KB are never held at once.
    let cap = 96u64 << 20;
    eprintln!("peak resident memory of the children: {} MiB", rss >> 20);
    assert!(
        rss < cap,
        "fleet peaked at {} MiB (cap {} MiB)",
        rss >> 20,
        cap >> 20
    );
}

#[test]
fn broken_files_are_listed_and_the_rest_aggregated() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("nodes");
    std::fs::create_dir(&d).unwrap();
    let base = template(tmp.path());
    for i in 0..3 {
        std::fs::write(d.join(format!("ok{i}.json")), base.to_string()).unwrap();
    }
    let text = base.to_string();
    std::fs::write(d.join("truncated.json"), &text[..text.len() / 2]).unwrap();
    std::fs::write(d.join("malformed.json"), "{\"schema_version\": 1,,}").unwrap();
    std::fs::write(d.join("hostile.json"), "[".repeat(100_000)).unwrap();
    std::fs::write(d.join("other.json"), "{\"name\": \"a topology\"}").unwrap();
    std::fs::create_dir(d.join("adir.json")).unwrap();
    std::fs::write(d.join("notes.txt"), "not a profile and not *.json: ignored").unwrap();
    let o = artune(&["fleet", d.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(5), "skipped files exit 5");
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains("artune fleet: 3 profiles"), "{out}");
    assert!(out.contains("skipped 5 files:"), "{out}");
    for (file, why) in [
        ("truncated.json", "truncated"),
        ("malformed.json", "line 1"),
        ("hostile.json", "nest"),
        ("other.json", "schema_version"),
        ("adir.json", ""),
    ] {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(file))
            .unwrap_or_else(|| panic!("{file}: {out}"));
        assert!(line.contains(why), "{line}");
    }
    // Identical nodes: no per-node lines, one that says so.
    assert!(out.contains("every node is within ±10%"), "{out}");
    // Identical host names (as simulated profiles have): nodes are named by file.
    let j = artune(&["fleet", d.to_str().unwrap(), "--json"]);
    let j: Value = serde_json::from_slice(&j.stdout).unwrap();
    assert_eq!(
        j["classes"][0]["nodes"],
        serde_json::json!(["ok0", "ok1", "ok2"])
    );
    assert!(
        d.join("classes").read_dir().unwrap().count() == 1,
        "class profile in DIR/classes"
    );
    // The class profile does not count as a node the next time.
    let again = artune(&["fleet", d.to_str().unwrap(), "--json"]);
    let r: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(r["profiles"], 3);
}

#[test]
fn nothing_to_aggregate_is_one_sentence_and_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let base = template(tmp.path());
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let mixed = tmp.path().join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    let mut fp16 = base.clone();
    for g in fp16["groups"].as_array_mut().unwrap() {
        g["dtype"] = "fp16".into();
    }
    fp16["settings"]["dtype"] = "fp16".into();
    std::fs::write(mixed.join("a.json"), base.to_string()).unwrap();
    std::fs::write(mixed.join("b.json"), fp16.to_string()).unwrap();
    for (dir, says) in [
        (empty.to_str().unwrap(), "holds no artune profile"),
        (mixed.to_str().unwrap(), "different dtypes"),
        ("/nonexistent/dir", "cannot read"),
    ] {
        let o = artune(&["fleet", dir]);
        assert_eq!(o.status.code(), Some(2), "{dir}");
        let err = String::from_utf8(o.stderr).unwrap();
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(says), "{err}");
    }
}

#[test]
fn host_in_out_names_the_file_and_the_profile_names_the_node() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("{host}.json");
    let o = common::dies_with_test(common::BIN)
        .args([
            "tune",
            "--sim",
            "pcie-2x",
            "--sizes",
            "1K:4K",
            "--mode",
            "graph",
            "--no-contention",
        ])
        .arg("--out")
        .arg(&out)
        .env("SLURMD_NODENAME", "gpu-node-7")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p: Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("gpu-node-7.json")).unwrap())
            .unwrap();
    assert_eq!(p["node"]["scheduler_node"], "gpu-node-7");
    assert!(
        p["node"]["hostname"].is_string(),
        "the host name is recorded for a simulated tune too"
    );
    assert_eq!(p["node"]["args"][0], "tune");
    assert_eq!(p["settings"]["dtype"], "bf16");
    // fleet names the node as {host} did, not by its host name (in a Kubernetes pod, the
    // pod's): two profiles from one host under two scheduler names are two nodes.
    let mut q = p.clone();
    q["node"]["scheduler_node"] = "gpu-node-8".into();
    std::fs::write(tmp.path().join("other.json"), q.to_string()).unwrap();
    let j = artune(&["fleet", tmp.path().to_str().unwrap(), "--json"]);
    let j: Value = serde_json::from_slice(&j.stdout).unwrap();
    assert_eq!(
        j["classes"][0]["nodes"],
        serde_json::json!(["gpu-node-7", "gpu-node-8"])
    );
    let bad = common::dies_with_test(common::BIN)
        .args(["tune", "--sim", "pcie-2x", "--out"])
        .arg(&out)
        .env("SLURMD_NODENAME", "../etc")
        .output()
        .unwrap();
    assert_eq!(
        bad.status.code(),
        Some(2),
        "a node name that is a path is refused"
    );
}

/// A profile with both modes, for the text report's tests.
fn template_both(dir: &Path) -> Value {
    let args = [
        "--sim",
        "pcie-4x-1switch",
        "--tp",
        "2",
        "--sizes",
        "1K:64K",
        "--no-contention",
    ];
    let out = tuned(dir, "both.json", &args);
    serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap()
}

/// Sets bucket `i` of the first group to `choice` with `choice`'s timing, scaled by `factor`,
/// taken from the bucket's current choice: 1.0 makes the two a tie.
fn rechoose(p: &mut Value, i: usize, choice: &str, factor: f64) {
    let b = &mut p["groups"][0]["buckets"][i];
    let was = b["choice"].as_str().unwrap().to_string();
    let mut t = b["results"][&was].clone();
    for k in ["median_us", "ci_low_us", "ci_high_us"] {
        t[k] = (t[k].as_f64().unwrap() * factor).into();
    }
    b["results"][choice] = t;
    b["choice"] = choice.into();
}

#[test]
fn a_hundred_healthy_nodes_print_a_short_report_led_by_the_outlier() {
    let tmp = tempfile::tempdir().unwrap();
    let nodes = tmp.path().join("nodes");
    std::fs::create_dir(&nodes).unwrap();
    let base = template_both(tmp.path());
    let other = |p: &Value| {
        let b = &p["groups"][0]["buckets"][0];
        let c = b["choice"].as_str().unwrap();
        if c == "nccl" {
            "one_stage_pull"
        } else {
            "nccl"
        }
        .to_string()
    };
    for i in 1..=101u64 {
        let mut p = base.clone();
        p["node"]["hostname"] = format!("n{i}").into();
        let jitter = 1.0 + ((i * 7919) % 41) as f64 / 1000.0 - 0.02;
        scale(&mut p, |_| true, |_| jitter);
        match i {
            57 => scale(&mut p, |b| b.starts_with("nccl"), |_| 3.0),
            // Chose otherwise, but its own intervals cannot tell the two apart: a tie.
            5 => rechoose(&mut p, 0, &other(&base), 1.0),
            // Chose a backend its own intervals show 3x slower: a real difference.
            6 => rechoose(&mut p, 0, &other(&base), 1.0 / 3.0),
            _ => {}
        }
        std::fs::write(nodes.join(format!("n{i}.json")), p.to_string()).unwrap();
    }
    let o = artune(&["fleet", nodes.to_str().unwrap()]);
    let out = String::from_utf8(o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(7), "an outlier exits 7: {out}");
    let lines: Vec<&str> = out.lines().collect();
    // One class, graph and eager: counted as one class.
    assert!(
        lines[0].ends_with("101 profiles (bf16), 1 topology class"),
        "{out}"
    );
    assert!(
        out.lines().take(6).any(|l| l.contains("OUTLIER n57")),
        "{out}"
    );
    assert!(lines.len() < 80, "{} lines:\n{out}", lines.len());
    assert!(
        out.contains("choices differ on n6") && !out.contains("choices differ on n5"),
        "{out}"
    );
    // The example names its group's GPUs, so that `artune why` can be asked about it.
    let g = &base["groups"][0];
    let gpus: Vec<String> = (g["gpus"].as_array().unwrap().iter())
        .map(|x| x.to_string())
        .collect();
    let named = format!("TP{} on GPUs {} at ", g["tp"], gpus.join(","));
    assert!(
        out.lines()
            .any(|l| l.contains("choices differ on n6") && l.contains(&named)),
        "{named}: {out}"
    );
    assert!(
        out.contains("1 node chose otherwise only within their own intervals"),
        "{out}"
    );
    // Placements are labelled with their GPUs.
    assert!(
        out.contains("  TP     GPUs") && out.contains("TP2    0,1 "),
        "{out}"
    );
    // Nodes in natural order: n1, n2, ..., n10, ..., n100.
    let j = artune(&["fleet", nodes.to_str().unwrap(), "--json"]);
    let j: Value = serde_json::from_slice(&j.stdout).unwrap();
    let names: Vec<String> = j["classes"][0]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    let want: Vec<String> = (1..=101).map(|i| format!("n{i}")).collect();
    assert_eq!(names, want);
}

#[test]
fn an_unwritable_class_directory_still_prints_the_report_and_exits_9() {
    let tmp = tempfile::tempdir().unwrap();
    let nodes = tmp.path().join("nodes");
    std::fs::create_dir(&nodes).unwrap();
    let base = template(tmp.path());
    for i in 0..3 {
        std::fs::write(nodes.join(format!("ok{i}.json")), base.to_string()).unwrap();
    }
    // Below a regular file no directory can be made, whoever runs the test (root too).
    let blocker = tmp.path().join("file");
    std::fs::write(&blocker, "").unwrap();
    let o = artune(&[
        "fleet",
        nodes.to_str().unwrap(),
        "--out",
        blocker.join("classes").to_str().unwrap(),
    ]);
    let (out, err) = (
        String::from_utf8(o.stdout).unwrap(),
        String::from_utf8(o.stderr).unwrap(),
    );
    // Its own failure exit: deploy scripts count 5 (skipped files) as done.
    assert_eq!(o.status.code(), Some(9), "{err}");
    assert!(out.starts_with("artune fleet: 3 profiles"), "{out}");
    assert!(
        out.contains("class profile: not written (see the error)"),
        "{out}"
    );
    assert!(
        err.starts_with("error: class profiles not written: cannot create"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// Class profiles are written all or none: where one class's path holds a file that is not a
/// profile, the other class's profile is not written beside the old one either.
#[test]
fn class_profiles_are_written_all_or_none() {
    let tmp = tempfile::tempdir().unwrap();
    let nodes = tmp.path().join("nodes");
    std::fs::create_dir(&nodes).unwrap();
    let a = template(tmp.path());
    let mut b = a.clone();
    b["fingerprint"]["topology_class"] = "sha256:0123456789abcdef01234567".into();
    for i in 0..2 {
        std::fs::write(nodes.join(format!("a{i}.json")), a.to_string()).unwrap();
        std::fs::write(nodes.join(format!("b{i}.json")), b.to_string()).unwrap();
    }
    let out = tmp.path().join("classes");
    std::fs::create_dir(&out).unwrap();
    let kept = out.join("class-0123456789abcdef01234567-bf16.json");
    std::fs::write(&kept, "notes, not a profile").unwrap();
    let o = artune(&[
        "fleet",
        nodes.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8(o.stderr).unwrap();
    assert_eq!(o.status.code(), Some(9), "{err}");
    assert!(err.contains("class profiles not written"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&kept).unwrap(),
        "notes, not a profile"
    );
    let written: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        written,
        vec![kept],
        "the other class's profile was written alone"
    );
}

/// An --out naming a file is bad input before the work, in one sentence; the file is kept.
#[test]
fn an_out_that_names_a_file_is_refused_before_the_work() {
    let tmp = tempfile::tempdir().unwrap();
    let nodes = tmp.path().join("nodes");
    std::fs::create_dir(&nodes).unwrap();
    std::fs::write(nodes.join("ok.json"), template(tmp.path()).to_string()).unwrap();
    let file = tmp.path().join("notes.txt");
    std::fs::write(&file, "mine").unwrap();
    let o = artune(&[
        "fleet",
        nodes.to_str().unwrap(),
        "--out",
        file.to_str().unwrap(),
    ]);
    let err = String::from_utf8(o.stderr).unwrap();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(o.stdout.is_empty());
    assert_eq!(
        err.trim_end(),
        format!(
            "error: --out {}: it is a file, but this writes into a directory; give a directory",
            file.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
}

/// Healthy nodes of one class, tuned with different noise, put a crossover one size apart
/// now and then: that is a band edge, counted, not a node whose choices differ (12 of 30
/// nodes were listed for it). Which seeds and classes do it moves with the model and the
/// sampling (after hopeless cells stopped early, seeds 1-30 of the first two showed none), so
/// four classes are tuned: none may list a difference, and at least one must show the edge.
#[test]
fn a_crossover_one_size_off_is_a_band_edge_not_a_difference() {
    let dir = tempfile::tempdir().unwrap();
    let mut edges = 0;
    for (preset, tp, mode) in [
        ("pcie-8x-2switch", "2", "graph"),
        ("pcie-4x-1switch", "4", "eager"),
        ("pcie-8x-2switch", "4", "graph"),
        ("pcie-8x-2switch", "8", "eager"),
    ] {
        let nodes = dir.path().join(format!("{preset}-{mode}"));
        std::fs::create_dir_all(&nodes).unwrap();
        for seed in 1..=12 {
            let seed = seed.to_string();
            let args = ["--sim", preset, "--tp", tp, "--mode", mode, "--seed", &seed];
            tuned(&nodes, &format!("n{seed}.json"), &args);
        }
        let o = artune(&["fleet", nodes.to_str().unwrap()]);
        let out = common::text(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{out}{}", common::text(&o.stderr));
        assert!(!out.contains("choices differ"), "{out}");
        edges += usize::from(out.contains("put a crossover one size from the class's"));
    }
    assert!(edges > 0, "no class showed a crossover one size off");
}

/// A size only an outlier measured (its own refinement between the class's sizes) has no
/// class choice: the table must not label the outlier's choice there as the class's, and
/// every class choice comes from nodes the class profile is built from.
#[test]
fn a_size_only_an_outlier_measured_is_not_labelled_the_class_choice() {
    let tmp = tempfile::tempdir().unwrap();
    let nodes = tmp.path().join("nodes");
    std::fs::create_dir(&nodes).unwrap();
    let base = template(tmp.path());
    for i in 0..3 {
        std::fs::write(nodes.join(format!("ok{i}.json")), base.to_string()).unwrap();
    }
    let mut bad = base.clone();
    scale(&mut bad, |b| b == "nccl", |_| 3.0);
    // Its own size between 32K and 64K, where it chose what its slow NCCL made it choose.
    for g in bad["groups"].as_array_mut().unwrap() {
        let buckets = g["buckets"].as_array_mut().unwrap();
        let at = buckets.iter().position(|b| b["bytes"] == 65536).unwrap();
        let mut extra = buckets[at].clone();
        extra["bytes"] = 49152.into();
        buckets.insert(at, extra);
    }
    std::fs::write(nodes.join("bad.json"), bad.to_string()).unwrap();
    let o = artune(&["fleet", nodes.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(7), "{}", common::text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut apart = 0;
    for c in v["classes"].as_array().unwrap() {
        let names: Vec<&str> = c["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        let left: Vec<&str> = c["left_out"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["node"].as_str().unwrap())
            .collect();
        assert!(!left.is_empty(), "{c}");
        for cell in c["cells"].as_array().unwrap() {
            let kept = cell["backends"].as_object().unwrap().values().any(|b| {
                b["ratios"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .enumerate()
                    .any(|(i, r)| !r.is_null() && !left.contains(&names[i]))
            });
            assert_eq!(cell["choice"].is_string(), kept, "{cell}");
            apart += usize::from(!kept);
        }
    }
    assert!(apart > 0, "no size only the outlier measured: {v}");
    // One file that is no profile: counted in the singular.
    std::fs::write(nodes.join("notes.json"), "{}").unwrap();
    let o = artune(&["fleet", nodes.to_str().unwrap()]);
    let out = common::text(&o.stdout);
    assert!(out.contains("\nskipped 1 file:\n"), "{out}");
    assert!(!out.contains(" 48K "), "{out}");
    assert!(
        out.contains("measured only by nodes left out of the class profile (TP2 48K, TP4 48K;"),
        "{out}"
    );
}

/// Nodes that pinned an NCCL variant disagree on its channels: the class profile pins it with
/// the count most of the nodes that pinned that same variant measured, the smaller on a tie;
/// a node that pinned another variant there does not vote.
#[test]
fn the_class_profile_pins_the_channels_most_nodes_of_the_same_pin_measured() {
    let tmp = tempfile::tempdir().unwrap();
    let nodes = tmp.path().join("nodes");
    std::fs::create_dir(&nodes).unwrap();
    let base = template(tmp.path());
    let (a, b) = (2usize, 4usize);
    let bytes = |i: usize| base["groups"][0]["buckets"][i]["bytes"].as_u64().unwrap();
    // Per node: (pin at bucket a, its channels), (channels of the pin at bucket b).
    let votes: [((&str, u32), Option<u32>); 5] = [
        (("nccl_ring_simple", 8), Some(4)),
        (("nccl_ring_simple", 8), Some(16)),
        (("nccl_ring_simple", 4), Some(16)),
        (("nccl_ring_ll", 2), Some(4)),
        (("nccl_ring_ll", 2), None),
    ];
    for (n, ((pin_a, ch_a), ch_b)) in votes.iter().enumerate() {
        let mut p = base.clone();
        p["node"]["hostname"] = format!("n{n}").into();
        let g = &mut p["groups"][0];
        for i in [a, b] {
            let k = &mut g["buckets"][i];
            let own = k["results"]["nccl"].clone();
            for (pin, f) in [("nccl_ring_simple", 0.5), ("nccl_ring_ll", 0.6)] {
                let mut t = own.clone();
                for key in ["median_us", "ci_low_us", "ci_high_us"] {
                    t[key] = (t[key].as_f64().unwrap() * f).into();
                }
                k["results"][pin] = t;
            }
            k["nccl_choice"] = "nccl_ring_simple".into();
        }
        g["buckets"][a]["nccl_choice"] = (*pin_a).into();
        let mut chans = serde_json::Map::new();
        chans.insert(bytes(a).to_string(), (*ch_a).into());
        if let Some(c) = ch_b {
            chans.insert(bytes(b).to_string(), (*c).into());
        }
        g["pin_channels"] = chans.into();
        std::fs::write(nodes.join(format!("n{n}.json")), p.to_string()).unwrap();
    }
    let classes = tmp.path().join("classes");
    let o = artune(&[
        "fleet",
        nodes.to_str().unwrap(),
        "--json",
        "--out",
        classes.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", common::text(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let path = r["class_profiles"]
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap();
    let p: Value = serde_json::from_slice(&std::fs::read(path.as_str().unwrap()).unwrap()).unwrap();
    let g = &p["groups"][0];
    assert_eq!(g["buckets"][a]["nccl_choice"], "nccl_ring_simple", "{g}");
    let pinned = &g["pin_channels"];
    // 8, 8, 4 among the ring/Simple nodes; the two ring/LL nodes' 2s do not count.
    assert_eq!(pinned[bytes(a).to_string()], 8, "{pinned}");
    // 4, 16, 16, 4: a tie, the smaller count.
    assert_eq!(pinned[bytes(b).to_string()], 4, "{pinned}");
    assert_eq!(pinned.as_object().unwrap().len(), 2, "{pinned}");
    // What the class profile pins is what `why` reads back for that size.
    let why = artune(&[
        "why",
        path.as_str().unwrap(),
        "--tp",
        "2",
        "--bytes",
        &bytes(a).to_string(),
    ]);
    assert!(why.status.success(), "{}", common::text(&why.stderr));
    assert!(
        common::text(&why.stdout).contains("on 8 run-time channels"),
        "{}",
        common::text(&why.stdout)
    );
}

/// A fleet run for another dtype writes its class profile beside the first, never over it:
/// both name the same topology class (an fp16 run once replaced the bf16 class profile of
/// three nodes with one of a single node, exit 5, no word).
#[test]
fn class_profiles_of_two_dtypes_live_side_by_side() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let common = ["--sim", "pcie-4x-1switch", "--tp", "4", "--mode", "graph"];
    let common = [&common[..], &["--sizes", "1K:64K", "--no-contention"]].concat();
    for s in ["1", "2", "3"] {
        tuned(
            d,
            &format!("n{s}.json"),
            &[&common[..], &["--seed", s]].concat(),
        );
    }
    tuned(d, "h.json", &[&common[..], &["--dtype", "fp16"]].concat());
    let dir = d.to_str().unwrap();
    for extra in [&[][..], &["--dtype", "fp16"]] {
        let o = artune(&[&["fleet", dir][..], extra].concat());
        assert!(
            o.status.code() == Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(d.join("classes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names[0].ends_with("-bf16.json") && names[1].ends_with("-fp16.json"),
        "{names:?}"
    );
    let bf16: Value =
        serde_json::from_slice(&std::fs::read(d.join("classes").join(&names[0])).unwrap()).unwrap();
    assert_eq!(
        bf16["fleet"]["nodes"].as_array().unwrap().len(),
        3,
        "{}",
        bf16["fleet"]
    );
}

/// `artune tune --sim pcie-4x-1switch` into DIR/{host}.json as scheduler node `name`.
fn tune_node(dir: &Path, name: &str, extra: &[&str]) -> Value {
    let out = dir.join("{host}.json");
    let o = common::dies_with_test(common::BIN)
        .args(["tune", "--sim", "pcie-4x-1switch", "--sizes", "1K:64K"])
        .args(["--no-contention"])
        .args(extra)
        .arg("--out")
        .arg(&out)
        .env("NODE_NAME", name)
        .env_remove("SLURMD_NODENAME")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::text(&o.stderr));
    let path = dir.join(format!("{name}.json"));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// A node that tuned only graph TP2 sorts first: the class profile is built from the nodes
/// that tuned what most of the class did, with their memory and placement in every group, and
/// the short node is named (exit 5), not merged.
#[test]
fn a_node_that_tuned_fewer_groups_is_named_not_merged() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("f");
    std::fs::create_dir(&d).unwrap();
    tune_node(&d, "a0", &["--tp", "2", "--mode", "graph"]);
    let full = tune_node(&d, "n1", &[]);
    for n in ["n2", "n3"] {
        tune_node(&d, n, &[]);
    }
    let o = artune(&["fleet", d.to_str().unwrap()]);
    let out = common::text(&o.stdout);
    assert_eq!(o.status.code(), Some(5), "{out}{}", common::text(&o.stderr));
    assert!(
        out.contains("groups differ on a0: tuned graph TP2 while most of the class tuned graph TP2, TP4; eager TP2, TP4"),
        "{out}"
    );
    let class = std::fs::read_dir(d.join("classes"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let p: Value = serde_json::from_slice(&std::fs::read(class).unwrap()).unwrap();
    assert_eq!(p["fleet"]["nodes"], serde_json::json!(["n1", "n2", "n3"]));
    assert_eq!(p["settings"]["tp"], full["settings"]["tp"]);
    assert_eq!(p["settings"]["modes"], full["settings"]["modes"]);
    let groups = p["groups"].as_array().unwrap();
    assert_eq!(groups.len(), full["groups"].as_array().unwrap().len());
    for g in groups {
        let w = full["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["tp"] == g["tp"] && w["gpus"] == g["gpus"] && w["mode"] == g["mode"])
            .unwrap();
        for k in ["memory", "placement", "islands", "nccl_channels"] {
            let keys = |v: &Value| match v {
                Value::Object(m) => serde_json::json!(m.keys().collect::<Vec<_>>()),
                v => v.clone(),
            };
            assert_eq!(keys(&g[k]), keys(&w[k]), "TP{} {} {k}", g["tp"], g["mode"]);
        }
    }
}

/// A rolling upgrade: one node on a new driver is another software state, named as mixed
/// versions with exit 3, not "stale".
#[test]
fn one_node_on_a_new_driver_is_mixed_versions_and_exit_3() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("nodes");
    std::fs::create_dir(&d).unwrap();
    let base = template(tmp.path());
    for i in 1..=5 {
        let mut p = base.clone();
        p["node"]["scheduler_node"] = format!("n{i}").into();
        p["versions"]["driver"] = if i == 5 { "580.65" } else { "570.1" }.into();
        std::fs::write(d.join(format!("n{i}.json")), p.to_string()).unwrap();
    }
    let prom = tmp.path().join("a.prom");
    let o = artune(&[
        "fleet",
        d.to_str().unwrap(),
        "--prom",
        prom.to_str().unwrap(),
    ]);
    let out = common::text(&o.stdout);
    assert_eq!(o.status.code(), Some(3), "{out}");
    assert!(!out.contains("stale"), "{out}");
    assert!(out.contains("MIXED VERSIONS: driver 570.1"), "{out}");
    assert!(
        out.contains("versions differ on n5: tuned with driver 580.65"),
        "{out}"
    );
    let prom = std::fs::read_to_string(prom).unwrap();
    assert!(prom.contains("artune_fleet_class_version_sets{"), "{prom}");
    assert!(prom.contains("\"} 2\n"), "{prom}");
}

/// Two files of one scheduler node count once, by the newer; the other is named.
#[test]
fn a_copied_node_file_counts_once() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("nodes");
    std::fs::create_dir(&d).unwrap();
    let base = template(tmp.path());
    for i in 1..=3 {
        let mut p = base.clone();
        p["node"]["scheduler_node"] = format!("node{i}").into();
        p["created"] = "2026-01-02T00:00:00Z".into();
        std::fs::write(d.join(format!("node{i}.json")), p.to_string()).unwrap();
    }
    let mut old = base.clone();
    old["node"]["scheduler_node"] = "node1".into();
    old["created"] = "2026-01-01T00:00:00Z".into();
    std::fs::write(d.join("dup-node1.json"), old.to_string()).unwrap();
    let o = artune(&["fleet", d.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", common::text(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["profiles"], 3);
    assert_eq!(
        r["classes"][0]["nodes"],
        serde_json::json!(["node1", "node2", "node3"])
    );
    assert_eq!(r["duplicates"][0]["file"], "dup-node1.json");
    let o = artune(&["fleet", d.to_str().unwrap()]);
    let out = common::text(&o.stdout);
    assert!(
        out.contains(
            "  dup-node1.json: node node1 again, older than node1.json, which counts instead"
        ),
        "{out}"
    );
}

/// `fleet DIR --out DIR` finds its own class profile the next time: left out with an info
/// line, not a skipped file (exit 5 on every run after the first).
#[test]
fn class_profiles_written_into_the_directory_are_not_skipped_files() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("nodes");
    std::fs::create_dir(&d).unwrap();
    let base = template(tmp.path());
    for i in 0..3 {
        std::fs::write(d.join(format!("ok{i}.json")), base.to_string()).unwrap();
    }
    let dir = d.to_str().unwrap();
    for run in 0..2 {
        let o = artune(&["fleet", dir, "--out", dir]);
        let out = common::text(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "run {run}: {out}");
        assert!(out.contains("artune fleet: 3 profiles"), "{out}");
        assert_eq!(
            out.contains("left out, class profiles a fleet run wrote (not nodes): class-"),
            run == 1,
            "{out}"
        );
    }
}

/// A single slow link: GPU 2 at x8 slows the large sizes of the groups through it only. The
/// node is an outlier, and its ratio (text and Prometheus) shows the slowdown instead of the
/// 1.00 a median over every size gave.
#[test]
fn one_slow_link_shows_in_the_node_ratio() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("nodes");
    std::fs::create_dir(&d).unwrap();
    let base = template(tmp.path());
    for i in 0..4 {
        let mut p = base.clone();
        p["node"]["scheduler_node"] = format!("n{i}").into();
        if i == 3 {
            for g in p["groups"].as_array_mut().unwrap() {
                if !g["gpus"].as_array().unwrap().contains(&2.into()) {
                    continue;
                }
                for b in g["buckets"].as_array_mut().unwrap() {
                    if b["bytes"].as_u64().unwrap() < 16 << 10 {
                        continue;
                    }
                    for t in b["results"].as_object_mut().unwrap().values_mut() {
                        for k in ["median_us", "ci_low_us", "ci_high_us"] {
                            t[k] = (t[k].as_f64().unwrap() * 1.8).into();
                        }
                    }
                }
            }
        }
        std::fs::write(d.join(format!("n{i}.json")), p.to_string()).unwrap();
    }
    let prom = tmp.path().join("a.prom");
    let o = artune(&[
        "fleet",
        d.to_str().unwrap(),
        "--prom",
        prom.to_str().unwrap(),
    ]);
    let out = common::text(&o.stdout);
    assert_eq!(o.status.code(), Some(7), "{out}");
    assert!(out.contains("OUTLIER n3"), "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("    n3: "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("nccl 1.80"), "{line}");
    let prom = std::fs::read_to_string(prom).unwrap();
    let nccl = prom
        .lines()
        .find(|l| {
            l.starts_with("artune_fleet_node_ratio{") && l.contains("node=\"n3\",backend=\"nccl\"")
        })
        .unwrap();
    let v: f64 = nccl.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((1.7..1.9).contains(&v), "{nccl}");
}

/// A foreign file where fleet writes a class profile by default (DIR/classes) is named for
/// what the path is, with the ways out: no --out was given, so the error names none as the
/// culprit (it once said "--out DIR/classes/…").
#[test]
fn a_foreign_file_at_the_default_class_path_is_named_for_what_it_is() {
    let tmp = tempfile::tempdir().unwrap();
    let nodes = tmp.path().join("f3");
    std::fs::create_dir(&nodes).unwrap();
    for n in ["n1", "n2"] {
        tuned(&nodes, &format!("{n}.json"), &["--sim", "pcie-2x"]);
    }
    let dir = nodes.to_str().unwrap();
    assert_eq!(artune(&["fleet", dir]).status.code(), Some(0));
    for e in std::fs::read_dir(nodes.join("classes")).unwrap() {
        std::fs::write(e.unwrap().path(), "not mine").unwrap();
    }
    let o = artune(&["fleet", dir]);
    let err = common::text(&o.stderr);
    assert_eq!(o.status.code(), Some(9), "{err}");
    assert!(!err.contains("written: --out "), "{err}");
    assert!(
        err.contains("the class profile fleet writes by default (into DIR/classes)"),
        "{err}"
    );
    assert!(
        err.contains("give --out another directory, or pass --force"),
        "{err}"
    );
    // With --out, the flag is what gave the path.
    let classes = nodes.join("classes");
    let o = artune(&["fleet", dir, "--out", classes.to_str().unwrap()]);
    let err = common::text(&o.stderr);
    assert!(err.contains("written: --out "), "{err}");
}

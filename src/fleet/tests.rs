use super::*;
use crate::export::sample;
use crate::profile::{Node, Profile};

/// A synthetic node profile: `slow` multiplies NCCL's times, `host` names the node.
fn node(host: Option<&str>, slow: f64, driver: &str) -> Profile {
    let mut p = sample::profile();
    p.node = Some(Node {
        hostname: host.map(String::from),
        ..Default::default()
    });
    p.versions.driver = Some(driver.into());
    for g in &mut p.groups {
        for b in &mut g.buckets {
            if let Some(t) = b.results.get_mut(&Backend::Nccl) {
                t.median_us *= slow;
                t.ci_low_us *= slow;
                t.ci_high_us *= slow;
            }
        }
    }
    p
}

fn dir(profiles: &[(&str, Profile)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (name, p) in profiles {
        p.write_atomic(&d.path().join(name)).unwrap();
    }
    d
}

#[test]
fn the_slow_node_is_the_outlier_and_left_out_of_the_class_profile() {
    let d = dir(&[
        ("a.json", node(Some("gpu-a"), 1.0, "580.1")),
        ("b.json", node(Some("gpu-b"), 1.02, "580.1")),
        ("c.json", node(Some("gpu-c"), 0.99, "580.1")),
        ("d.json", node(Some("gpu-d"), 2.5, "580.1")),
    ]);
    let (r, c) = run(d.path(), None).unwrap();
    assert_eq!(r.profiles, 4);
    assert_eq!(r.classes.len(), 2, "one class, two modes");
    for class in &r.classes {
        assert_eq!(class.nodes, ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]);
        let names: Vec<&str> = class.outliers.iter().map(|o| o.node.as_str()).collect();
        assert_eq!(names, ["gpu-d"], "{:?}", class.outliers);
        let o = &class.outliers[0];
        assert!(o.deviations.iter().all(|d| d.backend == Backend::Nccl));
        // The class median of NCCL is (1.0 + 1.02) / 2 of the model: gpu-d is 2.5 / 1.01 of it.
        assert!(
            (o.deviations[0].ratio - 2.5 / 1.01).abs() < 0.01,
            "{:?}",
            o.deviations[0]
        );
        assert!((class.node_ratios["gpu-d"][&Backend::Nccl] - 2.5 / 1.01).abs() < 0.01);
        assert!((class.node_ratios["gpu-b"][&Backend::Nccl] - 1.0).abs() < 0.05);
        assert_eq!(class.simulated.len(), 4, "sample profiles are simulated");
    }
    let p = consensus::class_profile(&c, &r, &r.classes[0].topology_class)
        .unwrap()
        .unwrap();
    let f = p.fleet.as_ref().unwrap();
    assert_eq!(f.nodes, ["gpu-a", "gpu-b", "gpu-c"]);
    assert!(f
        .left_out
        .iter()
        .all(|l| l.node == "gpu-d" && l.reason.contains("outlier")));
    assert!(p.simulated);
    // The consensus is the median of the good nodes: gpu-a's times.
    let a = node(None, 1.0, "580.1");
    let nccl = |p: &Profile| p.groups[0].buckets[0].results[&Backend::Nccl].median_us;
    assert!((nccl(&p) - nccl(&a)).abs() < 1e-3 * nccl(&a));
    // It loads like any profile.
    Profile::parse(&p.to_json()).unwrap();
}

#[test]
fn repeated_host_names_fall_back_to_file_names_and_stale_nodes_are_named() {
    let d = dir(&[
        ("n1.json", node(Some("same"), 1.0, "580.1")),
        ("n2.json", node(Some("same"), 1.0, "580.1")),
        ("n3.json", node(None, 1.0, "570.9")),
    ]);
    let (r, c) = run(d.path(), None).unwrap();
    let class = &r.classes[0];
    assert_eq!(class.nodes, ["n1", "n2", "n3"]);
    assert_eq!(class.versions_differ.len(), 1);
    assert_eq!(class.versions_differ[0].node, "n3");
    assert!(
        class.versions_differ[0].reason.contains("driver 570.9"),
        "{}",
        class.versions_differ[0].reason
    );
    assert!(class.outliers.is_empty());
    let p = consensus::class_profile(&c, &r, &class.topology_class)
        .unwrap()
        .unwrap();
    assert_eq!(p.fleet.unwrap().nodes, ["n1", "n2"]);
    assert_eq!(p.versions.driver.as_deref(), Some("580.1"));
}

#[test]
fn dtypes_pick_the_majority_or_ask() {
    let fp16 = |mut p: Profile| {
        for g in &mut p.groups {
            g.dtype = Dtype::Fp16;
        }
        p
    };
    let d = dir(&[
        ("a.json", node(Some("a"), 1.0, "1")),
        ("b.json", fp16(node(Some("b"), 1.0, "1"))),
    ]);
    let e = run(d.path(), None).unwrap_err().to_string();
    assert!(
        e.contains("different dtypes (bf16: 1, fp16: 1)") && e.contains("--dtype"),
        "{e}"
    );
    let (r, _) = run(d.path(), Some(Dtype::Fp16)).unwrap();
    assert_eq!(r.profiles, 1);
    // Listed apart, not as a skipped file: it is sound, and leaves the exit code alone.
    assert_eq!((r.skipped.len(), r.other_dtype.len()), (0, 1));
    assert!(
        r.other_dtype[0].reason.contains("dtype is bf16"),
        "{:?}",
        r.other_dtype
    );
    assert_eq!(r.exit_code(false), 0);
    let e = run(d.path(), Some(Dtype::Fp32)).unwrap_err().to_string();
    assert!(e.contains("no profile"), "{e}");
    let empty = tempfile::tempdir().unwrap();
    let e = run(empty.path(), None).unwrap_err();
    assert_eq!(e.exit_code(), crate::error::EXIT_BAD_INPUT);
    assert!(e.to_string().contains("holds no artune profile"), "{e}");
}

#[test]
fn prometheus_text_flags_outliers_and_escapes_labels() {
    let d = dir(&[
        ("a.json", node(Some("a\"x"), 1.0, "1")),
        ("b.json", node(Some("b"), 1.0, "1")),
        ("c.json", node(Some("c"), 3.0, "1")),
    ]);
    let (r, _) = run(d.path(), None).unwrap();
    let text = output::prom(&r);
    assert!(text.contains("node=\"a\\\"x\""), "{text}");
    let flag = |n: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("artune_fleet_node_outlier{")
                    && l.contains("mode=\"graph\"")
                    && l.contains(&format!("node=\"{n}\""))
            })
            .map(|l| l.rsplit(' ').next().unwrap().to_string())
    };
    assert_eq!(flag("c").as_deref(), Some("1"));
    assert_eq!(flag("b").as_deref(), Some("0"));
    assert!(text.contains("artune_fleet_skipped_files 0\n"));
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let v = l.rsplit(' ').next().unwrap();
        assert!(v.parse::<f64>().is_ok(), "{l}");
    }
}

#[test]
fn a_host_name_equal_to_another_file_name_falls_back_too() {
    let d = dir(&[
        ("gpu-b.json", node(Some("x"), 1.0, "1")),
        ("n2.json", node(Some("gpu-b"), 1.0, "1")),
        ("n3.json", node(Some("x"), 1.0, "1")),
    ]);
    let (r, _) = run(d.path(), None).unwrap();
    assert_eq!(r.classes[0].nodes, ["gpu-b", "n2", "n3"]);
}

/// Two nodes on one driver and two on another: neither is "most of the class"; the older are
/// the ones behind, by number ("999.1" sorts after "1000.1" as a string), and the words say
/// it is a tie.
#[test]
fn a_version_tie_goes_to_the_newer_by_number() {
    for (old, new) in [("560.1", "570.1"), ("999.1", "1000.1")] {
        let d = dir(&[
            ("a.json", node(Some("a"), 1.0, old)),
            ("b.json", node(Some("b"), 1.0, old)),
            ("c.json", node(Some("c"), 1.0, new)),
            ("d.json", node(Some("d"), 1.0, new)),
        ]);
        let (r, _) = run(d.path(), None).unwrap();
        let stale: Vec<&str> = r.classes[0]
            .versions_differ
            .iter()
            .map(|s| s.node.as_str())
            .collect();
        assert_eq!(stale, ["a", "b"], "{old} against {new}");
        let why = &r.classes[0].versions_differ[0].reason;
        let words = format!("as many nodes of the class have the newer driver {new}");
        assert!(why.contains(&words), "{why}");
    }
    // Three to one: the majority, whatever its number, in the usual words.
    let d = dir(&[
        ("a.json", node(Some("a"), 1.0, "999.1")),
        ("b.json", node(Some("b"), 1.0, "999.1")),
        ("c.json", node(Some("c"), 1.0, "999.1")),
        ("d.json", node(Some("d"), 1.0, "1000.1")),
    ]);
    let (r, _) = run(d.path(), None).unwrap();
    assert_eq!(r.classes[0].versions_differ[0].node, "d");
    assert!(r.classes[0].versions_differ[0]
        .reason
        .contains("most of the class has driver 999.1"));
}

/// Two nodes cannot tell an outlier apart: the report says so instead of "outliers: none".
#[test]
fn a_class_of_two_nodes_has_its_outliers_not_judged() {
    let d = dir(&[
        ("a.json", node(Some("a"), 1.0, "580.1")),
        ("b.json", node(Some("b"), 3.0, "580.1")),
    ]);
    let (r, _) = run(d.path(), None).unwrap();
    assert!(!r.classes[0].outliers_judged && r.classes[0].outliers.is_empty());
    let text = output::text(&r);
    assert!(
        text.contains("outliers: not judged: it takes 3 nodes"),
        "{text}"
    );
    assert!(!text.contains("outliers: none"), "{text}");
}

/// A node that tuned only graph TP2 sorts first: the class profile must not take its group
/// details (memory, placement) nor its settings, and the node is named, not merged.
#[test]
fn a_node_that_tuned_fewer_groups_is_named_and_lends_the_class_profile_nothing() {
    let mut short = node(Some("a0"), 1.0, "580.1");
    short.groups.retain(|g| g.tp == 2 && g.mode == Mode::Graph);
    short.settings.tp = vec![2];
    short.settings.modes = vec![Mode::Graph];
    let full = |h: &str| node(Some(h), 1.0, "580.1");
    let d = dir(&[
        ("a0.json", short),
        ("n1.json", full("n1")),
        ("n2.json", full("n2")),
        ("n3.json", full("n3")),
    ]);
    let (r, c) = run(d.path(), None).unwrap();
    let graph = r.classes.iter().find(|c| c.mode == Mode::Graph).unwrap();
    assert_eq!(graph.groups_differ.len(), 1, "{:?}", graph.groups_differ);
    assert_eq!(graph.groups_differ[0].node, "a0");
    assert!(
        graph.groups_differ[0].reason.contains(
            "tuned graph TP2 while most of the class tuned graph TP2, TP4; eager TP2, TP4"
        ),
        "{}",
        graph.groups_differ[0].reason
    );
    assert_eq!(r.exit_code(false), crate::error::EXIT_WARNINGS);
    let p = consensus::class_profile(&c, &r, &graph.topology_class)
        .unwrap()
        .unwrap();
    assert_eq!(p.fleet.as_ref().unwrap().nodes, ["n1", "n2", "n3"]);
    assert_eq!(p.settings.tp, [2, 4]);
    assert_eq!(p.settings.modes, [Mode::Graph, Mode::Eager]);
    let want = full("x");
    assert_eq!(p.groups.len(), want.groups.len());
    for g in &p.groups {
        let w = want
            .groups
            .iter()
            .find(|w| (w.tp, w.mode) == (g.tp, g.mode))
            .unwrap();
        assert_eq!(
            g.memory.keys().collect::<Vec<_>>(),
            w.memory.keys().collect::<Vec<_>>(),
            "TP{} {}",
            g.tp,
            g.mode.id()
        );
        assert_eq!(g.placement, w.placement);
    }
}

/// A rolling upgrade: one node on the new driver is another software state, not "stale"; a
/// node whose re-tune failed keeps an older profile and says so; the exit code is 3.
#[test]
fn mixed_driver_versions_are_named_as_such_and_exit_3() {
    let mut failed = node(Some("n4"), 1.0, "570.1");
    failed.created = "2020-01-01T00:00:00Z".into();
    let d = dir(&[
        ("n1.json", node(Some("n1"), 1.0, "570.1")),
        ("n2.json", node(Some("n2"), 1.0, "570.1")),
        ("n3.json", node(Some("n3"), 1.0, "570.1")),
        ("n4.json", failed),
        ("n5.json", node(Some("n5"), 1.0, "580.1")),
    ]);
    let (r, _) = run(d.path(), None).unwrap();
    let class = &r.classes[0];
    let sets: Vec<(&str, Vec<&str>)> = class
        .version_sets
        .iter()
        .map(|s| {
            (
                s.versions.as_str(),
                s.nodes.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        sets,
        [
            ("driver 570.1, CUDA ?, NCCL ?", vec!["n1", "n2", "n3", "n4"]),
            ("driver 580.1, CUDA ?, NCCL ?", vec!["n5"]),
        ]
    );
    assert_eq!(class.versions_differ.len(), 1);
    assert_eq!(class.versions_differ[0].node, "n5");
    assert_eq!(r.exit_code(false), crate::error::EXIT_STALE);
    let text = output::text(&r);
    assert!(text.contains("  MIXED VERSIONS: driver 570.1"), "{text}");
    assert!(!text.contains("stale"), "{text}");
    // Only the failed re-tune left on the old driver: its profile is older than the others'.
    let mut failed = node(Some("n4"), 1.0, "570.1");
    failed.created = "2020-01-01T00:00:00Z".into();
    let d = dir(&[
        ("n1.json", node(Some("n1"), 1.0, "580.1")),
        ("n2.json", node(Some("n2"), 1.0, "580.1")),
        ("n4.json", failed),
    ]);
    let (r, _) = run(d.path(), None).unwrap();
    let why = &r.classes[0].versions_differ[0].reason;
    assert!(why.contains("older than all of theirs"), "{why}");
    assert_eq!(r.exit_code(false), crate::error::EXIT_STALE);
}

#[test]
fn class_profiles_not_written_outrank_every_other_exit_code() {
    let d = dir(&[
        ("a.json", node(Some("a"), 1.0, "1")),
        ("b.json", node(Some("b"), 1.0, "1")),
        ("c.json", node(Some("c"), 3.0, "1")),
    ]);
    let (r, _) = run(d.path(), None).unwrap();
    assert_eq!(r.exit_code(false), crate::error::EXIT_OUTLIER);
    assert_eq!(r.exit_code(true), crate::error::EXIT_NOT_WRITTEN);
}

/// Two files of one scheduler node: it counts once, by its newer profile, and the older file
/// is named.
#[test]
fn the_same_node_twice_counts_once_by_its_newer_profile() {
    let on = |sched: &str, created: &str, slow: f64| {
        let mut p = node(Some("host"), slow, "1");
        p.node.as_mut().unwrap().scheduler_node = Some(sched.into());
        p.created = created.into();
        p
    };
    let d = dir(&[
        ("dup-node1.json", on("node1", "2026-01-02T00:00:00Z", 1.0)),
        ("node1.json", on("node1", "2026-01-01T00:00:00Z", 5.0)),
        ("node2.json", on("node2", "2026-01-01T00:00:00Z", 1.0)),
        ("node3.json", on("node3", "2026-01-01T00:00:00Z", 1.0)),
    ]);
    let (r, _) = run(d.path(), None).unwrap();
    assert_eq!(r.profiles, 3);
    assert_eq!(r.classes[0].nodes, ["node1", "node2", "node3"]);
    // The slow, older node1.json is not in the class: no outlier.
    assert!(
        r.classes[0].outliers.is_empty(),
        "{:?}",
        r.classes[0].outliers
    );
    assert_eq!(r.duplicates.len(), 1);
    assert_eq!(r.duplicates[0].file, "node1.json");
    assert!(
        r.duplicates[0].reason.contains("older than dup-node1.json"),
        "{:?}",
        r.duplicates
    );
    assert!(output::text(&r).contains("left out, the same node as another file (1 file):"));
}

/// A class profile in the directory (fleet DIR --out DIR) is fleet's own output: left out
/// with an info line, not a skipped file.
#[test]
fn a_class_profile_in_the_directory_is_not_a_skipped_file() {
    let d = dir(&[
        ("a.json", node(Some("a"), 1.0, "1")),
        ("b.json", node(Some("b"), 1.0, "1")),
    ]);
    let (mut r, c) = run(d.path(), None).unwrap();
    write_class_profiles(&mut r, &c, d.path(), false, false).unwrap();
    let (r, _) = run(d.path(), None).unwrap();
    assert_eq!((r.profiles, r.skipped.len()), (2, 0), "{:?}", r.skipped);
    assert_eq!(r.class_profiles_found.len(), 1);
    assert_eq!(r.exit_code(false), 0);
}

/// One slow group (a link at x8 under GPUs 0-3 only slows TP4): the ratio is the slowest
/// group's, not a median over every size that the fast groups outvote.
#[test]
fn the_node_ratio_is_its_slowest_groups() {
    let mut slow = node(Some("c"), 1.0, "1");
    for g in slow.groups.iter_mut().filter(|g| g.tp == 4) {
        for b in g.buckets.iter_mut().filter(|b| b.bytes >= 1 << 20) {
            for t in b.results.values_mut() {
                t.median_us *= 2.0;
                t.ci_low_us *= 2.0;
                t.ci_high_us *= 2.0;
            }
        }
    }
    let d = dir(&[
        ("a.json", node(Some("a"), 1.0, "1")),
        ("b.json", node(Some("b"), 1.0, "1")),
        ("c.json", slow),
    ]);
    let (r, _) = run(d.path(), None).unwrap();
    for class in &r.classes {
        let nccl = class.node_ratios["c"][&Backend::Nccl];
        assert!((nccl - 2.0).abs() < 0.01, "{nccl}");
        assert!((class.node_ratios["a"][&Backend::Nccl] - 1.0).abs() < 0.01);
    }
    let prom = output::prom(&r);
    assert!(
        prom.lines()
            .any(|l| l.starts_with("artune_fleet_node_ratio{")
                && l.contains("node=\"c\",backend=\"nccl\"")
                && l.ends_with(" 2")),
        "{prom}"
    );
}

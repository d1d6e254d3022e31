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
    assert_eq!(class.stale.len(), 1);
    assert_eq!(class.stale[0].node, "n3");
    assert!(
        class.stale[0].reason.contains("driver 570.9"),
        "{}",
        class.stale[0].reason
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
        let stale: Vec<&str> = r.classes[0].stale.iter().map(|s| s.node.as_str()).collect();
        assert_eq!(stale, ["a", "b"], "{old} against {new}");
        let why = &r.classes[0].stale[0].reason;
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
    assert_eq!(r.classes[0].stale[0].node, "d");
    assert!(r.classes[0].stale[0]
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

use super::*;
use crate::topology::presets;

fn timing(us: f64) -> Timing {
    Timing {
        median_us: us,
        ci_low_us: us * 0.99,
        ci_high_us: us * 1.01,
        samples: 20,
        outliers: 0,
        model: None,
    }
}

/// A small TP2 profile: one_stage_pull up to 8 KiB, NCCL above.
pub(crate) fn fixture() -> Profile {
    let topology = presets::get("pcie-2x").unwrap();
    let bucket = |bytes: u64, choice: Backend| Bucket {
        bytes,
        choice,
        nccl_choice: Some(Backend::Nccl),
        fallback: None,
        results: [
            (Backend::Nccl, timing(20.0)),
            (
                Backend::OneStagePull,
                timing(if choice == Backend::Nccl { 30.0 } else { 8.0 }),
            ),
        ]
        .into_iter()
        .collect(),
        waived: Default::default(),
    };
    let group = GroupProfile {
        gpus: vec![0, 1],
        tp: 2,
        mode: Mode::Graph,
        dtype: Dtype::Bf16,
        placement: "one switch".into(),
        islands: None,
        buckets: vec![
            bucket(4096, Backend::OneStagePull),
            bucket(8192, Backend::OneStagePull),
            bucket(16384, Backend::Nccl),
        ],
        crossovers: vec![Crossover {
            bytes: 16384,
            from: Backend::OneStagePull,
            to: Backend::Nccl,
        }],
        memory: [
            (
                Backend::Nccl,
                Memory {
                    bytes_per_gpu: 40 << 20,
                    measured: false,
                    serves_up_to_bytes: None,
                    chosen_up_to_bytes: Some(16384),
                    required_bytes_per_gpu: Some(40 << 20),
                },
            ),
            (
                Backend::OneStagePull,
                Memory {
                    bytes_per_gpu: 5 << 20,
                    measured: false,
                    serves_up_to_bytes: Some(16384),
                    chosen_up_to_bytes: Some(8192),
                    required_bytes_per_gpu: Some(3 << 20),
                },
            ),
        ]
        .into_iter()
        .collect(),
        forms: Default::default(),
        nccl_channels: None,
        pin_channels: Default::default(),
        channels_unmeasured: None,
        regret: None,
        drift: Default::default(),
        beside: Vec::new(),
        waived: Default::default(),
    };
    Profile {
        schema_version: SCHEMA_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").into(),
        created: rfc3339(0),
        simulated: true,
        fabric: "simulated pcie-2x".into(),
        fingerprint: Fingerprint {
            topology_class: topology.class_hash(),
            host: topology.host_hash(),
        },
        versions: Versions::default(),
        topology,
        groups: vec![group],
        contention: vec![],
        settings: Settings::default(),
        faults: vec![],
        assumed: vec![],
        node: None,
        fleet: None,
        environment: None,
        recovered: Vec::new(),
        kernels: Vec::new(),
    }
}

#[test]
fn select_takes_covering_bucket() {
    let p = fixture();
    let q = Query {
        tp: 2,
        mode: Mode::Graph,
        gpus: None,
    };
    let pick = |b| match p.select(q, b) {
        Selection::Chosen { backend, .. } => Some(backend),
        Selection::Unknown(_) => None,
    };
    assert_eq!(pick(1), Some(Backend::OneStagePull));
    assert_eq!(pick(4096), Some(Backend::OneStagePull));
    assert_eq!(pick(8192), Some(Backend::OneStagePull));
    assert_eq!(pick(8193), Some(Backend::Nccl));
    assert_eq!(pick(16384), Some(Backend::Nccl));
    assert_eq!(pick(16385), None);
}

#[test]
fn below_a_smallest_bucket_above_the_latency_floor_there_is_no_answer() {
    let mut p = fixture();
    let q = Query {
        tp: 2,
        mode: Mode::Graph,
        gpus: None,
    };
    // The fixture starts within the latency floor: its first bucket answers below it.
    assert!(matches!(p.select(q, 1), Selection::Chosen { .. }));
    // Starting above it, a smaller message is not the first bucket's to answer.
    let g = p
        .groups
        .iter_mut()
        .find(|g| g.tp == 2 && g.mode == Mode::Graph)
        .unwrap();
    let first = g.buckets[0].bytes;
    g.buckets[0].bytes = first.max(LATENCY_FLOOR_BYTES + 1);
    let first = g.buckets[0].bytes;
    assert!(matches!(
        p.select(q, first - 1),
        Selection::Unknown(UnknownReason::BelowSmallestBucket)
    ));
    assert!(matches!(p.select(q, first), Selection::Chosen { .. }));
}

#[test]
fn select_reports_buffer_for_custom_only() {
    let p = fixture();
    let q = Query {
        tp: 2,
        mode: Mode::Graph,
        gpus: None,
    };
    match p.select(q, 100) {
        Selection::Chosen {
            buffer_bytes,
            expected_us,
            ..
        } => {
            assert_eq!(buffer_bytes, 3 << 20);
            assert_eq!(expected_us, 8.0);
        }
        other => panic!("{other:?}"),
    }
    match p.select(q, 10_000) {
        Selection::Chosen { buffer_bytes, .. } => assert_eq!(buffer_bytes, 0),
        other => panic!("{other:?}"),
    }
}

#[test]
fn missing_group_is_unknown_not_a_guess() {
    let p = fixture();
    assert_eq!(
        p.select(
            Query {
                tp: 4,
                mode: Mode::Graph,
                gpus: None
            },
            100
        ),
        Selection::Unknown(UnknownReason::NoGroup)
    );
    assert_eq!(
        p.select(
            Query {
                tp: 2,
                mode: Mode::Eager,
                gpus: None
            },
            100
        ),
        Selection::Unknown(UnknownReason::NoGroup)
    );
}

#[test]
fn roundtrips_through_json() {
    let p = fixture();
    assert_eq!(Profile::parse(&p.to_json()).unwrap(), p);
}

/// A per-pin channel count survives the file and reaches the selector; a profile written
/// before the field loads without it and answers the group's count at every bucket.
#[test]
fn per_pin_channels_round_trip_and_older_files_keep_the_groups_count() {
    let mut p = fixture();
    let g = &mut p.groups[0];
    g.nccl_channels = Some(4);
    let (first, last) = (g.buckets[0].bytes, g.buckets.last().unwrap().bytes);
    g.pin_channels.insert(last, 16);
    let text = p.to_json();
    assert!(text.contains("\"pin_channels\""), "{text}");
    let back = Profile::parse(&text).unwrap();
    assert_eq!(back, p);
    let q = Query {
        tp: p.groups[0].tp,
        mode: p.groups[0].mode,
        gpus: None,
    };
    let answers = |p: &Profile| {
        let s = p.selector();
        let g = s.group(q).unwrap().clone();
        [first, last].map(|b| g.at(b).unwrap().1.nccl_channels)
    };
    assert_eq!(answers(&back), [Some(4), Some(16)]);
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let removed = v["groups"][0]
        .as_object_mut()
        .unwrap()
        .remove("pin_channels");
    assert!(removed.is_some());
    let old = Profile::parse(&v.to_string()).unwrap();
    assert!(old.groups[0].pin_channels.is_empty());
    assert_eq!(answers(&old), [Some(4), Some(4)]);
}

#[test]
fn future_version_is_refused() {
    let text = fixture()
        .to_json()
        .replacen("\"schema_version\": 1", "\"schema_version\": 7", 1);
    let e = Profile::parse(&text).unwrap_err();
    assert_eq!(e, ProfileError::SchemaTooNew { found: 7 });
    assert!(e.to_string().contains("newer"), "{e}");
}

#[test]
fn impossible_contents_are_refused() {
    let mut p = fixture();
    p.groups[0].buckets[1].bytes = 1;
    assert!(Profile::parse(&p.to_json())
        .unwrap_err()
        .to_string()
        .contains("out of order"));
    let mut p = fixture();
    p.groups[0].buckets[0].choice = Backend::TwoStagePush;
    assert!(Profile::parse(&p.to_json())
        .unwrap_err()
        .to_string()
        .contains("without a result"));
    // NCCL's plugin reads nccl_choice as a pin: a kernel there is refused, naming it.
    let mut p = fixture();
    p.groups[0].buckets[0].nccl_choice = Some(Backend::OneStagePush);
    assert!(Profile::parse(&p.to_json())
        .unwrap_err()
        .to_string()
        .contains("nccl_choice one_stage_push at"));
    let mut p = fixture();
    p.groups[0].gpus = vec![0, 9];
    let e = Profile::parse(&p.to_json()).unwrap_err();
    assert!(matches!(e, ProfileError::Invalid(_)), "{e:?}");
    assert!(e.to_string().contains("GPU"), "{e}");
    // A kernel record a reader cannot trust: a digest that is not one.
    let mut p = fixture();
    p.simulated = false;
    p.fabric = "CUDA, 2 GPUs".into();
    p.kernels = vec![crate::profile::KernelImages {
        nvrtc: "13.0".into(),
        target: "sm_90".into(),
        programs: vec![crate::profile::ProgramImage {
            program: "allreduce.cu".into(),
            source_sha256: "0".repeat(64),
            image_sha256: "not hex".into(),
        }],
    }];
    let e = Profile::parse(&p.to_json()).unwrap_err();
    assert!(e.to_string().contains("SHA-256"), "{e}");
}

/// Hand edits a reader must not follow: a simulated profile marked measured (exports would
/// then go out without --allow-simulated), islands that do not split the group, and a model
/// band upside down.
#[test]
fn hand_edits_that_contradict_the_profile_are_refused() {
    use crate::allreduce::{Islands, Separation};
    let refused = |p: &Profile, needle: &str| {
        let e = Profile::parse(&p.to_json()).unwrap_err();
        assert!(matches!(e, ProfileError::Invalid(_)), "{e:?}");
        assert!(e.to_string().contains(needle), "{e}");
    };
    let mut p = fixture();
    p.simulated = false;
    refused(&p, "the simulator");
    let islands = |gpus: Vec<Vec<usize>>| Islands {
        gpus,
        by: Separation::Switch,
        directions: None,
    };
    let mut p = fixture();
    p.groups[0].islands = Some(islands(vec![vec![0], vec![1]]));
    assert_eq!(
        Profile::parse(&p.to_json()).unwrap(),
        p,
        "one GPU per island"
    );
    for bad in [
        vec![vec![0], vec![1, 2, 3]],
        vec![vec![0, 1]],
        vec![vec![0], vec![0]],
    ] {
        p.groups[0].islands = Some(islands(bad));
        refused(&p, "do not split its GPUs");
    }
    let mut p = fixture();
    let t = p.groups[0].buckets[0]
        .results
        .get_mut(&Backend::Nccl)
        .unwrap();
    t.model = Some(crate::profile::ModelBand {
        low: 50.5,
        high: 1.0,
        assumed: false,
        family: None,
    });
    refused(&p, "impossible timing");
}

#[test]
fn a_form_no_kernel_runs_is_refused() {
    use crate::allreduce::Form;
    let mut p = fixture();
    p.groups[0].forms = [(Backend::OneStagePull, Form::Registered)].into();
    assert_eq!(
        Profile::parse(&p.to_json()).unwrap(),
        p,
        "graph mode, registered"
    );
    p.groups[0].forms = [(Backend::Nccl, Form::Staged)].into();
    let e = Profile::parse(&p.to_json()).unwrap_err();
    assert!(e.to_string().contains("never do"), "{e}");
    p.groups[0].mode = Mode::Eager;
    p.groups[0].forms = [(Backend::OneStagePull, Form::Registered)].into();
    let e = Profile::parse(&p.to_json()).unwrap_err();
    assert!(e.to_string().contains("registered in eager mode"), "{e}");
}

#[test]
fn atomic_write_replaces_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.json");
    std::fs::write(&path, "old").unwrap();
    fixture().write_atomic(&path).unwrap();
    assert!(Profile::load(&path).is_ok());
    let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(leftovers, 1, "temporary file left behind");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode(&path),
        0o644,
        "a new profile is readable by engines running as other users"
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    fixture().write_atomic(&path).unwrap();
    assert_eq!(
        mode(&path),
        0o640,
        "a rewrite keeps the mode the operator chose"
    );
    // And its group (an engine's, reading a 0640 profile): root may give any; another user
    // only its own groups, of which it may have none to try.
    use std::os::unix::fs::MetadataExt;
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } == 0 {
        std::os::unix::fs::chown(&path, None, Some(65534)).unwrap();
        fixture().write_atomic(&path).unwrap();
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!(
            (m.gid(), m.mode() & 0o777),
            (65534, 0o640),
            "a rewrite keeps the group"
        );
    } else {
        eprintln!("skipped: the group kept by a rewrite is tried as root only");
    }
}

#[test]
fn rfc3339_known_dates() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(1_795_942_194), "2026-11-29T08:49:54Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
}

#[test]
fn select_answers_from_the_profile_as_it_is_now() {
    // No cache on Profile: an edit after one select is seen by the next.
    let mut p = fixture();
    let q = Query {
        tp: 2,
        mode: Mode::Graph,
        gpus: None,
    };
    let backend = |p: &Profile| match p.select(q, 4096) {
        Selection::Chosen { backend, .. } => backend,
        Selection::Unknown(why) => panic!("{why}"),
    };
    assert_eq!(backend(&p), Backend::OneStagePull);
    p.groups[0].buckets[0].choice = Backend::Nccl;
    assert_eq!(backend(&p), Backend::Nccl);
    // A selector is a snapshot of the profile it was built from, by value.
    let sel = p.selector();
    p.groups.clear();
    assert!(matches!(sel.select(q, 4096), Selection::Chosen { .. }));
}

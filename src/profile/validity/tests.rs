use super::*;
use crate::export::sample;
use crate::topology::presets;

fn texts(v: &Validity) -> Vec<String> {
    v.changes.iter().map(ToString::to_string).collect()
}

/// The sample profile as if measured on a real machine, and that machine.
fn measured() -> (Profile, Topology) {
    let mut p = sample::profile();
    p.simulated = false;
    for (i, g) in p.topology.gpus.iter_mut().enumerate() {
        g.uuid = Some(format!("GPU-tuned-{i}"));
    }
    p.topology.host.driver = Some("570.86.15".into());
    p.versions.driver = p.topology.host.driver.clone();
    let mut now = p.topology.clone();
    now.origin.kind = "nvml".into();
    (p, now)
}

#[test]
fn same_machine_is_valid() {
    let (p, now) = measured();
    assert_eq!(validity(&p, &now), Validity::default());
    assert_eq!(validity(&p, &now).verdict(Allow::default()), "valid here");
}

#[test]
fn same_class_with_other_gpus_is_valid_with_a_note() {
    let (p, mut now) = measured();
    for (i, g) in now.gpus.iter_mut().enumerate() {
        g.uuid = Some(format!("GPU-other-node-{i}"));
        g.bus_id = Some(format!("0000:{:02x}:00.0", 0x80 + i));
    }
    now.host.hostname = Some("node-17".into());
    let v = validity(&p, &now);
    assert!(v.valid(), "{:?}", v.changes);
    assert_eq!(texts(&v), ["tuned on another node of this class"]);
    assert!(v.followed(Allow::default()));
}

#[test]
fn a_fleet_class_profile_is_valid_on_every_node_of_its_class() {
    // `artune fleet` writes the class topology with no UUIDs and the majority versions.
    let (mut p, now) = measured();
    for g in &mut p.topology.gpus {
        g.uuid = None;
    }
    p.fleet = Some(crate::profile::Fleet::default());
    p.fingerprint.host = p.topology.host_hash();
    let v = validity(&p, &now);
    assert!(v.valid() && v.changes.is_empty(), "{:?}", v.changes);
}

#[test]
fn a_driver_bump_is_valid_with_a_note_that_suggests_measuring() {
    let (p, mut now) = measured();
    now.host.driver = Some("580.159.04".into());
    now.host.nccl = Some("2.28.9".into());
    let v = validity(&p, &now);
    assert!(v.valid(), "{:?}", v.changes);
    assert_eq!(texts(&v), ["driver 570.86.15 → 580.159.04"]);
    assert_eq!(
        v.verdict(Allow::default()),
        "valid here; driver 570.86.15 → 580.159.04: re-timing its decisive sizes (artune check --measure) tells whether its choices still hold"
    );
}

#[test]
fn other_gpu_model_count_or_link_width_is_not_valid() {
    let (p, now) = measured();
    let mut model = now.clone();
    model.gpus[1].name = "NVIDIA L40S".into();
    let mut width = now.clone();
    width.gpus[2].pcie.max_width = Some(8);
    width.gpus[2].pcie.width = Some(8);
    let mut narrowed = now.clone();
    narrowed.gpus[3].pcie.width = Some(4);
    let count = {
        let mut t = presets::get("pcie-2x").unwrap();
        t.origin.kind = "nvml".into();
        t
    };
    for (now, want) in [
        (
            &model,
            "GPU 1 NVIDIA RTX PRO 6000 Blackwell Server Edition → NVIDIA L40S",
        ),
        (&width, "GPU 2 PCIe link Gen5 x16 → Gen5 x8"),
        (
            &narrowed,
            "GPU 3 PCIe link trained at x4 of x16 (it ran full width when profiled)",
        ),
        (&count, "GPU count 4 → 2"),
    ] {
        let v = validity(&p, now);
        assert!(!v.valid(), "{want}");
        assert!(
            texts(&v).iter().any(|t| t == want),
            "{want}: {:?}",
            texts(&v)
        );
        assert!(!v.followed(Allow::default()));
        let verdict = v.verdict(Allow::default());
        assert!(
            verdict.starts_with("not valid here (") && verdict.contains(want),
            "{verdict}"
        );
        assert!(verdict.contains("ARTUNE_ALLOW_INVALID=1"), "{verdict}");
    }
}

#[test]
fn the_override_is_said_with_what_it_overrides() {
    let (p, mut now) = measured();
    now.gpus[0].name = "NVIDIA L40S".into();
    let v = validity(&p, &now);
    let allow = Allow {
        invalid: true,
        ..Allow::default()
    };
    assert!(v.followed(allow));
    let verdict = v.verdict(allow);
    assert!(
        verdict.starts_with("NOT valid here (GPU 0 ")
            && verdict.ends_with("followed because ARTUNE_ALLOW_INVALID=1"),
        "{verdict}"
    );
    // ARTUNE_ALLOW_SIMULATED covers a simulated profile, not other hardware.
    let sim = Allow {
        simulated: true,
        ..Allow::default()
    };
    assert!(!v.followed(sim));
}

#[test]
fn simulated_profile_is_not_valid_on_a_real_machine() {
    let p = sample::profile();
    let mut now = presets::get("pcie-4x-1switch").unwrap();
    now.origin.kind = "nvml".into();
    let v = validity(&p, &now);
    assert!(matches!(v.changes[..], [Change::Simulated { .. }]));
    assert!(texts(&v)[0].contains("simulated fabric"));
    assert!(!v.followed(Allow::default()));
    let allow = Allow {
        simulated: true,
        ..Allow::default()
    };
    assert!(v.followed(allow));
    assert!(v
        .verdict(Allow::default())
        .contains("ARTUNE_ALLOW_SIMULATED=1"));
    // Against a preset, it is compared like any other machine.
    now.origin.kind = "preset".into();
    assert!(validity(&p, &now).valid());
}

#[test]
fn what_the_machine_does_not_report_is_unchecked_not_a_change() {
    let (mut p, mut now) = measured();
    p.versions.nccl = Some("2.28.9".into());
    now.gpus[0].uuid = None;
    let v = validity(&p, &now);
    assert!(v.valid() && v.changes.is_empty(), "{:?}", v.changes);
    assert_eq!(v.unchecked, [Unchecked::Version("NCCL")]);
}

#[test]
fn a_changed_variable_is_a_note_of_its_own() {
    let mut p = sample::profile();
    let mut now = presets::get("pcie-4x-1switch").unwrap();
    now.origin.kind = "file".into();
    let vars = |items: &[(&str, &str)]| {
        super::super::environment::relevant(items.iter().map(|(k, v)| (*k, *v)))
    };
    let mut v = validity(&p, &now);
    add_environment(&mut v, &p, &vars(&[("NCCL_P2P_LEVEL", "SYS")]));
    assert!(
        v.changes.is_empty(),
        "no record, no verdict: {:?}",
        v.changes
    );
    assert_eq!(v.unchecked, [Unchecked::Environment]);
    p.environment = Some(super::super::Environment {
        variables: vars(&[("NCCL_P2P_LEVEL", "SYS")]),
        ..Default::default()
    });
    let mut v = validity(&p, &now);
    add_environment(&mut v, &p, &vars(&[("NCCL_DEBUG", "INFO")]));
    assert_eq!(texts(&v), ["NCCL_P2P_LEVEL=SYS when tuned, unset now"]);
    assert!(v.valid());
    let mut v = validity(&p, &now);
    add_environment(&mut v, &p, &vars(&[("NCCL_P2P_LEVEL", "SYS")]));
    assert!(v.changes.is_empty(), "{:?}", v.changes);
}

/// A loopback profile's GPUs are one real GPU: judged against the GPU at its bus id (here
/// GPU 1 of a machine whose GPU 0 is another model), not by a GPU count.
#[test]
fn a_loopback_profile_is_judged_by_the_gpu_it_ran_on() {
    let (mut p, mut now) = measured();
    p.topology.origin.kind = "loopback".into();
    for g in &mut p.topology.gpus {
        (g.uuid, g.bus_id) = (None, Some("0000:41:00.0".into()));
    }
    now.gpus.truncate(2);
    now.pairs.retain(|x| x.from < 2 && x.to < 2);
    now.gpus[0].name = "NVIDIA L40S".into();
    now.gpus[1].bus_id = Some("0000:41:00.0".into());
    assert!(
        validity(&p, &now).valid(),
        "{:?}",
        validity(&p, &now).changes
    );
    now.gpus[1].bus_id = Some("0000:42:00.0".into());
    let v = validity(&p, &now);
    assert_eq!(
        texts(&v),
        ["GPU 0 NVIDIA RTX PRO 6000 Blackwell Server Edition → NVIDIA L40S"]
    );
}

#[test]
fn summary_shows_the_first_reasons_and_counts_the_rest() {
    let v = Validity {
        changes: (0..6)
            .map(|gpu| Change::GpuName {
                gpu,
                old: "A".into(),
                new: "B".into(),
            })
            .chain([Change::OtherNode])
            .collect(),
        unchecked: vec![],
    };
    assert_eq!(v.summary(2), "GPU 0 A → B, GPU 1 A → B and 4 more");
}

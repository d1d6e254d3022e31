use super::*;
use crate::doctor::facts::Machine;
use crate::doctor::facts::{Measured, PairTransfer, ProfileFacts};
use crate::topology::nvml::GpuSettings;
use crate::topology::presets;
use crate::topology::{PathClass, Status as P2pStatus};

/// A simulated 2-GPU machine with no sysfs, no NVML and an empty environment.
fn facts(preset: &str) -> Facts {
    Facts {
        machine: Machine::Preset(preset.into()),
        topology: presets::get(preset).map_err(|e| e.to_string()),
        sysfs: Err("no sysfs".into()),
        gpu_bus_ids: Vec::new(),
        cmdline: Err("no cmdline".into()),
        settings: Err("no NVML".into()),
        env: Vec::new(),
        profile: None,
        measured: None,
        occupancy: Err("no NVML".into()),
    }
}

fn settings(bar1: Result<u64, String>, persistence: Result<bool, String>) -> GpuSettings {
    GpuSettings {
        index: 0,
        bus_id: None,
        bar1_bytes: bar1,
        persistence,
    }
}

#[test]
fn environment_names_the_variables_that_change_a_measurement() {
    let env = |kv: &[(&str, &str)]| -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(environment(&env(&[("HOME", "/root")])).status, Status::Ok);
    let c = environment(&env(&[
        ("NCCL_P2P_DISABLE", "1"),
        ("NCCL_IB_HCA", "mlx5_0"),
        ("PATH", "/bin"),
    ]));
    assert_eq!(c.status, Status::Warn);
    assert!(c.evidence.contains("NCCL_IB_HCA=mlx5_0"), "{}", c.evidence);
    assert!(c.evidence.contains("NCCL_P2P_DISABLE=1"));
    assert!(!c.evidence.contains("PATH"));
    // A leftover of multi-node jobs is named, but not as changing a tune (tune and check
    // ignore it: profile::environment::matters), nor unset in the advice, nor a warning alone.
    assert!(c
        .evidence
        .contains("NCCL_IB_HCA=mlx5_0 matters only between nodes"));
    assert!(
        c.action.contains("env -u NCCL_P2P_DISABLE artune"),
        "{}",
        c.action
    );
    assert!(!c.action.contains("NCCL_IB_HCA"), "{}", c.action);
    let c = environment(&env(&[("NCCL_IB_HCA", "mlx5_0"), ("NCCL_NET", "IB")]));
    assert_eq!(c.status, Status::Ok, "{}", c.evidence);
    assert!(c
        .evidence
        .contains("NCCL_IB_HCA=mlx5_0, NCCL_NET=IB matter only between nodes"));
}

#[test]
fn persistence_off_warns_and_unreadable_is_unknown() {
    let mut f = facts("pcie-2x");
    assert_eq!(persistence(&f).status, Status::Unknown);
    f.settings = Ok(vec![settings(Ok(1 << 40), Ok(true)), {
        let mut s = settings(Ok(1 << 40), Ok(false));
        s.index = 1;
        s
    }]);
    let c = persistence(&f);
    assert_eq!(c.status, Status::Warn);
    assert!(c.evidence.contains("GPU 1"), "{}", c.evidence);
    assert!(c.action.contains("nvidia-smi -pm 1"));
    f.settings = Ok(vec![settings(Ok(1), Err("no permission".into()))]);
    assert!(persistence(&f).evidence.contains("no permission"));
    f.settings = Ok(vec![settings(Ok(1), Ok(true))]);
    assert_eq!(persistence(&f).status, Status::Ok);
}

#[test]
fn bar1_smaller_than_memory_warns() {
    let mut f = facts("pcie-2x");
    assert_eq!(bar1(&f).status, Status::Unknown);
    f.settings = Ok(vec![
        settings(Ok(256 << 20), Ok(true)),
        settings(Ok(256 << 30), Ok(true)),
    ]);
    let c = bar1(&f);
    assert_eq!(c.status, Status::Warn);
    assert!(
        c.evidence
            .contains("GPU 0: 256.0 MiB for 96.0 GiB of memory"),
        "{}",
        c.evidence
    );
    assert!(c.action.contains("Resizable BAR"));
    f.settings = Ok(vec![
        settings(Ok(256 << 30), Ok(true)),
        settings(Ok(256 << 30), Ok(true)),
    ]);
    assert_eq!(bar1(&f).status, Status::Ok);
}

#[test]
fn p2p_that_corrupts_fails_even_when_the_driver_reports_it() {
    let mut f = facts("pcie-2x");
    assert_eq!(p2p(&f).status, Status::Ok);
    f.measured = Some(Measured {
        links: Err("x".into()),
        pairs: Ok(vec![PairTransfer {
            a: 0,
            b: 1,
            result: Err("one_stage_push gave wrong data".into()),
        }]),
    });
    let c = p2p(&f);
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence.contains("0-1: one_stage_push gave wrong data"),
        "{}",
        c.evidence
    );
    f.measured = Some(Measured {
        links: Err("x".into()),
        pairs: Err("the GPUs could not be opened".into()),
    });
    let c = p2p(&f);
    assert_eq!(c.status, Status::Ok);
    assert!(
        c.evidence.contains("not verified by a transfer"),
        "{}",
        c.evidence
    );
}

#[test]
fn p2p_refused_across_sockets_warns() {
    let mut f = facts("pcie-8x-direct-2socket");
    let t = f.topology.as_mut().unwrap();
    for p in t.pairs.iter_mut() {
        if p.path == PathClass::SYS {
            p.p2p.read = P2pStatus::No;
        } else {
            p.p2p.read = P2pStatus::Ok;
            p.p2p.write = P2pStatus::Ok;
        }
    }
    let c = p2p(&f);
    assert_eq!(c.status, Status::Warn, "{}", c.evidence);
    assert!(c.evidence.contains("(SYS)"), "{}", c.evidence);
}

#[test]
fn idle_generation_warns_narrow_width_fails() {
    let mut f = facts("pcie-2x");
    f.machine = Machine::Real;
    let t = f.topology.as_mut().unwrap();
    t.origin.link_reading = "idle".into();
    t.gpus[0].pcie.gen = Some(1);
    let c = links(&f);
    assert_eq!(c.status, Status::Warn, "{}", c.evidence);
    assert!(c.action.contains("--measure"));
    f.topology.as_mut().unwrap().gpus[1].pcie.width = Some(8);
    let c = links(&f);
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence.contains("GPU 1 PCIe link Gen5 x8"),
        "{}",
        c.evidence
    );
    // Under load a lower generation is a fault too.
    let mut t = f.topology.clone().unwrap();
    t.gpus[1].pcie.width = Some(16);
    t.origin.link_reading = "load".into();
    f.measured = Some(Measured {
        links: Ok(t),
        pairs: Ok(vec![]),
    });
    let c = links(&f);
    assert_eq!(c.status, Status::Fail);
    assert!(c.evidence.contains("read under load"), "{}", c.evidence);
}

#[test]
fn versions_compare_with_the_profile() {
    let mut f = facts("pcie-2x");
    f.machine = Machine::Real;
    f.topology.as_mut().unwrap().host.nccl = None;
    assert_eq!(
        versions(&f).status,
        Status::Warn,
        "NCCL missing on a real machine"
    );
    f.topology.as_mut().unwrap().host.nccl = Some("2.28.3".into());
    assert_eq!(versions(&f).status, Status::Ok);
    f.profile = Some(ProfileFacts {
        path: "p.json".into(),
        changes: vec!["driver 570.1 → 580.2".into()],
        ..Default::default()
    });
    let c = versions(&f);
    assert_eq!(c.status, Status::Warn);
    assert!(c.evidence.contains("driver 570.1 → 580.2"));
    assert!(
        c.action.contains("run `artune tune --out p.json` again"),
        "{}",
        c.action
    );
    // A measured profile is made again by measuring, whatever model it was read against
    // (a simulated tune into its file would replace the measurement), as check says.
    f.machine = Machine::Preset("pcie-2x".into());
    assert!(
        !versions(&f).action.contains("--sim"),
        "{}",
        versions(&f).action
    );
    // Without NVML the profile is said not compared, not silently left out.
    f.machine = Machine::Real;
    f.topology = Err("cannot load libnvidia-ml.so.1".into());
    let c = versions(&f);
    assert_eq!(c.status, Status::Unknown);
    assert!(
        c.evidence.contains("so p.json was not compared with them"),
        "{}",
        c.evidence
    );
}

#[test]
fn no_nvml_leaves_dependent_checks_unknown() {
    let mut f = facts("pcie-2x");
    f.machine = Machine::Real;
    f.topology = Err("cannot load libnvidia-ml.so.1".into());
    assert_eq!(driver(&f).status, Status::Fail);
    f.gpu_bus_ids = vec!["0000:03:00.0".into()];
    assert!(driver(&f).evidence.contains("sysfs shows 1 NVIDIA GPU"));
    for c in [p2p(&f), links(&f), islands(&f), versions(&f)] {
        assert_eq!(c.status, Status::Unknown, "{}", c.id);
    }
    // No GPU on the bus either: acs points at the driver check, not at running as root.
    f.gpu_bus_ids.clear();
    f.sysfs = Ok(crate::topology::sysfs::Sysfs::new("/nonexistent"));
    let c = acs(&f);
    assert_eq!(
        (c.status, c.action.as_str()),
        (Status::Unknown, "fix the driver check first")
    );
}

#[test]
fn a_transfer_settles_pairs_the_driver_gave_no_status() {
    let mut f = facts("pcie-8x-direct-2socket");
    let c = p2p(&f);
    assert_eq!(
        c.status,
        Status::Unknown,
        "cross-socket pairs have no stated status"
    );
    assert!(c.action.contains("--measure"));
    let pairs = (0..8)
        .flat_map(|a| (a + 1..8).map(move |b| (a, b)))
        .map(|(a, b)| PairTransfer {
            a,
            b,
            result: Ok("one_stage_pull came out right".into()),
        })
        .collect();
    f.measured = Some(Measured {
        links: Err("x".into()),
        pairs: Ok(pairs),
    });
    let c = p2p(&f);
    assert_eq!(c.status, Status::Ok, "{}", c.evidence);
    assert!(
        c.evidence.contains("a transfer verified 28 pairs"),
        "{}",
        c.evidence
    );
}

#[test]
fn a_gpu_in_use_warns_naming_the_process() {
    use crate::topology::occupancy::{GpuReading, Process, Reading};
    let mut f = facts("pcie-2x");
    assert_eq!(busy(&f).status, Status::Unknown);
    let idle = GpuReading {
        index: 0,
        utilization_pct: Some(0),
        ..Default::default()
    };
    f.occupancy = Ok(Reading {
        gpus: vec![idle.clone()],
    });
    assert_eq!(busy(&f).status, Status::Ok);
    let mut used = idle;
    used.processes.push(Process {
        pid: 77,
        name: "trainer".into(),
        memory_bytes: None,
    });
    f.occupancy = Ok(Reading { gpus: vec![used] });
    let c = busy(&f);
    assert_eq!(c.status, Status::Warn);
    assert!(c.evidence.contains("pid 77 (trainer)"), "{}", c.evidence);
}

#[test]
fn nvmls_failure_is_said_once_by_the_driver_check() {
    let mut f = facts("pcie-2x");
    let why = "cannot load the NVIDIA management library (libnvidia-ml.so.1)";
    f.topology = Err(format!("no NVIDIA GPU was found: {why}"));
    f.settings = Err(why.into());
    f.occupancy = Err(why.into());
    let checks = all(&f);
    let saying: Vec<&str> = checks
        .iter()
        .filter(|c| c.evidence.contains(why))
        .map(|c| c.id)
        .collect();
    assert_eq!(saying, ["driver"], "{checks:?}");
    for c in [bar1(&f), persistence(&f), busy(&f)] {
        assert_eq!(c.action, "fix the driver check first", "{c:?}");
    }
    // Another failure than the driver's is said where it happens.
    f.settings = Err("NVML timed out".into());
    assert!(persistence(&f).evidence.contains("NVML timed out"));
}

//! A synthetic profile with made-up timings (latency + size / bandwidth per backend), for
//! tests, benchmarks and documentation. It is labelled simulated and says it was not measured;
//! never use its numbers as facts about any machine.

use std::collections::BTreeMap;

use crate::allreduce::memory;
use crate::allreduce::{Backend, Dtype, Mode};
use crate::profile::*;
use crate::topology::presets;

/// (latency us, bandwidth GB/s) per backend for a group of `tp` GPUs on PCIe; None = waived.
fn model(backend: Backend, tp: usize) -> Option<(f64, f64)> {
    let n = tp as f64;
    Some(match backend {
        Backend::Nccl => (12.0 + n, 20.0),
        Backend::NcclRingLl => (8.0 + n, 6.0),
        Backend::NcclRingLl128 => (10.0 + n, 18.0),
        Backend::NcclRingSimple => (14.0 + n, 24.0),
        Backend::NcclTreeLl => (9.0 + n, 5.0),
        Backend::NcclTreeLl128 | Backend::NcclTreeSimple => return None,
        Backend::OneStagePull => (2.0 + n, 20.0 / n),
        Backend::OneStagePush if tp > 2 => return None,
        Backend::OneStagePush => (3.0 + n, 24.0 / n),
        Backend::TwoStagePull => (4.0 + n, 32.0 / n),
        Backend::TwoStagePush => (5.0 + n, 30.0 / n),
        // The sample's group has no islands.
        Backend::IslandTwoShot | Backend::IslandOneShot | Backend::IslandTwoShotCopy => {
            return None
        }
        // Made-up figures would say nothing of copy engines; the sample leaves them out.
        Backend::TwoStageCopy => return None,
    })
}

fn timing(us: f64) -> Timing {
    Timing {
        median_us: us,
        ci_low_us: us * 0.98,
        ci_high_us: us * 1.02,
        samples: 30,
        outliers: 0,
        model: None,
    }
}

fn group(gpus: Vec<usize>, mode: Mode, sizes: &[u64]) -> GroupProfile {
    group_scaled(gpus, mode, sizes, 1.0)
}

/// A group whose custom kernels take `custom` times as long as the model says.
fn group_scaled(gpus: Vec<usize>, mode: Mode, sizes: &[u64], custom: f64) -> GroupProfile {
    let tp = gpus.len();
    let eager = if mode == Mode::Eager { 3.0 } else { 0.0 };
    let max = sizes.last().copied().unwrap_or(1);
    let buckets: Vec<Bucket> = sizes
        .iter()
        .map(|&bytes| {
            let results: BTreeMap<Backend, Timing> = Backend::ALL
                .into_iter()
                .filter_map(|b| {
                    model(b, tp).map(|(lat, gbps)| {
                        let k = if b.is_custom() { custom } else { 1.0 };
                        (b, timing(k * (lat + eager + bytes as f64 / (gbps * 1e3))))
                    })
                })
                .collect();
            let choice =
                crate::decide::rule_choice(&results, crate::allreduce::Ranks::flat(tp), bytes)
                    .unwrap_or(Backend::Nccl);
            let nccl_choice = crate::decide::nccl_choice(&results);
            let waived = Backend::ALL
                .into_iter()
                .filter(|b| model(*b, tp).is_none())
                .map(|b| (b, "not measured in this synthetic sample".to_string()))
                .collect();
            Bucket {
                bytes,
                choice,
                nccl_choice,
                fallback: None,
                results,
                waived,
            }
        })
        .collect();
    let crossovers = crate::decide::crossovers(&buckets);
    let memory = Backend::ALL
        .into_iter()
        .filter(|b| model(*b, tp).is_some())
        .map(|b| {
            let custom = b.is_custom();
            (
                b,
                Memory {
                    bytes_per_gpu: memory::modelled(b, crate::allreduce::Ranks::flat(tp), max, 2),
                    measured: false,
                    serves_up_to_bytes: custom.then_some(max),
                    chosen_up_to_bytes: None,
                    required_bytes_per_gpu: None,
                },
            )
        })
        .collect();
    GroupProfile {
        gpus,
        tp,
        mode,
        dtype: Dtype::Bf16,
        placement: "one switch".into(),
        islands: None,
        buckets,
        crossovers,
        memory,
        forms: Default::default(),
        nccl_channels: None,
        pin_channels: Default::default(),
        channels_unmeasured: None,
        waived: Default::default(),
        regret: None,
        drift: Default::default(),
        beside: Vec::new(),
    }
}

/// A profile of `preset` with one group per TP size and mode, buckets at `sizes`.
pub fn profile_with(preset: &str, tps: &[usize], sizes: &[u64]) -> Profile {
    let topology = presets::get(preset).expect("sample presets exist");
    let groups = tps
        .iter()
        .flat_map(|&tp| [Mode::Graph, Mode::Eager].map(|m| group((0..tp).collect(), m, sizes)))
        .collect();
    Profile {
        schema_version: SCHEMA_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").into(),
        created: rfc3339(1_795_942_194),
        simulated: true,
        fabric: format!("synthetic sample on {preset} (not measured)"),
        fingerprint: Fingerprint {
            topology_class: topology.class_hash(),
            host: topology.host_hash(),
        },
        versions: Versions::default(),
        topology,
        groups,
        contention: vec![],
        settings: Settings {
            min_bytes: sizes.first().copied().unwrap_or(0),
            max_bytes: sizes.last().copied().unwrap_or(0),
            tp: tps.to_vec(),
            modes: vec![Mode::Graph, Mode::Eager],
            seed: Some(1),
            mem_budget_bytes: None,
            target_ci: 0.02,
            tuning_seconds: 0.0,
            ..Default::default()
        },
        faults: vec![],
        assumed: vec![],
        node: None,
        fleet: None,
        environment: None,
        recovered: Vec::new(),
        kernels: Vec::new(),
    }
}

/// TP2 and TP4 on `pcie-4x-1switch`, 1 KiB to 16 MiB in steps of 4.
pub fn profile() -> Profile {
    let sizes: Vec<u64> = (0..8).map(|i| 1024u64 << (2 * i)).collect();
    profile_with("pcie-4x-1switch", &[2, 4], &sizes)
}

/// `nvswitch-8x` with two placements per TP size: TP2 on GPUs 0,1 and 4,5, TP4 on 0-3 and
/// 4-7, the second of each with custom kernels 1.6 times slower, so their answers differ.
pub fn placements() -> Profile {
    let sizes: Vec<u64> = (0..8).map(|i| 1024u64 << (2 * i)).collect();
    let mut p = profile_with("nvswitch-8x", &[2, 4], &sizes);
    for tp in [2, 4] {
        for m in [Mode::Graph, Mode::Eager] {
            let mut g = group_scaled((4..4 + tp).collect(), m, &sizes, 1.6);
            g.placement = "the other half".into();
            p.groups.push(g);
        }
    }
    p
}

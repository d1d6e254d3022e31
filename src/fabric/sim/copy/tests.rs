//! Copy-engine schedules priced on the flow network.

use super::*;
use crate::fabric::sim::custom::Custom;
use crate::fabric::sim::SimFabric;
use crate::fabric::{Dtype, Fabric, Group, TimeModel};
use crate::topology::presets;

fn models(preset: &str, n: usize) -> (CopyEngines, Custom) {
    let t = presets::get(preset).unwrap();
    let net = Net::build(&t);
    let gpus: Vec<usize> = (0..n).collect();
    (
        CopyEngines::new(&net, &gpus, None),
        Custom::new(&net, &gpus, None),
    )
}

#[test]
fn copies_move_at_the_copy_engine_rate_where_kernel_loads_degrade() {
    // Four GPUs under one switch, each pulling from one peer at a time: every stagger moves
    // at the port's copy-engine rate (56.32 GB/s), where the kernels' all-to-all loads get
    // C5's 20.6 GB/s per GPU over three peers.
    let (c, _) = models("pcie-4x-1switch", 4);
    let pat = c.pattern(Peers::All);
    assert_eq!(pat.us_per_byte.len(), 3);
    for upb in &pat.us_per_byte {
        let rate = 1.0 / (upb * 1e3);
        assert!((rate - 56.32).abs() < 1e-6, "{rate}");
    }
}

#[test]
fn a_call_is_its_copies_its_sum_and_its_local_copies() {
    // Two-stage over 8: the bytes' part is each phase's 7 staggered copies of a shard, the
    // staging copy (read + write the message), the sum (8 inputs read, 1 written, of a
    // shard) and the GPU's own shard gathered locally (read + write).
    let (c, _) = models("pcie-8x-2switch", 8);
    let b = 16u64 << 20;
    let shard = (b / 8) as f64;
    let wire: f64 = c.pattern(Peers::All).us_per_byte.iter().sum::<f64>() * shard;
    let local = (2.0 * b as f64 + 9.0 * shard + 2.0 * shard) / (LOCAL_MEM_GBPS * 1e3);
    let data = c.time(Backend::TwoStageCopy, b) - c.fixed(Backend::TwoStageCopy);
    assert!((data - (2.0 * wire + local)).abs() < 1e-6, "{data}");
    // Across the two switches, the staggers that cross share one uplink: k = 4 puts every
    // GPU's copy across it, the slowest stagger.
    let pat = c.pattern(Peers::All);
    let slowest = pat.us_per_byte.iter().copied().fold(0.0, f64::max);
    assert_eq!(pat.us_per_byte[3], slowest);
}

#[test]
fn copy_engines_lose_where_fixed_costs_rule_and_win_where_bytes_do() {
    let (c, k) = models("pcie-4x-1switch", 4);
    let kernel = |b| k.time(Backend::TwoStagePush, b, None);
    assert!(c.time(Backend::TwoStageCopy, 4096) > kernel(4096));
    assert!(c.time(Backend::TwoStageCopy, 16 << 20) < kernel(16 << 20));
    // Not a copy-engine backend: nothing to price.
    assert!(c.time(Backend::TwoStagePush, 4096).is_nan());
}

#[test]
fn the_island_schedule_copies_inside_islands_and_across_once() {
    let t = presets::get("pcie-8x-2switch").unwrap();
    let gpus: Vec<usize> = (0..8).collect();
    let islands = crate::plan::islands(&t, &gpus).unwrap();
    let c = CopyEngines::new(&Net::build(&t), &gpus, Some(&islands));
    let steps = c.steps(Backend::IslandTwoShotCopy, 1024.0);
    let copies: Vec<Peers> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Copies { peers, .. } => Some(*peers),
            _ => None,
        })
        .collect();
    assert_eq!(copies, [Peers::Island, Peers::Counterparts, Peers::Island]);
    // Three island peers, one counterpart.
    assert_eq!(c.pattern(Peers::Island).us_per_byte.len(), 3);
    assert_eq!(c.pattern(Peers::Counterparts).us_per_byte.len(), 1);
}

#[test]
fn copy_engine_times_carry_their_own_band_and_family() {
    let mut f = SimFabric::new(presets::get("pcie-4x-1switch").unwrap(), 42);
    let g = Group::flat(vec![0, 1, 2, 3], Dtype::Bf16, 16 << 20);
    f.prepare(&g, &Backend::ALL).unwrap();
    let copy = f.model_band(Backend::TwoStageCopy, 4096).unwrap();
    let kernel = f.model_band(Backend::TwoStagePull, 4096).unwrap();
    assert_eq!(copy.model, TimeModel::CopyEngine);
    assert_eq!(kernel.model, TimeModel::Custom);
    // Small: the fixed side, whose constants no figure checks, is wider than a kernel's.
    assert!(copy.high > kernel.high, "{copy:?} vs {kernel:?}");
    let b = f.band(Backend::TwoStageCopy, 4096).unwrap();
    assert!(b.parts.contains(&BandPart::CopyFixed));
    assert!(!b.parts.contains(&BandPart::KernelMicrochip));
    // Eager enqueues every copy and flag operation from the host: dearer than a graph.
    let t = |f: &mut SimFabric, m| f.time(Backend::TwoStageCopy, 4096, m, 1, 3).unwrap()[0];
    assert!(t(&mut f, Mode::Eager) > t(&mut f, Mode::Graph) + 20.0);
}

/// A simulated cell as the tune records it: the model's time, a tight interval, its band.
fn cell(f: &mut SimFabric, b: Backend, bytes: u64) -> crate::results::Timing {
    let (fixed, data) = f.model_split(b, bytes).unwrap();
    let us = fixed + data;
    crate::results::Timing {
        median_us: us,
        ci_low_us: us * 0.99,
        ci_high_us: us * 1.01,
        samples: 20,
        outliers: 0,
        model: f.model_band(b, bytes).map(Into::into),
    }
}

#[test]
fn decide_takes_a_copy_engine_backend_only_beyond_both_bands() {
    // Four GPUs under one switch. At 16 and 64 MiB two_stage_copy is modelled the fastest
    // (ahead of NCCL, 2x ahead of the push kernel), but within NCCL's band: the rule keeps
    // NCCL. Were NCCL three times as slow, it would win beyond both bands and be chosen.
    let mut f = SimFabric::new(presets::get("pcie-4x-1switch").unwrap(), 42);
    let g = Group::flat(vec![0, 1, 2, 3], Dtype::Bf16, 64 << 20);
    f.prepare(&g, &Backend::ALL).unwrap();
    let ranks = crate::allreduce::Ranks::flat(4);
    for bytes in [16u64 << 20, 64 << 20] {
        let mut r: std::collections::BTreeMap<_, _> =
            [Backend::Nccl, Backend::TwoStagePush, Backend::TwoStageCopy]
                .into_iter()
                .map(|b| (b, cell(&mut f, b, bytes)))
                .collect();
        let fastest = r
            .iter()
            .min_by(|a, b| a.1.median_us.total_cmp(&b.1.median_us));
        assert_eq!(
            fastest.map(|x| *x.0),
            Some(Backend::TwoStageCopy),
            "{bytes}"
        );
        let choice = crate::decide::rule_choice(&r, ranks, bytes);
        assert_eq!(choice, Some(Backend::Nccl), "{bytes}");
        let nccl = r.get_mut(&Backend::Nccl).unwrap();
        for t in [
            &mut nccl.median_us,
            &mut nccl.ci_low_us,
            &mut nccl.ci_high_us,
        ] {
            *t *= 3.0;
        }
        let choice = crate::decide::rule_choice(&r, ranks, bytes);
        assert_eq!(choice, Some(Backend::TwoStageCopy), "{bytes}");
    }
}

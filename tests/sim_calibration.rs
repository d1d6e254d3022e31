//! The simulated fabric against the published measurements it is calibrated on
//! (published PCIe measurements, quoted with their sources in the comments). Each test names the calibration line it checks.
//! Everything goes through the `Fabric` trait, plus `SimFabric::transfer_gbps` for transfer
//! patterns a probe cannot express (one GPU pulling from all others).
//!
//! Latency-critical checks use CUDA-graph mode, as C2's table was measured; C1's NCCL figures
//! come from eager torch.distributed and are checked in eager mode.
//!
//! Each test runs NCCL the way the source did: C1 and C2 set NCCL_P2P_LEVEL=SYS (and C2 a
//! hand-written graph, so its "NCCL" is the best pinned ring, not NCCL's own choice); C6
//! checks NCCL's defaults.

mod boxes;

use artune::fabric::sim::calibration::Calibration;
use artune::fabric::sim::nccl::Level;
use artune::fabric::sim::SimFabric;
use artune::fabric::{Backend, Direction, Dtype, Fabric, Group, Mode, Readiness};
use artune::topology::presets::get;
use artune::topology::{Contention, Topology};
use boxes::asus;

const KB: u64 = 1024;
const MB: u64 = 1024 * KB;

/// The preset with NCCL_P2P_LEVEL=SYS, as C1 and C2 ran.
fn fabric(preset: &str, gpus: &[usize]) -> SimFabric {
    fabric_at(preset, gpus, Some(Level::Sys))
}

fn fabric_at(preset: &str, gpus: &[usize], level: Option<Level>) -> SimFabric {
    let mut f = SimFabric::new(get(preset).unwrap(), 2024).with_nccl_p2p_level(level);
    f.prepare(&group(gpus), &Backend::ALL).unwrap();
    f
}

/// C2's NCCL: a hand-written graph XML let NCCL run its ring as it should, so the best of
/// the pinned ring variants stands for it.
fn c2_nccl(f: &mut SimFabric, bytes: u64) -> f64 {
    median(f, Backend::NcclRingLl, bytes, Mode::Graph).min(median(
        f,
        Backend::NcclRingSimple,
        bytes,
        Mode::Graph,
    ))
}

fn group(gpus: &[usize]) -> Group {
    Group::flat(gpus.to_vec(), Dtype::Bf16, 256 * MB)
}

const ALL8: [usize; 8] = [0, 1, 2, 3, 4, 5, 6, 7];

/// Median per-call µs over 31 samples of 10 calls, as the tuner would summarise them.
fn median(f: &mut SimFabric, b: Backend, bytes: u64, mode: Mode) -> f64 {
    let mut x = f.time(b, bytes, mode, 10, 31).unwrap();
    x.sort_by(f64::total_cmp);
    x[15]
}

fn within(got: f64, want: f64, tol: f64) -> bool {
    (got / want - 1.0).abs() <= tol
}

/// Ring allreduce bus bandwidth, GB/s (nccl-tests convention, C4).
fn busbw(bytes: u64, us: f64, n: usize) -> f64 {
    bytes as f64 / (us * 1e3) * 2.0 * (n as f64 - 1.0) / n as f64
}

// ---- C1: 8 GPUs, two Gen5 switches of 4, one socket (pcie-8x-2switch) -------------------

/// C1: "any single pair writes at 56.2-56.3 GB/s (same switch or across)".
#[test]
fn c1_one_pair_writes_at_link_rate() {
    for pair in [[0, 1], [0, 4]] {
        let mut f = fabric("pcie-8x-2switch", &pair);
        let s = f.probe(Direction::Write, 1, 256 * MB).unwrap();
        assert!(within(s.per_gpu_gbps, 56.25, 0.05), "{pair:?}: {s:?}");
    }
}

/// C1: "Two or four concurrent pairs from one switch to the other share one x16 uplink:
/// 56.4 GB/s in total. Bidirectional, 2 pairs: 109.3 GB/s."
#[test]
fn c1_pairs_across_switches_share_the_uplink() {
    let f = SimFabric::new(get("pcie-8x-2switch").unwrap(), 1);
    for pairs in [&[(0, 4), (1, 5)][..], &[(0, 4), (1, 5), (2, 6), (3, 7)]] {
        let total: f64 = f
            .transfer_gbps(Direction::Write, pairs)
            .unwrap()
            .iter()
            .sum();
        assert!(within(total, 56.4, 0.05), "{pairs:?}: {total}");
    }
    let bidi: f64 = f
        .transfer_gbps(Direction::Write, &[(0, 4), (4, 0), (1, 5), (5, 1)])
        .unwrap()
        .iter()
        .sum();
    assert!(within(bidi, 109.3, 0.05), "{bidi}");
}

/// C1: "All 56 ordered pairs at once: 179 GB/s in total, 3.2 GB/s per pair" (the brief's
/// target: ≈ 180 GB/s ± 20%).
#[test]
fn c1_all_56_pairs_aggregate() {
    let mut f = fabric("pcie-8x-2switch", &ALL8);
    let s = f.probe(Direction::Write, 7, 64 * MB).unwrap();
    assert!(within(s.aggregate_gbps, 180.0, 0.20), "{s:?}");
    assert!(within(s.aggregate_gbps / 56.0, 3.2, 0.20), "{s:?}");
}

/// C1 table: ring busbw plateau 45.6-46.5 GB/s from 64 MB to 1 GB (target 46 ± 15% at
/// 256 MiB), for NCCL pinned to ring/Simple and for NCCL's own choice.
#[test]
fn c1_ring_plateau() {
    let mut f = fabric("pcie-8x-2switch", &ALL8);
    for b in [Backend::NcclRingSimple, Backend::Nccl] {
        for mode in [Mode::Graph, Mode::Eager] {
            let bw = busbw(256 * MB, median(&mut f, b, 256 * MB, mode), 8);
            assert!(within(bw, 46.0, 0.15), "{b} {mode:?}: {bw}");
        }
    }
    // And the plateau is a plateau: 16 MB already gets most of it (C1: 44.2-44.6).
    let bw16 = busbw(
        16 * MB,
        median(&mut f, Backend::Nccl, 16 * MB, Mode::Eager),
        8,
    );
    assert!(within(bw16, 44.4, 0.20), "{bw16}");
}

/// C1 table: 4 KB ring allreduce 17.3-23.9 µs (target: NCCL's own choice between 15 and
/// 30 µs). C1 is eager torch.distributed; graph mode must not be slower.
#[test]
fn c1_nccl_4kb_latency() {
    let mut f = fabric("pcie-8x-2switch", &ALL8);
    let eager = median(&mut f, Backend::Nccl, 4 * KB, Mode::Eager);
    let graph = median(&mut f, Backend::Nccl, 4 * KB, Mode::Graph);
    assert!((15.0..=30.0).contains(&eager), "eager {eager}");
    assert!(
        (15.0..=30.0).contains(&graph) && graph < eager,
        "graph {graph}"
    );
}

// ---- C2: 8 GPUs on root ports, 4 per socket, two sockets (pcie-8x-direct-2socket) --------

/// C2: "P2P unidirectional: 57.2 GB/s same socket, 42-44 GB/s across sockets;
/// bidirectional 112.3 / 75-88 GB/s."
#[test]
fn c2_point_to_point() {
    let f = SimFabric::new(get("pcie-8x-direct-2socket").unwrap(), 1);
    let one = |pairs: &[(usize, usize)]| -> f64 {
        f.transfer_gbps(Direction::Write, pairs)
            .unwrap()
            .iter()
            .sum()
    };
    assert!(within(one(&[(0, 1)]), 57.2, 0.05));
    assert!((42.0..=44.0).contains(&one(&[(0, 4)])));
    assert!(within(one(&[(0, 1), (1, 0)]), 112.3, 0.05));
    assert!((75.0..=88.0).contains(&one(&[(0, 4), (4, 0)])));
}

/// C2: "One GPU pulling from all 7 peers at once: 54.8-56.6 GB/s (limited by its own x16
/// link)."
#[test]
fn c2_one_gpu_pulls_from_seven() {
    let f = SimFabric::new(get("pcie-8x-direct-2socket").unwrap(), 1);
    let pairs: Vec<(usize, usize)> = (1..8).map(|p| (p, 0)).collect();
    let total: f64 = f
        .transfer_gbps(Direction::Read, &pairs)
        .unwrap()
        .iter()
        .sum();
    assert!(within(total, 55.7, 0.05), "{total}");
}

/// C2: "All 8 GPUs pulling from all 7 peers at once (56 flows): 22.7-24.3 GB/s per GPU,
/// 184.6 GB/s in total" (target ± 20%).
#[test]
fn c2_all_pull_all() {
    let mut f = fabric("pcie-8x-direct-2socket", &ALL8);
    let s = f.probe(Direction::Read, 7, 64 * MB).unwrap();
    assert!(within(s.per_gpu_gbps, 23.5, 0.20), "{s:?}");
    assert!(within(s.aggregate_gbps, 184.6, 0.20), "{s:?}");
}

/// C2: "Staggered probe, every GPU reads peer i+k: k=1 52.3, k=2 37.9, k=3 26.8, k=4 19.3 (all
/// cross-socket), k=5 39.6, k=6 41.2, k=7 40.8 GB/s average." The model is symmetric in k and
/// 8−k while the machine is not, so only k=1 and k=4 (the extremes the wiring explains) are
/// held to 10%; the rest to a factor 1.35.
#[test]
fn c2_staggered_reads() {
    let f = SimFabric::new(get("pcie-8x-direct-2socket").unwrap(), 1);
    let published = [52.3, 37.9, 26.8, 19.3, 39.6, 41.2, 40.8];
    for (k, want) in (1..8).zip(published) {
        let pairs: Vec<(usize, usize)> = (0..8).map(|i| ((i + k) % 8, i)).collect();
        let rates = f.transfer_gbps(Direction::Read, &pairs).unwrap();
        let mean = rates.iter().sum::<f64>() / 8.0;
        let tol = if k == 1 || k == 4 { 0.10 } else { 0.35 };
        assert!(within(mean, want, tol), "k={k}: {mean} vs {want}");
    }
}

/// C2 table: one-shot beats NCCL below 32 KB and loses above 128 KB at TP8 (crossover chosen
/// there: 72 KB). One-stage here is the better of pull and push; CUDA graphs as in C2.
#[test]
fn c2_one_stage_crossover() {
    let mut f = fabric("pcie-8x-direct-2socket", &ALL8);
    let one_stage = |f: &mut SimFabric, bytes| {
        median(f, Backend::OneStagePull, bytes, Mode::Graph).min(median(
            f,
            Backend::OneStagePush,
            bytes,
            Mode::Graph,
        ))
    };
    for bytes in [KB, 4 * KB, 8 * KB, 16 * KB, 24 * KB] {
        let (o, n) = (one_stage(&mut f, bytes), c2_nccl(&mut f, bytes));
        assert!(o < n, "{bytes} B: one-stage {o} vs nccl {n}");
    }
    for bytes in [160 * KB, 256 * KB, 512 * KB, MB] {
        let (o, n) = (one_stage(&mut f, bytes), c2_nccl(&mut f, bytes));
        assert!(o > n, "{bytes} B: one-stage {o} vs nccl {n}");
    }
    // The crossover itself lies between 32 and 128 KB.
    let cross = (4..=16)
        .map(|i| i * 8 * KB)
        .find(|&b| one_stage(&mut f, b) > c2_nccl(&mut f, b))
        .unwrap();
    assert!((32 * KB..=128 * KB).contains(&cross), "{cross}");
}

/// C2 table, shape: one-shot (a pull kernel) and NCCL within a factor 1.5 of each published
/// time. C2 ran NCCL with NCCL_MIN_NCHANNELS=8 and a hand-written graph; the simulator runs
/// NCCL's default search (2 channels here), which the factor absorbs.
#[test]
fn c2_table_shape() {
    let table = [
        (KB, 7.5, 18.0),
        (4 * KB, 8.2, 28.2),
        (8 * KB, 8.9, 18.6),
        (16 * KB, 12.0, 25.7),
        (32 * KB, 16.4, 24.9),
        (64 * KB, 25.6, 27.0),
        (72 * KB, 26.9, 31.7),
        (80 * KB, 30.1, 23.3),
        (128 * KB, 44.5, 30.9),
        (256 * KB, 80.8, 55.4),
        (512 * KB, 149.1, 79.6),
        (MB, 288.6, 129.7),
    ];
    let mut f = fabric("pcie-8x-direct-2socket", &ALL8);
    for (bytes, one_shot, nccl) in table {
        let o = median(&mut f, Backend::OneStagePull, bytes, Mode::Graph);
        let n = c2_nccl(&mut f, bytes);
        assert!(
            (o / one_shot).max(one_shot / o) <= 1.5,
            "{bytes} B one-shot {o} vs {one_shot}"
        );
        // The 4 KB NCCL figure (28.2) lies above both neighbours (18.0 at 1 KB, 18.6 at
        // 8 KB): no latency shrinks with size, so that row is held to its neighbours' range.
        let (lo, hi) = if bytes == 4 * KB {
            (18.0, 28.2)
        } else {
            (nccl, nccl)
        };
        assert!(
            n >= lo / 1.5 && n <= hi * 1.5,
            "{bytes} B nccl {n} vs {nccl}"
        );
    }
}

// ---- C3: what the fabric does that a naive model misses ----------------------------------

/// C3: "on 4 GPUs under one switch it can win up to ~0.5-1 MB", and
/// local-inference-lab/vllm#580: two-shot and ring cross over at 768 KB on TP4 PCIe. With
/// kernel loads and stores priced as C5 measured them (three flows per port at 25.4 GB/s
/// per GPU, where NCCL's ring keeps one flow per port at the lone-stream rate) and NCCL's
/// steps costing what C2 and C6 measured, custom reaches less far than that: one or the
/// other kernel beats NCCL at every size up to 64 KB, NCCL takes over between 64 KB and
/// 2 MB; one-stage alone still wins at 32 KB and has lost by 1 MB. The published 0.5-1 MB
/// would need NCCL about 10 µs slower on 4 GPUs than C2 shows it on 8.
#[test]
fn c3_four_gpus_under_one_switch_favour_custom() {
    let mut f = fabric_at("pcie-4x-1switch", &[0, 1, 2, 3], None);
    let custom = [
        Backend::OneStagePull,
        Backend::OneStagePush,
        Backend::TwoStagePull,
        Backend::TwoStagePush,
    ];
    let best_custom = |f: &mut SimFabric, bytes| {
        custom
            .iter()
            .map(|&b| median(f, b, bytes, Mode::Graph))
            .fold(f64::INFINITY, f64::min)
    };
    let best_nccl = |f: &mut SimFabric, bytes| {
        [Backend::Nccl, Backend::NcclRingLl, Backend::NcclRingSimple]
            .iter()
            .map(|&b| median(f, b, bytes, Mode::Graph))
            .fold(f64::INFINITY, f64::min)
    };
    for bytes in (0..=6).map(|i| KB << i) {
        let (c, n) = (best_custom(&mut f, bytes), best_nccl(&mut f, bytes));
        assert!(c < n, "{bytes} B: custom {c} vs nccl {n}");
    }
    let cross = (1..=32)
        .map(|i| i * 64 * KB)
        .find(|&b| best_custom(&mut f, b) > best_nccl(&mut f, b))
        .unwrap();
    assert!((64 * KB..=2 * MB).contains(&cross), "{cross}");
    let one = |f: &mut SimFabric, b| median(f, Backend::OneStagePush, b, Mode::Graph);
    assert!(one(&mut f, 32 * KB) < median(&mut f, Backend::Nccl, 32 * KB, Mode::Graph));
    assert!(one(&mut f, MB) > median(&mut f, Backend::Nccl, MB, Mode::Graph));
}

/// C3: "one-stage loses to ring on 8 PCIe GPUs past a few tens of KB" (C1's box).
#[test]
fn c3_eight_pcie_gpus_one_stage_loses_past_tens_of_kb() {
    let mut f = fabric("pcie-8x-2switch", &ALL8);
    assert!(
        median(&mut f, Backend::OneStagePull, 4 * KB, Mode::Graph)
            < median(&mut f, Backend::Nccl, 4 * KB, Mode::Graph)
    );
    for bytes in [128 * KB, 512 * KB, 4 * MB] {
        let o = median(&mut f, Backend::OneStagePull, bytes, Mode::Graph);
        let n = median(&mut f, Backend::Nccl, bytes, Mode::Graph);
        assert!(o > 1.5 * n, "{bytes} B: one-stage {o} vs nccl {n}");
    }
}

/// A box as `artune topo` reads it from sysfs: the switches' make, model and forwarding
/// curve unstated.
fn as_read(mut t: Topology) -> Topology {
    for s in &mut t.switches {
        s.vendor = None;
        s.device = None;
        s.contention = None;
    }
    t
}

/// `n` GPUs of pcie-4x-1switch's kind under its one switch.
fn one_switch(n: usize) -> Topology {
    let mut t = get("pcie-4x-1switch").unwrap();
    let g = t.gpus[0].clone();
    t.gpus = (0..n)
        .map(|i| artune::topology::Gpu {
            index: i,
            ..g.clone()
        })
        .collect();
    t.pairs.clear();
    t.normalize().unwrap();
    t
}

fn with_sys(t: Topology, gpus: &[usize]) -> SimFabric {
    let mut f = SimFabric::new(t, 2024).with_nccl_p2p_level(Some(Level::Sys));
    f.prepare(&group(gpus), &Backend::ALL).unwrap();
    f
}

/// C1 read without its switches' curve: a switch whose forwarding the file does not state
/// is no crossbar without limit. All 56 pairs move 179 GB/s in total; the uplinks alone
/// would allow 192 (every pair at the cross-switch pairs' 3.4 GB/s), and C1's switches
/// forward that much less under 44 flows each. The default is that measured curve.
#[test]
fn c1_a_switch_without_a_stated_curve_forwards_as_c1s() {
    let mut f = with_sys(as_read(get("pcie-8x-2switch").unwrap()), &ALL8);
    let s = f.probe(Direction::Write, 7, 64 * MB).unwrap();
    // 5%: a probe's jitter (σ 1.3%, one draw per direction and peer count) on the model's
    // 179; a crossbar without limit reads 192 before its jitter.
    assert!(within(s.aggregate_gbps, 179.0, 0.05), "{s:?}");
    assert!(f
        .assumed()
        .iter()
        .any(|a| a.contains("forwarding under many flows not stated for switch `sw0`")));
}

/// C2 read without its sockets' curve: a socket's I/O fabric, crossed by peer traffic
/// between its root complexes, takes the same default (four root ports and the
/// interconnect), and all 8 GPUs pulling from all 7 still move C2's 184.6 GB/s in total
/// (without any limit there: 273).
#[test]
fn c2_a_socket_without_a_stated_curve_forwards_as_c2s() {
    let mut t = get("pcie-8x-direct-2socket").unwrap();
    for s in &mut t.sockets {
        let c = s.contention.as_mut().unwrap();
        c.peak_gbps = None;
        c.knee_flows = None;
        c.slope = None;
    }
    let mut f = with_sys(t, &ALL8);
    let s = f.probe(Direction::Read, 7, 64 * MB).unwrap();
    assert!(within(s.aggregate_gbps, 184.6, 0.05), "{s:?}");
    assert!(f
        .assumed()
        .iter()
        .any(|a| a.contains("not stated for socket 0 I/O fabric")));
}

/// C9 (flashinfer#4870, CX8: 8 Gen5 GPUs in switch pairs, halves 0-3 / 4-7), read from
/// sysfs: four switches of two GPUs, each under its own root complex, two per socket. The
/// copy-engine rates of
/// each schedule's own hops: a pair alone 53.2-55.0 GB/s, a ring inside the switch pairs
/// 52.33, a flat ring 49.64, every flow across the halves at once 23.75. The defaults for
/// unstated switches and socket fabric must not hold back what a ring or a pair exchange
/// puts through them, and flows crossing at once share the uplinks.
#[test]
fn c9_cx8_switch_pairs_read_from_sysfs() {
    let mut t = as_read(get("pcie-8x-2switch").unwrap());
    let sw = t.switches[0].clone();
    let rc = t.root_complexes[0].clone();
    // The halves are the two sockets, the interconnect between them unstated.
    let socket = t.sockets[0].clone();
    t.sockets = (0..2)
        .map(|id| artune::topology::Socket {
            id,
            ..socket.clone()
        })
        .collect();
    t.root_complexes = (0..4)
        .map(|i| artune::topology::RootComplex {
            id: format!("rc{i}"),
            socket: i / 2,
            ..rc.clone()
        })
        .collect();
    t.switches = (0..4)
        .map(|i| artune::topology::Switch {
            id: format!("sw{i}"),
            parent: format!("rc{i}"),
            ..sw.clone()
        })
        .collect();
    for (i, g) in t.gpus.iter_mut().enumerate() {
        g.parent = format!("sw{}", i / 2);
    }
    t.pairs.clear();
    t.normalize().unwrap();
    let f = SimFabric::new(t, 1);
    let rate = |pairs: &[(usize, usize)]| -> f64 {
        let r = f.transfer_gbps(Direction::Write, pairs).unwrap();
        r.iter().sum::<f64>() / r.len() as f64
    };
    let alone = rate(&[(0, 1)]);
    let pairs = rate(&[
        (0, 1),
        (1, 0),
        (2, 3),
        (3, 2),
        (4, 5),
        (5, 4),
        (6, 7),
        (7, 6),
    ]);
    let ring: Vec<(usize, usize)> = (0..8).map(|i| (i, (i + 1) % 8)).collect();
    let flat = rate(&ring);
    let across: Vec<(usize, usize)> = (0..4).flat_map(|i| [(i, i + 4), (i + 4, i)]).collect();
    let across = rate(&across);
    for (got, published) in [
        (alone, 54.1),
        (pairs, 52.33),
        (flat, 49.64),
        (across, 23.75),
    ] {
        assert!(
            (0.67..=1.5).contains(&(got / published)),
            "{got} vs {published}"
        );
    }
    assert!(across < 0.6 * flat, "across {across} vs flat ring {flat}");
}

/// C3 on 8 GPUs under one switch chip, read as sysfs gives it: one-stage all-to-all puts 7
/// flows on every port (56 in the chip, against C5's 3 per port), so the chip's forwarding
/// limits it where a ring, one flow per port, passes untouched. One-stage loses to NCCL
/// "past a few tens of KB" (C3), no later than on C2's 8 GPUs without a switch (72 KB), while
/// the same chip's four-GPU all-to-all (C5's load) runs as C5 measured it.
#[test]
fn c3_eight_gpus_under_one_switch_chip_one_stage_loses_past_tens_of_kb() {
    let mut f = with_sys(as_read(one_switch(8)), &ALL8);
    let one = |f: &mut SimFabric, bytes| {
        median(f, Backend::OneStagePush, bytes, Mode::Graph).min(median(
            f,
            Backend::OneStagePull,
            bytes,
            Mode::Graph,
        ))
    };
    assert!(one(&mut f, 4 * KB) < median(&mut f, Backend::Nccl, 4 * KB, Mode::Graph));
    let cross = (1..=32)
        .map(|i| i * 4 * KB)
        .find(|&b| one(&mut f, b) > median(&mut f, Backend::Nccl, b, Mode::Graph))
        .unwrap_or(u64::MAX);
    println!("8 GPUs under one chip: one-stage loses to NCCL from {cross} B");
    assert!((16 * KB..=64 * KB).contains(&cross), "crossover {cross}");
    // A ring, one flow per port, is not held back by the chip: its large-message time is
    // what it is through a switch stated to forward without limit.
    let mut free = as_read(one_switch(8));
    free.switches[0].contention = Some(Contention {
        peak_gbps: Some(1e6),
        ..Default::default()
    });
    let mut free = with_sys(free, &ALL8);
    let ring = |f: &mut SimFabric| median(f, Backend::NcclRingSimple, 256 * MB, Mode::Graph);
    let (r, r_free) = (ring(&mut f), ring(&mut free));
    assert!(
        within(r, r_free, 0.02),
        "{r} us vs {r_free} us without limit"
    );
    // Four of those GPUs all-to-all through the same kind of chip run as C5 measured (the
    // middle of its stores and loads, the make unstated): the chip does not hold them back.
    let four = SimFabric::new(as_read(one_switch(4)), 1);
    let per_gpu: f64 = four
        .kernel_transfer_gbps(Direction::Write, &all_pairs(4))
        .unwrap()
        .iter()
        .sum::<f64>()
        / 4.0;
    assert!(within(per_gpu, (25.40 + 20.60) / 2.0, 0.05), "{per_gpu}");
}

/// C3 as its source measured it (rtx6kpro hardware/asus-esc8000a-e13p-broadcom-switches.md,
/// "PEX890xx Posted-Write Arbitration Bug", copy engines; its "read" (s, d) pulls d's buffer
/// into s). The page's condition (two GPUs of one partition sending out of its uplink towards
/// two root complexes) is met by the bytes, whichever side drives them: every row where the
/// data leaves a partition from one GPU keeps its rate, reads included (51.1, 51.3 GB/s), and
/// the one read row where two GPUs of each far partition send towards two root complexes,
/// 16 flows across the chips, collapses as the writes do (9.0 GB/s reads, 7.7 writes).
#[test]
fn c3_the_collapse_follows_the_bytes_out_of_the_partition() {
    let f = SimFabric::new(asus(), 5);
    let total = |dir: Direction, pairs: &[(usize, usize)]| -> f64 {
        // The page's (s, d) read pulls d into s: bytes move d → s.
        let moved: Vec<(usize, usize)> = match dir {
            Direction::Write => pairs.to_vec(),
            Direction::Read => pairs.iter().map(|&(s, d)| (d, s)).collect(),
        };
        f.transfer_gbps(dir, &moved).unwrap().iter().sum()
    };
    let collapsed = |gbps: f64| gbps < 10.0;
    // (pairs, writes collapse, reads collapse) per row of the page's table.
    let cross: Vec<(usize, usize)> = (0..4).flat_map(|a| (4..8).map(move |b| (a, b))).collect();
    let rows = [
        ("1 flow", vec![(0, 4)], false, false),
        (
            "2 flows, two partitions",
            vec![(0, 4), (2, 6)],
            false,
            false,
        ),
        ("2 flows, one partition", vec![(0, 4), (1, 6)], true, false),
        (
            "4 flows, GPU0,1 -> GPU4-7",
            vec![(0, 4), (0, 6), (1, 5), (1, 7)],
            true,
            false,
        ),
        ("16 flows across the chips", cross, true, true),
        (
            "same partition, one root port",
            vec![(0, 4), (1, 5)],
            false,
            false,
        ),
    ];
    for (row, pairs, w, r) in rows {
        let (wg, rg) = (
            total(Direction::Write, &pairs),
            total(Direction::Read, &pairs),
        );
        assert_eq!(collapsed(wg), w, "{row}: writes {wg:.1} GB/s");
        assert_eq!(collapsed(rg), r, "{row}: reads {rg:.1} GB/s");
    }
    // One GPU to two root ports, and the reverse direction, do not collapse either.
    assert!(!collapsed(total(Direction::Write, &[(0, 4), (0, 6)])));
    assert!(!collapsed(total(Direction::Write, &[(4, 0), (6, 1)])));
}

/// R2 (the same page, "AllReduce: Custom vs NCCL (8 GPU)", p2pmark 3c39f36): its one-shot is a
/// pull (each rank loads every peer's buffer and stores the sum locally), so its bytes leave
/// every partition from both GPUs towards three root complexes and collapse. The shape: from
/// 4 KB the time grows about linearly with the bytes (33.1, 73.8, 294, 2427 µs at 4, 8, 32,
/// 256 KB), custom wins at 4 KB and NCCL from 8 KB; on the four GPUs of one socket (bytes
/// towards one root complex) the same kernel does not collapse (6.2 µs at 4 KB, 17.4 at 128
/// KB). No constant is fitted on R2: the rate is C3's two-flow copy-engine figure.
#[test]
fn r2_eight_gpus_one_shot_collapses_linearly_and_four_do_not() {
    let pull = Backend::OneStagePull;
    let mut f = SimFabric::new(asus(), 5).with_nccl_p2p_level(Some(Level::Sys));
    f.prepare(&group(&ALL8), &Backend::ALL).unwrap();
    let t = |f: &mut SimFabric, b: Backend, bytes: u64| median(f, b, bytes, Mode::Graph);
    let base = t(&mut f, pull, 256);
    let slope = |f: &mut SimFabric, bytes: u64| (t(f, pull, bytes) - base) / bytes as f64;
    let s4 = slope(&mut f, 4 * KB);
    for bytes in [8 * KB, 32 * KB, 256 * KB] {
        let s = slope(&mut f, bytes);
        assert!(
            (0.6..1.6).contains(&(s / s4)),
            "{bytes} B: {s} vs {s4} µs/B"
        );
    }
    assert!(t(&mut f, pull, 4 * KB) < t(&mut f, Backend::Nccl, 4 * KB));
    assert!(t(&mut f, pull, 8 * KB) > t(&mut f, Backend::Nccl, 8 * KB));
    // 256 KB: the published one-shot is 32x NCCL; here at least 10x.
    assert!(t(&mut f, pull, 256 * KB) > 10.0 * t(&mut f, Backend::Nccl, 256 * KB));
    let mut h = SimFabric::new(asus(), 5).with_nccl_p2p_level(Some(Level::Sys));
    h.prepare(&group(&[0, 1, 2, 3]), &Backend::ALL).unwrap();
    let (four, eight) = (t(&mut h, pull, 128 * KB), t(&mut f, pull, 128 * KB));
    assert!(four < 30.0 && eight > 20.0 * four, "{four} vs {eight}");
}

/// The story's box (C1 class, TP8): the profile never chooses a custom kernel where a NCCL
/// variant measured faster, chooses NCCL from 512 KB (C3: ring wins past tens of KB on 8 PCIe
/// GPUs; two-stage moves 4x the message over each uplink as kernel stores), and one-stage
/// only for the smallest messages, with NCCL's defaults and with NCCL_P2P_LEVEL=SYS.
#[test]
fn c3_eight_pcie_gpus_profile_leaves_large_messages_to_nccl() {
    for level in [None, Some(Level::Sys)] {
        let mut f = SimFabric::new(get("pcie-8x-2switch").unwrap(), 3).with_nccl_p2p_level(level);
        let opts = artune::tune::Options {
            tp: vec![8],
            modes: vec![Mode::Graph],
            max_bytes: 16 * MB,
            contention: false,
            ..Default::default()
        };
        let p = artune::tune::run(&mut f, &opts, &mut |_| {}).unwrap();
        let g = &p.groups[0];
        for b in &g.buckets {
            let nccl = b
                .results
                .iter()
                .filter(|(k, _)| !k.is_custom())
                .map(|(_, t)| t.median_us)
                .fold(f64::INFINITY, f64::min);
            if b.choice.is_custom() {
                let t = b.results[&b.choice].median_us;
                assert!(
                    t < nccl,
                    "{level:?} {} B: {} {t} vs nccl {nccl}",
                    b.bytes,
                    b.choice
                );
                assert!(b.bytes < 512 * KB, "{level:?} {} B: {}", b.bytes, b.choice);
            }
            if matches!(b.choice, Backend::OneStagePull | Backend::OneStagePush) {
                assert!(b.bytes <= 8 * KB, "{level:?} {} B: {}", b.bytes, b.choice);
            }
        }
    }
}

// ---- C4: NCCL's own model ---------------------------------------------------------------

/// C4: "LL128 is disabled by default on PCIe paths": prepare waives it with that reason; on
/// NVSwitch it stays.
#[test]
fn c4_ll128_off_on_pcie() {
    let mut f = SimFabric::new(get("pcie-8x-direct-2socket").unwrap(), 1);
    let r = f
        .prepare(
            &group(&ALL8),
            &[Backend::NcclRingLl128, Backend::NcclTreeLl128],
        )
        .unwrap();
    for x in &r {
        assert!(
            matches!(x, Readiness::Waived { reason, .. } if reason.contains("PCIe")),
            "{x:?}"
        );
    }
    let mut nv = SimFabric::new(get("nvswitch-8x").unwrap(), 1);
    let r = nv
        .prepare(&group(&ALL8), &[Backend::NcclRingLl128])
        .unwrap();
    assert!(matches!(r[0], Readiness::Ready { .. }), "{r:?}");
}

/// C4: "Per-hop latency ... PCIe 1.0 (LL)" and "Ring allreduce has 2(N−1) steps": small-message
/// ring/LL time grows by about 1 µs per added step within one switch.
#[test]
fn c4_ring_latency_grows_per_step() {
    let t = |gpus: &[usize]| {
        let mut f = fabric("pcie-8x-2switch", gpus);
        median(&mut f, Backend::NcclRingLl, KB, Mode::Graph)
    };
    let (t2, t4) = (t(&[0, 1]), t(&[0, 1, 2, 3]));
    // TP2 has 2 steps, TP4 has 6.
    let per_step = (t4 - t2) / 4.0;
    assert!(within(per_step, 1.0, 0.2), "{per_step}");
}

// ---- C5: kernel-driven peer loads and stores, 4 PCIe GPUs under one switch ---------------

/// Every ordered pair of `n` GPUs.
fn all_pairs(n: usize) -> Vec<(usize, usize)> {
    (0..n)
        .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
        .collect()
}

/// C5: "isolated store 44.78, load 42.83; concurrent (every rank drives all three peers)
/// store 25.40, load 20.60 GB/s"; under concurrency stores beat loads. A copy engine on the
/// same pattern is faster, not by the kernel factor but at the share a GPU serves three peers'
/// copies at (p2pmark's four-GPU scores, `Calibration::copy_served_share`): C5 compares with
/// C1's one copy-engine pair (56.2 GB/s), which is no concurrent figure.
#[test]
fn c5_kernel_stores_and_loads_on_four_pcie_gpus() {
    let f = SimFabric::new(get("pcie-4x-1switch").unwrap(), 1);
    let store = f.kernel_transfer_gbps(Direction::Write, &[(0, 1)]).unwrap()[0];
    let load = f.kernel_transfer_gbps(Direction::Read, &[(0, 1)]).unwrap()[0];
    assert!(within(store, 44.78, 0.05), "isolated store {store}");
    assert!(within(load, 42.83, 0.05), "isolated load {load}");
    let per_gpu = |dir| -> f64 {
        f.kernel_transfer_gbps(dir, &all_pairs(4))
            .unwrap()
            .iter()
            .sum::<f64>()
            / 4.0
    };
    let (cs, cl) = (per_gpu(Direction::Write), per_gpu(Direction::Read));
    assert!(within(cs, 25.40, 0.10), "concurrent store {cs}");
    assert!(within(cl, 20.60, 0.10), "concurrent load {cl}");
    assert!(cs > cl);
    let copy: f64 = f
        .transfer_gbps(Direction::Write, &all_pairs(4))
        .unwrap()
        .iter()
        .sum::<f64>()
        / 4.0;
    let share = Calibration::fitted().copy_served_share;
    assert!(within(copy, 56.32 * share, 0.02), "copy {copy}");
    assert!(copy > 1.2 * cs, "copy {copy} vs kernel {cs}");
}

/// The concurrency factor is a limit of the GPU that issues the loads or stores, so it weighs
/// on that GPU's port and not on an uplink the flows share (R3's island reduce-scatter came
/// out 1.9-2.0x too slow with it on every resource, 1.12-1.24x at the port). The four GPUs
/// of one switch each storing to their counterpart behind the other switch fill the uplink
/// as copy engines would, while each GPU's own port stays within C5's concurrent rate.
#[test]
fn c5_kernel_contention_weighs_on_the_issuing_port_not_the_uplink() {
    let f = SimFabric::new(get("pcie-8x-2switch").unwrap(), 1);
    let across: Vec<(usize, usize)> = (0..4).map(|a| (a, a + 4)).collect();
    for dir in [Direction::Write, Direction::Read] {
        let total: f64 = f.kernel_transfer_gbps(dir, &across).unwrap().iter().sum();
        assert!(
            within(total, 56.25, 0.03),
            "{dir:?}: {total} GB/s over the uplink"
        );
    }
    // All-to-all inside one switch and across: each GPU's port still binds at C5's rate.
    let all: Vec<(usize, usize)> = (0..8)
        .flat_map(|a| (0..8).filter(move |&b| b != a).map(move |b| (a, b)))
        .collect();
    let per_gpu: f64 = f
        .kernel_transfer_gbps(Direction::Write, &all)
        .unwrap()
        .iter()
        .sum::<f64>()
        / 8.0;
    assert!(per_gpu <= 25.40 * 1.01, "per GPU {per_gpu}");
}

/// C5 end to end: a PCIe-native one-shot beat NCCL at decode batches 1-32 on that box, so
/// at decode-sized messages (8-32 KB) one-stage beats NCCL's own choice on TP4. At 64 KB
/// the model has them within 5% of each other (a tie to the rule), not the published win.
#[test]
fn c5_one_stage_beats_nccl_at_decode_sizes_on_tp4() {
    let mut f = fabric_at("pcie-4x-1switch", &[0, 1, 2, 3], None);
    for bytes in [8 * KB, 16 * KB, 32 * KB] {
        let o = median(&mut f, Backend::OneStagePush, bytes, Mode::Graph);
        let n = median(&mut f, Backend::Nccl, bytes, Mode::Graph);
        assert!(o < n, "{bytes} B: one-stage {o} vs nccl {n}");
    }
}

// ---- C6: NCCL on PCIe-only boxes with its defaults ----------------------------------------

/// `base` with every GPU a GeForce-class Gen4 card: compute capability 8.9, Gen4 x16.
fn gen4(mut t: artune::topology::Topology) -> artune::topology::Topology {
    for g in &mut t.gpus {
        g.name = "NVIDIA GeForce RTX 4090".into();
        g.compute_capability = Some(artune::topology::ComputeCapability { major: 8, minor: 9 });
        g.pcie.gen = Some(4);
        g.pcie.max_gen = Some(4);
    }
    t
}

fn prepared(t: artune::topology::Topology, gpus: &[usize], level: Option<Level>) -> SimFabric {
    let mut f = SimFabric::new(t, 7).with_nccl_p2p_level(level);
    f.prepare(&group(gpus), &Backend::ALL).unwrap();
    f
}

/// C6 (NVIDIA/nccl#1530, #1439): 8 PCIe GPUs, 8-byte allreduce 42.1 µs (4090, no P2P) and
/// 54.2 µs (3090); "30-55 us on many boxes". nccl-tests runs eagerly. Checked on a box
/// without GPUDirect P2P (every hop through host memory); C1's box with NCCL's defaults
/// (two cross-switch hops through host memory, the other six peer to peer) lies between
/// that box and its own NCCL_P2P_LEVEL=SYS run, as its hops are a mix of the two.
#[test]
fn c6_nccl_8_byte_latency_on_8_pcie_gpus() {
    let mut t = gen4(get("pcie-8x-direct-2socket").unwrap());
    for p in &mut t.pairs {
        p.p2p.read = artune::topology::Status::No;
        p.p2p.write = artune::topology::Status::No;
    }
    let mut geforce = prepared(t, &ALL8, None);
    let no_p2p = median(&mut geforce, Backend::Nccl, 8, Mode::Eager);
    assert!((30.0..=55.0).contains(&no_p2p), "no P2P: 8 B {no_p2p} us");
    let mut c1 = fabric_at("pcie-8x-2switch", &ALL8, None);
    let defaults = median(&mut c1, Backend::Nccl, 8, Mode::Eager);
    // With NCCL_P2P_LEVEL=SYS the same box is C1's 17-24 µs class.
    let mut sys = fabric("pcie-8x-2switch", &ALL8);
    let p2p = median(&mut sys, Backend::Nccl, 8, Mode::Eager);
    assert!(p2p < 30.0, "SYS: 8 B {p2p} us");
    assert!(
        p2p < defaults && defaults < no_p2p,
        "{p2p} {defaults} {no_p2p}"
    );
}

/// C6 (NVIDIA/nccl#1603): 4 RTX 4090, P2P enabled, no switch: busbw 18 GB/s with NCCL's
/// default SHM transport, 22 with NCCL_P2P_LEVEL=SYS. Both run two channels here, each
/// bound by the per-channel PCIe rate, so the model puts them close together (SHM never
/// ahead): the published 18% gap is not reproduced, each figure is held to 25%.
#[test]
fn c6_shm_vs_p2p_busbw_on_four_gpus() {
    let mut t = gen4(get("pcie-8x-direct-2socket").unwrap());
    t.gpus.truncate(4);
    t.pairs.clear();
    t.normalize().unwrap();
    let quad = [0, 1, 2, 3];
    let bw = |level| {
        let mut f = prepared(t.clone(), &quad, level);
        busbw(
            256 * MB,
            median(&mut f, Backend::Nccl, 256 * MB, Mode::Eager),
            4,
        )
    };
    let (shm, p2p) = (bw(None), bw(Some(Level::Sys)));
    assert!(within(shm, 18.0, 0.25), "SHM busbw {shm}");
    assert!(within(p2p, 22.0, 0.25), "P2P busbw {p2p}");
    assert!(shm <= p2p, "SHM {shm} vs P2P {p2p}");
}

/// C6 (rtx6kpro nccl-tuning.md, dual AMD Turin, 8 RTX PRO 6000): NCCL's defaults vs a
/// hand-written graph at 32-256 KB: 48.2 -> 26.2, 48.7 -> 25.6, 51.6 -> 32.1, 56.5 -> 37.3 µs,
/// because AMD_BW makes its model pick Simple where LL wins. Here: NCCL's own choice on the
/// dual-socket preset, its defaults against its best pinned ring at P2P level SYS. The tuned
/// run also raised NCCL to 8 channels, which pinning algorithm and protocol does not do, so
/// its times are held to 1.5x only at 32 and 64 KB, where latency dominates.
#[test]
fn c6_amd_bw_makes_nccl_pick_the_slower_protocol() {
    // The source sets NCCL_P2P_LEVEL=SYS in every configuration it lists: its "defaults"
    // are NCCL's own graph search against a graph file, on the same P2P transport.
    let mut default = fabric("pcie-8x-direct-2socket", &ALL8);
    let mut tuned = fabric("pcie-8x-direct-2socket", &ALL8);
    let published = [
        (32 * KB, 48.2, 26.2),
        (64 * KB, 48.7, 25.6),
        (128 * KB, 51.6, 32.1),
        (256 * KB, 56.5, 37.3),
    ];
    for (bytes, slow, fast) in published {
        let d = median(&mut default, Backend::Nccl, bytes, Mode::Eager);
        let best = median(&mut tuned, Backend::NcclRingLl, bytes, Mode::Eager).min(median(
            &mut tuned,
            Backend::NcclRingSimple,
            bytes,
            Mode::Eager,
        ));
        assert_eq!(
            default.nccl_choice(bytes).map(|c| c.1),
            Some(artune::fabric::NcclProto::Simple),
            "{bytes} B"
        );
        let gain = if bytes <= 128 * KB { 1.3 } else { 1.1 };
        assert!(
            d > gain * best,
            "{bytes} B: defaults {d} vs best pinned {best}"
        );
        assert!(
            (d / slow).max(slow / d) <= 1.5,
            "{bytes} B defaults {d} vs {slow}"
        );
        if bytes <= 64 * KB {
            assert!(
                (best / fast).max(fast / best) <= 1.5,
                "{bytes} B tuned {best} vs {fast}"
            );
        }
    }
}

// ---- C7: P2P enabled vs disabled ----------------------------------------------------------

/// 6 GPUs on their own root ports of one AMD socket, whose root complexes forward peer
/// traffic at `peer_gbps` at most (NVIDIA/nccl#814: 9.6-10.5 GB/s with P2P on).
fn six_on_root_ports(peer_gbps: Option<f64>) -> artune::topology::Topology {
    let mut t = gen4(get("pcie-8x-direct-2socket").unwrap());
    t.gpus.truncate(6);
    for g in &mut t.gpus {
        g.parent = format!("rc{}", g.index);
    }
    t.root_complexes.truncate(6);
    for r in &mut t.root_complexes {
        r.socket = 0;
        r.contention = peer_gbps.map(|p| Contention {
            peak_gbps: Some(p),
            ..Default::default()
        });
    }
    t.sockets.truncate(1);
    t.pairs.clear();
    t.normalize().unwrap();
    t
}

/// C7: "enabling P2P halves bandwidth there [#814]. A tuner must measure, not assume that P2P
/// is faster" - and on other boxes P2P is faster (tinygrad#6: 41.4 vs 25.6-26.2 GB/s
/// bidirectional). Where the root complexes forward peer traffic at 10 GB/s, NCCL through
/// host memory (its default) beats NCCL forced to P2P, and one-stage kernels (which must use
/// P2P) lose to NCCL at large sizes; where they do not, P2P beats host memory.
#[test]
fn c7_p2p_is_faster_only_where_the_fabric_makes_it_so() {
    let six = [0, 1, 2, 3, 4, 5];
    let slow = six_on_root_ports(Some(10.0));
    let pair: f64 = SimFabric::new(slow.clone(), 1)
        .transfer_gbps(Direction::Write, &[(0, 1)])
        .unwrap()[0];
    assert!((9.6..=10.5).contains(&pair), "P2P pair {pair}");
    let big = 64 * MB;
    let nccl = |t: &artune::topology::Topology, level| {
        let mut f = prepared(t.clone(), &six, level);
        median(&mut f, Backend::Nccl, big, Mode::Eager)
    };
    let (shm, p2p) = (nccl(&slow, None), nccl(&slow, Some(Level::Sys)));
    assert!(
        p2p > 1.5 * shm,
        "slow root complexes: SHM {shm} vs P2P {p2p}"
    );
    let mut f = prepared(slow, &six, None);
    let one = median(&mut f, Backend::OneStagePush, big, Mode::Eager);
    assert!(one > shm, "one-stage {one} vs NCCL {shm}");
    let fast = six_on_root_ports(None);
    let (shm, p2p) = (nccl(&fast, None), nccl(&fast, Some(Level::Sys)));
    assert!(p2p < shm, "normal root complexes: SHM {shm} vs P2P {p2p}");
}

// ---- NVSwitch ---------------------------------------------------------------------------

/// The brief's NVLink check: one-stage beats NCCL ring at 4 KB by at least 2× (8 GPUs on
/// NVSwitch), against every ring protocol and NCCL's own choice.
#[test]
fn nvswitch_one_stage_wins_small() {
    let mut f = fabric("nvswitch-8x", &ALL8);
    let one = median(&mut f, Backend::OneStagePull, 4 * KB, Mode::Graph).min(median(
        &mut f,
        Backend::OneStagePush,
        4 * KB,
        Mode::Graph,
    ));
    for b in [
        Backend::Nccl,
        Backend::NcclRingLl,
        Backend::NcclRingLl128,
        Backend::NcclRingSimple,
    ] {
        let ring = median(&mut f, b, 4 * KB, Mode::Graph);
        assert!(ring >= 2.0 * one, "{b} {ring} vs one-stage {one}");
    }
}

/// A kernel's prologue is its GPU class's (src/fabric/sim/custom/fixed.rs): the same 8 GPUs
/// on NVSwitch as Hopper (H200 loopback: one-stage push's LL form at 4 KiB, 3.25 µs a call
/// in a graph, less the model's 1.5 µs graph launch and 0.3 µs flag poll: 1.45 µs) and as
/// Blackwell (C2's 1 KB one-shot: 1.0 µs); a class with no kernel timing takes Blackwell's.
#[test]
fn a_kernels_fixed_cost_is_its_gpu_classes() {
    let fixed = |cc: Option<artune::topology::ComputeCapability>| {
        let mut t = get("nvswitch-8x").unwrap();
        for g in &mut t.gpus {
            g.compute_capability = cc;
        }
        let mut f = SimFabric::new(t, 2024);
        f.prepare(&group(&ALL8), &Backend::ALL).unwrap();
        f.model_split(Backend::OneStagePush, 1024).unwrap().0
    };
    let cc = |major| Some(artune::topology::ComputeCapability { major, minor: 0 });
    let (hopper, blackwell, ada) = (fixed(cc(9)), fixed(cc(12)), fixed(cc(8)));
    assert!(
        (hopper - blackwell - 0.45).abs() < 1e-9,
        "{hopper} vs {blackwell}"
    );
    assert_eq!(ada, blackwell);
    assert_eq!(fixed(None), blackwell);
}

/// Fitted without C2, the Blackwell prologue is R1's (the same start-up one-shot on 4 GPUs
/// under a switch, 7.5 µs at 1 KB: 2.2 µs), not none: C2's one-shot is then predicted by a
/// prologue measured elsewhere (docs/MODEL-ERROR.md, "Left out").
#[test]
fn without_c2_the_kernel_prologue_is_r1s() {
    use artune::fabric::sim::calibration::{Calibration, Source};
    let fixed = |left_out: &[Source]| {
        let cal = Calibration::without(left_out);
        let mut f = SimFabric::new(get("pcie-8x-direct-2socket").unwrap(), 2024)
            .with_calibration(&cal)
            .with_nccl_p2p_level(Some(Level::Sys));
        f.prepare(&group(&ALL8), &Backend::ALL).unwrap();
        f.model_split(Backend::OneStagePull, KB).unwrap().0
    };
    let (c2, r1, none) = (
        fixed(&[]),
        fixed(&[Source::C2]),
        fixed(&[Source::C2, Source::R1]),
    );
    assert!((r1 - none - 2.2).abs() < 1e-9, "{r1} vs {none}");
    assert!((c2 - none - 1.0).abs() < 1e-9, "{c2} vs {none}");
}

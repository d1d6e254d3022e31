use super::*;
use crate::topology::presets;

fn build(t: &Topology, level: Option<Level>, gpus: &[usize]) -> (Model, StepSchedule) {
    let net = Net::build(t);
    let host = Host::new(t, level);
    let ring = ring_order(t, gpus);
    let m = Model::new(t, &net, &host, &ring);
    let s = StepSchedule::new(t, &net, &host, &ring, &m);
    (m, s)
}

fn model(preset: &str, gpus: &[usize]) -> (Model, StepSchedule) {
    build(&presets::get(preset).unwrap(), None, gpus)
}

const ALL8: [usize; 8] = [0, 1, 2, 3, 4, 5, 6, 7];

#[test]
fn pcie_gen5_gets_two_channels_and_no_ll128() {
    // Gen5 x16 modelled at 48 GB/s; SM100+ speeds pick 40, one channel, duplicated to two
    // of 20 (search.cc).
    let (m, _) = model("pcie-8x-2switch", &ALL8);
    assert_eq!(m.channels, 2);
    assert_eq!(m.bw_per_channel, 20.0);
    assert!(m.ll128_off.as_deref().unwrap().contains("PCIe"));
    assert_eq!(m.predict(NcclAlgo::Ring, NcclProto::LL128, 4096), None);
}

#[test]
fn nvswitch_keeps_ll128() {
    let (m, _) = model("nvswitch-8x", &ALL8);
    assert!(m.nvlink && m.ll128_off.is_none());
    assert!(m.channels >= 8);
}

#[test]
fn predicted_latency_follows_tuning_cc() {
    // Ring LL on 8 PCIe GPUs: 6.6 + 14 × 1.0 µs, plus 4096 B at busbw 40 · 0.5 × 8/14.
    let (m, _) = model("pcie-8x-2switch", &ALL8);
    let t = m.predict(NcclAlgo::Ring, NcclProto::LL, 4096).unwrap();
    let want = 20.6 + 4096.0 / (1e3 * 40.0 * 0.5 * 8.0 / 14.0);
    assert!((t - want).abs() < 1e-9, "{t} vs {want}");
    // Small messages: LL; large: Simple.
    assert_eq!(m.choose(4096), (NcclAlgo::Ring, NcclProto::LL));
    assert_eq!(m.choose(64 << 20), (NcclAlgo::Ring, NcclProto::Simple));
}

#[test]
fn p2p_level_decides_the_transport_per_hop() {
    // Two switches under one root complex: the cross-switch hops are PHB, beyond NCCL's
    // default PXB, so they go through host memory; NCCL_P2P_LEVEL=SYS makes them P2P.
    let t = presets::get("pcie-8x-2switch").unwrap();
    let (m, _) = build(&t, None, &ALL8);
    let shm = m
        .transports
        .iter()
        .filter(|&&x| x == Transport::Shm)
        .count();
    assert_eq!(shm, 2, "{:?}", m.transports);
    let (m, _) = build(&t, Some(Level::Sys), &ALL8);
    assert!(m.transports.iter().all(|&x| x == Transport::P2p));
    // Inside one switch everything is P2P by default.
    let (m, _) = build(&t, None, &[0, 1, 2, 3]);
    assert!(m.transports.iter().all(|&x| x == Transport::P2p));
    // NCCL_P2P_DISABLE=1 reads as LOC: nothing is P2P.
    let (m, _) = build(&t, Some(Level::Loc), &[0, 1]);
    assert!(m.transports.iter().all(|&x| x == Transport::Shm));
}

#[test]
fn amd_hosts_with_two_gpus_default_to_sys() {
    // NCCL counts the communicator's GPUs, not the machine's: a pair of an 8-GPU AMD box
    // gets SYS, its TP4 PXB.
    let t = presets::get("pcie-8x-direct-2socket").unwrap();
    let host = Host::new(&t, None);
    assert_eq!(host.cpu, Cpu::Amd);
    assert_eq!(host.p2p_level(2), Level::Sys);
    assert_eq!(host.p2p_level(4), Level::Pxb);
    assert_eq!(Host::new(&t, Some(Level::Pix)).p2p_level(2), Level::Pix);
    let intel = Host::new(&presets::get("nvswitch-8x").unwrap(), None);
    assert_eq!(intel.p2p_level(2), Level::Pxb);
}

#[test]
fn amd_bw_makes_the_ring_search_fall_back_and_pick_simple() {
    // C6: across AMD sockets NCCL models 16 GB/s (AMD_BW); SM120's speeds stop at 18, so
    // the search falls back to 0.1 GB/s and the model prefers Simple where LL is faster.
    let (m, s) = model("pcie-8x-direct-2socket", &ALL8);
    assert!(m.fallback && m.channels == 1, "{m:?}");
    assert_eq!(m.choose(32 << 10).1, NcclProto::Simple);
    assert!(
        s.time(NcclAlgo::Ring, NcclProto::LL, 32 << 10)
            < s.time(NcclAlgo::Ring, NcclProto::Simple, 32 << 10)
    );
    // Within one socket the search succeeds.
    let (m, _) = model("pcie-8x-direct-2socket", &[0, 1, 2, 3]);
    assert!(!m.fallback);
}

#[test]
fn level_parses_names_and_old_numbers() {
    assert_eq!(Level::parse("SYS"), Some(Level::Sys));
    assert_eq!(Level::parse("2"), Some(Level::Pxb));
    assert_eq!(Level::parse("9"), Some(Level::Sys));
    assert_eq!(Level::parse("bogus"), None);
}

#[test]
fn shm_hops_cost_a_host_round_trip() {
    let t = presets::get("pcie-8x-2switch").unwrap();
    let (_, shm) = build(&t, None, &ALL8);
    let (_, p2p) = build(&t, Some(Level::Sys), &ALL8);
    let slowest = |s: &StepSchedule| {
        s.ring_hops
            .iter()
            .map(|h| h.land + h.poll)
            .fold(0.0, f64::max)
    };
    assert!(slowest(&shm) > slowest(&p2p) + 0.5, "{shm:?} {p2p:?}");
}

#[test]
fn ll_through_host_memory_moves_one_line_per_thread_per_round_trip() {
    // Two switches under one root complex: the two cross-switch hops go through host memory,
    // where each of LL's 512 receiving threads has one 16-byte line in flight per load round
    // trip, slower than a channel's rate between peers.
    let t = presets::get("pcie-8x-2switch").unwrap();
    let (_, shm) = build(&t, None, &ALL8);
    let (_, p2p) = build(&t, Some(Level::Sys), &ALL8);
    let round_trip = shm.ring_hops.iter().map(|h| h.fetch).fold(0.0, f64::max);
    let polled = 512.0 * 16.0 / (round_trip * 1e3);
    let channel = crate::fabric::sim::calibration::Calibration::fitted().nccl_channel_gbps;
    assert!(polled < 0.8 * channel, "{polled} GB/s");
    let (small, big) = (2u64 << 20, 4u64 << 20);
    let slope = |s: &StepSchedule| {
        s.time(NcclAlgo::Ring, NcclProto::LL, big) - s.time(NcclAlgo::Ring, NcclProto::LL, small)
    };
    let nc = shm.op_channels(NcclAlgo::Ring, NcclProto::LL, small);
    // 14 steps, each 1/8 of the added bytes at twice their size on the wire (LL's flags).
    let want = 14.0 * 2.0 * (big - small) as f64 / 8.0 / (nc * polled * 1e3);
    assert!(
        (slope(&shm) - want).abs() < 1e-6 * want,
        "{} vs {want}",
        slope(&shm)
    );
    assert!(slope(&p2p) < 0.8 * want, "between peers: {}", slope(&p2p));
}

#[test]
fn ll_grows_with_size_at_line_rate_at_16_gpus() {
    // 16 GPUs under four switches: tree LL forwards line by line, so it grows with size
    // at a rate of the order of ring LL's (each GPU port sends the whole message to two
    // chain neighbours, a ring port 2(N−1)/N of it to one, through more distinct kernel
    // flows), not 2(N−1) = 30 times faster as chunk store-and-forward would.
    let mut t = presets::get("pcie-8x-2switch").unwrap();
    t.pairs.clear();
    let sw = t.switches[0].clone();
    t.switches = (0..4)
        .map(|i| crate::topology::Switch {
            id: format!("sw{i}"),
            ..sw.clone()
        })
        .collect();
    let g = t.gpus[0].clone();
    t.gpus = (0..16)
        .map(|i| crate::topology::Gpu {
            index: i,
            parent: format!("sw{}", i / 4),
            ..g.clone()
        })
        .collect();
    t.normalize().unwrap();
    let all: Vec<usize> = (0..16).collect();
    let (_, s) = build(&t, None, &all);
    // Both ends carry more data than latency, so the difference is the growth rate.
    let slope = |a| s.time(a, NcclProto::LL, 4 << 20) - s.time(a, NcclProto::LL, 1 << 20);
    assert!(
        slope(NcclAlgo::Tree) <= 3.0 * slope(NcclAlgo::Ring),
        "tree {} ring {}",
        slope(NcclAlgo::Tree),
        slope(NcclAlgo::Ring)
    );
}

#[test]
fn ring_order_keeps_switches_contiguous() {
    let t = presets::get("pcie-8x-2switch").unwrap();
    assert_eq!(ring_order(&t, &[4, 0, 5, 1]), vec![0, 1, 4, 5]);
}

#[test]
fn ring_is_faster_than_chain_for_large_messages() {
    let (_, s) = model("pcie-4x-1switch", &[0, 1, 2, 3]);
    let big = 64 << 20;
    assert!(
        s.time(NcclAlgo::Ring, NcclProto::Simple, big)
            < s.time(NcclAlgo::Tree, NcclProto::Simple, big)
    );
    // LL moves twice the bytes of Simple's payload.
    assert!(
        s.time(NcclAlgo::Ring, NcclProto::LL, big) > s.time(NcclAlgo::Ring, NcclProto::Simple, big)
    );
}

#[test]
fn a_protocol_on_the_same_channels_takes_longer_for_more_bytes() {
    // Physics is monotone where nothing but the bytes changes: one algorithm and protocol on
    // the same number of channels. (NCCL itself adds channels with the bytes, and switches
    // protocol where its own model says, and a larger message can finish sooner across either
    // step, as published: C2's NCCL takes 31.7 µs at 72 KB and 23.3 at 80 KB.)
    for preset in [
        "pcie-2x",
        "pcie-4x-1switch",
        "pcie-8x-2switch",
        "pcie-8x-direct-2socket",
    ] {
        let t = presets::get(preset).unwrap();
        for gpus in [vec![0, 1], vec![0, 1, 2, 3], ALL8.to_vec()] {
            if gpus.len() > t.gpus.len() {
                continue;
            }
            let (m, s) = build(&t, None, &gpus);
            for algo in [NcclAlgo::Ring, NcclAlgo::Tree] {
                for proto in [NcclProto::LL, NcclProto::Simple] {
                    if m.predict(algo, proto, 1024).is_none() {
                        continue;
                    }
                    let mut prev: Option<(f64, f64)> = None;
                    let mut b = 1024u64;
                    while b <= 64 << 20 {
                        let nc = s.op_channels(algo, proto, b);
                        let time = s.time(algo, proto, b);
                        if let Some((pc, pt)) = prev {
                            assert!(
                                pc != nc || time >= pt,
                                "{preset} {gpus:?} {algo:?}/{proto:?} at {b}: {time} < {pt}"
                            );
                        }
                        prev = Some((nc, time));
                        b += b / 8;
                    }
                }
            }
        }
    }
}

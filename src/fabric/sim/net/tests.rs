use super::*;
use crate::fabric::sim::calibration::Calibration;
use crate::topology::{presets, Contention, Topology};

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * b.abs()
}

fn run(net: &Net, pairs: &[(usize, usize)], dir: Direction) -> Vec<f64> {
    let flows: Vec<Flow> = pairs
        .iter()
        .map(|&(src, dst)| Flow::copy(src, dst, dir))
        .collect();
    let routes: Vec<Route> = pairs.iter().map(|&(a, b)| net.route(a, b)).collect();
    let refs: Vec<&Route> = routes.iter().collect();
    net.rates(&flows, &refs)
}

#[test]
fn curve_matches_its_formula() {
    // peak 300, knee 8, slope 0.03, 44 flows: 300 / (1 + 0.03 · 36) = 144.23.
    let c = Curve::from(&Contention {
        peak_gbps: Some(300.0),
        knee_flows: Some(8),
        slope: Some(0.03),
        ..Default::default()
    });
    assert!(close(c.capacity(44), 144.23, 1e-3));
    assert_eq!(c.capacity(8), 300.0);
}

#[test]
fn the_default_forwarding_is_c1s_curve_scaled_by_ports() {
    // C1's switch: four GPUs and the uplink, Gen5 x16 each: exactly the stated curve.
    let c1 = Curve::forwarding_default(&[56.32; 5]);
    assert_eq!(c1, Curve::from(&FORWARDING_DEFAULT));
    // Twice the ports: twice the crossbar, and contention by flows per port.
    let ten = Curve::forwarding_default(&[56.32; 10]);
    assert!(close(ten.capacity(88), 2.0 * c1.capacity(44), 1e-9));
    assert!(close(ten.knee, 16.0, 1e-12));
    // A curve the file states is kept; one it leaves out is assumed.
    let stated = Contention {
        peak_gbps: Some(100.0),
        ..Default::default()
    };
    assert_eq!(Curve::resolve(Some(&stated), &[56.32; 5]).0.peak, 100.0);
    assert!(Curve::resolve(None, &[56.32; 5]).1);
    // The band's extrapolation starts past C1's 44 flows per five ports.
    assert_eq!(c1.extrapolated(44), 0.0);
    assert!(c1.extrapolated(56) > 0.0 && ten.extrapolated(88) == 0.0);
}

#[test]
fn cross_switch_route_and_latency() {
    let t = presets::get("pcie-8x-2switch").unwrap();
    let net = Net::build(&t);
    let r = net.route(0, 4);
    // GPU port, sw0 node, sw0 uplink up, rc0, sw1 uplink down, sw1 node, GPU port.
    assert_eq!(r.resources.len(), 7);
    // 0.33 + 0.2 + 0.2 + 0.33 (C1: about 1.07 µs across switches).
    assert!(close(r.latency_us, 1.06, 1e-9));
    assert!(close(net.route(0, 1).latency_us, 0.66, 1e-9));
}

#[test]
fn one_pair_runs_at_link_rate_and_uplink_is_shared() {
    let t = presets::get("pcie-8x-2switch").unwrap();
    let net = Net::build(&t);
    // Gen5 x16 = 16 · 3.52 = 56.32 GB/s (C1: 56.2–56.3).
    let one = run(&net, &[(0, 4)], Direction::Write);
    assert!(close(one[0], 56.32, 1e-9));
    // Two pairs across one uplink share it (C1: 56.4 GB/s in total).
    let two = run(&net, &[(0, 4), (1, 5)], Direction::Write);
    assert!(close(two[0] + two[1], 56.32, 1e-9));
}

#[test]
fn cross_socket_flow_is_capped() {
    let t = presets::get("pcie-8x-direct-2socket").unwrap();
    let net = Net::build(&t);
    let r = run(&net, &[(0, 4)], Direction::Read);
    let cap = t.sockets[0]
        .interconnect
        .as_ref()
        .unwrap()
        .max_flow_gbps
        .unwrap();
    assert!(close(r[0], cap, 1e-9));
}

#[test]
fn finish_times_reshare_after_a_flow_ends() {
    // Two flows into GPU 1's port (56.32 shared): the 1 MB one ends first at half rate,
    // then the 2 MB one has the port alone.
    let t = presets::get("pcie-4x-1switch").unwrap();
    let net = Net::build(&t);
    let flows = [
        Flow::copy(0, 1, Direction::Write),
        Flow::copy(2, 1, Direction::Write),
    ];
    let routes = [net.route(0, 1), net.route(2, 1)];
    let refs: Vec<&Route> = routes.iter().collect();
    let done = net.finish_times(&flows, &refs, &[1e6, 2e6]);
    let half = 56.32e3 / 2.0;
    assert!(close(done[0], 1e6 / half, 1e-9));
    assert!(close(done[1], 1e6 / half + 1e6 / 56.32e3, 1e-9));
}

#[test]
fn zero_capacity_in_a_file_slows_instead_of_stalling() {
    let mut t = presets::get("pcie-2x").unwrap();
    t.switches[0].contention.as_mut().unwrap().peak_gbps = Some(0.0);
    let net = Net::build(&t);
    let flows = [Flow::copy(0, 1, Direction::Write)];
    let routes = [net.route(0, 1)];
    let refs: Vec<&Route> = routes.iter().collect();
    let done = net.finish_times(&flows, &refs, &[1e6]);
    assert!(done[0].is_finite() && done[0] > 1e5, "{done:?}");
}

/// A Broadcom switch under rc0 whose GPUs write to peers behind rc1 and rc2.
fn broadcom() -> Topology {
    let mut t = presets::get("pcie-8x-2switch").unwrap();
    t.pairs.clear();
    t.root_complexes.push(crate::topology::RootComplex {
        id: "rc1".into(),
        socket: 0,
        contention: None,
    });
    t.root_complexes.push(crate::topology::RootComplex {
        id: "rc2".into(),
        socket: 0,
        contention: None,
    });
    t.switches[0].vendor = Some("Broadcom".into());
    t.switches[0].contention = Some(Contention {
        write_collapse_gbps: Some(2.7),
        ..Default::default()
    });
    t.switches[1].parent = "rc1".into();
    t.gpus[7].parent = "rc2".into();
    t.normalize().unwrap();
    t
}

#[test]
fn bytes_leaving_a_switch_towards_two_root_complexes_collapse_whoever_drives_them() {
    let net = Net::build(&broadcom());
    // One destination root complex: full rate.
    let one = run(&net, &[(0, 4)], Direction::Write);
    assert!(close(one[0], 56.32, 1e-9));
    // GPUs 0 and 1 send out of sw0 towards rc1 and rc2 at once: pushed (posted writes) or
    // pulled by the peers (the completions carry the data out of the same uplink), the
    // bytes collapse to 2.7 GB/s together (C3).
    for dir in [Direction::Write, Direction::Read] {
        let r = run(&net, &[(0, 4), (1, 7)], dir);
        assert!(close(r[0] + r[1], 2.7, 1e-9), "{dir:?} {r:?}");
    }
    // GPUs 0 and 1 pulling from behind rc1 and rc2 (C3's read test): the data leaves each
    // place from one GPU, so nothing collapses.
    let r = run(&net, &[(4, 0), (7, 1)], Direction::Read);
    assert!(r[0] + r[1] > 40.0, "{r:?}");
}

#[test]
fn a_stated_collapse_on_another_make_takes_posted_writes_only() {
    // b12x#139: behind four Microchip switches writes fell to 2.6 GB/s while pulls from
    // three other islands at once ran at full rate.
    let mut t = broadcom();
    t.switches[0].vendor = Some("Microchip".into());
    let net = Net::build(&t);
    let w = run(&net, &[(0, 4), (1, 7)], Direction::Write);
    assert!(close(w[0] + w[1], 2.7, 1e-9), "{w:?}");
    let r = run(&net, &[(0, 4), (1, 7)], Direction::Read);
    assert!(r[0] + r[1] > 40.0, "{r:?}");
}

#[test]
fn one_gpu_writing_to_two_root_complexes_does_not_collapse() {
    let net = Net::build(&broadcom());
    // GPU 0 alone towards rc1 and rc2: the uplink's rate, shared.
    let w = run(&net, &[(0, 4), (0, 7)], Direction::Write);
    assert!(close(w[0] + w[1], 56.32, 1e-9), "{w:?}");
    // Two GPUs towards one root complex: no collapse either.
    let w = run(&net, &[(0, 4), (1, 5)], Direction::Write);
    assert!(close(w[0] + w[1], 56.32, 1e-9), "{w:?}");
}

/// Kernel stores of every GPU of the switch to every peer behind rc1 and rc2.
fn kernel_rates(net: &Net, pairs: &[(usize, usize)], engine: Engine) -> f64 {
    let flows: Vec<Flow> = pairs
        .iter()
        .map(|&(src, dst)| Flow {
            src,
            dst,
            dir: Direction::Write,
            engine,
        })
        .collect();
    let routes: Vec<Route> = pairs.iter().map(|&(a, b)| net.route(a, b)).collect();
    let refs: Vec<&Route> = routes.iter().collect();
    net.rates(&flows, &refs).iter().sum()
}

#[test]
fn kernel_all_to_all_collapses_at_least_as_badly_as_two_copies() {
    let net = Net::build(&broadcom());
    let two = kernel_rates(&net, &[(0, 4), (1, 7)], Engine::Copy);
    let all: Vec<(usize, usize)> = (0..4).flat_map(|a| [4, 5, 6, 7].map(|b| (a, b))).collect();
    let kernel = kernel_rates(&net, &all, Engine::Kernel);
    assert!(kernel <= two * (1.0 + 1e-9), "{kernel} vs {two}");
}

#[test]
fn broadcom_pex890_collapses_by_default_and_says_so() {
    let mut t = broadcom();
    t.switches[0].contention = None;
    t.switches[0].device = Some("PEX89144".into());
    let net = Net::build(&t);
    let w = run(&net, &[(0, 4), (1, 7)], Direction::Write);
    assert!(close(w[0] + w[1], 2.7, 1e-9), "{w:?}");
    assert!(
        net.assumed()
            .iter()
            .any(|a| a.contains("sw0") && a.contains("2.7")),
        "{:?}",
        net.assumed()
    );
}

#[test]
fn kernel_streams_are_capped_and_degrade_under_all_to_all() {
    let t = presets::get("pcie-4x-1switch").unwrap();
    let net = Net::build(&t);
    // One kernel store stream: C5's 44.78 GB/s, a transaction limit (not a share of the port).
    let one = kernel_rates(&net, &[(0, 1)], Engine::Kernel);
    assert!(close(one, 44.78, 1e-9), "{one}");
    // All 12 directed pairs: C5's 25.4 GB/s per GPU.
    let all: Vec<(usize, usize)> = (0..4)
        .flat_map(|a| (0..4).filter(move |&b| b != a).map(move |b| (a, b)))
        .collect();
    let per_gpu = kernel_rates(&net, &all, Engine::Kernel) / 4.0;
    assert!(close(per_gpu, 25.40, 1e-9), "{per_gpu}");
    // Copy engines on the same pattern: each GPU's memory takes three peers' writes, served
    // at the fitted share of its port (p2pmark's four-GPU scores), not the kernel factor.
    let copy = kernel_rates(&net, &all, Engine::Copy) / 4.0;
    let share = Calibration::fitted().copy_served_share;
    assert!(close(copy, 56.32 * share, 1e-9), "{copy}");
}

#[test]
fn a_gpu_serving_three_peers_copies_moves_the_served_share_and_one_the_link() {
    let net = Net::build(&presets::get("pcie-4x-1switch").unwrap());
    let share = Calibration::fitted().copy_served_share;
    let reads = |pairs: &[(usize, usize)]| -> f64 {
        let flows: Vec<Flow> = pairs
            .iter()
            .map(|&(src, dst)| Flow::copy(src, dst, Direction::Read))
            .collect();
        let routes: Vec<Route> = pairs.iter().map(|&(a, b)| net.route(a, b)).collect();
        let refs: Vec<&Route> = routes.iter().collect();
        net.rates(&flows, &refs).iter().sum()
    };
    // p2pmark's single reader: GPU 0 reads its three peers, each serving one reader: the link.
    let single = reads(&[(1, 0), (2, 0), (3, 0)]);
    assert!(close(single, 56.32, 1e-9), "{single}");
    // Three readers of GPU 0's memory: its port serves them at the share.
    let served = reads(&[(0, 1), (0, 2), (0, 3)]);
    assert!(close(served, 56.32 * share, 1e-9), "{served}");
    // Two readers: unpublished, taken as one each.
    let two = reads(&[(0, 1), (0, 2)]);
    assert!(close(two, 56.32, 1e-9), "{two}");
    // Kernel loads of the same pattern are priced by the kernel factor alone.
    let net_k = |engine| {
        let flows: Vec<Flow> = [(0, 1), (0, 2), (0, 3)]
            .iter()
            .map(|&(src, dst)| Flow {
                src,
                dst,
                dir: Direction::Read,
                engine,
            })
            .collect();
        let routes: Vec<Route> = [(0, 1), (0, 2), (0, 3)]
            .iter()
            .map(|&(a, b)| net.route(a, b))
            .collect();
        let refs: Vec<&Route> = routes.iter().collect();
        net.rates(&flows, &refs).iter().sum::<f64>()
    };
    assert!(
        net_k(Engine::Kernel) > served,
        "{} vs {served}",
        net_k(Engine::Kernel)
    );
}

#[test]
fn host_route_skips_peer_forwarding() {
    let t = presets::get("pcie-8x-2switch").unwrap();
    let net = Net::build(&t);
    let up = net.host_route(0, 0, true);
    // GPU port, sw0 node, sw0 uplink, host memory.
    assert_eq!(up.resources.len(), 4);
    assert!(close(up.latency_us, 0.33 + 0.2 + HOST_MEM_US, 1e-9));
    let down = net.host_route(4, 0, false);
    assert_eq!(down.resources.last(), Some(&net.gpu_down[4]));
}

#[test]
fn a_node_counts_flows_between_the_same_two_gpus_once() {
    // NCCL's channels between two GPUs are one stream to a switch: 200 of them across the
    // switches share what one flow gets, where 200 distinct pairs would shrink the switch
    // far past its knee.
    let net = Net::build(&presets::get("pcie-8x-2switch").unwrap());
    let one = run(&net, &[(0, 4)], Direction::Write)[0];
    let many: f64 = run(&net, &[(0, 4); 200], Direction::Write).iter().sum();
    assert!(close(many, one, 1e-9), "{many} vs {one}");
}

#[test]
fn only_routes_through_a_switch_above_switches_take_the_tree_part() {
    let flat = presets::get("pcie-8x-2switch").unwrap();
    let mut tree = flat.clone();
    tree.switches[1].parent = "sw0".into();
    tree.normalize().unwrap();
    let tree_part = |t: &Topology, gpus: &[usize]| {
        Net::build(t)
            .parts(gpus)
            .contains_key(&BandPart::SwitchTree)
    };
    assert!(!tree_part(&flat, &[0, 1, 4, 5]));
    // GPUs 4-7 sit under sw1, now below sw0: their flows to 0-3 are forwarded by sw0.
    assert!(tree_part(&tree, &[0, 1, 4, 5]));
    // Within sw1 nothing climbs to sw0; within sw0 nothing comes from a switch below it.
    assert!(!tree_part(&tree, &[4, 5, 6, 7]));
    assert!(!tree_part(&tree, &[0, 1, 2, 3]));
}

#[test]
fn only_groups_where_a_gpu_has_three_peers_take_the_served_part() {
    let net = Net::build(&presets::get("pcie-8x-2switch").unwrap());
    let served = |gpus: &[usize]| net.parts(gpus).contains_key(&BandPart::CopyServed);
    assert!(!served(&[0, 1]));
    assert!(!served(&[0, 1, 4]));
    assert!(served(&[0, 1, 4, 5]));
    // One GPU reading three peers: its peers serve one each, but the pattern's GPU has three.
    assert!(net
        .parts_of(&[(1, 0), (2, 0), (3, 0)])
        .contains_key(&BandPart::CopyServed));
    assert!(!net
        .parts_of(&[(1, 0), (2, 0)])
        .contains_key(&BandPart::CopyServed));
}

//! Shapes of published measurements (shared/calibration) that the model's mechanisms, not its
//! constants, must reproduce: how a kernel's peer traffic relates to the link's generation.

use artune::fabric::sim::SimFabric;
use artune::fabric::Direction;
use artune::topology::presets::get;
use artune::topology::{ComputeCapability, Status, Topology};

/// `n` GeForce-class Gen4 GPUs on CPU root ports (C6's 4090 boxes), P2P as `p2p` says.
fn geforce(n: usize, p2p: bool) -> Topology {
    let mut t = get("pcie-8x-direct-2socket").unwrap();
    t.gpus.truncate(n);
    for g in &mut t.gpus {
        g.name = "NVIDIA GeForce RTX 4090".into();
        g.compute_capability = Some(ComputeCapability { major: 8, minor: 9 });
        g.pcie.gen = Some(4);
        g.pcie.max_gen = Some(4);
    }
    t.pairs.clear();
    t.normalize().unwrap();
    if !p2p {
        for p in &mut t.pairs {
            p.p2p.read = Status::No;
            p.p2p.write = Status::No;
        }
    }
    t
}

/// C9 (tinygrad/open-gpu-kernel-modules#26): NCCL's all_reduce between two Gen4 4090s moves
/// 25 GB/s on AMD hosts, 95% of C9's Gen4 copy-engine single hop (26.26), and C6
/// (tinygrad#36) 26.0 on four; on Gen5 a lone kernel store stream reaches 44.78 of 56.25
/// (C5: 80%). A kernel's limit is its outstanding stores over a round trip, so many GB/s,
/// not a share of the lane rate: a Gen4 link is filled, a Gen5 one is not.
#[test]
fn c5_c9_a_kernel_stream_fills_a_gen4_link_but_not_a_gen5_one() {
    let share = |t: Topology| {
        let f = SimFabric::new(t, 1);
        let kernel: f64 = f.kernel_transfer_gbps(Direction::Write, &[(0, 1)]).unwrap()[0];
        let copy: f64 = f.transfer_gbps(Direction::Write, &[(0, 1)]).unwrap()[0];
        kernel / copy
    };
    let gen4 = share(geforce(2, true));
    let gen5 = share(get("pcie-4x-1switch").unwrap());
    assert!(gen4 >= 25.0 / 26.26, "Gen4 kernel/copy {gen4}");
    assert!(
        (gen5 - 44.78 / 56.32).abs() < 0.01,
        "Gen5 kernel/copy {gen5}"
    );
}

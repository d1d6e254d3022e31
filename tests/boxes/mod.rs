//! Topologies of published boxes that more than one simulator test measures against.

use artune::topology::presets::get;
use artune::topology::Topology;

/// R2's box (rtx6kpro hardware/asus-esc8000a-e13p-broadcom-switches.md): two AMD sockets,
/// four Broadcom PEX890xx partitions of two GPUs, each on its own root port, two per socket.
/// No collapse rate is stated, so the PEX890xx default (C3's 2.7 GB/s) applies; the
/// partitions' pairing into two chips, which sysfs does not show, is left out.
pub fn asus() -> Topology {
    let mut t = get("pcie-8x-2switch").unwrap();
    t.pairs.clear();
    let (sw, rc, g, so) = (
        t.switches[0].clone(),
        t.root_complexes[0].clone(),
        t.gpus[0].clone(),
        t.sockets[0].clone(),
    );
    t.sockets = (0..2)
        .map(|i| artune::topology::Socket {
            id: i,
            ..so.clone()
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
            vendor: Some("Broadcom".into()),
            device: Some("PEX89144".into()),
            contention: None,
            ..sw.clone()
        })
        .collect();
    t.gpus = (0..8)
        .map(|i| artune::topology::Gpu {
            index: i,
            parent: format!("sw{}", i / 2),
            numa_node: Some((i / 4) as u32),
            ..g.clone()
        })
        .collect();
    t.normalize().unwrap();
    t
}

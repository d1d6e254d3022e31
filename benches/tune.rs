//! A full simulated tune: 8 GPUs, TP 2/4/8 (every placement class), both modes,
//! 1 KiB..256 MiB. Target: under 2 s on a 2-core machine.

use criterion::{criterion_group, criterion_main, Criterion};

use artune::fabric::sim::SimFabric;
use artune::topology::presets;
use artune::tune::{self, Options};

fn full_tune(c: &mut Criterion) {
    let mut g = c.benchmark_group("tune");
    g.sample_size(10);
    for preset in ["pcie-8x-2switch", "nvswitch-8x"] {
        let topo = presets::get(preset).expect("preset");
        g.bench_function(format!("full/{preset}"), |b| {
            b.iter(|| {
                let mut fabric = SimFabric::new(topo.clone(), 1);
                tune::run(&mut fabric, &Options::default(), &mut |_| {}).expect("tune")
            })
        });
    }
    g.finish();
}

criterion_group!(benches, full_tune);
criterion_main!(benches);

//! A full simulated tune: 8 GPUs, TP 2/4/8 (every placement class), both modes,
//! 1 KiB..256 MiB. Target: under 2 s on a 2-core machine. Beside it, the same tune with close
//! calls sampled to the cap and revisits of 10 samples (`cap/`): what the stopping rule saves.

use criterion::{criterion_group, criterion_main, Criterion};

use artune::fabric::sim::SimFabric;
use artune::measure::Harness;
use artune::topology::presets;
use artune::tune::{self, Options};

fn full_tune(c: &mut Criterion) {
    let mut g = c.benchmark_group("tune");
    g.sample_size(10);
    let capped = Harness {
        settle_ci: None,
        revisit_samples: Harness::default().revisit_samples,
        ..tune::fast_harness()
    };
    for preset in ["pcie-8x-2switch", "nvswitch-8x"] {
        let topo = presets::get(preset).expect("preset");
        for (name, harness) in [("full", tune::fast_harness()), ("cap", capped)] {
            let opts = Options {
                harness,
                ..Options::default()
            };
            g.bench_function(format!("{name}/{preset}"), |b| {
                b.iter(|| {
                    let mut fabric = SimFabric::new(topo.clone(), 1);
                    tune::run(&mut fabric, &opts, &mut |_| {}).expect("tune")
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, full_tune);
criterion_main!(benches);

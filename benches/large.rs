//! A simulated tune of a large topology file (`tune --topology FILE`): switches of 8 GPUs,
//! four per root complex, root complexes on two sockets alternately, at 64, 128 and 256 GPUs
//! (benches/topologies/). Target: 256 GPUs within 10 s on a 2-core machine, the cost growing
//! no faster than n log n in GPUs.

use criterion::{criterion_group, criterion_main, Criterion};

use artune::fabric::sim::SimFabric;
use artune::topology::file;
use artune::tune::{self, Options};

fn large_tune(c: &mut Criterion) {
    let mut g = c.benchmark_group("large");
    g.sample_size(10);
    for n in [64, 128, 256] {
        let path = format!(
            "{}/benches/topologies/large-{n}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let topo = file::load(std::path::Path::new(&path)).expect("topology file");
        g.bench_function(format!("tune/{n}"), |b| {
            b.iter(|| {
                let mut fabric = SimFabric::new(topo.clone(), 1);
                tune::run(&mut fabric, &Options::default(), &mut |_| {}).expect("tune")
            })
        });
    }
    g.finish();
}

criterion_group!(benches, large_tune);
criterion_main!(benches);

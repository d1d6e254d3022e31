//! The island schedules against the best flat kernel and the best NCCL variant, per size, on
//! every simulated machine with islands: a table (markdown) of simulated medians, not a timing
//! of artune. `cargo bench --bench islands` prints it; docs/MODEL.md quotes it with the command.
//! SIMULATED: a model of each machine, with the model's error band per group.

use artune::fabric::sim::SimFabric;
use artune::topology::{file, presets};
use artune::tune::{self, Options};
use artune::{Backend, Mode};

fn main() {
    // Criterion's harness flags (`--bench`) mean nothing here.
    let machines: Vec<(String, artune::topology::Topology)> =
        ["pcie-8x-2switch", "pcie-8x-direct-2socket"]
            .iter()
            .map(|p| (p.to_string(), presets::get(p).expect("preset")))
            .chain(std::iter::once({
                let path = concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/docs/topologies/16x-four-switches.json"
                );
                (
                    "docs/topologies/16x-four-switches.json".to_string(),
                    file::load(std::path::Path::new(path)).expect("topology file"),
                )
            }))
            .collect();
    println!("SIMULATED (a model of each machine, not a measurement); graph mode, bf16, all GPUs in one group\n");
    for (name, topo) in machines {
        let n = topo.gpu_count();
        let opts = Options {
            tp: vec![n],
            modes: vec![Mode::Graph],
            min_bytes: 1 << 10,
            max_bytes: 64 << 20,
            ..Default::default()
        };
        let mut fabric = SimFabric::new(topo, 1);
        let p = tune::run(&mut fabric, &opts, &mut |_| {}).expect("tune");
        let g = &p.groups[0];
        let islands = g.islands.as_ref().map_or("none".into(), |i| i.describe());
        println!("### {name}: TP{n}, islands {islands}\n");
        println!("| size | island_two_shot µs | island_one_shot µs | best flat kernel µs | best NCCL µs | island vs best other | choice |");
        println!("|---|---|---|---|---|---|---|");
        for b in &g.buckets {
            if !b.bytes.is_power_of_two() || b.bytes.trailing_zeros() % 2 != 0 {
                continue;
            }
            let t = |k: Backend| b.results.get(&k).map(|t| t.median_us);
            let best = |keep: &dyn Fn(Backend) -> bool| {
                b.results
                    .iter()
                    .filter(|(k, _)| keep(**k))
                    .min_by(|x, y| x.1.median_us.total_cmp(&y.1.median_us))
                    .map(|(k, t)| (*k, t.median_us))
            };
            let flat = best(&|k| k.is_custom() && !k.is_hierarchical());
            let nccl = best(&|k| k.is_nccl());
            let island = [t(Backend::IslandTwoShot), t(Backend::IslandOneShot)]
                .into_iter()
                .flatten()
                .fold(f64::INFINITY, f64::min);
            let other = [flat, nccl]
                .into_iter()
                .flatten()
                .map(|x| x.1)
                .fold(f64::INFINITY, f64::min);
            let cell = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.1}"));
            let named =
                |x: Option<(Backend, f64)>| x.map_or("-".into(), |(k, v)| format!("{v:.1} ({k})"));
            println!(
                "| {} | {} | {} | {} | {} | {:.2}x | {} |",
                artune::units::fmt_bytes(b.bytes),
                cell(t(Backend::IslandTwoShot)),
                cell(t(Backend::IslandOneShot)),
                named(flat),
                named(nccl),
                other / island,
                b.choice
            );
        }
        let m = g
            .buckets
            .iter()
            .find_map(|b| b.results.get(&Backend::IslandTwoShot).and_then(|t| t.model));
        if let Some(m) = m {
            println!(
                "\nmodel error of the island schedules' times here: x{:.2}-x{:.2}\n",
                m.low, m.high
            );
        }
    }
}

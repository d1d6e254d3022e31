//! No band flaps, through the binary, on every simulated preset and every topology file in
//! docs/topologies/: a band between two others must gain at least the rule's margin
//! (`MIN_EFFECT`, on the medians at its best size) over one of its neighbours' backends, in
//! the profile's choices and in the NCCL variants the plugin follows.

mod common;

use std::path::PathBuf;

use artune::allreduce::Backend;
use artune::decide::MIN_EFFECT;
use artune::profile::{Bucket, Profile};
use common::{artune, text, tuned};

/// What a consumer follows in a bucket: the profile's choice or the plugin's NCCL variant.
type Pick = fn(&Bucket) -> Option<Backend>;

/// The bands of `pick` over `buckets`: (backend, first bucket, length).
fn bands(
    buckets: &[Bucket],
    pick: impl Fn(&Bucket) -> Option<Backend>,
) -> Vec<(Backend, usize, usize)> {
    let mut out: Vec<(Backend, usize, usize)> = Vec::new();
    for (i, b) in buckets.iter().enumerate() {
        let Some(c) = pick(b) else { continue };
        match out.last_mut() {
            Some((last, at, len)) if *last == c && *at + *len == i => *len += 1,
            _ => out.push((c, i, 1)),
        }
    }
    out
}

/// What `b` gains over `n` at its best bucket of the band; None where `n` was not timed there.
fn best_gain(band: &[Bucket], b: Backend, n: Backend) -> Option<f64> {
    band.iter()
        .map(|k| Some(k.results.get(&n)?.median_us / k.results.get(&b)?.median_us - 1.0))
        .try_fold(f64::NEG_INFINITY, |m, g| Some(m.max(g?)))
}

/// Every band of one profile that flaps, described.
fn flaps(name: &str, profile: &Profile) -> Vec<String> {
    let mut out = Vec::new();
    for g in &profile.groups {
        let picks: [(&str, Pick); 2] = [
            ("choice", |b| Some(b.choice)),
            ("nccl_choice", |b| b.nccl_choice),
        ];
        for (what, pick) in picks {
            for w in bands(&g.buckets, pick).windows(3) {
                let (b, at, len) = w[1];
                let band = &g.buckets[at..at + len];
                let gains = (best_gain(band, b, w[0].0), best_gain(band, b, w[2].0));
                if let (Some(l), Some(r)) = gains {
                    if l < MIN_EFFECT && r < MIN_EFFECT {
                        out.push(format!(
                            "{name} TP{} {:?} {} GPUs {:?}: {} -> {b} at {}..{} bytes -> {}, \
                             best gains {:.1}% and {:.1}%",
                            g.tp,
                            g.mode,
                            what,
                            g.gpus,
                            w[0].0,
                            band[0].bytes,
                            band[len - 1].bytes,
                            w[2].0,
                            l * 100.0,
                            r * 100.0
                        ));
                    }
                }
            }
        }
    }
    out
}

/// Buckets where NCCL serves but the NCCL variant the plugin and NCCL exports follow is
/// another: select and show would name one variant and NCCL run the other.
fn disagreements(name: &str, profile: &Profile) -> Vec<String> {
    use artune::allreduce::Executor;
    use artune::profile::{Query, Selection};
    let sel = profile.selector();
    let mut out = Vec::new();
    for g in &profile.groups {
        let q = Query {
            tp: g.tp,
            mode: g.mode,
            gpus: Some(&g.gpus),
        };
        for b in g
            .buckets
            .iter()
            .filter(|b| b.choice.executor() == Executor::Nccl)
        {
            let answer = match sel.select(q, b.bytes) {
                Selection::Chosen { backend, nccl, .. } => (backend, nccl),
                Selection::Unknown(r) => panic!("{name}: no answer at {}: {r:?}", b.bytes),
            };
            if answer != (b.choice, b.choice) {
                out.push(format!(
                    "{name} TP{} {:?} GPUs {:?} at {} bytes: choice {}, the plugin's NCCL {:?}",
                    g.tp, g.mode, g.gpus, b.bytes, b.choice, answer.1
                ));
            }
        }
    }
    out
}

#[test]
fn no_band_flaps_and_nccl_answers_agree_on_any_preset_or_topology_file() {
    let dir = tempfile::tempdir().unwrap();
    let list = artune(&["topo", "--list-presets"]);
    let presets: Vec<String> = text(&list.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect();
    assert!(presets.len() >= 5, "{presets:?}");
    let files: Vec<PathBuf> = std::fs::read_dir("docs/topologies")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    assert!(files.len() >= 3, "{files:?}");
    let mut runs: Vec<(String, Vec<String>)> = presets
        .iter()
        .map(|p| (p.clone(), vec!["--sim".to_string(), p.clone()]))
        .collect();
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        runs.push((
            name,
            vec!["--topology".into(), f.to_string_lossy().into_owned()],
        ));
    }
    let (mut found, mut disagree) = (Vec::new(), Vec::new());
    let mut groups = 0;
    for (name, args) in &runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = tuned(dir.path(), &format!("{name}.json"), &args);
        let profile = Profile::load(&out).unwrap();
        groups += profile.groups.len();
        found.extend(flaps(name, &profile));
        disagree.extend(disagreements(name, &profile));
    }
    assert!(
        groups >= 40,
        "every TP size and mode of every box: {groups} groups"
    );
    assert!(found.is_empty(), "bands that flap:\n{}", found.join("\n"));
    assert!(
        disagree.is_empty(),
        "NCCL serves, but the plugin runs another variant:\n{}",
        disagree.join("\n")
    );
}

//! `artune tune --exhaustive` (the reference) and `--target-ci` through the binary, and the
//! fast default judged against the reference on every simulated preset with `artune compare`.

mod common;

use std::path::Path;
use std::process::Output;

use artune::profile::{Profile, Sampling};
use common::{artune, text, tuned};

fn assert_bad_input(o: &Output, needle: &str) {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains(needle), "expected `{needle}` in: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one line expected: {err}");
    common::assert_no_panic(&err);
}

#[test]
fn exhaustive_measures_every_size_refinement_could_reach_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = ["--sizes", "4K:64K", "--tp", "2", "--mode", "graph"];
    let sim = [&["--sim", "pcie-2x", "--exhaustive"][..], &sizes].concat();
    let p = tuned(dir.path(), "ex.json", &sim);
    let prof = Profile::load(&p).unwrap();
    assert_eq!(prof.settings.sampling, Sampling::Exhaustive);
    assert_eq!(prof.settings.target_ci, 0.02);
    let got: Vec<u64> = prof.groups[0].buckets.iter().map(|b| b.bytes).collect();
    let want = artune::plan::fine_grid(4096, 65536, 256);
    assert_eq!(got, want);
    assert_eq!(got.len(), 4 * 7 + 5);
    // No cell was raced: every backend reached its target or a cap.
    let show = artune(&["show", p.to_str().unwrap()]);
    assert!(text(&show.stdout).contains("sampling: exhaustive (±2% interval target"));
    let json = artune(&["show", p.to_str().unwrap(), "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(j["sampling"], "exhaustive");

    // The same from a topology file; the fast default at a chosen target says "fast".
    let topo = dir.path().join("box.json");
    let o = artune(&["topo", "--sim", "pcie-2x", "--json"]);
    std::fs::write(&topo, &o.stdout).unwrap();
    let file = [
        &["--topology", topo.to_str().unwrap(), "--exhaustive"][..],
        &sizes,
    ]
    .concat();
    let t = Profile::load(&tuned(dir.path(), "topo.json", &file)).unwrap();
    assert_eq!(t.settings.sampling, Sampling::Exhaustive);
    let fast = [&["--sim", "pcie-2x", "--target-ci", "1%"][..], &sizes].concat();
    let f = Profile::load(&tuned(dir.path(), "fast.json", &fast)).unwrap();
    assert_eq!(f.settings.sampling, Sampling::Fast);
    assert_eq!(f.settings.target_ci, 0.01);
    assert!(f.groups[0].buckets.len() < got.len());
}

#[test]
fn contradictory_or_out_of_range_sampling_flags_are_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let o = out.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut a = vec!["tune", "--sim", "pcie-2x", "--out", o];
        a.extend_from_slice(extra);
        artune(&a)
    };
    assert_bad_input(
        &run(&["--exhaustive", "--target-ci", "1"]),
        "--exhaustive samples every backend to the reference 2% target",
    );
    assert_bad_input(&run(&["--target-ci", "30"]), "outside 0.1%..20%");
    assert_bad_input(&run(&["--target-ci", "0.05"]), "outside 0.1%..20%");
    assert_bad_input(&run(&["--target-ci", "two"]), "is not a number");
    assert!(!out.exists(), "no profile may be written on bad input");
    // --exhaustive with --loopback parses; without a GPU it stops where any loopback tune does.
    if !Path::new("/dev/nvidiactl").exists() {
        assert_bad_input(
            &artune(&["tune", "--loopback", "8", "--exhaustive", "--out", o]),
            "`artune tune --sim pcie-8x-2switch --out sim.json`",
        );
    }
}

/// One group's comparison of A against B, as `artune compare --json` judges it.
struct Judged {
    preset: String,
    group: String,
    sum_pct: f64,
    /// The raw worst size, shown; the bound judges `significant_pct`.
    worst_pct: f64,
    significant_pct: f64,
    /// A's own uncertainty at that size, % (see [`a_noise_pct`]).
    a_noise_pct: f64,
    /// Crossovers off step that B's rule cannot tell from its own: no miss.
    tied: usize,
    /// Crossovers off step and not tied, in words.
    misses: Vec<String>,
}

/// `artune compare A B --json`, group by group.
fn judge(preset: &str, a: &Path, b: &Path) -> Vec<Judged> {
    let o = artune(&[
        "compare",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let groups = c["groups"].as_array().unwrap();
    assert_eq!(
        groups.len(),
        Profile::load(a).unwrap().groups.len(),
        "{preset}: every group compared"
    );
    groups
        .iter()
        .map(|g| {
            let misses: Vec<String> = [("A", "a_in_b"), ("B", "b_in_a")]
                .iter()
                .flat_map(|(who, k)| g[*k].as_array().unwrap().iter().map(move |m| (who, m)))
                .filter(|(_, m)| m["within_step"] == false && m["tied"] == false)
                .map(|(who, m)| {
                    format!(
                        "{who}'s {}→{} at {} (nearest {})",
                        m["from"].as_str().unwrap_or("?"),
                        m["to"].as_str().unwrap_or("?"),
                        m["bytes"],
                        m["nearest_bytes"]
                    )
                })
                .collect();
            assert_eq!(
                g["crossovers_within_step"].as_bool(),
                Some(misses.is_empty()),
                "{g}"
            );
            Judged {
                preset: preset.to_string(),
                group: format!(
                    "TP{} {} {}",
                    g["tp"],
                    g["mode"].as_str().unwrap_or("?"),
                    g["gpus"]
                ),
                sum_pct: g["regret_sum_pct"].as_f64().unwrap(),
                worst_pct: g["worst_pct"].as_f64().unwrap(),
                significant_pct: g["worst_significant_pct"].as_f64().unwrap(),
                a_noise_pct: a_noise_pct(a, g),
                tied: g["crossovers_tied"].as_u64().unwrap() as usize,
                misses,
            }
        })
        .collect()
}

/// A's own uncertainty where the worst significant regret lies: the relative half-widths of
/// A's intervals for the two backends there. A decides by its own intervals, so a tie it
/// breaks for memory can cost the rule's effect plus what its intervals could not resolve
/// (seed 1, pcie-4x-1switch TP4 graph: A measured 4.7% between them, a tie; B 5.05% beyond
/// its intervals). A slowed kernel is far beyond both.
fn a_noise_pct(a: &Path, g: &serde_json::Value) -> f64 {
    let w = &g["worst_significant"];
    let Some(bytes) = w["bytes"].as_u64() else {
        return 0.0;
    };
    let prof = Profile::load(a).unwrap();
    let backend = |k: &str| serde_json::from_value(w[k].clone()).unwrap();
    let (ac, bc): (artune::allreduce::Backend, artune::allreduce::Backend) =
        (backend("a_choice"), backend("b_choice"));
    let group = prof.groups.iter().find(|x| {
        serde_json::json!(x.tp) == g["tp"]
            && serde_json::to_value(x.mode).unwrap() == g["mode"]
            && serde_json::json!(x.gpus) == g["gpus"]
    });
    let Some(bucket) = group.and_then(|x| x.buckets.iter().find(|b| b.bytes >= bytes)) else {
        return 0.0;
    };
    let half = |k| {
        bucket
            .results
            .get(&k)
            .map_or(0.0, |t: &artune::results::Timing| {
                (t.ci_high_us - t.ci_low_us) / 2.0 / t.median_us
            })
    };
    100.0 * (half(ac) + half(bc))
}

/// The per-size bound: beyond B's intervals by more than the rule's effect (5%) and A's own
/// uncertainty there.
fn over_size_bound(j: &Judged) -> bool {
    j.significant_pct > 5.0 + j.a_noise_pct
}

fn print(judged: &[Judged]) {
    for j in judged {
        eprintln!(
            "{:<24} {:<34} summed {:.3}%  worst {:.2}% (beyond B's intervals {:.2}%, A's own +-{:.2}%)  crossovers tied {}, missed {} {}",
            j.preset,
            j.group,
            j.sum_pct,
            j.worst_pct,
            j.significant_pct,
            j.a_noise_pct,
            j.tied,
            j.misses.len(),
            j.misses.join(", ")
        );
    }
}

/// Tunes the fast default and the reference with the same seed on every preset and compares
/// them through `artune compare --json`.
fn judge_every_preset() -> Vec<Judged> {
    let dir = tempfile::tempdir().unwrap();
    let list = artune(&["topo", "--list-presets"]);
    let presets: Vec<String> = text(&list.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect();
    assert!(presets.len() >= 5, "{presets:?}");
    let mut out = Vec::new();
    for p in &presets {
        let fast = tuned(dir.path(), &format!("{p}-fast.json"), &["--sim", p]);
        let ex = tuned(
            dir.path(),
            &format!("{p}-ex.json"),
            &["--sim", p, "--exhaustive"],
        );
        let b = Profile::load(&ex).unwrap();
        assert_eq!(
            (
                Profile::load(&fast).unwrap().settings.sampling,
                b.settings.sampling
            ),
            (Sampling::Fast, Sampling::Exhaustive)
        );
        out.extend(judge(p, &fast, &ex));
    }
    print(&out);
    out
}

/// The bounds: the summed regret (the expected cost, raw), and the worst size's regret
/// beyond the reference's own intervals by more than the rule's effect and A's own noise.
#[test]
fn the_fast_default_is_within_1_percent_summed_and_5_percent_significant_per_size() {
    let judged = judge_every_preset();
    let bad: Vec<String> = judged
        .iter()
        .filter(|j| j.sum_pct > 1.0 || over_size_bound(j))
        .map(|j| {
            format!(
                "{} {}: summed {:.3}%, worst beyond B's intervals {:.2}%",
                j.preset, j.group, j.sum_pct, j.significant_pct
            )
        })
        .collect();
    assert!(bad.is_empty(), "{} groups:\n{}", bad.len(), bad.join("\n"));
}

/// The crossover bound, ties allowed. It holds because both tunes settle their close calls
/// (sizes where the rule's verdict sits inside the intervals); sampled once to the 2% target,
/// 8-10 of the 32 groups missed a crossover, and so did a second reference run.
#[test]
fn every_crossover_of_the_fast_default_is_within_one_step_or_tied() {
    let judged = judge_every_preset();
    let bad: Vec<String> = judged
        .iter()
        .filter(|j| !j.misses.is_empty())
        .map(|j| format!("{} {}: {}", j.preset, j.group, j.misses.join(", ")))
        .collect();
    assert!(bad.is_empty(), "{} groups:\n{}", bad.len(), bad.join("\n"));
}

/// The control: the judgement can fail. B is tuned where the kernel A chooses most is 3x
/// slower; A's choices must then cost more than 5% beyond B's intervals somewhere, and some
/// crossover of A's must be missed. B's intervals include the model band where the rule
/// applies it, but the sizes the fault costs most are where B switches to another kernel, a
/// comparison within the custom family, which the band does not widen; so 3x still fails the
/// judgement, as a wrong kernel model would. The box is the direct-attached one, where NCCL's
/// defaults go through host memory and the kernels win beyond the model band (behind PCIe
/// switches NCCL's ring is within it, and A chooses no kernel to slow).
#[test]
fn a_kernel_made_3x_slower_in_b_fails_the_judgement() {
    let dir = tempfile::tempdir().unwrap();
    let group = [
        "--sim",
        "pcie-8x-direct-2socket",
        "--tp",
        "8",
        "--mode",
        "graph",
    ];
    let a = tuned(dir.path(), "a.json", &group);
    let prof = Profile::load(&a).unwrap();
    let mut counts = std::collections::BTreeMap::new();
    for k in prof.groups.iter().flat_map(|g| &g.buckets) {
        if k.choice.is_custom() {
            *counts.entry(k.choice).or_insert(0) += 1;
        }
    }
    let (&kernel, _) = counts
        .iter()
        .max_by_key(|(_, &n)| n)
        .expect("a custom choice");
    let slow = format!("slow={kernel}:3");
    let b = tuned(
        dir.path(),
        "b.json",
        &[&group[..], &["--exhaustive", "--sim-faults", &slow]].concat(),
    );
    let judged = judge("pcie-8x-direct-2socket", &a, &b);
    print(&judged);
    assert!(
        judged.iter().any(over_size_bound),
        "{kernel} 3x slower in B, yet no size costs A over 5% and its own noise beyond B's intervals"
    );
    assert!(
        judged.iter().any(|j| !j.misses.is_empty()),
        "{kernel} 3x slower in B, yet no crossover of A is missed"
    );
    // Unfaulted, the same judgement passes on this group (as on every preset).
    let ex = tuned(
        dir.path(),
        "ex.json",
        &[&group[..], &["--exhaustive"]].concat(),
    );
    assert!(judge("pcie-8x-direct-2socket", &a, &ex)
        .iter()
        .all(|j| !over_size_bound(j) && j.sum_pct <= 1.0));
}

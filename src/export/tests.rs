use super::*;
use std::path::PathBuf;

const SOURCE: &str = "/srv/profiles/sample.json";

fn opts(engine: Engine) -> Options {
    Options {
        engine,
        tp: None,
        hidden: Some(7168),
        dtype: Dtype::Bf16,
        source: SOURCE.into(),
    }
}

fn all_engines() -> [(Engine, &'static str); 5] {
    [
        (Engine::Trtllm, "trtllm"),
        (Engine::Vllm, "vllm"),
        (Engine::Sglang, "sglang"),
        (Engine::Nccl, "nccl"),
        (Engine::Env, "env"),
    ]
}

/// Compares every exported file of the sample profile with src/export/snapshots/<engine>/<name>.
/// Set ARTUNE_UPDATE_SNAPSHOTS=1 to rewrite them (then review the diff before committing).
#[test]
fn exports_match_snapshots() {
    let p = sample::profile();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/export/snapshots");
    let update = std::env::var("ARTUNE_UPDATE_SNAPSHOTS").as_deref() == Ok("1");
    let mut mismatched = Vec::new();
    for (engine, name) in all_engines() {
        for f in export(&p, &opts(engine)).unwrap().files {
            let path = dir.join(name).join(&f.name);
            if update {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &f.contents).unwrap();
                continue;
            }
            match std::fs::read_to_string(&path) {
                Ok(want) if want == f.contents => {}
                _ => mismatched.push(path.display().to_string()),
            }
        }
    }
    assert!(
        mismatched.is_empty(),
        "export differs from snapshot (ARTUNE_UPDATE_SNAPSHOTS=1 rewrites): {mismatched:?}"
    );
}

#[test]
fn every_export_names_its_source_and_says_simulated() {
    let mut p = sample::profile();
    for (engine, _) in all_engines() {
        let files = export(&p, &opts(engine)).unwrap().files;
        assert!(files[0].contents.contains(SOURCE), "{engine:?}");
        assert!(
            files[0].contents.contains(&p.fingerprint.host),
            "{engine:?}"
        );
        assert!(
            files[0].contents.contains("!!! SIMULATED PROFILE"),
            "{engine:?}"
        );
        assert!(
            files.iter().all(|f| f.contents.contains("SIMULATED")),
            "{engine:?}"
        );
        assert!(
            files[0].contents.contains("cannot express"),
            "{engine:?} states its limits"
        );
    }
    p.simulated = false;
    for (engine, _) in all_engines() {
        let files = export(&p, &opts(engine)).unwrap().files;
        assert!(
            files.iter().all(|f| !f.contents.contains("SIMULATED")),
            "{engine:?}"
        );
    }
}

#[test]
fn nccl_csv_covers_every_size_once_in_short_lines() {
    let p = sample::profile();
    let text = &export(&p, &opts(Engine::Nccl)).unwrap().files[0].contents;
    assert!(
        text.lines().all(|l| l.len() < 200),
        "the example plugin reads 255 characters per line"
    );
    for tp in [2, 4] {
        let rows: Vec<Vec<&str>> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(',').collect::<Vec<_>>())
            .filter(|f| f[7] == tp.to_string())
            .collect();
        assert!(!rows.is_empty());
        let mut next = 0u64;
        for f in &rows {
            assert_eq!(f.len(), 8);
            assert_eq!((f[0], f[5], f[6]), ("allreduce", "-1", "1"));
            assert_eq!(
                f[1].parse::<u64>().unwrap(),
                next,
                "TP{tp} rows must be contiguous"
            );
            let max: u64 = f[2].parse().unwrap();
            assert!(["ring", "tree"].contains(&f[3]) && ["ll", "ll128", "simple"].contains(&f[4]));
            next = max.wrapping_add(1);
        }
        assert_eq!(next, 0, "TP{tp} rows must end at u64::MAX");
    }
}

#[test]
fn trtllm_cache_is_json_with_rank_sections_and_known_tactics() {
    let p = sample::profile();
    let files = export(&p, &opts(Engine::Trtllm)).unwrap().files;
    let v: serde_json::Value = serde_json::from_str(&files[1].contents).unwrap();
    for k in [
        "lib_version",
        "creation_timestamp",
        "device_name",
        "device_capability",
    ] {
        assert!(v["metadata"].get(k).is_some(), "metadata.{k}");
    }
    for r in 0..4 {
        let sec = v[format!("rank_{r}")].as_object().unwrap();
        // 2 TP sizes × 14 token buckets × 2 fusions, less what is beyond the profile.
        assert!(!sec.is_empty());
        for (k, e) in sec {
            assert!(k.starts_with("('trtllm::tunable_allreduce::allreduce', 'AllReduceRunner', '("));
            assert!(
                ["0", "4", "5"].contains(&e["tactic"].as_str().unwrap()),
                "{e}"
            );
            assert_eq!(e["runner_id"], 0);
        }
    }
    assert!(v.get("rank_4").is_none());
    // 7168 × 2 × 1024 tokens = 14 MiB fits the 16 MiB profile; 2048 tokens does not.
    assert!(files[1].contents.contains("((1024, 7168)"));
    assert!(!files[1].contents.contains("((2048, 7168)"));
}

#[test]
fn trtllm_needs_hidden() {
    let p = sample::profile();
    let o = Options {
        hidden: None,
        ..opts(Engine::Trtllm)
    };
    assert!(export(&p, &o).unwrap_err().to_string().contains("--hidden"));
}

#[test]
fn vllm_p2p_cache_has_every_ordered_pair() {
    let p = sample::profile();
    let files = export(&p, &opts(Engine::Vllm)).unwrap().files;
    assert_eq!(files[1].name, "gpu_p2p_access_cache_for_0,1,2,3.json");
    let v: serde_json::Value = serde_json::from_str(&files[1].contents).unwrap();
    for a in 0..4 {
        for b in 0..4 {
            assert!(v[format!("{a}->{b}")].is_boolean(), "{a}->{b}");
        }
    }
    // TP4 on PCIe: vLLM disables its custom all-reduce itself.
    assert!(files[0]
        .contents
        .contains("--tensor-parallel-size 4 --disable-custom-all-reduce"));
}

#[test]
fn vllm_rule_follows_its_source() {
    let p = sample::profile();
    let t = &p.topology;
    use vllm::{builtin, Path};
    assert_eq!(
        builtin(t, &[0, 1], 4096),
        Path::Custom(Backend::OneStagePull)
    );
    assert_eq!(
        builtin(t, &[0, 1], 8 << 20),
        Path::Nccl("the message is 8 MiB or more")
    );
    assert_eq!(
        builtin(t, &[0, 1], 4100),
        Path::Nccl("the message is not a multiple of 16 bytes")
    );
    assert!(matches!(builtin(t, &[0, 1, 2, 3], 4096), Path::Nccl(_)));
    let nv = crate::topology::presets::get("nvswitch-8x").unwrap();
    assert_eq!(
        builtin(&nv, &[0, 1, 2, 3], 256 << 10),
        Path::Custom(Backend::OneStagePull)
    );
    assert_eq!(
        builtin(&nv, &[0, 1, 2, 3], 512 << 10),
        Path::Custom(Backend::TwoStagePull)
    );
    assert_eq!(
        builtin(&nv, &(0..8).collect::<Vec<_>>(), 256 << 10),
        Path::Custom(Backend::TwoStagePull)
    );
    assert!(matches!(builtin(&nv, &[0, 1, 2], 1024), Path::Nccl(_)));
}

#[test]
fn unknown_tp_is_refused_naming_what_exists() {
    let p = sample::profile();
    let o = Options {
        tp: Some(8),
        ..opts(Engine::Nccl)
    };
    let e = export(&p, &o).unwrap_err().to_string();
    assert!(e.contains("TP8") && e.contains("2, 4"), "{e}");
}

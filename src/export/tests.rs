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
        world_size: None,
        allow_simulated: true,
        plugin: "/usr/local/lib/libartune.so".into(),
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

/// The NVLink sample: H100-class GPUs on NVSwitch, TP2/4/8, 1 KiB to 64 MiB.
fn nvswitch() -> Profile {
    let sizes: Vec<u64> = (0..9).map(|i| 1024u64 << (2 * i)).collect();
    sample::profile_with("nvswitch-8x", &[2, 4, 8], &sizes)
}

fn file<'a>(e: &'a Export, name: &str) -> Option<&'a str> {
    e.files
        .iter()
        .find(|f| f.name == name)
        .map(|f| f.contents.as_str())
}

/// Compares every exported file of the samples with src/export/snapshots/<engine>[-nvswitch]/.
/// Set ARTUNE_UPDATE_SNAPSHOTS=1 to rewrite them (then review the diff before committing).
#[test]
fn exports_match_snapshots() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/export/snapshots");
    let update = std::env::var("ARTUNE_UPDATE_SNAPSHOTS").as_deref() == Ok("1");
    let mut mismatched = Vec::new();
    for (p, suffix) in [
        (sample::profile(), ""),
        (nvswitch(), "-nvswitch"),
        (sample::placements(), "-placements"),
    ] {
        for (engine, name) in all_engines() {
            for f in export(&p, &opts(engine)).unwrap().files {
                let path = dir.join(format!("{name}{suffix}")).join(&f.name);
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
fn every_export_header_names_the_engine_source_it_was_read_against() {
    for (engine, needle) in [
        (Engine::Trtllm, "allreduceOp.cpp (4bb1ef88800b)"),
        (
            Engine::Vllm,
            "Read against vLLM 0.34.0 (cuda_communicator.py",
        ),
        (
            Engine::Sglang,
            "Read against SGLang 0.5.23 (custom_all_reduce_v2.py",
        ),
        (Engine::Nccl, "tuner/tuner_v7.h, commit 2449986fd9ec"),
    ] {
        let e = export(&nvswitch(), &opts(engine)).unwrap();
        assert!(e.files[0].contents.contains(needle), "{engine:?}");
    }
}

// --- NCCL ---

#[test]
fn nccl_export_is_artunes_plugin_and_writes_no_example_csv() {
    let e = export(&sample::profile(), &opts(Engine::Nccl)).unwrap();
    let text = &e.files[0].contents;
    assert!(text.contains("export NCCL_TUNER_PLUGIN=/usr/local/lib/libartune.so"));
    // Where artune found no installed library, the bare name comes with what to do.
    let bare = Options {
        plugin: "libartune.so".into(),
        ..opts(Engine::Nccl)
    };
    let text = &export(&sample::profile(), &bare).unwrap().files[0].contents;
    assert!(
        text.contains("export NCCL_TUNER_PLUGIN=libartune.so"),
        "{text}"
    );
    assert!(text.contains("was not found beside this artune"), "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("allreduce,")),
        "no rows for NCCL's example plugin, which forces one channel"
    );
    assert!(text.contains("*nChannels = 1") && text.contains("ONE channel"));
}

#[test]
fn nccl_variants_come_from_the_profiles_nccl_choice() {
    // Record Tree/LL as the rule's NCCL variant everywhere, whatever was fastest: the exports
    // must follow the profile, never pin the fastest variant themselves.
    let mut p = sample::profile();
    for g in &mut p.groups {
        for b in &mut g.buckets {
            b.nccl_choice = Some(Backend::NcclTreeLl);
        }
    }
    let nccl = export(&p, &opts(Engine::Nccl)).unwrap();
    assert!(nccl.files[0].contents.contains("Tree/LL (nccl_tree_ll)"));
    assert!(!nccl.files[0].contents.contains("Ring/"));
    // The sample stops at 16 MiB: a variable would pin Tree/LL above it too, unmeasured.
    let env = &export(&p, &opts(Engine::Env)).unwrap().files[0].contents;
    assert!(!env.contains("export NCCL_ALGO"), "{env}");
    assert!(env.contains("does not reach from 4K to 256M"), "{env}");
    // Reaching 256 MiB, one variable holds at every size an engine sends.
    for g in &mut p.groups {
        g.buckets.last_mut().unwrap().bytes = 256 << 20;
    }
    let env = &export(&p, &opts(Engine::Env)).unwrap().files[0].contents;
    assert!(env.contains("export NCCL_ALGO=allreduce:tree\nexport NCCL_PROTO=allreduce:ll\n"));
    // The same profile on all-NVLink GPUs: NCCL_ALGO would switch off NCCL's symmetric
    // kernels, so neither export pins it.
    let mut nv = p.clone();
    nv.topology = crate::topology::presets::get("nvswitch-8x").unwrap();
    let env = &export(&nv, &opts(Engine::Env)).unwrap().files[0].contents;
    assert!(!env.contains("export NCCL_ALGO"), "{env}");
    assert!(env.contains("symmetric kernels"), "{env}");
    let nccl = &export(&nv, &opts(Engine::Nccl)).unwrap().files[0].contents;
    assert!(!nccl.contains("export NCCL_ALGO"), "{nccl}");
    assert!(nccl.contains("symmetric kernels"), "{nccl}");
    // NCCL's own choice everywhere: nothing to pin, no NCCL_ALGO line.
    for g in &mut p.groups {
        for b in &mut g.buckets {
            b.nccl_choice = Some(Backend::Nccl);
        }
    }
    let env = &export(&p, &opts(Engine::Env)).unwrap().files[0].contents;
    assert!(!env.contains("export NCCL_ALGO"), "{env}");
}

// --- TensorRT-LLM ---

#[test]
fn trtllm_without_nvlink_runs_nccl_and_writes_no_dead_cache() {
    let e = export(&sample::profile(), &opts(Engine::Trtllm)).unwrap();
    assert_eq!(
        e.files.len(),
        1,
        "no cache: ifFallbackToNCCL makes it inert"
    );
    let y = &e.files[0].contents;
    assert!(y.contains("\nallreduce_strategy: NCCL\n"));
    assert!(y.contains("NCCL_TUNER_PLUGIN=/usr/local/lib/libartune.so"));
    assert!(y.contains("ifFallbackToNCCL"));
}

#[test]
fn trtllm_nvlink_cache_has_custom_bands_only_and_every_rank() {
    let p = nvswitch();
    // TP2 in a deployment of 8 ranks (PP4): every rank needs its section.
    let o = Options {
        tp: Some(2),
        world_size: Some(8),
        ..opts(Engine::Trtllm)
    };
    let e = export(&p, &o).unwrap();
    assert!(e.files[0].contents.contains("\nallreduce_strategy: AUTO\n"));
    let v: serde_json::Value =
        serde_json::from_str(file(&e, "trtllm-autotuner-cache.json").unwrap()).unwrap();
    for k in [
        "lib_version",
        "creation_timestamp",
        "device_name",
        "device_capability",
    ] {
        assert!(v["metadata"].get(k).is_some(), "metadata.{k}");
    }
    for r in 0..8 {
        let sec = v[format!("rank_{r}")].as_object().unwrap();
        assert!(!sec.is_empty(), "rank_{r}");
        for (k, e) in sec {
            assert!(
                k.starts_with("('trtllm::tunable_allreduce::allreduce', 'AllReduceRunner', '(2, ")
            );
            let tactic = e["tactic"].as_str().unwrap();
            assert!(["4", "5"].contains(&tactic), "no NCCL tactic 0: {e}");
            let tokens: u64 = k
                .split("((")
                .nth(1)
                .unwrap()
                .split(',')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert!(tokens <= 8192 && tokens * 7168 * 2 <= 64 << 20, "{k}");
            if tactic == "5" {
                assert!(tokens >= 2, "TWOSHOT needs a token per rank: {k}");
            }
        }
    }
    assert!(v.get("rank_8").is_none());
}

#[test]
fn trtllm_world_size_defaults_to_the_largest_tp_and_must_cover_it() {
    let p = nvswitch();
    let e = export(&p, &opts(Engine::Trtllm)).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(file(&e, "trtllm-autotuner-cache.json").unwrap()).unwrap();
    assert!(v.get("rank_7").is_some() && v.get("rank_8").is_none());
    for (w, needle) in [(4, "smaller than TP8"), (12, "not a multiple of TP8")] {
        let o = Options {
            world_size: Some(w),
            ..opts(Engine::Trtllm)
        };
        let err = export(&p, &o).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    }
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

// --- vLLM ---

#[test]
fn vllm_p2p_cache_has_every_ordered_pair_and_names_skip_p2p_check() {
    let p = sample::profile();
    let e = export(&p, &opts(Engine::Vllm)).unwrap();
    let cache = file(&e, "gpu_p2p_access_cache_for_0,1,2,3.json").unwrap();
    let v: serde_json::Value = serde_json::from_str(cache).unwrap();
    for a in 0..4 {
        for b in 0..4 {
            assert!(v[format!("{a}->{b}")].is_boolean(), "{a}->{b}");
        }
    }
    let text = &e.files[0].contents;
    assert!(text.contains("export VLLM_SKIP_P2P_CHECK=0"));
    assert!(text.contains("${XDG_CACHE_HOME:-$HOME/.cache}/vllm"));
    // TP4 on PCIe: vLLM disables its custom all-reduce itself.
    assert!(text.contains("--tensor-parallel-size 4 --disable-custom-all-reduce"));
}

#[test]
fn vllm_refuses_a_simulated_profile_without_allow_simulated() {
    let o = Options {
        allow_simulated: false,
        ..opts(Engine::Vllm)
    };
    let err = export(&sample::profile(), &o).unwrap_err().to_string();
    assert!(
        err.contains("SIMULATED") && err.contains("--allow-simulated"),
        "{err}"
    );
}

#[test]
fn vllm_p2p_cache_only_where_peer_kernels_verified() {
    let mut p = sample::profile();
    p.simulated = false;
    // TP2 verified its kernels on GPUs 0,1; TP4's were all disqualified.
    for g in p.groups.iter_mut().filter(|g| g.tp == 4) {
        for k in Backend::ALL.into_iter().filter(|k| k.is_custom()) {
            g.waived.insert(k, "wrong result at 4096 bytes".into());
        }
    }
    // Only TP4 held 0 and 2, and it verified nothing: a cache would say false there.
    let e = export(&p, &opts(Engine::Vllm)).unwrap();
    assert!(file(&e, "gpu_p2p_access_cache_for_0,1,2,3.json").is_none());
    let text = &e.files[0].contents;
    assert!(
        text.contains("were not exercised by any peer kernel"),
        "{text}"
    );
    assert!(text.contains("0->2"), "{text}");
    assert!(
        text.contains("CUDA_VISIBLE_DEVICES unset or 0,1,2,3: not written"),
        "{text}"
    );
    // The TP2 placement's own GPU set was verified: its file is written (keys 0 and 1).
    let v: serde_json::Value =
        serde_json::from_str(file(&e, "gpu_p2p_access_cache_for_0,1.json").unwrap()).unwrap();
    assert_eq!(v["0->1"], true);
    assert!(v.get("0->2").is_none(), "{v}");
    // Where NVML reports no P2P, the pair needs no kernel: false is what is known.
    let mut q = p.clone();
    for x in q.topology.pairs.iter_mut() {
        if !matches!((x.from, x.to), (0, 1) | (1, 0)) {
            x.p2p.read = crate::topology::Status::No;
        }
    }
    let e = export(&q, &opts(Engine::Vllm)).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(file(&e, "gpu_p2p_access_cache_for_0,1,2,3.json").unwrap()).unwrap();
    assert_eq!(v["0->1"], true);
    assert_eq!(v["1->0"], true);
    assert_eq!(v["0->2"], false);
    assert_eq!(v["2->2"], true);
    // Nothing verified anywhere: no cache at all.
    for g in &mut p.groups {
        for k in Backend::ALL.into_iter().filter(|k| k.is_custom()) {
            g.waived.insert(k, "wrong result".into());
        }
    }
    let e = export(&p, &opts(Engine::Vllm)).unwrap();
    assert_eq!(e.files.len(), 1);
    assert!(e.files[0].contents.contains("not written: no peer kernel"));
    assert!(!e.files[0].contents.contains("VLLM_SKIP_P2P_CHECK=0"));
    // Loopback: virtual ranks on one GPU exercise no P2P between GPUs.
    let mut p = sample::profile();
    p.simulated = false;
    p.topology.origin.kind = "loopback".into();
    let e = export(&p, &opts(Engine::Vllm)).unwrap();
    assert_eq!(e.files.len(), 1);
    assert!(e.files[0].contents.contains("loopback"));
}

#[test]
fn vllm_chain_follows_its_source() {
    let p = sample::profile();
    let t = &p.topology;
    use vllm::{builtin, Path};
    let bf = Dtype::Bf16;
    assert_eq!(
        builtin(t, &[0, 1], bf, 4096),
        Path::Custom(Backend::OneStagePull)
    );
    assert!(matches!(builtin(t, &[0, 1], bf, 8 << 20), Path::Nccl(w) if w.contains("limit of 8M")));
    assert!(matches!(builtin(t, &[0, 1], bf, 4100), Path::Nccl(w) if w.contains("multiple of 16")));
    assert!(matches!(builtin(t, &[0, 1, 2, 3], bf, 4096), Path::Nccl(_)));
    // H100 (9.0) on NVSwitch: FlashInfer first up to its table (2 MiB at TP4, 512 KiB at
    // TP8, 64 MiB at TP2), then custom allreduce to its limit, then symmetric memory.
    let nv = crate::topology::presets::get("nvswitch-8x").unwrap();
    let eight: Vec<usize> = (0..8).collect();
    assert_eq!(
        builtin(&nv, &[0, 1, 2, 3], bf, 2 << 20),
        Path::FlashInfer(2 << 20)
    );
    assert_eq!(
        builtin(&nv, &[0, 1, 2, 3], bf, 4 << 20),
        Path::Custom(Backend::TwoStagePull)
    );
    assert_eq!(
        builtin(&nv, &eight, bf, 512 << 10),
        Path::FlashInfer(512 << 10)
    );
    assert_eq!(
        builtin(&nv, &[0, 1], bf, 64 << 20),
        Path::FlashInfer(64 << 20)
    );
    // Above FlashInfer: CUSTOM_ALL_REDUCE_MAX_SIZES["9.0"][8] = 256 KiB, not 8 MiB.
    assert_eq!(
        builtin(&nv, &eight, bf, 1 << 20),
        Path::SymmMem("torch symmetric-memory multimem")
    );
    assert!(
        matches!(builtin(&nv, &eight, Dtype::Fp16, 1 << 20), Path::Nccl(w) if w.contains("bf16"))
    );
    assert!(matches!(builtin(&nv, &eight, bf, 64 << 20), Path::Nccl(_)));
    // Six GPUs: FlashInfer has no entry; custom allreduce to 512 KiB.
    assert_eq!(
        builtin(&nv, &[0, 1, 2, 3, 4, 5], bf, 256 << 10),
        Path::Custom(Backend::TwoStagePull)
    );
    assert!(matches!(builtin(&nv, &[0, 1, 2], bf, 1024), Path::Nccl(_)));
}

// --- SGLang ---

#[test]
fn sglang_on_pcie_writes_no_v2_table_and_runs_v1_at_tp2_or_nccl() {
    let e = export(&sample::profile(), &opts(Engine::Sglang)).unwrap();
    let text = &e.files[0].contents;
    assert!(
        !text.contains("ARTUNE_CUSTOM_ALL_REDUCE_V2 = {"),
        "v2 needs full NVLink"
    );
    assert!(text.contains("v1 runs one-stage pull up to 8 MiB"));
    assert!(text.contains("TP4: SGLang's custom all-reduce needs full NVLink"));
    assert!(!text.contains("2shot_lamport"));
}

#[test]
fn sglang_v2_tuples_have_four_elements_within_the_workspace() {
    let e = export(&nvswitch(), &opts(Engine::Sglang)).unwrap();
    let text = &e.files[0].contents;
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("ARTUNE_CUSTOM_ALL_REDUCE_V2 = {"))
        .skip(1)
        .take_while(|l| *l != "}")
        .collect();
    assert_eq!(table.len(), 3, "{text}");
    let mut checked_mc = false;
    for line in table {
        for (i, t) in line.split("\": (").skip(1).enumerate() {
            let inner = t.split(")").next().unwrap();
            let nums: Vec<u64> = inner
                .split(", ")
                .take(3)
                .map(|x| x.parse().unwrap())
                .collect();
            assert!(
                nums[0] <= nums[1] && nums[1] <= nums[2] && nums[2] <= 16 << 20,
                "{line}"
            );
            let fourth = inner.split(", ").nth(3).unwrap();
            assert!(fourth == "None" || fourth.starts_with('('), "{line}");
            // SM90 graph mode has multicast at TP8 from 512 KiB (SGLang 0.5.23), clipped to
            // the two-shot limit: _pick_config tests it first, so no NCCL size may sit inside;
            // below 512 KiB there is none (clipped at both ends it would be one at the limit).
            if line.starts_with("    8: {\"graph\"") && i == 0 {
                checked_mc = true;
                if nums[2] < 512 << 10 {
                    assert_eq!(fourth, "None", "{line}");
                    continue;
                }
                let mc = t.split('(').nth(1).unwrap().split(')').next().unwrap();
                let hi: u64 = mc.split(", ").nth(1).unwrap().parse().unwrap();
                let lo: u64 = mc.split(", ").next().unwrap().parse().unwrap();
                assert_eq!((lo, hi), (512 << 10, nums[2]), "{line}");
            }
        }
    }
    assert!(checked_mc, "{text}");
    assert!(text.contains("SGLang's order (push, pull, two-shot, NCCL) costs"));
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

//! `artune select`, `export`, `check`, `predict` through the binary, good input and bad: exit
//! codes, one-line errors, no panics. Plus a check that selection never allocates.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};

use artune::export::sample;
use artune::profile::Profile;

/// Counts allocations made by the current thread.
struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(|c| c.get())
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn artune(args: &[&str]) -> Out {
    let o = common::artune(args);
    let out = Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into(),
        stderr: String::from_utf8_lossy(&o.stderr).into(),
    };
    common::assert_no_panic(&out.stderr);
    out
}

/// Asserts a failure with `code` and one error line containing `needle`.
#[track_caller]
fn fails(args: &[&str], code: i32, needle: &str) {
    let o = artune(args);
    assert_eq!(o.code, code, "{args:?}: {}{}", o.stdout, o.stderr);
    let errors: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.starts_with("error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{args:?}: {}", o.stderr);
    assert!(
        errors[0].contains(needle),
        "{args:?}: `{}` lacks `{needle}`",
        errors[0]
    );
}

fn write(dir: &Path, name: &str, p: &Profile) -> String {
    let path = dir.join(name);
    p.write_atomic(&path).unwrap();
    path.to_str().unwrap().to_string()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn select_prints_backend_and_json() {
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "p.json", &sample::profile());
    let o = artune(&["select", &p, "--tp", "2", "--bytes", "4K"]);
    assert_eq!((o.code, o.stdout.as_str()), (0, "one_stage_pull\n"));
    assert!(o.stderr.contains("SIMULATED"));
    let o = artune(&[
        "select", &p, "--tp", "4", "--bytes", "16M", "--mode", "eager", "--json",
    ]);
    assert_eq!(o.code, 0);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["backend"], "nccl_ring_simple");
    assert_eq!(v["bucket_bytes"], 16 << 20);
    assert_eq!(v["buffer_bytes"], 0);
    assert!(v["expected_us"].as_f64().unwrap() > 0.0);
}

#[test]
fn select_refuses_what_the_profile_does_not_cover() {
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "p.json", &sample::profile());
    // No answer is not bad input: exit 6, the engine keeps its default.
    for (args, needle) in [
        (
            ["--tp", "8", "--bytes", "4K"],
            "no TP8 graph group (it has TP2 graph",
        ),
        (
            ["--tp", "2", "--bytes", "1G"],
            "1G is above the largest size",
        ),
    ] {
        let o = artune(&[&["select", p.as_str()][..], &args[..]].concat());
        assert_eq!(o.code, 6, "{args:?}: {}", o.stderr);
        assert!(o.stderr.contains(needle), "{}", o.stderr);
    }
    fails(
        &["select", &p, "--tp", "2", "--bytes", "lots"],
        2,
        "not a byte size",
    );
    fails(
        &["select", &p, "--tp", "2", "--bytes", "0"],
        2,
        "at least 1 byte",
    );
    // A group of fewer than 2 GPUs is not a question a profile could answer: bad input.
    for tp in ["0", "1"] {
        for cmd in ["select", "why"] {
            fails(
                &[cmd, &p, "--tp", tp, "--bytes", "4K"],
                2,
                "an allreduce needs at least 2 GPUs",
            );
        }
        // The other commands that take a group's size refuse it the same way.
        for args in [
            &["export", &p, "--engine", "nccl"][..],
            &["export", &p, "--engine", "vllm"],
            &["predict", &p, "--workload", "2x4K"],
        ] {
            let o = artune(&[args, &["--tp", tp]].concat());
            assert_eq!(o.code, 2, "{args:?}: {}", o.stderr);
            assert_eq!(
                o.stderr.trim_end(),
                format!(
                    "error: --tp {tp}: an allreduce needs at least 2 GPUs; give the group's size, e.g. --tp 2"
                ),
                "{args:?}"
            );
        }
    }
}

/// A profile with no groups is said to have none, not "several TP sizes".
#[test]
fn predict_on_a_profile_without_groups_says_it_has_none() {
    let d = tempfile::tempdir().unwrap();
    let mut empty = sample::profile();
    empty.groups.clear();
    let p = write(d.path(), "empty.json", &empty);
    fails(
        &["predict", &p, "--workload", "1x4K"],
        2,
        "the profile has no groups; there is nothing to price a workload with",
    );
}

#[test]
fn bad_profiles_are_refused_in_one_line() {
    let d = tempfile::tempdir().unwrap();
    let good = sample::profile();
    let future = d.path().join("future.json");
    std::fs::write(
        &future,
        good.to_json()
            .replacen("\"schema_version\": 1", "\"schema_version\": 9", 1),
    )
    .unwrap();
    let mut absurd = good.clone();
    absurd.groups[0].buckets.last_mut().unwrap().bytes = 1 << 50;
    let absurd = write(d.path(), "absurd.json", &absurd);
    let garbage = d.path().join("garbage.json");
    std::fs::write(&garbage, "{\"schema_version\": 1, \"groups\": [").unwrap();
    let missing = d.path().join("missing.json");
    let old = d.path().join("old.json");
    std::fs::write(
        &old,
        good.to_json()
            .replacen("\"schema_version\": 1", "\"schema_version\": 0", 1),
    )
    .unwrap();
    // Valid JSON whose bucket key is not a number: said as that, not as broken JSON.
    let mut v: serde_json::Value = serde_json::from_str(&good.to_json()).unwrap();
    v["groups"][0]["pin_channels"] = serde_json::json!({"abc": 2});
    let key = d.path().join("key.json");
    std::fs::write(&key, v.to_string()).unwrap();
    for cmd in [
        vec!["select", "P", "--tp", "2", "--bytes", "4K"],
        vec!["export", "P", "--engine", "nccl"],
        vec![
            "check",
            "P",
            "--topology",
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/profiles/topologies/pcie-4x-1switch.json"
            ),
        ],
        vec!["predict", "P", "--workload", "1x4K", "--tp", "2"],
    ] {
        fn with<'a>(cmd: &[&'a str], p: &'a str) -> Vec<&'a str> {
            cmd.iter().map(|a| if *a == "P" { p } else { a }).collect()
        }
        let with = |p| with(&cmd, p);
        fails(&with(s(&future)), 2, "newer than this artune reads");
        fails(&with(&absurd), 2, "1 TiB");
        fails(&with(s(&garbage)), 2, "truncated");
        fails(&with(s(&missing)), 2, "cannot read");
        fails(
            &with(s(&old)),
            2,
            "not one this artune reads (it reads 1); run",
        );
        fails(
            &with(s(&key)),
            2,
            "groups[0].pin_channels` must be a whole number",
        );
    }
}

/// The NVLink sample: H100-class GPUs on NVSwitch, TP2/4/8.
fn nvswitch() -> Profile {
    let sizes: Vec<u64> = (0..9).map(|i| 1024u64 << (2 * i)).collect();
    sample::profile_with("nvswitch-8x", &[2, 4, 8], &sizes)
}

#[test]
fn export_every_engine_to_stdout_and_files() {
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "p.json", &sample::profile());
    for engine in ["trtllm", "vllm", "sglang", "nccl", "env"] {
        let o = artune(&[
            "export",
            &p,
            "--engine",
            engine,
            "--hidden",
            "7168",
            "--allow-simulated",
        ]);
        assert_eq!(o.code, 0, "{engine}: {}", o.stderr);
        assert!(o.stdout.contains("SIMULATED PROFILE"), "{engine}");
        assert!(
            o.stdout.contains(s(&std::fs::canonicalize(&p).unwrap())),
            "{engine} names its source"
        );
        // `--out -` is standard output too, not a file named "-".
        let dash = std::process::Command::new(common::BIN)
            .args([
                "export",
                &p,
                "--engine",
                engine,
                "--hidden",
                "7168",
                "--allow-simulated",
            ])
            .args(["--out", "-"])
            .current_dir(d.path())
            .output()
            .unwrap();
        assert_eq!(common::text(&dash.stdout), o.stdout, "{engine}");
        assert!(
            !d.path().join("-").exists(),
            "{engine} wrote a file named -"
        );
    }
    let vllm_into = |dir: &Path| {
        artune(&[
            "export",
            &p,
            "--engine",
            "vllm",
            "--tp",
            "2",
            "--allow-simulated",
            "--out",
            s(dir),
        ])
    };
    let out = d.path().join("vllm");
    let o = vllm_into(&out);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let cache: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("gpu_p2p_access_cache_for_0,1,2,3.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cache["0->1"], true);
    let text = std::fs::read_to_string(out.join("vllm.txt")).unwrap();
    assert!(text.contains("--tensor-parallel-size 2"));
    assert!(text.contains("export VLLM_SKIP_P2P_CHECK=0"));

    // All or nothing: where the cache cannot be written, vllm.txt (which tells the engine
    // to copy it) is not written either.
    let half = d.path().join("half");
    std::fs::create_dir_all(half.join("gpu_p2p_access_cache_for_0,1,2,3.json")).unwrap();
    let o = vllm_into(&half);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("is a directory"), "{}", o.stderr);
    assert!(!half.join("vllm.txt").exists(), "{}", o.stderr);
    assert_eq!(
        std::fs::read_dir(&half).unwrap().count(),
        1,
        "no temporary left"
    );

    let env = d.path().join("nccl.env");
    assert_eq!(
        artune(&["export", &p, "--engine", "nccl", "--out", s(&env)]).code,
        0
    );
    let text = std::fs::read_to_string(&env).unwrap();
    // The library beside the binary where cargo built one, else the bare name with what to do.
    let lib = text
        .lines()
        .find_map(|l| l.strip_prefix("export NCCL_TUNER_PLUGIN="))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(lib.ends_with("libartune.so"), "{text}");
    assert!(
        std::path::Path::new(lib).is_file() || text.contains("was not found beside this artune"),
        "{text}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("allreduce,")),
        "no example-plugin CSV"
    );

    // PCIe: TensorRT-LLM runs NCCL whatever a cache says, so none is written.
    let trt = d.path().join("trt");
    let o = artune(&[
        "export",
        &p,
        "--engine",
        "trtllm",
        "--hidden",
        "4096",
        "--out",
        s(&trt),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let yaml = trt.join("extra-llm-api-options.yaml");
    assert!(std::fs::read_to_string(&yaml)
        .unwrap()
        .contains("\nallreduce_strategy: NCCL\n"));
    assert!(!trt.join("trtllm-autotuner-cache.json").exists());
    assert!(yaml.exists());

    // NVLink, TP2 served by 8 ranks (PP4): a section for every rank.
    let nv = write(d.path(), "nv.json", &nvswitch());
    let trt = d.path().join("trt-nv");
    let o = artune(&[
        "export",
        &nv,
        "--engine",
        "trtllm",
        "--hidden",
        "7168",
        "--tp",
        "2",
        "--world-size",
        "8",
        "--out",
        s(&trt),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let cache: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(trt.join("trtllm-autotuner-cache.json")).unwrap(),
    )
    .unwrap();
    for r in 0..8 {
        assert!(
            !cache[format!("rank_{r}")].as_object().unwrap().is_empty(),
            "rank_{r}"
        );
    }
    assert!(cache.get("rank_8").is_none());
}

#[test]
fn export_bad_input() {
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "p.json", &sample::profile());
    fails(&["export", &p, "--engine", "trtllm"], 2, "--hidden");
    fails(
        &["export", &p, "--engine", "nccl", "--tp", "3"],
        2,
        "no TP3 group",
    );
    let file = d.path().join("afile");
    std::fs::write(&file, "x").unwrap();
    fails(
        &[
            "export",
            &p,
            "--engine",
            "vllm",
            "--allow-simulated",
            "--out",
            s(&file),
        ],
        2,
        "give a directory",
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "x",
        "nothing written over it"
    );
    fails(
        &["export", &p, "--engine", "bogus"],
        2,
        "invalid value 'bogus'",
    );
    // Each refusal writes nothing.
    let out = d.path().join("out");
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "--engine",
                "trtllm",
                "--hidden",
                "7168",
                "--world-size",
                "2",
            ],
            "--world-size 2 is smaller than TP4",
        ),
        // --tp given: the advice is the world size alone, not to pass --tp.
        (
            &["--engine", "trtllm", "--hidden", "7168", "--tp", "2", "--world-size", "3"],
            "not a multiple of TP2, so it cannot hold whole TP2 groups; give a multiple of 2 (TP x PP ranks)",
        ),
        (
            &["--engine", "vllm"],
            "pass --allow-simulated for tests only",
        ),
        (&["--engine", "sglang", "--tp", "8"], "no TP8 group"),
    ];
    for (args, needle) in cases {
        let mut a = vec!["export", p.as_str(), "--out", s(&out)];
        a.extend_from_slice(args);
        fails(&a, 2, needle);
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    }
    // Not even --force writes the export over the profile it reads, by its path or a link.
    let before = std::fs::read(&p).unwrap();
    let link = d.path().join("link.json");
    std::os::unix::fs::symlink(&p, &link).unwrap();
    for target in [p.as_str(), s(&link)] {
        fails(
            &["export", &p, "--engine", "nccl", "--out", target, "--force"],
            2,
            "that is the profile being read",
        );
        assert_eq!(
            std::fs::read(&p).unwrap(),
            before,
            "{target} replaced the profile"
        );
    }
}

fn topology_file(dir: &Path, preset: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let mut v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!(
            "{}/profiles/topologies/{preset}.json",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap(),
    )
    .unwrap();
    edit(&mut v);
    let path = dir.join(format!("{preset}.json"));
    std::fs::write(&path, v.to_string()).unwrap();
    path
}

#[test]
fn check_holds_on_same_topology_and_names_changes() {
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "p.json", &sample::profile());
    let same = topology_file(d.path(), "pcie-4x-1switch", |_| {});
    let o = artune(&["check", &p, "--topology", s(&same)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("holds") && o.stdout.contains("SIMULATED"));

    assert_eq!(artune(&["check", &p, "--sim", "pcie-4x-1switch"]).code, 0);
    fails(
        &["check", &p, "--sim", "nope"],
        2,
        "no simulated preset `nope`",
    );
    let other = topology_file(d.path(), "pcie-2x", |_| {});
    fails(
        &["check", &p, "--topology", s(&other)],
        3,
        "profile is stale: GPU count 4 → 2",
    );

    // The same wiring with a newer driver than the profile was made with: still valid, with
    // the driver named and a measurement suggested.
    let mut prof = sample::profile();
    prof.versions.driver = Some("580.159.04".into());
    let older = write(d.path(), "older.json", &prof);
    let newer = topology_file(d.path(), "pcie-4x-1switch", |v| {
        v["host"]["driver"] = "590.10".into()
    });
    let o = artune(&["check", &older, "--topology", s(&newer)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout
            .contains("; driver 580.159.04 → 590.10: re-timing its decisive sizes (artune check"),
        "{}",
        o.stdout
    );

    fails(
        &["check", &p, "--topology", s(&d.path().join("nope.json"))],
        2,
        "cannot read",
    );
}

#[test]
fn predict_reports_policies_and_savings() {
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "p.json", &sample::profile());
    let o = artune(&[
        "predict",
        &p,
        "--workload",
        "122x7168xbf16@1..4",
        "--tp",
        "2",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("saves vs nccl") && o.stdout.contains("SIMULATED"));
    assert_eq!(
        o.stdout
            .lines()
            .filter(|l| l.trim_start().starts_with(char::is_numeric))
            .count(),
        4
    );

    let o = artune(&[
        "predict",
        &p,
        "--workload",
        "122x7168xbf16@1,2048",
        "--tp",
        "2",
        "--json",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let steps = v["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    let (mine, nccl) = (
        steps[0]["ms"]["profile"].as_f64().unwrap(),
        steps[0]["ms"]["nccl"].as_f64().unwrap(),
    );
    assert!((steps[0]["saving_ms"]["nccl"].as_f64().unwrap() - (nccl - mine)).abs() < 1e-9);
    assert!(
        steps[1]["ms"]["profile"].is_null(),
        "2048 tokens is beyond the 16 MiB profile"
    );
    assert_eq!(steps[1]["beyond_profile_bytes"][0], 7168 * 2 * 2048);

    let w = d.path().join("w.json");
    std::fs::write(&w, r#"[{"count": 60, "hidden": 7168, "dtype": "bf16", "tokens": 4}, {"count": 2, "bytes": 4096}]"#).unwrap();
    assert_eq!(
        artune(&["predict", &p, "--workload", s(&w), "--tp", "4"]).code,
        0
    );
}

#[test]
fn predict_bad_input() {
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "p.json", &sample::profile());
    fails(
        &["predict", &p, "--workload", "122x7168xbf16", "--tp", "2"],
        2,
        "needs token counts",
    );
    fails(
        &[
            "predict",
            &p,
            "--workload",
            "122x7168xbf16@1..1000000",
            "--tp",
            "2",
        ],
        2,
        "more than 4096",
    );
    fails(&["predict", &p, "--workload", "1x4K"], 2, "pass --tp");
    // A size per token missing its type is a fixed size: identical rows per T are refused.
    fails(
        &["predict", &p, "--workload", "122x7168@1..3", "--tp", "2"],
        2,
        "for a size per token add its type (e.g. 122x7168xbf16)",
    );
    // A file that is not there is said to be missing, not parsed as a SPEC.
    let gone = d.path().join("steps.json");
    for (arg, needle) in [
        (s(&gone), "No such file"),
        ("steps.json", "No such file"),
        (s(d.path()), "is a directory"),
    ] {
        fails(&["predict", &p, "--workload", arg, "--tp", "2"], 2, needle);
    }
    // A group the profile lacks prices no step: no answer, as select's (exit 6).
    let none = artune(&["predict", &p, "--workload", "1x4K", "--tp", "8"]);
    assert_eq!(none.code, 6, "{}", none.stderr);
    assert!(
        none.stderr
            .starts_with("no answer (keep the engine's default): ")
            && none.stderr.contains("no TP8 graph group (it has TP2 graph"),
        "{}",
        none.stderr
    );
    let json = artune(&["predict", &p, "--workload", "1x4K", "--tp", "8", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(
        (json.code, v["steps"].as_array().map(Vec::len)),
        (6, Some(0))
    );
    assert!(v["reason"].as_str().unwrap().contains("no TP8 graph group"));
    // --gpus in select's words: the length checked, and the placements the profile has.
    fails(
        &[
            "predict",
            &p,
            "--workload",
            "1x4K",
            "--tp",
            "2",
            "--gpus",
            "0,1,2",
        ],
        2,
        "--gpus 0,1,2 must name 2 different GPUs for --tp 2",
    );
    let sel = artune(&["select", &p, "--tp", "2", "--bytes", "4K", "--gpus", "5,6"]);
    let pre = artune(&[
        "predict",
        &p,
        "--workload",
        "1x4K",
        "--tp",
        "2",
        "--gpus",
        "5,6",
    ]);
    assert_eq!((sel.code, pre.code), (6, 6));
    assert!(sel.stderr.contains("(it has GPUs"), "{}", sel.stderr);
    let why = |e: &str| e[e.find("has no TP2").unwrap()..].trim().to_string();
    assert_eq!(why(&pre.stderr), why(&sel.stderr));
    let w = d.path().join("w.json");
    std::fs::write(&w, r#"[{"count": 1}]"#).unwrap();
    fails(
        &["predict", &p, "--workload", s(&w), "--tp", "2"],
        2,
        "not a valid workload file",
    );
}

#[test]
fn select_and_plugin_do_not_allocate() {
    use artune::fabric::Mode;
    use artune::plugin::{Context, NCCL_FUNC_ALLREDUCE};
    use artune::profile::{Query, Selection};
    let p = sample::profile();
    let ctx = Context::from_profile(&p, 4, 1, Mode::Graph, None).unwrap();
    let mut table = [[10.0f32; 3]; 7];
    let mut hits = 0u64;
    let probe = allocs();
    let v = std::hint::black_box(vec![1u8; 16]);
    assert!(
        allocs() > probe && v.len() == 16,
        "the counting allocator sees this thread's allocations"
    );
    // Building the selector allocates; asking it must not.
    let sel = p.selector();
    let before = allocs();
    for i in 0..10_000u64 {
        let bytes = (i * 4099) % (20 << 20) + 1;
        let q = Query {
            tp: 4,
            mode: Mode::Graph,
            gpus: None,
        };
        if let Selection::Chosen { bucket_bytes, .. } = sel.select(q, bytes) {
            hits += u64::from(bucket_bytes >= bytes);
        }
        let _ = unsafe { ctx.apply(NCCL_FUNC_ALLREDUCE, bytes, table.as_mut_ptr().cast(), 7, 3) };
    }
    assert_eq!(allocs() - before, 0, "select or getCollInfo allocated");
    assert!(hits > 5000);
    // The C ABI's select, answer or not (a size past the profile, a TP it lacks, a bad mode),
    // once the thread's first call has set up its error buffer.
    let path = tempfile::NamedTempFile::new().unwrap();
    p.write_atomic(path.path()).unwrap();
    let c_path = std::ffi::CString::new(path.path().to_str().unwrap()).unwrap();
    let mut h = std::ptr::null_mut();
    let mut out = std::mem::MaybeUninit::uninit();
    unsafe {
        use artune::capi::*;
        assert_eq!(artune_profile_open(c_path.as_ptr(), &mut h), ARTUNE_OK);
        artune_select(h, 4, ARTUNE_MODE_GRAPH, 4096, out.as_mut_ptr());
        let before = allocs();
        for (tp, mode, bytes) in [
            (4, 0, 4096),
            (4, 0, 1 << 40),
            (3, 0, 4096),
            (4, 7, 4096),
            (1, 0, 4096),
        ] {
            artune_select(h, tp, mode, bytes, out.as_mut_ptr());
        }
        assert_eq!(allocs() - before, 0, "artune_select allocated");
        artune_profile_close(h);
    }
}

#[test]
fn tuned_profiles_flow_through_every_consumer() {
    let d = tempfile::tempdir().unwrap();
    let topo = |preset: &str| {
        format!(
            "{}/profiles/topologies/{preset}.json",
            env!("CARGO_MANIFEST_DIR")
        )
    };
    for preset in ["pcie-8x-2switch", "nvswitch-8x"] {
        let p = d.path().join(format!("{preset}.json"));
        let p = s(&p);
        let o = artune(&["tune", "--sim", preset, "-o", p]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        let o = artune(&["select", p, "--tp", "8", "--bytes", "14336", "--json"]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        assert!(serde_json::from_str::<serde_json::Value>(&o.stdout).unwrap()["simulated"] == true);
        assert_eq!(artune(&["check", p, "--topology", &topo(preset)]).code, 0);
        for engine in ["trtllm", "vllm", "sglang", "nccl", "env"] {
            let o = artune(&[
                "export",
                p,
                "--engine",
                engine,
                "--hidden",
                "7168",
                "--allow-simulated",
            ]);
            assert_eq!(o.code, 0, "{preset} {engine}: {}", o.stderr);
            assert!(o.stdout.contains("SIMULATED PROFILE"));
        }
        let o = artune(&["why", p, "--tp", "8", "--bytes", "14336"]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        assert!(o.stdout.contains("what each engine runs here"));
        let o = artune(&[
            "predict",
            p,
            "--workload",
            "122x7168xbf16@1..16",
            "--tp",
            "8",
        ]);
        assert_eq!(o.code, 0, "{}", o.stderr);
    }
    let pcie = d.path().join("pcie-8x-2switch.json");
    fails(
        &["check", s(&pcie), "--topology", &topo("nvswitch-8x")],
        3,
        "profile is stale:",
    );
}

/// The lines of `text` from the one starting with `head` to the next TP heading.
fn block<'t>(text: &'t str, head: &str) -> Vec<&'t str> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with(head));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no `{head}` in:\n{text}"));
    std::iter::once(first)
        .chain(lines.take_while(|l| !l.starts_with("#   TP")))
        .collect()
}

#[test]
fn exports_cover_every_placement() {
    let d = tempfile::tempdir().unwrap();
    let file = common::tuned(d.path(), "p.json", &["--sim", "pcie-8x-2switch"]);
    let p = Profile::load(&file).unwrap();
    let graph = |tp: usize| -> Vec<&artune::profile::GroupProfile> {
        p.groups
            .iter()
            .filter(|g| g.tp == tp && g.mode == artune::fabric::Mode::Graph)
            .collect()
    };
    // pcie-8x-2switch tunes two placements of TP2 and of TP4.
    assert_eq!(graph(2).len(), 2);
    assert_eq!(graph(4).len(), 2);
    let ids = |g: &[usize]| {
        g.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let export = |engine: &str, out: Option<&Path>| {
        let mut args = vec!["export", s(&file), "--engine", engine, "--hidden", "7168"];
        args.push("--allow-simulated");
        if let Some(o) = out {
            args.extend(["--out", s(o)]);
        }
        let o = artune(&args);
        assert_eq!(o.code, 0, "{engine}: {}", o.stderr);
        o.stdout
    };
    let nccl = export("nccl", None);
    let sglang = export("sglang", None);
    let env = export("env", None);
    let vllm_dir = d.path().join("vllm");
    export("vllm", Some(&vllm_dir));
    let vllm = std::fs::read_to_string(vllm_dir.join("vllm.txt")).unwrap();
    let trtllm_dir = d.path().join("trtllm");
    export("trtllm", Some(&trtllm_dir));
    let trtllm = std::fs::read_to_string(trtllm_dir.join("extra-llm-api-options.yaml")).unwrap();
    for tp in [2, 4] {
        let (first, other) = (graph(tp)[0], graph(tp)[1]);
        for g in [first, other] {
            let shown = format!("GPUs {:?}", g.gpus);
            let named = format!("TP{tp} on GPUs {}", ids(&g.gpus));
            assert!(vllm.contains(&shown), "vllm lacks {shown}:\n{vllm}");
            assert!(trtllm.contains(&shown), "trtllm lacks {shown}:\n{trtllm}");
            assert!(sglang.contains(&named), "sglang lacks {named}:\n{sglang}");
            assert!(env.contains(&named), "env lacks {named}:\n{env}");
            // The NCCL plugin's bands, per placement, are that group's own: the first band
            // ends where the group's NCCL variant first changes.
            let head = format!("#   TP{tp} (graph mode, {shown})");
            let lines = block(&nccl, &head);
            let change = g
                .buckets
                .windows(2)
                .find(|w| w[0].nccl_choice != w[1].nccl_choice)
                .map(|w| w[0].bytes)
                .unwrap();
            let want = format!("up to {}:", artune::units::fmt_bytes(change));
            assert!(lines[1].contains(&want), "{want}: {lines:?}");
        }
        // The plugin cannot tell GPU sets apart: it says which placement it follows.
        assert!(
            block(
                &nccl,
                &format!("#   TP{tp} (graph mode, GPUs {:?})", other.gpus)
            )[0]
            .contains("NOT followed"),
            "{nccl}"
        );
        // vLLM is started per placement, with its own P2P cache keyed by visible index.
        let visible = format!("CUDA_VISIBLE_DEVICES={} vllm serve", ids(&other.gpus));
        assert!(vllm.contains(&visible), "{visible}:\n{vllm}");
        let cache = vllm_dir.join(format!(
            "gpu_p2p_access_cache_for_{}.json",
            ids(&other.gpus)
        ));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cache).unwrap()).unwrap();
        assert_eq!(v[format!("{}->0", tp - 1)], true, "{v}");
        assert!(v.get(format!("{tp}->0")).is_none(), "{v}");
    }
}

/// A loopback profile (every rank on one GPU) is labelled as such wherever its numbers are
/// priced: predict's header and JSON say it, as why does, not only "SIMULATED" profiles.
#[test]
fn predict_says_a_loopback_profile_is_no_multi_gpu_evidence() {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/profiles/hardware/h100/2026-12-05-speed6/warm.json"
    );
    let w = ["--tp", "8", "--workload", "122x7168xbf16@1,4,16"];
    let o = artune(&[&["predict", p][..], &w].concat());
    assert_eq!(o.code, 0, "{}", o.stderr);
    let head = o.stdout.lines().next().unwrap_or_default();
    assert!(
        head.contains("LOOPBACK") && head.contains("no time here is multi-GPU evidence"),
        "{head}"
    );
    let o = artune(&[&["predict", p, "--json"][..], &w].concat());
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(
        (v["loopback"].as_bool(), v["simulated"].as_bool()),
        (Some(true), Some(false))
    );
}

/// A TP size the profile has in the other mode is asked for in that mode, not re-tuned; one the
/// machine has too few GPUs for is never advised to be tuned (select, and the package's
/// explain, say it in the same words).
#[test]
fn a_missing_group_is_advised_by_what_would_answer() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("e.json");
    let p = p.to_str().unwrap();
    let t = artune(&["tune", "--sim", "pcie-2x", "--mode", "eager", "--out", p]);
    assert_eq!(t.code, 0, "{}", t.stderr);
    let sel = artune(&["select", p, "--tp", "2", "--bytes", "1M"]);
    assert_eq!(sel.code, 6, "{}", sel.stderr);
    assert!(
        sel.stderr.contains(
            "has no TP2 graph group (it has TP2 eager); ask for eager mode, or tune TP2 in graph mode for an answer"
        ),
        "{}",
        sel.stderr
    );
    let sel = artune(&["select", p, "--tp", "4", "--bytes", "1M", "--mode", "eager"]);
    assert_eq!(sel.code, 6, "{}", sel.stderr);
    assert!(
        sel.stderr.contains(
            "has no TP4 eager group (it has TP2 eager); the machine has 2 GPUs, so no TP4 group can be tuned on it"
        ),
        "{}",
        sel.stderr
    );
}

//! The cdylib as NCCL and C programs see it: tests/c/plugin_harness.c dlopens
//! target/<profile>/libartune.so and drives ncclTunerPlugin_v3..v7 with a real cost table;
//! tests/c/capi_harness.c compiles against src/artune.h and links the library. Skipped, with a
//! line saying so, where no C compiler (`cc`) is installed.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use artune::export::sample;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Where this build's libartune.so is. `cargo test` leaves the cdylib in target/<profile>/deps/
/// beside this test executable (only `cargo build` copies it up to target/<profile>/), so the
/// deps copy, always from this very build, comes first.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    if deps.join("libartune.so").is_file() {
        deps.to_path_buf()
    } else {
        deps.parent().unwrap_or(deps).to_path_buf()
    }
}

fn lib() -> PathBuf {
    let p = lib_dir().join("libartune.so");
    assert!(
        p.is_file(),
        "{} was not built; cargo builds the cdylib with the library",
        p.display()
    );
    p
}

/// Compiled harnesses, or None (after printing why) when there is no C compiler.
fn harnesses() -> Option<&'static (PathBuf, PathBuf)> {
    static BUILT: OnceLock<Option<(PathBuf, PathBuf)>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if Command::new("cc").arg("--version").output().is_err() {
                eprintln!("SKIPPED: no C compiler (`cc`) on PATH; the C plugin and ABI harnesses did not run");
                return None;
            }
            let dir = tempfile::tempdir().unwrap().keep();
            let plugin = dir.join("plugin_harness");
            let capi = dir.join("capi_harness");
            let cc = |args: &[&str]| {
                let out = Command::new("cc").args(args).output().unwrap();
                assert!(out.status.success(), "cc {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
            };
            let src = |f: &str| format!("{ROOT}/tests/c/{f}");
            cc(&["-std=c11", "-Wall", "-Wextra", "-Werror", "-o", plugin.to_str().unwrap(), &src("plugin_harness.c"), "-ldl"]);
            let libdir = lib_dir();
            let (inc, l, rpath) =
                (format!("-I{ROOT}/src"), format!("-L{}", libdir.display()), format!("-Wl,-rpath,{}", libdir.display()));
            cc(&["-std=c11", "-Wall", "-Wextra", "-Werror", "-Werror=implicit-function-declaration", &inc, "-o", capi.to_str().unwrap(), &src("capi_harness.c"), &l, "-lartune", &rpath]);
            Some((plugin, capi))
        })
        .as_ref()
}

/// Writes the sample profile (simulated or not) into a temporary directory.
fn profile(simulated: bool) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profile.json");
    let mut p = sample::profile();
    p.simulated = simulated;
    p.write_atomic(&path).unwrap();
    (dir, path)
}

/// The override the tests about steering set: the plugin applies the validity rule to the
/// machine it runs on, which it cannot read here (no NVML), or which is not the profile's.
const FOLLOW: (&str, &str) = ("ARTUNE_ALLOW_INVALID", "1");

/// Runs the plugin harness; returns (success, stdout, stderr = NCCL log lines).
fn plugin(
    env: &[(&str, &str)],
    n_ranks: usize,
    bytes: u64,
    expect: &str,
) -> Option<(bool, String, String)> {
    let (h, _) = harnesses()?;
    let mut cmd = Command::new(h);
    cmd.args([
        lib().to_str().unwrap(),
        &n_ranks.to_string(),
        &bytes.to_string(),
    ]);
    // "A,P CHANNELS" passes the expected channel count as a fifth argument.
    cmd.args(expect.split(' '));
    for k in [
        "ARTUNE_PROFILE",
        "ARTUNE_MODE",
        "ARTUNE_ALLOW_SIMULATED",
        "ARTUNE_ALLOW_INVALID",
        "HARNESS_FORCE",
        "NCCL_ALGO",
        "NCCL_PROTO",
    ] {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    Some((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    ))
}

#[track_caller]
fn assert_ok(r: Option<(bool, String, String)>, log_needle: &str) {
    let Some((ok, out, err)) = r else { return };
    assert!(ok, "harness failed:\n{out}\n{err}");
    for v in ["v3", "v4", "v5", "v6", "v7"] {
        assert!(out.contains(&format!("ok {v}")), "{out}");
    }
    assert!(
        err.contains(log_needle),
        "NCCL log lacks `{log_needle}`:\n{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn lowers_the_measured_fastest_entry_in_every_version() {
    let (_d, path) = profile(false);
    let p = path.to_str().unwrap();
    // 1000 bytes at TP2: ring LL (algorithm 1, protocol 0); 16 MiB: ring Simple (1, 2).
    assert_ok(
        plugin(&[("ARTUNE_PROFILE", p), FOLLOW], 2, 1000, "1,0"),
        "artune: following",
    );
    assert_ok(
        plugin(&[("ARTUNE_PROFILE", p), FOLLOW], 2, 16 << 20, "1,2"),
        "artune: following",
    );
    assert_ok(
        plugin(
            &[("ARTUNE_PROFILE", p), ("ARTUNE_MODE", "eager"), FOLLOW],
            4,
            1000,
            "1,0",
        ),
        "TP4 eager",
    );
}

/// The measurement hook through the library as NCCL loads it: `artune_tuner_force` makes
/// every tuner version lower exactly the forced entry and set its channel count, ahead of the
/// profile and with no profile at all; cleared, each version does what the profile alone does.
#[test]
fn the_measurement_override_wins_in_every_version_until_cleared() {
    let (_d, path) = profile(false);
    let p = path.to_str().unwrap();
    let forced = |r: &Option<(bool, String, String)>| {
        let Some((_, out, _)) = r else { return };
        for v in ["v3", "v4", "v5", "v6", "v7"] {
            assert!(out.contains(&format!("ok forced {v}")), "{out}");
        }
    };
    // 1000 bytes at TP2: the profile pins ring LL [1][0]; forced: tree LL128 [0][1], 6 channels.
    let r = plugin(
        &[("ARTUNE_PROFILE", p), FOLLOW, ("HARNESS_FORCE", "0,1,6")],
        2,
        1000,
        "1,0",
    );
    forced(&r);
    assert_ok(r, "artune: following");
    let r = plugin(&[("HARNESS_FORCE", "1,2,0")], 2, 1000, "untouched");
    forced(&r);
    assert_ok(r, "ARTUNE_PROFILE is not set");
}

#[test]
fn leaves_table_alone_beyond_the_profile() {
    let (_d, path) = profile(false);
    let p = path.to_str().unwrap();
    assert_ok(
        plugin(&[("ARTUNE_PROFILE", p), FOLLOW], 2, 1 << 30, "untouched"),
        "artune: following",
    );
    assert_ok(
        plugin(&[("ARTUNE_PROFILE", p), FOLLOW], 8, 1000, "untouched"),
        "no TP8 group",
    );
}

#[test]
fn missing_garbage_or_simulated_profile_falls_back_to_nccl() {
    assert_ok(
        plugin(&[], 2, 1000, "untouched"),
        "ARTUNE_PROFILE is not set",
    );
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "\u{0}\u{1}not json at all {{{").unwrap();
    assert_ok(
        plugin(
            &[("ARTUNE_PROFILE", garbage.to_str().unwrap())],
            2,
            1000,
            "untouched",
        ),
        "not a valid profile",
    );
    let missing = dir.path().join("missing.json");
    assert_ok(
        plugin(
            &[("ARTUNE_PROFILE", missing.to_str().unwrap())],
            2,
            1000,
            "untouched",
        ),
        "cannot read",
    );
    let (_d, sim) = profile(true);
    let s = sim.to_str().unwrap();
    assert_ok(
        plugin(&[("ARTUNE_PROFILE", s)], 2, 1000, "untouched"),
        "made on a simulated fabric",
    );
    assert_ok(
        plugin(
            &[
                ("ARTUNE_PROFILE", s),
                ("ARTUNE_ALLOW_SIMULATED", "1"),
                FOLLOW,
            ],
            2,
            1000,
            "1,0",
        ),
        "(SIMULATED profile)",
    );
}

/// The plugin applies the validity rule before it steers anything: a machine it cannot
/// compare is not one the profile is valid for, and the override says what it overrode.
#[test]
fn the_plugin_follows_only_a_profile_valid_here_or_says_what_overrode_it() {
    let (_d, path) = profile(false);
    let p = path.to_str().unwrap();
    let r = plugin(&[("ARTUNE_PROFILE", p)], 2, 1000, "untouched");
    assert_ok(r.clone(), "is not valid here (");
    let Some((_, _, err)) = r else { return };
    assert!(
        err.contains("set ARTUNE_ALLOW_INVALID=1 to follow it anyway; NCCL keeps its own"),
        "{err}"
    );
    let r = plugin(&[("ARTUNE_PROFILE", p), FOLLOW], 2, 1000, "1,0");
    assert_ok(r.clone(), "artune: following");
    let Some((_, _, err)) = r else { return };
    assert!(
        err.contains("; NOT valid here (")
            && err.contains("followed because ARTUNE_ALLOW_INVALID=1"),
        "{err}"
    );
    assert_ok(
        plugin(
            &[("ARTUNE_PROFILE", p), ("ARTUNE_ALLOW_INVALID", "maybe")],
            2,
            1000,
            "untouched",
        ),
        "ARTUNE_ALLOW_INVALID=maybe is none of 1, true, on, yes, 0, false, off, no",
    );
}

#[test]
fn c_abi_links_against_the_header() {
    let Some((_, capi)) = harnesses() else { return };
    let (_d, path) = profile(true);
    let missing = path.with_file_name("missing.json");
    let run_with = |tp: &str, bytes: &str, expect: &str, allow: &str| {
        let out = Command::new(capi)
            // This build's library: cargo's LD_LIBRARY_PATH, which wins over the harness's
            // rpath, may name target/<profile>/ first, where an older `cargo build` left one.
            .env("LD_LIBRARY_PATH", lib_dir())
            .args([
                path.to_str().unwrap(),
                tp,
                bytes,
                expect,
                missing.to_str().unwrap(),
            ])
            .env("ARTUNE_ALLOW_SIMULATED", allow)
            .env("ARTUNE_ALLOW_INVALID", allow)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let run = |tp: &str, bytes: &str, expect: &str| run_with(tp, bytes, expect, "0");
    assert!(run("2", "1000", "one_stage_pull").contains("one_stage_pull 7 "));
    assert!(run("2", "1000", "one_stage_pull").contains("fallback=one_stage_pull"));
    run("8", "1000", "none");
    run("2", "1073741824", "none");
    // artune_check: a simulated profile is not valid on this machine (real, or unreadable);
    // the overrides let the caller follow it, and the verdict says so.
    let text = run("2", "1000", "one_stage_pull");
    assert!(
        text.contains("check 2 not valid here (it was made on a simulated fabric"),
        "{text}"
    );
    let text = run_with("2", "1000", "one_stage_pull", "1");
    assert!(
        text.contains("check 0 NOT valid here (it was made on a simulated fabric"),
        "{text}"
    );
    // A value that is neither on nor off is off, and the verdict says so.
    let text = run_with("2", "1000", "one_stage_pull", "yes-please");
    assert!(text.contains("check 2 "), "{text}");
    assert!(
        text.contains("ARTUNE_ALLOW_INVALID=yes-please is none of"),
        "{text}"
    );
}

/// Where the profile chooses an island schedule, a C caller gets its code and, as the
/// fallback, what it runs without artune's kernels (the harness checks it is never one).
#[test]
fn c_abi_gives_a_fallback_for_an_island_choice() {
    let Some((_, capi)) = harnesses() else { return };
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("islands.json");
    let tune = common::artune(&[
        "tune",
        "--sim",
        "pcie-8x-direct-2socket",
        "--tp",
        "8",
        "--mode",
        "graph",
        "--sizes",
        "4K:4M",
        "-o",
        path.to_str().unwrap(),
    ]);
    assert!(
        tune.status.success(),
        "{}",
        String::from_utf8_lossy(&tune.stderr)
    );
    let p = artune::Profile::load(&path).unwrap();
    let b = p.groups[0]
        .buckets
        .iter()
        .find(|b| b.choice == artune::Backend::IslandTwoShot)
        .expect("an island band on the two-socket box");
    let out = Command::new(capi)
        // This build's library: cargo's LD_LIBRARY_PATH, which wins over the harness's
        // rpath, may name target/<profile>/ first, where an older `cargo build` left one.
        .env("LD_LIBRARY_PATH", lib_dir())
        .args([
            path.to_str().unwrap(),
            "8",
            &b.bytes.to_string(),
            "island_two_shot",
            path.with_file_name("missing.json").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fallback = b
        .fallback
        .expect("a fallback where an island schedule is chosen");
    assert!(
        text.contains("island_two_shot 11 ") && text.contains(&format!("fallback={fallback}")),
        "{text}"
    );
}

#[test]
fn follows_a_profile_tuned_on_the_simulated_fabric() {
    if harnesses().is_none() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("tuned.json");
    let tune = common::artune(&[
        "tune",
        "--sim",
        "pcie-8x-2switch",
        "-o",
        path.to_str().unwrap(),
    ]);
    assert!(
        tune.status.success(),
        "{}",
        String::from_utf8_lossy(&tune.stderr)
    );
    let p = artune::Profile::load(&path).unwrap();
    let ctx = artune::plugin::Context::from_profile(&p, 8, 1, artune::Mode::Graph, None).unwrap();
    let g8 = p
        .group(artune::Query {
            tp: 8,
            mode: artune::Mode::Graph,
            gpus: None,
        })
        .expect("a TP8 graph group");
    assert!(
        g8.nccl_channels.is_some(),
        "simulated profiles state NCCL's channel count"
    );
    let env = [
        ("ARTUNE_PROFILE", path.to_str().unwrap()),
        ("ARTUNE_ALLOW_SIMULATED", "1"),
        FOLLOW,
    ];
    let mut lowered = 0;
    // Every power of two and 1.5x from 1 KiB to 256 MiB, and one size beyond the profile.
    let sizes = (10..29)
        .flat_map(|k| [1u64 << k, 3u64 << (k - 1)])
        .chain([1u64 << 40]);
    for bytes in sizes {
        // What the library says this size gets, checked through the cdylib as NCCL loads it.
        let expect = match ctx.pin(bytes) {
            Ok(Some(pin)) => format!("{},{}", pin.algo, pin.proto),
            _ => "untouched".to_string(),
        };
        lowered += usize::from(expect != "untouched");
        let expect = match ctx.channels_at(bytes) {
            // The harness then also checks nChannels is set to the count the profile pins
            // there (the bucket's measured one, else the group's).
            Some(ch) if expect != "untouched" => format!("{expect} {ch}"),
            _ => expect,
        };
        assert_ok(plugin(&env, 8, bytes, &expect), "TP8 graph");
    }
    assert!(
        lowered >= 1,
        "the tuned profile should steer some of these sizes"
    );
}

#[test]
fn a_user_pin_is_left_alone_and_init_logs_the_nccl_version_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profile.json");
    let mut prof = sample::profile();
    prof.simulated = false;
    prof.environment = Some(artune::profile::Environment {
        variables: [("NCCL_P2P_LEVEL".to_string(), "SYS".to_string())].into(),
        ..Default::default()
    });
    prof.write_atomic(&path).unwrap();
    let p = path.to_str().unwrap();
    // NCCL_PROTO pins NCCL's choice: the entry the profile wants (1,0 at 1000 bytes) stays.
    let r = plugin(
        &[("ARTUNE_PROFILE", p), ("NCCL_PROTO", "LL"), FOLLOW],
        2,
        1000,
        "untouched",
    );
    assert_ok(r.clone(), "NCCL_PROTO=LL set in this process");
    let Some((_, _, err)) = r else { return };
    // Five tuner versions and a fresh context each, one process: one line of each.
    assert_eq!(err.matches("loaded by NCCL").count(), 1, "{err}");
    assert!(err.contains("loaded by NCCL of unknown version"), "{err}");
    assert_eq!(
        err.matches("differs from the profile's").count(),
        1,
        "{err}"
    );
    assert!(
        err.contains("NCCL_P2P_LEVEL=SYS when tuned, unset now"),
        "{err}"
    );
}

/// The exports name the plugin library installed with the artune that runs: PREFIX/bin/artune
/// finds PREFIX/lib/libartune.so and writes its absolute path for NCCL; with none there, the
/// bare name and what to do.
#[test]
fn the_exports_name_the_plugin_library_installed_with_artune() {
    let prefix = tempfile::tempdir().unwrap();
    let (bin, libdir) = (prefix.path().join("bin"), prefix.path().join("lib"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&libdir).unwrap();
    let place = |from: &std::path::Path, to: &std::path::Path| {
        if std::fs::hard_link(from, to).is_err() {
            std::fs::copy(from, to).unwrap();
        }
    };
    place(std::path::Path::new(common::BIN), &bin.join("artune"));
    place(&lib(), &libdir.join("libartune.so"));
    let (_d, profile) = profile(false);
    let export = || {
        let o = common::dies_with_test(bin.join("artune"))
            .args(["export", profile.to_str().unwrap(), "--engine", "nccl"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", common::text(&o.stderr));
        common::text(&o.stdout)
    };
    let want = libdir.canonicalize().unwrap().join("libartune.so");
    let text = export();
    assert!(
        text.contains(&format!("export NCCL_TUNER_PLUGIN={}\n", want.display())),
        "{text}"
    );
    std::fs::remove_file(libdir.join("libartune.so")).unwrap();
    let text = export();
    assert!(
        text.contains("export NCCL_TUNER_PLUGIN=libartune.so\n"),
        "{text}"
    );
    assert!(text.contains("was not found beside this artune"), "{text}");
}

/// The profiler harness, compiled once, or None without a C compiler (skipped by `harnesses`).
fn profiler_harness() -> Option<&'static PathBuf> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    harnesses()?;
    BUILT
        .get_or_init(|| {
            let out = tempfile::tempdir().unwrap().keep().join("profiler_harness");
            let src = format!("{ROOT}/tests/c/profiler_harness.c");
            let args = [
                "-std=c11",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-o",
                out.to_str().unwrap(),
                &src,
                "-ldl",
            ];
            let r = Command::new("cc").args(args).output().unwrap();
            assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
            Some(out)
        })
        .as_ref()
}

/// Drives ncclProfiler_v7, v6 and v5, each with its NCCL header's descriptor layout, and reads
/// back the audit summaries finalize wrote: 500 bf16 (1000 bytes) is pinned to ring LL at TP2 in the sample,
/// with 4 channels set; 16 MiB to ring Simple; 1 GiB is beyond the profile.
#[test]
fn the_profiler_audits_what_nccl_reports_through_the_headers_layout() {
    let Some(h) = profiler_harness() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut p = sample::profile();
    p.simulated = false;
    p.groups.iter_mut().for_each(|g| g.nccl_channels = Some(4));
    let path = dir.path().join("p.json");
    p.write_atomic(&path).unwrap();
    let audit = dir.path().join("audit");
    std::fs::create_dir(&audit).unwrap();
    for version in ["v7", "v6", "v5"] {
        let out = Command::new(h)
            .args([lib().to_str().unwrap(), version, "2"])
            .args([
                "500:RING:LL:2",
                "500:TREE:LL:2",
                "500:RING:LL:8",
                "gather:500",
            ])
            .args(["8388608:RING:SIMPLE:4", "536870912:RING:SIMPLE:32"])
            .env("ARTUNE_PROFILE", &path)
            .env("ARTUNE_NCCL_AUDIT", &audit)
            .env(FOLLOW.0, FOLLOW.1)
            .env_remove("NCCL_ALGO")
            .env_remove("NCCL_PROTO")
            .output()
            .unwrap();
        let (so, se) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{so}\n{se}");
        assert!(se.contains("audit: NCCL ran TREE/LL over 2 channels at 1000 bytes where the profile pins RING/LL"), "{se}");
        assert!(se.contains("audit: rank 0 of 2: 2 of 4 allreduces at pinned sizes ran as the profile pins (1 left to NCCL)"), "{se}");
    }
    let files: Vec<_> = std::fs::read_dir(&audit)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(files.len(), 3, "{files:?}");
    let mut tables = Vec::new();
    for f in files {
        let s: artune::plugin::audit::Summary =
            serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
        assert_eq!((s.allreduces, s.judged, s.agreed, s.nranks), (5, 4, 2, 2));
        assert!(s.following, "{s:?}");
        let bytes: Vec<u64> = s.sizes.iter().map(|r| r.bytes).collect();
        assert_eq!(bytes, [1000, 1000, 1000, 16 << 20, 1 << 30]);
        assert_eq!(s.sizes[3].set_channels, Some(4));
        let ran: Vec<_> = s
            .sizes
            .iter()
            .map(|r| (r.ran.as_str(), r.channels))
            .collect();
        assert_eq!(ran[..3], [("RING/LL", 2), ("TREE/LL", 2), ("RING/LL", 8)]);
        assert_eq!(s.tuner_calls, 0, "the harness never called the tuner");
        tables.push(s.profiler);
    }
    tables.sort();
    assert_eq!(
        tables,
        ["v5", "v6", "v7"],
        "each summary names the table NCCL took"
    );
}

/// A rank's switch opens the library NCCL loaded as its tuner (the same path), so the override
/// it sets is the one NCCL's getCollInfo reads there, not the rank binary's own copy.
#[test]
fn a_ranks_switch_sets_the_override_the_loaded_tuner_reads() {
    use artune::allreduce::Backend;
    use artune::fabric::cuda::nccl_ranks::switch::Switch;
    use artune::plugin::abi::TunerV6;
    use std::ffi::{c_void, CString};
    let lib = lib();
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    // NCCL's load of the tuner.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null());
    let t = unsafe { libc::dlsym(h, c"ncclTunerPlugin_v6".as_ptr()) as *const TunerV6 };
    assert!(!t.is_null());
    let t = unsafe { &*t };
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let null = std::ptr::null_mut();
    assert_eq!(unsafe { (t.init)(&mut ctx, 1, 2, 1, None, null, null) }, 0);
    let call = || {
        let mut tbl = [[40.0f32; 3]; 7];
        let mut ch = 0;
        let p = tbl.as_mut_ptr().cast();
        assert_eq!(
            unsafe { (t.get_coll_info)(ctx, 4, 1000, 1, p, 7, 3, 0, &mut ch) },
            0
        );
        (tbl, ch)
    };
    let switch = Switch::open(&lib).unwrap();
    switch.set(Backend::NcclTreeLl128, None).unwrap();
    assert_eq!(
        call(),
        (
            {
                let mut t = [[40.0f32; 3]; 7];
                t[0][1] = 0.0;
                t
            },
            0
        ),
        "tree LL128 forced in the loaded library, NCCL's own channels"
    );
    // A channel sweep's count, set per call as the plugin sets a profile's.
    switch.set(Backend::NcclRingSimple, Some(6)).unwrap();
    let (tbl, ch) = call();
    assert_eq!((tbl[0][1], tbl[1][2], ch), (40.0, 0.0, 6));
    switch.set(Backend::Nccl, None).unwrap();
    assert_eq!(call(), ([[40.0f32; 3]; 7], 0), "cleared: NCCL's own costs");
    assert_eq!(unsafe { (t.finalize)(ctx) }, 0);
}

/// An eager-only profile's NCCL export, sourced as written, makes the plugin follow it: the
/// file sets ARTUNE_MODE=eager itself (left commented, the plugin looked for graph groups the
/// profile lacks and steered nothing).
#[test]
fn an_eager_only_profiles_export_steers_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profile.json");
    let mut p = sample::profile();
    p.simulated = false;
    p.groups.retain(|g| g.mode == artune::fabric::Mode::Eager);
    p.write_atomic(&path).unwrap();
    let file = dir.path().join("nccl.env");
    let o = Command::new(env!("CARGO_BIN_EXE_artune"))
        .args([
            "export",
            path.to_str().unwrap(),
            "--engine",
            "nccl",
            "--out",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The file as a shell reads it: what it exports.
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -a; . '{}'; echo \"$ARTUNE_PROFILE|${{ARTUNE_MODE:-}}\"",
            file.display()
        ))
        .env_remove("ARTUNE_MODE")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stdout);
    let (profile, mode) = said.trim().split_once('|').unwrap();
    // What the profile's eager group pins at 1000 bytes, as select says it.
    let o = Command::new(env!("CARGO_BIN_EXE_artune"))
        .args([
            "select",
            path.to_str().unwrap(),
            "--tp",
            "2",
            "--bytes",
            "1000",
            "--mode",
            "eager",
            "--json",
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let expect = match v["nccl_variant"].as_str().unwrap() {
        "nccl_tree_ll" => "0,0",
        "nccl_tree_ll128" => "0,1",
        "nccl_tree_simple" => "0,2",
        "nccl_ring_ll" => "1,0",
        "nccl_ring_ll128" => "1,1",
        "nccl_ring_simple" => "1,2",
        _ => "untouched",
    };
    let mut env = vec![("ARTUNE_PROFILE", profile), FOLLOW];
    if !mode.is_empty() {
        env.push(("ARTUNE_MODE", mode));
    }
    assert_ok(plugin(&env, 2, 1000, expect), "TP2 eager");
}

//! `artune check --measure` through the binary: a profile re-timed on the machine it describes
//! holds, one whose chosen kernel got slower does not, one on a machine that drifts between
//! passes is undecided (exit 8), and one for other GPUs is refused.

mod common;

use common::{artune, text, tuned};

/// A small simulated profile to check: TP4 on the direct-attached box, where NCCL's defaults
/// go through host memory and the custom kernel wins at the smallest sizes beyond the model's
/// error (under one switch NCCL's ring is within it: `tune_cli`).
fn profile(dir: &std::path::Path) -> String {
    profile_seeded(dir, 1)
}

/// The same profile tuned with another seed (other noise).
fn profile_seeded(dir: &std::path::Path, seed: u64) -> String {
    let seed = seed.to_string();
    let args = [
        "--sim",
        "pcie-8x-direct-2socket",
        "--tp",
        "4",
        "--sizes",
        "4K:4M",
        "--no-contention",
        "--seed",
        &seed,
    ];
    let out = tuned(dir, &format!("p{seed}.json"), &args);
    out.to_str().unwrap().into()
}

/// A steady 3x slowdown of the chosen kernel is a changed machine: stale (3), not undecided,
/// though its passes are timed like a drifting one's.
#[test]
fn holds_on_its_machine_and_names_a_choice_that_no_longer_holds() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile(dir.path());
    let o = artune(&["check", &p, "--measure", "--sim", "pcie-8x-direct-2socket"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("holds, measured"),
        "{}",
        text(&o.stdout)
    );

    let profile = artune::profile::Profile::load(std::path::Path::new(&p)).unwrap();
    let first = profile.groups[0].buckets[0].choice;
    assert!(first.is_custom(), "{first:?}");
    let faults = format!("slow={}:3", first.id());
    let o = artune(&[
        "check",
        &p,
        "--measure",
        "--sim",
        "pcie-8x-direct-2socket",
        "--sim-faults",
        &faults,
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("no longer choose what the profile says"),
        "{err}"
    );
    let out = text(&o.stdout);
    assert!(
        out.contains(&format!("the profile chose {}", first.id())),
        "{out}"
    );
    // It names what moved: the chosen kernel about 3x (+200%) slower than when profiled.
    let line = out
        .lines()
        .find(|l| l.contains(&format!("the profile chose {}", first.id())))
        .unwrap();
    let mine = line
        .split(", ")
        .find(|part| part.starts_with(first.id()) || part.contains(&format!("; {}", first.id())))
        .unwrap_or_else(|| panic!("{first} not named in: {line}"));
    let pct: f64 = mine
        .rsplit(" (")
        .next()
        .and_then(|v| {
            v.trim_end_matches("%)")
                .trim_start_matches('+')
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no change named in: {line}"));
    assert!((150.0..250.0).contains(&pct), "{line}");
}

/// `check --measure PROFILE --sim pcie-8x-direct-2socket`, with `faults` injected if any.
fn check_measured(p: &str, faults: Option<&str>) -> std::process::Output {
    check_measured_on(p, "pcie-8x-direct-2socket", faults)
}

fn check_measured_on(p: &str, preset: &str, faults: Option<&str>) -> std::process::Output {
    let mut args = vec!["check", p, "--measure", "--sim", preset];
    if let Some(f) = faults {
        args.extend(["--sim-faults", f]);
    }
    artune(&args)
}

#[test]
fn a_machine_that_drifts_between_passes_is_undecided_not_stale() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile(dir.path());
    let profile = artune::profile::Profile::load(std::path::Path::new(&p)).unwrap();
    let first = profile.groups[0].buckets[0].choice;
    assert!(first.is_custom(), "{first:?}");
    // The kernel the profile chose at its smallest sizes runs 3x or 9x slower, alternating
    // from one timing to the next: slower than NCCL in every pass, by an amount that moves
    // more than the gain. That is a machine drifting, not one that changed.
    let faults = format!("drift={}:3", first.id());
    let o = check_measured(&p, Some(&faults));
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(8), "{out}{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // The verdict is said once, not on both streams.
    let verdict = "undecided, measured: this machine drifts too much";
    assert_eq!(
        format!("{out}{err}").matches(verdict).count(),
        1,
        "{out}{err}"
    );
    assert!(
        err.contains("undecided, measured: this machine drifts too much right now to tell")
            && err.contains("run the check again when the GPUs are quiet"),
        "{err}"
    );
    assert!(
        !out.contains("no longer") && !out.contains("holds, measured"),
        "{out}"
    );
    let undecided: Vec<&str> = out
        .lines()
        .filter(|l| l.contains(": undecided: "))
        .collect();
    assert!(!undecided.is_empty(), "{out}");
    for l in undecided {
        assert!(l.contains(&format!("the profile's {}", first.id())), "{l}");
    }
}

#[test]
fn a_fresh_profile_holds_whatever_the_seed() {
    let dir = tempfile::tempdir().unwrap();
    for seed in 1..=5 {
        let p = profile_seeded(dir.path(), seed);
        let o = check_measured(&p, None);
        let out = text(&o.stdout);
        assert_eq!(
            o.status.code(),
            Some(0),
            "seed {seed}: {out}{}",
            text(&o.stderr)
        );
        assert!(out.contains("holds, measured"), "seed {seed}: {out}");
    }
}

/// A profile of other GPUs is stale with --measure as without (exit 3, not bad input), with
/// its verdict as JSON for scripts, and the re-tune fits the machine it is checked on.
#[test]
fn a_profile_of_other_gpus_is_stale_with_its_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile(dir.path());
    for json in [false, true] {
        let mut args = vec!["check", &p, "--measure", "--sim", "pcie-2x"];
        if json {
            args.push("--json");
        }
        let o = artune(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{err}");
        assert!(err.contains("GPU count 8 → 2"), "{err}");
        if json {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(
                (v["holds"].clone(), v["measured"].clone()),
                (false.into(), true.into())
            );
            assert!(
                v["retune"]
                    .as_str()
                    .unwrap()
                    .starts_with("artune tune --sim pcie-2x"),
                "{v}"
            );
        }
    }
}

#[test]
fn a_loopback_profile_checked_without_loopback_is_told_to_add_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile(dir.path());
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    v["topology"]["origin"]["kind"] = "loopback".into();
    let gpus = v["topology"]["gpus"].as_array().unwrap().len();
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
    let o = artune(&["check", &p, "--measure", "--sim", "pcie-2x"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("virtual ranks on one GPU: add --loopback {gpus}")),
        "{err}"
    );
}

/// Runs artune with one extra variable in its environment.
fn artune_with(vars: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    common::dies_with_test(common::BIN)
        .args(args)
        .envs(vars.iter().copied())
        .output()
        .expect("artune runs")
}

#[test]
fn a_variable_the_tune_ran_with_is_recorded_shown_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let p = out.to_str().unwrap();
    let level = &[("NCCL_P2P_LEVEL", "SYS")][..];
    let args = [
        "tune",
        "--sim",
        "pcie-8x-2switch",
        "--tp",
        "8",
        "--mode",
        "graph",
        "--sizes",
        "4K:1M",
        "--no-contention",
        "--mem-budget",
        "64MiB",
        "--out",
        p,
    ];
    let o = artune_with(level, &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let said = text(&o.stdout);
    assert!(said.contains("measured with NCCL_P2P_LEVEL=SYS"), "{said}");
    assert!(said.contains("NCCL library: simulated"), "{said}");
    assert!(said.contains("memory budget: 64M per GPU"), "{said}");
    let shown = text(&artune(&["show", p]).stdout);
    assert!(
        shown.contains("measured with NCCL_P2P_LEVEL=SYS"),
        "{shown}"
    );

    // Without the variable: a note (the validity rule: software is reported, not decisive)
    // that asks for a tune under these variables, not the `--measure` that refuses to judge
    // another setup (it advised it, then refused it).
    let o = artune(&["check", p, "--sim", "pcie-8x-2switch"]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        out.contains("; NCCL_P2P_LEVEL=SYS when tuned, unset now: its times were measured under the tune's NCCL/CUDA variables; tune again under these (artune tune)"),
        "{out}"
    );
    assert!(!out.contains("--measure"), "{out}");
    for extra in [&[][..], &["--measure"][..]] {
        let mut check = vec!["check", p, "--sim", "pcie-8x-2switch"];
        check.extend_from_slice(extra);
        if !extra.is_empty() {
            let o = artune(&check);
            let err = text(&o.stderr);
            assert_eq!(o.status.code(), Some(3), "{extra:?}: {err}");
            assert!(
                err.contains("NCCL_P2P_LEVEL=SYS when tuned, unset now"),
                "{err}"
            );
        }
        // With it, the same check holds.
        let o = artune_with(level, &check);
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {}", text(&o.stderr));
    }
    // A logging variable is not a difference.
    let o = artune_with(
        &[("NCCL_P2P_LEVEL", "SYS"), ("NCCL_DEBUG", "INFO")],
        &["check", p, "--sim", "pcie-8x-2switch"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

#[test]
fn a_busy_gpu_refuses_the_tune_unless_allowed_and_the_profile_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let reading = dir.path().join("busy.json");
    std::fs::write(
        &reading,
        r#"{"gpus": [{"index": 0, "processes": [{"pid": 4242, "name": "matmul", "memory_bytes": 150323855360}],
            "utilization_pct": 98, "free_bytes": 1073741824, "total_bytes": 151397597184}]}"#,
    )
    .unwrap();
    let out = dir.path().join("p.json");
    let (r, p) = (reading.to_str().unwrap(), out.to_str().unwrap());
    let tune = |extra: &[&str]| {
        let mut args = vec![
            "tune",
            "--sim",
            "pcie-4x-1switch",
            "--tp",
            "4",
            "--mode",
            "graph",
            "--sizes",
            "4K:64K",
            "--no-contention",
            "--sim-occupancy",
            r,
            "--out",
            p,
        ];
        args.extend_from_slice(extra);
        artune(&args)
    };
    let o = tune(&[]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("GPU 0: pid 4242 (matmul) holding 140.0 GiB"),
        "{err}"
    );
    assert!(
        err.contains("1.0 GiB of 141.0 GiB free") && err.contains("--allow-busy"),
        "{err}"
    );
    assert!(!out.exists(), "a refused tune wrote a profile");

    let o = tune(&["--allow-busy"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("--allow-busy"),
        "{}",
        text(&o.stderr)
    );
    // The process the busy check warned about is not announced again as one that started.
    assert!(
        !text(&o.stderr).contains("another process started"),
        "{}",
        text(&o.stderr)
    );
    let shown = text(&artune(&["show", p]).stdout);
    assert!(
        shown.contains("BUSY GPUs allowed (--allow-busy)"),
        "{shown}"
    );
    assert!(shown.contains("pid 4242 (matmul)"), "{shown}");
    let o = artune(&["check", p, "--sim", "pcie-4x-1switch"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("measured with --allow-busy"),
        "{}",
        text(&o.stderr)
    );

    // check --measure asks the same question before re-timing.
    let check = |extra: &[&str]| {
        let mut args = vec![
            "check",
            p,
            "--measure",
            "--sim",
            "pcie-4x-1switch",
            "--sim-occupancy",
            r,
        ];
        args.extend_from_slice(extra);
        artune(&args)
    };
    let o = check(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("pid 4242"), "{}", text(&o.stderr));
    let o = check(&["--allow-busy"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // An idle reading lets both run.
    std::fs::write(
        &reading,
        r#"{"gpus": [{"index": 0, "utilization_pct": 0}]}"#,
    )
    .unwrap();
    assert_eq!(tune(&[]).status.code(), Some(0));
}

/// A neighbour that starts mid-run (here at the third look, after the first group's set-up)
/// is caught between phases: without --allow-busy the tune stops with exit 2 naming it and
/// writes nothing; with it, every group measured beside it says so and records no drift, so
/// its interference never widens what `check --measure` accepts. `check --measure` looks the
/// same way.
#[test]
fn a_neighbour_arriving_mid_tune_is_caught_and_recorded_with_its_groups() {
    let dir = tempfile::tempdir().unwrap();
    let reading = dir.path().join("arrives.json");
    let idle = r#"{"gpus": [{"index": 0, "utilization_pct": 0}]}"#;
    let busy = r#"{"gpus": [{"index": 0, "processes": [{"pid": 4242, "name": "matmul", "memory_bytes": 917504000}]}]}"#;
    std::fs::write(&reading, format!("[{idle}, {idle}, {busy}]")).unwrap();
    let out = dir.path().join("p.json");
    let (r, p) = (reading.to_str().unwrap(), out.to_str().unwrap());
    let tune = |extra: &[&str]| {
        let mut args = vec![
            "tune",
            "--sim",
            "pcie-4x-1switch",
            "--sizes",
            "4K:1M",
            "--no-contention",
            "--sim-occupancy",
            r,
            "--out",
            p,
        ];
        args.extend_from_slice(extra);
        artune(&args)
    };
    let o = tune(&[]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "another process started using the GPUs during tune (GPU 0: pid 4242 (matmul)"
        ) && err.contains("--allow-busy"),
        "{err}"
    );
    assert!(
        !out.exists(),
        "a tune stopped by a neighbour wrote a profile"
    );

    let o = tune(&["--allow-busy"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("started using the GPUs while GPUs 0,1 were measured"),
        "{err}"
    );
    let prof = artune::profile::Profile::load(&out).unwrap();
    assert!(!prof.groups.is_empty());
    for g in &prof.groups {
        assert_eq!(g.beside.len(), 1, "TP{} {}", g.tp, g.mode.id());
        assert_eq!(g.beside[0].pid, 4242);
        assert!(
            g.drift.is_empty(),
            "drift recorded beside a neighbour: {:?}",
            g.drift
        );
    }
    let shown = text(&artune(&["show", p]).stdout);
    assert!(shown.contains("BESIDE other work"), "{shown}");

    // The measured check looks between its points the same way.
    let check = |extra: &[&str]| {
        let mut args = vec![
            "check",
            p,
            "--measure",
            "--sim",
            "pcie-4x-1switch",
            "--sim-occupancy",
            r,
        ];
        args.extend_from_slice(extra);
        artune(&args)
    };
    let o = check(&[]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("during check --measure (GPU 0: pid 4242"),
        "{err}"
    );
    let o = check(&["--allow-busy"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("decisive sizes were timed beside other processes"),
        "{err}"
    );
}

/// A link that trained narrower, or links of another width, are a changed machine whether or
/// not the choices still hold on it: both checks say so (exit 3) and name the link.
#[test]
fn a_downtrained_link_is_caught_by_the_measured_check() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile(dir.path());
    let o = artune(&["topo", "--sim", "pcie-8x-direct-2socket", "--json"]);
    let same = dir.path().join("same.json");
    std::fs::write(&same, &o.stdout).unwrap();
    let check = |topo: &std::path::Path, measure: bool| {
        let mut args = vec!["check", &p, "--topology", topo.to_str().unwrap()];
        if measure {
            args.push("--measure");
        }
        artune(&args)
    };
    let o = check(&same, true);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
    // (GPUs, width, max_width, what the message names)
    let cases: [(&[usize], u8, u8, &str); 3] = [
        (&[0], 4, 16, "GPU 0 PCIe link trained at x4 of x16"),
        (&[0], 1, 1, "GPU 0 PCIe link Gen5 x16 → Gen5 x1"),
        (&[0, 1, 2, 3], 4, 4, "GPU 3 PCIe link Gen5 x16 → Gen5 x4"),
    ];
    for (gpus, width, max_width, named) in cases {
        let mut t: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&same).unwrap()).unwrap();
        for &g in gpus {
            t["gpus"][g]["pcie"]["width"] = width.into();
            t["gpus"][g]["pcie"]["max_width"] = max_width.into();
        }
        let changed = dir.path().join(format!("x{width}-{}.json", gpus.len()));
        std::fs::write(&changed, t.to_string()).unwrap();
        for measure in [false, true] {
            let o = check(&changed, measure);
            let err = text(&o.stderr);
            assert_eq!(o.status.code(), Some(3), "{measure} {named}: {err}");
            assert!(err.contains(named), "{measure}: {err}");
        }
    }
}

/// A profile tuned while NCCL ran 1.3x slower in every other run of 300 fabric calls (a host
/// whose phases outlast one size's samples) records how far it moved; checked while it stays
/// in the slow phase, it holds and says why (four GPUs under one switch from 64K, where NCCL's
/// own choice serves), and a chosen kernel made 3x slower is still named (the direct-attached
/// box, where a kernel serves the smallest).
#[test]
fn a_backend_moving_as_it_did_while_tuned_holds_and_a_slowed_kernel_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let args = |preset: &'static str, sizes: &'static str| {
        [
            "--sim",
            preset,
            "--tp",
            "4",
            "--sizes",
            sizes,
            "--no-contention",
            "--mode",
            "graph",
            "--sim-faults",
            "phases=nccl:1.3:300",
        ]
    };
    let p = tuned(
        dir.path(),
        "phases.json",
        &args("pcie-4x-1switch", "64K:4M"),
    );
    let p = p.to_str().unwrap();
    let shown = artune(&["show", p]);
    let shown = text(&shown.stdout);
    assert!(
        shown.contains("moved while tuned") && shown.contains("nccl up to 3"),
        "{shown}"
    );
    let o = check_measured_on(p, "pcie-4x-1switch", Some("slow=nccl:1.3"));
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    assert!(
        out.contains("within the variation this machine showed when tuned (")
            && out.contains("nccl by up to 3"),
        "{out}"
    );
    let p = tuned(
        dir.path(),
        "kernel.json",
        &args("pcie-8x-direct-2socket", "4K:4M"),
    );
    let p = p.to_str().unwrap();
    let profile = artune::profile::Profile::load(std::path::Path::new(p)).unwrap();
    let first = profile.groups[0].buckets[0].choice;
    assert!(first.is_custom(), "{first}");
    let o = check_measured(p, Some(&format!("slow={}:3", first.id())));
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stdout));
    assert!(
        text(&o.stdout).contains(&format!("the profile chose {}", first.id())),
        "{}",
        text(&o.stdout)
    );
}

/// `check --json` gives scripts the verdict as data, with the same exit codes: the changes
/// and the command that tunes again when stale, each re-timed point with `--measure`.
#[test]
fn check_json_gives_the_verdict_with_the_same_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let p = profile(dir.path());
    let json = |o: &std::process::Output| -> serde_json::Value {
        serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}{}", text(&o.stdout), text(&o.stderr)))
    };
    let o = artune(&["check", &p, "--sim", "pcie-8x-direct-2socket", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v = json(&o);
    assert_eq!(
        (v["holds"].clone(), v["measured"].clone()),
        (true.into(), false.into())
    );
    let o = artune(&["check", &p, "--sim", "pcie-2x", "--json"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    let v = json(&o);
    assert_eq!(v["holds"], false);
    assert!(
        v["changes"][0]
            .as_str()
            .unwrap()
            .contains("GPU count 8 → 2"),
        "{v}"
    );
    // The profile's own sizes again; its TP4 does not fit two GPUs, so TP is the default.
    assert_eq!(
        v["retune"],
        format!("artune tune --sim pcie-2x --sizes 4K:4M --out {p}")
    );
    let o = artune(&[
        "check",
        &p,
        "--measure",
        "--sim",
        "pcie-8x-direct-2socket",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v = json(&o);
    assert_eq!(v["verdict"], "holds");
    let points = v["points"].as_array().unwrap();
    assert!(!points.is_empty() && points[0]["passes"].is_array(), "{v}");
}

/// A GPU busy with work no process is named for (on the H200: the driver releasing a process
/// that had just exited) is read again, saying so, and measured once it settles; one that
/// stays busy is refused after the wait.
#[test]
fn a_settling_gpu_is_waited_for_and_one_that_stays_busy_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let busy = r#"{"index": 0, "utilization_pct": 100, "free_bytes": 1073741824,
                   "total_bytes": 151397597184}"#;
    let settling = dir.path().join("settling.json");
    std::fs::write(
        &settling,
        format!(
            r#"[{{"gpus": [{busy}]}}, {{"gpus": [{{"index": 0, "utilization_pct": 60}}]}},
               {{"gpus": [{{"index": 0, "utilization_pct": 0}}]}}]"#
        ),
    )
    .unwrap();
    let stays = dir.path().join("stays.json");
    std::fs::write(&stays, format!(r#"{{"gpus": [{busy}]}}"#)).unwrap();
    let tune = |reading: &std::path::Path| {
        artune(&[
            "tune",
            "--sim",
            "pcie-2x",
            "--mode",
            "graph",
            "--sizes",
            "4K:8K",
            "--no-contention",
            "--sim-occupancy",
            reading.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
    };
    let waiting = "waiting up to 10 s for the GPUs to settle (GPU 0 100% utilized with no \
                   process NVML names, 1.0 GiB of 141.0 GiB free)";
    let o = tune(&settling);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(err.matches(waiting).count(), 1, "{err}");
    let o = tune(&stays);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.starts_with(waiting), "{err}");
    assert!(
        err.contains("another process is using the GPUs tune would measure"),
        "{err}"
    );
}

/// Two artune processes measuring one GPU: the second waits for the first's lock, saying
/// whom it waits for, and measures once the first is done (here the first is this test,
/// holding the GPU's lock as a tune would).
#[test]
fn a_second_measurement_of_the_same_gpu_waits_for_the_first() {
    use artune::topology::lock;
    let dir = tempfile::tempdir().unwrap();
    let gpu = format!("GPU-lock-binary-{}", std::process::id());
    let reading = dir.path().join("idle.json");
    std::fs::write(
        &reading,
        format!(r#"{{"gpus": [{{"index": 0, "uuid": "{gpu}", "utilization_pct": 0}}]}}"#),
    )
    .unwrap();
    let first = lock::acquire(std::slice::from_ref(&gpu), "tune", lock::WAIT, &mut |_| {}).unwrap();
    let out = dir.path().join("p.json");
    let second = common::dies_with_test(common::BIN)
        .args([
            "tune", "--sim", "pcie-2x", "--mode", "graph", "--sizes", "4K:8K",
        ])
        .args([
            "--no-contention",
            "--sim-occupancy",
            reading.to_str().unwrap(),
        ])
        .args(["--out", out.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(
        !out.exists(),
        "the second measured while the first held the GPU"
    );
    drop(first);
    let o = second.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let pid = std::process::id();
    assert!(
        err.starts_with(&format!(
            "waiting up to 60 s for another artune (pid {pid} (tune)) to finish measuring {gpu}"
        )),
        "{err}"
    );
    assert!(out.exists());
    let _ = std::fs::remove_file(lock::path(&gpu));
}

/// `--wait 0` refuses at once, in one sentence, what the lock would wait for; the same flag
/// on `check --measure`.
#[test]
fn wait_zero_refuses_at_once_while_another_artune_measures_the_gpu() {
    use artune::topology::lock;
    let dir = tempfile::tempdir().unwrap();
    let gpu = format!("GPU-lock-wait0-{}", std::process::id());
    let reading = dir.path().join("idle.json");
    std::fs::write(
        &reading,
        format!(r#"{{"gpus": [{{"index": 0, "uuid": "{gpu}", "utilization_pct": 0}}]}}"#),
    )
    .unwrap();
    let profile = common::tuned(
        dir.path(),
        "p.json",
        &[
            "--sim",
            "pcie-2x",
            "--mode",
            "graph",
            "--sizes",
            "4K:8K",
            "--no-contention",
        ],
    );
    let first = lock::acquire(std::slice::from_ref(&gpu), "tune", lock::WAIT, &mut |_| {}).unwrap();
    let out = dir.path().join("q.json");
    let (r, o, p) = (
        reading.to_str().unwrap(),
        out.to_str().unwrap(),
        profile.to_str().unwrap(),
    );
    let tune = [
        "tune",
        "--sim",
        "pcie-2x",
        "--sizes",
        "4K:8K",
        "--sim-occupancy",
        r,
        "--out",
        o,
        "--wait",
        "0",
    ];
    let check = [
        "check",
        p,
        "--measure",
        "--sim",
        "pcie-2x",
        "--sim-occupancy",
        r,
        "--wait",
        "0",
    ];
    for (args, command) in [(&tune[..], "tune"), (&check[..], "check --measure")] {
        let started = std::time::Instant::now();
        let o = artune(args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        let pid = std::process::id();
        assert!(
            err.contains(&format!(
                "{gpu} is being measured by another artune (pid {pid} (tune)); run {command} again when it has finished, or give --wait SECONDS to wait for it"
            )),
            "{err}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
    }
    assert!(!out.exists());
    drop(first);
    let _ = std::fs::remove_file(lock::path(&gpu));
}

/// `topo` with the P2P reads and writes of `pairs` (both ways; every pair where None) refused.
fn without_p2p(dir: &std::path::Path, name: &str, pairs: Option<&[(u64, u64)]>) -> String {
    let o = artune(&["topo", "--sim", "pcie-4x-1switch", "--json"]);
    let mut t: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for p in t["pairs"].as_array_mut().unwrap() {
        let ends = (p["from"].as_u64().unwrap(), p["to"].as_u64().unwrap());
        if pairs.is_none_or(|x| x.contains(&ends) || x.contains(&(ends.1, ends.0))) {
            p["p2p"]["read"] = "no".into();
            p["p2p"]["write"] = "no".into();
        }
    }
    let path = dir.join(name);
    std::fs::write(&path, t.to_string()).unwrap();
    path.to_str().unwrap().to_string()
}

/// A profile whose kernels need P2P, checked on the same box with P2P off: the kernels cannot
/// run there, as a tune there finds, so both checks call it stale (exit 3) and name them; the
/// measured check counts each decisive size they serve as stale, never as holding.
#[test]
fn a_chosen_kernel_that_cannot_run_here_is_stale_in_both_checks() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.json");
    std::fs::write(
        &good,
        artune(&["topo", "--sim", "pcie-4x-1switch", "--json"]).stdout,
    )
    .unwrap();
    let good = good.to_str().unwrap();
    let p = tuned(
        dir.path(),
        "box.json",
        &["--topology", good, "--tp", "4", "--mode", "graph"],
    );
    let p = p.to_str().unwrap();
    let none = without_p2p(dir.path(), "none.json", None);
    let o = artune(&["check", p, "--topology", &none]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{}{err}", text(&o.stdout));
    assert!(
        err.contains("TP4 graph on GPUs 0-3 chooses") && err.contains("which cannot run here (P2P"),
        "{err}"
    );
    let o = artune(&["check", p, "--topology", &none, "--measure", "--json"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["verdict"], "stale");
    let points = v["points"].as_array().unwrap();
    let custom = |x: &&serde_json::Value| !x["chosen"].as_str().unwrap().starts_with("nccl");
    assert!(points.iter().any(|x| custom(&x)), "{points:?}");
    for x in points.iter().filter(custom) {
        assert!(x["unavailable"].as_str().unwrap().contains("P2P"), "{x}");
    }
    let text_out = artune(&["check", p, "--topology", &none, "--measure"]);
    let (out, err) = (text(&text_out.stdout), text(&text_out.stderr));
    let n = points.iter().filter(custom).count();
    assert!(
        err.contains(&format!("at {n} of them its choice cannot run here")),
        "{out}{err}"
    );
    assert!(
        out.contains("which cannot run here (P2P write is not available"),
        "{out}"
    );
    // On the box it was tuned on, both hold.
    for measure in [false, true] {
        let mut args = vec!["check", p, "--topology", good];
        if measure {
            args.push("--measure");
        }
        assert_eq!(artune(&args).status.code(), Some(0));
    }
}

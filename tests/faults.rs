//! Faults through the binary: backends that return wrong data or hang, samples slowed at
//! random, a GPU lost mid-tune, SIGINT/SIGTERM and `kill -9` during a tune. Faults are
//! injected into the simulated machine with the hidden `tune --sim-faults SPEC`.
//!
//! What must hold: a faulty backend is never chosen and every fault is reported; the tune
//! writes a whole valid profile or nothing, and an interrupted or failed tune leaves the
//! previous profile byte for byte as it was, with no temporary file beside it.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use artune::fabric::Backend;
use artune::profile::{Bucket, Profile};

use common::{text, BIN};

/// A small tune: TP2 and TP4 on the direct-attached box (NCCL's defaults go through host
/// memory across root complexes, so the kernels win beyond the model's error there), sizes
/// where every backend wins somewhere (one-stage and two-stage kernels, NCCL).
const TUNE: [&str; 8] = [
    "tune",
    "--sim",
    "pcie-8x-direct-2socket",
    "--tp",
    "2,4",
    "--sizes",
    "4K:4M",
    "--no-contention",
];

fn tune(out: &Path, faults: Option<&str>) -> Output {
    let mut c = common::dies_with_test(BIN);
    c.args(TUNE).arg("--out").arg(out);
    if let Some(f) = faults {
        c.args(["--sim-faults", f]);
    }
    c.output().expect("artune runs")
}

fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        text(&o.stderr)
    );
}

/// Files in `dir` other than the ones named.
fn others(dir: &Path, keep: &[&Path]) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !keep.contains(&p.as_path()))
        .collect()
}

/// A directory holding a previous profile; returns its path and bytes.
fn previous(dir: &Path) -> (PathBuf, Vec<u8>) {
    let path = dir.join("profile.json");
    ok(&tune(&path, None));
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

/// Every bucket of a profile, by (GPUs, mode, bytes).
fn buckets(p: &Profile) -> BTreeMap<(Vec<usize>, String, u64), &Bucket> {
    p.groups
        .iter()
        .flat_map(|g| {
            g.buckets
                .iter()
                .map(move |b| ((g.gpus.clone(), g.mode.id().to_string(), b.bytes), b))
        })
        .collect()
}

#[test]
fn faulty_backends_are_never_chosen_and_every_fault_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (clean_path, _) = previous(dir.path());
    let clean = Profile::load(&clean_path).unwrap();
    let wrong = [Backend::TwoStagePush, Backend::NcclRingSimple];
    let hang = [Backend::OneStagePush, Backend::Nccl];
    let faulty: Vec<Backend> = wrong.iter().chain(&hang).copied().collect();
    // The faults hit backends the fault-free tune chooses, so ignoring them would show.
    for b in [
        Backend::OneStagePush,
        Backend::TwoStagePush,
        Backend::NcclRingSimple,
        Backend::Nccl,
    ] {
        assert!(
            buckets(&clean).values().any(|k| k.choice == b),
            "the fault-free tune never chooses {b}; pick backends it does"
        );
    }

    let path = dir.path().join("faulty.json");
    let spec = "wrong=two_stage_push+nccl_ring_simple,hang=one_stage_push+nccl";
    let o = tune(&path, Some(spec));
    ok(&o);
    let p = Profile::load(&path).expect("a valid profile");
    let stderr = text(&o.stderr);
    let stdout = text(&o.stdout);
    assert!(p.fabric.contains(spec), "{}", p.fabric);
    // A simulated hang is reported at the deadline without waiting for it.
    assert!(
        p.settings.tuning_seconds < 10.0,
        "{}",
        p.settings.tuning_seconds
    );
    for g in &p.groups {
        for k in &g.buckets {
            assert!(
                !faulty.contains(&k.choice),
                "{:?} {} chose {}",
                g.gpus,
                k.bytes,
                k.choice
            );
            for b in &faulty {
                assert!(
                    !k.results.contains_key(b),
                    "{b} kept a timing at {}",
                    k.bytes
                );
            }
        }
        for (b, why) in wrong
            .iter()
            .map(|b| (b, "wrong result"))
            .chain(hang.iter().map(|b| {
                (
                    b,
                    "did not finish within 10.0 s (allreduce of 4096 bytes, simulated hang)",
                )
            }))
        {
            let reason = g.waived.get(b).map(String::as_str).unwrap_or("");
            assert!(
                reason.contains(why),
                "{:?} {:?} {b}: {reason:?}",
                g.gpus,
                g.mode
            );
        }
    }
    // Each faulty backend is reported once per GPU set: in the profile, live on stderr and in
    // the summary.
    let mut sets: Vec<&Vec<usize>> = p.groups.iter().map(|g| &g.gpus).collect();
    sets.dedup();
    assert!(sets.len() >= 2, "{sets:?}");
    for gpus in &sets {
        for b in &faulty {
            let line = format!("GPUs {gpus:?}: {b} disqualified: ");
            assert_eq!(
                p.faults.iter().filter(|f| f.starts_with(&line)).count(),
                1,
                "{line} in {:#?}",
                p.faults
            );
            assert!(stderr.contains(&format!("warning: {line}")), "{stderr}");
            assert!(stdout.contains(&line), "{stdout}");
        }
    }
    assert_eq!(p.faults.len(), sets.len() * faulty.len(), "{:#?}", p.faults);
}

#[test]
fn random_slowness_is_set_aside_as_outliers_and_choices_stay_sane() {
    let dir = tempfile::tempdir().unwrap();
    let (clean_path, _) = previous(dir.path());
    let clean = Profile::load(&clean_path).unwrap();
    let path = dir.path().join("spiky.json");
    ok(&tune(&path, Some("spikes=0.2:20")));
    let p = Profile::load(&path).expect("a valid profile");
    assert!(p.faults.is_empty(), "{:#?}", p.faults);

    let share = |p: &Profile| {
        let (mut out, mut all) = (0u64, 0u64);
        for k in buckets(p).values() {
            for t in k.results.values() {
                out += t.outliers as u64;
                all += (t.samples + t.outliers) as u64;
            }
        }
        out as f64 / all as f64
    };
    // One sample in five is 20 times slower: about that share is counted as outliers.
    assert!(share(&clean) < 0.08, "clean {}", share(&clean));
    assert!((0.15..0.35).contains(&share(&p)), "spiky {}", share(&p));

    let (a, b) = (buckets(&clean), buckets(&p));
    let mut compared = 0;
    for (key, k) in &b {
        let Some(c) = a.get(key) else { continue };
        compared += 1;
        // Medians are those of the fault-free run, within the noise; but a cell stopped as
        // far slower after its short first round has too few samples to set a spike aside
        // (all four spiked: 0.2^4 of such cells): it may only be reported slower, never
        // faster, and is never chosen.
        for (backend, t) in &k.results {
            if let Some(u) = c.results.get(backend) {
                if t.samples + t.outliers < artune::measure::Harness::default().min_samples {
                    assert!(t.median_us > 0.95 * u.median_us, "{key:?} {backend}: {t:?}");
                    assert_ne!(*backend, k.choice, "{key:?}: a hopeless cell chosen");
                    continue;
                }
                let dev = (t.median_us / u.median_us - 1.0).abs();
                assert!(
                    dev < 0.05,
                    "{key:?} {backend}: {} vs {}",
                    t.median_us,
                    u.median_us
                );
            }
        }
        // A different choice is only a close call: by the fault-free timings, the backend
        // chosen here costs at most 10% more than the one chosen there, beyond the model
        // bands where the rule applies them (a kernel against NCCL: the choice turns at the
        // bands' edge, and spikes move the intervals that meet there).
        if k.choice != c.choice {
            let mine = c.results[&k.choice].median_us;
            let theirs = c.results[&c.choice].median_us;
            let edge = if k.choice.is_custom() != c.choice.is_custom() {
                [&c.results[&k.choice], &c.results[&c.choice]]
                    .iter()
                    .filter_map(|t| t.model.as_ref())
                    .map(|m| (m.high / m.low).sqrt())
                    .product()
            } else {
                1.0
            };
            assert!(
                mine < theirs * 1.10 * edge,
                "{key:?}: {} {mine} vs {} {theirs}",
                k.choice,
                c.choice
            );
        }
    }
    assert!(compared > b.len() * 3 / 4, "{compared} of {}", b.len());
}

#[test]
fn a_gpu_lost_mid_tune_exits_4_with_one_line_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, before) = previous(dir.path());
    let o = tune(&path, Some("lose=1:200"));
    assert_eq!(o.status.code(), Some(4), "{}", text(&o.stderr));
    let stderr = text(&o.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: GPU 1 is no longer reachable"),
        "{stderr}"
    );
    assert!(stderr.contains("nvidia-smi"), "{stderr}");
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the previous profile changed"
    );
    assert_eq!(others(dir.path(), &[&path]), Vec::<PathBuf>::new());

    // With no previous profile, none appears.
    let fresh = dir.path().join("fresh.json");
    assert_eq!(tune(&fresh, Some("lose=0:200")).status.code(), Some(4));
    assert!(!fresh.exists());
}

#[test]
fn a_tune_where_every_backend_fails_exits_4_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, before) = previous(dir.path());
    let all: Vec<&str> = Backend::ALL.iter().map(|b| b.id()).collect();
    let o = tune(&path, Some(&format!("hang={}", all.join("+"))));
    assert_eq!(o.status.code(), Some(4), "{}", text(&o.stderr));
    let stderr = text(&o.stderr);
    let last = stderr.lines().last().unwrap_or("");
    assert!(
        last.starts_with("error: no backend could be measured on GPUs"),
        "{stderr}"
    );
    assert!(last.contains("then run again"), "{last}");
    assert!(!stderr.contains("bug in artune"), "{stderr}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(others(dir.path(), &[&path]), Vec::<PathBuf>::new());
}

#[test]
fn fault_specs_are_checked_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let out = out.to_str().unwrap();
    for (args, says) in [
        (
            vec!["tune", "--sim-faults", "hang=nccl", "--out", out],
            "--sim PRESET",
        ),
        (
            vec![
                "tune",
                "--sim",
                "pcie-2x",
                "--sim-faults",
                "hang=fast",
                "--out",
                out,
            ],
            "`fast` is not a backend",
        ),
        (
            vec![
                "tune",
                "--sim",
                "pcie-2x",
                "--sim-faults",
                "lose=2:9",
                "--out",
                out,
            ],
            "GPUs 0..1",
        ),
    ] {
        let o = common::dies_with_test(BIN).args(&args).output().unwrap();
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.contains(says), "{args:?}: {e}");
    }
    assert!(others(dir.path(), &[]).is_empty());
    let help = common::dies_with_test(BIN)
        .args(["tune", "--help"])
        .output()
        .unwrap();
    assert!(
        !text(&help.stdout).contains("sim-faults"),
        "testing-only option is hidden"
    );
}

/// Starts a tune slowed to real time (every timing call sleeps), with one hanging backend
/// so stderr shows a warning once measuring has begun.
fn slow_tune(out: &Path) -> (Child, mpsc::Receiver<String>) {
    let mut child = common::dies_with_test(BIN)
        .args(TUNE)
        .arg("--out")
        .arg(out)
        .args(["--sim-faults", "hang=nccl_ring_ll,delay=5"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

fn wait(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("artune did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    let r = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(r, 0, "kill failed");
}

#[test]
fn sigint_and_sigterm_stop_between_measurements_with_130_and_keep_the_old_profile() {
    let dir = tempfile::tempdir().unwrap();
    let (path, before) = previous(dir.path());
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let (mut child, lines) = slow_tune(&path);
        // Wait until it is measuring: the hanging backend's warning comes on its first cell.
        let first = lines
            .recv_timeout(Duration::from_secs(10))
            .expect("a warning once measuring starts");
        assert!(first.starts_with("warning: "), "{first}");
        signal(&child, sig);
        let status = wait(&mut child, Duration::from_secs(5));
        let rest: Vec<String> = lines.iter().collect();
        assert_eq!(status.code(), Some(130), "signal {sig}: {rest:?}");
        assert_eq!(rest.len(), 2, "{rest:?}");
        assert!(
            rest[0].starts_with("stopping after the current measurement"),
            "{rest:?}"
        );
        assert!(rest[1].starts_with("error: interrupted"), "{rest:?}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "signal {sig} changed the profile"
        );
        assert_eq!(others(dir.path(), &[&path]), Vec::<PathBuf>::new());
    }
}

/// A machine of `n` GPUs, eight per switch, four switches per root complex, two sockets: large
/// enough that modelling it and planning its groups take far longer than a signal may wait.
fn large_machine(n: usize) -> String {
    let switches = n / 8;
    let rcs: Vec<String> = (0..switches.div_ceil(4))
        .map(|r| format!(r#"{{"id": "rc{r}", "socket": {}}}"#, r % 2))
        .collect();
    let sws: Vec<String> = (0..switches)
        .map(|s| {
            format!(
                r#"{{"id": "sw{s}", "parent": "rc{}", "uplink": {{"gen": 5, "width": 16}}}}"#,
                s / 4
            )
        })
        .collect();
    let gpus: Vec<String> = (0..n)
        .map(|g| {
            format!(
                r#"{{"index": {g}, "name": "NVIDIA H100", "compute_capability": "9.0",
                   "memory_bytes": 85899345920, "parent": "sw{}",
                   "pcie": {{"gen": 5, "width": 16}}}}"#,
                g / 8
            )
        })
        .collect();
    format!(
        r#"{{"name": "large-{n}", "sockets": [{{"id": 0}}, {{"id": 1}}],
            "root_complexes": [{}], "switches": [{}], "gpus": [{}]}}"#,
        rcs.join(", "),
        sws.join(", "),
        gpus.join(", ")
    )
}

#[test]
fn a_signal_in_the_first_seconds_of_a_large_tune_ends_it_within_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let topo = dir.path().join("large.json");
    std::fs::write(&topo, large_machine(256)).unwrap();
    let out = dir.path().join("p.json");
    let mut child = common::dies_with_test(BIN)
        .args(["tune", "--topology"])
        .arg(&topo)
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let sent = Instant::now();
    signal(&child, libc::SIGINT);
    // Modelling 256 GPUs and planning their groups checks no token for longer than this.
    let status = wait(&mut child, Duration::from_secs(6));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(
        err.starts_with("stopping after the current measurement"),
        "{err}"
    );
    assert!(err.contains("error: interrupted"), "{err}");
    assert!(!out.exists(), "a profile was written");
    eprintln!("ended {:.1} s after SIGINT", sent.elapsed().as_secs_f64());
}

#[test]
fn kill_9_at_any_point_leaves_a_whole_profile() {
    let dir = tempfile::tempdir().unwrap();
    let (path, before) = previous(dir.path());
    // A fault-free tune runs for a fraction of a second; kill it at points spread over it,
    // writing included, and once mid-way through a slowed one.
    let spent = Instant::now();
    ok(&tune(&dir.path().join("timing.json"), None));
    let whole = spent.elapsed();
    std::fs::remove_file(dir.path().join("timing.json")).unwrap();
    let mut kept_old = 0;
    for i in 0..12u32 {
        let mut child = common::dies_with_test(BIN)
            .args(TUNE)
            .arg("--out")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(whole * i / 10);
        signal(&child, libc::SIGKILL);
        let _ = wait(&mut child, Duration::from_secs(5));
        let now = std::fs::read(&path).unwrap();
        if now == before {
            kept_old += 1;
        } else {
            Profile::load(&path).expect("a whole new profile");
        }
        // A kill between creating and renaming the temporary file can leave it behind; it
        // never replaces the profile.
        for p in others(dir.path(), &[&path]) {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                name.starts_with(".artune-") && name.ends_with(".tmp"),
                "{name}"
            );
            std::fs::remove_file(p).unwrap();
        }
    }
    assert!(kept_old > 0, "no kill came before the write");
    let current = std::fs::read(&path).unwrap();
    let (mut child, lines) = slow_tune(&path);
    lines.recv_timeout(Duration::from_secs(10)).unwrap();
    signal(&child, libc::SIGKILL);
    let _ = wait(&mut child, Duration::from_secs(5));
    assert_eq!(std::fs::read(&path).unwrap(), current);
    assert!(others(dir.path(), &[&path]).is_empty());
}

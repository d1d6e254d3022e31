//! Output locations through the binary: a device, FIFO or socket is refused in one sentence
//! naming its flag, a symlink's target is replaced and the link kept, and every location is
//! checked before anything is measured.

mod common;

use common::{artune, text};

const TUNE: [&str; 10] = [
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
];

fn tune(extra: &[&str]) -> std::process::Output {
    let mut args = TUNE.to_vec();
    args.extend_from_slice(extra);
    artune(&args)
}

#[test]
fn a_device_or_fifo_is_refused_and_left_as_it_was() {
    use std::os::unix::fs::FileTypeExt;
    let o = tune(&["--out", "/dev/null"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("error: --out /dev/null: it is a character device"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());

    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo only creates a node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let p = dir.path().join("p.json");
    for args in [
        vec!["--out", fifo.to_str().unwrap()],
        vec![
            "--out",
            p.to_str().unwrap(),
            "--plot",
            fifo.to_str().unwrap(),
        ],
    ] {
        let o = tune(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("a FIFO"), "{err}");
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    }
    let o = tune(&["--out", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = artune(&[
        "export",
        p.to_str().unwrap(),
        "--engine",
        "env",
        "-o",
        fifo.to_str().unwrap(),
    ]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("error: --out ") && err.contains("a FIFO"),
        "{err}"
    );
}

#[test]
fn a_symlinked_out_replaces_its_target_and_stays_a_link() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("real.json");
    std::fs::write(&target, r#"{"schema_version": 0}"#).unwrap();
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink("real.json", &link).unwrap();
    let o = tune(&["--out", link.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    let now = std::fs::read_to_string(&target).unwrap();
    assert!(
        now.contains("tool_version"),
        "the target kept the old profile: {now}"
    );
}

#[test]
fn an_unwritable_plot_is_found_before_measuring_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let p = dir.path().join("p.json");
    std::fs::write(&p, r#"{"schema_version": 0}"#).unwrap();
    let o = tune(&[
        "--out",
        p.to_str().unwrap(),
        "--plot",
        file.to_str().unwrap(),
    ]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.starts_with("error: --plot "), "{err}");
    assert_eq!(
        std::fs::read_to_string(&p).unwrap(),
        r#"{"schema_version": 0}"#
    );
}

/// A directory no file can be created in (/proc) is named with the reason alone: no path of
/// artune's own probe file, which the user never asked for, and not the probe's "No such file".
#[test]
fn an_unwritable_out_directory_is_named_with_the_reason_only() {
    let o = tune(&["--out", "/proc/p.json"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(
        err.trim_end(),
        "error: --out /proc/p.json: /proc cannot be written: it takes no new files; choose a \
         writable location"
    );
}

/// Runs artune, expects bad input in one sentence holding `needle`, and returns it.
fn refused(args: &[&str], needle: &str) -> String {
    let o = artune(args);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(needle), "{args:?}: {err}");
    err
}

/// A file that is not artune's is never replaced without `--force`: not by a tune, an export,
/// fleet's metrics, nor plots; artune's own files (a profile of an older version, an export)
/// are replaced as before.
#[test]
fn a_file_artune_did_not_write_is_never_replaced_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let at = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let notes = at("notes.txt");
    std::fs::write(&notes, "my notes\n").unwrap();
    let err = refused(
        &[&TUNE[..], &["--out", &notes]].concat(),
        "that file is not an artune profile and this would replace it",
    );
    assert!(err.contains("--force"), "{err}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my notes\n");

    // Another version's profile is artune's: a tune replaces it.
    let profile = at("p.json");
    std::fs::write(
        &profile,
        r#"{"schema_version": 0, "tool_version": "0.0.1"}"#,
    )
    .unwrap();
    assert!(tune(&["--out", &profile]).status.success());
    // A newer artune's profile is kept: this one would replace it with less than it records,
    // and reading it advises no tune into it.
    let newer = at("newer.json");
    let future = std::fs::read_to_string(&profile).unwrap().replacen(
        "\"schema_version\": 1",
        "\"schema_version\": 9",
        1,
    );
    std::fs::write(&newer, &future).unwrap();
    refused(
        &[&TUNE[..], &["--out", &newer]].concat(),
        "that file is a newer artune's profile (schema version 9), and this would replace it \
         with an older one; choose another path, or pass --force",
    );
    assert_eq!(std::fs::read_to_string(&newer).unwrap(), future);
    let err = refused(&["show", &newer], "newer than this artune reads");
    assert!(
        err.contains("upgrade artune") && !err.contains("--out"),
        "{err}"
    );
    // An export replaces its own file, and not the notes.
    let export = [
        "export",
        &profile,
        "--engine",
        "nccl",
        "--allow-simulated",
        "--out",
    ];
    let env = at("nccl.env");
    for _ in 0..2 {
        let o = artune(&[&export[..], &[&env]].concat());
        assert!(o.status.success(), "{}", text(&o.stderr));
    }
    refused(&[&export[..], &[&notes]].concat(), "not an artune export");
    refused(
        &["fleet", dir.path().to_str().unwrap(), "--prom", &notes],
        "not artune's metrics",
    );
    // A plot's name on a file that is no plot: neither replaced nor removed.
    let plots = at("plots");
    std::fs::create_dir(&plots).unwrap();
    let fake = format!("{plots}/tp9-gpus0_1.svg");
    std::fs::write(&fake, "not a plot").unwrap();
    refused(
        &[&TUNE[..], &["--out", &profile, "--plot", &plots]].concat(),
        "not an SVG plot",
    );
    assert_eq!(std::fs::read_to_string(&fake).unwrap(), "not a plot");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my notes\n");

    let o = tune(&["--out", &notes, "--force"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(std::fs::read_to_string(&notes)
        .unwrap()
        .contains("schema_version"));
}

/// "Not a valid profile" advice fits the file: a topology file is passed as --topology, a file
/// that is not JSON is not to be tuned over, a profile of another version is.
#[test]
fn advice_about_a_file_that_is_no_profile_fits_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let at = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let topo = at("box.json");
    let o = artune(&["topo", "--sim", "pcie-2x", "--json"]);
    std::fs::write(&topo, &o.stdout).unwrap();
    let err = refused(&["show", &topo], "it is a topology file");
    let tune_over = format!("--out {topo}");
    assert!(
        err.contains(&format!("--topology {topo}")) && !err.contains(&tune_over),
        "{err}"
    );
    let notes = at("notes.txt");
    std::fs::write(&notes, "my notes\n").unwrap();
    let err = refused(&["show", &notes], "it is not valid JSON");
    assert!(!err.contains("--out"), "{err}");
    let old = at("old.json");
    std::fs::write(&old, r#"{"schema_version": 0}"#).unwrap();
    refused(
        &["show", &old],
        &format!("run `artune tune --out {old}` to write a new one"),
    );
}

/// A tune never writes its profile over the topology file it reads, not even with --force
/// (which would leave neither); and an empty file at --out (made by `touch` or `install` before
/// the tune) holds nothing to lose, so a tune fills it, as it replaces a profile cut short.
#[test]
fn a_tune_keeps_its_topology_file_and_fills_an_empty_out() {
    let dir = tempfile::tempdir().unwrap();
    let at = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let topo = at("t.json");
    let body = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("docs/topologies/8x-one-switch-as-read.json"),
    )
    .unwrap();
    std::fs::write(&topo, &body).unwrap();
    for force in [&[][..], &["--force"][..]] {
        let args = [
            &["tune", "--topology", &topo, "--tp", "2", "--out", &topo][..],
            force,
        ]
        .concat();
        refused(&args, "that is the topology file being read");
        assert_eq!(std::fs::read_to_string(&topo).unwrap(), body, "{force:?}");
    }
    let empty = at("empty.json");
    std::fs::write(&empty, "").unwrap();
    let o = tune(&["--out", &empty]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(artune::profile::Profile::load(std::path::Path::new(&empty)).is_ok());
    // A profile cut short (show calls it truncated) is artune's file: a tune replaces it.
    let cut = at("cut.json");
    let whole = std::fs::read(&empty).unwrap();
    std::fs::write(&cut, &whole[..1000]).unwrap();
    assert!(text(&artune(&["show", &cut]).stderr).contains("truncated"));
    let o = tune(&["--out", &cut]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(artune::profile::Profile::load(std::path::Path::new(&cut)).is_ok());
}

/// A tune whose standard output fails (a full disk) after the profile is written says the
/// profile was written and exits 5 (done, with a warning), not 2 as if nothing had happened.
#[test]
fn a_summary_that_cannot_be_printed_is_a_warning_after_the_write() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: no /dev/full here");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.json");
    let mut args = TUNE.to_vec();
    args.extend_from_slice(&["--out", p.to_str().unwrap()]);
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_artune"))
        .args(&args)
        .stdout(full)
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(
        err.contains(&format!(
            "warning: {} was written, but cannot write to standard output",
            p.display()
        )),
        "{err}"
    );
    assert!(artune::profile::Profile::load(&p).is_ok());
}

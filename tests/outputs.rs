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
    std::fs::write(&target, "old").unwrap();
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
        now.contains("schema_version"),
        "the target kept the old profile: {now}"
    );
}

#[test]
fn an_unwritable_plot_is_found_before_measuring_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let p = dir.path().join("p.json");
    std::fs::write(&p, "previous").unwrap();
    let o = tune(&[
        "--out",
        p.to_str().unwrap(),
        "--plot",
        file.to_str().unwrap(),
    ]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.starts_with("error: --plot "), "{err}");
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "previous");
}

//! Helpers shared by the tests that run the artune binary. Each test file that needs them
//! says `mod common;`; not every file uses every helper.
#![allow(dead_code)]

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Output, Stdio};

/// The binary under test, built by cargo for this test run.
pub const BIN: &str = env!("CARGO_BIN_EXE_artune");

/// Runs artune with `args` and collects its output.
pub fn artune(args: &[&str]) -> Output {
    dies_with_test(BIN)
        .args(args)
        .output()
        .expect("artune runs")
}

/// Runs `artune tune ARGS --out DIR/NAME`, which must succeed, and returns the profile's path.
pub fn tuned(dir: &std::path::Path, name: &str, args: &[&str]) -> std::path::PathBuf {
    let out = dir.join(name);
    let mut all = vec!["tune", "--out", out.to_str().unwrap()];
    all.extend_from_slice(args);
    let o = artune(&all);
    assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
    out
}

/// Lossy UTF-8 of captured output.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Fails if stderr shows a panic or a backtrace: errors must be one sentence.
pub fn assert_no_panic(stderr: &str) {
    assert!(
        !stderr.contains("panicked") && !stderr.to_lowercase().contains("backtrace"),
        "{stderr}"
    );
}

/// Runs artune with standard output on a pipe whose reader is already closed, as in
/// `artune ... | true` when `true` has exited: the first write fails with EPIPE.
pub fn with_closed_stdout(args: &[&str]) -> Output {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe(2) failed");
    // SAFETY: pipe(2) just returned these descriptors; each is owned exactly once here.
    let (reader, writer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(reader);
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .expect("artune runs")
}

/// `program` to run from a test, dying with the test binary (SIGKILL when its parent exits),
/// so a test killed at a time bound leaves no `artune tune` on the GPU.
pub fn dies_with_test(program: impl AsRef<std::ffi::OsStr>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(program);
    // SAFETY: prctl is async-signal-safe and touches only the forked child.
    unsafe {
        c.pre_exec(
            || match libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            },
        );
    }
    c
}

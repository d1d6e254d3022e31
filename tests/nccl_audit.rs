//! `artune check --nccl-audit` through the binary where no GPU is needed: what it refuses
//! before running NCCL, each in one sentence with its exit code.

mod common;

use common::{artune, assert_no_panic, text};

#[test]
fn refuses_a_tp_size_the_profile_lacks_and_clashing_flags() {
    let dir = tempfile::tempdir().unwrap();
    let p = common::tuned(dir.path(), "p.json", &["--sim", "pcie-4x-1switch"]);
    let p = p.to_str().unwrap();
    let o = artune(&["check", p, "--nccl-audit", "--tp", "8"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("has no TP8 group"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_no_panic(&err);
    let o = artune(&["check", p, "--nccl-audit", "--measure"]);
    assert_eq!(o.status.code(), Some(2));
    let o = artune(&["check", p, "--tp", "2"]);
    assert_eq!(o.status.code(), Some(2), "--tp needs --nccl-audit");
}

#[test]
fn without_nccl_or_a_gpu_it_says_so_in_one_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let p = common::tuned(dir.path(), "p.json", &["--sim", "pcie-4x-1switch"]);
    let o = common::dies_with_test(common::BIN)
        .args(["check", p.to_str().unwrap(), "--nccl-audit", "--tp", "2"])
        .env("ARTUNE_NCCL_LIB", dir.path().join("no-such-libnccl.so.2"))
        .output()
        .unwrap();
    let err = text(&o.stderr);
    // Without a GPU that is what it says (bad input, exit 2: installing NCCL would not help);
    // with one, the missing NCCL (a hardware or driver failure, exit 4).
    if artune::fabric::cuda::visible_gpus() == 0 {
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("no GPU is visible"), "{err}");
    } else {
        assert_eq!(o.status.code(), Some(4), "{err}");
        assert!(err.contains("ARTUNE_NCCL_LIB="), "{err}");
    }
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_no_panic(&err);
}

//! NCCL timed by K rank processes in loopback: the fabric's `time` and `verify` go to them
//! (played by a script), not to the workers' one-rank NCCL.

use super::*;
use crate::fabric::cuda::nccl_ranks::ranked::testing;
use crate::fabric::{Fabric, Mode, Verification};

#[test]
fn loopback_nccl_is_timed_in_samples_and_verified_by_its_k_ranks() {
    let world = Shared::default();
    let mut f = fabric(2, &world);
    let d = tempfile::tempdir().unwrap();
    f.ranked = Some(testing::ranked(d.path(), 2000, 1));
    let t = f.time(Backend::NcclRingSimple, 1024, Mode::Graph, 7, 4);
    assert_eq!(t.unwrap(), [1001.5, 1002.5, 1003.5, 1004.5]);
    assert_eq!(
        f.verify(Backend::Nccl, 1024, 1).unwrap(),
        Verification::Correct
    );
    let v = f.verify(Backend::NcclRingSimple, 2000, 1).unwrap();
    assert!(
        matches!(&v, Verification::Wrong { reason } if reason.contains("wrong sum")),
        "{v:?}"
    );
    assert_eq!(testing::starts(d.path()).len(), 3);
}

/// Where the K ranks run NCCL but not from a CUDA graph, graph mode's NCCL times are their
/// eager ones, and the fabric line (the profile's, and `why`'s first line) says so once.
#[test]
fn eager_times_standing_in_for_graph_are_said_in_the_fabric_line() {
    let world = Shared::default();
    let mut f = fabric(2, &world);
    let d = tempfile::tempdir().unwrap();
    f.ranked = Some(testing::ranked(d.path(), 0, 0));
    let t = f.time(Backend::NcclRingSimple, 1024, Mode::Graph, 1, 2);
    assert_eq!(t.unwrap(), [1.5, 2.5]);
    f.time(Backend::Nccl, 1024, Mode::Graph, 1, 2).unwrap();
    let line = f.info().description;
    let said = line.matches("; graph mode's NCCL times are eager").count();
    assert_eq!(said, 1, "{line}");
}

/// A variant NCCL did not run under the tuner's switch is said in the fabric line, once, with
/// what ran instead; its times are its own pinned ranks'.
#[test]
fn a_variant_nccl_did_not_follow_is_said_in_the_fabric_line() {
    let world = Shared::default();
    let mut f = fabric(2, &world);
    let d = tempfile::tempdir().unwrap();
    f.ranked = Some(testing::switched(d.path(), 0, 1, "nccl_tree_ll"));
    let t = f.time(Backend::NcclTreeLl, 1024, Mode::Eager, 1, 2);
    assert_eq!(t.unwrap(), [1.5, 2.5]);
    f.time(Backend::NcclTreeLl, 4096, Mode::Eager, 1, 2)
        .unwrap();
    let line = f.info().description;
    let note = "; NCCL did not run nccl_tree_ll under artune's tuner switch (NCCL ran \
                RING/SIMPLE at 1024 bytes where the tuner forced TREE/LL)";
    let said = line.matches(note).count();
    assert_eq!(said, 1, "{line}");
}

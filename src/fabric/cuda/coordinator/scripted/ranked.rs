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
    f.ranked = Some(testing::ranked(d.path(), 2048, 0));
    let t = f.time(Backend::NcclRingSimple, 1024, Mode::Graph, 7, 4);
    assert_eq!(t.unwrap(), [1001.5, 1002.5, 1003.5, 1004.5]);
    assert_eq!(
        f.verify(Backend::Nccl, 1024, 1).unwrap(),
        Verification::Correct
    );
    let v = f.verify(Backend::NcclRingSimple, 2048, 1).unwrap();
    assert!(
        matches!(&v, Verification::Wrong { reason } if reason.contains("wrong sum")),
        "{v:?}"
    );
    assert_eq!(testing::starts(d.path()).len(), 3);
}

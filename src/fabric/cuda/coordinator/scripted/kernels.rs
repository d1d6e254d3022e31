//! The kernels the workers loaded reach the profile: what artune's allreduce inside an engine
//! compares its own kernels with.

use super::*;
use crate::allreduce::Mode;
use crate::fabric::Fabric;

#[test]
fn a_tune_records_the_kernel_images_its_workers_loaded() {
    let world = Shared::default();
    let mut f = fabric(2, &world);
    let opts = crate::tune::Options {
        tp: vec![2],
        min_bytes: 4 << 10,
        max_bytes: 16 << 10,
        modes: vec![Mode::Graph],
        contention: false,
        placements_per_tp: 1,
        ..crate::tune::Options::default()
    };
    let p = crate::tune::run(&mut f, &opts, &mut |_| {}).unwrap();
    assert_eq!(p.kernels, vec![scripted_images().into()]);
    assert_eq!(p.kernels[0].target, "sm_90");
    assert_eq!(p.kernels[0].programs[0].program, "allreduce.cu");
    // The profile keeps the fabric's hashes as they were loaded.
    let loaded = &scripted_images().programs[0];
    assert_eq!(p.kernels[0].programs[0].source_sha256, loaded.source_sha256);
    assert_eq!(p.kernels[0].programs[0].image_sha256, loaded.image_sha256);
    // What a reader checks: the file round-trips with them.
    let back = crate::profile::Profile::parse(&p.to_json()).unwrap();
    assert_eq!(back.kernels, p.kernels);
    f.release().unwrap();
}

//! A group's buffers (connect.rs): every owner sets up at once where each has its GPU; in
//! loopback, where they share one, the memory the first measured alone stands for all; and
//! every launcher opens its peers' buffers at the same time.

use super::*;
use crate::fabric::{Fabric, Readiness};

#[test]
fn in_loopback_the_memory_counted_is_what_the_first_owner_measured_alone() {
    let world = Shared::default();
    let mut f = fabric(4, &world);
    let r = f.prepare(&group(4), &[CUSTOM[0]]).unwrap();
    // The scripted owner i measures 1 MiB + i x 4 KiB: the others' figures are dropped.
    let Readiness::Ready { memory, .. } = &r[0] else {
        panic!("not ready: {r:?}")
    };
    assert!(memory.measured);
    assert_eq!(memory.bytes_per_gpu, 1 << 20);
    f.release().unwrap();
    // On GPUs of their own every owner's figure counts: one batch, all measured.
    let reqs = |n: usize| -> Vec<(usize, Req)> { (0..n).map(|w| (w, Req::Release)).collect() };
    let own = crate::fabric::cuda::coordinator::connect::setup_batches(reqs(4), false);
    assert_eq!((own.len(), own[0].0.len(), own[0].1), (1, 4, true));
    let shared = crate::fabric::cuda::coordinator::connect::setup_batches(reqs(4), true);
    let sizes: Vec<(usize, bool)> = shared.iter().map(|(b, m)| (b.len(), *m)).collect();
    assert_eq!(sizes, vec![(1, true), (3, false)]);
    let one = crate::fabric::cuda::coordinator::connect::setup_batches(reqs(1), true);
    assert_eq!((one.len(), one[0].1), (1, true));
}

#[test]
fn every_launcher_is_asked_to_connect_before_any_answers() {
    let world = Shared::default();
    // The scripted fabric launches each rank from its own worker: 3 launchers.
    let mut f = fabric(3, &world);
    world.lock().unwrap().plot.connect_together = Some(3);
    f.prepare(&group(3), &[CUSTOM[0]]).unwrap();
    let w = world.lock().unwrap();
    assert_eq!(w.connecting, 3);
    assert!(
        !w.connected_alone,
        "a launcher was asked only after another answered"
    );
    drop(w);
    f.release().unwrap();
}

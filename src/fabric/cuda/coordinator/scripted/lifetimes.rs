//! The order of map, close and free for setup, probe growth, release after a failed setup,
//! teardown, and workers replaced mid-group.

use super::*;
use crate::fabric::{Backend, Direction, Fabric};

#[test]
fn setup_then_release_closes_every_map_before_any_free() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.prepare(&group(3), &CUSTOM).unwrap();
    let l = log(&world);
    // Each of 3 launchers maps the 2 other ranks' in, out and 2 x (scratch, signal).
    assert_eq!(count(&l, |e| matches!(e, Ev::Map(..))), 3 * 2 * 6);
    assert_eq!(count(&l, |e| matches!(e, Ev::Free(..))), 0);
    f.release().unwrap();
    let l = log(&world);
    let (freed, left) = check(&l).unwrap();
    assert_eq!(freed.len(), 3 * 6);
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_growing_probe_closes_the_old_buffers_on_every_peer_before_their_owners_free_them() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.prepare(&group(3), &CUSTOM).unwrap();
    f.probe(Direction::Read, 1, 4096).unwrap();
    let before = log(&world).len();
    f.probe(Direction::Read, 1, 1 << 20).unwrap();
    let l = log(&world);
    let growth = &l[before..];
    // The first probe's src and dst of 3 ranks and rank 0's latch, freed in the growth.
    assert_eq!(
        count(growth, |e| matches!(e, Ev::Free(..))),
        7,
        "{growth:?}"
    );
    check(&l).unwrap();
    f.release().unwrap();
    let (_, left) = check(&log(&world)).unwrap();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn release_after_a_failed_setup_closes_the_maps_that_were_made() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    // Workers 0 and 1 connect (mapping their peers' buffers), worker 2 fails.
    world.lock().unwrap().plot.fail = Some((2, "Connect"));
    assert!(f.prepare(&group(3), &CUSTOM).is_err());
    let l = log(&world);
    assert_eq!(count(&l, |e| matches!(e, Ev::Map(..))), 2 * 2 * 6);
    world.lock().unwrap().plot.fail = None;
    f.release().unwrap();
    let (freed, left) = check(&log(&world)).unwrap();
    assert_eq!(freed.len(), 3 * 6);
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_worker_replaced_mid_group_leaves_no_map_of_the_old_buffers() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.prepare(&group(3), &CUSTOM).unwrap();
    f.probe(Direction::Write, 2, 4096).unwrap();
    // Worker 1 dies when asked to stage data: every worker is replaced, the group set up
    // again (with the backend) and the verification runs again on the fresh workers.
    world.lock().unwrap().plot.die = Some((1, "Stage"));
    assert_eq!(
        f.verify(Backend::OneStagePull, 4096, 1).unwrap(),
        crate::fabric::Verification::Correct
    );
    assert_eq!(world.lock().unwrap().workers, 6);
    let l = log(&world);
    // The new workers (3..6) map only each other's buffers.
    for e in &l {
        if let Ev::Map(w, h) = e {
            let owner: usize = h[1..h.find('-').unwrap()].parse().unwrap();
            assert_eq!(*w >= 3, owner >= 3, "worker {w} maps {h}");
        }
    }
    // Both backends again: in, out and 2 x (scratch, signal) of the 2 other ranks.
    assert_eq!(
        count(&l, |e| matches!(e, Ev::Map(w, _) if *w >= 3)),
        3 * 2 * 6
    );
    check(&l).unwrap();
    f.verify(Backend::TwoStagePull, 4096, 1).unwrap();
    f.release().unwrap();
    let l = log(&world);
    // All three old workers ended (their buffers went with them); the new ones freed theirs.
    assert_eq!(count(&l, |e| matches!(e, Ev::Exit(w) if *w < 3)), 3);
    let (_, left) = check(&l).unwrap();
    assert!(left.is_empty(), "{left:?}");
}

/// Workers that ended.
fn exits(log: &[Ev]) -> usize {
    count(log, |e| matches!(e, Ev::Exit(_)))
}

#[test]
fn a_worker_killed_once_keeps_its_backend_which_is_timed_again_on_fresh_workers() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.prepare(&group(3), &CUSTOM).unwrap();
    // Worker 1 dies (as under `kill -9`) while timing one_stage_pull at 4 KiB.
    world.lock().unwrap().plot.die = Some((1, "Time"));
    let t = f
        .time(
            Backend::OneStagePull,
            4096,
            crate::fabric::Mode::Graph,
            2,
            3,
        )
        .unwrap();
    assert_eq!(t.len(), 3);
    assert_eq!(world.lock().unwrap().workers, 6, "one restart");
    let r = f.recoveries();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].backend, Some(Backend::OneStagePull));
    assert!(r[0].kept, "{r:?}");
    assert_eq!(r[0].bytes, Some(4096));
    assert!(r[0].cause.contains("scripted 1"), "{}", r[0].cause);
    assert!(
        r[0].to_string()
            .contains("with one_stage_pull, which was measured again at 4K"),
        "{}",
        r[0]
    );
    // Still ready on the fresh workers, as is the other backend.
    f.time(
        Backend::OneStagePull,
        1 << 20,
        crate::fabric::Mode::Eager,
        2,
        3,
    )
    .unwrap();
    f.time(
        Backend::TwoStagePull,
        4096,
        crate::fabric::Mode::Graph,
        2,
        3,
    )
    .unwrap();
    assert_eq!(world.lock().unwrap().workers, 6);
    f.release().unwrap();
    let l = log(&world);
    assert_eq!(exits(&l), 3, "only the first workers ended");
    check(&l).unwrap();
}

#[test]
fn a_backend_that_kills_its_worker_again_on_fresh_workers_is_failed() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.prepare(&group(3), &CUSTOM).unwrap();
    // Whichever worker serves slot 1 dies whenever it is asked to time: the backend's fault.
    world.lock().unwrap().plot.die_in_slot = Some((1, "Time"));
    let e = f
        .time(
            Backend::OneStagePull,
            4096,
            crate::fabric::Mode::Graph,
            2,
            3,
        )
        .unwrap_err();
    assert!(e.backend_local(), "{e}");
    assert!(
        e.to_string()
            .contains("it failed again after its workers were killed"),
        "{e}"
    );
    assert_eq!(world.lock().unwrap().workers, 9, "two restarts");
    let r = f.recoveries();
    assert_eq!(r.len(), 2, "{r:?}");
    assert!(r[0].kept && !r[1].kept, "{r:?}");
    assert!(r
        .iter()
        .all(|x| x.backend == Some(Backend::OneStagePull) && x.bytes == Some(4096)));
    assert!(
        r[1].to_string()
            .contains("without one_stage_pull, which failed again"),
        "{}",
        r[1]
    );
    // Left out of the group; the other backend is measured on (slot 1 dies only when timing,
    // so verify it).
    assert!(matches!(
        f.verify(Backend::OneStagePull, 4096, 1),
        Err(crate::fabric::FabricError::BadRequest(_))
    ));
    assert_eq!(
        f.verify(Backend::TwoStagePull, 4096, 1).unwrap(),
        crate::fabric::Verification::Correct
    );
    f.release().unwrap();
    check(&log(&world)).unwrap();
}

#[test]
fn a_probe_after_a_failed_probe_connect_closes_every_map_before_any_free() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.prepare(&group(3), &CUSTOM).unwrap();
    // Workers 0 and 1 map the probe buffers; worker 2 fails to.
    world.lock().unwrap().plot.fail = Some((2, "ProbeConnect"));
    assert!(f.probe(Direction::Read, 1, 4096).is_err());
    let l = log(&world);
    let probe_maps = |l: &[Ev]| count(l, |e| matches!(e, Ev::Map(_, h) if h.contains("probe")));
    assert_eq!(probe_maps(&l), 2 * 2 * 2, "{l:?}");
    // The next probe makes the owners free those buffers and export new ones.
    world.lock().unwrap().plot.fail = None;
    f.probe(Direction::Read, 1, 4096).unwrap();
    let l = log(&world);
    assert_eq!(probe_maps(&l), 2 * 2 * 2 + 3 * 2 * 2, "{l:?}");
    check(&l).unwrap();
    f.release().unwrap();
    let (_, left) = check(&log(&world)).unwrap();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_fabric_dropped_while_holding_a_group_releases_before_its_workers_exit() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.prepare(&group(3), &CUSTOM).unwrap();
    f.probe(Direction::Read, 1, 4096).unwrap();
    // No release (the last group of `check --measure`, or an early error return): each
    // worker's exit frees what it exported while peers exiting beside it may still map it.
    drop(f);
    let l = log(&world);
    assert_eq!(count(&l, |e| matches!(e, Ev::Exit(_))), 3);
    // Only the imports are closed first: the exits free the rest, with no round of frees.
    let said = world.lock().unwrap().said.clone();
    let asked = |kind: &str| said.iter().filter(|(_, k, _)| k == kind).count();
    assert_eq!((asked("Disconnect"), asked("Release")), (6, 0), "{said:?}");
    let (freed, left) = check(&l).unwrap();
    // 3 ranks x (in, out, 2 x (scratch, signal)) and the probe's 3 x (src, dst) and latch.
    assert_eq!(freed.len(), 3 * 6 + 7);
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn release_asks_every_set_at_once_and_frees_only_after_every_close() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    // A pinned NCCL variant's set, as a machine with NCCL starts beside the main one (loopback
    // and this host without NCCL waive pins).
    let pinned = f
        .start_set(Some((
            crate::fabric::NcclAlgo::Ring,
            crate::fabric::NcclProto::Simple,
        )))
        .unwrap();
    f.sets.push(pinned);
    f.prepare(&group(3), &CUSTOM).unwrap();
    // Worker 0 (the main set) is slow to disconnect: the pinned set is asked meanwhile.
    world.lock().unwrap().plot.late = Some((0, "Disconnect", 300));
    f.release().unwrap();
    let said = world.lock().unwrap().said.clone();
    let at = |id: usize, kind: &str, answered: bool| {
        said.iter()
            .rposition(|(w, k, a)| *w == id && k == kind && *a == answered)
            .unwrap()
    };
    let slow = at(0, "Disconnect", true);
    for id in 3..6 {
        assert!(at(id, "Disconnect", false) < slow, "worker {id}: {said:?}");
    }
    let last_close = said
        .iter()
        .rposition(|(_, k, a)| k == "Disconnect" && *a)
        .unwrap();
    let first_free = said.iter().position(|(_, k, _)| k == "Release").unwrap();
    assert!(last_close < first_free, "{said:?}");
    check(&log(&world)).unwrap();
}

//! Workers lost, late or answering nonsense: replaced at once, never charged to the next
//! backend, never a panic.

use super::*;
use crate::fabric::{Backend, Direction, Fabric};
use crate::fabric::{Mode, Verification};

fn workers(world: &Shared) -> usize {
    world.lock().unwrap().workers
}

#[test]
fn a_worker_lost_in_a_probe_is_replaced_at_once_and_no_backend_is_charged() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.prepare(&group(3), &CUSTOM).unwrap();
    world.lock().unwrap().plot.die = Some((1, "ProbeQueue"));
    let e = f.probe(Direction::Read, 1, 4096).unwrap_err();
    assert!(e.to_string().contains("a contention probe failed"), "{e}");
    assert_eq!(workers(&world), 6, "replaced at once");
    // The group is set up again on the fresh workers: the next backend runs there without
    // a restart of its own, and the one restart on record names no backend.
    f.time(Backend::OneStagePull, 4096, Mode::Graph, 2, 3)
        .unwrap();
    f.probe(Direction::Read, 1, 4096).unwrap();
    assert_eq!(workers(&world), 6);
    let r = f.recoveries();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].backend, None, "{r:?}");
    f.release().unwrap();
    let (_, left) = check(&log(&world)).unwrap();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_worker_lost_in_a_setup_is_replaced_before_the_error_returns() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    world.lock().unwrap().plot.die = Some((2, "Connect"));
    let e = f.prepare(&group(3), &CUSTOM).unwrap_err();
    assert!(e.to_string().contains("scripted 2"), "{e}");
    assert_eq!(workers(&world), 6, "replaced at once");
    f.prepare(&group(3), &CUSTOM).unwrap();
    assert_eq!(
        f.verify(Backend::OneStagePull, 4096, 1).unwrap(),
        Verification::Correct
    );
    assert_eq!(workers(&world), 6);
    assert_eq!(f.recoveries().len(), 1);
    f.release().unwrap();
    check(&log(&world)).unwrap();
}

#[test]
fn a_worker_lost_reading_links_or_copying_is_replaced_and_the_tune_goes_on() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    // Worker 0 reads the links under load as prepare starts, and dies doing it: the reading
    // becomes a note, and the setup runs on fresh workers.
    world.lock().unwrap().plot.die = Some((0, "LinksUnderLoad"));
    f.prepare(&group(3), &CUSTOM).unwrap();
    assert_eq!(workers(&world), 6);
    assert!(
        f.topology()
            .notes
            .iter()
            .any(|n| n.contains("could not be re-read under load")),
        "{:?}",
        f.topology().notes
    );
    // Worker 3 (the fresh rank 0) dies copying: replaced, the group set up again.
    world.lock().unwrap().plot.die = Some((3, "Copy"));
    assert!(f.time_copy(4096, 1, 2).is_err());
    assert_eq!(workers(&world), 9);
    f.time(Backend::TwoStagePull, 4096, Mode::Eager, 1, 2)
        .unwrap();
    assert_eq!(workers(&world), 9);
    assert!(f.recoveries().iter().all(|r| r.backend.is_none()));
    f.release().unwrap();
    check(&log(&world)).unwrap();
}

#[test]
fn a_broken_rank_outside_the_group_is_an_answer_out_of_turn_not_a_panic() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    world.lock().unwrap().plot.bad_broken = Some(1);
    let e = f.prepare(&group(3), &CUSTOM).unwrap_err();
    assert!(e.to_string().contains("answered out of turn"), "{e}");
    assert_eq!(workers(&world), 6, "replaced");
    f.prepare(&group(3), &CUSTOM).unwrap();
    f.release().unwrap();
    check(&log(&world)).unwrap();
}

#[test]
fn a_worker_that_answers_late_mid_group_is_replaced_and_frees_nothing_while_mapped() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.limit_for_tests = Some(Duration::from_millis(300));
    f.prepare(&group(3), &CUSTOM).unwrap();
    f.probe(Direction::Write, 2, 4096).unwrap();
    // Worker 1 answers its check a second late: killed at the deadline, never asked again;
    // the verification runs again on fresh workers.
    world.lock().unwrap().plot.late = Some((1, "Check", 1000));
    assert_eq!(
        f.verify(Backend::OneStagePull, 4096, 1).unwrap(),
        Verification::Correct
    );
    assert_eq!(workers(&world), 6);
    let r = f.recoveries();
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(
        r[0].cause.contains("scripted 1 did not answer within"),
        "{r:?}"
    );
    assert_eq!(r[0].backend, Some(Backend::OneStagePull));
    f.release().unwrap();
    let l = log(&world);
    // Killed, the late worker ran nothing at its end: its buffers went with it.
    assert_eq!(count(&l, |e| matches!(e, Ev::Free(1, _))), 0, "{l:?}");
    let (_, left) = check(&l).unwrap();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn when_fresh_workers_cannot_start_every_request_says_so_without_a_panic() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.prepare(&group(3), &CUSTOM).unwrap();
    {
        let mut w = world.lock().unwrap();
        w.plot.die = Some((1, "ProbeQueue"));
        w.plot.no_start = true;
    }
    assert!(f.probe(Direction::Read, 1, 4096).is_err());
    let again = f.prepare(&group(3), &CUSTOM).unwrap_err().to_string();
    assert!(again.contains("no GPU workers are running"), "{again}");
    let copy = f.time_copy(4096, 1, 1).unwrap_err().to_string();
    assert!(copy.contains("no GPU workers are running"), "{copy}");
    assert!(f.link_under_load().is_err());
    f.release().unwrap();
}

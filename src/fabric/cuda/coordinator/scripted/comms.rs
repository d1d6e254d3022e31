//! The workers' NCCL communicators between groups (comms.rs): kept at a release, taken by the
//! next group with the same ranks, destroyed by all their ranks at once before a group with
//! others allocates anything, and left to the workers' exit at the end.

use super::*;
use crate::fabric::{Fabric, Mode, Readiness};

const NCCL: Backend = Backend::Nccl;

fn on(gpus: &[usize]) -> Group {
    Group::flat(gpus.to_vec(), Dtype::Bf16, 1 << 20)
}

fn comms(world: &Shared) -> Vec<(usize, &'static str, Backend)> {
    world.lock().unwrap().comms.clone()
}

fn nccl_ready(r: &[Readiness]) -> bool {
    r.iter()
        .any(|r| matches!(r, Readiness::Ready { backend, .. } if *backend == NCCL))
}

#[test]
fn loopback_groups_share_one_communicator_created_once_and_never_destroyed() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    // check --measure's groups in loopback: TP2, then TP3 (every group's NCCL: one rank, on
    // worker 0), then TP2 again.
    for g in [on(&[0, 1]), on(&[0, 1, 2]), on(&[0, 1])] {
        let r = f.prepare(&g, &[NCCL, CUSTOM[0]]).unwrap();
        assert!(nccl_ready(&r), "{r:?}");
    }
    drop(f);
    let c = comms(&world);
    assert_eq!(
        c,
        [
            (0, "init", NCCL),
            (0, "reuse", NCCL),
            (0, "reuse", NCCL),
            (0, "exit", NCCL)
        ],
        "{c:?}"
    );
    check(&log(&world)).unwrap();
}

#[test]
fn other_ranks_destroy_the_kept_communicator_on_every_rank_at_once_before_any_buffer() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    // As on several GPUs: one NCCL rank per GPU, in its own worker.
    f.loopback = None;
    f.prepare(&on(&[0, 1]), &[NCCL]).unwrap();
    // Worker 0 is slow to destroy its rank: worker 1 is asked meanwhile (NCCL's finalize
    // waits for every rank, so one rank at a time would never finish).
    world.lock().unwrap().plot.late = Some((0, "NcclRetire", 300));
    let r = f.prepare(&on(&[0, 1, 2]), &[NCCL]).unwrap();
    assert!(nccl_ready(&r), "{r:?}");
    let said = world.lock().unwrap().said.clone();
    let at = |id: usize, kind: &str, answered: bool| {
        said.iter()
            .position(|(w, k, a)| *w == id && k == kind && *a == answered)
            .unwrap_or_else(|| panic!("worker {id} {kind} {answered}: {said:?}"))
    };
    assert!(
        at(1, "NcclRetire", false) < at(0, "NcclRetire", true),
        "{said:?}"
    );
    // Destroyed before the group's buffers (held memory stays one communicator's).
    let second_setup = said
        .iter()
        .enumerate()
        .filter(|(_, (_, k, a))| k == "Setup" && !a)
        .nth(2)
        .map(|(i, _)| i)
        .unwrap();
    assert!(at(0, "NcclRetire", true) < second_setup, "{said:?}");
    let retired = |id: usize| said.iter().any(|(w, k, _)| *w == id && k == "NcclRetire");
    assert!(!retired(2), "worker 2 held none: {said:?}");
    // The same ranks again: taken as they are, on every rank.
    f.prepare(&on(&[0, 1, 2]), &[NCCL]).unwrap();
    drop(f);
    let mut c = comms(&world);
    c.sort();
    let want: Vec<(usize, &str, Backend)> = vec![
        (0, "exit", NCCL),
        (0, "init", NCCL),
        (0, "init", NCCL),
        (0, "retire", NCCL),
        (0, "reuse", NCCL),
        (1, "exit", NCCL),
        (1, "init", NCCL),
        (1, "init", NCCL),
        (1, "retire", NCCL),
        (1, "reuse", NCCL),
        (2, "exit", NCCL),
        (2, "init", NCCL),
        (2, "reuse", NCCL),
    ];
    assert_eq!(c, want);
}

#[test]
fn a_backend_dropped_after_a_failure_is_created_afresh_not_reused() {
    let world = Shared::default();
    let mut f = fabric(2, &world);
    f.prepare(&on(&[0, 1]), &[NCCL]).unwrap();
    world.lock().unwrap().plot.fail_backend = Some((0, "Time"));
    assert!(f.time(NCCL, 4096, Mode::Eager, 1, 2).is_err());
    world.lock().unwrap().plot.fail_backend = None;
    // Its worker aborted the rank: the next group must not ask for it back.
    let r = f.prepare(&on(&[0, 1]), &[NCCL]).unwrap();
    assert!(nccl_ready(&r), "{r:?}");
    let c = comms(&world);
    assert_eq!(c, [(0, "init", NCCL), (0, "init", NCCL)], "{c:?}");
}

#[test]
fn fresh_workers_after_a_loss_create_their_communicator_and_ask_for_none_kept() {
    let world = Shared::default();
    let mut f = fabric(2, &world);
    f.prepare(&on(&[0, 1]), &[NCCL]).unwrap();
    // Worker 0 dies while NCCL runs: every worker is replaced and the group set up again.
    world.lock().unwrap().plot.die = Some((0, "Time"));
    f.time(NCCL, 4096, Mode::Eager, 1, 2).unwrap();
    let r = f.prepare(&on(&[0, 1]), &[NCCL]).unwrap();
    assert!(nccl_ready(&r), "{r:?}");
    let c = comms(&world);
    // Worker 0 created it; fresh worker 2 (its replacement) created its own and reused it.
    assert_eq!(
        c,
        [(0, "init", NCCL), (2, "init", NCCL), (2, "reuse", NCCL)],
        "{c:?}"
    );
}

#[test]
fn a_pinned_set_keeps_and_destroys_its_own_communicator_beside_the_main_one() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.loopback = None;
    let pin = Backend::NcclRingLl;
    let r = f.prepare(&on(&[0, 1]), &[NCCL, pin]).unwrap();
    assert!(nccl_ready(&r), "{r:?}");
    f.prepare(&on(&[0, 1, 2]), &[NCCL, pin]).unwrap();
    f.prepare(&on(&[0, 1, 2]), &[NCCL, pin]).unwrap();
    let said = world.lock().unwrap().said.clone();
    // Each worker holding a rank is asked once to destroy (one answer awaited per worker).
    for id in 0..6 {
        let asked = said
            .iter()
            .filter(|(w, k, a)| *w == id && k == "NcclRetire" && !a)
            .count();
        assert_eq!(asked, usize::from(id % 3 != 2), "worker {id}: {said:?}");
    }
    let c = comms(&world);
    for (backend, worker) in [(NCCL, 0), (pin, 3)] {
        let did = |what: &str| c.iter().filter(|x| **x == (worker, what, backend)).count();
        assert_eq!(
            (did("init"), did("retire"), did("reuse")),
            (2, 1, 1),
            "{c:?}"
        );
    }
}

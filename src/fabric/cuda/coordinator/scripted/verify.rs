//! A size is verified before its first timing with as many calls in a row as its hazards need
//! (coordinator/measure.rs, `calls_verified`), once per size and mode.

use super::*;
use crate::fabric::Fabric;

#[test]
fn a_size_is_verified_with_eight_calls_where_ll_runs_and_three_past_it_and_for_the_copy_engines() {
    let world = Shared::default();
    let mut f = fabric(2, &world);
    let (pull, copy) = (Backend::OneStagePull, Backend::TwoStageCopy);
    f.prepare(&group(2), &[pull, copy]).unwrap();
    for (b, bytes, mode) in [
        (pull, 4096, Mode::Graph),
        (pull, 4096, Mode::Graph),
        (pull, 4096, Mode::Eager),
        (pull, 1 << 20, Mode::Graph),
        (copy, 4096, Mode::Graph),
    ] {
        f.time(b, bytes, mode, 1, 1).unwrap();
    }
    // Worker 0's checks (each launching worker checks its own ranks).
    let checked: Vec<_> = world
        .lock()
        .unwrap()
        .checked
        .iter()
        .filter(|c| c.0 == 0)
        .map(|c| (c.1, c.2, c.3, c.4))
        .collect();
    assert_eq!(
        checked,
        vec![
            (pull, 4096, Mode::Graph, 8),
            (pull, 4096, Mode::Eager, 8),
            (pull, 1 << 20, Mode::Graph, 3),
            (copy, 4096, Mode::Graph, 3),
        ]
    );
    f.release().unwrap();
}

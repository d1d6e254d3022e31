//! The copy-engine schedules executed on the host: every rank ends with the sum, within the
//! buffers the memory model counts, and a schedule that skips its sum is caught.

use super::*;
use crate::allreduce::Executor;

/// Each rank's input: distinct small integers, so every sum is exact in any order.
fn inputs(n: usize, elems: u64) -> Vec<Vec<f32>> {
    (0..n)
        .map(|r| {
            (0..elems)
                .map(|i| ((i * 7 + r as u64 * 13) % 97) as f32)
                .collect()
        })
        .collect()
}

/// Whether every rank's output is the element-wise sum of all inputs; why not otherwise.
fn verify(backend: Backend, ranks: Ranks, plan: &[Vec<Op>], elems: u64) -> Result<(), String> {
    let ins = inputs(ranks.n, elems);
    let outs = run(backend, ranks, plan, &ins)?;
    for (r, out) in outs.iter().enumerate() {
        for (i, got) in out.iter().enumerate() {
            let want: f32 = ins.iter().map(|v| v[i]).sum();
            if *got != want {
                return Err(format!(
                    "rank {r} element {i}: {got} where the sum is {want}"
                ));
            }
        }
    }
    Ok(())
}

/// The table's copy-engine rows (the executor's tests take them too).
pub(in crate::fabric::cuda) fn copy_engine_backends() -> Vec<Backend> {
    Backend::ALL
        .into_iter()
        .filter(|b| match b.executor() {
            Executor::CopyEngine(_) => true,
            Executor::Nccl | Executor::SmKernel => false,
        })
        .collect()
}

/// Groups of 2, 4 and 8 ranks, flat and in islands.
pub(in crate::fabric::cuda) const GROUPS: [Ranks; 6] = [
    Ranks { n: 2, island: 2 },
    Ranks { n: 4, island: 4 },
    Ranks { n: 8, island: 8 },
    Ranks { n: 4, island: 2 },
    Ranks { n: 8, island: 4 },
    Ranks { n: 8, island: 2 },
];

#[test]
fn every_copy_engine_schedule_ends_with_the_sum_on_every_rank() {
    let backends = copy_engine_backends();
    assert_eq!(backends.len(), 2);
    for b in backends {
        for ranks in GROUPS {
            if b.is_hierarchical() == (ranks.island == ranks.n) {
                continue;
            }
            // One element, fewer elements than ranks, odd counts that leave short shards.
            for elems in [1, 3, 7, 8, 9, 1000, 4099] {
                let p = plan(b, ranks, elems);
                verify(b, ranks, &p, elems)
                    .unwrap_or_else(|e| panic!("{b} over {ranks:?}, {elems} elements: {e}"));
            }
        }
    }
}

#[test]
fn a_schedule_that_skips_its_sum_fails_verification() {
    for (b, ranks) in [
        (Backend::TwoStageCopy, Ranks::flat(4)),
        (Backend::IslandTwoShotCopy, Ranks { n: 8, island: 4 }),
    ] {
        // Each sum replaced by a copy of the rank's own share: the exchange still runs.
        let skipped: Vec<Vec<Op>> = plan(b, ranks, 1000)
            .into_iter()
            .map(|ops| {
                ops.into_iter()
                    .map(|op| match op {
                        Op::Sum { inputs, out, len } => Op::Copy {
                            from: inputs[0],
                            to: out,
                            len,
                        },
                        other => other,
                    })
                    .collect()
            })
            .collect();
        let e = verify(b, ranks, &skipped, 1000).unwrap_err();
        assert!(e.contains("where the sum is"), "{b}: {e}");
    }
}

#[test]
fn the_island_schedule_crosses_between_islands_once_per_rank() {
    // Two islands of four: each rank copies from its one counterpart once, a quarter of the
    // message; every other copy stays inside its island (or its own memory).
    let ranks = Ranks { n: 8, island: 4 };
    let elems = 4096;
    for (r, ops) in plan(Backend::IslandTwoShotCopy, ranks, elems)
        .iter()
        .enumerate()
    {
        let crossing: Vec<u64> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Copy { from, len, .. } if from.rank / 4 != r / 4 => Some(*len),
                _ => None,
            })
            .collect();
        assert_eq!(crossing, [elems / 4], "rank {r}");
        assert_eq!(
            ops.iter().filter(|o| matches!(o, Op::Sum { .. })).count(),
            2
        );
    }
}

#[test]
fn a_schedule_stays_inside_the_buffers_the_memory_model_counts() {
    // A row whose scratch were one slot short would send the last peer's copy outside it.
    let ranks = Ranks::flat(4);
    let mut p = plan(Backend::TwoStageCopy, ranks, 1000);
    let Some(Op::Copy { to, .. }) = p[0].iter_mut().find(|o| {
        matches!(
            o,
            Op::Copy {
                to: At {
                    buf: Buf::Scratch { .. },
                    ..
                },
                ..
            }
        )
    }) else {
        panic!("no copy into a slot");
    };
    to.buf = Buf::Scratch { entry: 0, slot: 3 };
    let e = verify(Backend::TwoStageCopy, ranks, &p, 1000).unwrap_err();
    assert!(e.contains("reaches"), "{e}");
}

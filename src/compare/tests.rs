use super::*;
use crate::allreduce::Backend;
use crate::profile::{Bucket, Timing};

fn timing(us: f64) -> Timing {
    Timing {
        median_us: us,
        ci_low_us: us * 0.99,
        ci_high_us: us * 1.01,
        samples: 10,
        outliers: 0,
        model: None,
    }
}

fn bucket(bytes: u64, choice: Backend, times: &[(Backend, f64)]) -> Bucket {
    Bucket {
        bytes,
        choice,
        nccl_choice: None,
        fallback: None,
        results: times.iter().map(|&(b, t)| (b, timing(t))).collect(),
        waived: Default::default(),
    }
}

fn profile(buckets: Vec<Bucket>, dtype: Dtype) -> Profile {
    let mut p = crate::profile::tests::fixture();
    p.groups.truncate(1);
    p.groups[0].crossovers = crate::decide::crossovers(&buckets);
    p.groups[0].buckets = buckets;
    p.groups[0].dtype = dtype;
    p
}

#[test]
fn a_coarse_profile_answers_a_fine_one_as_an_engine_would() {
    let (n, o) = (Backend::Nccl, Backend::OneStagePush);
    // A (a fast tune) saw only 4K and 64K; B (the reference) every size in between.
    let a = profile(
        vec![
            bucket(4096, o, &[(n, 20.0), (o, 8.0)]),
            bucket(65536, n, &[(n, 30.0), (o, 40.0)]),
        ],
        Dtype::Bf16,
    );
    let b = profile(
        vec![
            bucket(4096, o, &[(n, 20.0), (o, 8.0)]),
            bucket(16384, o, &[(n, 20.0), (o, 10.0)]),
            bucket(32768, n, &[(n, 25.0), (o, 30.0)]),
            bucket(65536, n, &[(n, 30.0), (o, 40.0)]),
            bucket(131072, n, &[(n, 40.0), (o, 80.0)]),
        ],
        Dtype::Bf16,
    );
    let c = compare(&a, &b).unwrap();
    let g = &c.groups[0];
    // A's 64K bucket serves 16K: NCCL there, 10 us slower than B's choice.
    let at16 = g.buckets.iter().find(|k| k.bytes == 16384).unwrap();
    assert_eq!((at16.a_choice, at16.regret_us), (n, Some(10.0)));
    assert_eq!(g.buckets.len(), 4);
    assert_eq!(g.beyond_a, 1);
    assert_eq!(g.regret_sum_us, 10.0);
    assert_eq!(g.b_sum_us, 8.0 + 10.0 + 25.0 + 30.0);
    assert!((g.regret_sum_pct - 1000.0 / 73.0).abs() < 1e-9);
    assert_eq!(g.worst.as_ref().unwrap().bytes, 16384);
    // A crosses at 64K, B at 32K: an octave apart, far more than one refinement step.
    assert!(!g.crossovers_within_step);
    assert_eq!(g.a_in_b[0].nearest_bytes, Some(32768));
    let text = render(&c);
    assert!(
        text.contains("1 of B's sizes lies above A's largest"),
        "{text}"
    );
    assert!(
        text.contains("crossovers within one refinement step: no (2 missed: A's one_stage_push→nccl at its 64K bucket, nearest in B at its 32K bucket"),
        "{text}"
    );
}

#[test]
fn crossovers_match_within_one_step_between_the_same_backends() {
    let (n, o, p) = (Backend::Nccl, Backend::OneStagePush, Backend::OneStagePull);
    let x = |bytes: u64, from, to| Crossover { bytes, from, to };
    let mib = 1u64 << 20;
    let m = matches(&[x(mib, o, n)], &[x(mib + mib / 8, o, n)], 256, &[]);
    assert!(m[0].within_step);
    let m = matches(&[x(mib, o, n)], &[x(mib + mib / 4, o, n)], 256, &[]);
    assert!(!m[0].within_step);
    // Near in size, but between other backends: no match.
    let m = matches(&[x(mib, o, n)], &[x(mib, p, n)], 256, &[]);
    assert_eq!((m[0].nearest_bytes, m[0].within_step), (None, false));
    // Off step with no size of B to judge it by: a miss, not a tie.
    assert!(m[0].missed() && m[0].span.is_none());
}

#[test]
fn regret_is_a_choice_timed_by_b() {
    let (n, o) = (Backend::Nccl, Backend::OneStagePush);
    let a = profile(
        vec![
            bucket(4096, o, &[(n, 20.0), (o, 8.0)]),
            bucket(65536, o, &[(n, 30.0), (o, 25.0)]),
        ],
        Dtype::Bf16,
    );
    let b = profile(
        vec![
            bucket(4096, o, &[(n, 22.0), (o, 9.0)]),
            bucket(65536, n, &[(n, 28.0), (o, 40.0)]),
        ],
        Dtype::Bf16,
    );
    let c = compare(&a, &b).unwrap();
    let g = &c.groups[0];
    assert_eq!(g.buckets[0].regret_us, Some(0.0));
    assert_eq!(g.buckets[1].regret_us, Some(12.0));
    assert_eq!(g.regret_sum_us, 12.0);
    assert_eq!(g.worst.as_ref().unwrap().bytes, 65536);
    assert!(
        render(&c).contains("worst share and most time lost: 12"),
        "{}",
        render(&c)
    );
    // Against itself: no regret.
    let same = compare(&b, &b).unwrap();
    assert_eq!(same.groups[0].regret_sum_us, 0.0);
    assert!(!same.groups[0].crossovers_differ());
}

/// A size that loses little time but much of its own, and a large one that loses most time:
/// "worst" alone would name the small one though the large one costs the node most. Both
/// are reported, each under its own name (a node 3x slower at NCCL: 81 us at 448K is 207%,
/// 18 ms at 256M is 200%).
#[test]
fn worst_share_and_most_time_lost_are_named_apart() {
    let (n, o) = (Backend::Nccl, Backend::OneStagePush);
    let a = profile(
        vec![
            bucket(4096, n, &[(n, 8.0), (o, 20.0)]),
            bucket(1 << 28, n, &[(n, 9000.0), (o, 12000.0)]),
        ],
        Dtype::Bf16,
    );
    let b = profile(
        vec![
            bucket(4096, o, &[(n, 30.0), (o, 10.0)]),
            bucket(1 << 28, o, &[(n, 24000.0), (o, 9000.0)]),
        ],
        Dtype::Bf16,
    );
    let c = compare(&a, &b).unwrap();
    let g = &c.groups[0];
    assert_eq!(g.worst.as_ref().unwrap().bytes, 4096);
    assert_eq!(g.most_lost.as_ref().unwrap().bytes, 1 << 28);
    let text = render(&c);
    assert!(
        text.contains("worst share: 20.0 us at 4K (200.0% of B's choice there)"),
        "{text}"
    );
    assert!(
        text.contains("most time lost: 15.00 ms at 256M (166.7% of B's choice there)"),
        "{text}"
    );
}

fn spread(us: f64, half: f64) -> Timing {
    Timing {
        median_us: us,
        ci_low_us: us - half,
        ci_high_us: us + half,
        samples: 10,
        outliers: 0,
        model: None,
    }
}

fn noisy(bytes: u64, choice: Backend, times: &[(Backend, f64, f64)]) -> Bucket {
    Bucket {
        bytes,
        choice,
        nccl_choice: None,
        fallback: None,
        results: times.iter().map(|&(b, t, h)| (b, spread(t, h))).collect(),
        waived: Default::default(),
    }
}

#[test]
fn significant_regret_is_what_lies_beyond_b_intervals() {
    let (n, o) = (Backend::Nccl, Backend::OneStagePush);
    let a = profile(
        vec![noisy(4096, o, &[(n, 20.0, 0.2), (o, 10.0, 0.1)])],
        Dtype::Bf16,
    );
    // B: NCCL 7% faster than A's choice, ±2%: a raw regret over 5%, 3% beyond the noise.
    let b = profile(
        vec![noisy(4096, n, &[(n, 100.0, 2.0), (o, 107.0, 2.0)])],
        Dtype::Bf16,
    );
    let c = compare(&a, &b).unwrap();
    let g = &c.groups[0];
    let k = &g.buckets[0];
    assert_eq!((k.regret_us, k.significant_us), (Some(7.0), Some(3.0)));
    // B's rule picks NCCL, but its intervals allow an advantage of 3% as well as 11%: a
    // verdict they leave open, so no placement of a crossover here is a miss.
    assert_eq!(k.b_beats_a, Some(false));
    assert!((g.worst_pct - 7.0).abs() < 1e-9 && (g.worst_significant_pct - 3.0).abs() < 1e-9);
    let text = render(&c);
    assert!(
        text.contains("worst share and most time lost: 7.0 us at 4K (7.0% of B's choice there)"),
        "{text}"
    );
    assert!(
        text.contains("worst share beyond B's intervals: 3.0 us at 4K (3.0% of B's choice there)"),
        "{text}"
    );
    // Overlapping intervals: a raw regret, none beyond the noise.
    let b = profile(
        vec![noisy(4096, n, &[(n, 100.0, 2.0), (o, 103.0, 2.0)])],
        Dtype::Bf16,
    );
    let g = &compare(&a, &b).unwrap().groups[0];
    assert_eq!(g.buckets[0].significant_us, Some(0.0));
    assert!(g.worst_significant.is_none() && g.worst_pct > 2.9);
    // 20% slower with the same intervals: beaten whatever more samples say.
    let b = profile(
        vec![noisy(4096, n, &[(n, 100.0, 2.0), (o, 120.0, 2.0)])],
        Dtype::Bf16,
    );
    assert_eq!(
        compare(&a, &b).unwrap().groups[0].buckets[0].b_beats_a,
        Some(true)
    );
}

/// A with an NCCL→kernel crossover two octaves below B's: off step either way.
fn apart(kernel_us_at_8k: f64) -> Comparison {
    let (n, o) = (Backend::Nccl, Backend::OneStagePush);
    let row =
        |bytes, choice, nccl, kernel| noisy(bytes, choice, &[(n, nccl, 1.0), (o, kernel, 1.0)]);
    let a = profile(
        vec![
            row(4096, n, 50.0, 60.0),
            row(8192, o, 50.0, 40.0),
            row(16384, o, 60.0, 40.0),
            row(32768, o, 80.0, 40.0),
        ],
        Dtype::Bf16,
    );
    let b = profile(
        vec![
            row(4096, n, 50.0, 60.0),
            row(8192, n, 50.0, kernel_us_at_8k),
            row(16384, n, 50.0, 49.0),
            row(32768, o, 80.0, 40.0),
        ],
        Dtype::Bf16,
    );
    compare(&a, &b).unwrap()
}

#[test]
fn a_crossover_off_step_is_tied_where_b_cannot_tell_the_choices_apart() {
    // B's kernel is within its noise of NCCL at 8K and 16K: B keeps NCCL (no memory),
    // A switched earlier. Equally right: tied, no miss.
    let c = apart(51.0);
    let g = &c.groups[0];
    assert_eq!((g.crossovers_off_step, g.crossovers_tied), (2, 2));
    assert!(g.crossovers_within_step);
    assert_eq!(g.a_in_b[0].span, Some([8192, 32768]));
    let text = render(&c);
    assert!(
        text.contains("crossovers within one refinement step: yes (2 tied: A's nccl→one_stage_push at its 8K bucket, nearest in B at its 32K bucket, B cannot tell the choices apart over 8K..32K"),
        "{text}"
    );
    // At 8K the kernel is 40% slower in B: B's rule tells them apart, a miss.
    let c = apart(70.0);
    let g = &c.groups[0];
    assert_eq!((g.crossovers_off_step, g.crossovers_tied), (2, 0));
    assert!(!g.crossovers_within_step && g.a_in_b[0].missed());
    assert!(render(&c).contains("no (2 missed: A's nccl→one_stage_push at its 8K bucket"));
}

#[test]
fn different_dtype_or_no_common_group_is_refused() {
    let n = Backend::Nccl;
    let a = profile(vec![bucket(4096, n, &[(n, 20.0)])], Dtype::Bf16);
    let b = profile(vec![bucket(4096, n, &[(n, 20.0)])], Dtype::Fp32);
    assert!(matches!(compare(&a, &b), Err(CompareError::Dtype { .. })));
    let mut c = a.clone();
    c.groups[0].tp = 4;
    assert!(matches!(
        compare(&a, &c),
        Err(CompareError::NoCommonGroup { .. })
    ));
}

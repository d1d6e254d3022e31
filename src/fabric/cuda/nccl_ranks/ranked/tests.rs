use super::testing::{ranked, starts};
use super::*;

#[test]
fn a_loopback_tune_runs_k_ranks_from_2_30_and_says_what_an_older_nccl_needs() {
    assert_eq!(loopback(23206, None, 4), Ok(()));
    assert_eq!(loopback(23000, Some("1"), 2), Ok(()));
    let old = loopback(22703, None, 2).unwrap_err();
    assert!(
        old.contains("NCCL 2.27.3 cannot put several ranks on one GPU (2.30 or later can")
            && old.ends_with("ARTUNE_NCCL_LIB to a newer libnccl.so.2"),
        "{old}"
    );
    let no = loopback(23206, Some("0"), 2).unwrap_err();
    assert!(no.ends_with("so unset it"), "{no}");
}

#[test]
fn four_ranks_on_one_gpu_leave_room_for_every_kernel_and_two_need_no_cap() {
    assert_eq!(shared_max_ctas(2), None);
    assert_eq!(shared_max_ctas(4), Some(8));
}

/// The reference grid of the fake group's 1K-4K: the powers of two and every size
/// bisection can add between them (alignment 256 at TP2).
const FINE: &str = "1024,1280,1536,1792,2048,2304,2560,2816,3072,3328,3584,3840,4096";

#[test]
fn samples_come_in_order_never_twice_from_one_start_over_the_grid_then_one_per_size() {
    let d = tempfile::tempdir().unwrap();
    let mut r = ranked(d.path(), 0, 1);
    let b = Backend::NcclRingSimple;
    let one = |from: usize, n: usize, plus: usize| -> Vec<f64> {
        (from..from + n)
            .map(|i| (1 + i + plus) as f64 + 0.5)
            .collect()
    };
    // Every sample its own: the harness's interval is the samples', not one number's.
    assert_eq!(r.time(b, 1024, Mode::Eager, 10).unwrap(), one(0, 10, 0));
    assert_eq!(r.time(b, 4096, Mode::Eager, 3).unwrap(), [4.5, 5.5, 6.5]);
    let s = starts(d.path());
    assert_eq!(s.len(), 1, "{s:?}");
    let first = format!("--sizes {FINE} ");
    assert!(
        s[0].contains(&first) && s[0].contains("--samples 40"),
        "{s:?}"
    );
    assert!(!s[0].contains("--graph"), "{s:?}");
    // Past the first start's samples: one start at that size alone, as many as the
    // cap allows where calls cost microseconds.
    let more = r.time(b, 1024, Mode::Eager, 35).unwrap();
    assert_eq!(more[..30], one(10, 30, 0)[..]);
    assert_eq!(more[30..], one(0, 5, 0)[..]);
    let s = starts(d.path());
    assert_eq!(s.len(), 2, "{s:?}");
    assert!(
        s[1].contains("--sizes 1024 ") && s[1].contains("--samples 200"),
        "{s:?}"
    );
    // Graph mode is its own start, each sample one replay of a captured batch.
    assert_eq!(r.time(b, 4096, Mode::Graph, 2).unwrap(), [1004.5, 1005.5]);
    let s = starts(d.path());
    assert!(s.len() == 3 && s[2].contains("--graph"), "{s:?}");
    // An odd size is called as the even one below it.
    assert_eq!(r.time(b, 4097, Mode::Eager, 1).unwrap(), [7.5]);
    assert_eq!(starts(d.path()).len(), 3);
}

/// What a tune asks of a group, as the harness asks it: per size (powers of two, then
/// the sizes bisection adds), each variant verified, then timed to its warm-up and
/// minimum, then a step. One start per variant and mode in all: a refined size's
/// verification and timing are the first start's (57 s of the 94.5 s tune of
/// 2026-12-05-krank were a start per variant and refined size).
#[test]
fn a_tune_starts_the_ranks_once_per_variant_and_mode_whatever_it_refines() {
    let d = tempfile::tempdir().unwrap();
    let mut r = ranked(d.path(), 0, 1);
    r.prime(Backend::Nccl, Mode::Eager).unwrap();
    let variants: Vec<Backend> = Backend::ALL.into_iter().filter(|b| b.is_nccl()).collect();
    assert_eq!(variants.len(), 7);
    for mode in [Mode::Eager, Mode::Graph] {
        for bytes in [1024, 2048, 4096, 1536, 3072, 1280, 3584] {
            for &b in &variants {
                let v = r.verify(b, bytes).unwrap();
                assert_eq!(v, Verification::Correct, "{b} {bytes}");
                assert_eq!(r.time(b, bytes, mode, 13).unwrap().len(), 13);
                assert_eq!(r.time(b, bytes, mode, 10).unwrap().len(), 10);
            }
        }
    }
    let s = starts(d.path());
    assert_eq!(s.len(), 1 + 2 * 7, "{s:#?}");
    // The prime reads NCCL's channels and a call's cost over the coarse grid alone.
    assert!(
        s[0].contains("--sizes 1024,4096 ") && s[0].contains("--samples 5"),
        "{s:?}"
    );
}

/// A call's cost sizes the next start: microseconds a call (MPS) fill a cell's cap from
/// one start; milliseconds (time slices) take the floor, and a further start takes what
/// fits in its larger budget.
#[test]
fn each_start_takes_the_samples_a_call_s_cost_allows() {
    assert_eq!(budget(BUDGET_US, 30.0, FLOOR), CAP);
    assert_eq!(budget(BUDGET_US, 5400.0, FLOOR), FLOOR);
    assert_eq!(budget(MORE_BUDGET_US, 5400.0, FLOOR), 37);
    assert_eq!(budget(MORE_BUDGET_US, 25_000.0, 250), CAP);
    let d = tempfile::tempdir().unwrap();
    // Sizes of 4-8 MB: the fake's calls take 4-8 ms.
    let exe = super::testing::fake_rank(d.path(), 0, 1);
    let mut r = Ranked::new(exe, 2, vec![4 << 20, 8 << 20], Vec::new());
    r.ids = super::testing::fake_id;
    r.prime(Backend::Nccl, Mode::Eager).unwrap();
    // The prime's 5 samples are handed out first; a sixth starts the variant's timing.
    r.time(Backend::Nccl, 4 << 20, Mode::Eager, 6).unwrap();
    let s = starts(d.path());
    assert!(s[1].contains("--samples 30 "), "{s:?}");
    let mut fast = ranked(d.path(), 0, 1);
    fast.prime(Backend::Nccl, Mode::Eager).unwrap();
    fast.time(Backend::Nccl, 1024, Mode::Eager, 6).unwrap();
    let s = starts(d.path());
    assert!(s[3].contains("--samples 200 "), "{s:?}");
}

#[test]
fn a_pin_is_verified_by_the_k_ranks_own_sums_and_a_wrong_one_is_named() {
    let d = tempfile::tempdir().unwrap();
    // 2000 and 8192 bytes are off the grid: each a start of its own.
    let mut r = ranked(d.path(), 2000, 8192);
    let b = Backend::NcclTreeLl;
    assert_eq!(r.verify(b, 1024).unwrap(), Verification::Correct);
    // Checked by the start that timed it: no start of its own.
    assert_eq!(r.verify(b, 4096).unwrap(), Verification::Correct);
    assert_eq!(r.verify(b, 2304).unwrap(), Verification::Correct);
    assert_eq!(starts(d.path()).len(), 1);
    let Verification::Wrong { reason } = r.verify(b, 2000).unwrap() else {
        panic!("a wrong sum is a wrong verification")
    };
    assert!(
        reason.contains("rank 1 of 2 found a wrong sum")
            && reason.contains("element 3 is 0, not 6"),
        "{reason}"
    );
    let e = r.verify(b, 8192).unwrap_err().to_string();
    assert!(e.contains("NCCL rank 1 of 2 failed (rank 1: lost)"), "{e}");
    // A wrong sum while timing fails the backend, with the reason.
    let e = r.time(b, 2000, Mode::Eager, 1).unwrap_err().to_string();
    assert!(e.contains("found a wrong sum"), "{e}");
}

/// A first start asked above the grid's smallest size times none below it, as the harness
/// asks in ascending order.
#[test]
fn a_first_start_times_the_size_asked_and_the_grid_above_it() {
    let d = tempfile::tempdir().unwrap();
    let mut r = ranked(d.path(), 0, 1);
    r.time(Backend::NcclTreeLl, 2048, Mode::Eager, 1).unwrap();
    r.time(Backend::Nccl, 4096, Mode::Graph, 1).unwrap();
    let s = starts(d.path());
    let above = format!("--sizes {} ", &FINE[FINE.find("2048").unwrap()..]);
    assert!(s[0].contains(&above), "{s:?}");
    assert!(s[1].contains("--sizes 4096 "), "{s:?}");
}

/// A verification's start runs in the mode last timed, whose cells come next: a graph
/// tune starts no eager ranks to verify, and the samples serve the harness.
#[test]
fn a_verification_starts_the_ranks_in_the_mode_last_timed() {
    let d = tempfile::tempdir().unwrap();
    let mut r = ranked(d.path(), 0, 1);
    r.time(Backend::Nccl, 1024, Mode::Graph, 1).unwrap();
    let b = Backend::NcclTreeSimple;
    assert_eq!(r.verify(b, 4096).unwrap(), Verification::Correct);
    let s = starts(d.path());
    assert!(s.len() == 2 && s[1].contains("--graph"), "{s:?}");
    assert_eq!(r.time(b, 4096, Mode::Graph, 1).unwrap(), [1004.5]);
    assert_eq!(starts(d.path()).len(), 2);
}

/// Where the ranks cannot run from a graph but run host-launched, graph mode gets eager
/// samples, said once; a graph start is not tried again.
#[test]
fn graph_mode_falls_back_to_eager_samples_and_says_so_once() {
    let d = tempfile::tempdir().unwrap();
    let mut r = ranked(d.path(), 0, 0);
    let b = Backend::NcclRingLl;
    assert_eq!(r.time(b, 1024, Mode::Eager, 2).unwrap(), [1.5, 2.5]);
    assert_eq!(r.stand_in_note(), None, "eager alone stands in for nothing");
    assert_eq!(r.time(b, 1024, Mode::Graph, 2).unwrap(), [1.5, 2.5]);
    let note = r.stand_in_note().unwrap();
    assert!(
        note.starts_with("graph mode's NCCL times are eager (host-launched) times")
            && note.contains("(NCCL rank 1 of 2 failed (rank 1: capturing ncclAllReduce"),
        "{note}"
    );
    assert_eq!(r.stand_in_note(), None, "said once");
    assert_eq!(r.time(Backend::Nccl, 4096, Mode::Graph, 1).unwrap(), [4.5]);
    let s = starts(d.path());
    let graph = s.iter().filter(|s| s.contains("--graph")).count();
    assert_eq!((s.len(), graph), (4, 1), "{s:?}");
}

#[test]
fn own_channels_are_the_most_nccl_s_own_choice_ran() {
    let mut r = Ranked::new("artune".into(), 2, vec![1024], Vec::new());
    assert_eq!(r.own_channels(), None);
    r.ran.insert((Backend::Nccl, 1024), 2);
    r.ran.insert((Backend::Nccl, 1 << 20), 24);
    r.ran.insert((Backend::NcclRingSimple, 1 << 20), 32);
    assert_eq!(r.own_channels(), Some(24));
}

/// With libartune.so beside the binary, what a tune asks of a group (as the harness asks it,
/// every variant at every size, refined sizes too, in both modes) starts the ranks once per
/// mode after the prime, every variant switched by the tuner: 3 starts where the variants'
/// own starts were 15.
#[test]
fn a_tune_starts_the_ranks_once_per_mode_whatever_the_variants() {
    let d = tempfile::tempdir().unwrap();
    let mut r = super::testing::switched(d.path(), 0, 1, "");
    r.prime(Backend::Nccl, Mode::Eager).unwrap();
    let variants = super::testing::variants();
    for mode in [Mode::Eager, Mode::Graph] {
        for bytes in [1024, 2048, 4096, 1536, 3072, 1280, 3584] {
            for &b in &variants {
                let v = r.verify(b, bytes).unwrap();
                assert_eq!(v, Verification::Correct, "{b} {bytes}");
                let t = r.time(b, bytes, mode, 13).unwrap();
                // The prime's samples of NCCL's own choice come first.
                let primed = usize::from(b == Backend::Nccl && mode == Mode::Eager) * 5;
                let switched = match bytes {
                    1024 | 4096 => &t[primed..],
                    _ => &t[..],
                };
                assert!(switched.iter().all(|t| t.fract() == 0.75), "{b}: {t:?}");
                assert_eq!(r.time(b, bytes, mode, 10).unwrap().len(), 10);
            }
        }
    }
    let s = starts(d.path());
    assert_eq!(s.len(), 1 + 2, "{s:#?}");
    assert_eq!(r.starts(), 3, "the count the GPU test and the log read");
    assert_eq!(r.ran_channels(Backend::NcclTreeLl128, 3072), Some(2));
    let ids: Vec<&str> = variants.iter().map(|v| v.id()).collect();
    let all = format!("--variants {} ", ids.join(","));
    assert!(s[1..].iter().all(|s| s.contains(&all)), "{s:#?}");
    assert!(s.iter().all(|s| !s.contains("NCCL_ALGO=")), "{s:#?}");
    assert!(s[2].contains("--graph"), "{s:#?}");
    assert_eq!(
        r.own_channels(),
        Some(2),
        "read back from the switched start"
    );
    assert!(r.unfollowed().is_empty());
}

/// Cells that want more samples than a start gave, at one size, get them from one further
/// start for every variant there, not one start each.
#[test]
fn a_further_start_serves_every_variant_at_its_size() {
    let d = tempfile::tempdir().unwrap();
    let mut r = super::testing::switched(d.path(), 0, 1, "");
    r.prime(Backend::Nccl, Mode::Eager).unwrap();
    let variants = super::testing::variants();
    for &b in &variants {
        assert_eq!(r.verify(b, 1024).unwrap(), Verification::Correct);
        assert_eq!(r.time(b, 1024, Mode::Eager, 10).unwrap().len(), 10);
    }
    let first = r.starts();
    // What the first start left each variant at 1024 bytes, and 5 samples past it.
    let left: Vec<usize> = variants
        .iter()
        .map(|&b| r.left(b, Mode::Eager, 1024))
        .collect();
    for (&b, &left) in variants.iter().zip(&left) {
        let t = r.time(b, 1024, Mode::Eager, left as u32 + 5).unwrap();
        assert_eq!(t.len(), left + 5, "{b}");
    }
    assert_eq!(r.starts(), first + 1, "{:#?}", starts(d.path()));
    let s = starts(d.path());
    assert!(s.last().unwrap().contains("--sizes 1024 "), "{s:#?}");
}

/// A variant a further start ran beside the one asked for, whose read-back is missing there,
/// loses those samples only: it stays switched. The one asked for is judged as ever.
#[test]
fn a_read_back_missed_beside_the_asked_variant_leaves_its_switch_alone() {
    let d = tempfile::tempdir().unwrap();
    let mut r = super::testing::switched(d.path(), 0, 1, "");
    let (v, w) = (Backend::NcclTreeLl, Backend::NcclRingLl);
    let started = Started {
        timed: [v, w]
            .map(|b| super::super::Timed {
                channels: None,
                variant: Some(b),
                bytes: 1024,
                samples: vec![1.0],
            })
            .into(),
        ran: BTreeMap::new(),
        read: super::super::switch::ReadBack::default(),
    };
    r.keep_followed(v, Mode::Eager, &started, false);
    assert!(r.unfollowed().is_empty());
    assert_eq!(
        r.left(v, Mode::Eager, 1024),
        0,
        "its samples there are left out"
    );
    r.keep_followed(w, Mode::Eager, &started, true);
    assert!(r.unfollowed().contains_key(&w));
}

/// A variant whose read-back says NCCL ran something else under the tuner's switch is not
/// timed from it: its samples come from ranks of its own pinned through NCCL_ALGO, the other
/// variants' from the switch, and the next mode's switched start leaves it out.
#[test]
fn a_variant_nccl_did_not_follow_is_never_timed_as_the_pin() {
    let d = tempfile::tempdir().unwrap();
    let mut r = super::testing::switched(d.path(), 0, 1, "nccl_tree_ll");
    let t = r.time(Backend::NcclTreeLl, 1024, Mode::Eager, 3).unwrap();
    assert_eq!(
        t,
        [1.5, 2.5, 3.5],
        "the pinned start's, not the switch's .75"
    );
    let t = r.time(Backend::NcclRingLl, 1024, Mode::Eager, 2).unwrap();
    assert_eq!(t, [1.75, 2.75]);
    let why = &r.unfollowed()[&Backend::NcclTreeLl];
    assert_eq!(
        why,
        "NCCL ran RING/SIMPLE at 1024 bytes where the tuner forced TREE/LL"
    );
    let notes = r.unfollowed_notes();
    assert_eq!(
        notes,
        ["NCCL did not run nccl_tree_ll under artune's tuner switch (NCCL ran RING/SIMPLE at 1024 \
          bytes where the tuner forced TREE/LL), so nccl_tree_ll was timed by ranks pinned \
          through NCCL_ALGO/NCCL_PROTO"]
    );
    assert!(r.unfollowed_notes().is_empty(), "said once");
    let s = starts(d.path());
    assert_eq!(s.len(), 2, "{s:#?}");
    assert!(s[0].contains("--variants nccl,nccl_ring_ll,"), "{s:#?}");
    assert!(
        !s[1].contains("--variants") && s[1].contains("NCCL_ALGO=") && s[1].ends_with("Tree"),
        "{s:#?}"
    );
    r.time(Backend::NcclRingLl, 1024, Mode::Graph, 1).unwrap();
    let s = starts(d.path());
    assert!(
        s.len() == 3 && s[2].contains("--graph") && !s[2].contains("nccl_tree_ll,"),
        "{s:#?}"
    );
}

/// A switched start that fails (here a wrong sum) stops the switching: the variant asked for
/// starts ranks of its own, so a wrong sum is named for the variant that made it.
#[test]
fn a_failed_switched_start_leaves_each_variant_its_own_start() {
    let d = tempfile::tempdir().unwrap();
    let mut r = super::testing::switched(d.path(), 2000, 1, "");
    let b = Backend::NcclTreeSimple;
    let Verification::Wrong { reason } = r.verify(b, 2000).unwrap() else {
        panic!("a wrong sum is a wrong verification")
    };
    assert!(reason.contains("found a wrong sum"), "{reason}");
    let s = starts(d.path());
    assert_eq!(s.len(), 2, "{s:#?}");
    assert!(
        s[0].contains("--variants") && !s[1].contains("--variants"),
        "{s:#?}"
    );
    r.time(Backend::NcclRingLl, 4096, Mode::Eager, 1).unwrap();
    assert!(!starts(d.path())[2].contains("--variants"));
}

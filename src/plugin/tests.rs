use super::abi::*;
use super::*;
use crate::export::sample;
use std::ffi::c_void;

/// NCCL's table as enqueue.cc builds it: float[7][3], PAT (row 6) and CollNet disabled.
fn table() -> [[f32; 3]; 7] {
    let mut t = [[50.0f32; 3]; 7];
    for row in [2, 3, 4, 5, 6] {
        t[row] = [-1.0; 3];
    }
    t
}

fn ctx(tp: usize) -> Context {
    Context::from_profile(&sample::profile(), tp, 1, Mode::Graph, None).unwrap()
}

#[test]
fn pins_follow_the_profiles_nccl_choice() {
    let c = ctx(2);
    // 1 KiB: ring LL (8+2 us + ...) beats NCCL's own choice (14 us) by far more than 5%.
    assert_eq!(
        c.pin(1000).unwrap().map(|p| p.backend),
        Some(Backend::NcclRingLl)
    );
    // 16 MiB: ring Simple (24 GB/s) beats NCCL's own (20 GB/s).
    assert_eq!(
        c.pin(16 << 20).unwrap().map(|p| p.backend),
        Some(Backend::NcclRingSimple)
    );
    assert_eq!(c.pin(1 << 40), Err(Outcome::BeyondProfile));
}

#[test]
fn leaves_nccl_alone_where_the_profile_does() {
    // The rule left NCCL its own choice (or an older profile names no variant): no entry moves.
    for variant in [Some(Backend::Nccl), None] {
        let mut p = sample::profile();
        for g in &mut p.groups {
            for b in &mut g.buckets {
                b.nccl_choice = variant;
            }
        }
        let c = Context::from_profile(&p, 2, 1, Mode::Graph, None).unwrap();
        let mut t = table();
        let before = t;
        let out = unsafe { c.apply(NCCL_FUNC_ALLREDUCE, 1000, t.as_mut_ptr().cast(), 7, 3) };
        assert_eq!(out, Outcome::NcclOwnChoice);
        assert_eq!(t, before);
    }
}

#[test]
fn lowers_exactly_the_pinned_entry() {
    let c = ctx(2);
    let mut t = table();
    let before = t;
    let out = unsafe { c.apply(NCCL_FUNC_ALLREDUCE, 1000, t.as_mut_ptr().cast(), 7, 3) };
    assert_eq!(
        out,
        Outcome::Lowered(Pin {
            backend: Backend::NcclRingLl,
            algo: 1,
            proto: 0
        })
    );
    for a in 0..7 {
        for p in 0..3 {
            if (a, p) == (1, 0) {
                assert!(t[a][p] < before[a][p]);
            } else {
                assert_eq!(t[a][p], before[a][p], "entry [{a}][{p}] changed");
            }
        }
    }
}

#[test]
fn never_turns_disabled_entry_into_choice() {
    let c = ctx(2);
    let mut t = table();
    t[1][0] = -1.0; // NCCL disabled ring LL (e.g. NCCL_PROTO=^LL)
    let before = t;
    let out = unsafe { c.apply(NCCL_FUNC_ALLREDUCE, 1000, t.as_mut_ptr().cast(), 7, 3) };
    assert_eq!(out, Outcome::EntryUnavailable);
    assert_eq!(t, before);
}

#[test]
fn leaves_other_collectives_sizes_and_tables_alone() {
    let c = ctx(2);
    let mut t = table();
    let before = t;
    let ptr = t.as_mut_ptr().cast::<f32>();
    unsafe {
        assert_eq!(c.apply(2, 1000, ptr, 7, 3), Outcome::OtherCollective);
        assert_eq!(
            c.apply(NCCL_FUNC_ALLREDUCE, 1 << 30, ptr, 7, 3),
            Outcome::BeyondProfile
        );
        // A table too small for the pin (1 algorithm: tree only).
        assert_eq!(
            c.apply(NCCL_FUNC_ALLREDUCE, 1000, ptr, 1, 3),
            Outcome::EntryUnavailable
        );
        assert_eq!(
            c.apply(NCCL_FUNC_ALLREDUCE, 1000, std::ptr::null_mut(), 7, 3),
            Outcome::EntryUnavailable
        );
    }
    assert_eq!(t, before);
}

#[test]
fn no_group_or_multi_node_is_refused_with_reason() {
    let p = sample::profile();
    let e = Context::from_profile(&p, 8, 1, Mode::Graph, None)
        .err()
        .unwrap();
    assert!(e.contains("no TP8 group"), "{e}");
    let e = Context::from_profile(&p, 2, 2, Mode::Graph, None)
        .err()
        .unwrap();
    assert!(e.contains("2 nodes"), "{e}");
}

#[test]
fn exported_entry_points_survive_null_and_garbage() {
    unsafe {
        // Null context (init never ran): success, nothing touched.
        let mut t = table();
        let before = t;
        let mut ch = 0;
        let r = (ncclTunerPlugin_v6.get_coll_info)(
            std::ptr::null_mut(),
            NCCL_FUNC_ALLREDUCE,
            1000,
            1,
            t.as_mut_ptr().cast(),
            7,
            3,
            0,
            &mut ch,
        );
        assert_eq!(r, 0);
        assert_eq!(t, before);
        assert_eq!(ch, 0);
        assert_eq!((ncclTunerPlugin_v6.finalize)(std::ptr::null_mut()), 0);
        assert_eq!(
            (ncclTunerPlugin_v5.init)(
                std::ptr::null_mut(),
                0,
                2,
                1,
                None,
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            0
        );
    }
}

#[test]
fn context_roundtrip_through_v6_symbols() {
    // Build the context the way init does, but from the sample (not the environment), then
    // drive getCollInfo and finalize through the exported struct.
    let c: *mut c_void = Box::into_raw(Box::new(ctx(2))).cast();
    let mut t = table();
    let mut ch = 0;
    unsafe {
        let r = (ncclTunerPlugin_v6.get_coll_info)(
            c,
            NCCL_FUNC_ALLREDUCE,
            16 << 20,
            1,
            t.as_mut_ptr().cast(),
            7,
            3,
            0,
            &mut ch,
        );
        assert_eq!(r, 0);
        assert_eq!(t[1][2], 0.0, "ring Simple lowered at 16 MiB");
        assert_eq!(ch, 0, "channel count untouched");
        assert_eq!((ncclTunerPlugin_v6.finalize)(c), 0);
    }
    assert!(ncclTunerPlugin_v6.get_chunk_size.is_none());
}

#[test]
fn sets_channels_only_where_profile_states_them_and_an_entry_was_lowered() {
    let mut p = sample::profile();
    for g in &mut p.groups {
        g.nccl_channels = Some(8);
    }
    let c: *mut c_void = Box::into_raw(Box::new(
        Context::from_profile(&p, 2, 1, Mode::Graph, None).unwrap(),
    ))
    .cast();
    let call = |coll: c_int, bytes: usize, t: &mut [[f32; 3]; 7], ch: &mut c_int| unsafe {
        (ncclTunerPlugin_v6.get_coll_info)(c, coll, bytes, 1, t.as_mut_ptr().cast(), 7, 3, 0, ch)
    };
    let (mut t, mut ch) = (table(), 0);
    assert_eq!(call(NCCL_FUNC_ALLREDUCE, 16 << 20, &mut t, &mut ch), 0);
    assert_eq!(t[1][2], 0.0, "ring Simple lowered at 16 MiB");
    assert_eq!(
        ch, 8,
        "the profile's channel count is set with the lowered entry"
    );
    // Another collective: nothing lowered, channels untouched.
    let (mut t, mut ch) = (table(), 0);
    assert_eq!(call(0, 16 << 20, &mut t, &mut ch), 0);
    assert_eq!((t, ch), (table(), 0));
    // Beyond the profile: NCCL's own choice, channels untouched.
    let (mut t, mut ch) = (table(), 0);
    assert_eq!(call(NCCL_FUNC_ALLREDUCE, 1 << 40, &mut t, &mut ch), 0);
    assert_eq!(ch, 0);
    unsafe { assert_eq!((ncclTunerPlugin_v6.finalize)(c), 0) };
}

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

/// Each size gets the count measured for its own pin (`pin_channels`), the group's count where
/// its bucket has none; the audit expects exactly what the tuner sets.
#[test]
fn sets_the_channel_count_measured_for_each_sizes_pin() {
    let mut p = sample::profile();
    let serving = |g: &crate::profile::GroupProfile, bytes: u64| {
        g.buckets.iter().find(|b| b.bytes >= bytes).unwrap().bytes
    };
    for g in &mut p.groups {
        g.nccl_channels = Some(8);
        let (small, big) = (serving(g, 1000), serving(g, 16 << 20));
        assert_ne!(small, big);
        g.pin_channels.insert(small, 2);
        g.pin_channels.insert(big, 16);
    }
    let context = Context::from_profile(&p, 2, 1, Mode::Graph, None).unwrap();
    assert_eq!(
        context.channels_at(64 << 10),
        Some(8),
        "no per-pin count: the group's"
    );
    let c: *mut c_void = Box::into_raw(Box::new(context)).cast();
    let call = |bytes: usize| {
        let (mut t, mut ch) = (table(), 0);
        let r = unsafe {
            let t = t.as_mut_ptr().cast();
            (ncclTunerPlugin_v6.get_coll_info)(
                c,
                NCCL_FUNC_ALLREDUCE,
                bytes,
                1,
                t,
                7,
                3,
                0,
                &mut ch,
            )
        };
        assert_eq!(r, 0);
        ch
    };
    assert_eq!(call(1000), 2, "ring LL's measured count at 1000 B");
    assert_eq!(call(16 << 20), 16, "ring Simple's measured count at 16 MiB");
    unsafe { assert_eq!((ncclTunerPlugin_v6.finalize)(c), 0) };
}

#[test]
fn an_all_ignore_table_is_left_alone() {
    let c = ctx(2);
    let mut t = [[ALGO_PROTO_IGNORE; 3]; 7];
    let out = unsafe { c.apply(NCCL_FUNC_ALLREDUCE, 1000, t.as_mut_ptr().cast(), 7, 3) };
    assert_eq!(out, Outcome::AllIgnored);
    assert_eq!(t, [[ALGO_PROTO_IGNORE; 3]; 7]);
    // Nothing was marked warned: a real disabled entry at this size still gets its warning.
    assert!(c.warned.iter().all(|w| !w.load(Ordering::Relaxed)));
}

#[test]
fn no_cost_written_is_negative_nan_or_infinite() {
    let c = ctx(2);
    let odd = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.5,
        -1.0,
        0.0,
        1e30,
        50.0,
    ];
    for bytes in [1000u64, 64 << 10, 16 << 20] {
        let Some(pin) = c.pin(bytes).unwrap() else {
            continue;
        };
        for x in odd {
            let mut t = table();
            t[pin.algo as usize][pin.proto as usize] = x;
            let before = t;
            unsafe { c.apply(NCCL_FUNC_ALLREDUCE, bytes, t.as_mut_ptr().cast(), 7, 3) };
            for (a, row) in t.iter().enumerate() {
                for (p, &v) in row.iter().enumerate() {
                    let was = before[a][p];
                    if v.to_bits() != was.to_bits() {
                        assert!(v == 0.0 && was.is_finite() && was >= 0.0, "{was} -> {v}");
                    }
                }
            }
        }
    }
}

#[test]
fn what_the_user_pins_is_left_to_the_user() {
    let vars = |items: &[(&str, &str)]| {
        crate::profile::environment::relevant(items.iter().map(|(k, v)| (*k, *v)))
    };
    let pins = UserPins::from_vars(&vars(&[("NCCL_PROTO", "LL"), ("NCCL_MAX_NCHANNELS", "4")]));
    assert_eq!(pins.algo, ["NCCL_PROTO=LL"]);
    assert_eq!(pins.channels, ["NCCL_MAX_NCHANNELS=4"]);
    let c = ctx(2).respecting(&pins);
    let mut t = table();
    let before = t;
    let out = unsafe { c.apply(NCCL_FUNC_ALLREDUCE, 1000, t.as_mut_ptr().cast(), 7, 3) };
    assert_eq!(out, Outcome::PinnedByUser);
    assert_eq!(t, before);
    assert_eq!(c.channels_at(1000), None);
    // Channels alone pinned: entries still steered, no channel count set.
    let mut p = sample::profile();
    p.groups.iter_mut().for_each(|g| g.nccl_channels = Some(8));
    let only_channels = UserPins::from_vars(&vars(&[("NCCL_NCHANNELS", "2")]));
    let c = Context::from_profile(&p, 2, 1, Mode::Graph, None).unwrap();
    assert_eq!(c.channels_at(1000), Some(8));
    let c = c.respecting(&only_channels);
    assert_eq!(c.channels_at(1000), None);
    let out = unsafe { c.apply(NCCL_FUNC_ALLREDUCE, 1000, t.as_mut_ptr().cast(), 7, 3) };
    assert!(matches!(out, Outcome::Lowered(_)), "{out:?}");
}

#[test]
fn init_lines_name_the_nccl_version_pins_and_a_differing_environment() {
    let vars = |items: &[(&str, &str)]| {
        crate::profile::environment::relevant(items.iter().map(|(k, v)| (*k, *v)))
    };
    let mut p = sample::profile();
    p.environment = Some(crate::profile::Environment {
        variables: vars(&[("NCCL_P2P_LEVEL", "SYS")]),
        ..Default::default()
    });
    let now = vars(&[("NCCL_ALGO", "Ring"), ("NCCL_TUNER_PLUGIN", "libartune.so")]);
    let pins = UserPins::from_vars(&now);
    let lines = environment_lines(&p, &now, &pins, Some("2.31.1".into()));
    let text: Vec<&str> = lines.iter().map(|l| l.1.as_str()).collect();
    assert!(text[0].contains("loaded by NCCL 2.31.1"), "{text:?}");
    assert!(text[1].contains("NCCL_ALGO=Ring set"), "{text:?}");
    let warn = lines.iter().find(|l| l.0 == LOG_WARN).expect("a warning");
    assert!(
        warn.1.contains("NCCL_P2P_LEVEL=SYS when tuned, unset now"),
        "{}",
        warn.1
    );
    assert!(warn.1.contains("NCCL_ALGO unset when tuned"), "{}", warn.1);
    // The plugin variable engines set to load artune is not a difference.
    assert!(!warn.1.contains("NCCL_TUNER_PLUGIN"), "{}", warn.1);
    // The same environment: no warning.
    let same = vars(&[("NCCL_P2P_LEVEL", "SYS")]);
    let lines = environment_lines(&p, &same, &UserPins::default(), None);
    assert!(lines.iter().all(|l| l.0 != LOG_WARN), "{lines:?}");
    assert!(lines[0].1.contains("unknown version"));
}

/// The sample profile as measured on a real box, and that box as NVML would read it.
fn measured() -> (crate::profile::Profile, crate::topology::Topology) {
    let mut p = sample::profile();
    p.simulated = false;
    for (i, g) in p.topology.gpus.iter_mut().enumerate() {
        g.uuid = Some(format!("GPU-tuned-{i}"));
    }
    p.versions.driver = Some("570.86.15".into());
    let mut now = p.topology.clone();
    now.origin.kind = "nvml".into();
    (p, now)
}

/// What the plugin starts with on `now`: the context's pin at 1000 bytes, or why none.
fn start_on(now: &crate::topology::Topology, allow: Allow) -> Result<(Outcome, String), String> {
    let (p, _) = measured();
    let v = validity::validity(&p, now);
    let (c, lines) = Context::following(&p, "p.json", &v, allow, 2, 1, Mode::Graph, None)?;
    let mut t = table();
    let out = unsafe { c.apply(NCCL_FUNC_ALLREDUCE, 1000, t.as_mut_ptr().cast(), 7, 3) };
    Ok((out, lines[0].1.clone()))
}

#[test]
fn an_identical_node_or_a_driver_bump_is_followed_and_said() {
    let (_, mut now) = measured();
    for g in &mut now.gpus {
        g.uuid = Some(format!("{}-other-node", g.uuid.as_deref().unwrap()));
    }
    now.host.driver = Some("580.159.04".into());
    let (out, line) = start_on(&now, Allow::default()).unwrap();
    assert!(matches!(out, Outcome::Lowered(_)), "{out:?}");
    assert!(
        line.ends_with("; valid here; driver 570.86.15 → 580.159.04, tuned on another node of this class: re-timing its decisive sizes (artune check --measure) tells whether its choices still hold"),
        "{line}"
    );
}

#[test]
fn other_hardware_leaves_nccl_alone_unless_overridden_and_said() {
    let (_, now) = measured();
    let mut model = now.clone();
    model.gpus[1].name = "NVIDIA L40S".into();
    let mut width = now.clone();
    width.gpus[0].pcie.max_width = Some(8);
    let count = {
        let mut t = crate::topology::presets::get("pcie-2x").unwrap();
        t.origin.kind = "nvml".into();
        t
    };
    for now in [&model, &width, &count] {
        let why = start_on(now, Allow::default()).unwrap_err();
        assert!(why.starts_with("p.json is not valid here ("), "{why}");
        assert!(
            why.contains("ARTUNE_ALLOW_INVALID=1 to follow it anyway"),
            "{why}"
        );
        let allow = Allow {
            invalid: true,
            ..Allow::default()
        };
        let (out, line) = start_on(now, allow).unwrap();
        assert!(matches!(out, Outcome::Lowered(_)), "{out:?}");
        assert!(
            line.contains("; NOT valid here (")
                && line.ends_with("followed because ARTUNE_ALLOW_INVALID=1"),
            "{line}"
        );
    }
}

/// Calls getCollInfo of every exported tuner version (v3's own signature, v4..v7's) on `c`
/// at `bytes`; per version, the table after it and the channel count it set.
fn through_every_version(c: *mut c_void, bytes: usize) -> Vec<([[f32; 3]; 7], c_int)> {
    let v4: [GetCollInfo; 4] = [
        ncclTunerPlugin_v4.get_coll_info,
        ncclTunerPlugin_v5.get_coll_info,
        ncclTunerPlugin_v6.get_coll_info,
        ncclTunerPlugin_v7.get_coll_info,
    ];
    let (mut t, mut ch) = (table(), 0);
    let r = unsafe {
        let p = t.as_mut_ptr().cast();
        (ncclTunerPlugin_v3.get_coll_info)(c, NCCL_FUNC_ALLREDUCE, bytes, 1, p, 7, 3, &mut ch)
    };
    assert_eq!(r, 0);
    let mut out = vec![(t, ch)];
    for f in v4 {
        let (mut t, mut ch) = (table(), 0);
        let p = t.as_mut_ptr().cast();
        assert_eq!(
            unsafe { f(c, NCCL_FUNC_ALLREDUCE, bytes, 1, p, 7, 3, 0, &mut ch) },
            0
        );
        out.push((t, ch));
    }
    out
}

/// The measurement override, through every exported getCollInfo: ahead of the profile it
/// lowers exactly its entry and sets its channel count; cleared, the profile's pin and count
/// come back; where nothing follows a profile, NCCL's table is left as it was.
#[test]
fn the_override_wins_through_every_tuner_version_and_clearing_restores_the_profile() {
    static F: force::Force = force::Force::new();
    let mut p = sample::profile();
    p.groups.iter_mut().for_each(|g| g.nccl_channels = Some(8));
    let profile = Context::from_profile(&p, 2, 1, Mode::Graph, None).unwrap();
    let c: *mut c_void = Box::into_raw(Box::new(profile.forced_by(&F))).cast();
    let lowered_only = |t: &[[f32; 3]; 7], at: (usize, usize)| {
        let mut want = table();
        want[at.0][at.1] = 0.0;
        assert_eq!(*t, want);
    };
    // 1000 bytes: the profile pins ring LL [1][0] with 8 channels.
    F.set(Some(force::Forced {
        algo: 0,
        proto: 1,
        channels: Some(6),
    }));
    for (t, ch) in through_every_version(c, 1000) {
        lowered_only(&t, (0, 1));
        assert_eq!(ch, 6);
    }
    F.set(Some(force::Forced {
        algo: 1,
        proto: 2,
        channels: None,
    }));
    for (t, ch) in through_every_version(c, 1000) {
        lowered_only(&t, (1, 2));
        assert_eq!(ch, 0, "no count forced: none set");
    }
    F.set(None);
    for (t, ch) in through_every_version(c, 1000) {
        lowered_only(&t, (1, 0));
        assert_eq!(ch, 8, "the profile's count again");
    }
    unsafe { assert_eq!((ncclTunerPlugin_v6.finalize)(c), 0) };
    static G: force::Force = force::Force::new();
    let c: *mut c_void = Box::into_raw(Box::new(Context::passthrough(None).forced_by(&G))).cast();
    G.set(Some(force::Forced {
        algo: 0,
        proto: 2,
        channels: Some(2),
    }));
    for (t, ch) in through_every_version(c, 1 << 30) {
        lowered_only(&t, (0, 2));
        assert_eq!(ch, 2);
    }
    G.set(None);
    for (t, ch) in through_every_version(c, 1 << 30) {
        assert_eq!((t, ch), (table(), 0), "no profile, no override: NCCL's own");
    }
    unsafe { assert_eq!((ncclTunerPlugin_v6.finalize)(c), 0) };
}

/// The override follows the rule for the user's pins, and never turns a disabled entry into
/// a choice.
#[test]
fn the_override_leaves_the_users_pins_and_disabled_entries_alone() {
    static F: force::Force = force::Force::new();
    F.set(Some(force::Forced {
        algo: 0,
        proto: 0,
        channels: Some(4),
    }));
    let vars = |items: &[(&str, &str)]| {
        crate::profile::environment::relevant(items.iter().map(|(k, v)| (*k, *v)))
    };
    let algo = ctx(2)
        .forced_by(&F)
        .respecting(&UserPins::from_vars(&vars(&[("NCCL_ALGO", "Ring")])));
    let mut t = table();
    let out = unsafe { algo.apply(NCCL_FUNC_ALLREDUCE, 1000, t.as_mut_ptr().cast(), 7, 3) };
    assert_eq!((out, t), (Outcome::PinnedByUser, table()));
    assert_eq!(algo.channels_after(out, 1000), None);
    let channels = ctx(2)
        .forced_by(&F)
        .respecting(&UserPins::from_vars(&vars(&[("NCCL_NCHANNELS", "2")])));
    let out = unsafe { channels.apply(NCCL_FUNC_ALLREDUCE, 1000, t.as_mut_ptr().cast(), 7, 3) };
    assert!(
        matches!(out, Outcome::Forced(_)) && t[0][0] == 0.0,
        "{out:?}"
    );
    assert_eq!(channels.channels_after(out, 1000), None, "the user's count");
    let c = ctx(2).forced_by(&F);
    let mut t = table();
    t[0][0] = ALGO_PROTO_IGNORE;
    let before = t;
    let out = unsafe { c.apply(NCCL_FUNC_ALLREDUCE, 1000, t.as_mut_ptr().cast(), 7, 3) };
    assert_eq!((out, t), (Outcome::EntryUnavailable, before));
    let out = unsafe { c.apply(2, 1000, t.as_mut_ptr().cast(), 7, 3) };
    assert_eq!(out, Outcome::OtherCollective);
}

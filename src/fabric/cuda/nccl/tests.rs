use super::*;

#[test]
fn env_var_wins_alone() {
    let c = candidates(
        Some("/opt/x/libnccl.so.2"),
        &[PathBuf::from("/site")],
        |_| true,
    );
    assert_eq!(c, vec!["/opt/x/libnccl.so.2".to_string()]);
}

#[test]
fn system_names_come_before_wheels_and_missing_wheels_are_skipped() {
    let dirs = [PathBuf::from("/venv/site"), PathBuf::from("/usr/site")];
    let c = candidates(None, &dirs, |p| {
        p.starts_with("/usr/site") && p.ends_with("nvidia/nccl/lib/libnccl.so.2")
    });
    assert_eq!(
        c,
        vec![
            "libnccl.so".to_string(),
            "libnccl.so.2".to_string(),
            "/usr/site/nvidia/nccl/lib/libnccl.so.2".to_string()
        ]
    );
    // An empty variable is the same as none.
    assert_eq!(candidates(Some(""), &[], |_| true).len(), 2);
}

#[test]
fn wheel_layouts_in_order() {
    let c = candidates(None, &[PathBuf::from("/s")], |_| true);
    assert_eq!(
        &c[2..],
        &[
            "/s/nvidia/nccl/lib/libnccl.so.2".to_string(),
            "/s/nvidia/cu13/lib/libnccl.so.2".to_string(),
            "/s/nvidia/cu12/lib/libnccl.so.2".to_string()
        ]
    );
}

#[test]
fn config_prefix_matches_nccl_2_17_and_states_the_version_its_bounds_need() {
    // size_t, 2 x unsigned, 4 x int, const char*: 40 bytes on 64-bit targets.
    assert_eq!(std::mem::size_of::<Config>(), 40);
    // NCCL resets minCTAs and maxCTAs to their defaults where a config states a version
    // below 2.17 (init.cc, "check version"): stating 2.14 made every forced count NCCL's own.
    let c = Config::nonblocking(23206);
    assert_eq!(
        (c.size, c.magic, c.version, c.blocking),
        (40, 0xcafebeef, 21700, 0)
    );
    assert_eq!(Config::nonblocking(21700).version, 21700);
    assert_eq!(Config::nonblocking(21603).version, 21400);
}

#[test]
fn only_a_nccl_with_cta_bounds_forces_channels() {
    assert!(takes_cta_bounds(true, 23206));
    assert!(takes_cta_bounds(true, 21700));
    assert!(!takes_cta_bounds(true, 21603));
    assert!(!takes_cta_bounds(false, 23206));
}

#[test]
fn a_clique_is_ready_when_every_rank_is() {
    use Poll::*;
    assert_eq!(poll_all([Done, Done]), Done);
    assert_eq!(poll_all([Done, Pending]), Pending);
    assert_eq!(
        poll_all([Pending, Failed("x".into()), Done]),
        Failed("x".into())
    );
    assert_eq!(poll_all([]), Done);
}

#[test]
fn version_codes() {
    assert_eq!(version_string(22803), "2.28.3");
    assert_eq!(version_string(23007), "2.30.7");
    assert_eq!(version_string(2708), "2.7.8");
}

#[test]
fn a_forced_channel_count_fixes_both_cta_bounds_and_wins_over_room_for_sharing() {
    assert_eq!(
        Ctas::of(Some(4), Some(8)),
        Ctas {
            min: Some(4),
            max: Some(4)
        }
    );
    assert_eq!(
        Ctas::of(None, Some(8)),
        Ctas {
            min: None,
            max: Some(8)
        }
    );
    assert_eq!(Ctas::of(None, None), Ctas::default());
}

use super::*;
use crate::allreduce::Backend;

fn pin(b: Backend) -> Pin {
    super::super::pin_of(b).unwrap()
}

fn ran(algo: &'static str, proto: &'static str, channels: u32) -> Ran<'static> {
    Ran {
        algo,
        proto,
        channels,
    }
}

fn expect(b: Option<Backend>, channels: Option<u32>) -> Expected {
    Expected {
        pin: b.map(pin),
        channels,
    }
}

#[test]
fn the_rule_compares_variant_and_channels_as_a_maximum() {
    let e = expect(Some(Backend::NcclRingSimple), Some(2));
    assert_eq!(judge(e, ran("RING", "SIMPLE", 2)), Judgement::Agrees);
    // Fewer channels than set: NCCL spreads a small message over fewer; still the pin.
    assert_eq!(judge(e, ran("RING", "SIMPLE", 1)), Judgement::Agrees);
    assert_eq!(judge(e, ran("RING", "SIMPLE", 48)), Judgement::MoreChannels);
    assert_eq!(judge(e, ran("TREE", "SIMPLE", 2)), Judgement::OtherVariant);
    assert_eq!(judge(e, ran("RING", "LL", 2)), Judgement::OtherVariant);
    // Older spellings ("Ring", "Simple") are the same names.
    assert_eq!(judge(e, ran("Ring", "Simple", 2)), Judgement::Agrees);
    // No channel count set: any count agrees.
    let e = expect(Some(Backend::NcclTreeLl128), None);
    assert_eq!(judge(e, ran("TREE", "LL128", 64)), Judgement::Agrees);
    assert_eq!(
        judge(expect(None, None), ran("PAT", "SIMPLE", 1)),
        Judgement::Unpinned
    );
}

#[test]
fn a_class_is_logged_once_and_counted() {
    let mut s = Summary::default();
    let e = expect(Some(Backend::NcclRingLl), Some(2));
    assert_eq!(s.count(4096, e, ran("RING", "LL", 2)), None);
    let first = s.count(4096, e, ran("TREE", "LL", 2)).expect("a line");
    assert!(
        first.contains(
            "NCCL ran TREE/LL over 2 channels at 4096 bytes where the profile pins RING/LL"
        ),
        "{first}"
    );
    assert_eq!(
        s.count(8192, e, ran("TREE", "LL", 4)),
        None,
        "same class: no second line"
    );
    assert!(s
        .count(4096, e, ran("RING", "LL", 8))
        .unwrap()
        .contains("at most 2"));
    assert_eq!(
        s.count(1 << 30, expect(None, None), ran("RING", "SIMPLE", 32)),
        None
    );
    assert_eq!((s.allreduces, s.judged, s.agreed), (5, 4, 1));
    assert_eq!(s.classes.len(), 2);
    assert_eq!((s.classes[0].calls, s.classes[0].max_channels), (2, 4));
    assert_eq!(s.sizes.iter().map(|r| r.calls).sum::<u64>(), 5);
}

/// A rank's summary that ran `pinned` as pinned, `n` calls each, the tuner asked.
fn good(pinned: &[u64], n: u64) -> Summary {
    let mut s = Summary {
        following: true,
        tuner_calls: 10,
        nccl: Some("2.32.6".into()),
        ..Summary::default()
    };
    let e = expect(Some(Backend::NcclRingSimple), Some(2));
    for &b in pinned {
        for _ in 0..n {
            s.count(b, e, ran("RING", "SIMPLE", 2));
        }
    }
    s.count(1 << 20, expect(None, None), ran("RING", "LL", 24));
    s
}

fn not_followed(v: Verdict) -> String {
    match v {
        Verdict::NotFollowed(why) => why,
        v => panic!("expected a refusal, got {v:?}"),
    }
}

#[test]
fn follows_when_every_rank_ran_every_pinned_size_as_pinned() {
    let pinned = [393216, 655360];
    let v = verdict(&[good(&pinned, 3), good(&pinned, 3)], &pinned, 2);
    assert_eq!(
        v,
        Verdict::Follows {
            agreed: 12,
            unpinned: 2,
            ranks: 2
        }
    );
}

#[test]
fn each_cause_is_named_in_order() {
    let pinned = [393216];
    // Nothing loaded.
    assert!(not_followed(verdict(&[], &pinned, 2)).contains("no profiler"));
    // A rank missing.
    assert!(not_followed(verdict(&[good(&pinned, 1)], &pinned, 2)).contains("1 of 2 ranks"));
    // NCCL_ALGO in the environment: named even where the variant happens to agree.
    let mut s = good(&pinned, 1);
    s.user_pins = vec!["NCCL_ALGO=Tree".into()];
    let why = not_followed(verdict(&[s.clone(), good(&pinned, 1)], &pinned, 2));
    assert!(why.starts_with("NCCL_ALGO=Tree is set"), "{why}");
    assert!(!why.contains("NCCL ran"), "{why}");
    // ... and what NCCL ran instead, where the profiler saw it.
    s.count(
        393216,
        expect(Some(Backend::NcclRingSimple), Some(2)),
        ran("TREE", "SIMPLE", 2),
    );
    let why = not_followed(verdict(&[s, good(&pinned, 1)], &pinned, 2));
    assert!(
        why.contains("steers nothing (NCCL ran TREE/SIMPLE where the profile pins RING/SIMPLE, first at 393216 bytes; 1 of 3 pinned calls differ)"),
        "{why}"
    );
    // The tuner refuses the profile.
    let mut s = good(&pinned, 1);
    s.following = false;
    s.why_not = Some("p.json is not valid here (GPU model)".into());
    let why = not_followed(verdict(&[s], &pinned, 1));
    assert!(
        why.contains("the tuner follows no profile: p.json is not valid here"),
        "{why}"
    );
    // The tuner never asked.
    let mut s = good(&pinned, 1);
    s.tuner_calls = 0;
    assert!(not_followed(verdict(&[s], &pinned, 1)).contains("never asked"));
    // Another variant.
    let mut s = good(&pinned, 1);
    s.count(
        393216,
        expect(Some(Backend::NcclRingSimple), Some(2)),
        ran("TREE", "SIMPLE", 2),
    );
    let why = not_followed(verdict(&[s], &pinned, 1));
    assert!(
        why.contains("NCCL 2.32.6 ran TREE/SIMPLE where the profile pins RING/SIMPLE"),
        "{why}"
    );
    assert!(why.contains("1 of 2 pinned calls differ"), "{why}");
    // More channels than set.
    let mut s = good(&pinned, 1);
    s.count(
        393216,
        expect(Some(Backend::NcclRingSimple), Some(2)),
        ran("RING", "SIMPLE", 48),
    );
    let why = not_followed(verdict(&[s], &pinned, 1));
    assert!(
        why.contains("over 48 channels where the tuner set at most 2"),
        "{why}"
    );
    // A pinned size never seen (a one-rank NCCL copies locally).
    let why = not_followed(verdict(&[good(&[], 1)], &pinned, 1));
    assert!(why.contains("no allreduce of 393216 bytes"), "{why}");
}

#[test]
fn a_summary_reads_back_as_written() {
    let s = good(&[4096], 2);
    let text = serde_json::to_string(&s).unwrap();
    let back: Summary = serde_json::from_str(&text).unwrap();
    assert_eq!(back, s);
}

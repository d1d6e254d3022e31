use super::*;
use crate::allreduce::Mode;
use crate::export::sample;
use crate::profile::Query;

#[test]
fn spec_grammar() {
    let w = Workload::parse_spec("122x7168xbf16@1..16").unwrap();
    assert_eq!(
        w.terms,
        vec![Term {
            count: 122,
            size: Size::PerToken {
                hidden: 7168,
                dtype: Dtype::Bf16
            }
        }]
    );
    assert_eq!(w.tokens, (1..=16).collect::<Vec<_>>());
    assert_eq!(w.steps()[2], (Some(3), vec![(122, 7168 * 2 * 3)]));
    let w = Workload::parse_spec("61x7168xbf16 + 2x4K @ 8,16").unwrap();
    assert_eq!(
        w.steps()[1],
        (Some(16), vec![(61, 7168 * 2 * 16), (2, 4096)])
    );
    let w = Workload::parse_spec("3x1MiB").unwrap();
    assert_eq!(w.steps(), vec![(None, vec![(3, 1 << 20)])]);
}

#[test]
fn spec_errors_are_one_sentence() {
    for (spec, needle) in [
        ("122x7168xbf16", "needs token counts"),
        ("122x7168xint8@1", "not bf16"),
        ("0x7168xbf16@1", "count `0`"),
        ("1x7168xbf16@16..1", "empty"),
        ("1x7168xbf16@1..100000", "more than 4096"),
        ("x", "not a whole number"),
        ("", "no allreduces"),
        ("1x0", "1 byte to 1 TiB"),
        ("1x2x3x4", "not COUNTxHIDDENxDTYPE"),
        ("122x7168@1..3", "no term depends on the token count"),
    ] {
        let e = Workload::parse_spec(spec).unwrap_err().to_string();
        assert!(e.contains(needle), "{spec}: {e}");
        assert!(!e.contains('\n'), "{spec}: {e}");
    }
}

/// A file of the wrong shape is said in the file format's words: which item, which
/// field, what it must be; never serde's "invalid type: sequence, expected u64".
#[test]
fn json_errors_name_the_item_and_field() {
    for (text, needles) in [
        (
            r#"[{"count":122,"hidden":7168,"dtype":"bf16","tokens":[1,4]}]"#,
            &[
                "item 0's `tokens` is a list; it must be a whole number",
                "@1,4",
            ][..],
        ),
        (
            r#"{"count":2}"#,
            &["it is an object; it must be a JSON list of allreduces, each {\"count\": N"],
        ),
        (
            r#"[{"count":2,"bytes":"4K"}]"#,
            &["item 0's `bytes` is the string \"4K\"; it must be a whole number"],
        ),
        (
            r#"[{"count":2,"bytes":4},{"count":2,"byte":4}]"#,
            &["item 1 has a field \"byte\" no item has"],
        ),
        (r#"[{"bytes":4}]"#, &["item 0 has no `count`"]),
        (
            r#"[{"count":1,"hidden":4,"dtype":2,"tokens":1}]"#,
            &["item 0's `dtype` is 2; it must be \"bf16\""],
        ),
        (r#"[3]"#, &["item 0 is 3; each item is an object"]),
        (r#"[{"count": 2"#, &["it ends too early"]),
    ] {
        let e = Workload::parse_json(text).unwrap_err().to_string();
        for n in needles {
            assert!(e.contains(n), "{text}: {e}");
        }
        for serde in ["invalid type", "expected", "line 1 column"] {
            assert!(!e.contains(serde), "{text}: {e}");
        }
    }
}

#[test]
fn json_items() {
    let w = Workload::parse_json(r#"[{"count": 2, "bytes": 4096}, {"count": 1, "hidden": 4096, "dtype": "fp16", "tokens": 3}]"#).unwrap();
    assert_eq!(w.steps(), vec![(None, vec![(2, 4096), (1, 4096 * 2 * 3)])]);
    assert!(Workload::parse_json(r#"[{"count": 2}]"#)
        .unwrap_err()
        .to_string()
        .contains("either"));
    assert!(Workload::parse_json(r#"[{"count": 2, "bytes": 1, "hidden": 3}]"#).is_err());
    assert!(Workload::parse_json("[]").is_err());
    // Too large is said with the limit (it once said "both must be at least 1").
    let e =
        Workload::parse_json(r#"[{"count": 1, "hidden": 99999999, "dtype": "bf16", "tokens": 4}]"#)
            .unwrap_err()
            .to_string();
    assert!(e.contains("hidden must be 1 to 16777216"), "{e}");
}

#[test]
fn predict_sums_counts_and_reports_beyond() {
    let p = sample::profile();
    let w = Workload::parse_spec("10x1024").unwrap();
    let g = p
        .group(Query {
            tp: 2,
            mode: Mode::Graph,
            gpus: None,
        })
        .unwrap();
    let pr = predict(&p, g, &w).unwrap();
    let b = &pr.group.buckets[0];
    let want = 10.0 * b.results[&b.choice].median_us;
    assert!((pr.rows[0].us[0].clone().unwrap() - want).abs() < 1e-9);
    let nccl = 10.0 * b.results[&Backend::Nccl].median_us;
    assert!((pr.rows[0].us[1].clone().unwrap() - nccl).abs() < 1e-9);
    let big = Workload::parse_spec("1x1G").unwrap();
    let pr = predict(&p, g, &big).unwrap();
    assert_eq!(pr.rows[0].beyond, vec![1 << 30]);
    assert!(pr.rows[0].us.iter().all(|u| u.is_err()));
}

#[test]
fn one_stage_waived_says_why() {
    let mut p = sample::profile();
    let g = p
        .groups
        .iter_mut()
        .find(|g| g.tp == 4 && g.mode == Mode::Graph)
        .unwrap();
    for b in &mut g.buckets {
        b.results.remove(&Backend::OneStagePull);
        b.waived.insert(Backend::OneStagePull, "no P2P".into());
    }
    let g = p
        .group(Query {
            tp: 4,
            mode: Mode::Graph,
            gpus: None,
        })
        .unwrap();
    let pr = predict(&p, g, &Workload::parse_spec("1x1K").unwrap()).unwrap();
    let e = pr.rows[0].us[2].clone().unwrap_err();
    assert!(e.contains("one_stage_pull was waived: no P2P"), "{e}");
    // vLLM uses NCCL on 4 PCIe GPUs, so its cost is NCCL's.
    assert_eq!(pr.rows[0].us[3], pr.rows[0].us[1]);
}

//! Hostile and broken profile and topology files: every input gets an answer (the value or a
//! one-line error that names the problem), never a panic, and never an allocation sized by a
//! number in the file. Property tests mutate valid documents; named cases pin the messages;
//! the binary is checked end to end with `artune topo --topology`.

mod common;

use std::path::Path;

use artune::fabric::Backend;
use artune::profile::{Bucket, Profile, LIMITS, SCHEMA_VERSION};
use artune::topology::{file, presets};
use proptest::prelude::*;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Valid documents to start from.

// Built from JSON by field name, the schema's contract, so fields added later with defaults do
// not break this suite. Times are binary fractions: serde_json (without its `float_roundtrip`
// feature) can read a 17-digit float back one unit in the last place off, and these tests
// compare values exactly.
fn timing(us: f64) -> Value {
    json!({"median_us": us, "ci_low_us": us - 0.5, "ci_high_us": us + 0.75, "samples": 20, "outliers": 1})
}

fn group(gpus: &[usize], mode: &str) -> Value {
    let bucket = |bytes: u64, choice: &str| {
        json!({
            "bytes": bytes,
            "choice": choice,
            "results": {"nccl": timing(21.5), "one_stage_pull": timing(bytes as f64 / 1024.0 + 7.25)},
            "waived": {"two_stage_push": "timed out"},
        })
    };
    json!({
        "gpus": gpus,
        "tp": gpus.len(),
        "mode": mode,
        "dtype": "bf16",
        "placement": "one switch",
        "buckets": [bucket(4096, "one_stage_pull"), bucket(8192, "one_stage_pull"), bucket(65536, "nccl")],
        "crossovers": [{"bytes": 65536, "from": "one_stage_pull", "to": "nccl"}],
        "memory": {
            "nccl": {"bytes_per_gpu": 40u64 << 20, "measured": false},
            "one_stage_pull": {"bytes_per_gpu": 3u64 << 20, "measured": true, "serves_up_to_bytes": 8192},
        },
    })
}

/// A profile of a 4-GPU machine touching every part of the schema.
fn profile() -> Profile {
    let topology = presets::get("pcie-4x-1switch").unwrap();
    let v = json!({
        "schema_version": SCHEMA_VERSION,
        "tool_version": "0.1.0",
        "created": "2026-11-29T08:49:54Z",
        "simulated": true,
        "fabric": "simulated pcie-4x-1switch",
        "fingerprint": {"topology_class": topology.class_hash(), "host": topology.host_hash()},
        "versions": {"driver": "580.65", "cuda": "13.0", "nccl": null},
        "topology": topology,
        "groups": [group(&[0, 1], "graph"), group(&[0, 1, 2, 3], "eager")],
        "contention": [{
            "gpus": [0, 1, 2, 3],
            "direction": "write",
            "bytes": 1 << 20,
            "points": [
                {"peers": 1, "per_gpu_gbps": 50.5, "aggregate_gbps": 202.0},
                {"peers": 3, "per_gpu_gbps": 30.25, "aggregate_gbps": 363.0},
            ],
        }],
        "settings": {
            "min_bytes": 1024,
            "max_bytes": 65536,
            "tp": [2, 4],
            "modes": ["graph", "eager"],
            "seed": 1,
            "target_ci": 0.015625,
            "tuning_seconds": 12.5,
        },
        "faults": ["two_stage_push timed out at 8192 bytes"],
    });
    serde_json::from_value(v).unwrap()
}

fn profile_json() -> String {
    profile().to_json()
}

fn preset_names() -> Vec<&'static str> {
    presets::list().map(|(n, _)| n).collect()
}

// ---------------------------------------------------------------------------------------------
// What every answer must look like.

/// An error a user can read: one line, not empty, not a wall of text.
fn assert_clear(e: &str) {
    assert!(!e.is_empty(), "empty error");
    assert!(
        !e.contains('\n') && !e.contains('\r'),
        "error is not one line: {e:?}"
    );
    assert!(
        e.len() <= 2000,
        "error is {} bytes long: {}",
        e.len(),
        &e[..200]
    );
}

/// Runs both parsers on `text`; whatever either accepts must still be accepted once rewritten.
fn answer_both(text: &str) -> (Result<(), String>, Result<(), String>) {
    let p = Profile::parse(text)
        .map(|p| {
            let again = p.to_json();
            Profile::parse(&again)
                .unwrap_or_else(|e| panic!("accepted profile refused once rewritten: {e}"));
        })
        .map_err(|e| e.to_string());
    let t = file::parse(text)
        .map(|t| {
            let again = serde_json::to_string(&t).unwrap();
            file::parse(&again)
                .unwrap_or_else(|e| panic!("accepted topology refused once rewritten: {e}"));
        })
        .map_err(|e| e.to_string());
    for e in [&p, &t].into_iter().filter_map(|r| r.as_ref().err()) {
        assert_clear(e);
    }
    (p, t)
}

fn perr(text: &str) -> String {
    match Profile::parse(text).map_err(|e| e.to_string()) {
        Ok(_) => panic!("profile accepted: {}", &text[..text.len().min(300)]),
        Err(e) => {
            assert_clear(&e);
            e
        }
    }
}

fn terr(text: &str) -> String {
    match file::parse(text).map_err(|e| e.to_string()) {
        Ok(_) => panic!("topology accepted: {}", &text[..text.len().min(300)]),
        Err(e) => {
            assert_clear(&e);
            e
        }
    }
}

fn assert_has(e: &str, words: &[&str]) {
    for w in words {
        assert!(e.contains(w), "expected {w:?} in: {e}");
    }
}

/// The profile with its JSON edited as a value.
fn profile_edit(f: impl FnOnce(&mut Value)) -> String {
    let mut v: Value = serde_json::from_str(&profile_json()).unwrap();
    f(&mut v);
    v.to_string()
}

/// A preset's JSON edited as a value.
fn topo_edit(name: &str, f: impl FnOnce(&mut Value)) -> String {
    let mut v: Value = serde_json::from_str(presets::json(name).unwrap()).unwrap();
    f(&mut v);
    v.to_string()
}

// ---------------------------------------------------------------------------------------------
// Mutations of valid JSON text.

/// Where a JSON value starting at `start` ends (exclusive), for valid JSON.
fn value_end(b: &[u8], start: usize) -> usize {
    let mut i = start;
    match b[i] {
        b'"' => {
            i += 1;
            while b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i + 1
        }
        b'{' | b'[' => {
            let mut depth = 0usize;
            loop {
                match b[i] {
                    b'"' => i = value_end(b, i) - 1,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return i + 1;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            while i < b.len() && !b",}] \n\r\t".contains(&b[i]) {
                i += 1;
            }
            i
        }
    }
}

/// (key start, value start, value end) of every object member, in text order.
fn members(text: &str) -> Vec<(usize, usize, usize)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'"' {
            let end = value_end(b, i);
            let mut j = end;
            while j < b.len() && b[j].is_ascii_whitespace() {
                j += 1;
            }
            if j < b.len() && b[j] == b':' {
                j += 1;
                while b[j].is_ascii_whitespace() {
                    j += 1;
                }
                out.push((i, j, value_end(b, j)));
            }
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

/// Number tokens (start, end) outside strings.
fn numbers(text: &str) -> Vec<(usize, usize)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => i = value_end(b, i),
            b'-' | b'0'..=b'9' => {
                let end = value_end(b, i);
                out.push((i, end));
                i = end;
            }
            _ => i += 1,
        }
    }
    out
}

const EXTREMES: &[&str] = &[
    "0",
    "-0",
    "-1",
    "0.5",
    "-0.0",
    "1e400",
    "-1e400",
    "1e-400",
    "4.9e-324",
    "1.7976931348623157e308",
    "255",
    "256",
    "257",
    "4294967295",
    "4294967296",
    "1099511627776",
    "1099511627777",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "123456789012345678901234567890",
    "NaN",
    "Infinity",
    "-Infinity",
    "null",
    "true",
    "\"1\"",
    "[]",
    "{}",
];

#[derive(Debug, Clone)]
enum Mutation {
    Truncate(prop::sample::Index),
    Flip(prop::sample::Index, u8),
    Insert(prop::sample::Index, u8),
    Delete(prop::sample::Index, usize),
    Number(prop::sample::Index, &'static str),
    DuplicateKey(prop::sample::Index),
    Nest(prop::sample::Index, usize),
    Splice(prop::sample::Index, prop::sample::Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    use prop::sample::Index;
    prop_oneof![
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (
            any::<Index>(),
            prop::sample::select(b"{}[]\",:-0123456789.eE \\nultrfa\x00\xff".to_vec())
        )
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<Index>(), 1usize..64).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (any::<Index>(), prop::sample::select(EXTREMES)).prop_map(|(i, x)| Mutation::Number(i, x)),
        any::<Index>().prop_map(Mutation::DuplicateKey),
        (any::<Index>(), 1usize..80).prop_map(|(i, d)| Mutation::Nest(i, d)),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::Splice(a, b)),
    ]
}

/// Applies one mutation to JSON text (which may already be broken: structural mutations fall
/// back to byte edits when the text is no longer valid JSON).
fn mutate(text: &str, m: &Mutation) -> Vec<u8> {
    let mut b = text.as_bytes().to_vec();
    let valid = serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok();
    match m {
        Mutation::Truncate(i) => b.truncate(i.index(b.len() + 1)),
        Mutation::Flip(i, bit) if !b.is_empty() => {
            let i = i.index(b.len());
            b[i] ^= 1 << bit;
        }
        Mutation::Insert(i, byte) => b.insert(i.index(b.len() + 1), *byte),
        Mutation::Delete(i, n) if !b.is_empty() => {
            let i = i.index(b.len());
            b.drain(i..(i + n).min(b.len()));
        }
        Mutation::Number(i, x) if valid => {
            let nums = numbers(text);
            if !nums.is_empty() {
                let (s, e) = nums[i.index(nums.len())];
                b.splice(s..e, x.bytes());
            }
        }
        Mutation::DuplicateKey(i) if valid => {
            let ms = members(text);
            if !ms.is_empty() {
                let (k, _, e) = ms[i.index(ms.len())];
                let copy = format!("{}, ", &text[k..e]);
                b.splice(k..k, copy.bytes());
            }
        }
        Mutation::Nest(i, d) if valid => {
            let ms = members(text);
            if !ms.is_empty() {
                let (_, s, e) = ms[i.index(ms.len())];
                let nested = format!("{}{}{}", "[".repeat(*d), &text[s..e], "]".repeat(*d));
                b.splice(s..e, nested.bytes());
            }
        }
        Mutation::Splice(from, to) if valid => {
            // Move one member's value over another's: right syntax, wrong place.
            let ms = members(text);
            if !ms.is_empty() {
                let (_, s1, e1) = ms[from.index(ms.len())];
                let (_, s2, e2) = ms[to.index(ms.len())];
                if e2 <= s1 || e1 <= s2 {
                    b.splice(s2..e2, text[s1..e1].bytes());
                }
            }
        }
        _ => {}
    }
    b
}

fn mutated_documents() -> impl Strategy<Value = (usize, Vec<Mutation>)> {
    // 0 is the profile, 1.. the presets.
    (
        0..=preset_names().len(),
        prop::collection::vec(mutation(), 1..4),
    )
}

fn source(which: usize) -> String {
    match which {
        0 => profile_json(),
        n => presets::json(preset_names()[n - 1]).unwrap().to_string(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_get_an_answer(bytes in prop::collection::vec(any::<u8>(), 0..1024)) {
        let _ = answer_both(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn random_json_shaped_text_gets_an_answer(
        text in prop::collection::vec(prop::sample::select(
            vec!["{", "}", "[", "]", ",", ":", "\"gpus\"", "\"schema_version\"", "\"a\"", "1", "-1", "1e400",
                 "null", "true", " ", "\"\\u0000\"", "0.5", "\"sw0\""]), 0..200)
    ) {
        let _ = answer_both(&text.concat());
    }

    #[test]
    fn mutated_documents_get_an_answer((which, ms) in mutated_documents()) {
        let mut text = source(which);
        for m in &ms {
            text = String::from_utf8_lossy(&mutate(&text, m)).into_owned();
        }
        let _ = answer_both(&text);
    }

    /// Any valid document with one member written twice is refused, naming the repeat.
    #[test]
    fn any_repeated_key_is_refused((which, i) in (0..=preset_names().len(), any::<prop::sample::Index>())) {
        let text = String::from_utf8(mutate(&source(which), &Mutation::DuplicateKey(i))).unwrap();
        let e = if which == 0 { perr(&text) } else { terr(&text) };
        prop_assert!(e.contains("appears twice"), "{}", e);
    }

    /// Wrapping any value deeper than the limit is refused as too deep, whatever the value was.
    #[test]
    fn any_deep_nesting_is_refused((which, i, d) in (0..=preset_names().len(), any::<prop::sample::Index>(), 32usize..200)) {
        let text = String::from_utf8(mutate(&source(which), &Mutation::Nest(i, d))).unwrap();
        let e = if which == 0 { perr(&text) } else { terr(&text) };
        prop_assert!(e.contains("nested more than 32 deep"), "{}", e);
    }

    /// Any number replaced by an extreme: an answer, and values JSON cannot hold are named.
    #[test]
    fn any_number_made_extreme_gets_an_answer((which, i, x) in (0..=preset_names().len(), any::<prop::sample::Index>(), prop::sample::select(EXTREMES))) {
        let text = String::from_utf8(mutate(&source(which), &Mutation::Number(i, x))).unwrap();
        let (p, t) = answer_both(&text);
        let e = if which == 0 { p.unwrap_err_or_default() } else { t.unwrap_err_or_default() };
        match x {
            "1e400" | "-1e400" => prop_assert!(e.contains("too large to represent"), "{}", e),
            "NaN" | "Infinity" | "-Infinity" => prop_assert!(e.contains("not valid JSON"), "{}", e),
            _ => {}
        }
    }
}

trait ErrOrDefault {
    fn unwrap_err_or_default(self) -> String;
}

impl ErrOrDefault for Result<(), String> {
    fn unwrap_err_or_default(self) -> String {
        self.err().unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------------
// Named cases, one per kind of damage.

#[test]
fn every_truncation_says_truncated() {
    for (what, text) in std::iter::once(("profile".to_string(), profile_json())).chain(
        preset_names()
            .into_iter()
            .map(|n| (n.to_string(), presets::json(n).unwrap().to_string())),
    ) {
        let whole = text.trim_end().len();
        for cut in (0..whole).step_by(7).filter(|&c| text.is_char_boundary(c)) {
            let prefix = &text[..cut];
            let e = if what == "profile" {
                perr(prefix)
            } else {
                terr(prefix)
            };
            let want = if prefix.trim().is_empty() {
                "empty"
            } else {
                "truncated"
            };
            assert!(e.contains(want), "{what} cut at {cut}: {e}");
        }
    }
}

#[test]
fn valid_documents_are_accepted() {
    assert_eq!(Profile::parse(&profile_json()).unwrap(), profile());
    for n in preset_names() {
        file::parse(presets::json(n).unwrap()).unwrap();
    }
}

#[test]
fn committed_v1_profile_still_parses() {
    // Written by this suite's profile() when the suite was added; schema v1 readers must keep
    // accepting it (fields may be added, never renamed).
    let text = include_str!("corpus/profile-v1-4x.json");
    assert_eq!(Profile::parse(text).unwrap(), profile());
}

#[test]
fn malformed_json_is_named() {
    for text in [
        "{ not json",
        "{\"a\": }",
        "{\"a\" 1}",
        "{'a': 1}",
        "{\"a\": 1,}",
        "{} {}",
        "\u{0}",
    ] {
        assert_has(&perr(text), &["not valid JSON", "line 1"]);
        assert_has(&terr(text), &["not valid JSON"]);
    }
    assert_has(&perr(""), &["empty"]);
    assert_has(&terr("  \n"), &["empty"]);
    assert_has(&perr("\u{feff}{}"), &["byte-order mark"]);
    for text in ["[1, 2]", "1", "\"profile\"", "null"] {
        assert_has(&perr(text), &["not a JSON object"]);
        assert_has(&terr(text), &["not a JSON object"]);
    }
}

#[test]
fn deep_nesting_is_named() {
    let deep = format!("{{\"gpus\": {}{}}}", "[".repeat(10_000), "]".repeat(10_000));
    assert_has(&perr(&deep), &["nested more than 32 deep"]);
    assert_has(&terr(&deep), &["nested more than 32 deep"]);
    assert_eq!(LIMITS.depth, 32);
    // Unclosed: still the depth, not a stack overflow or "truncated".
    assert_has(&terr(&"[".repeat(1_000_000)), &["nested more than 32 deep"]);
}

#[test]
fn wrong_versions_are_named() {
    let set = |v: Value| profile_edit(|p| p["schema_version"] = v);
    assert_has(
        &perr(&set(json!(7))),
        &["schema version 7", "newer", "upgrade artune"],
    );
    assert_has(
        &perr(&set(json!(0))),
        &["schema version 0 is not one this artune reads"],
    );
    assert_has(
        &perr(&set(json!("1"))),
        &["`schema_version` is \"1\"", "not a version number"],
    );
    assert_has(&perr(&set(json!(-1))), &["`schema_version` is -1"]);
    assert_has(&perr(&set(json!(1.5))), &["`schema_version` is 1.5"]);
    assert_has(
        &perr(&profile_edit(|p| p.as_object_mut().unwrap().clear())),
        &["no `schema_version`"],
    );
}

#[test]
fn numbers_out_of_range_are_named_with_their_place() {
    let text = profile_json();
    let bytes = text.find("\"bytes\": 4096").unwrap() + "\"bytes\": ".len();
    let with = |x: &str| format!("{}{x}{}", &text[..bytes], &text[bytes + 4..]);
    assert_has(&perr(&with("1e400")), &["number too large to represent"]);
    let e = perr(&with("18446744073709551616"));
    assert_has(&e, &["`groups[0].buckets[0].bytes`", "whole number"]);
    assert_has(
        &perr(&with("-1")),
        &[
            "`groups[0].buckets[0].bytes`",
            "it is -1, and it cannot be negative",
        ],
    );
    assert_has(
        &perr(&with("4096.5")),
        &[
            "`groups[0].buckets[0].bytes`",
            "it is 4096.5; it must be a whole number",
        ],
    );
    assert_has(&perr(&with("NaN")), &["not valid JSON"]);
    assert_has(
        &perr(&with("\"4096\"")),
        &[
            "`groups[0].buckets[0].bytes`",
            "it is a string \"4096\"; write a whole number without quotes",
        ],
    );
    // A u8 field beyond 255.
    let gen = topo_edit("pcie-2x", |t| t["gpus"][1]["pcie"]["gen"] = json!(300));
    assert_has(&terr(&gen), &["`gpus[1].pcie.gen`", "300"]);
    // Negative where unsigned, in a topology.
    let neg = topo_edit("pcie-2x", |t| t["sockets"][0]["id"] = json!(-3));
    assert_has(&terr(&neg), &["`sockets[0].id`", "-3"]);
}

#[test]
fn absurd_sizes_are_named() {
    let mut p = profile();
    p.groups[0]
        .memory
        .get_mut(&Backend::OneStagePull)
        .unwrap()
        .bytes_per_gpu = 1 << 41;
    assert_has(
        &perr(&p.to_json()),
        &["claims 2199023255552 bytes per GPU", "1 TiB"],
    );
    let mut p = profile();
    p.groups[0].buckets[2].bytes = (1 << 40) + 1;
    assert_has(&perr(&p.to_json()), &["bucket of 1099511627777 bytes"]);
    let mut p = profile();
    p.groups[0].buckets[0].bytes = 0;
    assert_has(&perr(&p.to_json()), &["bucket of 0 bytes"]);
    let mut p = profile();
    p.groups[0]
        .memory
        .get_mut(&Backend::OneStagePull)
        .unwrap()
        .serves_up_to_bytes = Some(u64::MAX);
    assert_has(&perr(&p.to_json()), &["serve messages above 1 TiB"]);
    let mut p = profile();
    p.settings.max_bytes = u64::MAX;
    assert_has(&perr(&p.to_json()), &["settings span"]);
    let mut p = profile();
    p.contention[0].points[0].per_gpu_gbps = -1.0;
    assert_has(
        &perr(&p.to_json()),
        &["contention curve 0", "negative bandwidth"],
    );
    let mut p = profile();
    p.groups[1].tp = usize::MAX;
    assert_has(&perr(&p.to_json()), &["group 1", "GPUs"]);
    let huge_mem = topo_edit("pcie-2x", |t| {
        t["gpus"][0]["memory_bytes"] = json!(u64::MAX)
    });
    assert_has(
        &terr(&huge_mem),
        &["GPU 0 has 18446744073709551615 bytes of memory"],
    );
}

#[test]
fn repeated_keys_are_named_everywhere() {
    // A struct field: serde would say "duplicate field", the pre-pass names it first.
    let text = profile_json().replacen("{", "{\n  \"simulated\": false,", 1);
    assert_has(&perr(&text), &["`simulated`", "appears twice"]);
    // A map, where serde_json would silently keep the last value.
    let text = profile_json();
    let at = text.find("\"results\": {").unwrap() + "\"results\": {".len();
    let text = format!("{}\"one_stage_pull\": {{\"median_us\": 1.0, \"ci_low_us\": 1.0, \"ci_high_us\": 1.0, \"samples\": 1}},{}", &text[..at], &text[at..]);
    assert_has(
        &perr(&text),
        &[
            "`groups[0].buckets[0].results.one_stage_pull`",
            "appears twice",
        ],
    );
    // Escapes do not hide a repeat.
    let text = presets::json("pcie-2x").unwrap().replacen(
        "\"sockets\"",
        "\"gpus\": [], \"\\u0073ockets\": [], \"sockets\"",
        1,
    );
    assert_has(&terr(&text), &["`sockets`", "appears twice"]);
    // Deep inside a topology.
    let text =
        presets::json("pcie-2x")
            .unwrap()
            .replacen("\"gen\": 5,", "\"gen\": 5, \"gen\": 1,", 1);
    assert_has(&terr(&text), &["`switches[0].uplink.gen`", "appears twice"]);
}

/// A schema version too large for 64 bits is said as the file writes it, not as the float
/// JSON reads it into (1.8446744073709552e19), in the library and through the binary.
#[test]
fn a_schema_version_past_64_bits_is_said_as_written() {
    let big = "18446744073709551616";
    let text = profile_json().replacen(
        &format!("\"schema_version\": {SCHEMA_VERSION}"),
        &format!("\"schema_version\": {big}"),
        1,
    );
    assert!(text.contains(big));
    let e = perr(&text);
    assert_has(
        &e,
        &[&format!(
            "its `schema_version` is {big}, not a version number"
        )],
    );
    assert!(!e.contains("e19"), "{e}");
    assert_has(
        &perr(&text.replacen(big, "1e0", 1)),
        &["`schema_version` is 1e0,"],
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big-version.json");
    std::fs::write(&path, &text).unwrap();
    let out = common::artune(&["show", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    assert!(
        stderr.contains(&format!("`schema_version` is {big}")),
        "{stderr}"
    );
    assert!(!stderr.contains("e19"), "{stderr}");
    common::assert_no_panic(&stderr);
}

/// A schema version present but null is one that is not a number, not a missing one (which
/// would say the file is no profile at all).
#[test]
fn a_null_schema_version_is_named_as_such() {
    let e = perr(&profile_edit(|p| p["schema_version"] = Value::Null));
    assert_has(&e, &["its `schema_version` is null, not a version number"]);
}

#[test]
fn wrong_types_are_named_with_their_place() {
    assert_has(
        &perr(&profile_edit(|p| p["groups"][1]["tp"] = json!("four"))),
        &[
            "`groups[1].tp`",
            "it is a string \"four\"; write a whole number",
        ],
    );
    assert_has(
        &perr(&profile_edit(|p| p["groups"] = json!({}))),
        &["`groups`", "invalid type: map"],
    );
    assert_has(
        &perr(&profile_edit(|p| {
            p["groups"][0]["buckets"][1]["choice"] = json!("magic")
        })),
        &["`groups[0].buckets[1].choice`", "unknown variant `magic`"],
    );
    assert_has(
        &perr(&profile_edit(|p| p["fingerprint"]["extra"] = json!(1))),
        &["`fingerprint.extra`", "unknown field `extra`"],
    );
    assert_has(
        &perr(&profile_edit(|p| {
            p["groups"][0].as_object_mut().unwrap().remove("buckets");
        })),
        &["`groups[0]` lacks the field `buckets`"],
    );
    assert_has(
        &terr(&topo_edit("pcie-2x", |t| {
            t.as_object_mut().unwrap().remove("gpus");
        })),
        &["it lacks the field `gpus`"],
    );
    assert_has(
        &terr(&topo_edit("pcie-2x", |t| {
            t["gpus"][0]["compute_capability"] = json!("nine")
        })),
        &["`gpus[0].compute_capability`", "not like \"9.0\""],
    );
}

/// serde_json quotes the value it refused, and a JSON escape can put a line break or a control
/// character in it; the error still reads as one line, with the character written as an escape.
#[test]
fn control_characters_in_a_refused_value_stay_escaped() {
    let e = perr(&profile_edit(|p| {
        p["groups"][0]["buckets"][1]["choice"] = json!("o\ne_stage\u{7}\rpull")
    }));
    assert_has(
        &e,
        &[
            "`groups[0].buckets[1].choice`",
            "unknown variant `o\\ne_stage\\u{7}\\rpull`",
        ],
    );
    let e = terr(&topo_edit("pcie-2x", |t| {
        t["gpus"][0]["compute_capability"] = json!("9.\n0")
    }));
    assert_has(&e, &["`gpus[0].compute_capability`", "9.\\n0"]);
    let long = "x".repeat(5000);
    perr(&profile_edit(|p| {
        p["groups"][0]["buckets"][1]["choice"] = json!(long)
    }));
    perr(&profile_edit(|p| p["fingerprint"][&long] = json!(1)));
}

fn many<T: Clone>(one: &T, n: usize) -> Vec<T> {
    vec![one.clone(); n]
}

#[test]
fn too_many_things_are_named() {
    let mut p = profile();
    p.groups = many(&p.groups[0], LIMITS.groups + 1);
    assert_has(&perr(&p.to_json()), &["1025 groups", "1024 allowed"]);
    let mut p = profile();
    let b = p.groups[0].buckets[0].clone();
    p.groups[0].buckets = (1..=LIMITS.buckets_per_group as u64 + 1)
        .map(|i| Bucket {
            bytes: i,
            ..b.clone()
        })
        .collect();
    assert_has(&perr(&p.to_json()), &["4097 buckets", "1 to 4096"]);
    let mut p = profile();
    p.groups[0].buckets.clear();
    assert_has(&perr(&p.to_json()), &["0 buckets"]);
    let mut p = profile();
    p.contention = many(&p.contention[0], LIMITS.contention_curves + 1);
    assert_has(&perr(&p.to_json()), &["1025 contention curves"]);
    let mut p = profile();
    p.contention[0].points = many(&p.contention[0].points[0], LIMITS.points_per_curve + 1);
    assert_has(&perr(&p.to_json()), &["1025 points"]);

    let gpus = topo_edit("pcie-2x", |t| {
        let g = t["gpus"][0].clone();
        t["gpus"] = (0..257)
            .map(|i| {
                let mut g = g.clone();
                g["index"] = json!(i);
                g
            })
            .collect();
    });
    assert_has(&terr(&gpus), &["257 GPUs", "at most 256"]);
    let switches = topo_edit("pcie-2x", |t| {
        let s = t["switches"][0].clone();
        t["switches"] = (0..1025)
            .map(|i| {
                let mut s = s.clone();
                s["id"] = json!(format!("sw{i}"));
                s
            })
            .collect();
    });
    assert_has(&terr(&switches), &["1025 switches", "at most 1024"]);
    let sockets = topo_edit("pcie-2x", |t| {
        t["sockets"] = (0..65).map(|i| json!({"id": i})).collect()
    });
    assert_has(&terr(&sockets), &["65 sockets"]);
    let links = topo_edit("pcie-2x", |t| {
        t["gpus"][0]["nvlinks"] = (0..65)
            .map(|i| json!({"link": i, "active": true}))
            .collect();
    });
    assert_has(&terr(&links), &["GPU 0 lists 65 NVLinks"]);
}

#[test]
fn broken_wiring_is_named() {
    let cycle = topo_edit("pcie-2x", |t| t["switches"][0]["parent"] = json!("sw0"));
    assert_has(&terr(&cycle), &["switch `sw0`", "cycle"]);
    // A cycle no GPU hangs from: normalize() alone does not see it.
    let stray = topo_edit("pcie-2x", |t| {
        let s = t["switches"][0].clone();
        let mut a = s.clone();
        a["id"] = json!("swA");
        a["parent"] = json!("swB");
        let mut b = s;
        b["id"] = json!("swB");
        b["parent"] = json!("swA");
        t["switches"].as_array_mut().unwrap().extend([a, b]);
    });
    assert_has(&terr(&stray), &["switch `swA`", "cycle"]);
    let chain = topo_edit("pcie-2x", |t| {
        let s = t["switches"][0].clone();
        for i in 1..10 {
            let mut x = s.clone();
            x["id"] = json!(format!("sw{i}"));
            x["parent"] = json!(format!("sw{}", i - 1));
            t["switches"].as_array_mut().unwrap().push(x);
        }
        t["gpus"][0]["parent"] = json!("sw9");
    });
    assert_has(&terr(&chain), &["within 8 switches"]);
    let dangling = topo_edit("pcie-2x", |t| t["switches"][0]["parent"] = json!("rc9"));
    assert_has(
        &terr(&dangling),
        &["`rc9`", "neither a switch nor a root complex"],
    );
    let socket = topo_edit("pcie-2x", |t| t["root_complexes"][0]["socket"] = json!(4));
    assert_has(&terr(&socket), &["socket 4", "not listed"]);
    let dup_index = topo_edit("pcie-2x", |t| t["gpus"][1]["index"] = json!(0));
    assert_has(&terr(&dup_index), &["GPU at position 1 has index 0"]);
    let dup_switch = topo_edit("pcie-2x", |t| {
        let s = t["switches"][0].clone();
        t["switches"].as_array_mut().unwrap().push(s);
    });
    assert_has(&terr(&dup_switch), &["`sw0` is used twice"]);
    let rc_named_like_switch =
        topo_edit("pcie-2x", |t| t["root_complexes"][0]["id"] = json!("sw0"));
    assert_has(&terr(&rc_named_like_switch), &["`sw0` is used twice"]);
    let dup_socket = topo_edit("pcie-2x", |t| t["sockets"] = json!([{"id": 0}, {"id": 0}]));
    assert_has(&terr(&dup_socket), &["socket 0 is listed twice"]);
    let nvlink = topo_edit("pcie-2x", |t| {
        t["gpus"][0]["nvlinks"] = json!([{"link": 0, "active": true, "remote_gpu": 5}])
    });
    assert_has(&terr(&nvlink), &["GPU 5", "does not exist"]);
    let nvlink_twice = topo_edit("pcie-2x", |t| {
        t["gpus"][0]["nvlinks"] = json!([{"link": 3, "active": true}, {"link": 3, "active": false}])
    });
    assert_has(&terr(&nvlink_twice), &["NVLink 3 twice"]);
    let bad_id = topo_edit("pcie-2x", |t| {
        t["gpus"][0]["parent"] = json!("sw0\nerror: fake")
    });
    assert_has(&terr(&bad_id), &["GPU 0 parent", "not a valid id"]);
    let long_id = topo_edit("pcie-2x", |t| {
        t["switches"][0]["id"] = json!("s".repeat(10_000))
    });
    assert_has(&terr(&long_id), &["not a valid id", "1 to 128 bytes"]);
}

#[test]
fn bad_pairs_are_named() {
    let t = presets::get("pcie-4x-1switch").unwrap();
    let with_pairs = |f: &dyn Fn(&mut artune::topology::Topology)| {
        let mut t = t.clone();
        f(&mut t);
        serde_json::to_string(&t).unwrap()
    };
    assert!(file::parse(&with_pairs(&|_| {})).is_ok());
    let twice = with_pairs(&|t| {
        let p = t.pairs[0].clone();
        t.pairs[1] = p;
    });
    assert_has(&terr(&twice), &["pair 0→1 is listed twice"]);
    let extra = with_pairs(&|t| {
        let p = t.pairs[0].clone();
        t.pairs.push(p);
    });
    assert_has(
        &terr(&extra),
        &["13 GPU pairs, but its 4 GPUs have 12 ordered pairs"],
    );
    let partial = with_pairs(&|t| t.pairs.truncate(5));
    assert_has(&terr(&partial), &["5 of the 12 ordered GPU pairs"]);
    // A GPU index given twice is named as such, before the count of pairs it throws off
    // (a file edited from `topo --json`, the pairs of the lost index dropped with it).
    let twice = with_pairs(&|t| {
        t.gpus[1].index = 0;
        t.pairs.retain(|p| p.from != 1 && p.to != 1);
    });
    assert_has(
        &terr(&twice),
        &["GPU at position 1 has index 0, listed twice"],
    );
    let to_self = with_pairs(&|t| t.pairs[0].to = 0);
    assert_has(&terr(&to_self), &["pair 0→0"]);
    let missing_gpu = with_pairs(&|t| t.pairs[0].to = 9);
    assert_has(&terr(&missing_gpu), &["pair 0→9", "does not exist"]);
    let links = with_pairs(&|t| t.pairs[0].nvlinks = u32::MAX);
    assert_has(&terr(&links), &["pair 0→1 has 4294967295 NVLinks"]);
}

#[test]
fn absurd_link_values_are_named() {
    let set = |f: &dyn Fn(&mut Value)| topo_edit("pcie-2x", f);
    assert_has(
        &terr(&set(&|t| t["gpus"][0]["pcie"]["gen"] = json!(0))),
        &["GPU 0 PCIe link", "generation 0"],
    );
    assert_has(
        &terr(&set(&|t| t["gpus"][0]["pcie"]["max_gen"] = json!(9))),
        &["generation 9"],
    );
    assert_has(
        &terr(&set(&|t| t["switches"][0]["uplink"]["width"] = json!(64))),
        &["switch `sw0` uplink", "width x64"],
    );
    assert_has(
        &terr(&set(&|t| t["gpus"][1]["pcie"]["max_width"] = json!(0))),
        &["width x0"],
    );
    for v in [json!(-1.0), json!(0), json!(1e300)] {
        assert_has(
            &terr(&set(&|t| t["gpus"][0]["pcie"]["up_gbps"] = v.clone())),
            &["GPU 0 PCIe link", "positive"],
        );
    }
    assert_has(
        &terr(&set(&|t| {
            t["switches"][0]["uplink"]["latency_us"] = json!(-0.2)
        })),
        &["latency", "positive"],
    );
    let c =
        |k: &'static str, v: Value| set(&move |t| t["switches"][0]["contention"][k] = v.clone());
    assert_has(
        &terr(&c("peak_gbps", json!(0))),
        &["switch `sw0` contention peak_gbps is 0"],
    );
    assert_has(&terr(&c("slope", json!(-0.5))), &["slope is -0.5"]);
    assert_has(&terr(&c("read_factor", json!(2))), &["read_factor is 2"]);
    assert_has(&terr(&c("write_factor", json!(0))), &["write_factor is 0"]);
    assert_has(
        &terr(&c("write_collapse_gbps", json!(-4))),
        &["write_collapse_gbps is -4"],
    );
    let nv = |v: Value| set(&move |t| t["nvswitch"] = v.clone());
    assert_has(
        &terr(&nv(json!({"generation": 4, "gpu_gbps": 0}))),
        &["NVSwitch gpu_gbps is 0"],
    );
    assert_has(
        &terr(&nv(json!({"generation": 4000000, "gpu_gbps": 450}))),
        &["NVLink generation 4000000"],
    );
    assert!(file::parse(&nv(json!({"generation": 4, "gpu_gbps": 450.0}))).is_ok());
}

#[test]
fn a_profile_with_a_broken_topology_is_refused() {
    let e = perr(&profile_edit(|p| {
        p["topology"]["switches"][0]["parent"] = json!("sw0")
    }));
    assert_has(&e, &["its topology is invalid", "cycle"]);
    let e = perr(&profile_edit(|p| {
        let pair = p["topology"]["pairs"][0].clone();
        p["topology"]["pairs"][1] = pair;
    }));
    assert_has(&e, &["its topology is invalid", "listed twice"]);
}

// ---------------------------------------------------------------------------------------------
// Files on disk.

#[test]
fn oversized_files_are_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    // Sparse: the size is in the metadata, no disk is written.
    let big = dir.path().join("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(file::MAX_FILE_BYTES + 1)
        .unwrap();
    let e = file::load(&big).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert_has(
        &e.to_string(),
        &["16777217 bytes", "more than the 16777216"],
    );
    let big = dir.path().join("big-profile.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(LIMITS.file_bytes + 1)
        .unwrap();
    let e = Profile::load(&big).unwrap_err();
    assert_has(
        &e.to_string(),
        &["67108865 bytes", "more than the 67108864"],
    );
    // The parsers refuse oversized text too, for callers that read it themselves.
    let text = " ".repeat(file::MAX_FILE_BYTES as usize + 1);
    assert_has(&terr(&text), &["more than the 16777216"]);
}

#[test]
fn endless_devices_are_cut_off() {
    if !Path::new("/dev/zero").exists() {
        println!("skipped: no /dev/zero on this system");
        return;
    }
    // Its metadata says 0 bytes; the read must stop at the limit anyway.
    let e = file::load(Path::new("/dev/zero")).unwrap_err().to_string();
    assert_has(&e, &["more than the 16.0 MiB a topology file may have"]);
}

#[test]
fn unreadable_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let e = file::load(dir.path()).unwrap_err();
    assert_has(&e.to_string(), &["directory"]);
    let e = file::load(&dir.path().join("missing.json")).unwrap_err();
    assert_has(&e.to_string(), &["cannot read", "missing.json"]);
    let latin1 = dir.path().join("latin1.json");
    std::fs::write(&latin1, b"{\"name\": \"caf\xe9\"}").unwrap();
    assert_has(
        &file::load(&latin1).unwrap_err().to_string(),
        &["not UTF-8", "offset 13"],
    );
}

/// A reader never sees half a file while a writer replaces it again and again.
#[test]
fn readers_see_whole_profiles_during_atomic_rewrites() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profile.json");
    let a = profile();
    let mut b = profile();
    b.groups.truncate(1);
    b.faults = vec!["x".repeat(100_000)]; // a larger file, so a torn read would show
    let (ja, jb) = (a.to_json(), b.to_json());
    // Compare with what a whole read gives, not with the values in memory.
    let (a, b) = (Profile::parse(&ja).unwrap(), Profile::parse(&jb).unwrap());
    artune::profile::write_atomic(&path, ja.as_bytes()).unwrap();
    let done = AtomicBool::new(false);
    let reads = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut reads = 0u32;
            while !done.load(Ordering::Acquire) || reads == 0 {
                let text = std::fs::read_to_string(&path).unwrap();
                let p = Profile::parse(&text)
                    .unwrap_or_else(|e| panic!("read {} bytes: {e}", text.len()));
                assert!(p == a || p == b, "read a profile that was never written");
                reads += 1;
            }
            reads
        });
        for i in 0..200 {
            let text = if i % 2 == 0 { &jb } else { &ja };
            artune::profile::write_atomic(&path, text.as_bytes()).unwrap();
        }
        done.store(true, Ordering::Release);
        reader.join().unwrap()
    });
    assert!(reads > 0);
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("profile.json")],
        "temporary files left behind"
    );
}

// ---------------------------------------------------------------------------------------------
// Through the binary.

#[test]
fn topo_refuses_bad_files_with_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let preset = presets::json("pcie-2x").unwrap();
    let big = dir.path().join("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(file::MAX_FILE_BYTES + 1)
        .unwrap();
    let cases = [
        (write("malformed.json", b"{ not json"), "not valid JSON"),
        (
            write("truncated.json", &preset.as_bytes()[..preset.len() / 2]),
            "truncated",
        ),
        (
            write(
                "dup.json",
                preset
                    .replacen("\"sockets\"", "\"gpus\": [], \"sockets\"", 1)
                    .as_bytes(),
            ),
            "appears twice",
        ),
        (
            write(
                "cycle.json",
                topo_edit("pcie-2x", |t| t["switches"][0]["parent"] = json!("sw0")).as_bytes(),
            ),
            "cycle",
        ),
        (
            write(
                "deep.json",
                format!("{{\"gpus\": {}", "[".repeat(100_000)).as_bytes(),
            ),
            "nested more than 32 deep",
        ),
        (
            write(
                "huge-number.json",
                preset.replacen("0.33", "1e400", 1).as_bytes(),
            ),
            "too large",
        ),
        (write("binary.json", b"\xff\xfe\x00{"), "not UTF-8"),
        (
            write(
                "newline-id.json",
                topo_edit("pcie-2x", |t| t["gpus"][0]["parent"] = json!("a\nb")).as_bytes(),
            ),
            "not a valid id",
        ),
        (big, "more than the 16777216"),
        (dir.path().join("missing.json"), "cannot read"),
    ];
    for (path, want) in &cases {
        let out = common::artune(&["topo", "--topology", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let name = path.file_name().unwrap().to_string_lossy();
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{name}: not one line: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(want),
            "{name}: {stderr}"
        );
        assert!(
            stderr.contains(&*name),
            "{name}: the message does not name the file: {stderr}"
        );
        common::assert_no_panic(&stderr);
        assert!(out.stdout.is_empty(), "{name}: printed to stdout");
    }
}

//! `artune why` through the binary: the explanation an engine maintainer asks for first, as
//! text and JSON, and its refusals.

mod common;

use std::path::Path;

use artune::export::sample;
use artune::profile::Profile;

fn run(args: &[&str]) -> (i32, String, String) {
    let o = common::artune(args);
    let err = common::text(&o.stderr);
    common::assert_no_panic(&err);
    (o.status.code().unwrap_or(-1), common::text(&o.stdout), err)
}

fn write(dir: &Path, name: &str, p: &Profile) -> String {
    let path = dir.join(name);
    p.write_atomic(&path).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn why_prints_every_backend_the_rule_and_every_engine() {
    let d = tempfile::tempdir().unwrap();
    let p = sample::profile();
    let file = write(d.path(), "p.json", &p);
    let (code, out, err) = run(&["why", &file, "--tp", "2", "--bytes", "3000"]);
    assert_eq!(code, 0, "{err}");
    let g = &p.groups[0];
    let b = &g.buckets[1];
    assert_eq!(b.bytes, 4096, "3000 bytes is served by the 4 KiB bucket");
    assert!(
        out.contains("served by the bucket at 4K (4096 bytes)"),
        "{out}"
    );
    assert!(out.contains(&format!("choice: {}", b.choice)), "{out}");
    assert!(out.contains("why: "), "{out}");
    for k in b.results.keys() {
        assert!(out.contains(k.id()), "{k} missing: {out}");
    }
    for engine in [
        "vLLM",
        "SGLang",
        "TensorRT-LLM",
        "NCCL with artune's plugin",
    ] {
        assert!(out.contains(engine), "{engine}: {out}");
    }
    assert!(out.contains("SIMULATED"));
    assert!(err.contains("SIMULATED"));

    let (code, out, err) = run(&[
        "why", &file, "--tp", "4", "--bytes", "1M", "--mode", "eager", "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["tp"], 4);
    assert_eq!(v["mode"], "eager");
    assert_eq!(v["bucket_bytes"], 1 << 20);
    assert!(v["rows"].as_array().unwrap().len() >= 5);
    for r in v["rows"].as_array().unwrap() {
        assert!(r["ci_low_us"].as_f64() <= r["median_us"].as_f64());
        assert!(r["vs_chosen"].is_number());
    }
    assert_eq!(v["engines"].as_array().unwrap().len(), 4);
    assert!(v["smoothed"].is_boolean() && v["reason"].is_string());
    // TP4 on PCIe: vLLM and SGLang disable their kernels, TensorRT-LLM falls back to NCCL.
    for e in v["engines"].as_array().unwrap() {
        assert_eq!(
            e["runs"],
            if e["engine"] == "NCCL with artune's plugin" {
                e["runs"].clone()
            } else {
                "NCCL".into()
            },
            "{e}"
        );
    }
}

#[test]
fn why_refuses_what_the_profile_cannot_answer() {
    let d = tempfile::tempdir().unwrap();
    let file = write(d.path(), "p.json", &sample::profile());
    // No answer is not bad input: exit 6, the engine keeps its default.
    for (args, needle) in [
        (["--tp", "8", "--bytes", "4096"], "no TP8 graph group"),
        (["--tp", "2", "--bytes", "1G"], "above the largest size"),
    ] {
        let (code, out, err) = run(&[&["why", file.as_str()][..], &args[..]].concat());
        assert_eq!(code, 6, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(err.contains("no answer") && err.contains(needle), "{err}");
    }
    for (args, needle) in [
        (vec!["--tp", "2", "--bytes", "0"], "--bytes 0"),
        (vec!["--tp", "2", "--bytes", "lots"], "lots"),
    ] {
        let mut a = vec!["why", file.as_str()];
        a.extend(args.iter().copied());
        let (code, out, err) = run(&a);
        assert_eq!(code, 2, "{a:?}: {err}");
        assert!(out.is_empty(), "{a:?}: {out}");
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{err}");
        assert!(errors[0].contains(needle), "{a:?}: {err}");
    }
}

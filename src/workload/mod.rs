//! Workloads: the allreduces of one engine step, and what they cost under several policies.
//!
//! A workload SPEC lists the allreduces of one engine step:
//!
//! ```text
//! SPEC   = TERM { "+" TERM } [ "@" TOKENS ]
//! TERM   = COUNT "x" HIDDEN "x" DTYPE    per-token message of HIDDEN × size(DTYPE) × T bytes
//!        | COUNT "x" BYTES               fixed message, e.g. 4096, 16K, 1MiB
//! TOKENS = T | LO ".." HI | T "," T ...  tokens per step to evaluate (LO..HI inclusive)
//! DTYPE  = bf16 | fp16 | fp32
//! ```
//!
//! `122x7168xbf16@1..16` is 122 allreduces of 7168·2·T bytes each, for T = 1, 2, ..., 16 (one
//! row per T). `61x7168xbf16+2x4K@8` adds two fixed 4 KiB allreduces, at T = 8 only. Terms that
//! depend on T need `@TOKENS`; fixed terms alone take none (one row): `@TOKENS` on them alone
//! would give identical rows, and usually means a forgotten DTYPE (`122x7168` is 122 messages
//! of 7168 bytes), so it is refused.
//!
//! Instead of a SPEC, `--workload` may name a JSON file: a list of the allreduces of one step,
//! each `{"count": N, "bytes": B}` or `{"count": N, "hidden": H, "dtype": "bf16", "tokens": T}`.
//!
//! [`predict`] prices each step under four policies: the profile's choice, NCCL only, always
//! one-stage (the faster of pull and push as measured), and vLLM's built-in rule
//! ([`crate::export::vllm::builtin`]). A message costs the median measured at the bucket that
//! serves it (the next measured size at or above it).

use serde::Serialize;

use crate::allreduce::{Backend, Dtype};
use crate::error::Error;
use crate::profile::{GroupProfile, Profile, LIMITS};

/// Limits that keep a hostile workload from making us loop or print without bound.
pub const MAX_TERMS: usize = 1024;
pub const MAX_COUNT: u64 = 1_000_000;
pub const MAX_ROWS: usize = 4096;
pub const MAX_TOKENS: u64 = 1 << 24;
pub const MAX_HIDDEN: u64 = 1 << 24;
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The size of one allreduce.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Size {
    Bytes(u64),
    PerToken { hidden: u64, dtype: Dtype },
}

/// `count` allreduces of one size per step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Term {
    pub count: u64,
    pub size: Size,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub terms: Vec<Term>,
    /// Token counts to evaluate; empty when no term depends on tokens.
    pub tokens: Vec<u64>,
}

/// One item of a workload file, its fields checked one by one.
struct Item {
    count: u64,
    bytes: Option<u64>,
    hidden: Option<u64>,
    dtype: Option<String>,
    tokens: Option<u64>,
}

/// What a workload file's item looks like, for errors.
const ITEM_SHAPE: &str =
    r#"{"count": N, "bytes": B} or {"count": N, "hidden": H, "dtype": "bf16", "tokens": T}"#;

/// A string from a file, quoted and escaped, cut to 40 characters.
fn short(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((at, _)) => format!("{:?}...", &s[..at]),
        None => format!("{s:?}"),
    }
}

/// A JSON value in a few words, for errors: what was found where something else was expected.
fn json_kind(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("the string {}", short(s)),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// The items of a workload file, each field checked against its format: a sentence naming the
/// item and field that is wrong, and what is expected, instead of serde's own words.
fn json_items(text: &str) -> Result<Vec<Item>, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| crate::topology::file::describe(&e, text))?;
    let serde_json::Value::Array(list) = v else {
        return Err(format!(
            "it is {}; it must be a JSON list of allreduces, each {ITEM_SHAPE}",
            json_kind(&v)
        ));
    };
    let mut items = Vec::new();
    for (i, v) in list.iter().enumerate() {
        let Some(o) = v.as_object() else {
            return Err(format!(
                "item {i} is {}; each item is an object, {ITEM_SHAPE}",
                json_kind(v)
            ));
        };
        if let Some(k) = o.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(format!(
                "item {i} has a field {} no item has; an item is {ITEM_SHAPE}",
                short(k)
            ));
        }
        let number = |f: &str| -> Result<Option<u64>, String> {
            match o.get(f) {
                None => Ok(None),
                Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                    let hint = match (f, v) {
                        ("tokens", serde_json::Value::Array(_)) => {
                            " (an item prices one token count; a SPEC like 122x7168xbf16@1,4 \
                             prices several)"
                        }
                        _ => "",
                    };
                    format!(
                        "item {i}'s `{f}` is {}; it must be a whole number{hint}",
                        json_kind(v)
                    )
                }),
            }
        };
        let dtype = match o.get("dtype") {
            None => None,
            Some(serde_json::Value::String(d)) => Some(d.clone()),
            Some(v) => {
                return Err(format!(
                    "item {i}'s `dtype` is {}; it must be \"bf16\", \"fp16\" or \"fp32\"",
                    json_kind(v)
                ))
            }
        };
        let count = number("count")?
            .ok_or_else(|| format!("item {i} has no `count`; an item is {ITEM_SHAPE}"))?;
        items.push(Item {
            count,
            bytes: number("bytes")?,
            hidden: number("hidden")?,
            dtype,
            tokens: number("tokens")?,
        });
    }
    Ok(items)
}

/// The fields a workload file's item may have.
const FIELDS: [&str; 5] = ["count", "bytes", "hidden", "dtype", "tokens"];

fn bad(spec: &str, why: &str) -> Error {
    Error::bad_input(format!(
        "workload `{spec}` is not valid: {why}; write it like 122x7168xbf16@1..16 or name a JSON file (see `artune predict --help`)"
    ))
}

fn dtype(s: &str) -> Option<Dtype> {
    match s.to_ascii_lowercase().as_str() {
        "bf16" => Some(Dtype::Bf16),
        "fp16" | "f16" => Some(Dtype::Fp16),
        "fp32" | "f32" => Some(Dtype::Fp32),
        _ => None,
    }
}

fn number(spec: &str, s: &str, what: &str, max: u64) -> Result<u64, Error> {
    match s.parse::<u64>() {
        Ok(n) if n >= 1 && n <= max => Ok(n),
        _ => Err(bad(
            spec,
            &format!("{what} `{s}` is not a whole number from 1 to {max}"),
        )),
    }
}

fn tokens(spec: &str, s: &str) -> Result<Vec<u64>, Error> {
    let out: Vec<u64> = if let Some((lo, hi)) = s.split_once("..") {
        let (lo, hi) = (
            number(spec, lo, "token count", MAX_TOKENS)?,
            number(spec, hi, "token count", MAX_TOKENS)?,
        );
        if lo > hi {
            return Err(bad(spec, &format!("token range {lo}..{hi} is empty")));
        }
        if hi - lo >= MAX_ROWS as u64 {
            return Err(bad(
                spec,
                &format!("token range {lo}..{hi} has more than {MAX_ROWS} values"),
            ));
        }
        (lo..=hi).collect()
    } else {
        let v = s
            .split(',')
            .map(|t| number(spec, t, "token count", MAX_TOKENS))
            .collect::<Result<Vec<_>, _>>()?;
        if v.len() > MAX_ROWS {
            return Err(bad(spec, &format!("more than {MAX_ROWS} token counts")));
        }
        v
    };
    Ok(out)
}

/// Why a workload file was refused: a phrase to embed in a sentence that names the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WorkloadError(pub String);

impl Workload {
    /// Parses a SPEC (see the module docs).
    pub fn parse_spec(spec: &str) -> Result<Workload, Error> {
        let s: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
        let (body, toks) = match s.split_once('@') {
            Some((b, t)) => (b, Some(tokens(spec, t)?)),
            None => (s.as_str(), None),
        };
        if body.is_empty() {
            return Err(bad(spec, "it lists no allreduces"));
        }
        let mut terms = Vec::new();
        for t in body.split('+') {
            if terms.len() == MAX_TERMS {
                return Err(bad(spec, &format!("it has more than {MAX_TERMS} terms")));
            }
            let parts: Vec<&str> = t.split(['x', 'X']).collect();
            if !(2..=3).contains(&parts.len()) {
                return Err(bad(
                    spec,
                    &format!("term `{t}` is not COUNTxHIDDENxDTYPE or COUNTxBYTES"),
                ));
            }
            let count = number(spec, parts[0], "count", MAX_COUNT)?;
            let size = match parts.as_slice() {
                [_, h, d] => Size::PerToken {
                    hidden: number(spec, h, "hidden size", MAX_HIDDEN)?,
                    dtype: dtype(d)
                        .ok_or_else(|| bad(spec, &format!("`{d}` is not bf16, fp16 or fp32")))?,
                },
                [_, b] => {
                    let n = crate::units::parse_bytes(b)
                        .map_err(|_| bad(spec, &format!("`{b}` is not a byte size")))?;
                    if n == 0 || n > LIMITS.message_bytes {
                        return Err(bad(spec, &format!("`{b}` must be 1 byte to 1 TiB")));
                    }
                    Size::Bytes(n)
                }
                _ => {
                    return Err(bad(
                        spec,
                        &format!("term `{t}` is not COUNTxHIDDENxDTYPE or COUNTxBYTES"),
                    ))
                }
            };
            terms.push(Term { count, size });
        }
        let per_token = terms
            .iter()
            .any(|t| matches!(t.size, Size::PerToken { .. }));
        match (per_token, toks) {
            (true, None) => Err(bad(
                spec,
                "a HIDDENxDTYPE term needs token counts; add @T or @LO..HI",
            )),
            (false, Some(_)) => {
                let first = body.split('+').next().unwrap_or(body);
                Err(bad(
                    spec,
                    &format!(
                        "no term depends on the token count, so every row would be the same: `{first}` is a fixed size in bytes; for a size per token add its type (e.g. {first}xbf16), or leave out @"
                    ),
                ))
            }
            (_, t) => Ok(Workload {
                terms,
                tokens: t.unwrap_or_default(),
            }),
        }
    }

    /// Parses the JSON file format (see the module docs).
    pub fn parse_json(text: &str) -> Result<Workload, WorkloadError> {
        Workload::parse_items(text).map_err(WorkloadError)
    }

    fn parse_items(text: &str) -> Result<Workload, String> {
        let items = json_items(text)?;
        if items.is_empty() || items.len() > MAX_TERMS {
            return Err(format!("it must list 1 to {MAX_TERMS} allreduces"));
        }
        let mut terms = Vec::new();
        for (i, it) in items.iter().enumerate() {
            if it.count == 0 || it.count > MAX_COUNT {
                return Err(format!(
                    "item {i} has count {}; it must be 1 to {MAX_COUNT}",
                    it.count
                ));
            }
            let bytes = match (it.bytes, it.hidden, it.dtype.as_deref(), it.tokens) {
                (Some(b), None, None, None) => b,
                (None, Some(h), Some(d), Some(t)) => {
                    let d = dtype(d).ok_or_else(|| {
                        format!("item {i} has dtype `{d}`; use bf16, fp16 or fp32")
                    })?;
                    if h == 0 || h > MAX_HIDDEN || t == 0 || t > MAX_TOKENS {
                        return Err(format!(
                            "item {i} has hidden {h} and tokens {t}; hidden must be 1 to {MAX_HIDDEN} and tokens 1 to {MAX_TOKENS}"
                        ));
                    }
                    h * t * d.size()
                }
                _ => {
                    return Err(format!(
                        "item {i} needs either `bytes` or all of `hidden`, `dtype` and `tokens`"
                    ))
                }
            };
            if bytes == 0 || bytes > LIMITS.message_bytes {
                return Err(format!(
                    "item {i} is {}; an allreduce must be 1 byte to 1 TiB",
                    crate::units::fmt_size(bytes)
                ));
            }
            terms.push(Term {
                count: it.count,
                size: Size::Bytes(bytes),
            });
        }
        Ok(Workload {
            terms,
            tokens: Vec::new(),
        })
    }

    /// A JSON file if `arg` names an existing file, else a SPEC. An argument no SPEC can be
    /// (a directory, a path with `/`, a name ending in .json) is taken for a file that is not
    /// there, and said so, rather than parsed as a SPEC.
    pub fn load(arg: &str) -> Result<Workload, Error> {
        let path = std::path::Path::new(arg);
        let read = |e: std::io::Error| Error::Read {
            path: path.into(),
            reason: e.to_string(),
        };
        if path.is_dir() {
            return Err(Error::bad_input(format!(
                "workload {arg} is a directory; name a JSON file or write a SPEC like 122x7168xbf16@1..16"
            )));
        }
        if !path.is_file() {
            if arg.contains('/') || arg.to_ascii_lowercase().ends_with(".json") {
                let e = std::fs::metadata(path).err();
                return Err(read(
                    e.unwrap_or_else(|| std::io::ErrorKind::NotFound.into()),
                ));
            }
            return Workload::parse_spec(arg);
        }
        if std::fs::metadata(path).map_err(read)?.len() > MAX_FILE_BYTES {
            return Err(Error::Parse {
                path: path.into(),
                what: "workload file",
                reason: "it is larger than 1 MiB".into(),
            });
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        Workload::parse_json(&text).map_err(|e| Error::Parse {
            path: path.into(),
            what: "workload file",
            reason: e.to_string(),
        })
    }

    /// One step per token count (or one step): the (count, bytes) of each term.
    pub fn steps(&self) -> Vec<Step> {
        let at = |t: u64| -> Vec<(u64, u64)> {
            self.terms
                .iter()
                .map(|term| match term.size {
                    Size::Bytes(b) => (term.count, b),
                    Size::PerToken { hidden, dtype } => (term.count, hidden * dtype.size() * t),
                })
                .collect()
        };
        if self.tokens.is_empty() {
            vec![(None, at(0))]
        } else {
            self.tokens.iter().map(|&t| (Some(t), at(t))).collect()
        }
    }
}

/// One step: its token count, if any, and the (count, bytes) of each term.
pub type Step = (Option<u64>, Vec<(u64, u64)>);

/// The policies [`predict`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// The backend the profile chose at each size.
    Profile,
    /// NCCL's own choice (`nccl`); where it was not measured, the fastest pinned NCCL variant.
    Nccl,
    /// The faster of one_stage_pull and one_stage_push as measured.
    OneStage,
    /// vLLM's built-in custom all-reduce rule.
    Vllm,
}

impl Policy {
    pub const ALL: [Policy; 4] = [
        Policy::Profile,
        Policy::Nccl,
        Policy::OneStage,
        Policy::Vllm,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Policy::Profile => "profile",
            Policy::Nccl => "nccl",
            Policy::OneStage => "one-stage",
            Policy::Vllm => "vllm",
        }
    }
}

/// One step's cost under each policy (microseconds), or why a policy has no cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub tokens: Option<u64>,
    /// Per policy, in [`Policy::ALL`] order: total microseconds of the step's allreduces.
    pub us: [Result<f64, String>; 4],
    /// Per policy: whether a time it was priced from is simulated outside the model's
    /// calibration, so that the total is no estimate.
    pub outside_calibration: [bool; 4],
    /// Sizes of this step outside what the profile answers (above its largest size, or below
    /// its smallest where `select` does not answer): the step is not predicted.
    pub beyond: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Prediction<'a> {
    pub group: &'a GroupProfile,
    pub largest: u64,
    pub rows: Vec<Row>,
}

fn waived(g: &GroupProfile, b: &crate::profile::Bucket, k: Backend) -> String {
    match b.waived.get(&k).or_else(|| g.waived.get(&k)) {
        Some(why) => format!("{k} was waived: {why}"),
        None => format!("{k} was not measured"),
    }
}

/// A time priced from a bucket: microseconds, and whether its simulated band lies outside the
/// model's calibration ([`crate::report::model`]), so that it is no estimate.
type Priced = (f64, bool);

fn priced(t: &crate::profile::Timing) -> Priced {
    let outside = t
        .model
        .is_some_and(|m| crate::report::model::outside_calibration(&m));
    (t.median_us, outside)
}

/// Microseconds of one allreduce of `bytes` under `policy`, as measured at bucket `b`; the
/// profile's policy runs `choice` (the serving bucket's, which may lie above `b`).
fn cost(
    p: &Profile,
    g: &GroupProfile,
    b: &crate::profile::Bucket,
    choice: Backend,
    bytes: u64,
    policy: Policy,
) -> Result<Priced, String> {
    let get = |k: Backend| b.results.get(&k).map(priced).ok_or_else(|| waived(g, b, k));
    match policy {
        Policy::Profile => get(choice),
        Policy::Nccl => crate::export::nccl_time(b)
            .map(|t| priced(&t))
            .ok_or_else(|| "NCCL was not measured".to_string()),
        Policy::OneStage => match (get(Backend::OneStagePull), get(Backend::OneStagePush)) {
            (Ok(a), Ok(c)) => Ok(if a.0 <= c.0 { a } else { c }),
            (Ok(a), Err(_)) | (Err(_), Ok(a)) => Ok(a),
            (Err(a), Err(c)) => Err(format!("{a}; {c}")),
        },
        Policy::Vllm => match crate::export::vllm::builtin(&p.topology, &g.gpus, g.dtype, bytes) {
            crate::export::vllm::Path::Custom(k) => {
                get(k).map_err(|e| format!("vLLM would run {k}, but {e}"))
            }
            crate::export::vllm::Path::FlashInfer(_) => {
                Err("vLLM would run FlashInfer's allreduce, which artune does not measure".into())
            }
            crate::export::vllm::Path::SymmMem(what) => Err(format!(
                "vLLM would run {what}, which artune does not measure"
            )),
            crate::export::vllm::Path::Nccl(_) => cost(p, g, b, choice, bytes, Policy::Nccl),
        },
    }
}

/// How [`predict`] turns measured buckets into the time of any size, for its reader.
pub const ESTIMATE: &str = "a size between two measured sizes is priced by log-log interpolation between them (the backend the serving bucket chose, timed at both); a measured size by its median; below the smallest measured size only where select answers (at or under 4 KiB, the smallest size's time)";

/// Where a size falls among a group's buckets: its serving bucket's index, and the measured
/// neighbour below it with the interpolation weight of the upper one (log-log).
fn locate(g: &GroupProfile, bytes: u64) -> Result<(usize, Option<(usize, f64)>), String> {
    let smallest = g.buckets.first().map_or(0, |b| b.bytes);
    let largest = g.buckets.last().map_or(0, |b| b.bytes);
    if !crate::profile::answers_below(smallest, bytes) {
        return Err(format!(
            "below the smallest measured ({})",
            crate::units::fmt_size(smallest)
        ));
    }
    let i = g.buckets.partition_point(|b| b.bytes < bytes);
    if i >= g.buckets.len() {
        return Err(format!(
            "above the largest measured ({})",
            crate::units::fmt_size(largest)
        ));
    }
    let hi = g.buckets[i].bytes;
    if hi == bytes || i == 0 {
        return Ok((i, None));
    }
    let lo = g.buckets[i - 1].bytes;
    let w = ((bytes as f64).ln() - (lo as f64).ln()) / ((hi as f64).ln() - (lo as f64).ln());
    Ok((i, Some((i - 1, w))))
}

/// Prices every step of `w` on `g`, a group of `p` (the caller names it: `predict` as select
/// does).
pub fn predict<'a>(
    p: &'a Profile,
    g: &'a GroupProfile,
    w: &Workload,
) -> Result<Prediction<'a>, Error> {
    let largest = g.buckets.last().map_or(0, |b| b.bytes);
    let rows = w
        .steps()
        .into_iter()
        .map(|(tokens, allreduces)| {
            let mut us: [Result<f64, String>; 4] = [Ok(0.0), Ok(0.0), Ok(0.0), Ok(0.0)];
            let mut outside = [false; 4];
            let mut beyond = Vec::new();
            // Each reason once, with how many sizes it covers (below and above apart).
            let mut why: Vec<(String, usize)> = Vec::new();
            for (count, bytes) in allreduces {
                let (i, below) = match locate(g, bytes) {
                    Ok(at) => at,
                    Err(e) => {
                        match why.iter_mut().find(|(r, _)| *r == e) {
                            Some((_, n)) => *n += 1,
                            None => why.push((e, 1)),
                        }
                        beyond.push(bytes);
                        continue;
                    }
                };
                let hi = &g.buckets[i];
                for (k, pol) in Policy::ALL.into_iter().enumerate() {
                    let Ok(total) = &us[k] else { continue };
                    let at_hi = cost(p, g, hi, hi.choice, bytes, pol);
                    let one = match (at_hi, below) {
                        (Ok((t_hi, o_hi)), Some((j, w))) => {
                            // The neighbour below may not have timed this backend (a racing
                            // tune stops slow ones early): then the upper time stands.
                            match cost(p, g, &g.buckets[j], hi.choice, bytes, pol) {
                                Ok((t_lo, o_lo)) if t_lo > 0.0 && t_hi > 0.0 => Ok((
                                    (t_lo.ln() * (1.0 - w) + t_hi.ln() * w).exp(),
                                    o_lo || o_hi,
                                )),
                                _ => Ok((t_hi, o_hi)),
                            }
                        }
                        (r, _) => r,
                    };
                    outside[k] |= one.as_ref().is_ok_and(|c| c.1);
                    us[k] = one.map(|c| total + c.0 * count as f64);
                }
            }
            if !beyond.is_empty() {
                let why = why
                    .iter()
                    .map(|(r, n)| match n {
                        1 => format!("1 size {r}"),
                        n => format!("{n} sizes {r}"),
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                us = [
                    Err(why.clone()),
                    Err(why.clone()),
                    Err(why.clone()),
                    Err(why),
                ];
            }
            Row {
                tokens,
                us,
                outside_calibration: outside,
                beyond,
            }
        })
        .collect();
    Ok(Prediction {
        group: g,
        largest,
        rows,
    })
}

#[cfg(test)]
mod tests;

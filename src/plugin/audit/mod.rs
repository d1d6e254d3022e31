//! The audit of what NCCL ran: per allreduce, the (algorithm, protocol, channels) NCCL's
//! profiler reports against what the tuner's [`Context`](super::Context) pins for that size and
//! group, tallied per communicator into a [`Summary`] the profiler writes at finalize, and the
//! verdict `artune check --nccl-audit` reads from the summaries of every rank.
//!
//! The tuner's channel count is NCCL's *maximum* for the call (`nMaxChannels`): NCCL spreads a
//! message too small to fill them over fewer, so fewer is agreement and more is not. Both it
//! and the profiler's count are run-time channels, as the profile's are.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Pin;

/// Environment variable naming the directory the profiler writes its summaries into.
pub const ENV_DIR: &str = "ARTUNE_NCCL_AUDIT";

/// NCCL's names of its algorithms (`ncclAlgoToString`), by cost-table index.
const ALGOS: [&str; 7] = [
    "TREE",
    "RING",
    "COLLNET_DIRECT",
    "COLLNET_CHAIN",
    "NVLS",
    "NVLS_TREE",
    "PAT",
];
/// NCCL's names of its protocols (`ncclProtoToString`), by cost-table index.
const PROTOS: [&str; 3] = ["LL", "LL128", "SIMPLE"];

/// NCCL's name of the variant a pin favours, as its profiler reports it, e.g. "RING/LL".
pub fn pin_name(p: Pin) -> String {
    let at = |names: &[&'static str], i: u8| names.get(usize::from(i)).copied().unwrap_or("?");
    format!("{}/{}", at(&ALGOS, p.algo), at(&PROTOS, p.proto))
}

/// Names compared as NCCL spelled them across versions ("Ring", "RING", "NVLSTree").
pub fn same_name(a: &str, b: &str) -> bool {
    let norm = |s: &str| s.replace('_', "").to_ascii_uppercase();
    norm(a) == norm(b)
}

/// One allreduce as NCCL's profiler describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ran<'a> {
    pub algo: &'a str,
    pub proto: &'a str,
    pub channels: u32,
}

/// What the profile asks for at one size: the pin (None: NCCL's own choice) and the channel
/// count the tuner sets with it (None: NCCL's own count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub pin: Option<Pin>,
    pub channels: Option<u32>,
}

/// How one call compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// The profile leaves this size to NCCL: nothing to judge.
    Unpinned,
    Agrees,
    /// NCCL ran another algorithm or protocol.
    OtherVariant,
    /// The variant agrees; NCCL ran more channels than the tuner set.
    MoreChannels,
}

/// The one rule: algorithm and protocol as pinned, and no more channels than set.
pub fn judge(e: Expected, r: Ran) -> Judgement {
    let Some(pin) = e.pin else {
        return Judgement::Unpinned;
    };
    let name = pin_name(pin);
    let (algo, proto) = name.split_once('/').unwrap_or((&name, ""));
    if !same_name(algo, r.algo) || !same_name(proto, r.proto) {
        return Judgement::OtherVariant;
    }
    match e.channels {
        Some(set) if r.channels > set => Judgement::MoreChannels,
        _ => Judgement::Agrees,
    }
}

/// Calls of one size that ran one way.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeRecord {
    pub bytes: u64,
    /// The pinned variant ("RING/LL"), or None where the profile leaves NCCL its choice.
    pub expected: Option<String>,
    /// The channel count the tuner sets there, if any.
    pub set_channels: Option<u32>,
    /// What NCCL ran ("RING/SIMPLE") and over how many channels.
    pub ran: String,
    pub channels: u32,
    pub calls: u64,
    pub agreed: u64,
    /// The measurement override set when NCCL ran these calls ("RING/LL",
    /// [`super::force`]); None where none was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced: Option<String>,
}

/// One kind of disagreement, logged once when first seen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassCount {
    pub expected: String,
    pub ran: String,
    /// `variant` (another algorithm or protocol) or `channels` (more than set).
    pub kind: String,
    pub set_channels: Option<u32>,
    pub max_channels: u32,
    pub first_bytes: u64,
    pub calls: u64,
}

/// One communicator's tally, written by the profiler at finalize.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// The NCCL version that loaded the profiler.
    pub nccl: Option<String>,
    /// The profiler table NCCL took ("v7", "v6" or "v5").
    pub profiler: String,
    pub rank: i32,
    pub nranks: i32,
    /// The tuner context built for this group follows the profile (the same decision the
    /// tuner makes: validity, group, the environment).
    pub following: bool,
    /// Why it follows nothing, where it does not.
    pub why_not: Option<String>,
    /// `NCCL_ALGO=...`/`NCCL_PROTO=...` set in the process: the tuner then steers nothing.
    pub user_pins: Vec<String>,
    /// getCollInfo calls for allreduce the tuner answered in this process.
    pub tuner_calls: u64,
    pub allreduces: u64,
    /// Calls at a pinned size, and how many of them ran as pinned.
    pub judged: u64,
    pub agreed: u64,
    pub sizes: Vec<SizeRecord>,
    pub classes: Vec<ClassCount>,
}

impl Summary {
    /// Counts one call; returns the class's line to log when it is a disagreement first seen.
    pub fn count(&mut self, bytes: u64, e: Expected, r: Ran) -> Option<String> {
        self.count_forced(bytes, e, r, None)
    }

    /// [`Summary::count`] of a call made while the measurement override asked for `forced`
    /// (its name, "RING/LL"): its size record is kept apart from others of the same size.
    pub fn count_forced(
        &mut self,
        bytes: u64,
        e: Expected,
        r: Ran,
        forced: Option<String>,
    ) -> Option<String> {
        self.allreduces += 1;
        let j = judge(e, r);
        let ran = format!("{}/{}", r.algo, r.proto);
        let expected = e.pin.map(pin_name);
        let agreed = u64::from(j == Judgement::Agrees);
        match self.sizes.iter_mut().find(|s| {
            (s.bytes, &s.ran, s.channels, &s.expected, &s.forced)
                == (bytes, &ran, r.channels, &expected, &forced)
        }) {
            Some(s) => {
                s.calls += 1;
                s.agreed += agreed;
            }
            None => self.sizes.push(SizeRecord {
                bytes,
                expected: expected.clone(),
                set_channels: e.channels,
                ran: ran.clone(),
                channels: r.channels,
                calls: 1,
                agreed,
                forced,
            }),
        }
        let kind = match j {
            Judgement::Unpinned => return None,
            Judgement::Agrees => {
                self.judged += 1;
                self.agreed += 1;
                return None;
            }
            Judgement::OtherVariant => "variant",
            Judgement::MoreChannels => "channels",
        };
        self.judged += 1;
        let expected = expected.unwrap_or_default();
        if let Some(c) = self.classes.iter_mut().find(|c| {
            (c.expected.as_str(), c.ran.as_str(), c.kind.as_str()) == (&expected, &ran, kind)
        }) {
            c.calls += 1;
            c.max_channels = c.max_channels.max(r.channels);
            return None;
        }
        let line = match kind {
            "variant" => format!(
                "NCCL ran {ran} over {} channels at {bytes} bytes where the profile pins {expected}",
                r.channels
            ),
            _ => format!(
                "NCCL ran {ran} over {} channels at {bytes} bytes where the tuner set at most {}",
                r.channels,
                e.channels.unwrap_or(0)
            ),
        };
        self.classes.push(ClassCount {
            expected,
            ran,
            kind: kind.into(),
            set_channels: e.channels,
            max_channels: r.channels,
            first_bytes: bytes,
            calls: 1,
        });
        Some(line)
    }
}

/// `check --nccl-audit`'s verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every call at a pinned size ran as pinned, on every rank.
    Follows {
        agreed: u64,
        unpinned: u64,
        ranks: usize,
    },
    /// One sentence saying why NCCL does not follow the profile.
    NotFollowed(String),
}

/// The verdict on the summaries of every rank of one sweep that ran `pinned` (the sizes the
/// profile pins for the group) and expected `ranks` summaries. The first cause that applies
/// is the one said: nothing loaded, the user's pins, the tuner refusing the profile, the tuner
/// never asked, NCCL running another variant or more channels, a pinned size never seen.
pub fn verdict(summaries: &[Summary], pinned: &[u64], ranks: usize) -> Verdict {
    use Verdict::NotFollowed as No;
    if summaries.is_empty() {
        return No("NCCL loaded no profiler from libartune.so (NCCL_PROFILER_PLUGIN needs NCCL 2.28 or later, which loads profiler v5, v6 or v7), so nothing shows what it ran".into());
    }
    if summaries.len() < ranks {
        return No(format!(
            "{} of {ranks} ranks wrote an audit: NCCL did not load libartune.so as the profiler of every rank",
            summaries.len()
        ));
    }
    let nccl = summaries[0]
        .nccl
        .clone()
        .unwrap_or_else(|| "of unknown version".into());
    let judged: u64 = summaries.iter().map(|s| s.judged).sum();
    let classes = summaries.iter().flat_map(|s| &s.classes);
    let differ = |kind: &str| -> u64 {
        classes
            .clone()
            .filter(|c| c.kind == kind)
            .map(|c| c.calls)
            .sum()
    };
    if let Some(s) = summaries.iter().find(|s| !s.user_pins.is_empty()) {
        let seen = match classes.clone().find(|c| c.kind == "variant") {
            Some(c) => format!(
                " (NCCL ran {} where the profile pins {}, first at {} bytes; {} of {judged} pinned calls differ)",
                c.ran,
                c.expected,
                c.first_bytes,
                differ("variant")
            ),
            None => String::new(),
        };
        return No(format!(
            "{} is set in the ranks' environment, so NCCL runs the user's choice and the tuner steers nothing{seen}; unset it to follow the profile",
            s.user_pins.join(", ")
        ));
    }
    if let Some(why) = summaries.iter().find_map(|s| s.why_not.clone()) {
        return No(format!("the tuner follows no profile: {why}"));
    }
    if judged > 0 && summaries.iter().any(|s| s.tuner_calls == 0) {
        return No(format!(
            "NCCL {nccl} never asked libartune.so's tuner (NCCL_TUNER_PLUGIN was not loaded), so it kept its own choices"
        ));
    }
    if let Some(c) = classes.clone().find(|c| c.kind == "variant") {
        let calls = differ("variant");
        return No(format!(
            "NCCL {nccl} ran {} where the profile pins {} (first at {} bytes; {calls} of {judged} pinned calls differ): it does not follow the tuner's cost table",
            c.ran, c.expected, c.first_bytes
        ));
    }
    if let Some(c) = classes.clone().find(|c| c.kind == "channels") {
        return No(format!(
            "NCCL {nccl} ran {} over {} channels where the tuner set at most {} (first at {} bytes): it ignores the tuner's channel count",
            c.ran,
            c.max_channels,
            c.set_channels.unwrap_or(0),
            c.first_bytes
        ));
    }
    let seen: BTreeMap<u64, u64> = summaries
        .iter()
        .flat_map(|s| &s.sizes)
        .filter(|r| r.expected.is_some())
        .fold(BTreeMap::new(), |mut m, r| {
            *m.entry(r.bytes).or_default() += r.calls;
            m
        });
    if let Some(b) = pinned.iter().find(|b| !seen.contains_key(b)) {
        return No(format!(
            "no allreduce of {b} bytes, a size the profile pins, reached NCCL's profiler as pinned (a one-rank NCCL only copies locally, and NCCL before 2.30 cannot put several ranks on one GPU)"
        ));
    }
    let agreed = summaries.iter().map(|s| s.agreed).sum();
    let all: u64 = summaries.iter().map(|s| s.allreduces).sum();
    Verdict::Follows {
        agreed,
        unpinned: all - judged,
        ranks: summaries.len(),
    }
}

#[cfg(test)]
mod tests;

//! Everything a profile must satisfy before anyone acts on it. Limits bound what a hostile
//! file can make a reader allocate or loop over.

use super::{Profile, SCHEMA_VERSION};
use crate::topology::file;
use crate::topology::TopologyError;
use serde::Deserialize;
use serde_json::value::RawValue;

/// Why a profile was refused. Each message is a phrase to embed in a sentence that names the
/// file; callers that act on the kind match on the variant.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    #[error("it is {}, more than the {} a profile may have", crate::units::fmt_mem_apart(*len, *limit).0, crate::units::fmt_mem_apart(*len, *limit).1)]
    TooLarge { len: u64, limit: u64 },
    /// Not JSON at all (a notes file, a binary): nothing says it is a profile.
    #[error("{0}")]
    NotJson(String),
    /// JSON of the wrong shape for its schema version (a missing field, a value of the wrong
    /// type).
    #[error("{0}")]
    Json(String),
    #[error("it has no `schema_version`; it is not an artune profile")]
    NotAProfile,
    /// JSON in the topology file format (`artune topo --json`), given where a profile goes.
    #[error("it is a topology file (the format `artune topo --json` writes), not a profile")]
    TopologyFile,
    #[error("its `schema_version` is {0}, not a version number")]
    SchemaNotANumber(String),
    #[error("it has schema version {found}, newer than this artune reads ({SCHEMA_VERSION}): a newer artune wrote it; upgrade artune to read it, or tune with this version into another file")]
    SchemaTooNew { found: u64 },
    #[error("schema version {found} is not one this artune reads (it reads {SCHEMA_VERSION})")]
    SchemaUnsupported { found: u64 },
    #[error("its topology is invalid: {0}")]
    Topology(TopologyError),
    /// Sound JSON of the right shape that breaks a rule: a limit, an order, a reference.
    #[error("{0}")]
    Invalid(String),
}

impl ProfileError {
    /// The refusal as the error a caller reports for the file at `path`, with its advice.
    pub fn at(self, path: &std::path::Path) -> crate::error::Error {
        crate::error::Error::Profile {
            path: path.into(),
            hint: hint(&self, path),
            reason: self.to_string(),
        }
    }

    /// Whether the file is an artune profile, perhaps of another version or broken: one a
    /// tune may replace (`--out`), where a file that is not one is refused without `--force`.
    pub fn is_a_profile(&self) -> bool {
        match self {
            ProfileError::TooLarge { .. }
            | ProfileError::NotJson(_)
            | ProfileError::NotAProfile
            | ProfileError::TopologyFile => false,
            ProfileError::Json(_)
            | ProfileError::SchemaNotANumber(_)
            | ProfileError::SchemaTooNew { .. }
            | ProfileError::SchemaUnsupported { .. }
            | ProfileError::Topology(_)
            | ProfileError::Invalid(_) => true,
        }
    }

    /// Whether a tune may replace the file (`--out`) without `--force`: a profile of this or
    /// an older schema, perhaps broken. A newer artune's profile is kept, since this one would
    /// replace it with less than it records.
    pub fn may_replace(&self) -> bool {
        self.is_a_profile() && !matches!(self, ProfileError::SchemaTooNew { .. })
    }
}

/// What to do about a file that is not a valid profile: tune into it again only where it is
/// one (the advice a tune would follow, see `ProfileError::is_a_profile`), pass a topology
/// file as `--topology`, and otherwise name a profile.
fn hint(e: &ProfileError, path: &std::path::Path) -> String {
    use ProfileError as P;
    let quoted = crate::shell::quote(&path.display().to_string());
    match e {
        P::TopologyFile => format!(
            "; to simulate that machine pass it as `--topology {quoted}` (e.g. `artune tune --topology {quoted} --out profile.json`)"
        ),
        P::TooLarge { .. } | P::SchemaTooNew { .. } => String::new(),
        e if !e.is_a_profile() => "; name a profile that `artune tune` wrote".into(),
        _ => format!("; run `artune tune --out {quoted}` to write a new one"),
    }
}

/// Documented limits (docs/FORMATS.md, "Limits").
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub file_bytes: u64,
    pub groups: usize,
    pub buckets_per_group: usize,
    pub gpus: usize,
    /// Largest message size a bucket may name (1 TiB).
    pub message_bytes: u64,
    /// Largest per-GPU buffer a backend may claim (1 TiB).
    pub buffer_bytes: u64,
    /// Deepest nesting of arrays and objects.
    pub depth: usize,
    pub contention_curves: usize,
    pub points_per_curve: usize,
}

pub const LIMITS: Limits = Limits {
    file_bytes: 64 << 20,
    groups: 1024,
    buckets_per_group: 4096,
    gpus: crate::topology::MAX_GPUS,
    message_bytes: 1 << 40,
    buffer_bytes: 1 << 40,
    depth: file::MAX_DEPTH,
    contention_curves: 1024,
    points_per_curve: 1024,
};

pub(super) fn parse(text: &str) -> Result<Profile, ProfileError> {
    #[derive(Deserialize)]
    struct Peek<'a> {
        // Present but null is Some: a version that is not a number, not a missing one. Raw, so
        // a number is said as written: 2**64 as a Value would be a float, 1.8446744073709552e19.
        #[serde(default, borrow, deserialize_with = "present")]
        schema_version: Option<&'a RawValue>,
    }
    fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
        <&RawValue>::deserialize(d).map(Some)
    }
    if text.len() as u64 > LIMITS.file_bytes {
        return Err(ProfileError::TooLarge {
            len: text.len() as u64,
            limit: LIMITS.file_bytes,
        });
    }
    // Syntax, depth and repeated keys first, so the typed passes below only meet sound JSON.
    file::check_json(text).map_err(ProfileError::NotJson)?;
    let json = |e: serde_json::Error| ProfileError::Json(file::describe(&e, text));
    let peek: Peek = serde_json::from_str(text).map_err(json)?;
    let found = match peek.schema_version {
        None if file::parse(text).is_ok() => return Err(ProfileError::TopologyFile),
        None => return Err(ProfileError::NotAProfile),
        Some(raw) => serde_json::from_str::<u64>(raw.get())
            .map_err(|_| ProfileError::SchemaNotANumber(as_written(raw)))?,
    };
    if found > SCHEMA_VERSION as u64 {
        return Err(ProfileError::SchemaTooNew { found });
    }
    if found != SCHEMA_VERSION as u64 {
        return Err(ProfileError::SchemaUnsupported { found });
    }
    let p: Profile = serde_json::from_str(text).map_err(json)?;
    check(&p)?;
    Ok(p)
}

/// A JSON value for a message as the file writes it, cut to one short line: a number's own
/// digits, anything else compacted.
fn as_written(raw: &RawValue) -> String {
    let s = match serde_json::from_str::<serde_json::Value>(raw.get()) {
        Ok(serde_json::Value::Number(_)) | Err(_) => raw.get().to_string(),
        Ok(v) => v.to_string(),
    };
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

fn finite_nonneg(v: f64) -> bool {
    v.is_finite() && v >= 0.0
}

/// Semantic checks the types cannot express.
pub fn check(p: &Profile) -> Result<(), ProfileError> {
    if !p.simulated && p.fabric.starts_with("simulated") {
        return Err(ProfileError::Invalid(format!(
            "it says \"simulated\": false, but its fabric is \"{}\", the simulator: a model \
             of a machine must never pass for a measurement",
            p.fabric
        )));
    }
    let mut topo = p.topology.clone();
    file::check(&topo).map_err(|e| ProfileError::Topology(TopologyError::Invalid(e)))?;
    topo.normalize().map_err(ProfileError::Topology)?;
    check_groups(p, topo.gpu_count()).map_err(ProfileError::Invalid)?;
    super::kernels::validate(&p.kernels, p.simulated).map_err(ProfileError::Invalid)
}

fn check_groups(p: &Profile, ngpu: usize) -> Result<(), String> {
    let l = super::LIMITS;
    if p.groups.len() > l.groups {
        return Err(format!(
            "it has {} groups, more than the {} allowed",
            p.groups.len(),
            l.groups
        ));
    }
    for (gi, g) in p.groups.iter().enumerate() {
        let at = format!("group {gi} (TP{} {})", g.tp, g.mode.id());
        if g.tp < 2 || g.tp != g.gpus.len() {
            return Err(format!("{at} has tp {} but {} GPUs", g.tp, g.gpus.len()));
        }
        if g.gpus.len() > l.gpus || g.gpus.iter().any(|&i| i >= ngpu) {
            return Err(format!("{at} names a GPU the topology does not have"));
        }
        let mut seen = g.gpus.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != g.gpus.len() {
            return Err(format!("{at} lists a GPU twice"));
        }
        if let Some(isl) = &g.islands {
            let mut in_islands: Vec<usize> = isl.gpus.concat();
            in_islands.sort_unstable();
            let equal = isl.gpus.iter().all(|i| i.len() == isl.size());
            if in_islands != seen || isl.gpus.len() < 2 || isl.size() < 1 || !equal {
                return Err(format!(
                    "{at} has islands {:?} that do not split its GPUs {:?} into equal parts",
                    isl.gpus, g.gpus
                ));
            }
        }
        if g.buckets.is_empty() || g.buckets.len() > l.buckets_per_group {
            return Err(format!(
                "{at} has {} buckets; it needs 1 to {}",
                g.buckets.len(),
                l.buckets_per_group
            ));
        }
        let mut prev = 0u64;
        for b in &g.buckets {
            if b.bytes == 0 || b.bytes > l.message_bytes {
                return Err(format!(
                    "{at} has a bucket of {} bytes; sizes must be 1 byte to 1 TiB",
                    b.bytes
                ));
            }
            if b.bytes <= prev {
                return Err(format!(
                    "{at} has bucket sizes out of order at {} bytes",
                    b.bytes
                ));
            }
            prev = b.bytes;
            if !b.results.contains_key(&b.choice) {
                return Err(format!(
                    "{at} chooses {} at {} bytes without a result for it",
                    b.choice, b.bytes
                ));
            }
            // NCCL's plugin runs nccl_choice: a kernel there would be read as a pin.
            if let Some(n) = b.nccl_choice.filter(|n| !n.is_nccl()) {
                return Err(format!(
                    "{at} has nccl_choice {n} at {} bytes, which is no NCCL variant",
                    b.bytes
                ));
            }
            for (be, t) in &b.results {
                let ok = [t.median_us, t.ci_low_us, t.ci_high_us]
                    .into_iter()
                    .all(finite_nonneg)
                    && t.ci_low_us <= t.median_us
                    && t.median_us <= t.ci_high_us;
                let band_ok = t.model.is_none_or(|m| {
                    m.low.is_finite() && m.high.is_finite() && 0.0 < m.low && m.low <= m.high
                });
                if !ok || !band_ok {
                    return Err(format!(
                        "{at} has an impossible timing for {be} at {} bytes",
                        b.bytes
                    ));
                }
            }
        }
        if g.crossovers.len() > g.buckets.len() {
            return Err(format!(
                "{at} has {} crossovers but only {} buckets",
                g.crossovers.len(),
                g.buckets.len()
            ));
        }
        for c in &g.crossovers {
            if c.bytes == 0 || c.bytes > l.message_bytes {
                return Err(format!(
                    "{at} has a crossover at {} bytes; sizes must be 1 byte to 1 TiB",
                    c.bytes
                ));
            }
        }
        for (be, m) in &g.memory {
            if m.bytes_per_gpu > l.buffer_bytes {
                return Err(format!(
                    "{at} claims {} bytes per GPU for {be}; the limit is 1 TiB",
                    m.bytes_per_gpu
                ));
            }
            if m.serves_up_to_bytes.is_some_and(|b| b > l.message_bytes)
                || m.chosen_up_to_bytes.is_some_and(|b| b > l.message_bytes)
            {
                return Err(format!(
                    "{at} says the {be} buffers serve messages above 1 TiB"
                ));
            }
            if m.required_bytes_per_gpu.is_some_and(|b| b > l.buffer_bytes) {
                return Err(format!("{at} says {be} requires more than 1 TiB per GPU"));
            }
        }
        for (be, f) in &g.forms {
            if crate::allreduce::Form::runs(*be, g.mode).is_none()
                || (g.mode == crate::allreduce::Mode::Eager && *f != crate::allreduce::Form::Staged)
            {
                return Err(format!(
                    "{at} says {be} ran {} in {} mode, which artune's kernels never do",
                    f.id(),
                    g.mode.id()
                ));
            }
        }
    }
    check_contention(p, ngpu)?;
    let s = &p.settings;
    if s.min_bytes > s.max_bytes || s.max_bytes > l.message_bytes {
        return Err(format!(
            "its settings span {} to {} bytes; sizes must be in order and at most 1 TiB",
            s.min_bytes, s.max_bytes
        ));
    }
    if s.tp.len() > l.gpus || s.tp.iter().any(|&tp| tp > l.gpus) {
        return Err(format!(
            "its settings list TP sizes above {} or more than {} of them",
            l.gpus, l.gpus
        ));
    }
    if !finite_nonneg(s.target_ci) || !finite_nonneg(s.tuning_seconds) {
        return Err("its settings have a negative target_ci or tuning_seconds".into());
    }
    check_names(p)
}

/// Host names, arguments and fleet node lists are bounded like everything else.
fn check_names(p: &Profile) -> Result<(), String> {
    const NAME: usize = 1024;
    const ITEMS: usize = 100_000;
    if let Some(n) = &p.node {
        let long = [&n.hostname, &n.scheduler_node]
            .into_iter()
            .flatten()
            .any(|s| s.len() > NAME);
        if long || n.args.len() > 4096 || n.args.iter().any(|a| a.len() > NAME) {
            return Err(format!(
                "its `node` names or arguments are longer than {NAME} bytes or more than 4096"
            ));
        }
    }
    if let Some(f) = &p.fleet {
        let names = f.nodes.iter().chain(f.left_out.iter().map(|l| &l.node));
        if f.nodes.len() + f.left_out.len() > ITEMS || names.clone().any(|s| s.len() > NAME) {
            return Err(format!(
                "its `fleet` lists more than {ITEMS} nodes or a name longer than {NAME} bytes"
            ));
        }
        if f.left_out.iter().any(|l| l.reason.len() > 4 * NAME) {
            return Err("its `fleet` gives a reason longer than 4096 bytes".into());
        }
    }
    Ok(())
}

fn check_contention(p: &Profile, ngpu: usize) -> Result<(), String> {
    let l = super::LIMITS;
    if p.contention.len() > l.contention_curves {
        return Err(format!(
            "it has {} contention curves, more than the {} allowed",
            p.contention.len(),
            l.contention_curves
        ));
    }
    for (ci, c) in p.contention.iter().enumerate() {
        if c.gpus.len() > l.gpus || c.gpus.iter().any(|&i| i >= ngpu) {
            return Err(format!(
                "contention curve {ci} names a GPU the topology does not have"
            ));
        }
        if c.bytes > l.message_bytes {
            return Err(format!(
                "contention curve {ci} moves {} bytes; the limit is 1 TiB",
                c.bytes
            ));
        }
        if c.points.len() > l.points_per_curve {
            return Err(format!(
                "contention curve {ci} has {} points, more than the {} allowed",
                c.points.len(),
                l.points_per_curve
            ));
        }
        if c.points
            .iter()
            .any(|s| !finite_nonneg(s.per_gpu_gbps) || !finite_nonneg(s.aggregate_gbps))
        {
            return Err(format!("contention curve {ci} has a negative bandwidth"));
        }
    }
    Ok(())
}

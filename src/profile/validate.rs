//! Everything a profile must satisfy before anyone acts on it. Limits bound what a hostile
//! file can make a reader allocate or loop over.

use super::{Profile, SCHEMA_VERSION};
use serde::Deserialize;

/// Documented limits (README, "Profile limits").
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
}

pub const LIMITS: Limits = Limits {
    file_bytes: 64 << 20,
    groups: 1024,
    buckets_per_group: 4096,
    gpus: crate::topology::MAX_GPUS,
    message_bytes: 1 << 40,
    buffer_bytes: 1 << 40,
};

pub(super) fn parse(text: &str) -> Result<Profile, String> {
    #[derive(Deserialize)]
    struct Peek {
        schema_version: Option<serde_json::Value>,
    }
    let syntax = |e: serde_json::Error| {
        if e.is_eof() {
            format!(
                "it ends too early (line {}): the file looks truncated",
                e.line()
            )
        } else {
            e.to_string()
        }
    };
    let peek: Peek = serde_json::from_str(text).map_err(syntax)?;
    match peek.schema_version.as_ref().and_then(|v| v.as_u64()) {
        None => return Err("it has no numeric `schema_version`; it is not an artune profile".into()),
        Some(v) if v > SCHEMA_VERSION as u64 => {
            return Err(format!(
                "it has schema version {v}, newer than this artune reads ({SCHEMA_VERSION}); upgrade artune or re-run the tune with this version"
            ))
        }
        Some(v) if v != SCHEMA_VERSION as u64 => return Err(format!("schema version {v} is not supported")),
        Some(_) => {}
    }
    let p: Profile = serde_json::from_str(text).map_err(syntax)?;
    check(&p)?;
    Ok(p)
}

fn finite_nonneg(v: f64) -> bool {
    v.is_finite() && v >= 0.0
}

/// Semantic checks the types cannot express.
pub fn check(p: &Profile) -> Result<(), String> {
    let l = super::LIMITS;
    let mut topo = p.topology.clone();
    topo.normalize()
        .map_err(|e| format!("its topology is invalid: {e}"))?;
    let ngpu = topo.gpu_count();
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
            for (be, t) in &b.results {
                let ok = [t.median_us, t.ci_low_us, t.ci_high_us]
                    .into_iter()
                    .all(finite_nonneg)
                    && t.ci_low_us <= t.median_us
                    && t.median_us <= t.ci_high_us;
                if !ok {
                    return Err(format!(
                        "{at} has an impossible timing for {be} at {} bytes",
                        b.bytes
                    ));
                }
            }
        }
        for (be, m) in &g.memory {
            if m.bytes_per_gpu > l.buffer_bytes {
                return Err(format!(
                    "{at} claims {} bytes per GPU for {be}; the limit is 1 TiB",
                    m.bytes_per_gpu
                ));
            }
        }
    }
    Ok(())
}

//! Whether one profile's measurements fall inside the other's simulated error band, size by
//! size: the day a real box is measured, `compare SIMULATED MEASURED` reads off how honest the
//! model was (docs/MODEL-ERROR.md). And whether A and B are the same kind of machine at all.

use serde::Serialize;

use crate::allreduce::Backend;
use crate::profile::{GroupProfile, Profile};

/// One backend at one size, timed by the measured side, against the simulated side's band.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BandCheck {
    pub bytes: u64,
    pub backend: Backend,
    /// The simulated time and its band, µs.
    pub model_us: f64,
    pub band_low_us: f64,
    pub band_high_us: f64,
    /// The other profile's median.
    pub measured_us: f64,
    pub inside: bool,
}

/// Which profile carries the model bands: `A`, `B`, or none (both measured, or both
/// simulated: a model is not checked against a model).
pub fn model_side(a: &Profile, b: &Profile) -> Option<char> {
    let banded = |p: &Profile| {
        p.groups
            .iter()
            .flat_map(|g| &g.buckets)
            .flat_map(|k| k.results.values())
            .any(|t| t.model.is_some())
    };
    match (banded(a) && !banded(b), banded(b) && !banded(a)) {
        (true, _) => Some('A'),
        (_, true) => Some('B'),
        _ => None,
    }
}

/// Per size both groups timed and backend both measured: the measurement against the band.
pub fn checks(model: &GroupProfile, measured: &GroupProfile) -> Vec<BandCheck> {
    let mut out = Vec::new();
    for mb in &measured.buckets {
        let Some(sb) = model.buckets.iter().find(|b| b.bytes == mb.bytes) else {
            continue;
        };
        for (backend, m) in &mb.results {
            let Some(s) = sb.results.get(backend) else {
                continue;
            };
            let Some(band) = s.model else { continue };
            let (lo, hi) = (s.median_us * band.low, s.median_us * band.high);
            out.push(BandCheck {
                bytes: mb.bytes,
                backend: *backend,
                model_us: s.median_us,
                band_low_us: lo,
                band_high_us: hi,
                measured_us: m.median_us,
                inside: (lo..=hi).contains(&m.median_us),
            });
        }
    }
    out
}

/// Why A and B may not be comparable: different topology classes or GPU models. A warning,
/// not a refusal: comparing a simulated preset with a measured box of another class is how a
/// model is judged, but its regret is then no statement about either machine.
pub fn warnings(a: &Profile, b: &Profile) -> Vec<String> {
    let mut out = Vec::new();
    if a.fingerprint.topology_class != b.fingerprint.topology_class {
        out.push(format!(
            "A and B are different topology classes ({} vs {}): their choices need not agree, and regret here says how far one machine's profile is from the other's, not that either is wrong",
            a.fingerprint.topology_class, b.fingerprint.topology_class
        ));
    }
    let models = |p: &Profile| {
        let mut v: Vec<String> = p.topology.gpus.iter().map(|g| g.name.clone()).collect();
        v.sort();
        v.dedup();
        v.join(", ")
    };
    let (ma, mb) = (models(a), models(b));
    if ma != mb {
        out.push(format!(
            "A and B have different GPU models ({ma} vs {mb}): times differ by the GPUs as well as the choices"
        ));
    }
    out
}

/// Per size, which measured backends fall inside the simulated side's band, and by how much
/// the others miss it.
pub fn render(checks: &[BandCheck], side: char, s: &mut String) {
    use crate::units::fmt_bytes;
    use std::fmt::Write;
    let measured = if side == 'A' { 'B' } else { 'A' };
    let inside = checks.iter().filter(|c| c.inside).count();
    let _ = writeln!(
        s,
        "  {measured}'s measurements inside {side}'s simulated error band: {inside} of {} (per size below)",
        checks.len()
    );
    let mut sizes: Vec<u64> = checks.iter().map(|c| c.bytes).collect();
    sizes.dedup();
    for bytes in sizes {
        let at: Vec<&BandCheck> = checks.iter().filter(|c| c.bytes == bytes).collect();
        let words: Vec<String> = at
            .iter()
            .map(|c| {
                if c.inside {
                    format!("{} inside", c.backend)
                } else {
                    format!(
                        "{} OUTSIDE ({:.2}x the model)",
                        c.backend,
                        c.measured_us / c.model_us
                    )
                }
            })
            .collect();
        let _ = writeln!(s, "    {:>9}  {}", fmt_bytes(bytes), words.join(", "));
    }
}

//! The compiled kernels a tune timed, recorded in the profile so that artune's allreduce inside
//! an engine runs those kernels and no others: a kernel whose source or image differs from the
//! one measured has no measured time, so it is refused rather than trusted.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The kernels one target was compiled to (one entry per target a tune compiled for).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KernelImages {
    /// NVRTC's version, e.g. "13.0".
    pub nvrtc: String,
    /// What NVRTC compiled for: "sm_90" (machine code for that GPU) or "compute_121" (PTX the
    /// driver finished, when NVRTC was older than the GPU).
    pub target: String,
    pub programs: Vec<ProgramImage>,
}

/// One program of kernels/ as compiled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProgramImage {
    /// The program, e.g. "allreduce.cu".
    pub program: String,
    /// SHA-256 (hex) of what artune handed NVRTC: the program's name and source, the shared
    /// header and the compiler options. Another artune version's kernels differ here.
    pub source_sha256: String,
    /// SHA-256 (hex) of the cubin or PTX NVRTC produced, as the driver loaded it.
    pub image_sha256: String,
}

impl From<crate::fabric::LoadedKernels> for KernelImages {
    fn from(k: crate::fabric::LoadedKernels) -> KernelImages {
        KernelImages {
            nvrtc: k.nvrtc,
            target: k.target,
            programs: k
                .programs
                .into_iter()
                .map(|p| ProgramImage {
                    program: p.program,
                    source_sha256: p.source_sha256,
                    image_sha256: p.image_sha256,
                })
                .collect(),
        }
    }
}

/// Why the kernels loaded here are not the ones a profile timed. Each message is a phrase that
/// says what differs and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelMismatch {
    #[error("the profile records no kernel hashes (it was made by an artune older than the in-engine allreduce, or is simulated), so the kernels it timed cannot be told from others; tune again with this artune")]
    NotRecorded,
    #[error("the profile's kernels were compiled for {recorded}, this GPU loads {loaded}; it was tuned on another machine: tune on this one")]
    OtherTarget { recorded: String, loaded: String },
    #[error("kernels/{program} is not the source the profile timed (another artune version); tune again with this artune")]
    Source { program: String },
    #[error("NVRTC {now} compiled kernels/{program} to another image than NVRTC {then} did for the profile; tune again with this NVRTC")]
    Image {
        program: String,
        then: String,
        now: String,
    },
    #[error("kernels/{program} is loaded here but the profile records no image of it; tune again with this artune")]
    Unrecorded { program: String },
}

/// Whether `loaded` (the kernels this process compiled or read from its cache) are the kernels
/// recorded in a profile: the same target, and every loaded program with the source and image
/// the tune had.
pub fn check(recorded: &[KernelImages], loaded: &KernelImages) -> Result<(), KernelMismatch> {
    if recorded.is_empty() {
        return Err(KernelMismatch::NotRecorded);
    }
    let Some(then) = recorded.iter().find(|k| k.target == loaded.target) else {
        let targets: Vec<&str> = recorded.iter().map(|k| k.target.as_str()).collect();
        return Err(KernelMismatch::OtherTarget {
            recorded: targets.join(", "),
            loaded: loaded.target.clone(),
        });
    };
    for p in &loaded.programs {
        let Some(q) = then.programs.iter().find(|q| q.program == p.program) else {
            return Err(KernelMismatch::Unrecorded {
                program: p.program.clone(),
            });
        };
        if q.source_sha256 != p.source_sha256 {
            return Err(KernelMismatch::Source {
                program: p.program.clone(),
            });
        }
        if q.image_sha256 != p.image_sha256 {
            return Err(KernelMismatch::Image {
                program: p.program.clone(),
                then: then.nvrtc.clone(),
                now: loaded.nvrtc.clone(),
            });
        }
    }
    Ok(())
}

/// The checks a profile's `kernels` must pass (bounded sizes, hex digests, one entry per
/// target); a phrase for [`super::ProfileError::Invalid`].
pub(super) fn validate(k: &[KernelImages], simulated: bool) -> Result<(), String> {
    const ENTRIES: usize = 16;
    let word = |s: &str, extra: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
    };
    let digest = |s: &str| s.len() == 64 && s.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'));
    if simulated && !k.is_empty() {
        return Err("it is simulated but records compiled kernels".into());
    }
    if k.len() > ENTRIES {
        return Err(format!("its `kernels` has more than {ENTRIES} targets"));
    }
    for (i, e) in k.iter().enumerate() {
        if !word(&e.nvrtc, ".") || !word(&e.target, "_") {
            return Err(format!(
                "kernels entry {i} has an unreadable NVRTC version or target"
            ));
        }
        if k[..i].iter().any(|o| o.target == e.target) {
            return Err(format!("its `kernels` lists target {} twice", e.target));
        }
        if e.programs.is_empty() || e.programs.len() > ENTRIES {
            return Err(format!(
                "kernels entry {i} ({}) has {} programs; it needs 1 to {ENTRIES}",
                e.target,
                e.programs.len()
            ));
        }
        for (j, p) in e.programs.iter().enumerate() {
            if !word(&p.program, "._-") || !digest(&p.source_sha256) || !digest(&p.image_sha256) {
                return Err(format!(
                    "kernels entry {i} ({}) has a program without a name or a 64-digit lowercase hex SHA-256",
                    e.target
                ));
            }
            if e.programs[..j].iter().any(|o| o.program == p.program) {
                return Err(format!(
                    "kernels entry {i} ({}) lists {} twice",
                    e.target, p.program
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(target: &str, nvrtc: &str, src: char, img: char) -> KernelImages {
        KernelImages {
            nvrtc: nvrtc.into(),
            target: target.into(),
            programs: vec![
                ProgramImage {
                    program: "allreduce.cu".into(),
                    source_sha256: src.to_string().repeat(64),
                    image_sha256: img.to_string().repeat(64),
                },
                ProgramImage {
                    program: "check.cu".into(),
                    source_sha256: "0".repeat(64),
                    image_sha256: "1".repeat(64),
                },
            ],
        }
    }

    #[test]
    fn the_same_kernels_match_and_each_difference_is_named() {
        let tuned = vec![
            entry("sm_80", "13.0", 'a', 'b'),
            entry("sm_90", "13.0", 'a', 'c'),
        ];
        assert_eq!(check(&tuned, &entry("sm_90", "13.0", 'a', 'c')), Ok(()));
        assert_eq!(
            check(&[], &entry("sm_90", "13.0", 'a', 'c')),
            Err(KernelMismatch::NotRecorded)
        );
        let e = check(&tuned, &entry("sm_100", "13.0", 'a', 'c')).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the profile's kernels were compiled for sm_80, sm_90, this GPU loads sm_100; it was tuned on another machine: tune on this one"
        );
        let e = check(&tuned, &entry("sm_90", "13.0", 'd', 'c')).unwrap_err();
        assert_eq!(
            e,
            KernelMismatch::Source {
                program: "allreduce.cu".into()
            }
        );
        let e = check(&tuned, &entry("sm_90", "13.1", 'a', 'e')).unwrap_err();
        assert_eq!(
            e.to_string(),
            "NVRTC 13.1 compiled kernels/allreduce.cu to another image than NVRTC 13.0 did for the profile; tune again with this NVRTC"
        );
        let mut more = entry("sm_90", "13.0", 'a', 'c');
        more.programs.push(ProgramImage {
            program: "island.cu".into(),
            source_sha256: "2".repeat(64),
            image_sha256: "3".repeat(64),
        });
        assert!(matches!(
            check(&tuned, &more),
            Err(KernelMismatch::Unrecorded { .. })
        ));
    }

    #[test]
    fn a_malformed_record_is_refused() {
        let good = vec![entry("sm_90", "13.0", 'a', 'c')];
        assert_eq!(validate(&good, false), Ok(()));
        assert_eq!(validate(&[], true), Ok(()));
        assert!(validate(&good, true).unwrap_err().contains("simulated"));
        let mut twice = good.clone();
        twice.push(entry("sm_90", "13.0", 'a', 'c'));
        assert!(validate(&twice, false).unwrap_err().contains("twice"));
        let mut short = good.clone();
        short[0].programs[0].image_sha256 = "abc".into();
        assert!(validate(&short, false).unwrap_err().contains("SHA-256"));
        let mut upper = good.clone();
        upper[0].programs[0].source_sha256 = "A".repeat(64);
        assert!(validate(&upper, false).is_err());
        let mut odd = good.clone();
        odd[0].target = "sm 90; rm".into();
        assert!(validate(&odd, false).unwrap_err().contains("target"));
        let mut empty = good;
        empty[0].programs.clear();
        assert!(validate(&empty, false).unwrap_err().contains("1 to 16"));
        let many: Vec<_> = (0..17)
            .map(|i| entry(&format!("sm_{i}"), "13.0", 'a', 'c'))
            .collect();
        assert!(validate(&many, false).is_err());
    }
}

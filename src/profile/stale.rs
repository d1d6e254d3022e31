//! Whether a profile still holds for a machine: the rule behind `artune check`, here so that
//! the C ABI, the NCCL plugin and engine plugins can ask the same question.

use std::fmt;

use super::Profile;
use crate::topology::{Link, Topology};

/// One difference between the machine a profile was made on and the one it is checked on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A simulated profile checked against a real machine: it was never measured there.
    Simulated {
        fabric: String,
    },
    /// Driver, CUDA or NCCL version.
    Version {
        what: &'static str,
        old: String,
        new: String,
    },
    GpuCount {
        old: usize,
        new: usize,
    },
    GpuName {
        gpu: usize,
        old: String,
        new: String,
    },
    GpuUuid {
        gpu: usize,
        old: String,
        new: String,
    },
    /// The link's maximum generation and width, as "Gen5 x16".
    GpuLink {
        gpu: usize,
        old: String,
        new: String,
    },
    /// The link trained narrower than its maximum, and was not when the profile was made.
    Narrowed {
        gpu: usize,
        width: u8,
        max_width: u8,
    },
    /// The path class between two GPUs (as `nvidia-smi topo -m` labels it).
    Path {
        a: usize,
        b: usize,
        old: String,
        new: String,
    },
    /// The wiring hash changed, and no GPU or path change above explains it.
    TopologyClass {
        old: String,
        new: String,
    },
    /// Nothing above changed, yet the host hash did.
    Host {
        old: String,
        new: String,
    },
    /// An NCCL or CUDA variable that changes a measurement differs from the tune's.
    Environment(super::environment::VarChange),
}

impl Change {
    /// True for a change of one GPU or of the GPU set itself.
    pub fn is_gpu(&self) -> bool {
        matches!(
            self,
            Change::GpuCount { .. }
                | Change::GpuName { .. }
                | Change::GpuUuid { .. }
                | Change::GpuLink { .. }
                | Change::Narrowed { .. }
                | Change::Path { .. }
        )
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Simulated { fabric } => write!(
                f,
                "it was made on a simulated fabric ({fabric}), not measured on this machine"
            ),
            Change::Version { what, old, new } => write!(f, "{what} {old} → {new}"),
            Change::GpuCount { old, new } => write!(f, "GPU count {old} → {new}"),
            Change::GpuName { gpu, old, new } => write!(f, "GPU {gpu} {old} → {new}"),
            Change::GpuUuid { gpu, old, new } => write!(f, "GPU {gpu} UUID {old} → {new}"),
            Change::GpuLink { gpu, old, new } => write!(f, "GPU {gpu} PCIe link {old} → {new}"),
            Change::Narrowed {
                gpu,
                width,
                max_width,
            } => write!(
                f,
                "GPU {gpu} PCIe link trained at x{width} of x{max_width} (it ran full width when profiled)"
            ),
            Change::Path { a, b, old, new } => write!(f, "GPU {a}–{b} path {old} → {new}"),
            Change::TopologyClass { old, new } => write!(f, "topology class {old} → {new}"),
            Change::Host { old, new } => write!(f, "host fingerprint {old} → {new}"),
            Change::Environment(v) => write!(f, "{v}"),
        }
    }
}

/// What the machine does not report, so it could not be compared (and is taken as unchanged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unchecked {
    Version(&'static str),
    GpuUuids,
    /// The profile predates the recorded environment.
    Environment,
}

impl fmt::Display for Unchecked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unchecked::Version(what) => write!(f, "{what} version"),
            Unchecked::GpuUuids => f.write_str("GPU UUIDs"),
            Unchecked::Environment => f.write_str("NCCL and CUDA variables (not recorded)"),
        }
    }
}

/// How a profile compares with the machine it is checked against.
#[derive(Debug, Default, PartialEq)]
pub struct Staleness {
    /// What changed, old → new; empty when the profile still holds.
    pub changes: Vec<Change>,
    pub unchecked: Vec<Unchecked>,
}

impl Staleness {
    pub fn holds(&self) -> bool {
        self.changes.is_empty()
    }

    /// The first few changes as one phrase, for a one-line message.
    pub fn summary(&self, shown: usize) -> String {
        let mut msg = self
            .changes
            .iter()
            .take(shown)
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        if self.changes.len() > shown {
            msg.push_str(&format!(" and {} more changes", self.changes.len() - shown));
        }
        msg
    }
}

/// The link as the wiring has it: its maximum, since idle GPUs train down.
fn link(l: &Link) -> String {
    format!(
        "Gen{} x{}",
        l.max_gen.or(l.gen).unwrap_or(0),
        l.max_width.or(l.width).unwrap_or(0)
    )
}

/// Compares the machine a profile was made on with `now`. Versions and GPU UUIDs `now` does not
/// report are taken as unchanged (and listed as unchecked) rather than called stale.
pub fn staleness(p: &Profile, now: &Topology) -> Staleness {
    let then = &p.topology;
    let mut st = Staleness::default();
    if p.simulated && now.origin.kind == "nvml" {
        st.changes.push(Change::Simulated {
            fabric: p.fabric.clone(),
        });
        return st;
    }
    // `now` with what it does not know filled in from the profile, for the host hash.
    let mut known = now.clone();
    let versions = [
        (
            "driver",
            p.versions.driver.as_ref().or(then.host.driver.as_ref()),
            &mut known.host.driver,
        ),
        (
            "CUDA",
            p.versions.cuda.as_ref().or(then.host.cuda.as_ref()),
            &mut known.host.cuda,
        ),
        (
            "NCCL",
            p.versions.nccl.as_ref().or(then.host.nccl.as_ref()),
            &mut known.host.nccl,
        ),
    ];
    for (what, old, new) in versions {
        match (old, new.as_ref()) {
            (Some(o), Some(n)) if o != n => st.changes.push(Change::Version {
                what,
                old: o.clone(),
                new: n.clone(),
            }),
            (Some(o), None) => {
                st.unchecked.push(Unchecked::Version(what));
                *new = Some(o.clone());
            }
            _ => {}
        }
    }
    if then.gpu_count() != now.gpu_count() {
        st.changes.push(Change::GpuCount {
            old: then.gpu_count(),
            new: now.gpu_count(),
        });
    } else {
        for (i, (a, b)) in then.gpus.iter().zip(&now.gpus).enumerate() {
            if a.name != b.name {
                st.changes.push(Change::GpuName {
                    gpu: a.index,
                    old: a.name.clone(),
                    new: b.name.clone(),
                });
            }
            match (&a.uuid, &b.uuid) {
                (Some(x), Some(y)) if x != y => st.changes.push(Change::GpuUuid {
                    gpu: a.index,
                    old: x.clone(),
                    new: y.clone(),
                }),
                (Some(x), None) => {
                    if !st.unchecked.contains(&Unchecked::GpuUuids) {
                        st.unchecked.push(Unchecked::GpuUuids);
                    }
                    known.gpus[i].uuid = Some(x.clone());
                }
                _ => {}
            }
            if link(&a.pcie) != link(&b.pcie) {
                st.changes.push(Change::GpuLink {
                    gpu: a.index,
                    old: link(&a.pcie),
                    new: link(&b.pcie),
                });
            } else if b.pcie.narrowed() && !a.pcie.narrowed() {
                st.changes.push(Change::Narrowed {
                    gpu: a.index,
                    width: b.pcie.width.unwrap_or(0),
                    max_width: b.pcie.max_width.unwrap_or(0),
                });
            }
        }
    }
    if p.fingerprint.topology_class != now.class_hash() {
        for x in &then.pairs {
            if let Some(y) = now.pair(x.from, x.to) {
                if x.from < x.to && (x.path, x.nvlinks) != (y.path, y.nvlinks) {
                    st.changes.push(Change::Path {
                        a: x.from,
                        b: x.to,
                        old: x.path.label(x.nvlinks),
                        new: y.path.label(y.nvlinks),
                    });
                }
            }
        }
        if !st.changes.iter().any(Change::is_gpu) {
            st.changes.push(Change::TopologyClass {
                old: p.fingerprint.topology_class.clone(),
                new: now.class_hash(),
            });
        }
    }
    if st.changes.is_empty() && p.fingerprint.host != known.host_hash() {
        st.changes.push(Change::Host {
            old: p.fingerprint.host.clone(),
            new: known.host_hash(),
        });
    }
    st
}

/// Adds to `st` each variable of `now` (this process's, see
/// [`environment::current`](super::environment::current)) that differs from the environment
/// the profile was measured in: each one is a reason of its own. A profile that predates the
/// record leaves the environment unchecked.
pub fn add_environment(
    st: &mut Staleness,
    p: &Profile,
    now: &std::collections::BTreeMap<String, String>,
) {
    match &p.environment {
        Some(e) => st.changes.extend(
            super::environment::differences(&e.variables, now, &[])
                .into_iter()
                .map(Change::Environment),
        ),
        None => st.unchecked.push(Unchecked::Environment),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::sample;
    use crate::topology::presets;

    fn texts(st: &Staleness) -> Vec<String> {
        st.changes.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn same_machine_holds() {
        let p = sample::profile();
        let mut now = presets::get("pcie-4x-1switch").unwrap();
        now.origin.kind = "file".into();
        assert_eq!(staleness(&p, &now), Staleness::default());
        assert!(staleness(&p, &now).holds());
    }

    #[test]
    fn simulated_profile_is_stale_on_real_machine() {
        let p = sample::profile();
        let mut now = presets::get("pcie-4x-1switch").unwrap();
        now.origin.kind = "nvml".into();
        let st = staleness(&p, &now);
        assert!(matches!(st.changes[..], [Change::Simulated { .. }]));
        assert!(texts(&st)[0].contains("simulated fabric"));
    }

    #[test]
    fn names_what_changed_old_to_new() {
        let mut p = sample::profile();
        p.versions.driver = Some("580.1".into());
        let mut now = p.topology.clone();
        now.host.driver = Some("590.2".into());
        assert_eq!(texts(&staleness(&p, &now)), ["driver 580.1 → 590.2"]);

        let now = presets::get("pcie-2x").unwrap();
        let st = staleness(&p, &now);
        assert_eq!(st.changes[0], Change::GpuCount { old: 4, new: 2 });
        // A GPU change explains the new class hash: no separate class change is reported.
        assert!(!st
            .changes
            .iter()
            .any(|c| matches!(c, Change::TopologyClass { .. })));

        let mut now = p.topology.clone();
        now.gpus[1].uuid = Some("GPU-new".into());
        p.topology.gpus[1].uuid = Some("GPU-old".into());
        assert_eq!(
            texts(&staleness(&p, &now)),
            ["GPU 1 UUID GPU-old → GPU-new"]
        );
    }

    #[test]
    fn what_the_machine_does_not_report_is_unchecked_not_stale() {
        let mut p = sample::profile();
        p.versions.nccl = Some("2.28.9".into());
        p.topology.gpus[0].uuid = Some("GPU-aaa".into());
        p.topology.host.nccl = Some("2.28.9".into());
        p.fingerprint.host = p.topology.host_hash();
        let mut now = presets::get("pcie-4x-1switch").unwrap();
        now.origin.kind = "file".into();
        let st = staleness(&p, &now);
        assert!(st.holds(), "{:?}", st.changes);
        assert_eq!(
            st.unchecked,
            [Unchecked::Version("NCCL"), Unchecked::GpuUuids]
        );
    }

    #[test]
    fn wiring_change_is_named() {
        let p = sample::profile();
        let mut now = p.topology.clone();
        now.gpus[2].pcie.max_width = Some(8);
        now.gpus[2].pcie.width = Some(8);
        let c = texts(&staleness(&p, &now));
        assert!(
            c.iter().any(|c| c == "GPU 2 PCIe link Gen5 x16 → Gen5 x8"),
            "{c:?}"
        );
    }

    #[test]
    fn a_changed_variable_is_its_own_reason() {
        let mut p = sample::profile();
        let mut now = presets::get("pcie-4x-1switch").unwrap();
        now.origin.kind = "file".into();
        let vars = |items: &[(&str, &str)]| {
            super::super::environment::relevant(items.iter().map(|(k, v)| (*k, *v)))
        };
        let mut st = staleness(&p, &now);
        add_environment(&mut st, &p, &vars(&[("NCCL_P2P_LEVEL", "SYS")]));
        assert!(st.holds(), "no record, no verdict: {:?}", st.changes);
        assert_eq!(st.unchecked, [Unchecked::Environment]);
        p.environment = Some(super::super::Environment {
            variables: vars(&[("NCCL_P2P_LEVEL", "SYS")]),
            ..Default::default()
        });
        let mut st = staleness(&p, &now);
        add_environment(&mut st, &p, &vars(&[("NCCL_DEBUG", "INFO")]));
        assert_eq!(texts(&st), ["NCCL_P2P_LEVEL=SYS when tuned, unset now"]);
        let mut st = staleness(&p, &now);
        add_environment(&mut st, &p, &vars(&[("NCCL_P2P_LEVEL", "SYS")]));
        assert!(st.holds(), "{:?}", st.changes);
    }

    #[test]
    fn summary_shows_the_first_changes_and_counts_the_rest() {
        let st = Staleness {
            changes: (0..6)
                .map(|gpu| Change::GpuName {
                    gpu,
                    old: "A".into(),
                    new: "B".into(),
                })
                .collect(),
            unchecked: vec![],
        };
        assert_eq!(st.summary(2), "GPU 0 A → B, GPU 1 A → B and 4 more changes");
    }
}

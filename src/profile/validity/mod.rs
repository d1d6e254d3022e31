//! What a profile is valid for: the one rule every consumer applies (`artune check`, the C ABI's
//! `artune_check`, the NCCL tuner plugin, the Python package and both engine plugins).
//!
//! A profile is valid on a machine whose hardware that decides the choices is the profile's:
//! the topology class (GPU model and count, link widths and generations, switch layout, the
//! path between each pair). GPU UUIDs and host names are not part of it, so a node's profile is
//! valid on an identical node and a `fleet` class profile on every node of its class. Driver,
//! CUDA and NCCL versions and the NCCL/CUDA variables are recorded and reported as notes, with
//! `artune check --measure` suggested: they can move times, and only a measurement tells
//! whether the choices still hold. A profile measured on the simulated fabric is not valid on a
//! real machine, and one that cannot be compared (the machine could not be read) is not valid.
//! A loopback profile (`tune --loopback K`: K virtual ranks on one GPU) is compared by the one
//! real GPU it ran on, since no machine has its K GPUs.

use std::fmt;

use super::{GroupProfile, Profile};
use crate::allreduce::Backend;
use crate::topology::p2p::P2pGaps;
use crate::topology::{Gpu, Link, Topology};

/// One difference between the machine a profile was made on and the one it is checked on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A simulated profile checked against a real machine: it was never measured there.
    Simulated {
        fabric: String,
    },
    /// The machine could not be read, so nothing could be compared.
    Unread {
        why: String,
    },
    /// Driver, CUDA or NCCL version: a note.
    Version {
        what: &'static str,
        old: String,
        new: String,
    },
    /// The same hardware class with other GPUs (their UUIDs differ): a note.
    OtherNode,
    GpuCount {
        old: usize,
        new: usize,
    },
    GpuName {
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
    /// The link trained below its maximum generation, and was not when the profile was made: a
    /// note, since idle GPUs lower the generation to save power and raise it under load (a
    /// lower width is no power saving: [`Change::Narrowed`]).
    SlowerGen {
        gpu: usize,
        gen: u8,
        max_gen: u8,
    },
    /// The path class between two GPUs (as `nvidia-smi topo -m` labels it).
    Path {
        a: usize,
        b: usize,
        old: String,
        new: String,
    },
    /// The class hash changed (switch layout, memory, compute capability), and no GPU or path
    /// change above explains it.
    TopologyClass {
        old: String,
        new: String,
    },
    /// An NCCL or CUDA variable that changes a measurement differs from the tune's: a note.
    Environment(super::environment::VarChange),
    /// Backends a group chooses that this machine cannot run for want of P2P between the
    /// group's GPUs ([`P2pGaps::waiver`], the rule a tune waives them by), where the machine
    /// it was tuned on could: "TP4 graph on GPUs 0-3", the backends with the sizes they serve
    /// ("one_stage_push at 1K to 5.5K"), and why the first cannot run.
    Unavailable {
        group: String,
        chosen: Vec<String>,
        why: String,
    },
}

impl Change {
    /// True where the difference makes the profile not valid here; false for a note.
    pub fn decides(&self) -> bool {
        !matches!(
            self,
            Change::Version { .. }
                | Change::OtherNode
                | Change::Environment(_)
                | Change::SlowerGen { .. }
        )
    }

    /// True for a change of one GPU, its link, or of the GPU set itself.
    pub fn is_gpu(&self) -> bool {
        matches!(
            self,
            Change::GpuCount { .. }
                | Change::GpuName { .. }
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
            Change::Unread { why } => write!(f, "this machine could not be read ({why})"),
            Change::Version { what, old, new } => write!(f, "{what} {old} → {new}"),
            Change::OtherNode => f.write_str("tuned on another node of this class"),
            Change::GpuCount { old, new } => write!(f, "GPU count {old} → {new}"),
            Change::GpuName { gpu, old, new } => write!(f, "GPU {gpu} {old} → {new}"),
            Change::GpuLink { gpu, old, new } => write!(f, "GPU {gpu} PCIe link {old} → {new}"),
            Change::Narrowed {
                gpu,
                width,
                max_width,
            } => write!(
                f,
                "GPU {gpu} PCIe link trained at x{width} of x{max_width} (it ran full width when profiled)"
            ),
            Change::SlowerGen { gpu, gen, max_gen } => write!(
                f,
                "GPU {gpu} PCIe link at Gen{gen} of Gen{max_gen} (it ran at its maximum when profiled; idle GPUs lower the generation, so doctor --measure reads it under load)"
            ),
            Change::Path { a, b, old, new } => write!(f, "GPU {a}–{b} path {old} → {new}"),
            Change::TopologyClass { old, new } => write!(f, "topology class {old} → {new}"),
            Change::Environment(v) => write!(f, "{v}"),
            Change::Unavailable { group, chosen, why } => write!(
                f,
                "{group} chooses {}, which cannot run here ({why})",
                chosen.join(" and ")
            ),
        }
    }
}

/// What the machine does not report, so it could not be compared (and is taken as unchanged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unchecked {
    Version(&'static str),
    /// The profile predates the recorded environment.
    Environment,
}

impl fmt::Display for Unchecked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unchecked::Version(what) => write!(f, "{what} version"),
            Unchecked::Environment => f.write_str("NCCL and CUDA variables (not recorded)"),
        }
    }
}

/// The verdict on a profile for one machine: every difference found, each a reason (the
/// profile is not valid here) or a note.
#[derive(Debug, Default, PartialEq)]
pub struct Validity {
    pub changes: Vec<Change>,
    pub unchecked: Vec<Unchecked>,
}

/// The variable that lets a consumer follow a profile the rule finds not valid here; each
/// consumer says, in its start-up line, what it overrode.
pub const ENV_ALLOW_INVALID: &str = "ARTUNE_ALLOW_INVALID";
/// The variable that lets a consumer follow a profile made on the simulated fabric (tests).
pub const ENV_ALLOW_SIMULATED: &str = "ARTUNE_ALLOW_SIMULATED";

/// Which reasons the user overrides (`ARTUNE_ALLOW_SIMULATED`, `ARTUNE_ALLOW_INVALID`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allow {
    pub simulated: bool,
    pub invalid: bool,
}

/// The words an on/off variable takes (any case), as the Python package reads them.
const ON: [&str; 4] = ["1", "true", "on", "yes"];
const OFF: [&str; 4] = ["0", "false", "off", "no"];

impl Allow {
    /// The overrides this process's environment sets; Err names a variable set to a word
    /// that is neither on nor off (then taken as off).
    pub fn from_env() -> (Allow, Option<String>) {
        let mut bad = None;
        let mut on = |name: &str| {
            let raw = std::env::var(name).unwrap_or_default();
            let v = raw.trim().to_ascii_lowercase();
            if ON.contains(&v.as_str()) {
                return true;
            }
            if !v.is_empty() && !OFF.contains(&v.as_str()) {
                bad = Some(format!(
                    "{name}={raw} is none of {}, so it is taken as off",
                    [ON, OFF].concat().join(", ")
                ));
            }
            false
        };
        let allow = Allow {
            simulated: on(ENV_ALLOW_SIMULATED),
            invalid: on(ENV_ALLOW_INVALID),
        };
        (allow, bad)
    }

    /// Whether `allow` lets a consumer follow despite `c`.
    fn covers(self, c: &Change) -> bool {
        match c {
            Change::Simulated { .. } => self.simulated,
            c => !c.decides() || self.invalid,
        }
    }

    fn variable(c: &Change) -> &'static str {
        match c {
            Change::Simulated { .. } => ENV_ALLOW_SIMULATED,
            _ => ENV_ALLOW_INVALID,
        }
    }
}

impl Validity {
    /// True where no difference decides: the profile holds for this machine.
    pub fn valid(&self) -> bool {
        !self.changes.iter().any(Change::decides)
    }

    /// The differences that make the profile not valid here.
    pub fn reasons(&self) -> impl Iterator<Item = &Change> {
        self.changes.iter().filter(|c| c.decides())
    }

    /// The differences reported that leave it valid (versions, variables, another node).
    pub fn notes(&self) -> impl Iterator<Item = &Change> {
        self.changes.iter().filter(|c| !c.decides())
    }

    /// Whether a consumer follows the profile: valid, or every reason overridden by `allow`.
    pub fn followed(&self, allow: Allow) -> bool {
        self.changes.iter().all(|c| allow.covers(c))
    }

    /// The first few reasons as one phrase, for a one-line message.
    pub fn summary(&self, shown: usize) -> String {
        list(self.reasons(), shown)
    }

    /// What a consumer decided, in one phrase: "valid here", with the notes and what to run
    /// for them; "not valid here (reasons)" and what to do, or which variable overrode it.
    pub fn verdict(&self, allow: Allow) -> String {
        let notes = list(self.notes(), 3);
        let measure = self.notes().any(|c| matches!(c, Change::Version { .. }));
        // `check --measure` refuses to judge under other variables (it would time another
        // setup), so a variable's note asks for a tune under these, not a re-timing.
        let variables = self.notes().any(|c| matches!(c, Change::Environment(_)));
        let vars = |all: bool| -> String {
            let mut v: Vec<&str> = self
                .reasons()
                .filter(|c| all || !allow.covers(c))
                .map(Allow::variable)
                .collect();
            v.sort_unstable();
            v.dedup();
            let v: Vec<String> = v.iter().map(|v| format!("{v}=1")).collect();
            v.join(" and ")
        };
        let mut s = match (self.valid(), self.followed(allow)) {
            (true, _) => "valid here".to_string(),
            (false, true) => format!(
                "NOT valid here ({}), followed because {}",
                self.summary(3),
                vars(true)
            ),
            (false, false) => format!(
                "not valid here ({}): tune this machine again (artune tune), or set {} to follow it anyway",
                self.summary(3),
                vars(false)
            ),
        };
        if !notes.is_empty() {
            s += &format!("; {notes}");
            if variables {
                s += ": its times were measured under the tune's NCCL/CUDA variables; tune again under these (artune tune), or set them as they were";
            } else if measure {
                s += ": re-timing its decisive sizes (artune check --measure) tells whether its choices still hold";
            }
        }
        s
    }
}

fn list<'a>(changes: impl Iterator<Item = &'a Change>, shown: usize) -> String {
    let all: Vec<String> = changes.map(ToString::to_string).collect();
    let mut msg = all[..all.len().min(shown)].join(", ");
    if all.len() > shown {
        msg.push_str(&format!(" and {} more", all.len() - shown));
    }
    msg
}

/// The link as the wiring has it: its maximum, since idle GPUs train down.
fn link(l: &Link) -> String {
    format!(
        "Gen{} x{}",
        l.max_gen.or(l.gen).unwrap_or(0),
        l.max_width.or(l.width).unwrap_or(0)
    )
}

/// The verdict on `p` for this machine as NVML and sysfs read it, with `nccl` the NCCL version
/// the caller runs (None: unchecked). A machine that cannot be read is a reason, not an error,
/// so every consumer says the same thing about it.
pub fn here(p: &Profile, nccl: Option<String>) -> Validity {
    match crate::topology::discover(nccl) {
        Ok(now) => validity(p, &now),
        Err(e) => {
            let mut v = Validity::default();
            if p.simulated {
                v.changes.push(Change::Simulated {
                    fabric: p.fabric.clone(),
                });
            }
            v.changes.push(Change::Unread { why: e.to_string() });
            v
        }
    }
}

/// What `artune check` judges `p` by on the machine `now` (and `artune doctor --profile` with
/// it): the rule ([`validity`]) and this process's NCCL/CUDA variables against the tune's.
pub fn judged(p: &Profile, now: &Topology) -> Validity {
    let mut v = validity(p, now);
    add_environment(&mut v, p, &super::environment::current());
    v
}

/// The verdict on `p` for the machine `now`. Versions `now` does not report are taken as
/// unchanged and listed as unchecked.
pub fn validity(p: &Profile, now: &Topology) -> Validity {
    let then = &p.topology;
    let mut v = Validity::default();
    if p.simulated && now.origin.kind == "nvml" {
        v.changes.push(Change::Simulated {
            fabric: p.fabric.clone(),
        });
        return v;
    }
    let versions = [
        (
            "driver",
            &p.versions.driver,
            &then.host.driver,
            &now.host.driver,
        ),
        ("CUDA", &p.versions.cuda, &then.host.cuda, &now.host.cuda),
        ("NCCL", &p.versions.nccl, &then.host.nccl, &now.host.nccl),
    ];
    for (what, recorded, host, new) in versions {
        match (recorded.as_ref().or(host.as_ref()), new.as_ref()) {
            (Some(o), Some(n)) if o != n => v.changes.push(Change::Version {
                what,
                old: o.clone(),
                new: n.clone(),
            }),
            (Some(_), None) => v.unchecked.push(Unchecked::Version(what)),
            _ => {}
        }
    }
    if then.origin.kind == LOOPBACK {
        loopback(then, now, &mut v);
        return v;
    }
    if then.gpu_count() != now.gpu_count() {
        v.changes.push(Change::GpuCount {
            old: then.gpu_count(),
            new: now.gpu_count(),
        });
    } else {
        gpus(then, now, &mut v);
    }
    for g in &p.groups {
        v.changes.extend(unavailable(g, then, now));
    }
    if p.fingerprint.topology_class != now.class_hash() {
        for x in &then.pairs {
            if let Some(y) = now.pair(x.from, x.to) {
                if x.from < x.to && (x.path, x.nvlinks) != (y.path, y.nvlinks) {
                    v.changes.push(Change::Path {
                        a: x.from,
                        b: x.to,
                        old: x.path.label(x.nvlinks),
                        new: y.path.label(y.nvlinks),
                    });
                }
            }
        }
        if !v.changes.iter().any(Change::is_gpu) {
            v.changes.push(Change::TopologyClass {
                old: p.fingerprint.topology_class.clone(),
                new: now.class_hash(),
            });
        }
    }
    v
}

/// The backends `g` chooses (and the engines' fallbacks) that the P2P of `now` rules out
/// between its GPUs and that of `then` did not, with the sizes they serve, as one change.
fn unavailable(g: &GroupProfile, then: &Topology, now: &Topology) -> Option<Change> {
    if g.gpus.iter().any(|&x| x >= now.gpu_count()) {
        return None;
    }
    let (was, is) = (P2pGaps::of(then, &g.gpus), P2pGaps::of(now, &g.gpus));
    let mut why = None;
    // Per backend, the runs of neighbouring buckets it serves: (first, last) bytes.
    let mut runs: Vec<(Backend, Vec<(u64, u64)>)> = Vec::new();
    for (i, b) in g.buckets.iter().enumerate() {
        let mut chosen = vec![b.choice];
        chosen.extend(b.fallback.filter(|&f| f != b.choice));
        for k in chosen {
            let Some(reason) = is.waiver(k).filter(|_| was.waiver(k).is_none()) else {
                continue;
            };
            why.get_or_insert(reason);
            let at = match runs.iter().position(|(r, _)| *r == k) {
                Some(at) => at,
                None => {
                    runs.push((k, Vec::new()));
                    runs.len() - 1
                }
            };
            let served_before = i > 0 && {
                let p = &g.buckets[i - 1];
                p.choice == k || p.fallback == Some(k)
            };
            match runs[at].1.last_mut() {
                Some(last) if served_before => last.1 = b.bytes,
                _ => runs[at].1.push((b.bytes, b.bytes)),
            }
        }
    }
    let fmt = crate::units::fmt_bytes;
    let chosen = runs
        .iter()
        .map(|(k, spans)| {
            let spans: Vec<String> = spans
                .iter()
                .map(|&(a, b)| match a == b {
                    true => fmt(a),
                    false => format!("{} to {}", fmt(a), fmt(b)),
                })
                .collect();
            format!("{k} at {}", spans.join(", "))
        })
        .collect();
    Some(Change::Unavailable {
        group: format!(
            "TP{} {} on GPUs {}",
            g.tp,
            g.mode.id(),
            crate::topology::fmt_gpus(&g.gpus)
        ),
        chosen,
        why: why?,
    })
}

/// The origin of a topology whose GPUs are virtual ranks on one real GPU.
const LOOPBACK: &str = "loopback";

/// A loopback topology's GPU (every one is the same real GPU) against the GPU of `now` it ran
/// on: the one at its bus id, else the first (CUDA's ordinal 0, which a loopback tune takes).
fn loopback(then: &Topology, now: &Topology, v: &mut Validity) {
    let Some(a) = then.gpus.first() else {
        return;
    };
    let on_bus = now.gpus.iter().find(
        |b| matches!((&a.bus_id, &b.bus_id), (Some(x), Some(y)) if x.eq_ignore_ascii_case(y)),
    );
    match on_bus.or(now.gpus.first()) {
        Some(b) => compare(a, b, v),
        None => v.changes.push(Change::GpuCount { old: 1, new: 0 }),
    }
}

/// Each GPU of `then` against the one of `now` at the same index.
fn gpus(then: &Topology, now: &Topology, v: &mut Validity) {
    let mut other_node = false;
    for (a, b) in then.gpus.iter().zip(&now.gpus) {
        other_node |= matches!((&a.uuid, &b.uuid), (Some(x), Some(y)) if x != y);
        compare(a, b, v);
    }
    if other_node {
        v.changes.push(Change::OtherNode);
    }
}

/// One GPU the profile was measured on against one of this machine: model and link.
fn compare(a: &Gpu, b: &Gpu, v: &mut Validity) {
    if a.name != b.name {
        v.changes.push(Change::GpuName {
            gpu: b.index,
            old: a.name.clone(),
            new: b.name.clone(),
        });
    }
    if link(&a.pcie) != link(&b.pcie) {
        v.changes.push(Change::GpuLink {
            gpu: b.index,
            old: link(&a.pcie),
            new: link(&b.pcie),
        });
    } else if b.pcie.narrowed() && !a.pcie.narrowed() {
        v.changes.push(Change::Narrowed {
            gpu: b.index,
            width: b.pcie.width.unwrap_or(0),
            max_width: b.pcie.max_width.unwrap_or(0),
        });
    } else if let (Some(gen), Some(max_gen)) = (slower_gen(&b.pcie), b.pcie.max_gen) {
        if slower_gen(&a.pcie).is_none() {
            v.changes.push(Change::SlowerGen {
                gpu: b.index,
                gen,
                max_gen,
            });
        }
    }
}

/// The generation a link trained at, where it is below its maximum.
fn slower_gen(l: &Link) -> Option<u8> {
    l.gen.filter(|&g| l.max_gen.is_some_and(|m| g < m))
}

/// Adds to `v` each variable of `now` (this process's, see
/// [`environment::current`](super::environment::current)) that differs from the environment
/// the profile was measured in, as a note each. A profile that predates the record leaves the
/// environment unchecked.
pub fn add_environment(
    v: &mut Validity,
    p: &Profile,
    now: &std::collections::BTreeMap<String, String>,
) {
    match &p.environment {
        Some(e) => v.changes.extend(
            super::environment::differences(&e.variables, now, &[])
                .into_iter()
                .map(Change::Environment),
        ),
        None => v.unchecked.push(Unchecked::Environment),
    }
}

#[cfg(test)]
mod tests;

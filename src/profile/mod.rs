//! Profile schema v1: what a tune found, in the form engines and plugins read.
//!
//! 1. [`Profile::load`] reads a file, checks the schema version and every limit, and refuses
//!    anything a consumer could misread.
//! 2. [`Profile::selector`] builds the [`Selector`] that answers "which backend for this many
//!    bytes" in O(log buckets) without allocating; a TP size or mode the profile lacks is
//!    [`Selection::Unknown`].
//! 3. [`Profile::write_atomic`] writes through a temporary file in the target directory,
//!    synced and renamed, so readers only ever see a whole old or a whole new profile.
//!
//! Field names are a contract (see profiles/schema/profile-v1.json); add fields, never rename.

pub mod environment;
pub mod kernels;
pub mod paths;
pub mod routes;
pub mod schema;
pub mod selector;
mod validate;
pub mod validity;
mod write;

pub use validate::ProfileError;

use std::collections::BTreeMap;
use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::allreduce::{Backend, Dtype, Islands, Mode};
use crate::error::Error;
use crate::topology::Topology;

pub use crate::results::{ContentionCurve, GroupPhases, ModelBand, ModelFamily, Timing};
pub use environment::Environment;
pub use kernels::{KernelImages, KernelMismatch, ProgramImage};
pub use selector::Selector;
pub use validate::{Limits, LIMITS};
pub use write::{check_writable, write_all_atomic, write_atomic};

pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Fingerprint {
    /// Same wiring → same hash (UUIDs, bus ids excluded).
    pub topology_class: String,
    /// This host: class + GPU UUIDs + driver, CUDA and NCCL versions.
    pub host: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Versions {
    pub driver: Option<String>,
    pub cuda: Option<String>,
    pub nccl: Option<String>,
}

/// One message size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Bucket {
    /// Message size in bytes. This bucket serves sizes above the previous bucket's, up to this.
    pub bytes: u64,
    /// The backend to use.
    pub choice: Backend,
    /// The NCCL variant to run where NCCL serves this size (`nccl` itself, or a pinned
    /// algorithm × protocol that beats it): what the tuner plugin and NCCL exports follow.
    /// Absent in older profiles, which then leave NCCL its own choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_choice: Option<Backend>,
    /// Where `choice` is a backend no engine has (an island schedule, which only artune's
    /// kernels run), what an engine without them runs instead: the same rule among NCCL and
    /// the flat kernels. Absent elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Backend>,
    #[schemars(extend("propertyNames" = {"$ref": "#/$defs/Backend"}))]
    pub results: BTreeMap<Backend, Timing>,
    /// Backends not measured at this size, and why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("propertyNames" = {"$ref": "#/$defs/Backend"}))]
    pub waived: BTreeMap<Backend, String>,
}

impl GroupProfile {
    /// The channel count for the NCCL pin of the bucket at `bucket_bytes`: the one measured
    /// for it, else the group's.
    pub fn channels_at(&self, bucket_bytes: u64) -> Option<u32> {
        self.pin_channels
            .get(&bucket_bytes)
            .copied()
            .or(self.nccl_channels)
    }
}

impl Bucket {
    /// What an engine without artune's own kernels runs here: the choice where engines have a
    /// path of its shape, else the bucket's `fallback` (the same rule among those they have).
    pub fn engine_choice(&self) -> Backend {
        self.fallback.unwrap_or(self.choice)
    }

    /// The timings the steering rule may choose from here: every result not waived.
    pub fn eligible(&self) -> BTreeMap<Backend, Timing> {
        self.results
            .iter()
            .filter(|(k, _)| !self.waived.contains_key(k))
            .map(|(k, t)| (*k, *t))
            .collect()
    }
}

/// Where the choice changes between neighbouring sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Crossover {
    /// First bucket size at which `to` is chosen.
    pub bytes: u64,
    pub from: Backend,
    pub to: Backend,
}

/// Device memory a backend costs each GPU.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Memory {
    pub bytes_per_gpu: u64,
    /// Read from the device rather than modelled.
    pub measured: bool,
    /// The largest message the buffers counted in `bytes_per_gpu` serve (custom backends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serves_up_to_bytes: Option<u64>,
    /// The largest bucket this profile routes to the backend; None if it never wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chosen_up_to_bytes: Option<u64>,
    /// What an engine following this profile pays per GPU: buffers sized to
    /// `chosen_up_to_bytes` (modelled), or NCCL's communicator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_bytes_per_gpu: Option<u64>,
}

/// One TP group in one launch mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GroupProfile {
    pub gpus: Vec<usize>,
    pub tp: usize,
    pub mode: Mode,
    pub dtype: Dtype,
    /// What sets this GPU subset apart, e.g. "one switch" or "2 switches, 1 root complex".
    #[serde(default)]
    pub placement: String,
    /// The islands the hierarchical backends ran in, and which way each phase moved data;
    /// absent where the group has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub islands: Option<Islands>,
    pub buckets: Vec<Bucket>,
    pub crossovers: Vec<Crossover>,
    #[schemars(extend("propertyNames" = {"$ref": "#/$defs/Backend"}))]
    pub memory: BTreeMap<Backend, Memory>,
    /// The form each custom backend the buckets choose was timed in, in this group's mode
    /// (graph: registered or staged; eager: staged), where the fabric tells; empty in
    /// simulated profiles and in profiles made before it was recorded (which timed graph mode
    /// staged).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("propertyNames" = {"$ref": "#/$defs/Backend"}))]
    pub forms: BTreeMap<Backend, crate::allreduce::Form>,
    /// NCCL channels the NCCL backends ran with at run time (NCCL's `comm->nChannels`: twice
    /// the channels its graph search finds, the count `NCCL_MIN_NCHANNELS`, the tuner's
    /// `nChannels` and the profiler's `nChannels` all mean), when the fabric knows it (a
    /// simulated model, or NCCL_MIN_NCHANNELS = NCCL_MAX_NCHANNELS on real GPUs); the tuner
    /// plugin reproduces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_channels: Option<u32>,
    /// Per bucket (its `bytes`), the run-time channel count measured fastest for its NCCL pin,
    /// which the tuner plugin sets there; a bucket without one (and every bucket of older profiles)
    /// keeps `nccl_channels`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pin_channels: BTreeMap<u64, u32>,
    /// Why the channel counts of its NCCL pins were not measured (the fabric could not force
    /// one): they then run NCCL's own count, and `why` says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels_unmeasured: Option<String>,
    /// Backends excluded for the whole group (no P2P, wrong results, timeouts), and why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("propertyNames" = {"$ref": "#/$defs/Backend"}))]
    pub waived: BTreeMap<Backend, String>,
    /// What the choices cost against the fastest backend measured at each size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regret: Option<Regret>,
    /// How far each backend's median moved while it was measured (a cell's revisit, seconds
    /// after its first samples, at the size where it moved most), as a fraction: the
    /// run-to-run variation this machine showed when tuned, which `check --measure` allows
    /// for before it calls a choice changed. Empty for profiles made before it was recorded.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("propertyNames" = {"$ref": "#/$defs/Backend"}))]
    pub drift: BTreeMap<Backend, f64>,
    /// Other processes that were on these GPUs while this group was measured (allowed with
    /// `--allow-busy`, before the tune or since): its times may include their work, and no
    /// drift is recorded for it, since that would be theirs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub beside: Vec<environment::BusyGpu>,
}

impl GroupProfile {
    /// The ranks its kernels saw: in islands where it has them.
    pub fn ranks(&self) -> crate::allreduce::Ranks {
        crate::allreduce::Ranks::of(self.tp, self.islands.as_ref())
    }

    /// `c` in words, as every report says it: a bucket serves the sizes above the one before
    /// it (FORMATS.md), so the new choice starts just above that one, not at its own bucket.
    pub fn crossover_words(&self, c: &Crossover) -> String {
        let fmt = crate::units::fmt_bytes;
        match self
            .buckets
            .iter()
            .map(|b| b.bytes)
            .filter(|&b| b < c.bytes)
            .max()
        {
            Some(prev) => format!("{} → {} above {}", c.from, c.to, fmt(prev)),
            None => format!("{} → {} at {}", c.from, c.to, fmt(c.bytes)),
        }
    }
}

/// The time the profile's choices give away against the per-size fastest measured backend:
/// the price of stable bands and of preferring no extra memory on a tie.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Regret {
    /// Summed over the group's buckets, as a fraction (0.01 = 1% more time).
    pub summed: f64,
    /// The worst single bucket, as a fraction.
    pub worst: f64,
    /// The bucket where the worst is.
    pub worst_bytes: u64,
}

/// How the tune was run, so a reader can reproduce it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Settings {
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub tp: Vec<usize>,
    pub modes: Vec<Mode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_budget_bytes: Option<u64>,
    /// Target half-width of the median's 95% CI, relative to the median.
    pub target_ci: f64,
    /// How the cells were sampled; profiles from before the reference mode are `fast`.
    #[serde(default)]
    pub sampling: Sampling,
    /// Wall-clock seconds the tune took.
    #[serde(default)]
    pub tuning_seconds: f64,
    /// Element type reduced (every group states it too; here so fleet compares like with like).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<Dtype>,
    /// Where the tuning time went, so a user can see what a faster tune would have to cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases: Option<Phases>,
}

/// How a tune samples: what `compare` needs to know to treat a profile as the reference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Sampling {
    /// The default: powers of two refined by bisection where the winner changes, and a cell
    /// clearly slower than the fastest at its size stops sampling (racing).
    #[default]
    Fast,
    /// The reference (`--exhaustive`): every cell sampled to its target, at every size
    /// refinement could reach, with no refinement rounds.
    Exhaustive,
}

impl Sampling {
    pub fn id(self) -> &'static str {
        match self {
            Sampling::Fast => "fast",
            Sampling::Exhaustive => "exhaustive",
        }
    }
}

/// Wall-clock seconds per phase of a tune.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Phases {
    /// Before opening the fabric: the check for other processes on the GPUs (NVML, and a
    /// second's utilization sample).
    #[serde(default)]
    pub checks_s: f64,
    /// Opening the fabric: workers, contexts, kernel compilation (0 for a simulated fabric).
    pub startup_s: f64,
    pub groups: Vec<GroupPhases>,
}

/// The machine a tune ran on, so `artune fleet` can name nodes (also for simulated tunes, whose
/// topology is a model with no host).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Node {
    /// gethostname() where the tune ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The scheduler's name for the node when the tune ran under one (`SLURMD_NODENAME`, or
    /// `NODE_NAME` as a Kubernetes pod spec usually sets it from `spec.nodeName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_node: Option<String>,
    /// The arguments `artune` ran with, after the program name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
}

impl Node {
    /// This machine: its host name and, under a scheduler, the scheduler's name for it.
    pub fn here() -> Node {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Node {
            hostname: crate::topology::nvml::hostname(),
            scheduler_node: env("SLURMD_NODENAME").or_else(|| env("NODE_NAME")),
            args: Vec::new(),
        }
    }

    /// The node's name, as `{host}` in a tune's `--out` and `artune fleet` give it: the
    /// scheduler's (a pod's host name is the pod's, not the node's), else the host name.
    pub fn name(&self) -> Option<&str> {
        self.scheduler_node.as_deref().or(self.hostname.as_deref())
    }
}

/// Where a fleet class profile came from: the consensus of which nodes, and who was left out.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Fleet {
    /// Nodes whose measurements the consensus is the median of.
    pub nodes: Vec<String>,
    /// Nodes of the class left out of the consensus, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<LeftOut>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LeftOut {
    pub node: String,
    pub reason: String,
}

/// A whole profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Profile {
    pub schema_version: u32,
    pub tool_version: String,
    /// RFC 3339 UTC time the tune finished.
    pub created: String,
    /// True when measured on the simulated fabric: never deploy such a profile as measured fact.
    pub simulated: bool,
    /// What measured it, e.g. "simulated pcie-8x-2switch".
    #[serde(default)]
    pub fabric: String,
    pub fingerprint: Fingerprint,
    pub versions: Versions,
    pub topology: Topology,
    pub groups: Vec<GroupProfile>,
    #[serde(default)]
    pub contention: Vec<ContentionCurve>,
    #[serde(default)]
    pub settings: Settings,
    /// Faults met during the tune (timeouts, wrong results, failed backends), for the operator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<String>,
    /// What a simulated fabric assumed because the topology did not state it (kernel-traffic
    /// defaults per switch vendor, collapse rates, the CPU vendor), one sentence each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assumed: Vec<String>,
    /// The machine the tune ran on; absent in profiles of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<Node>,
    /// Set on a class profile `artune fleet` wrote: the nodes it is the consensus of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<Fleet>,
    /// The NCCL and CUDA variables, NCCL library and busy GPUs the tune measured with; absent
    /// in profiles of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<Environment>,
    /// Faults the fabric recovered from on its own (a worker lost, killed or silent; its group
    /// set up again and the backend re-timed or left out), so a clean-looking profile says so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recovered: Vec<Recovered>,
    /// The compiled kernels the tune timed, per target: artune's allreduce inside an engine
    /// runs only these. Absent in simulated profiles and in profiles of older versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<KernelImages>,
}

/// One fault the fabric recovered from during the tune.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Recovered {
    /// GPUs (topology indices) of the group whose workers were replaced.
    pub group: Vec<usize>,
    /// The backend running when it happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    /// Whether that backend stayed and was measured again on the fresh workers (a first
    /// loss); false: left out after failing again there (and in profiles before this field).
    #[serde(default)]
    pub kept: bool,
    /// The message size being measured, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    pub cause: String,
}

/// Which group a question is about.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Query<'a> {
    pub tp: usize,
    pub mode: Mode,
    /// Specific GPUs, in any order (the ranks' order does not change a group's answer); None
    /// means the engine's default placement, ranks on GPUs 0..tp.
    pub gpus: Option<&'a [usize]>,
}

/// Whether `gpus` can place a group of `tp`: `tp` different GPUs. The one rule for `--gpus`
/// and the package's `gpus=`.
pub fn is_placement(tp: usize, gpus: &[usize]) -> bool {
    let mut sorted = gpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    gpus.len() == tp && sorted.len() == tp
}

impl Query<'_> {
    /// Whether a group on `gpus` is the one asked about: the same GPUs, as a set. Allocates
    /// nothing (the engines' lookup path).
    pub fn names(&self, gpus: &[usize]) -> bool {
        match self.gpus {
            None => false,
            Some(q) => {
                q.len() == gpus.len()
                    && q.iter().all(|g| gpus.contains(g))
                    && gpus.iter().all(|g| q.contains(g))
            }
        }
    }
}

/// Answer of [`Profile::select`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Selection {
    Chosen {
        backend: Backend,
        /// The NCCL variant to run where NCCL serves this size.
        nccl: Backend,
        /// What a caller without artune's kernels runs: `backend` where engines have it,
        /// else the rule's choice among those they have (`Bucket::fallback`).
        fallback: Backend,
        /// Median time measured at the bucket that serves this size.
        expected_us: f64,
        /// Bytes the bucket serves up to (its measured size).
        bucket_bytes: u64,
        /// Device memory per GPU the backend's buffers need (0 for NCCL's, which it owns).
        buffer_bytes: u64,
    },
    /// The profile has no answer; the caller keeps its own default.
    Unknown(UnknownReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownReason {
    NoGroup,
    AboveLargestBucket,
    BelowSmallestBucket,
}

/// At and below this size every backend's time is its fixed latency, so a group whose
/// smallest bucket is this small answers for smaller messages too (the default range starts
/// at 1 KiB); one whose smallest is larger answers nothing below it.
pub const LATENCY_FLOOR_BYTES: u64 = 4 << 10;

/// Whether a group whose smallest bucket is `smallest` bytes answers for `bytes`, a size at
/// or below it: the one rule for sizes under what was measured.
pub fn answers_below(smallest: u64, bytes: u64) -> bool {
    bytes >= smallest || smallest <= LATENCY_FLOOR_BYTES
}

impl std::fmt::Display for UnknownReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            UnknownReason::NoGroup => "the profile has no group of that TP size and mode",
            UnknownReason::AboveLargestBucket => {
                "the size is above the largest size the profile measured"
            }
            UnknownReason::BelowSmallestBucket => {
                "the size is below the smallest size the profile measured, which is above the latency floor of 4 KiB"
            }
        })
    }
}

impl Profile {
    /// Measured with every rank on one GPU (`tune --loopback`): real kernels, but no time in it
    /// is multi-GPU evidence, which every report of its numbers says.
    pub fn is_loopback(&self) -> bool {
        !self.simulated && self.topology.origin.kind == "loopback"
    }

    /// The profile's TP sizes and modes, each once, e.g. "TP2 graph, TP2 eager" (for messages).
    pub fn group_names(&self) -> String {
        let mut v: Vec<String> = Vec::new();
        for g in &self.groups {
            let s = format!("TP{} {}", g.tp, g.mode.id());
            if !v.contains(&s) {
                v.push(s);
            }
        }
        if v.is_empty() {
            "no groups".into()
        } else {
            v.join(", ")
        }
    }

    /// Why the profile answers nothing for TP`tp` in `mode`, and what would: the end of a
    /// sentence "… has no TP2 graph group", for every consumer that says it.
    pub fn no_group(&self, tp: usize, mode: crate::allreduce::Mode) -> String {
        use crate::allreduce::Mode;
        let other = match mode {
            Mode::Graph => Mode::Eager,
            Mode::Eager => Mode::Graph,
        };
        let gpus = self.topology.gpus.len();
        let hint = if tp > gpus {
            format!("the machine has {gpus} GPUs, so no TP{tp} group can be tuned on it")
        } else if self.groups.iter().any(|g| g.tp == tp && g.mode == other) {
            format!(
                "ask for {} mode, or tune TP{tp} in {} mode for an answer",
                other.id(),
                mode.id()
            )
        } else {
            "tune that TP size for an answer".into()
        };
        format!("(it has {}); {hint}", self.group_names())
    }

    /// Reads and validates a profile file.
    pub fn load(path: &Path) -> Result<Profile, Error> {
        if path.as_os_str().is_empty() {
            return Err(Error::bad_input(
                "the profile's path is empty; name the file that artune tune --out wrote",
            ));
        }
        // Bounded read: a device or pipe named as a profile cannot make us allocate without end.
        let text = crate::topology::file::read_text(path, LIMITS.file_bytes, "profile")?;
        Profile::parse(&text).map_err(|error| error.at(path))
    }

    /// Parses and validates profile JSON.
    pub fn parse(text: &str) -> Result<Profile, ProfileError> {
        validate::parse(text)
    }

    /// Serializes the profile (pretty JSON, trailing newline).
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("profile types always serialize");
        s.push('\n');
        s
    }

    /// Writes the profile atomically: a temporary file in the same directory, synced, renamed
    /// over `path`, then the directory synced. A crash at any point leaves the old file whole.
    pub fn write_atomic(&self, path: &Path) -> Result<(), Error> {
        write_atomic(path, self.to_json().as_bytes())
    }

    /// The group a query is about: exact GPUs if given, else ranks on GPUs 0..tp, else the
    /// first group of that TP size.
    pub fn group(&self, q: Query<'_>) -> Option<&GroupProfile> {
        let same = |g: &&GroupProfile| g.tp == q.tp && g.mode == q.mode;
        match q.gpus {
            Some(_) => self.groups.iter().filter(same).find(|g| q.names(&g.gpus)),
            None => self
                .groups
                .iter()
                .filter(same)
                .find(|g| g.gpus.iter().copied().eq(0..q.tp))
                .or_else(|| self.groups.iter().find(same)),
        }
    }

    /// The backend for one message. Builds a [`Selector`] each call: for many questions, build
    /// one with [`Profile::selector`] and ask it.
    pub fn select(&self, q: Query<'_>, bytes: u64) -> Selection {
        Selector::new(self).select(q, bytes)
    }

    /// The lookup every consumer answers through.
    pub fn selector(&self) -> Selector {
        Selector::new(self)
    }
}

/// Checks a profile the tuner just built against the same rules readers apply, so artune
/// never writes a file its consumers would refuse.
pub fn validate_built(p: &Profile) -> Result<(), Error> {
    validate::check(p)
        .map_err(|e| Error::Bug(format!("the tune produced an invalid profile ({e})")))
}

/// Current time as RFC 3339 UTC ("2026-11-29T08:49:54Z"), without a date crate.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    rfc3339(secs)
}

/// Formats Unix seconds as RFC 3339 UTC (civil-from-days, H. Hinnant's algorithm).
pub fn rfc3339(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
pub(crate) mod tests;

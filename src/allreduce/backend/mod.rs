//! The backends, one entry each in [`TABLE`]: what every consumer (measure, decide, memory, the
//! simulator, the CUDA kernels, report, exports, `why`, the NCCL plugin, the C ABI, Python,
//! the schema) knows about a backend is read from its entry. Consumers match on the entry's
//! [`Executor`], [`Schedule`] or [`Plane`], never on the backend itself, so a new backend of a
//! known executor and schedule is one new row; a new executor or schedule fails to compile
//! wherever a consumer must learn it (how it runs, its model). CONTRIBUTING.md, "Add a
//! backend", walks through it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod ll;

pub use self::ll::Ll;
use super::{NcclAlgo, NcclProto, Ranks};

/// An allreduce implementation. The serialized ids are a contract with profile readers; a
/// reader that does not know an id refuses the profile with a sentence naming it. Its
/// schema is made from [`TABLE`]: each id with its entry's summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    Nccl,
    NcclRingLl,
    NcclRingLl128,
    NcclRingSimple,
    NcclTreeLl,
    NcclTreeLl128,
    NcclTreeSimple,
    OneStagePull,
    OneStagePush,
    TwoStagePull,
    TwoStagePush,
    IslandTwoShot,
    IslandOneShot,
    TwoStageCopy,
    IslandTwoShotCopy,
}

/// What runs a backend's calls on the GPU: the question every consumer that launches, prices,
/// sizes or times a backend asks, by an exhaustive `match`, so a new executor makes the
/// compiler list each of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Executor {
    /// NCCL's kernels, through its communicator.
    Nccl,
    /// One SM kernel per call moves the data through peer mappings and sums it
    /// ([`Spec::kernel`]).
    SmKernel,
    /// The GPUs' copy engines move every phase's data between the IPC-mapped buffers
    /// (cuMemcpyDtoDAsync), an SM kernel sums what they landed, and stream memory operations
    /// on IPC-mapped flags order the ranks: no SM spins on a barrier.
    CopyEngine(CopySum),
}

/// The environment variable that, set to 0, keeps the CUDA fabric and the engines' op from
/// running [`Executor::CopyEngine`] backends.
pub const COPY_ENGINE_SWITCH: &str = "ARTUNE_COPY_ENGINE";

/// Whether copy-engine backends run on GPUs (tune, bench, the engines' op): unless
/// [`COPY_ENGINE_SWITCH`] is 0. Where they do not, the tune waives them saying so and engines
/// run each bucket's fallback at their sizes.
pub fn copy_engines_on() -> bool {
    std::env::var(COPY_ENGINE_SWITCH).map_or(true, |v| v != "0")
}

/// The SM kernel a copy-engine backend sums with: `<name>_<dtype>` in kernels/`<source>`,
/// reading `inputs` landed buffers and writing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopySum {
    pub source: &'static str,
    pub name: &'static str,
}

/// Who runs a backend, as engines and users group them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// NCCL, with its own choice or pinned to an algorithm × protocol.
    Nccl,
    /// A peer-to-peer kernel in which every GPU exchanges with every other (engines have
    /// kernels of these shapes).
    Peer,
    /// A peer-to-peer kernel that works inside the topology's islands first and crosses
    /// between them once (no engine has one; artune's kernels run it).
    Hierarchical,
}

/// Which GPUs a phase exchanges with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peers {
    /// Every other GPU of the group.
    All,
    /// The other GPUs of this GPU's island.
    Island,
    /// The GPU at this GPU's place in every other island.
    Counterparts,
}

/// How much of the message each transfer of a phase carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Message,
    /// 1/N of it, N the group's GPUs.
    Shard,
    /// 1/M of it, M the GPUs of an island.
    IslandShard,
}

/// One phase of a peer-to-peer schedule: every GPU moves `part` with each of `peers` at once,
/// then (`reduces`) sums what it holds, or only keeps it (an all-gather).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phase {
    pub peers: Peers,
    pub part: Part,
    pub reduces: bool,
}

/// The algorithm, as the phases a simulator prices and a kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// NCCL's own algorithm and protocol choice, or a pinned pair.
    Nccl(Option<(NcclAlgo, NcclProto)>),
    /// Peer-to-peer phases, in order.
    Phases(&'static [Phase]),
}

/// How data crosses between GPUs in a peer-to-peer schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    /// NCCL's transports (P2P, SHM, network), chosen by NCCL.
    Nccl,
    /// Every phase reads peers' memory (loads; non-posted on PCIe).
    Pull,
    /// Every phase writes into peers' memory (stores; posted on PCIe).
    Push,
    /// Each phase reads or writes as the group's contention probe says is faster for its
    /// peers (`super::islands::Directions`).
    PerPhase,
}

/// How big one of a GPU's IPC-shared buffers is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extent {
    Message,
    Shard,
    IslandShard,
}

/// How many receive slots of an extent a GPU keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    One,
    /// One per other GPU of the group.
    Peers,
    /// One per other GPU of the island.
    IslandPeers,
    /// One per other island.
    OtherIslands,
}

/// The buffers one GPU shares with its peers for a peer-to-peer backend, besides its signal
/// flags: what the memory model counts and the CUDA fabric allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffers {
    /// Peers read this GPU's input from a shared copy of it.
    pub input: bool,
    /// Scratch: receive slots or reduced partials, each (count, extent).
    pub scratch: &'static [(Count, Extent)],
    /// Peers write into this GPU's output.
    pub output: bool,
}

/// The kernel that runs a peer-to-peer backend: `<name>_<dtype>` in kernels/`<source>`, and
/// `<name>_ll_<dtype>` for small messages where there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernel {
    pub source: &'static str,
    pub name: &'static str,
    /// How its LL kernel lays out its lines, where it has one.
    pub ll: Option<Ll>,
}

impl Kernel {
    /// The LL layout that runs a message of `bytes` per rank; None where the bandwidth kernel
    /// does (no LL form, or a message too large for its lines).
    pub fn ll_at(self, bytes: u64) -> Option<Ll> {
        self.ll.filter(|l| bytes <= l.max_bytes())
    }
}

/// An engine's own path of this backend's shape: what the profile's band for this backend
/// stands for inside that engine.
pub type EnginePath = (&'static str, &'static str);

/// One backend, described once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub backend: Backend,
    /// The id written in profiles.
    pub id: &'static str,
    pub family: Family,
    pub executor: Executor,
    pub schedule: Schedule,
    pub plane: Plane,
    /// One sentence for `why`, the docs and `--help`.
    pub summary: &'static str,
    /// None for NCCL, whose connections memory.rs models apart.
    pub buffers: Option<Buffers>,
    /// The one SM kernel of [`Executor::SmKernel`]; None for the other executors.
    pub kernel: Option<Kernel>,
    /// Engine paths of the same shape (engine, path); empty where no engine has one.
    pub engine_paths: &'static [EnginePath],
}

const ONE_STAGE: &[Phase] = &[Phase {
    peers: Peers::All,
    part: Part::Message,
    reduces: true,
}];
const TWO_STAGE: &[Phase] = &[
    Phase {
        peers: Peers::All,
        part: Part::Shard,
        reduces: true,
    },
    Phase {
        peers: Peers::All,
        part: Part::Shard,
        reduces: false,
    },
];
/// Reduce-scatter inside each island, the island's partial shards summed across islands
/// between counterparts, all-gather inside each island: S crosses between two islands of 8
/// GPUs where a ring sends 1.75·S through every link.
const ISLAND_TWO_SHOT: &[Phase] = &[
    Phase {
        peers: Peers::Island,
        part: Part::IslandShard,
        reduces: true,
    },
    Phase {
        peers: Peers::Counterparts,
        part: Part::IslandShard,
        reduces: true,
    },
    Phase {
        peers: Peers::Island,
        part: Part::IslandShard,
        reduces: false,
    },
];
/// The island's sum in one stage, then that sum exchanged with the counterparts once: two
/// latencies, for small messages.
const ISLAND_ONE_SHOT: &[Phase] = &[
    Phase {
        peers: Peers::Island,
        part: Part::Message,
        reduces: true,
    },
    Phase {
        peers: Peers::Counterparts,
        part: Part::Message,
        reduces: true,
    },
];

const fn nccl(
    backend: Backend,
    id: &'static str,
    pin: Option<(NcclAlgo, NcclProto)>,
    summary: &'static str,
) -> Spec {
    Spec {
        backend,
        id,
        family: Family::Nccl,
        executor: Executor::Nccl,
        schedule: Schedule::Nccl(pin),
        plane: Plane::Nccl,
        summary,
        buffers: None,
        kernel: None,
        engine_paths: &[("every engine", "NCCL all-reduce")],
    }
}

use Count::*;
use Extent as E;
use NcclAlgo::*;
use NcclProto::*;

/// Every backend, in [`Backend`]'s order (checked by a test).
pub const TABLE: [Spec; Backend::COUNT] = [
    nccl(
        Backend::Nccl,
        "nccl",
        None,
        "NCCL with its own algorithm and protocol choice",
    ),
    nccl(
        Backend::NcclRingLl,
        "nccl_ring_ll",
        Some((Ring, LL)),
        "NCCL pinned to Ring/LL",
    ),
    nccl(
        Backend::NcclRingLl128,
        "nccl_ring_ll128",
        Some((Ring, LL128)),
        "NCCL pinned to Ring/LL128",
    ),
    nccl(
        Backend::NcclRingSimple,
        "nccl_ring_simple",
        Some((Ring, Simple)),
        "NCCL pinned to Ring/Simple",
    ),
    nccl(
        Backend::NcclTreeLl,
        "nccl_tree_ll",
        Some((Tree, LL)),
        "NCCL pinned to Tree/LL",
    ),
    nccl(
        Backend::NcclTreeLl128,
        "nccl_tree_ll128",
        Some((Tree, LL128)),
        "NCCL pinned to Tree/LL128",
    ),
    nccl(
        Backend::NcclTreeSimple,
        "nccl_tree_simple",
        Some((Tree, Simple)),
        "NCCL pinned to Tree/Simple",
    ),
    Spec {
        backend: Backend::OneStagePull,
        id: "one_stage_pull",
        family: Family::Peer,
        executor: Executor::SmKernel,
        schedule: Schedule::Phases(ONE_STAGE),
        plane: Plane::Pull,
        summary: "every GPU reads all peers' inputs through peer memory and reduces locally",
        buffers: Some(Buffers {
            input: true,
            scratch: &[],
            output: false,
        }),
        kernel: Some(Kernel {
            source: "allreduce.cu",
            name: "one_stage_pull",
            ll: None,
        }),
        engine_paths: &[
            ("vLLM", "custom allreduce, 1stage"),
            ("SGLang", "custom allreduce v2 1shot_pull"),
            ("SGLang", "custom allreduce v1"),
        ],
    },
    Spec {
        backend: Backend::OneStagePush,
        id: "one_stage_push",
        family: Family::Peer,
        executor: Executor::SmKernel,
        schedule: Schedule::Phases(ONE_STAGE),
        plane: Plane::Push,
        summary: "every GPU writes its input into every peer's receive slot, then each reduces",
        buffers: Some(Buffers {
            input: false,
            scratch: &[(Peers, E::Message)],
            output: false,
        }),
        kernel: Some(Kernel {
            source: "allreduce.cu",
            name: "one_stage_push",
            ll: Some(Ll::Message),
        }),
        engine_paths: &[
            ("SGLang", "custom allreduce v2 1shot_push"),
            ("TensorRT-LLM", "ONESHOT"),
            ("FlashInfer", "one-shot all-reduce"),
        ],
    },
    Spec {
        backend: Backend::TwoStagePull,
        id: "two_stage_pull",
        family: Family::Peer,
        executor: Executor::SmKernel,
        schedule: Schedule::Phases(TWO_STAGE),
        plane: Plane::Pull,
        summary: "reduce-scatter by reading peers' shards, then all-gather by reading their sums",
        buffers: Some(Buffers {
            input: true,
            scratch: &[(One, E::Shard)],
            output: false,
        }),
        kernel: Some(Kernel {
            source: "allreduce.cu",
            name: "two_stage_pull",
            ll: Some(Ll::PulledShard),
        }),
        engine_paths: &[
            ("vLLM", "custom allreduce, 2stage"),
            ("SGLang", "custom allreduce v2 2shot_pull"),
        ],
    },
    Spec {
        backend: Backend::TwoStagePush,
        id: "two_stage_push",
        family: Family::Peer,
        executor: Executor::SmKernel,
        schedule: Schedule::Phases(TWO_STAGE),
        plane: Plane::Push,
        summary:
            "reduce-scatter by writing shards to their owners, then all-gather by writing sums",
        buffers: Some(Buffers {
            input: false,
            scratch: &[(Peers, E::Shard)],
            output: true,
        }),
        kernel: Some(Kernel {
            source: "allreduce.cu",
            name: "two_stage_push",
            ll: Some(Ll::Shards),
        }),
        engine_paths: &[
            ("TensorRT-LLM", "TWOSHOT"),
            ("FlashInfer", "two-shot all-reduce"),
        ],
    },
    Spec {
        backend: Backend::IslandTwoShot,
        id: "island_two_shot",
        family: Family::Hierarchical,
        executor: Executor::SmKernel,
        schedule: Schedule::Phases(ISLAND_TWO_SHOT),
        plane: Plane::PerPhase,
        summary:
            "reduce-scatter inside each island, shards summed across islands, all-gather inside",
        // Sized for either direction in every phase, so the direction can follow the probe:
        // the shared input (pulled), slots for island peers' shards and other islands'
        // partials (pushed), the island's partial (pulled across), and the output (pushed).
        buffers: Some(Buffers {
            input: true,
            scratch: &[
                (IslandPeers, E::IslandShard),
                (One, E::IslandShard),
                (OtherIslands, E::IslandShard),
            ],
            output: true,
        }),
        kernel: Some(Kernel {
            source: "island.cu",
            name: "island_two_shot",
            ll: Some(Ll::IslandShards),
        }),
        engine_paths: &[],
    },
    Spec {
        backend: Backend::IslandOneShot,
        id: "island_one_shot",
        family: Family::Hierarchical,
        executor: Executor::SmKernel,
        schedule: Schedule::Phases(ISLAND_ONE_SHOT),
        plane: Plane::PerPhase,
        summary: "each island sums in one stage, then islands exchange their sums once",
        // As island_two_shot: the shared input, slots for island peers' inputs and other
        // islands' sums, and the island's sum.
        buffers: Some(Buffers {
            input: true,
            scratch: &[
                (IslandPeers, E::Message),
                (One, E::Message),
                (OtherIslands, E::Message),
            ],
            output: false,
        }),
        kernel: Some(Kernel {
            source: "island.cu",
            name: "island_one_shot",
            ll: Some(Ll::MessageAndSum),
        }),
        engine_paths: &[],
    },
    Spec {
        backend: Backend::TwoStageCopy,
        id: "two_stage_copy",
        family: Family::Peer,
        executor: Executor::CopyEngine(SUM),
        schedule: Schedule::Phases(TWO_STAGE),
        plane: Plane::Pull,
        summary: "copy engines gather peers' shards into local slots, an SM kernel sums them, \
                  then copy engines gather the sums",
        // The shared input peers' copy engines read shards from, a slot per peer for the
        // shards copied in, and the reduced shard peers copy out.
        buffers: Some(Buffers {
            input: true,
            scratch: &[(Peers, E::Shard), (One, E::Shard)],
            output: false,
        }),
        kernel: None,
        engine_paths: &[],
    },
    Spec {
        backend: Backend::IslandTwoShotCopy,
        id: "island_two_shot_copy",
        family: Family::Hierarchical,
        executor: Executor::CopyEngine(SUM),
        schedule: Schedule::Phases(ISLAND_TWO_SHOT),
        plane: Plane::Pull,
        summary: "island_two_shot with copy engines moving every phase, the crossing between \
                  islands included, and an SM kernel summing",
        // The shared input, slots for island peers' shards, the island's partial, slots for
        // other islands' partials, and the summed shard island peers gather.
        buffers: Some(Buffers {
            input: true,
            scratch: &[
                (IslandPeers, E::IslandShard),
                (One, E::IslandShard),
                (OtherIslands, E::IslandShard),
                (One, E::IslandShard),
            ],
            output: false,
        }),
        kernel: None,
        engine_paths: &[],
    },
];

/// The sum kernel of the copy-engine backends.
const SUM: CopySum = CopySum {
    source: "ce_sum.cu",
    name: "ce_sum",
};

impl Backend {
    /// How many backends there are.
    pub const COUNT: usize = 15;

    pub const ALL: [Backend; Backend::COUNT] = {
        let mut out = [Backend::Nccl; Backend::COUNT];
        let mut i = 0;
        while i < TABLE.len() {
            out[i] = TABLE[i].backend;
            i += 1;
        }
        out
    };

    /// This backend's entry in [`TABLE`].
    pub fn spec(self) -> &'static Spec {
        &TABLE[self as usize]
    }

    /// The id written in profiles, e.g. "one_stage_pull".
    pub fn id(self) -> &'static str {
        self.spec().id
    }

    pub fn from_id(id: &str) -> Option<Backend> {
        TABLE.iter().find(|s| s.id == id).map(|s| s.backend)
    }

    pub fn family(self) -> Family {
        self.spec().family
    }

    /// What runs its calls ([`Executor`]).
    pub fn executor(self) -> Executor {
        self.spec().executor
    }

    /// Whether artune's own data plane runs it (P2P and IPC buffers: an SM kernel or copy
    /// engines), as opposed to NCCL: the one "not NCCL" question, for consumers that ask
    /// what an engine needs rather than how it runs.
    pub fn is_custom(self) -> bool {
        match self.executor() {
            Executor::Nccl => false,
            Executor::SmKernel | Executor::CopyEngine(_) => true,
        }
    }

    pub fn is_nccl(self) -> bool {
        self.family() == Family::Nccl
    }

    /// Whether graph mode runs this backend's registered form (kernels/common.cuh, RegSlot):
    /// an SM kernel that stages the caller's data through a shared input (peers read it) or
    /// output (peers write or read it), so with every rank's own tensors mapped by its peers
    /// after capture nothing is staged. An engine then registers its captured graphs
    /// (artune.allreduce's `register_graph_buffers`).
    pub fn has_registered_form(self) -> bool {
        let s = self.spec();
        s.kernel.is_some() && s.buffers.is_some_and(|b| b.input || b.output)
    }

    /// Whether it works inside islands first: needs a group the topology splits into islands.
    pub fn is_hierarchical(self) -> bool {
        self.family() == Family::Hierarchical
    }

    /// The algorithm and protocol NCCL is pinned to; None for NCCL's own choice and custom kernels.
    pub fn nccl_pin(self) -> Option<(NcclAlgo, NcclProto)> {
        match self.spec().schedule {
            Schedule::Nccl(pin) => pin,
            Schedule::Phases(_) => None,
        }
    }

    /// The phases of a peer-to-peer schedule; empty for NCCL.
    pub fn phases(self) -> &'static [Phase] {
        match self.spec().schedule {
            Schedule::Nccl(_) => &[],
            Schedule::Phases(p) => p,
        }
    }

    /// The LL layout its kernel runs a message of `bytes` per rank in, if any
    /// ([`Kernel::ll_at`]).
    pub fn ll_at(self, bytes: u64) -> Option<Ll> {
        self.spec().kernel?.ll_at(bytes)
    }

    /// Lines its LL kernel keeps in each rank's signal allocation over `ranks` ([`Ll::lines`]);
    /// 0 where it has no LL form.
    pub fn ll_lines(self, ranks: Ranks) -> u64 {
        self.spec()
            .kernel
            .and_then(|k| k.ll)
            .map_or(0, |l| l.lines(ranks))
    }

    /// Whether an engine has a path of this shape without artune's kernels.
    pub fn engines_have(self) -> bool {
        !self.spec().engine_paths.is_empty()
    }

    /// Whether NCCL's tuner plugin can make NCCL run it (NCCL's own choice or a pin).
    pub fn nccl_expressible(self) -> bool {
        matches!(self.spec().schedule, Schedule::Nccl(_))
    }
}

impl JsonSchema for Backend {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Backend".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let one_of: Vec<serde_json::Value> = TABLE
            .iter()
            .map(|s| {
                let family = match (s.family, s.executor) {
                    (Family::Nccl, _) => "NCCL",
                    (Family::Peer, Executor::CopyEngine(_)) => "peer-to-peer, by copy engines",
                    (Family::Peer, _) => "peer-to-peer kernel",
                    (Family::Hierarchical, Executor::CopyEngine(_)) => {
                        "island schedule by copy engines (only artune runs it)"
                    }
                    (Family::Hierarchical, _) => "island schedule (only artune's kernels run it)",
                };
                serde_json::json!({
                    "type": "string",
                    "const": s.id,
                    "description": format!("{family}: {}.", s.summary),
                })
            })
            .collect();
        schemars::json_schema!({
            "description": "An allreduce implementation, as profiles name it (src/allreduce/backend/).",
            "oneOf": one_of,
        })
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.id())
    }
}

#[cfg(test)]
mod tests;

//! What an engine needs to follow a profile, in the engine's own format.
//!
//! Each exporter is a pure function from a profile and [`Options`] to an [`Export`] (one or more
//! files of text). Every file names the profile it came from (path, creation time, fingerprint,
//! and SIMULATED in capitals when it was not measured on real GPUs) and says plainly what the
//! engine's knobs cannot express. The per-engine files cite the engine sources they follow.
//! Every placement of a TP size is exported (a TP2 group on GPUs 0,1 and one on 3,4): per
//! placement where the engine can be told the GPUs (vLLM and SGLang through
//! CUDA_VISIBLE_DEVICES, vLLM's P2P cache per GPU set), and where its format holds one answer
//! per TP size (SGLang's table, TensorRT-LLM's cache, NCCL's tuner), the file says which
//! placement it holds and lists the others'.
//!
//! Each engine module also says what that engine will run for one message ([`EngineRun`]),
//! with artune's export applied, so `artune why` and the exports tell the same story.

pub mod engines;
mod env;
pub mod follow;
mod nccl;
pub mod sample;
mod sglang;
mod trtllm;
pub mod vllm;

pub use sglang::{
    plugin_plan as sglang_plugin_plan, plugin_setup as sglang_plugin_setup,
    PluginPlan as SglangPlan, Setup as SglangSetup,
};
pub mod why;

use crate::allreduce::{Backend, Dtype, Mode};
use crate::error::Error;
use crate::profile::{Bucket, GroupProfile, Profile, Query, Timing};
use crate::shell::quote as shell_quote;
use crate::topology::{ComputeCapability, PathClass, Status, Topology};

/// The engine to export for (also the `--engine` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    Trtllm,
    Vllm,
    Sglang,
    Nccl,
    Env,
}

impl Engine {
    /// The export can hold more than one file (then `--out` names a directory).
    pub fn writes_several(self) -> bool {
        matches!(self, Engine::Trtllm | Engine::Vllm)
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub engine: Engine,
    /// Only this TP size; None exports every TP size the profile has.
    pub tp: Option<usize>,
    /// Model hidden size (bytes per token = hidden × dtype size), for engines keyed by tokens.
    pub hidden: Option<u64>,
    pub dtype: Dtype,
    /// How the profile is named in the export, usually its absolute path.
    pub source: String,
    /// Ranks of the deployment (TP x PP), for engines that keep state per rank (TensorRT-LLM's
    /// cache sections); None: the largest TP size exported.
    pub world_size: Option<usize>,
    /// Write engine state (vLLM's P2P cache) from a simulated profile: for tests only.
    pub allow_simulated: bool,
    /// What `NCCL_TUNER_PLUGIN` is to name: the plugin library's absolute path where artune
    /// found it installed ([`crate::plugin::library::tuner_plugin_value`]), else its bare name.
    pub plugin: String,
}

/// Why an engine plugin gives NCCL a size of group `g`: the profile does, in the placement
/// the plugin follows for every group of that TP size (engines do not tell it the GPUs), which
/// is named where it is not `g`'s own.
pub(super) fn nccl_here(p: &Profile, g: &GroupProfile) -> String {
    let q = crate::profile::Query {
        tp: g.tp,
        mode: g.mode,
        gpus: None,
    };
    match p.group(q) {
        Some(f) if f.gpus != g.gpus => format!(
            "the plugin follows GPUs {}'s answers for every TP{} group, and they give NCCL here",
            crate::topology::fmt_gpus(&f.gpus),
            g.tp
        ),
        _ => "the profile gives NCCL here".into(),
    }
}

/// Deployments larger than this are not a tensor-parallel group on one box.
const MAX_WORLD_SIZE: usize = 4096;

/// What one engine will run for one allreduce, with artune's export applied.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EngineRun {
    pub engine: &'static str,
    /// The engine's own name for what runs ("custom allreduce, 1stage", "NCCL", "ONESHOT").
    pub runs: String,
    /// The profile's backend that this is, where artune measured it; None where it did not
    /// (symmetric memory, multicast) or cannot tell.
    pub backend: Option<Backend>,
    /// Why the engine runs this, in its own terms.
    pub because: String,
}

/// What an engine's plugin runs for `bytes` on `g` where artune's own kernels may take it:
/// the op's kernel where the plugins' default routes the size to it (a backend the engine has
/// no kernel of), else `run` (the engine's paths under the plugin), with a note where the
/// opt-in (`ARTUNE_KERNELS=artune`) would route it.
fn with_own_kernels(
    p: &Profile,
    g: &GroupProfile,
    bytes: u64,
    engine: &str,
    mut run: EngineRun,
) -> EngineRun {
    use crate::profile::routes::KernelSetting;
    let own = |k| follow::own_kernel(p, g.tp, g.mode, bytes, k);
    if let Some(k) = own(KernelSetting::Islands) {
        return EngineRun {
            engine: run.engine,
            runs: format!("artune's kernels, {k}"),
            backend: Some(k),
            because: format!(
                "the profile chooses {k}, which {engine} has no kernel of, so the plugin's op (artune's own kernels, built on the TP group at start-up) takes a {} message of this size before {engine}'s own order. Where the op cannot be built: {}, because {}",
                g.dtype.id(),
                run.runs,
                run.because
            ),
        };
    }
    if let Some(k) = own(KernelSetting::Artune) {
        run.because.push_str(&format!(
            "; with ARTUNE_KERNELS=artune the plugin's op runs artune's {k} here instead"
        ));
    }
    run
}

/// One file of an export.
#[derive(Debug, Clone, PartialEq)]
pub struct File {
    /// File name to use when writing into a directory.
    pub name: String,
    pub contents: String,
}

/// The files of an export; the first is the one to read first.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    pub files: Vec<File>,
}

/// The engine-specific options `o` gives that its engine's export does not read, each in one
/// sentence naming the export that does: one command line serves every engine, so they are
/// accepted, but not without a word.
pub fn unread_options(o: &Options) -> Vec<String> {
    let given = [
        (
            "--hidden",
            o.hidden.is_some(),
            Engine::Trtllm,
            "maps bytes to tokens",
        ),
        (
            "--world-size",
            o.world_size.is_some(),
            Engine::Trtllm,
            "sizes the per-rank cache",
        ),
        (
            "--allow-simulated",
            o.allow_simulated,
            Engine::Vllm,
            "writes the P2P cache",
        ),
    ];
    let id = |e: Engine| clap::ValueEnum::to_possible_value(&e).map(|v| v.get_name().to_string());
    given
        .into_iter()
        .filter(|&(_, on, reader, _)| on && reader != o.engine)
        .map(|(flag, _, reader, what)| {
            format!(
                "{flag} {what} for --engine {} only; the {} export does not read it",
                id(reader).unwrap_or_default(),
                id(o.engine).unwrap_or_default()
            )
        })
        .collect()
}

/// Builds the export.
pub fn export(p: &Profile, o: &Options) -> Result<Export, Error> {
    let tps = tp_sizes(p, o.tp)?;
    if let Some(w) = o.world_size {
        check_world_size(w, &tps)?;
    }
    match o.engine {
        Engine::Trtllm => trtllm::export(p, o, &tps),
        Engine::Vllm => vllm::export(p, o, &tps),
        Engine::Sglang => sglang::export(p, o, &tps),
        Engine::Nccl => nccl::export(p, o, &tps),
        Engine::Env => env::export(p, o, &tps),
    }
}

/// TP sizes to export, ascending: the requested one (which the profile must have) or all.
fn tp_sizes(p: &Profile, tp: Option<usize>) -> Result<Vec<usize>, Error> {
    let mut all: Vec<usize> = p.groups.iter().map(|g| g.tp).collect();
    all.sort_unstable();
    all.dedup();
    match tp {
        None if all.is_empty() => Err(Error::bad_input(
            "the profile has no groups; there is nothing to export",
        )),
        None => Ok(all),
        Some(t) if all.contains(&t) => Ok(vec![t]),
        Some(t) => Err(Error::bad_input(format!(
            "the profile has no TP{t} group (it has TP {}); pass one of those to --tp",
            all.iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// `--world-size` must hold whole TP groups of every size exported.
fn check_world_size(w: usize, tps: &[usize]) -> Result<(), Error> {
    let largest = tps.iter().copied().max().unwrap_or(1);
    // Where one TP size is exported, --tp may have named it: only the world size can change.
    let or_tp = |what: &str| match tps.len() {
        1 => String::new(),
        _ => format!(", or pass --tp to export {what}"),
    };
    if w < largest {
        return Err(Error::bad_input(format!(
            "--world-size {w} is smaller than TP{largest}; give at least {largest} (TP x PP ranks){}",
            or_tp("a smaller TP size")
        )));
    }
    if w > MAX_WORLD_SIZE {
        return Err(Error::bad_input(format!(
            "--world-size {w} is more ranks than artune writes state for (at most {MAX_WORLD_SIZE})"
        )));
    }
    if let Some(t) = tps.iter().find(|&&t| !w.is_multiple_of(t)) {
        return Err(Error::bad_input(format!(
            "--world-size {w} is not a multiple of TP{t}, so it cannot hold whole TP{t} groups; give a multiple of {t} (TP x PP ranks){}",
            or_tp("one TP size")
        )));
    }
    Ok(())
}

/// The group an engine with no notion of launch mode should follow: graph (decode, where small
/// allreduces dominate) if the profile has it, else eager.
fn preferred_group(p: &Profile, tp: usize) -> Option<&GroupProfile> {
    [Mode::Graph, Mode::Eager].into_iter().find_map(|mode| {
        p.group(Query {
            tp,
            mode,
            gpus: None,
        })
    })
}

/// Every placement of TP `tp` in the mode [`preferred_group`] follows, that group first (the
/// one an engine that cannot tell placements apart is given), then the others by GPUs.
fn placements(p: &Profile, tp: usize) -> Vec<&GroupProfile> {
    let Some(first) = preferred_group(p, tp) else {
        return Vec::new();
    };
    let mut v = vec![first];
    v.extend(
        p.groups
            .iter()
            .filter(|g| g.tp == tp && g.mode == first.mode && g.gpus != first.gpus),
    );
    v
}

/// The group of `g`'s GPUs in `mode`, if the profile has one.
fn same_gpus<'p>(p: &'p Profile, g: &GroupProfile, mode: Mode) -> Option<&'p GroupProfile> {
    p.group(Query {
        tp: g.tp,
        mode,
        gpus: Some(&g.gpus),
    })
}

/// GPU ids as CUDA_VISIBLE_DEVICES and file names take them: "3,4".
fn gpu_list(gpus: &[usize]) -> String {
    gpus.iter()
        .map(|g| g.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The GPUs are the engine's default placement, ranks on GPUs 0..tp.
fn default_placement(gpus: &[usize]) -> bool {
    gpus.iter().copied().eq(0..gpus.len())
}

/// Provenance as comment lines with `prefix` ("#" for shell, CSV, YAML, Python).
fn provenance(p: &Profile, o: &Options, prefix: &str) -> String {
    let mut s = String::new();
    if p.simulated {
        s.push_str(&format!(
            "{prefix} !!! SIMULATED PROFILE: measured on a simulated fabric ({}), not on real GPUs.\n\
             {prefix} !!! Its numbers are not facts about any machine; do not deploy this file.\n",
            p.fabric
        ));
    }
    s.push_str(&format!(
        "{prefix} Generated by artune {} from profile {}\n",
        env!("CARGO_PKG_VERSION"),
        o.source
    ));
    s.push_str(&format!(
        "{prefix} profile created {} by artune {}; fabric: {}; simulated: {}\n",
        p.created, p.tool_version, p.fabric, p.simulated
    ));
    s.push_str(&format!(
        "{prefix} fingerprint: topology class {}, host {}\n",
        p.fingerprint.topology_class, p.fingerprint.host
    ));
    s.push_str(&format!(
        "{prefix} Check it still holds before use: artune check {}\n",
        o.source
    ));
    s
}

/// Provenance as a JSON object, for formats that cannot hold comments.
fn provenance_json(p: &Profile, o: &Options) -> serde_json::Value {
    let mut v = serde_json::json!({
        "generated_by": format!("artune {}", env!("CARGO_PKG_VERSION")),
        "profile": o.source,
        "created": p.created,
        "fabric": p.fabric,
        "simulated": p.simulated,
        "fingerprint": { "topology_class": p.fingerprint.topology_class, "host": p.fingerprint.host },
    });
    if p.simulated {
        v["WARNING"] =
            "SIMULATED PROFILE: measured on a simulated fabric, not on real GPUs; do not deploy"
                .into();
    }
    v
}

/// The NCCL variant artune's tuner plugin makes NCCL run at this bucket: the steering rule's
/// answer recorded in the profile, or NCCL's own choice where an older profile recorded none.
pub fn plugin_nccl(b: &Bucket) -> Backend {
    b.nccl_choice.unwrap_or(Backend::Nccl)
}

/// What NCCL costs at this bucket as an engine runs it without artune's plugin: NCCL's own
/// choice, or where that was not measured, the rule's NCCL variant as its stand-in.
pub(crate) fn nccl_time(b: &Bucket) -> Option<Timing> {
    b.results
        .get(&Backend::Nccl)
        .copied()
        .or_else(|| crate::decide::nccl_choice(&b.results).and_then(|n| b.results.get(&n).copied()))
}

/// What NCCL costs at this bucket with artune's plugin loaded.
pub(crate) fn plugin_time(b: &Bucket) -> Option<Timing> {
    b.results
        .get(&plugin_nccl(b))
        .copied()
        .or_else(|| nccl_time(b))
}

/// The median of `backend` at this bucket.
fn median(b: &Bucket, backend: Backend) -> Option<f64> {
    b.results.get(&backend).map(|t| t.median_us)
}

/// The bucket that serves `bytes` (the first at or above it), as the selector finds it.
fn bucket_for(g: &GroupProfile, bytes: u64) -> Option<&Bucket> {
    let smallest = g.buckets.first()?.bytes;
    if !crate::profile::answers_below(smallest, bytes) {
        return None;
    }
    g.buckets
        .get(g.buckets.partition_point(|b| b.bytes < bytes))
}

/// Every ordered pair of `gpus` is joined by NVLink.
pub(crate) fn fully_nvlinked(t: &Topology, gpus: &[usize]) -> bool {
    gpus.iter().all(|&a| {
        gpus.iter()
            .all(|&b| a == b || t.pair(a, b).is_some_and(|p| p.path == PathClass::NV))
    })
}

/// No pair of `gpus` is known to lack P2P.
pub(crate) fn p2p_ok(t: &Topology, gpus: &[usize]) -> bool {
    gpus.iter().all(|&a| {
        gpus.iter().all(|&b| {
            a == b
                || t.pair(a, b)
                    .is_some_and(|p| p.p2p.read != Status::No && p.p2p.write != Status::No)
        })
    })
}

/// NVLink multicast (NVLS) is there: a fully NVLinked group behind an NVSwitch.
pub(crate) fn multicast(t: &Topology, gpus: &[usize]) -> bool {
    t.nvswitch.is_some() && fully_nvlinked(t, gpus)
}

/// Compute capability of the group's first GPU, as engines key their tables.
pub(crate) fn capability(t: &Topology, gpus: &[usize]) -> Option<ComputeCapability> {
    t.gpus.get(*gpus.first()?)?.compute_capability
}

/// A kernel against NCCL over the sizes where an engine would run it, each size counting
/// equally (a geometric mean), so a few large messages do not outweigh many small ones.
#[derive(Debug, Clone, Copy, Default)]
struct Versus {
    /// Sizes compared, and those where the kernel was faster.
    sizes: usize,
    faster: usize,
    /// Geometric mean of kernel time over NCCL time.
    ratio: f64,
}

impl Versus {
    fn of(pairs: impl Iterator<Item = (f64, f64)>) -> Versus {
        let (mut sizes, mut faster, mut logs) = (0, 0, 0.0);
        for (kernel, nccl) in pairs.filter(|(k, n)| *k > 0.0 && *n > 0.0) {
            sizes += 1;
            faster += usize::from(kernel < nccl);
            logs += (kernel / nccl).ln();
        }
        Versus {
            sizes,
            faster,
            ratio: if sizes == 0 {
                1.0
            } else {
                (logs / sizes as f64).exp()
            },
        }
    }

    /// Keep the kernel unless it is slower on (geometric) average.
    fn keep(&self) -> bool {
        self.ratio <= 1.0
    }

    fn describe(&self) -> String {
        format!(
            "faster than NCCL at {} of {} sizes, {:+.0}% on geometric mean",
            self.faster,
            self.sizes,
            (self.ratio - 1.0) * 100.0
        )
    }
}

/// "+12%" / "-3%": `t` against `reference`.
fn pct(t: f64, reference: f64) -> String {
    if reference > 0.0 {
        format!("{:+.0}%", (t / reference - 1.0) * 100.0)
    } else {
        "n/a".into()
    }
}

#[cfg(test)]
mod tests;

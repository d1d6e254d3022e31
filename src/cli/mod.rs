//! Command line: argument types and dispatch. Each subcommand's work lives in its own file.

mod bench;
mod check;
mod compare;
mod consumers;
mod doctor;
mod fleet;
mod gate;
mod nccl_audit;
mod output;
mod progress;
mod topo;
mod tune;
mod values;
mod worker;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::allreduce::{Dtype, Mode};
use crate::error::Error;
use output::out;
use values::{gpu_index, hidden_size, ranks, seconds, seed, tp_size, world_size};

/// `--wait`'s default: how long a measuring command waits for another artune's GPUs.
const LOCK_WAIT_S: u64 = crate::topology::lock::WAIT.as_secs();
#[derive(Parser, Debug)]
#[command(
    name = "artune",
    version = VERSION,
    about = "Topology-aware allreduce autotuner",
    after_help = "Start with: artune tune --sim pcie-8x-2switch --out profile.json, then artune show profile.json"
)]
pub struct Cli {
    /// More log output (-v info, -vv debug); also RUST_LOG.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show the GPU topology: path matrix, islands, P2P status, link speeds, warnings.
    #[command(after_help = "Example: artune topo --sim pcie-8x-2switch")]
    Topo(TopoArgs),
    /// Measure the backends and write a profile.
    #[command(
        after_help = "Example: artune tune --sim pcie-8x-2switch --out profile.json --plot plots"
    )]
    Tune(TuneArgs),
    /// Print a profile's summary.
    #[command(after_help = "Example: artune show profile.json")]
    Show(ShowArgs),
    /// Print the backend a profile chooses for one message, and the GPUs it answered for.
    #[command(
        after_help = "Example: artune select profile.json --tp 2 --bytes 3M --gpus 3,4\n\n\
Exit 0 with the backend; exit 6 (JSON: \"backend\": null) where the profile has no answer \
and the engine should keep its default."
    )]
    Select(MessageArgs),
    /// Write what an engine needs to follow a profile.
    #[command(after_help = "Example: artune export profile.json --engine vllm --tp 2")]
    Export(ExportArgs),
    /// Explain one answer: every backend's time, the rule, the cost of alternatives, the engines.
    #[command(after_help = "Example: artune why profile.json --tp 2 --bytes 3M --gpus 3,4")]
    Why(MessageArgs),
    /// Check that a profile still holds for this machine (exit 3 when stale).
    #[command(after_help = "Example: artune check profile.json --sim pcie-8x-2switch")]
    Check(CheckArgs),
    /// Allreduce cost of one engine step under several policies.
    #[command(
        after_help = "Example: artune predict profile.json --tp 2 --workload 122x7168xbf16@1..16

Exit 6 where no step can be priced (every one holds a size the profile cannot answer for)."
    )]
    Predict(PredictArgs),
    /// Benchmarks that need a GPU (kernels against the loopback floor of copy bandwidth).
    #[command(after_help = "Example: artune bench kernels --loopback 8 --sizes 4K:1M")]
    Bench(BenchArgs),
    /// Time profile A's choices by profile B's measurements (e.g. simulated vs measured).
    #[command(after_help = "Example: artune compare fast.json exhaustive.json")]
    Compare(compare::CompareArgs),
    /// Print the profile JSON Schema.
    #[command(after_help = "Example: artune schema > profile.schema.json")]
    Schema,
    /// Check the platform settings that make P2P slow or broken (ACS, IOMMU, BAR1, links, ...).
    #[command(after_help = "Example: artune doctor")]
    Doctor(doctor::DoctorArgs),
    /// Compare the profiles of many nodes: classes, outliers, a class profile each.
    #[command(after_help = "Example: artune fleet profiles/ --out classes/

Exit codes, the first that applies (docs/CLI.md):
  9  the report printed, but the class profiles could not be written (the error says why)
  7  a node is an outlier of its class
  3  a class holds profiles tuned with different driver, CUDA or NCCL versions
  5  files were skipped, or nodes left out that tuned other groups than their class
  0  none of these
  2  bad input (arguments, an unreadable DIR, an --out that is a file): no report")]
    Fleet(fleet::FleetArgs),
    /// One GPU's worker process, started by artune itself.
    #[command(name = "__worker", hide = true)]
    Worker(worker::WorkerArgs),
    /// One rank of `check --nccl-audit`'s NCCL sweep, started by artune itself.
    #[command(name = "__nccl-rank", hide = true)]
    NcclRank(nccl_audit::RankArgs),
}

/// Where the machine comes from: a preset, a file, or (neither) the real GPUs.
#[derive(Args, Debug, Clone, Default)]
pub struct Source {
    /// Simulate a built-in machine (`artune topo --list-presets` lists them).
    #[arg(long, value_name = "PRESET", conflicts_with = "topology")]
    pub sim: Option<String>,
    /// Simulate the machine described by a topology JSON file.
    #[arg(long, value_name = "FILE")]
    pub topology: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct TopoArgs {
    #[command(flatten)]
    pub source: Source,
    /// Print JSON (the topology file format) instead of text.
    #[arg(long)]
    pub json: bool,
    /// List the built-in presets and exit (with --json, as [{"name", "description"}]).
    #[arg(long, conflicts_with_all = ["sim", "topology"])]
    pub list_presets: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// Launched inside a CUDA graph (what decode steps use).
    Graph,
    /// Launched one by one from the host (what prefill uses).
    Eager,
    /// Both, one group each.
    Both,
}

impl ModeArg {
    pub fn modes(self) -> Vec<Mode> {
        match self {
            ModeArg::Graph => vec![Mode::Graph],
            ModeArg::Eager => vec![Mode::Eager],
            ModeArg::Both => vec![Mode::Graph, Mode::Eager],
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    Bf16,
    Fp16,
    Fp32,
}

impl From<DtypeArg> for Dtype {
    fn from(d: DtypeArg) -> Dtype {
        match d {
            DtypeArg::Bf16 => Dtype::Bf16,
            DtypeArg::Fp16 => Dtype::Fp16,
            DtypeArg::Fp32 => Dtype::Fp32,
        }
    }
}

#[derive(Args, Debug)]
pub struct TuneArgs {
    #[command(flatten)]
    pub source: Source,
    /// TP sizes to tune, comma separated (default: powers of two from 2 to the GPU count).
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub tp: Option<Vec<String>>,
    /// Message sizes LOW:HIGH, powers of two between them (refined where the winner changes).
    #[arg(long, default_value = "1K:256M", allow_hyphen_values = true)]
    pub sizes: String,
    /// Launch mode to tune: graph, eager or both.
    #[arg(long, value_enum, default_value = "both")]
    pub mode: ModeArg,
    /// Element type reduced (the sizes are bytes either way).
    #[arg(long, value_enum, default_value = "bf16")]
    pub dtype: DtypeArg,
    /// Per-GPU memory custom backends may use, e.g. 256MiB; a kernel whose buffers would
    /// need more at a size is excluded there (`show` lists what was). Must be above 0.
    #[arg(long, value_name = "BYTES", allow_hyphen_values = true)]
    pub mem_budget: Option<String>,
    /// Seed for data and (simulated) noise.
    #[arg(long, default_value_t = 1, allow_hyphen_values = true, value_parser = seed)]
    pub seed: u64,
    /// Where to write the profile.
    #[arg(long, short, default_value = "artune-profile.json")]
    pub out: PathBuf,
    /// Write SVG plots into this directory.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Replace the output even where the file there is not one artune wrote (refused without).
    #[arg(long)]
    pub force: bool,
    /// One GPU as K virtual ranks (custom kernels on one device; NCCL with K ranks sharing it
    /// from NCCL 2.30, else one rank).
    #[arg(long, value_name = "K", allow_hyphen_values = true, value_parser = ranks)]
    pub loopback: Option<usize>,
    /// Island sizes for the island schedules, e.g. 4,4, in place of the islands the topology
    /// gives, for the groups of as many GPUs as they add up to (ranks in order): virtual islands
    /// with --loopback, or an experiment. Equal sizes of 2 or more GPUs.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "SIZES",
        allow_hyphen_values = true
    )]
    pub islands: Option<Vec<String>>,
    /// Skip the contention probes.
    #[arg(long)]
    pub no_contention: bool,
    /// The reference tune: every backend sampled to the 2% target at every size refinement
    /// could reach (7 between powers of two), no racing. Slow; `compare` judges a fast tune
    /// against it.
    #[arg(long)]
    pub exhaustive: bool,
    /// Sample each backend until the 95% interval of its median is within ±PCT% of it
    /// (0.1 to 20; default 2). Tighter costs time, looser risks choices on noise.
    #[arg(long, value_name = "PCT", allow_hyphen_values = true)]
    pub target_ci: Option<String>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Measure even when another process is using the GPUs (recorded in the profile).
    #[arg(long)]
    pub allow_busy: bool,
    /// Wait up to SECONDS for another artune measuring the same GPUs (0: refuse at once).
    #[arg(long, value_name = "SECONDS", default_value_t = LOCK_WAIT_S, allow_hyphen_values = true, value_parser = seconds)]
    pub wait: u64,
    /// Testing only, hidden from --help: read the GPUs' occupancy from this JSON file instead
    /// of NVML (src/topology/occupancy.rs, `Reading`, or a list of them: one per look, the
    /// first before measuring); applies to simulated machines too.
    #[arg(long, hide = true, value_name = "FILE")]
    pub sim_occupancy: Option<PathBuf>,
    /// Testing only, hidden from --help: inject faults into the simulated machine (needs
    /// --sim or --topology), e.g. `wrong=one_stage_pull,hang=nccl_tree_ll,spikes=0.2:20,
    /// lose=3:100,delay=20`. The items are described in src/fabric/sim/faults.rs.
    #[arg(long, hide = true, value_name = "SPEC")]
    pub sim_faults: Option<String>,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// The profile to summarise (written by `artune tune`).
    pub profile: PathBuf,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// One message asked of a profile (`select`, `why`).
#[derive(Args, Debug)]
pub struct MessageArgs {
    /// The profile to ask (written by `artune tune`).
    pub profile: PathBuf,
    /// Tensor-parallel size: the GPUs in the allreduce.
    #[arg(long, allow_hyphen_values = true, value_parser = tp_size)]
    pub tp: usize,
    /// Message size (4096, 4K, 1MiB).
    #[arg(long, allow_hyphen_values = true)]
    pub bytes: String,
    /// The group's GPUs, comma separated (e.g. 3,4), where the profile has several placements
    /// of the TP size (default: GPUs 0..TP, else the first placement).
    #[arg(long, value_delimiter = ',', value_name = "IDS", allow_hyphen_values = true, value_parser = gpu_index)]
    pub gpus: Option<Vec<usize>>,
    /// Launch mode asked about.
    #[arg(long, value_enum, default_value = "graph")]
    pub mode: SelectMode,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum SelectMode {
    /// Launched inside a CUDA graph.
    Graph,
    /// Launched one by one from the host.
    Eager,
}

impl From<SelectMode> for Mode {
    fn from(m: SelectMode) -> Mode {
        match m {
            SelectMode::Graph => Mode::Graph,
            SelectMode::Eager => Mode::Eager,
        }
    }
}

pub use crate::export::Engine;

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The profile to export (written by `artune tune`).
    pub profile: PathBuf,
    /// The engine to write for.
    #[arg(long, value_enum)]
    pub engine: Engine,
    /// Only this TP size (default: every TP size of the profile).
    #[arg(long, allow_hyphen_values = true, value_parser = tp_size)]
    pub tp: Option<usize>,
    /// Model hidden size, to map bytes to tokens (TensorRT-LLM).
    #[arg(long, allow_hyphen_values = true, value_parser = hidden_size)]
    pub hidden: Option<u64>,
    /// Element type, to map bytes to tokens (TensorRT-LLM).
    #[arg(long, value_enum, default_value = "bf16")]
    pub dtype: DtypeArg,
    /// Write here instead of standard output (a directory for multi-file exports).
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Replace the output even where the file there is not one artune wrote (refused without;
    /// vLLM's own P2P access cache, which vLLM writes again whenever it is missing, is replaced
    /// by the vLLM export either way).
    #[arg(long)]
    pub force: bool,
    /// Ranks of the deployment (TP x PP), for TensorRT-LLM's per-rank cache sections
    /// (default: the largest TP size exported).
    #[arg(long, allow_hyphen_values = true, value_parser = world_size)]
    pub world_size: Option<usize>,
    /// Write engine state (vLLM's P2P cache) from a simulated profile: for tests only.
    #[arg(long)]
    pub allow_simulated: bool,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The profile to check (written by `artune tune`).
    pub profile: PathBuf,
    /// Check against this topology file instead of the real machine.
    #[arg(long)]
    pub topology: Option<PathBuf>,
    /// Check against a built-in simulated machine instead of the real one.
    #[arg(long, value_name = "PRESET", conflicts_with = "topology")]
    pub sim: Option<String>,
    /// Re-time what decides the profile (both sides of each crossover, the middle of each
    /// band) and say whether its choices still hold, whatever the fingerprints say.
    #[arg(long)]
    pub measure: bool,
    /// With --measure on one GPU: K virtual ranks.
    #[arg(long, value_name = "K", requires = "measure", allow_hyphen_values = true, value_parser = ranks)]
    pub loopback: Option<usize>,
    /// Testing only, hidden from --help: faults for a simulated machine, as `tune --sim-faults`.
    #[arg(long, hide = true, value_name = "SPEC", requires = "measure")]
    pub sim_faults: Option<String>,
    /// With --measure: re-time even when another process is using the GPUs.
    #[arg(long, requires = "measure")]
    pub allow_busy: bool,
    /// With --measure: wait up to SECONDS for another artune measuring the same GPUs (0:
    /// refuse at once).
    #[arg(long, value_name = "SECONDS", default_value_t = LOCK_WAIT_S, requires = "measure", allow_hyphen_values = true, value_parser = seconds)]
    pub wait: u64,
    /// Testing only, hidden from --help: the GPUs' occupancy as `tune --sim-occupancy`.
    #[arg(long, hide = true, value_name = "FILE", requires = "measure")]
    pub sim_occupancy: Option<PathBuf>,
    /// Print the verdict as JSON (the exit code is the same).
    #[arg(long)]
    pub json: bool,
    /// Run a short allreduce sweep through NCCL with libartune.so as its tuner and profiler,
    /// and say whether NCCL ran what the profile pins (exit 3 when it does not).
    #[arg(long, conflicts_with_all = ["measure", "json", "topology", "sim"])]
    pub nccl_audit: bool,
    /// With --nccl-audit: only this TP size (default: each of the profile's).
    #[arg(long, value_name = "K", requires = "nccl_audit", allow_hyphen_values = true, value_parser = tp_size)]
    pub tp: Option<usize>,
}

#[derive(Args, Debug)]
pub struct PredictArgs {
    /// The profile whose measurements price the workload.
    pub profile: PathBuf,
    /// Allreduces of one engine step: a SPEC like `122x7168xbf16@1..16` (122 allreduces of
    /// 7168 x 2 x T bytes for T = 1..16, or @1,4,16 for those T; terms joined by `+`, fixed
    /// sizes like `2x4K`), or a JSON file listing {"count", "bytes"} or {"count", "hidden",
    /// "dtype", "tokens"} items.
    #[arg(long, allow_hyphen_values = true)]
    pub workload: String,
    /// TP size (default: the profile's only one).
    #[arg(long, allow_hyphen_values = true, value_parser = tp_size)]
    pub tp: Option<usize>,
    /// The group's GPUs, comma separated, where the TP size has several placements
    /// (default: GPUs 0..TP, else the first placement).
    #[arg(long, value_delimiter = ',', value_name = "IDS", allow_hyphen_values = true, value_parser = gpu_index)]
    pub gpus: Option<Vec<usize>>,
    /// Launch mode of the engine step.
    #[arg(long, value_enum, default_value = "graph")]
    pub mode: SelectMode,
    /// Print the prediction as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchWhat,
}

/// The benchmarks there are.
#[derive(Subcommand, Debug)]
pub enum BenchWhat {
    /// Custom kernels' bandwidth against a device copy, and their 4 KiB latency (GPU only).
    #[command(after_help = "Example: artune bench kernels --loopback 8 --sizes 4K:1M")]
    Kernels(BenchKernelsArgs),
}

#[derive(Args, Debug)]
pub struct BenchKernelsArgs {
    /// Virtual ranks on the one GPU.
    #[arg(long, default_value_t = 8, allow_hyphen_values = true, value_parser = ranks)]
    pub loopback: usize,
    /// Only these backends (repeat the flag; default: every custom kernel and nccl).
    #[arg(long = "backend", value_name = "ID")]
    pub backends: Vec<String>,
    /// Virtual islands for the island schedules, e.g. 4,4 or 2,2,2,2 (default: two halves).
    #[arg(long, value_delimiter = ',', value_name = "SIZES")]
    pub islands: Option<Vec<String>>,
    /// Only the standard sizes (4K, 16K, ..., 64M per rank) inside this range.
    #[arg(long, default_value = "4K:64M", value_name = "LOW:HIGH")]
    pub sizes: String,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write the results (JSON) to this file.
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Replace the output even where the file there is not one artune wrote (refused without).
    #[arg(long)]
    pub force: bool,
}

/// `--version`: the crate's version and the commit it was built from (build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("ARTUNE_COMMIT"),
    ")"
);

/// Parses arguments, runs the command, prints any error as one line, returns the exit code.
pub fn main() -> i32 {
    // A panic is a bug: say so in one line, no backtrace, exit 70. A profile is only ever
    // written whole (by rename), so none is left half-written.
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("error: internal error ({what}{at}); this is a bug in artune, please report it");
    }));
    std::panic::catch_unwind(main_inner).unwrap_or(crate::error::EXIT_BUG)
}

fn main_inner() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                crate::error::EXIT_BAD_INPUT
            } else {
                0
            };
            let _ = e.print();
            return code;
        }
    };
    init_logging(cli.verbose);
    // With -v, where a command's fixed cost starts: loading the program counts too.
    match process_age_s() {
        Some(age) => tracing::info!("artune started {age:.2} s after its process"),
        None => tracing::info!("artune started"),
    }
    // Without a GPU, commands that tune nothing say what works for them instead.
    let no_gpu = match &cli.command {
        Command::Check(a) if a.measure && !a.nccl_audit => Some(crate::fabric::NO_GPU_CHECK),
        Command::Bench(_) => Some(crate::fabric::NO_GPU_BENCH),
        _ => None,
    };
    match run(cli.command) {
        Ok(code) => code,
        Err(Error::StdoutClosed) => 0,
        Err(e) => {
            eprintln!(
                "error: {}",
                crate::fabric::no_gpu_advice(e.to_string(), no_gpu)
            );
            e.exit_code()
        }
    }
}

/// Seconds since this process started (Linux: its start in clock ticks since boot, against the
/// uptime); None where /proc does not say.
fn process_age_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let ticks: f64 = rest.split(' ').nth(19)?.parse().ok()?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (hz > 0.0).then(|| (uptime - ticks / hz).max(0.0))
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour only on a terminal (and never under NO_COLOR): a log piped to a file or `head`
    // stays plain text.
    use std::io::IsTerminal;
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .try_init();
}

fn run(cmd: Command) -> Result<i32, Error> {
    match cmd {
        Command::Topo(a) => topo::run(a),
        Command::Tune(a) => tune::run(a),
        Command::Show(a) => tune::show(a),
        Command::Select(a) => consumers::select(a),
        Command::Export(a) => consumers::export(a),
        Command::Why(a) => consumers::why(a),
        Command::Check(a) if a.nccl_audit => nccl_audit::run(a),
        Command::Check(a) => check::run(a),
        Command::Predict(a) => consumers::predict(a),
        Command::Bench(a) => bench::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Doctor(a) => doctor::run(a),
        Command::Fleet(a) => fleet::run(a),
        Command::Worker(a) => Ok(worker::run(a)),
        Command::NcclRank(a) => Ok(nccl_audit::rank(a)),
        Command::Schema => {
            out!("{}", crate::profile::schema::generate());
            Ok(0)
        }
    }
}

/// The injected faults a testing-only `--sim-faults SPEC` asks for, checked before anything
/// runs; they only apply to a simulated machine.
pub fn sim_faults(
    spec: Option<&str>,
    source: &Source,
) -> Result<crate::fabric::sim::Faults, Error> {
    let Some(spec) = spec else {
        return Ok(crate::fabric::sim::Faults::default());
    };
    if source.sim.is_none() && source.topology.is_none() {
        return Err(Error::bad_input(
            "--sim-faults only applies to a simulated machine; add --sim PRESET or --topology FILE, or drop --sim-faults",
        ));
    }
    crate::fabric::sim::Faults::parse(spec)
        .map_err(|e| Error::bad_input(format!("--sim-faults: {e}")))
}

/// Opens the fabric a command measures on: simulated for --sim/--topology (with injected
/// `faults`), else the GPUs (`loopback`: K virtual ranks on one).
/// On real GPUs, starts compiling the kernels in the background while the command checks the
/// GPUs and starts its workers ([`crate::fabric::cuda::prefetch`]).
pub fn compile_ahead(source: &Source, dtypes: &[crate::allreduce::Dtype]) {
    if source.sim.is_none() && source.topology.is_none() {
        crate::fabric::cuda::prefetch::start(dtypes);
    }
}

/// On real GPUs the workers load the kernels of `dtypes` only (those the command measures).
pub fn open_fabric(
    source: &Source,
    loopback: Option<usize>,
    seed: u64,
    faults: crate::fabric::sim::Faults,
    dtypes: &[crate::allreduce::Dtype],
) -> Result<Box<dyn crate::fabric::Fabric>, Error> {
    let simulated = source.sim.is_some() || source.topology.is_some();
    if simulated && loopback.is_some() {
        return Err(Error::bad_input(
            "--loopback runs custom kernels on a real GPU; drop it to simulate, or drop --sim/--topology to use the GPU",
        ));
    }
    if simulated {
        let t = load_topology(source)?;
        crate::fabric::sim::check_topology(&t).map_err(Error::bad_input)?;
        faults
            .check(t.gpu_count())
            .map_err(|e| Error::bad_input(format!("--sim-faults: {e}")))?;
        let f = crate::fabric::sim::SimFabric::new(t, seed).with_faults(faults);
        return Ok(Box::new(f));
    }
    Ok(Box::new(crate::fabric::cuda::CudaFabric::open_for(
        loopback, dtypes,
    )?))
}

/// Loads the machine a command is about: a preset, a file, or the real GPUs through NVML.
pub fn load_topology(source: &Source) -> Result<crate::topology::Topology, Error> {
    match (&source.sim, &source.topology) {
        (Some(name), _) => crate::topology::presets::get(name),
        (None, Some(path)) => crate::topology::file::load(path),
        (None, None) => {
            let mut t = crate::topology::discover(crate::fabric::cuda::nccl_version())?;
            // NVML lists every GPU; CUDA_VISIBLE_DEVICES may hide some, which are not tuned.
            t.notes
                .extend(crate::fabric::cuda::topo::hidden_gpu_notes(&t));
            Ok(t)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every visible argument of every visible subcommand says what it is for, and every
    /// subcommand shows an example: `--help` is where a newcomer reads first.
    #[test]
    fn every_argument_has_help_and_every_subcommand_an_example() {
        let cli = super::Cli::command();
        let mut missing = Vec::new();
        for sub in cli.get_subcommands().filter(|s| !s.is_hide_set()) {
            if sub.get_after_help().is_none() {
                missing.push(format!("{}: no example", sub.get_name()));
            }
            for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{} {id}: no help line", sub.get_name()));
                }
            }
        }
        assert!(missing.is_empty(), "{missing:#?}");
    }

    /// `artune help A B` shows the help of every command, nested ones (`bench kernels`)
    /// included: it once failed for `bench kernels`, a positional argument then.
    #[test]
    fn help_names_every_command_at_every_depth() {
        fn paths(c: &clap::Command, at: Vec<String>, out: &mut Vec<Vec<String>>) {
            for sub in c.get_subcommands().filter(|s| !s.is_hide_set()) {
                let mut p = at.clone();
                p.push(sub.get_name().to_string());
                out.push(p.clone());
                paths(sub, p, out);
            }
        }
        let mut all = Vec::new();
        paths(&super::Cli::command(), Vec::new(), &mut all);
        assert!(all.iter().any(|p| p == &["bench", "kernels"]), "{all:?}");
        for p in all.iter().filter(|p| p.last().is_some_and(|l| l != "help")) {
            let args = ["artune", "help"]
                .into_iter()
                .chain(p.iter().map(String::as_str));
            let e = <super::Cli as clap::Parser>::try_parse_from(args).unwrap_err();
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp,
                "help {p:?}: {e}"
            );
        }
    }
}

//! `artune check PROFILE --nccl-audit`: does NCCL run what the profile pins? A short allreduce
//! sweep through NCCL, in one process per rank started with libartune.so as NCCL's tuner and
//! profiler, then the verdict of [`crate::plugin::audit::verdict`] on what every rank's
//! profiler saw: 0 with the agreement count, or 3 with one sentence saying why NCCL does not
//! follow the profile. Ranks go on GPUs 0..K where the machine has K; where it has fewer they
//! share GPU 0, which NCCL allows from 2.30 with `NCCL_MULTI_RANK_GPU_ENABLE=1`.
//!
//! `artune __nccl-rank` is one rank ([`crate::fabric::cuda::nccl_sweep`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::output::outln;
use super::CheckArgs;
use crate::allreduce::Mode;
use crate::error::Error;
use crate::fabric::cuda::nccl;
use crate::fabric::cuda::nccl_ranks::{self, RankPath};
use crate::fabric::cuda::nccl_sweep::{self, Sweep};
use crate::plugin::audit::{self, Summary, Verdict};
use crate::plugin::{self, Context};
use crate::profile::Profile;

/// Timed calls per size in each rank.
const ITERS: usize = 5;
/// A rank that has not finished by then is killed: the sweep is a few seconds.
const RANK_LIMIT: Duration = Duration::from_secs(180);

#[derive(Args, Debug)]
pub struct RankArgs {
    /// One NCCL unique id per communicator made in turn.
    #[arg(long, value_delimiter = ',')]
    pub id: Vec<String>,
    #[arg(long)]
    pub rank: usize,
    #[arg(long)]
    pub nranks: usize,
    #[arg(long)]
    pub ordinal: usize,
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<u64>,
    /// Calls per sample.
    #[arg(long)]
    pub iters: usize,
    /// Samples per size.
    #[arg(long, default_value_t = 1)]
    pub samples: usize,
    /// Each sample replays a CUDA graph of its calls.
    #[arg(long)]
    pub graph: bool,
    #[arg(long)]
    pub max_ctas: Option<i32>,
    /// Per communicator in turn, NCCL's run-time channels forced on it (0: NCCL's own).
    #[arg(long, value_delimiter = ',')]
    pub channels: Vec<i32>,
    /// NCCL variants (backend ids) each communicator runs in turn, switched per call through
    /// the tuner `NCCL_TUNER_PLUGIN` names.
    #[arg(long, value_delimiter = ',', value_parser = nccl_variant)]
    pub variants: Vec<crate::allreduce::Backend>,
    /// Where to write `CHANNELS BYTES US...` (one time per sample) per communicator and size:
    /// NCCL logs to standard output (NCCL_DEBUG).
    #[arg(long)]
    pub times: PathBuf,
}

/// `artune __nccl-rank`: runs the sweep, writes `CHANNELS BYTES US...` per communicator and
/// size; exits 4 with the reason, or [`nccl_ranks::EXIT_WRONG_SUM`] where NCCL's sum was
/// wrong.
pub fn rank(a: RankArgs) -> i32 {
    let s = Sweep {
        ids: a.id,
        rank: a.rank,
        nranks: a.nranks,
        ordinal: a.ordinal,
        sizes: a.sizes,
        iters: a.iters,
        samples: a.samples,
        graph: a.graph,
        max_ctas: a.max_ctas,
        channels: match a.channels.is_empty() {
            true => vec![None],
            false => a.channels.iter().map(|&c| (c > 0).then_some(c)).collect(),
        },
        variants: a.variants,
        summaries: std::env::var_os(audit::ENV_DIR).map(PathBuf::from),
        times: Some(a.times.clone()),
    };
    match nccl_sweep::run(&s) {
        Ok(times) => match nccl_sweep::write_times(&a.times, &times) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("rank {}: {e}", s.rank);
                crate::error::EXIT_HARDWARE
            }
        },
        Err(e) => {
            eprintln!("rank {}: {e}", s.rank);
            match e {
                nccl_sweep::SweepError::WrongSum(_) => nccl_ranks::EXIT_WRONG_SUM,
                nccl_sweep::SweepError::Failed(_) => crate::error::EXIT_HARDWARE,
            }
        }
    }
}

/// An NCCL variant by its backend id.
fn nccl_variant(id: &str) -> Result<crate::allreduce::Backend, String> {
    crate::allreduce::Backend::from_id(id)
        .filter(|b| b.is_nccl())
        .ok_or_else(|| format!("{id} is no NCCL variant"))
}

/// What one TP size's sweep runs: every size of the profile's group (even, for bf16), and
/// those of them the profile pins.
pub fn plan(p: &Profile, tp: usize, mode: Mode) -> Result<(Vec<u64>, Vec<u64>), Error> {
    let c = Context::from_profile(p, tp, 1, mode, None).map_err(Error::bad_input)?;
    let g = p
        .selector()
        .group(crate::profile::Query {
            tp,
            mode,
            gpus: None,
        })
        .ok_or_else(|| Error::bad_input(format!("the profile has no TP{tp} group")))?
        .clone();
    let sizes: Vec<u64> = g
        .sizes()
        .iter()
        .map(|&s| s & !1)
        .filter(|&s| s > 0)
        .collect();
    let pinned = sizes
        .iter()
        .copied()
        .filter(|&s| matches!(c.pin(s), Ok(Some(_))))
        .collect();
    Ok((sizes, pinned))
}

/// Reads every summary the ranks' profilers wrote into `dir`.
pub fn summaries(dir: &Path) -> Result<Vec<Summary>, Error> {
    let mut out = Vec::new();
    let rd = std::fs::read_dir(dir).map_err(|e| Error::Read {
        path: dir.into(),
        reason: e.to_string(),
    })?;
    let mut files: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read(&f).map_err(|e| Error::Read {
            path: f.clone(),
            reason: e.to_string(),
        })?;
        out.push(serde_json::from_slice(&text).map_err(|e| Error::Parse {
            path: f.clone(),
            what: "NCCL audit summary",
            reason: e.to_string(),
        })?);
    }
    Ok(out)
}

/// `artune check PROFILE --nccl-audit [--tp K]`.
pub fn run(a: CheckArgs) -> Result<i32, Error> {
    let p = Profile::load(&a.profile)?;
    let profile = a.profile.canonicalize().map_err(|e| Error::Read {
        path: a.profile.clone(),
        reason: e.to_string(),
    })?;
    let mode = plugin::mode_from_env(None);
    let mut tps: Vec<usize> = p
        .groups
        .iter()
        .filter(|g| g.mode == mode)
        .map(|g| g.tp)
        .collect();
    tps.sort_unstable();
    tps.dedup();
    if let Some(k) = a.tp {
        if !tps.contains(&k) {
            return Err(Error::bad_input(format!(
                "{} has no TP{k} group in {} mode (it has {}); name one of its TP sizes with --tp",
                a.profile.display(),
                mode.id(),
                p.group_names()
            )));
        }
        tps = vec![k];
    }
    // No GPU is bad input (exit 2, as for `check --measure`), said before NCCL is looked for:
    // installing NCCL would not make the audit run here.
    let gpus = crate::fabric::cuda::visible_gpus();
    if gpus == 0 {
        return Err(Error::bad_input(
            "no GPU is visible (or no NVIDIA driver), and the audit runs NCCL's allreduces on GPUs; run it on the machine the profile is for",
        ));
    }
    let nccl = nccl::library().map_err(Error::Hardware)?;
    let lib = plugin::library::installed().ok_or_else(|| {
        Error::Hardware(format!(
            "{} was not found beside the artune binary; build it with `cargo build --release` or install the Python package, then run the audit again",
            plugin::library::FILE
        ))
    })?;
    for tp in tps {
        let (sizes, pinned) = plan(&p, tp, mode)?;
        let multi = std::env::var(nccl_ranks::ENV_MULTI_RANK).ok();
        let shared = match nccl_ranks::path(nccl.version, multi.as_deref(), gpus, tp) {
            RankPath::PerGpu => false,
            RankPath::Shared => true,
            RankPath::Waived(why) => return Err(Error::Hardware(format!("TP{tp}: {why}"))),
        };
        let dir = tempfile::tempdir().map_err(|e| Error::Hardware(e.to_string()))?;
        let times = sweep(&lib, &profile, dir.path(), tp, shared, &sizes)?;
        let s = summaries(dir.path())?;
        let v = audit::verdict(&s, &pinned, tp);
        report(tp, &s, &times)?;
        match v {
            Verdict::Follows {
                agreed,
                unpinned,
                ranks,
            } => outln!(
                "NCCL {} follows {} at TP{tp}{}: {agreed} of {agreed} allreduces at its {} pinned sizes ran as pinned on {ranks} ranks (profiler {}; {unpinned} at sizes left to NCCL)",
                nccl::version_string(nccl.version),
                a.profile.display(),
                if shared { " (ranks sharing GPU 0)" } else { "" },
                pinned.len(),
                s.first().map_or("?", |x| x.profiler.as_str()),
            ),
            Verdict::NotFollowed(why) => return Err(Error::NotFollowed(format!("TP{tp}: {why}"))),
        }
    }
    Ok(0)
}

/// Per size, on standard output: what the profile pins there, what NCCL ran on rank 0, and
/// rank 0's mean time per call.
fn report(tp: usize, s: &[Summary], times: &[(u64, f64)]) -> Result<(), Error> {
    let Some(r0) = s.iter().find(|s| s.rank == 0) else {
        return Ok(());
    };
    for &(bytes, us) in times {
        let ran: Vec<String> = r0
            .sizes
            .iter()
            .filter(|r| r.bytes == bytes)
            .map(|r| format!("{} x{} ch ({} calls)", r.ran, r.channels, r.calls))
            .collect();
        let pin = r0.sizes.iter().find(|r| r.bytes == bytes).and_then(|r| {
            r.expected.as_ref().map(|e| match r.set_channels {
                Some(c) => format!("{e} <={c} ch"),
                None => e.clone(),
            })
        });
        outln!(
            "  TP{tp} {:>8}: {:<22} ran {:<36} {us:>9.2} us/call",
            crate::units::fmt_size(bytes),
            pin.unwrap_or_else(|| "NCCL's own".into()),
            ran.join(", "),
        );
    }
    Ok(())
}

/// Starts one rank process per rank with NCCL's plugin variables, on the GPUs `ranks` gives
/// them, waits for all of them, and returns rank 0's times.
fn sweep(
    lib: &Path,
    profile: &Path,
    dir: &Path,
    tp: usize,
    shared: bool,
    sizes: &[u64],
) -> Result<Vec<(u64, f64)>, Error> {
    let exe = std::env::current_exe().map_err(|e| Error::Hardware(e.to_string()))?;
    let launch = nccl_ranks::Launch {
        exe,
        dir: dir.to_path_buf(),
        ordinals: (0..tp).map(|r| if shared { 0 } else { r }).collect(),
        sizes: sizes.to_vec(),
        iters: ITERS,
        samples: 1,
        graph: false,
        max_ctas: shared
            .then(|| nccl_ranks::ranked::shared_max_ctas(tp))
            .flatten(),
        channels: Vec::new(),
        pin: None,
        variants: Vec::new(),
        env: vec![
            ("NCCL_TUNER_PLUGIN".into(), lib.into()),
            ("NCCL_PROFILER_PLUGIN".into(), lib.into()),
            (plugin::ENV_PROFILE.into(), profile.into()),
            (audit::ENV_DIR.into(), dir.into()),
        ],
        limit: RANK_LIMIT,
    };
    let times =
        nccl_ranks::run(&launch).map_err(|e| Error::Hardware(format!("TP{tp} sweep: {e}")))?;
    Ok(times.iter().map(|t| (t.bytes, t.mean())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allreduce::Backend;
    use crate::plugin::audit::{Expected, Ran};

    /// A rank's summary as its profiler writes it: `ran` at 4096 bytes, pinned ring Simple.
    fn write(dir: &Path, rank: i32, ran: &str) {
        let mut s = Summary {
            rank,
            nranks: 2,
            following: true,
            tuner_calls: 3,
            ..Summary::default()
        };
        let e = Expected {
            pin: plugin::pin_of(Backend::NcclRingSimple),
            channels: Some(2),
        };
        let (algo, proto) = ran.split_once('/').unwrap();
        s.count(
            4096,
            e,
            Ran {
                algo,
                proto,
                channels: 2,
            },
        );
        let name = format!("audit-1-0000000000000007-r{rank}.json");
        std::fs::write(dir.join(name), serde_json::to_vec(&s).unwrap()).unwrap();
    }

    #[test]
    fn the_verdict_comes_from_the_summaries_the_ranks_wrote() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("rank0.err"), "NCCL INFO lines\n").unwrap();
        write(d.path(), 0, "RING/SIMPLE");
        write(d.path(), 1, "RING/SIMPLE");
        let s = summaries(d.path()).unwrap();
        assert_eq!(s.len(), 2, "the rank logs are not summaries");
        assert!(matches!(
            audit::verdict(&s, &[4096], 2),
            Verdict::Follows { agreed: 2, .. }
        ));
        write(d.path(), 1, "TREE/SIMPLE");
        let v = audit::verdict(&summaries(d.path()).unwrap(), &[4096], 2);
        assert!(
            matches!(&v, Verdict::NotFollowed(w) if w.contains("ran TREE/SIMPLE where the profile pins RING/SIMPLE")),
            "{v:?}"
        );
        std::fs::write(d.path().join("audit-2-r0.json"), "{ half").unwrap();
        let e = summaries(d.path()).unwrap_err();
        assert_eq!(e.exit_code(), crate::error::EXIT_BAD_INPUT, "{e}");
    }

    #[test]
    fn the_sweep_runs_every_size_and_judges_the_pinned_ones() {
        let p = crate::export::sample::profile();
        let (sizes, pinned) = plan(&p, 2, Mode::Graph).unwrap();
        assert!(sizes.iter().all(|s| s % 2 == 0 && *s > 0));
        assert!(!pinned.is_empty() && pinned.len() <= sizes.len());
        let c = Context::from_profile(&p, 2, 1, Mode::Graph, None).unwrap();
        for s in &sizes {
            assert_eq!(pinned.contains(s), matches!(c.pin(*s), Ok(Some(_))), "{s}");
        }
    }

    /// What the fabric starts a rank with is what `__nccl-rank` reads: samples, graph mode,
    /// the batch and one count per communicator.
    #[test]
    fn a_rank_reads_the_arguments_the_launcher_gives_it() {
        use clap::Parser;
        let launch = nccl_ranks::Launch {
            exe: "artune".into(),
            dir: "/tmp/x".into(),
            ordinals: vec![0, 0],
            sizes: vec![1024, 4096],
            iters: 3,
            samples: 7,
            graph: true,
            max_ctas: Some(8),
            channels: vec![Some(4), None],
            pin: None,
            variants: vec![
                crate::allreduce::Backend::Nccl,
                crate::allreduce::Backend::NcclTreeLl128,
            ],
            env: Vec::new(),
            limit: Duration::from_secs(1),
        };
        let ids = ["aa".to_string(), "bb".into()];
        let c = launch.command(&ids, 1);
        let args = std::iter::once("artune".into()).chain(c.get_args().map(|a| a.to_owned()));
        let crate::cli::Command::NcclRank(a) =
            crate::cli::Cli::try_parse_from(args).unwrap().command
        else {
            panic!("not a rank")
        };
        assert_eq!((a.rank, a.nranks, a.iters, a.samples), (1, 2, 3, 7));
        assert!(a.graph);
        assert_eq!(a.sizes, [1024, 4096]);
        assert_eq!(a.channels, [4, 0]);
        assert_eq!(a.id, ids);
        assert_eq!(a.max_ctas, Some(8));
        assert_eq!(a.variants, launch.variants);
    }
}

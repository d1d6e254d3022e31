//! K ranks of NCCL, one process each (`artune __nccl-rank`, [`super::nccl_sweep`]), started
//! with the environment each run needs (a pin's `NCCL_ALGO`/`NCCL_PROTO`, or the variants to
//! switch between through the tuner, [`switch`]; the plugins, several ranks on one GPU) and
//! waited for under one deadline: the processes, not a rank-per-GPU
//! assumption, decide how ranks share a GPU ([`path`]). `check --nccl-audit` and the CUDA
//! fabric's NCCL timing both run through here.

mod path;
pub mod ranked;
pub mod share;
pub mod switch;
pub mod timing;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use path::{path, RankPath, ENV_MULTI_RANK, MULTI_RANK_GPU};

use crate::allreduce::Backend;
use crate::fabric::{NcclAlgo, NcclProto};

/// Why a run of NCCL ranks gave no times.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RanksError {
    #[error("cannot start an NCCL rank process: {0}")]
    Spawn(String),
    #[error("the {k} NCCL ranks did not finish within {secs} s; they were stopped")]
    Timeout { k: usize, secs: u64 },
    #[error("NCCL rank {rank} of {k} failed ({reason}); rerun with NCCL_DEBUG=WARN to see NCCL's reason")]
    Rank {
        rank: usize,
        k: usize,
        reason: String,
    },
    #[error("NCCL rank {rank} of {k} found a wrong sum ({reason})")]
    WrongSum {
        rank: usize,
        k: usize,
        reason: String,
    },
    #[error("cannot write the ranks' log in {path}: {reason}")]
    Log { path: PathBuf, reason: String },
}

/// How a rank process says NCCL's sum was wrong (any other failure exits with
/// [`crate::error::EXIT_HARDWARE`]).
pub const EXIT_WRONG_SUM: i32 = 65;

/// One run of K ranks over a list of sizes.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The artune binary (it has the `__nccl-rank` subcommand).
    pub exe: PathBuf,
    /// Where the ranks write their times, logs and profiler summaries.
    pub dir: PathBuf,
    /// CUDA ordinal of each rank; repeated where ranks share a GPU.
    pub ordinals: Vec<usize>,
    /// Message sizes in bytes (even: bf16).
    pub sizes: Vec<u64>,
    /// Calls per sample.
    pub iters: usize,
    /// Samples per size.
    pub samples: usize,
    /// Each sample replays a CUDA graph of its calls.
    pub graph: bool,
    /// NCCL's `maxCTAs` for every rank (room for ranks sharing a GPU).
    pub max_ctas: Option<i32>,
    /// The communicators each rank makes in turn, each timing every size: the run-time
    /// channels forced on it (`minCTAs` = `maxCTAs`), None for NCCL's own count.
    pub channels: Vec<Option<i32>>,
    /// The NCCL variant pinned through `NCCL_ALGO`/`NCCL_PROTO`; None: NCCL's own choice.
    pub pin: Option<(NcclAlgo, NcclProto)>,
    /// The variants each communicator runs in turn, switched per call through the tuner
    /// ([`switch`]; `env` must load libartune.so as tuner and profiler); empty: `pin` alone.
    pub variants: Vec<Backend>,
    /// Further variables for every rank (the plugins, the profile).
    pub env: Vec<(String, OsString)>,
    pub limit: Duration,
}

impl Launch {
    /// The communicators in turn: NCCL's own count alone where none is asked.
    fn turns(&self) -> Vec<Option<i32>> {
        match self.channels.is_empty() {
            true => vec![None],
            false => self.channels.clone(),
        }
    }

    /// The ranks share a GPU: NCCL needs the multi-rank variable.
    fn shared(&self) -> bool {
        let mut o = self.ordinals.clone();
        o.sort_unstable();
        o.dedup();
        o.len() < self.ordinals.len()
    }

    /// The command that starts rank `rank` with one unique id per communicator, `ids`.
    pub(crate) fn command(&self, ids: &[String], rank: usize) -> Command {
        let k = self.ordinals.len();
        let list: Vec<String> = self.sizes.iter().map(u64::to_string).collect();
        let mut c = Command::new(&self.exe);
        c.args([
            "__nccl-rank",
            "--id",
            &ids.join(","),
            "--rank",
            &rank.to_string(),
        ])
        .args([
            "--nranks",
            &k.to_string(),
            "--iters",
            &self.iters.to_string(),
            "--samples",
            &self.samples.to_string(),
        ])
        .args(["--ordinal", &self.ordinals[rank].to_string()])
        .args(["--sizes", &list.join(",")])
        .arg("--times")
        .arg(self.dir.join(format!("rank{rank}.times")))
        .envs(self.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
        if let Some(m) = self.max_ctas {
            c.args(["--max-ctas", &m.to_string()]);
        }
        if self.graph {
            c.arg("--graph");
        }
        let counts: Vec<String> = self
            .turns()
            .iter()
            .map(|c| c.unwrap_or(0).to_string())
            .collect();
        c.args(["--channels", &counts.join(",")]);
        if self.shared() {
            c.env(ENV_MULTI_RANK, "1");
        }
        if let Some((a, p)) = self.pin {
            c.envs(super::nccl::pin_env(a.name(), p.name()));
        }
        if !self.variants.is_empty() {
            let ids: Vec<&str> = self.variants.iter().map(|v| v.id()).collect();
            c.args(["--variants", &ids.join(",")]);
            // NCCL's own choice is NCCL's, not a profile's.
            c.env_remove(crate::plugin::ENV_PROFILE);
        }
        c
    }
}

/// Where a rank's output goes: the terminal where the user asked NCCL to log (`NCCL_DEBUG`;
/// NCCL logs to standard output), else nowhere, and its standard error into a file read for
/// the rank's reason when it fails.
fn rank_log(dir: &Path, rank: usize) -> Result<(Stdio, Stdio), RanksError> {
    if std::env::var_os("NCCL_DEBUG").is_some() {
        return Ok((Stdio::inherit(), Stdio::inherit()));
    }
    let path = dir.join(format!("rank{rank}.err"));
    std::fs::File::create(&path)
        .map(|f| (Stdio::null(), Stdio::from(f)))
        .map_err(|e| RanksError::Log {
            path,
            reason: e.to_string(),
        })
}

/// One size's times on one communicator of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Timed {
    /// The count forced on the communicator; None: NCCL's own.
    pub channels: Option<i32>,
    /// The variant the tuner switched to; None: the one the start's environment pins.
    pub variant: Option<Backend>,
    pub bytes: u64,
    /// Rank 0's samples, each its mean time per call over one batch, µs.
    pub samples: Vec<f64>,
}

impl Timed {
    /// The mean over every call of every sample, µs.
    pub fn mean(&self) -> f64 {
        self.samples.iter().sum::<f64>() / self.samples.len().max(1) as f64
    }
}

/// Starts every rank, waits for all of them, and returns rank 0's samples of each size on
/// each communicator. A rank that fails or outlives `limit` stops them all.
pub fn run(l: &Launch) -> Result<Vec<Timed>, RanksError> {
    run_with(l, super::nccl::unique_id)
}

/// How long ranks may take to tear down once rank 0 has written every time: a rank finalizes
/// its communicators within `DRAIN_DEADLINE` and aborts them past it, and the profiler writes
/// its summary (the audit's verdict, the channels read back) at the finalize, so that much and
/// a little more. Past it a teardown hangs (torch's destroy of K ranks under MPS did,
/// 2026-12-05): the ranks are stopped and the times kept.
const TEARDOWN: Duration = Duration::from_secs(super::watchdog::DRAIN_DEADLINE.as_secs() + 2);

/// [`run`] with the communicators' unique ids from `ids`.
pub fn run_with(l: &Launch, ids: fn() -> Result<String, String>) -> Result<Vec<Timed>, RanksError> {
    run_inner(l, ids, TEARDOWN)
}

fn run_inner(
    l: &Launch,
    ids: fn() -> Result<String, String>,
    teardown: Duration,
) -> Result<Vec<Timed>, RanksError> {
    let k = l.ordinals.len();
    let ids = l
        .turns()
        .iter()
        .map(|_| ids())
        .collect::<Result<Vec<_>, _>>()
        .map_err(RanksError::Spawn)?;
    let mut children: Vec<Child> = Vec::new();
    for rank in 0..k {
        let mut c = l.command(&ids, rank);
        let (out, err) = rank_log(&l.dir, rank)?;
        c.stdout(out).stderr(err);
        match c.spawn() {
            Ok(ch) => children.push(ch),
            Err(e) => {
                children.iter_mut().for_each(|c| drop(c.kill()));
                return Err(RanksError::Spawn(e.to_string()));
            }
        }
    }
    let deadline = Instant::now() + l.limit;
    let runs = l.turns().len() * l.variants.len().max(1);
    let (times, lines) = (l.dir.join("rank0.times"), runs * l.sizes.len());
    let mut all_in: Option<Instant> = None;
    loop {
        let states: Vec<_> = children.iter_mut().map(|c| c.try_wait()).collect();
        if !states.iter().any(|s| matches!(s, Ok(None))) {
            break;
        }
        // A rank that failed leaves the others waiting in NCCL for it until their own
        // limits: they are stopped at once and the failed rank's reason returned.
        let failed = (states.iter().enumerate()).find_map(|(r, s)| {
            s.as_ref()
                .ok()
                .copied()
                .flatten()
                .filter(|s| !s.success())
                .map(|s| (r, s))
        });
        if let Some((rank, status)) = failed {
            stop(&mut children);
            return Err(rank_error(l, rank, status));
        }
        if Instant::now() > deadline {
            children.iter_mut().for_each(|c| drop(c.kill()));
            return Err(RanksError::Timeout {
                k,
                secs: l.limit.as_secs(),
            });
        }
        if all_in.is_none() && complete(&times, lines) {
            all_in = Some(Instant::now());
        }
        if all_in.is_some_and(|t| t.elapsed() > teardown) {
            stop(&mut children);
            tracing::warn!(
                "the {k} NCCL ranks wrote every time but had not exited {:.1} s later: \
                 stopped (their profiler's channels are lost)",
                teardown.as_secs_f64()
            );
            return Ok(parse_times(
                &std::fs::read_to_string(&times).unwrap_or_default(),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (rank, mut c) in children.into_iter().enumerate() {
        let status = c.wait().map_err(|e| RanksError::Spawn(e.to_string()))?;
        if !status.success() {
            return Err(rank_error(l, rank, status));
        }
    }
    let times = std::fs::read_to_string(l.dir.join("rank0.times")).unwrap_or_default();
    Ok(parse_times(&times))
}

/// Kills every rank and reaps it.
fn stop(children: &mut [Child]) {
    children.iter_mut().for_each(|c| drop(c.kill()));
    children.iter_mut().for_each(|c| drop(c.wait()));
}

/// Why rank `rank` exited with `status`: its last "rank ..." line of standard error.
fn rank_error(l: &Launch, rank: usize, status: std::process::ExitStatus) -> RanksError {
    let k = l.ordinals.len();
    let err = std::fs::read_to_string(l.dir.join(format!("rank{rank}.err"))).unwrap_or_default();
    let reason = match err.lines().rev().find(|l| l.starts_with("rank ")) {
        None => "no reason given".into(),
        Some(l) => l.to_string(),
    };
    match status.code() {
        Some(EXIT_WRONG_SUM) => RanksError::WrongSum { rank, k, reason },
        _ => RanksError::Rank { rank, k, reason },
    }
}

/// Whether rank 0's times file holds `lines` lines of times (a rank writes it whole).
fn complete(path: &Path, lines: usize) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| parse_times(&t).len() >= lines)
}

/// `[VARIANT] CHANNELS BYTES US...` per line, one time per sample, as a rank writes them (the
/// variant's id where the tuner switched to it; 0 channels: NCCL's own count); a line with no
/// sample, an unknown variant or a word that is no number is skipped.
pub fn parse_times(text: &str) -> Vec<Timed> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split(' ').peekable();
            let first = *w.peek()?;
            let variant = match first.parse::<i32>() {
                Ok(_) => None,
                Err(_) => Some(Backend::from_id(first).filter(|b| b.is_nccl())?),
            };
            if variant.is_some() {
                w.next();
            }
            let c: i32 = w.next()?.parse().ok()?;
            let bytes = w.next()?.parse().ok()?;
            let samples = w.map(str::parse).collect::<Result<Vec<f64>, _>>().ok()?;
            (!samples.is_empty()).then_some(Timed {
                channels: (c > 0).then_some(c),
                variant,
                bytes,
                samples,
            })
        })
        .collect()
}

/// The lines [`parse_times`] reads.
pub fn format_times(times: &[super::nccl_sweep::CommTimes]) -> String {
    let line = |v: Option<Backend>, c: i32, b: u64, s: &[f64]| {
        let us: Vec<String> = s.iter().map(|us| format!("{us:.3}")).collect();
        let v = v.map(|v| format!("{} ", v.id())).unwrap_or_default();
        format!("{v}{c} {b} {}\n", us.join(" "))
    };
    times
        .iter()
        .flat_map(|t| {
            let c = t.channels.unwrap_or(0);
            t.sizes.iter().map(move |(b, s)| line(t.variant, c, *b, s))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(ordinals: Vec<usize>) -> Launch {
        Launch {
            exe: "artune".into(),
            dir: "/tmp/x".into(),
            ordinals,
            sizes: vec![1024, 2048],
            iters: 3,
            samples: 7,
            graph: true,
            max_ctas: None,
            channels: vec![Some(8), None, Some(2)],
            pin: Some((NcclAlgo::Ring, NcclProto::Simple)),
            variants: Vec::new(),
            env: Vec::new(),
            limit: Duration::from_secs(1),
        }
    }

    /// A launch of 2 ranks on GPU 0 whose rank binary is the shell `script`, in `d`.
    fn scripted(d: &Path, script: &str, limit: Duration) -> Launch {
        use std::os::unix::fs::PermissionsExt;
        let exe = d.join("artune");
        std::fs::write(&exe, script).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut l = launch(vec![0, 0]);
        (l.exe, l.dir, l.channels, l.limit) = (exe, d.to_path_buf(), Vec::new(), limit);
        l
    }

    fn env_of(c: &Command, key: &str) -> Option<String> {
        c.get_envs()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.map(|v| v.to_string_lossy().into_owned()))
    }

    #[test]
    fn ranks_sharing_a_gpu_get_the_multi_rank_variable_and_others_do_not() {
        let ids = ["00".to_string(), "01".into(), "02".into()];
        let shared = launch(vec![0, 0]).command(&ids, 1);
        assert_eq!(env_of(&shared, ENV_MULTI_RANK).as_deref(), Some("1"));
        let args: Vec<_> = shared.get_args().map(|a| a.to_string_lossy()).collect();
        let at = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .map(|i| args[i + 1].clone())
        };
        assert_eq!(at("--ordinal").as_deref(), Some("0"));
        assert_eq!(at("--channels").as_deref(), Some("8,0,2"));
        assert_eq!(at("--id").as_deref(), Some("00,01,02"));
        assert_eq!(at("--rank").as_deref(), Some("1"));
        assert_eq!(at("--samples").as_deref(), Some("7"));
        assert!(args.iter().any(|a| a == "--graph"));
        assert!(env_of(&shared, "NCCL_ALGO").is_some_and(|v| v.ends_with("Ring")));
        let own = launch(vec![0, 1]).command(&ids, 1);
        assert_eq!(env_of(&own, ENV_MULTI_RANK), None);
        assert!(!args.iter().any(|a| a == "--variants"));
    }

    /// A switched start names its variants, and no profile steers NCCL's own choice there.
    #[test]
    fn a_switched_start_names_its_variants_and_drops_the_profile() {
        let mut l = launch(vec![0, 0]);
        (l.pin, l.variants) = (None, vec![Backend::Nccl, Backend::NcclTreeLl128]);
        let c = l.command(&["00".into(), "01".into(), "02".into()], 0);
        let args: Vec<_> = c.get_args().map(|a| a.to_string_lossy()).collect();
        let at = args.iter().position(|a| a == "--variants").unwrap();
        assert_eq!(args[at + 1], "nccl,nccl_tree_ll128");
        let dropped = c
            .get_envs()
            .any(|(k, v)| k == crate::plugin::ENV_PROFILE && v.is_none());
        assert!(dropped, "ARTUNE_PROFILE removed");
        assert_eq!(env_of(&c, "NCCL_ALGO"), None);
    }

    /// Ranks that wrote every time and then hang in their teardown are stopped after the
    /// grace, and their times kept; the run's limit is not waited out.
    #[test]
    fn ranks_hanging_in_teardown_after_their_times_are_stopped_and_their_times_kept() {
        let d = tempfile::tempdir().unwrap();
        let script = r#"#!/bin/sh
while [ $# -gt 0 ]; do
  case $1 in --sizes) sizes=$2; shift;; --times) out=$2; shift;; esac
  shift
done
for b in $(echo $sizes | tr , ' '); do echo "0 $b 2.5 3.5"; done > $out
exec sleep 30
"#;
        let l = scripted(d.path(), script, Duration::from_secs(6));
        let clock = Instant::now();
        let t = run_inner(&l, || Ok("00".into()), Duration::from_millis(300)).unwrap();
        assert!(
            clock.elapsed() < Duration::from_secs(10),
            "{:?}",
            clock.elapsed()
        );
        let got: Vec<_> = t.iter().map(|t| (t.bytes, t.samples.clone())).collect();
        assert_eq!(got, [(1024, vec![2.5, 3.5]), (2048, vec![2.5, 3.5])]);
    }

    /// A rank that fails stops the others at once (they would wait in NCCL for it until
    /// their own limits), and its reason is the run's.
    #[test]
    fn a_failed_rank_stops_the_others_at_once() {
        let d = tempfile::tempdir().unwrap();
        let script = r#"#!/bin/sh
while [ $# -gt 0 ]; do case $1 in --rank) rank=$2; shift;; esac; shift; done
[ $rank = 1 ] && { echo "rank 1: ncclCommInitRank: unhandled system error" >&2; exit 4; }
exec sleep 30
"#;
        let l = scripted(d.path(), script, Duration::from_secs(20));
        let clock = Instant::now();
        let e = run_inner(&l, || Ok("00".into()), Duration::from_secs(12)).unwrap_err();
        assert!(
            clock.elapsed() < Duration::from_secs(5),
            "{:?}",
            clock.elapsed()
        );
        assert!(
            matches!(&e, RanksError::Rank { rank: 1, k: 2, reason } if reason.contains("unhandled")),
            "{e}"
        );
    }

    #[test]
    fn times_are_read_line_by_line_and_junk_is_skipped() {
        let t = |channels, bytes, samples: &[f64]| Timed {
            channels,
            variant: None,
            bytes,
            samples: samples.to_vec(),
        };
        assert_eq!(
            parse_times("0 1024 3.50\nnot a line\n1024\n8 2048 4.25 5.0\n8 1 2 x\n"),
            [t(None, 1024, &[3.5]), t(Some(8), 2048, &[4.25, 5.0])]
        );
        // A variant's line names it; an unknown or custom one is skipped.
        let read = parse_times(
            "nccl_tree_ll 0 1024 3.5\nnccl 8 2048 4.0\nbogus 0 1024 1\none_stage_pull 0 1 1\n",
        );
        let got: Vec<_> = read
            .iter()
            .map(|t| (t.variant, t.channels, t.bytes))
            .collect();
        assert_eq!(
            got,
            [
                (Some(Backend::NcclTreeLl), None, 1024),
                (Some(Backend::Nccl), Some(8), 2048)
            ]
        );
    }

    #[test]
    fn every_communicator_s_times_come_back_with_its_count() {
        let t = |channels, variant, sizes| crate::fabric::cuda::nccl_sweep::CommTimes {
            channels,
            variant,
            sizes,
        };
        let written = format_times(&[
            t(
                Some(4),
                None,
                vec![(1024, vec![3.5, 3.75]), (2048, vec![4.0])],
            ),
            t(None, None, vec![(1024, vec![2.25, 2.5, 2.125])]),
            t(None, Some(Backend::NcclRingLl), vec![(1024, vec![1.5])]),
        ]);
        let read: Vec<_> = parse_times(&written)
            .into_iter()
            .filter(|t| t.variant.is_none())
            .map(|t| (t.channels, t.bytes, t.samples))
            .collect();
        let switched = parse_times(&written).pop().unwrap();
        assert_eq!(switched.variant, Some(Backend::NcclRingLl));
        assert_eq!(switched.samples, [1.5]);
        assert_eq!(
            read,
            [
                (Some(4), 1024, vec![3.5, 3.75]),
                (Some(4), 2048, vec![4.0]),
                (None, 1024, vec![2.25, 2.5, 2.125])
            ]
        );
    }
}

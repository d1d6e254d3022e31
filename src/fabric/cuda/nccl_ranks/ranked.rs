//! NCCL in a loopback tune timed with K ranks (issue 48): where the loaded NCCL can put the K
//! virtual ranks on the one GPU ([`super::path`]), NCCL's own choice and every algorithm x
//! protocol pin run as K rank processes sharing GPU 0, one start of them per variant timing
//! every size, with the channels that ran read back from rank 0's profiler summary. These are
//! time slices of processes sharing one GPU, never multi-GPU evidence: [`note`] says so.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use super::timing::{profiler_env, ran_channels};
use super::{path, run_with, Launch, RankPath, RanksError};
use crate::allreduce::{Backend, Mode};
use crate::fabric::{FabricError, Verification};

/// Calls per sample, after one untimed call whose sum is checked (a graph holds this many):
/// K ranks time-slicing one GPU take milliseconds a call (4.55-5.11 ms at TP2 whatever the
/// size, profiles/hardware/h200/2026-12-04-realnccl), far above the host timer's resolution.
const ITERS: usize = 1;
/// Samples per size in a variant's first start over the grid: a cell's warm-up, minimum and
/// two steps, as a further start of the ranks costs NCCL's setup of K ranks.
const FIRST: usize = 40;
/// Samples in a start for one size alone, where a cell wants more than its first start gave.
const MORE: usize = 100;
/// One start of the ranks: setup and every size's calls, generously.
const LIMIT: Duration = Duration::from_secs(300);

/// Whether a loopback tune of `k` virtual ranks times NCCL with K rank processes on its one
/// GPU: Ok where NCCL `version` can (with the user's `multi_rank` variable), else the waiver
/// saying what is needed.
pub fn loopback(version: i32, multi_rank: Option<&str>, k: usize) -> Result<(), String> {
    match path(version, multi_rank, 1, k) {
        RankPath::PerGpu | RankPath::Shared => Ok(()),
        RankPath::Waived(why) => Err(why),
    }
}

/// What a profile says of NCCL's timings in a loopback tune of `k` ranks, where it ran them.
pub fn note(k: usize) -> String {
    format!(
        "NCCL timed as {k} rank processes sharing GPU 0: time slices of one GPU, not \
         multi-GPU evidence"
    )
}

/// `maxCTAs` for more than two ranks sharing a GPU at NCCL's own count: every rank's kernel
/// must be resident at once, and 4 ranks at NCCL's default count did not fit where 4 x 8 did
/// (H200, 2026-12-04); two ranks need no cap (2 x 48 ran).
pub fn shared_max_ctas(k: usize) -> Option<i32> {
    (k > 2).then_some(8)
}

/// The K-rank timings of one loopback group: per NCCL variant, mode and size, samples each of
/// [`ITERS`] calls (host-launched in eager mode, a replay of a CUDA graph of them in graph
/// mode), handed out to the harness in order and never twice, so its intervals are those of
/// the samples; a start of the ranks adds more where a cell wants them.
#[derive(Debug)]
pub struct Ranked {
    exe: PathBuf,
    k: usize,
    /// The sizes every variant's first start in a mode times (the tune's grid up to the
    /// group's most).
    grid: Vec<u64>,
    /// Samples not yet handed out, oldest first.
    pool: BTreeMap<(Backend, Mode, u64), VecDeque<f64>>,
    /// Variants started over the grid, per mode.
    started: BTreeSet<(Backend, Mode)>,
    /// The most channels rank 0's profiler saw a variant run a size with.
    ran: BTreeMap<(Backend, u64), u32>,
    /// Variants and sizes whose sum every rank checked in a start (every start checks every
    /// size it times, in graph mode the replay's too).
    checked: BTreeSet<(Backend, u64)>,
    /// Why graph mode's samples are eager ones, where a graph start failed and the same start
    /// host-launched ran; and whether the fabric line has said so yet.
    stand_in: Option<(String, bool)>,
    /// The mode last timed: a verification's start runs in it, so its samples serve the
    /// harness's next cells instead of a mode the tune may not time.
    mode_hint: Mode,
    /// NCCL's unique ids (the ranks' bootstrap); tests give their own.
    ids: fn() -> Result<String, String>,
}

impl Ranked {
    pub fn new(exe: PathBuf, k: usize, grid: Vec<u64>) -> Ranked {
        Ranked {
            exe,
            k,
            grid: grid.into_iter().map(even).collect(),
            pool: BTreeMap::new(),
            started: BTreeSet::new(),
            ran: BTreeMap::new(),
            checked: BTreeSet::new(),
            stand_in: None,
            mode_hint: Mode::Eager,
            ids: crate::fabric::cuda::nccl::unique_id,
        }
    }

    /// `n` new samples of `backend` at `bytes` in `mode` (µs per call), from its first start
    /// in that mode over the grid or, past those, a start at that size alone.
    pub fn time(
        &mut self,
        backend: Backend,
        bytes: u64,
        mode: Mode,
        n: u32,
    ) -> Result<Vec<f64>, FabricError> {
        let (b, n) = (even(bytes), n.max(1) as usize);
        self.mode_hint = mode;
        let fail = |reason: String| FabricError::Backend { backend, reason };
        while self.left(backend, mode, b) < n {
            let had = self.left(backend, mode, b);
            let first = !self.started.contains(&(backend, mode));
            let (sizes, samples) = match first {
                true => (from(&self.grid, b), FIRST.max(n)),
                false => (vec![b], MORE.max(n)),
            };
            self.start(backend, mode, &sizes, samples)
                .map_err(|e| fail(format!("{} ranks on GPU 0: {e}", self.k)))?;
            if self.left(backend, mode, b) == had {
                return Err(fail(format!("rank 0 wrote no time for {b} bytes")));
            }
        }
        let pool = self.pool.entry((backend, mode, b)).or_default();
        Ok(pool.drain(..n).collect())
    }

    /// Starts `backend` over the grid in `mode` where it has not been: the start that sets
    /// its channels (NCCL's own are the profile's).
    pub fn prime(&mut self, backend: Backend, mode: Mode) -> Result<(), FabricError> {
        if self.started.contains(&(backend, mode)) {
            return Ok(());
        }
        let grid = self.grid.clone();
        self.start(backend, mode, &grid, FIRST)
            .map_err(|e| FabricError::Backend {
                backend,
                reason: format!("{} ranks on GPU 0: {e}", self.k),
            })
    }

    /// Whether NCCL summed right in `backend`'s K-rank path at `bytes`: as every start checks
    /// every size it times, a size already timed is answered at once, others by a start at
    /// that size in the mode last timed (its samples kept for the harness).
    pub fn verify(&mut self, backend: Backend, bytes: u64) -> Result<Verification, FabricError> {
        let (b, mode) = (even(bytes), self.mode_hint);
        if !self.checked.contains(&(backend, b)) {
            let first = !self.started.contains(&(backend, mode));
            let sizes = match first {
                true => from(&self.grid, b),
                false => vec![b],
            };
            match self.start(backend, mode, &sizes, FIRST) {
                Ok(()) => {}
                Err(e @ RanksError::WrongSum { .. }) => {
                    return Ok(Verification::Wrong {
                        reason: format!("{} ranks on GPU 0: {e}", self.k),
                    })
                }
                Err(e) => {
                    return Err(FabricError::Backend {
                        backend,
                        reason: format!("{} ranks on GPU 0: {e}", self.k),
                    })
                }
            }
        }
        match self.checked.contains(&(backend, b)) {
            true => Ok(Verification::Correct),
            false => Err(FabricError::Backend {
                backend,
                reason: format!("rank 0 wrote no time for {b} bytes"),
            }),
        }
    }

    /// The most channels NCCL's own choice was seen to run with, once timed.
    pub fn own_channels(&self) -> Option<u32> {
        self.ran
            .iter()
            .filter(|((b, _), _)| *b == Backend::Nccl)
            .map(|(_, &c)| c)
            .max()
    }

    fn left(&self, backend: Backend, mode: Mode, bytes: u64) -> usize {
        self.pool
            .get(&(backend, mode, bytes))
            .map_or(0, |p| p.len())
    }

    /// What the profile's fabric line must say, once: that graph mode's NCCL times are eager
    /// times standing in, and why.
    pub fn stand_in_note(&mut self) -> Option<String> {
        let (why, said) = self.stand_in.as_mut()?;
        if std::mem::replace(said, true) {
            return None;
        }
        Some(format!(
            "graph mode's NCCL times are eager (host-launched) times standing in for graph: the \
             {} ranks ran NCCL but not from a CUDA graph ({why})",
            self.k
        ))
    }

    /// One start of the K ranks for `backend` (NCCL's own where it pins nothing): `samples`
    /// per size of `sizes` in `mode`, each size's sum checked first. Where graph mode fails
    /// and the same start host-launched runs, its samples stand in for graph mode from then
    /// on ([`Ranked::stand_in_note`]); a wrong sum is never stood in for.
    fn start(
        &mut self,
        backend: Backend,
        mode: Mode,
        sizes: &[u64],
        samples: usize,
    ) -> Result<(), RanksError> {
        let graph = mode == Mode::Graph && self.stand_in.is_none();
        let times = match self.launch(backend, sizes, samples, graph) {
            Err(e) if graph && !matches!(e, RanksError::WrongSum { .. }) => {
                let t = self.launch(backend, sizes, samples, false)?;
                self.stand_in = Some((e.to_string(), false));
                t
            }
            t => t?,
        };
        self.started.insert((backend, mode));
        for (b, c) in times.ran {
            self.ran.insert((backend, b), c);
        }
        for t in times.timed {
            self.checked.insert((backend, t.bytes));
            let pool = self.pool.entry((backend, mode, t.bytes)).or_default();
            pool.extend(t.samples);
        }
        Ok(())
    }

    /// The K ranks run once: their times and the channels rank 0's profiler saw.
    fn launch(
        &self,
        backend: Backend,
        sizes: &[u64],
        samples: usize,
        graph: bool,
    ) -> Result<Started, RanksError> {
        let dir = tempfile::tempdir().map_err(|e| RanksError::Log {
            path: std::env::temp_dir(),
            reason: e.to_string(),
        })?;
        let launch = Launch {
            exe: self.exe.clone(),
            dir: dir.path().to_path_buf(),
            ordinals: vec![0; self.k],
            sizes: sizes.to_vec(),
            iters: ITERS,
            samples,
            graph,
            max_ctas: shared_max_ctas(self.k),
            channels: Vec::new(),
            pin: backend.nccl_pin(),
            env: profiler_env(&self.exe, dir.path()),
            limit: LIMIT,
        };
        let timed = run_with(&launch, self.ids)?;
        Ok(Started {
            timed,
            ran: ran_channels(dir.path()),
        })
    }
}

/// What one run of the ranks gave.
struct Started {
    timed: Vec<super::Timed>,
    ran: BTreeMap<u64, u32>,
}

/// A variant's first start in a mode, asked for `b`: `b` and the grid's sizes above it. The
/// harness measures sizes in ascending order, so those below were never asked for (a tune of
/// 16K:64K is not charged 256 B-8K at every start of milliseconds a call).
fn from(grid: &[u64], b: u64) -> Vec<u64> {
    let mut s: Vec<u64> = grid.iter().copied().filter(|&g| g > b).collect();
    s.insert(0, b);
    s
}

/// A size as the ranks call it: even (bf16), at least one element.
fn even(b: u64) -> u64 {
    (b & !1).max(2)
}

/// A loopback group's K ranks played by a script, for the fabric's tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A stand-in for `artune __nccl-rank` in `dir`: it logs its arguments, then rank 0 writes
    /// per size `samples` distinct times (size / 1000 + sample + 0.5, 1000 more in graph mode);
    /// at `wrong` bytes rank 1 reports a wrong sum, at `broken` bytes (0: in graph mode) it
    /// fails otherwise.
    pub fn fake_rank(dir: &std::path::Path, wrong: u64, broken: u64) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let exe = dir.join("artune");
        let log = dir.join("starts.log");
        let script = format!(
            r#"#!/bin/sh
echo "$@" >> {log}
g=0
while [ $# -gt 0 ]; do
  case $1 in
    --sizes) sizes=$2; shift;; --samples) n=$2; shift;; --times) out=$2; shift;;
    --rank) rank=$2; shift;; --graph) g=1000;;
  esac
  shift
done
for b in $(echo $sizes | tr , ' '); do
  if [ $rank = 1 ] && [ $b = {wrong} ]; then
    echo "rank 1: ncclAllReduce of $b bytes: element 3 is 0, not 6" >&2; exit {code}
  fi
  if [ $rank = 1 ] && [ $b = {broken} ]; then echo "rank 1: lost" >&2; exit 4; fi
  if [ $rank = 1 ] && [ {broken} = 0 ] && [ $g = 1000 ]; then
    echo "rank 1: capturing ncclAllReduce: not supported" >&2; exit 4
  fi
done
[ $rank = 0 ] || exit 0
for b in $(echo $sizes | tr , ' '); do
  line="0 $b"; i=0
  while [ $i -lt $n ]; do line="$line $((b / 1000 + i + g)).5"; i=$((i + 1)); done
  echo "$line"
done > $out
"#,
            log = log.display(),
            code = super::super::EXIT_WRONG_SUM,
        );
        std::fs::write(&exe, script).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        exe
    }

    fn fake_id() -> Result<String, String> {
        Ok("00".into())
    }

    /// Each rank's start, as its arguments.
    pub fn starts(dir: &std::path::Path) -> Vec<String> {
        let log = std::fs::read_to_string(dir.join("starts.log")).unwrap_or_default();
        log.lines()
            .filter(|l| l.contains("--rank 0"))
            .map(String::from)
            .collect()
    }

    pub fn ranked(dir: &std::path::Path, wrong: u64, broken: u64) -> Ranked {
        let mut r = Ranked::new(fake_rank(dir, wrong, broken), 2, vec![1024, 4096]);
        r.ids = fake_id;
        r
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{ranked, starts};
    use super::*;

    #[test]
    fn a_loopback_tune_runs_k_ranks_from_2_30_and_says_what_an_older_nccl_needs() {
        assert_eq!(loopback(23206, None, 4), Ok(()));
        assert_eq!(loopback(23000, Some("1"), 2), Ok(()));
        let old = loopback(22703, None, 2).unwrap_err();
        assert!(
            old.contains("NCCL 2.27.3 cannot put several ranks on one GPU (2.30 or later can")
                && old.ends_with("ARTUNE_NCCL_LIB to a newer libnccl.so.2"),
            "{old}"
        );
        let no = loopback(23206, Some("0"), 2).unwrap_err();
        assert!(no.ends_with("so unset it"), "{no}");
    }

    #[test]
    fn the_note_says_one_gpu_and_not_multi_gpu_evidence() {
        let n = note(4);
        assert!(n.contains("4 rank processes sharing GPU 0"), "{n}");
        assert!(n.contains("not multi-GPU evidence"), "{n}");
    }

    #[test]
    fn four_ranks_on_one_gpu_leave_room_for_every_kernel_and_two_need_no_cap() {
        assert_eq!(shared_max_ctas(2), None);
        assert_eq!(shared_max_ctas(4), Some(8));
    }

    #[test]
    fn samples_come_in_order_never_twice_from_one_start_over_the_grid_then_one_per_size() {
        let d = tempfile::tempdir().unwrap();
        let mut r = ranked(d.path(), 0, 1);
        let b = Backend::NcclRingSimple;
        let one = |from: usize, n: usize, plus: usize| -> Vec<f64> {
            (from..from + n)
                .map(|i| (1 + i + plus) as f64 + 0.5)
                .collect()
        };
        // Every sample its own: the harness's interval is the samples', not one number's.
        assert_eq!(r.time(b, 1024, Mode::Eager, 10).unwrap(), one(0, 10, 0));
        assert_eq!(r.time(b, 4096, Mode::Eager, 3).unwrap(), [4.5, 5.5, 6.5]);
        let s = starts(d.path());
        assert_eq!(s.len(), 1, "{s:?}");
        assert!(s[0].contains("--sizes 1024,4096") && s[0].contains("--samples 40"));
        assert!(!s[0].contains("--graph"), "{s:?}");
        // Past the first start's samples: one start at that size alone.
        let more = r.time(b, 1024, Mode::Eager, 35).unwrap();
        assert_eq!(more[..30], one(10, 30, 0)[..]);
        assert_eq!(more[30..], one(0, 5, 0)[..]);
        let s = starts(d.path());
        assert_eq!(s.len(), 2, "{s:?}");
        assert!(s[1].contains("--sizes 1024 ") && s[1].contains("--samples 100"));
        // Graph mode is its own start, each sample one replay of a captured batch.
        assert_eq!(r.time(b, 4096, Mode::Graph, 2).unwrap(), [1004.5, 1005.5]);
        let s = starts(d.path());
        assert!(s.len() == 3 && s[2].contains("--graph"), "{s:?}");
        // An odd size is called as the even one below it.
        assert_eq!(r.time(b, 4097, Mode::Eager, 1).unwrap(), [7.5]);
        assert_eq!(starts(d.path()).len(), 3);
    }

    #[test]
    fn a_pin_is_verified_by_the_k_ranks_own_sums_and_a_wrong_one_is_named() {
        let d = tempfile::tempdir().unwrap();
        let mut r = ranked(d.path(), 2048, 8192);
        let b = Backend::NcclTreeLl;
        assert_eq!(r.verify(b, 1024).unwrap(), Verification::Correct);
        // Checked by the start that timed it: no start of its own.
        assert_eq!(r.verify(b, 4096).unwrap(), Verification::Correct);
        assert_eq!(starts(d.path()).len(), 1);
        let Verification::Wrong { reason } = r.verify(b, 2048).unwrap() else {
            panic!("a wrong sum is a wrong verification")
        };
        assert!(
            reason.contains("rank 1 of 2 found a wrong sum")
                && reason.contains("element 3 is 0, not 6"),
            "{reason}"
        );
        let e = r.verify(b, 8192).unwrap_err().to_string();
        assert!(e.contains("NCCL rank 1 of 2 failed (rank 1: lost)"), "{e}");
        // A wrong sum while timing fails the backend, with the reason.
        let e = r.time(b, 2048, Mode::Eager, 1).unwrap_err().to_string();
        assert!(e.contains("found a wrong sum"), "{e}");
    }

    /// A first start asked above the grid's smallest size times none below it, as the harness
    /// asks in ascending order.
    #[test]
    fn a_first_start_times_the_size_asked_and_the_grid_above_it() {
        let d = tempfile::tempdir().unwrap();
        let mut r = ranked(d.path(), 0, 1);
        r.time(Backend::NcclTreeLl, 2048, Mode::Eager, 1).unwrap();
        r.time(Backend::Nccl, 4096, Mode::Graph, 1).unwrap();
        let s = starts(d.path());
        assert!(s[0].contains("--sizes 2048,4096 "), "{s:?}");
        assert!(s[1].contains("--sizes 4096 "), "{s:?}");
    }

    /// A verification's start runs in the mode last timed, whose cells come next: a graph
    /// tune starts no eager ranks to verify, and the samples serve the harness.
    #[test]
    fn a_verification_starts_the_ranks_in_the_mode_last_timed() {
        let d = tempfile::tempdir().unwrap();
        let mut r = ranked(d.path(), 0, 1);
        r.time(Backend::Nccl, 1024, Mode::Graph, 1).unwrap();
        let b = Backend::NcclTreeSimple;
        assert_eq!(r.verify(b, 4096).unwrap(), Verification::Correct);
        let s = starts(d.path());
        assert!(s.len() == 2 && s[1].contains("--graph"), "{s:?}");
        assert_eq!(r.time(b, 4096, Mode::Graph, 1).unwrap(), [1004.5]);
        assert_eq!(starts(d.path()).len(), 2);
    }

    /// Where the ranks cannot run from a graph but run host-launched, graph mode gets eager
    /// samples, said once; a graph start is not tried again.
    #[test]
    fn graph_mode_falls_back_to_eager_samples_and_says_so_once() {
        let d = tempfile::tempdir().unwrap();
        let mut r = ranked(d.path(), 0, 0);
        let b = Backend::NcclRingLl;
        assert_eq!(r.time(b, 1024, Mode::Eager, 2).unwrap(), [1.5, 2.5]);
        assert_eq!(r.stand_in_note(), None, "eager alone stands in for nothing");
        assert_eq!(r.time(b, 1024, Mode::Graph, 2).unwrap(), [1.5, 2.5]);
        let note = r.stand_in_note().unwrap();
        assert!(
            note.starts_with("graph mode's NCCL times are eager (host-launched) times")
                && note.contains("(NCCL rank 1 of 2 failed (rank 1: capturing ncclAllReduce"),
            "{note}"
        );
        assert_eq!(r.stand_in_note(), None, "said once");
        assert_eq!(r.time(Backend::Nccl, 4096, Mode::Graph, 1).unwrap(), [4.5]);
        let s = starts(d.path());
        let graph = s.iter().filter(|s| s.contains("--graph")).count();
        assert_eq!((s.len(), graph), (4, 1), "{s:?}");
    }

    #[test]
    fn own_channels_are_the_most_nccl_s_own_choice_ran() {
        let mut r = Ranked::new("artune".into(), 2, vec![1024]);
        assert_eq!(r.own_channels(), None);
        r.ran.insert((Backend::Nccl, 1024), 2);
        r.ran.insert((Backend::Nccl, 1 << 20), 24);
        r.ran.insert((Backend::NcclRingSimple, 1 << 20), 32);
        assert_eq!(r.own_channels(), Some(24));
    }
}

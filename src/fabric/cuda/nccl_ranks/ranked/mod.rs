//! NCCL in a loopback tune timed with K ranks (issue 48): where the loaded NCCL can put the K
//! virtual ranks on the one GPU ([`super::path`]), NCCL's own choice and every algorithm x
//! protocol pin run as K rank processes sharing GPU 0, with the channels that ran read back
//! from rank 0's profiler summary. Where libartune.so lies beside the binary (NCCL's tuner and
//! profiler), one start per mode runs every variant, switched per call through the tuner
//! ([`super::switch`]); a variant whose read-back shows NCCL ran something else is not timed
//! from it, and starts ranks of its own pinned through `NCCL_ALGO`/`NCCL_PROTO`, as every
//! variant does without the library. These are one GPU's times (under MPS or by time slices),
//! never multi-GPU evidence: [`note`] says which.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use super::switch::{self, ReadBack};
use super::timing::{profiler_env, ran_channels};
use super::{path, run_with, Launch, RankPath, RanksError, Timed};
use crate::allreduce::{Backend, Mode};
use crate::fabric::{FabricError, Verification};

/// Calls per sample, after one untimed call whose sum is checked (a graph holds this many):
/// K ranks time-slicing one GPU take milliseconds a call (4.55-5.11 ms at TP2 whatever the
/// size, profiles/hardware/h200/2026-12-04-realnccl), far above the host timer's resolution.
const ITERS: usize = 1;
/// Samples per size in a start while the cost of a call is not yet known.
const FIRST: usize = 40;
/// Samples per size in the group's first start (NCCL's own choice over the coarse grid): it
/// reads back NCCL's channels and the cost of a call, which sizes every later start.
const PROBE: usize = 5;
/// Once a call's cost is known, a variant's first start takes per size what fits in this
/// many microseconds of calls, within [`FLOOR`, `CAP`]: under MPS (calls of microseconds) a
/// cell's whole cap from one start; time slices (milliseconds a call) the floor.
const BUDGET_US: f64 = 100_000.0;
/// A further start for one size alone takes what fits in this, within [n, `CAP`]: each start
/// costs NCCL's setup of K ranks (about 1.5 s), so it should be the cell's last.
const MORE_BUDGET_US: f64 = 200_000.0;
/// Samples a start takes at least: a cell's warm-up (3) and minimum (10), and most of what
/// time slices' spread made cells take (15-44, profiles/hardware/h200/2026-12-05-krank).
const FLOOR: usize = 30;
/// The harness's most samples per cell: more would never be handed out.
const CAP: usize = 200;
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

/// What a profile says of NCCL's timings in a loopback tune of `k` ranks, where it ran them:
/// whether they shared GPU 0 under MPS or by time slices, as the driver reports it.
pub fn note(k: usize) -> String {
    super::share::note(k, &super::share::sharing(0))
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
///
/// Each start of the ranks costs NCCL's setup of K ranks whatever it times, so a variant's
/// first start in a mode times every size the harness may ask from there on: the reference
/// grid's sizes, every one bisection can add ([`crate::plan::fine_grid`]), each checked
/// first, so neither a refined size's verification nor its timing starts the ranks again.
#[derive(Debug)]
pub struct Ranked {
    exe: PathBuf,
    k: usize,
    /// The sizes the group's first start times (the tune's grid up to the group's most).
    coarse: Vec<u64>,
    /// The sizes a variant's first start in a mode times from the size asked: `coarse` and
    /// every size bisection can add between its points.
    grid: Vec<u64>,
    /// The mean time of a call in the last start, µs: what sizes the next start's samples.
    call_us: Option<f64>,
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
    /// The NCCL variants the tune times here: a mode's switched start runs them all.
    variants: Vec<Backend>,
    /// libartune.so beside the binary, NCCL's tuner and profiler in a switched start; None:
    /// every variant starts ranks of its own.
    tuner: Option<PathBuf>,
    /// Variants NCCL did not run under the tuner's switch, and what the read-back said.
    unfollowed: BTreeMap<Backend, String>,
    /// Why switched starts stopped: one failed, so each variant starts its own (a wrong sum
    /// is then the variant's own).
    no_switch: Option<String>,
    /// The K ranks started so far (a graph start retried host-launched counts twice).
    starts: usize,
    /// Variants of `unfollowed` the fabric line has said.
    said: BTreeSet<Backend>,
}

impl Ranked {
    /// The ranks of a group of `k` over the tune's `grid`, timing the NCCL `variants`.
    pub fn new(exe: PathBuf, k: usize, grid: Vec<u64>, variants: Vec<Backend>) -> Ranked {
        let coarse: Vec<u64> = grid.into_iter().map(even).collect();
        let align = crate::plan::alignment(k, crate::allreduce::Dtype::Bf16);
        let fine = match (coarse.first(), coarse.last()) {
            (Some(&lo), Some(&hi)) => crate::plan::fine_grid(lo, hi, align),
            _ => Vec::new(),
        };
        Ranked {
            k,
            grid: fine.into_iter().map(even).collect(),
            coarse,
            call_us: None,
            pool: BTreeMap::new(),
            started: BTreeSet::new(),
            ran: BTreeMap::new(),
            checked: BTreeSet::new(),
            stand_in: None,
            mode_hint: Mode::Eager,
            ids: crate::fabric::cuda::nccl::unique_id,
            tuner: super::timing::library_of(&exe),
            exe,
            variants,
            unfollowed: BTreeMap::new(),
            no_switch: None,
            starts: 0,
            said: BTreeSet::new(),
        }
    }

    /// `n` new samples of `backend` at `bytes` in `mode` (µs per call), from its first start
    /// in that mode over the grid or, past those, a start at that size alone (every switched
    /// variant's there).
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
            let first_n = self.first_samples().max(n);
            self.start_for(backend, mode, b, n, first_n)
                .map_err(|e| fail(format!("{} ranks on GPU 0: {e}", self.k)))?;
            if self.left(backend, mode, b) == had {
                return Err(fail(format!("rank 0 wrote no time for {b} bytes")));
            }
        }
        let pool = self.pool.entry((backend, mode, b)).or_default();
        Ok(pool.drain(..n).collect())
    }

    /// The group's first start: `backend` over the coarse grid in `mode`, a few samples per
    /// size, to read back its channels (NCCL's own are the profile's) and what a call costs
    /// here. It leaves the variant's timing start to come (its first over the fine grid).
    pub fn prime(&mut self, backend: Backend, mode: Mode) -> Result<(), FabricError> {
        let (coarse, had) = (self.coarse.clone(), self.started.contains(&(backend, mode)));
        let primed = self.start(&Run::Pinned(backend), mode, &coarse, PROBE, None);
        if !had {
            self.started.remove(&(backend, mode));
        }
        primed.map_err(|e| FabricError::Backend {
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
            let first_n = self.first_samples();
            match self.start_for(backend, mode, b, 1, first_n) {
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

    /// Samples per size in a variant's first start: [`FIRST`] until a call's cost is known,
    /// then what [`BUDGET_US`] holds.
    fn first_samples(&self) -> usize {
        self.call_us.map_or(FIRST, |c| budget(BUDGET_US, c, FLOOR))
    }

    /// Samples per variant in a further start for one size of `variants`, where a cell wants
    /// `n` more: the budget is the start's, shared by the variants it runs.
    fn more_samples(&self, n: usize, variants: usize) -> usize {
        let us = MORE_BUDGET_US / variants.max(1) as f64;
        budget(us, self.call_us.unwrap_or(1.0), n.max(FLOOR)).max(n)
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

    /// The variants NCCL did not run under the tuner's switch, each with what was read back.
    pub fn unfollowed(&self) -> &BTreeMap<Backend, String> {
        &self.unfollowed
    }

    /// What the profile's fabric line must say, once per variant: that NCCL did not run it
    /// under the tuner's switch, what the read-back said, and that its own ranks timed it.
    pub fn unfollowed_notes(&mut self) -> Vec<String> {
        let new: Vec<Backend> = (self.unfollowed.keys())
            .filter(|b| !self.said.contains(*b))
            .copied()
            .collect();
        self.said.extend(new.iter().copied());
        (new.iter())
            .map(|b| {
                format!(
                    "NCCL did not run {b} under artune's tuner switch ({}), so {b} was timed by \
                     ranks pinned through NCCL_ALGO/NCCL_PROTO",
                    self.unfollowed[b]
                )
            })
            .collect()
    }

    /// How many times the K ranks were started.
    pub fn starts(&self) -> usize {
        self.starts
    }

    /// The most channels rank 0's profiler saw `backend` run `bytes` with, once timed.
    pub fn ran_channels(&self, backend: Backend, bytes: u64) -> Option<u32> {
        self.ran.get(&(backend, even(bytes))).copied()
    }

    /// Whether `backend` is timed from the tuner's switch.
    fn switches(&self, backend: Backend) -> bool {
        self.tuner.is_some()
            && self.no_switch.is_none()
            && self.variants.contains(&backend)
            && !self.unfollowed.contains_key(&backend)
    }

    /// Starts the ranks for `n` more samples of `backend` at `b` in `mode`: its first start in
    /// the mode times the grid from `b` with `first_n` samples, a further one `b` alone; where
    /// the tuner switches, either is every followed variant's, since a size whose samples
    /// spread too wide for one variant's interval spreads for its neighbours too (eager calls
    /// under MPS: one further start per variant was 7 of 9 starts of a TP2 tune, 2 s each).
    /// Where the switch fails or NCCL did not follow it for `backend`, the variant's own start
    /// pinned through the environment serves it.
    fn start_for(
        &mut self,
        backend: Backend,
        mode: Mode,
        b: u64,
        n: usize,
        first_n: usize,
    ) -> Result<(), RanksError> {
        let first = !self.started.contains(&(backend, mode));
        let sizes = match first {
            true => from(&self.grid, b),
            false => vec![b],
        };
        let samples = |r: &Self, variants: usize| match first {
            true => first_n,
            false => r.more_samples(n, variants),
        };
        if self.switches(backend) {
            let all = self.variants.iter().copied();
            let followed: Vec<Backend> = all.filter(|v| !self.unfollowed.contains_key(v)).collect();
            let samples = samples(self, followed.len());
            // A further start judges only the variant asked for: another's read-back missing
            // at this one size drops its samples there, not its switch for the whole tune.
            let asked = (!first).then_some(backend);
            match self.start(&Run::Switched(followed), mode, &sizes, samples, asked) {
                Ok(()) if !self.unfollowed.contains_key(&backend) => return Ok(()),
                Ok(()) => {}
                Err(e) => {
                    tracing::warn!(
                        "{} NCCL ranks switching variants through the tuner failed ({e}); each \
                         variant starts ranks of its own",
                        self.k
                    );
                    self.no_switch = Some(e.to_string());
                }
            }
        }
        let samples = samples(self, 1);
        self.start(&Run::Pinned(backend), mode, &sizes, samples, None)
    }

    /// One start of the K ranks for `run`: `samples` per size of `sizes` in `mode`, each
    /// size's sum checked first. Where graph mode fails and the same start host-launched runs,
    /// its samples stand in for graph mode from then on ([`Ranked::stand_in_note`]); a wrong
    /// sum is never stood in for. Where `asked` names a variant, only its read-back decides
    /// whether NCCL follows the switch ([`Ranked::keep_followed`]).
    fn start(
        &mut self,
        run: &Run,
        mode: Mode,
        sizes: &[u64],
        samples: usize,
        asked: Option<Backend>,
    ) -> Result<(), RanksError> {
        let graph = mode == Mode::Graph && self.stand_in.is_none();
        let clock = std::time::Instant::now();
        self.starts += 1;
        let times = match self.launch(run, sizes, samples, graph) {
            Err(e) if graph && !matches!(e, RanksError::WrongSum { .. }) => {
                self.starts += 1;
                let t = self.launch(run, sizes, samples, false)?;
                self.stand_in = Some((e.to_string(), false));
                t
            }
            t => t?,
        };
        let mut all: Vec<f64> = times.timed.iter().flat_map(|t| t.samples.clone()).collect();
        all.sort_by(f64::total_cmp);
        if !all.is_empty() {
            self.call_us = Some(crate::stats::median_sorted(&all));
        }
        tracing::info!(
            "{} NCCL ranks on GPU 0, {run}, {}: {} sizes x {samples} samples in {:.2} s \
             (median call {:.1} us)",
            self.k,
            mode.id(),
            sizes.len(),
            clock.elapsed().as_secs_f64(),
            self.call_us.unwrap_or(f64::NAN)
        );
        match run {
            Run::Pinned(backend) => {
                for (b, c) in times.ran {
                    self.ran.insert((*backend, b), c);
                }
                self.keep(*backend, mode, times.timed.iter());
            }
            Run::Switched(variants) => {
                for &v in variants {
                    let judged = asked.is_none_or(|a| a == v);
                    self.keep_followed(v, mode, &times, judged);
                }
            }
        }
        Ok(())
    }

    /// `backend`'s samples of `timed` into the pool, its sizes checked and started in `mode`.
    fn keep<'a>(&mut self, backend: Backend, mode: Mode, timed: impl Iterator<Item = &'a Timed>) {
        self.started.insert((backend, mode));
        for t in timed {
            self.checked.insert((backend, t.bytes));
            let pool = self.pool.entry((backend, mode, t.bytes)).or_default();
            pool.extend(t.samples.iter().copied());
        }
    }

    /// Keeps variant `v`'s times of a switched start where rank 0's profiler saw NCCL run it
    /// at every size under its override; else none of them, and, where the start `judged` it,
    /// says why once and leaves it to starts of its own.
    fn keep_followed(&mut self, v: Backend, mode: Mode, s: &Started, judged: bool) {
        let mine: Vec<&Timed> = s.timed.iter().filter(|t| t.variant == Some(v)).collect();
        let read: Result<Vec<u32>, String> = match mine.is_empty() {
            true => Err("rank 0 wrote no time for it".to_string()),
            false => mine.iter().map(|t| s.read.ran(v, t.bytes)).collect(),
        };
        match read {
            Ok(channels) => {
                for (t, c) in mine.iter().zip(channels) {
                    self.ran.insert((v, t.bytes), c);
                }
                self.keep(v, mode, mine.into_iter());
            }
            Err(why) if !judged => {
                tracing::debug!("{} NCCL ranks: {v}'s samples left out here ({why})", self.k);
            }
            Err(why) => {
                tracing::warn!(
                    "{} NCCL ranks: {v} is not timed from the tuner's switch ({why}); it starts \
                     ranks of its own pinned through NCCL_ALGO/NCCL_PROTO",
                    self.k
                );
                self.unfollowed.insert(v, why);
            }
        }
    }

    /// The K ranks run once: their times and what rank 0's profiler saw.
    fn launch(
        &self,
        run: &Run,
        sizes: &[u64],
        samples: usize,
        graph: bool,
    ) -> Result<Started, RanksError> {
        let dir = tempfile::tempdir().map_err(|e| RanksError::Log {
            path: std::env::temp_dir(),
            reason: e.to_string(),
        })?;
        let mut env = profiler_env(&self.exe, dir.path());
        let (pin, variants) = match run {
            Run::Pinned(b) => (b.nccl_pin(), Vec::new()),
            Run::Switched(v) => {
                env.extend(self.tuner.iter().flat_map(|t| switch::env(t)));
                (None, v.clone())
            }
        };
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
            pin,
            limit: LIMIT * variants.len().max(1) as u32,
            variants,
            env,
        };
        let timed = run_with(&launch, self.ids)?;
        Ok(Started {
            timed,
            ran: ran_channels(dir.path()),
            read: ReadBack::read(dir.path()),
        })
    }
}

/// What one start of the ranks runs.
#[derive(Debug, Clone, PartialEq)]
enum Run {
    /// One variant, pinned through the environment (NCCL's own where it pins nothing).
    Pinned(Backend),
    /// Several on one communicator, switched per call through the tuner and read back.
    Switched(Vec<Backend>),
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Run::Pinned(b) => write!(f, "{b}"),
            Run::Switched(v) => write!(f, "{} variants switched by the tuner", v.len()),
        }
    }
}

/// What one run of the ranks gave.
struct Started {
    timed: Vec<Timed>,
    /// Per size, the most channels rank 0's profiler saw (a pinned start's).
    ran: BTreeMap<u64, u32>,
    /// What ran per override (a switched start's).
    read: ReadBack,
}

/// A variant's first start in a mode, asked for `b`: `b` and the grid's sizes above it. The
/// harness measures sizes in ascending order, so those below were never asked for (a tune of
/// 16K:64K is not charged 256 B-8K at every start of milliseconds a call).
fn from(grid: &[u64], b: u64) -> Vec<u64> {
    let mut s: Vec<u64> = grid.iter().copied().filter(|&g| g > b).collect();
    s.insert(0, b);
    s
}

/// The samples that fit in `budget_us` of calls of `call_us` each, within [`floor`, `CAP`].
fn budget(budget_us: f64, call_us: f64, floor: usize) -> usize {
    let fit = (budget_us / call_us.max(1e-3)).floor();
    (fit.min(CAP as f64) as usize).max(floor.min(CAP))
}

/// A size as the ranks call it: even (bf16), at least one element.
fn even(b: u64) -> u64 {
    (b & !1).max(2)
}

/// A loopback group's K ranks played by a script, for the fabric's tests.
#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests;

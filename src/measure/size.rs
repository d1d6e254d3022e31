//! One size of one mode in one group: every backend's cell sampled in turn, a round at a time,
//! so contenders share the machine's moments; then its close calls settled.
//!
//! Sampled one after another, two kernels that are the same speed can measure 15% apart on a
//! box whose launch rate shifts every few seconds (eager mode on the H200, where the host's
//! launch path is what is timed): the first met one phase, the second another. Rounds give
//! each cell samples from the same moments as its rivals; the revisit and settling come back
//! after the whole sweep, so a drift shows as a wider interval instead of a verdict, where the
//! first visit took few samples (a long one keeps its level: the revisit's are outliers).

use std::collections::{BTreeMap, BTreeSet};

use super::cell::{timing, Sampled, Stage};
use super::{cell_seed, check_interrupt, disqualify, rivals, timed, Plan, Progress, Rivals};
use crate::allreduce::{Backend, Mode};
use crate::fabric::{Fabric, FabricError, Verification};
use crate::plan::CloseCalls;
use crate::results::GroupResults;
use crate::results::Timing;
use crate::stats::Summary;

/// Samples each side of a revisit needs before its medians count as a drift.
const MIN_DRIFT_SAMPLES: usize = 5;

/// Every cell's samples in one mode, by backend and size, kept for settling.
pub type Raw = BTreeMap<(Backend, u64), Sampled>;

/// One size being measured.
pub struct At<'a> {
    pub fabric: &'a mut dyn Fabric,
    pub plan: &'a Plan,
    pub mode: Mode,
    pub bytes: u64,
}

impl<'a> At<'a> {
    pub fn new(fabric: &'a mut dyn Fabric, plan: &'a Plan, mode: Mode, bytes: u64) -> Self {
        At {
            fabric,
            plan,
            mode,
            bytes,
        }
    }

    /// Verifies (once per backend and size) and warms up each of `ready`, then samples every
    /// cell a round at a time, in alternating order, until each is finished.
    pub fn measure(
        &mut self,
        ready: &[Backend],
        verified: &mut BTreeSet<(Backend, u64)>,
        res: &mut GroupResults,
        raw: &mut Raw,
        progress: &mut dyn FnMut(Progress),
        faults: &mut Vec<String>,
    ) -> Result<(), FabricError> {
        let (h, mode, bytes) = (&self.plan.harness, self.mode, self.bytes);
        let mut active: Vec<(Backend, Sampled)> = Vec::new();
        for &backend in ready {
            if res.disqualified.contains_key(&backend) {
                continue;
            }
            check_interrupt(&self.plan.cancel)?;
            progress(Progress::Cell {
                backend,
                bytes,
                mode,
            });
            match self.start(backend, verified, res) {
                Ok(Ok(s)) => active.push((backend, s)),
                Ok(Err(reason)) => disqualify(res, faults, progress, backend, reason),
                Err(e) if e.backend_local() => {
                    disqualify(res, faults, progress, backend, e.to_string())
                }
                Err(e) => return Err(e),
            }
        }
        while !active.is_empty() {
            let sampled = self.round(active, None, res, progress, faults)?;
            // Per cell: done, and out of the running (then no contender keeps it sampling).
            let done: Vec<(bool, bool)> = sampled
                .iter()
                .map(|(b, s, summary)| {
                    let rivals = self.rivals(res, *b);
                    let out = s.hopeless(h, &rivals);
                    (s.done(summary, h, &rivals, Stage::Sweep), out)
                })
                .collect();
            let sampling: Vec<&Summary> = sampled
                .iter()
                .zip(&done)
                .filter(|(_, (d, _))| !*d)
                .map(|((_, _, summary), _)| summary)
                .collect();
            let stays: Vec<bool> = sampled
                .iter()
                .zip(&done)
                .map(|((_, s, summary), &(d, out))| {
                    !d || (!out && s.room(h) && sampling.iter().any(|o| contenders(summary, o, h)))
                })
                .collect();
            let mut next = Vec::with_capacity(sampled.len());
            for ((backend, s, summary), stay) in sampled.into_iter().zip(stays) {
                if stay {
                    next.push((backend, s));
                } else if let Err(e) = timing(backend, &summary) {
                    disqualify(res, faults, progress, backend, e.to_string());
                } else {
                    raw.insert((backend, bytes), s);
                }
            }
            active = next;
        }
        Ok(())
    }

    /// One round of `cells`: each takes its next samples one at a time, in turn with the
    /// others and in alternating order, so every cell's samples come from the same moments.
    /// Each cell's timing so far is stored; a backend that fails is disqualified and dropped.
    /// Each takes `len` samples, else [`Sampled::round_len`].
    fn round(
        &mut self,
        mut cells: Vec<(Backend, Sampled)>,
        len: Option<u32>,
        res: &mut GroupResults,
        progress: &mut dyn FnMut(Progress),
        faults: &mut Vec<String>,
    ) -> Result<Vec<(Backend, Sampled, Summary)>, FabricError> {
        let (h, mode, bytes) = (&self.plan.harness, self.mode, self.bytes);
        let quota: Vec<u32> = cells
            .iter()
            .map(|(_, s)| len.unwrap_or_else(|| s.round_len(h)))
            .collect();
        let mut failed = vec![false; cells.len()];
        // One clock reading for the whole round: a simulated sample costs less than two.
        let started = std::time::Instant::now();
        for k in 0..quota.iter().copied().max().unwrap_or(0) {
            let order: Vec<usize> = if k % 2 == 0 {
                (0..cells.len()).collect()
            } else {
                (0..cells.len()).rev().collect()
            };
            for i in order {
                if failed[i] || k >= quota[i] {
                    continue;
                }
                check_interrupt(&self.plan.cancel)?;
                let (backend, s) = &mut cells[i];
                match s.add(&mut *self.fabric, *backend, bytes, mode, 1) {
                    Ok(()) => {}
                    Err(e) if e.backend_local() => {
                        disqualify(res, faults, progress, *backend, e.to_string());
                        failed[i] = true;
                    }
                    Err(e) => {
                        res.phases.timing_s += started.elapsed().as_secs_f64();
                        return Err(e);
                    }
                }
            }
        }
        res.phases.timing_s += started.elapsed().as_secs_f64();
        let mut out = Vec::with_capacity(cells.len());
        for ((backend, s), failed) in cells.into_iter().zip(failed) {
            if failed {
                continue;
            }
            let summary = s.summary();
            if let Ok(t) = s.timing(backend, &summary) {
                self.store(res, backend, t);
            }
            out.push((backend, s, summary));
        }
        Ok(out)
    }

    /// Verification on fresh data the first time a backend meets this size, then the warm-up.
    /// The inner error is a wrong result: it disqualifies the backend, not the run.
    fn start(
        &mut self,
        backend: Backend,
        verified: &mut BTreeSet<(Backend, u64)>,
        res: &mut GroupResults,
    ) -> Result<Result<Sampled, String>, FabricError> {
        let bytes = self.bytes;
        if verified.insert((backend, bytes)) {
            let seed = cell_seed(self.plan.seed, &res.gpus, backend, bytes);
            let fabric = &mut *self.fabric;
            let v = timed(&mut res.phases.verify_s, || {
                fabric.verify(backend, bytes, seed)
            })?;
            if let Verification::Wrong { reason } = v {
                return Ok(Err(format!("wrong result at {bytes} bytes: {reason}")));
            }
        }
        // Times grow with the size: the median at the next size below is a hint.
        let below = res.cells.get(&self.mode).and_then(|m| {
            let mut smaller = m.range(..bytes).rev();
            smaller
                .find_map(|(_, c)| c.get(&backend))
                .map(|t| t.median_us)
        });
        let fabric = &mut *self.fabric;
        let h = &self.plan.harness;
        timed(&mut res.phases.timing_s, || {
            Sampled::start(fabric, backend, bytes, self.mode, h, below)
        })
        .map(Ok)
    }

    fn store(&mut self, res: &mut GroupResults, backend: Backend, t: Timing) {
        res.cells
            .entry(self.mode)
            .or_default()
            .entry(self.bytes)
            .or_default()
            .insert(backend, t);
    }

    /// The cells at this size so far that `backend` is measured against.
    fn rivals(&self, res: &GroupResults, backend: Backend) -> Rivals {
        let cell = res.cells.get(&self.mode).and_then(|m| m.get(&self.bytes));
        cell.map_or_else(Rivals::default, |c| rivals(c, &res.disqualified, backend))
    }

    /// One more, short round ([`super::Harness::revisit_samples`]) for every cell measured
    /// here that has room under the caps and is in the running. A [`Sampled::hopeless`] one
    /// is left as it is: its drift cannot matter, since only a move by more than the hopeless
    /// factor could bring it into a comparison, and no verdict or re-check reads it there.
    pub fn revisit(
        &mut self,
        res: &mut GroupResults,
        raw: &mut Raw,
        progress: &mut dyn FnMut(Progress),
        faults: &mut Vec<String>,
    ) -> Result<(), FabricError> {
        let (h, bytes) = (&self.plan.harness, self.bytes);
        let first: Vec<(Backend, usize, Summary)> = raw
            .iter()
            .filter(|((b, n), s)| *n == bytes && !res.disqualified.contains_key(b) && s.room(h))
            .filter(|((b, _), s)| !s.hopeless(h, &self.rivals(res, *b)))
            .map(|((b, _), s)| (*b, s.samples.len(), s.summary()))
            .collect();
        let backends: Vec<Backend> = first.iter().map(|(b, _, _)| *b).collect();
        let len = Some(h.revisit_samples);
        self.again(&backends, len, res, raw, progress, faults)?;
        // How far each backend moved between its first visit and this one.
        for (backend, n, before) in first {
            let Some(s) = raw.get(&(backend, bytes)) else {
                continue;
            };
            let (old, new) = s.samples.split_at(n.min(s.samples.len()));
            let after = crate::stats::summarize(new);
            // A move counts only where the two visits' intervals are apart: a short revisit's
            // median alone moves with the noise, and a drift recorded widens `check`'s
            // tolerance for nothing. Nor where a quarter of the revisit still ran inside the
            // first visit's range: a burst of slow calls among calls at the old speed (a
            // revisit of 5 with 3 outliers has an outlier median) is not the backend moving.
            let (lo, hi) = old
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
            let stayed = new.iter().filter(|&&x| lo <= x && x <= hi).count();
            let apart = (after.ci_low > before.ci_high || after.ci_high < before.ci_low)
                && stayed * 4 < new.len().max(1);
            if n >= MIN_DRIFT_SAMPLES
                && s.samples.len() - n >= MIN_DRIFT_SAMPLES
                && before.median > 0.0
                && after.median > 0.0
            {
                let moved = match apart {
                    true => (after.median / before.median).ln().abs(),
                    false => 0.0,
                };
                let worst = res
                    .drift
                    .entry(self.mode)
                    .or_default()
                    .entry(backend)
                    .or_insert(0.0);
                *worst = worst.max(moved);
            }
        }
        Ok(())
    }

    /// Another round for `backends`, whose samples are in `raw` (`len` as [`Self::round`]).
    fn again(
        &mut self,
        backends: &[Backend],
        len: Option<u32>,
        res: &mut GroupResults,
        raw: &mut Raw,
        progress: &mut dyn FnMut(Progress),
        faults: &mut Vec<String>,
    ) -> Result<(), FabricError> {
        let bytes = self.bytes;
        let cells: Vec<(Backend, Sampled)> = backends
            .iter()
            .filter_map(|b| raw.remove(&(*b, bytes)).map(|s| (*b, s)))
            .collect();
        for (backend, s, summary) in self.round(cells, len, res, progress, faults)? {
            if let Err(e) = timing(backend, &summary) {
                disqualify(res, faults, progress, backend, e.to_string());
            } else {
                raw.insert((backend, bytes), s);
            }
        }
        Ok(())
    }

    /// While the choice hangs on a close call, each side gets another round of samples, in
    /// turn, until it is settled or each side is [`Sampled::done`] as a close call. A
    /// [`Sampled::hopeless`] cell is in no close call the rule could resolve its way.
    pub fn settle(
        &mut self,
        close_calls: CloseCalls,
        res: &mut GroupResults,
        raw: &mut Raw,
        progress: &mut dyn FnMut(Progress),
        faults: &mut Vec<String>,
    ) -> Result<(), FabricError> {
        let (h, mode, bytes) = (&self.plan.harness, self.mode, self.bytes);
        loop {
            let Some(cell) = res.cells.get(&mode).and_then(|m| m.get(&bytes)) else {
                return Ok(());
            };
            let eligible: BTreeMap<Backend, Timing> = cell
                .iter()
                .filter(|(b, _)| !res.disqualified.contains_key(b))
                .map(|(b, t)| (*b, *t))
                .collect();
            let open: Vec<Backend> = close_calls(&eligible)
                .into_iter()
                .filter(|b| {
                    raw.get(&(*b, bytes)).is_some_and(|s| {
                        let rivals = self.rivals(res, *b);
                        !s.hopeless(h, &rivals)
                            && !s.done(&s.summary(), h, &rivals, Stage::CloseCall)
                    })
                })
                .collect();
            if open.is_empty() {
                return Ok(());
            }
            self.again(&open, None, res, raw, progress, faults)?;
        }
    }
}

/// Whether two cells' intervals are within [`Harness::contender_margin`] of each other: a
/// comparison their medians must make from the same moments.
fn contenders(a: &Summary, b: &Summary, h: &super::Harness) -> bool {
    h.contender_margin.is_some_and(|m| {
        let apart = |x: &Summary, y: &Summary| y.ci_low > x.ci_high * (1.0 + m);
        !apart(a, b) && !apart(b, a)
    })
}

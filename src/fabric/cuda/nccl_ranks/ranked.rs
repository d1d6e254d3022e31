//! NCCL in a loopback tune timed with K ranks (issue 48): where the loaded NCCL can put the K
//! virtual ranks on the one GPU ([`super::path`]), NCCL's own choice and every algorithm x
//! protocol pin run as K rank processes sharing GPU 0, one start of them per variant timing
//! every size, with the channels that ran read back from rank 0's profiler summary. These are
//! time slices of processes sharing one GPU, never multi-GPU evidence: [`note`] says so.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::timing::{profiler_env, ran_channels};
use super::{path, run, Launch, RankPath};
use crate::allreduce::Backend;
use crate::fabric::{ChannelTime, FabricError};

/// Timed calls per size, after one untimed.
const ITERS: usize = 20;
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

/// The K-rank timings of one loopback group, per NCCL variant and size.
#[derive(Debug)]
pub struct Ranked {
    exe: PathBuf,
    k: usize,
    /// The sizes every variant's first start times (the tune's grid up to the group's most).
    grid: Vec<u64>,
    times: BTreeMap<(Backend, u64), ChannelTime>,
}

impl Ranked {
    pub fn new(exe: PathBuf, k: usize, grid: Vec<u64>) -> Ranked {
        Ranked {
            exe,
            k,
            grid: grid.into_iter().map(even).collect(),
            times: BTreeMap::new(),
        }
    }

    /// `backend`'s time at `bytes` (µs per call), from its first start over the grid or, for a
    /// size off it, a start at that size alone.
    pub fn time(&mut self, backend: Backend, bytes: u64) -> Result<ChannelTime, FabricError> {
        let b = even(bytes);
        if !self.times.contains_key(&(backend, b)) {
            let first = !self.times.keys().any(|(v, _)| *v == backend);
            let mut sizes = if first { self.grid.clone() } else { Vec::new() };
            sizes.push(b);
            sizes.sort_unstable();
            sizes.dedup();
            self.measure(backend, &sizes)?;
        }
        self.times
            .get(&(backend, b))
            .copied()
            .ok_or_else(|| FabricError::Backend {
                backend,
                reason: format!("rank 0 wrote no time for {b} bytes"),
            })
    }

    /// The most channels NCCL's own choice was seen to run with, once timed.
    pub fn own_channels(&self) -> Option<u32> {
        self.times
            .iter()
            .filter(|((b, _), _)| *b == Backend::Nccl)
            .filter_map(|(_, t)| t.ran_channels)
            .max()
    }

    /// One start of the K ranks for `backend` (NCCL's own where it pins nothing) at `sizes`.
    fn measure(&mut self, backend: Backend, sizes: &[u64]) -> Result<(), FabricError> {
        let fail = |reason: String| FabricError::Backend { backend, reason };
        let dir = tempfile::tempdir().map_err(|e| fail(format!("no directory for ranks: {e}")))?;
        let launch = Launch {
            exe: self.exe.clone(),
            dir: dir.path().to_path_buf(),
            ordinals: vec![0; self.k],
            sizes: sizes.to_vec(),
            iters: ITERS,
            max_ctas: shared_max_ctas(self.k),
            channels: Vec::new(),
            pin: backend.nccl_pin(),
            env: profiler_env(&self.exe, dir.path()),
            limit: LIMIT,
        };
        let times = run(&launch).map_err(|e| fail(format!("{} ranks on GPU 0: {e}", self.k)))?;
        let ran = ran_channels(dir.path());
        for t in times {
            let ran_channels = ran.get(&t.bytes).copied();
            let at = ChannelTime {
                us: t.us,
                ran_channels,
            };
            self.times.insert((backend, t.bytes), at);
        }
        Ok(())
    }
}

/// A size as the ranks call it: even (bf16), at least one element.
fn even(b: u64) -> u64 {
    (b & !1).max(2)
}

#[cfg(test)]
mod tests {
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
    fn own_channels_are_the_most_nccl_s_own_choice_ran() {
        let mut r = Ranked::new("artune".into(), 2, vec![1024]);
        let t = |us, c| ChannelTime {
            us,
            ran_channels: Some(c),
        };
        assert_eq!(r.own_channels(), None);
        r.times.insert((Backend::Nccl, 1024), t(3.0, 2));
        r.times.insert((Backend::Nccl, 1 << 20), t(9.0, 24));
        r.times
            .insert((Backend::NcclRingSimple, 1 << 20), t(8.0, 32));
        assert_eq!(r.own_channels(), Some(24));
        // A size already timed is answered from what ran, with no start of the ranks.
        assert_eq!(r.time(Backend::Nccl, 1 << 20).unwrap(), t(9.0, 24));
        assert_eq!(r.time(Backend::Nccl, 1025).unwrap(), t(3.0, 2));
    }
}

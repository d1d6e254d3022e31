//! The CUDA fabric's timing of a pinned NCCL variant with its run-time channels forced: K rank
//! processes (one per rank of the group, on the GPUs [`super::path`] gives them) each make one
//! communicator with `minCTAs` = `maxCTAs` = the count and `NCCL_ALGO`/`NCCL_PROTO` of the pin,
//! and time every size on the host around a synchronized stream (rank 0's mean per call, µs). The
//! group's own workers stay up meanwhile; the times are compared only with each other. Where
//! libartune.so lies beside the binary it is NCCL's profiler too, and the channels each size
//! ran with are read back from rank 0's summary rather than assumed.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::{path, run, Launch, RankPath, ENV_MULTI_RANK};
use crate::fabric::cuda::nccl;
use crate::fabric::{Backend, ChannelTime, FabricError};
use crate::plugin::audit::{Summary, ENV_DIR as AUDIT_DIR};

/// Timed calls per size, after one untimed.
const ITERS: usize = 20;
/// The ranks of one count: setup and every size's calls, generously.
const LIMIT: Duration = Duration::from_secs(180);

/// Where the ranks of a group with these CUDA `ordinals` (one per rank) run with NCCL
/// `version`, or why they cannot: ranks keep their GPUs where each has its own, else all share
/// the first.
pub fn placement(
    version: i32,
    multi_rank: Option<&str>,
    ordinals: &[usize],
) -> Result<Vec<usize>, String> {
    let mut gpus = ordinals.to_vec();
    gpus.sort_unstable();
    gpus.dedup();
    match path(version, multi_rank, gpus.len(), ordinals.len()) {
        RankPath::PerGpu => Ok(ordinals.to_vec()),
        RankPath::Shared => Ok(vec![ordinals[0]; ordinals.len()]),
        RankPath::Waived(why) => Err(why),
    }
}

/// The timings of `backend` (an NCCL pin) at `sizes` with `channels` forced, on a group
/// whose ranks have CUDA `ordinals`; `exe` is the artune binary.
pub fn at_channels(
    exe: &Path,
    ordinals: &[usize],
    backend: Backend,
    sizes: &[u64],
    channels: u32,
) -> Result<Vec<ChannelTime>, FabricError> {
    let pin = backend
        .nccl_pin()
        .ok_or_else(|| FabricError::BadRequest(format!("{backend} is no NCCL pin")))?;
    let lib = nccl::library().map_err(FabricError::Waived)?;
    if !lib.forces_channels() {
        return Err(FabricError::Waived(format!(
            "NCCL {} has no per-communicator config, which forcing a channel count needs (2.14 \
             or later)",
            nccl::version_string(lib.version)
        )));
    }
    let multi = std::env::var(ENV_MULTI_RANK).ok();
    let ordinals =
        placement(lib.version, multi.as_deref(), ordinals).map_err(FabricError::Waived)?;
    let dir = tempfile::tempdir().map_err(|e| FabricError::Backend {
        backend,
        reason: format!("no directory for the NCCL ranks: {e}"),
    })?;
    // Even sizes (bf16), as the ranks call them; the answer keeps the caller's order.
    let even: Vec<u64> = sizes.iter().map(|&b| (b & !1).max(2)).collect();
    let launch = Launch {
        exe: exe.to_path_buf(),
        dir: dir.path().to_path_buf(),
        ordinals,
        sizes: even.clone(),
        iters: ITERS,
        max_ctas: None,
        channels: Some(channels as i32),
        pin: Some(pin),
        env: crate::plugin::library::beside(exe)
            .map(|lib| {
                vec![
                    ("NCCL_PROFILER_PLUGIN".into(), lib.into()),
                    (AUDIT_DIR.into(), dir.path().into()),
                ]
            })
            .unwrap_or_default(),
        limit: LIMIT,
    };
    let times = run(&launch).map_err(|e| FabricError::Backend {
        backend,
        reason: format!("at {channels} channels: {e}"),
    })?;
    let ran = ran_channels(dir.path());
    even.iter()
        .map(|b| {
            let us = times.iter().find(|(s, _)| s == b)?.1;
            let ran_channels = ran.get(b).copied();
            Some(ChannelTime { us, ran_channels })
        })
        .collect::<Option<Vec<ChannelTime>>>()
        .ok_or_else(|| FabricError::Backend {
            backend,
            reason: format!("rank 0 wrote no time for every size at {channels} channels"),
        })
}

/// Per size, the most channels rank 0's profiler saw a call run with (its summary in `dir`).
pub fn ran_channels(dir: &Path) -> BTreeMap<u64, u32> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for f in rd
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
    {
        let Ok(text) = std::fs::read(f.path()) else {
            continue;
        };
        let Ok(s) = serde_json::from_slice::<Summary>(&text) else {
            continue;
        };
        for r in s.sizes.iter().filter(|_| s.rank == 0) {
            let c = out.entry(r.bytes).or_insert(0);
            *c = r.channels.max(*c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_keep_their_gpus_or_share_the_first_or_say_why_not() {
        assert_eq!(placement(21800, None, &[2, 3]), Ok(vec![2, 3]));
        // Loopback: four virtual ranks on GPU 0.
        assert_eq!(placement(23206, None, &[0, 0, 0, 0]), Ok(vec![0; 4]));
        // Two ranks on GPU 1 and one on GPU 2: three ranks, two GPUs, all on GPU 1.
        assert_eq!(placement(23000, None, &[1, 1, 2]), Ok(vec![1, 1, 1]));
        let why = placement(22907, None, &[0, 0]).unwrap_err();
        assert!(
            why.contains("NCCL 2.29.7 cannot put several ranks"),
            "{why}"
        );
    }

    #[test]
    fn the_channels_read_back_are_rank_0s_most_per_size() {
        let d = tempfile::tempdir().unwrap();
        let rec = |bytes, channels| crate::plugin::audit::SizeRecord {
            bytes,
            channels,
            ran: "RING/SIMPLE".into(),
            ..Default::default()
        };
        let write = |name: &str, rank, sizes| {
            let s = Summary {
                rank,
                sizes,
                ..Default::default()
            };
            std::fs::write(d.path().join(name), serde_json::to_vec(&s).unwrap()).unwrap();
        };
        write(
            "a.json",
            0,
            vec![rec(1024, 2), rec(1024, 4), rec(1 << 20, 8)],
        );
        write("b.json", 1, vec![rec(1024, 16)]);
        let ran = ran_channels(d.path());
        assert_eq!(ran, BTreeMap::from([(1024, 4), (1 << 20, 8)]));
    }
}

//! The CUDA fabric's timing of pinned NCCL variants with their run-time channels forced: K rank
//! processes (one per rank of the group, on the GPUs [`super::path`] gives them) each make one
//! communicator per count in turn with `minCTAs` = `maxCTAs` = the count, and time every size
//! on the host around a synchronized stream (rank 0's mean per call, µs). Where libartune.so
//! lies beside the binary it is NCCL's profiler, so the channels each size ran with are read
//! back from rank 0's summary rather than assumed, and NCCL's tuner, so one start runs every
//! pin, switched per call ([`pins_at_channels`]); else each pin starts its ranks with its
//! `NCCL_ALGO`/`NCCL_PROTO` ([`at_channels`]). The group's own workers stay up meanwhile; the
//! times are compared only with each other.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::switch::ReadBack;
use super::{path, run, Launch, RankPath, ENV_MULTI_RANK};
use crate::fabric::cuda::nccl;
use crate::fabric::cuda::nccl_sweep::count_dir;
use crate::fabric::{Backend, ChannelTime, FabricError, Mode};
use crate::plugin::audit::{Summary, ENV_DIR as AUDIT_DIR};

/// Timed calls per size, after one untimed.
const ITERS: usize = 20;
/// The same where ranks share a GPU: each call takes milliseconds there (4.55-5.11 ms at 2
/// ranks, 13.3-36.0 ms at 4, profiles/hardware/h200/2026-12-04-realnccl), far above the host
/// timer's resolution, and a pin's sweep times every count at every size.
const SHARED_ITERS: usize = 5;
/// The ranks' time per count: setup and every size's calls, generously.
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

/// CTAs seen resident at once from ranks sharing one GPU (2 ranks at NCCL's own 48 channels on
/// the H200 of 2026-12-04; 4 ranks at 48 did not fit): a count whose K ranks need more is not
/// tried there, as every rank's kernel must run at once or the ranks hang.
pub const SHARED_CTAS: u32 = 96;

/// Whether ranks at `placed` (one CUDA ordinal each) share a GPU.
fn shares(placed: &[usize]) -> bool {
    placed.iter().skip(1).any(|&o| o == placed[0])
}

/// Calls timed per size and count for ranks at `placed`.
fn iters(placed: &[usize]) -> usize {
    match shares(placed) {
        true => SHARED_ITERS,
        false => ITERS,
    }
}

/// The counts of `counts` the ranks can run at `placed` (one CUDA ordinal per rank): all where
/// each rank has a GPU of its own, else those whose CTAs fit [`SHARED_CTAS`].
pub fn runnable(placed: &[usize], counts: &[u32]) -> Vec<u32> {
    let shared = shares(placed);
    let k = placed.len() as u32;
    counts
        .iter()
        .copied()
        .filter(|&c| !shared || c * k <= SHARED_CTAS)
        .collect()
}

/// Where a sweep's ranks run and what they can: their CUDA ordinals, the counts they have
/// room for, the calls per size and the `maxCTAs` room ranks sharing a GPU need.
struct Placed {
    ordinals: Vec<usize>,
    counts: Vec<u32>,
    calls: usize,
    room: Option<i32>,
}

/// The placement of a sweep of `counts` for a group with CUDA `ordinals`, or why the loaded
/// NCCL cannot force a count there.
fn placed(ordinals: &[usize], counts: &[u32]) -> Result<Placed, FabricError> {
    let lib = nccl::library().map_err(FabricError::Waived)?;
    if !lib.forces_channels() {
        return Err(FabricError::Waived(format!(
            "NCCL {} takes no CTA bounds (minCTAs, maxCTAs) in a communicator's config, which \
             forcing a channel count needs (2.17 or later)",
            nccl::version_string(lib.version)
        )));
    }
    let multi = std::env::var(ENV_MULTI_RANK).ok();
    let ordinals =
        placement(lib.version, multi.as_deref(), ordinals).map_err(FabricError::Waived)?;
    Ok(Placed {
        counts: runnable(&ordinals, counts),
        calls: iters(&ordinals),
        room: shares(&ordinals)
            .then(|| super::ranked::shared_max_ctas(ordinals.len()))
            .flatten(),
        ordinals,
    })
}

/// The timings of `backend` (an NCCL pin, or NCCL's own choice) at `sizes` with each of
/// `counts` forced (0: NCCL's own count, under the room ranks sharing a GPU need), in one
/// start of the ranks of a group with CUDA `ordinals`, pinned through
/// `NCCL_ALGO`/`NCCL_PROTO`, each sample run as `mode` runs a call (a replay of a CUDA graph
/// of the calls, or host launches); `exe` is the artune binary. Counts the placement has no
/// room for ([`runnable`]) are left out of the answer.
pub fn at_channels(
    exe: &Path,
    ordinals: &[usize],
    backend: Backend,
    sizes: &[u64],
    counts: &[u32],
    mode: Mode,
) -> Result<Vec<(u32, Vec<ChannelTime>)>, FabricError> {
    let pin = match backend {
        Backend::Nccl => None,
        b => Some(
            b.nccl_pin()
                .ok_or_else(|| FabricError::BadRequest(format!("{b} is no NCCL variant")))?,
        ),
    };
    let Placed {
        ordinals,
        counts,
        calls,
        room,
    } = placed(ordinals, counts)?;
    if counts.is_empty() {
        return Ok(Vec::new());
    }
    let dir = tempfile::tempdir().map_err(|e| FabricError::Backend {
        backend,
        reason: format!("no directory for the NCCL ranks: {e}"),
    })?;
    let even = even(sizes);
    let launch = Launch {
        exe: exe.to_path_buf(),
        dir: dir.path().to_path_buf(),
        ordinals,
        sizes: even.clone(),
        iters: calls,
        samples: 1,
        graph: mode == Mode::Graph,
        max_ctas: room,
        channels: counts.iter().map(|&c| forced(c)).collect(),
        pin,
        variants: Vec::new(),
        env: profiler_env(exe, dir.path()),
        limit: LIMIT * counts.len() as u32,
    };
    let times = run(&launch).map_err(|e| FabricError::Backend {
        backend,
        reason: format!("at {counts:?} channels: {e}"),
    })?;
    counts
        .iter()
        .map(|&c| {
            let ran = match forced(c) {
                Some(f) => ran_channels(&count_dir(dir.path(), f)),
                None => ran_channels(dir.path()),
            };
            let at = |b: &u64| {
                let t = times
                    .iter()
                    .find(|t| t.channels == forced(c) && t.bytes == *b)?;
                Some(ChannelTime {
                    us: t.mean(),
                    ran_channels: ran.get(b).copied(),
                    per_call: false,
                })
            };
            let t = even.iter().map(at).collect::<Option<Vec<_>>>();
            t.map(|t| (c, t)).ok_or_else(|| FabricError::Backend {
                backend,
                reason: format!("rank 0 wrote no time for every size at {c} channels"),
            })
        })
        .collect()
}

/// Even sizes (bf16), as the ranks call them; the answer keeps the caller's order.
fn even(sizes: &[u64]) -> Vec<u64> {
    sizes.iter().map(|&b| (b & !1).max(2)).collect()
}

/// [`at_channels`] for every pin of `pins` in one start of the ranks where libartune.so lies
/// beside `exe`: each communicator (one per count) runs every pin in turn, switched per call
/// through the tuner, and each pin's times are kept only where rank 0's profiler saw NCCL run
/// it under its override at every size of every count. A pin NCCL did not run as forced (and
/// every pin where there is no library or the switched start fails) gets a start of its own
/// pinned through the environment, as before.
pub fn pins_at_channels(
    exe: &Path,
    ordinals: &[usize],
    pins: &[Backend],
    sizes: &[u64],
    counts: &[u32],
    mode: Mode,
) -> Vec<crate::fabric::PinChannelTimes> {
    let own = |b: Backend| (b, at_channels(exe, ordinals, b, sizes, counts, mode));
    let switchable: Vec<Backend> = pins.iter().copied().filter(|b| b.is_nccl()).collect();
    let switched = match library_of(exe) {
        Some(lib) if !switchable.is_empty() => {
            switched_at_channels(exe, &lib, ordinals, &switchable, sizes, counts, mode)
        }
        _ => Ok(BTreeMap::new()),
    };
    let mut switched = switched.unwrap_or_else(|e| {
        tracing::warn!(
            "channel sweep: the pins switched by the tuner failed ({e}); each pin starts \
             ranks of its own"
        );
        BTreeMap::new()
    });
    pins.iter()
        .map(|&b| match switched.remove(&b) {
            Some(t) => (b, Ok(t)),
            None => own(b),
        })
        .collect()
}

/// Per count, a pin's time at each size.
type CountTimes = Vec<(u32, Vec<ChannelTime>)>;

/// The switched start of [`pins_at_channels`]: per pin NCCL followed, its answer.
fn switched_at_channels(
    exe: &Path,
    lib: &Path,
    ordinals: &[usize],
    pins: &[Backend],
    sizes: &[u64],
    counts: &[u32],
    mode: Mode,
) -> Result<BTreeMap<Backend, CountTimes>, FabricError> {
    let p = placed(ordinals, counts)?;
    if p.counts.is_empty() {
        return Ok(pins.iter().map(|&b| (b, Vec::new())).collect());
    }
    let dir = tempfile::tempdir().map_err(|e| FabricError::Waived(e.to_string()))?;
    let even = even(sizes);
    let mut env = profiler_env(exe, dir.path());
    env.extend(super::switch::env(lib));
    let launch = Launch {
        exe: exe.to_path_buf(),
        dir: dir.path().to_path_buf(),
        ordinals: p.ordinals,
        sizes: even.clone(),
        iters: p.calls,
        samples: 1,
        graph: mode == Mode::Graph,
        max_ctas: p.room,
        channels: p.counts.iter().map(|&c| forced(c)).collect(),
        pin: None,
        variants: pins.to_vec(),
        env,
        limit: LIMIT * (p.counts.len() * pins.len()) as u32,
    };
    let clock = std::time::Instant::now();
    let times = run(&launch).map_err(|e| FabricError::Waived(e.to_string()))?;
    tracing::info!(
        "channel sweep: {} pins x {} counts x {} sizes in one start of the ranks, {:.2} s",
        pins.len(),
        p.counts.len(),
        even.len(),
        clock.elapsed().as_secs_f64()
    );
    let read: Vec<ReadBack> = (p.counts.iter())
        .map(|&c| match forced(c) {
            Some(f) => ReadBack::read(&count_dir(dir.path(), f)),
            None => ReadBack::read(dir.path()),
        })
        .collect();
    Ok(followed(&times, &read, pins, &p.counts, &even))
}

/// Per pin of a switched start, its times at each of `counts` and `sizes`, where `read` (per
/// count) shows NCCL ran it under its override at every one; a pin it does not is left out,
/// and why is logged.
fn followed(
    times: &[super::Timed],
    read: &[ReadBack],
    pins: &[Backend],
    counts: &[u32],
    sizes: &[u64],
) -> BTreeMap<Backend, CountTimes> {
    let pin_at = |pin: Backend, i: usize, c: u32| -> Result<(u32, Vec<ChannelTime>), String> {
        let at = |b: &u64| {
            let t = (times.iter())
                .find(|t| t.variant == Some(pin) && t.channels == forced(c) && t.bytes == *b)
                .ok_or_else(|| format!("rank 0 wrote no time at {b} bytes"))?;
            let ran = read.get(i).ok_or("no read-back")?.ran(pin, *b)?;
            Ok(ChannelTime {
                us: t.mean(),
                ran_channels: Some(ran),
                per_call: true,
            })
        };
        Ok((c, sizes.iter().map(at).collect::<Result<_, String>>()?))
    };
    let mut out = BTreeMap::new();
    for &pin in pins {
        let timed: Result<Vec<_>, String> = (counts.iter().enumerate())
            .map(|(i, &c)| pin_at(pin, i, c))
            .collect();
        match timed {
            Ok(t) => drop(out.insert(pin, t)),
            Err(why) => tracing::warn!(
                "channel sweep: {pin} is not timed from the tuner's switch ({why}); it starts \
                 ranks of its own pinned through NCCL_ALGO/NCCL_PROTO"
            ),
        }
    }
    out
}

/// The count a communicator is forced to: none for 0, NCCL's own.
fn forced(c: u32) -> Option<i32> {
    (c > 0).then_some(c as i32)
}

/// The libartune.so that belongs with the artune binary `exe` (beside it, or where an
/// installation puts it).
pub fn library_of(exe: &Path) -> Option<std::path::PathBuf> {
    crate::plugin::library::beside(exe.parent()?)
}

/// libartune.so as NCCL's profiler, writing its summaries into `dir`, where it lies beside
/// the binary; nothing where it does not (the channels are then the ones asked for).
pub fn profiler_env(exe: &Path, dir: &Path) -> Vec<(String, std::ffi::OsString)> {
    library_of(exe)
        .map(|lib| {
            vec![
                ("NCCL_PROFILER_PLUGIN".into(), lib.into()),
                (AUDIT_DIR.into(), dir.into()),
            ]
        })
        .unwrap_or_default()
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
    fn ranks_sharing_a_gpu_try_only_the_counts_whose_ctas_fit() {
        let all = [2, 4, 8, 16, 32, 48];
        assert_eq!(
            runnable(&[0, 1, 2, 3], &all),
            all,
            "a GPU each: every count"
        );
        assert_eq!(runnable(&[0, 0], &all), all, "2 x 48 fit (seen)");
        assert_eq!(
            runnable(&[0, 0, 0, 0], &all),
            [2, 4, 8, 16],
            "4 x 48 did not"
        );
        assert_eq!(runnable(&[3], &all), all);
        assert_eq!(
            runnable(&[0, 0, 0, 0], &[0, 32]),
            [0],
            "NCCL's own: under a cap"
        );
        assert_eq!((forced(0), forced(8)), (None, Some(8)));
    }

    #[test]
    fn ranks_sharing_a_gpu_time_fewer_calls_as_each_takes_milliseconds() {
        assert_eq!(iters(&[0, 0]), SHARED_ITERS);
        assert_eq!(iters(&[0, 1]), ITERS);
        const { assert!(SHARED_ITERS < ITERS) };
    }

    /// The profiler is the library beside the binary itself (not inside a folder named
    /// like it), and nothing is set where there is none.
    #[test]
    fn the_profiler_is_the_library_beside_the_binary() {
        let d = tempfile::tempdir().unwrap();
        let exe = d.path().join("artune");
        std::fs::write(&exe, b"").unwrap();
        assert!(profiler_env(&exe, d.path()).is_empty());
        std::fs::write(d.path().join("libartune.so"), b"").unwrap();
        let env = profiler_env(&exe, d.path());
        let lib = d.path().join("libartune.so").canonicalize().unwrap();
        assert_eq!(env[0], ("NCCL_PROFILER_PLUGIN".into(), lib.into()));
        assert_eq!(env[1], (AUDIT_DIR.into(), d.path().into()));
    }

    /// A pin of the switched sweep keeps its times where, at every count, rank 0's profiler
    /// saw NCCL run it under its override; one NCCL ran otherwise at one count is left out
    /// (it gets a start of its own), never answered with the other variant's times.
    #[test]
    fn a_switched_sweep_keeps_only_the_pins_nccl_ran_as_forced() {
        use crate::plugin::audit::SizeRecord;
        let d = tempfile::tempdir().unwrap();
        let rec = |forced: &str, ran: &str, channels| SizeRecord {
            bytes: 1024,
            ran: ran.into(),
            channels,
            forced: Some(forced.into()),
            ..Default::default()
        };
        let write = |dir: &Path, sizes| {
            std::fs::create_dir_all(dir).unwrap();
            let s = Summary {
                rank: 0,
                sizes,
                ..Default::default()
            };
            std::fs::write(dir.join("a-r0.json"), serde_json::to_vec(&s).unwrap()).unwrap();
        };
        write(
            &count_dir(d.path(), 2),
            vec![rec("RING/LL", "RING/LL", 2), rec("TREE/LL", "TREE/LL", 2)],
        );
        write(
            &count_dir(d.path(), 4),
            vec![rec("RING/LL", "RING/LL", 3), rec("TREE/LL", "RING/LL", 4)],
        );
        let read = [2, 4].map(|c| ReadBack::read(&count_dir(d.path(), c)));
        let t = |v, channels, us| super::super::Timed {
            channels: Some(channels),
            variant: Some(v),
            bytes: 1024,
            samples: vec![us],
        };
        let (ring, tree) = (Backend::NcclRingLl, Backend::NcclTreeLl);
        let times = [
            t(ring, 2, 5.0),
            t(tree, 2, 6.0),
            t(ring, 4, 4.0),
            t(tree, 4, 3.0),
        ];
        let got = followed(&times, &read, &[ring, tree], &[2, 4], &[1024]);
        let ch = |us, c| ChannelTime {
            us,
            ran_channels: Some(c),
            per_call: true,
        };
        assert_eq!(
            got,
            BTreeMap::from([(ring, vec![(2, vec![ch(5.0, 2)]), (4, vec![ch(4.0, 3)])])])
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

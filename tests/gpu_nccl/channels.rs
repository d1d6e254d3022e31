//! A pinned NCCL variant timed with its run-time channels forced, in rank processes of their
//! own (nccl_ranks::timing): one GPU each where there are two, else both on GPU 0 (NCCL 2.30+),
//! and the channels each size ran with read back through NCCL's profiler.

use super::super::{bin, skip, GPU};
use artune::fabric::cuda::nccl;
use artune::fabric::cuda::nccl_ranks::timing;
use artune::fabric::{Backend, Mode};

#[test]
fn gpu_nccl_times_a_pin_at_forced_channels_and_reads_back_what_ran() {
    let _guard = GPU.lock().unwrap_or_else(|p| p.into_inner());
    let test = "gpu_nccl_times_a_pin_at_forced_channels";
    let gpus = artune::fabric::cuda::visible_gpus();
    let lib = match (gpus, nccl::library()) {
        (0, _) => return skip(format!("{test}: skipped: no GPU")),
        (_, Err(e)) => return skip(format!("{test}: skipped: no NCCL ({e})")),
        (_, Ok(lib)) => lib,
    };
    let ordinals = if gpus >= 2 { vec![0, 1] } else { vec![0, 0] };
    let multi = std::env::var(artune::fabric::cuda::nccl_ranks::ENV_MULTI_RANK).ok();
    if let Err(why) = timing::placement(lib.version, multi.as_deref(), &ordinals) {
        return skip(format!("{test}: skipped: {why}"));
    }
    let profiler = timing::library_of(&bin()).is_some();
    let sizes = [64 << 10, 16 << 20];
    // Both counts in one start of the ranks, one communicator each, replayed from graphs as a
    // graph group's sweep runs them.
    let all = timing::at_channels(
        &bin(),
        &ordinals,
        Backend::NcclRingSimple,
        &sizes,
        &[2, 8],
        Mode::Graph,
    )
    .unwrap_or_else(|e| panic!("{test}: {e}"));
    assert_eq!(all.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [2, 8]);
    for (channels, t) in all {
        println!("ring/simple, {channels} channels forced, ranks on {ordinals:?}: {t:?}");
        assert_eq!(t.len(), sizes.len());
        assert!(t.iter().all(|t| t.us.is_finite() && t.us > 0.0), "{t:?}");
        if !profiler {
            skip(format!(
                "{test}: read-back skipped: no libartune.so beside {:?}",
                bin()
            ));
            continue;
        }
        // NCCL spreads a small message over fewer channels, never more than forced; 16 MiB
        // fills all of them.
        assert!(
            t.iter()
                .all(|t| t.ran_channels.is_some_and(|c| c <= channels)),
            "{t:?}"
        );
        assert_eq!(t[1].ran_channels, Some(channels), "{t:?}");
    }
}

/// A loopback tune's NCCL with K ranks on GPU 0 (NCCL 2.30+, multi-rank allowed): the pins are
/// ready, not waived, the description says the timings are one GPU's, and NCCL's own channels
/// are read back; with an older NCCL the pins are waived with what is needed.
#[test]
fn gpu_loopback_times_nccl_with_k_ranks_or_waives_saying_what_is_needed() {
    use artune::fabric::{Dtype, Fabric, Group, Mode, Readiness};
    let test = "gpu_loopback_times_nccl_with_k_ranks";
    let lib = match (artune::fabric::cuda::visible_gpus(), nccl::library()) {
        (0, _) => return skip(format!("{test}: skipped: no GPU")),
        (_, Err(e)) => return skip(format!("{test}: skipped: no NCCL ({e})")),
        (_, Ok(lib)) => lib,
    };
    let _guard = GPU.lock().unwrap_or_else(|p| p.into_inner());
    let mut f = artune::fabric::cuda::CudaFabric::open_with(Some(2), bin())
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let g = Group::flat(vec![0, 1], Dtype::Bf16, 1 << 20);
    let r = f
        .prepare(&g, &[Backend::Nccl, Backend::NcclRingSimple])
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    println!(
        "NCCL {}: {}; {r:?}",
        nccl::version_string(lib.version),
        f.info().description
    );
    let pin = &r[1];
    let multi = std::env::var(artune::fabric::cuda::nccl_ranks::ENV_MULTI_RANK).ok();
    let ranked =
        artune::fabric::cuda::nccl_ranks::ranked::loopback(lib.version, multi.as_deref(), 2);
    match ranked {
        Ok(()) => {
            assert!(matches!(pin, Readiness::Ready { .. }), "{pin:?}");
            let line = f.info().description;
            assert!(line.contains("not multi-GPU evidence"), "{line}");
            // The run's script says whether it started MPS: the line must say the same.
            match std::env::var("ARTUNE_EXPECT_MPS").as_deref() {
                Ok("1") => assert!(line.contains("sharing GPU 0 under MPS"), "{line}"),
                Ok("0") => assert!(line.contains("sharing GPU 0 by time slices"), "{line}"),
                _ => {}
            }
            let t = f
                .time(Backend::NcclRingSimple, 1 << 16, Mode::Eager, 1, 3)
                .unwrap();
            assert!(t.iter().all(|&us| us.is_finite() && us > 0.0), "{t:?}");
            if timing::library_of(&bin()).is_some() {
                assert!(f.nccl_channels().is_some(), "NCCL's own channels read back");
            }
        }
        Err(why) => assert!(
            matches!(pin, Readiness::Waived { reason, .. } if reason.contains(&why)),
            "{pin:?}"
        ),
    }
    f.release().unwrap();
}

/// The K-rank NCCL of a loopback tune in samples, as every backend is timed: several per size
/// with a spread (not one mean repeated), in eager mode and as replays of a CUDA graph each rank
/// captured, and a pin verified by the ranks' own sums.
#[test]
fn gpu_loopback_k_rank_nccl_is_sampled_in_both_modes_and_its_pin_verified() {
    use artune::fabric::{Dtype, Fabric, Group, Mode, Verification};
    let test = "gpu_loopback_k_rank_nccl_is_sampled";
    let lib = match (artune::fabric::cuda::visible_gpus(), nccl::library()) {
        (0, _) => return skip(format!("{test}: skipped: no GPU")),
        (_, Err(e)) => return skip(format!("{test}: skipped: no NCCL ({e})")),
        (_, Ok(lib)) => lib,
    };
    let multi = std::env::var(artune::fabric::cuda::nccl_ranks::ENV_MULTI_RANK).ok();
    let ranked =
        artune::fabric::cuda::nccl_ranks::ranked::loopback(lib.version, multi.as_deref(), 2);
    if let Err(why) = ranked {
        return skip(format!("{test}: skipped: {why}"));
    }
    let _guard = GPU.lock().unwrap_or_else(|p| p.into_inner());
    let mut f = artune::fabric::cuda::CudaFabric::open_with(Some(2), bin())
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let g = Group::flat(vec![0, 1], Dtype::Bf16, 1 << 20);
    let pin = Backend::NcclRingSimple;
    f.prepare(&g, &[Backend::Nccl, pin])
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    for mode in [Mode::Eager, Mode::Graph] {
        for b in [Backend::Nccl, pin] {
            let t = f
                .time(b, 1 << 16, mode, 1, 12)
                .unwrap_or_else(|e| panic!("{test}: {b} {mode:?}: {e}"));
            println!("{b} {mode:?} 64K, 2 ranks on GPU 0, µs per call: {t:?}");
            assert_eq!(t.len(), 12);
            assert!(t.iter().all(|&us| us.is_finite() && us > 0.0), "{t:?}");
            let (lo, hi) = t
                .iter()
                .fold((f64::MAX, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
            assert!(hi > lo, "samples with no spread: {t:?}");
        }
    }
    // Says whether graph mode's NCCL samples came from graph replays or eager stand-ins.
    println!("{test}: fabric: {}", f.info().description);
    // 768K is off the grid: a start of its own checks it.
    for bytes in [1 << 16, 3 << 18] {
        let v = f
            .verify(pin, bytes, 7)
            .unwrap_or_else(|e| panic!("{test}: {e}"));
        assert_eq!(v, Verification::Correct, "{pin} at {bytes} bytes");
    }
    f.release().unwrap();
}

//! A pinned NCCL variant timed with its run-time channels forced, in rank processes of their
//! own (nccl_ranks::timing): one GPU each where there are two, else both on GPU 0 (NCCL 2.30+),
//! and the channels each size ran with read back through NCCL's profiler.

use super::super::{bin, skip, GPU};
use artune::fabric::cuda::nccl;
use artune::fabric::cuda::nccl_ranks::timing;
use artune::fabric::Backend;

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
    let profiler = artune::plugin::library::beside(&bin()).is_some();
    let sizes = [64 << 10, 16 << 20];
    for channels in [2u32, 8] {
        let t = timing::at_channels(&bin(), &ordinals, Backend::NcclRingSimple, &sizes, channels)
            .unwrap_or_else(|e| panic!("{test}: {channels} channels: {e}"));
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

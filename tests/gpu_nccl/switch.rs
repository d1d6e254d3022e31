//! NCCL's variant switched per call through artune's tuner (issue 48): K ranks on GPU 0 start
//! once per mode for every variant, and what NCCL ran under each switch is read back from rank
//! 0's profiler. Needs NCCL 2.30+ (multi-rank on one GPU) and libartune.so beside the binary.
//! Loopback: the ranks share one GPU, so nothing here is multi-GPU evidence.

use super::super::{bin, skip, GPU};
use artune::fabric::cuda::nccl;
use artune::fabric::cuda::nccl_ranks::{ranked, timing};
use artune::fabric::{Backend, Mode};

/// The K ranks can switch variants here, or why not (the skip line).
fn switchable(test: &str) -> Result<(), String> {
    let lib = match (artune::fabric::cuda::visible_gpus(), nccl::library()) {
        (0, _) => return Err(format!("{test}: skipped: no GPU")),
        (_, Err(e)) => return Err(format!("{test}: skipped: no NCCL ({e})")),
        (_, Ok(lib)) => lib,
    };
    let multi = std::env::var(artune::fabric::cuda::nccl_ranks::ENV_MULTI_RANK).ok();
    ranked::loopback(lib.version, multi.as_deref(), 2)
        .map_err(|why| format!("{test}: skipped: {why}"))?;
    match timing::library_of(&bin()) {
        Some(_) => Ok(()),
        None => Err(format!(
            "{test}: skipped: no libartune.so beside {}",
            bin().display()
        )),
    }
}

/// Every NCCL variant timed by 2 ranks on GPU 0 in both modes: one start per mode after the
/// prime, plus two per variant NCCL did not run under its switch (read back, said and printed,
/// never timed as the pin). NCCL's own choice and the ring pins must follow: tuner v7 moved a
/// size from Ring/LL to Ring/Simple on NCCL 2.32.6 (2026-12-04).
#[test]
fn gpu_loopback_switches_every_variant_per_call_and_reads_each_back() {
    let test = "gpu_loopback_switches_every_variant_per_call";
    if let Err(line) = switchable(test) {
        return skip(line);
    }
    let _guard = GPU.lock().unwrap_or_else(|p| p.into_inner());
    let variants: Vec<Backend> = Backend::ALL.into_iter().filter(|b| b.is_nccl()).collect();
    let sizes = [64 << 10, 128 << 10];
    let mut r = ranked::Ranked::new(bin(), 2, sizes.to_vec(), variants.clone());
    r.prime(Backend::Nccl, Mode::Eager)
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    for mode in [Mode::Eager, Mode::Graph] {
        for &v in &variants {
            let t = r
                .time(v, sizes[0], mode, 3)
                .unwrap_or_else(|e| panic!("{test}: {v} {mode:?}: {e}"));
            assert!(t.iter().all(|&us| us.is_finite() && us > 0.0), "{t:?}");
            println!("{test}: {v} {mode:?} 64K: {t:?} us");
        }
    }
    for &v in &variants {
        match r.unfollowed().get(&v) {
            Some(why) => println!("{test}: {v}: NOT followed under the switch: {why}"),
            None => println!(
                "{test}: {v}: followed; channels NCCL ran at 64K {:?}, 128K {:?}",
                r.ran_channels(v, sizes[0]),
                r.ran_channels(v, sizes[1])
            ),
        }
    }
    let stood = r.stand_in_note();
    println!(
        "{test}: {} starts of the 2 ranks for {} variants in 2 modes ({} not followed; graph \
         stood in by eager: {stood:?})",
        r.starts(),
        variants.len(),
        r.unfollowed().len()
    );
    for v in [Backend::Nccl, Backend::NcclRingLl, Backend::NcclRingSimple] {
        assert!(
            !r.unfollowed().contains_key(&v),
            "{v}: {:?}",
            r.unfollowed()
        );
        assert!(r.ran_channels(v, sizes[0]).is_some(), "{v} read back");
    }
    let expected = 3 + 2 * r.unfollowed().len() + usize::from(stood.is_some());
    assert_eq!(r.starts(), expected);
}

/// The channel sweep's pins in one start of the ranks, each count set per call through the
/// tuner as the plugin sets a profile's, and read back per pin: never more than set, all of
/// them at 16 MiB.
#[test]
fn gpu_nccl_sweeps_every_pin_in_one_start_and_reads_each_back() {
    let test = "gpu_nccl_sweeps_every_pin_in_one_start";
    if let Err(line) = switchable(test) {
        return skip(line);
    }
    let _guard = GPU.lock().unwrap_or_else(|p| p.into_inner());
    let gpus = artune::fabric::cuda::visible_gpus();
    let ordinals = if gpus >= 2 { vec![0, 1] } else { vec![0, 0] };
    let pins = [Backend::NcclRingSimple, Backend::NcclRingLl];
    let sizes = [64 << 10, 16 << 20];
    // Host launches here, as an eager group's sweep runs them (channels.rs replays graphs).
    let all = timing::pins_at_channels(&bin(), &ordinals, &pins, &sizes, &[2, 8], Mode::Eager);
    for (pin, t) in all {
        let t = t.unwrap_or_else(|e| panic!("{test}: {pin}: {e}"));
        assert_eq!(t.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [2, 8]);
        for (channels, t) in t {
            println!("{test}: {pin}, {channels} channels forced, ranks on {ordinals:?}: {t:?}");
            assert!(
                t.iter().all(|t| t.us > 0.0
                    && t.per_call
                    && t.ran_channels.is_some_and(|c| c <= channels)),
                "{t:?}"
            );
            if pin == Backend::NcclRingSimple {
                assert_eq!(t[1].ran_channels, Some(channels), "{t:?}");
            }
        }
    }
}

use super::*;

const NVRTC13: [i32; 12] = [75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121];

#[test]
fn arch_string_comes_from_compute_capability() {
    assert_eq!(
        target_for((9, 0), &NVRTC13),
        Some(Target::Cubin("sm_90".into()))
    );
    assert_eq!(
        target_for((12, 1), &NVRTC13),
        Some(Target::Cubin("sm_121".into()))
    );
    assert_eq!(
        target_for((7, 5), &NVRTC13),
        Some(Target::Cubin("sm_75".into()))
    );
    assert_eq!(
        target_for((9, 0), &NVRTC13).unwrap().option(),
        "--gpu-architecture=sm_90"
    );
}

#[test]
fn newer_gpu_than_nvrtc_gets_ptx_for_the_closest_older_arch() {
    assert_eq!(
        target_for((13, 0), &NVRTC13),
        Some(Target::Ptx("compute_121".into()))
    );
    assert_eq!(
        target_for((10, 1), &NVRTC13),
        Some(Target::Ptx("compute_100".into()))
    );
    assert_eq!(target_for((7, 0), &NVRTC13), None);
}

#[test]
fn a_cached_image_is_named_by_all_that_makes_it_and_stored_whole() {
    let dir = tempfile::tempdir().unwrap();
    let t90 = Target::Cubin("sm_90".into());
    let a = cache_file(dir.path(), (13, 0), "probe.cu", PROBE, &t90);
    assert_eq!(a, cache_file(dir.path(), (13, 0), "probe.cu", PROBE, &t90));
    assert_ne!(a, cache_file(dir.path(), (13, 1), "probe.cu", PROBE, &t90));
    assert_ne!(a, cache_file(dir.path(), (13, 0), "probe.cu", "x", &t90));
    let t80 = Target::Cubin("sm_80".into());
    assert_ne!(a, cache_file(dir.path(), (13, 0), "probe.cu", PROBE, &t80));
    assert!(a.to_string_lossy().ends_with(".cubin"), "{a:?}");
    // A stored image is read back instead of compiling (no NVRTC is needed here).
    let sub = dir.path().join("kernels");
    let file = cache_file(&sub, (13, 0), "probe.cu", PROBE, &t90);
    let key = file.file_name().unwrap().to_string_lossy().into_owned();
    store(&sub, &file, &seal(b"image", &key)).unwrap();
    let img = compile_cached(Some(&sub), (13, 0), "probe.cu", PROBE, &t90).unwrap();
    assert_eq!(img, b"image");
    let names: Vec<_> = std::fs::read_dir(&sub).unwrap().collect();
    assert_eq!(names.len(), 1, "no temporary file is left: {names:?}");
}

#[test]
fn the_record_names_the_source_and_the_image_apart() {
    let t90 = Target::Cubin("sm_90".into());
    let r = record((13, 0), &t90, &[("allreduce.cu", ALLREDUCE, b"image")]);
    assert_eq!((r.nvrtc.as_str(), r.target.as_str()), ("13.0", "sm_90"));
    let p = &r.programs[0];
    assert_eq!(p.program, "allreduce.cu");
    // sha256("image")
    assert_eq!(
        p.image_sha256,
        "6105d6cc76af400325e94d588ce511be5bfdbb73b437dc51eca43917d7a43e3d"
    );
    let other_image = record((13, 0), &t90, &[("allreduce.cu", ALLREDUCE, b"imagf")]);
    assert_eq!(other_image.programs[0].source_sha256, p.source_sha256);
    assert_ne!(other_image.programs[0].image_sha256, p.image_sha256);
    let other_source = record((13, 0), &t90, &[("allreduce.cu", PROBE, b"image")]);
    assert_ne!(other_source.programs[0].source_sha256, p.source_sha256);
    // The options are part of what NVRTC is handed: another target is another source.
    let t80 = Target::Cubin("sm_80".into());
    let other_target = record((13, 0), &t80, &[("allreduce.cu", ALLREDUCE, b"image")]);
    assert_ne!(other_target.programs[0].source_sha256, p.source_sha256);
    assert_eq!(
        record((12, 8), &Target::Ptx("compute_90".into()), &[]).target,
        "compute_90"
    );
}

#[test]
fn a_command_compiles_its_types_units_and_records_what_an_engine_loading_all_records() {
    let names =
        |d: &[Dtype]| -> Vec<&str> { units_for(d).iter().map(|u| u.name.as_str()).collect() };
    let bf16 = names(&[Dtype::Bf16]);
    assert_eq!(bf16.len(), 8, "{bf16:?}");
    assert!(bf16.contains(&"probe.cu") && bf16.contains(&"check.cu"));
    assert!(
        bf16.iter()
            .all(|n| !n.contains("fp16") && !n.contains("fp32")),
        "{bf16:?}"
    );
    // Another type brings its own units and the recorded type's.
    let fp16 = names(&[Dtype::Fp16]);
    assert!(fp16.contains(&"allreduce-ar_ll-fp16.cu") && fp16.contains(&"ce_sum-bf16.cu"));
    assert!(!fp16.iter().any(|n| n.contains("fp32")), "{fp16:?}");
    assert_eq!(units_for(&Dtype::ALL).len(), units().len());
    // Every program keeps a unit whatever the types, so each is recorded.
    for (program, _) in PROGRAMS {
        assert!(units_for(&[Dtype::Fp32])
            .iter()
            .any(|u| u.program == program));
    }
    // The record: the same for one type's units as for all of them (an engine's op loads
    // all and checks the tune's record), and it changes with a recorded unit's image.
    let t = Target::Cubin("sm_90".into());
    let fake = |us: Vec<&'static CompileUnit>, odd: Option<&str>| {
        let imgs: Vec<Vec<u8>> = (us.iter())
            .map(|u| match Some(u.name.as_str()) == odd {
                true => b"other".to_vec(),
                false => format!("image of {}", u.name).into_bytes(),
            })
            .collect();
        let loaded: Vec<(&CompileUnit, &[u8])> = us
            .iter()
            .copied()
            .zip(imgs.iter().map(Vec::as_slice))
            .collect();
        record_units((13, 0), &t, &loaded)
    };
    let all = fake(units_for(&Dtype::ALL), None);
    assert_eq!(all.programs.len(), PROGRAMS.len());
    for d in Dtype::ALL {
        assert_eq!(fake(units_for(&[d]), None), all, "{d:?}");
    }
    let changed = fake(units_for(&Dtype::ALL), Some("allreduce-ar_ll-bf16.cu"));
    assert_ne!(
        changed.programs[0].image_sha256,
        all.programs[0].image_sha256
    );
    assert_eq!(changed.programs[1..], all.programs[1..]);
}

#[test]
fn a_corrupt_truncated_or_foreign_cache_file_is_refused() {
    let img = b"\x7fELF an image of some length".to_vec();
    let good = seal(&img, "probe-00.cubin");
    assert_eq!(unseal(&good, "probe-00.cubin").unwrap(), &img[..]);
    // Truncated anywhere, including inside the header.
    for cut in [0, 5, MAGIC.len() + 3, good.len() - 40, good.len() - 1] {
        assert!(unseal(&good[..cut], "probe-00.cubin").is_err(), "cut {cut}");
    }
    // One flipped byte of the image.
    let mut bad = good.clone();
    *bad.last_mut().unwrap() ^= 1;
    assert_eq!(
        unseal(&bad, "probe-00.cubin").unwrap_err(),
        "its contents do not match their checksum"
    );
    // Random bytes, a bare image as older artune wrote, another key, padding.
    assert!(unseal(b"random bytes here", "probe-00.cubin").is_err());
    assert!(unseal(&img, "probe-00.cubin").is_err());
    assert!(unseal(&good, "probe-01.cubin").is_err());
    let mut long = good.clone();
    long.push(0);
    assert!(unseal(&long, "probe-00.cubin").is_err());
}

#[test]
fn a_program_splits_into_one_unit_per_instantiation_line() {
    let names: Vec<&str> = units().iter().map(|u| u.name.as_str()).collect();
    let mut want = Vec::new();
    for part in ["ar_pull", "ar_push", "ar_ll"] {
        want.extend(Dtype::ALL.map(|d| format!("allreduce-{part}-{}.cu", d.id())));
    }
    want.extend(["probe.cu".to_string(), "check.cu".into()]);
    for part in ["island_two_shot", "island_one_shot"] {
        want.extend(Dtype::ALL.map(|d| format!("island-{part}-{}.cu", d.id())));
    }
    want.extend(Dtype::ALL.map(|d| format!("ce_sum-{}.cu", d.id())));
    assert_eq!(names, want);
    // Each unit instantiates one line only, and together a program's units instantiate what
    // the whole program did: every line of it is in some unit, each instantiation in one.
    for u in units() {
        let lines: Vec<_> = u.src.lines().filter_map(instantiation).collect();
        assert!(lines.len() <= 1, "{}: {lines:?}", u.name);
    }
    for (program, src) in [("allreduce", ALLREDUCE), ("island", ISLAND)] {
        let mine: Vec<_> = (units().iter())
            .filter(|u| u.name.starts_with(&format!("{program}-")))
            .collect();
        for line in src.lines() {
            let holding = mine
                .iter()
                .filter(|u| u.src.lines().any(|l| l == line))
                .count();
            match instantiation(line) {
                Some(_) => assert_eq!(holding, 1, "{line}"),
                None => assert_eq!(holding, mine.len(), "{line}"),
            }
        }
    }
    // A program with no such lines is compiled whole.
    assert_eq!(instantiating(PROBE, ("K", Dtype::Bf16)), None);
    let tiny = "int x;\nK(Bf16, bf16)\nK(Fp32, fp32)\nL(Fp32, fp32)\n";
    assert_eq!(
        instantiating(tiny, ("K", Dtype::Fp32)).unwrap(),
        "int x;\nK(Fp32, fp32)\n"
    );
}

#[test]
fn sources_are_embedded() {
    assert!(
        ALLREDUCE.contains("one_stage_pull_bf16")
            || ALLREDUCE.contains("AR_PULL_KERNELS(Bf16, bf16)")
    );
    assert!(PROBE.contains("latch_wait"));
    assert!(COMMON.contains("struct ArArgs"));
}

/// Every kernel unit compiles for the architectures artune meets, without a GPU: NVRTC alone
/// (a pip wheel, `nvidia-cuda-nvrtc`) is enough. Skips, saying so, where libnvrtc is absent.
#[test]
fn every_unit_compiles_without_a_gpu() {
    if !nvrtc_present() {
        eprintln!("skipped: libnvrtc not found (LD_LIBRARY_PATH); kernels not compiled here");
        return;
    }
    let archs = supported_archs().unwrap();
    for cc in [(8, 0), (9, 0), (12, 0)] {
        let Some(t) = target_for(cc, &archs) else {
            continue;
        };
        for u in units() {
            let img = compile(&u.name, &u.src, &t)
                .unwrap_or_else(|e| panic!("{} for {t:?}: {e}", u.name));
            assert!(!img.is_empty(), "{} for {t:?}", u.name);
        }
    }
}

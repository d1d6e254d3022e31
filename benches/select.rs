//! Per-call cost of what engines call on their hot path: `Profile::select` and the C ABI's
//! `artune_select` (target ≤ 20 ns) and the NCCL tuner plugin's getCollInfo (target ≤ 200 ns).
//!
//! The profile is the synthetic sample (labelled simulated) on 8 PCIe GPUs with TP 2, 4, 8 in
//! both modes and 81 buckets per group (1 KiB to 1 GiB, 4 per octave: more than a default tune's
//! powers of two from 1K to 256M); sizes cycle through 64 values spread over that range.
//!
//!     cargo bench --bench select

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};

use artune::capi;
use artune::export::sample;
use artune::fabric::Mode;
use artune::plugin::abi::{get_coll_info, ncclTunerPlugin_v6};
use artune::plugin::{Context, NCCL_FUNC_ALLREDUCE};
use artune::profile::Query;

fn sizes() -> Vec<u64> {
    (0..=80)
        .map(|i| ((1024.0f64) * 2f64.powf(i as f64 / 4.0)).round() as u64)
        .collect()
}

fn messages() -> Vec<u64> {
    (0..64u64).map(|i| 1000 + i * i * i * 4000).collect()
}

fn bench(c: &mut Criterion) {
    let p = sample::profile_with("pcie-8x-2switch", &[2, 4, 8], &sizes());
    let msgs = messages();
    let q = Query {
        tp: 8,
        mode: Mode::Graph,
        gpus: None,
    };

    c.bench_function("Profile::select (TP8 graph, 81 buckets, 6 groups)", |b| {
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 1) & 63;
            black_box(p.select(black_box(q), black_box(msgs[i])))
        })
    });

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profile.json");
    p.write_atomic(&path).unwrap();
    let cpath = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let mut h = std::ptr::null_mut();
    assert_eq!(
        unsafe { capi::artune_profile_open(cpath.as_ptr(), &mut h) },
        capi::ARTUNE_OK
    );
    let mut sel = capi::ArtuneSelection {
        backend: std::ptr::null(),
        backend_code: -1,
        simulated: 0,
        expected_us: 0.0,
        bucket_bytes: 0,
        buffer_bytes: 0,
    };
    c.bench_function("artune_select (C ABI, flattened tables)", |b| {
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 1) & 63;
            unsafe {
                capi::artune_select(h, 8, capi::ARTUNE_MODE_GRAPH, black_box(msgs[i]), &mut sel)
            }
        })
    });
    unsafe { capi::artune_profile_close(h) };

    let ctx = Box::into_raw(Box::new(
        Context::from_profile(&p, 8, 1, Mode::Graph, None).unwrap(),
    ));
    let mut table = [[25.0f32; 3]; 7];
    let mut channels = 0;
    c.bench_function("plugin getCollInfo (v6 symbol, allreduce)", |b| {
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 1) & 63;
            unsafe {
                (ncclTunerPlugin_v6.get_coll_info)(
                    ctx.cast(),
                    NCCL_FUNC_ALLREDUCE,
                    black_box(msgs[i] as usize),
                    1,
                    table.as_mut_ptr().cast(),
                    7,
                    3,
                    0,
                    &mut channels,
                )
            }
        })
    });
    c.bench_function("plugin getCollInfo (direct call, allreduce)", |b| {
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 1) & 63;
            unsafe {
                get_coll_info(
                    ctx.cast(),
                    NCCL_FUNC_ALLREDUCE,
                    black_box(msgs[i] as usize),
                    1,
                    table.as_mut_ptr().cast(),
                    7,
                    3,
                    0,
                    &mut channels,
                )
            }
        })
    });
    unsafe { drop(Box::from_raw(ctx)) };
}

criterion_group!(benches, bench);
criterion_main!(benches);

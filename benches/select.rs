//! Per-call cost of what engines call on their hot path: `Profile::select` and the C ABI's
//! `artune_select` (target ≤ 20 ns) and the NCCL tuner plugin's getCollInfo (target ≤ 200 ns).
//!
//! The profile is the synthetic sample (labelled simulated) on 8 PCIe GPUs with TP 2, 4, 8 in
//! both modes and 81 buckets per group (1 KiB to 1 GiB, 4 per octave: more than a default tune's
//! powers of two from 1K to 256M); sizes cycle through 64 values spread over that range.
//!
//! Time is the benchmark thread's CPU time (CLOCK_THREAD_CPUTIME_ID), not wall time: on a shared
//! machine wall time also counts the slices other processes run on this core.
//!
//!     cargo bench --bench select

use std::hint::black_box;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{criterion_group, criterion_main, Criterion};

use artune::capi;
use artune::export::sample;
use artune::fabric::Mode;
use artune::plugin::abi::{get_coll_info, ncclTunerPlugin_v6};
use artune::plugin::{Context, NCCL_FUNC_ALLREDUCE};
use artune::profile::Query;

/// The calling thread's CPU time in nanoseconds.
struct ThreadCpu;

fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

static WALL: WallTime = WallTime;

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns() - start
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Values are nanoseconds, as wall time's are.
        WALL.formatter()
    }
}

fn sizes() -> Vec<u64> {
    (0..=80)
        .map(|i| ((1024.0f64) * 2f64.powf(i as f64 / 4.0)).round() as u64)
        .collect()
}

fn messages() -> Vec<u64> {
    (0..64u64).map(|i| 1000 + i * i * i * 4000).collect()
}

fn bench(c: &mut Criterion<ThreadCpu>) {
    let p = sample::profile_with("pcie-8x-2switch", &[2, 4, 8], &sizes());
    let msgs = messages();
    let q = Query {
        tp: 8,
        mode: Mode::Graph,
        gpus: None,
    };

    let sel = p.selector();
    c.bench_function("Selector::select (TP8 graph, 81 buckets, 6 groups)", |b| {
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 1) & 63;
            black_box(sel.select(black_box(q), black_box(msgs[i])))
        })
    });

    c.bench_function("Profile::group alone (the lookup inside select)", |b| {
        b.iter(|| black_box(p.group(black_box(q))).is_some())
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
        fallback: std::ptr::null(),
        fallback_code: -1,
    };
    c.bench_function("artune_select (C ABI)", |b| {
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

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = bench
}
criterion_main!(benches);

//! Tests of the CUDA fabric. They need an NVIDIA GPU (NVRTC, NCCL for some); without one each
//! prints a `skipped: ...` line saying why and returns, so `cargo test` passes anywhere and the
//! output shows what did not run. Run them on a GPU with `--nocapture` to see every line.

mod common;
mod gpu_nccl;

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use artune::allreduce::Executor;
use artune::fabric::cuda::{compile, nccl, CudaFabric};
use artune::fabric::{
    Backend, Direction, Directions, Dtype, Fabric, Group, Mode, Readiness, Verification,
};

/// The flat custom backends: every entry of the backend table artune's data plane runs on this
/// fabric that works on the whole group (the island schedules need islands; see [`islands`]).
fn custom() -> Vec<Backend> {
    Backend::ALL
        .into_iter()
        .filter(|b| runs(*b) && !b.is_hierarchical())
        .collect()
}

/// Whether `b` is one of artune's SM kernels, which these tests share (the copy-engine rows
/// have tests of their own: [`copy_rows`]).
fn runs(b: Backend) -> bool {
    match b.executor() {
        Executor::Nccl | Executor::CopyEngine(_) => false,
        Executor::SmKernel => true,
    }
}

/// The copy-engine rows (run by default: `ARTUNE_COPY_ENGINE=0` switches them off).
fn copy_rows() -> Vec<Backend> {
    Backend::ALL
        .into_iter()
        .filter(|b| matches!(b.executor(), Executor::CopyEngine(_)))
        .collect()
}
const DTYPES: [Dtype; 3] = [Dtype::Bf16, Dtype::Fp16, Dtype::Fp32];
/// Element counts: tiny, around one 16-byte vector, and odd counts that leave tails.
const ELEMS: [u64; 9] = [1, 3, 7, 8, 9, 1000, 4099, 65536, 262_147];

/// A skip line `cargo test` shows without `--nocapture` (the harness captures `println!`).
fn skip(line: String) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// GPU tests run one at a time: two loopback fabrics spinning on one GPU at once could each
/// keep the other's blocks from being resident.
static GPU: Mutex<()> = Mutex::new(());

/// The artune binary workers run: `ARTUNE_BIN` (where the tests run on another machine than
/// the one that built them), else the one cargo built.
fn bin() -> PathBuf {
    std::env::var_os("ARTUNE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_artune")))
}

/// The artune binary, dying with the test (see tests/common).
fn artune() -> Command {
    common::dies_with_test(bin())
}

/// Worker processes of `bin()` still running (a test asserts none is left behind).
fn live_workers() -> Vec<String> {
    let me = bin().display().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains("__worker") && cmd.contains(&me) {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            // A zombie is gone already, waiting only to be reaped.
            if !stat.contains(") Z ") {
                out.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
            }
        }
    }
    out
}

fn open_or_skip(test: &str, k: usize) -> Option<(MutexGuard<'static, ()>, CudaFabric)> {
    let guard = GPU.lock().unwrap_or_else(|p| p.into_inner());
    // With RUST_LOG set, the coordinator's and the workers' lines (a hang shows where it is).
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    // Skipped only when CUDA sees no GPU at all; on a GPU machine a failing open fails.
    if artune::fabric::cuda::visible_gpus() == 0 {
        skip(format!(
            "{test}: skipped: no GPU (no driver, or it sees no device)"
        ));
        return None;
    }
    match CudaFabric::open_with(Some(k), bin()) {
        Ok(f) => Some((guard, f)),
        Err(e) => panic!("{test}: a GPU is present but opening the CUDA fabric failed: {e}"),
    }
}

fn group(k: usize, dtype: Dtype, max_bytes: u64) -> Group {
    Group::flat((0..k).collect(), dtype, max_bytes)
}

/// The island schedules (every hierarchical entry of the backend table).
fn islands() -> Vec<Backend> {
    Backend::ALL
        .into_iter()
        .filter(|b| runs(*b) && b.is_hierarchical())
        .collect()
}

/// A loopback group of `k` ranks in virtual islands of `sizes`.
fn island_group(k: usize, dtype: Dtype, max_bytes: u64, sizes: &[usize]) -> Group {
    let mut g = group(k, dtype, max_bytes);
    g.islands = artune::plan::given_islands(&g.gpus, sizes);
    assert!(g.islands.is_ok(), "{:?}", g.islands);
    g
}

/// Every way the two kinds of phase can move data.
fn orientations() -> Vec<Directions> {
    let mut out = Vec::new();
    for inside in [Direction::Read, Direction::Write] {
        for across in [Direction::Read, Direction::Write] {
            out.push(Directions {
                inside,
                across,
                because: "a test".into(),
            });
        }
    }
    out
}

fn all_ready(r: &[Readiness]) {
    for x in r {
        if let Readiness::Waived { backend, reason } = x {
            panic!("{backend} was waived: {reason}");
        }
    }
}

fn correct(v: Verification, what: &str) {
    if let Verification::Wrong { reason } = v {
        panic!("{what}: {reason}");
    }
}

#[test]
fn nvrtc_compiles_the_kernel_sources_or_skips_without_nvrtc() {
    if !compile::nvrtc_present() {
        skip("nvrtc_compiles_the_kernel_sources: skipped: no NVRTC (libnvrtc.so not found)".into());
        return;
    }
    let archs = compile::supported_archs().unwrap();
    let mut done = Vec::new();
    for want in [75, 80, 86, 89, 90, 100, 120] {
        if !archs.contains(&want) {
            continue;
        }
        let t = compile::Target::Cubin(format!("sm_{want}"));
        for u in compile::units() {
            let name = &u.name;
            let img = compile::compile(name, &u.src, &t).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                img.len() > 1000,
                "{name} for sm_{want} is only {} bytes",
                img.len()
            );
        }
        done.push(want);
    }
    println!(
        "nvrtc compiled kernels/*.cu for sm_{done:?} (NVRTC {:?})",
        compile::nvrtc_version().unwrap()
    );
    assert!(!done.is_empty());
    let err = compile::compile(
        "broken.cu",
        "this is not CUDA;",
        &compile::Target::Cubin(format!("sm_{}", archs[0])),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("--gpu-architecture=sm_") && msg.contains("error"),
        "{msg}"
    );
}

#[test]
fn no_gpu_error_suggests_sim_or_skips_when_a_gpu_is_present() {
    let _gpu = GPU.lock().unwrap_or_else(|p| p.into_inner());
    match CudaFabric::open_with(None, bin()) {
        Ok(f) => skip(format!(
            "no_gpu_error_suggests_sim: skipped: a GPU is present ({})",
            f.info().description
        )),
        Err(e) => assert!(e.to_string().contains("--sim"), "{e}"),
    }
}

#[test]
fn gpu_loopback_describes_itself_or_skips_without_gpu() {
    let Some((_gpu, f)) = open_or_skip("gpu_loopback_describes_itself", 8) else {
        return;
    };
    let info = f.info();
    println!("{}; kernels: {:?}", info.description, f.kernel_target());
    assert!(!info.simulated);
    assert!(
        info.description
            .contains("8 virtual ranks in 8 worker processes")
            && (info.description.contains("NCCL with 1 rank")
                || info.description.contains("8 rank processes sharing GPU 0")),
        "{}",
        info.description
    );
    let t = f.topology();
    assert_eq!(t.gpu_count(), 8);
    assert!(t.notes.iter().any(|n| n.starts_with("loopback")));
    assert!(matches!(
        CudaFabric::open_with(Some(1), bin()),
        Err(artune::fabric::FabricError::BadRequest(_))
    ));
}

#[test]
fn gpu_custom_kernels_verify_bit_exactly_in_loopback_2_4_8_or_skip() {
    for k in [2, 4, 8] {
        let Some((_gpu, mut f)) = open_or_skip("gpu_custom_kernels_verify_bit_exactly", k) else {
            return;
        };
        for dtype in DTYPES {
            let max = ELEMS.iter().max().unwrap() * dtype.size();
            all_ready(&f.prepare(&group(k, dtype, max), &custom()).unwrap());
            for b in custom() {
                for (i, e) in ELEMS.iter().enumerate() {
                    let bytes = e * dtype.size();
                    let v = f.verify(b, bytes, 1000 + i as u64).unwrap();
                    correct(v, &format!("K={k} {b} {} {bytes} bytes", dtype.id()));
                }
            }
        }
        println!(
            "K={k}: 4 kernels x 3 dtypes x {} sizes verified bit-exactly",
            ELEMS.len()
        );
    }
}

#[test]
fn gpu_island_kernels_verify_bit_exactly_in_virtual_islands_or_skip() {
    // Loopback islands are virtual (one GPU): this exercises the three-phase protocol, its
    // subset barriers and flags, and every pull/push combination, not a multi-GPU fabric.
    for (k, sizes) in [(4, vec![2, 2]), (8, vec![4, 4]), (8, vec![2, 2, 2, 2])] {
        let Some((_gpu, mut f)) = open_or_skip("gpu_island_kernels_verify_bit_exactly", k) else {
            return;
        };
        for dtype in DTYPES {
            let max = ELEMS.iter().max().unwrap() * dtype.size();
            all_ready(
                &f.prepare(&island_group(k, dtype, max, &sizes), &islands())
                    .unwrap(),
            );
            for d in orientations() {
                f.orient(&d).unwrap();
                for b in islands() {
                    for (i, e) in ELEMS.iter().enumerate() {
                        let bytes = e * dtype.size();
                        let v = f.verify(b, bytes, 2000 + i as u64).unwrap();
                        correct(
                            v,
                            &format!(
                                "K={k} islands {sizes:?} {b} {} {bytes} bytes, inside {:?} across {:?}",
                                dtype.id(),
                                d.inside,
                                d.across
                            ),
                        );
                    }
                }
            }
        }
        println!(
            "K={k} islands {sizes:?}: {} island kernels x 3 dtypes x 4 orientations x {} sizes verified bit-exactly",
            islands().len(),
            ELEMS.len()
        );
    }
}

#[test]
fn gpu_island_kernels_replay_in_graphs_and_across_worker_processes_or_skip() {
    let Some((gpu, mut f)) = open_or_skip("gpu_island_kernels_replay", 8) else {
        return;
    };
    let max = 4 << 20;
    all_ready(
        &f.prepare(&island_group(8, Dtype::Bf16, max, &[4, 4]), &islands())
            .unwrap(),
    );
    let mut seed = 1;
    for d in orientations() {
        f.orient(&d).unwrap();
        for b in islands() {
            for bytes in [4096u64, 4098, 1 << 20, max] {
                eprintln!(
                    "{b} at {bytes}, inside {:?} across {:?}",
                    d.inside, d.across
                );
                seed += 1;
                correct(
                    f.verify_with(b, bytes, seed, Mode::Eager, 25).unwrap(),
                    &format!("{b} eager x25 at {bytes} ({d:?})"),
                );
                let t = f.time(b, bytes, Mode::Graph, 50, 3).unwrap();
                assert!(t.iter().all(|x| x.is_finite() && *x > 0.0), "{t:?}");
                seed += 1;
                correct(
                    f.verify_with(b, bytes, seed, Mode::Graph, 10).unwrap(),
                    &format!("{b} graph x10 replayed at {bytes} ({d:?})"),
                );
            }
        }
    }
    // The real-machine path: each worker process opens the others' handles by IPC and
    // launches only its own rank.
    // The GPU's lock goes with the first fabric: open_or_skip takes it again.
    drop(f);
    drop(gpu);
    let Some((_gpu, mut f)) = open_or_skip("gpu_island_kernels_each_rank", 4) else {
        return;
    };
    f.set_launch_each(true);
    all_ready(
        &f.prepare(&island_group(4, Dtype::Fp32, 64 << 10, &[2, 2]), &islands())
            .unwrap(),
    );
    for d in orientations() {
        f.orient(&d).unwrap();
        for b in islands() {
            // 4 KiB takes the LL kernel where the backend has one.
            for bytes in [4096u64, 64 << 10] {
                eprintln!("{b} at {bytes}, each rank launched by its own process ({d:?})");
                correct(
                    f.verify_with(b, bytes, 7, Mode::Eager, 3).unwrap(),
                    &format!("{b} at {bytes} with one launching process per rank ({d:?})"),
                );
            }
        }
    }
    println!(
        "island kernels: eager x25, graph replays and timing in 8 ranks; each-rank launches in 4"
    );
}

#[test]
fn gpu_repeated_calls_and_graph_replay_stay_correct_or_skip() {
    let Some((_gpu, mut f)) = open_or_skip("gpu_repeated_calls_and_graph_replay", 8) else {
        return;
    };
    let max = 4 << 20;
    all_ready(&f.prepare(&group(8, Dtype::Bf16, max), &custom()).unwrap());
    let mut seed = 1;
    for b in custom() {
        for bytes in [4096u64, 4098, 1 << 20, max] {
            seed += 1;
            correct(
                f.verify_with(b, bytes, seed, Mode::Eager, 25).unwrap(),
                &format!("{b} eager x25 at {bytes}"),
            );
            let t = f.time(b, bytes, Mode::Graph, 50, 3).unwrap();
            assert!(t.iter().all(|x| x.is_finite() && *x > 0.0), "{t:?}");
            seed += 1;
            correct(
                f.verify_with(b, bytes, seed, Mode::Graph, 10).unwrap(),
                &format!("{b} graph x10 replayed at {bytes}"),
            );
            let t = f.time(b, bytes, Mode::Eager, 20, 3).unwrap();
            assert!(t.iter().all(|x| x.is_finite() && *x > 0.0), "{t:?}");
            seed += 1;
            correct(
                f.verify(b, bytes, seed).unwrap(),
                &format!("{b} after timing at {bytes}"),
            );
        }
    }
    println!("repeated eager calls, graph replays and timing loops kept all 4 kernels correct");
}

/// Graph replays in loopback 2 and 4 (8 is above): the registered forms, which read their slot
/// before waiting for the previous call, and the one-stage kernels, which read their status
/// for fail_safe before their last barrier (kernels/allreduce.cu), give the same bits as the
/// staged form, replay after replay, back to back; and at 4 KiB one-stage push's LL form.
/// Sizes with a tail, at 4 KiB (LL forms, one-stage pull's registered form) and past 1 MiB.
#[test]
fn gpu_flat_kernels_replay_bit_exactly_in_graphs_in_loopback_2_and_4_or_skip() {
    for k in [2, 4] {
        let Some((_gpu, mut f)) = open_or_skip("gpu_flat_kernels_replay_bit_exactly", k) else {
            return;
        };
        let max = (1 << 20) + 6;
        all_ready(&f.prepare(&group(k, Dtype::Bf16, max), &custom()).unwrap());
        let mut seed = 77;
        for b in custom() {
            for bytes in [4098u64, max] {
                seed += 1;
                correct(
                    f.verify_with(b, bytes, seed, Mode::Graph, 10).unwrap(),
                    &format!("K={k} {b} graph x10 replayed at {bytes}"),
                );
            }
        }
    }
    println!(
        "K=2, 4: every flat kernel replayed x10 in graphs bit-exactly at 4098 B and 1 MiB + 6"
    );
}

/// One-stage push's LL form zeroes no line it read (kernels/allreduce.cu one_stage_push_ll):
/// calls whose sizes shrink and grow within its LL range leave the lines of earlier calls in
/// blocks that sat out, and each call, checked alone on fresh data, must take none of them.
/// Loopback 8 and 2, eager and replayed in a graph, sizes with a partial last block.
#[test]
fn gpu_one_stage_push_ll_takes_no_stale_line_as_sizes_change_or_skip() {
    for k in [8, 2] {
        let Some((_gpu, mut f)) = open_or_skip("gpu_one_stage_push_ll_takes_no_stale_line", k)
        else {
            return;
        };
        let b = Backend::OneStagePush;
        all_ready(&f.prepare(&group(k, Dtype::Bf16, 32 << 10), &[b]).unwrap());
        let mut seed = 500;
        for bytes in [32u64 << 10, 4098, 32 << 10, 16390, 2, 24576, 4096, 32 << 10] {
            seed += 1;
            correct(
                f.verify_with(b, bytes, seed, Mode::Eager, 1).unwrap(),
                &format!("K={k} {b} eager at {bytes}"),
            );
            seed += 1;
            correct(
                f.verify_with(b, bytes, seed, Mode::Graph, 3).unwrap(),
                &format!("K={k} {b} graph x3 at {bytes}"),
            );
        }
    }
    println!("K=8, 2: one_stage_push's LL form bit-exact as its size shrank and grew");
}

#[test]
fn gpu_copy_engine_rows_verify_bit_exactly_in_loopback_eager_and_graph_or_skip() {
    // Loopback: every rank on one GPU, so every copy is device-to-device on its copy engines
    // and the flags' peers share the stream; this checks the plans, the sum and the flags.
    let flat = [(2, vec![2]), (4, vec![4]), (8, vec![8])];
    let islands = [(4, vec![2, 2]), (8, vec![4, 4]), (8, vec![2, 2, 2, 2])];
    for (k, sizes) in flat.into_iter().chain(islands) {
        let Some((_gpu, mut f)) = open_or_skip("gpu_copy_engine_rows_verify_bit_exactly", k) else {
            return;
        };
        let rows: Vec<Backend> = copy_rows()
            .into_iter()
            .filter(|b| b.is_hierarchical() == (sizes.len() > 1))
            .collect();
        for dtype in DTYPES {
            let max = ELEMS.iter().max().unwrap() * dtype.size();
            let g = match sizes.len() {
                1 => group(k, dtype, max),
                _ => island_group(k, dtype, max, &sizes),
            };
            all_ready(&f.prepare(&g, &rows).unwrap());
            for &b in &rows {
                for (i, e) in ELEMS.iter().enumerate() {
                    let bytes = e * dtype.size();
                    let what = format!("K={k} {sizes:?} {b} {} {bytes} bytes", dtype.id());
                    correct(f.verify(b, bytes, 3000 + i as u64).unwrap(), &what);
                    let v = f.verify_with(b, bytes, 4000 + i as u64, Mode::Graph, 3);
                    correct(v.unwrap(), &format!("{what}, a graph of 3 replayed"));
                }
            }
        }
        println!(
            "K={k} {sizes:?}: {rows:?} x 3 dtypes x {} sizes bit-exact, eager and graph",
            ELEMS.len()
        );
    }
}

#[test]
fn gpu_copy_engine_rows_time_in_loopback_or_skip() {
    for (sizes, b) in [
        (vec![8], Backend::TwoStageCopy),
        (vec![4, 4], Backend::IslandTwoShotCopy),
    ] {
        let Some((_gpu, mut f)) = open_or_skip("gpu_copy_engine_rows_time", 8) else {
            return;
        };
        let max = 16 << 20;
        let g = match sizes.len() {
            1 => group(8, Dtype::Bf16, max),
            _ => island_group(8, Dtype::Bf16, max, &sizes),
        };
        all_ready(&f.prepare(&g, &[b]).unwrap());
        for bytes in [4096u64, max] {
            for mode in [Mode::Eager, Mode::Graph] {
                let t = f.time(b, bytes, mode, 10, 3).unwrap();
                assert!(t.iter().all(|x| x.is_finite() && *x > 0.0), "{t:?}");
                println!("K=8 {sizes:?} {b} {bytes} bytes {mode:?}: {t:?} us per call");
            }
            correct(
                f.verify(b, bytes, 77).unwrap(),
                &format!("{b} after timing at {bytes}"),
            );
        }
    }
}

#[test]
fn gpu_copy_engine_rows_across_worker_processes_verify_and_replay_or_skip() {
    // One process per rank: each stream waits on flags its peers' copy engines write across
    // processes (IPC), the path of a real machine; in loopback the peers share one GPU.
    for (k, sizes) in [(4, vec![4]), (4, vec![2, 2])] {
        let Some((_gpu, mut f)) = open_or_skip("gpu_copy_engine_rows_across_workers", k) else {
            return;
        };
        f.set_launch_each(true);
        let rows: Vec<Backend> = copy_rows()
            .into_iter()
            .filter(|b| b.is_hierarchical() == (sizes.len() > 1))
            .collect();
        let max = 1 << 20;
        let g = match sizes.len() {
            1 => group(k, Dtype::Bf16, max),
            _ => island_group(k, Dtype::Bf16, max, &sizes),
        };
        all_ready(&f.prepare(&g, &rows).unwrap());
        for &b in &rows {
            for (i, bytes) in [4096u64, 4098, max].into_iter().enumerate() {
                let what = format!("{b} {sizes:?} {bytes} bytes, a process per rank");
                let v = f.verify_with(b, bytes, 50 + i as u64, Mode::Eager, 5);
                correct(v.unwrap(), &format!("{what}, 5 eager calls"));
                let v = f.verify_with(b, bytes, 60 + i as u64, Mode::Graph, 5);
                correct(v.unwrap(), &format!("{what}, a graph of 5 replayed"));
            }
            let t = f.time(b, max, Mode::Graph, 5, 3).unwrap();
            assert!(t.iter().all(|x| x.is_finite() && *x > 0.0), "{t:?}");
            println!("{b} {sizes:?}, a process per rank: verified, graph samples {t:?} us");
        }
    }
}

#[test]
fn gpu_nccl_one_rank_allreduce_verifies_or_skip() {
    let Some((_gpu, mut f)) = open_or_skip("gpu_nccl_one_rank_allreduce", 2) else {
        return;
    };
    for dtype in DTYPES {
        let r = f
            .prepare(
                &group(2, dtype, 1 << 20),
                &[Backend::Nccl, Backend::NcclRingLl],
            )
            .unwrap();
        if let Readiness::Waived { reason, .. } = &r[0] {
            // Skipped only when the NCCL library cannot be loaded; any other waiver of plain
            // NCCL on a GPU is the GPU path failing.
            if let Err(e) = nccl::library() {
                skip(format!(
                    "gpu_nccl_one_rank_allreduce: skipped: NCCL cannot be loaded ({e})"
                ));
                return;
            }
            panic!("NCCL loads but plain nccl was waived on one GPU: {reason}");
        }
        assert!(matches!(&r[1], Readiness::Waived { reason, .. } if reason.contains("one rank")));
        for e in [1u64, 7, 4096, 100_003] {
            let bytes = e * dtype.size();
            correct(
                f.verify(Backend::Nccl, bytes, e).unwrap(),
                &format!("nccl {} {bytes}", dtype.id()),
            );
        }
        let t = f.time(Backend::Nccl, 4096, Mode::Graph, 20, 3).unwrap();
        assert!(t.iter().all(|x| x.is_finite() && *x > 0.0));
        correct(
            f.verify_with(Backend::Nccl, 4096, 9, Mode::Graph, 5)
                .unwrap(),
            "nccl graph",
        );
    }
    println!(
        "NCCL {:?} with one rank verified (bf16, fp16, fp32)",
        nccl::nccl_version()
    );
}

#[test]
fn gpu_memory_is_measured_beside_the_model_or_skip() {
    let Some((_gpu, mut f)) = open_or_skip("gpu_memory_is_measured", 8) else {
        return;
    };
    let max = 64 << 20;
    let r = f
        .prepare(
            &island_group(8, Dtype::Bf16, max, &[4, 4]),
            &[custom().as_slice(), &islands(), &[Backend::Nccl]].concat(),
        )
        .unwrap();
    for x in &r {
        match x {
            Readiness::Ready { backend, memory } => {
                println!(
                    "{backend}: measured {} bytes per GPU, modelled {}",
                    memory.bytes_per_gpu, memory.modelled_bytes_per_gpu
                );
                assert!(memory.measured);
                if backend.is_custom() {
                    let ratio = memory.bytes_per_gpu as f64 / memory.modelled_bytes_per_gpu as f64;
                    assert!(
                        (0.5..1.5).contains(&ratio),
                        "{backend}: measured/modelled = {ratio}"
                    );
                }
            }
            Readiness::Waived { backend, reason } => {
                assert!(!runs(*backend), "{backend} waived: {reason}");
                println!("{backend}: waived ({reason})");
            }
        }
    }
}

#[test]
fn gpu_contention_probe_and_link_reading_or_skip() {
    let Some((_gpu, mut f)) = open_or_skip("gpu_contention_probe", 4) else {
        return;
    };
    f.prepare(&group(4, Dtype::Bf16, 1 << 20), &[Backend::OneStagePull])
        .unwrap();
    // A small probe first, so the 16 MiB one grows the probe buffers while every launcher
    // maps the small ones: close on every peer, acknowledge, then free (with
    // ARTUNE_LOOPBACK_LAUNCH=each, across processes as on real GPUs).
    let small = f
        .probe(artune::fabric::Direction::Read, 3, 1 << 20)
        .unwrap();
    assert!(small.per_gpu_gbps.is_finite() && small.per_gpu_gbps > 0.0);
    for dir in [
        artune::fabric::Direction::Read,
        artune::fabric::Direction::Write,
    ] {
        for peers in 1..4 {
            let s = f.probe(dir, peers, 16 << 20).unwrap();
            println!(
                "probe {dir:?} peers={peers}: {:.0} GB/s per rank, {:.0} GB/s in all",
                s.per_gpu_gbps, s.aggregate_gbps
            );
            assert!(s.per_gpu_gbps.is_finite() && s.per_gpu_gbps > 0.0);
            assert!(s.aggregate_gbps >= s.per_gpu_gbps * 0.99);
        }
    }
    assert!(f
        .probe(artune::fabric::Direction::Read, 4, 1 << 20)
        .is_err());
    let links = f.link_under_load().unwrap();
    println!("links read under load: {links:?}");
    assert_eq!(links.len(), 1);
}

#[test]
fn gpu_workers_are_processes_sharing_buffers_by_ipc_and_leave_nothing_behind_or_skip() {
    let Some((_gpu, mut f)) = open_or_skip("gpu_workers_are_processes", 4) else {
        return;
    };
    let pids = f.worker_pids();
    assert_eq!(pids.len(), 4, "{pids:?}");
    let mut uniq = pids.clone();
    uniq.sort_unstable();
    uniq.dedup();
    assert_eq!(uniq.len(), 4);
    assert!(!pids.contains(&std::process::id()));
    all_ready(
        &f.prepare(&group(4, Dtype::Bf16, 1 << 20), &custom())
            .unwrap(),
    );
    for b in custom() {
        correct(
            f.verify(b, 1 << 20, 5).unwrap(),
            &format!("{b} through 4 processes"),
        );
    }
    drop(f);
    let left = live_workers();
    assert!(left.is_empty(), "workers left running: {left:?}");
    println!("4 worker processes {pids:?} verified the 4 kernels over IPC handles and exited");
}

#[test]
fn gpu_each_worker_launching_its_own_rank_verifies_or_skip() {
    // The real-machine path on one GPU: every worker opens the others' handles and launches
    // only its own rank (the GPU time-slices between the processes: correct, not fast).
    let Some((_gpu, mut f)) = open_or_skip("gpu_each_worker_launching_its_own_rank", 2) else {
        return;
    };
    f.set_launch_each(true);
    all_ready(
        &f.prepare(&group(2, Dtype::Fp32, 64 << 10), &custom())
            .unwrap(),
    );
    for b in custom() {
        for bytes in [4096u64, 64 << 10] {
            correct(
                f.verify_with(b, bytes, 11, Mode::Eager, 3).unwrap(),
                &format!("{b} {bytes} with one launching process per rank"),
            );
        }
    }
    let t = f.time(custom()[0], 4096, Mode::Eager, 2, 3).unwrap();
    assert!(t.iter().all(|x| x.is_finite() && *x > 0.0), "{t:?}");
    println!("each of 2 workers launched its own rank: 4 kernels verified, samples {t:?} us");
}

/// Runs a small loopback tune through the binary with the CUDA fault knob set.
fn faulty_tune(faults: &str, out: &std::path::Path) -> std::process::Output {
    faulty_tune_at(faults, "4K:16K", out)
}

/// A loopback tune with `faults` that must end 0, leave `backend` out and keep two_stage_push,
/// with no worker left running: the group and the reason the profile gives for `backend`.
fn tune_leaving_out(
    faults: &str,
    out: &std::path::Path,
    backend: Backend,
) -> (artune::profile::GroupProfile, String) {
    let o = faulty_tune(faults, out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{faults}: {err}");
    let p: artune::profile::Profile =
        serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
    let g = p.groups.into_iter().next().unwrap();
    let why = g
        .waived
        .get(&backend)
        .unwrap_or_else(|| panic!("{faults}: {backend} kept: {err}"))
        .clone();
    assert!(g
        .buckets
        .iter()
        .any(|b| b.results.contains_key(&Backend::TwoStagePush)));
    let left = live_workers();
    assert!(left.is_empty(), "{faults}: workers left running: {left:?}");
    (g, why)
}

fn faulty_tune_at(faults: &str, sizes: &str, out: &std::path::Path) -> std::process::Output {
    artune()
        .args([
            "tune",
            "--loopback",
            "2",
            "--sizes",
            sizes,
            "--mode",
            "graph",
            "--out",
        ])
        .arg(out)
        .env("ARTUNE_CUDA_FAULTS", faults)
        .env("ARTUNE_GPU_DEADLINE_MS", "1500")
        .output()
        .expect("artune runs")
}

#[test]
fn gpu_a_copy_peer_that_never_arrives_fails_only_its_backend_or_skip() {
    // Rank 1 of two_stage_copy never arrives: rank 0's stream waits on its flags until the
    // deadline, the worker writes its inboxes from the host, the stream drains, and the
    // backend is left out without the GPU being marked stuck (no worker replaced).
    let Some((_gpu, f)) = open_or_skip("gpu_a_copy_peer_that_never_arrives", 2) else {
        return;
    };
    drop(f);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let (_, why) = tune_leaving_out("absent=two_stage_copy:1", &out, Backend::TwoStageCopy);
    assert!(!why.contains("fresh ones"), "{why}");
    println!("absent=two_stage_copy:1: tune exit 0; two_stage_copy left out: {why}");
}

/// The environment variable naming the rank a child of the op's copy test runs.
const OP_RANK: &str = "ARTUNE_TEST_OP_RANK";

#[test]
fn gpu_an_op_copy_call_whose_peer_never_arrives_is_nan_within_the_deadline_or_skip() {
    // The engine's op (the pyo3 module's Op), two ranks in two processes on one GPU, rank 1
    // absent (the fault knob): rank 0's call waits on rank 1's flags until the op's watchdog
    // releases it, and ends NaN with the fault word set; a later call is NaN at once.
    absent_peer(
        "gpu_an_op_copy_call_whose_peer_never_arrives_is_nan_within_the_deadline_or_skip",
        "absent=two_stage_copy:1",
        65536,
    );
}

#[test]
fn gpu_an_op_ll_call_whose_peer_never_arrives_is_nan_after_its_timeout_or_skip() {
    // The same with one_stage_push's LL form (4 KiB): rank 0's polls give up after the
    // kernels' barrier timeout, its output NaN and the fault word set; the next call finds its
    // status set at the start (its polls give up at their first timer check): NaN at once.
    absent_peer(
        "gpu_an_op_ll_call_whose_peer_never_arrives_is_nan_after_its_timeout_or_skip",
        "absent=one_stage_push:1",
        1024,
    );
}

/// Runs `test` (this binary's test of that name) as two ranks in two processes with `faults`,
/// the backend's calls at `elems` fp32 elements ([`op_rank`]).
fn absent_peer(test: &str, faults: &str, elems: u64) {
    if let (Ok(r), Some(dir)) = (
        std::env::var(OP_RANK),
        std::env::var_os("ARTUNE_TEST_OP_DIR"),
    ) {
        return op_rank(r.parse().unwrap(), std::path::Path::new(&dir), elems);
    }
    let _gpu = GPU.lock().unwrap_or_else(|p| p.into_inner());
    if artune::fabric::cuda::visible_gpus() == 0 {
        return skip(format!(
            "{test}: skipped: no GPU (no driver, or it sees no device)"
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..2)
        .map(|r| {
            Command::new(std::env::current_exe().unwrap())
                .args([test, "--exact", "--nocapture", "--test-threads=1"])
                .env(OP_RANK, r.to_string())
                .env("ARTUNE_TEST_OP_DIR", dir.path())
                .env("ARTUNE_CUDA_FAULTS", faults)
                .spawn()
                .unwrap()
        })
        .collect();
    for (r, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "rank {r}: {:?}", out.status);
    }
}

/// One rank of an absent-peer test: publishes its handles in `dir`, connects to the other's,
/// and (rank 0) runs the calls of the fault knob's backend; rank 1 never queues anything and
/// keeps its buffers until rank 0 is done. A copy call is released by the op's watchdog after
/// its deadline, a kernel's wait gives up after the kernels' barrier timeout (5 s).
fn op_rank(rank: usize, dir: &std::path::Path, elems: u64) {
    use artune::fabric::cuda::copy::watch::{DEADLINE, POLL};
    use artune::fabric::cuda::op::{Call, Op, RankBuffers};
    use cudarc::driver::{result, sys};
    use std::time::{Duration, Instant};
    let wait_for = |name: &str| {
        let t = Instant::now();
        while !dir.join(name).exists() {
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "rank {rank}: no {name}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let b = artune::fabric::cuda::WorkerFaults::from_env()
        .absent
        .unwrap()
        .0;
    let copy = matches!(b.executor(), artune::allreduce::Executor::CopyEngine(_));
    let released = match copy {
        true => DEADLINE - POLL,
        false => Duration::from_secs(5),
    };
    let mut op = Op::open(0).unwrap();
    let mine = op
        .allocate(rank, 2, 2, Dtype::Fp32, &[(b, elems * 4)], None)
        .unwrap();
    let tmp = dir.join(format!("tmp{rank}"));
    std::fs::write(&tmp, serde_json::to_vec(&mine).unwrap()).unwrap();
    std::fs::rename(&tmp, dir.join(format!("rank{rank}"))).unwrap();
    let mut all: Vec<RankBuffers> = Vec::new();
    for r in 0..2 {
        wait_for(&format!("rank{r}"));
        let bytes = std::fs::read(dir.join(format!("rank{r}"))).unwrap();
        all.push(serde_json::from_slice(&bytes).unwrap());
    }
    op.connect(&all).unwrap();
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    ctx.bind_to_thread().unwrap();
    let bytes = (elems * 4) as usize;
    // SAFETY: plain allocations of the bound context, freed below after the stream drained.
    let (input, output) = unsafe { (result::malloc_sync(bytes), result::malloc_sync(bytes)) };
    let (input, output) = (input.unwrap(), output.unwrap());
    let ones = vec![1.0f32; elems as usize];
    // SAFETY: `input` holds `bytes` bytes.
    unsafe { result::memcpy_htod_sync(input, &ones) }.unwrap();
    let stream = result::stream::create(result::stream::StreamKind::NonBlocking).unwrap();
    let call = Call {
        backend: b,
        input,
        output,
        elems,
    };
    // SAFETY: the tensors hold `elems` elements, stay allocated until the stream drained
    // (polled in `run`), and do not overlap; `stream` is a stream of the primary context.
    let launch = |op: &mut Op| unsafe { op.launch(call, stream as u64, 1, false) }.unwrap();
    // What `enqueue` queues, timed to the end of its stream's work; the output read back.
    let run = |enqueue: &mut dyn FnMut()| {
        let t = Instant::now();
        enqueue();
        loop {
            // SAFETY: a live stream.
            match unsafe { sys::cuStreamQuery(stream) } {
                sys::CUresult::CUDA_SUCCESS => break,
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                e => panic!("rank {rank}: the stream failed: {e:?}"),
            }
            assert!(
                t.elapsed() < DEADLINE + Duration::from_secs(10),
                "rank {rank}: the call still waits after {:?}",
                t.elapsed()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut got = vec![0f32; elems as usize];
        // SAFETY: `output` holds `bytes` bytes; the stream that wrote it is idle.
        unsafe { result::memcpy_dtoh_sync(&mut got, output) }.unwrap();
        (t.elapsed(), got)
    };
    let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
    if rank == 0 {
        // Captured, then replayed: the words it marks and its guard are graph nodes.
        let relaxed = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a capture of the live stream; the graph is destroyed below, after its run.
        unsafe {
            sys::cuStreamBeginCapture_v2(stream, relaxed)
                .result()
                .unwrap();
            launch(&mut op);
            sys::cuStreamEndCapture(stream, &mut graph)
                .result()
                .unwrap();
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
                .result()
                .unwrap();
        }
        // SAFETY: the graph's calls name the buffers above, alive until the stream drained.
        let (took, got) = run(&mut || {
            unsafe { sys::cuGraphLaunch(exec, stream) }
                .result()
                .unwrap()
        });
        let nan = got.iter().filter(|v| v.is_nan()).count();
        println!(
            "rank 0: {b} replayed with rank 1 absent: released after {:.2} s, {nan} of \
             {elems} NaN, faulted {}",
            took.as_secs_f64(),
            op.faulted()
        );
        assert!(took >= released, "released early: {took:?}");
        assert_eq!(nan, elems as usize, "a released call returned numbers");
        assert!(op.faulted());
        let (again, got) = run(&mut || launch(&mut op));
        println!(
            "rank 0: the next call (eager): {:.3} s, all NaN",
            again.as_secs_f64()
        );
        assert!(again < Duration::from_secs(1), "{again:?}");
        assert!(got.iter().all(|v| v.is_nan()));
    } else {
        // Queues nothing (absent): the stream is idle at once.
        let (took, _) = run(&mut || launch(&mut op));
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert!(!op.faulted());
        println!("rank 1 (absent): queued nothing");
    }
    op.disconnect().unwrap();
    std::fs::write(dir.join(format!("done{rank}")), b"").unwrap();
    wait_for(&format!("done{}", 1 - rank));
    // SAFETY: the stream drained; nothing else uses these (null handles where none).
    unsafe {
        if !exec.is_null() {
            let _ = sys::cuGraphExecDestroy(exec);
            let _ = sys::cuGraphDestroy(graph);
        }
        let _ = result::free_sync(input);
        let _ = result::free_sync(output);
        let _ = result::stream::destroy(stream);
    }
}

#[test]
fn gpu_hung_kernel_and_stuck_worker_fail_only_their_backend_or_skip() {
    let Some((_gpu, f)) = open_or_skip("gpu_hung_kernel_and_stuck_worker", 2) else {
        return;
    };
    drop(f);
    let dir = tempfile::tempdir().unwrap();
    for (faults, backend) in [
        ("hang=one_stage_push", Backend::OneStagePush),
        ("stall=two_stage_pull", Backend::TwoStagePull),
        // NCCL's stream held by a kernel that never ends: its worker does not answer, is
        // replaced, and NCCL is left out after failing again (run 25, hang-nccl.txt).
        ("hang=nccl", Backend::Nccl),
    ] {
        let out = dir.path().join("p.json");
        let t = std::time::Instant::now();
        let (g, why) = tune_leaving_out(faults, &out, backend);
        assert!(why.contains("fresh ones"), "{faults}: {why}");
        assert!(
            g.buckets.iter().all(|b| !b.results.contains_key(&backend)),
            "{faults}: {backend} still has timings"
        );
        println!(
            "{faults}: tune exit 0 in {:.1} s; {backend} failed: {why}",
            t.elapsed().as_secs_f64()
        );
    }
}

#[test]
fn gpu_a_wrong_result_is_found_on_the_device_and_fails_only_its_backend_or_skip() {
    let Some((_gpu, f)) = open_or_skip("gpu_a_wrong_result", 2) else {
        return;
    };
    drop(f);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let o = faulty_tune("wrong=one_stage_pull", &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let p: artune::profile::Profile =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let fault = p
        .faults
        .iter()
        .find(|f| f.contains("one_stage_pull disqualified"))
        .unwrap_or_else(|| panic!("no fault for one_stage_pull: {:#?}", p.faults));
    // Exactly the spoiled element, named with the value the host expects there.
    assert!(
        fault.contains("; 1 of ") && fault.contains("elements differ"),
        "{fault}"
    );
    assert!(err.contains(fault.as_str()), "{err}");
    for g in &p.groups {
        assert!(g
            .buckets
            .iter()
            .all(|b| !b.results.contains_key(&Backend::OneStagePull)));
        assert!(g
            .buckets
            .iter()
            .any(|b| b.results.contains_key(&Backend::OneStagePush)));
    }
    assert!(live_workers().is_empty());
    println!("wrong=one_stage_pull: {fault}");
}

/// Graph mode runs the registered form (peers read the ranks' own inputs, or write their own
/// outputs, mapped once); a replay whose slot was not registered must leave every element
/// NaN, never a sum. The fault knob gives a backend's graph calls a generation their slot
/// never holds: the tune's graph-mode check (the capture its timing uses too) must then find
/// all NaN and disqualify it, where the staged form would have passed. One pull kernel and
/// the push kernel, at sizes where each runs its bandwidth kernel (not its LL form, which
/// needs no registration); the other kernels are tuned.
#[test]
fn gpu_an_unregistered_graph_replay_is_nan_never_a_sum_or_skip() {
    let Some((_gpu, f)) = open_or_skip("gpu_an_unregistered_graph_replay", 2) else {
        return;
    };
    drop(f);
    for (b, sizes, other) in [
        (Backend::OneStagePull, "4K:16K", Backend::TwoStagePull),
        (Backend::TwoStagePush, "256K:1M", Backend::OneStagePush),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("p.json");
        let o = faulty_tune_at(&format!("unregistered={b}"), sizes, &out);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{err}");
        let p: artune::profile::Profile =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let fault = p
            .faults
            .iter()
            .find(|f| f.contains(&format!("{b} disqualified")))
            .unwrap_or_else(|| panic!("no fault for {b}: {:#?}", p.faults));
        assert!(fault.contains("is NaN"), "{fault}");
        // Every element NaN: "; N of N elements differ".
        let counts: Vec<&str> = fault
            .rsplit("; ")
            .next()
            .unwrap()
            .split(' ')
            .filter(|w| w.parse::<u64>().is_ok())
            .collect();
        assert!(counts.len() == 2 && counts[0] == counts[1], "{fault}");
        for g in &p.groups {
            assert!(g.buckets.iter().all(|k| !k.results.contains_key(&b)));
            assert!(g.buckets.iter().any(|k| k.results.contains_key(&other)));
        }
        assert!(live_workers().is_empty());
        println!("unregistered={b}: {fault}");
    }
}

/// The island kernels' registered form (island.cu, REG): graph replays read the peers' own
/// inputs and reach their own outputs, mapped once, with nothing staged, and give the same
/// bits as the staged form in every orientation. Loopback 8 in virtual islands of 4 and of 2
/// (one GPU: the protocol, not a multi-GPU fabric), at sizes past the LL forms (which need
/// no registration), a tail included.
#[test]
fn gpu_island_kernels_replay_registered_bit_exactly_in_islands_4_4_and_2_2_2_2_or_skip() {
    for sizes in [vec![4, 4], vec![2, 2, 2, 2]] {
        let Some((_gpu, mut f)) = open_or_skip("gpu_island_kernels_replay_registered", 8) else {
            return;
        };
        for dtype in DTYPES {
            let max = 2 << 20;
            all_ready(
                &f.prepare(&island_group(8, dtype, max, &sizes), &islands())
                    .unwrap(),
            );
            for d in orientations() {
                f.orient(&d).unwrap();
                for b in islands() {
                    assert_eq!(
                        f.form(b, Mode::Graph),
                        Some(artune::allreduce::Form::Registered)
                    );
                    for (i, bytes) in [256u64 << 10, (1 << 20) + 2 * 8, max]
                        .into_iter()
                        .enumerate()
                    {
                        let what =
                            format!("islands {sizes:?} {b} {} {bytes} bytes ({d:?})", dtype.id());
                        let seed = 3000 + i as u64;
                        correct(
                            f.verify_with(b, bytes, seed, Mode::Eager, 2).unwrap(),
                            &what,
                        );
                        correct(
                            f.verify_with(b, bytes, seed ^ 0x51, Mode::Graph, 10)
                                .unwrap(),
                            &format!("{what}, registered, 10 replays"),
                        );
                    }
                }
            }
        }
        println!("islands {sizes:?}: island kernels' registered replays bit-exact, 3 dtypes");
    }
}

/// A replay of the island kernels' registered form before registration leaves every element
/// NaN, never a sum: the tune (loopback 8, islands 4,4, graph mode) must disqualify it with
/// the fault knob's `unregistered`, at sizes where it runs its bandwidth kernel.
#[test]
fn gpu_an_unregistered_island_replay_is_nan_never_a_sum_or_skip() {
    let Some((_gpu, f)) = open_or_skip("gpu_an_unregistered_island_replay", 8) else {
        return;
    };
    drop(f);
    for b in islands() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("p.json");
        let o = artune()
            .args(["tune", "--loopback", "8", "--islands", "4,4", "--tp", "8"])
            .args(["--sizes", "256K:1M", "--mode", "graph", "--out"])
            .arg(&out)
            .env("ARTUNE_CUDA_FAULTS", format!("unregistered={b}"))
            .env("ARTUNE_GPU_DEADLINE_MS", "1500")
            .output()
            .expect("artune runs");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{err}");
        let p: artune::profile::Profile =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let fault = p
            .faults
            .iter()
            .find(|f| f.contains(&format!("{b} disqualified")))
            .unwrap_or_else(|| panic!("no fault for {b}: {:#?}", p.faults));
        assert!(fault.contains("is NaN"), "{fault}");
        for g in &p.groups {
            assert!(g.buckets.iter().all(|k| !k.results.contains_key(&b)));
        }
        assert!(live_workers().is_empty());
        println!("unregistered={b}: {fault}");
    }
}

#[test]
fn gpu_a_pair_without_p2p_waives_custom_kernels_and_keeps_nccl_or_skip() {
    let Some((_gpu, f)) = open_or_skip("gpu_a_pair_without_p2p", 2) else {
        return;
    };
    drop(f);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let o = artune()
        .args([
            "tune",
            "--loopback",
            "2",
            "--sizes",
            "4K:16K",
            "--mode",
            "graph",
            "--no-contention",
            "--out",
        ])
        .arg(&out)
        .env("ARTUNE_CUDA_FAULTS", "nop2p=0-1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    if nccl::library().is_err() {
        skip(format!(
            "gpu_a_pair_without_p2p: skipped: no NCCL, nothing left to measure ({err})"
        ));
        return;
    }
    assert_eq!(o.status.code(), Some(0), "{err}");
    let p: artune::profile::Profile =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let g = &p.groups[0];
    for b in custom() {
        let why = g.waived.get(&b).unwrap_or_else(|| panic!("{b} not waived"));
        assert!(
            why.contains("P2P between GPU 0 and GPU 1 does not work"),
            "{why}"
        );
    }
    assert!(g.buckets.iter().all(|b| b.choice == Backend::Nccl));
    assert!(live_workers().is_empty());
    println!(
        "nop2p=0-1: custom kernels waived ({}), NCCL measured",
        g.waived[&custom()[0]]
    );
}

#[test]
fn gpu_buffers_a_peer_cannot_open_waive_kernels_not_the_tune_or_skip() {
    let Some((_gpu, f)) = open_or_skip("gpu_buffers_a_peer_cannot_open", 2) else {
        return;
    };
    drop(f);
    let dir = tempfile::tempdir().unwrap();
    let load = |p: &std::path::Path| -> artune::profile::Profile {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    // No peer mapping between the two GPUs: every kernel is out, NCCL is measured.
    let out = dir.path().join("noipc.json");
    let o = faulty_tune("noipc=0-1", &out);
    let err = String::from_utf8_lossy(&o.stderr);
    if nccl::library().is_err() {
        skip(format!(
            "gpu_buffers_a_peer_cannot_open: skipped: no NCCL, nothing left to measure ({err})"
        ));
        return;
    }
    assert_eq!(o.status.code(), Some(0), "{err}");
    let g = &load(&out).groups[0];
    for b in custom() {
        let why = g.waived.get(&b).unwrap_or_else(|| panic!("{b} not waived"));
        assert!(why.contains("could not open rank 1's input"), "{why}");
    }
    assert!(g.buckets.iter().all(|b| b.choice == Backend::Nccl));
    // One kernel's shared buffers cannot be opened: that kernel is out, the others run.
    let out = dir.path().join("noopen.json");
    let o = faulty_tune("noopen=one_stage_pull", &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let g = &load(&out).groups[0];
    let why = &g.waived[&Backend::OneStagePull];
    assert!(why.contains("could not be opened"), "{why}");
    assert!(g
        .buckets
        .iter()
        .all(|b| b.results.contains_key(&Backend::OneStagePush)
            && !b.results.contains_key(&Backend::OneStagePull)));
    assert!(live_workers().is_empty());
    println!("noipc=0-1: every kernel waived, NCCL measured; noopen=one_stage_pull: it alone waived ({why})");
}

/// A small loopback tune through the binary with `env` set; kernels cached in `cache`.
fn small_tune(
    cache: &std::path::Path,
    out: &std::path::Path,
    env: &[(&str, &str)],
) -> std::process::Output {
    artune()
        .args([
            "tune",
            "--loopback",
            "2",
            "--sizes",
            "4K:16K",
            "--mode",
            "graph",
            "--out",
        ])
        .arg(out)
        .env("ARTUNE_CACHE_DIR", cache)
        .envs(env.iter().copied())
        .output()
        .expect("artune runs")
}

/// The kernel cache as a full disk or a kill during a write would leave it: each file is
/// found unusable (one line), compiled again and rewritten, and the tune goes on.
#[test]
fn gpu_a_corrupt_kernel_cache_is_rebuilt_and_the_tune_goes_on_or_skip() {
    let _gpu = GPU.lock().unwrap_or_else(|p| p.into_inner());
    if artune::fabric::cuda::visible_gpus() == 0 {
        return skip("gpu_a_corrupt_kernel_cache: skipped: no GPU".into());
    }
    let dir = tempfile::tempdir().unwrap();
    let (cache, out) = (dir.path().join("kernels"), dir.path().join("p.json"));
    let o = small_tune(&cache, &out, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let files: Vec<PathBuf> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!files.is_empty(), "nothing was cached in {cache:?}");
    let good: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    for (i, f) in files.iter().enumerate() {
        match i % 2 {
            0 => std::fs::write(f, [0x5au8; 4096]).unwrap(),
            _ => std::fs::write(f, &good[i][..good[i].len() / 2]).unwrap(),
        }
    }
    let o = small_tune(&cache, &out, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("is unusable"), "{err}");
    for (f, g) in files.iter().zip(&good) {
        assert_eq!(&std::fs::read(f).unwrap(), g, "{f:?} was not rebuilt");
    }
    println!("{} corrupt cache files found and rebuilt", files.len());
}

/// NCCL's own log (`NCCL_DEBUG=INFO`, written on the worker's stdout) must not break the
/// conversation with the workers; `-v` shows it, named by worker.
#[test]
fn gpu_nccl_debug_info_does_not_break_the_protocol_or_skip() {
    let _gpu = GPU.lock().unwrap_or_else(|p| p.into_inner());
    if artune::fabric::cuda::visible_gpus() == 0 || nccl::nccl_version().is_none() {
        return skip("gpu_nccl_debug_info: skipped: no GPU or no NCCL".into());
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let o = artune()
        .args([
            "-v",
            "tune",
            "--loopback",
            "2",
            "--sizes",
            "4K:16K",
            "--out",
        ])
        .arg(&out)
        .env("NCCL_DEBUG", "INFO")
        .output()
        .expect("artune runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("[worker 0") && err.contains("NCCL INFO"),
        "{err}"
    );
}

/// `check --measure` right after a tune (the GPU likely still settling from it): the workers
/// start while the busy check waits, nothing is prepared before it has ended, the last group
/// is left with one round that closes the imports (no round of frees), and no worker is left.
#[test]
fn gpu_a_check_starts_its_workers_while_the_gpu_settles_and_leaves_nothing_or_skip() {
    let _gpu = GPU.lock().unwrap_or_else(|p| p.into_inner());
    if artune::fabric::cuda::visible_gpus() == 0 {
        return skip("gpu_a_check_starts_its_workers: skipped: no GPU".into());
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let o = small_tune(dir.path(), &out, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = artune()
        .args(["-v", "check"])
        .arg(&out)
        .args(["--measure", "--loopback", "2"])
        .env("ARTUNE_CACHE_DIR", dir.path())
        .output()
        .expect("artune runs");
    let err = String::from_utf8_lossy(&o.stderr);
    // The verdict is not what this test is about: held, stale or undecided.
    assert!(matches!(o.status.code(), Some(0 | 3 | 8)), "{err}");
    // The busy check's readings and its watch share one NVML start.
    assert_eq!(err.matches("NVML started in").count(), 1, "{err}");
    let at = |what: &str| err.find(what);
    let prepared = at("prepared in").expect("a group was prepared");
    if let Some(meanwhile) = at("opening the machine meanwhile") {
        let settled = at("wait for the GPUs to settle ended").expect("the wait ended");
        assert!(meanwhile < settled && settled < prepared, "{err}");
    }
    let last = err.rfind("decisive sizes re-timed").expect("re-timed");
    let tail = &err[last..];
    assert!(tail.contains("every import closed"), "{err}");
    assert!(!tail.contains("every buffer freed"), "{err}");
    assert!(tail.contains("workers exited in"), "{err}");
    let left = live_workers();
    assert!(left.is_empty(), "workers left running: {left:?}");
    println!(
        "{}",
        err.lines()
            .filter(|l| l.contains(" in "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The workers' NCCL communicator between groups: the next group with the same ranks (in
/// loopback every group's: one rank on worker 0) takes it, warmed for its larger sizes, and
/// it still sums right, eagerly and replayed from a graph; its memory is still counted.
#[test]
fn gpu_the_next_group_reuses_the_nccl_communicator_and_it_still_verifies_or_skip() {
    let Some((_gpu, mut f)) = open_or_skip("gpu_the_next_group_reuses_nccl", 2) else {
        return;
    };
    if let Err(e) = nccl::library() {
        return skip(format!(
            "gpu_the_next_group_reuses_nccl: skipped: NCCL cannot be loaded ({e})"
        ));
    }
    let mut held = Vec::new();
    for (dtype, max) in [(Dtype::Bf16, 1u64 << 20), (Dtype::Fp32, 16 << 20)] {
        let r = f.prepare(&group(2, dtype, max), &[Backend::Nccl]).unwrap();
        match &r[0] {
            Readiness::Ready { memory, .. } => held.push(memory.bytes_per_gpu),
            other => panic!("nccl not ready on the group of {dtype:?}: {other:?}"),
        }
        for (bytes, seed) in [(4096, 3), (max, 4)] {
            for mode in [Mode::Eager, Mode::Graph] {
                correct(
                    f.verify_with(Backend::Nccl, bytes, seed, mode, 2).unwrap(),
                    &format!("nccl {dtype:?} {bytes} {mode:?}"),
                );
            }
        }
    }
    // What the communicator held is counted again with what the larger sizes added.
    assert!(held[1] >= held[0], "{held:?}");
    drop(f);
    let left = live_workers();
    assert!(left.is_empty(), "workers left running: {left:?}");
    println!("one NCCL communicator served both groups; memory held {held:?} bytes");
}

/// `check --measure -v` over a loopback profile of TP2 and TP4: the second group takes the
/// first's NCCL communicator, none is destroyed, the workers leave it to their exit, and
/// none is left behind.
#[test]
fn gpu_a_check_destroys_no_nccl_communicator_between_or_after_groups_or_skip() {
    let _gpu = GPU.lock().unwrap_or_else(|p| p.into_inner());
    if artune::fabric::cuda::visible_gpus() == 0 {
        return skip("gpu_a_check_destroys_no_nccl_communicator: skipped: no GPU".into());
    }
    if let Err(e) = nccl::library() {
        return skip(format!(
            "gpu_a_check_destroys_no_nccl_communicator: skipped: NCCL cannot be loaded ({e})"
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let o = artune()
        .args(["tune", "--loopback", "4", "--sizes", "4K:64K", "--out"])
        .arg(&out)
        .env("ARTUNE_CACHE_DIR", dir.path())
        .output()
        .expect("artune runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = artune()
        .args(["-v", "check"])
        .arg(&out)
        .args(["--measure", "--loopback", "4"])
        .env("ARTUNE_CACHE_DIR", dir.path())
        .output()
        .expect("artune runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(matches!(o.status.code(), Some(0 | 3 | 8)), "{err}");
    let setups: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(": nccl set up in"))
        .collect();
    let kept = err
        .matches("(the communicator kept from the last group)")
        .count();
    assert!(
        setups.len() >= 2,
        "fewer than two groups set NCCL up: {err}"
    );
    assert!(kept >= 1, "{err}");
    // Loopback's NCCL rank is on the worker of the group's first GPU: where every group
    // starts at GPU 0, one communicator serves them all.
    if setups.iter().all(|l| l.contains("GPUs [0, ")) {
        assert_eq!(kept, setups.len() - 1, "{err}");
        assert!(!err.contains("NCCL communicators of"), "{err}");
    }
    assert!(
        err.contains("NCCL ranks left to the process's exit"),
        "{err}"
    );
    assert!(err.contains("workers exited in"), "{err}");
    let left = live_workers();
    assert!(left.is_empty(), "workers left running: {left:?}");
    println!(
        "{}",
        err.lines()
            .filter(|l| l.contains(" in ") || l.contains("NCCL"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// A first tune compiles only its element type's units (and those of no type), and an
/// engine's op, which loads every type, still finds the kernels the profile records.
#[test]
fn gpu_a_tune_compiles_its_types_kernels_and_an_op_loading_all_matches_its_record_or_skip() {
    let _gpu = GPU.lock().unwrap_or_else(|p| p.into_inner());
    if artune::fabric::cuda::visible_gpus() == 0 {
        return skip("gpu_a_tune_compiles_its_types_kernels: skipped: no GPU".into());
    }
    let dir = tempfile::tempdir().unwrap();
    let (cache, out) = (dir.path().join("cache"), dir.path().join("p.json"));
    let o = small_tune(&cache, &out, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let files: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let want = compile::units_for(&[Dtype::Bf16]);
    assert_eq!(files.len(), want.len(), "{files:?}");
    assert!(
        files
            .iter()
            .all(|f| !f.contains("fp16") && !f.contains("fp32")),
        "{files:?}"
    );
    let p = artune::profile::Profile::load(&out).unwrap();
    // The op opens GPU 0 in this process with every type's kernels, as an engine does.
    let op = artune::fabric::cuda::op::Op::open(0).unwrap();
    let loaded: artune::profile::KernelImages = op.images().unwrap().into();
    artune::profile::kernels::check(&p.kernels, &loaded).unwrap();
}

//! `artune bench kernels`: how close each custom kernel comes to the GPU's copy bandwidth, and
//! what one small call costs, on one GPU playing K ranks (loopback).
//!
//! Each kernel is set against the loopback floor: the bytes its schedule must move (each
//! rank's input read once, its output written once, plus what the schedule sends; the same for
//! every form, `cuda::must_bytes`) over the copy bandwidth measured in the same run. The
//! figure is floor time / kernel time, so a slower kernel shows a smaller one. What the kernel
//! actually reads and writes (staging included, `traffic_bytes`) is reported beside it.

use super::output::{out, outln};
use serde_json::{json, Value};

use super::{BenchArgs, BenchKernelsArgs, BenchWhat};
use crate::allreduce::{Backend, Dtype, Executor, Mode, Readiness};
use crate::error::Error;
use crate::fabric::cuda::{self, kernels, CudaFabric};
use crate::fabric::{Fabric, Group, Verification};
use crate::units::{fmt_bytes, fmt_us};

const SIZES: [u64; 8] = [
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
];
/// Targets, judged in graph mode (what decode runs: the registered form where the kernel has
/// one; the staged eager figures stand beside them, untargeted): at >= 16 MiB per rank, >= 90%
/// of the loopback floor; at 4 KiB, <= 2.5 us for the one-stage kernels (the launch floor),
/// <= 5 us for the other flat kernels, and for the island schedules within 1.5x of the faster
/// one-stage kernel (they have more phases, each with its barrier). Copy-engine rows have
/// none: in loopback their copies queue on one GPU's engines.
const TARGET_EFFICIENCY: f64 = 0.90;
const TARGET_LARGE: u64 = 16 << 20;
const TARGET_ONE_STAGE_US: f64 = 2.5;
const TARGET_SMALL_US: f64 = 5.0;
const TARGET_ISLAND_VS_ONE_STAGE: f64 = 1.5;

/// Every backend of the table that artune's own data plane runs on this fabric: the SM
/// kernels, and the copy-engine backends where the fabric runs them.
fn custom() -> Vec<Backend> {
    Backend::ALL
        .into_iter()
        .filter(|b| match b.executor() {
            Executor::Nccl => false,
            Executor::SmKernel => true,
            Executor::CopyEngine(_) => cuda::copy::runs(),
        })
        .collect()
}
const SAMPLES: u32 = 15;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    crate::stats::median_sorted(&v)
}

/// Median microseconds per call, with a batch sized so one sample lasts about 2 ms.
fn measure(f: &mut CudaFabric, b: Backend, bytes: u64, mode: Mode) -> Result<f64, Error> {
    let first = median(f.time(b, bytes, mode, 20, 2)?);
    let batch = ((2000.0 / first.max(0.1)) as u32).clamp(20, 500);
    Ok(median(f.time(b, bytes, mode, batch, SAMPLES)?))
}

fn copy_us(f: &mut CudaFabric, bytes: u64) -> Result<f64, Error> {
    let first = median(f.time_copy(bytes, 5, 2)?);
    let batch = ((2000.0 / first.max(0.1)) as u32).clamp(5, 500);
    Ok(median(f.time_copy(bytes, batch, SAMPLES)?))
}

pub fn run(a: BenchArgs) -> Result<i32, Error> {
    match a.what {
        BenchWhat::Kernels(k) => bench_kernels(k),
    }
}

fn bench_kernels(a: BenchKernelsArgs) -> Result<i32, Error> {
    let (low, high) = crate::units::parse_range(&a.sizes)?;
    let sizes: Vec<u64> = SIZES
        .into_iter()
        .filter(|s| (low..=high).contains(s))
        .collect();
    if sizes.is_empty() {
        return Err(Error::bad_input(format!(
            "--sizes {} holds none of the benchmark's sizes (4K, 16K, ..., 64M per rank); widen it",
            a.sizes
        )));
    }
    let backends = chosen(&a.backends)?;
    let islands = match &a.islands {
        Some(items) => {
            let sizes = super::values::parse_islands(items)?;
            if sizes.iter().sum::<usize>() != a.loopback {
                return Err(Error::bad_input(format!(
                    "--islands adds up to {} GPUs, but the benchmark runs {} ranks (--loopback); give sizes that add up to it",
                    sizes.iter().sum::<usize>(),
                    a.loopback
                )));
            }
            sizes
        }
        None if a.loopback >= 4 && a.loopback.is_multiple_of(2) => vec![a.loopback / 2; 2],
        None => Vec::new(),
    };
    // Find out now, not after minutes on the GPU, that the report cannot be written.
    if let Some(path) = &a.out {
        crate::profile::check_writable(path)?;
        use crate::profile::paths::{check_replace, Writes};
        check_replace(path, "--out", Writes::Json("benchmark"), a.force)?;
    }
    let report = kernels(a.loopback, &backends, &sizes, &islands)?;
    if let Some(path) = &a.out {
        crate::profile::write_atomic(
            path,
            serde_json::to_string_pretty(&report)
                .unwrap_or_default()
                .as_bytes(),
        )?;
    }
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        out!("{}", table(&report));
    }
    Ok(0)
}

/// The backends named with --backend, or every custom kernel and nccl.
fn chosen(ids: &[String]) -> Result<Vec<Backend>, Error> {
    let mut all = custom();
    all.push(Backend::Nccl);
    if ids.is_empty() {
        return Ok(all);
    }
    let mut out = Vec::new();
    for id in ids {
        match Backend::from_id(id).filter(|b| all.contains(b)) {
            Some(b) if !out.contains(&b) => out.push(b),
            Some(_) => {}
            None if Backend::from_id(id).is_some_and(switched_off) => {
                return Err(Error::bad_input(format!(
                    "--backend {id} does not run here: {}",
                    cuda::copy::SWITCHED_OFF
                )));
            }
            None => {
                let names: Vec<&str> = all.iter().map(|b| b.id()).collect();
                return Err(Error::bad_input(format!(
                    "--backend {id} is not one this benchmark runs; choose from {}",
                    names.join(", ")
                )));
            }
        }
    }
    Ok(out)
}

/// Whether `b` is left out only because its executor is switched off.
fn switched_off(b: Backend) -> bool {
    match b.executor() {
        Executor::CopyEngine(_) => !cuda::copy::runs(),
        Executor::Nccl | Executor::SmKernel => false,
    }
}

fn kernels(
    k: usize,
    backends: &[Backend],
    sizes: &[u64],
    islands: &[usize],
) -> Result<Value, Error> {
    let mut f = CudaFabric::open(Some(k))?;
    let info = f.info();
    let gpu = f
        .topology()
        .gpus
        .first()
        .map(|g| g.name.clone())
        .unwrap_or_default();
    let dtype = Dtype::Bf16;
    let max = *sizes.iter().max().unwrap_or(&(64 << 20));
    let mut group = Group::flat((0..k).collect(), dtype, max);
    if !islands.is_empty() {
        group.islands = crate::plan::given_islands(&group.gpus, islands);
    }
    let ranks = group.ranks();
    let ready = f.prepare(&group, backends)?;
    let mut waived = Vec::new();
    let mut memory = Vec::new();
    for r in &ready {
        match r {
            Readiness::Waived { backend, reason } => {
                waived.push(json!({"backend": backend.id(), "reason": reason}))
            }
            Readiness::Ready { backend, memory: m } => memory.push(json!({
                "backend": backend.id(),
                "measured_bytes_per_rank": m.bytes_per_gpu,
                "modelled_bytes_per_rank": m.modelled_bytes_per_gpu,
            })),
        }
    }
    let ready: Vec<Backend> = ready
        .iter()
        .filter(|r| matches!(r, Readiness::Ready { .. }))
        .map(|r| r.backend())
        .collect();
    if backends.iter().any(|b| b.is_custom() && !ready.contains(b)) {
        return Err(Error::Hardware(format!(
            "custom kernels could not be prepared: {waived:?}; fix the reasons given, then run again"
        )));
    }

    // Copy ceiling: the same volume as all ranks' inputs, and the largest copy seen.
    let mut copy = Vec::new();
    let mut peak = 0f64;
    for &s in sizes {
        let bytes = s * k as u64;
        let us = copy_us(&mut f, bytes)?;
        let gbps = 2.0 * bytes as f64 / us / 1e3;
        peak = peak.max(gbps);
        copy.push(json!({"bytes_per_rank": s, "copy_bytes": bytes, "us": us, "gbps": gbps}));
    }

    let mut rows = Vec::new();
    for &s in sizes {
        for &b in &ready {
            let verified = match f.verify(b, s, s ^ 0x5eed)? {
                Verification::Correct => true,
                Verification::Wrong { reason } => {
                    return Err(Error::Hardware(format!(
                        "{b} gave a wrong result at {s} bytes: {reason}; this is a kernel bug: please report it with the GPU model and driver version"
                    )))
                }
            };
            // NCCL runs one rank in loopback; custom kernels run k.
            let (n, shape) = match b.executor() {
                Executor::SmKernel | Executor::CopyEngine(_) => (k as u64, ranks),
                Executor::Nccl => (1, crate::allreduce::Ranks::flat(1)),
            };
            for mode in [Mode::Graph, Mode::Eager] {
                let us = measure(&mut f, b, s, mode)?;
                rows.push(row(b, mode, s, n, shape, us, peak, verified));
            }
        }
    }
    f.release()?;

    let ready_custom: Vec<Backend> = custom().into_iter().filter(|b| ready.contains(b)).collect();
    let (bw_targets, lat_targets, all_met) = targets(&rows, &ready_custom);

    Ok(json!({
        "benchmark": "kernels",
        "device": info.description,
        "gpu": gpu,
        "kernel_target": f.kernel_target().unwrap_or_else(|e| e),
        "driver": info.driver, "cuda": info.cuda, "nccl": info.nccl, "nvrtc": cuda::nvrtc_version(),
        "loopback_ranks": k,
        "islands": islands,
        "dtype": dtype.id(),
        "floor_definition": cuda::FLOOR_DEFINITION,
        "bytes_definition": "traffic_bytes_per_call = what every rank's kernel reads plus writes per call (each peer access counted, and the staging between the caller's tensors and the shared buffers where the form stages: form staged; graph mode runs the registered form, which stages nothing, where the backend has one): what the kernel does, not the work; traffic_gbps = that / time per call; algbw = bytes per rank / time (as nccl-tests reports it); NCCL runs 1 rank in loopback",
        "samples": SAMPLES,
        "copy": copy,
        "copy_peak_gbps": peak,
        "memory": memory,
        "waived": waived,
        "results": rows,
        "targets": {"bandwidth": bw_targets, "latency": lat_targets, "all_met": all_met},
    }))
}

/// The targets (see [`TARGET_EFFICIENCY`]) for the SM kernels among `backends`, judged on the
/// graph rows of `rows`: (bandwidth, latency, all met). A target this run did not measure
/// (--sizes left it out) is neither met nor failed.
fn targets(rows: &[Value], backends: &[Backend]) -> (Vec<Value>, Vec<Value>, bool) {
    let graph = |b: Backend, pred: &dyn Fn(u64) -> bool| {
        rows.iter()
            .filter(move |r| {
                r["backend"] == b.id()
                    && r["mode"] == "graph"
                    && pred(r["bytes_per_rank"].as_u64().unwrap_or(0))
            })
            .cloned()
            .collect::<Vec<_>>()
    };
    let one_stage = |b: &Backend| b.phases().len() == 1 && !b.is_hierarchical();
    // Copy engines have no launch floor to meet; NCCL is not artune's kernel.
    let sm = backends.iter().filter(|b| match b.executor() {
        Executor::SmKernel => true,
        Executor::Nccl | Executor::CopyEngine(_) => false,
    });
    let one_stage_4k = sm
        .clone()
        .filter(|b| one_stage(b))
        .flat_map(|&b| graph(b, &|s| s == 4096))
        .filter_map(|r| r["us_per_call"].as_f64())
        .reduce(f64::min);
    let (mut bw, mut lat, mut all_met) = (Vec::new(), Vec::new(), true);
    for &b in sm {
        let worst = graph(b, &|s| s >= TARGET_LARGE)
            .iter()
            .filter_map(|r| r["floor_fraction"].as_f64())
            .reduce(f64::min);
        let us = graph(b, &|s| s == 4096)
            .first()
            .and_then(|r| r["us_per_call"].as_f64());
        let bw_ok = worst.map(|w| w >= TARGET_EFFICIENCY);
        let target_us = if b.is_hierarchical() {
            one_stage_4k.map(|t| t * TARGET_ISLAND_VS_ONE_STAGE)
        } else if one_stage(&b) {
            Some(TARGET_ONE_STAGE_US)
        } else {
            Some(TARGET_SMALL_US)
        };
        let lat_ok = us.zip(target_us).map(|(u, t)| u <= t);
        all_met &= bw_ok == Some(true) && lat_ok == Some(true);
        bw.push(json!({"backend": b.id(), "min_graph_floor_fraction_at_16MiB_and_above": worst, "target": TARGET_EFFICIENCY, "met": bw_ok}));
        lat.push(json!({"backend": b.id(), "us_per_call_4KiB_graph": us, "target_us": target_us, "met": lat_ok}));
    }
    (bw, lat, all_met)
}

/// One result row: the time per call against the loopback floor of what `b`'s schedule must
/// move (`cuda::must_bytes`), and what the kernel actually moved beside it.
#[allow(clippy::too_many_arguments)]
fn row(
    b: Backend,
    mode: Mode,
    bytes: u64,
    n: u64,
    shape: crate::allreduce::Ranks,
    us: f64,
    copy_gbps: f64,
    verified: bool,
) -> Value {
    let must = n * cuda::must_bytes(b, bytes, shape);
    // Graph mode runs the registered form where the backend has one and the message is past
    // its LL kernel's (kernels::GpuKernels::plan); eager mode always the staged one.
    let registered = mode == Mode::Graph
        && b.has_registered_form()
        && kernels::ll_blocks(b, bytes, shape).is_none();
    let traffic = n * cuda::traffic_bytes(b, bytes, shape, registered);
    json!({
        "backend": b.id(), "mode": mode.id(), "bytes_per_rank": bytes, "ranks": n,
        "form": form(b, registered),
        "us_per_call": us, "must_bytes_per_call": must,
        "floor_us": cuda::floor_us(must, copy_gbps),
        "floor_fraction": cuda::floor_fraction(must, copy_gbps, us),
        "traffic_bytes_per_call": traffic, "traffic_gbps": traffic as f64 / us / 1e3,
        "algbw_gbps": bytes as f64 / us / 1e3, "verified": verified,
    })
}

/// What a row's calls run: copy engines, or the kernel's registered or staged form.
fn form(b: Backend, registered: bool) -> &'static str {
    match (b.executor(), registered) {
        (Executor::CopyEngine(_), _) => "copies",
        (Executor::Nccl | Executor::SmKernel, true) => "registered",
        (Executor::Nccl | Executor::SmKernel, false) => "staged",
    }
}

fn table(r: &Value) -> String {
    let mut s = String::new();
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    s += &format!(
        "artune bench kernels: {} ({}, {})\n",
        r["device"].as_str().unwrap_or(""),
        r["kernel_target"].as_str().unwrap_or(""),
        r["dtype"].as_str().unwrap_or("")
    );
    s += &format!(
        "copy ceiling (cuMemcpyDtoD, read+write): {:.0} GB/s\n",
        f(&r["copy_peak_gbps"])
    );
    s += "per rank   copy GB/s\n";
    for c in r["copy"].as_array().into_iter().flatten() {
        s += &format!(
            "{:>8}   {:>9.0}\n",
            fmt_bytes(c["bytes_per_rank"].as_u64().unwrap_or(0)),
            f(&c["gbps"])
        );
    }
    s += &format!(
        "\n{:<20} {:<6} {:<10} {:>8} {:>11} {:>11} {:>7}\n",
        "backend", "mode", "form", "per rank", "time/call", "floor", "of it"
    );
    for x in r["results"].as_array().into_iter().flatten() {
        s += &format!(
            "{:<20} {:<6} {:<10} {:>8} {:>11} {:>11} {:>6.1}%\n",
            x["backend"].as_str().unwrap_or(""),
            x["mode"].as_str().unwrap_or(""),
            x["form"].as_str().unwrap_or(""),
            fmt_bytes(x["bytes_per_rank"].as_u64().unwrap_or(0)),
            fmt_us(f(&x["us_per_call"])),
            fmt_us(f(&x["floor_us"])),
            100.0 * f(&x["floor_fraction"]),
        );
    }
    let copies = r["results"].as_array().into_iter().flatten();
    if copies.into_iter().any(|x| x["form"] == "copies") {
        // NCCL (src/ce_coll.cc): the driver gives a copy within one GPU to the copy engines
        // only when asked to (cudaMemcpyFlagPreferOverlapWithCompute, CUDA 13.1 on).
        s += "copies: copy engines move the data, an SM kernel sums it; in loopback every copy \
              is device-to-device on one GPU, which the driver may run on SMs\n";
    }
    s += "\ntargets\n";
    let verdict = |t: &Value| match t["met"].as_bool() {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured (--sizes)",
    };
    for t in r["targets"]["bandwidth"].as_array().into_iter().flatten() {
        s += &format!(
            "  {:<16} >= 16M per rank, graph: worst {:.1}% of the floor (target {:.0}%): {}\n",
            t["backend"].as_str().unwrap_or(""),
            100.0 * f(&t["min_graph_floor_fraction_at_16MiB_and_above"]),
            100.0 * TARGET_EFFICIENCY,
            verdict(t)
        );
    }
    for t in r["targets"]["latency"].as_array().into_iter().flatten() {
        s += &format!(
            "  {:<16} 4K graph: {:.2} us per call (target {:.2} us): {}\n",
            t["backend"].as_str().unwrap_or(""),
            f(&t["us_per_call_4KiB_graph"]),
            f(&t["target_us"]),
            verdict(t)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allreduce::Ranks;

    #[test]
    fn a_slowed_kernel_shows_a_smaller_share_of_the_floor() {
        let r = |us| {
            row(
                Backend::TwoStagePull,
                Mode::Graph,
                16 << 20,
                8,
                Ranks::flat(8),
                us,
                4000.0,
                true,
            )
        };
        let (fast, slowed) = (r(86.4), r(156.0));
        let share = |v: &Value| v["floor_fraction"].as_f64().unwrap();
        assert!(share(&slowed) < share(&fast), "{slowed} against {fast}");
        // The bytes counted are the schedule's: the same whatever the kernel took.
        assert_eq!(fast["must_bytes_per_call"], slowed["must_bytes_per_call"]);
        assert_eq!(fast["floor_us"], slowed["floor_us"]);
    }

    #[test]
    fn a_copy_row_says_copies_and_what_loopback_makes_of_them() {
        let r = |b| {
            row(
                b,
                Mode::Graph,
                16 << 20,
                8,
                Ranks::flat(8),
                90.0,
                4000.0,
                true,
            )
        };
        let report = json!({"results": [r(Backend::TwoStagePull), r(Backend::TwoStageCopy)]});
        let t = table(&report);
        let line = |id: &str| t.lines().find(|l| l.starts_with(id)).unwrap().to_string();
        assert!(line("two_stage_copy ").contains(" copies "), "{t}");
        assert!(line("two_stage_pull ").contains(" registered "), "{t}");
        assert!(
            t.contains("in loopback every copy is device-to-device"),
            "{t}"
        );
        let sm_only = table(&json!({"results": [r(Backend::TwoStagePull)]}));
        assert!(!sm_only.contains("loopback"), "{sm_only}");
    }

    #[test]
    fn targets_judge_the_graph_form_and_the_one_stage_launch_floor() {
        let r = |b: Backend, mode, bytes: u64, us| {
            row(b, mode, bytes, 8, Ranks::flat(8), us, 4000.0, true)
        };
        // two_stage_pull: 86.4 us at 16M is past 90% of the floor in graph; eager staged is
        // slower and judged by nobody. one_stage_pull at 4K: 2.4 us meets the launch floor.
        let fast = [
            r(Backend::TwoStagePull, Mode::Graph, 16 << 20, 86.4),
            r(Backend::TwoStagePull, Mode::Eager, 16 << 20, 156.0),
            r(Backend::OneStagePull, Mode::Graph, 4096, 2.4),
            r(Backend::TwoStageCopy, Mode::Graph, 16 << 20, 1150.0),
        ];
        let all = [
            Backend::TwoStagePull,
            Backend::OneStagePull,
            Backend::TwoStageCopy,
        ];
        let (bw, lat, _) = targets(&fast, &all);
        let met = |v: &[Value], id: &str| {
            v.iter()
                .find(|t| t["backend"] == id)
                .map(|t| t["met"].clone())
        };
        assert_eq!(met(&bw, "two_stage_pull"), Some(json!(true)), "{bw:?}");
        assert_eq!(met(&lat, "one_stage_pull"), Some(json!(true)), "{lat:?}");
        assert_eq!(
            met(&bw, "two_stage_copy"),
            None,
            "copy rows have no target: {bw:?}"
        );
        // Slowed: the graph form at 16M and the one-stage call at 4K both fail.
        let slowed = [
            r(Backend::TwoStagePull, Mode::Graph, 16 << 20, 140.0),
            r(Backend::TwoStagePull, Mode::Eager, 16 << 20, 86.4),
            r(Backend::OneStagePull, Mode::Graph, 4096, 3.35),
        ];
        let (bw, lat, all_met) = targets(&slowed, &all);
        assert_eq!(met(&bw, "two_stage_pull"), Some(json!(false)), "{bw:?}");
        assert_eq!(met(&lat, "one_stage_pull"), Some(json!(false)), "{lat:?}");
        assert!(!all_met);
    }
}

//! Throwaway probe (not part of artune): is the eager drift of one-rank NCCL the driver's
//! device-to-device copy? For `secs` seconds it takes, in turn, samples of `batch` calls of
//! (a) cuMemcpyDtoDAsync, (b) a one-rank ncclAllReduce out of place (which NCCL turns into that
//! copy), (c) an NVRTC copy kernel, each timed by events, plus the host time spent enqueueing.
//! Prints one line per window: per-call medians (device and host) of each.
use std::time::{Duration, Instant};

use cudarc::driver::{sys::CUevent_flags, CudaContext, LaunchConfig, PushKernelArg};
use cudarc::nccl::safe::{Comm, ReduceOp};

const SRC: &str = r#"
extern "C" __global__ void copy(const uint4* __restrict__ s, uint4* __restrict__ d, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) d[i] = s[i];
}"#;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bytes: usize = args.get(1).map_or(1 << 20, |s| s.parse().unwrap());
    let secs: f64 = args.get(2).map_or(60.0, |s| s.parse().unwrap());
    let window: f64 = args.get(3).map_or(1.0, |s| s.parse().unwrap());
    let batch: usize = args.get(4).map_or(20, |s| s.parse().unwrap());
    let ctx = CudaContext::new(0).unwrap();
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().unwrap();
    let n = bytes / 2;
    let src = stream.alloc_zeros::<u16>(n).unwrap();
    let mut dst = stream.alloc_zeros::<u16>(n).unwrap();
    let srcf = stream.alloc_zeros::<f32>(n / 2).unwrap();
    let mut dstf = stream.alloc_zeros::<f32>(n / 2).unwrap();
    let ptx = cudarc::nvrtc::compile_ptx(SRC).unwrap();
    let module = ctx.load_module(ptx).unwrap();
    let f = module.load_function("copy").unwrap();
    let comm = Comm::from_devices(vec![stream.clone()]).unwrap().pop().unwrap();
    let (a, b) = (
        ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).unwrap(),
        ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).unwrap(),
    );
    let n16 = (bytes / 16) as u64;
    let cfg = LaunchConfig {
        grid_dim: (((n16 + 255) / 256).min(264) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let names = ["memcpy", "nccl", "kernel"];
    println!("t_s {}", names.iter().map(|n| format!("{n}_dev_us {n}_host_us")).collect::<Vec<_>>().join(" "));
    let t0 = Instant::now();
    let mut k = 0usize;
    while t0.elapsed().as_secs_f64() < secs {
        let wend = t0.elapsed() + Duration::from_secs_f64(window);
        let mut dev: [Vec<f64>; 3] = Default::default();
        let mut host: [Vec<f64>; 3] = Default::default();
        while t0.elapsed() < wend {
            for i in 0..3 {
                let which = (i + k) % 3;
                k += 1;
                a.record(&stream).unwrap();
                let h = Instant::now();
                for _ in 0..batch {
                    match which {
                        0 => stream.memcpy_dtod(&src, &mut dst).unwrap(),
                        1 => {
                            comm.all_reduce(&srcf, &mut dstf, &ReduceOp::Sum).unwrap();
                        }
                        _ => unsafe {
                            stream.launch_builder(&f).arg(&src).arg(&mut dst).arg(&n16).launch(cfg).unwrap();
                        },
                    }
                }
                let hs = h.elapsed().as_secs_f64() * 1e6 / batch as f64;
                b.record(&stream).unwrap();
                b.synchronize().unwrap();
                let ms = a.elapsed_ms(&b).unwrap() as f64;
                dev[which].push(ms * 1000.0 / batch as f64);
                host[which].push(hs);
            }
        }
        let mut line = format!("{:.1}", t0.elapsed().as_secs_f64());
        for i in 0..3 {
            line += &format!(" {:.2} {:.2}", median(&mut dev[i]), median(&mut host[i]));
        }
        println!("{line}");
    }
}

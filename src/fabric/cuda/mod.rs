//! The machine's real GPUs behind the [`Fabric`](crate::fabric::Fabric) seam.
//!
//! As torchrun and every engine run: one worker process per GPU (`artune __worker`, the same
//! binary), each owning its GPU's context, buffers, compiled kernels and NCCL rank, and a
//! coordinator ([`CudaFabric`], the artune process) that plans and talks to the workers over
//! pipes ([`protocol`]). Custom-kernel buffers are plain cuMemAlloc memory shared through CUDA
//! IPC handles, as vLLM and SGLang share theirs, so the memory measured per backend is what an
//! engine pays. With `--loopback K`, K worker processes on one GPU own one rank each and
//! exchange real IPC handles; the owner of rank 0 launches one grid for every rank (kernels of
//! different processes do not run at once on a GPU without MPS, and spinning ranks must be
//! resident together).

pub mod compile;
mod coordinator;
pub mod copy;
pub mod copy_plan;
mod data;
mod device;
mod driver;
mod ipc;
pub mod kernels;
mod layout;
pub mod link;
mod module;
pub mod nccl;
pub mod nccl_ranks;
pub mod nccl_sweep;
pub mod op;
pub mod prefetch;
mod probe;
pub mod protocol;
pub mod registry;
mod run;
mod setup;
pub mod topo;
mod traffic;
mod verify;
pub mod watchdog;
pub mod worker;
mod worker_nccl;

use std::sync::{Arc, OnceLock};

use self::driver::{dev, Ctx, DeviceFacts};
use self::kernels::GpuKernels;
use crate::fabric::{Backend, DeviceError, Dtype, FabricError};
use crate::topology::reading::LinkReading;

pub use self::coordinator::CudaFabric;
pub use self::nccl::nccl_version;
pub use self::traffic::{floor_fraction, floor_us, must_bytes, traffic_bytes, FLOOR_DEFINITION};

/// How many GPUs CUDA sees: 0 only when there is no driver or the driver finds no device.
/// Tests skip on 0 alone; a driver that is there but fails to start counts as present (1), so
/// a broken GPU path fails its tests instead of passing them as skipped.
pub fn visible_gpus() -> usize {
    if !driver::driver_present() {
        return 0;
    }
    match driver::visible_bus_ids() {
        Ok(v) => v.len(),
        Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE => 0,
        Err(_) => 1,
    }
}

use crate::fabric::NO_GPU;

/// The fault knob of the CUDA path (testing only): `ARTUNE_CUDA_FAULTS`, items joined by `,`:
/// `hang=BACKEND` (its calls launch a kernel that never completes), `stall=BACKEND` (the
/// worker stops answering when asked to run it), `nop2p=A-B` (ranks A and B report that P2P
/// between them does not work), `noipc=A-B` (the worker, or the in-engine op, of rank A
/// cannot open rank B's buffers, or B's A's, as CUDA IPC fails between GPUs without a peer
/// mapping),
/// `noopen=BACKEND` (its shared buffers cannot be opened by peers, as when BAR1 or the peer
/// mapping limit runs out), `wrong=BACKEND` (one element of its output is spoiled before the
/// check, as a broken kernel would leave it), `slow=BACKEND:K` (each of its calls is queued K
/// times, so it times K times slower: a real change `check --measure` must catch),
/// `unregistered=BACKEND` (its graph-mode calls find their registered slot holding another
/// generation, as a replay before registration does: the output must be NaN),
/// `absent=BACKEND:RANK` (a copy-engine backend's calls leave rank RANK out, a peer that
/// never arrives: the others' streams wait on its flags until the deadline releases them; in
/// the engine's op, the SM kernels' too, whose waits give up after their timeout).
pub const ENV_FAULTS: &str = "ARTUNE_CUDA_FAULTS";

/// WorkerFaults a worker injects, from [`ENV_FAULTS`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerFaults {
    pub hang: Option<Backend>,
    pub stall: Option<Backend>,
    pub no_p2p: Option<(usize, usize)>,
    pub no_ipc: Option<(usize, usize)>,
    pub no_open: Option<Backend>,
    pub wrong: Option<Backend>,
    pub slow: Option<(Backend, u32)>,
    /// Graph-mode calls of this backend find their registered slot unregistered.
    pub unregistered: Option<Backend>,
    /// This backend's calls leave out this rank: a peer that never arrives (copy engines;
    /// in the engine's op, every custom backend).
    pub absent: Option<(Backend, usize)>,
    /// A zeroed device word the never-ending kernel spins on.
    flag: u64,
}

impl WorkerFaults {
    pub fn parse(spec: &str) -> Result<WorkerFaults, String> {
        let mut f = WorkerFaults::default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("`{item}` is not KEY=VALUE"))?;
            let backend = || {
                Backend::from_id(v).ok_or_else(|| format!("`{v}` in `{item}` is not a backend id"))
            };
            match k {
                "hang" => f.hang = Some(backend()?),
                "stall" => f.stall = Some(backend()?),
                "wrong" => f.wrong = Some(backend()?),
                "noopen" => f.no_open = Some(backend()?),
                "unregistered" => f.unregistered = Some(backend()?),
                "slow" => {
                    let (b, k) = v
                        .split_once(':')
                        .ok_or_else(|| format!("`{item}` wants slow=BACKEND:K"))?;
                    let b = Backend::from_id(b)
                        .ok_or_else(|| format!("`{b}` in `{item}` is not a backend id"))?;
                    let k =
                        k.parse::<u32>().ok().filter(|&k| k >= 1).ok_or_else(|| {
                            format!("`{k}` in `{item}` is not a whole number >= 1")
                        })?;
                    f.slow = Some((b, k));
                }
                "absent" => {
                    let (b, r) = v
                        .split_once(':')
                        .ok_or_else(|| format!("`{item}` wants absent=BACKEND:RANK"))?;
                    let b = Backend::from_id(b)
                        .ok_or_else(|| format!("`{b}` in `{item}` is not a backend id"))?;
                    let r = r
                        .parse::<usize>()
                        .map_err(|_| format!("`{r}` in `{item}` is not a rank"))?;
                    f.absent = Some((b, r));
                }
                "nop2p" | "noipc" => {
                    let pair = v.split_once('-').and_then(|(a, b)| {
                        Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?))
                    });
                    let pair = Some(pair.ok_or_else(|| format!("`{item}` wants {k}=A-B"))?);
                    if k == "nop2p" {
                        f.no_p2p = pair;
                    } else {
                        f.no_ipc = pair;
                    }
                }
                _ => {
                    return Err(format!(
                        "`{k}` is not a fault (hang, stall, nop2p, noipc, noopen, wrong, slow, unregistered, absent)"
                    ))
                }
            }
        }
        Ok(f)
    }

    /// The environment's faults; a malformed knob injects nothing (it is for tests only).
    pub fn from_env() -> WorkerFaults {
        std::env::var(ENV_FAULTS)
            .ok()
            .and_then(|s| WorkerFaults::parse(&s).ok())
            .unwrap_or_default()
    }

    /// With `stall` set to `backend`, never returns: the worker stops answering.
    pub fn maybe_stall(&self, backend: Backend) {
        if self.stall == Some(backend) {
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
    }

    /// Allocates the word the never-ending kernel spins on, when one is asked for. It is never
    /// freed: a worker running that kernel is killed, and the driver frees its memory.
    pub fn arm(&mut self, gpu: &Gpu) -> Result<(), FabricError> {
        if self.hang.is_some() {
            let w = dev(
                driver::DevBuf::alloc(&gpu.ctx, 16),
                "allocating the fault word",
            )?;
            dev(w.fill(0), "clearing the fault word")?;
            self.flag = w.ptr();
            std::mem::forget(w);
        }
        Ok(())
    }

    /// Launches the kernel that never completes.
    pub fn launch_hang(&self, gpu: &Gpu, stream: &driver::Stream) -> Result<(), FabricError> {
        let k = gpu.kernels()?;
        let mut flag = self.flag;
        let mut params = [&mut flag as *mut u64 as *mut std::ffi::c_void];
        // SAFETY: spin_forever(const u32*) reads one word of a live 16-byte allocation.
        dev(
            unsafe { k.spin_forever.launch_raw((1, 1), 32, stream, &mut params) },
            "launching the never-ending kernel (fault knob)",
        )
    }
}

/// One opened GPU: the worker's own.
pub struct Gpu {
    ctx: Arc<Ctx>,
    pub facts: DeviceFacts,
    /// The element types whose kernels it loads (`compile::units_for`).
    dtypes: Vec<Dtype>,
    /// Compiled on first use: only workers that launch need them.
    kernels: OnceLock<Result<GpuKernels, DeviceError>>,
}

impl Gpu {
    /// Opens GPU `ordinal`, its kernels those of every element type.
    pub fn open(ordinal: usize) -> Result<Gpu, FabricError> {
        Gpu::open_for(ordinal, &Dtype::ALL)
    }

    /// Opens GPU `ordinal`, its kernels those of `dtypes` only.
    pub fn open_for(ordinal: usize, dtypes: &[Dtype]) -> Result<Gpu, FabricError> {
        if !driver::driver_present() {
            return Err(FabricError::BadRequest(format!(
                "no NVIDIA driver (libcuda.so) was found on this machine; {NO_GPU}"
            )));
        }
        let ctx = dev(Ctx::new(ordinal), &format!("opening GPU {ordinal}"))?;
        let facts = dev(
            driver::device_facts(ctx.cuda()),
            &format!("reading GPU {ordinal}'s properties"),
        )?;
        Ok(Gpu {
            ctx,
            facts,
            dtypes: dtypes.to_vec(),
            kernels: OnceLock::new(),
        })
    }

    /// The kernels, or why they could not be compiled or loaded.
    pub fn kernels(&self) -> Result<&GpuKernels, DeviceError> {
        let k = self.kernels.get_or_init(|| {
            GpuKernels::load(&self.ctx, self.facts.cc, &self.dtypes).map_err(|e| match e {
                FabricError::Device(d) => d,
                other => DeviceError::Kernel {
                    name: "kernels/*.cu".into(),
                    detail: other.to_string(),
                },
            })
        });
        k.as_ref().map_err(Clone::clone)
    }

    /// Microseconds per device-to-device copy of `bytes` (cuMemcpyDtoD), `batch` copies per
    /// sample: the bandwidth ceiling kernels are compared with.
    pub fn time_copy(
        &self,
        bytes: u64,
        batch: u32,
        samples: u32,
        deadline: watchdog::Deadline,
    ) -> Result<Vec<f64>, FabricError> {
        let ctx = &self.ctx;
        let src = dev(
            driver::DevBuf::alloc(ctx, bytes as usize),
            "allocating copy buffers",
        )?;
        let dst = dev(
            driver::DevBuf::alloc(ctx, bytes as usize),
            "allocating copy buffers",
        )?;
        dev(src.fill(0x3c), "filling copy buffers")?;
        let s = dev(driver::Stream::new(ctx), "creating a stream")?;
        let (a, b) = (
            dev(driver::Event::new(ctx), "creating an event")?,
            dev(driver::Event::new(ctx), "creating an event")?,
        );
        driver::sync_ctx(ctx, "synchronizing the GPU")?;
        let batch = batch.max(1);
        let copy = |s: &driver::Stream| {
            // SAFETY: both buffers hold `bytes`.
            dev(
                unsafe { s.copy(dst.ptr(), src.ptr(), bytes as usize) },
                "device-to-device copy",
            )
        };
        copy(&s)?;
        copy(&s)?;
        let mut out = Vec::new();
        for _ in 0..samples {
            dev(a.record(&s), "recording an event")?;
            for _ in 0..batch {
                copy(&s)?;
            }
            dev(b.record(&s), "recording an event")?;
            let limit = deadline.for_work(bytes, batch);
            b.finish(limit, "device-to-device copies")?;
            out.push(
                dev(a.elapsed_ms(&b), "reading the timing events")? as f64 * 1000.0 / batch as f64,
            );
        }
        s.finish(deadline.for_work(bytes, 2), "device-to-device copies")?;
        Ok(out)
    }

    /// Reads this GPU's link while 2 GiB of host-to-device copies run (GPUs lower the link
    /// speed when idle, so an idle reading says little).
    pub fn load_and_read(&self) -> Result<Vec<LinkReading>, FabricError> {
        use cudarc::driver::{result, sys};
        const CHUNK: usize = 64 << 20;
        dev(self.ctx.bind_to_thread(), "binding the CUDA context")?;
        // SAFETY: pinned host memory, freed below on every path that finished its copies.
        let host = dev(
            unsafe { result::malloc_host(CHUNK, 0) },
            "allocating pinned host memory",
        )?;
        let run = (|| -> Result<Vec<LinkReading>, FabricError> {
            let buf = dev(
                driver::DevBuf::alloc(&self.ctx, CHUNK),
                "allocating device memory",
            )?;
            let s = dev(driver::Stream::new(&self.ctx), "creating a stream")?;
            for _ in 0..32 {
                // SAFETY: both ranges are CHUNK bytes and alive until the stream is synchronized.
                dev(
                    unsafe { sys::cuMemcpyHtoDAsync_v2(buf.ptr(), host, CHUNK, s.raw).result() },
                    "host-to-device copy",
                )?;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            let r = topo::read_links(&[(self.facts.ordinal, &self.facts)]);
            let limit = watchdog::Deadline::from_env().for_work(32 * CHUNK as u64, 1);
            s.finish(limit, "host-to-device copies")?;
            Ok(r)
        })();
        if run.is_ok() {
            // SAFETY: allocated above; every copy finished.
            let _ = unsafe { result::free_host(host) };
        }
        run
    }
}

/// The NVRTC version, e.g. "13.0", if NVRTC can be loaded.
pub fn nvrtc_version() -> Option<String> {
    compile::nvrtc_version()
        .ok()
        .map(|(a, b)| format!("{a}.{b}"))
}

/// The channel count NCCL is forced to: NCCL_MIN_NCHANNELS and NCCL_MAX_NCHANNELS both set to
/// the same positive number.
fn pinned_channels(var: impl Fn(&str) -> Option<String>) -> Option<u32> {
    let read = |k: &str| var(k).and_then(|v| v.trim().parse::<u32>().ok());
    match (read("NCCL_MIN_NCHANNELS"), read("NCCL_MAX_NCHANNELS")) {
        (Some(a), Some(b)) if a == b && a > 0 => Some(a),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_known_only_when_pinned() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            pinned_channels(env(&[
                ("NCCL_MIN_NCHANNELS", "8"),
                ("NCCL_MAX_NCHANNELS", "8")
            ])),
            Some(8)
        );
        assert_eq!(pinned_channels(env(&[("NCCL_MIN_NCHANNELS", "8")])), None);
        assert_eq!(
            pinned_channels(env(&[
                ("NCCL_MIN_NCHANNELS", "4"),
                ("NCCL_MAX_NCHANNELS", "8")
            ])),
            None
        );
        assert_eq!(pinned_channels(env(&[])), None);
    }

    #[test]
    fn fault_knob_parses_and_names_what_is_wrong() {
        let f =
            WorkerFaults::parse("hang=two_stage_push, stall=nccl,nop2p=0-3,wrong=one_stage_pull")
                .unwrap();
        assert_eq!(f.hang, Some(Backend::TwoStagePush));
        assert_eq!(f.stall, Some(Backend::Nccl));
        assert_eq!(f.no_p2p, Some((0, 3)));
        let g = WorkerFaults::parse("noipc=1-2,noopen=one_stage_push").unwrap();
        assert_eq!(
            (g.no_ipc, g.no_open),
            (Some((1, 2)), Some(Backend::OneStagePush))
        );
        assert_eq!(f.wrong, Some(Backend::OneStagePull));
        assert_eq!(WorkerFaults::parse("").unwrap(), WorkerFaults::default());
        assert!(WorkerFaults::parse("hang=nope")
            .unwrap_err()
            .contains("not a backend"));
        assert!(WorkerFaults::parse("nop2p=1")
            .unwrap_err()
            .contains("nop2p=A-B"));
        assert!(WorkerFaults::parse("boom=1")
            .unwrap_err()
            .contains("not a fault"));
        let s = WorkerFaults::parse("slow=one_stage_pull:3").unwrap();
        assert_eq!(s.slow, Some((Backend::OneStagePull, 3)));
        assert!(WorkerFaults::parse("slow=one_stage_pull").is_err());
        assert!(WorkerFaults::parse("slow=one_stage_pull:0").is_err());
        let a = WorkerFaults::parse("absent=two_stage_copy:1").unwrap();
        assert_eq!(a.absent, Some((Backend::TwoStageCopy, 1)));
        assert!(WorkerFaults::parse("absent=two_stage_copy")
            .unwrap_err()
            .contains("absent=BACKEND:RANK"));
    }
}

//! The machine's real GPUs behind the [`Fabric`] seam.
//!
//! One process drives every GPU: a context per GPU, one worker thread per GPU for launches,
//! peer access enabled between the group's GPUs (so buffers allocated with plain cuMemAlloc are
//! read and written by peers directly; the kernels are those an engine would run over IPC
//! handles). Kernels are compiled by NVRTC for the GPU found ([`compile`]); NCCL is loaded at
//! run time ([`nccl`]). With `open(Some(K))` (loopback) one GPU plays K ranks: every kernel,
//! flag and check is real, only the peers share one memory.

pub mod compile;
mod data;
mod driver;
mod group;
pub mod kernels;
pub mod nccl;
mod probe;
pub mod topo;
pub mod watchdog;

use std::sync::Arc;

use cudarc::driver::CudaContext;

use self::driver::{dev, DeviceFacts};
use self::group::Prepared;
use self::kernels::Kernels;
use self::probe::ProbeBufs;
use crate::fabric::{
    Backend, Direction, Fabric, FabricError, FabricInfo, Group, Mode, ProbeSample, Readiness,
    Verification,
};
use crate::topology::Topology;

pub use self::kernels::traffic_bytes;
pub use self::nccl::nccl_version;
pub use self::topo::LinkReading;

/// What to tell a user on a machine without a usable GPU.
const NO_GPU: &str = "run with `--sim PRESET` to tune a simulated machine instead (`artune topo --list-presets` lists them)";

/// One opened GPU.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    facts: DeviceFacts,
    /// The compiled kernels, or why they are unavailable (custom backends are then waived).
    kernels: Result<Kernels, String>,
}

pub struct CudaFabric {
    gpus: Vec<Gpu>,
    loopback: Option<usize>,
    topo: Topology,
    /// Topology GPU index -> index into `gpus` (real machines).
    map: Vec<Option<usize>>,
    info: FabricInfo,
    group: Option<(Prepared, Vec<usize>)>,
    probe: Option<ProbeBufs>,
    links: Vec<LinkReading>,
    /// Why a GPU no longer finishes its work, once the watchdog found one stuck: every later
    /// call fails with it, and nothing waits on the GPU again.
    stuck: Option<String>,
    /// Deadline of one GPU operation (see [`watchdog`]).
    deadline: watchdog::Deadline,
}

impl Drop for CudaFabric {
    /// Communicators, graphs, streams and buffers go before the contexts in `gpus` (NCCL
    /// needs its device's context to tear down), whichever way the fabric is dropped: at the
    /// end of a tune, after an error, or on Ctrl-C.
    fn drop(&mut self) {
        self.probe = None;
        if let Some((p, _)) = self.group.take() {
            self.stuck = self.stuck.take().or_else(|| p.stuck.clone());
        }
        if self.stuck.is_some() {
            // Destroying a context under a kernel that never ends can block: leave them to
            // the driver's cleanup at process exit.
            std::mem::forget(std::mem::take(&mut self.gpus));
        }
    }
}

impl CudaFabric {
    /// Opens every GPU of the machine, or with `Some(k)` only GPU 0 as `k` virtual ranks.
    pub fn open(loopback: Option<usize>) -> Result<CudaFabric, FabricError> {
        if let Some(k) = loopback {
            if !(2..=kernels::MAX_RANKS).contains(&k) {
                return Err(FabricError::BadRequest(format!(
                    "--loopback {k} is out of range; give between 2 and {} virtual ranks",
                    kernels::MAX_RANKS
                )));
            }
        }
        // No driver or no GPU is a wrong choice of command (exit 2), not a failing device.
        if !driver::driver_present() {
            return Err(FabricError::BadRequest(format!(
                "no NVIDIA driver (libcuda.so) was found on this machine; {NO_GPU}"
            )));
        }
        let count = CudaContext::device_count().map_err(|e| {
            FabricError::Device(format!("the CUDA driver could not start ({e}); {NO_GPU}"))
        })?;
        if count <= 0 {
            return Err(FabricError::BadRequest(format!(
                "the CUDA driver sees no GPU; {NO_GPU}"
            )));
        }
        let ordinals: Vec<usize> = if loopback.is_some() {
            vec![0]
        } else {
            (0..count as usize).collect()
        };
        let mut gpus = Vec::new();
        for o in ordinals {
            let ctx = dev(CudaContext::new(o), &format!("opening GPU {o}"))?;
            // SAFETY: we synchronize streams explicitly; cudarc's per-allocation events would
            // only add latency to small calls.
            unsafe { ctx.disable_event_tracking() };
            let facts = dev(
                driver::device_facts(&ctx),
                &format!("reading GPU {o}'s properties"),
            )?;
            let kernels = Kernels::load(&ctx, facts.cc).map_err(|e| e.to_string());
            gpus.push(Gpu {
                ctx,
                facts,
                kernels,
            });
        }
        let cuda = driver::cuda_version().ok();
        let nccl = nccl_version();
        let host = topo::host(cuda.clone(), nccl.clone());
        let (topo, map) = match loopback {
            Some(k) => (
                topo::loopback(k, &gpus[0].facts, host).map_err(FabricError::Device)?,
                vec![Some(0); k],
            ),
            None => real_topology(&gpus, host)?,
        };
        let description = match loopback {
            Some(k) => format!(
                "CUDA loopback: {k} virtual ranks on 1 x {}; NCCL with 1 rank{}",
                gpus[0].facts.name,
                if nccl.is_some() {
                    ""
                } else {
                    " (NCCL not found)"
                }
            ),
            None => format!(
                "CUDA {}, {} x {}",
                cuda.as_deref().unwrap_or("?"),
                gpus.len(),
                names(&gpus)
            ),
        };
        let info = FabricInfo {
            simulated: false,
            description,
            driver: topo::driver_version(),
            cuda,
            nccl,
        };
        Ok(CudaFabric {
            gpus,
            loopback,
            topo,
            map,
            info,
            group: None,
            probe: None,
            links: Vec::new(),
            stuck: None,
            deadline: watchdog::Deadline::from_env(),
        })
    }

    /// PCIe generation and width of each GPU read while traffic runs: from the last probe if
    /// one ran, else under a host-to-device copy load made for the purpose (GPUs lower the
    /// link speed when idle, so an idle reading says little).
    pub fn link_under_load(&mut self) -> Result<Vec<LinkReading>, FabricError> {
        if !self.links.is_empty() {
            return Ok(self.links.clone());
        }
        let mut out = Vec::new();
        for (i, g) in self.gpus.iter().enumerate() {
            out.extend(load_and_read(i, g)?);
        }
        self.links = out.clone();
        Ok(out)
    }

    /// Replaces the idle PCIe reading in the topology by one taken under load, once per run, so
    /// the profile reports a link that trained below its maximum truthfully. A failed reading
    /// becomes a note, never an error: the tune does not depend on it.
    fn record_links_under_load(&mut self) {
        if self.topo.origin.link_reading == "load" {
            return;
        }
        match self.link_under_load() {
            Ok(readings) => {
                for r in &readings {
                    for g in self.topo.gpus.iter_mut() {
                        if g.bus_id
                            .as_deref()
                            .is_some_and(|b| b.eq_ignore_ascii_case(&r.bus_id))
                        {
                            let small = |v: Option<u32>| v.and_then(|x| u8::try_from(x).ok());
                            g.pcie.gen = small(r.gen).or(g.pcie.gen);
                            g.pcie.width = small(r.width).or(g.pcie.width);
                            g.pcie.max_gen = small(r.max_gen).or(g.pcie.max_gen);
                            g.pcie.max_width = small(r.max_width).or(g.pcie.max_width);
                        }
                    }
                }
                self.topo.origin.link_reading = "load".into();
            }
            Err(e) => self
                .topo
                .notes
                .push(format!("PCIe link could not be re-read under load: {e}")),
        }
    }

    /// What NVRTC compiled for, e.g. "--gpu-architecture=sm_90" (or why it could not).
    pub fn kernel_target(&self) -> Result<String, String> {
        self.gpus[0]
            .kernels
            .as_ref()
            .map(|k| k.target.clone())
            .map_err(|e| e.clone())
    }

    /// Like [`Fabric::verify`], but `calls` calls in a row, eagerly or captured in one CUDA
    /// graph replayed twice: checks that the flags stay right across calls and replays.
    pub fn verify_with(
        &mut self,
        backend: Backend,
        bytes: u64,
        seed: u64,
        mode: Mode,
        calls: u32,
    ) -> Result<Verification, FabricError> {
        self.check_stuck()?;
        let (p, _) = self.group.as_mut().ok_or_else(not_prepared)?;
        p.verify(&self.gpus, backend, bytes, seed, mode, calls)
    }

    /// Microseconds per device-to-device copy of `bytes` on GPU 0 (cuMemcpyDtoD), `batch`
    /// copies per sample: the bandwidth ceiling kernels are compared with.
    pub fn time_copy(
        &mut self,
        bytes: u64,
        batch: u32,
        samples: u32,
    ) -> Result<Vec<f64>, FabricError> {
        let g = &self.gpus[0];
        let src = dev(
            driver::DevBuf::alloc(&g.ctx, bytes as usize),
            "allocating copy buffers",
        )?;
        let dst = dev(
            driver::DevBuf::alloc(&g.ctx, bytes as usize),
            "allocating copy buffers",
        )?;
        dev(src.fill(0x3c), "filling copy buffers")?;
        let s = dev(driver::Stream::new(&g.ctx), "creating a stream")?;
        let (a, b) = (
            dev(driver::Event::new(&g.ctx), "creating an event")?,
            dev(driver::Event::new(&g.ctx), "creating an event")?,
        );
        driver::sync_ctx(&g.ctx, "synchronizing the GPU")?;
        for _ in 0..2 {
            dev(
                s.copy(dst.ptr, src.ptr, bytes as usize),
                "device-to-device copy",
            )?;
        }
        let mut out = Vec::new();
        for _ in 0..samples {
            dev(a.record(&s), "recording an event")?;
            for _ in 0..batch.max(1) {
                dev(
                    s.copy(dst.ptr, src.ptr, bytes as usize),
                    "device-to-device copy",
                )?;
            }
            dev(b.record(&s), "recording an event")?;
            let limit = self.deadline.for_work(bytes, batch.max(1));
            driver::wait_dev(b.wait(limit), "device-to-device copies")?;
            out.push(
                dev(a.elapsed_ms(&b), "reading the timing events")? as f64 * 1000.0
                    / batch.max(1) as f64,
            );
        }
        let limit = self.deadline.for_work(bytes, 2);
        driver::wait_dev(s.wait(limit), "device-to-device copies")?;
        Ok(out)
    }

    /// Sets the deadline of one GPU operation, for the prepared group and later ones
    /// (default: [`watchdog::OP_DEADLINE`] growing with the bytes moved, or a fixed
    /// `ARTUNE_GPU_DEADLINE_MS`). A deadline nothing meets provokes the abort path on a
    /// healthy GPU, for tests.
    pub fn set_op_deadline(&mut self, d: watchdog::Deadline) {
        self.deadline = d;
        if let Some((p, _)) = &mut self.group {
            p.deadline = d;
        }
    }

    /// Number of GPUs (virtual ranks in loopback) the topology has.
    pub fn gpu_count(&self) -> usize {
        self.topo.gpu_count()
    }

    pub fn is_loopback(&self) -> bool {
        self.loopback.is_some()
    }
}

/// The NVRTC version, e.g. "13.0", if NVRTC can be loaded.
pub fn nvrtc_version() -> Option<String> {
    compile::nvrtc_version()
        .ok()
        .map(|(a, b)| format!("{a}.{b}"))
}

impl CudaFabric {
    /// Fails at once when a GPU was found stuck earlier.
    fn check_stuck(&self) -> Result<(), FabricError> {
        let stuck = self
            .stuck
            .as_ref()
            .or_else(|| self.group.as_ref().and_then(|(p, _)| p.stuck.as_ref()));
        match stuck {
            Some(why) => Err(FabricError::Device(why.clone())),
            None => Ok(()),
        }
    }
}

fn not_prepared() -> FabricError {
    FabricError::BadRequest("no group is prepared; call prepare first".into())
}

fn names(gpus: &[Gpu]) -> String {
    let mut v: Vec<&str> = gpus.iter().map(|g| g.facts.name.as_str()).collect();
    v.dedup();
    v.join(" + ")
}

/// The NVML topology mapped onto the opened GPUs, or CUDA's own view when NVML discovery fails.
fn real_topology(
    gpus: &[Gpu],
    host: crate::topology::Host,
) -> Result<(Topology, Vec<Option<usize>>), FabricError> {
    let facts: Vec<DeviceFacts> = gpus.iter().map(|g| g.facts.clone()).collect();
    match crate::topology::discover(nccl::nccl_version()) {
        Ok(mut t) => {
            let map = topo::ordinals(&t, &facts);
            t.host = host;
            Ok((t, map))
        }
        Err(e) => {
            let mut p2p = vec![vec![false; gpus.len()]; gpus.len()];
            for (a, ga) in gpus.iter().enumerate() {
                for (b, gb) in gpus.iter().enumerate() {
                    if a != b {
                        p2p[a][b] = driver::can_access_peer(&ga.ctx, &gb.ctx).unwrap_or(false);
                    }
                }
            }
            let t =
                topo::from_cuda(&facts, &p2p, host, &e.to_string()).map_err(FabricError::Device)?;
            Ok((t, (0..gpus.len()).map(Some).collect()))
        }
    }
}

/// Reads GPU `g`'s link while 2 GiB of host-to-device copies run.
fn load_and_read(index: usize, g: &Gpu) -> Result<Vec<LinkReading>, FabricError> {
    use cudarc::driver::{result, sys};
    const CHUNK: usize = 64 << 20;
    dev(g.ctx.bind_to_thread(), "binding the CUDA context")?;
    // SAFETY: pinned host memory, freed below on every path.
    let host = dev(
        unsafe { result::malloc_host(CHUNK, 0) },
        "allocating pinned host memory",
    )?;
    let run = (|| -> Result<Vec<LinkReading>, FabricError> {
        let buf = dev(
            driver::DevBuf::alloc(&g.ctx, CHUNK),
            "allocating device memory",
        )?;
        let s = dev(driver::Stream::new(&g.ctx), "creating a stream")?;
        for _ in 0..32 {
            // SAFETY: both ranges are CHUNK bytes and alive until the stream is synchronized.
            dev(
                unsafe { sys::cuMemcpyHtoDAsync_v2(buf.ptr, host, CHUNK, s.raw).result() },
                "host-to-device copy",
            )?;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        let r = topo::read_links(&[(index, &g.facts)]);
        let limit = watchdog::Deadline::from_env().for_work(32 * CHUNK as u64, 1);
        driver::wait_dev(s.wait(limit), "host-to-device copies")?;
        Ok(r)
    })();
    // Copies that did not finish may still read the buffer: keep it then (a stuck GPU).
    if run.is_ok() {
        // SAFETY: allocated above; every copy finished.
        let _ = unsafe { result::free_host(host) };
    }
    run
}

impl Fabric for CudaFabric {
    fn info(&self) -> FabricInfo {
        self.info.clone()
    }

    fn topology(&self) -> &Topology {
        &self.topo
    }

    fn prepare(
        &mut self,
        group: &Group,
        backends: &[Backend],
    ) -> Result<Vec<Readiness>, FabricError> {
        self.release()?;
        self.check_stuck()?;
        self.record_links_under_load();
        group.check(self.topo.gpu_count())?;
        let mut rank_gpus = Vec::new();
        for &i in &group.gpus {
            match self.map.get(i) {
                Some(Some(g)) => rank_gpus.push(*g),
                Some(None) => {
                    return Err(FabricError::BadRequest(format!(
                    "GPU {i} of the topology is not visible to CUDA (check CUDA_VISIBLE_DEVICES)"
                )))
                }
                None => {
                    return Err(FabricError::BadRequest(format!(
                        "GPU {i} does not exist; this machine has {} GPUs",
                        self.topo.gpu_count()
                    )))
                }
            }
        }
        let (p, ready) = Prepared::new(
            &self.gpus,
            &rank_gpus,
            self.loopback.is_some(),
            group,
            backends,
            self.deadline,
        )?;
        self.group = Some((p, rank_gpus));
        Ok(ready)
    }

    fn verify(
        &mut self,
        backend: Backend,
        bytes: u64,
        seed: u64,
    ) -> Result<Verification, FabricError> {
        self.verify_with(backend, bytes, seed, Mode::Eager, 1)
    }

    fn time(
        &mut self,
        backend: Backend,
        bytes: u64,
        mode: Mode,
        batch: u32,
        samples: u32,
    ) -> Result<Vec<f64>, FabricError> {
        self.check_stuck()?;
        let (p, _) = self.group.as_mut().ok_or_else(not_prepared)?;
        p.time(&self.gpus, backend, bytes, mode, batch, samples)
    }

    fn probe(
        &mut self,
        direction: Direction,
        peers: usize,
        bytes: u64,
    ) -> Result<ProbeSample, FabricError> {
        self.check_stuck()?;
        let (p, rank_gpus) = self.group.as_ref().ok_or_else(not_prepared)?;
        if peers == 0 || peers >= p.n {
            return Err(FabricError::BadRequest(format!(
                "a probe needs between 1 and {} peers in a group of {}",
                p.n - 1,
                p.n
            )));
        }
        let want = bytes.max(16).div_ceil(16) * 16;
        if self.probe.as_ref().is_none_or(|b| b.bytes() < want) {
            self.probe = None;
            self.probe = Some(ProbeBufs::new(&self.gpus, rank_gpus, want)?);
        }
        let bufs = self.probe.as_mut().ok_or_else(not_prepared)?;
        let (sample, links) = bufs
            .run(
                &self.gpus,
                rank_gpus,
                self.loopback.is_some(),
                direction,
                peers,
                want,
            )
            .inspect_err(|e| {
                // A probe that never finished leaves its kernels running: no more GPU work.
                if let FabricError::Device(m) = e {
                    if m.contains("did not finish") {
                        self.stuck = Some(m.clone());
                    }
                }
            })?;
        self.links = links;
        Ok(sample)
    }

    /// NCCL does not report its channel count; it is known only when the user pinned it.
    fn nccl_channels(&self) -> Option<u32> {
        pinned_channels(|k| std::env::var(k).ok())
    }

    fn release(&mut self) -> Result<(), FabricError> {
        self.probe = None;
        if let Some((p, _)) = self.group.take() {
            self.stuck = self.stuck.take().or_else(|| p.stuck.clone());
        }
        self.check_stuck()?;
        for g in &self.gpus {
            driver::sync_ctx(&g.ctx, "synchronizing the GPU")?;
        }
        Ok(())
    }
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
mod channel_tests {
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
            super::pinned_channels(env(&[
                ("NCCL_MIN_NCHANNELS", "8"),
                ("NCCL_MAX_NCHANNELS", "8")
            ])),
            Some(8)
        );
        assert_eq!(
            super::pinned_channels(env(&[("NCCL_MIN_NCHANNELS", "8")])),
            None
        );
        assert_eq!(
            super::pinned_channels(env(&[
                ("NCCL_MIN_NCHANNELS", "4"),
                ("NCCL_MAX_NCHANNELS", "8")
            ])),
            None
        );
        assert_eq!(super::pinned_channels(env(&[])), None);
    }
}

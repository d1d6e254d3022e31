//! The coordinator: plans which worker owns and launches which rank, drives the workers
//! through setup, verification, timing and probes, and recovers from workers that hang, die or
//! talk nonsense (kill them all, start fresh ones, set the group up again without the backend
//! that failed, go on).

mod comms;
mod connect;
mod contention;
mod group;
mod measure;
mod processes;
mod recovery;
#[cfg(test)]
mod scripted;
mod waivers;

use std::path::PathBuf;
use std::time::Duration;

use self::processes::{start_set, unexpected, Set, Trouble};
use super::driver::DeviceFacts;
use super::layout::MAX_RANKS;
use super::protocol::{Launch, Req, Resp};
use super::topo;
use super::watchdog::Deadline;
use super::{nccl_version, NO_GPU};
use crate::fabric::{
    Backend, DeviceError, Direction, Dtype, Fabric, FabricError, FabricInfo, Group, Mode,
    ProbeSample, Readiness, Verification, WorkerError,
};
use crate::topology::reading::LinkReading;
use crate::topology::Topology;

/// Names the program workers run: the artune binary (`ARTUNE_WORKER_BIN`, else this process).
const ENV_WORKER_BIN: &str = "ARTUNE_WORKER_BIN";
/// Testing only: `each` makes every loopback worker launch its own rank, as on a real machine
/// (kernels of different processes then share the GPU by time slices: correct, not fast).
const ENV_LOOPBACK_LAUNCH: &str = "ARTUNE_LOOPBACK_LAUNCH";

/// Who owns, launches and runs NCCL for each rank of the prepared group.
#[derive(Debug, Clone)]
pub(super) struct PreparedGroup {
    pub(super) group: Group,
    /// Worker index owning each rank.
    pub(super) owners: Vec<usize>,
    /// Launching workers and their ranks.
    pub(super) launchers: Vec<(usize, Launch)>,
    /// NCCL ranks: (worker, rank); NCCL runs one rank per GPU.
    pub(super) nccl: Vec<(usize, usize)>,
    /// Backends still usable, and which set runs each.
    pub(super) ready: Vec<(Backend, usize)>,
    /// Why custom kernels and probes are waived on this group (a pair without working P2P).
    pub(super) no_p2p: Option<String>,
    /// (backend, bytes, mode) verified in that mode before its first timing.
    pub(super) verified: std::collections::HashSet<(Backend, u64, Mode)>,
}

pub(super) fn not_prepared() -> FabricError {
    FabricError::BadRequest("no group is prepared; call prepare first".into())
}

pub struct CudaFabric {
    program: PathBuf,
    /// The element types whose kernels the workers load.
    dtypes: Vec<Dtype>,
    loopback: Option<usize>,
    launch_each: bool,
    /// CUDA ordinal and CPU list of each worker of a set.
    slots: Vec<(usize, Option<String>)>,
    sets: Vec<Set>,
    topo: Topology,
    /// Topology GPU index -> worker index.
    map: Vec<Option<usize>>,
    info: FabricInfo,
    prepared: Option<PreparedGroup>,
    /// Workers may hold a group's buffers or each other's: set when a setup starts, cleared
    /// once they are released. A setup that failed leaves no plan but may leave imports open.
    holding: bool,
    probe_bytes: u64,
    /// Launchers may map probe buffers: set before ProbeConnect is sent, cleared once every
    /// launcher has closed them (ProbeDisconnect, Disconnect) or the workers are replaced.
    probe_mapped: bool,
    epoch: u32,
    links: Vec<LinkReading>,
    kernels: Option<Result<String, String>>,
    /// Every distinct set of kernel images a worker loaded, for the profile.
    images: Vec<crate::fabric::LoadedKernels>,
    deadline: Deadline,
    /// Faults recovered so far, and the size being measured (for their record).
    recovered: Vec<crate::fabric::Recovery>,
    at_bytes: Option<u64>,
    /// In loopback: whether NCCL is timed with K rank processes on the GPU (Ok), or why not.
    loopback_nccl: Option<Result<(), String>>,
    /// The prepared loopback group's K-rank NCCL timings, where NCCL runs them.
    ranked: Option<super::nccl_ranks::ranked::Ranked>,
    /// The NCCL communicators the workers hold, in a launcher or kept from the last group.
    comms: Vec<comms::Clique>,
    /// Testing only: makes the worker of each slot in place of a process (scripted.rs).
    #[cfg(test)]
    script: Option<scripted::Script>,
    /// Testing only: the wait for every answer, in place of [`CudaFabric::limit`]'s.
    #[cfg(test)]
    limit_for_tests: Option<Duration>,
}

impl Drop for CudaFabric {
    fn drop(&mut self) {
        // Buffers still held (the last group, a release that failed, an early return on an
        // error): a worker's exit frees what it exported, and peers exiting at the same time
        // may still map it. So first a bounded round that closes every import; the exits
        // then free the rest.
        if self.prepared.is_some() || self.holding {
            let limit = self.limit(0, 1).min(RELEASE_AT_DROP);
            if self.disconnect_inner(limit).is_err() {
                tracing::warn!(
                    "the GPU workers could not close their imports before exiting; each \
                     closes its imports at exit and leaves its own to the process's end"
                );
            }
        }
        // Every worker is told first, then all are waited for under one deadline: each one's
        // exit tears down a CUDA context, and those run side by side.
        let t = std::time::Instant::now();
        let each = self.shutdown_all(Duration::from_secs(10));
        // With -v: whether the exits' context teardowns ran side by side or one after another.
        tracing::info!(
            "{} workers exited in {:.2} s (each, in worker order, after: {})",
            self.worker_pids().len(),
            t.elapsed().as_secs_f64(),
            each.iter()
                .map(|e| e.map_or("-".into(), |d| format!("{:.2}", d.as_secs_f64())))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
}

/// The most the round that closes every import at drop may take.
const RELEASE_AT_DROP: Duration = Duration::from_secs(10);

/// The worker program: `ARTUNE_WORKER_BIN`, else this executable.
fn worker_program() -> Result<PathBuf, FabricError> {
    if let Some(p) = std::env::var_os(ENV_WORKER_BIN).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    std::env::current_exe().map_err(|e| WorkerError::NoProgram(e.to_string()).into())
}

impl CudaFabric {
    /// Starts one worker per GPU CUDA can see, or with `Some(k)` k workers on GPU 0.
    pub fn open(loopback: Option<usize>) -> Result<CudaFabric, FabricError> {
        CudaFabric::open_with(loopback, worker_program()?)
    }

    /// [`CudaFabric::open`], its workers loading the kernels of `dtypes` only: what a tune
    /// or check of those types runs, with fewer units to compile on a first run.
    pub fn open_for(loopback: Option<usize>, dtypes: &[Dtype]) -> Result<CudaFabric, FabricError> {
        CudaFabric::open_kernels(loopback, worker_program()?, dtypes)
    }

    /// [`CudaFabric::open`] with workers running `program` (tests pass the artune binary).
    pub fn open_with(loopback: Option<usize>, program: PathBuf) -> Result<CudaFabric, FabricError> {
        CudaFabric::open_kernels(loopback, program, &Dtype::ALL)
    }

    fn open_kernels(
        loopback: Option<usize>,
        program: PathBuf,
        dtypes: &[Dtype],
    ) -> Result<CudaFabric, FabricError> {
        if let Some(k) = loopback {
            if !(2..=MAX_RANKS).contains(&k) {
                return Err(FabricError::BadRequest(format!(
                    "--loopback {k} is out of range; give between 2 and {MAX_RANKS} virtual ranks"
                )));
            }
        }
        if !super::driver::driver_present() {
            return Err(FabricError::BadRequest(format!(
                "no NVIDIA driver (libcuda.so) was found on this machine; {NO_GPU}"
            )));
        }
        let started = std::time::Instant::now();
        let hidden = hidden_by_env(std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref());
        let visible = match (super::driver::visible_bus_ids(), hidden) {
            (Ok(v), _) if !v.is_empty() => v,
            (_, Some(why)) => return Err(FabricError::BadRequest(why)),
            (Ok(_), None) => {
                return Err(FabricError::BadRequest(format!(
                    "the CUDA driver sees no GPU; {NO_GPU}"
                )))
            }
            (Err(e), None) => {
                let code = format!("{:?}", e.0);
                return Err(DeviceError::DriverStart { code }.into());
            }
        };
        let nvml = match loopback {
            Some(_) => None,
            None => Some(crate::topology::discover(nccl_version()).map(|mut t| {
                t.notes.extend(topo::hidden_gpu_notes(&t));
                t
            })),
        };
        let slots: Vec<(usize, Option<String>)> = match (&loopback, &nvml) {
            (Some(k), _) => vec![(0, None); *k],
            (None, Some(Ok(t))) => (0..visible.len())
                .map(|o| {
                    let cpus = t
                        .gpus
                        .iter()
                        .find(|g| {
                            g.bus_id
                                .as_deref()
                                .is_some_and(|b| topo::same_bus(b, &visible[o]))
                        })
                        .and_then(|g| g.cpu_affinity.clone());
                    (o, cpus)
                })
                .collect(),
            _ => (0..visible.len()).map(|o| (o, None)).collect(),
        };
        let mut info = FabricInfo {
            simulated: false,
            description: String::new(),
            driver: topo::driver_version(),
            cuda: super::driver::cuda_version().ok(),
            nccl: nccl_version(),
        };
        tracing::info!(
            "CUDA driver: {} GPU(s) visible after {:.2} s",
            visible.len(),
            started.elapsed().as_secs_f64()
        );
        let launch_each = std::env::var(ENV_LOOPBACK_LAUNCH).is_ok_and(|v| v == "each");
        let main = start_set(
            &program,
            dtypes,
            &slots,
            loopback.map(|_| launch_each),
            None,
        )?;
        // The kernels compiled ahead are awaited by the first request that may load them.
        tracing::info!(
            "{} workers up after {:.2} s",
            slots.len(),
            started.elapsed().as_secs_f64()
        );
        let facts: Vec<DeviceFacts> = main.workers.iter().map(|w| w.facts.clone()).collect();
        let host = topo::host(info.cuda.clone(), info.nccl.clone());
        let (t, map) = match (loopback, nvml) {
            (Some(k), _) => (
                topo::loopback(k, &facts[0], host).map_err(DeviceError::Bug)?,
                (0..k).map(Some).collect(),
            ),
            (None, Some(Ok(mut t))) => {
                t.host = host;
                let map = topo::visible(&mut t, &facts);
                (t, map)
            }
            (None, other) => {
                let why = match other {
                    Some(Err(e)) => e.to_string(),
                    _ => "NVML was not asked".into(),
                };
                let p2p = super::driver::p2p_matrix(facts.len());
                (
                    topo::from_cuda(&facts, &p2p, host, &why).map_err(DeviceError::Bug)?,
                    (0..facts.len()).map(Some).collect(),
                )
            }
        };
        let loopback_nccl = loopback.zip(super::nccl::library().ok()).map(|(k, l)| {
            let multi = std::env::var(super::nccl_ranks::ENV_MULTI_RANK).ok();
            super::nccl_ranks::ranked::loopback(l.version, multi.as_deref(), k)
        });
        info.description = match loopback {
            Some(k) => format!(
                "CUDA loopback: {k} virtual ranks in {k} worker processes on 1 x {}; {}",
                facts[0].name,
                match (&info.nccl, &loopback_nccl) {
                    (None, _) => "NCCL not found".to_string(),
                    (Some(_), Some(Ok(()))) => super::nccl_ranks::ranked::note(k),
                    (Some(_), _) => "NCCL with 1 rank".to_string(),
                }
            ),
            None => format!(
                "CUDA {}, {} x {} (one worker process per GPU)",
                info.cuda.as_deref().unwrap_or("?"),
                facts.len(),
                names(&facts)
            ),
        };
        Ok(CudaFabric {
            program,
            dtypes: dtypes.to_vec(),
            loopback,
            launch_each,
            slots,
            sets: vec![main],
            topo: t,
            map,
            info,
            prepared: None,
            holding: false,
            probe_bytes: 0,
            probe_mapped: false,
            epoch: 0,
            links: Vec::new(),
            kernels: None,
            images: Vec::new(),
            deadline: Deadline::from_env(),
            recovered: Vec::new(),
            at_bytes: None,
            loopback_nccl,
            ranked: None,
            comms: Vec::new(),
            #[cfg(test)]
            script: None,
            #[cfg(test)]
            limit_for_tests: None,
        })
    }

    /// What NVRTC compiled for, e.g. "--gpu-architecture=sm_90" (or why it could not).
    pub fn kernel_target(&self) -> Result<String, String> {
        self.kernels
            .clone()
            .unwrap_or_else(|| Err("no group has been prepared yet".into()))
    }

    /// Testing only: every loopback worker launches its own rank, as on a real machine.
    pub fn set_launch_each(&mut self, on: bool) {
        self.launch_each = on;
    }

    pub fn gpu_count(&self) -> usize {
        self.topo.gpu_count()
    }

    pub fn is_loopback(&self) -> bool {
        self.loopback.is_some()
    }

    /// Process ids of the workers, for tests that check none is left behind.
    pub fn worker_pids(&self) -> Vec<u32> {
        self.sets
            .iter()
            .flat_map(|s| s.workers.iter().map(|w| w.link.pid()))
            .collect()
    }
}

fn names(facts: &[DeviceFacts]) -> String {
    let mut v: Vec<&str> = facts.iter().map(|g| g.name.as_str()).collect();
    v.dedup();
    v.join(" + ")
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
        self.record_links_under_load();
        group.check(self.topo.gpu_count())?;
        self.setup(group, backends)
    }

    fn form(&self, backend: Backend, mode: Mode) -> Option<crate::allreduce::Form> {
        crate::allreduce::Form::runs(backend, mode)
    }

    fn verify(
        &mut self,
        backend: Backend,
        bytes: u64,
        seed: u64,
    ) -> Result<Verification, FabricError> {
        // NCCL timed by K rank processes is checked by them: each checks every size's sum
        // before timing it, so what is verified is what is timed.
        if let (Some(r), true) = (self.ranked.as_mut(), backend.is_nccl()) {
            return r.verify(backend, bytes);
        }
        // Eager calls run the staged form; graph mode the registered form where the backend
        // has one (Backend::has_registered_form), which is checked on fresh data too: both
        // are timed.
        match self.verify_with(backend, bytes, seed, Mode::Eager, 1)? {
            Verification::Correct if backend.has_registered_form() => {
                self.verify_with(backend, bytes, seed ^ 0x9e37, Mode::Graph, 1)
            }
            v => Ok(v),
        }
    }

    fn time(
        &mut self,
        backend: Backend,
        bytes: u64,
        mode: Mode,
        batch: u32,
        samples: u32,
    ) -> Result<Vec<f64>, FabricError> {
        self.at_bytes = Some(bytes);
        if let (Some(r), true) = (self.ranked.as_mut(), backend.is_nccl()) {
            // Samples of K ranks' calls in `mode`, each a batch of the ranks' own size.
            let t = r.time(backend, bytes, mode, samples);
            if let Some(note) = r.stand_in_note() {
                self.info.description.push_str(&format!("; {note}"));
            }
            for note in r.unfollowed_notes() {
                self.info.description.push_str(&format!("; {note}"));
            }
            return t;
        }
        let calls = batch.max(1) * (samples.max(1) + 1) + samples + 3;
        let limit = self.limit(bytes, calls);
        let entered = std::time::Instant::now();
        // Inside the operation: fresh workers after a restart verify and are found again.
        self.backend_op(backend, |f| {
            f.verify_timed(backend, bytes, mode)?;
            let (set, ws) = f.targets(backend)?;
            let req = Req::Time {
                backend,
                bytes,
                mode,
                batch,
                samples,
                rendezvous: ws.len() > 1,
            };
            let reqs = ws.iter().map(|&w| (w, req.clone())).collect();
            let mut per: Vec<Vec<f64>> = Vec::new();
            for r in f.exchange(set, reqs, limit)? {
                match r {
                    Resp::Times(t) => per.push(t),
                    other => return Err(unexpected(other)),
                }
            }
            // The collective takes as long as its slowest rank.
            Ok((0..samples as usize)
                .map(|s| {
                    per.iter()
                        .filter_map(|v| v.get(s))
                        .fold(0.0f64, |a, &b| a.max(b))
                })
                .collect())
        })
        .inspect(|_| {
            tracing::debug!(
                target: "artune::timing",
                "request {backend} {bytes} {mode:?} {batch}x{samples}: {:.3} ms",
                entered.elapsed().as_secs_f64() * 1e3
            )
        })
    }

    fn probe(
        &mut self,
        direction: Direction,
        peers: usize,
        bytes: u64,
    ) -> Result<ProbeSample, FabricError> {
        let p = self.prepared.as_ref().ok_or_else(not_prepared)?;
        let n = p.owners.len();
        if peers == 0 || peers >= n {
            return Err(FabricError::BadRequest(format!(
                "a probe needs between 1 and {} peers in a group of {n}",
                n - 1
            )));
        }
        if let Some(why) = &p.no_p2p {
            return Err(FabricError::Waived(why.clone()));
        }
        let want = bytes.max(16).div_ceil(16) * 16;
        // A worker lost in a probe is replaced at once and the group set up again; the probe
        // fails (a measurement says so), and no backend is charged with the restart.
        self.probe_inner(direction, peers, want)
            .map_err(|t| match self.settle(t) {
                FabricError::Worker(why) => WorkerError::Probe(Box::new(why)).into(),
                e => e,
            })
    }

    fn orient(&mut self, directions: &crate::fabric::Directions) -> Result<(), FabricError> {
        self.orient_inner(directions)
    }

    /// NCCL does not report its channel count; it is known where the user pinned it, or read
    /// back from the profiler of K ranks timed in loopback.
    fn nccl_channels(&self) -> Option<u32> {
        super::pinned_channels(|k| std::env::var(k).ok())
            .or_else(|| self.ranked.as_ref()?.own_channels())
    }

    /// In rank processes of their own, on the group's GPUs, once for every count
    /// (nccl_ranks::timing).
    fn nccl_times_at_channels(
        &mut self,
        backend: Backend,
        sizes: &[u64],
        channels: &[u32],
        mode: Mode,
    ) -> Result<Vec<(u32, Vec<crate::fabric::ChannelTime>)>, FabricError> {
        let p = self.prepared.as_ref().ok_or_else(not_prepared)?;
        let ordinals: Vec<usize> = p.owners.iter().map(|&w| self.slots[w].0).collect();
        let exe = self.program.clone();
        super::nccl_ranks::timing::at_channels(&exe, &ordinals, backend, sizes, channels, mode)
    }

    /// Every pin in one start of the ranks, switched per call through the tuner, where the
    /// library is there (nccl_ranks::timing::pins_at_channels).
    fn nccl_pins_at_channels(
        &mut self,
        pins: &[Backend],
        sizes: &[u64],
        channels: &[u32],
        mode: Mode,
    ) -> Vec<crate::fabric::PinChannelTimes> {
        let Some(p) = self.prepared.as_ref() else {
            return pins.iter().map(|&b| (b, Err(not_prepared()))).collect();
        };
        let ordinals: Vec<usize> = p.owners.iter().map(|&w| self.slots[w].0).collect();
        let exe = self.program.clone();
        super::nccl_ranks::timing::pins_at_channels(&exe, &ordinals, pins, sizes, channels, mode)
    }

    fn recoveries(&self) -> Vec<crate::fabric::Recovery> {
        self.recovered.clone()
    }

    fn kernels(&self) -> Vec<crate::fabric::LoadedKernels> {
        self.images.clone()
    }

    fn release(&mut self) -> Result<(), FabricError> {
        self.at_bytes = None;
        self.ranked = None;
        // After a failed setup too: a worker that frees its buffers while a peer still maps
        // them is undefined behaviour, so every import is closed first (release_inner).
        if self.prepared.is_none() && !self.holding {
            return Ok(());
        }
        match self.release_inner(self.limit(0, 1)) {
            Ok(()) => Ok(()),
            Err(Trouble::Fabric(e)) => Err(e),
            Err(Trouble::Restart(why)) => self.restart(None, &why),
        }
    }
}

/// Why CUDA found no GPU where `CUDA_VISIBLE_DEVICES` is set (CUDA then lists only what it
/// names, nothing for an empty value or a first entry it cannot read): the variable, not the
/// driver, is what to fix.
fn hidden_by_env(var: Option<&str>) -> Option<String> {
    var.map(|v| {
        format!(
            "CUDA_VISIBLE_DEVICES={v:?} hides every GPU from CUDA; unset it, or list the GPUs to use (e.g. CUDA_VISIBLE_DEVICES=0,1)"
        )
    })
}

#[cfg(test)]
#[test]
fn a_variable_that_hides_every_gpu_is_named_without_debug_text() {
    let m = hidden_by_env(Some("")).unwrap();
    assert!(
        m.starts_with("CUDA_VISIBLE_DEVICES=\"\" hides every GPU"),
        "{m}"
    );
    assert!(
        !m.contains("DriverError") && !m.contains("CUDA_ERROR"),
        "{m}"
    );
    assert!(hidden_by_env(None).is_none());
}

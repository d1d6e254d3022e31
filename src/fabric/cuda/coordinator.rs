//! The coordinator: plans which worker owns and launches which rank, drives the workers
//! through setup, verification, timing and probes, and recovers from workers that hang, die or
//! talk nonsense (kill them all, start fresh ones, set the group up again without the backend
//! that failed, go on).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::driver::DeviceFacts;
use super::kernels::MAX_RANKS;
use super::protocol::{Launch, Link, LinkError, ProbeHandles, Req, Resp, Shape, Spawn, WireError};
use super::topo::{self, LinkReading};
use super::watchdog::{self, Deadline};
use super::{nccl, nccl_version, NO_GPU};
use crate::fabric::{
    memory, Backend, Direction, Fabric, FabricError, FabricInfo, Group, Mode, NcclAlgo, NcclProto,
    ProbeSample, Readiness, Verification,
};
use crate::topology::Topology;

/// Names the program workers run: the artune binary (`ARTUNE_WORKER_BIN`, else this process).
pub const ENV_WORKER_BIN: &str = "ARTUNE_WORKER_BIN";
/// Testing only: `each` makes every loopback worker launch its own rank, as on a real machine
/// (kernels of different processes then share the GPU by time slices: correct, not fast).
pub const ENV_LOOPBACK_LAUNCH: &str = "ARTUNE_LOOPBACK_LAUNCH";
/// Testing only: `one` makes the first worker of a loopback group own every rank's buffers
/// (no IPC between processes), to compare with IPC-shared buffers.
pub const ENV_LOOPBACK_OWNERS: &str = "ARTUNE_LOOPBACK_OWNERS";
/// Set to 1 to measure NCCL's LL128 protocol on groups where NCCL would not enable it itself.
pub const ENV_NCCL_LL128: &str = "ARTUNE_NCCL_LL128";
/// NCCL channels assumed for the memory model (NCCL does not report its channel count).
const MODEL_NCCL_CHANNELS: u32 = 2;
/// Time a worker gets to start (open its GPU) and say hello.
const HELLO_DEADLINE: Duration = Duration::from_secs(120);
/// Calls in a row each backend is verified with in each mode before its first timing.
const CALLS_VERIFIED: u32 = 8;
/// Slack on top of a worker's own deadlines before the coordinator calls it lost.
const SLACK: Duration = Duration::from_secs(5);

/// One worker process and what it said about its GPU.
struct Worker {
    link: Link,
    facts: DeviceFacts,
}

/// Workers started with one NCCL pin in their environment (none: the main set).
struct Set {
    pin: Option<(NcclAlgo, NcclProto)>,
    workers: Vec<Worker>,
}

/// Who owns, launches and runs NCCL for each rank of the prepared group.
#[derive(Debug, Clone)]
struct Plan {
    group: Group,
    /// Worker index owning each rank.
    owners: Vec<usize>,
    /// Launching workers and their ranks.
    launchers: Vec<(usize, Launch)>,
    /// NCCL ranks: (worker, rank); NCCL runs one rank per GPU.
    nccl: Vec<(usize, usize)>,
    /// Backends still usable, and which set runs each.
    ready: Vec<(Backend, usize)>,
    /// Why custom kernels and probes are waived on this group (a pair without working P2P).
    no_p2p: Option<String>,
    /// (backend, bytes, mode) verified in that mode before its first timing.
    verified: std::collections::HashSet<(Backend, u64, Mode)>,
}

/// Something went wrong: a failure to report as it is, or workers to replace.
enum Trouble {
    Fabric(FabricError),
    Restart(String),
}

impl From<FabricError> for Trouble {
    fn from(e: FabricError) -> Trouble {
        Trouble::Fabric(e)
    }
}

pub struct CudaFabric {
    program: PathBuf,
    loopback: Option<usize>,
    launch_each: bool,
    /// CUDA ordinal and CPU list of each worker of a set.
    slots: Vec<(usize, Option<String>)>,
    sets: Vec<Set>,
    topo: Topology,
    /// Topology GPU index -> worker index.
    map: Vec<Option<usize>>,
    info: FabricInfo,
    plan: Option<Plan>,
    probe_bytes: u64,
    epoch: u32,
    links: Vec<LinkReading>,
    kernels: Option<Result<String, String>>,
    deadline: Deadline,
}

impl Drop for CudaFabric {
    fn drop(&mut self) {
        for s in &mut self.sets {
            for w in &mut s.workers {
                w.link.shutdown(Duration::from_secs(10));
            }
        }
    }
}

fn lost(e: LinkError) -> Trouble {
    Trouble::Restart(e.to_string())
}

/// The worker program: `ARTUNE_WORKER_BIN`, else this executable.
fn worker_program() -> Result<PathBuf, FabricError> {
    if let Some(p) = std::env::var_os(ENV_WORKER_BIN).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    std::env::current_exe().map_err(|e| {
        FabricError::Device(format!(
            "cannot find the artune executable to start GPU workers ({e}); set {ENV_WORKER_BIN}"
        ))
    })
}

fn spawn(
    program: &std::path::Path,
    ordinal: usize,
    cpus: &Option<String>,
    pin: Option<(NcclAlgo, NcclProto)>,
    who: &str,
) -> Result<Link, FabricError> {
    let mut args = vec!["__worker".into(), "--ordinal".into(), ordinal.to_string()];
    if let Some(c) = cpus {
        args.extend(["--cpus".into(), c.clone()]);
    }
    // Each pinned variant runs in workers started with its environment: NCCL reads it when
    // a communicator is created, and nothing changes the environment of a live process.
    // From NCCL 2.24 a pin can name the collective, leaving the others NCCL's choice.
    let per_collective = nccl::library().is_ok_and(|l| l.version >= 22400);
    let value = |v: &str| match per_collective {
        true => format!("allreduce:{v}"),
        false => v.to_string(),
    };
    let mut env = match pin {
        Some((a, p)) => vec![
            ("NCCL_ALGO".into(), value(a.name())),
            ("NCCL_PROTO".into(), value(p.name())),
        ],
        None => Vec::new(),
    };
    // A loopback launcher runs a probe stream per rank beside the stream that releases their
    // latch; with CUDA's default 8 hardware queues a ninth stream shares one with a probe
    // waiting on that latch, and the release never runs. 32 is CUDA's maximum.
    if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
        env.push(("CUDA_DEVICE_MAX_CONNECTIONS".into(), "32".into()));
    }
    let spawn = Spawn {
        program: program.to_path_buf(),
        args,
        env,
    };
    Link::start(&spawn, who).map_err(|e| FabricError::Device(e.to_string()))
}

/// Waits for a started worker's hello.
fn hello(mut link: Link, who: &str) -> Result<Worker, FabricError> {
    match link.recv(HELLO_DEADLINE) {
        Ok(Resp::Hello { facts, .. }) => Ok(Worker { link, facts }),
        Ok(Resp::Failed(e)) => Err(e.into_fabric()),
        Ok(other) => Err(FabricError::Device(format!(
            "worker {who} answered {other:?} instead of hello"
        ))),
        Err(e) => Err(FabricError::Device(format!("{e}; {NO_GPU}"))),
    }
}

impl CudaFabric {
    /// Starts one worker per GPU CUDA can see, or with `Some(k)` k workers on GPU 0.
    pub fn open(loopback: Option<usize>) -> Result<CudaFabric, FabricError> {
        CudaFabric::open_with(loopback, worker_program()?)
    }

    /// [`CudaFabric::open`] with workers running `program` (tests pass the artune binary).
    pub fn open_with(loopback: Option<usize>, program: PathBuf) -> Result<CudaFabric, FabricError> {
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
        let visible = super::driver::visible_bus_ids().map_err(|e| {
            FabricError::Device(format!("the CUDA driver could not start ({e}); {NO_GPU}"))
        })?;
        if visible.is_empty() {
            return Err(FabricError::BadRequest(format!(
                "the CUDA driver sees no GPU; {NO_GPU}"
            )));
        }
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
        let main = start_set(&program, &slots, loopback.is_some(), None)?;
        tracing::info!(
            "{} workers up after {:.2} s",
            slots.len(),
            started.elapsed().as_secs_f64()
        );
        let facts: Vec<DeviceFacts> = main.workers.iter().map(|w| w.facts.clone()).collect();
        let host = topo::host(info.cuda.clone(), info.nccl.clone());
        let (t, map) = match (loopback, nvml) {
            (Some(k), _) => (
                topo::loopback(k, &facts[0], host).map_err(FabricError::Device)?,
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
                    topo::from_cuda(&facts, &p2p, host, &why).map_err(FabricError::Device)?,
                    (0..facts.len()).map(Some).collect(),
                )
            }
        };
        info.description = match loopback {
            Some(k) => format!(
                "CUDA loopback: {k} virtual ranks in {k} worker processes on 1 x {}; NCCL with 1 rank{}",
                facts[0].name,
                if info.nccl.is_some() { "" } else { " (NCCL not found)" }
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
            loopback,
            launch_each: std::env::var(ENV_LOOPBACK_LAUNCH).is_ok_and(|v| v == "each"),
            slots,
            sets: vec![main],
            topo: t,
            map,
            info,
            plan: None,
            probe_bytes: 0,
            epoch: 0,
            links: Vec::new(),
            kernels: None,
            deadline: Deadline::from_env(),
        })
    }

    fn start_set(&self, pin: Option<(NcclAlgo, NcclProto)>) -> Result<Set, FabricError> {
        start_set(&self.program, &self.slots, self.loopback.is_some(), pin)
    }

    /// Sends each `(worker, request)` of set `set`, then collects every answer within
    /// `limit`: requests that belong together (one collective) run at the same time.
    fn exchange(
        &mut self,
        set: usize,
        reqs: Vec<(usize, Req)>,
        limit: Duration,
    ) -> Result<Vec<Resp>, Trouble> {
        let ws = &mut self.sets[set].workers;
        for (w, r) in &reqs {
            ws[*w].link.send(r).map_err(lost)?;
        }
        let mut out = Vec::new();
        let mut first: Option<Trouble> = None;
        for (w, _) in &reqs {
            match ws[*w].link.recv(limit) {
                Ok(Resp::Failed(WireError::Device {
                    message,
                    stuck: true,
                })) => {
                    first.get_or_insert(Trouble::Restart(message));
                }
                Ok(Resp::Failed(e)) => {
                    first.get_or_insert(Trouble::Fabric(e.into_fabric()));
                }
                Ok(r) => out.push(r),
                Err(e) => {
                    // A lost worker outranks an ordinary failure: it must be replaced.
                    if !matches!(first, Some(Trouble::Restart(_))) {
                        first = Some(lost(e));
                    }
                }
            }
        }
        match first {
            Some(t) => Err(t),
            None => Ok(out),
        }
    }

    fn one(&mut self, set: usize, w: usize, req: Req, limit: Duration) -> Result<Resp, Trouble> {
        Ok(self.exchange(set, vec![(w, req)], limit)?.remove(0))
    }

    fn limit(&self, bytes: u64, calls: u32) -> Duration {
        self.deadline.for_work(bytes, calls) + watchdog::DRAIN_DEADLINE + SLACK
    }

    /// The set running `backend` in the prepared group, and the workers it runs on.
    fn targets(&self, backend: Backend) -> Result<(usize, Vec<usize>), FabricError> {
        let p = self.plan.as_ref().ok_or_else(not_prepared)?;
        let set = p
            .ready
            .iter()
            .find(|(b, _)| *b == backend)
            .map(|(_, s)| *s)
            .ok_or_else(|| {
                FabricError::BadRequest(format!(
                    "backend {backend} was not prepared (or was waived) for this group"
                ))
            })?;
        let ws = if backend.is_custom() {
            p.launchers.iter().map(|(w, _)| *w).collect()
        } else {
            p.nccl.iter().map(|(w, _)| *w).collect()
        };
        Ok((set, ws))
    }

    /// Runs `op` for `backend`; on a worker that hung, died or whose GPU is stuck, replaces
    /// every worker, sets the group up again without the backend and fails the backend.
    fn backend_op<T>(
        &mut self,
        backend: Backend,
        op: impl FnOnce(&mut Self) -> Result<T, Trouble>,
    ) -> Result<T, FabricError> {
        match op(self) {
            Ok(v) => Ok(v),
            Err(Trouble::Fabric(e)) => {
                if e.backend_local() {
                    self.drop_backend(backend)?;
                }
                Err(e)
            }
            Err(Trouble::Restart(why)) => {
                self.restart(Some(backend))?;
                Err(FabricError::Backend {
                    backend,
                    reason: format!(
                        "{why}; its workers were killed and fresh ones set the group up again"
                    ),
                })
            }
        }
    }

    /// Tells every worker running `backend` to abort and forget it.
    fn drop_backend(&mut self, backend: Backend) -> Result<(), FabricError> {
        let Ok((set, ws)) = self.targets(backend) else {
            return Ok(());
        };
        if let Some(p) = &mut self.plan {
            p.ready.retain(|(b, _)| *b != backend);
        }
        let reqs = ws.into_iter().map(|w| (w, Req::Drop { backend })).collect();
        match self.exchange(set, reqs, self.limit(0, 1)) {
            Ok(_) | Err(Trouble::Fabric(_)) => Ok(()),
            Err(Trouble::Restart(_)) => self.restart(None),
        }
    }

    /// Kills every worker, starts fresh ones and prepares the group again with the backends
    /// still ready (less `failed`).
    fn restart(&mut self, failed: Option<Backend>) -> Result<(), FabricError> {
        for s in &mut self.sets {
            for w in &mut s.workers {
                w.link.kill();
            }
        }
        self.sets.clear();
        self.probe_bytes = 0;
        self.sets.push(self.start_set(None)?);
        let Some(p) = self.plan.take() else {
            return Ok(());
        };
        let keep: Vec<Backend> = p
            .ready
            .iter()
            .map(|(b, _)| *b)
            .filter(|b| Some(*b) != failed)
            .collect();
        self.setup(&p.group, &keep).map(|_| ())
    }

    fn plan_for(&self, group: &Group) -> Result<Plan, FabricError> {
        let mut owners = Vec::new();
        for &i in &group.gpus {
            match self.map.get(i) {
                Some(Some(w)) => owners.push(*w),
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
        let n = owners.len();
        if self.loopback.is_some() && std::env::var(ENV_LOOPBACK_OWNERS).is_ok_and(|v| v == "one") {
            owners = vec![owners[0]; n];
        }
        let (launchers, nccl) = if self.loopback.is_some() && !self.launch_each {
            (
                vec![(owners[0], Launch { base: 0, count: n })],
                vec![(owners[0], 0)],
            )
        } else if self.loopback.is_some() {
            let l = (0..n)
                .map(|r| (owners[r], Launch { base: r, count: 1 }))
                .collect();
            (l, vec![(owners[0], 0)])
        } else {
            let l = (0..n)
                .map(|r| (owners[r], Launch { base: r, count: 1 }))
                .collect();
            (l, (0..n).map(|r| (owners[r], r)).collect())
        };
        Ok(Plan {
            group: group.clone(),
            owners,
            launchers,
            nccl,
            ready: Vec::new(),
            no_p2p: None,
            verified: Default::default(),
        })
    }

    /// Sets `backends` up on `group` through the workers (see [`Fabric::prepare`]).
    fn setup(
        &mut self,
        group: &Group,
        backends: &[Backend],
    ) -> Result<Vec<Readiness>, FabricError> {
        let mut plan = self.plan_for(group)?;
        let n = plan.owners.len();
        let shape = Shape {
            n,
            dtype: group.dtype,
            max_bytes: group.max_bytes,
        };
        let mut waived: BTreeMap<Backend, String> = BTreeMap::new();
        for &b in backends {
            if b.is_custom() && n > MAX_RANKS {
                waived.insert(
                    b,
                    format!("custom kernels support at most {MAX_RANKS} ranks; this group has {n}"),
                );
            } else if b.is_nccl() {
                if let Err(e) = nccl::library() {
                    waived.insert(b, e);
                } else if self.loopback.is_some() && b.nccl_pin().is_some() {
                    waived.insert(
                        b,
                        "loopback runs NCCL with one rank, which only copies locally and uses no \
                         algorithm or protocol, so pinning NCCL_ALGO/NCCL_PROTO measures nothing \
                         different from `nccl`"
                            .into(),
                    );
                } else if let Some(why) = ll128_waiver(b, &self.topo, &group.gpus) {
                    waived.insert(b, why);
                }
            }
        }
        let launching: Vec<&DeviceFacts> = plan
            .launchers
            .iter()
            .map(|(w, _)| &self.sets[0].workers[*w].facts)
            .collect();
        if let Some(why) = unlike(&launching) {
            for &b in backends.iter().filter(|b| b.is_custom()) {
                waived.entry(b).or_insert_with(|| why.clone());
            }
        }
        let custom: Vec<Backend> = backends
            .iter()
            .copied()
            .filter(|b| b.is_custom() && !waived.contains_key(b))
            .collect();
        let pins: Vec<Option<(NcclAlgo, NcclProto)>> = {
            let mut v = vec![None];
            for b in backends
                .iter()
                .filter(|b| b.is_nccl() && !waived.contains_key(b))
            {
                if !v.contains(&b.nccl_pin()) {
                    v.push(b.nccl_pin());
                }
            }
            v
        };
        let mut memory: BTreeMap<Backend, u64> = BTreeMap::new();
        for pin in pins {
            let set = match self.sets.iter().position(|s| s.pin == pin) {
                Some(s) => s,
                None => {
                    let s = self.start_set(pin)?;
                    self.sets.push(s);
                    self.sets.len() - 1
                }
            };
            let custom_here = if pin.is_none() {
                custom.clone()
            } else {
                Vec::new()
            };
            let t = std::time::Instant::now();
            self.connect_set(
                set,
                &mut plan,
                shape,
                &custom_here,
                &mut waived,
                &mut memory,
            )
            .map_err(trouble_to_device)?;
            tracing::info!(
                "GPUs {:?}: buffers of {} custom backends set up and connected in {:.2} s",
                group.gpus,
                custom_here.len(),
                t.elapsed().as_secs_f64()
            );
            let here: Vec<Backend> = backends
                .iter()
                .copied()
                .filter(|b| b.is_nccl() && b.nccl_pin() == pin && !waived.contains_key(b))
                .collect();
            for b in here {
                let t = std::time::Instant::now();
                let r = self.nccl_init(set, &plan, b).map_err(trouble_to_device)?;
                tracing::info!(
                    "GPUs {:?}: {b} set up in {:.2} s",
                    group.gpus,
                    t.elapsed().as_secs_f64()
                );
                match r {
                    Ok(bytes) => {
                        memory.insert(b, bytes);
                        plan.ready.push((b, set));
                    }
                    Err(e) => {
                        waived.insert(b, e);
                    }
                }
            }
        }
        for &b in &custom {
            if !waived.contains_key(&b) {
                plan.ready.push((b, 0));
            }
        }
        self.plan = Some(plan);
        Ok(backends
            .iter()
            .map(|&b| match (waived.get(&b), memory.get(&b)) {
                (Some(reason), _) => Readiness::Waived {
                    backend: b,
                    reason: reason.clone(),
                },
                (None, Some(&bytes)) => Readiness::Ready {
                    backend: b,
                    memory: crate::fabric::MemoryCost {
                        bytes_per_gpu: bytes,
                        measured: true,
                        modelled_bytes_per_gpu: memory::modelled(
                            b,
                            n,
                            group.max_bytes,
                            MODEL_NCCL_CHANNELS,
                        ),
                    },
                },
                (None, None) => Readiness::Waived {
                    backend: b,
                    reason: "it was not set up".into(),
                },
            })
            .collect())
    }

    /// Setup on every owner (one at a time, so each measures only its own memory), then
    /// Connect on every launcher; waives what failed.
    fn connect_set(
        &mut self,
        set: usize,
        plan: &mut Plan,
        shape: Shape,
        custom: &[Backend],
        waived: &mut BTreeMap<Backend, String>,
        memory: &mut BTreeMap<Backend, u64>,
    ) -> Result<(), Trouble> {
        let mut owners: Vec<usize> = plan.owners.clone();
        owners.sort_unstable();
        owners.dedup();
        let mut handles = Vec::new();
        let limit = self.limit(shape.max_bytes, 64);
        for &w in &owners {
            let owned: Vec<usize> = (0..shape.n).filter(|&r| plan.owners[r] == w).collect();
            let req = Req::Setup {
                shape,
                owned,
                custom: custom.to_vec(),
            };
            match self.one(set, w, req, limit)? {
                Resp::Setup { ranks, memory: m } => {
                    handles.extend(ranks);
                    for (b, r) in m {
                        match r {
                            Ok(bytes) => {
                                let e = memory.entry(b).or_insert(0);
                                *e = (*e).max(bytes);
                            }
                            Err(e) => {
                                waived.entry(b).or_insert(e);
                            }
                        }
                    }
                }
                other => return Err(unexpected(other)),
            }
        }
        handles.sort_by_key(|h| h.rank);
        // A backend waived on one owner is dropped from every rank's handles.
        for h in &mut handles {
            h.custom.retain(|(b, _)| !waived.contains_key(b));
        }
        let mut launchers: Vec<(usize, Launch)> = plan.launchers.clone();
        for &(_, r) in &plan.nccl {
            let w = plan.owners[r];
            if !launchers.iter().any(|(x, _)| *x == w) {
                launchers.push((w, Launch { base: r, count: 1 }));
            }
        }
        for (w, launch) in launchers {
            let req = Req::Connect {
                shape,
                launch,
                ranks: handles.clone(),
            };
            match self.one(set, w, req, limit)? {
                Resp::Connected { kernels, broken } => {
                    if let Err(e) = &kernels {
                        for &b in custom {
                            waived.entry(b).or_insert_with(|| e.clone());
                        }
                    }
                    self.kernels = Some(kernels);
                    let opened: Vec<usize> =
                        (0..shape.n).filter(|&r| plan.owners[r] != w).collect();
                    record_p2p(
                        &mut self.topo,
                        &plan.group.gpus,
                        launch.base,
                        &opened,
                        &broken,
                    );
                    if let Some((r, why)) = broken.first() {
                        let (a, b) = (plan.group.gpus[launch.base], plan.group.gpus[*r]);
                        let reason = format!(
                            "P2P between GPU {a} and GPU {b} does not work ({why}); custom kernels and contention probes need it, NCCL is still measured"
                        );
                        for &c in custom {
                            waived.entry(c).or_insert_with(|| reason.clone());
                        }
                        plan.no_p2p.get_or_insert(reason);
                    }
                }
                other => return Err(unexpected(other)),
            }
        }
        Ok(())
    }
}

/// Keeps the real-transfer P2P check of the launcher of `rank` in the topology (and so the
/// profile): it opened the buffers of `opened` ranks; a pair that failed is marked without
/// P2P, and one note per launcher and group says what was checked and what failed.
fn record_p2p(
    t: &mut Topology,
    gpus: &[usize],
    rank: usize,
    opened: &[usize],
    broken: &[(usize, String)],
) {
    let from = gpus[rank];
    let checked: Vec<usize> = opened.iter().map(|&r| gpus[r]).collect();
    if checked.is_empty() {
        return;
    }
    for (r, _) in broken {
        let to = gpus[*r];
        for p in t.pairs.iter_mut() {
            if (p.from, p.to) == (from, to) || (p.from, p.to) == (to, from) {
                p.p2p.read = crate::topology::Status::No;
                p.p2p.write = crate::topology::Status::No;
            }
        }
    }
    let outcome = match broken {
        [] => "every one matched".to_string(),
        _ => broken
            .iter()
            .map(|(r, why)| format!("GPU {}: {why}", gpus[*r]))
            .collect::<Vec<_>>()
            .join("; "),
    };
    let note = format!(
            "P2P checked by a real transfer: the worker of GPU {from} read GPUs {checked:?} through their IPC handles and compared with what their owners wrote: {outcome}"
        );
    if !t.notes.contains(&note) {
        t.notes.push(note);
    }
}

impl CudaFabric {
    /// Creates `b`'s NCCL ranks (one group of init calls across the workers) and warms them.
    fn nccl_init(
        &mut self,
        set: usize,
        plan: &Plan,
        b: Backend,
    ) -> Result<Result<u64, String>, Trouble> {
        let limit = watchdog::INIT_DEADLINE + self.limit(plan.group.max_bytes, 16);
        let (w0, _) = plan.nccl[0];
        let id = match self.one(set, w0, Req::NcclId, limit)? {
            Resp::NcclId(id) => id,
            other => return Err(unexpected(other)),
        };
        let nranks = plan.nccl.len();
        let reqs = plan
            .nccl
            .iter()
            .map(|&(w, rank)| {
                (
                    w,
                    Req::NcclInit {
                        backend: b,
                        id: id.clone(),
                        rank,
                        nranks,
                    },
                )
            })
            .collect();
        let mut most = 0;
        for r in self.exchange(set, reqs, limit)? {
            match r {
                Resp::Memory(Ok(bytes)) => most = most.max(bytes),
                Resp::Memory(Err(e)) => return Ok(Err(e)),
                other => return Err(unexpected(other)),
            }
        }
        Ok(Ok(most))
    }

    /// Like [`Fabric::verify`], but `calls` calls in a row, eagerly or captured in one CUDA
    /// graph: verification of each mode a backend is timed in, on the same buffers.
    pub fn verify_with(
        &mut self,
        backend: Backend,
        bytes: u64,
        seed: u64,
        mode: Mode,
        calls: u32,
    ) -> Result<Verification, FabricError> {
        let (set, ws) = self.targets(backend)?;
        let limit = self.limit(bytes, 2 * calls.max(1) + 2);
        self.backend_op(backend, |f| {
            let stage = ws
                .iter()
                .map(|&w| {
                    (
                        w,
                        Req::Stage {
                            backend,
                            bytes,
                            seed,
                        },
                    )
                })
                .collect();
            f.exchange(set, stage, limit)?;
            let check = ws
                .iter()
                .map(|&w| {
                    (
                        w,
                        Req::Check {
                            backend,
                            bytes,
                            seed,
                            mode,
                            calls,
                        },
                    )
                })
                .collect();
            for r in f.exchange(set, check, limit)? {
                match r {
                    Resp::Checked(None) => {}
                    Resp::Checked(Some(reason)) => return Ok(Verification::Wrong { reason }),
                    other => return Err(unexpected(other)),
                }
            }
            Ok(Verification::Correct)
        })
    }

    /// Before the first timing of `backend` at `bytes` in `mode`: verifies it in that mode,
    /// [`CALLS_VERIFIED`] calls in a row on the same buffers (one graph of them in graph mode),
    /// so what is timed is what was checked. A wrong result fails the backend.
    fn verify_timed(
        &mut self,
        backend: Backend,
        bytes: u64,
        mode: Mode,
    ) -> Result<(), FabricError> {
        let key = (backend, bytes, mode);
        let p = self.plan.as_ref().ok_or_else(not_prepared)?;
        if p.verified.contains(&key) {
            return Ok(());
        }
        let seed = 0x7e57 ^ bytes.rotate_left(17) ^ (backend as u64) << 40 ^ (mode as u64) << 48;
        match self.verify_with(backend, bytes, seed, mode, CALLS_VERIFIED)? {
            Verification::Correct => {
                if let Some(p) = &mut self.plan {
                    p.verified.insert(key);
                }
                Ok(())
            }
            Verification::Wrong { reason } => {
                self.drop_backend(backend)?;
                Err(FabricError::Backend {
                    backend,
                    reason: format!("wrong result before timing: {reason}"),
                })
            }
        }
    }

    /// Microseconds per device-to-device copy of `bytes` on GPU 0, `batch` copies per sample.
    pub fn time_copy(
        &mut self,
        bytes: u64,
        batch: u32,
        samples: u32,
    ) -> Result<Vec<f64>, FabricError> {
        let limit = self.limit(bytes, batch.max(1) * samples.max(1) + 2);
        let req = Req::Copy {
            bytes,
            batch,
            samples,
        };
        match self.one(0, 0, req, limit).map_err(trouble_to_device)? {
            Resp::Times(t) => Ok(t),
            other => Err(trouble_to_device(unexpected(other))),
        }
    }

    /// PCIe generation and width of each GPU read while traffic runs: from the last probe if
    /// one ran, else under a host-to-device copy load made for the purpose.
    pub fn link_under_load(&mut self) -> Result<Vec<LinkReading>, FabricError> {
        if !self.links.is_empty() {
            return Ok(self.links.clone());
        }
        let ws: Vec<usize> = match self.loopback {
            Some(_) => vec![0],
            None => (0..self.sets[0].workers.len()).collect(),
        };
        let limit = self.limit(2 << 30, 1);
        let mut out = Vec::new();
        for w in ws {
            match self
                .one(0, w, Req::LinksUnderLoad, limit)
                .map_err(trouble_to_device)?
            {
                Resp::Links(mut l) => {
                    for r in &mut l {
                        r.gpu = self.map.iter().position(|m| *m == Some(w)).unwrap_or(w);
                    }
                    out.extend(l)
                }
                other => return Err(trouble_to_device(unexpected(other))),
            }
        }
        if self.loopback.is_some() {
            for r in &mut out {
                r.gpu = 0;
            }
        }
        self.links = out.clone();
        Ok(out)
    }

    /// Replaces the idle PCIe reading in the topology by one taken under load, once per run.
    /// A failed reading becomes a note, never an error: the tune does not depend on it.
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
                            .is_some_and(|b| topo::same_bus(b, &r.bus_id))
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
        self.kernels
            .clone()
            .unwrap_or_else(|| Err("no group has been prepared yet".into()))
    }

    /// Sets the deadline of one GPU operation for later groups' coordinator waits (workers
    /// read theirs from `ARTUNE_GPU_DEADLINE_MS`).
    pub fn set_op_deadline(&mut self, d: Deadline) {
        self.deadline = d;
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

    fn probe_inner(
        &mut self,
        direction: Direction,
        peers: usize,
        want: u64,
    ) -> Result<ProbeSample, Trouble> {
        let p = self.plan.clone().ok_or_else(not_prepared)?;
        let n = p.owners.len();
        let limit = self.limit(want * peers as u64, 1) + Duration::from_secs(10);
        if self.probe_bytes < want {
            let mut owners = p.owners.clone();
            owners.sort_unstable();
            owners.dedup();
            let mut handles: Vec<ProbeHandles> = Vec::new();
            for w in owners {
                let owned = (0..n).filter(|&r| p.owners[r] == w).collect();
                match self.one(
                    0,
                    w,
                    Req::ProbeSetup {
                        bytes: want,
                        owned,
                        n,
                    },
                    limit,
                )? {
                    Resp::Probe(h) => handles.extend(h),
                    other => return Err(unexpected(other)),
                }
            }
            handles.sort_by_key(|h| h.rank);
            let reqs = p
                .launchers
                .iter()
                .map(|&(w, launch)| {
                    (
                        w,
                        Req::ProbeConnect {
                            launch,
                            n,
                            ranks: handles.clone(),
                        },
                    )
                })
                .collect();
            self.exchange(0, reqs, limit)?;
            self.probe_bytes = want;
        }
        self.epoch = self.epoch.wrapping_add(1).max(1);
        let epoch = self.epoch;
        let each = |req: &Req| p.launchers.iter().map(|&(w, _)| (w, req.clone())).collect();
        let queue = Req::ProbeQueue {
            direction,
            peers,
            bytes: want,
            epoch,
        };
        self.exchange(0, each(&queue), limit)?;
        self.one(0, p.owners[0], Req::ProbeRelease { epoch }, limit)?;
        let finish = Req::ProbeFinish { bytes: want, peers };
        let mut secs = Vec::new();
        let mut links = Vec::new();
        for r in self.exchange(0, each(&finish), limit)? {
            match r {
                Resp::Probed { secs: s, links: l } => {
                    secs.extend(s);
                    links.extend(l);
                }
                other => return Err(unexpected(other)),
            }
        }
        if self.loopback.is_some() {
            links.truncate(1);
            for l in &mut links {
                l.gpu = 0;
            }
        }
        self.links = links;
        let moved = (peers as u64 * want) as f64;
        let per_gpu = secs.iter().map(|t| moved / t / 1e9).sum::<f64>() / n as f64;
        let slowest = secs.iter().cloned().fold(0.0, f64::max);
        Ok(ProbeSample {
            peers,
            per_gpu_gbps: per_gpu,
            aggregate_gbps: moved * n as f64 / slowest / 1e9,
        })
    }

    fn release_inner(&mut self) -> Result<(), Trouble> {
        self.plan = None;
        self.probe_bytes = 0;
        // Every opened handle is closed before any owner frees what it names.
        for req in [Req::Disconnect, Req::Release] {
            for set in 0..self.sets.len() {
                let reqs = (0..self.sets[set].workers.len())
                    .map(|w| (w, req.clone()))
                    .collect();
                self.exchange(set, reqs, self.limit(0, 1))?;
            }
        }
        Ok(())
    }
}

/// Starts one worker per slot (CUDA ordinal, CPU list).
fn start_set(
    program: &std::path::Path,
    slots: &[(usize, Option<String>)],
    loopback: bool,
    pin: Option<(NcclAlgo, NcclProto)>,
) -> Result<Set, FabricError> {
    // All start at once (each opens a CUDA context), then each says hello.
    let mut started = Vec::new();
    for (i, (o, cpus)) in slots.iter().enumerate() {
        let who = match loopback {
            true => format!("{i} (loopback rank {i} on GPU {o})"),
            false => format!("for GPU {o}"),
        };
        started.push((spawn(program, *o, cpus, pin, &who)?, who));
    }
    let mut workers = Vec::new();
    for (link, who) in started {
        workers.push(hello(link, &who)?);
    }
    Ok(Set { pin, workers })
}

/// LL128 relies on 128-byte stores arriving whole, which NCCL only trusts on NVLink between
/// Volta, Ampere and Hopper GPUs: it enables the protocol by default only there, and forcing it
/// elsewhere can corrupt data. A pinned LL128 backend is waived on other groups, unless
/// `ARTUNE_NCCL_LL128=1` asks for it.
fn ll128_waiver(b: Backend, t: &Topology, gpus: &[usize]) -> Option<String> {
    if b.nccl_pin().map(|p| p.1) != Some(NcclProto::LL128)
        || std::env::var(ENV_NCCL_LL128).is_ok_and(|v| v == "1")
    {
        return None;
    }
    ll128_unsafe(t, gpus).map(|why| {
        format!("NCCL enables LL128 only on NVLink between sm_70/80/90 GPUs and {why}; set {ENV_NCCL_LL128}=1 to measure it anyway")
    })
}

/// Why NCCL would not enable LL128 on `gpus` of `t`, or None when it would.
fn ll128_unsafe(t: &Topology, gpus: &[usize]) -> Option<String> {
    for &g in gpus {
        let cc = t.gpus.get(g)?.compute_capability.as_ref();
        if !cc.is_some_and(|c| c.minor == 0 && (7..=9).contains(&c.major)) {
            return Some(format!("GPU {g} is not sm_70/80/90"));
        }
    }
    for &a in gpus {
        for &b in gpus {
            if a != b && t.pair(a, b).is_none_or(|p| p.nvlinks == 0) {
                return Some(format!("GPUs {a} and {b} are not joined by NVLink"));
            }
        }
    }
    None
}

/// The one-plan rule: every rank of a group must launch the same grid (the kernels' barriers
/// pair blocks across ranks), and each worker sizes its grid from its GPU's multiprocessors and
/// compute capability. Groups whose launching GPUs differ in either waive the custom kernels.
fn unlike(gpus: &[&DeviceFacts]) -> Option<String> {
    let first = gpus.first()?;
    let other = gpus
        .iter()
        .find(|g| g.sms != first.sms || g.cc != first.cc || g.name != first.name)?;
    Some(format!(
        "the group mixes unlike GPUs ({}, {} SMs, sm_{}{} and {}, {} SMs, sm_{}{}); custom kernels need one launch plan, the same grid on every rank",
        first.name, first.sms, first.cc.0, first.cc.1, other.name, other.sms, other.cc.0, other.cc.1
    ))
}

fn not_prepared() -> FabricError {
    FabricError::BadRequest("no group is prepared; call prepare first".into())
}

fn unexpected(r: Resp) -> Trouble {
    let mut s = format!("{r:?}");
    s.truncate(120);
    Trouble::Restart(format!("a worker answered out of turn ({s})"))
}

fn trouble_to_device(t: Trouble) -> FabricError {
    match t {
        Trouble::Fabric(e) => e,
        Trouble::Restart(why) => FabricError::Device(why),
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
        self.verify_timed(backend, bytes, mode)?;
        let (set, ws) = self.targets(backend)?;
        let rendezvous = ws.len() > 1;
        let calls = batch.max(1) * (samples.max(1) + 1) + samples + 3;
        let limit = self.limit(bytes, calls);
        self.backend_op(backend, |f| {
            let req = Req::Time {
                backend,
                bytes,
                mode,
                batch,
                samples,
                rendezvous,
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
    }

    fn probe(
        &mut self,
        direction: Direction,
        peers: usize,
        bytes: u64,
    ) -> Result<ProbeSample, FabricError> {
        let p = self.plan.as_ref().ok_or_else(not_prepared)?;
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
        self.probe_inner(direction, peers, want)
            .map_err(|t| match t {
                Trouble::Fabric(e) => e,
                Trouble::Restart(why) => {
                    FabricError::Device(format!("a contention probe failed: {why}"))
                }
            })
    }

    /// NCCL does not report its channel count; it is known only when the user pinned it.
    fn nccl_channels(&self) -> Option<u32> {
        super::pinned_channels(|k| std::env::var(k).ok())
    }

    fn release(&mut self) -> Result<(), FabricError> {
        if self.plan.is_none() {
            return Ok(());
        }
        match self.release_inner() {
            Ok(()) => Ok(()),
            Err(Trouble::Fabric(e)) => Err(e),
            Err(Trouble::Restart(_)) => self.restart(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(name: &str, sms: u32, cc: (u32, u32)) -> DeviceFacts {
        DeviceFacts {
            ordinal: 0,
            name: name.into(),
            cc,
            sms,
            total_mem: 1 << 30,
            bus_id: "0000:00:06.0".into(),
        }
    }

    #[test]
    fn ll128_only_where_nccl_would_enable_it() {
        use crate::topology::ComputeCapability;
        let mut t = crate::topology::presets::get("pcie-8x-2switch").unwrap();
        for g in &mut t.gpus {
            g.compute_capability = Some(ComputeCapability { major: 9, minor: 0 });
        }
        let why = ll128_unsafe(&t, &[0, 1]).unwrap();
        assert!(
            why.contains("GPUs 0 and 1 are not joined by NVLink"),
            "{why}"
        );
        for p in &mut t.pairs {
            p.nvlinks = 4;
        }
        assert_eq!(ll128_unsafe(&t, &[0, 1]), None);
        t.gpus[1].compute_capability = Some(ComputeCapability { major: 8, minor: 9 });
        assert!(ll128_unsafe(&t, &[0, 1])
            .unwrap()
            .contains("GPU 1 is not sm_70/80/90"));
        assert_eq!(ll128_waiver(Backend::NcclRingLl, &t, &[0, 1]), None);
        let w = ll128_waiver(Backend::NcclTreeLl128, &t, &[0, 1]).unwrap();
        assert!(w.contains("ARTUNE_NCCL_LL128=1"), "{w}");
    }

    #[test]
    fn the_p2p_check_is_kept_in_the_topology() {
        use crate::topology::Status;
        let mut t = crate::topology::presets::get("pcie-8x-2switch").unwrap();
        record_p2p(&mut t, &[2, 5, 6], 0, &[1, 2], &[(1, "differs".into())]);
        assert_eq!(t.pair(2, 5).unwrap().p2p.read, Status::No);
        assert_eq!(t.pair(5, 2).unwrap().p2p.write, Status::No);
        assert_ne!(t.pair(2, 6).unwrap().p2p.read, Status::No);
        let n = t.notes.last().unwrap().clone();
        assert!(
            n.contains("the worker of GPU 2 read GPUs [5, 6]") && n.ends_with("GPU 5: differs"),
            "{n}"
        );
        // The same check again (a restart) adds no second note; one that opened nothing, none.
        let count = t.notes.len();
        record_p2p(&mut t, &[2, 5, 6], 0, &[1, 2], &[(1, "differs".into())]);
        record_p2p(&mut t, &[2, 5, 6], 0, &[], &[]);
        assert_eq!(t.notes.len(), count);
        record_p2p(&mut t, &[0, 1], 0, &[1], &[]);
        assert!(t.notes.last().unwrap().ends_with("every one matched"));
    }

    #[test]
    fn unlike_gpus_get_no_custom_kernels() {
        let h200 = gpu("NVIDIA H200", 132, (9, 0));
        let h100 = gpu("NVIDIA H100 PCIe", 114, (9, 0));
        assert_eq!(unlike(&[&h200, &h200.clone()]), None);
        assert_eq!(unlike(&[]), None);
        let why = unlike(&[&h200, &h200, &h100]).unwrap();
        assert!(
            why.contains("NVIDIA H200, 132 SMs, sm_90 and NVIDIA H100 PCIe, 114 SMs, sm_90"),
            "{why}"
        );
        assert!(why.contains("one launch plan"), "{why}");
        let l40 = gpu("NVIDIA H200", 132, (8, 9));
        assert!(unlike(&[&h200, &l40]).is_some());
    }
}

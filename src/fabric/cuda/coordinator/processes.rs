//! The worker processes as the coordinator sees them: started in sets (one per NCCL pin), sent
//! requests whose answers must come within a deadline, and all replaced when one is lost.

use std::time::Duration;

use super::CudaFabric;
use crate::fabric::cuda::driver::DeviceFacts;
use crate::fabric::cuda::link::{shutdown_all, Spawn, WorkerLink};
use crate::fabric::cuda::nccl;
use crate::fabric::cuda::protocol::{Req, Resp, WireError};
use crate::fabric::cuda::watchdog;
use crate::fabric::error::{clip, LinkError};
use crate::fabric::{Backend, Dtype, FabricError, NcclAlgo, NcclProto, WorkerError};

/// Time a worker gets to start (open its GPU) and say hello.
const HELLO_DEADLINE: Duration = Duration::from_secs(120);
/// Slack on top of a worker's own deadlines before the coordinator calls it lost.
const SLACK: Duration = Duration::from_secs(5);

/// One worker process and what it said about its GPU.
pub(super) struct Worker {
    pub(super) link: WorkerLink,
    pub(super) facts: DeviceFacts,
}

/// Workers started with one NCCL pin in their environment (none: the main set).
pub(super) struct Set {
    pub(super) pin: Option<(NcclAlgo, NcclProto)>,
    pub(super) workers: Vec<Worker>,
}

/// Something went wrong: a failure to report as it is, or workers to replace.
pub(super) enum Trouble {
    Fabric(FabricError),
    Restart(WorkerError),
}

impl From<FabricError> for Trouble {
    fn from(e: FabricError) -> Trouble {
        Trouble::Fabric(e)
    }
}

fn lost(e: LinkError) -> Trouble {
    Trouble::Restart(WorkerError::Link(e))
}

fn spawn(
    program: &std::path::Path,
    dtypes: &[Dtype],
    ordinal: usize,
    cpus: &Option<String>,
    pin: Option<(NcclAlgo, NcclProto)>,
    launches: usize,
    who: &str,
) -> Result<WorkerLink, FabricError> {
    let mut args = vec!["__worker".into(), "--ordinal".into(), ordinal.to_string()];
    if let Some(c) = cpus {
        args.extend(["--cpus".into(), c.clone()]);
    }
    if let Some(d) = crate::fabric::cuda::worker::dtypes_arg(dtypes) {
        args.extend(["--dtypes".into(), d]);
    }
    // Each pinned variant runs in workers started with its environment: NCCL reads it when
    // a communicator is created, and nothing changes the environment of a live process.
    let mut env = match pin {
        Some((a, p)) => nccl::pin_env(a.name(), p.name()).to_vec(),
        None => Vec::new(),
    };
    if let Some(q) = queues(launches).filter(|_| std::env::var_os(QUEUES).is_none()) {
        env.push((QUEUES.into(), q.to_string()));
    }
    let loaded = nccl::library().ok().map(|l| l.path.as_str());
    env.extend(same_nccl(std::env::var_os(nccl::ENV_LIB).is_some(), loaded));
    // With -v the workers log their own steps too (the coordinator forwards their lines).
    if tracing::enabled!(tracing::Level::INFO) && std::env::var_os("RUST_LOG").is_none() {
        env.push(("RUST_LOG".into(), "info".into()));
    }
    let spawn = Spawn {
        program: program.to_path_buf(),
        args,
        env,
    };
    WorkerLink::start(&spawn, who).map_err(|e| FabricError::Worker(WorkerError::Link(e)))
}

const QUEUES: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// The hardware queues a worker launching `ranks` ranks needs, where CUDA's default 8 do not
/// suffice: a probe runs a stream per rank beside the stream that releases their latch, and
/// with too few queues the release shares one with a probe waiting on it and never runs.
/// The latch's stream is made just before the ranks' (probe.rs), so `ranks + 1` queues keep
/// them apart. No more: queues are made with the context, and worker 0's 32 cost it 0.45 s
/// to open and 0.3 s to exit on the H100 (profiles/hardware/h100/2026-12-05-trace).
fn queues(ranks: usize) -> Option<usize> {
    (ranks + 1 > 8).then_some(ranks + 1)
}

/// The NCCL a worker loads: the file this process loaded (`loaded`), which the profile
/// records, unless the user named one (`named`). Named, a worker loads it without searching
/// again (the search asks python3 for its sys.path: a process start on each worker's first
/// NCCL set-up).
fn same_nccl(named: bool, loaded: Option<&str>) -> Option<(String, String)> {
    match (named, loaded) {
        (false, Some(path)) => Some((nccl::ENV_LIB.into(), path.into())),
        _ => None,
    }
}

/// Reads a started worker's hello within what is left of the shared start-up deadline.
fn hello(mut link: WorkerLink, who: &str, end: std::time::Instant) -> Result<Worker, FabricError> {
    let left = end.saturating_duration_since(std::time::Instant::now());
    match link.recv(left.max(ANSWER_GRACE)) {
        Ok(Resp::Hello { facts, .. }) => Ok(Worker { link, facts }),
        Ok(Resp::Failed(e)) => Err(e.into_fabric()),
        Ok(other) => Err(FabricError::Worker(WorkerError::NotHello {
            who: who.into(),
            answer: clip(&format!("{other:?}"), 120),
        })),
        Err(e) => Err(WorkerError::Start {
            why: Box::new(WorkerError::Link(e)),
            gpu_visible: crate::fabric::cuda::visible_gpus() > 0,
        }
        .into()),
    }
}

/// What a worker's answer may still take once the shared deadline of a request has passed.
const ANSWER_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

impl CudaFabric {
    pub(super) fn start_set(&self, pin: Option<(NcclAlgo, NcclProto)>) -> Result<Set, FabricError> {
        #[cfg(test)]
        if let Some(script) = &self.script {
            let end = std::time::Instant::now() + HELLO_DEADLINE;
            let workers = (0..self.slots.len())
                .map(|i| hello(script(i), &format!("{i} (scripted)"), end))
                .collect::<Result<_, _>>()?;
            return Ok(Set { pin, workers });
        }
        start_set(
            &self.program,
            &self.dtypes,
            &self.slots,
            self.loopback.is_some().then_some(self.launch_each),
            pin,
        )
    }

    /// Sends each `(worker, request)` of set `set`, then collects every answer within
    /// `limit`: requests that belong together (one collective) run at the same time.
    pub(super) fn exchange(
        &mut self,
        set: usize,
        reqs: Vec<(usize, Req)>,
        limit: Duration,
    ) -> Result<Vec<Resp>, Trouble> {
        self.exchange_sets(
            reqs.into_iter().map(|(w, r)| ((set, w), r)).collect(),
            limit,
        )
    }

    /// [`CudaFabric::exchange`] over workers of any sets, `((set, worker), request)`: all are
    /// sent before any answer is awaited, so the sets work side by side.
    pub(super) fn exchange_sets(
        &mut self,
        reqs: Vec<((usize, usize), Req)>,
        limit: Duration,
    ) -> Result<Vec<Resp>, Trouble> {
        if reqs.iter().any(|((s, _), _)| *s >= self.sets.len()) {
            return Err(Trouble::Fabric(no_workers()));
        }
        if reqs.iter().any(|(_, r)| awaits_kernels(r)) {
            crate::fabric::cuda::prefetch::wait();
        }
        for ((s, w), r) in &reqs {
            self.sets[*s].workers[*w].link.send(r).map_err(lost)?;
        }
        let mut out = Vec::new();
        let mut first: Option<Trouble> = None;
        // One deadline for all: the workers run side by side, so k silent ones cost the
        // limit once, not k times (each still gets a moment to deliver what it sent).
        let end = std::time::Instant::now() + limit;
        for &((s, w), _) in &reqs {
            let left = end.saturating_duration_since(std::time::Instant::now());
            match self.sets[s].workers[w].link.recv(left.max(ANSWER_GRACE)) {
                Ok(Resp::Failed(WireError::Device { error, stuck: true })) => {
                    first.get_or_insert(Trouble::Restart(WorkerError::Stuck(error)));
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

    /// Kills every worker and reaps them all under one deadline.
    pub(super) fn retire_all(&mut self) {
        let mut links: Vec<&mut WorkerLink> = self
            .sets
            .iter_mut()
            .flat_map(|s| s.workers.iter_mut().map(|w| &mut w.link))
            .collect();
        for l in links.iter_mut() {
            l.retire();
        }
        shutdown_all(&mut links, Duration::ZERO);
    }

    /// Asks every worker to exit and waits for all of them under one deadline (`limit`),
    /// killing those still there after it.
    /// Returns when each was found gone (see [`shutdown_all`]).
    pub(super) fn shutdown_all(&mut self, limit: Duration) -> Vec<Option<Duration>> {
        let mut links: Vec<&mut WorkerLink> = self
            .sets
            .iter_mut()
            .flat_map(|s| s.workers.iter_mut().map(|w| &mut w.link))
            .collect();
        shutdown_all(&mut links, limit)
    }

    pub(super) fn one(
        &mut self,
        set: usize,
        w: usize,
        req: Req,
        limit: Duration,
    ) -> Result<Resp, Trouble> {
        Ok(self.exchange(set, vec![(w, req)], limit)?.remove(0))
    }

    pub(super) fn limit(&self, bytes: u64, calls: u32) -> Duration {
        #[cfg(test)]
        if let Some(l) = self.limit_for_tests {
            return l;
        }
        self.deadline.for_work(bytes, calls) + watchdog::DRAIN_DEADLINE + SLACK
    }

    /// Kills every worker and starts a fresh set with nothing prepared, on record: the
    /// worker loss `cause` on GPUs `group`, while `running` ran (and whether it is kept).
    /// The caller has already dropped what was prepared.
    pub(super) fn replace(
        &mut self,
        group: Vec<usize>,
        running: Option<(Backend, bool)>,
        cause: &WorkerError,
    ) -> Result<(), FabricError> {
        let r = crate::fabric::Recovery {
            group,
            backend: running.map(|(b, _)| b),
            kept: running.is_some_and(|(_, keep)| keep),
            bytes: self.at_bytes,
            cause: clip(&cause.to_string(), 300),
        };
        tracing::warn!("recovered: {r}");
        self.recovered.push(r);
        self.retire_all();
        self.sets.clear();
        self.comms.clear();
        self.probe_bytes = 0;
        self.probe_mapped = false;
        self.holding = false;
        self.sets.push(self.start_set(None)?);
        Ok(())
    }
}

/// Whether a worker may load its kernels answering `req`: every request but a group's
/// buffers. The kernels compiled ahead ([`crate::fabric::cuda::prefetch`]) are awaited before
/// the first such request rather than at the workers' hellos, so the first group's buffers
/// are set up while the compile ends (it outlasted the hellos by 1 s on the H200, speed3).
pub(super) fn awaits_kernels(req: &Req) -> bool {
    !matches!(req, Req::Setup { .. })
}

/// How many ranks worker `i` of `n` launches: in loopback (`Some(each)`) worker 0 launches every
/// rank unless each worker launches its own; elsewhere each its own.
fn launched(loopback: Option<bool>, i: usize, n: usize) -> usize {
    match (loopback, i) {
        (Some(false), 0) => n,
        (Some(false), _) => 0,
        _ => 1,
    }
}

/// Starts one worker per slot (CUDA ordinal, CPU list); `loopback`: `Some(each)` where the slots
/// are virtual ranks, `each` where every worker launches its own.
pub(super) fn start_set(
    program: &std::path::Path,
    dtypes: &[Dtype],
    slots: &[(usize, Option<String>)],
    loopback: Option<bool>,
    pin: Option<(NcclAlgo, NcclProto)>,
) -> Result<Set, FabricError> {
    // All start at once (each opens a CUDA context), then each says hello.
    let mut started = Vec::new();
    for (i, (o, cpus)) in slots.iter().enumerate() {
        let who = match loopback {
            Some(_) => format!("{i} (loopback rank {i} on GPU {o})"),
            None => format!("for GPU {o}"),
        };
        started.push((
            spawn(
                program,
                dtypes,
                *o,
                cpus,
                pin,
                launched(loopback, i, slots.len()),
                &who,
            )?,
            who,
        ));
    }
    // One deadline for all: they open their contexts side by side, so k wedged GPUs cost
    // the start-up deadline once, not k times.
    let end = std::time::Instant::now() + HELLO_DEADLINE;
    let mut workers: Vec<Worker> = Vec::new();
    let mut rest: Vec<WorkerLink> = Vec::new();
    let mut failed = None;
    for (link, who) in started {
        match failed {
            None => match hello(link, &who, end) {
                Ok(w) => workers.push(w),
                Err(e) => failed = Some(e),
            },
            Some(_) => rest.push(link),
        }
    }
    if let Some(e) = failed {
        // All are ended together, not one Drop after another.
        let mut links: Vec<&mut WorkerLink> = workers.iter_mut().map(|w| &mut w.link).collect();
        links.extend(rest.iter_mut());
        for l in links.iter_mut() {
            l.retire();
        }
        shutdown_all(&mut links, Duration::ZERO);
        return Err(e);
    }
    Ok(Set { pin, workers })
}

/// What every request gets once fresh workers could not be started after a fault.
pub(super) fn no_workers() -> FabricError {
    FabricError::BadRequest(
        "no GPU workers are running (fresh ones could not be started after a fault); open the \
         fabric again"
            .into(),
    )
}

pub(super) fn unexpected(r: Resp) -> Trouble {
    let s = clip(&format!("{r:?}"), 120);
    Trouble::Restart(WorkerError::OutOfTurn(s))
}

#[cfg(test)]
#[test]
fn workers_load_the_nccl_this_process_loaded_unless_the_user_named_one() {
    let env = same_nccl(false, Some("/usr/lib/libnccl.so.2.28.3"));
    assert_eq!(
        env,
        Some((
            "ARTUNE_NCCL_LIB".to_string(),
            "/usr/lib/libnccl.so.2.28.3".to_string()
        ))
    );
    assert_eq!(same_nccl(true, Some("/usr/lib/libnccl.so.2")), None);
    assert_eq!(same_nccl(false, None), None);
}

#[cfg(test)]
#[test]
fn only_a_groups_buffers_are_set_up_before_the_kernels_compiled_ahead_are_awaited() {
    use crate::fabric::{Dtype, Group};
    let shape = crate::fabric::cuda::protocol::Shape::of(&Group::flat(vec![0, 1], Dtype::Bf16, 1));
    let setup = Req::Setup {
        shape,
        owned: vec![0],
        custom: vec![Backend::OneStagePull],
    };
    assert!(!awaits_kernels(&setup));
    let connect = Req::Connect {
        shape,
        launch: crate::fabric::cuda::protocol::Launch { base: 0, count: 2 },
        ranks: Vec::new(),
    };
    assert!(awaits_kernels(&connect));
    assert!(awaits_kernels(&Req::LinksUnderLoad));
}

#[cfg(test)]
mod tests {
    use super::queues;

    #[test]
    fn a_launcher_gets_a_queue_per_probe_stream_and_one_for_the_latch_only_past_cudas_eight() {
        assert_eq!(queues(0), None);
        assert_eq!(queues(1), None);
        assert_eq!(queues(7), None);
        assert_eq!(queues(8), Some(9));
        assert_eq!(queues(16), Some(17));
    }
}

//! One worker process (`artune __worker --ordinal N`): owns one GPU's context, the buffers of
//! the ranks it owns, the kernels and NCCL rank of the ranks it launches, and answers the
//! coordinator's requests ([`super::protocol`]) one line at a time until its stdin closes,
//! replying on the channel the coordinator passed; its stdout is only a log.

use std::io::BufRead;

use super::driver;
use super::probe::{ProbeLauncher, ProbeOwned};
use super::protocol::{write_resp, Envelope, Req, Resp, WireError, ENV_REPLY_FD, HELLO_ID};
use super::setup::{Launcher, Owned};
use super::watchdog::Deadline;
use super::worker_nccl::KeptRanks;
use super::{Gpu, WorkerFaults};
use crate::fabric::{DeviceError, Dtype, FabricError};

/// Testing only: `quick` ends a worker with `_exit`, skipping the CUDA driver's exit handler
/// (its context torn down by the kernel instead), to compare what each exit takes.
pub const ENV_WORKER_EXIT: &str = "ARTUNE_WORKER_EXIT";

/// The launcher an NCCL request needs: the group's, once connected.
fn connected(launcher: &mut Option<Launcher>) -> Result<&mut Launcher, FabricError> {
    launcher
        .as_mut()
        .ok_or_else(|| FabricError::BadRequest("connect before NCCL".into()))
}

/// The `--dtypes` argument that has a worker load the kernels of `dtypes` only; None where
/// they are every type (the worker's default). A worker compiles and loads the kernels of
/// the types it is told, and loading fewer units makes a first tune's compile shorter.
pub fn dtypes_arg(dtypes: &[Dtype]) -> Option<String> {
    let all = Dtype::ALL.iter().all(|d| dtypes.contains(d));
    let ids: Vec<&str> = dtypes.iter().map(|d| d.id()).collect();
    (!all && !ids.is_empty()).then(|| ids.join(","))
}

/// The element types of a worker's `--dtypes` ids ([`dtypes_arg`]): every type where none is
/// named or one is not known (loading more is never wrong).
pub fn parse_dtypes(ids: &[String]) -> Vec<Dtype> {
    let named: Option<Vec<Dtype>> = (ids.iter())
        .map(|s| Dtype::ALL.into_iter().find(|d| d.id() == s))
        .collect();
    match named {
        Some(v) if !v.is_empty() => v,
        _ => Dtype::ALL.to_vec(),
    }
}

/// A request handed to the wrong handler: a bug in the dispatch above it.
fn not_for(req: &Req, kind: &str) -> FabricError {
    FabricError::BadRequest(format!("{req:?} is not a {kind} request"))
}

/// Everything one worker holds.
pub struct WorkerState {
    gpu: Gpu,
    deadline: Deadline,
    faults: WorkerFaults,
    /// Launcher before owned buffers in drop order: opened handles close before the owner's
    /// buffers are freed (they may be the same process in loopback).
    launcher: Option<Launcher>,
    probe: Option<ProbeLauncher>,
    owned: Option<Owned>,
    probe_owned: Option<ProbeOwned>,
    /// NCCL ranks of groups closed, for the next group with the same ranks (`worker_nccl`).
    kept: KeptRanks,
}

impl WorkerState {
    pub fn open(ordinal: usize, dtypes: &[Dtype]) -> Result<WorkerState, FabricError> {
        let t = std::time::Instant::now();
        let gpu = Gpu::open_for(ordinal, dtypes)?;
        tracing::info!(
            "worker {}: GPU {ordinal}'s context opened in {:.2} s",
            std::process::id(),
            t.elapsed().as_secs_f64()
        );
        let mut faults = WorkerFaults::from_env();
        faults.arm(&gpu)?;
        Ok(WorkerState {
            gpu,
            deadline: Deadline::from_env(),
            faults,
            launcher: None,
            probe: None,
            owned: None,
            probe_owned: None,
            kept: KeptRanks::default(),
        })
    }

    fn handle(&mut self, req: Req) -> Result<Resp, FabricError> {
        if let Some(why) = self.gpu.ctx.poisoned() {
            return Err(why.clone().into());
        }
        match req {
            Req::ProbeSetup { .. }
            | Req::ProbeConnect { .. }
            | Req::ProbeDisconnect
            | Req::ProbeQueue { .. }
            | Req::ProbeRelease { .. }
            | Req::ProbeFinish { .. } => self.probe_request(req),
            Req::NcclId | Req::NcclInit { .. } | Req::NcclReuse { .. } | Req::NcclRetire { .. } => {
                self.nccl_request(req)
            }
            Req::Copy {
                bytes,
                batch,
                samples,
            } => Ok(Resp::Times(self.gpu.time_copy(
                bytes,
                batch,
                samples,
                self.deadline,
            )?)),
            Req::LinksUnderLoad => Ok(Resp::Links(self.gpu.load_and_read()?)),
            other => self.group_request(other),
        }
    }

    /// Setting a group up, running its backends and releasing it.
    fn group_request(&mut self, req: Req) -> Result<Resp, FabricError> {
        Ok(match req {
            Req::Setup {
                shape,
                owned,
                custom,
            } => {
                self.probe = None;
                self.close_launcher();
                self.owned = None;
                let gpu = &self.gpu;
                let (o, ranks, memory) = Owned::new(gpu, shape, &owned, &custom)?;
                self.owned = Some(o);
                Resp::Setup { ranks, memory }
            }
            Req::Connect {
                shape,
                launch,
                ranks,
            } => {
                self.close_launcher();
                let gpu = &self.gpu;
                let kernels = gpu
                    .kernels()
                    .map(|k| k.images.clone())
                    .map_err(|e| e.to_string());
                let (l, (broken, unready)) = Launcher::connect(
                    gpu,
                    self.owned.as_ref(),
                    shape,
                    launch,
                    &ranks,
                    self.deadline,
                    &self.faults,
                )?;
                self.launcher = Some(l);
                Resp::Connected {
                    kernels,
                    broken,
                    unready,
                }
            }
            Req::Stage {
                backend,
                bytes,
                seed,
            } => {
                let gpu = &self.gpu;
                let l = self.launcher.as_mut().ok_or_else(no_group)?;
                l.stage(gpu, backend, bytes, seed)?;
                Resp::Done
            }
            Req::Check {
                backend,
                bytes,
                seed,
                mode,
                calls,
            } => {
                self.faults.maybe_stall(backend);
                let (gpu, faults) = (&self.gpu, &self.faults);
                let l = self.launcher.as_mut().ok_or_else(no_group)?;
                Resp::Checked(l.check(gpu, faults, backend, bytes, seed, mode, calls)?)
            }
            Req::Time {
                backend,
                bytes,
                mode,
                batch,
                samples,
                rendezvous,
            } => {
                self.faults.maybe_stall(backend);
                let (gpu, faults) = (&self.gpu, &self.faults);
                let l = self.launcher.as_mut().ok_or_else(no_group)?;
                Resp::Times(l.time(
                    gpu, faults, backend, bytes, mode, batch, samples, rendezvous,
                )?)
            }
            Req::Orient { dirs } => {
                let l = self.launcher.as_mut().ok_or_else(no_group)?;
                l.orient(dirs);
                Resp::Done
            }
            Req::Drop { backend } => {
                if let Some(l) = self.launcher.as_mut() {
                    l.forget(backend);
                    l.drain()?;
                }
                Resp::Done
            }
            Req::Disconnect => {
                let t = std::time::Instant::now();
                self.probe = None;
                self.close_launcher();
                let what = format!(
                    "imports closed (graphs, peers' buffers; {} NCCL ranks kept)",
                    self.kept.count()
                );
                took(&what, t);
                Resp::Done
            }
            Req::Release => {
                let t = std::time::Instant::now();
                self.probe = None;
                self.close_launcher();
                self.probe_owned = None;
                self.owned = None;
                driver::sync_ctx(&self.gpu.ctx, "synchronizing the GPU")?;
                took("buffers freed", t);
                Resp::Done
            }
            other => return Err(not_for(&other, "group")),
        })
    }

    /// NCCL ranks: created from an id, taken back from the last group, or destroyed.
    fn nccl_request(&mut self, req: Req) -> Result<Resp, FabricError> {
        Ok(match req {
            Req::NcclId => Resp::NcclId(super::nccl::unique_id().map_err(DeviceError::Nccl)?),
            Req::NcclInit {
                backend,
                id,
                rank,
                nranks,
            } => {
                let (gpu, l) = (&self.gpu, connected(&mut self.launcher)?);
                Resp::Memory(l.nccl_init(gpu, backend, &id, rank, nranks)?)
            }
            Req::NcclReuse {
                backend,
                rank,
                nranks,
            } => {
                let (gpu, l) = (&self.gpu, connected(&mut self.launcher)?);
                let kept = self.kept.take(backend, rank, nranks).ok_or_else(|| {
                    FabricError::BadRequest(format!(
                        "no NCCL rank {rank} of {nranks} for {backend} is kept on this worker"
                    ))
                })?;
                Resp::Memory(l.nccl_reuse(gpu, kept)?)
            }
            Req::NcclRetire { backends } => {
                for backend in backends {
                    let t = std::time::Instant::now();
                    if self.kept.retire(backend) {
                        took(&format!("{backend}'s kept NCCL rank destroyed"), t);
                    }
                }
                Resp::Done
            }
            other => return Err(not_for(&other, "NCCL")),
        })
    }

    /// The contention probe's buffers, their mapping by the launchers, and its rounds.
    fn probe_request(&mut self, req: Req) -> Result<Resp, FabricError> {
        let gpu = &self.gpu;
        Ok(match req {
            Req::ProbeSetup { bytes, owned, n } => {
                self.probe = None;
                self.probe_owned = None;
                let (p, h) = ProbeOwned::new(gpu, bytes, &owned, n)?;
                self.probe_owned = Some(p);
                Resp::Probe(h)
            }
            Req::ProbeConnect { launch, n, ranks } => {
                self.probe = None;
                let p = ProbeLauncher::connect(gpu, self.probe_owned.as_ref(), launch, n, &ranks)?;
                self.probe = Some(p);
                Resp::Done
            }
            Req::ProbeDisconnect => {
                self.probe = None;
                Resp::Done
            }
            Req::ProbeQueue {
                direction,
                peers,
                bytes,
                epoch,
            } => {
                let p = self.probe.as_ref().ok_or_else(no_group)?;
                p.queue(gpu, direction, peers, bytes, epoch)?;
                Resp::Done
            }
            Req::ProbeRelease { epoch } => {
                let p = self.probe_owned.as_ref().ok_or_else(no_group)?;
                p.release(epoch)?;
                Resp::Done
            }
            Req::ProbeFinish { bytes, peers } => {
                let p = self.probe.as_ref().ok_or_else(no_group)?;
                let (secs, links) = p.finish(gpu, bytes, peers)?;
                Resp::Probed { secs, links }
            }
            other => return Err(not_for(&other, "probe")),
        })
    }

    /// Drops the launcher, keeping its NCCL ranks for the next group.
    fn close_launcher(&mut self) {
        if let Some(mut l) = self.launcher.take() {
            self.kept.keep(l.take_nccl());
        }
    }

    /// Whether this worker's GPU is stuck: work on its context may never finish (a wait
    /// that expired, a stream that never drained), so the coordinator must replace it.
    fn note_stuck(&mut self) -> bool {
        self.gpu.ctx.poisoned().is_some()
    }
}

/// Logs what a step of this worker took (`-v`: the coordinator shows its workers' lines).
fn took(what: &str, since: std::time::Instant) {
    tracing::info!(
        "worker {}: {what} in {:.2} s",
        std::process::id(),
        since.elapsed().as_secs_f64()
    );
}

fn no_group() -> FabricError {
    FabricError::BadRequest("no group is prepared on this worker; set it up first".into())
}

impl Drop for WorkerState {
    /// At exit (end of input, or an early return) without a Release: what this worker opened
    /// of its peers' buffers is closed first; what it exported is never freed here, since a
    /// peer exiting at the same moment may still map it. The process's end reclaims it with
    /// the context, as it does everything on a poisoned context (see driver::Ctx). So do its
    /// NCCL ranks, the launcher's and those kept (`worker_nccl`): the peers exit too.
    fn drop(&mut self) {
        self.probe = None;
        self.close_launcher();
        let n = self.kept.leave_to_exit();
        if n > 0 {
            tracing::info!(
                "worker {}: {n} NCCL ranks left to the process's exit",
                std::process::id()
            );
        }
        std::mem::forget(self.probe_owned.take());
        std::mem::forget(self.owned.take());
    }
}

/// Pins this process to `cpus` (a Linux cpulist, "0-23,48-71"); None when it cannot parse.
pub fn pin_cpus(cpus: &str) -> Option<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let mut any = false;
    for part in cpus.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (
                a.trim().parse::<usize>().ok()?,
                b.trim().parse::<usize>().ok()?,
            ),
            None => {
                let a = part.trim().parse::<usize>().ok()?;
                (a, a)
            }
        };
        for c in a..=b.min(1023) {
            // SAFETY: c < CPU_SETSIZE (1024).
            unsafe { libc::CPU_SET(c, &mut set) };
            any = true;
        }
    }
    if !any {
        return None;
    }
    // SAFETY: pins the calling process to a valid set.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    (r == 0).then_some(())
}

/// The reply channel the coordinator passed ([`ENV_REPLY_FD`]), closed on exec so nothing
/// the worker might start inherits it.
fn reply_channel() -> Option<std::fs::File> {
    use std::os::fd::FromRawFd;
    let fd: i32 = std::env::var(ENV_REPLY_FD).ok()?.parse().ok()?;
    // SAFETY: fcntl on a descriptor number only queries or sets its flags.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: the descriptor is open (fcntl succeeded) and this process owns it alone.
    Some(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// The worker's main loop: says hello (or why the GPU could not be opened), then answers each
/// request line until stdin closes, with the kernels of `dtypes`. Returns the exit code.
pub fn serve(ordinal: usize, cpus: Option<&str>, dtypes: &[Dtype]) -> i32 {
    // The coordinator handles Ctrl-C and SIGTERM (sent to the whole process group by a
    // terminal or `timeout`) and shuts workers down; the parent-death signal it armed before
    // exec keeps a worker from outliving it.
    // SAFETY: plain signal dispositions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
    let Some(mut out) = reply_channel() else {
        eprintln!(
            "artune __worker is started by artune's coordinator, which passes its reply \
             channel in {ENV_REPLY_FD}; it cannot run on its own"
        );
        return 2;
    };
    if let Some(c) = cpus {
        if pin_cpus(c).is_none() {
            tracing::warn!("worker for GPU {ordinal}: could not pin to CPUs {c}");
        }
    }
    let mut engine = match WorkerState::open(ordinal, dtypes) {
        Ok(e) => e,
        Err(e) => {
            let failed = Resp::Failed(WireError::from_fabric(e, false));
            let _ = write_resp(&mut out, HELLO_ID, &failed);
            return 4;
        }
    };
    let hello = Resp::Hello {
        facts: engine.gpu.facts.clone(),
        pid: std::process::id(),
    };
    if write_resp(&mut out, HELLO_ID, &hello).is_err() {
        return 4;
    }
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let (id, resp) = match serde_json::from_str::<Envelope<serde_json::Value>>(&line) {
            Ok(Envelope { id, body }) => match serde_json::from_value::<Req>(body) {
                Ok(req) => match engine.handle(req) {
                    Ok(r) => (id, r),
                    Err(e) => {
                        let stuck = engine.note_stuck();
                        (id, Resp::Failed(WireError::from_fabric(e, stuck)))
                    }
                },
                Err(e) => (
                    id,
                    Resp::Failed(WireError::BadRequest(format!(
                        "the worker could not read request {id} ({e})"
                    ))),
                ),
            },
            // No id to answer: the coordinator's wait for it runs out, and it replaces us.
            Err(e) => {
                tracing::error!("the worker could not read a request ({e})");
                continue;
            }
        };
        if write_resp(&mut out, id, &resp).is_err() {
            break;
        }
    }
    let t = std::time::Instant::now();
    drop(engine);
    took("its input ended; its GPU released", t);
    if std::env::var(ENV_WORKER_EXIT).is_ok_and(|v| v == "quick") {
        super::prefetch::exit_now(0);
    }
    0
}

#[cfg(test)]
mod tests {
    use super::{dtypes_arg, parse_dtypes};
    use crate::fabric::Dtype;

    #[test]
    fn a_worker_is_told_the_types_it_loads_and_loads_all_where_told_none() {
        assert_eq!(dtypes_arg(&Dtype::ALL), None);
        assert_eq!(dtypes_arg(&[]), None);
        for d in [vec![Dtype::Bf16], vec![Dtype::Fp16, Dtype::Fp32]] {
            let arg = dtypes_arg(&d).unwrap();
            let ids: Vec<String> = arg.split(',').map(String::from).collect();
            assert_eq!(parse_dtypes(&ids), d, "{arg}");
        }
        assert_eq!(parse_dtypes(&[]), Dtype::ALL.to_vec());
        assert_eq!(parse_dtypes(&["fp8".into()]), Dtype::ALL.to_vec());
    }
}

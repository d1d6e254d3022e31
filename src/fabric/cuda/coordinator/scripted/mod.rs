//! Tests of IPC buffer lifetimes: the coordinator drives scripted workers (threads speaking
//! the worker protocol over pipes, [`WorkerLink::scripted`]) that keep what a real worker would hold
//! and record every export, map (cuIpcOpenMemHandle), close and free they are asked to do. The
//! rule checked: no exported buffer is freed while any peer maps it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::CudaFabric;
use crate::fabric::cuda::driver::{DeviceFacts, IpcHandle};
use crate::fabric::cuda::link::{Scripted, WorkerLink};
use crate::fabric::cuda::protocol::{BufHandles, ProbeHandles, RankHandles, Req, Resp, WireError};
use crate::fabric::cuda::topo;
use crate::fabric::cuda::watchdog::Deadline;
use crate::fabric::{Backend, Dtype, FabricInfo, Group, Mode};

/// Makes the worker of one slot (a fresh one each call: a restart calls it again).
pub(super) type Script = Arc<dyn Fn(usize) -> WorkerLink + Send + Sync>;

#[derive(Debug, Clone, PartialEq)]
enum Ev {
    Export(usize, String),
    Map(usize, String),
    Close(usize, String),
    Free(usize, String),
    /// The worker ended (its process gone: its maps die with it).
    Exit(usize),
}

/// A request kind ("Connect", "Stage", ...) on which worker `.0` fails or dies, or on which
/// every worker of slot `.0` dies (the first and each fresh one: a backend that kills it), or
/// on which worker `.0` answers only after `.2` ms; and a worker whose Connect reply names a
/// rank that does not exist among the broken ones; or fresh workers that cannot start.
#[derive(Default)]
struct Plot {
    fail: Option<(usize, &'static str)>,
    die: Option<(usize, &'static str)>,
    die_in_slot: Option<(usize, &'static str)>,
    late: Option<(usize, &'static str, u64)>,
    bad_broken: Option<usize>,
    /// A request kind on which worker `.0` fails its backend (a timeout: the backend goes).
    fail_backend: Option<(usize, &'static str)>,
    /// Fresh workers fail to start.
    no_start: bool,
    /// Launchers that must all have taken up their Connect before any answers it.
    connect_together: Option<usize>,
}

#[derive(Default)]
struct World {
    log: Vec<Ev>,
    /// Each request as a worker took it up (false) and answered it (true): (worker, kind, _).
    said: Vec<(usize, String, bool)>,
    workers: usize,
    plot: Plot,
    /// What each worker did with NCCL communicators: (worker, "init"/"reuse"/"retire"/
    /// "exit", backend).
    comms: Vec<(usize, &'static str, Backend)>,
    /// Connects taken up so far, and whether one waited for the others in vain.
    connecting: usize,
    connected_alone: bool,
    /// Each verification's calls in a row: (worker, backend, bytes, mode, calls).
    checked: Vec<(usize, Backend, u64, Mode, u32)>,
}

type Shared = Arc<Mutex<World>>;

/// What one scripted worker holds, as [`crate::fabric::cuda::worker::WorkerState`] does.
struct Fake {
    id: usize,
    slot: usize,
    world: Shared,
    owned: Vec<String>,
    probe_owned: Vec<String>,
    imports: Vec<String>,
    probe_imports: Vec<String>,
    next: usize,
    /// NCCL ranks in the launcher, and kept past it (as `worker_nccl`): (backend, rank, n).
    live: Vec<(Backend, usize, usize)>,
    kept: Vec<(Backend, usize, usize)>,
}

fn kind(r: &Req) -> String {
    let s = format!("{r:?}");
    s.split([' ', '{', '(']).next().unwrap_or("").to_string()
}

impl Fake {
    fn log(&self, e: Ev) {
        self.world.lock().unwrap().log.push(e);
    }

    fn comm(&self, what: &'static str, b: Backend) {
        self.world.lock().unwrap().comms.push((self.id, what, b));
    }

    /// The launcher goes: its NCCL ranks are kept.
    fn close_launcher(&mut self) {
        self.kept.append(&mut self.live);
    }

    fn export(&mut self, what: &str, probe: bool) -> IpcHandle {
        self.next += 1;
        let hex = format!("w{}-{what}-{}", self.id, self.next);
        self.log(Ev::Export(self.id, hex.clone()));
        match probe {
            true => self.probe_owned.push(hex.clone()),
            false => self.owned.push(hex.clone()),
        }
        IpcHandle {
            hex,
            bytes: 1 << 20,
        }
    }

    /// Opens a peer's handle; false, logging nothing, where its owner has exited, as the
    /// driver refuses the handle of a process gone (a Connect racing a peer's death).
    fn map(&mut self, h: &IpcHandle, probe: bool) -> bool {
        if self.owned.contains(&h.hex) || self.probe_owned.contains(&h.hex) {
            return true;
        }
        {
            let mut w = self.world.lock().unwrap();
            let owner = h.hex[1..].split('-').next().and_then(|o| o.parse().ok());
            if owner.is_some_and(|o| w.log.contains(&Ev::Exit(o))) {
                return false;
            }
            w.log.push(Ev::Map(self.id, h.hex.clone()));
        }
        match probe {
            true => self.probe_imports.push(h.hex.clone()),
            false => self.imports.push(h.hex.clone()),
        }
        true
    }

    /// Opens every handle, stopping at the first refused: the device error a worker answers.
    fn map_all<'a>(
        &mut self,
        hs: impl IntoIterator<Item = &'a IpcHandle>,
        probe: bool,
    ) -> Result<(), Resp> {
        for h in hs {
            if !self.map(h, probe) {
                return Err(Resp::Failed(WireError::Device {
                    error: crate::fabric::DeviceError::Driver {
                        what: format!("cuIpcOpenMemHandle of {}", h.hex),
                        code: "CUDA_ERROR_INVALID_VALUE: its owner has exited".into(),
                    },
                    stuck: false,
                }));
            }
        }
        Ok(())
    }

    /// Closes imports after a pause, so that an owner told to free too early frees first.
    fn close(&mut self, probe: bool) {
        let v = match probe {
            true => std::mem::take(&mut self.probe_imports),
            false => std::mem::take(&mut self.imports),
        };
        if !v.is_empty() {
            std::thread::sleep(Duration::from_millis(30));
        }
        for h in v {
            self.log(Ev::Close(self.id, h));
        }
    }

    fn free(&mut self, probe: bool) {
        let v = match probe {
            true => std::mem::take(&mut self.probe_owned),
            false => std::mem::take(&mut self.owned),
        };
        for h in v {
            self.log(Ev::Free(self.id, h));
        }
    }

    /// At the end of its input a worker closes its imports and exits; the exit frees what it
    /// exported (the driver reclaims a process's memory), whether or not a peer maps it. Slot
    /// k takes (k + 1) x 20 ms to close, so peers exiting together overlap. A killed one
    /// runs nothing: its maps and buffers just go with it.
    fn end(&mut self, killed: bool) {
        if killed {
            return;
        }
        let imports: Vec<String> = self
            .probe_imports
            .drain(..)
            .chain(self.imports.drain(..))
            .collect();
        if !imports.is_empty() {
            std::thread::sleep(Duration::from_millis(20 * (self.slot as u64 + 1)));
        }
        for h in imports {
            self.log(Ev::Close(self.id, h));
        }
        self.free(true);
        self.free(false);
        self.close_launcher();
        for (b, ..) in std::mem::take(&mut self.kept) {
            self.comm("exit", b);
        }
    }

    /// NCCL ranks: created, taken back from the last group, destroyed, dropped.
    fn nccl(&mut self, req: Req) -> Resp {
        match req {
            Req::NcclInit {
                backend,
                rank,
                nranks,
                ..
            } => {
                self.comm("init", backend);
                self.live.push((backend, rank, nranks));
                Resp::Memory(Ok(1 << 20))
            }
            Req::NcclReuse {
                backend,
                rank,
                nranks,
            } => match self.kept.iter().position(|k| *k == (backend, rank, nranks)) {
                Some(at) => {
                    self.comm("reuse", backend);
                    self.live.push(self.kept.remove(at));
                    Resp::Memory(Ok(1 << 20))
                }
                None => Resp::Failed(WireError::BadRequest(format!(
                    "no NCCL rank {rank} of {nranks} for {backend} is kept on this worker"
                ))),
            },
            Req::NcclRetire { backends } => {
                for backend in backends {
                    if let Some(at) = self.kept.iter().position(|k| k.0 == backend) {
                        self.comm("retire", backend);
                        self.kept.remove(at);
                    }
                }
                Resp::Done
            }
            Req::Drop { backend } => {
                self.live.retain(|k| k.0 != backend);
                Resp::Done
            }
            other => Resp::Failed(WireError::BadRequest(format!("{other:?} is not NCCL's"))),
        }
    }

    /// What the plot makes of request kind `k` here: a late answer (then None: served), a
    /// failure (Some(Some)), or a death (Some(None)).
    #[allow(clippy::option_option)]
    fn plotted(&self, k: &str) -> Option<Option<Resp>> {
        let late = self.world.lock().unwrap().plot.late;
        if let Some((_, _, ms)) = late.filter(|&(w, on, _)| w == self.id && on == k) {
            std::thread::sleep(Duration::from_millis(ms));
        }
        let plot = self.world.lock().unwrap().plot.fail;
        if plot.is_some_and(|(w, on)| w == self.id && on == k) {
            return Some(Some(Resp::Failed(WireError::Device {
                error: crate::fabric::DeviceError::Nccl(format!("scripted failure of {k}")),
                stuck: false,
            })));
        }
        let plot = self.world.lock().unwrap().plot.fail_backend;
        if plot.is_some_and(|(w, on)| w == self.id && on == k) {
            return Some(Some(Resp::Failed(WireError::Backend {
                backend: Backend::Nccl,
                reason: format!("scripted failure of {k}"),
            })));
        }
        let (die, in_slot) = {
            let w = self.world.lock().unwrap();
            (w.plot.die, w.plot.die_in_slot)
        };
        if die.is_some_and(|(w, on)| w == self.id && on == k)
            || in_slot.is_some_and(|(s, on)| s == self.slot && on == k)
        {
            return Some(None);
        }
        None
    }

    fn serve(&mut self, input: Scripted) -> Option<Resp> {
        let req = match input {
            Scripted::Req(r) => r,
            Scripted::End { killed } => {
                self.end(killed);
                return None;
            }
        };
        let k = kind(&req);
        self.world
            .lock()
            .unwrap()
            .said
            .push((self.id, k.clone(), false));
        if let Some(plotted) = self.plotted(&k) {
            return plotted;
        }
        let resp = match req {
            Req::Setup { owned, custom, .. } => {
                self.close_launcher();
                self.close(true);
                self.close(false);
                self.free(false);
                let ranks = owned
                    .iter()
                    .map(|&rank| RankHandles {
                        rank,
                        user_in: self.export("in", false),
                        user_out: self.export("out", false),
                        custom: custom
                            .iter()
                            .map(|&b| {
                                let scratch = Some(self.export("scratch", false));
                                let signal = self.export("signal", false);
                                let bufs = BufHandles {
                                    input: None,
                                    scratch,
                                    out: None,
                                    signal,
                                };
                                (b, bufs)
                            })
                            .collect(),
                    })
                    .collect();
                // Loopback owners after the first measure beside each other: more.
                let bytes = (1 << 20) + self.id as u64 * 4096;
                let memory = custom.iter().map(|&b| (b, Ok(bytes))).collect();
                Resp::Setup { ranks, memory }
            }
            Req::Connect { ranks, .. } => {
                self.together();
                self.close_launcher();
                self.close(false);
                for r in &ranks {
                    let custom = r.custom.iter().flat_map(|(_, b)| {
                        [&b.input, &b.scratch, &b.out]
                            .into_iter()
                            .flatten()
                            .chain([&b.signal])
                    });
                    let all = [&r.user_in, &r.user_out].into_iter().chain(custom);
                    if let Err(refused) = self.map_all(all, false) {
                        return Some(refused);
                    }
                }
                let bad = self.world.lock().unwrap().plot.bad_broken == Some(self.id);
                Resp::Connected {
                    kernels: Ok(scripted_images()),
                    broken: match bad {
                        true => vec![(99, "scripted: a rank that does not exist".into())],
                        false => Vec::new(),
                    },
                    unready: Vec::new(),
                }
            }
            Req::ProbeSetup { owned, .. } => {
                self.close(true);
                self.free(true);
                let h = owned
                    .iter()
                    .map(|&rank| ProbeHandles {
                        rank,
                        src: self.export("probe-src", true),
                        dst: self.export("probe-dst", true),
                        latch: (rank == 0).then(|| self.export("latch", true)),
                    })
                    .collect();
                Resp::Probe(h)
            }
            Req::ProbeConnect { ranks, .. } => {
                self.close(true);
                for r in &ranks {
                    let all = [&r.src, &r.dst].into_iter().chain(&r.latch);
                    if let Err(refused) = self.map_all(all, true) {
                        return Some(refused);
                    }
                }
                Resp::Done
            }
            Req::ProbeDisconnect => {
                self.close(true);
                Resp::Done
            }
            Req::Disconnect => {
                self.close_launcher();
                self.close(true);
                self.close(false);
                Resp::Done
            }
            Req::Release => {
                self.close_launcher();
                self.close(true);
                self.close(false);
                self.free(true);
                self.free(false);
                Resp::Done
            }
            Req::ProbeFinish { .. } => Resp::Probed {
                secs: vec![1e-3],
                links: Vec::new(),
            },
            Req::LinksUnderLoad => Resp::Links(Vec::new()),
            Req::Check {
                backend,
                bytes,
                mode,
                calls,
                ..
            } => {
                let mut w = self.world.lock().unwrap();
                w.checked.push((self.id, backend, bytes, mode, calls));
                Resp::Checked(None)
            }
            Req::Time { samples, .. } => Resp::Times(vec![1e-5; samples as usize]),
            Req::Copy { samples, .. } => Resp::Times(vec![1e-5; samples as usize]),
            Req::NcclId => Resp::NcclId("scripted".into()),
            r @ (Req::NcclInit { .. }
            | Req::NcclReuse { .. }
            | Req::NcclRetire { .. }
            | Req::Drop { .. }) => self.nccl(r),
            Req::Stage { .. }
            | Req::Orient { .. }
            | Req::ProbeQueue { .. }
            | Req::ProbeRelease { .. } => Resp::Done,
        };
        self.world.lock().unwrap().said.push((self.id, k, true));
        Some(resp)
    }
}

impl Drop for Fake {
    /// Its thread ended: asked to, killed with the others, or dying on cue.
    fn drop(&mut self) {
        if let Ok(mut w) = self.world.lock() {
            w.log.push(Ev::Exit(self.id));
        }
    }
}

/// The kernels a scripted worker says it loaded.
fn scripted_images() -> crate::fabric::LoadedKernels {
    use crate::fabric::cuda::compile::{record, Target};
    record(
        (13, 0),
        &Target::Cubin("sm_90".into()),
        &[("allreduce.cu", "scripted source", b"scripted image")],
    )
}

fn facts() -> DeviceFacts {
    DeviceFacts {
        ordinal: 0,
        name: "Scripted GPU".into(),
        cc: (9, 0),
        sms: 132,
        total_mem: 1 << 37,
        bus_id: "0000:00:06.0".into(),
    }
}

impl Fake {
    /// With `plot.connect_together`, waits (2 s at most) until that many launchers took up
    /// their Connect: one asked only after another answered waits in vain, and says so.
    fn together(&self) {
        let Some(n) = self.world.lock().unwrap().plot.connect_together else {
            return;
        };
        self.world.lock().unwrap().connecting += 1;
        let t = std::time::Instant::now();
        while self.world.lock().unwrap().connecting < n {
            if t.elapsed() > Duration::from_secs(2) {
                self.world.lock().unwrap().connected_alone = true;
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A loopback fabric of `k` scripted workers, each launching its own rank (so each maps the
/// other ranks' buffers, as on a real machine).
fn fabric(k: usize, world: &Shared) -> CudaFabric {
    let w = world.clone();
    let script: Script = Arc::new(move |slot| {
        let id = {
            let mut g = w.lock().unwrap();
            g.workers += 1;
            g.workers - 1
        };
        let mut fake = Fake {
            id,
            slot,
            world: w.clone(),
            owned: Vec::new(),
            probe_owned: Vec::new(),
            imports: Vec::new(),
            probe_imports: Vec::new(),
            next: 0,
            live: Vec::new(),
            kept: Vec::new(),
        };
        let hello = match w.lock().unwrap().plot.no_start {
            true => Resp::Failed(WireError::Device {
                error: crate::fabric::DeviceError::Bug("scripted: no GPU context".into()),
                stuck: false,
            }),
            false => Resp::Hello {
                facts: facts(),
                pid: 0,
            },
        };
        WorkerLink::scripted(&format!("scripted {id}"), hello, move |req| fake.serve(req))
    });
    let host = topo::host(None, None);
    let mut f = CudaFabric {
        program: "/nonexistent/scripted".into(),
        dtypes: crate::fabric::Dtype::ALL.to_vec(),
        loopback: Some(k),
        launch_each: true,
        slots: vec![(0, None); k],
        sets: Vec::new(),
        topo: topo::loopback(k, &facts(), host).unwrap(),
        map: (0..k).map(Some).collect(),
        info: FabricInfo {
            simulated: false,
            description: "scripted workers".into(),
            driver: None,
            cuda: None,
            nccl: None,
        },
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
        loopback_nccl: None,
        ranked: None,
        comms: Vec::new(),
        script: Some(script),
        limit_for_tests: None,
    };
    let set = f.start_set(None).unwrap();
    f.sets.push(set);
    f
}

fn group(k: usize) -> Group {
    Group::flat((0..k).collect(), Dtype::Bf16, 1 << 20)
}

/// Replays the log: every free finds no peer mapping the buffer, every map names a buffer
/// still allocated. Returns the buffers freed and those still mapped, or allocated by a
/// worker still alive, at the end (a worker's maps and buffers go with it).
fn check(log: &[Ev]) -> Result<(BTreeSet<String>, BTreeSet<String>), String> {
    let mut live: BTreeMap<String, usize> = BTreeMap::new();
    let mut mapped: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    let mut freed = BTreeSet::new();
    let mut dead = BTreeSet::new();
    for (i, e) in log.iter().enumerate() {
        match e {
            Ev::Export(w, h) => {
                live.insert(h.clone(), *w);
            }
            Ev::Map(w, h) => {
                if !live.contains_key(h) || dead.contains(&live[h]) {
                    return Err(format!(
                        "event {i}: worker {w} maps {h}, which is not allocated"
                    ));
                }
                mapped.entry(h.clone()).or_default().insert(*w);
            }
            Ev::Close(w, h) => {
                if !mapped.get_mut(h).is_some_and(|m| m.remove(w)) {
                    return Err(format!(
                        "event {i}: worker {w} closes {h}, which it never mapped"
                    ));
                }
            }
            Ev::Free(w, h) => {
                if let Some(m) = mapped.get(h).filter(|m| !m.is_empty()) {
                    return Err(format!(
                        "event {i}: worker {w} frees {h} while workers {m:?} map it"
                    ));
                }
                live.remove(h);
                freed.insert(h.clone());
            }
            Ev::Exit(w) => {
                dead.insert(*w);
                for m in mapped.values_mut() {
                    m.remove(w);
                }
            }
        }
    }
    let mut left: BTreeSet<String> = live
        .iter()
        .filter(|(_, w)| !dead.contains(*w))
        .map(|(h, _)| h.clone())
        .collect();
    left.extend(
        mapped
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(h, _)| h.clone()),
    );
    Ok((freed, left))
}

fn log(world: &Shared) -> Vec<Ev> {
    world.lock().unwrap().log.clone()
}

fn count(log: &[Ev], f: impl Fn(&Ev) -> bool) -> usize {
    log.iter().filter(|e| f(e)).count()
}

const CUSTOM: [Backend; 2] = [Backend::OneStagePull, Backend::TwoStagePull];

mod comms;
mod kernels;
mod lifetimes;
mod lost;
mod ranked;
mod setup;
mod verify;

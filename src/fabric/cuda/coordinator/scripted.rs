//! Tests of IPC buffer lifetimes: the coordinator drives scripted workers (threads speaking
//! the worker protocol over pipes, [`Link::scripted`]) that keep what a real worker would hold
//! and record every export, map (cuIpcOpenMemHandle), close and free they are asked to do. The
//! rule checked: no exported buffer is freed while any peer maps it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::CudaFabric;
use crate::fabric::cuda::driver::{DeviceFacts, IpcHandle};
use crate::fabric::cuda::link::Link;
use crate::fabric::cuda::protocol::{BufHandles, ProbeHandles, RankHandles, Req, Resp, WireError};
use crate::fabric::cuda::topo;
use crate::fabric::cuda::watchdog::Deadline;
use crate::fabric::{Backend, Direction, Dtype, Fabric, FabricInfo, Group};

/// Makes the worker of one slot (a fresh one each call: a restart calls it again).
pub(super) type Script = Arc<dyn Fn(usize) -> Link + Send + Sync>;

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
/// every worker of slot `.0` dies (the first and each fresh one: a backend that kills it).
#[derive(Default)]
struct Plot {
    fail: Option<(usize, &'static str)>,
    die: Option<(usize, &'static str)>,
    die_in_slot: Option<(usize, &'static str)>,
}

#[derive(Default)]
struct World {
    log: Vec<Ev>,
    workers: usize,
    plot: Plot,
}

type Shared = Arc<Mutex<World>>;

/// What one scripted worker holds, as [`crate::fabric::cuda::worker::Engine`] does.
struct Fake {
    id: usize,
    slot: usize,
    world: Shared,
    owned: Vec<String>,
    probe_owned: Vec<String>,
    imports: Vec<String>,
    probe_imports: Vec<String>,
    next: usize,
}

fn kind(r: &Req) -> String {
    let s = format!("{r:?}");
    s.split([' ', '{', '(']).next().unwrap_or("").to_string()
}

impl Fake {
    fn log(&self, e: Ev) {
        self.world.lock().unwrap().log.push(e);
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

    fn map(&mut self, h: &IpcHandle, probe: bool) {
        if self.owned.contains(&h.hex) || self.probe_owned.contains(&h.hex) {
            return;
        }
        self.log(Ev::Map(self.id, h.hex.clone()));
        match probe {
            true => self.probe_imports.push(h.hex.clone()),
            false => self.imports.push(h.hex.clone()),
        }
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

    fn serve(&mut self, req: Req) -> Option<Resp> {
        let k = kind(&req);
        let plot = self.world.lock().unwrap().plot.fail;
        if plot.is_some_and(|(w, on)| w == self.id && on == k) {
            return Some(Resp::Failed(WireError::Device {
                error: crate::fabric::DeviceError::Nccl(format!("scripted failure of {k}")),
                stuck: false,
            }));
        }
        let (die, in_slot) = {
            let w = self.world.lock().unwrap();
            (w.plot.die, w.plot.die_in_slot)
        };
        if die.is_some_and(|(w, on)| w == self.id && on == k)
            || in_slot.is_some_and(|(s, on)| s == self.slot && on == k)
        {
            return None;
        }
        Some(match req {
            Req::Setup { owned, custom, .. } => {
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
                let memory = custom.iter().map(|&b| (b, Ok(1 << 20))).collect();
                Resp::Setup { ranks, memory }
            }
            Req::Connect { ranks, .. } => {
                self.close(false);
                for r in &ranks {
                    self.map(&r.user_in, false);
                    self.map(&r.user_out, false);
                    for (_, b) in &r.custom {
                        for h in [&b.input, &b.scratch, &b.out].into_iter().flatten() {
                            self.map(h, false);
                        }
                        self.map(&b.signal, false);
                    }
                }
                Resp::Connected {
                    kernels: Ok("--gpu-architecture=sm_90".into()),
                    broken: Vec::new(),
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
                    self.map(&r.src, true);
                    self.map(&r.dst, true);
                    if let Some(l) = &r.latch {
                        self.map(l, true);
                    }
                }
                Resp::Done
            }
            Req::ProbeDisconnect => {
                self.close(true);
                Resp::Done
            }
            Req::Disconnect => {
                self.close(true);
                self.close(false);
                Resp::Done
            }
            Req::Release => {
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
            Req::Check { .. } => Resp::Checked(None),
            Req::Time { samples, .. } => Resp::Times(vec![1e-5; samples as usize]),
            Req::Copy { samples, .. } => Resp::Times(vec![1e-5; samples as usize]),
            Req::NcclId => Resp::NcclId("scripted".into()),
            Req::NcclInit { .. } => Resp::Memory(Ok(0)),
            Req::Stage { .. }
            | Req::Drop { .. }
            | Req::ProbeQueue { .. }
            | Req::ProbeRelease { .. } => Resp::Done,
        })
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
        };
        let hello = Resp::Hello {
            facts: facts(),
            pid: 0,
        };
        Link::scripted(&format!("scripted {id}"), hello, move |req| fake.serve(req))
    });
    let host = topo::host(None, None);
    let mut f = CudaFabric {
        program: "/nonexistent/scripted".into(),
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
        plan: None,
        holding: false,
        probe_bytes: 0,
        epoch: 0,
        links: Vec::new(),
        kernels: None,
        deadline: Deadline::from_env(),
        recovered: Vec::new(),
        at_bytes: None,
        script: Some(script),
    };
    let set = f.start_set(None).unwrap();
    f.sets.push(set);
    f
}

fn group(k: usize) -> Group {
    Group {
        gpus: (0..k).collect(),
        dtype: Dtype::Bf16,
        max_bytes: 1 << 20,
    }
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

#[test]
fn setup_then_release_closes_every_map_before_any_free() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.prepare(&group(3), &CUSTOM).unwrap();
    let l = log(&world);
    // Each of 3 launchers maps the 2 other ranks' in, out and 2 x (scratch, signal).
    assert_eq!(count(&l, |e| matches!(e, Ev::Map(..))), 3 * 2 * 6);
    assert_eq!(count(&l, |e| matches!(e, Ev::Free(..))), 0);
    f.release().unwrap();
    let l = log(&world);
    let (freed, left) = check(&l).unwrap();
    assert_eq!(freed.len(), 3 * 6);
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_growing_probe_closes_the_old_buffers_on_every_peer_before_their_owners_free_them() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.prepare(&group(3), &CUSTOM).unwrap();
    f.probe(Direction::Read, 1, 4096).unwrap();
    let before = log(&world).len();
    f.probe(Direction::Read, 1, 1 << 20).unwrap();
    let l = log(&world);
    let growth = &l[before..];
    // The first probe's src and dst of 3 ranks and rank 0's latch, freed in the growth.
    assert_eq!(
        count(growth, |e| matches!(e, Ev::Free(..))),
        7,
        "{growth:?}"
    );
    check(&l).unwrap();
    f.release().unwrap();
    let (_, left) = check(&log(&world)).unwrap();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn release_after_a_failed_setup_closes_the_maps_that_were_made() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    // Workers 0 and 1 connect (mapping their peers' buffers), worker 2 fails.
    world.lock().unwrap().plot.fail = Some((2, "Connect"));
    assert!(f.prepare(&group(3), &CUSTOM).is_err());
    let l = log(&world);
    assert_eq!(count(&l, |e| matches!(e, Ev::Map(..))), 2 * 2 * 6);
    world.lock().unwrap().plot.fail = None;
    f.release().unwrap();
    let (freed, left) = check(&log(&world)).unwrap();
    assert_eq!(freed.len(), 3 * 6);
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_worker_replaced_mid_group_leaves_no_map_of_the_old_buffers() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.prepare(&group(3), &CUSTOM).unwrap();
    f.probe(Direction::Write, 2, 4096).unwrap();
    // Worker 1 dies when asked to stage data: every worker is replaced, the group set up
    // again (with the backend) and the verification runs again on the fresh workers.
    world.lock().unwrap().plot.die = Some((1, "Stage"));
    assert_eq!(
        f.verify(Backend::OneStagePull, 4096, 1).unwrap(),
        crate::fabric::Verification::Correct
    );
    assert_eq!(world.lock().unwrap().workers, 6);
    let l = log(&world);
    // The new workers (3..6) map only each other's buffers.
    for e in &l {
        if let Ev::Map(w, h) = e {
            let owner: usize = h[1..h.find('-').unwrap()].parse().unwrap();
            assert_eq!(*w >= 3, owner >= 3, "worker {w} maps {h}");
        }
    }
    // Both backends again: in, out and 2 x (scratch, signal) of the 2 other ranks.
    assert_eq!(
        count(&l, |e| matches!(e, Ev::Map(w, _) if *w >= 3)),
        3 * 2 * 6
    );
    check(&l).unwrap();
    f.verify(Backend::TwoStagePull, 4096, 1).unwrap();
    f.release().unwrap();
    let l = log(&world);
    // All three old workers ended (their buffers went with them); the new ones freed theirs.
    assert_eq!(count(&l, |e| matches!(e, Ev::Exit(w) if *w < 3)), 3);
    let (_, left) = check(&l).unwrap();
    assert!(left.is_empty(), "{left:?}");
}

/// Workers that ended.
fn exits(log: &[Ev]) -> usize {
    count(log, |e| matches!(e, Ev::Exit(_)))
}

#[test]
fn a_worker_killed_once_keeps_its_backend_which_is_timed_again_on_fresh_workers() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.prepare(&group(3), &CUSTOM).unwrap();
    // Worker 1 dies (as under `kill -9`) while timing one_stage_pull at 4 KiB.
    world.lock().unwrap().plot.die = Some((1, "Time"));
    let t = f
        .time(
            Backend::OneStagePull,
            4096,
            crate::fabric::Mode::Graph,
            2,
            3,
        )
        .unwrap();
    assert_eq!(t.len(), 3);
    assert_eq!(world.lock().unwrap().workers, 6, "one restart");
    let r = f.recoveries();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].backend, Some(Backend::OneStagePull));
    assert!(r[0].kept, "{r:?}");
    assert_eq!(r[0].bytes, Some(4096));
    assert!(r[0].cause.contains("scripted 1"), "{}", r[0].cause);
    assert!(
        r[0].to_string()
            .contains("with one_stage_pull, which was measured again at 4K"),
        "{}",
        r[0]
    );
    // Still ready on the fresh workers, as is the other backend.
    f.time(
        Backend::OneStagePull,
        1 << 20,
        crate::fabric::Mode::Eager,
        2,
        3,
    )
    .unwrap();
    f.time(
        Backend::TwoStagePull,
        4096,
        crate::fabric::Mode::Graph,
        2,
        3,
    )
    .unwrap();
    assert_eq!(world.lock().unwrap().workers, 6);
    f.release().unwrap();
    let l = log(&world);
    assert_eq!(exits(&l), 3, "only the first workers ended");
    check(&l).unwrap();
}

#[test]
fn a_backend_that_kills_its_worker_again_on_fresh_workers_is_failed() {
    let world = Shared::default();
    let mut f = fabric(3, &world);
    f.prepare(&group(3), &CUSTOM).unwrap();
    // Whichever worker serves slot 1 dies whenever it is asked to time: the backend's fault.
    world.lock().unwrap().plot.die_in_slot = Some((1, "Time"));
    let e = f
        .time(
            Backend::OneStagePull,
            4096,
            crate::fabric::Mode::Graph,
            2,
            3,
        )
        .unwrap_err();
    assert!(e.backend_local(), "{e}");
    assert!(
        e.to_string()
            .contains("it failed again after its workers were killed"),
        "{e}"
    );
    assert_eq!(world.lock().unwrap().workers, 9, "two restarts");
    let r = f.recoveries();
    assert_eq!(r.len(), 2, "{r:?}");
    assert!(r[0].kept && !r[1].kept, "{r:?}");
    assert!(r
        .iter()
        .all(|x| x.backend == Some(Backend::OneStagePull) && x.bytes == Some(4096)));
    assert!(
        r[1].to_string()
            .contains("without one_stage_pull, which failed again"),
        "{}",
        r[1]
    );
    // Left out of the group; the other backend is measured on (slot 1 dies only when timing,
    // so verify it).
    assert!(matches!(
        f.verify(Backend::OneStagePull, 4096, 1),
        Err(crate::fabric::FabricError::BadRequest(_))
    ));
    assert_eq!(
        f.verify(Backend::TwoStagePull, 4096, 1).unwrap(),
        crate::fabric::Verification::Correct
    );
    f.release().unwrap();
    check(&log(&world)).unwrap();
}

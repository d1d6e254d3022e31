//! Before measuring: who else is on the GPUs the command will use (NVML on real GPUs, or the
//! testing `--sim-occupancy FILE`), and the machine opened. Another process refuses the command
//! (exit 2) unless `--allow-busy`; then it is warned about and returned for the profile. GPUs
//! busy with work no process is named for (a process that just exited, still releasing them)
//! are read again until they settle: the workers start meanwhile, since starting them takes
//! as long as a settle wait (about 1 s each on the H200 between two `check --measure` runs),
//! and nothing is timed before the wait has ended.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::profile::environment::BusyGpu;
use crate::topology::lock::GpuLocks;
use crate::topology::occupancy::{self, Neighbours, Reading, Settle};

/// A GPU's index and its free memory in bytes, as NVML read it before measuring.
pub type Free = (usize, u64);

/// What the gate found: the neighbours allowed beside the command (`--allow-busy`), the watch
/// that asks again between its phases and groups, and the least free memory (None: not read).
#[derive(Debug, Default)]
pub struct Gated {
    pub busy: Vec<BusyGpu>,
    pub neighbours: Neighbours,
    pub free: Option<Free>,
}

/// Where the time before measuring went: the busy check's own (what it waited beyond the
/// opening) and the opening's.
#[derive(Debug, Clone, Copy)]
pub struct Spent {
    pub checks_s: f64,
    pub startup_s: f64,
}

/// What the gate asks about: the GPUs a command uses and how it treats others on them.
pub struct Ask<'a> {
    /// A simulated machine: no GPU to read, unless `fake` stands in for one.
    pub simulated: bool,
    pub loopback: Option<usize>,
    /// `--sim-occupancy FILE`: readings in place of NVML's.
    pub fake: Option<&'a std::path::Path>,
    pub allow_busy: bool,
    /// `--wait`: how long to wait for another artune measuring the same GPUs.
    pub wait: Duration,
    pub command: &'a str,
}

/// What one reading made of the GPUs.
enum Step {
    /// Still settling: read again.
    Wait,
    /// Free, in use, or allowed: the readings are complete.
    Done,
    /// NVML could not be read: opening the GPUs will say what is wrong.
    Unread,
}

/// The readings so far and what they hold on to.
struct Gate {
    script: Option<Vec<Reading>>,
    visible: Option<String>,
    loopback: bool,
    allow_busy: bool,
    wait: Duration,
    command: String,
    readings: Vec<Reading>,
    kept: Option<Vec<usize>>,
    locks: Option<GpuLocks>,
    said: bool,
    last_read: Option<Instant>,
    /// When the first NVML reading started: the settle limit counts from it.
    first_read: Option<Instant>,
    /// NVML, started at the first reading and kept for the later ones and the watch.
    nvml: Option<Arc<nvml_wrapper::Nvml>>,
    /// This command's workers are starting: the processes NVML names from here on are taken
    /// as them (who else was there was read before they started, and the watch asks again
    /// before anything is timed), and the memory they hold as free.
    ours: bool,
}

impl Gate {
    /// One more reading (after a lock wait, as many as it takes), and what it says.
    fn step(&mut self) -> Result<Step, Error> {
        loop {
            let reading = match &self.script {
                Some(list) => list[self.readings.len().min(list.len() - 1)].clone(),
                None => {
                    let since = self.last_read.map(|t| t.elapsed());
                    std::thread::sleep(crate::topology::samples::before_next(since));
                    self.last_read = Some(Instant::now());
                    self.first_read.get_or_insert(Instant::now());
                    let read = self
                        .started_nvml()
                        .and_then(|nvml| occupancy::read_with(&nvml, None, occupancy::SAMPLE));
                    match read {
                        Ok(r) => self.keep(r),
                        Err(e) => {
                            tracing::debug!("GPU occupancy not read: {e}");
                            return Ok(Step::Unread);
                        }
                    }
                }
            };
            // Another artune's workers would look like a neighbour: wait for its lock first,
            // then read the GPUs afresh.
            if self.locks.is_none() {
                let gpus: Vec<String> =
                    reading.gpus.iter().filter_map(|g| g.uuid.clone()).collect();
                let mut waited = false;
                let held =
                    crate::topology::lock::acquire(&gpus, &self.command, self.wait, &mut |w| {
                        waited = true;
                        eprintln!("{w}");
                    })
                    .map_err(Error::bad_input)?;
                self.locks = Some(held);
                if waited {
                    continue;
                }
            }
            self.readings.push(reading);
            // A file's readings stand one SAMPLE apart; NVML's are as far apart as they came.
            let settled = match self.first_read {
                Some(t) if self.script.is_none() => {
                    occupancy::settle_after(&self.readings, t.elapsed())
                }
                _ => occupancy::settle(&self.readings),
            };
            return Ok(match settled {
                Settle::Wait(what) if !self.allow_busy => {
                    if !std::mem::replace(&mut self.said, true) {
                        eprintln!("{what}");
                    }
                    Step::Wait
                }
                _ => Step::Done,
            });
        }
    }

    /// NVML, started once for every reading and the watch.
    fn started_nvml(&mut self) -> Result<Arc<nvml_wrapper::Nvml>, Error> {
        if let Some(n) = &self.nvml {
            return Ok(n.clone());
        }
        let n = Arc::new(crate::topology::nvml::open()?);
        self.nvml = Some(n.clone());
        Ok(n)
    }

    /// An NVML reading of the GPUs the command uses; once its workers start, without them.
    fn keep(&mut self, mut r: Reading) -> Reading {
        let uuids: Vec<(usize, String)> = r
            .gpus
            .iter()
            .filter_map(|g| Some((g.index, g.uuid.clone()?)))
            .collect();
        self.kept = occupancy::cuda_indices(self.visible.as_deref(), &uuids, self.loopback);
        if let Some(keep) = &self.kept {
            r.gpus.retain(|g| keep.contains(&g.index));
        }
        if self.ours {
            without_processes(&mut r);
        }
        r
    }

    /// The gate's verdict on its readings, and the watch it hands over.
    fn verdict(mut self) -> Result<Gated, Error> {
        let taken = self.readings.len();
        let reading = self.readings.pop().unwrap_or_default();
        let watch = match self.script {
            Some(list) => Neighbours::script(list, taken, &self.command, self.allow_busy),
            None => match self.nvml {
                Some(n) => Neighbours::nvml_with(n, self.kept, &self.command, self.allow_busy),
                None => {
                    Neighbours::nvml(self.kept, &self.command, self.allow_busy).unwrap_or_default()
                }
            },
        }
        .holding(self.locks.unwrap_or_default())
        // Who the gate found is not news to the watch: a process already warned about is
        // not announced again as one that "started".
        .knowing(&reading.busy());
        let free = reading
            .gpus
            .iter()
            .filter_map(|g| Some((g.index, g.free_bytes?)))
            .min_by_key(|&(_, f)| f);
        let gated = |busy| Gated {
            busy,
            neighbours: watch,
            free,
        };
        match (reading.refusal(&self.command), reading.describe()) {
            (Some(_), Some(what)) if self.allow_busy => {
                eprintln!("warning: measuring beside other work (--allow-busy, recorded in the profile): {what}");
                Ok(gated(reading.busy()))
            }
            (Some(why), _) => Err(Error::bad_input(why)),
            _ => Ok(gated(Vec::new())),
        }
    }

    /// Reads until the GPUs settle, or `stop` is set.
    fn settle(mut self, stop: &AtomicBool) -> Result<Gated, Error> {
        loop {
            if stop.load(Ordering::Relaxed) {
                return Err(Error::Interrupted);
            }
            match self.step()? {
                Step::Wait => continue,
                Step::Done => return self.verdict(),
                Step::Unread => return Ok(Gated::default()),
            }
        }
    }
}

/// Takes every process off `r` as this command's own, counting the memory it holds as free.
fn without_processes(r: &mut Reading) {
    for g in &mut r.gpus {
        let held: u64 = g.processes.iter().filter_map(|p| p.memory_bytes).sum();
        g.free_bytes = g.free_bytes.map(|f| f.saturating_add(held));
        g.processes.clear();
    }
}

/// The gate, then `open` (the machine): run side by side while the GPUs settle, and the
/// gate's verdict awaited before anything is returned, so nothing is timed during the wait.
/// A refusal drops what was opened (its workers exit). `open` hears who the gate allowed
/// beside the command (`--allow-busy`), for its errors.
pub fn gate_then_open<F>(
    ask: &Ask,
    opening: &mut dyn FnMut(),
    open: impl FnOnce(&[BusyGpu]) -> Result<F, Error>,
) -> Result<(Gated, F, Spent), Error> {
    let entered = Instant::now();
    // Readings until the GPUs are free or in use (occupancy::settle): from NVML a poll apart,
    // each covering the second before it (samples::before_next), or from the testing file
    // in turn, one per second.
    let script = ask.fake.map(occupancy::read_file_polls).transpose()?;
    let mut gate = Gate {
        loopback: ask.loopback.is_some(),
        visible: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
        script,
        allow_busy: ask.allow_busy,
        wait: ask.wait,
        command: ask.command.into(),
        readings: Vec::new(),
        kept: None,
        locks: None,
        said: false,
        last_read: None,
        first_read: None,
        nvml: None,
        ours: false,
    };
    let first = match gate.script.is_none() && ask.simulated {
        true => Step::Unread,
        false => gate.step()?,
    };
    let settling = match first {
        Step::Wait => {
            tracing::info!("busy check: the GPUs are settling; opening the machine meanwhile");
            gate.ours = true;
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            let t = std::thread::Builder::new()
                .name("artune-busy-check".into())
                .spawn(move || gate.settle(&s))
                .map_err(|e| Error::Bug(format!("the busy check's thread did not start ({e})")))?;
            Err((t, stop))
        }
        Step::Done => Ok(gate.verdict()?),
        Step::Unread => Ok(Gated::default()),
    };
    let started = Instant::now();
    opening();
    let opened = open(settling.as_ref().map_or(&[], |g| &g.busy));
    let ready = Instant::now();
    let spent = |waited: Duration| Spent {
        checks_s: (started - entered + waited).as_secs_f64(),
        startup_s: (ready - started).as_secs_f64(),
    };
    match (settling, opened) {
        (Ok(gated), opened) => Ok((gated, opened?, spent(Duration::ZERO))),
        // Where the machine could not be opened, that is the answer: the busy check stops at
        // its next reading.
        (Err((_, stop)), Err(e)) => {
            stop.store(true, Ordering::Relaxed);
            Err(e)
        }
        // A refusal drops what was opened on the way out: its workers exit before it is said.
        (Err((t, _)), Ok(f)) => {
            let verdict = t
                .join()
                .unwrap_or_else(|_| Err(Error::Bug("the busy check's thread panicked".into())));
            let waited = ready.elapsed();
            tracing::info!(
                "busy check: the wait for the GPUs to settle ended {:.2} s after the machine \
                 was opened",
                waited.as_secs_f64()
            );
            Ok((verdict?, f, spent(waited)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::occupancy::{GpuReading, Process};

    fn gpu(util: u32, processes: Vec<Process>) -> GpuReading {
        GpuReading {
            index: 0,
            uuid: None,
            processes,
            utilization_pct: Some(util),
            free_bytes: Some(100),
            total_bytes: Some(200),
        }
    }

    fn worker(pid: u32) -> Process {
        Process {
            pid,
            name: "artune".into(),
            memory_bytes: Some(30),
        }
    }

    /// Runs the gate over `readings` (a `--sim-occupancy` file), opening a machine that says
    /// whom it heard of and when it is dropped.
    fn gate(
        readings: &str,
        allow_busy: bool,
    ) -> (Result<Vec<BusyGpu>, Error>, Option<Vec<BusyGpu>>, bool) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("r.json");
        std::fs::write(&file, readings).unwrap();
        let dropped = Arc::new(AtomicBool::new(false));
        struct Machine(Arc<AtomicBool>);
        impl Drop for Machine {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let mut heard = None;
        let ask = Ask {
            simulated: true,
            loopback: None,
            fake: Some(&file),
            allow_busy,
            wait: Duration::ZERO,
            command: "tune",
        };
        let r = gate_then_open(&ask, &mut || {}, |busy| {
            heard = Some(busy.to_vec());
            Ok(Machine(dropped.clone()))
        });
        let r = r.map(|(g, m, _)| {
            std::mem::forget(m);
            g.busy
        });
        (r, heard, dropped.load(Ordering::Relaxed))
    }

    const NAMED: &str = r#"{"gpus": [{"index": 0, "processes": [{"pid": 4242, "name": "matmul"}],
        "utilization_pct": 90}]}"#;
    const SETTLING: &str = r#"{"gpus": [{"index": 0, "utilization_pct": 90}]}"#;
    const FREE: &str = r#"{"gpus": [{"index": 0, "utilization_pct": 0}]}"#;

    #[test]
    fn workers_start_while_the_gpus_settle_and_never_beside_a_named_process() {
        // Free at once: opened after the gate.
        let (r, heard, dropped) = gate(&format!("[{FREE}]"), false);
        assert_eq!(r.unwrap(), Vec::new());
        assert_eq!(heard, Some(Vec::new()));
        assert!(!dropped);
        // Settling: opened during the wait, and handed over once the GPUs settled.
        let (r, heard, dropped) = gate(&format!("[{SETTLING}, {SETTLING}, {FREE}]"), false);
        assert!(r.is_ok() && heard.is_some() && !dropped);
        // A process that arrives while they settle: refused, and what was opened is dropped.
        let (r, heard, dropped) = gate(&format!("[{SETTLING}, {NAMED}]"), false);
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("another process is using the GPUs tune would measure"),
            "{e}"
        );
        assert!(heard.is_some() && dropped);
        // A named process at the first reading: nothing is started beside it.
        let (r, heard, _) = gate(&format!("[{NAMED}]"), false);
        assert!(r.is_err());
        assert_eq!(heard, None);
        // Allowed beside it: the machine hears whom, for its errors.
        let (r, heard, _) = gate(&format!("[{NAMED}]"), true);
        assert_eq!(r.unwrap().len(), 1);
        assert_eq!(heard.unwrap()[0].pid, 4242);
    }

    #[test]
    fn once_the_workers_start_their_processes_are_not_neighbours_and_their_memory_is_free() {
        let mut r = Reading {
            gpus: vec![gpu(0, vec![worker(7), worker(8)])],
        };
        assert!(r.refusal("tune").is_some());
        without_processes(&mut r);
        assert_eq!(r.refusal("tune"), None);
        assert_eq!(r.gpus[0].free_bytes, Some(160));
        // Utilization alone still keeps the gate waiting.
        let busy = Reading {
            gpus: vec![gpu(40, Vec::new())],
        };
        assert!(matches!(occupancy::settle(&[busy]), Settle::Wait(_)));
    }
}

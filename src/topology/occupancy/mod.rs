//! Who else is on the GPUs: compute processes (PID, name, memory), utilization over about a
//! second, free memory. A tune beside a busy neighbour measures the neighbour: on the H200 a
//! bf16 matmul loop changed the eager choices at 18 of 31 sizes, and nothing said so.
//!
//! 1. [`read_nvml`] asks NVML (real GPUs); [`read_file`] reads the same [`Reading`] from a JSON
//!    file, so CPU tests drive the refusal through the binary.
//! 2. [`Reading::busy`] names the GPUs another process holds; [`Reading::refusal`] is the one
//!    sentence `tune` and `check --measure` refuse with (exit 2) unless `--allow-busy`.
//! 3. [`Neighbours`] asks again between the phases and groups of a measurement: a neighbour
//!    that starts 6 s into a tune stops it (exit 2), or with `--allow-busy` is recorded with
//!    the groups measured beside it. On the H200 such a neighbour went unnoticed: the tune
//!    exited 0 and its interference was recorded as the machine's own drift.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::units::fmt_mem;

/// Utilization (percent, the highest seen over the sample) above which a GPU with no process
/// visible still counts as busy: a process in another container NVML will not name.
pub const BUSY_UTILIZATION: u32 = 10;

/// Another process on a measured GPU, as NVML reported it before measuring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BusyGpu {
    pub gpu: usize,
    pub pid: u32,
    pub name: String,
    /// Device memory it held, when NVML says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

impl std::fmt::Display for BusyGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GPU {}: pid {} ({})", self.gpu, self.pid, self.name)?;
        if let Some(m) = self.memory_bytes {
            write!(f, " holding {}", crate::units::fmt_mem(m))?;
        }
        Ok(())
    }
}

/// What NVML says about one GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuReading {
    /// NVML's index.
    pub index: usize,
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub processes: Vec<Process>,
    /// Highest GPU utilization seen over the sample, percent.
    #[serde(default)]
    pub utilization_pct: Option<u32>,
    #[serde(default)]
    pub free_bytes: Option<u64>,
    #[serde(default)]
    pub total_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Process {
    pub pid: u32,
    pub name: String,
    #[serde(default)]
    pub memory_bytes: Option<u64>,
}

/// One reading of the GPUs a command will use.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reading {
    pub gpus: Vec<GpuReading>,
}

impl Reading {
    /// Every other process on the GPUs read, with the memory it holds.
    pub fn busy(&self) -> Vec<BusyGpu> {
        self.gpus
            .iter()
            .flat_map(|g| {
                g.processes.iter().map(|p| BusyGpu {
                    gpu: g.index,
                    pid: p.pid,
                    name: p.name.clone(),
                    memory_bytes: p.memory_bytes,
                })
            })
            .collect()
    }

    /// GPUs busy with work NVML names no process for.
    fn unexplained(&self) -> Vec<&GpuReading> {
        self.gpus
            .iter()
            .filter(|g| {
                g.processes.is_empty() && g.utilization_pct.is_some_and(|u| u >= BUSY_UTILIZATION)
            })
            .collect()
    }

    /// Why `command` will not measure here, as one sentence; None when the GPUs are free.
    pub fn refusal(&self, command: &str) -> Option<String> {
        let what = self.describe()?;
        Some(format!(
            "another process is using the GPUs {command} would measure ({what}); its timings would measure that neighbour, not this machine: stop it, or pass --allow-busy to measure anyway (the profile records it)"
        ))
    }

    /// The other work on the GPUs, one clause per GPU; None when the GPUs are free.
    pub fn describe(&self) -> Option<String> {
        let mut what: Vec<String> = Vec::new();
        for g in &self.gpus {
            let memory = match (g.free_bytes, g.total_bytes) {
                (Some(f), Some(t)) => format!(", {} of {} free", fmt_mem(f), fmt_mem(t)),
                (Some(f), None) => format!(", {} free", fmt_mem(f)),
                _ => String::new(),
            };
            let util = g
                .utilization_pct
                .map(|u| format!(", {u}% utilized over 1 s"))
                .unwrap_or_default();
            if !g.processes.is_empty() {
                let who: Vec<String> = g
                    .processes
                    .iter()
                    .map(|p| {
                        let held = p
                            .memory_bytes
                            .map(|m| format!(" holding {}", fmt_mem(m)))
                            .unwrap_or_default();
                        format!("pid {} ({}){held}", p.pid, p.name)
                    })
                    .collect();
                what.push(format!("GPU {}: {}{util}{memory}", g.index, who.join(", ")));
            }
        }
        for g in self.unexplained() {
            let free = g
                .free_bytes
                .map(|f| format!(", {} free", fmt_mem(f)))
                .unwrap_or_default();
            what.push(format!(
                "GPU {}: {}% utilized over 1 s by a process NVML does not name (another container?){free}",
                g.index,
                g.utilization_pct.unwrap_or(0)
            ));
        }
        (!what.is_empty()).then(|| what.join("; "))
    }
}

/// Longest the gate waits for GPUs to settle before it refuses them.
pub const SETTLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Time one reading covers (NVML's utilization is sampled over it).
pub const SAMPLE: std::time::Duration = std::time::Duration::from_secs(1);

/// What the gate makes of the GPUs after the readings so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// Nobody else on them: measure.
    Free,
    /// Busy with work no process NVML names, which is how a GPU looks while the driver tears
    /// down a process that just exited: read again. The sentence says what it waits for.
    Wait(String),
    /// In use (a process NVML names, or busy for the whole [`SETTLE_LIMIT`]): refuse.
    Busy,
}

/// The gate's decision over `readings`, oldest first, one per [`SAMPLE`]. On the H200 a
/// tune started a second after a process holding most of the GPU's memory exited saw 100%
/// utilization and no process: the driver was still releasing the memory. So such a GPU is
/// read again for up to [`SETTLE_LIMIT`]; a process NVML names is in use at once.
pub fn settle(readings: &[Reading]) -> Settle {
    settle_after(readings, SAMPLE * (readings.len().max(1) as u32 - 1))
}

/// [`settle`] over readings taken `waited` apart from first to last: NVML's come closer
/// together than one per [`SAMPLE`] where each covers the sample before it on its own
/// ([`super::samples::before_next`]).
pub fn settle_after(readings: &[Reading], waited: std::time::Duration) -> Settle {
    let Some(last) = readings.last() else {
        return Settle::Free;
    };
    if last.describe().is_none() {
        return Settle::Free;
    }
    if !last.busy().is_empty() || waited >= SETTLE_LIMIT {
        return Settle::Busy;
    }
    let what: Vec<String> = last
        .unexplained()
        .iter()
        .map(|g| {
            let free = match (g.free_bytes, g.total_bytes) {
                (Some(f), Some(t)) => format!(", {} of {} free", fmt_mem(f), fmt_mem(t)),
                _ => String::new(),
            };
            format!(
                "GPU {} {}% utilized with no process NVML names{free}",
                g.index,
                g.utilization_pct.unwrap_or(0)
            )
        })
        .collect();
    Settle::Wait(format!(
        "waiting up to {} s for the GPUs to settle ({}): a process that just exited may still be releasing them",
        SETTLE_LIMIT.as_secs(),
        what.join("; ")
    ))
}

/// Reads a [`Reading`] from a JSON file (the testing stand-in for NVML): the first of its
/// readings where it holds a list ([`read_file_polls`]).
pub fn read_file(path: &Path) -> Result<Reading, Error> {
    Ok(read_file_polls(path)?.remove(0))
}

/// The readings of a JSON file: one object, or a list of them that successive looks take in
/// turn (the first before measuring, then one per [`Neighbours::look`], the last repeating),
/// so a test can make a neighbour arrive mid-measurement.
pub fn read_file_polls(path: &Path) -> Result<Vec<Reading>, Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(Reading),
        Many(Vec<Reading>),
    }
    let what = "GPU occupancy reading";
    let text = crate::topology::file::read_text(path, 1 << 20, what)?;
    let parse = |reason: String| Error::Parse {
        path: path.into(),
        what,
        reason,
    };
    match serde_json::from_str(&text).map_err(|e| parse(e.to_string()))? {
        OneOrMany::One(r) => Ok(vec![r]),
        OneOrMany::Many(v) if v.is_empty() => Err(parse("the list of readings is empty".into())),
        OneOrMany::Many(v) => Ok(v),
    }
}

/// Asks NVML about the GPUs with these indices (all when `indices` is None): compute
/// processes other than this one, free memory, and the highest utilization over `sample`.
pub fn read_nvml(indices: Option<&[usize]>, sample: std::time::Duration) -> Result<Reading, Error> {
    read_with(&crate::topology::nvml::open()?, indices, sample)
}

/// [`read_nvml`] through an NVML already started: a command's busy check reads the GPUs
/// again while they settle and then watches them, all through one handle. NVML shut down
/// after the first reading and started again for the watch: 0.25 s passed between the two
/// on the H200 after boot, 0.1 s in a `check --measure` (speed3).
pub fn read_with(
    nvml: &nvml_wrapper::Nvml,
    indices: Option<&[usize]>,
    sample: std::time::Duration,
) -> Result<Reading, Error> {
    let count = nvml.device_count().map_err(|e| {
        Error::Hardware(format!(
            "NVML cannot count the GPUs ({e}): check that `nvidia-smi` works"
        ))
    })? as usize;
    let me = std::process::id();
    let wanted: Vec<usize> = match indices {
        Some(i) => i.iter().copied().filter(|&i| i < count).collect(),
        None => (0..count).collect(),
    };
    let mut out = Reading::default();
    let mut devices = Vec::new();
    for &i in &wanted {
        let Ok(d) = nvml.device_by_index(i as u32) else {
            continue;
        };
        // Under MPS, NVML lists the server's context and names its clients apart.
        let mut listed = d.running_compute_processes().unwrap_or_default();
        listed.extend(d.mps_running_compute_processes().unwrap_or_default());
        let listed = listed.into_iter().filter(|p| p.pid != me).map(|p| Process {
            pid: p.pid,
            name: process_name(p.pid)
                .or_else(|| nvml.sys_process_name(p.pid, 64).ok())
                .unwrap_or_else(|| "name unknown".into()),
            memory_bytes: match p.used_gpu_memory {
                nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
                nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
            },
        });
        let processes = neighbours(listed);
        let mem = d.memory_info().ok();
        out.gpus.push(GpuReading {
            index: i,
            uuid: d.uuid().ok(),
            processes,
            utilization_pct: d.utilization_rates().ok().map(|u| u.gpu),
            free_bytes: mem.as_ref().map(|m| m.free),
            total_bytes: mem.as_ref().map(|m| m.total),
        });
        devices.push(d);
    }
    // NVML's utilization is a share of its last sample period; several reads over about a
    // second catch a neighbour that was between kernels at the first. The driver's own
    // samples of the second before say the same at once where they cover it.
    let recent: Option<Vec<u32>> = match sample.is_zero() {
        true => None,
        false => devices
            .iter()
            .map(|d| super::samples::recent_max(d, sample))
            .collect(),
    };
    if let Some(recent) = recent {
        for (g, u) in out.gpus.iter_mut().zip(recent) {
            g.utilization_pct = Some(g.utilization_pct.map_or(u, |x| x.max(u)));
        }
        return Ok(out);
    }
    let steps = 5;
    for _ in 0..steps {
        std::thread::sleep(sample / steps);
        for (g, d) in out.gpus.iter_mut().zip(&devices) {
            if let Ok(u) = d.utilization_rates() {
                g.utilization_pct = Some(g.utilization_pct.map_or(u.gpu, |x| x.max(u.gpu)));
            }
        }
    }
    Ok(out)
}

/// Where [`Neighbours`] reads the GPUs from.
enum ReadFrom {
    Nvml {
        nvml: Arc<nvml_wrapper::Nvml>,
        indices: Option<Vec<usize>>,
    },
    /// A file's readings; the next one is taken at each look (the first was the gate's).
    Script { readings: Vec<Reading>, next: usize },
}

struct Watch {
    source: ReadFrom,
    /// Processes NVML named at the first look that cannot be seen in /proc (another PID
    /// namespace, as in a container): this command's own workers, as far as can be told.
    unseen: Option<BTreeSet<u32>>,
    /// Every neighbour seen so far, so each is announced once.
    seen: BTreeSet<(usize, u32)>,
    /// The caller's count of worker replacements at the last look: fresh workers in another
    /// PID namespace are taken as the command's own at the next look, as the first were.
    generation: usize,
}

/// Other processes on the GPUs while a command measures them, asked between its phases and
/// groups. Its own process and its workers are not neighbours: a worker is a child of this
/// process; where NVML names processes /proc cannot show (another PID namespace), those
/// present at the first look, once the workers run, are taken as the workers.
#[derive(Clone)]
pub struct Neighbours {
    watch: Option<Arc<Mutex<Watch>>>,
    /// The command, for the sentence that stops it.
    command: String,
    /// Measure beside them (`--allow-busy`, recorded) rather than stop.
    pub allow: bool,
    /// The GPUs' measurement locks, held as long as the watch (the command's run).
    locks: Option<Arc<super::lock::GpuLocks>>,
}

impl std::fmt::Debug for Neighbours {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Neighbours")
            .field("watching", &self.watch.is_some())
            .field("allow", &self.allow)
            .finish()
    }
}

impl Default for Neighbours {
    /// Nobody watching (a library caller, a test): every look finds no one.
    fn default() -> Self {
        Neighbours {
            watch: None,
            command: String::new(),
            allow: false,
            locks: None,
        }
    }
}

impl Neighbours {
    /// Watches the GPUs with these NVML indices (all: None) for `command`.
    pub fn nvml(indices: Option<Vec<usize>>, command: &str, allow: bool) -> Result<Self, Error> {
        let nvml = Arc::new(crate::topology::nvml::open()?);
        Ok(Neighbours::nvml_with(nvml, indices, command, allow))
    }

    /// [`Neighbours::nvml`] through an NVML already started (the busy check's).
    pub fn nvml_with(
        nvml: Arc<nvml_wrapper::Nvml>,
        indices: Option<Vec<usize>>,
        command: &str,
        allow: bool,
    ) -> Self {
        Neighbours::with(ReadFrom::Nvml { nvml, indices }, command, allow)
    }

    /// Looks at `readings` in turn from `next` (the testing stand-in for NVML; those before
    /// were the gate's).
    pub fn script(readings: Vec<Reading>, next: usize, command: &str, allow: bool) -> Self {
        Neighbours::with(ReadFrom::Script { readings, next }, command, allow)
    }

    fn with(source: ReadFrom, command: &str, allow: bool) -> Self {
        let watch = Watch {
            source,
            unseen: None,
            seen: BTreeSet::new(),
            generation: 0,
        };
        Neighbours {
            watch: Some(Arc::new(Mutex::new(watch))),
            command: command.into(),
            allow,
            locks: None,
        }
    }

    /// The same watch, with `known` (the busy check's finding) already seen.
    pub fn knowing(self, known: &[BusyGpu]) -> Self {
        if let Some(w) = &self.watch {
            let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
            w.seen.extend(known.iter().map(|b| (b.gpu, b.pid)));
        }
        self
    }

    /// The same watch, holding `locks` (the GPUs' measurement locks) for as long as it lives.
    pub fn holding(mut self, locks: super::lock::GpuLocks) -> Self {
        self.locks = Some(Arc::new(locks));
        self
    }

    /// Who else is on the GPUs now, and which of them are new since the last look. Without
    /// `allow`, anyone is an error: the sentence the command stops with, naming them and
    /// `during` (what was being measured). `generation` counts the command's worker
    /// replacements so far.
    pub fn look(&self, during: &str, generation: usize) -> Result<Looked, String> {
        let Some(w) = &self.watch else {
            return Ok(Looked::default());
        };
        let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
        if w.generation != generation {
            w.generation = generation;
            w.unseen = None;
        }
        let now = w.others();
        let new: Vec<BusyGpu> = now
            .iter()
            .filter(|b| !w.seen.contains(&(b.gpu, b.pid)))
            .cloned()
            .collect();
        w.seen.extend(now.iter().map(|b| (b.gpu, b.pid)));
        if !now.is_empty() && !self.allow {
            let who: Vec<String> = now.iter().map(ToString::to_string).collect();
            return Err(format!(
                "another process started using the GPUs during {} ({}, first seen {during}), and its work would be timed as this machine's, so {} stopped without a result: stop that process and run again, or pass --allow-busy to measure beside it (what was measured beside it is recorded)",
                self.command,
                who.join("; "),
                self.command
            ));
        }
        Ok(Looked { now, new })
    }
}

/// What one look found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Looked {
    /// Every other process on the GPUs now.
    pub now: Vec<BusyGpu>,
    /// Those not seen at an earlier look.
    pub new: Vec<BusyGpu>,
}

impl Watch {
    fn others(&mut self) -> Vec<BusyGpu> {
        let reading = match &mut self.source {
            ReadFrom::Nvml { nvml, indices } => {
                match read_with(nvml, indices.as_deref(), std::time::Duration::ZERO) {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::debug!("GPU occupancy not read: {e}");
                        return Vec::new();
                    }
                }
            }
            ReadFrom::Script { readings, next } => {
                let r = readings[(*next).min(readings.len() - 1)].clone();
                *next += 1;
                return r.busy();
            }
        };
        let me = std::process::id();
        let busy = reading.busy();
        let unseen = self.unseen.get_or_insert_with(|| {
            busy.iter()
                .filter(|b| parent_of(b.pid).is_none())
                .map(|b| b.pid)
                .collect()
        });
        busy.into_iter()
            .filter(|b| match parent_of(b.pid) {
                Some(parent) => parent != me,
                None => !unseen.contains(&b.pid),
            })
            .collect()
    }
}

/// The processes that count as neighbours: each once, without the MPS server. The server
/// holds the GPU for its clients (NVML names those, and their work shows in the utilization),
/// so counting it refused every command on a GPU shared through MPS.
fn neighbours(listed: impl IntoIterator<Item = Process>) -> Vec<Process> {
    let mut seen = BTreeSet::new();
    listed
        .into_iter()
        .filter(|p| {
            let server = is_mps_server(&p.name);
            if server {
                tracing::debug!("pid {} is the MPS server: not a neighbour", p.pid);
            }
            !server && seen.insert(p.pid)
        })
        .collect()
}

/// Whether a process name is the MPS server's (`nvidia-cuda-mps-server`; /proc's command
/// names stop at 15 characters: `nvidia-cuda-mps`).
fn is_mps_server(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    base == "nvidia-cuda-mps-server" || base == "nvidia-cuda-mps"
}

/// The parent of a process, from /proc (None where it is not visible).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the fields after its last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The command name of a process, from /proc (None where it is not visible).
fn process_name(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The NVML indices a CUDA command will use: those CUDA_VISIBLE_DEVICES names (indices or
/// UUIDs), else all; with `loopback`, only the first of them.
pub fn cuda_indices(
    visible: Option<&str>,
    uuids: &[(usize, String)],
    loopback: bool,
) -> Option<Vec<usize>> {
    let mut out: Vec<usize> = match visible {
        None => return if loopback { Some(vec![0]) } else { None },
        Some(v) => v
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .filter_map(|s| {
                s.parse::<usize>().ok().or_else(|| {
                    uuids
                        .iter()
                        .find(|(_, u)| u.starts_with(s) || s.starts_with(u.as_str()))
                        .map(|(i, _)| *i)
                })
            })
            .collect(),
    };
    if loopback {
        out.truncate(1);
    }
    Some(out)
}

#[cfg(test)]
mod tests;

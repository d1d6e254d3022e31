//! Who else is on the GPUs: compute processes (PID, name, memory), utilization over about a
//! second, free memory. A tune beside a busy neighbour measures the neighbour: on the H200 a
//! bf16 matmul loop changed the eager choices at 18 of 31 sizes, and nothing said so.
//!
//! 1. [`read_nvml`] asks NVML (real GPUs); [`read_file`] reads the same [`Reading`] from a JSON
//!    file, so CPU tests drive the refusal through the binary.
//! 2. [`Reading::busy`] names the GPUs another process holds; [`Reading::refusal`] is the one
//!    sentence `tune` and `check --measure` refuse with (exit 2) unless `--allow-busy`.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::units::fmt_bytes;

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
            write!(f, " holding {}", crate::units::fmt_bytes(m))?;
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
                (Some(f), Some(t)) => format!(", {} of {} free", fmt_bytes(f), fmt_bytes(t)),
                (Some(f), None) => format!(", {} free", fmt_bytes(f)),
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
                            .map(|m| format!(" holding {}", fmt_bytes(m)))
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
                .map(|f| format!(", {} free", fmt_bytes(f)))
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

/// Reads a [`Reading`] from a JSON file (the testing stand-in for NVML).
pub fn read_file(path: &Path) -> Result<Reading, Error> {
    let text = crate::topology::file::read_text(path, 1 << 20, "GPU occupancy reading")?;
    serde_json::from_str(&text).map_err(|e| Error::Parse {
        path: path.into(),
        what: "GPU occupancy reading",
        reason: e.to_string(),
    })
}

/// Asks NVML about the GPUs with these indices (all when `indices` is None): compute
/// processes other than this one, free memory, and the highest utilization over `sample`.
pub fn read_nvml(indices: Option<&[usize]>, sample: std::time::Duration) -> Result<Reading, Error> {
    let nvml = crate::topology::nvml::open()?;
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
        let processes = d
            .running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.pid != me)
            .map(|p| Process {
                pid: p.pid,
                name: process_name(p.pid)
                    .or_else(|| nvml.sys_process_name(p.pid, 64).ok())
                    .unwrap_or_else(|| "name unknown".into()),
                memory_bytes: match p.used_gpu_memory {
                    nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
                    nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                },
            })
            .collect();
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
    // second catch a neighbour that was between kernels at the first.
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
mod tests {
    use super::*;

    fn neighbour() -> Reading {
        Reading {
            gpus: vec![GpuReading {
                index: 0,
                processes: vec![Process {
                    pid: 4242,
                    name: "python3".into(),
                    memory_bytes: Some(140 << 30),
                }],
                utilization_pct: Some(97),
                free_bytes: Some(1 << 30),
                total_bytes: Some(141 << 30),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn a_neighbour_is_named_with_its_memory_and_what_is_free() {
        let r = neighbour();
        let msg = r.refusal("tune").unwrap();
        assert!(
            msg.contains("GPU 0: pid 4242 (python3) holding 140G"),
            "{msg}"
        );
        assert!(msg.contains("97% utilized"), "{msg}");
        assert!(msg.contains("1G of 141G free"), "{msg}");
        assert!(msg.contains("--allow-busy"), "{msg}");
        assert_eq!(r.busy().len(), 1);
    }

    #[test]
    fn an_idle_gpu_passes_and_unexplained_load_does_not() {
        let mut r = neighbour();
        r.gpus[0].processes.clear();
        r.gpus[0].utilization_pct = Some(0);
        assert_eq!(r.refusal("tune"), None);
        r.gpus[0].utilization_pct = Some(60);
        assert!(r.refusal("tune").unwrap().contains("does not name"));
    }

    #[test]
    fn visible_devices_pick_the_gpus() {
        let uuids = [(0, "GPU-aaa".to_string()), (1, "GPU-bbb".to_string())];
        assert_eq!(cuda_indices(None, &uuids, false), None);
        assert_eq!(cuda_indices(None, &uuids, true), Some(vec![0]));
        assert_eq!(cuda_indices(Some("1,0"), &uuids, true), Some(vec![1]));
        assert_eq!(cuda_indices(Some("GPU-bbb"), &uuids, false), Some(vec![1]));
    }
}

//! What a node says about itself, gathered once so every check is a pure function of it.
//! Each reading that can fail holds the reason as a phrase: the check then says `unknown`.

use std::path::{Path, PathBuf};

use crate::topology::nvml::GpuSettings;
use crate::topology::sysfs::Sysfs;
use crate::topology::Topology;

/// The machine a doctor run is about.
#[derive(Debug, Clone, PartialEq)]
pub enum Machine {
    Real,
    Preset(String),
    File(PathBuf),
}

impl Machine {
    pub fn describe(&self) -> String {
        match self {
            Machine::Real => "this machine".into(),
            Machine::Preset(p) => format!("simulated preset {p}"),
            Machine::File(f) => format!("the topology in {}", f.display()),
        }
    }

    pub fn simulated(&self) -> bool {
        !matches!(self, Machine::Real)
    }
}

/// What a profile given with `--profile` was tuned with, and how it differs from now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProfileFacts {
    pub path: PathBuf,
    pub simulated: bool,
    /// Why the profile is not valid here (GPUs, links, wiring), as `artune check` says.
    pub changes: Vec<String>,
    /// What differs but leaves it valid (driver, CUDA, NCCL, another node of the class).
    pub notes: Vec<String>,
    /// What could not be compared because this machine does not say.
    pub unchecked: Vec<String>,
}

/// One GPU pair's P2P transfer check (`--measure`).
#[derive(Debug, Clone, PartialEq)]
pub struct PairTransfer {
    pub a: usize,
    pub b: usize,
    /// Ok(what ran) or Err(what went wrong): wrong data, a hang, a refusal.
    pub result: Result<String, String>,
}

/// What `--measure` found, or why it could not run.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// The topology with GPU links re-read under load (the model's links when simulated).
    pub links: Result<Topology, String>,
    pub pairs: Result<Vec<PairTransfer>, String>,
}

/// Everything the checks look at.
#[derive(Debug, Clone)]
pub struct Facts {
    pub machine: Machine,
    /// The topology, or why NVML could not give it (real machines only; models always have one).
    pub topology: Result<Topology, String>,
    /// sysfs to read, or why there is none (a model without `--sysfs-root`).
    pub sysfs: Result<Sysfs, String>,
    /// PCI bus ids of the GPUs in topology order (from sysfs when NVML has none).
    pub gpu_bus_ids: Vec<String>,
    /// The kernel command line.
    pub cmdline: Result<String, String>,
    /// NVML's BAR1 and persistence readings.
    pub settings: Result<Vec<GpuSettings>, String>,
    /// Environment variables, as (name, value).
    pub env: Vec<(String, String)>,
    pub profile: Option<ProfileFacts>,
    pub measured: Option<Measured>,
    /// Who else is on the GPUs (NVML on a real machine), or why it was not read.
    pub occupancy: Result<crate::topology::occupancy::Reading, String>,
}

/// Where sysfs and procfs live: `/sys` and `/proc`, or fixture trees in tests.
#[derive(Debug, Clone)]
pub struct Roots {
    pub sysfs: Option<PathBuf>,
    pub proc: Option<PathBuf>,
}

impl Facts {
    /// Gathers what needs no GPU work: `topology` is the loaded model, or for the real machine
    /// NVML's answer. `--measure` results and the profile are added by the caller.
    pub fn gather(machine: Machine, topology: Result<Topology, String>, roots: &Roots) -> Facts {
        let real = machine == Machine::Real;
        let sysfs = match (&roots.sysfs, real) {
            (Some(dir), _) => Ok(Sysfs::new(dir)),
            (None, true) => Ok(Sysfs::system()),
            (None, false) => Err(
                "a simulated machine has no PCI config space; run doctor on the machine itself"
                    .to_string(),
            ),
        };
        let cmdline = match (&roots.proc, real) {
            (Some(dir), _) => read_cmdline(&dir.join("cmdline")),
            (None, true) => read_cmdline(Path::new("/proc/cmdline")),
            (None, false) => Err("a simulated machine has no kernel command line".to_string()),
        };
        let mut gpu_bus_ids: Vec<String> = topology
            .as_ref()
            .map(|t| {
                t.gpus
                    .iter()
                    .filter_map(|g| g.bus_id.as_deref())
                    .map(crate::topology::sysfs::normalize_bus_id)
                    .collect()
            })
            .unwrap_or_default();
        if gpu_bus_ids.is_empty() {
            if let (Ok(s), true) = (&sysfs, topology.is_err()) {
                gpu_bus_ids = s.nvidia_gpus();
            }
        }
        let settings = if real {
            crate::topology::nvml::read_settings().map_err(|e| e.to_string())
        } else {
            Err("NVML is not read for a simulated machine".to_string())
        };
        Facts {
            machine,
            topology,
            sysfs,
            gpu_bus_ids,
            cmdline,
            settings,
            // vars() panics on a value that is not UTF-8; such a value is still worth naming.
            env: std::env::vars_os()
                .map(|(k, v)| {
                    (
                        k.to_string_lossy().into_owned(),
                        v.to_string_lossy().into_owned(),
                    )
                })
                .collect(),
            profile: None,
            measured: None,
            occupancy: if real {
                crate::topology::occupancy::read_nvml(None, std::time::Duration::from_secs(1))
                    .map_err(|e| e.to_string())
            } else {
                Err("NVML is not read for a simulated machine".to_string())
            },
        }
    }
}

fn read_cmdline(p: &Path) -> Result<String, String> {
    use std::io::Read;
    // /proc/cmdline is one short line; the cap only guards a fixture or a strange mount.
    let mut text = String::new();
    std::fs::File::open(p)
        .and_then(|f| f.take(64 << 10).read_to_string(&mut text))
        .map_err(|e| format!("{} cannot be read ({e})", p.display()))?;
    Ok(text.trim().to_string())
}

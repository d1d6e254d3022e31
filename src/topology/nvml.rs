//! Topology discovery through NVML, with the PCIe tree from sysfs.
//!
//! [`discover`] reads everything NVML knows ([`read`]), then [`assemble`] joins it with the
//! PCIe tree that sysfs shows (or, where sysfs is hidden, one inferred from NVML's path classes).
//! Queries a GPU or driver does not support (VMs, consumer GPUs) leave a field unknown and a line
//! in `notes`; only a missing library, no GPU or a GPU NVML cannot open stop discovery.

use std::ffi::OsStr;

use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

pub use super::assemble::{assemble, infer_tree, nvlink_gbps, Notes, Reading};
use super::sysfs::Sysfs;
use super::{ComputeCapability, Gpu, Host, Link, NvLink, P2p, PathClass, Status, Topology};
use crate::error::Error;

/// The driver installs the versioned name; the bare name comes only with development packages.
const LIBRARIES: [&str; 2] = ["libnvidia-ml.so.1", "libnvidia-ml.so"];

/// NVML_NVLINK_MAX_LINKS in nvml.h (18 on Hopper and Blackwell).
const MAX_NVLINKS: u32 = 18;

/// GPU utilization (percent) from which link speeds count as read under load: idle GPUs drop
/// their PCIe generation to save power.
const LOAD_UTILIZATION: u32 = 10;

/// nvmlAffinityScope_t for NUMA nodes (NVML_AFFINITY_SCOPE_NODE in nvml.h).
const NVML_AFFINITY_SCOPE_NODE: u32 = 0;

/// Reads the machine's topology through NVML and sysfs. `nccl` is the NCCL version the caller
/// loaded (part of the host hash: a profile goes stale when NCCL changes under it); topology
/// discovery itself loads no NCCL.
pub fn discover(nccl: Option<String>) -> Result<Topology, Error> {
    let nvml = open()?;
    let mut reading = read(&nvml)?;
    reading.host.nccl = nccl;
    assemble(reading, &Sysfs::system())
}

/// What `artune doctor` reads per GPU beyond the topology; each reading is the value or why
/// NVML could not give it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSettings {
    pub index: usize,
    pub bus_id: Option<String>,
    /// Total BAR1 (the window peers and the host map GPU memory through), bytes.
    pub bar1_bytes: Result<u64, String>,
    pub persistence: Result<bool, String>,
}

/// BAR1 size and persistence mode of every GPU, in NVML's order.
pub fn read_settings() -> Result<Vec<GpuSettings>, Error> {
    let nvml = open()?;
    let count = nvml.device_count().map_err(|e| {
        Error::Hardware(format!(
            "NVML cannot count the GPUs ({e}): check that `nvidia-smi` works"
        ))
    })?;
    let mut out = Vec::new();
    for i in 0..count {
        let d = nvml.device_by_index(i).map_err(|e| {
            Error::Hardware(format!(
                "NVML cannot open GPU {i} ({e}): check `nvidia-smi` for that GPU"
            ))
        })?;
        out.push(GpuSettings {
            index: i as usize,
            bus_id: d.pci_info().ok().map(|p| p.bus_id),
            bar1_bytes: d
                .bar1_memory_info()
                .map(|b| b.total)
                .map_err(|e| reason(&e)),
            persistence: d.is_in_persistent_mode().map_err(|e| reason(&e)),
        });
    }
    Ok(out)
}

/// Loads and starts NVML, turning each way it can fail into one actionable sentence.
pub(crate) fn open() -> Result<Nvml, Error> {
    let started = std::time::Instant::now();
    for lib in LIBRARIES {
        match Nvml::builder().lib_path(OsStr::new(lib)).init() {
            Ok(n) => {
                // With -v: each start costs (the first busy-check reading after boot, NVML
                // started in it, took 0.33 s on the H200).
                let took = started.elapsed().as_secs_f64();
                tracing::info!("NVML started in {took:.2} s");
                return Ok(n);
            }
            Err(NvmlError::LibloadingError(e)) => tracing::debug!("cannot load {lib}: {e}"),
            Err(e) => return Err(init_error(e)),
        }
    }
    Err(no_machine(
        false,
        "cannot load the NVIDIA management library (libnvidia-ml.so.1): install the NVIDIA driver"
            .into(),
    ))
}

/// The real machine cannot be read; the edge adds how to simulate one.
fn no_machine(hardware: bool, reason: String) -> Error {
    Error::NoMachine { reason, hardware }
}

fn init_error(e: NvmlError) -> Error {
    match e {
        NvmlError::FailedToLoadSymbol(s) => no_machine(false, format!("libnvidia-ml.so.1 was found but is not a usable NVIDIA management library ({s}): reinstall the NVIDIA driver")),
        NvmlError::DriverNotLoaded => no_machine(true, "the NVIDIA kernel driver is not loaded: load it (`nvidia-smi` should then list the GPUs)".into()),
        NvmlError::LibRmVersionMismatch => no_machine(true, "the NVIDIA kernel driver and libnvidia-ml.so.1 are different versions: reboot or reload the driver".into()),
        NvmlError::NoPermission => no_machine(true, "NVML has no permission to talk to the driver: run as a user who can open /dev/nvidia*".into()),
        other => no_machine(true, format!("NVML failed to start ({other}): check that `nvidia-smi` works")),
    }
}

/// Why a query gave nothing, as a phrase.
fn reason(e: &NvmlError) -> String {
    match e {
        NvmlError::NotSupported => "not supported on this GPU or driver".into(),
        NvmlError::NoPermission => "no permission (run as root to read it)".into(),
        NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_) => {
            "not in this driver's NVML".into()
        }
        other => other.to_string(),
    }
}

/// The value, or None and a note naming the query and the GPU.
fn soft<T>(r: Result<T, NvmlError>, what: &str, who: String, notes: &mut Notes) -> Option<T> {
    r.map_err(|e| notes.add(format!("{what}: {}", reason(&e)), who))
        .ok()
}

/// Reads hosts, GPUs, pair classes and P2P status.
pub fn read(nvml: &Nvml) -> Result<Reading, Error> {
    let count = nvml.device_count().map_err(|e| Error::NoMachine {
        reason: format!("NVML cannot count the GPUs ({e}): check that `nvidia-smi` works"),
        hardware: true,
    })?;
    if count == 0 {
        return Err(Error::NoMachine {
            reason: "NVML works but finds no NVIDIA GPU on this machine: check `nvidia-smi`".into(),
            hardware: false,
        });
    }
    let devices = (0..count)
        .map(|i| {
            nvml.device_by_index(i).map_err(|e| Error::NoMachine {
                reason: format!("NVML cannot open GPU {i} ({e}): check `nvidia-smi` for that GPU"),
                hardware: true,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut r = Reading::default();
    let mut utilization = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        let who = format!("GPU {i}");
        utilization.push(
            soft(
                d.utilization_rates(),
                "GPU utilization",
                who.clone(),
                &mut r.notes,
            )
            .map(|u| u.gpu),
        );
        let g = read_gpu(i, d, &mut r.notes);
        r.gpus.push(g);
    }
    r.host = read_host(nvml, &mut r.notes);
    r.link_reading = link_reading(&utilization).into();
    let n = devices.len();
    r.levels = vec![vec![None; n]; n];
    r.p2p = vec![vec![P2p::default(); n]; n];
    for a in 0..n {
        for b in 0..n {
            if a == b {
                continue;
            }
            let who = format!("GPUs {a}-{b}");
            if a < b {
                let lvl = soft(
                    nvml.topology_common_ancestor(&devices[a], &devices[b]),
                    "PCIe path class (nvmlDeviceGetTopologyCommonAncestor)",
                    who.clone(),
                    &mut r.notes,
                );
                r.levels[a][b] = lvl.map(class_of);
                r.levels[b][a] = r.levels[a][b];
            }
            r.p2p[a][b] = read_p2p(&devices[a], &devices[b], who, &mut r.notes);
        }
    }
    Ok(r)
}

fn read_host(nvml: &Nvml, notes: &mut Notes) -> Host {
    Host {
        hostname: hostname(),
        driver: soft(
            nvml.sys_driver_version(),
            "driver version",
            String::new(),
            notes,
        ),
        cuda: soft(
            nvml.sys_cuda_driver_version(),
            "CUDA driver version",
            String::new(),
            notes,
        )
        .map(|v| {
            format!(
                "{}.{}",
                nvml_wrapper::cuda_driver_version_major(v),
                nvml_wrapper::cuda_driver_version_minor(v)
            )
        }),
        // Filled by `discover`'s caller, which knows which NCCL it loaded.
        nccl: None,
    }
}

/// This machine's host name (gethostname), if it has one.
pub fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned()).filter(|s| !s.is_empty())
}

/// "load" when any GPU is busy, "idle" when every GPU that answered is not.
fn link_reading(utilization: &[Option<u32>]) -> &'static str {
    if utilization.iter().flatten().any(|&u| u >= LOAD_UTILIZATION) {
        "load"
    } else if utilization.iter().any(Option::is_some) {
        "idle"
    } else {
        "unknown"
    }
}

fn read_gpu(i: usize, d: &Device, notes: &mut Notes) -> Gpu {
    let who = || format!("GPU {i}");
    let u8_of = |v: u32| u8::try_from(v).ok();
    Gpu {
        index: i,
        uuid: soft(d.uuid(), "UUID", who(), notes),
        name: soft(d.name(), "name", who(), notes).unwrap_or_else(|| "unknown".into()),
        bus_id: soft(d.pci_info(), "PCI bus id", who(), notes).map(|p| p.bus_id),
        compute_capability: soft(
            d.cuda_compute_capability(),
            "compute capability",
            who(),
            notes,
        )
        .and_then(|c| {
            Some(ComputeCapability {
                major: u32::try_from(c.major).ok()?,
                minor: u32::try_from(c.minor).ok()?,
            })
        }),
        memory_bytes: soft(d.memory_info(), "memory size", who(), notes).map(|m| m.total),
        // The NUMA node nvidia-smi shows as "NUMA Affinity" (nvmlDeviceGetNumaNodeId is the GPU
        // memory's own node on coherent systems, not the CPUs' node near it).
        numa_node: soft(
            d.memory_affinity(4, NVML_AFFINITY_SCOPE_NODE),
            "NUMA node",
            who(),
            notes,
        )
        .and_then(|m| lowest_bit(&m)),
        cpu_affinity: soft(d.cpu_affinity(64), "CPU affinity", who(), notes)
            .and_then(|m| cpulist(&m)),
        pcie: Link {
            gen: soft(d.current_pcie_link_gen(), "PCIe generation", who(), notes).and_then(u8_of),
            width: soft(d.current_pcie_link_width(), "PCIe width", who(), notes).and_then(u8_of),
            max_gen: soft(d.max_pcie_link_gen(), "PCIe max generation", who(), notes)
                .and_then(u8_of),
            max_width: soft(d.max_pcie_link_width(), "PCIe max width", who(), notes)
                .and_then(u8_of),
            ..Default::default()
        },
        parent: String::new(),
        nvlinks: read_nvlinks(i, d, notes),
    }
}

/// Every NVLink whose state NVML reports; remote_gpu is resolved later from the bus id.
fn read_nvlinks(i: usize, d: &Device, notes: &mut Notes) -> Vec<NvLink> {
    let mut out = Vec::new();
    for link in 0..MAX_NVLINKS {
        let w = d.link_wrapper_for(link);
        let active = match w.is_active() {
            Ok(a) => a,
            // Past the GPU's last link.
            Err(NvmlError::InvalidArg) if link > 0 => break,
            Err(e) => {
                notes.add(format!("NVLink: {}", reason(&e)), format!("GPU {i}"));
                break;
            }
        };
        let mut l = NvLink {
            link,
            active,
            version: None,
            remote_bus_id: None,
            remote_gpu: None,
        };
        if active {
            let who = format!("GPU {i} link {link}");
            l.version = soft(w.version(), "NVLink version", who.clone(), notes).and_then(|v| {
                let g = nvlink_generation(v);
                if g.is_none() {
                    notes.add(
                        format!("NVLink version: NVML reports {v}, which artune does not know"),
                        who.clone(),
                    );
                }
                g
            });
            l.remote_bus_id =
                soft(w.remote_pci_info(), "NVLink remote PCI bus id", who, notes).map(|p| p.bus_id);
        }
        out.push(l);
    }
    out
}

fn read_p2p(a: &Device, b: &Device, who: String, notes: &mut Notes) -> P2p {
    let mut one = |idx: P2pCapabilitiesIndex, what: &str| match a.p2p_status(b, idx) {
        Ok(P2pStatus::Ok) => Status::Ok,
        Ok(P2pStatus::Unknown) => Status::Unknown,
        Ok(refused) => {
            notes.add(format!("P2P {what}: NVML says {refused:?}"), who.clone());
            Status::No
        }
        Err(e) => {
            notes.add(format!("P2P {what} status: {}", reason(&e)), who.clone());
            Status::Unknown
        }
    };
    P2p {
        read: one(P2pCapabilitiesIndex::Read, "read"),
        write: one(P2pCapabilitiesIndex::Write, "write"),
        nvlink: one(P2pCapabilitiesIndex::NvLink, "over NVLink"),
        atomics: one(P2pCapabilitiesIndex::Atomics, "atomics"),
    }
}

/// NVML's topology level as nvidia-smi names it.
pub fn class_of(l: TopologyLevel) -> PathClass {
    match l {
        TopologyLevel::Internal => PathClass::X,
        TopologyLevel::Single => PathClass::PIX,
        TopologyLevel::Multiple => PathClass::PXB,
        TopologyLevel::HostBridge => PathClass::PHB,
        TopologyLevel::Node => PathClass::NODE,
        TopologyLevel::System => PathClass::SYS,
    }
}

/// nvmlDeviceGetNvLinkVersion answers with nvmlNvlinkVersion_t (1.0, 2.0, 2.2, 3.0, 3.1, 4.0,
/// 5.0 as 1..7), not the generation; the model keeps the generation.
pub fn nvlink_generation(v: u32) -> Option<u32> {
    Some(match v {
        1 => 1,
        2 | 3 => 2,
        4 | 5 => 3,
        6 => 4,
        7 => 5,
        _ => return None,
    })
}

/// A CPU bitmask (word i, bit j = CPU 64i + j) as a Linux cpulist, "0-23,48-71".
pub fn cpulist(mask: &[libc::c_ulong]) -> Option<String> {
    let bits = libc::c_ulong::BITS as usize;
    let set = |c: usize| mask[c / bits] >> (c % bits) & 1 == 1;
    let mut ranges = Vec::new();
    let mut c = 0;
    while c < mask.len() * bits {
        if set(c) {
            let start = c;
            while c + 1 < mask.len() * bits && set(c + 1) {
                c += 1;
            }
            ranges.push(if start == c {
                format!("{c}")
            } else {
                format!("{start}-{c}")
            });
        }
        c += 1;
    }
    (!ranges.is_empty()).then(|| ranges.join(","))
}

/// The lowest set bit of a bitmask (word i, bit j = 64i + j).
pub fn lowest_bit(mask: &[libc::c_ulong]) -> Option<u32> {
    let bits = libc::c_ulong::BITS;
    mask.iter()
        .enumerate()
        .find(|(_, w)| **w != 0)
        .map(|(i, w)| i as u32 * bits + w.trailing_zeros())
}

#[cfg(test)]
mod tests {
    use super::*;
    use PathClass::*;

    #[test]
    fn cpulists_versions_and_readings() {
        assert_eq!(cpulist(&[0xff, 0]).as_deref(), Some("0-7"));
        assert_eq!(cpulist(&[0b1011, 1]).as_deref(), Some("0-1,3,64"));
        assert_eq!(cpulist(&[0, 0]), None);
        assert_eq!(lowest_bit(&[0, 0b100]), Some(66));
        assert_eq!(lowest_bit(&[0]), None);
        assert_eq!(
            cpulist(&[u64::MAX as libc::c_ulong]).as_deref(),
            Some("0-63")
        );
        assert_eq!(nvlink_generation(6), Some(4));
        assert_eq!(nvlink_generation(5), Some(3));
        assert_eq!(nvlink_generation(0), None);
        assert_eq!(link_reading(&[Some(0), None]), "idle");
        assert_eq!(link_reading(&[Some(0), Some(55)]), "load");
        assert_eq!(link_reading(&[None]), "unknown");
        assert_eq!(class_of(TopologyLevel::HostBridge), PHB);
    }
}

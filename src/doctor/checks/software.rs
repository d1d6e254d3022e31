//! Checks of the software around the GPUs: the driver, the environment, versions against a
//! profile.

use super::{list, no_topology, Check, Status};
use crate::doctor::facts::Facts;

pub fn driver(f: &Facts) -> Check {
    const ID: &str = "driver";
    match (&f.machine, &f.topology) {
        (m, Ok(t)) if m.simulated() => Check::ok(
            ID,
            format!(
                "{} is a model of {}: no driver is involved, and the checks below describe the model",
                m.describe(),
                crate::report::count(t.gpu_count(), "GPU", "GPUs")
            ),
        ),
        (_, Ok(t)) => {
            let mut names: Vec<&str> = t.gpus.iter().map(|g| g.name.as_str()).collect();
            names.dedup();
            Check::ok(
                ID,
                format!(
                    "NVML sees {} GPU{} ({}), driver {}",
                    t.gpu_count(),
                    if t.gpu_count() == 1 { "" } else { "s" },
                    names.join(" + "),
                    t.host.driver.as_deref().unwrap_or("of unknown version")
                ),
            )
        }
        (_, Err(why)) if !f.gpu_bus_ids.is_empty() => Check::new(
            ID,
            Status::Fail,
            format!(
                "sysfs shows {} NVIDIA GPU{} ({}) but NVML cannot read them: {why}",
                f.gpu_bus_ids.len(),
                if f.gpu_bus_ids.len() == 1 { "" } else { "s" },
                list(&f.gpu_bus_ids)
            ),
            "install or reload the NVIDIA driver until `nvidia-smi` lists every GPU",
        ),
        (_, Err(why)) => Check::new(
            ID,
            Status::Fail,
            format!("no NVIDIA GPU was found: {why}"),
            "run on a GPU node, or check a model with --sim PRESET or --topology FILE",
        ),
    }
}

/// Besides the NCCL and CUDA variables a profile records (`profile::environment::matters`, the
/// one rule), artune's own deadline changes what a tune measures. NCCL's network variables do
/// not (`environment::NCCL_NETWORK_PREFIXES`: tune and check ignore them), but are named as
/// leftovers of multi-node jobs, apart, without a warning.
const ARTUNE_VARS: &[&str] = &["ARTUNE_GPU_DEADLINE_MS"];

pub fn environment(env: &[(String, String)]) -> Check {
    const ID: &str = "environment";
    let pick = |keep: &dyn Fn(&str) -> bool| -> Vec<String> {
        let mut v: Vec<String> = env
            .iter()
            .filter(|(k, _)| keep(k))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        v.sort();
        v
    };
    let set = pick(&|k| crate::profile::environment::matters(k) || ARTUNE_VARS.contains(&k));
    let network = crate::profile::environment::NCCL_NETWORK_PREFIXES;
    let leftovers = pick(&|k| network.iter().any(|p| k.starts_with(p)));
    let aside = match leftovers.is_empty() {
        true => String::new(),
        false => format!(
            "; {} only between nodes, so not here",
            match leftovers.len() {
                1 => format!("{} matters", leftovers[0]),
                _ => format!("{} matter", list(&leftovers)),
            }
        ),
    };
    if set.is_empty() {
        return Check::ok(
            ID,
            format!("no NCCL or CUDA variable that changes the measurement is set{aside}"),
        );
    }
    let unset: Vec<String> = set
        .iter()
        .filter_map(|kv| kv.split('=').next())
        .map(|k| format!("-u {k}"))
        .collect();
    Check::new(
        ID,
        Status::Warn,
        format!(
            "set in this environment and changing what a tune measures: {}{aside}",
            list(&set)
        ),
        format!(
            "tune without them (`env {} artune tune`), unless the engines run with exactly these settings",
            unset.join(" ")
        ),
    )
}

pub fn versions(f: &Facts) -> Check {
    const ID: &str = "versions";
    let t = match (&f.topology, &f.profile) {
        (Ok(t), _) => t,
        (Err(_), None) => return no_topology(ID),
        // Said, so --profile is not silently ignored.
        (Err(_), Some(p)) => {
            return Check::new(
                ID,
                Status::Unknown,
                format!(
                    "NVML could not describe the GPUs (the driver check says why), so {} was not compared with them",
                    p.path.display()
                ),
                "fix the driver check first",
            )
        }
    };
    let h = &t.host;
    let now = format!(
        "driver {}, CUDA {}, NCCL {}",
        h.driver.as_deref().unwrap_or("unknown"),
        h.cuda.as_deref().unwrap_or("unknown"),
        h.nccl.as_deref().unwrap_or("not found")
    );
    if let Some(p) = &f.profile {
        let path = crate::shell::quote(&p.path.display().to_string());
        // Stale as `artune check` judges it, whatever else: a SIMULATED profile checked
        // against a model of other GPUs is stale there too.
        if !p.changes.is_empty() {
            return Check::new(
                ID,
                Status::Warn,
                format!(
                    "since {} was tuned: {}{}",
                    p.path.display(),
                    list(&p.changes),
                    if p.simulated { "; it is a SIMULATED profile, which engines refuse" } else { "" }
                ),
                format!("run `artune tune --out {path}` again on this machine (`artune check {path}` exits 3 until then)"),
            );
        }
        if p.simulated {
            // Engines and the NCCL plugin refuse it, whatever machine it is compared with.
            return Check::new(
                ID,
                Status::Warn,
                format!(
                    "{} is a SIMULATED profile, a model rather than a measurement, which engines refuse ({now})",
                    p.path.display()
                ),
                format!("on the GPU machine, run `artune tune --out {path}` and give engines that profile"),
            );
        }
        if !p.notes.is_empty() {
            return Check::new(
                ID,
                Status::Warn,
                format!("since {} was tuned: {}", p.path.display(), list(&p.notes)),
                format!("the profile is still valid here; re-timing its decisive sizes (artune check {path} --measure) tells whether its choices still hold"),
            );
        }
        let unchecked = if p.unchecked.is_empty() {
            String::new()
        } else {
            format!("; not compared: {}", list(&p.unchecked))
        };
        return Check::ok(
            ID,
            format!(
                "{} matches this machine ({now}){unchecked}",
                p.path.display()
            ),
        );
    }
    if f.machine.simulated() {
        return Check::ok(
            ID,
            if h.driver.is_none() && h.cuda.is_none() && h.nccl.is_none() {
                "the model states no driver, CUDA or NCCL version; give --profile FILE to compare with a profile".to_string()
            } else {
                format!("the model states {now}; give --profile FILE to compare with a profile")
            },
        );
    }
    if h.nccl.is_none() {
        return Check::new(
            ID,
            Status::Warn,
            format!("NCCL was not found, so a tune cannot measure it ({now})"),
            "install NCCL or the nvidia-nccl-cu12/cu13 wheel, or point ARTUNE_NCCL_LIB at libnccl.so.2",
        );
    }
    Check::ok(
        ID,
        format!("{now}; give --profile FILE to compare with a profile"),
    )
}

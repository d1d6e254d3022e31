//! The environment a profile was measured in: the NCCL and CUDA variables that change what NCCL
//! or CUDA do, the NCCL library that was loaded, and the other processes a busy GPU had. A
//! `NCCL_P2P_LEVEL=SYS` left in a shell moves crossovers; a profile that does not say so is
//! wrong for every engine that runs without it, and `artune check` could not tell.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::topology::occupancy::BusyGpu;

/// CUDA variables that change how kernels launch or which devices a process sees.
const CUDA_VARS: &[&str] = &[
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "CUDA_DEVICE_MAX_COPY_CONNECTIONS",
    "CUDA_MODULE_LOADING",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_AUTO_BOOST",
];

/// NCCL variables that only log, or only matter between nodes (artune measures one node);
/// with [`NCCL_NETWORK_PREFIXES`].
const NCCL_IGNORED_PREFIXES: &[&str] = &[
    "NCCL_DEBUG",
    "NCCL_WARN_",
    "NCCL_SOCKET_",
    "NCCL_COLLNET",
    "NCCL_COMM_ID",
    "NCCL_HOSTID",
];

/// NCCL's network transport (InfiniBand, net plugins): left in the environment by multi-node
/// jobs, read only between nodes. `doctor` names them as such.
pub const NCCL_NETWORK_PREFIXES: &[&str] = &["NCCL_IB_", "NCCL_NET"];

/// `NCCL_` names NCCL never reads: NVIDIA's container images set `NCCL_VERSION` to the version
/// they ship (2.28.3-1 on the H200's image, run 20), so counting it would call a profile tuned
/// in such a container stale on its host.
const NCCL_NOT_READ: &[&str] = &["NCCL_VERSION"];

/// Variables an engine sets to run artune's own plugin, which differ from a tune's by design.
const CONSUMER_VARS: &[&str] = &["NCCL_TUNER_PLUGIN", "CUDA_VISIBLE_DEVICES"];

/// Whether a variable changes what a tune measures: the one rule `tune`, `check`, `doctor`
/// and the plugin use.
pub fn matters(name: &str) -> bool {
    if CUDA_VARS.contains(&name) {
        return true;
    }
    name.starts_with("NCCL_")
        && !NCCL_NOT_READ.contains(&name)
        && !NCCL_IGNORED_PREFIXES
            .iter()
            .chain(NCCL_NETWORK_PREFIXES)
            .any(|p| name.starts_with(p))
}

/// The variables of `vars` that [`matters`] keeps, sorted by name.
pub fn relevant<I, K, V>(vars: I) -> BTreeMap<String, String>
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<String>,
    V: Into<String>,
{
    vars.into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .filter(|(k, _)| matters(k))
        .collect()
}

/// This process's variables that matter (names or values that are not UTF-8 are skipped).
pub fn current() -> BTreeMap<String, String> {
    relevant(
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
    )
}

/// The measuring environment, recorded by `tune`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Environment {
    /// NCCL and CUDA variables set when the tune ran that change what NCCL or CUDA do.
    #[serde(default)]
    pub variables: BTreeMap<String, String>,
    /// The NCCL library the measurement loaded (a path), or "simulated".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_library: Option<String>,
    /// The version of that library, as it reported itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_version: Option<String>,
    /// True when the tune ran with `--allow-busy`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_busy: bool,
    /// Other processes found on the measured GPUs (with `--allow-busy`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub busy: Vec<BusyGpu>,
}

impl Environment {
    /// The environment of a tune on a fabric that is `simulated` or loaded NCCL `nccl_version`.
    pub fn capture(
        vars: BTreeMap<String, String>,
        simulated: bool,
        nccl_version: Option<String>,
    ) -> Environment {
        Environment {
            variables: vars,
            nccl_library: if simulated {
                Some("simulated".into())
            } else {
                loaded_library("libnccl")
            },
            nccl_version: if simulated {
                Some("simulated".into())
            } else {
                nccl_version
            },
            allow_busy: false,
            busy: Vec::new(),
        }
    }

    /// The variables as `NAME=value`, joined by ", ".
    pub fn describe(&self) -> String {
        self.variables
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The path of the first shared object mapped into this process whose file name starts with
/// `prefix` (Linux: /proc/self/maps); None elsewhere or when none is.
pub fn loaded_library(prefix: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            std::path::Path::new(p)
                .file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.starts_with(prefix))
        })
        .map(str::to_string)
}

/// One variable that differs between the profile's environment and another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarChange {
    pub name: String,
    pub old: Option<String>,
    pub new: Option<String>,
}

impl std::fmt::Display for VarChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.old, &self.new) {
            (Some(o), Some(n)) => write!(f, "{}={o} when tuned, {}={n} now", self.name, self.name),
            (Some(o), None) => write!(f, "{}={o} when tuned, unset now", self.name),
            (None, Some(n)) => write!(f, "{} unset when tuned, {}={n} now", self.name, self.name),
            (None, None) => write!(f, "{} unchanged", self.name),
        }
    }
}

/// The variables that differ between `then` and `now` (both already filtered by [`matters`]),
/// leaving out `skip`.
pub fn differences(
    then: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
    skip: &[&str],
) -> Vec<VarChange> {
    let names: std::collections::BTreeSet<&String> = then.keys().chain(now.keys()).collect();
    names
        .into_iter()
        .filter(|n| !skip.contains(&n.as_str()))
        .filter_map(|n| {
            let (old, new) = (then.get(n), now.get(n));
            (old != new).then(|| VarChange {
                name: n.clone(),
                old: old.cloned(),
                new: new.cloned(),
            })
        })
        .collect()
}

/// What an engine process following the profile differs in from the tune, leaving out what
/// engines set by design to load the plugin (the plugin's question).
pub fn engine_differences(
    then: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> Vec<VarChange> {
    differences(then, now, CONSUMER_VARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(items: &[(&str, &str)]) -> BTreeMap<String, String> {
        relevant(items.iter().map(|(k, v)| (*k, *v)))
    }

    #[test]
    fn only_variables_that_change_a_measurement_are_kept() {
        let v = vars(&[
            ("NCCL_P2P_LEVEL", "SYS"),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_IB_HCA", "mlx5_0"),
            ("NCCL_VERSION", "2.28.3-1"),
            ("CUDA_DEVICE_MAX_CONNECTIONS", "1"),
            ("CUDA_HOME", "/usr/local/cuda"),
            ("PATH", "/bin"),
        ]);
        let names: Vec<&str> = v.keys().map(String::as_str).collect();
        assert_eq!(names, ["CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_P2P_LEVEL"]);
    }

    #[test]
    fn differences_name_each_variable_once() {
        let then = vars(&[("NCCL_P2P_LEVEL", "SYS"), ("NCCL_ALGO", "Ring")]);
        let now = vars(&[("NCCL_ALGO", "Ring"), ("NCCL_PROTO", "LL")]);
        let d = differences(&then, &now, &[]);
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(d[0].to_string(), "NCCL_P2P_LEVEL=SYS when tuned, unset now");
        assert_eq!(
            d[1].to_string(),
            "NCCL_PROTO unset when tuned, NCCL_PROTO=LL now"
        );
        assert!(differences(&then, &then, &[]).is_empty());
        let plugin = vars(&[("NCCL_TUNER_PLUGIN", "libartune.so")]);
        assert!(engine_differences(&BTreeMap::new(), &plugin).is_empty());
    }

    #[test]
    fn a_simulated_tune_says_so() {
        let e = Environment::capture(BTreeMap::new(), true, None);
        assert_eq!(e.nccl_library.as_deref(), Some("simulated"));
        assert_eq!(e.nccl_version.as_deref(), Some("simulated"));
    }
}

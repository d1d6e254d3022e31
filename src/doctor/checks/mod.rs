//! The checks, each a pure function of the gathered [`Facts`]: PCI platform settings (`pci`),
//! the GPUs and their links (`gpus`), the driver, environment and versions (`software`).

mod gpus;
mod pci;
mod software;

use super::facts::Facts;
use super::{Check, Status};

pub use gpus::{busy, islands, links, p2p, persistence};
pub use pci::{acs, bar1, iommu};
pub use software::{driver, environment, versions};

/// Every check, in the order the report lists them.
pub fn all(f: &Facts) -> Vec<Check> {
    vec![
        driver(f),
        acs(f),
        iommu(f),
        bar1(f),
        p2p(f),
        links(f),
        persistence(f),
        busy(f),
        islands(f),
        environment(&f.env),
        versions(f),
    ]
}

/// "0, 1, 2" for at most 8 items, then "and N more".
fn list<T: std::fmt::Display>(items: &[T]) -> String {
    const SHOWN: usize = 8;
    let mut s = items
        .iter()
        .take(SHOWN)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > SHOWN {
        s.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    s
}

const ON_THE_NODE: &str = "run `artune doctor` on the GPU node itself, as root";

/// What a check that needs the topology says when NVML gave none (the driver check has why).
fn no_topology(id: &'static str) -> Check {
    Check::new(id, Status::Unknown, NVML_SAID, "fix the driver check first")
}

const NVML_SAID: &str = "NVML could not describe the GPUs (the driver check says why)";

/// Whether `why`, an NVML reading's failure, is the one the driver check already reports:
/// then the check says so rather than the same sentence again.
fn driver_says(f: &Facts, why: &str) -> bool {
    f.topology.as_ref().is_err_and(|t| t.contains(why))
}

/// A check that could not read NVML: the driver check's failure said once, else `why`.
fn nvml_failed(f: &Facts, id: &'static str, why: &str) -> Check {
    match driver_says(f, why) {
        true => no_topology(id),
        false => Check::new(id, Status::Unknown, why.to_string(), ON_THE_NODE),
    }
}

#[cfg(test)]
mod tests;

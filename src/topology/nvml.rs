//! Topology discovery through NVML (in progress).
use super::Topology;
use crate::error::Error;

/// Reads the machine's topology through NVML.
pub fn discover() -> Result<Topology, Error> {
    Err(Error::Hardware(
        "NVML discovery is not built yet; use --sim or --topology".into(),
    ))
}

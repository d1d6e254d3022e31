//! A GPU's PCIe link as read at one moment (under load, by the CUDA fabric through NVML), kept
//! in the topology's words so that `doctor` can fold it into a topology without reaching into
//! the fabric.

/// One GPU's PCIe link as NVML reports it at the moment of the call.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LinkReading {
    /// GPU index as the fabric's topology numbers it (in loopback, the physical GPU: 0).
    pub gpu: usize,
    pub bus_id: String,
    pub gen: Option<u32>,
    pub width: Option<u32>,
    pub max_gen: Option<u32>,
    pub max_width: Option<u32>,
}

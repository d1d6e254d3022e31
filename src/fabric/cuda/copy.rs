//! The copy-engine executor ([`Executor::CopyEngine`](crate::allreduce::Executor)) on real
//! GPUs.

/// Whether this fabric runs copy-engine backends.
pub const RUNS: bool = false;

/// Why it does not, for the waiver a tune records.
pub const UNBUILT: &str = "the CUDA fabric has no copy-engine executor yet (only the simulator \
                           prices copy-engine backends); it is waived here";

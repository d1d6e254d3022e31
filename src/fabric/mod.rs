//! The one seam between the tuner and hardware.
//!
//! 1. Build a fabric: [`sim::SimFabric`] (runs anywhere, always labelled simulated) or
//!    [`cuda::CudaFabric`] (the machine's real GPUs).
//! 2. [`Fabric::prepare`] a TP group with the backends to try; each comes back ready with its
//!    memory cost, or waived with the reason.
//! 3. [`Fabric::verify`] each backend on fresh random data, then [`Fabric::time`] it; run
//!    [`Fabric::probe`] for contention curves. Nothing above this trait knows which fabric it
//!    talks to.

pub mod cuda;
mod error;
pub mod sim;

pub use error::{
    no_gpu_advice, DeviceError, FabricError, WorkerError, NO_GPU, NO_GPU_BENCH, NO_GPU_CHECK,
};

// The vocabulary lives below the seam so that profiles and exports need not depend on it.
pub use crate::allreduce::{
    memory, Backend, Direction, Directions, Dtype, Islands, MemoryCost, Mode, NcclAlgo, NcclProto,
    ProbeSample, Ranks, Readiness,
};

use crate::topology::Topology;

/// A tensor-parallel group to prepare.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// GPU indices of the topology, in rank order.
    pub gpus: Vec<usize>,
    pub dtype: Dtype,
    /// Largest message (bytes) any backend will be asked to reduce: sizes IPC buffers.
    pub max_bytes: u64,
    /// The islands the hierarchical backends work in (`plan::islands`), or why there are none
    /// (the reason they are waived).
    pub islands: Result<Islands, String>,
}

impl Group {
    /// A group the plan gave no islands: the hierarchical backends are waived on it.
    pub fn flat(gpus: Vec<usize>, dtype: Dtype, max_bytes: u64) -> Group {
        Group {
            gpus,
            dtype,
            max_bytes,
            islands: Err("no islands were planned for this group".into()),
        }
    }

    /// The ranks its kernels see: in islands where there are any.
    pub fn ranks(&self) -> Ranks {
        Ranks::of(self.gpus.len(), self.islands.as_ref().ok())
    }

    /// Checks the group fits a machine of `gpu_count` GPUs: 2 or more GPUs, each existing and
    /// listed once, and a largest message of at least 1 byte. Every fabric's `prepare` starts here.
    pub fn check(&self, gpu_count: usize) -> Result<(), FabricError> {
        let bad = |m: String| Err(FabricError::BadRequest(m));
        let last = gpu_count.saturating_sub(1);
        if self.gpus.len() < 2 {
            return bad(format!(
                "a group needs at least 2 GPUs, this one has {}; pick 2 or more of GPUs 0..{last}",
                self.gpus.len()
            ));
        }
        if let Some(g) = self.gpus.iter().find(|&&g| g >= gpu_count) {
            return bad(format!(
                "GPU {g} does not exist; this machine has GPUs 0..{last}"
            ));
        }
        let mut seen = self.gpus.clone();
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!(
                "GPU {} appears twice in the group; list each GPU once",
                w[0]
            ));
        }
        if self.max_bytes == 0 {
            return bad("a group's largest message must be at least 1 byte".into());
        }
        if let Ok(i) = &self.islands {
            let equal = i.gpus.iter().all(|x| x.len() == i.size());
            if i.count() < 2
                || i.size() < 2
                || !equal
                || i.order(&self.gpus).is_none()
                || i.size() * i.count() != self.gpus.len()
            {
                return bad(format!(
                    "islands {:?} do not split the group {:?} into 2 or more equal islands of 2 or more GPUs",
                    i.gpus, self.gpus
                ));
            }
        }
        Ok(())
    }
}

/// How wrong a model's time can be: the true time lies within [time · low, time · high] as far
/// as the calibration residuals tell. What a simulated fabric says of each time it gives; the
/// harness records it in its own terms (`results::ModelBand`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeBand {
    pub low: f64,
    pub high: f64,
    /// Whether a property the topology did not state widened it.
    pub assumed: bool,
    pub model: TimeModel,
}

/// Which half of a simulator a time came from: NCCL's model or the custom kernels'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeModel {
    Nccl,
    Custom,
    CopyEngine,
}

/// Result of checking a backend's output against the expected sum of its inputs.
#[derive(Debug, Clone, PartialEq)]
pub enum Verification {
    Correct,
    Wrong { reason: String },
}

/// The kernels a fabric's workers compiled and loaded for one target, told apart by hashes:
/// what the profile records (as its own `KernelImages`) so only these kernels run in an engine.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoadedKernels {
    /// NVRTC's version, e.g. "13.0".
    pub nvrtc: String,
    /// What NVRTC compiled for: "sm_90" (machine code) or "compute_121" (PTX the driver
    /// finished).
    pub target: String,
    pub programs: Vec<LoadedProgram>,
}

/// One program of kernels/ as compiled and loaded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoadedProgram {
    /// The program, e.g. "allreduce.cu".
    pub program: String,
    /// SHA-256 (hex) of what was handed NVRTC: name, source, shared header and options.
    pub source_sha256: String,
    /// SHA-256 (hex) of the cubin or PTX the driver loaded.
    pub image_sha256: String,
}

/// What a fabric is, for the profile header.
#[derive(Debug, Clone, PartialEq)]
pub struct FabricInfo {
    pub simulated: bool,
    /// Human description, e.g. "simulated pcie-8x-2switch" or "CUDA 13.0, 1 x NVIDIA H200".
    pub description: String,
    pub driver: Option<String>,
    pub cuda: Option<String>,
    pub nccl: Option<String>,
}

/// A fault the fabric recovered from on its own: a worker lost, killed or silent, after which
/// every worker was replaced and the group set up again. The tune goes on, so this is how the
/// profile and the user learn of it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Recovery {
    /// GPUs of the group that was restarted (topology indices).
    pub group: Vec<usize>,
    /// The backend running when it happened.
    pub backend: Option<Backend>,
    /// Whether that backend stayed in the restarted group and its interrupted measurement was
    /// run again on the fresh workers (a first loss), or was left out (a second loss, on fresh
    /// workers: the backend itself is at fault).
    #[serde(default)]
    pub kept: bool,
    /// The message size being measured, when known.
    pub bytes: Option<u64>,
    pub cause: String,
}

/// One line: what happened, and what was measured again.
impl std::fmt::Display for Recovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = self.bytes.map_or(String::new(), |b| {
            format!(" at {}", crate::units::fmt_bytes(b))
        });
        write!(
            f,
            "{}; every worker was replaced and GPUs {:?} set up again",
            self.cause, self.group
        )?;
        match (self.backend, self.kept) {
            (Some(b), true) => write!(f, " with {b}, which was measured again{at}"),
            (Some(b), false) => write!(f, " without {b}, which failed again{at}"),
            (None, _) => Ok(()),
        }
    }
}

/// One size's time with NCCL's channels forced, and the most channels NCCL's profiler saw a
/// call of it run with, where the fabric reads that back (None: the count asked for).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChannelTime {
    pub us: f64,
    pub ran_channels: Option<u32>,
    /// The count was set per call through the tuner, as the plugin sets a profile's: setting
    /// it again runs what was timed, where setting the count NCCL ran need not (NCCL may run
    /// fewer than a call's count for a small message).
    pub per_call: bool,
}

impl ChannelTime {
    /// A time whose channels were not read back: NCCL ran the count asked for.
    pub fn asked(us: f64) -> ChannelTime {
        ChannelTime {
            us,
            ran_channels: None,
            per_call: false,
        }
    }
}

/// One pin's answer of [`Fabric::nccl_pins_at_channels`].
pub type PinChannelTimes = (Backend, Result<Vec<(u32, Vec<ChannelTime>)>, FabricError>);

/// The hardware seam. See the module docs for the order of calls.
pub trait Fabric {
    fn info(&self) -> FabricInfo;

    fn topology(&self) -> &Topology;

    /// Sets up `backends` on `group` (communicators, IPC buffers, compiled kernels) and
    /// returns, per backend in the same order, its memory cost or why it is waived. Replaces
    /// any group prepared before.
    fn prepare(
        &mut self,
        group: &Group,
        backends: &[Backend],
    ) -> Result<Vec<Readiness>, FabricError>;

    /// Runs `backend` once at `bytes` on fresh random data drawn from `seed` and compares the
    /// result, bit for bit, with the expected sum of every rank's input.
    fn verify(
        &mut self,
        backend: Backend,
        bytes: u64,
        seed: u64,
    ) -> Result<Verification, FabricError>;

    /// Times `samples` batches of `batch` back-to-back calls (captured in one CUDA graph in
    /// graph mode) and returns microseconds per call for each batch.
    fn time(
        &mut self,
        backend: Backend,
        bytes: u64,
        mode: Mode,
        batch: u32,
        samples: u32,
    ) -> Result<Vec<f64>, FabricError>;

    /// Contention probe on the prepared group: every GPU moves `bytes` with `peers` peers at
    /// once in `direction`.
    fn probe(
        &mut self,
        direction: Direction,
        peers: usize,
        bytes: u64,
    ) -> Result<ProbeSample, FabricError>;

    /// What a model assumed about the machine because nothing stated it (the simulated
    /// fabric's kernel-traffic defaults), one sentence each; nothing for measured fabrics.
    fn assumed(&self) -> Vec<String> {
        Vec::new()
    }

    /// How wrong a model's time of `backend` at `bytes` on the prepared group can be; None
    /// for measured fabrics.
    fn model_band(&mut self, _backend: Backend, _bytes: u64) -> Option<TimeBand> {
        None
    }

    /// The form (staged or registered) of `backend` this fabric times in `mode`; None for
    /// NCCL, and where the fabric does not tell them apart (the simulator).
    fn form(&self, _backend: Backend, _mode: Mode) -> Option<crate::allreduce::Form> {
        None
    }

    /// NCCL channels the prepared group's NCCL backends run with, when known: the run-time
    /// count (the search's channels as connect.cc duplicates them), which `NCCL_MIN_NCHANNELS`,
    /// a tuner's `nChannels` and the profiler's `nChannels` all count.
    fn nccl_channels(&self) -> Option<u32> {
        None
    }

    /// Per count of `channels` (in order), the time (µs) of the pinned NCCL variant `backend`
    /// at each of `sizes` with NCCL told to run that many run-time channels; `Waived` with the
    /// reason where the fabric cannot set them. One call per pin for every count: a real NCCL
    /// sets the count when a communicator is made, and one start of its ranks makes one per
    /// count in turn. Each call runs as `mode` runs it (a replay of a CUDA graph, or a host
    /// launch), so the counts compare as the group's calls will run (the simulator prices a
    /// count's call without either launch, alike in both). A count left out of the answer
    /// could not run here.
    fn nccl_times_at_channels(
        &mut self,
        _backend: Backend,
        _sizes: &[u64],
        _channels: &[u32],
        _mode: Mode,
    ) -> Result<Vec<(u32, Vec<ChannelTime>)>, FabricError> {
        Err(FabricError::Waived(
            "this fabric cannot set NCCL's channel count".into(),
        ))
    }

    /// [`Fabric::nccl_times_at_channels`] for each of `pins`, in order, each with its own
    /// answer. A fabric that can time them all at once does (the CUDA fabric starts its ranks
    /// once, switching the pin per call through the tuner); by default, one call per pin.
    fn nccl_pins_at_channels(
        &mut self,
        pins: &[Backend],
        sizes: &[u64],
        channels: &[u32],
        mode: Mode,
    ) -> Vec<PinChannelTimes> {
        (pins.iter())
            .map(|&p| (p, self.nccl_times_at_channels(p, sizes, channels, mode)))
            .collect()
    }

    /// Sets which way the prepared group's hierarchical backends move data in each phase,
    /// once its contention probe has run (`Islands::orient`). Until then they read.
    fn orient(&mut self, directions: &Directions) -> Result<(), FabricError>;

    /// Releases everything the prepared group holds.
    fn release(&mut self) -> Result<(), FabricError>;

    /// Faults recovered since the fabric opened, oldest first (none for simulated fabrics).
    fn recoveries(&self) -> Vec<Recovery> {
        Vec::new()
    }

    /// The compiled kernels the workers loaded, one entry per target (none for simulated
    /// fabrics): what the profile records so only these kernels run inside an engine.
    fn kernels(&self) -> Vec<LoadedKernels> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_errors_map_to_the_exit_code_contract() {
        use crate::error::{Error, EXIT_BAD_INPUT, EXIT_HARDWARE, EXIT_INTERRUPTED};
        let cases: [(Error, i32); 4] = [
            (FabricError::Interrupted.into(), EXIT_INTERRUPTED),
            (FabricError::BadRequest("x".into()).into(), EXIT_BAD_INPUT),
            (
                FabricError::Device(DeviceError::NoNvrtc).into(),
                EXIT_HARDWARE,
            ),
            (
                FabricError::Timeout {
                    backend: Backend::Nccl,
                    what: "x".into(),
                    seconds: 1.0,
                }
                .into(),
                EXIT_HARDWARE,
            ),
        ];
        for (e, code) in cases {
            assert_eq!(e.exit_code(), code, "{e}");
        }
    }

    #[test]
    fn group_check_names_the_problem() {
        let g = |gpus: Vec<usize>, max_bytes| Group::flat(gpus, Dtype::Bf16, max_bytes);
        assert!(g(vec![0, 1], 1).check(2).is_ok());
        let msg = |r: Result<(), FabricError>| r.unwrap_err().to_string();
        assert!(msg(g(vec![0], 1).check(2)).contains("at least 2 GPUs"));
        assert!(msg(g(vec![0, 5], 1).check(2)).contains("GPU 5 does not exist"));
        assert!(msg(g(vec![1, 1], 1).check(2)).contains("appears twice"));
        assert!(msg(g(vec![0, 1], 0).check(2)).contains("at least 1 byte"));
    }
}

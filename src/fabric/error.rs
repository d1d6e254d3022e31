//! Failures below the seam, typed where they arise and put into words here, once: each
//! variant's message carries its own hint (what to check, what to run), so no caller glues one
//! on. [`DeviceError`] crosses the worker protocol as it is; the coordinator adds
//! [`WorkerError`] for workers that are lost or talk nonsense, and [`LinkError`] for the pipe to
//! one: any fabric that runs workers can say so without naming the CUDA fabric.

use serde::{Deserialize, Serialize};

use super::Backend;
use crate::units::fmt_mem;

/// What to do after the driver or a GPU failed.
const DEVICE_HINT: &str =
    "check the GPUs with `nvidia-smi` and the kernel log (`dmesg`) for Xid errors, then run again";
/// What to do on a GPU that stopped finishing its work.
const STUCK_HINT: &str = "reset it (`nvidia-smi -r`, or reboot) and run again";
/// What to tell a user on a machine without a usable GPU.
pub const NO_GPU: &str = "on a machine without an NVIDIA GPU, `artune tune --sim pcie-8x-2switch --out sim.json` tunes a simulated one instead (`artune topo --list-presets` lists the machines it simulates)";

/// What `check --measure` says instead of [`NO_GPU`]: it re-times a simulated machine itself.
pub const NO_GPU_CHECK: &str = "on a machine without an NVIDIA GPU, add --sim PRESET or --topology FILE to re-time a simulated one instead (`artune topo --list-presets` lists the machines it simulates)";
/// What `bench kernels` says instead of [`NO_GPU`]: it has no simulated form.
pub const NO_GPU_BENCH: &str = "bench kernels times the custom kernels on a real GPU and has no simulated form; run it on a machine with an NVIDIA GPU";

/// An error's text, its no-GPU advice (made for `tune`) replaced by `hint` where another
/// command printed it.
pub fn no_gpu_advice(message: String, hint: Option<&str>) -> String {
    match hint {
        Some(h) => message.replace(NO_GPU, h),
        None => message,
    }
}

/// Failures below the seam.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// The request itself is wrong (a GPU index out of range, a group of one).
    #[error("{0}")]
    BadRequest(String),
    /// A backend did not finish within its deadline; the run can go on with others.
    #[error("{backend} did not finish within {seconds:.1} s ({what}); it was aborted")]
    Timeout {
        backend: Backend,
        what: String,
        seconds: f64,
    },
    /// One backend failed (launch error, out of memory); the run can go on with others.
    #[error("{backend} failed: {reason}")]
    Backend { backend: Backend, reason: String },
    /// The device, driver or a library failed; the run cannot continue.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// Worker processes were lost and could not be replaced; the run cannot continue.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// What was asked cannot run on this group (contention probes between GPUs without working
    /// P2P); the run goes on without it.
    #[error("{0}")]
    Waived(String),
    #[error("interrupted")]
    Interrupted,
    /// Another process started using the GPUs mid-measurement (the harness's neighbour
    /// watch), and measuring beside it was not allowed.
    #[error("{0}")]
    Busy(String),
}

impl FabricError {
    /// True when only one backend is affected and the tune can continue without it.
    pub fn backend_local(&self) -> bool {
        matches!(
            self,
            FabricError::Timeout { .. } | FabricError::Backend { .. }
        )
    }
}

impl From<FabricError> for crate::error::Error {
    fn from(e: FabricError) -> Self {
        use crate::error::Error;
        match e {
            FabricError::Interrupted => Error::Interrupted,
            FabricError::BadRequest(m) | FabricError::Busy(m) => Error::BadInput(m),
            FabricError::Device(DeviceError::Bug(m)) => Error::Bug(m),
            other => Error::Hardware(other.to_string()),
        }
    }
}

/// A failure of the GPU, its driver, NVRTC or NCCL, where it happened (mostly in a worker).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum DeviceError {
    /// A driver call failed; `code` is the driver's name and text for it.
    #[error("{what} failed: {code}; {DEVICE_HINT}")]
    Driver { what: String, code: String },
    /// The driver ran out of device memory.
    #[error(
        "out of device memory {what}{} on GPU {gpu}{}; free device memory (other processes on the GPU: `nvidia-smi` lists them) or tune smaller sizes with --sizes",
        bytes.map_or(String::new(), |b| format!(" ({})", crate::units::fmt_size(b))),
        free.map_or(String::new(), |f| format!(" ({} free)", fmt_mem(f)))
    )]
    OutOfMemory {
        gpu: usize,
        what: String,
        bytes: Option<u64>,
        /// Free device memory when it happened, when it could be read.
        free: Option<u64>,
    },
    /// A wait on work of no backend expired: the work may still run.
    #[error("{what} did not finish within {seconds:.0} s: the GPU may be stuck; {STUCK_HINT}")]
    Stuck { what: String, seconds: f64 },
    /// After a backend was aborted, its stream did not drain.
    #[error("{after}; the GPU still had work running {seconds:.0} s after it was aborted: it is stuck; {STUCK_HINT}")]
    Undrained { after: String, seconds: f64 },
    #[error(
        "NVRTC (libnvrtc.so) was not found; install the CUDA toolkit's NVRTC or `pip install nvidia-cuda-nvrtc` and put its lib directory on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    #[error("NVRTC {what} failed: {detail}")]
    Nvrtc { what: String, detail: String },
    #[error(
        "this NVRTC cannot compile for compute capability {}.{}; install an NVRTC at least as new as the GPU",
        cc.0,
        cc.1
    )]
    NvrtcTooOld { cc: (u32, u32) },
    #[error("NVRTC could not compile kernels/{program} with options [{options}]: {log}")]
    Compile {
        program: String,
        options: String,
        log: String,
    },
    /// A kernel artune needs is not there, or cannot run here.
    #[error("kernel {name}: {detail}")]
    Kernel { name: String, detail: String },
    #[error("{0}")]
    Nccl(String),
    /// Another process's buffer could not be opened by IPC.
    #[error("GPU {gpu} could not open {what} ({detail})")]
    Ipc {
        gpu: usize,
        what: String,
        detail: String,
    },
    /// The driver is there but could not start.
    #[error("the CUDA driver could not start ({code}); {NO_GPU}")]
    DriverStart { code: String },
    #[error(
        "a probe latch was never released (a worker stalled for over 10 s); run again on a less loaded machine"
    )]
    LatchNeverReleased,
    /// A GPU fell off the bus (the simulated fabric's fault knob).
    #[error(
        "GPU {gpu} is no longer reachable (simulated fault: it fell off the bus after {after_calls} fabric calls); on a real machine {DEVICE_HINT}"
    )]
    Lost { gpu: usize, after_calls: u64 },
    /// artune broke its own rules (the host's and the GPU's test data differ).
    #[error("{0}")]
    Bug(String),
}

/// Why workers were lost: the link to one broke, one answered nonsense, or one's GPU is
/// stuck; each means every worker is replaced.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Link(#[from] LinkError),
    /// A reply that is not the answer to the request (a protocol violation).
    #[error("a worker answered out of turn ({0})")]
    OutOfTurn(String),
    #[error("worker {who} answered {answer} instead of hello")]
    NotHello { who: String, answer: String },
    /// The worker's GPU no longer finishes its work.
    #[error("{0}")]
    Stuck(DeviceError),
    #[error("cannot find the artune executable to start GPU workers ({0}); set ARTUNE_WORKER_BIN")]
    NoProgram(String),
    /// Workers could not be started (no hello); the `--sim` hint only where CUDA sees no
    /// GPU (on a GPU machine it would send the user away from the GPU to fix).
    #[error("{why}{}", no_gpu_hint(*gpu_visible))]
    Start {
        why: Box<WorkerError>,
        gpu_visible: bool,
    },
    #[error("a contention probe failed: {0}")]
    Probe(Box<WorkerError>),
}

/// Why a worker's answer did not come.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LinkError {
    #[error("worker {who} could not be started ({reason})")]
    Spawn { who: String, reason: String },
    #[error("worker {who} exited ({status}){}", quote_tail(tail))]
    Exited {
        who: String,
        status: String,
        tail: Vec<String>,
    },
    #[error("worker {who} wrote something that is not a worker response: {line:?}")]
    Garbage { who: String, line: String },
    #[error(
        "worker {who} did not answer within {seconds:.1} s{}",
        quote_tail(tail)
    )]
    Silent {
        who: String,
        seconds: f64,
        tail: Vec<String>,
    },
    /// Asked again after it was given up on (the coordinator replaces such workers at once).
    #[error("worker {who} is not asked again: it was given up on earlier ({why})")]
    Retired { who: String, why: String },
}

fn quote_tail(tail: &[String]) -> String {
    match tail.is_empty() {
        true => String::new(),
        false => format!("; its last output: {}", clip(&tail.join(" | "), 600)),
    }
}

/// `s` cut to at most `max` bytes at a character boundary (worker text is not trusted to be
/// ASCII, and `String::truncate` inside a character panics).
pub fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

fn no_gpu_hint(gpu_visible: bool) -> String {
    match gpu_visible {
        true => String::new(),
        false => format!("; {NO_GPU}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_says_what_to_do_once() {
        let driver = DeviceError::Driver {
            what: "launching".into(),
            code: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
        };
        let s = driver.to_string();
        assert_eq!(s.matches("nvidia-smi").count(), 1, "{s}");
        let oom = DeviceError::OutOfMemory {
            gpu: 3,
            what: "allocating receive slots".into(),
            bytes: Some(1 << 20),
            free: Some(512 << 20),
        };
        let s = oom.to_string();
        assert!(
            s.contains("receive slots (1M) on GPU 3 (512.0 MiB free)") && s.contains("--sizes"),
            "{s}"
        );
        let stuck = DeviceError::Stuck {
            what: "checking the output".into(),
            seconds: 10.0,
        };
        assert!(stuck
            .to_string()
            .contains("within 10 s: the GPU may be stuck; reset it"));
        let start = |gpu_visible| WorkerError::Start {
            why: Box::new(WorkerError::NotHello {
                who: "for GPU 0".into(),
                answer: "Done".into(),
            }),
            gpu_visible,
        };
        assert!(start(false)
            .to_string()
            .ends_with("(`artune topo --list-presets` lists the machines it simulates)"));
        assert_eq!(
            start(true).to_string(),
            "worker for GPU 0 answered Done instead of hello"
        );
        // Wire form: a worker's error comes back as it went.
        let back: DeviceError =
            serde_json::from_str(&serde_json::to_string(&oom).unwrap()).unwrap();
        assert_eq!(back, oom);
    }

    #[test]
    fn a_bug_exits_70_the_rest_of_the_device_4() {
        use crate::error::{Error, EXIT_BUG, EXIT_HARDWARE};
        let bug: Error = FabricError::Device(DeviceError::Bug("x".into())).into();
        assert_eq!(bug.exit_code(), EXIT_BUG);
        let w: Error = FabricError::Worker(WorkerError::OutOfTurn("x".into())).into();
        assert_eq!(w.exit_code(), EXIT_HARDWARE);
        let d: Error = FabricError::Device(DeviceError::NoNvrtc).into();
        assert_eq!(d.exit_code(), EXIT_HARDWARE);
    }
}

//! The coordinator's conversation with its worker processes (`artune __worker`): one JSON
//! request per line on the worker's stdin, one JSON reply per line on a pipe of its own
//! ([`REPLY_FD`]), each naming the request's id. The worker's stdout and stderr (NCCL's and
//! CUDA's logs among them) are read by the coordinator, logged and quoted when it fails.
//! Pipes, no service and no port, as torchrun's workers.
//! [`super::link`] holds the process at the other end.

use std::io::Write;

use serde::{Deserialize, Serialize};

use super::driver::{DeviceFacts, IpcHandle};
use super::layout::{DIRS_PUSH_ACROSS, DIRS_PUSH_INSIDE, MAX_RANKS};
use crate::fabric::{
    Backend, DeviceError, Direction, Directions, Dtype, FabricError, Group, Islands, Mode, Ranks,
};
use crate::topology::reading::LinkReading;

/// The ranks one worker launches kernels for: `count` ranks from `base` (one on a real
/// machine; all of a loopback group in one grid, as before worker processes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    pub base: usize,
    pub count: usize,
}

/// IPC handles of one custom backend's buffers of one rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufHandles {
    pub input: Option<IpcHandle>,
    pub scratch: Option<IpcHandle>,
    pub out: Option<IpcHandle>,
    pub signal: IpcHandle,
}

/// IPC handles of every buffer of one rank, exported by the worker that owns the rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankHandles {
    pub rank: usize,
    pub user_in: IpcHandle,
    pub user_out: IpcHandle,
    pub custom: Vec<(Backend, BufHandles)>,
}

/// Probe buffers of one rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeHandles {
    pub rank: usize,
    pub src: IpcHandle,
    pub dst: IpcHandle,
    /// The start latch, on the owner of rank 0 only.
    pub latch: Option<IpcHandle>,
}

/// The shape of a prepared group, sent with every setup request.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Shape {
    pub n: usize,
    pub dtype: Dtype,
    pub max_bytes: u64,
    /// Ranks per island (n where the group has none).
    pub island: usize,
    /// The ranks island by island (the identity where there are none).
    pub order: [u8; MAX_RANKS],
    /// `ArArgs::dirs`: which phases of the island kernels push.
    pub dirs: u32,
}

impl Shape {
    /// A group's shape: its ranks, and its islands where it has some that fit the kernels.
    pub fn of(group: &Group) -> Shape {
        Shape::new(
            group.gpus.len(),
            group.dtype,
            group.max_bytes,
            group.islands.as_ref().ok().map(|i| (&group.gpus[..], i)),
        )
    }

    /// `n` ranks of `dtype` up to `max_bytes`; with `islands`, rank r on GPU `gpus[r]` in the
    /// islands (and their directions) a tune found for those GPUs.
    pub fn new(
        n: usize,
        dtype: Dtype,
        max_bytes: u64,
        islands: Option<(&[usize], &Islands)>,
    ) -> Shape {
        let mut order = [0u8; MAX_RANKS];
        for (i, o) in order.iter_mut().enumerate() {
            *o = i.min(u8::MAX as usize) as u8;
        }
        let (mut island, mut dirs_bits) = (n, 0);
        if let Some((gpus, i)) = islands {
            if let Some(ranks) = i.order(gpus).filter(|r| r.len() == n && n <= MAX_RANKS) {
                island = i.size();
                for (o, r) in order.iter_mut().zip(ranks) {
                    *o = r as u8;
                }
                dirs_bits = i.directions.as_ref().map_or(0, dirs);
            }
        }
        Shape {
            n,
            dtype,
            max_bytes,
            island,
            order,
            dirs: dirs_bits,
        }
    }

    pub fn ranks(&self) -> Ranks {
        Ranks {
            n: self.n,
            island: self.island,
        }
    }
}

/// `ArArgs::dirs` for oriented islands.
pub fn dirs(d: &Directions) -> u32 {
    let push = |x: Direction, bit: u32| if x == Direction::Write { bit } else { 0 };
    push(d.inside, DIRS_PUSH_INSIDE) | push(d.across, DIRS_PUSH_ACROSS)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Req {
    /// Allocates the user buffers of `owned` ranks and each custom backend's buffers, measuring
    /// each backend's device memory, and exports them all.
    Setup {
        shape: Shape,
        owned: Vec<usize>,
        custom: Vec<Backend>,
    },
    /// Opens every other rank's buffers and readies the launches of `launch`; checks each
    /// opened rank with a real transfer.
    Connect {
        shape: Shape,
        launch: Launch,
        ranks: Vec<RankHandles>,
    },
    NcclId,
    /// Creates this worker's NCCL rank for `backend` and warms it over every size class.
    NcclInit {
        backend: Backend,
        id: String,
        rank: usize,
        nranks: usize,
    },
    /// Takes this worker's NCCL rank for `backend` kept from the last group (the same ranks
    /// on the same workers) into the new launcher, and warms it over every size class.
    NcclReuse {
        backend: Backend,
        rank: usize,
        nranks: usize,
    },
    /// Destroys the NCCL ranks of `backends` kept from the last group, in that order; sent to
    /// every rank of them at once (NCCL's finalize waits for all of them).
    NcclRetire {
        backends: Vec<Backend>,
    },
    /// Uploads fresh data (from `seed`) into the launched ranks' inputs, poisons outputs.
    Stage {
        backend: Backend,
        bytes: u64,
        seed: u64,
    },
    /// Runs `calls` calls (eager, or one graph replayed twice) and checks the launched ranks.
    Check {
        backend: Backend,
        bytes: u64,
        seed: u64,
        mode: Mode,
        calls: u32,
    },
    Time {
        backend: Backend,
        bytes: u64,
        mode: Mode,
        batch: u32,
        samples: u32,
        /// Start each sample with an untimed call, so all ranks start together on the device.
        rendezvous: bool,
    },
    /// Aborts and forgets one backend (after a failure elsewhere in the group).
    Drop {
        backend: Backend,
    },
    /// Sets which phases of the island kernels push (`ArArgs::dirs`).
    Orient {
        dirs: u32,
    },
    ProbeSetup {
        bytes: u64,
        owned: Vec<usize>,
        n: usize,
    },
    ProbeConnect {
        launch: Launch,
        n: usize,
        ranks: Vec<ProbeHandles>,
    },
    /// Closes the probe buffers opened from other ranks (before their owners free them).
    ProbeDisconnect,
    ProbeQueue {
        direction: Direction,
        peers: usize,
        bytes: u64,
        epoch: u32,
    },
    ProbeRelease {
        epoch: u32,
    },
    /// Reads the links while the probe runs, then waits for it.
    ProbeFinish {
        bytes: u64,
        peers: usize,
    },
    Copy {
        bytes: u64,
        batch: u32,
        samples: u32,
    },
    LinksUnderLoad,
    /// Closes every opened IPC handle (drops the launcher and the probe launcher); the
    /// launcher's NCCL ranks are kept for the next group (see `worker_nccl`).
    Disconnect,
    /// Frees everything; sent only once every worker has disconnected.
    Release,
}

/// Failures on the wire: [`FabricError`] plus whether the worker's GPU is stuck.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WireError {
    BadRequest(String),
    Timeout {
        backend: Backend,
        what: String,
        seconds: f64,
    },
    Backend {
        backend: Backend,
        reason: String,
    },
    Device {
        error: DeviceError,
        stuck: bool,
    },
    Waived(String),
    Interrupted,
}

impl WireError {
    pub fn from_fabric(e: FabricError, stuck: bool) -> WireError {
        match e {
            FabricError::BadRequest(m) => WireError::BadRequest(m),
            FabricError::Timeout {
                backend,
                what,
                seconds,
            } => WireError::Timeout {
                backend,
                what,
                seconds,
            },
            FabricError::Backend { backend, reason } => WireError::Backend { backend, reason },
            FabricError::Device(error) => WireError::Device { error, stuck },
            // Arise only in the coordinator or the harness; a worker never sends them.
            FabricError::Worker(w) => WireError::BadRequest(w.to_string()),
            FabricError::Busy(m) => WireError::BadRequest(m),
            FabricError::Waived(m) => WireError::Waived(m),
            FabricError::Interrupted => WireError::Interrupted,
        }
    }

    pub fn into_fabric(self) -> FabricError {
        match self {
            WireError::BadRequest(m) => FabricError::BadRequest(m),
            WireError::Timeout {
                backend,
                what,
                seconds,
            } => FabricError::Timeout {
                backend,
                what,
                seconds,
            },
            WireError::Backend { backend, reason } => FabricError::Backend { backend, reason },
            WireError::Device { error, .. } => FabricError::Device(error),
            WireError::Waived(m) => FabricError::Waived(m),
            WireError::Interrupted => FabricError::Interrupted,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Resp {
    /// The first line every worker writes.
    Hello {
        facts: DeviceFacts,
        pid: u32,
    },
    Done,
    Setup {
        ranks: Vec<RankHandles>,
        /// Per custom backend: device bytes per rank, or why it could not be set up.
        memory: Vec<(Backend, Result<u64, String>)>,
    },
    Connected {
        /// The kernels loaded (what NVRTC compiled for, the images' hashes), or why they are
        /// unavailable.
        kernels: Result<crate::fabric::LoadedKernels, String>,
        /// Ranks whose buffers could not be opened or failed the real-transfer check, with
        /// the reason.
        broken: Vec<(usize, String)>,
        /// Custom backends whose shared buffers could not all be opened, with the reason.
        unready: Vec<(Backend, String)>,
    },
    NcclId(String),
    /// Device bytes a backend took, or why it could not be set up.
    Memory(Result<u64, String>),
    /// None when correct, else what was wrong.
    Checked(Option<String>),
    Times(Vec<f64>),
    Probe(Vec<ProbeHandles>),
    Probed {
        secs: Vec<f64>,
        links: Vec<LinkReading>,
    },
    Links(Vec<LinkReading>),
    Failed(WireError),
}

/// One request on the wire: each names its id, and the reply names it back, so a reply that
/// comes late (to a request the coordinator gave up on) can never pass for the answer to a
/// later one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<T> {
    pub id: u64,
    pub body: T,
}

/// The id of the hello a worker sends before any request.
pub const HELLO_ID: u64 = 0;
/// The environment variable naming the worker's reply descriptor.
pub const ENV_REPLY_FD: &str = "ARTUNE_REPLY_FD";
/// The descriptor the coordinator hands every worker for its replies. stdout is not used:
/// NCCL, CUDA and libraries print there (`NCCL_DEBUG=INFO`), and that must not break the
/// conversation.
pub const REPLY_FD: i32 = 3;

/// Writes one reply line on the worker's reply channel.
pub fn write_resp(out: &mut impl Write, id: u64, resp: &Resp) -> std::io::Result<()> {
    let mut line = serde_json::to_string(&Envelope { id, body: resp }).unwrap_or_default();
    line.push('\n');
    out.write_all(line.as_bytes())?;
    out.flush()
}

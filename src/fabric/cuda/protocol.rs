//! The coordinator's conversation with its worker processes (`artune __worker`): one JSON
//! request per line on the worker's stdin, one JSON response per line on its stdout, stderr
//! left to the user's terminal. Pipes, no service and no port, as torchrun's workers.
//!
//! A [`Link`] owns one child. Every answer is awaited against a deadline, so a worker that
//! exits, writes garbage or stops answering becomes a [`LinkError`] the coordinator acts on
//! (kill, restart, disqualify), never a hang.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::driver::{DeviceFacts, IpcHandle};
use super::topo::LinkReading;
use crate::fabric::{Backend, Direction, Dtype, FabricError, Mode};

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
    /// Closes every opened IPC handle (drops the launcher and the probe launcher).
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
        message: String,
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
            FabricError::Device(message) => WireError::Device { message, stuck },
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
            WireError::Device { message, .. } => FabricError::Device(message),
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
        /// What NVRTC compiled for, or why the kernels are unavailable.
        kernels: Result<String, String>,
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

/// Why a worker's answer did not come.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LinkError {
    #[error("worker {who} could not be started ({reason})")]
    Spawn { who: String, reason: String },
    #[error("worker {who} exited ({status})")]
    Exited { who: String, status: String },
    #[error("worker {who} wrote something that is not a worker response: {line:?}")]
    Garbage { who: String, line: String },
    #[error("worker {who} did not answer within {seconds:.1} s")]
    Silent { who: String, seconds: f64 },
}

/// What to start: the artune binary (or a stand-in, for tests) and its arguments.
#[derive(Debug, Clone)]
pub struct Spawn {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// How long a killed worker is waited for before the coordinator goes on without it.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// One worker process and the pipes to it.
pub struct Link {
    who: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<std::io::Result<String>>,
    /// Its pipe closed or it talked nonsense: no more requests go to it.
    dead: bool,
    /// Reaped: nothing of it is left.
    reaped: bool,
}

impl Link {
    /// Starts `spawn`; `who` names it in errors (e.g. "for GPU 1").
    pub fn start(spawn: &Spawn, who: &str) -> Result<Link, LinkError> {
        let mut cmd = Command::new(&spawn.program);
        cmd.args(&spawn.args)
            .envs(spawn.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().map_err(|e| LinkError::Spawn {
            who: who.into(),
            reason: format!("{}: {e}", spawn.program.display()),
        })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let (tx, rx) = mpsc::channel();
        if let Some(out) = stdout {
            std::thread::Builder::new()
                .name("artune-worker-reader".into())
                .spawn(move || {
                    for line in BufReader::new(out).lines() {
                        let end = line.is_err();
                        if tx.send(line).is_err() || end {
                            break;
                        }
                    }
                })
                .map_err(|e| LinkError::Spawn {
                    who: who.into(),
                    reason: e.to_string(),
                })?;
        }
        Ok(Link {
            who: who.into(),
            child,
            stdin,
            lines: rx,
            dead: false,
            reaped: false,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one request (no wait for the answer).
    pub fn send(&mut self, req: &Req) -> Result<(), LinkError> {
        let mut line = serde_json::to_string(req).unwrap_or_default();
        line.push('\n');
        let ok = self
            .stdin
            .as_mut()
            .is_some_and(|s| s.write_all(line.as_bytes()).and_then(|_| s.flush()).is_ok());
        if ok {
            Ok(())
        } else {
            Err(self.exited())
        }
    }

    /// The next response, within `limit`.
    pub fn recv(&mut self, limit: Duration) -> Result<Resp, LinkError> {
        if self.dead {
            return Err(self.exited());
        }
        match self.lines.recv_timeout(limit) {
            Ok(Ok(line)) => serde_json::from_str(&line).map_err(|_| {
                self.dead = true;
                let mut line = line;
                line.truncate(200);
                LinkError::Garbage {
                    who: self.who.clone(),
                    line,
                }
            }),
            Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => Err(self.exited()),
            Err(RecvTimeoutError::Timeout) => Err(LinkError::Silent {
                who: self.who.clone(),
                seconds: limit.as_secs_f64(),
            }),
        }
    }

    /// Sends and waits for the answer.
    pub fn call(&mut self, req: &Req, limit: Duration) -> Result<Resp, LinkError> {
        self.send(req)?;
        self.recv(limit)
    }

    fn exited(&mut self) -> LinkError {
        self.dead = true;
        // The pipe closed: the process is gone or going (tearing down a CUDA context can take
        // a second); give it a moment to be reaped, to say how it ended.
        let mut status = "its pipe closed".to_string();
        for _ in 0..300 {
            if let Ok(Some(s)) = self.child.try_wait() {
                status = s.to_string();
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        LinkError::Exited {
            who: self.who.clone(),
            status,
        }
    }

    /// Kills the process (SIGKILL) and reaps it, waiting at most [`KILL_WAIT`]: a process
    /// stuck in the driver (after an Xid) may not die at once, and must not hold the tune.
    pub fn kill(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        self.dead = true;
        let end = std::time::Instant::now() + KILL_WAIT;
        while std::time::Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                self.reaped = true;
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::warn!(
            "{} did not exit within {:.0} s of SIGKILL (stuck in the driver?); going on without it",
            self.who,
            KILL_WAIT.as_secs_f64()
        );
        // Not waited for again: Drop would otherwise block on it.
        self.reaped = true;
    }

    /// Closes stdin: the worker exits at end of input.
    pub fn close_input(&mut self) {
        self.stdin = None;
    }

    /// Closes stdin (the worker exits at end of input) and waits up to `limit`, then kills.
    pub fn shutdown(&mut self, limit: Duration) {
        self.close_input();
        let end = std::time::Instant::now() + limit;
        while std::time::Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                self.dead = true;
                self.reaped = true;
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.kill();
    }
}

impl Drop for Link {
    /// A healthy worker gets to exit at end of input; one that failed is killed. Either way
    /// no process is left behind.
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        if self.dead {
            self.kill();
        } else {
            self.shutdown(Duration::from_secs(5));
        }
    }
}

/// Writes one response line; the worker's only output on stdout.
pub fn write_resp(out: &mut impl Write, resp: &Resp) -> std::io::Result<()> {
    let mut line = serde_json::to_string(resp).unwrap_or_default();
    line.push('\n');
    out.write_all(line.as_bytes())?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Spawn {
        Spawn {
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            env: Vec::new(),
        }
    }

    fn alive(pid: u32) -> bool {
        // A reaped child has no /proc entry (a zombie would still show, but kill reaps).
        std::path::Path::new(&format!("/proc/{pid}")).exists()
    }

    #[test]
    fn a_worker_that_exits_early_is_reported_not_waited_for() {
        let mut l = Link::start(&sh("exit 3"), "for GPU 0").unwrap();
        let t = std::time::Instant::now();
        let e = l.call(&Req::NcclId, Duration::from_secs(20)).unwrap_err();
        assert!(matches!(e, LinkError::Exited { .. }), "{e}");
        assert!(e.to_string().contains("worker for GPU 0 exited"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn garbage_on_the_pipe_is_a_clear_error() {
        let mut l = Link::start(&sh("read x; echo 'hello, not json'; sleep 30"), "w").unwrap();
        let e = l.call(&Req::NcclId, Duration::from_secs(20)).unwrap_err();
        assert!(
            matches!(&e, LinkError::Garbage { line, .. } if line == "hello, not json"),
            "{e}"
        );
        let pid = l.pid();
        drop(l);
        assert!(!alive(pid), "the worker was left running");
    }

    #[test]
    fn a_worker_that_never_answers_times_out_and_is_killed() {
        let mut l = Link::start(&sh("sleep 60"), "for GPU 3").unwrap();
        let t = std::time::Instant::now();
        let e = l
            .call(&Req::Release, Duration::from_millis(300))
            .unwrap_err();
        assert!(matches!(e, LinkError::Silent { .. }), "{e}");
        assert!(e.to_string().contains("did not answer within 0.3 s"), "{e}");
        let pid = l.pid();
        l.kill();
        assert!(!alive(pid));
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_missing_program_cannot_start() {
        let s = Spawn {
            program: "/nonexistent/artune".into(),
            args: Vec::new(),
            env: Vec::new(),
        };
        let e = Link::start(&s, "for GPU 0").err().unwrap();
        assert!(e.to_string().contains("/nonexistent/artune"), "{e}");
    }

    #[test]
    fn responses_round_trip_through_a_child() {
        let resp = Resp::Checked(Some("rank 1 wrong".into()));
        let line = serde_json::to_string(&resp).unwrap();
        let mut l = Link::start(&sh(&format!("read x; echo '{line}'")), "w").unwrap();
        assert_eq!(l.call(&Req::NcclId, Duration::from_secs(20)).unwrap(), resp);
        let e = WireError::from_fabric(FabricError::Device("x".into()), true);
        assert_eq!(
            e,
            WireError::Device {
                message: "x".into(),
                stuck: true
            }
        );
        assert!(matches!(e.into_fabric(), FabricError::Device(_)));
    }
}

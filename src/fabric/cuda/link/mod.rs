//! One worker process as the coordinator holds it: started with its reply pipe and its
//! parent-death signal armed before exec, asked requests ([`super::protocol`]) whose replies
//! must come within a deadline, its output logged and quoted, and ended (alone or together
//! with the others under one deadline). A worker that exits, writes garbage or stops
//! answering becomes a [`LinkError`] the coordinator acts on (kill, restart, disqualify),
//! never a hang.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

use super::protocol::{Envelope, Req, Resp, ENV_REPLY_FD, HELLO_ID, REPLY_FD};
use crate::fabric::error::{clip, LinkError};

/// What to start: the artune binary (or a stand-in, for tests) and its arguments.
#[derive(Debug, Clone)]
pub struct Spawn {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// How long a killed worker is waited for before the coordinator goes on without it.
pub const KILL_WAIT: Duration = Duration::from_secs(10);
/// Lines of a worker's stderr kept to quote when it fails.
const TAIL_LINES: usize = 8;

type Tail = std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>;

/// What runs at the other end: a worker process, or (tests) a scripted worker on a thread.
enum Peer {
    Child(Child),
    /// Its flag says it was killed (not asked to exit) when its input closes.
    #[cfg(test)]
    Thread(
        std::thread::JoinHandle<()>,
        std::sync::Arc<std::sync::atomic::AtomicBool>,
    ),
}

/// Testing only: what a scripted worker is given, a request or the end of its input.
#[cfg(test)]
pub enum Scripted {
    Req(Req),
    /// Its input closed: `killed` as by SIGKILL (nothing runs), else asked to exit.
    End {
        killed: bool,
    },
}

impl Peer {
    fn id(&self) -> u32 {
        match self {
            Peer::Child(c) => c.id(),
            #[cfg(test)]
            Peer::Thread(..) => 0,
        }
    }

    fn kill(&mut self) {
        match self {
            Peer::Child(c) => {
                let _ = c.kill();
            }
            // A scripted worker ends when its input closes (retire closes it after this).
            #[cfg(test)]
            Peer::Thread(_, killed) => killed.store(true, std::sync::atomic::Ordering::SeqCst),
        }
    }

    /// How it ended, once it has.
    fn ended(&mut self) -> Option<String> {
        match self {
            Peer::Child(c) => c.try_wait().ok().flatten().map(|s| s.to_string()),
            #[cfg(test)]
            Peer::Thread(t, _) => t.is_finished().then(|| "its thread ended".to_string()),
        }
    }
}

/// One worker process and the pipes to it.
pub struct WorkerLink {
    who: String,
    child: Peer,
    stdin: Option<std::fs::File>,
    lines: Receiver<std::io::Result<String>>,
    /// The last lines of its stdout and stderr (which it shares for both).
    tail: Tail,
    next_id: u64,
    /// The id of the request whose reply is awaited (the hello's at first).
    awaited: Option<u64>,
    /// Its pipe closed or it talked nonsense: no more requests go to it.
    dead: bool,
    /// Why it was given up on (it exited, talked nonsense, missed a deadline): it is never
    /// asked again, and every later request fails at once with this.
    gone: Option<String>,
    /// Reaped: nothing of it is left.
    reaped: bool,
}

/// A pipe whose both ends close on exec (the child gets its end by `dup2` only).
fn reply_pipe() -> std::io::Result<(std::fs::File, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills two descriptors on success; each is owned exactly once below.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nothing else.
    unsafe {
        Ok((
            std::fs::File::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        ))
    }
}

impl WorkerLink {
    /// Starts `spawn`; `who` names it in errors and in its output lines (e.g. "for GPU 1").
    /// Requests go on the child's stdin, replies come on descriptor [`REPLY_FD`]; its stdout
    /// is joined to its stderr, which the coordinator reads, logs (`-v`) and quotes on failure.
    pub fn start(spawn: &Spawn, who: &str) -> Result<WorkerLink, LinkError> {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let fail = |reason: String| LinkError::Spawn {
            who: who.into(),
            reason,
        };
        let (reply_r, reply_w) = reply_pipe().map_err(|e| fail(e.to_string()))?;
        let w = reply_w.as_raw_fd();
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        let mut cmd = Command::new(&spawn.program);
        cmd.args(&spawn.args)
            .envs(spawn.env.iter().map(|(k, v)| (k, v)))
            .env(ENV_REPLY_FD, REPLY_FD.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: runs in the forked child before exec and calls only async-signal-safe
        // functions (dup2, fcntl, prctl, getppid, _exit) on descriptors it owns.
        unsafe {
            cmd.pre_exec(move || {
                // The worker dies with its coordinator: armed before exec, so there is no
                // window after the spawn; if the parent is already gone, stop here.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                if w == REPLY_FD {
                    if libc::fcntl(w, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(w, REPLY_FD) != REPLY_FD {
                    return Err(std::io::Error::last_os_error());
                }
                // Whatever NCCL or CUDA print on stdout joins stderr, never the replies.
                if libc::dup2(2, 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| fail(format!("{}: {e}", spawn.program.display())))?;
        drop(reply_w);
        let stdin = child
            .stdin
            .take()
            .map(|s| std::fs::File::from(std::os::fd::OwnedFd::from(s)));
        let err = child.stderr.take();
        WorkerLink::with(who, Peer::Child(child), stdin, reply_r, err)
    }

    /// A link to `peer`, whose requests go to `stdin` and whose replies come on `replies`.
    fn with(
        who: &str,
        child: Peer,
        stdin: Option<std::fs::File>,
        reply_r: std::fs::File,
        err: Option<std::process::ChildStderr>,
    ) -> Result<WorkerLink, LinkError> {
        let fail = |reason: String| LinkError::Spawn {
            who: who.into(),
            reason,
        };
        let (tx, rx) = mpsc::channel();
        let thread = |name: &str| std::thread::Builder::new().name(name.into());
        thread("artune-worker-reader")
            .spawn(move || {
                for line in BufReader::new(reply_r).lines() {
                    let end = line.is_err();
                    if tx.send(line).is_err() || end {
                        break;
                    }
                }
            })
            .map_err(|e| fail(e.to_string()))?;
        let tail: Tail = Default::default();
        if let Some(err) = err {
            let (tail, who) = (tail.clone(), who.to_string());
            thread("artune-worker-stderr")
                .spawn(move || forward_output(err, &who, &tail))
                .map_err(|e| fail(e.to_string()))?;
        }
        Ok(WorkerLink {
            who: who.into(),
            child,
            stdin,
            lines: rx,
            tail,
            next_id: HELLO_ID + 1,
            awaited: Some(HELLO_ID),
            dead: false,
            gone: None,
            reaped: false,
        })
    }

    /// Testing only: a worker played by `serve` on a thread of this process, over the same
    /// pipes and wire format as a worker process. It says `hello` first, then answers each
    /// request with what `serve` returns; `None` ends it (as a worker that died). At the end
    /// of its input it is told so, and whether it was killed.
    #[cfg(test)]
    pub fn scripted(
        who: &str,
        hello: Resp,
        mut serve: impl FnMut(Scripted) -> Option<Resp> + Send + 'static,
    ) -> WorkerLink {
        let (req_r, req_w) = reply_pipe().expect("a pipe");
        let (reply_r, reply_w) = reply_pipe().expect("a pipe");
        let killed: std::sync::Arc<std::sync::atomic::AtomicBool> = Default::default();
        let k = killed.clone();
        let t = std::thread::spawn(move || {
            let mut out = std::fs::File::from(reply_w);
            if super::protocol::write_resp(&mut out, HELLO_ID, &hello).is_err() {
                return;
            }
            for line in BufReader::new(req_r).lines() {
                let Ok(line) = line else { break };
                let Ok(env) = serde_json::from_str::<Envelope<Req>>(&line) else {
                    break;
                };
                match serve(Scripted::Req(env.body)) {
                    Some(r) if super::protocol::write_resp(&mut out, env.id, &r).is_ok() => {}
                    _ => return,
                }
            }
            let killed = k.load(std::sync::atomic::Ordering::SeqCst);
            serve(Scripted::End { killed });
        });
        let peer = Peer::Thread(t, killed);
        WorkerLink::with(who, peer, Some(req_w.into()), reply_r, None).expect("a link")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines the worker printed.
    pub fn tail(&self) -> Vec<String> {
        self.tail
            .lock()
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Sends one request (no wait for the answer); its reply is the next one awaited.
    pub fn send(&mut self, req: &Req) -> Result<(), LinkError> {
        self.refuse_if_gone()?;
        let id = self.next_id;
        self.next_id += 1;
        let mut line = serde_json::to_string(&Envelope { id, body: req }).unwrap_or_default();
        line.push('\n');
        let ok = self
            .stdin
            .as_mut()
            .is_some_and(|s| s.write_all(line.as_bytes()).and_then(|_| s.flush()).is_ok());
        if ok {
            self.awaited = Some(id);
            Ok(())
        } else {
            Err(self.exited())
        }
    }

    /// The reply to the request last sent (or the hello), within `limit`. A reply to an
    /// earlier request is dropped and logged. A worker that misses the deadline is killed
    /// at once and never asked again: it may still be working on the request, and nothing
    /// it says later can be trusted to mean what it would have meant.
    pub fn recv(&mut self, limit: Duration) -> Result<Resp, LinkError> {
        self.refuse_if_gone()?;
        let end = std::time::Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(Ok(line)) => {
                    let Ok(env) = serde_json::from_str::<Envelope<Resp>>(&line) else {
                        // Nothing it says later can be trusted: killed, never asked again.
                        self.retire();
                        return Err(self.give_up(LinkError::Garbage {
                            who: self.who.clone(),
                            line: clip(&line, 200),
                        }));
                    };
                    if Some(env.id) == self.awaited {
                        self.awaited = None;
                        return Ok(env.body);
                    }
                    tracing::warn!(
                        "worker {}: dropped a reply to request {} (awaiting {}): late or unknown",
                        self.who,
                        env.id,
                        self.awaited
                            .map_or_else(|| "none".to_string(), |a| a.to_string())
                    );
                }
                Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => return Err(self.exited()),
                Err(RecvTimeoutError::Timeout) => {
                    self.retire();
                    return Err(self.give_up(LinkError::Silent {
                        who: self.who.clone(),
                        seconds: limit.as_secs_f64(),
                        tail: self.tail(),
                    }));
                }
            }
        }
    }

    /// Sends and waits for the answer.
    pub fn call(&mut self, req: &Req, limit: Duration) -> Result<Resp, LinkError> {
        self.send(req)?;
        self.recv(limit)
    }

    /// Kills it without waiting (SIGKILL); it is reaped later, side by side with others.
    pub fn retire(&mut self) {
        self.dead = true;
        self.child.kill();
        self.stdin = None;
        if self.gone.is_none() {
            self.gone = Some("it was killed".into());
        }
    }

    /// A link given up on fails every request at once, saying why (no wait on its pipe).
    fn refuse_if_gone(&self) -> Result<(), LinkError> {
        match &self.gone {
            Some(why) => Err(LinkError::Retired {
                who: self.who.clone(),
                why: why.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Records `e` as the reason this link is given up on, and returns it.
    fn give_up(&mut self, e: LinkError) -> LinkError {
        self.gone = Some(clip(&e.to_string(), 300));
        e
    }

    fn exited(&mut self) -> LinkError {
        self.dead = true;
        // The pipe closed: the process is gone or going (tearing down a CUDA context can take
        // a second); give it a moment to be reaped, to say how it ended.
        let mut status = "its pipe closed".to_string();
        for _ in 0..300 {
            if let Some(s) = self.child.ended() {
                status = s;
                self.reaped = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Its last words may still be on their way through the stderr reader.
        std::thread::sleep(Duration::from_millis(20));
        let e = LinkError::Exited {
            who: self.who.clone(),
            status,
            tail: self.tail(),
        };
        self.give_up(e)
    }

    /// Whether the process has ended (and is reaped).
    fn reap(&mut self) -> bool {
        if !self.reaped && self.child.ended().is_some() {
            self.reaped = true;
            self.dead = true;
        }
        self.reaped
    }

    /// Kills the process (SIGKILL) and reaps it, waiting at most [`KILL_WAIT`].
    pub fn kill(&mut self) {
        self.retire();
        shutdown_all(&mut [self], Duration::ZERO);
    }

    /// Closes stdin: the worker exits at end of input.
    pub fn close_input(&mut self) {
        self.stdin = None;
    }

    /// Closes stdin (the worker exits at end of input) and waits up to `limit`, then kills.
    pub fn shutdown(&mut self, limit: Duration) {
        shutdown_all(&mut [self], limit);
    }
}

/// Copies a worker's output to the log, each line named by its worker (`-v` shows them; its
/// own warnings and errors show without), keeping the last lines to quote if it fails.
fn forward_output(err: std::process::ChildStderr, who: &str, tail: &Tail) {
    for line in BufReader::new(err).lines() {
        let Ok(line) = line else { break };
        let line = clip(&plain(&line), 2000);
        if line.contains("WARN") || line.contains("ERROR") {
            tracing::warn!("[worker {who}] {line}");
        } else {
            tracing::info!("[worker {who}] {line}");
        }
        if let Ok(mut t) = tail.lock() {
            if t.len() == TAIL_LINES {
                t.pop_front();
            }
            t.push_back(line);
        }
    }
}

/// `line` without terminal colour codes (a worker's own log is coloured), so the coordinator's
/// log does not show them escaped.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Ends every worker in `links` under one deadline: stdin closed on all (each exits at end of
/// input, tearing its CUDA context down side by side with the others), `limit` for all to
/// exit, then SIGKILL for the rest and [`KILL_WAIT`] for all of those together. A process
/// stuck in the driver (after an Xid) may not die at once, and must not hold the tune.
/// Returns when each was found gone after its input closed (None: never seen to exit).
pub fn shutdown_all(links: &mut [&mut WorkerLink], limit: Duration) -> Vec<Option<Duration>> {
    for l in links.iter_mut() {
        l.close_input();
    }
    let start = std::time::Instant::now();
    let mut exited = vec![None; links.len()];
    // Whether all have exited within `limit`; each one's exit time is noted in `exited`.
    let wait = |links: &mut [&mut WorkerLink], exited: &mut [Option<Duration>], limit| {
        let end = std::time::Instant::now() + limit;
        loop {
            let mut all = true;
            for (l, at) in links.iter_mut().zip(exited.iter_mut()) {
                let gone = l.reap();
                if gone && at.is_none() {
                    *at = Some(start.elapsed());
                }
                all &= gone;
            }
            if all || std::time::Instant::now() >= end {
                return all;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    if wait(links, &mut exited, limit) {
        return exited;
    }
    for l in links.iter_mut().filter(|l| !l.reaped) {
        l.retire();
    }
    if wait(links, &mut exited, KILL_WAIT) {
        return exited;
    }
    for l in links.iter_mut().filter(|l| !l.reaped) {
        tracing::warn!(
            "{} did not exit within {:.0} s of SIGKILL (stuck in the driver?); going on without it",
            l.who,
            KILL_WAIT.as_secs_f64()
        );
        // Not waited for again: Drop would otherwise block on it.
        l.reaped = true;
    }
    exited
}

impl Drop for WorkerLink {
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

#[cfg(test)]
mod tests;

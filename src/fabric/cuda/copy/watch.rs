//! A deadline for the copy-engine calls of an engine's op. The SM kernels' barriers give up by
//! themselves (BARRIER_TIMEOUT_NS, kernels/common.cuh); a stream waiting in
//! cuStreamWaitValue32 for a peer that never arrives cannot. So each call marks itself in two
//! words of pinned host memory, with constant values a CUDA graph replays ([`Words::around`]):
//! `inside` from its first step to its last, and `beat` cleared at both ends, which a thread
//! of the op ([`Watchdog`]) sets at each poll. A call is stuck when it is inside and no call
//! began or ended for the deadline ([`Rule`]). The watchdog then sets the op's fault word,
//! marks every rank of the group failed (each copy backend's `Signal::status`, as the SM
//! kernels' raise_fault does), and only then releases this rank's inboxes from the host, as
//! the tune's recovery does: the stream drains, and each call's guard (steps.rs) leaves its
//! output NaN, on this rank and on every peer the released rank signals afterwards.
//!
//! The words assume the op's calls run on one stream at a time, as an engine's collectives do:
//! calls inside on two streams at once share them, and the end of one hides the other's wait.

use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::sys;

use super::steps::{Step, ARRIVED, ONE};
use crate::fabric::cuda::driver::{Ctx, HostWord};

/// How long a call may wait without any call of the op beginning or ending: the SM kernels'
/// barrier limit (BARRIER_TIMEOUT_NS in kernels/common.cuh).
pub const DEADLINE: Duration = Duration::from_secs(5);
/// How often the watchdog looks; once the op has failed, also how long a call may wait.
pub const POLL: Duration = Duration::from_millis(10);

/// The device addresses of the two words a call marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Words {
    pub inside: u64,
    pub beat: u64,
}

impl Words {
    /// `steps` marked as one call: the same values every call, so graphs replay them.
    pub fn around(self, steps: Vec<Step>) -> Vec<Step> {
        let mark = |addr, value| Step::Write { addr, value };
        let mut out = vec![mark(self.inside, 1), mark(self.beat, 0)];
        out.extend(steps);
        out.extend([mark(self.beat, 0), mark(self.inside, 0)]);
        out
    }
}

/// When a call is stuck, from what each poll reads. Pure, so its cases are tested here.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rule {
    /// When a poll last saw a call begin or end, or none inside.
    progress: Duration,
}

impl Rule {
    /// At a poll at `now` (from any fixed start) that read `inside` and `beat` (the host sets
    /// it to 1 after each poll): whether to release the stream now. Once the op `failed`,
    /// every call is NaN anyway, and a wait is released after one quiet poll.
    pub fn poll(&mut self, now: Duration, inside: bool, beat: u32, failed: bool) -> bool {
        if !inside || beat == 0 {
            self.progress = now;
            return false;
        }
        let limit = if failed { POLL } else { DEADLINE };
        if now.saturating_sub(self.progress) < limit {
            return false;
        }
        self.progress = now;
        true
    }
}

/// The op's words in pinned host memory: the fault word its kernels set, and the two a
/// copy-engine call marks.
pub struct HostWords {
    pub fault: HostWord,
    pub inside: HostWord,
    pub beat: HostWord,
}

// SAFETY: the words are pinned host memory, only ever read and written whole with volatile
// accesses (a GPU writes them at any time anyway); the context is an `Arc` of thread-safe
// parts. The watchdog holding a clone is joined before the op drops its own (Watchdog's drop).
unsafe impl Send for HostWords {}
// SAFETY: as above.
unsafe impl Sync for HostWords {}

impl HostWords {
    pub fn alloc(ctx: &Arc<Ctx>) -> Result<HostWords, cudarc::driver::DriverError> {
        Ok(HostWords {
            fault: HostWord::alloc(ctx)?,
            inside: HostWord::alloc(ctx)?,
            beat: HostWord::alloc(ctx)?,
        })
    }

    pub fn words(&self) -> Words {
        Words {
            inside: self.inside.device_ptr(),
            beat: self.beat.device_ptr(),
        }
    }
}

/// What a release writes: every rank's status word of each copy backend, and this rank's
/// inboxes (the start of its signal allocation) of each.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    pub status: Vec<u64>,
    pub inboxes: Vec<u64>,
}

/// The op's watching thread: stopped and joined on drop.
pub struct Watchdog {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    pub fn start(ctx: Arc<Ctx>, words: Arc<HostWords>, targets: Targets) -> Watchdog {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut rule = Rule::default();
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(POLL) {
                let (inside, beat) = (words.inside.get() != 0, words.beat.get());
                words.beat.set(1);
                let failed = words.fault.get() != 0;
                if rule.poll(start.elapsed(), inside, beat, failed) {
                    // Best effort: a stream that still does not drain is the op drop's
                    // bounded wait to find.
                    let _ = release(&ctx, &words, &targets);
                }
            }
        });
        Watchdog {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The fault word, then every rank's status, then this rank's inboxes, in that order, on a
/// stream of the watchdog's own that never waits for the engine's (non-blocking: the
/// engine's may be the legacy default stream, stuck).
fn release(ctx: &Ctx, words: &HostWords, t: &Targets) -> Result<(), sys::CUresult> {
    words.fault.set(1);
    let ok = |r: sys::CUresult| match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(e),
    };
    ctx.bind_to_thread()
        .map_err(|_| sys::CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    let mut s: sys::CUstream = std::ptr::null_mut();
    let non_blocking = sys::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: creates a stream of the bound context into `s`.
    ok(unsafe { sys::cuStreamCreate(&mut s, non_blocking) })?;
    // The default write flag fences every write before it: a stream that sees its inbox
    // released sees the status set.
    let fenced = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
    let mut r = Ok(());
    for &a in &t.status {
        // SAFETY: `a` is a status word of a signal allocation the op holds mapped (own or a
        // peer's) while this thread runs (the op stops it before it closes them).
        r = r.and(ok(unsafe { sys::cuMemsetD32Async(a, 1, 1, s) }));
    }
    for &b in &t.inboxes {
        for k in 0..ONE / 4 {
            // SAFETY: this rank's own signal allocation, as above; ONE bytes of inboxes.
            r = r.and(ok(unsafe {
                sys::cuStreamWriteValue32_v2(s, b + 4 * k, ARRIVED, fenced)
            }));
        }
    }
    // SAFETY: `s` was created above and is destroyed once, after its work.
    unsafe {
        r = r.and(ok(sys::cuStreamSynchronize(s)));
        let _ = sys::cuStreamDestroy_v2(s);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn a_call_inside_with_no_call_beginning_or_ending_is_released_after_the_deadline() {
        let mut r = Rule::default();
        // A call begins (the beat was cleared), then nothing moves.
        assert!(!r.poll(ms(0), true, 0, false));
        assert!(!r.poll(ms(10), true, 1, false));
        assert!(!r.poll(DEADLINE - ms(1), true, 1, false));
        assert!(r.poll(DEADLINE, true, 1, false));
        // Released once: the next release only after another deadline.
        assert!(!r.poll(DEADLINE + ms(10), true, 1, false));
        assert!(r.poll(DEADLINE * 2, true, 1, false));
    }

    #[test]
    fn calls_that_keep_ending_or_an_idle_stream_are_never_released() {
        let mut r = Rule::default();
        for k in 0..2000 {
            // Back to back: always inside, but each poll finds the beat cleared.
            assert!(!r.poll(ms(10 * k), true, 0, false));
        }
        for k in 2000..4000 {
            // Idle: the beat stays set, nothing is inside.
            assert!(!r.poll(ms(10 * k), false, 1, false));
        }
        // A call that begins after a long idle spell (its start cleared the beat) gets the
        // whole deadline.
        assert!(!r.poll(ms(40_000), true, 0, false));
        assert!(!r.poll(ms(40_000) + DEADLINE - ms(1), true, 1, false));
        assert!(r.poll(ms(40_000) + DEADLINE, true, 1, false));
    }

    #[test]
    fn once_the_op_failed_a_wait_is_released_after_one_quiet_poll() {
        let mut r = Rule::default();
        assert!(!r.poll(ms(0), true, 0, true));
        assert!(!r.poll(POLL - ms(1), true, 1, true));
        assert!(r.poll(POLL, true, 1, true));
    }

    #[test]
    fn the_deadline_is_the_kernels_barrier_limit() {
        let common = crate::fabric::cuda::compile::COMMON;
        let ns = DEADLINE.as_nanos();
        assert!(
            common.contains(&format!("#define BARRIER_TIMEOUT_NS {ns}ull")),
            "kernels/common.cuh's BARRIER_TIMEOUT_NS differs from {ns} ns"
        );
    }

    #[test]
    fn a_marked_call_begins_and_ends_with_constant_writes() {
        let w = Words {
            inside: 8,
            beat: 12,
        };
        let body = vec![Step::WaitEq { addr: 4, value: 1 }];
        let s = w.around(body.clone());
        let write = |addr, value| Step::Write { addr, value };
        assert_eq!(s[..2], [write(8, 1), write(12, 0)]);
        assert_eq!(s[2..3], body[..]);
        assert_eq!(s[3..], [write(12, 0), write(8, 0)]);
    }
}

//! Deadlines for GPU work. The CUDA fabric never blocks on the GPU without one: it polls
//! (cuEventQuery, cuStreamQuery, ncclCommGetAsyncError) until the work is done, has failed, or
//! its deadline has passed. A hang (a peer that never arrives, a kernel spinning on a flag, an
//! NCCL collective that never completes) so becomes an error the tuner can act on: the backend
//! is aborted and disqualified, and the run goes on with the others.
//!
//! The poller knows nothing about CUDA: it takes a check and a [`Clock`], so its behaviour is
//! tested here with a fake clock.

use std::time::{Duration, Instant};

/// Longest wait for one GPU operation (a batch of calls, a graph replay) beyond its expected
/// time. Our kernels' barriers give up after 5 s by themselves (kernels/common.cuh), so a lost
/// peer in a custom kernel is reported by the kernel first; this catches what a kernel cannot
/// report (an NCCL collective, a wedged GPU).
pub const OP_DEADLINE: Duration = Duration::from_secs(10);
/// Longest wait for NCCL to set up a clique (topology search, connections): seconds on 8 GPUs.
pub const INIT_DEADLINE: Duration = Duration::from_secs(60);
/// After an abort, how long the streams get to drain before the GPU is called stuck.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(10);
/// Slowest transfer rate any real link has (bytes per second): deadlines grow with the bytes
/// moved at this rate, so a large batch on a slow machine is never called a hang.
const FLOOR_BYTES_PER_S: f64 = 0.5e9;
/// Overrides [`OP_DEADLINE`] with a fixed deadline in milliseconds for every GPU wait: a
/// testing knob to provoke the abort path on a healthy GPU.
pub const ENV_DEADLINE_MS: &str = "ARTUNE_GPU_DEADLINE_MS";

/// How long one GPU operation may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    pub base: Duration,
    /// Whether it grows with the bytes moved (false for a fixed override).
    pub grows: bool,
}

impl Deadline {
    /// [`OP_DEADLINE`] growing with the bytes moved, or the environment's fixed override.
    pub fn from_env() -> Deadline {
        Deadline::from_override(std::env::var(ENV_DEADLINE_MS).ok().as_deref())
    }

    fn from_override(v: Option<&str>) -> Deadline {
        match parse_ms(v) {
            Some(d) => Deadline::fixed(d),
            None => Deadline {
                base: OP_DEADLINE,
                grows: true,
            },
        }
    }

    /// Exactly `d` for any work.
    pub fn fixed(d: Duration) -> Deadline {
        Deadline {
            base: d,
            grows: false,
        }
    }

    /// The deadline for `calls` calls moving `bytes` each.
    pub fn for_work(&self, bytes: u64, calls: u32) -> Duration {
        if self.grows {
            scaled(self.base, bytes, calls)
        } else {
            self.base
        }
    }
}

fn parse_ms(v: Option<&str>) -> Option<Duration> {
    v?.trim().parse::<u64>().ok().map(Duration::from_millis)
}

/// `base` plus the time `calls` calls of `bytes` take at the slowest real link rate.
fn scaled(base: Duration, bytes: u64, calls: u32) -> Duration {
    let moving = bytes as f64 * calls.max(1) as f64 / FLOOR_BYTES_PER_S;
    base + Duration::from_secs_f64(moving.min(3600.0))
}

/// What one look at work in flight found.
#[derive(Debug, Clone, PartialEq)]
pub enum Poll {
    Done,
    Pending,
    Failed(String),
}

/// Why a wait ended without the work done.
#[derive(Debug, Clone, PartialEq)]
pub enum Waited {
    /// The work reported an error.
    Failed(String),
    /// The deadline passed with the work still pending.
    Expired(Duration),
}

/// Time as the poller sees it.
pub trait Clock {
    /// Time since some fixed start.
    fn now(&self) -> Duration;
    /// Lets `d` pass.
    fn pause(&mut self, d: Duration);
}

/// The wall clock; pauses spin briefly, then sleep.
pub struct RealClock(Instant);

impl RealClock {
    pub fn new() -> RealClock {
        RealClock(Instant::now())
    }
}

impl Default for RealClock {
    fn default() -> Self {
        RealClock::new()
    }
}

impl Clock for RealClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }

    fn pause(&mut self, d: Duration) {
        if d.is_zero() {
            std::thread::yield_now();
        } else {
            std::thread::sleep(d);
        }
    }
}

/// Polls spin (yield) this many times before sleeping: small calls finish in microseconds,
/// and a sleep would cost the tune more time than the call itself.
const SPINS: u32 = 200;
const FIRST_SLEEP: Duration = Duration::from_micros(20);
const LONGEST_SLEEP: Duration = Duration::from_millis(2);

/// The pause after the `n`-th pending poll (0-based).
fn backoff(n: u32) -> Duration {
    if n < SPINS {
        return Duration::ZERO;
    }
    let doublings = (n - SPINS).min(16);
    (FIRST_SLEEP * (1 << doublings)).min(LONGEST_SLEEP)
}

/// Polls `check` until it is done or failed, or until `limit` has passed since the call.
/// Work found done after the deadline still counts as done: the check runs once more at the
/// deadline.
pub fn wait(
    limit: Duration,
    clock: &mut dyn Clock,
    mut check: impl FnMut() -> Poll,
) -> Result<(), Waited> {
    let start = clock.now();
    let mut n = 0u32;
    loop {
        match check() {
            Poll::Done => return Ok(()),
            Poll::Failed(e) => return Err(Waited::Failed(e)),
            Poll::Pending => {}
        }
        let spent = clock.now().saturating_sub(start);
        if spent >= limit {
            return Err(Waited::Expired(spent));
        }
        clock.pause(backoff(n).min(limit - spent));
        n = n.saturating_add(1);
    }
}

/// [`wait`] on the wall clock.
pub fn wait_real(limit: Duration, check: impl FnMut() -> Poll) -> Result<(), Waited> {
    wait(limit, &mut RealClock::new(), check)
}

/// Runs a call that can only block (cuCtxSynchronize) on a helper thread and waits for it up
/// to `limit`. None: it is still blocked; the thread is left behind, parked in the driver.
pub fn bounded<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("artune-bounded".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    rx.recv_timeout(limit).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::cell::Cell;
    use std::rc::Rc;

    /// A clock that only moves when paused, by at least a microsecond (a query's cost). The
    /// time is shared so a check can read it.
    #[derive(Clone)]
    struct Fake(Rc<Cell<Duration>>);

    impl Clock for Fake {
        fn now(&self) -> Duration {
            self.0.get()
        }
        fn pause(&mut self, d: Duration) {
            self.0.set(self.0.get() + d.max(Duration::from_micros(1)));
        }
    }

    const T0: Duration = Duration::from_secs(100);

    fn fake() -> Fake {
        Fake(Rc::new(Cell::new(T0)))
    }

    #[test]
    fn done_work_returns_at_once_and_counts_its_polls() {
        let mut c = fake();
        let mut polls = 0;
        let r = wait(Duration::from_secs(1), &mut c, || {
            polls += 1;
            if polls == 3 {
                Poll::Done
            } else {
                Poll::Pending
            }
        });
        assert_eq!(r, Ok(()));
        assert_eq!(polls, 3);
        assert!(c.now() < T0 + Duration::from_millis(1));
    }

    #[test]
    fn a_failure_ends_the_wait_with_its_reason() {
        let r = wait(Duration::from_secs(1), &mut fake(), || {
            Poll::Failed("unhandled cuda error".into())
        });
        assert_eq!(r, Err(Waited::Failed("unhandled cuda error".into())));
    }

    #[test]
    fn a_hang_expires_at_the_deadline_not_before_and_not_much_after() {
        let mut c = fake();
        let mut polls = 0u32;
        let limit = Duration::from_secs(10);
        let r = wait(limit, &mut c, || {
            polls += 1;
            Poll::Pending
        });
        let spent = c.now() - T0;
        assert_eq!(r, Err(Waited::Expired(spent)));
        assert!(spent >= limit, "{spent:?}");
        // The last pause is cut to the deadline; one extra look costs a microsecond.
        assert!(spent <= limit + Duration::from_micros(1), "{spent:?}");
        // Backing off to 2 ms sleeps: about 5000 polls in 10 s, not millions.
        assert!((4000..7000).contains(&polls), "{polls}");
    }

    #[test]
    fn work_that_finishes_at_the_deadline_counts_as_done() {
        let mut c = fake();
        let seen = c.clone();
        let limit = Duration::from_millis(50);
        let r = wait(limit, &mut c, || {
            if seen.now() - T0 >= limit {
                Poll::Done
            } else {
                Poll::Pending
            }
        });
        assert_eq!(r, Ok(()));
        assert!(c.now() - T0 >= limit);
    }

    #[test]
    fn a_blocking_call_is_given_up_on_at_its_limit() {
        assert_eq!(bounded(Duration::from_secs(5), || 7), Some(7));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        // Blocks until the test drops `tx`, long after the limit.
        let r = bounded(Duration::from_millis(20), move || rx.recv().is_ok());
        assert_eq!(r, None);
        drop(tx);
    }

    #[test]
    fn backoff_spins_then_sleeps_up_to_a_cap() {
        assert_eq!(backoff(0), Duration::ZERO);
        assert_eq!(backoff(SPINS - 1), Duration::ZERO);
        assert_eq!(backoff(SPINS), FIRST_SLEEP);
        assert_eq!(backoff(SPINS + 1), FIRST_SLEEP * 2);
        assert_eq!(backoff(SPINS + 1000), LONGEST_SLEEP);
    }

    #[test]
    fn deadlines_grow_with_bytes_unless_fixed_by_the_override() {
        let d = Deadline::from_override(None);
        assert_eq!(d.for_work(0, 1), OP_DEADLINE);
        // 256 MiB x 100 calls at 0.5 GB/s: about 54 s more.
        let big = d.for_work(256 << 20, 100);
        assert!(big > OP_DEADLINE + Duration::from_secs(50), "{big:?}");
        assert!(big < OP_DEADLINE + Duration::from_secs(60), "{big:?}");
        let fixed = Deadline::from_override(Some("250"));
        assert_eq!(fixed.for_work(256 << 20, 100), Duration::from_millis(250));
        assert_eq!(Deadline::from_override(Some("soon")), d);
    }
}

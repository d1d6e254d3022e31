//! The GPU's utilization over the last second as the driver sampled it. NVML keeps a buffer of
//! its own utilization samples; where it covers the whole span, the busy check takes its
//! highest value at once instead of polling for that span after it starts (the check took
//! about 1 s of every `check --measure` on the H200). Where it does not cover it (a buffer
//! with gaps, a sample period near the span, a clock that is not the wall clock), the caller
//! polls as before: the wait is bounded by what the buffer shows, never skipped on a guess.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nvml_wrapper::enum_wrappers::device::Sampling;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::Device;

use super::occupancy::SAMPLE;

/// The highest utilization (percent) over the `span` before now in `d`'s sample buffer, if
/// the buffer covers all of it ([`covered_max`]).
pub(super) fn recent_max(d: &Device, span: Duration) -> Option<u32> {
    let samples = match d.samples(Sampling::GpuUtilization, None) {
        Ok(s) => s,
        Err(e) => {
            tracing::info!("busy check: no utilization samples from the driver ({e}); sampling");
            return None;
        }
    };
    // After the read, so no sample the read returned is newer than `now`.
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
    let points: Vec<(u64, u32)> = samples
        .iter()
        .filter_map(|s| match s.value {
            SampleValue::U32(v) => Some((s.timestamp, v)),
            SampleValue::U64(v) => Some((s.timestamp, v.min(100) as u32)),
            _ => None,
        })
        .collect();
    let (now, span) = (now.as_micros() as u64, span.as_micros() as u64);
    let out = covered_max(&points, now, span);
    let (oldest, newest) = points
        .iter()
        .fold((u64::MAX, 0), |(a, b), p| (a.min(p.0), b.max(p.0)));
    tracing::info!(
        "busy check: {} utilization samples in the driver's buffer, from {:.3} s to {:.3} s ago: {}",
        points.len(),
        now.saturating_sub(oldest) as f64 / 1e6,
        now.saturating_sub(newest) as f64 / 1e6,
        match out {
            Some(u) => format!("they cover the last second, at most {u}%"),
            None => "they do not cover the last second; sampling it".into(),
        }
    );
    out
}

/// The highest value of `points` (µs timestamp, percent) over the `span` µs before `now`, when
/// they cover all of it: a sample at or before its start, none more than a quarter of it
/// apart after that, the newest at most a quarter of it old and none from the future. NVML's
/// utilization is a share of its sample period, so samples that close leave no stretch where
/// a neighbour between kernels would go unseen. None otherwise.
pub fn covered_max(points: &[(u64, u32)], now: u64, span: u64) -> Option<u32> {
    let gap = span / 4;
    let start = now.checked_sub(span)?;
    let mut sorted: Vec<(u64, u32)> = points.to_vec();
    sorted.sort_unstable();
    let first = sorted.iter().rposition(|&(t, _)| t <= start)?;
    let window = &sorted[first..];
    let newest = window.last()?.0;
    if newest > now || now - newest > gap {
        return None;
    }
    if window.windows(2).any(|w| w[1].0 - w[0].0 > gap) {
        return None;
    }
    // The sample at or before the start covers the period that ends at its timestamp: only
    // the part of the span after it counts, which is what the ones after it hold.
    window[1..].iter().map(|&(_, v)| v).max()
}

/// Time between the starts of two readings while the GPUs settle.
pub const POLL: Duration = Duration::from_millis(200);
// Readings closer than the sample each covers: else the wait ends no sooner than before.
const _: () = assert!(POLL.as_millis() < SAMPLE.as_millis());

/// How long to wait before the busy check's next reading, `since` the last one started (None:
/// the first): [`POLL`] apart. Each reading still covers a whole [`SAMPLE`] (the buffer's
/// second before it, or a second it polls itself and so takes), so the wait ends within
/// `POLL` of the first quiet second rather than at the next whole second: a `check --measure`
/// that met the last one's teardown waited 1.4 s past its workers' start in 2 of 20 runs on
/// the H200 (speed3), its readings a second apart.
pub fn before_next(since: Option<Duration>) -> Duration {
    since.map_or(Duration::ZERO, |s| POLL.saturating_sub(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    /// Samples every `every` µs from `from` to `to` (both µs), at `pct` but `busy` at `at`.
    fn every(every: u64, from: u64, to: u64, at: Option<u64>) -> Vec<(u64, u32)> {
        (0..)
            .map(|k| from + k * every)
            .take_while(|&t| t <= to)
            .map(|t| (t, if Some(t) == at { 97 } else { 0 }))
            .collect()
    }

    #[test]
    fn a_buffer_covering_the_last_second_answers_at_once_with_its_highest_value() {
        let now = 100 * S;
        // 1/6 s samples over the last 3 s: idle, then one busy sample half a second ago.
        let idle = every(S / 6, now - 3 * S, now, None);
        assert_eq!(covered_max(&idle, now, S), Some(0));
        let t = idle
            .iter()
            .map(|p| p.0)
            .find(|&t| t >= now - S / 2)
            .unwrap();
        let busy = every(S / 6, now - 3 * S, now, Some(t));
        assert_eq!(covered_max(&busy, now, S), Some(97));
        // Busy before the span only: not this second's.
        let old = idle.iter().map(|p| p.0).rfind(|&t| t < now - S).unwrap();
        assert_eq!(
            covered_max(&every(S / 6, now - 3 * S, now, Some(old)), now, S),
            Some(0)
        );
    }

    #[test]
    fn a_buffer_that_leaves_part_of_the_second_unseen_is_not_trusted() {
        let now = 100 * S;
        // Starts inside the span: its first part is unseen.
        assert_eq!(
            covered_max(&every(S / 6, now - S / 2, now, None), now, S),
            None
        );
        // One sample a second: a neighbour could sit between two.
        assert_eq!(covered_max(&every(S, now - 3 * S, now, None), now, S), None);
        // Stale: the newest sample is half a second old.
        assert_eq!(
            covered_max(&every(S / 6, now - 3 * S, now - S / 2, None), now, S),
            None
        );
        // Another clock: timestamps ahead of now.
        assert_eq!(
            covered_max(&every(S / 6, now, now + 3 * S, None), now, S),
            None
        );
        // A gap of 0.4 s inside an otherwise dense buffer.
        let mut gappy = every(S / 10, now - 3 * S, now, None);
        gappy.retain(|&(t, _)| t < now - S / 2 || t > now - S / 10);
        assert_eq!(covered_max(&gappy, now, S), None);
        assert_eq!(covered_max(&[], now, S), None);
    }

    #[test]
    fn readings_after_the_first_come_a_poll_apart_and_one_that_sampled_is_read_again_at_once() {
        assert_eq!(before_next(None), Duration::ZERO);
        assert_eq!(
            before_next(Some(Duration::from_millis(5))),
            POLL - Duration::from_millis(5)
        );
        assert_eq!(before_next(Some(SAMPLE)), Duration::ZERO);
    }
}
